/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The guest report mapper (runtime.md §10): metric and label naming, label values and their
 * truncation, the kinds, the per-upload limit/duplicate/unsupported accounting, the pre-checks of
 * the upload and the report timestamp. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test-util.h"

#include "metrics-guest.h"

#define ELLIPSIS "\xe2\x80\xa6"

static GuestReport *parse_ok(const char *json, size_t limit) {
        GuestReport *r = NULL;

        assert_ok(guest_report_parse(json, strlen(json), limit, &r));
        assert_non_null(r);
        return r;
}

static const GuestSeries *find_series(const GuestReport *r, const char *name, const char *object) {
        for (size_t i = 0; i < r->n_series; i++)
                if (streq(r->series[i].name, name) && streq(r->series[i].label_values[0], object))
                        return r->series + i;
        fail_msg("no series %s{object=\"%s\"}", name, object);
        abort(); /* not reached: fail_msg ends the test; tells the compiler so (release builds) */
}

/* The labels as Prometheus would show them: a="x",b="y" */
static char *labels_string(const GuestSeries *s) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        assert_non_null(f);
        for (size_t i = 0; i < s->n_labels; i++)
                fprintf(f, "%s%s=\"%s\"", i > 0 ? "," : "", s->label_names[i], s->label_values[i]);
        assert_int_equal(fclose(f), 0);
        assert_null(s->label_names[s->n_labels]);
        assert_null(s->label_values[s->n_labels]);
        return buf;
}

static void assert_labels(const GuestSeries *s, const char *expected) {
        _cleanup_free_ char *l = labels_string(s);
        assert_string_equal(l, expected);
}

/* jansson refuses to make a string of anything but valid UTF-8. */
static bool utf8_valid(const char *s) {
        json_t *j = json_string(s);

        json_decref(j);
        return j != NULL;
}

static void assert_metric_name(const char *family, GuestSeriesKind kind, const char *expected) {
        _cleanup_free_ char *n = guest_metric_name(family, kind);
        assert_non_null(n);
        assert_string_equal(n, expected);
}

static void test_metric_name(void **state) {
        /* the examples of the reference */
        assert_metric_name(
                "io.systemd.Manager.NRestarts",
                GUEST_SERIES_COUNTER,
                "vm_guest_io_systemd_manager_nrestarts_total");
        assert_metric_name(
                "io.systemd.Network.IPv4AddressState",
                GUEST_SERIES_INFO,
                "vm_guest_io_systemd_network_ipv4_address_state_info");
        assert_metric_name(
                "org.example.HTTP2Server.requests-ok!",
                GUEST_SERIES_GAUGE,
                "vm_guest_org_example_http2_server_requests_ok");

        /* a counter already ending in _total gets no second one; info always gets _info */
        assert_metric_name("io.example.BytesTotal", GUEST_SERIES_COUNTER, "vm_guest_io_example_bytes_total");
        assert_metric_name(
                "io.example.requests_total", GUEST_SERIES_COUNTER, "vm_guest_io_example_requests_total");
        assert_metric_name("io.example.Total", GUEST_SERIES_COUNTER, "vm_guest_io_example_total");
        assert_metric_name("io.example.BytesTotal", GUEST_SERIES_GAUGE, "vm_guest_io_example_bytes_total");
        assert_metric_name("io.example.Info", GUEST_SERIES_INFO, "vm_guest_io_example_info_info");

        /* punctuation at the ends is trimmed, runs of it become one '_' */
        assert_metric_name("...io..example--Load!!", GUEST_SERIES_GAUGE, "vm_guest_io_example_load");
        assert_metric_name("_Load_", GUEST_SERIES_GAUGE, "vm_guest_load");
        assert_metric_name("a__b", GUEST_SERIES_GAUGE, "vm_guest_a_b");

        /* case changes */
        assert_metric_name("aB", GUEST_SERIES_GAUGE, "vm_guest_a_b");
        assert_metric_name("ABC", GUEST_SERIES_GAUGE, "vm_guest_abc");
        assert_metric_name("a1B", GUEST_SERIES_GAUGE, "vm_guest_a1_b");
        assert_metric_name("CPUUsage", GUEST_SERIES_GAUGE, "vm_guest_cpuusage");
        assert_metric_name("9Lives", GUEST_SERIES_GAUGE, "vm_guest_9_lives");

        /* a rune beyond ASCII is one more character to replace */
        assert_metric_name("io.systemd.Café.Größe", GUEST_SERIES_GAUGE, "vm_guest_io_systemd_caf_gr_e");
        assert_metric_name("日本.Load", GUEST_SERIES_GAUGE, "vm_guest_load");
        assert_metric_name("ÄBC", GUEST_SERIES_GAUGE, "vm_guest_bc");

        /* nothing left: no name */
        errno = 0;
        assert_null(guest_metric_name("", GUEST_SERIES_GAUGE));
        assert_int_equal(errno, EINVAL);
        assert_null(guest_metric_name("..._!!", GUEST_SERIES_COUNTER));
        assert_null(guest_metric_name("日本", GUEST_SERIES_INFO));
}

