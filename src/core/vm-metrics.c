/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* get_vm_metrics: the host's view of a VM (its state, QEMU's process as /proc says, its disk, its
 * network) and a summary of its guest's last report. */
#include <stdio.h>
#include <stdlib.h>

#include "json-util.h"
#include "log.h"
#include "manager.h"
#include "metrics-guest.h"
#include "net-switch.h"
#include "network.h"
#include "process-util.h"
#include "vm-internal.h"
#include "worker.h"

#define GUEST_NOTE_NONE "no systemd-report upload from the guest yet; host metrics only"
#define GUEST_NOTE_NOT_REPORT \
        "the guest's last upload is not a systemd-report and was not exported; see raw_report_url"
#define GUEST_NOTE_LOADING \
        "the guest's stored report is being mapped again after a restart; its series follow"

/* ---- the balloon's statistics ------------------------------------------------------------------- */

/* How often QEMU asks the guest's balloon driver for statistics: each is a wake-up of an idle guest,
 * so not often; metrics readers see figures at most this old. */
#define VM_BALLOON_POLL_SECONDS 30
/* How often a reader's visit asks QEMU again (a local question, no guest wake-up). */
#define VM_BALLOON_REFRESH (5 * USEC_PER_SEC)
/* QEMU's error text kept, cut to this. */
#define VM_BALLOON_ERROR_MAX 256

static void balloon_set_error(Vm *v, int error, const char *desc) {
        char *text;

        /* QEMU's text, cut; on OOM the last one goes without a successor */
        if (asprintf(&text, "%.*s", (int) VM_BALLOON_ERROR_MAX, desc ?: strerror(-error)) < 0)
                text = NULL;
        free(v->balloon_error);
        v->balloon_error = text;
}

static void on_balloon_interval(QmpClient *c, int error, json_t *result, const char *error_desc, void *userdata) {
        Vm *v = userdata;

        /* a monitor we dropped (the VM may be going away with it): nothing to keep */
        if (c != v->qmp)
                return;
        if (error < 0) {
                log_debug(
                        "VM %s: setting the balloon's polling interval failed: %s",
                        v->rec.id,
                        error_desc ?: strerror(-error));
                balloon_set_error(v, error, error_desc);
        }
}

static void on_balloon_stats(QmpClient *c, int error, json_t *result, const char *error_desc, void *userdata) {
        Vm *v = userdata;
        VmBalloonStats st;
        int r;

        if (c != v->qmp)
                return;
        v->balloon_pending = false;
        if (error < 0) {
                balloon_set_error(v, error, error_desc);
                return;
        }
        r = vm_balloon_stats_parse(result, &st);
        if (r < 0) {
                balloon_set_error(v, r, "guest-stats is not an object of statistics");
                return;
        }
        v->balloon = st;
        v->balloon_have = true;
        v->balloon_error = mfree(v->balloon_error);
}

static json_t *balloon_args(const char *property, json_t *value) {
        json_t *a = json_pack("{s:s,s:s}", "path", VM_BALLOON_QOM_PATH, "property", property);

        if (a && value && json_object_set_new(a, "value", value) < 0)
                return json_decref(a), NULL;
        if (!a)
                json_decref(value);
        return a;
}

void vm_balloon_forget(Vm *v) {
        v->balloon = (VmBalloonStats){};
        v->balloon_started = v->balloon_have = v->balloon_pending = false;
        v->balloon_asked = 0;
        v->balloon_error = mfree(v->balloon_error);
}

void vm_balloon_start(Vm *v) {
        json_auto_t *args = NULL;
        int r;

        vm_balloon_forget(v);
        if (!v->qmp)
                return;
        args = balloon_args("guest-stats-polling-interval", json_integer(VM_BALLOON_POLL_SECONDS));
        if (!args)
                return;
        r = qmp_client_execute(v->qmp, "qom-set", args, 0, on_balloon_interval, v);
        if (r < 0)
                log_debug_errno(r, "VM %s: asking for balloon statistics failed, ignoring: %m", v->rec.id);
        else
                v->balloon_started = true;
}

