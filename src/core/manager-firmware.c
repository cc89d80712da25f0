/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The daemon's side of firmware runs (manager-firmware.h): the cache, the queue, the helper as a
 * child event with a time limit. Nothing here waits for the run. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs-util.h"
#include "host-probe.h"
#include "json-util.h"
#include "list.h"
#include "log.h"
#include "manager-firmware.h"
#include "manager.h"
#include "time-util.h"
#include "vm-process.h"

/* A cache entry is a few KiB; the helper's log a few lines. */
#define CACHE_MAX ((size_t) 256 << 10)
#define RUN_LOG_MAX ((size_t) 64 << 10)

typedef enum RunState {
        RUN_NONE, /* looked up, but no run was asked for yet (and none is cached) */
        RUN_QUEUED,
        RUN_RUNNING,
        RUN_KNOWN,
        RUN_FAILED,
} RunState;

static const char *const run_state_table[] = {
        [RUN_NONE] = "none",   [RUN_QUEUED] = "queued", [RUN_RUNNING] = "running",
        [RUN_KNOWN] = "known", [RUN_FAILED] = "failed",
};

typedef struct FirmwareEntry FirmwareEntry;

struct FirmwareWait {
        FirmwareEntry *entry; /* NULL once woken, or once the entry is gone */
        FirmwareWait *prev, *next;
        sd_event_source *timer;
        FirmwareWaitDone done;
        void *userdata;
};

struct FirmwareEntry {
        FirmwareRuns *runs;
        uint64_t memory_mib;
        unsigned cpus;
        RunState state;
        AttestFirmwareExpect expect; /* RUN_KNOWN */
        char *error;                 /* RUN_FAILED (NULL only when out of memory) */
        char *ran_at, *kernel;       /* RUN_KNOWN, from the cache entry */
        double seconds;
        usec_t started; /* CLOCK_MONOTONIC, RUN_RUNNING */
        VmProcess *helper;
        sd_event_source *timer;
        char *why;           /* the text firmware_runs_lookup() returns, kept for its borrowed result */
        FirmwareWait *waits; /* those waiting for this run to end (quotes held by the IMDS) */
};

struct FirmwareRuns {
        Manager *manager;
        bool enabled;
        char *disabled_why; /* why no run can be made on this host; NULL when one can */
        char *dir;          /* <state>/firmware */
        const char *sha256; /* the host probe's (borrowed) */
        const char *accel;  /* "kvm" or "tcg" */
        FirmwareEntry *entries[FIRMWARE_RUNS_MAX];
        size_t n;
};

static void wait_unlink(FirmwareWait *w) {
        if (!w->entry)
                return;
        LIST_REMOVE(w->entry->waits, w);
        w->entry = NULL;
        w->timer = sd_event_source_disable_unref(w->timer);
}

FirmwareWait *firmware_wait_free(FirmwareWait *w) {
        if (!w)
                return NULL;
        wait_unlink(w);
        free(w);
        return NULL;
}

/* Calls each waiter once; a callee may free its wait, or add a new one (it then waits for a run
 * that is not this one's end), so each is unlinked before its call. */
static void entry_wake(FirmwareEntry *e, int r) {
        while (e->waits) {
                FirmwareWait *w = e->waits;

                wait_unlink(w);
                w->done(r, w->userdata);
        }
}

static void entry_free(FirmwareEntry *e) {
        if (!e)
                return;
        /* the waiters own their waits; they are only told nothing will come */
        while (e->waits)
                wait_unlink(e->waits);
        vm_process_free(e->helper);
        sd_event_source_disable_unref(e->timer);
        attest_firmware_expect_done(&e->expect);
        free(e->error);
        free(e->ran_at);
        free(e->kernel);
        free(e->why);
        free(e);
}

FirmwareRuns *firmware_runs_free(FirmwareRuns *f) {
        if (!f)
                return NULL;
        for (size_t i = 0; i < f->n; i++)
                entry_free(f->entries[i]);
        free(f->disabled_why);
        free(f->dir);
        free(f);
        return NULL;
}

