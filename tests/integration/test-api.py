#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Black-box test of the REST API and the MCP endpoint of `vm-manager serve`.

Against the real binary ($VM_MANAGER_BIN, else argv[1]) on free 127.0.0.1 ports with temporary
state and image directories, printing TAP version 13:

  * parity: every operation with a REST route answers the same JSON through MCP tools/call
    (text content and structuredContent), errors included (same code and message);
  * a table of bad inputs over the write routes (REST and MCP) is refused with invalid_request
    naming the field, and leaves the state directory byte-for-byte unchanged;
  * the order of checks (400 before 404/409), trailing slashes, unknown methods, HEAD, the
    OpenAPI document;
  * networks survive a restart byte-identically, and a kill -9 during a burst of creates leaves
    a loadable, complete networks.json;
  * the MCP transport: versions, sessions, JSON-RPC errors, tools/list, the GET stream and its
    end, the Origin/Host guard;
  * images appear without a restart; get_host matches the Host schema of the OpenAPI document.

Known daemon bugs are TAP TODO lines (see KNOWN_BUGS): they do not fail the run, and once fixed
meson reports them as unexpected passes, the cue to drop the entry.
Standard library only; only 127.0.0.1 is contacted; every daemon is killed in a finally block.
VM_MANAGER_TEST_SEED fixes the random kill delays of the crash test.
"""

import http.client
import json
import os
import random
import re
import signal
import socket
import sys
import time
import urllib.parse

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from vmmtest import (  # noqa: E402
    HOST,
    Daemon,
    McpClient,
    check_json_error,
    content_type,
    diff_snapshots,
    free_port,
    http_request,
    json_error_of,
    run,
    snapshot_tree,
    start_thread,
    tap,
    tool_error,
    tool_json,
)

GLOBAL_DEADLINE = 85  # seconds; meson allows 180, the brief wants < 90
SOURCE_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Daemon bugs found by this test, reported with their fixes. A check that hits one is a TODO.
# (Two more it found were fixed in 0a3364b: the MCP reply leak and the lost wake-up that kept a
# GET stream open after its session's DELETE; their checks are plain checks now.)
KNOWN_BUGS = {}

# The operations with a REST route: (tool, method, path under /api/v1).
ROUTES = [
    ("get_host", "GET", "/host"),
    ("list_images", "GET", "/images"),
    ("get_image", "GET", "/images/{ref}"),
    ("list_networks", "GET", "/networks"),
    ("get_network", "GET", "/networks/{name}"),
    ("create_network", "POST", "/networks"),
    ("delete_network", "DELETE", "/networks/{name}"),
]

# The VM operations' routes: documented, and checked against the document here; their behaviour
# on real boots is tests/integration/test-vm.py's.
VM_ROUTES = [
    ("list_vms", "GET", "/vms"),
    ("create_vm", "POST", "/vms"),
    ("get_vm", "GET", "/vms/{id}"),
    ("delete_vm", "DELETE", "/vms/{id}"),
    ("start_vm", "POST", "/vms/{id}/start"),
    ("stop_vm", "POST", "/vms/{id}/stop"),
    ("reboot_vm", "POST", "/vms/{id}/reboot"),
    ("get_vm_console", "GET", "/vms/{id}/console"),
    ("get_vm_attestation", "GET", "/vms/{id}/attestation"),
    ("get_vm_metrics", "GET", "/vms/{id}/metrics"),
    ("exec_vm", "POST", "/vms/{id}/exec"),
    ("forward_port", "POST", "/vms/{id}/forward"),
]
# The relative registration order of these tools (get_info lists every tool in that order).
REGISTRATION_ORDER = [
    "get_info",
    "get_host",
    "list_images",
    "get_image",
    "list_networks",
    "get_network",
    "create_network",
    "delete_network",
]
MCP_VERSIONS = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]
LATEST_VERSION = "2025-11-25"

API = "/api/v1"
KB100 = 100 * 1024
MB1 = 1024 * 1024

main = {}  # the daemon shared by most sections: daemon, port, state, images, mcp


# ---------------------------------------------------------------------------------------------
# helpers


def stop_check(d, label, sig=signal.SIGTERM):
    """SIGTERM (or sig) and a TAP line for exit status 0 (a sanitizer report makes it 1)."""
    rc, took = d.stop(sig)
    bad = d.sanitizer_lines()
    tap.result(rc == 0, "%s: exits 0 on SIGTERM" % label, "exit %r after %.2f s%s" % (
        rc, took, "; sanitizer: " + "; ".join(bad[:3]) if bad else ""))
    return rc


def start_daemon(work, name, state, image_dir=None, extra=None):
    port = free_port()
    args = ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--log-level", "debug"]
    if image_dir:
        args += ["--image-dir", image_dir]
    d = Daemon(work, name, args + (extra or []))
    ok, diag = d.wait_healthy(port)
    return d, port, ok, diag


def rest(method, path, body=None, headers=None, port=None):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    h = {"Content-Type": "application/json"} if body is not None else {}
    h.update(headers or {})
    return http_request(port or main["port"], method, API + path, body=body, headers=h)


def mcp():
    return main["mcp"]


def wrap(op_list_key, value):
    return {op_list_key: value} if op_list_key else value


def list_key(tool):
    return {"list_images": "images", "list_networks": "networks"}.get(tool)


def quote_segment(s):
    return urllib.parse.quote(s, safe="")


def raw_exchange(port, request, timeout=5):
    """Sends request bytes on a fresh socket and reads until EOF."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    try:
        s.sendall(request)
        data = bytearray()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return bytes(data)
    finally:
        s.close()


def mcp_envelope(arguments_text, tool="create_network", rpc_id=1):
    """The raw text of a tools/call whose arguments are arguments_text, verbatim."""
    if isinstance(arguments_text, str):
        arguments_text = arguments_text.encode()
    return (
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":' % (rpc_id, tool.encode())
        + arguments_text
        + b"}}"
    )


# ---------------------------------------------------------------------------------------------
# the main daemon


def setup_main(work):
    state = os.path.join(work, "s")
    images = os.path.join(work, "img")
    os.makedirs(images)
    d, port, ok, diag = start_daemon(work, "main", state, images)
    tap.result(ok, "main daemon starts (empty image dir) and answers /healthz", diag)
    if not ok:
        raise RuntimeError("the main daemon did not start")
    main.update(daemon=d, port=port, state=state, images=images, mcp=McpClient(port))
    tap.check("MCP initialize on the main daemon yields a session", lambda: (bool(mcp().initialize()), mcp().session))


# ---------------------------------------------------------------------------------------------
# 1. parity


def parity_checks(label, tool, status, headers, data, want_status, result):
    """Three TAP lines: REST body == tool text JSON; == structuredContent; byte-identical."""

    def same_text():
        if status != want_status or content_type(headers) != "application/json":
            return False, "REST: status %r content-type %r body %r" % (status, headers.get("content-type"), data[:300])
        text, _ = tool_json(result)
        body = json.loads(data)
        return body == text, "REST %s\nMCP  %s" % (json.dumps(body)[:1500], json.dumps(text)[:1500])

    def same_structured():
        body = json.loads(data)
        _, sc = tool_json(result)
        want = wrap(list_key(tool), body)
        return sc == want, "want %s\ngot  %s" % (json.dumps(want)[:1500], json.dumps(sc)[:1500])

    def same_bytes():
        text = result["content"][0]["text"]
        return data == (text + "\n").encode(), "REST %r\nMCP  %r" % (data[:400], text[:400])

    tap.check("parity %s: REST %d body equals json.loads(tool text)" % (label, want_status), same_text)
    tap.check("parity %s: REST body equals structuredContent%s" % (label, " (wrapped)" if list_key(tool) else ""),
              same_structured)
    tap.check("parity %s: tool text is the REST body byte for byte, minus its newline" % label, same_bytes)


def test_parity(work):
    status, headers, data = rest("GET", "/host")
    parity_checks("get_host", "get_host", status, headers, data, 200, mcp().call("get_host"))

    status, headers, data = rest("GET", "/images")
    parity_checks("list_images (empty dir)", "list_images", status, headers, data, 200, mcp().call("list_images"))
    tap.check("list_images with an empty image dir is []", lambda: (json.loads(data) == [], data))

    status, headers, data = rest("GET", "/networks")
    parity_checks("list_networks", "list_networks", status, headers, data, 200, mcp().call("list_networks"))
    status, headers, data = rest("GET", "/networks/default")
    parity_checks("get_network default", "get_network", status, headers, data, 200,
                  mcp().call("get_network", {"name": "default"}))

    spec = {"name": "par", "cidr": "10.20.0.0/24", "dns_search_domain": "par.internal"}
    c_status, c_headers, c_data = rest("POST", "/networks", spec)

    def created():
        body = json.loads(c_data)
        want = {
            "spec": {"name": "par", "cidr": "10.20.0.0/24", "dnsSearchDomain": "par.internal", "enableIMDS": True,
                     "mtu": 1500},
            "gateway": "10.20.0.1",
            "leases": [],
        }
        return c_status == 201 and body == want, "status %r body %r" % (c_status, c_data[:500])

    tap.check("create_network via REST: 201 with the Network (cidr as submitted, gateway .1 of it)",
              created)
    status, headers, data = rest("GET", "/networks/par")
    parity_checks("get_network par", "get_network", status, headers, data, 200, mcp().call("get_network", {"name": "par"}))
    status, headers, data = rest("GET", "/networks")
    parity_checks("list_networks after a create", "list_networks", status, headers, data, 200,
                  mcp().call("list_networks"))

    result = mcp().call("delete_network", {"name": "par"})

    def mcp_deleted():
        text, sc = tool_json(result)
        want = {"id": "par", "deleted": True}
        return text == want and sc == want, "%r" % result

    tap.check("delete_network via MCP: {\"id\": name, \"deleted\": true} as text and structuredContent", mcp_deleted)
    tap.check("... REST sees it gone: GET /networks/par is 404 not_found",
              lambda: check_json_error(*rest("GET", "/networks/par"), 404, "not_found", 'not found: network "par"'))

    result = mcp().call("create_network", spec)
    parity_checks("create_network (REST 201 vs MCP, same arguments)", "create_network", c_status, c_headers, c_data,
                  201, result)

    def rest_deleted():
        status, headers, data = rest("DELETE", "/networks/par")
        ok = status == 204 and data == b"" and "content-type" not in headers
        return ok, "status %r headers %r body %r" % (status, headers, data)

    tap.check("delete_network via REST: 204, empty body, no Content-Type", rest_deleted)

    def mcp_sees_gone():
        code, message = tool_error(mcp().call("get_network", {"name": "par"}))
        return (code, message) == ("not_found", 'not found: network "par"'), (code, message)

    tap.check("... MCP sees it gone: get_network par is isError not_found", mcp_sees_gone)
    status, headers, data = rest("GET", "/networks")
    parity_checks("list_networks after the deletes", "list_networks", status, headers, data, 200,
                  mcp().call("list_networks"))
    tap.check("... and only default is left", lambda: ([n["spec"]["name"] for n in json.loads(data)] == ["default"], data))

    def host_twice():
        a = rest("GET", "/host")[2]
        b = rest("GET", "/host")[2]
        return a == b, "first %r\nsecond %r" % (a[:300], b[:300])

    tap.check("get_host is stable between two calls (devices do not change)", host_twice)

    # enable_host_alias: shown in the spec when on, the same through both surfaces
    alias = {"name": "par-alias", "cidr": "10.20.1.0/24", "enable_host_alias": True}
    a_status, a_headers, a_data = rest("POST", "/networks", alias)
    tap.check("create_network enable_host_alias true (REST): 201, spec.enableHostAlias true",
              lambda: (a_status == 201 and json.loads(a_data)["spec"] == {
                  "name": "par-alias", "cidr": "10.20.1.0/24", "enableIMDS": True, "enableHostAlias": True,
                  "mtu": 1500}, a_data[:300]))
    status, headers, data = rest("GET", "/networks/par-alias")
    parity_checks("get_network par-alias", "get_network", status, headers, data, 200,
                  mcp().call("get_network", {"name": "par-alias"}))
    tap.check("... get_network shows enableHostAlias true",
              lambda: (status == 200 and json.loads(data)["spec"].get("enableHostAlias") is True, data[:300]))
    rest("DELETE", "/networks/par-alias")
    parity_checks("create_network enable_host_alias true (REST 201 vs MCP)", "create_network", a_status, a_headers,
                  a_data, 201, mcp().call("create_network", alias))
    rest("DELETE", "/networks/par-alias")
    off = {"name": "par-off", "cidr": "10.20.2.0/24", "enable_host_alias": False}
    status, headers, data = rest("POST", "/networks", off)
    tap.check("create_network enable_host_alias false: as without it, no enableHostAlias in the spec",
              lambda: (status == 201 and "enableHostAlias" not in json.loads(data)["spec"], data[:300]))
    rest("DELETE", "/networks/par-off")


