/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attest-eventlog.h"
#include "attest-util.h"
#include "cleanup.h"

/* Expected measurements of one PCR, known before any boot (issue 36), and the event-wise check of
 * a quoted event log against them:
 *
 * - PCR 4 comes from the image: policy.json's "pcr4" lists, per way the image boots ("installed":
 *   firmware → systemd-boot → UKI → .linux; "installer": the UKI as QEMU's -kernel → .linux), the
 *   events OVMF and the stub extend: EV_EFI_ACTION "Calling EFI Application from Boot Option",
 *   EV_SEPARATOR, then one EV_EFI_BOOT_SERVICES_APPLICATION per PE image, with its Authenticode
 *   SHA-256 (images/scripts/policy.py computes them at build time).
 * - PCR 7 comes from the host: the daemon reads the OVMF variable store template it copies for every
 *   VM (attest_varstore_pcr7()). Without Secure Boot keys in it, OVMF measures SecureBoot (0), PK,
 *   KEK, db and dbx (empty) as EV_EFI_VARIABLE_DRIVER_CONFIG, then EV_SEPARATOR.
 *
 * The firmware log is matched exactly, with one deliberate allowance in PCR 4: OVMF measures
 * "Calling EFI Application from Boot Option" at every boot attempt and "Returning from EFI
 * Application from Boot Option" before each one after the first, so a boot option that loaded
 * nothing (a PXE attempt without a server, a disk without a loader) leaves a (Returning, Calling)
 * pair. Such pairs are accepted right after the separator, before the first application; an
 * application before the image's own (even one that returned) is not, since it ran with the
 * firmware's privileges before ours. systemd's userspace log may extend the same PCRs with its
 * "os-separator" word (attest-predict.h: it measures that into PCRs 0-7 and 12 in the initrd):
 * such records are accepted, any other is not. */

/* Event types of the TCG PC Client Platform Firmware Profile the firmware logs here. */
#define EV_POST_CODE UINT32_C(0x00000001)
#define EV_SEPARATOR UINT32_C(0x00000004)
#define EV_S_CRTM_CONTENTS UINT32_C(0x00000007)
#define EV_S_CRTM_VERSION UINT32_C(0x00000008)
#define EV_PLATFORM_CONFIG_FLAGS UINT32_C(0x0000000a)
#define EV_EFI_VARIABLE_DRIVER_CONFIG UINT32_C(0x80000001)
#define EV_EFI_VARIABLE_BOOT UINT32_C(0x80000002)
#define EV_EFI_BOOT_SERVICES_APPLICATION UINT32_C(0x80000003)
#define EV_EFI_BOOT_SERVICES_DRIVER UINT32_C(0x80000004)
#define EV_EFI_GPT_EVENT UINT32_C(0x80000006)
#define EV_EFI_ACTION UINT32_C(0x80000007)
#define EV_EFI_PLATFORM_FIRMWARE_BLOB UINT32_C(0x80000008)
#define EV_EFI_HANDOFF_TABLES UINT32_C(0x80000009)
#define EV_EFI_PLATFORM_FIRMWARE_BLOB2 UINT32_C(0x8000000a)
#define EV_EFI_HANDOFF_TABLES2 UINT32_C(0x8000000b)

/* Entries an expected event list may have: a boot runs a handful of PE images. */
#define ATTEST_EXPECTED_EVENTS_MAX 16U
/* Ways an image may boot in policy.json's "pcr4" (installed, installer). */
#define ATTEST_EXPECTED_BOOTS_MAX 4U

/* The TCG name of an event type ("EV_EFI_ACTION"), NULL for one not named here. */
const char *attest_event_type_to_string(uint32_t type);
/* The inverse, for the types above; 0 for another name (no event here has type 0). */
uint32_t attest_event_type_from_string(const char *s);

typedef struct AttestExpectedEvent {
        uint32_t type;
        uint8_t digest[ATTEST_SHA256_SIZE];
        char *what; /* for the verdict: "the UKI \EFI\Linux\x.efi"; NULL for none */
} AttestExpectedEvent;

