/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "api-error.h"
#include "attest-expect.h"
#include "attest-util.h"
#include "cleanup.h"

/* An image's policy.json (reference/network-imds-attest.md §4.3): the PCR 11 value per phase path
 * (what systemd-measure computed for the UKI), the PCR 13 value per Kubernetes version (SysextPCR
 * of the published sysext), and the golden sha256 PCRs recorded on a known-good boot with the
 * firmware build they belong to. Fields the verifier does not use (uki, roothash, partitions…) are
 * ignored. Every digest is kept as 64 lowercase hex characters. */

/* The phase paths systemd-pcrphase has extended PCR 11 with when the agent quotes. */
#define ATTEST_PHASE_INITRD "enter-initrd"
#define ATTEST_PHASE_READY "enter-initrd:leave-initrd:sysinit:ready"
/* The word systemd-pcrosseparator measures, the first event of PCR 13. */
#define ATTEST_OS_SEPARATOR "os-separator"

typedef struct AttestPcr13Entry {
        char *kubernetes_version;
        char value[ATTEST_SHA256_HEX + 1];
} AttestPcr13Entry;

typedef struct AttestPolicy {
        char *image_id;      /* NULL when absent */
        char *image_version; /* NULL when absent */

        char pcr11_initrd[ATTEST_SHA256_HEX + 1]; /* for ATTEST_PHASE_INITRD */
        char pcr11_ready[ATTEST_SHA256_HEX + 1];  /* for ATTEST_PHASE_READY */

        AttestPcr13Entry *pcr13;
        size_t n_pcr13;

        /* golden.sha256; golden[i] is "" where the policy has no value */
        char golden[ATTEST_PCR_POLICY_MAX][ATTEST_SHA256_HEX + 1];

        bool has_golden_firmware;
        char golden_firmware_sha256[ATTEST_SHA256_HEX + 1];
        char *golden_firmware_package; /* NULL when absent */
        char *golden_firmware_version; /* NULL when absent */

        /* "pcr12": "predicted": the image's agent quotes PCR 12 and its stub measures nothing there
         * but the kernel-cmdline-extra string vm-manager passes, so the verifier requires PCR 12 and
         * compares it with the value predicted from that string. Absent in policies written before
         * (their agents do not quote PCR 12), which keep being judged without it. */
        bool pcr12_predicted;
        /* "pcr12": "predicted-credentials": as "predicted", and the image's initrd also extends PCR
         * 12 with the credentials it was handed (attest_credentials_word()), so those are in the
         * prediction too. */
        bool pcr12_credentials;

        /* "pcr4": the PCR 4 events per way the image boots, computed at build time from its PE
         * images (attest-expect.h): {"installed": {"events": [{"type": "EV_EFI_ACTION", "sha256":
         * …, "what": …}, …], "value": …}, "installer": …}. Where present, the verifier checks the
         * quoted firmware log's PCR 4 events against them and needs no golden PCR 4; policies
         * written before have none (n_pcr4 0) and keep comparing PCR 4 with the golden value. */
        AttestExpectedPcr pcr4[ATTEST_EXPECTED_BOOTS_MAX];
        size_t n_pcr4;
} AttestPolicy;

/* The values "pcr12" takes. */
#define ATTEST_POLICY_PCR12_PREDICTED "predicted"
#define ATTEST_POLICY_PCR12_CREDENTIALS "predicted-credentials"

/* Decodes and validates a policy.json. Errors carry the reference's texts, all starting "policy: "
 * ("policy: pcr11 lacks phase \"enter-initrd\"", "policy: golden.sha256[3]: 31 bytes, want 32", …);
 * -EBADMSG for JSON that does not decode, -EINVAL for a policy that does not validate. The message
 * of reterr is exactly that text (no "invalid request: " prefix). */
int attest_policy_parse(const void *data, size_t size, AttestPolicy **ret, ApiError *reterr);
int attest_policy_from_json(json_t *v, AttestPolicy **ret, ApiError *reterr);

AttestPolicy *attest_policy_free(AttestPolicy *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(AttestPolicy *, attest_policy_free);

/* The expected PCR 11 value for a phase path, NULL for another phase. Borrowed. */
const char *attest_policy_pcr11(const AttestPolicy *p, const char *phase);

/* The expected value of a quoted PCR, NULL when the policy has none: for PCR 13 the pcr13 entry of
 * kubernetes_version when there is one (*ret_kubernetes is then set to it), otherwise the golden
 * value (*ret_kubernetes NULL). Borrowed. */
const char *attest_policy_expected(
        const AttestPolicy *p, unsigned index, const char *kubernetes_version, const char **ret_kubernetes);

/* The line the Go prototype's vm-kubernetes.service measures into PCR 13, the sysext's SHA256SUMS line
 * "<sha256 lowercase>  <file>". New string. This repository's image measures "<file> verity=<root hash>"
 * instead (images/README.md); policy.json carries the result either way, attest_sysext_pcr() below
 * computes it from either line. */
char *attest_sysext_measurement(const char *sha256_hex, const char *file);

/* SysextPCR: PCR 13 after "os-separator" and, when measurement is not NULL, measurement were
 * extended into zeros, each as PCR = sha256(PCR ‖ sha256(word)). Lowercase hex into ret. */
void attest_sysext_pcr(const char *measurement, char ret[static ATTEST_SHA256_HEX + 1]);
