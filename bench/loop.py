#!/usr/bin/env python3
"""The event loop under load (issue 33): /healthz latency from wrk and the longest event loop
iteration the daemon measured (/metrics: vm_manager_loop_iteration_seconds_max, and the iterations
over 50 ms from vm_manager_loop_iteration_seconds), side by side

  idle       a daemon with nothing to do but /healthz;
  lifecycle  the same while rounds of VMS VMs are created (wait_for none: directory, disk, key,
             swtpm, vhost-device-vsock, the installer's QEMU and its monitor), stopped (ACPI power
             button, QEMU's exit) and deleted, in parallel, on the fake QEMU, swtpm and
             vhost-device-vsock of tests/integration/fakes, until wrk is done.

Each phase gets a fresh daemon (the longest iteration is counted from start-up) on the systemd
launcher when a service manager answers at $XDG_RUNTIME_DIR/systemd/private (bench/loop.sh starts a
private one where it can), else on plain children. wrk keeps CONNECTIONS connections busy for
DURATION seconds. Several binaries (LABEL=PATH, e.g. before=../old/build/src/daemon/vm-manager)
are run interleaved, ROUNDS times: idle of each, then lifecycle of each, so that a ratio between them
is taken side by side on a host whose load moves; a binary without the loop metrics (one from before
issue 33) gets "n/a" there, and wrk's max is the stall a client saw for all of them. With WHERE=1 the daemon's loop watchdog reports its slow iterations
($VM_MANAGER_LOOP_WATCHDOG_REPORT) and the places are printed after the table (a release build
then samples stacks too; the figures are best taken without it).

  usage: bench/loop.sh [[LABEL=]path/to/vm-manager ...]   (DURATION=10 VMS=10 CONNECTIONS=16 THREADS=1
                                                            ROUNDS=1 WHERE= LAUNCHER=systemd|process)
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests/integration"))
from vmmtest import FAKES, fake_image_dir, free_port, http_request, read_loop_report  # noqa: E402

DURATION = int(os.environ.get("DURATION", "10"))
VMS = int(os.environ.get("VMS", "10"))
CONNECTIONS = int(os.environ.get("CONNECTIONS", "16"))
THREADS = int(os.environ.get("THREADS", "1"))
ROUNDS = int(os.environ.get("ROUNDS", "1"))
WHERE = os.environ.get("WHERE", "") not in ("", "0")
CREATE = {"memory_mib": 256, "disk_gib": 1, "require_attestation": False, "wait_for": "none"}


def api(port, method, path, body=None, timeout=300):
    status, _, data = http_request(port, method, "/api/v1" + path,
                                   body=json.dumps(body).encode() if body is not None else None, timeout=timeout)
    try:
        return status, (json.loads(data) if data else None)
    except ValueError:
        return status, data


def launcher():
    if os.environ.get("LAUNCHER"):
        return os.environ["LAUNCHER"]
    rt = os.environ.get("XDG_RUNTIME_DIR")
    return "systemd" if rt and os.path.exists(os.path.join(rt, "systemd", "private")) else "process"


def resolve(binary, where):
    """A place of a build without the sanitizers' symbolizer ("vm-manager+0x1234"), through addr2line."""
    m = re.match(r"^%s\+0x([0-9a-f]+)$" % re.escape(os.path.basename(binary)), where)
    if not m or not shutil.which("addr2line"):
        return where
    out = subprocess.run(["addr2line", "-f", "-e", binary, "0x" + m.group(1)], capture_output=True, text=True).stdout
    lines = out.split()
    return "%s %s (%s)" % (lines[0], os.path.relpath(lines[1], ROOT) if lines[1].startswith("/") else lines[1],
                          where) if len(lines) >= 2 else where


