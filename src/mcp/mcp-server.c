/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "cleanup.h"
#include "hex-util.h"
#include "http-util.h"
#include "json-util.h"
#include "log.h"
#include "mcp-schema.h"
#include "mcp-server.h"
#include "operation.h"
#include "time-util.h"

/* The newest revision with sessions: what initialize offers a client asking for one we do not know. */
#define MCP_LATEST_VERSION "2025-11-25"
#define MCP_SESSIONS_DEFAULT 1024
#define MCP_SESSION_IDLE_MAX (24 * USEC_PER_HOUR)

/* A tools/call that blocks (create_vm and the other asynchronous tools, waiting for a state) and is
 * still running after MCP_STREAM_AFTER is answered as an event stream, where the client's Accept
 * lists text/event-stream: the stream can carry keep-alives, a JSON answer that comes only at the
 * end cannot (clients and proxies give up on a response that stays silent for minutes). A call that
 * finishes sooner keeps its plain JSON answer, as does a client that accepts only JSON. With a
 * progressToken the answer is a stream from the first progress notification on. */
#define MCP_STREAM_AFTER (1 * USEC_PER_SEC)
/* An SSE comment: clients skip it, and it moves the idle timers of everything on the way. */
#define MCP_KEEPALIVE_EVENT ": keep-alive\n\n"

/* JSON-RPC 2.0 error codes. */
#define JSONRPC_PARSE_ERROR -32700
#define JSONRPC_INVALID_REQUEST -32600
#define JSONRPC_METHOD_NOT_FOUND -32601
#define JSONRPC_INVALID_PARAMS -32602
#define JSONRPC_INTERNAL_ERROR -32603
/* MCP's own codes (2026-07-28): headers that disagree with the body or are missing, and a protocol
 * version this server does not speak. Both come with HTTP 400. */
#define MCP_ERROR_HEADER_MISMATCH -32020
#define MCP_ERROR_UNSUPPORTED_VERSION -32022
/* A method that needs a capability the request's envelope does not declare (the Tasks extension's
 * methods without the extension). */
#define MCP_ERROR_MISSING_CAPABILITY -32021
/* A resource that does not exist, in the revisions with sessions (2026-07-28 uses -32602). */
#define MCP_ERROR_RESOURCE_NOT_FOUND -32002

/* The Tasks extension (SEP-2663): the five tools that wait for a VM answer a client that declares it
 * with a task at once, and tasks/get, tasks/update and tasks/cancel read the record (task.h). */
#define MCP_TASKS_EXTENSION "io.modelcontextprotocol/tasks"

/* The keys of a request's and a result's _meta in revision 2026-07-28. */
#define MCP_META_PROTOCOL_VERSION "io.modelcontextprotocol/protocolVersion"
#define MCP_META_CLIENT_CAPABILITIES "io.modelcontextprotocol/clientCapabilities"
#define MCP_META_CLIENT_INFO "io.modelcontextprotocol/clientInfo"
#define MCP_META_LOG_LEVEL "io.modelcontextprotocol/logLevel"
#define MCP_META_SERVER_INFO "io.modelcontextprotocol/serverInfo"

/* How long a client or a gateway may keep tools/list and server/discover (ttlMs): both change only
 * with the binary, and a few minutes bound how long an upgraded daemon's new tools stay unseen. They
 * hold nothing of the caller, so shared caches may keep them too (cacheScope "public"). */
#define MCP_LIST_TTL_MS 300000

/* The revisions served statelessly, newest first. */
static const char *const stateless_versions[] = {
        "2026-07-28",
};

/* The revisions with an initialize handshake and sessions, newest first. */
static const char *const session_versions[] = {
        "2025-11-25",
        "2025-06-18",
        "2025-03-26",
        "2024-11-05",
};

const char mcp_instructions[] =
        "vm-manager provisions cloud-like virtual machines on this KVM host: each VM gets an instance "
        "metadata service at 169.254.169.254, a vTPM with measured boot, an immutable OS image and a "
        "Kubernetes node stack as a versioned layer, and receives its bootstrap secrets only after the "
        "TPM has proven what booted. Call get_host first: it says whether this host can run VMs, which "
        "accelerator they use, and what is missing.\n\n"
        "Then pick an image with list_images (or get_image) and a network with list_networks: a network "
        "named \"default\" exists from start-up, and create_network makes an isolated one. Then call "
        "create_vm. A VM installs, boots, attests when require_attestation is set, and is ready when "
        "its service manager reports READY=1; wait_for decides how long create_vm blocks (none returns "
        "at once, then poll get_vm). user_data is Ignition JSON (for Cluster API, the bootstrap "
        "Secret), released by the metadata service only after a verified TPM quote. get_vm shows the "
        "state, address, attestation and last error; get_vm_console is the first stop for a failed "
        "VM. delete_network succeeds only once no VM is attached.";

typedef struct McpSubscriptions McpSubscriptions;
typedef struct McpListen McpListen;

typedef struct McpSession {
        char id[33];
        char version[16];
        usec_t last_used;
        HttpRequest *stream;    /* the client's GET stream, if open */
        McpSubscriptions *subs; /* the resources it subscribed to; NULL: none yet */
} McpSession;

struct McpServer {
        Manager *manager;
        Tracer *tracer;
        char *path;
        bool loopback_only;
        usec_t keepalive;
        McpSession *sessions;
        size_t n_sessions, max_sessions;
        json_t *tools;      /* tools/list's array: the table and the schemas never change while we run */
        McpListen *listens; /* the subscriptions/listen streams open */
        size_t n_listens;
};

static json_t *tools_new(void);
static void on_vm_event(Vm *v, ManagerVmEvent event, void *userdata);
static void on_task_ended(Task *t, void *userdata);
static McpListen *listen_free(McpListen *l);
static void subscriptions_free(McpSubscriptions *x);

int mcp_server_new(McpServer **ret, Manager *m, const McpServerOptions *o) {
        _cleanup_(mcp_server_freep) McpServer *s = NULL;
        int r;

        assert_return(ret && m && o && o->path, -EINVAL);
        s = calloc(1, sizeof(McpServer));
        if (!s)
                return -ENOMEM;
        s->manager = m;
        s->tracer = o->tracer;
        s->loopback_only = o->loopback_only;
        s->keepalive = o->keepalive ?: MCP_KEEPALIVE_DEFAULT;
        s->max_sessions = o->max_sessions ?: MCP_SESSIONS_DEFAULT;
        s->path = strdup(o->path);
        s->sessions = calloc(s->max_sessions, sizeof(McpSession));
        if (!s->path || !s->sessions)
                return -ENOMEM;
        s->tools = tools_new();
        if (!s->tools)
                return -ENOMEM;
        r = manager_watch_vms(m, on_vm_event, s);
        if (r < 0)
                return r;
        task_registry_on_end(manager_tasks(m), on_task_ended, s);
        *ret = TAKE_PTR(s);
        return 0;
}

static void session_close_stream(McpSession *x) {
        if (!x->stream)
                return;
        (void) http_request_stream_end(x->stream);
        x->stream = http_request_unref(x->stream);
}

McpServer *mcp_server_free(McpServer *s) {
        if (!s)
                return NULL;
        manager_unwatch_vms(s->manager, s);
        task_registry_on_end(manager_tasks(s->manager), NULL, NULL);
        while (s->listens)
                listen_free(s->listens);
        for (size_t i = 0; i < s->n_sessions; i++) {
                session_close_stream(&s->sessions[i]);
                subscriptions_free(s->sessions[i].subs);
        }
        free(s->sessions);
        free(s->path);
        json_decref(s->tools);
        free(s);
        return NULL;
}

static McpSession *session_find(McpServer *s, const char *id) {
        if (!id)
                return NULL;
        for (size_t i = 0; i < s->n_sessions; i++)
                if (streq(s->sessions[i].id, id))
                        return &s->sessions[i];
        return NULL;
}

static void session_remove(McpServer *s, McpSession *x) {
        session_close_stream(x);
        subscriptions_free(x->subs);
        *x = s->sessions[--s->n_sessions];
        memset(&s->sessions[s->n_sessions], 0, sizeof(McpSession));
}

static McpSession *session_new(McpServer *s, const char *version) {
        usec_t now = now_usec(CLOCK_MONOTONIC);
        uint8_t rnd[16];
        McpSession *x;

        /* Forget sessions idle for a day; when still full, the least recently used one. */
        for (size_t i = 0; i < s->n_sessions;)
                if (now - s->sessions[i].last_used > MCP_SESSION_IDLE_MAX)
                        session_remove(s, &s->sessions[i]);
                else
                        i++;
        if (s->n_sessions == s->max_sessions) {
                McpSession *oldest = &s->sessions[0];
                for (size_t i = 1; i < s->n_sessions; i++)
                        if (s->sessions[i].last_used < oldest->last_used)
                                oldest = &s->sessions[i];
                session_remove(s, oldest);
        }

        if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
                return NULL;
        x = &s->sessions[s->n_sessions++];
        memset(x, 0, sizeof(*x));
        for (size_t i = 0; i < sizeof(rnd); i++)
                snprintf(x->id + 2 * i, 3, "%02x", rnd[i]);
        snprintf(x->version, sizeof(x->version), "%s", version);
        x->last_used = now;
        return x;
}

static bool version_in(const char *v, const char *const *list, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (streq(v, list[i]))
                        return true;
        return false;
}

/* A revision with sessions (initialize echoes it). */
static bool version_supported(const char *v) {
        return version_in(v, session_versions, ELEMENTSOF(session_versions));
}

static bool version_stateless(const char *v) {
        return version_in(v, stateless_versions, ELEMENTSOF(stateless_versions));
}

/* Every revision this endpoint speaks, newest first: server/discover's supportedVersions, and the
 * list an unsupported version is refused with. */
static json_t *versions_json(void) {
        json_auto_t *a = json_array();

        if (!a)
                return NULL;
        for (size_t i = 0; i < ELEMENTSOF(stateless_versions); i++)
                if (json_array_append_new(a, json_string(stateless_versions[i])) < 0)
                        return NULL;
        for (size_t i = 0; i < ELEMENTSOF(session_versions); i++)
                if (json_array_append_new(a, json_string(session_versions[i])) < 0)
                        return NULL;
        return TAKE_PTR(a);
}

/* Whether an Accept header lists text/event-stream (and not with q=0). Wildcards do not count: the
 * MCP transport asks clients to name it, and a client that did not may not read a stream. */
static bool accepts_event_stream(const char *accept) {
        static const char type[] = "text/event-stream";

        for (const char *p = accept; p && *p;) {
                size_t n = strcspn(p, ",");
                const char *end = p + n, *params;
                size_t len;

                p += strspn(p, " \t");
                params = memchr(p, ';', (size_t) (end - p));
                len = (size_t) ((params ?: end) - p);
                while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
                        len--;
                if (len == strlen(type) && strncasecmp(p, type, len) == 0) {
                        bool refused = false;

                        /* q=0, q=0.0, q=0.00, q=0.000: "not acceptable" */
                        for (const char *q = params; q && q < end;
                             q = memchr(q + 1, ';', (size_t) (end - q - 1))) {
                                const char *x = q + 1 + strspn(q + 1, " \t");
                                if ((x[0] == 'q' || x[0] == 'Q') && x[1] == '=' && x[2] == '0') {
                                        size_t z = strspn(x + 3, ".0");
                                        refused = x + 3 + z >= end || strchr(" \t;", x[3 + z]);
                                }
                        }
                        if (!refused)
                                return true;
                }
                p = *end ? end + 1 : end;
        }
        return false;
}

