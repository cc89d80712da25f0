/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The nonce store (network-imds-attest.md §3): format, single use, TTL with its edge, the per-VM
 * limit, VM binding, forget and the sweep. */
#include <stdlib.h>

#include "test-util.h"

#include "attest-nonce.h"

#define T0 ((usec_t) 3600 * USEC_PER_SEC)

static void test_issue_format(void **state) {
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *s = NULL;
        char a[ATTEST_NONCE_HEX + 1], b[ATTEST_NONCE_HEX + 1];

        assert_ok(attest_nonce_store_new(&s));
        assert_ok(attest_nonce_issue(s, "vm-1", T0, a));
        assert_ok(attest_nonce_issue(s, "vm-1", T0, b));
        assert_int_equal(strlen(a), 64);
        assert_int_equal(strspn(a, "0123456789abcdef"), 64);
        assert_string_not_equal(a, b);
        assert_int_equal(attest_nonce_count(s, "vm-1"), 2);
        assert_int_equal(attest_nonce_vm_count(s), 1);
}

static void test_single_use(void **state) {
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *s = NULL;
        char a[ATTEST_NONCE_HEX + 1];

        assert_ok(attest_nonce_store_new(&s));
        assert_ok(attest_nonce_issue(s, "vm-1", T0, a));
        assert_true(attest_nonce_consume(s, "vm-1", a, T0 + 1));
        assert_false(attest_nonce_consume(s, "vm-1", a, T0 + 2));
        assert_int_equal(attest_nonce_vm_count(s), 0);

        /* unknown nonces, other lengths, NULL */
        assert_ok(attest_nonce_issue(s, "vm-1", T0, a));
        assert_false(attest_nonce_consume(s, "vm-1", "", T0));
        assert_false(attest_nonce_consume(s, "vm-1", "abc", T0));
        assert_false(attest_nonce_consume(s, "vm-1", NULL, T0));
        a[64] = 0;
        char longer[ATTEST_NONCE_HEX + 2];
        memcpy(longer, a, 64);
        longer[64] = '0';
        longer[65] = 0;
        assert_false(attest_nonce_consume(s, "vm-1", longer, T0));
        assert_true(attest_nonce_consume(s, "vm-1", a, T0));
}

static void test_ttl(void **state) {
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *s = NULL;
        char a[ATTEST_NONCE_HEX + 1], b[ATTEST_NONCE_HEX + 1];

        assert_ok(attest_nonce_store_new(&s));

        /* exactly the TTL is still valid */
        assert_ok(attest_nonce_issue(s, "vm-1", T0, a));
        assert_true(attest_nonce_consume(s, "vm-1", a, T0 + ATTEST_NONCE_TTL));

        /* one microsecond more is not, and the nonce is gone after the attempt */
        assert_ok(attest_nonce_issue(s, "vm-1", T0, a));
        assert_false(attest_nonce_consume(s, "vm-1", a, T0 + ATTEST_NONCE_TTL + 1));
        assert_false(attest_nonce_consume(s, "vm-1", a, T0));
        assert_int_equal(attest_nonce_count(s, "vm-1"), 0);

        /* a clock that went backwards does not expire anything */
        assert_ok(attest_nonce_issue(s, "vm-1", T0, b));
        assert_true(attest_nonce_consume(s, "vm-1", b, T0 - USEC_PER_SEC));
}

static void test_limit_per_vm(void **state) {
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *s = NULL;
        char n[ATTEST_NONCES_PER_VM + 1][ATTEST_NONCE_HEX + 1];

        assert_ok(attest_nonce_store_new(&s));
        for (unsigned i = 0; i <= ATTEST_NONCES_PER_VM; i++)
                assert_ok(attest_nonce_issue(s, "vm-1", T0 + i, n[i]));
        assert_int_equal(attest_nonce_count(s, "vm-1"), ATTEST_NONCES_PER_VM);

        /* the oldest was dropped, the other eight are good */
        assert_false(attest_nonce_consume(s, "vm-1", n[0], T0 + 100));
        for (unsigned i = 1; i <= ATTEST_NONCES_PER_VM; i++)
                assert_true(attest_nonce_consume(s, "vm-1", n[i], T0 + 100));
        assert_int_equal(attest_nonce_vm_count(s), 0);

        /* the limit is per VM */
        for (unsigned i = 0; i < ATTEST_NONCES_PER_VM; i++)
                assert_ok(attest_nonce_issue(s, "vm-1", T0, n[i]));
        assert_ok(attest_nonce_issue(s, "vm-2", T0, n[ATTEST_NONCES_PER_VM]));
        assert_int_equal(attest_nonce_count(s, "vm-1"), ATTEST_NONCES_PER_VM);
        assert_int_equal(attest_nonce_count(s, "vm-2"), 1);
        assert_true(attest_nonce_consume(s, "vm-1", n[0], T0));
}