static void assert_label_name(const char *key, const char *expected) {
        _cleanup_free_ char *n = guest_label_name(key);
        assert_non_null(n);
        assert_string_equal(n, expected);
}

static void test_label_name(void **state) {
        assert_label_name("1abc", "field_1abc");
        assert_label_name("vm", "field_vm");
        assert_label_name("object", "field_object");
        assert_label_name("value", "field_value");
        assert_label_name("a-b", "a_b");
        assert_label_name("_x", "x");
        assert_label_name("__x__", "x__");
        assert_label_name("_1", "field_1");
        assert_label_name("", "field_");
        assert_label_name("___", "field_");
        assert_label_name("Disk.Name", "Disk_Name");
        assert_label_name("VM", "VM");
        assert_label_name("é", "field_");
        assert_label_name("aé😀b", "a__b");
        assert_label_name("_vm", "field_vm");
}

static void assert_label_value(json_t *v, const char *expected) {
        _cleanup_free_ char *s = guest_label_value(v);
        assert_non_null(s);
        assert_string_equal(s, expected);
        json_decref(v);
}

static char *repeat(const char *s, size_t n) {
        size_t k = strlen(s);
        char *r = malloc(k * n + 1);

        assert_non_null(r);
        for (size_t i = 0; i < n; i++)
                memcpy(r + i * k, s, k);
        r[k * n] = 0;
        return r;
}

static void test_label_value(void **state) {
        assert_label_value(json_string("sshd.service"), "sshd.service");
        assert_label_value(json_string(""), "");
        assert_label_value(json_integer(42), "42");
        assert_label_value(json_integer(-7), "-7");
        assert_label_value(json_real(3.0), "3");
        assert_label_value(json_real(0.1), "0.1");
        assert_label_value(json_real(1.5), "1.5");
        assert_label_value(json_real(1.0 / 3), "0.3333333333333333");
        assert_label_value(json_real(1e21), "1e+21");
        assert_label_value(json_true(), "true");
        assert_label_value(json_false(), "false");
        assert_label_value(json_null(), "null");
        assert_label_value(json_pack("{s:i,s:[b,s]}", "a", 1, "b", true, "c"), "{\"a\":1,\"b\":[true,\"c\"]}");
        assert_label_value(json_pack("[]"), "[]");

        _cleanup_free_ char *s = guest_label_value(NULL);
        assert_string_equal(s, "");
}

static void assert_truncated(const char *rune, size_t n, size_t expected_bytes) {
        _cleanup_free_ char *in = repeat(rune, n), *out = NULL;
        json_auto_t *v = json_string(in);
        size_t len;

        assert_non_null(v);
        out = guest_label_value(v);
        assert_non_null(out);
        len = strlen(out);
        assert_int_equal(len, expected_bytes);
        assert_true(utf8_valid(out));
        assert_string_equal(out + len - strlen(ELLIPSIS), ELLIPSIS);
        /* what is kept is the start of the original, whole runes */
        assert_memory_equal(out, in, len - strlen(ELLIPSIS));
        assert_int_equal((len - strlen(ELLIPSIS)) % strlen(rune), 0);
}

static void test_label_value_truncation(void **state) {
        _cleanup_free_ char *exact = repeat("a", 128), *out = NULL;
        json_auto_t *v = json_string(exact);

        /* 128 bytes stay as they are */
        out = guest_label_value(v);
        assert_string_equal(out, exact);

        /* one byte more: 127 bytes and the ellipsis */
        assert_truncated("a", 129, 127 + 3);
        /* 2-byte runes: byte 127 would split one, 126 are kept */
        assert_truncated("é", 200, 126 + 3);
        /* 3-byte runes: 42 of them are 126 bytes */
        assert_truncated("€", 50, 126 + 3);
        /* 4-byte runes: 31 of them are 124 bytes */
        assert_truncated("😀", 40, 124 + 3);
        /* a value that was 128 bytes of 2-byte runes is not cut */
        _cleanup_free_ char *pairs = repeat("é", 64), *kept = NULL;
        json_auto_t *w = json_string(pairs);
        kept = guest_label_value(w);
        assert_string_equal(kept, pairs);

        /* re-encoded JSON is cut too */
        _cleanup_free_ char *obj = NULL;
        json_auto_t *o = json_pack(
                "{s:s}", "k", "ééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééé");
        obj = guest_label_value(o);
        assert_true(strlen(obj) <= 127 + 3);
        assert_true(utf8_valid(obj));
        assert_startswith(obj, "{\"k\":\"é");
}

/* systemd-report's shape: host-wide and per-object families, fields, a string, a bool, a declared
 * counter with a string number, the two implicit counters */
