/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A run's end: the stop escalation (the ACPI power button, SIGTERM at the stop timeout, SIGKILL after
 * the grace; VM_SUB_STOP_POWERDOWN, _SIGTERM, _SIGKILL), QEMU's exit as an event, the processes
 * killed at once or left running for the next daemon, and the daemon's shutdown. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "log.h"
#include "vm-internal.h"

#define VM_STOP_GRACE (5 * USEC_PER_SEC)

void vm_qmp_drop(Vm *v) {
        QmpClient *q = TAKE_PTR(v->qmp);

        v->qmp_grace = sd_event_source_disable_unref(v->qmp_grace);
        vm_balloon_forget(v);

        if (!q)
                return;
        qmp_client_close(q);
        qmp_client_unref(q);
}

void vm_kill(Vm *v) {
        vm_qmp_drop(v);
        if (v->qemu)
                (void) vm_launched_kill(v->qemu, SIGKILL, true);
        if (v->swtpm)
                (void) vm_launched_kill(v->swtpm, SIGKILL, true);
        if (v->vsockd)
                (void) vm_launched_kill(v->vsockd, SIGKILL, true);
        v->qemu = vm_launched_free(v->qemu);
        v->swtpm = vm_launched_free(v->swtpm);
        v->vsockd = vm_launched_free(v->vsockd);
        v->installer = vm_launched_free(v->installer); /* SIGKILL: a host install ends at once */
        v->tpm_setup = vm_launched_free(v->tpm_setup); /* SIGKILL as well: the next start runs it again */
        v->install_timer = sd_event_source_disable_unref(v->install_timer);
        v->qemu_prestarted = v->qemu_paused = false;
        v->qemu_pid = v->swtpm_pid = 0;
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        vm_probe_stop(v);
        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        vm_console_watch_stop(v);
        vm_notify_close(v);
}

void vm_detach_processes(Vm *v) {
        vm_qmp_drop(v);
        v->qemu = vm_launched_detach(v->qemu);
        v->swtpm = vm_launched_detach(v->swtpm);
        v->vsockd = vm_launched_detach(v->vsockd);
        v->installer = vm_launched_detach(v->installer); /* a plain child: it ends */
        v->tpm_setup = vm_launched_detach(v->tpm_setup); /* the same; the record still says pending */
        v->install_timer = sd_event_source_disable_unref(v->install_timer);
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        vm_probe_stop(v);
        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        vm_console_watch_stop(v);
        /* the READY=1 socket goes with us; the next daemon listens again */
        v->notify_source = sd_event_source_disable_unref(v->notify_source);
        v->notify_fd = safe_close(v->notify_fd);
        v->notify_path = mfree(v->notify_path);
}

void vm_teardown(Vm *v) {
        vm_qmp_drop(v);
        vm_net_detach(v, /* remove= */ false);
        v->qemu = vm_launched_free(v->qemu);
        v->qemu_pid = 0;
        v->qemu_prestarted = v->qemu_paused = false;
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        vm_console_watch_stop(v);
        vm_notify_close(v);
        /* The helpers end with QEMU: swtpm by itself (--terminate), asked again here; vhost-device-vsock
         * would wait for the next frontend forever, and holds no state, so it is killed. */
        if (v->swtpm)
                (void) vm_launched_kill(v->swtpm, SIGTERM, false);
        v->vsockd = vm_launched_free(v->vsockd);
}

void vm_on_qemu_exit(VmLaunched *p, int code, int status, void *userdata) {
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        _cleanup_free_ char *st = NULL, *tail = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        bool ok = code == CLD_EXITED && status == 0;
        /* a guest whose PID 1 exited with a failure (the image does so instead of sitting in emergency
         * mode) is a failed boot, however cleanly QEMU went */
        VmEvent event = !ok                                               ? VM_EVENT_EXIT_FAILED :
                v->guest_exit_status && !streq(v->guest_exit_status, "0") ? VM_EVENT_EXIT_GUEST_FAILED :
                                                                            VM_EVENT_EXIT;
        int r;

        if (vm_launched_error(p) < 0) {
                /* its unit never ran (or could not be attached to): not an exit */
                vm_qemu_launch_failed(v, p, vm_launched_error(p));
                return;
        }
        st = vm_exit_status_to_string(code, status);
        log_struct(
                LOG_INFO, LOG_FIELDS({ "VM_ID", v->rec.id }), "QEMU of VM %s exited: %s", v->rec.id, st ?: "?");
        if (p == v->qemu && v->qemu_prestarted && v->sub != VM_SUB_START_QMP) {
                /* the paused QEMU beside the host install (or after it, before the chain reached
                 * QEMU): the VM is not running yet, and the chain starts another */
                vm_prestart_drop_qemu(v, st);
                return;
        }
        if (v->sub == VM_SUB_START_QMP)
                tail = vm_file_tail(v, "qemu.log", 8192);
        r = vm_set_state(v, event, &(VmEventArgs){ .exit_status = st ?: "?", .detail = tail }, &e);
        if (r < 0) {
                /* the installed boot after the installer did not start */
                _cleanup_free_ char *text = vm_message(
                        v, VM_MESSAGE_START_BOOT, &(VmMessageArgs){ .detail = e.message });
                (void) vm_set_state(
                        v,
                        VM_EVENT_START_FAILED,
                        &(VmEventArgs){ .error = r, .detail = text ?: "start installed boot failed" },
                        NULL);
        }
}

/* ---- the escalation ---- */

