/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdbool.h>
#include <stdlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "json-util.h"

#define _cleanup_json_ _cleanup_(json_decrefp)

/* The request every dispatch test decodes. */
typedef struct Req {
        char *name;
        uint64_t memory;
        uint32_t cpus;
        int64_t offset;
        bool autostart;
        char **tags;
        json_t *meta;
        json_t *extra;
} Req;

static void req_done(Req *r) {
        free(r->name);
        strv_free(r->tags);
        json_decref(r->meta);
        json_decref(r->extra);
        *r = (Req){};
}

static const JsonDispatch req_table[] = {
        { "name", json_dispatch_string, offsetof(Req, name), JSON_MANDATORY },
        { "memory", json_dispatch_uint64, offsetof(Req, memory), 0 },
        { "cpus", json_dispatch_uint32, offsetof(Req, cpus), JSON_NULLABLE },
        { "offset", json_dispatch_int64, offsetof(Req, offset), 0 },
        { "autostart", json_dispatch_bool, offsetof(Req, autostart), JSON_NULLABLE },
        { "tags", json_dispatch_strv, offsetof(Req, tags), 0 },
        { "meta", json_dispatch_object, offsetof(Req, meta), 0 },
        { "extra", json_dispatch_variant, offsetof(Req, extra), 0 },
        {},
};

/* Parses text as a request body and dispatches it into req, the way a handler does. */
static int dispatch_text(const char *text, Req *req, ApiError *e) {
        _cleanup_json_ json_t *v = NULL;
        int r;

        r = json_parse_body(text, strlen(text), &v, e);
        if (r < 0)
                return r;
        return json_dispatch(v, req_table, req, e);
}

/* Checks that e holds an invalid_request error with exactly this errno and message. */
static void check_invalid_request(const ApiError *e, int r, int error, const char *message) {
        assert_errno(r, error);
        assert_true(api_error_is_set(e));
        assert_errno(e->error, error);
        assert_int_equal(e->code, API_ERROR_INVALID_REQUEST);
        assert_string_equal(e->message, message);
}

static void test_dumps_pretty(void **state) {
        _cleanup_json_ json_t *v = json_object();
        _cleanup_free_ char *s = NULL;
        size_t size = 0;

        /* Keys deliberately not in alphabetical order. */
        assert_ok(json_object_set_new(v, "name", json_string("vm-1")));
        assert_ok(json_object_set_new(v, "cpus", json_integer(2)));
        assert_ok(json_object_set_new(v, "disks", json_pack("[s,s]", "a.qcow2", "b.raw")));
        assert_ok(json_object_set_new(v, "net", json_pack("{s:b,s:n}", "enabled", true, "mac", NULL)));
        assert_ok(json_object_set_new(v, "empty", json_object()));
        assert_ok(json_object_set_new(v, "author", json_string("Ren\xc3\xa9")));

        s = json_dumps_pretty(v, &size);
        assert_non_null(s);
        assert_string_equal(
                s,
                "{\n"
                "  \"name\": \"vm-1\",\n"
                "  \"cpus\": 2,\n"
                "  \"disks\": [\n"
                "    \"a.qcow2\",\n"
                "    \"b.raw\"\n"
                "  ],\n"
                "  \"net\": {\n"
                "    \"enabled\": true,\n"
                "    \"mac\": null\n"
                "  },\n"
                "  \"empty\": {},\n"
                "  \"author\": \"Ren\xc3\xa9\"\n"
                "}\n");
        assert_int_equal(size, strlen(s));
}