static void reply_text(HttpRequest *req, unsigned status, const char *text) {
        (void) http_request_reply_text(req, status, text);
}

static json_t *jsonrpc_error(json_t *id, int code, const char *message) {
        return json_pack(
                "{s:s,s:O,s:{s:i,s:s}}",
                "jsonrpc",
                "2.0",
                "id",
                id ?: json_null(),
                "error",
                "code",
                code,
                "message",
                message);
}

static json_t *jsonrpc_result(json_t *id, json_t *result) {
        return json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result", result);
}

/* An error with data (taken; NULL: out of memory, and the answer is an internal error). */
static json_t *jsonrpc_error_data(json_t *id, int code, const char *message, json_t *data) {
        json_auto_t *msg = NULL;

        if (!data)
                return jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory");
        msg = jsonrpc_error(id, code, message);
        if (!msg || json_object_set_new(json_object_get(msg, "error"), "data", data) < 0)
                return NULL;
        return TAKE_PTR(msg);
}

/* The _meta every result of a stateless request carries: who answered. */
static json_t *result_meta_new(McpServer *s) {
        return json_pack(
                "{s:{s:s,s:s,s:s}}",
                MCP_META_SERVER_INFO,
                "name",
                "vm-manager",
                "title",
                "vm-manager",
                "version",
                manager_version(s->manager));
}

/* Marks result as the complete answer to a stateless request (result_meta: result_meta_new(), borrowed;
 * NULL: a session's request, left as it is). A list others may cache says for how long. */
static int result_finish(json_t *result, json_t *result_meta, bool cacheable) {
        if (!result_meta)
                return 0;
        if (json_object_set_new(result, "resultType", json_string("complete")) < 0 ||
            json_object_set(result, "_meta", result_meta) < 0)
                return -ENOMEM;
        if (cacheable &&
            (json_object_set_new(result, "ttlMs", json_integer(MCP_LIST_TTL_MS)) < 0 ||
             json_object_set_new(result, "cacheScope", json_string("public")) < 0))
                return -ENOMEM;
        return 0;
}

/* A JSON-RPC message as it goes out, prefix, the message in one line, suffix: a tool result's text,
 * left as [resource] by tool_result(), becomes the resource's indented rendering first. Runs on the
 * HTTP server's worker for a large message (exec_vm's output, a long list): touches msg alone. */
static char *message_render(json_t *msg, const char *prefix, const char *suffix, size_t *ret_size) {
        json_t *content = json_object_get(json_object_get(msg, "result"), "content"), *item;
        _cleanup_free_ char *s = NULL;
        char *out;
        size_t i;

        json_array_foreach(content, i, item) {
                json_t *text = json_object_get(item, "text");
                _cleanup_free_ char *t = NULL;

                if (!json_is_array(text))
                        continue;
                t = json_dumps(json_array_get(text, 0), JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
                if (!t || json_object_set_new(item, "text", json_string(t)) < 0)
                        return NULL;
        }
        s = json_dumps(msg, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!s)
                return NULL;
        if (asprintf(&out, "%s%s%s", prefix, s, suffix) < 0)
                return NULL;
        *ret_size = strlen(out);
        return out;
}

/* one JSON-RPC message per line */
static char *render_line(json_t *msg, size_t *ret_size) {
        return message_render(msg, "", "\n", ret_size);
}

/* one server-sent event */
static char *render_event(json_t *msg, size_t *ret_size) {
        return message_render(msg, "event: message\ndata: ", "\n\n", ret_size);
}

static void on_reply_rendered(HttpRequest *req, char *text, size_t size, const ApiError *error, void *userdata) {
        unsigned status = (unsigned) (uintptr_t) userdata;

        if (error && error->error == -ENOMEM)
                reply_text(req, 500, "out of memory\n");
        else if (error) /* shutting down, as for any request still waiting; or dropped */
                (void) http_request_reply_error(req, error);
        else
                (void) http_request_reply_take(req, status, "application/json", text, size);
}

/* Answers with msg (borrowed), rendered off the loop when it is large. */
static void reply_jsonrpc(HttpRequest *req, unsigned status, json_t *msg) {
        if (!msg) {
                reply_text(req, 500, "out of memory\n");
                return;
        }
        (void) http_request_render_async(
                req, json_incref(msg), render_line, on_reply_rendered, (void *) (uintptr_t) status);
}

/* The last event of a stream: the answer. Whatever went wrong, the stream ends. */
static void on_event_rendered(HttpRequest *req, char *text, size_t size, const ApiError *error, void *userdata) {
        if (error)
                (void) http_request_stream_end(req);
        else
                (void) http_request_stream_end_take(req, text, size);
}

static json_t *handle_initialize(McpServer *s, json_t *params, McpSession **ret_session) {
        json_t *w = json_object_get(params, "protocolVersion");
        const char *want = json_string_cstr(w);
        const char *version;
        McpSession *x;

        /* Echo a version we speak; otherwise offer the newest, and the client decides. No version
         * (or an empty one) is a client older than the field. */
        if (want && version_supported(want))
                version = want;
        else if (!json_is_string(w) || json_string_length(w) == 0)
                version = "2025-03-26";
        else
                version = MCP_LATEST_VERSION;

        x = session_new(s, version);
        if (!x)
                return NULL;
        *ret_session = x;
        return json_pack(
                "{s:s,s:{s:{s:b},s:{s:b,s:b}},s:{s:s,s:s,s:s},s:s}",
                "protocolVersion",
                version,
                "capabilities",
                "tools",
                "listChanged",
                false,
                "resources",
                "subscribe",
                true,
                "listChanged",
                true,
                "serverInfo",
                "name",
                "vm-manager",
                "title",
                "vm-manager",
                "version",
                manager_version(s->manager),
                "instructions",
                mcp_instructions);
}

static int tool_cmp(const void *a, const void *b) {
        return strcmp(
                json_string_value(json_object_get(*(json_t *const *) a, "name")),
                json_string_value(json_object_get(*(json_t *const *) b, "name")));
}

/* Every tool of the operation table, sorted by name, each with the outputSchema of its result. */
static json_t *tools_new(void) {
        json_auto_t *tools = json_array(), *schemas = NULL;
        size_t n;
        const Operation *table = operation_table(&n);
        _cleanup_free_ json_t **sorted = calloc(n, sizeof(json_t *));

        if (!tools || !sorted || mcp_schemas_load(&schemas) < 0)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                sorted[i] = operation_tool_json(&table[i]);
                if (!sorted[i] ||
                    json_object_set_new(sorted[i], "outputSchema", mcp_output_schema(&table[i], schemas)) < 0) {
                        for (size_t j = 0; j <= i; j++)
                                json_decref(sorted[j]);
                        return NULL;
                }
        }
        qsort(sorted, n, sizeof(json_t *), tool_cmp);
        for (size_t i = 0; i < n; i++)
                if (json_array_append_new(tools, sorted[i]) < 0) {
                        for (size_t j = i + 1; j < n; j++)
                                json_decref(sorted[j]);
                        return NULL;
                }
        return TAKE_PTR(tools);
}

static json_t *handle_tools_list(McpServer *s) {
        return json_pack("{s:O}", "tools", s->tools);
}

/* A tool result: the resource JSON as text and as structured content. The text is rendered with the
 * message (message_render(), off the loop when large): until then it is [resource], an array where a
 * text is a string. */
static json_t *tool_result(const Operation *op, json_t *resource) {
        json_auto_t *structured = NULL;

        if (!resource)
                return NULL;
        if (json_is_object(resource))
                structured = json_incref(resource);
        else
                structured = json_pack("{s:O}", op->list_key ?: "result", resource);
        if (!structured)
                return NULL;
        return json_pack(
                "{s:[{s:s,s:[O]}],s:O}", "content", "type", "text", "text", resource, "structuredContent", structured);
}

static json_t *tool_error(const ApiError *e) {
        _cleanup_free_ char *text = NULL;
        json_auto_t *structured = api_error_to_json(e);

        if (!structured)
                return NULL;
        asprintf_or_null(&text, "%s: %s", api_error_code_to_string(e->code), e->message);
        if (!text)
                return NULL;
        return json_pack(
                "{s:[{s:s,s:s}],s:O,s:b}",
                "content",
                "type",
                "text",
                "text",
                text,
                "structuredContent",
                structured,
                "isError",
                true);
}

/* An asynchronous tool call in flight: answered when the operation completes. Once its request is
 * gone (answered, or its client left first) only the operation's reference is left: the operation
 * goes on, and its completion frees the rest. */
typedef struct ToolCall {
        const Operation *op;
        HttpRequest *req; /* NULL without a connection (the fuzz target) or once the client left */
        json_t *id;
        json_t *progress_token;        /* the client's, when it asked for progress */
        unsigned progress;             /* notifications sent */
        bool streaming;                /* the answer became an event stream */
        bool in_call;                  /* still inside the handler: completion is synchronous */
        json_t *result;                /* the tool result, when it completed synchronously */
        usec_t keepalive;              /* of the event stream */
        sd_event_source *stream_timer; /* turns the answer into an event stream after MCP_STREAM_AFTER */
        Span *tool_span;               /* ends when the tool produced its result */
        Span *call_span;               /* the request's, when its answer is deferred: ends with the answer */
        Span *post_span;               /* the POST's, ended with the HTTP request */
        json_t *result_meta;           /* a stateless request's: the result's _meta; NULL in a session */
} ToolCall;

static ToolCall *tool_call_free(ToolCall *c) {
        if (!c)
                return NULL;
        json_decref(c->id);
        json_decref(c->progress_token);
        json_decref(c->result_meta);
        return mfree(c);
}

/* A span "<prefix><name>" below parent; NULL without a tracer. */
static Span *mcp_span_start(McpServer *s, const char *prefix, const char *name, const Span *parent) {
        _cleanup_free_ char *full = NULL;

        if (!s->tracer)
                return NULL;
        asprintf_or_null(&full, "%s%s", prefix, name);
        if (!full)
                return NULL;
        return span_start(s->tracer, full, SPAN_KIND_INTERNAL, parent, /* traceparent= */ NULL);
}

/* One server-sent event carrying a JSON-RPC message. */
static int stream_message(HttpRequest *req, json_t *msg) {
        _cleanup_free_ char *text = json_dumps(msg, JSON_COMPACT | JSON_PRESERVE_ORDER), *event = NULL;

        if (!text)
                return -ENOMEM;
        asprintf_or_null(&event, "event: message\ndata: %s\n\n", text);
        if (!event)
                return -ENOMEM;
        return http_request_stream_write(req, event, strlen(event));
}

/* Turns the answer into an event stream (headers now, the result as its last event) that carries
 * keep-alives while nothing else is sent. */
static int tool_call_stream(ToolCall *c) {
        int r;

        if (c->streaming)
                return 0;
        c->stream_timer = sd_event_source_disable_unref(c->stream_timer);
        r = http_request_add_header(c->req, "Cache-Control", "no-cache");
        if (r < 0)
                return r;
        r = http_request_reply_stream(c->req, 200, "text/event-stream");
        if (r < 0)
                return r;
        c->streaming = true;
        r = http_request_stream_keepalive(c->req, c->keepalive, MCP_KEEPALIVE_EVENT);
        if (r < 0)
                log_debug_errno(
                        r, "tools/call %s: no keep-alives on its event stream, ignoring: %m", c->op->name);
        return 0;
}

