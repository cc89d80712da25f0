/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cleanup.h"
#include "hex-util.h"
#include "http-server.h"
#include "http-util.h"
#include "json-util.h"
#include "list.h"
#include "log.h"
#include "worker.h"

typedef struct HttpConnection HttpConnection;
typedef struct HttpPeer HttpPeer;

typedef enum RequestState {
        REQUEST_RECEIVING,  /* headers and body arriving */
        REQUEST_DISPATCHED, /* handler running or finished, answer queued or pending */
        REQUEST_SUSPENDED,  /* waiting for an asynchronous reply */
        REQUEST_RESUMING,   /* reply stored, waiting for MHD to call us back */
        REQUEST_DONE,       /* response handed to MHD */
} RequestState;

struct HttpRequest {
        unsigned n_ref;
        HttpServer *server;
        struct MHD_Connection *connection; /* NULL once MHD completed the request */
        HttpConnection *conn;              /* NULL once MHD completed the request */
        RequestState state;
        bool suspend_requested;
        bool body_too_large;
        bool close;     /* the answer ends the connection */
        bool rendering; /* its answer is being rendered on the worker (http_request_render_async()) */

        uint64_t id;
        usec_t start;
        char *method;
        char *path;

        char *body;
        size_t body_size, body_alloc;

        struct MHD_Response *response; /* built, not yet queued */
        unsigned status;
        char **headers; /* name, value, name, value, …, NULL */
        HttpRequestDone done;
        void *done_userdata;

        /* A streamed body (http_request_reply_stream()): bytes queued and not yet sent. */
        bool streaming;
        bool stream_ended;
        bool file;          /* http_request_reply_fd(): sent while the client takes it, however long */
        bool stream_parked; /* the content reader suspended the connection: no data yet */
        char *stream_buf;
        size_t stream_len, stream_off;
        usec_t stream_last_write;          /* CLOCK_MONOTONIC of the last write */
        sd_event_source *keepalive_source; /* http_request_stream_keepalive()'s timer */
        usec_t keepalive_interval;
        char *keepalive_data;

        Caller *caller;

        HttpRequest *prev, *next; /* the server's list of live requests */
};

/* Whoever a per-peer limit counts against: a source address, or the tag of connections handed in. */
struct HttpPeer {
        char *key;
        unsigned open;                   /* connections not being closed */
        unsigned n_ref;                  /* connections pointing here, those being closed included */
        HttpConnection *oldest, *newest; /* its connections by since, those being closed included */
        HttpPeer *prev, *next;
};

/* One per connection MHD holds (its socket context), from accept to close. */
struct HttpConnection {
        HttpServer *server;
        int fd;
        char *tag;      /* handed-in connections: the caller's tag */
        HttpPeer *peer; /* NULL without a per-peer limit or for an unnamed peer */
        usec_t since;   /* start of the current wait: for a request, or for a response to go out */
        HttpRequest *request;
        unsigned refused_target;               /* 414 when on_uri() refused the request target */
        const char *target;                    /* on_uri()'s: the target in MHD's read buffer, undecoded */
        size_t target_len;                     /* its length then, for request_check_head() */
        bool closing;                          /* shut down by us, MHD has yet to notice */
        HttpConnection *peer_prev, *peer_next; /* the peer's connections, by since */
        bool served;                           /* a request of it was answered */
        bool refused;                          /* over the limits: answered 503 on accept */
        bool upgraded;                         /* its socket is an HttpUpgrade's owner's now */
        HttpUpgrade *upgrade;                  /* answered 101: the upgrade, activated or not yet */
        HttpConnection *prev, *next;
};

/* The tag of a connection http_server_add_connection() handed to MHD, until MHD announces it
 * (on_connection()): libmicrohttpd 0.9.75 does so before MHD_add_connection() returns, 1.0 (Debian
 * 13) only when it next runs. Found by the socket, which MHD keeps as it was given. */
typedef struct PendingTag PendingTag;
struct PendingTag {
        int fd;
        char *tag;
        PendingTag *next;
};

struct HttpServer {
        sd_event *event;
        sd_event_source *io_source;
        sd_event_source *timer_source;
        sd_event_source *sweep_source; /* enforces request_timeout */
        struct MHD_Daemon *daemon;
        HttpServerOptions options;
        char *address;
        bool loopback;
        uint64_t next_request_id;
        unsigned active;
        HttpRequest *requests;
        bool quiesced;
        bool kicked; /* server_kick() since the last MHD_run(): run again at once */
        HttpConnection *connections;
        unsigned n_connections; /* all, those being closed included */
        unsigned n_open;        /* not being closed */
        HttpPeer *peers;
        PendingTag *pending_tags; /* connections handed to MHD that it has not announced yet */
        /* parses large bodies and renders large answers (http_request_body_json_async(),
         * http_request_render_async()); made on first use */
        Worker *worker;
        HttpUpgrade *upgrades; /* upgraded connections still open */
        unsigned n_upgrades;
};

struct HttpUpgrade {
        HttpServer *server; /* NULL once the server closed it (freed first) */
        HttpConnection *conn;
        struct MHD_UpgradeResponseHandle *urh;
        HttpUpgradeFunc func;
        void *userdata;
        HttpUpgrade *prev, *next;
};

#define HTTP_FREE_FLUSH_TIMEOUT (1 * USEC_PER_SEC)
/* A request that took this much for its body gives the memory back to the system when it ends:
 * glibc keeps freed heap memory for later, and after one such body the daemon would keep megabytes
 * it only needed once. */
#define HTTP_TRIM_BODY_MIN ((size_t) 1 << 20)
/* Connections MHD may hold beyond max_connections while those we shut down wait to be reaped. */
#define HTTP_CONNECTION_SLACK 64U

static void server_arm(HttpServer *s);
static void server_kick(HttpServer *s);
static void on_connection(
        void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);
static HttpConnection *connection_of(struct MHD_Connection *mc);
static void connection_close(HttpConnection *c);
static void connection_touch(HttpConnection *c);
static int on_sweep(sd_event_source *es, usec_t usec, void *userdata);

static void keepalive_stop(HttpRequest *r) {
        r->keepalive_source = sd_event_source_disable_unref(r->keepalive_source);
        r->keepalive_data = mfree(r->keepalive_data);
}

HttpRequest *http_request_ref(HttpRequest *r) {
        if (r)
                r->n_ref++;
        return r;
}

HttpRequest *http_request_unref(HttpRequest *r) {
        if (!r)
                return NULL;
        assert(r->n_ref > 0);
        if (--r->n_ref > 0)
                return NULL;
        bool trim = r->body_alloc >= HTTP_TRIM_BODY_MIN;
        if (r->response)
                MHD_destroy_response(r->response);
        strv_free(r->headers);
        keepalive_stop(r);
        caller_free(r->caller);
        free(r->stream_buf);
        free(r->body);
        free(r->path);
        free(r->method);
        free(r);
        if (trim)
                (void) malloc_trim(0);
        return NULL;
}

const char *http_request_method(HttpRequest *r) {
        return r->method;
}

const char *http_request_path(HttpRequest *r) {
        return r->path;
}

uint64_t http_request_id(HttpRequest *r) {
        return r->id;
}

const char *http_request_header(HttpRequest *r, const char *name) {
        if (!r->connection)
                return NULL;
        return MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, name);
}

const char *http_request_query(HttpRequest *r, const char *key) {
        if (!r->connection)
                return NULL;
        return MHD_lookup_connection_value(r->connection, MHD_GET_ARGUMENT_KIND, key);
}

const void *http_request_body(HttpRequest *r, size_t *ret_size) {
        if (ret_size)
                *ret_size = r->body_size;
        return r->body ?: "";
}

int http_request_body_json(HttpRequest *r, json_t **ret, ApiError *reterr) {
        return json_parse_body(r->body, r->body_size, ret, reterr);
}

/* A body parsed on the worker. The thread reads the request's body (which the reference keeps, and
 * which nothing changes once the request is dispatched) and fills r, value and error; everything
 * else is the loop's. */
typedef struct BodyParse {
        HttpRequest *request;
        const char *data;
        size_t size;
        int r;
        json_t *value;
        ApiError error;
        HttpBodyJsonDone done;
        void *userdata;
} BodyParse;

