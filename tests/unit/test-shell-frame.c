/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <string.h>

#include "test-util.h"

#include "shell-frame.h"

static void test_shell_frame_roundtrip(void **state) {
        uint8_t buf[SHELL_FRAME_HEADER_SIZE + 4];
        ShellFrame f;

        assert_int_equal(shell_frame_resize(buf, 24, 80), 7);
        assert_int_equal(shell_frame_parse(buf, sizeof(buf), &f), 7);
        assert_int_equal(f.type, SHELL_FRAME_RESIZE);
        assert_int_equal(f.rows, 24);
        assert_int_equal(f.cols, 80);

        assert_int_equal(shell_frame_exit(buf, 3), 7);
        assert_int_equal(shell_frame_parse(buf, sizeof(buf), &f), 7);
        assert_int_equal(f.type, SHELL_FRAME_EXIT);
        assert_int_equal(f.status, 3);
}

static void test_shell_frame_data(void **state) {
        const uint8_t in[] = { 1, 0, 3, 'l', 's', '\n', 4, 0, 2, 'n', 'o' };
        ShellFrame f;

        assert_int_equal(shell_frame_parse(in, sizeof(in), &f), 6);
        assert_int_equal(f.type, SHELL_FRAME_DATA);
        assert_int_equal(f.size, 3);
        assert_memory_equal(f.payload, "ls\n", 3);
        assert_int_equal(shell_frame_parse(in + 6, sizeof(in) - 6, &f), 5);
        assert_int_equal(f.type, SHELL_FRAME_ERROR);
        assert_memory_equal(f.payload, "no", 2);
        /* an empty DATA frame is a frame */
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 1, 0, 0 }, 3, &f), 3);
        assert_int_equal(f.size, 0);
}

static void test_shell_frame_partial(void **state) {
        const uint8_t in[] = { 1, 0, 3, 'l', 's', '\n' };
        ShellFrame f = { .type = SHELL_FRAME_ERROR };

        /* each prefix is "more, please", and *ret is left alone */
        for (size_t n = 0; n < sizeof(in); n++)
                assert_int_equal(shell_frame_parse(in, n, &f), 0);
        assert_int_equal(f.type, SHELL_FRAME_ERROR);
        assert_int_equal(shell_frame_parse(NULL, 0, &f), 0);
}

static void test_shell_frame_bad(void **state) {
        ShellFrame f;

        /* unknown types, 0 included */
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 0, 0, 0 }, 3, &f), -EBADMSG);
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 5, 0, 0 }, 3, &f), -EBADMSG);
        /* over the limit, refused from the header alone */
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 1, 0x40, 0x01 }, 3, &f), -EBADMSG);
        /* RESIZE and EXIT take exactly 4 bytes */
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 2, 0, 3, 0, 1, 0 }, 6, &f), -EBADMSG);
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 3, 0, 5, 0, 0, 0, 0, 0 }, 8, &f), -EBADMSG);
        /* a zero-sized window, an exit status over 255 */
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 2, 0, 4, 0, 0, 0, 80 }, 7, &f), -EBADMSG);
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 2, 0, 4, 0, 24, 0, 0 }, 7, &f), -EBADMSG);
        assert_int_equal(shell_frame_parse((const uint8_t[]){ 3, 0, 4, 0, 0, 1, 0 }, 7, &f), -EBADMSG);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_shell_frame_roundtrip),
                cmocka_unit_test(test_shell_frame_data),
                cmocka_unit_test(test_shell_frame_partial),
                cmocka_unit_test(test_shell_frame_bad),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
