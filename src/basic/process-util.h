/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdint.h>
#include <sys/types.h>

/* What the kernel says of a process, from /proc/<pid>/stat and statm. */
typedef struct ProcStats {
        double cpu_seconds; /* user and system */
        uint64_t rss_bytes, vsize_bytes;
        double start_seconds; /* since boot */
} ProcStats;

/* -EINVAL for pid <= 0, -ENOENT (or another errno) when the process is gone, -EBADMSG when /proc
 * says something else than expected. */
int proc_stats(pid_t pid, ProcStats *ret);
