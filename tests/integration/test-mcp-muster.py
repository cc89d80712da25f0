#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""vm-manager behind muster (issue 37), as docs/install.md deploys it: OAuth on, muster's
MCPServer with `auth.forwardToken` and muster's client id in --oauth-trusted-audiences.

muster itself (a Go aggregator in a Kubernetes cluster) cannot run here, so this test plays exactly
what it sends, from muster v1.7.8's behaviour and its MCPServer CRD
(/work/shared/reference/identity-deploy-facts.md): a streamable-http MCP client of revision
2025-11-25 with a session (initialize, notifications/initialized, tools/list, tools/call; the
headers Content-Type, Accept, Mcp-Session-Id and MCP-Protocol-Version), every request carrying
`Authorization: Bearer <the user's ID token>` as the IdP issued it to muster (audience: muster's
client id, not vm-manager's URL). muster publishes the tools to its agents as
`x_<toolPrefix>_<tool>` and, when an agent calls one, strips the prefix and calls the server with
the tool's own name: the server only ever sees its own names. The IdP is oidc/provider.mjs
(npm's oidc-provider playing Dex, as in test-oauth.py), minting ID tokens with its test keys.

  * the prefixed names muster would publish are valid MCP tool names and map back one to one;
  * the forwarded token with the trusted extra audience works for the whole session: tools/list,
    create_network, create_vm (the VM's createdBy is the user behind muster), get_vm, list_vms,
    resources/read of the VM, delete_vm;
  * what muster must not send is refused: the prefixed name (-32602 unknown tool), the same token
    once its audience is not trusted (401), an expired token (401), no token (401).
"""

import importlib.util
import json
import os
import re
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import HOST, free_port, http_request, node_tools, npm_ci_cached, run, tap  # noqa: E402

_spec = importlib.util.spec_from_file_location("test_oauth", os.path.join(here, "test-oauth.py"))
oauth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oauth)

MUSTER_CLIENT_ID = "muster"  # the audience of the ID tokens muster forwards
PREFIX = "x_vm-manager_"     # muster's x_<toolPrefix>_ with toolPrefix vm-manager
VERSION = "2025-11-25"
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # MCP 2025-11-25's rule for tool names


class Muster:
    """What muster's aggregator sends to one MCPServer of type streamable-http with forwardToken."""

    def __init__(self, port, token):
        self.port, self.token, self.session, self.next_id = port, token, None, 1
        self.tools = {}  # published name -> the server's name

    def post(self, msg):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "Authorization": "Bearer " + self.token}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
            headers["MCP-Protocol-Version"] = VERSION
        status, hdrs, body = http_request(self.port, "POST", "/mcp", body=json.dumps(msg).encode(), headers=headers,
                                          timeout=60)
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = body
        return status, hdrs, doc

    def request(self, method, params=None):
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        self.next_id += 1
        return self.post(msg)

    def connect(self):
        status, hdrs, doc = self.request("initialize", {
            "protocolVersion": VERSION, "capabilities": {},
            "clientInfo": {"name": "muster", "version": "1.7.8"}})
        self.session = hdrs.get("mcp-session-id")
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return status, doc

    def list_tools(self):
        status, _, doc = self.request("tools/list")
        tools = ((doc or {}).get("result") or {}).get("tools") or []
        self.tools = {PREFIX + t["name"]: t["name"] for t in tools}
        return status, tools

    def agent_call(self, published, arguments):
        """An agent's call of a published tool: muster strips its prefix and forwards it."""
        return self.request("tools/call", {"name": self.tools[published], "arguments": arguments})


def test_muster(work):
    port = free_port()
    provider = oauth.OidcProvider(work, "http://%s:%d/oauth/callback" % (HOST, port))
    fakes, env = oauth.setup_fakes(work)
    state = os.path.join(work, "state")
    args = fakes + oauth.oauth_args(port, provider.issuer, "--allow-private-oauth-urls",
                                    "--oauth-trusted-audiences", MUSTER_CLIENT_ID)
    d = oauth.start(work, "muster", port, state, args, env=env)
    now = int(time.time())
    # the user's ID token as Dex issued it to muster: audience muster's client id
    id_token = provider.mint("test-ec-1", oauth.claims(provider, port, aud=MUSTER_CLIENT_ID, azp=MUSTER_CLIENT_ID,
                                                       sub="carol", email="carol@example.test"))
    m = Muster(port, id_token)
    status, doc = m.connect()
    tap.result(status == 200 and m.session and doc["result"]["protocolVersion"] == VERSION,
               "muster's initialize with the forwarded ID token (audience %s, trusted): a session" % MUSTER_CLIENT_ID,
               repr(doc)[:300])
    status, tools = m.list_tools()
    names = sorted(m.tools)
    tap.result(status == 200 and len(tools) >= 20 and all(TOOL_NAME.match(n) for n in names) and
               len(set(m.tools.values())) == len(tools),
               "tools/list: %d tools, each published by muster as %s<tool>, a valid tool name that maps back" % (
                   len(tools), PREFIX), repr(names)[:500])

    def result_of(doc):
        return ((doc or {}).get("result") or {})

    status, _, doc = m.agent_call(PREFIX + "create_network", {"name": "mn", "cidr": "10.76.0.0/24"})
    tap.result(status == 200 and not result_of(doc).get("isError") and
               result_of(doc).get("structuredContent", {}).get("spec", {}).get("name") == "mn",
               "x_vm-manager_create_network reaches the server as create_network", repr(doc)[:300])
    status, _, doc = m.agent_call(PREFIX + "create_vm", {"name": "mv", "network": "mn", "memory_mib": 512,
                                                         "disk_gib": 1, "require_attestation": False,
                                                         "wait_for": "none"})
    vm = result_of(doc).get("structuredContent") or {}
    tap.result(status == 200 and vm.get("createdBy") == {"subject": "carol", "email": "carol@example.test"},
               "x_vm-manager_create_vm: the VM's createdBy is the user behind muster", repr(doc)[:400])
    vm_id = vm.get("id")
    status, _, doc = m.agent_call(PREFIX + "get_vm", {"id": vm_id})
    tap.result(result_of(doc).get("structuredContent", {}).get("id") == vm_id, "x_vm-manager_get_vm", repr(doc)[:300])
    status, _, doc = m.agent_call(PREFIX + "list_vms", {})
    tap.result([v["id"] for v in result_of(doc).get("structuredContent", {}).get("vms", [])] == [vm_id],
               "x_vm-manager_list_vms", repr(doc)[:300])
    status, _, doc = m.request("resources/read", {"uri": "vm://" + vm_id})
    contents = result_of(doc).get("contents") or [{}]
    tap.result(status == 200 and json.loads(contents[0].get("text") or "{}").get("id") == vm_id,
               "resources/read of the VM through the same forwarded token", repr(doc)[:300])

    # what muster must not send
    status, _, doc = m.request("tools/call", {"name": PREFIX + "get_vm", "arguments": {"id": vm_id}})
    tap.result(((doc or {}).get("error") or {}).get("code") == -32602,
               "the prefixed name itself is no tool of the server (-32602): muster must strip it", repr(doc)[:300])
    for what, token in (("an expired forwarded token",
                         provider.mint("test-ec-1", oauth.claims(provider, port, aud=MUSTER_CLIENT_ID, iat=now - 1200,
                                                                 exp=now - 600))),
                        ("a token for an audience not trusted",
                         provider.mint("test-ec-1", oauth.claims(provider, port, aud="another-gateway"))),
                        ("no token", None)):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "Mcp-Session-Id": m.session, "MCP-Protocol-Version": VERSION}
        if token:
            headers["Authorization"] = "Bearer " + token
        status, hdrs, _ = http_request(port, "POST", "/mcp", body=json.dumps(
            {"jsonrpc": "2.0", "id": 99, "method": "tools/list"}).encode(), headers=headers)
        tap.result(status == 401 and "resource_metadata=" in hdrs.get("www-authenticate", ""),
                   "%s on muster's session: 401 with the resource metadata" % what, repr((status, hdrs)))

    status, _, doc = m.agent_call(PREFIX + "delete_vm", {"id": vm_id})
    tap.result(result_of(doc).get("structuredContent", {}).get("deleted") is True, "x_vm-manager_delete_vm",
               repr(doc)[:300])
    rc, took = d.stop(timeout=30)
    tap.result(rc == 0 and not d.sanitizer_lines(), "SIGTERM: exit 0 in %.1f s, no sanitizer report" % took,
               repr(d.sanitizer_lines()[:5]))


def main():
    print("TAP version 13", flush=True)
    tools, why = node_tools()
    if not tools:
        print("1..0 # SKIP %s" % why, flush=True)
        return 0
    oauth.NODE = tools[0]
    ok, diag = npm_ci_cached(oauth.OIDC_DIR, oauth.CACHE_DIR)
    if not ok:
        print("not ok 1 - npm ci of oidc/ (oidc-provider)\n# %s\n1..1" % diag.replace("\n", "\n# "))
        return 1
    for name in ("provider.mjs",):
        with open(os.path.join(oauth.OIDC_DIR, name), "rb") as src, \
                open(os.path.join(oauth.CACHE_DIR, name), "wb") as dst:
            dst.write(src.read())
    sys.stdout.write = oauth._no_tap_header(sys.stdout.write)
    try:
        return run([test_muster], 200, "vmm-muster-")
    finally:
        oauth.OidcProvider.stop_all()


if __name__ == "__main__":
    sys.exit(main())
