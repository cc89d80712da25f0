/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "attest-eventlog.h"
#include "attest-fwlog.h"
#include "attest-nonce.h"
#include "attest-policy.h"
#include "attest-request.h"
#include "attest-util.h"
#include "macro.h"
#include "time-util.h"

/* The verifier (reference/network-imds-attest.md §4.1): one decoded QuoteRequest of one VM is judged
 * in the reference's order, and the first failing check is the verdict's message:
 *
 *   1 nonce consumed for this VM   2 stage known        3 policy present    4 quote parses
 *   5 signature verifies           6 nonce matches      7 bank is sha256    8 a value per quoted PCR
 *   9 PCR digest matches          10 stage's PCRs covered (initrd 0–7,11; ready 0–7,11,13; both
 *                                    also 12 where the policy has "pcr12": "predicted")
 *  11 AK is the activated one    11a the event logs replay to the quoted PCRs (attest-eventlog.h)
 *                                 11b PCR 4 event by event against the policy's "pcr4", PCR 7 against
 *                                     the events expected from the variable store template
 *                                     (attest-expect.h), PCRs 0, 2, 3, 6 against the host's
 *                                     firmware run (attest-fwlog.h), where those are known
 *  12 PCR 11 per phase            12a PCR 12 equals the one predicted from the command line the
 *                                     daemon passed (policy "pcr12": "predicted")
 *                                 13 golden 0,2,3,6 and 4, 7 where 11b did not check them (+13 at
 *                                    ready); PCRs 0,2,3,6 with neither a firmware run nor a golden
 *                                    value: firmware_missing is the verdict
 *  14 verified                    15 without an activated or pinned AK: rejected (no_ak_message),
 *                                    or trust on first use where the caller leaves that NULL (an
 *                                    initrd quote enrolls its AK; a ready quote is rejected)
 *
 * Pure apart from the nonce store: the caller looks the policy and the pin up, and applies the
 * verdict (stores the Result, pins the AK when Result.enroll, releases user-data). */

typedef enum AttestStage {
        ATTEST_STAGE_INITRD,
        ATTEST_STAGE_READY,
        _ATTEST_STAGE_MAX,
        _ATTEST_STAGE_INVALID = -EINVAL,
} AttestStage;

const char *attest_stage_to_string(AttestStage s) _const_;
AttestStage attest_stage_from_string(const char *s) _pure_;
/* The phase path PCR 11 carries at a stage: ATTEST_PHASE_INITRD or ATTEST_PHASE_READY. */
const char *attest_stage_phase(AttestStage s) _const_;

/* The verdict on one stage of one VM, kept for get_vm_attestation. Rejections carry the fields
 * known up to the failing check. */
typedef struct AttestResult {
        bool verified;
        char *message;
        usec_t at;                    /* CLOCK_REALTIME of the verdict */
        char *ak_fingerprint;         /* 64 hex, set once the quote parsed */
        char *pcrs[ATTEST_PCR_SLOTS]; /* lowercase hex of every quoted PCR, set once the digest matched */
        unsigned learned[ATTEST_PCR_SLOTS]; /* PCRs accepted without an expected value, ascending */
        size_t n_learned;
        bool has_event_log; /* the logs were replayed (check 11a ran) */
        AttestEventLogSummary event_log;
        bool enroll;    /* verified initrd quote of a VM without a pin: pin ak_fingerprint now */
        bool retryable; /* rejected for a reason a new quote of the same boot can cure (a stale nonce) */
} AttestResult;

void attest_result_done(AttestResult *r);

/* The stable beginning of the verdict on a quote whose AK is not the one activated for the VM's
 * vTPM (or when none is). */
#define ATTEST_AK_NOT_ACTIVATED "attestation key not activated for this vm's vTPM"

typedef struct AttestVerifyParams {
        const char *vm_id;
        usec_t now; /* the nonce store's clock */
        usec_t at;  /* CLOCK_REALTIME, stamped on the result */
        /* The policy of the VM's image; NULL when it has none, and no_policy_message is the verdict
         * then ("no attestation policy: image <ref> has no policy.json"). */
        const AttestPolicy *policy;
        const char *no_policy_message;
        const char *kubernetes_version; /* the VM's; selects the policy's pcr13 entry; NULL for none */
        /* The fingerprint of the AK this VM's quotes must come from, NULL when none: the one its
         * guest activated a credential for (ak_activated), or the one pinned on its first quote for
         * a VM from before credential activation. */
        const char *pinned_ak;
        bool ak_activated;
        /* Without pinned_ak: NULL keeps trust on first use (the first verified initrd quote enrolls
         * its AK); otherwise it is the verdict (at check 11), retryable when no_ak_retryable. */
        const char *no_ak_message;
        bool no_ak_retryable;
        /* PCR 12 as 64 lowercase hex, predicted by attest_predict_pcr12_booted() from the
         * kernel-cmdline-extra string the daemon passed to this run; compared where the policy has "pcr12":
         * "predicted". NULL when the daemon does not know what it passed (a run an older vm-manager
         * started): PCR 12 is then required but not compared, and the verdict says so. */
        const char *expected_pcr12;
        /* The PCR 7 events the daemon expects from the OVMF variable store template it copies for
         * each VM (attest_varstore_pcr7()); NULL when it could not derive them (a template with
         * Secure Boot keys, or one it could not read), and PCR 7 is then compared with the
         * policy's golden value. */
        const AttestExpectedPcr *expected_pcr7;
        /* The events the host's firmware measures into PCRs 0-6 before any image runs, from the
         * firmware run for this VM's firmware, memory size and CPU count; NULL when none is known.
         * PCRs 0, 2, 3 and 6 are then compared with the policy's golden values (pinned with `image
         * golden`), and where the policy has none either, firmware_missing is the verdict (why no
         * run is known: "the firmware run for … is still going"), retryable when
         * firmware_retryable (a run is under way, so the same boot's next quote can verify). */
        const AttestFirmwareExpect *firmware;
        const char *firmware_missing;
        bool firmware_retryable;
        bool learn_golden; /* --attestation-learn-golden */
} AttestVerifyParams;

/* Judges req for p->vm_id and fills *ret with the verdict, verified or not (0). Fails only on OOM
 * or bad arguments. The nonce is consumed in any case. Callable on in-memory data alone (fixtures,
 * benchmarks): everything it needs is in its arguments. */
int attest_verify_quote(
        AttestNonceStore *nonces, const AttestQuoteRequest *req, const AttestVerifyParams *p, AttestResult *ret);

/* The golden PCRs (0, 2, 3, 4, 6, 7) policy has no value for, as a bit mask: every quote of a VM on
 * such an image is rejected unless learn mode accepts them. PCR 4 needs none where the policy has
 * "pcr4" events, PCR 7 none where pcr7_expected (the daemon derived its events), PCRs 0, 2, 3 and 6
 * none where firmware_expected (a firmware run knows or is learning them). */
uint32_t attest_policy_missing_golden(const AttestPolicy *policy, bool pcr7_expected, bool firmware_expected);

/* {"verified","message"(omitempty),"at":RFC 3339,"akFingerprint"(omitempty),"pcrs":{"0":…}(omitempty),
 * "learned":[…](omitempty)} as §4.5 shows a stage (pcrs keys in Go's order: sorted as strings), and
 * "eventLog":{"replayed","firmwareEvents","userspaceEvents"} once the logs were replayed.
 * New reference, NULL on OOM. */
json_t *attest_result_to_json(const AttestResult *r);
/* The inverse, for records read back from disk. -EINVAL for JSON of another shape. */
int attest_result_from_json(json_t *v, AttestResult *ret);
