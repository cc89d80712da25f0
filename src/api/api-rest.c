/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "api-console.h"
#include "api-rest.h"
#include "api-shell.h"
#include "cleanup.h"
#include "http-util.h"
#include "json-util.h"
#include "log.h"
#include "operation.h"
#include "parse-util.h"

/* The rendered body of a cacheable operation, valid while the records are at generation. */
typedef struct CachedBody {
        uint64_t generation;
        char *body;
        size_t size;
} CachedBody;

struct ApiRest {
        Manager *manager;
        Tracer *tracer;
        CachedBody *cache; /* one per operation of the table */
        size_t n_cache;
        ApiConsoleStreams *consoles;
        ApiShells *shells;
};

int api_rest_new(ApiRest **ret, Manager *m, Tracer *tracer) {
        _cleanup_(api_rest_freep) ApiRest *a = NULL;

        assert_return(ret && m, -EINVAL);
        a = calloc(1, sizeof(ApiRest));
        if (!a)
                return -ENOMEM;
        a->manager = m;
        a->tracer = tracer;
        (void) operation_table(&a->n_cache);
        a->cache = calloc(a->n_cache, sizeof(CachedBody));
        if (!a->cache)
                return -ENOMEM;
        a->consoles = api_console_streams_new(m);
        a->shells = api_shells_new(m);
        if (!a->consoles || !a->shells)
                return -ENOMEM;
        *ret = TAKE_PTR(a);
        return 0;
}

ApiRest *api_rest_free(ApiRest *a) {
        if (!a)
                return NULL;
        api_console_streams_free(a->consoles);
        api_shells_free(a->shells);
        for (size_t i = 0; i < a->n_cache; i++)
                free(a->cache[i].body);
        free(a->cache);
        free(a);
        return NULL;
}

static void reply_error(HttpRequest *req, const ApiError *e);

/* A cacheable operation's result being rendered (off the loop when large), at generation. */
typedef struct CacheFill {
        ApiRest *rest;
        const Operation *op;
        uint64_t generation;
} CacheFill;

/* The operation table says what a success is; only the REST layer turns that into a status. */
static unsigned success_status(const Operation *op) {
        static const unsigned status[_OPERATION_SUCCESS_MAX] = {
                [OPERATION_SUCCESS_RESULT] = 200,
                [OPERATION_SUCCESS_CREATED] = 201,
                [OPERATION_SUCCESS_EMPTY] = 204,
        };

        assert(op->success >= 0 && op->success < _OPERATION_SUCCESS_MAX);
        return status[op->success];
}

static char *render_pretty(json_t *v, size_t *ret_size) {
        return json_dumps_pretty(v, ret_size);
}

static void on_cache_rendered(HttpRequest *req, char *text, size_t size, const ApiError *error, void *userdata) {
        _cleanup_free_ CacheFill *f = userdata;
        _cleanup_free_ char *body = text;
        size_t n;
        CachedBody *c = &f->rest->cache[f->op - operation_table(&n)];

        if (error) {
                if (http_request_is_connected(req))
                        reply_error(req, error);
                return;
        }
        if (f->generation != manager_generation(f->rest->manager))
                /* the records changed while it was rendered: the answer is what the operation saw,
                 * the cache waits for the next request */
                (void) http_request_reply_take(
                        req, success_status(f->op), "application/json", TAKE_PTR(body), size);
        else {
                free(c->body);
                c->body = TAKE_PTR(body);
                c->size = size;
                c->generation = f->generation;
                (void) http_request_reply(req, success_status(f->op), "application/json", c->body, c->size);
        }
}

/* Serves a cacheable operation from the body rendered at the current generation, rendering it
 * first when the records changed since. */
static int reply_cached(ApiRest *a, const Operation *op, HttpRequest *req, json_t *args, ApiError *reterr) {
        size_t n;
        CachedBody *c = &a->cache[op - operation_table(&n)];
        json_t *result = NULL;
        CacheFill *f;
        int r;

        if (c->body && c->generation == manager_generation(a->manager))
                return http_request_reply(req, success_status(op), "application/json", c->body, c->size);

        r = operation_run(op, a->manager, http_request_caller(req), args, &result, reterr);
        if (r < 0)
                return r;
        f = calloc(1, sizeof(CacheFill));
        if (!f) {
                json_decref(result);
                return -ENOMEM;
        }
        *f = (CacheFill){ .rest = a, .op = op, .generation = manager_generation(a->manager) };
        r = http_request_render_async(req, result, render_pretty, on_cache_rendered, f);
        if (r < 0) {
                free(f); /* done was not called */
                return r;
        }
        return 0;
}