static const char realistic[] =
        "{\n"
        "  \"mediaType\": \"application/vnd.io.systemd.report\",\n"
        "  \"timestamp\": \"Sat 2026-09-12 14:17:48 UTC\",\n"
        "  \"metrics\": [\n"
        "    {\"name\": \"io.systemd.Manager.NRestarts\", \"object\": \"sshd.service\", \"value\": 2},\n"
        "    {\"name\": \"io.systemd.Manager.NRestarts\", \"object\": \"systemd-networkd.service\", \"value\": 0},\n"
        "    {\"name\": \"io.systemd.Manager.ReloadCount\", \"value\": 1},\n"
        "    {\"name\": \"io.systemd.Manager.UnitActiveState\", \"object\": \"sshd.service\", \"value\": \"active\"},\n"
        "    {\"name\": \"io.systemd.Network.IPv4AddressState\", \"object\": \"eth0\", \"value\": \"routable\"},\n"
        "    {\"name\": \"io.systemd.Basic.KernelVersion\", \"value\": \"6.12.43+deb13-cloud-amd64\"},\n"
        "    {\"name\": \"io.systemd.CGroup.MemoryCurrent\", \"object\": \"system.slice\",\n"
        "     \"fields\": {\"controller\": \"memory\", \"cgroup-path\": \"/system.slice\", \"1st\": 1, \"vm\": \"evil\"},\n"
        "     \"value\": 48234496},\n"
        "    {\"name\": \"io.systemd.Login.Linger\", \"object\": \"root\", \"value\": true},\n"
        "    {\"name\": \"io.systemd.Journal.DiskUsage\", \"type\": \"counter\", \"value\": \"1048576\"},\n"
        "    {\"name\": \"io.systemd.Basic.LoadAverage\", \"fields\": {\"minutes\": 5}, \"value\": 0.25},\n"
        "    {\"name\": \"io.systemd.Basic.Architecture\", \"type\": \"string\", \"value\": \"x86-64\"},\n"
        "    {\"name\": \"io.systemd.Basic.MemoryMax\", \"object\": \"user.slice\", \"value\": 18446744073709551615}\n"
        "  ]\n"
        "}\n";

static void test_realistic_report(void **state) {
        _cleanup_(guest_report_freep) GuestReport *r = parse_ok(realistic, GUEST_SERIES_LIMIT_DEFAULT);
        const GuestSeries *s;

        assert_true(r->is_report);
        assert_int_equal(r->generated_at, (usec_t) 1789222668 * USEC_PER_SEC);
        assert_int_equal(r->n_entries, 12);
        assert_int_equal(r->n_families, 11);
        assert_int_equal(r->n_series, 12);
        for (GuestDropReason d = 0; d < _GUEST_DROP_MAX; d++)
                assert_int_equal(r->dropped[d], 0);

        /* report order */
        assert_string_equal(r->series[0].name, "vm_guest_io_systemd_manager_nrestarts_total");
        assert_string_equal(r->series[11].name, "vm_guest_io_systemd_basic_memory_max");

        s = find_series(r, "vm_guest_io_systemd_manager_nrestarts_total", "sshd.service");
        assert_int_equal(s->kind, GUEST_SERIES_COUNTER);
        assert_string_equal(s->family, "io.systemd.Manager.NRestarts");
        assert_true(s->value == 2);
        assert_labels(s, "object=\"sshd.service\"");
        s = find_series(r, "vm_guest_io_systemd_manager_nrestarts_total", "systemd-networkd.service");
        assert_true(s->value == 0);

        s = find_series(r, "vm_guest_io_systemd_manager_reload_count_total", "");
        assert_int_equal(s->kind, GUEST_SERIES_COUNTER);
        assert_true(s->value == 1);
        assert_labels(s, "object=\"\"");

        s = find_series(r, "vm_guest_io_systemd_manager_unit_active_state_info", "sshd.service");
        assert_int_equal(s->kind, GUEST_SERIES_INFO);
        assert_true(s->value == 1);
        assert_labels(s, "object=\"sshd.service\",value=\"active\"");

        s = find_series(r, "vm_guest_io_systemd_network_ipv4_address_state_info", "eth0");
        assert_labels(s, "object=\"eth0\",value=\"routable\"");

        s = find_series(r, "vm_guest_io_systemd_basic_kernel_version_info", "");
        assert_labels(s, "object=\"\",value=\"6.12.43+deb13-cloud-amd64\"");

        /* the fields in their order, sanitized */
        s = find_series(r, "vm_guest_io_systemd_cgroup_memory_current", "system.slice");
        assert_int_equal(s->kind, GUEST_SERIES_GAUGE);
        assert_true(s->value == 48234496);
        assert_labels(
                s,
                "object=\"system.slice\",controller=\"memory\",cgroup_path=\"/system.slice\",field_1st=\"1\","
                "field_vm=\"evil\"");

        s = find_series(r, "vm_guest_io_systemd_login_linger", "root");
        assert_int_equal(s->kind, GUEST_SERIES_GAUGE);
        assert_true(s->value == 1);

        s = find_series(r, "vm_guest_io_systemd_journal_disk_usage_total", "");
        assert_int_equal(s->kind, GUEST_SERIES_COUNTER);
        assert_true(s->value == 1048576);

        s = find_series(r, "vm_guest_io_systemd_basic_load_average", "");
        assert_true(s->value == 0.25);
        assert_labels(s, "object=\"\",minutes=\"5\"");

        s = find_series(r, "vm_guest_io_systemd_basic_architecture_info", "");
        assert_labels(s, "object=\"\",value=\"x86-64\"");

        /* beyond int64: still a number */
        s = find_series(r, "vm_guest_io_systemd_basic_memory_max", "user.slice");
        assert_true(s->value == 18446744073709551615.0);

        /* the first ten entries, as sent */
        assert_true(json_is_array(r->sample));
        assert_int_equal(json_array_size(r->sample), GUEST_SAMPLE_MAX);
        assert_string_equal(
                json_string_value(json_object_get(json_array_get(r->sample, 0), "object")), "sshd.service");
        /* (the upload has an integer beyond int64, so all its numbers were read as doubles) */
        assert_true(json_number_value(json_object_get(json_array_get(r->sample, 0), "value")) == 2);
        assert_string_equal(
                json_string_value(json_object_get(json_array_get(r->sample, 9), "name")),
                "io.systemd.Basic.LoadAverage");
}

