/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Metrics: the guests' report uploads, get_vm_metrics, and the exposition behind GET /metrics (host
 * families, guest families, the daemon's own process). Everything is computed at scrape time from the
 * records and /proc; only the two duration histograms and the guest reports are kept. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs-util.h"
#include "json-util.h"
#include "log.h"
#include "manager.h"
#include "metrics-guest.h"
#include "metrics-text.h"
#include "vm.h"

#define GUEST_NOTE_NONE "no systemd-report upload from the guest yet; host metrics only"
#define GUEST_NOTE_NOT_REPORT \
        "the guest's last upload is not a systemd-report and was not exported; see raw_report_url"
#define GUEST_NOTE_LOADING \
        "the guest's stored report is being mapped again after a restart; its series follow"

void vm_guest_done(VmGuest *g) {
        g->report = guest_report_free(g->report);
        *g = (VmGuest){};
}

static int report_error(int r, ApiError *reterr) {
        switch (r) {
        case -EMSGSIZE:
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INVALID_REQUEST,
                        "report is larger than %zu bytes",
                        GUEST_REPORT_SIZE_MAX);
        case -ELOOP:
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INVALID_REQUEST,
                        "report is nested deeper than %u levels",
                        GUEST_REPORT_DEPTH_MAX);
        case -E2BIG:
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INVALID_REQUEST,
                        "report has more than %zu values (arrays, objects, list items)",
                        GUEST_REPORT_VALUES_MAX);
        case -EBADMSG:
                return api_error_set(reterr, r, API_ERROR_INVALID_REQUEST, "report is not valid JSON");
        default:
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "report not mapped: %s", strerror(-r));
        }
}

/* A parsed upload becomes the VM's current one. */
static void guest_take(Vm *v, GuestReport *rep, usec_t received_at) {
        VmGuest *g = vm_guest(v);

        g->has_upload = true;
        g->received_at = received_at;
        g->last_is_report = rep->is_report;
        if (!rep->is_report) {
                /* the series of the last good report stay exported */
                guest_report_free(rep);
                return;
        }
        guest_report_free(g->report);
        g->report = rep;
}

/* ---- parsing and storing off the loop ---------------------------------------------------------- */

/* An upload of 8 MiB takes a tenth of a second or more to parse (more under sanitizers), and storing
 * it fsyncs: both run on the report worker, one job at a time, at a lower priority than the loop. The
 * loop keeps the VM, the manager and the answer; the worker gets the bytes and gives back the
 * GuestReport. */
typedef struct ReportJob {
        /* the loop's */
        Vm *vm; /* a reference */
        VmReportDone done;
        void *userdata;
        /* the worker's input */
        bool load; /* map the stored file again (start-up), else parse and store body */
        char *dir, *path;
        char *body;
        size_t size, series_limit;
        usec_t received_at; /* an upload's receive time, which becomes the file's; a load reads it back */
        /* the worker's output */
        int r;       /* of the parse (of reading the file, for a load) */
        int r_store; /* of writing the file */
        GuestReport *report;
} ReportJob;