static int on_stream_timer(sd_event_source *source, usec_t usec, void *userdata) {
        ToolCall *c = userdata;

        c->stream_timer = sd_event_source_disable_unref(c->stream_timer);
        /* The headers leave with the first bytes of the body: send them now, not a keep-alive later. */
        if (c->req && tool_call_stream(c) >= 0)
                (void) http_request_stream_write(c->req, MCP_KEEPALIVE_EVENT, strlen(MCP_KEEPALIVE_EVENT));
        return 0;
}

/* A state change while the tool runs: with a progressToken, the answer turns into an event stream
 * whose events are notifications/progress, and whose last event is the result. */
static void tool_call_progress(const char *message, void *userdata) {
        ToolCall *c = userdata;
        json_auto_t *note = NULL;

        if (!c->progress_token || !c->req || c->in_call)
                return;
        if (tool_call_stream(c) < 0)
                return;
        c->progress++;
        note = json_pack(
                "{s:s,s:s,s:{s:O,s:I,s:s}}",
                "jsonrpc",
                "2.0",
                "method",
                "notifications/progress",
                "params",
                "progressToken",
                c->progress_token,
                "progress",
                (json_int_t) c->progress,
                "message",
                message);
        if (note)
                (void) stream_message(c->req, note);
}

static void on_post_done(unsigned status, void *userdata) {
        span_end_http_server(userdata, status);
}

/* The request ended before the answer: its client went away (noticed by a failed write, so with an
 * event stream at the latest at its second keep-alive), or the server is shutting down. */
static void tool_call_on_request_done(unsigned status, void *userdata) {
        ToolCall *c = userdata;

        log_debug("tools/call %s: the request ended before the answer; the operation goes on.", c->op->name);
        span_end_http_server(TAKE_PTR(c->post_span), status);
        span_set_error(c->call_span, "the request ended before the answer");
        span_end(TAKE_PTR(c->call_span));
        c->stream_timer = sd_event_source_disable_unref(c->stream_timer);
        c->req = http_request_unref(c->req);
        json_decref(TAKE_PTR(c->id));
        json_decref(TAKE_PTR(c->progress_token));
}

static void tool_call_done(int r, json_t *resource, const ApiError *e, void *userdata) {
        ToolCall *c = userdata;
        json_t *result;

        if (r < 0) {
                if (e && http_status_from_error(e) >= 500)
                        log_struct(LOG_ERR, LOG_FIELDS({ "TOOL", c->op->name }), "%s", e->message);
                result = e ? tool_error(e) : NULL;
                span_set_error(c->tool_span, e ? e->message : NULL);
        } else {
                json_auto_t *empty = resource ? NULL : json_object();
                result = tool_result(c->op, resource ?: empty);
        }
        if (result && result_finish(result, c->result_meta, /* cacheable= */ false) < 0) {
                json_decref(result);
                result = NULL;
        }
        span_end(TAKE_PTR(c->tool_span));
        if (c->in_call) {
                c->result = result;
                return;
        }
        if (c->req) {
                json_auto_t *msg = result ? jsonrpc_result(c->id, result) :
                                            jsonrpc_error(c->id, JSONRPC_INTERNAL_ERROR, "out of memory");

                /* the POST's completion goes back to ending its span */
                c->stream_timer = sd_event_source_disable_unref(c->stream_timer);
                http_request_on_done(c->req, c->post_span ? on_post_done : NULL, c->post_span);
                c->post_span = NULL;
                if (c->streaming) {
                        if (msg)
                                (void) http_request_render_async(
                                        c->req,
                                        TAKE_PTR(msg),
                                        render_event,
                                        on_event_rendered,
                                        /* userdata= */ NULL);
                        else
                                (void) http_request_stream_end(c->req);
                } else
                        reply_jsonrpc(c->req, 200, msg);
                http_request_unref(c->req);
        } else
                json_decref(result);
        span_end(c->call_span);
        tool_call_free(c);
}

/* A task-augmented tools/call's answer, and tasks/cancel's, wait for the task's record (below). */
typedef struct TaskCall TaskCall;
static TaskCall *task_call_new(json_t *id, json_t *result_meta, bool create);
static TaskCall *task_call_free(TaskCall *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(TaskCall *, task_call_free);
static void task_call_synced(int r, Task *t, const ApiError *e, void *userdata);
static void task_call_defer(TaskCall *c, McpPost *p);

/* call_span: the request's span; a deferred answer takes it. result_meta: a stateless request's
 * (borrowed), which a deferred result is finished with; NULL in a session. */
static json_t *handle_tools_call(
        McpServer *s,
        McpPost *post,
        json_t *id,
        json_t *params,
        json_t *result_meta,
        bool as_task,
        Span **call_span,
        int *ret_code,
        const char **ret_message) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *resource = NULL, *empty = NULL;
        const Caller *caller = post->request ? http_request_caller(post->request) : NULL;
        const Operation *op;
        const char *name;
        json_t *args, *v;
        int r;

        v = json_object_get(params, "name");
        if (!json_is_string(v)) {
                *ret_code = JSONRPC_INVALID_PARAMS;
                *ret_message = "tools/call needs params.name, a string";
                return NULL;
        }
        name = json_string_cstr(v); /* NULL with a NUL inside: no tool has such a name */
        op = name ? operation_find(name) : NULL;
        if (!op) {
                *ret_code = JSONRPC_INVALID_PARAMS;
                *ret_message = "unknown tool";
                return NULL;
        }
        args = json_object_get(params, "arguments");
        if (!args || json_is_null(args)) {
                empty = json_object();
                if (!empty)
                        return NULL;
                args = empty;
        } else if (!json_is_object(args)) {
                *ret_code = JSONRPC_INVALID_PARAMS;
                *ret_message = "tools/call params.arguments must be an object";
                return NULL;
        }

        span_set_attr_string(*call_span, "gen_ai.tool.name", op->name);
        _cleanup_(span_endp) Span *tool_span = mcp_span_start(s, "tool.", op->name, *call_span);
        span_set_attr_string(tool_span, "gen_ai.tool.name", op->name);

        if (as_task && op->task) {
                /* the Tasks extension: a task at once, recorded before the answer */
                _cleanup_(task_call_freep) TaskCall *c = task_call_new(id, result_meta, /* create= */ true);

                if (!c)
                        return NULL;
                r = task_start(manager_tasks(s->manager), op, caller, args, task_call_synced, c, &e);
                if (r < 0) {
                        /* refused before anything ran: the tool's own answer, as without a task */
                        span_set_error(tool_span, e.message);
                        return tool_error(&e);
                }
                task_call_defer(TAKE_PTR(c), post);
                return NULL;
        }

        if (op->async_handler || !(op->hints & OP_READ_ONLY)) {
                /* answered once the VM gets there and the records are on disk */
                ToolCall *c = calloc(1, sizeof(ToolCall));
                json_t *result, *token;

                if (!c)
                        return NULL;
                c->op = op;
                c->id = json_incref(id);
                c->result_meta = json_incref(result_meta);
                token = json_object_get(json_object_get(params, "_meta"), "progressToken");
                if (json_is_string(token) || json_is_integer(token))
                        c->progress_token = json_incref(token);
                c->tool_span = TAKE_PTR(tool_span);
                c->in_call = true;
                r = operation_run_async(
                        op, s->manager, caller, args, tool_call_done, tool_call_progress, c, &e);
                c->in_call = false;
                if (r < 0) {
                        span_set_error(c->tool_span, e.message);
                        span_end(c->tool_span);
                        tool_call_free(c);
                        return tool_error(&e);
                }
                if (c->result || !post->request) {
                        /* done already (or nobody to answer later: the caller gets it now or never) */
                        result = c->result;
                        if (!result && !post->request)
                                c->req = NULL; /* a late completion only frees */
                        else
                                tool_call_free(c);
                        if (!result) {
                                *ret_code = JSONRPC_INTERNAL_ERROR;
                                *ret_message = "the tool needs a connection to answer later";
                        }
                        return result;
                }
                c->req = http_request_ref(post->request);
                c->call_span = TAKE_PTR(*call_span);
                c->post_span = post->span;
                c->keepalive = s->keepalive;
                http_request_on_done(c->req, tool_call_on_request_done, c);
                if (accepts_event_stream(post->accept)) {
                        r = sd_event_add_time_relative(
                                manager_event(s->manager),
                                &c->stream_timer,
                                CLOCK_MONOTONIC,
                                MCP_STREAM_AFTER,
                                /* accuracy= */ 0,
                                on_stream_timer,
                                c);
                        if (r < 0)
                                log_debug_errno(r, "tools/call %s: answers in JSON, no timer: %m", op->name);
                }
                post->deferred = true;
                return NULL;
        }

        r = operation_run(op, s->manager, caller, args, &resource, &e);
        if (r < 0) {
                span_set_error(tool_span, e.message);
                if (http_status_from_error(&e) >= 500)
                        log_struct(LOG_ERR, LOG_FIELDS({ "TOOL", op->name }), "%s", e.message);
                return tool_error(&e);
        }
        if (!resource) {
                resource = json_object();
                if (!resource)
                        return NULL;
        }
        return tool_result(op, resource);
}

/* Stores the answer to a POST: status and JSON-RPC message (NULL: no body). A missing message for
 * a status that needs one means we ran out of memory. */
static void post_reply(McpPost *p, unsigned status, json_t *msg) {
        json_decref(p->reply);
        p->reply = msg;
        p->status = (!msg && status != 202) ? 500 : status;
}

/* The body field each method's Mcp-Name header mirrors (2026-07-28), for the methods that have one;
 * listed whether or not this server serves the method, so the header is checked before the method
 * is looked up, as for any other. */
static const struct {
        const char *method;
        const char *field;
} name_header_sources[] = {
        { "tools/call", "name" },  { "prompts/get", "name" },    { "resources/read", "uri" },
        { "tasks/get", "taskId" }, { "tasks/update", "taskId" }, { "tasks/cancel", "taskId" },
};

static const char *name_header_source(const char *method) {
        for (size_t i = 0; i < ELEMENTSOF(name_header_sources); i++)
                if (streq(method, name_header_sources[i].method))
                        return name_header_sources[i].field;
        return NULL;
}

/* Whether a header's value, without the optional whitespace around it (RFC 9110 §5.5), is want. A
 * value in the =?base64?…?= form is compared decoded. */
static bool header_matches(const char *header, const char *want) {
        static const char prefix[] = "=?base64?", suffix[] = "?=";
        _cleanup_free_ uint8_t *decoded = NULL;
        size_t n, size;

        header += strspn(header, " \t");
        n = strlen(header);
        while (n > 0 && (header[n - 1] == ' ' || header[n - 1] == '\t'))
                n--;
        if (n >= strlen(prefix) + strlen(suffix) && strncmp(header, prefix, strlen(prefix)) == 0 &&
            strncmp(header + n - strlen(suffix), suffix, strlen(suffix)) == 0) {
                if (base64_decode(
                            header + strlen(prefix),
                            n - strlen(prefix) - strlen(suffix),
                            PARAM_STRING_MAX,
                            &decoded,
                            &size,
                            /* reterr_offset= */ NULL) < 0)
                        return false;
                return size == strlen(want) && memcmp(decoded, want, size) == 0;
        }
        return n == strlen(want) && strncmp(header, want, n) == 0;
}

