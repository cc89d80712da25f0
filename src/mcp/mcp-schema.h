/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>

#include "operation.h"

/* MCP's outputSchema of a tool: the JSON Schema (2020-12) its structuredContent follows. It is made
 * of the operation table's result_schema and the schemas of api/openapi.yaml, embedded at build time,
 * so the REST response and the MCP result are described once. */

/* The schemas of api/openapi.yaml, by name, with references as "#/$defs/<name>"; a new reference. */
int mcp_schemas_load(json_t **ret);

/* The outputSchema of op: its result (an object wrapping the list under list_key for a list) or,
 * for a failed call, the error envelope; with the schemas these refer to as $defs. A new reference;
 * NULL when out of memory or when op names no result_schema. */
json_t *mcp_output_schema(const Operation *op, json_t *schemas);
