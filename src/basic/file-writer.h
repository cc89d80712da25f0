/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* Writes files off the loop, in the order they were asked for. Every request (an atomic write, a
 * copy, a removal, a barrier) is a job for one worker thread of its own, so the jobs run one after
 * the other, in order: a later write of a path never overtakes an earlier one, a removal of a
 * directory comes after every write into it asked for before, and a barrier completes once every
 * job before it has. The loop only copies the data and hands the job over; the fsync()s happen on
 * the thread. What the pool's pipe cannot take waits in a list of the writer's, still in order, so a
 * request is never refused for being one too many.
 *
 * Durability: a file is on disk (write_file_atomic()'s guarantee) when its done() runs, not when
 * the request returns. Callers that answer someone about a file wait for its done(), or for a
 * barrier asked for after it.
 *
 * file_writer_free() finishes every job still queued, on the calling thread (it blocks), in order,
 * and calls their done(): nothing asked for is lost when the daemon stops. */

typedef struct FileWriter FileWriter;

/* On the loop, exactly once per accepted request: r is the job's result (0 or a negative errno);
 * path is the request's (borrowed, NULL for a barrier). */
typedef void (*FileWriterDoneFunc)(int r, const char *path, void *userdata);

int file_writer_new(sd_event *event, const char *name, FileWriter **ret);
FileWriter *file_writer_free(FileWriter *w);
DEFINE_TRIVIAL_CLEANUP_FUNC(FileWriter *, file_writer_free);

/* write_file_atomic(path, data, size, mode) on the thread; data is copied. done may be NULL. */
int file_writer_write(
        FileWriter *w,
        const char *path,
        const void *data,
        size_t size,
        mode_t mode,
        FileWriterDoneFunc done,
        void *userdata);
/* Writes v (taken, whatever happens) rendered by json_dumps_pretty(), as file_writer_write() writes
 * data; the rendering happens on the thread too, so a record of megabytes costs the loop nothing.
 * A rendering over max bytes is -EFBIG, and not written. From the call on, nothing on the loop may
 * change v or a value inside it (values shared with it may only be released: jansson counts
 * references atomically). */
int file_writer_write_json(
        FileWriter *w, const char *path, json_t *v, size_t max, mode_t mode, FileWriterDoneFunc done, void *userdata);
/* Copies from to a new file to (write_file_atomic_new(): an existing one is kept), reading at most
 * max bytes of from (-EFBIG beyond). */
int file_writer_copy_new(
        FileWriter *w,
        const char *from,
        const char *to,
        size_t max,
        mode_t mode,
        FileWriterDoneFunc done,
        void *userdata);
/* rm_rf(path) on the thread, after every job asked for before. */
int file_writer_remove(FileWriter *w, const char *path, FileWriterDoneFunc done, void *userdata);
/* unlink(path) on the thread, after every job asked for before: a missing file is no error, a
 * directory is (-EISDIR). Unlinking a large written file frees its blocks, which takes the file
 * system hundreds of milliseconds for a 10 GiB disk. */
int file_writer_unlink(FileWriter *w, const char *path, FileWriterDoneFunc done, void *userdata);
/* done(0, NULL, userdata) once every job asked for before has finished. */
int file_writer_sync(FileWriter *w, FileWriterDoneFunc done, void *userdata);

/* Jobs asked for whose done() has not run yet. */
unsigned file_writer_pending(FileWriter *w);
