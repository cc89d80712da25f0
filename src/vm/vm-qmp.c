/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cleanup.h"
#include "log.h"
#include "socket-util.h"
#include "string-table.h"
#include "vm-qmp.h"

/* How much one read asks for. The input buffer holds at most one unfinished line (QMP_LINE_MAX)
 * plus one read. */
#define QMP_READ_SIZE ((size_t) 64 * 1024)

/* ---- Messages ---- */

static const char *const qmp_message_type_table[_QMP_MESSAGE_TYPE_MAX] = {
        [QMP_MESSAGE_GREETING] = "greeting",
        [QMP_MESSAGE_RETURN] = "return",
        [QMP_MESSAGE_ERROR] = "error",
        [QMP_MESSAGE_EVENT] = "event",
};

DEFINE_STRING_TABLE_LOOKUP(qmp_message_type, QmpMessageType);

void qmp_message_done(QmpMessage *m) {
        if (!m)
                return;
        json_decref(m->root);
        *m = QMP_MESSAGE_NULL;
}

static bool is_blank(const char *s, size_t len) {
        for (size_t i = 0; i < len; i++)
                if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
                        return false;
        return true;
}

/* A real that holds a whole value of json_int_t's range; -2^63 and 2^63 are exact doubles, so the
 * range test is exact too. */
static bool real_is_integer(const json_t *v, json_int_t *ret) {
        double d = json_real_value(v);

        if (!json_is_real(v) || !(d >= -9223372036854775808.0 && d < 9223372036854775808.0) ||
            d != (double) (json_int_t) d)
                return false;
        *ret = (json_int_t) d;
        return true;
}

static int restore_integers(json_t *v);

/* What item becomes: a new integer for a whole real (*ret), else NULL and item with its inside
 * restored. Returns 0 or -ENOMEM. */
static int restore_item(json_t *item, json_t **ret) {
        json_int_t n;

        *ret = NULL;
        if (!real_is_integer(item, &n))
                return restore_integers(item);
        *ret = json_integer(n);
        return *ret ? 0 : -ENOMEM;
}

/* After a parse with JSON_DECODE_INT_AS_REAL: every number that is a whole value of json_int_t's range
 * an integer again, so that ids and ordinary counts read as before. The depth is jansson's parser's
 * limit. Returns 0 or -ENOMEM. */
static int restore_integers(json_t *v) {
        json_t *n;

        if (json_is_object(v)) {
                for (void *iter = json_object_iter(v); iter; iter = json_object_iter_next(v, iter)) {
                        if (restore_item(json_object_iter_value(iter), &n) < 0)
                                return -ENOMEM;
                        if (n && json_object_iter_set_new(v, iter, n) < 0)
                                return -ENOMEM;
                }
        } else if (json_is_array(v)) {
                for (size_t i = 0; i < json_array_size(v); i++) {
                        if (restore_item(json_array_get(v, i), &n) < 0)
                                return -ENOMEM;
                        if (n && json_array_set_new(v, i, n) < 0)
                                return -ENOMEM;
                }
        }
        return 0;
}