# ---------------------------------------------------------------------------------------------
# 2. every error code through both surfaces


def error_parity(label, rest_answer, want_status, want_code, want_message, result):
    status, headers, data = rest_answer

    def rest_side():
        return check_json_error(status, headers, data, want_status, want_code, want_message)

    def mcp_side():
        code, message = tool_error(result)
        rest_code, rest_message = json_error_of(status, headers, data)
        ok = (code, message) == (want_code, want_message) and (code, message) == (rest_code, rest_message)
        return ok, "MCP %r, REST %r" % ((code, message), (rest_code, rest_message))

    tap.check("%s: REST %d %s %r" % (label, want_status, want_code, want_message), rest_side)
    tap.check("%s: MCP isError, text '<code>: <message>', structuredContent.error, same code and message" % label,
              mcp_side)


def test_errors(work):
    error_parity("unknown network (get)", rest("GET", "/networks/nope"), 404, "not_found", 'not found: network "nope"',
                 mcp().call("get_network", {"name": "nope"}))
    error_parity("unknown network (delete)", rest("DELETE", "/networks/nope"), 404, "not_found",
                 'not found: network "nope"', mcp().call("delete_network", {"name": "nope"}))
    error_parity("unknown image", rest("GET", "/images/nope"), 404, "not_found", 'not found: image "nope"',
                 mcp().call("get_image", {"ref": "nope"}))
    tap.check("unknown REST route: GET /api/v1/nope is 404 not_found 'not found: no route GET /api/v1/nope'",
              lambda: check_json_error(*http_request(main["port"], "GET", "/api/v1/nope"), 404, "not_found",
                                       "not found: no route GET /api/v1/nope"))

    bad = {"name": 1, "cidr": "10.21.0.0/24"}
    error_parity("bad body (name is a number)", rest("POST", "/networks", bad), 400, "invalid_request",
                 'invalid request: field "name": expected a string, got integer', mcp().call("create_network", bad))
    bad = {"name": "x"}
    error_parity("missing cidr", rest("POST", "/networks", bad), 400, "invalid_request",
                 'invalid request: field "cidr" is required', mcp().call("create_network", bad))
    bad = {"name": "x", "cidr": "10.0.0.0/8"}
    error_parity("cidr /8", rest("POST", "/networks", bad), 400, "invalid_request",
                 'invalid request: cidr "10.0.0.0/8": prefix length must be /16 to /29',
                 mcp().call("create_network", bad))

    dup = {"name": "dup", "cidr": "10.22.0.0/24"}
    tap.check("conflict setup: create dup (201)", lambda: (rest("POST", "/networks", dup)[0] == 201, None))
    error_parity("duplicate network name", rest("POST", "/networks", dup), 409, "conflict",
                 'conflict: network "dup" already exists', mcp().call("create_network", dup))
    error_parity("duplicate of the default network", rest("POST", "/networks", {"name": "default", "cidr": "10.23.0.0/24"}),
                 409, "conflict", 'conflict: network "default" already exists',
                 mcp().call("create_network", {"name": "default", "cidr": "10.23.0.0/24"}))
    tap.check("conflict cleanup: delete dup (204)", lambda: (rest("DELETE", "/networks/dup")[0] == 204, None))

    # 0 and "" are no way to ask for a default (absent or null is): refused naming the field, the
    # same through both surfaces, and nothing changes
    vms_before, nets_before = rest("GET", "/vms")[2], rest("GET", "/networks")[2]
    for field, value, want in (
            ("cpus", 0, "cpus must be 1..256"),
            ("memory_mib", 0, "memory_mib must be at least 256"),
            ("disk_gib", 0, "disk_gib must be 1..4096"),
            ("image", "", "image must not be empty (leave it out for the default)"),
            ("network", "", "network must not be empty (leave it out for the default)"),
            ("hostname", "", "hostname must not be empty (leave it out for the default)"),
            ("kubernetes_version", "", "kubernetes_version must not be empty (leave it out for the default)"),
            ("wait_for", "", 'field "wait_for": "" is not one of the allowed values')):
        bad = {"name": "zero", field: value}
        error_parity("create_vm %s %r" % (field, value), rest("POST", "/vms", bad), 400, "invalid_request",
                     "invalid request: " + want, mcp().call("create_vm", bad))
    # null is the default: the request gets past the checks to the (empty) image directory
    nulls = {"name": "nulls", "image": None, "kubernetes_version": None, "cpus": None, "memory_mib": None,
             "disk_gib": None, "network": None, "hostname": None, "wait_for": None}
    error_parity("create_vm with every defaulted field null", rest("POST", "/vms", nulls), 400, "invalid_request",
                 'invalid request: image "": not found: no images in %s' % main["images"],
                 mcp().call("create_vm", nulls))
    for spec, want in (
            ({"name": "hb", "cidr": "10.77.0.5/24"},
             'cidr "10.77.0.5/24" has host bits set: the network is 10.77.0.0/24'),
            ({"name": "hb", "cidr": "172.16.255.255/16"},
             'cidr "172.16.255.255/16" has host bits set: the network is 172.16.0.0/16'),
            ({"name": "hb", "cidr": "10.77.0.0/24", "dns_search_domain": ""},
             "dns_search_domain must not be empty (leave it out for none)")):
        error_parity("create_network %s" % json.dumps(spec), rest("POST", "/networks", spec), 400, "invalid_request",
                     "invalid request: " + want, mcp().call("create_network", spec))
    tap.check("... after those refusals list_vms and list_networks are byte-identical",
              lambda: ((rest("GET", "/vms")[2], rest("GET", "/networks")[2]) == (vms_before, nets_before), None))


# ---------------------------------------------------------------------------------------------
# 3. bad input


OK_BODY = {"name": "t-ok", "cidr": "10.77.0.0/24"}
MISSING = object()


def body_with(**kw):
    d = dict(OK_BODY)
    for k, v in kw.items():
        if v is MISSING:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def case(label, body, field=None, mcp="tool", same_message=True, rest_todo=None, raw_mcp=None):
    """body: a JSON value (dumped for REST, sent as arguments to MCP) or bytes (the raw REST body;
    raw_mcp is then the raw MCP body, or it is built by wrapping the bytes as the arguments).
    field: the name the message must contain. mcp: 'tool' (isError invalid_request), or the
    JSON-RPC error code expected instead ('-32602', '-32700')."""
    return dict(label=label, body=body, field=field, mcp=mcp, same_message=same_message, rest_todo=rest_todo,
                raw_mcp=raw_mcp)


