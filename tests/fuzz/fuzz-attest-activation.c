/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "attest-credential.h"
#include "attest-quote.h"
#include "attest-request.h"
#include "cleanup.h"
#include "fuzz.h"

/* The credential activation's bodies as a guest could post them: POST attest/challenge and POST
 * attest/activate (the same bytes go through both decoders). A challenge that decodes goes on as
 * the daemon takes it: the EK and the AK are parsed, the AK's name computed and a credential made
 * for it with the EK, so a real body (the seed is the swtpm fixtures' AK and EK) reaches
 * TPM2_MakeCredential. Every refusal is one of the texts the metadata service answers with. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        /* tss2-mu writes every structure it cannot decode to stderr */
        (void) setenv("TSS2_LOG", "all+none", 1);
        return 0;
}

static bool prefixed(const ApiError *e, const char *const *prefixes) {
        for (; *prefixes; prefixes++)
                if (e->message && strncmp(e->message, *prefixes, strlen(*prefixes)) == 0)
                        return true;
        return false;
}

static void challenge(const uint8_t *data, size_t size) {
        static const char *const decode[] = { "malformed challenge: ", "invalid request: ", NULL };
        static const char *const keys[] = { "malformed ", "unsupported ", "attestation key attributes: ", NULL };
        static const uint8_t secret[32] = "fuzzed-secret-of-thirty-two-byte";
        _cleanup_(attest_challenge_request_done) AttestChallengeRequest req = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestCredential c;
        TPMT_PUBLIC ek, ak;
        TPM2B_NAME name;
        int r;

        r = attest_challenge_request_decode(data, size, &req, &err);
        if (r < 0) {
                assert(r == -EBADMSG || r == -EINVAL || r == -EFBIG || r == -ENOMEM);
                assert(r == -ENOMEM || prefixed(&err, decode));
                assert(!req.ak_pub && !req.ek_pub);
                return;
        }
        assert(req.ak_pub_size > 0 && req.ak_pub_size <= ATTEST_PUBLIC_MAX);
        assert(req.ek_pub_size > 0 && req.ek_pub_size <= ATTEST_PUBLIC_MAX);

        r = attest_ek_public_parse(req.ek_pub, req.ek_pub_size, &ek, &err);
        if (r < 0) {
                assert(r == -ENOMEM || prefixed(&err, keys));
                return;
        }
        r = attest_ak_public_parse(req.ak_pub, req.ak_pub_size, &ak, &err);
        if (r < 0) {
                assert(r == -ENOMEM || prefixed(&err, keys));
                return;
        }
        assert(ak.objectAttributes & TPMA_OBJECT_RESTRICTED);
        assert(ak.objectAttributes & TPMA_OBJECT_SIGN_ENCRYPT);
        if (attest_tpm_name(&ak, &name) < 0)
                return;
        r = attest_make_credential(&ek, &name, secret, sizeof(secret), &c, &err);
        assert(r == 0 || r == -EINVAL || r == -ENOMEM);
        if (r == 0)
                assert(c.blob_size <= sizeof(c.blob) && c.secret_size <= sizeof(c.secret));
}

static void activate(const uint8_t *data, size_t size) {
        static const char *const decode[] = { "malformed activation: ", "invalid request: ", NULL };
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestActivateRequest req = {};
        int r;

        r = attest_activate_request_decode(data, size, &req, &err);
        if (r < 0) {
                assert(r == -EBADMSG || r == -EINVAL || r == -EFBIG || r == -ENOMEM);
                assert(r == -ENOMEM || prefixed(&err, decode));
                assert(req.secret_size == 0);
                return;
        }
        assert(req.secret_size > 0 && req.secret_size <= ATTEST_ACTIVATE_SECRET_MAX);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > ((size_t) 64 << 10))
                return 0;
        challenge(data, size);
        activate(data, size);
        return 0;
}