int qmp_parse_message(const char *line, size_t len, QmpMessage *ret) {
        json_auto_t *root = NULL;
        QmpMessage m = QMP_MESSAGE_NULL;
        json_error_t error;
        json_t *v, *id;
        unsigned kinds = 0;

        assert_return(line || len == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        if (len > QMP_LINE_MAX)
                return -EMSGSIZE;
        if (is_blank(line, len))
                return -ENODATA;

        /* Without JSON_DECODE_ANY only an object or array is accepted, and trailing bytes are
         * rejected; duplicate keys would make the message mean two things. */
        root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &error);
        if (!root && json_error_code(&error) == json_error_numeric_overflow) {
                /* QEMU prints uint64 values past json_int_t: the balloon's guest-stats say "not
                 * reported" with 18446744073709551615. Such a message is read with its numbers as
                 * doubles, and the whole ones that fit json_int_t are integers again: only the values
                 * past it stay reals (rounded; whole values up to 2^53 are exact either way). */
                root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &error);
                if (root && restore_integers(root) < 0)
                        return -ENOMEM;
        }
        if (!root)
                return json_error_code(&error) == json_error_out_of_memory ? -ENOMEM : -EBADMSG;
        if (!json_is_object(root))
                return -EBADMSG;

        if (json_object_get(root, "QMP")) {
                m.type = QMP_MESSAGE_GREETING;
                kinds++;
        }
        if (json_object_get(root, "event")) {
                m.type = QMP_MESSAGE_EVENT;
                kinds++;
        }
        if (json_object_get(root, "return")) {
                m.type = QMP_MESSAGE_RETURN;
                kinds++;
        }
        if (json_object_get(root, "error")) {
                m.type = QMP_MESSAGE_ERROR;
                kinds++;
        }
        if (kinds != 1)
                return -EBADMSG;

        switch (m.type) {
        case QMP_MESSAGE_GREETING:
                m.value = json_object_get(root, "QMP");
                if (!json_is_object(m.value))
                        return -EBADMSG;
                break;

        case QMP_MESSAGE_EVENT:
                m.event = json_string_value(json_object_get(root, "event"));
                if (!m.event || m.event[0] == 0)
                        return -EBADMSG;
                m.value = json_object_get(root, "data");
                if (m.value && !json_is_object(m.value))
                        return -EBADMSG;
                break;

        case QMP_MESSAGE_RETURN:
                m.value = json_object_get(root, "return");
                break;

        case QMP_MESSAGE_ERROR:
                v = json_object_get(root, "error");
                m.error_class = json_string_value(json_object_get(v, "class"));
                m.error_desc = json_string_value(json_object_get(v, "desc"));
                if (!json_is_object(v) || !m.error_class || !m.error_desc)
                        return -EBADMSG;
                break;

        default:
                assert(false);
        }

        /* QEMU echoes whatever "id" the command carried. Ours are integers from 1 up; anything else
         * cannot be an answer to us. */
        id = json_object_get(root, "id");
        if (json_is_integer(id) && json_integer_value(id) >= 0) {
                m.has_id = true;
                m.id = (uint64_t) json_integer_value(id);
        }

        m.root = TAKE_PTR(root);
        *ret = m;
        return 0;
}

/* Serialises one command as a single line ending in '\n'. */
static int qmp_format_command(const char *command, json_t *args, uint64_t id, char **ret, size_t *ret_len) {
        json_auto_t *v = NULL;
        _cleanup_free_ char *s = NULL;
        json_t *name;
        size_t n;
        char *p;

        v = json_object();
        if (!v)
                return -ENOMEM;
        name = json_string(command);
        if (!name)
                return -EINVAL; /* not UTF-8 */
        if (json_object_set_new(v, "execute", name) < 0)
                return -ENOMEM;
        if (args && json_object_set(v, "arguments", args) < 0)
                return -ENOMEM;
        if (json_object_set_new(v, "id", json_integer((json_int_t) id)) < 0)
                return -ENOMEM;

        /* Compact output escapes control characters in strings, so the line holds no '\n'. */
        s = json_dumps(v, JSON_COMPACT);
        if (!s)
                return -ENOMEM;
        n = strlen(s);
        p = realloc(s, n + 2);
        if (!p)
                return -ENOMEM;
        s = p;
        s[n++] = '\n';
        s[n] = 0;

        *ret = TAKE_PTR(s);
        *ret_len = n;
        return 0;
}

/* ---- The client ---- */

typedef enum QmpClientState {
        QMP_CLIENT_WAITING,      /* connect_retry: no connection yet, the next attempt is on a timer */
        QMP_CLIENT_GREETING,     /* connected, waiting for the greeting */
        QMP_CLIENT_CAPABILITIES, /* qmp_capabilities sent, waiting for its reply */
        QMP_CLIENT_RUNNING,      /* commands flow */
        QMP_CLIENT_DISCONNECTED,
        _QMP_CLIENT_STATE_MAX,
        _QMP_CLIENT_STATE_INVALID = -EINVAL,
} QmpClientState;

typedef struct QmpPending QmpPending;

