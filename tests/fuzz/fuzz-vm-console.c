/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "vm-console.h"

/* The guest's console, fed to the panic watch in two reads cut where the first byte says, as the
 * daemon reads a file that grows: a verdict only for a whole line, a printable one within the limit,
 * and never a byte skipped that the marker could start at. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const char *buf = (const char *) data + 1;
        size_t n, cut, done, at = 0;
        char *line = NULL;
        int r;

        if (size < 1)
                return 0;
        n = size - 1;
        cut = n ? data[0] % (n + 1) : 0;
        r = vm_console_find_panic(buf, cut, &done, &line);
        assert(r == 0 || r == 1);
        assert(done <= cut);
        if (r == 0) {
                assert(!line);
                at = done;
                r = vm_console_find_panic(buf + at, n - at, &done, &line);
                assert(r == 0 || r == 1);
                assert(done <= n - at);
        }
        if (r == 1) {
                size_t k = strlen(line);
                assert(k >= strlen(VM_CONSOLE_PANIC_MARKER) && k <= VM_CONSOLE_PANIC_LINE_MAX);
                assert(strncmp(line, VM_CONSOLE_PANIC_MARKER, strlen(VM_CONSOLE_PANIC_MARKER)) == 0);
                for (size_t i = 0; i < k; i++)
                        assert(line[i] >= 0x20 && line[i] < 0x7f);
                free(line);
        } else
                /* no marker anywhere in the input, then */
                assert(!memmem(buf, n, VM_CONSOLE_PANIC_MARKER, strlen(VM_CONSOLE_PANIC_MARKER)) ||
                       memmem(buf + at, n - at, VM_CONSOLE_PANIC_MARKER, strlen(VM_CONSOLE_PANIC_MARKER)));
        return 0;
}
