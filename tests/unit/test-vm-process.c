/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "time-util.h"
#include "vm-process.h"

/* vm_process_spawn against real programs: the clone happens on the spawner's thread and the pid comes
 * back as an event; what keeps a child from exec() reaches the loop as its errno (no exit status 127
 * to guess from), without the spawn waiting for it; a file run through its descriptor runs even once
 * its path is gone, and the stdin/stdout descriptors reach the program, even closed by the caller
 * before the clone. */

typedef struct Exit {
        bool exited, started;
        int code, status;
} Exit;

static void on_exit_cb(VmProcess *p, int code, int status, void *userdata) {
        Exit *x = userdata;

        x->exited = true;
        x->code = code;
        x->status = status;
}

static void on_started_cb(VmProcess *p, void *userdata) {
        Exit *x = userdata;

        assert_false(x->exited);
        assert_true(vm_process_pid(p) > 0);
        x->started = true;
}

static int on_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        fail_msg("the child did not exit within 30 s");
        return 0;
}

/* Runs the loop until x says the child exited, or started. */
static void wait_for(sd_event *e, const bool *flag) {
        _cleanup_(sd_event_source_unrefp) sd_event_source *timeout = NULL;

        assert_ok(sd_event_add_time_relative(
                e, &timeout, CLOCK_MONOTONIC, 30 * USEC_PER_SEC, 0, on_timeout, NULL));
        while (!*flag)
                assert_ok(sd_event_run(e, UINT64_MAX));
}

static void wait_exit(sd_event *e, Exit *x) {
        wait_for(e, &x->exited);
}

static int setup(void **state) {
        sigset_t mask;

        /* as the daemon does: child sources need SIGCHLD blocked */
        sigemptyset(&mask);
        sigaddset(&mask, SIGCHLD);
        assert_ok(sigprocmask(SIG_BLOCK, &mask, NULL));
        return 0;
}

/* Spawns argv (with working_dir, exec_fd) and runs the loop until the child is gone: it never got to
 * its program, and vm_process_error() says why. */
static int spawn_error(sd_event *e, VmSpawner *s, char **argv, const char *working_dir, int exec_fd) {
        _cleanup_(vm_process_freep) VmProcess *p = NULL;
        Exit x = {};

        assert_ok(vm_process_spawn(
                &p,
                s,
                &(VmProcessOptions){ .argv = argv, .working_dir = working_dir, .exec_fd = exec_fd },
                on_exit_cb,
                &x));
        vm_process_set_started(p, on_started_cb);
        /* not known yet: nothing waited for the clone, nor for the child */
        assert_int_equal(vm_process_pid(p), 0);
        assert_int_equal(vm_process_error(p), 0);
        assert_true(vm_process_running(p));
        wait_exit(e, &x);
        assert_true(x.started);
        assert_true(vm_process_pid(p) > 0);
        /* not an exit: no status 127 to guess from */
        assert_int_equal(x.code, 0);
        assert_int_equal(x.status, 0);
        assert_false(vm_process_running(p));
        return vm_process_error(p);
}

static void test_exec_errors(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(vm_spawner_freep) VmSpawner *s = NULL;
        _cleanup_close_ int data = -EBADF;
        char path[] = "/tmp/test-vm-process-XXXXXX";
        int fd;

        assert_ok(sd_event_new(&e));
        assert_ok(vm_spawner_new(e, &s));
        assert_errno(spawn_error(e, s, (char *[]){ (char *) "/nonexistent/program", NULL }, NULL, 0), -ENOENT);
        assert_errno(
                spawn_error(e, s, (char *[]){ (char *) "no-such-program-on-path", NULL }, NULL, 0), -ENOENT);
        assert_errno(spawn_error(e, s, (char *[]){ (char *) "true", NULL }, "/nonexistent/dir", 0), -ENOENT);

        /* a descriptor of a file that is not executable */
        fd = mkostemp(path, O_CLOEXEC);
        assert_true(fd >= 0);
        (void) close(fd);
        data = open(path, O_PATH | O_CLOEXEC);
        assert_true(data >= 0);
        (void) unlink(path);
        assert_errno(spawn_error(e, s, (char *[]){ (char *) "data", NULL }, NULL, data), -EACCES);

        /* nothing left behind: every child reaped */
        assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
        assert_int_equal(errno, ECHILD);
}

