#!/usr/bin/env python3
"""End to end on real boots: the daemon, driven through its API as a user would, running VMs from
the guest image that images/ builds (UKI, erofs root under signed dm-verity, systemd-sysinstall,
vm-agent attestation, Ignition, the Kubernetes sysext) under QEMU, OVMF and swtpm.

Tests (E2E_TESTS, comma-separated; default: all):
  create      create_vm with wait_for ready in install mode host (the daemon's default): the host
              install, then the installed boot; the guest imports its hostname and keys from the IMDS
              and sends READY=1; timings recorded
  ignition    CAPI-shaped Ignition user-data: a file and a socket-activated unit are applied;
              exec_vm sees them, forward_port reaches the unit's port
  metrics     the guest's systemd-report upload reaches /metrics
  reboot      reboot_vm: ready again; user-data's file, machine id and ssh host key unchanged
  kubernetes  the version of /kubernetes-version is pulled and merged; PCR 13 matches the policy
  verify      attestation with no learn step anywhere: a daemon in verify mode on an image copy
              whose policy.json has no golden values; a VM's initrd quote verifies with PCRs 0, 2, 3, 6
              from the daemon's firmware run, 4 and 7 from the image and the variable store, nothing
              learned, user-data released; get_host reports the run
  golden      `vm-manager image golden --from-vm` records the learned PCRs into policy.json
  pinned      a VM on a daemon with firmware runs off verifies against those recorded golden values
  reject      a VM on another OVMF build is rejected on PCR 0; its user-data stays gated (the one test
              in install mode boot: an installer boot, then the installed boot)
  cluster     a Kubernetes cluster as Cluster API's kubeadm bootstrap provider makes one (Ignition
              spec 2.3.0 user-data: /etc/kubeadm.sh, /etc/kubeadm.yml, the CA files, kubeadm.service):
              a control plane created with require_attestation reaches ready with `kubectl get nodes`
              Ready through forward_port 6443 from the host; a worker on the same network joins with a
              token and the CA hash and is Ready; a reboot of the worker keeps it Ready; both VMs'
              ready quotes verify with PCR 13; timings recorded (not in the default run: E2E_TESTS)
  update      an A/B update in place: version N+1 is built (IMAGE_VERSION) or taken from
              E2E_UPDATE_IMAGE_DIR and published beside N with images/scripts/add-version.sh while a VM
              of N runs; the guest's systemd-sysupdate installs it into the B slot; its boot without a
              policy for N+1 is rejected and the next start boots N again; with the policy N+1
              verifies and get_vm shows bootedVersion N+1; then the VM boots back into N
  restart     the daemon restarts while a VM runs: with the process launcher the VM is powered
              down and marked stopped; then, where a service manager is reachable (the suite runs
              under with-systemd-user.sh), start_vm runs it as units of the systemd launcher, the
              daemon restarts again, the VM keeps running and the next daemon attaches to it
              (exec_vm, forward_port and stop_vm work); without one, start_vm on the process
              launcher brings it back

create, ignition, metrics, reboot and kubernetes share one VM; golden needs create's VM; pinned and
reject need golden; verify and update need nothing before them. CI runs create, verify, golden and
reject. A guest kernel panic fails its test (the daemon fails such a VM at once, with the panic
line); nothing is created a second time.
"""

import datetime
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_ROOT, "tests", "integration"))
from vmmtest import (BIN, Daemon, HOST, api, base_env, free_port, http_request, imds_request, run,  # noqa: E402
                     tap, wait_state)

IMAGE_DIR = os.environ.get("E2E_IMAGE_DIR") or os.path.join(SOURCE_ROOT, "images", "build")
ALL = ["create", "verify", "ignition", "metrics", "reboot", "kubernetes", "golden", "pinned", "reject", "restart", "update",
       "cluster"]
SELECTED = [t for t in (os.environ.get("E2E_TESTS") or ",".join(ALL)).split(",") if t]
# TCG: an install takes 4-6 minutes, a boot 2-3; the daemon's own timeouts are raised to match.
VM_TIMEOUT = int(os.environ.get("E2E_VM_TIMEOUT", "1800"))
# The process launcher everywhere but in the restart test's second half.
DAEMON_FLAGS = ["--install-timeout", "20m", "--boot-timeout", "15m", "--launcher", "process", "--log-level", "debug"]
OTHER_OVMF = ("/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd")

TIMINGS = {}
ctx = {}  # what tests hand on: image ref, daemons, the VM of create

# CAPI-shaped Ignition (bootstrap data as a Cluster API bootstrap provider writes it): a file and a
# socket-activated service that answers one line over TCP, enabled through its socket.
IGNITION = {
    "ignition": {"version": "3.3.0"},
    "storage": {"files": [
        {"path": "/etc/e2e/hello", "mode": 420, "overwrite": True,
         "contents": {"source": "data:,hello%20from%20ignition%0A"}},
    ]},
    "systemd": {"units": [
        {"name": "e2e-hello.socket", "enabled": True,
         "contents": "[Unit]\nDescription=e2e hello\n[Socket]\nListenStream=8080\nAccept=yes\n"
                     "[Install]\nWantedBy=sockets.target\n"},
        {"name": "e2e-hello@.service",
         "contents": "[Unit]\nDescription=e2e hello\n[Service]\nExecStart=/bin/cat /etc/e2e/hello\n"
                     "StandardInput=null\nStandardOutput=socket\n"},
    ]},
}


def missing_tools():
    missing = ["%s (package %s)" % (t, p) for t, p in (
        ("qemu-system-x86_64", "qemu-system-x86"), ("swtpm", "swtpm"),
        ("vhost-device-vsock", "vhost-device-vsock, from sid by tools/fetch-sid-package.sh")) if not shutil.which(t)]
    if not os.path.exists("/usr/share/OVMF/OVMF_CODE_4M.fd"):
        missing.append("/usr/share/OVMF/OVMF_CODE_4M.fd (package ovmf)")
    names = os.listdir(IMAGE_DIR) if os.path.isdir(IMAGE_DIR) else []
    if not all(any(n.endswith(ext) for n in names) for ext in (".efi", ".raw")):
        missing.append("the guest image in %s (make image)" % IMAGE_DIR)
    return missing


def copy_images(work):
    """The image directory, hard-linked (the files are large), with a policy.json of its own:
    `image golden` rewrites it."""
    dst = os.path.join(work, "images")
    shutil.copytree(IMAGE_DIR, dst, copy_function=os.link)
    for root, _, files in os.walk(dst):
        for f in files:
            if f == "policy.json":
                p = os.path.join(root, f)
                data = open(p, "rb").read()
                os.unlink(p)
                with open(p, "wb") as out:
                    out.write(data)
    return dst


def start_daemon(work, name, *extra, env=None):
    port = free_port()
    state = os.path.join(work, "state-" + name)
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state,
                            "--image-dir", ctx["images"]] + DAEMON_FLAGS + list(extra), env=env or base_env(work))
    ok, why = d.wait_healthy(port, timeout=30)
    tap.result(ok, "%s: serving" % name, why)
    return d, port, state


def stamp(s):
    """Seconds since the epoch of an RFC 3339 time of the API."""
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def exec_vm(port, vid, *command, timeout=120):
    status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": list(command)}, timeout=timeout + 30)
    if status != 200:
        return None, "exec %r: %r %r" % (command, status, r)
    return r, "exec %r: %r" % (command, r)


