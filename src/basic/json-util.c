/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "json-util.h"

char *json_dumps_pretty(const json_t *v, size_t *ret_size) {
        _cleanup_free_ char *s = NULL;
        char *t;
        size_t n;

        s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        if (!s)
                return NULL;
        n = strlen(s);
        t = realloc(s, n + 2);
        if (!t)
                return NULL;
        s = NULL;
        t[n] = '\n';
        t[n + 1] = 0;
        if (ret_size)
                *ret_size = n + 1;
        return t;
}

/* A string as jansson escapes it, quotes included, counted up to max. */
static size_t string_estimate(const char *s, size_t n, size_t max) {
        size_t k = 2;

        for (size_t i = 0; i < n && k < max; i++) {
                unsigned char c = (unsigned char) s[i];

                if (c < 0x20)
                        k += 6; /* \u00XX, or a two-byte escape such as \n: the worst case */
                else if (c == '"' || c == '\\')
                        k += 2;
                else
                        k++;
        }
        return k;
}

static size_t estimate(const json_t *v, size_t max) {
        size_t k = 0;

        switch (json_typeof(v)) {
        case JSON_OBJECT: {
                const char *key;
                json_t *m;

                k = 2;
                json_object_foreach((json_t *) v, key, m) {
                        if (k >= max)
                                break;
                        k += 2 + string_estimate(key, strlen(key), max - k);
                        if (k < max)
                                k += estimate(m, max - k);
                }
                return k;
        }
        case JSON_ARRAY: {
                size_t i;
                json_t *m;

                k = 2;
                json_array_foreach(v, i, m) {
                        if (k >= max)
                                break;
                        k += 1 + estimate(m, max - k);
                }
                return k;
        }
        case JSON_STRING:
                return string_estimate(json_string_value(v), json_string_length(v), max);
        case JSON_INTEGER:
        case JSON_REAL:
                return 8;
        case JSON_TRUE:
        case JSON_NULL:
                return 4;
        case JSON_FALSE:
                return 5;
        }
        return 0;
}

size_t json_dumps_estimate(const json_t *v, size_t max) {
        if (!v)
                return 0;
        return MIN(estimate(v, max), max);
}

int json_parse_body(const void *data, size_t size, json_t **ret, ApiError *reterr) {
        json_error_t err;
        json_t *v;

        assert_return(ret, -EINVAL);

        if (size == 0)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "body: empty, expected JSON");

        v = json_loadb(data, size, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
        if (!v)
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INVALID_REQUEST,
                        "body: malformed JSON at line %d, column %d: %s",
                        err.line,
                        err.column,
                        err.text);
        *ret = v;
        return 0;
}

const char *json_string_cstr(const json_t *v) {
        const char *s = json_string_value(v);

        if (!s || memchr(s, 0, json_string_length(v)))
                return NULL;
        return s;
}

const char *json_type_name(const json_t *v) {
        switch (json_typeof(v)) {
        case JSON_OBJECT:
                return "object";
        case JSON_ARRAY:
                return "array";
        case JSON_STRING:
                return "string";
        case JSON_INTEGER:
                return "integer";
        case JSON_REAL:
                return "number";
        case JSON_TRUE:
        case JSON_FALSE:
                return "boolean";
        case JSON_NULL:
                return "null";
        }
        return "unknown";
}

int json_dispatch(json_t *obj, const JsonDispatch table[], void *target, ApiError *reterr) {
        const char *key;
        json_t *v;
        int r;

        assert_return(table, -EINVAL);

        if (!json_is_object(obj))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "expected a JSON object, got %s",
                        obj ? json_type_name(obj) : "nothing");

        json_object_foreach(obj, key, v) {
                const JsonDispatch *d = NULL;

                for (const JsonDispatch *i = table; i->name; i++)
                        if (streq(i->name, key)) {
                                d = i;
                                break;
                        }
                if (!d)
                        return api_error_set(
                                reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "unknown field \"%s\"", key);
                if (json_is_null(v) && (d->flags & JSON_NULLABLE))
                        continue;
                r = d->func(d->name, v, (uint8_t *) target + d->offset, reterr);
                if (r < 0)
                        return r;
        }

        for (const JsonDispatch *i = table; i->name; i++)
                if ((i->flags & JSON_MANDATORY) && !json_object_get(obj, i->name))
                        return api_error_set(
                                reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "field \"%s\" is required", i->name);
        return 0;
}

