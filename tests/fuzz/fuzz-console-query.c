/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "api-console.h"
#include "cleanup.h"
#include "fuzz.h"

/* The console stream's query as a client sends it: the first byte says which of offset and backlog
 * are present, the rest is their values, split at the first NUL, and past a second NUL the head of
 * a console file. Whatever comes in, a refusal carries an invalid_request message, an acceptance
 * stays within the documented ranges, and the start is a byte of the file (or its end). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *buf = NULL;
        const char *offset, *backlog, *head = "";
        size_t head_size = 0, n;
        ApiConsoleQuery q;
        uint64_t start, file_size;
        int r;

        if (size < 1)
                return 0;
        buf = malloc(size + 2);
        if (!buf)
                return 0;
        memcpy(buf, data + 1, size - 1);
        buf[size - 1] = buf[size] = buf[size + 1] = 0;
        offset = buf;
        n = strlen(offset);
        backlog = buf + n + 1 <= buf + size - 1 ? buf + n + 1 : buf + size;
        if (backlog < buf + size - 1) {
                head = backlog + strlen(backlog) + 1;
                if (head < buf + size - 1)
                        head_size = (size_t) (buf + size - 1 - head);
                else
                        head = "";
        }

        r = api_console_parse_query(data[0] & 1 ? offset : NULL, data[0] & 2 ? backlog : NULL, &q, &e);
        if (r < 0) {
                assert(r == -EINVAL);
                assert(e.code == API_ERROR_INVALID_REQUEST && e.message);
                return 0;
        }
        assert(!e.message);
        assert(q.has_offset == !!(data[0] & 1));
        assert(q.offset <= API_CONSOLE_OFFSET_MAX && q.backlog <= API_CONSOLE_BACKLOG_MAX);

        file_size = head_size + (data[0] >> 2);
        start = api_console_start(&q, file_size, head, MIN(head_size, (size_t) q.backlog));
        assert(start <= file_size);
        if (!q.has_offset)
                assert(file_size - start <= q.backlog);
        return 0;
}
