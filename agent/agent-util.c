/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "agent-util.h"
#include "cleanup.h"

static int agent_log_max_level = LOG_INFO;

void agent_log_set_max_level(int level) {
        assert(level >= LOG_EMERG && level <= LOG_DEBUG);
        agent_log_max_level = level;
}

int agent_log_get_max_level(void) {
        return agent_log_max_level;
}

void agent_log_internal(int level, const char *format, ...) {
        const char *prefix = level <= LOG_ERR ? "error: " :
                level == LOG_WARNING          ? "warning: " :
                level == LOG_DEBUG            ? "debug: " :
                                                "";
        char msg[2048];
        va_list ap;

        va_start(ap, format);
        (void) vsnprintf(msg, sizeof(msg), format, ap);
        va_end(ap);
        (void) fprintf(stderr, "vm-agent: %s%s\n", prefix, msg);
}

int read_file_capped(const char *path, size_t max, uint8_t **ret, size_t *ret_size) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ uint8_t *buf = NULL;
        size_t size = 0, allocated = 0;

        assert_return(path, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(ret_size, -EINVAL);

        fd = RET_NERRNO(open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY));
        if (fd < 0)
                return fd;

        for (;;) {
                ssize_t n;

                if (size == allocated) {
                        /* One byte beyond max tells an oversized file from one of exactly max bytes. */
                        size_t want = MIN(MAX(allocated * 2, (size_t) 64 * 1024), max + 1);
                        uint8_t *t;

                        if (want <= allocated)
                                return -EFBIG;
                        t = realloc(buf, want);
                        if (!t)
                                return -ENOMEM;
                        buf = t;
                        allocated = want;
                }
                n = read(fd, buf + size, allocated - size);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                size += (size_t) n;
                if (size > max)
                        return -EFBIG;
        }

        *ret = TAKE_PTR(buf);
        *ret_size = size;
        return 0;
}

char *text_trim(const void *data, size_t size, size_t max) {
        const char *p = data;
        char *s;

        while (size > 0 && isspace((unsigned char) p[0])) {
                p++;
                size--;
        }
        while (size > 0 && isspace((unsigned char) p[size - 1]))
                size--;
        size = MIN(size, max);
        s = malloc(size + 1);
        if (!s)
                return NULL;
        memcpy(s, p, size);
        s[size] = 0;
        return s;
}