/* One command awaiting its reply. */
struct QmpPending {
        QmpClient *client;
        uint64_t id;
        char *command; /* for logs */
        char *line;    /* the request while it waits for the handshake to end; NULL once queued */
        size_t line_len;
        QmpReplyFunc callback;
        void *userdata;
        sd_event_source *timer;
        QmpPending *prev, *next;
};

struct QmpClient {
        unsigned n_ref;
        sd_event *event;
        char *socket_path;
        int fd;
        QmpClientState state;

        sd_event_source *io_source;
        sd_event_source *defer_source;    /* runs qmp_client_process() while it makes progress */
        sd_event_source *retry_source;    /* connect_retry: the next connect attempt */
        sd_event_source *deadline_source; /* connect_retry: end of the wait for the handshake */

        char *obuf; /* bytes not yet written */
        size_t olen;
        char *ibuf; /* [istart, ilen) is unconsumed input; [istart, iscan) holds no '\n' */
        size_t istart, iscan, ilen, icap;
        bool read_eof;
        bool write_failed; /* the peer stopped reading; output is dropped, input read to EOF */

        uint64_t next_id;
        uint64_t capabilities_id;
        QmpPending *pending_first, *pending_last; /* in id order */
        unsigned n_pending;

        QmpEventFunc on_event;
        QmpDisconnectFunc on_disconnect;
        QmpReadyFunc on_ready;
        bool ready_owed; /* on_ready has not been called yet */
        void *userdata;
};

static usec_t usec_add(usec_t a, usec_t b) {
        return a > USEC_INFINITY - b ? USEC_INFINITY : a + b;
}

static QmpPending *qmp_pending_free(QmpPending *p) {
        if (!p)
                return NULL;
        sd_event_source_disable_unref(p->timer);
        free(p->command);
        free(p->line);
        return mfree(p);
}

DEFINE_TRIVIAL_CLEANUP_FUNC(QmpPending *, qmp_pending_free);

static void qmp_client_unlink_pending(QmpClient *c, QmpPending *p) {
        if (p->prev)
                p->prev->next = p->next;
        else
                c->pending_first = p->next;
        if (p->next)
                p->next->prev = p->prev;
        else
                c->pending_last = p->prev;
        p->prev = p->next = NULL;
        assert(c->n_pending > 0);
        c->n_pending--;
}

static QmpPending *qmp_client_find_pending(QmpClient *c, uint64_t id) {
        /* At most QMP_PENDING_MAX entries. */
        for (QmpPending *p = c->pending_first; p; p = p->next)
                if (p->id == id)
                        return p;
        return NULL;
}

/* Unlinks p, calls its callback once and frees it. */
static void qmp_client_complete(QmpClient *c, QmpPending *p, int error, json_t *result, const char *desc) {
        _cleanup_(qmp_pending_freep) QmpPending *owned = p;

        qmp_client_unlink_pending(c, owned);
        owned->timer = sd_event_source_disable_unref(owned->timer);
        if (owned->callback)
                owned->callback(c, error, result, desc, owned->userdata);
}

static void qmp_client_detach(QmpClient *c) {
        c->io_source = sd_event_source_disable_unref(c->io_source);
        c->defer_source = sd_event_source_disable_unref(c->defer_source);
        c->retry_source = sd_event_source_disable_unref(c->retry_source);
        c->deadline_source = sd_event_source_disable_unref(c->deadline_source);
        c->fd = safe_close(c->fd);
        c->obuf = mfree(c->obuf);
        c->olen = 0;
        c->ibuf = mfree(c->ibuf);
        c->istart = c->iscan = c->ilen = c->icap = 0;
}

/* Ends the connection once: fails the pending commands, then tells the owner (unless notify is false,
 * as when the last reference goes). The caller holds a reference when notify is true. */