/* A stateless request's envelope: params._meta as revision 2026-07-28 defines it. Everything a
 * handler may depend on comes from here, the rest of the request, or the manager's records, never
 * from an earlier request (the Tasks extension will find the client's extensions in capabilities). */
typedef struct McpEnvelope {
        const char *version;
        json_t *capabilities; /* borrowed: the client's, for this request alone */
        json_t *client_info;  /* borrowed; NULL: not sent (it is optional) */
} McpEnvelope;

/* Checks params._meta; returns false with *ret_message set when it is not a valid envelope. The
 * protocol version is checked by the caller. */
static bool envelope_parse(json_t *params, McpEnvelope *ret, const char **ret_message) {
        json_t *meta = json_object_get(params, "_meta"), *v;

        if (!json_is_object(meta)) {
                *ret_message = "params._meta is required: it carries " MCP_META_PROTOCOL_VERSION
                               " and " MCP_META_CLIENT_CAPABILITIES;
                return false;
        }
        v = json_object_get(meta, MCP_META_PROTOCOL_VERSION);
        if (!json_is_string(v) || !json_string_cstr(v)) {
                *ret_message = "params._meta." MCP_META_PROTOCOL_VERSION " is required, a string";
                return false;
        }
        ret->version = json_string_cstr(v);
        ret->capabilities = json_object_get(meta, MCP_META_CLIENT_CAPABILITIES);
        if (!json_is_object(ret->capabilities)) {
                *ret_message = "params._meta." MCP_META_CLIENT_CAPABILITIES " is required, an object";
                return false;
        }
        ret->client_info = json_object_get(meta, MCP_META_CLIENT_INFO);
        if (ret->client_info &&
            !(json_is_object(ret->client_info) && json_is_string(json_object_get(ret->client_info, "name")) &&
              json_is_string(json_object_get(ret->client_info, "version")))) {
                *ret_message = "params._meta." MCP_META_CLIENT_INFO " must be an object with name and version";
                return false;
        }
        v = json_object_get(meta, MCP_META_LOG_LEVEL);
        if (v && !json_is_string(v)) {
                *ret_message = "params._meta." MCP_META_LOG_LEVEL " must be a string";
                return false;
        }
        return true;
}

static json_t *handle_discover(McpServer *s) {
        return json_pack(
                "{s:o,s:{s:{s:b},s:{s:b,s:b},s:{s:{}}},s:s}",
                "supportedVersions",
                versions_json(),
                "capabilities",
                "tools",
                "listChanged",
                false,
                "resources",
                "subscribe",
                true,
                "listChanged",
                true,
                "extensions",
                MCP_TASKS_EXTENSION,
                "instructions",
                mcp_instructions);
}

/* Whether the request's envelope declares the Tasks extension among the client's capabilities. */
static bool envelope_has_tasks(const McpEnvelope *envelope) {
        return json_object_get(json_object_get(envelope->capabilities, "extensions"), MCP_TASKS_EXTENSION);
}

/* A task's status on the wire. A failed operation is a tool's failure, which the extension reports as
 * a completed task whose result is the error, as the blocking call answers it; "failed" is for
 * what went wrong outside the tool (internal errors). */
static const char *task_wire_status(Task *t) {
        const ApiError *e = task_error(t);

        switch (task_status(t)) {
        case TASK_WORKING:
                return "working";
        case TASK_FAILED:
                return e && e->code == API_ERROR_INTERNAL ? "failed" : "completed";
        case TASK_CANCELLED:
                return "cancelled";
        default:
                return "completed";
        }
}

/* A tool result whose text is rendered now: inside a task it is not where message_render() looks. */
static json_t *tool_result_rendered(const Operation *op, json_t *resource) {
        json_auto_t *result = tool_result(op, resource);
        json_t *item = json_array_get(json_object_get(result, "content"), 0);
        _cleanup_free_ char *text = NULL;

        if (!item)
                return NULL;
        text = json_dumps(resource, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        if (!text || json_object_set_new(item, "text", json_string(text)) < 0)
                return NULL;
        return TAKE_PTR(result);
}

/* The Task of the extension: its status and times; with detailed (tasks/get), the result or error of
 * an ended one. */
static json_t *task_wire(Task *t, bool detailed) {
        _cleanup_free_ char *message = task_status_message(t);
        char created[RFC3339_MAX], updated[RFC3339_MAX];
        json_auto_t *j = NULL;
        const ApiError *e = task_error(t);

        if (!message)
                return NULL;
        j = json_pack(
                "{s:s,s:s,s:s,s:s,s:s,s:I}",
                "taskId",
                task_id(t),
                "status",
                task_wire_status(t),
                "statusMessage",
                message,
                "createdAt",
                format_rfc3339(task_created_at(t), created),
                "lastUpdatedAt",
                format_rfc3339(task_updated_at(t), updated),
                "ttlMs",
                (json_int_t) (TASK_KEEP / USEC_PER_MSEC));
        if (!j)
                return NULL;
        if (task_status(t) == TASK_WORKING &&
            json_object_set_new(j, "pollIntervalMs", json_integer(TASK_POLL_INTERVAL_MS)) < 0)
                return NULL;
        if (!detailed)
                return TAKE_PTR(j);
        if (task_status(t) == TASK_COMPLETED) {
                if (json_object_set_new(j, "result", tool_result_rendered(task_operation(t), task_result(t))) <
                    0)
                        return NULL;
        } else if (task_status(t) == TASK_FAILED && e->code != API_ERROR_INTERNAL) {
                if (json_object_set_new(j, "result", tool_error(e)) < 0)
                        return NULL;
        } else if (task_status(t) == TASK_FAILED) {
                if (json_object_set_new(
                            j,
                            "error",
                            json_pack("{s:i,s:s}", "code", JSONRPC_INTERNAL_ERROR, "message", e->message)) < 0)
                        return NULL;
        }
        return TAKE_PTR(j);
}

/* A task-augmented tools/call or a tasks/cancel waiting for its record to be on disk. */
typedef struct TaskCall {
        HttpRequest *req; /* a reference */
        json_t *id;
        json_t *result_meta;
        bool create; /* the answer is the CreateTaskResult; else tasks/cancel's acknowledgement */
} TaskCall;

static TaskCall *task_call_free(TaskCall *c) {
        if (!c)
                return NULL;
        http_request_unref(c->req);
        json_decref(c->id);
        json_decref(c->result_meta);
        return mfree(c);
}
static void task_call_synced(int r, Task *t, const ApiError *e, void *userdata) {
        _cleanup_(task_call_freep) TaskCall *c = userdata;
        json_auto_t *result = NULL, *msg = NULL;

        if (!c->req)
                return;
        if (c->create) {
                result = task_wire(t, /* detailed= */ false);
                if (result &&
                    (json_object_set_new(result, "resultType", json_string("task")) < 0 ||
                     json_object_set(result, "_meta", c->result_meta) < 0)) {
                        json_decref(result);
                        result = NULL;
                }
        } else {
                result = json_object();
                if (result && result_finish(result, c->result_meta, /* cacheable= */ false) < 0) {
                        json_decref(result);
                        result = NULL;
                }
        }
        msg = result ? jsonrpc_result(c->id, TAKE_PTR(result)) :
                       jsonrpc_error(c->id, JSONRPC_INTERNAL_ERROR, "out of memory");
        reply_jsonrpc(c->req, 200, msg);
}

/* The context of an answer that waits for a task's record; NULL on OOM. */
static TaskCall *task_call_new(json_t *id, json_t *result_meta, bool create) {
        TaskCall *c = calloc(1, sizeof(TaskCall));

        if (!c)
                return NULL;
        *c = (TaskCall){ .id = json_incref(id), .result_meta = json_incref(result_meta), .create = create };
        return c;
}

/* p's answer comes through its request once the record is on disk; without a request (the fuzz
 * target) nobody hears it. */
static void task_call_defer(TaskCall *c, McpPost *p) {
        c->req = http_request_ref(p->request);
        p->deferred = p->request != NULL;
        if (!p->request)
                post_reply(p, 202, NULL);
}

/* An unknown (or forgotten) task, a task that cannot be cancelled: invalid params, with the stable code
 * REST answers with in data. */
static json_t *task_error_reply(json_t *id, const ApiError *e, const char *task_id) {
        return jsonrpc_error_data(
                id,
                JSONRPC_INVALID_PARAMS,
                e->message,
                json_pack("{s:s,s:s}", "code", api_error_code_to_string(e->code), "taskId", task_id));
}

/* tasks/get, tasks/update and tasks/cancel. The answer is in p. */
static void handle_task_method(
        McpServer *s,
        McpPost *p,
        json_t *id,
        const char *method,
        json_t *params,
        const McpEnvelope *envelope,
        json_t *result_meta) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *result = NULL;
        const char *task_id;
        Task *t;
        int r;

        if (!envelope_has_tasks(envelope)) {
                post_reply(
                        p,
                        200,
                        jsonrpc_error_data(
                                id,
                                MCP_ERROR_MISSING_CAPABILITY,
                                "the Tasks extension is not declared in this request's client capabilities",
                                json_pack(
                                        "{s:{s:{s:{}}}}",
                                        "requiredCapabilities",
                                        "extensions",
                                        MCP_TASKS_EXTENSION)));
                return;
        }
        task_id = json_string_cstr(json_object_get(params, "taskId"));
        if (!task_id) {
                post_reply(
                        p,
                        200,
                        jsonrpc_error(id, JSONRPC_INVALID_PARAMS, "params.taskId is required, a string"));
                return;
        }
        if (streq(method, "tasks/update") && json_object_get(params, "inputResponses") &&
            !json_is_object(json_object_get(params, "inputResponses"))) {
                post_reply(
                        p,
                        200,
                        jsonrpc_error(id, JSONRPC_INVALID_PARAMS, "params.inputResponses must be an object"));
                return;
        }
        t = task_registry_get(manager_tasks(s->manager), task_id);
        if (!t) {
                (void) api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "task \"%s\"", task_id);
                post_reply(p, 200, task_error_reply(id, &e, task_id));
                return;
        }
        if (streq(method, "tasks/get"))
                result = task_wire(t, /* detailed= */ true);
        else if (streq(method, "tasks/update"))
                /* none of these tasks ever asks for input: there is nothing outstanding to answer */
                result = json_object();
        else {
                _cleanup_(task_call_freep) TaskCall *c = task_call_new(id, result_meta, /* create= */ false);

                if (!c) {
                        post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                        return;
                }
                r = task_cancel(t, task_call_synced, c, &e);
                if (r < 0) {
                        post_reply(p, 200, task_error_reply(id, &e, task_id));
                        return;
                }
                if (r == 0) {
                        /* answered once the cancellation is on disk */
                        task_call_defer(TAKE_PTR(c), p);
                        return;
                }
                /* ended already: the extension acknowledges it all the same, and nothing changes */
                result = json_object();
        }
        if (!result || result_finish(result, result_meta, /* cacheable= */ false) < 0) {
                post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                return;
        }
        post_reply(p, 200, jsonrpc_result(id, TAKE_PTR(result)));
}

