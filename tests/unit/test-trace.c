/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cleanup.h"
#include "parse-util.h"
#include "time-util.h"
#include "trace-internal.h"

/* The configuration from OTEL_* variables, W3C traceparent, the samplers, the OTLP JSON of a span,
 * and the exporter against a collector stand-in on a second thread (the tracer itself runs on
 * this thread's sd-event loop, as in the daemon). */

extern char **environ;

static void otel_env_clear(void) {
        for (;;) {
                char name[256] = "";

                for (char **e = environ; e && *e; e++)
                        if (startswith(*e, "OTEL_")) {
                                snprintf(name, sizeof(name), "%.*s", (int) strcspn(*e, "="), *e);
                                break;
                        }
                if (!*name)
                        return;
                assert_int_equal(unsetenv(name), 0);
        }
}

static int setup_env(void **state) {
        otel_env_clear();
        return 0;
}

/* Reads the configuration; fails the test unless it returns want. */
static int config_read(TraceConfig *c, char **message) {
        *c = (TraceConfig){};
        *message = NULL;
        return trace_config_from_env(c, message);
}

/* value of name in a pair list, or NULL */
static const char *pairs_get(char **l, const char *name) {
        for (size_t i = 0; l && l[i]; i += 2)
                if (streq(l[i], name))
                        return l[i + 1];
        return NULL;
}

#define assert_config_error(var)                                  \
        do {                                                      \
                _cleanup_(trace_config_done) TraceConfig _c = {}; \
                _cleanup_free_ char *_m = NULL;                   \
                assert_errno(config_read(&_c, &_m), -EINVAL);     \
                assert_non_null(_m);                              \
                assert_contains(_m, var);                         \
                assert_null(_c.endpoint);                         \
        } while (0)

static void test_config_unset(void **state) {
        _cleanup_(trace_config_done) TraceConfig c = {};
        _cleanup_free_ char *m = NULL;
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        Tracer *t = (Tracer *) 0x1;

        /* nothing set, or only things that need an endpoint: no tracer, and no complaint */
        setenv("OTEL_TRACES_SAMPLER", "bogus", 1);
        setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "", 1);
        assert_ok(config_read(&c, &m));
        assert_null(c.endpoint);
        assert_null(m);

        assert_ok(sd_event_new(&e));
        assert_ok(tracer_new_from_env(&t, e, "1.0", &m));
        assert_null(t);
        assert_null(m);
        assert_null(span_start(t, "x", SPAN_KIND_INTERNAL, NULL, NULL));
}

static void test_config_disabled(void **state) {
        _cleanup_(trace_config_done) TraceConfig c = {};
        _cleanup_free_ char *m = NULL;

        setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318", 1);
        setenv("OTEL_SDK_DISABLED", "true", 1);
        assert_ok(config_read(&c, &m));
        assert_null(c.endpoint);

        setenv("OTEL_SDK_DISABLED", "false", 1);
        setenv("OTEL_TRACES_EXPORTER", "none", 1);
        assert_ok(config_read(&c, &m));
        assert_null(c.endpoint);

        setenv("OTEL_TRACES_EXPORTER", "otlp", 1);
        assert_ok(config_read(&c, &m));
        assert_string_equal(c.endpoint, "http://collector:4318/v1/traces");
        trace_config_done(&c);

        setenv("OTEL_TRACES_EXPORTER", "zipkin", 1);
        assert_config_error("OTEL_TRACES_EXPORTER");
        unsetenv("OTEL_TRACES_EXPORTER");
        setenv("OTEL_SDK_DISABLED", "maybe", 1);
        assert_config_error("OTEL_SDK_DISABLED");
}

