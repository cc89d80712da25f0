/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "test-util.h"

#include "macro.h"
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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_strip_terminal_escapes),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