/* ---- VMs as resources ----
 *
 * Each VM is two resources: vm://{id}, its record as get_vm returns it (JSON), and vm://{id}/console,
 * the tail of its serial console as get_vm_console returns it (text). A client that follows them
 * hears notifications/resources/updated when the VM's state changes (a session on its GET stream,
 * after resources/subscribe; revision 2026-07-28 on a subscriptions/listen stream), and
 * notifications/resources/list_changed when a VM is created or removed. The console is not watched
 * byte by byte: its subscribers hear the same state changes. */

#define MCP_RESOURCE_SCHEME "vm://"
#define MCP_RESOURCE_CONSOLE_SUFFIX "/console"
/* The longest VM id a resource URI may carry (ids are 32 hex digits; names are not ids). */
#define MCP_RESOURCE_ID_MAX 64
/* The URIs one session or one listen stream may follow (and the tasks one listen stream may), and
 * the listen streams open at once. */
#define MCP_SUBSCRIPTIONS_MAX 64
#define MCP_LISTENS_MAX 256
/* The most a notification stream may hold unsent: about 250 notifications. A consumer further behind
 * loses its stream (ended, not trimmed): it learns from the end that it missed notifications, and
 * re-reads what it follows when it comes back, which silently dropped events would never tell it. */
#define MCP_NOTIFY_BACKLOG_MAX ((size_t) 64 * 1024)
/* Resource reads answer what is true now: nobody may keep them, and under OAuth they are the
 * caller's. */
#define MCP_RESOURCE_TTL_MS 0
/* The state a notifications/resources/updated carries in its _meta, so that a client sees each
 * transition even when its read comes after the next one. */
#define MCP_META_VM_STATE "vm-manager/state"
/* The record URI of the VM a notifications/resources/list_changed is about. */
#define MCP_META_VM_URI "vm-manager/uri"
#define MCP_META_SUBSCRIPTION_ID "io.modelcontextprotocol/subscriptionId"

typedef enum McpResourceKind {
        MCP_RESOURCE_RECORD,
        MCP_RESOURCE_CONSOLE,
} McpResourceKind;

/* Splits a resource URI of this server into the VM id (copied into id) and the kind; false when it
 * is none. */
static bool resource_uri_parse(
        const char *uri, char id[static MCP_RESOURCE_ID_MAX + 1], McpResourceKind *ret_kind) {
        size_t n;

        if (!uri || strncmp(uri, MCP_RESOURCE_SCHEME, strlen(MCP_RESOURCE_SCHEME)) != 0)
                return false;
        uri += strlen(MCP_RESOURCE_SCHEME);
        n = strspn(uri, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_");
        if (n == 0 || n > MCP_RESOURCE_ID_MAX)
                return false;
        if (uri[n] == 0)
                *ret_kind = MCP_RESOURCE_RECORD;
        else if (streq(uri + n, MCP_RESOURCE_CONSOLE_SUFFIX))
                *ret_kind = MCP_RESOURCE_CONSOLE;
        else
                return false;
        memcpy(id, uri, n);
        id[n] = 0;
        return true;
}

/* The "not found" of a resource: -32002 in the sessions' revisions, -32602 from 2026-07-28 on
 * (SEP-2164), with the URI in data either way. */
static json_t *resource_not_found(json_t *id, bool stateless, const char *uri, const char *message) {
        return jsonrpc_error_data(
                id,
                stateless ? JSONRPC_INVALID_PARAMS : MCP_ERROR_RESOURCE_NOT_FOUND,
                message,
                json_pack("{s:s}", "uri", uri));
}

static json_t *handle_resources_list(McpServer *s) {
        json_auto_t *list = json_array();
        Vm *v;

        if (!list)
                return NULL;
        MANAGER_FOREACH_VM(v, s->manager, i) {
                _cleanup_free_ char *uri = NULL, *console = NULL, *title = NULL, *description = NULL;
                const char *state = vm_state_to_string(vm_state(v));

                if (asprintf(&uri, MCP_RESOURCE_SCHEME "%s", vm_id(v)) < 0 ||
                    asprintf(&console, MCP_RESOURCE_SCHEME "%s" MCP_RESOURCE_CONSOLE_SUFFIX, vm_id(v)) < 0 ||
                    asprintf(&title, "%s console", vm_name(v)) < 0 ||
                    asprintf(&description, "VM %s (%s): its record, as get_vm returns it", vm_name(v), state) <
                            0)
                        return NULL;
                if (json_array_append_new(
                            list,
                            json_pack(
                                    "{s:s,s:s,s:s,s:s,s:s}",
                                    "uri",
                                    uri,
                                    "name",
                                    vm_name(v),
                                    "title",
                                    vm_name(v),
                                    "description",
                                    description,
                                    "mimeType",
                                    "application/json")) < 0 ||
                    json_array_append_new(
                            list,
                            json_pack(
                                    "{s:s,s:s,s:s,s:s,s:s}",
                                    "uri",
                                    console,
                                    "name",
                                    title,
                                    "title",
                                    title,
                                    "description",
                                    "the tail of the VM's serial console, as get_vm_console returns it",
                                    "mimeType",
                                    "text/plain")) < 0)
                        return NULL;
        }
        return json_pack("{s:O}", "resources", list);
}

static json_t *handle_resource_templates_list(void) {
        return json_pack(
                "{s:[{s:s,s:s,s:s,s:s,s:s},{s:s,s:s,s:s,s:s,s:s}]}",
                "resourceTemplates",
                "uriTemplate",
                MCP_RESOURCE_SCHEME "{id}",
                "name",
                "vm",
                "title",
                "VM record",
                "description",
                "A VM's record by its id (list_vms), as get_vm returns it: state, address, attestation, "
                "lastError. Subscribe to hear its state changes.",
                "mimeType",
                "application/json",
                "uriTemplate",
                MCP_RESOURCE_SCHEME "{id}" MCP_RESOURCE_CONSOLE_SUFFIX,
                "name",
                "vm-console",
                "title",
                "VM console",
                "description",
                "The last 100 lines of a VM's serial console, as get_vm_console returns them.",
                "mimeType",
                "text/plain");
}

/* resources/read: a VM's record or its console, read through the same operation as the tool, so a
 * resource and a tool result cannot differ. The answer is in p. */
static void handle_resources_read(McpServer *s, McpPost *p, json_t *id, json_t *params, json_t *result_meta) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *args = NULL, *resource = NULL, *result = NULL;
        const char *uri = json_string_cstr(json_object_get(params, "uri"));
        const Caller *caller = p->request ? http_request_caller(p->request) : NULL;
        char vm[MCP_RESOURCE_ID_MAX + 1];
        _cleanup_free_ char *text = NULL;
        McpResourceKind kind;
        const Operation *op;
        bool stateless = result_meta;

        if (!uri) {
                post_reply(
                        p, 200, jsonrpc_error(id, JSONRPC_INVALID_PARAMS, "params.uri is required, a string"));
                return;
        }
        if (!resource_uri_parse(uri, vm, &kind)) {
                post_reply(
                        p,
                        200,
                        resource_not_found(
                                id,
                                stateless,
                                uri,
                                "not a resource of this server: its resources are vm://{id} and "
                                "vm://{id}/console"));
                return;
        }
        op = operation_find(kind == MCP_RESOURCE_RECORD ? "get_vm" : "get_vm_console");
        args = json_pack("{s:s}", "id", vm);
        if (!op || !args) {
                post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                return;
        }
        if (operation_run(op, s->manager, caller, args, &resource, &e) < 0) {
                if (e.code == API_ERROR_NOT_FOUND) {
                        _cleanup_free_ char *message = NULL;

                        asprintf_or_null(&message, "no VM \"%s\" (resource %s)", vm, uri);
                        post_reply(p, 200, resource_not_found(id, stateless, uri, message ?: "no such VM"));
                } else
                        post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, e.message));
                return;
        }
        if (kind == MCP_RESOURCE_RECORD)
                text = json_dumps(resource, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        else
                text = strdup(json_string_value(json_object_get(resource, "console")) ?: "");
        if (text)
                result = json_pack(
                        "{s:[{s:s,s:s,s:s}]}",
                        "contents",
                        "uri",
                        uri,
                        "mimeType",
                        kind == MCP_RESOURCE_RECORD ? "application/json" : "text/plain",
                        "text",
                        text);
        if (!result || result_finish(result, result_meta, /* cacheable= */ false) < 0 ||
            (stateless &&
             (json_object_set_new(result, "ttlMs", json_integer(MCP_RESOURCE_TTL_MS)) < 0 ||
              json_object_set_new(result, "cacheScope", json_string("private")) < 0))) {
                post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                return;
        }
        post_reply(p, 200, jsonrpc_result(id, TAKE_PTR(result)));
}

/* notifications/tasks (the Tasks extension): the task as tasks/get would answer now, with the
 * subscription's id. */
static json_t *task_notification_new(Task *t, json_t *subscription_id) {
        json_auto_t *params = task_wire(t, /* detailed= */ true);

        if (!params ||
            json_object_set_new(
                    params, "_meta", json_pack("{s:O}", MCP_META_SUBSCRIPTION_ID, subscription_id)) < 0)
                return NULL;
        return json_pack("{s:s,s:s,s:O}", "jsonrpc", "2.0", "method", "notifications/tasks", "params", params);
}

/* A set of resource URIs that one session or one listen stream follows. */
typedef struct McpSubscriptions {
        char *uris[MCP_SUBSCRIPTIONS_MAX];
        size_t n;
        bool list_changed; /* also notifications/resources/list_changed */
} McpSubscriptions;

static void subscriptions_done(McpSubscriptions *x) {
        for (size_t i = 0; i < x->n; i++)
                free(x->uris[i]);
        *x = (McpSubscriptions){};
}

static bool subscriptions_has(const McpSubscriptions *x, const char *uri) {
        for (size_t i = 0; i < x->n; i++)
                if (streq(x->uris[i], uri))
                        return true;
        return false;
}

/* Adds uri (0, or 0 again when it is there already); -E2BIG past MCP_SUBSCRIPTIONS_MAX. */
static int subscriptions_add(McpSubscriptions *x, const char *uri) {
        if (subscriptions_has(x, uri))
                return 0;
        if (x->n >= MCP_SUBSCRIPTIONS_MAX)
                return -E2BIG;
        x->uris[x->n] = strdup(uri);
        if (!x->uris[x->n])
                return -ENOMEM;
        x->n++;
        return 0;
}

static void subscriptions_remove(McpSubscriptions *x, const char *uri) {
        for (size_t i = 0; i < x->n; i++)
                if (streq(x->uris[i], uri)) {
                        free(x->uris[i]);
                        x->uris[i] = x->uris[--x->n];
                        return;
                }
}

/* Writes one notification on a stream whose reader may lag. Past MCP_NOTIFY_BACKLOG_MAX unsent bytes
 * the stream is ended instead (-ENOBUFS): the caller forgets it. Other errors: the client left. */
static int stream_notify(HttpRequest *req, json_t *msg) {
        int r;

        if (!msg)
                return 0; /* out of memory: this notification is lost, the stream goes on */
        if (http_request_stream_unsent(req) > MCP_NOTIFY_BACKLOG_MAX) {
                log_debug(
                        "MCP: a notification stream fell %zu bytes behind, ending it.",
                        http_request_stream_unsent(req));
                (void) http_request_stream_end(req);
                return -ENOBUFS;
        }
        r = stream_message(req, msg);
        if (r == -ENOBUFS)
                (void) http_request_stream_end(req);
        return r;
}

