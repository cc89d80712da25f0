/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>

#include "cleanup.h"
#include "host-ksm.h"
#include "macro.h"
#include "time-util.h"

/* The host probe: what this machine offers VMs (the Host resource of GET /api/v1/host and get_host,
 * api-contract §5.1, runtime §9) and which accelerator VMs use here (DESIGN §2 "Accelerator").
 *
 * host_probe_new() runs the host's tools (qemu-system-x86_64, swtpm, systemctl, dpkg-query) and hashes
 * the firmware, synchronously: each child gets HOST_PROBE_TOOL_TIMEOUT_USEC, so the call may block for
 * tens of seconds on a broken host. Call it once at start-up, before the daemon is ready, and NEVER from
 * a request path or an event-loop callback. host_probe_to_json() and host_probe_accel() only open two
 * device nodes and read a few /proc and /sys files; they are cheap and may run per request. */

/* Each child process gets this long (5 s) before it is killed with SIGKILL. */
#define HOST_PROBE_TOOL_TIMEOUT_USEC (5 * USEC_PER_SEC)
/* At most this much of a child's output (stdout and stderr merged) is kept; the rest is drained. */
#define HOST_PROBE_TOOL_OUTPUT_MAX (64U * 1024U)

typedef enum HostAccel {
        HOST_ACCEL_AUTO,
        HOST_ACCEL_KVM,
        HOST_ACCEL_TCG,
        _HOST_ACCEL_MAX,
        _HOST_ACCEL_INVALID = -EINVAL,
} HostAccel;

/* "auto", "kvm", "tcg"; NULL / _HOST_ACCEL_INVALID for anything else. */
const char *host_accel_to_string(HostAccel a) _const_;
HostAccel host_accel_from_string(const char *s) _pure_;

/* How a guest's READY=1 reaches the daemon (DESIGN §2 "READY=1"): the kernel's vhost-vsock with one
 * AF_VSOCK listener routing by CID, vhost-user-vsock served by one vhost-device-vsock per VM, or not
 * at all (VMs then end up running, never ready). */
typedef enum HostNotify {
        HOST_NOTIFY_AUTO,
        HOST_NOTIFY_VHOST,
        HOST_NOTIFY_VHOST_USER,
        HOST_NOTIFY_NONE,
        _HOST_NOTIFY_MAX,
        _HOST_NOTIFY_INVALID = -EINVAL,
} HostNotify;

/* The --vsock values: "auto", "vhost", "vhost-user", "none". */
const char *host_notify_to_string(HostNotify n) _const_;
HostNotify host_notify_from_string(const char *s) _pure_;
/* The transport as get_host names it: "vhost-vsock", "vhost-user-vsock", "none". */
const char *host_notify_transport_name(HostNotify n) _const_;

typedef struct HostProbeConfig {
        const char *ovmf_code; /* configured firmware code image (may not exist); used as is, not under root */
        HostAccel accel;       /* the --accel flag */
        HostNotify notify;     /* the --vsock flag */
        const char *root;      /* test hook: prefix for /dev, /proc, /sys, /run paths; NULL = "/" */
        const char *path; /* test hook: $PATH to find the tools in; NULL = the process's, else a default */
} HostProbeConfig;

typedef struct HostProbe HostProbe;

/* Probes once, synchronously (see above): tool versions via `qemu-system-x86_64 --version`,
 * `swtpm --version`, `systemctl --version`; the firmware's SHA-256 and its dpkg package and version via
 * `dpkg-query --search <path>` then `dpkg-query --show --showformat=${Version} <pkg>`. Children run with
 * stdin on /dev/null, stderr merged into stdout, a reset signal mask, in their own process group (killed
 * as a group on time-out). Copies the config strings. A missing or failing tool is not an error here: it
 * is reported in the Host resource. Returns 0, -EINVAL on a bad config, -ENOMEM, or -EIO when OpenSSL
 * cannot compute SHA-256. */
