/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The operations that wait for the lifecycle (a start chain, create_vm's milestone, a stop), their
 * deadlines, and the observers that hear each state change of an operation in flight. Waiters are
 * answered in the order the operations arrived. */
#include <stdlib.h>

#include "log.h"
#include "vm-internal.h"

struct VmWaiter {
        VmWaiterKind kind;
        VmWaitFor milestone;
        usec_t timeout; /* for the message */
        sd_event_source *deadline;
        VmDoneFunc done;
        void *userdata;
        Vm *vm;
        bool then_start; /* reboot: the stop is done, the start follows and answers */
        VmWaiter *next;
};

struct VmObserver {
        VmProgressFunc fn;
        void *userdata;
        VmObserver *next;
};

/* ---- observers ---- */

int vm_observe(Vm *v, VmProgressFunc progress, void *userdata) {
        VmObserver *o;

        if (!progress)
                return 0;
        o = calloc(1, sizeof(*o));
        if (!o)
                return -ENOMEM;
        o->fn = progress;
        o->userdata = userdata;
        o->next = v->observers;
        v->observers = o;
        return 0;
}

void vm_unobserve(Vm *v, void *userdata) {
        for (VmObserver **i = &v->observers; *i;)
                if ((*i)->userdata == userdata) {
                        VmObserver *o = *i;
                        *i = o->next;
                        free(o);
                } else
                        i = &(*i)->next;
}

void vm_observers_notify(Vm *v) {
        _cleanup_free_ char *msg = NULL;

        if (!v->observers)
                return;
        if (asprintf(&msg, "vm %s is %s", v->rec.id, vm_state_to_string(v->rec.state)) < 0)
                return;
        for (VmObserver *o = v->observers; o; o = o->next)
                o->fn(msg, o->userdata);
}

void vm_observers_free(Vm *v) {
        while (v->observers) {
                VmObserver *o = v->observers;
                v->observers = o->next;
                free(o);
        }
}

/* ---- waiters ---- */

VmWaiter *vm_waiter_add(Vm *v, VmWaiterKind kind, VmDoneFunc done, void *userdata) {
        VmWaiter *w = calloc(1, sizeof(VmWaiter)), **i = &v->waiters;

        if (!w)
                return NULL;
        w->kind = kind;
        w->done = done;
        w->userdata = userdata;
        w->vm = v;
        /* append: completions run in the order the operations arrived */
        while (*i)
                i = &(*i)->next;
        *i = w;
        return w;
}

static void waiter_unlink(Vm *v, VmWaiter *w) {
        for (VmWaiter **i = &v->waiters; *i; i = &(*i)->next)
                if (*i == w) {
                        *i = w->next;
                        break;
                }
        w->deadline = sd_event_source_disable_unref(w->deadline);
}

void vm_waiter_drop(Vm *v, VmWaiter *w) {
        if (!w)
                return;
        waiter_unlink(v, w);
        free(w);
}

void vm_waiters_free(Vm *v) {
        while (v->waiters) {
                VmWaiter *w = v->waiters;
                v->waiters = w->next;
                sd_event_source_disable_unref(w->deadline);
                free(w);
        }
}

void vm_waiter_then_start(VmWaiter *w) {
        w->then_start = true;
}

static void waiter_complete(Vm *v, VmWaiter *w, int r, const ApiError *e) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        _cleanup_(api_error_done) ApiError e2 = API_ERROR_NULL;
        json_auto_t *record = NULL;
        VmDoneFunc done = w->done;
        void *userdata = w->userdata;
        bool then_start = w->then_start;

        waiter_unlink(v, w);
        free(w);
        if (r < 0 || !then_start)
                vm_unobserve(v, userdata); /* the operation ends here: no more progress for it */

        if (r >= 0 && then_start) {
                /* reboot: the stop finished, now the start; its completion answers the caller */
                if (vm_start(v, done, userdata, &e2) < 0) {
                        vm_unobserve(v, userdata);
                        if (done)
                                done(e2.error, NULL, &e2, userdata);
                }
                return;
        }
        if (!done)
                return;
        if (r < 0) {
                done(r, NULL, e, userdata);
                return;
        }
        record = vm_to_json(v);
        if (!record) {
                (void) api_error_set(&e2, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                done(e2.error, NULL, &e2, userdata);
                return;
        }
        done(0, record, NULL, userdata);
}

void vm_waiters_abandon(Vm *v, const ApiError *e) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);

        /* r < 0: no waiter goes on to a start (reboot), each owner hears the error and lets go */
        while (v->waiters)
                waiter_complete(v, v->waiters, e->error, e);
}

