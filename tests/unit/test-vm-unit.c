/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "log.h"
#include "time-util.h"
#include "vm-unit.h"

/* The systemd launcher against a real service manager: tests/integration/with-systemd-user.sh starts
 * a private `systemd --user` and points $XDG_RUNTIME_DIR at it. Without one the whole file is skipped.
 * Everything of vm-unit happens on the event loop, which the tests run until a callback said what
 * they wait for. The binary doubles as a helper program run inside units ("io-uring-probe"). */

#ifndef __NR_io_uring_setup
#        define __NR_io_uring_setup 425
#endif

typedef struct Fixture {
        sd_event *event;
        VmUnitManager *manager;
        sd_bus *bus; /* the test's own connection to the manager, made on first use */
        char *dir;   /* scratch directory, removed at the end */
        char *self;  /* this executable, for helper units */
} Fixture;

/* What a unit's callbacks said. */
typedef struct Record {
        unsigned n_started;
        unsigned n_exit;
        int code;
        int status;
        int error;             /* vm_unit_error() at the exit */
        VmUnit **release_unit; /* released from within on_exit, as an owner may do */
} Record;

static void on_started_record(VmUnit *u, void *userdata) {
        Record *x = userdata;

        x->n_started++;
        assert_true(vm_unit_pid(u) > 0);
}

static void on_exit_record(VmUnit *u, int code, int status, void *userdata) {
        Record *x = userdata;

        x->n_exit++;
        x->code = code;
        x->status = status;
        x->error = vm_unit_error(u);
        if (x->release_unit) {
                assert_ptr_equal(*x->release_unit, u);
                *x->release_unit = vm_unit_release(u);
        }
}

/* Runs the loop until *counter reaches n, for at most 10 s. */
static void wait_count(Fixture *f, const unsigned *counter, unsigned n, const char *what) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 10 * USEC_PER_SEC;

        while (*counter < n && now_usec(CLOCK_MONOTONIC) < deadline)
                assert_ok(sd_event_run(f->event, 100 * USEC_PER_MSEC));
        if (*counter < n)
                fail_msg("no %s within 10 s", what);
        assert_int_equal(*counter, n);
}

static void wait_started(Fixture *f, Record *x) {
        wait_count(f, &x->n_started, 1, "start");
        assert_int_equal(x->n_exit, 0);
}

static void wait_exit(Fixture *f, Record *x) {
        wait_count(f, &x->n_exit, 1, "exit");
}

static void run_loop_for(Fixture *f, usec_t usec) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + usec;

        while (now_usec(CLOCK_MONOTONIC) < deadline)
                assert_ok(sd_event_run(f->event, 10 * USEC_PER_MSEC));
}

static VmUnit *start_unit(Fixture *f, const char *name, char **argv, Record *x) {
        VmUnit *u = NULL;

        assert_ok(vm_unit_start(
                &u, f->manager, name, argv, NULL, NULL, false, on_started_record, on_exit_record, x));
        assert_non_null(u);
        assert_int_equal(vm_unit_pid(u), 0); /* nothing is known before the loop ran */
        return u;
}

/* Whether a unit of that name is loaded, asked as an attach does. */
static bool unit_loaded(Fixture *f, const char *name) {
        VmUnit *u = NULL;
        Record x = {};
        bool loaded;

        assert_ok(vm_unit_attach(&u, f->manager, name, 0, on_started_record, on_exit_record, &x));
        while (x.n_started == 0 && x.n_exit == 0)
                assert_ok(sd_event_run(f->event, 100 * USEC_PER_MSEC));
        loaded = x.error != -ESRCH;
        if (!loaded)
                assert_int_equal(x.code, 0);
        vm_unit_free(u);
        return loaded;
}

/* Whether the manager has the unit loaded, asked synchronously on the test's own connection. */
static bool manager_has_unit(Fixture *f, const char *name) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        int r;

        if (!f->bus) {
                _cleanup_free_ char *address = NULL;

                assert_true(asprintf(&address, "unix:path=%s/systemd/private", getenv("XDG_RUNTIME_DIR")) >= 0);
                assert_ok(sd_bus_new(&f->bus));
                assert_ok(sd_bus_set_address(f->bus, address));
                assert_ok(sd_bus_start(f->bus));
        }
        r = sd_bus_call_method(
                f->bus,
                "org.freedesktop.systemd1",
                "/org/freedesktop/systemd1",
                "org.freedesktop.systemd1.Manager",
                "GetUnit",
                &error,
                NULL,
                "s",
                name);
        if (r < 0 && !sd_bus_error_has_name(&error, "org.freedesktop.systemd1.NoSuchUnit"))
                fail_msg("GetUnit %s: %s", name, error.message ?: strerror(-r));
        return r >= 0;
}

