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
 * (when not NULL) is a static sentence saying why. */
int vm_unit_manager_new(VmUnitManager **ret, sd_event *e, VmUnitScope scope, const char **ret_reason);
/* Every VmUnit of the manager must be freed first. */
VmUnitManager *vm_unit_manager_free(VmUnitManager *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmUnitManager *, vm_unit_manager_free);

typedef struct VmUnit VmUnit;

/* Called once when the unit's main process has ended; code/status are a waitid() si_code/si_status
 * pair (CLD_EXITED + exit code, CLD_KILLED/CLD_DUMPED + signal) from ExecMainCode/ExecMainStatus,
 * code 0 when unknown (the unit is gone). The unit has been stopped and reset by then. The callback
 * may free u. */
typedef void (*VmUnitExitFunc)(VmUnit *u, int code, int status, void *userdata);

/* Starts argv as the transient service "<name>" (".service" appended when missing) in
 * vm-manager.slice: Type=exec, RemainAfterExit=yes, argv[0] resolved on PATH, stdout and stderr
 * appended to log_file (created 0600; NULL: the manager's default), working_dir (NULL: the manager's
 * default), and with block_io_uring io_uring_setup() fails with EPERM. -EBUSY when a unit of that
 * name has a live process; one without a process is stopped and reset first. Blocks until the start
 * job is done (at most 15 s). */
int vm_unit_start(
        VmUnit **ret,
        VmUnitManager *m,
        const char *name,
        char **argv,
        const char *log_file,
        const char *working_dir,
        bool block_io_uring,
        VmUnitExitFunc on_exit,
        void *userdata);

/* Reattaches to the unit "<name>" after a daemon restart: -ESRCH when it is not loaded. A live main
 * process is watched like a started one (a pid other than expected_pid is logged at debug only); when
 * the process already ended, on_exit reports the recorded status from the event loop, never from
 * within this call. */
int vm_unit_attach(
        VmUnit **ret,
        VmUnitManager *m,
        const char *name,
        pid_t expected_pid,
        VmUnitExitFunc on_exit,
        void *userdata);

/* Sends sig to the main process, or with whole_unit to every process of the unit (for SIGKILL: cannot
 * hit a recycled pid). 0 when sent, -ESRCH once the process ended. */
int vm_unit_kill(VmUnit *u, int sig, bool whole_unit);

/* The main process (or the last one, once it ended); borrowed name with ".service". */
pid_t vm_unit_pid(VmUnit *u);
const char *vm_unit_name(VmUnit *u);

/* Forgets the unit WITHOUT stopping it: the process keeps running for the next daemon to attach.
 * on_exit is not called. */
VmUnit *vm_unit_free(VmUnit *u);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmUnit *, vm_unit_free);

/* Stops the unit (StopUnit, waiting up to 15 s for the job, then ResetFailedUnit) and frees it, for a
 * process that must end with us. on_exit is not called. */
VmUnit *vm_unit_release(VmUnit *u);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmUnit *, vm_unit_release);
