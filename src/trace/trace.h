/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* OpenTelemetry traces over OTLP/HTTP (JSON encoding), exported asynchronously with libcurl's multi
 * interface on the sd-event loop. Configured by the standard OTEL_* environment variables; without
 * OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) there is no tracer and every
 * span function below is a no-op on NULL. */

typedef struct Tracer Tracer;
typedef struct Span Span;

typedef enum SpanKind {
        SPAN_KIND_INTERNAL = 1,
        SPAN_KIND_SERVER = 2,
        SPAN_KIND_CLIENT = 3,
} SpanKind;

/* *ret is NULL (and 0 returned) when tracing is not configured. -EINVAL with a message in
 * *ret_message (malloc'd) for a configuration that cannot work. */
int tracer_new_from_env(Tracer **ret, sd_event *event, const char *version, char **ret_message);
/* Sends what is queued (waiting at most timeout_usec for the collector), then frees. */
Tracer *tracer_free(Tracer *t, uint64_t timeout_usec);

/* Starts a span. parent NULL: a root span, or the remote parent that traceparent (a W3C header value,
 * may be NULL) names. Returns NULL when t is NULL or on OOM; a span that is not sampled is still
 * returned (its children inherit the decision) and is never exported. */
Span *span_start(Tracer *t, const char *name, SpanKind kind, const Span *parent, const char *traceparent);
void span_set_attr_string(Span *s, const char *key, const char *value);
void span_set_attr_int(Span *s, const char *key, int64_t value);
void span_set_error(Span *s, const char *message);
/* Ends, queues for export when sampled, and frees. NULL is fine. */
void span_end(Span *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Span *, span_end);