static char *entry_path(const FirmwareEntry *e, const char *suffix) {
        const FirmwareRuns *f = e->runs;
        char *p = NULL;

        if (asprintf(&p, "%s/%s-%" PRIu64 "m-%uc-%s%s", f->dir, f->sha256, e->memory_mib, e->cpus, f->accel, suffix) <
            0)
                return NULL;
        return p;
}

static void set_why(FirmwareEntry *e, const char *format, ...) _printf_(2, 3);
static void set_why(FirmwareEntry *e, const char *format, ...) {
        va_list ap;
        char *s = NULL;

        va_start(ap, format);
        if (vasprintf(&s, format, ap) < 0)
                s = NULL;
        va_end(ap);
        free(e->why);
        e->why = s;
}

/* Loads the cache entry of e; 0 when it is there and for e's key, -ENOENT when absent, another
 * error when it does not load (then a new run replaces it). Small: read on the loop. */
static int entry_load(FirmwareEntry *e) {
        _cleanup_free_ char *path = entry_path(e, ".json"), *text = NULL;
        _cleanup_(attest_firmware_expect_done) AttestFirmwareExpect fw = {};
        json_auto_t *o = NULL;
        json_t *ran, *kernel, *seconds;
        int r;

        if (!path)
                return -ENOMEM;
        r = read_full_file(path, CACHE_MAX, &text, NULL);
        if (r < 0)
                return r;
        o = json_loads(text, 0, NULL);
        if (!o || !json_is_string(json_object_get(o, "firmwareSha256")) ||
            !streq(json_string_value(json_object_get(o, "firmwareSha256")), e->runs->sha256) ||
            json_integer_value(json_object_get(o, "memoryMiB")) != (json_int_t) e->memory_mib ||
            json_integer_value(json_object_get(o, "cpus")) != (json_int_t) e->cpus)
                return -EBADMSG;
        r = attest_firmware_expect_from_json(json_object_get(o, "pcrs"), &fw);
        if (r < 0)
                return r;
        ran = json_object_get(o, "ranAt");
        kernel = json_object_get(o, "kernel");
        seconds = json_object_get(o, "seconds");
        free(e->ran_at);
        free(e->kernel);
        e->ran_at = json_is_string(ran) ? strdup(json_string_value(ran)) : NULL;
        e->kernel = json_is_string(kernel) ? strdup(json_string_value(kernel)) : NULL;
        e->seconds = json_is_number(seconds) ? json_number_value(seconds) : 0;
        attest_firmware_expect_done(&e->expect);
        e->expect = fw;
        fw = (AttestFirmwareExpect){};
        e->state = RUN_KNOWN;
        manager_firmware_pcr7(e->runs->manager, &e->expect.pcr[7]);
        return 0;
}

static void runs_next(FirmwareRuns *f);

static void entry_finish(FirmwareEntry *e, const char *error) {
        e->helper = vm_process_free(e->helper);
        e->timer = sd_event_source_disable_unref(e->timer);
        if (!error && entry_load(e) < 0)
                error = "the run ended, but its result does not load";
        if (error) {
                free(e->error);
                e->error = strdup(error);
                e->state = RUN_FAILED;
                log_warning(
                        "Firmware run for %" PRIu64
                        " MiB, %u CPUs failed: %s. PCRs 0, 2, 3, 6 of such VMs are "
                        "compared with golden values.",
                        e->memory_mib,
                        e->cpus,
                        error);
        } else
                log_info(
                        "Firmware run for %" PRIu64
                        " MiB, %u CPUs done in %.1f s: PCRs 0, 2, 3, 6 are expected "
                        "from it.",
                        e->memory_mib,
                        e->cpus,
                        e->seconds);
        runs_next(e->runs);
        entry_wake(e, 0);
}