static int type_error(const char *name, const json_t *v, const char *want, ApiError *reterr) {
        return api_error_set(
                reterr,
                -EINVAL,
                API_ERROR_INVALID_REQUEST,
                "field \"%s\": expected %s, got %s",
                name,
                want,
                json_type_name(v));
}

int json_dispatch_string(const char *name, json_t *v, void *dest, ApiError *reterr) {
        char **s = dest, *c;

        if (!json_is_string(v))
                return type_error(name, v, "a string", reterr);
        if (!json_string_cstr(v))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "field \"%s\": contains a NUL character",
                        name);
        c = strdup(json_string_value(v));
        if (!c)
                return -ENOMEM;
        free(*s);
        *s = c;
        return 0;
}

int json_dispatch_int64(const char *name, json_t *v, void *dest, ApiError *reterr) {
        if (!json_is_integer(v))
                return type_error(name, v, "an integer", reterr);
        *(int64_t *) dest = (int64_t) json_integer_value(v);
        return 0;
}

int json_dispatch_uint64(const char *name, json_t *v, void *dest, ApiError *reterr) {
        if (!json_is_integer(v))
                return type_error(name, v, "a non-negative integer", reterr);
        if (json_integer_value(v) < 0)
                return api_error_set(
                        reterr,
                        -ERANGE,
                        API_ERROR_INVALID_REQUEST,
                        "field \"%s\": %" JSON_INTEGER_FORMAT " is negative",
                        name,
                        json_integer_value(v));
        *(uint64_t *) dest = (uint64_t) json_integer_value(v);
        return 0;
}

int json_dispatch_uint32(const char *name, json_t *v, void *dest, ApiError *reterr) {
        uint64_t u = 0;
        int r = json_dispatch_uint64(name, v, &u, reterr);

        if (r < 0)
                return r;
        if (u > UINT32_MAX)
                return api_error_set(
                        reterr,
                        -ERANGE,
                        API_ERROR_INVALID_REQUEST,
                        "field \"%s\": %llu is too large",
                        name,
                        (unsigned long long) u);
        *(uint32_t *) dest = (uint32_t) u;
        return 0;
}

int json_dispatch_bool(const char *name, json_t *v, void *dest, ApiError *reterr) {
        if (!json_is_boolean(v))
                return type_error(name, v, "a boolean", reterr);
        *(bool *) dest = json_is_true(v);
        return 0;
}

int json_dispatch_strv(const char *name, json_t *v, void *dest, ApiError *reterr) {
        _cleanup_strv_free_ char **l = NULL;
        char ***strv = dest;
        size_t i;
        json_t *e;

        if (!json_is_array(v))
                return type_error(name, v, "an array of strings", reterr);
        l = calloc(json_array_size(v) + 1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        json_array_foreach(v, i, e) {
                if (!json_is_string(e))
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "field \"%s\"[%zu]: expected a string, got %s",
                                name,
                                i,
                                json_type_name(e));
                if (!json_string_cstr(e))
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "field \"%s\"[%zu]: contains a NUL character",
                                name,
                                i);
                l[i] = strdup(json_string_value(e));
                if (!l[i])
                        return -ENOMEM;
        }
        strv_free(*strv);
        *strv = TAKE_PTR(l);
        return 0;
}

int json_dispatch_object(const char *name, json_t *v, void *dest, ApiError *reterr) {
        json_t **o = dest;

        if (!json_is_object(v))
                return type_error(name, v, "an object", reterr);
        json_decref(*o);
        *o = json_incref(v);
        return 0;
}

int json_dispatch_variant(const char *name, json_t *v, void *dest, ApiError *reterr) {
        json_t **o = dest;

        json_decref(*o);
        *o = json_incref(v);
        return 0;
}

json_t *json_stringn_lossy(const char *s, size_t n) {
        _cleanup_free_ char *copy = NULL;
        json_t *j = json_stringn(s, n);

        if (j)
                return j;
        copy = malloc(n ?: 1);
        if (!copy)
                return NULL;
        for (size_t i = 0; i < n; i++)
                copy[i] = (unsigned char) s[i] >= 0x80 ? '?' : s[i];
        return json_stringn(copy, n);
}

json_t *json_string_lossy(const char *s) {
        return s ? json_stringn_lossy(s, strlen(s)) : NULL;
}
