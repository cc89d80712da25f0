/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "test-util.h"

#include "fs-util.h"
#include "log.h"
#include "loop-watchdog.h"

/* The loop run by hand: every iteration counted and measured, the wait for events left out; with the
 * watchdog on, the one that sleeps (or spins) 200 ms on the loop reported (log and report file) with the
 * place it was in, the quick ones not. */

static int on_quick(sd_event_source *s, void *userdata) {
        unsigned *n = userdata;

        (*n)++;
        return 0;
}

/* The slow iteration takes 200 ms: the watcher looks at 50 ms, or later on a loaded machine. */
#define SLOW_MS 200

/* Sleeps SLOW_MS (going on after a signal, should one cut the sleep short). */
static int on_slow(sd_event_source *s, uint64_t usec, void *userdata) {
        struct timespec ts = { .tv_nsec = SLOW_MS * 1000 * 1000 };

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        return 0;
}

/* Spins for SLOW_MS of its own CPU time (a loaded machine adds run-queue delay, which the watchdog
 * leaves out). */
static int on_busy(sd_event_source *s, uint64_t usec, void *userdata) {
        usec_t end = now_usec(CLOCK_THREAD_CPUTIME_ID) + SLOW_MS * USEC_PER_MSEC;
        volatile uint64_t n = 0;

        while (now_usec(CLOCK_THREAD_CPUTIME_ID) < end)
                n++;
        return 0;
}

static int on_exit_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        return sd_event_exit(sd_event_source_get_event(s), 42);
}

/* Three quick iterations, the slow one, waiting, then the exit. */
static const LoopStats *run_loop(
        LoopWatchdog **w, sd_event *e, const LoopWatchdogOptions *o, sd_event_time_handler_t slow_cb) {
        _cleanup_(sd_event_source_disable_unrefp) sd_event_source *slow = NULL, *stop = NULL;
        sd_event_source *quick[3] = {};
        unsigned n = 0;

        assert_ok(loop_watchdog_new(w, e, o));
        for (size_t i = 0; i < ELEMENTSOF(quick); i++) {
                assert_ok(sd_event_add_defer(e, &quick[i], on_quick, &n));
                assert_ok(sd_event_source_set_enabled(quick[i], SD_EVENT_ONESHOT));
        }
        assert_ok(sd_event_add_time_relative(e, &slow, CLOCK_MONOTONIC, 10 * USEC_PER_MSEC, 1, slow_cb, NULL));
        assert_ok(sd_event_add_time_relative(
                e, &stop, CLOCK_MONOTONIC, 400 * USEC_PER_MSEC, 1, on_exit_timer, NULL));
        assert_int_equal(loop_watchdog_run(*w), 42);
        assert_int_equal(n, 3);
        for (size_t i = 0; i < ELEMENTSOF(quick); i++)
                sd_event_source_disable_unref(quick[i]);
        return loop_watchdog_stats(*w);
}

/* The watchdog on, the slow iteration's callback cb: in a system call (syscall names it, when not
 * NULL) or running. */
static void check_watchdog_on(sd_event_time_handler_t cb, const char *cb_name, const char *syscall) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(loop_watchdog_freep) LoopWatchdog *w = NULL;
        char dir[] = "/tmp/test-loop-watchdog.XXXXXX", *path = NULL, line[8192];
        const LoopStats *s;
        uint64_t total = 0;
        FILE *f;

        assert_non_null(mkdtemp(dir));
        assert_true(asprintf(&path, "%s/loop.jsonl", dir) >= 0);
        assert_ok(sd_event_new(&e));
        s = run_loop(&w, e, &(LoopWatchdogOptions){ .report_path = path }, cb);
        assert_true(loop_watchdog_enabled(w));

        /* five iterations at least (three defers, the slow one, the exit), the waiting not in them */
        assert_true(s->iterations >= 5);
        for (size_t i = 0; i <= LOOP_STATS_N_BOUNDS; i++)
                total += s->buckets[i];
        assert_int_equal(total, s->iterations);
        assert_true(s->worst >= SLOW_MS * USEC_PER_MSEC && s->worst < 3 * USEC_PER_SEC);
        assert_true(s->sum >= s->worst && s->sum < 3 * USEC_PER_SEC);
        assert_int_equal(s->slow, 1);

        /* one line, for the sleep: its time, and a stack through the callback that slept */
        f = fopen(path, "re");
        assert_non_null(f);
        assert_non_null(fgets(line, sizeof(line), f));
        assert_null(fgets(line + strlen(line), (int) (sizeof(line) - strlen(line)), f));
        fclose(f);
        {
                json_auto_t *o = json_loads(line, 0, NULL);
                json_t *stack;

                assert_non_null(o);
                assert_true(json_integer_value(json_object_get(o, "usec")) >= SLOW_MS * 1000);
                assert_string_equal(json_string_value(json_object_get(o, "phase")), "dispatch");
                /* a loop in a system call is read, not interrupted (a signal would cut the wait) */
                if (syscall)
                        assert_string_equal(json_string_value(json_object_get(o, "syscall")), syscall);
                stack = json_object_get(o, "stack");
                assert_true(json_is_array(stack) && json_array_size(stack) >= 2);
                /* named with the sanitizers' symbolizer where there is one: the callback is on the
                 * stack ("where" is the innermost frame of ours, which may be what it called) */
#if defined(__SANITIZE_ADDRESS__)
                {
                        bool found = false;
                        size_t i;
                        json_t *frame;

                        json_array_foreach(stack, i, frame)
                                found = found || strstr(json_string_value(frame), cb_name);
                        assert_true(found);
                        assert_non_null(json_string_value(json_object_get(o, "where")));
                }
#endif
        }
        (void) rm_rf(dir);
        free(path);
}

static void test_watchdog_waiting(void **state) {
        check_watchdog_on(on_slow, "on_slow", "clock_nanosleep");
}

static void test_watchdog_running(void **state) {
        /* running: unwound from the signal (or caught in its clock_gettime() call) */
        check_watchdog_on(on_busy, "on_busy", /* syscall= */ NULL);
}

static void test_watchdog_off(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(loop_watchdog_freep) LoopWatchdog *w = NULL;
        const LoopStats *s;

        /* the statistics are kept all the same; nothing is reported */
        assert_ok(sd_event_new(&e));
        s = run_loop(&w, e, &(LoopWatchdogOptions){}, on_slow);
        assert_false(loop_watchdog_enabled(w));
        assert_true(s->iterations >= 5);
        assert_true(s->worst >= SLOW_MS * USEC_PER_MSEC);
        assert_int_equal(s->slow, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_watchdog_waiting),
                cmocka_unit_test(test_watchdog_running),
                cmocka_unit_test(test_watchdog_off),
        };

        log_set_max_level(LOG_ERR);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