static ReportJob *report_job_free(ReportJob *j) {
        if (!j)
                return NULL;
        vm_unref(j->vm);
        free(j->dir);
        free(j->path);
        free(j->body);
        guest_report_free(j->report);
        free(j);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(ReportJob *, report_job_free);

static int report_job_new(Vm *v, bool load, ReportJob **ret) {
        _cleanup_(report_job_freep) ReportJob *j = calloc(1, sizeof(ReportJob));

        if (!j)
                return -ENOMEM;
        j->vm = vm_ref(v);
        j->load = load;
        j->dir = vm_path(v, "");
        j->path = vm_path(v, "report.json");
        if (!j->dir || !j->path)
                return -ENOMEM;
        j->series_limit = vm_manager(v)->guest_series_limit;
        *ret = TAKE_PTR(j);
        return 0;
}

/* On the worker thread: nothing but the job. */
static void report_run(void *userdata) {
        ReportJob *j = userdata;
        _cleanup_free_ char *data = NULL;
        struct timespec ts[2];
        struct stat st;
        size_t size;

        if (j->load) {
                if (stat(j->path, &st) < 0) {
                        j->r = -errno;
                        return;
                }
                j->received_at = (usec_t) st.st_mtim.tv_sec * USEC_PER_SEC +
                        (usec_t) st.st_mtim.tv_nsec / NSEC_PER_USEC;
                j->r = read_full_file(j->path, GUEST_REPORT_SIZE_MAX, &data, &size);
                if (j->r >= 0)
                        j->r = guest_report_parse(data, size, j->series_limit, &j->report);
                return;
        }

        j->r = guest_report_parse(j->body, j->size, j->series_limit, &j->report);
        if (j->r < 0)
                return;
        j->r_store = write_file_atomic(j->path, j->body, j->size, 0600);
        if (j->r_store < 0)
                return;
        /* the file's time is the receive time a restarted daemon reads back */
        ts[0] = ts[1] = (struct timespec){ .tv_sec = (time_t) (j->received_at / USEC_PER_SEC),
                                           .tv_nsec = (long) (j->received_at % USEC_PER_SEC) * 1000 };
        (void) utimensat(AT_FDCWD, j->path, ts, 0);
        j->body = mfree(j->body);
}

/* A stored upload becomes the VM's current one. */
static void upload_take(Vm *v, ReportJob *j) {
        VmGuest *g = vm_guest(v);
        GuestReport *rep = TAKE_PTR(j->report);

        g->uploads++;
        if (rep->is_report) {
                for (size_t i = 0; i < _GUEST_DROP_MAX; i++)
                        g->dropped[i] += rep->dropped[i];
                if (rep->dropped[GUEST_DROP_LIMIT] > 0)
                        log_warning(
                                "VM %s: its report has %zu entries; %" PRIu64
                                " beyond --metrics-guest-series-limit=%zu were dropped.",
                                vm_id(v),
                                rep->n_entries,
                                rep->dropped[GUEST_DROP_LIMIT],
                                j->series_limit);
        } else
                log_info("VM %s: its upload is not a systemd-report; stored, not exported.", vm_id(v));
        guest_take(v, rep, j->received_at);
        manager_touch(vm_manager(v));
}

static void report_load_next(Manager *m);

/* Back on the loop. */
static void report_done(void *userdata, bool ran) {
        _cleanup_(report_job_freep) ReportJob *j = userdata;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        Vm *v = j->vm;
        Manager *m = vm_manager(v);
        VmGuest *g = vm_guest(v);
        bool gone = manager_find_vm(m, vm_id(v)) != v || vm_state(v) == VM_STATE_DELETING;
        int r;

        if (j->load) {
                g->loading = g->load_running = false;
                if (ran && !gone && j->r < 0)
                        log_warning(
                                "VM %s: its stored report %s is not used: %s",
                                vm_id(v),
                                j->path,
                                strerror(-j->r));
                /* an upload that came in meanwhile is newer */
                else if (ran && !gone && g->uploads == 0)
                        guest_take(v, TAKE_PTR(j->report), j->received_at);
                if (ran)
                        report_load_next(m);
                return;
        }

        g->uploading = false;
        if (!ran)
                r = api_error_set(&e, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
        else if (gone) {
                /* The deletion may have emptied the directory while the worker wrote into it: once
                 * the VM is out of the registry, nothing else removes what the worker left. */
                if (!manager_find_vm(m, vm_id(v)))
                        (void) rm_rf(j->dir);
                r = api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "vm %s was deleted", vm_id(v));
        } else if (j->r < 0)
                r = report_error(j->r, &e);
        else if (j->r_store < 0)
                r = api_error_set(
                        &e, j->r_store, API_ERROR_INTERNAL, "report not stored: %s", strerror(-j->r_store));
        else {
                upload_take(v, j);
                r = 0;
        }
        if (j->done)
                j->done(r, r < 0 ? &e : NULL, j->userdata);
}

static int report_submit(Manager *m, ReportJob *j) {
        int r;

        if (!m->report_worker) {
                r = worker_new(
                        m->event,
                        &(WorkerOptions){
                                .name = "vmm-report",
                                .threads = 1,
                                /* every VM's start-up load, and the uploads */
                                .max_jobs = MANAGER_VMS_MAX + VM_REPORT_UPLOADS_MAX,
                                .nice = 10,
                        },
                        &m->report_worker);
                if (r < 0)
                        return r;
        }
        return worker_submit(m->report_worker, j, report_run, report_done);
}

static unsigned uploads_in_flight(Manager *m) {
        unsigned n = 0;

        for (size_t i = 0; i < m->n_vms; i++)
                n += vm_guest(m->vms[i])->uploading;
        return n;
}

int vm_report_upload(Vm *v, const void *body, size_t size, VmReportDone done, void *userdata, ApiError *reterr) {
        _cleanup_(report_job_freep) ReportJob *j = NULL;
        Manager *m = vm_manager(v);
        VmGuest *g = vm_guest(v);
        int r;

        assert_return(body || size == 0, -EINVAL);
        if (size > GUEST_REPORT_SIZE_MAX)
                return report_error(-EMSGSIZE, reterr);
        if (g->uploading)
                return api_error_set(
                        reterr,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "the previous report of vm %s is still being stored",
                        vm_id(v));
        if (uploads_in_flight(m) >= VM_REPORT_UPLOADS_MAX)
                return api_error_set(
                        reterr, -EAGAIN, API_ERROR_CONFLICT, "%u reports are being stored", VM_REPORT_UPLOADS_MAX);

        r = report_job_new(v, /* load= */ false, &j);
        if (r < 0)
                return r;
        j->body = malloc(size + 1);
        if (!j->body)
                return -ENOMEM;
        memcpy(j->body, body, size);
        j->body[size] = 0;
        j->size = size;
        j->received_at = now_usec(CLOCK_REALTIME);
        j->done = done;
        j->userdata = userdata;
        r = report_submit(m, j);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "report not queued: %s", strerror(-r));
        TAKE_PTR(j);
        g->uploading = true;
        return 0;
}