/* notifications/resources/updated for uri; subscription_id: the listen stream's (NULL: a session's GET
 * stream); state: the VM's new state, NULL once it is gone. */
static json_t *resource_updated_new(const char *uri, json_t *subscription_id, const char *state) {
        json_auto_t *meta = json_object(), *msg = NULL;

        if (!meta ||
            (subscription_id && json_object_set(meta, MCP_META_SUBSCRIPTION_ID, subscription_id) < 0) ||
            (state && json_object_set_new(meta, MCP_META_VM_STATE, json_string(state)) < 0))
                return NULL;
        msg = json_pack(
                "{s:s,s:s,s:{s:s,s:O}}",
                "jsonrpc",
                "2.0",
                "method",
                "notifications/resources/updated",
                "params",
                "uri",
                uri,
                "_meta",
                meta);
        return TAKE_PTR(msg);
}

/* The list changed because of one VM: its record's URI rides in the _meta, with its state when it
 * came (a create's "creating"; none when it went), so that a client hears a new VM from its first
 * state on and knows which URI to follow without listing. */
static json_t *resource_list_changed_new(json_t *subscription_id, const char *uri, const char *state) {
        json_auto_t *meta = json_object();

        if (!meta || json_object_set_new(meta, MCP_META_VM_URI, json_string(uri)) < 0 ||
            (state && json_object_set_new(meta, MCP_META_VM_STATE, json_string(state)) < 0) ||
            (subscription_id && json_object_set(meta, MCP_META_SUBSCRIPTION_ID, subscription_id) < 0))
                return NULL;
        return json_pack(
                "{s:s,s:s,s:{s:O}}",
                "jsonrpc",
                "2.0",
                "method",
                "notifications/resources/list_changed",
                "params",
                "_meta",
                meta);
}

/* What one stream hears of a VM's change; false when the stream had to go. */
static bool subscriptions_notify(
        const McpSubscriptions *x,
        HttpRequest *req,
        json_t *subscription_id,
        char *const uris[static 2],
        const char *state,
        bool list_changed) {
        for (size_t i = 0; i < 2; i++)
                if (subscriptions_has(x, uris[i])) {
                        json_auto_t *msg = resource_updated_new(uris[i], subscription_id, state);
                        if (stream_notify(req, msg) < 0)
                                return false;
                }
        if (list_changed && x->list_changed) {
                json_auto_t *msg = resource_list_changed_new(subscription_id, uris[0], state);
                if (stream_notify(req, msg) < 0)
                        return false;
        }
        return true;
}

static void subscriptions_free(McpSubscriptions *x) {
        if (!x)
                return;
        subscriptions_done(x);
        free(x);
}

/* A subscriptions/listen stream (2026-07-28): the answer to one POST, held open, on which the VMs it
 * follows are notified. It ends when its client leaves, when it falls behind (stream_notify()), or
 * when the server goes. */
struct McpListen {
        McpServer *server;
        HttpRequest *req; /* a reference */
        json_t *id;       /* the listen request's id: the subscription's, in each notification's _meta */
        Span *post_span;  /* the POST's, ended with the stream */
        McpSubscriptions subs;
        McpSubscriptions tasks; /* the ids of the tasks it follows (notifications/tasks) */
        McpListen *prev, *next;
};

static McpListen *listen_free(McpListen *l) {
        if (!l)
                return NULL;
        if (l->prev)
                l->prev->next = l->next;
        else if (l->server->listens == l)
                l->server->listens = l->next;
        if (l->next)
                l->next->prev = l->prev;
        l->server->n_listens--;
        if (l->req) {
                http_request_on_done(l->req, /* done= */ NULL, /* userdata= */ NULL);
                (void) http_request_stream_end(l->req);
                http_request_unref(l->req);
        }
        span_end_http_server(l->post_span, 0);
        subscriptions_done(&l->subs);
        subscriptions_done(&l->tasks);
        json_decref(l->id);
        return mfree(l);
}

static void listen_on_done(unsigned status, void *userdata) {
        McpListen *l = userdata;

        span_end_http_server(TAKE_PTR(l->post_span), status);
        http_request_on_done(l->req, /* done= */ NULL, /* userdata= */ NULL);
        l->req = http_request_unref(l->req);
        listen_free(l);
}

/* A list of a listen filter (resourceSubscriptions, taskIds): absent, or an array of at most
 * MCP_SUBSCRIPTIONS_MAX strings. */
static bool filter_list_ok(json_t *list) {
        json_t *x;
        size_t i;

        if (!list)
                return true;
        if (!json_is_array(list) || json_array_size(list) > MCP_SUBSCRIPTIONS_MAX)
                return false;
        json_array_foreach(list, i, x) {
                if (!json_is_string(x))
                        return false;
        }
        return true;
}

/* subscriptions/listen: the notifications asked for that this server can send (the resources of VMs
 * that exist, the resource list), acknowledged as the stream's first event. The answer is in p, or
 * the stream itself (p->answered). */
static void handle_listen(McpServer *s, McpPost *p, json_t *id, json_t *params, const McpEnvelope *envelope) {
        json_t *filter = json_object_get(params, "notifications"), *uris, *uri, *task_ids;
        json_auto_t *honored = NULL, *honored_tasks = NULL, *ack = NULL;
        TaskRegistry *reg = manager_tasks(s->manager);
        McpListen *l;
        size_t i;
        int r;

        if (!json_is_object(filter)) {
                post_reply(
                        p,
                        200,
                        jsonrpc_error(
                                id, JSONRPC_INVALID_PARAMS, "params.notifications is required, an object"));
                return;
        }
        uris = json_object_get(filter, "resourceSubscriptions");
        task_ids = json_object_get(filter, "taskIds");
        if (!filter_list_ok(uris) || !filter_list_ok(task_ids)) {
                post_reply(
                        p,
                        200,
                        jsonrpc_error(
                                id,
                                JSONRPC_INVALID_PARAMS,
                                !filter_list_ok(uris) ? "params.notifications.resourceSubscriptions must be an "
                                                        "array of at most 64 URIs (strings)" :
                                                        "params.notifications.taskIds must be an array of at "
                                                        "most 64 task ids (strings)"));
                return;
        }
        if (!p->request) {
                post_reply(
                        p,
                        200,
                        jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "subscriptions/listen needs a connection"));
                return;
        }
        if (!accepts_event_stream(p->accept)) {
                post_reply(
                        p,
                        406,
                        jsonrpc_error(
                                id,
                                JSONRPC_INVALID_REQUEST,
                                "subscriptions/listen answers with an event stream: Accept must list "
                                "text/event-stream"));
                return;
        }
        if (s->n_listens >= MCP_LISTENS_MAX) {
                post_reply(
                        p,
                        503,
                        jsonrpc_error(
                                id,
                                JSONRPC_INTERNAL_ERROR,
                                "too many subscriptions/listen streams are open, try again later"));
                return;
        }

        l = calloc(1, sizeof(McpListen));
        honored = json_array();
        honored_tasks = json_array();
        if (!l || !honored || !honored_tasks) {
                free(l);
                post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                return;
        }
        *l = (McpListen){ .server = s, .id = json_incref(id), .next = s->listens };
        if (s->listens)
                s->listens->prev = l;
        s->listens = l;
        s->n_listens++;

        /* a URI that is none of ours, or of a VM that does not exist, is left out of the acknowledgement */
        json_array_foreach(uris, i, uri) {
                char vm[MCP_RESOURCE_ID_MAX + 1];
                McpResourceKind kind;

                if (!resource_uri_parse(json_string_cstr(uri), vm, &kind) || !manager_find_vm(s->manager, vm))
                        continue;
                if (subscriptions_add(&l->subs, json_string_cstr(uri)) < 0 ||
                    json_array_append(honored, uri) < 0) {
                        listen_free(l);
                        post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                        return;
                }
        }
        /* tasks are followed by a client that declared the extension, and only those that exist */
        json_array_foreach(task_ids, i, uri) {
                if (!envelope_has_tasks(envelope) || !task_registry_get(reg, json_string_cstr(uri)))
                        continue;
                if (subscriptions_add(&l->tasks, json_string_cstr(uri)) < 0 ||
                    json_array_append(honored_tasks, uri) < 0) {
                        listen_free(l);
                        post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                        return;
                }
        }
        l->subs.list_changed = json_is_true(json_object_get(filter, "resourcesListChanged"));
        ack = json_pack(
                "{s:s,s:s,s:{s:{},s:{s:O}}}",
                "jsonrpc",
                "2.0",
                "method",
                "notifications/subscriptions/acknowledged",
                "params",
                "notifications",
                "_meta",
                MCP_META_SUBSCRIPTION_ID,
                id);
        filter = json_object_get(json_object_get(ack, "params"), "notifications");
        if (!ack || (uris && json_object_set(filter, "resourceSubscriptions", honored) < 0) ||
            (task_ids && json_object_set(filter, "taskIds", honored_tasks) < 0) ||
            (l->subs.list_changed && json_object_set_new(filter, "resourcesListChanged", json_true()) < 0)) {
                listen_free(l);
                post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                return;
        }

        r = http_request_add_header(p->request, "Cache-Control", "no-cache");
        if (r >= 0)
                r = http_request_reply_stream(p->request, 200, "text/event-stream");
        if (r < 0) {
                listen_free(l);
                post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                return;
        }
        l->req = http_request_ref(p->request);
        l->post_span = p->span;
        http_request_on_done(l->req, listen_on_done, l);
        p->answered = true;
        (void) stream_message(l->req, ack);
        /* where each task stands now, so that nothing between its creation and this stream is missed */
        for (size_t k = l->tasks.n; k > 0; k--) {
                Task *t = task_registry_get(reg, l->tasks.uris[k - 1]);
                json_auto_t *msg = t ? task_notification_new(t, l->id) : NULL;

                (void) stream_notify(l->req, msg);
                if (!t || task_status(t) != TASK_WORKING) /* it will not change again */
                        subscriptions_remove(&l->tasks, l->tasks.uris[k - 1]);
        }
        r = http_request_stream_keepalive(l->req, s->keepalive, MCP_KEEPALIVE_EVENT);
        if (r < 0)
                log_debug_errno(r, "subscriptions/listen: no keep-alives on its stream, ignoring: %m");
}

/* resources/subscribe and resources/unsubscribe of a session (2025-11-25): the notifications go on its
 * GET stream, while one is open. */
static json_t *handle_session_subscribe(McpSession *x, json_t *id, json_t *params, bool subscribe, Manager *m) {
        const char *uri = json_string_cstr(json_object_get(params, "uri"));
        char vm[MCP_RESOURCE_ID_MAX + 1];
        McpResourceKind kind;
        int r;

        if (!uri)
                return jsonrpc_error(id, JSONRPC_INVALID_PARAMS, "params.uri is required, a string");
        if (!subscribe) {
                if (x->subs)
                        subscriptions_remove(x->subs, uri);
                return jsonrpc_result(id, json_object());
        }
        if (!resource_uri_parse(uri, vm, &kind))
                return resource_not_found(
                        id,
                        /* stateless= */ false,
                        uri,
                        "not a resource of this server: its resources are vm://{id} and vm://{id}/console");
        if (!manager_find_vm(m, vm))
                return resource_not_found(id, /* stateless= */ false, uri, "no such VM");
        if (!x->subs) {
                x->subs = calloc(1, sizeof(McpSubscriptions));
                if (!x->subs)
                        return jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory");
                x->subs->list_changed = true;
        }
        r = subscriptions_add(x->subs, uri);
        if (r == -E2BIG)
                return jsonrpc_error(id, JSONRPC_INVALID_PARAMS, "a session follows at most 64 resources");
        if (r < 0)
                return jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory");
        return jsonrpc_result(id, json_object());
}