static void qmp_client_shutdown(QmpClient *c, int error, bool notify) {
        QmpPending *p;

        if (c->state == QMP_CLIENT_DISCONNECTED)
                return;
        c->state = QMP_CLIENT_DISCONNECTED; /* from here on execute() refuses, close() is a no-op */
        qmp_client_detach(c);

        while ((p = c->pending_first))
                qmp_client_complete(c, p, -ECONNRESET, /* result= */ NULL, /* desc= */ NULL);

        if (!notify)
                return;
        if (c->ready_owed) {
                c->ready_owed = false;
                c->on_ready(c, error, c->userdata);
                return;
        }
        if (c->on_event)
                c->on_event(c, "SHUTDOWN", /* data= */ NULL, c->userdata);
        if (c->on_disconnect)
                c->on_disconnect(c, c->userdata);
}

static QmpClient *qmp_client_free(QmpClient *c) {
        if (!c)
                return NULL;
        qmp_client_shutdown(c, -ECONNRESET, /* notify= */ false);
        sd_event_unref(c->event);
        free(c->socket_path);
        return mfree(c);
}

QmpClient *qmp_client_ref(QmpClient *c) {
        if (!c)
                return NULL;
        assert(c->n_ref > 0);
        c->n_ref++;
        return c;
}

QmpClient *qmp_client_unref(QmpClient *c) {
        if (!c)
                return NULL;
        assert(c->n_ref > 0);
        if (--c->n_ref > 0)
                return NULL;
        return qmp_client_free(c);
}

void qmp_client_close(QmpClient *c) {
        if (!c)
                return;
        _unused_ _cleanup_(qmp_client_unrefp) QmpClient *pin = qmp_client_ref(c);
        qmp_client_shutdown(c, -ECONNRESET, /* notify= */ true);
}

bool qmp_client_is_ready(QmpClient *c) {
        return c && c->state == QMP_CLIENT_RUNNING;
}

static int qmp_client_kick(QmpClient *c) {
        return sd_event_source_set_enabled(c->defer_source, SD_EVENT_ON);
}

static int qmp_client_queue_output(QmpClient *c, const char *data, size_t len) {
        char *p;
        int r;

        if (c->write_failed)
                return 0; /* nobody reads it; EOF is on its way */

        /* Kick first: on failure nothing was queued, so the caller can give up cleanly. */
        r = qmp_client_kick(c);
        if (r < 0)
                return r;
        p = realloc(c->obuf, c->olen + len);
        if (!p)
                return -ENOMEM;
        c->obuf = p;
        memcpy(c->obuf + c->olen, data, len);
        c->olen += len;
        return 0;
}

/* ---- Dispatch ---- */

static int qmp_client_send_capabilities(QmpClient *c) {
        _cleanup_free_ char *line = NULL;
        size_t len;
        int r;

        c->capabilities_id = c->next_id++;
        r = qmp_format_command("qmp_capabilities", /* args= */ NULL, c->capabilities_id, &line, &len);
        if (r < 0)
                return r;
        r = qmp_client_queue_output(c, line, len);
        if (r < 0)
                return r;
        c->state = QMP_CLIENT_CAPABILITIES;
        return 0;
}

static int qmp_client_enter_running(QmpClient *c) {
        int r;

        /* Commands issued during the handshake go out now, in the order they were issued. */
        for (QmpPending *p = c->pending_first; p; p = p->next) {
                if (!p->line)
                        continue;
                r = qmp_client_queue_output(c, p->line, p->line_len);
                if (r < 0)
                        return r;
                p->line = mfree(p->line);
        }

        c->state = QMP_CLIENT_RUNNING;
        c->retry_source = sd_event_source_disable_unref(c->retry_source);
        c->deadline_source = sd_event_source_disable_unref(c->deadline_source);
        log_debug("QMP at '%s' is ready.", c->socket_path);

        if (c->ready_owed) {
                c->ready_owed = false;
                c->on_ready(c, 0, c->userdata);
        }
        return 0;
}

