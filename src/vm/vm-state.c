/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "parse-util.h"
#include "string-table.h"
#include "vm-state.h"

static const char *const vm_state_table[_VM_STATE_MAX] = {
        [VM_STATE_CREATING] = "creating", [VM_STATE_INSTALLING] = "installing",
        [VM_STATE_BOOTING] = "booting",   [VM_STATE_ATTESTING] = "attesting",
        [VM_STATE_READY] = "ready",       [VM_STATE_RUNNING] = "running",
        [VM_STATE_STOPPING] = "stopping", [VM_STATE_STOPPED] = "stopped",
        [VM_STATE_FAILED] = "failed",     [VM_STATE_DELETING] = "deleting",
};

DEFINE_STRING_TABLE_LOOKUP(vm_state, VmState);

static const char *const vm_install_mode_table[_VM_INSTALL_MAX] = {
        [VM_INSTALL_HOST] = "host",
        [VM_INSTALL_BOOT] = "boot",
};

DEFINE_STRING_TABLE_LOOKUP(vm_install_mode, VmInstallMode);

bool vm_state_is_live(VmState s) {
        return IN_SET(
                s,
                VM_STATE_INSTALLING,
                VM_STATE_BOOTING,
                VM_STATE_ATTESTING,
                VM_STATE_READY,
                VM_STATE_RUNNING,
                VM_STATE_STOPPING);
}

static const char *const vm_sub_state_table[_VM_SUB_MAX] = {
        [VM_SUB_NONE] = "none",
        [VM_SUB_START_HELPERS] = "start-helpers",
        [VM_SUB_START_QMP] = "start-qmp",
        [VM_SUB_READY_QUOTE] = "ready-quote",
        [VM_SUB_STOP_POWERDOWN] = "stop-powerdown",
        [VM_SUB_STOP_SIGTERM] = "stop-sigterm",
        [VM_SUB_STOP_SIGKILL] = "stop-sigkill",
        [VM_SUB_HOST_INSTALL] = "host-install",
};

DEFINE_STRING_TABLE_LOOKUP(vm_sub_state, VmSubState);

static const char *const vm_gate_table[_VM_GATE_MAX] = {
        [VM_GATE_NONE] = "none",         [VM_GATE_CLOSED] = "closed", [VM_GATE_NONCE] = "nonce",
        [VM_GATE_REJECTED] = "rejected", [VM_GATE_INITRD] = "initrd", [VM_GATE_READY] = "ready",
};

DEFINE_STRING_TABLE_LOOKUP(vm_gate, VmGate);

static const char *const vm_event_table[_VM_EVENT_MAX] = {
        [VM_EVENT_CREATE] = "create",
        [VM_EVENT_START] = "start",
        [VM_EVENT_STOP] = "stop",
        [VM_EVENT_REBOOT] = "reboot",
        [VM_EVENT_DELETE] = "delete",
        [VM_EVENT_HELPERS_UP] = "helpers-up",
        [VM_EVENT_QMP_UP] = "qmp-up",
        [VM_EVENT_START_FAILED] = "start-failed",
        [VM_EVENT_EXIT] = "exit",
        [VM_EVENT_EXIT_GUEST_FAILED] = "exit-guest-failed",
        [VM_EVENT_EXIT_FAILED] = "exit-failed",
        [VM_EVENT_PHASE_TIMEOUT] = "phase-timeout",
        [VM_EVENT_STOP_TIMEOUT] = "stop-timeout",
        [VM_EVENT_POWERDOWN_FAILED] = "powerdown-failed",
        [VM_EVENT_NONCE] = "nonce",
        [VM_EVENT_READY] = "ready",
        [VM_EVENT_QUOTE_VERIFIED_INITRD] = "quote-verified-initrd",
        [VM_EVENT_QUOTE_VERIFIED_READY] = "quote-verified-ready",
        [VM_EVENT_QUOTE_REJECTED_INITRD] = "quote-rejected-initrd",
        [VM_EVENT_QUOTE_REJECTED_READY] = "quote-rejected-ready",
        [VM_EVENT_QUOTE_RETRYABLE] = "quote-retryable",
        [VM_EVENT_GUEST_PANIC] = "guest-panic",
        [VM_EVENT_BOOTSTRAP_FAILED] = "bootstrap-failed",
        [VM_EVENT_RESTARTED] = "restarted",
        [VM_EVENT_REATTACHED] = "reattached",
        [VM_EVENT_REATTACH_FAILED] = "reattach-failed",
        [VM_EVENT_CREATE_HOST] = "create-host",
        [VM_EVENT_HOST_INSTALLED] = "host-installed",
        [VM_EVENT_HOST_INSTALL_FAILED] = "host-install-failed",
};

DEFINE_STRING_TABLE_LOOKUP(vm_event, VmEvent);

static const char *const vm_wait_for_table[_VM_WAIT_MAX] = {
        [VM_WAIT_NONE] = "none",
        [VM_WAIT_INSTALLED] = "installed",
        [VM_WAIT_ATTESTED] = "attested",
        [VM_WAIT_READY] = "ready",
};

DEFINE_STRING_TABLE_LOOKUP(vm_wait_for, VmWaitFor);

/* ---- the messages ---------------------------------------------------------------------------- */