def bad_input_cases():
    cases = []
    for field in ("name", "cidr", "dns_search_domain"):
        for tlabel, v in (("integer", 1), ("real", 1.5), ("boolean", True), ("array", []), ("array of strings", ["a"]),
                          ("object", {}), ("object of strings", {"a": "b"})):
            cases.append(case("%s is %s" % (field, tlabel), body_with(**{field: v}), field))
    for tlabel, v in (("a string", "true"), ("integer", 1), ("null", None), ("array", [True]), ("object", {})):
        cases.append(case("enable_host_alias is %s" % tlabel, body_with(enable_host_alias=v), "enable_host_alias"))
    # null: an absent optional field (dns_search_domain: null is accepted and means none).
    cases.append(case("name is null", body_with(name=None), "name"))
    cases.append(case("cidr is null", body_with(cidr=None), "cidr"))
    for key in ("bogus", "NAME", "enable_imds", "enableIMDS", "enableHostAlias", "dnsSearchDomain", "gateway"):
        cases.append(case("unknown key %r" % key, body_with(**{key: "x"}), key))
    cases.append(case("missing name", body_with(name=MISSING), "name"))
    cases.append(case("missing cidr", body_with(cidr=MISSING), "cidr"))
    cases.append(case("only dns_search_domain", {"dns_search_domain": "a.b"}, "name"))
    cases.append(case("empty object", {}, "name"))
    for field in ("name", "cidr", "dns_search_domain"):
        for size, slabel in ((KB100, "100 KB"), (MB1, "1 MB")):
            cases.append(case("%s of %s" % (field, slabel), body_with(**{field: "a" * size}), field,
                              ))
    for name in ("a/b", "..", "a\u0000b", "Upper", "-lead", "trail-", "x" * 64, "", "a_b", "a.b", "caf\u00e9",
                 " pad", "a\nb"):
        cases.append(case("name %r" % (name if len(name) < 20 else name[:8] + "...(%d)" % len(name)),
                          body_with(name=name), "name"))
    for cidr in ("10.0.0.0/8", "10.0.0.0/30", "169.254.0.0/16", "169.254.10.0/24", "127.0.0.0/24", "0.0.0.0/16",
                 "224.0.0.0/24", "240.0.0.0/24", "10.0.0.256/24", "010.0.0.0/24", "10.0.0/24", "10.0.0.0",
                 "10.0.0.0/24 ", "-1", "10.0.0.0/-1", "10.0.0.0/999999999999999999999", "", " 10.0.0.0/24",
                 "10.0.0.0/024", "10.0.0.0/+24", "10.0.0.0//24", "::1/64", "10.0.0.0/24\u0000"):
        cases.append(case("cidr %r" % cidr, body_with(cidr=cidr), "cidr"))
    for dns in ("bad domain", "-x.com", "a..b", "a" * 64 + ".com", ("abcdefghi." * 30)[:300], "x-.com", ".",
                "a.b..", "under_score.com", "caf\u00e9.com"):
        cases.append(case("dns_search_domain %r" % (dns if len(dns) < 20 else dns[:8] + "...(%d)" % len(dns)),
                          body_with(dns_search_domain=dns), "dns_search_domain"))

    # Body-level problems. MCP cannot carry a non-object as arguments (-32602), and a body that is
    # not JSON is a parse error of the whole message (-32700), never a tool call.
    for v in ([], ["x"], "x", 1, True):
        cases.append(case("body is %s" % json.dumps(v), v, None, mcp="-32602", same_message=False))
    cases.append(case("body is null (MCP: null arguments mean {})", None, None, same_message=False))
    cases.append(case("empty body", b"", None, mcp="-32700", raw_mcp=b""))
    cases.append(case("body of whitespace", b" \r\n\t ", None, mcp="-32700", raw_mcp=b" \r\n\t "))
    valid = json.dumps(OK_BODY).encode()
    cases.append(case("trailing garbage after a valid object", valid + b" x", None, mcp="-32700",
                      raw_mcp=mcp_envelope(valid) + b" x"))
    cases.append(case("two JSON values", valid + b"{}", None, mcp="-32700", raw_mcp=mcp_envelope(valid) + b"{}"))
    cases.append(case("duplicate key (cidr twice)", b'{"name":"t-ok","cidr":"10.77.0.0/24","cidr":"10.78.0.0/24"}', None,
                      mcp="-32700"))
    cases.append(case("duplicate key (name twice)", b'{"name":"t-ok","name":"t-ok2","cidr":"10.77.0.0/24"}', None,
                      mcp="-32700"))
    cases.append(case("invalid UTF-8 (0xff) in name", b'{"name":"t-\xff","cidr":"10.77.0.0/24"}', None, mcp="-32700"))
    cases.append(case("invalid UTF-8 (overlong 0xc0 0xaf) in cidr", b'{"name":"t-ok","cidr":"10.77.0.0/24\xc0\xaf"}',
                      None, mcp="-32700"))
    cases.append(case("invalid UTF-8 (truncated sequence) in a key", b'{"name\xe2\x82":"t-ok","cidr":"10.77.0.0/24"}',
                      None, mcp="-32700"))
    cases.append(case("lone surrogate escape in name", b'{"name":"t-\\ud800","cidr":"10.77.0.0/24"}', None, mcp="-32700"))
    cases.append(case("unterminated object", b'{"name":"t-ok","cidr":"10.77.0.0/24"', None, mcp="-32700"))
    cases.append(case("single-quoted JSON", b"{'name':'t-ok','cidr':'10.77.0.0/24'}", None, mcp="-32700"))
    deep = b"[" * 100000 + b"]" * 100000
    cases.append(case("arrays nested 100000 deep", deep, None, mcp="-32700"))
    cases.append(case("object nested 100000 deep in name", b'{"name":' + b'{"a":' * 100000 + b"1" + b"}" * 100000
                      + b',"cidr":"10.77.0.0/24"}', None, mcp="-32700"))
    return cases


def run_rest_case(c):
    body = c["body"]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, headers, data = http_request(main["port"], "POST", API + "/networks", body=raw,
                                         headers={"Content-Type": "application/json"}, timeout=20)
    return status, headers, data


def run_mcp_case(c):
    body = c["body"]
    if c["raw_mcp"] is not None:
        raw = c["raw_mcp"]
    elif isinstance(body, bytes):
        raw = mcp_envelope(body)
    else:
        raw = mcp_envelope(json.dumps(body))
    return mcp().post_raw(raw)


def test_bad_input(work):
    state = main["state"]
    # A canary: a network whose name prefixes the bad names of the delete table.
    tap.check("bad input setup: create canary network a (201)",
              lambda: (rest("POST", "/networks", {"name": "a", "cidr": "10.99.0.0/24"})[0] == 201, None))
    before = snapshot_tree(state)
    list_before = rest("GET", "/networks")[2]
    mcp_list_before = mcp().call("list_networks")

    for c in bad_input_cases():
        rest_answer = run_rest_case(c)

        def rest_side(c=c, answer=rest_answer):
            status, headers, data = answer
            ok, diag = check_json_error(status, headers, data, 400, "invalid_request")
            if not ok:
                return ok, diag
            _, message = json_error_of(status, headers, data)
            if c["field"] is not None and c["field"] not in message:
                return False, "the message does not name the field %r: %r" % (c["field"], message[:300])
            if c["field"] is None and not message.startswith("invalid request: body"):
                return False, "a body-level problem whose message does not start with 'invalid request: body': %r" % (
                    message[:300])
            return True, "message: %s" % message[:180]

        what = "names %r" % c["field"] if c["field"] else "about the body"
        tap.check("bad input, REST POST %s/networks, %s: 400 invalid_request, message %s" % (API, c["label"], what),
                  rest_side, todo=KNOWN_BUGS.get(c["rest_todo"]))

        def mcp_side(c=c, rest_answer=rest_answer):
            status, headers, data = run_mcp_case(c)
            doc = json.loads(data) if data else None
            if c["mcp"] == "tool":
                if status != 200 or not isinstance(doc, dict) or "result" not in doc:
                    return False, "HTTP %r %r" % (status, data[:300])
                code, message = tool_error(doc["result"])
                if code != "invalid_request":
                    return False, "code %r message %r" % (code, message[:300])
                if c["field"] and c["field"] not in message:
                    return False, "the message does not name %r: %r" % (c["field"], message[:300])
                if c["same_message"]:
                    try:
                        rest_message = json_error_of(*rest_answer)[1]
                    except ValueError as e:
                        return False, "REST answer unusable: %s" % e
                    if rest_message != message:
                        return False, "MCP %r\nREST %r" % (message[:300], rest_message[:300])
                return True, "message: %s" % message[:180]
            want_code = int(c["mcp"])
            want_http = 400 if want_code == -32700 else 200
            ok = (status == want_http and isinstance(doc, dict) and doc.get("error", {}).get("code") == want_code
                  and "result" not in doc)
            return ok, "HTTP %r %r" % (status, data[:300])

        if c["mcp"] == "tool":
            want = "isError invalid_request" + (", same message as REST" if c["same_message"] else "")
        else:
            want = "JSON-RPC error %s%s" % (c["mcp"], " (HTTP 400)" if c["mcp"] == "-32700" else "")
        tap.check("bad input, MCP create_network, %s: %s" % (c["label"], want), mcp_side)

    # delete_network with bad names. Lookups do not validate names (the contract answers every
    # unknown network with not_found), so a bad name is simply not found; what matters is that
    # nothing is deleted and REST and MCP agree.
    for name in ("..", "Upper", "-lead", "x" * 64, "default ", "a.b", "a*", "a%00b"):
        shown = name if len(name) < 20 else name[:8] + "...(%d)" % len(name)
        want = 'not found: network "%s"' % name
        error_parity("delete_network %r" % shown, rest("DELETE", "/networks/" + quote_segment(name)), 404,
                     "not_found", want, mcp().call("delete_network", {"name": name}))
    for raw_path, want_message in (
        ("a%2Fb", "not found: no route DELETE /api/v1/networks/a/b"),
        ("a/b", "not found: no route DELETE /api/v1/networks/a/b"),
        ("%2e%2e", 'not found: network ".."'),
        ("a/", "not found: no route DELETE /api/v1/networks/a/"),
        ("a/..", "not found: no route DELETE /api/v1/networks/a/.."),
        ("%FF", "not found: no route DELETE /api/v1/networks/\ufffd"),
    ):
        tap.check("REST DELETE %s/networks/%s: 404 not_found %r" % (API, raw_path, want_message),
                  lambda p=raw_path, m=want_message: check_json_error(
                      *http_request(main["port"], "DELETE", API + "/networks/" + p), 404, "not_found", m))

    def rest_delete_huge():
        # The request line then exceeds libmicrohttpd's per-connection memory: it answers 414 itself.
        status, headers, data = http_request(main["port"], "DELETE", API + "/networks/" + "a" * KB100)
        healthy = http_request(main["port"], "GET", "/healthz")[0] == 200
        return status in (400, 404, 414) and healthy, "status %r body %r; healthy after: %r" % (status, data[:200],
                                                                                                 healthy)

    tap.check("REST DELETE with a 100 KB name: refused (414 from libmicrohttpd), daemon stays healthy", rest_delete_huge)

    for label, args, field in (
        ("name with NUL", {"name": "a\u0000b"}, "name"),
        ("name of 100 KB", {"name": "a" * KB100}, "name"),
        ("name of 1 MB", {"name": "a" * MB1}, "name"),
        ("name is a number", {"name": 1}, "name"),
        ("name is a boolean", {"name": False}, "name"),
        ("name is an array", {"name": ["a"]}, "name"),
        ("name is an object", {"name": {"a": "a"}}, "name"),
        ("name is null", {"name": None}, "name"),
        ("name missing", {}, "name"),
        ("unknown key next to a real name", {"name": "a", "force": True}, "force"),
    ):
        def mcp_delete_bad(args=args, field=field):
            code, message = tool_error(mcp().call("delete_network", args))
            return code == "invalid_request" and field in message, "%r %r" % (code, message[:300])

        tap.check("MCP delete_network, %s: isError invalid_request naming %r" % (label, field), mcp_delete_bad)

    def mcp_delete_args_not_object():
        status, _, doc = mcp().request("tools/call", {"name": "delete_network", "arguments": "a"})
        return status == 200 and doc.get("error", {}).get("code") == -32602, "%r %r" % (status, doc)

    tap.check("MCP delete_network with arguments \"a\" (not an object): -32602", mcp_delete_args_not_object)

    # Nothing of the above may have left a trace.
    after = snapshot_tree(state)
    tap.check("bad input: the state dir is unchanged (path, size, sha256 and mode of every entry)",
              lambda: (before == after and len(before) > 1, diff_snapshots(before, after) or "%d entries" % len(before)))
    tap.check("bad input: REST list_networks is byte-identical", lambda: (rest("GET", "/networks")[2] == list_before,
                                                                          None))
    tap.check("bad input: MCP list_networks is identical", lambda: (mcp().call("list_networks") == mcp_list_before,
                                                                    None))
    tap.check("bad input: the daemon is still running", lambda: (main["daemon"].proc.poll() is None, None))

    # A path with %00: libmicrohttpd decodes it to a NUL byte, which must not cut the name short.
    def nul_path_refused():
        status, headers, data = http_request(main["port"], "DELETE", API + "/networks/a%00b")
        return status in (400, 404), "status %r body %r" % (status, data[:300])

    def canary_alive():
        status, _, data = rest("GET", "/networks/a")
        return status == 200, "GET /networks/a: %r %r" % (status, data[:200])

    tap.check("REST DELETE %s/networks/a%%00b is refused (400 or 404), not 204" % API, nul_path_refused)
    tap.check("... and the network a survives it", canary_alive)
    if canary_alive()[0]:
        rest("DELETE", "/networks/a")


