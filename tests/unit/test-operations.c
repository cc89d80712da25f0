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
} Route;

/* Reads the routes from api/openapi.yaml. The document is ours and keeps one layout: paths at two
 * spaces, methods at four, operationId at six. */
static size_t read_routes(Route *routes, size_t max) {
        _cleanup_free_ char *text = NULL;
        char path[256] = "", method[16] = "";
        bool in_paths = false;
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
                if (strneq(line, "    ", 4) && line[4] != ' ' && sscanf(line, "    %15[a-z]:", method) == 1)
                        continue;
                char op[64];
                if (sscanf(line, "      operationId: %63s", op) == 1) {
                        assert_true(n < max);
                        snprintf(routes[n].path, sizeof(routes[n].path), "%s", path);
                        snprintf(routes[n].method, sizeof(routes[n].method), "%s", method);
                        snprintf(routes[n].op, sizeof(routes[n].op), "%s", op);
                        n++;
                }
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
                        assert_true(
                                op->success_status == 200 || op->success_status == 201 ||
                                op->success_status == 204);
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

int main(int argc, char **argv) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_openapi_matches_table),
                cmocka_unit_test(test_descriptions_and_hints),
                cmocka_unit_test(test_check_args),
                cmocka_unit_test(test_tool_json),
        };

        openapi_path = getenv("VM_MANAGER_OPENAPI") ?: "api/openapi.yaml";
        return cmocka_run_group_tests(tests, NULL, NULL);
}
