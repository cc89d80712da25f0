#!/usr/bin/env python3
"""A QMP command whose reply is still pending when its VM, its QEMU or the daemon goes away. The
reply callbacks of system_powerdown (stop_vm, delete_vm, the daemon's shutdown) and of cont (the
first boot's QEMU, paused beside a host install) get the Vm as borrowed userdata: every way the
connection can end with such a reply pending must end it exactly once, with the Vm still there.

The fake QEMU (tests/integration/fakes) leaves the command unanswered ($FAKE_QMP_HANG) or closes its
monitor on it ($FAKE_QMP_HANGUP), and logs what it received to <vm dir>/qemu.qmp, so each case acts
only once the reply is known to be pending:

  * system_powerdown pending, then: the stop timeout (SIGTERM ends QEMU), QEMU killed, delete_vm,
    the monitor hanging up, SIGTERM to the daemon (which powers the VM down itself), and SIGTERM
    twice (the daemon exits at once, freeing the VM with the reply pending);
  * cont pending, then: the command's own 10 s timeout, delete_vm, QEMU killed, the monitor hanging
    up, SIGTERM to the daemon, and SIGTERM twice.

Every daemon must exit 0 on SIGTERM with nothing from ASan, LSan or UBSan in its stderr (run with a
-Db_sanitize=address,undefined build to make that mean something). Exiting at once (SIGTERM twice)
answers what still waits for a VM ("vm-manager is shutting down") before the servers and the VMs
are freed, so a stop_vm in flight gets its answer and nothing it allocated leaks.
"""

import importlib.util
import os
import signal
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, HOST, api, base_env, free_port, run, tap  # noqa: E402

# the host install's image and layout makers, and the fake QEMU's pid by its VM directory
_spec = importlib.util.spec_from_file_location("host_install", os.path.join(here, "test-host-install.py"))
host_install = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host_install)

FAKES = os.path.join(here, "fakes")
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False}
HOST_CREATE = {"memory_mib": 512, "disk_gib": 3, "require_attestation": False}


def daemon(work, name, images, env_extra, *extra):
    vars_ = os.path.join(work, "vars-" + name)
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="", **env_extra)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "s-" + name),
                            "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                            "--launcher", "process", "--log-level", "debug", *extra], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "%s: serving with the fake QEMU (%s)" % (name, env_extra), why)
    return d, port, ok


def fake_images(work, name):
    images = os.path.join(work, "images-" + name)
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    return images


def host_images(work, name):
    images = os.path.join(work, "images-" + name)
    os.makedirs(images)
    host_install.make_image(images, "host_1.0")
    host_install.make_layout(images, "host_1.0")
    return images


def vm_dir(work, name, vm_id):
    return os.path.join(work, "s-" + name, "vms", vm_id)


def wait_command(vmdir, command, timeout=30):
    """True once the fake QEMU of vmdir has received command (and, told to, not answered it)."""
    deadline = time.monotonic() + timeout
    path = os.path.join(vmdir, "qemu.qmp")
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if command in f.read().split():
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def qemu_gone_late(vmdir, timeout=10):
    """The fake QEMU of vmdir still running after timeout seconds (a list of pids, empty once gone)."""
    deadline = time.monotonic() + timeout
    left = host_install.qemu_of(vmdir)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = host_install.qemu_of(vmdir)
    return left


def in_background(fn, *args):
    """Runs fn(*args) in a thread; returns a dict that gets its result as "r" (or the exception)."""
    out = {}

    def body():
        try:
            out["r"] = fn(*args)
        except Exception as e:  # noqa: BLE001 - the daemon may go away under it
            out["r"] = (None, repr(e))
    out["thread"] = threading.Thread(target=body, daemon=True)
    out["thread"].start()
    return out


def vm_of(port, vm_id):
    status, vm = api(port, "GET", "/vms/" + vm_id)
    return vm if status == 200 and isinstance(vm, dict) else {}


def wait_vm(port, vm_id, pred, timeout=30):
    deadline = time.monotonic() + timeout
    vm = vm_of(port, vm_id)
    while not pred(vm) and time.monotonic() < deadline:
        time.sleep(0.1)
        vm = vm_of(port, vm_id)
    return vm


