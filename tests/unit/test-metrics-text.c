/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "macro.h"
#include "metrics-text.h"
#include <string.h>

/* Runs code on a fresh buffer f and returns what it wrote. */
#define CAPTURE(buf, code)                    \
        do {                                  \
                MetricsBuf _b = {}, *f = &_b; \
                code;                         \
                assert_false(_b.oom);         \
                (buf) = _b.data;              \
        } while (0)

static void test_format_value(void **state) {
        char b[METRICS_VALUE_MAX];

        assert_string_equal(metrics_format_value(0, b), "0");
        assert_string_equal(metrics_format_value(42, b), "42");
        assert_string_equal(metrics_format_value(-3, b), "-3");
        assert_string_equal(metrics_format_value(2147483648.0, b), "2147483648");
        assert_string_equal(metrics_format_value(0.1, b), "0.1");
        assert_string_equal(metrics_format_value(1.5, b), "1.5");
        assert_string_equal(metrics_format_value(1e300, b), "1e+300");
        assert_string_equal(metrics_format_value(INFINITY, b), "+Inf");
        assert_string_equal(metrics_format_value(-INFINITY, b), "-Inf");
        assert_string_equal(metrics_format_value(NAN, b), "NaN");
        /* shortest round trip */
        assert_true(strtod(metrics_format_value(1.0 / 3.0, b), NULL) == 1.0 / 3.0);
        assert_string_equal(metrics_format_value(1796002320.5999138, b), "1796002320.5999138");
}

static void test_names(void **state) {
        assert_true(metrics_name_is_valid("vm_manager_vms"));
        assert_true(metrics_name_is_valid("a:b_c1"));
        assert_true(metrics_name_is_valid("_x"));
        assert_false(metrics_name_is_valid(""));
        assert_false(metrics_name_is_valid("1abc"));
        assert_false(metrics_name_is_valid("a-b"));
        assert_false(metrics_name_is_valid("a b"));
        assert_true(metrics_label_name_is_valid("object"));
        assert_false(metrics_label_name_is_valid("__name__"));
        assert_false(metrics_label_name_is_valid("a:b"));
        assert_false(metrics_label_name_is_valid("9"));
}

static void test_family_and_escaping(void **state) {
        _cleanup_free_ char *out = NULL;

        CAPTURE(out, {
                metrics_write_family(f, "x_total", "counter", "Help with \\ and\nnewline \"quoted\".");
                metrics_write_samplel(f, "x_total", 3, "vm", "a\"b\\c\nd", "object", "", NULL);
                metrics_write_sample(f, "x_total", NULL, NULL, 0, 0.25);
        });
        assert_string_equal(
                out,
                "# HELP x_total Help with \\\\ and\\nnewline \"quoted\".\n"
                "# TYPE x_total counter\n"
                "x_total{vm=\"a\\\"b\\\\c\\nd\",object=\"\"} 3\n"
                "x_total 0.25\n");
}

static void test_buf(void **state) {
        MetricsBuf b = {};

        for (int i = 0; i < 10000; i++)
                metrics_buf_printf(&b, "%d,", i);
        assert_false(b.oom);
        assert_true(b.size == strlen(b.data));
        assert_true(strneq(b.data, "0,1,2,", 6));
        assert_true(b.size > 40000 && b.cap >= b.size + 1);
        metrics_buf_printf(&b, "%0300d", 7); /* longer than the room reserved up front */
        assert_true(b.size == strlen(b.data));
        assert_int_equal(b.data[b.size - 1], '7');
        metrics_buf_done(&b);
        assert_null(b.data);
}

static void test_histogram(void **state) {
        static const double bounds[] = { 1, 2, 5 };
        _cleanup_free_ char *out = NULL;
        MetricsHistogram h;

        metrics_histogram_init(&h, bounds, ELEMENTSOF(bounds));
        metrics_histogram_observe(&h, 0.5);
        metrics_histogram_observe(&h, 1); /* le is inclusive */
        metrics_histogram_observe(&h, 4);
        metrics_histogram_observe(&h, 100);
        CAPTURE(out, metrics_write_histogram(f, "d_seconds", "Durations.", &h));
        assert_string_equal(
                out,
                "# HELP d_seconds Durations.\n"
                "# TYPE d_seconds histogram\n"
                "d_seconds_bucket{le=\"1\"} 2\n"
                "d_seconds_bucket{le=\"2\"} 2\n"
                "d_seconds_bucket{le=\"5\"} 3\n"
                "d_seconds_bucket{le=\"+Inf\"} 4\n"
                "d_seconds_sum 105.5\n"
                "d_seconds_count 4\n");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_format_value),        cmocka_unit_test(test_names),
                cmocka_unit_test(test_family_and_escaping), cmocka_unit_test(test_buf),
                cmocka_unit_test(test_histogram),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