# ---------------------------------------------------------------------------------------------
# 4. order of checks, routing details, HEAD, the OpenAPI document


def parse_openapi_paths(doc):
    """{(method, path): operationId} of the paths section."""
    out, path, method, in_paths = {}, None, None, False
    for line in doc.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        s = line.strip()
        if indent == 0:
            in_paths = s == "paths:"
            continue
        if not in_paths:
            continue
        if indent == 2 and s.endswith(":"):
            path, method = s[:-1].strip("\"'"), None
        elif indent == 4 and s.endswith(":"):
            method = s[:-1]
            out[(method, path)] = None
        elif indent == 6 and s.startswith("operationId:") and method:
            out[(method, path)] = s.split(":", 1)[1].strip()
    return out


def parse_openapi_schemas(doc):
    """{schema: {"required": [...], "properties": {name: {type, ref, items, enum}}}} of the flow-style
    schemas under components.schemas (enough for Host and what it refers to)."""
    schemas, cur, in_props, in_schemas = {}, None, False, False
    for line in doc.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        s = line.strip()
        if indent == 2:
            in_schemas = s == "schemas:"
            continue
        if not in_schemas or indent < 4:
            continue
        if indent == 4 and s.endswith(":"):
            cur = schemas.setdefault(s[:-1], {"required": [], "properties": {}})
            in_props = False
        elif indent == 6 and cur is not None:
            in_props = s == "properties:"
            m = re.match(r"required:\s*\[(.*)\]$", s)
            if m:
                cur["required"] = [x.strip() for x in m.group(1).split(",") if x.strip()]
        elif indent == 8 and in_props and cur is not None:
            m = re.match(r"([A-Za-z0-9_]+):\s*(\{.*\})?$", s)
            if not m:
                continue
            flow = m.group(2) or ""
            prop = {}
            t = re.match(r"\{\s*type:\s*(\w+)", flow)
            if t:
                prop["type"] = t.group(1)
            r = re.search(r'\$ref:\s*"#/components/schemas/(\w+)"', flow)
            if r and not t:
                prop["ref"] = r.group(1)
            i = re.search(r"items:\s*\{\s*type:\s*(\w+)", flow)
            if i:
                prop["items"] = i.group(1)
            i = re.search(r'items:\s*\{\s*\$ref:\s*"#/components/schemas/(\w+)"', flow)
            if i:
                prop["items_ref"] = i.group(1)
            e = re.search(r"enum:\s*\[([^\]]*)\]", flow)
            if e:
                prop["enum"] = [x.strip() for x in e.group(1).split(",")]
            cur["properties"][m.group(1)] = prop
    return schemas


JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def validate(value, schema_name, schemas, where):
    """Problems of value against a parsed schema: required keys, types, enums, unknown keys."""
    schema = schemas[schema_name]
    problems = []
    if not isinstance(value, dict):
        return ["%s: not an object: %r" % (where, value)]
    for k in schema["required"]:
        if k not in value:
            problems.append("%s: required key %r missing" % (where, k))
    for k, v in value.items():
        prop = schema["properties"].get(k)
        if prop is None:
            problems.append("%s: key %r is not in the %s schema" % (where, k, schema_name))
            continue
        if "ref" in prop:
            problems += validate(v, prop["ref"], schemas, "%s.%s" % (where, k))
            continue
        t = prop.get("type")
        if t and not JSON_TYPES[t](v):
            problems.append("%s.%s: %r is not a JSON %s" % (where, k, v, t))
            continue
        if "enum" in prop and v not in prop["enum"]:
            problems.append("%s.%s: %r is not one of %r" % (where, k, v, prop["enum"]))
        if t == "array" and "items" in prop:
            bad = [x for x in v if not JSON_TYPES[prop["items"]](x)]
            if bad:
                problems.append("%s.%s: items %r are not %s" % (where, k, bad, prop["items"]))
    return problems


