/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The event logs of a quote replayed against its PCRs: a real OVMF log (tests/data/attest/
 * firmware.log, recorded by boot-log.sh) replays to the PCRs its guest read from the TPM,
 * systemd's userspace log finishes PCRs 11 and 13, records written after the quote are allowed,
 * and every malformed or lying log gets its own message. */
#include <openssl/evp.h>

#include "test-attest-fixtures.h"

#include "attest-eventlog.h"

/* A byte buffer that grows. */
typedef struct Buf {
        uint8_t *data;
        size_t size;
} Buf;

static void buf_add(Buf *b, const void *p, size_t n) {
        b->data = realloc(b->data, b->size + n + 1);
        assert_non_null(b->data);
        if (n > 0)
                memcpy(b->data + b->size, p, n);
        b->size += n;
}

static void buf_le32(Buf *b, uint32_t v) {
        uint8_t x[4] = { v & 0xff, v >> 8 & 0xff, v >> 16 & 0xff, v >> 24 };
        buf_add(b, x, sizeof(x));
}

static void buf_done(Buf *b) {
        free(b->data);
}

typedef struct Fixture {
        uint8_t *fw, *initrd_log, *ready_log;
        size_t fw_size, initrd_log_size, ready_log_size;
        size_t header_size; /* the TCG_PCR_EVENT with the Spec ID */
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));

        assert_non_null(f);
        f->fw = fixture_read("firmware.log", &f->fw_size);
        f->initrd_log = fixture_read("tpm2-measure-initrd.log", &f->initrd_log_size);
        f->ready_log = fixture_read("tpm2-measure-ready.log", &f->ready_log_size);
        assert_true(f->fw_size > 32);
        f->header_size = 32 +
                (size_t) (f->fw[28] | f->fw[29] << 8 | f->fw[30] << 16 | (uint32_t) f->fw[31] << 24);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        free(f->fw);
        free(f->initrd_log);
        free(f->ready_log);
        free(f);
        return 0;
}

/* A TCG_PCR_EVENT2 in the layout of the real log's header: one digest per algorithm it names,
 * sha256 set to digest (NULL: none), the others zero. */
static void event2(
        Buf *b, const Fixture *f, uint32_t pcr, uint32_t type, const uint8_t *digest, const void *data, size_t n) {
        const uint8_t *algs = f->fw + 32 + 28;
        uint32_t n_algs = f->fw[32 + 24];

        buf_le32(b, pcr);
        buf_le32(b, type);
        buf_le32(b, digest ? n_algs : 0);
        for (uint32_t i = 0; digest && i < n_algs; i++) {
                uint16_t alg = (uint16_t) (algs[4 * i] | algs[4 * i + 1] << 8);
                size_t size = (size_t) (algs[4 * i + 2] | algs[4 * i + 3] << 8);
                uint8_t zero[64] = {};

                buf_add(b, algs + 4 * i, 2);
                buf_add(b, alg == 0x000b ? digest : zero, size);
        }
        buf_le32(b, (uint32_t) n);
        buf_add(b, data, n);
}

static bool ends_with(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);
        return n >= k && streq(s + n - k, suffix);
}

static void sha256(const void *data, size_t n, uint8_t out[static 32]) {
        assert_true(EVP_Digest(data, n, out, NULL, EVP_sha256(), NULL) == 1);
}

static void extend(uint8_t pcr[static 32], const uint8_t digest[static 32]) {
        uint8_t buf[64];

        memcpy(buf, pcr, 32);
        memcpy(buf + 32, digest, 32);
        sha256(buf, sizeof(buf), pcr);
}

static void assert_pcr(const AttestPcrBank *bank, unsigned i, const char *want_hex) {
        char got[ATTEST_SHA256_HEX + 1];

        assert_non_null(want_hex);
        assert_string_equal(hex_format(bank->pcr[i], 32, got), want_hex);
}

/* The PCR value of file ({"sha256":{"N":…}}), as a new string. */
static char *pcr_of(const char *file, unsigned i) {
        _cleanup_free_ char *text = fixture_text(file);
        json_auto_t *v = json_loads(text, 0, NULL);
        char key[4];

        assert_non_null(v);
        (void) snprintf(key, sizeof(key), "%u", i);
        return strdup(json_string_value(json_object_get(json_object_get(v, "sha256"), key)) ?: "");
}

