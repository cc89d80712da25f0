/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <tss2/tss2_tpm2_types.h>

#include "attest-eventlog.h"
#include "cleanup.h"
#include "hex-util.h"

#define EV_NO_ACTION UINT32_C(0x00000003)
#define SPEC_ID_SIGNATURE "Spec ID Event03" /* with its NUL: 16 bytes */
#define STARTUP_LOCALITY_SIGNATURE "StartupLocality"
#define SIGNATURE_SIZE 16U
#define RECORD_SEPARATOR 0x1e

/* sha256(pcr ‖ digest) into pcr, with one fetched digest and context for a whole replay. */
typedef struct Extender {
        EVP_MD *md;
        EVP_MD_CTX *ctx;
} Extender;

static void extender_done(Extender *e) {
        EVP_MD_CTX_free(e->ctx);
        EVP_MD_free(e->md);
}

static int extender_init(Extender *e) {
        *e = (Extender){};
        e->md = EVP_MD_fetch(NULL, "SHA256", NULL);
        e->ctx = EVP_MD_CTX_new();
        if (!e->md || !e->ctx) {
                extender_done(e);
                *e = (Extender){};
                return -ENOMEM;
        }
        return 0;
}

static int extend(
        Extender *e, uint8_t pcr[static ATTEST_SHA256_SIZE], const uint8_t digest[static ATTEST_SHA256_SIZE]) {
        if (EVP_DigestInit_ex2(e->ctx, e->md, NULL) != 1 ||
            EVP_DigestUpdate(e->ctx, pcr, ATTEST_SHA256_SIZE) != 1 ||
            EVP_DigestUpdate(e->ctx, digest, ATTEST_SHA256_SIZE) != 1 ||
            EVP_DigestFinal_ex(e->ctx, pcr, NULL) != 1)
                return -ENOMEM;
        return 0;
}

void attest_pcr_bank_reset(AttestPcrBank *bank) {
        assert(bank);

        /* TPM 2.0 PC client: PCRs 17-22 (dynamic root of trust) reset to all ones */
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                memset(bank->pcr[i], i >= 17 && i <= 22 ? 0xff : 0, ATTEST_SHA256_SIZE);
}

static uint32_t le32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static uint16_t le16(const uint8_t *p) {
        return (uint16_t) (p[0] | p[1] << 8);
}

/* Where the run of zero bytes that ends the log begins (size when the last byte is not zero). */
static size_t trailing_zeros_start(const uint8_t *p, size_t size) {
        while (size > 0 && p[size - 1] == 0)
                size--;
        return size;
}

/* A bounded reader over the log. */
typedef struct Cursor {
        const uint8_t *p;
        size_t left;
} Cursor;

static const uint8_t *take(Cursor *c, size_t n) {
        const uint8_t *p = c->p;

        if (n > c->left)
                return NULL;
        c->p += n;
        c->left -= n;
        return p;
}

/* Where a replay copies the measurements of some PCRs to, for the event-wise checks; NULL fields
 * when nothing is collected. */
typedef struct Collector {
        uint32_t mask;
        unsigned limit; /* userspace PCR records to take at most */
        AttestLogEvent *events;
        size_t n, allocated;
} Collector;

static int collect(
        Collector *c, AttestLogSource source, unsigned number, unsigned pcr, uint32_t type, const uint8_t *digest) {
        if (!c || !(c->mask & (1U << pcr)))
                return 0;
        if (c->n == c->allocated) {
                size_t k = MAX(c->allocated * 2, (size_t) 16);
                AttestLogEvent *e = reallocarray(c->events, k, sizeof(AttestLogEvent));

                if (!e)
                        return -ENOMEM;
                c->events = e;
                c->allocated = k;
        }
        c->events[c->n] = (AttestLogEvent){ .source = source, .number = number, .pcr = pcr, .type = type };
        memcpy(c->events[c->n].digest, digest, ATTEST_SHA256_SIZE);
        c->n++;
        return 0;
}