def raw_head(port, path):
    """HEAD over a raw socket (http.client would not notice a body): (status, headers, bytes after the head)."""
    data = raw_exchange(port, ("HEAD %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" % (path, HOST, port))
                        .encode())
    head, _, rest_bytes = data.partition(b"\r\n\r\n")
    lines = head.decode("iso-8859-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split(" ", 2)[1]), headers, rest_bytes


def test_check_order(work):
    port = main["port"]
    tap.check("check order: malformed body on POST /networks is 400 invalid_request, not 404",
              lambda: check_json_error(*rest("POST", "/networks", b"{nope"), 400, "invalid_request"))
    tap.check("check order: POST /networks for the existing default with a bad cidr is 400, not 409",
              lambda: check_json_error(*rest("POST", "/networks", {"name": "default", "cidr": "10.0.0.0/8"}), 400,
                                       "invalid_request"))
    tap.check("check order: POST /networks for the existing default with an unknown key is 400, not 409",
              lambda: check_json_error(*rest("POST", "/networks", {"name": "default", "cidr": "10.24.0.0/24",
                                                                     "bogus": 1}), 400, "invalid_request"))
    tap.check("check order: POST /networks for default with a malformed body is 400, not 409",
              lambda: check_json_error(*rest("POST", "/networks", b'{"name":"default",'), 400, "invalid_request"))
    tap.check("check order: PUT /networks with a malformed body is 404 (no route), not 400",
              lambda: check_json_error(*rest("PUT", "/networks", b"{nope"), 404, "not_found",
                                       "not found: no route PUT /api/v1/networks"))
    for method, path in (("GET", "/networks/"), ("POST", "/networks/"), ("DELETE", "/networks/default/"),
                         ("GET", "/networks/default/"), ("GET", "/host/"), ("GET", "/images/"), ("GET", "//networks"),
                         ("PUT", "/networks"), ("PATCH", "/networks/default"), ("POST", "/networks/default"),
                         ("DELETE", "/networks"), ("POST", "/host"), ("GET", "")):
        body = b'{"name":"x","cidr":"10.25.0.0/24"}' if method in ("POST", "PUT", "PATCH") else None
        want = "not found: no route %s %s%s" % (method, API, path)
        tap.check("%s %s%s: JSON 404 %r" % (method, API, path, want),
                  lambda m=method, p=path, b=body, w=want: check_json_error(*rest(m, p, b), 404, "not_found", w))
    tap.check("the trailing-slash POST created nothing",
              lambda: (rest("GET", "/networks/x")[0] == 404, None))

    for path in ("/host", "/images", "/networks", "/networks/default", "/openapi.yaml"):
        def head(path=path):
            status, headers, extra = raw_head(port, API + path)
            get_status, get_headers, get_body = http_request(port, "GET", API + path)
            ok = status == 200 and extra == b"" and content_type(headers) == content_type(get_headers)
            if "content-length" in headers:
                ok = ok and int(headers["content-length"]) == len(get_body)
            return ok, "HEAD %r %r, %d bytes after the head; GET %r, %d bytes" % (status, headers, len(extra),
                                                                                  get_status, len(get_body))

        tap.check("HEAD %s%s: 200, no body, GET's Content-Type (and length)" % (API, path), head)

    def head_404():
        status, headers, extra = raw_head(port, API + "/networks/nope")
        return status == 404 and extra == b"", "status %r, %d bytes after the head" % (status, len(extra))

    tap.check("HEAD %s/networks/nope: 404 without a body" % API, head_404)

    status, headers, doc_bytes = http_request(port, "GET", API + "/openapi.yaml")
    tap.check("GET %s/openapi.yaml: 200 application/yaml" % API,
              lambda: (status == 200 and content_type(headers) == "application/yaml" and len(doc_bytes) > 0,
                       "status %r content-type %r" % (status, headers.get("content-type"))))
    doc = doc_bytes.decode("utf-8", "replace")
    main["openapi"] = doc
    paths = parse_openapi_paths(doc)
    for tool, method, path in ROUTES + VM_ROUTES:
        tap.check("openapi.yaml documents %s %s as operationId %s" % (method, path, tool),
                  lambda m=method, p=path, t=tool: (paths.get((m.lower(), p)) == t,
                                                    "found %r" % paths.get((m.lower(), p))))
    tap.check("openapi.yaml documents no REST operation beyond the table (and /openapi.yaml)",
              lambda: (set(k for k, v in paths.items() if v) == set((m.lower(), p) for _, m, p in ROUTES + VM_ROUTES),
                       sorted(k for k, v in paths.items())))
    src = os.path.join(SOURCE_ROOT, "api", "openapi.yaml")
    if os.path.exists(src):
        with open(src, "rb") as f:
            want = f.read()
        tap.check("the served openapi.yaml is api/openapi.yaml of the source tree, byte for byte",
                  lambda: (doc_bytes == want, "%d bytes served, %d in %s" % (len(doc_bytes), len(want), src)))


# ---------------------------------------------------------------------------------------------
# 5. the limits the OpenAPI document states are the ones the daemon enforces


def parse_flow(text):
    """A YAML flow value of the document: {k: v, ...}, [a, ...], "double-quoted", integer or word."""
    pos = 0

    def ws():
        nonlocal pos
        while pos < len(text) and text[pos] in " \t":
            pos += 1

    def value(stop):
        nonlocal pos
        ws()
        c = text[pos]
        if c == "{":
            pos += 1
            out = {}
            while True:
                ws()
                if text[pos] == "}":
                    pos += 1
                    return out
                key = text[pos:text.index(":", pos)].strip()
                pos = text.index(":", pos) + 1
                out[key] = value(",}")
                ws()
                if text[pos] == ",":
                    pos += 1
        if c == "[":
            pos += 1
            out = []
            while True:
                ws()
                if text[pos] == "]":
                    pos += 1
                    return out
                out.append(value(",]"))
                ws()
                if text[pos] == ",":
                    pos += 1
        if c == '"':
            end = pos + 1
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            raw, pos = text[pos:end + 1], end + 1
            return json.loads(raw)
        end = pos
        while end < len(text) and text[end] not in stop:
            end += 1
        word, pos = text[pos:end].strip(), end
        return int(word) if re.fullmatch(r"-?[0-9]+", word) else word

    return value("")


def request_schema(doc, name):
    """{field: {keyword: value}} of a request schema's properties, flow or block style (the keys of a
    block; folded descriptions are skipped)."""
    props, in_schema, in_props, block = {}, False, False, None
    for line in doc.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        s = line.strip()
        if indent == 4:
            in_schema, in_props = s == name + ":", False
            continue
        if not in_schema:
            continue
        if indent == 6:
            in_props = s == "properties:"
            continue
        if not in_props:
            continue
        if indent == 8:
            key, _, rest = s.partition(":")
            rest = rest.strip()
            props[key] = parse_flow(rest) if rest.startswith("{") else {}
            block = None if rest else props[key]
        elif indent == 10 and block is not None:
            key, _, rest = s.partition(":")
            rest = rest.strip()
            if rest and rest[0] in '{["' or re.fullmatch(r"-?[0-9]+|[A-Za-z]+", rest or "-"):
                block[key] = parse_flow(rest)
    return props


def label_of(n):
    return ("a" * n)


def dns_of(n):
    """A valid DNS name of n characters, a trailing dot included (labels of 63)."""
    out = ""
    while len(out) + 64 < n:
        out += "a" * 63 + "."
    rest = n - len(out) - 1  # the trailing dot
    return out + "a" * rest + "." if rest >= 1 else ("a" * n)


# Per request field, a valid value of n characters and samples for its pattern; fields that are
# neither (cidr: the pattern bounds it) are probed with samples only.
STRING_VALUES = {
    ("create_vm", "name"): label_of, ("create_vm", "hostname"): label_of, ("create_vm", "image"): label_of,
    ("create_vm", "kubernetes_version"): label_of, ("create_vm", "network"): label_of,
    ("create_vm", "user_data"): None,  # Ignition JSON: its length limit is test-vm-spec's
    ("create_network", "name"): label_of, ("create_network", "dns_search_domain"): dns_of,
}
SAMPLES = {
    "label": ["a", "a-b", "0", "Upper", "-lead", "trail-", "a_b", "a.b", "a b", "caf\u00e9"],
    "cidr": ["10.78.0.0/24", "10.78.0.0/16", "10.78.0.0/29", "10.78.0.0/15", "10.78.0.0/30", "010.78.0.0/24",
             "10.78.0.256/24", "10.78.0.0/024", "10.78.0.0", "10.78.0/24", "::1/64"],
    "dns": ["lab.internal", "lab.internal.", "Example.COM", "a..b", "-x.com", "x-.com", "under_score.com", ".",
            "a b.com"],
}
SAMPLE_KIND = {"name": "label", "hostname": "label", "image": "label", "kubernetes_version": "label",
               "network": "label", "cidr": "cidr", "dns_search_domain": "dns"}
LIMIT_OPS = (("create_vm", "/vms", "CreateVMRequest", {"name": "lim"}),
             ("create_network", "/networks", "CreateNetworkRequest", {"name": "lim", "cidr": "10.79.0.0/24"}))


def field_refusal(op, path, base, field, value):
    """(problem, message): message None when the request gets past field's checks, else the message
    refusing it for field; problem when REST and MCP disagree. A network a probe created is deleted
    before the other surface is asked."""
    body = dict(base)
    body[field] = value
    status, headers, data = rest("POST", path, body)
    if status == 201:
        rest("DELETE", "/networks/" + body["name"])
    result = mcp().call(op, body)
    if not result.get("isError") and op == "create_network":
        rest("DELETE", "/networks/" + body["name"])
    try:
        rest_side = json_error_of(status, headers, data) if status >= 400 else (None, None)
        mcp_side = tool_error(result) if result.get("isError") else (None, None)
    except ValueError as e:
        return "%s (REST %r)" % (e, status), None
    if rest_side != mcp_side:
        return "REST %r and MCP %r differ" % (rest_side, mcp_side), None
    code, message = rest_side
    if status != 400 or code != "invalid_request":
        return None, None
    # what comes after the request's checks: the image directory, the host's memory, the length of
    # the state directory in a socket path
    if re.search(r"not found|more than this host has|socket path", message):
        return None, None
    if re.search(r"(^|[^a-z_])%s([^a-z_]|$)" % re.escape(field), message):
        return None, message
    return None, None


def test_limits(work):
    doc = main.get("openapi") or http_request(main["port"], "GET", API + "/openapi.yaml")[2].decode()
    vms_before, nets_before = rest("GET", "/vms")[2], rest("GET", "/networks")[2]
    for op, path, schema_name, base in LIMIT_OPS:
        schema = request_schema(doc, schema_name)
        tap.check("openapi.yaml has %s with properties" % schema_name, lambda: (len(schema) > 2, schema))
        for field, sch in schema.items():
            t = sch.get("type")
            probes = []  # (value, refused?, why)
            if t == "integer":
                lo, hi = sch.get("minimum"), sch.get("maximum")
                if lo is not None:
                    probes += [(lo - 1, True, "below minimum %d" % lo), (lo, False, "the minimum")]
                    if lo > 0:
                        probes.append((0, True, "0, below minimum %d" % lo))
                else:
                    probes.append((-(2 ** 31), False, "no minimum stated"))
                if hi is not None:
                    probes += [(hi, False, "the maximum"), (hi + 1, True, "above maximum %d" % hi)]
                else:
                    probes.append((2 ** 53, False, "no maximum stated"))
            elif t == "string" and "enum" not in sch:
                make = STRING_VALUES.get((op, field))
                pattern = sch.get("pattern")
                lo = sch.get("minLength", 0)
                if make is not None or field in SAMPLE_KIND:
                    empty_ok = lo == 0 and (pattern is None or re.fullmatch(pattern, ""))
                    probes.append(("", not empty_ok, "the empty string (minLength %d)" % lo))
                if make is not None:
                    hi = sch.get("maxLength")
                    if hi is not None:
                        probes += [(make(hi), False, "maxLength %d" % hi), (make(hi + 1), True, "maxLength+1")]
                    else:
                        probes.append((make(300), False, "no maxLength stated (300 characters)"))
                for v in SAMPLES.get(SAMPLE_KIND.get(field), []):
                    ok = pattern is None or re.fullmatch(pattern, v) is not None
                    probes.append((v, not ok, "pattern %s" % ("matches" if ok else "does not match")))
            elif t == "string" and "enum" in sch:
                for v in sch["enum"]:
                    probes.append((v, False, "in the enum"))
                probes += [("", True, "not in the enum"), ("bogus", True, "not in the enum")]
            for value, want_refused, why in probes:
                shown = value if not isinstance(value, str) or len(value) < 24 else "%s...(%d)" % (value[:8], len(value))

                def probe(field=field, value=value, want_refused=want_refused):
                    problem, message = field_refusal(op, path, base, field, value)
                    if problem:
                        return False, problem
                    return (message is not None) == want_refused, "message: %r" % message

                tap.check("%s %s %r (%s): %s as openapi.yaml says" % (
                    op, field, shown, why, "refused naming the field" if want_refused else "accepted"), probe)
    tap.check("limits: list_vms and list_networks are as before the probes",
              lambda: ((rest("GET", "/vms")[2], rest("GET", "/networks")[2]) == (vms_before, nets_before), None))


# ---------------------------------------------------------------------------------------------
# 6. the MCP transport


def open_stream(port, session, extra_headers=""):
    """Opens the GET stream; returns (socket, status, headers, body bytes so far)."""
    s = socket.create_connection((HOST, port), timeout=5)
    s.sendall(("GET /mcp HTTP/1.1\r\nHost: %s:%d\r\nAccept: text/event-stream\r\nMcp-Session-Id: %s\r\n%s\r\n"
               % (HOST, port, session, extra_headers)).encode())
    data = bytearray()
    deadline = time.monotonic() + 5
    while b": stream open" not in data and time.monotonic() < deadline:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("iso-8859-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    status = int(lines[0].split(" ", 2)[1]) if lines and lines[0].startswith("HTTP/") else None
    return s, status, headers, body


def wait_stream_end(s, already, timeout=2.5):
    """Reads until the chunked body ends (0-length chunk) or EOF; returns (how, seconds, bytes)."""
    start = time.monotonic()
    data = bytearray(already)
    s.settimeout(0.1)
    while time.monotonic() - start < timeout:
        try:
            chunk = s.recv(4096)
        except socket.timeout:
            continue
        except OSError as e:
            return "error %r" % e, time.monotonic() - start, bytes(data)
        if not chunk:
            return "eof", time.monotonic() - start, bytes(data)
        data += chunk
        if data.endswith(b"\r\n0\r\n\r\n") or data.startswith(b"0\r\n\r\n"):
            return "last-chunk", time.monotonic() - start, bytes(data)
    return "still open", time.monotonic() - start, bytes(data)


def test_mcp_protocol(work):
    port = main["port"]

    for version in MCP_VERSIONS + ["1999-01-01", "2026-07-28"]:
        want = version if version in MCP_VERSIONS else LATEST_VERSION

        def init(version=version, want=want):
            c = McpClient(port)
            status, headers, doc = c.request("initialize", {"protocolVersion": version, "capabilities": {}},
                                             session=False)
            got = doc.get("result", {}).get("protocolVersion") if isinstance(doc, dict) else None
            sid = headers.get("mcp-session-id", "")
            ok = status == 200 and got == want and re.fullmatch(r"[\x21-\x7e]{16,}", sid) is not None
            return ok, "HTTP %r version %r session %r" % (status, got, sid)

        tap.check("initialize with protocolVersion %s answers %s and an Mcp-Session-Id" % (version, want), init)

    status, headers, doc = McpClient(port).request("initialize", {"capabilities": {}}, session=False)
    init_result = doc["result"]
    tap.check("initialize without protocolVersion answers 2025-03-26 (the contract's default)",
              lambda: (init_result.get("protocolVersion") == "2025-03-26", init_result.get("protocolVersion")))
    tap.check("initialize: serverInfo.name vm-manager, capabilities.tools, instructions",
              lambda: (init_result.get("serverInfo", {}).get("name") == "vm-manager"
                       and "tools" in init_result.get("capabilities", {})
                       and isinstance(init_result.get("instructions"), str), json.dumps(init_result)[:400]))

    c = McpClient(port)
    c.initialize()
    sessions = set()
    for i in range(3):
        sessions.add(McpClient(port).request("initialize", {"protocolVersion": LATEST_VERSION},
                                             session=False)[1].get("mcp-session-id"))
    tap.check("each initialize mints a new session id", lambda: (len(sessions) == 3 and c.session not in sessions,
                                                                 sessions))

    def no_session_header_except_initialize():
        seen = []
        for method, params in (("ping", None), ("tools/list", None), ("tools/call", {"name": "get_info"}),
                               ("nope", None)):
            status, headers, _ = c.request(method, params)
            if "mcp-session-id" in headers:
                seen.append(method)
        status, headers, _ = c.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if "mcp-session-id" in headers:
            seen.append("notification")
        return not seen, "Mcp-Session-Id returned by %r" % seen

    tap.check("Mcp-Session-Id is returned only by initialize", no_session_header_except_initialize)

    def without_session():
        status, headers, doc = c.request("ping", session=False)
        return status == 400 and doc.get("error", {}).get("code") == -32600, "%r %r" % (status, doc)

    tap.check("a request without Mcp-Session-Id: HTTP 400, -32600", without_session)

    def unknown_session():
        status, headers, doc = c.request("ping", headers={"Mcp-Session-Id": "0" * 32})
        return status == 404 and doc.get("error", {}).get("code") == -32600, "%r %r" % (status, doc)

    tap.check("a request with an unknown Mcp-Session-Id: HTTP 404", unknown_session)

    def ping():
        status, headers, doc = c.request("ping")
        return status == 200 and doc.get("result") == {} and doc.get("jsonrpc") == "2.0", "%r %r" % (status, doc)

    tap.check("ping: result {}", ping)

    def string_id():
        status, headers, doc = c.post({"jsonrpc": "2.0", "id": "abc", "method": "ping"})
        return status == 200 and doc.get("id") == "abc" and doc.get("result") == {}, "%r %r" % (status, doc)

    tap.check("a string id is echoed", string_id)

    for label, msg in (("notification notifications/initialized", {"jsonrpc": "2.0", "method": "notifications/initialized"}),
                       ("notification notifications/cancelled",
                        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
                       ("client response (result)", {"jsonrpc": "2.0", "id": 77, "result": {}}),
                       ("client response (error)", {"jsonrpc": "2.0", "id": 78, "error": {"code": 1, "message": "x"}})):
        def accepted(msg=msg):
            status, headers, data = c.post_raw(json.dumps(msg))
            return status == 202 and data == b"", "%r %r" % (status, data)

        tap.check("%s: 202 with an empty body" % label, accepted)

    def rpc_error(msg_or_raw, want_code, want_http=200, **kw):
        def check():
            raw = msg_or_raw if isinstance(msg_or_raw, bytes) else json.dumps(msg_or_raw).encode()
            status, headers, data = c.post_raw(raw, **kw)
            doc = json.loads(data) if data else None
            ok = (status == want_http and isinstance(doc, dict) and doc.get("jsonrpc") == "2.0"
                  and doc.get("error", {}).get("code") == want_code and isinstance(doc["error"].get("message"), str)
                  and "result" not in doc)
            return ok, "HTTP %r %r" % (status, data[:300])
        return check

    tap.check("unknown method: -32601", rpc_error({"jsonrpc": "2.0", "id": 5, "method": "prompts/list"}, -32601))
    tap.check("tools/call of an unknown tool: -32602",
              rpc_error({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "nope"}}, -32602))
    tap.check("tools/call without a tool name: -32602",
              rpc_error({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {}}, -32602))
    # A string with a NUL inside is not its C prefix (the body parser keeps such strings whole).
    tap.check("tools/call of \"get_info\\u0000junk\": -32602, get_info does not run",
              rpc_error({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "get_info\0junk"}},
                        -32602))
    tap.check("method \"ping\\u0000x\": -32601", rpc_error({"jsonrpc": "2.0", "id": 6, "method": "ping\0x"}, -32601))
    tap.check("method \"\\u0000\": -32601", rpc_error({"jsonrpc": "2.0", "id": 6, "method": "\0"}, -32601))
    tap.check("jsonrpc \"2.0\\u0000\": -32600", rpc_error({"jsonrpc": "2.0\0", "id": 6, "method": "ping"}, -32600, 400))

    def version_with_nul():
        got = {}
        for v in ("2025-06-18\0x", "\0"):
            status, headers, doc = McpClient(port).request("initialize", {"protocolVersion": v}, session=False)
            got[v] = (status, (doc or {}).get("result", {}).get("protocolVersion"))
        return all(x == (200, LATEST_VERSION) for x in got.values()), repr(got)

    tap.check("initialize with protocolVersion \"2025-06-18\\u0000x\" or \"\\u0000\": a version it does not "
              "speak, so the newest (%s)" % LATEST_VERSION, version_with_nul)
    for args in ("x", [], 1, True):
        tap.check("tools/call with arguments %s (not an object): -32602" % json.dumps(args),
                  rpc_error({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                             "params": {"name": "list_networks", "arguments": args}}, -32602))
    tap.check("invalid JSON: HTTP 400, -32700", rpc_error(b'{"jsonrpc": "2.0", "id": 8, "method": "ping"', -32700, 400))
    tap.check("jsonrpc \"1.0\": -32600", rpc_error({"jsonrpc": "1.0", "id": 9, "method": "ping"}, -32600, 400))
    tap.check("no jsonrpc member: -32600", rpc_error({"id": 9, "method": "ping"}, -32600, 400))
    tap.check("a JSON array (batch): -32600", rpc_error([{"jsonrpc": "2.0", "id": 10, "method": "ping"}], -32600, 400))
    tap.check("id that is an object: -32600", rpc_error({"jsonrpc": "2.0", "id": {}, "method": "ping"}, -32600, 400))
    tap.check("Content-Type text/plain: HTTP 415",
              rpc_error({"jsonrpc": "2.0", "id": 11, "method": "ping"}, -32600, 415, content_type="text/plain"))
    tap.check("no Content-Type: HTTP 415",
              rpc_error({"jsonrpc": "2.0", "id": 11, "method": "ping"}, -32600, 415, content_type=None))

    def charset_ok():
        status, headers, data = c.post_raw(json.dumps({"jsonrpc": "2.0", "id": 12, "method": "ping"}),
                                           content_type="application/json; charset=utf-8")
        return status == 200 and json.loads(data).get("result") == {}, "%r %r" % (status, data[:200])

    tap.check("Content-Type application/json; charset=utf-8 is accepted", charset_ok)
    tap.check("unsupported MCP-Protocol-Version header: HTTP 400, -32022 (the code of 2026-07-28)",
              rpc_error({"jsonrpc": "2.0", "id": 13, "method": "ping"}, -32022, 400,
                        headers={"MCP-Protocol-Version": "1999-01-01"}))

    def unsupported_lists_versions():
        status, _, data = c.post_raw(json.dumps({"jsonrpc": "2.0", "id": 13, "method": "ping"}),
                                     headers={"MCP-Protocol-Version": "1999-01-01"})
        d = json.loads(data).get("error", {}).get("data", {})
        return (d.get("requested") == "1999-01-01" and "2026-07-28" in d.get("supported", [])
                and all(v in d.get("supported", []) for v in MCP_VERSIONS)), data[:300]

    tap.check("unsupported MCP-Protocol-Version header: error.data lists every revision served and echoes it",
              unsupported_lists_versions)

    def supported_header():
        ok = True
        for v in MCP_VERSIONS:
            status, _, doc = c.request("ping", headers={"MCP-Protocol-Version": v})
            ok = ok and status == 200 and doc.get("result") == {}
        return ok, None

    tap.check("every supported MCP-Protocol-Version header is accepted", supported_header)

    # tools/list and get_info
    status, headers, doc = c.request("tools/list")
    tools = doc["result"]["tools"]
    names = [t["name"] for t in tools]
    tap.check("tools/list: tools sorted by name", lambda: (names == sorted(names) and len(names) >= 8, names))

    def tool_shapes():
        problems = []
        for t in tools:
            s = t.get("inputSchema", {})
            if s.get("type") != "object" or not isinstance(s.get("properties"), dict) or not isinstance(
                    s.get("required"), list):
                problems.append("%s: inputSchema %r" % (t["name"], s))
            elif not set(s["required"]) <= set(s["properties"]):
                problems.append("%s: required %r not all in properties" % (t["name"], s["required"]))
            for p, ps in s.get("properties", {}).items():
                if not isinstance(ps, dict) or "type" not in ps or not isinstance(ps.get("description"), str):
                    problems.append("%s.%s: property schema %r" % (t["name"], p, ps))
            a = t.get("annotations", {})
            hints = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
            if set(a) != set(hints) or not all(isinstance(a[h], bool) for h in hints):
                problems.append("%s: annotations %r" % (t["name"], a))
                continue
            d = t.get("description", "")
            if a["readOnlyHint"]:
                want = "Read-only."
            elif a["destructiveHint"]:
                want = "WRITES (destructive):"
            else:
                want = "WRITES:"
            if not d.startswith(want):
                problems.append("%s: description %r does not start with %r" % (t["name"], d[:40], want))
            if a["readOnlyHint"] and a["destructiveHint"]:
                problems.append("%s: read-only and destructive" % t["name"])
        return not problems, "\n".join(problems)

    tap.check("tools/list: inputSchema {type object, properties, required}, four boolean annotations, "
              "description prefix matching the hints", tool_shapes)

    def expected_schemas():
        by = {t["name"]: t for t in tools}
        cn = by["create_network"]["inputSchema"]
        ok = (cn["required"] == ["name", "cidr"] and set(cn["properties"]) == {"name", "cidr", "dns_search_domain",
                                                                                   "enable_host_alias", "mtu"}
              and cn["properties"]["enable_host_alias"]["type"] == "boolean"
              and by["get_image"]["inputSchema"]["required"] == ["ref"]
              and by["delete_network"]["inputSchema"]["required"] == ["name"]
              and by["delete_network"]["annotations"]["destructiveHint"] is True
              and by["create_network"]["annotations"]["readOnlyHint"] is False
              and all(by[n]["annotations"]["readOnlyHint"] for n in ("get_host", "list_images", "get_image",
                                                                     "list_networks", "get_network", "get_info")))
        return ok, json.dumps({n: by[n]["inputSchema"] for n in ("create_network", "get_image")})[:600]

    tap.check("tools/list: the schemas and hints of the network and image tools", expected_schemas)

    info_text, info = tool_json(c.call("get_info"))

    def get_info():
        ok = (isinstance(info, dict) and info == info_text
              and all(isinstance(info.get(k), str) and info[k] for k in ("version", "commit", "built"))
              and isinstance(info.get("tools"), list))
        return ok, json.dumps(info)[:400]

    tap.check("get_info: structuredContent has version, commit, built (non-empty strings) and tools", get_info)

    def registration_order():
        listed = info["tools"]
        sub = [n for n in listed if n in REGISTRATION_ORDER]
        ok = sorted(listed) == sorted(names) and sub == REGISTRATION_ORDER and listed[0] == "get_info"
        return ok, "get_info.tools %r" % listed

    tap.check("get_info.tools: every listed tool, in registration order (get_info, get_host, ...)",
              registration_order)

    def instructions():
        text = init_result["instructions"]
        positions = {n: text.find(n) for n in names if text.find(n) >= 0}
        first = min(positions, key=positions.get) if positions else None
        return "get_host first" in text and first == "get_host", "first tool named: %r" % first

    tap.check("instructions: say 'get_host first' and name get_host before any other tool", instructions)

    # The GET stream and the end of a session. The session is ended on a keep-alive connection
    # that stays open, as a client with a connection pool does: a connection that closes right
    # after its answer would itself wake the daemon's loop and hide a lost wake-up.
    def stream_session(extra):
        s2 = McpClient(port)
        s2.initialize()
        sock, status, headers, body = open_stream(port, s2.session, extra)
        return s2, sock, status, headers, body

    def end_session(conn, session):
        conn.request("DELETE", "/mcp", headers={"Mcp-Session-Id": session})
        r = conn.getresponse()
        return r.status, r.read()

    s2, sock, status, headers, body = stream_session("")
    keep = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        tap.check("GET /mcp with Accept text/event-stream: 200 text/event-stream, ': stream open' first",
                  lambda: (status == 200 and content_type(headers) == "text/event-stream" and b": stream open" in body,
                           "status %r headers %r body %r" % (status, headers, body[:100])))
        time.sleep(0.3)
        sock.settimeout(0.2)
        try:
            early = sock.recv(4096)
            still_open = early != b"" and b"0\r\n\r\n" not in early
        except socket.timeout:
            early, still_open = b"", True
        tap.check("... the stream stays open", lambda: (still_open, "read %r" % early))
        d_status, d_body = end_session(keep, s2.session)
        tap.check("DELETE /mcp of the session: 204", lambda: (d_status == 204 and d_body == b"", (d_status, d_body)))
        how, took, data = wait_stream_end(sock, b"")
        tap.check("... and its open stream ends (last chunk) within 2.5 s, no other request in between",
                  lambda: (how in ("last-chunk", "eof"), "%s after %.2f s: %r" % (how, took, data[-60:])))
    finally:
        sock.close()

    s3, sock, status, headers, body = stream_session("Connection: close\r\n")
    try:
        d_status = end_session(keep, s3.session)[0]
        how, took, data = wait_stream_end(sock, b"", timeout=2.5)
        if how == "last-chunk":
            how, took2, data = wait_stream_end(sock, data, timeout=1.0)
            took += took2
        tap.check("a stream opened with Connection: close reaches EOF within 2.5 s of its session's DELETE",
                  lambda: (d_status == 204 and how == "eof", "DELETE %r; %s after %.2f s" % (d_status, how, took)))
    finally:
        sock.close()
        keep.close()

    def old_session_gone():
        p = s2.request("ping")[0]
        g = http_request(port, "GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": s2.session})[0]
        d = http_request(port, "DELETE", "/mcp", headers={"Mcp-Session-Id": s2.session})[0]
        return (p, g, d) == (404, 404, 404), "POST %r GET %r DELETE %r" % (p, g, d)

    tap.check("after DELETE the old session id is 404 for POST, GET and DELETE", old_session_gone)

    def get_needs_accept():
        a = http_request(port, "GET", "/mcp", headers={"Mcp-Session-Id": c.session})[0]
        b = http_request(port, "GET", "/mcp", headers={"Mcp-Session-Id": c.session, "Accept": "application/json"})[0]
        return (a, b) == (406, 406), "no Accept %r, Accept application/json %r" % (a, b)

    tap.check("GET /mcp without Accept text/event-stream: 406", get_needs_accept)
    tap.check("GET /mcp with Accept text/event-stream but no session: 400",
              lambda: (http_request(port, "GET", "/mcp", headers={"Accept": "text/event-stream"})[0] == 400, None))
    tap.check("DELETE /mcp without a session: 400", lambda: (http_request(port, "DELETE", "/mcp")[0] == 400, None))
    tap.check("PUT /mcp: 405 with Allow", lambda: (
        lambda r: (r[0] == 405 and "allow" in r[1], "%r %r" % (r[0], r[1])))(http_request(port, "PUT", "/mcp", b"")))

    ping_msg = json.dumps({"jsonrpc": "2.0", "id": 20, "method": "ping"})
    for label, extra, want in (
        ("Origin: http://evil.example", {"Origin": "http://evil.example"}, 403),
        ("Origin: http://localhost.evil.example", {"Origin": "http://localhost.evil.example"}, 403),
        ("Origin: null", {"Origin": "null"}, 403),
        ("Host: evil.example", {"Host": "evil.example"}, 403),
        ("Host: evil.example:%d" % port, {"Host": "evil.example:%d" % port}, 403),
        ("Host: 127.0.0.1.evil.example", {"Host": "127.0.0.1.evil.example"}, 403),
        ("Origin: http://localhost:%d" % port, {"Origin": "http://localhost:%d" % port}, 200),
        ("Origin: http://127.0.0.1:%d" % port, {"Origin": "http://127.0.0.1:%d" % port}, 200),
        ("Host: localhost:%d" % port, {"Host": "localhost:%d" % port}, 200),
    ):
        def guard(extra=extra, want=want):
            status, headers, data = c.post_raw(ping_msg, headers=extra)
            ok = status == want and (want != 200 or json.loads(data).get("result") == {})
            return ok, "%r %r" % (status, data[:200])

        tap.check("MCP %s: %d" % (label, want), guard)


