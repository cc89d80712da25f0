/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <ftw.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "host-probe.h"
#include "time-util.h"

/* Every test builds a fake host in a temporary directory: <base>/root is the probe's root (dev/, proc/,
 * sys/, run/), <base>/bin its $PATH (shell scripts standing in for the tools), <base>/OVMF_CODE.fd the
 * firmware. */
typedef struct Fixture {
        char *base;
        char *root;
        char *bin;
        char *fw;
} Fixture;

#define SHA256_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

#define QEMU_OK \
        "printf 'QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)\\nCopyright (c) 2003-2022\\n'\n"
#define SWTPM_OK "echo 'TPM emulator version 0.7.1, Copyright (c) 2014-2022 IBM Corp. and others'\n"
#define SYSTEMCTL_OK "echo 'systemd 252 (252.39-1~deb12u1)'; echo '+PAM +AUDIT +SELINUX'\n"
/* dpkg-query as Debian's answers for the fake firmware; checks it gets the arguments verbatim. */
#define DPKG_QUERY_OK                                                                     \
        "case \"$1\" in\n"                                                                \
        "--search) echo \"ovmf, qemu-efi-x86: $2\" ;;\n"                                  \
        "--show) [ \"$2\" = '--showformat=${Version}' ] && [ \"$3\" = ovmf ] || exit 1\n" \
        "        printf '2022.11-6+deb12u2' ;;\n"                                         \
        "*) exit 2 ;;\n"                                                                  \
        "esac\n"

static char *join(const char *a, const char *b) {
        char *s;

        assert_true(asprintf(&s, "%s/%s", a, b) >= 0);
        return s;
}

/* Writes rel below dir with content and mode, creating the parents. */
static void put(const char *dir, const char *rel, const char *content, mode_t mode) {
        _cleanup_free_ char *p = join(dir, rel), *parent = strdup(p);

        assert_non_null(parent);
        *strrchr(parent, '/') = 0;
        assert_ok(mkdir_p(parent, 0755));
        assert_ok(write_file_atomic(p, content, strlen(content), mode));
}

static void mkdir_in(const char *dir, const char *rel) {
        _cleanup_free_ char *p = join(dir, rel);

        assert_ok(mkdir_p(p, 0755));
}

static void rm_in(const char *dir, const char *rel) {
        _cleanup_free_ char *p = join(dir, rel);

        assert_ok(RET_NERRNO(unlink(p)));
}

static void tool(Fixture *f, const char *name, const char *body) {
        _cleanup_free_ char *script = NULL;

        assert_true(asprintf(&script, "#!/bin/sh\n%s", body) >= 0);
        put(f->bin, name, script, 0755);
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        char tmpl[] = "/tmp/test-host-probe.XXXXXX";

        assert_non_null(f);
        assert_non_null(mkdtemp(tmpl));
        f->base = strdup(tmpl);
        assert_non_null(f->base);
        f->root = join(f->base, "root");
        f->bin = join(f->base, "bin");
        f->fw = join(f->base, "OVMF_CODE.fd");
        mkdir_in(f->base, "root");
        mkdir_in(f->base, "bin");
        *state = f;
        return 0;
}

static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
        return remove(path);
}

