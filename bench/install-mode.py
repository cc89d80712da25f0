#!/usr/bin/env python3
"""Host install against installer boot, side by side in one daemon run on the same image:

  create -> QMP   create_vm (wait_for none, answered once the first QEMU answers QMP), QMP_RUNS per
                  mode, each VM deleted at once. In host mode that QEMU is the installed boot's (OVMF
                  pflash), started paused (-S) beside the host install, so the answer can come while the
                  disk is still being copied; the bench then polls get_vm every 5 ms until the VM leaves
                  creating and reports the host install (createdAt to installedAt), how many answers
                  came before the install ended, and request -> booting (the guest let run). In boot
                  mode the first QEMU is the installer (-kernel, no firmware).
  create -> ready create_vm (wait_for ready, require_attestation false), ROUNDS per mode, the modes
                  alternating (host, boot, host, ...), one VM at a time: request to ready, the install
                  (createdAt to installedAt), the installed boot (bootedAt to readyAt).

usage: bench/install-mode.py VM_MANAGER [IMAGE_DIR]   (IMAGE_DIR default images/build; it must hold an
       image with its .layout.json) (QMP_RUNS=10 ROUNDS=1 READY=1; READY=0 skips create -> ready)
Prints a markdown section for docs/benchmarks.md.
"""
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests/integration"))
from vmmtest import api, serve_ready  # noqa: E402


def stamp(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def delete(port, vid, state):
    """delete_vm; a guest still in its firmware does not answer ACPI, and when the stop escalation has
    not ended its QEMU after 30 s the bench kills it (the pid from vm.json) so the next run can start."""
    done = []
    t = threading.Thread(target=lambda: done.append(api(port, "DELETE", "/vms/" + vid, timeout=600)), daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        try:
            with open(os.path.join(state, "vms", vid, "vm.json")) as f:
                pid = json.load(f)["processes"]["qemu"]["pid"]
            os.kill(pid, signal.SIGKILL)
            print("# bench: killed the QEMU of %s (pid %d) after 30 s of delete_vm" % (vid, pid), file=sys.stderr)
        except (OSError, KeyError, ValueError):
            pass
        t.join(120)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    images = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else "images/build")
    if not any(f.endswith(".layout.json") for f in os.listdir(images)):
        raise SystemExit("%s has no image with a layout file: the host install cannot run" % images)
    qmp_runs = int(os.environ.get("QMP_RUNS", "10"))
    rounds = int(os.environ.get("ROUNDS", "1"))
    work = tempfile.mkdtemp(prefix="bench-install-mode-")
    p, port = serve_ready(binary, os.path.join(work, "state"), images,
                          ["--launcher", "process", "--install-mode", "host", "--install-timeout", "30m",
                           "--boot-timeout", "20m", "--stop-timeout", "5s"])
    load = os.getloadavg()[0]
    out = {"host": {"qmp": [], "install": [], "booting": [], "early": 0}, "boot": {"qmp": []}}
    ready = {"host": [], "boot": []}
    failed = None
    try:
        for k in range(qmp_runs):
            for mode in ("host", "boot"):
                t0 = time.monotonic()
                status, vm = api(port, "POST", "/vms", {"name": "q%s%d" % (mode, k), "memory_mib": 2048, "disk_gib": 4,
                                                         "require_attestation": False, "wait_for": "none",
                                                         "install_mode": mode})
                took = time.monotonic() - t0
                if status != 201:
                    raise SystemExit("create_vm (%s) failed: %r" % (mode, vm))
                out[mode]["qmp"].append(took * 1000)
                if mode == "host":
                    out[mode]["early"] += vm["state"] == "creating"
                    while vm["state"] == "creating" and time.monotonic() - t0 < 60:
                        time.sleep(0.005)
                        _, vm = api(port, "GET", "/vms/" + vm["id"])
                    out[mode]["booting"].append((time.monotonic() - t0) * 1000)
                    if not vm.get("installedAt"):
                        raise SystemExit("host mode: the VM left creating without installedAt: %r" % vm)
                    out[mode]["install"].append((stamp(vm["installedAt"]) - stamp(vm["createdAt"])) * 1000)
                delete(port, vm["id"], os.path.join(work, "state"))
        if os.environ.get("READY", "1") != "0":
            for k in range(rounds):
                for mode in ("host", "boot"):
                    t0 = time.monotonic()
                    status, vm = api(port, "POST", "/vms", {"name": "r%s%d" % (mode, k), "memory_mib": 2048,
                                                             "disk_gib": 4, "require_attestation": False,
                                                             "wait_for": "ready", "install_mode": mode},
                                    timeout=1800)
                    took = time.monotonic() - t0
                    if status != 201 or vm.get("state") != "ready":
                        raise SystemExit("create_vm (%s, wait_for ready) failed: %r" % (mode, vm))
                    ready[mode].append({
                        "total": took,
                        "install": stamp(vm["installedAt"]) - stamp(vm["createdAt"]),
                        "boot": stamp(vm["readyAt"]) - stamp(vm["bootedAt"]),
                    })
                    delete(port, vm["id"], os.path.join(work, "state"))
    except BaseException as e:  # noqa: BLE001 - printed below, then raised again
        # what was measured before a failure or an interrupt is still printed
        print("# bench interrupted (%r): the tables hold the runs completed so far" % e, file=sys.stderr)
        failed = e
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(300)
        except subprocess.TimeoutExpired:
            p.kill()
    report(qmp_runs, rounds, load, out, ready)
    if failed:
        raise failed


def report(qmp_runs, rounds, load, out, ready):
    h, b = out["host"], out["boot"]
    print("### create → QMP answering by install mode (%d runs each, interleaved, median ms; load %.2f)" %
          (qmp_runs, load))
    print()
    print("| measure | ms |")
    print("|---|---|")
    print("| boot mode: `create_vm` (wait_for none), answered once the installer's QEMU (`-kernel`) answers QMP | %.0f |"
          % med(b["qmp"]))
    print("| host mode: `create_vm` (wait_for none), answered once the installed boot's QEMU (OVMF, paused beside the install) answers QMP | %.0f |"
          % med(h["qmp"]))
    print("| host mode: answers that came while the disk was still being copied (state creating) | %d of %d |"
          % (h["early"], len(h["qmp"])))
    print("| host mode: the host install (createdAt → installedAt) | %.0f |" % med(h["install"]))
    print("| host mode: request → booting (the install done, `cont` answered; polled every 5 ms) | %.0f |"
          % med(h["booting"]))
    if ready["host"] and ready["boot"]:
        print()
        print("### create → ready by install mode (%d round(s), same image, same daemon, median s)" % rounds)
        print()
        print("| mode | request → ready | install (createdAt → installedAt) | installed boot (bootedAt → readyAt) |")
        print("|---|---|---|---|")
        for mode in ("host", "boot"):
            r = ready[mode]
            print("| %s | %.0f | %.1f | %.0f |" % (mode, med([x["total"] for x in r]), med([x["install"] for x in r]),
                                                 med([x["boot"] for x in r])))
        ratio = med([x["total"] for x in ready["host"]]) / med([x["total"] for x in ready["boot"]])
        print()
        print("host ÷ boot, request → ready: %.2f" % ratio)
    print()
    print("raw: %s" % json.dumps({"qmp": out, "ready": ready}))


if __name__ == "__main__":
    main()
