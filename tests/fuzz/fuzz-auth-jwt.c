/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "auth-jwt.h"
#include "cleanup.h"
#include "fuzz.h"
#include "log.h"

/* A bearer token as a client sends it: parsed, verified against a key set, its claims checked and
 * its caller taken out. Input that starts with '{' is a JWKS document instead, as an IdP serves
 * it. The keys are the public halves of two of tests/integration/oidc/test-keys.json, so the
 * corpus' tokens signed with them verify and reach the claim checks. */

static const char jwks_text[] =
        "{\"keys\":[{\"kty\":\"EC\",\"x\":\"Oaco-QBajAzvFk5m4sSoxHg89tOqFraM6ZrdpAF9zt8\",\"y\":\"cQUL2UHgibjBAm"
        "BqnhsPsywCkSb07TLXx37FtHC4zVE\",\"crv\":\"P-256\",\"kid\":\"test-ec-1\",\"alg\":\"ES256\",\"use\":\"sig\"},"
        "{\"kty\":\"RSA\",\"n\":\"o8-_hnTDjZLC5zZLOh8p3oHRERE1Apuz-bqR9v0y7ujejCF1r72jug10Pg3RnqHFuydzOrTS"
        "3CfXulgWZsJXp2IpOx0bHkG4HNFLHKYc7foz_b4WComZ3k6-WZ4JKl1J2ct0f_vgFIIlf_fIdgNd1HLqE69k-vOn7X"
        "4uu7z9fLF7d4ydoUgkQQYeXld3z551Hvowo2D-lLZhL34JqhnRxunQPqfA3QdGd_q-EPospJA9Tvt_KuwyX29DK-LB"
        "ePTRw_Y7cPChhhiDpCv1XUwslapPMMPCmpplaJly5_sXCEHEFADAc6e5vYGK1iVq8rN9-miioxKZ4TXLcwrzCoAkzw"
        "\",\"e\":\"AQAB\",\"kid\":\"test-rsa-1\",\"alg\":\"RS256\",\"use\":\"sig\"}]}";

static AuthKeySet *keys;

static void cleanup(void) {
        keys = auth_keyset_free(keys);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        json_auto_t *jwks = json_loads(jwks_text, 0, NULL);

        log_set_max_level(LOG_CRIT);
        if (!jwks || auth_keyset_from_json(jwks, &keys, NULL) < 0 || auth_keyset_size(keys) != 2)
                abort();
        atexit(cleanup);
        return 0;
}

static char *const audiences[] = { (char *) "https://vmm.example/mcp", (char *) "agent-platform", NULL };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(auth_token_freep) AuthToken *t = NULL;
        _cleanup_(caller_freep) Caller *c = NULL;
        const char *reason = NULL;
        int r;

        if (size > 0 && data[0] == '{') {
                _cleanup_(auth_keyset_freep) AuthKeySet *s = NULL;
                json_auto_t *j = json_loadb((const char *) data, size, 0, NULL);

                if (j && auth_keyset_from_json(j, &s, &reason) >= 0 && auth_keyset_size(s) == 0)
                        abort(); /* a key set is never empty */
                return 0;
        }

        r = auth_token_parse((const char *) data, size, &t, &reason);
        if (r < 0) {
                if (!reason)
                        abort(); /* every refusal says why */
                return 0;
        }
        if (!t->compact || strlen(t->compact) != size || !json_is_object(t->claims))
                abort();
        r = auth_token_verify(t, keys, &reason);
        if (r < 0)
                return 0;
        r = auth_token_check_claims(
                t,
                &(AuthClaimCheck){ .issuer = "https://dex.example",
                                   .audiences = audiences,
                                   .now = (usec_t) 1850000000 * USEC_PER_SEC,
                                   .skew = AUTH_CLOCK_SKEW_DEFAULT },
                &reason);
        if (r < 0)
                return 0;
        if (auth_token_caller(t, CALLER_SOURCE_SSO, &c) < 0 || !c->subject || !*c->subject)
                abort();
        return 0;
}
