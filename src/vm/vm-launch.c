/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "vm-launch.h"

struct VmLaunched {
        VmProcess *proc;
        VmUnit *unit;
        VmLaunchedExitFunc on_exit;
        VmLaunchedStartedFunc on_started;
        void *userdata;
};

static void on_proc_exit(VmProcess *p, int code, int status, void *userdata) {
        VmLaunched *l = userdata;

        if (l->on_exit)
                l->on_exit(l, code, status, l->userdata);
}

static void on_proc_started(VmProcess *p, void *userdata) {
        VmLaunched *l = userdata;

        if (l->on_started)
                l->on_started(l, l->userdata);
}

static void on_unit_started(VmUnit *u, void *userdata) {
        VmLaunched *l = userdata;

        if (l->on_started)
                l->on_started(l, l->userdata);
}

static void on_unit_exit(VmUnit *u, int code, int status, void *userdata) {
        VmLaunched *l = userdata;

        if (l->on_exit)
                l->on_exit(l, code, status, l->userdata);
}

int vm_launched_spawn(
        VmLaunched **ret,
        VmSpawner *spawner,
        VmUnitManager *units,
        const char *unit_name,
        const VmProcessOptions *o,
        VmLaunchedExitFunc on_exit,
        void *userdata) {
        _cleanup_free_ VmLaunched *l = NULL;
        int r;

        assert_return(ret && o && (units || spawner), -EINVAL);
        l = calloc(1, sizeof(VmLaunched));
        if (!l)
                return -ENOMEM;
        l->on_exit = on_exit;
        l->userdata = userdata;
        if (units) {
                /* a unit's ExecStart is a path, run by the service manager with its own stdio */
                if (o->exec_fd > 0 || o->stdin_fd > 0 || o->stdout_fd > 0)
                        return -EOPNOTSUPP;
                r = vm_unit_start(
                        &l->unit,
                        units,
                        unit_name,
                        o->argv,
                        o->log_file,
                        o->working_dir,
                        o->block_io_uring,
                        on_unit_started,
                        on_unit_exit,
                        l);
        } else {
                r = vm_process_spawn(&l->proc, spawner, o, on_proc_exit, l);
                if (r >= 0)
                        vm_process_set_started(l->proc, on_proc_started);
        }
        if (r < 0)
                return r;
        *ret = TAKE_PTR(l);
        return 0;
}

int vm_launched_attach(
        VmLaunched **ret,
        VmUnitManager *units,
        const char *unit_name,
        pid_t expected_pid,
        VmLaunchedExitFunc on_exit,
        void *userdata) {
        _cleanup_free_ VmLaunched *l = NULL;
        int r;

        assert_return(ret && units && unit_name, -EINVAL);
        l = calloc(1, sizeof(VmLaunched));
        if (!l)
                return -ENOMEM;
        l->on_exit = on_exit;
        l->userdata = userdata;
        r = vm_unit_attach(&l->unit, units, unit_name, expected_pid, on_unit_started, on_unit_exit, l);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(l);
        return 0;
}

void vm_launched_set_started(VmLaunched *l, VmLaunchedStartedFunc on_started) {
        if (l)
                l->on_started = on_started;
}

int vm_launched_error(VmLaunched *l) {
        if (!l)
                return 0;
        return l->unit ? vm_unit_error(l->unit) : vm_process_error(l->proc);
}

int vm_launched_stop_unit(VmUnitManager *units, const char *unit_name) {
        assert_return(units && unit_name, -EINVAL);
        return vm_unit_stop(units, unit_name);
}

VmLaunched *vm_launched_free(VmLaunched *l) {
        if (!l)
                return NULL;
        vm_process_free(l->proc); /* kills and reaps a child still running */
        vm_unit_release(l->unit); /* stops the unit, on the loop */
        free(l);
        return NULL;
}

VmLaunched *vm_launched_detach(VmLaunched *l) {
        if (!l)
                return NULL;
        vm_process_free(l->proc);
        vm_unit_free(l->unit); /* forgets it: it keeps running */
        free(l);
        return NULL;
}

int vm_launched_kill(VmLaunched *l, int sig, bool whole_unit) {
        assert_return(l, -EINVAL);
        if (l->unit)
                return vm_unit_kill(l->unit, sig, whole_unit);
        return vm_process_kill(l->proc, sig);
}

pid_t vm_launched_pid(VmLaunched *l) {
        if (!l)
                return 0;
        return l->unit ? vm_unit_pid(l->unit) : vm_process_pid(l->proc);
}

const char *vm_launched_unit(VmLaunched *l) {
        return l && l->unit ? vm_unit_name(l->unit) : NULL;
}