def wait_for(fn, timeout, step=2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last and last[0]:
            return last
        time.sleep(step)
    return last or (False, "timed out")


def guest_facts(port, vid):
    r, why = exec_vm(port, vid, "sh", "-c",
                     "cat /etc/machine-id; cat /etc/ssh/ssh_host_ed25519_key.pub; cat /etc/e2e/hello; hostname")
    if not r or r.get("exitCode") != 0:
        return None
    lines = r["stdout"].splitlines()
    return {"machine_id": lines[0] if lines else None, "host_key": lines[1] if len(lines) > 1 else None,
            "hello": lines[2] if len(lines) > 2 else None, "hostname": lines[3] if len(lines) > 3 else None}


def pcr_from_console(text, pcr):
    """vm-pcrs-log.service prints "vm-pcrs: N: hex" on the console."""
    found = None
    for line in text.splitlines():
        i = line.find("vm-pcrs: %d: " % pcr)
        if i >= 0:
            found = line[i:].split(": ", 2)[2].strip().lower()
    return found


def cli_terminal(port, args, steps, timeout=120):
    """Runs `vm-manager ARGS` (the client) on a pseudo-terminal, as a person at a terminal does. steps
    is a list of (text to wait for in the output, or None; bytes to type, or a function to call): each
    step waits until its text has appeared (at most timeout) and then types or calls. Returns (exit
    status, everything written)."""
    import pty
    import select
    env = dict(base_env("/tmp"), VM_MANAGER_URL="http://%s:%d" % (HOST, port))
    master, slave = pty.openpty()
    p = subprocess.Popen([BIN, *args], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    steps = list(steps)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while steps and (steps[0][0] is None or steps[0][0].encode() in out):
            _, act = steps.pop(0)
            if callable(act):
                act()
            else:
                os.write(master, act)
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    return p.returncode, out.decode(errors="replace")


def create_vm(port, body):
    """create_vm with the suite's time-out. A guest kernel panic fails the test like any other
    failure: the suite no longer creates again (QEMU 7.2's multi-threaded TCG panicked guests now and
    then; QEMU 10, which install-deps.sh installs, did not in 30 boots, docs/benchmarks.md)."""
    return api(port, "POST", "/vms", body, timeout=VM_TIMEOUT)


# ---------------------------------------------------------------------------------------------


def t_create(work):
    d, port, state = start_daemon(work, "learn", "--attestation", "verify", "--attestation-learn-golden")
    ctx.update(learn=d, learn_port=port, learn_state=state)
    status, images = api(port, "GET", "/images")
    if isinstance(images, dict):
        images = images.get("images") or []
    ref = "%s_%s" % (images[0]["id"], images[0]["version"]) if images else None
    tap.result(bool(ref), "list_images shows the built image", repr(images)[:300])
    ctx["ref"] = ref
    key = open(os.path.join(work, "user_key.pub")).read().strip()
    body = {"name": "e2e-a", "hostname": "e2e-a", "image": ref, "memory_mib": 2048, "disk_gib": 4,
            "require_attestation": True, "ssh_authorized_keys": [key], "metadata": {"role": "e2e"},
            "user_data": json.dumps(IGNITION), "wait_for": "ready"}
    t0 = time.monotonic()
    status, vm = create_vm(port, body)
    took = time.monotonic() - t0
    ok = status == 201 and isinstance(vm, dict) and vm.get("state") == "ready"
    tap.result(ok, "create_vm (wait_for ready): 201 ready after %.0f s" % took, repr(vm)[:1500])
    if not isinstance(vm, dict) or "id" not in vm:
        return
    ctx["vm"] = vm
    vid = vm["id"]
    if not ok:
        status, con = api(port, "GET", "/vms/%s/console?lines=200" % vid)
        tap.diag((con or {}).get("console", "")[-6000:] if isinstance(con, dict) else repr(con))
        return
    TIMINGS["create: request to ready"] = took
    tap.result(vm.get("installMode") == "host", "create_vm installed the disk on the host (installMode host)",
               repr(vm.get("installMode")))
    TIMINGS["create: host install (createdAt to installedAt)"] = stamp(vm["installedAt"]) - stamp(vm["createdAt"])
    TIMINGS["create: installed boot to READY=1 (bootedAt to readyAt)"] = stamp(vm["readyAt"]) - stamp(vm["bootedAt"])
    status, att = api(port, "GET", "/vms/%s/attestation" % vid)
    tap.result(status == 200 and att.get("userDataReleased") and (att.get("initrd") or {}).get("verified")
               and (att.get("ready") or {}).get("verified"),
               "attestation: the initrd and the ready quotes verified (learn mode), user-data released",
               json.dumps(att)[:1500])
    facts = guest_facts(port, vid)
    ctx["facts"] = facts
    tap.result(facts and facts["hostname"] == "e2e-a", "the guest took its hostname from the IMDS", repr(facts))
    r, why = exec_vm(port, vid, "cat", "/root/.ssh/authorized_keys")
    tap.result(r and key in r.get("stdout", ""), "the guest took the user's ssh key from the IMDS", why[:600])

    # the person at the terminal: vm shell types into a root shell on a pty, vm console --follow
    # shows the boot and then what the guest writes to its console, until Ctrl-]
    t0 = time.monotonic()
    rc, out = cli_terminal(port, ["vm", "shell", "e2e-a"],
                           [("#", b"echo shell-$((6*7)); tty; exit 3\r")], timeout=120)
    TIMINGS["create: vm shell, a command typed and the exit"] = time.monotonic() - t0
    tap.result(rc == 3 and "shell-42" in out and "/dev/pts/" in out,
               "vm shell: a command typed into the VM's root shell runs on a pty, `exit 3` is the client's status",
               "rc %r %r" % (rc, out[-1500:]))
    rc, out = cli_terminal(port, ["vm", "console", "e2e-a", "--follow"],
                           [("vm-pcrs:", lambda: exec_vm(port, vid, "sh", "-c", "echo e2e-console-mark > /dev/ttyS0")),
                            ("e2e-console-mark", b"\x1d")], timeout=120)
    tap.result(rc == 0 and "vm-pcrs:" in out and "e2e-console-mark" in out,
               "vm console --follow shows the end of the boot (vm-pcrs), then a line the guest writes as it comes; Ctrl-] detaches",
               "rc %r %r" % (rc, out[-1500:]))


def t_ignition(work):
    vm, port = ctx.get("vm"), ctx.get("learn_port")
    if not vm or vm.get("state") != "ready":
        tap.skip("ignition", "no ready VM from create")
        return
    facts = ctx.get("facts") or {}
    tap.result(facts.get("hello") == "hello from ignition", "Ignition wrote /etc/e2e/hello", repr(facts))
    r, why = exec_vm(port, vm["id"], "systemctl", "is-active", "e2e-hello.socket")
    tap.result(r and r.get("stdout", "").strip() == "active", "Ignition's socket unit is enabled and listening",
               why[:600])
    got, why = forward_hello(port, vm["id"])
    tap.result(got == b"hello from ignition\n", "forward_port 8080 reaches the guest's unit", why)


def t_metrics(work):
    vm, port = ctx.get("vm"), ctx.get("learn_port")
    if not vm or vm.get("state") != "ready":
        tap.skip("metrics", "no ready VM from create")
        return
    vid = vm["id"]
    # the report timer's first run is shortly after boot; ask for one now as well
    exec_vm(port, vid, "systemctl", "start", "vm-report-upload.service")

    def uploaded():
        status, m = api(port, "GET", "/vms/%s/metrics" % vid)
        return bool(isinstance(m, dict) and m.get("guest")), m

    ok, m = wait_for(uploaded, 300, 5)
    tap.result(ok, "the guest's systemd-report upload arrived (get_vm_metrics guest summary)", repr(m)[:800])
    _, _, text = http_request(port, "GET", "/metrics", timeout=30)
    text = text.decode()
    guest = [l for l in text.splitlines() if l.startswith("vm_guest_") and ('vm="%s"' % vid) in l
             and not l.startswith("vm_guest_report")]
    tap.result(len(guest) > 0, "/metrics exports the guest's series (%d)" % len(guest), "\n".join(guest[:20]))


def t_reboot(work):
    vm, port = ctx.get("vm"), ctx.get("learn_port")
    if not vm or vm.get("state") != "ready":
        tap.skip("reboot", "no ready VM from create")
        return
    vid = vm["id"]
    t0 = time.monotonic()
    status, r = api(port, "POST", "/vms/%s/reboot" % vid)
    tap.result(status == 200, "reboot_vm: 200", repr(r)[:300])

    v = wait_state(port, vid, ("ready", "failed"), VM_TIMEOUT, 5)
    TIMINGS["reboot: request to ready"] = time.monotonic() - t0
    tap.result(isinstance(v, dict) and v.get("state") == "ready", "... ready again", repr(v)[:600])
    facts = guest_facts(port, vid)
    before = ctx.get("facts") or {}
    tap.result(facts and facts["machine_id"] == before.get("machine_id") and facts["host_key"] == before.get("host_key")
               and facts["hello"] == "hello from ignition",
               "machine id, ssh host key and Ignition's file survived the reboot", "%r\n%r" % (before, facts))


def t_kubernetes(work):
    vm, port = ctx.get("vm"), ctx.get("learn_port")
    if not vm or vm.get("state") != "ready":
        tap.skip("kubernetes", "no ready VM from create")
        return
    vid = vm["id"]
    policy = json.load(open(os.path.join(ctx["images"], "policy.json")))
    kv = vm.get("kubernetesVersion") or sorted(policy.get("pcr13", {}))[-1]
    r, why = exec_vm(port, vid, "sh", "-c", "systemd-sysext list --json=short; cat /etc/extension-release.d/* "
                     "/usr/lib/extension-release.d/extension-release.kubernetes* 2>/dev/null; kubectl version --client")
    tap.result(r and r.get("exitCode") == 0 and kv in r.get("stdout", ""),
               "the Kubernetes sysext %s is merged (kubectl runs)" % kv, why[:1500])
    r, why = exec_vm(port, vid, "sh", "-c", "cat /sys/class/tpm/tpm0/pcr-sha256/13")
    got = (r or {}).get("stdout", "").strip().lower()
    want = policy.get("pcr13", {}).get(kv)
    tap.result(got and got == want, "PCR 13 is policy.json's value for %s" % kv, "got %r want %r (%s)" % (got, want, why[:300]))


def t_golden(work):
    vm, port = ctx.get("vm"), ctx.get("learn_port")
    if not vm or vm.get("state") != "ready":
        tap.skip("golden", "no ready VM from create")
        return
    p = subprocess.run([BIN, "image", "golden", ctx["ref"], "--from-vm", vm["id"], "--server",
                        "http://%s:%d" % (HOST, port), "--image-dir", ctx["images"]],
                       capture_output=True, text=True, timeout=60)
    policy = json.load(open(os.path.join(ctx["images"], "policy.json")))
    golden = (policy.get("golden") or {}).get("sha256") or {}
    tap.result(p.returncode == 0 and "0" in golden, "image golden --from-vm records the golden PCRs (PCR 0 among them)",
               p.stdout + p.stderr + json.dumps(policy)[:800])
    ctx["golden"] = golden


def t_pinned(work):
    if not ctx.get("golden"):
        tap.skip("pinned", "no golden PCRs recorded (golden)")
        return
    d, vport, state = start_daemon(work, "verify", "--attestation", "verify")
    ctx.update(verify=d, verify_port=vport)
    body = {"name": "e2e-b", "image": ctx["ref"], "memory_mib": 2048, "disk_gib": 4, "require_attestation": True,
            "user_data": json.dumps(IGNITION), "wait_for": "attested"}
    t0 = time.monotonic()
    status, vb = create_vm(vport, body)
    TIMINGS["golden: fresh VM request to attested"] = time.monotonic() - t0
    status, att = api(vport, "GET", "/vms/%s/attestation" % (vb or {}).get("id", "x"))
    ini = (att or {}).get("initrd") or {}
    tap.result(ini.get("verified") and not ini.get("learned") and att.get("userDataReleased"),
               "a fresh VM verifies against the recorded golden PCRs with nothing learned", json.dumps(att)[:1500])
    # TCG is two cores' worth of work per VM: nothing of this one may slow the next tests
    if isinstance(vb, dict) and "id" in vb:
        api(vport, "DELETE", "/vms/" + vb["id"], timeout=180)
    d.stop(signal.SIGTERM, timeout=180)
    ctx.pop("verify", None)


def t_verify(work):
    """Attestation without trust on first use and without golden values: a daemon in verify mode,
    no learn flag, an image copy whose policy.json has no golden values. PCRs 0, 2, 3, 6 come from
    the firmware run the daemon makes at start-up for create_vm's default shape (2048 MiB, 2 CPUs),
    4 and 7 from the image's and the variable store's events; a VM's initrd quote verifies with
    nothing learned, and its user-data is released."""
    if not ctx.get("ref"):
        policy = json.load(open(os.path.join(IMAGE_DIR, "policy.json")))
        ctx["ref"] = "%s_%s" % (policy["image_id"], policy["image_version"])
    images = os.path.join(work, "images-fresh")
    shutil.copytree(IMAGE_DIR, images, copy_function=os.link)
    for root, _, files in os.walk(images):
        for f in files:
            if f == "policy.json":
                path = os.path.join(root, f)
                policy = json.load(open(path))
                policy.pop("golden", None)
                os.unlink(path)  # a hard link to the source's: written anew, never through the link
                with open(path, "w") as out:
                    json.dump(policy, out)
    shared, ctx["images"] = ctx["images"], images
    try:
        d, port, state = start_daemon(work, "fresh", "--attestation", "verify", "--firmware-run")
    finally:
        ctx["images"] = shared
    try:
        body = {"name": "e2e-f", "image": ctx["ref"], "memory_mib": 2048, "disk_gib": 4, "require_attestation": True,
                "user_data": json.dumps(IGNITION), "wait_for": "attested"}
        t0 = time.monotonic()
        status, vf = create_vm(port, body)
        TIMINGS["verify: create_vm request to attested (firmware run included)"] = time.monotonic() - t0
        vid = (vf or {}).get("id", "x") if isinstance(vf, dict) else "x"
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        ini = (att or {}).get("initrd") or {} if isinstance(att, dict) else {}
        tap.result(ini.get("verified") is True and not ini.get("learned") and att.get("userDataReleased")
                   and "pcrs 0,2,3,6 events of this host's firmware" in ini.get("message", ""),
                   "verify: with no golden values, the initrd quote verifies against the firmware run, nothing "
                   "learned, user-data released", json.dumps(att)[:1500])
        status, host = api(port, "GET", "/host")
        runs = ((host or {}).get("firmwareRuns") or {}).get("runs", []) if isinstance(host, dict) else []
        run = next((r for r in runs if r.get("memoryMiB") == 2048 and r.get("cpus") == 2), None)
        tap.result(run is not None and run.get("state") == "known" and run.get("pcrs") == [0, 2, 3, 6],
                   "verify: get_host reports the firmware run for 2048 MiB, 2 CPUs", json.dumps(runs)[:1500])
        if run:
            TIMINGS["verify: the firmware run (%s)" % run.get("kernel", "?")] = run.get("seconds", 0)
        # TCG is two cores' worth of work per VM: nothing of this one may slow the next tests
        if vid != "x":
            api(port, "DELETE", "/vms/" + vid, timeout=180)
    finally:
        d.stop(signal.SIGTERM, timeout=180)


def t_reject(work):
    """The golden fallback: a daemon on another OVMF build with firmware runs off
    (--firmware-run=false) has only the golden values recorded for the first build, so the quote
    is a golden mismatch on PCR 0. With firmware runs on, it would learn the other build's events
    and verify (t_verify tests that path)."""
    if not ctx.get("golden"):
        tap.skip("reject", "no golden PCRs recorded (golden)")
        return
    if not all(os.path.exists(f) for f in OTHER_OVMF):
        tap.skip("reject", "%s missing" % OTHER_OVMF[0])
        return
    d, port, state = start_daemon(work, "other-ovmf", "--attestation", "verify", "--firmware-run=false",
                                  "--ovmf-code", OTHER_OVMF[0], "--ovmf-vars", OTHER_OVMF[1])
    # the one test in install mode boot (an installer boot first): the verdict is the firmware's either way
    body = {"name": "e2e-c", "image": ctx["ref"], "memory_mib": 2048, "disk_gib": 4, "require_attestation": True,
            "user_data": json.dumps(IGNITION), "wait_for": "ready", "install_mode": "boot"}
    t0 = time.monotonic()
    status, err = create_vm(port, body)
    TIMINGS["reject: create_vm request to its vm_failed answer"] = time.monotonic() - t0
    msg = ((err or {}).get("error") or {}).get("message", "") if isinstance(err, dict) else ""
    tap.result(status == 500 and err["error"]["code"] == "vm_failed"
               and msg.startswith("vm failed: initrd attestation rejected: golden mismatch"),
               "create_vm (wait_for ready) on another OVMF build answers vm_failed with the verdict, at the verdict",
               repr(err)[:600])
    status, vms = api(port, "GET", "/vms")
    vc = next((v for v in vms or [] if v.get("name") == "e2e-c"), None)
    if not vc:
        return
    vid = vc["id"]
    status, att = api(port, "GET", "/vms/%s/attestation" % vid)
    ok = isinstance(att, dict) and bool(att.get("initrd"))
    ini = (att or {}).get("initrd") or {}
    msg = ini.get("message", "")
    tap.result(ok and ini.get("verified") is False and "golden mismatch" in msg and "pcr 0 " in msg
               and not att.get("userDataReleased"),
               "its initrd quote is rejected with a golden mismatch on PCR 0; user-data stays gated",
               json.dumps(att)[:1500])
    deadline = time.monotonic() + 120
    while True:
        status, v = api(port, "GET", "/vms/" + vid)
        if not isinstance(v, dict) or v.get("state") != "stopping" or time.monotonic() > deadline:
            break
        time.sleep(1)
    tap.result(isinstance(v, dict) and v.get("state") == "failed"
               and (v.get("lastError") or "").startswith("initrd attestation rejected: golden mismatch"),
               "the VM is failed and powered off, lastError is the verdict", repr(v)[:600])
    st, _, answer = imds_request(os.path.join(state, "vms", vid, "imds.sock"), "GET", "/giantswarm/v1/user-data")
    tap.result(st == 503, "the IMDS still answers 503 for its user-data", "%r %r" % (st, answer[:300]))
    status, con = api(port, "GET", "/vms/%s/console?lines=2000" % vid)
    text = (con or {}).get("console", "") if isinstance(con, dict) else ""
    tap.result("/etc/e2e/hello" not in text and "e2e-hello" not in text,
               "Ignition never saw the user-data (nothing of it on the console)", text[-1500:])
    api(port, "DELETE", "/vms/" + vid, timeout=120)
    d.stop(signal.SIGTERM, timeout=120)


def next_version(version):
    """The version after version for an update test: its last number one up (0.1.0 -> 0.1.1)."""
    m = re.match(r"^(.*?)(\d+)([^\d]*)$", version)
    return "%s%d%s" % (m.group(1), int(m.group(2)) + 1, m.group(3)) if m else version + ".1"


def next_image(work, version):
    """The build of version (images/scripts/build.sh with IMAGE_VERSION): E2E_UPDATE_IMAGE_DIR when
    given (a build of a later version, whichever), else built into the work directory (a cache hit
    after the first build)."""
    given = os.environ.get("E2E_UPDATE_IMAGE_DIR")
    if given:
        return given, "E2E_UPDATE_IMAGE_DIR"
    out = os.path.join(work, "image-next")
    t0 = time.monotonic()
    p = subprocess.run([os.path.join(SOURCE_ROOT, "images", "scripts", "build.sh"), out],
                       env=dict(os.environ, VM_MANAGER=BIN, IMAGE_VERSION=version), capture_output=True, text=True)
    TIMINGS["update: build of version %s (or cache)" % version] = time.monotonic() - t0
    return (out if p.returncode == 0 else None), (p.stdout + p.stderr)[-3000:]


def esp_entries(port, vid):
    r, why = exec_vm(port, vid, "sh", "-c", "ls /boot/EFI/Linux/; . /etc/os-release; echo IMAGE_VERSION=$IMAGE_VERSION")
    out = (r or {}).get("stdout", "")
    version = next((l.split("=", 1)[1] for l in out.splitlines() if l.startswith("IMAGE_VERSION=")), None)
    return sorted(l for l in out.splitlines() if l.endswith(".efi")), version, why


def reboot_to(port, vid, states=("ready", "failed")):
    t0 = time.monotonic()
    status, r = api(port, "POST", "/vms/%s/reboot" % vid, timeout=VM_TIMEOUT)
    v = wait_state(port, vid, states, VM_TIMEOUT, 5)
    return status, v, time.monotonic() - t0


def t_update(work):
    """An A/B update in place, as an operator rolls version N+1 out beside N: the guest's
    systemd-sysupdate installs N+1 from the IMDS into its B slot, systemd-boot boots it on trial, and
    the daemon judges its quotes by the policy of the version they measured (no golden values, a
    firmware run). First N+1 is published without its policy: that boot is rejected with its verdict,
    the VM fails, and its next start boots N again (the trial entry is marked bad). Then with the
    policy: N+1 verifies, get_vm shows bootedVersion N+1 and systemd-bless-boot keeps it. Last, the
    guest boots back into N (bootctl set-oneshot) and verifies as N."""
    policy = json.load(open(os.path.join(IMAGE_DIR, "policy.json")))
    image_id, version = policy["image_id"], policy["image_version"]
    newer = next_version(version)
    built, why = next_image(work, newer)
    if built:
        newer = json.load(open(os.path.join(built, "policy.json")))["image_version"]
    tap.result(bool(built), "update: version %s of the image is built beside %s" % (newer, version), why)
    if not built:
        return
    images = os.path.join(work, "images-update")
    shutil.copytree(IMAGE_DIR, images, copy_function=os.link)
    for root, _, files in os.walk(images):
        for f in files:
            if f == "policy.json":
                path = os.path.join(root, f)
                pol = json.load(open(path))
                pol.pop("golden", None)
                os.unlink(path)
                with open(path, "w") as out:
                    json.dump(pol, out)
    shared, ctx["images"] = ctx["images"], images
    try:
        d, port, state = start_daemon(work, "update", "--attestation", "verify", "--firmware-run")
    finally:
        ctx["images"] = shared
    ctx["update"] = d
    stem_old, stem_new = "%s_%s" % (image_id, version), "%s_%s" % (image_id, newer)
    vid = None
    try:
        body = {"name": "e2e-u", "image": stem_old, "memory_mib": 2048, "disk_gib": 4, "require_attestation": True,
                "user_data": json.dumps(IGNITION), "wait_for": "ready"}
        status, vm = create_vm(port, body)
        vid = vm.get("id") if isinstance(vm, dict) else None
        tap.result(status == 201 and vm.get("state") == "ready" and vm.get("bootedVersion") == version,
                   "update: a VM of version %s is ready, bootedVersion %s" % (version, version), repr(vm)[:1200])
        if status != 201:
            return

        # N+1 published while the VM runs, its policy held back: an update this host cannot verify
        p = subprocess.run([os.path.join(SOURCE_ROOT, "images", "scripts", "add-version.sh"), built, images],
                           capture_output=True, text=True)
        held = os.path.join(images, stem_new + ".policy.json")
        os.rename(held, held + ".held")
        ok, listed = wait_for(lambda: (lambda st, b: (st == 200 and not (b or {}).get("policy"), b))(
            *api(port, "GET", "/images/" + stem_new)), 30, 0.5)
        tap.result(p.returncode == 0 and ok, "update: add-version.sh publishes %s beside %s (its policy held back)"
                   % (newer, version), p.stdout + p.stderr + repr(listed)[:300])

        t0 = time.monotonic()
        r, why = exec_vm(port, vid, "/usr/lib/systemd/systemd-sysupdate", "update", timeout=1200)
        TIMINGS["update: systemd-sysupdate update in the guest"] = time.monotonic() - t0
        entries, running, why2 = esp_entries(port, vid)
        trial = next((e for e in entries if e.startswith(stem_new + "+1")), None)
        tap.result(r and r.get("exitCode") == 0 and trial in ("%s+1.efi" % stem_new, "%s+1-0.efi" % stem_new),
                   "update: systemd-sysupdate installs %s into the B slot, its UKI on one boot's trial" % newer,
                   why[-1500:] + why2[-600:])

        status, v, took = reboot_to(port, vid)
        TIMINGS["update: reboot into %s without its policy to the verdict" % newer] = took
        err = (v or {}).get("lastError", "") if isinstance(v, dict) else ""
        tap.result(isinstance(v, dict) and v.get("state") == "failed"
                   and err.startswith("initrd attestation rejected: ")
                   and "this host has a policy for (%s; without a policy.json: %s)" % (version, newer) in err,
                   "update: the boot of %s, which no policy verifies, is rejected with its verdict and fails the VM"
                   % newer, repr(v)[:1500])

        t0 = time.monotonic()
        status, v = api(port, "POST", "/vms/%s/start" % vid, timeout=VM_TIMEOUT)
        v = wait_state(port, vid, ("ready", "failed"), VM_TIMEOUT, 5)
        TIMINGS["update: start after the rejected update to ready"] = time.monotonic() - t0
        entries, running, why = esp_entries(port, vid)
        tap.result(isinstance(v, dict) and v.get("state") == "ready" and v.get("bootedVersion") == version
                   and running == version and ("%s+0-1.efi" % stem_new) in entries,
                   "update: the next start boots %s from the A slot again (the trial entry is marked bad)" % version,
                   repr(v)[:800] + why[-600:])

        os.rename(held + ".held", held)
        ok, listed = wait_for(lambda: (lambda st, b: (st == 200 and bool((b or {}).get("policy")), b))(
            *api(port, "GET", "/images/" + stem_new)), 30, 0.5)
        # the operator retries the trial: the bad entry gets its one try back
        r, why = exec_vm(port, vid, "mv", "/boot/EFI/Linux/%s+0-1.efi" % stem_new, "/boot/EFI/Linux/%s+1.efi" % stem_new)
        status, v, took = reboot_to(port, vid)
        TIMINGS["update: reboot into %s to ready" % newer] = took
        entries, running, why = esp_entries(port, vid)
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(isinstance(v, dict) and v.get("state") == "ready" and v.get("bootedVersion") == newer
                   and running == newer and (att.get("initrd") or {}).get("verified")
                   and (att.get("ready") or {}).get("verified") and att.get("bootedVersion") == newer,
                   "update: with its policy, %s boots, both quotes verify against it, get_vm shows bootedVersion %s"
                   % (newer, newer), repr(v)[:800] + json.dumps(att)[:1200] + why[-300:])
        tap.result(("%s.efi" % stem_new) in entries and ("%s.efi" % stem_old) in entries,
                   "update: systemd-bless-boot kept %s (its entry lost the trial counter); %s stays beside it"
                   % (newer, version), repr(entries))

        r, why = exec_vm(port, vid, "bootctl", "set-oneshot", "%s.efi" % stem_old)
        status, v, took = reboot_to(port, vid)
        entries, running, why2 = esp_entries(port, vid)
        tap.result(r and r.get("exitCode") == 0 and isinstance(v, dict) and v.get("state") == "ready"
                   and v.get("bootedVersion") == version and running == version,
                   "update: the VM boots back into %s (bootctl set-oneshot) and verifies as %s" % (version, version),
                   why[-600:] + repr(v)[:800] + why2[-300:])
    finally:
        if vid:
            api(port, "DELETE", "/vms/" + vid, timeout=180)
        d.stop(signal.SIGTERM, timeout=180)
        ctx.pop("update", None)


def service_manager():
    """The private `systemd --user` of with-systemd-user.sh, when the suite runs under one."""
    rt = os.environ.get("XDG_RUNTIME_DIR")
    return bool(rt) and os.path.exists(os.path.join(rt, "systemd", "private"))


def restarted_daemon(work, name, port, launcher):
    flags = [f for f in DAEMON_FLAGS]
    flags[flags.index("--launcher") + 1] = launcher
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", ctx["learn_state"],
                            "--image-dir", ctx["images"]] + flags + ["--attestation", "verify",
                                                                     "--attestation-learn-golden"],
               env=base_env(work))
    ok, why = d.wait_healthy(port, timeout=30)
    tap.result(ok, "restart: %s on the same state directory (--launcher %s)" % (name, launcher), why)
    return d