/* Maps v's stored report off the loop. */
static int report_load_submit(Vm *v) {
        _cleanup_(report_job_freep) ReportJob *j = NULL;
        int r;

        r = report_job_new(v, /* load= */ true, &j);
        if (r >= 0)
                r = report_submit(vm_manager(v), j);
        if (r < 0) {
                log_warning("VM %s: its stored report is not used: %s", vm_id(v), strerror(-r));
                vm_guest(v)->loading = false;
                return r;
        }
        TAKE_PTR(j);
        vm_guest(v)->load_running = true;
        return 0;
}

/* The stored reports go to the worker one at a time, so that an upload waits behind one of them
 * at most. */
static void report_load_next(Manager *m) {
        for (size_t i = 0; i < m->n_vms; i++)
                if (vm_guest(m->vms[i])->load_running)
                        return;
        for (size_t i = 0; i < m->n_vms; i++) {
                VmGuest *g = vm_guest(m->vms[i]);

                if (g->loading && g->uploads > 0)
                        g->loading = false; /* an upload came first: the stored one is older */
                else if (g->loading && report_load_submit(m->vms[i]) >= 0)
                        return;
        }
}

void vm_report_load(Vm *v) {
        _cleanup_free_ char *path = vm_path(v, "report.json");
        Manager *m = vm_manager(v);

        if (!path)
                return;
        /* what a daemon killed while storing an upload left behind */
        (void) write_file_atomic_cleanup(path);
        if (access(path, F_OK) < 0)
                return;
        vm_guest(v)->loading = true;
        /* v joins the registry after this: the first load starts here, the others follow from
         * report_done() */
        for (size_t i = 0; i < m->n_vms; i++)
                if (vm_guest(m->vms[i])->loading)
                        return;
        (void) report_load_submit(v);
}

int vm_report_open(Vm *v, int *ret_fd, uint64_t *ret_size, ApiError *reterr) {
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int fd = -EBADF;
        struct stat st;

        /* Only an upload this daemon parsed (taken, or mapped again at start-up) is known to be
         * JSON: a file still being mapped, or left by a daemon that stored any bytes, is not. */
        if (!vm_guest(v)->has_upload)
                return -EMEDIUMTYPE;
        path = vm_path(v, "report.json");
        if (!path)
                return -ENOMEM;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 && errno == ENOENT)
                return api_error_set(
                        reterr,
                        -ENOENT,
                        API_ERROR_NOT_FOUND,
                        "vm \"%s\" has no systemd-report upload yet",
                        vm_id(v));
        if (fd < 0 || fstat(fd, &st) < 0)
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "%s: %m", path);
        *ret_fd = TAKE_FD(fd);
        *ret_size = (uint64_t) st.st_size;
        return 0;
}

