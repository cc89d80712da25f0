/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test-golden.h"
#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "parse-util.h"
#include "vm-cmdline.h"

/* The golden files are tests/data/argv/<name>.args, one argument per line. With
 * VM_MANAGER_TEST_REGENERATE=1 the tests rewrite them from the builder instead of comparing; review
 * the diff like code. */

#define STATE "/var/lib/vm-manager"
#define ID "0a1b2c3d"
#define VMDIR STATE "/vms/" ID
#define IMAGE STATE "/images/debian-sid_2025.1"

/* Deliberately not sorted: the builder sorts by name. The ssh keys end in a newline, so they go as
 * base64. */
static const VmCredential install_credentials[] = {
        { "vmm.notify_socket", "vsock-stream:2:8888" },
        { "system.machine_id", "5c1e0a8f2b7d4e6a9c3b1d0e2f4a6b8c" },
        { "ssh.authorized_keys.root",
          "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk2v7SxQ vm-manager@0a1b2c3d\n"
          "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB9dQm1XZ alice@laptop\n" },
        { "vm.install-target", "/dev/disk/by-id/virtio-target" },
        { "firstboot.hostname", "node-1" },
};

/* Phase boot passes the same set minus vm.install-target. */
static const VmCredential boot_credentials[] = {
        { "firstboot.hostname", "node-1" },
        { "ssh.authorized_keys.root",
          "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk2v7SxQ vm-manager@0a1b2c3d\n"
          "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB9dQm1XZ alice@laptop\n" },
        { "system.machine_id", "5c1e0a8f2b7d4e6a9c3b1d0e2f4a6b8c" },
        { "vmm.notify_socket", "vsock-stream:2:8888" },
};

static VmCmdlineSpec spec_new(VmPhase phase, VmAccel accel, VmVsock vsock) {
        bool install = phase == VM_PHASE_INSTALL;

        return (VmCmdlineSpec){
                .qemu = "qemu-system-x86_64",
                .id = ID,
                .dir = VMDIR,
                .phase = phase,
                .accel = accel,
                .vsock = vsock,
                .cpus = 2,
                .memory_mib = 2048,
                .ovmf_code = "/usr/share/OVMF/OVMF_CODE_4M.fd",
                .ovmf_vars = VMDIR "/ovmf_vars.fd",
                .uki = install ? IMAGE ".efi" : NULL,
                .image_raw = install ? IMAGE ".raw" : NULL,
                .volume = STATE "/volumes/vm-" ID ".volume",
                .net_socket = VMDIR "/net.sock",
                .mac = "02:5a:c0:a8:7f:02",
                .cid = vsock == VM_VSOCK_VHOST ? 612345 : 0,
                .vsock_socket = vsock == VM_VSOCK_VHOST_USER ? VMDIR "/vsock.sock" : NULL,
                .tpm_socket = VMDIR "/tpm/swtpm.sock",
                .credentials = install ? install_credentials : boot_credentials,
                .n_credentials = install ? ELEMENTSOF(install_credentials) : ELEMENTSOF(boot_credentials),
                /* the daemon's default; under KVM the builder leaves it out */
                .tb_size_mib = 256,
        };
}

static char *golden_path(const char *name) {
        const char *dir = secure_getenv("VM_MANAGER_TEST_DATA"), *slash;
        char *p;

        /* meson points at the source tree. Without it, go from this file's directory as the compiler
         * saw it, which under meson is relative to the build directory. */
        if (dir) {
                assert_true(asprintf(&p, "%s/argv/%s.args", dir, name) >= 0);
                return p;
        }

        slash = strrchr(__FILE__, '/');
        assert_true(
                asprintf(
                        &p,
                        "%.*s/../data/argv/%s.args",
                        slash ? (int) (slash - __FILE__) : 1,
                        slash ? __FILE__ : ".",
                        name) >= 0);
        return p;
}

/* argv, one argument per line, the way the golden files store it. */
static char *argv_to_text(char **argv) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        FILE *f;

        f = open_memstream(&buf, &size);
        assert_non_null(f);
        for (char **a = argv; *a; a++) {
                assert_null(strchr(*a, '\n'));
                fprintf(f, "%s\n", *a);
        }
        assert_int_equal(fclose(f), 0);
        return TAKE_PTR(buf);
}

