/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The host reaching into a guest: exec_vm (forward_port is vm-net.c's).
 *
 * It goes through the network's gateway, never around it: exec_vm asks the gateway for a unix
 * listener in the VM's directory whose connections become TCP to the guest's port 22, and speaks SSH
 * over that with libssh. libssh blocks, and the gateway that carries its bytes runs on our loop, so
 * the session runs in a helper process, our own executable run again (`vm-manager exec-ssh`,
 * vm-exec-helper.h): its parameters go in on stdin (a memfd, written whole before it starts), it
 * writes one JSON object on a pipe and exits. The loop only watches the pipe (an io source) and the
 * helper (a child source through vm-process); it never waits for either. The object (up to
 * VM_EXEC_OUTPUT_MAX per stream, six times that escaped) is parsed on the manager's exec worker, off
 * the loop, which hears back through the worker's pipe. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fs-util.h"
#include "json-util.h"
#include "log.h"
#include "parse-util.h"
#include "vm-internal.h"
#include "vm-process.h"
#include "worker.h"

/* 'word' → 'word', with ' inside as '\'' : the remote shell sees the argv as given. */
static char *shell_join(char **argv) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        for (char **a = argv; *a; a++) {
                if (a != argv)
                        fputc(' ', f);
                fputc('\'', f);
                for (const char *c = *a; *c; c++)
                        if (*c == '\'')
                                fputs("'\\''", f);
                        else
                                fputc(*c, f);
                fputc('\'', f);
        }
        if (fclose(f) != 0) {
                free(buf);
                return NULL;
        }
        return buf;
}

/* While its result is parsed the call is a job of the exec worker, and belongs to it: nothing of
 * the loop's is left in it then (its sources and its helper are gone), only buf, len and result. */
typedef struct ExecCall {
        Manager *manager;
        char *vm_id;
        VmProcess *helper;
        sd_event_source *pipe_source, *timer;
        char *buf;
        size_t len, size;
        json_t *result; /* buf parsed, on the worker */
        usec_t timeout;
        bool timed_out, eof, exited;
        int exit_code, exit_status; /* the helper's, once exited */
        int spawn_error;            /* what kept the helper from running (vm_process_error()) */
        VmDoneFunc done;
        void *userdata;
} ExecCall;

static void exec_call_free(ExecCall *c) {
        sd_event_source_disable_unref(c->pipe_source); /* closes fd */
        sd_event_source_disable_unref(c->timer);
        vm_process_free(c->helper); /* a helper still running is killed and reaped */
        json_decref(c->result);
        free(c->vm_id);
        free(c->buf);
        free(c);
}

/* The caller hears how it went, and the call ends. unparsed: why the result could not be parsed
 * (the worker refused it, or was freed before it got to it); 0 otherwise. */
static void exec_complete(ExecCall *c, int unparsed) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        const char *msg;
        char d[32];
        int r;

        if (unparsed == -ESHUTDOWN)
                r = api_error_set(&e, unparsed, API_ERROR_CONFLICT, "vm-manager is shutting down");
        else if (unparsed < 0)
                r = api_error_set(
                        &e, unparsed, API_ERROR_INTERNAL, "ssh: cannot read the result: %s", strerror(-unparsed));
        else if (c->timed_out) {
                format_duration(d, sizeof(d), c->timeout);
                r = api_error_set(
                        &e, -ETIMEDOUT, API_ERROR_TIMEOUT, "ssh run: the command did not finish within %s", d);
        } else if (c->spawn_error < 0)
                r = api_error_set(
                        &e,
                        c->spawn_error,
                        API_ERROR_INTERNAL,
                        "ssh: cannot start the session's helper: %s",
                        strerror(-c->spawn_error));
        else if (!c->result) {
                _cleanup_free_ char *st = c->exited ? vm_exit_status_to_string(c->exit_code, c->exit_status) :
                                                      NULL;
                r = api_error_set(
                        &e,
                        -EIO,
                        API_ERROR_INTERNAL,
                        "ssh: the session ended without a result (its helper: %s)",
                        st ?: "unknown");
        } else if ((msg = json_string_value(json_object_get(c->result, "error")))) {
                Vm *v = manager_find_vm(c->manager, c->vm_id);
                /* sshd is not there yet in a guest still on its way to ready: come back, not a fault */
                if (json_is_true(json_object_get(c->result, "unreached")) && v &&
                    IN_SET(vm_state(v), VM_STATE_INSTALLING, VM_STATE_BOOTING, VM_STATE_ATTESTING))
                        r = api_error_set(
                                &e,
                                -EAGAIN,
                                API_ERROR_CONFLICT,
                                "vm %s is %s and its sshd does not answer yet (%s); try again once it is ready",
                                c->vm_id,
                                vm_state_to_string(vm_state(v)),
                                msg);
                else
                        r = api_error_set(&e, -EIO, API_ERROR_INTERNAL, "%s", msg);
        } else
                r = 0;

        if (r < 0)
                log_struct(
                        LOG_INFO,
                        LOG_FIELDS({ "VM_ID", c->vm_id }),
                        "exec in VM %s failed: %s",
                        c->vm_id,
                        e.message ?: "?");
        c->done(r, r < 0 ? NULL : c->result, r < 0 ? &e : NULL, c->userdata);
        exec_call_free(c);
}

