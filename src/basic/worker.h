/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* A small, fixed pool of threads for blocking work (parsing a guest's upload, writing and fsyncing
 * it), so that the event loop never waits on it. Jobs travel as pointers: the loop writes a job into
 * a pipe, a thread takes it, runs it and writes it back into a second pipe, and the loop finishes it.
 * A job belongs to one side at a time (run() on a thread, then done() on the loop), so nothing is
 * shared and nothing is locked; the pipes are the hand-off. Jobs run in the order they came. */

typedef struct Worker Worker;

/* Runs on a worker thread. May block; touches nothing but its job (no Manager, no Vm, no logging). */
typedef void (*WorkerRunFunc)(void *job);
/* Runs on the loop, exactly once for every job worker_submit() took: ran is false when the pool was
 * freed before a thread got to the job (run() was then never called). */
typedef void (*WorkerDoneFunc)(void *job, bool ran);

typedef struct WorkerOptions {
        const char *name;  /* thread name (15 characters at most), also the event source's description */
        unsigned threads;  /* 1 or more */
        unsigned max_jobs; /* queued and running; worker_submit() refuses beyond (-EAGAIN) */
        int nice;          /* the threads' nice value (0: inherited), so that the loop wins the CPU */
} WorkerOptions;

/* The largest max_jobs: every job in flight fits in a pipe's buffer, so no write ever blocks. */
#define WORKER_JOBS_MAX 4096U

int worker_new(sd_event *event, const WorkerOptions *o, Worker **ret);
/* Ends the pool: jobs not yet started are finished with done(job, false) at once, running ones are
 * waited for (the loop blocks for as long as the longest of them) and finished with done(job, true).
 * Not from a done() callback of the same pool. */
Worker *worker_free(Worker *w);
DEFINE_TRIVIAL_CLEANUP_FUNC(Worker *, worker_free);

/* Queues job. -EAGAIN when max_jobs are in flight, -ESHUTDOWN while the pool is being freed; the
 * job is then not taken and done() is not called. */
int worker_submit(Worker *w, void *job, WorkerRunFunc run, WorkerDoneFunc done);
/* Jobs queued or running. */
unsigned worker_jobs(Worker *w);
