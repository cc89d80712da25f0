/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "operation.h"

static const char *openapi_path;

/* One route of the OpenAPI document: path, method (lower case) and operationId. */
typedef struct Route {
        char path[256];
        char method[16];
        char op[64];
        char schema[64]; /* the success response's schema (its elements' for an array); "": none */
        bool array;
} Route;

/* Reads the routes from api/openapi.yaml. The document is ours and keeps one layout: paths at two
 * spaces, methods at four, operationId at six. */
static size_t read_routes(Route *routes, size_t max) {
        _cleanup_free_ char *text = NULL;
        char path[256] = "", method[16] = "";
        bool in_paths = false, in_success = false;
        size_t n = 0;

        assert_ok(read_full_file(openapi_path, 1 << 20, &text, NULL));
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
                if (!isspace((unsigned char) line[0])) {
                        in_paths = strneq(line, "paths:", 6);
                        continue;
                }
                if (!in_paths)
                        continue;
                if (strneq(line, "  /", 3) && sscanf(line, "  %255[^:]:", path) == 1)
                        continue;
                if (strneq(line, "    ", 4) && line[4] != ' ' && sscanf(line, "    %15[a-z]:", method) == 1) {
                        in_success = false;
                        continue;
                }
                char op[64];
                if (sscanf(line, "      operationId: %63s", op) == 1) {
                        assert_true(n < max);
                        snprintf(routes[n].path, sizeof(routes[n].path), "%s", path);
                        snprintf(routes[n].method, sizeof(routes[n].method), "%s", method);
                        snprintf(routes[n].op, sizeof(routes[n].op), "%s", op);
                        n++;
                        continue;
                }
                /* responses at eight spaces: the first schema below a 2xx one is the route's */
                if (strneq(line, "        \"", 9))
                        in_success = line[9] == '2';
                if (!in_success || n == 0 || routes[n - 1].schema[0])
                        continue;
                if (strstr(line, "type: array"))
                        routes[n - 1].array = true;
                const char *ref = strstr(line, "$ref: \"#/components/schemas/");
                if (ref)
                        (void) sscanf(ref, "$ref: \"#/components/schemas/%63[A-Za-z0-9]", routes[n - 1].schema);
        }
        return n;
}

static void test_openapi_matches_table(void **state) {
        Route routes[128];
        size_t n_routes = read_routes(routes, ELEMENTSOF(routes)), n;
        const Operation *table = operation_table(&n);

        /* Every REST operation of the table is in the document, with its method and path... */
        for (size_t i = 0; i < n; i++) {
                bool found = false;

                if (!table[i].method)
                        continue;
                for (size_t j = 0; j < n_routes; j++)
                        if (streq(routes[j].op, table[i].name)) {
                                char m[16];
                                size_t k;
                                for (k = 0; table[i].method[k] && k < sizeof(m) - 1; k++)
                                        m[k] = (char) tolower((unsigned char) table[i].method[k]);
                                m[k] = 0;
                                if (!streq(routes[j].path, table[i].path) || !streq(routes[j].method, m))
                                        fail_msg(
                                                "%s: table says %s %s, openapi.yaml says %s %s",
                                                table[i].name,
                                                table[i].method,
                                                table[i].path,
                                                routes[j].method,
                                                routes[j].path);
                                found = true;
                        }
                if (!found)
                        fail_msg(
                                "%s (%s %s) is missing from openapi.yaml",
                                table[i].name,
                                table[i].method,
                                table[i].path);
        }
        /* ...and the document describes nothing the table does not serve. */
        for (size_t j = 0; j < n_routes; j++) {
                const Operation *op = operation_find(routes[j].op);
                if (!op || !op->method)
                        fail_msg(
                                "openapi.yaml describes %s %s (%s), which no operation serves",
                                routes[j].method,
                                routes[j].path,
                                routes[j].op);
        }
        assert_true(n_routes > 0);
}

/* The names under components/schemas. */
static size_t read_schema_names(char names[][64], size_t max) {
        _cleanup_free_ char *text = NULL;
        bool in_components = false, in_schemas = false;
        size_t n = 0;

        assert_ok(read_full_file(openapi_path, 1 << 20, &text, NULL));
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
                if (!isspace((unsigned char) line[0])) {
                        in_components = strneq(line, "components:", 11);
                        continue;
                }
                if (in_components && strneq(line, "  ", 2) && line[2] != ' ') {
                        in_schemas = strneq(line, "  schemas:", 10);
                        continue;
                }
                if (in_schemas && strneq(line, "    ", 4) && line[4] != ' ') {
                        assert_true(n < max);
                        assert_int_equal(sscanf(line, "    %63[A-Za-z0-9]:", names[n]), 1);
                        n++;
                }
        }
        return n;
}

