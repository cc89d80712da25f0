// SPDX-License-Identifier: LGPL-2.1-or-later
//
// Validates every object of a rendered chart (YAML documents on stdin, as `helm template` prints
// them) and prints one JSON line per object: {"kind", "name", "ok", "errors"}; exits 1 when one is
// invalid, 2 on a usage error.
//
//   * Kubernetes objects: the schemas of kubernetes-models (types, required fields, enums; unknown
//     fields are not flagged by them), ServiceMonitor by @kubernetes-models/prometheus-operator;
//   * muster's MCPServer: the openAPIV3Schema of the CRD given as argv[2], made strict the way the
//     API server's field validation is (unknown fields are errors), with the CRD's defaults applied
//     and its x-kubernetes-validations (CEL) evaluated, as the API server would on admission.
//
// usage: node validate.mjs MCPSERVER_CRD.yaml < rendered.yaml

import { readFileSync } from "node:fs";
import Ajv from "ajv";
import { evaluate } from "@marcbachmann/cel-js";
import { parseAllDocuments, parse } from "yaml";

const crdPath = process.argv[2];
if (!crdPath) {
        console.error("usage: node validate.mjs MCPSERVER_CRD.yaml < rendered.yaml");
        process.exit(2);
}

// ---- the CRD schema, strict ----

function strict(schema) {
        if (!schema || typeof schema !== "object")
                return schema;
        const out = {};
        for (const [k, v] of Object.entries(schema)) {
                if (k.startsWith("x-kubernetes-") || k === "description" || k === "default")
                        continue;
                if (k === "properties")
                        out.properties = Object.fromEntries(Object.entries(v).map(([p, s]) => [p, strict(s)]));
                else if (k === "items" || (k === "additionalProperties" && typeof v === "object"))
                        out[k] = strict(v);
                else
                        out[k] = v;
        }
        if (schema.type === "object" && schema.properties && schema.additionalProperties === undefined &&
            !schema["x-kubernetes-preserve-unknown-fields"])
                out.additionalProperties = false;
        return out;
}

// Defaults, as the API server applies them before validation.
function applyDefaults(schema, value) {
        if (!schema || value === null || typeof value !== "object")
                return;
        if (Array.isArray(value)) {
                for (const item of value)
                        applyDefaults(schema.items, item);
                return;
        }
        for (const [p, s] of Object.entries(schema.properties || {})) {
                if (value[p] === undefined && s.default !== undefined)
                        value[p] = structuredClone(s.default);
                applyDefaults(s, value[p]);
        }
}

// Every x-kubernetes-validations rule on the path of the object; self is the value at that node.
function celErrors(schema, value, path) {
        const errors = [];
        if (!schema || value === undefined || value === null)
                return errors;
        for (const rule of schema["x-kubernetes-validations"] || []) {
                let ok;
                try {
                        ok = evaluate(rule.rule, { self: value });
                } catch (e) {
                        errors.push(`${path || "/"}: rule ${JSON.stringify(rule.rule)} failed to evaluate: ${e.message}`);
                        continue;
                }
                if (ok !== true)
                        errors.push(`${path || "/"}: ${rule.message || rule.rule}`);
        }
        if (Array.isArray(value))
                value.forEach((item, i) => errors.push(...celErrors(schema.items, item, `${path}/${i}`)));
        else if (typeof value === "object")
                for (const [p, s] of Object.entries(schema.properties || {}))
                        errors.push(...celErrors(s, value[p], `${path}/${p}`));
        return errors;
}

const crd = parse(readFileSync(crdPath, "utf8"));
const crdVersions = new Map();
for (const v of crd.spec.versions) {
        const schema = v.schema.openAPIV3Schema;
        const ajv = new Ajv({ allErrors: true, strict: false, validateFormats: false });
        crdVersions.set(`${crd.spec.group}/${v.name}`, { schema, check: ajv.compile(strict(schema)) });
}

function validateCustom(obj) {
        const v = crdVersions.get(obj.apiVersion);
        if (!v || obj.kind !== crd.spec.names.kind)
                return [`no CRD for ${obj.apiVersion} ${obj.kind}`];
        const copy = structuredClone(obj);
        applyDefaults(v.schema, copy);
        const errors = [];
        if (!v.check(copy))
                for (const e of v.check.errors)
                        errors.push(`${e.instancePath || "/"}: ${e.message}` +
                                    (e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : ""));
        return errors.concat(celErrors(v.schema, copy, ""));
}

// ---- Kubernetes objects ----

async function modelOf(apiVersion, kind) {
        let mod;
        if (apiVersion === "monitoring.coreos.com/v1")
                mod = await import("@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1");
        else {
                try {
                        mod = await import(`kubernetes-models/${apiVersion}`);
                } catch {
                        return null;
                }
        }
        return mod[kind] || null;
}

async function validateKubernetes(obj) {
        const Model = await modelOf(obj.apiVersion, obj.kind);
        if (!Model)
                return [`unknown apiVersion/kind ${obj.apiVersion} ${obj.kind}`];
        try {
                new Model(obj).validate();
                return [];
        } catch (e) {
                return String(e.message).split(/,\s*(?=data)/);
        }
}

// ---- main ----

const input = readFileSync(0, "utf8");
let failed = false;
for (const doc of parseAllDocuments(input)) {
        if (doc.errors.length) {
                console.log(JSON.stringify({ kind: null, name: null, ok: false, errors: doc.errors.map(String) }));
                failed = true;
                continue;
        }
        const obj = doc.toJS();
        if (obj === null || obj === undefined)
                continue;
        const errors = crdVersions.has(obj.apiVersion) ? validateCustom(obj) : await validateKubernetes(obj);
        const ok = errors.length === 0;
        failed ||= !ok;
        console.log(JSON.stringify({ kind: obj.kind, name: obj.metadata && obj.metadata.name, ok, errors }));
}
process.exit(failed ? 1 : 0);
