/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* A child process watched through a pidfd on the loop: the plain-process launcher. */

typedef struct VmProcess VmProcess;

/* Called once when the process has exited; status is a waitid() si_code/si_status pair. Also called, with
 * code 0 and status 0, when the child never got to its program: vm_process_error() then says why. */
typedef void (*VmProcessExitFunc)(VmProcess *p, int code, int status, void *userdata);

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
} VmProcessOptions;

/* Forks the child and returns at once, its pid known: the loop never waits for the child's exec().
 * What keeps it from getting to its program (the program not found or not executable, the working
 * directory missing, …) comes later, from the loop: on_exit with code 0 once the child is gone, and
 * vm_process_error() says why (exec()'s errno, as posix_spawn() would return it). An error returned
 * here is our own (no memory, no fork), with no process left behind and on_exit never called. The
 * options are the caller's again when this returns (the child has its copy). */
int vm_process_spawn(
        VmProcess **ret, sd_event *e, const VmProcessOptions *o, VmProcessExitFunc on_exit, void *userdata);
/* A process still running is killed (SIGKILL) and reaped from the loop once it is gone (never waited
 * for here); the exit callback is not called. */
VmProcess *vm_process_free(VmProcess *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmProcess *, vm_process_free);

pid_t vm_process_pid(VmProcess *p);
bool vm_process_running(VmProcess *p);
/* < 0 once on_exit was called for a child that never ran its program: the errno that kept it (from
 * exec(), chdir(), …); 0 otherwise. */
int vm_process_error(VmProcess *p);
/* Sends sig; 0 when sent, -ESRCH when the process already exited. */
int vm_process_kill(VmProcess *p, int sig);

/* "exit status N", "signal: killed", … for messages. */
char *vm_exit_status_to_string(int code, int status);
