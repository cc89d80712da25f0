/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "host-ksm.h"

/* A copy of /sys/kernel/mm/ksm in a temporary directory. */
static char *ksm_dir(void) {
        char *d = strdup("/tmp/test-host-ksm-XXXXXX");

        assert_non_null(d);
        assert_non_null(mkdtemp(d));
        return d;
}

static void put(const char *dir, const char *name, const char *value) {
        _cleanup_free_ char *p = NULL;
        FILE *f;

        assert_true(asprintf(&p, "%s/%s", dir, name) >= 0);
        f = fopen(p, "we");
        assert_non_null(f);
        fputs(value, f);
        assert_int_equal(fclose(f), 0);
}

static void put_all(const char *dir, const char *run) {
        put(dir, "run", run);
        put(dir, "pages_shared", "1200\n");
        put(dir, "pages_sharing", "51200\n");
        put(dir, "pages_unshared", "7\n");
        put(dir, "pages_volatile", "3\n");
        put(dir, "full_scans", "42\n");
}

static void test_running(void **state) {
        _cleanup_free_ char *dir = ksm_dir();
        json_auto_t *j = NULL;
        HostKsm k;

        put_all(dir, "1\n");
        put(dir, "general_profit", "-4096\n");
        assert_ok(host_ksm_read(dir, &k));
        assert_true(k.available);
        assert_int_equal(k.run, 1);
        assert_int_equal(k.pages_shared, 1200);
        assert_int_equal(k.pages_sharing, 51200);
        assert_int_equal(k.full_scans, 42);
        assert_true(k.have_general_profit);
        assert_int_equal(k.general_profit, -4096);
        assert_int_equal(host_ksm_saved_bytes(&k, 4096), 51200ULL * 4096);

        j = host_ksm_to_json(&k, 4096);
        assert_non_null(j);
        assert_true(json_is_true(json_object_get(j, "available")));
        assert_true(json_is_true(json_object_get(j, "running")));
        assert_int_equal(json_integer_value(json_object_get(j, "savedBytes")), 51200LL * 4096);
        assert_int_equal(json_integer_value(json_object_get(j, "pagesShared")), 1200);
        assert_int_equal(json_integer_value(json_object_get(j, "generalProfitBytes")), -4096);
        assert_contains(json_string_value(json_object_get(j, "note")), "KSM is on");
        assert_ok(rm_rf(dir));
}

static void test_off(void **state) {
        _cleanup_free_ char *dir = ksm_dir();
        json_auto_t *j = NULL;
        HostKsm k;

        /* Linux 6.1: no general_profit */
        put_all(dir, "0\n");
        assert_ok(host_ksm_read(dir, &k));
        assert_true(k.available);
        assert_false(k.have_general_profit);
        j = host_ksm_to_json(&k, 4096);
        assert_non_null(j);
        assert_false(json_is_true(json_object_get(j, "running")));
        assert_int_equal(json_integer_value(json_object_get(j, "run")), 0);
        assert_null(json_object_get(j, "generalProfitBytes"));
        assert_contains(json_string_value(json_object_get(j, "note")), "KSM is off");
        assert_ok(rm_rf(dir));
}

static void test_absent(void **state) {
        _cleanup_free_ char *dir = ksm_dir(), *gone = NULL;
        json_auto_t *j = NULL;
        HostKsm k = { .run = 5 };

        assert_true(asprintf(&gone, "%s/ksm", dir) >= 0);
        assert_ok(host_ksm_read(gone, &k));
        assert_false(k.available);
        assert_int_equal(k.run, 0);
        j = host_ksm_to_json(&k, 4096);
        assert_non_null(j);
        assert_false(json_is_true(json_object_get(j, "available")));
        assert_null(json_object_get(j, "savedBytes"));
        assert_contains(json_string_value(json_object_get(j, "note")), "no KSM");
        assert_ok(rm_rf(dir));
}

static void test_invalid(void **state) {
        static const char *const bad[] = { "", "x\n", "-1\n", "1 2\n", "18446744073709551616\n", "+3\n" };
        _cleanup_free_ char *dir = ksm_dir(), *big = NULL;
        HostKsm k = { .run = 9 };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                put_all(dir, bad[i]);
                assert_errno(host_ksm_read(dir, &k), -EBADMSG);
        }
        /* a file far longer than a number */
        big = test_repeat('1', 100);
        put_all(dir, big);
        assert_errno(host_ksm_read(dir, &k), -EBADMSG);
        /* a file missing */
        put_all(dir, "1\n");
        {
                _cleanup_free_ char *p = NULL;
                assert_true(asprintf(&p, "%s/pages_sharing", dir) >= 0);
                assert_int_equal(unlink(p), 0);
        }
        assert_errno(host_ksm_read(dir, &k), -EBADMSG);
        put_all(dir, "1\n");
        put(dir, "general_profit", "--5\n");
        assert_errno(host_ksm_read(dir, &k), -EBADMSG);
        assert_int_equal(k.run, 9);
        assert_ok(rm_rf(dir));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_running),
                cmocka_unit_test(test_off),
                cmocka_unit_test(test_absent),
                cmocka_unit_test(test_invalid),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
