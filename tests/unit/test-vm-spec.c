/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "json-util.h"
#include "vm-spec.h"

/* create_vm's request -> spec: the API's defaults, every check with its message, the size limits
 * (which records skip), and the spec written back in the record's camelCase. */

static int build(const char *request, VmSpec *ret, char **ret_user_data, VmWaitFor *ret_wait_for, ApiError *e) {
        json_auto_t *j = json_loads(request, 0, NULL);

        assert_non_null(j);
        return vm_spec_from_request(j, ret, ret_user_data, ret_wait_for, e);
}

static void test_defaults(void **state) {
        _cleanup_(vm_spec_done) VmSpec s = {};
        _cleanup_free_ char *ud = NULL;
        VmWaitFor w = _VM_WAIT_INVALID;

        assert_ok(build("{\"name\":\"web\"}", &s, &ud, &w, NULL));
        assert_string_equal(s.name, "web");
        assert_null(s.image);
        assert_int_equal(s.cpus, 2);
        assert_int_equal(s.memory_mib, 2048);
        assert_int_equal(s.disk_gib, 20);
        assert_string_equal(s.network, "default");
        assert_string_equal(s.hostname, "web");
        assert_true(s.require_attestation);
        assert_null(s.metadata);
        assert_null(ud);
        assert_int_equal(w, VM_WAIT_READY);
        /* no install_mode: the daemon's --install-mode decides */
        assert_int_equal(s.install_mode, _VM_INSTALL_INVALID);
}

static void test_given(void **state) {
        _cleanup_(vm_spec_done) VmSpec s = {};
        _cleanup_free_ char *ud = NULL;
        VmWaitFor w = _VM_WAIT_INVALID;

        assert_ok(build(
                "{\"name\":\"db\",\"image\":\"base\",\"kubernetes_version\":\"1.31\",\"cpus\":8,"
                "\"memory_mib\":256,\"disk_gib\":4096,\"network\":\"lan\",\"user_data\":\"#cloud-config\","
                "\"ssh_authorized_keys\":[\"ssh-ed25519 AAAA a\"],\"hostname\":\"db-1\","
                "\"metadata\":{\"k\":\"v\"},\"require_attestation\":false,\"wait_for\":\"installed\","
                "\"install_mode\":\"boot\"}",
                &s,
                &ud,
                &w,
                NULL));
        assert_string_equal(s.image, "base");
        assert_string_equal(s.kubernetes_version, "1.31");
        assert_int_equal(s.cpus, 8);
        assert_int_equal(s.memory_mib, 256);
        assert_int_equal(s.disk_gib, 4096);
        assert_string_equal(s.network, "lan");
        assert_string_equal(s.hostname, "db-1");
        assert_string_equal(s.ssh_authorized_keys[0], "ssh-ed25519 AAAA a");
        assert_null(s.ssh_authorized_keys[1]);
        assert_string_equal(json_string_value(json_object_get(s.metadata, "k")), "v");
        assert_false(s.require_attestation);
        assert_string_equal(ud, "#cloud-config");
        assert_int_equal(w, VM_WAIT_INSTALLED);
        assert_int_equal(s.install_mode, VM_INSTALL_BOOT);

        /* null is absent: the default */
        vm_spec_done(&s);
        assert_ok(
                build("{\"name\":\"x\",\"image\":null,\"kubernetes_version\":null,\"cpus\":null,"
                      "\"memory_mib\":null,\"disk_gib\":null,\"network\":null,\"hostname\":null,"
                      "\"wait_for\":null,\"install_mode\":null}",
                      &s,
                      NULL,
                      &w,
                      NULL));
        assert_null(s.image);
        assert_null(s.kubernetes_version);
        assert_int_equal(s.cpus, 2);
        assert_int_equal(s.memory_mib, 2048);
        assert_int_equal(s.disk_gib, 20);
        assert_string_equal(s.network, "default");
        assert_string_equal(s.hostname, "x");
        assert_int_equal(w, VM_WAIT_READY);
        assert_int_equal(s.install_mode, _VM_INSTALL_INVALID);
}

static void expect_invalid(const char *request, const char *message) {
        _cleanup_(vm_spec_done) VmSpec s = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        assert_errno(build(request, &s, NULL, NULL, &e), -EINVAL);
        assert_string_equal(api_error_code_to_string(e.code), "invalid_request");
        if (!streq(e.message, message))
                fail_msg("%s\n# said:     %s\n# expected: %s", request, e.message, message);
        assert_null(s.name);
}

