/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "log.h"
#include "socket-util.h"
#include "time-util.h"
#include "vm-qmp.h"

/* The client under test talks to a fake QMP server on the same sd-event loop: a unix socket in a
 * temporary directory, replaying a transcript from tests/data/qmp/ (under $VM_MANAGER_TEST_DATA).
 * One directive per line ('#' comments and blank lines are skipped):
 *
 *   S <json>   write the line plus "\r\n", as QEMU does
 *   R <bytes>  write raw bytes in one write(2); \r, \n and \\ are escapes
 *   C <json>   wait for the client's next command; "execute" and "arguments" must match, and its
 *              "id" becomes @N@ for later S/R lines (N counts the C lines from 1)
 *   P <ms>     pause, so the client reads what was written before on its own
 *   B <n>      write one unterminated line of n bytes
 *   X          close the connection (once the output is written)
 *
 * After the last directive the server reads and counts further commands without answering. */

#define FAKE_MAX_IDS 16

typedef struct Fake {
        sd_event *event;
        char dir[64];
        char path[128];
        char **script;
        size_t n_script, pc;
        json_int_t ids[FAKE_MAX_IDS];
        size_t n_ids;
        int listen_fd, fd;
        sd_event_source *listen_source, *io_source, *pause_source;
        char *ibuf, *obuf;
        size_t ilen, olen;
        bool closed;      /* the connection is gone (X, or the client left) */
        unsigned n_extra; /* commands after the end of the script */
        unsigned n_accepted;
        bool failed;
} Fake;

typedef struct Fixture Fixture;

typedef struct Call {
        Fixture *f;
        bool done;
        int error;
        char *result; /* compact JSON, keys sorted */
        char *desc;
        unsigned seq;
} Call;

#define MAX_CALLS (QMP_PENDING_MAX + 2)
#define MAX_EVENTS 16

struct Fixture {
        sd_event *event;
        Fake fake;
        QmpClient *client;
        Call calls[MAX_CALLS];
        char *events[MAX_EVENTS];
        char *event_data[MAX_EVENTS]; /* NULL when the event had none */
        unsigned event_seq[MAX_EVENTS];
        unsigned n_events;
        unsigned n_disconnect, disconnect_seq;
        unsigned n_ready, ready_seq;
        int ready_error;
        usec_t ready_at;
        unsigned seq; /* order of all callbacks */
        bool unref_in_reply, unref_in_disconnect;
        sd_event_source *listen_later;
};

/* ---- The fake server ---- */

static void fake_fail(Fake *s, const char *fmt, const char *arg) {
        fprintf(stderr, "# fake QMP server, directive %zu: ", s->pc + 1);
        fprintf(stderr, fmt, arg);
        fputc('\n', stderr);
        s->failed = true;
}

static void fake_close_connection(Fake *s) {
        s->io_source = sd_event_source_disable_unref(s->io_source);
        s->fd = safe_close(s->fd);
        s->closed = true;
        s->olen = 0;
}

static void fake_update_events(Fake *s) {
        if (s->io_source)
                assert_int_equal(
                        sd_event_source_set_io_events(s->io_source, EPOLLIN | (s->olen > 0 ? EPOLLOUT : 0)),
                        0);
}

static void fake_flush(Fake *s) {
        while (s->fd >= 0 && s->olen > 0) {
                ssize_t n = send(s->fd, s->obuf, s->olen, MSG_DONTWAIT | MSG_NOSIGNAL);

                if (n < 0) {
                        if (errno == EAGAIN)
                                break;
                        /* The client closed on us (the oversize test does). */
                        fake_close_connection(s);
                        return;
                }
                memmove(s->obuf, s->obuf + n, s->olen - (size_t) n);
                s->olen -= (size_t) n;
        }
        fake_update_events(s);
}

static void fake_append(Fake *s, const char *data, size_t len) {
        s->obuf = realloc(s->obuf, s->olen + len);
        assert_non_null(s->obuf);
        memcpy(s->obuf + s->olen, data, len);
        s->olen += len;
}

/* Appends text with @N@ replaced by the ids the client used and, for raw lines, escapes resolved. */
static void fake_append_expanded(Fake *s, const char *text, bool raw) {
        for (const char *p = text; *p; p++) {
                if (*p == '@') {
                        char *end;
                        unsigned long n = strtoul(p + 1, &end, 10);
                        char buf[32];

                        if (*end != '@' || n < 1 || n > s->n_ids) {
                                fake_fail(s, "bad or unknown id reference in '%s'", text);
                                return;
                        }
                        (void) snprintf(buf, sizeof(buf), "%lld", (long long) s->ids[n - 1]);
                        fake_append(s, buf, strlen(buf));
                        p = end;
                } else if (raw && *p == '\\' && p[1]) {
                        p++;
                        fake_append(s, *p == 'r' ? "\r" : *p == 'n' ? "\n" : p, 1);
                } else
                        fake_append(s, p, 1);
        }
}

