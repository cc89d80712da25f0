#!/usr/bin/env python3
"""The host install (--install-mode host), against the fake QEMU (tests/integration/fakes): a small
image with a real GPT (written by sfdisk, sparse), its layout file made by images/scripts/layout.py
from the real image's repart.sysinstall.d, and:

  * create_vm lays out the VM's disk on the host: its GPT (read back with sfdisk --json) is the
    layout's, the copied partitions keep the image's UUIDs, labels and bytes, the B slots are
    _empty, var is ext4; the first QEMU is the installed boot (firmware, ignition.firstboot), the
    VM goes creating -> booting with installedAt set and installMode host;
  * install_mode host on an image without a layout file: unsupported, nothing created; by default
    the same image falls back to the installer boot;
  * a layout that does not match its image: create_vm answers vm_failed, the VM is failed with the
    reason in lastError and has no disk;
  * a daemon killed during a host install: the next one finds the VM failed, its disk gone;
  * the first boot's QEMU starts paused (-S) beside the install: create_vm (wait_for none) answers
    while the install runs, cont comes once the disk's GPT is written; an install that fails then
    takes the paused QEMU with it, and so does delete_vm; a monitor that answers only after the
    install ended, and a paused QEMU or swtpm killed during it, still end booting;
  * disk_gib too small for the layout: invalid_request before anything is allocated;
  * the Kubernetes sysext the IMDS would serve for the VM's version is put into var by the host
    install (lib/extensions/kubernetes_<v>.raw, 0444, var's root still 0755): read back with
    debugfs; a VM of an image directory without that file gets an empty var;
  * the storage provider back-end (a stand-in io.systemd.StorageProvider on varlink): a volume in the
    provider's directory, and one without a name (unlinked once opened) that the helper reaches as
    /proc/<daemon>/fd/<n>; and a provider that takes 3 s per Acquire: /healthz answers meanwhile,
    two creates of one name end in one VM and a conflict, the first start after a restart waits for
    its disk on the loop, and a delete_vm during that wait cancels the start.
"""

import array
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, HOST, base_env, free_port, http_request, run, tap, wait_state  # noqa: E402

FAKES = os.path.join(here, "fakes")
REPO = os.path.dirname(os.path.dirname(here))
LAYOUT_PY = os.path.join(REPO, "images", "scripts", "layout.py")
DEFS = os.path.join(REPO, "images", "mkosi.images", "base", "mkosi.extra", "usr", "lib", "repart.sysinstall.d")
CREATE = {"memory_mib": 512, "disk_gib": 3, "require_attestation": False}
MiB = 1 << 20
ESP, ROOT = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
VERITY, SIG = "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5", "41092B05-9FC8-4523-994F-2DEF0408B176"
VAR = "4D21B016-B534-45C2-A9FB-5C16E091FD2D"


def api(port, method, path, body=None, timeout=120):
    status, headers, data = http_request(port, method, "/api/v1" + path,
                                         body=json.dumps(body).encode() if body is not None else None,
                                         timeout=timeout)
    return status, (json.loads(data) if data else None)


def make_image(images, ref):
    """<ref>.raw: a GPT like the real image's (ESP 256 MiB, root, verity, signature), each partition
    starting with bytes of its own; <ref>.efi beside it."""
    raw = os.path.join(images, ref + ".raw")
    with open(raw, "wb") as f:
        f.truncate(300 * MiB)
    script = ("label: gpt\n"
              "start=2048, size=524288, type=%s, name=esp\n"
              "size=16384, type=%s, name=\"%s\", attrs=\"GUID:60\"\n"
              "size=2048, type=%s, name=\"%s_verity\", attrs=\"GUID:60\"\n"
              "size=32, type=%s, name=\"%s_verity_sig\", attrs=\"GUID:60\"\n") % (
                  ESP, ROOT, ref, VERITY, ref, SIG, ref)
    subprocess.run(["sfdisk", "--quiet", raw], input=script.encode(), check=True, capture_output=True)
    table = json.loads(subprocess.run(["sfdisk", "--json", raw], check=True, capture_output=True).stdout)
    with open(raw, "r+b") as f:
        for p in table["partitiontable"]["partitions"]:
            f.seek(p["start"] * 512)
            f.write(("%s of %s\n" % (p["name"], ref)).encode() * 64)
            # and a second extent after a hole
            if p["size"] > 4096:
                f.seek(p["start"] * 512 + 2 * MiB)
                f.write(os.urandom(4096))
    with open(os.path.join(images, ref + ".efi"), "wb") as f:
        f.write(b"\0" * 4096)
    return raw, table["partitiontable"]["partitions"]


def make_layout(images, ref):
    raw = os.path.join(images, ref + ".raw")
    out = os.path.join(images, ref + ".layout.json")
    subprocess.run([sys.executable, LAYOUT_PY, DEFS, raw, out], check=True, capture_output=True)
    with open(out) as f:
        return json.load(f)


def daemon(work, name, images, *extra, env_extra=None):
    vars_ = os.path.join(work, "vars-" + name)
    if not os.path.exists(vars_):
        with open(vars_, "wb") as f:
            f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="", **(env_extra or {}))
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "s-" + name),
                            "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                            "--launcher", "process", "--log-level", "debug", *extra], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "%s: serving with the fake QEMU" % name, why)
    return d, port


