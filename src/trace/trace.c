/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <curl/curl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "hex-util.h"
#include "http-curl.h"
#include "json-util.h"
#include "log.h"
#include "parse-util.h"
#include "string-table.h"
#include "time-util.h"
#include "trace-internal.h"

#define TRACE_QUEUE_MAX 2048 /* ended spans waiting; beyond, dropped */
#define TRACE_BATCH_MAX 512  /* spans per request; this many waiting sends at once */
#define TRACE_EXPORTS_MAX 2  /* requests in flight */
#define TRACE_ATTRS_MAX 32   /* per span; more are dropped */
#define TRACE_NAME_MAX 256   /* bytes of a span name */
#define TRACE_VALUE_MAX 4096 /* bytes of a string attribute */
#define TRACE_SCOPE "vm-manager"

typedef struct SpanAttr {
        char *key;
        char *value; /* NULL: an integer */
        int64_t integer;
} SpanAttr;

struct Span {
        Tracer *tracer;
        char *name;
        SpanKind kind;
        uint8_t trace_id[16];
        uint8_t span_id[8];
        uint8_t parent_id[8];
        bool has_parent;
        bool sampled;
        uint64_t start_ns, end_ns;
        SpanAttr *attrs;
        size_t n_attrs;
        bool failed;
        char *status_message;
        const char *http_method; /* static: set by span_start_http_server() */
};

/* One POST to the collector. */
typedef struct Export {
        Tracer *tracer;
        CURL *easy;
        char *body;
        size_t n_spans;
        struct Export *prev, *next;
} Export;

struct Tracer {
        sd_event *event;
        TraceConfig config;
        char *version;
        json_t *resource; /* {"attributes":[…]} */
        struct curl_slist *headers;
        char *user_agent;

        json_t *queue; /* encoded spans, oldest first */
        sd_event_source *flush_timer;

        CurlGlue *curl;
        Export *exports;
        unsigned n_exports;

        uint64_t n_exported, n_failed, n_dropped;
};

/* ---- configuration ---- */

static const char *const trace_sampler_table[_TRACE_SAMPLER_MAX] = {
        [TRACE_SAMPLER_ALWAYS_ON] = "always_on",
        [TRACE_SAMPLER_ALWAYS_OFF] = "always_off",
        [TRACE_SAMPLER_TRACEIDRATIO] = "traceidratio",
        [TRACE_SAMPLER_PARENTBASED_ALWAYS_ON] = "parentbased_always_on",
        [TRACE_SAMPLER_PARENTBASED_ALWAYS_OFF] = "parentbased_always_off",
        [TRACE_SAMPLER_PARENTBASED_TRACEIDRATIO] = "parentbased_traceidratio",
};

DEFINE_STRING_TABLE_LOOKUP(trace_sampler, TraceSampler);

/* An OTEL_* variable; empty counts as unset, as the specification says. */
static const char *env(const char *name) {
        const char *v = secure_getenv(name);

        return v && *v ? v : NULL;
}

/* The traces-specific variable, else the general one; *ret_name says which was read. */
static const char *env_pair(const char *traces_name, const char *name, const char **ret_name) {
        const char *v = env(traces_name);

        *ret_name = v ? traces_name : name;
        return v ?: env(name);
}

_printf_(2, 3) static int config_error(char **ret_message, const char *format, ...) {
        va_list ap;

        if (ret_message) {
                va_start(ap, format);
                if (vasprintf(ret_message, format, ap) < 0)
                        *ret_message = NULL;
                va_end(ap);
        }
        return -EINVAL;
}

static bool is_blank(char c) {
        return c == ' ' || c == '\t';
}

/* [s, s+n) without its leading and trailing blanks, percent-decoded when asked. -EINVAL for a
 * broken escape or a control character (which could end a header early). */
static int kv_token(const char *s, size_t n, bool decode, char **ret) {
        _cleanup_free_ char *out = NULL;
        size_t j = 0;

        while (n > 0 && is_blank(*s)) {
                s++;
                n--;
        }
        while (n > 0 && is_blank(s[n - 1]))
                n--;
        out = malloc(n + 1);
        if (!out)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char) s[i];

                if (decode && c == '%') {
                        int hi = i + 2 < n ? unhexchar(s[i + 1]) : -1, lo = hi >= 0 ? unhexchar(s[i + 2]) : -1;

                        if (lo < 0)
                                return -EINVAL;
                        c = (unsigned char) (hi << 4 | lo);
                        i += 2;
                }
                if (c < 0x20 || c == 0x7f)
                        return -EINVAL;
                out[j++] = (char) c;
        }
        out[j] = 0;
        *ret = TAKE_PTR(out);
        return 0;
}

/* RFC 9110 token characters: what a header name may be made of. */
static bool header_name_valid(const char *s) {
        if (!*s)
                return false;
        for (; *s; s++)
                if (!strchr("!#$%&'*+-.^_`|~", *s) && !(*s >= '0' && *s <= '9') &&
                    !(*s >= 'a' && *s <= 'z') && !(*s >= 'A' && *s <= 'Z'))
                        return false;
        return true;
}

