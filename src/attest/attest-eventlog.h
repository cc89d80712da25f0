/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api-error.h"
#include "attest-quote.h"
#include "attest-util.h"

/* The two event logs a quote carries (reference/network-imds-attest.md §2.4 "event_log" and
 * "userspace_log"), replayed on the sha256 bank against the PCR values of the quote:
 *
 * - event_log is the firmware's TCG PC Client event log as Linux exposes it in
 *   /sys/kernel/security/tpm0/binary_bios_measurements, in the crypto-agile format: a
 *   TCG_PCR_EVENT (SHA-1 layout) whose data is the "Spec ID Event03" structure naming the log's
 *   digest algorithms and their sizes, then TCG_PCR_EVENT2 entries (pcr, type, one digest per
 *   algorithm, data), all little endian. EV_NO_ACTION entries extend nothing; a "StartupLocality"
 *   one sets the last byte of PCR 0's reset value. Zero bytes after the last entry are padding.
 * - userspace_log is systemd's /run/log/systemd/tpm2-measure.log: RFC 7464 JSON text sequences,
 *   each record 0x1E, a JSON object, LF, the object carrying "pcr" and
 *   "digests":[{"hashAlg":"sha256","digest":"<hex>"},…]. A record with "nv_index" instead (newer
 *   systemd logs its NvPCR measurements in the same file) extends no PCR. A last record without its
 *   LF that does not parse is one being written, and is left out.
 *
 * Every PCR starts at its reset value (PCRs 17-22 all ones, the others zero), then the firmware
 * log's measurements extend it in order, then the userspace log's records. The firmware log is
 * complete before the OS runs and replays in full. The agent reads the userspace log after it has
 * quoted, so records written after the quote can be there: the logs match when the values after
 * some prefix of the userspace records (the longest such prefix is counted) equal every quoted PCR,
 * as Keylime accepts a measurement list that runs on past its quote. A log the guest left out
 * replays as an empty one. */

/* Numbered as TPM 2.0 PC client PCRs; the logs name no other. */
#define ATTEST_EVENT_LOG_PCRS 24U
/* Algorithms a Spec ID event may list (a TPM has a handful of banks). */
#define ATTEST_EVENT_LOG_ALGS_MAX 16U

typedef struct AttestPcrBank {
        uint8_t pcr[ATTEST_PCR_SLOTS][ATTEST_SHA256_SIZE];
} AttestPcrBank;

/* Every PCR at its reset value. */
void attest_pcr_bank_reset(AttestPcrBank *bank);

/* Replays a firmware event log into bank (reset before). Returns the number of measurements
 * replayed, or -EBADMSG with the reason in reterr (no prefix): "not a crypto-agile log: the first
 * event is not the Spec ID Event03", "truncated in event N", "event N: …" (N counts entries from 0
 * for the header, as tpm2_eventlog numbers them). -ENOMEM on OOM. */
int attest_firmware_log_replay(const uint8_t *log, size_t size, AttestPcrBank *bank, ApiError *reterr);

/* Replays a userspace log into bank (the firmware's replay before it). With quoted, the values of
 * the PCRs in mask are compared after each record: *ret_matched is the number of PCR records
 * after which they all equal the quote (the largest), -1 when no prefix does. bank holds the
 * replay of every record in any case. Returns the number of records that extend a PCR, or
 * -EBADMSG with reterr "record N <why>" (N counts every record from 1). -ENOMEM on OOM. */
int attest_userspace_log_replay(
        const uint8_t *log,
        size_t size,
        AttestPcrBank *bank,
        uint32_t mask,
        const AttestPcrBank *quoted,
        int *ret_matched,
        ApiError *reterr);

/* What get_vm_attestation shows of a stage's logs, once the check ran. */
typedef struct AttestEventLogSummary {
        bool replayed;             /* the logs explain every quoted PCR */
        unsigned firmware_events;  /* measurements of the firmware log */
        unsigned userspace_events; /* PCR records of the userspace log up to the quote (all on a mismatch) */
} AttestEventLogSummary;

/* The verifier's check: replays the logs (NULL, 0 for one the quote left out) against the values
 * of the PCRs in mask (32 bytes each, as the PCR digest check ensured). Fills *ret; when the logs
 * do not explain the quote, *ret_message is the verdict:
 *   "event log: firmware log: <why>", "event log: userspace log: record N <why>"
 *   "event log mismatch: pcr 4 replays to <hex> but the quote says <hex>; pcr 7 …", with
 *     "; the quote carries no firmware log" (or userspace log) when it left one out
 *   "no event log: the quote carries none, but pcrs 0,1,… are not at their reset values" (or
 *     "pcr 7 is not at its reset value")
 * and NULL when they do. Returns 0, or -ENOMEM. */
int attest_event_log_check(
        const uint8_t *firmware_log,
        size_t firmware_size,
        const uint8_t *userspace_log,
        size_t userspace_size,
        uint32_t mask,
        const AttestPcrValue values[static ATTEST_PCR_SLOTS],
        AttestEventLogSummary *ret,
        char **ret_message);

/* Where a measurement comes from. */
typedef enum AttestLogSource {
        ATTEST_LOG_FIRMWARE,
        ATTEST_LOG_USERSPACE,
} AttestLogSource;

/* One measurement of the logs, as the event-wise checks of attest-expect.h walk them. */
typedef struct AttestLogEvent {
        AttestLogSource source;
        unsigned number; /* firmware: the entry as tpm2_eventlog numbers it (0 is the header);
                          * userspace: the record, counting every record from 1 */
        unsigned pcr;
        uint32_t type; /* the firmware event's type; 0 for a userspace record */
        uint8_t digest[ATTEST_SHA256_SIZE];
} AttestLogEvent;

/* The measurements of the PCRs in mask, in the order a replay extends them: every one of the
 * firmware log, then those among the first userspace_records PCR records of the userspace log (the
 * prefix attest_event_log_check() found to explain the quote, AttestEventLogSummary's
 * userspace_events). For logs that check already accepted; a malformed log gives -EBADMSG without
 * a reason. *ret is a new array of *ret_n events (NULL for none); -ENOMEM on OOM. */
int attest_event_log_events(
        const uint8_t *firmware_log,
        size_t firmware_size,
        const uint8_t *userspace_log,
        size_t userspace_size,
        unsigned userspace_records,
        uint32_t mask,
        AttestLogEvent **ret,
        size_t *ret_n);
