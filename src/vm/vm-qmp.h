/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "cleanup.h"
#include "time-util.h"

/* A non-blocking QMP client on an sd-event loop: one unix socket, newline-delimited JSON, replies
 * matched to commands by "id", events delivered by name. Everything it touches belongs to the loop's
 * thread. The library logs at debug level only. */

#define QMP_LINE_MAX ((size_t) 1024 * 1024)            /* longer input lines close the connection */
#define QMP_PENDING_MAX 64U                            /* commands awaiting a reply, per client */
#define QMP_TIMEOUT_DEFAULT (10 * USEC_PER_SEC)        /* for a timeout of 0 */
#define QMP_CONNECT_RETRY_INTERVAL (5 * USEC_PER_MSEC) /* qmp_client_connect_retry() */

/* ---- Messages: the parser of the untrusted stream, one line at a time ---- */

typedef enum QmpMessageType {
        QMP_MESSAGE_GREETING, /* {"QMP": {...}} */
        QMP_MESSAGE_RETURN,   /* {"return": ..., "id": N} */
        QMP_MESSAGE_ERROR,    /* {"error": {"class": ..., "desc": ...}, "id": N} */
        QMP_MESSAGE_EVENT,    /* {"event": "NAME", "data": {...}, "timestamp": {...}} */
        _QMP_MESSAGE_TYPE_MAX,
        _QMP_MESSAGE_TYPE_INVALID = -EINVAL,
} QmpMessageType;

const char *qmp_message_type_to_string(QmpMessageType t);
QmpMessageType qmp_message_type_from_string(const char *s);

typedef struct QmpMessage {
        QmpMessageType type;
        json_t *root; /* the whole message; owned, released by qmp_message_done() */
        bool has_id;  /* RETURN/ERROR: "id" is a non-negative integer (ours always are) */
        uint64_t id;
        json_t *value;           /* GREETING: "QMP"; RETURN: "return"; EVENT: "data" or NULL. Borrowed */
        const char *event;       /* EVENT: its name. Borrowed */
        const char *error_class; /* ERROR. Borrowed */
        const char *error_desc;  /* ERROR. Borrowed */
} QmpMessage;

#define QMP_MESSAGE_NULL ((QmpMessage){ .type = _QMP_MESSAGE_TYPE_INVALID })

void qmp_message_done(QmpMessage *m);

/* Parses one line (without its '\n'; a trailing '\r' is allowed) into one QMP message: exactly one
 * JSON object with exactly one of "QMP", "event", "return", "error" and the types QMP prescribes.
 * Returns 0 and fills ret, or -ENODATA for a blank line, -EMSGSIZE for a line longer than
 * QMP_LINE_MAX, -EBADMSG for anything else that is not a QMP message, -ENOMEM. */
int qmp_parse_message(const char *line, size_t len, QmpMessage *ret);

/* ---- The client ---- */

typedef struct QmpClient QmpClient;

/* An event from QEMU. data is borrowed (valid during the call) and NULL when the event has none;
 * the synthetic SHUTDOWN sent when the connection ends has data NULL. */
typedef void (*QmpEventFunc)(QmpClient *c, const char *event, json_t *data, void *userdata);
/* The outcome of one command: error 0 with result (the "return" value, borrowed); -EIO for a QMP
 * "error" reply, with error_desc its "desc" (borrowed); -ETIMEDOUT; -ECONNRESET when the connection
 * ended first. Called exactly once per accepted command. */
typedef void (*QmpReplyFunc)(QmpClient *c, int error, json_t *result, const char *error_desc, void *userdata);
typedef void (*QmpDisconnectFunc)(QmpClient *c, void *userdata);
/* connect_retry: 0 once the handshake is done, or why it never will be (-ETIMEDOUT, -ECONNRESET,
 * -EPROTO, ...); after an error the client is closed (without SHUTDOWN/on_disconnect). */
typedef void (*QmpReadyFunc)(QmpClient *c, int error, void *userdata);

/* Connects (non-blocking, SOCK_CLOEXEC) to the unix socket and returns a new reference; the greeting
 * and qmp_capabilities follow on the loop. Commands issued before the handshake ends are queued and
 * sent after it, in order. Connection errors (-ENOENT, -ECONNREFUSED, ...) are returned directly.
 * All callbacks may be NULL, and any of them may drop the last reference. */
int qmp_client_connect(
        QmpClient **ret,
        sd_event *e,
        const char *socket_path,
        QmpEventFunc on_event,
        QmpDisconnectFunc on_disconnect,
        void *userdata);

/* Like qmp_client_connect(), but a missing or refusing socket is retried every
 * QMP_CONNECT_RETRY_INTERVAL (QEMU creates its socket a moment after exec) until the handshake
 * completes or timeout (usec; 0 = 10 s) passes.
 * on_ready (mandatory) is called exactly once. Returns a new reference. */
int qmp_client_connect_retry(
        QmpClient **ret,
        sd_event *e,
        const char *socket_path,
        QmpEventFunc on_event,
        QmpDisconnectFunc on_disconnect,
        void *userdata,
        usec_t timeout,
        QmpReadyFunc on_ready);

QmpClient *qmp_client_ref(QmpClient *c);
/* Dropping the last reference closes silently: pending commands still get -ECONNRESET (their
 * callbacks must not use c any more), but neither SHUTDOWN, on_disconnect nor on_ready is called. */
QmpClient *qmp_client_unref(QmpClient *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(QmpClient *, qmp_client_unref);

/* Sends {"execute":command,"arguments":args,"id":N}. args (an object, or NULL) is borrowed. The reply
 * arrives through cb (may be NULL), or -ETIMEDOUT after timeout (usec; 0 = 10 s, USEC_INFINITY =
 * none). Returns 0, -EBUSY with QMP_PENDING_MAX commands pending, -ENOTCONN once closed. */
int qmp_client_execute(
        QmpClient *c, const char *command, json_t *args, usec_t timeout, QmpReplyFunc cb, void *userdata);

/* Fails every pending command with -ECONNRESET, then emits a synthetic SHUTDOWN event (data NULL)
 * and on_disconnect, once (a connect_retry client not yet ready gets on_ready(-ECONNRESET) instead).
 * Idempotent. The peer closing, a protocol error or an oversize line end the connection the same way. */
void qmp_client_close(QmpClient *c);

/* True between the end of the handshake and the close. */
bool qmp_client_is_ready(QmpClient *c);
