/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "macro.h"
#include "process-util.h"
#include "time-util.h"
#include "vm-guard.h"

/* The signals the guard waits for: the end of a process below it, and the requests to stop. */
static void guard_signals(sigset_t *ret) {
        sigemptyset(ret);
        sigaddset(ret, SIGCHLD);
        sigaddset(ret, SIGTERM);
        sigaddset(ret, SIGINT);
        sigaddset(ret, SIGHUP);
}

/* SIGKILL to every direct child: the program's process group is not enough, since a descendant may
 * have made a group or session of its own, and the orphans of the subreaper are its children. The
 * kernel's list of them (CONFIG_PROC_CHILDREN) may miss one that changed meanwhile; the caller asks
 * again until none is left. Returns how many were signalled. */
static int kill_children(void) {
        char path[64];
        FILE *f;
        int pid, n = 0;

        (void) snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int) getpid());
        f = fopen(path, "re");
        if (!f)
                return 0;
        while (fscanf(f, "%d", &pid) == 1)
                if (pid > 0 && kill(pid, SIGKILL) >= 0)
                        n++;
        (void) fclose(f);
        return n;
}

/* Reaps whatever has exited; the program's status goes to *status once it is among them. Returns
 * -ECHILD once no child is left, else the number reaped. */
static int reap(pid_t program, int *status, bool *program_done) {
        int n = 0;

        for (;;) {
                int st;
                pid_t pid = waitpid(-1, &st, WNOHANG);

                if (pid < 0)
                        return errno == ECHILD ? -ECHILD : n;
                if (pid == 0)
                        return n;
                if (pid == program) {
                        *status = st;
                        *program_done = true;
                }
                n++;
        }
}

/* Everything below the guard ends, now: the program's group at once, then every child (orphans
 * arriving as their parents die) until none is left or the time is up (a process stuck in the kernel
 * ignores even SIGKILL; it is init's then). */
static void end_descendants(pid_t program, int *status, bool *program_done) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + VM_GUARD_REAP_TIMEOUT_SEC * USEC_PER_SEC;
        sigset_t chld;

        sigemptyset(&chld);
        sigaddset(&chld, SIGCHLD);
        /* Only while the program is not reaped: its group id could be another's after that. What
         * stays of the group then are our children (orphans) or their descendants. */
        if (!*program_done)
                (void) kill(-program, SIGKILL);
        for (;;) {
                struct timespec tick = { .tv_nsec = 10 * 1000 * 1000 };

                (void) kill_children();
                if (reap(program, status, program_done) == -ECHILD)
                        return;
                if (now_usec(CLOCK_MONOTONIC) >= deadline)
                        return;
                /* the next exit, or a fresh look after a tick for an orphan that arrived unannounced */
                (void) sigtimedwait(&chld, NULL, &tick);
        }
}

/* The guard's end as the program's was, or by sig: an exit status is returned, a signal is raised
 * again on ourselves (without a core file: a core of the guard would say nothing about the program),
 * and the shell's 128 + signal returned should it not end us. */
static int end_like(int sig, int status) {
        struct rlimit no_core = {};
        sigset_t all;

        if (sig == 0 && WIFEXITED(status))
                return WEXITSTATUS(status);
        if (sig == 0)
                sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
        (void) setrlimit(RLIMIT_CORE, &no_core);
        (void) signal(sig, SIG_DFL);
        sigfillset(&all);
        (void) sigprocmask(SIG_UNBLOCK, &all, NULL);
        (void) raise(sig);
        return 128 + sig;
}

int vm_guard_main(int argc, char **argv) {
        sigset_t wait_for;
        bool program_done = false;
        pid_t parent, program;
        int status = 0, sig = 0;

        if (argc < 1 || !argv[0]) {
                fprintf(stderr, "Usage: vm-manager guard <program> [<argument>...]\n");
                return 2;
        }

        /* Blocked before anything can send them: they are read with sigwaitinfo(), never handled. */
        guard_signals(&wait_for);
        if (sigprocmask(SIG_BLOCK, &wait_for, NULL) < 0)
                return 127;
        if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
                fprintf(stderr, "vm-manager guard: cannot become a child subreaper: %m\n");
                return 127;
        }
        /* The daemon's spawner gave us SIGKILL as the parent-death signal, which would leave the
         * program's children behind; SIGTERM is one we can act on. A parent that ended before this
         * line killed us with that SIGKILL, and one that ends after it sends the SIGTERM. */
        parent = getppid();
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
                return 127;

        /* A group of its own, to be ended in one kill(); and if the guard is killed with SIGKILL
         * after all, the program goes with it (its children then cannot be helped). */
        program = process_fork_exec(argv, -1);
        if (program < 0) {
                fprintf(stderr, "vm-manager guard: cannot fork: %s\n", strerror((int) -program));
                return 127;
        }

        while (!program_done) {
                siginfo_t si;

                if (sigwaitinfo(&wait_for, &si) < 0)
                        continue;
                if (si.si_signo != SIGCHLD) {
                        sig = si.si_signo;
                        break;
                }
                (void) reap(program, &status, &program_done);
        }
        end_descendants(program, &status, &program_done);
        return end_like(sig, status);
}