static const char *const vm_message_table[_VM_MESSAGE_MAX] = {
        [VM_MESSAGE_NONE] = "none",
        [VM_MESSAGE_CLEAR] = "clear",
        [VM_MESSAGE_SHUTTING_DOWN] = "shutting-down",
        [VM_MESSAGE_BEING_DELETED] = "being-deleted",
        [VM_MESSAGE_ALREADY_DELETING] = "already-deleting",
        [VM_MESSAGE_STILL_STARTING] = "still-starting",
        [VM_MESSAGE_NOT_RUNNING] = "not-running",
        [VM_MESSAGE_HAS_PROCESS] = "has-process",
        [VM_MESSAGE_NOT_INSTALLED] = "not-installed",
        [VM_MESSAGE_DETAIL] = "detail",
        [VM_MESSAGE_START_EXIT] = "start-exit",
        [VM_MESSAGE_INSTALL_TIMEOUT] = "install-timeout",
        [VM_MESSAGE_INSTALL_EXIT] = "install-exit",
        [VM_MESSAGE_SHUTDOWN_BEFORE_BOOT] = "shutdown-before-boot",
        [VM_MESSAGE_START_BOOT] = "start-boot",
        [VM_MESSAGE_GUEST_FAILED] = "guest-failed",
        [VM_MESSAGE_GUEST_SHUTDOWN] = "guest-shutdown",
        [VM_MESSAGE_QEMU_EXIT] = "qemu-exit",
        [VM_MESSAGE_NO_READY] = "no-ready",
        [VM_MESSAGE_NO_READY_QUOTE] = "no-ready-quote",
        [VM_MESSAGE_GUEST_PANIC] = "guest-panic",
        [VM_MESSAGE_BOOTSTRAP_FAILED] = "bootstrap-failed",
        [VM_MESSAGE_READY_NO_NONCE] = "ready-no-nonce",
        [VM_MESSAGE_READY_NO_QUOTE] = "ready-no-quote",
        [VM_MESSAGE_READY_REJECTED] = "ready-rejected",
        [VM_MESSAGE_QUOTE_REJECTED] = "quote-rejected",
        [VM_MESSAGE_RESTARTED] = "restarted",
        [VM_MESSAGE_NOT_REATTACHED] = "not-reattached",
        [VM_MESSAGE_VTPM_TIMEOUT] = "vtpm-timeout",
        [VM_MESSAGE_VSOCKD_TIMEOUT] = "vsockd-timeout",
        [VM_MESSAGE_NOTIFY_LISTEN] = "notify-listen",
        [VM_MESSAGE_QEMU_SPAWN] = "qemu-spawn",
        [VM_MESSAGE_QMP_TIMEOUT] = "qmp-timeout",
        [VM_MESSAGE_DELETED_STARTING] = "deleted-starting",
        [VM_MESSAGE_PREPARE] = "prepare",
        [VM_MESSAGE_SWTPM_SPAWN] = "swtpm-spawn",
        [VM_MESSAGE_VSOCKD_SPAWN] = "vsockd-spawn",
        [VM_MESSAGE_PROBE_TIMER] = "probe-timer",
        [VM_MESSAGE_TPM_SETUP] = "tpm-setup",
        [VM_MESSAGE_NO_UNITS] = "no-units",
        [VM_MESSAGE_WAS_CHILD] = "was-child",
        [VM_MESSAGE_QMP_SILENT] = "qmp-silent",
        [VM_MESSAGE_HOST_INSTALL] = "host-install",
        [VM_MESSAGE_HOST_INSTALL_SPAWN] = "host-install-spawn",
        [VM_MESSAGE_HOST_INSTALL_UNSUPPORTED] = "host-install-unsupported",
        [VM_MESSAGE_WAIT_TIMEOUT] = "wait-timeout",
        [VM_MESSAGE_WAIT_FAILED] = "wait-failed",
        [VM_MESSAGE_WAIT_ENDED] = "wait-ended",
};

DEFINE_STRING_TABLE_LOOKUP(vm_message, VmMessage);

#define FOLLOW_HINT "(follow it with get_vm %s, delete it with delete_vm)"
#define READY_UNATTESTED(why)                                                                \
        "attestation required: the guest sent READY=1 without a verified initrd quote (" why \
        "); "                                                                                \
        "its user-data was not released"

static char *format(const char *fmt, ...) _printf_(1, 2);
static char *format(const char *fmt, ...) {
        va_list ap;
        char *s;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&s, fmt, ap);
        va_end(ap);
        return r < 0 ? NULL : s;
}

static const char *or_unknown(const char *s) {
        return s ?: "?";
}

