/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "log.h"
#include "time-util.h"
#include "vm-unit.h"

/* The systemd launcher against a real service manager: tests/integration/test-vm-unit.sh starts a
 * private `systemd --user` and points $XDG_RUNTIME_DIR at it. Without one the whole file is skipped.
 * The binary doubles as a helper program run inside units ("io-uring-probe"). */

#ifndef __NR_io_uring_setup
#        define __NR_io_uring_setup 425
#endif

typedef struct Fixture {
        sd_event *event;
        VmUnitManager *manager;
        char *dir;  /* scratch directory, removed at the end */
        char *self; /* this executable, for helper units */
} Fixture;

typedef struct ExitRecord {
        unsigned n;
        int code;
        int status;
        VmUnit **free_unit; /* freed from within the callback, as an owner may do */
} ExitRecord;

static void on_exit_record(VmUnit *u, int code, int status, void *userdata) {
        ExitRecord *x = userdata;

        x->n++;
        x->code = code;
        x->status = status;
        if (x->free_unit) {
                assert_ptr_equal(*x->free_unit, u);
                *x->free_unit = vm_unit_free(u);
        }
}

/* Runs the loop until the exit was reported, for at most 10 s. */
static void wait_exit(Fixture *f, ExitRecord *x) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 10 * USEC_PER_SEC;

        while (x->n == 0 && now_usec(CLOCK_MONOTONIC) < deadline)
                assert_ok(sd_event_run(f->event, 100 * USEC_PER_MSEC));
        if (x->n == 0)
                fail_msg("no exit reported within 10 s");
        assert_int_equal(x->n, 1);
}

static void run_loop_for(Fixture *f, usec_t usec) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + usec;

        while (now_usec(CLOCK_MONOTONIC) < deadline)
                assert_ok(sd_event_run(f->event, 10 * USEC_PER_MSEC));
}

/* The manager garbage-collects a stopped and reset unit in its next loop iteration. */
static void assert_unit_gone(Fixture *f, const char *name) {
        for (unsigned i = 0; i < 100; i++) {
                VmUnit *u = NULL;
                int r;

                r = vm_unit_attach(&u, f->manager, name, 0, /* on_exit= */ NULL, /* userdata= */ NULL);
                if (r == -ESRCH)
                        return;
                assert_ok(r);
                vm_unit_free(u);
                (void) usleep(20 * USEC_PER_MSEC);
        }
        fail_msg("unit %s is still loaded", name);
}

static bool pid_alive(pid_t pid) {
        char p[64];

        /* The manager reaps its children: a pid that is gone from /proc has ended and been reaped. */
        (void) snprintf(p, sizeof(p), "/proc/%d", (int) pid);
        return access(p, F_OK) >= 0;
}

static void wait_pid_gone(pid_t pid) {
        for (unsigned i = 0; i < 250 && pid_alive(pid); i++)
                (void) usleep(20 * USEC_PER_MSEC);
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

/* A live unit: pid, cgroup under vm-manager.slice, a duplicate start is -EBUSY, release stops it. */
static void test_start_duplicate_release(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "sleep", (char *) "30", NULL };
        _cleanup_free_ char *cgroup_path = NULL, *cgroup = NULL;
        VmUnit *u = NULL, *dup = NULL;
        ExitRecord x = {};
        pid_t pid;

        assert_ok(vm_unit_start(&u, f->manager, "vmunit-sleep", argv, NULL, NULL, false, on_exit_record, &x));
        assert_string_equal(vm_unit_name(u), "vmunit-sleep.service");
        pid = vm_unit_pid(u);
        assert_true(pid > 0);
        assert_true(pid_alive(pid));

        assert_true(asprintf(&cgroup_path, "/proc/%d/cgroup", (int) pid) >= 0);
        cgroup = read_file(cgroup_path);
        assert_contains(cgroup, "/vm-manager.slice/vmunit-sleep.service\n");

        /* The name with ".service" is the same unit. */
        assert_errno(
                vm_unit_start(&dup, f->manager, "vmunit-sleep.service", argv, NULL, NULL, false, NULL, NULL),
                -EBUSY);
        assert_null(dup);
        assert_true(pid_alive(pid));

        u = vm_unit_release(u);
        assert_null(u);
        wait_pid_gone(pid);
        assert_unit_gone(f, "vmunit-sleep");
        run_loop_for(f, 100 * USEC_PER_MSEC);
        assert_int_equal(x.n, 0); /* release does not report */
}