def forward_hello(port, vid):
    status, fw = api(port, "POST", "/vms/%s/forward" % vid, {"port": 8080})
    got = b""
    if status == 200:
        h, p = fw["address"].rsplit(":", 1)
        try:
            with socket.create_connection((h, int(p)), timeout=20) as s:
                s.settimeout(20)
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
        except OSError as e:
            got = repr(e).encode()
    return got, "%r %r" % (fw, got)


def qemu_of(vid):
    with open(os.path.join(ctx["learn_state"], "vms", vid, "vm.json")) as f:
        return (json.load(f).get("processes") or {}).get("qemu") or {}


def t_restart(work):
    vm, d, port = ctx.get("vm"), ctx.get("learn"), ctx.get("learn_port")
    if not vm or not d:
        tap.skip("restart", "no VM from create")
        return
    vid = vm["id"]
    d.stop(signal.SIGTERM, timeout=180)
    ctx.pop("learn", None)
    d2 = restarted_daemon(work, "learn-2", port, "process")
    ctx["restart"] = d2
    status, v = api(port, "GET", "/vms/" + vid)
    # the process launcher: SIGTERM powered the VM down with the daemon (docs/operations.md, Launchers)
    tap.result(isinstance(v, dict) and v.get("state") == "stopped",
               "process launcher: the VM was powered down with the daemon and is stopped", repr(v)[:600])
    if not service_manager():
        t0 = time.monotonic()
        api(port, "POST", "/vms/%s/start" % vid)
        x = wait_state(port, vid, ("ready", "failed"), VM_TIMEOUT, 5)
        TIMINGS["restart: start_vm to ready"] = time.monotonic() - t0
        tap.result(isinstance(x, dict) and x.get("state") == "ready", "start_vm brings it back to ready", repr(x)[:600])
        tap.skip("restart under the systemd launcher", "no service manager (run under with-systemd-user.sh)")
        return

    # The same VM under the systemd launcher: its processes become units of the service manager,
    # which outlive the daemon.
    d2.stop(signal.SIGTERM, timeout=180)
    d3 = restarted_daemon(work, "learn-3", port, "systemd")
    ctx["restart"] = d3
    t0 = time.monotonic()
    api(port, "POST", "/vms/%s/start" % vid)
    x = wait_state(port, vid, ("ready", "failed"), VM_TIMEOUT, 5)
    TIMINGS["restart: start_vm to ready (systemd launcher)"] = time.monotonic() - t0
    tap.result(isinstance(x, dict) and x.get("state") == "ready", "start_vm under the systemd launcher: ready",
               repr(x)[:600])
    if not isinstance(x, dict) or x.get("state") != "ready":
        return
    qemu = qemu_of(vid)
    tap.result(qemu.get("unit") == "vm-manager-%s-qemu.service" % vid and qemu.get("pid"),
               "QEMU runs as the unit vm-manager-%s-qemu.service" % vid, repr(qemu))
    rc, _ = d3.stop(signal.SIGTERM, timeout=60)
    ctx.pop("restart", None)
    time.sleep(2)
    alive = bool(qemu.get("pid")) and os.path.exists("/proc/%d" % qemu["pid"])
    tap.result(rc == 0 and alive, "SIGTERM of the daemon: it exits 0 and the VM's QEMU keeps running",
               "exit %r, pid %r alive %r" % (rc, qemu.get("pid"), alive))
    d4 = restarted_daemon(work, "learn-4", port, "systemd")
    ctx["restart"] = d4
    status, again = api(port, "GET", "/vms/" + vid)
    tap.result(status == 200 and again.get("state") == "ready" and not again.get("lastError")
               and qemu_of(vid).get("pid") == qemu.get("pid"),
               "the next daemon attaches to the running VM: ready, same QEMU, no error", repr(again)[:600])
    r, why = exec_vm(port, vid, "hostname")
    tap.result(r and r.get("stdout", "").strip() == "e2e-a", "exec_vm reaches the reattached guest", why[:600])
    got, why = forward_hello(port, vid)
    tap.result(got == b"hello from ignition\n", "forward_port reaches the guest's unit through the re-dialled NIC",
               why)
    t0 = time.monotonic()
    status, stopped = api(port, "POST", "/vms/%s/stop" % vid, timeout=240)
    tap.result(status == 200 and stopped.get("state") == "stopped",
               "stop_vm through the re-dialled QMP: stopped (%.0f s)" % (time.monotonic() - t0), repr(stopped)[:400])
    d4.stop(signal.SIGTERM, timeout=180)
    ctx.pop("restart", None)


