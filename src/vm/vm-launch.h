/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "cleanup.h"
#include "vm-process.h"
#include "vm-unit.h"

/* A process of a VM, whichever launcher runs it: a plain child (vm-process) or a transient systemd
 * unit (vm-unit), which survives the daemon and can be attached to again. */

typedef struct VmLaunched VmLaunched;

/* Called once when the process has ended: code/status as waitid's si_code/si_status (code 0 when
 * the status could not be learned). Also called, with code 0, when a unit could not be started or
 * attached to, or a plain child could not execute its program: vm_launched_error() says why. */
typedef void (*VmLaunchedExitFunc)(VmLaunched *l, int code, int status, void *userdata);
/* Called once the main process runs and is watched (vm_launched_pid() is known from then on): a unit's
 * main process, or a plain child once the spawner has cloned it. */
typedef void (*VmLaunchedStartedFunc)(VmLaunched *l, void *userdata);

/* units NULL: a plain child, cloned by spawner after this returns (vm_process_spawn(): its pid is 0
 * until on_started), whose clone or exec() failing is reported through on_exit; the loop never waits
 * for it. Otherwise the transient
 * unit unit_name under that manager, started asynchronously (vm_unit_start()), which runs a path on
 * its own stdio (-EOPNOTSUPP for options with exec_fd, stdin_fd or stdout_fd): its pid is 0 until
 * on_started, and a start that fails is reported through on_exit. The callbacks run from the event
 * loop only. */
int vm_launched_spawn(
        VmLaunched **ret,
        VmSpawner *spawner,
        VmUnitManager *units,
        const char *unit_name,
        const VmProcessOptions *o,
        VmLaunchedExitFunc on_exit,
        void *userdata);
/* Attaches to a unit started by an earlier daemon, asynchronously (vm_unit_attach()): its pid is
 * expected_pid until the unit was read; a unit that is gone is reported through on_exit. */
int vm_launched_attach(
        VmLaunched **ret,
        VmUnitManager *units,
        const char *unit_name,
        pid_t expected_pid,
        VmLaunchedExitFunc on_exit,
        void *userdata);

/* on_started, for a unit (see VmLaunchedStartedFunc); set after spawn or attach, before the loop runs
 * again. */
void vm_launched_set_started(VmLaunched *l, VmLaunchedStartedFunc on_started);
/* < 0 when the process never ran: its unit could not be started or attached to, or the plain child
 * could not execute its program; 0 otherwise. */
int vm_launched_error(VmLaunched *l);
/* Stops and resets the unit unit_name if it is loaded (vm_unit_stop()), on the loop. */
int vm_launched_stop_unit(VmUnitManager *units, const char *unit_name);

/* Ends the process (SIGKILL; a unit is stopped, on the loop after this returns) and frees. */
VmLaunched *vm_launched_free(VmLaunched *l);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmLaunched *, vm_launched_free);
/* Frees, leaving a unit running for the next daemon; a plain child cannot stay and is ended. */
VmLaunched *vm_launched_detach(VmLaunched *l);

/* sig to the main process; whole_unit: to every process of a unit. -ESRCH once ended. */
int vm_launched_kill(VmLaunched *l, int sig, bool whole_unit);
pid_t vm_launched_pid(VmLaunched *l);
/* The unit's name, or NULL for a plain child. Borrowed. */
const char *vm_launched_unit(VmLaunched *l);
