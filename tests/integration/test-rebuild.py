#!/usr/bin/env python3
"""A daemon that survives its own rebuild (issue 33), against the fake QEMU (tests/integration/fakes):

  * the README's first hour: `vm-manager serve` runs from a copy of the binary, the copy is replaced
    the way a rebuild replaces it (a new file renamed over the path: the running daemon's
    /proc/<pid>/exe then ends in " (deleted)"), and create_vm (MCP, then REST) still installs the VM
    on the host: the host-install helper is the daemon's own executable run through the handle it
    took at start-up; then the file is deleted outright, and a third create works the same;
  * exec_vm after that, whose ssh session is the same executable run again (`vm-manager exec-ssh`),
    against a real sshd in a network namespace as in test-network.py (root, /dev/net/tun, ip and
    sshd, else skipped): 409 while no sshd answers, then the command's output;
  * a build with no change (ninja in this build directory, $MESON_BUILD_ROOT) leaves vm-manager and
    vm-agent as they were: the same bytes, the same mtime, nothing linked; and the build time they
    carry is the commit's (or SOURCE_DATE_EPOCH's), not the clock's.
"""

import datetime
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import vmmtest  # noqa: E402
from vmmtest import FAKES, HOST, Daemon, McpClient, api, base_env, free_port, run, tap, tool_json  # noqa: E402

CREATE = {"memory_mib": 512, "disk_gib": 3, "require_attestation": False}


def sibling(name):
    """Another test script of this directory as a module (for its helpers; its main() does not run)."""
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), os.path.join(here, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def serve_copy(work, exe, images, firmware, env):
    """`serve` from exe rather than $VM_MANAGER_BIN (vmmtest.Daemon runs vmmtest.BIN)."""
    port = free_port()
    saved, vmmtest.BIN = vmmtest.BIN, exe
    try:
        d = Daemon(work, "copy", ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "state"),
                                  "--image-dir", images, "--ovmf-code", firmware, "--ovmf-vars", firmware,
                                  "--launcher", "process", "--install-mode", "host", "--log-level", "debug"],
                   env=env)
    finally:
        vmmtest.BIN = saved
    ok, why = d.wait_healthy(port, timeout=20)
    return d, port, ok, why


def installed(vm, work, what):
    """The VM went through the host install: installedAt, installMode host, the helper's log."""
    log_path = os.path.join(work, "state", "vms", vm.get("id", "?"), "install.log")
    log = open(log_path).read() if os.path.exists(log_path) else ""
    tap.result(vm.get("installMode") == "host" and vm.get("installedAt") and "host-install: done" in log
               and vm.get("state") in ("creating", "booting"),
               "%s: the host-install helper ran and the VM is installed (%s)" % (what, vm.get("state")),
               repr(vm)[:500] + "\ninstall.log: " + log[-400:])


def test_replaced_binary(work):
    hi = sibling("test-host-install")
    images = os.path.join(work, "images")
    os.makedirs(images)
    hi.make_image(images, "base_1.0")
    hi.make_layout(images, "base_1.0")
    firmware = os.path.join(work, "vars")
    with open(firmware, "wb") as f:
        f.write(b"\0" * 4096)

    bindir = os.path.join(work, "bin")
    os.makedirs(bindir)
    exe = os.path.join(bindir, "vm-manager")
    shutil.copy2(vmmtest.BIN, exe)

    ns = None
    tapname = "vmmr%d" % (os.getpid() % 100000)
    plan_file = os.path.join(work, "plan.json")
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None)
    if os.geteuid() == 0 and sshd and os.path.exists("/dev/net/tun") and shutil.which("ip"):
        ns = "vmm-rebuild-%d" % os.getpid()
    with open(plan_file, "w") as f:
        json.dump({"sshguest": {"netns": ns, "tap": tapname}} if ns else {}, f)
    env = base_env(work, FAKE_QEMU="", FAKE_GUEST=os.environ.get("FAKE_GUEST", ""), FAKE_GUEST_PLAN=plan_file)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")

    d, port, ok, why = serve_copy(work, exe, images, firmware, env)
    tap.result(ok, "serving from a copy of the binary", why)
    if not ok:
        return

    # the rebuild: the linker (and install, and cp --remove-destination) puts a new file at the path
    new = exe + ".new"
    shutil.copy2(vmmtest.BIN, new)
    with open(new, "ab") as f:
        f.write(b"\0rebuilt")
    os.rename(new, exe)
    link = os.readlink("/proc/%d/exe" % d.pid)
    tap.result(link.endswith(" (deleted)"), "after the rebuild the daemon's /proc/<pid>/exe names a deleted file",
               link)

    # the README's first create, through MCP as the user did
    mcp = McpClient(port)
    mcp.initialize()
    t0 = time.monotonic()
    result = mcp.call("create_vm", dict(CREATE, name="first", wait_for="installed"))
    try:
        vm, _ = tool_json(result)
    except ValueError as e:
        vm = {"error": str(e)}
    tap.diag("create_vm (MCP) took %.1f s" % (time.monotonic() - t0))
    installed(vm, work, "create_vm over MCP after the rebuild")

    status, vm = api(port, "POST", "/vms", dict(CREATE, name="second", wait_for="installed"))
    tap.result(status == 201, "create_vm over REST after the rebuild: 201", repr(vm)[:300])
    installed(vm or {}, work, "REST after the rebuild")

    # the binary gone altogether
    os.unlink(exe)
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="third", wait_for="installed"))
    tap.result(status == 201, "create_vm with the binary deleted: 201", repr(vm)[:300])
    installed(vm or {}, work, "with the binary deleted")

    if ns:
        exec_after_rebuild(work, port, ns, tapname, sshd)
    else:
        tap.skip("exec_vm from a deleted binary", "needs root, /dev/net/tun, ip and sshd (openssh-server)")

    rc, _ = d.stop(signal.SIGTERM, timeout=30)
    tap.result(rc == 0 and not d.sanitizer_lines(), "the daemon exits 0 on SIGTERM, no sanitizer report",
               "exit %r\n%s" % (rc, "\n".join(d.sanitizer_lines()[:20])))