# ---- cluster: Cluster API's kubeadm bootstrap data, unchanged ----------------------------------

TOKEN = "e2e0ab.0123456789abcdef"


def data_url(text):
    return "data:," + urllib.parse.quote(text, safe="")


def cluster_pki(work):
    """The CA files CABPK hands a control plane: cluster CA, etcd CA, front-proxy CA, service account
    key pair; and the discovery hash a worker joins with (SHA-256 of the CA's SubjectPublicKeyInfo)."""
    pki = os.path.join(work, "pki")
    os.makedirs(os.path.join(pki, "etcd"), exist_ok=True)
    for name, cn in (("ca", "kubernetes"), ("etcd/ca", "etcd-ca"), ("front-proxy-ca", "front-proxy-ca")):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=" + cn,
                        "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
                        "-keyout", os.path.join(pki, name + ".key"), "-out", os.path.join(pki, name + ".crt")],
                       check=True, capture_output=True)
    subprocess.run(["openssl", "genrsa", "-out", os.path.join(pki, "sa.key"), "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", os.path.join(pki, "sa.key"), "-pubout", "-out", os.path.join(pki, "sa.pub")],
                   check=True, capture_output=True)
    spki = subprocess.run("openssl x509 -pubkey -noout -in %s | openssl pkey -pubin -outform der" % os.path.join(pki, "ca.crt"),
                          shell=True, check=True, capture_output=True).stdout
    files = {}
    for name in ("ca.crt", "ca.key", "etcd/ca.crt", "etcd/ca.key", "front-proxy-ca.crt", "front-proxy-ca.key", "sa.pub", "sa.key"):
        files["/etc/kubernetes/pki/" + name] = open(os.path.join(pki, name)).read()
    return files, "sha256:" + hashlib.sha256(spki).hexdigest()


