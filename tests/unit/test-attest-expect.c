/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Expected PCR 4 and PCR 7 events (attest-expect.h): PCR 7 derived from OVMF variable store
 * templates (Debian's own where installed, and stores built here), and the event-wise check with
 * the verdicts it names. */
#include "test-attest-fixtures.h"

#include "attest-expect.h"
#include "attest-predict.h"
#include "fs-util.h"

/* PCR 7 of the recorded OVMF boot (tests/data/attest/firmware-pcrs.json). */
#define FIXTURE_PCR7 "65caf8dd1e0ea7a6347b635d2b379c93b9a1351edc2afc3ecda700e534eb3068"

/* A firmware volume of size bytes holding an authenticated variable store with the variables
 * given as (global, name, state) triples, each with one byte of data. */
typedef struct Var {
        bool global;
        const char *name;
        uint8_t state;
} Var;

static uint8_t *make_store(const Var *vars, size_t n, size_t size) {
        static const uint8_t auth[16] = { 0x78, 0x2c, 0xf3, 0xaa, 0x7b, 0x94, 0x9a, 0x43,
                                          0xa1, 0x80, 0x2e, 0x14, 0x4e, 0xc3, 0x77, 0x92 };
        uint8_t *d = malloc(size);
        size_t off;

        assert_non_null(d);
        memset(d, 0xff, size);
        memset(d, 0, 72);
        for (unsigned i = 0; i < 8; i++)
                d[32 + i] = (uint8_t) ((uint64_t) size >> (8 * i));
        memcpy(d + 40, "_FVH", 4);
        d[48] = 72; /* HeaderLength */
        memcpy(d + 72, auth, 16);
        for (unsigned i = 0; i < 4; i++)
                d[88 + i] = (uint8_t) ((size - 72) >> (8 * i));
        d[92] = 0x5a;
        d[93] = 0xfe;
        memset(d + 94, 0, 6);
        off = 72 + 28;
        for (size_t k = 0; k < n; k++) {
                size_t len = strlen(vars[k].name), name_size = 2 * (len + 1);

                memset(d + off, 0, 60);
                d[off] = 0xaa;
                d[off + 1] = 0x55;
                d[off + 2] = vars[k].state;
                d[off + 36] = (uint8_t) name_size;
                d[off + 40] = 1;
                memcpy(d + off + 44,
                       vars[k].global ? attest_efi_global_variable_guid :
                                        attest_efi_image_security_database_guid,
                       16);
                for (size_t i = 0; i <= len; i++) {
                        d[off + 60 + 2 * i] = (uint8_t) vars[k].name[i];
                        d[off + 61 + 2 * i] = 0;
                }
                d[off + 60 + name_size] = 1;
                off = (off + 60 + name_size + 1 + 3) & ~(size_t) 3;
        }
        return d;
}

static void test_debian_template(void **state) {
        static const char *const paths[] = { "/usr/share/OVMF/OVMF_VARS_4M.fd",
                                             "/usr/share/OVMF/OVMF_VARS_4M.ms.fd" };
        _cleanup_(attest_expected_pcr_done) AttestExpectedPcr e = {};
        _cleanup_free_ char *data = NULL, *why = NULL, *ms = NULL;
        char hex[ATTEST_SHA256_HEX + 1];
        size_t size = 0;

        if (read_full_file(paths[0], 16 << 20, &data, &size) < 0)
                skip(); /* the ovmf package is not installed */

        /* Debian's default template: no keys, so the five variables as absent and the separator,
         * exactly what the recorded boot measured */
        assert_int_equal(
                attest_varstore_pcr7((const uint8_t *) data, size, &e, &why), ATTEST_VARSTORE_PREDICTED);
        assert_null(why);
        assert_int_equal(e.n_events, 6);
        assert_int_equal(e.events[0].type, EV_EFI_VARIABLE_DRIVER_CONFIG);
        assert_int_equal(e.events[5].type, EV_SEPARATOR);
        assert_string_equal(hex_format(e.value, sizeof(e.value), hex), FIXTURE_PCR7);

        /* the Microsoft-keys template enrolls PK, KEK, db and dbx: not predicted, and said so */
        if (read_full_file(paths[1], 16 << 20, &ms, &size) < 0)
                return;
        attest_expected_pcr_done(&e);
        assert_int_equal(
                attest_varstore_pcr7((const uint8_t *) ms, size, &e, &why), ATTEST_VARSTORE_SECURE_BOOT);
        assert_string_equal(why, "PK, KEK, db, dbx");
        assert_int_equal(e.n_events, 0);
}

static void test_built_stores(void **state) {
        static const Var keys[] = {
                { true, "BootOrder", 0x3f },
                { true, "PK", 0x3c }, /* deleted: does not count */
                { false, "db", 0x3f },
                { true, "KEK", 0x3e },
        };
        static const Var none[] = { { true, "BootOrder", 0x3f }, { false, "PK", 0x3f } /* wrong GUID */ };
        _cleanup_(attest_expected_pcr_done) AttestExpectedPcr e = {};
        _cleanup_free_ uint8_t *a = make_store(keys, ELEMENTSOF(keys), 4096),
                               *b = make_store(none, ELEMENTSOF(none), 4096);
        _cleanup_free_ char *why = NULL;
        char hex[ATTEST_SHA256_HEX + 1];

        assert_int_equal(attest_varstore_pcr7(a, 4096, &e, &why), ATTEST_VARSTORE_SECURE_BOOT);
        assert_string_equal(why, "KEK, db");
        why = mfree(why);

        assert_int_equal(attest_varstore_pcr7(b, 4096, &e, &why), ATTEST_VARSTORE_PREDICTED);
        assert_string_equal(hex_format(e.value, sizeof(e.value), hex), FIXTURE_PCR7);

        /* broken stores are refused with a reason, never read past their end */
        assert_errno(attest_varstore_pcr7(b, 40, &e, &why), -EBADMSG);
        assert_string_equal(why, "not a firmware volume (no _FVH signature)");
        why = mfree(why);
        assert_errno(attest_varstore_pcr7(b, 2048, &e, &why), -EBADMSG); /* FvLength says 4096 */
        assert_string_equal(why, "the firmware volume's header does not fit the file");
        why = mfree(why);
        b[72] ^= 1;
        assert_errno(attest_varstore_pcr7(b, 4096, &e, &why), -EBADMSG);
        assert_string_equal(why, "the firmware volume holds no variable store");
        why = mfree(why);
        b[72] ^= 1;
        b[72 + 28 + 40] = 0xff; /* the first variable's DataSize reaches past the store */
        b[72 + 28 + 43] = 0x7f;
        assert_errno(attest_varstore_pcr7(b, 4096, &e, &why), -EBADMSG);
        assert_string_equal(why, "a variable reaches past the end of the store");
}

/* A firmware run's PCR 7 as edk2 2025.02 (Debian 13) measures a template without keys: SecureBoot
 * with no data, the other events as predicted. */
static void run_pcr7(AttestExpectedPcr *run, const AttestExpectedPcr *predicted) {
        uint8_t d[ATTEST_SHA256_SIZE];

        assert_ok(attest_digest_efi_variable(attest_efi_global_variable_guid, "SecureBoot", NULL, 0, d));
        assert_ok(attest_expected_pcr_add(run, EV_EFI_VARIABLE_DRIVER_CONFIG, d, "this host's firmware"));
        for (size_t i = 1; i < predicted->n_events; i++)
                assert_ok(attest_expected_pcr_add(
                        run, predicted->events[i].type, predicted->events[i].digest, "this host's firmware"));
        assert_ok(attest_expected_pcr_seal(run));
}

static void test_pcr7_adopt(void **state) {
        static const Var none[] = { { true, "BootOrder", 0x3f } };
        _cleanup_(attest_expected_pcr_done) AttestExpectedPcr e = {}, run = {}, other = {}, empty = {};
        _cleanup_free_ uint8_t *store = make_store(none, ELEMENTSOF(none), 4096);
        uint8_t before[ATTEST_SHA256_SIZE];
        AttestLogEvent log[ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS];
        char hex[ATTEST_SHA256_HEX + 1], *m = NULL;
        size_t index = 99;

        assert_int_equal(attest_varstore_pcr7(store, 4096, &e, /* ret_why= */ NULL), ATTEST_VARSTORE_PREDICTED);
        run_pcr7(&run, &e);

        /* a run the same as the prediction (Debian 12), or a cached one without PCR 7: nothing */
        assert_int_equal(attest_varstore_pcr7_adopt(&e, &e, &index), 0);
        assert_int_equal(attest_varstore_pcr7_adopt(&e, &empty, &index), 0);
        assert_string_equal(hex_format(e.value, sizeof(e.value), hex), FIXTURE_PCR7);
        assert_int_equal(index, 99);

        /* another event differs as well: -EBADMSG naming it, the prediction unchanged */
        assert_ok(attest_expected_pcr_add(&other, run.events[0].type, run.events[0].digest, NULL));
        assert_ok(attest_expected_pcr_add(&other, run.events[1].type, run.events[2].digest, NULL));
        assert_errno(attest_varstore_pcr7_adopt(&e, &other, &index), -EBADMSG);
        assert_int_equal(index, 1);
        /* or the run has fewer events (or more) */
        attest_expected_pcr_done(&other);
        for (size_t i = 0; i + 1 < run.n_events; i++)
                assert_ok(attest_expected_pcr_add(&other, run.events[i].type, run.events[i].digest, NULL));
        assert_errno(attest_varstore_pcr7_adopt(&e, &other, &index), -EBADMSG);
        assert_int_equal(index, run.n_events - 1);
        /* or its first event is of another type */
        other.events[0].type = EV_EFI_VARIABLE_BOOT;
        other.n_events = 1;
        assert_errno(attest_varstore_pcr7_adopt(&e, &other, &index), -EBADMSG);
        assert_int_equal(index, 0);
        assert_string_equal(hex_format(e.value, sizeof(e.value), hex), FIXTURE_PCR7);

        /* SecureBoot in the run's form only: taken, sealed again, and the check then accepts the
         * run's events where it refused them before */
        for (size_t i = 0; i < run.n_events; i++) {
                log[i] = (AttestLogEvent){ .source = ATTEST_LOG_FIRMWARE,
                                           .number = (unsigned) i,
                                           .pcr = 7,
                                           .type = run.events[i].type };
                memcpy(log[i].digest, run.events[i].digest, ATTEST_SHA256_SIZE);
        }
        assert_ok(attest_expect_check(7, &e, 1, log, run.n_events, /* ret_matched= */ NULL, &m));
        assert_non_null(m);
        assert_non_null(strstr(m, "pcr 7 event 0 (EV_EFI_VARIABLE_DRIVER_CONFIG)"));
        m = mfree(m);
        memcpy(before, e.value, sizeof(before));
        assert_int_equal(attest_varstore_pcr7_adopt(&e, &run, &index), 1);
        assert_memory_not_equal(before, e.value, sizeof(before));
        assert_memory_equal(e.value, run.value, sizeof(e.value));
        assert_string_equal(e.events[0].what, "SecureBoot (off)");
        assert_ok(attest_expect_check(7, &e, 1, log, run.n_events, /* ret_matched= */ NULL, &m));
        assert_null(m);
        /* once taken, the next run (another VM shape's) agrees */
        assert_int_equal(attest_varstore_pcr7_adopt(&e, &run, &index), 0);
}

/* The PCR 4 expectation of a boot of n applications named by their digests' first byte. */
static void boot(AttestExpectedPcr *x, const char *name, const uint8_t *apps, size_t n) {
        uint8_t d[ATTEST_SHA256_SIZE];

        x->name = strdup(name);
        assert_ok(attest_digest_efi_action(ATTEST_EFI_ACTION_BOOT_OPTION, d));
        assert_ok(attest_expected_pcr_add(x, EV_EFI_ACTION, d, "the boot option's call"));
        assert_ok(attest_digest_separator(d));
        assert_ok(attest_expected_pcr_add(x, EV_SEPARATOR, d, "the separator"));
        for (size_t i = 0; i < n; i++) {
                char what[32];

                memset(d, apps[i], sizeof(d));
                snprintf(what, sizeof(what), "app %02x", apps[i]);
                assert_ok(attest_expected_pcr_add(x, EV_EFI_BOOT_SERVICES_APPLICATION, d, what));
        }
        assert_ok(attest_expected_pcr_seal(x));
}

typedef struct Log {
        AttestLogEvent e[16];
        size_t n;
} Log;

static void log_add(Log *l, AttestLogSource source, unsigned pcr, uint32_t type, const uint8_t *digest) {
        l->e[l->n] = (AttestLogEvent){
                .source = source, .number = 10 + (unsigned) l->n, .pcr = pcr, .type = type
        };
        memcpy(l->e[l->n].digest, digest, ATTEST_SHA256_SIZE);
        l->n++;
}

static void log_action(Log *l, const char *action) {
        uint8_t d[ATTEST_SHA256_SIZE];

        assert_ok(attest_digest_efi_action(action, d));
        log_add(l, ATTEST_LOG_FIRMWARE, 4, EV_EFI_ACTION, d);
}

static void log_app(Log *l, uint8_t byte) {
        uint8_t d[ATTEST_SHA256_SIZE];

        memset(d, byte, sizeof(d));
        log_add(l, ATTEST_LOG_FIRMWARE, 4, EV_EFI_BOOT_SERVICES_APPLICATION, d);
}

static void log_start(Log *l) {
        uint8_t d[ATTEST_SHA256_SIZE];

        l->n = 0;
        memset(d, 0x77, sizeof(d));
        log_add(l, ATTEST_LOG_FIRMWARE, 7, EV_SEPARATOR, d); /* another PCR's: ignored */
        log_action(l, ATTEST_EFI_ACTION_BOOT_OPTION);
        assert_ok(attest_digest_separator(d));
        log_add(l, ATTEST_LOG_FIRMWARE, 4, EV_SEPARATOR, d);
}

static char *check(const AttestExpectedPcr *x, size_t n, const Log *l, const AttestExpectedPcr **ret) {
        char *m = NULL;

        assert_ok(attest_expect_check(4, x, n, l->e, l->n, ret, &m));
        return m;
}

static void test_pcr4_events(void **state) {
        static const uint8_t installed[] = { 0xb0, 0xa1, 0x11 }, installer[] = { 0xa1, 0x11 };
        AttestExpectedPcr x[2] = {};
        const AttestExpectedPcr *matched = NULL;
        uint8_t d[ATTEST_SHA256_SIZE];
        char *m;
        Log l;

        boot(&x[0], "installed", installed, 3);
        boot(&x[1], "installer", installer, 2);

        /* either way of booting matches */
        log_start(&l);
        log_app(&l, 0xb0), log_app(&l, 0xa1), log_app(&l, 0x11);
        assert_null(check(x, 2, &l, &matched));
        assert_ptr_equal(matched, &x[0]);
        log_start(&l);
        log_app(&l, 0xa1), log_app(&l, 0x11);
        assert_null(check(x, 2, &l, &matched));
        assert_ptr_equal(matched, &x[1]);

        /* another UKI: named against the boot it follows furthest */
        log_start(&l);
        log_app(&l, 0xb0), log_app(&l, 0xee), log_app(&l, 0x11);
        m = check(x, 2, &l, NULL);
        assert_string_equal(
                m,
                "pcr 4 event 14 (EV_EFI_BOOT_SERVICES_APPLICATION): digest "
                "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee is not app a1 (expected "
                "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1) of the installed boot");
        free(m);

        /* a boot option that loaded nothing before ours: accepted */
        log_start(&l);
        log_action(&l, ATTEST_EFI_ACTION_RETURNING);
        log_action(&l, ATTEST_EFI_ACTION_BOOT_OPTION);
        log_app(&l, 0xb0), log_app(&l, 0xa1), log_app(&l, 0x11);
        assert_null(check(x, 1, &l, NULL));

        /* one that ran an application (which returned) before ours: refused, naming it */
        log_start(&l);
        log_app(&l, 0x66);
        log_action(&l, ATTEST_EFI_ACTION_RETURNING);
        log_action(&l, ATTEST_EFI_ACTION_BOOT_OPTION);
        log_app(&l, 0xb0), log_app(&l, 0xa1), log_app(&l, 0x11);
        m = check(x, 1, &l, NULL);
        assert_string_equal(
                m,
                "pcr 4 event 13 (EV_EFI_BOOT_SERVICES_APPLICATION): digest "
                "6666666666666666666666666666666666666666666666666666666666666666 is not app b0 (expected "
                "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0)");
        free(m);

        /* the kernel missing, or one more application after it */
        log_start(&l);
        log_app(&l, 0xb0), log_app(&l, 0xa1);
        m = check(x, 1, &l, NULL);
        assert_string_equal(
                m,
                "pcr 4 lacks the event for app 11 (expected EV_EFI_BOOT_SERVICES_APPLICATION "
                "1111111111111111111111111111111111111111111111111111111111111111) after event 14");
        free(m);
        log_app(&l, 0x11), log_app(&l, 0x22);
        m = check(x, 1, &l, NULL);
        assert_string_equal(
                m,
                "pcr 4 event 16 (EV_EFI_BOOT_SERVICES_APPLICATION): digest "
                "2222222222222222222222222222222222222222222222222222222222222222 follows the last expected "
                "event");
        free(m);

        /* systemd's os-separator in the userspace log is expected; another record is not */
        log_start(&l);
        log_app(&l, 0xb0), log_app(&l, 0xa1), log_app(&l, 0x11);
        assert_ok(attest_sha256("os-separator", strlen("os-separator"), d));
        log_add(&l, ATTEST_LOG_USERSPACE, 4, 0, d);
        assert_null(check(x, 1, &l, NULL));
        memset(d, 0x33, sizeof(d));
        log_add(&l, ATTEST_LOG_USERSPACE, 4, 0, d);
        m = check(x, 1, &l, NULL);
        assert_string_equal(
                m,
                "pcr 4 userspace record 17: digest "
                "3333333333333333333333333333333333333333333333333333333333333333 is not systemd's os-separator");
        free(m);

        attest_expected_pcr_done(&x[0]);
        attest_expected_pcr_done(&x[1]);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_debian_template),
                cmocka_unit_test(test_built_stores),
                cmocka_unit_test(test_pcr7_adopt),
                cmocka_unit_test(test_pcr4_events),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
