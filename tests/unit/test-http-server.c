/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "cleanup.h"
#include "http-server.h"
#include "http-util.h"
#include "json-util.h"
#include "log.h"

/* The server runs on this thread's sd-event loop, as in the daemon. Clients are plain blocking
 * sockets on a second thread, so that the loop under test is never blocked by the test itself. */

typedef struct Fixture {
        sd_event *event;
        HttpServer *server;
        uint16_t port;
        HttpRequest *parked; /* a suspended request, answered by a timer */
        sd_event_source *park_timer;
        int park_reply; /* what the late reply returned */
        unsigned order; /* completion order, bumped by handlers */
        unsigned slow_answered_at, fast_answered_at;
        unsigned done_status[8]; /* what http_request_on_done() reported, in completion order */
        unsigned n_done;
        HttpRequest *stream; /* an open event stream */
        sd_event_source *stream_write_timer, *stream_end_timer;
        HttpRequest *held[8]; /* requests on /hold, never answered by the test */
        size_t n_held;
        int json_async[4]; /* what http_request_body_json_async() returned, in arrival order */
        unsigned n_json_async;
} Fixture;

#define KEEPALIVE (100 * USEC_PER_MSEC)

static int on_stream_write(sd_event_source *s, uint64_t usec, void *userdata) {
        Fixture *f = userdata;

        assert_int_equal(http_request_stream_write(f->stream, "data: x\n\n", 9), 0);
        return 0;
}

static int on_stream_end(sd_event_source *s, uint64_t usec, void *userdata) {
        Fixture *f = userdata;

        assert_int_equal(http_request_stream_end(f->stream), 0);
        f->stream = http_request_unref(f->stream);
        return 0;
}

static void on_request_done(unsigned status, void *userdata) {
        Fixture *f = userdata;

        if (f->n_done < ELEMENTSOF(f->done_status))
                f->done_status[f->n_done] = status;
        f->n_done++;
}

static int on_park_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Fixture *f = userdata;

        f->park_reply = http_request_reply_text(f->parked, 200, "slow\n");
        f->slow_answered_at = ++f->order;
        f->parked = http_request_unref(f->parked);
        return 0;
}

static void on_json_async(HttpRequest *req, json_t *body, const ApiError *error, void *userdata) {
        json_auto_t *v = NULL;

        if (error) {
                assert_null(body);
                assert_int_equal(http_request_reply_error(req, error), 0);
                return;
        }
        v = json_pack("{s:I}", "n", (json_int_t) json_array_size(body));
        assert_int_equal(http_request_reply_json(req, 200, v), 0);
}

static void handler(HttpRequest *req, void *userdata) {
        Fixture *f = userdata;
        const char *path = http_request_path(req);

        http_request_on_done(req, on_request_done, f);
        if (streq(path, "/slow") || streq(path, "/slow-abandoned") || streq(path, "/forever")) {
                /* A long wait: the connection is parked and another event answers it. */
                http_request_suspend(req);
                f->parked = http_request_ref(req);
                if (!streq(path, "/forever"))
                        assert_int_equal(
                                sd_event_add_time_relative(
                                        f->event,
                                        &f->park_timer,
                                        CLOCK_MONOTONIC,
                                        300 * USEC_PER_MSEC,
                                        1,
                                        on_park_timer,
                                        f),
                                0);
                return;
        }
        if (streq(path, "/fast")) {
                f->fast_answered_at = ++f->order;
                assert_int_equal(http_request_reply_text(req, 200, "fast\n"), 0);
                return;
        }
        if (streq(path, "/json")) {
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
                json_auto_t *v = NULL;

                if (http_request_body_json(req, &v, &e) < 0) {
                        assert_int_equal(http_request_reply_error(req, &e), 0);
                        return;
                }
                assert_int_equal(http_request_reply_json(req, 200, v), 0);
                return;
        }
        if (streq(path, "/json-async")) {
                int r = http_request_body_json_async(req, on_json_async, f);

                assert_true(r >= 0);
                if (f->n_json_async < ELEMENTSOF(f->json_async))
                        f->json_async[f->n_json_async++] = r;
                return;
        }
        if (streq(path, "/query")) {
                const char *q = http_request_query(req, "lines");
                assert_int_equal(http_request_reply_text(req, 200, q ?: "(none)"), 0);
                return;
        }
        if (streq(path, "/stream") || streq(path, "/stream-open")) {
                assert_int_equal(http_request_reply_stream(req, 200, "text/event-stream"), 0);
                assert_int_equal(http_request_stream_keepalive(req, KEEPALIVE, ": ka\n\n"), 0);
                f->stream = http_request_ref(req);
                if (streq(path, "/stream-open"))
                        return; /* until the client leaves */
                /* an event of its own after 250 ms, the end after 650 ms */
                assert_int_equal(
                        sd_event_add_time_relative(
                                f->event,
                                &f->stream_write_timer,
                                CLOCK_MONOTONIC,
                                250 * USEC_PER_MSEC,
                                1,
                                on_stream_write,
                                f),
                        0);
                assert_int_equal(
                        sd_event_add_time_relative(
                                f->event,
                                &f->stream_end_timer,
                                CLOCK_MONOTONIC,
                                650 * USEC_PER_MSEC,
                                1,
                                on_stream_end,
                                f),
                        0);
                return;
        }
        if (streq(path, "/hold") && f->n_held < ELEMENTSOF(f->held)) {
                /* a handler that keeps the request: its connection is busy, not idle */
                http_request_suspend(req);
                f->held[f->n_held++] = http_request_ref(req);
                return;
        }
        if (streq(path, "/site")) {
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

                if (http_request_check_site(req, &e) < 0)
                        assert_int_equal(http_request_reply_error_status(req, 403, &e), 0);
                else
                        assert_int_equal(http_request_reply_text(req, 200, "same site"), 0);
                return;
        }
        if (streq(path, "/tag")) {
                assert_int_equal(
                        http_request_reply_text(req, 200, http_request_connection_tag(req) ?: "(none)"), 0);
                return;
        }
        if (streq(path, "/silent"))
                return; /* a handler bug: the server must still answer */
        assert_int_equal(http_request_reply_text(req, 404, "nope\n"), 0);
}