static void test_config_endpoint(void **state) {
        static const struct {
                const char *base, *want;
        } cases[] = {
                { "http://collector:4318", "http://collector:4318/v1/traces" },
                { "http://collector:4318/", "http://collector:4318/v1/traces" },
                { "https://collector/otlp//", "https://collector/otlp/v1/traces" },
                { "HTTP://Collector:4318", "HTTP://Collector:4318/v1/traces" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_EXPORTER_OTLP_ENDPOINT", cases[i].base, 1);
                assert_ok(config_read(&c, &m));
                assert_string_equal(c.endpoint, cases[i].want);
                assert_null(m);
                /* the defaults */
                assert_int_equal(c.timeout_ms, TRACE_TIMEOUT_MS_DEFAULT);
                assert_int_equal(c.schedule_delay_ms, TRACE_SCHEDULE_DELAY_MS_DEFAULT);
                assert_int_equal(c.sampler, TRACE_SAMPLER_PARENTBASED_ALWAYS_ON);
                assert_true(c.ratio == 1.0);
                assert_string_equal(c.service_name, "vm-manager");
                assert_null(c.headers);
                assert_null(c.resource);
        }

        /* the signal's own variable is used as it is, and wins */
        {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:9999/custom/", 1);
                assert_ok(config_read(&c, &m));
                assert_string_equal(c.endpoint, "http://other:9999/custom/");
        }
        unsetenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");

        setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", 1);
        assert_config_error("OTEL_EXPORTER_OTLP_ENDPOINT");
        setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector/v1/traces", 1);
        assert_config_error("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
}

static void test_config_headers(void **state) {
        setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318", 1);
        setenv("OTEL_EXPORTER_OTLP_HEADERS", " api-key = s3cr%3Dt , X-Scope=a%20b,,b=1,", 1);
        setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-scope=traces, c =", 1);
        {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                assert_ok(config_read(&c, &m));
                assert_int_equal(strv_length(c.headers), 8);
                assert_string_equal(pairs_get(c.headers, "api-key"), "s3cr=t");
                /* the traces variable wins, whatever the case of the name */
                assert_string_equal(pairs_get(c.headers, "X-Scope"), "traces");
                assert_string_equal(pairs_get(c.headers, "b"), "1");
                assert_string_equal(pairs_get(c.headers, "c"), "");
        }
        unsetenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS");

        static const char *const bad[] = {
                "novalue",    /* no '=' */
                "=value",     /* no name */
                "bad name=1", /* not a header name */
                "a=%zz",      /* broken escape */
                "a=%4",       /* truncated escape */
                "a=x%0d%0aHost: y" /* a header break after decoding */,
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_EXPORTER_OTLP_HEADERS", bad[i], 1);
                assert_errno(config_read(&c, &m), -EINVAL);
                assert_non_null(m);
                assert_contains(m, "OTEL_EXPORTER_OTLP_HEADERS");
        }

        /* values can be secrets: the message names the key, never the value */
        {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20hunter2%zz", 1);
                assert_errno(config_read(&c, &m), -EINVAL);
                assert_contains(m, "authorization");
                assert_null(strstr(m, "hunter2"));
        }
}

static void test_config_timeout(void **state) {
        setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318", 1);
        {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "500", 1);
                assert_ok(config_read(&c, &m));
                assert_int_equal(c.timeout_ms, 500);
                trace_config_done(&c);

                setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "700", 1);
                assert_ok(config_read(&c, &m));
                assert_int_equal(c.timeout_ms, 700);
        }

        static const char *const bad[] = { "abc", "0", "-1", "1.5", "10s", "99999999999" };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", bad[i], 1);
                assert_config_error("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT");
        }
        unsetenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT");
        setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", 1);
        assert_config_error("OTEL_EXPORTER_OTLP_TIMEOUT");
        unsetenv("OTEL_EXPORTER_OTLP_TIMEOUT");

        {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_BSP_SCHEDULE_DELAY", "250", 1);
                assert_ok(config_read(&c, &m));
                assert_int_equal(c.schedule_delay_ms, 250);
        }
        setenv("OTEL_BSP_SCHEDULE_DELAY", "0", 1);
        assert_config_error("OTEL_BSP_SCHEDULE_DELAY");
}

static void test_config_sampler(void **state) {
        setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318", 1);

        for (TraceSampler s = 0; s < _TRACE_SAMPLER_MAX; s++) {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_TRACES_SAMPLER", trace_sampler_to_string(s), 1);
                assert_ok(config_read(&c, &m));
                assert_int_equal(c.sampler, s);
                assert_true(c.ratio == 1.0);
                assert_int_equal(trace_sampler_from_string(trace_sampler_to_string(s)), s);
        }

        {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio", 1);
                setenv("OTEL_TRACES_SAMPLER_ARG", "0.25", 1);
                assert_ok(config_read(&c, &m));
                assert_int_equal(c.sampler, TRACE_SAMPLER_PARENTBASED_TRACEIDRATIO);
                assert_true(c.ratio == 0.25);
                trace_config_done(&c);

                /* the argument belongs to the ratio samplers: others ignore it, even a bad one */
                setenv("OTEL_TRACES_SAMPLER", "always_on", 1);
                setenv("OTEL_TRACES_SAMPLER_ARG", "lots", 1);
                assert_ok(config_read(&c, &m));
                assert_int_equal(c.sampler, TRACE_SAMPLER_ALWAYS_ON);
        }

        setenv("OTEL_TRACES_SAMPLER", "traceidratio", 1);
        static const char *const bad[] = { "lots", "1.5", "-0.1", "nan", "inf", "0.5x", "0x1p-1 " };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                setenv("OTEL_TRACES_SAMPLER_ARG", bad[i], 1);
                assert_config_error("OTEL_TRACES_SAMPLER_ARG");
        }
        unsetenv("OTEL_TRACES_SAMPLER_ARG");

        setenv("OTEL_TRACES_SAMPLER", "jaeger_remote", 1);
        assert_config_error("OTEL_TRACES_SAMPLER");
        setenv("OTEL_TRACES_SAMPLER", "Always_On", 1);
        assert_config_error("OTEL_TRACES_SAMPLER");
}

