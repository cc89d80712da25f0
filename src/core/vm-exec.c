/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The host reaching into a guest: exec_vm (forward_port is vm-net.c's).
 *
 * It goes through the network's gateway, never around it: exec_vm asks the gateway for a unix
 * listener in the VM's directory whose connections become TCP to the guest's port 22, and speaks SSH
 * over that with libssh. libssh blocks, and the gateway that carries its bytes runs on our loop, so
 * the session runs in a child process: it reports one JSON object on a pipe and exits; the loop never
 * waits for it. */
#include <fcntl.h>
#include <libssh/libssh.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs-util.h"
#include "json-util.h"
#include "log.h"
#include "parse-util.h"
#include "socket-util.h"
#include "vm-internal.h"

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

typedef struct ExecOutput {
        char *data;
        size_t len;
        bool truncated;
} ExecOutput;

static void output_add(ExecOutput *o, const char *buf, size_t n) {
        size_t room = VM_EXEC_OUTPUT_MAX - o->len;

        if (n > room) {
                o->truncated = true;
                n = room;
        }
        if (n == 0)
                return;
        char *d = realloc(o->data, o->len + n + 1);
        if (!d) {
                o->truncated = true;
                return;
        }
        memcpy(d + o->len, buf, n);
        o->len += n;
        d[o->len] = 0;
        o->data = d;
}

/* The child's whole life: one session, one JSON object on fd 3, exit. */
_noreturn_ static void exec_child(
        const char *sock,
        const char *host,
        const char *addr,
        const char *vm_id,
        const char *key_path,
        const char *pin_path,
        const char *cmd) {
        ssh_session session = NULL;
        ssh_channel channel = NULL;
        ssh_key server_key = NULL, key = NULL;
        char *b64 = NULL, *pinned = NULL, *line = NULL, *msg = NULL;
        ExecOutput out = {}, err = {};
        json_t *result = NULL;
        int fd = -EBADF, status;
        long timeout = VM_EXEC_HANDSHAKE_TIMEOUT_SEC;
        bool unreached = true; /* no ssh handshake yet: a booting guest may simply not be there */

#define FAIL(...)                                    \
        do {                                         \
                if (asprintf(&msg, __VA_ARGS__) < 0) \
                        msg = NULL;                  \
                goto finish;                         \
        } while (0)

        fd = unix_stream_connect(sock, /* nonblock= */ false);
        if (fd < 0)
                FAIL("dial %s: %s", addr, strerror(-fd));

        session = ssh_new();
        if (!session)
                FAIL("ssh %s: out of memory", addr);
        if (ssh_options_set(session, SSH_OPTIONS_FD, &fd) < 0 ||
            ssh_options_set(session, SSH_OPTIONS_USER, "root") < 0 ||
            ssh_options_set(session, SSH_OPTIONS_HOST, host) < 0 ||
            ssh_options_set(session, SSH_OPTIONS_TIMEOUT, &timeout) < 0 ||
            ssh_options_set(session, SSH_OPTIONS_KNOWNHOSTS, "/dev/null") < 0 ||
            ssh_options_set(session, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/dev/null") < 0)
                FAIL("ssh %s: %s", addr, ssh_get_error(session));
        if (ssh_connect(session) != SSH_OK) {
                /* libssh says "Success" when the peer just closed: the gateway reached no sshd */
                const char *e = ssh_get_error(session);
                if (!e || !*e || streq(e, "Success"))
                        e = "the guest closed the connection before the ssh handshake (is sshd up yet?)";
                FAIL("ssh %s: %s", addr, e);
        }

        unreached = false;

        /* the host key, pinned on first use */
        if (ssh_get_server_publickey(session, &server_key) != SSH_OK ||
            ssh_pki_export_pubkey_base64(server_key, &b64) != SSH_OK)
                FAIL("ssh %s: no host key: %s", addr, ssh_get_error(session));
        if (asprintf(&line, "%s %s", ssh_key_type_to_char(ssh_key_type(server_key)), b64) < 0)
                FAIL("ssh %s: out of memory", addr);
        if (read_full_file(pin_path, 64 * 1024, &pinned, NULL) >= 0) {
                size_t n = strcspn(pinned, "\n");
                pinned[n] = 0;
                if (!streq(pinned, line))
                        FAIL("ssh %s: host key of vm %s changed", addr, vm_id);
        } else {
                _cleanup_free_ char *text = NULL;
                if (asprintf(&text, "%s\n", line) < 0 ||
                    write_file_atomic(pin_path, text, strlen(text), 0600) < 0)
                        FAIL("ssh %s: cannot pin the host key in %s", addr, pin_path);
        }

        if (ssh_pki_import_privkey_file(key_path, NULL, NULL, NULL, &key) != SSH_OK)
                FAIL("ssh %s: cannot read the VM's key %s", addr, key_path);
        if (ssh_userauth_publickey(session, NULL, key) != SSH_AUTH_SUCCESS)
                FAIL("ssh %s: root refused the VM's key: %s", addr, ssh_get_error(session));

        channel = ssh_channel_new(session);
        if (!channel || ssh_channel_open_session(channel) != SSH_OK)
                FAIL("ssh session: %s", ssh_get_error(session));
        if (ssh_channel_request_exec(channel, cmd) != SSH_OK)
                FAIL("ssh run: %s", ssh_get_error(session));

        for (;;) {
                char buf[16384];
                int n, e;

                n = ssh_channel_read_timeout(channel, buf, sizeof(buf), 0, 100);
                if (n > 0)
                        output_add(&out, buf, (size_t) n);
                e = ssh_channel_read_nonblocking(channel, buf, sizeof(buf), 1);
                if (e > 0)
                        output_add(&err, buf, (size_t) e);
                if (n == SSH_ERROR || e == SSH_ERROR)
                        FAIL("ssh run: %s", ssh_get_error(session));
                if (n <= 0 && e <= 0 && ssh_channel_is_eof(channel))
                        break;
        }
        status = ssh_channel_get_exit_status(channel);
        if (status < 0)
                FAIL("ssh run: the session ended without an exit status");

        result = json_pack(
                "{s:s%,s:s%,s:i}",
                "stdout",
                out.data ?: "",
                out.len,
                "stderr",
                err.data ?: "",
                err.len,
                "exitCode",
                status);
        if (result && out.truncated)
                json_object_set_new(result, "stdoutTruncated", json_true());
        if (result && err.truncated)
                json_object_set_new(result, "stderrTruncated", json_true());

finish:
        if (!result)
                result = json_pack("{s:s,s:b}", "error", msg ?: "ssh: out of memory", "unreached", unreached);
        if (result) {
                char *text = json_dumps(result, JSON_COMPACT);
                if (text)
                        (void) loop_write(3, text, strlen(text));
        }
        _exit(result ? 0 : 1);
#undef FAIL
}

typedef struct ExecCall {
        Manager *manager;
        char *vm_id;
        pid_t pid;
        sd_event_source *pipe_source, *timer;
        char *buf;
        size_t len, size;
        usec_t timeout;
        bool timed_out;
        VmDoneFunc done;
        void *userdata;
} ExecCall;

static void exec_call_free(ExecCall *c) {
        sd_event_source_disable_unref(c->pipe_source); /* closes fd */
        sd_event_source_disable_unref(c->timer);
        if (c->pid > 0) {
                (void) kill(c->pid, SIGKILL);
                (void) waitpid(c->pid, NULL, 0);
        }
        free(c->vm_id);
        free(c->buf);
        free(c);
}

static void exec_finish(ExecCall *c) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *result = NULL;
        const char *error;
        char d[32];
        int r;

        sd_event_source_disable_unref(TAKE_PTR(c->pipe_source));
        c->timer = sd_event_source_disable_unref(c->timer);
        if (c->pid > 0) {
                (void) kill(c->pid, SIGKILL); /* it has said what it had to say */
                (void) waitpid(c->pid, NULL, 0);
                c->pid = 0;
        }

        if (c->timed_out) {
                format_duration(d, sizeof(d), c->timeout);
                r = api_error_set(
                        &e, -ETIMEDOUT, API_ERROR_TIMEOUT, "ssh run: the command did not finish within %s", d);
        } else if (!(result = c->len > 0 ? json_loadb(c->buf, c->len, JSON_ALLOW_NUL, NULL) : NULL))
                r = api_error_set(&e, -EIO, API_ERROR_INTERNAL, "ssh: the session ended without a result");
        else if ((error = json_string_value(json_object_get(result, "error")))) {
                Vm *v = manager_find_vm(c->manager, c->vm_id);
                /* sshd is not there yet in a guest still on its way to ready: come back, not a fault */
                if (json_is_true(json_object_get(result, "unreached")) && v &&
                    IN_SET(vm_state(v), VM_STATE_INSTALLING, VM_STATE_BOOTING, VM_STATE_ATTESTING))
                        r = api_error_set(
                                &e,
                                -EAGAIN,
                                API_ERROR_CONFLICT,
                                "vm %s is %s and its sshd does not answer yet (%s); try again once it is ready",
                                c->vm_id,
                                vm_state_to_string(vm_state(v)),
                                error);
                else
                        r = api_error_set(&e, -EIO, API_ERROR_INTERNAL, "%s", error);
        } else
                r = 0;

        if (r < 0)
                log_struct(
                        LOG_INFO,
                        LOG_FIELDS({ "VM_ID", c->vm_id }),
                        "exec in VM %s failed: %s",
                        c->vm_id,
                        e.message ?: "?");
        c->done(r, r < 0 ? NULL : result, r < 0 ? &e : NULL, c->userdata);
        exec_call_free(c);
}

static int on_exec_pipe(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        ExecCall *c = userdata;

        for (;;) {
                if (c->size - c->len < 4096) {
                        size_t size = c->size ? c->size * 2 : 65536;
                        char *b = realloc(c->buf, size);
                        if (!b) {
                                exec_finish(c);
                                return 0;
                        }
                        c->buf = b;
                        c->size = size;
                }
                ssize_t k = read(fd, c->buf + c->len, c->size - c->len);
                if (k < 0 && (errno == EAGAIN || errno == EINTR))
                        return 0;
                if (k <= 0) {
                        exec_finish(c);
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

int vm_exec(Vm *v, char **command, usec_t timeout, VmDoneFunc done, void *userdata, ApiError *reterr) {
        _cleanup_free_ char *sock = vm_path(v, "ssh.sock"), *key = vm_path(v, "ssh_key"),
                            *pin = vm_path(v, "ssh_host_key"), *cmd = NULL, *addr = NULL;
        _cleanup_close_ int rfd = -EBADF, wfd = -EBADF;
        Manager *m = vm_manager(v);
        ExecCall *c;
        NetPort *p;
        int pipefd[2], r;

        if (!command || !command[0])
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "command is empty");
        if (!vm_has_process(v) || !vm_state_is_live(vm_state(v)) || !vm_ip(v))
                return api_error_set(
                        reterr,
                        -ESRCH,
                        API_ERROR_CONFLICT,
                        "vm %s is not running (%s)",
                        vm_id(v),
                        vm_state_to_string(vm_state(v)));
        if (!sock || !key || !pin)
                return -ENOMEM;
        cmd = shell_join(command);
        if (!cmd || asprintf(&addr, "%s:22", vm_ip(v) ?: "?") < 0)
                return -ENOMEM;

        /* the gateway's unix listener for the guest's sshd, once per port */
        p = vm_port(v, true);
        if (!p)
                return api_error_set(
                        reterr, -ENOENT, API_ERROR_INTERNAL, "dial %s: the VM has no network port", addr);
        if (access(sock, F_OK) < 0) {
                r = net_port_add_host_forward(p, sock, 22);
                if (r < 0 && r != -EEXIST)
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, "dial %s: %s", addr, strerror(-r));
        }

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

        c->pid = fork();
        if (c->pid < 0) {
                r = -errno;
                exec_call_free(c);
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "ssh: %s", strerror(-r));
        }
        if (c->pid == 0) {
                /* the result pipe becomes fd 3, everything else of the daemon's goes */
                sigset_t all;
                (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
                sigemptyset(&all);
                (void) sigprocmask(SIG_SETMASK, &all, NULL);
                if (dup2(wfd, 3) < 0)
                        _exit(1);
                (void) close_range(4, ~0U, 0);
                exec_child(sock, vm_ip(v), addr, vm_id(v), key, pin, cmd);
        }
        wfd = safe_close(wfd);
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