typedef struct SpecId {
        struct {
                uint16_t alg;
                uint16_t size;
        } algs[ATTEST_EVENT_LOG_ALGS_MAX];
        size_t n_algs;
} SpecId;

/* The header: a TCG_PCR_EVENT (pcr, type, SHA-1 digest, size, data) whose data is the Spec ID. */
static int parse_header(Cursor *c, SpecId *id, ApiError *reterr) {
        const uint8_t *h, *data, *p;
        uint32_t size, n;
        bool sha256 = false;
        Cursor d;

        h = take(c, 4 + 4 + 20 + 4);
        if (!h)
                return attest_error_set(reterr, -EBADMSG, "truncated in event 0");
        size = le32(h + 28);
        data = take(c, size);
        if (!data)
                return attest_error_set(reterr, -EBADMSG, "truncated in event 0");
        if (le32(h + 4) != EV_NO_ACTION || size < SIGNATURE_SIZE ||
            memcmp(data, SPEC_ID_SIGNATURE, SIGNATURE_SIZE) != 0)
                return attest_error_set(
                        reterr, -EBADMSG, "not a crypto-agile log: the first event is not the Spec ID Event03");

        /* signature, platformClass, specVersionMinor/Major, specErrata, uintnSize, numberOfAlgorithms */
        d = (Cursor){ data, size };
        p = take(&d, SIGNATURE_SIZE + 4 + 4 + 4);
        if (!p)
                return attest_error_set(reterr, -EBADMSG, "event 0: the Spec ID event is truncated");
        n = le32(p + SIGNATURE_SIZE + 8);
        if (n == 0 || n > ATTEST_EVENT_LOG_ALGS_MAX)
                return attest_error_set(
                        reterr, -EBADMSG, "event 0: the Spec ID event lists %" PRIu32 " digest algorithms", n);
        for (uint32_t i = 0; i < n; i++) {
                p = take(&d, 4);
                if (!p)
                        return attest_error_set(reterr, -EBADMSG, "event 0: the Spec ID event is truncated");
                id->algs[i].alg = le16(p);
                id->algs[i].size = le16(p + 2);
                if (id->algs[i].size == 0 || id->algs[i].size > sizeof(TPMU_HA))
                        return attest_error_set(
                                reterr,
                                -EBADMSG,
                                "event 0: digest algorithm 0x%04x has a size of %u bytes",
                                id->algs[i].alg,
                                id->algs[i].size);
                if (id->algs[i].alg == TPM2_ALG_SHA256) {
                        if (id->algs[i].size != ATTEST_SHA256_SIZE)
                                return attest_error_set(
                                        reterr, -EBADMSG, "event 0: sha256 digests are not 32 bytes");
                        sha256 = true;
                }
        }
        id->n_algs = n;
        if (!sha256)
                return attest_error_set(reterr, -EBADMSG, "event 0: the log has no sha256 digests");
        return 0;
}

