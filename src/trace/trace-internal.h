/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The pieces of trace.c that tests/unit/test-trace.c checks one by one. Not for other modules. */

#include <jansson.h>

#include "trace.h"

typedef enum TraceSampler {
        TRACE_SAMPLER_ALWAYS_ON,
        TRACE_SAMPLER_ALWAYS_OFF,
        TRACE_SAMPLER_TRACEIDRATIO,
        TRACE_SAMPLER_PARENTBASED_ALWAYS_ON,
        TRACE_SAMPLER_PARENTBASED_ALWAYS_OFF,
        TRACE_SAMPLER_PARENTBASED_TRACEIDRATIO,
        _TRACE_SAMPLER_MAX,
        _TRACE_SAMPLER_INVALID = -EINVAL,
} TraceSampler;

const char *trace_sampler_to_string(TraceSampler s);
TraceSampler trace_sampler_from_string(const char *s);

/* What the environment asked for. endpoint NULL: no tracing. */
typedef struct TraceConfig {
        char *endpoint;
        char **headers; /* name, value, name, value, …, NULL */
        uint64_t timeout_ms;
        uint64_t schedule_delay_ms; /* how long an ended span may wait for its export */
        TraceSampler sampler;
        double ratio;
        char *service_name;
        char **resource; /* key, value, … from OTEL_RESOURCE_ATTRIBUTES, service.name left out */
} TraceConfig;

#define TRACE_TIMEOUT_MS_DEFAULT 10000
#define TRACE_SCHEDULE_DELAY_MS_DEFAULT 1000

/* Reads the OTEL_* variables. 0 with *ret_message a warning or NULL; -EINVAL with *ret_message
 * naming the variable at fault. ret is filled only on success. */
int trace_config_from_env(TraceConfig *ret, char **ret_message);
void trace_config_done(TraceConfig *c);

/* The tracer for an explicit configuration (taken: c is left empty). */
int tracer_new(Tracer **ret, sd_event *event, const char *version, TraceConfig *c);

/* A W3C traceparent value: 0 with the ids and flags, -EINVAL when it must be ignored. */
int trace_parse_traceparent(
        const char *s, uint8_t ret_trace_id[static 16], uint8_t ret_span_id[static 8], uint8_t *ret_flags);

/* The sampling decision for a root span of trace_id under a ratio sampler. */
bool trace_id_ratio_sampled(const uint8_t trace_id[static 16], double ratio);

/* The OTLP JSON of one ended span (a new reference). */
json_t *span_to_json(const Span *s);
/* The ids of a span, for tests that follow parent links. */
void span_get_ids(const Span *s, uint8_t ret_trace_id[static 16], uint8_t ret_span_id[static 8]);
/* The spans waiting for export, oldest first (borrowed). */
json_t *tracer_queue(Tracer *t);
/* The request body of one export of spans (a new reference). */
json_t *tracer_export_json(Tracer *t, json_t *spans);