/* The helper's last line on stderr says why it failed. */
static char *last_log_line(FirmwareEntry *e) {
        _cleanup_free_ char *path = entry_path(e, ".log"), *text = NULL;
        char *end, *line;

        if (!path || read_full_file(path, RUN_LOG_MAX, &text, NULL) < 0)
                return NULL;
        end = text + strlen(text);
        while (end > text && (end[-1] == '\n' || end[-1] == '\r'))
                *--end = 0;
        line = strrchr(text, '\n');
        return strdup(line ? line + 1 : text);
}

static void on_helper_exit(VmProcess *p, int code, int status, void *userdata) {
        FirmwareEntry *e = userdata;
        _cleanup_free_ char *line = NULL, *how = NULL, *msg = NULL;

        if (code == CLD_EXITED && status == 0) {
                entry_finish(e, NULL);
                return;
        }
        if (vm_process_error(p) < 0)
                asprintf_or_null(&msg, "the helper did not start: %s", strerror(-vm_process_error(p)));
        else {
                line = last_log_line(e);
                how = vm_exit_status_to_string(code, status);
                asprintf_or_null(&msg, "%s (%s)", line ?: "the helper failed", how ?: "?");
        }
        entry_finish(e, msg ?: "the helper failed");
}

static int on_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        FirmwareEntry *e = userdata;
        char msg[64];

        (void) snprintf(msg, sizeof(msg), "it did not finish within %u s", FIRMWARE_RUN_TIMEOUT_SEC);
        entry_finish(e, msg);
        return 0;
}

static int entry_start(FirmwareEntry *e) {
        FirmwareRuns *f = e->runs;
        Manager *m = f->manager;
        const ManagerSettings *st = manager_settings(m);
        _cleanup_free_ char *out = entry_path(e, ".json"), *log = entry_path(e, ".log");
        char mem[32], cpus[16];
        int r;

        if (!out || !log)
                return -ENOMEM;
        (void) snprintf(mem, sizeof(mem), "%" PRIu64, e->memory_mib);
        (void) snprintf(cpus, sizeof(cpus), "%u", e->cpus);
        char *argv[] = {
                (char *) "vm-manager",
                (char *) "firmware-run",
                out,
                (char *) st->ovmf_code,
                (char *) st->ovmf_vars,
                mem,
                cpus,
                (char *) f->accel,
                (char *) f->sha256,
                (char *) manager_image_dir(m),
                NULL,
        };

        (void) unlink(log);
        r = vm_process_spawn(
                &e->helper,
                manager_spawner(m),
                &(VmProcessOptions){ .argv = argv, .exec_fd = st->self_exe_fd, .log_file = log },
                on_helper_exit,
                e);
        if (r < 0)
                return r;
        r = sd_event_add_time_relative(
                manager_event(m),
                &e->timer,
                CLOCK_MONOTONIC,
                FIRMWARE_RUN_TIMEOUT_USEC,
                USEC_PER_SEC,
                on_timeout,
                e);
        if (r < 0) {
                e->helper = vm_process_free(e->helper);
                return r;
        }
        e->state = RUN_RUNNING;
        e->started = now_usec(CLOCK_MONOTONIC);
        log_info(
                "Firmware run for %" PRIu64
                " MiB, %u CPUs started: learning what this host's OVMF measures into "
                "PCRs 0-6 (about half a minute under TCG).",
                e->memory_mib,
                e->cpus);
        return 0;
}

/* One run at a time: the next queued one starts when the last ended. */
static void runs_next(FirmwareRuns *f) {
        for (size_t i = 0; i < f->n; i++)
                if (f->entries[i]->state == RUN_RUNNING)
                        return;
        for (size_t i = 0; i < f->n; i++) {
                FirmwareEntry *e = f->entries[i];
                int r;

                if (e->state != RUN_QUEUED)
                        continue;
                r = entry_start(e);
                if (r >= 0)
                        return;
                free(e->error);
                e->error = NULL;
                asprintf_or_null(&e->error, "cannot start the helper: %s", strerror(-r));
                e->state = RUN_FAILED;
        }
}

