/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "json-util.h"
#include "vm-record.h"

/* vm.json both ways: every field of a record survives a round trip, unknown and malformed keys are
 * refused, what was never checked stays lenient, and a record of every shape an older vm-manager
 * wrote (tests/data/vm-record/) still loads, with the values it meant. */

#define ID "0a1b2c3d"
#define DIR "/state/vms/" ID

static char *data_path(const char *name) {
        const char *dir = secure_getenv("VM_MANAGER_TEST_DATA");
        char *p;

        assert_non_null(dir);
        assert_true(asprintf(&p, "%s/vm-record/%s", dir, name) >= 0);
        return p;
}

static json_t *load_fixture(const char *name) {
        _cleanup_free_ char *path = data_path(name), *text = NULL;
        json_error_t err;
        json_t *j;

        assert_ok(read_full_file(path, VM_RECORD_MAX, &text, NULL));
        j = json_loads(text, 0, &err);
        if (!j)
                fail_msg("%s: %s", path, err.text);
        return j;
}

/* A record with every field set. */
static void full_record(VmRecord *r) {
        static char *keys[] = { (char *) "ssh-ed25519 AAAA user@host", (char *) "ssh-rsa BBBB other", NULL };
        AttestResult initrd = { .verified = true, .message = strdup("quote verified"), .at = 1764584430500000 };
        AttestResult ready = { .verified = false, .message = strdup("golden mismatch"), .at = 1764584431000000 };

        *r = (VmRecord){
                .id = strdup(ID),
                .spec = {
                        .name = strdup("web-1"),
                        .image = strdup("base_1.2"),
                        .kubernetes_version = strdup("1.31"),
                        .cpus = 4,
                        .memory_mib = 4096,
                        .disk_gib = 30,
                        .network = strdup("lan"),
                        .ssh_authorized_keys = calloc(3, sizeof(char *)),
                        .hostname = strdup("web"),
                        .metadata = json_pack("{s:s,s:s}", "role", "worker", "tier", "a"),
                        .region = strdup("host-1"),
                        .zone = strdup("lan"),
                        .require_attestation = true,
                },
                .state = VM_STATE_READY,
                .phase = VM_PHASE_BOOT,
                .vsock = VM_VSOCK_VHOST,
                .install_mode = VM_INSTALL_HOST,
                .ip = strdup("10.0.0.2"),
                .mac = strdup("02:ab:0a:00:00:02"),
                .cid = 123456,
                .machine_id = "0123456789abcdef0123456789abcdef",
                .booted = true,
                .status = strdup("Running"),
                .ssh_public_key = strdup("ssh-ed25519 CCCC vm-manager@" ID),
                .att = {
                        .required = true,
                        .released = true,
                        .nonce_issued_at = 1764584429000000,
                        .initrd = initrd,
                        .ready = ready,
                        .has_initrd = true,
                        .has_ready = true,
                        .ak_pin = strdup("sha256:abcd"),
                        .ak_activated = strdup("00ff"),
                },
                .forwards = { .items = { { 22, 40022 }, { 80, 40080 } }, .n = 2 },
                .created_at = 1764584400000000,
                .installed_at = 1764584420123000,
                .booted_at = 1764584421000000,
                .ready_at = 1764584440000000,
                .created_by = json_pack("{s:s,s:s}", "subject", "alice", "email", "alice@example.com"),
                .last_error = strdup("ready attestation rejected: golden mismatch"),
                .console_tail = strdup("line 1\nline 2"),
                .volume = strdup("/state/volumes/vm-" ID ".volume"),
                .processes = {
                        [VM_ROLE_QEMU] = { .unit = strdup("vm-manager-" ID "-qemu.service"), .pid = 4242 },
                        [VM_ROLE_SWTPM] = { .unit = NULL, .pid = 4241 },
                },
        };
        assert_non_null(r->spec.ssh_authorized_keys);
        r->spec.ssh_authorized_keys[0] = strdup(keys[0]);
        r->spec.ssh_authorized_keys[1] = strdup(keys[1]);
}