/* On the worker: the helper's JSON, nothing else of the call. */
static void exec_parse_run(void *job) {
        ExecCall *c = job;

        c->result = json_loadb(c->buf, c->len, JSON_ALLOW_NUL, NULL);
        c->buf = mfree(c->buf); /* up to megabytes: unmapped here rather than on the loop */
        c->len = c->size = 0;
}

static void exec_parse_done(void *job, bool ran) {
        exec_complete(job, ran ? 0 : -ESHUTDOWN);
}

/* The session is over (the helper gone and its pipe at EOF, or the timeout): what it wrote is parsed
 * off the loop, unless there is nothing to parse. */
static void exec_finish(ExecCall *c) {
        Worker *w = NULL;
        int r;

        c->pipe_source = sd_event_source_disable_unref(c->pipe_source);
        c->timer = sd_event_source_disable_unref(c->timer);
        c->helper = vm_process_free(c->helper);

        if (c->timed_out || c->spawn_error < 0 || c->len == 0) {
                exec_complete(c, /* unparsed= */ 0);
                return;
        }

        r = manager_exec_worker(c->manager, &w);
        if (r >= 0)
                r = worker_submit(w, c, exec_parse_run, exec_parse_done);
        if (r >= 0)
                return; /* the worker's now, until exec_parse_done() */
        exec_complete(c, r);
}

/* The result is complete once the pipe is at EOF and the helper has exited, in either order. */
static void exec_maybe_finish(ExecCall *c) {
        if (c->eof && c->exited)
                exec_finish(c);
}

static void on_exec_exit(VmProcess *p, int code, int status, void *userdata) {
        ExecCall *c = userdata;

        c->exited = true;
        c->spawn_error = vm_process_error(p);
        c->exit_code = code;
        c->exit_status = status;
        exec_maybe_finish(c);
}

static int on_exec_pipe(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        ExecCall *c = userdata;

        for (;;) {
                ssize_t k;

                if (c->size - c->len < 4096) {
                        size_t size = c->size ? c->size * 2 : 65536;
                        char *b = realloc(c->buf, size);
                        if (!b) {
                                c->len = 0; /* no result: the session is failed */
                                c->eof = c->exited = true;
                                exec_finish(c);
                                return 0;
                        }
                        c->buf = b;
                        c->size = size;
                }
                k = read(fd, c->buf + c->len, c->size - c->len);
                if (k < 0 && (errno == EAGAIN || errno == EINTR))
                        return 0;
                if (k <= 0) {
                        c->eof = true;
                        c->pipe_source = sd_event_source_disable_unref(c->pipe_source);
                        exec_maybe_finish(c);
                        return 0;
                }
                c->len += (size_t) k;
        }
}

static int on_exec_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        ExecCall *c = userdata;

        c->timed_out = true;
        exec_finish(c);
        return 0;
}

/* The helper's stdin: the session's parameters, whole in a memfd before it starts (a pipe could take
 * only 64 KiB without a reader, and the command line has no limit of its own). */
static int exec_params_fd(
        const char *sock,
        const char *host,
        const char *addr,
        const char *id,
        const char *key,
        const char *pin,
        const char *cmd,
        const char *input,
        bool shell) {
        _cleanup_close_ int fd = -EBADF;
        json_auto_t *params = NULL;
        _cleanup_free_ char *text = NULL;
        int r;

        params = json_pack(
                "{s:s,s:s,s:s,s:s,s:s,s:s,s:s}",
                "socket",
                sock,
                "host",
                host,
                "address",
                addr,
                "vm",
                id,
                "key",
                key,
                "pin",
                pin,
                "command",
                cmd);
        if (params && input && json_object_set_new(params, "stdin", json_string(input)) < 0)
                return -ENOMEM;
        if (params && shell && json_object_set_new(params, "shell", json_true()) < 0)
                return -ENOMEM;
        text = params ? json_dumps(params, JSON_COMPACT) : NULL;
        if (!text)
                return -ENOMEM;
        fd = memfd_create("vm-exec-params", MFD_CLOEXEC);
        if (fd < 0)
                return -errno;
        r = loop_write(fd, text, strlen(text));
        if (r < 0)
                return r;
        if (lseek(fd, 0, SEEK_SET) < 0)
                return -errno;
        return TAKE_FD(fd);
}