def exec_after_rebuild(work, port, ns, tapname, sshd):
    net = sibling("test-network")
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    procs = []
    try:
        # the installer boot, as in test-network.py: the fake QEMU plays the tap from its start (with
        # -S, beside a host install, it would only from cont, racing the daemon's dial of the NIC)
        status, vm = api(port, "POST", "/vms", dict(CREATE, name="sshguest", hostname="sshguest",
                                                    install_mode="boot", wait_for="none"))
        tap.result(status == 201, "exec: create_vm whose NIC is a tap with an sshd behind it", repr(vm)[:300])
        if status != 201:
            return
        vid, ip, mac = vm["id"], vm["ip"], vm["mac"]
        for _ in range(100):
            if subprocess.run(["ip", "-n", ns, "link", "show", tapname], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        net.sh("ip", "-n", ns, "link", "set", tapname, "address", mac)
        net.sh("ip", "-n", ns, "link", "set", tapname, "up")
        net.sh("ip", "-n", ns, "link", "set", "lo", "up")
        net.sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", tapname)
        net.sh("ip", "-n", ns, "route", "add", "default", "via", ip.rsplit(".", 1)[0] + ".1")

        # the helper ran (a helper that could not start would be a 500): no sshd yet, come back later
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["true"]}, timeout=60)
        tap.result(status == 409 and r["error"]["code"] == "conflict" and "sshd does not answer yet" in
                   r["error"]["message"], "exec_vm with the binary deleted, no sshd yet: 409 conflict", repr(r)[:400])

        procs.append(net.start_sshd(work, ns, sshd, ip, vm["sshPublicKey"], "r"))
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["echo", "still", "here"]}, timeout=60)
        tap.result(status == 200 and r == {"stdout": "still here\n", "stderr": "", "exitCode": 0},
                   "exec_vm with the binary deleted: the ssh session runs in the re-executed helper", repr(r)[:400])
        status, _ = api(port, "DELETE", "/vms/" + vid, timeout=60)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def snapshot(paths):
    out = {}
    for p in paths:
        st = os.stat(p)
        with open(p, "rb") as f:
            out[p] = (st.st_mtime_ns, st.st_ino, hashlib.sha256(f.read()).hexdigest())
    return out


def test_noop_rebuild(work):
    root, ninja = os.environ.get("MESON_BUILD_ROOT"), os.environ.get("NINJA")
    agent = os.environ.get("VM_AGENT")
    if not root or not ninja or not agent or not os.path.exists(os.path.join(root, "build.ninja")):
        tap.skip("a build with no change", "needs MESON_BUILD_ROOT, NINJA and VM_AGENT (set by meson)")
        return
    binaries = [vmmtest.BIN, agent, os.path.join(root, "version.c")]

    def build():
        return subprocess.run([ninja, "-C", root], capture_output=True, text=True, timeout=600)

    # up to date first (meson test built it; a --no-rebuild run after an edit would not have)
    first = build()
    if first.returncode != 0:
        tap.result(False, "ninja brings the build directory up to date", first.stdout[-2000:] + first.stderr[-2000:])
        return
    before = snapshot(binaries)
    time.sleep(1.1)  # a file written again now would show in its mtime even on a coarse clock
    again = build()
    after = snapshot(binaries)
    linked = [line for line in again.stdout.splitlines() if "Linking" in line or "Compiling" in line]
    tap.result(again.returncode == 0 and before == after and not linked,
               "ninja with no change: vm-manager, vm-agent and version.c keep their bytes, inode and mtime; "
               "nothing compiled or linked",
               "before %r\nafter %r\n%s" % (before, after, again.stdout[-2000:]))

    # the stamp: the commit's time (or SOURCE_DATE_EPOCH's), so that it does not change by itself
    out = subprocess.run([vmmtest.BIN, "version"], capture_output=True, text=True).stdout
    built = ([line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("built:")]
             or [""])[0]
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    src = os.path.dirname(os.path.dirname(here))
    if not epoch:
        git = subprocess.run(["git", "-C", src, "log", "-1", "--format=%ct", "HEAD"], capture_output=True, text=True)
        epoch = git.stdout.strip() if git.returncode == 0 else None
    want = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            if epoch else "unknown")
    tap.result(built == want, "vm-manager version: built is the commit's time (%s), not the clock's" % want, out)


if __name__ == "__main__":
    sys.exit(run([test_replaced_binary, test_noop_rebuild], 300, "vmm-rebuild-"))