static BodyParse *body_parse_free(BodyParse *j) {
        if (!j)
                return NULL;
        json_decref(j->value);
        api_error_done(&j->error);
        http_request_unref(j->request);
        free(j);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(BodyParse *, body_parse_free);

/* On the worker's thread: nothing but the job. */
static void body_parse_run(void *userdata) {
        BodyParse *j = userdata;

        j->r = json_parse_body(j->data, j->size, &j->value, &j->error);
}

static void body_parse_call(HttpRequest *r, void *userdata) {
        BodyParse *j = userdata;

        j->done(r, j->r < 0 ? NULL : j->value, j->r < 0 ? &j->error : NULL, j->userdata);
}

/* On the worker's thread: drops the loop's reference to a large parsed body. Freeing a tree of a
 * million values costs about what parsing it did; jansson's reference counts are atomic, so a
 * part still referenced on the loop (a field an operation kept) stays there, and is freed there. */
static void body_release_run(void *userdata) {
        json_decref(userdata);
}

static void body_release_done(void *userdata, bool ran) {
        if (!ran)
                json_decref(userdata);
}

static void body_release(HttpServer *s, json_t *v) {
        if (!v)
                return;
        if (!s->worker || worker_submit(s->worker, v, body_release_run, body_release_done) < 0)
                json_decref(v); /* being freed, or full: here then */
}

static void body_parse_done(void *userdata, bool ran) {
        _cleanup_(body_parse_freep) BodyParse *j = userdata;
        HttpRequest *r = j->request;

        if (!r->connection || r->state != REQUEST_SUSPENDED) {
                /* The client went away meanwhile: done hears of it, and what it answers is dropped. */
                api_error_done(&j->error);
                j->r = api_error_set(&j->error, -ECONNRESET, API_ERROR_INTERNAL, "the client went away");
                body_parse_call(r, j);
        } else {
                if (!ran) {
                        /* the server is being freed: done answers as every suspended request is */
                        api_error_done(&j->error);
                        j->r = api_error_set(
                                &j->error, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
                }
                http_request_continue(r, body_parse_call, j);
        }
        body_release(r->server, TAKE_PTR(j->value));
}

static int server_worker(HttpServer *s) {
        if (s->worker)
                return 0;
        /* Every connection has one request at most, with two jobs at most at a time (a parse and a
         * release, or an answer rendered and the body's release), so -EAGAIN only comes when the
         * pipes could not be made that large. */
        return worker_new(
                s->event,
                &(WorkerOptions){
                        .name = "vmm-http",
                        .threads = 1,
                        .max_jobs = MIN(
                                2 * (s->options.max_connections + HTTP_CONNECTION_SLACK), WORKER_JOBS_MAX),
                        .nice = 10,
                },
                &s->worker);
}

int http_request_body_json_async(HttpRequest *r, HttpBodyJsonDone done, void *userdata) {
        _cleanup_(body_parse_freep) BodyParse *j = NULL;
        HttpServer *s;
        int k;

        assert_return(r && done, -EINVAL);
        assert_return(r->state == REQUEST_DISPATCHED && !r->suspend_requested, -EINVAL);
        s = r->server;

        if (r->body_size <= HTTP_BODY_PARSE_INLINE_MAX) {
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
                json_auto_t *v = NULL;

                k = json_parse_body(r->body, r->body_size, &v, &e);
                done(r, k < 0 ? NULL : v, k < 0 ? &e : NULL, userdata);
                return 0;
        }

        k = server_worker(s);
        if (k < 0)
                return k;
        j = calloc(1, sizeof(BodyParse));
        if (!j)
                return -ENOMEM;
        *j = (BodyParse){
                .request = http_request_ref(r),
                .data = r->body,
                .size = r->body_size,
                .error = API_ERROR_NULL,
                .done = done,
                .userdata = userdata,
        };
        k = worker_submit(s->worker, j, body_parse_run, body_parse_done);
        if (k < 0)
                return k;
        TAKE_PTR(j);
        http_request_suspend(r);
        return 1;
}

bool http_request_is_connected(HttpRequest *r) {
        return r->connection != NULL;
}

void http_request_on_done(HttpRequest *r, HttpRequestDone done, void *userdata) {
        r->done = done;
        r->done_userdata = userdata;
}

void http_request_suspend(HttpRequest *r) {
        assert(r->state == REQUEST_DISPATCHED);
        r->suspend_requested = true;
}

void http_request_set_caller(HttpRequest *r, Caller *c) {
        caller_free(r->caller);
        r->caller = c;
}

const Caller *http_request_caller(HttpRequest *r) {
        return r->caller;
}

int http_request_add_header(HttpRequest *r, const char *name, const char *value) {
        size_t n = 0;
        char **l;

        assert_return(name && value, -EINVAL);
        while (r->headers && r->headers[n])
                n++;
        l = realloc(r->headers, (n + 3) * sizeof(char *));
        if (!l)
                return -ENOMEM;
        r->headers = l;
        l[n] = strdup(name);
        l[n + 1] = strdup(value);
        l[n + 2] = NULL;
        if (!l[n] || !l[n + 1])
                return -ENOMEM;
        return 0;
}

/* Hands a built response to MHD. Only valid inside the access handler callback. */
static enum MHD_Result request_queue(HttpRequest *r) {
        enum MHD_Result ret;

        assert(r->response);
        ret = MHD_queue_response(r->connection, r->status, r->response);
        MHD_destroy_response(r->response);
        r->response = NULL;
        r->state = REQUEST_DONE;
        if (r->conn)
                connection_touch(r->conn); /* the response has request_timeout to go out */
        return ret;
}

/* Adds the common headers to resp and stores it as the request's answer; takes resp. */
static int request_set_response(
        HttpRequest *r, unsigned status, const char *content_type, struct MHD_Response *resp) {
        if (content_type &&
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type) != MHD_YES)
                goto oom;
        for (char **h = r->headers; h && h[0]; h += 2)
                if (MHD_add_response_header(resp, h[0], h[1]) != MHD_YES)
                        goto oom;
        if ((r->server->quiesced || r->close) && status != MHD_HTTP_SWITCHING_PROTOCOLS &&
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close") != MHD_YES)
                goto oom;

        r->response = resp;
        r->status = status;

        if (r->state == REQUEST_SUSPENDED) {
                /* MHD calls the access handler again, which queues the stored response. */
                r->state = REQUEST_RESUMING;
                MHD_resume_connection(r->connection);
                server_kick(r->server);
        }
        return 0;

oom:
        MHD_destroy_response(resp);
        return -ENOMEM;
}

static int request_can_reply(HttpRequest *r) {
        assert_return(r, -EINVAL);
        if (r->response || r->rendering || r->state == REQUEST_DONE || r->state == REQUEST_RESUMING)
                return -EALREADY;
        if (!r->connection)
                return -ECONNRESET;
        return 0;
}

int http_request_reply(HttpRequest *r, unsigned status, const char *content_type, const void *data, size_t size) {
        struct MHD_Response *resp;
        int k;

        k = request_can_reply(r);
        if (k < 0)
                return k;
        resp = MHD_create_response_from_buffer(size, (void *) (data ?: ""), MHD_RESPMEM_MUST_COPY);
        if (!resp)
                return -ENOMEM;
        return request_set_response(r, status, content_type, resp);
}

int http_request_reply_take(HttpRequest *r, unsigned status, const char *content_type, char *data, size_t size) {
        _cleanup_free_ char *d = data;
        struct MHD_Response *resp;
        int k;

        k = request_can_reply(r);
        if (k < 0)
                return k;
        if (!d)
                return http_request_reply(r, status, content_type, NULL, 0);
        resp = MHD_create_response_from_buffer(size, d, MHD_RESPMEM_MUST_FREE);
        if (!resp)
                return -ENOMEM;
        TAKE_PTR(d); /* MHD frees it with the response */
        return request_set_response(r, status, content_type, resp);
}

int http_request_reply_fd(HttpRequest *r, unsigned status, const char *content_type, int fd, uint64_t size) {
        _cleanup_close_ int ffd = fd;
        struct MHD_Response *resp;
        int k;

        k = request_can_reply(r);
        if (k < 0)
                return k;
        resp = MHD_create_response_from_fd64(size, ffd);
        if (!resp)
                return -ENOMEM;
        TAKE_FD(ffd); /* MHD closes it with the response */
        k = request_set_response(r, status, content_type, resp);
        if (k >= 0)
                r->file = true;
        return k;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        HttpRequest *r = cls;
        size_t n;

        if (r->stream_off < r->stream_len) {
                n = MIN(max, r->stream_len - r->stream_off);
                memcpy(buf, r->stream_buf + r->stream_off, n);
                r->stream_off += n;
                if (r->stream_off == r->stream_len)
                        r->stream_off = r->stream_len = 0;
                return (ssize_t) n;
        }
        if (r->stream_ended || !r->connection)
                return MHD_CONTENT_READER_END_OF_STREAM;
        /* Nothing to send yet: park the connection until http_request_stream_write() or _end(). */
        r->stream_parked = true;
        MHD_suspend_connection(r->connection);
        return 0;
}

static void stream_reader_free(void *cls) {
        http_request_unref(cls);
}

static void stream_unpark(HttpRequest *r) {
        if (!r->stream_parked || !r->connection)
                return;
        r->stream_parked = false;
        MHD_resume_connection(r->connection);
        server_kick(r->server);
}

int http_request_reply_stream(HttpRequest *r, unsigned status, const char *content_type) {
        struct MHD_Response *resp;
        int k;

        k = request_can_reply(r);
        if (k < 0)
                return k;
        resp = MHD_create_response_from_callback(
                MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, stream_reader_free);
        if (!resp)
                return -ENOMEM;
        http_request_ref(r); /* held by the response, dropped in stream_reader_free() */
        r->streaming = true;
        r->stream_last_write = now_usec(CLOCK_MONOTONIC);
        return request_set_response(r, status, content_type, resp);
}

int http_request_stream_write(HttpRequest *r, const void *data, size_t size) {
        assert_return(r && r->streaming, -EINVAL);
        if (r->stream_ended)
                return -EPIPE;
        if (!r->connection)
                return -ECONNRESET;
        if (r->stream_len + size > HTTP_STREAM_MAX_BACKLOG)
                return -ENOBUFS; /* a client that stopped reading does not get to hold our memory */
        char *b = realloc(r->stream_buf, r->stream_len + size);
        if (!b)
                return -ENOMEM;
        memcpy(b + r->stream_len, data, size);
        r->stream_buf = b;
        r->stream_len += size;
        r->stream_last_write = now_usec(CLOCK_MONOTONIC);
        stream_unpark(r);
        return 0;
}

size_t http_request_stream_unsent(HttpRequest *r) {
        if (!r || !r->streaming || !r->connection)
                return 0;
        return r->stream_len - r->stream_off;
}

int http_request_stream_end(HttpRequest *r) {
        assert_return(r && r->streaming, -EINVAL);
        r->stream_ended = true;
        keepalive_stop(r);
        stream_unpark(r);
        return 0;
}

int http_request_stream_end_take(HttpRequest *r, char *data, size_t size) {
        _cleanup_free_ char *d = data;

        assert_return(r && r->streaming, -EINVAL);
        if (r->stream_ended)
                return -EPIPE;
        if (!r->connection)
                return -ECONNRESET;
        if (r->stream_off == r->stream_len) {
                /* nothing left to send: the buffer becomes the backlog, without a copy */
                free(r->stream_buf);
                r->stream_buf = TAKE_PTR(d);
                r->stream_len = size;
                r->stream_off = 0;
        } else if (size > 0) {
                char *b = realloc(r->stream_buf, r->stream_len + size);
                if (!b)
                        return -ENOMEM;
                memcpy(b + r->stream_len, d, size);
                r->stream_buf = b;
                r->stream_len += size;
        }
        r->stream_last_write = now_usec(CLOCK_MONOTONIC);
        return http_request_stream_end(r);
}

/* Fires interval after the last write (any write moves the deadline): writes the filler, or stops
 * for good when the stream cannot take it (ended, client gone, or not reading). */
static int on_keepalive(sd_event_source *source, usec_t usec, void *userdata) {
        HttpRequest *r = userdata;
        int k;

        if (usec < r->stream_last_write + r->keepalive_interval ||
            http_request_stream_write(r, r->keepalive_data, strlen(r->keepalive_data)) >= 0) {
                k = sd_event_source_set_time(source, r->stream_last_write + r->keepalive_interval);
                if (k >= 0)
                        k = sd_event_source_set_enabled(source, SD_EVENT_ONESHOT);
                if (k >= 0)
                        return 0;
        }
        keepalive_stop(r);
        return 0;
}

int http_request_stream_keepalive(HttpRequest *r, usec_t interval, const char *data) {
        _cleanup_free_ char *copy = NULL;
        int k;

        assert_return(r && r->streaming && interval > 0 && data && *data, -EINVAL);
        if (r->stream_ended)
                return -EPIPE;
        if (!r->connection)
                return -ECONNRESET;
        copy = strdup(data);
        if (!copy)
                return -ENOMEM;
        keepalive_stop(r);
        k = sd_event_add_time(
                r->server->event,
                &r->keepalive_source,
                CLOCK_MONOTONIC,
                r->stream_last_write + interval,
                /* accuracy= */ interval / 20,
                on_keepalive,
                r);
        if (k < 0)
                return k;
        (void) sd_event_source_set_description(r->keepalive_source, "http-keepalive");
        r->keepalive_interval = interval;
        r->keepalive_data = TAKE_PTR(copy);
        return 0;
}

int http_request_reply_json(HttpRequest *r, unsigned status, const json_t *v) {
        _cleanup_free_ char *s = NULL;
        size_t n;

        if (status == 204)
                return http_request_reply(r, status, NULL, NULL, 0);
        s = json_dumps_pretty(v, &n);
        if (!s)
                return -ENOMEM;
        return http_request_reply(r, status, "application/json", s, n);
}

int http_request_reply_error_status(HttpRequest *r, unsigned status, const ApiError *e) {
        json_auto_t *j = api_error_to_json(e);

        if (!j)
                return -ENOMEM;
        return http_request_reply_json(r, status, j);
}

int http_request_reply_error(HttpRequest *r, const ApiError *e) {
        return http_request_reply_error_status(r, http_status_from_error(e), e);
}

int http_request_reply_text(HttpRequest *r, unsigned status, const char *text) {
        return http_request_reply(r, status, "text/plain; charset=utf-8", text, strlen(text));
}

/* status 0: the one of the error. */
static int reply_error_static(
        HttpRequest *r, unsigned status, int error, ApiErrorCode code, const char *format, ...) _printf_(5, 6);
static int reply_error_static(
        HttpRequest *r, unsigned status, int error, ApiErrorCode code, const char *format, ...) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, format);
        int k = vasprintf(&msg, format, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        (void) api_error_set(&e, error, code, "%s", msg);
        return http_request_reply_error_status(r, status ?: http_status_from_error(&e), &e);
}

/* An answer rendered on the worker. The thread owns value (the request gave its reference) and
 * fills text and size; everything else is the loop's. */
typedef struct Render {
        HttpRequest *request;
        json_t *value;
        HttpRenderFunc render;
        char *text;
        size_t size;
        ApiError error;
        HttpRenderDone done;
        void *userdata;
} Render;

static Render *render_free(Render *j) {
        if (!j)
                return NULL;
        json_decref(j->value);
        free(j->text);
        api_error_done(&j->error);
        http_request_unref(j->request);
        free(j);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(Render *, render_free);

/* On the worker's thread: nothing but the job. The tree goes with it: a large one costs about as
 * much to free as to render. */
static void render_run(void *userdata) {
        Render *j = userdata;

        j->text = j->render(j->value, &j->size);
        json_decref(TAKE_PTR(j->value));
}

static void render_call(HttpRequest *r, void *userdata) {
        Render *j = userdata;

        j->done(r, TAKE_PTR(j->text), j->size, j->error.error < 0 ? &j->error : NULL, j->userdata);
}

static void render_done(void *userdata, bool ran) {
        _cleanup_(render_freep) Render *j = userdata;
        HttpRequest *r = j->request;

        r->rendering = false;
        if (!r->connection)
                /* the client went away meanwhile: done hears of it, and what it answers is dropped */
                (void) api_error_set(&j->error, -ECONNRESET, API_ERROR_INTERNAL, "the client went away");
        else if (!ran)
                /* the server is being freed: done answers as every suspended request is */
                (void) api_error_set(&j->error, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
        else if (!j->text)
                (void) api_error_set(&j->error, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        if (j->error.error < 0)
                j->text = mfree(j->text);

        if (r->connection && r->state == REQUEST_SUSPENDED)
                http_request_continue(r, render_call, j);
        else
                render_call(r, j); /* a stream, or nobody to answer */
}

int http_request_render_async(
        HttpRequest *r, json_t *v, HttpRenderFunc render, HttpRenderDone done, void *userdata) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(render_freep) Render *j = NULL;
        json_auto_t *value = v;
        _cleanup_free_ char *text = NULL;
        size_t size = 0;
        int k;

        assert_return(r && render && done, -EINVAL);
        if (r->rendering)
                return -EALREADY;
        if (!r->connection) {
                (void) api_error_set(&e, -ECONNRESET, API_ERROR_INTERNAL, "the client went away");
                done(r, /* text= */ NULL, 0, &e, userdata);
                return 0;
        }

        if (json_dumps_estimate(value, HTTP_RENDER_INLINE_MAX) >= HTTP_RENDER_INLINE_MAX) {
                k = server_worker(r->server);
                if (k >= 0) {
                        j = calloc(1, sizeof(Render));
                        k = j ? 0 : -ENOMEM;
                }
                if (k >= 0) {
                        *j = (Render){
                                .request = http_request_ref(r),
                                .value = TAKE_PTR(value),
                                .render = render,
                                .error = API_ERROR_NULL,
                                .done = done,
                                .userdata = userdata,
                        };
                        k = worker_submit(r->server->worker, j, render_run, render_done);
                        if (k >= 0) {
                                TAKE_PTR(j);
                                r->rendering = true;
                                if (r->state == REQUEST_DISPATCHED && !r->suspend_requested)
                                        http_request_suspend(r);
                                return 1;
                        }
                        value = TAKE_PTR(j->value);
                }
                log_debug_errno(k, "Rendering a large answer on the loop, as the worker cannot take it: %m");
        }

        text = render(value, &size);
        json_decref(TAKE_PTR(value));
        if (!text) {
                (void) api_error_set(&e, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                done(r, /* text= */ NULL, 0, &e, userdata);
        } else
                done(r, TAKE_PTR(text), size, /* error= */ NULL, userdata);
        return 0;
}

static char *render_pretty(json_t *v, size_t *ret_size) {
        return json_dumps_pretty(v, ret_size);
}

static void reply_rendered(HttpRequest *r, char *text, size_t size, const ApiError *error, void *userdata) {
        unsigned status = (unsigned) (uintptr_t) userdata;

        if (error)
                (void) http_request_reply_error(r, error); /* dropped when the client went away */
        else
                (void) http_request_reply_take(r, status, "application/json", text, size);
}

int http_request_reply_json_async(HttpRequest *r, unsigned status, json_t *v) {
        json_auto_t *value = v;
        int k;

        if (status == 204)
                return http_request_reply(r, status, NULL, NULL, 0);
        k = request_can_reply(r);
        if (k < 0)
                return k;
        k = http_request_render_async(
                r, TAKE_PTR(value), render_pretty, reply_rendered, (void *) (uintptr_t) status);
        return k < 0 ? k : 0;
}

static enum MHD_Result count_host(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0)
                (*(unsigned *) cls)++;
        return MHD_YES;
}

#if MHD_VERSION < 0x00097701
typedef struct HeadFields {
        HttpHeadField *fields;
        size_t n, n_alloc;
} HeadFields;

static enum MHD_Result collect_field(
        void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size, const char *value, size_t value_size) {
        HeadFields *h = cls;

        if (h->fields) {
                if (h->n >= h->n_alloc)
                        return MHD_NO;
                h->fields[h->n] = (HttpHeadField){
                        .name = key, .name_len = key_size, .value = value, .value_len = value_size
                };
        }
        h->n++;
        return MHD_YES;
}

/* libmicrohttpd 0.9.75 reads every header line up to its first NUL byte and drops the rest of the
 * line without a word, so "Host: 127.0.0.1\0evil.example" would reach the site guard as loopback.
 * It has no option that refuses such lines (MHD_OPTION_STRICT_FOR_CLIENT checks spaces only), but
 * it leaves the head it parsed in place in its read buffer, from the method on, for as long as the
 * request lasts: compare that with the fields it reported. This runs for every request of a
 * connection, each with its own head. Replies and returns true when the request is refused; such
 * answers close the connection. */
static bool request_refuse_head(HttpRequest *r, const char *method, const char *version) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(
                r->connection, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
        _cleanup_free_ HttpHeadField *fields = NULL;
        HeadFields collected = {};
        size_t at = HTTP_HEAD_REQUEST_LINE;
        HttpHead head;
        int k;

        r->close = true;
        if (!info) {
                (void) reply_error_static(r, 0, -EIO, API_ERROR_INTERNAL, "internal error: no request head");
                return true;
        }
        (void) MHD_get_connection_values_n(r->connection, MHD_HEADER_KIND, collect_field, &collected);
        if (collected.n > 0) {
                fields = calloc(collected.n, sizeof(HttpHeadField));
                if (!fields) {
                        (void) reply_error_static(r, 0, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                        return true;
                }
                collected = (HeadFields){ .fields = fields, .n_alloc = collected.n };
                (void) MHD_get_connection_values_n(r->connection, MHD_HEADER_KIND, collect_field, &collected);
        }
        head = (HttpHead){
                .start = method,
                .size = info->header_size,
                .target = r->conn ? r->conn->target : NULL,
                .target_len = r->conn ? r->conn->target_len : 0,
                .version = version,
                .fields = fields,
                .n_fields = MIN(collected.n, collected.n_alloc),
        };
        k = http_head_check(&head, &at);
        if (k >= 0) {
                r->close = false;
                return false;
        }
        if (at == HTTP_HEAD_REQUEST_LINE)
                (void) reply_error_static(
                        r,
                        0,
                        -EBADMSG,
                        API_ERROR_INVALID_REQUEST,
                        k == -EBADMSG ? "request line contains a NUL byte" :
                                        "request head: not as libmicrohttpd reported it");
        else
                (void) reply_error_static(
                        r,
                        0,
                        -EBADMSG,
                        API_ERROR_INVALID_REQUEST,
                        k == -EBADMSG ? "header %.*s contains a NUL byte" :
                                        "header %.*s: folded over several lines (obs-fold)",
                        (int) MIN(fields[at].name_len, (size_t) 100),
                        fields[at].name);
        return true;
}
#else
/* libmicrohttpd 0.9.77 and later (Debian 13 has 1.0.1) refuse a NUL byte in a header themselves
 * (400, and the connection closed) and close the connection on one in the request line; a folded
 * line they join into one value, as RFC 9112 §5.2 allows, instead of dropping its rest. Nothing is
 * hidden from the fields they report, and they no longer leave the head in their buffer in the
 * layout the check above reads: every request would fail it. */
static bool request_refuse_head(HttpRequest *r, const char *method, const char *version) {
        return false;
}
#endif

/* What HTTP itself refuses before any handler sees the request: a target on_uri() found too
 * large, a body announced too large, an HTTP/1.1 request without exactly one Host (RFC 9112 §3.2).
 * Replies and returns true when the request is refused; such answers close the connection. */
static bool request_refuse(HttpRequest *r, const char *version) {
        HttpServer *s = r->server;
        HttpConnection *c = r->conn;
        unsigned n_host = 0;

        if (c && c->refused_target) {
                r->close = true;
                (void) reply_error_static(
                        r,
                        414,
                        -E2BIG,
                        API_ERROR_INVALID_REQUEST,
                        "request target: longer than %zu bytes or more than %u query arguments",
                        HTTP_MAX_TARGET,
                        HTTP_MAX_QUERY_ARGS);
                return true;
        }
        if (r->body_too_large) {
                r->close = true;
                (void) reply_error_static(
                        r,
                        0,
                        -EFBIG,
                        API_ERROR_INVALID_REQUEST,
                        "body: larger than the limit of %zu bytes",
                        s->options.max_body);
                return true;
        }
        (void) MHD_get_connection_values(r->connection, MHD_HEADER_KIND, count_host, &n_host);
        if (streq(version, MHD_HTTP_VERSION_1_1) && n_host != 1) {
                r->close = true;
                (void) reply_error_static(
                        r,
                        0,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        n_host == 0 ? "Host: an HTTP/1.1 request needs the header" :
                                      "Host: an HTTP/1.1 request has exactly one");
                return true;
        }
        return false;
}

static void request_dispatch(HttpRequest *r, const char *version) {
        HttpServer *s = r->server;

        r->state = REQUEST_DISPATCHED;
        if (request_refuse(r, version))
                return;

        s->options.handler(r, s->options.userdata);

        if (r->response)
                return;
        if (r->suspend_requested) {
                r->state = REQUEST_SUSPENDED;
                MHD_suspend_connection(r->connection);
                return;
        }
        log_error("Handler for %s %s returned without an answer.", r->method, r->path);
        (void) reply_error_static(r, 0, -EIO, API_ERROR_INTERNAL, "internal error: no answer");
}

void http_request_continue(HttpRequest *r, HttpHandler handler, void *userdata) {
        _unused_ _cleanup_(http_request_unrefp) HttpRequest *pin = http_request_ref(r);

        if (!r->connection || r->state != REQUEST_SUSPENDED)
                return; /* the client went away meanwhile */

        /* The connection stays suspended in MHD while the handler runs; an answer resumes it below. */
        r->state = REQUEST_DISPATCHED;
        r->suspend_requested = false;
        handler(r, userdata);
        if (!r->response && !r->suspend_requested && !r->streaming) {
                log_error("Handler for %s %s returned without an answer.", r->method, r->path);
                (void) reply_error_static(r, 0, -EIO, API_ERROR_INTERNAL, "internal error: no answer");
        }
        if (r->response && r->connection) {
                r->state = REQUEST_RESUMING;
                MHD_resume_connection(r->connection);
                server_kick(r->server);
        } else if (r->state == REQUEST_DISPATCHED)
                r->state = REQUEST_SUSPENDED;
}

static enum MHD_Result on_access(
        void *cls,
        struct MHD_Connection *connection,
        const char *url,
        const char *method,
        const char *version,
        const char *upload_data,
        size_t *upload_data_size,
        void **con_cls) {
        HttpServer *s = cls;
        HttpRequest *r = *con_cls;

        if (!r) {
                HttpConnection *c = connection_of(connection);
                const char *cl;

                if (c && c->refused)
                        return MHD_NO; /* answered 503 on accept: close */

                r = calloc(1, sizeof(HttpRequest));
                if (!r)
                        return MHD_NO;
                r->n_ref = 1; /* owned by MHD until on_completed() */
                r->server = s;
                r->connection = connection;
                r->conn = c;
                if (c)
                        c->request = r;
                r->id = ++s->next_request_id;
                r->start = now_usec(CLOCK_MONOTONIC);
                r->method = strdup(method);
                r->path = strdup(url);
                *con_cls = r;
                s->active++;
                r->next = s->requests;
                if (s->requests)
                        s->requests->prev = r;
                s->requests = r;
                if (!r->method || !r->path)
                        return MHD_NO;

                /* Refuse an announced oversized body before reading a byte of it. */
                cl = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
                if (cl) {
                        unsigned long long n;
                        char *end;

                        errno = 0;
                        n = strtoull(cl, &end, 10);
                        if (errno != 0 || *end != 0 || n > s->options.max_body)
                                r->body_too_large = true;
                }
                /* Whatever HTTP refuses is answered now, before the body. The head is checked
                 * here only: the body may be read into the buffer that holds it. */
                r->state = REQUEST_DISPATCHED;
                if (request_refuse_head(r, method, version))
                        return r->response ? request_queue(r) : MHD_NO;
                if (request_refuse(r, version))
                        return request_queue(r);
                if (s->options.early) {
                        /* A refusal here is answered before the body, which is then never read:
                         * the connection cannot carry another request. */
                        r->close = true;
                        s->options.early(r, s->options.userdata);
                        assert(!r->suspend_requested);
                        if (r->response)
                                return request_queue(r);
                        r->close = false;
                }
                r->state = REQUEST_RECEIVING;
                return MHD_YES;
        }

        if (*upload_data_size > 0) {
                size_t n = *upload_data_size;

                *upload_data_size = 0;
                if (r->body_too_large || r->body_size + n > s->options.max_body) {
                        /* A chunked body grew past the limit: drop the rest, answer 413 at the end. */
                        r->body_too_large = true;
                        return MHD_YES;
                }
                if (r->body_size + n + 1 > r->body_alloc) {
                        /* Geometric growth: one exact-size realloc per piece is quadratic. */
                        size_t want = MAX(r->body_alloc * 2, (size_t) 4096);

                        want = MIN(want, s->options.max_body + 1);
                        want = MAX(want, r->body_size + n + 1);
                        char *b = realloc(r->body, want);
                        if (!b)
                                return MHD_NO;
                        r->body = b;
                        r->body_alloc = want;
                }
                memcpy(r->body + r->body_size, upload_data, n);
                r->body_size += n;
                r->body[r->body_size] = 0;
                return MHD_YES;
        }

        switch (r->state) {
        case REQUEST_RECEIVING: {
                _unused_ _cleanup_(http_request_unrefp) HttpRequest *pin = http_request_ref(r);

                request_dispatch(r, version);
                if (r->state == REQUEST_SUSPENDED)
                        return MHD_YES;
                return request_queue(r);
        }
        case REQUEST_RESUMING:
                return request_queue(r);
        case REQUEST_DISPATCHED:
        case REQUEST_SUSPENDED:
        case REQUEST_DONE:
                break;
        }
        return MHD_YES;
}

static void on_completed(
        void *cls, struct MHD_Connection *connection, void **con_cls, enum MHD_RequestTerminationCode toe) {
        HttpServer *s = cls;
        HttpRequest *r = *con_cls;

        if (!r)
                return;
        *con_cls = NULL;

        if (log_get_max_level() >= LOG_DEBUG) {
                char rid[32], status[16], dur[32];
                usec_t d = now_usec(CLOCK_MONOTONIC) - r->start;

                snprintf(rid, sizeof(rid), "%llu", (unsigned long long) r->id);
                snprintf(status, sizeof(status), "%u", r->status);
                snprintf(
                        dur,
                        sizeof(dur),
                        "%llu.%03llu",
                        (unsigned long long) (d / 1000),
                        (unsigned long long) (d % 1000));
                log_full_errno_fields(
                        LOG_DEBUG,
                        0,
                        LOG_FIELDS(
                                { "REQUEST_ID", rid },
                                { "METHOD", r->method },
                                { "PATH", r->path },
                                { "STATUS", toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? status : "aborted" },
                                { "DURATION_MS", dur }),
                        "request %s %s",
                        r->method ?: "?",
                        r->path ?: "?");
        }

        if (r->done) {
                HttpRequestDone done = TAKE_PTR(r->done);

                done(toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? r->status : 0, r->done_userdata);
        }

        r->connection = NULL;
        keepalive_stop(r); /* the client went away, or the stream ended */
        if (r->conn) {
                /* the connection waits for its next request from now on */
                r->conn->request = NULL;
                r->conn->served = r->conn->served || toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
                connection_touch(r->conn);
                r->conn = NULL;
        }
        if (r->prev)
                r->prev->next = r->next;
        else
                s->requests = r->next;
        if (r->next)
                r->next->prev = r->prev;
        r->prev = r->next = NULL;
        assert(s->active > 0);
        s->active--;
        http_request_unref(r);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
        char buf[512];
        size_t n;

        (void) vsnprintf(buf, sizeof(buf), fmt, ap);
        n = strlen(buf);
        while (n > 0 && buf[n - 1] == '\n')
                buf[--n] = 0;
        log_debug("libmicrohttpd: %s", buf);
}

/* libmicrohttpd's decoder turns "%00" into a NUL, which cuts short every string a handler sees
 * ("DELETE /api/v1/networks/a%00b" would act on "a"): decode every other escape, keep "%00". */
static size_t unescape_keep_nul(void *cls, struct MHD_Connection *c, char *s) {
        char *w = s;

        for (const char *r = s; *r;) {
                int hi = r[0] == '%' ? unhexchar(r[1]) : -1, lo = hi >= 0 ? unhexchar(r[2]) : -1;

                if (lo >= 0 && (hi | lo) != 0) {
                        *w++ = (char) (hi << 4 | lo);
                        r += 3;
                } else
                        *w++ = *r++;
        }
        *w = 0;
        return (size_t) (w - s);
}

static HttpConnection *connection_of(struct MHD_Connection *mc) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

        return info ? info->socket_context : NULL;
}

/* Called once the request line is in, before libmicrohttpd parses the query. libmicrohttpd 0.9.75
 * keeps each query argument in the connection's memory pool (32 KiB) and, when that runs out,
 * loses the 431 it queued: the client waits for an answer until the idle timeout, and holds a
 * shutdown meanwhile. A target over our limits is therefore hidden from that parser (the line is
 * in libmicrohttpd's own writable read buffer) and answered 414 once the headers are in. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc) {
        HttpConnection *c = connection_of(mc);
        char *q = strchr(uri, '?');
        unsigned n_args = 0;
        bool refuse;

        if (c) {
                c->target = uri;
                c->target_len = strlen(uri);
        }

        if (q)
                for (const char *p = q; p; p = strchr(p + 1, '&'))
                        n_args++;
        refuse = strlen(uri) > HTTP_MAX_TARGET || n_args > HTTP_MAX_QUERY_ARGS;
        if (refuse && q)
                q[1] = 0;
        if (c)
                c->refused_target = refuse ? 414 : 0;
        return NULL;
}

static void server_run(HttpServer *s) {
        if (!s->daemon)
                return;
        s->kicked = false;
        if (MHD_run(s->daemon) != MHD_YES)
                log_debug("MHD_run() failed, ignoring.");
        server_arm(s);
}

static void server_arm(HttpServer *s) {
        MHD_UNSIGNED_LONG_LONG ms;
        int r;

        if (!s->daemon || !s->timer_source)
                return;
        /* A connection resumed during MHD_run() is not counted by MHD_get_timeout(): arming the
         * timer from it would cancel server_kick(). */
        if (s->kicked)
                return;
        if (MHD_get_timeout(s->daemon, &ms) != MHD_YES) {
                (void) sd_event_source_set_enabled(s->timer_source, SD_EVENT_OFF);
                return;
        }
        r = sd_event_source_set_time(s->timer_source, now_usec(CLOCK_MONOTONIC) + (usec_t) ms * USEC_PER_MSEC);
        if (r >= 0)
                r = sd_event_source_set_enabled(s->timer_source, SD_EVENT_ONESHOT);
        if (r < 0)
                log_debug_errno(r, "Failed to arm HTTP timer, ignoring: %m");
}

/* Makes the loop run MHD on its next iteration. Needed after a resume: in external-epoll mode
 * libmicrohttpd neither wakes its epoll fd nor shortens its timeout for it. */
static void server_kick(HttpServer *s) {
        int r;

        if (!s->timer_source)
                return;
        s->kicked = true;
        r = sd_event_source_set_time(s->timer_source, 0);
        if (r >= 0)
                r = sd_event_source_set_enabled(s->timer_source, SD_EVENT_ONESHOT);
        if (r < 0)
                log_debug_errno(r, "Failed to schedule the HTTP server, ignoring: %m");
}

static int on_io(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        server_run(userdata);
        return 0;
}

static int on_timer(sd_event_source *es, usec_t usec, void *userdata) {
        server_run(userdata);
        return 0;
}

/* Splits "host:port", "[v6]:port" or ":port". */
static int parse_listen(const char *listen, char **ret_host, char **ret_port) {
        _cleanup_free_ char *host = NULL, *port = NULL;
        const char *colon;

        if (listen[0] == '[') {
                const char *end = strchr(listen, ']');
                if (!end || end[1] != ':')
                        return -EINVAL;
                host = strndup(listen + 1, (size_t) (end - listen - 1));
                colon = end + 1;
        } else {
                colon = strrchr(listen, ':');
                if (!colon || strchr(listen, ':') != colon)
                        return -EINVAL;
                host = strndup(listen, (size_t) (colon - listen));
        }
        if (!host)
                return -ENOMEM;
        port = strdup(colon + 1);
        if (!port)
                return -ENOMEM;
        if (*port == 0 || strspn(port, "0123456789") != strlen(port) || strlen(port) > 5 || atoi(port) > 65535)
                return -EINVAL;
        *ret_host = TAKE_PTR(host);
        *ret_port = TAKE_PTR(port);
        return 0;
}

static int listen_on(const char *address, int *ret_fd, ApiError *reterr) {
        _cleanup_free_ char *host = NULL, *port = NULL;
        struct addrinfo hints = {
                .ai_family = AF_UNSPEC,
                .ai_socktype = SOCK_STREAM,
                .ai_flags = AI_PASSIVE | AI_NUMERICSERV,
        };
        struct addrinfo *res = NULL;
        int r, fd = -EBADF, last = -EADDRNOTAVAIL;

        r = parse_listen(address, &host, &port);
        if (r == -EINVAL)
                return api_error_set(
                        reterr, r, API_ERROR_INVALID_REQUEST, "listen address '%s': want host:port", address);
        if (r < 0)
                return r;

        r = getaddrinfo(*host ? host : NULL, port, &hints, &res);
        if (r != 0)
                return api_error_set(
                        reterr,
                        -EADDRNOTAVAIL,
                        API_ERROR_INVALID_REQUEST,
                        "listen address '%s': %s",
                        address,
                        gai_strerror(r));

        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int one = 1;

                fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
                if (fd < 0) {
                        last = -errno;
                        continue;
                }
                (void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
                        last = -errno;
                        fd = safe_close(fd);
                        continue;
                }
                break;
        }
        freeaddrinfo(res);
        if (fd < 0)
                return api_error_set(
                        reterr, last, API_ERROR_INTERNAL, "listen on %s: %s", address, strerror(-last));
        *ret_fd = fd;
        return 0;
}

static char *format_sockname(int fd) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        char host[INET6_ADDRSTRLEN], *out = NULL;

        if (getsockname(fd, (struct sockaddr *) &ss, &len) < 0)
                return NULL;
        if (ss.ss_family == AF_INET) {
                struct sockaddr_in *in = (struct sockaddr_in *) &ss;
                inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
                if (asprintf(&out, "%s:%u", host, ntohs(in->sin_port)) < 0)
                        return NULL;
        } else if (ss.ss_family == AF_INET6) {
                struct sockaddr_in6 *in6 = (struct sockaddr_in6 *) &ss;
                inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
                if (asprintf(&out, "[%s]:%u", host, ntohs(in6->sin6_port)) < 0)
                        return NULL;
        } else
                out = strdup("unix");
        return out;
}

