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
        usec_t idle_timeout; /* closes idle keep-alive connections */
        HttpHandler handler;
        void *userdata;
} HttpServerOptions;

#define HTTP_MAX_BODY_DEFAULT ((size_t) 8 << 20)

int http_server_new(HttpServer **ret, sd_event *event, const HttpServerOptions *o, ApiError *reterr);
HttpServer *http_server_free(HttpServer *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(HttpServer *, http_server_free);

/* Serves a connection accepted elsewhere, say on a listener that is itself an identity (one per VM).
 * Takes fd, whatever happens. tag (copied) is what http_request_connection_tag() returns for every
 * request on that connection. */
int http_server_add_connection(HttpServer *s, int fd, const char *tag);
/* The tag of the request's connection; NULL for a connection the server accepted itself. */
const char *http_request_connection_tag(HttpRequest *r);

/* The local address actually bound ("127.0.0.1:43817"), for logs and tests. Borrowed. */
const char *http_server_address(HttpServer *s);

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
/* NULL when the query has no such argument. */
const char *http_request_query(HttpRequest *r, const char *key);
const void *http_request_body(HttpRequest *r, size_t *ret_size);
uint64_t http_request_id(HttpRequest *r);
/* The body parsed as JSON (json_parse_body()); a new reference. */
int http_request_body_json(HttpRequest *r, json_t **ret, ApiError *reterr);

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
int http_request_reply_json(HttpRequest *r, unsigned status, const json_t *v);
int http_request_reply_error(HttpRequest *r, const ApiError *e);
int http_request_reply_text(HttpRequest *r, unsigned status, const char *text);
/* Answers with status and headers now and keeps the body open (server-sent events): bytes given
 * to http_request_stream_write() go out as they come, http_request_stream_end() completes the
 * response. The connection waits, without polling, while there is nothing to send. At most
 * HTTP_STREAM_MAX_BACKLOG unsent bytes are kept (-ENOBUFS beyond). Streams are ended when the
 * server is quiesced or freed. */
int http_request_reply_stream(HttpRequest *r, unsigned status, const char *content_type);
int http_request_stream_write(HttpRequest *r, const void *data, size_t size);
int http_request_stream_end(HttpRequest *r);
#define HTTP_STREAM_MAX_BACKLOG ((size_t) 1 << 20)

/* Adds a response header to the reply that follows. */
int http_request_add_header(HttpRequest *r, const char *name, const char *value);
