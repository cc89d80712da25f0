/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "test-util.h"

#include "api-error.h"
#include "cleanup.h"

static void test_set(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        assert_false(api_error_is_set(&e));
        assert_errno(api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", "x"), -ENOENT);
        assert_true(api_error_is_set(&e));
        assert_errno(e.error, -ENOENT);
        assert_int_equal(e.code, API_ERROR_NOT_FOUND);
        assert_string_equal(e.message, "not found: vm \"x\"");
}

static void test_set_sentinels(void **state) {
        static const struct {
                ApiErrorCode code;
                const char *message;
        } cases[] = {
                { API_ERROR_NOT_FOUND, "not found: detail 7" },
                { API_ERROR_INVALID_REQUEST, "invalid request: detail 7" },
                { API_ERROR_CONFLICT, "conflict: detail 7" },
                { API_ERROR_UNSUPPORTED, "unsupported: detail 7" },
                { API_ERROR_TIMEOUT, "timeout: detail 7" },
                { API_ERROR_VM_FAILED, "vm failed: detail 7" },
                /* internal errors have no sentinel: the detail is the message */
                { API_ERROR_INTERNAL, "detail 7" },
        };
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                assert_errno(api_error_set(&e, -EIO, cases[i].code, "detail %d", 7), -EIO);
                assert_int_equal(e.code, cases[i].code);
                assert_string_equal(e.message, cases[i].message);
        }
}

static void test_set_replaces(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        /* A second error replaces the first one entirely, details included (and nothing leaks). */
        assert_errno(api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "image \"%s\"", "base"), -ENOENT);
        e.details = json_pack("{s:s}", "image", "base");
        assert_non_null(e.details);

        assert_errno(api_error_set(&e, -EEXIST, API_ERROR_CONFLICT, "vm \"%s\" exists", "a"), -EEXIST);
        assert_errno(e.error, -EEXIST);
        assert_int_equal(e.code, API_ERROR_CONFLICT);
        assert_string_equal(e.message, "conflict: vm \"a\" exists");
        assert_null(e.details);
}