class Daemon:
    def __init__(self, binary, work, name, launcher_kind):
        self.work = os.path.join(work, name)
        os.makedirs(self.work)
        self.images, self.vars = fake_image_dir(self.work)
        self.port = free_port()
        self.report = os.path.join(self.work, "loop.jsonl")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("VM_MANAGER_", "OTEL_", "NOTIFY_SOCKET", "LISTEN_", "WATCHDOG_"))}
        env.update(HOME=os.path.join(self.work, "home"), XDG_STATE_HOME=os.path.join(self.work, "xdg"),
                   PATH=FAKES + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
                   VM_MANAGER_LOOP_WATCHDOG="1" if WHERE else "0")
        if WHERE:
            env["VM_MANAGER_LOOP_WATCHDOG_REPORT"] = self.report
        self.log = open(os.path.join(self.work, "stderr"), "wb")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:%d" % self.port, "--state-dir", os.path.join(self.work, "state"),
             "--image-dir", self.images, "--ovmf-code", self.vars, "--ovmf-vars", self.vars,
             "--launcher", launcher_kind, "--vsock", "vhost-user", "--log-level", "warning"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the daemon exited with %r: %s" % (self.proc.returncode, self.stderr()[-2000:]))
            try:
                if http_request(self.port, "GET", "/readyz", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError("the daemon did not get ready: %s" % self.stderr()[-2000:])
        time.sleep(1)

    def stderr(self):
        with open(os.path.join(self.work, "stderr"), "rb") as f:
            return f.read().decode(errors="replace")

    def metrics(self):
        _, _, body = http_request(self.port, "GET", "/metrics")
        text = body.decode()

        def value(pattern):
            m = re.search(r"^%s (\S+)$" % pattern, text, re.M)
            return float(m.group(1)) if m else float("nan")
        count = value(r"vm_manager_loop_iteration_seconds_count")
        return {
            "worst": value(r"vm_manager_loop_iteration_seconds_max"),
            "iterations": count,
            "over50": count - value(r'vm_manager_loop_iteration_seconds_bucket\{le="0\.05"\}'),
        }

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def wrk(port, duration):
    """(req/s, p50 ms, p99 ms, max ms, errors) of /healthz."""
    out = subprocess.run(["wrk", "-t%d" % THREADS, "-c%d" % CONNECTIONS, "-d%ds" % duration, "--latency",
                          "http://127.0.0.1:%d/healthz" % port], capture_output=True, text=True, check=True).stdout

    def ms(v):
        m = re.match(r"([\d.]+)(us|ms|s)$", v)
        return float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)] if m else float("nan")
    rps = float(re.search(r"^Requests/sec:\s+(\S+)", out, re.M).group(1))
    p50 = ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    mx = ms(re.search(r"^\s+Latency\s+\S+\s+\S+\s+(\S+)", out, re.M).group(1))
    errors = re.search(r"Socket errors:.*|Non-2xx.*", out)
    return rps, p50, p99, mx, errors.group(0) if errors else ""


