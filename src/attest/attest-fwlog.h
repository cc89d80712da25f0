/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attest-expect.h"

/* What the host's firmware measures before any image runs (issue 36), learned from a firmware run:
 * the daemon boots OVMF with a fresh swtpm and a kernel whose only userspace is
 * vm-manager-fwlog-init (src/daemon/fwlog-init.c), which prints the firmware's TCG2 event log on the
 * serial console. PCR 0's firmware volume digests cannot be computed from the OVMF file (PEI
 * modules write their globals before Tcg2Pei measures them, and those depend on the VM's memory
 * size and CPU count), so one such run per firmware build and VM shape supplies them.
 *
 * The console protocol: lines "vmm-fwlog: begin", "vmm-fwlog: <hex>" (the log, in order),
 * "vmm-fwlog: end <bytes>", or "vmm-fwlog: error <text>". Other lines (the firmware's, the
 * kernel's) are skipped; a line may end in CR LF. */

#define ATTEST_FWLOG_PREFIX "vmm-fwlog: "
/* The biggest event log accepted: OVMF's is a few KiB, the kernel's copy is capped at 1 MiB too. */
#define ATTEST_FWLOG_MAX ((size_t) 1 << 20)

/* The PCRs a firmware run records (up to and including each one's EV_SEPARATOR): 0 (firmware
 * volumes), 1 (boot variables, which differ per VM: recorded, never compared), 2 and 3 (option
 * ROMs and their configuration), 5 (recorded, never compared), 6 (platform events) and 7 (the
 * Secure Boot variables as this firmware measures them: the manager takes the form of its
 * SecureBoot event from it, manager_firmware_pcr7()). */
#define ATTEST_FIRMWARE_RECORDED (1U << 0 | 1U << 1 | 1U << 2 | 1U << 3 | 1U << 5 | 1U << 6 | 1U << 7)
/* The ones the verifier checks event by event against the run. */
#define ATTEST_FIRMWARE_CHECKED (1U << 0 | 1U << 2 | 1U << 3 | 1U << 6)

/* Extracts the event log from a console capture. Returns 0 with a new buffer in *ret (*ret_size
 * bytes), or -EBADMSG with *ret_why saying why ("the console has no vmm-fwlog: begin line", "the
 * guest reported: <text>", "line 12 is not hex", "the log ends after 100 of 200 bytes", "the log is
 * bigger than 1 MiB"); -ENOMEM. The bytes come from a guest and are parsed as untrusted. */
int attest_fwlog_parse(const char *console, size_t size, uint8_t **ret, size_t *ret_size, char **ret_why);

typedef struct AttestFirmwareExpect {
        /* indexed by PCR; only those in ATTEST_FIRMWARE_RECORDED are filled */
        AttestExpectedPcr pcr[8];
} AttestFirmwareExpect;

void attest_firmware_expect_done(AttestFirmwareExpect *f);

/* The firmware's events of the recorded PCRs up to and including their separators, each expected
 * event described as "this host's firmware", from a TCG2 crypto-agile log. -EBADMSG with *ret_why
 * when the log does not parse ("firmware log: …"), lacks a separator in a checked PCR, or has more
 * than ATTEST_EXPECTED_EVENTS_MAX events in one; -ENOMEM. */
int attest_firmware_expect_from_log(const uint8_t *log, size_t size, AttestFirmwareExpect *ret, char **ret_why);

/* {"0":[{"type":2147483656,"digest":"<64 hex>"},…],"1":[…],…}: the recorded PCRs' events, for the
 * cache of firmware runs. New reference, NULL on OOM. */
json_t *attest_firmware_expect_to_json(const AttestFirmwareExpect *f);
/* The inverse; -EINVAL for another shape (a PCR outside the recorded ones, a checked PCR missing or
 * not ending in its separator, a digest that is not 64 hex); -ENOMEM. */
int attest_firmware_expect_from_json(json_t *v, AttestFirmwareExpect *ret);