static int replay_firmware(
        Extender *e, const uint8_t *log, size_t size, AttestPcrBank *bank, Collector *col, ApiError *reterr) {
        Cursor c = { log, size };
        size_t padding;
        bool pcr0_extended = false;
        unsigned measured = 0;
        SpecId id = {};
        int r;

        if (size == 0)
                return 0; /* none was sent: nothing measured */
        r = parse_header(&c, &id, reterr);
        if (r < 0)
                return r;
        padding = trailing_zeros_start(log, size);

        for (unsigned k = 1; c.left > 0; k++) {
                const uint8_t *h, *sha256 = NULL, *data;
                uint32_t pcr, type, count, data_size;

                /* firmware that hands out a fixed-size area leaves zeros after the last event */
                if ((size_t) (c.p - log) >= padding)
                        break;

                h = take(&c, 4 + 4 + 4);
                if (!h)
                        return attest_error_set(reterr, -EBADMSG, "truncated in event %u", k);
                pcr = le32(h);
                type = le32(h + 4);
                count = le32(h + 8);
                if (count > id.n_algs)
                        return attest_error_set(
                                reterr,
                                -EBADMSG,
                                "event %u: %" PRIu32 " digests, but the log has %zu algorithms",
                                k,
                                count,
                                id.n_algs);
                for (uint32_t i = 0; i < count; i++) {
                        const uint8_t *a = take(&c, 2), *digest;
                        size_t s = 0;
                        uint16_t alg;

                        if (!a)
                                return attest_error_set(reterr, -EBADMSG, "truncated in event %u", k);
                        alg = le16(a);
                        for (size_t j = 0; j < id.n_algs; j++)
                                if (id.algs[j].alg == alg)
                                        s = id.algs[j].size;
                        if (s == 0)
                                return attest_error_set(
                                        reterr,
                                        -EBADMSG,
                                        "event %u: digest algorithm 0x%04x is not one of the log's",
                                        k,
                                        alg);
                        digest = take(&c, s);
                        if (!digest)
                                return attest_error_set(reterr, -EBADMSG, "truncated in event %u", k);
                        if (alg == TPM2_ALG_SHA256 && !sha256)
                                sha256 = digest;
                }
                h = take(&c, 4);
                if (!h)
                        return attest_error_set(reterr, -EBADMSG, "truncated in event %u", k);
                data_size = le32(h);
                data = take(&c, data_size);
                if (!data)
                        return attest_error_set(reterr, -EBADMSG, "truncated in event %u", k);

                if (pcr >= ATTEST_EVENT_LOG_PCRS)
                        return attest_error_set(
                                reterr, -EBADMSG, "event %u: pcr %" PRIu32 " is not a pc client pcr", k, pcr);

                if (type == EV_NO_ACTION) {
                        /* informational, extends nothing; but the locality the TPM was started
                         * from is PCR 0's reset value */
                        if (data_size >= SIGNATURE_SIZE + 1 &&
                            memcmp(data, STARTUP_LOCALITY_SIGNATURE, SIGNATURE_SIZE) == 0) {
                                if (pcr != 0)
                                        return attest_error_set(
                                                reterr,
                                                -EBADMSG,
                                                "event %u: a StartupLocality event for pcr %" PRIu32,
                                                k,
                                                pcr);
                                if (pcr0_extended)
                                        return attest_error_set(
                                                reterr,
                                                -EBADMSG,
                                                "event %u: a StartupLocality event after a measurement of pcr 0",
                                                k);
                                bank->pcr[0][ATTEST_SHA256_SIZE - 1] = data[SIGNATURE_SIZE];
                        }
                        continue;
                }
                if (!sha256)
                        return attest_error_set(reterr, -EBADMSG, "event %u has no sha256 digest", k);
                r = extend(e, bank->pcr[pcr], sha256);
                if (r < 0)
                        return r;
                r = collect(col, ATTEST_LOG_FIRMWARE, k, pcr, type, sha256);
                if (r < 0)
                        return r;
                if (pcr == 0)
                        pcr0_extended = true;
                measured++;
        }
        return (int) MIN(measured, (unsigned) INT32_MAX);
}

int attest_firmware_log_replay(const uint8_t *log, size_t size, AttestPcrBank *bank, ApiError *reterr) {
        _cleanup_(extender_done) Extender e = {};
        int r;

        assert_return(log || size == 0, -EINVAL);
        assert_return(bank, -EINVAL);

        r = extender_init(&e);
        if (r < 0)
                return r;
        return replay_firmware(&e, log, size, bank, /* col= */ NULL, reterr);
}

static bool blank(const uint8_t *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (!strchr(" \t\r\n", p[i]) || !p[i])
                        return false;
        return true;
}

static int record_error(char **ret_why, const char *why) {
        *ret_why = strdup(why);
        return *ret_why ? -EBADMSG : -ENOMEM;
}

