/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "api-error.h"
#include "cleanup.h"

/* Each code's name on the wire and the sentinel its messages start with. How a transport answers
 * a code (an HTTP status, for one) is the transport's business: see http_status_from_error(). */
static const struct {
        const char *name;
        const char *sentinel;
} codes[_API_ERROR_CODE_MAX] = {
        [API_ERROR_INTERNAL] = { "internal_error", NULL },
        [API_ERROR_NOT_FOUND] = { "not_found", "not found" },
        [API_ERROR_INVALID_REQUEST] = { "invalid_request", "invalid request" },
        [API_ERROR_CONFLICT] = { "conflict", "conflict" },
        [API_ERROR_UNSUPPORTED] = { "unsupported", "unsupported" },
        [API_ERROR_TIMEOUT] = { "timeout", "timeout" },
        [API_ERROR_VM_FAILED] = { "vm_failed", "vm failed" },
        [API_ERROR_UNAUTHORIZED] = { "unauthorized", "unauthorized" },
};

const char *api_error_code_to_string(ApiErrorCode c) {
        if (c < 0 || c >= _API_ERROR_CODE_MAX)
                return NULL;
        return codes[c].name;
}

ApiErrorCode api_error_code_from_string(const char *s) {
        if (!s)
                return _API_ERROR_CODE_INVALID;
        for (int i = 0; i < _API_ERROR_CODE_MAX; i++)
                if (streq(s, codes[i].name))
                        return (ApiErrorCode) i;
        return _API_ERROR_CODE_INVALID;
}

int api_error_set(ApiError *reterr, int r, ApiErrorCode code, const char *format, ...) {
        _cleanup_free_ char *detail = NULL, *msg = NULL;
        va_list ap;

        assert(r < 0);
        assert(code >= 0 && code < _API_ERROR_CODE_MAX);

        if (!reterr)
                return r;

        va_start(ap, format);
        int k = vasprintf(&detail, format, ap);
        va_end(ap);
        if (k < 0)
                detail = NULL;

        if (codes[code].sentinel)
                k = asprintf(&msg, "%s: %s", codes[code].sentinel, detail ?: "out of memory");
        else
                k = asprintf(&msg, "%s", detail ?: "out of memory");
        if (k < 0)
                msg = NULL;

        api_error_done(reterr);
        reterr->error = r;
        reterr->code = code;
        /* Under memory pressure the code still reaches the client, with a static message. */
        reterr->message = msg ? TAKE_PTR(msg) : strdup(codes[code].name);
        return r;
}

int api_error_prefix(ApiError *e, const char *format, ...) {
        _cleanup_free_ char *ctx = NULL, *msg = NULL;
        const char *sentinel, *rest;
        va_list ap;

        if (!api_error_is_set(e))
                return e ? e->error : 0;

        va_start(ap, format);
        int k = vasprintf(&ctx, format, ap);
        va_end(ap);
        if (k < 0)
                return e->error;

        sentinel = codes[e->code].sentinel;
        rest = e->message;
        if (sentinel && strneq(rest, sentinel, strlen(sentinel)) && rest[strlen(sentinel)] == ':') {
                rest += strlen(sentinel) + 1;
                rest += strspn(rest, " ");
                k = asprintf(&msg, "%s: %s: %s", sentinel, ctx, rest);
        } else
                k = asprintf(&msg, "%s: %s", ctx, rest);
        if (k < 0)
                return e->error;
        free(e->message);
        e->message = TAKE_PTR(msg);
        return e->error;
}

void api_error_done(ApiError *e) {
        if (!e)
                return;
        free(e->message);
        e->message = NULL;
        json_decref(e->details);
        e->details = NULL;
}

/* Copies s with every byte that does not start a valid UTF-8 sequence replaced by U+FFFD. */
static char *utf8_replace_invalid(const char *s) {
        size_t n = strlen(s);
        char *t = malloc(n * 3 + 1), *o = t;

        if (!t)
                return NULL;
        for (size_t i = 0; i < n;) {
                json_t *c = NULL;
                size_t k;

                for (k = 1; k <= 4 && i + k <= n; k++) {
                        c = json_stringn(s + i, k);
                        if (c)
                                break;
                }
                if (c) {
                        json_decref(c);
                        memcpy(o, s + i, k);
                        o += k;
                        i += k;
                } else {
                        memcpy(o, "\xef\xbf\xbd", 3);
                        o += 3;
                        i++;
                }
        }
        *o = 0;
        return t;
}

json_t *api_error_to_json(const ApiError *e) {
        _cleanup_free_ char *fixed = NULL;
        const char *msg;
        json_t *probe;

        assert(e);
        msg = e->message ?: "internal error";
        /* json_pack("s") refuses invalid UTF-8, but a message can quote a request path or a file name,
         * which are arbitrary bytes: the error must render anyway. */
        probe = json_string(msg);
        if (!probe) {
                fixed = utf8_replace_invalid(msg);
                if (!fixed)
                        return NULL;
                msg = fixed;
        }
        json_decref(probe);
        return json_pack(
                "{s:{s:s,s:s}}",
                "error",
                "code",
                api_error_code_to_string(e->code) ?: "internal_error",
                "message",
                msg);
}

void api_error_from_errno(ApiError *e, int r, const char *what) {
        if (!e || api_error_is_set(e))
                return;
        (void) api_error_set(e, r, API_ERROR_INTERNAL, "%s: %s", what, strerror(ABS(r)));
}