int http_server_new(HttpServer **ret, sd_event *event, const HttpServerOptions *o, ApiError *reterr) {
        _cleanup_(http_server_freep) HttpServer *s = NULL;
        _cleanup_close_ int fd = -EBADF;
        const union MHD_DaemonInfo *info;
        int r;

        assert_return(ret && event && o && o->handler, -EINVAL);

        s = calloc(1, sizeof(HttpServer));
        if (!s)
                return -ENOMEM;
        s->event = sd_event_ref(event);
        s->options = *o;
        s->options.listen = NULL; /* not kept: the caller owns the string */
        if (s->options.max_body == 0)
                s->options.max_body = HTTP_MAX_BODY_DEFAULT;
        if (s->options.max_connections == 0)
                s->options.max_connections = 1024;
        if (s->options.idle_timeout == 0)
                s->options.idle_timeout = 120 * USEC_PER_SEC;

        if (o->no_listen)
                fd = -EBADF;
        else if (o->listen_fd >= 0)
                fd = o->listen_fd;
        else {
                r = listen_on(o->listen, &fd, reterr);
                if (r < 0)
                        return r;
        }
        s->address = fd >= 0 ? format_sockname(fd) : strdup("(connections handed in)");
        if (!s->address)
                return -ENOMEM;
        if (fd >= 0) {
                struct sockaddr_storage ss;
                socklen_t len = sizeof(ss);

                s->loopback = getsockname(fd, (struct sockaddr *) &ss, &len) >= 0 &&
                        http_sockaddr_is_loopback((struct sockaddr *) &ss, len);
        }
        /* With a per-peer limit, connection_admit() enforces max_connections by closing others;
         * MHD's own cap, which stops accepting, only needs room for those still being reaped. */
        unsigned hard_cap = s->options.max_connections +
                (s->options.max_connections_per_peer > 0 ? HTTP_CONNECTION_SLACK : 0);

        s->daemon = MHD_start_daemon(
                MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE | MHD_USE_ERROR_LOG |
                        (fd < 0 ? MHD_USE_NO_LISTEN_SOCKET : 0),
                0,
                NULL,
                NULL,
                on_access,
                s,
                MHD_OPTION_EXTERNAL_LOGGER, /* first, so that no message bypasses it */
                on_mhd_log,
                s,
                /* without a socket of its own, the listen option is a repeat of the connection limit */
                fd >= 0 ? MHD_OPTION_LISTEN_SOCKET : MHD_OPTION_CONNECTION_LIMIT,
                fd >= 0 ? (unsigned) fd : hard_cap,
                MHD_OPTION_NOTIFY_CONNECTION,
                on_connection,
                s,
                MHD_OPTION_NOTIFY_COMPLETED,
                on_completed,
                s,
                MHD_OPTION_UNESCAPE_CALLBACK,
                unescape_keep_nul,
                NULL,
                MHD_OPTION_URI_LOG_CALLBACK,
                on_uri,
                s,
                MHD_OPTION_CONNECTION_LIMIT,
                hard_cap,
                MHD_OPTION_CONNECTION_TIMEOUT,
                (unsigned) (s->options.idle_timeout / USEC_PER_SEC),
                MHD_OPTION_END);
        if (!s->daemon)
                return api_error_set(
                        reterr, -EIO, API_ERROR_INTERNAL, "failed to start the HTTP server on %s", s->address);
        TAKE_FD(fd); /* MHD owns the listening socket now */

        info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_EPOLL_FD);
        if (!info)
                return api_error_set(reterr, -EIO, API_ERROR_INTERNAL, "libmicrohttpd has no epoll fd");

        r = sd_event_add_io(event, &s->io_source, info->epoll_fd, EPOLLIN, on_io, s);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(s->io_source, "http-io");
        /* Accuracy 1 µs: sd-event would otherwise coalesce to 250 ms, and MHD often asks for 0. */
        r = sd_event_add_time(event, &s->timer_source, CLOCK_MONOTONIC, 0, 1, on_timer, s);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(s->timer_source, "http-timer");
        if (s->options.request_timeout > 0) {
                r = sd_event_add_time(event, &s->sweep_source, CLOCK_MONOTONIC, 0, 0, on_sweep, s);
                if (r < 0)
                        return r;
                (void) sd_event_source_set_enabled(s->sweep_source, SD_EVENT_OFF);
                (void) sd_event_source_set_description(s->sweep_source, "http-request-timeout");
        }
        server_arm(s);

        *ret = TAKE_PTR(s);
        return 0;
}

