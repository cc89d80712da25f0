#!/usr/bin/env python3
"""The VM lifecycle's error paths, against stand-ins for QEMU, swtpm and vhost-device-vsock
(tests/integration/fakes: a fake QEMU that serves QMP and misbehaves as told), so each path takes
seconds instead of a TCG boot:

  * an installer that exits non-zero: failed, "installer exited: exit status 3" and the console;
  * a guest kernel panic (its line on the console) in the installer boot or the installed boot:
    failed within seconds with the panic line, not after the install or boot timeout;
  * a failed bootstrap unit (the guest's POST /bootstrap/failed to its metadata service, as
    vm-bootstrap-failed@kubeadm.service sends it): failed at once with the unit's lines, a waiter
    hears vm_failed, and a second report (or one before the boot) is refused;
  * a QEMU whose monitor never answers: create_vm fails after 10 s and leaves nothing behind;
  * a QEMU whose monitor hangs up before answering: its exit and status are the message (the
    installer of a burst that exits before its slow monitor greets, too), or, when it lives on, the
    hang-up, within seconds; never "did not answer within" the QMP timeout;
  * system_powerdown answered with an error: stop_vm goes straight to SIGTERM;
  * a QEMU that ignores ACPI and SIGTERM: SIGTERM after --stop-timeout, SIGKILL 5 s later;
  * --vsock vhost and none: the device QEMU gets, and no vhost-device-vsock;
  * a QEMU or swtpm that is not there or not executable: create_vm fails with exec()'s errno ("No such
    file or directory", "Permission denied"), heard from the loop, which never waits for an exec().
"""

import os
import signal
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, HOST, base_env, free_port, http_request, imds_request, run, tap, wait_state  # noqa: E402
import json  # noqa: E402

FAKES = os.path.join(here, "fakes")
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False}


def api(port, method, path, body=None, timeout=120):
    status, headers, data = http_request(port, method, "/api/v1" + path,
                                         body=json.dumps(body).encode() if body is not None else None,
                                         timeout=timeout)
    return status, (json.loads(data) if data else None)


def daemon(work, name, mode, *extra, path=None, **fake_env):
    images = os.path.join(work, "images-" + name)
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    vars_ = os.path.join(work, "vars-" + name)
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU=mode)
    env.update(fake_env)
    env["PATH"] = path or FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "s-" + name),
                            "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                            "--launcher", "process", "--log-level", "debug", *extra], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "%s: serving with the fake QEMU (%s)" % (name, mode or "default"), why)
    return d, port


def test_installer_fails(work):
    d, port = daemon(work, "exit3", "install-exit:3")
    status, err = api(port, "POST", "/vms", dict(CREATE, name="bad", wait_for="installed"))
    msg = (err or {}).get("error", {}).get("message", "")
    tap.result(status == 500 and err["error"]["code"] == "vm_failed" and "installer exited: exit status 3" in msg,
               "an installer exiting 3: 500 vm_failed, installer exited: exit status 3", repr(err)[:300])
    status, vms = api(port, "GET", "/vms")
    last = vms[0].get("lastError", "") if vms else ""
    tail = vms[0].get("consoleTail", "") if vms else ""
    tap.result(vms and vms[0]["state"] == "failed" and last == "installer exited: exit status 3"
               and "fake guest: installer boot" in tail,
               "... the VM is failed: lastError is the cause, the console's tail is in consoleTail", repr(vms)[:300])
    d.stop(signal.SIGTERM, timeout=30)


PANIC_LINE = "Kernel panic - not syncing: Fatal exception in interrupt"


def panic_case(work, phase, wait_for, state):
    d, port = daemon(work, "panic-" + phase, "panic:" + phase, "--install-timeout", "10m", "--boot-timeout", "10m")
    t0 = time.monotonic()
    status, err = api(port, "POST", "/vms", dict(CREATE, name="panics", wait_for=wait_for))
    took = time.monotonic() - t0
    msg = (err or {}).get("error", {}).get("message", "")
    want = "guest kernel panicked while %s: %s" % (state, PANIC_LINE)
    tap.result(status == 500 and (err or {}).get("error", {}).get("code") == "vm_failed" and want in msg,
               "a kernel panic while %s: 500 vm_failed, %r" % (state, want), repr(err)[:300])
    tap.result(took < 30, "... within %.1f s, not after the 10 min timeout" % took)
    status, vms = api(port, "GET", "/vms")
    vm = vms[0] if vms else {}
    if vm:
        wait_state(port, vm["id"], ("failed",), 30)
        status, vm = api(port, "GET", "/vms/" + vm["id"])
    tap.result(vm.get("state") == "failed" and vm.get("lastError") == want,
               "... the VM is failed and lastError is the panic line", repr(vms)[:300])
    tap.result("The guest kernel of VM %s panicked while %s" % (vm.get("id"), state) in d.stderr(),
               "... and the daemon's log says so", d.stderr()[-500:])
    d.stop(signal.SIGTERM, timeout=30)


