#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""MCP answers that wait, on the wire: keep-alives on event streams and when a tools/call becomes
one. The daemon runs on the fakes of tests/integration/fakes (the installer exits 0, the installed
boot sends READY=1 after $FAKE_READY_AFTER seconds over the vhost-user vsock socket), with
--mcp-keepalive 1s so that the test takes seconds:

  * create_vm waiting for ready, without a progressToken, from a client whose Accept lists
    text/event-stream: an event stream from about a second on, a keep-alive comment whenever
    nothing else was sent for a second, the result as its last event;
  * the same with a progressToken: the notifications, with keep-alives between them;
  * the same for a VM whose answer is large (metadata of control characters, rendered off the loop):
    the result whole as the last event;
  * a client that accepts only JSON (or refuses the stream with q=0) gets one JSON answer, as
    does a call that finishes at once;
  * the session's GET stream carries keep-alives;
  * a client that leaves an event stream: the request ends within two keep-alives (the daemon
    logs it at debug level), and the VM still becomes ready;
  * SIGTERM: exit 0, no sanitizer report.
"""

import http.client
import json
import os
import signal
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (Daemon, HOST, McpClient, base_env, free_port, http_request, run, start_thread,  # noqa: E402
                     tap, tool_json, wait_state)

FAKES = os.path.join(here, "fakes")
READY_AFTER = 5  # seconds from the installed boot's start to READY=1
KEEPALIVE = 1.0  # --mcp-keepalive
STREAM_AFTER = 1.0  # MCP_STREAM_AFTER in src/mcp/mcp-server.c
SLACK = 1.5  # a busy 2-core machine running the ASan build
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False}
BOTH = "application/json, text/event-stream"
# 64 KiB of control characters: the answer renders to about 800 KB, on the HTTP server's worker
LARGE_METADATA = {"m%d" % i: "\x01" * 16000 for i in range(4)}


def start(work):
    images = os.path.join(work, "images")
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    vars_ = os.path.join(work, "vars")
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="install-exit:0", FAKE_READY_AFTER=str(READY_AFTER))
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, "stream", ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "state"),
                                "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                                "--launcher", "process", "--vsock", "vhost-user", "--log-level", "debug",
                                "--mcp-keepalive", "%ds" % KEEPALIVE], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "serving on the fakes with --mcp-keepalive %ds" % KEEPALIVE, why)
    return d, port


class Exchange:
    """One POST or GET read as it arrives: when the headers came, and each piece of the body with
    the time it came (seconds from the request)."""

    def __init__(self, port, method, headers, body=None, timeout=60, read_for=None, leave_after_headers=False):
        self.pieces = []
        self.status = self.ctype = None
        self.error = None
        t0 = time.monotonic()
        conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
        try:
            conn.request(method, "/mcp", body=body, headers=headers)
            resp = conn.getresponse()
            self.headers_at = time.monotonic() - t0
            self.status, self.ctype = resp.status, resp.getheader("Content-Type")
            if leave_after_headers:
                return
            while read_for is None or time.monotonic() - t0 < read_for:
                piece = resp.read1(65536)
                if not piece:
                    break
                self.pieces.append((time.monotonic() - t0, piece))
        except OSError as e:
            self.error = repr(e)
        finally:
            conn.close()
        self.ended_at = time.monotonic() - t0

    @property
    def text(self):
        return b"".join(p for _, p in self.pieces).decode("utf-8", "replace")

    def events(self):
        """The body as SSE: ([comment lines], [JSON-RPC messages]) in order."""
        comments, messages = [], []
        for block in self.text.split("\n\n"):
            for line in block.split("\n"):
                if line.startswith(":"):
                    comments.append(line)
                elif line.startswith("data: "):
                    messages.append(json.loads(line[6:]))
        return comments, messages

    def longest_silence(self):
        """The longest time without a byte, from the headers to the end of the body."""
        times = [self.headers_at] + [t for t, _ in self.pieces]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    def summary(self):
        return "HTTP %r %r, headers after %.2f s, %d pieces, longest silence %.2f s, error %r, body %r" % (
            self.status, self.ctype, self.headers_at if self.status else -1, len(self.pieces),
            self.longest_silence() if self.status else -1, self.error, self.text[-600:])


def tools_call(port, session, rid, name, arguments, accept=BOTH, token=None, **kw):
    params = {"name": name, "arguments": arguments}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    headers = {"Content-Type": "application/json", "Mcp-Session-Id": session}
    if accept is not None:
        headers["Accept"] = accept
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})
    return Exchange(port, "POST", headers, body, **kw)


def vm_of(message):
    result = message.get("result") or {}
    return tool_json(result)[0] if "content" in result and not result.get("isError") else {}


def test_streams(work):
    d, port = start(work)
    mcp = McpClient(port)
    mcp.initialize()
    session = mcp.session

    # The slow calls run side by side: each waits for its VM's READY=1.
    calls = {
        "sse": lambda: tools_call(port, session, 1, "create_vm", dict(CREATE, name="sse")),
        "progress": lambda: tools_call(port, session, 2, "create_vm", dict(CREATE, name="progress"), token="tok"),
        "large": lambda: tools_call(port, session, 8, "create_vm", dict(CREATE, name="large", metadata=LARGE_METADATA)),
        "json": lambda: tools_call(port, session, 3, "create_vm", dict(CREATE, name="json"),
                                   accept="application/json"),
        "q0": lambda: tools_call(port, session, 4, "create_vm", dict(CREATE, name="q0"),
                                 accept="text/event-stream;q=0, application/json"),
        "none": lambda: tools_call(port, session, 5, "create_vm", dict(CREATE, name="none"), accept=None),
    }
    got = {}

    def one(key):
        got[key] = calls[key]()

    threads = [start_thread(one, key) for key in calls]
    get = Exchange(port, "GET", {"Accept": "text/event-stream", "Mcp-Session-Id": session}, read_for=3.5)
    for t in threads:
        t.join(timeout=60)

    def sse_without_token():
        x = got["sse"]
        comments, messages = x.events()
        ok = (x.status == 200 and x.ctype == "text/event-stream"
              and STREAM_AFTER - 0.2 <= x.headers_at <= STREAM_AFTER + SLACK
              and len(messages) == 1 and messages[0].get("id") == 1 and vm_of(messages[0]).get("state") == "ready"
              and comments and set(comments) == {": keep-alive"} and len(comments) >= READY_AFTER - 1
              and x.longest_silence() <= KEEPALIVE + SLACK)
        return ok, x.summary()

    tap.check("tools/call create_vm (ready, no progressToken), Accept lists text/event-stream: an event stream "
              "after %.0f s, a keep-alive at least every %.0f s, the result (state ready) as its last event"
              % (STREAM_AFTER, KEEPALIVE), sse_without_token)

    def sse_with_token():
        x = got["progress"]
        comments, messages = x.events()
        notes = [m for m in messages if m.get("method") == "notifications/progress"]
        ok = (x.status == 200 and x.ctype == "text/event-stream" and len(notes) >= 2
              and messages[-1].get("id") == 2 and vm_of(messages[-1]).get("state") == "ready"
              and ": keep-alive" in comments and x.longest_silence() <= KEEPALIVE + SLACK)
        return ok, "%d notifications; %s" % (len(notes), x.summary())

    tap.check("... with a progressToken: notifications, keep-alives between them, the result last", sse_with_token)

    def sse_large():
        x = got["large"]
        comments, messages = x.events()
        vm = vm_of(messages[-1]) if messages else {}
        ok = (x.status == 200 and x.ctype == "text/event-stream" and messages[-1].get("id") == 8
              and vm.get("state") == "ready" and vm.get("metadata") == LARGE_METADATA
              and messages[-1]["result"]["structuredContent"] == vm)
        return ok, "%d bytes; %s" % (len(x.text), x.summary()[:400])

    tap.check("... a large result (rendered off the loop): whole, as the last event", sse_large)

    for key, label in (("json", "Accept application/json only"), ("q0", "Accept text/event-stream;q=0"),
                       ("none", "no Accept header")):
        def plain_json(key=key):
            x = got[key]
            try:
                doc = json.loads(x.text)
            except ValueError:
                doc = {}
            ok = (x.status == 200 and x.ctype == "application/json" and vm_of(doc).get("state") == "ready"
                  and x.headers_at >= READY_AFTER)
            return ok, x.summary()

        tap.check("... %s: one JSON answer at the end, as before" % label, plain_json)

    def quick_calls_stay_json():
        out = []
        for rid, name, args in ((6, "get_info", {}),
                                (7, "stop_vm", {"id": "00000000"})):  # asynchronous, answered at once
            x = tools_call(port, session, rid, name, args)
            out.append((name, x.status, x.ctype, x.headers_at))
        return all(s == 200 and c == "application/json" and t < STREAM_AFTER for _, s, c, t in out), repr(out)

    tap.check("calls that finish within %.0f s (get_info, an asynchronous stop_vm refused at once) keep a JSON answer"
              % STREAM_AFTER, quick_calls_stay_json)

    def get_stream():
        comments, _ = get.events()
        ok = (get.status == 200 and comments[:1] == [": stream open"] and comments.count(": keep-alive") >= 2
              and get.longest_silence() <= KEEPALIVE + SLACK)
        return ok, get.summary()

    tap.check("GET stream: ': stream open', then a keep-alive at least every %.0f s" % KEEPALIVE, get_stream)

    # A client that leaves a stream: its request ends, and the operation goes on.
    mark = len(d.stderr())
    gone = tools_call(port, session, 9, "create_vm", dict(CREATE, name="gone"), leave_after_headers=True)
    gone_at = time.monotonic()

    def client_left():
        deadline = gone_at + 2 * KEEPALIVE + 2 * SLACK
        line = "tools/call create_vm: the request ended before the answer"
        while time.monotonic() < deadline and line not in d.stderr()[mark:]:
            time.sleep(0.1)
        seen = line in d.stderr()[mark:]
        took = time.monotonic() - gone_at
        return (gone.status == 200 and gone.ctype == "text/event-stream" and seen,
                "headers %r %r; seen %r after %.1f s" % (gone.status, gone.ctype, seen, took))

    tap.check("a client that leaves the stream: the request ends within two keep-alives", client_left)

    def operation_goes_on():
        vms = {v["name"]: v for v in (json.loads(http_request(port, "GET", "/api/v1/vms")[2]) or [])}
        vm = wait_state(port, vms["gone"]["id"], ("ready",), READY_AFTER + 10) if "gone" in vms else None
        return (vm or {}).get("state") == "ready", repr(vm)[:300]

    tap.check("... and the VM it created still becomes ready", operation_goes_on)

    rc, took = d.stop(signal.SIGTERM, timeout=60)
    tap.result(rc == 0 and not d.sanitizer_lines(), "SIGTERM: exit 0 in %.1f s, no sanitizer report" % took,
               "exit %r %r" % (rc, d.sanitizer_lines()[:5]))


if __name__ == "__main__":
    sys.exit(run([test_streams], 150, "vmm-mcp-stream-"))
