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

/* What /proc/<pid>/smaps_rollup says of a process's memory, in bytes. PSS shares each page among
 * the processes that map it, so the PSS of all processes adds up to the memory they use. */
typedef struct ProcMemory {
        uint64_t rss, pss;
        uint64_t pss_anon, pss_file, pss_shmem; /* Linux 5.10 on: 0 where the kernel has no such line */
        uint64_t swap_pss;
} ProcMemory;

/* Parses the text of smaps_rollup (its header line, then "Key:   N kB" lines). Returns 0, or
 * -EBADMSG when Rss or Pss is missing or a value of the known keys does not parse. */
int proc_memory_parse(const char *text, ProcMemory *ret);

/* proc_memory_parse() of /proc/<pid>/smaps_rollup: -EINVAL for pid <= 0, -ENOENT (or -EACCES, -ESRCH)
 * when the process is gone or not ours to read. The kernel walks the process's page tables for it:
 * about 10 ms per GiB resident (measured on Linux 6.1), so not on an event loop. */
int proc_memory(pid_t pid, ProcMemory *ret);

/* Forks a child that execs argv (argv[0] searched in PATH) in a process group of its own, with no
 * signal blocked, SIGKILL as its parent-death signal (a parent that ended before that was set makes
 * it exit at once) and, when out_fd >= 0, stdout and stderr on out_fd. Returns the child's pid, or
 * a negative errno when fork() fails; the child exits 127 when the exec fails, after saying so on
 * stderr. For helper processes only (the guard, the firmware run): the daemon's loop starts its
 * children through the VmSpawner thread. */
pid_t process_fork_exec(char *const *argv, int out_fd);
