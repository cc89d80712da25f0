/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "fs-util.h"
#include "vm-ignition.h"

static char *read_test_data(const char *name) {
        _cleanup_free_ char *path = NULL;
        const char *dir = secure_getenv("VM_MANAGER_TEST_DATA");
        char *text = NULL;

        assert_non_null(dir);
        assert_true(asprintf(&path, "%s/%s", dir, name) >= 0);
        assert_ok(read_full_file(path, 1 << 20, &text, NULL));
        return text;
}

static int translate(const char *in, json_t **ret, char **msg) {
        _cleanup_free_ char *out = NULL;
        int r = vm_ignition_translate(in, strlen(in), &out, msg);

        if (r == 1) {
                *ret = json_loads(out, 0, NULL);
                assert_non_null(*ret);
        }
        return r;
}

static json_t *file_at(json_t *root, const char *path) {
        json_t *files = json_object_get(json_object_get(root, "storage"), "files"), *f;
        size_t i;

        json_array_foreach(
                files, i, f) if (strcmp(json_string_value(json_object_get(f, "path")), path) == 0) return f;
        return NULL;
}

/* What Cluster API's kubeadm bootstrap provider writes for a control plane (format: ignition). */
static void test_cabpk(void **state) {
        _cleanup_free_ char *in = NULL, *msg = NULL;
        json_auto_t *out = NULL;
        json_t *f, *unit, *user;

        in = read_test_data("ignition/cabpk-control-plane.json");
        assert_int_equal(translate(in, &out, &msg), 1);
        assert_null(msg);
        assert_string_equal(
                json_string_value(json_object_get(json_object_get(out, "ignition"), "version")), "3.3.0");

        f = file_at(out, "/etc/kubeadm.sh");
        assert_non_null(f);
        assert_int_equal(json_integer_value(json_object_get(f, "mode")), 0700);
        assert_true(json_is_true(json_object_get(f, "overwrite")));
        assert_null(json_object_get(f, "filesystem"));
        assert_true(
                strncmp(json_string_value(json_object_get(json_object_get(f, "contents"), "source")),
                        "data:,%23!%2Fbin%2Fbash",
                        22) == 0);
        assert_non_null(file_at(out, "/etc/kubeadm.yml"));
        assert_non_null(file_at(out, "/etc/kubernetes/pki/ca.crt"));

        unit = json_array_get(json_object_get(json_object_get(out, "systemd"), "units"), 0);
        assert_string_equal(json_string_value(json_object_get(unit, "name")), "kubeadm.service");
        assert_true(json_is_true(json_object_get(unit, "enabled")));
        assert_non_null(
                strstr(json_string_value(json_object_get(unit, "contents")), "ExecStart=/etc/kubeadm.sh"));

        /* 2.x's "create" lifted into the user */
        user = json_array_get(json_object_get(json_object_get(out, "passwd"), "users"), 0);
        assert_string_equal(json_string_value(json_object_get(user, "shell")), "/bin/bash");
        assert_null(json_object_get(user, "create"));
        assert_null(json_object_get(out, "networkd"));
}

/* Not 2.x: left to the guest's Ignition as it is. */
static void test_untouched(void **state) {
        _cleanup_free_ char *msg = NULL, *out = NULL;
        const char *const inputs[] = {
                "{\"ignition\":{\"version\":\"3.3.0\"}}",
                "{\"ignition\":{\"version\":\"2.9.0\"}}",
                "#cloud-config\n",
                "[1,2]",
                "",
                "{\"ignition\":{\"version\":\"2.3.0\"},\"x\":1,\"x\":2}",
        };

        for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
                assert_int_equal(vm_ignition_translate(inputs[i], strlen(inputs[i]), &out, &msg), 0);
                assert_null(out);
                assert_null(msg);
        }
}

static void expect_error(const char *in, const char *needle) {
        _cleanup_free_ char *msg = NULL, *out = NULL;

        assert_int_equal(vm_ignition_translate(in, strlen(in), &out, &msg), -EINVAL);
        assert_null(out);
        assert_non_null(msg);
        if (!strstr(msg, needle))
                fail_msg("'%s' does not name '%s'", msg, needle);
}