/* MCP's outputSchema of a tool is the schema its result_schema names: for a REST operation, the one
 * api/openapi.yaml gives its success response (an array of it for a list), so the two surfaces cannot
 * describe one result twice and differently. */
static void test_result_schemas_match_openapi(void **state) {
        Route routes[128];
        char names[128][64];
        size_t n_routes = read_routes(routes, ELEMENTSOF(routes)), n_names = read_schema_names(names, 128), n;
        const Operation *table = operation_table(&n);

        assert_true(n_names > 0);
        for (size_t i = 0; i < n; i++) {
                const Operation *op = &table[i];
                bool known = false;

                if (!op->result_schema)
                        fail_msg("%s declares no result_schema", op->name);
                for (size_t j = 0; j < n_names; j++)
                        known = known || streq(names[j], op->result_schema);
                if (!known)
                        fail_msg(
                                "%s: result_schema %s is not in openapi.yaml's components/schemas",
                                op->name,
                                op->result_schema);
                for (size_t j = 0; j < n_routes; j++) {
                        if (!streq(routes[j].op, op->name))
                                continue;
                        if (op->success == OPERATION_SUCCESS_EMPTY) {
                                if (routes[j].schema[0])
                                        fail_msg(
                                                "%s answers REST with no body, openapi.yaml gives it %s",
                                                op->name,
                                                routes[j].schema);
                                continue;
                        }
                        if (!streq(routes[j].schema, op->result_schema) || routes[j].array != !!op->list_key)
                                fail_msg(
                                        "%s: the table says %s%s, openapi.yaml's response %s%s",
                                        op->name,
                                        op->list_key ? "a list of " : "",
                                        op->result_schema,
                                        routes[j].array ? "a list of " : "",
                                        routes[j].schema[0] ? routes[j].schema : "(none)");
                }
        }
}

static void test_descriptions_and_hints(void **state) {
        size_t n;
        const Operation *table = operation_table(&n);

        for (size_t i = 0; i < n; i++) {
                const Operation *op = &table[i];
                const char *want = (op->hints & OP_READ_ONLY) ? "Read-only. " :
                        (op->hints & OP_DESTRUCTIVE)          ? "WRITES (destructive): " :
                                                                "WRITES: ";

                if (!strneq(op->description, want, strlen(want)))
                        fail_msg("%s: description must start with '%s'", op->name, want);
                /* A model reading the description learns what to call before this tool. */
                if (!strstr(op->description, "Call ") && !strstr(op->description, "call "))
                        fail_msg("%s: description does not say what to call first", op->name);
                assert_false((op->hints & OP_READ_ONLY) && (op->hints & OP_DESTRUCTIVE));
                for (size_t j = 0; j < i; j++)
                        assert_string_not_equal(op->name, table[j].name);
                if (op->method) {
                        assert_non_null(op->path);
                        assert_in_range(op->success, 0, _OPERATION_SUCCESS_MAX - 1);
                        /* every {param} of the path is a declared path parameter */
                        for (const OperationParam *p = op->params; p->name; p++) {
                                char seg[80];
                                snprintf(seg, sizeof(seg), "{%s}", p->name);
                                assert_int_equal(
                                        (p->flags & PARAM_IN_PATH) != 0, strstr(op->path, seg) != NULL);
                        }
                }
        }
        assert_null(operation_find("get_info")->method); /* MCP only */
}

static void test_check_args(void **state) {
        const Operation *op = operation_find("create_network");
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *ok = json_pack("{s:s,s:s}", "name", "a", "cidr", "10.0.0.0/24");
        json_auto_t *unknown = json_pack("{s:s,s:s,s:i}", "name", "a", "cidr", "10.0.0.0/24", "jumbo", 9000);
        json_auto_t *wrong = json_pack("{s:i,s:s}", "name", 5, "cidr", "10.0.0.0/24");
        json_auto_t *missing = json_pack("{s:s}", "name", "a");
        json_auto_t *null_required = json_pack("{s:n,s:s}", "name", "cidr", "10.0.0.0/24");
        json_auto_t *null_optional = json_pack(
                "{s:s,s:s,s:n}", "name", "a", "cidr", "10.0.0.0/24", "dns_search_domain");
        json_auto_t *array = json_array();

        assert_non_null(op);
        assert_ok(operation_check_args(op, ok, &e));
        assert_ok(operation_check_args(op, null_optional, &e));

        assert_errno(operation_check_args(op, unknown, &e), -EINVAL);
        assert_int_equal(e.code, API_ERROR_INVALID_REQUEST);
        assert_string_equal(e.message, "invalid request: unknown field \"jumbo\"");

        assert_errno(operation_check_args(op, wrong, &e), -EINVAL);
        assert_string_equal(e.message, "invalid request: field \"name\": expected a string, got integer");

        assert_errno(operation_check_args(op, missing, &e), -EINVAL);
        assert_string_equal(e.message, "invalid request: field \"cidr\" is required");

        assert_errno(operation_check_args(op, null_required, &e), -EINVAL);
        assert_contains(e.message, "\"name\"");

        assert_errno(operation_check_args(op, array, &e), -EINVAL);
        assert_string_equal(e.message, "invalid request: expected a JSON object, got array");
}