static int teardown(void **state) {
        Fixture *f = *state;

        (void) nftw(f->base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(f->base);
        free(f->root);
        free(f->bin);
        free(f->fw);
        free(f);
        return 0;
}

/* A host where everything works: hardware KVM, vhost-vsock, all tools, firmware known to dpkg. */
static void good_host(Fixture *f) {
        put(f->root, "dev/kvm", "", 0666);
        put(f->root, "dev/vhost-vsock", "", 0666);
        put(f->root, "proc/sys/kernel/osrelease", "6.1.0-99-amd64\n", 0444);
        put(f->root, "proc/meminfo", "MemTotal:        2048 kB\nMemFree:          1024 kB\n", 0444);
        mkdir_in(f->root, "sys/module/kvm_intel/parameters");
        mkdir_in(f->root, "sys/module/kvm");
        tool(f, "qemu-system-x86_64", QEMU_OK);
        tool(f, "swtpm", SWTPM_OK);
        tool(f, "systemctl", SYSTEMCTL_OK);
        tool(f, "dpkg-query", DPKG_QUERY_OK);
        put(f->base, "OVMF_CODE.fd", "abc", 0644);
}

static HostProbe *probe_notify(Fixture *f, HostAccel accel, HostNotify notify) {
        HostProbe *p = NULL;
        HostProbeConfig cfg = {
                .ovmf_code = f->fw,
                .accel = accel,
                .notify = notify,
                .root = f->root,
                .path = f->bin,
        };

        assert_ok(host_probe_new(&p, &cfg));
        assert_non_null(p);
        return p;
}

static HostProbe *probe(Fixture *f, HostAccel accel) {
        return probe_notify(f, accel, HOST_NOTIFY_AUTO);
}

/* The keys of o, comma-separated, in order. */
static char *keys(json_t *o) {
        char *s = strdup(""), *n;
        const char *k;
        json_t *v;

        assert_non_null(o);
        assert_true(json_is_object(o));
        json_object_foreach(o, k, v) {
                assert_true(asprintf(&n, "%s%s%s", s, *s ? "," : "", k) >= 0);
                free(s);
                s = n;
        }
        return s;
}

/* The strings of array a, joined with '|'. */
static char *strings(json_t *a) {
        char *s = strdup(""), *n;
        size_t i;
        json_t *v;

        assert_true(json_is_array(a));
        json_array_foreach(a, i, v) {
                assert_true(json_is_string(v));
                assert_true(asprintf(&n, "%s%s%s", s, i > 0 ? "|" : "", json_string_value(v)) >= 0);
                free(s);
                s = n;
        }
        return s;
}

static const char *str(json_t *o, const char *path1, const char *path2) {
        json_t *v = json_object_get(o, path1);

        if (path2)
                v = json_object_get(v, path2);
        return json_string_value(v);
}

#define assert_keys(o, expected)                   \
        do {                                       \
                _cleanup_free_ char *_k = keys(o); \
                assert_string_equal(_k, expected); \
        } while (0)

#define assert_missing(o, expected)                                               \
        do {                                                                      \
                _cleanup_free_ char *_m = strings(json_object_get(o, "missing")); \
                assert_string_equal(_m, expected);                                \
        } while (0)

static void test_accel_strings(void **state) {
        assert_string_equal(host_accel_to_string(HOST_ACCEL_AUTO), "auto");
        assert_string_equal(host_accel_to_string(HOST_ACCEL_KVM), "kvm");
        assert_string_equal(host_accel_to_string(HOST_ACCEL_TCG), "tcg");
        assert_null(host_accel_to_string(_HOST_ACCEL_MAX));
        assert_null(host_accel_to_string(_HOST_ACCEL_INVALID));
        assert_int_equal(host_accel_from_string("auto"), HOST_ACCEL_AUTO);
        assert_int_equal(host_accel_from_string("kvm"), HOST_ACCEL_KVM);
        assert_int_equal(host_accel_from_string("tcg"), HOST_ACCEL_TCG);
        assert_int_equal(host_accel_from_string("KVM"), _HOST_ACCEL_INVALID);
        assert_int_equal(host_accel_from_string(""), _HOST_ACCEL_INVALID);
        assert_int_equal(host_accel_from_string(NULL), _HOST_ACCEL_INVALID);
}

static void test_bad_config(void **state) {
        HostProbe *p = NULL;
        HostProbeConfig cfg = { .accel = _HOST_ACCEL_MAX };

        assert_errno(host_probe_new(&p, &cfg), -EINVAL);
        cfg.accel = _HOST_ACCEL_INVALID;
        assert_errno(host_probe_new(&p, &cfg), -EINVAL);
        assert_errno(host_probe_new(&p, NULL), -EINVAL);
        assert_null(p);
        assert_null(host_probe_free(NULL));
        assert_null(host_probe_to_json(NULL));
        assert_null(host_probe_firmware_summary(NULL));
}

static void test_ready_host(void **state) {
        Fixture *f = *state;
        struct utsname u;
        cpu_set_t cpus;
        const char *reason = NULL;

        good_host(f);
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_AUTO);
        json_auto_t *o = host_probe_to_json(p);

        assert_keys(
                o,
                "hostname,kernel,cpus,memoryBytes,kvm,vhostVsock,ksm,qemu,swtpm,systemd,ovmfCode,firmware,"
                "storageProviders,accelerator,notify,ready");
        assert_ok(RET_NERRNO(uname(&u)));
        assert_string_equal(str(o, "hostname", NULL), u.nodename);
        assert_string_equal(str(o, "kernel", NULL), "6.1.0-99-amd64");
        assert_ok(RET_NERRNO(sched_getaffinity(0, sizeof(cpus), &cpus)));
        assert_int_equal(json_integer_value(json_object_get(o, "cpus")), CPU_COUNT(&cpus));
        assert_int_equal(json_integer_value(json_object_get(o, "memoryBytes")), 2048 * 1024);

        assert_keys(json_object_get(o, "kvm"), "path,accessible");
        assert_string_equal(str(o, "kvm", "path"), "/dev/kvm");
        assert_true(json_is_true(json_object_get(json_object_get(o, "kvm"), "accessible")));
        assert_keys(json_object_get(o, "vhostVsock"), "path,accessible");
        assert_string_equal(str(o, "vhostVsock", "path"), "/dev/vhost-vsock");

        assert_keys(json_object_get(o, "qemu"), "found,version");
        assert_true(json_is_true(json_object_get(json_object_get(o, "qemu"), "found")));
        assert_string_equal(str(o, "qemu", "version"), "7.2.19");
        assert_string_equal(str(o, "swtpm", "version"), "0.7.1");
        assert_string_equal(str(o, "systemd", "version"), "252");

        assert_string_equal(str(o, "ovmfCode", NULL), f->fw);
        assert_keys(json_object_get(o, "firmware"), "sha256,package,version");
        assert_string_equal(str(o, "firmware", "sha256"), SHA256_ABC);
        assert_string_equal(str(o, "firmware", "package"), "ovmf");
        assert_string_equal(str(o, "firmware", "version"), "2022.11-6+deb12u2");
        assert_string_equal(
                host_probe_firmware_summary(p), "sha256 " SHA256_ABC " (package ovmf 2022.11-6+deb12u2)");

        assert_true(json_is_array(json_object_get(o, "storageProviders")));
        assert_int_equal(json_array_size(json_object_get(o, "storageProviders")), 0);

        assert_keys(json_object_get(o, "accelerator"), "selected,requested,reason");
        assert_string_equal(str(o, "accelerator", "selected"), "kvm");
        assert_string_equal(str(o, "accelerator", "requested"), "auto");
        assert_string_equal(str(o, "accelerator", "reason"), HOST_ACCEL_REASON_KVM_INTEL);
        assert_keys(json_object_get(o, "notify"), "transport,requested,reason");
        /* /dev/vhost-vsock opens: the kernel's transport, routed by CID */
        assert_string_equal(str(o, "notify", "transport"), "vhost-vsock");
        assert_string_equal(str(o, "notify", "requested"), "auto");
        assert_int_equal(host_probe_notify(p, &reason), HOST_NOTIFY_VHOST);
        assert_string_equal(reason, HOST_NOTIFY_REASON_VHOST);
        assert_int_equal(host_probe_accel(p, &reason), HOST_ACCEL_KVM);
        assert_string_equal(reason, HOST_ACCEL_REASON_KVM_INTEL);

        assert_true(json_is_true(json_object_get(o, "ready")));
        assert_null(json_object_get(o, "missing"));
}