static void test_dumps_pretty_scalars(void **state) {
        static const struct {
                const char *json;
                const char *expected;
        } cases[] = {
                { "42", "42\n" }, { "\"x\"", "\"x\"\n" }, { "null", "null\n" },     { "true", "true\n" },
                { "[]", "[]\n" }, { "{}", "{}\n" },       { "[1]", "[\n  1\n]\n" }, { "-1.5", "-1.5\n" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_json_ json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
                _cleanup_free_ char *s = NULL;
                size_t size = 0;

                assert_non_null(v);
                s = json_dumps_pretty(v, &size);
                assert_non_null(s);
                assert_string_equal(s, cases[i].expected);
                assert_int_equal(size, strlen(cases[i].expected));

                /* ret_size is optional. */
                _cleanup_free_ char *t = json_dumps_pretty(v, NULL);
                assert_non_null(t);
                assert_string_equal(t, s);
        }
}

/* The estimate is near the compact rendering, counts escapes, and stops at max. */
static void test_dumps_estimate(void **state) {
        static const char *const docs[] = {
                "{}",
                "[]",
                "\"x\"",
                "null",
                "[1, 2.5, true, false, null]",
                "{\"id\": \"vm-1\", \"tags\": [\"a\", \"b\"], \"spec\": {\"cpus\": 2}}",
        };
        _cleanup_json_ json_t *big = json_array(), *binary = NULL;
        _cleanup_free_ char *raw = malloc(100000);

        assert_int_equal(json_dumps_estimate(NULL, 100), 0);
        for (size_t i = 0; i < ELEMENTSOF(docs); i++) {
                _cleanup_json_ json_t *v = json_loads(docs[i], JSON_DECODE_ANY, NULL);
                _cleanup_free_ char *s = NULL;
                size_t est;

                assert_non_null(v);
                s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
                assert_non_null(s);
                est = json_dumps_estimate(v, SIZE_MAX);
                assert_true(est >= strlen(s) / 2 && est <= strlen(s) * 3);
                assert_int_equal(json_dumps_estimate(v, 1), 1);
        }

        /* control characters: six bytes each, as jansson's worst escape */
        assert_non_null(raw);
        memset(raw, 1, 100000);
        binary = json_stringn(raw, 100000);
        assert_non_null(binary);
        assert_true(json_dumps_estimate(binary, SIZE_MAX) >= 600000);
        assert_int_equal(json_dumps_estimate(binary, 65536), 65536);

        /* a million small values: the walk stops at max */
        for (int i = 0; i < 1000000; i++)
                assert_ok(json_array_append_new(big, json_integer(i)));
        assert_true(json_dumps_estimate(big, SIZE_MAX) >= 1000000);
        assert_int_equal(json_dumps_estimate(big, 65536), 65536);
}

static void test_parse_body(void **state) {
        static const char body[] = "  {\"name\": \"vm-1\", \"tags\": [\"a\"]}\n";
        _cleanup_json_ json_t *v = NULL, *w = NULL;
        ApiError e = API_ERROR_NULL;

        assert_ok(json_parse_body(body, strlen(body), &v, &e));
        assert_false(api_error_is_set(&e));
        assert_true(json_is_object(v));
        assert_string_equal(json_string_value(json_object_get(v, "name")), "vm-1");

        /* A body is bytes with a length, not a C string: nothing past size is read. */
        static const char unterminated[] = { '[', '1', ']' };
        assert_ok(json_parse_body(unterminated, sizeof(unterminated), &w, &e));
        assert_int_equal(json_array_size(w), 1);
        api_error_done(&e);
}

static void test_parse_body_empty(void **state) {
        ApiError e = API_ERROR_NULL;
        json_t *v = NULL;

        check_invalid_request(
                &e, json_parse_body("", 0, &v, &e), -EINVAL, "invalid request: body: empty, expected JSON");
        assert_null(v);
        check_invalid_request(
                &e, json_parse_body(NULL, 0, &v, &e), -EINVAL, "invalid request: body: empty, expected JSON");
        assert_null(v);
        api_error_done(&e);

        /* Whitespace alone is not empty, but it is not JSON either. */
        assert_errno(json_parse_body("  \n", 3, &v, &e), -EBADMSG);
        assert_startswith(e.message, "invalid request: body: malformed JSON at line ");
        assert_null(v);
        api_error_done(&e);
}

static void test_parse_body_malformed(void **state) {
        static const char one_line[] = "{\"a\": }";
        static const char three_lines[] = "{\n  \"a\": 1,\n  \"b\": x\n}";
        ApiError e = API_ERROR_NULL;
        json_t *v = NULL;

        assert_errno(json_parse_body(one_line, strlen(one_line), &v, &e), -EBADMSG);
        assert_null(v);
        assert_int_equal(e.code, API_ERROR_INVALID_REQUEST);
        assert_errno(e.error, -EBADMSG);
        assert_startswith(e.message, "invalid request: body: malformed JSON at line 1, column 7: ");

        /* The position is where the problem is, so a user can find it in a multi-line body. */
        assert_errno(json_parse_body(three_lines, strlen(three_lines), &v, &e), -EBADMSG);
        assert_null(v);
        assert_startswith(e.message, "invalid request: body: malformed JSON at line 3, column 8: ");
        assert_contains(e.message, "'x'");

        /* Without reterr the caller still gets the error. */
        assert_errno(json_parse_body(one_line, strlen(one_line), &v, NULL), -EBADMSG);
        assert_null(v);
        api_error_done(&e);
}

static void test_parse_body_trailing_junk(void **state) {
        static const char *const bodies[] = { "{} x", "{}{}", "1 2", "[1]]", "{\"a\":1},", "null null" };
        ApiError e = API_ERROR_NULL;

        for (size_t i = 0; i < ELEMENTSOF(bodies); i++) {
                json_t *v = NULL;

                assert_errno(json_parse_body(bodies[i], strlen(bodies[i]), &v, &e), -EBADMSG);
                assert_null(v);
                assert_int_equal(e.code, API_ERROR_INVALID_REQUEST);
                assert_startswith(e.message, "invalid request: body: malformed JSON at line 1, column ");
        }

        /* A NUL byte after the value is junk too (it would hide anything after it from C string code). */
        json_t *v = NULL;
        assert_errno(json_parse_body("{}\0", 3, &v, &e), -EBADMSG);
        assert_null(v);
        api_error_done(&e);
}

static void test_parse_body_duplicate_keys(void **state) {
        static const char body[] = "{\"name\": \"a\", \"name\": \"b\"}";
        ApiError e = API_ERROR_NULL;
        json_t *v = NULL;

        assert_errno(json_parse_body(body, strlen(body), &v, &e), -EBADMSG);
        assert_null(v);
        assert_int_equal(e.code, API_ERROR_INVALID_REQUEST);
        assert_startswith(e.message, "invalid request: body: malformed JSON at line 1, column ");
        assert_contains(e.message, "duplicate");
        assert_contains(e.message, "name");
        api_error_done(&e);
}

static void test_dispatch(void **state) {
        _cleanup_(req_done) Req req = {};
        ApiError e = API_ERROR_NULL;

        assert_ok(dispatch_text(
                "{\"name\": \"vm-1\", \"memory\": 8589934592, \"cpus\": 4, \"offset\": -3, \"autostart\": true,"
                " \"tags\": [\"web\", \"prod\"], \"meta\": {\"k\": \"v\"}, \"extra\": [1, 2]}",
                &req,
                &e));
        assert_false(api_error_is_set(&e));
        assert_string_equal(req.name, "vm-1");
        assert_true(req.memory == UINT64_C(8589934592));
        assert_int_equal(req.cpus, 4);
        assert_true(req.offset == -3);
        assert_true(req.autostart);
        assert_non_null(req.tags);
        assert_string_equal(req.tags[0], "web");
        assert_string_equal(req.tags[1], "prod");
        assert_null(req.tags[2]);
        assert_string_equal(json_string_value(json_object_get(req.meta, "k")), "v");
        assert_int_equal(json_array_size(req.extra), 2);

        /* Keys left out keep their defaults; an empty array is an empty list, not NULL. */
        _cleanup_(req_done) Req minimal = { .memory = 1024, .cpus = 1 };
        assert_ok(dispatch_text("{\"name\": \"m\", \"tags\": []}", &minimal, &e));
        assert_string_equal(minimal.name, "m");
        assert_int_equal(minimal.memory, 1024);
        assert_int_equal(minimal.cpus, 1);
        assert_non_null(minimal.tags);
        assert_null(minimal.tags[0]);
        assert_null(minimal.meta);
}

static void test_dispatch_keeps_values_alive(void **state) {
        _cleanup_(req_done) Req req = {};
        ApiError e = API_ERROR_NULL;
        json_t *v = NULL;

        assert_ok(json_parse_body(
                "{\"name\": \"n\", \"meta\": {\"k\": 1}, \"extra\": \"s\"}",
                strlen("{\"name\": \"n\", \"meta\": {\"k\": 1}, \"extra\": \"s\"}"),
                &v,
                &e));
        assert_ok(json_dispatch(v, req_table, &req, &e));
        json_decref(v);

        /* Copied strings and referenced values outlive the parsed body (ASan would flag a use after
         * free here). */
        assert_string_equal(req.name, "n");
        assert_int_equal(json_integer_value(json_object_get(req.meta, "k")), 1);
        assert_string_equal(json_string_value(req.extra), "s");
}

static void test_dispatch_replaces_values(void **state) {
        _cleanup_(req_done) Req req = {};
        ApiError e = API_ERROR_NULL;

        /* Decoding into a struct that already owns values replaces them without leaking the old ones
         * (the run has detect_leaks=1). */
        req.name = strdup("old");
        req.tags = calloc(2, sizeof(char *));
        assert_non_null(req.name);
        assert_non_null(req.tags);
        req.tags[0] = strdup("old-tag");
        req.meta = json_object();
        req.extra = json_true();

        assert_ok(dispatch_text(
                "{\"name\": \"new\", \"tags\": [\"t\"], \"meta\": {}, \"extra\": null}", &req, &e));
        assert_string_equal(req.name, "new");
        assert_string_equal(req.tags[0], "t");
        assert_null(req.tags[1]);
        assert_true(json_is_object(req.meta));
        assert_true(json_is_null(req.extra));
}

static void test_dispatch_not_object(void **state) {
        _cleanup_(req_done) Req req = {};
        ApiError e = API_ERROR_NULL;

        check_invalid_request(
                &e,
                dispatch_text("[1, 2]", &req, &e),
                -EINVAL,
                "invalid request: expected a JSON object, got array");
        check_invalid_request(
                &e,
                dispatch_text("\"x\"", &req, &e),
                -EINVAL,
                "invalid request: expected a JSON object, got string");
        check_invalid_request(
                &e,
                json_dispatch(NULL, req_table, &req, &e),
                -EINVAL,
                "invalid request: expected a JSON object, got nothing");
        api_error_done(&e);
}

static void test_dispatch_unknown_field(void **state) {
        _cleanup_(req_done) Req req = {};
        ApiError e = API_ERROR_NULL;

        check_invalid_request(
                &e,
                dispatch_text("{\"name\": \"vm\", \"memroy\": 1}", &req, &e),
                -EINVAL,
                "invalid request: unknown field \"memroy\"");
        /* Field names match exactly. */
        check_invalid_request(
                &e,
                dispatch_text("{\"Name\": \"vm\"}", &req, &e),
                -EINVAL,
                "invalid request: unknown field \"Name\"");
        api_error_done(&e);
}

static void test_dispatch_wrong_type(void **state) {
        static const struct {
                const char *body;
                const char *message;
        } cases[] = {
                { "{\"name\": 5}", "invalid request: field \"name\": expected a string, got integer" },
                { "{\"name\": \"n\", \"memory\": \"8G\"}",
                  "invalid request: field \"memory\": expected a non-negative integer, got string" },
                { "{\"name\": \"n\", \"memory\": 1.5}",
                  "invalid request: field \"memory\": expected a non-negative integer, got number" },
                { "{\"name\": \"n\", \"cpus\": true}",
                  "invalid request: field \"cpus\": expected a non-negative integer, got boolean" },
                { "{\"name\": \"n\", \"offset\": []}",
                  "invalid request: field \"offset\": expected an integer, got array" },
                { "{\"name\": \"n\", \"autostart\": \"yes\"}",
                  "invalid request: field \"autostart\": expected a boolean, got string" },
                { "{\"name\": \"n\", \"autostart\": 1}",
                  "invalid request: field \"autostart\": expected a boolean, got integer" },
                { "{\"name\": \"n\", \"tags\": \"web\"}",
                  "invalid request: field \"tags\": expected an array of strings, got string" },
                { "{\"name\": \"n\", \"meta\": [1]}",
                  "invalid request: field \"meta\": expected an object, got array" },
                /* null is a type error unless the row is JSON_NULLABLE */
                { "{\"name\": null}", "invalid request: field \"name\": expected a string, got null" },
                { "{\"name\": \"n\", \"memory\": null}",
                  "invalid request: field \"memory\": expected a non-negative integer, got null" },
        };
        ApiError e = API_ERROR_NULL;

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(req_done) Req req = {};

                check_invalid_request(&e, dispatch_text(cases[i].body, &req, &e), -EINVAL, cases[i].message);
        }
        api_error_done(&e);
}