/* Takes one line from the input; NULL if none is complete. */
static char *fake_take_line(Fake *s) {
        char *nl = s->ilen > 0 ? memchr(s->ibuf, '\n', s->ilen) : NULL, *line;
        size_t len;

        if (!nl)
                return NULL;
        len = (size_t) (nl - s->ibuf);
        line = strndup(s->ibuf, len);
        assert_non_null(line);
        memmove(s->ibuf, nl + 1, s->ilen - len - 1);
        s->ilen -= len + 1;
        return line;
}

/* json_equal() calls two absent values different. */
static bool json_equal_or_absent(json_t *a, json_t *b) {
        return (!a && !b) || (a && b && json_equal(a, b));
}

static void fake_check_command(Fake *s, const char *line, const char *expected_text) {
        json_auto_t *got = json_loads(line, 0, NULL), *expected = json_loads(expected_text, 0, NULL);
        json_t *id;

        if (!got || !expected || !json_is_object(got)) {
                fake_fail(s, "unparsable command or expectation: '%s'", line);
                return;
        }
        if (!json_equal_or_absent(json_object_get(got, "execute"), json_object_get(expected, "execute")) ||
            !json_equal_or_absent(json_object_get(got, "arguments"), json_object_get(expected, "arguments")) ||
            json_object_size(got) != json_object_size(expected) + 1) {
                fake_fail(s, "unexpected command '%s'", line);
                return;
        }
        id = json_object_get(got, "id");
        if (!json_is_integer(id) || s->n_ids >= FAKE_MAX_IDS) {
                fake_fail(s, "command without an integer id: '%s'", line);
                return;
        }
        s->ids[s->n_ids++] = json_integer_value(id);
}

static int on_fake_pause(sd_event_source *es, uint64_t usec, void *userdata);

static void fake_run(Fake *s) {
        while (!s->failed && !s->closed && s->pc < s->n_script) {
                const char *d = s->script[s->pc], *arg = d[1] ? d + 2 : "";

                switch (d[0]) {
                case 'S':
                        fake_append_expanded(s, arg, false);
                        fake_append(s, "\r\n", 2);
                        fake_flush(s);
                        break;
                case 'R':
                        fake_append_expanded(s, arg, true);
                        fake_flush(s);
                        break;
                case 'B': {
                        size_t n = strtoul(arg, NULL, 10);
                        char *big = malloc(n);

                        assert_non_null(big);
                        assert_true(n >= 12);
                        memset(big, 'x', n);
                        memcpy(big, "{\"return\": \"", 12);
                        fake_append(s, big, n);
                        free(big);
                        fake_flush(s);
                        break;
                }
                case 'C': {
                        _cleanup_free_ char *line = fake_take_line(s);

                        if (!line)
                                return; /* on_fake_io() calls again */
                        fake_check_command(s, line, arg);
                        break;
                }
                case 'P':
                        s->pc++;
                        assert_int_equal(
                                sd_event_add_time_relative(
                                        s->event,
                                        &s->pause_source,
                                        CLOCK_MONOTONIC,
                                        strtoul(arg, NULL, 10) * USEC_PER_MSEC,
                                        1,
                                        on_fake_pause,
                                        s),
                                0);
                        return;
                case 'X':
                        if (s->olen > 0)
                                return; /* on_fake_io() calls again once it is written */
                        fake_close_connection(s);
                        break;
                default:
                        fake_fail(s, "unknown directive '%s'", d);
                        return;
                }
                s->pc++;
        }

        /* Past the script: count what else arrives. */
        if (s->pc >= s->n_script)
                for (;;) {
                        _cleanup_free_ char *line = fake_take_line(s);
                        if (!line)
                                break;
                        s->n_extra++;
                }
}

static int on_fake_pause(sd_event_source *es, uint64_t usec, void *userdata) {
        Fake *s = userdata;

        s->pause_source = sd_event_source_disable_unref(s->pause_source);
        fake_run(s);
        return 0;
}

static int on_fake_io(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Fake *s = userdata;

        if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                char buf[4096];
                ssize_t n = recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT);

                if (n == 0 || (n < 0 && errno != EAGAIN)) {
                        fake_close_connection(s); /* the client left */
                        return 0;
                }
                if (n > 0) {
                        s->ibuf = realloc(s->ibuf, s->ilen + (size_t) n);
                        assert_non_null(s->ibuf);
                        memcpy(s->ibuf + s->ilen, buf, (size_t) n);
                        s->ilen += (size_t) n;
                }
        }
        fake_flush(s);
        fake_run(s);
        return 0;
}

static int on_fake_accept(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Fake *s = userdata;
        int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

        if (cfd < 0)
                return 0;
        s->n_accepted++;
        if (s->fd >= 0 || s->closed) {
                (void) close(cfd); /* QEMU serves one client */
                return 0;
        }
        s->fd = cfd;
        assert_int_equal(sd_event_add_io(s->event, &s->io_source, s->fd, EPOLLIN, on_fake_io, s), 0);
        fake_run(s);
        return 0;
}