/* Compares argv with the golden file name, or rewrites the file when asked to (test-golden.h). */
static bool golden_matches(const char *name, char **argv) {
        _cleanup_free_ char *path = golden_path(name), *got = argv_to_text(argv);

        return test_golden_matches(path, got, "argv");
}

static void check_golden(const char *name, char ***argv) {
        bool ok = golden_matches(name, *argv);

        *argv = strv_free(*argv);
        if (!ok)
                fail_msg("argv differs from golden file %s.args", name);
}

static void check_spec_golden(const char *name, const VmCmdlineSpec *spec) {
        char **argv = NULL;

        assert_ok(vm_cmdline_build(spec, &argv));
        check_golden(name, &argv);
}

static void test_golden_install_kvm_vhost(void **state) {
        VmCmdlineSpec spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_KVM, VM_VSOCK_VHOST);

        check_spec_golden("install-kvm-vhost", &spec);
}

static void test_golden_install_tcg_vhost_user(void **state) {
        VmCmdlineSpec spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);

        check_spec_golden("install-tcg-vhost-user", &spec);
}

static void test_golden_boot_tcg_vhost_user_firstboot(void **state) {
        VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);

        /* The first installed boot. */
        spec.kernel_cmdline_extra = "ignition.firstboot";
        check_spec_golden("boot-tcg-vhost-user-firstboot", &spec);
}

static void test_golden_boot_kvm_vhost(void **state) {
        VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_KVM, VM_VSOCK_VHOST);

        check_spec_golden("boot-kvm-vhost", &spec);
}

/* The kernel's vhost-vsock under TCG: a CID, and plain guest RAM (no shared memfd backend). */
static void test_golden_boot_tcg_vhost(void **state) {
        VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST);

        check_spec_golden("boot-tcg-vhost", &spec);
}

/* A network with a large MTU: the NIC learns it as host_mtu. */
static void test_nic_mtu(void **state) {
        VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
        _cleanup_strv_free_ char **argv = NULL;
        bool found = false;

        spec.mtu = 65520;
        assert_ok(vm_cmdline_build(&spec, &argv));
        for (char **a = argv; *a; a++)
                if (strstr(*a, "virtio-net-pci")) {
                        assert_non_null(strstr(*a, ",host_mtu=65520,"));
                        found = true;
                }
        assert_true(found);
}

/* The argument after option, or NULL. */
static const char *option_value(char **argv, const char *option) {
        for (char **a = argv; *a && a[1]; a++)
                if (streq(*a, option))
                        return a[1];
        return NULL;
}

/* The translation cache's size goes to TCG only; 0 leaves QEMU's default. */
static void test_tb_size(void **state) {
        VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
        char **argv = NULL;

        spec.tb_size_mib = 64;
        assert_ok(vm_cmdline_build(&spec, &argv));
        assert_string_equal(option_value(argv, "-accel"), "tcg,thread=multi,tb-size=64");
        argv = strv_free(argv);

        spec.tb_size_mib = 0;
        assert_ok(vm_cmdline_build(&spec, &argv));
        assert_string_equal(option_value(argv, "-accel"), "tcg,thread=multi");
        argv = strv_free(argv);

        spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.tb_size_mib = 64;
        assert_ok(vm_cmdline_build(&spec, &argv));
        assert_string_equal(option_value(argv, "-accel"), "kvm");
        argv = strv_free(argv);
}

/* Every VM gets the balloon with free page reporting, whatever its memory backend. */
static void test_balloon(void **state) {
        static const VmVsock kinds[] = { VM_VSOCK_VHOST, VM_VSOCK_VHOST_USER, VM_VSOCK_NONE };

        for (size_t i = 0; i < ELEMENTSOF(kinds); i++) {
                VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, kinds[i]);
                _cleanup_strv_free_ char **argv = NULL;
                size_t n = 0;

                assert_ok(vm_cmdline_build(&spec, &argv));
                for (char **a = argv; *a; a++)
                        n += streq(*a, "virtio-balloon-pci,id=balloon0,free-page-reporting=on");
                assert_int_equal(n, 1);
        }
}

/* --vsock=none: no vsock device at all, plain guest RAM. */
static void test_golden_boot_tcg_no_vsock(void **state) {
        VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_NONE);

        check_spec_golden("boot-tcg-no-vsock", &spec);
}

