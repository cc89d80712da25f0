/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "fuzz.h"
#include "http-util.h"

/* A request head as a client sends it, split in place the way libmicrohttpd 0.9.75 splits it
 * (connection.c: get_next_header_line(), parse_initial_message_line(), process_header_line()),
 * then checked by http_head_check(). A head without NUL bytes must pass; one with a NUL that hides
 * something (a byte other than CR or NUL after it on its line) must not. Heads libmicrohttpd
 * refuses itself (no colon, no version) or relocates (folded lines) are skipped. */

#define MAX_FIELDS 64

/* The next line from *pos: its line end becomes NUL bytes, as libmicrohttpd writes them. */
static char *next_line(char *buf, size_t size, size_t *pos, size_t *ret_len) {
        for (size_t i = *pos; i < size; i++) {
                if (buf[i] == '\r' && i + 1 < size && buf[i + 1] == '\n') {
                        char *line = buf + *pos;

                        *ret_len = i - *pos;
                        buf[i] = buf[i + 1] = 0;
                        *pos = i + 2;
                        return line;
                }
                if (buf[i] == '\n') {
                        char *line = buf + *pos;

                        *ret_len = i - *pos;
                        buf[i] = 0;
                        *pos = i + 1;
                        return line;
                }
        }
        return NULL;
}

static bool version_ok(const char *v, size_t len) {
        return len == 8 && memcmp(v, "HTTP/1.", 7) == 0 && (v[7] == '0' || v[7] == '1');
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_free_ char *buf = malloc(size + 1);
        HttpHeadField fields[MAX_FIELDS];
        size_t pos = 0, len, n = 0, start, end, at;
        char *line, *uri, *version, *target;
        size_t target_len;
        bool nul = false, hides = false;
        HttpHead head;
        int k;

        if (!buf)
                return 0;
        memcpy(buf, data, size);

        /* Lines that read as empty before the request line are skipped (a NUL first counts). */
        do {
                start = pos;
                line = next_line(buf, size, &pos, &len);
                if (!line)
                        return 0;
        } while (line[0] == 0);

        /* method SP+ target SP version, the version found from the end */
        uri = memchr(line, ' ', len);
        if (!uri)
                return 0;
        *uri++ = 0;
        while (*uri == ' ' && (size_t) (uri - line) < len)
                uri++;
        if ((size_t) (uri - line) == len)
                return 0;
        version = line + len - 1;
        while (*version == ' ' && version > uri)
                version--;
        while (*version != ' ' && version > uri)
                version--;
        if (version <= uri)
                return 0;
        *version++ = 0;
        if (!version_ok(version, len - (size_t) (version - line)))
                return 0;
        target = uri;
        target_len = strlen(uri);
        if ((uri = strchr(uri, '?')))
                *uri = 0; /* as the query parser does */

        for (;;) {
                char *colon;

                line = next_line(buf, size, &pos, &len);
                if (!line)
                        return 0;
                if (line[0] == 0)
                        break;
                if (n > 0 && (line[0] == ' ' || line[0] == '\t'))
                        return 0; /* a folded line: libmicrohttpd moves the field elsewhere */
                colon = strchr(line, ':');
                if (!colon || n == MAX_FIELDS)
                        return 0;
                *colon++ = 0;
                while (*colon == ' ' || *colon == '\t')
                        colon++;
                fields[n++] = (HttpHeadField){
                        .name = line, .name_len = strlen(line), .value = colon, .value_len = strlen(colon)
                };
        }
        end = pos;

        /* Whether the head holds a NUL at all, and whether one hides something: a byte other
         * than CR or NUL after it on its line. */
        for (size_t i = start; i < end; i++) {
                if (data[i] != 0)
                        continue;
                nul = true;
                for (size_t j = i + 1; j < end && data[j] != '\n'; j++)
                        if (data[j] != '\r' && data[j] != 0)
                                hides = true;
        }

        head = (HttpHead){
                .start = buf + start,
                .size = end - start,
                .target = target,
                .target_len = target_len,
                .version = version,
                .fields = fields,
                .n_fields = n,
        };
        k = http_head_check(&head, &at);
        if ((!nul && k != 0) || (hides && k == 0))
                abort();
        return 0;
}
