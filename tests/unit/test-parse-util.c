/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <inttypes.h>
#include <stdio.h>

#include "test-util.h"

#include "macro.h"
#include "parse-util.h"

/* A value the parsers must leave alone when they fail ("ret is set only on success"). */
#define UNTOUCHED 0x5a5a5a5aU

static void test_safe_atou64(void **state) {
        uint64_t v;

        assert_ok(safe_atou64("0", &v));
        assert_int_equal(v, 0);
        assert_ok(safe_atou64("42", &v));
        assert_int_equal(v, 42);
        assert_ok(safe_atou64("007", &v));
        assert_int_equal(v, 7);
        assert_ok(safe_atou64("18446744073709551615", &v));
        assert_true(v == UINT64_MAX);
        assert_ok(safe_atou64("1", NULL));

        static const char *const invalid[] = {
                "", "-1", "-0", "+1", " 1", "1 ", "1\n", "0x10", "1e3", "12a", "1.0", "--1",
        };
        for (size_t i = 0; i < ELEMENTSOF(invalid); i++) {
                v = UNTOUCHED;
                assert_errno(safe_atou64(invalid[i], &v), -EINVAL);
                assert_int_equal(v, UNTOUCHED);
        }

        v = UNTOUCHED;
        assert_errno(safe_atou64("18446744073709551616", &v), -ERANGE);
        assert_errno(safe_atou64("99999999999999999999999", &v), -ERANGE);
        assert_int_equal(v, UNTOUCHED);
        assert_errno(safe_atou64(NULL, &v), -EINVAL);
}

static void test_safe_atou32(void **state) {
        uint32_t v;

        assert_ok(safe_atou32("0", &v));
        assert_int_equal(v, 0);
        assert_ok(safe_atou32("4294967295", &v));
        assert_int_equal(v, UINT32_MAX);

        v = UNTOUCHED;
        assert_errno(safe_atou32("4294967296", &v), -ERANGE);
        assert_errno(safe_atou32("18446744073709551616", &v), -ERANGE);
        assert_errno(safe_atou32("-1", &v), -EINVAL);
        assert_errno(safe_atou32("1k", &v), -EINVAL);
        assert_errno(safe_atou32("", &v), -EINVAL);
        assert_int_equal(v, UNTOUCHED);
}

static void test_safe_atou16(void **state) {
        uint16_t v;

        assert_ok(safe_atou16("8080", &v));
        assert_int_equal(v, 8080);
        assert_ok(safe_atou16("65535", &v));
        assert_int_equal(v, UINT16_MAX);

        v = 0x5a5a;
        assert_errno(safe_atou16("65536", &v), -ERANGE);
        assert_errno(safe_atou16("4294967296", &v), -ERANGE);
        assert_errno(safe_atou16("-1", &v), -EINVAL);
        assert_errno(safe_atou16("80 ", &v), -EINVAL);
        assert_errno(safe_atou16("+80", &v), -EINVAL);
        assert_int_equal(v, 0x5a5a);
}

static void test_safe_atoi64(void **state) {
        int64_t v;

        assert_ok(safe_atoi64("0", &v));
        assert_int_equal(v, 0);
        assert_ok(safe_atoi64("-42", &v));
        assert_true(v == -42);
        assert_ok(safe_atoi64("9223372036854775807", &v));
        assert_true(v == INT64_MAX);
        assert_ok(safe_atoi64("-9223372036854775808", &v));
        assert_true(v == INT64_MIN);

        v = UNTOUCHED;
        assert_errno(safe_atoi64("9223372036854775808", &v), -ERANGE);
        assert_errno(safe_atoi64("-9223372036854775809", &v), -ERANGE);
        assert_errno(safe_atoi64("-18446744073709551616", &v), -ERANGE);

        static const char *const invalid[] = { "", "-", "--1", "+1", "-+1", " -1", "-1 ", "- 1", "1-" };
        for (size_t i = 0; i < ELEMENTSOF(invalid); i++)
                assert_errno(safe_atoi64(invalid[i], &v), -EINVAL);
        assert_int_equal(v, UNTOUCHED);
}

static void test_parse_boolean(void **state) {
        static const char *const yes[] = { "1", "true", "TRUE", "True", "yes", "YES", "on", "On", "t", "T" };
        static const char *const no[] = { "0", "false", "FALSE", "no", "No", "off", "OFF", "f", "F" };
        static const char *const invalid[] = { "",     "2",    "-1", "tru",  "truee",
                                               " yes", "yes ", "o",  "nope", "01" };

        for (size_t i = 0; i < ELEMENTSOF(yes); i++)
                assert_int_equal(parse_boolean(yes[i]), 1);
        for (size_t i = 0; i < ELEMENTSOF(no); i++)
                assert_int_equal(parse_boolean(no[i]), 0);
        for (size_t i = 0; i < ELEMENTSOF(invalid); i++)
                assert_errno(parse_boolean(invalid[i]), -EINVAL);
        assert_errno(parse_boolean(NULL), -EINVAL);
}