void vm_balloon_refresh(Vm *v) {
        json_auto_t *args = NULL;
        usec_t now = now_usec(CLOCK_MONOTONIC);
        int r;

        if (!v->qmp || !v->balloon_started || v->balloon_pending || !qmp_client_is_ready(v->qmp) ||
            (v->balloon_asked > 0 && now < v->balloon_asked + VM_BALLOON_REFRESH))
                return;
        args = balloon_args("guest-stats", NULL);
        if (!args)
                return;
        r = qmp_client_execute(v->qmp, "qom-get", args, 0, on_balloon_stats, v);
        if (r < 0) {
                log_debug_errno(r, "VM %s: asking for balloon statistics failed, ignoring: %m", v->rec.id);
                return;
        }
        v->balloon_pending = true;
        v->balloon_asked = now;
}

bool vm_balloon_stats(Vm *v, const VmBalloonStats **ret) {
        vm_balloon_refresh(v);
        if (!v->balloon_have || !vm_qemu_pid(v))
                return false;
        *ret = &v->balloon;
        return true;
}

/* get_vm_metrics's "balloon": the statistics QEMU last had from the guest, or why there are none. */
static json_t *balloon_json(Vm *v) {
        json_auto_t *o = NULL, *stats = NULL;
        const VmBalloonStats *st;
        bool have = vm_balloon_stats(v, &st);
        const char *note = NULL;

        if (!vm_qemu_pid(v))
                return json_null();
        if (have) {
                stats = vm_balloon_stats_to_json(st);
                if (!stats)
                        return NULL;
                if (st->last_update == 0)
                        note = "the guest's balloon driver has sent no statistics yet";
        } else if (v->balloon_error)
                note = v->balloon_error;
        else
                note = "no statistics asked of QEMU yet: they follow on a later read";

        o = json_pack(
                "{s:b,s:i}", "free_page_reporting", true, "poll_interval_seconds", VM_BALLOON_POLL_SECONDS);
        if (!o || json_object_set(o, "stats", stats ?: json_null()) < 0 ||
            (note && json_object_set_new(o, "note", json_string(note)) < 0))
                return NULL;
        return TAKE_PTR(o);
}

/* ---- host memory ---------------------------------------------------------------------------------- */

/* How often a reader's visit measures the processes again. */
#define VM_MEMORY_REFRESH (10 * USEC_PER_SEC)

/* One measurement of a VM's processes, on the exec worker's thread. */
typedef struct VmMemoryJob {
        Vm *vm; /* a reference (the worker ends before the manager drops its VMs) */
        pid_t pid[_VM_ROLE_MAX];
        ProcMemory mem[_VM_ROLE_MAX];
        bool ok[_VM_ROLE_MAX];
} VmMemoryJob;

/* The pid of role in the current run, or 0. */
static pid_t role_pid(Vm *v, VmRole role) {
        VmLaunched *procs[_VM_ROLE_MAX] = { v->qemu, v->swtpm, v->vsockd };

        if (!vm_qemu_pid(v))
                return 0; /* no run: whatever pids linger belong to no one of ours */
        if (role == VM_ROLE_QEMU)
                return v->qemu_pid;
        return procs[role] ? vm_launched_pid(procs[role]) : 0;
}

static void memory_job_run(void *userdata) {
        VmMemoryJob *j = userdata;

        for (VmRole i = 0; i < _VM_ROLE_MAX; i++)
                j->ok[i] = j->pid[i] > 0 && proc_memory(j->pid[i], &j->mem[i]) >= 0;
}

static void memory_job_done(void *userdata, bool ran) {
        VmMemoryJob *j = userdata;
        Vm *v = j->vm;

        v->mem_pending = false;
        for (VmRole i = 0; ran && i < _VM_ROLE_MAX; i++) {
                /* only figures of processes that still run for this VM */
                v->mem_pid[i] = j->ok[i] && j->pid[i] == role_pid(v, i) ? j->pid[i] : 0;
                v->mem[i] = j->mem[i];
        }
        vm_unref(v);
        free(j);
}

