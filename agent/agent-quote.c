/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>

#include <tss2/tss2_mu.h>
#include <tss2/tss2_rc.h>

#include "agent-quote.h"
#include "agent-tpm.h"
#include "agent-util.h"
#include "cleanup.h"
#include "hex-util.h"
#include "string-table.h"

static const char *const agent_stage_table[_AGENT_STAGE_MAX] = {
        [AGENT_STAGE_INITRD] = "initrd",
        [AGENT_STAGE_READY] = "ready",
};

DEFINE_STRING_TABLE_LOOKUP(agent_stage, AgentStage);

uint32_t agent_stage_pcrs(AgentStage s) {
        /* PCR 12 at both stages: systemd-stub measures the kernel-cmdline-extra string the host
         * passed there before the kernel runs, so the host can tell whether the command line it
         * handed over is the one the guest booted with, from the first quote on. */
        switch (s) {
        case AGENT_STAGE_INITRD:
                return 0xffU | 1U << 11 | 1U << 12;
        case AGENT_STAGE_READY:
                return 0xffU | 1U << 11 | 1U << 12 | 1U << 13;
        default:
                return 0;
        }
}

static int set_new(json_t *o, const char *key, json_t *v) {
        /* json_object_set_new() consumes v, also when it fails. */
        if (!v || json_object_set_new(o, key, v) < 0)
                return -ENOMEM;
        return 0;
}

static int set_base64(json_t *o, const char *key, const void *data, size_t size) {
        _cleanup_free_ char *s = base64_encode(data, size);

        if (!s)
                return -ENOMEM;
        return set_new(o, key, json_string(s));
}

static int pcrs_to_json(const AgentPcrs *pcrs, json_t **ret) {
        json_auto_t *values = json_object(), *banks = json_object();

        if (!values || !banks)
                return -ENOMEM;
        for (unsigned i = 0; i < AGENT_PCR_COUNT; i++) {
                _cleanup_free_ char *hex = NULL;
                char key[4];

                if (!(pcrs->mask & (UINT32_C(1) << i)))
                        continue;
                hex = hex_encode(pcrs->values[i].buffer, pcrs->values[i].size);
                if (!hex)
                        return -ENOMEM;
                (void) snprintf(key, sizeof(key), "%u", i);
                if (set_new(values, key, json_string(hex)) < 0)
                        return -ENOMEM;
        }
        if (set_new(banks, agent_bank_to_string(pcrs->bank), TAKE_PTR(values)) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(banks);
        return 0;
}

/* Attaches one event log as base64 under key; a missing or empty file is left out. */
static int attach_log(json_t *o, const char *key, const char *path, ApiError *reterr) {
        _cleanup_free_ uint8_t *data = NULL;
        size_t size = 0;
        int r;

        r = read_file_capped(path, AGENT_EVENT_LOG_MAX, &data, &size);
        if (r == -ENOENT) {
                agent_debug("no %s at %s", key, path);
                return 0;
        }
        if (r == -EFBIG)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "read event log %s: larger than %u bytes",
                        path,
                        AGENT_EVENT_LOG_MAX);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "read event log %s: %s", path, strerror(-r));
        if (size == 0)
                return 0;
        agent_debug("attaching %s: %zu bytes from %s", key, size, path);
        if (set_base64(o, key, data, size) < 0)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        return 0;
}

