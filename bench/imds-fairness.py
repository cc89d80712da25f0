#!/usr/bin/env python3
"""Fairness between guests on the metadata service (issue 17, item 6), on the fake QEMU of
tests/integration/fakes: /healthz and another VM's IMDS latency, measured side by side

  idle     nothing else happening (the baseline);
  uploads  VM A uploads valid 8 MiB reports back to back, on one connection, then on four
           that ignore Retry-After (a guest that floods);
  report   a REST client reads VM A's stored 8 MiB report back to back (GET /vms/{id}/report);
  held     VM A holds 4,200 idle connections on its listener (more than the 4,096 the metadata
           server takes in all);

and then a restart with 50 VMs that each have an 8 MiB report stored: how long until /healthz
answers, until every report is mapped again, and /healthz while they are.

The probe sends, every 10 ms, GET /healthz on a new TCP connection and GET /hostname on a new
connection to VM B's listener (and to VM A's, reported apart), and records each latency; a
request without an answer within 5 s counts as failed. Prints markdown for docs/benchmarks.md.

  usage: bench/imds-fairness.sh [path/to/vm-manager]   (DURATION=15 HELD=4200 STORED=50)
"""

import http.client
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests/integration"))
from vmmtest import fake_image_dir, imds_request  # noqa: E402
DURATION = float(os.environ.get("DURATION", "15"))
HELD = int(os.environ.get("HELD", "4200"))
STORED = int(os.environ.get("STORED", "50"))
PROBE_TIMEOUT = 5.0


