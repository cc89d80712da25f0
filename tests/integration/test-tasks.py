#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Durable tasks (issue 37): the MCP Tasks extension (io.modelcontextprotocol/tasks, revision
2026-07-28, raw JSON-RPC over HTTP) and REST's operation resources (Prefer: respond-async,
/api/v1/operations), one set of records under <state-dir>/tasks, on the fake QEMU of
tests/integration/fakes with the process launcher:

  * a create_vm from a client declaring the extension answers a task at once, whose record is on
    disk before the answer; tasks/get follows the VM's state and, at the end, inlines the result
    the blocking call returns;
  * the daemon is killed (SIGKILL) while the task works, and the next one answers tasks/get from the
    record and the VM's state then (the plain-process launcher cannot keep a VM across a restart,
    so the create ends failed, with the restart named); a task that ended before a graceful restart
    reads the same after it;
  * tasks/cancel of a create before ready deletes the VM and the task reads cancelled; of an ended
    task it is acknowledged and changes nothing; of a stop it is refused (invalid params, data.code
    conflict);
  * REST: Prefer: respond-async answers 202 with Location and the operation; GET follows it; DELETE
    cancels a create (200, cancelled, the VM gone) and refuses an ended one (409 conflict); GET
    /operations lists; MCP and REST read the same record;
  * following a task without polling: subscriptions/listen with params.notifications.taskIds
    acknowledges the tasks that exist (not an unknown id; none for a client without the extension),
    sends where each stands at once, then notifications/tasks as its VM moves (the status message
    names the state) and one when it ends, with the result inlined and the subscription's id in
    _meta; a listen for a task that ended already hears it once;
  * bad input: an unknown task id (-32602, data.code not_found; REST 404 not_found), a missing or
    non-string taskId (-32602), the task methods without the extension (-32021), a task-augmented
    call with bad arguments answers the tool's own error at once and records nothing; a client
    without the extension gets the blocking call unchanged.
