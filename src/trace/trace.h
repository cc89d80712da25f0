/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* OpenTelemetry traces over OTLP/HTTP (JSON encoding), exported asynchronously with libcurl's multi
 * interface on the sd-event loop. Configured by the standard OTEL_* environment variables; without
 * OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) there is no tracer and every
 * span function below is a no-op on NULL.
 *
 * Variables read (empty counts as unset; the TRACES_ variant wins over the general one):
 *   OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER=none   no tracer (otlp is the only other value)
 *   OTEL_EXPORTER_OTLP_TRACES_ENDPOINT                  the URL spans are POSTed to, as is
 *   OTEL_EXPORTER_OTLP_ENDPOINT                         base URL; "/v1/traces" is appended
 *   OTEL_EXPORTER_OTLP_[TRACES_]HEADERS                 key=value,…; values percent-decoded
 *   OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT                 per export, milliseconds (10000)
 *   OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL                http/json; http/protobuf is accepted with a
 *                                                       warning (we still send JSON, which collectors
 *                                                       take on the same port); grpc is refused, as a
 *                                                       gRPC port does not speak HTTP/1.1 JSON
 *   OTEL_BSP_SCHEDULE_DELAY                             how long an ended span may wait to be sent,
 *                                                       milliseconds (1000)
 *   OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES         the resource; service.name defaults to
 *                                                       "vm-manager", service.version is ours
 *   OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG        always_on, always_off, traceidratio,
 *                                                       parentbased_always_on (default),
 *                                                       parentbased_always_off, parentbased_traceidratio;
 *                                                       the ratio is 0..1 (1.0)
 *
 * Ended spans of sampled traces are queued (at most 2048; more are dropped and counted) and sent
 * after the schedule delay, or as soon as 512 are waiting, at most 2 requests in flight. A failed export is
 * counted and logged at debug, never retried. */

typedef struct Tracer Tracer;
typedef struct Span Span;

typedef enum SpanKind {
        SPAN_KIND_INTERNAL = 1,
        SPAN_KIND_SERVER = 2,
        SPAN_KIND_CLIENT = 3,
} SpanKind;

/* *ret is NULL (and 0 returned) when tracing is not configured. -EINVAL with a message in
 * *ret_message (malloc'd) for a configuration that cannot work. On success *ret_message is a
 * warning for the operator, or NULL. */
int tracer_new_from_env(Tracer **ret, sd_event *event, const char *version, char **ret_message);
/* Sends what is queued (waiting at most timeout_usec for the collector), then frees. */
Tracer *tracer_free(Tracer *t, uint64_t timeout_usec);

/* The URL spans go to. Borrowed. */
const char *tracer_endpoint(const Tracer *t);

typedef struct TracerStats {
        uint64_t queued;   /* ended, waiting to be sent */
        uint64_t exported; /* accepted by the collector */
        uint64_t failed;   /* lost to a failed export */
        uint64_t dropped;  /* lost to a full queue */
} TracerStats;
void tracer_get_stats(const Tracer *t, TracerStats *ret);

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

/* Whether the span is sampled, i.e. will be exported: attributes that are costly to compute can be
 * skipped otherwise. False for NULL. */
bool span_is_recording(const Span *s);

/* The W3C traceparent header value naming s as the parent, for a request we make: 55 characters and
 * a NUL. -EINVAL for NULL (send no header then). */
int span_traceparent(const Span *s, char ret[static 56]);

/* HTTP server spans, after OpenTelemetry's HTTP semantic conventions: the span is named
 * "<method> <route>" and carries http.request.method and url.path; a method outside the standard
 * set is "_OTHER" (and the name says "HTTP"). route is the matched template (or the prefix a
 * handler owns, until it knows more); the remote parent is the request's traceparent header. */
Span *span_start_http_server(
        Tracer *t, const char *method, const char *route, const char *path, const char *traceparent);
/* The route template, once the handler matched it, as prefix and rest ("/api/v1", "/vms/{id}"):
 * renames the span and sets http.route. */
void span_set_http_route(Span *s, const char *prefix, const char *route);
/* Sets http.response.status_code (unless 0: no response was delivered), an error for a 5xx, then
 * ends the span. */
void span_end_http_server(Span *s, unsigned status);
