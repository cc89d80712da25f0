#!/usr/bin/env python3
"""VMs under the systemd launcher: QEMU, swtpm and vhost-device-vsock run as transient units of a
service manager (a private `systemd --user`, started by with-systemd-user.sh), so a VM survives the
daemon.

On the fake QEMU of tests/integration/fakes, its NIC a tap in a network namespace with a TCP server
behind it (seconds):

  * a forward made before SIGTERM of the daemon is listed and listens again, on the same host port,
    in the next daemon, which reaches the server through the re-dialled NIC;
  * kill -9 of the daemon during a host install, the first boot's QEMU waiting paused beside it as a
    unit: the next daemon fails the VM and stops the units it left (QEMU, swtpm, vhost-device-vsock);
  * when another process took that port meanwhile, the next daemon moves the forward to a new port
    and says so.

On real boots (a few minutes):

  * create_vm (ready); the record names the units;
  * SIGTERM of the daemon leaves the VM running (--detach-vms-on-exit), the next daemon attaches
    to it: still ready, its forward on the same address, and stop_vm (over the re-dialled QMP),
    start_vm and delete_vm work;
  * kill -9 of the daemon leaves it running too, and the next daemon attaches again;
  * delete_vm leaves no process behind.

Skips (exit 0, "1..0 # SKIP") without a service manager; the real boots skip without QEMU, swtpm,
OVMF or vhost-device-vsock, the fake ones without root, /dev/net/tun or ip.
"""

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
spec = importlib.util.spec_from_file_location("test_vm", os.path.join(here, "test-vm.py"))
tv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tv)
spec = importlib.util.spec_from_file_location("test_host_install", os.path.join(here, "test-host-install.py"))
thi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(thi)
from vmmtest import (  # noqa: E402
    FAKES,
    HOST,
    Daemon,
    base_env,
    fake_daemon,
    fake_image_dir,
    forward_read,
    free_port,
    run,
    tap,
    wait_state,
)


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
    status, fw = tv.api(port, "POST", "/vms/%s/forward" % vm_id, {"port": 22})
    tap.result(status == 200 and fw["address"].startswith("127.0.0.1:"), "forward_port 22", repr(fw)[:200])

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
    want = [{"port": 22, "address": fw.get("address")}] if isinstance(fw, dict) else None
    got = forward_read(fw.get("address"), timeout=10)
    # the test image runs no server: its kernel resets the connection
    tap.result(again.get("forwards") == want and got[0] in ("closed", "data"),
               "... its forward is listed and listens on the same address", "%r %r" % (again.get("forwards"), got))
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


def forward_read_when_linked(address, timeout=15):
    """forward_read until the answer is data: after a restart a running VM's forward listens at once,
    and reaches the guest once the daemon has re-dialled the VM's NIC (a connection made before
    that ends at once, as for a VM that does not run)."""
    deadline = time.monotonic() + timeout
    while True:
        got = forward_read(address)
        if got[0] != "closed" or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


SERVER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(8)
while True:
    c, _ = s.accept()
    c.sendall(b"hello from the netns\\n")
    c.close()