static void test_dispatch_mandatory(void **state) {
        _cleanup_(req_done) Req req = {};
        ApiError e = API_ERROR_NULL;

        check_invalid_request(
                &e, dispatch_text("{}", &req, &e), -EINVAL, "invalid request: field \"name\" is required");
        check_invalid_request(
                &e,
                dispatch_text("{\"memory\": 1}", &req, &e),
                -EINVAL,
                "invalid request: field \"name\" is required");
        api_error_done(&e);
}

static void test_dispatch_nullable(void **state) {
        _cleanup_(req_done) Req req = { .cpus = 2, .autostart = true };
        ApiError e = API_ERROR_NULL;

        assert_ok(dispatch_text("{\"name\": \"n\", \"cpus\": null, \"autostart\": null}", &req, &e));
        assert_false(api_error_is_set(&e));
        assert_int_equal(req.cpus, 2);
        assert_true(req.autostart);

        assert_ok(dispatch_text("{\"name\": \"n\", \"cpus\": 8, \"autostart\": false}", &req, &e));
        assert_int_equal(req.cpus, 8);
        assert_false(req.autostart);
}

static void test_dispatch_strv_element(void **state) {
        ApiError e = API_ERROR_NULL;

        {
                _cleanup_(req_done) Req req = {};

                /* The partly built list is freed (the run has detect_leaks=1) and the old value kept. */
                check_invalid_request(
                        &e,
                        dispatch_text("{\"name\": \"n\", \"tags\": [\"a\", \"b\", 3, \"d\"]}", &req, &e),
                        -EINVAL,
                        "invalid request: field \"tags\"[2]: expected a string, got integer");
                assert_null(req.tags);
        }
        {
                _cleanup_(req_done) Req req = {};

                check_invalid_request(
                        &e,
                        dispatch_text("{\"name\": \"n\", \"tags\": [null]}", &req, &e),
                        -EINVAL,
                        "invalid request: field \"tags\"[0]: expected a string, got null");
                check_invalid_request(
                        &e,
                        dispatch_text("{\"name\": \"n\", \"tags\": [\"ok\", \"a\\u0000b\"]}", &req, &e),
                        -EINVAL,
                        "invalid request: field \"tags\"[1]: contains a NUL character");
        }
        api_error_done(&e);
}

