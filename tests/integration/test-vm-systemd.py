#!/usr/bin/env python3
"""VMs under the systemd launcher, on real boots: QEMU, swtpm and vhost-device-vsock run as transient
units of a service manager (a private `systemd --user`, started by with-systemd-user.sh), so a VM
survives the daemon:

  * create_vm (ready); the record names the units;
  * SIGTERM of the daemon leaves the VM running (--detach-vms-on-exit), the next daemon attaches
    to it: still ready, and stop_vm (over the re-dialled QMP), start_vm and delete_vm work;
  * kill -9 of the daemon leaves it running too, and the next daemon attaches again;
  * delete_vm leaves no process behind.

Skips (exit 0, "1..0 # SKIP") without a service manager, QEMU, swtpm, OVMF or vhost-device-vsock.
"""

import importlib.util
import json
import os
import signal
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
spec = importlib.util.spec_from_file_location("test_vm", os.path.join(here, "test-vm.py"))
tv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tv)
from vmmtest import Daemon, HOST, base_env, free_port, run, tap  # noqa: E402


def start(work, name, state, port):
    env = base_env(work)
    env["XDG_RUNTIME_DIR"] = os.environ["XDG_RUNTIME_DIR"]
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", tv.IMAGE_DIR,
                            "--launcher", "systemd", "--log-level", "debug"], env=env)
    ok, why = d.wait_healthy(port, timeout=30)
    tap.result(ok, "%s: serving with --launcher systemd" % name, why)
    return d


def test_survives_restarts(work):
    state = os.path.join(work, "s")
    port = free_port()
    d = start(work, "first", state, port)

    status, vm = tv.api(port, "POST", "/vms", dict(tv.CREATE, name="durable"))
    tap.result(status == 201 and vm["state"] == "ready", "create_vm: ready", repr(vm)[:300])
    if status != 201:
        return
    vm_id = vm["id"]
    with open(os.path.join(state, "vms", vm_id, "vm.json")) as f:
        rec = json.load(f)
    procs = rec.get("processes", {})
    tap.result(procs.get("qemu", {}).get("unit") == "vm-manager-%s-qemu.service" % vm_id
               and procs.get("swtpm", {}).get("unit") == "vm-manager-%s-swtpm.service" % vm_id,
               "vm.json names the units of QEMU and swtpm", json.dumps(procs))
    qemu_pid = procs.get("qemu", {}).get("pid")

    rc, _ = d.stop(signal.SIGTERM, timeout=30)
    tap.result(rc == 0, "SIGTERM: the daemon exits 0", "exit %r" % rc)
    time.sleep(1)
    tap.result(qemu_pid and os.path.exists("/proc/%d" % qemu_pid), "... and the VM's QEMU keeps running",
               "\n".join(tv.processes_under(vm["paths"]["dir"])))

    port = free_port()
    d = start(work, "second", state, port)
    status, again = tv.api(port, "GET", "/vms/" + vm_id)
    tap.result(status == 200 and again["state"] == "ready" and "lastError" not in again,
               "the next daemon attaches: still ready, no error", repr(again)[:400])
    t0 = time.monotonic()
    status, again = tv.api(port, "POST", "/vms/%s/stop" % vm_id)
    tap.result(status == 200 and again["state"] == "stopped",
               "stop_vm through the re-dialled QMP: stopped (%.2f s)" % (time.monotonic() - t0), repr(again)[:300])
    left = tv.processes_gone(vm["paths"]["dir"])
    tap.result(left == [], "... nothing of it runs", "\n".join(left))
    status, again = tv.api(port, "POST", "/vms/%s/start" % vm_id)
    again = tv.wait_state(port, vm_id, ("ready", "failed"), 300)
    tap.result(again["state"] == "ready", "start_vm: ready again", repr(again)[:300])

    # kill -9: units do not depend on the daemon
    with open(os.path.join(state, "vms", vm_id, "vm.json")) as f:
        qemu_pid = json.load(f).get("processes", {}).get("qemu", {}).get("pid")
    d.proc.kill()
    d.proc.wait()
    time.sleep(1)
    tap.result(qemu_pid and os.path.exists("/proc/%d" % qemu_pid), "kill -9 of the daemon: the VM keeps running",
               "pid %r" % qemu_pid)
    port = free_port()
    d = start(work, "third", state, port)
    status, again = tv.api(port, "GET", "/vms/" + vm_id)
    tap.result(status == 200 and again["state"] == "ready", "... and the next daemon attaches to it",
               repr(again)[:300])

    paths = again["paths"]
    status, _ = tv.api(port, "DELETE", "/vms/" + vm_id)
    tap.result(status == 204, "delete_vm: 204", "")
    left = tv.processes_gone(paths["dir"])
    tap.result(left == [] and not os.path.exists(paths["dir"]), "... no process, no directory left", "\n".join(left))
    rc, _ = d.stop(signal.SIGTERM, timeout=30)
    tap.result(rc == 0, "SIGTERM with no VM: exit 0", "exit %r" % rc)


if __name__ == "__main__":
    missing = tv.missing_tools()
    if missing or not tv.IMAGE_DIR or not os.environ.get("XDG_RUNTIME_DIR"):
        print("TAP version 13\n1..0 # SKIP needs %s" % (", ".join(missing) if missing else
                                                       "VM_MANAGER_TEST_IMAGE_DIR and a service manager"))
        sys.exit(0)
    import subprocess
    build = subprocess.run(["bash", os.path.join(tv.SOURCE_ROOT, "tests/image/build.sh"), tv.IMAGE_DIR],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if build.returncode != 0:
        print("TAP version 13\nnot ok 1 - tests/image/build.sh\n1..1")
        sys.exit(1)
    sys.exit(run([test_survives_restarts], 900, "vmm-vmsd-"))