/* One record's PCR and sha256 digest: 1, or 0 for a record that extends no PCR. On -EBADMSG,
 * *ret_why completes "record N …". */
static int parse_record(
        const uint8_t *text,
        size_t n,
        unsigned *ret_pcr,
        uint8_t ret_digest[static ATTEST_SHA256_SIZE],
        char **ret_why) {
        json_auto_t *v = NULL;
        json_error_t err;
        json_t *pcr, *digests, *d;
        size_t i;

        v = json_loadb((const char *) text, n, 0, &err);
        if (!v)
                return asprintf(ret_why, "is not JSON: %s", err.text) < 0 ? -ENOMEM : -EBADMSG;
        if (!json_is_object(v))
                return record_error(ret_why, "is not a JSON object");
        pcr = json_object_get(v, "pcr");
        if (!pcr)
                return 0; /* an NV index's ("nv_index") */
        if (json_object_get(v, "nv_index"))
                return record_error(ret_why, "has both \"pcr\" and \"nv_index\"");
        if (!json_is_integer(pcr) || json_integer_value(pcr) < 0 ||
            json_integer_value(pcr) >= (json_int_t) ATTEST_EVENT_LOG_PCRS)
                return record_error(ret_why, "has a \"pcr\" that is not a number from 0 to 23");
        digests = json_object_get(v, "digests");
        if (!json_is_array(digests))
                return record_error(ret_why, "has \"digests\" that are not an array");
        json_array_foreach(digests, i, d) {
                const char *alg = json_string_value(json_object_get(d, "hashAlg"));
                json_t *hex = json_object_get(d, "digest");
                _cleanup_free_ uint8_t *bytes = NULL;
                size_t size = 0;
                int r;

                if (!alg || !streq(alg, "sha256"))
                        continue;
                if (!json_is_string(hex))
                        return record_error(ret_why, "has a sha256 digest that is not 64 hex digits");
                r = attest_hex_decode(
                        json_string_value(hex), json_string_length(hex), &bytes, &size, /* reterr_go= */ NULL);
                if (r == -ENOMEM)
                        return r;
                if (r < 0 || size != ATTEST_SHA256_SIZE)
                        return record_error(ret_why, "has a sha256 digest that is not 64 hex digits");
                memcpy(ret_digest, bytes, ATTEST_SHA256_SIZE);
                *ret_pcr = (unsigned) json_integer_value(pcr);
                return 1;
        }
        return record_error(ret_why, "has no sha256 digest");
}

/* Matching state of the quoted PCRs while the userspace records are applied. */
typedef struct Match {
        uint32_t mask;
        const AttestPcrBank *quoted; /* NULL: nothing to match */
        unsigned unequal;            /* quoted PCRs whose replay differs now */
        int matched;                 /* PCR records after which none differed, the last time */
} Match;

static bool match_equal(const Match *m, const AttestPcrBank *bank, unsigned pcr) {
        return memcmp(bank->pcr[pcr], m->quoted->pcr[pcr], ATTEST_SHA256_SIZE) == 0;
}

static void match_start(Match *m, const AttestPcrBank *bank) {
        if (!m->quoted)
                return;
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                if ((m->mask & (1U << i)) && !match_equal(m, bank, i))
                        m->unequal++;
        if (m->unequal == 0)
                m->matched = 0;
}

/* After a record extended pcr, which did (was_equal) or did not equal the quote before. */
static void match_update(Match *m, const AttestPcrBank *bank, unsigned pcr, bool was_equal, unsigned applied) {
        if (!m->quoted)
                return;
        if (m->mask & (1U << pcr)) {
                bool equal = match_equal(m, bank, pcr);

                if (was_equal && !equal)
                        m->unequal++;
                else if (!was_equal && equal)
                        m->unequal--;
        }
        if (m->unequal == 0)
                m->matched = (int) MIN(applied, (unsigned) INT32_MAX);
}