int vm_report_json(Vm *v, json_t **ret, ApiError *reterr) {
        _cleanup_free_ char *path = vm_path(v, "report.json"), *data = NULL;
        json_t *j;
        size_t size;
        int r;

        if (!path)
                return -ENOMEM;
        r = read_full_file(path, GUEST_REPORT_SIZE_MAX, &data, &size);
        if (r == -ENOENT)
                return api_error_set(
                        reterr, r, API_ERROR_NOT_FOUND, "vm \"%s\" has no systemd-report upload yet", vm_id(v));
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "%s: %s", path, strerror(-r));
        j = json_loadb(data, size, JSON_DECODE_ANY, NULL);
        if (!j) /* not JSON (written by an older daemon): served as a string */
                j = json_stringn_lossy(data, size);
        if (!j)
                return -ENOMEM;
        *ret = j;
        return 0;
}

/* The attestation as one word: disabled, released, failed or pending (in that order). */
static const char *attestation_word(Vm *v) {
        VmAttestation *a = vm_attestation(v);

        if (!vm_spec(v)->require_attestation)
                return "disabled";
        if (a->released)
                return "released";
        if (a->has_initrd && !a->initrd.verified)
                return "failed";
        return "pending";
}

typedef struct ProcStats {
        double cpu_seconds;
        uint64_t rss_bytes, vsize_bytes;
        double start_seconds; /* since boot */
} ProcStats;

/* /proc/<pid>/stat (utime, stime, starttime, vsize after the last ')') and statm (resident pages). */
static int proc_stats(pid_t pid, ProcStats *ret) {
        char path[64], buf[1024], *p;
        unsigned long long f[24];
        long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
        unsigned long long size_pages, resident;
        ssize_t n;
        int fd, k = 0;
        FILE *sf;

        if (pid <= 0 || tck <= 0 || page <= 0)
                return -EINVAL;
        snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return -EIO;
        buf[n] = 0;
        p = strrchr(buf, ')');
        if (!p)
                return -EBADMSG;
        /* after ") ": state, then numbered fields from ppid (field 4 of the line) on */
        p += 2;
        p = strchr(p, ' ');
        while (p && k < (int) ELEMENTSOF(f)) {
                char *end;
                f[k] = strtoull(p + 1, &end, 10);
                if (end == p + 1)
                        break;
                k++;
                p = *end == ' ' ? end : NULL;
        }
        /* f[0] is field 4 (ppid): utime 14, stime 15, starttime 22, vsize 23 */
        if (k < 20)
                return -EBADMSG;
        snprintf(path, sizeof(path), "/proc/%d/statm", (int) pid);
        sf = fopen(path, "re");
        if (!sf)
                return -errno;
        if (fscanf(sf, "%llu %llu", &size_pages, &resident) != 2) {
                fclose(sf);
                return -EBADMSG;
        }
        fclose(sf);
        *ret = (ProcStats){
                .cpu_seconds = (double) (f[10] + f[11]) / (double) tck,
                .start_seconds = (double) f[18] / (double) tck,
                .vsize_bytes = f[19],
                .rss_bytes = resident * (unsigned long long) page,
        };
        return 0;
}

static double secs(usec_t a, usec_t b) {
        return (double) (b - a) / USEC_PER_SEC;
}

static int set_float(json_t *o, const char *key, double v) {
        return json_object_set_new(o, key, json_real(v));
}

static json_t *network_json(Manager *m, const char *name) {
        Network *n = network_registry_get(m->networks, name);
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
        VmGuest *g = vm_guest(v);
        ProcStats ps;
        char url[256];

        if (!o || !host)
                return -ENOMEM;
        vm_times(v, &created, &installed, &booted, &ready);
        if (json_object_set_new(host, "state", json_string(vm_state_to_string(vm_state(v)))) < 0 ||
            json_object_set_new(host, "attestation", json_string(attestation_word(v))) < 0)
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
            json_object_set(o, "host", host) < 0 || json_object_set(o, "guest", guest ?: json_null()) < 0)
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

/* ---- the exposition ---------------------------------------------------------------------------- */

#define VM_LABELS(v) "vm", vm_id(v), "name", vm_name(v)

static void write_vm_gauge(
        MetricsBuf *f, Manager *m, const char *name, const char *help, double (*get)(Vm *v, bool *ok)) {
        metrics_write_family(f, name, "gauge", help);
        for (size_t i = 0; i < m->n_vms; i++) {
                bool ok = true;
                double x = get(m->vms[i], &ok);
                if (ok)
                        metrics_write_samplel(f, name, x, VM_LABELS(m->vms[i]), NULL);
        }
}