static void test_kinds(void **state) {
        static const char json[] =
                "{\"metrics\": ["
                "{\"name\": \"a.Gauge\", \"type\": \"gauge\", \"value\": \"NaN\"},"
                "{\"name\": \"a.Gauge2\", \"type\": \"gauge\", \"value\": \"-1.5e3\"},"
                "{\"name\": \"a.Gauge3\", \"type\": \"gauge\", \"value\": false},"
                "{\"name\": \"a.Counter\", \"type\": \"counter\", \"value\": true},"
                "{\"name\": \"a.Str\", \"type\": \"string\", \"value\": 5},"
                "{\"name\": \"a.Str2\", \"type\": \"string\", \"value\": 2.5},"
                "{\"name\": \"a.Str3\", \"type\": \"string\", \"value\": true},"
                "{\"name\": \"a.NullType\", \"type\": null, \"value\": 7},"
                "{\"name\": \"io.systemd.Manager.NRestarts\", \"type\": \"gauge\", \"value\": 3},"
                "{\"name\": \"io.systemd.Manager.NRestarts\", \"object\": \"x\", \"value\": \"3\"},"
                "{\"name\": \"a.Inf\", \"type\": \"gauge\", \"value\": \"-Inf\"}"
                "]}";
        _cleanup_(guest_report_freep) GuestReport *r = parse_ok(json, 100);
        const GuestSeries *s;

        assert_int_equal(r->n_series, 11);
        assert_int_equal(r->dropped[GUEST_DROP_UNSUPPORTED], 0);

        s = find_series(r, "vm_guest_a_gauge", "");
        assert_true(isnan(s->value));
        assert_true(find_series(r, "vm_guest_a_gauge2", "")->value == -1500);
        assert_true(find_series(r, "vm_guest_a_gauge3", "")->value == 0);
        assert_true(find_series(r, "vm_guest_a_counter_total", "")->value == 1);
        assert_labels(find_series(r, "vm_guest_a_str_info", ""), "object=\"\",value=\"5\"");
        assert_labels(find_series(r, "vm_guest_a_str2_info", ""), "object=\"\",value=\"2.5\"");
        assert_labels(find_series(r, "vm_guest_a_str3_info", ""), "object=\"\",value=\"true\"");
        assert_int_equal(find_series(r, "vm_guest_a_null_type", "")->kind, GUEST_SERIES_GAUGE);
        /* a declared type wins over the built-in counters */
        s = find_series(r, "vm_guest_io_systemd_manager_nrestarts", "");
        assert_int_equal(s->kind, GUEST_SERIES_GAUGE);
        /* and a string value without a type is an info series, whatever the name */
        s = find_series(r, "vm_guest_io_systemd_manager_nrestarts_info", "x");
        assert_labels(s, "object=\"x\",value=\"3\"");
        assert_true(isinf(find_series(r, "vm_guest_a_inf", "")->value));
}