char *vm_message_format(VmMessage m, const VmMessageArgs *a) {
        static const VmMessageArgs none = { .state = _VM_STATE_INVALID };
        const char *id, *state;
        char d[32];

        a = a ?: &none;
        id = or_unknown(a->id);
        state = or_unknown(vm_state_to_string(a->state));
        format_duration(d, sizeof(d), a->duration);

        switch (m) {
        case VM_MESSAGE_SHUTTING_DOWN:
                return strdup("vm-manager is shutting down");
        case VM_MESSAGE_BEING_DELETED:
                return format("vm %s is being deleted", id);
        case VM_MESSAGE_ALREADY_DELETING:
                return format("vm %s is already being deleted", id);
        case VM_MESSAGE_STILL_STARTING:
                return format("vm %s is %s and still starting; try again in a moment", id, state);
        case VM_MESSAGE_NOT_RUNNING:
                return format("vm %s is not running (%s)", id, state);
        case VM_MESSAGE_HAS_PROCESS:
                return format("vm %s is %s", id, state);
        case VM_MESSAGE_NOT_INSTALLED:
                return format("vm %s never finished installing; delete and recreate it", id);
        case VM_MESSAGE_DETAIL:
                return strdup(or_unknown(a->detail));
        case VM_MESSAGE_START_EXIT:
                return format("qemu exited during start (%s): %s", or_unknown(a->exit_status), a->detail ?: "");
        case VM_MESSAGE_INSTALL_TIMEOUT:
                return format("installer did not finish within %s", d);
        case VM_MESSAGE_INSTALL_EXIT:
                return format("installer exited: %s", or_unknown(a->exit_status));
        case VM_MESSAGE_SHUTDOWN_BEFORE_BOOT:
                return strdup("vm-manager shut down before the installed boot started; start the VM");
        case VM_MESSAGE_START_BOOT:
                return format("start installed boot: %s", a->detail ?: "error");
        case VM_MESSAGE_GUEST_FAILED:
                /* the rejected quote that made the guest give up first, when there is one */
                return format(
                        "%s%sguest shut down (EXIT_STATUS=%s)",
                        a->cause ?: "",
                        a->cause ? "; then the " : "",
                        or_unknown(a->guest_status));
        case VM_MESSAGE_GUEST_SHUTDOWN:
                return strdup("guest shut down");
        case VM_MESSAGE_QEMU_EXIT:
                return format(
                        "%s%sqemu exited: %s",
                        a->cause ?: "",
                        a->cause ? "; then " : "",
                        or_unknown(a->exit_status));
        case VM_MESSAGE_NO_READY:
                return format("no READY=1 within %s; the guest is up but has not reported ready", d);
        case VM_MESSAGE_NO_READY_QUOTE:
                return format(
                        "attestation required: the guest sent READY=1, but no verified ready-stage quote "
                        "followed within %s (its ready-stage attestation did not run or did not reach the "
                        "metadata service)",
                        d);
        case VM_MESSAGE_GUEST_PANIC:
                return format("guest kernel panicked while %s: %s", state, or_unknown(a->detail));
        case VM_MESSAGE_BOOTSTRAP_FAILED:
                return format("the guest's bootstrap failed while %s: %s", state, or_unknown(a->detail));
        case VM_MESSAGE_READY_NO_NONCE:
                return strdup(READY_UNATTESTED("it never asked for a nonce: does the image run vm-agent?"));
        case VM_MESSAGE_READY_NO_QUOTE:
                return strdup(READY_UNATTESTED("it asked for a nonce but posted no quote"));
        case VM_MESSAGE_READY_REJECTED:
                return format(READY_UNATTESTED("its quote was rejected: %s"), or_unknown(a->detail));
        case VM_MESSAGE_QUOTE_REJECTED:
                return format("%s attestation rejected: %s", or_unknown(a->stage), a->detail ?: "");
        case VM_MESSAGE_RESTARTED:
                return format("vm-manager restarted while the VM was %s; delete it", state);
        case VM_MESSAGE_NOT_REATTACHED:
                return format(
                        "vm-manager restarted while the VM was %s and could not reattach to its QEMU (%s); "
                        "start the VM again",
                        state,
                        or_unknown(a->detail));
        case VM_MESSAGE_VTPM_TIMEOUT:
                return format(
                        "vtpm not responding: swtpm control socket did not answer within 5s: %s",
                        a->detail ?: "");
        case VM_MESSAGE_VSOCKD_TIMEOUT:
                return format("vhost-device-vsock did not come up within 5s: %s", a->detail ?: "");
        case VM_MESSAGE_NOTIFY_LISTEN:
                return strdup("failed to listen for READY=1");
        case VM_MESSAGE_QEMU_SPAWN:
                return format(
                        "failed to start qemu: %s%s%s",
                        or_unknown(a->errno_text),
                        a->detail && *a->detail ? ": " : "",
                        a->detail ?: "");
        case VM_MESSAGE_QMP_TIMEOUT:
                return format(
                        "qemu QMP at %s did not answer within %s: %s (%s)",
                        a->what ?: "qmp.sock",
                        d,
                        or_unknown(a->errno_text),
                        a->detail && *a->detail ? a->detail : "qemu wrote nothing to its log");
        case VM_MESSAGE_DELETED_STARTING:
                return strdup("deleted while starting");
        case VM_MESSAGE_PREPARE:
                return format("preparing %s: %s", or_unknown(a->what), or_unknown(a->errno_text));
        case VM_MESSAGE_SWTPM_SPAWN:
                return format("starting swtpm: %s", or_unknown(a->errno_text));
        case VM_MESSAGE_VSOCKD_SPAWN:
                return format("starting vhost-device-vsock: %s", or_unknown(a->errno_text));
        case VM_MESSAGE_PROBE_TIMER:
                return format("starting %s: %s", id, or_unknown(a->errno_text));
        case VM_MESSAGE_TPM_SETUP:
                return format(
                        "vtpm could not be manufactured: swtpm_setup %s: %s",
                        or_unknown(a->exit_status ?: a->errno_text),
                        a->detail ?: "");
        case VM_MESSAGE_NO_UNITS:
                return strdup("no service manager to find its units in");
        case VM_MESSAGE_WAS_CHILD:
                return strdup("it ran as a plain child process, which ends with the daemon");
        case VM_MESSAGE_QMP_SILENT:
                return format("its QMP socket did not answer: %s", or_unknown(a->errno_text));
        case VM_MESSAGE_HOST_INSTALL:
                return format(
                        "host install failed (%s): %s; the disk was removed",
                        or_unknown(a->exit_status),
                        a->detail && *a->detail ? a->detail : "the helper gave no reason");
        case VM_MESSAGE_HOST_INSTALL_SPAWN:
                return format(
                        "host install failed: cannot start its helper: %s; the disk was removed",
                        or_unknown(a->errno_text));
        case VM_MESSAGE_HOST_INSTALL_UNSUPPORTED:
                return format(
                        "image %s cannot be installed on the host: it has no layout file (%s.layout.json); "
                        "use install_mode boot",
                        or_unknown(a->what),
                        or_unknown(a->what));
        case VM_MESSAGE_WAIT_TIMEOUT:
                return format(
                        "vm %s did not reach %s within %s (state %s); vm %s is %s%s%s " FOLLOW_HINT,
                        id,
                        or_unknown(a->what),
                        d,
                        state,
                        id,
                        state,
                        a->detail ? ": " : "",
                        a->detail ?: "",
                        id);
        case VM_MESSAGE_WAIT_FAILED:
                return format("%s; vm %s is failed " FOLLOW_HINT, a->detail ?: "unknown error", id, id);
        case VM_MESSAGE_WAIT_ENDED:
                return format("vm is %s; vm %s is %s " FOLLOW_HINT, state, id, state, id);
        case VM_MESSAGE_NONE:
        case VM_MESSAGE_CLEAR:
        default:
                return NULL;
        }
}