/* A stopped and reset unit is collected in the manager's next loop iteration; a release is followed
 * on our loop. */
static void assert_unit_gone(Fixture *f, const char *name) {
        for (unsigned i = 0; i < 250; i++) {
                if (!unit_loaded(f, name))
                        return;
                run_loop_for(f, 20 * USEC_PER_MSEC);
        }
        fail_msg("unit %s is still loaded", name);
}

static bool pid_alive(pid_t pid) {
        char p[64];

        /* The manager reaps its children: a pid that is gone from /proc has ended and been reaped. */
        (void) snprintf(p, sizeof(p), "/proc/%d", (int) pid);
        return access(p, F_OK) >= 0;
}

static void wait_pid_gone(Fixture *f, pid_t pid) {
        for (unsigned i = 0; i < 250 && pid_alive(pid); i++)
                run_loop_for(f, 20 * USEC_PER_MSEC);
        if (pid_alive(pid))
                fail_msg("pid %d still exists", (int) pid);
}

static char *path_join(const char *a, const char *b) {
        char *s;

        assert_true(asprintf(&s, "%s/%s", a, b) >= 0);
        return s;
}

static char *read_file(const char *path) {
        char *s = NULL;

        assert_ok(read_full_file(path, 1 << 20, &s, NULL));
        return s;
}

static void test_manager_unreachable(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *empty = path_join(f->dir, "no-manager");
        _cleanup_free_ char *saved = strdup(getenv("XDG_RUNTIME_DIR") ?: "");
        VmUnitManager *m = NULL;
        const char *reason = NULL;

        assert_ok(mkdir_p(empty, 0700));
        assert_ok(setenv("XDG_RUNTIME_DIR", empty, 1));
        assert_errno(vm_unit_manager_new(&m, f->event, VM_UNIT_SCOPE_USER, &reason), -EHOSTDOWN);
        assert_null(m);
        assert_startswith(reason, "no user service manager at ");
        assert_ok(setenv("XDG_RUNTIME_DIR", saved, 1));

        if (geteuid() == 0 && access("/run/systemd/system", F_OK) < 0) {
                reason = NULL;
                assert_errno(vm_unit_manager_new(&m, f->event, VM_UNIT_SCOPE_SYSTEM, &reason), -EHOSTDOWN);
                assert_string_equal(reason, "running as root but /run/systemd/system does not exist");
        }
}

/* A live unit: pid, cgroup under vm-manager.slice, a duplicate start fails with -EBUSY (on the loop),
 * release stops it. */
static void test_start_duplicate_release(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "sleep", (char *) "30", NULL };
        _cleanup_free_ char *cgroup_path = NULL, *cgroup = NULL;
        VmUnit *u = NULL, *dup = NULL;
        Record x = {}, y = {};
        pid_t pid;

        u = start_unit(f, "vmunit-sleep", argv, &x);
        assert_string_equal(vm_unit_name(u), "vmunit-sleep.service");
        wait_started(f, &x);
        pid = vm_unit_pid(u);
        assert_true(pid > 0);
        assert_true(pid_alive(pid));
        assert_int_equal(vm_unit_error(u), 0);

        assert_true(asprintf(&cgroup_path, "/proc/%d/cgroup", (int) pid) >= 0);
        cgroup = read_file(cgroup_path);
        assert_contains(cgroup, "/vm-manager.slice/vmunit-sleep.service\n");

        /* The name with ".service" is the same unit. */
        dup = start_unit(f, "vmunit-sleep.service", argv, &y);
        wait_exit(f, &y);
        assert_int_equal(y.n_started, 0);
        assert_int_equal(y.error, -EBUSY);
        assert_int_equal(y.code, 0);
        dup = vm_unit_release(dup); /* never started: nothing of the running one is touched */
        run_loop_for(f, 100 * USEC_PER_MSEC);
        assert_true(pid_alive(pid));

        u = vm_unit_release(u);
        assert_null(u);
        wait_pid_gone(f, pid);
        assert_unit_gone(f, "vmunit-sleep");
        assert_int_equal(x.n_exit, 0); /* release does not report */
}