static void test_set_null_reterr(void **state) {
        assert_errno(api_error_set(NULL, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", "x"), -ENOENT);
        assert_errno(api_error_set(NULL, -EINVAL, API_ERROR_INVALID_REQUEST, "bad"), -EINVAL);
        assert_errno(api_error_set(NULL, -ENOMEM, API_ERROR_INTERNAL, "oom"), -ENOMEM);
}

static void test_prefix(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        (void) api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", "x");
        assert_errno(api_error_prefix(&e, "starting %s", "x"), -ENOENT);
        assert_string_equal(e.message, "not found: starting x: vm \"x\"");
        assert_int_equal(e.code, API_ERROR_NOT_FOUND);
        assert_errno(e.error, -ENOENT);

        /* Each new context goes right after the sentinel, in front of the older ones. */
        assert_errno(api_error_prefix(&e, "request %d", 3), -ENOENT);
        assert_string_equal(e.message, "not found: request 3: starting x: vm \"x\"");
}

static void test_prefix_without_sentinel(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        (void) api_error_set(&e, -EIO, API_ERROR_INTERNAL, "disk gone");
        assert_errno(api_error_prefix(&e, "saving state"), -EIO);
        assert_string_equal(e.message, "saving state: disk gone");

        /* A message that does not start with its code's sentinel just gets the context in front. */
        (void) api_error_set(&e, -EBUSY, API_ERROR_CONFLICT, "busy");
        free(e.message);
        e.message = strdup("not the sentinel");
        assert_non_null(e.message);
        assert_errno(api_error_prefix(&e, "ctx"), -EBUSY);
        assert_string_equal(e.message, "ctx: not the sentinel");
}

static void test_prefix_unset(void **state) {
        ApiError e = API_ERROR_NULL;

        /* With nothing to wrap there is nothing to prefix. */
        assert_int_equal(api_error_prefix(&e, "ctx"), 0);
        assert_false(api_error_is_set(&e));
        assert_null(e.message);
        assert_int_equal(api_error_prefix(NULL, "ctx"), 0);
}

static void test_to_json(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(json_decrefp) json_t *j = NULL;
        _cleanup_free_ char *s = NULL;
        json_t *err;

        (void) api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", "x");
        j = api_error_to_json(&e);
        assert_non_null(j);

        /* Exactly {"error":{"code":…,"message":…}}, nothing else. */
        assert_int_equal(json_object_size(j), 1);
        err = json_object_get(j, "error");
        assert_true(json_is_object(err));
        assert_int_equal(json_object_size(err), 2);
        assert_string_equal(json_string_value(json_object_get(err, "code")), "not_found");
        assert_string_equal(json_string_value(json_object_get(err, "message")), "not found: vm \"x\"");

        s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
        assert_non_null(s);
        assert_string_equal(s, "{\"error\":{\"code\":\"not_found\",\"message\":\"not found: vm \\\"x\\\"\"}}");
}

static void test_to_json_unset(void **state) {
        ApiError e = API_ERROR_NULL;
        _cleanup_(json_decrefp) json_t *j = api_error_to_json(&e);
        _cleanup_free_ char *s = NULL;

        /* Even an error nobody filled in renders as a well-formed internal error. */
        assert_non_null(j);
        s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
        assert_non_null(s);
        assert_string_equal(s, "{\"error\":{\"code\":\"internal_error\",\"message\":\"internal error\"}}");
}

static void test_code_strings(void **state) {
        static const char *const names[_API_ERROR_CODE_MAX] = {
                [API_ERROR_INTERNAL] = "internal_error",
                [API_ERROR_NOT_FOUND] = "not_found",
                [API_ERROR_INVALID_REQUEST] = "invalid_request",
                [API_ERROR_CONFLICT] = "conflict",
                [API_ERROR_UNSUPPORTED] = "unsupported",
                [API_ERROR_TIMEOUT] = "timeout",
                [API_ERROR_VM_FAILED] = "vm_failed",
                [API_ERROR_UNAUTHORIZED] = "unauthorized",
        };

        for (int c = 0; c < _API_ERROR_CODE_MAX; c++) {
                assert_non_null(names[c]);
                assert_string_equal(api_error_code_to_string((ApiErrorCode) c), names[c]);
                assert_int_equal(api_error_code_from_string(names[c]), c);
        }

        assert_null(api_error_code_to_string(_API_ERROR_CODE_MAX));
        assert_null(api_error_code_to_string(_API_ERROR_CODE_INVALID));
        assert_int_equal(api_error_code_from_string("bogus"), _API_ERROR_CODE_INVALID);
        assert_int_equal(api_error_code_from_string(""), _API_ERROR_CODE_INVALID);
        assert_int_equal(api_error_code_from_string("NOT_FOUND"), _API_ERROR_CODE_INVALID);
        assert_int_equal(api_error_code_from_string("not found"), _API_ERROR_CODE_INVALID);
        assert_int_equal(api_error_code_from_string(NULL), _API_ERROR_CODE_INVALID);
}

static void test_from_errno(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        api_error_from_errno(&e, -EACCES, "opening disk");
        assert_true(api_error_is_set(&e));
        assert_errno(e.error, -EACCES);
        assert_int_equal(e.code, API_ERROR_INTERNAL);
        assert_string_equal(e.message, "opening disk: Permission denied");

        /* Something more specific that is already there wins. */
        (void) api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "disk");
        api_error_from_errno(&e, -EIO, "reading");
        assert_errno(e.error, -ENOENT);
        assert_string_equal(e.message, "not found: disk");

        api_error_from_errno(NULL, -EIO, "nothing to fill");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                /* api_error_set() */
                cmocka_unit_test(test_set),
                cmocka_unit_test(test_set_sentinels),
                cmocka_unit_test(test_set_replaces),
                cmocka_unit_test(test_set_null_reterr),
                /* api_error_prefix() */
                cmocka_unit_test(test_prefix),
                cmocka_unit_test(test_prefix_without_sentinel),
                cmocka_unit_test(test_prefix_unset),
                /* rendering */
                cmocka_unit_test(test_to_json),
                cmocka_unit_test(test_to_json_unset),
                cmocka_unit_test(test_code_strings),
                cmocka_unit_test(test_from_errno),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
