/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "string-util.h"
#include "vm-process.h"
#include "worker.h"

#ifndef __NR_io_uring_setup
#        define __NR_io_uring_setup 425
#endif

/* One thread that clones every child (a worker pool of one, at the daemon's nice value, which the
 * children inherit). The clone suspends it, never the loop, until the child has exec()ed, and the pid
 * comes back to the loop as the job's completion. The thread is the children's parent, so their
 * PR_SET_PDEATHSIG fires when it ends: it lives as long as the spawner, which outlives its processes. */
struct VmSpawner {
        sd_event *event;
        Worker *worker;
};

struct VmProcess {
        sd_event *event;         /* borrowed: the spawner's */
        sd_event_source *child;  /* once the pid is known */
        sd_event_source *report; /* the child's exec() report, until EOF (it runs) or its failure */
        char *name;              /* argv[0], for the debug log */
        pid_t pid;
        int error; /* what kept the child from its program: a negative errno, once known; 0 otherwise */
        int pending_signal; /* vm_process_kill() before the pid was known: sent once it is */
        int kill_signal;    /* what ends the process once nobody waits for it (process_abandon()) */
        bool spawning;      /* the spawner's job is out: no pid yet, and the job frees us if freed */
        bool exited;
        bool freed; /* vm_process_free() came first: the source lives on until the exit, and frees us */
        VmProcessExitFunc on_exit;
        VmProcessStartedFunc on_started;
        void *userdata;
};

static void vm_process_destroy(void *userdata) {
        VmProcess *p = userdata;

        sd_event_source_disable_unref(p->report);
        free(p->name);
        free(p);
}

/* The child runs in our memory until its exec() (CLONE_VM | CLONE_VFORK, as posix_spawn() does): its
 * code must not leave marks in the sanitizers' shadow of that memory, which is ours again after. */
#define _child_ __attribute__((no_sanitize("address", "undefined")))

/* The stack the child runs on until its exec(): execvp() builds each candidate path on it. */
#define CHILD_STACK_SIZE ((size_t) 256 << 10)

/* A classic BPF program: io_uring_setup fails with EPERM, everything else is allowed. QEMU then
 * falls back to epoll, which does not lose TPM emulator commands. */
_child_ static int block_io_uring(void) {
        struct sock_filter filter[] = {
                BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = { .len = ELEMENTSOF(filter), .filter = filter };

        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                return -errno;
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0)
                return -errno;
        return 0;
}

/* What a child that did not get as far as the new program tells its parent, on a close-on-exec pipe
 * that exec() closes otherwise: the parent reads EOF or this. */
typedef enum SpawnStep {
        SPAWN_STEP_STDIO,
        SPAWN_STEP_CHDIR,
        SPAWN_STEP_PDEATHSIG,
        SPAWN_STEP_SECCOMP,
        SPAWN_STEP_EXEC,
        _SPAWN_STEP_MAX,
} SpawnStep;

static const char *const spawn_step_table[_SPAWN_STEP_MAX] = {
        [SPAWN_STEP_STDIO] = "set up stdin, stdout and stderr",
        [SPAWN_STEP_CHDIR] = "enter the working directory",
        [SPAWN_STEP_PDEATHSIG] = "set the parent-death signal",
        [SPAWN_STEP_SECCOMP] = "install the seccomp filter",
        [SPAWN_STEP_EXEC] = "execute",
};

typedef struct SpawnFailure {
        int error; /* errno */
        int step;  /* SpawnStep */
} SpawnFailure;

_child_ _noreturn_ static void child_fail(int report_fd, SpawnStep step) {
        SpawnFailure f = { .error = errno, .step = step };

        /* atomic: far below PIPE_BUF; nothing to do if it fails (the parent then sees a plain exit) */
        if (write(report_fd, &f, sizeof(f)) < 0)
                _exit(127);
        _exit(127);
}

