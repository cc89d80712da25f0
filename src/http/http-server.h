/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "api-error.h"
#include "caller.h"
#include "cleanup.h"
#include "time-util.h"

/* libmicrohttpd driven from an sd-event loop: no threads of its own, one epoll fd in our loop.
 * Knows HTTP and the JSON error envelope, nothing of the routes built on it. */

typedef struct HttpServer HttpServer;
typedef struct HttpRequest HttpRequest;

/* Called once per request, after its whole body has arrived. Before returning, the handler either
 * replies (http_request_reply*()) or suspends the request (http_request_suspend()) and keeps a
 * reference to reply later; a request left without either gets a 500. */
typedef void (*HttpHandler)(HttpRequest *req, void *userdata);

typedef struct HttpServerOptions {
        const char *listen; /* "host:port", "[v6]:port" or ":port"; ignored when listen_fd >= 0 */
        int listen_fd;      /* an already listening socket (socket activation), or -EBADF */
        bool no_listen;     /* no socket of its own: connections come from http_server_add_connection() */
        size_t max_body;    /* bytes; larger bodies get 413 */
        unsigned max_connections;
        /* Connections one peer may hold: a TCP source address (an IPv6 /64), or the tag of a
         * connection handed in. A newcomer over the limit closes that peer's connection that has
         * waited longest for a request (still sending it, or idle), those that never had a request
         * answered first; when none is waiting, the newcomer is answered 503 and closed. With a
         * per-peer limit, max_connections works the same way against the peer holding the most,
         * instead of refusing to accept. 0: no per-peer limit, max_connections is a hard cap. */
        unsigned max_connections_per_peer;
        usec_t idle_timeout; /* closes connections without traffic for this long */
        /* A connection gets this long to deliver a request, headers and body, counted from its
         * opening or from its previous response, and this long to take each response: it is closed
         * past that, so that a client sending a byte at a time cannot hold it. Requests a handler
         * keeps (suspended), streams and files (http_request_reply_fd()) are exempt: a file goes
         * out as fast as the client reads it, and idle_timeout closes a client that stops. 0: no
         * such deadline. */
        usec_t request_timeout;
        HttpHandler handler;
        /* Optional: called with each request as soon as its headers are in, before a byte of its
         * body is read. It may refuse the request by replying (a limit the headers already show
         * exceeded): that answer goes out at once, the body is never read and the connection
         * closes. Or it returns without a reply and handler gets the request once the body is in.
         * It must not suspend. Gets userdata, as handler does. */
        HttpHandler early;
        void *userdata;
} HttpServerOptions;

#define HTTP_MAX_BODY_DEFAULT ((size_t) 8 << 20)
/* A request target (path and query) longer than this, or with more query arguments, gets 414. */
#define HTTP_MAX_TARGET ((size_t) 8192)
#define HTTP_MAX_QUERY_ARGS 64

