/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Pure builders of the command lines of QEMU and its helpers (swtpm, vhost-device-vsock): a spec goes
 * in, a NULL-terminated argv comes out. Nothing here touches the file system or the environment, so
 * the result depends on the spec alone and is tested against tests/data/argv/<name>.args. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"
#include "socket-util.h"

/* The files QEMU keeps in the VM directory, next to ovmf_vars.fd. */
#define VM_CONSOLE_LOG "console.log"
#define VM_QMP_SOCKET "qmp.sock"

/* The longest path a unix socket address can hold (sun_path minus its NUL). */
#define VM_UNIX_PATH_MAX SOCKADDR_UN_PATH_MAX

#define VM_CPUS_MAX 256U
#define VM_MEMORY_MIB_MIN 256U
#define VM_CREDENTIAL_NAME_MAX 255U
/* QEMU takes any tb-size; above 4 GiB is a typo more likely than a wish. */
#define VM_TB_SIZE_MIB_MAX 4096U
/* The balloon device's id: QMP reaches it as /machine/peripheral/<id>. */
#define VM_BALLOON_ID "balloon0"
#define VM_BALLOON_QOM_PATH "/machine/peripheral/" VM_BALLOON_ID
/* Guest CIDs 0-2 are the hypervisor, loopback and host; 0xFFFFFFFF is VMADDR_CID_ANY. */
#define VM_CID_MIN 3U
#define VM_CID_MAX 0xFFFFFFFEU

typedef enum VmPhase {
        VM_PHASE_INSTALL, /* the installer UKI, with its image attached, writes the target disk */
        VM_PHASE_BOOT,    /* OVMF boots the installed target disk */
        _VM_PHASE_MAX,
        _VM_PHASE_INVALID = -EINVAL,
} VmPhase;

typedef enum VmAccel {
        VM_ACCEL_KVM, /* -accel kvm -cpu host */
        VM_ACCEL_TCG, /* -accel tcg,thread=multi -cpu max */
        _VM_ACCEL_MAX,
        _VM_ACCEL_INVALID = -EINVAL,
} VmAccel;

typedef enum VmVsock {
        VM_VSOCK_VHOST,      /* vhost-vsock-pci with guest-cid=<cid>; needs /dev/vhost-vsock */
        VM_VSOCK_VHOST_USER, /* vhost-user-vsock-pci on vhost-device-vsock's socket; needs shared memfd RAM */
        VM_VSOCK_NONE,       /* no vsock device: the guest cannot report READY=1 */
        _VM_VSOCK_MAX,
        _VM_VSOCK_INVALID = -EINVAL,
} VmVsock;

const char *vm_phase_to_string(VmPhase p) _const_;
VmPhase vm_phase_from_string(const char *s) _pure_;
const char *vm_accel_to_string(VmAccel a) _const_;
VmAccel vm_accel_from_string(const char *s) _pure_;
const char *vm_vsock_to_string(VmVsock v) _const_;
VmVsock vm_vsock_from_string(const char *s) _pure_;

/* One systemd credential, passed as SMBIOS type 11. A value of printable ASCII is passed as text
 * (io.systemd.credential:NAME=VALUE), anything else (a newline, a tab, UTF-8) as base64
 * (io.systemd.credential.binary:NAME=BASE64); the guest reads the same bytes either way. */
typedef struct VmCredential {
        const char *name; /* 1-255 printable ASCII characters, none of / : = , and not "." or ".." */
        const char *value;
} VmCredential;

/* Everything the QEMU command line depends on. All strings are borrowed. Paths must be absolute
 * (QEMU would read "host:path" as a protocol otherwise) and no string may contain a newline. */
