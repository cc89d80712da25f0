/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* policy.json (network-imds-attest.md §4.3): the fixture policy, every validation message, Go's
 * decoding rules, the expected value of a PCR and the SysextPCR rule. */
#include "test-attest-fixtures.h"

#define D32 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define PCR11_OK \
        "\"pcr11\":{\"enter-initrd\":\"" D32 "\",\"enter-initrd:leave-initrd:sysinit:ready\":\"" D32 "\"}"

static void test_fixture(void **state) {
        _cleanup_(attest_policy_freep) AttestPolicy *p = fixture_policy();
        _cleanup_free_ char *p13 = fixture_pcr("ready", 13), *p0 = fixture_pcr("ready", 0),
                            *p11 = fixture_pcr("ready", 11), *i11 = fixture_pcr("initrd", 11);
        const char *kube = NULL;

        assert_string_equal(p->image_id, "giantswarm-vm-base");
        assert_string_equal(p->image_version, "0.1.0");
        assert_string_equal(p->pcr11_initrd, i11);
        assert_string_equal(p->pcr11_ready, p11);
        assert_string_equal(attest_policy_pcr11(p, ATTEST_PHASE_READY), p11);
        assert_null(attest_policy_pcr11(p, "sysinit"));
        assert_int_equal(p->n_pcr13, 1);
        assert_string_equal(p->pcr13[0].kubernetes_version, "1.36.4");
        assert_string_equal(p->pcr13[0].value, p13);
        assert_string_equal(p->golden[0], p0);
        assert_string_equal(p->golden[1], "");
        assert_string_equal(p->golden[5], "");
        assert_true(p->has_golden_firmware);
        assert_string_equal(p->golden_firmware_package, "ovmf");
        assert_string_equal(p->golden_firmware_version, "2022.11-6+deb12u2");

        /* PCR 13: the entry of the VM's version, else the golden value (none here) */
        assert_string_equal(attest_policy_expected(p, 13, "1.36.4", &kube), p13);
        assert_string_equal(kube, "1.36.4");
        assert_null(attest_policy_expected(p, 13, "1.35.0", &kube));
        assert_null(kube);
        assert_null(attest_policy_expected(p, 13, NULL, NULL));
        assert_string_equal(attest_policy_expected(p, 0, "1.36.4", &kube), p0);
        assert_null(kube);
        assert_null(attest_policy_expected(p, 1, NULL, NULL));
        assert_null(attest_policy_expected(p, 24, NULL, NULL));
}

static void check(const char *json, int error, const char *want) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        _cleanup_(attest_policy_freep) AttestPolicy *p = NULL;

        assert_errno(attest_policy_parse(json, strlen(json), &p, &err), error);
        assert_null(p);
        if (!err.message)
                fail_msg("no message for %s", json);
        assert_string_equal(err.message, want);
}

static void test_messages(void **state) {
        check("{}", -EINVAL, "policy: pcr11 lacks phase \"enter-initrd\"");
        check("null", -EINVAL, "policy: pcr11 lacks phase \"enter-initrd\"");
        check("{\"pcr11\":{\"enter-initrd\":\"" D32 "\"}}",
              -EINVAL,
              "policy: pcr11 lacks phase \"enter-initrd:leave-initrd:sysinit:ready\"");
        check("{\"pcr11\":{\"enter-initrd\":\"zz\"}}",
              -EINVAL,
              "policy: pcr11[\"enter-initrd\"]: not hex: encoding/hex: invalid byte: U+007A 'z'");
        check("{\"pcr11\":{\"enter-initrd\":\"abc\"}}",
              -EINVAL,
              "policy: pcr11[\"enter-initrd\"]: not hex: encoding/hex: odd length hex string");
        check("{\"pcr11\":{\"enter-initrd\":\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd\"}}",
              -EINVAL,
              "policy: pcr11[\"enter-initrd\"]: 31 bytes, want 32");
        check("{\"pcr11\":{\"enter-initrd\":null}}",
              -EINVAL,
              "policy: pcr11[\"enter-initrd\"]: 0 bytes, want 32");
        check("{" PCR11_OK ",\"pcr13\":{\"\":\"" D32 "\"}}",
              -EINVAL,
              "policy: pcr13 has an entry without a kubernetes version");
        check("{" PCR11_OK ",\"pcr13\":{\"1.30.0\":\"ab\"}}",
              -EINVAL,
              "policy: pcr13[\"1.30.0\"]: 1 bytes, want 32");
        check("{" PCR11_OK ",\"golden_firmware\":{\"sha256\":\"x1\"}}",
              -EINVAL,
              "policy: golden_firmware.sha256: not hex: encoding/hex: invalid byte: U+0078 'x'");
        check("{" PCR11_OK ",\"golden_firmware\":{\"package\":\"ovmf\"}}",
              -EINVAL,
              "policy: golden_firmware.sha256: 0 bytes, want 32");
        check("{" PCR11_OK ",\"golden\":{\"sha1\":{}}}",
              -EINVAL,
              "policy: golden bank \"sha1\" is not supported, only sha256");
        check("{" PCR11_OK ",\"golden\":{\"sha256\":{\"24\":\"" D32 "\"}}}",
              -EINVAL,
              "policy: golden.sha256: pcr index 24 out of range");
        check("{" PCR11_OK ",\"golden\":{\"sha256\":{\"-1\":\"" D32 "\"}}}",
              -EINVAL,
              "policy: golden.sha256: pcr index -1 out of range");
        check("{" PCR11_OK ",\"golden\":{\"sha256\":{\"3\":\"00\"}}}",
              -EINVAL,
              "policy: golden.sha256[3]: 1 bytes, want 32");
        check("{" PCR11_OK ",\"golden\":{\"sha256\":{\"7\":\"" D32 "\",\"3\":\"\xc3\xa9\"}}}",
              -EINVAL,
              "policy: golden.sha256[3]: not hex: encoding/hex: invalid byte: U+00C3 '\xc3\x83'");

        /* decoding errors, as Go's json words them where it can */
        check("{" PCR11_OK ",\"golden\":{\"sha256\":{\"x\":\"" D32 "\"}}}",
              -EBADMSG,
              "policy: json: cannot unmarshal number x into Go value of type int");
        check("{\"pcr11\":[]}",
              -EBADMSG,
              "policy: json: cannot unmarshal array into Go struct field Policy.pcr11 of type map[string]string");
        check("{\"pcr11\":{\"enter-initrd\":1}}",
              -EBADMSG,
              "policy: json: cannot unmarshal number into Go struct field Policy.pcr11 of type string");
        check("{\"image_id\":true}",
              -EBADMSG,
              "policy: json: cannot unmarshal bool into Go struct field Policy.image_id of type string");
        check("[]", -EBADMSG, "policy: json: cannot unmarshal array into Go value of type attest.Policy");

        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestPolicy *p = NULL;
        assert_errno(attest_policy_parse("{\"pcr11\":", 9, &p, &err), -EBADMSG);
        assert_startswith(err.message, "policy: ");
        assert_errno(attest_policy_parse("{} x", 4, &p, &err), -EBADMSG);
        assert_errno(attest_policy_parse("", 0, &p, &err), -EBADMSG);
}