static void test_real_firmware_log(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestPcrBank bank;

        attest_pcr_bank_reset(&bank);
        /* 37 entries: the Spec ID header and 36 measurements */
        assert_int_equal(attest_firmware_log_replay(f->fw, f->fw_size, &bank, &err), 36);
        assert_null(err.message);
        /* what the guest's kernel read from its TPM; PCR 10 is IMA's, which logs elsewhere */
        for (unsigned i = 0; i < ATTEST_EVENT_LOG_PCRS; i++) {
                _cleanup_free_ char *want = pcr_of("firmware-pcrs.json", i);
                if (i != 10)
                        assert_pcr(&bank, i, want);
        }

        /* zeros after the last event are padding */
        Buf padded = {};
        AttestPcrBank again;
        buf_add(&padded, f->fw, f->fw_size);
        buf_add(&padded, (uint8_t[4096]){}, 4096);
        attest_pcr_bank_reset(&again);
        assert_int_equal(attest_firmware_log_replay(padded.data, padded.size, &again, NULL), 36);
        assert_memory_equal(&again, &bank, sizeof(bank));
        buf_done(&padded);

        /* nothing sent, nothing measured */
        attest_pcr_bank_reset(&again);
        assert_int_equal(attest_firmware_log_replay(NULL, 0, &again, NULL), 0);
}

static void test_startup_locality(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        uint8_t digest[32], want[32] = {}, locality[17] = "StartupLocality";
        Buf log = {};
        AttestPcrBank bank;
        char hex[65];

        locality[16] = 3;
        sha256("crtm", 4, digest);
        buf_add(&log, f->fw, f->header_size);
        event2(&log, f, 0, 0x3, (uint8_t[32]){}, locality, sizeof(locality)); /* EV_NO_ACTION */
        event2(&log, f, 0, 0x8, digest, "x", 1);                              /* EV_S_CRTM_VERSION */

        /* a TPM started from locality 3: PCR 0 begins at 00…03 */
        want[31] = 3;
        extend(want, digest);
        attest_pcr_bank_reset(&bank);
        assert_int_equal(attest_firmware_log_replay(log.data, log.size, &bank, &err), 1);
        assert_pcr(&bank, 0, hex_format(want, 32, hex));

        /* after a measurement of PCR 0 it would rewrite history */
        event2(&log, f, 0, 0x3, (uint8_t[32]){}, locality, sizeof(locality));
        attest_pcr_bank_reset(&bank);
        assert_errno(attest_firmware_log_replay(log.data, log.size, &bank, &err), -EBADMSG);
        assert_string_equal(err.message, "event 3: a StartupLocality event after a measurement of pcr 0");
        buf_done(&log);
}

static void firmware_fails(const uint8_t *log, size_t size, const char *message) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestPcrBank bank;

        attest_pcr_bank_reset(&bank);
        assert_errno(attest_firmware_log_replay(log, size, &bank, &err), -EBADMSG);
        assert_string_equal(err.message, message);
}