/* Matches path against a pattern such as "/networks/{name}", one segment per {param}. On success
 * the params are set in args as strings. */
static bool route_match(const char *pattern, const char *path, json_t *args) {
        const char *p = pattern, *s = path;

        for (;;) {
                if (*p == 0 || *s == 0)
                        return *p == 0 && *s == 0;
                if (*p != '/' || *s != '/')
                        return false;
                p++;
                s++;

                size_t plen = strcspn(p, "/"), slen = strcspn(s, "/");
                if (slen == 0)
                        return false; /* empty segment: "//" or a trailing slash */
                if (p[0] == '{' && plen > 2 && p[plen - 1] == '}') {
                        _cleanup_free_ char *name = strndup(p + 1, plen - 2);
                        if (!name || json_object_set_new(args, name, json_stringn(s, slen)) < 0)
                                return false; /* invalid UTF-8 in a segment cannot name anything */
                } else if (plen != slen || strncmp(p, s, plen) != 0)
                        return false;
                p += plen;
                s += slen;
        }
}

/* v (borrowed) rendered off the loop when it is large: nothing may change it afterwards, and the
 * results of operations are new documents, or share only values their records never change. */
static int reply(HttpRequest *req, unsigned status, json_t *v) {
        if (status == 204 || !v)
                return http_request_reply(req, 204, NULL, NULL, 0);
        return http_request_reply_json_async(req, status, json_incref(v));
}

static void reply_error(HttpRequest *req, const ApiError *e) {
        unsigned status = http_status_from_error(e);

        if (status >= 500)
                log_struct(
                        LOG_ERR,
                        LOG_FIELDS({ "METHOD", http_request_method(req) }, { "PATH", http_request_path(req) }),
                        "%s",
                        e->message);
        (void) http_request_reply_error(req, e);
}

/* A write's body must say it is JSON: a web page can send text/plain or a form to any address
 * without asking, but not application/json. A write without a body (DELETE, start, stop) needs no
 * Content-Type; one it gives must still be application/json. */
static int check_content_type(const Operation *op, HttpRequest *req, ApiError *reterr) {
        const char *method = http_request_method(req), *ct = http_request_header(req, "Content-Type");
        size_t size = 0;

        if (streq(method, "GET") || streq(method, "HEAD"))
                return 0;
        (void) http_request_body(req, &size);
        if (!ct && !op->rest_body && size == 0)
                return 0;
        if (http_content_type_is_json(ct))
                return 0;
        if (!ct)
                return api_error_set(
                        reterr,
                        -EMEDIUMTYPE,
                        API_ERROR_INVALID_REQUEST,
                        "Content-Type: missing, a body must be application/json");
        return api_error_set(
                reterr,
                -EMEDIUMTYPE,
                API_ERROR_INVALID_REQUEST,
                "Content-Type: \"%.100s\" is not application/json",
                ct);
}

/* Query parameters declared by the operation, converted to their declared type. */
static int add_query_params(const Operation *op, HttpRequest *req, json_t *args, ApiError *reterr) {
        for (const OperationParam *p = op->params; p->name; p++) {
                const char *v;

                if (!(p->flags & PARAM_IN_QUERY))
                        continue;
                v = http_request_query(req, p->name);
                if (!v)
                        continue;
                if (p->type == PARAM_INTEGER) {
                        int64_t i;
                        if (safe_atoi64(v, &i) < 0)
                                return api_error_set(
                                        reterr,
                                        -EINVAL,
                                        API_ERROR_INVALID_REQUEST,
                                        "%s: \"%s\" is not an integer",
                                        p->name,
                                        v);
                        if (json_object_set_new(args, p->name, json_integer(i)) < 0)
                                return -ENOMEM;
                } else if (json_object_set_new(args, p->name, json_string(v)) < 0)
                        return api_error_set(
                                reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "%s: not valid UTF-8", p->name);
        }
        return 0;
}

/* A request between two steps: its body being parsed, or its asynchronous operation running. */
typedef struct RestCall {
        ApiRest *rest;
        HttpRequest *req; /* a reference */
        const Operation *op;
        json_t *args; /* owned: the path's parameters, the body's fields once merged */
} RestCall;