const char *http_server_address(HttpServer *s) {
        return s->address;
}

void http_server_quiesce(HttpServer *s) {
        MHD_socket fd;

        if (!s || s->quiesced || !s->daemon)
                return;
        s->quiesced = true;
        /* Open streams are subscriptions, not work in flight: end them so the drain can finish. */
        for (HttpRequest *r = s->requests; r; r = r->next)
                if (r->streaming)
                        (void) http_request_stream_end(r);
        fd = MHD_quiesce_daemon(s->daemon);
        if (fd != MHD_INVALID_SOCKET)
                (void) close(fd);
}

unsigned http_server_active_requests(HttpServer *s) {
        return s ? s->active : 0;
}

static HttpPeer *peer_ref(HttpServer *s, const char *key) {
        HttpPeer *p;

        for (p = s->peers; p; p = p->next)
                if (streq(p->key, key)) {
                        p->n_ref++;
                        return p;
                }
        p = calloc(1, sizeof(HttpPeer));
        if (!p)
                return NULL;
        p->key = strdup(key);
        if (!p->key) {
                free(p);
                return NULL;
        }
        p->n_ref = 1;
        p->next = s->peers;
        if (s->peers)
                s->peers->prev = p;
        s->peers = p;
        return p;
}

static void peer_unref(HttpServer *s, HttpPeer *p) {
        if (!p || --p->n_ref > 0)
                return;
        if (p->prev)
                p->prev->next = p->next;
        else
                s->peers = p->next;
        if (p->next)
                p->next->prev = p->prev;
        free(p->key);
        free(p);
}