/* ---- the transitions ------------------------------------------------------------------------- */

/* The start chain, or the host install that comes before create_vm's. */
static bool sub_is_starting(VmSubState u) {
        return IN_SET(u, VM_SUB_START_HELPERS, VM_SUB_START_QMP, VM_SUB_HOST_INSTALL);
}

static bool sub_is_stopping(VmSubState u) {
        return IN_SET(u, VM_SUB_STOP_POWERDOWN, VM_SUB_STOP_SIGTERM, VM_SUB_STOP_SIGKILL);
}

bool vm_status_is_valid(const VmStatus *s) {
        if (s->state < 0 || s->state >= _VM_STATE_MAX || s->sub < 0 || s->sub >= _VM_SUB_MAX ||
            s->gate < 0 || s->gate >= _VM_GATE_MAX || s->phase < _VM_PHASE_INVALID ||
            s->phase >= _VM_PHASE_MAX || (s->phase < 0 && s->phase != _VM_PHASE_INVALID))
                return false;
        /* a verdict ends a boot through stopping; a delete may come on top */
        if (s->failing && !IN_SET(s->state, VM_STATE_STOPPING, VM_STATE_DELETING))
                return false;

        switch (s->sub) {
        case VM_SUB_START_HELPERS:
        case VM_SUB_START_QMP:
                /* create_vm's chain (the installer's, or the first boot's after a host install),
                 * start_vm's, and the installed boot's after the installer */
                if (!(s->state == VM_STATE_CREATING && s->phase == VM_PHASE_INSTALL) &&
                    !(s->state == VM_STATE_CREATING && s->phase == VM_PHASE_BOOT && s->installed) &&
                    !(IN_SET(s->state, VM_STATE_INSTALLING, VM_STATE_STOPPED, VM_STATE_FAILED) &&
                      s->phase == VM_PHASE_BOOT && s->installed))
                        return false;
                break;
        case VM_SUB_HOST_INSTALL:
                if (s->state != VM_STATE_CREATING || s->phase != VM_PHASE_INSTALL || s->installed)
                        return false;
                break;
        case VM_SUB_READY_QUOTE:
                if (!IN_SET(s->state, VM_STATE_BOOTING, VM_STATE_ATTESTING, VM_STATE_RUNNING))
                        return false;
                break;
        case VM_SUB_STOP_POWERDOWN:
        case VM_SUB_STOP_SIGTERM:
                if (!IN_SET(s->state, VM_STATE_STOPPING, VM_STATE_DELETING))
                        return false;
                break;
        case VM_SUB_STOP_SIGKILL:
                if (!IN_SET(s->state, VM_STATE_STOPPING, VM_STATE_DELETING) &&
                    !(s->state == VM_STATE_INSTALLING && s->phase == VM_PHASE_INSTALL))
                        return false;
                break;
        default:
                break;
        }

        switch (s->state) {
        case VM_STATE_CREATING:
                /* after a host install, the first boot's start chain runs under creating */
                return (!s->installed && s->phase != VM_PHASE_BOOT) ||
                        (s->installed && s->phase == VM_PHASE_BOOT &&
                         IN_SET(s->sub, VM_SUB_START_HELPERS, VM_SUB_START_QMP));
        case VM_STATE_INSTALLING:
                return (s->phase == VM_PHASE_INSTALL && !s->installed) ||
                        (s->phase == VM_PHASE_BOOT && sub_is_starting(s->sub));
        case VM_STATE_BOOTING:
        case VM_STATE_ATTESTING:
        case VM_STATE_READY:
        case VM_STATE_RUNNING:
                return s->phase == VM_PHASE_BOOT && s->installed;
        default:
                return true;
        }
}

bool vm_status_has_process(const VmStatus *s) {
        return sub_is_starting(s->sub) || vm_state_is_live(s->state);
}

/* QEMU itself runs (not only its start chain). */
static bool has_qemu(const VmStatus *s) {
        return vm_state_is_live(s->state) && !sub_is_starting(s->sub);
}

/* An installed boot that attestation verdicts and READY=1 concern. */
static bool is_booting(const VmStatus *s) {
        return s->phase == VM_PHASE_BOOT && has_qemu(s) &&
                IN_SET(s->state, VM_STATE_BOOTING, VM_STATE_ATTESTING, VM_STATE_RUNNING, VM_STATE_READY);
}

/* Still waiting for READY=1 (or its quote). */
static bool awaits_ready(const VmStatus *s) {
        return IN_SET(s->state, VM_STATE_BOOTING, VM_STATE_ATTESTING, VM_STATE_RUNNING);
}