/* Our CI machines: /dev/kvm opens, but it is PVM. auto must not pick it, and must say so. */
/* KSM below the probe's root: absent, then off with its figures. */
static void test_ksm(void **state) {
        Fixture *f = *state;
        json_auto_t *o = NULL, *o2 = NULL;
        HostKsm k;

        good_host(f);
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_AUTO);

        o = host_probe_to_json(p);
        assert_non_null(o);
        assert_false(json_is_true(json_object_get(json_object_get(o, "ksm"), "available")));
        assert_ok(host_probe_ksm(p, &k));
        assert_false(k.available);

        mkdir_in(f->root, "sys/kernel/mm/ksm");
        put(f->root, "sys/kernel/mm/ksm/run", "0\n", 0644);
        put(f->root, "sys/kernel/mm/ksm/pages_shared", "2\n", 0644);
        put(f->root, "sys/kernel/mm/ksm/pages_sharing", "10\n", 0644);
        put(f->root, "sys/kernel/mm/ksm/pages_unshared", "0\n", 0644);
        put(f->root, "sys/kernel/mm/ksm/pages_volatile", "0\n", 0644);
        put(f->root, "sys/kernel/mm/ksm/full_scans", "1\n", 0644);
        o2 = host_probe_to_json(p);
        assert_non_null(o2);
        assert_true(json_is_true(json_object_get(json_object_get(o2, "ksm"), "available")));
        assert_int_equal(
                json_integer_value(json_object_get(json_object_get(o2, "ksm"), "savedBytes")),
                10 * sysconf(_SC_PAGESIZE));
        assert_ok(host_probe_ksm(p, &k));
        assert_int_equal(k.pages_shared, 2);
}

