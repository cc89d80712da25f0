# SPDX-License-Identifier: LGPL-2.1-or-later
"""Real parts for the image push/pull tests (standard library only): Debian's docker-registry
(distribution 2.8) on 127.0.0.1 with a filesystem store, with htpasswd or token auth and with TLS;
a token server issuing the JWTs distribution checks (RS256, signed with the openssl command, the
certificate in the x5c header); an HTTP proxy that logs every exchange and can cut, stall or answer
in the registry's place; a synthetic image directory in the --image-dir layout.
"""

import base64
import ctypes
import hashlib
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vmmtest import HOST, free_port

# tools/install-deps.sh unpacks Debian's package there rather than installing it (which would start a
# registry service)
REGISTRY_BIN = shutil.which("docker-registry") or next(
    (p for p in ["/var/cache/vm-manager/docker-registry/usr/bin/docker-registry"] if os.access(p, os.X_OK)), None)
ORAS_BIN = shutil.which("oras")
HTPASSWD_BIN = shutil.which("htpasswd")
OPENSSL_BIN = shutil.which("openssl")
HERE = os.path.dirname(os.path.abspath(__file__))
POLICY_TEMPLATE = os.path.join(HERE, "..", "data", "attest", "policy.json")

# ---------------------------------------------------------------------------------------------
# the registry


def _die_with_parent():
    # PR_SET_PDEATHSIG: a test killed by meson's timeout takes its registries with it
    ctypes.CDLL(None, use_errno=True).prctl(1, 15, 0, 0, 0)