def test_guest_panics(work):
    panic_case(work, "install", "installed", "installing")
    panic_case(work, "boot", "ready", "booting")


def test_bootstrap_failed(work):
    d, port = daemon(work, "bootstrap", "install-exit:0", "--boot-timeout", "10m")
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="node", wait_for="none"))
    tap.result(status == 201, "create_vm (wait_for none) answered 201", repr(vm)[:300])
    vid = vm.get("id")
    sock = os.path.join(work, "s-bootstrap", "vms", vid, "imds.sock")
    vm = wait_state(port, vid, ("booting",), timeout=30)
    tap.result((vm or {}).get("state") == "booting", "the installed boot runs", repr(vm)[:300])
    report = (b"kubeadm.service failed:\n[preflight] Running pre-flight checks\n"
              b"error execution phase preflight: [preflight] Some fatal errors occurred:\n"
              b"\t[ERROR FileExisting-crictl]: crictl not found in system path\x1b[0m\n")
    st, _, body = imds_request(sock, "POST", "/giantswarm/v1/bootstrap/failed", body=report)
    tap.result(st == 200, "POST /bootstrap/failed from the booting guest: 200", "%d %r" % (st, body))
    vm = wait_state(port, vid, ("failed",), timeout=30) or {}
    ok = vm.get("state") == "failed"
    want = ("the guest's bootstrap failed while booting: kubeadm.service failed: | [preflight] Running pre-flight "
            "checks | error execution phase preflight: [preflight] Some fatal errors occurred: | "
            "?[ERROR FileExisting-crictl]: crictl not found in system path?[0m")
    tap.result(ok and vm.get("lastError") == want,
              "... the VM is failed, lastError has the unit's lines (printable, joined with ' | ')",
              repr(vm.get("lastError"))[:400])
    st, _, body = imds_request(sock, "POST", "/giantswarm/v1/bootstrap/failed", body=b"again")
    tap.result(st in (403, 409), "a second report after the VM failed is refused", "%d %r" % (st, body))
    st, _, _ = imds_request(sock, "GET", "/giantswarm/v1/bootstrap/failed")
    tap.result(st in (403, 405), "GET /bootstrap/failed: refused", str(st))

    # the next boot reports again: failed again
    status, vm = api(port, "POST", "/vms/%s/start" % vid, None)
    tap.result(status in (200, 202), "start_vm boots it again", repr(vm)[:300])
    wait_state(port, vid, ("booting",), timeout=30)
    started = time.monotonic()
    st, _, _ = imds_request(sock, "POST", "/giantswarm/v1/bootstrap/failed", body=b"kubeadm.service failed:\nboom\n")
    tap.result(st == 200, "a second boot's failure report: 200", str(st))
    vm = wait_state(port, vid, ("failed",), timeout=30) or {}
    tap.result(vm.get("state") == "failed" and vm.get("lastError", "").endswith("kubeadm.service failed: | boom")
              and time.monotonic() - started < 20,
              "... failed again within seconds, not after the 10 min boot timeout", repr(vm)[:300])
    d.stop()


def test_qmp_silent(work):
    d, port = daemon(work, "silent", "silent", "--qmp-timeout", "4s")
    t0 = time.monotonic()
    status, err = api(port, "POST", "/vms", dict(CREATE, name="mute", wait_for="none"))
    took = time.monotonic() - t0
    msg = (err or {}).get("error", {}).get("message", "")
    tap.result(status == 500 and "qmp.sock did not answer within 4s" in msg and 3.5 <= took < 12,
               "a QEMU whose monitor never answers: create_vm fails after --qmp-timeout 4s (%.1f s)" % took,
               repr(err)[:300])
    status, vms = api(port, "GET", "/vms")
    status, net = api(port, "GET", "/networks/default")
    tap.result(vms == [] and net["leases"] == [] and os.listdir(os.path.join(work, "s-silent", "vms")) == [],
               "... and leaves nothing behind: no record, no lease, no directory", "%r %r" % (vms, net))
    d.stop(signal.SIGTERM, timeout=30)


