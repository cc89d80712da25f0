/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "agent-imds.h"
#include "api-error.h"

/* The credential activation (docs/agent.md): before the daemon trusts a quote of the attestation key
 * it makes a credential that only this TPM's endorsement key can unwrap, and only for this AK.
 *
 *   POST <base>/attest/challenge {"ak_pub","ek_pub"}  → {"credential_blob","encrypted_secret"}
 *   TPM2_ActivateCredential with the AK and the EK   → the secret
 *   POST <base>/attest/activate  {"secret"}          → {"activated": true, "ak_fingerprint"}
 *
 * Returns 1 once the daemon recorded the AK as activated; 0 when the daemon has nothing to activate
 * against (HTTP 409: its vTPM has no EK certificate) or does not know the challenge (HTTP 404: a
 * daemon from before credential activation), so that the quote's verdict says what holds, with
 * the daemon's text in reterr; -EPERM when the daemon refused (a foreign EK, another AK already
 * activated, a wrong secret), its text in reterr; other negative errnos for TPM or transport
 * failures. */
int agent_activate(const AgentImds *imds, const char *tpm, ApiError *reterr);
