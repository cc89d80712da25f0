/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "fuzz.h"
#include "log.h"
#include "trace.h"

/* A W3C traceparent header as a client sends it, and the same bytes as the method and path of a
 * server span: parsed, continued, encoded to OTLP JSON. The tracer never runs its loop, so nothing
 * is sent; its queue fills up and then drops. */

static sd_event *event;
static Tracer *tracer;

static void cleanup(void) {
        tracer = tracer_free(tracer, 0);
        event = sd_event_unref(event);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        _cleanup_free_ char *message = NULL;

        log_set_max_level(LOG_CRIT);
        /* nothing listens on the discard port, and the loop never runs anyway */
        if (setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9", 1) < 0 ||
            setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on", 1) < 0 || sd_event_new(&event) < 0 ||
            tracer_new_from_env(&tracer, event, "fuzz", &message) < 0 || !tracer)
                abort();
        atexit(cleanup);
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_free_ char *s = strndup((const char *) data, size);
        char header[56], again[56];
        Span *span, *child;

        if (!s)
                return 0;
        span = span_start_http_server(tracer, s, s, s, s);
        if (!span)
                abort(); /* only on OOM */
        span_set_http_route(span, s, s);

        /* a child continues the trace, whatever the header said */
        child = span_start(tracer, s, SPAN_KIND_INTERNAL, span, /* traceparent= */ NULL);
        if (span_traceparent(span, header) < 0 || span_traceparent(child, again) < 0)
                abort();
        if (strlen(header) != 55 || memcmp(header, again, 36) != 0 || memcmp(header + 52, again + 52, 3) != 0)
                abort();
        span_set_attr_string(child, s, s);
        span_set_error(child, s);
        span_end(child);
        span_end_http_server(span, 500);
        return 0;
}
