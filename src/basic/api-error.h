/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>

#include "macro.h"

/* The stable error codes a client sees, on REST and on MCP alike. */
typedef enum ApiErrorCode {
        API_ERROR_INTERNAL, /* the zero value: anything not classified is internal */
        API_ERROR_NOT_FOUND,
        API_ERROR_INVALID_REQUEST,
        API_ERROR_CONFLICT,
        API_ERROR_UNSUPPORTED,
        API_ERROR_TIMEOUT,
        API_ERROR_VM_FAILED,
        API_ERROR_UNAUTHORIZED, /* no valid bearer token (only with --enable-oauth) */
        _API_ERROR_CODE_MAX,
        _API_ERROR_CODE_INVALID = -EINVAL,
} ApiErrorCode;

/* The user-facing detail of a failure. Functions take it as their last parameter "reterr" and
 * return the same negative errno they store in it; NULL discards the detail. */
typedef struct ApiError {
        int error; /* negative errno */
        ApiErrorCode code;
        char *message;   /* full text, starting with the code's sentinel ("not found: …") */
        json_t *details; /* optional, owned */
} ApiError;

#define API_ERROR_NULL ((ApiError){ .error = 0, .code = API_ERROR_INTERNAL })

const char *api_error_code_to_string(ApiErrorCode c) _const_;
ApiErrorCode api_error_code_from_string(const char *s) _pure_;

/* Fills reterr (when not NULL) and returns r, which must be negative. The message is prefixed with
 * the code's sentinel text ("not found: ", "invalid request: ", …), as every client expects. */
int api_error_set(ApiError *reterr, int r, ApiErrorCode code, const char *format, ...) _printf_(4, 5);

/* Like api_error_set(), but adds the prefix "<context>: " after the sentinel, to an error
 * already in e (used when a lower layer's detail is wrapped). */
int api_error_prefix(ApiError *e, const char *format, ...) _printf_(2, 3);

void api_error_done(ApiError *e);

static inline bool api_error_is_set(const ApiError *e) {
        return e && e->message;
}

/* {"error":{"code":…,"message":…}}; returns a new reference or NULL on OOM. */
json_t *api_error_to_json(const ApiError *e);

/* Fills e from a bare negative errno when nothing more specific was set. */
void api_error_from_errno(ApiError *e, int r, const char *what);