static double get_created(Vm *v, bool *ok) {
        usec_t c;
        vm_times(v, &c, NULL, NULL, NULL);
        *ok = c > 0;
        return (double) c / USEC_PER_SEC;
}

static double get_install(Vm *v, bool *ok) {
        usec_t c, i;
        vm_times(v, &c, &i, NULL, NULL);
        *ok = c > 0 && i >= c;
        return *ok ? secs(c, i) : 0;
}

static double get_ready(Vm *v, bool *ok) {
        usec_t b, r;
        vm_times(v, NULL, NULL, &b, &r);
        *ok = b > 0 && r >= b;
        return *ok ? secs(b, r) : 0;
}

static double get_disk(Vm *v, bool *ok) {
        return (double) vm_disk_bytes(v);
}

static void write_host_families(MetricsBuf *f, Manager *m) {
        static const char *const att_words[] = { "disabled", "pending", "released", "failed" };
        unsigned counts[_VM_STATE_MAX] = {};
        ProcStats *ps = calloc(m->n_vms ?: 1, sizeof(ProcStats));
        bool *has_ps = calloc(m->n_vms ?: 1, sizeof(bool));

        metrics_write_family(
                f,
                "vm_manager_vm_state",
                "gauge",
                "Current lifecycle state of each VM (1 for the current state).");
        for (size_t i = 0; i < m->n_vms; i++) {
                Vm *v = m->vms[i];
                VmState cur = vm_state(v);

                if (cur >= 0 && cur < _VM_STATE_MAX)
                        counts[cur]++;
                for (VmState s = 0; s < _VM_STATE_MAX; s++)
                        metrics_write_samplel(
                                f,
                                "vm_manager_vm_state",
                                s == cur ? 1 : 0,
                                VM_LABELS(v),
                                "state",
                                vm_state_to_string(s),
                                NULL);
        }

        metrics_write_family(
                f,
                "vm_manager_vm_attestation",
                "gauge",
                "Attestation of each VM's current boot: disabled, pending, released or failed (1 for the current one).");
        for (size_t i = 0; i < m->n_vms; i++) {
                const char *w = attestation_word(m->vms[i]);
                for (size_t k = 0; k < ELEMENTSOF(att_words); k++)
                        metrics_write_samplel(
                                f,
                                "vm_manager_vm_attestation",
                                streq(w, att_words[k]) ? 1 : 0,
                                VM_LABELS(m->vms[i]),
                                "state",
                                att_words[k],
                                NULL);
        }

        metrics_write_family(f, "vm_manager_vm_info", "gauge", "Static facts of each VM as labels (always 1).");
        for (size_t i = 0; i < m->n_vms; i++) {
                Vm *v = m->vms[i];
                metrics_write_samplel(
                        f,
                        "vm_manager_vm_info",
                        1,
                        VM_LABELS(v),
                        "network",
                        vm_network(v) ?: "",
                        "ip",
                        vm_ip(v) ?: "",
                        "image",
                        vm_spec(v)->image ?: "",
                        NULL);
        }

        write_vm_gauge(
                f,
                m,
                "vm_manager_vm_created_timestamp_seconds",
                "When the VM was created (Unix seconds).",
                get_created);
        write_vm_gauge(
                f,
                m,
                "vm_manager_vm_install_seconds",
                "How long the VM's install took (created to installed).",
                get_install);
        write_vm_gauge(
                f,
                m,
                "vm_manager_vm_boot_to_ready_seconds",
                "Seconds from the start of the current installed boot to READY=1.",
                get_ready);

        for (size_t i = 0; ps && has_ps && i < m->n_vms; i++)
                has_ps[i] = proc_stats(vm_qemu_pid(m->vms[i]), &ps[i]) >= 0;
        metrics_write_family(
                f,
                "vm_manager_vm_cpu_seconds_total",
                "counter",
                "CPU time (user and system) of the VM's QEMU process.");
        for (size_t i = 0; ps && has_ps && i < m->n_vms; i++)
                if (has_ps[i])
                        metrics_write_samplel(
                                f,
                                "vm_manager_vm_cpu_seconds_total",
                                ps[i].cpu_seconds,
                                VM_LABELS(m->vms[i]),
                                NULL);
        metrics_write_family(
                f, "vm_manager_vm_memory_rss_bytes", "gauge", "Resident memory of the VM's QEMU process.");
        for (size_t i = 0; ps && has_ps && i < m->n_vms; i++)
                if (has_ps[i])
                        metrics_write_samplel(
                                f,
                                "vm_manager_vm_memory_rss_bytes",
                                (double) ps[i].rss_bytes,
                                VM_LABELS(m->vms[i]),
                                NULL);
        free(ps);
        free(has_ps);

        write_vm_gauge(f, m, "vm_manager_vm_disk_bytes", "Size of the VM's disk volume.", get_disk);

        metrics_write_family(f, "vm_manager_vms", "gauge", "Number of VMs per lifecycle state.");
        for (VmState s = 0; s < _VM_STATE_MAX; s++)
                metrics_write_samplel(f, "vm_manager_vms", counts[s], "state", vm_state_to_string(s), NULL);

        metrics_write_family(
                f,
                "vm_manager_network_bytes_total",
                "counter",
                "Bytes over each network's switch: sent to VMs and received from them (with 4-byte frame prefixes).");
        for (size_t i = 0; i < network_registry_size(m->networks); i++) {
                Network *n = network_registry_at(m->networks, i);
                NetSwitch *sw = manager_switch_get(m, n->name);
                NetStats st = {};

                if (sw)
                        net_switch_get_stats(sw, &st);
                metrics_write_samplel(
                        f,
                        "vm_manager_network_bytes_total",
                        (double) st.tx_bytes,
                        "network",
                        n->name,
                        "direction",
                        "sent",
                        NULL);
                metrics_write_samplel(
                        f,
                        "vm_manager_network_bytes_total",
                        (double) st.rx_bytes,
                        "network",
                        n->name,
                        "direction",
                        "received",
                        NULL);
        }
        metrics_write_family(f, "vm_manager_network_leases", "gauge", "Address leases held on each network.");
        for (size_t i = 0; i < network_registry_size(m->networks); i++) {
                Network *n = network_registry_at(m->networks, i);
                metrics_write_samplel(
                        f, "vm_manager_network_leases", (double) n->n_leases, "network", n->name, NULL);
        }

        metrics_write_histogram(
                f,
                "vm_manager_vm_install_duration_seconds",
                "Durations of successful installs (created to installed), since vm-manager started.",
                &m->install_seconds);
        metrics_write_histogram(
                f,
                "vm_manager_vm_boot_to_ready_duration_seconds",
                "Durations from an installed boot's start to READY=1, since vm-manager started.",
                &m->boot_to_ready_seconds);
}