static void test_dispatch_string_nul(void **state) {
        _cleanup_(req_done) Req req = {};
        ApiError e = API_ERROR_NULL;

        /* "a\u0000b" would silently become "a" as a C string. */
        check_invalid_request(
                &e,
                dispatch_text("{\"name\": \"a\\u0000b\"}", &req, &e),
                -EINVAL,
                "invalid request: field \"name\": contains a NUL character");
        assert_null(req.name);
        api_error_done(&e);
}

static void test_string_cstr(void **state) {
        json_auto_t *plain = json_string("get_info"), *empty = json_string("");
        json_auto_t *nul = json_stringn("get_info\0junk", 13), *only_nul = json_stringn("\0", 1);
        json_auto_t *number = json_integer(1), *parsed = NULL;
        ApiError e = API_ERROR_NULL;

        assert_string_equal(json_string_cstr(plain), "get_info");
        assert_string_equal(json_string_cstr(empty), "");
        /* a string with a NUL inside is not its C prefix */
        assert_null(json_string_cstr(nul));
        assert_null(json_string_cstr(only_nul));
        assert_null(json_string_cstr(number));
        assert_null(json_string_cstr(NULL));

        /* bodies keep such strings whole (JSON_ALLOW_NUL): the helper is what tells them apart */
        assert_ok(json_parse_body("{\"name\":\"get_info\\u0000junk\"}", 29, &parsed, &e));
        assert_int_equal(json_string_length(json_object_get(parsed, "name")), 13);
        assert_null(json_string_cstr(json_object_get(parsed, "name")));
}