static char *transcript_path(const char *name) {
        const char *dir = secure_getenv("VM_MANAGER_TEST_DATA"), *slash;
        char *p;

        /* meson points at the source tree. Without it, go from this file's directory as the compiler
         * saw it, which under meson is relative to the build directory. */
        if (dir) {
                assert_true(asprintf(&p, "%s/qmp/%s.qmp", dir, name) >= 0);
                return p;
        }

        slash = strrchr(__FILE__, '/');
        assert_true(
                asprintf(
                        &p,
                        "%.*s/../data/qmp/%s.qmp",
                        slash ? (int) (slash - __FILE__) : 1,
                        slash ? __FILE__ : ".",
                        name) >= 0);
        return p;
}

static void fake_load(Fake *s, const char *name) {
        _cleanup_free_ char *path = transcript_path(name), *data = NULL;
        size_t size;
        char *line, *save = NULL;

        assert_ok(read_full_file(path, 1 << 20, &data, &size));

        for (line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (line[0] == '#' || line[0] == 0)
                        continue;
                s->script = realloc(s->script, (s->n_script + 2) * sizeof(char *));
                assert_non_null(s->script);
                s->script[s->n_script] = strdup(line);
                assert_non_null(s->script[s->n_script]);
                s->script[++s->n_script] = NULL;
        }
        assert_true(s->n_script > 0);
}

static void fake_listen(Fake *s) {
        s->listen_fd = unix_stream_listen(s->path, 4);
        assert_true(s->listen_fd >= 0);
        assert_int_equal(
                sd_event_add_io(s->event, &s->listen_source, s->listen_fd, EPOLLIN, on_fake_accept, s), 0);
}

static void fake_done(Fake *s) {
        fake_close_connection(s);
        s->listen_source = sd_event_source_disable_unref(s->listen_source);
        s->pause_source = sd_event_source_disable_unref(s->pause_source);
        s->listen_fd = safe_close(s->listen_fd);
        (void) unlink(s->path);
        (void) rmdir(s->dir);
        strv_free(s->script);
        free(s->ibuf);
        free(s->obuf);
}

/* ---- The client's callbacks, recorded ---- */

static void on_reply(QmpClient *c, int error, json_t *result, const char *desc, void *userdata) {
        Call *call = userdata;
        Fixture *f = call->f;

        assert_false(call->done);
        call->done = true;
        call->error = error;
        call->seq = ++f->seq;
        if (result) {
                call->result = json_dumps(result, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
                assert_non_null(call->result);
        }
        if (desc) {
                call->desc = strdup(desc);
                assert_non_null(call->desc);
        }
        if (f->unref_in_reply)
                f->client = qmp_client_unref(f->client);
}

static void on_event(QmpClient *c, const char *event, json_t *data, void *userdata) {
        Fixture *f = userdata;

        assert_true(f->n_events < MAX_EVENTS);
        f->events[f->n_events] = strdup(event);
        assert_non_null(f->events[f->n_events]);
        if (data)
                f->event_data[f->n_events] = json_dumps(data, JSON_COMPACT | JSON_SORT_KEYS);
        f->event_seq[f->n_events] = ++f->seq;
        f->n_events++;
}

static void on_disconnect(QmpClient *c, void *userdata) {
        Fixture *f = userdata;

        f->n_disconnect++;
        f->disconnect_seq = ++f->seq;
        assert_false(qmp_client_is_ready(c));
        if (f->unref_in_disconnect)
                f->client = qmp_client_unref(f->client);
}

static void on_ready(QmpClient *c, int error, void *userdata) {
        Fixture *f = userdata;

        f->n_ready++;
        f->ready_seq = ++f->seq;
        f->ready_error = error;
        f->ready_at = now_usec(CLOCK_MONOTONIC);
}

/* ---- Fixture ---- */

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));

        assert_non_null(f);
        assert_int_equal(sd_event_new(&f->event), 0);
        f->fake = (Fake){ .event = f->event, .listen_fd = -EBADF, .fd = -EBADF };
        strcpy(f->fake.dir, "/tmp/test-vm-qmp.XXXXXX");
        assert_non_null(mkdtemp(f->fake.dir));
        (void) snprintf(f->fake.path, sizeof(f->fake.path), "%s/qmp.sock", f->fake.dir);
        for (size_t i = 0; i < MAX_CALLS; i++)
                f->calls[i].f = f;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        f->client = qmp_client_unref(f->client);
        f->listen_later = sd_event_source_disable_unref(f->listen_later);
        fake_done(&f->fake);
        for (size_t i = 0; i < MAX_CALLS; i++) {
                free(f->calls[i].result);
                free(f->calls[i].desc);
        }
        for (size_t i = 0; i < f->n_events; i++) {
                free(f->events[i]);
                free(f->event_data[i]);
        }
        sd_event_unref(f->event);
        free(f);
        return 0;
}