/* Sets key to value in the pair list *l (name, value, …, NULL), replacing an earlier value. Header
 * names compare without case. Takes key and value. */
static int pairs_set(char ***l, char *key, char *value, bool fold_case) {
        _cleanup_free_ char *k = key, *v = value;
        size_t n = strv_length(*l);
        char **a;

        for (size_t i = 0; i < n; i += 2)
                if (fold_case ? strcasecmp((*l)[i], k) == 0 : streq((*l)[i], k)) {
                        free((*l)[i + 1]);
                        (*l)[i + 1] = TAKE_PTR(v);
                        return 0;
                }
        a = reallocarray(*l, n + 3, sizeof(char *));
        if (!a)
                return -ENOMEM;
        a[n] = TAKE_PTR(k);
        a[n + 1] = TAKE_PTR(v);
        a[n + 2] = NULL;
        *l = a;
        return 0;
}

/* Removes key from the pair list and returns its value (NULL when absent). */
static char *pairs_take(char **l, const char *key) {
        size_t n = strv_length(l);

        for (size_t i = 0; i < n; i += 2)
                if (streq(l[i], key)) {
                        char *v = l[i + 1];

                        free(l[i]);
                        memmove(l + i, l + i + 2, (n - i - 1) * sizeof(char *)); /* with the NULL */
                        return v;
                }
        return NULL;
}

/* Merges a "key=value,key=value" list (the W3C baggage form OTEL_EXPORTER_OTLP_HEADERS and
 * OTEL_RESOURCE_ATTRIBUTES use) into *l. Values may hold secrets: messages name keys, not values. */
static int pairs_merge(char ***l, const char *var, const char *list, bool headers, char **ret_message) {
        size_t index = 0;

        for (const char *p = list;; p++) {
                size_t len = strcspn(p, ",");
                const char *eq = memchr(p, '=', len);
                _cleanup_free_ char *k = NULL, *v = NULL;
                int r;

                index++;
                if (!eq) {
                        if (strspn(p, " \t") < len)
                                return config_error(ret_message, "%s: entry %zu is not key=value", var, index);
                } else {
                        r = kv_token(p, (size_t) (eq - p), /* decode= */ false, &k);
                        if (r == -ENOMEM)
                                return r;
                        if (r < 0 || !*k || (headers && !header_name_valid(k)))
                                return config_error(
                                        ret_message,
                                        "%s: entry %zu does not start with a valid %s",
                                        var,
                                        index,
                                        headers ? "header name" : "key");
                        r = kv_token(eq + 1, (size_t) (p + len - eq - 1), /* decode= */ true, &v);
                        if (r == -ENOMEM)
                                return r;
                        if (r < 0)
                                return config_error(
                                        ret_message,
                                        "%s: the value of '%s' has a broken %%-escape or a control character",
                                        var,
                                        k);
                        r = pairs_set(l, TAKE_PTR(k), TAKE_PTR(v), /* fold_case= */ headers);
                        if (r < 0)
                                return r;
                }
                p += len;
                if (*p == 0)
                        return 0;
        }
}

void trace_config_done(TraceConfig *c) {
        c->endpoint = mfree(c->endpoint);
        c->headers = strv_free(c->headers);
        c->service_name = mfree(c->service_name);
        c->resource = strv_free(c->resource);
}

static int config_endpoint(TraceConfig *c, char **ret_message) {
        const char *v, *name = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
        size_t n;

        v = env(name);
        if (v)
                c->endpoint = strdup(v);
        else {
                name = "OTEL_EXPORTER_OTLP_ENDPOINT";
                v = env(name);
                if (!v)
                        return 0;
                /* the base URL: its path, if any, gets the signal's path below it */
                n = strlen(v);
                while (n > 0 && v[n - 1] == '/')
                        n--;
                asprintf_or_null(&c->endpoint, "%.*s/v1/traces", (int) n, v);
        }
        if (!c->endpoint)
                return -ENOMEM;
        if (strncasecmp(v, "http://", 7) != 0 && strncasecmp(v, "https://", 8) != 0)
                return config_error(ret_message, "%s='%s': want an http:// or https:// URL", name, v);
        return 0;
}

static int config_protocol(char **ret_warning, char **ret_message) {
        const char *name,
                *v = env_pair("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL", &name);

        if (!v || streq(v, "http/json"))
                return 0;
        if (streq(v, "http/protobuf")) {
                asprintf_or_null(
                        ret_warning,
                        "%s=http/protobuf: vm-manager exports OTLP/HTTP as http/json, which collectors take on the same port",
                        name);
                return *ret_warning ? 0 : -ENOMEM;
        }
        if (streq(v, "grpc"))
                return config_error(
                        ret_message,
                        "%s=grpc: vm-manager exports OTLP over HTTP only (http/json); point the endpoint at the collector's OTLP/HTTP port (4318) and set http/json",
                        name);
        return config_error(ret_message, "%s='%s': want http/json (or http/protobuf)", name, v);
}

