#!/usr/bin/env python3
"""The by-hand side of bench/vm.sh: replays, without vm-manager, the exact processes vm-manager
started for one VM, and times them the same way.

  replay     The installer boot, then the first installed boot, of one VM whose command lines
             bench/vm.sh copied from /proc/<pid>/cmdline (NUL-separated files) while vm-manager
             ran it: swtpm, vhost-device-vsock and QEMU, per phase. Every path under the VM's
             directory is moved into a scratch directory and the disk becomes a fresh sparse file
             of the same size there, so the replay starts from what vm-manager started from: an
             empty volume, a fresh copy of the OVMF variable store, an empty vTPM state. The
             installed boot then uses what the replayed installer left (volume, variables, vTPM
             state), as vm-manager's does.

             Each process gets the environment vm-manager gave it (/proc/<pid>/environ, copied
             beside the command line) and is started the way src/vm/vm-process.c starts it:
             stdin /dev/null, stdout and stderr appended to the same log file, the VM's directory
             as working directory, a session of its own, and for QEMU alone the seccomp filter
             that makes io_uring_setup fail with EPERM. The start order is the daemon's too: swtpm and
             vhost-device-vsock side by side, QEMU once swtpm's control channel answers
             CMD_GET_CAPABILITY and vhost-device-vsock's socket exists; in the installed boot the
             READY=1 listener (<dir>/vsock_<port>) is bound before QEMU starts. QMP is dialled
             every millisecond (the daemon: every 5 ms), so the replay gives the floor.

             Prints one JSON object: seconds from the helpers' start and from QEMU's exec to QMP
             answering qmp_capabilities, to the installer's exit, to READY=1, and from
             system_powerdown to QEMU's exit; and the CPU time QEMU had used when READY=1 came.

             --qmp-only: the installer's start alone, up to QMP answering; QEMU is then killed.
             --paused adds -S, as libvirt starts QEMU: the vCPUs wait for "cont", so nothing
             competes with the monitor while it answers.

  follow     vm-manager's side of a round: copies the command lines and environments of a
             VM's swtpm, vhost-device-vsock and QEMU, per phase, as vm.json names them; waits
             for the REST API to report the VM ready; prints QEMU's CPU time then.

  qmp-floor  QEMU started with the light argv of the peer baselines of DESIGN.md §4 (q35, OVMF,
             256 MiB, 1 vCPU, no devices) RUNS times: exec to greeting and exec to qmp_capabilities
             answered, as one JSON object of lists (milliseconds).

usage: bench/vm-replay.py replay --argv-dir DIR --old-dir VMDIR --old-volume FILE --work DIR
                                [--old-state DIR] [--volume-bytes N] [--qmp-only [--paused]]
       bench/vm-replay.py follow --vm-json FILE --argv-dir DIR (--url URL | --install-only)
       bench/vm-replay.py qmp-floor --work DIR [--runs N]
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"
PROBE_INTERVAL = 0.005  # the daemon's VM_PROBE_INTERVAL
QMP_INTERVAL = 0.001


def now():
    return time.monotonic()


# ---- the io_uring filter of src/vm/vm-process.c, as a classic BPF program ----


class SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


_libc = ctypes.CDLL(None, use_errno=True)
_NR_IO_URING_SETUP = 425
_filter = (SockFilter * 4)(
    SockFilter(0x20, 0, 0, 0),  # BPF_LD|BPF_W|BPF_ABS, offsetof(seccomp_data, nr)
    SockFilter(0x15, 0, 1, _NR_IO_URING_SETUP),  # BPF_JMP|BPF_JEQ|BPF_K
    SockFilter(0x06, 0, 0, 0x00050000 | 1),  # BPF_RET|BPF_K, SECCOMP_RET_ERRNO | EPERM
    SockFilter(0x06, 0, 0, 0x7FFF0000),  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
)
_prog = SockFprog(4, _filter)


def _block_io_uring():
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        os._exit(126)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_prog), 0, 0) != 0:
        os._exit(126)


def spawn(argv, log, cwd, seccomp=False, env=None):
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOCTTY, 0o600)

    def child():
        os.setsid()
        if seccomp:
            _block_io_uring()

    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd=cwd, env=env, preexec_fn=child,
            close_fds=True,
        )
    finally:
        os.close(fd)


def stop(p, sig=signal.SIGTERM):
    if p and p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---- probes, as the daemon's on_probe ----


def swtpm_answers(ctrl):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(ctrl)
        s.sendall(b"\0\0\0\1")  # CMD_GET_CAPABILITY
        s.settimeout(0.2)
        return len(s.recv(8)) == 8
    except OSError:
        return False
    finally:
        s.close()


class Qmp:
    """Dials until QEMU answers; at returns the time qmp_capabilities was answered."""

    def __init__(self, path, proc, timeout=10):
        deadline = now() + timeout
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                break
            except OSError:
                s.close()
                if proc.poll() is not None:
                    raise RuntimeError(f"QEMU exited with {proc.returncode} before QMP answered")
                if now() > deadline:
                    raise RuntimeError("QMP did not answer within 10 s")
                time.sleep(QMP_INTERVAL)
        self.sock = s
        self.f = s.makefile("rwb")
        greeting = json.loads(self.f.readline())
        self.greeting_at = now()
        assert "QMP" in greeting, greeting
        self.cmd("qmp_capabilities")
        self.at = now()

    def cmd(self, name):
        self.f.write(json.dumps({"execute": name, "id": 1}).encode() + b"\n")
        self.f.flush()
        while True:
            line = self.f.readline()
            if not line:
                raise RuntimeError(f"QMP closed during {name}")
            msg = json.loads(line)
            if msg.get("id") == 1:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg.get("return")

    def close(self):
        try:
            self.f.close()
            self.sock.close()
        except OSError:
            pass


# ---- replay ----


def cpu_seconds(pid):
    """user + system CPU time of a process so far, in seconds"""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_argv(path):
    with open(path, "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def read_env(path):
    """the environment vm-manager gave the process (from /proc/<pid>/environ), or ours"""
    if not os.path.exists(path):
        return None
    return dict(a.split("=", 1) for a in read_argv(path) if "=" in a)


def arg_after(argv, flag):
    return argv[argv.index(flag) + 1]


def run_phase(phase, argvs, envs, work, port, qmp_only=False, paused=False):
    """Starts swtpm and vhost-device-vsock, then QEMU, as the daemon does; returns timings."""
    swtpm_argv, vsock_argv, qemu_argv = argvs
    swtpm_env, vsock_env, qemu_env = envs
    ctrl = arg_after(swtpm_argv, "--ctrl").split("path=", 1)[1].split(",")[0]
    vhost = arg_after(vsock_argv, "--socket")
    uds = arg_after(vsock_argv, "--uds-path")
    qmp_path = [a for a in qemu_argv if a.startswith("unix:") and a.endswith(",server=on,wait=off")][0]
    qmp_path = qmp_path[len("unix:") : -len(",server=on,wait=off")].replace(",,", ",")
    t = {}
    procs = []
    listener = None
    qmp = None
    try:
        t0 = now()
        unlink(ctrl)
        swtpm = spawn(swtpm_argv, f"{work}/tpm/swtpm.out", work, env=swtpm_env)
        procs.append(swtpm)
        unlink(vhost)
        vsockd = spawn(vsock_argv, f"{work}/vsock.log", work, env=vsock_env)
        procs.append(vsockd)
        deadline = t0 + 5
        tpm_up = False
        while True:
            time.sleep(PROBE_INTERVAL)
            tpm_up = tpm_up or swtpm_answers(ctrl)
            if tpm_up and os.path.exists(vhost):
                break
            if now() > deadline or swtpm.poll() is not None or vsockd.poll() is not None:
                raise RuntimeError(f"{phase}: swtpm or vhost-device-vsock did not come up")
        t["helpers_up"] = now() - t0
        if phase == "boot":
            path = f"{uds}_{port}"
            unlink(path)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(8)
        unlink(qmp_path)
        t1 = now()
        argv = qemu_argv + (["-S"] if paused else [])
        qemu = spawn(argv, f"{work}/qemu.log", work, seccomp=True, env=qemu_env)
        procs.insert(0, qemu)
        with open(f"/proc/{qemu.pid}/status") as f:
            seccomp = [l.split()[1] for l in f if l.startswith("Seccomp:")]
        qmp = Qmp(qmp_path, qemu)
        t["helpers_to_qmp"] = qmp.at - t0
        t["exec_to_qmp"] = qmp.at - t1
        t["exec_to_greeting"] = qmp.greeting_at - t1
        t["seccomp"] = seccomp[0] if seccomp else "?"
        if qmp_only:
            qemu.kill()
            qemu.wait()
        elif phase == "install":
            rc = qemu.wait(timeout=300)
            t_exit = now()
            if rc != 0:
                raise RuntimeError(f"installer QEMU exited with {rc}")
            t["helpers_to_exit"] = t_exit - t0
            t["exec_to_exit"] = t_exit - t1
            with open(f"{work}/console.log", "rb") as f:
                if b"install: copied" not in f.read():
                    raise RuntimeError("installer: no 'install: copied' on the console")
        else:
            # the console line printed just before READY=1 is sent: the milestone libvirt's
            # guest (no vsock) can be timed to as well
            listener.settimeout(0.02)
            deadline = now() + 300
            while True:
                if "exec_to_phase_boot" not in t:
                    with open(f"{work}/console.log", "rb") as f:
                        if b"test-init: phase: boot" in f.read():
                            t["exec_to_phase_boot"] = now() - t1
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    if now() > deadline or qemu.poll() is not None:
                        raise RuntimeError("installed boot: no READY=1")
                    continue
                conn.settimeout(5)
                data = conn.recv(4096)  # the daemon, too, takes the first read as the message
                t_msg = now()
                conn.close()
                if b"READY=1" in data.split(b"\n"):
                    break
            # printed a moment before READY=1 is sent: seen now if the 20 ms looks missed it
            t.setdefault("exec_to_phase_boot", t_msg - t1)
            t["helpers_to_ready"] = t_msg - t0
            t["exec_to_ready"] = t_msg - t1
            t["cpu_at_ready"] = cpu_seconds(qemu.pid)
            t_pd = now()
            qmp.cmd("system_powerdown")
            qemu.wait(timeout=60)
            t["powerdown_to_exit"] = now() - t_pd
        return t
    finally:
        if qmp:
            qmp.close()
        if listener:
            listener.close()
        for p in procs:
            stop(p)


def replay(args):
    old_dir = os.path.abspath(args.old_dir)
    old_volume = os.path.abspath(args.old_volume)
    work = os.path.abspath(args.work)
    os.makedirs(f"{work}/tpm", mode=0o700, exist_ok=True)
    os.chmod(work, 0o700)
    volume = f"{work}/volume"

    def rewrite(argv):
        out = [a.replace(old_volume, volume).replace(old_dir, work) for a in argv]
        for a in out:
            if old_dir in a or old_volume in a or (args.old_state and args.old_state in a):
                raise RuntimeError(f"left pointing into vm-manager's state: {a}")
        return out

    phases, envs = {}, {}
    for phase in ("install",) if args.qmp_only else ("install", "boot"):
        roles = ("swtpm", "vsock", "qemu")
        phases[phase] = [rewrite(read_argv(f"{args.argv_dir}/{phase}.{role}")) for role in roles]
        envs[phase] = [read_env(f"{args.argv_dir}/{phase}.{role}.env") for role in roles]
    port = None
    for a in phases["install"][2]:
        if "vmm.notify_socket=vsock-stream:" in a:
            port = int(a.rsplit(":", 1)[1])
    if port is None:
        raise RuntimeError("no vmm.notify_socket credential in the argv")

    # what vm-manager starts from: a sparse volume of the same size, a fresh variable store
    with open(volume, "wb") as f:
        f.truncate(args.volume_bytes or os.path.getsize(old_volume))
    shutil.copyfile(OVMF_VARS, f"{work}/ovmf_vars.fd")
    os.chmod(f"{work}/ovmf_vars.fd", 0o600)

    if args.qmp_only:
        t = run_phase(
            "install", phases["install"], envs["install"], work, port, qmp_only=True, paused=args.paused
        )
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in t.items()}))
        return

    out = {}
    for phase in ("install", "boot"):
        for k, v in run_phase(phase, phases[phase], envs[phase], work, port).items():
            out[f"{phase}_{k}"] = round(v, 4) if isinstance(v, float) else v
        if phase == "install":
            os.rename(f"{work}/tpm/swtpm.log", f"{work}/tpm/swtpm.prev.log")
    print(json.dumps(out))


# ---- follow: vm-manager's side, watched from one quiet process ----


def follow(args):
    """Copies the command lines and environments of a VM's processes per phase as vm.json names
    them, then waits for the API to say ready and reads QEMU's CPU time. One process that sleeps
    between looks: a poll loop of short-lived programs would take CPU from the guest it times."""
    roles = ("qemu", "swtpm", "vsock")

    def record():
        try:
            with open(args.vm_json) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def capture(phase, not_pid):
        deadline = now() + 300
        while now() < deadline:
            v = record()
            procs = v.get("processes", {})
            pid = procs.get("qemu", {}).get("pid")
            if pid and pid != not_pid and v.get("phase") == phase and all(r in procs for r in roles):
                for r in roles:
                    src = f"/proc/{procs[r]['pid']}"
                    for what, suffix in (("cmdline", ""), ("environ", ".env")):
                        with open(f"{src}/{what}", "rb") as f:
                            data = f.read()
                        with open(f"{args.argv_dir}/{phase}.{r}{suffix}", "wb") as f:
                            f.write(data)
                return pid, {r: procs[r]["pid"] for r in roles}
            time.sleep(0.02)
        raise RuntimeError(f"no {phase} QEMU in {args.vm_json}")

    os.makedirs(args.argv_dir, exist_ok=True)
    out = {}
    q1, pids = capture("install", None)
    out["install_pids"] = pids
    if not args.install_only:
        q2, out["boot_pids"] = capture("boot", q1)
        deadline = now() + 600
        while True:
            with urllib.request.urlopen(args.url) as r:
                state = json.load(r)["state"]
            if state in ("ready", "failed") or now() > deadline:
                break
            time.sleep(0.1)
        out["state"] = state
        out["cpu_at_ready"] = cpu_seconds(q2)
    print(json.dumps(out))


# ---- the light QEMU of peer-baselines.md ----


def qmp_floor(args):
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    greeting, answered = [], []
    for i in range(args.runs):
        shutil.copyfile(OVMF_VARS, f"{work}/vars.fd")
        sock = f"{work}/qmp.sock"
        unlink(sock)
        argv = [
            "qemu-system-x86_64", "-machine", "q35,accel=tcg", "-m", "256", "-smp", "1",
            "-nodefaults", "-display", "none",
            "-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
            "-drive", f"if=pflash,format=raw,unit=1,file={work}/vars.fd",
            "-serial", f"file:{work}/serial.log", "-qmp", f"unix:{sock},server=on,wait=off",
        ]  # fmt: skip
        t1 = now()
        p = spawn(argv, f"{work}/qemu.log", work)
        try:
            q = Qmp(sock, p)
            greeting.append(round((q.greeting_at - t1) * 1000, 1))
            answered.append(round((q.at - t1) * 1000, 1))
            try:
                q.cmd("quit")
            except RuntimeError:
                pass
            q.close()
            p.wait(timeout=10)
        finally:
            stop(p, signal.SIGKILL)
    print(json.dumps({"exec_to_greeting_ms": greeting, "exec_to_qmp_ms": answered}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("replay")
    r.add_argument("--argv-dir", required=True)
    r.add_argument("--old-dir", required=True)
    r.add_argument("--old-volume", required=True)
    r.add_argument("--old-state")
    r.add_argument("--work", required=True)
    r.add_argument("--qmp-only", action="store_true")
    r.add_argument("--paused", action="store_true", help="with --qmp-only: -S (the vCPUs wait for cont)")
    r.add_argument("--volume-bytes", type=int, help="size of the fresh volume (default: the old one's)")
    w = sub.add_parser("follow")
    w.add_argument("--vm-json", required=True)
    w.add_argument("--argv-dir", required=True)
    w.add_argument("--url", help="the VM's URL in the REST API (not needed with --install-only)")
    w.add_argument("--install-only", action="store_true")
    f = sub.add_parser("qmp-floor")
    f.add_argument("--work", required=True)
    f.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    {"replay": replay, "follow": follow, "qmp-floor": qmp_floor}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