typedef struct VmCmdlineSpec {
        const char *qemu; /* the binary, a path or a name looked up on $PATH */
        const char *id;   /* the VM id: -name guest=<id> and the SMBIOS serial */
        const char *dir;  /* <state>/vms/<id>: holds console.log and qmp.sock; no '=' */

        VmPhase phase;
        VmAccel accel;
        VmVsock vsock;

        unsigned cpus;       /* 1..VM_CPUS_MAX */
        uint64_t memory_mib; /* at least VM_MEMORY_MIB_MIN */

        const char *ovmf_code; /* read-only firmware image */
        const char *ovmf_vars; /* the VM's own variable store, <dir>/ovmf_vars.fd */

        const char *uki;       /* install phase only: the installer UKI, booted with -kernel */
        const char *image_raw; /* install phase only: the installer image, attached read-only */
        const char *volume;    /* the target disk */

        const char *net_socket; /* QEMU listens here (-netdev stream,server=on) and the daemon dials */
        unsigned mtu;           /* the network's; other than 1500 it becomes the NIC's host_mtu */
        const char *mac;        /* "xx:xx:xx:xx:xx:xx", unicast */

        uint32_t cid;             /* VM_VSOCK_VHOST: the guest CID, VM_CID_MIN..VM_CID_MAX */
        const char *vsock_socket; /* VM_VSOCK_VHOST_USER: vhost-device-vsock's vhost-user socket */

        const char *tpm_socket; /* swtpm's control socket, or NULL for no TPM */

        const VmCredential *credentials; /* passed sorted by name, whatever the order here */
        size_t n_credentials;

        const char *kernel_cmdline_extra; /* io.systemd.stub.kernel-cmdline-extra, or NULL */

        bool paused; /* -S: the vCPUs wait for QMP's cont (a QEMU started before its disk is written) */

        /* VM_ACCEL_TCG: the translation cache (-accel tcg,tb-size=<MiB>), at most VM_TB_SIZE_MIB_MAX;
         * 0 leaves QEMU's default (1 GiB of anonymous memory per VM). Ignored under KVM. */
        unsigned tb_size_mib;
} VmCmdlineSpec;

/* Doubles every comma, so that QEMU's option parser reads value as one literal option value.
 * Returns a new string, or NULL on OOM. */
char *vm_cmdline_escape(const char *value);

/* Checks spec the way vm_cmdline_build() does: 0 when it is good, -EINVAL otherwise, and then
 * *reterr_field (when not NULL) names the first bad member ("mac", "credentials", …) for a message. */
int vm_cmdline_spec_validate(const VmCmdlineSpec *spec, const char **reterr_field);

/* The QEMU command line for spec, in the order of reference/runtime.md §1. The install phase adds
 * -kernel, the installer drive and -no-reboot; the boot phase boots the target with bootindex=0.
 * On success *ret is a new NULL-terminated argv (free with strv_free()); a spec that fails validation
 * gives -EINVAL, and *ret is left alone on failure. */
int vm_cmdline_build(const VmCmdlineSpec *spec, char ***ret);

/* swtpm socket --tpm2 --tpmstate dir=<tpm_dir> --ctrl type=unixio,path=<ctrl_socket> --terminate
 * --log [file=<log_file>,]level=2. log_file may be NULL: swtpm then logs to its standard output.
 * swtpm has no comma escape, so paths with a comma are -EINVAL. */
int vm_swtpm_cmdline_build(
        const char *swtpm, const char *tpm_dir, const char *ctrl_socket, const char *log_file, char ***ret);

/* swtpm_setup --tpm2 --tpmstate <tpm_dir> --config <config> --create-ek-cert --create-platform-cert
 * --lock-nvram --write-ek-cert-files <tpm_dir> --overwrite: a new vTPM manufactured once, with its EK
 * certificate signed by the CA config names (never the host's /etc/swtpm_setup.conf) and written
 * beside the state as ek-rsa2048.crt. Only for a vTPM no guest has used yet (--overwrite). */
int vm_swtpm_setup_cmdline_build(const char *swtpm_setup, const char *tpm_dir, const char *config, char ***ret);

/* vhost-device-vsock --guest-cid <guest_cid> --socket <vhost_socket> --uds-path <uds_path>. The
 * backend connects guest connections to port P to "<uds_path>_P", so uds_path leaves room for
 * "_4294967295" within VM_UNIX_PATH_MAX. */
int vm_vhost_user_vsock_cmdline_build(
        const char *binary, uint32_t guest_cid, const char *vhost_socket, const char *uds_path, char ***ret);
