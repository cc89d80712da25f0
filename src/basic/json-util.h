/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdint.h>

#include "api-error.h"

/* Serialises v the way every response is written: 2-space indent, keys in insertion order, one
 * trailing newline. Returns a new string, or NULL on OOM. */
char *json_dumps_pretty(const json_t *v, size_t *ret_size);

/* About how many bytes json_dumps() writes for v, compactly, or max when that is more: strings count
 * as escaped (a control character as 6 bytes), each value and member at least a few bytes of syntax.
 * The walk stops once max is reached, so it looks at max bytes and values at most, whatever the size
 * of v: a cheap way to tell a document that takes long to render (and belongs off the loop) from
 * one that does not. */
size_t json_dumps_estimate(const json_t *v, size_t max);

/* A JSON string of n bytes that need not be UTF-8 (a path, a header, a stored upload): when they are
 * not, every byte >= 0x80 becomes '?'. NULL on OOM; json_string_lossy(NULL) is NULL. */
json_t *json_stringn_lossy(const char *s, size_t n);
json_t *json_string_lossy(const char *s);

/* Parses an untrusted request body into one JSON value. Empty bodies, malformed JSON, trailing bytes
 * and duplicate keys are invalid_request errors that say where the problem is. */
int json_parse_body(const void *data, size_t size, json_t **ret, ApiError *reterr);

/* Table-driven decoding of a JSON object into a C struct: one row per accepted key. A key with no
 * row is rejected, a wrong type names its field, a missing mandatory key names its field. */

typedef enum JsonDispatchFlags {
        JSON_MANDATORY = 1 << 0, /* the key must be present */
        JSON_NULLABLE = 1 << 1,  /* null is accepted and leaves the field as it was */
} JsonDispatchFlags;

typedef int (*JsonDispatchFunc)(const char *name, json_t *v, void *dest, ApiError *reterr);

typedef struct JsonDispatch {
        const char *name;
        JsonDispatchFunc func;
        size_t offset;
        JsonDispatchFlags flags;
} JsonDispatch;

int json_dispatch(json_t *obj, const JsonDispatch table[], void *target, ApiError *reterr);

/* Standard field parsers. Strings are copied (char **), JSON values referenced (json_t **). */
int json_dispatch_string(const char *name, json_t *v, void *dest, ApiError *reterr);
int json_dispatch_uint64(const char *name, json_t *v, void *dest, ApiError *reterr);
int json_dispatch_uint32(const char *name, json_t *v, void *dest, ApiError *reterr);
int json_dispatch_int64(const char *name, json_t *v, void *dest, ApiError *reterr);
int json_dispatch_bool(const char *name, json_t *v, void *dest, ApiError *reterr);
int json_dispatch_strv(const char *name, json_t *v, void *dest, ApiError *reterr);
int json_dispatch_object(const char *name, json_t *v, void *dest, ApiError *reterr);
int json_dispatch_variant(const char *name, json_t *v, void *dest, ApiError *reterr);

/* The value of a JSON string as a C string, for comparing and looking up: NULL for anything but a
 * string, and for a string with a NUL inside (bodies are parsed with JSON_ALLOW_NUL, and such a
 * string compared as a C string would pass for its prefix: "get_info\u0000junk" for "get_info"). */
const char *json_string_cstr(const json_t *v);

/* The JSON type name a user understands: "string", "integer", "object", … */
const char *json_type_name(const json_t *v);