static void test_golden_commas(void **state) {
        static const VmCredential credentials[] = {
                { "firstboot.hostname", "node-1" },
                { "io.example.list", "a,b,,c" },
        };
        VmCmdlineSpec spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);

        /* Every value with a comma is escaped, except -kernel's and the serial file's, which QEMU
         * takes verbatim. */
        spec.id = "vm,1";
        spec.dir = "/srv/a,b/vms/vm,1";
        spec.ovmf_code = "/opt/fw,x/OVMF_CODE.fd";
        spec.ovmf_vars = "/srv/a,b/vms/vm,1/ovmf_vars.fd";
        spec.uki = "/srv/a,b/images/img,1.efi";
        spec.image_raw = "/srv/a,b/images/img,1.raw";
        spec.volume = "/srv/a,b/volumes/vm-vm,1.volume";
        spec.net_socket = "/srv/a,b/vms/vm,1/net.sock";
        spec.vsock_socket = "/srv/a,b/vms/vm,1/vsock.sock";
        spec.tpm_socket = "/srv/a,b/vms/vm,1/tpm/swtpm.sock";
        spec.credentials = credentials;
        spec.n_credentials = ELEMENTSOF(credentials);
        spec.kernel_cmdline_extra = "ignition.firstboot quiet,extra";
        check_spec_golden("commas", &spec);
}

static void test_golden_swtpm(void **state) {
        char **argv = NULL;

        assert_ok(vm_swtpm_cmdline_build(
                "swtpm", VMDIR "/tpm", VMDIR "/tpm/swtpm.sock", VMDIR "/tpm/swtpm.log", &argv));
        check_golden("swtpm", &argv);
}

static void test_golden_vhost_device_vsock(void **state) {
        char **argv = NULL;

        assert_ok(vm_vhost_user_vsock_cmdline_build(
                "vhost-device-vsock", 612345, VMDIR "/vsock.sock", VMDIR "/notify.sock", &argv));
        check_golden("vhost-device-vsock", &argv);
}

static void test_escape(void **state) {
        static const struct {
                const char *in, *out;
        } table[] = {
                { "", "" },
                { "plain", "plain" },
                { ",", ",," },
                { ",,", ",,,," },
                { "a,b", "a,,b" },
                { ",lead", ",,lead" },
                { "trail,", "trail,," },
                { "/srv/a,b/c,,d", "/srv/a,,b/c,,,,d" },
                { "key=value:x;y", "key=value:x;y" },
                { "é,ü", "é,,ü" },
        };

        for (size_t i = 0; i < ELEMENTSOF(table); i++) {
                _cleanup_free_ char *s = vm_cmdline_escape(table[i].in);

                assert_non_null(s);
                assert_string_equal(s, table[i].out);
        }
}

static void test_enum_strings(void **state) {
        for (VmPhase p = 0; p < _VM_PHASE_MAX; p++)
                assert_int_equal(vm_phase_from_string(vm_phase_to_string(p)), p);
        for (VmAccel a = 0; a < _VM_ACCEL_MAX; a++)
                assert_int_equal(vm_accel_from_string(vm_accel_to_string(a)), a);
        for (VmVsock v = 0; v < _VM_VSOCK_MAX; v++)
                assert_int_equal(vm_vsock_from_string(vm_vsock_to_string(v)), v);

        assert_string_equal(vm_phase_to_string(VM_PHASE_INSTALL), "install");
        assert_string_equal(vm_accel_to_string(VM_ACCEL_TCG), "tcg");
        assert_string_equal(vm_vsock_to_string(VM_VSOCK_VHOST_USER), "vhost-user");
        assert_string_equal(vm_vsock_to_string(VM_VSOCK_NONE), "none");

        assert_int_equal(vm_phase_from_string("installed"), _VM_PHASE_INVALID);
        assert_int_equal(vm_accel_from_string("auto"), _VM_ACCEL_INVALID);
        assert_int_equal(vm_vsock_from_string(NULL), _VM_VSOCK_INVALID);
        assert_null(vm_phase_to_string(_VM_PHASE_MAX));
        assert_null(vm_accel_to_string(_VM_ACCEL_INVALID));
        assert_null(vm_vsock_to_string(_VM_VSOCK_MAX));
}

