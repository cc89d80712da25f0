/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <unistd.h>

#include "test-util.h"

#include "process-util.h"

/* smaps_rollup of a QEMU with 1 GiB of memfd guest RAM under TCG, as Linux 6.1 prints it. */
static const char rollup[] =
        "55d0c2a5e000-7ffd8b5f9000 ---p 00000000 00:00 0                          [rollup]\n"
        "Rss:              394108 kB\n"
        "Pss:              391807 kB\n"
        "Pss_Dirty:        358352 kB\n"
        "Pss_Anon:         173608 kB\n"
        "Pss_File:          33423 kB\n"
        "Pss_Shmem:        184776 kB\n"
        "Shared_Clean:       2808 kB\n"
        "Private_Dirty:    358352 kB\n"
        "Anonymous:        173608 kB\n"
        "SwapPss:              12 kB\n"
        "Locked:                0 kB\n";

static void test_parse(void **state) {
        ProcMemory m;

        assert_ok(proc_memory_parse(rollup, &m));
        assert_int_equal(m.rss, 394108ULL * 1024);
        assert_int_equal(m.pss, 391807ULL * 1024);
        assert_int_equal(m.pss_anon, 173608ULL * 1024);
        assert_int_equal(m.pss_file, 33423ULL * 1024);
        assert_int_equal(m.pss_shmem, 184776ULL * 1024);
        assert_int_equal(m.swap_pss, 12ULL * 1024);

        /* a kernel before 5.10: no breakdown of PSS, which stays 0; no trailing newline */
        assert_ok(proc_memory_parse("Rss: 8 kB\nPss: 4 kB", &m));
        assert_int_equal(m.rss, 8192);
        assert_int_equal(m.pss, 4096);
        assert_int_equal(m.pss_anon, 0);
        /* Pss_Dirty is no Pss */
        assert_ok(proc_memory_parse("Pss_Dirty: 9 kB\nRss: 8 kB\nPss: 4 kB\n", &m));
        assert_int_equal(m.pss, 4096);
}

static void test_parse_invalid(void **state) {
        ProcMemory m = { .rss = 77 };

        assert_errno(proc_memory_parse("", &m), -EBADMSG);
        assert_errno(proc_memory_parse("Rss: 8 kB\n", &m), -EBADMSG);
        assert_errno(proc_memory_parse("Pss: 8 kB\n", &m), -EBADMSG);
        assert_errno(proc_memory_parse("Rss: 8 kB\nPss: x kB\n", &m), -EBADMSG);
        assert_errno(proc_memory_parse("Rss: 8 kB\nPss: -1 kB\n", &m), -EBADMSG);
        assert_errno(proc_memory_parse("Rss: 8 kB\nPss: 4 MB\n", &m), -EBADMSG);
        assert_errno(proc_memory_parse("Rss: 8 kB\nPss: 4 kB trailing\n", &m), -EBADMSG);
        assert_errno(proc_memory_parse("Rss: 8\nPss: 4 kB\n", &m), -EBADMSG);
        /* past what bytes in a uint64 can hold */
        assert_errno(proc_memory_parse("Rss: 18014398509481984 kB\nPss: 4 kB\n", &m), -EBADMSG);
        assert_errno(proc_memory_parse("Rss: 99999999999999999999999 kB\nPss: 4 kB\n", &m), -EBADMSG);
        /* nothing written on failure */
        assert_int_equal(m.rss, 77);
}

static void test_self(void **state) {
        ProcMemory m;

        assert_ok(proc_memory(getpid(), &m));
        assert_true(m.pss > 0);
        assert_true(m.rss >= m.pss);
        assert_errno(proc_memory(0, &m), -EINVAL);
        assert_errno(proc_memory(-1, &m), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse),
                cmocka_unit_test(test_parse_invalid),
                cmocka_unit_test(test_self),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