int agent_quote_build(
        const AgentQuoteOptions *o, AgentStage stage, const char *nonce, json_t **ret, ApiError *reterr) {
        _cleanup_(agent_tpm_freep) AgentTpm *tpm = NULL;
        _cleanup_free_ uint8_t *qualifying = NULL;
        _cleanup_esys_free_ TPM2B_ATTEST *attest = NULL;
        _cleanup_esys_free_ TPMT_SIGNATURE *signature = NULL;
        json_auto_t *req = NULL, *pcrs_json = NULL;
        uint8_t ak_buf[sizeof(TPMT_PUBLIC)], ek_buf[sizeof(TPM2B_PUBLIC)], sig_buf[sizeof(TPMT_SIGNATURE)];
        size_t qualifying_size = 0, ak_size = 0, ek_size = 0, sig_size = 0;
        TPM2B_PUBLIC ak_public, ek_public;
        AgentPcrs pcrs;
        ESYS_TR ak;
        uint32_t mask = agent_stage_pcrs(stage);
        const char *firmware_log, *userspace_log;
        bool simulator;
        TSS2_RC rc;
        int r;

        assert_return(o, -EINVAL);
        assert_return(nonce, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(mask != 0, -EINVAL);

        if (!nonce[0])
                return api_error_set(reterr, -EINVAL, API_ERROR_INTERNAL, "empty nonce");
        qualifying_size = strlen(nonce) / 2;
        qualifying = malloc(MAX(qualifying_size, (size_t) 1));
        if (!qualifying)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        r = hex_decode(nonce, strlen(nonce), /* lower_only= */ false, qualifying, /* reterr_offset= */ NULL);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "nonce is not hex");

        r = agent_tpm_open_keys(o->tpm ?: AGENT_TPM_DEFAULT, &tpm, &ak, &ak_public, &ek_public, reterr);
        if (r < 0)
                return r;
        r = agent_tpm_read_pcrs(tpm, TPM2_ALG_SHA256, mask, &pcrs, reterr);
        if (r < 0)
                return r;
        r = agent_tpm_quote(
                tpm, ak, TPM2_ALG_SHA256, mask, qualifying, qualifying_size, &attest, &signature, reterr);
        if (r < 0)
                return r;

        rc = Tss2_MU_TPMT_PUBLIC_Marshal(&ak_public.publicArea, ak_buf, sizeof(ak_buf), &ak_size);
        if (rc == TSS2_RC_SUCCESS)
                rc = Tss2_MU_TPM2B_PUBLIC_Marshal(&ek_public, ek_buf, sizeof(ek_buf), &ek_size);
        if (rc == TSS2_RC_SUCCESS)
                rc = Tss2_MU_TPMT_SIGNATURE_Marshal(signature, sig_buf, sizeof(sig_buf), &sig_size);
        if (rc != TSS2_RC_SUCCESS)
                return api_error_set(reterr, -EIO, API_ERROR_INTERNAL, "marshal quote: %s", Tss2_RC_Decode(rc));

        req = json_object();
        if (!req || set_new(req, "stage", json_string(agent_stage_to_string(stage))) < 0 ||
            set_new(req, "nonce", json_string(nonce)) < 0 || set_base64(req, "ak_pub", ak_buf, ak_size) < 0 ||
            set_base64(req, "ek_pub", ek_buf, ek_size) < 0 ||
            set_base64(req, "quote", attest->attestationData, attest->size) < 0 ||
            set_base64(req, "signature", sig_buf, sig_size) < 0 || pcrs_to_json(&pcrs, &pcrs_json) < 0 ||
            set_new(req, "pcrs", TAKE_PTR(pcrs_json)) < 0)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        /* A swtpm on a development host: the host's own logs at the default paths describe another
         * TPM, so only logs named explicitly (a test replaying its events into the swtpm) go along. */
        simulator = agent_tpm_is_simulator(tpm);
        firmware_log = o->firmware_log ?: (simulator ? NULL : AGENT_FIRMWARE_LOG);
        userspace_log = o->userspace_log ?: (simulator ? NULL : AGENT_USERSPACE_LOG);
        if (!firmware_log && !userspace_log)
                agent_debug("the tpm is a simulator, leaving the event logs out");
        if (firmware_log) {
                r = attach_log(req, "event_log", firmware_log, reterr);
                if (r < 0)
                        return r;
        }
        if (userspace_log) {
                r = attach_log(req, "userspace_log", userspace_log, reterr);
                if (r < 0)
                        return r;
        }

        *ret = TAKE_PTR(req);
        return 0;
}