/* A VM changed (manager_watch_vms()): the streams that follow it hear of it. Runs inside the VM's
 * transition: it only formats and queues, never waits. */
static void on_vm_event(Vm *v, ManagerVmEvent event, void *userdata) {
        McpServer *s = userdata;
        _cleanup_free_ char *record = NULL, *console = NULL;
        const char *state = event == MANAGER_VM_REMOVED ? NULL : vm_state_to_string(vm_state(v));
        bool list_changed = event != MANAGER_VM_STATE;

        if (asprintf(&record, MCP_RESOURCE_SCHEME "%s", vm_id(v)) < 0 ||
            asprintf(&console, MCP_RESOURCE_SCHEME "%s" MCP_RESOURCE_CONSOLE_SUFFIX, vm_id(v)) < 0)
                return;
        char *const uris[2] = { record, console };

        for (size_t i = 0; i < s->n_sessions; i++) {
                McpSession *x = &s->sessions[i];
                /* every session's stream hears list changes, as the capability promises */
                static const McpSubscriptions none = { .list_changed = true };

                if (x->stream &&
                    !subscriptions_notify(
                            x->subs ?: &none, x->stream, /* subscription_id= */ NULL, uris, state, list_changed))
                        session_close_stream(x);
        }
        /* a stream that has to go ends, and goes when its request is done, not here */
        for (McpListen *l = s->listens; l; l = l->next) {
                if (!l->req || !subscriptions_notify(&l->subs, l->req, l->id, uris, state, list_changed))
                        continue;
                /* the tasks it follows that wait for this VM: their status message is its state */
                for (size_t i = 0; i < l->tasks.n; i++) {
                        Task *t = task_registry_get(manager_tasks(s->manager), l->tasks.uris[i]);

                        if (t && task_follows_vm(t, vm_id(v))) {
                                json_auto_t *msg = task_notification_new(t, l->id);
                                if (stream_notify(l->req, msg) < 0)
                                        break;
                        }
                }
        }
}

/* A task ended and its record is on disk: the streams that follow it hear how, and forget it. */
static void on_task_ended(Task *t, void *userdata) {
        McpServer *s = userdata;

        for (McpListen *l = s->listens; l; l = l->next) {
                if (!l->req || !subscriptions_has(&l->tasks, task_id(t)))
                        continue;
                json_auto_t *msg = task_notification_new(t, l->id);
                (void) stream_notify(l->req, msg);
                subscriptions_remove(&l->tasks, task_id(t));
        }
}

/* One request of a stateless revision (2026-07-28): the checks in the order the revision ranks them
 * (the protocol version, the envelope, the standard headers, the method), then the method. Nothing
 * of a session is read or made. The answer is in p. */
static void handle_stateless(McpServer *s, McpPost *p, json_t *id, const char *method, json_t *params) {
        json_t *meta = json_object_get(params, "_meta");
        json_t *body_version = json_is_object(meta) ? json_object_get(meta, MCP_META_PROTOCOL_VERSION) : NULL;
        json_auto_t *result = NULL, *result_meta = NULL;
        McpEnvelope envelope = {};
        const char *message = NULL, *field;
        bool cacheable = false;
        int code = 0;

        if (!method) {
                /* this revision sends no requests to clients, so there is nothing to answer */
                post_reply(p, 400, jsonrpc_error(id, JSONRPC_INVALID_REQUEST, "a request needs a method"));
                return;
        }
        if (p->protocol_version && json_is_string(body_version) &&
            !streq(p->protocol_version, json_string_value(body_version))) {
                post_reply(
                        p,
                        400,
                        jsonrpc_error(
                                id,
                                MCP_ERROR_HEADER_MISMATCH,
                                "the MCP-Protocol-Version header does not match params._meta." MCP_META_PROTOCOL_VERSION));
                return;
        }
        if (!id) {
                /* notifications (cancelled, …) need no answer, nor the headers of a request */
                post_reply(p, 202, NULL);
                return;
        }
        if (!envelope_parse(params, &envelope, &message)) {
                post_reply(p, 400, jsonrpc_error(id, JSONRPC_INVALID_PARAMS, message));
                return;
        }
        if (!version_stateless(envelope.version)) {
                post_reply(
                        p,
                        400,
                        jsonrpc_error_data(
                                id,
                                MCP_ERROR_UNSUPPORTED_VERSION,
                                "unsupported protocol version",
                                json_pack("{s:o,s:s}", "supported", versions_json(), "requested", envelope.version)));
                return;
        }
        if (!p->protocol_version)
                message = "missing MCP-Protocol-Version header";
        else if (!p->mcp_method)
                message = "missing Mcp-Method header";
        else if (!header_matches(p->mcp_method, method))
                message = "the Mcp-Method header does not match the method";
        else if ((field = name_header_source(method)) && json_string_cstr(json_object_get(params, field))) {
                if (!p->mcp_name)
                        message = "missing Mcp-Name header";
                else if (!header_matches(p->mcp_name, json_string_cstr(json_object_get(params, field))))
                        message = "the Mcp-Name header does not match the request";
        }
        if (message) {
                post_reply(p, 400, jsonrpc_error(id, MCP_ERROR_HEADER_MISMATCH, message));
                return;
        }

        bool task_method = streq(method, "tasks/get") || streq(method, "tasks/update") ||
                streq(method, "tasks/cancel");
        bool resource_method = streq(method, "resources/list") || streq(method, "resources/templates/list") ||
                streq(method, "resources/read") || streq(method, "subscriptions/listen");
        bool known = streq(method, "server/discover") || streq(method, "tools/list") ||
                streq(method, "tools/call") || task_method || resource_method;
        _cleanup_(span_endp) Span *span = mcp_span_start(s, "mcp.", known ? method : "unknown", p->span);
        span_set_attr_string(span, "mcp.method.name", method);
        span_set_attr_string(span, "mcp.protocol.version", envelope.version);

        result_meta = result_meta_new(s);
        if (!result_meta) {
                post_reply(p, 200, jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
                return;
        }
        if (streq(method, "server/discover")) {
                result = handle_discover(s);
                cacheable = true;
        } else if (streq(method, "tools/list")) {
                result = handle_tools_list(s);
                cacheable = true;
        } else if (streq(method, "tools/call")) {
                result = handle_tools_call(
                        s, p, id, params, result_meta, envelope_has_tasks(&envelope), &span, &code, &message);
                if (p->deferred)
                        return; /* answered when the operation completes */
        } else if (task_method) {
                handle_task_method(s, p, id, method, params, &envelope, result_meta);
                return;
        } else if (streq(method, "resources/list")) {
                result = handle_resources_list(s);
                /* what is true now, and under OAuth the caller's: nobody keeps it */
                if (result &&
                    (json_object_set_new(result, "ttlMs", json_integer(MCP_RESOURCE_TTL_MS)) < 0 ||
                     json_object_set_new(result, "cacheScope", json_string("private")) < 0)) {
                        json_decref(result);
                        result = NULL;
                }
        } else if (streq(method, "resources/templates/list")) {
                result = handle_resource_templates_list();
                cacheable = true;
        } else if (streq(method, "resources/read")) {
                handle_resources_read(s, p, id, params, result_meta);
                return;
        } else if (streq(method, "subscriptions/listen")) {
                handle_listen(s, p, id, params, &envelope);
                return;
        } else {
                /* a method of 2025-11-25 alone (initialize, ping, logging/setLevel, …) too */
                span_set_attr_int(span, "rpc.jsonrpc.error_code", JSONRPC_METHOD_NOT_FOUND);
                span_set_error(span, "method not found");
                post_reply(p, 404, jsonrpc_error(id, JSONRPC_METHOD_NOT_FOUND, "method not found"));
                return;
        }

        if (!result || result_finish(result, result_meta, cacheable) < 0) {
                span_set_attr_int(span, "rpc.jsonrpc.error_code", code ?: JSONRPC_INTERNAL_ERROR);
                span_set_error(span, message ?: "out of memory");
                post_reply(
                        p, 200, jsonrpc_error(id, code ?: JSONRPC_INTERNAL_ERROR, message ?: "out of memory"));
                return;
        }
        post_reply(p, 200, jsonrpc_result(id, TAKE_PTR(result)));
}

static bool session_resource_method(const char *method) {
        return streq(method, "resources/list") || streq(method, "resources/templates/list") ||
                streq(method, "resources/read") || streq(method, "resources/subscribe") ||
                streq(method, "resources/unsubscribe");
}

/* The resource methods of a session (2025-11-25 and older). The answer is in p. */
static void handle_session_resources(
        McpServer *s, McpPost *p, McpSession *session, json_t *id, const char *method, json_t *params) {
        json_t *result = NULL;

        if (streq(method, "resources/read")) {
                handle_resources_read(s, p, id, params, /* result_meta= */ NULL);
                return;
        }
        if (streq(method, "resources/subscribe") || streq(method, "resources/unsubscribe")) {
                post_reply(
                        p,
                        200,
                        handle_session_subscribe(
                                session, id, params, streq(method, "resources/subscribe"), s->manager));
                return;
        }
        result = streq(method, "resources/list") ? handle_resources_list(s) : handle_resource_templates_list();
        post_reply(
                p,
                200,
                result ? jsonrpc_result(id, result) :
                         jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, "out of memory"));
}