static void test_pvm_auto_picks_tcg(void **state) {
        Fixture *f = *state;
        const char *reason = NULL;

        good_host(f);
        _cleanup_free_ char *intel = join(f->root, "sys/module/kvm_intel/parameters"),
                            *intel_dir = join(f->root, "sys/module/kvm_intel");
        assert_ok(RET_NERRNO(rmdir(intel)));
        assert_ok(RET_NERRNO(rmdir(intel_dir)));
        mkdir_in(f->root, "sys/module/kvm_pvm/parameters");

        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_AUTO);
        json_auto_t *o = host_probe_to_json(p);

        assert_true(json_is_true(json_object_get(json_object_get(o, "kvm"), "accessible")));
        assert_string_equal(str(o, "accelerator", "selected"), "tcg");
        assert_string_equal(str(o, "accelerator", "requested"), "auto");
        assert_string_equal(str(o, "accelerator", "reason"), HOST_ACCEL_REASON_PVM);
        assert_contains(str(o, "accelerator", "reason"), "PVM (kvm_pvm)");
        assert_contains(str(o, "accelerator", "reason"), "TCG");
        assert_int_equal(host_probe_accel(p, &reason), HOST_ACCEL_TCG);
        assert_string_equal(reason, HOST_ACCEL_REASON_PVM);

        assert_true(json_is_false(json_object_get(o, "ready")));
        assert_missing(o, "/dev/kvm: KVM cannot run standard guests here (PVM); VMs use TCG");

        /* A hardware backend next to kvm_pvm wins. */
        mkdir_in(f->root, "sys/module/kvm_amd");
        json_decref(o);
        o = host_probe_to_json(p);
        assert_string_equal(str(o, "accelerator", "selected"), "kvm");
        assert_string_equal(str(o, "accelerator", "reason"), HOST_ACCEL_REASON_KVM_AMD);
        assert_true(json_is_true(json_object_get(o, "ready")));
}

static void test_forced_accels(void **state) {
        Fixture *f = *state;
        const char *reason = NULL;

        good_host(f);
        mkdir_in(f->root, "sys/module/kvm_pvm");

        _cleanup_(host_probe_freep) HostProbe *tcg = probe(f, HOST_ACCEL_TCG);
        json_auto_t *o = host_probe_to_json(tcg);
        assert_string_equal(str(o, "accelerator", "selected"), "tcg");
        assert_string_equal(str(o, "accelerator", "requested"), "tcg");
        assert_string_equal(str(o, "accelerator", "reason"), HOST_ACCEL_REASON_REQUESTED_TCG);
        assert_true(json_is_true(json_object_get(o, "ready")));

        /* kvm is honoured even without /dev/kvm, and the report says what is missing. */
        rm_in(f->root, "dev/kvm");
        _cleanup_(host_probe_freep) HostProbe *kvm = probe(f, HOST_ACCEL_KVM);
        json_auto_t *k = host_probe_to_json(kvm);
        assert_string_equal(str(k, "accelerator", "selected"), "kvm");
        assert_string_equal(str(k, "accelerator", "requested"), "kvm");
        assert_string_equal(str(k, "accelerator", "reason"), HOST_ACCEL_REASON_REQUESTED_KVM_INACCESSIBLE);
        assert_keys(json_object_get(k, "kvm"), "path,accessible,error");
        assert_string_equal(str(k, "kvm", "error"), "no such file or directory");
        assert_true(json_is_false(json_object_get(k, "ready")));
        assert_missing(k, "/dev/kvm");
        assert_int_equal(host_probe_accel(kvm, &reason), HOST_ACCEL_KVM);

        /* Devices are re-read on every call. */
        put(f->root, "dev/kvm", "", 0666);
        json_decref(k);
        k = host_probe_to_json(kvm);
        assert_true(json_is_true(json_object_get(k, "ready")));
        assert_string_equal(str(k, "accelerator", "reason"), HOST_ACCEL_REASON_REQUESTED_KVM);
        assert_null(json_object_get(k, "missing"));
}

