/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include "macro.h"
#include "time-util.h"

static void test_rfc3339(void **state) {
        static const struct {
                usec_t t;
                const char *text;
        } cases[] = {
                { 0, "1970-01-01T00:00:00Z" },
                { 1764584430 * USEC_PER_SEC, "2025-12-01T10:20:30Z" },
                { 1764584430 * USEC_PER_SEC + 500000, "2025-12-01T10:20:30.5Z" },
                { 1764584430 * USEC_PER_SEC + 120, "2025-12-01T10:20:30.00012Z" },
                { 1764584430 * USEC_PER_SEC + 999999, "2025-12-01T10:20:30.999999Z" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char buf[RFC3339_MAX];
                usec_t t = 1;

                assert_string_equal(format_rfc3339(cases[i].t, buf), cases[i].text);
                assert_ok(parse_rfc3339(cases[i].text, &t));
                assert_int_equal(t, cases[i].t);
        }
}

static void test_parse_rfc3339(void **state) {
        usec_t t = 7;

        /* digits beyond the microsecond are dropped */
        assert_ok(parse_rfc3339("2025-12-01T10:20:30.1234567Z", &t));
        assert_int_equal(t, 1764584430 * USEC_PER_SEC + 123456);

        t = 7;
        assert_errno(parse_rfc3339(NULL, &t), -EINVAL);
        assert_errno(parse_rfc3339("", &t), -EINVAL);
        assert_errno(parse_rfc3339("2025-12-01T10:20:30", &t), -EINVAL);
        assert_errno(parse_rfc3339("2025-12-01T10:20:30+01:00", &t), -EINVAL);
        assert_errno(parse_rfc3339("2025-12-01 10:20:30Z", &t), -EINVAL);
        assert_errno(parse_rfc3339("2025-12-01T10:20:30Zjunk", &t), -EINVAL);
        assert_errno(parse_rfc3339("1969-12-31T23:59:59Z", &t), -EINVAL);
        assert_int_equal(t, 7);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rfc3339),
                cmocka_unit_test(test_parse_rfc3339),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