/* Whether the guest can be reached at all: a running QEMU and an address. */
static int exec_running(Vm *v, ApiError *reterr) {
        if (!vm_has_process(v) || !vm_state_is_live(vm_state(v)) || !vm_ip(v))
                return api_error_set(
                        reterr,
                        -ESRCH,
                        API_ERROR_CONFLICT,
                        "vm %s is not running (%s)",
                        vm_id(v),
                        vm_state_to_string(vm_state(v)));
        return 0;
}

/* The gateway's unix listener sock for the guest's sshd, made once per port; *ret_addr is
 * "<ip>:22", for messages. */
static int exec_dial_prepare(Vm *v, const char *sock, char **ret_addr, ApiError *reterr) {
        _cleanup_free_ char *addr = NULL;
        NetPort *p;
        int r;

        if (!sock || asprintf(&addr, "%s:22", vm_ip(v) ?: "?") < 0)
                return -ENOMEM;
        p = vm_port(v, true);
        if (!p)
                return api_error_set(
                        reterr, -ENOENT, API_ERROR_INTERNAL, "dial %s: the VM has no network port", addr);
        if (access(sock, F_OK) < 0) {
                r = net_port_add_host_forward(p, sock, 22);
                if (r < 0 && r != -EEXIST)
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, "dial %s: %s", addr, strerror(-r));
        }
        *ret_addr = TAKE_PTR(addr);
        return 0;
}

/* Starts `vm-manager exec-ssh` (vm-exec-helper.h) with params_fd as its stdin and out_fd as its stdout:
 * our own executable through the handle taken at start-up, a fresh process, not a forked copy of this
 * one (whose worker thread may hold a lock libssh, OpenSSL or malloc then needs). */
static int exec_helper_spawn(
        Manager *m,
        int params_fd,
        int out_fd,
        VmProcessExitFunc on_exit,
        void *userdata,
        VmProcess **ret,
        ApiError *reterr) {
        char *argv[] = { (char *) "vm-manager", (char *) "exec-ssh", NULL };
        int self_exe = manager_settings(m)->self_exe_fd;
        int r;

        r = self_exe < 0 ? -EBADF :
                           vm_process_spawn(
                                   ret,
                                   manager_spawner(m),
                                   &(VmProcessOptions){
                                           .argv = argv,
                                           .exec_fd = self_exe,
                                           .stdin_fd = params_fd,
                                           .stdout_fd = out_fd,
                                   },
                                   on_exit,
                                   userdata);
        if (r < 0)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "ssh: cannot start the session's helper: %s",
                        strerror(-r));
        return 0;
}

int vm_exec(
        Vm *v, char **command, const char *input, usec_t timeout, VmDoneFunc done, void *userdata, ApiError *reterr) {
        _cleanup_free_ char *sock = vm_path(v, "ssh.sock"), *key = vm_path(v, "ssh_key"),
                            *pin = vm_path(v, "ssh_host_key"), *cmd = NULL, *addr = NULL;
        _cleanup_close_ int rfd = -EBADF, wfd = -EBADF, params_fd = -EBADF;
        Manager *m = vm_manager(v);
        ExecCall *c;
        int pipefd[2], r;

        /* exec_vm's declaration refuses an empty command before the VM is looked up */
        assert_return(command && command[0], -EINVAL);
        r = exec_running(v, reterr);
        if (r < 0)
                return r;
        if (!sock || !key || !pin)
                return -ENOMEM;
        cmd = shell_join(command);
        if (!cmd)
                return -ENOMEM;
        r = exec_dial_prepare(v, sock, &addr, reterr);
        if (r < 0)
                return r;

        params_fd = exec_params_fd(sock, vm_ip(v), addr, vm_id(v), key, pin, cmd, input, /* shell= */ false);
        if (params_fd < 0)
                return api_error_set(reterr, params_fd, API_ERROR_INTERNAL, "ssh: %s", strerror(-params_fd));
        if (pipe2(pipefd, O_CLOEXEC) < 0)
                return -errno;
        rfd = pipefd[0];
        wfd = pipefd[1];
        c = calloc(1, sizeof(ExecCall));
        if (!c)
                return -ENOMEM;
        c->manager = m;
        c->vm_id = strdup(vm_id(v));
        c->timeout = timeout;
        c->done = done;
        c->userdata = userdata;
        if (!c->vm_id) {
                exec_call_free(c);
                return -ENOMEM;
        }

        r = exec_helper_spawn(m, params_fd, wfd, on_exec_exit, c, &c->helper, reterr);
        if (r < 0) {
                exec_call_free(c);
                return r;
        }
        wfd = safe_close(wfd);
        params_fd = safe_close(params_fd);
        (void) fcntl(rfd, F_SETFL, O_NONBLOCK);
        r = sd_event_add_io(manager_event(m), &c->pipe_source, rfd, EPOLLIN, on_exec_pipe, c);
        if (r >= 0) {
                (void) sd_event_source_set_io_fd_own(c->pipe_source, true);
                TAKE_FD(rfd);
                r = sd_event_add_time_relative(
                        manager_event(m),
                        &c->timer,
                        CLOCK_MONOTONIC,
                        timeout,
                        USEC_PER_SEC / 10,
                        on_exec_timeout,
                        c);
        }
        if (r < 0) {
                exec_call_free(c);
                return r;
        }
        log_struct(LOG_DEBUG, LOG_FIELDS({ "VM_ID", vm_id(v) }), "exec in VM %s: %s", vm_id(v), cmd);
        return 0;
}