int http_server_new(HttpServer **ret, sd_event *event, const HttpServerOptions *o, ApiError *reterr);
HttpServer *http_server_free(HttpServer *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(HttpServer *, http_server_free);

/* Serves a connection accepted elsewhere, say on a listener that is itself an identity (one per VM).
 * Takes fd, whatever happens. tag (copied) is what http_request_connection_tag() returns for every
 * request on that connection, and the peer that max_connections_per_peer counts it for. A tag
 * waits for MHD to announce its connection under the socket's number, which a server accepting on
 * a socket of its own could hand to another connection: a tag needs no_listen (-EINVAL). */
int http_server_add_connection(HttpServer *s, int fd, const char *tag);
/* The tag of the request's connection; NULL for a connection the server accepted itself. */
const char *http_request_connection_tag(HttpRequest *r);

/* The local address actually bound ("127.0.0.1:43817"), for logs and tests. Borrowed. */
const char *http_server_address(HttpServer *s);
/* Whether the server listens on a loopback address only (127.0.0.0/8 or ::1). */
bool http_server_is_loopback(HttpServer *s);
/* Connections open now, those being closed included. */
unsigned http_server_connections(HttpServer *s);

/* Stops accepting connections; requests in flight finish, each answered with Connection: close.
 * Requests still suspended when the server is freed are answered 409 conflict ("vm-manager is
 * shutting down"), which libmicrohttpd gets up to a second to deliver. */
void http_server_quiesce(HttpServer *s);
/* Requests accepted and not yet completed (including suspended ones). */
unsigned http_server_active_requests(HttpServer *s);

HttpRequest *http_request_ref(HttpRequest *r);
HttpRequest *http_request_unref(HttpRequest *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(HttpRequest *, http_request_unref);

const char *http_request_method(HttpRequest *r);
/* The decoded path, without the query string. */
const char *http_request_path(HttpRequest *r);
const char *http_request_header(HttpRequest *r, const char *name);
/* How many times the request carries the header name (in any case). A client may repeat a header
 * and http_request_header() sees only the first: a header that must appear once is checked here. */
unsigned http_request_header_count(HttpRequest *r, const char *name);
/* NULL when the query has no such argument. */
const char *http_request_query(HttpRequest *r, const char *key);
const void *http_request_body(HttpRequest *r, size_t *ret_size);
uint64_t http_request_id(HttpRequest *r);
/* The body parsed as JSON (json_parse_body()); a new reference. Parses on the spot, whatever the
 * size: for a body that may be large, use http_request_body_json_async(). */
int http_request_body_json(HttpRequest *r, json_t **ret, ApiError *reterr);

/* Bodies up to this size are parsed on the loop: a few milliseconds at most. */
#define HTTP_BODY_PARSE_INLINE_MAX ((size_t) 64 << 10)
/* Called exactly once with the body parsed as JSON (borrowed) or with why not (error, then body is
 * NULL): the errors of json_parse_body(), -ESHUTDOWN ("vm-manager is shutting down") when the server
 * is freed before the parse ran, -ECONNRESET when the client went away meanwhile (a reply is then
 * dropped). It runs as a handler does: it replies, or suspends the request and replies later. */
typedef void (*HttpBodyJsonDone)(HttpRequest *r, json_t *body, const ApiError *error, void *userdata);
/* The body parsed as JSON without the loop waiting on it: a body of up to HTTP_BODY_PARSE_INLINE_MAX
 * bytes is parsed at once and done called before this returns (0); a larger one is parsed on the
 * server's worker thread while the request waits suspended and everything else is served, and done
 * is called from the loop later (1). Only from a handler, which returns after this. -EAGAIN when
 * the worker has as many bodies as the server has connections, -ENOMEM: done is then not called and
 * the handler still has to reply. */
int http_request_body_json_async(HttpRequest *r, HttpBodyJsonDone done, void *userdata);

/* Renders a document into the bytes of an answer: a new string (malloc()ed) and its size, NULL when
 * out of memory. For a large document it runs on the server's worker thread: it touches v and
 * nothing else (no Manager, no logging), and may change v, which is the job's. */
typedef char *(*HttpRenderFunc)(json_t *v, size_t *ret_size);
/* Documents estimated (json_dumps_estimate()) below this are rendered on the loop: a few
 * milliseconds at most, even escaped and under the sanitizers. */
#define HTTP_RENDER_INLINE_MAX ((size_t) 64 << 10)
/* Called exactly once with the bytes (taken: the callee frees them) or with why not (error, then
 * text is NULL): -ENOMEM, -ESHUTDOWN ("vm-manager is shutting down") when the server is freed before
 * the render ran, -ECONNRESET when the client went away meanwhile (a reply is then dropped). It runs
 * as a handler does: it replies, or suspends the request and replies later; on a stream it writes
 * or ends it. */
typedef void (*HttpRenderDone)(HttpRequest *r, char *text, size_t size, const ApiError *error, void *userdata);
/* Renders v (taken, whatever happens) without the loop waiting on it: a document estimated below
 * HTTP_RENDER_INLINE_MAX is rendered at once and done called before this returns (0); a larger one
 * goes, with the reference, to the server's worker thread while the request waits suspended (a
 * stream goes on streaming, keep-alives included) and everything else is served, and done is called
 * from the loop later (1). Freeing the tree goes with it. From the thread's start on, nothing on the
 * loop may change v or a value inside it: whatever else holds a reference may only drop it (jansson
 * counts references atomically), and a value shared with a record must be one the record never
 * changes (it replaces it). When the worker refuses the job (full, or cannot be started) the
 * document is rendered at once. From a handler, from whatever completes a suspended request, or on
 * a stream; one render at a time per request, and no other reply meanwhile (-EALREADY). */
int http_request_render_async(
        HttpRequest *r, json_t *v, HttpRenderFunc render, HttpRenderDone done, void *userdata);
/* http_request_reply_json()'s answer, v taken and rendered by http_request_render_async(): a large
 * one off the loop. A render that fails is answered with its error (500, or 409 when shutting down). */
int http_request_reply_json_async(HttpRequest *r, unsigned status, json_t *v);

/* Called once when the request is over: status is the one of the response delivered, 0 when the
 * connection ended first. Runs also for requests still open when the server is freed. */
typedef void (*HttpRequestDone)(unsigned status, void *userdata);
/* Sets the request's completion callback (one per request; a later call replaces it). */
void http_request_on_done(HttpRequest *r, HttpRequestDone done, void *userdata);

/* Keeps the connection open without an answer; a later reply resumes it. */
void http_request_suspend(HttpRequest *r);
/* Hands a suspended request to handler as if it had just arrived: it replies or suspends again, as
 * any handler does (a guard that had to wait for something passes the request on this way). */
void http_request_continue(HttpRequest *r, HttpHandler handler, void *userdata);

/* Who sent the request, once a guard established it (takes c); NULL: anonymous. */
void http_request_set_caller(HttpRequest *r, Caller *c);
const Caller *http_request_caller(HttpRequest *r);
/* False once the client went away; a reply is then dropped. */
bool http_request_is_connected(HttpRequest *r);

/* Sends the answer. data is copied. Only the first reply of a request counts (-EALREADY after). */
int http_request_reply(HttpRequest *r, unsigned status, const char *content_type, const void *data, size_t size);
/* Sends size bytes of a file; takes fd, whatever happens. */
int http_request_reply_fd(HttpRequest *r, unsigned status, const char *content_type, int fd, uint64_t size);
/* Like http_request_reply(), but takes data (malloc()ed), whatever happens, instead of copying it. */
int http_request_reply_take(HttpRequest *r, unsigned status, const char *content_type, char *data, size_t size);
/* v rendered by json_dumps_pretty() on the spot, whatever the size: for an answer that may be large,
 * use http_request_reply_json_async(). */
int http_request_reply_json(HttpRequest *r, unsigned status, const json_t *v);
int http_request_reply_error(HttpRequest *r, const ApiError *e);
/* The JSON error envelope of e with an HTTP status of its own (403, 414, 415…), for refusals that
 * are invalid requests to the client but have a precise status in HTTP. */
int http_request_reply_error_status(HttpRequest *r, unsigned status, const ApiError *e);
int http_request_reply_text(HttpRequest *r, unsigned status, const char *text);
/* Answers with status and headers now and keeps the body open (server-sent events): bytes given
 * to http_request_stream_write() go out as they come, http_request_stream_end() completes the
 * response. The connection waits, without polling, while there is nothing to send. At most
 * HTTP_STREAM_MAX_BACKLOG unsent bytes are kept (-ENOBUFS beyond). Streams are ended when the
 * server is quiesced or freed. */
int http_request_reply_stream(HttpRequest *r, unsigned status, const char *content_type);
int http_request_stream_write(HttpRequest *r, const void *data, size_t size);
int http_request_stream_end(HttpRequest *r);
/* Writes data (malloc()ed, taken whatever happens) as the stream's last bytes and ends it. The
 * backlog limit does not apply: the last event of a stream is an answer, bounded by its own limits
 * (exec_vm's output), which the client gets whole. */
int http_request_stream_end_take(HttpRequest *r, char *data, size_t size);
/* Writes data (a NUL-terminated filler the client ignores, such as an SSE comment) whenever nothing
 * was written to the stream for interval, so that clients and proxies with an idle timeout keep
 * it. The timer is the request's: every write moves it, and it is gone once the stream ends or the
 * client went away (noticed when a write fails, so at the latest at the second filler after). */
int http_request_stream_keepalive(HttpRequest *r, usec_t interval, const char *data);
#define HTTP_STREAM_MAX_BACKLOG ((size_t) 1 << 20)
/* The bytes written to the stream that have not gone out yet (0 once it ended or its client left):
 * a writer of events that may pile up bounds them with its own, tighter, rule. */
size_t http_request_stream_unsent(HttpRequest *r);

/* An HTTP/1.1 upgrade (101 Switching Protocols): after the 101, the connection's socket speaks
 * another protocol and belongs to whoever http_request_reply_upgrade() gave it to, until
 * http_upgrade_close(). The server does not read, write, time out or evict it meanwhile. */
typedef struct HttpUpgrade HttpUpgrade;
/* Called from the loop once the 101 went out. fd is the socket (blocking or not, as the server left
 * it: non-blocking), borrowed: dup() it to give it on. extra/extra_size: bytes the client sent after
 * its request that the server already read. The callee owns u and ends it with http_upgrade_close(). */
typedef void (*HttpUpgradeFunc)(HttpUpgrade *u, int fd, const void *extra, size_t extra_size, void *userdata);
/* Answers 101 with "Upgrade: protocol" and "Connection: Upgrade". When the connection ends before
 * the 101 is out (the client left, the server is freed), func is called with u NULL and fd -EBADF. */
int http_request_reply_upgrade(HttpRequest *r, const char *protocol, HttpUpgradeFunc func, void *userdata);
/* Closes the upgraded connection (NULL is fine). The server closes those still open when it is
 * freed: u then only waits for this call to be freed. */
HttpUpgrade *http_upgrade_close(HttpUpgrade *u);
/* Upgraded connections not yet closed. */
unsigned http_server_upgrades(HttpServer *s);

/* The DNS-rebinding and cross-site guard of a server that listens on loopback only: a request
 * whose Origin or Host names anything but loopback (a web page's cross-site request, or a name an
 * attacker rebound to 127.0.0.1) is -EPERM, with an invalid_request error in reterr naming the
 * header. 0 on a server that listens elsewhere or on connections handed in: there names vary. */
int http_request_check_site(HttpRequest *r, ApiError *reterr);

/* Adds a response header to the reply that follows. */
int http_request_add_header(HttpRequest *r, const char *name, const char *value);