int mcp_server_process_post(McpServer *s, McpPost *p) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *msg = NULL, *result = NULL;
        const char *ctype = p->content_type, *sid = p->session_id, *pver = p->protocol_version;
        const char *method, *jsonrpc;
        McpSession *session = NULL;
        json_t *id, *params, *v, *meta;
        int code = 0;
        const char *message = NULL;

        if (!http_content_type_is_json(ctype)) {
                post_reply(
                        p,
                        415,
                        jsonrpc_error(NULL, JSONRPC_INVALID_REQUEST, "Content-Type must be application/json"));
                return 0;
        }
        if (p->message_error) {
                post_reply(p, 400, jsonrpc_error(NULL, JSONRPC_PARSE_ERROR, p->message_error->message));
                return 0;
        }
        if (p->message)
                msg = json_incref(p->message);
        else if (json_parse_body(p->body, p->size, &msg, &e) < 0) {
                post_reply(p, 400, jsonrpc_error(NULL, JSONRPC_PARSE_ERROR, e.message));
                return 0;
        }
        if (json_is_array(msg)) {
                post_reply(
                        p,
                        400,
                        jsonrpc_error(NULL, JSONRPC_INVALID_REQUEST, "JSON-RPC batches are not supported"));
                return 0;
        }
        if (!json_is_object(msg)) {
                post_reply(
                        p,
                        400,
                        jsonrpc_error(NULL, JSONRPC_INVALID_REQUEST, "a JSON-RPC message is an object"));
                return 0;
        }

        id = json_object_get(msg, "id");
        if (id && !json_is_string(id) && !json_is_integer(id)) {
                post_reply(
                        p,
                        400,
                        jsonrpc_error(NULL, JSONRPC_INVALID_REQUEST, "id must be a string or an integer"));
                return 0;
        }
        jsonrpc = json_string_cstr(json_object_get(msg, "jsonrpc"));
        if (!jsonrpc || !streq(jsonrpc, "2.0")) {
                post_reply(p, 400, jsonrpc_error(id, JSONRPC_INVALID_REQUEST, "jsonrpc must be \"2.0\""));
                return 0;
        }
        v = json_object_get(msg, "method");
        method = json_string_cstr(v);
        if (!method && json_is_string(v))
                method = ""; /* a NUL inside: no method has such a name (and "" is none either) */
        params = json_object_get(msg, "params");
        if (params && !json_is_object(params)) {
                post_reply(p, 400, jsonrpc_error(id, JSONRPC_INVALID_PARAMS, "params must be an object"));
                return 0;
        }

        /* The revision decides the lifecycle: the body's envelope names it (and a revision with
         * sessions named there keeps its session), else the MCP-Protocol-Version header. */
        meta = json_object_get(params, "_meta");
        v = json_is_object(meta) ? json_object_get(meta, MCP_META_PROTOCOL_VERSION) : NULL;
        if (v ? !(json_is_string(v) && version_supported(json_string_value(v))) :
                pver && version_stateless(pver)) {
                handle_stateless(s, p, id, method, params);
                return 0;
        }

        if (pver && !version_supported(pver)) {
                post_reply(
                        p,
                        400,
                        jsonrpc_error_data(
                                id,
                                MCP_ERROR_UNSUPPORTED_VERSION,
                                "unsupported MCP-Protocol-Version header",
                                json_pack("{s:o,s:s}", "supported", versions_json(), "requested", pver)));
                return 0;
        }

        /* Everything but initialize belongs to a session this server issued. */
        if (!(method && streq(method, "initialize"))) {
                if (!sid) {
                        post_reply(
                                p,
                                400,
                                jsonrpc_error(
                                        id,
                                        JSONRPC_INVALID_REQUEST,
                                        "missing Mcp-Session-Id header: call initialize first"));
                        return 0;
                }
                session = session_find(s, sid);
                if (!session) {
                        post_reply(
                                p,
                                404,
                                jsonrpc_error(
                                        id,
                                        JSONRPC_INVALID_REQUEST,
                                        "unknown or expired session: initialize again"));
                        return 0;
                }
                session->last_used = now_usec(CLOCK_MONOTONIC);
        }

        if (!method) {
                /* A response from the client (to a request we never make) or junk: acknowledge responses. */
                if (id && (json_object_get(msg, "result") || json_object_get(msg, "error"))) {
                        post_reply(p, 202, NULL);
                        return 0;
                }
                post_reply(p, 400, jsonrpc_error(id, JSONRPC_INVALID_REQUEST, "a request needs a method"));
                return 0;
        }
        if (!id) {
                /* Notifications (initialized, cancelled, …) need no answer. */
                post_reply(p, 202, NULL);
                return 0;
        }

        /* One span per request, below the POST's; a deferred tools/call carries it to its answer. A
         * method we do not serve is named "unknown": span names must not take any string a client
         * sends (the attribute keeps it). */
        bool known = streq(method, "initialize") || streq(method, "ping") || streq(method, "tools/list") ||
                streq(method, "tools/call") || session_resource_method(method);
        _cleanup_(span_endp) Span *span = mcp_span_start(s, "mcp.", known ? method : "unknown", p->span);
        span_set_attr_string(span, "mcp.method.name", method);

        if (streq(method, "initialize")) {
                result = handle_initialize(s, params, &session);
                if (result)
                        p->new_session_id = session->id;
        } else if (streq(method, "ping"))
                result = json_object();
        else if (streq(method, "tools/list"))
                result = handle_tools_list(s);
        else if (streq(method, "tools/call")) {
                result = handle_tools_call(
                        s, p, id, params, /* result_meta= */ NULL, /* as_task= */ false, &span, &code, &message);
                if (p->deferred)
                        return 0; /* answered when the operation completes */
        } else if (session_resource_method(method)) {
                handle_session_resources(s, p, session, id, method, params);
                return 0;
        } else {
                span_set_attr_int(span, "rpc.jsonrpc.error_code", JSONRPC_METHOD_NOT_FOUND);
                span_set_error(span, "method not found");
                post_reply(p, 200, jsonrpc_error(id, JSONRPC_METHOD_NOT_FOUND, "method not found"));
                return 0;
        }

        if (!result) {
                span_set_attr_int(span, "rpc.jsonrpc.error_code", code ?: JSONRPC_INTERNAL_ERROR);
                span_set_error(span, message ?: "out of memory");
                post_reply(
                        p, 200, jsonrpc_error(id, code ?: JSONRPC_INTERNAL_ERROR, message ?: "out of memory"));
                return 0;
        }
        post_reply(p, 200, jsonrpc_result(id, TAKE_PTR(result)));
        return 0;
}

static void post_answer(McpServer *s, HttpRequest *req, Span *span, json_t *message, const ApiError *error) {
        McpPost p = {
                .content_type = http_request_header(req, "Content-Type"),
                .session_id = http_request_header(req, "Mcp-Session-Id"),
                .protocol_version = http_request_header(req, "MCP-Protocol-Version"),
                .accept = http_request_header(req, "Accept"),
                .mcp_method = http_request_header(req, "Mcp-Method"),
                .mcp_name = http_request_header(req, "Mcp-Name"),
                .message = message,
                .message_error = error,
                .span = span,
        };

        p.body = http_request_body(req, &p.size);
        p.request = req;
        (void) mcp_server_process_post(s, &p);
        if (p.answered)
                return; /* a stream: subscriptions/listen */
        if (p.deferred) {
                http_request_suspend(req);
                return;
        }
        if (p.new_session_id && http_request_add_header(req, "Mcp-Session-Id", p.new_session_id) < 0)
                p.status = 500;
        if (p.status == 500 && !p.reply)
                reply_text(req, 500, "out of memory\n");
        else if (!p.reply)
                (void) http_request_reply(req, p.status, NULL, NULL, 0);
        else
                reply_jsonrpc(req, p.status, p.reply);
        json_decref(p.reply);
}

/* A POST whose body is being parsed. */
typedef struct McpPostBody {
        McpServer *server;
        Span *span; /* the request's, ended by its done callback */
} McpPostBody;

static void on_post_body(HttpRequest *req, json_t *body, const ApiError *error, void *userdata) {
        _cleanup_free_ McpPostBody *b = userdata;

        if (!http_request_is_connected(req))
                return; /* nobody to answer: nothing is run */
        if (error && error->code != API_ERROR_INVALID_REQUEST) {
                /* not the client's JSON but us: shutting down, as for any request still waiting */
                (void) http_request_reply_error(req, error);
                return;
        }
        post_answer(b->server, req, b->span, body, error);
}

/* A large body is parsed off the loop, the request waiting meanwhile. */
static void handle_post(McpServer *s, HttpRequest *req, Span *span) {
        McpPostBody *b = calloc(1, sizeof(McpPostBody));
        int r = -ENOMEM;

        if (b) {
                *b = (McpPostBody){ .server = s, .span = span };
                r = http_request_body_json_async(req, on_post_body, b);
                if (r < 0)
                        free(b);
        }
        if (r == -EAGAIN) {
                (void) http_request_add_header(req, "Retry-After", "1");
                reply_text(
                        req, 503, "Service Unavailable: too many request bodies are being read, try again\n");
        } else if (r < 0)
                reply_text(req, 500, "out of memory\n");
}

static void handle_get(McpServer *s, HttpRequest *req) {
        const char *sid = http_request_header(req, "Mcp-Session-Id");
        const char *accept = http_request_header(req, "Accept");
        McpSession *session;
        int r;

        if (!accepts_event_stream(accept)) {
                reply_text(req, 406, "Not Acceptable: the GET stream is text/event-stream\n");
                return;
        }
        if (!sid) {
                reply_text(req, 400, "Bad Request: missing Mcp-Session-Id header\n");
                return;
        }
        session = session_find(s, sid);
        if (!session) {
                reply_text(req, 404, "Not Found: unknown or expired session\n");
                return;
        }
        /* One stream per session: a new one replaces the old. Nothing is pushed on it today (the tool
         * list is static) but keep-alives; it stays open until the client leaves, the session ends or
         * we shut down. */
        session_close_stream(session);
        if (http_request_add_header(req, "Cache-Control", "no-cache") < 0 ||
            http_request_reply_stream(req, 200, "text/event-stream") < 0) {
                reply_text(req, 500, "out of memory\n");
                return;
        }
        (void) http_request_stream_write(req, ": stream open\n\n", strlen(": stream open\n\n"));
        r = http_request_stream_keepalive(req, s->keepalive, MCP_KEEPALIVE_EVENT);
        if (r < 0)
                log_debug_errno(
                        r, "MCP session %s: no keep-alives on its GET stream, ignoring: %m", session->id);
        session->stream = http_request_ref(req);
        session->last_used = now_usec(CLOCK_MONOTONIC);
}

static void handle_delete(McpServer *s, HttpRequest *req) {
        const char *sid = http_request_header(req, "Mcp-Session-Id");
        McpSession *session;

        if (!sid) {
                reply_text(req, 400, "Bad Request: missing Mcp-Session-Id header\n");
                return;
        }
        session = session_find(s, sid);
        if (!session) {
                reply_text(req, 404, "Not Found: unknown or expired session\n");
                return;
        }
        session_remove(s, session);
        (void) http_request_reply(req, 204, NULL, NULL, 0);
}

bool mcp_server_handle(McpServer *s, HttpRequest *req) {
        const char *method = http_request_method(req), *origin, *host;
        Span *span = NULL;

        if (!streq(http_request_path(req), s->path))
                return false;

        /* A server span per POST, ended with its response (later for a deferred tool). The GET
         * stream lives as long as the session: no span. */
        if (streq(method, "POST")) {
                span = span_start_http_server(
                        s->tracer, method, s->path, s->path, http_request_header(req, "traceparent"));
                if (span)
                        http_request_on_done(req, on_post_done, span);
                if (http_request_caller(req)) /* --enable-oauth: who asked */
                        span_set_attr_string(span, "enduser.id", http_request_caller(req)->subject);
        }

        /* A web page must not reach a loopback-only server through DNS rebinding: refuse foreign
         * Origin and Host headers when we listen on loopback. */
        if (s->loopback_only) {
                origin = http_request_header(req, "Origin");
                host = http_request_header(req, "Host");
                if (origin && !http_origin_is_loopback(origin)) {
                        reply_text(req, 403, "Forbidden: Origin is not a loopback address\n");
                        return true;
                }
                if (host && !http_host_is_loopback(host, strlen(host))) {
                        reply_text(req, 403, "Forbidden: Host is not a loopback address\n");
                        return true;
                }
        }

        if (streq(method, "POST"))
                handle_post(s, req, span);
        else if (streq(method, "GET"))
                handle_get(s, req);
        else if (streq(method, "DELETE"))
                handle_delete(s, req);
        else {
                (void) http_request_add_header(req, "Allow", "GET, POST, DELETE");
                reply_text(req, 405, "Method Not Allowed\n");
        }
        return true;
}
