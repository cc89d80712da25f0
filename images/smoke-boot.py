#!/usr/bin/env python3
"""Smoke boot of the guest image under TCG, with plain QEMU + OVMF + swtpm and no daemon.

1. Installer boot, as vm-manager runs it: OVMF boots the image's UKI with -kernel, the .raw is
   attached read-only as virtio disk "installer", a blank disk as "target", the installer's
   credentials as SMBIOS type 11 strings, -no-reboot. vm-sysinstall.service installs onto the
   target; QEMU must exit 0 and the target must carry a GPT afterwards.
2. Installed boot: OVMF boots the target (bootindex=0) with a vTPM and vhost-user-vsock (served by
   vhost-device-vsock). PID 1's notifications arrive over vsock; READY=1 must come.
3. PCR 11: the image logs its PCRs on the console (vm-pcrs-log.service); PCR 11 must equal
   policy.json's pcr11["enter-initrd:leave-initrd:sysinit:ready"].

Prints each milestone with seconds since QEMU started and a summary line with the times.

usage: images/smoke-boot.py IMAGE_DIR [--work DIR] [--keep] [--no-install] [--timeout S]
"""
import argparse
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "boot_test", os.path.join(HERE, "..", "tests", "image", "boot-test.py"))
bt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bt)
log = bt.log

READY_PHASE = "enter-initrd:leave-initrd:sysinit:ready"
# A boot whose guest kernel panics fails at once, with the console's panic line (no second start:
# QEMU 7.2's multi-threaded TCG panicked guests now and then, QEMU 10 did not in 30 boots).


def find_image(image_dir):
    efis = sorted(f for f in os.listdir(image_dir) if f.endswith(".efi"))
    for f in reversed(efis):
        stem = f[:-4]
        if os.path.exists(os.path.join(image_dir, stem + ".raw")):
            return os.path.join(image_dir, stem + ".efi"), os.path.join(image_dir, stem + ".raw")
    raise SystemExit(f"no <id>_<version>.efi with its .raw in {image_dir}")


def read_notify(conn):
    """The fields of one sd_notify message (tests/image/boot-test.py reads it)."""
    data = bt.read_notify(conn)
    return dict(l.split("=", 1) for l in data.decode(errors="replace").split("\n") if "=" in l)


def debug_shell(args):
    """A second serial port (ttyS1) on a unix socket, for systemd.debug_shell=ttyS1."""
    if not args.debug_shell:
        return []
    if os.path.exists(args.debug_shell):
        os.unlink(args.debug_shell)
    return ["-chardev", f"socket,id=dbg,path={args.debug_shell},server=on,wait=off",
            "-device", "isa-serial,chardev=dbg"]


