/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "api-error.h"
#include "manager.h"
#include "task.h"
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
        PARAM_IN_PATH = 1 << 1,   /* REST: a {segment} of the path */
        PARAM_IN_QUERY = 1 << 2,  /* REST: a query argument */
        PARAM_NOT_EMPTY = 1 << 3, /* a string: "" is refused, an array: [] is; absent or null is how one
                                   * asks for the default */
        PARAM_NOT_NULL = 1 << 4,  /* null is refused, not taken for the default: only absence is */
} ParamFlags;

/* How an integer outside its range is refused. Every operation declared later says "<name> must be
 * <min>..<max>"; the others keep the wording their operation had before it was declared here, which
 * clients and tests match. */
typedef enum ParamRangeWording {
        PARAM_RANGE_DOTS,          /* "cpus must be 1..256" */
        PARAM_RANGE_BOUNDS_APART,  /* "memory_mib must be at least 256": the bound it missed, for a range as
                                    * wide as 256..16777216, which reads badly */
        PARAM_RANGE_BETWEEN,       /* "mtu 575 must be between 576 and 65520" */
        PARAM_RANGE_PARENTHESIZED, /* "lines: 0 is out of range (1..10000)" */
        PARAM_RANGE_UNSTATED,      /* "port 0 out of range" */
        _PARAM_RANGE_WORDING_MAX,
} ParamRangeWording;

typedef struct OperationParam {
        const char *name;
        ParamType type;
        ParamFlags flags;
        const char *description;
        const char *const *enum_values; /* NULL-terminated, or NULL */
        size_t max_length;              /* bytes of a string; 0: PARAM_STRING_MAX */

        /* An integer's accepted range, both ends included; min == max == 0 declares none. Refusals
         * are worded as range_wording says and collected with the other problems of a request. */
        int64_t min, max;
        ParamRangeWording range_wording;
        /* What leaving out a PARAM_NOT_EMPTY parameter means, for the refusal of an empty one: "<name>
         * must not be empty (leave it out for <absent_means>)"; NULL: "the default". A required one is
         * refused with "<name> is empty". */
        const char *absent_means;
        /* A string's rule beyond its length: refused with "<name> <invalid_text>". */
        bool (*valid)(const char *s);
        const char *invalid_text;

        /* Decoding, for an operation with an args_size: where the value goes in its arguments struct,
         * and what an absent (or null) parameter becomes. A string is a char * (a copy; default_string
         * or NULL), an integer an int64_t (default_integer), a boolean an int (default_integer, 0 or 1),
         * a string array a char ** (NULL when absent), a string map a json_t * (a new reference, NULL
         * when absent). Every parameter of such an operation is decoded: each has its place. */
        size_t offset;
        const char *default_string;
        int64_t default_integer;
} OperationParam;

/* The longest string a parameter takes unless it says otherwise; array elements and map values too. */
#define PARAM_STRING_MAX ((size_t) 65536)

/* One call of an operation as its handler sees it. */
typedef struct Operation Operation;

typedef struct OperationRequest {
        const Operation *op;
        json_t *args;         /* exactly the declared parameters, checked for type and presence */
        void *decoded;        /* the operation's arguments struct, decoded and checked (operation_decode());
                               * NULL when the operation declares none. The handler may take what it owns
                               * out of it (leaving NULL behind) */
        const Caller *caller; /* who asked (borrowed); NULL: anonymous */
} OperationRequest;

/* Runs the operation. *ret is the resource JSON (a new reference); NULL for "no content". */
typedef int (*OperationHandler)(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr);

/* Completion of an asynchronous operation: r < 0 with e set, or the resource (borrowed). */
typedef void (*OperationDone)(int r, json_t *result, const ApiError *e, void *userdata);

/* An operation that waits (a VM starting, stopping, reaching a milestone): returns < 0 at once, or 0
 * and calls done exactly once, possibly before returning. args are checked as for handler. */
