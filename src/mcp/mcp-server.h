/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "cleanup.h"
#include "http-server.h"
#include "manager.h"
#include "trace.h"

/* MCP over streamable HTTP: JSON-RPC 2.0 on one endpoint, tools derived from the operation table.
 * Speaks 2025-11-25 and answers clients of 2025-06-18, 2025-03-26 and 2024-11-05. */

typedef struct McpServer McpServer;

typedef struct McpServerOptions {
        const char *path;      /* the endpoint, e.g. "/mcp" */
        bool loopback_only;    /* the listener is on a loopback address: guard against DNS rebinding */
        unsigned max_sessions; /* 0: default */
        Tracer *tracer;        /* borrowed, may be NULL: spans for POSTs, their requests and tools */
} McpServerOptions;

int mcp_server_new(McpServer **ret, Manager *m, const McpServerOptions *o);
McpServer *mcp_server_free(McpServer *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(McpServer *, mcp_server_free);

/* One POST to the endpoint, without HTTP: what the headers and body said, and the answer. */
typedef struct McpPost {
        const char *content_type;
        const char *session_id;
        const char *protocol_version;
        const void *body;
        size_t size;
        HttpRequest *request; /* for answers that come later; NULL: none can */
        const Span *span;     /* the POST's span, parent of the request's; may be NULL */

        unsigned status;            /* set by mcp_server_process_post() */
        json_t *reply;              /* the JSON-RPC answer, owned; NULL: an empty body */
        const char *new_session_id; /* borrowed; set by initialize */
        bool deferred;              /* a tool still runs: it answers through request */
} McpPost;

/* Handles one JSON-RPC message: the whole protocol except the HTTP plumbing (and the fuzz target's
 * entry point). */
int mcp_server_process_post(McpServer *s, McpPost *p);

/* Serves the request when its path is the endpoint; returns false, without replying, otherwise. */
bool mcp_server_handle(McpServer *s, HttpRequest *req);

/* The instructions sent to clients at initialize. */
extern const char mcp_instructions[];