static int setup_with(void **state, HttpServerOptions o) {
        Fixture *f = calloc(1, sizeof(Fixture));
        const char *addr, *colon;

        assert_non_null(f);
        assert_int_equal(sd_event_new(&f->event), 0);
        o.handler = handler;
        o.userdata = f;
        assert_int_equal(http_server_new(&f->server, f->event, &o, NULL), 0);
        addr = http_server_address(f->server);
        colon = strrchr(addr, ':');
        if (colon)
                f->port = (uint16_t) atoi(colon + 1);
        *state = f;
        return 0;
}

static int setup(void **state) {
        return setup_with(
                state, (HttpServerOptions){ .listen = "127.0.0.1:0", .listen_fd = -EBADF, .max_body = 1024 });
}

/* Bodies large enough to be parsed off the loop. */
static int setup_large_bodies(void **state) {
        return setup_with(
                state,
                (HttpServerOptions){ .listen = "127.0.0.1:0", .listen_fd = -EBADF, .max_body = 1 << 20 });
}

/* Small limits: 2 connections per peer, 4 in all. */
static int setup_limits(void **state) {
        return setup_with(
                state,
                (HttpServerOptions){
                        .listen = "127.0.0.1:0",
                        .listen_fd = -EBADF,
                        .max_body = 1024,
                        .max_connections = 4,
                        .max_connections_per_peer = 2,
                });
}

/* Half a second for each request. */
static int setup_request_timeout(void **state) {
        return setup_with(
                state,
                (HttpServerOptions){
                        .listen = "127.0.0.1:0",
                        .listen_fd = -EBADF,
                        .max_body = 1024,
                        .request_timeout = 500 * USEC_PER_MSEC,
                });
}

static int teardown(void **state) {
        Fixture *f = *state;

        f->park_timer = sd_event_source_disable_unref(f->park_timer);
        f->parked = http_request_unref(f->parked);
        f->stream_write_timer = sd_event_source_disable_unref(f->stream_write_timer);
        f->stream_end_timer = sd_event_source_disable_unref(f->stream_end_timer);
        f->stream = http_request_unref(f->stream);
        f->server = http_server_free(f->server); /* answers the held requests 409 */
        for (size_t i = 0; i < f->n_held; i++)
                http_request_unref(f->held[i]);
        f->event = sd_event_unref(f->event);
        free(f);
        return 0;
}

/* ---- client side, on its own thread ---- */

typedef struct Exchange {
        uint16_t port;
        char request[160000]; /* room for a body the server parses off the loop */
        size_t request_len;   /* when the request holds NUL bytes; 0: up to the first */
        char response[8192];
        unsigned status;
        int close_early; /* disconnect after sending, without reading */
} Exchange;

/* A client socket from 127.0.0.<from> (another peer for each), reads giving up after 5 s: a
 * server that never answers fails the test instead of hanging it. */
static int client_connect_from(uint16_t port, uint8_t from) {
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
        struct sockaddr_in src = { .sin_family = AF_INET };
        struct timeval tv = { .tv_sec = 5 };
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        src.sin_addr.s_addr = htonl(INADDR_LOOPBACK - 1 + from);
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
            bind(fd, (struct sockaddr *) &src, sizeof(src)) < 0 ||
            connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0)
                return -1;
        return fd;
}

static int client_connect(uint16_t port) {
        return client_connect_from(port, 1);
}

/* Whether the server hung up on fd within timeout_ms, without sending anything. */
static bool client_hung_up(int fd, int timeout_ms) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        char c;

        if (poll(&p, 1, timeout_ms) <= 0)
                return false;
        return recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

static void client_send(int fd, const char *req) {
        size_t n = strlen(req), off = 0;
        while (off < n) {
                ssize_t k = write(fd, req + off, n - off);
                if (k <= 0)
                        return;
                off += (size_t) k;
        }
}

static void exchange_send(int fd, const Exchange *x) {
        size_t n = x->request_len ?: strlen(x->request), off = 0;

        while (off < n) {
                ssize_t k = write(fd, x->request + off, n - off);
                if (k <= 0)
                        return;
                off += (size_t) k;
        }
}

static void client_read_all(int fd, Exchange *x) {
        size_t off = 0;
        for (;;) {
                ssize_t k = read(fd, x->response + off, sizeof(x->response) - 1 - off);
                if (k <= 0)
                        break;
                off += (size_t) k;
        }
        x->response[off] = 0;
        if (sscanf(x->response, "HTTP/1.1 %u", &x->status) != 1)
                x->status = 0;
}

static const char *body_of(const Exchange *x) {
        const char *b = strstr(x->response, "\r\n\r\n");
        return b ? b + 4 : "";
}

typedef struct ClientJob ClientJob;
struct ClientJob {
        Exchange *exchanges;
        size_t n;
        int done_fd; /* an eventfd the client thread writes when it is done */
        bool finished;
        bool sequential_slow_fast;
        void (*script)(ClientJob *job); /* instead of the exchanges */
        uint16_t port;
        int result[8]; /* what the script observed */
};

static void *client_thread(void *p) {
        ClientJob *job = p;

        if (job->script)
                job->script(job);
        else if (job->sequential_slow_fast) {
                /* Send the slow request first, then the fast one on a second connection, then read both. */
                int a = client_connect(job->exchanges[0].port), b;
                client_send(a, job->exchanges[0].request);
                usleep(50 * 1000);
                b = client_connect(job->exchanges[1].port);
                client_send(b, job->exchanges[1].request);
                client_read_all(b, &job->exchanges[1]);
                client_read_all(a, &job->exchanges[0]);
                close(a);
                close(b);
        } else
                for (size_t i = 0; i < job->n; i++) {
                        Exchange *x = &job->exchanges[i];
                        int fd = client_connect(x->port);
                        exchange_send(fd, x);
                        if (x->close_early) {
                                usleep(50 * 1000);
                                close(fd);
                                continue;
                        }
                        client_read_all(fd, x);
                        close(fd);
                }
        (void) eventfd_write(job->done_fd, 1);
        return NULL;
}

static int on_clients_done(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        ClientJob *job = userdata;

        job->finished = true;
        return 0;
}

