/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tss2/tss2_esys.h>

#include "api-error.h"
#include "cleanup.h"

/* The persistent handles of docs/agent.md: the attestation key the agent creates, and the TCG
 * handle of the RSA-2048 endorsement key. */
#define AGENT_AK_HANDLE UINT32_C(0x81010002)
#define AGENT_EK_HANDLE UINT32_C(0x81010001)

/* The PC Client PCR count; "vm-agent pcrs" prints them all. */
#define AGENT_PCR_COUNT 24U

static inline void esys_freep(void *p) {
        Esys_Free(*(void **) p);
}
#define _cleanup_esys_free_ _cleanup_(esys_freep)

/* One ESYS context on one TCTI. */
typedef struct AgentTpm AgentTpm;

/* Opens the TPM that spec names: a TCTI configuration when it contains ':' ("swtpm:path=/x/sock",
 * "device:/dev/tpmrm0", "tabrmd:"), otherwise a path: a unix socket is spoken to as a swtpm, anything
 * else as a TPM character device. */
int agent_tpm_open(const char *spec, AgentTpm **ret, ApiError *reterr);
AgentTpm *agent_tpm_free(AgentTpm *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(AgentTpm *, agent_tpm_free);

/* True when the TPM is a simulator behind a socket (swtpm or mssim): the event logs of the host it
 * runs on describe another TPM. */
bool agent_tpm_is_simulator(const AgentTpm *t);

/* The TCTI configuration string actually used (borrowed). */
const char *agent_tpm_tcti(const AgentTpm *t);

/* "sha1", "sha256", "sha384", "sha512" ↔ TPM2_ALG_*; 0 for an unknown name. */
TPMI_ALG_HASH agent_bank_from_string(const char *s);
const char *agent_bank_to_string(TPMI_ALG_HASH alg);

/* The values of the PCRs in mask (bit i = PCR i, i < AGENT_PCR_COUNT) of one bank. TPM2_PCR_Read
 * answers at most 8 digests per call, so it is repeated until every index has its value. */
typedef struct AgentPcrs {
        TPMI_ALG_HASH bank;
        uint32_t mask;
        TPM2B_DIGEST values[AGENT_PCR_COUNT];
} AgentPcrs;

int agent_tpm_read_pcrs(AgentTpm *t, TPMI_ALG_HASH bank, uint32_t mask, AgentPcrs *ret, ApiError *reterr);

/* The attestation key at AGENT_AK_HANDLE, created (under a transient ECC SRK) and made persistent
 * when the handle is empty. ret_public receives its public area. A key there that does not match the
 * template is refused. */
int agent_tpm_ensure_ak(AgentTpm *t, ESYS_TR *ret_ak, TPM2B_PUBLIC *ret_public, ApiError *reterr);

/* The endorsement key's public area: from AGENT_EK_HANDLE when it holds an object, otherwise derived
 * from the TCG RSA-2048 EK template (the transient primary is flushed again). */
int agent_tpm_ek_public(AgentTpm *t, TPM2B_PUBLIC *ret, ApiError *reterr);

/* What a quote and a credential activation both start with: the TPM that spec names opened
 * (agent_tpm_open()), its attestation key (agent_tpm_ensure_ak()) and its endorsement key's public
 * area (agent_tpm_ek_public()). The error says which of the three failed. */
int agent_tpm_open_keys(
        const char *spec,
        AgentTpm **ret_tpm,
        ESYS_TR *ret_ak,
        TPM2B_PUBLIC *ret_ak_public,
        TPM2B_PUBLIC *ret_ek_public,
        ApiError *reterr);

/* TPM2_Quote of the PCRs in mask of one bank with ak, the key's own scheme (NULL in the command)
 * and qualifying as qualifying data. Returns the TPMS_ATTEST bytes (the TPM2B_ATTEST's contents) and
 * the TPMT_SIGNATURE, both allocated by ESYS: free them with Esys_Free(). */
int agent_tpm_quote(
        AgentTpm *t,
        ESYS_TR ak,
        TPMI_ALG_HASH bank,
        uint32_t mask,
        const uint8_t *qualifying,
        size_t qualifying_size,
        TPM2B_ATTEST **ret_attest,
        TPMT_SIGNATURE **ret_signature,
        ApiError *reterr);

/* TPM2_ActivateCredential: unwraps a credential the host made (attest_make_credential()) for the
 * AK ak, with the endorsement key (the one at AGENT_EK_HANDLE, otherwise derived from the TCG
 * RSA-2048 template and flushed again) authorised by a PolicySecret(TPM_RH_ENDORSEMENT) session.
 * blob and secret are the marshalled TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET as the host sent
 * them; ret receives the credential. Success proves to the host that ak is in the TPM of that EK.
 * -EBADMSG for bytes that are not those structures, -EPERM when the TPM refuses the credential (made
 * for another AK or EK, or altered), -EIO for other TPM failures. Leaves no transient object or
 * session behind. */
int agent_tpm_activate_credential(
        AgentTpm *t,
        ESYS_TR ak,
        const uint8_t *blob,
        size_t blob_size,
        const uint8_t *secret,
        size_t secret_size,
        TPM2B_DIGEST *ret,
        ApiError *reterr);