static void test_config_protocol(void **state) {
        setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318", 1);
        {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", 1);
                assert_ok(config_read(&c, &m));
                assert_null(m);
                trace_config_done(&c);

                /* we still send JSON, and say so */
                setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf", 1);
                assert_ok(config_read(&c, &m));
                assert_non_null(c.endpoint);
                assert_non_null(m);
                assert_contains(m, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
                assert_contains(m, "http/json");
        }

        setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc", 1);
        assert_config_error("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
        unsetenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
        setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift", 1);
        assert_config_error("OTEL_EXPORTER_OTLP_PROTOCOL");
}

static void test_config_resource(void **state) {
        setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318", 1);
        setenv("OTEL_RESOURCE_ATTRIBUTES",
               "service.name=from-attrs, deployment.environment=prod%2Cblue,host.name=h1",
               1);
        {
                _cleanup_(trace_config_done) TraceConfig c = {};
                _cleanup_free_ char *m = NULL;

                assert_ok(config_read(&c, &m));
                assert_string_equal(c.service_name, "from-attrs");
                assert_int_equal(strv_length(c.resource), 4);
                assert_string_equal(pairs_get(c.resource, "deployment.environment"), "prod,blue");
                assert_string_equal(pairs_get(c.resource, "host.name"), "h1");
                assert_null(pairs_get(c.resource, "service.name"));
                trace_config_done(&c);

                setenv("OTEL_SERVICE_NAME", "svc", 1);
                assert_ok(config_read(&c, &m));
                assert_string_equal(c.service_name, "svc");
                assert_null(pairs_get(c.resource, "service.name"));
        }

        setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name", 1);
        assert_config_error("OTEL_RESOURCE_ATTRIBUTES");
}

static void test_traceparent_parse(void **state) {
        uint8_t trace_id[16], span_id[8], flags = 0xaa;
        static const uint8_t want_trace[16] = { 0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd,
                                                0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c };
        static const uint8_t want_span[8] = { 0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31 };

        assert_ok(trace_parse_traceparent(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", trace_id, span_id, &flags));
        assert_memory_equal(trace_id, want_trace, 16);
        assert_memory_equal(span_id, want_span, 8);
        assert_int_equal(flags, 1);

        assert_ok(trace_parse_traceparent(
                " 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00\t", trace_id, span_id, &flags));
        assert_int_equal(flags, 0);
        /* a later version may carry more fields after a '-' */
        assert_ok(trace_parse_traceparent(
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-09-what-ever", trace_id, span_id, &flags));
        assert_int_equal(flags, 9);

        static const char *const bad[] = {
                "",
                "00",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",    /* short flags */
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-010",  /* long flags */
                "00-0af7651916cd43dd8448eb211c80319-cb7ad6b7169203331-01",   /* misplaced dash */
                "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",   /* upper case */
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",   /* zero trace id */
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",   /* zero span id */
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   /* version ff */
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", /* version 00 ends there */
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x",  /* no dash after */
                "0g-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   /* not hex */
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033zz-01",
                "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                if (trace_parse_traceparent(bad[i], trace_id, span_id, &flags) != -EINVAL)
                        fail_msg("traceparent '%s' was accepted", bad[i]);
        assert_errno(trace_parse_traceparent(NULL, trace_id, span_id, &flags), -EINVAL);
}

/* A tracer for tests: always_on unless told, exporting to endpoint (nothing listens there unless
 * the test starts a collector). */
static Tracer *tracer_for_test_full(
        sd_event *e, TraceSampler sampler, double ratio, const char *endpoint, char **headers) {
        TraceConfig c = {
                .endpoint = strdup(endpoint ?: "http://127.0.0.1:9/v1/traces"),
                .headers = headers,
                .timeout_ms = 2000,
                .schedule_delay_ms = TRACE_SCHEDULE_DELAY_MS_DEFAULT,
                .sampler = sampler,
                .ratio = ratio,
                .service_name = strdup("test-service"),
        };
        Tracer *t = NULL;

        assert_non_null(c.endpoint);
        assert_ok(tracer_new(&t, e, "9.9.9", &c));
        assert_null(c.endpoint); /* taken */
        return t;
}

static Tracer *tracer_for_test(sd_event *e, TraceSampler sampler, const char *endpoint, char **headers) {
        return tracer_for_test_full(e, sampler, 1.0, endpoint, headers);
}

static void test_traceparent_format(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        const char *in = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        uint8_t trace_id[16], span_id[8], own_trace[16], own_span[8], flags;
        char header[56];
        Tracer *t;
        Span *s, *child;

        assert_ok(sd_event_new(&e));
        t = tracer_for_test(e, TRACE_SAMPLER_PARENTBASED_ALWAYS_ON, NULL, NULL);

        s = span_start(t, "server", SPAN_KIND_SERVER, NULL, in);
        assert_non_null(s);
        assert_ok(span_traceparent(s, header));
        assert_int_equal(strlen(header), 55);
        /* same trace, our own span id, sampled */
        assert_memory_equal(header, in, 36);
        assert_false(strneq(header + 36, in + 36, 16));
        assert_string_equal(header + 52, "-01");
        assert_ok(trace_parse_traceparent(header, trace_id, span_id, &flags));
        span_get_ids(s, own_trace, own_span);
        assert_memory_equal(trace_id, own_trace, 16);
        assert_memory_equal(span_id, own_span, 8);

        /* a child shares the trace and names its parent */
        child = span_start(t, "child", SPAN_KIND_INTERNAL, s, NULL);
        span_get_ids(child, trace_id, span_id);
        assert_memory_equal(trace_id, own_trace, 16);
        assert_memory_not_equal(span_id, own_span, 8);
        span_end(child);
        span_end(s);

        /* unsampled: flags 00 */
        s = span_start(
                t, "server", SPAN_KIND_SERVER, NULL, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
        assert_ok(span_traceparent(s, header));
        assert_string_equal(header + 52, "-00");
        span_end(s);

        /* a bad header starts a new trace */
        s = span_start(
                t, "server", SPAN_KIND_SERVER, NULL, "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01");
        span_get_ids(s, trace_id, span_id);
        assert_memory_not_equal(trace_id, own_trace, 16);
        assert_true(span_is_recording(s));
        span_end(s);

        assert_errno(span_traceparent(NULL, header), -EINVAL);
        tracer_free(t, 0);
}

/* How many spans of a fresh tracer under sampler get queued: a root, a child of the remote parent
 * named by traceparent, and a local child of each. */
static size_t sampled_count(sd_event *e, TraceSampler sampler, double ratio, const char *traceparent) {
        Tracer *t = tracer_for_test_full(e, sampler, ratio, NULL, NULL);
        Span *s, *child;
        size_t n;

        s = span_start(t, "a", SPAN_KIND_SERVER, NULL, traceparent);
        assert_non_null(s);
        child = span_start(t, "b", SPAN_KIND_INTERNAL, s, NULL);
        assert_non_null(child);
        assert_int_equal(span_is_recording(child), span_is_recording(s));
        span_end(child);
        span_end(s);
        n = json_array_size(tracer_queue(t));
        tracer_free(t, 0);
        return n;
}

static void test_sampler_decisions(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        const char *sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        const char *unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

        assert_ok(sd_event_new(&e));

        assert_int_equal(sampled_count(e, TRACE_SAMPLER_ALWAYS_ON, 1.0, NULL), 2);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_ALWAYS_ON, 1.0, unsampled), 2);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_ALWAYS_OFF, 1.0, NULL), 0);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_ALWAYS_OFF, 1.0, sampled), 0);

        /* parent based: the remote parent's decision, the root sampler's otherwise */
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_PARENTBASED_ALWAYS_ON, 1.0, NULL), 2);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_PARENTBASED_ALWAYS_ON, 1.0, sampled), 2);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_PARENTBASED_ALWAYS_ON, 1.0, unsampled), 0);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_PARENTBASED_ALWAYS_OFF, 1.0, NULL), 0);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_PARENTBASED_ALWAYS_OFF, 1.0, sampled), 2);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_PARENTBASED_TRACEIDRATIO, 0.0, sampled), 2);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_PARENTBASED_TRACEIDRATIO, 0.0, NULL), 0);
        assert_int_equal(sampled_count(e, TRACE_SAMPLER_TRACEIDRATIO, 0.0, sampled), 0);

        /* the ratio decides on the lower 8 bytes of the trace id, the same way every time */
        uint8_t id[16] = {};
        assert_true(trace_id_ratio_sampled(id, 0.5));
        memset(id + 8, 0xff, 8);
        assert_false(trace_id_ratio_sampled(id, 0.5));
        assert_true(trace_id_ratio_sampled(id, 1.0));
        assert_false(trace_id_ratio_sampled(id, 0.0));
        memset(id + 8, 0, 8);
        id[8] = 0x7f;
        assert_true(trace_id_ratio_sampled(id, 0.5));
        id[8] = 0x80;
        assert_false(trace_id_ratio_sampled(id, 0.5));
        memset(id, 0xff, 8); /* the upper half plays no part */
        assert_false(trace_id_ratio_sampled(id, 0.5));
        id[8] = 0x3f;
        assert_true(trace_id_ratio_sampled(id, 0.25));

        /* a ratio over many random roots lands near it */
        {
                Tracer *t = tracer_for_test_full(e, TRACE_SAMPLER_TRACEIDRATIO, 0.25, NULL, NULL);
                size_t n;

                for (unsigned i = 0; i < 2000; i++)
                        span_end(span_start(t, "r", SPAN_KIND_INTERNAL, NULL, NULL));
                n = json_array_size(tracer_queue(t));
                if (n < 350 || n > 650)
                        fail_msg("%zu of 2000 roots sampled at 0.25", n);
                tracer_free(t, 0);
        }
}