/* Expects spec to be refused because of field, and *ret to stay untouched. */
static void check_invalid(const VmCmdlineSpec *spec, const char *field, const char *what) {
        char **sentinel = (char **) &sentinel, **argv = sentinel;
        const char *got = NULL;
        int r;

        r = vm_cmdline_spec_validate(spec, &got);
        if (r != -EINVAL)
                fail_msg("%s: validate = %d (%s), expected EINVAL", what, r, test_errno_name(r));
        if (!got || !streq(got, field))
                fail_msg("%s: refused for field '%s', expected '%s'", what, got ?: "(null)", field);

        assert_errno(vm_cmdline_build(spec, &argv), -EINVAL);
        assert_ptr_equal(argv, sentinel);
}

#define LONG_DIR_98 \
        "/tmp/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
/* 108 bytes: one more than a socket address holds. */
#define LONG_SOCKET LONG_DIR_98 "/1234.sock"

static void test_validate_strings(void **state) {
        static const struct {
                const char *field;
                size_t offset;
                const char *value;
        } table[] = {
#define C(member, v) { #member, offsetof(VmCmdlineSpec, member), v }
                C(qemu, NULL),
                C(qemu, ""),
                C(qemu, "qemu\n"),
                C(id, NULL),
                C(id, ""),
                C(id, "0a1b\n2c3d"),
                C(dir, NULL),
                C(dir, "vms/0a1b2c3d"),
                C(dir, "/var/lib/a=b/vms/0a1b2c3d"),
                C(dir, "/var/lib/vm\r"),
                C(dir, LONG_DIR_98 "x"), /* 99 + "/qmp.sock" = 108 */
                C(ovmf_code, NULL),
                C(ovmf_code, "OVMF_CODE_4M.fd"),
                C(ovmf_vars, NULL),
                C(ovmf_vars, "/a\nb"),
                C(uki, NULL),
                C(uki, "img.efi"),
                C(image_raw, NULL),
                C(image_raw, "/a\n"),
                C(volume, NULL),
                C(volume, "host:disk"),
                C(net_socket, NULL),
                C(net_socket, "net.sock"),
                C(net_socket, LONG_SOCKET),
                C(mac, NULL),
                C(mac, ""),
                C(mac, "02:00:00:00:00"),
                C(mac, "02:00:00:00:00:0g"),
                C(mac, "02-00-00-00-00-01"),
                C(mac, "02:00:00:00:00:001"),
                C(mac, "02:000:00:00:00:1"),
                C(mac, "03:00:00:00:00:01"), /* multicast */
                C(mac, "0f:00:00:00:00:01"),
                C(vsock_socket, NULL),
                C(vsock_socket, LONG_SOCKET),
                C(tpm_socket, ""),
                C(tpm_socket, "tpm/swtpm.sock"),
                C(tpm_socket, LONG_SOCKET),
                C(kernel_cmdline_extra, ""),
                C(kernel_cmdline_extra, "ignition.firstboot\nquiet"),
#undef C
        };

        for (size_t i = 0; i < ELEMENTSOF(table); i++) {
                VmCmdlineSpec spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
                char what[256];

                *(const char **) ((uint8_t *) &spec + table[i].offset) = table[i].value;
                (void) snprintf(what, sizeof(what), "%s = '%s'", table[i].field, table[i].value ?: "(null)");
                check_invalid(&spec, table[i].field, what);
        }
}

static void test_validate_numbers(void **state) {
        VmCmdlineSpec spec;

        spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.phase = _VM_PHASE_MAX;
        check_invalid(&spec, "phase", "phase out of range");
        spec.phase = _VM_PHASE_INVALID;
        check_invalid(&spec, "phase", "phase invalid");

        spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.accel = _VM_ACCEL_MAX;
        check_invalid(&spec, "accel", "accel out of range");

        spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.vsock = _VM_VSOCK_INVALID;
        check_invalid(&spec, "vsock", "vsock invalid");

        spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.cpus = 0;
        check_invalid(&spec, "cpus", "cpus 0");
        spec.cpus = VM_CPUS_MAX + 1;
        check_invalid(&spec, "cpus", "cpus 257");

        spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.memory_mib = 0;
        check_invalid(&spec, "memory_mib", "memory 0");
        spec.memory_mib = VM_MEMORY_MIB_MIN - 1;
        check_invalid(&spec, "memory_mib", "memory 255");

        spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST);
        spec.tb_size_mib = VM_TB_SIZE_MIB_MAX + 1;
        check_invalid(&spec, "tb_size_mib", "tb-size past its ceiling");

        spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.cid = 0;
        check_invalid(&spec, "cid", "cid 0");
        spec.cid = 2;
        check_invalid(&spec, "cid", "cid 2 (the host)");
        spec.cid = UINT32_MAX;
        check_invalid(&spec, "cid", "cid VMADDR_CID_ANY");
}