/* Runs the server's loop until the client job finishes. sd-event is not thread-safe, so the
 * client thread only ever touches an eventfd that the loop watches. */
static void run_clients(Fixture *f, ClientJob *job) {
        sd_event_source *s = NULL;
        pthread_t t;

        job->done_fd = eventfd(0, EFD_CLOEXEC);
        assert_true(job->done_fd >= 0);
        assert_int_equal(sd_event_add_io(f->event, &s, job->done_fd, EPOLLIN, on_clients_done, job), 0);
        assert_int_equal(pthread_create(&t, NULL, client_thread, job), 0);
        while (!job->finished)
                assert_true(sd_event_run(f->event, UINT64_MAX) >= 0);
        assert_int_equal(pthread_join(t, NULL), 0);
        sd_event_source_disable_unref(s);
        close(job->done_fd);
}

static void set_request(Exchange *x, uint16_t port, const char *fmt, ...) _printf_(3, 4);
static void set_request(Exchange *x, uint16_t port, const char *fmt, ...) {
        va_list ap;

        memset(x, 0, sizeof(*x));
        x->port = port;
        va_start(ap, fmt);
        vsnprintf(x->request, sizeof(x->request), fmt, ap);
        va_end(ap);
}

#define GET(path) "GET " path " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"

static void test_suspend_does_not_block_others(void **state) {
        Fixture *f = *state;
        Exchange x[2];
        ClientJob job = { .exchanges = x, .n = 2, .sequential_slow_fast = true };

        set_request(&x[0], f->port, GET("/slow"));
        set_request(&x[1], f->port, GET("/fast"));
        run_clients(f, &job);

        assert_int_equal(x[0].status, 200);
        assert_string_equal(body_of(&x[0]), "slow\n");
        assert_int_equal(x[1].status, 200);
        assert_string_equal(body_of(&x[1]), "fast\n");
        /* The fast request was answered while the slow one was parked. */
        assert_true(f->fast_answered_at < f->slow_answered_at);
        assert_int_equal(f->park_reply, 0);
        assert_int_equal(http_server_active_requests(f->server), 0);
}

static void test_reply_after_client_left(void **state) {
        Fixture *f = *state;
        Exchange x[2];
        ClientJob job = { .exchanges = x, .n = 2 };

        set_request(&x[0], f->port, GET("/slow-abandoned"));
        x[0].close_early = 1;
        /* The second request keeps the loop alive until the parked one's timer fired. */
        set_request(&x[1], f->port, GET("/fast"));
        run_clients(f, &job);
        /* Let the timer of the abandoned request fire. */
        while (f->parked)
                assert_true(sd_event_run(f->event, 1000 * USEC_PER_MSEC) >= 0);
        assert_int_equal(x[1].status, 200);
        /* MHD may or may not have noticed the hang-up before the timer: either way, no crash and no leak. */
        assert_true(f->park_reply == 0 || f->park_reply == -ECONNRESET);
}

static void test_on_done(void **state) {
        Fixture *f = *state;
        Exchange x[4];
        ClientJob job = { .exchanges = x, .n = 4 };
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;

        set_request(&x[0], f->port, GET("/fast"));
        set_request(&x[1], f->port, GET("/elsewhere"));
        set_request(&x[2], f->port, GET("/silent"));
        set_request(&x[3], f->port, GET("/slow"));
        run_clients(f, &job);
        while (f->n_done < 4 && now_usec(CLOCK_MONOTONIC) < deadline)
                assert_true(sd_event_run(f->event, 100 * USEC_PER_MSEC) >= 0);

        /* once per request, with the status that went out, also for a suspended one */
        assert_int_equal(f->n_done, 4);
        assert_int_equal(f->done_status[0], 200);
        assert_int_equal(f->done_status[1], 404);
        assert_int_equal(f->done_status[2], 500);
        assert_int_equal(f->done_status[3], 200);
}