typedef void (*OperationProgress)(const char *message, void *userdata);
typedef int (*OperationAsyncHandler)(
        Manager *m,
        const OperationRequest *req,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr);

/* What a success is on REST: the result itself, a resource the operation created (the result is
 * its record), or nothing to show (the result is for MCP alone, as a deleted record is). The REST
 * layer alone turns these into HTTP statuses. */
typedef enum OperationSuccess {
        OPERATION_SUCCESS_RESULT,
        OPERATION_SUCCESS_CREATED,
        OPERATION_SUCCESS_EMPTY,
        _OPERATION_SUCCESS_MAX,
        _OPERATION_SUCCESS_INVALID = -EINVAL,
} OperationSuccess;

struct Operation {
        const char *name; /* the MCP tool name */
        const char *description;
        OperationHints hints;
        const char *method;       /* REST method, NULL: MCP only */
        const char *path;         /* REST path below /api/v1, with {param} segments */
        OperationSuccess success; /* what REST answers a success with */
        bool rest_body;           /* REST: the body is a JSON object holding the non-path params */
        const char *list_key;     /* MCP: structuredContent key wrapping an array result */
        /* The schema of api/openapi.yaml (components/schemas) a result follows, of each element for
         * a list: the REST response's schema, and MCP's outputSchema (test-operations holds the
         * document's responses to it) */
        const char *result_schema;
        bool cacheable; /* the result depends only on the records (manager_generation()) */
        bool task; /* may run as a durable task (task.h): MCP's Tasks extension, REST's Prefer: respond-async */
        const OperationParam *params; /* terminated by a NULL name */
        OperationHandler handler;
        OperationAsyncHandler async_handler; /* instead of handler */

        /* The decoded arguments (optional): a struct of args_size bytes that every parameter's offset
         * points into, its contents freed with args_done, or without one, by operation_args_done().
         * args_check holds the rules that relate parameters to each other; it appends its problems with
         * operation_problem() and may rewrite what it checked. */
        size_t args_size;
        void (*args_done)(void *args);
        int (*args_check)(void *args, char **problems);
};

const Operation *operation_table(size_t *ret_n);
const Operation *operation_find(const char *name);

/* Checks args against the declared parameters: an object, no unknown keys, required ones present,
 * types right. Errors are invalid_request and name the field. */
int operation_check_args(const Operation *op, json_t *args, ApiError *reterr);

/* operation_check_args(), then, for an operation with an args_size, the decoding into ret (args_size
 * bytes, overwritten): every parameter or its default, then each one's limits (empty, range, valid),
 * then the operation's args_check. Those problems are collected into one invalid_request message,
 * "; "-separated. On failure ret holds nothing that needs freeing. */
int operation_decode(const Operation *op, json_t *args, void *ret, ApiError *reterr);

/* Frees the contents of a struct operation_decode() filled for op: op's args_done, or each declared
 * parameter's field by its type. */
void operation_args_done(const Operation *op, void *args);

const OperationParam *operation_param_find(const Operation *op, const char *name);

/* Appends the problem a value of the parameter has with its declared range, if any; a record's loader
 * checks what it reads against the same declaration. */
void operation_param_check_integer(const OperationParam *p, int64_t v, char **problems);

/* Appends a "; "-separated problem to *problems; out of memory, the problem is dropped. */
void operation_problem(char **problems, const char *fmt, ...) _printf_(2, 3);

/* operation_check_args() and operation_decode(), then the handler, which gets caller (borrowed, NULL:
 * anonymous) in its OperationRequest; create_vm records it as the VM's createdBy. */
int operation_run(
        const Operation *op, Manager *m, const Caller *caller, json_t *args, json_t **ret, ApiError *reterr);

/* operation_check_args() and operation_decode(), then the asynchronous handler, or the handler of an
 * operation that is not read-only. done hears the outcome once the records written so far are on disk
 * (manager_sync()): an answer never reports a change that a crash could still take back. */
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