static void qmp_client_dispatch_reply(QmpClient *c, QmpMessage *m) {
        QmpPending *p;

        if (!m->has_id) {
                log_debug(
                        "Ignoring QMP %s without a usable id from '%s'.",
                        qmp_message_type_to_string(m->type),
                        c->socket_path);
                return;
        }
        p = qmp_client_find_pending(c, m->id);
        if (!p || p->line) {
                log_debug(
                        "Ignoring QMP %s for unknown id %" PRIu64 " from '%s'.",
                        qmp_message_type_to_string(m->type),
                        m->id,
                        c->socket_path);
                return;
        }

        if (m->type == QMP_MESSAGE_ERROR) {
                log_debug("QMP command '%s' failed: %s: %s", p->command, m->error_class, m->error_desc);
                qmp_client_complete(c, p, -EIO, /* result= */ NULL, m->error_desc);
        } else
                qmp_client_complete(c, p, 0, m->value, /* desc= */ NULL);
}

static int qmp_client_dispatch(QmpClient *c, QmpMessage *m) {
        if (m->type == QMP_MESSAGE_EVENT) {
                /* QEMU should not send events before capabilities are negotiated; if it does, they
                 * are still events. */
                if (c->on_event)
                        c->on_event(c, m->event, m->value, c->userdata);
                return 0;
        }

        switch (c->state) {
        case QMP_CLIENT_GREETING:
                if (m->type != QMP_MESSAGE_GREETING)
                        return log_debug_errno(
                                SYNTHETIC_ERRNO(EPROTO),
                                "Expected a QMP greeting from '%s', got a %s.",
                                c->socket_path,
                                qmp_message_type_to_string(m->type));
                return qmp_client_send_capabilities(c);

        case QMP_CLIENT_CAPABILITIES:
                if (m->type == QMP_MESSAGE_GREETING)
                        return log_debug_errno(
                                SYNTHETIC_ERRNO(EPROTO), "Second QMP greeting from '%s'.", c->socket_path);
                if (!m->has_id || m->id != c->capabilities_id) {
                        qmp_client_dispatch_reply(c, m); /* logs and ignores it */
                        return 0;
                }
                if (m->type == QMP_MESSAGE_ERROR)
                        return log_debug_errno(
                                SYNTHETIC_ERRNO(EPROTO),
                                "qmp_capabilities at '%s' failed: %s",
                                c->socket_path,
                                m->error_desc);
                return qmp_client_enter_running(c);

        case QMP_CLIENT_RUNNING:
                if (m->type == QMP_MESSAGE_GREETING)
                        return log_debug_errno(
                                SYNTHETIC_ERRNO(EPROTO), "Second QMP greeting from '%s'.", c->socket_path);
                qmp_client_dispatch_reply(c, m);
                return 0;

        default:
                assert(false);
                return -EINVAL;
        }
}

/* ---- One processing step: write → parse and dispatch one line → read → EOF ---- */

static int qmp_client_write(QmpClient *c) {
        ssize_t n;

        if (c->olen == 0)
                return 0;

        n = send(c->fd, c->obuf, c->olen, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
                if (errno == EAGAIN)
                        return 0;
                if (errno == EINTR)
                        return 1;
                /* What the peer sent before it went away is still to be read; its EOF closes us. */
                log_debug_errno(errno, "Cannot write to QMP at '%s', dropping output: %m", c->socket_path);
                c->write_failed = true;
                c->obuf = mfree(c->obuf);
                c->olen = 0;
                return 1;
        }

        memmove(c->obuf, c->obuf + n, c->olen - (size_t) n);
        c->olen -= (size_t) n;
        return 1;
}

/* Takes one complete line from the input buffer and dispatches it. Returns 1 if it did, 0 if no line
 * is complete yet, < 0 on a protocol error. */
static int qmp_client_parse(QmpClient *c) {
        _cleanup_(qmp_message_done) QmpMessage m = QMP_MESSAGE_NULL;
        const char *start, *nl;
        int r;

        if (c->iscan < c->ilen)
                nl = memchr(c->ibuf + c->iscan, '\n', c->ilen - c->iscan);
        else
                nl = NULL;
        if (!nl) {
                c->iscan = c->ilen;
                if (c->ilen - c->istart > QMP_LINE_MAX)
                        return log_debug_errno(
                                SYNTHETIC_ERRNO(EMSGSIZE),
                                "QMP line from '%s' exceeds %zu bytes.",
                                c->socket_path,
                                QMP_LINE_MAX);
                return 0;
        }

        start = c->ibuf + c->istart;
        c->istart = c->iscan = (size_t) (nl + 1 - c->ibuf);

        r = qmp_parse_message(start, (size_t) (nl - start), &m);
        if (r == -ENODATA)
                return 1;
        if (r < 0)
                return log_debug_errno(r, "Invalid QMP message from '%s': %m", c->socket_path);

        /* The line is consumed; callbacks may close the client (freeing the buffer) from here on. */
        r = qmp_client_dispatch(c, &m);
        if (r < 0)
                return r;
        return 1;
}