# ---------------------------------------------------------------------------------------------
# 7. images


def test_images(work):
    port, img = main["port"], main["images"]
    base = os.path.join(img, "giantswarm-vm-base_1.0.0")
    with open(base + ".efi", "wb") as f:
        f.write(b"MZ uki")
    with open(base + ".raw", "wb") as f:
        f.write(b"\0" * 4096)
    kdir = os.path.join(img, "sysupdate", "kubernetes")
    os.makedirs(kdir)
    with open(os.path.join(kdir, "SHA256SUMS"), "w") as f:
        f.write("%s  kubernetes_1.31.4.raw\n%s *kubernetes_1.32.0.raw\n" % ("a" * 64, "b" * 64))

    want = {
        "id": "giantswarm-vm-base",
        "version": "1.0.0",
        "uki": base + ".efi",
        "disk": base + ".raw",
        "sysupdateDir": os.path.join(img, "sysupdate"),
        "kubernetesVersions": ["1.32.0", "1.31.4"],
    }
    start = time.monotonic()
    seen = None
    while time.monotonic() - start < 3.0:
        status, headers, data = rest("GET", "/images")
        seen = json.loads(data) if status == 200 else data
        if seen == [want]:
            break
        time.sleep(0.05)
    took = time.monotonic() - start
    tap.check("list_images shows the new image within 3 s, without a restart (kubernetesVersions newest first)",
              lambda: (seen == [want], "after %.2f s: %s" % (took, json.dumps(seen)[:800])))

    status, headers, data = rest("GET", "/images")
    parity_checks("list_images (one image)", "list_images", status, headers, data, 200, mcp().call("list_images"))
    for label, ref in (("bare id", "giantswarm-vm-base"), ("full ref", "giantswarm-vm-base_1.0.0")):
        status, headers, data = rest("GET", "/images/" + ref)
        parity_checks("get_image by %s" % label, "get_image", status, headers, data, 200,
                      mcp().call("get_image", {"ref": ref}))
        tap.check("get_image by %s is the image" % label, lambda d=data: (json.loads(d) == want, d[:400]))
    for ref in ("giantswarm-vm-base_9.9.9", "giantswarm-vm", "giantswarm-vm-base_", "_1.0.0"):
        error_parity("get_image %r" % ref, rest("GET", "/images/" + quote_segment(ref)), 404, "not_found",
                     'not found: image "%s"' % ref, mcp().call("get_image", {"ref": ref}))

    # An image build whose Kubernetes extension cannot run a node says so in manifest.json: that version
    # is set apart with the reason, and a create that asks for it is refused with the reason.
    manifest = os.path.join(img, "manifest.json")
    with open(manifest, "w") as f:
        json.dump({"kubernetes": {"version": "1.31.4", "node": False, "note": "no kubelet in this build"}}, f)
    try:
        seen = None
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            seen = json.loads(rest("GET", "/images")[2])
            if seen and seen[0].get("kubernetesVersions") == ["1.32.0"]:
                break
            time.sleep(0.05)
        unusable = (seen or [{}])[0].get("kubernetesUnusable") or []
        tap.check("list_images sets apart a version the build marks as no node, with the reason",
                  lambda: (seen[0].get("kubernetesVersions") == ["1.32.0"] and len(unusable) == 1
                           and unusable[0].get("version") == "1.31.4"
                           and unusable[0].get("reason", "").endswith("cannot run a Kubernetes node (no kubelet, "
                                                                      "kubeadm, crictl or container runtime in it); "
                                                                      "no kubelet in this build"),
                           json.dumps(seen)[:800]))
        body = {"name": "k8s-unusable", "image": "giantswarm-vm-base_1.0.0", "kubernetes_version": "1.31.4"}
        error_parity("create_vm with a Kubernetes version whose extension cannot run a node",
                     rest("POST", "/vms", body), 400, "invalid_request",
                     'invalid request: kubernetes version "1.31.4" of image giantswarm-vm-base_1.0.0 is not offered: its system '
                     "extension cannot run a Kubernetes node (no kubelet, kubeadm, crictl or container runtime in it); "
                     "no kubelet in this build (available: 1.32.0)",
                     mcp().call("create_vm", body))
        status, headers, data = rest("GET", "/vms")
        tap.check("the refused create left no VM behind",
                  lambda: (not any(v.get("name") == "k8s-unusable" for v in json.loads(data)), data[:400]))
    finally:
        os.unlink(manifest)


