#!/usr/bin/env python3
"""Boots the test image the way vm-manager does, under TCG, and times it.

1. installer boot: OVMF + -kernel <UKI>, the .raw read-only as virtio disk "installer", a blank
   target as virtio disk "target", -no-reboot. The guest copies the image and powers off; QEMU
   must exit 0 and the console must say "install: copied N bytes".
2. installed boot: OVMF boots the target (bootindex=0) with the same vars file, a
   vhost-user-vsock-pci device served by vhost-device-vsock, and the SMBIOS type 11 credential
   io.systemd.credential:vmm.notify_socket=vsock-stream:2:<port>. READY=1 must arrive on
   <uds>_<port>; then system_powerdown over QMP, and QEMU must exit.

Prints one line per milestone with seconds since the QEMU process was started, and the two
QEMU command lines. Exit status 0 when every step passed.

usage: tests/image/boot-test.py IMAGE_DIR [--work DIR] [--keep] [--tpm] [--nic] [--port N] [--smm on|off]
"""
import argparse
import base64
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"
NAME = "test-vm_1.0"
# What a boot runs, with the Debian package of each
NEEDS = [("qemu-system-x86_64", "qemu-system-x86"), ("swtpm", "swtpm"),
         ("vhost-device-vsock", "vhost-device-vsock, from sid by tools/fetch-sid-package.sh")]


def missing_tools():
    """The commands and firmware files of NEEDS that are not there, each with its package."""
    missing = ["%s (package %s)" % (c, p) for c, p in NEEDS if not shutil.which(c)]
    missing += ["%s (package ovmf)" % f for f in (OVMF_CODE, OVMF_VARS) if not os.path.exists(f)]
    return missing


def log(msg):
    print(msg, flush=True)


class Qemu:
    def __init__(self, argv, console_path):
        self.argv = argv
        self.console = open(console_path, "wb")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buf = b""
        self.lines = []
        # The guest kernel gave up ("Kernel panic - not syncing"): nothing more will come, so
        # waiting for an exit or a notification is pointless. Under QEMU 7.2's multi-threaded TCG
        # this had been seen as an "Oops: int3" while the kernel patches its own text.
        self.panicked = None

    def t(self):
        return time.monotonic() - self.t0

    def pump(self, timeout):
        """Reads console output for up to timeout seconds; returns new complete lines."""
        new = []
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if r:
            data = self.proc.stdout.read()
            if data:
                self.console.write(data)
                self.console.flush()
                self.buf += data
                while b"\n" in self.buf:
                    line, self.buf = self.buf.split(b"\n", 1)
                    text = line.decode(errors="replace").rstrip("\r")
                    self.lines.append((self.t(), text))
                    new.append((self.t(), text))
                    if self.panicked is None and "Kernel panic - not syncing" in text:
                        self.panicked = self.t()
        return new

    def wait_exit(self, timeout, echo=True):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, text in self.pump(0.05):
                if echo:
                    log(f"  [{t:7.2f}] {text}")
            rc = self.proc.poll()
            if rc is not None:
                for t, text in self.pump(0):
                    if echo:
                        log(f"  [{t:7.2f}] {text}")
                return rc, self.t()
            if self.panicked is not None:
                return None, self.t()
        return None, self.t()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        err = self.proc.stderr.read().decode(errors="replace").strip()
        if err:
            log("  qemu stderr: " + err.replace("\n", "\n  qemu stderr: "))