/* Exit code, log file, working directory; the unit stays until released. */
static void test_exit_status_log(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *log_file = path_join(f->dir, "exit.log"), *wd = path_join(f->dir, "wd");
        _cleanup_free_ char *content = NULL, *expected = NULL;
        char *argv[] = {
                (char *) "sh", (char *) "-c", (char *) "sleep 0.5; echo hi; pwd; echo err >&2; exit 3", NULL
        };
        VmUnit *u = NULL;
        Record x = {};
        struct stat st;

        assert_ok(mkdir_p(wd, 0755));
        assert_ok(vm_unit_start(
                &u, f->manager, "vmunit-exit", argv, log_file, wd, false, on_started_record, on_exit_record, &x));
        /* the log file is made at once, with our mode */
        assert_ok(stat(log_file, &st));
        assert_int_equal(st.st_mode & 07777, 0600);
        wait_exit(f, &x);
        assert_int_equal(x.n_started, 1);
        assert_true(vm_unit_pid(u) > 0);
        assert_int_equal(x.error, 0);
        assert_int_equal(x.code, CLD_EXITED);
        assert_int_equal(x.status, 3);
        assert_errno(vm_unit_kill(u, SIGTERM, false), -ESRCH);
        assert_errno(vm_unit_kill(u, SIGKILL, true), -ESRCH);

        content = read_file(log_file);
        assert_true(asprintf(&expected, "hi\n%s\nerr\n", wd) >= 0);
        assert_string_equal(content, expected);

        assert_true(unit_loaded(f, "vmunit-exit")); /* RemainAfterExit */
        u = vm_unit_release(u);
        assert_unit_gone(f, "vmunit-exit");
}

/* SIGTERM through the pidfd; the owner releases from within on_exit. */
static void test_sigterm(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "/bin/sleep", (char *) "30", NULL };
        VmUnit *u = NULL;
        Record x = { .release_unit = &u };

        u = start_unit(f, "vmunit-term", argv, &x);
        wait_started(f, &x);
        assert_ok(vm_unit_kill(u, SIGTERM, /* whole_unit= */ false));
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_KILLED);
        assert_int_equal(x.status, SIGTERM);
        assert_null(u);
        run_loop_for(f, 100 * USEC_PER_MSEC);
        assert_int_equal(x.n_exit, 1);
        assert_unit_gone(f, "vmunit-term");
}

/* whole_unit reaches every process of the unit, not only the main one. */
static void test_kill_whole_unit(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *log_file = path_join(f->dir, "whole.log"), *content = NULL;
        char *argv[] = { (char *) "sh", (char *) "-c", (char *) "sleep 30 & echo $!; wait", NULL };
        VmUnit *u = NULL;
        Record x = {};
        int child = 0;

        assert_ok(vm_unit_start(
                &u, f->manager, "vmunit-whole", argv, log_file, NULL, false, on_started_record, on_exit_record, &x));
        wait_started(f, &x);
        for (unsigned i = 0; i < 250 && child <= 0; i++) {
                free(content);
                content = read_file(log_file);
                child = atoi(content);
                if (child <= 0)
                        run_loop_for(f, 20 * USEC_PER_MSEC);
        }
        assert_true(child > 0);
        assert_true(pid_alive(child));

        assert_ok(vm_unit_kill(u, SIGKILL, /* whole_unit= */ true));
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_KILLED);
        assert_int_equal(x.status, SIGKILL);
        wait_pid_gone(f, child);
        u = vm_unit_release(u);
        assert_unit_gone(f, "vmunit-whole");
}

static int io_uring_errno(Fixture *f, const char *name, bool block) {
        _cleanup_free_ char *log_file = NULL, *content = NULL;
        char *argv[] = { f->self, (char *) "io-uring-probe", NULL };
        VmUnit *u = NULL;
        Record x = {};
        int e = -1;

        log_file = path_join(f->dir, name);
        assert_ok(vm_unit_start(
                &u, f->manager, name, argv, log_file, NULL, block, on_started_record, on_exit_record, &x));
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_EXITED);
        assert_int_equal(x.status, 0);
        u = vm_unit_release(u);

        content = read_file(log_file);
        if (sscanf(content, "io_uring_setup errno=%d", &e) != 1)
                fail_msg("unexpected helper output: '%s'", content);
        return e;
}