/* Whether the connection waits on its client: for a request (idle, or headers or body arriving),
 * or for a response to be taken. A request a handler holds, or a stream, waits on us instead. A
 * file takes as long as the client needs to read it: a reader slower than file size / request_timeout
 * would otherwise get a cut file. One that stops reading is closed by MHD's idle timeout (no byte
 * sent for idle_timeout), which every send restarts. */
static bool connection_waits_on_client(HttpConnection *c) {
        HttpRequest *r = c->request;

        if (c->upgraded)
                return false;
        if (!r || r->state == REQUEST_RECEIVING)
                return true;
        return r->state == REQUEST_DONE && !r->streaming && !r->file;
}

/* Whether closing the connection loses no work: nothing on it reached a handler. */
static bool connection_evictable(HttpConnection *c) {
        return !c->closing && !c->upgraded &&
                (c->refused || !c->request || c->request->state == REQUEST_RECEIVING);
}

/* Whether the kernel holds bytes of the connection that MHD has yet to read: a request that
 * arrived while we were busy, on a connection that looks idle. Such a one is not idle. */
static bool connection_has_input(HttpConnection *c) {
        int n = 0;

        return ioctl(c->fd, FIONREAD, &n) >= 0 && n > 0;
}

static void peer_list_remove(HttpConnection *c) {
        HttpPeer *p = c->peer;

        if (c->peer_prev)
                c->peer_prev->peer_next = c->peer_next;
        else
                p->oldest = c->peer_next;
        if (c->peer_next)
                c->peer_next->peer_prev = c->peer_prev;
        else
                p->newest = c->peer_prev;
        c->peer_prev = c->peer_next = NULL;
}

