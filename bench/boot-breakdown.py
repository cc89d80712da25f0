#!/usr/bin/env python3
"""Where the installed boot of the guest image spends its time under TCG, phase by phase.

Installs the image once (images/smoke-boot.py --install-only), keeps the installed disk, the vTPM
state and the OVMF variables as a snapshot, then boots a fresh copy of that snapshot RUNS times, so
that every run is a genuine first installed boot (Ignition's first boot included). Each run:

- times on the host, in seconds since QEMU started: the firmware's first console line, the kernel's
  start (host arrival time of each printk line minus its printk timestamp, the smallest such
  difference), "Run /init", the switch to the real root and READY=1 over the vsock notify socket;
- then, through systemd's debug shell on a second serial port (systemd.debug_shell=ttyS1, passed
  like the rest through the stub's SMBIOS string, so PCR 11 is not touched): `systemd-analyze`,
  `blame`, `critical-chain`, `systemctl is-system-running`, `systemctl --failed`, the journal of each
  failed unit, the initrd's units from PID 1's journal, and the SVG of `systemd-analyze plot`.

Writes a block into the Markdown file given with --md (between <!-- boot-breakdown:LABEL --> markers,
replaced on each run) and the SVG of the median run to --svg.

usage: bench/boot-breakdown.py IMAGE_DIR --label before|after [--runs N] [--md docs/benchmarks.md]
                                [--svg docs/img/boot-LABEL.svg] [--work DIR] [--keep] [--probe CMD]...
                                [--cmdline-extra ARGS] [--cpu MODEL]
"""
import argparse
import base64
import gzip
import importlib.util
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bt = load("boot_test", os.path.join(REPO, "tests", "image", "boot-test.py"))
smoke = load("smoke_boot", os.path.join(REPO, "images", "smoke-boot.py"))
log = bt.log

PRINTK = re.compile(r"^\s*(?:\S*?)\[\s*(\d+\.\d+)\]")
# PID 1's own journal lines in short-monotonic form: "[   12.335157] host systemd[1]: Starting x.service - ..."
JOURNAL = re.compile(r"^\[\s*(\d+\.\d+)\]\s+\S+\s+systemd\[1\]: (Starting|Finished|Started|Mounted|Mounting) "
                     r"(\S+?)(?: - .*)?\.*$")


class Shell:
    """systemd's debug shell on the guest's ttyS1, reached through QEMU's unix socket chardev."""

    def __init__(self, path, timeout=30):
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
                time.sleep(0.1)
        self.n = 0
        # In the shell itself, not in run()'s subshell, so that it holds for the later commands.
        self.sock.sendall(b"stty -echo; export SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 COLUMNS=200 TERM=dumb\n")
        self.run("true", 60)

    def run(self, cmd, timeout=120):
        """Runs one shell command; returns its output (stdout and stderr) as text."""
        self.n += 1
        tag = f"BB{self.n}X"
        log(f"  guest$ {cmd}")
        # The markers are written split, so that the echo of the command line (before stty -echo
        # takes hold) never looks like them.
        line = f"echo '@@{tag}''BEGIN@@'; ( {cmd} ) 2>&1; echo '@@{tag}''END@@'\n"
        self.sock.sendall(line.encode())
        buf = b""
        begin, end = f"@@{tag}BEGIN@@".encode(), f"@@{tag}END@@".encode()
        deadline = time.monotonic() + timeout
        self.sock.settimeout(1)
        while end not in buf or begin not in buf:
            if time.monotonic() > deadline:
                raise TimeoutError(f"debug shell: no answer to {cmd!r} within {timeout}s")
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                raise EOFError("debug shell closed")
            buf += data
        out = buf[buf.index(begin) + len(begin):buf.rindex(end)]
        return out.decode(errors="replace").replace("\r", "").strip("\n")


def read_notify(conn):
    """One sd_notify message, taken as vm-manager takes it (src/core/vm-notify.c): the first read,
    then close at once. PID 1 waits for the close after each message (a unit's state, a target
    reached), so a reader that waits for more data, as the smoke boot does for 50 ms, would add its
    wait to the boot once per message."""
    conn.settimeout(5)
    try:
        data = conn.recv(65536)
    except socket.timeout:
        data = b""
    conn.close()
    text = data.decode(errors="replace")
    return dict(l.split("=", 1) for l in text.split("\n") if "=" in l)