def read_at(path, offset, n):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def test_host_install(work):
    images = os.path.join(work, "images")
    os.makedirs(images)
    raw, src = make_image(images, "base_1.0")
    layout = make_layout(images, "base_1.0")
    d, port = daemon(work, "host", images)

    t0 = time.monotonic()
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="h1", wait_for="none"))
    took = time.monotonic() - t0
    # the answer comes once the first boot's QEMU answers QMP, which starts paused beside the install
    tap.result(status == 201 and vm["state"] in ("creating", "booting") and vm.get("installMode") == "host",
               "host mode: create_vm (wait_for none) answers once QEMU's monitor does: %s, installMode host "
               "(%.2f s)" % (vm.get("state") if vm else None, took), repr(vm)[:400])
    if status != 201:
        d.stop(signal.SIGTERM, timeout=30)
        return
    deadline = time.monotonic() + 30
    while vm["state"] == "creating" and time.monotonic() < deadline:
        time.sleep(0.1)
        _, vm = api(port, "GET", "/vms/" + vm["id"])
    tap.result(vm["state"] == "booting" and vm.get("installedAt") and vm.get("phase") == "boot",
               "then booting, with installedAt set", repr(vm)[:400])
    disk = vm["paths"]["volume"]
    table = json.loads(subprocess.run(["sfdisk", "--json", disk], check=True, capture_output=True).stdout)
    parts = table["partitiontable"]["partitions"]
    want = layout["partitions"]
    same = len(parts) == len(want)
    for p, w in zip(parts, want):
        same = same and p["type"].lower() == w["type"] and p["name"] == w["label"]
        if w["content"] == "copy":
            same = same and p["uuid"].lower() == w["uuid"] and p["size"] * 512 == w["sizeBytes"]
        elif not w.get("grow"):
            same = same and p["size"] * 512 == w["sizeBytes"]
        same = same and p["start"] % 2048 == 0
    tap.result(same, "the disk's GPT is the layout's: types, labels, sizes, 1 MiB aligned, the image's UUIDs",
               json.dumps(parts)[:1500])
    by_uuid = {p["uuid"]: p for p in src}
    copies_ok = True
    for p, w in zip(parts, want):
        if w["content"] != "copy":
            continue
        s = by_uuid[p["uuid"]]
        n = s["size"] * 512
        a, b = read_at(raw, s["start"] * 512, n), read_at(disk, p["start"] * 512, n)
        copies_ok = copies_ok and a == b
        if "GUID:60" in s.get("attrs", ""):
            copies_ok = copies_ok and "GUID:60" in p.get("attrs", "")
    tap.result(copies_ok, "ESP, root, verity and signature A are the image's bytes, attributes kept")
    empties = [p for p in parts if p["name"] == "_empty"]
    var = parts[-1]
    magic = read_at(disk, var["start"] * 512 + 1024 + 56, 2)
    tap.result(len(empties) == 3 and all("GUID:63" in p.get("attrs", "") for p in empties)
               and var["name"] == "var" and magic == b"\x53\xef"
               and (var["start"] + var["size"]) * 512 > 3 * (1 << 30) - 2 * MiB,
               "B slots _empty with no-auto, var ext4 over the rest of the disk", repr((empties, var))[:600])
    vmdir = os.path.join(work, "s-host", "vms", vm["id"])
    with open(os.path.join(vmdir, "qemu.argv.json")) as f:
        argv = json.load(f)
    text = " ".join(argv)
    tap.result("-no-reboot" not in argv and "-kernel" not in argv and "pflash" in text
               and "ignition.firstboot" in text and "vm.install-target" not in text,
               "the first QEMU is the installed boot: firmware, ignition.firstboot, no installer", text[:600])
    # a QEMU started with its vCPUs stopped (-S) beside the install got cont once the disk was
    # written: the GPT, which the helper writes last, was on the disk when the guest was let run.
    # (This small image may be installed before the helpers answer: then QEMU starts after it.)
    mbr = b""
    if os.path.exists(os.path.join(vmdir, "qemu.cont.mbr")):
        mbr = read_at(os.path.join(vmdir, "qemu.cont.mbr"), 0, 1024)
    tap.result("-S" not in argv or (mbr[510:512] == b"\x55\xaa" and mbr[512:520] == b"EFI PART"),
               "cont only once the disk's GPT was written (QEMU started %s)" % (
                   "paused beside the install" if "-S" in argv else "after the install"),
               repr((argv[-3:], mbr[510:520])))
    with open(os.path.join(vmdir, "install.log")) as f:
        log = f.read()
    tap.result("host-install: done" in log, "the helper's log says what it did", log[-300:])

    # A disk the guest has written to: freeing its blocks takes the file system a while (about 175 ms
    # for 1 GiB here), which the daemon's file writer does, not its loop (the loop check of this
    # daemon, at the end of the test, sees to that). The answer still waits for it: no disk after 204.
    subprocess.run(["dd", "if=/dev/zero", "of=" + disk, "bs=1M", "count=1024", "seek=64", "conv=notrunc,fsync",
                    "status=none"], check=True)
    status, _ = api(port, "DELETE", "/vms/" + vm["id"])
    tap.result(status == 204 and not os.path.exists(disk) and not os.path.exists(vmdir),
               "delete_vm of a VM with 1 GiB written to its disk: 204, then no disk and no directory",
               repr((status, os.path.exists(disk), os.path.exists(vmdir))))
    d.stop(signal.SIGTERM, timeout=30)