/* Measures the run's processes off the loop unless that is under way or recent. */
static void memory_refresh(Vm *v) {
        usec_t now = now_usec(CLOCK_MONOTONIC);
        VmMemoryJob *j;
        Worker *w;
        int r;

        if (v->mem_pending || !vm_qemu_pid(v) || (v->mem_asked > 0 && now < v->mem_asked + VM_MEMORY_REFRESH))
                return;
        if (manager_exec_worker(v->manager, &w) < 0)
                return;
        j = calloc(1, sizeof(VmMemoryJob));
        if (!j)
                return;
        for (VmRole i = 0; i < _VM_ROLE_MAX; i++)
                j->pid[i] = role_pid(v, i);
        j->vm = vm_ref(v);
        r = worker_submit(w, j, memory_job_run, memory_job_done);
        if (r < 0) {
                log_debug_errno(r, "VM %s: measuring its processes' memory failed, ignoring: %m", v->rec.id);
                vm_unref(j->vm);
                free(j);
                return;
        }
        v->mem_pending = true;
        v->mem_asked = now;
}

int vm_process_memory(Vm *v, VmRole role, pid_t *ret_pid, ProcMemory *ret) {
        pid_t pid;

        assert_return(role >= 0 && role < _VM_ROLE_MAX, -EINVAL);

        memory_refresh(v);
        pid = role_pid(v, role);
        if (pid <= 0)
                return -ESRCH;
        if (v->mem_pid[role] != pid)
                return -ENODATA; /* not measured yet */
        *ret_pid = pid;
        *ret = v->mem[role];
        return 0;
}

/* "processes": each process of the run with its memory, and the sum of their PSS. */
static int put_process_memory(Vm *v, json_t *host) {
        json_auto_t *l = json_array();
        uint64_t total = 0;
        size_t n = 0;

        if (!l)
                return -ENOMEM;
        for (VmRole i = 0; i < _VM_ROLE_MAX; i++) {
                ProcMemory pm;
                pid_t pid;
                json_t *p;

                if (vm_process_memory(v, i, &pid, &pm) < 0)
                        continue;
                p = json_pack(
                        "{s:s,s:i,s:I,s:I,s:I,s:I,s:I,s:I}",
                        "role",
                        vm_role_to_string(i),
                        "pid",
                        (int) pid,
                        "pss_bytes",
                        (json_int_t) pm.pss,
                        "rss_bytes",
                        (json_int_t) pm.rss,
                        "pss_anon_bytes",
                        (json_int_t) pm.pss_anon,
                        "pss_file_bytes",
                        (json_int_t) pm.pss_file,
                        "pss_shmem_bytes",
                        (json_int_t) pm.pss_shmem,
                        "swap_pss_bytes",
                        (json_int_t) pm.swap_pss);
                if (!p || json_array_append_new(l, p) < 0)
                        return -ENOMEM;
                total += pm.pss;
                n++;
        }
        if (n == 0)
                return 0;
        if (json_object_set_new(host, "memory_pss_bytes", json_integer((json_int_t) total)) < 0 ||
            json_object_set(host, "processes", l) < 0)
                return -ENOMEM;
        return 0;
}

static double secs(usec_t a, usec_t b) {
        return (double) (b - a) / USEC_PER_SEC;
}

static int set_float(json_t *o, const char *key, double v) {
        return json_object_set_new(o, key, json_real(v));
}

static json_t *network_json(Manager *m, const char *name) {
        Network *n = network_registry_get(manager_networks(m), name);
        NetSwitch *sw = manager_switch_get(m, name);
        NetStats st = {};

        if (sw)
                net_switch_get_stats(sw, &st);
        return json_pack(
                "{s:s,s:I,s:I,s:I}",
                "name",
                name ?: "",
                "bytes_sent",
                (json_int_t) st.tx_bytes,
                "bytes_received",
                (json_int_t) st.rx_bytes,
                "leases",
                (json_int_t) (n ? n->n_leases : 0));
}

