/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs-util.h"
#include "fuzz.h"
#include "log.h"
#include "manager.h"
#include "mcp-server.h"

/* One MCP POST body, in a session opened once: JSON-RPC framing, methods, tools/call arguments.
 * The Manager is real, on a scratch state directory, so tool calls run their handlers. A tracer
 * records their spans (its loop never runs: nothing is sent, the queue fills and then drops). */

static Manager *manager;
static McpServer *server;
static Tracer *tracer;
static char session[64];
static char state_dir[] = "/tmp/fuzz-mcp-XXXXXX";

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path) < 0 ? 0 : 0;
}

static void cleanup(void) {
        server = mcp_server_free(server);
        manager = manager_free(manager);
        tracer = tracer_free(tracer, 0);
        (void) nftw(state_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        char images[64];
        sd_event *e = NULL;
        const char *dir = mkdtemp(state_dir);
        McpPost p = { .content_type = "application/json" };
        static const char init[] =
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\"}}";

        log_set_max_level(LOG_CRIT);
        if (!dir || sd_event_new(&e) < 0)
                abort();
        snprintf(images, sizeof(images), "%s/images", dir);
        if (mkdir_p(images, 0750) < 0)
                abort();
        if (manager_new(
                    &manager,
                    e,
                    &(ManagerConfig){
                            .state_dir = dir,
                            .image_dir = images,
                            .default_network = "default",
                            .network_subnet = "192.168.127.0/24",
                            .ovmf_code = "/nonexistent",
                            .version = "fuzz",
                            .commit = "fuzz",
                            .built = "fuzz",
                    },
                    NULL) < 0)
                abort();
        if (setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9", 1) < 0 ||
            tracer_new_from_env(&tracer, e, "fuzz", /* ret_message= */ NULL) < 0 || !tracer)
                abort();
        if (mcp_server_new(&server, manager, &(McpServerOptions){ .path = "/mcp", .tracer = tracer }) < 0)
                abort();

        p.body = init;
        p.size = strlen(init);
        if (mcp_server_process_post(server, &p) < 0 || !p.new_session_id)
                abort();
        snprintf(session, sizeof(session), "%s", p.new_session_id);
        json_decref(p.reply);
        sd_event_unref(e); /* the manager keeps its own reference */
        atexit(cleanup);
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        McpPost p = {
                .content_type = "application/json",
                .session_id = session,
                .body = data,
                .size = size,
        };

        (void) mcp_server_process_post(server, &p);
        /* Whatever came in, the answer is a status and, unless 202, a JSON-RPC message. */
        if (p.status == 0 || (p.status != 202 && !p.reply))
                abort();
        json_decref(p.reply);
        return 0;
}