def var_fs(work, disk, parts, name):
    """var (the last partition) of the disk as a file of its own, for debugfs."""
    var = parts[-1]
    out = os.path.join(work, name)
    subprocess.run(["dd", "if=" + disk, "of=" + out, "bs=512", "skip=%d" % var["start"], "count=%d" % var["size"],
                    "status=none"], check=True)
    return out


def debugfs(fs, cmd):
    return subprocess.run(["debugfs", "-R", cmd, fs], capture_output=True, text=True).stdout


def test_kubernetes_seed(work):
    images = os.path.join(work, "images-k8s")
    kdir = os.path.join(images, "sysupdate", "kubernetes")
    os.makedirs(kdir)
    make_image(images, "k8s_1.0")
    make_layout(images, "k8s_1.0")
    sysext = os.urandom(3 * MiB + 123)
    with open(os.path.join(kdir, "kubernetes_1.2.3.raw"), "wb") as f:
        f.write(sysext)
    with open(os.path.join(kdir, "SHA256SUMS"), "w") as f:
        f.write("%s  kubernetes_1.2.3.raw\n" % hashlib.sha256(sysext).hexdigest())
    d, port = daemon(work, "k8s", images)
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="k1", wait_for="installed"))
    ok = status == 201 and vm.get("kubernetesVersion") == "1.2.3" and vm.get("installedAt")
    tap.result(ok, "a VM with Kubernetes 1.2.3 in host mode is installed", repr((status, vm))[:400])
    if ok:
        disk = vm["paths"]["volume"]
        parts = json.loads(subprocess.run(["sfdisk", "--json", disk], check=True,
                                          capture_output=True).stdout)["partitiontable"]["partitions"]
        fs = var_fs(work, disk, parts, "k1-var.img")
        dump = os.path.join(work, "k1-sysext.raw")
        debugfs(fs, "dump /lib/extensions/kubernetes_1.2.3.raw " + dump)
        got = open(dump, "rb").read() if os.path.exists(dump) else b""
        mode = debugfs(fs, "stat /lib/extensions/kubernetes_1.2.3.raw")
        root = debugfs(fs, "stat /")
        fsck = subprocess.run(["e2fsck", "-fn", fs], capture_output=True, text=True)
        tap.result(got == sysext and "Mode:  0444" in mode and "Mode:  0755" in root and fsck.returncode == 0,
                   "var holds the sysext the IMDS serves, as systemd-sysupdate would leave it: "
                   "/lib/extensions/kubernetes_1.2.3.raw, the same bytes, 0444; var's root 0755; fsck clean",
                   repr((len(got), mode[:200], root[:200], fsck.stdout[-300:])))
        vmdir = os.path.join(work, "s-k8s", "vms", vm["id"])
        left = [n for n in os.listdir(vmdir) if n.startswith("var-seed.")]
        tap.result(not left, "the staging directory is gone after the install", repr(left))
    # the same image directory without the file: nothing to put into var, the guest downloads it
    os.unlink(os.path.join(kdir, "kubernetes_1.2.3.raw"))
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="k2", wait_for="installed"))
    ok = status == 201 and vm.get("installedAt")
    listing = ""
    if ok:
        disk = vm["paths"]["volume"]
        parts = json.loads(subprocess.run(["sfdisk", "--json", disk], check=True,
                                          capture_output=True).stdout)["partitiontable"]["partitions"]
        listing = debugfs(var_fs(work, disk, parts, "k2-var.img"), "ls /")
    tap.result(ok and "lost+found" in listing and "lib" not in listing,
               "without the file on the host the install still succeeds and var is empty",
               repr((status, listing))[:400])
    d.stop(signal.SIGTERM, timeout=30)


def test_modes_and_refusals(work):
    images = os.path.join(work, "images-bare")
    os.makedirs(images)
    make_image(images, "bare_1.0")
    d, port = daemon(work, "bare", images)
    status, err = api(port, "POST", "/vms", dict(CREATE, name="b1", wait_for="none", install_mode="host"))
    msg = (err or {}).get("error", {}).get("message", "")
    status2, vms = api(port, "GET", "/vms")
    tap.result(status == 501 and err["error"]["code"] == "unsupported" and "no layout file" in msg and vms == [],
               "install_mode host on an image without a layout file: unsupported, nothing created",
               repr((status, err, vms))[:400])
    status, err = api(port, "POST", "/vms", dict(CREATE, name="b2", wait_for="none", install_mode="sideways"))
    tap.result(status == 400 and "install_mode" in err["error"]["message"],
               "install_mode sideways: invalid_request", repr(err)[:300])
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="b3", wait_for="none"))
    tap.result(status == 201 and vm.get("installMode") == "boot" and vm["state"] == "installing",
               "by default the same image falls back to the installer boot", repr(vm)[:300])
    tap.result("has no layout file" in d.stderr(), "... and the log says so")
    d.stop(signal.SIGTERM, timeout=30)

    images = os.path.join(work, "images-small")
    os.makedirs(images)
    make_image(images, "small_1.0")
    make_layout(images, "small_1.0")
    d, port = daemon(work, "small", images)
    status, err = api(port, "POST", "/vms", dict(CREATE, name="s1", wait_for="none", disk_gib=1))
    status2, vms = api(port, "GET", "/vms")
    tap.result(status == 400 and "too small" in err["error"]["message"] and vms == []
               and not (os.path.isdir(os.path.join(work, "s-small", "vms"))
                        and os.listdir(os.path.join(work, "s-small", "vms"))),
               "disk_gib 1 for a layout that needs more: invalid_request, nothing allocated", repr(err)[:300])
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="s2", wait_for="none", install_mode="boot"))
    tap.result(status == 201 and vm.get("installMode") == "boot" and vm["state"] == "installing",
               "install_mode boot overrides the daemon's host default", repr(vm)[:300])
    d.stop(signal.SIGTERM, timeout=30)