/* Runs the loop until every child is reaped (looked at, not reaped here: WNOWAIT). */
static void wait_reaped(sd_event *e) {
        for (int i = 0; i < 100 && waitid(P_ALL, 0, &(siginfo_t){}, WEXITED | WNOHANG | WNOWAIT) >= 0; i++)
                assert_ok(sd_event_run(e, 100 * USEC_PER_MSEC));
        assert_int_equal(waitid(P_ALL, 0, &(siginfo_t){}, WEXITED | WNOHANG | WNOWAIT), -1);
        assert_int_equal(errno, ECHILD);
}

/* A process freed before its pid came back (the spawner's thread has it, or is about to): killed
 * once it exists, reaped from the loop, no callback. */
static void test_free_before_pid(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(vm_spawner_freep) VmSpawner *s = NULL;
        VmProcess *p = NULL;
        Exit x = {};

        assert_ok(sd_event_new(&e));
        assert_ok(vm_spawner_new(e, &s));
        assert_ok(vm_process_spawn(
                &p,
                s,
                &(VmProcessOptions){ .argv = (char *[]){ (char *) "sleep", (char *) "10", NULL } },
                on_exit_cb,
                &x));
        vm_process_set_started(p, on_started_cb);
        p = vm_process_free(p);
        /* the spawner's answer comes, then the child's exit after our SIGKILL */
        for (int i = 0; i < 20; i++)
                assert_ok(sd_event_run(e, 100 * USEC_PER_MSEC));
        wait_reaped(e);
        assert_false(x.started);
        assert_false(x.exited);
}

/* A process freed once it runs, before its exec() report was read: killed, reaped from the loop, no
 * callback. */
static void test_free_before_report(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(vm_spawner_freep) VmSpawner *s = NULL;
        VmProcess *p = NULL;
        Exit x = {};

        assert_ok(sd_event_new(&e));
        assert_ok(vm_spawner_new(e, &s));
        assert_ok(vm_process_spawn(
                &p,
                s,
                &(VmProcessOptions){ .argv = (char *[]){ (char *) "sleep", (char *) "10", NULL } },
                on_exit_cb,
                &x));
        vm_process_set_started(p, on_started_cb);
        wait_for(e, &x.started);
        p = vm_process_free(p);
        wait_reaped(e);
        assert_false(x.exited);
}

/* A signal sent before the pid is known reaches the child once it exists. */
static void test_kill_before_pid(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(vm_spawner_freep) VmSpawner *s = NULL;
        _cleanup_(vm_process_freep) VmProcess *p = NULL;
        Exit x = {};

        assert_ok(sd_event_new(&e));
        assert_ok(vm_spawner_new(e, &s));
        assert_ok(vm_process_spawn(
                &p,
                s,
                &(VmProcessOptions){ .argv = (char *[]){ (char *) "sleep", (char *) "10", NULL } },
                on_exit_cb,
                &x));
        assert_ok(vm_process_kill(p, SIGKILL));
        assert_ok(vm_process_kill(p, SIGTERM)); /* does not undo the SIGKILL */
        wait_exit(e, &x);
        assert_int_equal(x.code, CLD_KILLED);
        assert_int_equal(x.status, SIGKILL);
        assert_int_equal(vm_process_error(p), 0);
        assert_errno(vm_process_kill(p, SIGTERM), -ESRCH);
}

/* A spawner freed with a spawn it never made: that spawn fails (-ESHUTDOWN) through on_exit. Its
 * children still running get their parent-death signal as its thread ends. */
static void test_spawner_free(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(vm_spawner_freep) VmSpawner *s = NULL;
        _cleanup_(vm_process_freep) VmProcess *running = NULL, *queued = NULL;
        Exit xr = {}, xq = {};

        assert_ok(sd_event_new(&e));
        assert_ok(vm_spawner_new(e, &s));
        assert_ok(vm_process_spawn(
                &running,
                s,
                &(VmProcessOptions){ .argv = (char *[]){ (char *) "sleep", (char *) "10", NULL } },
                on_exit_cb,
                &xr));
        vm_process_set_started(running, on_started_cb);
        wait_for(e, &xr.started);

        assert_ok(vm_process_spawn(
                &queued,
                s,
                &(VmProcessOptions){ .argv = (char *[]){ (char *) "sleep", (char *) "10", NULL } },
                on_exit_cb,
                &xq));
        s = vm_spawner_free(s);
        /* made meanwhile, or not: either it failed, or it dies with the thread */
        wait_exit(e, &xq);
        if (xq.code == 0)
                assert_errno(vm_process_error(queued), -ESHUTDOWN);
        else
                assert_int_equal(xq.status, SIGKILL);
        wait_exit(e, &xr);
        assert_int_equal(xr.code, CLD_KILLED);
        assert_int_equal(xr.status, SIGKILL);
}