static RestCall *rest_call_free(RestCall *c) {
        if (!c)
                return NULL;
        http_request_unref(c->req);
        json_decref(c->args);
        free(c);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(RestCall *, rest_call_free);

static int rest_call_new(ApiRest *a, HttpRequest *req, const Operation *op, json_t *args, RestCall **ret) {
        RestCall *c = calloc(1, sizeof(RestCall));

        if (!c)
                return -ENOMEM;
        *c = (RestCall){ .rest = a, .req = http_request_ref(req), .op = op, .args = json_incref(args) };
        *ret = c;
        return 0;
}

static void rest_done(int r, json_t *result, const ApiError *e, void *userdata) {
        _cleanup_(rest_call_freep) RestCall *c = userdata;

        if (r < 0)
                reply_error(c->req, e);
        else
                (void) reply(c->req, success_status(c->op), result);
}

/* The body's fields join the path's parameters in args; a body must be an object and may not name
 * a parameter of the path. */
static int merge_body(json_t *args, json_t *body, ApiError *reterr) {
        const char *key;
        json_t *v;

        if (!json_is_object(body))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "body: expected a JSON object, got %s",
                        json_type_name(body));
        json_object_foreach(body, key, v) {
                if (json_object_get(args, key))
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "body: field \"%s\" belongs in the path",
                                key);
                if (json_object_set(args, key, v) < 0)
                        return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        }
        return 0;
}

/* Whether the request asks for an asynchronous answer: a respond-async preference in Prefer (RFC 7240,
 * a comma-separated list of preferences, each with optional parameters after ";"). */
static bool prefers_async(HttpRequest *req) {
        const char *p = http_request_header(req, "Prefer");

        while (p && *p) {
                size_t n;

                p += strspn(p, " \t,");
                n = strcspn(p, " \t,;=");
                if (n == strlen("respond-async") && strncasecmp(p, "respond-async", n) == 0)
                        return true;
                p += strcspn(p, ",");
        }
        return false;
}

/* A task's record is on disk: 202, with where to follow it. */
static void rest_task_started(int r, Task *t, const ApiError *e, void *userdata) {
        _cleanup_(rest_call_freep) RestCall *c = userdata;
        _cleanup_free_ char *location = NULL;
        json_auto_t *j = task_to_json(t);

        asprintf_or_null(&location, "%s/operations/%s", API_REST_PREFIX, task_id(t));
        if (!j || !location || http_request_add_header(c->req, "Location", location) < 0 ||
            http_request_add_header(c->req, "Preference-Applied", "respond-async") < 0) {
                ApiError oom = API_ERROR_NULL;

                (void) api_error_set(&oom, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                reply_error(c->req, &oom);
                api_error_done(&oom);
                return;
        }
        (void) reply(c->req, 202, j);
}

/* A cancellation is on disk: the operation as it is now. */
static void rest_task_cancelled(int r, Task *t, const ApiError *e, void *userdata) {
        _cleanup_(rest_call_freep) RestCall *c = userdata;
        json_auto_t *j = task_to_json(t);

        (void) reply(c->req, 200, j);
}

/* /operations and /operations/{id}: the durable tasks (task.h), REST's view of MCP's tasks. GET lists
 * or reads them; DELETE cancels one. */
static void handle_operations(ApiRest *a, HttpRequest *req, const char *method, const char *sub, Span *span) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        bool get = streq(method, "GET") || streq(method, "HEAD");
        TaskRegistry *reg = manager_tasks(a->manager);
        const char *id = NULL;
        json_auto_t *j = NULL;
        Task *t;
        int r;

        if (streq(sub, "/operations")) {
                span_set_http_route(span, API_REST_PREFIX, "/operations");
                if (!get) {
                        (void) api_error_set(
                                &e, -ENOENT, API_ERROR_NOT_FOUND, "no route %s %s%s", method, API_REST_PREFIX, sub);
                        reply_error(req, &e);
                        return;
                }
                j = json_pack("{s:o}", "operations", task_registry_to_json(reg));
                (void) reply(req, 200, j);
                return;
        }
        id = sub + strlen("/operations/");
        span_set_http_route(span, API_REST_PREFIX, "/operations/{id}");
        if ((!get && !streq(method, "DELETE")) || strchr(id, '/')) {
                (void) api_error_set(
                        &e, -ENOENT, API_ERROR_NOT_FOUND, "no route %s %s%s", method, API_REST_PREFIX, sub);
                reply_error(req, &e);
                return;
        }
        t = task_registry_get(reg, id);
        if (!t) {
                (void) api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "operation \"%s\"", id);
                reply_error(req, &e);
                return;
        }
        if (get) {
                j = task_to_json(t);
                (void) reply(req, 200, j);
                return;
        }
        RestCall *c;
        r = rest_call_new(a, req, /* op= */ NULL, /* args= */ NULL, &c);
        if (r < 0) {
                (void) api_error_set(&e, r, API_ERROR_INTERNAL, "out of memory");
                reply_error(req, &e);
                return;
        }
        http_request_suspend(req);
        r = task_cancel(t, rest_task_cancelled, c, &e);
        if (r == 0)
                return; /* answered once the cancellation is on disk */
        rest_call_free(c);
        if (r > 0)
                (void) api_error_set(
                        &e,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "operation %s has ended already (%s): there is nothing to cancel",
                        task_id(t),
                        task_status_to_string(task_status(t)));
        reply_error(req, &e);
}