static int config_timeout(TraceConfig *c, char **ret_message) {
        const char *name,
                *v = env_pair("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT", &name);
        uint64_t ms;

        if (!v)
                return 0;
        if (safe_atou64(v, &ms) < 0 || ms == 0 || ms > INT32_MAX)
                return config_error(ret_message, "%s='%s': want a positive number of milliseconds", name, v);
        c->timeout_ms = ms;
        return 0;
}

static int config_schedule_delay(TraceConfig *c, char **ret_message) {
        const char *v = env("OTEL_BSP_SCHEDULE_DELAY");
        uint64_t ms;

        if (!v)
                return 0;
        if (safe_atou64(v, &ms) < 0 || ms == 0 || ms > INT32_MAX)
                return config_error(
                        ret_message, "OTEL_BSP_SCHEDULE_DELAY='%s': want a positive number of milliseconds", v);
        c->schedule_delay_ms = ms;
        return 0;
}

static int config_sampler(TraceConfig *c, char **ret_message) {
        const char *v = env("OTEL_TRACES_SAMPLER"), *arg;
        char *end;
        double d;

        if (!v)
                return 0;
        c->sampler = trace_sampler_from_string(v);
        if (c->sampler < 0)
                return config_error(
                        ret_message,
                        "OTEL_TRACES_SAMPLER='%s': want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio",
                        v);
        if (c->sampler != TRACE_SAMPLER_TRACEIDRATIO && c->sampler != TRACE_SAMPLER_PARENTBASED_TRACEIDRATIO)
                return 0; /* the argument is for the ratio samplers only */

        arg = env("OTEL_TRACES_SAMPLER_ARG");
        if (!arg)
                return 0;
        errno = 0;
        d = strtod(arg, &end);
        if (errno != 0 || end == arg || *end != 0 || !isfinite(d) || d < 0.0 || d > 1.0)
                return config_error(
                        ret_message, "OTEL_TRACES_SAMPLER_ARG='%s': want a ratio between 0 and 1", arg);
        c->ratio = d;
        return 0;
}

