/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "fuzz.h"
#include "http-util.h"

/* The header values the loopback guard and the media type check read, as any client sends them:
 * the bytes as a Host (also with an embedded NUL: the length is what counts), an Origin and a
 * Content-Type. Whatever the verdicts, a host is loopback only if its Origin form is too. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_free_ char *s = strndup((const char *) data, size), *origin = NULL;
        bool host;

        if (!s)
                return 0;
        host = http_host_is_loopback((const char *) data, size);
        (void) http_origin_is_loopback(s);
        (void) http_content_type_is_json(s);
        if (asprintf(&origin, "http://%s", s) < 0)
                return 0;
        /* an Origin's authority ends at the first '/' */
        if (host && strlen(s) == size && !strchr(s, '/') && !http_origin_is_loopback(origin))
                abort();
        return 0;
}