def qmp_hangup_case(work, name, mode, want, low, high, what, **fake_env):
    d, port = daemon(work, name, mode, "--qmp-timeout", "30s", **fake_env)
    t0 = time.monotonic()
    status, err = api(port, "POST", "/vms", dict(CREATE, name=name, wait_for="installed"))
    took = time.monotonic() - t0
    msg = (err or {}).get("error", {}).get("message", "")
    tap.result(status == 500 and want in msg and "did not answer" not in msg and low <= took < high,
               "%s: create_vm fails in %.1f s saying %r, not a QMP timeout" % (what, took, want),
               "%r %r" % (status, err))
    status, vms = api(port, "GET", "/vms")
    tap.result(status == 200 and all(want in vm.get("lastError", "") for vm in vms),
               "%s: list_vms agrees (no record, or a failed one saying so)" % what, repr(vms)[:400])
    d.stop(signal.SIGTERM, timeout=30)


def test_qmp_hangup(work):
    qmp_hangup_case(work, "qmpexit", "qmp-exit:4", "qemu exited during start (exit status 4)", 0, 10,
                    "a QEMU that hangs up its monitor and exits 4")
    # the burst's case: the installer exits (after 1 s) before its monitor greets (after 3 s)
    qmp_hangup_case(work, "qmpslow", "install-exit:0", "qemu exited during start (exit status 0)", 0, 10,
                    "an installer that exits 0 before its slow monitor greets", FAKE_QMP_DELAY="3")
    qmp_hangup_case(work, "qmphup", "qmp-hangup",
                    "closed the connection before answering (Connection reset by peer), and qemu did not exit "
                    "within 5s", 4.5, 15,
                    "a QEMU that hangs up its monitor and lives on")


def stop_case(work, name, mode, stop_timeout, low, high, what):
    d, port = daemon(work, name, mode, "--stop-timeout", stop_timeout)
    status, vm = api(port, "POST", "/vms", dict(CREATE, name=name, wait_for="none"))
    tap.result(status == 201 and vm["state"] == "installing", "%s: create_vm (wait_for none)" % name, repr(vm)[:200])
    if status != 201:
        return
    t0 = time.monotonic()
    status, vm = api(port, "POST", "/vms/%s/stop" % vm["id"])
    took = time.monotonic() - t0
    tap.result(status == 200 and vm["state"] == "stopped" and low <= took < high,
               "%s (%.1f s)" % (what, took), repr(vm)[:200])
    if mode == "stubborn":
        # delete_vm of a running VM escalates the same way
        status, vm = api(port, "POST", "/vms", dict(CREATE, name=name + "-del", wait_for="none"))
        t0 = time.monotonic()
        status, _ = api(port, "DELETE", "/vms/%s" % vm["id"])
        took = time.monotonic() - t0
        status2, vms = api(port, "GET", "/vms")
        tap.result(status == 204 and low <= took < high and all(v["id"] != vm["id"] for v in vms),
                   "delete_vm of a guest that ignores ACPI and SIGTERM: SIGKILL 5 s after the stop timeout, gone (%.1f s)" % took,
                   repr((status, vms))[:300])
    d.stop(signal.SIGTERM, timeout=30)


def test_stop_paths(work):
    stop_case(work, "acpi", "", "10s", 0, 3, "a guest that honours ACPI stops at once")
    stop_case(work, "acpi-error", "powerdown-error", "10s", 0, 3,
              "system_powerdown refused: SIGTERM at once, not after the 10s stop timeout")
    stop_case(work, "stubborn", "stubborn", "1s", 5.5, 12,
              "a guest that ignores ACPI and SIGTERM: SIGKILL 5 s after the 1s stop timeout")