int trace_config_from_env(TraceConfig *ret, char **ret_message) {
        _cleanup_(trace_config_done) TraceConfig c = {
                .timeout_ms = TRACE_TIMEOUT_MS_DEFAULT,
                .schedule_delay_ms = TRACE_SCHEDULE_DELAY_MS_DEFAULT,
                .sampler = TRACE_SAMPLER_PARENTBASED_ALWAYS_ON,
                .ratio = 1.0,
        };
        _cleanup_free_ char *warning = NULL;
        const char *v;
        int r;

        assert_return(ret, -EINVAL);

        v = env("OTEL_SDK_DISABLED");
        if (v) {
                r = parse_boolean(v);
                if (r < 0)
                        return config_error(ret_message, "OTEL_SDK_DISABLED='%s': want true or false", v);
                if (r > 0)
                        goto off;
        }
        v = env("OTEL_TRACES_EXPORTER");
        if (v && streq(v, "none"))
                goto off;
        if (v && !streq(v, "otlp"))
                return config_error(ret_message, "OTEL_TRACES_EXPORTER='%s': want otlp or none", v);

        r = config_endpoint(&c, ret_message);
        if (r < 0)
                return r;
        if (!c.endpoint)
                goto off;

        r = config_protocol(&warning, ret_message);
        if (r < 0)
                return r;
        r = config_timeout(&c, ret_message);
        if (r < 0)
                return r;
        r = config_schedule_delay(&c, ret_message);
        if (r < 0)
                return r;
        r = config_sampler(&c, ret_message);
        if (r < 0)
                return r;

        v = env("OTEL_EXPORTER_OTLP_HEADERS");
        if (v) {
                r = pairs_merge(&c.headers, "OTEL_EXPORTER_OTLP_HEADERS", v, /* headers= */ true, ret_message);
                if (r < 0)
                        return r;
        }
        v = env("OTEL_EXPORTER_OTLP_TRACES_HEADERS");
        if (v) {
                r = pairs_merge(
                        &c.headers, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", v, /* headers= */ true, ret_message);
                if (r < 0)
                        return r;
        }

        v = env("OTEL_RESOURCE_ATTRIBUTES");
        if (v) {
                r = pairs_merge(&c.resource, "OTEL_RESOURCE_ATTRIBUTES", v, /* headers= */ false, ret_message);
                if (r < 0)
                        return r;
                c.service_name = pairs_take(c.resource, "service.name");
        }
        v = env("OTEL_SERVICE_NAME");
        if (v) {
                free(c.service_name);
                c.service_name = strdup(v);
                if (!c.service_name)
                        return -ENOMEM;
        }
        if (!c.service_name && !(c.service_name = strdup("vm-manager")))
                return -ENOMEM;

        *ret = c;
        c = (TraceConfig){};
        if (ret_message)
                *ret_message = TAKE_PTR(warning);
        return 0;

off:
        *ret = (TraceConfig){};
        if (ret_message)
                *ret_message = NULL;
        return 0;
}

/* ---- ids and sampling ---- */

static bool all_zero(const uint8_t *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (p[i] != 0)
                        return false;
        return true;
}

static int random_id(uint8_t *p, size_t n) {
        do
                if (getrandom(p, n, 0) != (ssize_t) n)
                        return negative_errno();
        while (all_zero(p, n));
        return 0;
}

int trace_parse_traceparent(
        const char *s, uint8_t ret_trace_id[static 16], uint8_t ret_span_id[static 8], uint8_t *ret_flags) {
        uint8_t version, trace_id[16], span_id[8], flags;
        size_t n;

        if (!s)
                return -EINVAL;
        while (is_blank(*s))
                s++;
        n = strlen(s);
        while (n > 0 && is_blank(s[n - 1]))
                n--;

        /* version "-" trace-id "-" parent-id "-" flags; a later version may append "-" fields */
        if (n < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-')
                return -EINVAL;
        if (hex_decode(s, 2, /* lower_only= */ true, &version, /* reterr_offset= */ NULL) < 0 ||
            version == 0xff)
                return -EINVAL;
        if (version == 0 ? n != 55 : (n > 55 && s[55] != '-'))
                return -EINVAL;
        /* lower-case hex only: the W3C format refuses upper case */
        if (hex_decode(s + 3, 32, /* lower_only= */ true, trace_id, /* reterr_offset= */ NULL) < 0 ||
            hex_decode(s + 36, 16, /* lower_only= */ true, span_id, /* reterr_offset= */ NULL) < 0 ||
            hex_decode(s + 53, 2, /* lower_only= */ true, &flags, /* reterr_offset= */ NULL) < 0)
                return -EINVAL;
        if (all_zero(trace_id, 16) || all_zero(span_id, 8))
                return -EINVAL;

        memcpy(ret_trace_id, trace_id, 16);
        memcpy(ret_span_id, span_id, 8);
        if (ret_flags)
                *ret_flags = flags;
        return 0;
}

bool trace_id_ratio_sampled(const uint8_t trace_id[static 16], double ratio) {
        uint64_t x = 0;

        if (ratio >= 1.0)
                return true;
        if (!(ratio > 0.0))
                return false;
        /* the lower 8 bytes as a big-endian number, against ratio × 2^64 */
        for (size_t i = 8; i < 16; i++)
                x = x << 8 | trace_id[i];
        return x < (uint64_t) (ratio * 18446744073709551616.0);
}

static bool should_sample(
        const Tracer *t, const uint8_t trace_id[static 16], bool has_parent, bool parent_sampled) {
        switch (t->config.sampler) {
        case TRACE_SAMPLER_ALWAYS_ON:
                return true;
        case TRACE_SAMPLER_ALWAYS_OFF:
                return false;
        case TRACE_SAMPLER_TRACEIDRATIO:
                return trace_id_ratio_sampled(trace_id, t->config.ratio);
        case TRACE_SAMPLER_PARENTBASED_ALWAYS_ON:
                return has_parent ? parent_sampled : true;
        case TRACE_SAMPLER_PARENTBASED_ALWAYS_OFF:
                return has_parent ? parent_sampled : false;
        case TRACE_SAMPLER_PARENTBASED_TRACEIDRATIO:
                return has_parent ? parent_sampled : trace_id_ratio_sampled(trace_id, t->config.ratio);
        default:
                return false;
        }
}

/* ---- spans ---- */

static uint64_t now_nsec(void) {
        struct timespec ts;

        assert(clock_gettime(CLOCK_REALTIME, &ts) == 0);
        return (uint64_t) ts.tv_sec * UINT64_C(1000000000) + (uint64_t) ts.tv_nsec;
}

static Span *span_free(Span *s) {
        if (!s)
                return NULL;
        for (size_t i = 0; i < s->n_attrs; i++) {
                free(s->attrs[i].key);
                free(s->attrs[i].value);
        }
        free(s->attrs);
        free(s->status_message);
        free(s->name);
        free(s);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(Span *, span_free);

Span *span_start(Tracer *t, const char *name, SpanKind kind, const Span *parent, const char *traceparent) {
        _cleanup_(span_freep) Span *s = NULL;
        bool parent_sampled = false;
        uint8_t flags;

        if (!t || !name)
                return NULL;
        s = calloc(1, sizeof(Span));
        if (!s)
                return NULL;
        s->tracer = t;
        s->kind = kind;
        s->name = strndup(name, TRACE_NAME_MAX);
        if (!s->name)
                return NULL;

        if (parent) {
                memcpy(s->trace_id, parent->trace_id, sizeof(s->trace_id));
                memcpy(s->parent_id, parent->span_id, sizeof(s->parent_id));
                s->has_parent = true;
                parent_sampled = parent->sampled;
        } else if (trace_parse_traceparent(traceparent, s->trace_id, s->parent_id, &flags) >= 0) {
                s->has_parent = true;
                parent_sampled = flags & 1;
        } else if (random_id(s->trace_id, sizeof(s->trace_id)) < 0)
                return NULL;
        if (random_id(s->span_id, sizeof(s->span_id)) < 0)
                return NULL;

        s->sampled = should_sample(t, s->trace_id, s->has_parent, parent_sampled);
        s->start_ns = now_nsec();
        return TAKE_PTR(s);
}

bool span_is_recording(const Span *s) {
        return s && s->sampled;
}

void span_get_ids(const Span *s, uint8_t ret_trace_id[static 16], uint8_t ret_span_id[static 8]) {
        memcpy(ret_trace_id, s->trace_id, 16);
        memcpy(ret_span_id, s->span_id, 8);
}

/* The attribute named key, emptied, or a new one; NULL when there is no room. */
static SpanAttr *span_attr(Span *s, const char *key) {
        SpanAttr *a;

        for (size_t i = 0; i < s->n_attrs; i++)
                if (streq(s->attrs[i].key, key)) {
                        s->attrs[i].value = mfree(s->attrs[i].value);
                        return &s->attrs[i];
                }
        if (s->n_attrs >= TRACE_ATTRS_MAX)
                return NULL;
        a = reallocarray(s->attrs, s->n_attrs + 1, sizeof(SpanAttr));
        if (!a)
                return NULL;
        s->attrs = a;
        a = &s->attrs[s->n_attrs];
        *a = (SpanAttr){ .key = strdup(key) };
        if (!a->key)
                return NULL;
        s->n_attrs++;
        return a;
}

void span_set_attr_string(Span *s, const char *key, const char *value) {
        _cleanup_free_ char *v = NULL;
        SpanAttr *a;

        if (!span_is_recording(s) || !key || !value)
                return;
        v = strndup(value, TRACE_VALUE_MAX);
        if (!v)
                return;
        a = span_attr(s, key);
        if (a)
                a->value = TAKE_PTR(v);
}

void span_set_attr_int(Span *s, const char *key, int64_t value) {
        SpanAttr *a;

        if (!span_is_recording(s) || !key)
                return;
        a = span_attr(s, key);
        if (a)
                a->integer = value;
}

void span_set_error(Span *s, const char *message) {
        if (!s)
                return;
        s->failed = true;
        free(s->status_message);
        s->status_message = NULL;
        if (message) {
                /* a loop, not strndup(): GCC 12 misreads the bound against callers' short buffers */
                size_t n = 0;
                while (n < TRACE_VALUE_MAX && message[n])
                        n++;
                s->status_message = malloc(n + 1);
                if (s->status_message) {
                        memcpy(s->status_message, message, n);
                        s->status_message[n] = 0;
                }
        }
}

int span_traceparent(const Span *s, char ret[static 56]) {
        char trace_id[33], span_id[17];

        assert_return(s, -EINVAL);
        hex_format(s->trace_id, sizeof(s->trace_id), trace_id);
        hex_format(s->span_id, sizeof(s->span_id), span_id);
        snprintf(ret, 56, "00-%s-%s-%s", trace_id, span_id, s->sampled ? "01" : "00");
        return 0;
}

/* ---- OTLP JSON ---- */

/* {"key":…,"value":{"stringValue":…}} or, for value NULL, {"intValue":"<digits>"}: int64 values
 * are strings in OTLP JSON. */
static json_t *attr_json(const char *key, const char *value, int64_t integer) {
        json_auto_t *j = json_object(), *v = json_object();
        char digits[24];

        if (!j || !v)
                return NULL;
        if (value) {
                if (json_object_set_new(v, "stringValue", json_string_lossy(value)) < 0)
                        return NULL;
        } else {
                snprintf(digits, sizeof(digits), "%" PRIi64, integer);
                if (json_object_set_new(v, "intValue", json_string(digits)) < 0)
                        return NULL;
        }
        if (json_object_set_new(j, "key", json_string_lossy(key)) < 0 ||
            json_object_set_new(j, "value", TAKE_PTR(v)) < 0)
                return NULL;
        return TAKE_PTR(j);
}

json_t *span_to_json(const Span *s) {
        json_auto_t *j = json_object(), *attrs = json_array();
        char trace_id[33], span_id[17], parent_id[17], start[24], end[24];

        if (!j || !attrs)
                return NULL;
        hex_format(s->trace_id, sizeof(s->trace_id), trace_id);
        hex_format(s->span_id, sizeof(s->span_id), span_id);
        hex_format(s->parent_id, sizeof(s->parent_id), parent_id);
        snprintf(start, sizeof(start), "%" PRIu64, s->start_ns);
        snprintf(end, sizeof(end), "%" PRIu64, s->end_ns);

        if (json_object_set_new(j, "traceId", json_string(trace_id)) < 0 ||
            json_object_set_new(j, "spanId", json_string(span_id)) < 0)
                return NULL;
        if (s->has_parent && json_object_set_new(j, "parentSpanId", json_string(parent_id)) < 0)
                return NULL;
        if (json_object_set_new(j, "name", json_string_lossy(s->name)) < 0 ||
            json_object_set_new(j, "kind", json_integer(s->kind)) < 0 ||
            json_object_set_new(j, "startTimeUnixNano", json_string(start)) < 0 ||
            json_object_set_new(j, "endTimeUnixNano", json_string(end)) < 0)
                return NULL;
        for (size_t i = 0; i < s->n_attrs; i++)
                if (json_array_append_new(
                            attrs, attr_json(s->attrs[i].key, s->attrs[i].value, s->attrs[i].integer)) < 0)
                        return NULL;
        if (json_object_set_new(j, "attributes", TAKE_PTR(attrs)) < 0)
                return NULL;
        if (s->failed) {
                json_t *status = json_pack("{s:i}", "code", 2); /* STATUS_CODE_ERROR */

                if (!status || json_object_set_new(j, "status", status) < 0)
                        return NULL;
                if (s->status_message &&
                    json_object_set_new(status, "message", json_string_lossy(s->status_message)) < 0)
                        return NULL;
        }
        return TAKE_PTR(j);
}

static json_t *resource_json(const char *service_name, const char *version, char **pairs) {
        json_auto_t *attrs = json_array();

        if (!attrs)
                return NULL;
        if (json_array_append_new(attrs, attr_json("service.name", service_name, 0)) < 0)
                return NULL;
        if (version && json_array_append_new(attrs, attr_json("service.version", version, 0)) < 0)
                return NULL;
        for (size_t i = 0; pairs && pairs[i]; i += 2)
                if (json_array_append_new(attrs, attr_json(pairs[i], pairs[i + 1], 0)) < 0)
                        return NULL;
        return json_pack("{s:O}", "attributes", attrs);
}

json_t *tracer_export_json(Tracer *t, json_t *spans) {
        return json_pack(
                "{s:[{s:O,s:[{s:{s:s,s:s},s:O}]}]}",
                "resourceSpans",
                "resource",
                t->resource,
                "scopeSpans",
                "scope",
                "name",
                TRACE_SCOPE,
                "version",
                t->version,
                "spans",
                spans);
}

json_t *tracer_queue(Tracer *t) {
        return t->queue;
}

/* ---- export ---- */

static void tracer_schedule(Tracer *t);
static void on_export_done(CurlGlue *g, CURL *easy, CURLcode result, void *userdata);

static Export *export_free(Export *x) {
        Tracer *t;

        if (!x)
                return NULL;
        t = x->tracer;
        if (x->easy) {
                if (t) {
                        curl_glue_remove(t->curl, x->easy);
                        if (x->prev)
                                x->prev->next = x->next;
                        else
                                t->exports = x->next;
                        if (x->next)
                                x->next->prev = x->prev;
                        assert(t->n_exports > 0);
                        t->n_exports--;
                }
                curl_easy_cleanup(x->easy);
        }
        free(x->body);
        free(x);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(Export *, export_free);

static size_t discard_body(char *p, size_t size, size_t n, void *userdata) {
        return size * n;
}

/* Takes up to TRACE_BATCH_MAX spans off the queue, and returns them. */
static json_t *queue_take_batch(Tracer *t) {
        json_auto_t *batch = json_array(), *rest = json_array();
        size_t n = json_array_size(t->queue);

        if (!batch || !rest)
                return NULL;
        for (size_t i = 0; i < n; i++)
                if (json_array_append(i < TRACE_BATCH_MAX ? batch : rest, json_array_get(t->queue, i)) < 0)
                        return NULL;
        json_decref(t->queue);
        t->queue = TAKE_PTR(rest);
        return TAKE_PTR(batch);
}

/* Sends one batch. Whatever happens the batch leaves the queue: spans that cannot be sent are
 * counted as failed, so a broken collector never makes the queue grow. */
static void export_start(Tracer *t) {
        _cleanup_(export_freep) Export *x = NULL;
        json_auto_t *batch = NULL, *body = NULL;
        size_t n = json_array_size(t->queue);
        CURLcode c = CURLE_OK;
        int r;

        batch = queue_take_batch(t);
        if (!batch) {
                t->n_failed += n;
                json_array_clear(t->queue);
                log_debug("Out of memory while exporting spans, dropping %zu.", n);
                return;
        }
        n = json_array_size(batch);

        x = calloc(1, sizeof(Export));
        if (!x) {
                r = -ENOMEM;
                goto fail;
        }
        x->n_spans = n;
        body = tracer_export_json(t, batch);
        x->body = body ? json_dumps(body, JSON_COMPACT) : NULL;
        x->easy = curl_easy_init();
        if (!x->body || !x->easy) {
                r = -ENOMEM;
                goto fail;
        }

        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_URL, t->config.endpoint);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_PROTOCOLS_STR, "http,https");
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, t->headers);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_USERAGENT, t->user_agent);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) strlen(x->body));
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_POSTFIELDS, x->body);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, (long) t->config.timeout_ms);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, discard_body);
        if (c != CURLE_OK) {
                log_debug("Failed to set up the span export: %s", curl_easy_strerror(c));
                r = -EIO;
                goto fail;
        }
        r = curl_glue_add(t->curl, x->easy, on_export_done, x);
        if (r < 0)
                goto fail;

        x->tracer = t;
        x->next = t->exports;
        if (t->exports)
                t->exports->prev = x;
        t->exports = x;
        t->n_exports++;
        TAKE_PTR(x);
        return;

