/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cleanup.h"
#include "http-server.h"
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
        if (streq(path, "/silent"))
                return; /* a handler bug: the server must still answer */
        assert_int_equal(http_request_reply_text(req, 404, "nope\n"), 0);
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        const char *addr, *colon;

        assert_non_null(f);
        assert_int_equal(sd_event_new(&f->event), 0);
        assert_int_equal(
                http_server_new(
                        &f->server,
                        f->event,
                        &(HttpServerOptions){
                                .listen = "127.0.0.1:0",
                                .listen_fd = -EBADF,
                                .max_body = 1024,
                                .handler = handler,
                                .userdata = f,
                        },
                        NULL),
                0);
        addr = http_server_address(f->server);
        colon = strrchr(addr, ':');
        assert_non_null(colon);
        f->port = (uint16_t) atoi(colon + 1);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        f->park_timer = sd_event_source_disable_unref(f->park_timer);
        f->parked = http_request_unref(f->parked);
        f->stream_write_timer = sd_event_source_disable_unref(f->stream_write_timer);
        f->stream_end_timer = sd_event_source_disable_unref(f->stream_end_timer);
        f->stream = http_request_unref(f->stream);
        f->server = http_server_free(f->server);
        f->event = sd_event_unref(f->event);
        free(f);
        return 0;
}

/* ---- client side, on its own thread ---- */

typedef struct Exchange {
        uint16_t port;
        char request[2048];
        char response[8192];
        unsigned status;
        int close_early; /* disconnect after sending, without reading */
} Exchange;

static int client_connect(uint16_t port) {
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0)
                return -1;
        return fd;
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

typedef struct ClientJob {
        Exchange *exchanges;
        size_t n;
        int done_fd; /* an eventfd the client thread writes when it is done */
        bool finished;
        bool sequential_slow_fast;
} ClientJob;

static void *client_thread(void *p) {
        ClientJob *job = p;

        if (job->sequential_slow_fast) {
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
                        client_send(fd, x->request);
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

/* Connections handed in with one tag are capped; other tags are not affected, and a closed
 * connection frees its slot. */
static void test_connections_per_tag(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(http_server_freep) HttpServer *s = NULL;
        int a[3][2], b[2], r = -EBUSY;
        char c;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(
                http_server_new(
                        &s,
                        e,
                        &(HttpServerOptions){
                                .listen_fd = -EBADF,
                                .no_listen = true,
                                .max_connections_per_tag = 2,
                                .handler = handler,
                        },
                        NULL),
                0);
        for (size_t i = 0; i < ELEMENTSOF(a); i++)
                assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a[i]), 0);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b), 0);

        assert_int_equal(http_server_add_connection(s, a[0][1], "vm-a"), 0);
        assert_int_equal(http_server_add_connection(s, a[1][1], "vm-a"), 0);
        assert_int_equal(http_server_add_connection(s, a[2][1], "vm-a"), -EBUSY);
        assert_int_equal(read(a[2][0], &c, 1), 0); /* closed at once */
        assert_int_equal(http_server_add_connection(s, b[1], "vm-b"), 0);

        /* once the server has seen one of vm-a's connections close, vm-a gets a slot again */
        close(a[0][0]);
        close(a[2][0]);
        for (unsigned i = 0; i < 100 && r == -EBUSY; i++) {
                assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a[2]), 0);
                r = http_server_add_connection(s, a[2][1], "vm-a");
                if (r == -EBUSY) {
                        close(a[2][0]);
                        assert_true(sd_event_run(e, 50 * USEC_PER_MSEC) >= 0);
                }
        }
        assert_int_equal(r, 0);

        s = http_server_free(s);
        close(a[1][0]);
        close(a[2][0]);
        close(b[0]);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_suspend_does_not_block_others, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reply_after_client_left, setup, teardown),
                cmocka_unit_test_setup_teardown(test_on_done, setup, teardown),
                cmocka_unit_test_setup_teardown(test_json_body, setup, teardown),
                cmocka_unit_test_setup_teardown(test_body_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_query_and_silent_handler, setup, teardown),
                cmocka_unit_test_setup_teardown(test_free_answers_suspended, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stream_keepalive, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stream_keepalive_client_gone, setup, teardown),
                cmocka_unit_test(test_connections_per_tag),
        };
        log_set_max_level(LOG_WARNING);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