static VmTransition refuse(VmTransition t, int error, VmMessage m) {
        t.error = error;
        t.message = m;
        return t;
}

static VmTransition ignore(VmTransition t) {
        t.ignored = true;
        return t;
}

/* The stop escalation starts with the power button, unless it is under way already. */
static VmTransition begin_stop(VmTransition t, const VmStatus *s) {
        if (has_qemu(s) && !sub_is_stopping(s->sub)) {
                t.sub = VM_SUB_STOP_POWERDOWN;
                t.actions |= VM_ACTION_POWERDOWN;
        }
        return t;
}

/* A boot that cannot succeed ends: lastError says why at once, QEMU is powered off (the power button
 * when graceful, else SIGTERM), and the VM is failed once it is gone. */
static VmTransition fail_boot(VmTransition t, const VmStatus *s, VmMessage why, bool graceful) {
        if (s->failing || IN_SET(s->state, VM_STATE_STOPPING, VM_STATE_DELETING))
                return ignore(t); /* on its way down already */
        t.actions |= VM_ACTION_DISARM | VM_ACTION_SAVE;
        t.message = why;
        t.sub = VM_SUB_NONE;
        if (!has_qemu(s)) {
                t.state = VM_STATE_FAILED;
                return t;
        }
        t.state = VM_STATE_STOPPING;
        t.failing = true;
        if (graceful) {
                t.sub = VM_SUB_STOP_POWERDOWN;
                t.actions |= VM_ACTION_POWERDOWN;
        } else {
                t.sub = VM_SUB_STOP_SIGTERM;
                t.actions |= VM_ACTION_SIGTERM;
        }
        return t;
}

static VmTransition become_ready(VmTransition t) {
        t.state = VM_STATE_READY;
        t.sub = VM_SUB_NONE;
        t.message = VM_MESSAGE_CLEAR;
        t.actions |= VM_ACTION_BECOME_READY | VM_ACTION_DISARM | VM_ACTION_SAVE;
        return t;
}

static VmTransition qemu_exited(VmTransition t, const VmStatus *s, VmEvent e) {
        t.actions |= VM_ACTION_TEARDOWN | VM_ACTION_SAVE;
        t.sub = VM_SUB_NONE;

        if (IN_SET(s->sub, VM_SUB_START_HELPERS, VM_SUB_HOST_INSTALL))
                return ignore(t); /* no QEMU yet */
        if (s->sub == VM_SUB_START_QMP) {
                t.state = VM_STATE_FAILED;
                t.message = VM_MESSAGE_START_EXIT;
                t.actions |= VM_ACTION_FINISH_START;
                return t;
        }
        if (s->state == VM_STATE_DELETING)
                return t;
        if (s->state == VM_STATE_STOPPING) {
                /* powered off for a verdict: failed, and lastError still says why */
                t.state = s->failing ? VM_STATE_FAILED : VM_STATE_STOPPED;
                t.message = s->failing ? VM_MESSAGE_DETAIL : VM_MESSAGE_NONE;
                t.failing = false;
                return t;
        }
        if (s->phase == VM_PHASE_INSTALL) {
                if (e != VM_EVENT_EXIT_FAILED && s->sub != VM_SUB_STOP_SIGKILL &&
                    s->state == VM_STATE_INSTALLING) {
                        t.actions |= VM_ACTION_INSTALLED;
                        if (s->shutting_down) {
                                t.state = VM_STATE_STOPPED;
                                t.message = VM_MESSAGE_SHUTDOWN_BEFORE_BOOT;
                                return t;
                        }
                        /* the installed boot follows at once, still "installing" until its QEMU answers */
                        t.sub = VM_SUB_START_HELPERS;
                        t.phase = VM_PHASE_BOOT;
                        t.failing = false;
                        t.actions |= VM_ACTION_BEGIN_BOOT | VM_ACTION_SPAWN_HELPERS;
                        return t;
                }
                t.state = VM_STATE_FAILED;
                t.message = s->sub == VM_SUB_STOP_SIGKILL ? VM_MESSAGE_INSTALL_TIMEOUT :
                                                            VM_MESSAGE_INSTALL_EXIT;
                t.actions |= VM_ACTION_CONSOLE;
                return t;
        }
        switch (e) {
        case VM_EVENT_EXIT_GUEST_FAILED:
                t.state = VM_STATE_FAILED;
                t.message = VM_MESSAGE_GUEST_FAILED;
                t.actions |= VM_ACTION_CONSOLE;
                break;
        case VM_EVENT_EXIT:
                t.state = VM_STATE_STOPPED;
                t.message = VM_MESSAGE_GUEST_SHUTDOWN;
                break;
        default:
                t.state = VM_STATE_FAILED;
                t.message = VM_MESSAGE_QEMU_EXIT;
                t.actions |= VM_ACTION_CONSOLE;
        }
        return t;
}

static VmTransition on_ready(VmTransition t, const VmStatus *s, VmEvent e) {
        if (!awaits_ready(s)) {
                t.actions |= VM_ACTION_SAVE; /* STATUS= may have come with it */
                return t;
        }
        switch (s->gate) {
        case VM_GATE_CLOSED:
                return fail_boot(t, s, VM_MESSAGE_READY_NO_NONCE, /* graceful= */ true);
        case VM_GATE_NONCE:
                return fail_boot(t, s, VM_MESSAGE_READY_NO_QUOTE, /* graceful= */ true);
        case VM_GATE_REJECTED:
                return fail_boot(t, s, VM_MESSAGE_READY_REJECTED, /* graceful= */ true);
        case VM_GATE_INITRD:
                /* its ready-stage quote may still be on the way */
                t.sub = VM_SUB_READY_QUOTE;
                t.actions |= VM_ACTION_GRACE_TIMER | VM_ACTION_SAVE;
                return t;
        default:
                return become_ready(t);
        }
}