def seconds(text):
    """'1min 2.345s' / '845ms' / '12.5s' -> seconds."""
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)(min|ms|us|µs|s|h)", text):
        total += float(num) * {"h": 3600, "min": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}[unit]
    return total


def parse_analyze(text):
    """systemd-analyze's 'Startup finished in ...' line -> {phase: seconds}."""
    phases = {}
    for val, name in re.findall(r"([\d.minsµu ]+?) \((firmware|loader|kernel|initrd|userspace)\)", text):
        phases[name] = seconds(val)
    return phases


def initrd_units(journal):
    """Start-to-finish durations of the initrd's units, from PID 1's journal before 'Switching root'."""
    started, took = {}, {}
    for line in journal.splitlines():
        if "Switching root" in line:
            break
        m = JOURNAL.match(line)
        if not m:
            continue
        t, verb, unit = float(m.group(1)), m.group(2), m.group(3)
        if verb in ("Starting", "Mounting"):
            started.setdefault(unit, t)
        elif unit in started and unit not in took:
            took[unit] = t - started[unit]
    return sorted(took.items(), key=lambda kv: -kv[1])


def qemu_cpu_seconds(pid):
    """The CPU time QEMU has used (user and system, all its threads): the emulated guest's work, which
    the wall clock shows only through the noise of a shared host."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def boot_once(args, snap, run_dir, efi):
    """One installed boot from a copy of the snapshot; returns the run's measurements."""
    os.makedirs(run_dir, exist_ok=True)
    for f in ("target.raw", "ovmf_vars.fd"):
        subprocess.run(["cp", "--sparse=always", "--reflink=auto", f"{snap}/{f}", f"{run_dir}/{f}"], check=True)
    shutil.rmtree(f"{run_dir}/tpm", ignore_errors=True)
    shutil.copytree(f"{snap}/tpm", f"{run_dir}/tpm")
    procs = []
    res = {"load": open("/proc/loadavg").read().split()[0]}
    try:
        listener = bt.notify_listener(run_dir, args.port)
        vhu = bt.start_vhost_vsock(run_dir, args.cid)
        if vhu is None:
            raise RuntimeError("vhost-device-vsock did not create its socket")
        procs.append(vhu)
        procs.append(bt.start_swtpm(run_dir))
        dbg = f"{run_dir}/debug.sock"
        extra = " ".join(["systemd.debug_shell=ttyS1"] + ([args.cmdline_extra] if args.cmdline_extra else []))
        sargs = argparse.Namespace(port=args.port, cmdline_extra=extra, debug_shell=dbg)
        head = bt.common_head(run_dir, None, args.memory, ",memory-backend=mem")
        if args.cpu:
            head[head.index("-cpu") + 1] = args.cpu
        argv = head + [
            "-object", f"memory-backend-memfd,id=mem,size={args.memory}M,share=on",
            "-drive", f"if=none,id=target,format=raw,file={run_dir}/target.raw,discard=unmap",
            "-device", "virtio-blk-pci,drive=target,serial=target,bootindex=0",
            "-chardev", f"socket,id=vhu,path={run_dir}/vhu.sock",
            "-device", "vhost-user-vsock-pci,chardev=vhu",
        ] + bt.tpm_args(run_dir) + smoke.smbios(sargs, install=False) + smoke.debug_shell(sargs)
        q = bt.Qemu(argv, f"{run_dir}/console.log")
        # The console and the notify socket are served all along, also while the debug shell works:
        # a full pipe would stall the guest's serial port, and PID 1 waits for the host to take each
        # of its messages (it goes on sending them after READY=1), so an unserved socket hangs it.
        stop = threading.Event()
        ready_box = []

        def notify():
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    time.sleep(0.02)
                    continue
                if read_notify(conn).get("READY") == "1" and not ready_box:
                    ready_box.append(q.t())
                    res["cpu_at_ready"] = qemu_cpu_seconds(q.proc.pid)

        threads = [threading.Thread(target=lambda: [q.pump(0.1) for _ in iter(stop.is_set, True)], daemon=True),
                   threading.Thread(target=notify, daemon=True)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + args.timeout
        while not ready_box and time.monotonic() < deadline and q.proc.poll() is None:
            time.sleep(0.05)
        ready = ready_box[0] if ready_box else None
        if ready is None:
            stop.set()
            for t in threads:
                t.join()
            q.kill()
            raise RuntimeError(f"no READY=1 within {args.timeout}s (console: {run_dir}/console.log)")
        res["ready"] = ready
        lines = list(q.lines)
        res["firmware_first_line"] = lines[0][0] if lines else None
        kstart = [t - float(m.group(1)) for t, text in lines if (m := PRINTK.match(text))]
        res["kernel_start"] = min(kstart) if kstart else None
        for t, text in lines:
            if "Run /init as init process" in text and "init" not in res:
                res["init"] = t
            if "running in system mode" in text:
                res["switch_root"] = t  # the last one: the real root's PID 1
        sh = Shell(dbg)
        out = {}
        out["analyze"] = sh.run("systemd-analyze time")
        out["blame"] = sh.run("systemd-analyze blame --no-pager | grep -v '\\.device$' | head -n 25")
        out["chain"] = sh.run("systemd-analyze critical-chain --no-pager")
        out["running"] = sh.run("systemctl is-system-running")
        out["failed"] = sh.run("systemctl --failed --no-legend --plain --no-pager")
        failed_units = [l.split()[0] for l in out["failed"].splitlines() if l.strip()]
        out["failed_logs"] = {u: sh.run(f"journalctl -b --no-pager -o cat -u {u} | tail -n 15") for u in failed_units}
        out["journal"] = sh.run("journalctl -b --no-pager -o short-monotonic _PID=1", 300)
        svg = sh.run("systemd-analyze plot | gzip -9 | base64 -w0", 300)
        res["svg"] = gzip.decompress(base64.b64decode(svg.strip())).decode()
        res["probes"] = {cmd: sh.run(cmd, 300) for cmd in args.probe}
        for cmd, text in res["probes"].items():
            log(f"  probe {cmd!r}:\n" + "\n".join("    " + l for l in text.splitlines()))
        res.update(out)
        res["phases"] = parse_analyze(out["analyze"])
        res["initrd_units"] = initrd_units(out["journal"])
        try:
            bt.Qmp(f"{run_dir}/qmp.sock").cmd("quit")
        except (OSError, RuntimeError):
            pass
        stop.set()
        for t in threads:
            t.join()
        q.kill()
    finally:
        bt.finish(procs, run_dir, True)
    return res


def fmt(v):
    return "–" if v is None else f"{v:.1f}"


def median(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def render(args, runs, uki_size, med):
    lines = [f"<!-- boot-breakdown:{args.label} -->",
             f"#### {args.label}: `{os.path.basename(args.image_dir.rstrip('/'))}` image, UKI {uki_size / 1e6:.1f} MB, "
             f"{len(runs)} run(s), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"host load (1 min) at the runs' starts: {', '.join(r['load'] for r in runs)}"
             + (f", `-cpu {args.cpu}`" if getattr(args, "cpu", "") else "")
             + (f", kernel command line plus `{args.cmdline_extra}`" if getattr(args, "cmdline_extra", "") else ""),
             "",
             "Seconds since QEMU started, measured on the host (median over the runs; each run in brackets):",
             "",
             "| milestone | s |",
             "|---|---|"]

    def row(name, key):
        each = ", ".join(fmt(r.get(key)) for r in runs)
        lines.append(f"| {name} | {fmt(median(runs, key))} ({each}) |")
    row("firmware's first console line", "firmware_first_line")
    row("kernel starts (OVMF, systemd-boot, stub measuring the UKI, decompression)", "kernel_start")
    row("initrd's /init runs", "init")
    row("switch to the real root", "switch_root")
    row("**READY=1** on the host (vsock)", "ready")
    row("QEMU's CPU time at READY=1 (all threads; the guest's work, less noisy than the clock)", "cpu_at_ready")
    lines += ["", "`systemd-analyze` in the guest (median; it reports no firmware and loader times here, "
              "the host's milestones above cover them):", "", "| phase | s |", "|---|---|"]
    for ph in ("kernel", "initrd", "userspace"):
        vals = [r["phases"].get(ph) for r in runs if r["phases"].get(ph) is not None]
        lines.append(f"| {ph} | {fmt(statistics.median(vals)) if vals else '–'} |")
    lines += ["", f"Slowest units of the initrd (run {med + 1}, start to finish, s):", "", "| unit | s |", "|---|---|"]
    for unit, took in runs[med]["initrd_units"][:12]:
        lines.append(f"| `{unit}` | {took:.1f} |")
    lines += ["", f"Slowest units after the switch (run {med + 1}, `systemd-analyze blame`):", "", "```"]
    lines += runs[med]["blame"].splitlines()[:15]
    lines += ["```", "", f"Critical chain (run {med + 1}):", "", "```"]
    lines += runs[med]["chain"].splitlines()
    lines += ["```", ""]
    states = ", ".join(r["running"] or "?" for r in runs)
    lines.append(f"`systemctl is-system-running` after READY=1: {states}.")
    failed = sorted({l.split()[0] for r in runs for l in r["failed"].splitlines() if l.strip()})
    lines.append(f"Failed units: {', '.join('`' + u + '`' for u in failed) if failed else 'none'}.")
    if args.svg:
        rel = os.path.relpath(args.svg, os.path.dirname(os.path.abspath(args.md)) if args.md else ".")
        lines += ["", f"![systemd-analyze plot, {args.label}]({rel})"]
    lines.append(f"<!-- /boot-breakdown:{args.label} -->")
    return "\n".join(lines)


def write_md(path, label, block):
    text = open(path).read() if os.path.exists(path) else ""
    start, end = f"<!-- boot-breakdown:{label} -->", f"<!-- /boot-breakdown:{label} -->"
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("image_dir")
    ap.add_argument("--label", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--md")
    ap.add_argument("--svg")
    ap.add_argument("--work")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--port", type=int, default=8888)
    ap.add_argument("--cid", type=int, default=3)
    ap.add_argument("--memory", type=int, default=1024)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--cmdline-extra", default="",
                    help="more kernel command line (through the stub's SMBIOS string), e.g. systemd.mask=UNIT "
                         "to try a unit's absence without building an image")
    ap.add_argument("--probe", action="append", default=[],
                    help="a shell command to run in the guest after the standard ones (repeatable); "
                         "its output goes to the log and to result.json")
    ap.add_argument("--cpu", default="", help="QEMU's -cpu instead of max")
    ap.add_argument("--from-json", action="store_true",
                    help="boot nothing: render the runs kept in --work (run*/result.json) again")
    args = ap.parse_args()
    missing = bt.missing_tools()
    if missing:
        raise SystemExit("boot-breakdown: missing " + ", ".join(missing))
    efi, _ = smoke.find_image(args.image_dir)
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="vm-bootbd-", dir="/var/tmp"))
    snap = f"{work}/installed"
    if args.from_json:
        args.keep = True
    runs = []
    try:
        if args.from_json:
            for i in range(1, 100):
                path = f"{work}/run{i}/result.json"
                if os.path.exists(path):
                    with open(path) as f:
                        runs.append(json.load(f))
            if not runs:
                raise SystemExit(f"boot-breakdown: no run*/result.json in {work}")
        if not args.from_json and not os.path.exists(f"{snap}/target.raw"):
            log(f"installing {args.image_dir} once (images/smoke-boot.py --install-only)")
            subprocess.run([os.path.join(REPO, "images", "smoke-boot.py"), args.image_dir, "--install-only",
                            "--keep", "--work", snap, "--port", str(args.port), "--cid", str(args.cid)],
                           check=True, stdout=subprocess.DEVNULL)
        for i in range(0 if args.from_json else args.runs):
            log(f"run {i + 1}/{args.runs}")
            r = boot_once(args, snap, f"{work}/run{i + 1}", efi)
            log(f"  READY=1 at {r['ready']:.1f}s ({fmt(r.get('cpu_at_ready'))} s of QEMU's CPU), kernel at "
                f"{fmt(r.get('kernel_start'))}s, switch at {fmt(r.get('switch_root'))}s; {r['running']}; "
                f"failed: {r['failed'] or 'none'}")
            for u, text in r["failed_logs"].items():
                log(f"  --- {u}\n" + "\n".join("    " + l for l in text.splitlines()))
            runs.append(r)
            with open(f"{work}/run{i + 1}/result.json", "w") as f:
                json.dump(r, f, indent=1)
        order = sorted(range(len(runs)), key=lambda i: runs[i]["ready"])
        med = order[(len(order) - 1) // 2]
        block = render(args, runs, os.path.getsize(efi), med)
        print(block)
        if args.md:
            write_md(args.md, args.label, block)
        if args.svg:
            os.makedirs(os.path.dirname(os.path.abspath(args.svg)), exist_ok=True)
            with open(args.svg, "w") as f:
                f.write(runs[med]["svg"])
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work dir kept: {work}")


if __name__ == "__main__":
    sys.exit(main())
