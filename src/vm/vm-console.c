/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vm-console.h"

int vm_console_find_panic(const char *buf, size_t n, size_t *ret_done, char **ret_line) {
        const size_t mlen = strlen(VM_CONSOLE_PANIC_MARKER);
        const char *m = n > 0 ? memmem(buf, n, VM_CONSOLE_PANIC_MARKER, mlen) : NULL;
        size_t start, k = 0;
        char *line;

        *ret_line = NULL;
        if (!m) {
                /* a marker cut at the end of what came so far is looked at again with the rest */
                *ret_done = n >= mlen ? n - (mlen - 1) : 0;
                return 0;
        }
        start = (size_t) (m - buf);
        line = malloc(VM_CONSOLE_PANIC_LINE_MAX + 1);
        if (!line)
                return -ENOMEM;
        for (size_t i = start; i < n; i++) {
                unsigned char c = (unsigned char) buf[i];
                if (c == '\n' || c == '\r' || k == VM_CONSOLE_PANIC_LINE_MAX) {
                        line[k] = 0;
                        *ret_done = i;
                        *ret_line = line;
                        return 1;
                }
                if (c >= 0x20 && c < 0x7f)
                        line[k++] = (char) c;
        }
        /* the line is still being written: the next look starts at the marker */
        free(line);
        *ret_done = start;
        return 0;
}