typedef struct AttestExpectedPcr {
        char *name; /* the way of booting ("installed"), or what the events come from */
        AttestExpectedEvent events[ATTEST_EXPECTED_EVENTS_MAX];
        size_t n_events;
        uint8_t value[ATTEST_SHA256_SIZE]; /* the replay of events, from zero */
} AttestExpectedPcr;

void attest_expected_pcr_done(AttestExpectedPcr *e);

/* Appends an event (what is copied; NULL for none). -E2BIG beyond ATTEST_EXPECTED_EVENTS_MAX. */
int attest_expected_pcr_add(
        AttestExpectedPcr *e, uint32_t type, const uint8_t digest[static ATTEST_SHA256_SIZE], const char *what);
/* Computes e->value from the events. */
int attest_expected_pcr_seal(AttestExpectedPcr *e);

/* What attest_varstore_pcr7() found in a variable store template. */
typedef enum AttestVarstorePcr7 {
        ATTEST_VARSTORE_PREDICTED,   /* no Secure Boot keys: *ret holds the six events */
        ATTEST_VARSTORE_SECURE_BOOT, /* keys enrolled: PCR 7 depends on them, not predicted */
} AttestVarstorePcr7;

/* Reads an OVMF variable store (the _FVH firmware volume of OVMF_VARS*.fd, with its authenticated
 * or plain variable store) far enough to know whether any of PK, KEK, db, dbx, dbt or dbr is set.
 * Returns ATTEST_VARSTORE_PREDICTED with the expected PCR 7 in *ret (name "the variable store
 * template"), or ATTEST_VARSTORE_SECURE_BOOT and *ret_why naming the variables found ("PK, KEK, db,
 * dbx"). -EBADMSG when the bytes are no such store, with *ret_why saying why; -ENOMEM. The bytes
 * are a file the host's administrator chose, but are parsed as untrusted: every offset is checked. */
int attest_varstore_pcr7(const uint8_t *data, size_t size, AttestExpectedPcr *ret, char **ret_why);

/* Takes this host's firmware's form of the SecureBoot event into predicted (the PCR 7 of
 * attest_varstore_pcr7()) from run, the PCR 7 events of a firmware run (attest-fwlog.h) made with
 * the same template. The prediction measures SecureBoot off as one byte 0, as edk2 2022.11 (Debian
 * 12) does; edk2 2025.02 (Debian 13) finds no such variable and measures it with no data. Returns 1
 * when the two differ in that first event's digest only: predicted then holds the run's digest and
 * is sealed again. 0 when they agree, or when run has no events (a cached run from before runs
 * recorded PCR 7). -EBADMSG when they differ in any other way, with *ret_index the first event that
 * differs (the prediction unchanged). */
int attest_varstore_pcr7_adopt(AttestExpectedPcr *predicted, const AttestExpectedPcr *run, size_t *ret_index);

/* Checks the events of pcr (the events of the quoted logs from attest_event_log_events(), other
 * PCRs' ignored) against the ways of booting in expected (one for PCR 7). Returns 0 with
 * *ret_message NULL when one of them matches (*ret_matched is it), or with *ret_message the
 * verdict, naming the event that differs from the way of booting whose applications it follows
 * longest:
 *   "pcr 4 event 21 (EV_EFI_BOOT_SERVICES_APPLICATION): digest 1234… is not the UKI \EFI\…
 *     (expected 462d…)"
 *   "pcr 4 lacks the event for the UKI's .linux (expected EV_EFI_BOOT_SERVICES_APPLICATION cbe7…)
 *     after event 22"
 *   "pcr 4 event 25 (EV_EFI_BOOT_SERVICES_APPLICATION): digest … follows the last expected event"
 *   "pcr 7 userspace record 3: digest … is not systemd's os-separator"
 * -ENOMEM on OOM. */
int attest_expect_check(
        unsigned pcr,
        const AttestExpectedPcr *expected,
        size_t n_expected,
        const AttestLogEvent *events,
        size_t n_events,
        const AttestExpectedPcr **ret_matched,
        char **ret_message);
