/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <string.h>

#include "test-util.h"

#include "vm-balloon.h"
#include "vm-qmp.h"

/* QEMU 7.2's answers to qom-get guest-stats, as lines on the monitor: through the QMP parser, as the
 * daemon reads them. */
#define BEFORE                                                                                          \
        "{\"return\": {\"stats\": {\"stat-htlb-pgalloc\": 18446744073709551615, \"stat-swap-out\": "    \
        "18446744073709551615, \"stat-available-memory\": 18446744073709551615, \"stat-htlb-pgfail\": " \
        "18446744073709551615, \"stat-free-memory\": 18446744073709551615, \"stat-minor-faults\": "     \
        "18446744073709551615, \"stat-major-faults\": 18446744073709551615, \"stat-total-memory\": "    \
        "18446744073709551615, \"stat-swap-in\": 18446744073709551615, \"stat-disk-caches\": "          \
        "18446744073709551615}, \"last-update\": 0}, \"id\": 4}"
#define AFTER                                                                                            \
        "{\"return\": {\"stats\": {\"stat-htlb-pgalloc\": 18446744073709551615, \"stat-swap-out\": 0, "  \
        "\"stat-available-memory\": 1622937600, \"stat-htlb-pgfail\": 18446744073709551615, "            \
        "\"stat-free-memory\": 1428705280, \"stat-minor-faults\": 220131, \"stat-major-faults\": 1051, " \
        "\"stat-total-memory\": 2061062144, \"stat-swap-in\": 4096, \"stat-disk-caches\": 330297344}, "  \
        "\"last-update\": 1760000000}, \"id\": 5}"

static void parse_line(const char *line, VmBalloonStats *ret) {
        _cleanup_(qmp_message_done) QmpMessage m = QMP_MESSAGE_NULL;

        assert_ok(qmp_parse_message(line, strlen(line), &m));
        assert_int_equal(m.type, QMP_MESSAGE_RETURN);
        assert_ok(vm_balloon_stats_parse(m.value, ret));
}

static void test_before_the_guest(void **state) {
        json_auto_t *j = NULL;
        VmBalloonStats s;

        parse_line(BEFORE, &s);
        for (VmBalloonStat i = 0; i < _VM_BALLOON_STAT_MAX; i++)
                assert_false(s.have[i]);
        assert_int_equal(s.last_update, 0);
        j = vm_balloon_stats_to_json(&s);
        assert_non_null(j);
        assert_int_equal(json_object_size(j), 0);
}

static void test_reported(void **state) {
        json_auto_t *j = NULL;
        VmBalloonStats s;

        parse_line(AFTER, &s);
        assert_true(s.have[VM_BALLOON_STAT_FREE_MEMORY]);
        assert_int_equal(s.value[VM_BALLOON_STAT_FREE_MEMORY], 1428705280);
        assert_int_equal(s.value[VM_BALLOON_STAT_TOTAL_MEMORY], 2061062144);
        assert_int_equal(s.value[VM_BALLOON_STAT_SWAP_IN], 4096);
        assert_true(s.have[VM_BALLOON_STAT_SWAP_OUT]);
        assert_int_equal(s.value[VM_BALLOON_STAT_SWAP_OUT], 0);
        assert_false(s.have[VM_BALLOON_STAT_HUGETLB_ALLOC]);
        assert_false(s.have[VM_BALLOON_STAT_HUGETLB_FAIL]);
        assert_int_equal(s.last_update, 1760000000);

        j = vm_balloon_stats_to_json(&s);
        assert_non_null(j);
        assert_int_equal(json_integer_value(json_object_get(j, "free_memory_bytes")), 1428705280);
        assert_int_equal(json_integer_value(json_object_get(j, "available_memory_bytes")), 1622937600);
        assert_int_equal(json_integer_value(json_object_get(j, "disk_caches_bytes")), 330297344);
        assert_int_equal(json_integer_value(json_object_get(j, "major_faults")), 1051);
        assert_null(json_object_get(j, "hugetlb_allocations"));
        assert_string_equal(json_string_value(json_object_get(j, "updated_at")), "2025-10-09T08:53:20Z");
        /* 8 statistics and the time */
        assert_int_equal(json_object_size(j), 9);
}

/* What a guest (through QEMU) cannot make us believe: negative, fractional or textual values, and
 * keys we do not know, which are dropped. */
static void test_untrusted(void **state) {
        json_auto_t *v = NULL;
        VmBalloonStats s;

        v = json_loads(
                "{\"stats\": {\"stat-free-memory\": -5, \"stat-total-memory\": 1.5, \"stat-swap-in\": \"7\", "
                "\"stat-disk-caches\": null, \"stat-major-faults\": 3, \"stat-unknown\": 9}, "
                "\"last-update\": -1}",
                0,
                NULL);
        assert_non_null(v);
        assert_ok(vm_balloon_stats_parse(v, &s));
        assert_false(s.have[VM_BALLOON_STAT_FREE_MEMORY]);
        assert_false(s.have[VM_BALLOON_STAT_TOTAL_MEMORY]);
        assert_false(s.have[VM_BALLOON_STAT_SWAP_IN]);
        assert_false(s.have[VM_BALLOON_STAT_DISK_CACHES]);
        assert_true(s.have[VM_BALLOON_STAT_MAJOR_FAULTS]);
        assert_int_equal(s.last_update, 0);
        json_decref(TAKE_PTR(v));

        /* a time past what usec_t holds is no time */
        v = json_loads("{\"stats\": {}, \"last-update\": 9223372036854775807}", 0, NULL);
        assert_ok(vm_balloon_stats_parse(v, &s));
        assert_int_equal(s.last_update, 0);
        json_decref(TAKE_PTR(v));

        v = json_loads("{\"stats\": []}", 0, NULL);
        assert_errno(vm_balloon_stats_parse(v, &s), -EBADMSG);
        json_decref(TAKE_PTR(v));
        v = json_loads("[1]", 0, NULL);
        assert_errno(vm_balloon_stats_parse(v, &s), -EBADMSG);
        assert_errno(vm_balloon_stats_parse(NULL, &s), -EBADMSG);
}

static void test_names(void **state) {
        assert_string_equal(vm_balloon_stat_info(VM_BALLOON_STAT_AVAILABLE)->name, "available_memory_bytes");
        assert_false(vm_balloon_stat_info(VM_BALLOON_STAT_AVAILABLE)->cumulative);
        assert_string_equal(vm_balloon_stat_info(VM_BALLOON_STAT_HUGETLB_FAIL)->qemu, "stat-htlb-pgfail");
        assert_true(vm_balloon_stat_info(VM_BALLOON_STAT_MAJOR_FAULTS)->cumulative);
        assert_null(vm_balloon_stat_info(_VM_BALLOON_STAT_MAX));
        assert_null(vm_balloon_stat_info(_VM_BALLOON_STAT_INVALID));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_before_the_guest),
                cmocka_unit_test(test_reported),
                cmocka_unit_test(test_untrusted),
                cmocka_unit_test(test_names),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