static void assert_json_equal(json_t *a, json_t *b) {
        if (!json_equal(a, b)) {
                _cleanup_free_ char *x = json_dumps(a, JSON_INDENT(2) | JSON_PRESERVE_ORDER),
                                    *y = json_dumps(b, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                fail_msg("# differ:\n%s\n# and\n%s", x, y);
        }
}

static void test_round_trip(void **state) {
        _cleanup_(vm_record_done) VmRecord r = {}, back = {};
        json_auto_t *j = NULL, *again = NULL, *api = NULL;

        full_record(&r);
        j = vm_record_to_json(&r, DIR, /* for_disk= */ true);
        assert_non_null(j);
        assert_ok(vm_record_from_json(j, ID, &back, NULL));
        again = vm_record_to_json(&back, DIR, true);
        assert_non_null(again);
        assert_json_equal(j, again);

        /* field by field, not only as JSON */
        assert_string_equal(back.spec.name, "web-1");
        assert_string_equal(back.spec.ssh_authorized_keys[1], "ssh-rsa BBBB other");
        assert_int_equal(back.spec.cpus, 4);
        assert_true(back.spec.require_attestation);
        assert_string_equal(back.spec.region, "host-1");
        assert_int_equal(back.state, VM_STATE_READY);
        assert_int_equal(back.phase, VM_PHASE_BOOT);
        assert_int_equal(back.vsock, VM_VSOCK_VHOST);
        assert_int_equal(back.install_mode, VM_INSTALL_HOST);
        assert_int_equal(back.cid, 123456);
        assert_string_equal(back.machine_id, r.machine_id);
        assert_true(back.booted);
        assert_true(back.att.has_initrd && back.att.initrd.verified);
        assert_true(back.att.has_ready && !back.att.ready.verified);
        assert_string_equal(back.att.ak_pin, "sha256:abcd");
        assert_string_equal(back.att.ak_activated, "00ff");
        assert_int_equal(back.att.nonce_issued_at, r.att.nonce_issued_at);
        assert_int_equal(back.forwards.n, 2);
        assert_int_equal(back.forwards.items[1].host_port, 40080);
        assert_int_equal(back.installed_at, 1764584420123000);
        assert_string_equal(json_string_value(json_object_get(back.created_by, "email")), "alice@example.com");
        assert_string_equal(back.console_tail, "line 1\nline 2");
        assert_string_equal(back.volume, r.volume);
        assert_string_equal(back.processes[VM_ROLE_QEMU].unit, "vm-manager-" ID "-qemu.service");
        assert_int_equal(back.processes[VM_ROLE_SWTPM].pid, 4241);
        assert_null(back.processes[VM_ROLE_SWTPM].unit);
        assert_int_equal(back.processes[VM_ROLE_VSOCK].pid, 0);

        /* the API's view leaves out what only a successor needs */
        api = vm_record_to_json(&r, DIR, /* for_disk= */ false);
        assert_non_null(api);
        assert_null(json_object_get(api, "processes"));
        assert_null(json_object_get(json_object_get(api, "attestation"), "akPinned"));
        /* the activated key wins over an older pin; akTrust is the API's alone */
        assert_string_equal(
                json_string_value(json_object_get(json_object_get(api, "attestation"), "akTrust")),
                "activated");
        assert_string_equal(
                json_string_value(json_object_get(json_object_get(api, "attestation"), "akActivated")),
                "00ff");
        assert_null(json_object_get(json_object_get(j, "attestation"), "akTrust"));
        assert_non_null(json_object_get(j, "processes"));
        assert_string_equal(
                json_string_value(json_object_get(json_object_get(api, "paths"), "qmpSocket")),
                DIR "/qmp.sock");
}

/* The key order is the reference's: get_vm shows it as it is. */
static void test_key_order(void **state) {
        static const char *const order[] = {
                "id",
                "name",
                "image",
                "kubernetesVersion",
                "cpus",
                "memoryMiB",
                "diskGiB",
                "network",
                "sshAuthorizedKeys",
                "hostname",
                "metadata",
                "region",
                "zone",
                "requireAttestation",
                "state",
                "phase",
                "vsock",
                "installMode",
                "processes",
                "ip",
                "mac",
                "cid",
                "machineID",
                "booted",
                "status",
                "sshPublicKey",
                "attestation",
                "createdAt",
                "createdBy",
                "installedAt",
                "bootedAt",
                "readyAt",
                "lastError",
                "consoleTail",
                "forwards",
                "paths",
        };
        _cleanup_(vm_record_done) VmRecord r = {};
        json_auto_t *j = NULL;
        _cleanup_free_ char *text = NULL;
        const char *at;

        full_record(&r);
        j = vm_record_to_json(&r, DIR, true);
        assert_int_equal(json_object_size(j), ELEMENTSOF(order));
        text = json_dumps(j, JSON_PRESERVE_ORDER | JSON_COMPACT);
        at = text;
        for (size_t i = 0; i < ELEMENTSOF(order); i++) {
                _cleanup_free_ char *k = NULL;
                const char *next;

                assert_true(asprintf(&k, "\"%s\":", order[i]) > 0);
                next = strstr(at, k);
                if (!next)
                        fail_msg("key %s missing or out of order", order[i]);
                at = next;
        }
}

/* A record as create_vm leaves it before the installer runs: the optional keys are not written. */
static void test_minimal(void **state) {
        _cleanup_(vm_record_done) VmRecord r = {}, back = {};
        json_auto_t *j = NULL;

        r = (VmRecord){
                .id = strdup(ID),
                .spec = { .name = strdup("a"),
                          .image = strdup("base_1"),
                          .cpus = 2,
                          .memory_mib = 2048,
                          .disk_gib = 20,
                          .network = strdup("default"),
                          .hostname = strdup("a") },
                .state = VM_STATE_CREATING,
                .phase = _VM_PHASE_INVALID,
                .machine_id = "00000000000000000000000000000001",
        };
        j = vm_record_to_json(&r, DIR, true);
        assert_non_null(j);
        assert_null(json_object_get(j, "phase"));
        assert_null(json_object_get(j, "vsock"));
        assert_null(json_object_get(j, "processes"));
        assert_null(json_object_get(j, "ip"));
        assert_null(json_object_get(j, "createdBy"));
        assert_string_equal(json_string_value(json_object_get(j, "sshPublicKey")), "");
        assert_ok(vm_record_from_json(j, ID, &back, NULL));
        assert_int_equal(back.phase, _VM_PHASE_INVALID);
        /* no "vsock": a record of before the kernel's vhost-vsock, which ran on vhost-user */
        assert_int_equal(back.vsock, VM_VSOCK_VHOST_USER);
        assert_string_equal(back.ssh_public_key, "");
}

static void expect_refused(json_t *j, const char *id, const char *why) {
        _cleanup_(vm_record_done) VmRecord r = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        assert_errno(vm_record_from_json(j, id, &r, &e), -EBADMSG);
        assert_non_null(e.message);
        if (!strstr(e.message, why))
                fail_msg("refused with \"%s\", expected it to say \"%s\"", e.message, why);
        assert_null(r.id);
}

static void test_refused(void **state) {
        _cleanup_(vm_record_done) VmRecord r = {};
        json_auto_t *good = NULL;

        full_record(&r);
        good = vm_record_to_json(&r, DIR, true);
        assert_non_null(good);

        {
                json_auto_t *a = json_array();
                expect_refused(a, ID, "not a JSON object");
        }
        expect_refused(good, "ffffffff", "field \"id\"");
        static const struct {
                const char *key;
                const char *value; /* JSON, or NULL to remove the key */
                const char *why;
        } cases[] = {
                { "bogus", "1", "unknown field \"bogus\"" },
                { "state", "\"sleeping\"", "field \"state\"" },
                { "state", NULL, "\"state\" is required" },
                { "machineID", "\"XYZ\"", "field \"machineID\"" },
                { "machineID", NULL, "\"machineID\" is required" },
                { "vsock", "\"carrier-pigeon\"", "field \"vsock\"" },
                { "installMode", "\"sideways\"", "field \"installMode\"" },
                { "cpus", "\"four\"", "cpus" },
                { "cpus", "0", "" }, /* 0 is the default, 2 */
                { "cpus", "-1", "cpus must be 1..256" },
                { "name", "\"Not A Label\"", "name must be a DNS label" },
                { "ip", "17", "field \"ip\"" },
                { "booted", "\"yes\"", "booted" },
                { "processes", "{\"qemu\":{\"pid\":\"x\"}}", "processes" },
                { "processes", "{\"other\":{\"pid\":1}}", "unknown process" },
                { "attestation", "{\"required\":1}", "attestation" },
                { "attestation", "{\"surprise\":true}", "attestation" },
                { "paths", "{\"elsewhere\":\"/x\"}", "unknown field \"elsewhere\"" },
                { "paths", "{\"volume\":7}", "paths" },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                json_auto_t *j = json_deep_copy(good);

                if (cases[i].value)
                        assert_int_equal(
                                json_object_set_new(
                                        j, cases[i].key, json_loads(cases[i].value, JSON_DECODE_ANY, NULL)),
                                0);
                else
                        assert_int_equal(json_object_del(j, cases[i].key), 0);
                if (!*cases[i].why) {
                        _cleanup_(vm_record_done) VmRecord ok = {};
                        assert_ok(vm_record_from_json(j, ID, &ok, NULL));
                        continue;
                }
                print_message("# %s = %s\n", cases[i].key, cases[i].value ?: "(none)");
                expect_refused(j, ID, cases[i].why);
        }
}

/* What was never refused stays lenient. */
static void test_lenient(void **state) {
        _cleanup_(vm_record_done) VmRecord r = {}, back = {};
        json_auto_t *j = NULL;

        full_record(&r);
        j = vm_record_to_json(&r, DIR, true);
        assert_int_equal(json_object_set_new(j, "createdAt", json_string("yesterday")), 0);
        assert_int_equal(
                json_object_set_new(
                        j,
                        "forwards",
                        json_loads(
                                "[{\"port\":22,\"address\":\"127.0.0.1:1\"},{\"port\":0,\"address\":\"127.0.0.1:2\"},"
                                "{\"port\":23,\"address\":\"10.0.0.1:3\"},{\"port\":22,\"address\":\"127.0.0.1:4\"},7]",
                                0,
                                NULL)),
                0);
        assert_int_equal(json_object_set_new(j, "createdBy", json_pack("{s:s}", "email", "x@y")), 0);
        assert_int_equal(
                json_object_set_new(
                        json_object_get(j, "attestation"), "initrd", json_pack("{s:s}", "verified", "no")),
                0);
        assert_ok(vm_record_from_json(j, ID, &back, NULL));
        assert_int_equal(back.created_at, 0);
        assert_int_equal(back.forwards.n, 1);
        assert_int_equal(back.forwards.items[0].host_port, 1);
        assert_null(back.created_by);
        assert_false(back.att.has_initrd);
        assert_true(back.att.has_ready);
}

/* One record of each shape vm-manager wrote over time, as it wrote it. */
static void test_older_records(void **state) {
        static const struct {
                const char *file;
                VmState state;
                VmVsock vsock;
                VmInstallMode install_mode;
                size_t forwards;
                bool unit, volume, created_by, verdicts;
        } shapes[] = {
                /* the first: no vsock (vhost-user), processes by pid, no verdicts, no forwards */
                { "v1-first.json", VM_STATE_READY, VM_VSOCK_VHOST_USER, VM_INSTALL_BOOT, 0, false, false, false, false },
                /* the systemd launcher: units */
                { "v2-units.json", VM_STATE_READY, VM_VSOCK_VHOST_USER, VM_INSTALL_BOOT, 0, true, false, false, false },
                /* disks from the storage provider: paths.volume */
                { "v3-volume.json", VM_STATE_STOPPED, VM_VSOCK_VHOST_USER, VM_INSTALL_BOOT, 0, false, true, false, false },
                /* READY=1 over the kernel's vhost-vsock: vsock */
                { "v4-vsock.json", VM_STATE_RUNNING, VM_VSOCK_VHOST, VM_INSTALL_BOOT, 0, true, true, false, false },
                /* quotes judged: verdicts and the pinned AK */
                { "v5-verdicts.json", VM_STATE_READY, VM_VSOCK_VHOST_USER, VM_INSTALL_BOOT, 0, true, true, false, true },
                /* failures keep the console */
                { "v6-console.json", VM_STATE_FAILED, VM_VSOCK_VHOST_USER, VM_INSTALL_BOOT, 0, false, true, false, true },
                /* forward_port keeps its forwards */
                { "v7-forwards.json",
                  VM_STATE_STOPPED,
                  VM_VSOCK_VHOST_USER,
                  VM_INSTALL_BOOT,
                  1,
                  false,
                  true,
                  false,
                  false },
                /* the caller recorded: createdBy (today's shape) */
                { "v8-created-by.json",
                  VM_STATE_STOPPED,
                  VM_VSOCK_VHOST_USER,
                  VM_INSTALL_BOOT,
                  1,
                  false,
                  true,
                  true,
                  false },
                /* as this vm-manager wrote it: stopped while installing, swtpm still on its way out */
                { "v9-written.json",
                  VM_STATE_STOPPED,
                  VM_VSOCK_VHOST_USER,
                  VM_INSTALL_BOOT,
                  1,
                  false,
                  true,
                  false,
                  false },
                /* the host install: installMode (failed when its helper did) */
                { "v10-host-install.json", VM_STATE_FAILED, VM_VSOCK_VHOST, VM_INSTALL_HOST, 0, false, true, true, false },
        };

        for (size_t i = 0; i < ELEMENTSOF(shapes); i++) {
                _cleanup_(vm_record_done) VmRecord r = {};
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
                json_auto_t *j = load_fixture(shapes[i].file), *again = NULL;
                int k;

                print_message("# %s\n", shapes[i].file);
                k = vm_record_from_json(j, json_string_value(json_object_get(j, "id")), &r, &e);
                if (k < 0)
                        fail_msg("%s does not load: %s", shapes[i].file, e.message);
                assert_int_equal(r.state, shapes[i].state);
                assert_int_equal(r.vsock, shapes[i].vsock);
                assert_int_equal(r.install_mode, shapes[i].install_mode);
                assert_int_equal(r.forwards.n, shapes[i].forwards);
                assert_int_equal(r.processes[VM_ROLE_QEMU].unit != NULL, shapes[i].unit);
                assert_int_equal(r.volume != NULL, shapes[i].volume);
                assert_int_equal(r.created_by != NULL, shapes[i].created_by);
                assert_int_equal(r.att.has_initrd, shapes[i].verdicts);
                assert_non_null(r.spec.name);
                assert_true(r.created_at > 0);
                /* and it is written back in today's shape, which loads again */
                again = vm_record_to_json(&r, "/x", true);
                assert_non_null(again);
                {
                        _cleanup_(vm_record_done) VmRecord r2 = {};
                        assert_ok(vm_record_from_json(again, r.id, &r2, NULL));
                }
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_round_trip), cmocka_unit_test(test_key_order),
                cmocka_unit_test(test_minimal),    cmocka_unit_test(test_refused),
                cmocka_unit_test(test_lenient),    cmocka_unit_test(test_older_records),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