static void test_refused(void **state) {
        expect_error(
                "{\"ignition\":{\"version\":\"2.3.0\"},\"storage\":{\"files\":[{\"filesystem\":\"oem\",\"path\":\"/x\"}]}}",
                "storage.files[0].filesystem");
        expect_error(
                "{\"ignition\":{\"version\":\"2.3.0\"},\"storage\":{\"disks\":[{\"device\":\"/dev/vdb\"}]}}",
                "storage.disks");
        expect_error("{\"ignition\":{\"version\":\"2.3.0\"},\"bogus\":{}}", "user_data.bogus");
        expect_error(
                "{\"ignition\":{\"version\":\"2.3.0\"},\"storage\":{\"files\":[{\"path\":\"/x\",\"colour\":1}]}}",
                "storage.files[0].colour");
        expect_error(
                "{\"ignition\":{\"version\":\"2.3.0\"},\"storage\":{\"files\":[{\"path\":\"relative\"}]}}",
                "storage.files[0].path");
        expect_error("{\"ignition\":{\"version\":\"2.3.0\"},\"systemd\":{\"units\":{}}}", "systemd.units");
        expect_error(
                "{\"ignition\":{\"version\":\"2.3.0\"},\"networkd\":{\"units\":[{\"name\":\"../x\"}]}}",
                "networkd.units[0].name");
}

/* networkd units become files; append, an empty file, 2.0's "enable", links and directories. */
static void test_shapes(void **state) {
        _cleanup_free_ char *msg = NULL;
        json_auto_t *out = NULL;
        json_t *f;

        assert_int_equal(
                translate(
                        "{\"ignition\":{\"version\":\"2.3.0\",\"config\":{\"append\":[{\"source\":\"http://x/y\"}]}},"
                        "\"networkd\":{\"units\":[{\"name\":\"10-eth.network\",\"contents\":\"[Match]\\nName=e* x\\n\","
                        "\"dropins\":[{\"name\":\"mtu.conf\",\"contents\":\"[Link]\\nMTUBytes=1400\\n\"}]}]},"
                        "\"storage\":{\"files\":[{\"filesystem\":\"root\",\"path\":\"/etc/motd\",\"append\":true,"
                        "\"contents\":{\"source\":\"data:,hi\"}},{\"path\":\"/etc/empty\",\"overwrite\":false}],"
                        "\"links\":[{\"filesystem\":\"root\",\"path\":\"/etc/l\",\"target\":\"/etc/motd\"}],"
                        "\"directories\":[{\"filesystem\":\"root\",\"path\":\"/var/d\",\"mode\":493}]},"
                        "\"systemd\":{\"units\":[{\"name\":\"a.service\",\"enable\":true}]}}",
                        &out,
                        &msg),
                1);
        assert_string_equal(
                json_string_value(json_object_get(
                        json_array_get(
                                json_object_get(
                                        json_object_get(json_object_get(out, "ignition"), "config"), "merge"),
                                0),
                        "source")),
                "http://x/y");
        f = file_at(out, "/etc/systemd/network/10-eth.network");
        assert_non_null(f);
        assert_string_equal(
                json_string_value(json_object_get(json_object_get(f, "contents"), "source")),
                "data:,%5BMatch%5D%0AName%3De%2A%20x%0A");
        assert_non_null(file_at(out, "/etc/systemd/network/10-eth.network.d/mtu.conf"));
        f = file_at(out, "/etc/motd");
        assert_null(json_object_get(f, "contents"));
        assert_string_equal(
                json_string_value(json_object_get(json_array_get(json_object_get(f, "append"), 0), "source")),
                "data:,hi");
        f = file_at(out, "/etc/empty");
        assert_true(json_is_false(json_object_get(f, "overwrite")));
        assert_string_equal(
                json_string_value(json_object_get(json_object_get(f, "contents"), "source")), "data:,");
        assert_string_equal(
                json_string_value(json_object_get(
                        json_array_get(json_object_get(json_object_get(out, "storage"), "links"), 0),
                        "target")),
                "/etc/motd");
        assert_int_equal(
                json_integer_value(json_object_get(
                        json_array_get(json_object_get(json_object_get(out, "storage"), "directories"), 0),
                        "mode")),
                0755);
        assert_true(json_is_true(json_object_get(
                json_array_get(json_object_get(json_object_get(out, "systemd"), "units"), 0), "enabled")));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_cabpk),
                cmocka_unit_test(test_untouched),
                cmocka_unit_test(test_refused),
                cmocka_unit_test(test_shapes),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
