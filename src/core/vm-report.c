/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The guests' systemd-report uploads (IMDS POST /report): parsed, stored and mapped off the loop on
 * one worker the manager holds, loaded again at start-up, and served raw (GET /vms/{id}/report). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs-util.h"
#include "json-util.h"
#include "log.h"
#include "metrics-guest.h"
#include "vm-internal.h"
#include "worker.h"

/* The worker every VM's reports go through; made on first use. */
struct VmReports {
        Worker *worker;
};

int vm_reports_new(VmReports **ret) {
        VmReports *q = calloc(1, sizeof(VmReports));

        if (!q)
                return -ENOMEM;
        *ret = q;
        return 0;
}

VmReports *vm_reports_free(VmReports *q) {
        if (!q)
                return NULL;
        /* the jobs still queued end here, their done callbacks told they did not run */
        worker_free(q->worker);
        free(q);
        return NULL;
}

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
        VmGuest *g = &v->guest;

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
        j->series_limit = manager_settings(vm_manager(v))->guest_series_limit;
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
        VmGuest *g = &v->guest;
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
        VmGuest *g = &v->guest;
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
        /* The upload's copy and whatever its parse left freed go back to the system (a report
         * replaced frees its predecessor's tree here too): not kept for the next upload. */
        report_job_free(TAKE_PTR(j));
        (void) malloc_trim(0);
}

static int report_submit(Manager *m, ReportJob *j) {
        VmReports *q = manager_reports(m);
        int r;

        if (!q->worker) {
                r = worker_new(
                        manager_event(m),
                        &(WorkerOptions){
                                .name = "vmm-report",
                                .threads = 1,
                                /* every VM's start-up load, and the uploads */
                                .max_jobs = MANAGER_VMS_MAX + VM_REPORT_UPLOADS_MAX,
                                .nice = 10,
                        },
                        &q->worker);
                if (r < 0)
                        return r;
        }
        return worker_submit(q->worker, j, report_run, report_done);
}

static unsigned uploads_in_flight(Manager *m) {
        unsigned n = 0;

        for (size_t i = 0; i < manager_n_vms(m); i++)
                n += manager_vm_at(m, i)->guest.uploading;
        return n;
}

int vm_report_upload_check(Vm *v, uint64_t size, ApiError *reterr) {
        Manager *m = vm_manager(v);
        VmGuest *g = &v->guest;

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
        return 0;
}

int vm_report_upload(Vm *v, const void *body, size_t size, VmReportDone done, void *userdata, ApiError *reterr) {
        _cleanup_(report_job_freep) ReportJob *j = NULL;
        Manager *m = vm_manager(v);
        VmGuest *g = &v->guest;
        int r;

        assert_return(body || size == 0, -EINVAL);
        r = vm_report_upload_check(v, size, reterr);
        if (r < 0)
                return r;

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
                v->guest.loading = false;
                return r;
        }
        TAKE_PTR(j);
        v->guest.load_running = true;
        return 0;
}

/* The stored reports go to the worker one at a time, so that an upload waits behind one of them
 * at most. */
static void report_load_next(Manager *m) {
        for (size_t i = 0; i < manager_n_vms(m); i++)
                if (manager_vm_at(m, i)->guest.load_running)
                        return;
        for (size_t i = 0; i < manager_n_vms(m); i++) {
                VmGuest *g = &manager_vm_at(m, i)->guest;

                if (g->loading && g->uploads > 0)
                        g->loading = false; /* an upload came first: the stored one is older */
                else if (g->loading && report_load_submit(manager_vm_at(m, i)) >= 0)
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
        v->guest.loading = true;
        /* v joins the registry after this: the first load starts here, the others follow from
         * report_done() */
        for (size_t i = 0; i < manager_n_vms(m); i++)
                if (manager_vm_at(m, i)->guest.loading)
                        return;
        (void) report_load_submit(v);
}

int vm_report_open(Vm *v, int *ret_fd, uint64_t *ret_size, ApiError *reterr) {
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int fd = -EBADF;
        struct stat st;

        /* Only an upload this daemon parsed (taken, or mapped again at start-up) is known to be
         * JSON: a file still being mapped, or left by a daemon that stored any bytes, is not. */
        if (!v->guest.has_upload)
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
