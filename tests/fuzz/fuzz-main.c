/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "fs-util.h"
#include "fuzz.h"

/* Corpus replayer: runs every file of the directories (or files) given through the target and
 * prints TAP, one line per input. A crash or sanitizer report fails the test. */
int main(int argc, char **argv) {
        unsigned n = 0;

        (void) LLVMFuzzerInitialize(&argc, &argv);
        for (int i = 1; i < argc; i++) {
                _cleanup_(closedirp) DIR *d = opendir(argv[i]);
                struct dirent *de;

                if (!d) {
                        _cleanup_free_ char *data = NULL;
                        size_t size;
                        if (read_full_file(argv[i], 1 << 24, &data, &size) < 0) {
                                printf("not ok %u - %s: unreadable\n", ++n, argv[i]);
                                return 1;
                        }
                        (void) LLVMFuzzerTestOneInput((const uint8_t *) data, size);
                        printf("ok %u - %s\n", ++n, argv[i]);
                        continue;
                }
                while ((de = readdir(d))) {
                        _cleanup_free_ char *path = NULL, *data = NULL;
                        size_t size;

                        if (de->d_name[0] == '.')
                                continue;
                        if (asprintf(&path, "%s/%s", argv[i], de->d_name) < 0)
                                return 1;
                        if (read_full_file(path, 1 << 24, &data, &size) < 0)
                                continue;
                        (void) LLVMFuzzerTestOneInput((const uint8_t *) data, size);
                        printf("ok %u - %s\n", ++n, de->d_name);
                        fflush(stdout);
                }
        }
        printf("1..%u\n", n);
        return n > 0 ? 0 : 1;
}