class Qmp:
    def __init__(self, path, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self.f = self.sock.makefile("rwb")
        greeting = json.loads(self.f.readline())
        assert "QMP" in greeting, greeting
        self.cmd("qmp_capabilities")

    def cmd(self, name, **args):
        req = {"execute": name, "id": 1}
        if args:
            req["arguments"] = args
        self.f.write(json.dumps(req).encode() + b"\n")
        self.f.flush()
        while True:
            msg = json.loads(self.f.readline())
            if msg.get("id") == 1:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg.get("return")


def common_head(work, smm, memory, extra_machine=""):
    machine = "q35" + ("" if smm is None else f",smm={smm}") + extra_machine
    return [
        "qemu-system-x86_64",
        "-name", "guest=test-vm",
        "-machine", machine,
        "-accel", "tcg,thread=multi",
        "-cpu", "max",
        "-smp", "2",
        "-m", f"{memory}M",
        "-nodefaults",
        "-display", "none",
        "-serial", "stdio",
        "-qmp", f"unix:{work}/qmp.sock,server=on,wait=off",
        "-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
        "-drive", f"if=pflash,format=raw,unit=1,file={work}/ovmf_vars.fd",
    ]


def tpm_args(work):
    return [
        "-chardev", f"socket,id=chrtpm,path={work}/tpm/swtpm.sock",
        "-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
        "-device", "tpm-crb,tpmdev=tpm0",
    ]


def start_swtpm(work):
    os.makedirs(f"{work}/tpm", mode=0o700, exist_ok=True)
    sock = f"{work}/tpm/swtpm.sock"
    if os.path.exists(sock):
        os.unlink(sock)
    p = subprocess.Popen(
        ["swtpm", "socket", "--tpm2", "--tpmstate", f"dir={work}/tpm",
         "--ctrl", f"type=unixio,path={sock}", "--terminate"],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 5
    while not os.path.exists(sock):
        if time.monotonic() > deadline:
            raise RuntimeError("swtpm did not create its control socket")
        time.sleep(0.02)
    return p


def smbios_args(port, install):
    keys = base64.b64encode(b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyKeyForTheTestImageOnly00000000 vm-manager@test-vm\n")
    creds = [
        "io.systemd.credential:firstboot.hostname=test-vm",
        "io.systemd.credential.binary:ssh.authorized_keys.root=" + keys.decode(),
        "io.systemd.credential:system.machine_id=0123456789abcdef0123456789abcdef",
    ]
    if install:
        creds.append("io.systemd.credential:vm.install-target=/dev/disk/by-id/virtio-target")
    creds.append(f"io.systemd.credential:vmm.notify_socket=vsock-stream:2:{port}")
    if not install:
        creds.append("io.systemd.stub.kernel-cmdline-extra=ignition.firstboot")
    argv = ["-smbios", "type=1,manufacturer=GiantSwarm,product=vm-manager,serial=test-vm"]
    for c in creds:
        argv += ["-smbios", "type=11,value=" + c.replace(",", ",,")]
    return argv


def read_notify(conn):
    """One sd_notify message per connection: the guest writes it, shuts down its write side and
    waits for us to close. vhost-device-vsock does not pass the half-close on as EOF, so reading
    stops after 50 ms without data; then the connection is closed. Returns the raw bytes."""
    conn.settimeout(5)
    data = b""
    try:
        data = conn.recv(65536)
        conn.settimeout(0.05)
        while True:
            more = conn.recv(65536)
            if not more:
                break
            data += more
    except socket.timeout:
        pass
    conn.close()
    return data


def notify_listener(work, port):
    """The host side of the guest's vmm.notify_socket (vsock-stream:2:PORT): vhost-device-vsock
    connects to work/vsock.sock_PORT for each message. Stale sockets of an earlier boot go first."""
    path = f"{work}/vsock.sock_{port}"
    for p in (path, f"{work}/vhu.sock", f"{work}/qmp.sock"):
        if os.path.exists(p):
            os.unlink(p)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.setblocking(False)
    return listener


def start_vhost_vsock(work, cid):
    """vhost-device-vsock for the guest CID, its vhost-user socket at work/vhu.sock and its unix
    side at work/vsock.sock (port P: work/vsock.sock_P). Returns the process, or None when it did
    not come up within 5 s."""
    vhu = subprocess.Popen(
        ["vhost-device-vsock", "--guest-cid", str(cid), "--socket", f"{work}/vhu.sock",
         "--uds-path", f"{work}/vsock.sock"],
        stdin=subprocess.DEVNULL, stdout=open(f"{work}/vhost-device-vsock.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 5
    while not os.path.exists(f"{work}/vhu.sock"):
        if time.monotonic() > deadline or vhu.poll() is not None:
            vhu.kill()
            return None
        time.sleep(0.02)
    return vhu


def stop(p):
    """Stops a helper process: SIGTERM, then SIGKILL after 5 s."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def finish(procs, work, keep):
    """Stops the helper processes and removes the work directory unless it is to be kept."""
    for p in procs:
        stop(p)
    if keep:
        log(f"work dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def print_argv(title, argv):
    log(f"{title}:")
    for a in argv:
        log(f"    {a}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("image_dir")
    ap.add_argument("--work")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--tpm", action="store_true", help="add swtpm + tpm-crb as vm-manager does")
    ap.add_argument("--port", type=int, default=8888)
    ap.add_argument("--cid", type=int, default=3)
    ap.add_argument("--memory", type=int, default=512)
    ap.add_argument("--smm", choices=["on", "off"], default=None)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--target-mib", type=int, default=0, help="target size (default: the .raw's)")
    ap.add_argument("--nic", action="store_true",
                    help="give the installed boot a virtio-net NIC on a socket nobody dials (vm-manager's "
                         "NIC without its switch): DHCP must give up and READY=1 still come")
    args = ap.parse_args()
    missing = missing_tools()
    if missing:
        raise SystemExit("boot-test: missing %s; install with tools/install-deps.sh check" % ", ".join(missing))

    efi = os.path.abspath(os.path.join(args.image_dir, NAME + ".efi"))
    raw = os.path.abspath(os.path.join(args.image_dir, NAME + ".raw"))
    work = args.work or tempfile.mkdtemp(prefix="vmt-", dir="/tmp")
    os.makedirs(work, exist_ok=True)
    work = os.path.abspath(work)
    ok = True
    procs = []

    try:
        shutil.copyfile(OVMF_VARS, f"{work}/ovmf_vars.fd")
        target = f"{work}/target.raw"
        with open(target, "wb") as f:
            f.truncate(args.target_mib << 20 if args.target_mib else os.path.getsize(raw))

        # ---- installer boot ----
        argv = common_head(work, args.smm, args.memory) + [
            "-kernel", efi,
            "-drive", f"if=none,id=installer,format=raw,file={raw},readonly=on",
            "-device", "virtio-blk-pci,drive=installer,serial=installer",
            "-drive", f"if=none,id=target,format=raw,file={target},discard=unmap",
            "-device", "virtio-blk-pci,drive=target,serial=target",
        ]
        swtpm = None
        if args.tpm:
            swtpm = start_swtpm(work)
            procs.append(swtpm)
            argv += tpm_args(work)
        # The installer's credential set as vm-manager passes it (sorted by name); the ssh keys
        # end in a newline, so they go as a binary (base64) credential.
        argv += smbios_args(args.port, install=True) + ["-no-reboot"]
        print_argv("installer boot", argv)
        q = Qemu(argv, f"{work}/console-install.log")
        rc, t_exit = q.wait_exit(args.timeout)
        copied = [l for _, l in q.lines if "install: copied" in l]
        q.kill()
        if rc is None:
            if q.panicked is not None:
                log(f"FAIL installer boot: the guest kernel panicked at {q.panicked:.2f}s")
            else:
                log(f"FAIL installer boot did not exit within {args.timeout}s")
            return 1
        log(f"installer boot: QEMU exited with {rc} at {t_exit:.2f}s (exec -> exit)")
        if rc != 0 or not copied:
            log("FAIL installer boot: no 'install: copied' line or non-zero exit")
            return 1
        if swtpm:
            swtpm.wait(timeout=10)
        installer_time = t_exit

        # ---- installed boot ----
        listener = notify_listener(work, args.port)
        vhu = start_vhost_vsock(work, args.cid)
        if vhu is None:
            log("FAIL vhost-device-vsock did not create its socket")
            return 1
        procs.append(vhu)

        argv = common_head(work, args.smm, args.memory, ",memory-backend=mem") + [
            "-object", f"memory-backend-memfd,id=mem,size={args.memory}M,share=on",
            "-drive", f"if=none,id=target,format=raw,file={target},discard=unmap",
            "-device", "virtio-blk-pci,drive=target,serial=target,bootindex=0",
            "-chardev", f"socket,id=vhu,path={work}/vhu.sock",
            "-device", "vhost-user-vsock-pci,chardev=vhu",
        ]
        swtpm = None
        if args.tpm:
            swtpm = start_swtpm(work)
            procs.append(swtpm)
            argv += tpm_args(work)
        if args.nic:
            argv += [
                "-netdev", f"stream,id=net0,server=on,addr.type=unix,addr.path={work}/net.sock",
                "-device", "virtio-net-pci,netdev=net0,mac=02:de:c0:a8:7f:02,romfile=",
            ]
        argv += smbios_args(args.port, install=False)
        print_argv("installed boot", argv)
        q = Qemu(argv, f"{work}/console-boot.log")
        qmp = Qmp(f"{work}/qmp.sock")
        ready_at = None
        deadline = time.monotonic() + args.timeout
        while (ready_at is None and time.monotonic() < deadline and q.proc.poll() is None
               and q.panicked is None):
            for t, text in q.pump(0.02):
                log(f"  [{t:7.2f}] {text}")
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                continue
            data = read_notify(conn)
            t_msg = q.t()
            fields = dict(
                l.split("=", 1) for l in data.decode(errors="replace").split("\n") if "=" in l
            )
            log(f"notify at {t_msg:.2f}s: {data!r}")
            if fields.get("READY") == "1":
                ready_at = t_msg
        if ready_at is None:
            log("FAIL no READY=1 from the installed boot" +
                (f" (the guest kernel panicked at {q.panicked:.2f}s)" if q.panicked is not None else ""))
            ok = False
        else:
            log(f"installed boot: READY=1 at {ready_at:.2f}s (exec -> READY=1)")
            # At once, as vm-manager's stop may: the guest opened its power button device
            # before it sent READY=1, so the press is queued even if it is not waiting yet.
            t_pd = q.t()
            qmp.cmd("system_powerdown")
            rc, t_exit = q.wait_exit(60)
            if rc is None:
                log("FAIL the VM did not power off within 60 s of system_powerdown")
                ok = False
            else:
                log(f"power-off: QEMU exited with {rc} {t_exit - t_pd:.2f}s after system_powerdown")
                ok = ok and rc == 0
        q.kill()
        ready = f"{ready_at:.2f}s" if ready_at is not None else "never"
        log(f"summary: installer {installer_time:.2f}s, READY=1 {ready}, {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    finally:
        finish(procs, work, args.keep or not ok)


if __name__ == "__main__":
    sys.exit(main())