static int qmp_client_read(QmpClient *c) {
        ssize_t n;

        if (c->read_eof)
                return 0;

        if (c->istart > 0) {
                memmove(c->ibuf, c->ibuf + c->istart, c->ilen - c->istart);
                c->ilen -= c->istart;
                c->iscan -= c->istart;
                c->istart = 0;
        }

        /* ilen <= QMP_LINE_MAX here (qmp_client_parse() checked), which bounds the buffer. */
        if (c->icap - c->ilen < QMP_READ_SIZE) {
                size_t cap = MAX(c->icap * 2, c->ilen + QMP_READ_SIZE);
                char *p;

                cap = MIN(cap, QMP_LINE_MAX + 1 + QMP_READ_SIZE);
                p = realloc(c->ibuf, cap);
                if (!p)
                        return -ENOMEM;
                c->ibuf = p;
                c->icap = cap;
        }

        n = recv(c->fd, c->ibuf + c->ilen, c->icap - c->ilen, MSG_DONTWAIT);
        if (n < 0) {
                if (errno == EAGAIN)
                        return 0;
                if (errno == EINTR)
                        return 1;
                return log_debug_errno(errno, "Cannot read from QMP at '%s': %m", c->socket_path);
        }
        if (n == 0) {
                c->read_eof = true; /* the complete lines still buffered are dispatched first */
                return 1;
        }
        c->ilen += (size_t) n;
        return 1;
}

static int qmp_client_process(QmpClient *c) {
        int r, q;

        assert(c);
        if (c->state == QMP_CLIENT_DISCONNECTED || c->fd < 0)
                return 0;

        /* A callback may drop the last reference. */
        _unused_ _cleanup_(qmp_client_unrefp) QmpClient *pin = qmp_client_ref(c);

        r = qmp_client_write(c);
        if (r == 0)
                r = qmp_client_parse(c);
        if (c->state == QMP_CLIENT_DISCONNECTED)
                return r; /* a callback closed us */
        if (r == 0)
                r = qmp_client_read(c);
        if (r == 0 && c->read_eof)
                r = log_debug_errno(
                        SYNTHETIC_ERRNO(ECONNRESET), "QMP at '%s' closed the connection.", c->socket_path);
        if (r < 0) {
                qmp_client_shutdown(c, r, /* notify= */ true);
                return r;
        }

        /* Keep stepping while there is progress; otherwise wait for the socket. */
        q = sd_event_source_set_enabled(c->defer_source, r > 0 ? SD_EVENT_ON : SD_EVENT_OFF);
        if (q >= 0)
                q = sd_event_source_set_io_events(c->io_source, EPOLLIN | (c->olen > 0 ? EPOLLOUT : 0));
        if (q < 0) {
                log_debug_errno(q, "Cannot rearm QMP event sources for '%s': %m", c->socket_path);
                qmp_client_shutdown(c, q, /* notify= */ true);
                return q;
        }
        return r;
}

static int on_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        (void) qmp_client_process(userdata);
        return 0;
}

static int on_defer(sd_event_source *s, void *userdata) {
        (void) qmp_client_process(userdata);
        return 0;
}

static int on_pending_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        QmpPending *p = userdata;
        QmpClient *c = p->client;

        assert(c);
        _unused_ _cleanup_(qmp_client_unrefp) QmpClient *pin = qmp_client_ref(c);

        /* A reply that still comes is ignored as one for an unknown id. */
        log_debug("QMP command '%s' (id %" PRIu64 ") at '%s' timed out.", p->command, p->id, c->socket_path);
        qmp_client_complete(c, p, -ETIMEDOUT, /* result= */ NULL, /* desc= */ NULL);
        return 0;
}