"""


def test_forwards_reattach(work):
    if os.geteuid() != 0 or not os.path.exists("/dev/net/tun") or not shutil.which("ip") \
            or not shutil.which("systemctl"):
        tap.skip("forwards across a reattach (fake QEMU)", "needs root, /dev/net/tun, ip and systemctl")
        return
    ns = "vmm-fwdsd-%d" % os.getpid()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    server = None
    fake_env = []
    try:
        # The TCP server the guest plays; the fake QEMU moves its tap into the server's namespace by
        # pid, since the service manager's private mount namespace does not see /run/netns/<ns>.
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER])
        images, vars_ = fake_image_dir(work, "f")
        tapname = "vmmf%d" % (os.getpid() % 100000)
        plan = os.path.join(work, "f-plan.json")
        with open(plan, "w") as f:
            json.dump({"fwdsd": {"netns": str(server.pid), "tap": tapname}}, f)
        # units get the service manager's environment, not the daemon's
        fake_env = ["FAKE_QEMU=install-exit:0", "FAKE_GUEST=tap", "FAKE_GUEST_PLAN=" + plan]
        subprocess.run(["systemctl", "--user", "set-environment"] + fake_env, check=True)
        run_forwards_reattach(work, ns, tapname, images, vars_)
    finally:
        if fake_env:
            subprocess.run(["systemctl", "--user", "unset-environment"] + [e.split("=")[0] for e in fake_env])
        if server:
            server.kill()
            server.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_restart_stops_prestart(work):
    if not shutil.which("systemctl"):
        tap.skip("a restart during a host install (fake QEMU)", "needs systemctl")
        return
    images = os.path.join(work, "images-pre")
    os.makedirs(images)
    thi.make_image(images, "pre_1.0")
    thi.make_layout(images, "pre_1.0")
    _, vars_ = fake_image_dir(work, "pre-firmware")  # only its firmware file
    # mke2fs (var, the install's last step but the GPT) waits for a gate that never opens
    bindir = os.path.join(work, "pre-bin")
    os.makedirs(bindir)
    with open(os.path.join(bindir, "mke2fs"), "w") as f:
        f.write("#!/bin/sh\nwhile [ ! -e %s ]; do sleep 0.05; done\nexit 1\n" % os.path.join(work, "pre.gate"))
    os.chmod(os.path.join(bindir, "mke2fs"), 0o755)
    state = os.path.join(work, "pre-state")
    env = base_env(work)
    env["XDG_RUNTIME_DIR"] = os.environ["XDG_RUNTIME_DIR"]
    env["PATH"] = FAKES + ":" + bindir + ":" + env.get("PATH", "/usr/bin:/bin")
    d, port, ok, why = fake_daemon(work, "pre-first", state, images, vars_, env, launcher="systemd", timeout=30)
    tap.result(ok, "pre-first: serving on the fake QEMU with --launcher systemd", why)
    if not ok:
        return
    status, vm = tv.api(port, "POST", "/vms", {"name": "pre", "image": "pre_1.0", "memory_mib": 512, "disk_gib": 3,
                                                "require_attestation": False, "wait_for": "none"})
    unit = "vm-manager-%s-qemu.service" % (vm or {}).get("id", "x")

    def active(u):
        return subprocess.run(["systemctl", "--user", "is-active", "--quiet", u]).returncode == 0
    tap.result(status == 201 and vm["state"] == "creating" and active(unit),
               "create_vm answers while the host install runs; the paused QEMU is the unit %s" % unit,
               repr((status, vm))[:300])
    if status != 201:
        d.stop(signal.SIGTERM, timeout=30)
        return
    d.stop(signal.SIGKILL, timeout=10)
    tap.result(active(unit), "kill -9 of the daemon leaves that unit running")
    d, port, ok, why = fake_daemon(work, "pre-second", state, images, vars_, env, launcher="systemd", timeout=30)
    tap.result(ok, "pre-second: serving", why)
    if not ok:
        return
    units = ["vm-manager-%s-%s.service" % (vm["id"], r) for r in ("qemu", "swtpm", "vsock")]
    for _ in range(100):
        if not any(active(u) for u in units):
            break
        time.sleep(0.1)
    status, again = tv.api(port, "GET", "/vms/" + vm["id"])
    tap.result(again.get("state") == "failed" and "restarted while the VM was creating" in again.get("lastError", "")
               and not any(active(u) for u in units) and not os.path.exists(vm["paths"]["volume"]),
               "the next daemon fails the VM, stops the units the create left, and drops the disk",
               repr((again, [u for u in units if active(u)]))[:500])
    tv.api(port, "DELETE", "/vms/" + vm["id"])
    d.stop(signal.SIGTERM, timeout=30)
    with open(os.path.join(work, "pre.gate"), "w"):
        pass  # an orphaned wrapper of the killed helper ends


def run_forwards_reattach(work, ns, tapname, images, vars_):
    state = os.path.join(work, "f-state")
    env = base_env(work)
    env["XDG_RUNTIME_DIR"] = os.environ["XDG_RUNTIME_DIR"]
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")

    def start_fake(name):
        d, port, ok, why = fake_daemon(work, name, state, images, vars_, env, launcher="systemd", timeout=30)
        tap.result(ok, "%s: serving on the fake QEMU with --launcher systemd" % name, why)
        return d, port, ok

    d, port, ok = start_fake("fwd-first")
    if not ok:
        return
    try:
        status, vm = tv.api(port, "POST", "/vms", {"name": "fwdsd", "hostname": "fwdsd", "memory_mib": 512,
                                                    "disk_gib": 1, "require_attestation": False, "wait_for": "none"})
        tap.result(status == 201, "create_vm on the fake QEMU", repr(vm)[:300])
        if status != 201:
            return
        vid, ip = vm["id"], vm["ip"]
        vm = wait_state(port, vid, ("booting",), 60, 0.2)
        tap.result(vm and vm["state"] == "booting", "the installed boot runs as a unit", repr(vm)[:300])
        for _ in range(100):
            if subprocess.run(["ip", "-n", ns, "link", "show", tapname], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        for cmd in (["link", "set", tapname, "address", vm["mac"]], ["link", "set", tapname, "up"],
                    ["addr", "add", ip + "/24", "dev", tapname],
                    ["route", "add", "default", "via", ip.rsplit(".", 1)[0] + ".1"]):
            subprocess.run(["ip", "-n", ns] + cmd, check=True)
        status, fw = tv.api(port, "POST", "/vms/%s/forward" % vid, {"port": 8080})
        got = forward_read(fw.get("address")) if status == 200 else None
        tap.result(got == ("data", b"hello from the netns\n"), "forward_port 8080 reaches the server behind the tap",
                   "%r %r" % (fw, got))
        if status != 200:
            return
    finally:
        rc, _ = d.stop(signal.SIGTERM, timeout=30)

    d, port, ok = start_fake("fwd-second")
    if not ok:
        return
    try:
        status, again = tv.api(port, "GET", "/vms/" + vid)
        want = [{"port": 8080, "address": fw["address"]}]
        tap.result(status == 200 and again["state"] == "booting" and again.get("forwards") == want,
                   "the next daemon attaches; the forward is listed with the same address", repr(again)[:400])
        got = forward_read_when_linked(fw["address"])
        tap.result(got == ("data", b"hello from the netns\n"),
                   "... listens on it again and reaches the server through the re-dialled NIC", repr(got))
    finally:
        d.stop(signal.SIGTERM, timeout=30)

    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", int(fw["address"].rsplit(":", 1)[1])))
    taken.listen(1)
    try:
        d, port, ok = start_fake("fwd-third")
        if not ok:
            return
        try:
            status, again = tv.api(port, "GET", "/vms/" + vid)
            moved = (again or {}).get("forwards") or [{}]
            address = moved[0].get("address")
            tap.result(len(moved) == 1 and moved[0].get("port") == 8080 and address not in (None, fw["address"]),
                       "another process took the port meanwhile: the forward moved to a new one", repr(moved))
            tap.result("the forward moved to %s" % address in d.stderr(), "... and the log says so",
                       d.stderr()[-500:])
            got = forward_read_when_linked(address)
            tap.result(got == ("data", b"hello from the netns\n"), "... where it reaches the server", repr(got))
            status, _ = tv.api(port, "DELETE", "/vms/" + vid)
            tap.result(status == 204 and forward_read(address, timeout=3)[0] == "refused", "delete_vm closes it",
                       "%r" % status)
        finally:
            d.stop(signal.SIGTERM, timeout=30)
    finally:
        taken.close()


def test_real_boots(work):
    missing = tv.missing_tools()
    if missing or not tv.IMAGE_DIR:
        tap.skip("real boots under the systemd launcher",
                 "needs %s" % (", ".join(missing) if missing else "VM_MANAGER_TEST_IMAGE_DIR"))
        return
    build = subprocess.run(["bash", os.path.join(tv.SOURCE_ROOT, "tests/image/build.sh"), tv.IMAGE_DIR],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tap.result(build.returncode == 0, "tests/image/build.sh", build.stdout.decode(errors="replace")[-1500:])
    if build.returncode == 0:
        test_survives_restarts(work)


if __name__ == "__main__":
    if not os.environ.get("XDG_RUNTIME_DIR"):
        print("TAP version 13\n1..0 # SKIP needs a service manager (run under with-systemd-user.sh)")
        sys.exit(0)
    sys.exit(run([test_forwards_reattach, test_restart_stops_prestart, test_real_boots], 900, "vmm-vmsd-"))