/* io_uring_setup(1, NULL) fails with EFAULT when allowed, EPERM under the filter. */
static void test_block_io_uring(void **state) {
        Fixture *f = *state;

        assert_int_equal(io_uring_errno(f, "vmunit-uring-open", false), EFAULT);
        assert_int_equal(io_uring_errno(f, "vmunit-uring-blocked", true), EPERM);
}

/* Detach, the process keeps running, attach by name, kill: the exit is reported. */
static void test_reattach_live(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "sleep", (char *) "30", NULL };
        VmUnit *u = NULL;
        Record x = {}, y = {};
        pid_t pid;

        u = start_unit(f, "vmunit-live", argv, &x);
        wait_started(f, &x);
        pid = vm_unit_pid(u);
        u = vm_unit_free(u);
        run_loop_for(f, 200 * USEC_PER_MSEC);
        assert_true(pid_alive(pid));
        assert_int_equal(x.n_exit, 0);

        assert_ok(vm_unit_attach(&u, f->manager, "vmunit-live", pid, on_started_record, on_exit_record, &y));
        assert_int_equal(vm_unit_pid(u), pid); /* the recorded one, until read */
        wait_started(f, &y);
        assert_int_equal(vm_unit_pid(u), pid);
        assert_ok(vm_unit_kill(u, SIGTERM, false));
        wait_exit(f, &y);
        assert_int_equal(y.code, CLD_KILLED);
        assert_int_equal(y.status, SIGTERM);
        assert_int_equal(x.n_exit, 0);
        u = vm_unit_release(u);
        assert_unit_gone(f, "vmunit-live");
}

/* RemainAfterExit keeps the status of a process that ended while nobody watched. */
static void test_attach_exited(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "sh", (char *) "-c", (char *) "sleep 0.2; exit 7", NULL };
        VmUnit *u = NULL;
        Record x = {}, y = {};
        pid_t pid;

        u = start_unit(f, "vmunit-dead", argv, &x);
        wait_started(f, &x);
        pid = vm_unit_pid(u);
        assert_true(pid > 0);
        u = vm_unit_free(u);
        wait_pid_gone(f, pid);

        assert_ok(vm_unit_attach(&u, f->manager, "vmunit-dead", pid, on_started_record, on_exit_record, &y));
        assert_int_equal(y.n_exit, 0); /* never from within vm_unit_attach() */
        wait_exit(f, &y);
        assert_int_equal(y.n_started, 0);
        assert_int_equal(y.error, 0);
        assert_int_equal(vm_unit_pid(u), pid);
        assert_errno(vm_unit_kill(u, SIGTERM, false), -ESRCH);
        assert_int_equal(y.code, CLD_EXITED);
        assert_int_equal(y.status, 7);
        assert_int_equal(x.n_exit, 0);
        u = vm_unit_release(u);
        assert_unit_gone(f, "vmunit-dead");
}

/* A unit left loaded without a process (RemainAfterExit after a detach) is stopped and reset by the
 * next start of that name, which then succeeds. */
static void test_restart_stale(void **state) {
        Fixture *f = *state;
        /* the sleep lets the start job finish first: a process that fails before systemd reports
         * the exec fails the job itself (-EIO), which is test_exec_failure's case, not this one */
        char *dead[] = { (char *) "sh", (char *) "-c", (char *) "sleep 0.5; exit 5", NULL };
        char *argv[] = { (char *) "sleep", (char *) "30", NULL };
        VmUnit *u = NULL;
        Record w = {}, x = {}, y = {};
        pid_t pid;

        u = start_unit(f, "vmunit-stale", dead, &w);
        wait_started(f, &w);
        pid = vm_unit_pid(u);
        u = vm_unit_free(u);
        wait_pid_gone(f, pid);

        /* Still loaded: attach sees it, with a pid other than the recorded one (debug log only). */
        assert_ok(vm_unit_attach(&u, f->manager, "vmunit-stale", pid + 100000, NULL, on_exit_record, &y));
        wait_exit(f, &y);
        assert_int_equal(y.code, CLD_EXITED);
        assert_int_equal(y.status, 5);
        assert_int_equal(vm_unit_pid(u), pid);
        u = vm_unit_free(u);

        u = start_unit(f, "vmunit-stale", argv, &x);
        wait_started(f, &x);
        assert_true(vm_unit_pid(u) > 0);
        assert_int_not_equal(vm_unit_pid(u), pid);
        assert_ok(vm_unit_kill(u, SIGKILL, /* whole_unit= */ true));
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_KILLED);
        assert_int_equal(x.status, SIGKILL);
        u = vm_unit_release(u);
        assert_unit_gone(f, "vmunit-stale");
}