/* Exit code, log file, working directory; the unit is cleaned up after the exit. */
static void test_exit_status_log(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *log_file = path_join(f->dir, "exit.log"), *wd = path_join(f->dir, "wd");
        _cleanup_free_ char *content = NULL, *expected = NULL;
        char *argv[] = {
                (char *) "sh", (char *) "-c", (char *) "sleep 0.5; echo hi; pwd; echo err >&2; exit 3", NULL
        };
        VmUnit *u = NULL;
        ExitRecord x = {};
        struct stat st;

        assert_ok(mkdir_p(wd, 0755));
        assert_ok(vm_unit_start(&u, f->manager, "vmunit-exit", argv, log_file, wd, false, on_exit_record, &x));
        assert_true(vm_unit_pid(u) > 0);
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_EXITED);
        assert_int_equal(x.status, 3);
        assert_errno(vm_unit_kill(u, SIGTERM, false), -ESRCH);
        assert_errno(vm_unit_kill(u, SIGKILL, true), -ESRCH);

        content = read_file(log_file);
        assert_true(asprintf(&expected, "hi\n%s\nerr\n", wd) >= 0);
        assert_string_equal(content, expected);
        assert_ok(stat(log_file, &st));
        assert_int_equal(st.st_mode & 07777, 0600);

        vm_unit_free(u);
        assert_unit_gone(f, "vmunit-exit");
}

static void test_sigterm(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "/bin/sleep", (char *) "30", NULL };
        VmUnit *u = NULL;
        ExitRecord x = { .free_unit = &u };

        assert_ok(vm_unit_start(&u, f->manager, "vmunit-term", argv, NULL, NULL, false, on_exit_record, &x));
        assert_ok(vm_unit_kill(u, SIGTERM, /* whole_unit= */ false));
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_KILLED);
        assert_int_equal(x.status, SIGTERM);
        assert_null(u);
        run_loop_for(f, 100 * USEC_PER_MSEC);
        assert_int_equal(x.n, 1);
        assert_unit_gone(f, "vmunit-term");
}

/* whole_unit reaches every process of the unit, not only the main one. */
static void test_kill_whole_unit(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *log_file = path_join(f->dir, "whole.log"), *content = NULL;
        char *argv[] = { (char *) "sh", (char *) "-c", (char *) "sleep 30 & echo $!; wait", NULL };
        VmUnit *u = NULL;
        ExitRecord x = {};
        int child = 0;

        assert_ok(vm_unit_start(
                &u, f->manager, "vmunit-whole", argv, log_file, NULL, false, on_exit_record, &x));
        for (unsigned i = 0; i < 250 && child <= 0; i++) {
                free(content);
                content = read_file(log_file);
                child = atoi(content);
                if (child <= 0)
                        (void) usleep(20 * USEC_PER_MSEC);
        }
        assert_true(child > 0);
        assert_true(pid_alive(child));

        assert_ok(vm_unit_kill(u, SIGKILL, /* whole_unit= */ true));
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_KILLED);
        assert_int_equal(x.status, SIGKILL);
        wait_pid_gone(child);
        vm_unit_free(u);
        assert_unit_gone(f, "vmunit-whole");
}

static int io_uring_errno(Fixture *f, const char *name, bool block) {
        _cleanup_free_ char *log_file = NULL, *content = NULL;
        char *argv[] = { f->self, (char *) "io-uring-probe", NULL };
        VmUnit *u = NULL;
        ExitRecord x = {};
        int e = -1;

        log_file = path_join(f->dir, name);
        assert_ok(vm_unit_start(&u, f->manager, name, argv, log_file, NULL, block, on_exit_record, &x));
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_EXITED);
        assert_int_equal(x.status, 0);
        vm_unit_free(u);

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
        ExitRecord x = {}, y = {};
        pid_t pid;

        assert_ok(vm_unit_start(&u, f->manager, "vmunit-live", argv, NULL, NULL, false, on_exit_record, &x));
        pid = vm_unit_pid(u);
        u = vm_unit_free(u);
        run_loop_for(f, 200 * USEC_PER_MSEC);
        assert_true(pid_alive(pid));
        assert_int_equal(x.n, 0);

        assert_ok(vm_unit_attach(&u, f->manager, "vmunit-live", pid, on_exit_record, &y));
        assert_int_equal(vm_unit_pid(u), pid);
        assert_ok(vm_unit_kill(u, SIGTERM, false));
        wait_exit(f, &y);
        assert_int_equal(y.code, CLD_KILLED);
        assert_int_equal(y.status, SIGTERM);
        assert_int_equal(x.n, 0);
        vm_unit_free(u);
        assert_unit_gone(f, "vmunit-live");
}