static void test_tool_json(void **state) {
        json_auto_t *t = operation_tool_json(operation_find("delete_network"));
        json_t *ann, *schema;

        assert_non_null(t);
        assert_string_equal(json_string_value(json_object_get(t, "name")), "delete_network");
        schema = json_object_get(t, "inputSchema");
        assert_string_equal(json_string_value(json_object_get(schema, "type")), "object");
        assert_int_equal(json_array_size(json_object_get(schema, "required")), 1);
        assert_string_equal(
                json_string_value(json_object_get(
                        json_object_get(json_object_get(schema, "properties"), "name"), "type")),
                "string");
        ann = json_object_get(t, "annotations");
        assert_true(json_is_false(json_object_get(ann, "readOnlyHint")));
        assert_true(json_is_true(json_object_get(ann, "destructiveHint")));
        assert_true(json_is_true(json_object_get(ann, "idempotentHint")));
        assert_true(json_is_false(json_object_get(ann, "openWorldHint")));
}

/* The limits the decoders of the request bodies enforce are the ones api/openapi.yaml states: each
 * integer's minimum, maximum and default (none for a required one), each string's maxLength where
 * both say one, a non-empty array's minItems. The schema keeps one layout: "        <field>: { type:
 * ..., minimum: N, ... }" below "    CreateVMRequest:" and the others. */
static bool schema_number(const char *line, const char *key, long long *ret) {
        _cleanup_free_ char *k = NULL;
        const char *at;

        assert_true(asprintf(&k, "%s: ", key) > 0);
        at = strstr(line, k);
        return at && sscanf(at + strlen(k), "%lld", ret) == 1;
}

static void test_openapi_limits_match_table(void **state) {
        /* the request bodies and the operations that decode them */
        static const struct {
                const char *schema;
                const char *op;
        } bodies[] = {
                { "    CreateVMRequest:", "create_vm" },
                { "    CreateNetworkRequest:", "create_network" },
                { "    ExecRequest:", "exec_vm" },
                { "    ForwardRequest:", "forward_port" },
        };
        _cleanup_free_ char *text = NULL;
        const Operation *op = NULL;
        size_t checked = 0;

        assert_ok(read_full_file(openapi_path, 1 << 20, &text, NULL));
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
                const OperationParam *p;
                char name[64];
                long long v;

                if (strneq(line, "    ", 4) && line[4] != ' ') {
                        op = NULL;
                        for (size_t i = 0; i < ELEMENTSOF(bodies); i++)
                                if (streq(line, bodies[i].schema))
                                        op = operation_find(bodies[i].op);
                        continue;
                }
                if (!op || !strneq(line, "        ", 8) || line[8] == ' ' ||
                    sscanf(line + 8, "%63[a-z_]: {", name) != 1 || !strstr(line, "{"))
                        continue;
                p = operation_param_find(op, name);
                if (!p)
                        fail_msg("openapi.yaml's request of %s has %s, the operation has not", op->name, name);
                if (p->type == PARAM_INTEGER) {
                        assert_true(schema_number(line, "minimum", &v));
                        assert_int_equal(v, p->min);
                        assert_true(schema_number(line, "maximum", &v));
                        assert_int_equal(v, p->max);
                        /* a required parameter has no default */
                        if (p->flags & PARAM_REQUIRED)
                                assert_false(schema_number(line, "default", &v));
                        else {
                                assert_true(schema_number(line, "default", &v));
                                assert_int_equal(v, p->default_integer);
                        }
                        checked++;
                }
                if (p->type == PARAM_STRING && p->max_length > 0 && schema_number(line, "maxLength", &v)) {
                        assert_int_equal(v, p->max_length);
                        checked++;
                }
                if (p->type == PARAM_STRING_ARRAY && (p->flags & PARAM_NOT_EMPTY)) {
                        assert_true(schema_number(line, "minItems", &v));
                        assert_int_equal(v, 1);
                        checked++;
                }
        }
        /* cpus, memory_mib, disk_gib; image, kubernetes_version, network, user_data; mtu; command,
         * timeout_seconds, stdin; port */
        assert_int_equal(checked, 12);
}

/* A parameter is added to an operation by declaring it, and nothing else: here "gpus" is the one
 * line added to a test operation's table. The decoder fills it in (or its default), refuses it below
 * and above its range naming it, and tools/list's schema shows its limits. */
typedef struct TestArgs {
        char *name;
        int64_t cpus;
        int64_t gpus;
} TestArgs;

