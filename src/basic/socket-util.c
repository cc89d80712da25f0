/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "cleanup.h"
#include "socket-util.h"

int sockaddr_un_set_path(struct sockaddr_un *ret, const char *path) {
        size_t n;

        if (!path || !*path)
                return -EINVAL;
        n = strlen(path);
        if (n > SOCKADDR_UN_PATH_MAX)
                return -ENAMETOOLONG;
        *ret = (struct sockaddr_un){ .sun_family = AF_UNIX };
        memcpy(ret->sun_path, path, n + 1);
        return (int) (offsetof(struct sockaddr_un, sun_path) + n + 1);
}

/* A stream socket for path, and the address to bind or connect it to. */
static int unix_stream_socket(const char *path, int flags, struct sockaddr_un *ret_sa, socklen_t *ret_len) {
        int len, fd;

        len = sockaddr_un_set_path(ret_sa, path);
        if (len < 0)
                return len;
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
        if (fd < 0)
                return -errno;
        *ret_len = (socklen_t) len;
        return fd;
}

int unix_stream_listen(const char *path, int backlog) {
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_un sa;
        socklen_t len = 0;

        fd = unix_stream_socket(path, SOCK_NONBLOCK, &sa, &len);
        if (fd < 0)
                return fd;
        (void) unlink(path);
        if (bind(fd, (struct sockaddr *) &sa, len) < 0 || listen(fd, backlog) < 0)
                return -errno;
        return TAKE_FD(fd);
}

int unix_stream_connect(const char *path, bool nonblock) {
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_un sa;
        socklen_t len = 0;

        fd = unix_stream_socket(path, nonblock ? SOCK_NONBLOCK : 0, &sa, &len);
        if (fd < 0)
                return fd;
        if (connect(fd, (struct sockaddr *) &sa, len) < 0 && !(nonblock && errno == EINPROGRESS))
                return -errno;
        return TAKE_FD(fd);
}
