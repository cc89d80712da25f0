/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* cmocka needs these before <cmocka.h>. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* "EINVAL" for -EINVAL (or EINVAL), "ok" for values that are not errors. */
static inline const char *test_errno_name(intmax_t r) {
        const char *n = NULL;

        if (r >= 0)
                return "ok";
        if (r > -4096)
                n = strerrorname_np((int) -r);
        return n ?: "unknown errno";
}

static inline const char *test_strerror(intmax_t r) {
        if (r >= 0)
                return "success";
        return r > -4096 ? strerror((int) -r) : "not an errno";
}

/* Fails unless expr (an int returning 0/positive or a negative errno) succeeded, naming the error. */
#define assert_ok(expr)                                                \
        do {                                                           \
                intmax_t _test_r = (intmax_t) (expr);                  \
                if (_test_r < 0)                                       \
                        fail_msg(                                      \
                                "%s = %jd (%s: %s), expected success", \
                                #expr,                                 \
                                _test_r,                               \
                                test_errno_name(_test_r),              \
                                test_strerror(_test_r));               \
        } while (0)

/* Fails unless expr returned exactly the expected value, e.g. assert_errno(r, -EINVAL). */
#define assert_errno(expr, expected)                                    \
        do {                                                            \
                intmax_t _test_r = (intmax_t) (expr);                   \
                intmax_t _test_e = (intmax_t) (expected);               \
                if (_test_r != _test_e)                                 \
                        fail_msg(                                       \
                                "%s = %jd (%s: %s), expected %jd (%s)", \
                                #expr,                                  \
                                _test_r,                                \
                                test_errno_name(_test_r),               \
                                test_strerror(_test_r),                 \
                                _test_e,                                \
                                test_errno_name(_test_e));              \
        } while (0)

/* Fails unless the NUL-terminated string s starts with prefix. */
#define assert_startswith(s, prefix)                                                     \
        do {                                                                             \
                const char *_test_s = (s), *_test_p = (prefix);                          \
                assert_non_null(_test_s);                                                \
                if (strncmp(_test_s, _test_p, strlen(_test_p)) != 0)                     \
                        fail_msg("\"%s\" does not start with \"%s\"", _test_s, _test_p); \
        } while (0)

/* Fails unless needle occurs in the NUL-terminated string s. */
#define assert_contains(s, needle)                                                    \
        do {                                                                          \
                const char *_test_s = (s), *_test_n = (needle);                       \
                assert_non_null(_test_s);                                             \
                if (!strstr(_test_s, _test_n))                                        \
                        fail_msg("\"%s\" does not contain \"%s\"", _test_s, _test_n); \
        } while (0)

/* A new string of n times c. */
static inline char *test_repeat(char c, size_t n) {
        char *s = malloc(n + 1);

        assert_non_null(s);
        memset(s, c, n);
        s[n] = 0;
        return s;
}

/* Stderr swapped for a memfd while the code under test logs. test_capture_end() puts it back before
 * anything is asserted, so cmocka's own failure messages are never swallowed, and returns everything
 * written meanwhile as a new string. */
typedef struct TestCapture {
        int saved;
        int fd;
} TestCapture;

static inline void test_capture_start(TestCapture *c) {
        c->fd = memfd_create("stderr", MFD_CLOEXEC);
        assert_true(c->fd >= 0);
        c->saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        assert_true(c->saved >= 0);
        assert_true(dup2(c->fd, STDERR_FILENO) == STDERR_FILENO);
}

static inline char *test_capture_end(TestCapture *c) {
        char *buf = NULL;
        size_t size = 0;
        ssize_t k;

        assert_true(dup2(c->saved, STDERR_FILENO) == STDERR_FILENO);
        close(c->saved);
        c->saved = -1;
        do {
                char *n = realloc(buf, size + 4096 + 1);
                assert_non_null(n);
                buf = n;
                k = pread(c->fd, buf + size, 4096, (off_t) size);
                assert_true(k >= 0);
                size += (size_t) k;
        } while (k > 0);
        buf[size] = 0;
        close(c->fd);
        c->fd = -1;
        return buf;
}
