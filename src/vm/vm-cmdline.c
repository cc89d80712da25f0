/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "hex-util.h"
#include "string-table.h"
#include "vm-cmdline.h"

static const char *const vm_phase_table[_VM_PHASE_MAX] = {
        [VM_PHASE_INSTALL] = "install",
        [VM_PHASE_BOOT] = "boot",
};

static const char *const vm_accel_table[_VM_ACCEL_MAX] = {
        [VM_ACCEL_KVM] = "kvm",
        [VM_ACCEL_TCG] = "tcg",
};

static const char *const vm_vsock_table[_VM_VSOCK_MAX] = {
        [VM_VSOCK_VHOST] = "vhost",
        [VM_VSOCK_VHOST_USER] = "vhost-user",
        [VM_VSOCK_NONE] = "none",
};

DEFINE_STRING_TABLE_LOOKUP(vm_phase, VmPhase);

DEFINE_STRING_TABLE_LOOKUP(vm_accel, VmAccel);

DEFINE_STRING_TABLE_LOOKUP(vm_vsock, VmVsock);

char *vm_cmdline_escape(const char *value) {
        size_t n = 0;
        char *buf, *q;

        assert(value);

        for (const char *p = value; *p; p++)
                n += *p == ',' ? 2 : 1;

        buf = malloc(n + 1);
        if (!buf)
                return NULL;

        q = buf;
        for (const char *p = value; *p; p++) {
                *q++ = *p;
                if (*p == ',')
                        *q++ = ',';
        }
        *q = 0;
        return buf;
}

/* A growing NULL-terminated argv. */
typedef struct Argv {
        char **items;
        size_t n;
} Argv;

static void argv_done(Argv *a) {
        a->items = strv_free(a->items);
        a->n = 0;
}

/* Appends s and takes ownership of it, also on failure; s == NULL means its allocation failed. */
static int argv_consume(Argv *a, char *s) {
        char **l;

        if (!s)
                return -ENOMEM;

        l = reallocarray(a->items, a->n + 2, sizeof(char *));
        if (!l) {
                free(s);
                return -ENOMEM;
        }

        l[a->n++] = s;
        l[a->n] = NULL;
        a->items = l;
        return 0;
}

static int argv_add(Argv *a, const char *s) {
        return argv_consume(a, strdup(s));
}

static int argv_addv(Argv *a, const char *format, va_list ap) _printf_(2, 0);
static int argv_addv(Argv *a, const char *format, va_list ap) {
        char *s;

        return argv_consume(a, vasprintf(&s, format, ap) < 0 ? NULL : s);
}

/* "<option> <value>": the common shape of a QEMU argument. */
static int argv_option(Argv *a, const char *option, const char *value) {
        int r;

        r = argv_add(a, option);
        if (r < 0)
                return r;

        return argv_add(a, value);
}

static int argv_optionf(Argv *a, const char *option, const char *format, ...) _printf_(3, 4);
static int argv_optionf(Argv *a, const char *option, const char *format, ...) {
        va_list ap;
        int r;

        r = argv_add(a, option);
        if (r < 0)
                return r;

        va_start(ap, format);
        r = argv_addv(a, format, ap);
        va_end(ap);
        return r;
}

/* "<option> <prefix><value with its commas doubled><suffix>". */
static int argv_option_escaped(
        Argv *a, const char *option, const char *prefix, const char *value, const char *suffix) {
        _cleanup_free_ char *e = NULL;

        e = vm_cmdline_escape(value);
        if (!e)
                return -ENOMEM;

        return argv_optionf(a, option, "%s%s%s", prefix, e, suffix);
}

static bool string_is_single_line(const char *s) {
        return !strpbrk(s, "\n\r");
}

/* Set, non-empty and on one line: what every string that ends up in an argument must be. */
static bool value_is_valid(const char *s) {
        return s && *s && string_is_single_line(s);
}

/* An absolute path: QEMU's block layer would read "host:path" relative names as a protocol. */
static bool path_is_valid(const char *s) {
        return value_is_valid(s) && s[0] == '/';
}