#define RUN_UNTIL(f, cond)                                                              \
        do {                                                                            \
                usec_t _deadline = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;        \
                while (!(cond)) {                                                       \
                        if (now_usec(CLOCK_MONOTONIC) > _deadline)                      \
                                fail_msg("timed out waiting for %s", #cond);            \
                        assert_true(sd_event_run((f)->event, 10 * USEC_PER_MSEC) >= 0); \
                        assert_false((f)->fake.failed);                                 \
                }                                                                       \
        } while (0)

/* Runs the loop for a while, for checks that nothing (more) happens. */
static void run_for(Fixture *f, usec_t usec) {
        usec_t end = now_usec(CLOCK_MONOTONIC) + usec;

        while (now_usec(CLOCK_MONOTONIC) < end)
                assert_true(sd_event_run(f->event, 5 * USEC_PER_MSEC) >= 0);
        assert_false(f->fake.failed);
}

/* The loop's notion of now, which the client's timers are relative to. */
static usec_t loop_now(Fixture *f) {
        usec_t t;

        assert_true(sd_event_now(f->event, CLOCK_MONOTONIC, &t) >= 0);
        return t;
}

static void start(Fixture *f, const char *transcript) {
        fake_load(&f->fake, transcript);
        fake_listen(&f->fake);
        assert_ok(qmp_client_connect(&f->client, f->event, f->fake.path, on_event, on_disconnect, f));
}

static void execute(Fixture *f, unsigned i, const char *command, json_t *args, usec_t timeout) {
        assert_ok(qmp_client_execute(f->client, command, args, timeout, on_reply, &f->calls[i]));
}

static bool script_done(Fixture *f) {
        return f->fake.pc >= f->fake.n_script;
}

/* ---- Tests ---- */

static void test_parse_message(void **state) {
        _cleanup_(qmp_message_done) QmpMessage m = QMP_MESSAGE_NULL;
        _cleanup_free_ char *big = NULL;
        const char *s;

        s = "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r";
        assert_ok(qmp_parse_message(s, strlen(s), &m));
        assert_int_equal(m.type, QMP_MESSAGE_GREETING);
        assert_true(json_is_object(m.value));
        qmp_message_done(&m);

        s = "{\"return\": {\"running\": true}, \"id\": 7}";
        assert_ok(qmp_parse_message(s, strlen(s), &m));
        assert_int_equal(m.type, QMP_MESSAGE_RETURN);
        assert_true(m.has_id);
        assert_int_equal(m.id, 7);
        assert_true(json_is_true(json_object_get(m.value, "running")));
        qmp_message_done(&m);

        s = "{\"error\": {\"class\": \"GenericError\", \"desc\": \"no\"}, \"id\": 8}";
        assert_ok(qmp_parse_message(s, strlen(s), &m));
        assert_int_equal(m.type, QMP_MESSAGE_ERROR);
        assert_string_equal(m.error_class, "GenericError");
        assert_string_equal(m.error_desc, "no");
        assert_int_equal(m.id, 8);
        qmp_message_done(&m);

        s = "{\"event\": \"POWERDOWN\", \"timestamp\": {\"seconds\": 1, \"microseconds\": 2}}";
        assert_ok(qmp_parse_message(s, strlen(s), &m));
        assert_int_equal(m.type, QMP_MESSAGE_EVENT);
        assert_string_equal(m.event, "POWERDOWN");
        assert_null(m.value);
        qmp_message_done(&m);

        /* An id that cannot be ours parses, but names no command. */
        s = "{\"return\": {}, \"id\": \"abc\"}";
        assert_ok(qmp_parse_message(s, strlen(s), &m));
        assert_false(m.has_id);
        qmp_message_done(&m);
        s = "{\"return\": {}, \"id\": -3}";
        assert_ok(qmp_parse_message(s, strlen(s), &m));
        assert_false(m.has_id);
        qmp_message_done(&m);

        /* Only the given length counts: the rest of the buffer is the next line. */
        s = "{\"return\": 1}\n{\"return\": 2}";
        assert_ok(qmp_parse_message(s, 13, &m));
        assert_int_equal(json_integer_value(m.value), 1);
        qmp_message_done(&m);

        assert_errno(qmp_parse_message("", 0, &m), -ENODATA);
        assert_errno(qmp_parse_message(" \r", 2, &m), -ENODATA);
        assert_errno(qmp_parse_message("{", 1, &m), -EBADMSG);
        assert_errno(qmp_parse_message("[]", 2, &m), -EBADMSG);
        assert_errno(qmp_parse_message("\"x\"", 3, &m), -EBADMSG);
        assert_errno(qmp_parse_message("{}", 2, &m), -EBADMSG);
        assert_errno(qmp_parse_message("{} {}", 5, &m), -EBADMSG);
        assert_errno(qmp_parse_message("{\"return\": {}}\0", 15, &m), -EBADMSG);
        s = "{\"return\": 1, \"return\": 2}";
        assert_errno(qmp_parse_message(s, strlen(s), &m), -EBADMSG);
        s = "{\"return\": {}, \"error\": {\"class\": \"a\", \"desc\": \"b\"}}";
        assert_errno(qmp_parse_message(s, strlen(s), &m), -EBADMSG);
        s = "{\"error\": {\"class\": \"a\"}}";
        assert_errno(qmp_parse_message(s, strlen(s), &m), -EBADMSG);
        s = "{\"event\": \"\"}";
        assert_errno(qmp_parse_message(s, strlen(s), &m), -EBADMSG);
        s = "{\"event\": \"X\", \"data\": [1]}";
        assert_errno(qmp_parse_message(s, strlen(s), &m), -EBADMSG);
        s = "{\"QMP\": 1}";
        assert_errno(qmp_parse_message(s, strlen(s), &m), -EBADMSG);
        assert_null(m.root);

        big = malloc(QMP_LINE_MAX + 1);
        assert_non_null(big);
        memset(big, ' ', QMP_LINE_MAX + 1);
        assert_errno(qmp_parse_message(big, QMP_LINE_MAX + 1, &m), -EMSGSIZE);
        assert_errno(qmp_parse_message(big, QMP_LINE_MAX, &m), -ENODATA);

        assert_string_equal(qmp_message_type_to_string(QMP_MESSAGE_EVENT), "event");
        assert_int_equal(qmp_message_type_from_string("error"), QMP_MESSAGE_ERROR);
        assert_int_equal(qmp_message_type_from_string("nope"), _QMP_MESSAGE_TYPE_INVALID);
        assert_null(qmp_message_type_to_string(_QMP_MESSAGE_TYPE_MAX));
}

/* QEMU prints uint64 values past json_int_t (the balloon's guest-stats, before the guest reports
 * any): the reply still parses, its id stays an id, its ordinary numbers integers. */
static void test_parse_uint64(void **state) {
        _cleanup_(qmp_message_done) QmpMessage m = QMP_MESSAGE_NULL;
        json_t *stats;
        const char *s;

        s = "{\"return\": {\"stats\": {\"stat-free-memory\": 18446744073709551615, "
            "\"stat-total-memory\": 2061062144, \"list\": [18446744073709551615, 3, 0.5]}, "
            "\"last-update\": 0}, \"id\": 12}";
        assert_ok(qmp_parse_message(s, strlen(s), &m));
        assert_int_equal(m.type, QMP_MESSAGE_RETURN);
        assert_true(m.has_id);
        assert_int_equal(m.id, 12);
        stats = json_object_get(m.value, "stats");
        assert_true(json_is_real(json_object_get(stats, "stat-free-memory")));
        assert_true(json_real_value(json_object_get(stats, "stat-free-memory")) >= 18446744073709551615.0);
        assert_true(json_is_integer(json_object_get(stats, "stat-total-memory")));
        assert_int_equal(json_integer_value(json_object_get(stats, "stat-total-memory")), 2061062144);
        assert_true(json_is_integer(json_object_get(m.value, "last-update")));
        assert_true(json_is_real(json_array_get(json_object_get(stats, "list"), 0)));
        assert_int_equal(json_integer_value(json_array_get(json_object_get(stats, "list"), 1)), 3);
        assert_true(json_is_real(json_array_get(json_object_get(stats, "list"), 2)));
        qmp_message_done(&m);

        /* still one message with one meaning */
        s = "{\"return\": 18446744073709551615, \"return\": 1}";
        assert_errno(qmp_parse_message(s, strlen(s), &m), -EBADMSG);
        s = "{\"return\": 1e999999}";
        assert_errno(qmp_parse_message(s, strlen(s), &m), -EBADMSG);
}

static void test_connect_errors(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *long_path = NULL;
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_un sa;
        int len;

        assert_errno(qmp_client_connect(&f->client, f->event, f->fake.path, NULL, NULL, NULL), -ENOENT);

        /* A stale socket nobody listens on. */
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        len = sockaddr_un_set_path(&sa, f->fake.path);
        assert_ok(len);
        assert_int_equal(bind(fd, (struct sockaddr *) &sa, (socklen_t) len), 0);
        assert_errno(qmp_client_connect(&f->client, f->event, f->fake.path, NULL, NULL, NULL), -ECONNREFUSED);

        long_path = malloc(200);
        assert_non_null(long_path);
        memset(long_path, 'a', 199);
        long_path[199] = 0;
        assert_errno(qmp_client_connect(&f->client, f->event, long_path, NULL, NULL, NULL), -ENAMETOOLONG);
        assert_errno(qmp_client_connect(&f->client, NULL, f->fake.path, NULL, NULL, NULL), -EINVAL);
        assert_null(f->client);
}

static void test_handshake_and_close(void **state) {
        Fixture *f = *state;

        start(f, "handshake");
        assert_false(qmp_client_is_ready(f->client));
        RUN_UNTIL(f, qmp_client_is_ready(f->client));
        assert_true(script_done(f));
        assert_int_equal(f->n_events, 0);

        qmp_client_close(f->client);
        assert_false(qmp_client_is_ready(f->client));
        assert_int_equal(f->n_disconnect, 1);
        assert_int_equal(f->n_events, 1);
        assert_string_equal(f->events[0], "SHUTDOWN");
        assert_null(f->event_data[0]);
        assert_true(f->event_seq[0] < f->disconnect_seq);

        /* Idempotent, and nothing is accepted any more. */
        qmp_client_close(f->client);
        assert_int_equal(f->n_disconnect, 1);
        assert_int_equal(f->n_events, 1);
        assert_errno(qmp_client_execute(f->client, "query-status", NULL, 0, on_reply, &f->calls[0]), -ENOTCONN);

        RUN_UNTIL(f, f->fake.closed); /* the server sees us leave */
}

static void test_query_status(void **state) {
        Fixture *f = *state;

        start(f, "query-status");
        /* Issued before the greeting: queued, sent after qmp_capabilities (the transcript checks). */
        execute(f, 0, "query-status", NULL, 0);
        RUN_UNTIL(f, f->calls[0].done);
        assert_ok(f->calls[0].error);
        assert_string_equal(
                f->calls[0].result, "{\"running\":true,\"singlestep\":false,\"status\":\"running\"}");
        assert_null(f->calls[0].desc);
        assert_true(qmp_client_is_ready(f->client));
        assert_int_equal(f->n_disconnect, 0);
}

static void test_powerdown(void **state) {
        Fixture *f = *state;

        start(f, "powerdown");
        RUN_UNTIL(f, qmp_client_is_ready(f->client));
        execute(f, 0, "system_powerdown", NULL, 0);
        RUN_UNTIL(f, f->n_disconnect > 0);

        assert_ok(f->calls[0].error);
        assert_string_equal(f->calls[0].result, "{}");
        assert_int_equal(f->n_events, 3);
        assert_string_equal(f->events[0], "POWERDOWN");
        assert_null(f->event_data[0]);
        assert_string_equal(f->events[1], "SHUTDOWN");
        assert_string_equal(f->event_data[1], "{\"guest\":true,\"reason\":\"guest-shutdown\"}");
        assert_string_equal(f->events[2], "SHUTDOWN"); /* the synthetic one */
        assert_null(f->event_data[2]);
        assert_true(f->calls[0].seq < f->event_seq[0]);
        assert_true(f->event_seq[2] < f->disconnect_seq);

        run_for(f, 50 * USEC_PER_MSEC);
        assert_int_equal(f->n_disconnect, 1);
        assert_int_equal(f->n_events, 3);
}

static void test_error_reply(void **state) {
        Fixture *f = *state;
        json_auto_t *args = json_pack("{s:s}", "id", "nope"), *array = json_array();

        assert_non_null(args);
        assert_non_null(array);
        start(f, "error");
        execute(f, 0, "device_del", args, 0);
        assert_int_equal(args->refcount, 1); /* borrowed: serialised at once, neither kept nor stolen */
        RUN_UNTIL(f, f->calls[0].done);
        assert_errno(f->calls[0].error, -EIO);
        assert_string_equal(f->calls[0].desc, "Device 'nope' not found");
        assert_null(f->calls[0].result);
        assert_true(qmp_client_is_ready(f->client));

        assert_errno(qmp_client_execute(f->client, "", NULL, 0, NULL, NULL), -EINVAL);
        assert_errno(qmp_client_execute(f->client, "x", array, 0, NULL, NULL), -EINVAL);
}

static void test_timeout(void **state) {
        Fixture *f = *state;
        usec_t t0;

        start(f, "timeout");
        RUN_UNTIL(f, qmp_client_is_ready(f->client));
        t0 = loop_now(f);
        execute(f, 0, "query-status", NULL, 50 * USEC_PER_MSEC);
        RUN_UNTIL(f, f->calls[0].done);
        assert_errno(f->calls[0].error, -ETIMEDOUT);
        assert_true(loop_now(f) - t0 >= 50 * USEC_PER_MSEC);
        assert_true(script_done(f));

        /* The client stays usable. */
        assert_true(qmp_client_is_ready(f->client));
        assert_int_equal(f->n_disconnect, 0);
}

static void test_hangup(void **state) {
        Fixture *f = *state;

        start(f, "hangup");
        execute(f, 0, "query-status", NULL, 0);
        execute(f, 1, "query-name", NULL, 0);
        RUN_UNTIL(f, f->n_disconnect > 0);

        assert_errno(f->calls[0].error, -ECONNRESET);
        assert_errno(f->calls[1].error, -ECONNRESET);
        assert_int_equal(f->n_events, 1);
        assert_string_equal(f->events[0], "SHUTDOWN");
        assert_null(f->event_data[0]);
        /* Pending commands fail first, then SHUTDOWN, then on_disconnect. */
        assert_true(f->calls[1].seq < f->event_seq[0]);
        assert_true(f->event_seq[0] < f->disconnect_seq);

        qmp_client_close(f->client);
        run_for(f, 30 * USEC_PER_MSEC);
        assert_int_equal(f->n_disconnect, 1);
        assert_int_equal(f->n_events, 1);
}

static void test_out_of_order(void **state) {
        Fixture *f = *state;

        start(f, "out-of-order");
        execute(f, 0, "query-status", NULL, 0);
        execute(f, 1, "query-name", NULL, 0);
        execute(f, 2, "query-version", NULL, 0);
        RUN_UNTIL(f, f->calls[0].done && f->calls[1].done && f->calls[2].done);

        assert_string_equal(
                f->calls[0].result, "{\"running\":true,\"singlestep\":false,\"status\":\"running\"}");
        assert_string_equal(f->calls[1].result, "{\"name\":\"vm-1\"}");
        assert_string_equal(
                f->calls[2].result,
                "{\"package\":\"Debian 1:7.2+dfsg-7+deb12u18\",\"qemu\":{\"major\":7,\"micro\":0,\"minor\":2}}");
        assert_true(f->calls[2].seq < f->calls[0].seq);
        assert_true(f->calls[0].seq < f->calls[1].seq);
}

static void test_split_and_batched(void **state) {
        Fixture *f = *state;

        start(f, "split");
        execute(f, 0, "query-status", NULL, 0);
        RUN_UNTIL(f, f->n_events == 3);

        assert_ok(f->calls[0].error);
        assert_string_equal(
                f->calls[0].result, "{\"running\":true,\"singlestep\":false,\"status\":\"running\"}");
        assert_string_equal(f->events[0], "STOP");
        assert_string_equal(f->events[1], "RESUME");
        assert_string_equal(f->events[2], "RESET");
        assert_string_equal(f->event_data[2], "{\"guest\":true,\"reason\":\"guest-reset\"}");
        assert_true(script_done(f));
        assert_int_equal(f->n_disconnect, 0);
}

static int on_listen_later(sd_event_source *s, uint64_t usec, void *userdata) {
        Fixture *f = userdata;

        fake_listen(&f->fake);
        return 0;
}

static void test_connect_retry(void **state) {
        Fixture *f = *state;
        usec_t t0 = loop_now(f);

        /* QEMU's socket appears 100 ms after we start trying. */
        fake_load(&f->fake, "query-status");
        assert_int_equal(
                sd_event_add_time_relative(
                        f->event, &f->listen_later, CLOCK_MONOTONIC, 100 * USEC_PER_MSEC, 1, on_listen_later, f),
                0);
        assert_ok(qmp_client_connect_retry(
                &f->client, f->event, f->fake.path, on_event, on_disconnect, f, 2 * USEC_PER_SEC, on_ready));
        execute(f, 0, "query-status", NULL, 0);

        RUN_UNTIL(f, f->calls[0].done);
        assert_int_equal(f->n_ready, 1);
        assert_ok(f->ready_error);
        assert_true(f->ready_at - t0 >= 100 * USEC_PER_MSEC);
        assert_ok(f->calls[0].error);
        assert_int_equal(f->fake.n_accepted, 1);

        /* Once ready, a retry client ends like any other. */
        qmp_client_close(f->client);
        assert_int_equal(f->n_disconnect, 1);
        assert_int_equal(f->n_events, 1);
        assert_int_equal(f->n_ready, 1);
}

static void test_connect_retry_timeout(void **state) {
        Fixture *f = *state;
        usec_t t0 = loop_now(f);

        assert_ok(qmp_client_connect_retry(
                &f->client, f->event, f->fake.path, on_event, on_disconnect, f, 100 * USEC_PER_MSEC, on_ready));
        execute(f, 0, "query-status", NULL, 0);
        RUN_UNTIL(f, f->n_ready > 0);

        assert_errno(f->ready_error, -ETIMEDOUT);
        assert_true(f->ready_at - t0 >= 100 * USEC_PER_MSEC);
        assert_errno(f->calls[0].error, -ECONNRESET);
        assert_true(f->calls[0].seq < f->ready_seq); /* pending commands fail first */
        /* It was never connected: no SHUTDOWN, no on_disconnect. */
        assert_int_equal(f->n_events, 0);
        assert_int_equal(f->n_disconnect, 0);

        qmp_client_close(f->client);
        run_for(f, 50 * USEC_PER_MSEC);
        assert_int_equal(f->n_ready, 1);
        assert_int_equal(f->n_disconnect, 0);
}

static void test_capabilities_refused(void **state) {
        Fixture *f = *state;

        fake_load(&f->fake, "capabilities-error");
        fake_listen(&f->fake);
        assert_ok(qmp_client_connect_retry(
                &f->client, f->event, f->fake.path, on_event, on_disconnect, f, 0, on_ready));
        RUN_UNTIL(f, f->n_ready > 0);
        assert_errno(f->ready_error, -EPROTO);
        assert_false(qmp_client_is_ready(f->client));
        assert_int_equal(f->n_disconnect, 0);
        RUN_UNTIL(f, f->fake.closed);
}

static void test_bad_greeting(void **state) {
        Fixture *f = *state;

        start(f, "bad-greeting");
        execute(f, 0, "query-status", NULL, 0);
        RUN_UNTIL(f, f->n_disconnect > 0);
        assert_errno(f->calls[0].error, -ECONNRESET);
        assert_int_equal(f->n_events, 1);
        assert_false(qmp_client_is_ready(f->client));
        assert_int_equal(f->fake.n_extra, 0); /* the queued command never went out */
}

static void test_garbage(void **state) {
        Fixture *f = *state;

        start(f, "garbage");
        execute(f, 0, "query-status", NULL, 0);
        RUN_UNTIL(f, f->n_disconnect > 0);
        assert_errno(f->calls[0].error, -ECONNRESET);
        assert_int_equal(f->n_events, 1);
}

static void test_oversize_line(void **state) {
        Fixture *f = *state;

        start(f, "oversize");
        RUN_UNTIL(f, qmp_client_is_ready(f->client));
        execute(f, 0, "query-status", NULL, 0);
        RUN_UNTIL(f, f->n_disconnect > 0);
        assert_errno(f->calls[0].error, -ECONNRESET);
        assert_int_equal(f->n_events, 1);
        assert_string_equal(f->events[0], "SHUTDOWN");
        RUN_UNTIL(f, f->fake.closed);
}

static void test_pending_limit(void **state) {
        Fixture *f = *state;

        start(f, "handshake");
        for (unsigned i = 0; i < QMP_PENDING_MAX; i++)
                execute(f, i, "query-status", NULL, 0);
        assert_errno(
                qmp_client_execute(f->client, "query-status", NULL, 0, on_reply, &f->calls[QMP_PENDING_MAX]),
                -EBUSY);
        RUN_UNTIL(f, f->fake.n_extra == QMP_PENDING_MAX);

        qmp_client_close(f->client);
        for (unsigned i = 0; i < QMP_PENDING_MAX; i++)
                assert_errno(f->calls[i].error, -ECONNRESET);
        assert_false(f->calls[QMP_PENDING_MAX].done);
        assert_int_equal(f->n_disconnect, 1);
        assert_int_equal(f->n_events, 1);
}

static void test_unref_in_reply(void **state) {
        Fixture *f = *state;

        start(f, "query-status");
        execute(f, 0, "query-status", NULL, 0);
        f->unref_in_reply = true; /* the callback drops the only reference */
        RUN_UNTIL(f, f->calls[0].done);
        assert_null(f->client);
        assert_ok(f->calls[0].error);
        run_for(f, 30 * USEC_PER_MSEC);
        assert_int_equal(f->n_disconnect, 0);
        assert_int_equal(f->n_events, 0);
}

static void test_unref_in_disconnect(void **state) {
        Fixture *f = *state;

        start(f, "hangup");
        execute(f, 0, "query-status", NULL, 0);
        execute(f, 1, "query-name", NULL, 0);
        f->unref_in_disconnect = true;
        RUN_UNTIL(f, f->n_disconnect > 0);
        assert_null(f->client);
        assert_errno(f->calls[1].error, -ECONNRESET);
        run_for(f, 30 * USEC_PER_MSEC);
}

static void test_unref_with_pending(void **state) {
        Fixture *f = *state;

        start(f, "timeout");
        execute(f, 0, "query-status", NULL, 0);
        RUN_UNTIL(f, script_done(f));
        f->client = qmp_client_unref(f->client);
        /* The reply callback still runs, so its userdata can be released; the owner hears nothing. */
        assert_true(f->calls[0].done);
        assert_errno(f->calls[0].error, -ECONNRESET);
        assert_int_equal(f->n_disconnect, 0);
        assert_int_equal(f->n_events, 0);
        RUN_UNTIL(f, f->fake.closed);
}

int main(void) {
        const char *level = getenv("VM_MANAGER_LOG_LEVEL"); /* debug shows the client's view */
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse_message),
                cmocka_unit_test(test_parse_uint64),
                cmocka_unit_test_setup_teardown(test_connect_errors, setup, teardown),
                cmocka_unit_test_setup_teardown(test_handshake_and_close, setup, teardown),
                cmocka_unit_test_setup_teardown(test_query_status, setup, teardown),
                cmocka_unit_test_setup_teardown(test_powerdown, setup, teardown),
                cmocka_unit_test_setup_teardown(test_error_reply, setup, teardown),
                cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
                cmocka_unit_test_setup_teardown(test_hangup, setup, teardown),
                cmocka_unit_test_setup_teardown(test_out_of_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_split_and_batched, setup, teardown),
                cmocka_unit_test_setup_teardown(test_connect_retry, setup, teardown),
                cmocka_unit_test_setup_teardown(test_connect_retry_timeout, setup, teardown),
                cmocka_unit_test_setup_teardown(test_capabilities_refused, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_greeting, setup, teardown),
                cmocka_unit_test_setup_teardown(test_garbage, setup, teardown),
                cmocka_unit_test_setup_teardown(test_oversize_line, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pending_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unref_in_reply, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unref_in_disconnect, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unref_with_pending, setup, teardown),
        };

        if (level && log_level_from_string(level) >= 0)
                log_set_max_level(log_level_from_string(level));
        return cmocka_run_group_tests(tests, NULL, NULL);
}