def lifecycle(port, stop_at, tally):
    """Rounds of VMS VMs, each created, stopped and deleted, in parallel, until stop_at."""
    def one(name):
        try:
            cycle(name)
        except OSError as e:  # a timeout included
            tally["errors"].append("%s: %r" % (name, e))

    def cycle(name):
        t0 = time.monotonic()
        status, vm = api(port, "POST", "/vms", dict(CREATE, name=name))
        if status != 201:
            tally["errors"].append("create %s: %r %r" % (name, status, str(vm)[:200]))
            return
        vid = vm["id"]
        status, vm = api(port, "POST", "/vms/%s/stop" % vid, {})
        if status != 200:
            tally["errors"].append("stop %s: %r %r" % (name, status, str(vm)[:200]))
        status, _ = api(port, "DELETE", "/vms/%s" % vid)
        if status != 204:
            tally["errors"].append("delete %s: %r" % (name, status))
            return
        tally["vms"] += 1
        tally["seconds"].append(time.monotonic() - t0)

    n = 0
    while time.monotonic() < stop_at:
        threads = [threading.Thread(target=one, args=("b%d-%d" % (n, i),)) for i in range(VMS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        n += 1
    tally["rounds"] = n


def phase(binary, label, work, name, kind, churn):
    d = Daemon(binary, work, "%s%d" % (name, len(os.listdir(work))), kind)  # short: socket paths live there
    tally = {"vms": 0, "rounds": 0, "errors": [], "seconds": []}
    try:
        t = None
        if churn:
            t = threading.Thread(target=lifecycle, args=(d.port, time.monotonic() + DURATION, tally))
            t.start()
        rps, p50, p99, mx, errors = wrk(d.port, DURATION)
        if t:
            t.join()  # the round under way ends: the loop's figures take all of it
        m = d.metrics()
    finally:
        d.stop()
    where = {}
    for e in read_loop_report(d.report) if WHERE else []:
        w = where.setdefault(e.get("where") or "?", [0, {}])
        w[0] += 1
        if e.get("usec", 0) > w[1].get("usec", 0):
            w[1] = e
    return {"name": name, "label": label, "binary": binary, "load": os.getloadavg()[0], "launcher": kind, "rps": rps, "p50": p50, "p99": p99, "max": mx, "wrk_errors": errors,
            "tally": tally, "where": where, **m}


def na(v, fmt):
    return "n/a" if v != v else fmt % v  # NaN: the binary has no such metric


def median(values):
    v = sorted(values)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def main():
    args = sys.argv[1:] or [os.path.join(ROOT, "build/src/daemon/vm-manager")]
    binaries = [a.split("=", 1) if "=" in a else (a, a) for a in args]
    binaries = [(label, os.path.abspath(path)) for label, path in binaries]
    if not shutil.which("wrk"):
        sys.exit("bench: wrk is missing (package wrk; tools/install-deps.sh bench)")
    kind = launcher()
    work = tempfile.mkdtemp(prefix="vmm-bench-loop-")
    rows = []
    try:
        for n in range(ROUNDS):
            for name, churn in (("idle", False), ("lifecycle", True)):
                for label, binary in binaries:
                    rows.append(dict(phase(binary, label, work, name, kind, churn), round=n + 1))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for label, binary in binaries:
        print("%s: %s" % (label, binary))
    print("launcher %s, wrk -t%d -c%d for %d s on /healthz; %d VMs a round (fake QEMU); %d round(s), interleaved\n"
          % (kind, THREADS, CONNECTIONS, DURATION, VMS, ROUNDS))
    print("| phase | binary | round | /healthz req/s | p50 | p99 | max | longest loop iteration | iterations over 50 ms "
          "| iterations | VMs created, stopped, deleted | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["name"] != "idle", [b[0] for b in binaries].index(r["label"]))):
        t = r["tally"]
        vms = "%d in %d rounds (%.1f s each, median)" % (
            t["vms"], t["rounds"], median(t["seconds"])) if t["seconds"] else "-"
        print("| %s | %s | %d | %.0f | %.2f ms | %.2f ms | %.1f ms | %s | %s | %s | %s | %.1f |" % (
            r["name"], r["label"], r["round"], r["rps"], r["p50"], r["p99"], r["max"], na(r["worst"] * 1000, "%.1f ms"),
            na(r["over50"], "%d"), na(r["iterations"], "%d"), vms, r["load"]))
    if len(binaries) > 1:
        print("\nmedians over the rounds, and each against %s's:" % binaries[0][0])
        for name in ("idle", "lifecycle"):
            base = [r for r in rows if r["name"] == name and r["label"] == binaries[0][0]]
            for label, _ in binaries:
                mine = [r for r in rows if r["name"] == name and r["label"] == label]
                print("  %-9s %-8s " % (name, label) + ", ".join(
                    "%s %.2f (x%.2f)" % (k, median(r[k] for r in mine),
                                         median(r[k] for r in mine) / median(r[k] for r in base))
                    for k in ("rps", "p50", "p99", "max")))
    for r in rows:
        if r["wrk_errors"]:
            print("\n%s %s: wrk: %s" % (r["name"], r["label"], r["wrk_errors"]))
        for e in r["tally"]["errors"][:10]:
            print("%s %s: %s" % (r["name"], r["label"], e))
        if r["where"]:
            print("\n%s %s, iterations over 50 ms by place (count, longest: on a CPU + waiting for one):"
                  % (r["name"], r["label"]))
            for w, (n, e) in sorted(r["where"].items(), key=lambda kv: -kv[1][1].get("usec", 0)):
                print("  %4d  %7.1f ms (%.1f + %.1f)  %s%s" % (
                    n, e.get("usec", 0) / 1000, e.get("cpuUsec", 0) / 1000, e.get("waitUsec", 0) / 1000,
                    e.get("syscall") and e["syscall"] + "() " or "", resolve(r["binary"], w)))
    return 1 if any(r["tally"]["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