/* "pcr12": "predicted" is what an image whose agent quotes PCR 12 declares; policies written before
 * say nothing, and no other word is read as that one. */
static void test_pcr12(void **state) {
        _cleanup_(attest_policy_freep) AttestPolicy *with = NULL, *without = NULL, *null = NULL;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        const char *j1 = "{" PCR11_OK ",\"pcr12\":\"predicted\"}", *j2 = "{" PCR11_OK "}",
                   *j3 = "{" PCR11_OK ",\"PCR12\":null}";

        assert_ok(attest_policy_parse(j1, strlen(j1), &with, &err));
        assert_true(with->pcr12_predicted);
        assert_ok(attest_policy_parse(j2, strlen(j2), &without, &err));
        assert_false(without->pcr12_predicted);
        assert_ok(attest_policy_parse(j3, strlen(j3), &null, &err));
        assert_false(null->pcr12_predicted);

        check("{" PCR11_OK ",\"pcr12\":\"golden\"}",
              -EINVAL,
              "policy: pcr12 \"golden\" is not supported, only \"predicted\" or \"predicted-credentials\"");
        check("{" PCR11_OK ",\"pcr12\":true}",
              -EBADMSG,
              "policy: json: cannot unmarshal bool into Go struct field Policy.pcr12 of type string");
}

static void test_go_decoding(void **state) {
        _cleanup_(attest_policy_freep) AttestPolicy *p = NULL;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        const char *up = "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF";
        _cleanup_free_ char *json = NULL;

        /* keys match fields case-insensitively, two keys of one map merge, unknown keys and null are
         * ignored, digests are kept lowercase, golden indexes may carry a sign or zeros */
        assert_true(
                asprintf(
                        &json,
                        "{\"PCR11\":{\"enter-initrd\":\"%s\"},\"pcr11\":{\"enter-initrd:leave-initrd:sysinit:"
                        "ready\":\"" D32 "\"},\"uki\":\"x.efi\",\"partitions\":[1,2],\"image_id\":null,"
                        "\"golden\":{\"sha256\":{\"+07\":\"%s\"}},\"golden_firmware\":null,"
                        "\"pcr13\":null}",
                        up,
                        up) > 0);
        if (attest_policy_parse(json, strlen(json), &p, &err) < 0)
                fail_msg("%s", err.message);
        assert_string_equal(p->pcr11_initrd, D32);
        assert_string_equal(p->pcr11_ready, D32);
        assert_null(p->image_id);
        assert_string_equal(p->golden[7], D32);
        assert_false(p->has_golden_firmware);
        assert_int_equal(p->n_pcr13, 0);
}

static void test_golden_null_value(void **state) {
        /* a null golden value is an empty string to Go, which is 0 bytes */
        check("{" PCR11_OK ",\"golden\":{\"sha256\":{\"2\":null}}}",
              -EINVAL,
              "policy: golden.sha256[2]: 0 bytes, want 32");
}

static void test_sysext_pcr(void **state) {
        _cleanup_free_ char *line = fixture_text("sysext.txt"), *p13 = fixture_pcr("ready", 13), *m = NULL,
                            *upper = NULL;
        char out[ATTEST_SHA256_HEX + 1];

        /* the fixture's PCR 13, as the TPM extended it */
        attest_sysext_pcr(line, out);
        assert_string_equal(out, p13);

        /* the line is "<sha256 lowercase>  <file>" */
        upper = strndup(line, 64);
        for (char *c = upper; *c; c++)
                if (*c >= 'a' && *c <= 'f')
                        *c = (char) (*c - 'a' + 'A');
        m = attest_sysext_measurement(upper, "kubernetes_1.36.4.raw");
        assert_string_equal(m, line);

        /* without a sysext only the separator is extended */
        attest_sysext_pcr(NULL, out);
        assert_string_equal(out, "3345a4e7857aa5ae65e97702ade84a3755fd6144724779536b5773128676c99c");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fixture),     cmocka_unit_test(test_messages),
                cmocka_unit_test(test_go_decoding), cmocka_unit_test(test_golden_null_value),
                cmocka_unit_test(test_sysext_pcr),  cmocka_unit_test(test_pcr12),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