static void peer_list_append(HttpConnection *c) {
        HttpPeer *p = c->peer;

        c->peer_prev = p->newest;
        c->peer_next = NULL;
        if (p->newest)
                p->newest->peer_next = c;
        else
                p->oldest = c;
        p->newest = c;
}

/* The connection starts waiting on its client now: for a request, or for a response to be taken.
 * Its peer's list stays ordered by that, oldest first, so that eviction finds the idlest at once. */
static void connection_touch(HttpConnection *c) {
        c->since = now_usec(CLOCK_MONOTONIC);
        if (!c->peer || c->peer->newest == c)
                return;
        peer_list_remove(c);
        peer_list_append(c);
}

/* The connection of peer (of anyone when NULL), except the one given, whose closing costs least:
 * the one that has waited longest on its client without a request pending, among those that never
 * had a request answered if there are any (a flood of idle or slow connections), else among all
 * (a keep-alive client that went quiet). */
static HttpConnection *connection_pick_victim(HttpServer *s, HttpPeer *peer, HttpConnection *except) {
        for (int pass = 0; pass < 2; pass++) {
                HttpConnection *best = NULL;

                if (peer) {
                        for (HttpConnection *c = peer->oldest; c && !best; c = c->peer_next)
                                if (c != except && (pass > 0 || !c->served) && connection_evictable(c) &&
                                    !connection_has_input(c))
                                        best = c;
                } else /* no peer to look at: the rare way, through every connection */
                        for (HttpConnection *c = s->connections; c; c = c->next)
                                if (c != except && (pass > 0 || !c->served) && connection_evictable(c) &&
                                    (!best || c->since < best->since) && !connection_has_input(c))
                                        best = c;
                if (best)
                        return best;
        }
        return NULL;
}

