/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The lifecycle of a VM as a pure state machine: a state, a sub-state (what the daemon is doing to
 * the VM's processes within that state) and the facts a decision depends on go in with an event; the
 * next state and sub-state, the side effects to apply and the text of lastError come out. Nothing
 * here touches a process, a file, a timer or the clock: src/core's vm_set_state() applies the answer
 * (systemd's service_set_state() with its tables is the model), and tests/unit/test-vm-state.c walks
 * every state with every event.
 *
 * The messages are here too, all of them: the refusals of operations, what lastError says after a
 * failure, and what a waiter hears. vm_message_format() renders one from its arguments. */

#include <stdbool.h>
#include <stdint.h>

#include "macro.h"
#include "time-util.h"
#include "vm-cmdline.h"

typedef enum VmState {
        VM_STATE_CREATING,
        VM_STATE_INSTALLING,
        VM_STATE_BOOTING,
        VM_STATE_ATTESTING,
        VM_STATE_READY,
        VM_STATE_RUNNING,
        VM_STATE_STOPPING,
        VM_STATE_STOPPED,
        VM_STATE_FAILED,
        VM_STATE_DELETING,
        _VM_STATE_MAX,
        _VM_STATE_INVALID = -EINVAL,
} VmState;

/* How create_vm writes the VM's disk: an installer boot of the image (boot), or the daemon itself
 * from the image's layout file before the first boot (host, off the loop in a helper process). */
typedef enum VmInstallMode {
        VM_INSTALL_HOST,
        VM_INSTALL_BOOT,
        _VM_INSTALL_MAX,
        _VM_INSTALL_INVALID = -EINVAL,
} VmInstallMode;

const char *vm_install_mode_to_string(VmInstallMode m) _const_;
VmInstallMode vm_install_mode_from_string(const char *s) _pure_;

const char *vm_state_to_string(VmState s) _const_;
VmState vm_state_from_string(const char *s) _pure_;
/* A QEMU process belongs to the VM in these states. */
bool vm_state_is_live(VmState s) _const_;

/* What the daemon is doing to the VM's processes, within its state. The start chain runs under
 * whatever state the VM had (creating, stopped, failed, installing for the installed boot after the
 * installer, creating for the first boot after a host install); the host install runs under
 * creating; the stop escalation runs under stopping and deleting, and SIGKILL also under installing
 * when the installer overran. */
typedef enum VmSubState {
        VM_SUB_NONE,
        VM_SUB_START_HELPERS,  /* swtpm (and vhost-device-vsock) spawned, probed until they answer */
        VM_SUB_START_QMP,      /* QEMU spawned, its monitor not answering yet */
        VM_SUB_READY_QUOTE,    /* READY=1 came first: the verified ready-stage quote it needs may follow */
        VM_SUB_STOP_POWERDOWN, /* the ACPI power button pressed; SIGTERM at the stop timeout */
        VM_SUB_STOP_SIGTERM,   /* SIGTERM sent; SIGKILL after the grace */
        VM_SUB_STOP_SIGKILL,   /* SIGKILL sent; QEMU's exit follows */
        VM_SUB_HOST_INSTALL,   /* the host install's helper writes the disk (creating, install mode host) */
        _VM_SUB_MAX,
        _VM_SUB_INVALID = -EINVAL,
} VmSubState;

const char *vm_sub_state_to_string(VmSubState s) _const_;
VmSubState vm_sub_state_from_string(const char *s) _pure_;

/* Where the current installed boot stands with its attestation. */
typedef enum VmGate {
        VM_GATE_NONE,     /* the boot need not attest */
        VM_GATE_CLOSED,   /* it must; the guest never asked for a nonce */
        VM_GATE_NONCE,    /* ... it asked for one and posted no initrd quote */
        VM_GATE_REJECTED, /* ... its initrd quote was rejected */
        VM_GATE_INITRD,   /* its initrd quote verified: user-data is released */
        VM_GATE_READY,    /* its ready-stage quote verified: READY=1 makes the VM ready */
        _VM_GATE_MAX,
        _VM_GATE_INVALID = -EINVAL,
} VmGate;

const char *vm_gate_to_string(VmGate g) _const_;
VmGate vm_gate_from_string(const char *s) _pure_;

typedef enum VmEvent {
        /* operations */
        VM_EVENT_CREATE, /* create_vm: the installer's start chain */
        VM_EVENT_START,  /* start_vm: an installed boot's start chain */
        VM_EVENT_STOP,   /* stop_vm */
        VM_EVENT_REBOOT, /* reboot_vm: a stop, a start once it is done */
        VM_EVENT_DELETE, /* delete_vm */
        /* the start chain */
        VM_EVENT_HELPERS_UP,   /* swtpm (and vhost-device-vsock) answer */
        VM_EVENT_QMP_UP,       /* QEMU's monitor answers */
        VM_EVENT_START_FAILED, /* a step of the chain failed; the event says why */
        /* QEMU's end */
        VM_EVENT_EXIT,              /* QEMU exited with 0 */
        VM_EVENT_EXIT_GUEST_FAILED, /* ... after the guest's PID 1 reported EXIT_STATUS= other than 0 */
        VM_EVENT_EXIT_FAILED,       /* QEMU exited otherwise, or was killed */
        /* timers */
        VM_EVENT_PHASE_TIMEOUT,    /* the install or boot timeout, or the ready quote's grace */
        VM_EVENT_STOP_TIMEOUT,     /* the stop timeout, or the grace after SIGTERM */
        VM_EVENT_POWERDOWN_FAILED, /* QEMU refused system_powerdown, or it could not be sent */
        /* the guest */
        VM_EVENT_NONCE,                 /* the boot's first attestation nonce */
        VM_EVENT_READY,                 /* READY=1 */
        VM_EVENT_QUOTE_VERIFIED_INITRD, /* verdicts, once recorded */
        VM_EVENT_QUOTE_VERIFIED_READY,
        VM_EVENT_QUOTE_REJECTED_INITRD, /* rejected for good: a golden mismatch, no golden value, another AK */
        VM_EVENT_QUOTE_REJECTED_READY,
        VM_EVENT_QUOTE_RETRYABLE, /* rejected, but the guest may try again (a stale nonce; noop mode) */
        VM_EVENT_GUEST_PANIC,     /* the kernel's panic line on the console, before readiness */
        VM_EVENT_BOOTSTRAP_FAILED, /* a unit of the user-data's bootstrap (kubeadm.service) failed, before readiness */
        /* a daemon restart */
        VM_EVENT_RESTARTED,       /* the record was loaded */
        VM_EVENT_REATTACHED,      /* the monitor of a QEMU an earlier daemon started answers */
        VM_EVENT_REATTACH_FAILED, /* ... that QEMU cannot be attached to */
        /* the host install (create_vm in install mode host) */
        VM_EVENT_CREATE_HOST,         /* create_vm: the host install's helper, then the first boot's chain */
        VM_EVENT_HOST_INSTALLED,      /* the helper laid the disk out */
        VM_EVENT_HOST_INSTALL_FAILED, /* ... it failed (or could not start); the event says why */
        _VM_EVENT_MAX,
        _VM_EVENT_INVALID = -EINVAL,
} VmEvent;

const char *vm_event_to_string(VmEvent e) _const_;
VmEvent vm_event_from_string(const char *s) _pure_;

/* The side effects of a transition. vm_set_state() applies them in the order of this list. */
typedef enum VmAction {
        VM_ACTION_TEARDOWN =
                1 << 0, /* QEMU is gone: its monitor, NIC link, READY=1 listener, helpers and timers go */
        VM_ACTION_KILL = 1 << 1,       /* every process of the run ends at once, the start chain with it */
        VM_ACTION_DISARM = 1 << 2,     /* the phase timer goes */
        VM_ACTION_BEGIN_BOOT = 1 << 3, /* a new installed boot: readiness, status, errors, attestation afresh */
        VM_ACTION_INSTALLED = 1 << 4,       /* installedAt, the install duration observed */
        VM_ACTION_BECOME_READY = 1 << 5,    /* readyAt, the boot-to-ready duration observed, booted */
        VM_ACTION_CLEAR_REJECTION = 1 << 6, /* lastError goes when it is the rejection of this quote's stage */
        VM_ACTION_CONSOLE = 1 << 7,         /* consoleTail: the console's last lines, for a failure */
        VM_ACTION_SPAWN_HELPERS = 1 << 8,   /* the start chain: swtpm and vhost-device-vsock, probed */
        VM_ACTION_SPAWN_QEMU = 1 << 9,      /* QEMU, its monitor connected */
        VM_ACTION_LINK = 1 << 10,           /* the NIC dialled by the switch, the metadata listener */
        VM_ACTION_PHASE_TIMER = 1 << 11,    /* the install or boot timeout, by phase */
        VM_ACTION_GRACE_TIMER = 1 << 12,    /* the grace of the ready-stage quote, as the phase timer */
        VM_ACTION_SAVE = 1 << 13,         /* the record written, the generation bumped, waiters looked at */
        VM_ACTION_POWERDOWN = 1 << 14,    /* system_powerdown, the stop timeout armed */
        VM_ACTION_SIGTERM = 1 << 15,      /* SIGTERM to QEMU, SIGKILL armed after the grace */
        VM_ACTION_SIGKILL = 1 << 16,      /* SIGKILL to QEMU */
        VM_ACTION_FINISH_START = 1 << 17, /* the start chain's waiters hear how it ended */
        VM_ACTION_HOST_INSTALL = 1 << 18, /* the host install's helper process, watched */
        VM_ACTION_DROP_DISK = 1 << 19, /* the disk volume deleted: a create that did not finish leaves none */
} VmAction;

/* The messages: refusals (conflict), lastError texts, and what waiters hear. */
typedef enum VmMessage {
        VM_MESSAGE_NONE,  /* lastError stays as it is */
        VM_MESSAGE_CLEAR, /* lastError goes */
        /* refusals */
        VM_MESSAGE_SHUTTING_DOWN,
        VM_MESSAGE_BEING_DELETED,
        VM_MESSAGE_ALREADY_DELETING,
        VM_MESSAGE_STILL_STARTING,
        VM_MESSAGE_NOT_RUNNING,
        VM_MESSAGE_HAS_PROCESS,
        VM_MESSAGE_NOT_INSTALLED,
        /* lastError */
        VM_MESSAGE_DETAIL, /* the event's own text: why a start failed, the verdict that ended the boot */
        VM_MESSAGE_START_EXIT,
        VM_MESSAGE_INSTALL_TIMEOUT,
        VM_MESSAGE_INSTALL_EXIT,
        VM_MESSAGE_SHUTDOWN_BEFORE_BOOT,
        VM_MESSAGE_START_BOOT,
        VM_MESSAGE_GUEST_FAILED,
        VM_MESSAGE_GUEST_SHUTDOWN,
        VM_MESSAGE_QEMU_EXIT,
        VM_MESSAGE_NO_READY,
        VM_MESSAGE_NO_READY_QUOTE,
        VM_MESSAGE_GUEST_PANIC,
        VM_MESSAGE_BOOTSTRAP_FAILED,
        VM_MESSAGE_READY_NO_NONCE,
        VM_MESSAGE_READY_NO_QUOTE,
        VM_MESSAGE_READY_REJECTED,
        VM_MESSAGE_QUOTE_REJECTED,
        VM_MESSAGE_RESTARTED,
        VM_MESSAGE_NOT_REATTACHED,
        /* the start chain's failures (VM_MESSAGE_DETAIL of VM_EVENT_START_FAILED) */
        VM_MESSAGE_VTPM_TIMEOUT,
        VM_MESSAGE_VSOCKD_TIMEOUT,
        VM_MESSAGE_NOTIFY_LISTEN,
        VM_MESSAGE_QEMU_SPAWN,
        VM_MESSAGE_QMP_TIMEOUT,
        VM_MESSAGE_DELETED_STARTING,
        VM_MESSAGE_PREPARE,
        VM_MESSAGE_SWTPM_SPAWN,
        VM_MESSAGE_VSOCKD_SPAWN,
        VM_MESSAGE_PROBE_TIMER,
        VM_MESSAGE_TPM_SETUP,
        /* reasons the reattach failed (VM_MESSAGE_NOT_REATTACHED's detail) */
        VM_MESSAGE_NO_UNITS,
        VM_MESSAGE_WAS_CHILD,
        VM_MESSAGE_QMP_SILENT,
        /* the host install (VM_MESSAGE_DETAIL of VM_EVENT_HOST_INSTALL_FAILED) */
        VM_MESSAGE_HOST_INSTALL,
        VM_MESSAGE_HOST_INSTALL_SPAWN,
        VM_MESSAGE_HOST_INSTALL_UNSUPPORTED,
        /* waiters */
        VM_MESSAGE_WAIT_TIMEOUT,
        VM_MESSAGE_WAIT_FAILED,
        VM_MESSAGE_WAIT_ENDED,
        _VM_MESSAGE_MAX,
        _VM_MESSAGE_INVALID = -EINVAL,
} VmMessage;

const char *vm_message_to_string(VmMessage m) _const_;
VmMessage vm_message_from_string(const char *s) _pure_;

/* What a message may name; each takes the fields its text needs (vm-state.c lists them). NULL
 * strings render as "?" where the text needs one. */
typedef struct VmMessageArgs {
        const char *id;
        VmState state;            /* the state the text names */
        const char *exit_status;  /* QEMU's, "exited with status 1" */
        const char *guest_status; /* the EXIT_STATUS= of the guest's PID 1 */
        const char *cause; /* the rejected quote that made the guest give up ("initrd attestation ..."), or NULL */
        const char *stage;      /* of a quote: "initrd" or "ready" */
        const char *detail;     /* a log's tail, a verdict's message, lastError, a reason */
        const char *errno_text; /* strerror() of what failed */
        const char *what;       /* what the text is about: the QMP socket, a directory, the milestone */
        usec_t duration;        /* a timeout or a grace */
} VmMessageArgs;

/* A new string, NULL on OOM (or for VM_MESSAGE_NONE and VM_MESSAGE_CLEAR). */
char *vm_message_format(VmMessage m, const VmMessageArgs *a);

/* What a decision depends on. */
typedef struct VmStatus {
        VmState state;
        VmSubState sub;
        VmPhase phase;      /* of the current (or last) run; _VM_PHASE_INVALID before the first */
        VmGate gate;        /* of the current (or last) installed boot */
        bool failing;       /* a verdict ended the boot: the VM is failed once QEMU is gone */
        bool installed;     /* the installer (or the host install) finished once */
        bool shutting_down; /* the daemon is stopping */
} VmStatus;

/* Whether the status is one the lifecycle reaches: a start chain only from creating, stopped or failed
 * (or installing, for the installed boot after the installer), a stop escalation only under stopping
 * or deleting (SIGKILL also under installing), a ready quote awaited only while READY=1 is, failing
 * only on the way down, the states of an installed boot only in the boot phase. From a valid status,
 * every transition leads to a valid one. */
bool vm_status_is_valid(const VmStatus *s) _pure_;

/* Whether QEMU runs for the VM, or its start chain does. */
bool vm_status_has_process(const VmStatus *s) _pure_;

typedef struct VmTransition {
        int error;         /* < 0: the event is refused with message, and nothing changes */
        bool ignored;      /* the event does not apply (a timer or a message that came too late) */
        VmState state;     /* the next state */
        VmSubState sub;    /* the next sub-state */
        VmPhase phase;     /* the next phase */
        bool failing;      /* the next value */
        VmAction actions;  /* to apply */
        VmMessage message; /* lastError (or the refusal) */
} VmTransition;

VmTransition vm_state_next(const VmStatus *s, VmEvent e);

/* create_vm's wait_for, and where a waiter for it stands. */
typedef enum VmWaitFor {
        VM_WAIT_NONE,
        VM_WAIT_INSTALLED,
        VM_WAIT_ATTESTED,
        VM_WAIT_READY,
        _VM_WAIT_MAX,
        _VM_WAIT_INVALID = -EINVAL,
} VmWaitFor;

const char *vm_wait_for_to_string(VmWaitFor w) _const_;
VmWaitFor vm_wait_for_from_string(const char *s) _pure_;

/* The milestones a VM has passed: installed (installedAt), attested (booted with its user-data
 * released), ready (readyAt). */
typedef struct VmMilestones {
        bool installed, attested, ready;
} VmMilestones;

typedef enum VmWaitVerdict {
        VM_WAIT_PENDING,   /* not yet */
        VM_WAIT_REACHED,   /* the waiter is answered with the record */
        VM_WAIT_FAILED,    /* ... with VM_MESSAGE_WAIT_FAILED: the VM failed, or a verdict ends it */
        VM_WAIT_ABANDONED, /* ... with VM_MESSAGE_WAIT_ENDED: stopped or deleted on the way */
        _VM_WAIT_VERDICT_MAX,
        _VM_WAIT_VERDICT_INVALID = -EINVAL,
} VmWaitVerdict;

VmWaitVerdict vm_state_wait(const VmStatus *s, const VmMilestones *m, VmWaitFor w) _pure_;