fail:
        t->n_failed += n;
        log_debug_errno(r, "Failed to start exporting %zu spans, dropping them: %m", n);
}

/* An export ended: counts its spans. */
static void on_export_done(CurlGlue *g, CURL *easy, CURLcode result, void *userdata) {
        Export *x = userdata;
        Tracer *t = x->tracer;
        long status = 0;

        (void) curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
        if (result != CURLE_OK) {
                t->n_failed += x->n_spans;
                log_debug(
                        "Exporting %zu spans to %s failed: %s",
                        x->n_spans,
                        t->config.endpoint,
                        curl_easy_strerror(result));
        } else if (status < 200 || status > 299) {
                t->n_failed += x->n_spans;
                log_debug(
                        "Exporting %zu spans to %s failed: the collector answered %ld.",
                        x->n_spans,
                        t->config.endpoint,
                        status);
        } else
                t->n_exported += x->n_spans;
        export_free(x);
        tracer_schedule(t);
}

static void tracer_flush(Tracer *t, bool all) {
        while (json_array_size(t->queue) > 0 && (all || t->n_exports < TRACE_EXPORTS_MAX))
                export_start(t);
        tracer_schedule(t);
}

static int on_flush_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        tracer_flush(userdata, /* all= */ false);
        return 0;
}

