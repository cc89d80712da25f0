/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The Prometheus text exposition format (version 0.0.4), written by hand: Debian has no C client
 * library. Families are written one after the other; the caller keeps each family's samples together
 * and gives every family a HELP and a TYPE line. Output goes to a MetricsBuf: a growing buffer with
 * no zero-filling and no stdio locking, since a scrape of 50 VMs with their guest reports writes
 * megabytes. An allocation failure is remembered in the buffer (oom) and later writes are dropped. */

typedef struct MetricsBuf {
        char *data;
        size_t size, cap;
        bool oom;
} MetricsBuf;

/* Makes room for n more bytes at least. */
void metrics_buf_reserve(MetricsBuf *b, size_t n);
void metrics_buf_append(MetricsBuf *b, const char *s, size_t n);
void metrics_buf_puts(MetricsBuf *b, const char *s);
void metrics_buf_printf(MetricsBuf *b, const char *format, ...) __attribute__((format(printf, 2, 3)));
void metrics_buf_done(MetricsBuf *b);

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* The shortest decimal that reads back as the same double; "+Inf", "-Inf", "NaN". */
#define METRICS_VALUE_MAX 32
const char *metrics_format_value(double v, char buf[static METRICS_VALUE_MAX]);

/* Whether s is a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or label name ([a-zA-Z_][a-zA-Z0-9_]*,
 * not starting with "__"). */
bool metrics_name_is_valid(const char *s);
bool metrics_label_name_is_valid(const char *s);

/* "# HELP name help" (help escaped: backslash, newline) and "# TYPE name type". */
void metrics_write_family(MetricsBuf *f, const char *name, const char *type, const char *help);

/* One sample line: name{l1="v1",…} value. Label values are escaped (backslash, double quote,
 * newline); n_labels 0 writes no braces. */
void metrics_write_sample(
        MetricsBuf *f,
        const char *name,
        const char *const *label_names,
        const char *const *label_values,
        size_t n_labels,
        double value);

/* The same with the labels as a NULL-terminated list of name, value pairs. */
void metrics_write_samplel(MetricsBuf *f, const char *name, double value, ...) __attribute__((sentinel));

/* A histogram without labels: fixed upper bounds (ascending, +Inf implied), counts per bucket. */
#define METRICS_HISTOGRAM_BUCKETS_MAX 16
typedef struct MetricsHistogram {
        const double *bounds;
        size_t n_bounds;
        uint64_t buckets[METRICS_HISTOGRAM_BUCKETS_MAX + 1]; /* not cumulative; last: above every bound */
        uint64_t count;
        double sum;
} MetricsHistogram;

void metrics_histogram_init(MetricsHistogram *h, const double *bounds, size_t n_bounds);
void metrics_histogram_observe(MetricsHistogram *h, double v);
/* The family (HELP, TYPE histogram) and its _bucket (cumulative, le="…"), _sum and _count lines. */
void metrics_write_histogram(MetricsBuf *f, const char *name, const char *help, const MetricsHistogram *h);
