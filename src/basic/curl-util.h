/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Cleanups for libcurl's types, kept in one place (link with libcurl to use them). */

#include <curl/curl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(CURL *, curl_easy_cleanup);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct curl_slist *, curl_slist_free_all);

/* A response body gathered in memory, NUL-terminated: curl_buffer_write() as CURLOPT_WRITEFUNCTION
 * and the buffer as CURLOPT_WRITEDATA. A body larger than max aborts the transfer (libcurl answers
 * CURLE_WRITE_ERROR) with too_big set, so that the caller can say why. */
typedef struct CurlBuffer {
        char *data; /* NULL until the first byte */
        size_t len;
        size_t max;
        bool too_big;
} CurlBuffer;

static inline size_t curl_buffer_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
        CurlBuffer *b = userdata;
        size_t n = size * nmemb;
        char *d;

        if (b->len + n > b->max) {
                b->too_big = true;
                return 0;
        }
        d = realloc(b->data, b->len + n + 1);
        if (!d)
                return 0;
        memcpy(d + b->len, ptr, n);
        b->len += n;
        d[b->len] = 0;
        b->data = d;
        return n;
}

static inline void curl_buffer_done(CurlBuffer *b) {
        b->data = mfree(b->data);
        b->len = 0;
}