static void test_dispatch_integer_ranges(void **state) {
        ApiError e = API_ERROR_NULL;
        _cleanup_(req_done) Req req = { .memory = 7, .cpus = 7 };

        check_invalid_request(
                &e,
                dispatch_text("{\"name\": \"n\", \"memory\": -1}", &req, &e),
                -ERANGE,
                "invalid request: field \"memory\": -1 is negative");
        assert_int_equal(req.memory, 7);
        check_invalid_request(
                &e,
                dispatch_text("{\"name\": \"n\", \"cpus\": -5}", &req, &e),
                -ERANGE,
                "invalid request: field \"cpus\": -5 is negative");
        check_invalid_request(
                &e,
                dispatch_text("{\"name\": \"n\", \"cpus\": 4294967296}", &req, &e),
                -ERANGE,
                "invalid request: field \"cpus\": 4294967296 is too large");
        assert_int_equal(req.cpus, 7);
        api_error_done(&e);

        /* The edges themselves are accepted. */
        assert_ok(dispatch_text(
                "{\"name\": \"n\", \"memory\": 9223372036854775807, \"cpus\": 4294967295, \"offset\": -9223372036854775808}",
                &req,
                &e));
        assert_true(req.memory == (uint64_t) INT64_MAX);
        assert_int_equal(req.cpus, UINT32_MAX);
        assert_true(req.offset == INT64_MIN);
        assert_ok(dispatch_text("{\"name\": \"n\", \"memory\": 0, \"cpus\": 0}", &req, &e));
        assert_int_equal(req.memory, 0);
        assert_int_equal(req.cpus, 0);
        assert_false(api_error_is_set(&e));
}

