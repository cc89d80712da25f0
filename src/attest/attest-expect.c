/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attest-expect.h"
#include "attest-predict.h"
#include "hex-util.h"

/* Each type by the name the TCG gives it, which is its macro's. */
#define EVENT_TYPE(t) \
        { t, #t }
static const struct {
        uint32_t type;
        const char *name;
} event_types[] = {
        EVENT_TYPE(EV_POST_CODE),
        EVENT_TYPE(EV_SEPARATOR),
        EVENT_TYPE(EV_S_CRTM_CONTENTS),
        EVENT_TYPE(EV_S_CRTM_VERSION),
        EVENT_TYPE(EV_PLATFORM_CONFIG_FLAGS),
        EVENT_TYPE(EV_EFI_VARIABLE_DRIVER_CONFIG),
        EVENT_TYPE(EV_EFI_VARIABLE_BOOT),
        EVENT_TYPE(EV_EFI_BOOT_SERVICES_APPLICATION),
        EVENT_TYPE(EV_EFI_BOOT_SERVICES_DRIVER),
        EVENT_TYPE(EV_EFI_GPT_EVENT),
        EVENT_TYPE(EV_EFI_ACTION),
        EVENT_TYPE(EV_EFI_PLATFORM_FIRMWARE_BLOB),
        EVENT_TYPE(EV_EFI_HANDOFF_TABLES),
        EVENT_TYPE(EV_EFI_PLATFORM_FIRMWARE_BLOB2),
        EVENT_TYPE(EV_EFI_HANDOFF_TABLES2),
};

const char *attest_event_type_to_string(uint32_t type) {
        for (size_t i = 0; i < ELEMENTSOF(event_types); i++)
                if (event_types[i].type == type)
                        return event_types[i].name;
        return NULL;
}

uint32_t attest_event_type_from_string(const char *s) {
        for (size_t i = 0; s && i < ELEMENTSOF(event_types); i++)
                if (streq(event_types[i].name, s))
                        return event_types[i].type;
        return 0;
}

void attest_expected_pcr_done(AttestExpectedPcr *e) {
        if (!e)
                return;
        free(e->name);
        for (size_t i = 0; i < e->n_events; i++)
                free(e->events[i].what);
        *e = (AttestExpectedPcr){};
}

int attest_expected_pcr_add(
        AttestExpectedPcr *e, uint32_t type, const uint8_t digest[static ATTEST_SHA256_SIZE], const char *what) {
        char *w = NULL;

        assert_return(e, -EINVAL);

        if (e->n_events >= ATTEST_EXPECTED_EVENTS_MAX)
                return -E2BIG;
        if (what && !(w = strdup(what)))
                return -ENOMEM;
        e->events[e->n_events] = (AttestExpectedEvent){ .type = type, .what = w };
        memcpy(e->events[e->n_events].digest, digest, ATTEST_SHA256_SIZE);
        e->n_events++;
        return 0;
}

int attest_expected_pcr_seal(AttestExpectedPcr *e) {
        uint8_t digests[ATTEST_EXPECTED_EVENTS_MAX][ATTEST_SHA256_SIZE];

        assert_return(e, -EINVAL);

        for (size_t i = 0; i < e->n_events; i++)
                memcpy(digests[i], e->events[i].digest, ATTEST_SHA256_SIZE);
        return attest_pcr_replay(digests, e->n_events, e->value);
}

/* ---- the OVMF variable store ---- */

/* EFI_FIRMWARE_VOLUME_HEADER (PI spec, vol. 3): FvLength at 32, the "_FVH" signature at 40,
 * HeaderLength at 48. The variable store header follows the volume header: its GUID, Size (32-bit),
 * Format (0x5a, "formatted") and State (0xfe, "healthy"), 28 bytes with reserved fields. */
#define FV_LENGTH 32
#define FV_SIGNATURE 40
#define FV_HEADER_LENGTH 48
#define FV_MIN_HEADER 56
#define STORE_HEADER_SIZE 28
#define STORE_FORMATTED 0x5a
#define STORE_HEALTHY 0xfe
/* Variables start on 4-byte boundaries, each with StartId 0x55aa; the free space is 0xff. */
#define VARIABLE_START_ID 0x55aa
#define VARIABLE_ALIGN 4
/* AUTHENTICATED_VARIABLE_HEADER: StartId, State, Reserved, Attributes, MonotonicCount, TimeStamp,
 * PubKeyIndex, NameSize at 36, DataSize at 40, VendorGuid at 44; VARIABLE_HEADER (no
 * authentication): StartId, State, Reserved, Attributes, NameSize at 8, DataSize at 12,
 * VendorGuid at 16. */
#define AUTH_HEADER_SIZE 60
#define PLAIN_HEADER_SIZE 32
/* A variable in use is VAR_ADDED (0x3f), or VAR_ADDED with VAR_IN_DELETED_TRANSITION cleared
 * (0x3e) while a newer copy is being written; the other states are deleted or half written. */
#define VAR_ADDED 0x3f
#define VAR_ADDED_IN_TRANSITION 0x3e

/* gEfiAuthenticatedVariableGuid aaf32c78-947b-439a-a180-2e144ec37792 and gEfiVariableGuid
 * ddcf3616-3275-4164-98b6-fe85707ffe7d, in EFI_GUID byte order. */
static const uint8_t auth_store_guid[ATTEST_EFI_GUID_SIZE] = {
        0x78, 0x2c, 0xf3, 0xaa, 0x7b, 0x94, 0x9a, 0x43, 0xa1, 0x80, 0x2e, 0x14, 0x4e, 0xc3, 0x77, 0x92,
};
static const uint8_t plain_store_guid[ATTEST_EFI_GUID_SIZE] = {
        0x16, 0x36, 0xcf, 0xdd, 0x75, 0x32, 0x64, 0x41, 0x98, 0xb6, 0xfe, 0x85, 0x70, 0x7f, 0xfe, 0x7d,
};

/* The store's fields are little endian and not aligned. */
static uint16_t le16(const uint8_t *p) {
        uint16_t v;

        memcpy(&v, p, sizeof(v));
        return le16toh(v);
}

static uint32_t le32(const uint8_t *p) {
        uint32_t v;

        memcpy(&v, p, sizeof(v));
        return le32toh(v);
}

static uint64_t le64(const uint8_t *p) {
        uint64_t v;

        memcpy(&v, p, sizeof(v));
        return le64toh(v);
}

/* The Secure Boot key variables: with none of them set, OVMF runs in setup mode and measures the
 * five PCR 7 variables as absent (SecureBoot as 0). */
static const struct {
        bool global; /* EFI_GLOBAL_VARIABLE, else EFI_IMAGE_SECURITY_DATABASE_GUID */
        const char *name;
} key_variables[] = {
        { true, "PK" },   { true, "KEK" },  { false, "db" },
        { false, "dbx" }, { false, "dbt" }, { false, "dbr" },
};

/* Whether the UTF-16LE name of name_size bytes (with its NUL) is the ASCII name. */
static bool name_is(const uint8_t *name, size_t name_size, const char *ascii) {
        size_t n = strlen(ascii);

        if (name_size != 2 * (n + 1))
                return false;
        for (size_t i = 0; i <= n; i++)
                if (name[2 * i] != (uint8_t) ascii[i] || name[2 * i + 1] != 0)
                        return false;
        return true;
}

static int why(char **ret_why, const char *s) {
        if (ret_why && !(*ret_why = strdup(s)))
                return -ENOMEM;
        return -EBADMSG;
}

int attest_varstore_pcr7(const uint8_t *data, size_t size, AttestExpectedPcr *ret, char **ret_why) {
        _cleanup_(attest_expected_pcr_done) AttestExpectedPcr e = {};
        _cleanup_(attest_text_done) AttestText found = {};
        uint8_t events[ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS][ATTEST_SHA256_SIZE];
        static const char *const what[ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS] = {
                "SecureBoot (off)", "PK (absent)",  "KEK (absent)",
                "db (absent)",      "dbx (absent)", "the separator",
        };
        size_t header, end, off, hsize, name_at, guid_at;
        uint64_t fv_length;
        uint32_t store_size;
        bool authenticated;
        uint32_t set = 0;
        int r;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        if (ret_why)
                *ret_why = NULL;
        if (size < FV_MIN_HEADER || memcmp(data + FV_SIGNATURE, "_FVH", 4) != 0)
                return why(ret_why, "not a firmware volume (no _FVH signature)");
        fv_length = le64(data + FV_LENGTH);
        header = le16(data + FV_HEADER_LENGTH);
        if (fv_length > size || header < FV_MIN_HEADER || (uint64_t) header + STORE_HEADER_SIZE > fv_length)
                return why(ret_why, "the firmware volume's header does not fit the file");

        if (memcmp(data + header, auth_store_guid, ATTEST_EFI_GUID_SIZE) == 0)
                authenticated = true;
        else if (memcmp(data + header, plain_store_guid, ATTEST_EFI_GUID_SIZE) == 0)
                authenticated = false;
        else
                return why(ret_why, "the firmware volume holds no variable store");
        store_size = le32(data + header + 16);
        if (data[header + 20] != STORE_FORMATTED || data[header + 21] != STORE_HEALTHY)
                return why(ret_why, "the variable store is not formatted and healthy");
        if (store_size < STORE_HEADER_SIZE || (uint64_t) header + store_size > fv_length)
                return why(ret_why, "the variable store does not fit its firmware volume");

        hsize = authenticated ? AUTH_HEADER_SIZE : PLAIN_HEADER_SIZE;
        name_at = authenticated ? 36 : 8;
        guid_at = authenticated ? 44 : 16;
        end = header + store_size;
        off = header + STORE_HEADER_SIZE;
        /* Variables are written one after the other; the first header without the start id is
         * where the free space begins. Each step moves forward by at least a header. */
        while (off <= end && end - off >= hsize && le16(data + off) == VARIABLE_START_ID) {
                const uint8_t *h = data + off;
                uint32_t name_size = le32(h + name_at), data_size = le32(h + name_at + 4);
                uint64_t next = (uint64_t) off + hsize + name_size + data_size;
                uint8_t state = h[2];

                if (next > end)
                        return why(ret_why, "a variable reaches past the end of the store");
                if (state == VAR_ADDED || state == VAR_ADDED_IN_TRANSITION)
                        for (size_t k = 0; k < ELEMENTSOF(key_variables); k++) {
                                const uint8_t *guid = key_variables[k].global ?
                                        attest_efi_global_variable_guid :
                                        attest_efi_image_security_database_guid;

                                if (memcmp(h + guid_at, guid, ATTEST_EFI_GUID_SIZE) == 0 &&
                                    name_is(h + hsize, name_size, key_variables[k].name))
                                        set |= 1U << k;
                        }
                off = (size_t) ((next + VARIABLE_ALIGN - 1) & ~(uint64_t) (VARIABLE_ALIGN - 1));
        }

        if (set) {
                for (size_t k = 0; k < ELEMENTSOF(key_variables); k++)
                        if (set & (1U << k))
                                attest_text_add(&found, "%s%s", found.n ? ", " : "", key_variables[k].name);
                if (found.oom)
                        return -ENOMEM;
                if (ret_why)
                        *ret_why = TAKE_PTR(found.s);
                return ATTEST_VARSTORE_SECURE_BOOT;
        }

        r = attest_pcr7_secure_boot_off_events(events);
        if (r < 0)
                return r;
        e.name = strdup("the variable store template");
        if (!e.name)
                return -ENOMEM;
        for (size_t i = 0; i < ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS; i++) {
                r = attest_expected_pcr_add(
                        &e,
                        i + 1 < ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS ? EV_EFI_VARIABLE_DRIVER_CONFIG :
                                                                     EV_SEPARATOR,
                        events[i],
                        what[i]);
                if (r < 0)
                        return r;
        }
        r = attest_expected_pcr_seal(&e);
        if (r < 0)
                return r;
        *ret = e;
        e = (AttestExpectedPcr){};
        return ATTEST_VARSTORE_PREDICTED;
}

int attest_varstore_pcr7_adopt(AttestExpectedPcr *predicted, const AttestExpectedPcr *run, size_t *ret_index) {
        AttestExpectedEvent *first;
        uint8_t old[ATTEST_SHA256_SIZE];
        size_t n;
        int r;

        assert_return(predicted && predicted->n_events > 0, -EINVAL);
        assert_return(run, -EINVAL);

        if (run->n_events == 0)
                return 0;
        /* the SecureBoot event may differ in its digest; each other event is the prediction's */
        n = MIN(run->n_events, predicted->n_events);
        for (size_t i = 0; i < n; i++)
                if (run->events[i].type != predicted->events[i].type ||
                    (i > 0 &&
                     memcmp(run->events[i].digest, predicted->events[i].digest, ATTEST_SHA256_SIZE) != 0)) {
                        if (ret_index)
                                *ret_index = i;
                        return -EBADMSG;
                }
        if (run->n_events != predicted->n_events) {
                if (ret_index)
                        *ret_index = n;
                return -EBADMSG;
        }

        first = predicted->events;
        if (memcmp(first->digest, run->events[0].digest, ATTEST_SHA256_SIZE) == 0)
                return 0;
        memcpy(old, first->digest, ATTEST_SHA256_SIZE);
        memcpy(first->digest, run->events[0].digest, ATTEST_SHA256_SIZE);
        r = attest_expected_pcr_seal(predicted);
        if (r < 0) {
                memcpy(first->digest, old, ATTEST_SHA256_SIZE);
                return r;
        }
        return 1;
}

/* ---- the event-wise check ---- */

typedef struct Words {
        uint8_t calling[ATTEST_SHA256_SIZE];
        uint8_t returning[ATTEST_SHA256_SIZE];
        uint8_t os_separator[ATTEST_SHA256_SIZE];
} Words;

static bool event_is(const AttestLogEvent *l, uint32_t type, const uint8_t digest[static ATTEST_SHA256_SIZE]) {
        return l->type == type && memcmp(l->digest, digest, ATTEST_SHA256_SIZE) == 0;
}

/* How far the firmware events fw (of one PCR) follow the expectation x: *ret_j expected events
 * matched, *ret_i log events consumed when they stopped. */
static void
        walk(unsigned pcr,
             const AttestExpectedPcr *x,
             const AttestLogEvent *const *fw,
             size_t n,
             const Words *w,
             size_t *ret_i,
             size_t *ret_j) {
        size_t i = 0, j = 0;

        while (i < n && j < x->n_events) {
                const AttestExpectedEvent *want = x->events + j;
                bool first_app = want->type == EV_EFI_BOOT_SERVICES_APPLICATION &&
                        (j == 0 || x->events[j - 1].type != EV_EFI_BOOT_SERVICES_APPLICATION);

                if (event_is(fw[i], want->type, want->digest)) {
                        i++, j++;
                        continue;
                }
                /* A boot option before ours that loaded nothing (see the header). */
                if (pcr == 4 && first_app && i + 1 < n && event_is(fw[i], EV_EFI_ACTION, w->returning) &&
                    event_is(fw[i + 1], EV_EFI_ACTION, w->calling)) {
                        i += 2;
                        continue;
                }
                break;
        }
        *ret_i = i;
        *ret_j = j;
}

static const char *type_name(uint32_t type, char buf[static 16]) {
        const char *s = attest_event_type_to_string(type);

        if (s)
                return s;
        (void) snprintf(buf, 16, "type 0x%08x", type);
        return buf;
}

int attest_expect_check(
        unsigned pcr,
        const AttestExpectedPcr *expected,
        size_t n_expected,
        const AttestLogEvent *events,
        size_t n_events,
        const AttestExpectedPcr **ret_matched,
        char **ret_message) {
        _cleanup_free_ const AttestLogEvent **fw = NULL;
        _cleanup_(attest_text_done) AttestText msg = {};
        const AttestExpectedPcr *best = NULL;
        size_t n_fw = 0, best_i = 0, best_j = 0;
        char hex[ATTEST_SHA256_HEX + 1], hex2[ATTEST_SHA256_HEX + 1], b1[16], b2[16];
        Words w;
        int r;

        assert_return(expected && n_expected > 0, -EINVAL);
        assert_return(events || n_events == 0, -EINVAL);
        assert_return(ret_message, -EINVAL);

        *ret_message = NULL;
        r = attest_digest_efi_action(ATTEST_EFI_ACTION_BOOT_OPTION, w.calling);
        if (r >= 0)
                r = attest_digest_efi_action(ATTEST_EFI_ACTION_RETURNING, w.returning);
        if (r >= 0)
                r = attest_sha256("os-separator", strlen("os-separator"), w.os_separator);
        if (r < 0)
                return r;

        fw = calloc(MAX(n_events, (size_t) 1), sizeof(AttestLogEvent *));
        if (!fw)
                return -ENOMEM;
        for (size_t k = 0; k < n_events; k++) {
                const AttestLogEvent *l = events + k;

                if (l->pcr != pcr)
                        continue;
                if (l->source == ATTEST_LOG_FIRMWARE) {
                        fw[n_fw++] = l;
                        continue;
                }
                if (memcmp(l->digest, w.os_separator, ATTEST_SHA256_SIZE) != 0)
                        return asprintf(
                                       ret_message,
                                       "pcr %u userspace record %u: digest %s is not systemd's os-separator",
                                       pcr,
                                       l->number,
                                       hex_format(l->digest, ATTEST_SHA256_SIZE, hex)) < 0 ?
                                -ENOMEM :
                                0;
        }

        for (size_t k = 0; k < n_expected; k++) {
                size_t i, j;

                walk(pcr, expected + k, fw, n_fw, &w, &i, &j);
                if (i == n_fw && j == expected[k].n_events) {
                        if (ret_matched)
                                *ret_matched = expected + k;
                        return 0;
                }
                if (!best || j > best_j) {
                        best = expected + k;
                        best_i = i;
                        best_j = j;
                }
        }

        if (best_j < best->n_events && best_i < n_fw) {
                const AttestExpectedEvent *want = best->events + best_j;
                const AttestLogEvent *got = fw[best_i];

                attest_text_add(
                        &msg,
                        "pcr %u event %u (%s): digest %s is not %s (expected ",
                        pcr,
                        got->number,
                        type_name(got->type, b1),
                        hex_format(got->digest, ATTEST_SHA256_SIZE, hex),
                        want->what ?: type_name(want->type, b2));
                if (got->type != want->type)
                        attest_text_add(&msg, "%s ", type_name(want->type, b2));
                attest_text_add(&msg, "%s)", hex_format(want->digest, ATTEST_SHA256_SIZE, hex2));
        } else if (best_j < best->n_events) {
                const AttestExpectedEvent *want = best->events + best_j;

                attest_text_add(
                        &msg,
                        "pcr %u lacks the event for %s (expected %s %s)",
                        pcr,
                        want->what ?: type_name(want->type, b2),
                        type_name(want->type, b1),
                        hex_format(want->digest, ATTEST_SHA256_SIZE, hex));
                if (best_i > 0)
                        attest_text_add(&msg, " after event %u", fw[best_i - 1]->number);
        } else
                attest_text_add(
                        &msg,
                        "pcr %u event %u (%s): digest %s follows the last expected event",
                        pcr,
                        fw[best_i]->number,
                        type_name(fw[best_i]->type, b1),
                        hex_format(fw[best_i]->digest, ATTEST_SHA256_SIZE, hex));
        if (n_expected > 1 && best->name)
                attest_text_add(&msg, " of the %s boot", best->name);
        if (msg.oom)
                return -ENOMEM;
        *ret_message = TAKE_PTR(msg.s);
        return 0;
}
