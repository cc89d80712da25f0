/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "cleanup.h"
#include "http-server.h"
#include "operation.h"
#include "trace.h"

/* MCP over streamable HTTP: JSON-RPC 2.0 on one endpoint, tools derived from the operation table.
 * Two lifecycles share the endpoint. A request of revision 2026-07-28 is stateless: it carries its
 * protocol version, client information and capabilities in params._meta and is served from the
 * request and the manager's records alone, so any daemon on the same state directory (or the same
 * one after a restart) can answer it. Clients of 2025-11-25, 2025-06-18, 2025-03-26 and 2024-11-05
 * initialize a session first, as before. */

typedef struct McpServer McpServer;

/* The longest an event stream of this endpoint stays silent: a keep-alive comment is written when
 * nothing else was for this long, well inside the idle timeouts of clients (undici's fetch: 300 s)
 * and of the proxies in front of them (often 60 s, some 30 s). */
#define MCP_KEEPALIVE_DEFAULT (15 * USEC_PER_SEC)

typedef struct McpServerOptions {
        const char *path;      /* the endpoint, e.g. "/mcp" */
        bool loopback_only;    /* the listener is on a loopback address: guard against DNS rebinding */
        unsigned max_sessions; /* 0: default */
        Tracer *tracer;        /* borrowed, may be NULL: spans for POSTs, their requests and tools */
        usec_t keepalive;      /* 0: MCP_KEEPALIVE_DEFAULT */
} McpServerOptions;

int mcp_server_new(McpServer **ret, Manager *m, const McpServerOptions *o);
McpServer *mcp_server_free(McpServer *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(McpServer *, mcp_server_free);

/* One POST to the endpoint, without HTTP: what the headers and body said, and the answer. */
typedef struct McpPost {
        const char *content_type;
        const char *session_id;
        const char *protocol_version;
        const char *accept;     /* the Accept header: a slow tools/call streams only where it names SSE */
        const char *mcp_method; /* the Mcp-Method header (2026-07-28: must match the body's method) */
        const char *mcp_name;   /* the Mcp-Name header (2026-07-28: must match params.name or .uri) */
        const void *body;
        size_t size;
        /* The body already parsed (http_request_body_json_async()), borrowed: the message, or why
         * it is no JSON. Both NULL: mcp_server_process_post() parses body itself. */
        json_t *message;
        const ApiError *message_error;
        HttpRequest *request; /* for answers that come later; NULL: none can */
        Span *span;           /* the POST's span, parent of the request's; may be NULL. A deferred tools/call
                               * takes over the request's done callback, and ends it with the request. */

        unsigned status; /* set by mcp_server_process_post() */
        /* The JSON-RPC answer, owned; NULL: an empty body. A tool result's text is still [resource]:
         * it is rendered with the message, off the loop when large. */
        json_t *reply;
        const char *new_session_id; /* borrowed; set by initialize */
        bool deferred;              /* a tool still runs: it answers through request */
        bool answered;              /* answered through request already: a stream (subscriptions/listen) */
} McpPost;

/* Handles one JSON-RPC message: the whole protocol except the HTTP plumbing (and the fuzz target's
 * entry point). */
int mcp_server_process_post(McpServer *s, McpPost *p);

/* Serves the request when its path is the endpoint; returns false, without replying, otherwise. */
bool mcp_server_handle(McpServer *s, HttpRequest *req);

/* The instructions sent to clients at initialize. */
extern const char mcp_instructions[];