static const char *attr_string(json_t *span, const char *key, const char *type) {
        size_t i;
        json_t *a;

        json_array_foreach(
                json_object_get(span, "attributes"),
                i,
                a) if (streq(json_string_value(json_object_get(a, "key")),
                             key)) return json_string_value(json_object_get(json_object_get(a, "value"), type));
        return NULL;
}

static bool is_lower_hex(const char *s, size_t n) {
        return s && strlen(s) == n && strspn(s, "0123456789abcdef") == n;
}

static void test_span_json(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        json_auto_t *body = NULL;
        Tracer *t;
        Span *s, *child;
        json_t *q, *js, *jc, *status;
        uint64_t start, end;

        assert_ok(sd_event_new(&e));
        t = tracer_for_test(e, TRACE_SAMPLER_ALWAYS_ON, NULL, NULL);

        s = span_start_http_server(t, "GET", "/api/v1", "/api/v1/vms/a1", NULL);
        span_set_http_route(s, "/api/v1", "/vms/{id}");
        child = span_start(t, "tool.get_vm", SPAN_KIND_INTERNAL, s, NULL);
        span_set_attr_string(child, "gen_ai.tool.name", "get_vm");
        span_set_attr_int(child, "count", -42);
        span_set_attr_int(child, "big", INT64_MAX);
        span_set_attr_string(child, "count", "replaced");
        span_set_attr_string(child, "bytes", "caf\xc3\xa9 \xff");
        span_set_error(child, "vm \"a1\": not found");
        span_end(child);
        span_end_http_server(s, 503);

        q = tracer_queue(t);
        assert_int_equal(json_array_size(q), 2);
        jc = json_array_get(q, 0);
        js = json_array_get(q, 1);

        assert_true(is_lower_hex(json_string_value(json_object_get(js, "traceId")), 32));
        assert_true(is_lower_hex(json_string_value(json_object_get(js, "spanId")), 16));
        assert_null(json_object_get(js, "parentSpanId"));
        assert_string_equal(
                json_string_value(json_object_get(jc, "traceId")),
                json_string_value(json_object_get(js, "traceId")));
        assert_string_equal(
                json_string_value(json_object_get(jc, "parentSpanId")),
                json_string_value(json_object_get(js, "spanId")));

        assert_string_equal(json_string_value(json_object_get(js, "name")), "GET /api/v1/vms/{id}");
        assert_int_equal(json_integer_value(json_object_get(js, "kind")), 2);
        assert_int_equal(json_integer_value(json_object_get(jc, "kind")), 1);
        assert_ok(safe_atou64(json_string_value(json_object_get(js, "startTimeUnixNano")), &start));
        assert_ok(safe_atou64(json_string_value(json_object_get(js, "endTimeUnixNano")), &end));
        assert_true(end >= start);
        assert_true(start > UINT64_C(1600000000) * 1000000000); /* wall clock, in ns */

        assert_string_equal(attr_string(js, "http.request.method", "stringValue"), "GET");
        assert_string_equal(attr_string(js, "url.path", "stringValue"), "/api/v1/vms/a1");
        assert_string_equal(attr_string(js, "http.route", "stringValue"), "/api/v1/vms/{id}");
        assert_string_equal(attr_string(js, "http.response.status_code", "intValue"), "503");
        status = json_object_get(js, "status");
        assert_int_equal(json_integer_value(json_object_get(status, "code")), 2);

        assert_string_equal(attr_string(jc, "gen_ai.tool.name", "stringValue"), "get_vm");
        assert_string_equal(attr_string(jc, "count", "stringValue"), "replaced");
        assert_null(attr_string(jc, "count", "intValue"));
        assert_string_equal(attr_string(jc, "big", "intValue"), "9223372036854775807");
        assert_string_equal(attr_string(jc, "bytes", "stringValue"), "caf?? ?"); /* not UTF-8: '?' */
        assert_int_equal(json_array_size(json_object_get(jc, "attributes")), 4);
        status = json_object_get(jc, "status");
        assert_int_equal(json_integer_value(json_object_get(status, "code")), 2);
        assert_string_equal(json_string_value(json_object_get(status, "message")), "vm \"a1\": not found");

        /* the request body around them */
        body = tracer_export_json(t, q);
        assert_non_null(body);
        json_t *rs = json_array_get(json_object_get(body, "resourceSpans"), 0);
        json_t *resource = json_object_get(rs, "resource");
        assert_string_equal(attr_string(resource, "service.name", "stringValue"), "test-service");
        assert_string_equal(attr_string(resource, "service.version", "stringValue"), "9.9.9");
        json_t *ss = json_array_get(json_object_get(rs, "scopeSpans"), 0);
        assert_string_equal(
                json_string_value(json_object_get(json_object_get(ss, "scope"), "name")), "vm-manager");
        assert_string_equal(
                json_string_value(json_object_get(json_object_get(ss, "scope"), "version")), "9.9.9");
        assert_ptr_equal(json_object_get(ss, "spans"), q);

        /* a 4xx is the client's error, not the server's: no status */
        s = span_start_http_server(t, "BREW", "/api/v1", "/api/v1/pot", NULL);
        span_end_http_server(s, 404);
        js = json_array_get(q, 2);
        assert_string_equal(json_string_value(json_object_get(js, "name")), "HTTP /api/v1");
        assert_string_equal(attr_string(js, "http.request.method", "stringValue"), "_OTHER");
        assert_string_equal(attr_string(js, "http.response.status_code", "intValue"), "404");
        assert_null(json_object_get(js, "status"));

        tracer_free(t, 0);
}

