/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The console stream (api-console.h). Each stream is a timer that looks at console.log four times a
 * second and writes what is new; nothing blocks: a look is an open, an fstat and a pread of at most
 * API_CONSOLE_CHUNK bytes of a local file, and a client that does not read only fills its stream's
 * backlog (HTTP_STREAM_MAX_BACKLOG), after which the stream waits for it without reading more. The
 * VM is looked up by id on every look, so a deleted VM ends its streams without a hook in core. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api-console.h"
#include "api-session.h"
#include "cleanup.h"
#include "list.h"
#include "log.h"
#include "parse-util.h"
#include "string-util.h"

int api_console_parse_query(const char *offset, const char *backlog, ApiConsoleQuery *ret, ApiError *reterr) {
        ApiConsoleQuery q = { .backlog = API_CONSOLE_BACKLOG_DEFAULT };
        uint64_t v;

        assert_return(ret, -EINVAL);
        if (offset && backlog)
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "offset and backlog exclude each other");
        if (offset) {
                if (safe_atou64(offset, &v) < 0 || v > API_CONSOLE_OFFSET_MAX)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "offset must be a byte offset, 0..%" PRIu64,
                                API_CONSOLE_OFFSET_MAX);
                q.has_offset = true;
                q.offset = v;
        }
        if (backlog) {
                if (safe_atou64(backlog, &v) < 0 || v > API_CONSOLE_BACKLOG_MAX)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "backlog must be a byte count, 0..%" PRIu64,
                                API_CONSOLE_BACKLOG_MAX);
                q.backlog = v;
        }
        *ret = q;
        return 0;
}

uint64_t api_console_start(const ApiConsoleQuery *q, uint64_t size, const char *head, size_t head_size) {
        uint64_t from;
        const char *nl;

        if (q->has_offset)
                return MIN(q->offset, size);
        if (q->backlog >= size)
                return 0;
        from = size - q->backlog;
        /* The first whole line that starts in the backlog; a backlog without a line break in it is
         * shown as it is, a partial line being better than nothing. */
        nl = head ? memchr(head, '\n', MIN(head_size, (size_t) q->backlog)) : NULL;
        if (nl && (uint64_t) (nl - head) + 1 < q->backlog)
                from += (uint64_t) (nl - head) + 1;
        return from;
}

typedef struct ConsoleStream ConsoleStream;

struct ApiConsoleStreams {
        Manager *manager;
        ConsoleStream *streams; /* a doubly linked list */
        unsigned n_streams;
};

struct ConsoleStream {
        ApiConsoleStreams *owner;
        ConsoleStream *prev, *next;
        HttpRequest *req; /* a reference */
        char *vm_id;
        uint64_t offset;   /* the next byte of console.log to send */
        uint64_t last_ino; /* the file's inode at the last look: a new QEMU may replace the file */
        sd_event_source *timer;
        HttpRequestDone done; /* the request's completion callback before ours (the span) */
        void *done_userdata;
};

static ConsoleStream *console_stream_free(ConsoleStream *c) {
        if (!c)
                return NULL;
        if (c->owner) {
                LIST_REMOVE(c->owner->streams, c);
                c->owner->n_streams--;
        }
        sd_event_source_disable_unref(c->timer);
        http_request_unref(c->req);
        free(c->vm_id);
        free(c);
        return NULL;
}

/* The request is over (the client went, or the server ended the stream): the span hears it too. */
static void on_stream_done(unsigned status, void *userdata) {
        ConsoleStream *c = userdata;

        if (c->done)
                c->done(status, c->done_userdata);
        console_stream_free(c);
}

/* Ends the stream from our side; on_stream_done() frees it once the server is done with it. */
static void console_stream_end(ConsoleStream *c) {
        c->timer = sd_event_source_disable_unref(c->timer);
        (void) http_request_stream_end(c->req);
}

/* One look at the file: 0 to look again later, < 0 when the stream is to end. */
static int console_stream_look(ConsoleStream *c) {
        _cleanup_free_ char *buf = NULL;
        _cleanup_close_ int fd = -EBADF;
        uint64_t size, ino;
        ssize_t n;
        Vm *v;
        int r;

        v = manager_find_vm(c->owner->manager, c->vm_id);
        if (!v || vm_state(v) == VM_STATE_DELETING)
                return -ENOENT;
        fd = vm_console_open(v, &size, &ino);
        if (fd < 0)
                return 0; /* no console yet (QEMU has not started), or out of memory: the next look */
        /* A new run truncates or replaces the file: its bytes are all new. */
        if (size < c->offset || (c->last_ino != 0 && ino != c->last_ino))
                c->offset = 0;
        c->last_ino = ino;
        if (size == c->offset)
                return 0;

        buf = malloc(API_CONSOLE_CHUNK);
        if (!buf)
                return 0;
        n = pread(fd, buf, MIN((uint64_t) API_CONSOLE_CHUNK, size - c->offset), (off_t) c->offset);
        if (n <= 0)
                return 0;
        r = http_request_stream_write(c->req, buf, (size_t) n);
        if (r == -ENOBUFS || r == -ENOMEM)
                return 0; /* the client reads slower than the guest writes: it gets the rest later */
        if (r < 0)
                return r;
        c->offset += (uint64_t) n;
        return 0;
}

