/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "vm-balloon.h"

#include "cleanup.h"
#include "time-util.h"

/* Ours (for get_vm_metrics), QEMU 7.2's (hw/virtio/virtio-balloon.c; the same in later releases),
 * and whether it counts since the guest's boot. Memory is in bytes, faults and allocations a count. */
static const VmBalloonStatInfo stat_info[_VM_BALLOON_STAT_MAX] = {
        [VM_BALLOON_STAT_SWAP_IN] = { "swap_in_bytes", "stat-swap-in", true },
        [VM_BALLOON_STAT_SWAP_OUT] = { "swap_out_bytes", "stat-swap-out", true },
        [VM_BALLOON_STAT_MAJOR_FAULTS] = { "major_faults", "stat-major-faults", true },
        [VM_BALLOON_STAT_MINOR_FAULTS] = { "minor_faults", "stat-minor-faults", true },
        [VM_BALLOON_STAT_FREE_MEMORY] = { "free_memory_bytes", "stat-free-memory", false },
        [VM_BALLOON_STAT_TOTAL_MEMORY] = { "total_memory_bytes", "stat-total-memory", false },
        [VM_BALLOON_STAT_AVAILABLE] = { "available_memory_bytes", "stat-available-memory", false },
        [VM_BALLOON_STAT_DISK_CACHES] = { "disk_caches_bytes", "stat-disk-caches", false },
        [VM_BALLOON_STAT_HUGETLB_ALLOC] = { "hugetlb_allocations", "stat-htlb-pgalloc", true },
        [VM_BALLOON_STAT_HUGETLB_FAIL] = { "hugetlb_failures", "stat-htlb-pgfail", true },
};

const VmBalloonStatInfo *vm_balloon_stat_info(VmBalloonStat s) {
        return (size_t) s < ELEMENTSOF(stat_info) ? stat_info + s : NULL;
}

int vm_balloon_stats_parse(json_t *v, VmBalloonStats *ret) {
        VmBalloonStats s = {};
        json_t *stats, *t;

        assert_return(ret, -EINVAL);

        stats = json_object_get(v, "stats");
        if (!json_is_object(v) || !json_is_object(stats))
                return -EBADMSG;

        for (VmBalloonStat i = 0; i < _VM_BALLOON_STAT_MAX; i++) {
                json_t *x = json_object_get(stats, stat_info[i].qemu);

                /* An integer: json_int_t holds all values but QEMU's 2^64-1, which stays a real. */
                if (json_is_integer(x) && json_integer_value(x) >= 0) {
                        s.value[i] = (uint64_t) json_integer_value(x);
                        s.have[i] = true;
                }
        }

        t = json_object_get(v, "last-update");
        if (json_is_integer(t) && json_integer_value(t) > 0 &&
            json_integer_value(t) < (json_int_t) (USEC_INFINITY / USEC_PER_SEC))
                s.last_update = json_integer_value(t);

        *ret = s;
        return 0;
}

json_t *vm_balloon_stats_to_json(const VmBalloonStats *s) {
        json_auto_t *o = json_object();
        char buf[RFC3339_MAX];

        assert_return(s, NULL);

        if (!o)
                return NULL;
        for (VmBalloonStat i = 0; i < _VM_BALLOON_STAT_MAX; i++)
                if (s->have[i] &&
                    json_object_set_new(o, stat_info[i].name, json_integer((json_int_t) s->value[i])) < 0)
                        return NULL;
        if (s->last_update > 0 &&
            json_object_set_new(
                    o, "updated_at", json_string(format_rfc3339((usec_t) s->last_update * USEC_PER_SEC, buf))) <
                    0)
                return NULL;
        return TAKE_PTR(o);
}