/* ---- Connecting ---- */

static bool connect_error_is_transient(int r) {
        /* No socket yet, a stale socket nobody listens on, or a full backlog. */
        return r == -ENOENT || r == -ECONNREFUSED || r == -EAGAIN;
}

static int qmp_client_try_connect(QmpClient *c) {
        _cleanup_close_ int fd = -EBADF;
        int r;

        /* A unix stream connect completes at once or fails; EINPROGRESS would surface as a read
         * error or the greeting, both of which we wait for anyway. */
        fd = unix_stream_connect(c->socket_path, /* nonblock= */ true);
        if (fd < 0)
                return fd;

        r = sd_event_add_io(c->event, &c->io_source, fd, EPOLLIN, on_io, c);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(c->io_source, "qmp-client-io");

        c->fd = TAKE_FD(fd);
        c->state = QMP_CLIENT_GREETING;
        log_debug("Connected to QMP at '%s'.", c->socket_path);
        return 0;
}

static int qmp_client_new(
        QmpClient **ret,
        sd_event *e,
        const char *socket_path,
        QmpEventFunc on_event,
        QmpDisconnectFunc on_disconnect,
        void *userdata) {

        _cleanup_(qmp_client_unrefp) QmpClient *c = NULL;
        int r;

        assert_return(ret, -EINVAL);
        assert_return(e, -EINVAL);
        assert_return(socket_path && socket_path[0], -EINVAL);

        if (strlen(socket_path) > SOCKADDR_UN_PATH_MAX)
                return -ENAMETOOLONG;

        c = malloc(sizeof(QmpClient));
        if (!c)
                return -ENOMEM;
        *c = (QmpClient){
                .n_ref = 1,
                .event = sd_event_ref(e),
                .fd = -EBADF,
                .state = QMP_CLIENT_WAITING,
                .next_id = 1,
                .on_event = on_event,
                .on_disconnect = on_disconnect,
                .userdata = userdata,
        };

        c->socket_path = strdup(socket_path);
        if (!c->socket_path)
                return -ENOMEM;

        r = sd_event_add_defer(e, &c->defer_source, on_defer, c);
        if (r < 0)
                return r;
        r = sd_event_source_set_enabled(c->defer_source, SD_EVENT_OFF);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(c->defer_source, "qmp-client-process");

        *ret = TAKE_PTR(c);
        return 0;
}

int qmp_client_connect(
        QmpClient **ret,
        sd_event *e,
        const char *socket_path,
        QmpEventFunc on_event,
        QmpDisconnectFunc on_disconnect,
        void *userdata) {

        _cleanup_(qmp_client_unrefp) QmpClient *c = NULL;
        int r;

        r = qmp_client_new(&c, e, socket_path, on_event, on_disconnect, userdata);
        if (r < 0)
                return r;

        r = qmp_client_try_connect(c);
        if (r < 0)
                return log_debug_errno(r, "Cannot connect to QMP at '%s': %m", socket_path);

        *ret = TAKE_PTR(c);
        return 0;
}

static int on_retry(sd_event_source *s, uint64_t usec, void *userdata) {
        QmpClient *c = userdata;
        int r;

        assert(c);
        _unused_ _cleanup_(qmp_client_unrefp) QmpClient *pin = qmp_client_ref(c);

        r = qmp_client_try_connect(c);
        if (r >= 0)
                return 0;
        if (connect_error_is_transient(r)) {
                r = sd_event_source_set_time_relative(s, QMP_CONNECT_RETRY_INTERVAL);
                if (r >= 0)
                        r = sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
                if (r >= 0)
                        return 0;
        }

        log_debug_errno(r, "Cannot connect to QMP at '%s': %m", c->socket_path);
        qmp_client_shutdown(c, r, /* notify= */ true);
        return 0;
}

static int on_deadline(sd_event_source *s, uint64_t usec, void *userdata) {
        QmpClient *c = userdata;

        assert(c);
        _unused_ _cleanup_(qmp_client_unrefp) QmpClient *pin = qmp_client_ref(c);

        log_debug("QMP at '%s' did not answer in time.", c->socket_path);
        qmp_client_shutdown(c, -ETIMEDOUT, /* notify= */ true);
        return 0;
}

