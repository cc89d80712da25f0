#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The HTTP edge under hostile clients, against `vm-manager serve` with the fake QEMU of
tests/integration/fakes first on PATH and --launcher process (as test-vm-errors.py starts it):

  * the loopback guard on REST and /metrics: a foreign Origin or Host is 403 and changes nothing;
    it holds on [::1] and is off on 0.0.0.0;
  * REST writes with a body need Content-Type application/json (415 otherwise); DELETE and
    start/stop without a body need none;
  * HTTP/1.1 without Host is 400;
  * a NUL byte in the request head (Host, Origin, MCP-Protocol-Version, any header, the target, a
    keep-alive connection's second request, an IMDS request) is 400 invalid_request naming the
    header, and closed; so is a folded header line;
  * every oversized request (query arguments, target, headers, body) is answered and closed;
  * get_vm_console's lines outside 1..10000 is invalid_request, on REST and MCP;
  * 1,100 idle connections from one address, or 300 from each of six, leave /healthz, REST and
    MCP answering; a request sent a byte at a time is cut after --http-request-timeout;
  * bodies of 8 MiB (a million small JSON values, the costliest to parse) sent to REST and MCP at
    once: /healthz answers all the while, no event loop iteration parses or frees them, and the
    answers are what a small body gets (unknown field; a malformed body's parse error);
  * answers of several MB (list_vms of VMs whose metadata is control characters, rendered as
    exec_vm's binary output is) to REST and MCP at once: /healthz answers all the while, no event
    loop iteration renders them, and the bytes are what they were (MCP's text is REST's body);
  * SIGTERM with such connections open exits within the promised 15 s.

Standard library only; only loopback addresses are contacted.
"""

import json
import os
import re
import signal
import socket
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, here)
from vmmtest import (  # noqa: E402
    HOST,
    Daemon,
    McpClient,
    base_env,
    check_json_error,
    fake_image_dir,
    free_port,
    http_request,
    run,
    tap,
    tool_error,
)

GLOBAL_DEADLINE = 170  # seconds; meson allows 240
FAKES = os.path.join(here, "fakes")
ORIGIN_MESSAGE = 'invalid request: Origin "http://evil.example" is not a loopback origin, and this server listens on loopback only'
HOST_MESSAGE = 'invalid request: Host "%s" is not a loopback name, and this server listens on loopback only'
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False, "wait_for": "none"}


def start(work, name, listen=None, extra=()):
    images, vars_ = fake_image_dir(work, name)
    env = base_env(work)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, name, ["--listen", (listen or HOST + ":%d") % port, "--state-dir", os.path.join(work, "s-" + name),
                            "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                            "--launcher", "process", "--log-level", "debug", *extra], env=env)
    return d, port


def healthy(d, port, name):
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "%s: serving with the fake QEMU" % name, why)
    return ok


def raw(port, data, timeout=5, host=HOST, family=socket.AF_INET, source=None):
    """Sends data on a fresh socket and reads until EOF: (response bytes, closed by the server)."""
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        if source:
            s.bind((source, 0))
        s.connect(host if family == socket.AF_UNIX else (host, port))
        try:
            s.sendall(data)
        except OSError:
            pass  # the answer may come before the whole request went out
        out = bytearray()
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return bytes(out), False
            except ConnectionResetError:
                return bytes(out), True
            if not chunk:
                return bytes(out), True
            out += chunk
    finally:
        s.close()


def status_of(resp):
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def body_json(resp):
    head, _, body = resp.partition(b"\r\n\r\n")
    try:
        return json.loads(body)
    except ValueError:
        return None


def networks(port):
    status, _, data = http_request(port, "GET", "/api/v1/networks")
    return sorted(n["spec"]["name"] for n in json.loads(data)) if status == 200 else status


# ---------------------------------------------------------------------------------------------
# F4: the loopback guard and the media type on REST


def test_site_guard(work):
    d, port = start(work, "guard")
    if not healthy(d, port, "guard"):
        return
    evil = {"Origin": "http://evil.example"}
    body = json.dumps({"name": "csrf", "cidr": "10.98.0.0/24"}).encode()

    def cross_site_post():
        r = http_request(port, "POST", "/api/v1/networks", body=body,
                         headers=dict(evil, **{"Content-Type": "text/plain"}))
        ok, why = check_json_error(*r, 403, "invalid_request", ORIGIN_MESSAGE)
        return ok and networks(port) == ["default"], "%s; networks %r" % (why, networks(port))

    tap.check("REST POST with Origin: http://evil.example: 403 invalid_request, nothing created", cross_site_post)
    tap.check("... the same with Content-Type application/json: 403",
              lambda: check_json_error(*http_request(port, "POST", "/api/v1/networks", body=body,
                                                     headers=dict(evil, **{"Content-Type": "application/json"})),
                                       403, "invalid_request"))
    status, _, _ = http_request(port, "POST", "/api/v1/networks", body=body)
    tap.result(status == 201, "the same POST without the foreign Origin: 201", status)

    def cross_site_delete():
        r = http_request(port, "DELETE", "/api/v1/networks/csrf", headers=evil)
        ok, why = check_json_error(*r, 403, "invalid_request")
        return ok and "csrf" in networks(port), "%s; networks %r" % (why, networks(port))

    tap.check("REST DELETE with a foreign Origin: 403, the network stays", cross_site_delete)
    tap.check("REST GET with Host: evil.example:PORT (DNS rebinding): 403",
              lambda: check_json_error(*http_request(port, "GET", "/api/v1/networks",
                                                     headers={"Host": "evil.example:%d" % port}),
                                       403, "invalid_request", HOST_MESSAGE % ("evil.example:%d" % port)))
    tap.check("GET /metrics with a foreign Host: 403",
              lambda: (http_request(port, "GET", "/metrics", headers={"Host": "evil.example"})[0] == 403, None))
    for label, headers in (("Host: localhost:PORT", {"Host": "localhost:%d" % port}),
                           ("Origin: http://127.0.0.1:PORT", {"Origin": "http://127.0.0.1:%d" % port}),
                           ("Origin: http://localhost:3000", {"Origin": "http://localhost:3000"})):
        tap.check("REST GET with %s: 200" % label,
                  lambda h=headers: (http_request(port, "GET", "/api/v1/networks", headers=h)[0] == 200, None))
    status, _, _ = http_request(port, "DELETE", "/api/v1/networks/csrf", headers={})
    tap.result(status == 204, "DELETE without Origin and without Content-Type: 204", status)

    c = McpClient(port)
    status, _, _ = c.post_raw(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}), headers=evil, session=False)
    tap.result(status == 403, "MCP keeps its 403 for a foreign Origin (the same guard)", status)
    rc, took = d.stop(signal.SIGTERM, timeout=20)
    tap.result(rc == 0, "guard: SIGTERM, exit 0", "exit %r after %.1f s" % (rc, took))


def test_content_type(work):
    d, port = start(work, "ctype")
    if not healthy(d, port, "ctype"):
        return
    body = json.dumps({"name": "ct", "cidr": "10.97.0.0/24"}).encode()
    for label, ctype in (("text/plain", "text/plain"),
                         ("application/x-www-form-urlencoded (curl -d)", "application/x-www-form-urlencoded"),
                         ("multipart/form-data", "multipart/form-data; boundary=x"),
                         ("application/jsonp", "application/jsonp")):
        def wrong(ctype=ctype):
            ok, why = check_json_error(*http_request(port, "POST", "/api/v1/networks", body=body,
                                                     headers={"Content-Type": ctype}),
                                       415, "invalid_request",
                                       'invalid request: Content-Type: "%s" is not application/json' % ctype)
            return ok and networks(port) == ["default"], why

        tap.check("POST /networks with Content-Type %s: 415 invalid_request, nothing created" % label, wrong)

    def missing():
        # http.client adds no Content-Type by itself: an explicit empty header set
        ok, why = check_json_error(*http_request(port, "POST", "/api/v1/networks", body=body, headers={}),
                                   415, "invalid_request",
                                   "invalid request: Content-Type: missing, a body must be application/json")
        return ok and networks(port) == ["default"], why

    tap.check("POST /networks with a body and no Content-Type: 415", missing)
    tap.check("POST /networks with no body and no Content-Type: 415 (the route takes a body)",
              lambda: check_json_error(*http_request(port, "POST", "/api/v1/networks", body=b"", headers={}),
                                       415, "invalid_request"))
    status, _, data = http_request(port, "POST", "/api/v1/networks", body=body,
                                   headers={"Content-Type": "application/json; charset=utf-8"})
    tap.result(status == 201, "Content-Type: application/json; charset=utf-8: 201", "%r %r" % (status, data[:200]))

    status, _, data = http_request(port, "POST", "/api/v1/vms", body=json.dumps(dict(CREATE, name="ct")).encode())
    vm = json.loads(data) if status == 201 else {}
    tap.result(status == 201, "a VM on the fake QEMU (application/json): 201", "%r %r" % (status, data[:300]))
    if vm:
        for _ in range(100):
            if json.loads(http_request(port, "GET", "/api/v1/vms/" + vm["id"])[2]).get("state") in ("running", "ready"):
                break
            time.sleep(0.1)
        status, _, data = http_request(port, "POST", "/api/v1/vms/%s/stop" % vm["id"], headers={}, timeout=60)
        tap.result(status == 200, "POST /vms/{id}/stop without a body or Content-Type: 200", "%r %r" % (status, data[:300]))
        tap.check("POST /vms/{id}/start with a text/plain body: 415",
                  lambda: check_json_error(*http_request(port, "POST", "/api/v1/vms/%s/start" % vm["id"], body=b"x=1",
                                                         headers={"Content-Type": "text/plain"}),
                                           415, "invalid_request"))
        status, _, _ = http_request(port, "DELETE", "/api/v1/vms/" + vm["id"], headers={}, timeout=60)
        tap.result(status == 204, "DELETE /vms/{id} without Content-Type: 204", status)
    status, _, _ = http_request(port, "DELETE", "/api/v1/networks/ct", headers={})
    tap.result(status == 204, "DELETE /networks/{name} without Content-Type: 204", status)
    d.stop(signal.SIGTERM, timeout=30)


def test_listeners(work):
    """The guard follows the listener: on for [::1], off for 0.0.0.0 (names vary there)."""
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
        v6 = True
    except OSError:
        v6 = False
    if v6:
        d, port = start(work, "v6", listen="[::1]:%d")
        ok = False
        for _ in range(200):
            try:
                resp, _ = raw(port, b"GET /healthz HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n",
                              host="::1", family=socket.AF_INET6)
            except OSError:
                resp = b""
            if status_of(resp) == 200:
                ok = True
                break
            time.sleep(0.1)
        tap.result(ok, "--listen [::1]:PORT: serving", d.stderr()[-2000:])
        if ok:
            for host, want in (("[::1]:%d" % port, 200), ("localhost:%d" % port, 200), ("evil.example:%d" % port, 403),
                               ("[::2]:%d" % port, 403)):
                resp, _ = raw(port, ("GET /api/v1/networks HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host)
                              .encode(), host="::1", family=socket.AF_INET6)
                tap.result(status_of(resp) == want, "on [::1], REST with Host: %s: %d" % (host, want), resp[:300])
        d.stop(signal.SIGTERM, timeout=20)
    else:
        tap.skip("--listen [::1]:PORT", "no IPv6 loopback on this host")

    d, port = start(work, "any", listen="0.0.0.0:%d")
    if not healthy(d, port, "any (0.0.0.0)"):
        return
    status, _, _ = http_request(port, "GET", "/api/v1/networks",
                                headers={"Host": "vm-host.example:%d" % port, "Origin": "http://portal.example"})
    tap.result(status == 200, "on 0.0.0.0 the guard is off: a foreign Host and Origin get 200", status)
    tap.check("... and the media type is still required: text/plain POST is 415",
              lambda: check_json_error(*http_request(port, "POST", "/api/v1/networks", body=b"{}",
                                                     headers={"Content-Type": "text/plain"}), 415, "invalid_request"))
    d.stop(signal.SIGTERM, timeout=20)


# ---------------------------------------------------------------------------------------------
# F6, F5, F7: malformed and oversized requests, console lines


def test_requests(work):
    d, port = start(work, "req")
    if not healthy(d, port, "req"):
        return

    def no_host():
        resp, closed = raw(port, b"GET /api/v1/vms HTTP/1.1\r\n\r\n")
        err = body_json(resp) or {}
        ok = status_of(resp) == 400 and err.get("error", {}).get("code") == "invalid_request" and closed
        return ok and "Host" in err["error"]["message"], resp[:300]

    tap.check("HTTP/1.1 without Host: 400 invalid_request, connection closed", no_host)
    tap.check("HTTP/1.1 with two Host headers: 400",
              lambda: (lambda r: (status_of(r[0]) == 400, r[0][:200]))(
                  raw(port, b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n\r\n")))
    tap.check("HTTP/1.0 without Host: served (200)",
              lambda: (lambda r: (status_of(r[0]) == 200, r[0][:200]))(raw(port, b"GET /api/v1/vms HTTP/1.0\r\n\r\n")))

    def target(n_args, pad=0):
        q = "&".join("a%d=1" % i for i in range(n_args)) + "x" * pad
        return ("GET /api/v1/vms?%s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % q).encode()

    # 414 with our JSON envelope up to the size libmicrohttpd reads (about 30 KB); past it, its own.
    cases = [
        ("64 query arguments", target(64), 200, False),
        ("65 query arguments", target(65), 414, True),
        ("465 query arguments", target(465), 414, True),
        ("2000 query arguments", target(2000), 414, True),
        ("300 query arguments and 15 KB of headers",
         target(300)[:-2] + b"".join(b"X-%d: %s\r\n" % (i, b"y" * 100) for i in range(150)) + b"\r\n", 414, True),
        ("a 9 KB target", target(1, 9000), 414, True),
        ("a 40 KB target", target(1, 40000), 414, None),
        ("a 40 KB header", b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: " + b"a" * 40000 + b"\r\n\r\n",
         431, True),
        ("1000 headers", b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\n"
         + b"".join(b"X-%d: 1\r\n" % i for i in range(1000)) + b"\r\n", 431, True),
        ("a 2000-pair cookie", b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: "
         + b"; ".join(b"c%d=1" % i for i in range(2000)) + b"\r\n\r\n", 431, True),
        ("Content-Length: 9 MiB", b"POST /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\r\n"
         b"Content-Type: application/json\r\nContent-Length: 9437184\r\n\r\n{", 413, True),
    ]
    for label, data, want, closes in cases:
        def answered(data=data, want=want, closes=closes):
            t0 = time.monotonic()
            resp, closed = raw(port, data, timeout=5)
            took = time.monotonic() - t0
            ok = status_of(resp) == want and (closed or not closes) and took < 4
            if ok and want == 414 and closes is True:
                err = body_json(resp) or {}
                ok = err.get("error", {}).get("code") == "invalid_request" and b"Connection: close" in resp
            return ok, "%.1f s, closed %r: %r" % (took, closed, resp[:300])

        tap.check("%s: %d%s at once" % (label, want, " and closed" if closes else ""), answered)

    status, _, data = http_request(port, "POST", "/api/v1/vms", body=json.dumps(dict(CREATE, name="con")).encode())
    vm = json.loads(data) if status == 201 else {"id": "nope"}
    tap.result(status == 201, "a VM on the fake QEMU: 201", "%r %r" % (status, data[:300]))
    for lines in ("-1", "0", "10001", "99999999999"):
        tap.check("console?lines=%s: 400 invalid_request naming lines and 1..10000" % lines,
                  lambda lines=lines: check_json_error(
                      *http_request(port, "GET", "/api/v1/vms/%s/console?lines=%s" % (vm["id"], lines)), 400,
                      "invalid_request", "invalid request: lines: %s is out of range (1..10000)" % lines))
    tap.check("console?lines=-1 of an unknown VM: 400 before 404",
              lambda: check_json_error(*http_request(port, "GET", "/api/v1/vms/nope/console?lines=-1"), 400,
                                       "invalid_request"))
    for lines in ("1", "10000"):
        status, _, data = http_request(port, "GET", "/api/v1/vms/%s/console?lines=%s" % (vm["id"], lines))
        tap.result(status == 200 and json.loads(data)["lines"] == int(lines), "console?lines=%s: 200" % lines,
                   "%r %r" % (status, data[:200]))

    def mcp_lines():
        c = McpClient(port)
        c.initialize()
        code, message = tool_error(c.call("get_vm_console", {"id": vm["id"], "lines": -1}))
        return (code == "invalid_request" and message == "invalid request: lines: -1 is out of range (1..10000)",
                "%s %s" % (code, message))

    tap.check("MCP get_vm_console lines -1: the same invalid_request", mcp_lines)
    d.stop(signal.SIGTERM, timeout=30)


def responses(data):
    """The (status, JSON body or None) of each answer in data, in order."""
    out = []
    for part in re.split(rb"(?=^HTTP/1\.1 \d{3} )", data, flags=re.M):
        if part:
            out.append((status_of(part), body_json(part)))
    return out


def test_nul_bytes(work):
    d, port = start(work, "nul")
    if not healthy(d, port, "nul"):
        return
    # libmicrohttpd 0.9.75 reads a header line up to its first NUL and drops the rest: the site
    # guard would see "127.0.0.1" in "127.0.0.1\0evil.example". Every such request is refused whole.
    net = json.dumps({"name": "nul", "cidr": "10.97.0.0/24"}).encode()
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "t", "version": "1"}}}).encode()

    def post(path, extra, body, close=True):
        return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Type: application/json\r\n"
                b"Accept: application/json, text/event-stream\r\n%sContent-Length: %d\r\n\r\n%s"
                % (path, b"Connection: close\r\n" if close else b"", extra, len(body), body))

    get_ok = b"GET /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    cases = [
        ("Host on GET /api/v1/networks", "header Host contains a NUL byte",
         b"GET /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\0evil.example\r\nConnection: close\r\n\r\n"),
        ("Origin on GET /metrics", "header Origin contains a NUL byte",
         b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://127.0.0.1\0.evil.example\r\n"
         b"Connection: close\r\n\r\n"),
        ("MCP-Protocol-Version on POST /mcp", "header MCP-Protocol-Version contains a NUL byte",
         post(b"/mcp", b"MCP-Protocol-Version: 2025-06-18\0x\r\n", init)),
        ("X-Anything on POST /api/v1/networks", "header X-Anything contains a NUL byte",
         post(b"/api/v1/networks", b"X-Anything: a\0b\r\n", net)),
        ("a header value that is only a NUL", "header X-Anything contains a NUL byte",
         post(b"/api/v1/networks", b"X-Anything:\0 b\r\n", net)),
        ("a line that starts with one", "header Host contains a NUL byte",
         b"GET /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\r\n\0X: y\r\nConnection: close\r\n\r\n"),
        ("the request target", "request line contains a NUL byte",
         b"GET /api/v1/networks\0/../x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
        ("the second request of a keep-alive connection", "header X-Anything contains a NUL byte",
         get_ok + post(b"/api/v1/networks", b"X-Anything: a\0b\r\n", net, close=False)),
    ]
    for label, message, data in cases:
        def refused(data=data, message=message):
            resp, closed = raw(port, data)
            answers = responses(resp)
            want = [200, 400] if data.startswith(get_ok) else [400]
            last = answers[-1][1] if answers else None
            err = last.get("error", {}) if isinstance(last, dict) else {}
            ok = ([a[0] for a in answers] == want and closed and err.get("code") == "invalid_request"
                  and err.get("message") == "invalid request: " + message)
            return ok and networks(port) == ["default"], "%r; closed %r; networks %r" % (resp[:400], closed,
                                                                                         networks(port))

        tap.check("a NUL byte in %s: 400 invalid_request naming it, closed, nothing done" % label, refused)

    def served(data, want):
        resp, _ = raw(port, data)
        got = [a[0] for a in responses(resp)]
        return got == want, "%r: %r" % (got, resp[:300])

    def folded():
        resp, closed = raw(port, b"GET /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\r\nX-F: a\r\n b\r\n"
                                 b"Connection: close\r\n\r\n")
        err = (body_json(resp) or {}).get("error", {})
        # 0.9.75 appends the continuation to the name ("X-Fb"), so the message names that
        return (status_of(resp) == 400 and closed and err.get("code") == "invalid_request"
                and err.get("message", "").startswith("invalid request: header X-F")), resp[:300]

    tap.check("a folded header line (obs-fold): 400 invalid_request, closed", folded)
    tap.check("a NUL byte in a header name: 400 (libmicrohttpd's own: no colon before it), closed",
              lambda: (lambda r: (status_of(r[0]) == 400 and r[1], r[0][:200]))(
                  raw(port, b"GET /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\r\nX\0Y: z\r\n\r\n")))
    tap.check("two GETs on one keep-alive connection without a NUL: both 200",
              lambda: served(get_ok + get_ok.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"), [200, 200]))
    tap.check("the POST /api/v1/networks without the NUL: 201",
              lambda: served(post(b"/api/v1/networks", b"X-Anything: ab\r\nX-Empty:\r\n", net), [201]))
    tap.check("bare LF line ends and blanks around a value: 200",
              lambda: served(b"GET /api/v1/networks HTTP/1.1\nHost: \t127.0.0.1\nX-A:\t b \nConnection: close\n\n",
                             [200]))

    # A VM's IMDS listener: connections the daemon accepts itself and hands to the same server.
    status, _, data = http_request(port, "POST", "/api/v1/vms", body=json.dumps(dict(CREATE, name="nulvm")).encode())
    vm = json.loads(data) if status == 201 else {"id": "nope"}
    sock = os.path.join(work, "s-nul", "vms", vm["id"], "imds.sock")
    deadline = time.monotonic() + 30
    while not os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.05)
    tap.result(os.path.exists(sock), "a VM's IMDS listener stands", "%r %r" % (status, data[:200]))

    def imds(extra):
        head = b"GET /giantswarm/v1/hostname HTTP/1.1\r\nHost: 169.254.169.254%s\r\nConnection: close\r\n\r\n"
        return raw(0, head % extra, family=socket.AF_UNIX, host=sock)

    tap.check("IMDS: GET /hostname: 200 nulvm",
              lambda: (lambda r: (status_of(r[0]) == 200 and r[0].endswith(b"nulvm"), r[0][:300]))(imds(b"")))

    def imds_nul():
        resp, closed = imds(b"\0.evil.example")
        err = (body_json(resp) or {}).get("error", {})
        return (status_of(resp) == 400 and closed and err.get("code") == "invalid_request"
                and err.get("message") == "invalid request: header Host contains a NUL byte"), resp[:300]

    tap.check("IMDS: a NUL byte in Host: 400 invalid_request naming it, closed", imds_nul)
    d.stop(signal.SIGTERM, timeout=30)


# ---------------------------------------------------------------------------------------------
# F14, F5: connection floods, slow clients, shutdown


def probe_all(port):
    """/healthz, a REST list and an MCP ping on fresh connections: [(what, status or error)]."""
    out = []
    for what, data in (("/healthz", b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
                       ("GET /api/v1/vms", b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")):
        resp, _ = raw(port, data, timeout=3)
        out.append((what, status_of(resp)))
    try:
        status, _, _ = McpClient(port).request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                              "clientInfo": {"name": "flood", "version": "0"}},
                                               session=False)
        out.append(("MCP initialize", status))
    except OSError as e:
        out.append(("MCP initialize", repr(e)))
    return out


def open_idle(port, n, source):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.connect((HOST, port))
        socks.append(s)
    return socks


def still_open(socks):
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1):
                n += 1
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def test_floods(work):
    d, port = start(work, "flood")
    if not healthy(d, port, "flood"):
        return
    held = []
    try:
        held += open_idle(port, 1100, "127.0.0.1")
        time.sleep(0.5)
        for i in range(3):
            got = probe_all(port)
            tap.result(all(s == 200 for _, s in got),
                       "1,100 idle connections from 127.0.0.1: /healthz, REST and MCP answer (round %d)" % (i + 1), got)
        n = still_open(held)
        tap.result(n <= 256, "... that address holds at most --http-max-connections-per-peer (256) of them", n)
        for s in held:
            s.close()
        held = []

        per_source = {}
        for a in range(2, 8):
            per_source[a] = open_idle(port, 300, "127.0.0.%d" % a)
        time.sleep(0.5)
        got = probe_all(port)
        tap.result(all(s == 200 for _, s in got),
                   "300 idle connections from each of 127.0.0.2-7: /healthz, REST and MCP answer", got)
        counts = {a: still_open(socks) for a, socks in per_source.items()}
        tap.result(sum(counts.values()) < 1024 and max(counts.values()) - min(counts.values()) <= 2,
                   "... the 1,024 connections are shared evenly between the six", counts)
        for socks in per_source.values():
            for s in socks:
                s.close()
    finally:
        for s in held:
            s.close()
    d.stop(signal.SIGTERM, timeout=30)

    d, port = start(work, "slow", extra=("--http-request-timeout", "2s"))
    if not healthy(d, port, "slow (--http-request-timeout 2s)"):
        return

    def slowloris(head, body=b""):
        s = socket.create_connection((HOST, port), timeout=5)
        t0 = time.monotonic()
        try:
            s.sendall(head)
            data = body or b"X-Padding: " + b"a" * 200 + b"\r\n\r\n"
            for i in range(len(data)):
                try:
                    s.send(data[i:i + 1])
                except OSError:
                    return True, time.monotonic() - t0
                s.settimeout(0.1)
                try:
                    if s.recv(100) == b"":
                        return True, time.monotonic() - t0
                except socket.timeout:
                    pass
                except OSError:
                    return True, time.monotonic() - t0
            return False, time.monotonic() - t0
        finally:
            s.close()

    cut, took = slowloris(b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    tap.result(cut and took < 5, "headers sent a byte every 0.1 s: cut after the 2 s request timeout", "%.1f s" % took)
    cut, took = slowloris(b"POST /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 200\r\n\r\n", body=b" " * 200)
    tap.result(cut and took < 5, "a body sent a byte every 0.1 s: cut after the 2 s request timeout", "%.1f s" % took)
    idle = socket.create_connection((HOST, port), timeout=6)
    t0 = time.monotonic()
    gone = idle.recv(1) == b""
    took = time.monotonic() - t0
    idle.close()
    tap.result(gone and took < 5, "a connection that sends nothing: closed after the request timeout", "%.1f s" % took)
    got = probe_all(port)
    tap.result(all(s == 200 for _, s in got), "the daemon answers as before", got)
    d.stop(signal.SIGTERM, timeout=30)


BIG_BODY = 8 * 1024 * 1024 - 4096  # under the 8 MiB limit with the rest of the request


def junk_body(size, close=True):
    """A create_vm request of about size bytes whose bulk is a field create_vm does not know: an
    array of small objects, the slowest JSON to parse and to free for its size. close=False leaves
    the final brace out (malformed at the very end)."""
    head = '{"name":"big","memory_mib":512,"disk_gib":1,"junk":['
    n = (size - len(head) - 2) // 8
    return (head + ",".join(['{"k":1}'] * n) + "]" + ("}" if close else "")).encode()


def malformed_at(message):
    """(column, the text after it) of 'body: malformed JSON at line 1, column N: ...'."""
    prefix = "invalid request: body: malformed JSON at line 1, column "
    if not isinstance(message, str) or not message.startswith(prefix):
        return None
    column, _, rest = message[len(prefix):].partition(": ")
    return (int(column), rest) if column.isdigit() else None


def test_large_bodies(work):
    d, port = start(work, "bodies")
    if not healthy(d, port, "bodies"):
        return
    mcp = McpClient(port)
    mcp.initialize()
    big = junk_body(BIG_BODY)
    args = json.loads(big)
    mcp_big = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                          "params": {"name": "create_vm", "arguments": args}}, separators=(",", ":")).encode()
    del args
    answers = {}

    def post(name, send):
        try:
            answers[name] = (send(), time.monotonic())
        except OSError as e:
            answers[name] = ((repr(e), {}, b""), time.monotonic())

    senders = [threading.Thread(target=post, args=("rest-%d" % i, lambda: http_request(
                   port, "POST", "/api/v1/vms", body=big, timeout=120))) for i in range(2)]
    senders.append(threading.Thread(target=post, args=("mcp", lambda: http_request(
        port, "POST", "/mcp", body=mcp_big, timeout=120,
        headers={"Content-Type": "application/json", "Mcp-Session-Id": mcp.session}))))
    started = time.monotonic()
    for t in senders:
        t.start()
    probes = []
    while any(t.is_alive() for t in senders) and time.monotonic() - started < 120:
        t0 = time.monotonic()
        try:
            status = http_request(port, "GET", "/healthz", timeout=10)[0]
        except OSError as e:
            status = repr(e)
        probes.append((status, t0, time.monotonic() - t0))
        time.sleep(0.01)
    for t in senders:
        t.join()
    last = max(at for _, at in answers.values())
    during = [p for p in probes if p[1] < last]
    tap.result(len(during) >= 5 and all(p[0] == 200 for p in probes),
               "while three 8 MiB bodies are read and parsed, /healthz answers: %d probes, the slowest %.0f ms"
               % (len(during), 1000 * max((p[2] for p in during), default=0)),
               repr([p for p in probes if p[0] != 200][:5]))

    for name in ("rest-0", "rest-1"):
        status, headers, body = answers[name][0]
        ok, why = check_json_error(status, headers, body, 400, "invalid_request", 'invalid request: unknown field "junk"')
        tap.result(ok, "REST create_vm with an 8 MiB body (%s): 400, unknown field, as for a small one" % name, why)
    status, _, body = answers["mcp"][0]
    try:
        code, message = tool_error(json.loads(body)["result"])
    except (ValueError, KeyError, TypeError) as e:
        code, message = None, "%r: %r" % (e, body[:300])
    tap.result(status == 200 and code == "invalid_request" and message == 'invalid request: unknown field "junk"',
               "MCP tools/call create_vm with an 8 MiB body: the tool's invalid_request, unknown field",
               "HTTP %r: %r %r" % (status, code, message))

    # the loop neither parsed nor freed them: no slow iteration has jansson or our parser on its stack
    time.sleep(0.5)
    slow = [e for e in d.slow_loop_iterations()
            if any("json" in frame for frame in e.get("stack") or []) or "json" in (e.get("where") or "")]
    tap.result(not slow, "no event loop iteration over 50 ms parsed or freed a body",
               "\n".join("%.1f ms at %s" % (e.get("usec", 0) / 1000, e.get("where")) for e in slow))

    # a malformed body is refused in the same words, parsed on the loop (small) or off it (large)
    small = junk_body(4096, close=False)
    large = junk_body(BIG_BODY, close=False)
    got = []
    for b in (small, large):
        status, headers, body = http_request(port, "POST", "/api/v1/vms", body=b, timeout=120)
        ok, why = check_json_error(status, headers, body, 400, "invalid_request")
        got.append((ok, malformed_at(json.loads(body)["error"]["message"]) if ok else None, why))
    (ok_s, at_s, why_s), (ok_l, at_l, why_l) = got
    tap.result(ok_s and ok_l and at_s and at_l and at_s[1] == at_l[1] and at_s[0] - len(small) == at_l[0] - len(large),
               "REST: a malformed 8 MiB body gets the parse error a small one gets, at its own end",
               "%s / %s" % (why_s, why_l))
    status, _, body = http_request(port, "POST", "/mcp", body=large, timeout=120,
                                   headers={"Content-Type": "application/json", "Mcp-Session-Id": mcp.session})
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        err = {}
    tap.result(status == 400 and err.get("code") == -32700 and malformed_at(err.get("message")) == at_l,
               "MCP: the same malformed body is a JSON-RPC parse error (-32700) with the same words",
               "HTTP %r: %r" % (status, body[:300]))
    d.stop(signal.SIGTERM, timeout=30)


# Metadata at its limit (64 KiB of keys and values) of control characters, six bytes each escaped, as
# exec_vm's binary output is: a VM's record renders to about 380 KB, LARGE_VMS of them in list_vms to
# a few MB (REST), twice that on MCP (the text, escaped again, and structuredContent).
LARGE_VMS = 12
LARGE_METADATA = {"m%d" % i: "\x01" * 16000 for i in range(4)}


def test_large_answers(work):
    d, port = start(work, "answers")
    if not healthy(d, port, "answers"):
        return
    for i in range(LARGE_VMS):
        status, _, data = http_request(port, "POST", "/api/v1/vms", timeout=120, body=json.dumps(
            dict(CREATE, name="big-%d" % i, metadata=LARGE_METADATA)).encode())
        if status != 201:
            tap.result(False, "create_vm with 64 KiB of control characters in its metadata", "%r %r" % (status, data[:300]))
            return
    mcp = McpClient(port)
    mcp.initialize()
    answers = {}

    def rest(name):
        try:
            answers[name] = http_request(port, "GET", "/api/v1/vms", timeout=120)
        except OSError as e:
            answers[name] = (repr(e), {}, b"")

    def mcp_list(name):
        msg = {"jsonrpc": "2.0", "id": name, "method": "tools/call", "params": {"name": "list_vms"}}
        try:
            st, headers, data = http_request(port, "POST", "/mcp", body=json.dumps(msg).encode(), timeout=120,
                                             headers={"Content-Type": "application/json", "Mcp-Session-Id": mcp.session})
            answers[name] = (st, headers, json.loads(data))
        except (OSError, ValueError) as e:
            answers[name] = (repr(e), {}, None)

    # the first REST list renders the document (and caches it), every MCP list renders its own
    senders = [threading.Thread(target=rest, args=("rest",))]
    senders += [threading.Thread(target=mcp_list, args=("mcp-%d" % i,)) for i in range(3)]
    started = time.monotonic()
    for t in senders:
        t.start()
    probes = []
    while any(t.is_alive() for t in senders) and time.monotonic() - started < 120:
        t0 = time.monotonic()
        try:
            status = http_request(port, "GET", "/healthz", timeout=10)[0]
        except OSError as e:
            status = repr(e)
        probes.append((status, time.monotonic() - t0))
        time.sleep(0.01)
    for t in senders:
        t.join()
    took = time.monotonic() - started
    status, _, body = answers["rest"]
    size = len(body) if isinstance(body, bytes) else 0
    tap.result(len(probes) >= 5 and all(p[0] == 200 for p in probes),
               "while list_vms of %d VMs (%.1f MB on REST, about twice that on MCP) is rendered four times, /healthz "
               "answers: %d probes in %.1f s, the slowest %.0f ms"
               % (LARGE_VMS, size / 1e6, len(probes), took, 1000 * max((p[1] for p in probes), default=0)),
               repr([p for p in probes if p[0] != 200][:5]))

    # the same bytes as ever: MCP's text is REST's body without its newline, structuredContent the list
    texts = []
    for i in range(3):
        st, _, doc = answers["mcp-%d" % i]
        try:
            texts.append((st, doc["result"]["content"][0]["text"], doc["result"]["structuredContent"]))
        except (TypeError, KeyError, IndexError):
            texts.append((st, None, None))
    listed = json.loads(body) if status == 200 else []
    tap.result(status == 200 and len(listed) == LARGE_VMS
               and all(v.get("metadata") == LARGE_METADATA for v in listed)
               and all(st == 200 and text is not None and (text + "\n").encode() == body
                       and sc == {"vms": listed} for st, text, sc in texts),
               "the answers rendered off the loop are whole: REST's list has every VM's metadata, MCP's text is "
               "REST's body byte for byte", "REST %r (%d bytes); MCP %r" % (status, size, [
                   (st, len(text or ""), text[:100] if text else None) for st, text, _ in texts]))

    # the loop rendered none of them: no slow iteration has jansson or our JSON helpers on its stack
    time.sleep(0.5)
    slow = [e for e in d.slow_loop_iterations()
            if any("json" in frame for frame in e.get("stack") or []) or "json" in (e.get("where") or "")]
    tap.result(not slow, "no event loop iteration over 50 ms rendered an answer",
               "\n".join("%.1f ms at %s" % (e.get("usec", 0) / 1000, e.get("where")) for e in slow))
    d.stop(signal.SIGTERM, timeout=30)


def test_shutdown(work):
    d, port = start(work, "term")
    if not healthy(d, port, "term"):
        return
    socks = []
    for data in (b"GET /api/v1/vms?" + b"&".join(b"a%d=1" % i for i in range(2000)) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                 b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1",
                 b"POST /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{",
                 b""):
        s = socket.create_connection((HOST, port), timeout=5)
        if data:
            s.sendall(data)
        socks.append(s)
    time.sleep(0.5)
    rc, took = d.stop(signal.SIGTERM, timeout=60)
    for s in socks:
        s.close()
    tap.result(rc == 0 and took < 16.5,
               "SIGTERM with an oversized, a slow, a half-sent and an idle connection: exit 0 within the promised 15 s",
               "exit %r after %.1f s" % (rc, took))


if __name__ == "__main__":
    sys.exit(run([test_site_guard, test_content_type, test_listeners, test_requests, test_nul_bytes, test_floods, test_large_bodies,
                  test_large_answers, test_shutdown],
                 GLOBAL_DEADLINE, "vmm-http-"))
