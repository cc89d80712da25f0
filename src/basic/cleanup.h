/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "macro.h"

#define _cleanup_(f) __attribute__((__cleanup__(f)))
#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_fclose_ _cleanup_(fclosep)
#define _cleanup_strv_free_ _cleanup_(strv_freep)

/* Hands ownership out of a cleanup-managed variable, leaving the variable empty. */
#define TAKE_GENERIC(var, type, nullvalue)    \
        ({                                    \
                type *_pvar_ = &(var);        \
                type _var_ = *_pvar_;         \
                type _nullvalue_ = nullvalue; \
                *_pvar_ = _nullvalue_;        \
                _var_;                        \
        })
#define TAKE_PTR(ptr) TAKE_GENERIC(ptr, typeof(ptr), NULL)
#define TAKE_FD(fd) TAKE_GENERIC(fd, int, -EBADF)

#define DEFINE_TRIVIAL_CLEANUP_FUNC_FULL(type, func, empty) \
        static inline void func##p(type *p) {               \
                if (*p != (empty))                          \
                        (void) func(*p);                    \
        }
#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func) DEFINE_TRIVIAL_CLEANUP_FUNC_FULL(type, func, NULL)

/* Frees and returns NULL, for "p = mfree(p)". */
static inline void *mfree(void *p) {
        free(p);
        return NULL;
}

static inline void freep(void *p) {
        free(*(void **) p);
}

/* Closes fd unless it is negative; always returns -EBADF so callers can write fd = safe_close(fd). */
static inline int safe_close(int fd) {
        if (fd >= 0) {
                int saved = errno;
                (void) close(fd);
                errno = saved;
        }
        return -EBADF;
}

static inline void closep(int *fd) {
        (void) safe_close(*fd);
}

static inline void fclosep(FILE **f) {
        if (*f)
                (void) fclose(*f);
}

DEFINE_TRIVIAL_CLEANUP_FUNC(DIR *, closedir);

static inline char **strv_free(char **l) {
        if (!l)
                return NULL;
        for (char **i = l; *i; i++)
                free(*i);
        free(l);
        return NULL;
}

static inline void strv_freep(char ***l) {
        (void) strv_free(*l);
}