static int on_stop_timer(sd_event_source *s, usec_t usec, void *userdata) {
        Vm *v = userdata;

        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        (void) vm_set_state(v, VM_EVENT_STOP_TIMEOUT, NULL, NULL);
        return 0;
}

static void arm_stop_timer(Vm *v, usec_t timeout) {
        int r;

        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        r = sd_event_add_time_relative(
                manager_event(v->manager),
                &v->stop_timer,
                CLOCK_MONOTONIC,
                timeout,
                USEC_PER_MSEC,
                on_stop_timer,
                v);
        if (r < 0)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "No stop timer for %s: %s",
                        v->rec.id,
                        strerror(-r));
}

static void on_powerdown_reply(QmpClient *c, int error, json_t *result, const char *desc, void *userdata) {
        /* no ACPI path: SIGTERM at once; a connection we dropped (the VM may be going away with it)
         * settles nothing */
        if (error < 0 && c == ((Vm *) userdata)->qmp)
                (void) vm_set_state(userdata, VM_EVENT_POWERDOWN_FAILED, NULL, NULL);
}

void vm_powerdown(Vm *v) {
        arm_stop_timer(v, manager_settings(v->manager)->stop_timeout);
        if (!v->qmp || qmp_client_execute(v->qmp, "system_powerdown", NULL, 0, on_powerdown_reply, v) < 0) {
                v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
                (void) vm_set_state(v, VM_EVENT_POWERDOWN_FAILED, NULL, NULL);
        }
}

void vm_signal(Vm *v, int sig) {
        if (!v->qemu)
                return;
        if (sig == SIGKILL) {
                v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
                (void) vm_launched_kill(v->qemu, SIGKILL, /* whole_unit= */ true);
                return;
        }
        (void) vm_launched_kill(v->qemu, sig, /* whole_unit= */ false);
        arm_stop_timer(v, VM_STOP_GRACE); /* SIGKILL after the grace */
}

/* ---- the daemon's shutdown ---- */

void vm_detach_all(Manager *m) {
        Vm *v;

        MANAGER_FOREACH_VM(v, m, i) {
                if (v->qemu)
                        log_struct(
                                LOG_INFO,
                                LOG_FIELDS({ "VM_ID", v->rec.id }),
                                "VM %s (%s) left running in %s.",
                                v->rec.id,
                                v->rec.spec.name,
                                vm_launched_unit(v->qemu) ?: "?");
                (void) vm_save(v); /* its units and pids, for the next daemon */
        }
}

typedef struct StopAll {
        unsigned left;
        void (*done)(void *userdata);
        void *userdata;
} StopAll;

static void stop_all_one(int r, json_t *record, const ApiError *e, void *userdata) {
        StopAll *s = userdata;

        if (--s->left == 0) {
                if (s->done)
                        s->done(s->userdata);
                free(s);
        }
}

void vm_abandon_all(Manager *m) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        size_t n = manager_n_vms(m);
        _cleanup_free_ Vm **snapshot = calloc(n + 1, sizeof(Vm *));

        (void) api_error_set(&e, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
        if (!snapshot)
                return; /* the waiters are freed unanswered with their VMs */
        for (size_t i = 0; i < n; i++)
                snapshot[i] = vm_ref(manager_vm_at(m, i));
        for (size_t i = 0; i < n; i++) {
                _cleanup_(vm_unrefp) Vm *v = snapshot[i];

                vm_waiters_abandon(v, &e);
        }
}

void vm_stop_all(Manager *m, void (*done)(void *userdata), void *userdata) {
        StopAll *s = calloc(1, sizeof(StopAll));

        if (!s) {
                for (size_t i = 0; i < manager_n_vms(m); i++)
                        vm_kill(manager_vm_at(m, i));
                if (done)
                        done(userdata);
                return;
        }
        s->done = done;
        s->userdata = userdata;
        s->left = 1; /* held until every stop was issued */
        /* a snapshot: stopping may remove records (a create in flight is discarded) */
        _cleanup_free_ Vm **snapshot = calloc(manager_n_vms(m) + 1, sizeof(Vm *));
        size_t n = manager_n_vms(m);
        if (snapshot)
                for (size_t i = 0; i < n; i++)
                        snapshot[i] = vm_ref(manager_vm_at(m, i));
        for (size_t i = 0; snapshot && i < n; i++) {
                _cleanup_(vm_unrefp) Vm *v = snapshot[i];
                _cleanup_free_ char *text = NULL;

                if (!vm_has_process(v) || v->rec.state == VM_STATE_DELETING)
                        continue;
                if (IN_SET(v->sub, VM_SUB_START_HELPERS, VM_SUB_START_QMP)) {
                        /* nothing to power down yet: end the chain (a create is discarded) */
                        text = vm_message(v, VM_MESSAGE_SHUTTING_DOWN, NULL);
                        (void) vm_set_state(
                                v,
                                VM_EVENT_START_FAILED,
                                &(VmEventArgs){ .error = -ESHUTDOWN,
                                                .detail = text ?: "vm-manager is shutting down" },
                                NULL);
                        continue;
                }
                s->left++;
                if (v->rec.state == VM_STATE_STOPPING) {
                        if (!vm_waiter_add(v, VM_WAITER_STOPPED, stop_all_one, s))
                                s->left--;
                } else if (vm_stop(v, stop_all_one, s, NULL) < 0)
                        s->left--;
        }
        stop_all_one(0, NULL, NULL, s);
}
