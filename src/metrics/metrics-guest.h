/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cleanup.h"
#include "time-util.h"

/* The guest side of the metrics: a systemd-report upload (POST /report on the IMDS, untrusted bytes)
 * parsed and mapped to vm_guest_* series by the rules of runtime.md §10. Pure: no I/O, no logging
 * above debug. */

#define GUEST_REPORT_SIZE_MAX ((size_t) 8 << 20)   /* bytes of one upload */
#define GUEST_REPORT_DEPTH_MAX 32U                 /* nesting of arrays and objects */
#define GUEST_REPORT_VALUES_MAX ((size_t) 1 << 17) /* arrays, objects and commas */
#define GUEST_SERIES_LIMIT_DEFAULT 1000U
#define GUEST_LABEL_VALUE_MAX 128U /* bytes; longer values are cut at a UTF-8 boundary and end in "…" */
#define GUEST_SAMPLE_MAX 10U

typedef enum GuestDropReason {
        GUEST_DROP_LIMIT,
        GUEST_DROP_UNSUPPORTED,
        GUEST_DROP_DUPLICATE,
        _GUEST_DROP_MAX,
} GuestDropReason;

const char *guest_drop_reason_to_string(GuestDropReason r) _const_; /* "limit", "unsupported", "duplicate" */

typedef enum GuestSeriesKind {
        GUEST_SERIES_GAUGE,
        GUEST_SERIES_COUNTER,
        GUEST_SERIES_INFO, /* a string value: gauge 1 with the string in label "value" */
        _GUEST_SERIES_KIND_MAX,
} GuestSeriesKind;

typedef struct GuestSeries {
        char *name;   /* the exported metric name: vm_guest_…[_total|_info] */
        char *family; /* the entry's original "name", for the HELP line */
        GuestSeriesKind kind;
        /* label pairs without "vm": "object" first (always, "" for host-wide families), then the field
         * labels in the order of the entry's fields, then "value" for info series. names[i] ↔ values[i]. */
        char **label_names;
        char **label_values;
        size_t n_labels;
        double value;
} GuestSeries;

typedef struct GuestReport {
        bool is_report; /* valid JSON and an object with a "metrics" array; false: stored, not exported */
        usec_t generated_at; /* the report's "timestamp" (CLOCK_REALTIME), 0 when absent or unparsable */
        size_t n_entries;    /* entries of the metrics array */
        size_t n_families;   /* distinct entry names */
        GuestSeries *series; /* exported, in report order */
        size_t n_series;
        uint64_t dropped[_GUEST_DROP_MAX]; /* this upload */
        json_t *sample; /* the first GUEST_SAMPLE_MAX entries verbatim; json null for 0 entries */
} GuestReport;

/* Parses one upload. -EMSGSIZE: larger than GUEST_REPORT_SIZE_MAX; -ELOOP: nested deeper than
 * GUEST_REPORT_DEPTH_MAX; -E2BIG: more than GUEST_REPORT_VALUES_MAX values; -EBADMSG: not JSON at all;
 * -ENOMEM. Valid JSON that is not a report gives 0 and a report with is_report false. series_limit ≥ 1
 * caps the exported series; the rest are counted in dropped[GUEST_DROP_LIMIT]. */
int guest_report_parse(const void *data, size_t size, size_t series_limit, GuestReport **ret);
GuestReport *guest_report_free(GuestReport *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(GuestReport *, guest_report_free);

/* The naming rules, exposed for tests: the metric name of a family ("io.systemd.Manager.NRestarts",
 * counter → "vm_guest_io_systemd_manager_nrestarts_total"), a label name from a field key, a label
 * value from a JSON value (truncated; NULL gives ""). NULL on OOM. guest_metric_name() also returns
 * NULL, with errno EINVAL, for a family without an ASCII letter or digit (its snake case is empty):
 * such an entry is unsupported. */
char *guest_metric_name(const char *family, GuestSeriesKind kind);
char *guest_label_name(const char *key);
char *guest_label_value(const json_t *v);

/* A report's "timestamp" in Go's layout "Mon 2006-01-02 15:04:05 MST" (what Go's time.Parse takes:
 * the weekday in any case and not checked against the date, runs of spaces, a one-digit hour, a
 * fraction of a second after the seconds, a zone of 3-5 capitals, "ChST", "MeST", "GMT+h" or "±h")
 * to usec since the epoch. Every zone gets offset 0, as Go gives zones it does not know on a host
 * in UTC. -EINVAL: not that layout or an invalid date; -ERANGE: before the epoch. */
int guest_report_parse_timestamp(const char *s, usec_t *ret);