/* Arms the flush timer: the schedule delay after the first span waits, at once when a full batch
 * waits and a request may go. */
static void tracer_schedule(Tracer *t) {
        size_t n = json_array_size(t->queue);
        int enabled = SD_EVENT_OFF, r;
        usec_t when;

        if (!t->flush_timer)
                return;
        if (n == 0) {
                (void) sd_event_source_set_enabled(t->flush_timer, SD_EVENT_OFF);
                return;
        }
        if (n >= TRACE_BATCH_MAX && t->n_exports < TRACE_EXPORTS_MAX)
                when = 1; /* in the past: on the next iteration */
        else {
                (void) sd_event_source_get_enabled(t->flush_timer, &enabled);
                if (enabled != SD_EVENT_OFF)
                        return;
                when = now_usec(CLOCK_MONOTONIC) + t->config.schedule_delay_ms * USEC_PER_MSEC;
        }
        r = sd_event_source_set_time(t->flush_timer, when);
        if (r >= 0)
                r = sd_event_source_set_enabled(t->flush_timer, SD_EVENT_ONESHOT);
        if (r < 0)
                log_debug_errno(r, "Failed to arm the span flush timer, ignoring: %m");
}

/* Encodes an ended span onto the export queue. */
static void span_enqueue(Span *s) {
        Tracer *t = s->tracer;
        json_t *j;

        if (json_array_size(t->queue) >= TRACE_QUEUE_MAX) {
                if (t->n_dropped++ == 0)
                        log_debug("The span queue is full, dropping spans.");
                return;
        }
        j = span_to_json(s);
        if (!j || json_array_append_new(t->queue, j) < 0) {
                t->n_dropped++;
                return;
        }
        tracer_schedule(t);
}