static void test_checks(void **state) {
        /* the request is decoded by create_vm's operation table: presence, types, enums and lengths
         * first, each refusal naming its field */
        expect_invalid("{}", "invalid request: field \"name\" is required");
        expect_invalid(
                "{\"name\":\"Web\",\"hostname\":\"web\"}",
                "invalid request: name must be a DNS label (lowercase letters, digits, dashes)");
        expect_invalid(
                "{\"name\":\"w\",\"hostname\":\"a_b\"}", "invalid request: hostname must be a DNS label");
        expect_invalid("{\"name\":\"w\",\"cpus\":257}", "invalid request: cpus must be 1..256");
        expect_invalid("{\"name\":\"w\",\"cpus\":-1}", "invalid request: cpus must be 1..256");
        /* 0 and "" are no way to ask for the default (absent or null is): refused, naming the field */
        expect_invalid("{\"name\":\"w\",\"cpus\":0}", "invalid request: cpus must be 1..256");
        expect_invalid("{\"name\":\"w\",\"memory_mib\":0}", "invalid request: memory_mib must be at least 256");
        expect_invalid("{\"name\":\"w\",\"disk_gib\":0}", "invalid request: disk_gib must be 1..4096");
        /* the integer that spells "absent" inside is no way either */
        expect_invalid(
                "{\"name\":\"w\",\"cpus\":-9223372036854775808}", "invalid request: cpus must be 1..256");
        expect_invalid(
                "{\"name\":\"w\",\"image\":\"\"}",
                "invalid request: image must not be empty (leave it out for the default)");
        expect_invalid(
                "{\"name\":\"w\",\"kubernetes_version\":\"\"}",
                "invalid request: kubernetes_version must not be empty (leave it out for the default)");
        expect_invalid(
                "{\"name\":\"w\",\"network\":\"\"}",
                "invalid request: network must not be empty (leave it out for the default)");
        expect_invalid(
                "{\"name\":\"w\",\"hostname\":\"\"}",
                "invalid request: hostname must not be empty (leave it out for the default)");
        expect_invalid(
                "{\"name\":\"w\",\"wait_for\":\"\"}",
                "invalid request: field \"wait_for\": \"\" is not one of the allowed values");
        expect_invalid(
                "{\"name\":\"w\",\"install_mode\":\"\"}",
                "invalid request: field \"install_mode\": \"\" is not one of the allowed values");
        expect_invalid(
                "{\"name\":\"w\",\"memory_mib\":255}", "invalid request: memory_mib must be at least 256");
        expect_invalid(
                "{\"name\":\"w\",\"memory_mib\":16777217}",
                "invalid request: memory_mib must be at most 16777216");
        expect_invalid("{\"name\":\"w\",\"disk_gib\":4097}", "invalid request: disk_gib must be 1..4096");
        expect_invalid(
                "{\"name\":\"w\",\"wait_for\":\"later\"}",
                "invalid request: field \"wait_for\": \"later\" is not one of the allowed values");
        expect_invalid(
                "{\"name\":\"w\",\"install_mode\":\"disk\"}",
                "invalid request: field \"install_mode\": \"disk\" is not one of the allowed values");
        expect_invalid(
                "{\"name\":\"w\",\"metadata\":{\"a/b\":\"x\"}}",
                "invalid request: metadata key \"a/b\" must not be empty or contain slashes or spaces");
        expect_invalid(
                "{\"name\":\"w\",\"metadata\":{\"a\":1}}",
                "invalid request: field \"metadata\": expected an object of strings, got object");
        expect_invalid(
                "{\"name\":\"w\",\"ssh_authorized_keys\":[\"a\\nb\"]}",
                "invalid request: ssh authorized keys must be single lines");
        /* every problem in one message: each field's own in declaration order, then the rules between
         * fields (the hostname is the name unless given: it fails with it) */
        expect_invalid(
                "{\"name\":\"W\",\"cpus\":0,\"memory_mib\":1,\"disk_gib\":-5}",
                "invalid request: name must be a DNS label (lowercase letters, digits, dashes); "
                "cpus must be 1..256; memory_mib must be at least 256; disk_gib must be 1..4096; hostname must be "
                "a DNS label");
        /* types and unknown fields, from the dispatch table */
        expect_invalid(
                "{\"name\":\"w\",\"cpus\":\"2\"}",
                "invalid request: field \"cpus\": expected an integer, got string");
        expect_invalid(
                "{\"name\":\"w\",\"require_attestation\":1}",
                "invalid request: field \"require_attestation\": expected a boolean, got integer");
        expect_invalid("{\"name\":\"w\",\"colour\":\"red\"}", "invalid request: unknown field \"colour\"");
}