/* A start right after the release of the same name waits for the release, then succeeds. */
static void test_release_then_start(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "sleep", (char *) "30", NULL };
        VmUnit *u = NULL;
        Record x = {}, y = {};
        pid_t pid;

        u = start_unit(f, "vmunit-again", argv, &x);
        wait_started(f, &x);
        pid = vm_unit_pid(u);
        u = vm_unit_release(u);

        u = start_unit(f, "vmunit-again", argv, &y);
        wait_started(f, &y);
        assert_false(pid_alive(pid));
        assert_int_not_equal(vm_unit_pid(u), pid);
        assert_int_equal(x.n_exit, 0);
        u = vm_unit_release(u);
        assert_unit_gone(f, "vmunit-again");
        assert_int_equal(y.n_exit, 0);
}

/* A release before the start job is done stops what the start makes; no callback is called. */
static void test_release_while_starting(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "sleep", (char *) "30", NULL };
        VmUnit *u = NULL;
        Record x = {};

        u = start_unit(f, "vmunit-early", argv, &x);
        /* the loop in small steps until the manager has the unit (asked on a connection of our
         * own): StartTransientUnit was sent, and its job not yet followed to the end */
        for (unsigned i = 0; i < 5000 && !manager_has_unit(f, "vmunit-early.service"); i++)
                assert_ok(sd_event_run(f->event, USEC_PER_MSEC));
        assert_true(manager_has_unit(f, "vmunit-early.service"));
        assert_int_equal(x.n_started + x.n_exit, 0);
        u = vm_unit_release(u);
        assert_unit_gone(f, "vmunit-early");
        run_loop_for(f, 100 * USEC_PER_MSEC);
        assert_int_equal(x.n_started, 0);
        assert_int_equal(x.n_exit, 0);

        /* released before anything was sent: simply abandoned */
        u = start_unit(f, "vmunit-early", argv, &x);
        u = vm_unit_release(u);
        run_loop_for(f, 100 * USEC_PER_MSEC);
        assert_false(unit_loaded(f, "vmunit-early"));
        assert_int_equal(x.n_started + x.n_exit, 0);
}

/* A unit known by name only (left by an earlier daemon) is stopped and reset. */
static void test_stop_by_name(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "sleep", (char *) "30", NULL };
        VmUnit *u = NULL;
        Record x = {};
        pid_t pid;

        u = start_unit(f, "vmunit-byname", argv, &x);
        wait_started(f, &x);
        pid = vm_unit_pid(u);
        u = vm_unit_free(u);
        assert_ok(vm_unit_stop(f->manager, "vmunit-byname"));
        wait_pid_gone(f, pid);
        assert_unit_gone(f, "vmunit-byname");
        assert_ok(vm_unit_stop(f->manager, "vmunit-never-was")); /* not loaded: nothing to do */
        run_loop_for(f, 100 * USEC_PER_MSEC);
        assert_int_equal(x.n_exit, 0);
}

/* A program that cannot be executed fails the start job (Type=exec): -EIO on the loop. */
static void test_exec_failure(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *bogus = path_join(f->dir, "not-a-program");
        char *argv[] = { bogus, NULL };
        VmUnit *u = NULL;
        Record x = {};
        FILE *file;

        file = fopen(bogus, "we");
        assert_non_null(file);
        fputs("no shebang, no ELF\n", file);
        assert_int_equal(fclose(file), 0);
        assert_ok(chmod(bogus, 0755));

        u = start_unit(f, "vmunit-noexec", argv, &x);
        wait_exit(f, &x);
        assert_int_equal(x.error, -EIO);
        assert_int_equal(x.code, 0);
        assert_int_equal(x.n_started, 0);
        u = vm_unit_release(u);
        assert_unit_gone(f, "vmunit-noexec");
}

