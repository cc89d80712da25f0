/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* A child process watched through a pidfd on the loop: the plain-process launcher. The loop never
 * clones: a spawner thread does (VmSpawner), so that the clone's wait for the child's exec() (a
 * CPU for the child, on a loaded machine) holds that thread only, and the pid comes back as an event. */

typedef struct VmSpawner VmSpawner;
typedef struct VmProcess VmProcess;

/* The thread every VmProcess is cloned on, and so their parent: a child's PR_SET_PDEATHSIG fires when
 * that thread ends, so the spawner lives as long as the processes it made (the daemon's, for the
 * Manager's). Its jobs complete on e. */
int vm_spawner_new(sd_event *e, VmSpawner **ret);
/* Spawns not made yet end as failures (-ESHUTDOWN, through on_exit); processes still running get their
 * parent-death signal (SIGKILL) as the thread ends. Waits for a clone under way. */
VmSpawner *vm_spawner_free(VmSpawner *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmSpawner *, vm_spawner_free);

/* Called once when the process has exited; status is a waitid() si_code/si_status pair. Also called, with
 * code 0 and status 0, when the child never got to its program: vm_process_error() then says why. */
typedef void (*VmProcessExitFunc)(VmProcess *p, int code, int status, void *userdata);
/* Called once the child exists and is watched: vm_process_pid() is known from then on. Not called for a
 * child that could not be cloned (on_exit says so). */
typedef void (*VmProcessStartedFunc)(VmProcess *p, void *userdata);

/* The descriptors below count from 3: 0, the default of a field left out, means "not given" (0, 1 and 2
 * are the daemon's stdio, never one of these). */
typedef struct VmProcessOptions {
        char **argv;             /* argv[0] is resolved on PATH when it has no '/' and exec_fd is 0 */
        int exec_fd;             /* the file to execute (an O_PATH fd is enough: fexecve() runs it);
                                  * argv[0] is then only the name the process sees. O_CLOEXEC is
                                  * fine for an ELF file, which the kernel opens before it closes
                                  * such descriptors; not for a #! script, whose interpreter would
                                  * be handed /dev/fd/N */
        const char *log_file;    /* stdout and stderr appended here (created 0600); NULL: /dev/null */
        int stdin_fd;            /* the child's stdin; 0: /dev/null */
        int stdout_fd;           /* the child's stdout, its stderr then staying the daemon's (log_file
                                  * must be NULL); 0: as log_file says */
        const char *working_dir; /* NULL: unchanged */
        bool block_io_uring;     /* seccomp: io_uring_setup fails with EPERM (QEMU, runtime.md §4.3) */
        int kill_signal;         /* what vm_process_free() ends the process with; 0: SIGKILL. A guard
                                  * (vm-guard.h) takes SIGTERM, so that it can end its descendants */
} VmProcessOptions;

/* Hands the child to the spawner's thread and returns at once: the loop never waits for the clone nor
 * the child's exec(). The pid is 0 until on_started. What keeps the child from getting to its program
 * (the clone failing, the program not found or not executable, the working directory missing, …)
 * comes later, from the loop: on_exit with code 0 once the child is gone, and vm_process_error() says
 * why (exec()'s errno, as posix_spawn() would return it). An error returned here is our own (no
 * memory, the spawner's queue full: -EAGAIN), with no process made and on_exit never called. The
 * options are the caller's again when this returns (the spawn has its copies of the strings and
 * descriptors). */
int vm_process_spawn(
        VmProcess **ret, VmSpawner *s, const VmProcessOptions *o, VmProcessExitFunc on_exit, void *userdata);
/* on_started (see VmProcessStartedFunc); set after the spawn, before the loop runs again. */
void vm_process_set_started(VmProcess *p, VmProcessStartedFunc on_started);
/* A process still running is killed (its kill_signal, SIGKILL by default) and reaped from the loop once it
 * is gone (never waited for here), one still being cloned as soon as it exists; the callbacks are not
 * called. */
VmProcess *vm_process_free(VmProcess *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmProcess *, vm_process_free);

/* 0 until on_started. */
pid_t vm_process_pid(VmProcess *p);
/* From the spawn until on_exit. */
bool vm_process_running(VmProcess *p);
/* < 0 once on_exit was called for a child that never ran its program: the errno that kept it (from
 * exec(), chdir(), …); 0 otherwise. */
int vm_process_error(VmProcess *p);
/* Sends sig; 0 when sent (or, before the pid is known, once it is: a SIGKILL is not replaced by a later
 * signal), -ESRCH when the process already exited. */
int vm_process_kill(VmProcess *p, int sig);

/* "exit status N", "signal: killed", … for messages. */
char *vm_exit_status_to_string(int code, int status);
