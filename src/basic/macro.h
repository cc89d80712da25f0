/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define _printf_(a, b) __attribute__((__format__(printf, a, b)))
#define _unused_ __attribute__((__unused__))
#define _const_ __attribute__((__const__))
#define _pure_ __attribute__((__pure__))
#define _sentinel_ __attribute__((__sentinel__))
#define _noreturn_ __attribute__((__noreturn__))
#define _warn_unused_result_ __attribute__((__warn_unused_result__))
#define _fallthrough_ __attribute__((__fallthrough__))
#define _likely_(x) (__builtin_expect(!!(x), 1))
#define _unlikely_(x) (__builtin_expect(!!(x), 0))

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))

/* Whether x equals one of the values that follow: IN_SET(state, A, B, C). */
#define IN_SET(x, first, ...)                                                  \
        ({                                                                     \
                const typeof(first) _in_set_values[] = { first, __VA_ARGS__ }; \
                const typeof(first) _in_set_x = (x);                           \
                bool _in_set_found = false;                                    \
                for (size_t _i = 0; _i < ELEMENTSOF(_in_set_values); _i++)     \
                        if (_in_set_values[_i] == _in_set_x) {                 \
                                _in_set_found = true;                          \
                                break;                                         \
                        }                                                      \
                _in_set_found;                                                 \
        })

#define MIN(a, b)                                  \
        ({                                         \
                const typeof(a) _min_a = (a);      \
                const typeof(b) _min_b = (b);      \
                _min_a < _min_b ? _min_a : _min_b; \
        })
#define MAX(a, b)                                  \
        ({                                         \
                const typeof(a) _max_a = (a);      \
                const typeof(b) _max_b = (b);      \
                _max_a > _max_b ? _max_a : _max_b; \
        })

#define streq(a, b) (strcmp((a), (b)) == 0)
#define strneq(a, b, n) (strncmp((a), (b), (n)) == 0)

/* Validates an argument that crosses a module boundary: on failure the caller gets 'r' back. */
#define assert_return(expr, r)           \
        do {                             \
                if (_unlikely_(!(expr))) \
                        return (r);      \
        } while (false)

/* Converts a libc "-1 and errno" result into a negative errno. */
/* asprintf() that leaves NULL behind when it fails (the pointer is undefined otherwise), for
 * messages whose absence is handled. */
#define asprintf_or_null(p, ...)                    \
        do {                                        \
                if (asprintf((p), __VA_ARGS__) < 0) \
                        *(p) = NULL;                \
        } while (0)

/* The rest of s after prefix, or NULL when s does not start with it. */
static inline const char *startswith(const char *s, const char *prefix) {
        size_t n = strlen(prefix);
        return strncmp(s, prefix, n) == 0 ? s + n : NULL;
}

static inline size_t strv_length(char *const *l) {
        size_t n = 0;
        while (l && l[n])
                n++;
        return n;
}

static inline int negative_errno(void) {
        return errno > 0 ? -errno : -EIO;
}
#define RET_NERRNO(expr)                        \
        ({                                      \
                typeof(expr) _r = (expr);       \
                _r < 0 ? negative_errno() : _r; \
        })

#define ABS(x) ((x) < 0 ? -(x) : (x))
