/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "file-writer.h"
#include "fs-util.h"
#include "json-util.h"
#include "worker.h"

/* Jobs handed to the thread at a time; the rest wait in the writer's own list. */
#define FILE_WRITER_IN_FLIGHT 64U

typedef enum FileJobType {
        FILE_JOB_WRITE,
        FILE_JOB_WRITE_JSON,
        FILE_JOB_COPY,
        FILE_JOB_REMOVE,
        FILE_JOB_UNLINK,
        FILE_JOB_SYNC,
} FileJobType;

/* Belongs to the loop until handed to the worker, to the thread while it runs, to the loop again
 * in its done(). */
typedef struct FileJob {
        FileWriter *writer;
        FileJobType type;
        char *path;
        char *from; /* FILE_JOB_COPY */
        void *data;
        json_t *value; /* FILE_JOB_WRITE_JSON: the thread's once handed over */
        size_t size; /* FILE_JOB_COPY: the most of from it reads; FILE_JOB_WRITE_JSON: the most it writes */
        mode_t mode;
        FileWriterDoneFunc done;
        void *userdata;
        int r;
        struct FileJob *next; /* in the writer's waiting list */
} FileJob;

struct FileWriter {
        Worker *worker;
        FileJob *waiting, *waiting_tail; /* not handed to the worker yet, oldest first */
        unsigned n_pending;              /* asked for, done() not run yet */
        bool freeing;
};

