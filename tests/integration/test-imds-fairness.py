#!/usr/bin/env python3
"""One guest must not hold up the others (issue 17, F12 and F13), checked through the VMs' own
IMDS listeners (<vm>/imds.sock, as the gateway delivers a guest's connections) on the fake QEMU:

  * while an 8 MiB report upload is parsed and stored, /healthz, another VM's IMDS and the
    uploading VM's other IMDS requests are answered, all before the upload's own answer;
  * a second upload of a VM whose first is still in flight gets 429 with Retry-After, before its
    body is read (one that never sends its body is answered all the same), and an upload beyond the daemon-wide number in flight 503 with Retry-After;
  * a VM deleted while its upload is processed leaves no directory behind;
  * GET /vms/{id}/report sends the stored upload as it is;
  * after a restart the daemon answers while the stored reports are mapped again;
  * 4,200 connections held on one VM's listener (beyond the 4,096 the server takes in all): that
    VM's connections beyond its own limit are closed, another VM still answers, and once the
    held connections close the VM answers again;
  * a connection that stays idle is closed by the server;
  * a sysupdate file read slowly, for longer than the 30 s a request gets, arrives whole, while a
    reader that stops reading is closed after the idle timeout; the daemon idles afterwards.
"""

import json
import os
import resource
import socket
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (Daemon, HOST, api, base_env, fake_image_dir, free_port, http_request, imds_request,  # noqa: E402
                     run, tap, wait_state)

FAKES = os.path.join(here, "fakes")
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False, "wait_for": "none"}
PER_VM = 16          # IMDS_VM_CONNECTIONS_MAX
IDLE_TIMEOUT = 15    # IMDS_IDLE_TIMEOUT, seconds
UPLOADS_MAX = 4      # VM_REPORT_UPLOADS_MAX
HELD = 4200          # more than the server's 4,096 connections in all
REQUEST_TIMEOUT = 30  # IMDS_REQUEST_TIMEOUT, seconds


def big_report():
    """A valid systemd-report just under 8 MiB with 128,000 values (the limits are 8 MiB and
    131,072): the costliest upload a guest can make."""
    n = 32000
    pad = "x" * ((8 * 1024 * 1024 - 4096) // n - 90)
    doc = {"mediaType": "application/vnd.io.systemd.report", "timestamp": "Sun 2026-11-29 12:00:00 UTC",
           "metrics": [{"name": "io.systemd.Unit.ActiveState", "object": "unit-%06d-%s.service" % (k, pad),
                        "value": "active"} for k in range(n)]}
    body = json.dumps(doc, separators=(",", ":")).encode()
    assert len(body) <= 8 << 20, len(body)
    return body


class Upload:
    """An upload on its own connection whose answer is awaited by a thread: .answered_at is the
    monotonic time the answer arrived, .status its status (None: closed without one)."""

    def __init__(self, sock_path, body, background=False):
        """Returns once the body is sent, or at once with background (the body is then sent by the
        thread)."""
        self.status = self.answered_at = None
        self.headers = {}
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(120)
        self.s.connect(sock_path)
        self.request = (b"POST /giantswarm/v1/report HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n"
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        if not background:
            self.s.sendall(self.request)
        self.t = threading.Thread(target=self._read, args=(background,), daemon=True)
        self.t.start()

    def _read(self, send):
        data = b""
        try:
            if send:
                self.s.sendall(self.request)
            while True:
                chunk = self.s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        self.answered_at = time.monotonic()
        self.s.close()
        head = data.partition(b"\r\n\r\n")[0].decode(errors="replace").split("\r\n")
        if head and head[0].startswith("HTTP/"):
            self.status = int(head[0].split()[1])
            self.headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in head[1:])}

    def wait(self, timeout=120):
        self.t.join(timeout)
        return self.status


def imds(sock, path):
    """(status, payload) of a GET on a VM's listener; (None, why) when the connection closed
    without an answer."""
    try:
        status, _, payload = imds_request(sock, "GET", "/giantswarm/v1" + path, timeout=10)
        return status, payload
    except (OSError, IndexError, ValueError) as e:
        return None, repr(e)


def start(work, name, state_of=None):
    """A daemon on the state directory of name (or of state_of, to start one again)."""
    images, vars_ = fake_image_dir(work)
    env = base_env(work, FAKE_QEMU="install-exit:0")
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    state = os.path.join(work, "state-" + (state_of or name))
    port = free_port()
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                            "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process"], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "%s: serving with the fake QEMU" % name, why)
    return d, port, state, ok


