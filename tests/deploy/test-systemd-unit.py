#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The host install (deploy/): `meson install` (what `make install` runs) into a private
`systemd --system` (with-systemd-system.sh), the service user from sysusers.d, the units checked by
systemd-analyze, then vm-manager.service run by that manager as a user would run it:

  * socket activation: the first request on vm-manager.socket starts the service (Type=notify);
  * the systemd-analyze security exposure score is the one docs/install.md states;
  * VMs of the test image (tests/image, real boots under TCG) run as transient units of the system
    manager, as the vm-manager user, with polkit's consent (the installed rule);
    `systemctl restart vm-manager` leaves them running and the new daemon attaches to them;
    `systemctl stop vm-manager` leaves them running too, `systemctl stop vm-manager.slice` ends them;
  * the polkit rule's reach: units of other names cannot be stopped by the vm-manager user, a
    transient unit of any name (as root, too) can be started;
  * without the polkit rule and with VM_MANAGER_LAUNCHER=systemd in /etc/vm-manager/env the service
    refuses to start and its journal says why;
  * with VM_MANAGER_LAUNCHER=process the VM's QEMU and swtpm run inside the service's sandbox
    (its cgroup, no capabilities, no new privileges, its seccomp filter) and boot all the same; a
    stop of the service ends them.

Skips (exit 0, "1..0 # SKIP") where the wrapper cannot start a manager, and without QEMU, swtpm, OVMF,
vhost-device-vsock or polkitd.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
from vmmtest import SANITIZER_RE, api, free_port, http_request, tap  # noqa: E402

SOURCE_ROOT = os.path.abspath(os.path.join(here, "..", ".."))
BUILD_ROOT = os.environ.get("VM_MANAGER_BUILD_ROOT")
IMAGE_DIR = os.environ.get("VM_MANAGER_TEST_IMAGE_DIR")
PID = os.environ.get("SDSYSTEM_PID")
UNITS = os.environ.get("SDSYSTEM_UNITS")

PREFIX = "/usr/local"
UNIT_DIR = PREFIX + "/lib/systemd/system"
STATE = "/var/lib/vm-manager"
RULE = "/etc/polkit-1/rules.d/vm-manager.rules"
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False}
# The ASan build under the unit's seccomp filter: LeakSanitizer's ptrace at exit is refused.
ENV_BASE = "ASAN_OPTIONS=detect_leaks=0\nVM_MANAGER_LOG_LEVEL=debug\n"


def ns(*cmd, check=False, timeout=120):
    """A command inside the private manager's namespaces."""
    p = subprocess.run(["nsenter", "-t", PID, "-m", "-p", "-u", "--"] + list(cmd), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), p.returncode, p.stdout[-2000:]))
    return p


def systemctl(*args):
    return ns("systemctl", "--no-pager", *args)


def prop(unit, name):
    return systemctl("show", "-P", name, unit).stdout.strip()


def journal(unit="vm-manager.service"):
    return ns("journalctl", "--no-pager", "-o", "cat", "-u", unit).stdout


def write_env(text):
    """/etc/vm-manager/env, the service's EnvironmentFile."""
    p = subprocess.run(["nsenter", "-t", PID, "-m", "-p", "-u", "--", "sh", "-c",
                        "mkdir -p /etc/vm-manager && cat > /etc/vm-manager/env"], input=ENV_BASE + text, text=True)
    assert p.returncode == 0


def proc_status(pid):
    """Fields of /proc/PID/status, read inside the namespace (its pids)."""
    out = ns("cat", "/proc/%d/status" % pid).stdout
    return dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)


def pid_alive(pid):
    return ns("kill", "-0", str(pid)).returncode == 0


def pid_user(pid):
    return ns("ps", "-o", "user=", "-p", str(pid)).stdout.strip()