def cabpk_ignition(command, kubeadm_yml, extra_files=None):
    """Ignition 2.3.0 as CABPK's Container Linux Config template renders it (compact JSON, files on the
    root filesystem with decimal modes and percent-encoded data URLs, one kubeadm.service)."""
    script = ("#!/bin/bash\n# Copyright 2020 The Kubernetes Authors. (shape of CABPK's kubeadm bootstrap script)\n"
              "set -e\n\nkubeadm %s --config /etc/kubeadm.yml\nmkdir -p /run/cluster-api\n"
              "echo success > /run/cluster-api/bootstrap-success.complete\nmv /etc/kubeadm.yml /tmp/\n" % command)
    files = [{"filesystem": "root", "path": path, "contents": {"source": data_url(text), "verification": {}},
              "mode": 0o600 if path.endswith(".key") else 0o640} for path, text in (extra_files or {}).items()]
    files += [{"filesystem": "root", "path": "/etc/kubeadm.sh", "contents": {"source": data_url(script), "verification": {}},
               "mode": 0o700},
              {"filesystem": "root", "path": "/etc/kubeadm.yml",
               "contents": {"source": data_url("---\n" + kubeadm_yml), "verification": {}}, "mode": 0o600}]
    unit = ("[Unit]\nDescription=kubeadm\n# Run only once. After successful run, this file is moved to /tmp/.\n"
            "ConditionPathExists=/etc/kubeadm.yml\n[Service]\n# To not restart the unit when it exits, as it is expected.\n"
            "Type=oneshot\nExecStart=/etc/kubeadm.sh\n[Install]\nWantedBy=multi-user.target\n")
    doc = {"ignition": {"config": {}, "security": {"tls": {}}, "timeouts": {}, "version": "2.3.0"},
           "networkd": {}, "passwd": {}, "storage": {"files": files},
           "systemd": {"units": [{"contents": unit, "enabled": True, "name": "kubeadm.service"}]}}
    return json.dumps(doc, separators=(",", ":"))