/* No /dev/kvm at all: auto quietly uses TCG, which is not a missing prerequisite. */
static void test_auto_without_kvm(void **state) {
        Fixture *f = *state;
        const char *reason = NULL;

        good_host(f);
        rm_in(f->root, "dev/kvm");
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_AUTO);
        json_auto_t *o = host_probe_to_json(p);

        assert_string_equal(str(o, "accelerator", "selected"), "tcg");
        assert_string_equal(str(o, "accelerator", "reason"), HOST_ACCEL_REASON_NO_KVM);
        assert_int_equal(host_probe_accel(p, &reason), HOST_ACCEL_TCG);
        assert_string_equal(reason, HOST_ACCEL_REASON_NO_KVM);
        assert_true(json_is_true(json_object_get(o, "ready")));

        /* An accessible /dev/kvm with no known backend is not trusted either. */
        put(f->root, "dev/kvm", "", 0666);
        _cleanup_free_ char *a = join(f->root, "sys/module/kvm_intel/parameters"),
                            *b = join(f->root, "sys/module/kvm_intel");
        assert_ok(RET_NERRNO(rmdir(a)));
        assert_ok(RET_NERRNO(rmdir(b)));
        assert_int_equal(host_probe_accel(p, &reason), HOST_ACCEL_TCG);
        assert_string_equal(reason, HOST_ACCEL_REASON_NO_BACKEND);
}

/* Nothing there: every prerequisite missing, in check order; systemd never counts. */
static void test_missing_order(void **state) {
        Fixture *f = *state;

        mkdir_in(f->root, "dev/vhost-vsock"); /* a directory cannot be opened O_RDWR */
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_KVM);
        json_auto_t *o = host_probe_to_json(p);

        assert_keys(
                o,
                "hostname,kernel,cpus,memoryBytes,kvm,vhostVsock,ksm,qemu,swtpm,systemd,storageProviders,accelerator,"
                "notify,ready,missing");
        assert_string_equal(str(o, "kernel", NULL), "");
        assert_int_equal(json_integer_value(json_object_get(o, "memoryBytes")), 0);
        assert_string_equal(str(o, "kvm", "error"), "no such file or directory");
        assert_string_equal(str(o, "vhostVsock", "error"), "is a directory");
        assert_keys(json_object_get(o, "qemu"), "found,error");
        assert_true(json_is_false(json_object_get(json_object_get(o, "qemu"), "found")));
        assert_string_equal(str(o, "qemu", "error"), "qemu-system-x86_64: executable file not found in $PATH");
        assert_string_equal(str(o, "swtpm", "error"), "swtpm: executable file not found in $PATH");
        assert_string_equal(str(o, "systemd", "error"), "systemctl: executable file not found in $PATH");
        assert_null(host_probe_firmware_summary(p));

        assert_true(json_is_false(json_object_get(o, "ready")));
        _cleanup_free_ char *expected = NULL;
        assert_true(
                asprintf(
                        &expected,
                        "/dev/kvm|/dev/vhost-vsock: vhost-user-vsock fallback needs vhost-device-vsock|"
                        "qemu-system-x86_64|swtpm|OVMF code image %s",
                        f->fw) >= 0);
        assert_missing(o, expected);
}

static void test_no_firmware_configured(void **state) {
        Fixture *f = *state;
        HostProbe *p = NULL;
        HostProbeConfig cfg = { .accel = HOST_ACCEL_TCG, .root = f->root, .path = f->bin };

        good_host(f);
        assert_ok(host_probe_new(&p, &cfg));
        json_auto_t *o = host_probe_to_json(p);
        assert_null(json_object_get(o, "ovmfCode"));
        assert_null(json_object_get(o, "firmware"));
        assert_missing(o, "OVMF code image");
        assert_null(host_probe_firmware_summary(p));
        host_probe_free(p);

        /* A directory is not a firmware image. */
        cfg.ovmf_code = f->bin;
        assert_ok(host_probe_new(&p, &cfg));
        json_decref(o);
        o = host_probe_to_json(p);
        assert_null(json_object_get(o, "ovmfCode"));
        _cleanup_free_ char *expected = NULL;
        assert_true(asprintf(&expected, "OVMF code image %s", f->bin) >= 0);
        assert_missing(o, expected);
        host_probe_free(p);
}

