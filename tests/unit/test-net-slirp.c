/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include "net-slirp.h"

static void test_placeholder(void **state) {
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_placeholder),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