def init_yml(name, kver):
    """kubeadm init's configuration as CABPK renders a KubeadmControlPlane's, with no image repository
    and no preflight errors ignored: every image kubeadm asks for is in the sysext (CoreDNS's name
    carries cluster-dns). One setting a user adds here: under emulation (TCG) the API server answers a
    lease renewal slower than the default 10 s deadline, so kube-controller-manager and kube-scheduler
    lose their leader election and exit over and over (the bootstrap signer a join waits for never ran
    long enough): a minute's lease."""
    lease = ("  extraArgs:\n    leader-elect-lease-duration: 90s\n    leader-elect-renew-deadline: 60s\n"
             "    leader-elect-retry-period: 5s\n")
    return ("apiServer:\n  certSANs:\n  - 127.0.0.1\n  - localhost\n  timeoutForControlPlane: 20m0s\n"
            "apiVersion: kubeadm.k8s.io/v1beta2\nclusterName: e2e\ncontrollerManager:\n" + lease + "dns: {}\netcd: {}\n"
            "kind: ClusterConfiguration\nkubernetesVersion: v%s\nnetworking:\n  dnsDomain: cluster.local\n"
            "  serviceSubnet: 10.96.0.0/12\nscheduler:\n" + lease + "---\napiVersion: kubeadm.k8s.io/v1beta2\n"
            "bootstrapTokens:\n- token: %s\nkind: InitConfiguration\nlocalAPIEndpoint: {}\nnodeRegistration:\n"
            "  criSocket: /var/run/containerd/containerd.sock\n"
            "  kubeletExtraArgs: {}\n  name: %s\n") % (kver, TOKEN, name)


def join_yml(name, endpoint, ca_hash):
    return ("apiVersion: kubeadm.k8s.io/v1beta2\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: %s\n"
            "    caCertHashes:\n    - %s\n    token: %s\nkind: JoinConfiguration\nnodeRegistration:\n"
            "  criSocket: /var/run/containerd/containerd.sock\n  kubeletExtraArgs: {}\n  name: %s\n") % (
                endpoint, ca_hash, TOKEN, name)


def host_kubectl():
    """kubectl of the version the image carries: the one the image build made (its cache)."""
    found = sorted(glob.glob("/var/cache/vm-manager/kubernetes/bin-*/bin/kubectl"), key=os.path.getmtime)
    return found[-1] if found else shutil.which("kubectl")


def nodes_ready(kubectl, kubeconfig):
    p = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "get", "nodes", "-o", "json", "--request-timeout", "20s"],
                       capture_output=True, text=True, timeout=60)
    ready = {}
    if p.returncode == 0:
        for n in json.loads(p.stdout).get("items", []):
            conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
            ready[n["metadata"]["name"]] = conds.get("Ready") == "True"
    return ready, (p.stdout[-1500:] + p.stderr[-1500:])