def create_vms(port, state, names):
    """{name: (id, imds.sock)} once each is booting (its listener stands)."""
    vms = {}
    for name in names:
        status, vm = api(port, "POST", "/vms", dict(CREATE, name=name, hostname=name))
        if status != 201:
            tap.result(False, "create_vm %s" % name, repr(vm)[:300])
            return None
        vms[name] = (vm["id"], os.path.join(state, "vms", vm["id"], "imds.sock"))
    for name, (vid, sock) in vms.items():
        vm = wait_state(port, vid, ("booting",), 60, 0.1)
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not (vm and vm.get("state") == "booting" and os.path.exists(sock)):
            tap.result(False, "%s boots and has its IMDS listener" % name, repr(vm)[:300])
            return None
    tap.result(True, "VMs %s booting, each with its IMDS listener" % ", ".join(names))
    return vms


def healthz(port):
    try:
        return http_request(port, "GET", "/healthz", timeout=10)[0]
    except OSError as e:
        return repr(e)


def test_uploads(work):
    d, port, state, ok = start(work, "uploads")
    if not ok:
        return
    vms = create_vms(port, state, ["up-a", "up-b", "up-c", "up-d", "up-e", "up-f"])
    if not vms:
        return
    body = big_report()
    a, b = vms["up-a"][1], vms["up-b"][1]

    # the loop answers while the upload is parsed: every probe sent after the body went out is
    # answered before the upload is
    up = Upload(a, body)
    probes = []
    for _ in range(5):
        probes.append(("/healthz", healthz(port), 200))
        probes.append(("VM B /hostname", imds(b, "/hostname"), (200, b"up-b")))
        probes.append(("VM A /hostname", imds(a, "/hostname"), (200, b"up-a")))
    probes_done = time.monotonic()
    # a second upload of the same VM, the first still in flight
    second = Upload(a, json.dumps({"metrics": []}).encode())
    # a third announces 8 MiB and sends none of it: refused on its headers, without the body
    early = socket.socket(socket.AF_UNIX)
    early.settimeout(10)
    early.connect(a)
    early.sendall(b"POST /giantswarm/v1/report HTTP/1.1\r\nHost: 169.254.169.254\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    t0, got = time.monotonic(), b""
    try:
        while True:
            chunk = early.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError as e:
        got += repr(e).encode()
    took = time.monotonic() - t0
    early.close()
    second.wait()
    up.wait()
    bad = [p for p in probes if p[1] != p[2]]
    tap.result(not bad, "while VM A's 8 MiB report is processed, /healthz and both VMs' IMDS answer", repr(bad)[:400])
    tap.result(up.status == 204 and up.answered_at is not None and probes_done < up.answered_at,
               "... all 15 of them before the upload's own answer (204)",
               "upload %r, answered %.3f s after the last probe" % (
                   up.status, (up.answered_at or 0) - probes_done))
    tap.result(second.status == 429 and second.headers.get("retry-after") == "1"
               and second.answered_at < up.answered_at,
               "a second upload of VM A while the first is in flight: 429 with Retry-After: 1, at once",
               "%r %r" % (second.status, second.headers))
    tap.result(got.startswith(b"HTTP/1.1 429") and b"\r\nRetry-After: 1\r\n" in got and took < 5,
               "... and one whose body is not sent at all: 429 on its headers, the connection closed, in %.2f s"
               % took, repr(got[:300]))
    status, m = api(port, "GET", "/vms/%s/metrics" % vms["up-a"][0])
    g = (m or {}).get("guest") or {}
    tap.result(status == 200 and g.get("series") == 32000 and g.get("series_exported") == 1000,
               "the upload is mapped: 32,000 entries, 1,000 exported", repr(g)[:300])
    # read back as stored, not parsed and re-encoded on the loop
    status, headers, data = http_request(port, "GET", "/api/v1/vms/%s/report" % vms["up-a"][0], timeout=60)
    tap.result(status == 200 and headers.get("content-type") == "application/json" and data == body,
               "GET /vms/{id}/report: the 8 MiB upload byte for byte, as application/json",
               "%r %r %d bytes" % (status, headers.get("content-type"), len(data)))

    # six VMs upload at once: the bodies arrive interleaved, so they are complete at about the
    # same time, and those beyond the daemon-wide number in flight are refused
    ups = [Upload(vms[n][1], body, background=True) for n in sorted(vms)]
    statuses = [u.wait() for u in ups]
    busy = [u for u in ups if u.status == 503]
    tap.result(busy and all(u.headers.get("retry-after") == "1" for u in busy)
               and statuses.count(204) >= UPLOADS_MAX and statuses.count(204) + len(busy) == len(ups),
               "six VMs uploading 8 MiB at once: at least %d stored (204), the others 503 with Retry-After: 1"
               % UPLOADS_MAX, repr(statuses))
    if busy:
        refused_vm = sorted(vms)[statuses.index(503)]
        status = Upload(vms[refused_vm][1], json.dumps({"metrics": []}).encode()).wait()
        tap.result(status == 204, "... and a refused VM's next upload is taken", repr(status))

    # a VM deleted while its upload is processed
    vid, sock = vms["up-f"]
    up = Upload(sock, body)
    healthz(port)
    status, _ = api(port, "DELETE", "/vms/" + vid, timeout=60)
    up.wait()
    vm_dir = os.path.join(state, "vms", vid)
    tap.result(status in (200, 204) and up.status is not None and not os.path.exists(vm_dir),
               "a VM deleted while its upload is processed: deleted, the upload answered (%r), its directory "
               "gone" % up.status,
               "delete %r, left: %r" % (status, os.listdir(vm_dir) if os.path.exists(vm_dir) else None))
    tap.result(healthz(port) == 200, "... and the daemon serves on", "")

    # a restart maps the stored reports again off the loop: the daemon answers before they are
    # all back, and says so for those still waiting
    del vms["up-f"]
    stored = [Upload(sock, body).wait() for _, sock in vms.values()]
    tap.result(stored == [204] * len(vms), "an 8 MiB report stored for each of %d VMs" % len(vms), repr(stored))
    rc, _ = d.stop(timeout=60)
    tap.result(rc == 0, "the daemon stops cleanly", rc)
    d, port, _, ok = start(work, "uploads-again", state_of="uploads")
    if not ok:
        return
    notes = [api(port, "GET", "/vms/%s/metrics" % vid)[1].get("note") for vid, _ in vms.values()]
    loading = "the guest's stored report is being mapped again after a restart; its series follow"
    tap.result(loading in notes, "right after a restart, /healthz and get_vm_metrics answer while the stored "
               "reports are mapped again: the note says so", repr(notes))
    deadline = time.monotonic() + 120
    mapped = []
    while time.monotonic() < deadline:
        mapped = [(api(port, "GET", "/vms/%s/metrics" % vid)[1].get("guest") or {}).get("series")
                  for vid, _ in vms.values()]
        if mapped == [32000] * len(vms):
            break
        time.sleep(0.1)
    tap.result(mapped == [32000] * len(vms), "... and then all %d are back" % len(vms), repr(mapped))
    rc, _ = d.stop(timeout=60)
    tap.result(rc == 0, "the daemon stops cleanly", rc)


def raise_fd_limit(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want and (hard == resource.RLIM_INFINITY or hard >= want):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_connections(work):
    # the test holds the connections and the daemon (which inherits the limit) accepts them
    limit = raise_fd_limit(HELD + 512)
    d, port, state, ok = start(work, "connections")
    if not ok:
        return
    vms = create_vms(port, state, ["conn-a", "conn-b"])
    if not vms:
        return
    a, b = vms["conn-a"][1], vms["conn-b"][1]
    n = HELD if limit >= HELD + 512 else max(PER_VM + 8, limit - 256)
    if n < HELD:
        tap.diag("RLIMIT_NOFILE is %d: holding %d connections instead of %d" % (limit, n, HELD))

    held, refused = [], 0
    try:
        deadline = time.monotonic() + 60
        while len(held) < n and time.monotonic() < deadline:
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            try:
                s.connect(a)
            except BlockingIOError:
                # the listener's backlog is full until the daemon accepts: again
                s.close()
                time.sleep(0.001)
                continue
            held.append(s)
        # the daemon closes VM A's connections beyond its limit: they read EOF
        time.sleep(1)
        open_ = 0
        for s in held:
            try:
                open_ += s.recv(1) != b""
            except BlockingIOError:
                open_ += 1
            except OSError:
                pass
        refused = n - open_
        tap.result(open_ == PER_VM, "%d connections on VM A's listener: %d stay open, the other %d are closed"
                   % (n, PER_VM, n - PER_VM), "open: %d" % open_)
        status, payload = imds(b, "/hostname")
        tap.result(status == 200 and payload == b"conn-b", "meanwhile VM B's /hostname answers", "%r %r" % (status, payload))
        status, payload = imds(a, "/hostname")
        tap.result(status == 200 and payload == b"conn-a",
                   "... and VM A's next request is served: the idlest of its held connections made room",
                   "%r %r" % (status, payload))
        tap.result(healthz(port) == 200, "... and /healthz answers", "")
    finally:
        for s in held:
            s.close()

    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        status, payload = imds(a, "/hostname")
        if status == 200:
            break
        time.sleep(0.1)
    tap.result(status == 200 and payload == b"conn-a", "once they are closed, VM A answers again",
               "%r after %d refused" % (status, refused))

    # an idle connection is cut
    s = socket.socket(socket.AF_UNIX)
    s.connect(b)
    s.settimeout(IDLE_TIMEOUT + 10)
    t0 = time.monotonic()
    try:
        got = s.recv(1)
    except OSError as e:
        got = repr(e)
    waited = time.monotonic() - t0
    s.close()
    tap.result(got == b"" and waited < IDLE_TIMEOUT + 5,
               "an idle connection is closed by the server after about %d s (%.1f s)" % (IDLE_TIMEOUT, waited),
               repr(got))
    rc, _ = d.stop(timeout=60)
    tap.result(rc == 0, "the daemon stops cleanly", rc)


def cpu_seconds(pid):
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sysupdate_get(sock, path, rcvbuf):
    s = socket.socket(socket.AF_UNIX)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(IDLE_TIMEOUT + 20)
    s.connect(sock)
    s.sendall(b"GET /giantswarm/v1/sysupdate/%s HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n"
              % path.encode())
    return s


def read_paced(s, rate, stall_after=None, stall=0):
    """All a connection sends, read at about rate bytes a second (after stall_after bytes, nothing
    is read for stall seconds): (bytes, how it ended)."""
    data, t0, how = bytearray(), time.monotonic(), "eof"
    stalled = False
    while True:
        try:
            chunk = s.recv(16384)
        except OSError as e:
            how = repr(e)
            break
        if not chunk:
            break
        data += chunk
        if stall_after is not None and not stalled and len(data) >= stall_after:
            stalled = True
            time.sleep(stall)
        ahead = len(data) / rate - (time.monotonic() - t0)
        if ahead > 0 and not stalled:
            time.sleep(ahead)
    s.close()
    return bytes(data), how


def test_slow_reader(work):
    """A guest's systemd-sysupdate pulls a big file through a slow network: the file must arrive
    whole however long that takes, and a reader that stops must not hold its connection."""
    images, _ = fake_image_dir(work)
    component = os.path.join(images, "sysupdate", "kubernetes")
    os.makedirs(component, exist_ok=True)
    size = 40 << 20
    block = os.urandom(1 << 20)
    with open(os.path.join(component, "kubernetes_1.0.raw"), "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
    d, port, state, ok = start(work, "slow")
    if not ok:
        return
    vms = create_vms(port, state, ["slow-a"])
    if not vms:
        return
    sock = vms["slow-a"][1]
    # 40 MiB at 1.1 MiB/s: about 36 s, longer than a request is given
    got = {}
    t_slow = threading.Thread(target=lambda: got.update(
        slow=read_paced(sysupdate_get(sock, "kubernetes/kubernetes_1.0.raw", 65536), 1.1 * (1 << 20))))
    t_stall = threading.Thread(target=lambda: got.update(
        stall=read_paced(sysupdate_get(sock, "kubernetes/kubernetes_1.0.raw", 65536), 4 << 20,
                         stall_after=1 << 20, stall=IDLE_TIMEOUT + 10)))
    t0 = time.monotonic()
    t_slow.start()
    t_stall.start()
    t_slow.join()
    took = time.monotonic() - t0
    t_stall.join()
    data, how = got["slow"]
    head, _, body = data.partition(b"\r\n\r\n")
    whole = head.startswith(b"HTTP/1.1 200") and len(body) == size and body == block * (size >> 20)
    tap.result(whole and took > REQUEST_TIMEOUT,
               "a sysupdate file read slowly for %.0f s (more than the %d s a request gets) arrives whole"
               % (took, REQUEST_TIMEOUT), "%s: %d of %d bytes, %r" % (head[:40], len(body), size, how))
    data, how = got["stall"]
    body = data.partition(b"\r\n\r\n")[2]
    tap.result(len(body) < size, "a reader that stops reading is closed after the idle timeout",
               "%d of %d bytes, %r" % (len(body), size, how))
    time.sleep(1)
    before = cpu_seconds(d.pid)
    time.sleep(5)
    spent = cpu_seconds(d.pid) - before
    tap.result(spent < 0.5, "the daemon idles once the transfers ended (%.2f s of CPU in 5 s)" % spent, "")
    rc, _ = d.stop(timeout=60)
    tap.result(rc == 0, "the daemon stops cleanly", rc)


if __name__ == "__main__":
    sys.exit(run([test_uploads, test_connections, test_slow_reader], 400, "vmm-imds-fair-"))
