/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "metrics-text.h"

void metrics_buf_reserve(MetricsBuf *b, size_t n) {
        size_t cap;
        char *d;

        if (b->oom || b->cap - b->size >= n)
                return;
        cap = MAX(b->cap * 2, b->size + n);
        cap = MAX(cap, (size_t) 4096);
        d = realloc(b->data, cap);
        if (!d) {
                b->oom = true;
                return;
        }
        b->data = d;
        b->cap = cap;
}

void metrics_buf_append(MetricsBuf *b, const char *s, size_t n) {
        metrics_buf_reserve(b, n + 1);
        if (b->oom)
                return;
        memcpy(b->data + b->size, s, n);
        b->size += n;
        b->data[b->size] = 0;
}

void metrics_buf_puts(MetricsBuf *b, const char *s) {
        metrics_buf_append(b, s, strlen(s));
}

void metrics_buf_printf(MetricsBuf *b, const char *format, ...) {
        va_list ap;
        int n;

        metrics_buf_reserve(b, 256);
        if (b->oom)
                return;
        va_start(ap, format);
        n = vsnprintf(b->data + b->size, b->cap - b->size, format, ap);
        va_end(ap);
        if (n < 0) {
                b->oom = true;
                return;
        }
        if ((size_t) n >= b->cap - b->size) {
                metrics_buf_reserve(b, (size_t) n + 1);
                if (b->oom)
                        return;
                va_start(ap, format);
                (void) vsnprintf(b->data + b->size, b->cap - b->size, format, ap);
                va_end(ap);
        }
        b->size += (size_t) n;
}

void metrics_buf_done(MetricsBuf *b) {
        free(b->data);
        *b = (MetricsBuf){};
}

const char *metrics_format_value(double v, char buf[static METRICS_VALUE_MAX]) {
        if (isnan(v))
                return strcpy(buf, "NaN");
        if (isinf(v))
                return strcpy(buf, v > 0 ? "+Inf" : "-Inf");
        /* integers as integers: counters and byte counts read naturally */
        if (v == trunc(v) && fabs(v) < 1e15) {
                char tmp[24], *p = tmp + sizeof(tmp);
                unsigned long long u = (unsigned long long) fabs(v);
                size_t n;

                *--p = 0;
                do
                        *--p = (char) ('0' + u % 10);
                while ((u /= 10) > 0);
                if (v < 0)
                        *--p = '-';
                n = (size_t) (tmp + sizeof(tmp) - p);
                memcpy(buf, p, n);
                return buf;
        }
        for (int prec = 15; prec <= 17; prec++) {
                snprintf(buf, METRICS_VALUE_MAX, "%.*g", prec, v);
                if (strtod(buf, NULL) == v)
                        break;
        }
        return buf;
}

static bool name_char(char c, bool first, bool colon) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
                return true;
        if (c == ':')
                return colon;
        return !first && c >= '0' && c <= '9';
}

bool metrics_name_is_valid(const char *s) {
        if (!s || !*s)
                return false;
        for (const char *p = s; *p; p++)
                if (!name_char(*p, p == s, true))
                        return false;
        return true;
}

bool metrics_label_name_is_valid(const char *s) {
        if (!s || !*s || (s[0] == '_' && s[1] == '_'))
                return false;
        for (const char *p = s; *p; p++)
                if (!name_char(*p, p == s, false))
                        return false;
        return true;
}

static void write_escaped(MetricsBuf *f, const char *s, bool quote) {
        const char *special = quote ? "\\\n\"" : "\\\n";

        for (;;) {
                size_t n = strcspn(s, special);

                metrics_buf_append(f, s, n);
                s += n;
                if (!*s)
                        return;
                metrics_buf_append(f, *s == '\n' ? "\\n" : *s == '"' ? "\\\"" : "\\\\", 2);
                s++;
        }
}

void metrics_write_family(MetricsBuf *f, const char *name, const char *type, const char *help) {
        metrics_buf_puts(f, "# HELP ");
        metrics_buf_puts(f, name);
        metrics_buf_append(f, " ", 1);
        write_escaped(f, help, false);
        metrics_buf_puts(f, "\n# TYPE ");
        metrics_buf_puts(f, name);
        metrics_buf_append(f, " ", 1);
        metrics_buf_puts(f, type);
        metrics_buf_append(f, "\n", 1);
}

void metrics_write_sample(
        MetricsBuf *f,
        const char *name,
        const char *const *label_names,
        const char *const *label_values,
        size_t n_labels,
        double value) {
        char buf[METRICS_VALUE_MAX];

        metrics_buf_puts(f, name);
        if (n_labels > 0) {
                metrics_buf_append(f, "{", 1);
                for (size_t i = 0; i < n_labels; i++) {
                        if (i > 0)
                                metrics_buf_append(f, ",", 1);
                        metrics_buf_puts(f, label_names[i]);
                        metrics_buf_append(f, "=\"", 2);
                        write_escaped(f, label_values[i] ?: "", true);
                        metrics_buf_append(f, "\"", 1);
                }
                metrics_buf_append(f, "}", 1);
        }
        metrics_buf_append(f, " ", 1);
        metrics_buf_puts(f, metrics_format_value(value, buf));
        metrics_buf_append(f, "\n", 1);
}

#define SAMPLE_LABELS_MAX 16

void metrics_write_samplel(MetricsBuf *f, const char *name, double value, ...) {
        const char *names[SAMPLE_LABELS_MAX], *values[SAMPLE_LABELS_MAX];
        size_t n = 0;
        va_list ap;

        va_start(ap, value);
        for (const char *k; (k = va_arg(ap, const char *));) {
                const char *v = va_arg(ap, const char *);

                assert(n < SAMPLE_LABELS_MAX);
                names[n] = k;
                values[n++] = v;
        }
        va_end(ap);
        metrics_write_sample(f, name, names, values, n, value);
}

void metrics_histogram_init(MetricsHistogram *h, const double *bounds, size_t n_bounds) {
        assert(n_bounds <= METRICS_HISTOGRAM_BUCKETS_MAX);
        *h = (MetricsHistogram){ .bounds = bounds, .n_bounds = n_bounds };
}

void metrics_histogram_observe(MetricsHistogram *h, double v) {
        size_t i = 0;

        while (i < h->n_bounds && v > h->bounds[i])
                i++;
        h->buckets[i]++;
        h->count++;
        h->sum += v;
}

void metrics_write_histogram(MetricsBuf *f, const char *name, const char *help, const MetricsHistogram *h) {
        char bucket[256], sum[256], count[256], le[METRICS_VALUE_MAX];
        uint64_t cumulative = 0;

        assert(strlen(name) < sizeof(bucket) - 8);
        snprintf(bucket, sizeof(bucket), "%s_bucket", name);
        snprintf(sum, sizeof(sum), "%s_sum", name);
        snprintf(count, sizeof(count), "%s_count", name);
        metrics_write_family(f, name, "histogram", help);
        for (size_t i = 0; i <= h->n_bounds; i++) {
                cumulative += h->buckets[i];
                metrics_write_samplel(
                        f,
                        bucket,
                        (double) cumulative,
                        "le",
                        i < h->n_bounds ? metrics_format_value(h->bounds[i], le) : "+Inf",
                        NULL);
        }
        metrics_write_sample(f, sum, NULL, NULL, 0, h->sum);
        metrics_write_sample(f, count, NULL, NULL, 0, (double) h->count);
}