/* The rest of a request once its arguments are complete: the query, then the operation. */
static void rest_run(ApiRest *a, HttpRequest *req, const Operation *op, json_t *args) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *result = NULL;
        int r;

        r = add_query_params(op, req, args, &e);
        if (r < 0) {
                api_error_from_errno(&e, r, op->name);
                reply_error(req, &e);
                return;
        }

        if (op->async_handler || !(op->hints & OP_READ_ONLY)) {
                /* The answer comes when the VM gets there and the records are on disk; other
                 * requests flow meanwhile. With Prefer: respond-async an operation that can run as a
                 * task answers 202 at once instead, once the task's record is on disk. */
                bool as_task = op->task && prefers_async(req);
                RestCall *c;

                r = rest_call_new(a, req, op, /* args= */ NULL, &c);
                if (r < 0) {
                        (void) api_error_set(&e, r, API_ERROR_INTERNAL, "out of memory");
                        reply_error(req, &e);
                        return;
                }
                http_request_suspend(req);
                if (as_task)
                        r = task_start(
                                manager_tasks(a->manager),
                                op,
                                http_request_caller(req),
                                args,
                                rest_task_started,
                                c,
                                &e);
                else
                        r = operation_run_async(
                                op,
                                a->manager,
                                http_request_caller(req),
                                args,
                                rest_done,
                                /* progress= */ NULL,
                                c,
                                &e);
                if (r < 0) {
                        rest_call_free(c);
                        reply_error(req, &e);
                }
                return;
        }

        if (op->cacheable) {
                r = reply_cached(a, op, req, args, &e);
                if (r < 0) {
                        api_error_from_errno(&e, r, op->name);
                        reply_error(req, &e);
                }
                return;
        }

        r = operation_run(op, a->manager, http_request_caller(req), args, &result, &e);
        if (r < 0) {
                reply_error(req, &e);
                return;
        }
        (void) reply(req, success_status(op), result);
}

static void on_body(HttpRequest *req, json_t *body, const ApiError *error, void *userdata) {
        _cleanup_(rest_call_freep) RestCall *c = userdata;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        if (!http_request_is_connected(req))
                return; /* nobody to answer: nothing is run */
        if (error) {
                reply_error(req, error);
                return;
        }
        if (merge_body(c->args, body, &e) < 0) {
                reply_error(req, &e);
                return;
        }
        rest_run(c->rest, req, c->op, c->args);
}

static void on_request_done(unsigned status, void *userdata) {
        span_end_http_server(userdata, status);
}