static void test_bound_to_vm(void **state) {
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *s = NULL;
        char a[ATTEST_NONCE_HEX + 1];

        assert_ok(attest_nonce_store_new(&s));
        assert_ok(attest_nonce_issue(s, "vm-a", T0, a));
        assert_false(attest_nonce_consume(s, "vm-b", a, T0));
        /* the attempt of another VM does not use it up */
        assert_true(attest_nonce_consume(s, "vm-a", a, T0));
}

static void test_forget_and_sweep(void **state) {
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *s = NULL;
        char a[ATTEST_NONCE_HEX + 1], b[ATTEST_NONCE_HEX + 1], c[ATTEST_NONCE_HEX + 1];

        assert_ok(attest_nonce_store_new(&s));
        assert_ok(attest_nonce_issue(s, "vm-a", T0, a));
        assert_ok(attest_nonce_issue(s, "vm-a", T0, c));
        assert_ok(attest_nonce_issue(s, "vm-b", T0, b));
        assert_int_equal(attest_nonce_vm_count(s), 2);

        attest_nonce_forget(s, "vm-a");
        attest_nonce_forget(s, "vm-unknown");
        attest_nonce_forget(s, NULL);
        assert_int_equal(attest_nonce_vm_count(s), 1);
        assert_false(attest_nonce_consume(s, "vm-a", a, T0));

        /* an issue for another VM sweeps vm-b's expired nonce and vm-b with it */
        assert_ok(attest_nonce_issue(s, "vm-c", T0 + ATTEST_NONCE_TTL + 1, c));
        assert_int_equal(attest_nonce_count(s, "vm-b"), 0);
        assert_int_equal(attest_nonce_vm_count(s), 1);

        /* so does a consume, even a failing one */
        assert_false(attest_nonce_consume(s, "vm-x", "00", T0 + 3 * ATTEST_NONCE_TTL));
        assert_int_equal(attest_nonce_vm_count(s), 0);
}

static void test_add(void **state) {
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *s = NULL;
        const char *good = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

        assert_ok(attest_nonce_store_new(&s));
        assert_errno(attest_nonce_add(s, "vm-1", "00", T0), -EINVAL);
        assert_errno(
                attest_nonce_add(
                        s, "vm-1", "00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff", T0),
                -EINVAL);
        assert_errno(attest_nonce_add(s, NULL, good, T0), -EINVAL);
        assert_ok(attest_nonce_add(s, "vm-1", good, T0));
        assert_true(attest_nonce_consume(s, "vm-1", good, T0));
}

static void test_many_vms(void **state) {
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *s = NULL;
        char n[ATTEST_NONCE_HEX + 1], vm[16];

        assert_ok(attest_nonce_store_new(&s));
        for (unsigned i = 0; i < 500; i++) {
                (void) snprintf(vm, sizeof(vm), "vm-%u", i);
                assert_ok(attest_nonce_issue(s, vm, T0, n));
        }
        assert_int_equal(attest_nonce_vm_count(s), 500);
        assert_true(attest_nonce_consume(s, vm, n, T0));
        assert_int_equal(attest_nonce_vm_count(s), 499);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_issue_format), cmocka_unit_test(test_single_use),
                cmocka_unit_test(test_ttl),          cmocka_unit_test(test_limit_per_vm),
                cmocka_unit_test(test_bound_to_vm),  cmocka_unit_test(test_forget_and_sweep),
                cmocka_unit_test(test_add),          cmocka_unit_test(test_many_vms),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