int firmware_runs_new(Manager *m, bool enabled, FirmwareRuns **ret) {
        _cleanup_(firmware_runs_freep) FirmwareRuns *f = NULL;
        HostProbe *h = manager_host(m);

        assert_return(m && ret, -EINVAL);

        f = calloc(1, sizeof(FirmwareRuns));
        if (!f)
                return -ENOMEM;
        f->manager = m;
        f->enabled = enabled;
        f->sha256 = host_probe_firmware_sha256(h);
        f->accel = host_probe_accel(h, NULL) == HOST_ACCEL_KVM ? "kvm" : "tcg";
        if (asprintf(&f->dir, "%s/firmware", manager_state_dir(m)) < 0) {
                f->dir = NULL;
                return -ENOMEM;
        }
        if (!f->sha256)
                f->disabled_why = strdup("the OVMF code image could not be read at start-up");
        else if (manager_settings(m)->self_exe_fd < 0)
                f->disabled_why = strdup("the daemon has no handle on its own executable");
        else if (mkdir_p(f->dir, 0755) < 0)
                asprintf_or_null(&f->disabled_why, "cannot make %s", f->dir);
        *ret = TAKE_PTR(f);
        return 0;
}

static FirmwareEntry *entry_find(FirmwareRuns *f, uint64_t memory_mib, unsigned cpus) {
        for (size_t i = 0; i < f->n; i++)
                if (f->entries[i]->memory_mib == memory_mib && f->entries[i]->cpus == cpus)
                        return f->entries[i];
        return NULL;
}

const AttestFirmwareExpect *firmware_runs_lookup(
        FirmwareRuns *f, uint64_t memory_mib, unsigned cpus, bool start, const char **ret_why, bool *ret_pending) {
        FirmwareEntry *e;
        int r;

        assert(f && ret_why && ret_pending);

        *ret_why = NULL;
        *ret_pending = false;
        if (!f->sha256) {
                *ret_why = f->disabled_why;
                return NULL;
        }
        e = entry_find(f, memory_mib, cpus);
        if (!e) {
                if (f->n >= FIRMWARE_RUNS_MAX) {
                        *ret_why = "too many VM shapes (memory size, CPU count) for firmware runs";
                        return NULL;
                }
                e = calloc(1, sizeof(FirmwareEntry));
                if (!e) {
                        *ret_why = "out of memory";
                        return NULL;
                }
                *e = (FirmwareEntry){ .runs = f, .memory_mib = memory_mib, .cpus = cpus, .state = RUN_NONE };
                f->entries[f->n++] = e;
                r = entry_load(e);
                if (r < 0 && r != -ENOENT)
                        log_notice_errno(
                                r,
                                "Firmware run cache for %" PRIu64 " MiB, %u CPUs does not load, ignoring: %m",
                                memory_mib,
                                cpus);
                if (r < 0)
                        e->state = RUN_NONE; /* not run yet: a failure only once a run was asked for */
        }

        switch (e->state) {
        case RUN_KNOWN:
                return &e->expect;
        case RUN_QUEUED:
                *ret_pending = true;
                set_why(e, "the firmware run for %" PRIu64 " MiB, %u CPUs is queued", memory_mib, cpus);
                break;
        case RUN_RUNNING:
                *ret_pending = true;
                set_why(e,
                        "the firmware run for %" PRIu64 " MiB, %u CPUs is still going (started %" PRIu64
                        " s ago); quote again once it is done",
                        memory_mib,
                        cpus,
                        (now_usec(CLOCK_MONOTONIC) - e->started) / USEC_PER_SEC);
                break;
        case RUN_FAILED:
                set_why(e,
                        "the firmware run for %" PRIu64
                        " MiB, %u CPUs failed: %s; pin the firmware with "
                        "`vm-manager image golden`",
                        memory_mib,
                        cpus,
                        e->error ?: "out of memory");
                break;
        case RUN_NONE:
                if (!f->enabled || f->disabled_why) {
                        set_why(e,
                                "no firmware run for %" PRIu64 " MiB, %u CPUs: %s",
                                memory_mib,
                                cpus,
                                f->disabled_why ?: "firmware runs are off (--firmware-run=false)");
                        break;
                }
                if (!start) {
                        set_why(e, "no firmware run for %" PRIu64 " MiB, %u CPUs was made", memory_mib, cpus);
                        break;
                }
                e->state = RUN_QUEUED;
                runs_next(f);
                *ret_pending = e->state == RUN_QUEUED || e->state == RUN_RUNNING;
                if (e->state == RUN_FAILED)
                        set_why(e,
                                "the firmware run for %" PRIu64 " MiB, %u CPUs failed: %s",
                                memory_mib,
                                cpus,
                                e->error ?: "?");
                else
                        set_why(e,
                                "the firmware run for %" PRIu64 " MiB, %u CPUs is under way",
                                memory_mib,
                                cpus);
                break;
        }
        *ret_why = e->why ?: "out of memory";
        return NULL;
}