bool api_rest_handle(ApiRest *a, HttpRequest *req) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        const char *path = http_request_path(req), *method = http_request_method(req), *sub;
        const Operation *table, *op = NULL;
        json_auto_t *args = NULL, *result = NULL;
        size_t n;
        int r;

        if (!strneq(path, API_REST_PREFIX, strlen(API_REST_PREFIX)))
                return false;
        sub = path + strlen(API_REST_PREFIX);
        if (*sub != 0 && *sub != '/')
                return false; /* "/api/v10" is not ours */

        /* One server span per request, ended with the response; named by the route once known. */
        Span *span = span_start_http_server(
                a->tracer, method, API_REST_PREFIX, path, http_request_header(req, "traceparent"));
        if (span)
                http_request_on_done(req, on_request_done, span);
        if (http_request_caller(req)) /* --enable-oauth: who asked */
                span_set_attr_string(span, "enduser.id", http_request_caller(req)->subject);

        /* Before anything else, also a read: a rebound name must not learn what exists. */
        r = http_request_check_site(req, &e);
        if (r < 0) {
                (void) http_request_reply_error_status(req, 403, &e);
                return true;
        }

        bool get = streq(method, "GET") || streq(method, "HEAD");
        if (get && streq(sub, "/openapi.yaml")) {
                span_set_http_route(span, API_REST_PREFIX, sub);
                (void) http_request_reply(
                        req, 200, "application/yaml", api_openapi_yaml, api_openapi_yaml_size);
                return true;
        }

        /* The guest's raw report and the console stream: REST only, so not operations of the table. */
        if (strneq(sub, "/vms/", 5)) {
                const char *id = sub + 5, *slash = strchr(id, '/');
                if (slash && slash > id && streq(slash, "/console/stream")) {
                        _cleanup_free_ char *vid = strndup(id, slash - id);

                        if (!get || !vid) {
                                (void) api_error_set(
                                        &e, -ENOENT, API_ERROR_NOT_FOUND, "no route %s %s", method, path);
                                reply_error(req, &e);
                                return true;
                        }
                        span_set_http_route(span, API_REST_PREFIX, "/vms/{id}/console/stream");
                        api_console_stream(a->consoles, req, vid, span ? on_request_done : NULL, span);
                        return true;
                }
                if (slash && slash > id && streq(slash, "/shell")) {
                        _cleanup_free_ char *vid = strndup(id, slash - id);

                        if (!streq(method, "GET") || !vid) {
                                (void) api_error_set(
                                        &e, -ENOENT, API_ERROR_NOT_FOUND, "no route %s %s", method, path);
                                reply_error(req, &e);
                                return true;
                        }
                        span_set_http_route(span, API_REST_PREFIX, "/vms/{id}/shell");
                        api_shell(a->shells, req, vid);
                        return true;
                }
                if (slash && slash > id && streq(slash, "/report")) {
                        _cleanup_free_ char *vid = strndup(id, slash - id);
                        Vm *v;

                        if (!get) {
                                (void) api_error_set(
                                        &e, -ENOENT, API_ERROR_NOT_FOUND, "no route %s %s", method, path);
                                reply_error(req, &e);
                                return true;
                        }
                        span_set_http_route(span, API_REST_PREFIX, "/vms/{id}/report");
                        v = vid ? manager_find_vm(a->manager, vid) : NULL;
                        if (!v)
                                r = api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", vid ?: "");
                        else {
                                int fd;
                                uint64_t size;

                                r = vm_report_open(v, &fd, &size, &e);
                                if (r >= 0) {
                                        (void) http_request_reply_fd(req, 200, "application/json", fd, size);
                                        return true;
                                }
                                if (r == -EMEDIUMTYPE)
                                        r = vm_report_json(v, &result, &e);
                        }
                        if (r < 0)
                                reply_error(req, &e);
                        else
                                (void) reply(req, 200, result);
                        return true;
                }
        }

        if (streq(sub, "/operations") || strneq(sub, "/operations/", strlen("/operations/"))) {
                handle_operations(a, req, method, sub, span);
                return true;
        }

        table = operation_table(&n);
        for (size_t i = 0; i < n && !op; i++) {
                if (!table[i].method)
                        continue;
                if (!streq(table[i].method, method) && !(get && streq(table[i].method, "GET")))
                        continue;
                json_decref(args);
                args = json_object();
                if (!args) {
                        (void) api_error_set(&e, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                        reply_error(req, &e);
                        return true;
                }
                if (route_match(table[i].path, sub, args))
                        op = &table[i];
        }
        if (!op) {
                (void) api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "no route %s %s", method, path);
                reply_error(req, &e);
                return true;
        }
        span_set_http_route(span, API_REST_PREFIX, op->path);

        r = check_content_type(op, req, &e);
        if (r < 0) {
                (void) http_request_reply_error_status(req, 415, &e);
                return true;
        }

        /* The order of checks decides 400 against 404: the body is decoded and checked before any
         * record is looked up. A large body is parsed off the loop, the request waiting meanwhile. */
        if (op->rest_body) {
                RestCall *c;

                r = rest_call_new(a, req, op, args, &c);
                if (r >= 0) {
                        r = http_request_body_json_async(req, on_body, c);
                        if (r < 0)
                                rest_call_free(c);
                }
                if (r == -EAGAIN) {
                        (void) http_request_add_header(req, "Retry-After", "1");
                        (void) api_error_set(
                                &e, r, API_ERROR_INTERNAL, "too many request bodies are being read, try again");
                        (void) http_request_reply_error_status(req, 503, &e);
                } else if (r < 0) {
                        (void) api_error_set(&e, r, API_ERROR_INTERNAL, "body: %s", strerror(-r));
                        reply_error(req, &e);
                }
                return true;
        }
        rest_run(a, req, op, args);
        return true;
}