def test_broken_layout(work):
    images = os.path.join(work, "images-broken")
    os.makedirs(images)
    make_image(images, "broken_1.0")
    layout = make_layout(images, "broken_1.0")
    layout["partitions"][1]["uuid"] = "00000000-1111-2222-3333-444444444444"
    with open(os.path.join(images, "broken_1.0.layout.json"), "w") as f:
        json.dump(layout, f)
    d, port = daemon(work, "broken", images)
    status, err = api(port, "POST", "/vms", dict(CREATE, name="x1", wait_for="none"))
    msg = (err or {}).get("error", {}).get("message", "")
    tap.result(status == 500 and err["error"]["code"] == "vm_failed" and "host install failed" in msg
               and "no partition with a UUID the layout copies" in msg,
               "a layout that does not match the image: create_vm answers vm_failed with the reason", msg[:400])
    status, vms = api(port, "GET", "/vms")
    vm = vms[0] if vms else {}
    tap.result(vm.get("state") == "failed" and "host install failed" in vm.get("lastError", "")
               and not os.path.exists(vm.get("paths", {}).get("volume", "/nonexistent-volume")),
               "... the VM is failed, lastError says why, and it has no disk", repr(vm)[:500])
    status, err = api(port, "POST", "/vms/%s/start" % vm.get("id", "x"), {})
    tap.result(status == 409, "... start_vm refuses it (never installed)", repr(err)[:300])
    status, _ = api(port, "DELETE", "/vms/%s" % vm.get("id", "x"))
    tap.result(status in (200, 204), "... and delete_vm removes it", repr(status))

    # an image that is no disk at all
    with open(os.path.join(images, "broken_1.0.raw"), "wb") as f:
        f.write(b"\0" * 65536)
    status, err = api(port, "POST", "/vms", dict(CREATE, name="x2", wait_for="installed"))
    msg = (err or {}).get("error", {}).get("message", "")
    tap.result(status == 500 and "has no valid GPT" in msg,
               "an image without a partition table: vm_failed, the image has no valid GPT", msg[:300])
    d.stop(signal.SIGTERM, timeout=30)