static HttpPeer *peer_heaviest(HttpServer *s) {
        HttpPeer *best = NULL;

        for (HttpPeer *p = s->peers; p; p = p->next)
                if (!best || p->open > best->open)
                        best = p;
        return best;
}

/* Closes a connection MHD owns: shut down, MHD sees the hang-up on its next run and reaps it. */
static void connection_close(HttpConnection *c) {
        if (c->closing)
                return;
        c->closing = true;
        c->server->n_open--;
        if (c->peer)
                c->peer->open--;
        (void) shutdown(c->fd, SHUT_RDWR);
}

/* Answers a connection just accepted with 503 and hangs up its sending side. Nothing was read or
 * written on it yet, so the answer is the first thing the client reads; its request, should one
 * come, is dropped (on_access()). It stays counted until the client leaves or request_timeout. */
static void connection_refuse(HttpConnection *c, const char *why) {
        char body[256], answer[512];
        int n, k;

        c->refused = true;
        n = snprintf(
                body,
                sizeof(body),
                "{\n  \"error\": {\n    \"code\": \"conflict\",\n    \"message\": \"conflict: %s, all "
                "of them busy; retry later\"\n  }\n}\n",
                why);
        k = snprintf(
                answer,
                sizeof(answer),
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: "
                "%d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s",
                n,
                body);
        if (n > 0 && (size_t) n < sizeof(body) && k > 0 && (size_t) k < sizeof(answer))
                (void) send(c->fd, answer, (size_t) k, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void) shutdown(c->fd, SHUT_WR);
}

/* The limits, applied to a connection just accepted: the peer over its share gives up the
 * connection that costs least; past the global limit, the peer holding the most does. */
static void connection_admit(HttpServer *s, HttpConnection *c) {
        HttpConnection *v;

        if (s->options.max_connections_per_peer == 0)
                return;
        while (c->peer && c->peer->open > s->options.max_connections_per_peer) {
                v = connection_pick_victim(s, c->peer, c);
                if (!v) {
                        log_debug(
                                "Refusing a connection from %s: all of its %u connections are busy.",
                                c->peer->key,
                                c->peer->open - 1);
                        connection_refuse(c, "too many connections from your address");
                        return;
                }
                log_debug(
                        "Connection limit of %s reached, closing its connection waiting longest.",
                        c->peer->key);
                connection_close(v);
        }
        while (s->n_open > s->options.max_connections) {
                v = connection_pick_victim(s, peer_heaviest(s), c) ?: connection_pick_victim(s, NULL, c);
                if (!v) {
                        log_debug("Refusing a connection: all %u connections are busy.", s->n_open - 1);
                        connection_refuse(c, "the server holds as many connections as it takes");
                        return;
                }
                log_debug("Connection limit reached, closing a connection of %s.", v->peer ? v->peer->key : "?");
                connection_close(v);
        }
}

static void sweep_arm(HttpServer *s) {
        usec_t interval = MIN(MAX(s->options.request_timeout / 4, 10 * USEC_PER_MSEC), USEC_PER_SEC);
        int r;

        if (!s->sweep_source)
                return;
        if (s->n_connections == 0) {
                (void) sd_event_source_set_enabled(s->sweep_source, SD_EVENT_OFF);
                return;
        }
        r = sd_event_source_set_time(s->sweep_source, now_usec(CLOCK_MONOTONIC) + interval);
        if (r >= 0)
                r = sd_event_source_set_enabled(s->sweep_source, SD_EVENT_ONESHOT);
        if (r < 0)
                log_debug_errno(r, "Failed to arm the HTTP request timeout, ignoring: %m");
}

/* request_timeout: connections that kept us waiting too long are closed. */
static int on_sweep(sd_event_source *es, usec_t usec, void *userdata) {
        HttpServer *s = userdata;
        usec_t now = now_usec(CLOCK_MONOTONIC);

        for (HttpConnection *c = s->connections; c; c = c->next)
                if (!c->closing && connection_waits_on_client(c) &&
                    now - c->since >= s->options.request_timeout) {
                        log_debug(
                                "Closing a connection of %s that kept us waiting for %s.",
                                c->peer ? c->peer->key : "a client",
                                c->request ? "its request or the end of its response" : "a request");
                        connection_close(c);
                }
        sweep_arm(s);
        return 0;
}

/* Takes the tag recorded for fd out of the pending list: NULL when there is none. */
static char *pending_tag_take(HttpServer *s, int fd) {
        for (PendingTag **p = &s->pending_tags; *p; p = &(*p)->next)
                if ((*p)->fd == fd) {
                        PendingTag *t = *p;
                        char *tag = t->tag;

                        *p = t->next;
                        free(t);
                        return tag;
                }
        return NULL;
}

static void connection_started(HttpServer *s, struct MHD_Connection *mc, void **socket_context) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        _cleanup_free_ char *tag = NULL;
        HttpConnection *c;
        int enabled = SD_EVENT_OFF;

        if (!info)
                return;
        tag = pending_tag_take(s, info->connect_fd);
        c = calloc(1, sizeof(HttpConnection));
        if (!c) {
                (void) shutdown(info->connect_fd, SHUT_RDWR); /* untracked, it would escape every limit */
                return;
        }
        c->server = s;
        c->fd = info->connect_fd;
        c->since = now_usec(CLOCK_MONOTONIC);
        c->tag = TAKE_PTR(tag);

        if (s->options.max_connections_per_peer > 0) {
                struct sockaddr_storage ss;
                socklen_t len = sizeof(ss);
                char key[HTTP_PEER_MAX];
                const char *name = c->tag;

                if (!name && getpeername(c->fd, (struct sockaddr *) &ss, &len) >= 0 &&
                    http_sockaddr_peer((struct sockaddr *) &ss, len, key))
                        name = key;
                if (name) {
                        c->peer = peer_ref(s, name);
                        if (!c->peer) {
                                (void) shutdown(c->fd, SHUT_RDWR);
                                free(c->tag);
                                free(c);
                                return;
                        }
                        c->peer->open++;
                        peer_list_append(c);
                }
        }

        c->next = s->connections;
        if (s->connections)
                s->connections->prev = c;
        s->connections = c;
        s->n_connections++;
        s->n_open++;
        *socket_context = c;

        connection_admit(s, c);
        if (s->sweep_source && sd_event_source_get_enabled(s->sweep_source, &enabled) >= 0 &&
            enabled == SD_EVENT_OFF)
                sweep_arm(s);
}