def check_exit(d, what, sig=signal.SIGTERM, twice=False, timeout=40):
    """Ends the daemon (SIGTERM; twice: at once; sig None: it was told already) and checks its exit:
    no memory error (ASan, UBSan) at all, and status 0 with no leak (LSan)."""
    if twice:
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
    rc, took = d.stop(sig, timeout=timeout)
    lines = d.sanitizer_lines()
    errors = [x for x in lines if "LeakSanitizer" not in x]
    leaks = [x for x in lines if "LeakSanitizer" in x]
    tail = d.stderr()[-3000:]
    how = "SIGTERM twice" if twice else "SIGTERM"
    tap.result(rc is not None and not errors,
               "%s: the daemon exits on %s with no memory error (no double free, no use after free) (%.1f s)" % (
                   what, how, took),
               "exit %r; sanitizer: %r\n%s" % (rc, errors[:5], tail))
    tap.result(rc == 0 and not leaks, "%s: ... with status 0 and no leak" % what,
               "exit %r; sanitizer: %r\n%s" % (rc, leaks[:5], tail))


# ---- system_powerdown ----


def create_running(port, name):
    status, vm = api(port, "POST", "/vms", dict(CREATE, name=name, wait_for="none"))
    ok = status == 201 and isinstance(vm, dict) and vm.get("state") == "installing"
    tap.result(ok, "%s: create_vm (wait_for none): installing" % name, repr((status, vm))[:300])
    return vm if ok else None


def stop_pending(work, dname, port, name):
    """A VM whose stop_vm is in flight with system_powerdown unanswered: (vm, vmdir, the stop call)."""
    vm = create_running(port, name)
    if not vm:
        return None, None, None
    vmdir = vm_dir(work, dname, vm["id"])
    call = in_background(api, port, "POST", "/vms/%s/stop" % vm["id"], None, 60)
    ok = wait_command(vmdir, "system_powerdown")
    tap.result(ok, "%s: stop_vm sent system_powerdown, unanswered" % name)
    return (vm, vmdir, call) if ok else (None, None, None)