/* ---- vm shell ---- */

struct VmShell {
        VmProcess *helper;
        VmShellDoneFunc done;
        void *userdata;
};

VmShell *vm_shell_free(VmShell *s) {
        if (!s)
                return NULL;
        vm_process_free(s->helper); /* a helper still running is killed and reaped */
        free(s);
        return NULL;
}

static void on_shell_exit(VmProcess *p, int code, int status, void *userdata) {
        VmShell *s = userdata;

        if (vm_process_error(p) < 0)
                log_debug("vm shell: the helper did not run: %s", strerror(-vm_process_error(p)));
        s->done(s, s->userdata);
}

int vm_shell_end(VmShell *s) {
        assert_return(s, -EINVAL);
        /* the helper says why in an ERROR frame, then exits: done follows */
        return vm_process_kill(s->helper, SIGTERM);
}

int vm_shell_check(Vm *v, ApiError *reterr) {
        _cleanup_free_ char *key = vm_path(v, "ssh_key");
        int r;

        r = exec_running(v, reterr);
        if (r < 0)
                return r;
        if (!key)
                return -ENOMEM;
        if (access(key, R_OK) < 0)
                return api_error_set(
                        reterr,
                        -ENOKEY,
                        API_ERROR_CONFLICT,
                        "vm %s has no ssh key of its own (%s), so no shell",
                        vm_id(v),
                        errno == ENOENT ? "none was made" : strerror(errno));
        return 0;
}

int vm_shell_start(Vm *v, int fd, VmShellDoneFunc done, void *userdata, VmShell **ret, ApiError *reterr) {
        _cleanup_close_ int conn = fd, params_fd = -EBADF;
        _cleanup_free_ char *sock = vm_path(v, "ssh.sock"), *key = vm_path(v, "ssh_key"),
                            *pin = vm_path(v, "ssh_host_key"), *addr = NULL;
        Manager *m = vm_manager(v);
        VmShell *s;
        int r;

        assert_return(fd >= 0 && done && ret, -EINVAL);
        r = vm_shell_check(v, reterr);
        if (r < 0)
                return r;
        if (!key || !pin)
                return -ENOMEM;
        r = exec_dial_prepare(v, sock, &addr, reterr);
        if (r < 0)
                return r;
        /* a login shell, as ssh without a command starts; the helper asks for the pty first */
        params_fd = exec_params_fd(sock, vm_ip(v), addr, vm_id(v), key, pin, "", NULL, /* shell= */ true);
        if (params_fd < 0)
                return api_error_set(reterr, params_fd, API_ERROR_INTERNAL, "ssh: %s", strerror(-params_fd));
        /* the helper blocks on it: the descriptor is shared, and the loop no longer touches it */
        r = fcntl(conn, F_GETFL);
        if (r < 0 || fcntl(conn, F_SETFL, r & ~O_NONBLOCK) < 0)
                return -errno;
        s = calloc(1, sizeof(VmShell));
        if (!s)
                return -ENOMEM;
        s->done = done;
        s->userdata = userdata;
        r = exec_helper_spawn(m, params_fd, conn, on_shell_exit, s, &s->helper, reterr);
        if (r < 0) {
                free(s);
                return r;
        }
        log_struct(LOG_DEBUG, LOG_FIELDS({ "VM_ID", vm_id(v) }), "shell in VM %s", vm_id(v));
        *ret = s;
        return 0;
}