static void test_firmware_malformed(void **state) {
        Fixture *f = *state;
        uint8_t digest[32] = { 1 };
        Buf b = {};

        firmware_fails(f->fw, 31, "truncated in event 0");
        firmware_fails(f->fw, f->fw_size - 50, "truncated in event 36");

        /* a SHA-1 log (TPM 1.2 layout) starts with a measurement, not the Spec ID */
        buf_le32(&b, 0);
        buf_le32(&b, 0x8);
        buf_add(&b, (uint8_t[20]){}, 20);
        buf_le32(&b, 2);
        buf_add(&b, "\0\0", 2);
        firmware_fails(b.data, b.size, "not a crypto-agile log: the first event is not the Spec ID Event03");
        buf_done(&b);

        /* a Spec ID without sha256: only the sha1 entry of the real one */
        b = (Buf){};
        buf_add(&b, f->fw, 32 + 24);
        buf_le32(&b, 1);
        buf_add(&b, f->fw + 32 + 28, 4); /* sha1, 20 */
        buf_add(&b, "", 1);              /* vendorInfoSize */
        b.data[28] = (uint8_t) (b.size - 32);
        firmware_fails(b.data, b.size, "event 0: the log has no sha256 digests");
        buf_done(&b);

        b = (Buf){};
        buf_add(&b, f->fw, f->header_size);
        event2(&b, f, 24, 0xd, digest, NULL, 0);
        firmware_fails(b.data, b.size, "event 1: pcr 24 is not a pc client pcr");
        buf_done(&b);

        b = (Buf){};
        buf_add(&b, f->fw, f->header_size);
        event2(&b, f, 4, 0xd, /* digest= */ NULL, NULL, 0);
        firmware_fails(b.data, b.size, "event 1 has no sha256 digest");
        buf_done(&b);

        b = (Buf){};
        buf_add(&b, f->fw, f->header_size);
        buf_le32(&b, 4);
        buf_le32(&b, 0xd);
        buf_le32(&b, 1);
        buf_add(&b, "\x99\x00", 2);
        buf_add(&b, digest, 32);
        buf_le32(&b, 0);
        firmware_fails(b.data, b.size, "event 1: digest algorithm 0x0099 is not one of the log's");
        buf_done(&b);

        b = (Buf){};
        buf_add(&b, f->fw, f->header_size);
        buf_le32(&b, 4);
        buf_le32(&b, 0xd);
        buf_le32(&b, 9);
        firmware_fails(b.data, b.size, "event 1: 9 digests, but the log has 4 algorithms");
        buf_done(&b);
}

static void test_userspace_logs(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestPcrBank bank;

        /* the firmware's part of PCR 11 (the stub's sections), then systemd's */
        attest_pcr_bank_reset(&bank);
        assert_int_equal(attest_firmware_log_replay(f->fw, f->fw_size, &bank, NULL), 36);
        assert_int_equal(
                attest_userspace_log_replay(
                        f->initrd_log,
                        f->initrd_log_size,
                        &bank,
                        0,
                        /* quoted= */ NULL,
                        /* ret_matched= */ NULL,
                        &err),
                2);
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++) {
                _cleanup_free_ char *want = fixture_pcr("initrd", i);
                if (want)
                        assert_pcr(&bank, i, want);
        }

        /* the ready log has seven records, one of them for PCR 15 */
        attest_pcr_bank_reset(&bank);
        assert_int_equal(attest_firmware_log_replay(f->fw, f->fw_size, &bank, NULL), 36);
        assert_int_equal(
                attest_userspace_log_replay(
                        f->ready_log, f->ready_log_size, &bank, 0, NULL, /* ret_matched= */ NULL, &err),
                7);
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++) {
                _cleanup_free_ char *want = fixture_pcr("ready", i);
                if (want)
                        assert_pcr(&bank, i, want);
        }
}

static void userspace_fails(const char *log, const char *message) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestPcrBank bank;

        attest_pcr_bank_reset(&bank);
        assert_errno(
                attest_userspace_log_replay((const uint8_t *) log, strlen(log), &bank, 0, NULL, NULL, &err),
                -EBADMSG);
        assert_string_equal(err.message, message);
}

#define DIGEST                                               \
        "\"digests\":[{\"hashAlg\":\"sha256\",\"digest\":\"" \
        "00000000000000000000000000000000000000000000000000000000000000ff\"}]"

