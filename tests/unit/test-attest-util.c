/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The decoders whose error texts end up in messages: they must say what Go's encoding/hex and
 * encoding/base64 say (the base64 table is Go's own TestDecodeCorrupt for StdEncoding). */
#include <stdlib.h>

#include "test-util.h"

#include "attest-util.h"
#include "cleanup.h"

static void test_hex(void **state) {
        static const struct {
                const char *in;
                const char *err; /* NULL: decodes */
        } cases[] = {
                { "", NULL },
                { "00ff", NULL },
                { "ABcd", NULL },
                { "0", "encoding/hex: odd length hex string" },
                { "abc", "encoding/hex: odd length hex string" },
                { "zz", "encoding/hex: invalid byte: U+007A 'z'" },
                { "0g", "encoding/hex: invalid byte: U+0067 'g'" },
                { "ab0", "encoding/hex: odd length hex string" },
                { "abg", "encoding/hex: invalid byte: U+0067 'g'" },
                /* an invalid byte before the odd length wins */
                { "g00", "encoding/hex: invalid byte: U+0067 'g'" },
                { "0\n", "encoding/hex: invalid byte: U+000A" },
                { " 0", "encoding/hex: invalid byte: U+0020 ' '" },
                { "\x7f"
                  "0",
                  "encoding/hex: invalid byte: U+007F" },
                { "\xa0"
                  "0",
                  "encoding/hex: invalid byte: U+00A0" },
                { "\xc3\xa9", "encoding/hex: invalid byte: U+00C3 '\xc3\x83'" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_free_ uint8_t *b = NULL;
                _cleanup_free_ char *err = NULL;
                size_t n = 99;
                int r;

                r = attest_hex_decode(cases[i].in, strlen(cases[i].in), &b, &n, &err);
                if (!cases[i].err) {
                        assert_ok(r);
                        assert_int_equal(n, strlen(cases[i].in) / 2);
                        assert_null(err);
                } else {
                        assert_errno(r, -EINVAL);
                        assert_non_null(err);
                        assert_string_equal(err, cases[i].err);
                        assert_int_equal(n, 99);
                }
        }

        _cleanup_free_ uint8_t *b = NULL;
        char out[9];
        size_t n;
        assert_ok(attest_hex_decode("DEADbeef", 8, &b, &n, NULL));
        assert_string_equal(hex_format(b, n, out), "deadbeef");
}

static void test_base64_go_corrupt(void **state) {
        static const struct {
                const char *in;
                long offset; /* -1: decodes */
        } cases[] = {
                { "", -1 },       { "\n", -1 },         { "AAA=\n", -1 }, { "AAAA\n", -1 }, { "!!!!", 0 },
                { "====", 0 },    { "x===", 1 },        { "=AAA", 0 },    { "A=AA", 1 },    { "AA=A", 2 },
                { "AA==A", 4 },   { "AAA=AAAA", 4 },    { "AAAAA", 4 },   { "AAAAAA", 4 },  { "A=", 1 },
                { "A==", 1 },     { "AA=", 3 },         { "AA==", -1 },   { "AAA=", -1 },   { "AAAA", -1 },
                { "AAAAAA=", 7 }, { "YWJjZA=====", 8 }, { "A!\n", 1 },    { "A=\n", 1 },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_free_ uint8_t *b = NULL;
                _cleanup_free_ char *err = NULL, *want = NULL;
                size_t n;
                int r;

                r = attest_base64_decode(cases[i].in, strlen(cases[i].in), 1024, &b, &n, &err);
                if (cases[i].offset < 0) {
                        if (r < 0)
                                fail_msg("'%s' does not decode: %s", cases[i].in, err);
                        continue;
                }
                if (r >= 0)
                        fail_msg("'%s' decodes, expected an error at %ld", cases[i].in, cases[i].offset);
                assert_errno(r, -EINVAL);
                assert_true(asprintf(&want, "illegal base64 data at input byte %ld", cases[i].offset) > 0);
                assert_string_equal(err, want);
        }
}

static void test_base64_values(void **state) {
        static const struct {
                const char *in, *out;
        } cases[] = {
                { "", "" },
                { "Zg==", "f" },
                { "Zm8=", "fo" },
                { "Zm9v", "foo" },
                { "Zm9vYg==", "foob" },
                { "Zm9v\r\nYmFy", "foobar" },
                { "Zm9vYmE=\n", "fooba" },
                /* non-zero trailing bits are accepted, as StdEncoding (not Strict) does */
                { "Zh==", "f" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_free_ uint8_t *b = NULL;
                size_t n;

                assert_ok(attest_base64_decode(cases[i].in, strlen(cases[i].in), 64, &b, &n, NULL));
                assert_int_equal(n, strlen(cases[i].out));
                assert_memory_equal(b ?: (uint8_t *) "", cases[i].out, n);
        }

        /* the limit is on the decoded size, and checked before decoding */
        _cleanup_free_ uint8_t *b = NULL;
        size_t n;
        assert_ok(attest_base64_decode("Zm9vYg==", 8, 4, &b, &n, NULL));
        b = mfree(b);
        assert_errno(attest_base64_decode("Zm9vYmE=", 8, 4, &b, &n, NULL), -EFBIG);
        assert_errno(attest_base64_decode("!!!!!!!!!!!!", 12, 4, &b, &n, NULL), -EFBIG);
        assert_null(b);
}

static void test_go_quote(void **state) {
        static const struct {
                const char *in, *out;
        } cases[] = {
                { "initrd", "\"initrd\"" },
                { "", "\"\"" },
                { "a\"b\\c", "\"a\\\"b\\\\c\"" },
                { "\n\t\x01\x7f", "\"\\n\\t\\x01\\x7f\"" },
                { "\xc3\xa9t\xc3\xa9", "\"\xc3\xa9t\xc3\xa9\"" },
                { "\xff", "\"\\xff\"" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_free_ char *q = attest_go_quote(cases[i].in, strlen(cases[i].in));
                assert_string_equal(q, cases[i].out);
        }
}

static void test_memeq_and_error(void **state) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;

        assert_true(attest_memeq("abc", 3, "abc", 3));
        assert_false(attest_memeq("abc", 3, "abd", 3));
        assert_false(attest_memeq("abc", 3, "ab", 2));
        assert_true(attest_memeq(NULL, 0, NULL, 0));

        /* the message is exactly the text, with no code sentinel before it */
        assert_errno(attest_error_set(&err, -EPERM, "pcr %u", 3), -EPERM);
        assert_string_equal(err.message, "pcr 3");
        assert_int_equal(err.error, -EPERM);
        assert_errno(attest_error_set(NULL, -EPERM, "x"), -EPERM);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_hex),
                cmocka_unit_test(test_base64_go_corrupt),
                cmocka_unit_test(test_base64_values),
                cmocka_unit_test(test_go_quote),
                cmocka_unit_test(test_memeq_and_error),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