static void test_dispatch_null_reterr(void **state) {
        _cleanup_(req_done) Req req = {};

        assert_errno(dispatch_text("{\"bogus\": 1}", &req, NULL), -EINVAL);
        assert_errno(dispatch_text("{\"name\": \"n\", \"memory\": -1}", &req, NULL), -ERANGE);
        assert_errno(dispatch_text("{}", &req, NULL), -EINVAL);
}

static void test_type_name(void **state) {
        static const struct {
                const char *json;
                const char *name;
        } cases[] = {
                { "{}", "object" },  { "[]", "array" },     { "\"\"", "string" },   { "1", "integer" },
                { "1.0", "number" }, { "true", "boolean" }, { "false", "boolean" }, { "null", "null" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_json_ json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);

                assert_non_null(v);
                assert_string_equal(json_type_name(v), cases[i].name);
        }
}

static void test_string_lossy(void **state) {
        json_auto_t *ok = json_string_lossy("gr\xc3\xbc\xc3\x9f"), *bad = json_string_lossy("a\xff\xc3z");
        json_auto_t *nul = json_stringn_lossy("a\0\xfe", 3);

        assert_string_equal(json_string_value(ok), "gr\xc3\xbc\xc3\x9f"); /* valid UTF-8 kept */
        assert_string_equal(json_string_value(bad), "a??z");
        assert_int_equal(json_string_length(nul), 3);
        assert_memory_equal(json_string_value(nul), "a\0?", 3);
        assert_null(json_string_lossy(NULL));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_dumps_pretty),
                cmocka_unit_test(test_dumps_pretty_scalars),
                cmocka_unit_test(test_dumps_estimate),
                cmocka_unit_test(test_parse_body),
                cmocka_unit_test(test_parse_body_empty),
                cmocka_unit_test(test_parse_body_malformed),
                cmocka_unit_test(test_parse_body_trailing_junk),
                cmocka_unit_test(test_parse_body_duplicate_keys),
                cmocka_unit_test(test_dispatch),
                cmocka_unit_test(test_dispatch_keeps_values_alive),
                cmocka_unit_test(test_dispatch_replaces_values),
                cmocka_unit_test(test_dispatch_not_object),
                cmocka_unit_test(test_dispatch_unknown_field),
                cmocka_unit_test(test_dispatch_wrong_type),
                cmocka_unit_test(test_dispatch_mandatory),
                cmocka_unit_test(test_dispatch_nullable),
                cmocka_unit_test(test_dispatch_strv_element),
                cmocka_unit_test(test_dispatch_string_nul),
                cmocka_unit_test(test_string_cstr),
                cmocka_unit_test(test_dispatch_integer_ranges),
                cmocka_unit_test(test_dispatch_null_reterr),
                cmocka_unit_test(test_type_name),
                cmocka_unit_test(test_string_lossy),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