static void test_unsupported(void **state) {
        static const char json[] =
                "{\"metrics\": ["
                "{\"name\": \"a.Null\", \"value\": null},"
                "{\"name\": \"a.Array\", \"value\": [1]},"
                "{\"name\": \"a.Object\", \"value\": {\"x\": 1}},"
                "{\"name\": \"a.Missing\"},"
                "{\"value\": 1},"
                "{\"name\": 5, \"value\": 1},"
                "\"io.systemd.Manager.NRestarts\","
                "42,"
                "null,"
                "{\"name\": \"a.Histogram\", \"type\": \"histogram\", \"value\": 1},"
                "{\"name\": \"a.BadType\", \"type\": 1, \"value\": 1},"
                "{\"name\": \"a.NotNumber\", \"type\": \"counter\", \"value\": \"12 apples\"},"
                "{\"name\": \"a.Empty\", \"type\": \"gauge\", \"value\": \"\"},"
                "{\"name\": \"a.Space\", \"type\": \"gauge\", \"value\": \" 1\"},"
                "{\"name\": \"a.Overflow\", \"type\": \"gauge\", \"value\": \"1e999\"},"
                "{\"name\": \"a.StringNull\", \"type\": \"string\", \"value\": null},"
                "{\"name\": \"...\", \"value\": 1},"
                "{\"name\": \"\", \"value\": 1},"
                "{\"name\": \"a.Good\", \"value\": 1}"
                "]}";
        _cleanup_(guest_report_freep) GuestReport *r = parse_ok(json, 100);

        assert_true(r->is_report);
        assert_int_equal(r->n_entries, 19);
        assert_int_equal(r->n_series, 1);
        assert_string_equal(r->series[0].name, "vm_guest_a_good");
        assert_int_equal(r->dropped[GUEST_DROP_UNSUPPORTED], 18);
        assert_int_equal(r->dropped[GUEST_DROP_LIMIT], 0);
        assert_int_equal(r->dropped[GUEST_DROP_DUPLICATE], 0);
        /* every string name counts, the unsupported ones too */
        assert_int_equal(r->n_families, 14);
}

/* A report of n entries from format, which takes the entry's index modulo mod twice. */
static char *report_of(size_t n, size_t mod, const char *format) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        assert_non_null(f);
        fputs("{\"mediaType\":\"application/vnd.io.systemd.report\",\"metrics\":[", f);
        for (size_t i = 0; i < n; i++) {
                fputs(i > 0 ? ",\n" : "", f);
                fprintf(f, format, i % mod, i % mod);
        }
        fputs("]}", f);
        assert_int_equal(fclose(f), 0);
        return buf;
}

static void test_limit(void **state) {
        _cleanup_free_ char *json = report_of(
                10000, 10000, "{\"name\":\"io.systemd.Test.Value\",\"object\":\"o%zu\",\"value\":%zu}");
        _cleanup_(guest_report_freep) GuestReport *r = parse_ok(json, 1000);

        assert_int_equal(r->n_entries, 10000);
        assert_int_equal(r->n_families, 1);
        assert_int_equal(r->n_series, 1000);
        assert_int_equal(r->dropped[GUEST_DROP_LIMIT], 9000);
        assert_int_equal(r->dropped[GUEST_DROP_DUPLICATE], 0);
        assert_int_equal(r->dropped[GUEST_DROP_UNSUPPORTED], 0);
        /* the first thousand, in order */
        assert_string_equal(r->series[0].label_values[0], "o0");
        assert_string_equal(r->series[999].label_values[0], "o999");
        assert_true(r->series[999].value == 999);
        assert_int_equal(json_array_size(r->sample), 10);
}

static void test_duplicates_many(void **state) {
        /* 20000 entries, each label set twice: half are duplicates (found through the hash; a scan
         * of the exported series for each entry would be quadratic) */
        _cleanup_free_ char *json = report_of(
                20000,
                10000,
                "{\"name\":\"io.systemd.Test.Value\",\"object\":\"o%zu\",\"fields\":{\"i\":%zu},\"value\":1}");
        _cleanup_(guest_report_freep) GuestReport *r = parse_ok(json, 100000);

        assert_int_equal(r->n_entries, 20000);
        assert_int_equal(r->n_series, 10000);
        assert_int_equal(r->dropped[GUEST_DROP_DUPLICATE], 10000);
        assert_int_equal(r->dropped[GUEST_DROP_LIMIT], 0);
        assert_labels(r->series + 9999, "object=\"o9999\",i=\"9999\"");
}

