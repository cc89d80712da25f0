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
 * the status could not be learned). */
typedef void (*VmLaunchedExitFunc)(VmLaunched *l, int code, int status, void *userdata);

/* units NULL: a plain child. Otherwise the transient unit unit_name under that manager, which runs a
 * path on its own stdio: -EOPNOTSUPP for options with exec_fd, stdin_fd or stdout_fd. */
int vm_launched_spawn(
        VmLaunched **ret,
        sd_event *e,
        VmUnitManager *units,
        const char *unit_name,
        const VmProcessOptions *o,
        VmLaunchedExitFunc on_exit,
        void *userdata);
/* Attaches to a unit started by an earlier daemon. */
int vm_launched_attach(
        VmLaunched **ret,
        VmUnitManager *units,
        const char *unit_name,
        pid_t expected_pid,
        VmLaunchedExitFunc on_exit,
        void *userdata);

/* Ends the process (SIGKILL; a unit is stopped) and frees. */
VmLaunched *vm_launched_free(VmLaunched *l);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmLaunched *, vm_launched_free);
/* Frees, leaving a unit running for the next daemon; a plain child cannot stay and is ended. */
VmLaunched *vm_launched_detach(VmLaunched *l);

/* sig to the main process; whole_unit: to every process of a unit. -ESRCH once ended. */
int vm_launched_kill(VmLaunched *l, int sig, bool whole_unit);
pid_t vm_launched_pid(VmLaunched *l);
/* The unit's name, or NULL for a plain child. Borrowed. */
const char *vm_launched_unit(VmLaunched *l);