/* Only async-signal-safe calls between the clone and exec(). */
_child_ _noreturn_ static void child_exec(const VmProcessOptions *o, int log_fd, int report_fd, pid_t parent) {
        int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC), out_fd;

        if (null_fd < 0 || dup2(o->stdin_fd > 0 ? o->stdin_fd : null_fd, STDIN_FILENO) < 0)
                child_fail(report_fd, SPAWN_STEP_STDIO);
        out_fd = o->stdout_fd > 0 ? o->stdout_fd : log_fd >= 0 ? log_fd : null_fd;
        if (dup2(out_fd, STDOUT_FILENO) < 0 ||
            (o->stdout_fd <= 0 && dup2(log_fd >= 0 ? log_fd : null_fd, STDERR_FILENO) < 0))
                child_fail(report_fd, SPAWN_STEP_STDIO);
        if (o->working_dir && chdir(o->working_dir) < 0)
                child_fail(report_fd, SPAWN_STEP_CHDIR);
        /* Our own session, so that a terminal's Ctrl-C goes to the daemon, which stops VMs its way. */
        (void) setsid();
        /* Plain children end with the daemon. A daemon that died between the clone and here sent no
         * signal: we were handed to another parent already, and must not run on as an orphan. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
                child_fail(report_fd, SPAWN_STEP_PDEATHSIG);
        if (getppid() != parent)
                _exit(127);
        for (int sig = 1; sig < _NSIG; sig++)
                (void) signal(sig, SIG_DFL);
        /* Nothing blocked: the daemon blocks SIGTERM, SIGINT and SIGCHLD for its signalfd, and a
         * child inheriting that mask would ignore the SIGTERM of a stop. */
        {
                sigset_t none;
                sigemptyset(&none);
                (void) sigprocmask(SIG_SETMASK, &none, NULL);
        }
        if (o->block_io_uring && block_io_uring() < 0)
                child_fail(report_fd, SPAWN_STEP_SECCOMP);
        if (o->exec_fd > 0)
                /* the file we were handed, whatever its path is now (replaced, deleted) */
                (void) fexecve(o->exec_fd, o->argv, environ);
        else
                (void) execvp(o->argv[0], o->argv);
        child_fail(report_fd, SPAWN_STEP_EXEC);
}

typedef struct ChildArgs {
        const VmProcessOptions *o;
        int log_fd, report_fd;
        pid_t parent;
} ChildArgs;

_child_ static int child_main(void *userdata) {
        const ChildArgs *a = userdata;

        child_exec(a->o, a->log_fd, a->report_fd, a->parent);
}

/* On the spawner's thread. fork() copies our page tables, which under the sanitizers map a large
 * address space: on a busy machine that took over 100 ms. The child shares our memory instead, and
 * the calling thread is suspended until the child has exec()ed or exited (CLONE_VFORK): on a loaded
 * machine that is the child's wait for a CPU, tens of milliseconds or more, which is why the loop does
 * not call this. The thread has every signal blocked (worker_new()), so no handler of ours runs in
 * the child before it resets them. Whether the child got to its program is for the loop to hear, from
 * the report pipe. */
