/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <string.h>

#include "cleanup.h"
#include "json-util.h"
#include "mcp-schema.h"

#define DEFS_PREFIX "#/$defs/"

/* generated from api/openapi.yaml by tools/gen-schemas.py and tools/embed.py */
extern const char mcp_schemas_json[];
extern const size_t mcp_schemas_json_size;

int mcp_schemas_load(json_t **ret) {
        json_t *schemas = json_loadb(mcp_schemas_json, mcp_schemas_json_size, 0, /* error= */ NULL);

        if (!json_is_object(schemas)) {
                json_decref(schemas);
                return -ENOMEM; /* the build wrote it: only memory can be short */
        }
        *ret = schemas;
        return 0;
}

/* Adds to defs every schema node refers to, and what those refer to in turn. */
static int collect_refs(json_t *node, json_t *schemas, json_t *defs) {
        const char *key;
        json_t *v;
        size_t i;

        if (json_is_array(node)) {
                json_array_foreach(node, i, v) {
                        int r = collect_refs(v, schemas, defs);
                        if (r < 0)
                                return r;
                }
                return 0;
        }
        if (!json_is_object(node))
                return 0;
        json_object_foreach(node, key, v) {
                const char *ref = streq(key, "$ref") ? json_string_value(v) : NULL;
                int r;

                if (ref && strneq(ref, DEFS_PREFIX, strlen(DEFS_PREFIX))) {
                        const char *name = ref + strlen(DEFS_PREFIX);
                        json_t *def = json_object_get(schemas, name);

                        if (!def)
                                return -ENOENT; /* test-operations keeps the document whole */
                        if (json_object_get(defs, name))
                                continue;
                        if (json_object_set(defs, name, def) < 0)
                                return -ENOMEM;
                        r = collect_refs(def, schemas, defs);
                } else
                        r = collect_refs(v, schemas, defs);
                if (r < 0)
                        return r;
        }
        return 0;
}

json_t *mcp_output_schema(const Operation *op, json_t *schemas) {
        json_auto_t *success = NULL, *schema = NULL, *defs = json_object();
        _cleanup_free_ char *ref = NULL;

        if (!op->result_schema || !defs)
                return NULL;
        asprintf_or_null(&ref, DEFS_PREFIX "%s", op->result_schema);
        if (!ref)
                return NULL;
        /* A list is an object too (structuredContent always is): the array under its list_key. */
        if (op->list_key)
                success = json_pack(
                        "{s:s,s:[s],s:{s:{s:s,s:{s:s}}}}",
                        "type",
                        "object",
                        "required",
                        op->list_key,
                        "properties",
                        op->list_key,
                        "type",
                        "array",
                        "items",
                        "$ref",
                        ref);
        else
                success = json_pack("{s:s}", "$ref", ref);
        /* The type stays at the root for clients that read only that (the 2025 SDKs require it). */
        schema = json_pack(
                "{s:s,s:s,s:[O,{s:s}]}",
                "$schema",
                "https://json-schema.org/draft/2020-12/schema",
                "type",
                "object",
                "anyOf",
                success,
                "$ref",
                DEFS_PREFIX "Error");
        if (!schema || collect_refs(schema, schemas, defs) < 0 || json_object_set(schema, "$defs", defs) < 0)
                return NULL;
        return TAKE_PTR(schema);
}