/* A QEMU older than 8 gets a warning at start (7.2's multi-threaded TCG crashes guests now and then);
 * QEMU 10 none. */
static void test_old_qemu_warns(void **state) {
        Fixture *f = *state;
        HostProbe *p = NULL;
        HostProbeConfig cfg = { .accel = HOST_ACCEL_TCG, .root = f->root, .path = f->bin };
        TestCapture c;

        good_host(f);
        test_capture_start(&c);
        int r = host_probe_new(&p, &cfg);
        _cleanup_free_ char *old = test_capture_end(&c);
        assert_ok(r);
        assert_contains(old, "QEMU 7.2.19: under TCG (no usable KVM) it has killed guest kernels");
        host_probe_free(p);

        tool(f,
             "qemu-system-x86_64",
             "echo 'QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)'\n");
        test_capture_start(&c);
        r = host_probe_new(&p, &cfg);
        _cleanup_free_ char *new = test_capture_end(&c);
        assert_ok(r);
        assert_null(strstr(new, "it has killed guest kernels"));
        json_auto_t *o = host_probe_to_json(p);
        assert_string_equal(str(o, "qemu", "version"), "10.0.2");
        host_probe_free(p);
}

/* With vhost-device-vsock on $PATH, a missing /dev/vhost-vsock is reported but not missing. */
static void test_vhost_user_vsock_fallback(void **state) {
        Fixture *f = *state;

        good_host(f);
        rm_in(f->root, "dev/vhost-vsock");
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_AUTO);
        json_auto_t *o = host_probe_to_json(p);
        assert_true(json_is_false(json_object_get(json_object_get(o, "vhostVsock"), "accessible")));
        assert_missing(o, HOST_PROBE_MISSING_VSOCK);
        assert_string_equal(str(o, "notify", "transport"), "none");

        tool(f, "vhost-device-vsock", "exit 0\n");
        json_decref(o);
        o = host_probe_to_json(p);
        assert_true(json_is_false(json_object_get(json_object_get(o, "vhostVsock"), "accessible")));
        assert_string_equal(str(o, "vhostVsock", "error"), "no such file or directory");
        assert_true(json_is_true(json_object_get(o, "ready")));
        assert_null(json_object_get(o, "missing"));
        /* and READY=1 goes that way */
        assert_string_equal(str(o, "notify", "transport"), "vhost-user-vsock");
}

/* --vsock forces a transport; one that cannot work here is named in "missing". */
static void test_forced_notify(void **state) {
        Fixture *f = *state;
        const char *reason = NULL;

        good_host(f);
        rm_in(f->root, "dev/vhost-vsock");
        {
                _cleanup_(host_probe_freep) HostProbe *p = probe_notify(f, HOST_ACCEL_AUTO, HOST_NOTIFY_VHOST);
                json_auto_t *o = host_probe_to_json(p);
                assert_string_equal(str(o, "notify", "transport"), "vhost-vsock");
                assert_string_equal(str(o, "notify", "requested"), "vhost");
                assert_missing(o, HOST_PROBE_MISSING_VHOST_VSOCK);
                assert_int_equal(host_probe_notify(p, &reason), HOST_NOTIFY_VHOST);
                assert_string_equal(reason, HOST_NOTIFY_REASON_REQUESTED_VHOST);
        }
        {
                _cleanup_(host_probe_freep)
                        HostProbe *p = probe_notify(f, HOST_ACCEL_AUTO, HOST_NOTIFY_VHOST_USER);
                json_auto_t *o = host_probe_to_json(p);
                assert_string_equal(str(o, "notify", "transport"), "vhost-user-vsock");
                assert_missing(o, HOST_PROBE_MISSING_VSOCK_HELPER);
        }
        {
                /* none is never missing anything: the VMs just end up running */
                _cleanup_(host_probe_freep) HostProbe *p = probe_notify(f, HOST_ACCEL_AUTO, HOST_NOTIFY_NONE);
                json_auto_t *o = host_probe_to_json(p);
                assert_string_equal(str(o, "notify", "transport"), "none");
                assert_string_equal(str(o, "notify", "reason"), HOST_NOTIFY_REASON_REQUESTED_NONE);
                assert_true(json_is_true(json_object_get(o, "ready")));
        }

        assert_int_equal(host_notify_from_string("vhost-user"), HOST_NOTIFY_VHOST_USER);
        assert_int_equal(host_notify_from_string("vsock"), _HOST_NOTIFY_INVALID);
        assert_string_equal(host_notify_transport_name(HOST_NOTIFY_VHOST), "vhost-vsock");
        assert_null(host_notify_to_string(_HOST_NOTIFY_MAX));
}