static void test_validate_credentials(void **state) {
        static const char *const bad_names[] = {
                NULL, "", ".", "..", "a=b", "a,b", "a/b", "a:b", "a\nb", "a\tb", "é", "a\x7f",
        };
        char long_name[VM_CREDENTIAL_NAME_MAX + 2];
        VmCmdlineSpec spec;

        for (size_t i = 0; i < ELEMENTSOF(bad_names); i++) {
                const VmCredential c[] = { { "firstboot.hostname", "node-1" }, { bad_names[i], "x" } };
                char what[64];

                spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
                spec.credentials = c;
                spec.n_credentials = ELEMENTSOF(c);
                (void) snprintf(what, sizeof(what), "credential name '%s'", bad_names[i] ?: "(null)");
                check_invalid(&spec, "credentials", what);
        }

        /* 256 characters are one too many. */
        memset(long_name, 'a', sizeof(long_name) - 1);
        long_name[sizeof(long_name) - 1] = 0;
        {
                const VmCredential c[] = { { long_name, "x" } };

                spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
                spec.credentials = c;
                spec.n_credentials = 1;
                check_invalid(&spec, "credentials", "credential name of 256 characters");
        }

        {
                const VmCredential c[] = { { "a", NULL } };

                spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
                spec.credentials = c;
                spec.n_credentials = 1;
                check_invalid(&spec, "credentials", "credential without a value");
        }

        {
                const VmCredential c[] = { { "a", "1" }, { "b", "2" }, { "a", "3" } };

                spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
                spec.credentials = c;
                spec.n_credentials = ELEMENTSOF(c);
                check_invalid(&spec, "credentials", "credential given twice");
        }

        spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
        spec.credentials = NULL;
        spec.n_credentials = 1;
        check_invalid(&spec, "credentials", "credentials NULL with a count");
}

static bool strv_contains(char **l, const char *s) {
        for (; *l; l++)
                if (streq(*l, s))
                        return true;
        return false;
}

static bool strv_has_prefix(char **l, const char *prefix) {
        for (; *l; l++)
                if (strneq(*l, prefix, strlen(prefix)))
                        return true;
        return false;
}

static void test_validate_edges(void **state) {
        char name[VM_CREDENTIAL_NAME_MAX + 1];
        VmCmdlineSpec spec;

        /* The limits themselves are accepted. */
        spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.cpus = 1;
        spec.memory_mib = VM_MEMORY_MIB_MIN;
        spec.cid = VM_CID_MIN;
        assert_ok(vm_cmdline_spec_validate(&spec, NULL));
        spec.cpus = VM_CPUS_MAX;
        spec.cid = VM_CID_MAX;
        assert_ok(vm_cmdline_spec_validate(&spec, NULL));

        /* A dir whose qmp.sock just fits, and sockets of exactly 107 bytes. */
        spec = spec_new(VM_PHASE_INSTALL, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);
        spec.dir = LONG_DIR_98;
        spec.net_socket = LONG_DIR_98 "/123.sock";
        spec.vsock_socket = LONG_DIR_98 "/123.sock";
        spec.tpm_socket = LONG_DIR_98 "/123.sock";
        assert_int_equal(strlen(spec.net_socket), VM_UNIX_PATH_MAX);
        assert_ok(vm_cmdline_spec_validate(&spec, NULL));

        /* Upper-case MACs, names of 255 characters with spaces and dots. */
        memset(name, 'n', sizeof(name) - 1);
        name[0] = '.';
        name[1] = ' ';
        name[sizeof(name) - 1] = 0;
        {
                const VmCredential c[] = { { name, "" }, { "x", "y" } };

                spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_KVM, VM_VSOCK_VHOST);
                spec.mac = "02:AB:CD:EF:00:0E";
                spec.credentials = c;
                spec.n_credentials = ELEMENTSOF(c);
                assert_ok(vm_cmdline_spec_validate(&spec, NULL));
        }

        /* No credentials at all. */
        spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.credentials = NULL;
        spec.n_credentials = 0;
        assert_ok(vm_cmdline_spec_validate(&spec, NULL));

        /* vhost-vsock ignores vsock_socket, vhost-user ignores cid. */
        spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_KVM, VM_VSOCK_VHOST);
        spec.vsock_socket = "relative";
        assert_ok(vm_cmdline_spec_validate(&spec, NULL));
        spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_KVM, VM_VSOCK_VHOST_USER);
        spec.cid = 0;
        assert_ok(vm_cmdline_spec_validate(&spec, NULL));
}