int vm_metrics_json(Vm *v, json_t **ret, ApiError *reterr) {
        json_auto_t *o = json_object(), *host = json_object(), *guest = NULL;
        usec_t created, installed, booted, ready, now = now_usec(CLOCK_REALTIME);
        pid_t pid = vm_qemu_pid(v);
        const VmGuest *g = vm_guest(v);
        ProcStats ps;
        char url[256];

        if (!o || !host)
                return -ENOMEM;
        vm_times(v, &created, &installed, &booted, &ready);
        if (json_object_set_new(host, "state", json_string(vm_state_to_string(vm_state(v)))) < 0 ||
            json_object_set_new(host, "attestation", json_string(vm_attestation_word(v))) < 0)
                return -ENOMEM;
        if (pid > 0) {
                if (json_object_set_new(host, "pid", json_integer(pid)) < 0)
                        return -ENOMEM;
                if (proc_stats(pid, &ps) >= 0 &&
                    (set_float(host, "cpu_seconds", ps.cpu_seconds) < 0 ||
                     json_object_set_new(host, "memory_rss_bytes", json_integer((json_int_t) ps.rss_bytes)) <
                             0))
                        return -ENOMEM;
        }
        if (put_process_memory(v, host) < 0)
                return -ENOMEM;
        if (json_object_set_new(host, "disk_bytes", json_integer((json_int_t) vm_disk_bytes(v))) < 0)
                return -ENOMEM;
        if (installed > 0 && created > 0 && installed >= created &&
            set_float(host, "install_seconds", secs(created, installed)) < 0)
                return -ENOMEM;
        if (ready > 0 && booted > 0 && ready >= booted &&
            set_float(host, "boot_to_ready_seconds", secs(booted, ready)) < 0)
                return -ENOMEM;
        if (json_object_set_new(host, "network", network_json(vm_manager(v), vm_network(v))) < 0)
                return -ENOMEM;

        if (g->has_upload && g->last_is_report && g->report) {
                GuestReport *rep = g->report;

                guest = json_object();
                if (!guest || vm_json_set_time(guest, "received_at", g->received_at) < 0 ||
                    (rep->generated_at > 0 && vm_json_set_time(guest, "generated_at", rep->generated_at) < 0) ||
                    set_float(guest, "report_age_seconds", now > g->received_at ? secs(g->received_at, now) : 0) <
                            0 ||
                    json_object_set_new(guest, "families", json_integer((json_int_t) rep->n_families)) < 0 ||
                    json_object_set_new(guest, "series", json_integer((json_int_t) rep->n_entries)) < 0 ||
                    json_object_set_new(guest, "series_exported", json_integer((json_int_t) rep->n_series)) <
                            0 ||
                    json_object_set_new(
                            guest,
                            "series_dropped",
                            json_integer((
                                    json_int_t) (rep->dropped[GUEST_DROP_LIMIT] + rep->dropped[GUEST_DROP_UNSUPPORTED] + rep->dropped[GUEST_DROP_DUPLICATE]))) <
                            0 ||
                    json_object_set(guest, "sample", rep->sample ?: json_null()) < 0)
                        return -ENOMEM;
        }

        if (json_object_set_new(o, "id", json_string(vm_id(v))) < 0 ||
            json_object_set(o, "host", host) < 0 || json_object_set(o, "guest", guest ?: json_null()) < 0 ||
            json_object_set_new(o, "balloon", balloon_json(v)) < 0)
                return -ENOMEM;
        if (g->has_upload || g->loading) {
                snprintf(url, sizeof(url), "/api/v1/vms/%s/report", vm_id(v));
                if (json_object_set_new(o, "raw_report_url", json_string(url)) < 0)
                        return -ENOMEM;
        }
        if (!g->has_upload || !guest) {
                const char *note = g->has_upload ? GUEST_NOTE_NOT_REPORT :
                        g->loading               ? GUEST_NOTE_LOADING :
                                                   GUEST_NOTE_NONE;
                if (json_object_set_new(o, "note", json_string(note)) < 0)
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(o);
        return 0;
}