static void test_tool_failures(void **state) {
        Fixture *f = *state;

        good_host(f);
        tool(f, "qemu-system-x86_64", "echo 'qemu: boom' >&2; echo second line >&2; exit 3\n");
        tool(f, "swtpm", "echo 'swtpm 0.8.0'\n"); /* no "version" marker: found, no version */
        tool(f, "systemctl", "kill -KILL $$\n");
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_TCG);
        json_auto_t *o = host_probe_to_json(p);

        assert_keys(json_object_get(o, "qemu"), "found,error");
        assert_string_equal(str(o, "qemu", "error"), "qemu-system-x86_64: exit status 3: qemu: boom");
        assert_keys(json_object_get(o, "swtpm"), "found");
        assert_true(json_is_true(json_object_get(json_object_get(o, "swtpm"), "found")));
        assert_string_equal(str(o, "systemd", "error"), "systemctl: signal: killed");
        assert_missing(o, "qemu-system-x86_64");

        /* Version parsing: trailing ',' / ';' go, bytes that are not UTF-8 become '?'. */
        tool(f, "qemu-system-x86_64", "echo\n");
        tool(f, "swtpm", "printf '  swtpm   version  0.8.0;,  \\n'\n");
        tool(f, "systemctl", "printf 'systemd 25\\377 (x)\\n'\n");
        _cleanup_(host_probe_freep) HostProbe *q = probe(f, HOST_ACCEL_TCG);
        json_auto_t *v = host_probe_to_json(q);
        assert_keys(json_object_get(v, "qemu"), "found");
        assert_string_equal(str(v, "swtpm", "version"), "0.8.0");
        assert_string_equal(str(v, "systemd", "version"), "25?");
        assert_true(json_is_true(json_object_get(v, "ready")));
}

/* More than the 64 KiB the probe keeps: drained, not blocking, the first line still counts. */
static void test_tool_large_output(void **state) {
        Fixture *f = *state;

        good_host(f);
        tool(f,
             "qemu-system-x86_64",
             "echo 'QEMU emulator version 9.9.9'; i=0; while [ $i -lt 3000 ]; do "
             "echo 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'; "
             "i=$((i+1)); done\n");
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_TCG);
        json_auto_t *o = host_probe_to_json(p);
        assert_string_equal(str(o, "qemu", "version"), "9.9.9");
}

static void test_tool_timeout(void **state) {
        Fixture *f = *state;

        good_host(f);
        tool(f, "swtpm", "echo 'TPM emulator version 0.7.1'; sleep 10\n");
        usec_t start = now_usec(CLOCK_MONOTONIC);
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_TCG);
        usec_t elapsed = now_usec(CLOCK_MONOTONIC) - start;

        assert_true(elapsed >= HOST_PROBE_TOOL_TIMEOUT_USEC - 100 * USEC_PER_MSEC);
        assert_true(elapsed < HOST_PROBE_TOOL_TIMEOUT_USEC + 2 * USEC_PER_SEC);

        json_auto_t *o = host_probe_to_json(p);
        assert_keys(json_object_get(o, "swtpm"), "found,error");
        assert_string_equal(str(o, "swtpm", "error"), "swtpm: timed out after 5s");
        assert_string_equal(str(o, "qemu", "version"), "7.2.19");
        assert_missing(o, "swtpm");
}

static void test_storage_providers(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *target = NULL, *link = NULL;

        good_host(f);
        put(f->root, "run/systemd/io.systemd.StorageProvider/zeta", "", 0644);
        put(f->root, "run/systemd/io.systemd.StorageProvider/fs", "", 0644);
        mkdir_in(f->root, "run/systemd/io.systemd.StorageProvider/a-directory");
        /* A symlink is a non-directory entry, as Go's DirEntry.IsDir() sees it. */
        target = join(f->root, "run/systemd/io.systemd.StorageProvider/a-directory");
        link = join(f->root, "run/systemd/io.systemd.StorageProvider/link");
        assert_ok(RET_NERRNO(symlink(target, link)));

        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_TCG);
        json_auto_t *o = host_probe_to_json(p);
        _cleanup_free_ char *names = strings(json_object_get(o, "storageProviders"));
        assert_string_equal(names, "fs|link|zeta");
        assert_true(json_is_true(json_object_get(o, "ready")));
}

