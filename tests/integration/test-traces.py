#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""OpenTelemetry traces of `vm-manager serve`, received by a stand-in OTLP/HTTP collector (a
thread of this script that records every JSON body POSTed to /v1/traces):

  * with OTEL_EXPORTER_OTLP_ENDPOINT set: REST server spans named after the route template, the
    W3C traceparent honoured (sampled and unsampled), none for /healthz and /readyz; MCP's
    "POST /mcp" → "mcp.<method>" → "tool.<name>" with gen_ai.tool.name, error status for a failed
    tool, also an asynchronous one (create_vm against the fake QEMU of tests/integration/fakes,
    whose installer exits 3); the resource (service.name from OTEL_RESOURCE_ATTRIBUTES); the
    headers of OTEL_EXPORTER_OTLP_HEADERS;
  * what is queued at SIGTERM is sent before the exit;
  * without the variables: not a single connection to the collector;
  * a configuration that cannot work stops the daemon with exit status 1, naming the variable.
"""

import http.server
import json
import os
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import HOST, Daemon, McpClient, base_env, free_port, http_request, run, tap  # noqa: E402

FAKES = os.path.join(here, "fakes")
GLOBAL_DEADLINE = 150

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SAMPLED = "00-%s-%s-01" % (TRACE_ID, PARENT_ID)
UNSAMPLED = "00-%s-%s-00" % ("5bf92f3577b34da6a3ce929d0e0e4736", PARENT_ID)
SHUTDOWN = "00-%s-%s-01" % ("6bf92f3577b34da6a3ce929d0e0e4736", PARENT_ID)


class Collector:
    """An OTLP/HTTP receiver on 127.0.0.1: keeps (path, headers, body) of every POST and counts the
    connections it accepted."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = []
        self.connections = 0
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = None
                with collector.lock:
                    collector.requests.append(
                        (self.path, {k.lower(): v for k, v in self.headers.items()}, doc))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request, client_address):
                with collector.lock:
                    collector.connections += 1
                return True

        self.server = Server((HOST, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def spans(self):
        """[(resource attributes, span)] of every request so far."""
        out = []
        with self.lock:
            reqs = list(self.requests)
        for _, _, doc in reqs:
            for rs in (doc or {}).get("resourceSpans", []):
                res = attrs_of(rs.get("resource", {}))
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        out.append((res, s))
        return out

    def wait_for(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred([s for _, s in self.spans()]):
                return True
            time.sleep(0.1)
        return pred([s for _, s in self.spans()])


def attrs_of(obj):
    """{key: value} of an OTLP attribute list, ints as ints."""
    out = {}
    for a in obj.get("attributes", []):
        v = a.get("value", {})
        if "intValue" in v:
            out[a["key"]] = int(v["intValue"])
        elif "stringValue" in v:
            out[a["key"]] = v["stringValue"]
        else:
            out[a["key"]] = v
    return out


def names(spans):
    return sorted(s["name"] for s in spans)


def start_daemon(work, name, env_extra, expect_healthy=True):
    images = os.path.join(work, "images-" + name)
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    vars_ = os.path.join(work, "vars-" + name)
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="install-exit:3", **env_extra)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "s-" + name),
                            "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                            "--launcher", "process", "--log-level", "debug"], env=env)
    if expect_healthy:
        ok, why = d.wait_healthy(port, timeout=20)
        tap.result(ok, "%s: serving" % name, why)
    return d, port


def exercise(port):
    """The requests both daemons get: REST, health, MCP. Returns what the MCP tools answered."""
    out = {}
    out["host"] = http_request(port, "GET", "/api/v1/host", headers={"traceparent": SAMPLED})[0]
    out["host-unsampled"] = http_request(port, "GET", "/api/v1/host", headers={"traceparent": UNSAMPLED})[0]
    out["network-404"] = http_request(port, "GET", "/api/v1/networks/nope")[0]
    out["route-404"] = http_request(port, "GET", "/api/v1/nothing-here")[0]
    out["healthz"] = http_request(port, "GET", "/healthz")[0]
    out["readyz"] = http_request(port, "GET", "/readyz")[0]
    mcp = McpClient(port)
    mcp.initialize()
    out["tools/list"] = mcp.request("tools/list")[0]
    out["nosuch"] = mcp.request("nosuch/method")[0]
    out["get_host"] = mcp.call("get_host")
    out["list_vms"] = mcp.call("list_vms")
    out["get_vm"] = mcp.call("get_vm", {"id": "nope"})
    # asynchronous: answered when the installer (the fake QEMU) has exited 3
    out["create_vm"] = mcp.call("create_vm", {"name": "traced", "memory_mib": 512, "disk_gib": 1,
                                              "require_attestation": False, "wait_for": "installed"})
    return out


def only(spans, pred, what):
    found = [s for s in spans if pred(s)]
    if len(found) != 1:
        raise AssertionError("%d spans %s, want 1: %s" % (len(found), what, names(spans)))
    return found[0]


def test_traced(work):
    collector = Collector()
    try:
        d, port = start_daemon(work, "traced", {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://%s:%d/" % (HOST, collector.port),
            "OTEL_EXPORTER_OTLP_HEADERS": "x-test-token=s3cr%20t, x-other = 1",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=vmm-under-test,deployment.environment=test",
        })
        tap.result("Exporting traces to http://%s:%d/v1/traces" % (HOST, collector.port) in d.stderr(),
                   "the daemon says where traces go", d.stderr()[-1500:])

        out = exercise(port)
        tap.result(out["host"] == 200 and out["network-404"] == 404 and out["route-404"] == 404,
                   "REST answers as without tracing", repr(out)[:500])
        tap.result(out["create_vm"].get("isError") is True and "installer exited" in json.dumps(out["create_vm"]),
                   "create_vm fails asynchronously (the installer exits 3)", repr(out["create_vm"])[:500])

        want = {"GET /api/v1/host", "GET /api/v1/networks/{name}", "GET /api/v1", "POST /mcp", "mcp.initialize",
                "mcp.tools/list", "mcp.tools/call", "tool.get_host", "tool.list_vms", "tool.get_vm",
                "tool.create_vm", "mcp.unknown"}
        ok = collector.wait_for(lambda spans: want <= set(names(spans)))
        spans = [s for _, s in collector.spans()]
        tap.result(ok, "the collector receives the expected span names within 5 s",
                   "missing %s; got %s" % (sorted(want - set(names(spans))), names(spans)))
        by_id = {s["spanId"]: s for s in spans}

        def check_rest():
            s = only(spans, lambda s: s["name"] == "GET /api/v1/host" and s["traceId"] == TRACE_ID,
                     "GET /api/v1/host in the caller's trace")
            a = attrs_of(s)
            return (s["kind"] == 2 and s.get("parentSpanId") == PARENT_ID and a.get("http.request.method") == "GET"
                    and a.get("url.path") == "/api/v1/host" and a.get("http.response.status_code") == 200
                    and a.get("http.route") == "/api/v1/host" and "status" not in s), json.dumps(s)[:800]
        tap.check("REST: a server span in the traceparent's trace, its parent the caller's span", check_rest)

        def check_unknown_method():
            s = only(spans, lambda s: s["name"] == "mcp.unknown", "for the unknown method")
            a = attrs_of(s)
            return (a.get("mcp.method.name") == "nosuch/method" and "nosuch" not in " ".join(names(spans))
                    and (s.get("status") or {}).get("code") == 2), json.dumps(s)[:800]
        tap.check("MCP: a method the server does not know is span mcp.unknown (the name is an attribute)",
                  check_unknown_method)

        def check_unsampled():
            mine = [s for s in spans if s["traceId"] == UNSAMPLED[3:35]]
            return not mine, json.dumps(mine)[:500]
        tap.check("REST: nothing exported for an unsampled traceparent (parentbased_always_on)", check_unsampled)

        def check_404():
            s = only(spans, lambda s: s["name"] == "GET /api/v1/networks/{name}", "for the unknown network")
            u = only(spans, lambda s: s["name"] == "GET /api/v1", "for the unknown route")
            a, b = attrs_of(s), attrs_of(u)
            return (a.get("http.response.status_code") == 404 and a.get("url.path") == "/api/v1/networks/nope"
                    and b.get("http.response.status_code") == 404 and b.get("url.path") == "/api/v1/nothing-here"
                    and "http.route" not in b and "status" not in s and "status" not in u
                    and "parentSpanId" not in s), json.dumps([s, u])[:800]
        tap.check("REST: 404s are named by template (or the prefix), without error status", check_404)

        def check_health():
            bad = [s for s in spans if attrs_of(s).get("url.path") in ("/healthz", "/readyz")]
            return not bad, json.dumps(bad)[:300]
        tap.check("no spans for /healthz and /readyz", check_health)

        def check_mcp_tree():
            posts = [s for s in spans if s["name"] == "POST /mcp"]
            if not all(s["kind"] == 2 and attrs_of(s).get("http.response.status_code") in (200, 202)
                       for s in posts):
                return False, "POST /mcp spans: %s" % json.dumps(posts)[:800]
            calls = [s for s in spans if s["name"].startswith("mcp.")]
            for c in calls:
                p = by_id.get(c.get("parentSpanId"))
                if not p or p["name"] != "POST /mcp" or p["traceId"] != c["traceId"] or c["kind"] != 1:
                    return False, "%s: parent %s" % (c["name"], json.dumps(p)[:300])
            for tool in ("get_host", "list_vms", "get_vm", "create_vm"):
                t = only(spans, lambda s: s["name"] == "tool." + tool, "tool." + tool)
                c = by_id.get(t.get("parentSpanId"))
                if not c or c["name"] != "mcp.tools/call" or attrs_of(c).get("gen_ai.tool.name") != tool:
                    return False, "tool.%s: parent %s" % (tool, json.dumps(c)[:300])
                if attrs_of(t).get("gen_ai.tool.name") != tool:
                    return False, "tool.%s: %s" % (tool, json.dumps(t)[:300])
            return True, "%d POST /mcp, %d mcp.* spans" % (len(posts), len(calls))
        tap.check("MCP: POST /mcp (server) > mcp.<method> > tool.<name>, gen_ai.tool.name on both", check_mcp_tree)

        def check_tool_errors():
            ok_tool = only(spans, lambda s: s["name"] == "tool.get_host", "tool.get_host")
            bad = only(spans, lambda s: s["name"] == "tool.get_vm", "tool.get_vm")
            late = only(spans, lambda s: s["name"] == "tool.create_vm", "tool.create_vm")
            return ("status" not in ok_tool and bad.get("status", {}).get("code") == 2
                    and late.get("status", {}).get("code") == 2
                    and "installer exited" in late["status"].get("message", "")), json.dumps([bad, late])[:800]
        tap.check("MCP: failed tools (synchronous and asynchronous) carry error status", check_tool_errors)

        def check_async_timing():
            t = only(spans, lambda s: s["name"] == "tool.create_vm", "tool.create_vm")
            c = by_id[t["parentSpanId"]]
            p = by_id[c["parentSpanId"]]
            ts = [int(x[k]) for x in (t, c, p) for k in ("startTimeUnixNano", "endTimeUnixNano")]
            # the tool ends with its (late) result, inside the request, inside the POST
            return (ts[2] <= ts[0] <= ts[1] <= ts[3] <= ts[5] and ts[4] <= ts[2]
                    and attrs_of(p).get("http.response.status_code") == 200), repr(ts)
        tap.check("MCP: the asynchronous create_vm's spans end when its answer is produced", check_async_timing)

        def check_resource():
            res = [r for r, _ in collector.spans()]
            return bool(res) and all(r.get("service.name") == "vmm-under-test" and r.get("service.version")
                                     and r.get("deployment.environment") == "test" for r in res), repr(res[:1])
        tap.check("the resource: service.name from OTEL_RESOURCE_ATTRIBUTES, service.version, the rest", check_resource)

        def check_requests():
            with collector.lock:
                reqs = list(collector.requests)
            bad = [(p, h) for p, h, doc in reqs
                   if p != "/v1/traces" or h.get("x-test-token") != "s3cr t" or h.get("x-other") != "1"
                   or h.get("content-type") != "application/json" or doc is None]
            return bool(reqs) and not bad, "%d requests; bad: %r" % (len(reqs), bad[:2])
        tap.check("exports: POST /v1/traces, application/json, with the OTEL_EXPORTER_OTLP_HEADERS", check_requests)

        rc, took = d.stop()
        tap.result(rc == 0, "traced: exit 0 on SIGTERM", "exit %r after %.1f s; %s" % (rc, took, d.sanitizer_lines()[:3]))
    finally:
        collector.close()


def test_shutdown_flush(work):
    """Spans still queued at SIGTERM go out before the exit: with a schedule delay of a minute only
    the shutdown can have sent them."""
    collector = Collector()
    try:
        d, port = start_daemon(work, "shutdown", {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://%s:%d/v1/traces" % (HOST, collector.port),
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
        })
        http_request(port, "GET", "/api/v1/networks", headers={"traceparent": SHUTDOWN})
        time.sleep(0.5)
        tap.result(collector.connections == 0, "OTEL_BSP_SCHEDULE_DELAY=60000: nothing sent yet",
                   "%d connections" % collector.connections)
        rc, took = d.stop()
        tap.result(rc == 0, "shutdown: exit 0 on SIGTERM", "exit %r after %.1f s; %s" % (rc, took, d.sanitizer_lines()[:3]))
        spans = [s for _, s in collector.spans()]
        tap.result(any(s["traceId"] == SHUTDOWN[3:35] and s["name"] == "GET /api/v1/networks" for s in spans),
                   "the queued span is sent at shutdown", names(spans))
    finally:
        collector.close()


def test_untraced(work):
    collector = Collector()
    try:
        d, port = start_daemon(work, "untraced", {})
        out = exercise(port)
        tap.result(out["host"] == 200 and out["get_host"].get("isError") is not True,
                   "without OTEL_* variables: REST and MCP serve", repr(out)[:300])
        time.sleep(2.5)  # beyond the flush interval
        tap.result(collector.connections == 0, "without OTEL_* variables: no connection to the collector",
                   "%d connections" % collector.connections)
        tap.result("Exporting traces" not in d.stderr(), "without OTEL_* variables: nothing said about traces")
        rc, _ = d.stop()
        tap.result(rc == 0, "untraced: exit 0 on SIGTERM", "exit %r" % rc)
    finally:
        collector.close()


def test_bad_config(work):
    cases = [
        ("sampler", {"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        ("grpc", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ("timeout", {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "5s"}, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"),
    ]
    for name, extra, var in cases:
        extra = dict(extra, OTEL_EXPORTER_OTLP_ENDPOINT="http://%s:9" % HOST)
        d, _ = start_daemon(work, "bad-" + name, extra, expect_healthy=False)
        rc, _ = d.stop(sig=None, timeout=20)
        err = d.stderr()
        tap.result(rc == 1 and var in err and "level=error" in err,
                   "%s=%s: exit 1 naming the variable" % (var, list(extra.values())[0]), "exit %r; %s" % (rc, err[-600:]))

    # http/protobuf: served (we send JSON), with a warning
    d, port = start_daemon(work, "protobuf", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://%s:9" % HOST,
                                              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    err = d.stderr()
    tap.result("level=warning" in err and "http/protobuf" in err, "http/protobuf: a warning, and the daemon serves",
               err[-600:])
    rc, took = d.stop()
    # the collector is not there: the pending export costs at most the 2 s budget
    tap.result(rc == 0 and took < 8, "an unreachable collector does not hold up the exit", "exit %r after %.1f s" % (rc, took))


if __name__ == "__main__":
    sys.exit(run([test_traced, test_shutdown_flush, test_untraced, test_bad_config], GLOBAL_DEADLINE, "vmm-traces-"))
