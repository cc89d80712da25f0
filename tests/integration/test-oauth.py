#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Identity (--enable-oauth) against a real OpenID provider: npm's oidc-provider playing Dex
(oidc/provider.mjs, fixed test keys), and the official MCP TypeScript SDK doing the whole OAuth
flow of a client (oidc/flow.mjs).

Sections: the flags and start-up refusals; the guard (open routes, the 401, the provider's own
tokens, trusted audiences, a table of bad tokens that change nothing, unknown kids and rotated
keys); the SDK's flow with createdBy, refresh rotation and replay, a restart, revocation and
`image golden --token`; an IdP that does not answer (401 with a log line, the loop never blocked);
the SSRF guard.

npm ci of oidc/package-lock.json goes to OIDC_CACHE_DIR (the build directory), again only when the
lock changes. Without node or npm the test skips. Only 127.0.0.1 and, on a cold cache, the npm
registry are contacted.
"""

import base64
import http.client
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (BIN, Daemon, HOST, McpClient, base_env, fake_image_dir, free_port, http_request,  # noqa: E402
                     node_tools, npm_ci_cached, run, tap)

OIDC_DIR = os.environ.get("OIDC_DIR") or os.path.join(here, "oidc")
CACHE_DIR = os.environ.get("OIDC_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vm-manager", "oidc")
FAKES = os.path.join(here, "fakes")
TRUSTED = "agent-platform"
NET = {"name": "probe", "cidr": "10.93.0.0/24"}
NODE = None


def collector_class():
    """test-traces.py's stand-in OTLP/HTTP collector."""
    spec = importlib.util.spec_from_file_location("test_traces", os.path.join(here, "test-traces.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Collector, mod.attrs_of


class OidcProvider:
    """oidc/provider.mjs: the IdP, and its test controls (mint, rotate, stats). Every one started is
    stopped at the end, whatever happened (stop_all())."""

    all = []

    def __init__(self, work, redirect_uri, tls=None, keys=None, port=0):
        """keys: a key file of test-keys.json's form instead of it; port: where to listen (0: any)."""
        self.log = os.path.join(work, "provider.log")
        env = dict(os.environ, OIDC_TEST_KEYS=keys or os.path.join(OIDC_DIR, "test-keys.json"))
        if tls:
            env.update(OIDC_TLS_CERT=tls[0], OIDC_TLS_KEY=tls[1])
        self.tls = tls
        self.proc = subprocess.Popen([NODE, os.path.join(CACHE_DIR, "provider.mjs"), redirect_uri, str(port)],
                                     cwd=CACHE_DIR, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=open(self.log, "ab"), env=env)
        OidcProvider.all.append(self)
        line = self.proc.stdout.readline().decode()
        m = re.match(r"READY (\d+)", line)
        if not m:
            raise RuntimeError("provider did not start: %r; log:\n%s" % (line, open(self.log).read()[-2000:]))
        self.port = int(m.group(1))
        self.issuer = "%s://%s:%d" % ("https" if tls else "http", HOST, self.port)

    def control(self, what, body):
        if self.tls:
            import http.client
            import ssl
            conn = http.client.HTTPSConnection(HOST, self.port, context=ssl.create_default_context(cafile=self.tls[2]))
            conn.request("POST", "/_test/" + what, body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            status, data = resp.status, resp.read()
            conn.close()
        else:
            status, _, data = http_request(self.port, "POST", "/_test/" + what, body=json.dumps(body).encode(),
                                           headers={"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError("provider %s: %r %r" % (what, status, data[:500]))
        return json.loads(data)

    def mint(self, kid, claims, header=None):
        return self.control("mint", {"kid": kid, "claims": claims, "header": header or {}})["token"]

    def jwks_fetches(self):
        return self.control("stats", {})["jwks_fetches"]

    def client_credentials(self, resource):
        form = urllib.parse.urlencode({"grant_type": "client_credentials", "scope": "vm:read", "resource": resource})
        status, _, data = http_request(self.port, "POST", "/token", body=form.encode(), headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Authorization": "Basic c3ZjOnN2Yy1zZWNyZXQ="})  # svc:svc-secret
        if status != 200:
            raise RuntimeError("client_credentials: %r %r" % (status, data[:500]))
        return json.loads(data)["access_token"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @classmethod
    def stop_all(cls):
        for p in cls.all:
            p.stop()


def setup_fakes(work):
    """An image and firmware the fake QEMU boots: VMs can be created."""
    images, vars_ = fake_image_dir(work)
    env = base_env(work, FAKE_QEMU="install-exit:0")
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    return ["--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process"], env


def oauth_args(port, issuer, *extra):
    return ["--enable-oauth", "--oauth-base-url", "http://%s:%d" % (HOST, port), "--dex-issuer-url", issuer,
            "--dex-client-id", "vm-manager", "--dex-client-secret", "dex-secret"] + list(extra)


def start(work, name, port, state, args, env=None):
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--log-level", "debug"] + args,
               env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    if not ok:
        raise RuntimeError("daemon %s: %s" % (name, why))
    return d


def bearer(token):
    return {"Authorization": "Bearer " + token}


def call(port, method, path, token=None, body=None, timeout=20):
    headers = bearer(token) if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    status, headers, data = http_request(port, method, path, body=json.dumps(body).encode() if body is not None
                                         else None, headers=headers, timeout=timeout)
    try:
        doc = json.loads(data) if data else None
    except ValueError:
        doc = data
    return status, headers, doc


def is_refusal(status, headers, doc, port, invalid_token=True):
    """A 401 as the guard answers it; returns (ok, diag)."""
    diag = "status %r, www-authenticate %r, body %r" % (status, headers.get("www-authenticate"), str(doc)[:300])
    want = 'Bearer resource_metadata="http://%s:%d/.well-known/oauth-protected-resource/mcp"' % (HOST, port)
    if invalid_token:
        want += ', error="invalid_token"'
    ok = (status == 401 and headers.get("www-authenticate") == want and
          doc == {"error": {"code": "unauthorized", "message": "unauthorized: a valid bearer token is required"}})
    return ok, diag


def oversized_request(port, token):
    """POSTs with the token, tolerating a server that answers and closes before it read it all;
    returns the status, or "reset" when the close reset the connection before its answer could be
    read."""
    body = json.dumps({"name": "huge", "cidr": "10.95.0.0/24"}).encode()
    req = ("POST /api/v1/networks HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n"
           "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
           % (HOST, port, token, len(body))).encode() + body
    with socket.create_connection((HOST, port), timeout=10) as s:
        try:
            s.sendall(req)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            if not data:
                return "reset"
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else None


def call_headers(port, method, path, headers, body=None):
    """A request with the headers of a list of (name, value), so that one may be repeated."""
    conn = http.client.HTTPConnection(HOST, port, timeout=20)
    try:
        conn.putrequest(method, path)
        for name, value in headers + ([("Content-Type", "application/json")] if body is not None else []):
            conn.putheader(name, value)
        data = json.dumps(body).encode() if body is not None else b""
        if body is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data or None)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(raw) if raw else None
    finally:
        conn.close()


def is_invalid_request(status, headers, doc, port):
    """A 400 as the guard answers a request with more than one Authorization (RFC 6750 §3.1)."""
    want = ('Bearer resource_metadata="http://%s:%d/.well-known/oauth-protected-resource/mcp", '
            'error="invalid_request"' % (HOST, port))
    ok = (status == 400 and headers.get("www-authenticate") == want and isinstance(doc, dict) and
          doc.get("error", {}).get("code") == "invalid_request" and
          "Authorization" in doc.get("error", {}).get("message", ""))
    return ok, "status %r, www-authenticate %r, body %r" % (status, headers.get("www-authenticate"), str(doc)[:300])


def form_post(port, path, fields, headers=None):
    h = {"Content-Type": "application/x-www-form-urlencoded"}
    h.update(headers or {})
    status, _, data = http_request(port, "POST", path, body=urllib.parse.urlencode(fields).encode(), headers=h)
    return status, (json.loads(data) if data else None)


def claims(provider, port, **over):
    now = int(time.time())
    c = {"iss": provider.issuer, "sub": "bob", "aud": "http://%s:%d/mcp" % (HOST, port), "iat": now, "exp": now + 600,
         "email": "bob@example.test", "groups": ["vm-admins"]}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


# ---------------------------------------------------------------------------------------------


def test_config(work):
    """Bad combinations refuse to start, naming the flag; every flag is in --help with its variable."""
    state = os.path.join(work, "config-state")
    cases = [
        ("OAuth without a base URL", ["--enable-oauth"], {}, "oauth: base URL is required (--oauth-base-url)"),
        ("from the environment too", [], {"VM_MANAGER_OAUTH_ENABLED": "true"},
         "oauth: base URL is required (--oauth-base-url)"),
        ("a base URL that is http on a public name", ["--enable-oauth", "--oauth-base-url", "http://vmm.example"], {},
         "must be https, or http on localhost, 127.0.0.1 or ::1 (--oauth-base-url)"),
        ("a base URL with a path", ["--enable-oauth", "--oauth-base-url", "https://vmm.example/x"], {},
         "must be an origin without a path"),
        ("dex without its settings", ["--enable-oauth", "--oauth-base-url", "https://vmm.example",
                                      "--dex-issuer-url", "https://dex.example"], {},
         "oauth: dex issuer URL, client ID and client secret are required (--dex-issuer-url, --dex-client-id, --dex-client-secret)"),
        ("google without its settings", ["--enable-oauth", "--oauth-base-url", "https://vmm.example"],
         {"VM_MANAGER_OAUTH_PROVIDER": "google", "GOOGLE_CLIENT_ID": "x"},
         "oauth: google client ID and client secret are required (--google-client-id, --google-client-secret)"),
        ("an unknown provider", ["--oauth-provider", "okta"], {}, "--oauth-provider: want dex or google"),
        ("a Dex CA file that cannot be read", ["--enable-oauth", "--oauth-base-url", "https://vmm.example",
                                               "--dex-issuer-url", "https://dex.example", "--dex-client-id", "a",
                                               "--dex-client-secret", "b", "--dex-ca-file", "/nonexistent/ca.pem"], {},
         "(--dex-ca-file)"),
    ]
    for name, args, env, want in cases:
        p = subprocess.run([BIN, "serve", "--listen", "%s:%d" % (HOST, free_port()), "--state-dir", state] + args,
                           env=base_env(work, **env), capture_output=True, text=True, timeout=20)
        tap.result(p.returncode == 1 and want in p.stderr, "start-up refused: %s" % name,
                   "exit %r, stderr %r" % (p.returncode, p.stderr[-600:]))
    p = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=10)
    flags = {"enable-oauth": "VM_MANAGER_OAUTH_ENABLED", "oauth-base-url": "VM_MANAGER_OAUTH_BASE_URL",
             "oauth-provider": "VM_MANAGER_OAUTH_PROVIDER", "oauth-trusted-audiences": "OAUTH_TRUSTED_AUDIENCES",
             "sso-allow-private-ips": "SSO_ALLOW_PRIVATE_IPS",
             "allow-public-client-registration": "VM_MANAGER_OAUTH_ALLOW_PUBLIC_REGISTRATION",
             "dex-issuer-url": "DEX_ISSUER_URL", "dex-client-id": "DEX_CLIENT_ID",
             "dex-client-secret": "DEX_CLIENT_SECRET", "dex-ca-file": "DEX_CA_FILE",
             "allow-private-oauth-urls": "VM_MANAGER_OAUTH_ALLOW_PRIVATE_URLS",
             "google-client-id": "GOOGLE_CLIENT_ID", "google-client-secret": "GOOGLE_CLIENT_SECRET"}
    missing = [f for f, e in flags.items()
               if not re.search(r"--%s\b[^\n]*\n[^\n]*\n\s+environment: %s\n" % (re.escape(f), e), p.stdout)]
    tap.result(not missing, "serve --help lists the 13 identity flags with their environment variables",
               "missing: %s" % missing)


def test_guard(work):
    port = free_port()
    provider = OidcProvider(work, "http://%s:%d/oauth/callback" % (HOST, port))
    state = os.path.join(work, "guard-state")
    fakes, env = setup_fakes(work)
    Collector, attrs_of = collector_class()
    collector = Collector()
    traced = dict(env, OTEL_EXPORTER_OTLP_ENDPOINT="http://%s:%d" % (HOST, collector.port),
                  OTEL_BSP_SCHEDULE_DELAY="100")
    args = fakes + oauth_args(port, provider.issuer, "--allow-private-oauth-urls",
                              "--oauth-trusted-audiences", " %s , ,other " % TRUSTED)
    d = start(work, "guard", port, state, args, env=traced)
    resource = "http://%s:%d/mcp" % (HOST, port)
    try:
        for path in ("/healthz", "/readyz", "/metrics"):
            status, _, _ = call(port, "GET", path)
            tap.result(status == 200, "GET %s needs no token" % path, "status %r" % status)
        status, _, prm = call(port, "GET", "/.well-known/oauth-protected-resource/mcp")
        status2, _, prm2 = call(port, "GET", "/.well-known/oauth-protected-resource")
        tap.result(status == status2 == 200 and prm == prm2 and prm["resource"] == resource and
                   prm["authorization_servers"] == ["http://%s:%d" % (HOST, port)],
                   "RFC 9728 metadata at both well-known forms names the resource and this server", str(prm))
        status, _, asm = call(port, "GET", "/.well-known/oauth-authorization-server")
        tap.result(status == 200 and asm["issuer"] == "http://%s:%d" % (HOST, port) and
                   asm["code_challenge_methods_supported"] == ["S256"] and "registration_endpoint" not in asm,
                   "RFC 8414 metadata: S256 only, no registration endpoint without --allow-public-client-registration",
                   str(asm)[:400])
        for path in ("/oauth/nosuch", "/.well-known/oauth-protected-resource/other"):
            st, _, doc = call(port, "GET", path)
            tap.result(st == 404 and doc["error"]["code"] == "not_found", "GET %s: 404 not_found, no token asked" % path,
                       "%r %r" % (st, doc))
        st, _, reg = call(port, "POST", "/oauth/register", body={"redirect_uris": ["http://127.0.0.1:9/cb"]})
        tap.result(st == 403 and reg.get("error") == "access_denied", "dynamic registration is refused when not enabled",
                   "%r %r" % (st, reg))

        for method, path in (("GET", "/api/v1/vms"), ("POST", "/api/v1/networks"), ("GET", "/api/v1/nosuch")):
            tap.check("%s %s without a token: 401 with resource_metadata and the error envelope" % (method, path),
                      lambda m=method, p=path: is_refusal(*call(port, m, p, body={} if m == "POST" else None), port,
                                                          invalid_token=False))
        status, headers, body = McpClient(port).post_raw(json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}))
        tap.check("POST /mcp without a token: 401", lambda: is_refusal(status, headers, json.loads(body), port, False))

        # the provider's own access token for this resource (RFC 8707), and an id_token-like token
        # for a trusted audience: both accepted, as source sso
        cc = provider.client_credentials(resource)
        status, _, vms = call(port, "GET", "/api/v1/vms", cc)
        tap.result(status == 200 and vms == [], "the provider's access token for this resource is accepted",
                   "%r %r" % (status, vms))
        tap.result("by subject 'svc' email '' groups '' source sso" in d.stderr(),
                   "the caller is in the debug log of the request")
        good = provider.mint("test-ec-1", claims(provider, port, aud=[TRUSTED, "someone-else"]))
        status, _, net = call(port, "POST", "/api/v1/networks", good, body=NET)
        tap.result(status == 201, "a token for a trusted audience (--oauth-trusted-audiences, blanks dropped) works",
                   "%r %r" % (status, net))
        status, _, vm = call(port, "POST", "/api/v1/vms", good, body={
            "name": "oauth-rest", "image": "fake_1.0", "memory_mib": 512, "disk_gib": 2, "network": NET["name"],
            "require_attestation": False, "wait_for": "none"})
        ok = status == 201 and vm.get("createdBy") == {"subject": "bob", "email": "bob@example.test"}
        if ok:
            s2, _, got = call(port, "GET", "/api/v1/vms/" + vm["id"], cc)
            s3, _, listed = call(port, "GET", "/api/v1/vms", cc)
            ok = s2 == 200 and got["createdBy"] == vm["createdBy"] and listed[0].get("createdBy") == vm["createdBy"]
        tap.result(ok, "create_vm records createdBy (subject, email); get_vm and list_vms show it",
                   "%r %r" % (status, str(vm)[:400]))
        status, headers, body = McpClient(port).post_raw(json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
            headers=bearer(good))
        tap.result(status == 200, "POST /mcp with the token: initialize answers", "status %r" % status)

        def enduser(name):
            return lambda spans: any(s["name"] == name and attrs_of(s).get("enduser.id") == "bob" for s in spans)
        tap.result(collector.wait_for(enduser("POST /api/v1/networks")) and collector.wait_for(enduser("POST /mcp")),
                   "the REST and MCP server spans carry the caller as enduser.id",
                   str([(s["name"], attrs_of(s).get("enduser.id")) for _, s in collector.spans()])[:600])
        before = (call(port, "GET", "/api/v1/networks", cc)[2], call(port, "GET", "/api/v1/vms", cc)[2])

        now = int(time.time())
        ec = provider.mint("test-ec-1", claims(provider, port))
        h, p, s = ec.split(".")
        tampered = "%s.%s.%s" % (h, base64url(json.dumps(dict(claims(provider, port), sub="root")).encode()), s)
        bad = [
            ("unsigned", "%s.%s." % (h, p)),
            ("alg none", provider.mint("test-rsa-1", claims(provider, port), {"alg": "none"})),
            ("HS256 keyed with the RSA public key", provider.mint("test-rsa-1", claims(provider, port), {"alg": "HS256"})),
            ("a tampered payload", tampered),
            ("expired", provider.mint("test-ec-1", claims(provider, port, iat=now - 7200, exp=now - 3600))),
            ("not yet valid", provider.mint("test-ec-1", claims(provider, port, nbf=now + 3600))),
            ("issued in the future", provider.mint("test-ec-1", claims(provider, port, iat=now + 3600))),
            ("a wrong issuer", provider.mint("test-ec-1", claims(provider, port, iss="http://127.0.0.1:1"))),
            ("an audience of another resource (the provider's token)", provider.client_credentials("http://127.0.0.1:1/mcp")),
            ("an audience nobody trusts", provider.mint("test-ec-1", claims(provider, port, aud="other-app"))),
            ("no exp", provider.mint("test-ec-1", claims(provider, port, exp=None))),
            ("no sub", provider.mint("test-ec-1", claims(provider, port, sub=None))),
            ("typ of another kind", provider.mint("test-ec-1", claims(provider, port), {"typ": "dpop+jwt"})),
            ("an RS256 token naming an EC key's kid", provider.mint("test-rsa-1", claims(provider, port),
                                                                      {"kid": "test-ec-1"})),
            ("garbage base64", "!!!.@@@.###"),
            ("not a JWT at all", "hello"),
            ("a token over 8 KiB", provider.mint("test-ec-1", claims(provider, port, pad="y" * 7000))),
            ("a 64 KiB JOSE header", base64url(json.dumps({"alg": "ES256", "kid": "k" * 65536}).encode()) + "." + p + "." + s),
            ("a 6 KiB token", provider.mint("test-ec-1", claims(provider, port, pad="y" * 4500))),
        ]
        for name, token in bad:
            if name == "a 64 KiB JOSE header":
                # past the memory libmicrohttpd gives a connection's headers (32 KiB): refused
                # before any handler runs, with 431, possibly while the client still sends
                status = oversized_request(port, token)
                tap.result(status in (431, "reset"),
                           "bad token refused by the HTTP server before the guard (431): %s" % name,
                           "status %r" % status)
                continue
            status, headers, doc = call(port, "POST", "/api/v1/networks", token, body={
                "name": "bad-" + str(len(name)), "cidr": "10.94.0.0/24"})
            if name == "a 6 KiB token":  # the control: large, within the limit, and good
                tap.result(status == 201, "a good 6 KiB token is within the size limit", "status %r" % status)
                call(port, "DELETE", "/api/v1/networks/bad-" + str(len(name)), cc)
                continue
            ok, diag = is_refusal(status, headers, doc, port)
            tap.result(ok, "bad token refused with 401 invalid_token: %s" % name, diag)
        # RFC 6750 §2: one method, one token. A second Authorization, whichever comes first, and
        # whatever it holds, is a malformed request (400 invalid_request), never "the first wins"
        fresh = provider.mint("test-ec-1", claims(provider, port, sub="twice"))
        two = [
            ("a good token, then garbage", [("Authorization", "Bearer " + fresh), ("Authorization", "Bearer garbage")]),
            ("garbage, then a good token", [("Authorization", "Bearer garbage"), ("Authorization", "Bearer " + fresh)]),
            ("the same good token twice", [("Authorization", "Bearer " + fresh)] * 2),
            ("a good token, then Basic", [("Authorization", "Bearer " + fresh), ("authorization", "Basic eDp5")]),
        ]
        for name, headers in two:
            tap.check("two Authorization headers: 400 invalid_request on GET: %s" % name,
                      lambda h=headers: is_invalid_request(*call_headers(port, "GET", "/api/v1/vms", h), port))
            tap.check("two Authorization headers: 400 invalid_request on POST, nothing created: %s" % name,
                      lambda h=headers: is_invalid_request(*call_headers(
                          port, "POST", "/api/v1/networks", h, body={"name": "twice", "cidr": "10.96.0.0/24"}), port))
        tap.result(call_headers(port, "GET", "/api/v1/vms", two[0][1][:1])[0] == 200,
                   "the same token alone in one Authorization header is accepted")
        after = (call(port, "GET", "/api/v1/networks", cc)[2], call(port, "GET", "/api/v1/vms", cc)[2])
        tap.result(before == after, "the refused requests changed nothing", "%r\n%r" % (before, after))
        log = d.stderr()
        reasons = ["alg none is refused", "HMAC algorithms are refused", "issuer is neither", "the token has expired",
                   "the signature does not verify", "the token is larger than 8 KiB", "the token is unsigned"]
        tap.result(all(r in log for r in reasons), "the reasons are in the log, the responses all alike",
                   "missing: %s" % [r for r in reasons if r not in log])

        # unknown kid: one refetch (the cache may fetch at most once per 5 s), then 401
        time.sleep(5.5)
        n0 = provider.jwks_fetches()
        other = provider.mint("test-rsa-other", claims(provider, port))
        r1 = call(port, "GET", "/api/v1/vms", other)
        r2 = call(port, "GET", "/api/v1/vms", provider.mint("test-rsa-other", claims(provider, port, sub="eve")))
        n1 = provider.jwks_fetches()
        tap.result(is_refusal(*r1, port)[0] and is_refusal(*r2, port)[0] and n1 - n0 == 1,
                   "an unknown kid: one JWKS refetch, then 401 (and no second refetch at once)",
                   "fetches %d -> %d; %r %r" % (n0, n1, r1[0], r2[0]))

        # rotation: the provider drops test-ec-1 and signs with test-ec-2
        old = provider.mint("test-ec-1", claims(provider, port, sub="carol"))
        tap.result(call(port, "GET", "/api/v1/vms", old)[0] == 200, "a token of test-ec-1 works before the rotation")
        provider.control("rotate", {"keys": ["test-ec-2"]})
        time.sleep(5.5)
        new = provider.mint("test-ec-2", claims(provider, port, sub="carol"))
        status = call(port, "GET", "/api/v1/vms", new)[0]
        tap.result(status == 200, "after a key rotation, a token of the new key works (unknown kid, refetch)",
                   "status %r" % status)
        tap.check("the token of the removed key is refused, though it was verified (and cached) before",
                  lambda: is_refusal(*call(port, "GET", "/api/v1/vms", old), port))
        tap.check("a new token of the removed key is refused",
                  lambda: is_refusal(*call(port, "GET", "/api/v1/vms", provider.mint(
                      "test-ec-1", claims(provider, port, sub="dave"))), port))
        trusted = provider.mint("test-ec-2", claims(provider, port, aud=TRUSTED))
        tap.result(call(port, "GET", "/api/v1/vms", trusted)[0] == 200, "a trusted-audience token of the new key works")
    finally:
        rc, _ = d.stop()
        collector.close()
        tap.result(rc == 0 and not d.sanitizer_lines(), "guard: exit 0 on SIGTERM, no sanitizer report",
                   "exit %r %s" % (rc, d.sanitizer_lines()[:3]))

    # the same token once the audience is no longer trusted
    d = start(work, "guard-untrusted", port, state, fakes + oauth_args(port, provider.issuer, "--allow-private-oauth-urls"),
              env=env)
    try:
        tap.check("a trusted-audience token is refused once --oauth-trusted-audiences no longer names it",
                  lambda: is_refusal(*call(port, "GET", "/api/v1/vms", trusted), port))
        tap.result(call(port, "GET", "/api/v1/vms", new)[0] == 200, "a token for this resource still works")
    finally:
        d.stop()
        provider.stop()


def test_kid_reuse(work):
    """A rotation that keeps the key ids: the provider restarted with new key material under the same
    kids. A token whose signature fails under a known kid refetches the JWKS (rate-limited like an
    unknown kid) and is verified once more: the new key's tokens work at once, the withdrawn key's
    are refused, cached ones included."""
    port = free_port()
    redirect = "http://%s:%d/oauth/callback" % (HOST, port)
    provider = OidcProvider(work, redirect)
    state = os.path.join(work, "kid-reuse-state")
    fakes, env = setup_fakes(work)
    d = start(work, "kid-reuse", port, state, fakes + oauth_args(port, provider.issuer, "--allow-private-oauth-urls"),
              env=env)
    try:
        old = provider.mint("test-ec-1", claims(provider, port, sub="carol"))
        unused = provider.mint("test-ec-1", claims(provider, port, sub="dave"))
        tap.result(call(port, "GET", "/api/v1/vms", old)[0] == 200, "kid reuse: a token of the first test-ec-1 works")

        # the same kids, other keys: test-ec-1 is now test-ec-2's key, test-rsa-1 test-rsa-other's
        with open(os.path.join(OIDC_DIR, "test-keys.json")) as f:
            keys = json.load(f)
        swapped = dict(keys)
        swapped["test-ec-1"] = dict(keys["test-ec-2"], kid="test-ec-1")
        swapped["test-rsa-1"] = dict(keys["test-rsa-other"], kid="test-rsa-1")
        swapped["withdrawn-ec"] = dict(keys["test-ec-1"], kid="withdrawn-ec")  # minted with, never served
        keys_file = os.path.join(work, "reused-kids.json")
        with open(keys_file, "w") as f:
            json.dump(swapped, f)
        provider.stop()
        provider = OidcProvider(work, redirect, keys=keys_file, port=provider.port)
        time.sleep(5.5)  # past the refetch rate limit of the first fetch

        n0 = provider.jwks_fetches()
        new = provider.mint("test-ec-1", claims(provider, port, sub="carol"))
        status, _, doc = call(port, "GET", "/api/v1/vms", new)
        n1 = provider.jwks_fetches()
        tap.result(status == 200 and n1 - n0 == 1,
                   "kid reuse: a token of the new key under the old kid works at once (one JWKS refetch)",
                   "status %r %r, fetches %d -> %d" % (status, str(doc)[:200], n0, n1))
        tap.check("kid reuse: a fresh token of the withdrawn key is refused",
                  lambda: is_refusal(*call(port, "GET", "/api/v1/vms", unused), port))
        tap.check("kid reuse: the withdrawn key's token verified (and cached) before is refused",
                  lambda: is_refusal(*call(port, "GET", "/api/v1/vms", old), port))
        tap.result("the signature does not verify" in d.stderr(), "kid reuse: the log says why")

        # tokens of the withdrawn key under its kid, minted now: each is a signature failure under a
        # known kid, and together they cost at most one refetch per rate-limit period
        forged = [provider.mint("withdrawn-ec", claims(provider, port, sub="eve%d" % i), {"kid": "test-ec-1"})
                  for i in range(5)]
        n2 = provider.jwks_fetches()
        refused = all(is_refusal(*call(port, "GET", "/api/v1/vms", t), port)[0] for t in forged)
        n3 = provider.jwks_fetches()
        tap.result(refused and n3 - n2 <= 1,
                   "kid reuse: 5 new tokens of the withdrawn key are refused, with at most one refetch",
                   "refused %r, fetches %d -> %d" % (refused, n2, n3))
        tap.result(call(port, "GET", "/api/v1/vms", new)[0] == 200, "kid reuse: the new key's token still works")
    finally:
        rc, _ = d.stop()
        provider.stop()
        tap.result(rc == 0 and not d.sanitizer_lines(), "kid reuse: exit 0 on SIGTERM, no sanitizer report",
                   "exit %r %s" % (rc, d.sanitizer_lines()[:3]))


def base64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def test_sdk_flow(work):
    port = free_port()
    provider = OidcProvider(work, "http://%s:%d/oauth/callback" % (HOST, port))
    state = os.path.join(work, "flow-state")
    fakes, env = setup_fakes(work)
    args = fakes + oauth_args(port, provider.issuer, "--allow-private-oauth-urls", "--allow-public-client-registration")
    d = start(work, "flow", port, state, args, env=env)
    out_path = os.path.join(work, "flow.json")
    try:
        p = subprocess.run([NODE, os.path.join(CACHE_DIR, "flow.mjs"), "http://%s:%d/mcp" % (HOST, port), out_path],
                           cwd=CACHE_DIR, capture_output=True, text=True, timeout=90)
        seen = 0
        for line in p.stdout.splitlines():
            m = re.match(r"^(ok|not ok) \d+ - (.*)$", line)
            if m:
                seen += 1
                tap.result(m.group(1) == "ok", "sdk: " + m.group(2))
            elif line.startswith("#"):
                print(line, flush=True)
        tap.result(p.returncode == 0 and seen >= 6, "flow.mjs ran to the end",
                   "exit %r, %d tests\nstderr: %s" % (p.returncode, seen, p.stderr[-2000:]))
        if p.returncode != 0:
            return
        with open(out_path) as f:
            out = json.load(f)
        tokens, client = out["tokens"], out["client"]["client_id"]
        status, _, vm = call(port, "GET", "/api/v1/vms/" + out["vm"], tokens["access_token"])
        tap.result(status == 200 and vm["createdBy"] == {"subject": "alice", "email": "alice@example.test"},
                   "REST shows the VM the SDK created, with createdBy", str(vm)[:300])
        log = d.stderr()
        tap.result("by subject 'alice' email 'alice@example.test' groups 'vm-admins,alice-team' source oauth" in log,
                   "the caller of the SDK's requests is in the debug log, source oauth")
    finally:
        rc, _ = d.stop()
        tap.result(rc == 0 and not d.sanitizer_lines(), "flow: exit 0 on SIGTERM, no sanitizer report",
                   "exit %r %s" % (rc, d.sanitizer_lines()[:3]))

    oauth_dir = os.path.join(state, "oauth")
    modes = {f: oct(os.stat(os.path.join(oauth_dir, f)).st_mode & 0o777) for f in os.listdir(oauth_dir)}
    modes["."] = oct(os.stat(oauth_dir).st_mode & 0o777)
    tap.result(modes == {".": "0o700", "signing-key.json": "0o600", "state.json": "0o600"},
               "the OAuth state: a 0700 directory, its files 0600", str(modes))
    with open(os.path.join(oauth_dir, "state.json")) as f:
        text = f.read()
    tap.result(tokens["refresh_token"] not in text and out["rotated"] not in text,
               "refresh tokens are kept hashed, never in the clear")

    d = start(work, "flow-restarted", port, state, args, env=env)
    try:
        status = call(port, "GET", "/api/v1/vms", tokens["access_token"])[0]
        tap.result(status == 200, "after a restart, the access token still works (the signing key persisted)",
                   "status %r" % status)
        status, _, vm = call(port, "GET", "/api/v1/vms/" + out["vm"], tokens["access_token"])
        tap.result(status == 200 and vm.get("createdBy") == {"subject": "alice", "email": "alice@example.test"},
                   "after a restart, the VM record still names its creator", "%r %r" % (status, str(vm)[:300]))
        status, doc = form_post(port, "/oauth/token", {"grant_type": "refresh_token", "client_id": client,
                                                        "refresh_token": tokens["refresh_token"],
                                                        "resource": "http://%s:%d/mcp" % (HOST, port)})
        tap.result(status == 200 and doc.get("refresh_token") not in (None, tokens["refresh_token"]),
                   "after a restart, the refresh token works and rotates", "%r %r" % (status, doc))
        newest = (doc or {}).get("refresh_token", "")
        fresh = (doc or {}).get("access_token", "")
        status, doc = form_post(port, "/oauth/token", {"grant_type": "refresh_token", "client_id": client,
                                                        "refresh_token": out["rotated"]})
        tap.result(status == 400 and doc.get("error") == "invalid_grant", "a rotated refresh token is refused",
                   "%r %r" % (status, doc))
        status, doc = form_post(port, "/oauth/token", {"grant_type": "refresh_token", "client_id": client,
                                                        "refresh_token": tokens["refresh_token"]})
        status2, doc2 = form_post(port, "/oauth/token", {"grant_type": "refresh_token", "client_id": client,
                                                          "refresh_token": newest})
        tap.result(status == 400 and status2 == 400 and doc2.get("error") == "invalid_grant",
                   "replaying a rotated refresh token ends the family: the newest is refused too",
                   "%r %r / %r %r" % (status, doc, status2, doc2))
        status, doc = form_post(port, "/oauth/token", {"grant_type": "authorization_code", "client_id": client,
                                                        "code": "nope", "code_verifier": "x" * 43,
                                                        "redirect_uri": "http://127.0.0.1:9/callback"})
        tap.result(status == 400 and doc.get("error") == "invalid_grant", "an unknown code is invalid_grant",
                   "%r %r" % (status, doc))
        status, doc = form_post(port, "/oauth/token", {"grant_type": "password", "client_id": client})
        tap.result(status == 400 and doc.get("error") == "unsupported_grant_type", "other grants are unsupported",
                   "%r %r" % (status, doc))

        # /oauth/authorize refuses what it must, and redirects only to a registered URI
        redirect = out["client"]["redirect_uris"][0]
        challenge = base64url(os.urandom(32))
        good = {"response_type": "code", "client_id": client, "redirect_uri": redirect, "state": "s1",
                "code_challenge": challenge, "code_challenge_method": "S256"}

        def authorize(**over):
            q = dict(good, **over)
            status, headers, data = http_request(port, "GET", "/oauth/authorize?" + urllib.parse.urlencode(
                {k: v for k, v in q.items() if v is not None}))
            loc = headers.get("location", "")
            return status, loc, dict(urllib.parse.parse_qsl(urllib.parse.urlparse(loc).query)), data

        for name, over, want in [
            ("an unknown client", {"client_id": "nobody"}, None),
            ("a redirect_uri not registered", {"redirect_uri": redirect + "x"}, None),
            ("no PKCE", {"code_challenge": None}, "invalid_request"),
            ("PKCE plain", {"code_challenge_method": "plain"}, "invalid_request"),
            ("another resource", {"resource": "http://127.0.0.1:1/mcp"}, "invalid_target"),
            ("response_type token", {"response_type": "token"}, "unsupported_response_type"),
        ]:
            status, loc, q, data = authorize(**over)
            if want is None:
                ok = status == 400 and not loc and json.loads(data).get("error") == "invalid_request"
            else:
                ok = status == 302 and loc.startswith(redirect + "?") and q.get("error") == want and q.get("state") == "s1"
            tap.result(ok, "/oauth/authorize with %s: %s" % (name, want or "400, no redirect"),
                       "%r %r %r" % (status, loc, data[:200]))
        status, loc, q, _ = authorize(resource="http://%s:%d/mcp" % (HOST, port))
        tap.result(status == 302 and loc.startswith("http://%s:%d/auth?" % (HOST, provider.port)) and
                   q.get("code_challenge_method") == "S256" and q.get("client_id") == "vm-manager" and q.get("nonce"),
                   "/oauth/authorize sends a good request on to the IdP, with PKCE and a nonce of its own", loc[:300])

        # registration checks its input; a confidential client's secret is kept hashed
        for name, body, err in [
            ("an http redirect URI on a public host", {"redirect_uris": ["http://example.test/cb"]}, "invalid_redirect_uri"),
            ("a redirect URI with a fragment", {"redirect_uris": ["https://example.test/cb#x"]}, "invalid_redirect_uri"),
            ("no redirect URI", {"client_name": "x"}, "invalid_redirect_uri"),
            ("an unknown auth method", {"redirect_uris": ["https://example.test/cb"],
                                        "token_endpoint_auth_method": "private_key_jwt"}, "invalid_client_metadata"),
            ("the implicit grant", {"redirect_uris": ["https://example.test/cb"], "grant_types": ["implicit"]},
             "invalid_client_metadata"),
        ]:
            st, _, doc = call(port, "POST", "/oauth/register", body=body)
            tap.result(st == 400 and doc.get("error") == err, "registration refuses %s: %s" % (name, err),
                       "%r %r" % (st, doc))
        st, _, conf = call(port, "POST", "/oauth/register", body={
            "redirect_uris": ["https://example.test/cb", "com.example.app:/cb"], "token_endpoint_auth_method": "client_secret_basic"})
        with open(os.path.join(oauth_dir, "state.json")) as f:
            text = f.read()
        tap.result(st == 201 and conf.get("client_secret") and conf["client_secret"] not in text and
                   conf["client_id"] in text,
                   "a confidential client gets a secret, kept only as its hash", "%r %r" % (st, conf))
        st, doc = form_post(port, "/oauth/token", {"grant_type": "refresh_token", "refresh_token": "x"},
                            headers={"Authorization": "Basic " + base64.b64encode(
                                ("%s:%s" % (conf.get("client_id"), "wrong")).encode()).decode()})
        tap.result(st == 401 and doc == {"error": "invalid_client", "error_description": "wrong client secret"},
                   "a wrong client secret is invalid_client (401)", "%r %r" % (st, doc))
        st, doc = form_post(port, "/oauth/token", {"grant_type": "refresh_token", "refresh_token": "x"},
                            headers={"Authorization": "Basic " + base64.b64encode(
                                ("%s:%s" % (conf.get("client_id"), conf.get("client_secret"))).encode()).decode()})
        tap.result(st == 400 and doc.get("error") == "invalid_grant",
                   "with the right secret (client_secret_basic) the client is let in: an unknown refresh token is invalid_grant",
                   "%r %r" % (st, doc))

        # revocation of an access token
        tap.result(call(port, "GET", "/api/v1/vms", fresh)[0] == 200, "the refreshed access token works")
        status, _ = form_post(port, "/oauth/revoke", {"token": fresh, "client_id": client})
        tap.result(status == 200, "POST /oauth/revoke: 200", "status %r" % status)
        tap.check("a revoked access token is refused", lambda: is_refusal(*call(port, "GET", "/api/v1/vms", fresh), port))

        # image golden --token: the token is sent and accepted (the VM has no attestation to record)
        with open(os.path.join(work, "images", "fake_1.0.policy.json"), "w") as f:
            f.write("{}\n")
        gold = [BIN, "image", "golden", "fake_1.0", "--from-vm", out["vm"], "--server", "http://%s:%d" % (HOST, port),
                "--image-dir", os.path.join(work, "images")]
        p1 = subprocess.run(gold, capture_output=True, text=True, timeout=30, env=base_env(work))
        p2 = subprocess.run(gold + ["--token", tokens["access_token"]], capture_output=True, text=True, timeout=30,
                            env=base_env(work))
        tap.result(p1.returncode != 0 and "401" in p1.stderr and p2.returncode != 0 and "401" not in p2.stderr and
                   "no verified ready-stage quote" in p2.stderr,
                   "image golden: refused with 401 without --token, past the guard with it",
                   "without: %r\nwith: %r" % (p1.stderr[-300:], p2.stderr[-300:]))
    finally:
        d.stop()
        provider.stop()


def test_idp_down(work):
    """An issuer that accepts connections and never answers: the request waits (suspended) for the
    bounded fetch, then gets 401; meanwhile the daemon answers everything else at once."""
    hole = socket.socket()
    hole.bind((HOST, 0))
    hole.listen(16)
    issuer = "http://%s:%d" % (HOST, hole.getsockname()[1])
    port = free_port()
    keys = OidcProvider(work, "http://%s:%d/oauth/callback" % (HOST, port))  # only to mint tokens
    d = start(work, "down", port, os.path.join(work, "down-state"),
              oauth_args(port, issuer, "--sso-allow-private-ips"))
    try:
        token = keys.mint("test-ec-1", claims(keys, port, iss=issuer))
        result = {}

        def slow():
            t0 = time.monotonic()
            result["r"] = call(port, "GET", "/api/v1/vms", token, timeout=30)
            result["t"] = time.monotonic() - t0

        t = threading.Thread(target=slow, daemon=True)
        t.start()
        time.sleep(0.3)
        worst = 0.0
        while t.is_alive():
            t0 = time.monotonic()
            status = call(port, "GET", "/healthz", timeout=5)[0]
            worst = max(worst, time.monotonic() - t0)
            if status != 200:
                worst = 99
            time.sleep(0.2)
        t.join()
        ok, diag = is_refusal(*result["r"], port)
        tap.result(ok and result["t"] < 9, "an IdP that does not answer: 401 within the fetch bound",
                   "%.1f s; %s" % (result["t"], diag))
        tap.result(worst < 1.0, "the loop never blocks on the fetch: /healthz answered in %.3f s at worst" % worst)
        tap.result("Cannot fetch the keys of '%s'" % issuer in d.stderr(), "the log says why, clearly",
                   d.stderr()[-1500:])
        t0 = time.monotonic()
        r = call(port, "GET", "/api/v1/vms", token)
        tap.result(is_refusal(*r, port)[0] and time.monotonic() - t0 < 1.5,
                   "right after a failed fetch, tokens are refused at once (no pile-up)",
                   "%.1f s" % (time.monotonic() - t0))

        # a burst of bad tokens: each refused, at most 20 a second logged at info (the rest at debug)
        before = d.stderr().count('level=info msg="Refused')
        t0 = time.monotonic()
        refused = sum(call(port, "GET", "/api/v1/vms", "garbage")[0] == 401 for _ in range(80))
        took = time.monotonic() - t0
        info = d.stderr().count('level=info msg="Refused') - before
        time.sleep(1.1)
        call(port, "GET", "/api/v1/vms", "garbage")
        tap.result(refused == 80 and (info <= 20 * (int(took) + 2) and
                                      re.search(r"\d+ more requests were refused in the second before", d.stderr())
                                      or took >= 4),
                   "a burst of 80 bad tokens: all refused, at most 20 a second logged at info, the rest counted",
                   "%d refused, %d at info in %.1f s" % (refused, info, took))
    finally:
        d.stop()
        keys.stop()
        hole.close()


def test_ssrf(work):
    """Without --allow-private-oauth-urls or --sso-allow-private-ips the loopback provider is out of reach."""
    port = free_port()
    provider = OidcProvider(work, "http://%s:%d/oauth/callback" % (HOST, port))
    d = start(work, "ssrf", port, os.path.join(work, "ssrf-state"), oauth_args(port, provider.issuer))
    try:
        n0 = provider.jwks_fetches()
        r = call(port, "GET", "/api/v1/vms", provider.mint("test-ec-1", claims(provider, port)))
        tap.result(is_refusal(*r, port)[0] and provider.jwks_fetches() == n0,
                   "a token of an IdP on loopback is refused, nothing fetched from it")
        tap.result("refusing to connect to the non-public address 127.0.0.1" in d.stderr(),
                   "the log names the refused address and the flag", d.stderr()[-1200:])
    finally:
        d.stop()
        provider.stop()


def make_ca(work):
    """A CA and a certificate for 127.0.0.1 it signed: (cert, key, ca cert)."""
    d = os.path.join(work, "tls")
    os.makedirs(d)
    run_ = lambda *a: subprocess.run(a, cwd=d, check=True, capture_output=True, timeout=60)  # noqa: E731
    run_("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
         "-subj", "/CN=vm-manager test CA", "-keyout", "ca.key", "-out", "ca.pem")
    run_("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=127.0.0.1",
         "-keyout", "dex.key", "-out", "dex.csr")
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    run_("openssl", "x509", "-req", "-in", "dex.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-days", "2", "-extfile", "ext", "-out", "dex.pem")
    return os.path.join(d, "dex.pem"), os.path.join(d, "dex.key"), os.path.join(d, "ca.pem")


def tls_on_loop(d):
    """The daemon's slow loop iterations (over 50 ms) in libcurl's glue or OpenSSL: what parsing
    the CA store on the loop, once per connection, used to cost."""
    time.sleep(0.3)
    return ["%.1f ms at %s" % (e.get("usec", 0) / 1000, e.get("where")) for e in d.slow_loop_iterations()
            if any(k in " ".join(e.get("stack") or []) + (e.get("where") or "")
                   for k in ("http-curl.c", "libssl", "libcrypto", "X509"))]


def test_dex_ca(work):
    """A Dex on https with a certificate of a private CA: trusted with --dex-ca-file, not without."""
    tls = make_ca(work)
    port = free_port()
    provider = OidcProvider(work, "http://%s:%d/oauth/callback" % (HOST, port), tls=tls)
    try:
        token = provider.mint("test-ec-1", claims(provider, port))
        d = start(work, "ca", port, os.path.join(work, "ca-state"),
                  oauth_args(port, provider.issuer, "--allow-private-oauth-urls", "--dex-ca-file", tls[2]))
        try:
            status = call(port, "GET", "/api/v1/vms", token)[0]
            tap.result(status == 200, "--dex-ca-file: the JWKS of an https Dex with a private CA is fetched",
                       "status %r\n%s" % (status, d.stderr()[-1500:]))
            tap.result(not tls_on_loop(d), "... and no event loop iteration over 50 ms set up its TLS (the CA "
                       "store is built once, off the loop)", "\n".join(tls_on_loop(d)))
        finally:
            d.stop()
        d = start(work, "no-ca", port, os.path.join(work, "no-ca-state"),
                  oauth_args(port, provider.issuer, "--allow-private-oauth-urls"))
        try:
            r = call(port, "GET", "/api/v1/vms", token)
            tap.result(is_refusal(*r, port)[0] and "SSL" in d.stderr(),
                       "without --dex-ca-file the same Dex is not trusted: 401, and the log says why",
                       d.stderr()[-1500:])
            tap.result(not tls_on_loop(d), "... no event loop iteration over 50 ms set up that TLS either",
                       "\n".join(tls_on_loop(d)))
        finally:
            d.stop()
    finally:
        provider.stop()


def main():
    global NODE
    print("TAP version 13", flush=True)
    tools, why = node_tools()
    if not tools:
        print("1..0 # SKIP %s" % why, flush=True)
        return 0
    NODE = tools[0]
    ok, diag = npm_ci_cached(OIDC_DIR, CACHE_DIR)
    if not ok:
        print("not ok 1 - npm ci of oidc/ (oidc-provider, the MCP SDK)\n# %s\n1..1" % diag.replace("\n", "\n# "))
        return 1
    for name in ("provider.mjs", "flow.mjs"):
        with open(os.path.join(OIDC_DIR, name), "rb") as src, open(os.path.join(CACHE_DIR, name), "wb") as dst:
            dst.write(src.read())
    print("# %s" % diag, flush=True)
    sys.stdout.write = _no_tap_header(sys.stdout.write)
    try:
        return run([test_config, test_guard, test_kid_reuse, test_sdk_flow, test_idp_down, test_ssrf, test_dex_ca], 280, "vmm-oauth-")
    finally:
        OidcProvider.stop_all()


def _no_tap_header(write):
    """run() prints its own TAP header: print only one."""
    def w(s):
        if s.startswith("TAP version 13"):
            return len(s)
        return write(s)
    return w


if __name__ == "__main__":
    sys.exit(main())