static void test_boot_ignores_installer(void **state) {
        _cleanup_strv_free_ char **argv = NULL;
        VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_KVM, VM_VSOCK_VHOST);

        /* The installer's files may stay in the spec; phase boot neither checks nor passes them. */
        spec.uki = "not even absolute";
        spec.image_raw = IMAGE ".raw";
        assert_ok(vm_cmdline_build(&spec, &argv));
        assert_false(strv_contains(argv, "-kernel"));
        assert_false(strv_contains(argv, "-no-reboot"));
        assert_false(strv_has_prefix(argv, "if=none,id=installer,"));
        assert_true(strv_contains(argv, "virtio-blk-pci,drive=target,serial=target,bootindex=0"));
}

static void test_no_tpm(void **state) {
        _cleanup_strv_free_ char **argv = NULL;
        VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);

        spec.tpm_socket = NULL;
        assert_ok(vm_cmdline_build(&spec, &argv));
        assert_false(strv_contains(argv, "-tpmdev"));
        assert_false(strv_has_prefix(argv, "socket,id=chrtpm,"));
}

static void test_credential_encoding(void **state) {
        static const struct {
                const char *value, *arg;
        } table[] = {
                { "", "type=11,value=io.systemd.credential:c=" },
                { "a b~", "type=11,value=io.systemd.credential:c=a b~" },
                { "a,b", "type=11,value=io.systemd.credential:c=a,,b" },
                { "\n", "type=11,value=io.systemd.credential.binary:c=Cg==" },
                { "a\n", "type=11,value=io.systemd.credential.binary:c=YQo=" },
                { "ab\n", "type=11,value=io.systemd.credential.binary:c=YWIK" },
                { "\t", "type=11,value=io.systemd.credential.binary:c=CQ==" },
                { "\x7f", "type=11,value=io.systemd.credential.binary:c=fw==" },
                { "é", "type=11,value=io.systemd.credential.binary:c=w6k=" },
                { "\xff\xfe\xfd", "type=11,value=io.systemd.credential.binary:c=//79" },
                { "\xfb\xef", "type=11,value=io.systemd.credential.binary:c=++8=" },
        };

        for (size_t i = 0; i < ELEMENTSOF(table); i++) {
                _cleanup_strv_free_ char **argv = NULL;
                const VmCredential c[] = { { "c", table[i].value } };
                VmCmdlineSpec spec = spec_new(VM_PHASE_BOOT, VM_ACCEL_TCG, VM_VSOCK_VHOST_USER);

                spec.credentials = c;
                spec.n_credentials = 1;
                assert_ok(vm_cmdline_build(&spec, &argv));
                if (!strv_contains(argv, table[i].arg))
                        fail_msg("no argument '%s' for value #%zu", table[i].arg, i);
        }
}