class Registry:
    """docker-registry serve on a free port, its store under work/name."""

    all = []

    def __init__(self, work, name, auth=None, tls=None):
        self.port = free_port()
        self.host = "%s:%d" % (HOST, self.port)
        self.root = os.path.join(work, name + "-store")
        self.log_path = os.path.join(work, name + ".log")
        self.tls = tls
        os.makedirs(self.root)
        lines = [
            "version: 0.1",
            "log:",
            "  level: info",
            "  accesslog:",
            "    disabled: true",
            "storage:",
            "  filesystem:",
            "    rootdirectory: %s" % self.root,
            "  delete:",
            "    enabled: true",
            "http:",
            "  addr: %s" % self.host,
            "  secret: test-secret",
        ]
        if tls:
            lines += ["  tls:", "    certificate: %s" % tls[0], "    key: %s" % tls[1]]
        if auth:
            lines += ["auth:"] + ["  " + x for x in auth]
        self.config = os.path.join(work, name + ".yml")
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([REGISTRY_BIN, "serve", self.config], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        Registry.all.append(self)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((HOST, self.port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        raise RuntimeError("docker-registry did not start: %s" % self.log())

    def log(self, tail=3000):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-tail:]

    def blob_path(self, digest):
        hexd = digest.split(":", 1)[1]
        return os.path.join(self.root, "docker/registry/v2/blobs/sha256", hexd[:2], hexd, "data")

    @classmethod
    def stop_all(cls):
        for r in cls.all:
            r.stop()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def htpasswd_auth(work, user, password):
    path = os.path.join(work, "htpasswd")
    out = subprocess.run([HTPASSWD_BIN, "-Bbn", user, password], check=True, capture_output=True, text=True)
    with open(path, "a") as f:
        f.write(out.stdout.strip() + "\n")
    return ["htpasswd:", "  realm: test-realm", "  path: %s" % path]


def make_ca(work, name="tls"):
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem)."""
    d = os.path.join(work, name)
    os.makedirs(d)
    ca_key, ca, key, csr, cert, ext = (os.path.join(d, n) for n in
                                       ("ca.key", "ca.pem", "key.pem", "req.csr", "cert.pem", "ext.cnf"))

    def run(*args):
        subprocess.run([OPENSSL_BIN] + list(args), check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
        "-subj", "/CN=vm-manager test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
        "-extfile", ext)
    return ca, cert, key


# ---------------------------------------------------------------------------------------------
# a token server for distribution's token auth


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class TokenServer:
    """GET /token?service=&scope=…: a JWT for the scopes the user may have. users: {name: password};
    anonymous users get pull only when anonymous_pull is set. Every request is logged as
    (user or None, [scopes], authorization header seen)."""

    SERVICE = "test-registry"
    ISSUER = "test-issuer"

    def __init__(self, work, users, anonymous_pull=True):
        self.users = users
        self.anonymous_pull = anonymous_pull
        self.requests = []
        d = os.path.join(work, "token")
        os.makedirs(d)
        self.key = os.path.join(d, "key.pem")
        self.cert = os.path.join(d, "cert.pem")
        subprocess.run([OPENSSL_BIN, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.key,
                        "-out", self.cert, "-days", "2", "-subj", "/CN=token"], check=True, capture_output=True)
        der = subprocess.run([OPENSSL_BIN, "x509", "-in", self.cert, "-outform", "DER"], check=True,
                             capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.handle(self)

        self.httpd = ThreadingHTTPServer((HOST, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.realm = "http://%s:%d/token" % (HOST, self.port)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def registry_auth(self):
        return ["token:", "  realm: %s" % self.realm, "  service: %s" % self.SERVICE, "  issuer: %s" % self.ISSUER,
                "  rootcertbundle: %s" % self.cert]

    def sign(self, claims):
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        signing_input = (b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())).encode()
        sig = subprocess.run([OPENSSL_BIN, "dgst", "-sha256", "-sign", self.key], input=signing_input,
                             check=True, capture_output=True).stdout
        return signing_input.decode() + "." + b64url(sig)

    def handle(self, h):
        q = urllib.parse.urlparse(h.path)
        params = urllib.parse.parse_qs(q.query)
        authz = h.headers.get("Authorization")
        user = None
        if authz:
            if not authz.startswith("Basic "):
                return self.reply(h, 401, {"details": "basic only"})
            name, _, password = base64.b64decode(authz[6:]).decode().partition(":")
            if self.users.get(name) != password:
                self.requests.append((name, params.get("scope", []), authz))
                return self.reply(h, 401, {"details": "wrong password"})
            user = name
        self.requests.append((user, params.get("scope", []), authz))
        if user is None and not self.anonymous_pull:
            return self.reply(h, 401, {"details": "anonymous access is off"})
        access = []
        for scope in params.get("scope", []):
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            allowed = [a for a in actions.split(",") if a == "pull" or (a == "push" and user)]
            access.append({"type": kind, "name": name, "actions": allowed})
        now = int(time.time())
        token = self.sign({"iss": self.ISSUER, "sub": user or "", "aud": params.get("service", [""])[0],
                           "exp": now + 300, "nbf": now - 10, "iat": now, "jti": "%x" % random.getrandbits(64),
                           "access": access})
        self.reply(h, 200, {"token": token, "expires_in": 300})

    @staticmethod
    def reply(h, status, doc):
        body = json.dumps(doc).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def stop(self):
        self.httpd.shutdown()


# ---------------------------------------------------------------------------------------------
# a logging, cutting proxy


class Exchange:
    def __init__(self, method, path, headers):
        self.method = method
        self.path = path
        self.headers = headers  # lower-case names
        self.sent = 0  # request body bytes that reached the registry
        self.status = None
        self.received = 0  # response body bytes that reached the client
        self.cut = False

    def __repr__(self):
        return "%s %s -> %s (%d up, %d down%s)" % (self.method, self.path[:90], self.status, self.sent,
                                                   self.received, ", cut" if self.cut else "")


def _read_head(sock, buf):
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None, buf
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _headers(lines):
    out = {}
    for line in lines:
        k, _, v = line.partition(":")
        out[k.strip().lower()] = v.strip()
    return out


class Proxy:
    """Forwards 127.0.0.1:port to the registry, one upstream connection per client connection, and
    keeps an Exchange per request. rules: a list of functions rule(exchange, phase) called with phase
    'request' (headers known) and returning None or an action dict:
      {"cut_request_after": n}   forward n bytes of the request body, then close both sides
      {"cut_response_after": n}  forward n bytes of the response body, then close both sides
      {"stall_response_after": n, "event": threading.Event}  stop after n bytes until the event is set
      {"trickle_response_after": n}  after n bytes, one byte a second (until the client goes away)
      {"answer": (status, headers dict, body)}  answer in the registry's place
    A rule fires once (it returns an action the first time it wants to)."""

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.exchanges = []
        self.rules = []
        self.lock = threading.Lock()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind((HOST, 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        self.host = "%s:%d" % (HOST, self.port)
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self):
        with self.lock:
            self.exchanges = []
            self.rules = []

    def log(self):
        with self.lock:
            return list(self.exchanges)

    def _accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _action(self, ex):
        with self.lock:
            for rule in list(self.rules):
                a = rule(ex)
                if a:
                    self.rules.remove(rule)
                    return a
        return None

    def _serve(self, client):
        up = None
        buf = b""
        try:
            while True:
                head, buf = _read_head(client, buf)
                if head is None:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = _headers(lines[1:])
                ex = Exchange(method, path, headers)
                with self.lock:
                    self.exchanges.append(ex)
                action = self._action(ex) or {}
                length = int(headers.get("content-length", "0") or 0)
                if "answer" in action:
                    # drain the body, answer ourselves
                    while len(buf) < length:
                        chunk = client.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    buf = buf[length:]
                    status, hdrs, body = action["answer"]
                    ex.status = status
                    out = "HTTP/1.1 %d X\r\n" % status
                    hdrs = dict(hdrs)
                    hdrs.setdefault("Content-Length", str(len(body)))
                    for k, v in hdrs.items():
                        out += "%s: %s\r\n" % (k, v)
                    client.sendall(out.encode() + b"\r\n" + (b"" if method == "HEAD" else body))
                    ex.received = len(body)
                    continue
                if up is None:
                    up = socket.create_connection((HOST, self.upstream))
                up.sendall(head + b"\r\n\r\n")
                expect = headers.get("expect", "").lower() == "100-continue"
                upbuf = b""
                if expect:
                    # the registry answers 100 (or a final status) before the body
                    rhead, upbuf = _read_head(up, upbuf)
                    if rhead is None:
                        return
                    if b" 100 " in rhead.split(b"\r\n")[0] + b" ":
                        client.sendall(rhead + b"\r\n\r\n")
                    else:
                        self._relay_response(client, up, ex, rhead, upbuf, action)
                        # the client will not send the body now
                        continue
                # the body
                left = length - min(length, len(buf))
                body_now, buf = buf[:length], buf[length:]
                limit = action.get("cut_request_after")
                if limit is not None:
                    part = body_now[:limit]
                    up.sendall(part)
                    ex.sent += len(part)
                    while ex.sent < limit and left > 0:
                        chunk = client.recv(min(65536, left))
                        if not chunk:
                            break
                        left -= len(chunk)
                        part = chunk[:limit - ex.sent]
                        up.sendall(part)
                        ex.sent += len(part)
                    ex.cut = True
                    return
                up.sendall(body_now)
                ex.sent += len(body_now)
                while left > 0:
                    chunk = client.recv(min(1 << 20, left))
                    if not chunk:
                        return
                    up.sendall(chunk)
                    ex.sent += len(chunk)
                    left -= len(chunk)
                rhead, upbuf = _read_head(up, upbuf)
                if rhead is None:
                    return
                if not self._relay_response(client, up, ex, rhead, upbuf, action):
                    return
        except OSError:
            return
        finally:
            for s in (client, up):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass

    def _relay_response(self, client, up, ex, rhead, upbuf, action):
        lines = rhead.decode("latin-1").split("\r\n")
        ex.status = int(lines[0].split(" ")[1])
        headers = _headers(lines[1:])
        length = 0 if ex.method == "HEAD" or ex.status in (204, 304) else int(headers.get("content-length", "0") or 0)
        client.sendall(rhead + b"\r\n\r\n")
        cut = action.get("cut_response_after")
        stall = action.get("stall_response_after")
        trickle = action.get("trickle_response_after")
        left = length
        pending = upbuf[:length]
        while True:
            if pending:
                if cut is not None and ex.received + len(pending) > cut:
                    pending = pending[:cut - ex.received]
                    client.sendall(pending)
                    ex.received += len(pending)
                    ex.cut = True
                    return False
                if stall is not None and ex.received + len(pending) > stall:
                    first = pending[:stall - ex.received]
                    client.sendall(first)
                    ex.received += len(first)
                    pending = pending[len(first):]
                    action["event"].wait()
                    stall = None
                if trickle is not None and ex.received + len(pending) > trickle:
                    first = pending[:max(0, trickle - ex.received)]
                    client.sendall(first)
                    ex.received += len(first)
                    left -= len(first)
                    pending = pending[len(first):]
                    while pending:
                        time.sleep(1)
                        client.sendall(pending[:1])  # raises once the client is gone
                        ex.received += 1
                        left -= 1
                        pending = pending[1:]
                    if left <= 0:
                        return True
                    pending = up.recv(min(1 << 20, left))
                    if not pending:
                        return False
                    continue
                client.sendall(pending)
                ex.received += len(pending)
                left -= len(pending)
            if left <= 0:
                return True
            pending = up.recv(min(1 << 20, left))
            if not pending:
                return False

    def close(self):
        self.srv.close()


def blob_rule(digest, method="GET", **action):
    """A rule for the first request on the blob with this digest."""
    def rule(ex):
        if ex.method == method and ex.path.split("?")[0].endswith("/blobs/" + digest):
            return dict(action)
        return None
    return rule


def nth_rule(method, n, **action):
    """A rule for the n-th (1-based) request with this method."""
    seen = [0]

    def rule(ex):
        if ex.method == method:
            seen[0] += 1
            if seen[0] == n:
                return dict(action)
        return None
    return rule


# ---------------------------------------------------------------------------------------------
# registry requests by hand (for crafted artifacts)


def reg_request(host, method, path, body=None, headers=None):
    h, _, p = host.partition(":")
    conn = http.client.HTTPConnection(h, int(p), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def sha256(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def put_blob(host, repo, data):
    status, headers, _ = reg_request(host, "POST", "/v2/%s/blobs/uploads/" % repo)
    assert status == 202, status
    loc = urllib.parse.urlparse(headers["location"])
    d = sha256(data)
    path = loc.path + "?" + (loc.query + "&" if loc.query else "") + "digest=" + urllib.parse.quote(d)
    status, _, body = reg_request(host, "PUT", path, body=data, headers={"Content-Type": "application/octet-stream"})
    assert status == 201, (status, body)
    return d


def put_manifest(host, repo, tag, doc):
    body = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
    status, headers, out = reg_request(host, "PUT", "/v2/%s/manifests/%s" % (repo, tag), body=body,
                                headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    return status, out, sha256(body)


def get_manifest(host, repo, ref):
    status, headers, body = reg_request(host, "GET", "/v2/%s/manifests/%s" % (repo, ref),
                                 headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    assert status == 200, (status, body)
    return json.loads(body), body


# ---------------------------------------------------------------------------------------------
# synthetic images


def _random(seed, n):
    r = random.Random(seed)
    return r.randbytes(n)


def make_image(d, ref="giantswarm-vm-base_1.0", gen="a", kube="1.31.4", raw_mb=4, golden=False,
               policy_name="policy.json", manifest_name="manifest.json"):
    """An image of the --image-dir layout, every file of it marked with gen. The disk has a hole of
    raw_mb/2 MiB of zeros in the middle (as a real disk image has)."""
    image_id, _, version = ref.rpartition("_")
    os.makedirs(os.path.join(d, "sysupdate", "base"), exist_ok=True)
    os.makedirs(os.path.join(d, "sysupdate", "kubernetes"), exist_ok=True)
    with open(os.path.join(d, ref + ".efi"), "wb") as f:
        f.write(b"MZ" + gen.encode() + _random(ref + gen + "efi", 1 << 20))
    half = (raw_mb << 20) // 4
    with open(os.path.join(d, ref + ".raw"), "wb") as f:
        f.write(gen.encode() + _random(ref + gen + "raw", half) + b"\0" * (2 * half) + _random(gen, half))
    with open(POLICY_TEMPLATE) as f:
        policy = json.load(f)
    policy["image_id"], policy["image_version"], policy["uki"] = image_id, version, ref + ".efi"
    policy["gen"] = gen
    if not golden:
        policy.pop("golden")
        policy.pop("golden_firmware")
    with open(os.path.join(d, policy_name), "w") as f:
        json.dump(policy, f, indent=2)
    with open(os.path.join(d, manifest_name), "w") as f:
        json.dump({"image": ref, "gen": gen}, f)
    base = os.path.join(d, "sysupdate", "base")
    for name in os.listdir(base):
        p = os.path.join(base, name)
        shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
    root = "%s_%s.root.raw" % (ref, "0f0e0d0c-0b0a-4908-8706-050403020100")
    with open(os.path.join(base, root), "wb") as f:
        f.write(_random(ref + gen + "root", 600 << 10))
    # a path longer than a ustar header holds (pax), and a name longer than 100 (ustar prefix)
    deep = os.path.join(base, "d" * 120, "e" * 120)
    os.makedirs(deep)
    with open(os.path.join(deep, "f" * 30), "w") as f:
        f.write(gen)
    with open(os.path.join(base, "n" * 110), "w") as f:
        f.write(gen)
    with open(os.path.join(base, "SHA256SUMS"), "w") as f:
        f.write("%s  %s\n" % (hashlib.sha256(open(os.path.join(base, root), "rb").read()).hexdigest(), root))
    with open(os.path.join(base, "SHA256SUMS.gpg"), "wb") as f:
        f.write(b"signature " + gen.encode())
    kdir = os.path.join(d, "sysupdate", "kubernetes")
    for name in os.listdir(kdir):
        os.unlink(os.path.join(kdir, name))
    kraw = "kubernetes_%s.raw" % kube
    with open(os.path.join(kdir, kraw), "wb") as f:
        f.write(_random(kube + gen, 300 << 10))
    with open(os.path.join(kdir, "SHA256SUMS"), "w") as f:
        f.write("%s  %s\n" % (hashlib.sha256(open(os.path.join(kdir, kraw), "rb").read()).hexdigest(), kraw))
    with open(os.path.join(kdir, "SHA256SUMS.gpg"), "wb") as f:
        f.write(b"signature " + gen.encode())
    return ref