static void test_accounting_order(void **state) {
        /* limit 3: unsupported wins over the limit, the limit over duplicates */
        static const char json[] =
                "{\"metrics\": ["
                "{\"name\": \"a.A\", \"value\": 1},"
                "{\"name\": \"a.A\", \"value\": 2},"                         /* duplicate: first wins */
                "{\"name\": \"a.A\", \"value\": null},"                      /* unsupported */
                "{\"name\": \"a.A\", \"object\": \"b\", \"value\": 3},"      /* other label value */
                "{\"name\": \"a.A\", \"fields\": {\"k\": 1}, \"value\": 1}," /* other label set */
                "{\"name\": \"a.D\", \"value\": 1},"                         /* limit */
                "{\"name\": \"a.E\", \"value\": [1]},"                       /* unsupported */
                "{\"name\": \"a.A\", \"value\": 1}" /* a duplicate, but the limit first */
                "]}";
        _cleanup_(guest_report_freep) GuestReport *r = parse_ok(json, 3);

        assert_int_equal(r->n_series, 3);
        assert_true(r->series[0].value == 1);
        assert_labels(r->series + 0, "object=\"\"");
        assert_labels(r->series + 1, "object=\"b\"");
        assert_labels(r->series + 2, "object=\"\",k=\"1\"");
        assert_int_equal(r->dropped[GUEST_DROP_DUPLICATE], 1);
        assert_int_equal(r->dropped[GUEST_DROP_UNSUPPORTED], 2);
        assert_int_equal(r->dropped[GUEST_DROP_LIMIT], 2);
        assert_int_equal(r->n_families, 3);
        assert_string_equal(guest_drop_reason_to_string(GUEST_DROP_LIMIT), "limit");
        assert_string_equal(guest_drop_reason_to_string(GUEST_DROP_UNSUPPORTED), "unsupported");
        assert_string_equal(guest_drop_reason_to_string(GUEST_DROP_DUPLICATE), "duplicate");
        assert_null(guest_drop_reason_to_string(_GUEST_DROP_MAX));
}

static void test_duplicate_label_sets(void **state) {
        static const char json[] =
                "{\"metrics\": ["
                "{\"name\": \"a.F\", \"fields\": {\"x\": \"1\", \"y\": \"2\"}, \"value\": 1},"
                "{\"name\": \"a.F\", \"fields\": {\"y\": \"2\", \"x\": \"1\"}, \"value\": 2}," /* same set */
                "{\"name\": \"a.F\", \"fields\": {\"x\": \"1\", \"y\": \"3\"}, \"value\": 3}," /* other value */
                "{\"name\": \"a.F\", \"fields\": {\"x\": 1, \"y\": \"3\"}, \"value\": 4}," /* 1 renders as "1" */
                "{\"name\": \"a.F\", \"fields\": {\"a-b\": \"p\", \"a_b\": \"q\"}, \"value\": 5}," /* collision */
                "{\"name\": \"a.F\", \"fields\": {\"a_b\": \"p\"}, \"value\": 6},"
                "{\"name\": \"a.S\", \"value\": \"on\"},"
                "{\"name\": \"a.S\", \"value\": \"off\"},"
                "{\"name\": \"a.S\", \"type\": \"string\", \"value\": \"on\"},"
                "{\"name\": \"a.S\", \"fields\": {\"value\": \"on\"}, \"value\": \"on\"},"
                "{\"name\": \"a.G\", \"fields\": null, \"value\": 1},"
                "{\"name\": \"a.G\", \"fields\": [1, 2], \"value\": 1},"
                "{\"name\": \"a.G\", \"object\": null, \"value\": 1},"
                "{\"name\": \"a.G\", \"object\": 1, \"value\": 1},"
                "{\"name\": \"a.G\", \"object\": \"1\", \"value\": 1}"
                "]}";
        _cleanup_(guest_report_freep) GuestReport *r = parse_ok(json, 100);

        assert_int_equal(r->n_series, 8);
        assert_int_equal(r->dropped[GUEST_DROP_DUPLICATE], 7);
        assert_labels(r->series + 0, "object=\"\",x=\"1\",y=\"2\"");
        assert_labels(r->series + 1, "object=\"\",x=\"1\",y=\"3\"");
        /* two keys that sanitize alike: the first is kept */
        assert_labels(r->series + 2, "object=\"\",a_b=\"p\"");
        assert_true(r->series[2].value == 5);
        assert_labels(r->series + 3, "object=\"\",value=\"on\"");
        assert_labels(r->series + 4, "object=\"\",value=\"off\"");
        assert_labels(r->series + 5, "object=\"\",field_value=\"on\",value=\"on\"");
        /* fields that are not an object are ignored; a null object is no object */
        assert_labels(r->series + 6, "object=\"\"");
        assert_labels(r->series + 7, "object=\"1\"");
}

static void test_truncated_labels_in_report(void **state) {
        _cleanup_free_ char *long_object = repeat("ü", 100), *json = NULL;
        _cleanup_(guest_report_freep) GuestReport *r = NULL;
        const GuestSeries *s;

        assert_true(
                asprintf(
                        &json,
                        "{\"metrics\":[{\"name\":\"a.B\",\"object\":\"%s\",\"fields\":{\"f\":\"%s\"},"
                        "\"value\":\"%s\"}]}",
                        long_object,
                        long_object,
                        long_object) > 0);
        r = parse_ok(json, 10);
        assert_int_equal(r->n_series, 1);
        s = r->series;
        assert_int_equal(s->n_labels, 3);
        for (size_t i = 0; i < s->n_labels; i++) {
                assert_int_equal(strlen(s->label_values[i]), 126 + 3);
                assert_true(utf8_valid(s->label_values[i]));
                assert_string_equal(s->label_values[i] + 126, ELLIPSIS);
        }
        assert_string_equal(s->label_names[2], "value");
}

