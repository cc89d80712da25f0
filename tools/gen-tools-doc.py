#!/usr/bin/env python3
"""Writes docs/tools.md from the operation table, as a model reads it over MCP.

Starts the given vm-manager binary on a free loopback port with a scratch state directory, asks
it for tools/list, and renders every tool's description, annotations and input schema.

  gen-tools-doc.py VM_MANAGER OUTPUT          write OUTPUT
  gen-tools-doc.py VM_MANAGER OUTPUT --check  exit 1 (with a diff) when OUTPUT is not current
"""
import difflib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rpc(port, body, session=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if session:
        headers["Mcp-Session-Id"] = session
    conn.request("POST", "/mcp", body=json.dumps(body), headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    sid = resp.getheader("Mcp-Session-Id")
    conn.close()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %r" % (resp.status, data))
    return json.loads(data), sid


def fetch_tools(binary):
    work = tempfile.mkdtemp(prefix="vmm-tools-doc-")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VM_MANAGER_")}
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:%d" % port, "--state-dir", os.path.join(work, "state"),
         "--log-level", "warning"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                init, sid = rpc(port, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                       "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                  "clientInfo": {"name": "gen-tools-doc", "version": "1"}}})
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("vm-manager did not answer: %s" % proc.stderr.read().decode(errors="replace"))
                time.sleep(0.05)
        tools, _ = rpc(port, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
        info, _ = rpc(port, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                             "params": {"name": "get_info", "arguments": {}}}, sid)
        return init["result"], tools["result"]["tools"], info["result"]["structuredContent"]["tools"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def rest_routes(openapi):
    """operationId -> "METHOD /api/v1/path", from our own OpenAPI document's fixed layout."""
    routes, path, method, in_paths = {}, None, None, False
    for line in open(openapi):
        if line[:1] not in (" ", "\n"):
            in_paths = line.startswith("paths:")
            continue
        if not in_paths:
            continue
        if line.startswith("  /"):
            path = line.strip().rstrip(":")
        elif line.startswith("    ") and not line.startswith("     "):
            method = line.strip().rstrip(":").upper()
        elif line.strip().startswith("operationId:"):
            routes[line.split(":", 1)[1].strip()] = "%s /api/v1%s" % (method, path)
    return routes


def render(init, tools, order, routes):
    by_name = {t["name"]: t for t in tools}
    out = ["# MCP tools", "",
           "Generated from the operation table by `make tools-doc` (tools/gen-tools-doc.py); do not edit.",
           "A test fails when this file and the server disagree.", "",
           "Every tool is also a REST route under `/api/v1` (see `api/openapi.yaml`) unless marked MCP only;",
           "both return the same JSON. Failures are tool results with `isError: true` whose text is",
           "`<code>: <message>`, the same code REST answers with.", "",
           "## Server instructions", "", "Sent in the `initialize` result:", ""]
    out += ["> " + line if line else ">" for line in init["instructions"].split("\n")]
    out += ["", "## Tools", "", "In registration order (`get_info` lists them so); `tools/list` sorts them by name.", ""]
    out += ["| tool | REST | read-only | destructive | idempotent | open world |", "|---|---|---|---|---|---|"]
    for name in order:
        a = by_name[name]["annotations"]
        yn = lambda b: "yes" if b else "no"
        rest = "`%s`" % routes[name] if name in routes else "MCP only"
        out.append("| `%s` | %s | %s | %s | %s | %s |" % (name, rest, yn(a["readOnlyHint"]), yn(a["destructiveHint"]),
                                                         yn(a["idempotentHint"]), yn(a["openWorldHint"])))
    for name in order:
        t = by_name[name]
        out += ["", "### `%s`" % name, "", t["description"], ""]
        props = t["inputSchema"].get("properties", {})
        required = t["inputSchema"].get("required", [])
        if not props:
            out.append("No arguments.")
            continue
        out += ["| argument | type | required | description |", "|---|---|---|---|"]
        for pname, schema in props.items():
            typ = schema["type"]
            if typ == "array":
                typ = "array of %s" % schema["items"]["type"]
            if "enum" in schema:
                typ += " (" + ", ".join(schema["enum"]) + ")"
            out.append("| `%s` | %s | %s | %s |" % (pname, typ, "yes" if pname in required else "no",
                                                   schema.get("description", "").replace("|", "\\|")))
    return "\n".join(out) + "\n"


def main():
    binary, output = sys.argv[1], sys.argv[2]
    check = "--check" in sys.argv[3:]
    openapi = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api", "openapi.yaml")
    text = render(*fetch_tools(binary), rest_routes(openapi))
    if check:
        try:
            current = open(output).read()
        except OSError:
            current = ""
        if current != text:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                       output, "generated"))
            print("%s is stale: run make tools-doc" % output)
            return 1
        print("%s is current" % output)
        return 0
    with open(output, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