def test_powerdown_pending(work):
    images = fake_images(work, "pd")
    # a stop timeout long enough that only the event under test ends the wait
    d, port, ok = daemon(work, "pd", images, {"FAKE_QMP_HANG": "system_powerdown"}, "--stop-timeout", "30s")
    if not ok:
        return

    # QEMU killed while the reply is pending: its exit tears the connection down
    vm, vmdir, call = stop_pending(work, "pd", port, "killed")
    if vm:
        for pid in host_install.qemu_of(vmdir):
            os.kill(pid, signal.SIGKILL)
        call["thread"].join(20)
        status, rec = call.get("r", (None, None))
        tap.result(status == 200 and isinstance(rec, dict) and rec.get("state") in ("stopped", "failed"),
                   "killed: QEMU killed with system_powerdown pending: stop_vm answers, the VM is down",
                   repr(call.get("r"))[:300])

    # delete_vm while the stop's reply is pending, then QEMU killed to end the wait
    vm, vmdir, call = stop_pending(work, "pd", port, "deleted")
    if vm:
        dcall = in_background(api, port, "DELETE", "/vms/" + vm["id"], None, 60)
        wait_vm(port, vm["id"], lambda v: v.get("state") in ("deleting", None))
        for pid in host_install.qemu_of(vmdir):
            os.kill(pid, signal.SIGKILL)
        dcall["thread"].join(20)
        call["thread"].join(20)
        status, vms = api(port, "GET", "/vms")
        tap.result(dcall.get("r", (None,))[0] in (200, 204) and isinstance(vms, list)
                   and all(v["id"] != vm["id"] for v in vms),
                   "deleted: delete_vm with system_powerdown pending: the VM is gone once QEMU is",
                   repr((dcall.get("r"), call.get("r")))[:300])

    # the daemon's shutdown with a VM running: it sends system_powerdown itself; a second SIGTERM
    # exits at once, the reply still pending
    vm = create_running(port, "shutdown")
    if vm:
        vmdir = vm_dir(work, "pd", vm["id"])
        d.proc.send_signal(signal.SIGTERM)
        ok = wait_command(vmdir, "system_powerdown")
        tap.result(ok, "shutdown: SIGTERM: the daemon powers the VM down, system_powerdown unanswered")
        # the reply times out after 10 s: SIGTERM to QEMU, stopped, and the daemon goes
        check_exit(d, "shutdown: system_powerdown pending", sig=None, timeout=30)
        for pid in host_install.qemu_of(vmdir):
            os.kill(pid, signal.SIGKILL)
    else:
        check_exit(d, "powerdown")

    # the stop timeout with the reply pending (SIGTERM ends the fake), then SIGTERM to the daemon
    # while another stop_vm's reply is pending: the daemon waits for it, QEMU ends at the timeout
    d, port, ok = daemon(work, "pdt", images, {"FAKE_QMP_HANG": "system_powerdown"}, "--stop-timeout", "2s")
    if ok:
        vm, vmdir, call = stop_pending(work, "pdt", port, "timeout")
        if vm:
            call["thread"].join(20)
            status, rec = call.get("r", (None, None))
            tap.result(status == 200 and isinstance(rec, dict) and rec.get("state") == "stopped",
                       "timeout: system_powerdown unanswered: SIGTERM after the 2s stop timeout, stopped",
                       repr(call.get("r"))[:300])
        vm, vmdir, call = stop_pending(work, "pdt", port, "term")
        check_exit(d, "term: stop_vm in flight with system_powerdown pending")
        if call:
            call["thread"].join(5)

    # a second SIGTERM with the reply pending: the daemon exits at once, freeing the VM (and the
    # shutdown's bookkeeping) with the command still pending
    d, port, ok = daemon(work, "pd2", images, {"FAKE_QMP_HANG": "system_powerdown"}, "--stop-timeout", "30s")
    if ok:
        vm, vmdir, call = stop_pending(work, "pd2", port, "twice")
        vm2 = create_running(port, "twice-idle")
        check_exit(d, "twice: stop_vm in flight with system_powerdown pending", twice=True)
        for v in (vm, vm2):
            if v:
                for pid in host_install.qemu_of(vm_dir(work, "pd2", v["id"])):
                    os.kill(pid, signal.SIGKILL)

    # the monitor hangs up on system_powerdown: -ECONNRESET on a live connection, SIGTERM at once
    d, port, ok = daemon(work, "pdh", images, {"FAKE_QMP_HANGUP": "system_powerdown"}, "--stop-timeout", "30s")
    if ok:
        vm, vmdir, call = stop_pending(work, "pdh", port, "hangup")
        if vm:
            call["thread"].join(20)
            status, rec = call.get("r", (None, None))
            tap.result(status == 200 and isinstance(rec, dict) and rec.get("state") == "stopped",
                       "hangup: the monitor closes on system_powerdown: SIGTERM at once, stopped",
                       repr(call.get("r"))[:300])
        # and during the daemon's own shutdown
        vm = create_running(port, "hangup-shutdown")
        check_exit(d, "hangup: the monitor closes on the shutdown's system_powerdown")


# ---- cont ----


def cont_daemon(work, name, env_extra):
    """A daemon whose host installs wait in mke2fs (the last step before the GPT) until the gate file
    exists: the first boot's QEMU starts paused beside the install, and gets cont once it ends."""
    gate = os.path.join(work, name + ".gate")
    bindir = host_install.held_mke2fs(work, name + "-bin", '[ ! -e "%s" ]' % gate)
    d, port, ok = daemon(work, name, host_images(work, name),
                         dict(env_extra, PATH=bindir + ":" + os.environ.get("PATH", "")))
    return d, port, ok, gate


def create_cont_pending(work, dname, port, gate, name):
    """A host-mode VM whose first boot's QEMU, started paused beside the install, got cont after it
    and has not answered: (vm, vmdir), the VM still creating."""
    if os.path.exists(gate):
        os.unlink(gate)
    status, vm = api(port, "POST", "/vms", dict(HOST_CREATE, name=name, image="host_1.0", wait_for="none"),
                     timeout=30)
    if status != 201 or not isinstance(vm, dict):
        tap.result(False, "%s: create_vm (host install, wait_for none)" % name, repr((status, vm))[:400])
        return None, None
    vmdir = vm_dir(work, dname, vm["id"])
    paused = vm.get("state") == "creating" and bool(host_install.qemu_of(vmdir))
    with open(gate, "w"):
        pass
    ok = wait_command(vmdir, "cont")
    rec = vm_of(port, vm["id"])
    tap.result(paused and ok and rec.get("state") == "creating",
               "%s: QEMU paused beside the install; the install done, cont sent and unanswered: creating" % name,
               repr((vm.get("state"), rec))[:300])
    return (vm, vmdir) if ok else (None, None)