static void test_parse_duration_valid(void **state) {
        static const struct {
                const char *s;
                usec_t usec;
        } cases[] = {
                { "0", 0 },
                { "0s", 0 },
                { "90s", 90 * USEC_PER_SEC },
                { "5m", 5 * USEC_PER_MINUTE },
                { "1h30m", USEC_PER_HOUR + 30 * USEC_PER_MINUTE },
                { "1h30m15s", USEC_PER_HOUR + 30 * USEC_PER_MINUTE + 15 * USEC_PER_SEC },
                { "250ms", 250 * USEC_PER_MSEC },
                { "1m5s", USEC_PER_MINUTE + 5 * USEC_PER_SEC },
                { "1.5s", 1500 * USEC_PER_MSEC },
                { ".5s", 500 * USEC_PER_MSEC },
                { "1.5h", 90 * USEC_PER_MINUTE },
                { "0.25m", 15 * USEC_PER_SEC },
                { "10us", 10 },
                { "10\xc2\xb5s", 10 }, /* µs, MICRO SIGN */
                { "10\xce\xbcs", 10 }, /* μs, GREEK SMALL LETTER MU */
                { "1500ns", 1 },       /* rounded down to microseconds */
                { "999ns", 0 },
                { "1.0000009s", USEC_PER_SEC }, /* beyond nanoseconds is ignored */
                { "2h45m30.5s",
                  2 * USEC_PER_HOUR + 45 * USEC_PER_MINUTE + 30 * USEC_PER_SEC + 500 * USEC_PER_MSEC },
                { "1s1ms1us", USEC_PER_SEC + USEC_PER_MSEC + 1 },
                { "18446744073709551us", UINT64_C(18446744073709551) },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                usec_t u = UNTOUCHED;

                assert_ok(parse_duration(cases[i].s, &u));
                if (u != cases[i].usec)
                        fail_msg(
                                "parse_duration(\"%s\") = %" PRIu64 ", expected %" PRIu64,
                                cases[i].s,
                                u,
                                cases[i].usec);
        }
        assert_ok(parse_duration("1s", NULL));
}

static void test_parse_duration_invalid(void **state) {
        static const char *const invalid[] = {
                "",   "5",  "-1s",  "+1s", "1x",   "1s ", " 1s",  "1 s", "s",   ".s",   "1..5s", "1h-5m",
                "00", "1S", "1sec", "1d",  "1mss", "1.5", "0x1s", "ms",  "1h ", "\t1s", "1s\n",
        };

        for (size_t i = 0; i < ELEMENTSOF(invalid); i++) {
                usec_t u = UNTOUCHED;
                int r = parse_duration(invalid[i], &u);

                if (r != -EINVAL)
                        fail_msg(
                                "parse_duration(\"%s\") = %d (%s), expected -EINVAL",
                                invalid[i],
                                r,
                                test_errno_name(r));
                assert_int_equal(u, UNTOUCHED);
        }
        assert_errno(parse_duration(NULL, NULL), -EINVAL);
}

static void test_parse_duration_overflow(void **state) {
        static const char *const overflow[] = {
                "18446744073709551616s", /* the number itself */
                "99999999999h",          /* number times unit */
                "18446744073709552us",   /* beyond what fits in nanoseconds */
                "5124095h5124095h",      /* the sum of terms */
                "5124095.9999h",         /* whole part fits, the fraction tips it over */
        };

        for (size_t i = 0; i < ELEMENTSOF(overflow); i++) {
                usec_t u = UNTOUCHED;
                int r = parse_duration(overflow[i], &u);

                if (r != -ERANGE)
                        fail_msg(
                                "parse_duration(\"%s\") = %d (%s), expected -ERANGE",
                                overflow[i],
                                r,
                                test_errno_name(r));
                assert_int_equal(u, UNTOUCHED);
        }
}

static void test_parse_size(void **state) {
        static const struct {
                const char *s;
                uint64_t bytes;
        } cases[] = {
                { "0", 0 },
                { "4096", 4096 },
                { "4096B", 4096 },
                { "512K", 512 * 1024 },
                { "10KiB", 10 * 1024 },
                { "8M", 8388608 },
                { "8MiB", 8388608 },
                { "1G", UINT64_C(1073741824) },
                { "2GiB", UINT64_C(2147483648) },
                { "1T", UINT64_C(1099511627776) },
                { "3TiB", UINT64_C(3) << 40 },
                { "16777215T", UINT64_C(16777215) << 40 },
                { "18446744073709551615", UINT64_MAX },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                uint64_t v = UNTOUCHED;

                assert_ok(parse_size(cases[i].s, &v));
                if (v != cases[i].bytes)
                        fail_msg(
                                "parse_size(\"%s\") = %" PRIu64 ", expected %" PRIu64,
                                cases[i].s,
                                v,
                                cases[i].bytes);
        }
        assert_ok(parse_size("1G", NULL));
}