static void test_userspace_records(void **state) {
        AttestPcrBank bank, want;
        uint8_t d[32] = {};

        /* records of NV indexes, blank records and one still being written extend nothing */
        const char *log = "\x1e\n\x1e{\"pcr\":4," DIGEST
                          "}\n"
                          "\x1e{\"nv_index\":25165825," DIGEST
                          "}\n"
                          "\x1e{\"pcr\":4," DIGEST
                          ",\"content_type\":\"systemd\"}\n"
                          "\x1e{\"pcr\":4,\"digests\":[{\"hashAlg\":\"sha256\",\"dig";
        attest_pcr_bank_reset(&bank);
        attest_pcr_bank_reset(&want);
        d[31] = 0xff;
        extend(want.pcr[4], d);
        extend(want.pcr[4], d);
        assert_int_equal(
                attest_userspace_log_replay((const uint8_t *) log, strlen(log), &bank, 0, NULL, NULL, NULL),
                2);
        assert_memory_equal(&bank, &want, sizeof(bank));

        userspace_fails("{\"pcr\":4}\n", "record 1 does not start with a record separator");
        userspace_fails(
                "\x1e{\"pcr\":24," DIGEST "}\n", "record 1 has a \"pcr\" that is not a number from 0 to 23");
        userspace_fails(
                "\x1e{\"pcr\":\"4\"," DIGEST "}\n",
                "record 1 has a \"pcr\" that is not a number from 0 to 23");
        userspace_fails("\x1e{\"pcr\":4,\"digests\":{}}\n", "record 1 has \"digests\" that are not an array");
        userspace_fails(
                "\x1e{\"pcr\":4,\"digests\":[{\"hashAlg\":\"sha1\",\"digest\":\"00\"}]}\n",
                "record 1 has no sha256 digest");
        userspace_fails(
                "\x1e{\"pcr\":4,\"digests\":[{\"hashAlg\":\"sha256\",\"digest\":\"0g\"}]}\n",
                "record 1 has a sha256 digest that is not 64 hex digits");
        userspace_fails("\x1e[1]\n", "record 1 is not a JSON object");
        userspace_fails(
                "\x1e{\"pcr\":4,\"nv_index\":25165825," DIGEST "}\n",
                "record 1 has both \"pcr\" and \"nv_index\"");
        userspace_fails(
                "\x1e{\"pcr\":4," DIGEST "}\n\x1e{pcr}\n\x1e{}\n",
                "record 2 is not JSON: string or '}' expected near 'pcr'");
}

/* The quote's values of pcrs_stage's fixture, for attest_event_log_check(). */
typedef struct Quoted {
        uint8_t *bytes[ATTEST_PCR_SLOTS];
        AttestPcrValue values[ATTEST_PCR_SLOTS];
        uint32_t mask;
} Quoted;

static void quoted_load(Quoted *q, const char *stage) {
        *q = (Quoted){};
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++) {
                _cleanup_free_ char *hex = fixture_pcr(stage, i);
                size_t n = 0;

                if (!hex)
                        continue;
                assert_ok(attest_hex_decode(hex, strlen(hex), &q->bytes[i], &n, NULL));
                assert_int_equal(n, 32);
                q->values[i] = (AttestPcrValue){ .set = true, .data = q->bytes[i], .size = n };
                q->mask |= 1U << i;
        }
}

static void quoted_done(Quoted *q) {
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                free(q->bytes[i]);
}

static void
        check(const uint8_t *fw,
              size_t fw_size,
              const uint8_t *us,
              size_t us_size,
              const Quoted *q,
              AttestEventLogSummary *ret,
              char **ret_message) {
        assert_ok(attest_event_log_check(fw, fw_size, us, us_size, q->mask, q->values, ret, ret_message));
}

static void test_check_replays(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *message = NULL;
        AttestEventLogSummary s;
        Quoted q;

        quoted_load(&q, "initrd");
        check(f->fw, f->fw_size, f->initrd_log, f->initrd_log_size, &q, &s, &message);
        assert_null(message);
        assert_true(s.replayed);
        assert_int_equal(s.firmware_events, 36);
        assert_int_equal(s.userspace_events, 2);

        /* the agent reads the log after quoting: the ready log's later records are not the quote's */
        check(f->fw, f->fw_size, f->ready_log, f->ready_log_size, &q, &s, &message);
        assert_null(message);
        assert_true(s.replayed);
        assert_int_equal(s.userspace_events, 2);
        quoted_done(&q);

        quoted_load(&q, "ready");
        check(f->fw, f->fw_size, f->ready_log, f->ready_log_size, &q, &s, &message);
        assert_null(message);
        assert_true(s.replayed);
        assert_int_equal(s.userspace_events, 7);

        /* but a log that stops short of the quote does not explain it */
        check(f->fw, f->fw_size, f->initrd_log, f->initrd_log_size, &q, &s, &message);
        assert_non_null(message);
        assert_false(s.replayed);
        assert_int_equal(s.userspace_events, 2);
        assert_true(startswith(message, "event log mismatch: pcr 11 replays to "));
        assert_non_null(strstr(message, "; pcr 13 replays to "));
        quoted_done(&q);
}

