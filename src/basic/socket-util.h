/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/un.h>

/* The longest path a unix socket address holds (sun_path less its NUL). */
#define SOCKADDR_UN_PATH_MAX (sizeof(((struct sockaddr_un){}).sun_path) - 1)

/* Fills *ret with an AF_UNIX address for path and returns its length, for bind() and connect().
 * -EINVAL for a NULL or empty path, -ENAMETOOLONG for one longer than SOCKADDR_UN_PATH_MAX; *ret is
 * left alone then. */
int sockaddr_un_set_path(struct sockaddr_un *ret, const char *path);

/* A listening AF_UNIX stream socket at path, non-blocking and close-on-exec; a socket file left
 * there by an earlier run is removed first. Returns the fd or a negative errno. */
int unix_stream_listen(const char *path, int backlog);

/* An AF_UNIX stream socket connected to path, close-on-exec, non-blocking when asked (then the
 * connect may still be in progress). Returns the fd or a negative errno. */
int unix_stream_connect(const char *path, bool nonblock);
