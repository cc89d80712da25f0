/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "storage.h"

/* The varlink stream as the storage client sees it: cut at NUL into messages, each parsed on its own.
 * Whatever a message holds, the parser returns an object, an error name or none, and a flag, or an
 * error, and sets nothing on failure. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

static void check_message(const char *msg, size_t len) {
        json_t *parameters = NULL;
        char *error = NULL;
        bool continues = false;
        int r;

        r = varlink_parse_reply(msg, len, &parameters, &error, &continues);
        if (r < 0) {
                assert(r == -EMSGSIZE || r == -EBADMSG || r == -ENOMEM);
                assert(!parameters && !error && !continues);
                return;
        }

        assert(json_is_object(parameters));
        assert(!error || (error[0] && !continues));
        /* What came out of the parser survives a round trip through the serialiser. */
        char *s = json_dumps(parameters, JSON_COMPACT);
        assert(s);
        free(s);
        json_decref(parameters);
        free(error);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const char *p = (const char *) data, *end = p + size;

        while (p < end) {
                const char *nul = memchr(p, 0, (size_t) (end - p));
                size_t len = (size_t) ((nul ?: end) - p);

                check_message(p, len);
                p += len + 1;
        }
        return 0;
}
