#!/usr/bin/env python3
"""How many idle VMs of the real guest image one host holds: creates N VMs with the defaults of
create_vm (2 vCPUs, 2048 MiB, attested), waits until each is ready and then SETTLE seconds more, and
samples every VM for WINDOW seconds:

  host PSS     of the VM's processes (QEMU, swtpm, vhost-device-vsock), from /proc/<pid>/smaps_rollup
  guest        MemTotal - MemFree of the guest's /proc/meminfo (exec_vm, after the window)
  CPU          of the VM's processes over the window, from /proc/<pid>/stat, in % of one core

and prints one markdown table per configuration, then what fits: this host's memory (MemTotal)
divided by the mean host PSS, two cores divided by the mean idle CPU. The configurations run one
after the other, each on its own daemon and state directory:

  vm-manager      the daemon's defaults
  tb-1g           --tcg-tb-size-mib 0: QEMU's own translation cache of 1 GiB, as libvirt leaves it
  tb-64           --tcg-tb-size-mib 64: a quarter of the default cache
  report-60s      --guest-report-interval 60s: the report period before issue 38's measurement
  before          both: QEMU's cache size and the minute report (the guest image is the same, with
                  its boot cache dropped; free page reporting stays on)

usage: bench/density.py VM_MANAGER IMAGE_DIR [N]     (N default 4)
environment: CONFIGS (comma-separated, default vm-manager,before), SETTLE (s, default 60), WINDOW (s,
default 120), EXTRA (more serve flags for every configuration, space-separated)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests/integration"))
from vmmtest import api, serve_ready  # noqa: E402

CONFIGS = {
    "vm-manager": [],
    "tb-1g": ["--tcg-tb-size-mib", "0"],
    "tb-64": ["--tcg-tb-size-mib", "64"],
    "report-60s": ["--guest-report-interval", "60s"],
    "before": ["--tcg-tb-size-mib", "0", "--guest-report-interval", "60s"],
}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def pss_bytes(pid):
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def guest_mib(port, vid):
    """The guest's own use, MemTotal - MemFree of its /proc/meminfo (used, buffers, page cache and
    slab: what `free` calls used + buff/cache), in MiB; None when exec_vm fails."""
    status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["cat", "/proc/meminfo"]})
    if status != 200:
        return None
    m = {l.split(":")[0]: int(l.split()[1]) for l in (r or {}).get("stdout", "").splitlines() if l.split()[1:]}
    return (m["MemTotal"] - m["MemFree"]) / 1024 if "MemTotal" in m and "MemFree" in m else None


def pids_of(metrics):
    host = (metrics or {}).get("host") or {}
    return [p["pid"] for p in host.get("processes") or [] if p.get("pid")] or ([host["pid"]] if host.get("pid") else [])


def run_config(name, binary, images, n, settle, window, extra, work):
    state = os.path.join(work, name)
    p, port = serve_ready(binary, state, images, CONFIGS[name] + extra)
    rows, made = [], []
    try:
        for i in range(n):
            t0 = time.monotonic()
            status, vm = api(port, "POST", "/vms", {"name": "dense-%d" % i, "wait_for": "ready"}, timeout=900)
            took = time.monotonic() - t0
            if status != 201:
                print("<!-- %s: VM %d was not created (%s): %s -->" % (name, i, status, json.dumps(vm)[:300]))
                break
            made.append(vm["id"])
            print("<!-- %s: dense-%d ready in %.0f s -->" % (name, i, took), flush=True)
        time.sleep(settle)
        before = {}
        for vid in made:
            _, m = api(port, "GET", "/vms/%s/metrics" % vid)
            before[vid] = {pid: cpu_ticks(pid) for pid in pids_of(m)}
        t0 = time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - t0
        for vid in made:
            _, m = api(port, "GET", "/vms/%s/metrics" % vid)
            ticks = sum((cpu_ticks(pid) or 0) - (t or 0) for pid, t in before[vid].items() if t is not None)
            pss = sum(pss_bytes(pid) or 0 for pid in before[vid])
            rows.append({"vm": vid[:8], "cpu": 100.0 * ticks / TICKS / elapsed, "pss": pss / 2**20,
                         "guest": guest_mib(port, vid)})
    finally:
        for vid in made:
            api(port, "DELETE", "/vms/%s" % vid, timeout=300)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            p.kill()
    return rows


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    binary, images = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    configs = [c for c in os.environ.get("CONFIGS", "vm-manager,before").split(",") if c]
    settle, window = int(os.environ.get("SETTLE", "60")), int(os.environ.get("WINDOW", "120"))
    extra = os.environ.get("EXTRA", "").split()
    with open("/proc/meminfo") as f:
        mem_total = int(f.readline().split()[1]) / 1024
    work = tempfile.mkdtemp(prefix="vmm-density-")
    summary = []
    try:
        for c in configs:
            rows = run_config(c, binary, images, n, settle, window, extra, work)
            print("\n%s, %d VMs, settle %d s, window %d s\n" % (c, len(rows), settle, window))
            print("| VM | host PSS MiB | guest MemTotal - MemFree MiB | PSS - guest MiB | CPU % of a core |")
            print("|---|---|---|---|---|")
            for r in rows:
                g = r["guest"]
                print("| %s | %.0f | %s | %s | %.1f |" % (r["vm"], r["pss"], "%.0f" % g if g is not None else "-",
                                                         "%.0f" % (r["pss"] - g) if g is not None else "-", r["cpu"]))
            if rows:
                pss = sum(r["pss"] for r in rows) / len(rows)
                cpu = sum(r["cpu"] for r in rows) / len(rows)
                summary.append((c, len(rows), pss, cpu, mem_total / pss, 200.0 / cpu if cpu > 0 else float("inf")))
        print("\n| configuration | VMs | mean host PSS MiB | mean idle CPU %% | fit by memory (%.0f MiB) | fit by CPU (2 cores) |"
              % mem_total)
        print("|---|---|---|---|---|---|")
        for c, k, pss, cpu, fm, fc in summary:
            print("| %s | %d | %.0f | %.1f | %.0f | %.0f |" % (c, k, pss, cpu, fm, fc))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
