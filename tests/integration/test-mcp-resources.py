#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""VMs as MCP resources (issue 37), raw JSON-RPC over HTTP at both revisions, on the fake QEMU of
tests/integration/fakes with the process launcher (its guest sends READY=1 $FAKE_READY_AFTER s
after the installed boot starts):

  * resources/list names each VM twice (vm://{id}, JSON; vm://{id}/console, text);
    resources/templates/list has the two templates; initialize and server/discover advertise
    resources with subscribe and listChanged;
  * resources/read of vm://{id} is get_vm's record, of vm://{id}/console the console tail; an unknown
    VM or a URI of no resource here is -32002 (2025-11-25) or -32602 (2026-07-28, SEP-2164), with
    data.uri;
  * following a VM without polling: a session subscribes (resources/subscribe) and hears
    notifications/resources/updated on its GET stream; a stateless client opens subscriptions/listen
    and hears them on that stream, after notifications/subscriptions/acknowledged and with the
    subscription id in each _meta. Both see the VM go from the state create_vm answered with
    (installing: REST's wait_for none answers once the disk exists, so creating is over by then;
    the fake's installer runs next) through booting to ready (the state rides in each
    notification's _meta, "vm-manager/state"; a read after each agrees with it or is later), and
    notifications/resources/list_changed when the VM is deleted; the session's stream, open
    before the create, hears the VM come in state creating: the list change names the VM's URI
    ("vm-manager/uri") and its first state in _meta, so that it sees creating -> booting -> ready;
  * refusals: resources/subscribe of an unknown VM, subscriptions/listen without text/event-stream
    in Accept (406), a malformed filter (-32602); a listen for a URI of no VM is acknowledged without
    it.
"""

import json
import os
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import EventStream, McpClient, base_env, fake_daemon, http_request, run, tap  # noqa: E402

FAKES = os.path.join(here, "fakes")
V2 = "2026-07-28"
READY_AFTER = 4
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False, "wait_for": "none"}


def api(port, method, path, body=None):
    status, _, out = http_request(port, method, "/api/v1" + path,
                                  body=json.dumps(body).encode() if body is not None else None,
                                  headers={"Content-Type": "application/json"} if body is not None else None,
                                  timeout=60)
    return status, (json.loads(out) if out else None)


def envelope(params=None):
    p = dict(params or {})
    p["_meta"] = {"io.modelcontextprotocol/protocolVersion": V2,
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "test-mcp-resources", "version": "0"}}
    return p


class Stateless:
    def __init__(self, port):
        self.port, self.next_id = port, 1

    def request(self, method, params=None, name=None):
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": envelope(params)}
        self.next_id += 1
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": V2, "Mcp-Method": method}
        if name is not None:
            headers["Mcp-Name"] = name
        status, _, body = http_request(self.port, "POST", "/mcp", body=json.dumps(msg).encode(), headers=headers,
                                       timeout=30)
        return status, json.loads(body) if body else None


def follow(stream, uri, until, timeout):
    """States from the notifications about uri, until one of until; every message seen."""
    states, seen, deadline = [], [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = stream.next(max(0.1, deadline - time.monotonic()))
        if msg is None:
            break
        seen.append(msg)
        p = msg.get("params") or {}
        meta = p.get("_meta") or {}
        # the list change of the VM's creation names it and carries its first state
        if (msg.get("method") == "notifications/resources/updated" and p.get("uri") == uri or
                msg.get("method") == "notifications/resources/list_changed" and meta.get("vm-manager/uri") == uri):
            state = meta.get("vm-manager/state")
            states.append(state)
            if state in until:
                break
    return states, seen


def in_order(states, want):
    i = 0
    for s in states:
        if i < len(want) and s == want[i]:
            i += 1
    return i == len(want)


def test_resources(work):
    images = os.path.join(work, "images")
    firmware = os.path.join(work, "vars")
    os.makedirs(images)
    for path in (os.path.join(images, "fake_1.0.efi"), os.path.join(images, "fake_1.0.raw"), firmware):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="install-exit:0", FAKE_READY_AFTER=str(READY_AFTER),
                   PATH=FAKES + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
    d, port, ok, why = fake_daemon(work, "res", os.path.join(work, "state"), images, firmware, env)
    if not tap.result(ok, "daemon on fakes starts", why):
        return
    api(port, "POST", "/networks", {"name": "rn", "cidr": "10.78.0.0/24"})

    # capabilities, both revisions
    s1 = McpClient(port)
    init = s1.initialize()
    caps = init["result"]["capabilities"]
    tap.result(caps.get("resources") == {"subscribe": True, "listChanged": True},
               "initialize (2025-11-25) advertises resources: subscribe, listChanged", repr(caps))
    sl = Stateless(port)
    status, doc = sl.request("server/discover")
    caps = ((doc or {}).get("result") or {}).get("capabilities") or {}
    tap.result(status == 200 and caps.get("resources") == {"subscribe": True, "listChanged": True},
               "server/discover (2026-07-28) advertises resources: subscribe, listChanged", repr(doc)[:300])

    # a session's GET stream, open before the VM exists: it hears the list change
    get = EventStream(port, "GET", {"Accept": "text/event-stream", "Mcp-Session-Id": s1.session})
    tap.result(get.status == 200, "the session's GET stream opens", repr(get.status))

    status, vm = api(port, "POST", "/vms", dict(CREATE, name="r1", network="rn"))
    vm_id = (vm or {}).get("id")
    if not tap.result(status == 201 and vm_id, "a VM is created (wait_for none)", repr(vm)[:300]):
        return
    uri, console = "vm://" + vm_id, "vm://%s/console" % vm_id
    first = vm["state"]

    # follow it: session subscription and a stateless listen, both opened at once
    _, _, doc = s1.request("resources/subscribe", {"uri": uri})
    tap.result("result" in (doc or {}), "resources/subscribe of the VM (2025-11-25)", repr(doc)[:300])
    listen_body = json.dumps({"jsonrpc": "2.0", "id": "listen:1", "method": "subscriptions/listen",
                              "params": envelope({"notifications": {
                                  "resourceSubscriptions": [uri, console, "vm://nosuchvm", "file:///etc"],
                                  "resourcesListChanged": True, "toolsListChanged": True}})}).encode()
    listen = EventStream(port, "POST", {"Content-Type": "application/json",
                                        "Accept": "application/json, text/event-stream",
                                        "MCP-Protocol-Version": V2, "Mcp-Method": "subscriptions/listen"},
                         listen_body)
    ack = listen.next(10) or {}
    tap.result(listen.status == 200 and listen.headers.get("content-type", "").startswith("text/event-stream") and
               ack.get("method") == "notifications/subscriptions/acknowledged" and
               ack["params"]["notifications"] == {"resourceSubscriptions": [uri, console],
                                                  "resourcesListChanged": True} and
               ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen:1",
               "subscriptions/listen (2026-07-28): an event stream, acknowledged first with what is honored "
               "(the VM's two URIs and list changes; not an unknown VM, another scheme or tools)", repr(ack)[:500])

    got = {}

    def watch(name, stream):
        got[name] = follow(stream, uri, ("ready", "failed"), READY_AFTER + 40)

    threads = [threading.Thread(target=watch, args=(n, st)) for n, st in (("session", get), ("listen", listen))]
    for t in threads:
        t.start()
    # reads while it moves: each a state of the record, the console text
    reads = []
    deadline = time.monotonic() + READY_AFTER + 40
    while time.monotonic() < deadline:
        alive = any(t.is_alive() for t in threads)
        status, doc = sl.request("resources/read", {"uri": uri}, name=uri)
        c = (((doc or {}).get("result") or {}).get("contents") or [{}])[0]
        if c.get("text"):
            state = json.loads(c["text"]).get("state")
            if not reads or reads[-1] != state:
                reads.append(state)
        if not alive:
            break  # the read after the last notification
        time.sleep(0.3)
    for t in threads:
        t.join(5)
    for name, want, how in (
            ("session", ["creating", "booting", "ready"],
             "its stream, open before the create, hears the VM come in state creating "
             "(notifications/resources/list_changed with the URI in _meta), then "
             "notifications/resources/updated follow it"),
            ("listen", ["booting", "ready"], "notifications/resources/updated follow the VM")):
        states, seen = got.get(name, ([], []))
        tap.result(first in ("creating", "installing") and in_order(states, want) and states[-1] == "ready",
                   "%s: %s: %s" % (name, how, " -> ".join([s or "?" for s in states])), repr(seen)[:800])
    _, seen = got.get("listen", ([], []))
    tap.result(all((m.get("params", {}).get("_meta") or {}).get("io.modelcontextprotocol/subscriptionId") == "listen:1"
                   for m in seen if m),
               "every notification on the listen stream carries its subscription id", repr(seen)[:500])
    tap.result(reads and reads[-1] == "ready", "resources/read while it moved: %s" % " -> ".join(reads), repr(reads))

    # what the resources say now
    status, doc = sl.request("resources/read", {"uri": uri}, name=uri)
    res = (doc or {}).get("result") or {}
    c = (res.get("contents") or [{}])[0]
    _, rest = api(port, "GET", "/vms/" + vm_id)
    record = json.loads(c.get("text") or "null")
    tap.result(c.get("uri") == uri and c.get("mimeType") == "application/json" and record and
               record["id"] == vm_id and record["state"] == rest["state"] and set(record) == set(rest) and
               res.get("resultType") == "complete" and res.get("ttlMs") == 0 and res.get("cacheScope") == "private",
               "resources/read vm://{id}: get_vm's record as JSON (not to be cached)", repr(doc)[:500])
    status, doc = sl.request("resources/read", {"uri": console}, name=console)
    c = ((((doc or {}).get("result") or {}).get("contents")) or [{}])[0]
    _, tail = api(port, "GET", "/vms/%s/console" % vm_id)
    tap.result(c.get("mimeType") == "text/plain" and isinstance(c.get("text"), str) and
               c["text"] == (tail or {}).get("console"),
               "resources/read vm://{id}/console: the console tail as text", repr(doc)[:300])
    _, _, doc = s1.request("resources/read", {"uri": uri})
    tap.result(json.loads(doc["result"]["contents"][0]["text"])["id"] == vm_id and "ttlMs" not in doc["result"],
               "resources/read in a session (2025-11-25)", repr(doc)[:300])

    status, doc = sl.request("resources/list")
    res = (doc or {}).get("result") or {}
    uris = {r["uri"]: r for r in res.get("resources") or []}
    tap.result(uri in uris and console in uris and uris[uri]["mimeType"] == "application/json" and
               uris[console]["mimeType"] == "text/plain" and uris[uri]["name"] == "r1" and
               res.get("cacheScope") == "private",
               "resources/list: the VM's record and console", repr(doc)[:500])
    _, _, doc = s1.request("resources/list")
    tap.result(len(doc["result"]["resources"]) == 2, "resources/list in a session", repr(doc)[:300])
    status, doc = sl.request("resources/templates/list")
    res = (doc or {}).get("result") or {}
    tap.result(sorted(t["uriTemplate"] for t in res.get("resourceTemplates") or []) ==
               ["vm://{id}", "vm://{id}/console"] and res.get("cacheScope") == "public",
               "resources/templates/list: vm://{id} and vm://{id}/console", repr(doc)[:400])
    _, _, doc = s1.request("resources/templates/list")
    tap.result(len(doc["result"]["resourceTemplates"]) == 2, "resources/templates/list in a session", repr(doc)[:300])

    # not found, at each revision
    for bad, what in (("vm://0123456789abcdef0123456789abcdef", "an unknown VM"),
                      ("vm://%s/disk" % vm_id, "a path of no resource"),
                      ("https://example.com/", "another scheme")):
        status, doc = sl.request("resources/read", {"uri": bad}, name=bad)
        e = (doc or {}).get("error") or {}
        ok1 = e.get("code") == -32602 and (e.get("data") or {}).get("uri") == bad and e.get("message")
        _, _, doc2 = s1.request("resources/read", {"uri": bad})
        e2 = (doc2 or {}).get("error") or {}
        ok2 = e2.get("code") == -32002 and (e2.get("data") or {}).get("uri") == bad
        tap.result(ok1 and ok2, "resources/read of %s: -32602 (2026-07-28), -32002 (2025-11-25), data.uri (%s)" % (
            what, e.get("message")), repr((doc, doc2))[:500])
    _, _, doc = s1.request("resources/subscribe", {"uri": "vm://nosuchvm"})
    tap.result(((doc or {}).get("error") or {}).get("code") == -32002, "resources/subscribe of an unknown VM: -32002",
               repr(doc)[:300])
    _, _, doc = s1.request("resources/subscribe", {})
    tap.result(((doc or {}).get("error") or {}).get("code") == -32602, "resources/subscribe without uri: -32602",
               repr(doc)[:300])
    status, doc = sl.request("resources/subscribe", {"uri": uri})
    tap.result(((doc or {}).get("error") or {}).get("code") == -32601,
               "resources/subscribe at 2026-07-28 (replaced by subscriptions/listen): -32601", repr(doc)[:300])
    msg = {"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": envelope({"notifications": {}})}
    status, _, body = http_request(port, "POST", "/mcp", body=json.dumps(msg).encode(),
                                   headers={"Content-Type": "application/json", "Accept": "application/json",
                                            "MCP-Protocol-Version": V2, "Mcp-Method": "subscriptions/listen"})
    tap.result(status == 406, "subscriptions/listen without text/event-stream in Accept: 406", repr((status, body)))
    status, doc = sl.request("subscriptions/listen", {"notifications": {"resourceSubscriptions": "vm://x"}})
    tap.result(((doc or {}).get("error") or {}).get("code") == -32602,
               "subscriptions/listen with resourceSubscriptions not an array: -32602", repr(doc)[:300])
    status, doc = sl.request("subscriptions/listen", {})
    tap.result(((doc or {}).get("error") or {}).get("code") == -32602,
               "subscriptions/listen without params.notifications: -32602", repr(doc)[:300])

    # unsubscribe, then the delete: only the listen stream hears about the record; both the list change
    _, _, doc = s1.request("resources/unsubscribe", {"uri": uri})
    tap.result("result" in (doc or {}), "resources/unsubscribe", repr(doc)[:300])
    status, _ = api(port, "DELETE", "/vms/" + vm_id)

    def drain(stream, timeout):
        out, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = stream.next(0.2)
            if m:
                out.append(m)
                if m.get("method") == "notifications/resources/list_changed":
                    break
        return out

    after_listen, after_get = drain(listen, 15), drain(get, 5)
    methods = [(m.get("method"), (m.get("params") or {}).get("uri")) for m in after_listen]
    tap.result(("notifications/resources/list_changed", None) in methods and
               ("notifications/resources/updated", uri) in methods,
               "the delete on the listen stream: the record updated, then the list changed", repr(methods))
    gone = [(m.get("params") or {}).get("_meta") or {} for m in after_listen
            if m.get("method") == "notifications/resources/list_changed"]
    tap.result(gone and gone[0].get("vm-manager/uri") == uri and "vm-manager/state" not in gone[0],
               "the delete's list change names the VM's URI and no state", repr(gone))
    methods = [(m.get("method"), (m.get("params") or {}).get("uri")) for m in after_get]
    tap.result(("notifications/resources/list_changed", None) in methods and
               not any(u == uri for _, u in methods),
               "... on the session's GET stream, after unsubscribe: the list change alone", repr(methods))
    get.close()
    listen.close()

    rc, took = d.stop(timeout=30)
    tap.result(rc == 0 and not d.sanitizer_lines(), "SIGTERM: exit 0 in %.1f s, no sanitizer report" % took,
               repr(d.sanitizer_lines()[:5]))


if __name__ == "__main__":
    sys.exit(run([test_resources], 240, "vmm-mcp-resources-"))
