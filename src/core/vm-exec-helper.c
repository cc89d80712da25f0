/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* `vm-manager exec-ssh`: one ssh session for exec_vm (vm-exec-helper.h says what goes in and out). */
#include <libssh/libssh.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "json-util.h"
#include "shell-frame.h"
#include "socket-util.h"
#include "string-util.h"
#include "vm-exec-helper.h"
#include "vm.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(ssh_session, ssh_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(ssh_channel, ssh_channel_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(ssh_key, ssh_key_free);

typedef struct ExecParams {
        char *socket, *host, *address, *vm, *key, *pin, *command;
        char *input; /* "stdin", optional */
        bool shell;  /* "shell", optional: an interactive session on stdout (vm_shell_start()) */
} ExecParams;

/* The remote command's exit status, or -1 when the session ended without one (a signal killed it,
 * or the channel closed first). libssh 0.11 (Debian 13) deprecates ssh_channel_get_exit_status()
 * in favour of ssh_channel_get_exit_state(), which 0.10 (Debian 12) does not have; both wait for
 * the status the same way. */
static int channel_exit_status(ssh_channel channel) {
#if LIBSSH_VERSION_INT >= SSH_VERSION_INT(0, 11, 0)
        _cleanup_free_ char *signal_name = NULL;
        uint32_t code = UINT32_MAX;

        if (ssh_channel_get_exit_state(channel, &code, &signal_name, /* pcore_dumped= */ NULL) != SSH_OK)
                return -1;
        if (signal_name || code > INT32_MAX)
                return -1;
        return (int) code;
#else
        return ssh_channel_get_exit_status(channel);
#endif
}

static void exec_params_done(ExecParams *p) {
        free(p->socket);
        free(p->host);
        free(p->address);
        free(p->vm);
        free(p->key);
        free(p->pin);
        free(p->command);
        free(p->input);
}

typedef struct ExecOutput {
        char *data;
        size_t len;
        bool truncated;
} ExecOutput;

static void exec_output_done(ExecOutput *o) {
        free(o->data);
}

static void output_add(ExecOutput *o, const char *buf, size_t n) {
        size_t room = VM_EXEC_OUTPUT_MAX - o->len;
        char *d;

        if (n > room) {
                o->truncated = true;
                n = room;
        }
        if (n == 0)
                return;
        d = realloc(o->data, o->len + n + 1);
        if (!d) {
                o->truncated = true;
                return;
        }
        memcpy(d + o->len, buf, n);
        o->len += n;
        d[o->len] = 0;
        o->data = d;
}

/* Sets *ret_error to the error object (NULL on OOM) and returns -EIO. */
_printf_(3, 4) static int session_error(bool unreached, json_t **ret_error, const char *format, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;
        int k;

        va_start(ap, format);
        k = vasprintf(&msg, format, ap);
        va_end(ap);
        if (k < 0)
                msg = NULL;
        *ret_error = json_pack("{s:s,s:b}", "error", msg ?: "ssh: out of memory", "unreached", unreached);
        return -EIO;
}

/* Compares the guest's host key with the pin, or pins it on first use. */
static int check_host_key(ssh_session session, const ExecParams *p, json_t **ret_error) {
        _cleanup_(ssh_key_freep) ssh_key server_key = NULL;
        _cleanup_free_ char *b64 = NULL, *line = NULL, *pinned = NULL;

        if (ssh_get_server_publickey(session, &server_key) != SSH_OK ||
            ssh_pki_export_pubkey_base64(server_key, &b64) != SSH_OK)
                return session_error(
                        false, ret_error, "ssh %s: no host key: %s", p->address, ssh_get_error(session));
        if (asprintf(&line, "%s %s", ssh_key_type_to_char(ssh_key_type(server_key)), b64) < 0) {
                line = NULL;
                return session_error(false, ret_error, "ssh %s: out of memory", p->address);
        }
        if (read_full_file(p->pin, 64 * 1024, &pinned, NULL) >= 0) {
                pinned[strcspn(pinned, "\n")] = 0;
                if (!streq(pinned, line))
                        return session_error(
                                false, ret_error, "ssh %s: host key of vm %s changed", p->address, p->vm);
        } else {
                _cleanup_free_ char *text = NULL;
                if (asprintf(&text, "%s\n", line) < 0 ||
                    write_file_atomic(p->pin, text, strlen(text), 0600) < 0)
                        return session_error(
                                false, ret_error, "ssh %s: cannot pin the host key in %s", p->address, p->pin);
        }
        return 0;
}

/* The whole session: *ret is the object for stdout either way (NULL on OOM); < 0 when it is an error. */