static int on_stream_timer(sd_event_source *s, usec_t usec, void *userdata) {
        ConsoleStream *c = userdata;

        if (console_stream_look(c) < 0) {
                console_stream_end(c);
                return 0;
        }
        (void) sd_event_source_set_time_relative(s, API_CONSOLE_POLL_USEC);
        (void) sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
        return 0;
}

ApiConsoleStreams *api_console_streams_new(Manager *m) {
        ApiConsoleStreams *s = calloc(1, sizeof(ApiConsoleStreams));

        if (s)
                s->manager = m;
        return s;
}

ApiConsoleStreams *api_console_streams_free(ApiConsoleStreams *s) {
        if (!s)
                return NULL;
        while (s->streams) {
                ConsoleStream *c = s->streams;

                /* The request outlives us: give it back its own callback before it can call ours. */
                http_request_on_done(c->req, c->done, c->done_userdata);
                console_stream_end(c);
                console_stream_free(c);
        }
        free(s);
        return NULL;
}

/* Where the stream starts, from the file as it is now (absent: an empty file). */
static uint64_t console_start_now(Vm *v, const ApiConsoleQuery *q, uint64_t *ret_ino) {
        _cleanup_free_ char *head = NULL;
        _cleanup_close_ int fd = -EBADF;
        uint64_t size;
        ssize_t n = 0;

        *ret_ino = 0;
        fd = vm_console_open(v, &size, ret_ino);
        if (fd < 0)
                return 0;
        if (!q->has_offset && q->backlog > 0 && q->backlog < size) {
                head = malloc(q->backlog);
                if (head)
                        n = pread(fd, head, q->backlog, (off_t) (size - q->backlog));
        }
        return api_console_start(q, size, head, n > 0 ? (size_t) n : 0);
}

void api_console_stream(
        ApiConsoleStreams *s, HttpRequest *req, const char *vm_id, HttpRequestDone done, void *done_userdata) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        ApiConsoleQuery q;
        ConsoleStream *c;
        char header[32];
        Vm *v;
        int r;

        /* The query is checked before the VM is looked up, as for every operation: 400 before 404. */
        r = api_console_parse_query(
                http_request_query(req, "offset"), http_request_query(req, "backlog"), &q, &e);
        if (r < 0) {
                (void) http_request_reply_error(req, &e);
                return;
        }
        v = api_session_vm(req, s->manager, vm_id);
        if (!v || !api_session_admit(req, s->n_streams, API_CONSOLE_STREAMS_MAX, "console streams"))
                return;

        c = calloc(1, sizeof(ConsoleStream));
        if (!c || !(c->vm_id = strdup(vm_id))) {
                free(c);
                (void) api_error_set(&e, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                (void) http_request_reply_error(req, &e);
                return;
        }
        c->req = http_request_ref(req);
        c->done = done;
        c->done_userdata = done_userdata;
        c->offset = console_start_now(v, &q, &c->last_ino);

        r = sd_event_add_time_relative(
                manager_event(s->manager),
                &c->timer,
                CLOCK_MONOTONIC,
                API_CONSOLE_POLL_USEC,
                /* accuracy= */ 50 * USEC_PER_MSEC,
                on_stream_timer,
                c);
        if (r < 0) {
                console_stream_free(c);
                (void) api_error_set(&e, r, API_ERROR_INTERNAL, "console stream: %s", strerror(-r));
                (void) http_request_reply_error(req, &e);
                return;
        }
        (void) sd_event_source_set_description(c->timer, "console-stream");

        (void) snprintf(header, sizeof(header), "%" PRIu64, c->offset);
        (void) http_request_add_header(req, "X-Console-Offset", header);
        (void) http_request_add_header(req, "Cache-Control", "no-store");
        r = http_request_reply_stream(req, 200, "text/plain");
        if (r < 0) {
                console_stream_free(c);
                (void) api_error_set(&e, r, API_ERROR_INTERNAL, "console stream: %s", strerror(-r));
                (void) http_request_reply_error(req, &e);
                return;
        }

        c->owner = s;
        LIST_PREPEND(s->streams, c);
        s->n_streams++;
        http_request_on_done(req, on_stream_done, c);

        /* What is there already goes out now, not at the first tick. */
        if (console_stream_look(c) < 0)
                console_stream_end(c);
}