static int replay_userspace(
        Extender *e,
        const uint8_t *log,
        size_t size,
        AttestPcrBank *bank,
        Match *m,
        Collector *col,
        ApiError *reterr) {
        const uint8_t *end = log + size, *p = log, *rs;
        unsigned applied = 0, number = 0;
        int r;

        match_start(m, bank);

        /* text before the first separator is not a record */
        rs = size > 0 ? memchr(p, RECORD_SEPARATOR, size) : NULL;
        if (!blank(p, (size_t) ((rs ?: end) - p)))
                return attest_error_set(reterr, -EBADMSG, "record 1 does not start with a record separator");

        while (rs) {
                _cleanup_free_ char *why = NULL;
                const uint8_t *start = rs + 1, *next;
                uint8_t digest[ATTEST_SHA256_SIZE];
                size_t n;
                unsigned pcr = 0;
                bool was_equal;

                next = memchr(start, RECORD_SEPARATOR, (size_t) (end - start));
                n = (size_t) ((next ?: end) - start);
                rs = next;
                if (blank(start, n))
                        continue;
                number++;
                r = parse_record(start, n, &pcr, digest, &why);
                if (r == -ENOMEM)
                        return r;
                if (r == -EBADMSG && !next && start[n - 1] != '\n')
                        break; /* the last record, still being written */
                if (r < 0)
                        return attest_error_set(reterr, r, "record %u %s", number, why);
                if (r == 0)
                        continue;
                if (col && applied >= col->limit)
                        break;

                was_equal = m->quoted && match_equal(m, bank, pcr);
                r = extend(e, bank->pcr[pcr], digest);
                if (r < 0)
                        return r;
                applied++;
                match_update(m, bank, pcr, was_equal, applied);
                r = collect(col, ATTEST_LOG_USERSPACE, number, pcr, /* type= */ 0, digest);
                if (r < 0)
                        return r;
        }
        return (int) MIN(applied, (unsigned) INT32_MAX);
}

int attest_userspace_log_replay(
        const uint8_t *log,
        size_t size,
        AttestPcrBank *bank,
        uint32_t mask,
        const AttestPcrBank *quoted,
        int *ret_matched,
        ApiError *reterr) {
        _cleanup_(extender_done) Extender e = {};
        Match m = { .mask = mask, .quoted = quoted, .matched = -1 };
        int r;

        assert_return(log || size == 0, -EINVAL);
        assert_return(bank, -EINVAL);

        r = extender_init(&e);
        if (r < 0)
                return r;
        r = replay_userspace(&e, log, size, bank, &m, /* col= */ NULL, reterr);
        if (r < 0)
                return r;
        if (ret_matched)
                *ret_matched = m.matched;
        return r;
}

