/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "cleanup.h"
#include "time-util.h"

/* The daemon's sd-event loop, run by hand (sd_event_prepare(), sd_event_wait(), sd_event_dispatch())
 * so that every iteration is measured: the time the loop's thread spends in the prepare callbacks and
 * in the one source an iteration dispatches, the wait for events left out. Nothing in an iteration may
 * wait for another process or sleep (DESIGN "One thread, one loop"); this is how we know.
 *
 * Every build keeps the statistics (a histogram and the longest, for /metrics; two clock reads an
 * iteration). With the watchdog on (debug builds, or $VM_MANAGER_LOOP_WATCHDOG=1), an iteration over
 * LOOP_WATCHDOG_THRESHOLD is logged at warning level with where the loop was when it crossed the
 * threshold, and appended to the report file when there is one:
 *
 *   - The verdict takes the iteration's time less the time the thread spent runnable but waiting for a
 *     CPU (the run-queue delay of /proc/thread-self/schedstat), so that a loaded host (the test suite
 *     beside a guest image build on two cores) does not fail code that did not wait.
 *   - Where: sd-event 252 does not say which source it dispatches, so a watcher thread (the only
 *     other thread here, sharing nothing but atomics and the sample it hands over) looks at the loop
 *     every 5 ms, and samples an iteration that has run past the threshold. A loop blocked in a
 *     system call (/proc/thread-self/syscall names it) is not interrupted, since a signal would cut
 *     its wait short (poll() and sleeps fail with EINTR, and sd_bus_call() with them): its stack is
 *     read instead, the return addresses into our code above its stack pointer (innermost first; a
 *     dead slot may add a stale one). A loop that is running gets a real-time signal whose handler
 *     unwinds its stack with backtrace(). Frames are named with the sanitizers' symbolizer where the
 *     build has one (function, file and line), else as module+offset for addr2line. The log says the
 *     system call, if any, and the innermost frame of ours (the callback, or what it called); the
 *     report file holds the whole stack.
 *   - The report file gets one JSON object a line, written when the iteration ends (so it survives
 *     a kill -9 of the daemon): {"usec": wall time, "waitUsec": run-queue delay, "phase": "prepare" or
 *     "dispatch", "syscall": the call it waited in or "", "where": the frame of ours, "stack":
 *     [frames]}. The integration tests read it. */

#define LOOP_WATCHDOG_THRESHOLD (50 * USEC_PER_MSEC)

/* The histogram's upper bounds, in microseconds (+Inf implied). */
#define LOOP_STATS_BOUNDS_USEC 100, 500, 1000, 5000, 10000, 25000, 50000, 100000, 250000, 1000000, 5000000
#define LOOP_STATS_N_BOUNDS 11U

typedef struct LoopStats {
        uint64_t iterations;
        uint64_t buckets[LOOP_STATS_N_BOUNDS + 1]; /* not cumulative; the last above every bound */
        usec_t sum;
        usec_t worst;  /* the longest iteration, wall time */
        uint64_t slow; /* iterations the watchdog reported (0 with the watchdog off) */
} LoopStats;

/* The bounds of LoopStats.buckets, in microseconds. */
extern const usec_t loop_stats_bounds[LOOP_STATS_N_BOUNDS];

typedef struct LoopWatchdogOptions {
        bool enabled;            /* report iterations over the threshold (log, report file) */
        const char *report_path; /* appended to, one line per slow iteration; NULL: none */
} LoopWatchdogOptions;

typedef struct LoopWatchdog LoopWatchdog;

/* A watchdog for event (a new reference is taken); the options' strings are copied. */
int loop_watchdog_new(LoopWatchdog **ret, sd_event *event, const LoopWatchdogOptions *o);
LoopWatchdog *loop_watchdog_free(LoopWatchdog *w);
DEFINE_TRIVIAL_CLEANUP_FUNC(LoopWatchdog *, loop_watchdog_free);

/* Runs the loop until sd_event_exit(), as sd_event_loop() does, measuring each iteration. Returns the
 * exit code, or a negative errno when the loop failed. */
int loop_watchdog_run(LoopWatchdog *w);

/* The statistics so far; borrowed, valid until loop_watchdog_free(). */
const LoopStats *loop_watchdog_stats(LoopWatchdog *w);
bool loop_watchdog_enabled(LoopWatchdog *w);