def smbios(args, install):
    """vm-manager's credentials (tests/image/boot-test.py), with --cmdline-extra folded into the
    stub's kernel-cmdline-extra string."""
    argv = bt.smbios_args(args.port, install)
    extra = [("ignition.firstboot" if not install else ""), args.cmdline_extra]
    extra = " ".join(e for e in extra if e)
    argv = [a for a in argv if "kernel-cmdline-extra" not in a]
    if len(argv) and argv[-1] == "-smbios":
        argv.pop()
    if extra:
        argv += ["-smbios", "type=11,value=io.systemd.stub.kernel-cmdline-extra=" + extra.replace(",", ",,")]
    return argv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("image_dir")
    ap.add_argument("--work")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-install", action="store_true",
                    help="skip the installer: boot a copy of the .raw as the installed disk")
    ap.add_argument("--reuse-target", action="store_true",
                    help="skip the installer: boot the target a previous run left in --work")
    ap.add_argument("--install-only", action="store_true", help="stop after the installer boot")
    ap.add_argument("--port", type=int, default=8888)
    ap.add_argument("--cid", type=int, default=3)
    ap.add_argument("--memory", type=int, default=1024)
    ap.add_argument("--target-mib", type=int, default=4096)
    ap.add_argument("--timeout", type=int, default=600, help="per boot, seconds")
    ap.add_argument("--debug-shell", metavar="SOCKET",
                    help="a second serial port on this unix socket with systemd's debug shell on it")
    ap.add_argument("--cmdline-extra", default="",
                    help="added to the kernel command line of both boots (the stub's SMBIOS string)")
    args = ap.parse_args()
    missing = bt.missing_tools()
    if missing:
        raise SystemExit("smoke-boot: missing %s; install with tools/install-deps.sh build image" % ", ".join(missing))

    efi, raw = find_image(args.image_dir)
    policy = {}
    pol_path = os.path.join(args.image_dir, "policy.json")
    if os.path.exists(pol_path):
        with open(pol_path) as f:
            policy = json.load(f)
    want_pcr11 = policy.get("pcr11", {}).get(READY_PHASE)

    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="vm-smoke-", dir="/var/tmp"))
    os.makedirs(work, exist_ok=True)
    ok = True
    procs = []
    times = {}
    try:
        shutil.copyfile(bt.OVMF_VARS, f"{work}/ovmf_vars.fd")
        target = f"{work}/target.raw"
        if args.reuse_target:
            if not os.path.exists(target):
                raise SystemExit(f"--reuse-target: no {target}")
        elif args.no_install:
            subprocess.run(["cp", "--sparse=always", raw, target], check=True)
            with open(target, "r+b") as f:
                f.truncate(max(os.path.getsize(raw), args.target_mib << 20))
        else:
            with open(target, "wb") as f:
                f.truncate(args.target_mib << 20)
            shutil.copyfile(bt.OVMF_VARS, f"{work}/ovmf_vars.fd")
            swtpm = bt.start_swtpm(work)
            procs.append(swtpm)
            argv = bt.common_head(work, None, args.memory) + [
                "-kernel", efi,
                "-drive", f"if=none,id=installer,format=raw,file={raw},readonly=on",
                "-device", "virtio-blk-pci,drive=installer,serial=installer",
                "-drive", f"if=none,id=target,format=raw,file={target},discard=unmap",
                "-device", "virtio-blk-pci,drive=target,serial=target",
            ] + bt.tpm_args(work) + smbios(args, install=True) + ["-no-reboot"] + debug_shell(args)
            bt.print_argv("installer boot", argv)
            q = bt.Qemu(argv, f"{work}/console-install.log")
            rc, t_exit = q.wait_exit(args.timeout)
            q.kill()
            if rc is None:
                if q.panicked is not None:
                    log(f"FAIL installer boot: the guest kernel panicked at {q.panicked:.2f}s")
                else:
                    log(f"FAIL installer boot did not end within {args.timeout}s")
                ok = False
                return 1
            log(f"installer boot: QEMU exited with {rc} at {t_exit:.2f}s")
            with open(target, "rb") as f:
                f.seek(512)
                gpt = f.read(8) == b"EFI PART"
            if rc != 0 or not gpt:
                log(f"FAIL installer boot: exit {rc}, GPT on the target: {gpt}")
                ok = False
                return 1
            times["install"] = t_exit
            swtpm.wait(timeout=10)
            if args.install_only:
                log(f"summary: install {t_exit:.1f}s, PASS")
                return 0

        listener = bt.notify_listener(work, args.port)
        vhu = bt.start_vhost_vsock(work, args.cid)
        if vhu is None:
            log("FAIL vhost-device-vsock did not create its socket")
            ok = False
            return 1
        procs.append(vhu)
        swtpm = bt.start_swtpm(work)
        procs.append(swtpm)
        argv = bt.common_head(work, None, args.memory, ",memory-backend=mem") + [
            "-object", f"memory-backend-memfd,id=mem,size={args.memory}M,share=on",
            "-drive", f"if=none,id=target,format=raw,file={target},discard=unmap",
            "-device", "virtio-blk-pci,drive=target,serial=target,bootindex=0",
            "-chardev", f"socket,id=vhu,path={work}/vhu.sock",
            "-device", "vhost-user-vsock-pci,chardev=vhu",
        ] + bt.tpm_args(work) + smbios(args, install=False)
        argv += debug_shell(args)
        bt.print_argv("installed boot", argv)
        q = bt.Qemu(argv, f"{work}/console-boot.log")
        qmp = bt.Qmp(f"{work}/qmp.sock")
        pcrs = {}
        ready_at = None
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and q.proc.poll() is None and q.panicked is None:
            for t, text in q.pump(0.02):
                log(f"  [{t:7.2f}] {text}")
                m = re.search(r"vm-pcrs: +(\d+): ([0-9a-f]{64})", text)
                if m:
                    pcrs[int(m.group(1))] = m.group(2)
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                if ready_at is not None and 11 in pcrs:
                    break
                if ready_at is not None and q.t() - ready_at > 60:
                    break
                continue
            fields = read_notify(conn)
            log(f"notify at {q.t():.2f}s: {fields}")
            if fields.get("READY") == "1" and ready_at is None:
                ready_at = q.t()
        if q.panicked is not None:
            q.kill()
        if ready_at is None:
            log("FAIL no READY=1 from the installed boot" +
                (f" (the guest kernel panicked at {q.panicked:.2f}s)" if q.panicked is not None else ""))
            ok = False
        else:
            times["ready"] = ready_at
            log(f"installed boot: READY=1 at {ready_at:.2f}s")
        if 11 not in pcrs:
            log("FAIL the guest did not log PCR 11 (vm-pcrs-log.service)")
            ok = False
        elif want_pcr11 is None:
            log(f"FAIL no pcr11[{READY_PHASE}] in {pol_path}")
            ok = False
        elif pcrs[11] != want_pcr11.lower():
            log(f"FAIL PCR 11 is {pcrs[11]}, policy.json says {want_pcr11}")
            ok = False
        else:
            log(f"PCR 11 matches policy.json ({pcrs[11][:16]}…)")
        if q.proc.poll() is None:
            t_pd = q.t()
            try:
                qmp.cmd("system_powerdown")
            except (OSError, RuntimeError):
                pass
            # PID 1 keeps notifying while it shuts down (STOPPING=1, units going inactive), and
            # waits for each message to be taken: keep serving the notify socket until QEMU exits.
            rc, t_exit = None, q.t()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                for t, text in q.pump(0.02):
                    log(f"  [{t:7.2f}] {text}")
                rc = q.proc.poll()
                if rc is not None:
                    t_exit = q.t()
                    break
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                fields = read_notify(conn)
                log(f"notify at {q.t():.2f}s: {fields}")
            if rc is None:
                log("FAIL the VM did not power off within 120 s of system_powerdown")
                ok = False
            else:
                times["poweroff"] = t_exit - t_pd
                log(f"power-off: QEMU exited with {rc} {t_exit - t_pd:.2f}s after system_powerdown")
        q.kill()
        log("summary: " + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()) +
            (", PASS" if ok else ", FAIL"))
        return 0 if ok else 1
    finally:
        bt.finish(procs, work, args.keep or not ok)


if __name__ == "__main__":
    sys.exit(main())
