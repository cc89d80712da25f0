/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The firmware run's console and its expectations: the log comes back from the console lines, the
 * fixture boot's firmware events up to the separators are what a run records, and the cache entry
 * reads back as it was written. */
#include "test-attest-fixtures.h"

#include "attest-fwlog.h"
#include "hex-util.h"

/* A console like a run's: OVMF's escape sequences, kernel lines, the log in 48-byte lines. */
static char *console_of(const uint8_t *log, size_t size, bool end) {
        AttestText t = {};

        attest_text_add(&t, "\x1b[2J\x1b[01;01HBdsDxe: loading Boot0001\r\n[    1.0] Linux version\r\n");
        attest_text_add(&t, ATTEST_FWLOG_PREFIX "begin\r\n");
        for (size_t off = 0; off < size; off += 48) {
                size_t n = size - off < 48 ? size - off : 48;
                char hex[97];

                attest_text_add(&t, ATTEST_FWLOG_PREFIX "%s\r\n", hex_format(log + off, n, hex));
                if (off == 96)
                        attest_text_add(&t, "[    7.2] ima: Can not allocate sha384\r\n");
        }
        if (end)
                attest_text_add(&t, ATTEST_FWLOG_PREFIX "end %zu\r\n[    9.3] reboot: Power down\r\n", size);
        assert_false(t.oom);
        return t.s;
}

static void expect_bad(const char *console, const char *why) {
        _cleanup_free_ uint8_t *log = NULL;
        _cleanup_free_ char *got = NULL;
        size_t size = 0;

        assert_int_equal(attest_fwlog_parse(console, strlen(console), &log, &size, &got), -EBADMSG);
        assert_null(log);
        assert_string_equal(got, why);
}

static void test_parse(void **state) {
        _cleanup_free_ uint8_t *log = NULL, *back = NULL;
        _cleanup_free_ char *console = NULL, *cut = NULL;
        size_t size = 0, back_size = 0;

        log = fixture_read("firmware.log", &size);
        console = console_of(log, size, true);
        assert_ok(attest_fwlog_parse(console, strlen(console), &back, &back_size, NULL));
        assert_int_equal(back_size, size);
        assert_memory_equal(back, log, size);

        cut = console_of(log, size, false);
        expect_bad(cut, "the log ends after 8256 bytes without its end line");
        expect_bad("nothing\n", "the console has no 'vmm-fwlog: begin' line");
        expect_bad(
                "vmm-fwlog: error /sys/kernel/security/tpm0/binary_bios_measurements: No such file\n",
                "the guest reported: /sys/kernel/security/tpm0/binary_bios_measurements: No such file");
        expect_bad("vmm-fwlog: begin\nvmm-fwlog: 0g\n", "line 2 is not hex");
        expect_bad("vmm-fwlog: begin\nvmm-fwlog: 001\n", "line 2 is not hex");
        expect_bad(
                "vmm-fwlog: begin\nvmm-fwlog: 0011\nvmm-fwlog: end 3\n",
                "the log ends after 2 of the 3 bytes announced");
        expect_bad("vmm-fwlog: begin\nvmm-fwlog: end 0\n", "the guest's event log is empty");
        expect_bad("vmm-fwlog: begin\nvmm-fwlog: begin\n", "line 2 begins a second log");
        expect_bad(
                "vmm-fwlog: begin\nvmm-fwlog: 00\nvmm-fwlog: end x\n",
                "line 3: the end line's size is not a number");
}

static void test_expect_from_log(void **state) {
        _cleanup_(attest_firmware_expect_done) AttestFirmwareExpect fw = {}, back = {};
        _cleanup_free_ uint8_t *log = NULL;
        _cleanup_free_ char *why = NULL;
        json_auto_t *j = NULL;
        char hex[65];
        size_t size = 0;

        log = fixture_read("firmware.log", &size);
        assert_ok(attest_firmware_expect_from_log(log, size, &fw, &why));
        assert_null(why);
        /* PCR 0: the S-CRTM version, PEIFV, DXEFV, the separator; replayed to the boot's value */
        assert_int_equal(fw.pcr[0].n_events, 4);
        assert_int_equal(fw.pcr[0].events[0].type, EV_S_CRTM_VERSION);
        assert_int_equal(fw.pcr[0].events[1].type, EV_EFI_PLATFORM_FIRMWARE_BLOB);
        assert_string_equal(
                hex_format(fw.pcr[0].events[1].digest, 32, hex),
                "f4f0c52697278027731926901650c9eccd0e4181d6b63339c07552c2c969915d");
        assert_int_equal(fw.pcr[0].events[3].type, EV_SEPARATOR);
        /* firmware-pcrs.json's PCR 0, as the guest read it */
        assert_string_equal(
                hex_format(fw.pcr[0].value, 32, hex),
                "177e29c417b6b61c7cf46ed30b4468931f58642527a268b556254e39b941ec6a");
        for (unsigned i = 2; i <= 6; i++)
                if (i == 2 || i == 3 || i == 6) {
                        assert_int_equal(fw.pcr[i].n_events, 1);
                        assert_int_equal(fw.pcr[i].events[0].type, EV_SEPARATOR);
                }
        assert_string_equal(fw.pcr[0].events[1].what, "this host's firmware");
        assert_int_equal(fw.pcr[4].n_events, 0); /* PCR 4 is the image's */

        /* the cache entry reads back */
        j = attest_firmware_expect_to_json(&fw);
        assert_non_null(j);
        assert_ok(attest_firmware_expect_from_json(j, &back));
        for (unsigned i = 0; i < 8; i++) {
                assert_int_equal(back.pcr[i].n_events, fw.pcr[i].n_events);
                assert_memory_equal(back.pcr[i].value, fw.pcr[i].value, 32);
        }

        /* a log cut before the separators */
        free(why);
        why = NULL;
        assert_int_equal(attest_firmware_expect_from_log(log, 400, &back, &why), -EBADMSG);
        assert_non_null(why);
}

static void test_expect_from_json_rejects(void **state) {
        static const char *const bad[] = {
                "[]",
                "{\"4\":[]}",
                "{\"9\":[]}",
                "{\"x\":[]}",
                "{\"0\":[{\"type\":1,\"digest\":\"00\"}]}",
                "{\"0\":[{\"type\":-1,\"digest\":\"0000000000000000000000000000000000000000000000000000000000000000\"}]}",
                /* PCR 0 must end in its separator */
                "{\"0\":[{\"type\":8,\"digest\":\"0000000000000000000000000000000000000000000000000000000000000000\"}]}",
        };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                _cleanup_(attest_firmware_expect_done) AttestFirmwareExpect fw = {};
                json_auto_t *j = json_loads(bad[i], 0, NULL);

                assert_non_null(j);
                assert_int_equal(attest_firmware_expect_from_json(j, &fw), -EINVAL);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse),
                cmocka_unit_test(test_expect_from_log),
                cmocka_unit_test(test_expect_from_json_rejects),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
