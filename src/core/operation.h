/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>

#include "api-error.h"
#include "manager.h"
#include "vm.h"

/* The operation table: every operation is declared once, and the REST router, MCP tools/list and
 * tools/call, get_info, the OpenAPI consistency test and docs/tools.md are all derived from it. */

typedef enum OperationHints {
        OP_READ_ONLY = 1 << 0,
        OP_DESTRUCTIVE = 1 << 1,
        OP_IDEMPOTENT = 1 << 2,
        OP_OPEN_WORLD = 1 << 3,
} OperationHints;

/* The annotation sets every tool uses one of. */
#define OP_HINTS_READ (OP_READ_ONLY | OP_IDEMPOTENT)
#define OP_HINTS_CREATE 0
#define OP_HINTS_IDEMPOTENT OP_IDEMPOTENT
#define OP_HINTS_DESTRUCTIVE (OP_DESTRUCTIVE | OP_IDEMPOTENT)
#define OP_HINTS_EXEC (OP_DESTRUCTIVE | OP_OPEN_WORLD)

typedef enum ParamType {
        PARAM_STRING,
        PARAM_INTEGER,
        PARAM_BOOLEAN,
        PARAM_STRING_ARRAY,
        PARAM_STRING_MAP, /* an object whose values are strings */
        _PARAM_TYPE_MAX,
} ParamType;

typedef enum ParamFlags {
        PARAM_REQUIRED = 1 << 0,
        PARAM_IN_PATH = 1 << 1,  /* REST: a {segment} of the path */
        PARAM_IN_QUERY = 1 << 2, /* REST: a query argument */
} ParamFlags;

typedef struct OperationParam {
        const char *name;
        ParamType type;
        ParamFlags flags;
        const char *description;
        const char *const *enum_values; /* NULL-terminated, or NULL */
        size_t max_length;              /* bytes of a string; 0: PARAM_STRING_MAX */
} OperationParam;

/* The longest string a parameter takes unless it says otherwise; array elements and map values too. */
#define PARAM_STRING_MAX ((size_t) 65536)

/* Runs the operation. args is an object holding exactly the declared parameters, already checked
 * for type and presence. *ret is the resource JSON (a new reference); NULL for "no content". */
typedef int (*OperationHandler)(Manager *m, json_t *args, json_t **ret, ApiError *reterr);

/* Completion of an asynchronous operation: r < 0 with e set, or the resource (borrowed). */
typedef void (*OperationDone)(int r, json_t *result, const ApiError *e, void *userdata);

/* An operation that waits (a VM starting, stopping, reaching a milestone): returns < 0 at once, or 0
 * and calls done exactly once, possibly before returning. args are checked as for handler. */
typedef void (*OperationProgress)(const char *message, void *userdata);
typedef int (*OperationAsyncHandler)(
        Manager *m, json_t *args, OperationDone done, OperationProgress progress, void *userdata, ApiError *reterr);

typedef struct Operation {
        const char *name; /* the MCP tool name */
        const char *description;
        OperationHints hints;
        const char *method;           /* REST method, NULL: MCP only */
        const char *path;             /* REST path below /api/v1, with {param} segments */
        unsigned success_status;      /* REST status on success: 200, 201 or 204 */
        bool rest_body;               /* REST: the body is a JSON object holding the non-path params */
        const char *list_key;         /* MCP: structuredContent key wrapping an array result */
        bool cacheable;               /* the result depends only on the records (manager_generation()) */
        const OperationParam *params; /* terminated by a NULL name */
        OperationHandler handler;
        OperationAsyncHandler async_handler; /* instead of handler */
} Operation;

const Operation *operation_table(size_t *ret_n);
const Operation *operation_find(const char *name);

/* Checks args against the declared parameters: an object, no unknown keys, required ones present,
 * types right. Errors are invalid_request and name the field. */
int operation_check_args(const Operation *op, json_t *args, ApiError *reterr);

/* operation_check_args(), then the handler; caller (borrowed, NULL: anonymous) is manager_caller()
 * meanwhile. */
int operation_run(
        const Operation *op, Manager *m, const Caller *caller, json_t *args, json_t **ret, ApiError *reterr);

/* operation_check_args(), then the asynchronous handler, or the handler of an operation that is not
 * read-only. done hears the outcome once the records written so far are on disk (manager_sync()):
 * an answer never reports a change that a crash could still take back. */
/* progress (optional) hears the state changes while the operation runs. */
int operation_run_async(
        const Operation *op,
        Manager *m,
        const Caller *caller,
        json_t *args,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr);

/* The MCP tool description: {"name","description","inputSchema","annotations"}; a new reference. */
json_t *operation_tool_json(const Operation *op);

const char *param_type_to_json_schema(ParamType t);