# ---------------------------------------------------------------------------------------------
# 8. host


def test_host(work):
    doc = main.get("openapi") or http_request(main["port"], "GET", API + "/openapi.yaml")[2].decode()
    schemas = parse_openapi_schemas(doc)
    status, headers, data = rest("GET", "/host")
    host = json.loads(data)
    tap.check("openapi.yaml has a Host schema with required keys and properties",
              lambda: ("Host" in schemas and len(schemas["Host"]["required"]) >= 10
                       and set(schemas["Host"]["required"]) <= set(schemas["Host"]["properties"]),
                       json.dumps(schemas.get("Host"))[:600]))

    def every_key():
        missing = [k for k in schemas["Host"]["required"] if k not in host]
        return not missing and status == 200, "missing %r; host keys %r" % (missing, list(host))

    tap.check("get_host has every required key of the Host schema", every_key)

    def types():
        problems = validate(host, "Host", schemas, "host")
        return not problems, "\n".join(problems)

    tap.check("get_host: every key has its schema's JSON type (Device, Tool, Firmware, Accelerator included), "
              "no key outside the schema", types)

    def ready():
        missing = host.get("missing")
        return isinstance(host.get("ready"), bool) and host["ready"] == (not missing), "ready %r missing %r" % (
            host.get("ready"), missing)

    tap.check("get_host: ready is a boolean and equals (missing is absent or empty)", ready)
    tap.check("get_host: missing, when present, is a non-empty array of strings",
              lambda: ("missing" not in host or (isinstance(host["missing"], list) and host["missing"]
                                                 and all(isinstance(m, str) for m in host["missing"])),
                       host.get("missing")))
    tap.check("get_host: accelerator.selected is kvm or tcg, requested is auto (the default)",
              lambda: (host["accelerator"]["selected"] in ("kvm", "tcg") and host["accelerator"]["requested"] == "auto",
                       host["accelerator"]))