static void write_build_and_process(MetricsBuf *f, Manager *m) {
        ProcStats ps;
        struct rlimit rl;
        FILE *up;
        double boot_time = 0;
        unsigned fds = 0;
        DIR *d;

        metrics_write_family(f, "vm_manager_build_info", "gauge", "The vm-manager build (always 1).");
        metrics_write_samplel(
                f,
                "vm_manager_build_info",
                1,
                "version",
                m->version ?: "",
                "commit",
                m->commit ?: "",
                "built",
                m->built ?: "",
                NULL);

        if (proc_stats(getpid(), &ps) < 0)
                return;
        up = fopen("/proc/stat", "re");
        if (up) {
                char line[256];
                while (fgets(line, sizeof(line), up))
                        if (sscanf(line, "btime %lf", &boot_time) == 1)
                                break;
                fclose(up);
        }
        d = opendir("/proc/self/fd");
        if (d) {
                for (struct dirent *de; (de = readdir(d));)
                        if (de->d_name[0] != '.')
                                fds++;
                closedir(d);
        }
        metrics_write_family(
                f, "process_cpu_seconds_total", "counter", "CPU time (user and system) of vm-manager.");
        metrics_write_sample(f, "process_cpu_seconds_total", NULL, NULL, 0, ps.cpu_seconds);
        metrics_write_family(f, "process_resident_memory_bytes", "gauge", "Resident memory of vm-manager.");
        metrics_write_sample(f, "process_resident_memory_bytes", NULL, NULL, 0, (double) ps.rss_bytes);
        metrics_write_family(f, "process_virtual_memory_bytes", "gauge", "Virtual memory of vm-manager.");
        metrics_write_sample(f, "process_virtual_memory_bytes", NULL, NULL, 0, (double) ps.vsize_bytes);
        metrics_write_family(f, "process_open_fds", "gauge", "Open file descriptors of vm-manager.");
        metrics_write_sample(
                f, "process_open_fds", NULL, NULL, 0, fds > 0 ? fds - 1 : 0); /* not the one reading */
        if (getrlimit(RLIMIT_NOFILE, &rl) >= 0) {
                metrics_write_family(f, "process_max_fds", "gauge", "File descriptor limit of vm-manager.");
                metrics_write_sample(f, "process_max_fds", NULL, NULL, 0, (double) rl.rlim_cur);
        }
        if (boot_time > 0) {
                metrics_write_family(
                        f, "process_start_time_seconds", "gauge", "When vm-manager started (Unix seconds).");
                metrics_write_sample(
                        f, "process_start_time_seconds", NULL, NULL, 0, boot_time + ps.start_seconds);
        }
}