static void test_attach_missing(void **state) {
        Fixture *f = *state;
        VmUnit *u = NULL;
        Record x = {};

        assert_ok(vm_unit_attach(
                &u, f->manager, "vmunit-missing", 1234, on_started_record, on_exit_record, &x));
        assert_int_equal(x.n_exit, 0);
        wait_exit(f, &x);
        assert_int_equal(x.error, -ESRCH);
        assert_int_equal(x.code, 0);
        u = vm_unit_free(u);
}

static void test_bad_arguments(void **state) {
        Fixture *f = *state;
        char *missing[] = { (char *) "vm-unit-no-such-program", NULL };
        char *argv[] = { (char *) "true", NULL };
        VmUnit *u = NULL;

        assert_errno(
                vm_unit_start(&u, f->manager, "vmunit-bad", missing, NULL, NULL, false, NULL, NULL, NULL),
                -ENOENT);
        assert_errno(vm_unit_start(&u, f->manager, "", argv, NULL, NULL, false, NULL, NULL, NULL), -EINVAL);
        assert_errno(vm_unit_start(&u, f->manager, "a/b", argv, NULL, NULL, false, NULL, NULL, NULL), -EINVAL);
        assert_null(u);
        assert_false(unit_loaded(f, "vmunit-bad"));
}

static int io_uring_probe(void) {
        long r = syscall(__NR_io_uring_setup, 1, NULL);

        printf("io_uring_setup errno=%d\n", r < 0 ? errno : 0);
        return 0;
}

int main(int argc, char *argv[]) {
        _cleanup_(sd_event_unrefp) sd_event *event = NULL;
        _cleanup_(vm_unit_manager_freep) VmUnitManager *manager = NULL;
        _cleanup_free_ char *self = NULL, *dir = NULL;
        const char *reason = NULL, *base;
        Fixture f;
        int r;

        if (argc > 1 && streq(argv[1], "io-uring-probe"))
                return io_uring_probe();

        if (getenv("VM_MANAGER_TEST_DEBUG"))
                log_set_max_level(LOG_DEBUG);

        r = sd_event_default(&event);
        if (r < 0) {
                fprintf(stderr, "sd_event_default: %s\n", strerror(-r));
                return 1;
        }
        r = vm_unit_manager_new(&manager, event, VM_UNIT_SCOPE_USER, &reason);
        if (r < 0) {
                /* exit 77 is an ERROR for meson 1.0.1's TAP parser: skip in TAP instead. */
                printf("1..0 # SKIP no service manager: %s\n", reason ?: strerror(-r));
                return 0;
        }

        self = realpath("/proc/self/exe", NULL);
        base = getenv("VM_UNIT_TEST_TMPDIR") ?: "/tmp";
        if (!self || asprintf(&dir, "%s/vm-unit-test.XXXXXX", base) < 0 || !mkdtemp(dir)) {
                fprintf(stderr, "setup: %m\n");
                return 1;
        }
        f = (Fixture){ .event = event, .manager = manager, .dir = dir, .self = self };

        const struct CMUnitTest tests[] = {
                cmocka_unit_test_prestate(test_manager_unreachable, &f),
                cmocka_unit_test_prestate(test_start_duplicate_release, &f),
                cmocka_unit_test_prestate(test_exit_status_log, &f),
                cmocka_unit_test_prestate(test_sigterm, &f),
                cmocka_unit_test_prestate(test_kill_whole_unit, &f),
                cmocka_unit_test_prestate(test_block_io_uring, &f),
                cmocka_unit_test_prestate(test_reattach_live, &f),
                cmocka_unit_test_prestate(test_attach_exited, &f),
                cmocka_unit_test_prestate(test_restart_stale, &f),
                cmocka_unit_test_prestate(test_release_then_start, &f),
                cmocka_unit_test_prestate(test_release_while_starting, &f),
                cmocka_unit_test_prestate(test_stop_by_name, &f),
                cmocka_unit_test_prestate(test_exec_failure, &f),
                cmocka_unit_test_prestate(test_attach_missing, &f),
                cmocka_unit_test_prestate(test_bad_arguments, &f),
        };
        r = cmocka_run_group_tests(tests, NULL, NULL);
        f.bus = sd_bus_flush_close_unref(f.bus);
        (void) rm_rf(dir);
        return r;
}