static void test_firmware_without_dpkg(void **state) {
        Fixture *f = *state;

        good_host(f);
        rm_in(f->bin, "dpkg-query");
        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_TCG);
        json_auto_t *o = host_probe_to_json(p);

        assert_string_equal(str(o, "ovmfCode", NULL), f->fw);
        assert_keys(json_object_get(o, "firmware"), "sha256,error");
        assert_string_equal(str(o, "firmware", "sha256"), SHA256_ABC);
        assert_string_equal(str(o, "firmware", "error"), "dpkg-query: executable file not found in $PATH");
        assert_string_equal(
                host_probe_firmware_summary(p),
                "sha256 " SHA256_ABC " (package unknown: dpkg-query: executable file not found in $PATH)");
        assert_true(json_is_true(json_object_get(o, "ready"))); /* the image is there: dpkg is optional */

        /* A file dpkg does not know. */
        tool(f, "dpkg-query", "echo \"dpkg-query: no path found matching pattern $2\" >&2; exit 1\n");
        _cleanup_(host_probe_freep) HostProbe *q = probe(f, HOST_ACCEL_TCG);
        json_auto_t *v = host_probe_to_json(q);
        _cleanup_free_ char *expected = NULL;
        assert_true(
                asprintf(
                        &expected,
                        "dpkg-query: exit status 1: dpkg-query: no path found matching pattern %s",
                        f->fw) >= 0);
        assert_string_equal(str(v, "firmware", "error"), expected);
}

/* A firmware image larger than one read chunk hashes like EVP does in one go. */
static void test_firmware_large_hash(void **state) {
        Fixture *f = *state;
        size_t size = 300 * 1024 + 7;
        _cleanup_free_ char *data = malloc(size + 1), *hex = malloc(2 * 32 + 1);
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned md_len = 0;

        good_host(f);
        assert_non_null(data);
        assert_non_null(hex);
        for (size_t i = 0; i < size; i++)
                data[i] = (char) ('a' + i % 23);
        data[size] = 0;
        put(f->base, "OVMF_CODE.fd", data, 0644);
        assert_int_equal(EVP_Digest(data, size, md, &md_len, EVP_sha256(), NULL), 1);
        assert_int_equal(md_len, 32);
        for (unsigned i = 0; i < md_len; i++)
                (void) snprintf(hex + 2 * i, 3, "%02x", md[i]);

        _cleanup_(host_probe_freep) HostProbe *p = probe(f, HOST_ACCEL_TCG);
        json_auto_t *o = host_probe_to_json(p);
        assert_string_equal(str(o, "firmware", "sha256"), hex);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_accel_strings),
                cmocka_unit_test(test_bad_config),
                cmocka_unit_test_setup_teardown(test_ready_host, setup, teardown),
                cmocka_unit_test_setup_teardown(test_ksm, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pvm_auto_picks_tcg, setup, teardown),
                cmocka_unit_test_setup_teardown(test_forced_accels, setup, teardown),
                cmocka_unit_test_setup_teardown(test_auto_without_kvm, setup, teardown),
                cmocka_unit_test_setup_teardown(test_missing_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_no_firmware_configured, setup, teardown),
                cmocka_unit_test_setup_teardown(test_old_qemu_warns, setup, teardown),
                cmocka_unit_test_setup_teardown(test_vhost_user_vsock_fallback, setup, teardown),
                cmocka_unit_test_setup_teardown(test_forced_notify, setup, teardown),
                cmocka_unit_test_setup_teardown(test_tool_failures, setup, teardown),
                cmocka_unit_test_setup_teardown(test_tool_large_output, setup, teardown),
                cmocka_unit_test_setup_teardown(test_tool_timeout, setup, teardown),
                cmocka_unit_test_setup_teardown(test_storage_providers, setup, teardown),
                cmocka_unit_test_setup_teardown(test_firmware_without_dpkg, setup, teardown),
                cmocka_unit_test_setup_teardown(test_firmware_large_hash, setup, teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