static void test_parse_size_invalid(void **state) {
        static const char *const invalid[] = {
                "",   "-1",   "+1", "1.5M", "8MB?", "M",    "8 M", " 8M", "8M ",  "8m",
                "8k", "8Kib", "8P", "8E",   "8BB",  "0x10", "1e3", "8Mi", "8M\n",
        };

        for (size_t i = 0; i < ELEMENTSOF(invalid); i++) {
                uint64_t v = UNTOUCHED;
                int r = parse_size(invalid[i], &v);

                if (r != -EINVAL)
                        fail_msg(
                                "parse_size(\"%s\") = %d (%s), expected -EINVAL",
                                invalid[i],
                                r,
                                test_errno_name(r));
                assert_int_equal(v, UNTOUCHED);
        }
        assert_errno(parse_size(NULL, NULL), -EINVAL);
}

static void test_parse_size_overflow(void **state) {
        static const char *const overflow[] = {
                "18446744073709551616", "16777216T",          "17179869184G",
                "17592186044416M",      "18014398509481984K", "99999999999999999999999K",
        };

        for (size_t i = 0; i < ELEMENTSOF(overflow); i++) {
                uint64_t v = UNTOUCHED;
                int r = parse_size(overflow[i], &v);

                if (r != -ERANGE)
                        fail_msg(
                                "parse_size(\"%s\") = %d (%s), expected -ERANGE",
                                overflow[i],
                                r,
                                test_errno_name(r));
                assert_int_equal(v, UNTOUCHED);
        }
}

static void test_format_duration(void **state) {
        static const struct {
                usec_t usec;
                const char *s;
        } cases[] = {
                { 0, "0s" },
                { 90 * USEC_PER_SEC, "1m30s" },
                { 5 * USEC_PER_MINUTE, "5m" },
                { USEC_PER_HOUR + 30 * USEC_PER_MINUTE, "1h30m" },
                { 250 * USEC_PER_MSEC, "250ms" },
                { 1500, "1500us" },
                { 7, "7us" },
                { 2 * USEC_PER_HOUR, "2h" },
                { 36 * USEC_PER_HOUR + 1 * USEC_PER_SEC, "36h1s" },
        };
        char buf[64];

        for (size_t i = 0; i < ELEMENTSOF(cases); i++)
                assert_string_equal(format_duration(buf, sizeof(buf), cases[i].usec), cases[i].s);

        /* The result is the buffer passed in. */
        assert_ptr_equal(format_duration(buf, sizeof(buf), 1), buf);
}

static void test_format_duration_round_trip(void **state) {
        static const usec_t values[] = {
                0,
                1,
                999,
                USEC_PER_MSEC,
                250 * USEC_PER_MSEC,
                1500 * USEC_PER_MSEC,
                USEC_PER_SEC,
                USEC_PER_SEC + 1,
                59 * USEC_PER_SEC + 999999,
                5 * USEC_PER_MINUTE,
                USEC_PER_HOUR + 30 * USEC_PER_MINUTE,
                USEC_PER_HOUR + 500 * USEC_PER_MSEC,
                25 * USEC_PER_HOUR + 59 * USEC_PER_MINUTE + 59 * USEC_PER_SEC + 123456,
                UINT64_MAX / NSEC_PER_USEC, /* the longest duration parse_duration() reads */
        };
        char buf[64];

        for (size_t i = 0; i < ELEMENTSOF(values); i++) {
                usec_t u = UNTOUCHED;

                format_duration(buf, sizeof(buf), values[i]);
                assert_ok(parse_duration(buf, &u));
                if (u != values[i])
                        fail_msg("%" PRIu64 " formatted as \"%s\" parses back as %" PRIu64, values[i], buf, u);
        }

        /* And the other way: the canonical spellings come back unchanged. */
        static const char *const canonical[] = { "1m30s", "5m", "1h30m", "250ms", "1.500000s", "12us", "0s" };
        for (size_t i = 0; i < ELEMENTSOF(canonical); i++) {
                usec_t u;

                assert_ok(parse_duration(canonical[i], &u));
                assert_string_equal(format_duration(buf, sizeof(buf), u), canonical[i]);
        }
}

static void test_format_duration_truncates(void **state) {
        char buf[4];

        /* A short buffer gets a truncated but terminated string, and nothing beyond it is written. */
        assert_string_equal(format_duration(buf, sizeof(buf), USEC_PER_HOUR + 30 * USEC_PER_MINUTE), "1h3");
        assert_string_equal(format_duration(buf, sizeof(buf), 12345 * USEC_PER_HOUR), "123");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_safe_atou64),
                cmocka_unit_test(test_safe_atou32),
                cmocka_unit_test(test_safe_atou16),
                cmocka_unit_test(test_safe_atoi64),
                cmocka_unit_test(test_parse_boolean),
                cmocka_unit_test(test_parse_duration_valid),
                cmocka_unit_test(test_parse_duration_invalid),
                cmocka_unit_test(test_parse_duration_overflow),
                cmocka_unit_test(test_parse_size),
                cmocka_unit_test(test_parse_size_invalid),
                cmocka_unit_test(test_parse_size_overflow),
                cmocka_unit_test(test_format_duration),
                cmocka_unit_test(test_format_duration_round_trip),
                cmocka_unit_test(test_format_duration_truncates),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