/* libssh leaves its error empty when the peer did not answer within the session's timeout. */
static const char *ssh_error_text(ssh_session session, long timeout) {
        static char buf[96];
        const char *e = ssh_get_error(session);

        if (e && *e)
                return e;
        snprintf(buf, sizeof(buf), "the guest's sshd did not answer within %ld s (a busy guest?)", timeout);
        return buf;
}
/* Connects, checks the host key and logs in as root: *ret_session, or *ret the error object. */
static int ssh_open(const ExecParams *p, ssh_session *ret_session, json_t **ret) {
        _cleanup_(ssh_freep) ssh_session session = NULL;
        _cleanup_(ssh_key_freep) ssh_key key = NULL;
        _cleanup_close_ int fd = -EBADF;
        long timeout = VM_EXEC_HANDSHAKE_TIMEOUT_SEC;

        fd = unix_stream_connect(p->socket, /* nonblock= */ false);
        if (fd < 0)
                return session_error(true, ret, "dial %s: %s", p->address, strerror(-fd));

        session = ssh_new();
        if (!session)
                return session_error(true, ret, "ssh %s: out of memory", p->address);
        if (ssh_options_set(session, SSH_OPTIONS_FD, &fd) < 0)
                return session_error(true, ret, "ssh %s: %s", p->address, ssh_get_error(session));
        TAKE_FD(fd); /* the session's now: ssh_free() closes it */
        if (ssh_options_set(session, SSH_OPTIONS_USER, "root") < 0 ||
            ssh_options_set(session, SSH_OPTIONS_HOST, p->host) < 0 ||
            ssh_options_set(session, SSH_OPTIONS_TIMEOUT, &timeout) < 0 ||
            ssh_options_set(session, SSH_OPTIONS_KNOWNHOSTS, "/dev/null") < 0 ||
            ssh_options_set(session, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/dev/null") < 0)
                return session_error(true, ret, "ssh %s: %s", p->address, ssh_get_error(session));
        if (ssh_connect(session) != SSH_OK) {
                /* libssh says "Success" when the peer just closed: the gateway reached no sshd */
                const char *e = ssh_get_error(session);
                if (!e || !*e || streq(e, "Success"))
                        e = "the guest closed the connection before the ssh handshake (is sshd up yet?)";
                return session_error(true, ret, "ssh %s: %s", p->address, e);
        }

        /* handshake done: from here on, failures are the guest's answer, not its absence */
        if (check_host_key(session, p, ret) < 0)
                return -EIO;

        if (ssh_pki_import_privkey_file(p->key, NULL, NULL, NULL, &key) != SSH_OK)
                return session_error(false, ret, "ssh %s: cannot read the VM's key %s", p->address, p->key);
        if (ssh_userauth_publickey(session, NULL, key) != SSH_AUTH_SUCCESS)
                return session_error(
                        false, ret, "ssh %s: root refused the VM's key: %s", p->address, ssh_get_error(session));
        *ret_session = TAKE_PTR(session);
        return 0;
}

static int exec_session(const ExecParams *p, json_t **ret) {
        _cleanup_(ssh_freep) ssh_session session = NULL;
        _cleanup_(ssh_channel_freep) ssh_channel channel = NULL;
        _cleanup_(exec_output_done) ExecOutput out = {}, err = {};
        json_t *result;
        long timeout = VM_EXEC_HANDSHAKE_TIMEOUT_SEC;
        int status;

        if (ssh_open(p, &session, ret) < 0)
                return -EIO;
        channel = ssh_channel_new(session);
        if (!channel || ssh_channel_open_session(channel) != SSH_OK)
                return session_error(false, ret, "ssh session: %s", ssh_error_text(session, timeout));
        if (ssh_channel_request_exec(channel, p->command) != SSH_OK)
                return session_error(false, ret, "ssh run: %s", ssh_error_text(session, timeout));
        /* The input goes first and whole (at most VM_EXEC_OUTPUT_MAX): libssh keeps reading what the
         * command writes while it waits for window to send, so a command that answers as it reads
         * cannot stall it. Then end of file, given or not, so that a command reading stdin ends. */
        for (size_t off = 0, n = p->input ? strlen(p->input) : 0; off < n;) {
                int k = ssh_channel_write(channel, p->input + off, (uint32_t) MIN(n - off, (size_t) 32768));
                if (k == SSH_ERROR)
                        return session_error(false, ret, "ssh stdin: %s", ssh_get_error(session));
                off += (size_t) k;
        }
        if (ssh_channel_send_eof(channel) != SSH_OK)
                return session_error(false, ret, "ssh stdin: %s", ssh_get_error(session));

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
                        return session_error(false, ret, "ssh run: %s", ssh_get_error(session));
                if (n <= 0 && e <= 0 && ssh_channel_is_eof(channel))
                        break;
        }
        status = channel_exit_status(channel);
        if (status < 0)
                return session_error(false, ret, "ssh run: the session ended without an exit status");

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
                (void) json_object_set_new(result, "stdoutTruncated", json_true());
        if (result && err.truncated)
                (void) json_object_set_new(result, "stderrTruncated", json_true());
        *ret = result;
        return result ? 0 : -ENOMEM;
}

/* ---- the interactive session (vm shell) ---- */

/* Writes a frame of type, data split into frames of SHELL_FRAME_PAYLOAD_MAX at most. */
static int shell_send(int fd, ShellFrameType type, const void *data, size_t n) {
        size_t off = 0;

        do {
                uint8_t h[SHELL_FRAME_HEADER_SIZE];
                size_t chunk = MIN(n - off, SHELL_FRAME_PAYLOAD_MAX);
                int r;

                shell_frame_header(h, type, chunk);
                r = loop_write(fd, h, sizeof(h));
                if (r >= 0 && chunk > 0)
                        r = loop_write(fd, (const char *) data + off, chunk);
                if (r < 0)
                        return r;
                off += chunk;
        } while (off < n);
        return 0;
}

static void shell_send_error(int fd, json_t *error) {
        const char *msg = json_string_value(json_object_get(error, "error"));

        msg = msg ?: "ssh: out of memory";
        (void) shell_send(fd, SHELL_FRAME_ERROR, msg, strlen(msg));
}

/* The client's frames in buf (len bytes): keys go to the shell, window sizes to its pty. Returns the
 * bytes taken, -EBADMSG for a frame the client should not send. */
static int shell_take_frames(ssh_channel channel, const uint8_t *buf, size_t len) {
        size_t off = 0;

        for (;;) {
                ShellFrame f;
                int k = shell_frame_parse(buf + off, len - off, &f);

                if (k < 0)
                        return k;
                if (k == 0)
                        return (int) off;
                if (f.type == SHELL_FRAME_DATA) {
                        for (size_t w = 0; w < f.size;) {
                                int n = ssh_channel_write(channel, f.payload + w, (uint32_t) (f.size - w));
                                if (n == SSH_ERROR)
                                        return -EIO;
                                w += (size_t) n;
                        }
                } else if (f.type == SHELL_FRAME_RESIZE)
                        (void) ssh_channel_change_pty_size(channel, f.cols, f.rows);
                else
                        return -EBADMSG;
                off += (size_t) k;
        }
}

/* SIGTERM: the daemon ends the session because the VM is stopping or gone (vm_shell_end()). The relay
 * tells the client so in an ERROR frame, between two frames of its own, and exits. */
static volatile sig_atomic_t shell_ended;

static void on_shell_sigterm(int sig) {
        shell_ended = 1;
}

/* Relays until the shell ends (its exit status goes to the client) or the client leaves (the shell is
 * hung up on). conn is the client's connection, read and written. */
static void shell_relay(ssh_session session, ssh_channel channel, int conn) {
        uint8_t in[SHELL_FRAME_HEADER_SIZE + SHELL_FRAME_PAYLOAD_MAX];
        size_t in_len = 0;

        for (;;) {
                struct pollfd pfd[2] = {
                        { .fd = conn, .events = POLLIN },
                        { .fd = ssh_get_fd(session), .events = POLLIN },
                };
                char out[SHELL_FRAME_PAYLOAD_MAX];
                int n, e, status;

                if (shell_ended) {
                        const char *msg = "vm shell: the VM is stopping or gone; the session ended";
                        (void) shell_send(conn, SHELL_FRAME_ERROR, msg, strlen(msg));
                        return;
                }
                /* libssh may hold bytes it read already: a short poll, then a look either way */
                if (poll(pfd, 2, 50) < 0 && errno != EINTR)
                        return;
                if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
                        ssize_t k = read(conn, in + in_len, sizeof(in) - in_len);
                        int taken;

                        if (k <= 0)
                                return; /* the client detached */
                        in_len += (size_t) k;
                        taken = shell_take_frames(channel, in, in_len);
                        if (taken < 0) {
                                const char *msg = taken == -EBADMSG ?
                                        "vm shell: a frame the client may not send" :
                                        "vm shell: the session broke";
                                (void) shell_send(conn, SHELL_FRAME_ERROR, msg, strlen(msg));
                                return;
                        }
                        memmove(in, in + taken, in_len - (size_t) taken);
                        in_len -= (size_t) taken;
                }
                n = ssh_channel_read_nonblocking(channel, out, sizeof(out), 0);
                if (n > 0 && shell_send(conn, SHELL_FRAME_DATA, out, (size_t) n) < 0)
                        return;
                e = ssh_channel_read_nonblocking(channel, out, sizeof(out), 1);
                if (e > 0 && shell_send(conn, SHELL_FRAME_DATA, out, (size_t) e) < 0)
                        return;
                if (n == SSH_ERROR || e == SSH_ERROR) {
                        const char *msg = ssh_get_error(session);
                        (void) shell_send(conn, SHELL_FRAME_ERROR, msg, strlen(msg));
                        return;
                }
                if (n > 0 || e > 0 || !ssh_channel_is_eof(channel))
                        continue;
                status = channel_exit_status(channel);
                if (status < 0 || status > 255) {
                        const char *msg = "ssh run: the shell ended without an exit status";
                        (void) shell_send(conn, SHELL_FRAME_ERROR, msg, strlen(msg));
                } else {
                        uint8_t f[SHELL_FRAME_HEADER_SIZE + 4];
                        (void) loop_write(conn, f, shell_frame_exit(f, (uint32_t) status));
                }
                return;
        }
}