static void test_limits(void **state) {
        _cleanup_free_ char *long_ref = test_repeat('i', VM_REF_MAX + 1),
                            *long_key = test_repeat('k', VM_SSH_KEY_MAX + 1),
                            *big_ud = test_repeat('u', VM_USER_DATA_MAX + 1), *req = NULL;
        _cleanup_(vm_spec_done) VmSpec s = {};
        VmSpecInput in = VM_SPEC_INPUT_NULL;

        assert_true(asprintf(&req, "{\"name\":\"w\",\"image\":\"%s\"}", long_ref) > 0);
        expect_invalid(req, "invalid request: field \"image\": longer than 255 bytes");
        req = mfree(req);
        assert_true(asprintf(&req, "{\"name\":\"w\",\"ssh_authorized_keys\":[\"%s\"]}", long_key) > 0);
        expect_invalid(req, "invalid request: field \"ssh_authorized_keys\": longer than 4096 bytes");
        req = mfree(req);
        assert_true(asprintf(&req, "{\"name\":\"w\",\"user_data\":\"%s\"}", big_ud) > 0);
        expect_invalid(req, "invalid request: field \"user_data\": longer than 1048576 bytes");

        /* records were written before the limits, and before 0 and "" were refused: they load, 0 and ""
         * meaning the default as they did then */
        in.name = strdup("w");
        in.image = TAKE_PTR(long_ref);
        assert_ok(vm_spec_build(&in, /* request= */ false, &s, NULL, NULL, NULL));
        assert_int_equal(strlen(s.image), VM_REF_MAX + 1);
        assert_null(in.image); /* taken */
        vm_spec_done(&s);
        in = VM_SPEC_INPUT_NULL;
        in.name = strdup("w");
        in.network = strdup("");
        in.hostname = strdup("");
        in.cpus = in.memory_mib = in.disk_gib = 0;
        assert_ok(vm_spec_build(&in, /* request= */ false, &s, NULL, NULL, NULL));
        assert_int_equal(s.cpus, 2);
        assert_int_equal(s.memory_mib, 2048);
        assert_int_equal(s.disk_gib, 20);
        assert_string_equal(s.network, "default");
        assert_string_equal(s.hostname, "w");
}

static void test_limits_metadata(void **state) {
        json_auto_t *req = json_pack("{s:s,s:o}", "name", "w", "metadata", json_object());
        _cleanup_(vm_spec_done) VmSpec s = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        for (unsigned i = 0; i <= VM_METADATA_MAX; i++) {
                char k[16];
                snprintf(k, sizeof(k), "k%u", i);
                assert_int_equal(json_object_set_new(json_object_get(req, "metadata"), k, json_string("v")), 0);
        }
        assert_errno(vm_spec_from_request(req, &s, NULL, NULL, &e), -EINVAL);
        assert_string_equal(e.message, "invalid request: metadata must have at most 64 entries");
}

static void test_to_json(void **state) {
        _cleanup_(vm_spec_done) VmSpec s = {};
        json_auto_t *o = json_object();
        _cleanup_free_ char *text = NULL;

        assert_ok(
                build("{\"name\":\"web\",\"image\":\"base_1\",\"ssh_authorized_keys\":[],\"metadata\":{}}",
                      &s,
                      NULL,
                      NULL,
                      NULL));
        s.region = strdup("host");
        assert_ok(vm_spec_to_json(&s, o));
        text = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT);
        /* empty lists and maps, and absent strings, are left out */
        assert_string_equal(
                text,
                "{\"name\":\"web\",\"image\":\"base_1\",\"cpus\":2,\"memoryMiB\":2048,\"diskGiB\":20,"
                "\"network\":\"default\",\"hostname\":\"web\",\"region\":\"host\",\"requireAttestation\":true}");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_defaults),        cmocka_unit_test(test_given),
                cmocka_unit_test(test_checks),          cmocka_unit_test(test_limits),
                cmocka_unit_test(test_limits_metadata), cmocka_unit_test(test_to_json),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