def wait_healthy(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _, body = http_request(port, "GET", "/healthz", timeout=5)
            if status == 200:
                return True, body
        except OSError:
            pass
        time.sleep(0.2)
    return False, journal()[-3000:]


def vm_record(vm_id):
    return json.loads(ns("cat", "%s/vms/%s/vm.json" % (STATE, vm_id), check=True).stdout)


def documented_score():
    try:
        with open(os.path.join(SOURCE_ROOT, "docs", "install.md")) as f:
            m = re.search(r"Overall exposure level for vm-manager\.service: (\d+\.\d+)", f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def install(port):
    p = ns("meson", "install", "-C", BUILD_ROOT, "--no-rebuild", "--quiet")
    tap.result(p.returncode == 0, "meson install (make install's step) into the private system", p.stdout[-2000:])
    files = ["%s/bin/vm-manager" % PREFIX, UNIT_DIR + "/vm-manager.service", UNIT_DIR + "/vm-manager.socket",
             UNIT_DIR + "/vm-manager.slice", PREFIX + "/lib/sysusers.d/vm-manager.conf", RULE]
    missing = [f for f in files if ns("test", "-e", f).returncode != 0]
    tap.result(not missing and ns("test", "-e", PREFIX + "/bin/vm-agent").returncode != 0,
               "the binary, units, sysusers entry and polkit rule are installed; vm-agent is not", repr(missing))
    unit = ns("cat", UNIT_DIR + "/vm-manager.service").stdout
    tap.result("ExecStart=%s/bin/vm-manager serve" % PREFIX in unit, "ExecStart names the installed binary",
               unit[:500])

    p = ns("systemd-sysusers")
    ids = ns("id", "-nG", "vm-manager").stdout.split()
    tap.result(p.returncode == 0 and "vm-manager" in ids and "kvm" in ids,
               "systemd-sysusers creates the vm-manager user, a member of kvm", p.stdout + repr(ids))

    p = ns("systemd-analyze", "verify", UNIT_DIR + "/vm-manager.service", UNIT_DIR + "/vm-manager.socket",
           UNIT_DIR + "/vm-manager.slice")
    tap.result(p.returncode == 0 and p.stdout.strip() == "", "systemd-analyze verify: clean", p.stdout[-2000:])

    # the test image, where the unit's --image-dir points
    ns("install", "-d", "-o", "vm-manager", "-g", "vm-manager", "-m", "0700", STATE, STATE + "/images", check=True)
    for f in os.listdir(IMAGE_DIR):
        if f.endswith((".efi", ".raw")):
            ns("install", "-o", "vm-manager", "-g", "vm-manager", "-m", "0600", os.path.join(IMAGE_DIR, f),
               STATE + "/images/" + f, check=True)

    # The admin's drop-in: another port (8080 may be taken on this machine).
    os.makedirs(os.path.join(UNITS, "vm-manager.socket.d"), exist_ok=True)
    with open(os.path.join(UNITS, "vm-manager.socket.d", "port.conf"), "w") as f:
        f.write("[Socket]\nListenStream=\nListenStream=127.0.0.1:%d\n" % port)
    write_env("")
    systemctl("daemon-reload")


def test_unit(work):
    port = free_port()
    install(port)

    p = systemctl("start", "vm-manager.socket")
    tap.result(p.returncode == 0 and prop("vm-manager.service", "ActiveState") == "inactive",
               "vm-manager.socket listens, the service is not started yet", p.stdout)
    ok, why = wait_healthy(port)
    tap.result(ok and prop("vm-manager.service", "ActiveState") == "active",
               "the first request starts the service through the socket: /healthz 200", why)
    status = prop("vm-manager.service", "StatusText")
    main_pid = int(prop("vm-manager.service", "MainPID") or 0)
    tap.result(status == "Serving on 127.0.0.1:%d" % port and pid_user(main_pid) == "vm-manager",
               "Type=notify: READY=1 with the socket it was handed; it runs as vm-manager",
               "%r %r" % (status, pid_user(main_pid)))
    tap.result(prop("vm-manager.service", "WatchdogUSec") == "30s" and
               int(prop("vm-manager.service", "WatchdogTimestampMonotonic") or 0) > 0,
               "the watchdog is armed and pinged", prop("vm-manager.service", "WatchdogUSec"))

    p = ns("systemd-analyze", "security", "--no-pager", "vm-manager.service")
    m = re.search(r"Overall exposure level for vm-manager\.service: (\d+\.\d+)", p.stdout)
    score = m.group(1) if m else None
    tap.result(score is not None and score == documented_score(),
               "systemd-analyze security: exposure %s, as docs/install.md says" % score,
               "measured %r, documented %r\n%s" % (score, documented_score(), p.stdout[-1500:]))
    tap.result("VMs run as transient systemd units in vm-manager.slice" in journal(),
               "the daemon runs VMs as units of the system manager (polkit allows it)", journal()[-2000:])

    status, vm = api(port, "POST", "/vms", dict(CREATE, name="svc"), timeout=600)
    ok = status == 201 and vm.get("state") == "ready"
    tap.result(ok, "create_vm through the service: ready", repr(vm)[:1500] + journal()[-2000:])
    if not ok:
        return
    vm_id = vm["id"]
    rec = vm_record(vm_id)
    qemu_unit = rec.get("processes", {}).get("qemu", {}).get("unit")
    qemu_pid = int(prop(qemu_unit, "MainPID") or 0) if qemu_unit else 0
    cgroup = prop(qemu_unit, "ControlGroup") if qemu_unit else ""
    tap.result(qemu_unit == "vm-manager-%s-qemu.service" % vm_id and cgroup.endswith("/vm-manager.slice/" + qemu_unit)
               and pid_user(qemu_pid) == "vm-manager",
               "QEMU runs as vm-manager in its own unit in vm-manager.slice", "%r %r %r" % (qemu_unit, cgroup,
                                                                                      pid_user(qemu_pid)))

    t0 = time.monotonic()
    p = systemctl("restart", "vm-manager.service")
    ok, why = wait_healthy(port)
    new_pid = int(prop("vm-manager.service", "MainPID") or 0)
    tap.result(p.returncode == 0 and ok and new_pid not in (0, main_pid),
               "systemctl restart vm-manager (%.1f s)" % (time.monotonic() - t0), p.stdout + str(why))
    status, again = api(port, "GET", "/vms/" + vm_id)
    tap.result(pid_alive(qemu_pid) and int(prop(qemu_unit, "MainPID") or 0) == qemu_pid,
               "... the VM's QEMU kept running through it", "pid %d" % qemu_pid)
    tap.result(status == 200 and again.get("state") == "ready" and "lastError" not in again,
               "... and the new daemon attached to it: ready, no error", repr(again)[:800])

    p = systemctl("stop", "vm-manager.socket", "vm-manager.service")
    time.sleep(1)
    tap.result(p.returncode == 0 and prop("vm-manager.service", "ActiveState") == "inactive" and pid_alive(qemu_pid),
               "systemctl stop vm-manager leaves the VM running", p.stdout)
    p = systemctl("stop", "vm-manager.slice")
    tap.result(p.returncode == 0 and not pid_alive(qemu_pid), "systemctl stop vm-manager.slice ends it", p.stdout)
    systemctl("start", "vm-manager.socket")
    ok, why = wait_healthy(port)
    # the reattach reads the unit's state on the loop, after start-up: the record's state until then
    deadline = time.monotonic() + 30
    while True:
        status, again = api(port, "GET", "/vms/" + vm_id)
        if (status == 200 and again.get("state") == "stopped") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    tap.result(ok and status == 200 and again.get("state") == "stopped",
               "the next start finds the VM stopped", repr(again)[:800])
    status, _ = api(port, "DELETE", "/vms/" + vm_id)
    tap.result(status == 204, "delete_vm", str(status))

    test_rule_scope()
    test_without_polkit(port)
    test_process_launcher(port)

    text = journal()
    bad = [line for line in text.splitlines() if SANITIZER_RE.search(line)]
    tap.result(not bad, "no sanitizer report in the service's journal", "\n".join(bad[:20]))


def test_rule_scope():
    """What the installed rule gives the vm-manager user, as docs/install.md ("Security note") says:
    units of other names cannot be stopped, but systemd 252 names no unit for StartTransientUnit, so
    any transient unit can be started, as root too."""
    p = ns("runuser", "-u", "vm-manager", "--", "busctl", "call", "org.freedesktop.systemd1",
           "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager", "StopUnit", "ss", "dbus.service", "replace")
    tap.result(p.returncode != 0 and prop("dbus.service", "ActiveState") == "active",
               "the vm-manager user cannot stop a unit of another name (dbus.service)", p.stdout)
    p = ns("runuser", "-u", "vm-manager", "--", "systemd-run", "--no-ask-password", "--wait", "--pipe", "-q",
           "-p", "User=root", "id", "-u")
    tap.result(p.returncode == 0 and p.stdout.strip().splitlines()[-1:] == ["0"],
               "... but it can start a transient unit as root: the user is equivalent to root", p.stdout)


def test_without_polkit(port):
    ns("mv", RULE, RULE + ".off", check=True)
    systemctl("restart", "polkit.service")
    write_env("VM_MANAGER_LAUNCHER=systemd\n")
    systemctl("stop", "vm-manager.socket", "vm-manager.service")
    systemctl("reset-failed", "vm-manager.service")
    since = ns("date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    time.sleep(1)
    p = systemctl("start", "vm-manager.service")
    text = ns("journalctl", "--no-pager", "-o", "cat", "-u", "vm-manager.service", "--since", since).stdout
    tap.result(p.returncode != 0 and "systemd launcher unavailable: polkit does not allow this user" in text,
               "without the polkit rule and with --launcher systemd the service does not start, and says why",
               p.stdout + text[-2000:])
    systemctl("stop", "vm-manager.service")
    systemctl("reset-failed", "vm-manager.service")
    ns("mv", RULE + ".off", RULE, check=True)
    systemctl("restart", "polkit.service")


def test_process_launcher(port):
    write_env("VM_MANAGER_LAUNCHER=process\n")
    systemctl("start", "vm-manager.socket")
    ok, why = wait_healthy(port)
    tap.result(ok, "VM_MANAGER_LAUNCHER=process from /etc/vm-manager/env: serving", why)
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="sandboxed"), timeout=600)
    ok = status == 201 and vm.get("state") == "ready"
    tap.result(ok, "create_vm with QEMU, swtpm and vhost-device-vsock inside the service's sandbox: ready",
               repr(vm)[:1500] + journal()[-3000:])
    if not ok:
        return
    qemu_pid = int(vm_record(vm["id"]).get("processes", {}).get("qemu", {}).get("pid") or 0)
    st = proc_status(qemu_pid) if qemu_pid else {}
    cgroup = ns("cat", "/proc/%d/cgroup" % qemu_pid).stdout if qemu_pid else ""
    tap.result("/system.slice/vm-manager.service" in cgroup and st.get("NoNewPrivs") == "1"
               and st.get("Seccomp") == "2" and st.get("CapBnd") == "0000000000000000"
               and pid_user(qemu_pid) == "vm-manager",
               "QEMU runs in vm-manager.service's cgroup, as vm-manager, with no capabilities, no new "
               "privileges and the seccomp filter",
               "pid %d\n%s\n%r" % (qemu_pid, cgroup, {k: st.get(k) for k in ("NoNewPrivs", "Seccomp", "CapBnd")}))
    p = systemctl("stop", "vm-manager.socket", "vm-manager.service")
    tap.result(p.returncode == 0 and prop("vm-manager.service", "Result") == "success" and not pid_alive(qemu_pid),
               "systemctl stop vm-manager ends VMs that are its child processes", p.stdout)
    logs = ns("journalctl", "--no-pager", "-u", "vm-manager").stdout
    tap.result("serving on http://127.0.0.1:%d" % port in logs, "journalctl -u vm-manager has the daemon's log",
               logs[-1000:])


def main():
    print("TAP version 13", flush=True)
    if not PID:
        print("1..0 # SKIP needs a private system manager (run under with-systemd-system.sh)")
        return 0
    missing = [t for t in ("qemu-system-x86_64", "swtpm", "vhost-device-vsock", "meson") if not shutil.which(t)]
    if not os.path.exists("/usr/share/OVMF/OVMF_CODE_4M.fd"):
        missing.append("ovmf")
    if not os.path.exists("/usr/lib/polkit-1/polkitd"):
        missing.append("polkitd")
    if missing or not BUILD_ROOT or not IMAGE_DIR:
        print("1..0 # SKIP needs %s" % (", ".join(missing) or "VM_MANAGER_BUILD_ROOT and VM_MANAGER_TEST_IMAGE_DIR"))
        return 0
    build = subprocess.run(["bash", os.path.join(SOURCE_ROOT, "tests/image/build.sh"), IMAGE_DIR],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if build.returncode != 0:
        tap.result(False, "tests/image/build.sh", build.stdout[-2000:])
    else:
        t0 = time.monotonic()
        try:
            test_unit(None)
        except Exception:  # noqa: BLE001
            import traceback
            tap.result(False, "test_unit ran to the end", traceback.format_exc() + journal()[-3000:])
        tap.diag("total: %.1f s" % (time.monotonic() - t0))
    print("1..%d" % tap.n, flush=True)
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