def vsock_case(work, mode, want_device):
    d, port = daemon(work, "vsock-" + mode, "", "--vsock", mode)
    status, host = api(port, "GET", "/host")
    transport = {"vhost": "vhost-vsock", "none": "none"}[mode]
    tap.result(status == 200 and host["notify"]["transport"] == transport and host["notify"]["requested"] == mode,
               "--vsock %s: get_host says the transport is %s" % (mode, transport), repr(host.get("notify")))
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="v-" + mode, wait_for="none"))
    if status != 201:
        tap.result(False, "--vsock %s: create_vm" % mode, repr(vm)[:300])
        d.stop(signal.SIGTERM, timeout=30)
        return
    vmdir = os.path.join(work, "s-vsock-" + mode, "vms", vm["id"])
    with open(os.path.join(vmdir, "qemu.argv.json")) as f:
        argv = json.load(f)
    with open(os.path.join(vmdir, "vm.json")) as f:
        rec = json.load(f)
    devices = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-device"]
    vsock = [x for x in devices if "vsock" in x]
    want = [want_device % rec["cid"]] if want_device else []
    tap.result(vsock == want and not any("memory-backend-memfd" in a for a in argv),
               "--vsock %s: QEMU gets %s and plain guest RAM" % (mode, want or "no vsock device"), repr(vsock))
    smbios = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-smbios"]
    tap.result("-no-reboot" in argv and not any("vmm.notify_socket" in x for x in smbios)
               and any("firstboot.hostname" in x for x in smbios),
               "--vsock %s: the installer boot gets its credentials but no notify socket (nothing listens "
               "to it there)" % mode, repr(smbios)[:400])
    tap.result(rec.get("vsock") == mode and "vsock" not in rec.get("processes", {})
               and not os.path.exists(os.path.join(vmdir, "vsock.log")),
               "--vsock %s: no vhost-device-vsock, and vm.json records the transport" % mode,
               repr({k: rec.get(k) for k in ("vsock", "processes")}))
    d.stop(signal.SIGTERM, timeout=30)


def test_vsock_modes(work):
    vsock_case(work, "vhost", "vhost-vsock-pci,id=vsock0,guest-cid=%d")
    vsock_case(work, "none", None)


def test_missing_programs(work):
    """A PATH of the fakes with one of them missing or not executable (and python3 for the others):
    the spawn returns at once and the child's exec() errno comes back through the loop, into
    create_vm's answer. The daemon answers /healthz all along."""
    cases = (("qemu-system-x86_64", None, "failed to start qemu: No such file or directory"),
             ("qemu-system-x86_64", 0o644, "failed to start qemu: Permission denied"),
             ("swtpm", None, "starting swtpm: No such file or directory"))
    for i, (prog, mode, want) in enumerate(cases):
        bindir = os.path.join(work, "bin-%d" % i)
        os.makedirs(bindir)
        os.symlink(sys.executable, os.path.join(bindir, "python3"))
        # without swtpm_setup the daemon makes no CA and swtpm manufactures the vTPM itself, so the
        # spawn under test is the first of the chain (the EK certificate has test-vm-ekcert.py)
        for fake in os.listdir(FAKES):
            if fake not in (prog, "swtpm_setup"):
                os.symlink(os.path.join(FAKES, fake), os.path.join(bindir, fake))
        if mode is not None:
            with open(os.path.join(FAKES, prog), "rb") as src, open(os.path.join(bindir, prog), "wb") as dst:
                dst.write(src.read())
            os.chmod(os.path.join(bindir, prog), mode)
        d, port = daemon(work, "missing-%d" % i, "", path=bindir)
        what = "%s %s" % (prog, "not executable" if mode is not None else "missing")
        status, err = api(port, "POST", "/vms", dict(CREATE, name="nobin", wait_for="installed"), timeout=60)
        msg = (err or {}).get("error", {}).get("message", "")
        tap.result(status == 500 and want in msg and "127" not in msg,
                   "%s: create_vm fails with exec()'s errno (%s), not an exit status 127" % (what, want),
                   "%r %r" % (status, err))
        status, vms = api(port, "GET", "/vms")
        tap.result(status == 200 and vms == [], "%s: the failed create leaves nothing behind" % what, repr(vms)[:300])
        status, _, _ = http_request(port, "GET", "/healthz", timeout=5)
        tap.result(status == 200, "%s: /healthz answers" % what, status)
        rc, _ = d.stop(signal.SIGTERM, timeout=30)
        tap.result(rc == 0 and not d.sanitizer_lines(), "%s: the daemon exits 0, no sanitizer report" % what,
                   "exit %r\n%s" % (rc, "\n".join(d.sanitizer_lines()[:20])))


if __name__ == "__main__":
    sys.exit(run([test_installer_fails, test_guest_panics, test_bootstrap_failed, test_qmp_silent, test_qmp_hangup, test_stop_paths,
                  test_vsock_modes, test_missing_programs], 300, "vmm-err-"))