static void on_connection(
        void *cls, struct MHD_Connection *mc, void **socket_context, enum MHD_ConnectionNotificationCode code) {
        HttpServer *s = cls;
        HttpConnection *c = *socket_context;

        if (code == MHD_CONNECTION_NOTIFY_STARTED) {
                connection_started(s, mc, socket_context);
                return;
        }
        if (code != MHD_CONNECTION_NOTIFY_CLOSED || !c)
                return;
        *socket_context = NULL;
        if (c->request)
                c->request->conn = NULL;
        if (c->upgrade) {
                /* A 101 that never went out (the client left first): its owner hears so. One that
                 * went out is closed before its connection is, and is no longer the connection's. */
                HttpUpgrade *u = TAKE_PTR(c->upgrade);

                assert(!u->urh);
                u->func(/* u= */ NULL, -EBADF, /* extra= */ NULL, 0, u->userdata);
                free(u);
        }
        if (!c->closing) {
                s->n_open--;
                if (c->peer)
                        c->peer->open--;
        }
        if (c->prev)
                c->prev->next = c->next;
        else
                s->connections = c->next;
        if (c->next)
                c->next->prev = c->prev;
        s->n_connections--;
        if (c->peer)
                peer_list_remove(c);
        peer_unref(s, c->peer);
        free(c->tag);
        free(c);
}

int http_server_add_connection(HttpServer *s, int fd, const char *tag) {
        _cleanup_close_ int cfd = fd;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        bool ok;

        if (!s || fd < 0 || !s->daemon || s->quiesced || (tag && !s->options.no_listen))
                return -EINVAL;
        free(pending_tag_take(s, fd)); /* a stale entry of a socket MHD closed unannounced */
        if (tag) {
                _cleanup_free_ PendingTag *t = calloc(1, sizeof(PendingTag));
                char *copy = strdup(tag);

                if (!t || !copy) {
                        free(copy);
                        return -ENOMEM;
                }
                *t = (PendingTag){ .tag = copy, .fd = fd, .next = s->pending_tags };
                s->pending_tags = TAKE_PTR(t);
        }
        /* MHD announces the connection (on_connection()) before this returns or when it next runs:
         * the tag waits for it under the socket */
        ok = MHD_add_connection(s->daemon, TAKE_FD(cfd), (const struct sockaddr *) &sa, sizeof(sa)) == MHD_YES;
        if (!ok) {
                free(pending_tag_take(s, fd));
                return -EIO; /* MHD closed it */
        }
        server_kick(s);
        return 0;
}

const char *http_request_connection_tag(HttpRequest *r) {
        return r && r->conn ? r->conn->tag : NULL;
}

unsigned http_server_connections(HttpServer *s) {
        return s ? s->n_connections : 0;
}

bool http_server_is_loopback(HttpServer *s) {
        return s && s->loopback;
}

/* Hands the socket back to MHD, which closes it, and forgets the upgrade; u stays for its owner. */
static void upgrade_unlink(HttpUpgrade *u) {
        HttpServer *s = u->server;

        assert(s && u->urh);
        LIST_REMOVE(s->upgrades, u);
        s->n_upgrades--;
        if (u->conn)
                u->conn->upgrade = NULL;
        (void) MHD_upgrade_action(TAKE_PTR(u->urh), MHD_UPGRADE_ACTION_CLOSE);
        u->server = NULL;
        u->conn = NULL;
        server_kick(s);
}

static void on_upgraded(
        void *cls,
        struct MHD_Connection *mc,
        void *con_cls,
        const char *extra,
        size_t extra_size,
        MHD_socket sock,
        struct MHD_UpgradeResponseHandle *urh) {
        HttpUpgrade *u = cls;
        HttpServer *s = u->server;

        u->urh = urh;
        if (u->conn)
                u->conn->upgraded = true; /* no timeout of ours, never a victim of a limit */
        LIST_PREPEND(s->upgrades, u);
        s->n_upgrades++;
        u->func(u, sock, extra, extra_size, u->userdata);
}

int http_request_reply_upgrade(HttpRequest *r, const char *protocol, HttpUpgradeFunc func, void *userdata) {
        struct MHD_Response *resp;
        HttpUpgrade *u;
        int k;

        assert_return(protocol && func, -EINVAL);
        k = request_can_reply(r);
        if (k < 0)
                return k;
        if (!r->conn)
                return -ECONNRESET;
        assert_return(!r->conn->upgrade, -EALREADY);
        u = calloc(1, sizeof(HttpUpgrade));
        if (!u)
                return -ENOMEM;
        *u = (HttpUpgrade){ .server = r->server, .conn = r->conn, .func = func, .userdata = userdata };
        resp = MHD_create_response_for_upgrade(on_upgraded, u);
        if (!resp || MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, protocol) != MHD_YES) {
                if (resp)
                        MHD_destroy_response(resp);
                free(u);
                return -ENOMEM;
        }
        k = request_set_response(r, MHD_HTTP_SWITCHING_PROTOCOLS, /* content_type= */ NULL, resp);
        if (k < 0) {
                free(u);
                return k;
        }
        r->conn->upgrade = u;
        return 0;
}

HttpUpgrade *http_upgrade_close(HttpUpgrade *u) {
        if (!u)
                return NULL;
        if (u->server)
                upgrade_unlink(u);
        free(u);
        return NULL;
}

unsigned http_server_upgrades(HttpServer *s) {
        return s ? s->n_upgrades : 0;
}

int http_request_check_site(HttpRequest *r, ApiError *reterr) {
        const char *origin, *host;

        assert_return(r, -EINVAL);
        if (!r->server->loopback)
                return 0;
        origin = http_request_header(r, "Origin");
        if (origin && !http_origin_is_loopback(origin))
                return api_error_set(
                        reterr,
                        -EPERM,
                        API_ERROR_INVALID_REQUEST,
                        "Origin \"%.100s\" is not a loopback origin, and this server listens on loopback only",
                        origin);
        host = http_request_header(r, "Host");
        if (host && !http_host_is_loopback(host, strlen(host)))
                return api_error_set(
                        reterr,
                        -EPERM,
                        API_ERROR_INVALID_REQUEST,
                        "Host \"%.100s\" is not a loopback name, and this server listens on loopback only",
                        host);
        return 0;
}

HttpServer *http_server_free(HttpServer *s) {
        if (!s)
                return NULL;
        s->io_source = sd_event_source_disable_unref(s->io_source);
        s->timer_source = sd_event_source_disable_unref(s->timer_source);
        s->sweep_source = sd_event_source_disable_unref(s->sweep_source);
        /* Bodies still queued are handed back as -ESHUTDOWN, and answered as such; one being parsed
         * is waited for. */
        s->worker = worker_free(s->worker);
        /* Upgraded connections are closed here, their owners told nothing: they free their handles
         * later, with http_upgrade_close(). */
        while (s->upgrades)
                upgrade_unlink(s->upgrades);
        if (s->daemon) {
                usec_t deadline = now_usec(CLOCK_MONOTONIC) + HTTP_FREE_FLUSH_TIMEOUT;

                /* Connections without an answer under way have nothing to flush: a request still
                 * arriving would hold the flush below for its whole second. */
                for (HttpConnection *c = s->connections; c; c = c->next)
                        if (connection_evictable(c))
                                connection_close(c);
                /* libmicrohttpd refuses to stop with suspended connections, and their clients deserve
                 * an answer: reply to each, then let MHD flush for a bounded moment. */
                for (HttpRequest *r = s->requests; r; r = r->next)
                        if (r->state == REQUEST_SUSPENDED)
                                (void) reply_error_static(
                                        r, 0, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
                        else if (r->streaming)
                                (void) http_request_stream_end(r);
                while (s->requests && now_usec(CLOCK_MONOTONIC) < deadline)
                        (void) MHD_run_wait(s->daemon, 10);
                MHD_stop_daemon(s->daemon); /* completes every open request through on_completed() */
        }
        assert(!s->connections && !s->peers); /* MHD_stop_daemon() closed them all */
        sd_event_unref(s->event);
        free(s->address);
        while (s->pending_tags)
                free(pending_tag_take(s, s->pending_tags->fd));
        free(s);
        return NULL;
}

typedef struct HeaderCount {
        const char *name;
        unsigned n;
} HeaderCount;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        HeaderCount *c = cls;

        if (key && strcasecmp(key, c->name) == 0)
                c->n++;
        return MHD_YES;
}

unsigned http_request_header_count(HttpRequest *r, const char *name) {
        HeaderCount c = { .name = name };

        if (!r->connection)
                return 0;
        (void) MHD_get_connection_values(r->connection, MHD_HEADER_KIND, count_header, &c);
        return c.n;
}
