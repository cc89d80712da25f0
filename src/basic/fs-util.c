/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"

int loop_write(int fd, const void *buf, size_t size) {
        const char *p = buf;

        while (size > 0) {
                ssize_t n = write(fd, p, size);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return -EIO;
                p += n;
                size -= (size_t) n;
        }
        return 0;
}

static int split_path(const char *path, char **ret_dir, const char **ret_base) {
        const char *slash = strrchr(path, '/');
        char *dir;

        if (!slash)
                dir = strdup(".");
        else if (slash == path)
                dir = strdup("/");
        else
                dir = strndup(path, (size_t) (slash - path));
        if (!dir)
                return -ENOMEM;
        *ret_dir = dir;
        *ret_base = slash ? slash + 1 : path;
        return 0;
}

static int write_file_atomic_full(const char *path, const void *data, size_t size, mode_t mode, bool noreplace) {
        _cleanup_free_ char *dir = NULL, *tmp = NULL;
        _cleanup_close_ int dfd = -EBADF, fd = -EBADF;
        const char *base;
        uint64_t rnd;
        int r;

        assert_return(path, -EINVAL);
        assert_return(data || size == 0, -EINVAL);

        r = split_path(path, &dir, &base);
        if (r < 0)
                return r;
        if (*base == 0)
                return -EISDIR;

        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;

        if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
                rnd = (uint64_t) getpid() ^ (uint64_t) (uintptr_t) &rnd;
        if (asprintf(&tmp, ".#%s.%016llx", base, (unsigned long long) rnd) < 0)
                return -ENOMEM;

        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0)
                return -errno;

        r = loop_write(fd, data, size);
        if (r >= 0)
                r = RET_NERRNO(fchmod(fd, mode)); /* the umask must not narrow what the caller asked for */
        if (r >= 0)
                r = RET_NERRNO(fsync(fd));
        if (r >= 0)
                r = noreplace ? RET_NERRNO(renameat2(dfd, tmp, dfd, base, RENAME_NOREPLACE)) :
                                RET_NERRNO(renameat(dfd, tmp, dfd, base));
        if (r < 0) {
                (void) unlinkat(dfd, tmp, 0);
                return noreplace && r == -EEXIST ? 0 : r;
        }
        fd = safe_close(fd);

        /* The rename is durable only once the directory entry is on disk. */
        return RET_NERRNO(fsync(dfd));
}

int write_file_atomic(const char *path, const void *data, size_t size, mode_t mode) {
        return write_file_atomic_full(path, data, size, mode, /* noreplace= */ false);
}

int write_file_atomic_new(const char *path, const void *data, size_t size, mode_t mode) {
        return write_file_atomic_full(path, data, size, mode, /* noreplace= */ true);
}

int write_file_atomic_cleanup(const char *path) {
        _cleanup_free_ char *dir = NULL, *prefix = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        const char *base;
        struct dirent *de;
        int r, n = 0;

        assert_return(path, -EINVAL);
        r = split_path(path, &dir, &base);
        if (r < 0)
                return r;
        if (asprintf(&prefix, ".#%s.", base) < 0)
                return -ENOMEM;
        d = opendir(dir);
        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                const char *suffix;

                if (!strneq(de->d_name, prefix, strlen(prefix)))
                        continue;
                suffix = de->d_name + strlen(prefix);
                if (strlen(suffix) != 16 || strspn(suffix, "0123456789abcdef") != 16)
                        continue;
                if (unlinkat(dirfd(d), de->d_name, 0) >= 0)
                        n++;
        }
        return n;
}

int mkdir_p(const char *path, mode_t mode) {
        _cleanup_free_ char *p = NULL;
        struct stat st;

        assert_return(path && *path, -EINVAL);

        p = strdup(path);
        if (!p)
                return -ENOMEM;

        for (char *s = p + 1;; s++) {
                if (*s != '/' && *s != 0)
                        continue;
                char saved = *s;
                *s = 0;
                if (mkdir(p, mode) < 0) {
                        if (errno != EEXIST)
                                return -errno;
                        if (stat(p, &st) < 0)
                                return -errno;
                        if (!S_ISDIR(st.st_mode))
                                return -ENOTDIR;
                }
                *s = saved;
                if (saved == 0)
                        break;
                while (s[1] == '/')
                        s++;
                if (s[1] == 0)
                        break;
        }
        return 0;
}

int read_full_file(const char *path, size_t max, char **ret, size_t *ret_size) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        size_t size = 0, alloc = 0;
        struct stat st;

        assert_return(path, -EINVAL);

        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (S_ISDIR(st.st_mode))
                return -EISDIR;

        for (;;) {
                if (size + 1 >= alloc) {
                        size_t n = alloc == 0 ? 4096 : alloc * 2;
                        if (n - 2 > max) /* n > max + 2, without overflowing for max near SIZE_MAX */
                                n = max + 2;
                        if (n <= size + 1)
                                return -EFBIG;
                        char *nbuf = realloc(buf, n);
                        if (!nbuf)
                                return -ENOMEM;
                        buf = nbuf;
                        alloc = n;
                }
                ssize_t k = read(fd, buf + size, alloc - size - 1);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        break;
                size += (size_t) k;
                if (size > max)
                        return -EFBIG;
        }
        if (!buf) {
                buf = malloc(1);
                if (!buf)
                        return -ENOMEM;
        }
        buf[size] = 0;
        if (ret_size)
                *ret_size = size;
        *ret = TAKE_PTR(buf);
        return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        if (remove(path) < 0 && errno != ENOENT)
                return -errno;
        return 0;
}

int rm_rf(const char *path) {
        int r;

        assert_return(path && *path && !streq(path, "/"), -EINVAL);
        r = nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        if (r == -1 && errno == ENOENT)
                return 0;
        if (r == -1)
                return -errno;
        return r; /* 0, or what rm_one() returned */
}

char *path_find_executable(const char *name) {
        const char *path = getenv("PATH") ?: "/usr/bin:/bin";

        for (const char *p = path; *p;) {
                size_t n = strcspn(p, ":");
                char *c = NULL;

                if (n > 0 && p[0] == '/' && asprintf(&c, "%.*s/%s", (int) n, p, name) >= 0) {
                        if (access(c, X_OK) >= 0)
                                return c;
                        free(c);
                }
                p += n;
                p += *p == ':';
        }
        return NULL;
}