static int on_wait_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        FirmwareWait *w = userdata;

        wait_unlink(w);
        w->done(-ETIMEDOUT, w->userdata);
        return 0;
}

int firmware_runs_wait(
        FirmwareRuns *f,
        uint64_t memory_mib,
        unsigned cpus,
        FirmwareWaitDone done,
        void *userdata,
        FirmwareWait **ret) {
        _cleanup_(firmware_wait_freep) FirmwareWait *w = NULL;
        FirmwareEntry *e;
        int r;

        assert_return(f && done && ret, -EINVAL);

        e = entry_find(f, memory_mib, cpus);
        if (!e || !IN_SET(e->state, RUN_QUEUED, RUN_RUNNING))
                return 0;
        w = calloc(1, sizeof(FirmwareWait));
        if (!w)
                return -ENOMEM;
        *w = (FirmwareWait){ .done = done, .userdata = userdata };
        r = sd_event_add_time_relative(
                manager_event(f->manager),
                &w->timer,
                CLOCK_MONOTONIC,
                FIRMWARE_RUN_TIMEOUT_USEC,
                USEC_PER_SEC,
                on_wait_timeout,
                w);
        if (r < 0)
                return r;
        w->entry = e;
        LIST_PREPEND(e->waits, w);
        *ret = TAKE_PTR(w);
        return 1;
}

json_t *firmware_runs_to_json(FirmwareRuns *f) {
        json_auto_t *o = NULL;
        json_t *runs;

        assert_return(f, NULL);

        o = json_pack("{s:b,s:s}", "enabled", f->enabled && !f->disabled_why, "cacheDir", f->dir);
        if (!o)
                return NULL;
        if (f->disabled_why && json_object_set_new(o, "error", json_string(f->disabled_why)) < 0)
                return NULL;
        runs = json_array();
        if (!runs || json_object_set_new(o, "runs", runs) < 0)
                return NULL;
        for (size_t i = 0; i < f->n; i++) {
                const FirmwareEntry *e = f->entries[i];
                json_t *r;

                /* a shape looked up but never run nor asked to run is not a run */
                if (e->state == RUN_NONE)
                        continue;
                r = json_pack(
                        "{s:I,s:I,s:s,s:s}",
                        "memoryMiB",
                        (json_int_t) e->memory_mib,
                        "cpus",
                        (json_int_t) e->cpus,
                        "accel",
                        f->accel,
                        "state",
                        run_state_table[e->state]);
                if (!r || json_array_append_new(runs, r) < 0)
                        return NULL;
                if (e->state == RUN_KNOWN &&
                    (json_object_set_new(r, "pcrs", json_pack("[iiii]", 0, 2, 3, 6)) < 0 ||
                     json_object_set_new(r, "seconds", json_real(e->seconds)) < 0 ||
                     (e->ran_at && json_object_set_new(r, "ranAt", json_string(e->ran_at)) < 0) ||
                     (e->kernel && json_object_set_new(r, "kernel", json_string(e->kernel)) < 0)))
                        return NULL;
                if (e->state == RUN_FAILED && json_object_set_new(r, "error", json_string(e->error ?: "?")) < 0)
                        return NULL;
        }
        return TAKE_PTR(o);
}
