/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What a VM's record keeps: <state>/vms/<id>/vm.json, and what get_vm and list_vms show. Pure: the
 * record goes to JSON and comes back from it, and nothing else happens here. Every record an older
 * vm-manager wrote still loads (tests/data/vm-record/ keeps one of each shape); what it lacked gets
 * the value it meant (a record without "vsock" ran on vhost-user, one without "forwards" has none). */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "api-error.h"
#include "attest-ca.h"
#include "attest-verify.h"
#include "core-forward.h"
#include "time-util.h"
#include "vm-cmdline.h"
#include "vm-spec.h"
#include "vm-state.h"

/* The largest vm.json that loads; the request limits keep records far below it. */
#define VM_RECORD_MAX (4U * 1024U * 1024U)

/* The attestation of the current installed boot (api-contract §5.5), and the AK pinned on the VM's
 * first verified initrd quote (kept across boots, dropped with the VM). */
typedef struct VmAttestation {
        bool required, released;
        usec_t nonce_issued_at;
        AttestResult initrd, ready;
        bool has_initrd, has_ready;
        char *ak_pin; /* trust on first use, kept for VMs from before credential activation */
        /* the fingerprint of the AK the guest activated a credential for with this VM's EK: the
         * only key whose quotes count once set */
        char *ak_activated;
        /* the vTPM's EK certificate: pending until swtpm_setup made it (new VMs only: an older vTPM
         * is never manufactured again, that would wipe what it sealed), then its verdict */
        bool ek_pending;
        AttestEkVerdict ek;
        char *ek_why; /* a foreign verdict's reason */
        /* The io.systemd.stub.kernel-cmdline-extra value QEMU was last started with ("" for none),
         * which PCR 12 is predicted from; kept on disk for a successor attaching to the run, NULL
         * for a run an older vm-manager started. */
        char *cmdline_extra;
        /* The credentials word of that run (attest_credentials_word() of the credentials QEMU was
         * started with), which an image that measures its credentials adds to PCR 12; NULL for a run
         * an older vm-manager started. */
        char *credentials_word;
        /* The version of the VM's image its last verified quote measured (the catalog version whose
         * PCR 11 the quote carried): the version it was created from until it updates itself in
         * place (A/B, systemd-sysupdate), NULL before its first verified quote. */
        char *booted_version;
} VmAttestation;

void vm_attestation_done(VmAttestation *a);
/* What the VM's quotes are trusted by, get_vm_attestation's "akTrust": "activated" (a credential
 * activation bound the AK to this VM's certified EK), "pinned" (a VM from before that: its first
 * verified quote's AK), or "none" yet. */
const char *vm_attestation_ak_trust(const VmAttestation *a);

/* A VM's forwards ("forwards": [{"port","address"}]), listening while the VM exists, whether it runs
 * or not. */
#define VM_FORWARDS_MAX 32U
typedef struct VmForward {
        uint16_t port;      /* the guest's */
        uint16_t host_port; /* on 127.0.0.1 */
} VmForward;
typedef struct VmForwards {
        VmForward items[VM_FORWARDS_MAX];
        size_t n;
} VmForwards;

VmForward *vm_forwards_find(VmForwards *f, uint16_t port);

/* The processes of a run, as a successor daemon attaches to them: the units of the systemd launcher
 * (none for plain children) and their main pids. */
typedef enum VmRole {
        VM_ROLE_QEMU,
        VM_ROLE_SWTPM,
        VM_ROLE_VSOCK, /* vhost-device-vsock */
        _VM_ROLE_MAX,
        _VM_ROLE_INVALID = -EINVAL,
} VmRole;

const char *vm_role_to_string(VmRole r) _const_;
VmRole vm_role_from_string(const char *s) _pure_;

typedef struct VmProcessRecord {
        char *unit;
        pid_t pid;
} VmProcessRecord;

struct VmRecord {
        char *id;
        VmSpec spec;
        VmState state;
        VmPhase phase;              /* of the current or last run; _VM_PHASE_INVALID before the first */
        VmVsock vsock;              /* the READY=1 transport of that run */
        VmInstallMode install_mode; /* how create_vm wrote the disk */
        char *ip, *mac;
        uint32_t cid;
        char machine_id[33];
        bool booted;  /* an installed boot reached READY=1 once: Ignition's first boot is over */
        char *status; /* STATUS= of the guest's PID 1 */
        char *ssh_public_key;
        VmAttestation att;
        VmForwards forwards;
        usec_t created_at, installed_at, booted_at, ready_at; /* CLOCK_REALTIME, 0 = not yet */
        json_t *created_by; /* {"subject","email"} of create_vm's caller; NULL: anonymous */
        char *last_error;
        char *console_tail; /* the console's last lines when lastError was set by a failure */
        char *volume;       /* the disk's path (or the /proc fd link of a provider volume) */
        VmProcessRecord processes[_VM_ROLE_MAX];
};

void vm_record_done(VmRecord *r);

/* The record as the API shows it (for_disk false), or as vm.json keeps it (for_disk: with the
 * processes and the pinned AK). dir is the VM's directory, for "paths". A new reference, NULL on OOM. */
json_t *vm_record_to_json(const VmRecord *r, const char *dir, bool for_disk);

/* Reads a vm.json whose directory is named id. -EBADMSG (with the reason in reterr) when it is not a
 * record of that VM: not an object, another id, a field of the wrong type or an unknown one, a spec
 * that does not pass vm_spec_build(), no valid state, transport or machine ID. What was never
 * checked stays lenient: forwards that do not parse are skipped, times that do not parse are unset,
 * attestation results that do not parse are absent. */
int vm_record_from_json(json_t *j, const char *id, VmRecord *ret, ApiError *reterr);

/* The attestation as get_vm_attestation shows it, with "akTrust" (and the record's "attestation",
 * which has "akPinned" instead); a new reference, NULL on OOM. */
json_t *vm_attestation_to_json_full(const VmAttestation *a, bool for_disk);
/* One forward as the API shows it: {"port","address"}. */
json_t *vm_forward_to_json(const VmForward *f);
/* key: t as RFC 3339, nothing when t is 0. */
int vm_json_set_time(json_t *o, const char *key, usec_t t);