static int on_waiter_deadline(sd_event_source *s, usec_t usec, void *userdata) {
        VmWaiter *w = userdata;
        Vm *v = w->vm;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *text = vm_message(
                v,
                VM_MESSAGE_WAIT_TIMEOUT,
                &(VmMessageArgs){
                        .state = v->rec.state,
                        .what = vm_wait_for_to_string(w->milestone),
                        .detail = v->rec.last_error,
                        .duration = w->timeout,
                });

        (void) api_error_set(&e, -ETIMEDOUT, API_ERROR_TIMEOUT, "%s", text ?: "timeout");
        waiter_complete(v, w, e.error, &e);
        return 0;
}

int vm_waiter_set_milestone(Vm *v, VmWaiter *w, VmWaitFor milestone, usec_t timeout) {
        w->milestone = milestone;
        w->timeout = timeout;
        return sd_event_add_time_relative(
                manager_event(v->manager),
                &w->deadline,
                CLOCK_MONOTONIC,
                timeout,
                USEC_PER_MSEC,
                on_waiter_deadline,
                w);
}

/* A waiter the VM's state settles now: 0 and the record, < 0 and why, or nothing yet (1). */
VmWaitVerdict vm_wait_verdict(Vm *v, VmWaitFor milestone) {
        VmStatus s = vm_status(v);
        VmMilestones m = {
                .installed = v->rec.installed_at != 0,
                .attested = v->rec.booted_at != 0 && v->rec.att.released,
                .ready = v->rec.ready_at != 0,
        };

        return vm_state_wait(&s, &m, milestone);
}

static int waiter_settles(Vm *v, VmWaiter *w, ApiError *reterr) {
        _cleanup_free_ char *text = NULL;

        switch (w->kind) {
        case VM_WAITER_STOPPED:
                return !v->qemu && !IN_SET(v->sub, VM_SUB_START_HELPERS, VM_SUB_START_QMP) ? 0 : 1;
        case VM_WAITER_MILESTONE:
                switch (vm_wait_verdict(v, w->milestone)) {
                case VM_WAIT_REACHED:
                        return 0;
                case VM_WAIT_FAILED:
                        text = vm_message(
                                v,
                                VM_MESSAGE_WAIT_FAILED,
                                &(VmMessageArgs){ .detail = v->fail_reason ?: v->rec.last_error });
                        return api_error_set(reterr, -EIO, API_ERROR_VM_FAILED, "%s", text ?: "vm failed");
                case VM_WAIT_ABANDONED:
                        text = vm_message(v, VM_MESSAGE_WAIT_ENDED, &(VmMessageArgs){ .state = v->rec.state });
                        return api_error_set(reterr, -EIO, API_ERROR_VM_FAILED, "%s", text ?: "vm failed");
                default:
                        return 1;
                }
        default:
                return 1; /* VM_WAITER_STARTED: vm_waiters_finish_start() answers those */
        }
}

void vm_waiters_check(Vm *v) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        bool again = true;

        /* a completion may change the list (a reboot's start): walk it again from the start */
        while (again) {
                again = false;
                for (VmWaiter *w = v->waiters; w; w = w->next) {
                        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
                        int r = waiter_settles(v, w, &e);

                        if (r > 0)
                                continue;
                        waiter_complete(v, w, r, r < 0 ? &e : NULL);
                        again = true;
                        break;
                }
        }
}

void vm_waiters_finish_start(Vm *v, int r, const ApiError *e) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        VmWaiter *mine = NULL, **tail = &mine;

        vm_probe_stop(v);
        /* Take this chain's waiters out first: a completion may start another chain (reboot). */
        for (VmWaiter **i = &v->waiters; *i;)
                if ((*i)->kind == VM_WAITER_STARTED) {
                        VmWaiter *w = *i;
                        *i = w->next;
                        w->next = NULL;
                        *tail = w;
                        tail = &w->next;
                } else
                        i = &(*i)->next;
        while (mine) {
                VmWaiter *w = mine;
                mine = w->next;
                waiter_complete(v, w, r, e);
        }
        vm_waiters_check(v);
}
