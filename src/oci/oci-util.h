/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Small helpers shared by the files of src/oci. */

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include "cleanup.h"

/* A DIR stream over the directory fd refers to, from its start, on a descriptor of its own (fd
 * stays the caller's). NULL with errno set on failure. */
static inline DIR *oci_opendir_fd(int fd) {
        int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        DIR *d;

        if (copy < 0)
                return NULL;
        d = fdopendir(copy);
        if (!d) {
                safe_close(copy);
                return NULL;
        }
        rewinddir(d);
        return d;
}