static FileJob *file_job_free(FileJob *j) {
        if (!j)
                return NULL;
        free(j->path);
        free(j->from);
        if (j->data) /* it may be a key (a VM's ssh_key) */
                explicit_bzero(j->data, j->size);
        free(j->data);
        json_decref(j->value);
        free(j);
        return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(FileJob *, file_job_free);

/* On the thread (or on the loop, from file_writer_free()). Touches nothing but the job. */
static void file_job_run(void *userdata) {
        FileJob *j = userdata;

        switch (j->type) {
        case FILE_JOB_WRITE:
                j->r = write_file_atomic(j->path, j->data, j->size, j->mode);
                break;
        case FILE_JOB_WRITE_JSON: {
                size_t size = 0;
                _cleanup_free_ char *text = json_dumps_pretty(j->value, &size);

                /* the tree goes with the job: freeing it costs about what rendering it did */
                json_decref(TAKE_PTR(j->value));
                if (!text)
                        j->r = -ENOMEM;
                else if (size > j->size)
                        j->r = -EFBIG;
                else
                        j->r = write_file_atomic(j->path, text, size, j->mode);
                if (text)
                        explicit_bzero(text, size);
                break;
        }
        case FILE_JOB_COPY: {
                _cleanup_free_ char *data = NULL;
                size_t size;

                j->r = read_full_file(j->from, j->size, &data, &size);
                if (j->r >= 0)
                        j->r = write_file_atomic_new(j->path, data, size, j->mode);
                break;
        }
        case FILE_JOB_REMOVE:
                j->r = rm_rf(j->path);
                break;
        case FILE_JOB_UNLINK:
                /* a directory fails with -EISDIR: this removes one file, never a tree */
                j->r = unlink(j->path) < 0 && errno != ENOENT ? -errno : 0;
                break;
        case FILE_JOB_SYNC:
                /* one thread, in order: every job before this one has ended */
                j->r = 0;
                break;
        }
}

static void file_job_finish(FileJob *j) {
        FileWriter *w = j->writer;

        assert(w->n_pending > 0);
        w->n_pending--;
        if (j->done)
                j->done(j->r, j->path, j->userdata);
        file_job_free(j);
}

static void dispatch(FileWriter *w);

static void on_job_done(void *userdata, bool ran) {
        FileJob *j = userdata;
        FileWriter *w = j->writer;

        /* only while the pool is freed: the job was never started, and runs here, still in order */
        if (!ran)
                file_job_run(j);
        file_job_finish(j);
        dispatch(w);
}

/* Hands waiting jobs to the worker, oldest first, while it takes them. */
static void dispatch(FileWriter *w) {
        while (w->waiting && !w->freeing && worker_jobs(w->worker) < FILE_WRITER_IN_FLIGHT) {
                FileJob *j = w->waiting;
                int r;

                r = worker_submit(w->worker, j, file_job_run, on_job_done);
                if (r < 0 && worker_jobs(w->worker) > 0)
                        return; /* again when one of those is back */
                w->waiting = j->next;
                if (!w->waiting)
                        w->waiting_tail = NULL;
                j->next = NULL;
                if (r < 0) {
                        /* refused with nothing in flight (out of memory): here, still in order */
                        file_job_run(j);
                        file_job_finish(j);
                }
        }
}

static int enqueue(FileWriter *w, FileJob *j) {
        assert(!j->next);
        j->writer = w;
        if (w->waiting_tail)
                w->waiting_tail->next = j;
        else
                w->waiting = j;
        w->waiting_tail = j;
        w->n_pending++;
        dispatch(w);
        return 0;
}

static int file_job_new(
        FileJobType type, const char *path, FileWriterDoneFunc done, void *userdata, FileJob **ret) {
        _cleanup_(file_job_freep) FileJob *j = NULL;

        j = calloc(1, sizeof(FileJob));
        if (!j)
                return -ENOMEM;
        *j = (FileJob){ .type = type, .done = done, .userdata = userdata };
        if (path) {
                j->path = strdup(path);
                if (!j->path)
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(j);
        return 0;
}

int file_writer_new(sd_event *event, const char *name, FileWriter **ret) {
        _cleanup_(file_writer_freep) FileWriter *w = NULL;
        int r;

        assert_return(event && ret, -EINVAL);

        w = calloc(1, sizeof(FileWriter));
        if (!w)
                return -ENOMEM;
        /* one thread: the jobs run in the order they were asked for */
        r = worker_new(
                event,
                &(WorkerOptions){
                        .name = name ?: "file-writer",
                        .threads = 1,
                        .max_jobs = FILE_WRITER_IN_FLIGHT,
                },
                &w->worker);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(w);
        return 0;
}

FileWriter *file_writer_free(FileWriter *w) {
        if (!w)
                return NULL;

        /* The job running ends; the queued ones come back unstarted and run here, in order
         * (on_job_done()); then what never reached the worker, including what their done() asked
         * for meanwhile. */
        w->freeing = true;
        w->worker = worker_free(w->worker);
        while (w->waiting) {
                FileJob *j = w->waiting;

                w->waiting = j->next;
                if (!w->waiting)
                        w->waiting_tail = NULL;
                j->next = NULL;
                file_job_run(j);
                file_job_finish(j);
        }
        assert(w->n_pending == 0);
        free(w);
        return NULL;
}

int file_writer_write(
        FileWriter *w,
        const char *path,
        const void *data,
        size_t size,
        mode_t mode,
        FileWriterDoneFunc done,
        void *userdata) {
        _cleanup_(file_job_freep) FileJob *j = NULL;
        int r;

        assert_return(w && path && (data || size == 0), -EINVAL);

        r = file_job_new(FILE_JOB_WRITE, path, done, userdata, &j);
        if (r < 0)
                return r;
        j->data = malloc(size ?: 1);
        if (!j->data)
                return -ENOMEM;
        if (size > 0)
                memcpy(j->data, data, size);
        j->size = size;
        j->mode = mode;
        return enqueue(w, TAKE_PTR(j));
}

int file_writer_write_json(
        FileWriter *w, const char *path, json_t *v, size_t max, mode_t mode, FileWriterDoneFunc done, void *userdata) {
        _cleanup_(file_job_freep) FileJob *j = NULL;
        json_auto_t *value = v;
        int r;

        assert_return(w && path && v, -EINVAL);

        r = file_job_new(FILE_JOB_WRITE_JSON, path, done, userdata, &j);
        if (r < 0)
                return r;
        j->value = TAKE_PTR(value);
        j->size = max;
        j->mode = mode;
        return enqueue(w, TAKE_PTR(j));
}

int file_writer_copy_new(
        FileWriter *w,
        const char *from,
        const char *to,
        size_t max,
        mode_t mode,
        FileWriterDoneFunc done,
        void *userdata) {
        _cleanup_(file_job_freep) FileJob *j = NULL;
        int r;

        assert_return(w && from && to, -EINVAL);

        r = file_job_new(FILE_JOB_COPY, to, done, userdata, &j);
        if (r < 0)
                return r;
        j->from = strdup(from);
        if (!j->from)
                return -ENOMEM;
        j->size = max;
        j->mode = mode;
        return enqueue(w, TAKE_PTR(j));
}

/* A job that needs nothing but its path. */
static int enqueue_path_job(
        FileWriter *w, FileJobType type, const char *path, FileWriterDoneFunc done, void *userdata) {
        _cleanup_(file_job_freep) FileJob *j = NULL;
        int r;

        assert_return(w && path, -EINVAL);

        r = file_job_new(type, path, done, userdata, &j);
        if (r < 0)
                return r;
        return enqueue(w, TAKE_PTR(j));
}

int file_writer_remove(FileWriter *w, const char *path, FileWriterDoneFunc done, void *userdata) {
        return enqueue_path_job(w, FILE_JOB_REMOVE, path, done, userdata);
}

int file_writer_unlink(FileWriter *w, const char *path, FileWriterDoneFunc done, void *userdata) {
        return enqueue_path_job(w, FILE_JOB_UNLINK, path, done, userdata);
}

int file_writer_sync(FileWriter *w, FileWriterDoneFunc done, void *userdata) {
        _cleanup_(file_job_freep) FileJob *j = NULL;
        int r;

        assert_return(w && done, -EINVAL);

        r = file_job_new(FILE_JOB_SYNC, /* path= */ NULL, done, userdata, &j);
        if (r < 0)
                return r;
        return enqueue(w, TAKE_PTR(j));
}

unsigned file_writer_pending(FileWriter *w) {
        return w ? w->n_pending : 0;
}
