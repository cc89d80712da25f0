/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* A child process watched through a pidfd on the loop: the plain-process launcher. */

typedef struct VmProcess VmProcess;

/* Called once when the process has exited; status is a waitid() si_code/si_status pair. */
typedef void (*VmProcessExitFunc)(VmProcess *p, int code, int status, void *userdata);

typedef struct VmProcessOptions {
        char **argv;             /* argv[0] is resolved on PATH when it has no '/' */
        const char *log_file;    /* stdout and stderr appended here (created 0600); NULL: /dev/null */
        const char *working_dir; /* NULL: unchanged */
        bool block_io_uring;     /* seccomp: io_uring_setup fails with EPERM (QEMU, runtime.md §4.3) */
} VmProcessOptions;

int vm_process_spawn(
        VmProcess **ret, sd_event *e, const VmProcessOptions *o, VmProcessExitFunc on_exit, void *userdata);
/* A process still running is killed (SIGKILL) and reaped from the loop once it is gone (never waited
 * for here); the exit callback is not called. */
VmProcess *vm_process_free(VmProcess *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(VmProcess *, vm_process_free);

pid_t vm_process_pid(VmProcess *p);
bool vm_process_running(VmProcess *p);
/* Sends sig; 0 when sent, -ESRCH when the process already exited. */
int vm_process_kill(VmProcess *p, int sig);

/* "exit status N", "signal: killed", … for messages. */
char *vm_exit_status_to_string(int code, int status);