void span_end(Span *s) {
        if (!s)
                return;
        if (s->sampled) {
                s->end_ns = now_nsec();
                span_enqueue(s);
        }
        span_free(s);
}

/* ---- the tracer ---- */

static int tracer_headers(Tracer *t) {
        bool content_type = false;

        for (char **h = t->config.headers; h && h[0]; h += 2) {
                _cleanup_free_ char *line = NULL;
                struct curl_slist *l;

                /* "Name;" is how libcurl sends a header with an empty value ("Name:" removes it) */
                asprintf_or_null(&line, *h[1] ? "%s: %s" : "%s;", h[0], h[1]);
                if (!line)
                        return -ENOMEM;
                l = curl_slist_append(t->headers, line);
                if (!l)
                        return -ENOMEM;
                t->headers = l;
                content_type = content_type || strcasecmp(h[0], "Content-Type") == 0;
        }
        /* "Expect:" keeps libcurl from waiting for a 100 Continue that small collectors never send */
        static const char *const ours[] = { "Content-Type: application/json", "Expect:" };
        for (size_t i = content_type ? 1 : 0; i < ELEMENTSOF(ours); i++) {
                struct curl_slist *l = curl_slist_append(t->headers, ours[i]);

                if (!l)
                        return -ENOMEM;
                t->headers = l;
        }
        return 0;
}

static void tracer_freep(Tracer **t) {
        tracer_free(*t, 0);
}

int tracer_new(Tracer **ret, sd_event *event, const char *version, TraceConfig *c) {
        _cleanup_(tracer_freep) Tracer *t = NULL;
        int r;

        assert_return(ret && event && c && c->endpoint && c->service_name && c->schedule_delay_ms > 0, -EINVAL);

        t = calloc(1, sizeof(Tracer));
        if (!t)
                return -ENOMEM;
        t->event = sd_event_ref(event);
        t->config = *c;
        *c = (TraceConfig){};
        t->version = strdup(version ?: "");
        t->queue = json_array();
        t->resource = resource_json(t->config.service_name, version, t->config.resource);
        asprintf_or_null(&t->user_agent, "vm-manager/%s", version ?: "0");
        if (!t->version || !t->queue || !t->resource || !t->user_agent)
                return -ENOMEM;
        r = tracer_headers(t);
        if (r < 0)
                return r;

        r = curl_glue_new(&t->curl, event, "trace-curl", /* ca_file= */ NULL);
        if (r < 0)
                return r;

        r = sd_event_add_time(
                event, &t->flush_timer, CLOCK_MONOTONIC, 0, 100 * USEC_PER_MSEC, on_flush_timer, t);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(t->flush_timer, "trace-flush");
        r = sd_event_source_set_enabled(t->flush_timer, SD_EVENT_OFF);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(t);
        return 0;
}

