/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>
#include <sys/types.h>

/* Replaces path with data so that, whatever happens, path holds either its old content or the
 * new one in full: the data goes to a temporary file in the same directory, which is fsynced,
 * renamed over path, and the directory is fsynced. The temporary file never survives a failure. */
int write_file_atomic(const char *path, const void *data, size_t size, mode_t mode);
/* The same for a file that is written once: an existing path is left as it is (0, nothing written).
 * A crash never leaves path half written, so an existing path is always whole. */
int write_file_atomic_new(const char *path, const void *data, size_t size, mode_t mode);

/* Removes the temporary files write_file_atomic(path, …) leaves when the process dies between
 * creating and renaming one. Only for a caller that owns the directory (the state dir's lock).
 * Returns the number removed. */
int write_file_atomic_cleanup(const char *path);

/* The absolute path of the executable name in a directory of $PATH, or NULL. */
char *path_find_executable(const char *name);

/* Creates path and its missing parents with mode; existing directories are left as they are. */
int mkdir_p(const char *path, mode_t mode);

/* Removes path and, for a directory, everything below it, without following symlinks. A missing
 * path is not an error. */
int rm_rf(const char *path);

/* Reads a whole regular file, refusing more than max bytes (-EFBIG). The buffer is NUL-terminated. */
int read_full_file(const char *path, size_t max, char **ret, size_t *ret_size);

/* Writes all of buf to fd, retrying short writes and EINTR. */
int loop_write(int fd, const void *buf, size_t size);