/* ---- one handler per event; vm_state_next() looks them up in the table below ---- */

static VmTransition on_create(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->shutting_down)
                return refuse(t, -ESHUTDOWN, VM_MESSAGE_SHUTTING_DOWN);
        if (s->state != VM_STATE_CREATING || s->sub != VM_SUB_NONE)
                return refuse(t, -EBUSY, VM_MESSAGE_HAS_PROCESS);
        t.phase = VM_PHASE_INSTALL;
        if (e == VM_EVENT_CREATE_HOST) {
                /* the disk first, off the loop; the first boot's chain once it is written */
                t.sub = VM_SUB_HOST_INSTALL;
                t.actions = VM_ACTION_HOST_INSTALL | VM_ACTION_SAVE;
                return t;
        }
        t.sub = VM_SUB_START_HELPERS;
        t.actions = VM_ACTION_SPAWN_HELPERS | VM_ACTION_SAVE;
        return t;
}

static VmTransition on_host_installed(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->sub != VM_SUB_HOST_INSTALL)
                return ignore(t);
        t.actions = VM_ACTION_INSTALLED | VM_ACTION_SAVE;
        if (s->shutting_down) {
                /* the disk is ready; its first boot waits for start_vm (what started beside the
                 * install goes) */
                t.state = VM_STATE_STOPPED;
                t.sub = VM_SUB_NONE;
                t.phase = VM_PHASE_BOOT;
                t.message = VM_MESSAGE_SHUTDOWN_BEFORE_BOOT;
                t.actions |= VM_ACTION_KILL | VM_ACTION_FINISH_START;
                return t;
        }
        /* the first boot follows at once, still "creating" until its QEMU answers */
        t.sub = VM_SUB_START_HELPERS;
        t.phase = VM_PHASE_BOOT;
        t.actions |= VM_ACTION_BEGIN_BOOT | VM_ACTION_SPAWN_HELPERS;
        return t;
}

static VmTransition on_host_install_failed(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->sub != VM_SUB_HOST_INSTALL)
                return ignore(t);
        t.state = VM_STATE_FAILED;
        t.sub = VM_SUB_NONE;
        t.message = VM_MESSAGE_DETAIL;
        t.actions = VM_ACTION_KILL | VM_ACTION_DROP_DISK | VM_ACTION_SAVE | VM_ACTION_FINISH_START;
        return t;
}

static VmTransition on_start(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->shutting_down)
                return refuse(t, -ESHUTDOWN, VM_MESSAGE_SHUTTING_DOWN);
        if (s->state == VM_STATE_DELETING)
                return refuse(t, -EBUSY, VM_MESSAGE_BEING_DELETED);
        if (vm_status_has_process(s))
                return refuse(t, -EBUSY, VM_MESSAGE_HAS_PROCESS);
        if (!s->installed)
                return refuse(t, -EBUSY, VM_MESSAGE_NOT_INSTALLED);
        t.sub = VM_SUB_START_HELPERS;
        t.phase = VM_PHASE_BOOT;
        t.failing = false;
        t.actions = VM_ACTION_BEGIN_BOOT | VM_ACTION_SPAWN_HELPERS | VM_ACTION_SAVE;
        return t;
}

/* stop_vm, and reboot_vm's stop, refused as start_vm would be refused afterwards */
static VmTransition on_stop(VmTransition t, const VmStatus *s, VmEvent e) {
        if (e == VM_EVENT_REBOOT && s->shutting_down)
                return refuse(t, -ESHUTDOWN, VM_MESSAGE_SHUTTING_DOWN);
        if (e == VM_EVENT_REBOOT && !s->installed)
                return refuse(t, -EBUSY, VM_MESSAGE_NOT_INSTALLED);
        if (s->state == VM_STATE_DELETING)
                return refuse(t, -EBUSY, VM_MESSAGE_BEING_DELETED);
        /* a start chain (swtpm, vsock, QEMU, QMP) takes a moment: stop once it stands */
        if (sub_is_starting(s->sub))
                return refuse(t, -EBUSY, VM_MESSAGE_STILL_STARTING);
        if (!vm_status_has_process(s))
                return refuse(t, -EBUSY, VM_MESSAGE_NOT_RUNNING);
        t.state = VM_STATE_STOPPING;
        t.actions = VM_ACTION_SAVE;
        return begin_stop(t, s);
}

static VmTransition on_delete(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->state == VM_STATE_DELETING)
                return refuse(t, -EBUSY, VM_MESSAGE_ALREADY_DELETING);
        t.state = VM_STATE_DELETING;
        t.actions = VM_ACTION_SAVE;
        if (sub_is_starting(s->sub)) {
                /* nothing to power down yet: the chain ends here */
                t.sub = VM_SUB_NONE;
                t.message = VM_MESSAGE_DELETED_STARTING;
                t.actions |= VM_ACTION_KILL | VM_ACTION_FINISH_START;
                return t;
        }
        return begin_stop(t, s);
}

static VmTransition on_helpers_up(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->sub != VM_SUB_START_HELPERS)
                return ignore(t);
        t.sub = VM_SUB_START_QMP;
        t.actions = VM_ACTION_SPAWN_QEMU;
        return t;
}

