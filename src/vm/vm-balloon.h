/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The virtio-balloon's guest statistics as QEMU's qom-get of "guest-stats" returns them: what the
 * guest's driver last put in the statistics queue. The values come from the guest, so they are read
 * as untrusted numbers: only the known keys, only whole non-negative values, nothing kept of the rest. */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "macro.h"

typedef enum VmBalloonStat {
        VM_BALLOON_STAT_SWAP_IN,       /* bytes swapped in since the guest booted */
        VM_BALLOON_STAT_SWAP_OUT,      /* bytes swapped out */
        VM_BALLOON_STAT_MAJOR_FAULTS,  /* count */
        VM_BALLOON_STAT_MINOR_FAULTS,  /* count */
        VM_BALLOON_STAT_FREE_MEMORY,   /* bytes the guest leaves unused (MemFree) */
        VM_BALLOON_STAT_TOTAL_MEMORY,  /* bytes the guest's kernel manages (MemTotal) */
        VM_BALLOON_STAT_AVAILABLE,     /* bytes available without swapping (MemAvailable) */
        VM_BALLOON_STAT_DISK_CACHES,   /* bytes of page cache the guest could drop */
        VM_BALLOON_STAT_HUGETLB_ALLOC, /* count of huge page allocations */
        VM_BALLOON_STAT_HUGETLB_FAIL,  /* count of failed ones */
        _VM_BALLOON_STAT_MAX,
        _VM_BALLOON_STAT_INVALID = -EINVAL,
} VmBalloonStat;

typedef struct VmBalloonStatInfo {
        const char *name; /* ours, for get_vm_metrics: "free_memory_bytes" */
        const char *qemu; /* QEMU's key: "stat-free-memory" */
        bool cumulative;  /* counts since the guest booted (a counter), else a level (a gauge) */
} VmBalloonStatInfo;

/* What is known of s; NULL outside the enum. */
const VmBalloonStatInfo *vm_balloon_stat_info(VmBalloonStat s) _const_;

typedef struct VmBalloonStats {
        uint64_t value[_VM_BALLOON_STAT_MAX];
        bool have[_VM_BALLOON_STAT_MAX]; /* the guest reported it (QEMU says "not" with 2^64-1) */
        int64_t last_update;             /* QEMU's clock (Unix seconds) when they came; 0: never */
} VmBalloonStats;

/* Reads the value of qom-get guest-stats ({"stats": {"stat-…": N, …}, "last-update": T}). A value
 * that is missing, 2^64-1 (QEMU's "not reported", which the QMP parser leaves a real), negative or
 * not whole is not had. Returns 0, or -EBADMSG when v is not that object. */
int vm_balloon_stats_parse(json_t *v, VmBalloonStats *ret);

/* The statistics had, as a JSON object of our names, with "updated_at" (RFC 3339) when last_update is
 * set. Returns a new reference, or NULL on OOM. */
json_t *vm_balloon_stats_to_json(const VmBalloonStats *s);
