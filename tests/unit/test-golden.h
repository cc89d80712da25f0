/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Golden files (libvirt's way): what a pure function produced, compared with a file under
 * tests/data, or written there with VM_MANAGER_TEST_REGENERATE=1 (review the difference like code). */

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "parse-util.h"

static inline bool test_golden_regenerate(void) {
        const char *e = secure_getenv("VM_MANAGER_TEST_REGENERATE");

        return e && parse_boolean(e) > 0;
}

/* Compares got with the file at path, or rewrites the file when asked to. A difference is reported
 * with the first line that differs, and false is returned, so that the caller fails only after its
 * cleanups have run (cmocka's failures longjmp past them, and the leak report would bury the
 * message). what names the data in the hint ("argv", "table"). */
static inline bool test_golden_matches(const char *path, const char *got, const char *what) {
        _cleanup_free_ char *expected = NULL;
        size_t size, line = 1;
        const char *e, *g;
        int r;

        if (test_golden_regenerate()) {
                assert_ok(write_file_atomic(path, got, strlen(got), 0644));
                print_message("# regenerated %s\n", path);
                return true;
        }

        r = read_full_file(path, 1024 * 1024, &expected, &size);
        if (r < 0) {
                print_error(
                        "# cannot read %s (%s); run with VM_MANAGER_TEST_REGENERATE=1 to create it\n",
                        path,
                        test_errno_name(r));
                return false;
        }
        if (streq(expected, got))
                return true;

        /* The first difference, and the start of its line, which both texts share. */
        for (e = expected, g = got; *e && *e == *g; e++, g++)
                if (*e == '\n')
                        line++;
        while (e > expected && e[-1] != '\n') {
                e--;
                g--;
        }
        print_error(
                "# %s differs from the built %s at line %zu:\n# expected: %.*s\n# got:      %.*s\n"
                "# (run with VM_MANAGER_TEST_REGENERATE=1 to accept the new %s)\n",
                path,
                what,
                line,
                (int) strcspn(e, "\n"),
                e,
                (int) strcspn(g, "\n"),
                g,
                what);
        return false;
}