def test_cont_pending(work):
    d, port, ok, gate = cont_daemon(work, "cont", {"FAKE_QMP_HANG": "cont"})
    if not ok:
        return

    # the command's own timeout (10 s): the callback ends the start and drops the connection
    vm, vmdir = create_cont_pending(work, "cont", port, gate, "c-timeout")
    if vm:
        rec = wait_vm(port, vm["id"], lambda v: v.get("state") != "creating", timeout=20)
        tap.result(rec.get("state") == "failed" and "cont" in (rec.get("lastError") or "")
                   and not qemu_gone_late(vmdir),
                   "c-timeout: cont unanswered for 10 s: failed, saying so, QEMU gone", repr(rec)[:400])

    # delete_vm with cont pending
    vm, vmdir = create_cont_pending(work, "cont", port, gate, "c-delete")
    if vm:
        status, _ = api(port, "DELETE", "/vms/" + vm["id"])
        status2, vms = api(port, "GET", "/vms")
        gone = isinstance(vms, list) and all(v["id"] != vm["id"] for v in vms)
        tap.result(status in (200, 204) and gone and not qemu_gone_late(vmdir),
                   "c-delete: delete_vm with cont pending: the VM and its QEMU are gone", repr((status, vms))[:300])

    # QEMU killed with cont pending: its exit or the monitor's end, whichever comes first
    vm, vmdir = create_cont_pending(work, "cont", port, gate, "c-killed")
    if vm:
        for pid in host_install.qemu_of(vmdir):
            os.kill(pid, signal.SIGKILL)
        rec = wait_vm(port, vm["id"], lambda v: v.get("state") != "creating")
        tap.result(rec.get("state") == "failed", "c-killed: QEMU killed with cont pending: failed", repr(rec)[:300])

    # the daemon's shutdown with cont pending: the start chain ends (-ESHUTDOWN)
    vm, vmdir = create_cont_pending(work, "cont", port, gate, "c-shutdown")
    check_exit(d, "c-shutdown: cont pending")

    # a second SIGTERM with cont pending: the VM freed with the reply pending
    d, port, ok, gate = cont_daemon(work, "cont2", {"FAKE_QMP_HANG": "cont"})
    if ok:
        vm, vmdir = create_cont_pending(work, "cont2", port, gate, "c-twice")
        check_exit(d, "c-twice: cont pending", twice=True)
        if vmdir:
            for pid in host_install.qemu_of(vmdir):
                os.kill(pid, signal.SIGKILL)

    # the monitor hangs up on cont: -ECONNRESET on the live connection fails the start
    d, port, ok, gate = cont_daemon(work, "conth", {"FAKE_QMP_HANGUP": "cont"})
    if ok:
        if os.path.exists(gate):
            os.unlink(gate)
        status, vm = api(port, "POST", "/vms", dict(HOST_CREATE, name="c-hangup", image="host_1.0",
                                                      wait_for="none"), timeout=30)
        if status == 201:
            vmdir = vm_dir(work, "conth", vm["id"])
            with open(gate, "w"):
                pass
            ok = wait_command(vmdir, "cont")
            rec = wait_vm(port, vm["id"], lambda v: v.get("state") != "creating")
            tap.result(ok and rec.get("state") == "failed" and "cont" in (rec.get("lastError") or ""),
                       "c-hangup: the monitor closes on cont: failed, saying so", repr(rec)[:400])
        else:
            tap.result(False, "c-hangup: create_vm", repr((status, vm))[:300])
        check_exit(d, "c-hangup")


if __name__ == "__main__":
    sys.exit(run([test_powerdown_pending, test_cont_pending], 280, "vmm-qmp-"))