/* A copy of /bin/sh, opened and deleted before it runs: what a rebuild does to the daemon's binary. */
static void test_exec_fd_of_deleted_file(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(vm_spawner_freep) VmSpawner *s = NULL;
        _cleanup_(vm_process_freep) VmProcess *p = NULL;
        _cleanup_close_ int exe = -EBADF, in = -EBADF, out_r = -EBADF, out_w = -EBADF;
        _cleanup_free_ char *sh = NULL;
        char dir[] = "/tmp/test-vm-process-XXXXXX", copy[64], buf[64];
        size_t size;
        int pipefd[2];
        ssize_t n;
        Exit x = {};

        assert_ok(sd_event_new(&e));
        assert_ok(vm_spawner_new(e, &s));
        assert_non_null(mkdtemp(dir));
        snprintf(copy, sizeof(copy), "%s/sh", dir);
        assert_ok(read_full_file("/bin/sh", 64 << 20, &sh, &size));
        assert_ok(write_file_atomic(copy, sh, size, 0755));
        exe = open(copy, O_PATH | O_CLOEXEC);
        assert_true(exe >= 0);
        assert_ok(unlink(copy));
        assert_ok(rmdir(dir));

        in = memfd_create("stdin", MFD_CLOEXEC);
        assert_true(in >= 0);
        assert_ok(loop_write(in, "hello\n", 6));
        assert_ok(lseek(in, 0, SEEK_SET));
        assert_ok(pipe2(pipefd, O_CLOEXEC));
        out_r = pipefd[0];
        out_w = pipefd[1];

        assert_ok(vm_process_spawn(
                &p,
                s,
                &(VmProcessOptions){
                        .argv = (char *[]){ (char *) "sh", (char *) "-c", (char *) "read x; echo \"got $x\"", NULL },
                        .exec_fd = exe,
                        .stdin_fd = in,
                        .stdout_fd = out_w,
                },
                on_exit_cb,
                &x));
        /* the caller's again at once: the spawn has its own copies, whenever the clone comes */
        out_w = safe_close(out_w);
        in = safe_close(in);
        exe = safe_close(exe);
        wait_exit(e, &x);
        assert_int_equal(x.code, CLD_EXITED);
        assert_int_equal(x.status, 0);
        n = read(out_r, buf, sizeof(buf) - 1);
        assert_true(n >= 0);
        buf[n] = 0;
        assert_string_equal(buf, "got hello\n");
}

static void test_bad_options(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(vm_spawner_freep) VmSpawner *s = NULL;
        VmProcess *p = NULL;

        assert_ok(sd_event_new(&e));
        assert_ok(vm_spawner_new(e, &s));
        assert_errno(
                vm_process_spawn(
                        &p,
                        s,
                        &(VmProcessOptions){ .argv = (char *[]){ (char *) "true", NULL },
                                             .stdout_fd = 5,
                                             .log_file = "/dev/null" },
                        on_exit_cb,
                        NULL),
                -EINVAL);
        assert_errno(
                vm_process_spawn(
                        &p,
                        s,
                        &(VmProcessOptions){ .argv = (char *[]){ (char *) "true", NULL }, .exec_fd = -1 },
                        NULL,
                        NULL),
                -EINVAL);
        assert_null(p);
}

int main(void) {
        /* clang-format off */
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_exec_errors),
                cmocka_unit_test(test_free_before_pid),
                cmocka_unit_test(test_free_before_report),
                cmocka_unit_test(test_kill_before_pid),
                cmocka_unit_test(test_spawner_free),
                cmocka_unit_test(test_exec_fd_of_deleted_file),
                cmocka_unit_test(test_bad_options),
        };
        /* clang-format on */

        return cmocka_run_group_tests(tests, setup, NULL);
}