static void test_null_is_fine(void **state) {
        TracerStats st;
        char header[56];

        span_set_attr_string(NULL, "k", "v");
        span_set_attr_int(NULL, "k", 1);
        span_set_error(NULL, "m");
        span_set_http_route(NULL, "/a", "/b");
        span_end_http_server(NULL, 500);
        span_end(NULL);
        assert_false(span_is_recording(NULL));
        assert_errno(span_traceparent(NULL, header), -EINVAL);
        assert_null(span_start(NULL, "x", SPAN_KIND_SERVER, NULL, NULL));
        assert_null(span_start_http_server(NULL, "GET", "/", "/", NULL));
        assert_null(tracer_free(NULL, 0));
        assert_null(tracer_endpoint(NULL));
        tracer_get_stats(NULL, &st);
        assert_int_equal(st.queued + st.exported + st.failed + st.dropped, 0);
}

/* ---- against a collector ---- */

/* A stand-in collector: answers every POST with 200 (or status), keeps the last request. */
typedef struct Collector {
        int fd;
        uint16_t port;
        pthread_t thread;
        pthread_mutex_t lock;
        unsigned status;
        unsigned requests;
        size_t spans;
        char *head; /* request line and headers of the last request */
        char *body;
} Collector;

static void *collector_main(void *userdata) {
        Collector *c = userdata;

        for (;;) {
                _cleanup_free_ char *buf = NULL;
                size_t len = 0, alloc = 0, head_len = 0, body_len = 0;
                int fd = accept4(c->fd, NULL, NULL, SOCK_CLOEXEC);
                char answer[128];

                if (fd < 0)
                        return NULL; /* shut down */
                for (;;) {
                        char *end;
                        ssize_t n;

                        if (len + 4096 + 1 > alloc) {
                                alloc = (len + 4096 + 1) * 2;
                                buf = realloc(buf, alloc);
                                if (!buf)
                                        abort(); /* no cmocka asserts off the test's thread */
                        }
                        n = read(fd, buf + len, alloc - len - 1);
                        if (n <= 0)
                                break;
                        len += (size_t) n;
                        buf[len] = 0;
                        end = strstr(buf, "\r\n\r\n");
                        if (!end)
                                continue;
                        head_len = (size_t) (end - buf) + 4;
                        const char *cl = strcasestr(buf, "\r\nContent-Length:");
                        body_len = cl ? strtoul(cl + 17, NULL, 10) : 0;
                        if (len >= head_len + body_len)
                                break;
                }

                pthread_mutex_lock(&c->lock);
                free(c->head);
                free(c->body);
                c->head = strndup(buf ?: "", head_len);
                c->body = strndup(buf ? buf + head_len : "", body_len);
                {
                        json_auto_t *doc = json_loads(c->body, 0, NULL);
                        json_t *spans = json_object_get(
                                json_array_get(
                                        json_object_get(
                                                json_array_get(json_object_get(doc, "resourceSpans"), 0),
                                                "scopeSpans"),
                                        0),
                                "spans");
                        c->spans += json_array_size(spans);
                }
                c->requests++;
                snprintf(
                        answer,
                        sizeof(answer),
                        "HTTP/1.1 %u X\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                        c->status);
                pthread_mutex_unlock(&c->lock);
                if (write(fd, answer, strlen(answer)) < 0)
                        fprintf(stderr, "collector: write: %m\n");
                close(fd);
        }
}

static void collector_start(Collector *c, unsigned status) {
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t sl = sizeof(sa);

        *c = (Collector){ .status = status };
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(c->fd >= 0);
        assert_int_equal(bind(c->fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        assert_int_equal(listen(c->fd, 16), 0);
        assert_int_equal(getsockname(c->fd, (struct sockaddr *) &sa, &sl), 0);
        c->port = ntohs(sa.sin_port);
        pthread_mutex_init(&c->lock, NULL);
        assert_int_equal(pthread_create(&c->thread, NULL, collector_main, c), 0);
}

static void collector_stop(Collector *c) {
        (void) shutdown(c->fd, SHUT_RDWR);
        pthread_join(c->thread, NULL);
        close(c->fd);
        pthread_mutex_destroy(&c->lock);
        free(c->head);
        free(c->body);
}

static size_t collector_spans(Collector *c) {
        size_t n;

        pthread_mutex_lock(&c->lock);
        n = c->spans;
        pthread_mutex_unlock(&c->lock);
        return n;
}

static unsigned collector_requests(Collector *c) {
        unsigned n;

        pthread_mutex_lock(&c->lock);
        n = c->requests;
        pthread_mutex_unlock(&c->lock);
        return n;
}

/* Runs the loop until pred(t) holds, for at most 5 s. */
static bool run_until(sd_event *e, Tracer *t, bool (*pred)(Tracer *t, void *userdata), void *userdata) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;

        while (!pred(t, userdata)) {
                if (now_usec(CLOCK_MONOTONIC) > deadline)
                        return false;
                assert_true(sd_event_run(e, 50 * USEC_PER_MSEC) >= 0);
        }
        return true;
}

static bool settled(Tracer *t, void *userdata) {
        TracerStats st;

        tracer_get_stats(t, &st);
        return st.queued == 0 && st.exported + st.failed + st.dropped >= *(uint64_t *) userdata;
}

static char *endpoint_of(Collector *c) {
        char *url;

        assert_true(asprintf(&url, "http://127.0.0.1:%u/v1/traces", c->port) > 0);
        return url;
}

static char **headers_of(const char *name, const char *value) {
        char **h = calloc(3, sizeof(char *));

        assert_non_null(h);
        h[0] = strdup(name);
        h[1] = strdup(value);
        return h;
}

static void test_export(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_free_ char *url = NULL;
        Collector c;
        TracerStats st;
        uint64_t want = 3;
        Tracer *t;
        usec_t t0;

        assert_ok(sd_event_new(&e));
        collector_start(&c, 200);
        url = endpoint_of(&c);
        t = tracer_for_test(e, TRACE_SAMPLER_PARENTBASED_ALWAYS_ON, url, headers_of("X-Test-Token", "a b"));

        t0 = now_usec(CLOCK_MONOTONIC);
        for (unsigned i = 0; i < want; i++) {
                Span *s = span_start(t, "op", SPAN_KIND_INTERNAL, NULL, NULL);
                span_set_attr_int(s, "i", i);
                span_end(s);
        }
        /* spans of an unsampled trace are never sent */
        span_end(span_start(
                t, "x", SPAN_KIND_SERVER, NULL, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"));

        assert_true(run_until(e, t, settled, &want));
        tracer_get_stats(t, &st);
        assert_int_equal(st.exported, want);
        assert_int_equal(st.failed, 0);
        /* batched: one request, after about the flush interval */
        assert_int_equal(collector_requests(&c), 1);
        assert_true(now_usec(CLOCK_MONOTONIC) - t0 >= 900 * USEC_PER_MSEC);

        pthread_mutex_lock(&c.lock);
        assert_startswith(c.head, "POST /v1/traces HTTP/1.1\r\n");
        assert_contains(c.head, "\r\nX-Test-Token: a b\r\n");
        assert_contains(c.head, "\r\nContent-Type: application/json\r\n");
        assert_contains(c.head, "\r\nUser-Agent: vm-manager/9.9.9\r\n");
        assert_null(strcasestr(c.head, "Expect:"));
        pthread_mutex_unlock(&c.lock);
        assert_int_equal(collector_spans(&c), want);

        tracer_free(t, 0);
        collector_stop(&c);
}

static void test_export_batches(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_free_ char *url = NULL;
        Collector c;
        TracerStats st;
        uint64_t want = 1100;
        Tracer *t;

        assert_ok(sd_event_new(&e));
        collector_start(&c, 200);
        url = endpoint_of(&c);
        t = tracer_for_test(e, TRACE_SAMPLER_ALWAYS_ON, url, NULL);

        /* two full batches go at once (two requests in flight at most), the rest after the interval */
        for (unsigned i = 0; i < want; i++)
                span_end(span_start(t, "op", SPAN_KIND_INTERNAL, NULL, NULL));
        assert_true(run_until(e, t, settled, &want));
        tracer_get_stats(t, &st);
        assert_int_equal(st.exported, want);
        assert_int_equal(collector_requests(&c), 3); /* 512 + 512 + 76 */

        tracer_free(t, 0);
        collector_stop(&c);
}

static void test_export_failures(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_free_ char *url = NULL;
        Collector c;
        TracerStats st;
        uint64_t want = 2;
        Tracer *t;

        assert_ok(sd_event_new(&e));

        /* the collector refuses: counted, not retried */
        collector_start(&c, 500);
        url = endpoint_of(&c);
        t = tracer_for_test(e, TRACE_SAMPLER_ALWAYS_ON, url, NULL);
        span_end(span_start(t, "a", SPAN_KIND_INTERNAL, NULL, NULL));
        span_end(span_start(t, "b", SPAN_KIND_INTERNAL, NULL, NULL));
        assert_true(run_until(e, t, settled, &want));
        tracer_get_stats(t, &st);
        assert_int_equal(st.failed, 2);
        assert_int_equal(st.exported, 0);
        assert_int_equal(st.queued, 0);
        /* and nothing more is tried */
        for (unsigned i = 0; i < 30; i++)
                assert_true(sd_event_run(e, 50 * USEC_PER_MSEC) >= 0);
        assert_int_equal(collector_requests(&c), 1);
        tracer_free(t, 0);
        collector_stop(&c);

        /* nobody listens */
        t = tracer_for_test(e, TRACE_SAMPLER_ALWAYS_ON, "http://127.0.0.1:9/v1/traces", NULL);
        span_end(span_start(t, "a", SPAN_KIND_INTERNAL, NULL, NULL));
        span_end(span_start(t, "b", SPAN_KIND_INTERNAL, NULL, NULL));
        assert_true(run_until(e, t, settled, &want));
        tracer_get_stats(t, &st);
        assert_int_equal(st.failed, 2);
        tracer_free(t, 0);
}

static void test_queue_limit(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        TracerStats st;
        Tracer *t;

        assert_ok(sd_event_new(&e));
        t = tracer_for_test(e, TRACE_SAMPLER_ALWAYS_ON, NULL, NULL);
        /* without the loop running nothing leaves: the queue stops at its limit */
        for (unsigned i = 0; i < 2100; i++)
                span_end(span_start(t, "op", SPAN_KIND_INTERNAL, NULL, NULL));
        tracer_get_stats(t, &st);
        assert_int_equal(st.queued, 2048);
        assert_int_equal(st.dropped, 52);
        tracer_free(t, 0);
}

static void test_free_flushes(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_free_ char *url = NULL;
        Collector c;
        Tracer *t;
        usec_t t0;

        assert_ok(sd_event_new(&e));
        collector_start(&c, 200);
        url = endpoint_of(&c);
        t = tracer_for_test(e, TRACE_SAMPLER_ALWAYS_ON, url, NULL);
        for (unsigned i = 0; i < 600; i++)
                span_end(span_start(t, "op", SPAN_KIND_INTERNAL, NULL, NULL));

        /* never ran the loop: freeing sends it all, within the budget */
        t0 = now_usec(CLOCK_MONOTONIC);
        tracer_free(t, 2 * USEC_PER_SEC);
        assert_true(now_usec(CLOCK_MONOTONIC) - t0 < 2 * USEC_PER_SEC);
        assert_int_equal(collector_spans(&c), 600);
        assert_int_equal(collector_requests(&c), 2);
        collector_stop(&c);

        /* a collector that never answers costs at most the budget */
        {
                struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
                socklen_t sl = sizeof(sa);
                _cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                _cleanup_free_ char *silent = NULL;

                assert_int_equal(bind(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
                assert_int_equal(listen(fd, 16), 0); /* connections wait in the backlog, unanswered */
                assert_int_equal(getsockname(fd, (struct sockaddr *) &sa, &sl), 0);
                assert_true(asprintf(&silent, "http://127.0.0.1:%u/v1/traces", ntohs(sa.sin_port)) > 0);
                t = tracer_for_test(e, TRACE_SAMPLER_ALWAYS_ON, silent, NULL);
                span_end(span_start(t, "op", SPAN_KIND_INTERNAL, NULL, NULL));
                t0 = now_usec(CLOCK_MONOTONIC);
                tracer_free(t, 300 * USEC_PER_MSEC);
                usec_t took = now_usec(CLOCK_MONOTONIC) - t0;
                if (took < 250 * USEC_PER_MSEC || took > 1000 * USEC_PER_MSEC)
                        fail_msg(
                                "tracer_free() took %llu ms with a budget of 300",
                                (unsigned long long) (took / 1000));
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup(test_config_unset, setup_env),
                cmocka_unit_test_setup(test_config_disabled, setup_env),
                cmocka_unit_test_setup(test_config_endpoint, setup_env),
                cmocka_unit_test_setup(test_config_headers, setup_env),
                cmocka_unit_test_setup(test_config_timeout, setup_env),
                cmocka_unit_test_setup(test_config_sampler, setup_env),
                cmocka_unit_test_setup(test_config_protocol, setup_env),
                cmocka_unit_test_setup(test_config_resource, setup_env),
                cmocka_unit_test_setup(test_traceparent_parse, setup_env),
                cmocka_unit_test_setup(test_traceparent_format, setup_env),
                cmocka_unit_test_setup(test_sampler_decisions, setup_env),
                cmocka_unit_test_setup(test_span_json, setup_env),
                cmocka_unit_test_setup(test_null_is_fine, setup_env),
                cmocka_unit_test_setup(test_export, setup_env),
                cmocka_unit_test_setup(test_export_batches, setup_env),
                cmocka_unit_test_setup(test_export_failures, setup_env),
                cmocka_unit_test_setup(test_queue_limit, setup_env),
                cmocka_unit_test_setup(test_free_flushes, setup_env),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