int tracer_new_from_env(Tracer **ret, sd_event *event, const char *version, char **ret_message) {
        _cleanup_(trace_config_done) TraceConfig c = {};
        _cleanup_free_ char *message = NULL;
        Tracer *t = NULL;
        int r;

        assert_return(ret && event, -EINVAL);

        r = trace_config_from_env(&c, &message);
        if (r >= 0 && c.endpoint)
                r = tracer_new(&t, event, version, &c);
        if (ret_message)
                *ret_message = TAKE_PTR(message);
        if (r < 0)
                return r;
        *ret = t;
        return 0;
}

Tracer *tracer_free(Tracer *t, uint64_t timeout_usec) {
        usec_t now, deadline;

        if (!t)
                return NULL;

        t->flush_timer = sd_event_source_disable_unref(t->flush_timer);
        if (t->curl) {
                /* what is queued goes out too, driven by libcurl's own poll: the loop may be over */
                curl_glue_detach(t->curl);
                tracer_flush(t, /* all= */ true);
                now = now_usec(CLOCK_MONOTONIC);
                deadline = timeout_usec > USEC_INFINITY - now ? USEC_INFINITY : now + timeout_usec;
                curl_glue_drain(t->curl, deadline);
                while (t->exports) {
                        t->n_failed += t->exports->n_spans;
                        export_free(t->exports);
                }
                if (t->n_failed > 0 || t->n_dropped > 0)
                        log_debug(
                                "Spans exported: %" PRIu64 ", lost to failed exports: %" PRIu64
                                ", dropped from a full queue: %" PRIu64 ".",
                                t->n_exported,
                                t->n_failed,
                                t->n_dropped);
                t->curl = curl_glue_free(t->curl);
        }

        curl_slist_free_all(t->headers);
        json_decref(t->queue);
        json_decref(t->resource);
        free(t->user_agent);
        free(t->version);
        trace_config_done(&t->config);
        sd_event_unref(t->event);
        free(t);
        return NULL;
}

const char *tracer_endpoint(const Tracer *t) {
        return t ? t->config.endpoint : NULL;
}

void tracer_get_stats(const Tracer *t, TracerStats *ret) {
        *ret = (TracerStats){
                .queued = t ? json_array_size(t->queue) : 0,
                .exported = t ? t->n_exported : 0,
                .failed = t ? t->n_failed : 0,
                .dropped = t ? t->n_dropped : 0,
        };
}

/* ---- HTTP server spans ---- */

static const char *http_method_known(const char *method) {
        static const char *const methods[] = {
                "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
        };

        for (size_t i = 0; method && i < ELEMENTSOF(methods); i++)
                if (streq(method, methods[i]))
                        return methods[i];
        return NULL;
}

Span *span_start_http_server(
        Tracer *t, const char *method, const char *route, const char *path, const char *traceparent) {
        _cleanup_free_ char *name = NULL;
        const char *m = http_method_known(method);
        Span *s;

        if (!t)
                return NULL;
        asprintf_or_null(&name, "%s %s", m ?: "HTTP", route ?: "");
        if (!name)
                return NULL;
        s = span_start(t, name, SPAN_KIND_SERVER, /* parent= */ NULL, traceparent);
        if (!s)
                return NULL;
        s->http_method = m ?: "HTTP";
        span_set_attr_string(s, "http.request.method", m ?: "_OTHER");
        span_set_attr_string(s, "url.path", path);
        return s;
}

void span_set_http_route(Span *s, const char *prefix, const char *route) {
        _cleanup_free_ char *full = NULL, *name = NULL;

        if (!span_is_recording(s))
                return; /* nobody sees the name of a span that is not exported */
        asprintf_or_null(&full, "%s%s", prefix ?: "", route ?: "");
        if (!full)
                return;
        asprintf_or_null(&name, "%s %s", s->http_method ?: "HTTP", full);
        if (!name)
                return;
        if (strlen(name) > TRACE_NAME_MAX)
                name[TRACE_NAME_MAX] = 0;
        span_set_attr_string(s, "http.route", full);
        free(s->name);
        s->name = TAKE_PTR(name);
}

void span_end_http_server(Span *s, unsigned status) {
        char message[32];

        if (!s)
                return;
        if (status > 0)
                span_set_attr_int(s, "http.response.status_code", status);
        if (status >= 500 && !s->failed) {
                snprintf(message, sizeof(message), "HTTP %u", status);
                span_set_error(s, message);
        }
        span_end(s);
}
