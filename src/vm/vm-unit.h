/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* The systemd launcher: processes as transient service units of a service manager, driven over its
 * private D-Bus socket (runtime.md §4), or over the system bus when the daemon is not root. Units
 * outlive the daemon and are reattached by name. */

typedef enum VmUnitScope {
        /* as root: SYSTEM when /run/systemd/system exists, else USER; otherwise USER when the user's
         * manager runs, else SYSTEM when /run/systemd/system exists */
        VM_UNIT_SCOPE_AUTO,
        /* as root /run/systemd/private; otherwise the system bus, with polkit's consent for
         * org.freedesktop.systemd1.manage-units (checked at connection time), and the units run with
         * the daemon's uid, gid and supplementary groups */
        VM_UNIT_SCOPE_SYSTEM,
        VM_UNIT_SCOPE_USER, /* $XDG_RUNTIME_DIR/systemd/private (default /run/user/<uid>) */
} VmUnitScope;

/* One bus connection to a service manager, attached to an event loop. */
typedef struct VmUnitManager VmUnitManager;

/* Connects to the manager VMs should run under. When none is reachable: -EHOSTDOWN, and *ret_reason
 * (when not NULL) is a static sentence saying why. Synchronous (connection, authentication, one
 * property read, on the system bus polkit's answer and Subscribe): meant for start-up, before the
 * event loop runs, since the launcher must be known before any record is loaded. */
int vm_unit_manager_new(VmUnitManager **ret, sd_event *e, VmUnitScope scope, const char **ret_reason);
/* Every VmUnit of the manager must be freed or released first. Releases still under way then get
 * their ResetFailedUnit sent without waiting for the stop job; what is queued is flushed. Meant for
 * after the event loop has ended. */
VmUnitManager *vm_unit_manager_free(VmUnitManager *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmUnitManager *, vm_unit_manager_free);

typedef struct VmUnit VmUnit;

/* Nothing here waits for the manager: every call is asynchronous on the event loop, a job (a start,
 * a stop) is followed through the manager's JobRemoved signal, and each step has a timer. The
 * callbacks below run from the event loop only, never from within the call that set them up. */

/* Called once the unit's main process runs and is watched: vm_unit_pid() is its pid. Not called when
 * the process ended before it could be watched (on_exit then reports its status). Must not free u. */
typedef void (*VmUnitStartedFunc)(VmUnit *u, void *userdata);

/* Called once when the unit's main process has ended: code/status are a waitid() si_code/si_status
 * pair (CLD_EXITED + exit code, CLD_KILLED/CLD_DUMPED + signal) from ExecMainCode/ExecMainStatus,
 * code 0 when unknown (the unit is gone). Also called, with code 0, when the start or the attach
 * failed: vm_unit_error() says why. The unit stays loaded (RemainAfterExit) until vm_unit_release().
 * The callback may free or release u. */
typedef void (*VmUnitExitFunc)(VmUnit *u, int code, int status, void *userdata);

/* Starts argv as the transient service "<name>" (".service" appended when missing) in
 * vm-manager.slice: Type=exec, RemainAfterExit=yes, argv[0] resolved on PATH, stdout and stderr
 * appended to log_file (created 0600 here; NULL: the manager's default), working_dir (NULL: the
 * manager's default), and with block_io_uring io_uring_setup() fails with EPERM. Returns at once,
 * with what can be checked here (-ENOENT: argv[0] not on PATH); the rest follows on the loop: a
 * release of that name still under way is waited for, a unit of that name without a process is
 * stopped and reset, StartTransientUnit is sent and its job followed, then the main process is
 * watched (on_started). A failure is reported through on_exit: -EBUSY when a unit of that name has a
 * live process, -EIO when the start job failed (the program could not be executed), -ETIMEDOUT when
 * the whole start took more than 15 s. vm_unit_pid() is 0 until on_started. */
int vm_unit_start(
        VmUnit **ret,
        VmUnitManager *m,
        const char *name,
        char **argv,
        const char *log_file,
        const char *working_dir,
        bool block_io_uring,
        VmUnitStartedFunc on_started,
        VmUnitExitFunc on_exit,
        void *userdata);

/* Reattaches to the unit "<name>" after a daemon restart. Returns at once; vm_unit_pid() is
 * expected_pid until the unit's state is read. A live main process is then watched like a started
 * one (on_started; a pid other than expected_pid is logged at debug only); when the process already
 * ended, on_exit reports the recorded status; when the unit is not loaded, on_exit reports -ESRCH
 * (vm_unit_error()). */
int vm_unit_attach(
        VmUnit **ret,
        VmUnitManager *m,
        const char *name,
        pid_t expected_pid,
        VmUnitStartedFunc on_started,
        VmUnitExitFunc on_exit,
        void *userdata);

/* Sends sig to the main process (through its pidfd once watched, otherwise KillUnit), or with
 * whole_unit to every process of the unit (KillUnit, sent asynchronously; for SIGKILL: cannot hit a
 * recycled pid). 0 when sent, -ESRCH once the process ended or while nothing of ours runs yet (a
 * start still waiting for its name to be free). */
int vm_unit_kill(VmUnit *u, int sig, bool whole_unit);

/* The main process (or the last one, once it ended; 0 while a start is under way); borrowed name
 * with ".service". */
pid_t vm_unit_pid(VmUnit *u);
const char *vm_unit_name(VmUnit *u);
/* Why the start or the attach failed (a negative errno), 0 otherwise. */
int vm_unit_error(VmUnit *u);

/* Forgets the unit WITHOUT stopping it: the process keeps running for the next daemon to attach.
 * Neither callback is called. */
VmUnit *vm_unit_free(VmUnit *u);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmUnit *, vm_unit_free);

/* Stops the unit and forgets it, for a process that must end with us: StopUnit, its job followed
 * (at most 15 s), then ResetFailedUnit, all on the loop after this returns; meanwhile a start of
 * the same name waits. A start that had not sent StartTransientUnit yet is only abandoned. Neither
 * callback is called. Always returns NULL. */
VmUnit *vm_unit_release(VmUnit *u);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmUnit *, vm_unit_release);

/* Stops and resets the unit "<name>" if it is loaded, as vm_unit_release() does, for units known
 * only by name (left by an earlier daemon). */
int vm_unit_stop(VmUnitManager *m, const char *name);