static void test_check_mismatch(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *message = NULL, *want = NULL, *p4 = fixture_pcr("initrd", 4);
        uint8_t digest[32], pcr4[32];
        char got[65];
        AttestEventLogSummary s;
        Buf log = {};
        Quoted q;

        /* one measurement more in PCR 4 than the TPM has: a log that lies */
        quoted_load(&q, "initrd");
        sha256("tamper", 6, digest);
        buf_add(&log, f->fw, f->fw_size);
        event2(&log, f, 4, 0x80000003, digest, NULL, 0);
        check(log.data, log.size, f->initrd_log, f->initrd_log_size, &q, &s, &message);
        memcpy(pcr4, q.values[4].data, 32);
        extend(pcr4, digest);
        assert_true(
                asprintf(
                        &want,
                        "event log mismatch: pcr 4 replays to %s but the quote says %s",
                        hex_format(pcr4, 32, got),
                        p4) > 0);
        assert_string_equal(message, want);
        assert_false(s.replayed);
        assert_int_equal(s.firmware_events, 37);
        buf_done(&log);

        /* the userspace log left out: PCR 11 lacks enter-initrd */
        message = mfree(message);
        check(f->fw, f->fw_size, NULL, 0, &q, &s, &message);
        assert_true(startswith(message, "event log mismatch: pcr 11 replays to "));
        assert_true(ends_with(message, "; the quote carries no userspace log"));

        /* the firmware log left out: every firmware PCR is unexplained */
        message = mfree(message);
        check(NULL, 0, f->initrd_log, f->initrd_log_size, &q, &s, &message);
        assert_true(startswith(message, "event log mismatch: pcr 0 replays to "));
        assert_non_null(strstr(message, "; pcr 7 replays to "));
        assert_true(ends_with(message, "; the quote carries no firmware log"));

        /* no log at all */
        message = mfree(message);
        check(NULL, 0, NULL, 0, &q, &s, &message);
        assert_string_equal(
                message,
                "no event log: the quote carries none, but pcrs 0,1,2,3,4,5,6,7,11 are not at their reset values");
        assert_false(s.replayed);

        /* unparsable logs */
        message = mfree(message);
        check(f->fw, 100, f->initrd_log, f->initrd_log_size, &q, &s, &message);
        assert_string_equal(message, "event log: firmware log: truncated in event 1");
        message = mfree(message);
        check(f->fw, f->fw_size, (const uint8_t *) "\x1e{]\n", 4, &q, &s, &message);
        assert_true(startswith(message, "event log: userspace log: record 1 is not JSON: "));
        quoted_done(&q);
}

static void test_check_no_logs(void **state) {
        _cleanup_free_ char *message = NULL;
        uint8_t zero[32] = {}, one[32] = { 1 };
        AttestPcrValue values[ATTEST_PCR_SLOTS] = {};
        AttestEventLogSummary s;

        /* a TPM nothing measured into (a swtpm on a development host) needs no log */
        for (unsigned i = 0; i < 8; i++)
                values[i] = (AttestPcrValue){ .set = true, .data = zero, .size = 32 };
        assert_ok(attest_event_log_check(NULL, 0, NULL, 0, 0xff, values, &s, &message));
        assert_null(message);
        assert_true(s.replayed);
        assert_int_equal(s.firmware_events + s.userspace_events, 0);

        values[7].data = one;
        assert_ok(attest_event_log_check(NULL, 0, NULL, 0, 0xff, values, &s, &message));
        assert_string_equal(
                message, "no event log: the quote carries none, but pcr 7 is not at its reset value");
        assert_false(s.replayed);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_real_firmware_log, setup, teardown),
                cmocka_unit_test_setup_teardown(test_startup_locality, setup, teardown),
                cmocka_unit_test_setup_teardown(test_firmware_malformed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_userspace_logs, setup, teardown),
                cmocka_unit_test(test_userspace_records),
                cmocka_unit_test_setup_teardown(test_check_replays, setup, teardown),
                cmocka_unit_test_setup_teardown(test_check_mismatch, setup, teardown),
                cmocka_unit_test(test_check_no_logs),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
