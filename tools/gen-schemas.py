#!/usr/bin/env python3
"""Writes the schemas of api/openapi.yaml (components/schemas) as one JSON object, for MCP's
outputSchema: the document's references "#/components/schemas/X" become "#/$defs/X", which is
where src/mcp/mcp-schema.c puts the schemas a tool's result refers to.

  gen-schemas.py OPENAPI_YAML OUTPUT_JSON
"""
import json
import sys

import yaml

PREFIX = "#/components/schemas/"


def rewrite(node):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                if not v.startswith(PREFIX):
                    sys.exit("gen-schemas.py: a reference outside components/schemas: %s" % v)
                v = "#/$defs/" + v[len(PREFIX):]
            out[k] = rewrite(v)
        return out
    if isinstance(node, list):
        return [rewrite(v) for v in node]
    return node


src, out = sys.argv[1:3]
with open(src) as f:
    doc = yaml.safe_load(f)
schemas = rewrite(doc["components"]["schemas"])
with open(out, "w") as f:
    json.dump(schemas, f, sort_keys=True, separators=(",", ":"))
    f.write("\n")