static void test_errors(void **state) {
        _cleanup_(guest_report_freep) GuestReport *r = NULL;
        _cleanup_free_ char *big = NULL, *deep = NULL;
        size_t n = GUEST_REPORT_SIZE_MAX;

        /* size: one byte over is refused before parsing; exactly the maximum is parsed */
        big = malloc(n + 1);
        assert_non_null(big);
        memset(big, ' ', n + 1);
        big[0] = '[';
        big[n - 1] = ']';
        assert_errno(guest_report_parse(big, n + 1, 10, &r), -EMSGSIZE);
        assert_null(r);
        assert_ok(guest_report_parse(big, n, 10, &r));
        assert_false(r->is_report);
        r = guest_report_free(r);

        /* depth: 32 levels parse, 33 do not */
        deep = malloc(2 * 33 + 64);
        assert_non_null(deep);
        for (unsigned depth = 31; depth <= 34; depth++) {
                char *p = stpcpy(deep, "{\"metrics\":");
                for (unsigned i = 1; i < depth; i++)
                        *p++ = '[';
                for (unsigned i = 1; i < depth; i++)
                        *p++ = ']';
                *p++ = '}';
                *p = 0;
                if (depth <= GUEST_REPORT_DEPTH_MAX) {
                        assert_ok(guest_report_parse(deep, strlen(deep), 10, &r));
                        assert_true(r->is_report);
                        r = guest_report_free(r);
                } else
                        assert_errno(guest_report_parse(deep, strlen(deep), 10, &r), -ELOOP);
        }
        /* unbalanced input is counted the same way */
        memset(deep, '[', 33);
        assert_errno(guest_report_parse(deep, 33, 10, &r), -ELOOP);
        assert_errno(guest_report_parse(deep, 32, 10, &r), -EBADMSG);

        /* a flood of tiny values is refused before jansson allocates them; commas in strings do not count */
        {
                size_t nv = GUEST_REPORT_VALUES_MAX;
                _cleanup_free_ char *flood = malloc(3 * nv + 16), *fine = NULL;
                char *q = stpcpy(flood, "[");
                for (size_t i = 0; i < nv; i++)
                        q = stpcpy(q, i + 1 < nv ? "{}," : "{}");
                strcpy(q, "]");
                assert_errno(guest_report_parse(flood, strlen(flood), 10, &r), -E2BIG);
                assert_null(r);
                _cleanup_free_ char *commas = repeat(",", 2 * nv);
                assert_true(asprintf(&fine, "{\"metrics\":[],\"x\":\"%s\"}", commas) > 0);
                assert_ok(guest_report_parse(fine, strlen(fine), 10, &r));
                r = guest_report_free(r);
        }

        /* brackets in strings, escaped quotes included, do not count */
        _cleanup_free_ char *brackets = repeat("[{", 40), *in_string = NULL;
        assert_true(
                asprintf(&in_string, "{\"metrics\":[],\"x\":\"\\\"%s\\\\\",\"y\":\"%s\"}", brackets, brackets) >
                0);
        assert_ok(guest_report_parse(in_string, strlen(in_string), 10, &r));
        assert_true(r->is_report);
        r = guest_report_free(r);

        /* not JSON */
        assert_errno(guest_report_parse("", 0, 10, &r), -EBADMSG);
        assert_errno(guest_report_parse("garbage", 7, 10, &r), -EBADMSG);
        assert_errno(guest_report_parse("{\"metrics\":[", 12, 10, &r), -EBADMSG);
        assert_errno(guest_report_parse("{} {}", 5, 10, &r), -EBADMSG);
        assert_errno(guest_report_parse("{\"a\":\"\\u0000\"}", 14, 10, &r), -EBADMSG);
        assert_errno(guest_report_parse("\"\xff\"", 3, 10, &r), -EBADMSG);
        assert_null(r);

        /* JSON, but no report */
        assert_ok(guest_report_parse("[1,2]", 5, 10, &r));
        assert_false(r->is_report);
        assert_int_equal(r->n_series, 0);
        assert_int_equal(r->n_entries, 0);
        assert_null(r->sample);
        r = guest_report_free(r);
        static const char *const not_reports[] = {
                "42", "\"x\"", "null", "{}", "{\"metrics\":{}}", "{\"metrics\":null}", " {\"Metrics\":[]} ",
        };
        for (size_t i = 0; i < ELEMENTSOF(not_reports); i++) {
                assert_ok(guest_report_parse(not_reports[i], strlen(not_reports[i]), 10, &r));
                assert_false(r->is_report);
                r = guest_report_free(r);
        }

        /* an empty report */
        assert_ok(guest_report_parse("{\"metrics\":[]}", 14, 10, &r));
        assert_true(r->is_report);
        assert_int_equal(r->n_entries, 0);
        assert_true(json_is_null(r->sample));
        r = guest_report_free(r);

        /* bad arguments */
        assert_errno(guest_report_parse("{}", 2, 0, &r), -EINVAL);
        assert_errno(guest_report_parse(NULL, 2, 10, &r), -EINVAL);
}