# ---------------------------------------------------------------------------------------------
# 5. restart and crash


def test_restart(work):
    state = os.path.join(work, "r")
    d, port, ok, diag = start_daemon(work, "restart-1", state)
    tap.result(ok, "restart: first daemon starts", diag)
    if not ok:
        return
    c = McpClient(port)
    c.initialize()
    created = [
        rest("POST", "/networks", {"name": "r-one", "cidr": "10.30.0.0/24"}, port=port)[0],
        rest("POST", "/networks", {"name": "r-two", "cidr": "10.31.0.0/16", "dns_search_domain": "lab.internal."},
             port=port)[0],
        rest("POST", "/networks", {"name": "r-gone", "cidr": "10.33.0.0/24"}, port=port)[0],
        rest("DELETE", "/networks/r-gone", port=port)[0],
    ]
    three = c.call("create_network", {"name": "r-three", "cidr": "10.32.0.0/29", "dns_search_domain": None})
    tap.check("restart: create r-one, r-two (dns), r-gone (then deleted) via REST and r-three via MCP",
              lambda: (created == [201, 201, 201, 204] and not three.get("isError"), "%r %r" % (created, three)))
    before = rest("GET", "/networks", port=port)[2]
    each_before = {n: rest("GET", "/networks/" + n, port=port)[2] for n in ("default", "r-one", "r-two", "r-three")}
    stop_check(d, "restart: the first daemon")

    d, port, ok, diag = start_daemon(work, "restart-2", state)
    tap.result(ok, "restart: the daemon starts again on the same state dir", diag)
    if not ok:
        return
    after = rest("GET", "/networks", port=port)[2]
    tap.check("restart: list_networks is byte-identical", lambda: (after == before, "before %r\nafter %r" % (
        before[:600], after[:600])))
    tap.check("restart: get_network of each is byte-identical",
              lambda: (all(rest("GET", "/networks/" + n, port=port)[2] == b for n, b in each_before.items()), None))
    tap.check("restart: the deleted network stays deleted",
              lambda: (rest("GET", "/networks/r-gone", port=port)[0] == 404, None))
    stop_check(d, "restart: the second daemon")


def network_problems(n, expected):
    """Why n (a Network from list_networks) is not a complete network this test created."""
    try:
        name = n["spec"]["name"]
    except (KeyError, TypeError):
        return "not a network: %r" % n
    if name == "default":
        want_spec = {"name": "default", "cidr": "192.168.127.0/24", "enableIMDS": True, "mtu": 1500}
        want_gw = "192.168.127.1"
    elif name in expected:
        cidr, dns = expected[name]
        want_spec = {"name": name, "cidr": cidr, "enableIMDS": True, "mtu": 1500}
        if dns:
            want_spec["dnsSearchDomain"] = dns
        want_gw = cidr.rsplit(".", 1)[0] + ".1"
    else:
        return "network %r was never created by the test" % name
    want = {"spec": want_spec, "gateway": want_gw, "leases": []}
    return None if n == want else "%r is not the complete %r" % (n, want)


def test_crash(work):
    state = os.path.join(work, "c")
    seed = int(os.environ.get("VM_MANAGER_TEST_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    tap.diag("crash test seed %d (VM_MANAGER_TEST_SEED)" % seed)
    delays = [0.01, 0.03, 0.06, 0.1, 0.15]
    rng.shuffle(delays)
    delays = [x * rng.uniform(0.7, 1.3) for x in delays]
    expected, acked = {}, set()

    d, port, ok, diag = start_daemon(work, "crash-0", state)
    tap.result(ok, "crash: first daemon starts", diag)
    if not ok:
        return
    for rnd, delay in enumerate(delays):
        names = ["k%d-%d" % (rnd, i) for i in range(40)]
        for i, n in enumerate(names):
            expected[n] = ("10.%d.%d.0/24" % (100 + rnd, i), "k%d.example" % rnd if i % 2 else None)
        progress = {"sent": 0, "acked": 0, "other": []}

        def fire(port=port, names=names, progress=progress):
            conn = http.client.HTTPConnection(HOST, port, timeout=5)
            try:
                for n in names:
                    cidr, dns = expected[n]
                    body = {"name": n, "cidr": cidr}
                    if dns:
                        body["dns_search_domain"] = dns
                    progress["sent"] += 1
                    conn.request("POST", API + "/networks", body=json.dumps(body),
                                 headers={"Content-Type": "application/json"})
                    r = conn.getresponse()
                    data = r.read()
                    if r.status == 201:
                        acked.add(n)
                        progress["acked"] += 1
                    else:
                        progress["other"].append((n, r.status, data[:200]))
            except (OSError, http.client.HTTPException):
                pass  # the kill
            finally:
                conn.close()

        t = start_thread(fire)
        time.sleep(delay)
        d.proc.kill()
        d.proc.wait(timeout=10)
        t.join(10)
        label = "crash round %d (kill -9 after %.0f ms, %d sent, %d acknowledged)" % (
            rnd + 1, delay * 1000, progress["sent"], progress["acked"])
        tap.check("%s: every create before the kill succeeded" % label,
                  lambda p=progress: (not p["other"], "%r" % p["other"][:5]))
        leftovers = sorted(f for f in os.listdir(state) if f.startswith(".#"))

        d, port, ok, diag = start_daemon(work, "crash-%d" % (rnd + 1), state)
        tap.result(ok, "%s: the daemon starts again (networks.json loadable)" % label, diag)
        if not ok:
            return
        status, _, data = rest("GET", "/networks", port=port)

        def listed(status=status, data=data):
            nets = json.loads(data)
            problems = [p for p in (network_problems(n, expected) for n in nets) if p]
            names_listed = [n["spec"]["name"] for n in nets]
            if names_listed != sorted(names_listed):
                problems.append("not sorted by name: %r" % names_listed)
            return status == 200 and not problems, "\n".join(problems[:10])

        tap.check("%s: list_networks parses; only default and networks the test created, each complete" % label,
                  listed)

        def durable(data=data):
            names_listed = {n["spec"]["name"] for n in json.loads(data)}
            lost = sorted(acked - names_listed)
            return not lost, "acknowledged but lost: %r" % lost

        tap.check("%s: every acknowledged create survived the kill" % label, durable)

        def on_disk(data=data):
            with open(os.path.join(state, "networks.json")) as f:
                disk = json.load(f)
            disk_names = [n["name"] for n in disk["networks"]]
            return disk["version"] == 1 and disk_names == [n["spec"]["name"] for n in json.loads(data)], disk_names[:5]

        tap.check("%s: networks.json parses and lists the same networks" % label, on_disk)
        if leftovers:
            tap.diag("%s: temp files left by the kill: %r" % (label, leftovers))

    # What the daemon does with the temp files of an interrupted write: plant two (one garbage,
    # one a valid registry with an extra network) and restart.
    stop_check(d, "crash: the last daemon of the rounds")
    list_before = None
    with open(os.path.join(state, "networks.json")) as f:
        registry = json.load(f)
    ghost = dict(registry)
    ghost["networks"] = registry["networks"] + [{"name": "zz-ghost", "cidr": "10.250.0.0/24", "enableIMDS": True,
                                                 "enableHostAlias": False, "leases": []}]
    stale = [".#networks.json.00000000deadbeef", ".#networks.json.0123456789abcdef"]
    with open(os.path.join(state, stale[0]), "w") as f:
        f.write('{"version": 1, "netw')
    with open(os.path.join(state, stale[1]), "w") as f:
        json.dump(ghost, f)
    d, port, ok, diag = start_daemon(work, "crash-stale", state)
    tap.result(ok, "crash: the daemon starts with two stale networks.json temp files beside it", diag)
    if not ok:
        return
    list_before = [n["name"] for n in registry["networks"]]
    tap.check("crash: stale temp files are ignored (list_networks is networks.json, no zz-ghost)",
              lambda: ([n["spec"]["name"] for n in json.loads(rest("GET", "/networks", port=port)[2])] == list_before,
                       None))

    def cleaned():
        # A write after start-up must not trip over them either.
        status = rest("POST", "/networks", {"name": "k-after", "cidr": "10.251.0.0/24"}, port=port)[0]
        left = sorted(f for f in os.listdir(state) if f.startswith(".#"))
        return status == 201 and not left, "create %r; left: %r" % (status, left)

    tap.check("crash: no stale networks.json temp file remains after the restart (and a create works)", cleaned)
    stop_check(d, "crash: the daemon with stale temp files")


# ---------------------------------------------------------------------------------------------
# shutdown and sanitizers


def test_shutdown(work):
    d = main.get("daemon")
    if d:
        stop_check(d, "the main daemon")

    def sanitizer(kind):
        bad = ["%s: %s" % (d.name, line) for d in Daemon.all for line in d.sanitizer_lines()
               if ("LeakSanitizer" in line) == (kind == "leak")]
        return not bad, "\n".join(bad[:20])

    # Leaks show only in daemons that exit by themselves (SIGTERM), not in those killed with -9.
    tap.check("no AddressSanitizer/UBSan report in any daemon's stderr", sanitizer, "other")
    tap.check("no LeakSanitizer report in any daemon's stderr", sanitizer, "leak")


if __name__ == "__main__":
    sys.exit(run([setup_main, test_parity, test_errors, test_check_order, test_bad_input, test_limits, test_mcp_protocol,
                  test_images, test_host, test_restart, test_crash, test_shutdown], GLOBAL_DEADLINE, "vmm-api-"))
