/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "test-util.h"

#include "macro.h"
#include "string-table.h"
#include "string-util.h"

static void check(const char *in, const char *want) {
        char *s = strdup(in);

        assert_non_null(s);
        assert_string_equal(strip_terminal_escapes(s), want);
        free(s);
}

static void test_strip_terminal_escapes(void **state) {
        /* what a systemd console tail looks like: colours, bold, line ends of a serial console */
        check("[\033[0;32m  OK  \033[0m] Reached target \033[0;1;39mBasic System\033[0m.\r\n",
              "[  OK  ] Reached target Basic System.\n");
        check("\033[0;1;31mFAILED\033[0m to start x.", "FAILED to start x.");
        /* cursor movement, erase, private modes */
        check("a\033[2Kb\033[10;20Hc\033[?25ld", "abcd");
        /* OSC with BEL and with ST; two-byte sequences */
        check("\033]0;title\007x\033]2;t\033\\y\033cz\033(Bw", "xyzw");
        /* other control characters; tabs and newlines stay */
        check("a\bb\tc\nd\x7f\x01"
              "e",
              "ab\tc\nde");
        /* truncated sequences at the end are dropped whole */
        check("abc\033[12", "abc");
        check("abc\033", "abc");
        check("abc\033]0;ti", "abc");
        /* text without any stays as it is, UTF-8 included */
        check("Welcome to Debian GNU/Linux — ok", "Welcome to Debian GNU/Linux — ok");
        check("", "");
        assert_null(strip_terminal_escapes(NULL));
}

typedef enum Colour {
        COLOUR_RED,
        COLOUR_GREEN,
        COLOUR_UNNAMED, /* no entry: never matches, has no name */
        _COLOUR_MAX,
        _COLOUR_INVALID = -EINVAL,
} Colour;

static const char *const colour_table[_COLOUR_MAX] = {
        [COLOUR_RED] = "red",
        [COLOUR_GREEN] = "green",
};

DEFINE_PRIVATE_STRING_TABLE_LOOKUP(colour, Colour);

static void test_string_table(void **state) {
        assert_string_equal(colour_to_string(COLOUR_RED), "red");
        assert_string_equal(colour_to_string(COLOUR_GREEN), "green");
        assert_null(colour_to_string(COLOUR_UNNAMED));
        assert_null(colour_to_string(_COLOUR_MAX));
        assert_null(colour_to_string(_COLOUR_INVALID));
        assert_null(colour_to_string((Colour) 1000));

        assert_int_equal(colour_from_string("red"), COLOUR_RED);
        assert_int_equal(colour_from_string("green"), COLOUR_GREEN);
        assert_int_equal(colour_from_string("Red"), _COLOUR_INVALID);
        assert_int_equal(colour_from_string(""), _COLOUR_INVALID);
        assert_int_equal(colour_from_string(NULL), _COLOUR_INVALID);
        assert_int_equal(string_table_lookup(colour_table, ELEMENTSOF(colour_table), "blue"), -EINVAL);
}

static void test_fnv1a_32(void **state) {
        /* the reference values of the FNV specification */
        assert_int_equal(fnv1a_32(""), 0x811c9dc5U);
        assert_int_equal(fnv1a_32("a"), 0xe40c292cU);
        assert_int_equal(fnv1a_32("foobar"), 0xbf9cf968U);
        /* bytes, not signed chars */
        assert_int_equal(fnv1a_32("\xff"), (0x811c9dc5U ^ 0xffU) * 16777619U);
}

static void test_strv_join(void **state) {
        char *abc[] = { (char *) "a", (char *) "bc", (char *) "", (char *) "d", NULL }, *none[] = { NULL };
        char *s;

        s = strv_join(abc, ", ");
        assert_string_equal(s, "a, bc, , d");
        free(s);
        s = strv_join(abc + 3, ", ");
        assert_string_equal(s, "d");
        free(s);
        s = strv_join(none, ", ");
        assert_string_equal(s, "");
        free(s);
        s = strv_join(NULL, "-");
        assert_string_equal(s, "");
        free(s);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_strip_terminal_escapes),
                cmocka_unit_test(test_string_table),
                cmocka_unit_test(test_fnv1a_32),
                cmocka_unit_test(test_strv_join),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