static void shell_session(const ExecParams *p, int conn) {
        _cleanup_(ssh_freep) ssh_session session = NULL;
        _cleanup_(ssh_channel_freep) ssh_channel channel = NULL;
        json_auto_t *error = NULL;
        long timeout = VM_EXEC_HANDSHAKE_TIMEOUT_SEC;

        /* no SA_RESTART: the relay's poll() returns at once, and the flag is seen */
        (void) sigaction(SIGTERM, &(struct sigaction){ .sa_handler = on_shell_sigterm }, NULL);
        if (ssh_open(p, &session, &error) < 0) {
                shell_send_error(conn, error);
                return;
        }
        /* 80x24 until the client's first RESIZE frame, which it sends at once */
        channel = ssh_channel_new(session);
        if (!channel || ssh_channel_open_session(channel) != SSH_OK ||
            ssh_channel_request_pty_size(channel, "xterm", 80, 24) != SSH_OK ||
            ssh_channel_request_shell(channel) != SSH_OK) {
                (void) session_error(false, &error, "ssh shell: %s", ssh_error_text(session, timeout));
                shell_send_error(conn, error);
                return;
        }
        shell_relay(session, channel, conn);
}

int vm_exec_helper_main(int argc, char **argv) {
        static const JsonDispatch table[] = {
                { "socket", json_dispatch_string, offsetof(ExecParams, socket), JSON_MANDATORY },
                { "host", json_dispatch_string, offsetof(ExecParams, host), JSON_MANDATORY },
                { "address", json_dispatch_string, offsetof(ExecParams, address), JSON_MANDATORY },
                { "vm", json_dispatch_string, offsetof(ExecParams, vm), JSON_MANDATORY },
                { "key", json_dispatch_string, offsetof(ExecParams, key), JSON_MANDATORY },
                { "pin", json_dispatch_string, offsetof(ExecParams, pin), JSON_MANDATORY },
                { "command", json_dispatch_string, offsetof(ExecParams, command), JSON_MANDATORY },
                { "stdin", json_dispatch_string, offsetof(ExecParams, input), 0 },
                { "shell", json_dispatch_bool, offsetof(ExecParams, shell), 0 },
                {},
        };
        _cleanup_(exec_params_done) ExecParams p = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *params = NULL, *result = NULL;
        _cleanup_free_ char *text = NULL;
        json_error_t jerr;

        if (argc > 0) {
                fprintf(stderr, "Usage: vm-manager exec-ssh <PARAMETERS\n(the daemon's helper for exec_vm)\n");
                return 2;
        }
        params = json_loadfd(STDIN_FILENO, 0, &jerr);
        if (!params) {
                fprintf(stderr, "exec-ssh: bad parameters: %s\n", jerr.text);
                return 2;
        }
        if (json_dispatch(params, table, &p, &e) < 0) {
                fprintf(stderr, "exec-ssh: bad parameters: %s\n", e.message ?: "?");
                return 2;
        }

        if (p.shell) {
                shell_session(&p, STDOUT_FILENO);
                return 0;
        }
        (void) exec_session(&p, &result);
        text = result ? json_dumps(result, JSON_COMPACT) : NULL;
        if (!text || loop_write(STDOUT_FILENO, text, strlen(text)) < 0)
                return 1;
        return 0;
}