/* RemainAfterExit keeps the status of a process that ended while nobody watched. */
static void test_attach_exited(void **state) {
        Fixture *f = *state;
        char *argv[] = { (char *) "sh", (char *) "-c", (char *) "sleep 0.2; exit 7", NULL };
        VmUnit *u = NULL;
        ExitRecord x = {}, y = {};
        pid_t pid;

        assert_ok(vm_unit_start(&u, f->manager, "vmunit-dead", argv, NULL, NULL, false, on_exit_record, &x));
        pid = vm_unit_pid(u);
        assert_true(pid > 0);
        u = vm_unit_free(u);
        wait_pid_gone(pid);

        assert_ok(vm_unit_attach(&u, f->manager, "vmunit-dead", pid, on_exit_record, &y));
        assert_int_equal(y.n, 0); /* never from within vm_unit_attach() */
        assert_int_equal(vm_unit_pid(u), pid);
        assert_errno(vm_unit_kill(u, SIGTERM, false), -ESRCH);
        wait_exit(f, &y);
        assert_int_equal(y.code, CLD_EXITED);
        assert_int_equal(y.status, 7);
        assert_int_equal(x.n, 0);
        vm_unit_free(u);
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
        ExitRecord x = {};
        pid_t pid;

        assert_ok(vm_unit_start(&u, f->manager, "vmunit-stale", dead, NULL, NULL, false, NULL, NULL));
        pid = vm_unit_pid(u);
        u = vm_unit_free(u);
        wait_pid_gone(pid);

        /* Still loaded: attach sees it, with a pid other than the recorded one (debug log only). */
        assert_ok(vm_unit_attach(&u, f->manager, "vmunit-stale", pid + 100000, NULL, NULL));
        assert_int_equal(vm_unit_pid(u), pid);
        u = vm_unit_free(u);

        assert_ok(vm_unit_start(&u, f->manager, "vmunit-stale", argv, NULL, NULL, false, on_exit_record, &x));
        assert_true(vm_unit_pid(u) > 0);
        assert_int_not_equal(vm_unit_pid(u), pid);
        assert_ok(vm_unit_kill(u, SIGKILL, /* whole_unit= */ true));
        wait_exit(f, &x);
        assert_int_equal(x.code, CLD_KILLED);
        assert_int_equal(x.status, SIGKILL);
        vm_unit_free(u);
        assert_unit_gone(f, "vmunit-stale");
}

/* A program that cannot be executed fails the start job (Type=exec): an error, and no unit left. */
static void test_exec_failure(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *bogus = path_join(f->dir, "not-a-program");
        char *argv[] = { bogus, NULL };
        VmUnit *u = NULL;
        FILE *file;

        file = fopen(bogus, "we");
        assert_non_null(file);
        fputs("no shebang, no ELF\n", file);
        assert_int_equal(fclose(file), 0);
        assert_ok(chmod(bogus, 0755));

        assert_errno(vm_unit_start(&u, f->manager, "vmunit-noexec", argv, NULL, NULL, false, NULL, NULL), -EIO);
        assert_null(u);
        assert_unit_gone(f, "vmunit-noexec");
}

static void test_attach_missing(void **state) {
        Fixture *f = *state;
        VmUnit *u = NULL;

        assert_errno(vm_unit_attach(&u, f->manager, "vmunit-missing", 1234, on_exit_record, NULL), -ESRCH);
        assert_null(u);
}

static void test_bad_arguments(void **state) {
        Fixture *f = *state;
        char *missing[] = { (char *) "vm-unit-no-such-program", NULL };
        char *argv[] = { (char *) "true", NULL };
        VmUnit *u = NULL;

        assert_errno(
                vm_unit_start(&u, f->manager, "vmunit-bad", missing, NULL, NULL, false, NULL, NULL), -ENOENT);
        assert_errno(vm_unit_start(&u, f->manager, "", argv, NULL, NULL, false, NULL, NULL), -EINVAL);
        assert_errno(vm_unit_start(&u, f->manager, "a/b", argv, NULL, NULL, false, NULL, NULL), -EINVAL);
        assert_null(u);
        assert_unit_gone(f, "vmunit-bad");
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
                cmocka_unit_test_prestate(test_exec_failure, &f),
                cmocka_unit_test_prestate(test_attach_missing, &f),
                cmocka_unit_test_prestate(test_bad_arguments, &f),
        };
        r = cmocka_run_group_tests(tests, NULL, NULL);
        (void) rm_rf(dir);
        return r;
}