def cluster_info_signed(kubectl, kubeconfig):
    """Whether kube-controller-manager's bootstrap signer has signed cluster-info for TOKEN's id: what
    a joining node's discovery waits for (kubeadm join gives up after 5 minutes)."""
    p = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "-n", "kube-public", "get", "configmap", "cluster-info",
                        "-o", "json", "--request-timeout", "20s"], capture_output=True, text=True, timeout=60)
    data = json.loads(p.stdout).get("data", {}) if p.returncode == 0 else {}
    return "jws-kubeconfig-" + TOKEN.split(".")[0] in data, (p.stdout[-800:] + p.stderr[-800:])


def dns_query_bytes(name, qtype):
    """A DNS query (RD set) for name, as the bytes a UDP datagram carries."""
    q = struct.pack(">HHHHHH", 0x4b1d, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.rstrip(".").split("."))
    return q + b"\0" + struct.pack(">HH", qtype, 1)


def dns_answer(reply):
    """The rcode and the A records of a DNS reply's answer section."""
    rcode, ancount = reply[3] & 15, struct.unpack(">H", reply[6:8])[0]
    i = 12
    while reply[i] != 0:  # the question's name (never compressed)
        i += reply[i] + 1
    i += 5
    addrs = []
    for _ in range(ancount):
        while reply[i] != 0 and reply[i] < 0xc0:
            i += reply[i] + 1
        i += 2 if reply[i] >= 0xc0 else 1
        rtype, _, _, rdlen = struct.unpack(">HHIH", reply[i:i + 10])
        if rtype == 1 and rdlen == 4:
            addrs.append(".".join(str(b) for b in reply[i + 10:i + 14]))
        i += 10 + rdlen
    return rcode, addrs


def cluster_dns(port, vid, server, name):
    """Asks the cluster DNS at server (the kube-dns service address) for name's A records from inside
    the node vid, with bash's /dev/udp: the image has no DNS client. The query goes through a file, as
    printf would send it in pieces (one datagram per flush). Returns (rcode, addresses) or (None, why)."""
    query = "".join("\\x%02x" % b for b in dns_query_bytes(name, 1))
    r, why = exec_vm(port, vid, "bash", "-c",
                     "q=$(mktemp) && printf '%s' >$q && exec 3<>/dev/udp/%s/53 && dd if=$q bs=4096 count=1 >&3 2>/dev/null "
                     "&& rm $q && timeout 10 dd bs=4096 count=1 <&3 2>/dev/null | od -An -v -tx1" % (query, server))
    out = "".join((r or {}).get("stdout", "").split())
    if len(out) < 34:
        return None, "no answer: %s %s" % (why[:300], (r or {}).get("stderr", "")[:300])
    return dns_answer(bytes.fromhex(out))


def dns_deployment(kubectl, kubeconfig):
    """Whether kubeadm's DNS add-on (the coredns Deployment, cluster-dns's image) has a ready replica."""
    p = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "-n", "kube-system", "get", "deployment", "coredns",
                        "-o", "json", "--request-timeout", "20s"], capture_output=True, text=True, timeout=60)
    st = json.loads(p.stdout).get("status", {}) if p.returncode == 0 else {}
    q = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "-n", "kube-system", "get", "pods", "-l",
                        "k8s-app=kube-dns", "-o", "wide", "--request-timeout", "20s"],
                       capture_output=True, text=True, timeout=60)
    return (st.get("readyReplicas") or 0) >= 1, json.dumps(st)[:800] + "\n" + q.stdout[-1200:] + q.stderr[-600:]


def control_plane_diag(port, cpid):
    """What the control plane's containers did, for a failure's diagnostics."""
    r, why = exec_vm(port, cpid, "sh", "-c",
                     "crictl ps -a 2>&1; for c in kube-controller-manager kube-apiserver; do "
                     "for id in $(crictl ps -a 2>/dev/null | awk -v c=$c '$3 == c { print $1 }' | head -2); do "
                     "echo \"== $c $id\"; crictl logs $id 2>&1 | tail -40; done; done; "
                     "journalctl -u kubelet --no-pager 2>&1 | grep -iE 'error|fail' | tail -20")
    tap.diag(((r or {}).get("stdout", "") + (r or {}).get("stderr", ""))[-10000:] if r else why)


def ready_quote_pcr13(port, vid, kv, policy):
    """The ready quote verified (it covers PCR 13 against policy.json's value for kv), and the guest's
    PCR 13 is that value."""
    status, att = api(port, "GET", "/vms/%s/attestation" % vid)
    verified = bool(((att or {}).get("ready") or {}).get("verified"))
    # A control plane just past kubeadm init is busy under TCG: its sshd may miss exec_vm's 15 s
    # handshake once (the error says so); a second try a little later gets in.
    for attempt in range(3):
        r, why = exec_vm(port, vid, "cat", "/sys/class/tpm/tpm0/pcr-sha256/13")
        if r:
            break
        tap.diag("exec_vm, try %d: %s" % (attempt + 1, why[:300]))
        time.sleep(10)
    got = (r or {}).get("stdout", "").strip().lower()
    want = (policy.get("pcr13") or {}).get(kv)
    return verified and bool(got) and got == want, "PCR 13 %r, policy %r; %s" % (got, want, json.dumps(att)[:1200])


