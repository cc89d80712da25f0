#!/usr/bin/env python3
"""How often a guest kernel dies under TCG, and how long create -> ready takes, for two (or more)
QEMU builds side by side: one daemon per QEMU, each with that QEMU first on its PATH, run at the same
time; each daemon creates N VMs of the real guest image one after another (create_vm defaults, 2
vCPUs, 2048 MiB, attested, wait_for ready) and deletes each once it is ready or failed. So the host
carries one boot of each QEMU at any moment, and both see the same load.

For each create it records: ready or failed, the seconds from the request to its answer, and what the
guest's serial console says of its kernel ("Kernel panic", "Oops", "BUG:", "general protection",
"Fatal exception", "int3"), read before the delete. It prints one markdown table per QEMU and a
summary: creates, ready, failed by a guest kernel panic, other failures, consoles with a kernel
oops that still reached ready, and the mean and median create -> ready of the ready ones.

usage: bench/boots.py VM_MANAGER IMAGE_DIR [N]          (N default 30)
environment: QEMUS  comma-separated NAME=DIR, DIR holding a qemu-system-x86_64 to put first on that
                    daemon's PATH (default: "system=" for the QEMU already on PATH)
             EXTRA  more serve flags for every daemon, space-separated
"""
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests/integration"))
from vmmtest import api, serve_ready  # noqa: E402

KERNEL_TROUBLE = re.compile(r"Kernel panic|Oops|BUG:|general protection|Fatal exception|int3")


def console_trouble(state, vid):
    """The kernel's lines of trouble on the VM's console (the daemon keeps it in STATE/vms/ID)."""
    try:
        with open(os.path.join(state, "vms", vid, "console.log"), errors="replace") as f:
            return [l.strip() for l in f if KERNEL_TROUBLE.search(l)]
    except OSError:
        return []


def run_qemu(name, path_dir, binary, images, n, extra, work, out):
    state = os.path.join(work, name)
    os.makedirs(state)
    env = dict(os.environ)
    if path_dir:
        env["PATH"] = path_dir + ":" + env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    p, port = serve_ready(binary, state, images, extra, env=env)
    try:
        prefix = "boot-%s-" % re.sub(r"[^a-z0-9]", "", name)
        for i in range(n):
            t0 = time.monotonic()
            status, vm = api(port, "POST", "/vms", {"name": prefix + str(i), "wait_for": "ready"}, timeout=1200)
            took = time.monotonic() - t0
            err = "" if status == 201 else json.dumps(vm)[:300]
            # a failed create answers with the error alone: the VM is found by its name
            vid = vm.get("id") if status == 201 else next(
                (v["id"] for v in api(port, "GET", "/vms")[1] or [] if v.get("name") == prefix + str(i)), None)
            trouble = console_trouble(state, vid) if vid else []
            row = {"i": i, "ok": status == 201, "took": took, "panic": "guest kernel panicked" in err,
                   "error": err, "trouble": trouble}
            out["rows"].append(row)
            print("<!-- %s: boot %d %s in %.0f s%s -->" % (name, i, "ready" if row["ok"] else "FAILED", took,
                                                         (": " + "; ".join(trouble[:3])) if trouble else ""),
                  flush=True)
            if vid:
                api(port, "DELETE", "/vms/%s" % vid, timeout=300)
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            p.kill()


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    binary, images = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    qemus = [q.split("=", 1) for q in os.environ.get("QEMUS", "system=").split(",") if q]
    extra = os.environ.get("EXTRA", "").split()
    work = tempfile.mkdtemp(prefix="vmm-boots-")
    results = {name: {"rows": []} for name, _ in qemus}
    try:
        threads = [threading.Thread(target=run_qemu, args=(name, d, binary, images, n, extra, work, results[name]))
                   for name, d in qemus]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("\n| QEMU | creates | ready | failed: guest kernel panic | failed: other | ready with a kernel oops "
              "| create -> ready mean s | median s |")
        print("|---|---|---|---|---|---|---|---|")
        for name, _ in qemus:
            rows = results[name]["rows"]
            ok = [r["took"] for r in rows if r["ok"]]
            print("| %s | %d | %d | %d | %d | %d | %s | %s |" % (
                name, len(rows), len(ok), sum(r["panic"] for r in rows),
                sum(not r["ok"] and not r["panic"] for r in rows), sum(r["ok"] and bool(r["trouble"]) for r in rows),
                "%.1f" % statistics.mean(ok) if ok else "-", "%.1f" % statistics.median(ok) if ok else "-"))
        for name, _ in qemus:
            for r in results[name]["rows"]:
                if not r["ok"] or r["trouble"]:
                    print("<!-- %s boot %d: %s %s -->" % (name, r["i"], r["error"][:200], " | ".join(r["trouble"][:4])))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
