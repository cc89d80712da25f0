/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <unistd.h>

#include "cleanup.h"
#include "time-util.h"
#include "worker.h"

/* The pool against a real sd-event loop: jobs run on another thread, come back to the loop in
 * order, and a freed pool hands back what it never ran. */

static pthread_t loop_thread;

typedef struct Job {
        pthread_t ran_on; /* written by run(), read by done() after the hand-off */
        int started_fd;   /* run() writes a byte to it first, when >= 0 */
        int block_fd;     /* run() then waits for a byte on it, when >= 0 */
        bool done, ran;
        unsigned order; /* 1, 2, …: when done() came */
        unsigned *n_done;
        sd_event *event; /* done() exits the loop when *n_done reaches exit_after */
        unsigned exit_after;
} Job;

static void job_run(void *userdata) {
        Job *j = userdata;
        char c;

        j->ran_on = pthread_self();
        if (j->started_fd >= 0)
                assert_int_equal(write(j->started_fd, "s", 1), 1);
        if (j->block_fd >= 0)
                assert_int_equal(read(j->block_fd, &c, 1), 1);
}

static void job_done(void *userdata, bool ran) {
        Job *j = userdata;

        assert_false(j->done); /* exactly once */
        assert_true(pthread_equal(pthread_self(), loop_thread));
        j->done = true;
        j->ran = ran;
        j->order = ++*j->n_done;
        if (j->event && *j->n_done == j->exit_after)
                (void) sd_event_exit(j->event, 0);
}

static int on_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        fail_msg("the jobs did not come back within 30 s");
        return 0;
}

/* Twenty jobs through a pool of threads; with one thread they come back in the order they went. */
static void run_jobs(unsigned threads) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *timeout = NULL;
        _cleanup_(worker_freep) Worker *w = NULL;
        Job jobs[20], extra;
        unsigned n_done = 0;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(
                worker_new(
                        e,
                        &(WorkerOptions){ .name = "test-worker", .threads = threads, .max_jobs = 20, .nice = 5 },
                        &w),
                0);
        for (size_t i = 0; i < ELEMENTSOF(jobs); i++) {
                jobs[i] = (Job){ .started_fd = -EBADF,
                                 .block_fd = -EBADF,
                                 .n_done = &n_done,
                                 .event = e,
                                 .exit_after = ELEMENTSOF(jobs) };
                assert_int_equal(worker_submit(w, &jobs[i], job_run, job_done), 0);
        }
        assert_int_equal(worker_jobs(w), 20);
        /* full: refused, and not taken */
        extra = (Job){ .started_fd = -EBADF, .block_fd = -EBADF, .n_done = &n_done };
        assert_int_equal(worker_submit(w, &extra, job_run, job_done), -EAGAIN);

        assert_int_equal(
                sd_event_add_time_relative(e, &timeout, CLOCK_MONOTONIC, 30 * USEC_PER_SEC, 0, on_timeout, NULL),
                0);
        assert_int_equal(sd_event_loop(e), 0);

        assert_int_equal(n_done, 20);
        assert_int_equal(worker_jobs(w), 0);
        assert_false(extra.done);
        for (size_t i = 0; i < ELEMENTSOF(jobs); i++) {
                assert_true(jobs[i].done && jobs[i].ran);
                assert_false(pthread_equal(jobs[i].ran_on, loop_thread));
                if (threads == 1)
                        assert_int_equal(jobs[i].order, i + 1);
        }
        /* taken again once there is room; finished by the free at the latest */
        assert_int_equal(worker_submit(w, &extra, job_run, job_done), 0);
        w = worker_free(w);
        assert_true(extra.done);
}

static void test_jobs_run_off_the_loop(void **state) {
        run_jobs(1);
        run_jobs(3);
}

typedef struct Release {
        int fd;
} Release;

static void *release_later(void *userdata) {
        Release *r = userdata;

        (void) usleep(300 * 1000);
        assert_int_equal(write(r->fd, "x", 1), 1);
        return NULL;
}

static void test_free_hands_back_queued_jobs(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        Worker *w = NULL;
        int block[2], started[2];
        Job first, queued[3];
        char c;
        unsigned n_done = 0;
        pthread_t t;
        Release rel;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(pipe(block), 0);
        assert_int_equal(pipe(started), 0);
        assert_int_equal(worker_new(e, &(WorkerOptions){ .threads = 1, .max_jobs = 8 }, &w), 0);
        first = (Job){ .started_fd = started[1], .block_fd = block[0], .n_done = &n_done };
        assert_int_equal(worker_submit(w, &first, job_run, job_done), 0);
        for (size_t i = 0; i < ELEMENTSOF(queued); i++) {
                queued[i] = (Job){ .started_fd = -EBADF, .block_fd = -EBADF, .n_done = &n_done };
                assert_int_equal(worker_submit(w, &queued[i], job_run, job_done), 0);
        }

        /* the first job runs and is held until after the pool started to stop: the free waits for
         * it, and the three behind it never run */
        assert_int_equal(read(started[0], &c, 1), 1);
        rel.fd = block[1];
        assert_int_equal(pthread_create(&t, NULL, release_later, &rel), 0);
        w = worker_free(w);
        assert_int_equal(pthread_join(t, NULL), 0);

        assert_int_equal(n_done, 4);
        assert_true(first.done && first.ran);
        for (size_t i = 0; i < ELEMENTSOF(queued); i++)
                assert_true(queued[i].done && !queued[i].ran);
        close(block[0]);
        close(block[1]);
        close(started[0]);
        close(started[1]);
}

static void test_bad_options(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        Worker *w = NULL;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(worker_new(e, &(WorkerOptions){ .threads = 0, .max_jobs = 1 }, &w), -EINVAL);
        assert_int_equal(worker_new(e, &(WorkerOptions){ .threads = 1, .max_jobs = 0 }, &w), -EINVAL);
        assert_int_equal(
                worker_new(e, &(WorkerOptions){ .threads = 1, .max_jobs = WORKER_JOBS_MAX + 1 }, &w), -EINVAL);
        assert_null(w);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_jobs_run_off_the_loop),
                cmocka_unit_test(test_free_hands_back_queued_jobs),
                cmocka_unit_test(test_bad_options),
        };

        loop_thread = pthread_self();
        return cmocka_run_group_tests(tests, NULL, NULL);
}