/* ---- guest families: merged across VMs by metric name, with the union of their label names ----- */

typedef struct GuestFamily {
        const char *name, *family, *type;
        char **labels; /* the union, in order of first appearance */
        size_t n_labels;
        /* the series of this family: (vm, series) */
        struct {
                Vm *vm;
                const GuestSeries *s;
        } * members;
        size_t n_members;
} GuestFamily;

static const char *kind_type(GuestSeriesKind k) {
        return k == GUEST_SERIES_COUNTER ? "counter" : "gauge";
}

/* Finds or adds the family of name; a sorted array with binary search keeps 50 VMs × 1000 series
 * cheap. *fams is kept sorted by inserting in place. */
static GuestFamily *family_get(GuestFamily **fams, size_t *n, size_t *cap, const GuestSeries *s) {
        size_t lo = 0, hi = *n;

        while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                int c = strcmp((*fams)[mid].name, s->name);
                if (c == 0)
                        return &(*fams)[mid];
                if (c < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (*n == *cap) {
                size_t nc = *cap ? *cap * 2 : 64;
                GuestFamily *nf = reallocarray(*fams, nc, sizeof(GuestFamily));
                if (!nf)
                        return NULL;
                *fams = nf;
                *cap = nc;
        }
        memmove(*fams + lo + 1, *fams + lo, (*n - lo) * sizeof(GuestFamily));
        (*fams)[lo] = (GuestFamily){ .name = s->name, .family = s->family, .type = kind_type(s->kind) };
        (*n)++;
        return &(*fams)[lo];
}

static int family_add(GuestFamily *fam, Vm *v, const GuestSeries *s) {
        void *nm;

        for (size_t i = 0; i < s->n_labels; i++) {
                bool found = false;
                for (size_t k = 0; k < fam->n_labels && !found; k++)
                        found = streq(fam->labels[k], s->label_names[i]);
                if (!found) {
                        char **nl = reallocarray(fam->labels, fam->n_labels + 1, sizeof(char *));
                        if (!nl)
                                return -ENOMEM;
                        fam->labels = nl;
                        fam->labels[fam->n_labels++] = s->label_names[i];
                }
        }
        if ((fam->n_members & (fam->n_members - 1)) == 0) { /* grow at powers of two */
                nm = reallocarray(
                        fam->members, fam->n_members ? fam->n_members * 2 : 1, sizeof(fam->members[0]));
                if (!nm)
                        return -ENOMEM;
                fam->members = nm;
        }
        fam->members[fam->n_members].vm = v;
        fam->members[fam->n_members++].s = s;
        return 0;
}

static bool is_bookkeeping(const char *name) {
        return streq(name, "vm_guest_report_age_seconds") || streq(name, "vm_guest_report_series") ||
                streq(name, "vm_guest_reports_total") || streq(name, "vm_guest_report_series_dropped_total");
}

static int write_guest_families(MetricsBuf *f, Manager *m) {
        static const char *const reasons[] = {
                [GUEST_DROP_LIMIT] = "limit", [GUEST_DROP_UNSUPPORTED] = "unsupported", [GUEST_DROP_DUPLICATE] = "duplicate"
        };
        GuestFamily *fams = NULL;
        size_t n = 0, cap = 0;
        usec_t now = now_usec(CLOCK_REALTIME);
        int r = 0;

        for (size_t i = 0; i < m->n_vms && r >= 0; i++) {
                GuestReport *rep = vm_guest(m->vms[i])->report;
                for (size_t k = 0; rep && k < rep->n_series && r >= 0; k++) {
                        GuestFamily *fam;

                        /* the bookkeeping families below are ours */
                        if (is_bookkeeping(rep->series[k].name))
                                continue;
                        fam = family_get(&fams, &n, &cap, &rep->series[k]);
                        r = fam ? family_add(fam, m->vms[i], &rep->series[k]) : -ENOMEM;
                }
        }
        for (size_t i = 0; i < n && r >= 0; i++) {
                GuestFamily *fam = &fams[i];
                size_t nl = fam->n_labels + 1;
                const char **names = calloc(nl, sizeof(char *)), **values = calloc(nl, sizeof(char *));
                _cleanup_free_ char *help = NULL;

                if (!names || !values || asprintf(&help, "Guest systemd-report family %s.", fam->family) < 0) {
                        free(names);
                        free(values);
                        r = -ENOMEM;
                        break;
                }
                names[0] = "vm";
                for (size_t k = 0; k < fam->n_labels; k++)
                        names[k + 1] = fam->labels[k];
                /* a name used as counter by one guest and gauge by another keeps the first type */
                metrics_write_family(f, fam->name, fam->type, help);
                for (size_t j = 0; j < fam->n_members; j++) {
                        const GuestSeries *s = fam->members[j].s;
                        values[0] = vm_id(fam->members[j].vm);
                        for (size_t k = 0; k < fam->n_labels; k++) {
                                values[k + 1] = "";
                                for (size_t q = 0; q < s->n_labels; q++)
                                        if (streq(s->label_names[q], fam->labels[k])) {
                                                values[k + 1] = s->label_values[q];
                                                break;
                                        }
                        }
                        metrics_write_sample(f, fam->name, names, values, nl, s->value);
                }
                free(names);
                free(values);
        }
        for (size_t i = 0; i < n; i++) {
                free(fams[i].labels);
                free(fams[i].members);
        }
        free(fams);
        if (r < 0)
                return r;

        metrics_write_family(
                f, "vm_guest_report_age_seconds", "gauge", "Seconds since the guest's last report upload.");
        for (size_t i = 0; i < m->n_vms; i++) {
                VmGuest *g = vm_guest(m->vms[i]);
                if (g->has_upload)
                        metrics_write_samplel(
                                f,
                                "vm_guest_report_age_seconds",
                                now > g->received_at ? secs(g->received_at, now) : 0,
                                "vm",
                                vm_id(m->vms[i]),
                                NULL);
        }
        metrics_write_family(
                f, "vm_guest_report_series", "gauge", "Series exported from the guest's last report.");
        for (size_t i = 0; i < m->n_vms; i++) {
                VmGuest *g = vm_guest(m->vms[i]);
                if (g->report)
                        metrics_write_samplel(
                                f,
                                "vm_guest_report_series",
                                (double) g->report->n_series,
                                "vm",
                                vm_id(m->vms[i]),
                                NULL);
        }
        metrics_write_family(f, "vm_guest_reports_total", "counter", "Report uploads received from the guest.");
        for (size_t i = 0; i < m->n_vms; i++)
                metrics_write_samplel(
                        f,
                        "vm_guest_reports_total",
                        (double) vm_guest(m->vms[i])->uploads,
                        "vm",
                        vm_id(m->vms[i]),
                        NULL);
        metrics_write_family(
                f,
                "vm_guest_report_series_dropped_total",
                "counter",
                "Report entries not exported, by reason: limit, unsupported, duplicate.");
        for (size_t i = 0; i < m->n_vms; i++)
                for (size_t k = 0; k < _GUEST_DROP_MAX; k++)
                        metrics_write_samplel(
                                f,
                                "vm_guest_report_series_dropped_total",
                                (double) vm_guest(m->vms[i])->dropped[k],
                                "vm",
                                vm_id(m->vms[i]),
                                "reason",
                                reasons[k],
                                NULL);
        return 0;
}

int manager_metrics_text(Manager *m, char **ret, size_t *ret_size) {
        _cleanup_(metrics_buf_done) MetricsBuf b = {};
        int r;

        /* the last scrape's size, so that a big exposition is not built by doubling */
        metrics_buf_reserve(&b, m->metrics_size_hint + m->metrics_size_hint / 8);
        write_build_and_process(&b, m);
        write_host_families(&b, m);
        r = write_guest_families(&b, m);
        if (r >= 0 && b.oom)
                r = -ENOMEM;
        if (r < 0)
                return r;
        m->metrics_size_hint = b.size;
        *ret_size = b.size;
        *ret = TAKE_PTR(b.data);
        return 0;
}