int host_probe_new(HostProbe **ret, const HostProbeConfig *cfg);
HostProbe *host_probe_free(HostProbe *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(HostProbe *, host_probe_free);

/* The Host resource, as a new reference (NULL on OOM). Keys, in this order:
 *   hostname, kernel, cpus, memoryBytes,
 *   kvm {path, accessible, error?}, vhostVsock {path, accessible, error?},
 *   qemu {found, version?, error?}, swtpm {…}, systemd {…},
 *   ovmfCode? (only when it was a readable regular file at start-up),
 *   firmware? {sha256, package?, version?, error?} (present exactly when ovmfCode is),
 *   storageProviders [..] (non-directory entries of /run/systemd/io.systemd.StorageProvider, sorted),
 *   accelerator {selected, requested, reason}, notify {transport, requested, reason}, ready, missing? [..].
 * Devices (opened O_RDWR, then closed), /proc and /sys facts are re-read on every call; tool versions
 * and the firmware are the start-up probe's.
 *
 * A tool is "found" when it ran and exited 0 in time. Its "error" is one of
 *   "<tool>: executable file not found in $PATH"
 *   "<tool>: exit status <n>[: <first output line>]"
 *   "<tool>: signal: <signal description>[ (core dumped)]"
 *   "<tool>: timed out after 5s"
 * Device errors are the bare errno text as Go prints it ("no such file or directory").
 *
 * "missing" lists, in this order (ready is true iff it is empty; systemd and storage providers never
 * count):
 *   HOST_PROBE_MISSING_KVM        the selected accelerator is kvm and /dev/kvm cannot be opened
 *   HOST_PROBE_MISSING_KVM_PVM    --accel=auto fell back to TCG because /dev/kvm is PVM (kvm_pvm)
 *   HOST_PROBE_MISSING_VHOST_VSOCK   --vsock=vhost and /dev/vhost-vsock cannot be opened
 *   HOST_PROBE_MISSING_VSOCK_HELPER  --vsock=vhost-user and vhost-device-vsock is not on $PATH
 *   HOST_PROBE_MISSING_VSOCK      --vsock=auto, /dev/vhost-vsock cannot be opened and vhost-device-vsock is
 * not on $PATH (with it on $PATH, the vhost-user-vsock fallback covers the need, and vhostVsock still says
 * accessible=false) "qemu-system-x86_64"          not found (see above) "swtpm"                       not
 * found "OVMF code image <path>"      the firmware code image was not a readable regular file at start-up
 *                                 ("OVMF code image" alone when none is configured) */
json_t *host_probe_to_json(HostProbe *p);

#define HOST_PROBE_MISSING_KVM "/dev/kvm"
#define HOST_PROBE_MISSING_KVM_PVM "/dev/kvm: KVM cannot run standard guests here (PVM); VMs use TCG"
#define HOST_PROBE_MISSING_VSOCK "/dev/vhost-vsock: vhost-user-vsock fallback needs vhost-device-vsock"
#define HOST_PROBE_MISSING_VHOST_VSOCK "/dev/vhost-vsock (requested with --vsock=vhost)"
#define HOST_PROBE_MISSING_VSOCK_HELPER "vhost-device-vsock (requested with --vsock=vhost-user)"

/* The accelerator VMs will use, and why, as a static sentence (*ret_reason, optional):
 *   --accel=kvm: HOST_ACCEL_KVM, always (a /dev/kvm that cannot be opened shows up in "missing");
 *   --accel=tcg: HOST_ACCEL_TCG;
 *   --accel=auto: HOST_ACCEL_KVM only when /dev/kvm opens AND a hardware backend is loaded
 *                 (/sys/module/kvm_intel or kvm_amd); otherwise HOST_ACCEL_TCG, in particular where
 *                 /dev/kvm is PVM (/sys/module/kvm_pvm without kvm_intel/kvm_amd), which cannot run
 *                 standard guests (OVMF aborts, -cpu host fails, other CPU models run ~50x slower
 *                 than TCG).
 * Never returns HOST_ACCEL_AUTO. Re-reads /dev and /sys on every call. The sentences: */
#define HOST_ACCEL_REASON_REQUESTED_KVM "KVM was requested with --accel=kvm."
#define HOST_ACCEL_REASON_REQUESTED_KVM_PVM                                                                    \
        "KVM was requested with --accel=kvm, but /dev/kvm is PVM (kvm_pvm), which cannot run standard guests " \
        "(firmware aborts)."
#define HOST_ACCEL_REASON_REQUESTED_KVM_INACCESSIBLE                                                     \
        "KVM was requested with --accel=kvm, but /dev/kvm is not accessible, so VMs cannot start until " \
        "it is."
#define HOST_ACCEL_REASON_REQUESTED_TCG \
        "TCG was requested with --accel=tcg; VMs run under TCG, much slower than KVM."
#define HOST_ACCEL_REASON_KVM_INTEL \
        "/dev/kvm is accessible and backed by hardware virtualization (kvm_intel)."
#define HOST_ACCEL_REASON_KVM_AMD "/dev/kvm is accessible and backed by hardware virtualization (kvm_amd)."
#define HOST_ACCEL_REASON_PVM                                                                                   \
        "/dev/kvm is PVM (kvm_pvm), which cannot run standard guests (firmware aborts), so VMs run under TCG, " \
        "much slower."
#define HOST_ACCEL_REASON_NO_KVM "/dev/kvm is not accessible, so VMs run under TCG, much slower."
#define HOST_ACCEL_REASON_NO_BACKEND                                                                         \
        "/dev/kvm has no hardware backend (neither kvm_intel nor kvm_amd is loaded), so VMs run under TCG, " \
        "much slower."
HostAccel host_probe_accel(HostProbe *p, const char **ret_reason);
/* The host's memory (MemTotal) in bytes; 0 when it cannot be read. */
uint64_t host_probe_memory(HostProbe *p);
/* KSM as <root>/sys/kernel/mm/ksm says now (host-ksm.h): read on each call, a few small sysfs files. */
int host_probe_ksm(HostProbe *p, HostKsm *ret);

/* The READY=1 transport the next VM start uses, and why, as a static sentence (*ret_reason, optional):
 *   --vsock=vhost, vhost-user or none: that one (a missing device or helper shows up in "missing");
 *   --vsock=auto: vhost where /dev/vhost-vsock opens, else vhost-user where vhost-device-vsock is on
 *                 $PATH, else none.
 * Never returns HOST_NOTIFY_AUTO. Re-reads /dev and $PATH on every call. */
#define HOST_NOTIFY_REASON_VHOST \
        "READY=1 travels over the kernel's vhost-vsock (/dev/vhost-vsock), routed by CID."
#define HOST_NOTIFY_REASON_VHOST_USER \
        "READY=1 travels over vhost-user-vsock, served by vhost-device-vsock for each VM."
#define HOST_NOTIFY_REASON_NONE \
        "Neither /dev/vhost-vsock nor vhost-device-vsock is available: VMs cannot report READY=1 and end up running."
#define HOST_NOTIFY_REASON_REQUESTED_VHOST \
        "vhost-vsock was requested with --vsock=vhost; READY=1 travels over /dev/vhost-vsock, routed by CID."
#define HOST_NOTIFY_REASON_REQUESTED_VHOST_USER \
        "vhost-user-vsock was requested with --vsock=vhost-user; vhost-device-vsock serves each VM."
#define HOST_NOTIFY_REASON_REQUESTED_NONE \
        "READY=1 is off (--vsock=none): VMs get no vsock device and end up running, never ready."
HostNotify host_probe_notify(HostProbe *p, const char **ret_reason);

/* The firmware build line for logs, borrowed (valid until host_probe_free()):
 *   "sha256 <hex> (package <pkg> <version>)", or, when dpkg does not know the file,
 *   "sha256 <hex> (package unknown: <why>)";
 * NULL when there is no firmware (ovmfCode absent). */
const char *host_probe_firmware_summary(HostProbe *p);
/* The firmware's SHA-256 (lowercase hex), borrowed; NULL when there is no firmware. */
const char *host_probe_firmware_sha256(HostProbe *p);
