/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tss2/tss2_mu.h>
#include <tss2/tss2_rc.h>

#include "agent-activate.h"
#include "agent-quote.h"
#include "agent-tpm.h"
#include "agent-util.h"
#include "cleanup.h"
#include "hex-util.h"

/* The bigger of the two structures the challenge carries, as base64 text it can be no longer. */
#define CREDENTIAL_MAX (sizeof(TPM2B_ENCRYPTED_SECRET))

/* A refusal or failure the daemon answered with: 409 is "nothing to activate against" and 404 a
 * daemon from before credential activation (0: the quote goes ahead, its verdict says what holds),
 * 403 a refusal (-EPERM), anything else an error. */
static int answer_error(const char *what, long status, const char *text, ApiError *reterr) {
        if (status == 409 || status == 404) {
                (void) api_error_set(reterr, -EOPNOTSUPP, API_ERROR_INTERNAL, "%s: %s", what, text ?: "");
                return 0;
        }
        return api_error_set(
                reterr, status == 403 ? -EPERM : -EBADMSG, API_ERROR_INTERNAL, "%s: %s", what, text ?: "");
}

static int take_base64(json_t *o, const char *key, uint8_t **ret, size_t *ret_size) {
        json_t *v = json_object_get(o, key);

        if (!json_is_string(v))
                return -EBADMSG;
        return base64_decode(
                json_string_value(v),
                json_string_length(v),
                CREDENTIAL_MAX,
                ret,
                ret_size,
                /* reterr_offset= */ NULL);
}

static int post_challenge(
        const AgentImds *imds, const TPM2B_PUBLIC *ak, const TPM2B_PUBLIC *ek, json_t **ret, ApiError *reterr) {
        uint8_t ak_buf[sizeof(TPM2B_PUBLIC)], ek_buf[sizeof(TPM2B_PUBLIC)];
        _cleanup_free_ char *ak64 = NULL, *ek64 = NULL, *body = NULL, *text = NULL;
        size_t ak_size = 0, ek_size = 0;
        json_t *answer = NULL;
        long status = 0;
        TSS2_RC rc;
        int r;

        rc = Tss2_MU_TPM2B_PUBLIC_Marshal(ak, ak_buf, sizeof(ak_buf), &ak_size);
        if (rc == TSS2_RC_SUCCESS)
                rc = Tss2_MU_TPM2B_PUBLIC_Marshal(ek, ek_buf, sizeof(ek_buf), &ek_size);
        if (rc != TSS2_RC_SUCCESS)
                return api_error_set(reterr, -EIO, API_ERROR_INTERNAL, "marshal keys: %s", Tss2_RC_Decode(rc));
        ak64 = base64_encode(ak_buf, ak_size);
        ek64 = base64_encode(ek_buf, ek_size);
        if (!ak64 || !ek64 || asprintf(&body, "{\"ak_pub\":\"%s\",\"ek_pub\":\"%s\"}", ak64, ek64) < 0)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        r = agent_imds_post(imds, "/attest/challenge", body, &status, &answer, &text, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "credential challenge");
                return r;
        }
        if (status != 200 || !answer) {
                json_decref(answer);
                return answer_error("credential challenge", status, text, reterr);
        }
        *ret = answer;
        return 1;
}

int agent_activate(const AgentImds *imds, const char *tpm_spec, ApiError *reterr) {
        _cleanup_(agent_tpm_freep) AgentTpm *tpm = NULL;
        _cleanup_free_ uint8_t *blob = NULL, *secret = NULL;
        _cleanup_free_ char *secret64 = NULL, *body = NULL, *text = NULL;
        json_auto_t *challenge = NULL, *answer = NULL;
        size_t blob_size = 0, secret_size = 0;
        TPM2B_PUBLIC ak_public, ek_public;
        TPM2B_DIGEST credential = {};
        long status = 0;
        ESYS_TR ak;
        int r;

        assert_return(imds, -EINVAL);

        r = agent_tpm_open_keys(tpm_spec ?: AGENT_TPM_DEFAULT, &tpm, &ak, &ak_public, &ek_public, reterr);
        if (r < 0)
                return r;

        agent_debug("asking the daemon for a credential");
        r = post_challenge(imds, &ak_public, &ek_public, &challenge, reterr);
        if (r <= 0)
                return r;
        if (take_base64(challenge, "credential_blob", &blob, &blob_size) < 0 ||
            take_base64(challenge, "encrypted_secret", &secret, &secret_size) < 0)
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "credential challenge: the answer does not decode");

        r = agent_tpm_activate_credential(tpm, ak, blob, blob_size, secret, secret_size, &credential, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "activate credential");
                return r;
        }
        /* The TPM is not needed any more: the quote that follows opens it again. */
        tpm = agent_tpm_free(tpm);

        secret64 = base64_encode(credential.buffer, credential.size);
        explicit_bzero(&credential, sizeof(credential));
        if (!secret64 || asprintf(&body, "{\"secret\":\"%s\"}", secret64) < 0)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        r = agent_imds_post(imds, "/attest/activate", body, &status, &answer, &text, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "credential activation");
                return r;
        }
        if (status != 200 || !json_is_true(json_object_get(answer, "activated"))) {
                r = answer_error("credential activation", status, text, reterr);
                /* A 409 here means the challenge was lost (a newer one, or it expired): not done. */
                return r == 0 ? -EAGAIN : r;
        }
        agent_info(
                "attestation key %.16s activated with the endorsement key",
                json_string_value(json_object_get(answer, "ak_fingerprint")) ?: "?");
        return 1;
}