def lock_holders(path):
    """(pid, command line, state) of every process with path open."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) != path:
                    continue
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read()[:300]
                with open("/proc/%s/status" % pid) as f:
                    state = [line for line in f if line.startswith(("State", "PPid", "Name"))]
                found.append((pid, cmd, state))
            except OSError:
                continue
    return found


def test_restart_during_install(work):
    images = os.path.join(work, "images-slow")
    os.makedirs(images)
    make_image(images, "slow_1.0")
    make_layout(images, "slow_1.0")
    # the image becomes a FIFO: the helper blocks opening it, the install never ends by itself
    os.unlink(os.path.join(images, "slow_1.0.raw"))
    os.mkfifo(os.path.join(images, "slow_1.0.raw"))
    d, port = daemon(work, "slow", images)
    answer = {}

    def create():
        try:
            answer["r"] = api(port, "POST", "/vms", dict(CREATE, name="r1", wait_for="none"), timeout=30)
        except Exception as e:  # noqa: BLE001 - the daemon dies under it
            answer["r"] = (None, repr(e))
    t = threading.Thread(target=create, daemon=True)
    t.start()
    vm = None
    for _ in range(100):
        status, vms = api(port, "GET", "/vms")
        if vms:
            vm = vms[0]
            break
        time.sleep(0.1)
    tap.result(vm is not None and vm["state"] == "creating", "a host install in progress: the VM is creating",
               repr(vm)[:300])
    # The record reaches the disk on the daemon's file writer a moment after the VM is listed; a crash
    # before that loses a create that was never answered, with nothing left behind. Kill it after.
    record = os.path.join(work, "s-slow", "vms", (vm or {}).get("id", "?"), "vm.json")
    for _ in range(100):
        if os.path.exists(record):
            break
        time.sleep(0.1)
    # a loaded machine may take a while to tear down a killed ASan process: wait for it, the lock goes with it
    rc, _ = d.stop(signal.SIGKILL, timeout=60)
    tap.result(rc is not None and os.path.exists(record), "the daemon is killed with the record on disk", repr(rc))
    t.join(5)
    # Nothing of the killed daemon may keep its state directory's lock: name any process that does.
    lock = os.path.join(work, "s-slow", "vm-manager.lock")
    holders = lock_holders(lock)
    tap.result(not holders, "no process of the killed daemon holds its state directory's lock", repr(holders)[:1500])
    d2, port2 = daemon(work, "slow", images)
    status, vms = api(port2, "GET", "/vms")
    vm2 = vms[0] if vms else {}
    disks = os.listdir(os.path.join(work, "s-slow", "volumes")) if os.path.isdir(
        os.path.join(work, "s-slow", "volumes")) else []
    tap.result(vm2.get("state") == "failed" and "restarted while the VM was creating" in vm2.get("lastError", "")
               and not any(vm2.get("id", "?") in x for x in disks),
               "a daemon killed during a host install: the next one fails the VM and drops its disk",
               repr((vm2, disks))[:500])
    d2.stop(signal.SIGTERM, timeout=30)


def pids_of(vmdir, what):
    """pids of the fakes of the VM in vmdir: what is "/qmp.sock" for its QEMU, "/tpm/swtpm.sock" for its
    swtpm (whose socket QEMU's command line names too: told apart by the fake's name)."""
    prog = b"fakes/swtpm" if "swtpm" in what else b"fakes/qemu-system"
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (vmdir + what).encode() in cmd and prog in cmd:
            pids.append(int(pid))
    return pids


def held_mke2fs(work, name, condition):
    """A directory holding an mke2fs that waits while the shell test condition holds, then runs the
    real one: it formats var, the host install's last step before the GPT, so the install stays in
    progress for as long as the test wants."""
    bindir = os.path.join(work, name)
    os.makedirs(bindir)
    real = shutil.which("mke2fs", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    with open(os.path.join(bindir, "mke2fs"), "w") as f:
        f.write("#!/bin/sh\nwhile %s; do sleep 0.05; done\nexec %s \"$@\"\n" % (condition, real))
    os.chmod(os.path.join(bindir, "mke2fs"), 0o755)
    return bindir


def qemu_of(vmdir):
    return pids_of(vmdir, "/qmp.sock")


def test_paused_beside_install(work):
    """The first boot's QEMU starts paused beside the host install. To hold the install in progress
    for as long as the test wants: mke2fs (which formats var, the last step before the GPT) is a
    wrapper that waits for a gate file; and an image whose .raw is a FIFO blocks the helper until the
    test writes to it."""
    images = os.path.join(work, "images-paused")
    os.makedirs(images)
    make_image(images, "paused_1.0")
    make_layout(images, "paused_1.0")
    make_image(images, "fifo_1.0")
    make_layout(images, "fifo_1.0")
    fifo = os.path.join(images, "fifo_1.0.raw")
    os.unlink(fifo)
    os.mkfifo(fifo)
    gate = os.path.join(work, "mke2fs.gate")
    bindir = held_mke2fs(work, "gated-bin", '[ ! -e "%s" ]' % gate)
    d, port = daemon(work, "paused", images, env_extra={"PATH": bindir + ":" + os.environ.get("PATH", "")})

    t0 = time.monotonic()
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="p0", image="paused_1.0", wait_for="none"), timeout=30)
    took = time.monotonic() - t0
    vmdir = os.path.join(work, "s-paused", "vms", (vm or {}).get("id", "x"))
    argv = []
    if os.path.exists(os.path.join(vmdir, "qemu.argv.json")):
        with open(os.path.join(vmdir, "qemu.argv.json")) as f:
            argv = json.load(f)
    tap.result(status == 201 and vm["state"] == "creating" and vm.get("installedAt") is None
               and "-S" in argv and qemu_of(vmdir) and not os.path.exists(os.path.join(vmdir, "qemu.cont")),
               "create_vm (wait_for none) answers while the install still runs: creating, QEMU up with -S "
               "and not let run (%.2f s)" % took, repr((status, vm))[:400])
    if status != 201:
        d.stop(signal.SIGTERM, timeout=30)
        return
    pid = qemu_of(vmdir)
    with open(gate, "w"):
        pass
    deadline = time.monotonic() + 30
    while vm["state"] == "creating" and time.monotonic() < deadline:
        time.sleep(0.1)
        _, vm = api(port, "GET", "/vms/" + vm["id"])
    mbr = b""
    if os.path.exists(os.path.join(vmdir, "qemu.cont.mbr")):
        mbr = read_at(os.path.join(vmdir, "qemu.cont.mbr"), 0, 1024)
    tap.result(vm["state"] == "booting" and vm.get("installedAt") and qemu_of(vmdir) == pid
               and mbr[510:512] == b"\x55\xaa" and mbr[512:520] == b"EFI PART",
               "the install done: the same QEMU gets cont, with the disk's GPT (written last) in place; booting",
               repr((vm.get("state"), vm.get("installedAt"), mbr[510:520]))[:400])
    api(port, "DELETE", "/vms/" + vm["id"])

    status, vm = api(port, "POST", "/vms", dict(CREATE, name="p1", image="fifo_1.0", wait_for="none"), timeout=30)
    vmdir = os.path.join(work, "s-paused", "vms", (vm or {}).get("id", "x"))
    tap.result(status == 201 and vm["state"] == "creating" and qemu_of(vmdir),
               "an install blocked on its image: creating, the paused QEMU up", repr((status, vm))[:400])
    volume = vm["paths"]["volume"]
    status, err = api(port, "POST", "/vms/%s/stop" % vm["id"], {})
    tap.result(status == 409, "stop_vm during the install: conflict (still starting)", repr(err)[:300])

    # the helper now reads a stream that is no disk: the install fails
    try:
        with open(fifo, "wb") as f:
            f.write(b"\0" * 65536)
    except BrokenPipeError:
        pass  # the helper gave up before reading it all
    deadline = time.monotonic() + 30
    while vm["state"] == "creating" and time.monotonic() < deadline:
        time.sleep(0.1)
        _, vm = api(port, "GET", "/vms/" + vm["id"])
    tap.result(vm["state"] == "failed" and "host install failed" in (vm.get("lastError") or "")
               and not qemu_of(vmdir) and not os.path.exists(volume) and not os.path.exists(
                   os.path.join(vmdir, "qemu.cont")),
               "the install fails: the paused QEMU is killed (never let run), the VM failed, its disk gone",
               repr(vm)[:500])
    api(port, "DELETE", "/vms/" + vm["id"])

    # delete_vm while the install runs and QEMU waits
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="p2", image="fifo_1.0", wait_for="none"), timeout=30)
    vmdir = os.path.join(work, "s-paused", "vms", (vm or {}).get("id", "x"))
    up = bool(qemu_of(vmdir))
    status, _ = api(port, "DELETE", "/vms/%s" % vm["id"])
    time.sleep(0.5)
    status2, vms = api(port, "GET", "/vms")
    tap.result(up and status in (200, 204) and vms == [] and not qemu_of(vmdir)
               and not os.path.exists(vm["paths"]["volume"]),
               "delete_vm during the install: the paused QEMU and the helper go, and the disk", repr((status, vms)))
    d.stop(signal.SIGTERM, timeout=30)

    # an install that never ends meets the install timeout
    d, port = daemon(work, "tmo", images, "--install-timeout", "2s")
    t0 = time.monotonic()
    status, err = api(port, "POST", "/vms", dict(CREATE, name="t1", image="fifo_1.0", wait_for="installed"),
                      timeout=60)
    took = time.monotonic() - t0
    msg = (err or {}).get("error", {}).get("message", "")
    _, vms = api(port, "GET", "/vms")
    vm = vms[0] if vms else {}
    vmdir = os.path.join(work, "s-tmo", "vms", vm.get("id", "x"))
    tap.result(status == 500 and "did not finish within 2s" in msg and vm.get("state") == "failed"
               and not qemu_of(vmdir) and not os.path.exists(vm.get("paths", {}).get("volume", "/nonexistent")),
               "a host install past --install-timeout: killed, the VM failed saying so, no QEMU, no disk "
               "(%.1f s)" % took, msg[:400])
    d.stop(signal.SIGTERM, timeout=30)


def test_prestart_recovers(work):
    """What the paused QEMU beside the install meets: its monitor answering only after the install
    ended, the QEMU killed, or its swtpm killed, while the install runs. mke2fs waits while a hold
    file exists; the fake QEMU greets QMP 1.5 s late."""
    images = os.path.join(work, "images-rec")
    os.makedirs(images)
    make_image(images, "rec_1.0")
    make_layout(images, "rec_1.0")
    hold = os.path.join(work, "mke2fs.hold")
    bindir = held_mke2fs(work, "hold-bin", '[ -e "%s" ]' % hold)
    d, port = daemon(work, "rec", images, env_extra={"PATH": bindir + ":" + os.environ.get("PATH", ""),
                                                      "FAKE_QMP_DELAY": "1.5"})

    def create(name):
        box = {}
        t = threading.Thread(target=lambda: box.update(r=api(port, "POST", "/vms", dict(
            CREATE, name=name, wait_for="none"), timeout=60)), daemon=True)
        t.start()
        return t, box

    def vm_dir_of(name):
        for _ in range(200):
            _, vms = api(port, "GET", "/vms")
            for vm in vms or []:
                if vm["name"] == name:
                    return vm["id"], os.path.join(work, "s-rec", "vms", vm["id"])
            time.sleep(0.05)
        return None, None

    def argv_of(vmdir):
        try:
            with open(os.path.join(vmdir, "qemu.argv.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return []

    def wait_booting(vid):
        vm = {}
        for _ in range(300):
            _, vm = api(port, "GET", "/vms/" + vid)
            if vm["state"] != "creating":
                break
            time.sleep(0.1)
        return vm

    # 1. the install ends while the paused QEMU's monitor has not answered yet
    with open(hold, "w"):
        pass
    t, box = create("late-qmp")
    vid, vmdir = vm_dir_of("late-qmp")
    for _ in range(200):
        if "-S" in argv_of(vmdir):
            break
        time.sleep(0.05)
    paused = "-S" in argv_of(vmdir)
    first = pids_of(vmdir, "/qmp.sock")
    os.unlink(hold)  # the install ends now, before QMP greets
    t.join(60)
    status, vm = box.get("r", (None, None))
    vm = wait_booting(vid)
    tap.result(paused and status == 201 and vm["state"] == "booting" and pids_of(vmdir, "/qmp.sock") == first
               and os.path.exists(os.path.join(vmdir, "qemu.cont")),
               "the install ends before the paused QEMU's monitor answers: the same QEMU gets cont, booting",
               repr((paused, status, vm.get("state"), first))[:300])
    api(port, "DELETE", "/vms/" + vid)

    # 2. and 3. the paused QEMU, or its swtpm, killed while the install runs
    for victim, what in (("QEMU", "/qmp.sock"), ("swtpm", "/tpm/swtpm.sock")):
        with open(hold, "w"):
            pass
        name = "kill-" + victim.lower()
        t, box = create(name)
        t.join(60)
        status, vm = box.get("r", (None, None))
        vid, vmdir = vm_dir_of(name)
        old_qemu, old_tpm = pids_of(vmdir, "/qmp.sock"), pids_of(vmdir, "/tpm/swtpm.sock")
        before = status == 201 and vm["state"] == "creating" and "-S" in argv_of(vmdir) and old_qemu and old_tpm
        for pid in pids_of(vmdir, what):
            os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        os.unlink(hold)
        vm = wait_booting(vid)
        new_qemu, new_tpm = pids_of(vmdir, "/qmp.sock"), pids_of(vmdir, "/tpm/swtpm.sock")
        tap.result(before and vm["state"] == "booting" and len(new_qemu) == 1 and new_qemu != old_qemu
                   and "-S" not in argv_of(vmdir) and len(new_tpm) == 1 and new_tpm != old_tpm,
                   "the paused QEMU's %s killed during the install: QEMU and its helpers start afresh after "
                   "it, booting" % victim if victim == "swtpm" else
                   "the paused QEMU killed during the install: a fresh QEMU and helpers after it, booting",
                   repr((before, vm.get("state"), old_qemu, new_qemu, old_tpm, new_tpm))[:400])
        api(port, "DELETE", "/vms/" + vid)
    d.stop(signal.SIGTERM, timeout=30)


def fake_provider(sock_path, vol_dir, mode):
    """io.systemd.StorageProvider as vm-manager speaks it: GetInfo, Acquire (the fd passed with
    SCM_RIGHTS). While mode["anon"] is set, a new volume is unlinked once opened; mode["delay"]
    (seconds) holds each Acquire's answer back that long."""
    os.makedirs(os.path.dirname(sock_path), exist_ok=True)
    os.makedirs(vol_dir, exist_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(16)
    keep = []

    def serve(conn):
        buf = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                method, params = msg.get("method"), msg.get("parameters") or {}
                if method == "org.varlink.service.GetInfo":
                    conn.sendall(json.dumps({"parameters": {
                        "vendor": "test", "product": "fake", "version": "1", "url": "",
                        "interfaces": ["org.varlink.service", "io.systemd.StorageProvider"]}}).encode() + b"\0")
                elif method == "io.systemd.StorageProvider.Acquire":
                    time.sleep(mode.get("delay", 0))
                    path = os.path.join(vol_dir, params["name"] + ".volume")
                    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                    if params.get("createSizeBytes"):
                        os.ftruncate(fd, params["createSizeBytes"])
                    if mode.get("anon"):
                        keep.append(os.dup(fd))
                        os.unlink(path)
                    reply = json.dumps({"parameters": {"type": "reg", "fileDescriptorIndex": 0,
                                                       "readOnly": False}}).encode() + b"\0"
                    conn.sendmsg([reply], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
                    os.close(fd)
                else:
                    conn.sendall(json.dumps({"error": "org.varlink.service.MethodNotFound"}).encode() + b"\0")

    def loop():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            # conn bound now: the loop's next accept rebinds the name before this thread may run,
            # which left the first of two quick connections unserved and closed with its request
            # unread (the daemon's read: "Connection reset by peer")
            threading.Thread(target=lambda c=conn: (serve(c), c.close()), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
    return srv


def test_storage_provider(work):
    images = os.path.join(work, "images-prov")
    os.makedirs(images)
    make_image(images, "prov_1.0")
    layout = make_layout(images, "prov_1.0")
    run_dir = os.path.join(work, "run-prov")
    vol_dir = os.path.join(work, "state-home", "storage")
    mode = {}
    srv = fake_provider(os.path.join(run_dir, "systemd", "io.systemd.StorageProvider", "fs"), vol_dir, mode)
    d, port = daemon(work, "prov", images, env_extra={"XDG_RUNTIME_DIR": run_dir,
                                                      "XDG_STATE_HOME": os.path.join(work, "state-home")})
    for name in ("named", "anon"):
        mode["anon"] = name == "anon"
        status, vm = api(port, "POST", "/vms", dict(CREATE, name="p-" + name, wait_for="none"))
        # wait_for none answers once the paused first QEMU does, which may be before the install is
        # done on a loaded machine: the layout is read once the VM boots
        if status == 201 and vm.get("state") == "creating":
            vm = wait_state(port, vm["id"], ("booting", "failed"), 60) or vm
        disk = (vm or {}).get("paths", {}).get("volume", "")
        ok = status == 201 and vm.get("installMode") == "host" and vm["state"] == "booting"
        if name == "named":
            ok = ok and disk == os.path.join(vol_dir, "vm-%s.volume" % vm["id"])
        else:
            ok = ok and disk.startswith("/proc/%d/fd/" % d.pid)
        parts = []
        if ok:
            table = json.loads(subprocess.run(["sfdisk", "--json", disk], check=True, capture_output=True).stdout)
            parts = table["partitiontable"]["partitions"]
        tap.result(ok and [p["name"] for p in parts] == [p["label"] for p in layout["partitions"]],
                   "storage provider, %s volume: the host install lays it out (%s)" % (name, disk),
                   repr((status, vm))[:400])
    d.stop(signal.SIGTERM, timeout=30)
    srv.close()


def healthz_while(port, busy):
    """/healthz answered over and over while busy() is true: (answers, slowest in seconds)."""
    n, worst = 0, 0.0
    while busy():
        t0 = time.monotonic()
        status, _, _ = http_request(port, "GET", "/healthz", timeout=5)
        worst = max(worst, time.monotonic() - t0)
        n += status == 200
        time.sleep(0.05)
    return n, worst


def test_storage_provider_slow(work):
    """A provider that takes 3 s to answer each Acquire: the daemon serves meanwhile, the create
    and the first start after a restart complete from the loop, a start cancelled by delete_vm
    answers, and a second create of the same name that was waiting too is refused."""
    images = os.path.join(work, "images-slowprov")
    os.makedirs(images)
    make_image(images, "slow_1.0")
    make_layout(images, "slow_1.0")
    run_dir = os.path.join(work, "run-slow")
    vol_dir = os.path.join(work, "state-home-slow", "storage")
    mode = {"delay": 3}
    srv = fake_provider(os.path.join(run_dir, "systemd", "io.systemd.StorageProvider", "fs"), vol_dir, mode)
    env_extra = {"XDG_RUNTIME_DIR": run_dir, "XDG_STATE_HOME": os.path.join(work, "state-home-slow")}
    d, port = daemon(work, "slowprov", images, env_extra=env_extra)

    results = {}

    def create(key, name):
        results[key] = api(port, "POST", "/vms", dict(CREATE, name=name, wait_for="none"))

    t0 = time.monotonic()
    threads = [threading.Thread(target=create, args=("a", "s-a")), threading.Thread(target=create, args=("b", "s-a"))]
    for t in threads:
        t.start()
    time.sleep(0.2)
    n, worst = healthz_while(port, lambda: any(t.is_alive() for t in threads))
    took = time.monotonic() - t0
    answers = sorted([results.get("a", (None,))[0], results.get("b", (None,))[0]], key=str)
    tap.result(took >= 3 and n >= 10 and worst < 1.0,
               "a provider answering in 3 s: /healthz answers meanwhile (%d answers, slowest %.0f ms)"
               % (n, worst * 1000), "took %.1f s, %d answers, slowest %.3f s" % (took, n, worst))
    winner = results["a"] if results.get("a", (None,))[0] == 201 else results.get("b")
    loser = results["b"] if winner is results.get("a") else results.get("a")
    tap.result(answers == [201, 409] and winner[1].get("state") in ("creating", "booting")
               and "is in use by" in json.dumps(loser[1]),
               "two creates of one name waiting for their disks: one VM, the other refused (conflict)",
               repr(results)[:600])
    vid = (winner[1] or {}).get("id")
    status, vms = api(port, "GET", "/vms")
    tap.result(isinstance(vms, list) and len(vms) == 1 and os.listdir(os.path.join(work, "s-slowprov", "vms")) == [vid]
               and sorted(os.listdir(vol_dir)) == ["vm-%s.volume" % vid],
               "the refused create left no directory and no disk", repr((vms, os.listdir(vol_dir)))[:400])

    # stopped, then a restart: the first start takes the disk's lease again, in the provider's time
    status, _ = api(port, "POST", "/vms/%s/stop" % vid, {})
    d.stop(signal.SIGTERM, timeout=30)
    mode["delay"] = 0
    d, port = daemon(work, "slowprov", images, env_extra=env_extra)
    mode["delay"] = 3
    done = {}
    t = threading.Thread(target=lambda: done.update(r=api(port, "POST", "/vms/%s/start" % vid, {})))
    t.start()
    time.sleep(0.2)
    n, worst = healthz_while(port, t.is_alive)
    tap.result(done.get("r", (None,))[0] == 200 and n >= 10 and worst < 1.0,
               "the first start after a restart waits for the disk on the loop (%d answers of /healthz, "
               "slowest %.0f ms)" % (n, worst * 1000), repr((done, n, worst))[:400])

    # the same, with the VM deleted while its disk is opened: the start is answered, the VM is gone
    status, _ = api(port, "POST", "/vms/%s/stop" % vid, {})
    d.stop(signal.SIGTERM, timeout=30)
    mode["delay"] = 0
    d, port = daemon(work, "slowprov", images, env_extra=env_extra)
    mode["delay"] = 3
    done = {}
    t = threading.Thread(target=lambda: done.update(r=api(port, "POST", "/vms/%s/start" % vid, {})))
    t.start()
    time.sleep(0.5)
    status, gone = api(port, "DELETE", "/vms/%s" % vid)
    t.join(10)
    r = done.get("r", (None, None))
    tap.result(status == 204 and r[0] == 409 and "cancelled" in json.dumps(r[1])
               and api(port, "GET", "/vms/" + vid)[0] == 404,
               "delete_vm while the start opens the disk: the start answers conflict, the VM is gone",
               repr((status, gone, r))[:600])
    d.stop(signal.SIGTERM, timeout=30)
    srv.close()


if __name__ == "__main__":
    sys.exit(run([test_host_install, test_kubernetes_seed, test_modes_and_refusals, test_broken_layout, test_restart_during_install,
                  test_paused_beside_install, test_prestart_recovers, test_storage_provider,
                  test_storage_provider_slow],
                 300, "vmm-host-"))
