/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "fuzz.h"
#include "oci-auth.h"
#include "oci-ref.h"

/* What a registry or token server sends that the client reads: a WWW-Authenticate value and a token
 * server's JSON answer; and a reference as a user types it. The same bytes go to all three. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(oci_challenge_done) OciChallenge c = OCI_CHALLENGE_NULL;
        _cleanup_(oci_ref_done) OciRef ref = {};
        _cleanup_free_ char *s = strndup((const char *) data, size), *token = NULL, *again = NULL;

        if (!s)
                return 0;
        if (oci_challenge_parse(s, &c) >= 0) {
                if (c.scheme == OCI_AUTH_BEARER && (!c.realm || !c.realm[0]))
                        abort();
        } else if (c.realm || c.scheme != _OCI_AUTH_SCHEME_INVALID)
                abort();

        if (oci_token_parse(data, size, &token) >= 0)
                for (const char *p = token; *p; p++)
                        if (*p <= ' ' || *p >= 0x7f)
                                abort();

        if (oci_ref_parse(s, &ref, NULL) >= 0) {
                _cleanup_(oci_ref_done) OciRef ref2 = {};
                again = oci_ref_to_string(&ref);
                /* what we print parses again, to the same reference */
                if (!again || oci_ref_parse(again, &ref2, NULL) < 0 || !streq(ref.host, ref2.host) ||
                    !streq(ref.repository, ref2.repository))
                        abort();
        }
        return 0;
}