int attest_event_log_check(
        const uint8_t *firmware_log,
        size_t firmware_size,
        const uint8_t *userspace_log,
        size_t userspace_size,
        uint32_t mask,
        const AttestPcrValue values[static ATTEST_PCR_SLOTS],
        AttestEventLogSummary *ret,
        char **ret_message) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        _cleanup_(extender_done) Extender e = {};
        AttestPcrBank bank, quoted;
        _cleanup_(attest_text_done) AttestText msg = {};
        Match m = { .mask = mask, .quoted = &quoted, .matched = -1 };
        int r;

        assert_return(firmware_log || firmware_size == 0, -EINVAL);
        assert_return(userspace_log || userspace_size == 0, -EINVAL);
        assert_return(ret && ret_message, -EINVAL);

        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                if (mask & (1U << i)) {
                        assert_return(values[i].set && values[i].size == ATTEST_SHA256_SIZE, -EINVAL);
                        memcpy(quoted.pcr[i], values[i].data, ATTEST_SHA256_SIZE);
                }

        *ret = (AttestEventLogSummary){};
        *ret_message = NULL;
        r = extender_init(&e);
        if (r < 0)
                return r;
        attest_pcr_bank_reset(&bank);

        r = replay_firmware(&e, firmware_log, firmware_size, &bank, /* col= */ NULL, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return asprintf(ret_message, "event log: firmware log: %s", err.message ?: "malformed") < 0 ?
                        -ENOMEM :
                        0;
        ret->firmware_events = (unsigned) r;

        r = replay_userspace(&e, userspace_log, userspace_size, &bank, &m, /* col= */ NULL, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return asprintf(ret_message, "event log: userspace log: %s", err.message ?: "malformed") < 0 ?
                        -ENOMEM :
                        0;
        if (m.matched >= 0) {
                ret->replayed = true;
                ret->userspace_events = (unsigned) m.matched;
                return 0;
        }
        ret->userspace_events = (unsigned) r;

        if (firmware_size == 0 && userspace_size == 0) {
                char list[3 * ATTEST_PCR_SLOTS] = "";
                size_t len = 0;
                unsigned n = 0;

                for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                        if ((mask & (1U << i)) && memcmp(bank.pcr[i], quoted.pcr[i], ATTEST_SHA256_SIZE) != 0)
                                len += (size_t) snprintf(
                                        list + len, sizeof(list) - len, "%s%u", n++ ? "," : "", i);
                attest_text_add(
                        &msg, "no event log: the quote carries none, but %s %s", n > 1 ? "pcrs" : "pcr", list);
                attest_text_add(&msg, n > 1 ? " are not at their reset values" : " is not at its reset value");
        } else {
                attest_text_add(&msg, "event log mismatch: ");
                for (unsigned i = 0, n = 0; i < ATTEST_PCR_SLOTS; i++) {
                        char got[ATTEST_SHA256_HEX + 1], want[ATTEST_SHA256_HEX + 1];

                        if (!(mask & (1U << i)) || memcmp(bank.pcr[i], quoted.pcr[i], ATTEST_SHA256_SIZE) == 0)
                                continue;
                        attest_text_add(
                                &msg,
                                "%spcr %u replays to %s but the quote says %s",
                                n++ ? "; " : "",
                                i,
                                hex_format(bank.pcr[i], ATTEST_SHA256_SIZE, got),
                                hex_format(quoted.pcr[i], ATTEST_SHA256_SIZE, want));
                }
                if (firmware_size == 0)
                        attest_text_add(&msg, "; the quote carries no firmware log");
                if (userspace_size == 0)
                        attest_text_add(&msg, "; the quote carries no userspace log");
        }
        if (msg.oom)
                return -ENOMEM;
        *ret_message = TAKE_PTR(msg.s);
        return 0;
}

int attest_event_log_events(
        const uint8_t *firmware_log,
        size_t firmware_size,
        const uint8_t *userspace_log,
        size_t userspace_size,
        unsigned userspace_records,
        uint32_t mask,
        AttestLogEvent **ret,
        size_t *ret_n) {
        _cleanup_(extender_done) Extender e = {};
        Collector col = { .mask = mask, .limit = userspace_records };
        Match m = { .matched = -1 };
        AttestPcrBank bank;
        int r;

        assert_return(firmware_log || firmware_size == 0, -EINVAL);
        assert_return(userspace_log || userspace_size == 0, -EINVAL);
        assert_return(ret && ret_n, -EINVAL);

        r = extender_init(&e);
        if (r < 0)
                return r;
        attest_pcr_bank_reset(&bank);
        r = replay_firmware(&e, firmware_log, firmware_size, &bank, &col, /* reterr= */ NULL);
        if (r >= 0 && userspace_records > 0)
                r = replay_userspace(&e, userspace_log, userspace_size, &bank, &m, &col, /* reterr= */ NULL);
        if (r < 0) {
                free(col.events);
                return r;
        }
        *ret = col.events;
        *ret_n = col.n;
        return 0;
}