static VmTransition on_qmp_up(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->sub == VM_SUB_HOST_INSTALL) {
                /* the first boot's QEMU, started paused beside the install, answers: create_vm does */
                t.actions = VM_ACTION_FINISH_START | VM_ACTION_SAVE;
                return t;
        }
        if (s->sub != VM_SUB_START_QMP)
                return ignore(t);
        t.state = s->phase == VM_PHASE_INSTALL ? VM_STATE_INSTALLING : VM_STATE_BOOTING;
        t.sub = VM_SUB_NONE;
        t.actions = VM_ACTION_LINK | VM_ACTION_PHASE_TIMER | VM_ACTION_SAVE | VM_ACTION_FINISH_START;
        return t;
}

static VmTransition on_start_failed(VmTransition t, const VmStatus *s, VmEvent e) {
        if (!sub_is_starting(s->sub))
                return ignore(t);
        if (s->sub == VM_SUB_HOST_INSTALL)
                return on_host_install_failed(t, s, e);
        t.state = VM_STATE_FAILED;
        t.sub = VM_SUB_NONE;
        t.message = VM_MESSAGE_DETAIL;
        t.actions = VM_ACTION_KILL | VM_ACTION_SAVE | VM_ACTION_FINISH_START;
        return t;
}

static VmTransition on_phase_timeout(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->phase == VM_PHASE_INSTALL) {
                if (!has_qemu(s))
                        return ignore(t);
                /* the installer overran: killed, and failed once it is gone */
                t.sub = VM_SUB_STOP_SIGKILL;
                t.actions = VM_ACTION_SIGKILL;
                return t;
        }
        if (s->sub == VM_SUB_READY_QUOTE && awaits_ready(s))
                return fail_boot(t, s, VM_MESSAGE_NO_READY_QUOTE, /* graceful= */ true);
        if (!IN_SET(s->state, VM_STATE_BOOTING, VM_STATE_ATTESTING))
                return ignore(t);
        t.state = VM_STATE_RUNNING;
        t.message = VM_MESSAGE_NO_READY;
        t.actions = VM_ACTION_SAVE;
        return t;
}

/* A guest whose kernel panicked before it was ready (the installer's, or an installed boot's) will not
 * get there: killed at once and failed with the panic line, instead of waiting out the install or
 * boot timeout. The daemon watches the console only until readiness. */
static VmTransition on_guest_panic(VmTransition t, const VmStatus *s, VmEvent e) {
        if (!has_qemu(s) || s->sub != VM_SUB_NONE ||
            !IN_SET(s->state, VM_STATE_INSTALLING, VM_STATE_BOOTING, VM_STATE_ATTESTING))
                return ignore(t);
        return fail_boot(t, s, VM_MESSAGE_GUEST_PANIC, /* graceful= */ false);
}

/* A unit of the user-data's bootstrap (Cluster API's kubeadm.service) failed: READY=1 would follow
 * (the boot transaction completes either way), but the node will not be one. The guest said so
 * through its metadata service, with the unit's last lines: the boot fails with them, powered off. */
static VmTransition on_bootstrap_failed(VmTransition t, const VmStatus *s, VmEvent e) {
        if (!has_qemu(s) || !IN_SET(s->sub, VM_SUB_NONE, VM_SUB_READY_QUOTE) ||
            !IN_SET(s->state, VM_STATE_BOOTING, VM_STATE_ATTESTING))
                return ignore(t);
        return fail_boot(t, s, VM_MESSAGE_BOOTSTRAP_FAILED, /* graceful= */ true);
}

/* the power button unanswered (stop timeout) or refused: SIGTERM; SIGTERM unanswered: SIGKILL. A
 * delete escalates as a stop does: under deleting, the stop sub-state says QEMU still runs. */
static VmTransition on_stop_timeout(VmTransition t, const VmStatus *s, VmEvent e) {
        if (!has_qemu(s) && !(s->state == VM_STATE_DELETING && sub_is_stopping(s->sub)))
                return ignore(t);
        if (s->sub == VM_SUB_STOP_SIGTERM && e == VM_EVENT_STOP_TIMEOUT) {
                t.sub = VM_SUB_STOP_SIGKILL;
                t.actions = VM_ACTION_SIGKILL;
                return t;
        }
        if (s->sub != VM_SUB_STOP_POWERDOWN)
                return ignore(t);
        t.sub = VM_SUB_STOP_SIGTERM;
        t.actions = VM_ACTION_SIGTERM;
        return t;
}

static VmTransition on_nonce(VmTransition t, const VmStatus *s, VmEvent e) {
        /* the guest asks for its first nonce of the boot: it is attesting */
        if (s->gate != VM_GATE_NONE && s->state == VM_STATE_BOOTING)
                t.state = VM_STATE_ATTESTING;
        t.actions = VM_ACTION_SAVE;
        return t;
}

static VmTransition on_quote_verified(VmTransition t, const VmStatus *s, VmEvent e) {
        t.actions = VM_ACTION_CLEAR_REJECTION;
        /* READY=1 came first and waited for this quote */
        if (e == VM_EVENT_QUOTE_VERIFIED_READY && s->sub == VM_SUB_READY_QUOTE && is_booting(s) &&
            s->state != VM_STATE_READY)
                return become_ready(t);
        t.actions |= VM_ACTION_SAVE;
        return t;
}

