/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdint.h>

#include "api-error.h"
#include "http-server.h"
#include "operation.h"

/* GET /api/v1/vms/{id}/console/stream: the serial console as it grows, REST only (an MCP tool answers
 * once, so the tail of get_vm_console is what MCP has). The answer is 200 text/plain whose body is
 * console.log byte for byte from a starting offset, written as the guest writes it; its header
 * X-Console-Offset says at which byte of the file the body starts, so that a client whose stream
 * ended (the server's idle timeout, a restart) reconnects with offset= that plus what it got. A new
 * run of QEMU starts the file over: the stream then goes on from its first byte. The stream ends when
 * the VM is deleted or the server shuts down.
 *
 * Query:
 *   offset   start at this byte of console.log (0..2^53); past the end: at the end
 *   backlog  without offset: start this many bytes before the end (0..1048576, default 8192), at the
 *            first line that begins there, so that the first line shown is whole */

#define API_CONSOLE_BACKLOG_DEFAULT ((uint64_t) 8192)
#define API_CONSOLE_BACKLOG_MAX ((uint64_t) 1 << 20)
#define API_CONSOLE_OFFSET_MAX ((uint64_t) 1 << 53)
/* Streams open at once, over all clients: each holds a timer and up to a backlog of memory. */
#define API_CONSOLE_STREAMS_MAX 32U
/* How often a stream looks for new bytes: a console is read by people, a quarter second is live. */
#define API_CONSOLE_POLL_USEC (250 * USEC_PER_MSEC)
/* Read per look at most, so that a burst is spread over looks and a slow reader holds little. */
#define API_CONSOLE_CHUNK ((size_t) 64 << 10)

typedef struct ApiConsoleQuery {
        bool has_offset;
        uint64_t offset;
        uint64_t backlog;
} ApiConsoleQuery;

/* Checks and decodes the query arguments (NULL: absent), both together: a request that gives both
 * offset and backlog is refused, as one of them would be ignored. invalid_request names the argument. */
int api_console_parse_query(const char *offset, const char *backlog, ApiConsoleQuery *ret, ApiError *reterr);

/* Where a stream of a file of size bytes starts: head holds the file's bytes from
 * size - min(size, backlog) on (head_size of them), read by the caller, used to find the first line
 * beginning in it. */
uint64_t api_console_start(const ApiConsoleQuery *q, uint64_t size, const char *head, size_t head_size);

typedef struct ApiConsoleStreams ApiConsoleStreams;

ApiConsoleStreams *api_console_streams_new(Manager *m);
/* Ends every stream still open. */
ApiConsoleStreams *api_console_streams_free(ApiConsoleStreams *s);

/* Serves the request for VM vm_id (the path's {id}); replies in every case. done/done_userdata is
 * the request's completion callback that this replaces (the server span), called when it ends. */
void api_console_stream(
        ApiConsoleStreams *s, HttpRequest *req, const char *vm_id, HttpRequestDone done, void *done_userdata);
