/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fs-util.h"
#include "log.h"
#include "worker.h"

/* One job in flight: allocated by worker_submit(), read by exactly one thread, written back,
 * freed on the loop. */
typedef struct WorkerItem {
        WorkerRunFunc run;
        WorkerDoneFunc done;
        void *job;
        bool ran; /* set by the thread before it hands the item back */
} WorkerItem;

struct Worker {
        sd_event_source *done_source;
        char *name;
        /* jobs: the loop writes, the threads read; results: the threads write, the loop reads */
        int jobs_fd[2], results_fd[2];
        pthread_t *threads;
        unsigned n_threads, n_jobs, max_jobs;
        int nice;
        /* set once, when the pool is freed: queued jobs are handed back without running */
        atomic_bool stopping;
};

static void *worker_thread(void *userdata) {
        Worker *w = userdata;

        if (w->nice != 0)
                (void) setpriority(PRIO_PROCESS, (id_t) gettid(), w->nice); /* this thread only */

        for (;;) {
                WorkerItem *item;
                ssize_t n = read(w->jobs_fd[0], &item, sizeof(item));

                if (n < 0 && errno == EINTR)
                        continue;
                /* EOF: the pool is being freed. Items are written whole (a pointer is less than
                 * PIPE_BUF), so a short read cannot happen. */
                if (n != sizeof(item))
                        break;
                if (!atomic_load(&w->stopping)) {
                        item->run(item->job);
                        item->ran = true;
                }
                /* the results pipe holds every job in flight: this never blocks */
                if (loop_write(w->results_fd[1], &item, sizeof(item)) < 0)
                        break;
        }
        return NULL;
}

static void finish(Worker *w, WorkerItem *item) {
        assert(w->n_jobs > 0);
        w->n_jobs--;
        item->done(item->job, item->ran);
        free(item);
}

/* Finishes what the threads handed back; returns how many. */
static unsigned drain_results(Worker *w) {
        unsigned n = 0;

        for (;;) {
                WorkerItem *item;
                ssize_t k = read(w->results_fd[0], &item, sizeof(item));

                if (k < 0 && errno == EINTR)
                        continue;
                if (k != sizeof(item))
                        return n;
                finish(w, item);
                n++;
        }
}

static int on_results(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        (void) drain_results(userdata);
        return 0;
}

int worker_new(sd_event *event, const WorkerOptions *o, Worker **ret) {
        _cleanup_(worker_freep) Worker *w = NULL;
        sigset_t all, saved;
        int r;

        assert_return(event && o && ret, -EINVAL);
        assert_return(o->threads >= 1 && o->max_jobs >= 1 && o->max_jobs <= WORKER_JOBS_MAX, -EINVAL);

        w = calloc(1, sizeof(Worker));
        if (!w)
                return -ENOMEM;
        w->jobs_fd[0] = w->jobs_fd[1] = w->results_fd[0] = w->results_fd[1] = -EBADF;
        w->max_jobs = o->max_jobs;
        w->nice = o->nice;
        atomic_init(&w->stopping, false);
        w->name = strdup(o->name ?: "worker");
        w->threads = calloc(o->threads, sizeof(pthread_t));
        if (!w->name || !w->threads)
                return -ENOMEM;

        /* The loop never waits on a pipe: it writes jobs without blocking (the count keeps them
         * within the buffer) and reads results until EAGAIN. The threads block on both. */
        if (pipe2(w->jobs_fd, O_CLOEXEC) < 0 || pipe2(w->results_fd, O_CLOEXEC) < 0)
                return -errno;
        if (fcntl(w->jobs_fd[1], F_SETFL, O_NONBLOCK) < 0 || fcntl(w->results_fd[0], F_SETFL, O_NONBLOCK) < 0)
                return -errno;
        for (unsigned i = 0; i < 2; i++) {
                int fd = i == 0 ? w->jobs_fd[1] : w->results_fd[1];
                int size = fcntl(fd, F_GETPIPE_SZ);

                /* a user over fs.pipe-user-pages-soft gets one page per pipe: ask for more, and
                 * take fewer jobs when refused */
                if (size >= 0 && (size_t) size < w->max_jobs * sizeof(void *))
                        (void) fcntl(fd, F_SETPIPE_SZ, (int) (w->max_jobs * sizeof(void *)));
                size = fcntl(fd, F_GETPIPE_SZ);
                if (size < 0)
                        return -errno;
                w->max_jobs = MIN(w->max_jobs, (unsigned) ((size_t) size / sizeof(void *)));
        }

        r = sd_event_add_io(event, &w->done_source, w->results_fd[0], EPOLLIN, on_results, w);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(w->done_source, w->name);

        /* Signals stay with the loop's thread (sd-event reads them from a signalfd). */
        sigfillset(&all);
        r = -pthread_sigmask(SIG_BLOCK, &all, &saved);
        if (r < 0)
                return r;
        for (; w->n_threads < o->threads; w->n_threads++) {
                r = -pthread_create(&w->threads[w->n_threads], NULL, worker_thread, w);
                if (r < 0)
                        break;
                (void) pthread_setname_np(w->threads[w->n_threads], w->name);
        }
        (void) pthread_sigmask(SIG_SETMASK, &saved, NULL);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(w);
        return 0;
}

Worker *worker_free(Worker *w) {
        if (!w)
                return NULL;

        /* Threads skip what is still queued, then read EOF and end. */
        atomic_store(&w->stopping, true);
        w->jobs_fd[1] = safe_close(w->jobs_fd[1]);
        for (unsigned i = 0; i < w->n_threads; i++)
                (void) pthread_join(w->threads[i], NULL);
        w->n_threads = 0;

        /* Every job is back now; their done() may not queue new ones (jobs_fd[1] is closed). */
        if (w->results_fd[0] >= 0)
                (void) drain_results(w);
        if (w->n_jobs > 0)
                log_debug("worker %s: %u jobs lost.", w->name, w->n_jobs);

        w->done_source = sd_event_source_disable_unref(w->done_source);
        safe_close(w->jobs_fd[0]);
        safe_close(w->results_fd[0]);
        safe_close(w->results_fd[1]);
        free(w->threads);
        free(w->name);
        free(w);
        return NULL;
}

int worker_submit(Worker *w, void *job, WorkerRunFunc run, WorkerDoneFunc done) {
        WorkerItem *item;
        ssize_t n;

        assert_return(w && run && done, -EINVAL);
        if (w->jobs_fd[1] < 0)
                return -ESHUTDOWN;
        if (w->n_jobs >= w->max_jobs)
                return -EAGAIN;

        item = malloc(sizeof(WorkerItem));
        if (!item)
                return -ENOMEM;
        *item = (WorkerItem){ .run = run, .done = done, .job = job };
        do
                n = write(w->jobs_fd[1], &item, sizeof(item));
        while (n < 0 && errno == EINTR);
        if (n != sizeof(item)) {
                /* cannot happen while max_jobs fits the pipe; nothing was written */
                free(item);
                return n < 0 ? -errno : -EIO;
        }
        w->n_jobs++;
        return 0;
}

unsigned worker_jobs(Worker *w) {
        return w ? w->n_jobs : 0;
}