static void test_args_done(void *p) {
        TestArgs *a = p;

        free(a->name);
}

static const OperationParam test_params[] = {
        { .name = "name",
          .type = PARAM_STRING,
          .flags = PARAM_REQUIRED | PARAM_NOT_EMPTY,
          .description = "n",
          .offset = offsetof(TestArgs, name) },
        { .name = "cpus",
          .type = PARAM_INTEGER,
          .description = "c",
          .min = 1,
          .max = 256,
          .default_integer = 2,
          .offset = offsetof(TestArgs, cpus) },
        /* the new parameter */
        { .name = "gpus",
          .type = PARAM_INTEGER,
          .description = "g",
          .min = 0,
          .max = 8,
          .default_integer = 0,
          .offset = offsetof(TestArgs, gpus) },
        { .name = NULL },
};

static int test_handler(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        const TestArgs *a = req->decoded;

        *ret = json_pack(
                "{s:s,s:I,s:I}", "name", a->name, "cpus", (json_int_t) a->cpus, "gpus", (json_int_t) a->gpus);
        return *ret ? 0 : -ENOMEM;
}

static const Operation test_op = {
        .name = "test_op",
        .description = "Read-only. A test.",
        .hints = OP_HINTS_READ,
        .params = test_params,
        .handler = test_handler,
        .args_size = sizeof(TestArgs),
        .args_done = test_args_done,
};

static int decode(const char *text, TestArgs *ret, ApiError *e) {
        json_auto_t *j = json_loads(text, 0, NULL);

        assert_non_null(j);
        return operation_decode(&test_op, j, ret, e);
}

static void test_decode_new_param(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *result = NULL, *tool = NULL, *args = NULL;
        TestArgs a;
        json_t *g;

        /* absent: its default; given: its value, the other fields as before */
        assert_ok(decode("{\"name\":\"x\"}", &a, &e));
        assert_string_equal(a.name, "x");
        assert_int_equal(a.cpus, 2);
        assert_int_equal(a.gpus, 0);
        test_args_done(&a);
        assert_ok(decode("{\"name\":\"x\",\"gpus\":8,\"cpus\":null}", &a, &e));
        assert_int_equal(a.gpus, 8);
        assert_int_equal(a.cpus, 2);
        test_args_done(&a);

        /* its limits, its type and its neighbours' problems, in one message naming each field */
        assert_errno(decode("{\"name\":\"x\",\"gpus\":9}", &a, &e), -EINVAL);
        assert_int_equal(e.code, API_ERROR_INVALID_REQUEST);
        assert_string_equal(e.message, "invalid request: gpus must be 0..8");
        assert_null(a.name); /* nothing to free on failure */
        assert_errno(decode("{\"name\":\"x\",\"gpus\":-1}", &a, &e), -EINVAL);
        assert_string_equal(e.message, "invalid request: gpus must be 0..8");
        assert_errno(decode("{\"name\":\"x\",\"gpus\":\"2\"}", &a, &e), -EINVAL);
        assert_string_equal(e.message, "invalid request: field \"gpus\": expected an integer, got string");
        assert_errno(decode("{\"name\":\"\",\"cpus\":0,\"gpus\":100}", &a, &e), -EINVAL);
        assert_string_equal(
                e.message, "invalid request: name is empty; cpus must be 1..256; gpus must be 0..8");

        /* the handler gets the decoded struct */
        args = json_pack("{s:s,s:i}", "name", "y", "gpus", 4);
        assert_ok(operation_run(&test_op, /* m= */ NULL, /* caller= */ NULL, args, &result, &e));
        assert_int_equal(json_integer_value(json_object_get(result, "gpus")), 4);
        assert_int_equal(json_integer_value(json_object_get(result, "cpus")), 2);

        /* and MCP's inputSchema shows what the decoder enforces */
        tool = operation_tool_json(&test_op);
        g = json_object_get(json_object_get(json_object_get(tool, "inputSchema"), "properties"), "gpus");
        assert_int_equal(json_integer_value(json_object_get(g, "minimum")), 0);
        assert_int_equal(json_integer_value(json_object_get(g, "maximum")), 8);
        assert_int_equal(json_integer_value(json_object_get(g, "default")), 0);
}

int main(int argc, char **argv) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_openapi_matches_table),
                cmocka_unit_test(test_result_schemas_match_openapi),
                cmocka_unit_test(test_descriptions_and_hints),
                cmocka_unit_test(test_check_args),
                cmocka_unit_test(test_tool_json),
                cmocka_unit_test(test_openapi_limits_match_table),
                cmocka_unit_test(test_decode_new_param),
        };

        openapi_path = getenv("VM_MANAGER_OPENAPI") ?: "api/openapi.yaml";
        return cmocka_run_group_tests(tests, NULL, NULL);
}
