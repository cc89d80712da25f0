/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "attest-request.h"
#include "attest-verify.h"
#include "fuzz.h"

/* A POST /attest/quote body as a guest could send it: the decoder returns a request that passed
 * the validation, or a 400 text ("malformed quote: …" or "invalid request: …"). A request that
 * decodes goes on through the verifier, with its own nonce issued and a learn-mode policy whose
 * PCR 11 is the value sent, so a real body (the seeds are the swtpm fixtures' agent bodies) is
 * verified end to end. */

#define VM "vm-fuzz"

static AttestNonceStore *nonces;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        /* tss2-mu writes every structure it cannot decode to stderr */
        (void) setenv("TSS2_LOG", "all+none", 1);
        assert(attest_nonce_store_new(&nonces) >= 0);
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(attest_quote_request_done) AttestQuoteRequest req = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        _cleanup_(attest_result_done) AttestResult res = {};
        AttestPolicy policy = {};
        AttestVerifyParams params;
        const char *p11;
        json_t *j;
        int r;

        if (size > ((size_t) 8 << 20))
                return 0;

        r = attest_quote_request_decode(data, size, &req, &err);
        if (r < 0) {
                assert(r == -EBADMSG || r == -EINVAL || r == -EFBIG || r == -ENOMEM);
                assert(r == -ENOMEM || err.message);
                assert(r == -ENOMEM || strncmp(err.message, "malformed quote: ", 17) == 0 ||
                       strncmp(err.message, "invalid request: ", 17) == 0);
                assert(!req.stage && !req.quote);
                return 0;
        }
        assert(!err.message);
        assert(streq(req.stage, "initrd") || streq(req.stage, "ready"));
        assert(req.nonce && req.nonce[0] && strlen(req.nonce) <= ATTEST_NONCE_MAX);
        assert(req.quote_size > 0 && req.quote_size <= ATTEST_QUOTE_MAX);
        assert(req.signature_size > 0 && req.signature_size <= ATTEST_SIGNATURE_MAX);
        assert(req.ak_pub_size > 0 && req.ak_pub_size <= ATTEST_PUBLIC_MAX);
        assert(req.ek_pub_size <= ATTEST_PUBLIC_MAX);
        assert(req.event_log_size <= ATTEST_LOG_MAX && req.userspace_log_size <= ATTEST_LOG_MAX);
        assert(req.n_pcr_banks > 0);

        p11 = req.pcrs_sha256[11];
        if (p11 && strlen(p11) == ATTEST_SHA256_HEX && strspn(p11, "0123456789abcdef") == ATTEST_SHA256_HEX) {
                memcpy(policy.pcr11_initrd, p11, ATTEST_SHA256_HEX + 1);
                memcpy(policy.pcr11_ready, p11, ATTEST_SHA256_HEX + 1);
        }
        (void) attest_nonce_add(nonces, VM, req.nonce, 1);
        params = (AttestVerifyParams){
                .vm_id = VM,
                .now = 1,
                .at = 1,
                .policy = &policy,
                .learn_golden = true,
        };
        assert(attest_verify_quote(nonces, &req, &params, &res) >= 0);
        assert(res.message && res.message[0]);
        assert(!res.verified || strncmp(res.message, "verified: ak ", 13) == 0);
        attest_nonce_forget(nonces, VM);

        j = attest_result_to_json(&res);
        assert(j);
        json_decref(j);
        j = attest_quote_result_to_json(req.stage, res.verified, res.message);
        assert(j);
        json_decref(j);
        return 0;
}