static void assert_timestamp(const char *s, usec_t expected) {
        usec_t t = 12345;

        if (expected == USEC_INFINITY) {
                assert_true(guest_report_parse_timestamp(s, &t) < 0);
                assert_int_equal(t, 12345);
                return;
        }
        assert_ok(guest_report_parse_timestamp(s, &t));
        assert_int_equal(t, expected);
}

static void test_timestamp(void **state) {
        const usec_t t = (usec_t) 1789222668 * USEC_PER_SEC;

        assert_timestamp("Sat 2026-09-12 14:17:48 UTC", t);
        assert_timestamp("Thu 1970-01-01 00:00:01 UTC", USEC_PER_SEC);
        assert_timestamp("Tue 2028-02-29 09:05:00 UTC", (usec_t) 1835427900 * USEC_PER_SEC);
        /* what Go's time.Parse also takes: any weekday, in any case; runs of spaces; a one-digit
         * hour; a fraction; other zones, all at offset 0 */
        assert_timestamp("Mon 2026-09-12 14:17:48 UTC", t);
        assert_timestamp("sAT 2026-09-12 14:17:48 UTC", t);
        assert_timestamp("Sat  2026-09-12   14:17:48  UTC", t);
        assert_timestamp("Sat 2026-09-12 14:17:48.5 UTC", t + 500000);
        assert_timestamp("Sat 2026-09-12 14:17:48,000123999 UTC", t + 123);
        assert_timestamp("Sat 2026-09-12 14:17:48.1234567891234 UTC", t + 123456);
        assert_timestamp("Sat 2026-09-12 4:17:48 UTC", t - 10 * USEC_PER_HOUR);
        assert_timestamp("Sat 2026-09-12 14:17:48 CEST", t);
        assert_timestamp("Sat 2026-09-12 14:17:48 PST", t);
        assert_timestamp("Sat 2026-09-12 14:17:48 AKST", t);
        assert_timestamp("Sat 2026-09-12 14:17:48 WITA", t);
        assert_timestamp("Sat 2026-09-12 14:17:48 ChST", t);
        assert_timestamp("Sat 2026-09-12 14:17:48 GMT", t);
        assert_timestamp("Sat 2026-09-12 14:17:48 GMT+3", t);
        assert_timestamp("Sat 2026-09-12 14:17:48 -03", t);

        /* and what it does not */
        assert_timestamp("", USEC_INFINITY);
        assert_timestamp("2026-09-12 14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sa 2026-09-12 14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12T14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:17:48", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:17:48 ", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:17:48 utc", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:17:48 UTC extra", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:17:48 ABCD", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:17:48 GMT+24", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:17:48 +0530", USEC_INFINITY);
        assert_timestamp("Sat 2026-9-12 14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 26-09-12 14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:7:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-13-12 14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-31 14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-02-29 14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-00 14:17:48 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 24:00:00 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:60:00 UTC", USEC_INFINITY);
        assert_timestamp("Sat 2026-09-12 14:17:60 UTC", USEC_INFINITY);
        assert_timestamp("Sat 1969-12-31 23:59:59 UTC", USEC_INFINITY);

        /* in a report: absent, not a string or unparsable is 0 */
        static const char *const reports[] = {
                "{\"metrics\":[]}",
                "{\"timestamp\":1789222668,\"metrics\":[]}",
                "{\"timestamp\":\"2026-09-12T14:17:48Z\",\"metrics\":[]}",
        };
        for (size_t i = 0; i < ELEMENTSOF(reports); i++) {
                _cleanup_(guest_report_freep) GuestReport *r = parse_ok(reports[i], 10);
                assert_true(r->is_report);
                assert_int_equal(r->generated_at, 0);
        }
        _cleanup_(guest_report_freep) GuestReport *r = parse_ok(
                "{\"timestamp\":\"Sat 2026-09-12 14:17:48 UTC\",\"metrics\":[]}", 10);
        assert_int_equal(r->generated_at, t);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_metric_name),
                cmocka_unit_test(test_label_name),
                cmocka_unit_test(test_label_value),
                cmocka_unit_test(test_label_value_truncation),
                cmocka_unit_test(test_realistic_report),
                cmocka_unit_test(test_kinds),
                cmocka_unit_test(test_unsupported),
                cmocka_unit_test(test_limit),
                cmocka_unit_test(test_duplicates_many),
                cmocka_unit_test(test_accounting_order),
                cmocka_unit_test(test_duplicate_label_sets),
                cmocka_unit_test(test_truncated_labels_in_report),
                cmocka_unit_test(test_errors),
                cmocka_unit_test(test_timestamp),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