static VmTransition on_quote_rejected(VmTransition t, const VmStatus *s, VmEvent e) {
        /* A VM that must attest and whose quote was rejected for good will not get further: it is
         * failed now, not minutes later when the guest gives up. In the initrd the guest waits for
         * its user-data and can go at once; at the ready stage it is powered off. */
        if (e != VM_EVENT_QUOTE_RETRYABLE && s->gate != VM_GATE_NONE && is_booting(s))
                return fail_boot(
                        t, s, VM_MESSAGE_QUOTE_REJECTED, /* graceful= */ e == VM_EVENT_QUOTE_REJECTED_READY);
        t.message = VM_MESSAGE_QUOTE_REJECTED;
        t.actions = VM_ACTION_SAVE;
        return t;
}

static VmTransition on_restarted(VmTransition t, const VmStatus *s, VmEvent e) {
        if (s->state != VM_STATE_CREATING || sub_is_starting(s->sub))
                return ignore(t);
        /* a create that did not finish: its disk is blank, or half written by a host install */
        t.state = VM_STATE_FAILED;
        t.sub = VM_SUB_NONE;
        t.message = VM_MESSAGE_RESTARTED;
        t.actions = VM_ACTION_DROP_DISK;
        return t;
}

static VmTransition on_reattached(VmTransition t, const VmStatus *s, VmEvent e) {
        if (!has_qemu(s))
                return ignore(t);
        t.actions = VM_ACTION_LINK | VM_ACTION_SAVE;
        /* the phase's clock starts again from the reattach */
        if (IN_SET(s->state, VM_STATE_INSTALLING, VM_STATE_BOOTING, VM_STATE_ATTESTING))
                t.actions |= VM_ACTION_PHASE_TIMER;
        /* an interrupted stop goes on */
        if (s->state == VM_STATE_STOPPING)
                t = begin_stop(t, s);
        return t;
}

static VmTransition on_reattach_failed(VmTransition t, const VmStatus *s, VmEvent e) {
        /* only a record left live is attached to */
        if (!has_qemu(s))
                return ignore(t);
        t.state = VM_STATE_STOPPED;
        t.sub = VM_SUB_NONE;
        t.failing = false;
        t.message = VM_MESSAGE_NOT_REATTACHED;
        t.actions = VM_ACTION_KILL | VM_ACTION_SAVE;
        return t;
}

typedef VmTransition (*VmEventHandler)(VmTransition t, const VmStatus *s, VmEvent e);

static const VmEventHandler handlers[_VM_EVENT_MAX] = {
        [VM_EVENT_CREATE] = on_create,
        [VM_EVENT_START] = on_start,
        [VM_EVENT_STOP] = on_stop,
        [VM_EVENT_REBOOT] = on_stop,
        [VM_EVENT_DELETE] = on_delete,
        [VM_EVENT_HELPERS_UP] = on_helpers_up,
        [VM_EVENT_QMP_UP] = on_qmp_up,
        [VM_EVENT_START_FAILED] = on_start_failed,
        [VM_EVENT_EXIT] = qemu_exited,
        [VM_EVENT_EXIT_GUEST_FAILED] = qemu_exited,
        [VM_EVENT_EXIT_FAILED] = qemu_exited,
        [VM_EVENT_PHASE_TIMEOUT] = on_phase_timeout,
        [VM_EVENT_STOP_TIMEOUT] = on_stop_timeout,
        [VM_EVENT_POWERDOWN_FAILED] = on_stop_timeout,
        [VM_EVENT_NONCE] = on_nonce,
        [VM_EVENT_READY] = on_ready,
        [VM_EVENT_QUOTE_VERIFIED_INITRD] = on_quote_verified,
        [VM_EVENT_QUOTE_VERIFIED_READY] = on_quote_verified,
        [VM_EVENT_QUOTE_REJECTED_INITRD] = on_quote_rejected,
        [VM_EVENT_QUOTE_REJECTED_READY] = on_quote_rejected,
        [VM_EVENT_QUOTE_RETRYABLE] = on_quote_rejected,
        [VM_EVENT_GUEST_PANIC] = on_guest_panic,
        [VM_EVENT_BOOTSTRAP_FAILED] = on_bootstrap_failed,
        [VM_EVENT_RESTARTED] = on_restarted,
        [VM_EVENT_REATTACHED] = on_reattached,
        [VM_EVENT_REATTACH_FAILED] = on_reattach_failed,
        [VM_EVENT_CREATE_HOST] = on_create,
        [VM_EVENT_HOST_INSTALLED] = on_host_installed,
        [VM_EVENT_HOST_INSTALL_FAILED] = on_host_install_failed,
};

VmTransition vm_state_next(const VmStatus *s, VmEvent e) {
        VmTransition t = {
                .state = s->state,
                .sub = s->sub,
                .phase = s->phase,
                .failing = s->failing,
                .message = VM_MESSAGE_NONE,
        };

        if (e < 0 || e >= _VM_EVENT_MAX)
                return refuse(t, -EINVAL, VM_MESSAGE_NONE);
        return handlers[e](t, s, e);
}

VmWaitVerdict vm_state_wait(const VmStatus *s, const VmMilestones *m, VmWaitFor w) {
        bool reached = w == VM_WAIT_NONE || (w == VM_WAIT_INSTALLED && m->installed) ||
                (w == VM_WAIT_ATTESTED && m->attested) || (w == VM_WAIT_READY && m->ready);

        /* a failed VM never meets a milestone */
        if (s->state != VM_STATE_FAILED && reached)
                return VM_WAIT_REACHED;
        if (IN_SET(s->state, VM_STATE_FAILED, VM_STATE_STOPPING, VM_STATE_STOPPED, VM_STATE_DELETING))
                return s->state == VM_STATE_FAILED || s->failing ? VM_WAIT_FAILED : VM_WAIT_ABANDONED;
        return VM_WAIT_PENDING;
}