static pid_t spawn_child(const ChildArgs *a) {
        void *stack;
        pid_t pid;

        stack = mmap(
                NULL, CHILD_STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (stack == MAP_FAILED)
                return -errno;
        pid = clone(
                child_main, (uint8_t *) stack + CHILD_STACK_SIZE, CLONE_VM | CLONE_VFORK | SIGCHLD, (void *) a);
        if (pid < 0)
                pid = -errno;
        (void) munmap(stack, CHILD_STACK_SIZE);
        return pid;
}

/* Reads the child's report: EOF once exec() closed the pipe (the program runs), or a SpawnFailure.
 * Nothing to read yet leaves the source as it is. */
static void report_read(VmProcess *p) {
        SpawnFailure f;
        ssize_t n;

        do
                n = read(sd_event_source_get_io_fd(p->report), &f, sizeof(f));
        while (n < 0 && errno == EINTR);
        if (n < 0 && errno == EAGAIN)
                return;
        if (n > 0) {
                /* the child _exit()s right after: on_child() reports it, with this error */
                p->error = n == (ssize_t) sizeof(f) && f.error > 0 ? -f.error : -EIO;
                log_debug_errno(
                        p->error,
                        "Child for %s failed to %s: %m",
                        p->name,
                        n == (ssize_t) sizeof(f) && f.step >= 0 && f.step < (int) _SPAWN_STEP_MAX ?
                                spawn_step_table[f.step] :
                                "start");
        }
        p->report = sd_event_source_disable_unref(p->report);
}

static int on_report(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        report_read(userdata);
        return 0;
}

static int on_child(sd_event_source *s, const siginfo_t *si, void *userdata) {
        VmProcess *p = userdata;

        p->exited = true;
        /* a child that exits has written its report, if any, or exec() closed the pipe: whichever of
         * the two sources the loop dispatches first, the report is read before the exit counts */
        if (p->report)
                report_read(p);
        p->report = sd_event_source_disable_unref(p->report);
        if (p->freed) {
                /* killed by vm_process_free(): sd-event reaps it once this returns, then frees the
                 * source, whose destroy callback frees p */
                (void) sd_event_source_set_floating(s, false);
                return 0;
        }
        if (p->on_exit) {
                if (p->error < 0)
                        p->on_exit(p, 0, 0, p->userdata);
                else
                        p->on_exit(p, si->si_code, si->si_status, p->userdata);
        }
        return 0;
}

/* What the spawner's thread needs for one child, all of it the job's own (the caller's options are
 * its again when vm_process_spawn() returns): copies of the strings, duplicates of the descriptors. */
typedef struct SpawnJob {
        VmProcess *process; /* the loop's: the thread never looks at it */
        VmProcessOptions o; /* argv, working_dir and the descriptors below are the job's */
        char *working_dir;
        int log_fd, report_fd;
        pid_t parent;
        pid_t pid; /* the thread's answer: the child, or a negative errno */
} SpawnJob;

static SpawnJob *spawn_job_free(SpawnJob *j) {
        if (!j)
                return NULL;
        strv_free(j->o.argv);
        free(j->working_dir);
        if (j->o.exec_fd > 0)
                safe_close(j->o.exec_fd);
        if (j->o.stdin_fd > 0)
                safe_close(j->o.stdin_fd);
        if (j->o.stdout_fd > 0)
                safe_close(j->o.stdout_fd);
        safe_close(j->log_fd);
        safe_close(j->report_fd);
        free(j);
        return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(SpawnJob *, spawn_job_free);

/* A copy of an option's descriptor, 0 for 0 ("not given"); close-on-exec like every other, the child
 * dup2()s it where it belongs. */
static int dup_option_fd(int fd, int *ret) {
        int copy;

        if (fd == 0) {
                *ret = 0;
                return 0;
        }
        copy = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
        if (copy < 0)
                return -errno;
        *ret = copy;
        return 0;
}

/* On the spawner's thread: touches the job only. */
static void spawn_run(void *job) {
        SpawnJob *j = job;

        j->pid = spawn_child(&(ChildArgs){
                .o = &j->o, .log_fd = j->log_fd, .report_fd = j->report_fd, .parent = j->parent });
}

/* Ends the process of p, which nobody waits for any more: its kill signal (SIGKILL), and the source floats
 * on until the exit comes and is reaped from the loop (on_child()); it frees p with itself, and a loop that
 * ends first frees both (the process, killed, is init's to reap once we are gone). false when that
 * could not be arranged. */
static bool process_abandon(VmProcess *p) {
        if (!p->child || p->exited ||
            sd_event_source_send_child_signal(p->child, p->kill_signal, NULL, 0) < 0 ||
            sd_event_source_set_child_process_own(p->child, false) < 0 ||
            sd_event_source_set_floating(p->child, true) < 0)
                return false;
        (void) sd_event_source_set_destroy_callback(p->child, vm_process_destroy);
        p->freed = true;
        p->on_exit = NULL;
        p->on_started = NULL;
        sd_event_source_unref(p->child);
        return true;
}

/* The child never got to exist, or cannot be watched: p ends here, as a child that could not exec()
 * does (on_exit with code 0, vm_process_error() saying why), or is freed if its owner is gone. */
static void spawn_failed(VmProcess *p, int error) {
        p->report = sd_event_source_disable_unref(p->report);
        if (p->freed) {
                vm_process_destroy(p);
                return;
        }
        log_debug_errno(error, "Child for %s could not be started: %m", p->name);
        p->error = error;
        p->exited = true;
        if (p->on_exit)
                p->on_exit(p, 0, 0, p->userdata); /* may free p */
}

/* On the loop: the spawner's answer. ran is false when the spawner was freed before its thread got
 * to the job. */
static void spawn_done(void *job, bool ran) {
        SpawnJob *j = job;
        VmProcess *p = j->process;
        pid_t pid = ran ? j->pid : -ESHUTDOWN;
        int r;

        /* our copies of the descriptors: the child has its own, or exec() closed them (the report
         * pipe's EOF, which says the program runs, comes once this end is closed too) */
        spawn_job_free(j);
        p->spawning = false;
        if (pid < 0) {
                spawn_failed(p, pid);
                return;
        }
        p->pid = pid;

        /* SIGCHLD is blocked on the loop's thread (sd-event's requirement) and on every worker thread;
         * waitid() and pidfds reach the children of any thread of ours */
        r = sd_event_add_child(p->event, &p->child, pid, WEXITED, on_child, p);
        if (r < 0) {
                /* not watched, so reaped here: a child killed after its exec(), gone at once */
                (void) kill(pid, SIGKILL);
                (void) waitpid(pid, NULL, 0);
                spawn_failed(p, r);
                return;
        }
        (void) sd_event_source_set_child_process_own(p->child, true);
        (void) sd_event_source_set_description(p->child, "vm-process");

        if (p->freed) {
                /* freed while the clone was under way: ended now that it exists */
                if (!process_abandon(p)) {
                        sd_event_source_disable_unref(p->child);
                        vm_process_destroy(p);
                }
                return;
        }
        if (p->pending_signal > 0)
                (void) sd_event_source_send_child_signal(p->child, p->pending_signal, NULL, 0);
        if (p->on_started)
                p->on_started(p, p->userdata);
}

int vm_spawner_new(sd_event *e, VmSpawner **ret) {
        _cleanup_(vm_spawner_freep) VmSpawner *s = NULL;
        int r;

        assert_return(e && ret, -EINVAL);

        s = calloc(1, sizeof(VmSpawner));
        if (!s)
                return -ENOMEM;
        s->event = sd_event_ref(e);
        /* one thread: spawns keep their order, and one child at a time waits for a CPU. nice 0: the
         * children inherit the thread's */
        r = worker_new(
                e,
                &(WorkerOptions){
                        .name = "vmm-spawn",
                        .threads = 1,
                        .max_jobs = WORKER_JOBS_MAX,
                        .nice = 0,
                },
                &s->worker);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(s);
        return 0;
}

VmSpawner *vm_spawner_free(VmSpawner *s) {
        if (!s)
                return NULL;
        /* spawns not yet made end as failed (-ESHUTDOWN); the thread's end sends its children still
         * running their parent-death signal */
        worker_free(s->worker);
        sd_event_unref(s->event);
        free(s);
        return NULL;
}

int vm_process_spawn(
        VmProcess **ret, VmSpawner *s, const VmProcessOptions *o, VmProcessExitFunc on_exit, void *userdata) {
        _cleanup_(vm_process_freep) VmProcess *p = NULL;
        _cleanup_(spawn_job_freep) SpawnJob *j = NULL;
        _cleanup_close_ int report_r = -EBADF;
        int report[2];
        int r;

        assert_return(ret && s && o && o->argv && o->argv[0], -EINVAL);
        assert_return(o->exec_fd >= 0 && o->stdin_fd >= 0 && o->stdout_fd >= 0, -EINVAL);
        assert_return(!(o->stdout_fd > 0 && o->log_file), -EINVAL);

        p = calloc(1, sizeof(VmProcess));
        if (!p)
                return -ENOMEM;
        p->event = s->event;
        p->on_exit = on_exit;
        p->userdata = userdata;
        p->kill_signal = o->kill_signal > 0 ? o->kill_signal : SIGKILL;
        p->name = strdup(o->argv[0]);
        if (!p->name)
                return -ENOMEM;

        j = calloc(1, sizeof(SpawnJob));
        if (!j)
                return -ENOMEM;
        j->log_fd = j->report_fd = -EBADF;
        j->process = p;
        j->parent = getpid();
        j->o.block_io_uring = o->block_io_uring;
        j->o.argv = strv_copy(o->argv);
        if (!j->o.argv)
                return -ENOMEM;
        if (o->working_dir) {
                j->working_dir = strdup(o->working_dir);
                if (!j->working_dir)
                        return -ENOMEM;
                j->o.working_dir = j->working_dir;
        }
        r = dup_option_fd(o->exec_fd, &j->o.exec_fd);
        if (r >= 0)
                r = dup_option_fd(o->stdin_fd, &j->o.stdin_fd);
        if (r >= 0)
                r = dup_option_fd(o->stdout_fd, &j->o.stdout_fd);
        if (r < 0)
                return r;
        if (o->log_file) {
                j->log_fd = open(o->log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600);
                if (j->log_fd < 0)
                        return -errno;
        }

        if (pipe2(report, O_CLOEXEC) < 0)
                return -errno;
        report_r = report[0];
        j->report_fd = report[1];
        /* the loop reads it when it has something, never before */
        if (fcntl(report_r, F_SETFL, O_NONBLOCK) < 0)
                return -errno;
        r = sd_event_add_io(s->event, &p->report, report_r, EPOLLIN, on_report, p);
        if (r < 0)
                return r;
        (void) sd_event_source_set_io_fd_own(p->report, true);
        TAKE_FD(report_r);
        (void) sd_event_source_set_description(p->report, "vm-process-report");

        /* From here on the child is the spawner's to make: its pid (spawn_done()), and whether it
         * gets to its program (on_report(), on_child()), are for the loop to hear, not to wait for. */
        r = worker_submit(s->worker, j, spawn_run, spawn_done);
        if (r < 0)
                return r;
        TAKE_PTR(j);
        p->spawning = true;

        *ret = TAKE_PTR(p);
        return 0;
}

void vm_process_set_started(VmProcess *p, VmProcessStartedFunc on_started) {
        if (p)
                p->on_started = on_started;
}

VmProcess *vm_process_free(VmProcess *p) {
        if (!p)
                return NULL;
        /* Nothing we started outlives its owner: a process still running is killed with SIGKILL (or
         * the signal its options name, for a guard that ends its own descendants on it).
         * sd-event would then wait for it in waitid() (a freed source that owns its process reaps
         * it), on the loop: tens of milliseconds for a process that takes its time to die. Instead the
         * source floats on until the exit comes (process_abandon()). A child not yet at its program is
         * killed the same way, and one the spawner has not cloned yet once it has (spawn_done()). */
        p->report = sd_event_source_disable_unref(p->report);
        if (p->spawning) {
                p->freed = true;
                p->on_exit = NULL;
                p->on_started = NULL;
                return NULL;
        }
        if (process_abandon(p))
                return NULL;
        sd_event_source_disable_unref(p->child);
        vm_process_destroy(p);
        return NULL;
}

pid_t vm_process_pid(VmProcess *p) {
        return p ? p->pid : 0;
}

bool vm_process_running(VmProcess *p) {
        return p && !p->exited;
}

int vm_process_error(VmProcess *p) {
        return p ? p->error : 0;
}

int vm_process_kill(VmProcess *p, int sig) {
        assert_return(p && sig > 0, -EINVAL);
        if (p->exited)
                return -ESRCH;
        if (!p->child) {
                /* not cloned yet: sent once it is (spawn_done()); a SIGKILL stays one */
                if (p->pending_signal != SIGKILL)
                        p->pending_signal = sig;
                return 0;
        }
        return sd_event_source_send_child_signal(p->child, sig, NULL, 0);
}

char *vm_exit_status_to_string(int code, int status) {
        char *s = NULL;

        if (code == CLD_EXITED)
                asprintf_or_null(&s, "exit status %d", status);
        else if (code == CLD_KILLED || code == CLD_DUMPED) {
                const char *name = sigabbrev_np(status);
                const char *desc = status == SIGKILL ? "killed" :
                        status == SIGTERM            ? "terminated" :
                                                       (strsignal(status) ?:
                                                                name      ?:
                                                                            "unknown");
                char lower[64];
                size_t n = strnlen(desc, sizeof(lower) - 1);

                for (size_t i = 0; i < n; i++)
                        lower[i] = (char) (desc[i] >= 'A' && desc[i] <= 'Z' ? desc[i] + 32 : desc[i]);
                lower[n] = 0;
                asprintf_or_null(&s, "signal: %s%s", lower, code == CLD_DUMPED ? " (core dumped)" : "");
        } else
                asprintf_or_null(&s, "exit status unknown: si_code %d", code);
        return s;
}
