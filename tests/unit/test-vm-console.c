/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "vm-console.h"

#define PANIC "Kernel panic - not syncing: Fatal exception in interrupt"

static int find(const char *s, size_t *done, char **line) {
        return vm_console_find_panic(s, strlen(s), done, line);
}

/* A boot's console without a panic: everything but a tail that might begin the marker is done. */
static void test_no_panic(void **state) {
        const char *c = "[    1.150000] Run /init as init process\r\n[  OK  ] Reached target sysinit.target.\r\n";
        _cleanup_free_ char *line = NULL;
        size_t done = 99;

        assert_int_equal(find(c, &done, &line), 0);
        assert_null(line);
        assert_int_equal(done, strlen(c) - (strlen(VM_CONSOLE_PANIC_MARKER) - 1));

        assert_int_equal(find("short", &done, &line), 0);
        assert_int_equal(done, 0);
        assert_int_equal(vm_console_find_panic("", 0, &done, &line), 0);
        assert_int_equal(done, 0);
}

/* The line as the kernel prints it on a serial console, with what surrounds it. */
static void test_panic_line(void **state) {
        const char *c = "[    1.153] RIP: 0010:enqueue_timer+0x2a/0x90\r\n[    1.154] " PANIC
                        "\r\n[    1.155] Kernel Offset: disabled\r\n";
        _cleanup_free_ char *line = NULL;
        size_t done = 0;

        assert_int_equal(find(c, &done, &line), 1);
        assert_string_equal(line, PANIC);
        assert_int_equal(c[done], '\r');
}

/* A panic line cut anywhere: no verdict until its end is there, and what comes next starts no
 * later than the marker (or the part of it that has come). */
static void test_cut(void **state) {
        const char *c = "booting\n" PANIC "\n";
        size_t n = strlen(c);

        for (size_t cut = 0; cut < n; cut++) {
                _cleanup_free_ char *line = NULL;
                size_t done;
                int r = vm_console_find_panic(c, cut, &done, &line);

                assert_int_equal(r, 0);
                assert_null(line);
                assert_true(done <= strlen("booting\n"));
                /* the rest, from where it said to go on */
                r = vm_console_find_panic(c + done, n - done, &done, &line);
                assert_int_equal(r, 1);
                assert_string_equal(line, PANIC);
        }
}

/* Whatever the guest writes after the marker: control characters and bytes beyond ASCII are left
 * out, and an endless line ends at the limit. */
static void test_hostile(void **state) {
        _cleanup_free_ char *line = NULL, *big = NULL;
        const char c[] = "Kernel panic - not syncing: \x1b[31mred\xff\x01 end\n";
        size_t done, n = strlen(VM_CONSOLE_PANIC_MARKER) + 10000;

        assert_int_equal(vm_console_find_panic(c, sizeof(c) - 1, &done, &line), 1);
        assert_string_equal(line, "Kernel panic - not syncing: [31mred end");
        line = mfree(line);

        big = malloc(n);
        assert_non_null(big);
        memcpy(big, VM_CONSOLE_PANIC_MARKER, strlen(VM_CONSOLE_PANIC_MARKER));
        memset(big + strlen(VM_CONSOLE_PANIC_MARKER), 'x', n - strlen(VM_CONSOLE_PANIC_MARKER));
        assert_int_equal(vm_console_find_panic(big, n, &done, &line), 1);
        assert_int_equal(strlen(line), VM_CONSOLE_PANIC_LINE_MAX);
        assert_int_equal(done, VM_CONSOLE_PANIC_LINE_MAX);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_no_panic),
                cmocka_unit_test(test_panic_line),
                cmocka_unit_test(test_cut),
                cmocka_unit_test(test_hostile),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