def t_cluster(work):
    kubectl = host_kubectl()
    if not kubectl:
        tap.skip("cluster", "no kubectl on the host (the image build's cache has none)")
        return
    golden = bool(ctx.get("golden"))
    # With golden values recorded (the golden test), a daemon that verifies; else one in learn mode.
    extra = ["--attestation", "verify"] + ([] if golden else ["--attestation-learn-golden"])
    d, port, state = start_daemon(work, "cluster", *extra, "--boot-timeout", "40m")
    ctx["cluster"] = d
    status, images = api(port, "GET", "/images")
    img = (images or [{}])[0] if isinstance(images, list) else {}
    kv = (img.get("kubernetesVersions") or [None])[0]
    tap.result(bool(kv), "list_images offers a node-capable Kubernetes version (%s)" % kv,
               json.dumps(img.get("kubernetesUnusable"))[:600])
    if not kv:
        return
    ref = "%s_%s" % (img["id"], img["version"])
    policy = json.load(open(os.path.join(ctx["images"], "policy.json")))
    pki, ca_hash = cluster_pki(work)

    # the control plane
    t0 = time.monotonic()
    status, cp = create_vm(port, {"name": "e2e-cp", "image": ref, "kubernetes_version": kv, "cpus": 2, "memory_mib": 4096,
                                  "disk_gib": 10, "require_attestation": True,
                                  "user_data": cabpk_ignition("init", init_yml("e2e-cp", kv), pki), "wait_for": "ready"})
    TIMINGS["cluster: control plane create_vm to ready (kubeadm init done)"] = time.monotonic() - t0
    ok = status == 201 and isinstance(cp, dict) and cp.get("state") == "ready"
    tap.result(ok, "control plane: create_vm with CABPK's Ignition 2.3.0 user-data is ready after %.0f s"
               % (time.monotonic() - t0), repr(cp)[:1500])
    if not ok:
        vid = (cp or {}).get("id") if isinstance(cp, dict) else None
        if not vid:
            status, vms = api(port, "GET", "/vms")
            vid = next((v["id"] for v in vms or [] if v.get("name") == "e2e-cp"), None)
        if vid:
            status, con = api(port, "GET", "/vms/%s/console?lines=300" % vid)
            tap.diag((con or {}).get("console", "")[-8000:] if isinstance(con, dict) else repr(con))
        return
    cpid = cp["id"]
    ok, why = ready_quote_pcr13(port, cpid, kv, policy)
    tap.result(ok, "control plane: its ready quote verified with PCR 13", why)
    r, why = exec_vm(port, cpid, "sh", "-c", "cat /run/cluster-api/bootstrap-success.complete; cat /etc/kubernetes/admin.conf")
    out = (r or {}).get("stdout", "")
    tap.result(out.startswith("success"), "control plane: kubeadm wrote CABPK's sentinel file", why[:600])
    status, fw = api(port, "POST", "/vms/%s/forward" % cpid, {"port": 6443})
    tap.result(status == 200, "forward_port 6443", repr(fw))
    kubeconfig = os.path.join(work, "admin.conf")
    text = out.split("\n", 1)[1] if "\n" in out else ""
    text = re.sub(r"server: https://[^\s]+", "server: https://%s" % (fw or {}).get("address", ""), text)
    with open(kubeconfig, "w") as f:
        f.write(text)
    t1 = time.monotonic()
    ok, why = wait_for(lambda: (lambda rd: (rd[0].get("e2e-cp") is True, rd[1]))(nodes_ready(kubectl, kubeconfig)), 900, 10)
    TIMINGS["cluster: control plane create_vm to node Ready"] = time.monotonic() - t0
    tap.result(ok, "kubectl get nodes through forward_port 6443: e2e-cp Ready (%.0f s after ready)"
               % (time.monotonic() - t1), why)

    # the DNS add-on kubeadm deployed, answering from the control plane (both replicas run there
    # until a worker joins; the default bridge network does not route pods between nodes)
    t1 = time.monotonic()
    ok, why = wait_for(lambda: dns_deployment(kubectl, kubeconfig), 900, 10)
    TIMINGS["cluster: control plane ready to a DNS replica ready"] = time.monotonic() - t1
    tap.result(ok, "the cluster DNS (kubeadm's coredns Deployment, cluster-dns) has a ready replica after %.0f s"
               % (time.monotonic() - t1), why)
    if ok:
        # Under emulation the busy control plane answers kubelet's one-second readiness probe late now
        # and then, the replicas leave the service's endpoints for a while and kube-proxy rejects
        # queries to 10.96.0.10 meanwhile (EPERM): ask again until an answer comes.
        def asks(name, want):
            return lambda: (lambda r: (r == want, repr(r)[-600:]))(cluster_dns(port, cpid, "10.96.0.10", name))
        ok, why = wait_for(asks("kubernetes.default.svc.cluster.local", (0, ["10.96.0.1"])), 600, 10)
        tap.result(ok, "cluster DNS at 10.96.0.10: kubernetes.default.svc.cluster.local is 10.96.0.1", why)
        ok, why = wait_for(asks("nosuch.default.svc.cluster.local", (3, [])), 600, 10)
        tap.result(ok, "cluster DNS: a service that does not exist is NXDOMAIN", why)
    else:
        control_plane_diag(port, cpid)

    # what a join needs from the control plane: kube-controller-manager's bootstrap signer
    ok, why = wait_for(lambda: cluster_info_signed(kubectl, kubeconfig), 600, 10)
    tap.result(ok, "control plane: cluster-info is signed for the join token (the bootstrap signer runs)", why)
    if not ok:
        control_plane_diag(port, cpid)
        return

    # the worker
    endpoint = "%s:6443" % cp.get("ip")
    t0 = time.monotonic()
    # One vCPU for the worker: under TCG every vCPU is a host thread, and two VMs of two vCPUs on a
    # two-core host left the control plane's API server so little CPU while the worker booted that
    # its liveness probe failed and kubelet restarted it in the middle of the join (kubeadm's CPU
    # preflight asks two only of a control plane).
    status, w = create_vm(port, {"name": "e2e-worker", "image": ref, "kubernetes_version": kv, "memory_mib": 2048,
                                 "cpus": 1,
                                 "disk_gib": 10, "require_attestation": True,
                                 "user_data": cabpk_ignition("join", join_yml("e2e-worker", endpoint, ca_hash)),
                                 "wait_for": "ready"})
    took = time.monotonic() - t0
    TIMINGS["cluster: worker create_vm to ready (kubeadm join done)"] = took
    ok = status == 201 and isinstance(w, dict) and w.get("state") == "ready"
    tap.result(ok, "worker: create_vm with a join configuration (token, CA hash) is ready after %.0f s" % took,
               repr(w)[:1500])
    if not ok:
        control_plane_diag(port, cpid)
        return
    ok, why = ready_quote_pcr13(port, w["id"], kv, policy)
    tap.result(ok, "worker: its ready quote verified with PCR 13", why)
    ok, why = wait_for(lambda: (lambda rd: (rd[0].get("e2e-worker") is True, rd[1]))(nodes_ready(kubectl, kubeconfig)), 900, 10)
    TIMINGS["cluster: worker create_vm to node Ready"] = time.monotonic() - t0
    tap.result(ok, "kubectl get nodes: e2e-worker joined and Ready", why)

    # the worker reboots and stays a node
    t0 = time.monotonic()
    status, r = api(port, "POST", "/vms/%s/reboot" % w["id"])
    v = wait_state(port, w["id"], ("ready", "failed"), VM_TIMEOUT, 5)
    tap.result(isinstance(v, dict) and v.get("state") == "ready", "worker: reboot_vm, ready again", repr(v)[:600])
    ok, why = wait_for(lambda: (lambda rd: (rd[0].get("e2e-worker") is True and rd[0].get("e2e-cp") is True, rd[1]))(
        nodes_ready(kubectl, kubeconfig)), 900, 10)
    TIMINGS["cluster: worker reboot to node Ready"] = time.monotonic() - t0
    tap.result(ok, "kubectl get nodes after the worker's reboot: both Ready", why)
    ok, why = ready_quote_pcr13(port, w["id"], kv, policy)
    tap.result(ok, "worker: the reboot's ready quote verified with PCR 13", why)
    for vid in (w["id"], cpid):
        api(port, "DELETE", "/vms/" + vid, timeout=180)
    d.stop(signal.SIGTERM, timeout=180)
    ctx.pop("cluster", None)


TESTS = {"create": t_create, "verify": t_verify, "ignition": t_ignition, "metrics": t_metrics, "reboot": t_reboot,
         "kubernetes": t_kubernetes, "golden": t_golden, "pinned": t_pinned, "reject": t_reject,
         "restart": t_restart, "cluster": t_cluster, "update": t_update}


def ensure_image():
    """images/scripts/build.sh into IMAGE_DIR: a cache hit takes seconds, a first build minutes."""
    if os.path.isdir(IMAGE_DIR) and any(n.endswith(".efi") for n in os.listdir(IMAGE_DIR)):
        return
    if os.geteuid() != 0:
        return
    t0 = time.monotonic()
    p = subprocess.run([os.path.join(SOURCE_ROOT, "images", "scripts", "build.sh"), IMAGE_DIR],
                       env=dict(os.environ, VM_MANAGER=BIN), capture_output=True, text=True)
    TIMINGS["image: build or cache"] = time.monotonic() - t0
    tap.result(p.returncode == 0, "the guest image (images/scripts/build.sh, %.0f s)" % TIMINGS["image: build or cache"],
               (p.stdout + p.stderr)[-3000:])


def e2e(work):
    ensure_image()
    missing = missing_tools()
    if missing:
        tap.skip("e2e", "missing: %s" % ", ".join(missing))
        return
    ctx["images"] = copy_images(work)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e-user", "-f",
                    os.path.join(work, "user_key")], check=True)
    try:
        for name in ALL:
            if name in SELECTED:
                t0 = time.monotonic()
                try:
                    TESTS[name](work)
                except Exception:  # noqa: BLE001
                    tap.result(False, "%s: ran to the end" % name, traceback.format_exc())
                tap.diag("%s: %.0f s" % (name, time.monotonic() - t0))
    finally:
        for key in ("verify", "learn", "restart", "update", "cluster"):
            if ctx.get(key):
                try:
                    ctx[key].stop(signal.SIGTERM, timeout=180)
                except Exception:  # noqa: BLE001
                    pass
        for k, v in TIMINGS.items():
            tap.diag("timing: %s: %.1f s" % (k, v))


if __name__ == "__main__":
    sys.exit(run([e2e], int(os.environ.get("E2E_DEADLINE", "6000")), "vmm-e2e-"))