static void test_json_body(void **state) {
        Fixture *f = *state;
        Exchange x[3];
        ClientJob job = { .exchanges = x, .n = 3 };

        set_request(
                &x[0],
                f->port,
                "POST /json HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 9\r\n\r\n{\"a\": 1}\n");
        set_request(
                &x[1],
                f->port,
                "POST /json HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 5\r\n\r\n{\"a\":");
        set_request(
                &x[2],
                f->port,
                "POST /json HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
        run_clients(f, &job);

        assert_int_equal(x[0].status, 200);
        assert_string_equal(body_of(&x[0]), "{\n  \"a\": 1\n}\n");
        assert_non_null(strstr(x[0].response, "Content-Type: application/json"));

        assert_int_equal(x[1].status, 400);
        assert_non_null(strstr(body_of(&x[1]), "\"code\": \"invalid_request\""));
        assert_non_null(strstr(body_of(&x[1]), "invalid request: body: malformed JSON"));

        assert_int_equal(x[2].status, 400);
        assert_non_null(strstr(body_of(&x[2]), "body: empty"));
}

/* "[1,1,…,1]" of n ones, the closing bracket left out when malformed. */
static char *ones(size_t n, bool malformed) {
        char *s = malloc(2 * n + 2);

        assert_non_null(s);
        s[0] = '[';
        for (size_t i = 0; i < n; i++) {
                s[1 + 2 * i] = '1';
                s[2 + 2 * i] = i + 1 < n ? ',' : malformed ? 0 : ']';
        }
        s[2 * n + 1] = 0;
        return s;
}

static void test_json_body_async(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        Fixture *f = *state;
        _cleanup_free_ char *small = ones(10, false), *large = ones(40000, false), *bad = ones(40000, true);
        char want[512];
        json_t *v = NULL;
        Exchange x[3];
        ClientJob job = { .exchanges = x, .n = 3 };

        assert_true(strlen(large) > HTTP_BODY_PARSE_INLINE_MAX);
        set_request(
                &x[0],
                f->port,
                "POST /json-async HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                strlen(small),
                small);
        set_request(
                &x[1],
                f->port,
                "POST /json-async HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                strlen(large),
                large);
        set_request(
                &x[2],
                f->port,
                "POST /json-async HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                strlen(bad),
                bad);
        run_clients(f, &job);

        /* a small body at once, larger ones later, from the worker */
        assert_int_equal(f->n_json_async, 3);
        assert_int_equal(f->json_async[0], 0);
        assert_int_equal(f->json_async[1], 1);
        assert_int_equal(f->json_async[2], 1);

        assert_int_equal(x[0].status, 200);
        assert_string_equal(body_of(&x[0]), "{\n  \"n\": 10\n}\n");
        assert_int_equal(x[1].status, 200);
        assert_string_equal(body_of(&x[1]), "{\n  \"n\": 40000\n}\n");

        /* the error is the one parsing on the loop gives */
        assert_int_equal(x[2].status, 400);
        assert_true(json_parse_body(bad, strlen(bad), &v, &e) < 0);
        snprintf(want, sizeof(want), "\"message\": \"%s\"", e.message);
        assert_non_null(strstr(body_of(&x[2]), want));
        assert_int_equal(http_server_active_requests(f->server), 0);
}

static void test_body_limit(void **state) {
        Fixture *f = *state;
        Exchange x[2];
        ClientJob job = { .exchanges = x, .n = 2 };
        char chunk[700];

        memset(chunk, 'x', sizeof(chunk) - 1);
        chunk[sizeof(chunk) - 1] = 0;
        /* Announced too large: refused before the body is read. */
        set_request(
                &x[0],
                f->port,
                "POST /json HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 1025\r\n\r\n");
        /* Chunked, growing past the limit. */
        set_request(
                &x[1],
                f->port,
                "POST /json HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                "2bb\r\n%s\r\n2bb\r\n%s\r\n0\r\n\r\n",
                chunk,
                chunk);
        run_clients(f, &job);

        for (size_t i = 0; i < 2; i++) {
                assert_int_equal(x[i].status, 413);
                assert_non_null(strstr(body_of(&x[i]), "\"code\": \"invalid_request\""));
                assert_non_null(strstr(body_of(&x[i]), "larger than the limit of 1024 bytes"));
        }
}

static void test_query_and_silent_handler(void **state) {
        Fixture *f = *state;
        Exchange x[3];
        ClientJob job = { .exchanges = x, .n = 3 };

        set_request(&x[0], f->port, GET("/query?lines=12"));
        set_request(&x[1], f->port, GET("/query"));
        set_request(&x[2], f->port, GET("/silent"));
        run_clients(f, &job);

        assert_string_equal(body_of(&x[0]), "12");
        assert_string_equal(body_of(&x[1]), "(none)");
        assert_int_equal(x[2].status, 500);
        assert_non_null(strstr(body_of(&x[2]), "internal_error"));
}

static void *shutdown_client(void *p) {
        Exchange *x = p;
        int fd = client_connect(x->port);

        client_send(fd, x->request);
        client_read_all(fd, x);
        close(fd);
        return NULL;
}

static void test_free_answers_suspended(void **state) {
        Fixture *f = *state;
        Exchange x;
        pthread_t t;

        set_request(&x, f->port, GET("/forever"));
        assert_int_equal(pthread_create(&t, NULL, shutdown_client, &x), 0);
        while (!f->parked)
                assert_true(sd_event_run(f->event, 1000 * USEC_PER_MSEC) >= 0);
        assert_int_equal(http_server_active_requests(f->server), 1);

        /* Freeing the server with a parked request answers it instead of aborting. */
        f->server = http_server_free(f->server);
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(x.status, 409);
        assert_non_null(strstr(body_of(&x), "shutting down"));
        assert_false(http_request_is_connected(f->parked));
}

static unsigned count(const char *haystack, const char *needle) {
        unsigned n = 0;

        for (const char *p = strstr(haystack, needle); p; p = strstr(p + 1, needle))
                n++;
        return n;
}

static void test_stream_keepalive(void **state) {
        Fixture *f = *state;
        Exchange x;
        ClientJob job = { .exchanges = &x, .n = 1 };
        const char *body, *data;
        unsigned before, total;

        set_request(&x, f->port, GET("/stream"));
        run_clients(f, &job);

        assert_int_equal(x.status, 200);
        body = body_of(&x);
        data = strstr(body, "data: x\n\n");
        assert_non_null(data);
        /* silent for 100 ms: a filler; the event moves the next one; none more often than that */
        before = count(body, ": ka\n\n") - count(data, ": ka\n\n");
        total = count(body, ": ka\n\n");
        assert_in_range(before, 1, 2);
        assert_in_range(total, 3, 6);
        assert_null(f->stream);
        assert_int_equal(http_server_active_requests(f->server), 0);
}

static void test_stream_keepalive_client_gone(void **state) {
        Fixture *f = *state;
        Exchange x;
        ClientJob job = { .exchanges = &x, .n = 1 };
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;

        set_request(&x, f->port, GET("/stream-open"));
        x.close_early = 1;
        run_clients(f, &job);

        /* Nobody ends the stream: its fillers find the client gone, and the request completes. */
        while (f->n_done < 1 && now_usec(CLOCK_MONOTONIC) < deadline)
                assert_true(sd_event_run(f->event, 100 * USEC_PER_MSEC) >= 0);
        assert_int_equal(f->n_done, 1);
        assert_int_equal(f->done_status[0], 0);
        assert_false(http_request_is_connected(f->stream));
        assert_int_equal(http_server_active_requests(f->server), 0);
        /* and no filler is written any more */
        assert_int_equal(http_request_stream_write(f->stream, "x", 1), -ECONNRESET);
        assert_int_equal(sd_event_run(f->event, 3 * KEEPALIVE), 0);
}

static void test_status_from_error(void **state) {
        static const struct {
                ApiErrorCode code;
                int error;
                unsigned status;
        } cases[] = {
                { API_ERROR_NOT_FOUND, -ENOENT, 404 },
                { API_ERROR_INVALID_REQUEST, -EINVAL, 400 },
                { API_ERROR_CONFLICT, -EEXIST, 409 },
                { API_ERROR_UNSUPPORTED, -EOPNOTSUPP, 501 },
                { API_ERROR_TIMEOUT, -ETIMEDOUT, 504 },
                { API_ERROR_VM_FAILED, -EIO, 500 },
                { API_ERROR_INTERNAL, -ENOMEM, 500 },
                /* a body over the limit */
                { API_ERROR_INVALID_REQUEST, -EFBIG, 413 },
                { API_ERROR_INVALID_REQUEST, -E2BIG, 413 },
                /* ...but only for invalid requests */
                { API_ERROR_CONFLICT, -EFBIG, 409 },
                { API_ERROR_INTERNAL, -EFBIG, 500 },
                /* a refused bearer token */
                { API_ERROR_UNAUTHORIZED, -EACCES, 401 },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

                (void) api_error_set(&e, cases[i].error, cases[i].code, "x");
                assert_int_equal(http_status_from_error(&e), cases[i].status);
        }

        /* Every code has a status, and an unset error is an internal one. */
        for (int c = 0; c < _API_ERROR_CODE_MAX; c++) {
                ApiError e = { .error = -EIO, .code = (ApiErrorCode) c };
                unsigned s = http_status_from_error(&e);

                assert_in_range(s, 400, 599);
        }
        ApiError unset = API_ERROR_NULL;
        assert_int_equal(http_status_from_error(&unset), 500);
}

static void test_loopback_names(void **state) {
        static const struct {
                const char *host;
                bool loopback;
        } hosts[] = {
                { "localhost", true },
                { "LocalHost:8080", true },
                { "127.0.0.1", true },
                { "127.0.0.1:8080", true },
                { "127.1.2.3:1", true },
                { "[::1]", true },
                { "[::1]:8080", true },
                { "[0:0:0:0:0:0:0:1]:80", true },
                { "[::ffff:127.0.0.1]:80", true },
                { "", false },
                { "evil.example", false },
                { "evil.example:8080", false },
                { "localhost.evil.example", false },
                { "127.0.0.1.evil.example", false },
                { "127.0.0.1:", false },
                { "127.0.0.1:80x", false },
                { "127.0.0.1:8080:1", false },
                { "127.1", false }, /* a name to a resolver, not an address */
                { "0x7f.0.0.1", false },
                { "128.0.0.1", false },
                { "10.0.0.1", false },
                { "[::2]", false },
                { "[::1", false },
                { "[::1]x", false },
                { "::1", false },
        };
        static const struct {
                const char *origin;
                bool loopback;
        } origins[] = {
                { "http://localhost:3000", true },
                { "https://127.0.0.1", true },
                { "http://[::1]:8080", true },
                { "null", false },
                { "http://evil.example", false },
                { "http://localhost.evil.example", false },
                { "http://user@localhost", false },
                { "://localhost", false },
                { "localhost", false },
        };
        static const struct {
                const char *ct;
                bool json;
        } types[] = {
                { "application/json", true },
                { "Application/JSON", true },
                { "application/json; charset=utf-8", true },
                { "application/json;charset=UTF-8", true },
                { " application/json ", true },
                { "application/jsonx", false },
                { "application/json-patch+json", false },
                { "text/plain", false },
                { "application/x-www-form-urlencoded", false },
                { "", false },
        };

        for (size_t i = 0; i < ELEMENTSOF(hosts); i++)
                if (http_host_is_loopback(hosts[i].host, strlen(hosts[i].host)) != hosts[i].loopback)
                        fail_msg("host %s: want loopback=%d", hosts[i].host, hosts[i].loopback);
        for (size_t i = 0; i < ELEMENTSOF(origins); i++)
                if (http_origin_is_loopback(origins[i].origin) != origins[i].loopback)
                        fail_msg("origin %s: want loopback=%d", origins[i].origin, origins[i].loopback);
        for (size_t i = 0; i < ELEMENTSOF(types); i++)
                if (http_content_type_is_json(types[i].ct) != types[i].json)
                        fail_msg("content type %s: want json=%d", types[i].ct, types[i].json);
        assert_false(http_content_type_is_json(NULL));
        assert_false(http_origin_is_loopback(NULL));
}

static void test_site_guard(void **state) {
        Fixture *f = *state;
        Exchange x[6];
        ClientJob job = { .exchanges = x, .n = 6 };

        assert_true(http_server_is_loopback(f->server));
        set_request(
                &x[0], f->port, "GET /site HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nConnection: close\r\n\r\n", f->port);
        set_request(
                &x[1],
                f->port,
                "GET /site HTTP/1.1\r\nHost: evil.example:%u\r\nConnection: close\r\n\r\n",
                f->port);
        set_request(
                &x[2],
                f->port,
                "GET /site HTTP/1.1\r\nHost: localhost\r\nOrigin: http://evil.example\r\nConnection: close\r\n\r\n");
        set_request(
                &x[3],
                f->port,
                "GET /site HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:3000\r\nConnection: "
                "close\r\n\r\n");
        set_request(&x[4], f->port, "GET /site HTTP/1.1\r\nHost: [::1]:80\r\nConnection: close\r\n\r\n");
        set_request(
                &x[5],
                f->port,
                "GET /site HTTP/1.1\r\nHost: localhost\r\nOrigin: null\r\nConnection: close\r\n\r\n");
        run_clients(f, &job);

        assert_int_equal(x[0].status, 200);
        assert_int_equal(x[1].status, 403);
        assert_non_null(strstr(body_of(&x[1]), "\"code\": \"invalid_request\""));
        assert_non_null(strstr(body_of(&x[1]), "Host \\\"evil.example:"));
        assert_int_equal(x[2].status, 403);
        assert_non_null(strstr(body_of(&x[2]), "Origin \\\"http://evil.example\\\" is not a loopback origin"));
        assert_int_equal(x[3].status, 200);
        assert_int_equal(x[4].status, 200);
        assert_int_equal(x[5].status, 403);
}

/* A server on every address serves whatever names it: the guard is off. */
static int setup_any_address(void **state) {
        return setup_with(state, (HttpServerOptions){ .listen = "0.0.0.0:0", .listen_fd = -EBADF });
}

static void test_site_guard_off_elsewhere(void **state) {
        Fixture *f = *state;
        Exchange x[1];
        ClientJob job = { .exchanges = x, .n = 1 };

        assert_false(http_server_is_loopback(f->server));
        set_request(
                &x[0],
                f->port,
                "GET /site HTTP/1.1\r\nHost: vm-host.example\r\nOrigin: http://portal.example\r\nConnection: "
                "close\r\n\r\n");
        run_clients(f, &job);
        assert_int_equal(x[0].status, 200);
}

static void test_host_required(void **state) {
        Fixture *f = *state;
        Exchange x[4];
        ClientJob job = { .exchanges = x, .n = 4 };

        set_request(&x[0], f->port, "GET /fast HTTP/1.1\r\nConnection: close\r\n\r\n");
        set_request(&x[1], f->port, "GET /fast HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n");
        set_request(&x[2], f->port, "GET /fast HTTP/1.0\r\n\r\n");
        set_request(&x[3], f->port, "POST /json HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
        run_clients(f, &job);

        assert_int_equal(x[0].status, 400);
#if MHD_VERSION >= 0x00097701
        /* libmicrohttpd 0.9.77 and later (Debian 13) answer this one themselves, with a page of theirs */
        assert_non_null(strstr(body_of(&x[0]), "Host:"));
#else
        assert_non_null(strstr(body_of(&x[0]), "Host: an HTTP/1.1 request needs the header"));
#endif
        assert_non_null(strstr(x[0].response, "Connection: close"));
        assert_int_equal(x[1].status, 400);
        assert_non_null(strstr(body_of(&x[1]), "exactly one"));
        /* HTTP/1.0 has no such rule */
        assert_non_null(strstr(x[2].response, " 200 "));
        assert_string_equal(body_of(&x[2]), "fast\n");
        assert_int_equal(x[3].status, 400);
        /* the handler never saw any of them */
        assert_int_equal(f->fast_answered_at, 1);
}

/* Like set_request(), for bytes that may hold NULs. */
static void set_request_bytes(Exchange *x, uint16_t port, const char *data, size_t len) {
        memset(x, 0, sizeof(*x));
        assert_true(len < sizeof(x->request));
        x->port = port;
        memcpy(x->request, data, len);
        x->request_len = len;
}

#define SET_BYTES(x, port, literal) set_request_bytes(x, port, literal, sizeof(literal) - 1)

/* libmicrohttpd 0.9.75 reads a header up to a NUL byte in it and drops the rest of the line: such
 * a request is refused whole, before any handler, also as the second request of a connection. */
static void test_nul_in_head(void **state) {
        Fixture *f = *state;
        Exchange x[7];
        ClientJob job = { .exchanges = x, .n = 7 };

        SET_BYTES(
                &x[0],
                f->port,
                "GET /fast HTTP/1.1\r\nHost: 127.0.0.1\0evil.example\r\nConnection: close\r\n\r\n");
        SET_BYTES(&x[1], f->port, "GET /fast HTTP/1.1\r\nHost: t\r\nX-A: \0\r\nConnection: close\r\n\r\n");
        SET_BYTES(
                &x[2],
                f->port,
                "GET /fast HTTP/1.1\r\nHost: t\r\n\r\n"
                "GET /fast HTTP/1.1\r\nHost: t\r\nX-B: 1\0\r\nConnection: close\r\n\r\n");
        SET_BYTES(&x[3], f->port, "GET /fast\0x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        SET_BYTES(&x[4], f->port, "GET /fast HTTP/1.1\r\nHost: t\r\nX-C: a\r\n b\r\nConnection: close\r\n\r\n");
        /* blanks around values, bare LF, empty values, a query, spaces before the version */
        SET_BYTES(&x[5], f->port, "GET /fast?a=1&b=%41  HTTP/1.1\nHost:\t t \nX-E:\r\nConnection: close\n\n");
        /* a NUL just before a bare LF reads as a CRLF: nothing after it is lost, so it passes */
        SET_BYTES(&x[6], f->port, "GET /fast HTTP/1.1\r\nHost: t\0\nConnection: close\r\n\r\n");
        run_clients(f, &job);

#if MHD_VERSION >= 0x00097701
        /* libmicrohttpd 0.9.77 and later (Debian 13) refuse a NUL byte themselves: a 400 of theirs for
         * one in a header (also right before a bare LF), the connection closed without an answer for
         * one in the request line. A folded line they join into one value (RFC 9112 §5.2). */
        assert_int_equal(x[0].status, 400);
        assert_non_null(strstr(x[0].response, "Connection: close"));
        assert_int_equal(x[1].status, 400);
        assert_non_null(strstr(x[2].response, "HTTP/1.1 200 "));
        assert_non_null(strstr(x[2].response, "HTTP/1.1 400 "));
        assert_int_not_equal(x[3].status, 200);
        assert_int_equal(x[4].status, 200);
        assert_int_equal(x[6].status, 400);
        /* the handler saw x[2]'s first request and x[4] only, never a NUL byte */
        assert_int_equal(f->fast_answered_at, 2);
        return;
#endif
        assert_int_equal(x[0].status, 400);
        assert_non_null(strstr(body_of(&x[0]), "header Host contains a NUL byte"));
        assert_non_null(strstr(x[0].response, "Connection: close"));
        assert_int_equal(x[1].status, 400);
        assert_non_null(strstr(body_of(&x[1]), "header X-A contains a NUL byte"));
        /* the first request of the connection is served, the second refused */
        assert_non_null(strstr(x[2].response, "HTTP/1.1 200 "));
        assert_non_null(strstr(x[2].response, "HTTP/1.1 400 "));
        assert_non_null(strstr(x[2].response, "header X-B contains a NUL byte"));
        assert_int_equal(x[3].status, 400);
        assert_non_null(strstr(body_of(&x[3]), "request line contains a NUL byte"));
        assert_int_equal(x[4].status, 400);
        assert_non_null(strstr(body_of(&x[4]), "folded"));
        assert_int_equal(x[5].status, 200);
        assert_int_equal(x[6].status, 200);
        /* the handler saw x[2]'s first request, x[5] and x[6] only */
        assert_int_equal(f->fast_answered_at, 3);
}

static void target_with_args(Exchange *x, uint16_t port, unsigned n_args, size_t pad) {
        char *p;

        set_request(x, port, "GET /query?lines=1");
        p = x->request + strlen(x->request);
        for (unsigned i = 1; i < n_args; i++)
                p += sprintf(p, "&a%u=1", i);
        memset(p, 'x', pad);
        p += pad;
        strcpy(p, " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        assert_true(strlen(x->request) < sizeof(x->request));
}

/* Oversized targets are answered (414) and closed, never left waiting: libmicrohttpd 0.9.75 alone
 * leaves a request with a few hundred query arguments unanswered. */
static void test_target_limits(void **state) {
        Fixture *f = *state;
        Exchange x[5];
        ClientJob job = { .exchanges = x, .n = 5 };

        target_with_args(&x[0], f->port, HTTP_MAX_QUERY_ARGS, 0);
        target_with_args(&x[1], f->port, HTTP_MAX_QUERY_ARGS + 1, 0);
        target_with_args(&x[2], f->port, 465, 0);
        target_with_args(&x[3], f->port, 2000, 0);
        target_with_args(&x[4], f->port, 1, HTTP_MAX_TARGET);
        run_clients(f, &job);

        assert_int_equal(x[0].status, 200);
        assert_string_equal(body_of(&x[0]), "1");
        for (size_t i = 1; i < 5; i++) {
                if (x[i].status != 414)
                        fail_msg("request %zu: status %u, want 414", i, x[i].status);
                assert_non_null(strstr(x[i].response, "Connection: close"));
                assert_non_null(strstr(body_of(&x[i]), "\"code\": \"invalid_request\""));
                assert_non_null(
                        strstr(body_of(&x[i]), "request target: longer than 8192 bytes or more than 64"));
        }
}

/* Sends path's GET (Connection: close) on fd and reads the answer: its status. */
static unsigned client_get(int fd, uint16_t port, const char *path, Exchange *x) {
        set_request(x, port, "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path);
        client_send(fd, x->request);
        client_read_all(fd, x);
        return x->status;
}

static void idle_then_request(ClientJob *job) {
        int a = client_connect(job->port), b, c;
        Exchange x;

        usleep(100 * 1000);
        b = client_connect(job->port);
        usleep(100 * 1000);
        /* a third connection from the same address: a, idle longest, makes room */
        c = client_connect(job->port);
        job->result[0] = (int) client_get(c, job->port, "/fast", &x);
        job->result[1] = client_hung_up(a, 2000);
        job->result[2] = client_hung_up(b, 300);
        close(a);
        close(b);
        close(c);
}

static void test_per_peer_evicts_idle(void **state) {
        Fixture *f = *state;
        ClientJob job = { .script = idle_then_request, .port = f->port };

        run_clients(f, &job);
        assert_int_equal(job.result[0], 200);
        assert_true(job.result[1]);  /* the idlest went */
        assert_false(job.result[2]); /* the other stayed */
}

static void served_then_flood(ClientJob *job) {
        int a = client_connect(job->port), b, c;
        Exchange x;

        /* a is a keep-alive client with a request answered, idle since; b never sent anything */
        client_send(a, "GET /fast HTTP/1.1\r\nHost: t\r\n\r\n");
        usleep(200 * 1000);
        b = client_connect(job->port);
        usleep(100 * 1000);
        c = client_connect(job->port);
        job->result[0] = (int) client_get(c, job->port, "/fast", &x);
        job->result[1] = client_hung_up(b, 2000);
        /* a still works: its answer is waiting, then a second request */
        job->result[2] = recv(a, x.response, sizeof(x.response) - 1, 0) > 0;
        job->result[3] = (int) client_get(a, job->port, "/fast", &x);
        close(a);
        close(b);
        close(c);
}

static void test_per_peer_spares_served(void **state) {
        Fixture *f = *state;
        ClientJob job = { .script = served_then_flood, .port = f->port };

        run_clients(f, &job);
        assert_int_equal(job.result[0], 200);
        assert_true(job.result[1]); /* the one that never sent a request went, although a waited longer */
        assert_true(job.result[2]);
        assert_int_equal(job.result[3], 200);
}

static void busy_then_request(ClientJob *job) {
        int a = client_connect(job->port), b = client_connect(job->port), c, d;
        Exchange x;

        client_send(a, GET("/hold"));
        client_send(b, GET("/hold"));
        usleep(200 * 1000);
        /* both connections of 127.0.0.1 are in a handler: a third one gets 503 */
        c = client_connect(job->port);
        client_read_all(c, &x);
        job->result[0] = (int) x.status;
        job->result[1] = strstr(body_of(&x), "too many connections from your address") != NULL &&
                strstr(x.response, "Retry-After: 1") != NULL;
        /* another address is not affected */
        d = client_connect_from(job->port, 2);
        job->result[2] = (int) client_get(d, job->port, "/fast", &x);
        close(a);
        close(b);
        close(c);
        close(d);
}

static void test_per_peer_busy_gets_503(void **state) {
        Fixture *f = *state;
        ClientJob job = { .script = busy_then_request, .port = f->port };

        run_clients(f, &job);
        assert_int_equal(job.result[0], 503);
        assert_true(job.result[1]);
        assert_int_equal(job.result[2], 200);
        assert_int_equal(f->n_held, 2);
}

static void global_limit(ClientJob *job) {
        int idle[4], c, closed = 0;
        Exchange x;

        /* two peers at their share fill the server */
        for (size_t i = 0; i < 4; i++) {
                idle[i] = client_connect_from(job->port, 2 + i / 2);
                usleep(20 * 1000);
        }
        c = client_connect_from(job->port, 4);
        job->result[0] = (int) client_get(c, job->port, "/fast", &x);
        for (size_t i = 0; i < 4; i++)
                closed += client_hung_up(idle[i], i == 0 ? 2000 : 300);
        job->result[1] = closed;
        for (size_t i = 0; i < 4; i++)
                close(idle[i]);
        close(c);
}

static void test_global_limit_takes_from_heaviest(void **state) {
        Fixture *f = *state;
        ClientJob job = { .script = global_limit, .port = f->port };

        run_clients(f, &job);
        assert_int_equal(job.result[0], 200);
        assert_int_equal(job.result[1], 1); /* one connection made room, the oldest of a peer */
}

static void slow_request(ClientJob *job) {
        static const char req[] =
                "GET /fast HTTP/1.1\r\nHost: t\r\nX-Padding: 0123456789012345678901234567890123456789\r\n\r\n";
        int fd = client_connect(job->port);
        size_t i;
        Exchange x;

        /* one byte every 50 ms: the whole request would take 4 s */
        for (i = 0; i < strlen(req); i++) {
                if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1 || client_hung_up(fd, 50))
                        break;
        }
        job->result[0] = i < strlen(req);
        close(fd);

        /* a keep-alive connection left idle after its answer is closed too */
        fd = client_connect(job->port);
        set_request(&x, job->port, "GET /fast HTTP/1.1\r\nHost: t\r\n\r\n");
        client_send(fd, x.request);
        for (size_t off = 0; off < sizeof(x.response) - 1;) {
                ssize_t k = recv(fd, x.response + off, sizeof(x.response) - 1 - off, 0);
                if (k <= 0)
                        break;
                off += (size_t) k;
                x.response[off] = 0;
                if (strstr(x.response, "\r\n\r\nfast\n")) {
                        job->result[1] = true;
                        break;
                }
        }
        job->result[2] = client_hung_up(fd, 3000);
        close(fd);
}

static void test_request_timeout(void **state) {
        Fixture *f = *state;
        ClientJob job = { .script = slow_request, .port = f->port };

        run_clients(f, &job);
        assert_true(job.result[0]); /* cut before it finished sending */
        assert_true(job.result[1]);
        assert_true(job.result[2]);
        /* and both are gone from the server once it saw its own hang-ups */
        for (usec_t deadline = now_usec(CLOCK_MONOTONIC) + 2 * USEC_PER_SEC;
             http_server_connections(f->server) > 0 && now_usec(CLOCK_MONOTONIC) < deadline;)
                assert_true(sd_event_run(f->event, 10 * USEC_PER_MSEC) >= 0);
        assert_int_equal(http_server_connections(f->server), 0);
}

static int setup_handed_in(void **state) {
        return setup_with(
                state,
                (HttpServerOptions){ .listen_fd = -EBADF, .no_listen = true, .max_connections_per_peer = 1 });
}

static bool pump_until_readable(Fixture *f, int fd) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;

        while (now_usec(CLOCK_MONOTONIC) < deadline) {
                if (poll(&p, 1, 0) > 0)
                        return true;
                assert_true(sd_event_run(f->event, 10 * USEC_PER_MSEC) >= 0);
        }
        return false;
}

/* A server with a listener of its own takes no tag: a socket it accepts could come to the number of
 * one handed in with a tag that MHD closed before announcing it. The socket is closed all the same. */
static void test_tag_needs_no_listen(void **state) {
        Fixture *f = *state;
        int a[2];
        char byte;

        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
        assert_int_equal(http_server_add_connection(f->server, a[1], "vm-a"), -EINVAL);
        assert_int_equal(read(a[0], &byte, 1), 0);
        assert_int_equal(http_server_connections(f->server), 0);
        safe_close(a[0]);
}

/* Connections handed in keep their tag, and a per-peer limit counts by tag. */
static void test_handed_in_tags(void **state) {
        Fixture *f = *state;
        int a[2], b[2], c[2];
        char buf[4096];
        ssize_t n;

        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b), 0);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c), 0);
        assert_int_equal(http_server_add_connection(f->server, a[1], "vm-a"), 0);
        assert_int_equal(http_server_add_connection(f->server, b[1], "vm-b"), 0);
        /* vm-a's second connection takes the place of its idle first one; vm-b is not touched */
        assert_int_equal(http_server_add_connection(f->server, c[1], "vm-a"), 0);

        client_send(c[0], GET("/tag"));
        assert_true(pump_until_readable(f, c[0]));
        n = read(c[0], buf, sizeof(buf) - 1);
        assert_true(n > 0);
        buf[n] = 0;
        assert_non_null(strstr(buf, "\r\n\r\nvm-a"));
        assert_true(pump_until_readable(f, a[0]));
        assert_int_equal(read(a[0], buf, sizeof(buf)), 0);
        assert_false(client_hung_up(b[0], 0));

        client_send(b[0], GET("/tag"));
        assert_true(pump_until_readable(f, b[0]));
        n = read(b[0], buf, sizeof(buf) - 1);
        assert_true(n > 0);
        buf[n] = 0;
        assert_non_null(strstr(buf, "\r\n\r\nvm-b"));
        close(a[0]);
        close(b[0]);
        close(c[0]);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_suspend_does_not_block_others, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reply_after_client_left, setup, teardown),
                cmocka_unit_test_setup_teardown(test_on_done, setup, teardown),
                cmocka_unit_test_setup_teardown(test_json_body, setup, teardown),
                cmocka_unit_test_setup_teardown(test_json_body_async, setup_large_bodies, teardown),
                cmocka_unit_test_setup_teardown(test_body_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_query_and_silent_handler, setup, teardown),
                cmocka_unit_test_setup_teardown(test_free_answers_suspended, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stream_keepalive, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stream_keepalive_client_gone, setup, teardown),
                cmocka_unit_test(test_status_from_error),
                cmocka_unit_test(test_loopback_names),
                cmocka_unit_test_setup_teardown(test_site_guard, setup, teardown),
                cmocka_unit_test_setup_teardown(test_site_guard_off_elsewhere, setup_any_address, teardown),
                cmocka_unit_test_setup_teardown(test_host_required, setup, teardown),
                cmocka_unit_test_setup_teardown(test_nul_in_head, setup, teardown),
                cmocka_unit_test_setup_teardown(test_target_limits, setup, teardown),
                cmocka_unit_test_setup_teardown(test_per_peer_evicts_idle, setup_limits, teardown),
                cmocka_unit_test_setup_teardown(test_per_peer_spares_served, setup_limits, teardown),
                cmocka_unit_test_setup_teardown(test_per_peer_busy_gets_503, setup_limits, teardown),
                cmocka_unit_test_setup_teardown(test_global_limit_takes_from_heaviest, setup_limits, teardown),
                cmocka_unit_test_setup_teardown(test_request_timeout, setup_request_timeout, teardown),
                cmocka_unit_test_setup_teardown(test_tag_needs_no_listen, setup, teardown),
                cmocka_unit_test_setup_teardown(test_handed_in_tags, setup_handed_in, teardown),
        };
        log_set_max_level(LOG_WARNING);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