"""

import json
import os
import signal
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, EventStream, HOST, base_env, free_port, http_request, run, tap  # noqa: E402

FAKES = os.path.join(here, "fakes")
VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False}


def api(port, method, path, body=None, headers=None, timeout=60):
    h = dict(headers or {})
    if body is not None:
        h["Content-Type"] = "application/json"
    status, hdrs, out = http_request(port, method, "/api/v1" + path,
                                     body=json.dumps(body).encode() if body is not None else None,
                                     headers=h, timeout=timeout)
    try:
        return status, hdrs, (json.loads(out) if out else None)
    except ValueError:
        return status, hdrs, out


class Mcp:
    """Stateless 2026-07-28 requests: the envelope in params._meta, the standard headers."""

    def __init__(self, port, tasks=True):
        self.port, self.tasks, self.next_id = port, tasks, 1

    def request(self, method, params=None, name=None, tasks=None):
        params = dict(params or {})
        caps = {"extensions": {TASKS: {}}} if (self.tasks if tasks is None else tasks) else {}
        params["_meta"] = {"io.modelcontextprotocol/protocolVersion": VERSION,
                           "io.modelcontextprotocol/clientCapabilities": caps,
                           "io.modelcontextprotocol/clientInfo": {"name": "test-tasks", "version": "0"}}
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.next_id += 1
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": VERSION, "Mcp-Method": method}
        if name is not None:
            headers["Mcp-Name"] = name
        start = time.monotonic()
        status, _, body = http_request(self.port, "POST", "/mcp", body=json.dumps(msg).encode(), headers=headers,
                                       timeout=120)
        self.took = time.monotonic() - start
        return status, json.loads(body) if body else None

    def call(self, tool, arguments, tasks=None):
        return self.request("tools/call", {"name": tool, "arguments": arguments}, name=tool, tasks=tasks)

    def get(self, task_id):
        return self.request("tasks/get", {"taskId": task_id}, name=task_id)

    def cancel(self, task_id):
        return self.request("tasks/cancel", {"taskId": task_id}, name=task_id)

    def wait(self, task_id, timeout=60, until=("completed", "failed", "cancelled")):
        deadline, seen = time.monotonic() + timeout, []
        while time.monotonic() < deadline:
            status, doc = self.get(task_id)
            res = (doc or {}).get("result") or {}
            if res.get("statusMessage") and (not seen or seen[-1] != res["statusMessage"]):
                seen.append(res["statusMessage"])
            if res.get("status") in until:
                return res, seen
            time.sleep(0.2)
        return res, seen


class Env:
    def __init__(self, work, name, ready_after):
        self.work, self.name = work, name
        self.state = os.path.join(work, "s-" + name)
        self.images = os.path.join(work, "images-" + name)
        self.firmware = os.path.join(work, "vars-" + name)
        os.makedirs(self.images)
        for path in (os.path.join(self.images, "fake_1.0.efi"), os.path.join(self.images, "fake_1.0.raw"),
                     self.firmware):
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)
        self.env = base_env(work, FAKE_QEMU="install-exit:0", FAKE_READY_AFTER=str(ready_after),
                            PATH=FAKES + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
        self.port, self.d, self.runs = free_port(), None, 0

    def start(self):
        self.runs += 1
        self.d = Daemon(self.work, "%s-%d" % (self.name, self.runs),
                        ["--listen", "%s:%d" % (HOST, self.port), "--state-dir", self.state, "--image-dir",
                         self.images, "--ovmf-code", self.firmware, "--ovmf-vars", self.firmware, "--launcher",
                         "process", "--vsock", "vhost-user", "--log-level", "debug"], env=self.env)
        return self.d.wait_healthy(self.port, timeout=20)

    def records(self):
        d = os.path.join(self.state, "tasks")
        return sorted(n[:-5] for n in os.listdir(d) if n.endswith(".json")) if os.path.isdir(d) else []

    def record(self, task_id):
        with open(os.path.join(self.state, "tasks", task_id + ".json")) as f:
            return json.load(f)


def err(doc):
    return (doc or {}).get("error") or {}


def test_mcp(work):
    e = Env(work, "mcp", ready_after=3)
    ok, why = e.start()
    if not tap.result(ok, "daemon on fakes starts", why):
        return
    m = Mcp(e.port)
    status, doc = m.request("server/discover")
    caps = ((doc or {}).get("result") or {}).get("capabilities") or {}
    tap.result(status == 200 and TASKS in (caps.get("extensions") or {}),
               "server/discover advertises %s under capabilities.extensions" % TASKS, repr(doc)[:400])
    api(e.port, "POST", "/networks", {"name": "tn", "cidr": "10.79.0.0/24"})

    # a task at once, durable before the answer
    status, doc = m.call("create_vm", dict(CREATE, name="t1", network="tn"))
    res = (doc or {}).get("result") or {}
    tid = res.get("taskId")
    tap.result(status == 200 and res.get("resultType") == "task" and res.get("status") == "working" and
               isinstance(res.get("ttlMs"), int) and isinstance(res.get("pollIntervalMs"), int) and
               res.get("createdAt", "")[:2] == "20" and "content" not in res and m.took < 2,
               "create_vm with the extension: a CreateTaskResult at once (%.3f s)" % m.took, repr(doc)[:500])
    if not tid:
        return
    tap.result(tid in e.records() and e.record(tid)["status"] == "working" and e.record(tid)["operation"] == "create_vm",
               "... its record is on disk when the answer comes", repr(e.records()))
    final, seen = m.wait(tid)
    sc = ((final.get("result") or {}).get("structuredContent")) or {}
    tap.result(final.get("status") == "completed" and sc.get("state") == "ready" and sc.get("name") == "t1" and
               not final["result"].get("isError") and final.get("resultType") == "complete",
               "tasks/get: completed, the result inlined as the blocking call returns it (state ready)",
               repr(final)[:600])
    tap.result(any("is booting" in s or "is installing" in s or "is creating" in s for s in seen),
               "tasks/get reported the VM's states on the way: %s" % " -> ".join(s.split(" is ")[-1] for s in seen),
               repr(seen))
    vm_id = sc.get("id")

    # the extension's rules for an ended task, and refusals
    status, doc = m.cancel(tid)
    tap.result(status == 200 and (doc or {}).get("result", {}).get("resultType") == "complete" and
               m.get(tid)[1]["result"]["status"] == "completed",
               "tasks/cancel of an ended task: acknowledged, and it stays completed", repr(doc)[:300])
    status, doc = m.get("0" * 32)
    tap.result(status == 200 and err(doc).get("code") == -32602 and err(doc).get("data", {}).get("code") == "not_found",
               "tasks/get of an unknown task: -32602, data.code not_found", repr(doc)[:300])
    status, doc = m.cancel("nope")
    tap.result(err(doc).get("code") == -32602 and err(doc).get("data", {}).get("code") == "not_found",
               "tasks/cancel of an unknown task: -32602, data.code not_found", repr(doc)[:300])
    status, doc = m.request("tasks/get", {})
    tap.result(err(doc).get("code") == -32602, "tasks/get without taskId: -32602", repr(doc)[:300])
    status, doc = m.request("tasks/get", {"taskId": 7})
    tap.result(err(doc).get("code") == -32602, "tasks/get with a number for taskId: -32602", repr(doc)[:300])
    status, doc = m.request("tasks/get", {"taskId": tid}, name=tid, tasks=False)
    tap.result(err(doc).get("code") == -32021 and
               TASKS in err(doc).get("data", {}).get("requiredCapabilities", {}).get("extensions", {}),
               "tasks/get without the extension declared: -32021 naming it", repr(doc)[:300])
    status, doc = m.request("tasks/update", {"taskId": tid, "inputResponses": {}}, name=tid)
    tap.result(status == 200 and (doc or {}).get("result", {}).get("resultType") == "complete",
               "tasks/update: acknowledged (no task of this server waits for input)", repr(doc)[:300])
    status, doc = m.request("tasks/list", {})
    tap.result(err(doc).get("code") == -32601, "tasks/list (removed by the extension): -32601", repr(doc)[:300])

    n = len(e.records())
    status, doc = m.call("create_vm", dict(CREATE, name="Bad Name"))
    res = (doc or {}).get("result") or {}
    tap.result(res.get("isError") and res.get("resultType") == "complete" and "taskId" not in res and
               res.get("structuredContent", {}).get("error", {}).get("code") == "invalid_request" and
               len(e.records()) == n,
               "a task-augmented call with bad arguments: the tool's error at once, nothing recorded", repr(doc)[:400])
    status, doc = m.call("start_vm", {"id": "nosuchvm"})
    res = (doc or {}).get("result") or {}
    tap.result(res.get("isError") and res.get("structuredContent", {}).get("error", {}).get("code") == "not_found",
               "start_vm of an unknown VM as a task: not_found at once", repr(doc)[:400])

    # a stop cannot be taken back
    status, doc = m.call("stop_vm", {"id": vm_id})
    sid = ((doc or {}).get("result") or {}).get("taskId")
    status, doc = m.cancel(sid)
    # the fake guest powers off at once: the stop may have ended before the cancel came, which the
    # extension acknowledges without a change (checked above); while it works, it is refused
    ended = (doc or {}).get("result", {}).get("resultType") == "complete" and \
        m.get(sid)[1]["result"]["status"] == "completed"
    tap.result(ended or (err(doc).get("code") == -32602 and err(doc).get("data", {}).get("code") == "conflict"),
               "tasks/cancel of a stop_vm: refused while it works, data.code conflict (%s)" % (
                   "it had ended: acknowledged, still completed" if ended else "refused"), repr(doc)[:300])
    final, _ = m.wait(sid)
    tap.result(final.get("status") == "completed" and final["result"]["structuredContent"].get("state") == "stopped",
               "stop_vm as a task: completed, the VM stopped", repr(final)[:300])

    # cancel a create before ready: the VM is deleted
    status, doc = m.call("create_vm", dict(CREATE, name="t2", network="tn"))
    cid = ((doc or {}).get("result") or {}).get("taskId")
    time.sleep(1)
    status, doc = m.cancel(cid)
    tap.result(status == 200 and (doc or {}).get("result", {}).get("resultType") == "complete",
               "tasks/cancel of a create before ready: acknowledged", repr(doc)[:300])
    res = m.get(cid)[1]["result"]
    tap.result(res.get("status") == "cancelled" and e.record(cid)["status"] == "cancelled",
               "... the task reads cancelled, and its record says so", repr(res)[:300])
    deadline, names = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        names = [v["name"] for v in api(e.port, "GET", "/vms")[2]]
        if "t2" not in names:
            break
        time.sleep(0.2)
    tap.result("t2" not in names, "... and the VM is gone", repr(names))

    # a client without the extension gets the blocking call
    status, doc = m.call("delete_vm", {"id": vm_id}, tasks=False)
    res = (doc or {}).get("result") or {}
    tap.result(res.get("structuredContent", {}).get("deleted") is True and "taskId" not in res,
               "without the extension, delete_vm blocks and answers its result as before", repr(doc)[:300])

    # the cost of a task-augmented call against a plain one (start_vm of a VM with nothing to do)
    status, _, vm = api(e.port, "POST", "/vms", dict(CREATE, name="t3", network="tn", wait_for="none"))
    final = None
    m.wait  # noqa
    times_plain, times_task = [], []
    for _ in range(5):
        api(e.port, "POST", "/vms/%s/stop" % vm["id"])
    for i in range(10):
        m.call("get_vm", {"id": vm["id"]}, tasks=False)
        times_plain.append(m.took)
    for i in range(10):
        m.call("stop_vm", {"id": vm["id"]}, tasks=False)
        times_plain.append(m.took)
    times_plain = times_plain[10:]
    for i in range(10):
        m.call("stop_vm", {"id": vm["id"]})
        times_task.append(m.took)
    tap.diag("stop_vm of a stopped VM, median of 10: plain %.1f ms, as a task %.1f ms (the record written and "
             "fsynced before the answer)" % (sorted(times_plain)[5] * 1000, sorted(times_task)[5] * 1000))
    e.d.stop()


def test_restart(work):
    e = Env(work, "restart", ready_after=8)
    ok, why = e.start()
    if not tap.result(ok, "daemon on fakes starts", why):
        return
    m = Mcp(e.port)
    # one task ends before a graceful restart
    status, doc = m.call("create_vm", dict(CREATE, name="r1", wait_for="none"))
    done_id = ((doc or {}).get("result") or {}).get("taskId")
    before, _ = m.wait(done_id)
    # another works when the daemon is killed
    status, doc = m.call("create_vm", dict(CREATE, name="r2"))
    tid = ((doc or {}).get("result") or {}).get("taskId")
    time.sleep(1.5)
    res = m.get(tid)[1]["result"]
    tap.result(res.get("status") == "working", "a create task works (%s)" % res.get("statusMessage"), repr(res)[:300])
    e.d.stop(signal.SIGKILL)
    ok, why = e.start()
    if not tap.result(ok, "the daemon starts again after SIGKILL", why):
        return
    res = m.get(tid)[1].get("result") or {}
    sc = (res.get("result") or {}).get("structuredContent") or {}
    tap.result(res.get("status") == "completed" and res["result"].get("isError") and
               sc.get("error", {}).get("code") == "vm_failed" and "restarted" in sc["error"].get("message", ""),
               "tasks/get after the restart: the task ended with the VM (failed: the restart interrupted it)",
               repr(res)[:600])
    # judged when read: the record follows through the file writer, not before that answer
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and e.record(tid)["status"] != "failed":
        time.sleep(0.1)
    tap.result(e.record(tid)["status"] == "failed", "... and its record now says so", repr(e.record(tid))[:300])
    after = m.get(done_id)[1].get("result") or {}
    tap.result(after.get("status") == "completed" and after.get("result") == before.get("result") and
               after.get("createdAt") == before.get("createdAt"),
               "a task that ended before the restart reads the same after it", repr(after)[:300])
    status, _, op = api(e.port, "GET", "/operations/" + tid)
    tap.result(status == 200 and op.get("status") == "failed" and op.get("error", {}).get("code") == "vm_failed",
               "REST reads the same record: GET /operations/{id}", repr(op)[:300])
    e.d.stop()


def test_rest(work):
    e = Env(work, "rest", ready_after=3)
    ok, why = e.start()
    if not tap.result(ok, "daemon on fakes starts", why):
        return
    t0 = time.monotonic()
    status, hdrs, op = api(e.port, "POST", "/vms", dict(CREATE, name="o1"), headers={"Prefer": "respond-async"})
    took = time.monotonic() - t0
    oid = (op or {}).get("id")
    tap.result(status == 202 and hdrs.get("location") == "/api/v1/operations/%s" % oid and
               hdrs.get("preference-applied") == "respond-async" and op.get("status") == "working" and
               op.get("operation") == "create_vm" and took < 2,
               "POST /vms with Prefer: respond-async: 202, Location, the operation (%.3f s)" % took, repr((hdrs, op))[:500])
    if not oid:
        return
    seen, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        status, _, op = api(e.port, "GET", "/operations/" + oid)
        if op.get("vmState") and (not seen or seen[-1] != op["vmState"]):
            seen.append(op["vmState"])
        if op.get("status") != "working":
            break
        time.sleep(0.2)
    tap.result(op.get("status") == "completed" and op.get("result", {}).get("state") == "ready" and
               op.get("vmId") == op["result"].get("id"),
               "GET /operations/{id}: completed with the VM record; states seen %s" % " -> ".join(seen), repr(op)[:400])
    status, _, err_ = api(e.port, "DELETE", "/operations/" + oid)
    tap.result(status == 409 and err_.get("error", {}).get("code") == "conflict",
               "DELETE of an ended operation: 409 conflict", repr(err_)[:300])
    status, _, op2 = api(e.port, "POST", "/vms", dict(CREATE, name="o2"), headers={"Prefer": "respond-async"})
    time.sleep(1)
    status, _, c = api(e.port, "DELETE", "/operations/" + op2["id"])
    tap.result(status == 200 and c.get("status") == "cancelled" and c.get("error", {}).get("code") == "conflict",
               "DELETE of a working create: 200, cancelled", repr(c)[:300])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(v["name"] == "o2" for v in api(e.port, "GET", "/vms")[2]):
        time.sleep(0.2)
    tap.result(not any(v["name"] == "o2" for v in api(e.port, "GET", "/vms")[2]), "... the VM is gone", "")
    status, _, st = api(e.port, "POST", "/vms/%s/stop" % op["vmId"], headers={"Prefer": "respond-async"})
    status2, _, refusal = api(e.port, "DELETE", "/operations/" + st["id"])
    tap.result(status == 202 and (status2 == 409 and refusal["error"]["code"] == "conflict"),
               "stop with respond-async: 202; DELETE of it: 409 conflict", repr((st, refusal))[:300])
    status, _, lst = api(e.port, "GET", "/operations")
    ids = [o["id"] for o in (lst or {}).get("operations", [])]
    tap.result(status == 200 and ids[:3] == [st["id"], op2["id"], oid],
               "GET /operations lists them, newest first", repr(ids))
    status, _, nf = api(e.port, "GET", "/operations/" + "f" * 32)
    tap.result(status == 404 and nf["error"]["code"] == "not_found", "GET of an unknown operation: 404 not_found",
               repr(nf)[:200])
    status, _, nf = api(e.port, "POST", "/operations")
    tap.result(status == 404, "POST /operations: no route (404)", repr(nf)[:200])
    status, _, bad = api(e.port, "POST", "/vms", dict(CREATE, name="Bad"), headers={"Prefer": "respond-async"})
    tap.result(status == 400 and bad["error"]["code"] == "invalid_request",
               "respond-async with a bad body: 400 as without it", repr(bad)[:200])
    status, _, plain = api(e.port, "POST", "/vms", dict(CREATE, name="o3", wait_for="none"))
    tap.result(status == 201 and plain.get("name") == "o3", "without Prefer, POST /vms blocks as before (201)",
               repr(plain)[:200])
    m = Mcp(e.port)
    res = m.get(oid)[1].get("result") or {}
    tap.result(res.get("status") == "completed" and res["result"]["structuredContent"] == op["result"],
               "MCP tasks/get reads REST's operation: one record", repr(res)[:300])
    e.d.stop()


def listen(port, task_ids, tasks=True, req_id="listen:t"):
    caps = {"extensions": {TASKS: {}}} if tasks else {}
    body = json.dumps({"jsonrpc": "2.0", "id": req_id, "method": "subscriptions/listen", "params": {
        "notifications": {"taskIds": task_ids},
        "_meta": {"io.modelcontextprotocol/protocolVersion": VERSION,
                  "io.modelcontextprotocol/clientCapabilities": caps,
                  "io.modelcontextprotocol/clientInfo": {"name": "test-tasks", "version": "0"}}}}).encode()
    return EventStream(port, "POST", {"Content-Type": "application/json",
                                      "Accept": "application/json, text/event-stream",
                                      "MCP-Protocol-Version": VERSION, "Mcp-Method": "subscriptions/listen"}, body)


def test_notifications(work):
    e = Env(work, "notify", ready_after=4)
    ok, why = e.start()
    if not tap.result(ok, "daemon on fakes starts", why):
        return
    m = Mcp(e.port)
    api(e.port, "POST", "/networks", {"name": "nn", "cidr": "10.80.0.0/24"})
    status, doc = m.call("create_vm", dict(CREATE, name="n1", network="nn"))
    tid = ((doc or {}).get("result") or {}).get("taskId")
    if not tap.result(tid, "create_vm as a task", repr(doc)[:300]):
        return

    s = listen(e.port, [tid, "0" * 32])
    ack = s.next(10) or {}
    tap.result(s.status == 200 and ack.get("method") == "notifications/subscriptions/acknowledged" and
               ack["params"]["notifications"] == {"taskIds": [tid]},
               "subscriptions/listen with taskIds: acknowledged with the task that exists, not the unknown id",
               repr(ack)[:400])
    seen, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = s.next(max(0.1, deadline - time.monotonic()))
        if msg is None:
            break
        seen.append(msg)
        if (msg.get("params") or {}).get("status") in ("completed", "failed", "cancelled"):
            break
    s.close()
    params = [x.get("params") or {} for x in seen]
    states = [p.get("statusMessage", "").split(" is ")[-1] if p.get("status") == "working" else p.get("status")
              for p in params]
    tap.result(seen and all(x.get("method") == "notifications/tasks" for x in seen) and
               all(p.get("taskId") == tid for p in params) and
               all((p.get("_meta") or {}).get("io.modelcontextprotocol/subscriptionId") == "listen:t" for p in params),
               "every message after the acknowledgement is notifications/tasks of that task, with the subscription id",
               repr(seen)[:800])
    last = params[-1] if params else {}
    sc = (last.get("result") or {}).get("structuredContent") or {}
    tap.result(len(params) >= 3 and params[0].get("status") == "working" and "booting" in states and
               last.get("status") == "completed" and sc.get("state") == "ready" and
               isinstance(last.get("createdAt"), str) and isinstance(last.get("lastUpdatedAt"), str),
               "notifications/tasks: where it stood at once, the VM's states as they came, then completed with "
               "the result inlined: %s" % " -> ".join(states), repr(params)[:800])

    # a task that ended already: heard once, at once
    s = listen(e.port, [tid], req_id=9)
    ack, first = s.next(10) or {}, s.next(10) or {}
    more = s.next(2)
    s.close()
    tap.result(ack.get("params", {}).get("notifications") == {"taskIds": [tid]} and
               first.get("method") == "notifications/tasks" and first["params"].get("status") == "completed" and
               first["params"]["_meta"].get("io.modelcontextprotocol/subscriptionId") == 9 and more is None,
               "a listen for a task that has ended hears it once, completed", repr((ack, first, more))[:600])

    # refusals
    s = listen(e.port, [tid], tasks=False)
    ack = s.next(10) or {}
    s.close()
    tap.result(ack.get("params", {}).get("notifications") == {"taskIds": []},
               "a client that did not declare the extension is acknowledged no task", repr(ack)[:300])
    for bad, why in (("nope", "a string"), ([7], "an array of numbers")):
        status, doc = m.request("subscriptions/listen", {"notifications": {"taskIds": bad}})
        tap.result(err(doc).get("code") == -32602, "subscriptions/listen with taskIds %s: -32602" % why,
                   repr(doc)[:300])
    rc, took = e.d.stop(timeout=30)
    tap.result(rc == 0 and not e.d.sanitizer_lines(), "SIGTERM: exit 0, no sanitizer report",
               repr(e.d.sanitizer_lines()[:5]))


if __name__ == "__main__":
    sys.exit(run([test_mcp, test_restart, test_rest, test_notifications], deadline=500, prefix="vmm-tasks-"))
