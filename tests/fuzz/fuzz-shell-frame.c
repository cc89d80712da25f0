/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "shell-frame.h"

/* The bytes a `vm shell` peer sends, frame after frame as the helper and the client read them: every
 * frame taken must lie inside the input, and what the encoders write must parse back the same. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        size_t off = 0;

        for (;;) {
                ShellFrame f;
                uint8_t again[SHELL_FRAME_HEADER_SIZE + 4];
                ShellFrame g;
                int k = shell_frame_parse(data + off, size - off, &f);

                if (k <= 0)
                        break;
                if ((size_t) k > size - off || f.size + SHELL_FRAME_HEADER_SIZE != (size_t) k ||
                    f.payload != data + off + SHELL_FRAME_HEADER_SIZE)
                        abort();
                if (f.type == SHELL_FRAME_RESIZE) {
                        if (shell_frame_resize(again, f.rows, f.cols) != sizeof(again) ||
                            shell_frame_parse(again, sizeof(again), &g) != (int) sizeof(again) ||
                            g.rows != f.rows || g.cols != f.cols ||
                            memcmp(again, data + off, sizeof(again)) != 0)
                                abort();
                } else if (f.type == SHELL_FRAME_EXIT) {
                        if (shell_frame_exit(again, f.status) != sizeof(again) ||
                            shell_frame_parse(again, sizeof(again), &g) != (int) sizeof(again) ||
                            g.status != f.status)
                                abort();
                }
                off += (size_t) k;
        }
        return 0;
}