static bool socket_path_is_valid(const char *s) {
        return path_is_valid(s) && strlen(s) <= VM_UNIX_PATH_MAX;
}

static bool hex_digit(char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Six colon-separated pairs of hex digits, with the multicast bit of the first octet clear. */
static bool mac_is_valid(const char *s) {
        if (!s || strlen(s) != 17)
                return false;

        for (size_t i = 0; i < 17; i++)
                if (i % 3 == 2 ? s[i] != ':' : !hex_digit(s[i]))
                        return false;

        /* The low bit of the first octet lives in the second digit; all odd hex digits have it set. */
        return !strchr("13579bdfBDF", s[1]);
}

static bool credential_name_is_valid(const char *s) {
        size_t n;

        if (!s)
                return false;

        n = strlen(s);
        if (n == 0 || n > VM_CREDENTIAL_NAME_MAX || streq(s, ".") || streq(s, ".."))
                return false;

        for (const char *p = s; *p; p++)
                if ((unsigned char) *p < 0x20 || (unsigned char) *p > 0x7e || strchr("/:=,", *p))
                        return false;

        return true;
}

static int invalid(const char **reterr_field, const char *field) {
        if (reterr_field)
                *reterr_field = field;
        return -EINVAL;
}

static int credential_compare(const void *a, const void *b) {
        const VmCredential *const *x = a, *const *y = b;

        return strcmp((*x)->name, (*y)->name);
}

/* The credentials sorted by name, as a new array of borrowed pointers (NULL when there are none). */
static int credentials_sorted(const VmCmdlineSpec *spec, const VmCredential ***ret) {
        _cleanup_free_ const VmCredential **l = NULL;

        if (spec->n_credentials > 0) {
                l = reallocarray(NULL, spec->n_credentials, sizeof(VmCredential *));
                if (!l)
                        return -ENOMEM;

                for (size_t i = 0; i < spec->n_credentials; i++)
                        l[i] = spec->credentials + i;

                qsort(l, spec->n_credentials, sizeof(VmCredential *), credential_compare);
        }

        *ret = TAKE_PTR(l);
        return 0;
}

int vm_cmdline_spec_validate(const VmCmdlineSpec *spec, const char **reterr_field) {
        assert_return(spec, -EINVAL);

        if (!value_is_valid(spec->qemu))
                return invalid(reterr_field, "qemu");
        if (!value_is_valid(spec->id))
                return invalid(reterr_field, "id");
        /* dir also holds the QMP socket, whose path QEMU reads as the implied first option of
         * "unix:<path>,server=on": an '=' in it would turn it into a key. */
        if (!path_is_valid(spec->dir) || strchr(spec->dir, '=') ||
            strlen(spec->dir) + strlen("/" VM_QMP_SOCKET) > VM_UNIX_PATH_MAX)
                return invalid(reterr_field, "dir");

        if (!vm_phase_to_string(spec->phase))
                return invalid(reterr_field, "phase");
        if (!vm_accel_to_string(spec->accel))
                return invalid(reterr_field, "accel");
        if (!vm_vsock_to_string(spec->vsock))
                return invalid(reterr_field, "vsock");

        if (spec->cpus < 1 || spec->cpus > VM_CPUS_MAX)
                return invalid(reterr_field, "cpus");
        if (spec->memory_mib < VM_MEMORY_MIB_MIN)
                return invalid(reterr_field, "memory_mib");
        if (spec->tb_size_mib > VM_TB_SIZE_MIB_MAX)
                return invalid(reterr_field, "tb_size_mib");

        if (!path_is_valid(spec->ovmf_code))
                return invalid(reterr_field, "ovmf_code");
        if (!path_is_valid(spec->ovmf_vars))
                return invalid(reterr_field, "ovmf_vars");

        if (spec->phase == VM_PHASE_INSTALL) {
                if (!path_is_valid(spec->uki))
                        return invalid(reterr_field, "uki");
                if (!path_is_valid(spec->image_raw))
                        return invalid(reterr_field, "image_raw");
        }
        if (!path_is_valid(spec->volume))
                return invalid(reterr_field, "volume");

        if (!socket_path_is_valid(spec->net_socket))
                return invalid(reterr_field, "net_socket");
        if (!mac_is_valid(spec->mac))
                return invalid(reterr_field, "mac");

        if (spec->vsock == VM_VSOCK_VHOST && (spec->cid < VM_CID_MIN || spec->cid > VM_CID_MAX))
                return invalid(reterr_field, "cid");
        if (spec->vsock == VM_VSOCK_VHOST_USER && !socket_path_is_valid(spec->vsock_socket))
                return invalid(reterr_field, "vsock_socket");

        if (spec->tpm_socket && !socket_path_is_valid(spec->tpm_socket))
                return invalid(reterr_field, "tpm_socket");

        if (spec->n_credentials > 0 && !spec->credentials)
                return invalid(reterr_field, "credentials");
        for (size_t i = 0; i < spec->n_credentials; i++) {
                const VmCredential *c = spec->credentials + i;

                if (!credential_name_is_valid(c->name) || !c->value)
                        return invalid(reterr_field, "credentials");

                /* A name given twice would leave it to the guest which value wins. */
                for (size_t j = 0; j < i; j++)
                        if (streq(spec->credentials[j].name, c->name))
                                return invalid(reterr_field, "credentials");
        }

        if (spec->kernel_cmdline_extra && !value_is_valid(spec->kernel_cmdline_extra))
                return invalid(reterr_field, "kernel_cmdline_extra");

        return 0;
}

/* io.systemd.credential:NAME=VALUE for printable ASCII, io.systemd.credential.binary:NAME=BASE64 for
 * anything else. The guest decodes both to the same bytes. */
static char *credential_format(const VmCredential *c) {
        _cleanup_free_ char *b64 = NULL;
        bool text = true;
        char *s;

        for (const char *p = c->value; *p; p++)
                if ((unsigned char) *p < 0x20 || (unsigned char) *p > 0x7e) {
                        text = false;
                        break;
                }

        if (text)
                return asprintf(&s, "io.systemd.credential:%s=%s", c->name, c->value) < 0 ? NULL : s;

        b64 = base64_encode(c->value, strlen(c->value));
        if (!b64)
                return NULL;

        return asprintf(&s, "io.systemd.credential.binary:%s=%s", c->name, b64) < 0 ? NULL : s;
}

/* §1.1: identical in both phases. */
static int build_head(Argv *a, const VmCmdlineSpec *spec) {
        static const struct {
                const char *accel, *cpu;
        } accel_args[_VM_ACCEL_MAX] = {
                [VM_ACCEL_KVM] = { "kvm", "host" },
                /* reference/feasibility.md §1: where KVM cannot run a standard guest. */
                [VM_ACCEL_TCG] = { "tcg,thread=multi", "max" },
        };
        bool shared_memory = spec->vsock == VM_VSOCK_VHOST_USER;
        _cleanup_free_ char *qmp = NULL;
        int r;

        r = argv_add(a, spec->qemu);
        if (r < 0)
                return r;

        r = argv_option_escaped(a, "-name", "guest=", spec->id, "");
        if (r < 0)
                return r;

        r = argv_option(a, "-machine", shared_memory ? "q35,memory-backend=mem" : "q35");
        if (r < 0)
                return r;

        /* TCG's translation cache is anonymous memory QEMU fills as the guest runs new code; its 1 GiB
         * default costs a booted Linux guest over 1 GiB of host memory (docs/operations.md). */
        if (spec->accel == VM_ACCEL_TCG && spec->tb_size_mib > 0)
                r = argv_optionf(
                        a, "-accel", "%s,tb-size=%u", accel_args[spec->accel].accel, spec->tb_size_mib);
        else
                r = argv_option(a, "-accel", accel_args[spec->accel].accel);
        if (r < 0)
                return r;

        r = argv_option(a, "-cpu", accel_args[spec->accel].cpu);
        if (r < 0)
                return r;

        r = argv_optionf(a, "-smp", "%u", spec->cpus);
        if (r < 0)
                return r;

        r = argv_optionf(a, "-m", "%" PRIu64 "M", spec->memory_mib);
        if (r < 0)
                return r;

        /* vhost-user: the backend process maps guest RAM, so all of it is one shareable memfd of the
         * size of -m (reference/feasibility.md §2). */
        if (shared_memory) {
                r = argv_optionf(
                        a, "-object", "memory-backend-memfd,id=mem,size=%" PRIu64 "M,share=on", spec->memory_mib);
                if (r < 0)
                        return r;
        }

        r = argv_add(a, "-nodefaults");
        if (r < 0)
                return r;

        r = argv_option(a, "-display", "none");
        if (r < 0)
                return r;

        /* Not escaped: QEMU takes everything after "file:" as the path, commas included. */
        r = argv_optionf(a, "-serial", "file:%s/" VM_CONSOLE_LOG, spec->dir);
        if (r < 0)
                return r;

        if (asprintf(&qmp, "%s/" VM_QMP_SOCKET, spec->dir) < 0)
                return -ENOMEM;
        r = argv_option_escaped(a, "-qmp", "unix:", qmp, ",server=on,wait=off");
        if (r < 0)
                return r;

        r = argv_option_escaped(
                a, "-drive", "if=pflash,format=raw,unit=0,readonly=on,file=", spec->ovmf_code, "");
        if (r < 0)
                return r;

        return argv_option_escaped(a, "-drive", "if=pflash,format=raw,unit=1,file=", spec->ovmf_vars, "");
}

/* §1.2 13-17 and §1.3: the installer UKI and image in phase install, then the target disk. */
static int build_disks(Argv *a, const VmCmdlineSpec *spec) {
        bool install = spec->phase == VM_PHASE_INSTALL;
        int r;

        if (install) {
                /* -kernel is a plain path to QEMU, the one value that is not escaped. */
                r = argv_option(a, "-kernel", spec->uki);
                if (r < 0)
                        return r;

                r = argv_option_escaped(
                        a, "-drive", "if=none,id=installer,format=raw,file=", spec->image_raw, ",readonly=on");
                if (r < 0)
                        return r;

                r = argv_option(a, "-device", "virtio-blk-pci,drive=installer,serial=installer");
                if (r < 0)
                        return r;
        }

        r = argv_option_escaped(
                a, "-drive", "if=none,id=target,format=raw,file=", spec->volume, ",discard=unmap");
        if (r < 0)
                return r;

        return argv_option(
                a,
                "-device",
                install ? "virtio-blk-pci,drive=target,serial=target" :
                          "virtio-blk-pci,drive=target,serial=target,bootindex=0");
}

/* QEMU listens on the VM's own socket and the daemon dials it (reference/network-imds-attest.md
 * §10.2): QEMU 7.2 cannot re-dial a switch, but it does accept the daemon again after a restart. */
static int build_network(Argv *a, const VmCmdlineSpec *spec) {
        int r;

        r = argv_option_escaped(
                a, "-netdev", "stream,id=net0,server=on,addr.type=unix,addr.path=", spec->net_socket, "");
        if (r < 0)
                return r;

        /* romfile= (empty) leaves out iPXE's option ROM: VMs boot from their disk, never from the
         * network, and under TCG initialising iPXE costs seconds of every boot. */
        if (spec->mtu != 0 && spec->mtu != 1500)
                return argv_optionf(
                        a,
                        "-device",
                        "virtio-net-pci,netdev=net0,mac=%s,host_mtu=%u,romfile=",
                        spec->mac,
                        spec->mtu);
        return argv_optionf(a, "-device", "virtio-net-pci,netdev=net0,mac=%s,romfile=", spec->mac);
}

static int build_vsock(Argv *a, const VmCmdlineSpec *spec) {
        int r;

        if (spec->vsock == VM_VSOCK_NONE)
                return 0;
        if (spec->vsock == VM_VSOCK_VHOST)
                return argv_optionf(a, "-device", "vhost-vsock-pci,id=vsock0,guest-cid=%" PRIu32, spec->cid);

        r = argv_option_escaped(a, "-chardev", "socket,id=vsock0,path=", spec->vsock_socket, "");
        if (r < 0)
                return r;

        return argv_option(a, "-device", "vhost-user-vsock-pci,chardev=vsock0");
}

/* Memory the guest frees goes back to the host: with free page reporting the guest hands QEMU
 * runs of free pages, which QEMU discards (fallocate(PUNCH_HOLE) on the shared memfd of vhost-user,
 * MADV_DONTNEED on anonymous RAM). The statistics are polled over QMP once QEMU runs (vm-balloon.c).
 * Nothing inflates the balloon: the guest keeps all of -m. */
static int build_balloon(Argv *a) {
        return argv_option(a, "-device", "virtio-balloon-pci,id=" VM_BALLOON_ID ",free-page-reporting=on");
}

static int build_tpm(Argv *a, const VmCmdlineSpec *spec) {
        int r;

        if (!spec->tpm_socket)
                return 0;

        r = argv_option_escaped(a, "-chardev", "socket,id=chrtpm,path=", spec->tpm_socket, "");
        if (r < 0)
                return r;

        r = argv_option(a, "-tpmdev", "emulator,id=tpm0,chardev=chrtpm");
        if (r < 0)
                return r;

        return argv_option(a, "-device", "tpm-crb,tpmdev=tpm0");
}

/* §1.2 21-23: the SMBIOS identity, the credentials sorted by name, the extra kernel command line. */
static int build_smbios(Argv *a, const VmCmdlineSpec *spec) {
        _cleanup_free_ const VmCredential **sorted = NULL;
        int r;

        r = argv_option_escaped(
                a, "-smbios", "type=1,manufacturer=GiantSwarm,product=vm-manager,serial=", spec->id, "");
        if (r < 0)
                return r;

        r = credentials_sorted(spec, &sorted);
        if (r < 0)
                return r;

        for (size_t i = 0; i < spec->n_credentials; i++) {
                _cleanup_free_ char *c = NULL;

                c = credential_format(sorted[i]);
                if (!c)
                        return -ENOMEM;

                r = argv_option_escaped(a, "-smbios", "type=11,value=", c, "");
                if (r < 0)
                        return r;
        }

        if (spec->kernel_cmdline_extra) {
                _cleanup_free_ char *c = NULL;

                if (asprintf(&c, "io.systemd.stub.kernel-cmdline-extra=%s", spec->kernel_cmdline_extra) < 0)
                        return -ENOMEM;

                r = argv_option_escaped(a, "-smbios", "type=11,value=", c, "");
                if (r < 0)
                        return r;
        }

        return 0;
}

int vm_cmdline_build(const VmCmdlineSpec *spec, char ***ret) {
        _cleanup_(argv_done) Argv a = {};
        int r;

        assert_return(spec, -EINVAL);
        assert_return(ret, -EINVAL);

        r = vm_cmdline_spec_validate(spec, /* reterr_field= */ NULL);
        if (r < 0)
                return r;

        r = build_head(&a, spec);
        if (r < 0)
                return r;

        r = build_disks(&a, spec);
        if (r < 0)
                return r;

        r = build_network(&a, spec);
        if (r < 0)
                return r;

        r = build_vsock(&a, spec);
        if (r < 0)
                return r;

        r = build_balloon(&a);
        if (r < 0)
                return r;

        r = build_tpm(&a, spec);
        if (r < 0)
                return r;

        r = build_smbios(&a, spec);
        if (r < 0)
                return r;

        /* §1.8a: the installer's final reboot becomes a QEMU exit, which hands over to phase boot. */
        if (spec->phase == VM_PHASE_INSTALL) {
                r = argv_add(&a, "-no-reboot");
                if (r < 0)
                        return r;
        }
        if (spec->paused) {
                r = argv_add(&a, "-S");
                if (r < 0)
                        return r;
        }

        *ret = TAKE_PTR(a.items);
        return 0;
}

int vm_swtpm_cmdline_build(
        const char *swtpm, const char *tpm_dir, const char *ctrl_socket, const char *log_file, char ***ret) {
        _cleanup_(argv_done) Argv a = {};
        int r;

        assert_return(ret, -EINVAL);

        /* swtpm splits its option values at every comma and has no escape for one. */
        if (!value_is_valid(swtpm) || !path_is_valid(tpm_dir) || strchr(tpm_dir, ',') ||
            !socket_path_is_valid(ctrl_socket) || strchr(ctrl_socket, ',') ||
            (log_file && (!path_is_valid(log_file) || strchr(log_file, ','))))
                return -EINVAL;

        r = argv_add(&a, swtpm);
        if (r < 0)
                return r;

        r = argv_add(&a, "socket");
        if (r < 0)
                return r;

        r = argv_add(&a, "--tpm2");
        if (r < 0)
                return r;

        r = argv_optionf(&a, "--tpmstate", "dir=%s", tpm_dir);
        if (r < 0)
                return r;

        r = argv_optionf(&a, "--ctrl", "type=unixio,path=%s", ctrl_socket);
        if (r < 0)
                return r;

        /* swtpm ends when QEMU closes the data channel. Not on --ctrl, where the readiness probe's
         * hang-up would end it. */
        r = argv_add(&a, "--terminate");
        if (r < 0)
                return r;

        /* Level 2 logs every control and TPM command and its response; swtpm appends to a log file. */
        if (log_file)
                r = argv_optionf(&a, "--log", "file=%s,level=2", log_file);
        else
                r = argv_option(&a, "--log", "level=2");
        if (r < 0)
                return r;

        *ret = TAKE_PTR(a.items);
        return 0;
}

int vm_swtpm_setup_cmdline_build(const char *swtpm_setup, const char *tpm_dir, const char *config, char ***ret) {
        _cleanup_(argv_done) Argv a = {};
        int r;

        assert_return(ret, -EINVAL);
        if (!value_is_valid(swtpm_setup) || !path_is_valid(tpm_dir) || !path_is_valid(config))
                return -EINVAL;

        r = argv_add(&a, swtpm_setup);
        if (r >= 0)
                r = argv_add(&a, "--tpm2");
        if (r >= 0)
                r = argv_option(&a, "--tpmstate", tpm_dir);
        if (r >= 0)
                r = argv_option(&a, "--config", config);
        /* the platform certificate too: a guest that proves its platform reads it from NV 0x1c08000 */
        if (r >= 0)
                r = argv_add(&a, "--create-ek-cert");
        if (r >= 0)
                r = argv_add(&a, "--create-platform-cert");
        /* the certificates' NV indexes cannot be rewritten by the guest */
        if (r >= 0)
                r = argv_add(&a, "--lock-nvram");
        if (r >= 0)
                r = argv_option(&a, "--write-ek-cert-files", tpm_dir);
        /* a setup that failed halfway left a state no guest has seen */
        if (r >= 0)
                r = argv_add(&a, "--overwrite");
        if (r < 0)
                return r;
        *ret = TAKE_PTR(a.items);
        return 0;
}

int vm_vhost_user_vsock_cmdline_build(
        const char *binary, uint32_t guest_cid, const char *vhost_socket, const char *uds_path, char ***ret) {
        _cleanup_(argv_done) Argv a = {};
        int r;

        assert_return(ret, -EINVAL);

        /* The backend listens on uds_path and connects a guest's connection to port P to
         * "<uds_path>_P", which must fit a socket address too. */
        if (!value_is_valid(binary) || guest_cid < VM_CID_MIN || guest_cid > VM_CID_MAX ||
            !socket_path_is_valid(vhost_socket) || !path_is_valid(uds_path) ||
            strlen(uds_path) + strlen("_4294967295") > VM_UNIX_PATH_MAX)
                return -EINVAL;

        r = argv_add(&a, binary);
        if (r < 0)
                return r;

        r = argv_optionf(&a, "--guest-cid", "%" PRIu32, guest_cid);
        if (r < 0)
                return r;

        r = argv_option(&a, "--socket", vhost_socket);
        if (r < 0)
                return r;

        r = argv_option(&a, "--uds-path", uds_path);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(a.items);
        return 0;
}