def report_body():
    """A valid systemd-report just under 8 MiB with 128,000 values (the limits: 8 MiB, 131,072)."""
    n = 32000
    pad = "x" * ((8 * 1024 * 1024 - 4096) // n - 90)
    doc = {"mediaType": "application/vnd.io.systemd.report", "timestamp": "Sun 2026-11-29 12:00:00 UTC",
           "metrics": [{"name": "io.systemd.Unit.ActiveState", "object": "unit-%06d-%s.service" % (k, pad),
                        "value": "active"} for k in range(n)]}
    return json.dumps(doc, separators=(",", ":")).encode()


class Daemon:
    def __init__(self, binary, work):
        self.binary, self.work = binary, work
        self.state = os.path.join(work, "state")
        self.images, self.vars = fake_image_dir(work)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.env = dict(os.environ, PATH=os.path.join(ROOT, "tests/integration/fakes") + ":" + os.environ["PATH"],
                        FAKE_QEMU="install-exit:0", HOME=work)
        self.proc = None

    def start(self):
        """Starts the daemon; returns the seconds until /healthz answered."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--listen", "127.0.0.1:%d" % self.port, "--state-dir", self.state,
             "--image-dir", self.images, "--ovmf-code", self.vars, "--ovmf-vars", self.vars,
             "--launcher", "process", "--log-level", "error"], env=self.env, stdin=subprocess.DEVNULL)
        while time.monotonic() - t0 < 300:
            if healthz(self.port) is not None:
                return time.monotonic() - t0
            time.sleep(0.01)
        raise SystemExit("bench: the daemon did not answer /healthz")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def api(self, method, path, body=None):
        req = urllib.request.Request("http://127.0.0.1:%d/api/v1%s" % (self.port, path), method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)

    def create_vms(self, names):
        ids = {}
        for name in names:
            ids[name] = self.api("POST", "/vms", {"name": name, "hostname": name, "memory_mib": 512, "disk_gib": 1,
                                                  "require_attestation": False, "wait_for": "none"})["id"]
        for name, vid in ids.items():
            deadline = time.monotonic() + 120
            while self.api("GET", "/vms/" + vid)["state"] != "booting" or not os.path.exists(self.sock(vid)):
                if time.monotonic() > deadline:
                    raise SystemExit("bench: VM %s did not boot" % name)
                time.sleep(0.05)
        return ids

    def sock(self, vid):
        return os.path.join(self.state, "vms", vid, "imds.sock")


def healthz(port):
    """Seconds for GET /healthz on a new connection, or None without an answer."""
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
        c.request("GET", "/healthz")
        ok = c.getresponse().status == 200
        c.close()
    except OSError:
        return None
    return time.perf_counter() - t0 if ok else None


def imds_get(sock_path, path, timeout=PROBE_TIMEOUT):
    """Seconds for a GET on a VM's listener, or None without a 200."""
    t0 = time.perf_counter()
    try:
        status = imds_request(sock_path, "GET", "/giantswarm/v1" + path, timeout=timeout)[0]
    except (OSError, IndexError, ValueError):  # closed without an answer
        return None
    return time.perf_counter() - t0 if status == 200 else None


def upload(sock_path, body):
    """The status of one report upload (0 without an answer)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(120)
    try:
        s.connect(sock_path)
        try:
            s.sendall(b"POST /giantswarm/v1/report HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass  # refused on its headers (429) and closed before the body went out: the answer is there
        data = s.recv(4096)
        return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    except (OSError, ValueError, IndexError):
        return 0
    finally:
        s.close()


def flooder(sock_path, body, stop_at, results):
    counts = {}
    while time.monotonic() < stop_at:
        st = upload(sock_path, body)
        counts[st] = counts.get(st, 0) + 1
    results.put(counts)


def reader(port, vid, stop_at, results):
    n = 0
    while time.monotonic() < stop_at:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("GET", "/api/v1/vms/%s/report" % vid)
        r = c.getresponse()
        r.read()
        c.close()
        n += r.status == 200
    results.put(n)


def holder(sock_path, n, ready, done):
    held = []
    while len(held) < n:
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(sock_path)
        except BlockingIOError:  # the backlog is full until the daemon accepts
            s.close()
            time.sleep(0.0005)
            continue
        held.append(s)
    ready.set()
    done.wait()
    for s in held:
        s.close()


def probe(port, sock_b, sock_a, duration):
    """{"healthz": [...], "b": [...], "a": [...]} latencies in seconds (None: failed)."""
    out = {"healthz": [], "b": [], "a": []}
    stop_at = time.monotonic() + duration
    while time.monotonic() < stop_at:
        out["healthz"].append(healthz(port))
        out["b"].append(imds_get(sock_b, "/hostname"))
        out["a"].append(imds_get(sock_a, "/hostname", timeout=1.0))
        time.sleep(0.01)
    return out


def thread_cpu(pid):
    """{thread name: CPU seconds} of the daemon's threads; the loop's thread is "loop"."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = "loop" if int(tid) == pid else f.read().strip()
        except OSError:
            continue
        out[name] = out.get(name, 0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_share(before, after, seconds):
    """"loop 12 %, vmm-report 80 %": each thread's share of one CPU over seconds."""
    names = sorted(set(after), key=lambda n: (n != "loop", n))
    return ", ".join("%s %.0f %%" % (n, 100 * (after[n] - before.get(n, 0)) / seconds) for n in names
                     if n == "loop" or after[n] - before.get(n, 0) > 0.01 * seconds)


def measured(d, sock_b, sock_a):
    """The probe over DURATION, with the daemon threads' CPU share meanwhile."""
    c0, t0 = thread_cpu(d.proc.pid), time.monotonic()
    r = probe(d.port, sock_b, sock_a, DURATION)
    r["cpu"] = cpu_share(c0, thread_cpu(d.proc.pid), time.monotonic() - t0)
    return r


def private_kib(pid):
    """The process's private memory (Private_Clean + Private_Dirty of smaps_rollup), in KiB."""
    total = 0
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def settled_private_kib(pid):
    """private_kib() once the daemon is idle again (the request's memory is handed back when it ends)."""
    time.sleep(1.0)
    return private_kib(pid)


def post_raw(port, body):
    """POST /api/v1/vms with body: the status the daemon answered. It may answer and close before the
    body is all sent (that is the point of refusing early), so the answer is read after a failed send."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        sock.sendall(b"POST /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        try:
            sock.sendall(body)
        except OSError:
            pass
        head = sock.recv(64)
        return int(head.split()[1]) if head.startswith(b"HTTP/") else "no answer"
    except OSError as e:
        return type(e).__name__
    finally:
        sock.close()


def stats(samples):
    ok = sorted(x for x in samples if x is not None)
    failed = len(samples) - len(ok)
    if not ok:
        return "— (%d failed)" % failed

    def pct(p):
        return ok[min(len(ok) - 1, int(p * len(ok)))] * 1000

    s = "%.1f / %.1f / %.0f ms" % (pct(0.5), pct(0.99), ok[-1] * 1000)
    return s + (", %d of %d failed" % (failed, len(samples)) if failed else "")


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build/src/daemon/vm-manager"))
    body = report_body()
    work = tempfile.mkdtemp(prefix="bench-imds-")
    d = Daemon(binary, work)
    rows = []
    try:
        d.start()
        ids = d.create_vms(["bench-a", "bench-b"])
        sock_a, sock_b = d.sock(ids["bench-a"]), d.sock(ids["bench-b"])

        # idle
        r = measured(d, sock_b, sock_a)
        rows.append(("idle", r, ""))

        # what a refused body leaves behind: the daemon's private memory, idle, before and after
        mem = [("idle, two VMs booted", private_kib(d.proc.pid))]
        big = b"{" + b" " * (9 << 20) + b"}"
        for i in range(5):
            mem.append(("after a 9 MiB REST body refused (round %d: %s)" % (i + 1, post_raw(d.port, big)),
                        settled_private_kib(d.proc.pid)))

        # uploads: one at a time, then four connections that ignore Retry-After
        results = multiprocessing.Queue()
        for conns, what in ((1, "VM A uploads 8 MiB reports back to back"),
                            (2, "VM A uploads 8 MiB reports on 2 connections that ignore Retry-After"),
                            (4, "VM A floods 8 MiB uploads on 4 connections")):
            stop_at = time.monotonic() + DURATION + 1
            floods = [multiprocessing.Process(target=flooder, args=(sock_a, body, stop_at, results))
                      for _ in range(conns)]
            for p in floods:
                p.start()
            time.sleep(0.5)
            r = measured(d, sock_b, sock_a)
            counts = {}
            for p in floods:
                for k, v in results.get().items():
                    counts[k] = counts.get(k, 0) + v
                p.join()
            rows.append((what, r, ", ".join("%d× %s" % (v, k or "no answer") for k, v in sorted(counts.items()))))

        # GET /report of the 8 MiB upload, back to back
        stop_at = time.monotonic() + DURATION + 1
        rd = multiprocessing.Process(target=reader, args=(d.port, ids["bench-a"], stop_at, results))
        rd.start()
        time.sleep(0.5)
        r = measured(d, sock_b, sock_a)
        n = results.get()
        rd.join()
        rows.append(("a client reads VM A's 8 MiB report back to back (GET /vms/{id}/report)", r, "%d reads" % n))

        # held connections
        ready, done = multiprocessing.Event(), multiprocessing.Event()
        h = multiprocessing.Process(target=holder, args=(sock_a, HELD, ready, done))
        h.start()
        if not ready.wait(120):
            raise SystemExit("bench: could not open %d connections" % HELD)
        r = measured(d, sock_b, sock_a)
        done.set()
        h.join()
        rows.append(("VM A holds %d idle connections" % HELD, r, ""))

        # a restart with stored reports
        more = d.create_vms(["bench-s%02d" % i for i in range(STORED - len(ids))])
        all_ids = list(ids.values()) + list(more.values())
        for vid in all_ids:
            for _ in range(100):
                if upload(d.sock(vid), body) == 204:
                    break
                time.sleep(0.5)
        d.stop()
        up = d.start()
        t0 = time.monotonic() - up
        lat, mapped_at = [], None
        pending = set(all_ids)
        while pending and time.monotonic() - t0 < 600:
            lat.append(healthz(d.port))
            for vid in list(pending)[:5]:
                if d.api("GET", "/vms/%s/metrics" % vid).get("guest"):
                    pending.discard(vid)
            time.sleep(0.01)
        mapped_at = time.monotonic() - t0
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)

    print("| While (%s s each) | /healthz p50 / p99 / max | VM B /hostname p50 / p99 / max "
          "| VM A /hostname p50 / p99 / max | VM A's uploads, reads | daemon threads' CPU |" % ("%g" % DURATION))
    print("|---|---|---|---|---|---|")
    for name, r, extra in rows:
        print("| %s | %s | %s | %s | %s | %s |" % (name, stats(r["healthz"]), stats(r["b"]), stats(r["a"]),
                                                 extra or "—", r["cpu"]))
    print()
    print("| Daemon's private memory (smaps_rollup) | KiB |")
    print("|---|---|")
    for name, kib in mem:
        print("| %s | %d |" % (name, kib))
    print()
    print("| Restart with %d VMs, an 8 MiB report stored for each | |" % STORED)
    print("|---|---|")
    print("| exec → /healthz answers | %.2f s |" % up)
    print("| exec → every report mapped again | %.2f s%s |" % (mapped_at, " (%d not mapped)" % len(pending)
                                                           if pending else ""))
    print("| /healthz p50 / p99 / max meanwhile | %s |" % stats(lat))


if __name__ == "__main__":
    main()