static void test_swtpm_invalid(void **state) {
        _cleanup_strv_free_ char **argv = NULL;
        char **sentinel = (char **) &sentinel, **out = sentinel;

        assert_errno(vm_swtpm_cmdline_build(NULL, "/t", "/t/s.sock", NULL, &out), -EINVAL);
        assert_errno(vm_swtpm_cmdline_build("swtpm", "t", "/t/s.sock", NULL, &out), -EINVAL);
        assert_errno(vm_swtpm_cmdline_build("swtpm", "/a,b/t", "/t/s.sock", NULL, &out), -EINVAL);
        assert_errno(vm_swtpm_cmdline_build("swtpm", "/t", "/a,b/s.sock", NULL, &out), -EINVAL);
        assert_errno(vm_swtpm_cmdline_build("swtpm", "/t", LONG_SOCKET, NULL, &out), -EINVAL);
        assert_errno(vm_swtpm_cmdline_build("swtpm", "/t", "/t/s.sock", "/a,b/log", &out), -EINVAL);
        assert_errno(vm_swtpm_cmdline_build("swtpm", "/t", "/t/s.sock", "log", &out), -EINVAL);
        assert_errno(vm_swtpm_cmdline_build("swtpm", "/t\n", "/t/s.sock", NULL, &out), -EINVAL);
        assert_ptr_equal(out, sentinel);

        /* Without a log file swtpm logs to its output, which the caller redirects. */
        assert_ok(vm_swtpm_cmdline_build("swtpm", "/t", "/t/s.sock", NULL, &argv));
        assert_string_equal(argv[8], "--log");
        assert_string_equal(argv[9], "level=2");
        assert_null(argv[10]);
}

static void test_vhost_device_vsock_invalid(void **state) {
        /* 96 bytes + "_4294967295" = 107: the longest uds path. */
        static const char uds_max[] = LONG_DIR_98;
        _cleanup_strv_free_ char **argv = NULL;
        char **sentinel = (char **) &sentinel, **out = sentinel;
        char uds[sizeof(uds_max)];

        memcpy(uds, uds_max, sizeof(uds));
        uds[96] = 0;

        assert_errno(vm_vhost_user_vsock_cmdline_build(NULL, 3, "/v.sock", "/u", &out), -EINVAL);
        assert_errno(vm_vhost_user_vsock_cmdline_build("v", 2, "/v.sock", "/u", &out), -EINVAL);
        assert_errno(vm_vhost_user_vsock_cmdline_build("v", UINT32_MAX, "/v.sock", "/u", &out), -EINVAL);
        assert_errno(vm_vhost_user_vsock_cmdline_build("v", 3, "v.sock", "/u", &out), -EINVAL);
        assert_errno(vm_vhost_user_vsock_cmdline_build("v", 3, LONG_SOCKET, "/u", &out), -EINVAL);
        assert_errno(vm_vhost_user_vsock_cmdline_build("v", 3, "/v.sock", "u", &out), -EINVAL);
        assert_errno(vm_vhost_user_vsock_cmdline_build("v", 3, "/v.sock", LONG_DIR_98, &out), -EINVAL);
        assert_ptr_equal(out, sentinel);

        assert_ok(vm_vhost_user_vsock_cmdline_build("v", VM_CID_MAX, "/a,b/v.sock", uds, &argv));
        assert_string_equal(argv[2], "4294967294");
        assert_string_equal(argv[4], "/a,b/v.sock"); /* its own argument: no escaping needed */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_golden_install_kvm_vhost),
                cmocka_unit_test(test_golden_install_tcg_vhost_user),
                cmocka_unit_test(test_golden_boot_tcg_vhost_user_firstboot),
                cmocka_unit_test(test_golden_boot_kvm_vhost),
                cmocka_unit_test(test_golden_boot_tcg_vhost),
                cmocka_unit_test(test_golden_boot_tcg_no_vsock),
                cmocka_unit_test(test_nic_mtu),
                cmocka_unit_test(test_tb_size),
                cmocka_unit_test(test_balloon),
                cmocka_unit_test(test_golden_commas),
                cmocka_unit_test(test_golden_swtpm),
                cmocka_unit_test(test_golden_vhost_device_vsock),
                cmocka_unit_test(test_escape),
                cmocka_unit_test(test_enum_strings),
                cmocka_unit_test(test_validate_strings),
                cmocka_unit_test(test_validate_numbers),
                cmocka_unit_test(test_validate_credentials),
                cmocka_unit_test(test_validate_edges),
                cmocka_unit_test(test_boot_ignores_installer),
                cmocka_unit_test(test_no_tpm),
                cmocka_unit_test(test_credential_encoding),
                cmocka_unit_test(test_swtpm_invalid),
                cmocka_unit_test(test_vhost_device_vsock_invalid),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