int qmp_client_connect_retry(
        QmpClient **ret,
        sd_event *e,
        const char *socket_path,
        QmpEventFunc on_event,
        QmpDisconnectFunc on_disconnect,
        void *userdata,
        usec_t timeout,
        QmpReadyFunc on_ready) {

        _cleanup_(qmp_client_unrefp) QmpClient *c = NULL;
        usec_t now;
        int r;

        assert_return(on_ready, -EINVAL);

        r = qmp_client_new(&c, e, socket_path, on_event, on_disconnect, userdata);
        if (r < 0)
                return r;
        c->on_ready = on_ready;
        c->ready_owed = true;

        r = sd_event_now(e, CLOCK_MONOTONIC, &now);
        if (r < 0)
                return r;
        r = sd_event_add_time(
                e,
                &c->deadline_source,
                CLOCK_MONOTONIC,
                usec_add(now, timeout ?: QMP_TIMEOUT_DEFAULT),
                /* accuracy= */ 1,
                on_deadline,
                c);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(c->deadline_source, "qmp-client-deadline");

        r = qmp_client_try_connect(c);
        if (r < 0) {
                if (!connect_error_is_transient(r))
                        return log_debug_errno(r, "Cannot connect to QMP at '%s': %m", socket_path);

                r = sd_event_add_time_relative(
                        e,
                        &c->retry_source,
                        CLOCK_MONOTONIC,
                        QMP_CONNECT_RETRY_INTERVAL,
                        /* accuracy= */ 1,
                        on_retry,
                        c);
                if (r < 0)
                        return r;
                (void) sd_event_source_set_description(c->retry_source, "qmp-client-retry");
        }

        *ret = TAKE_PTR(c);
        return 0;
}

/* ---- Commands ---- */

int qmp_client_execute(
        QmpClient *c, const char *command, json_t *args, usec_t timeout, QmpReplyFunc cb, void *userdata) {

        _cleanup_(qmp_pending_freep) QmpPending *p = NULL;
        _cleanup_free_ char *line = NULL;
        size_t len;
        int r;

        assert_return(c, -EINVAL);
        assert_return(command && command[0], -EINVAL);
        assert_return(!args || json_is_object(args), -EINVAL);

        if (c->state == QMP_CLIENT_DISCONNECTED)
                return -ENOTCONN;
        if (c->n_pending >= QMP_PENDING_MAX)
                return -EBUSY;

        p = malloc(sizeof(QmpPending));
        if (!p)
                return -ENOMEM;
        *p = (QmpPending){
                .client = c,
                .id = c->next_id,
                .callback = cb,
                .userdata = userdata,
        };
        p->command = strdup(command);
        if (!p->command)
                return -ENOMEM;

        r = qmp_format_command(command, args, p->id, &line, &len);
        if (r < 0)
                return r;

        if (timeout == 0)
                timeout = QMP_TIMEOUT_DEFAULT;
        if (timeout != USEC_INFINITY) {
                usec_t now;

                r = sd_event_now(c->event, CLOCK_MONOTONIC, &now);
                if (r < 0)
                        return r;
                r = sd_event_add_time(
                        c->event,
                        &p->timer,
                        CLOCK_MONOTONIC,
                        usec_add(now, timeout),
                        /* accuracy= */ 1,
                        on_pending_timeout,
                        p);
                if (r < 0)
                        return r;
                (void) sd_event_source_set_description(p->timer, "qmp-command-timeout");
        }

        if (c->state == QMP_CLIENT_RUNNING) {
                r = qmp_client_queue_output(c, line, len);
                if (r < 0)
                        return r;
        } else {
                p->line = TAKE_PTR(line);
                p->line_len = len;
        }

        c->next_id++;
        p->prev = c->pending_last;
        if (c->pending_last)
                c->pending_last->next = p;
        else
                c->pending_first = p;
        c->pending_last = TAKE_PTR(p);
        c->n_pending++;
        return 0;
}
