#!/usr/bin/env python3
"""How many idle VMs of the real guest image one host holds: creates N VMs with the defaults of
create_vm (2 vCPUs, 2048 MiB, attested), waits until each is ready and then SETTLE seconds more, and
samples every VM for WINDOW seconds:

  host PSS     of the VM's processes (QEMU, swtpm, vhost-device-vsock), from /proc/<pid>/smaps_rollup
  guest        MemTotal - MemFree of the guest's /proc/meminfo, and its RAM size - MemFree (exec_vm,
               after the window; see guest_mib())
  CPU          of the VM's processes over the window, from /proc/<pid>/stat, in % of one core

and prints one markdown table per configuration, then what fits: this host's memory (MemTotal)
divided by the mean host PSS, two cores divided by the mean idle CPU. The configurations run one
after the other, each on its own daemon and state directory:

  vm-manager      the daemon's defaults
  tb-1g           --tcg-tb-size-mib 0: QEMU's own translation cache of 1 GiB, as libvirt leaves it
  tb-128, tb-64   --tcg-tb-size-mib 128 and 64: a half and a quarter of the default cache
  report-60s      --guest-report-interval 60s: the report period before issue 38's measurement
  before          both: QEMU's cache size and the minute report (the guest image is the same, with
                  its boot cache dropped; free page reporting stays on)
  libvirt         the same daemon and guest, each VM's QEMU a libvirt domain with libvirt's defaults
                  (bench/libvirt-qemu/qemu-system-x86_64 says what they are): Debian's libvirtd,
                  started here by hand when none runs (in a mount namespace of its own that gives
                  it a qemu.conf running QEMU as root), and stopped again at the end; its own PSS
                  and CPU (libvirtd, virtlogd) are reported beside the VMs'

N "max" creates VMs until the host's MemAvailable, less RESERVE MiB (default 2048), no longer holds
one more VM as large as the most host memory one VM took so far (MemAvailable before and after its
create; at most CAP VMs, default 64), and then also prints how create -> ready and the host's
memory went with the count.

usage: bench/density.py VM_MANAGER IMAGE_DIR [N|max]     (N default 4)
environment: CONFIGS (comma-separated, default vm-manager,before), SETTLE (s, default 60), WINDOW (s,
default 120), EXTRA (more serve flags for every configuration, space-separated), RESERVE, CAP,
BUSY (a shell command run three times in the first VM after the window, each run timed: what a busy
guest costs with the configuration's translation cache)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests/integration"))
from vmmtest import api, serve_ready  # noqa: E402

CONFIGS = {
    "vm-manager": [],
    "tb-1g": ["--tcg-tb-size-mib", "0"],
    "tb-128": ["--tcg-tb-size-mib", "128"],
    "tb-64": ["--tcg-tb-size-mib", "64"],
    "report-60s": ["--guest-report-interval", "60s"],
    "before": ["--tcg-tb-size-mib", "0", "--guest-report-interval", "60s"],
    "libvirt": [],
}
LIBVIRT_WRAPPER = os.path.join(ROOT, "bench/libvirt-qemu")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def pss_bytes(pid):
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def meminfo_mib(key):
    """A field of the host's /proc/meminfo, in MiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def mem_available_mib():
    return meminfo_mib("MemAvailable")


def room_for_one_more(growth, reserve):
    """With N "max": True while MemAvailable less reserve holds one more VM as large as the largest host
    memory one VM has taken so far (the drop of MemAvailable over its create; the first VM is always
    made)."""
    taken = [b[2] - a[2] for a, b in zip([(0, 0, 0.0)] + growth, growth)]
    return mem_available_mib() - reserve > max(taken, default=0.0)


def guest_mib(port, vid, ram_mib):
    """The guest's own use from its /proc/meminfo, in MiB, two ways: MemTotal - MemFree (used,
    buffers, page cache and slab: what `free` calls used + buff/cache), and RAM - MemFree, which also
    counts what the guest kernel took before MemTotal (its code and data, the page structs of all
    RAM, the firmware's reservations: about 85 MiB of 2 GiB here). (None, None) when exec_vm fails."""
    status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["cat", "/proc/meminfo"]})
    m = {l.split(":")[0]: int(l.split()[1]) for l in (r or {}).get("stdout", "").splitlines()
         if l.split()[1:]} if status == 200 else {}
    if "MemTotal" not in m or "MemFree" not in m:
        return None, None
    return (m["MemTotal"] - m["MemFree"]) / 1024, ram_mib - m["MemFree"] / 1024


def busy_run(name, port, vid, command, rounds=3):
    """BUSY: the guest's work of a busy moment, timed (exec_vm, wall clock) in the first VM while the
    others idle; under TCG its time grows when the code it runs no longer fits the translation cache."""
    times = []
    for _ in range(rounds):
        t0 = time.monotonic()
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["sh", "-c", command]}, timeout=900)
        if status != 200 or (r or {}).get("exitCode") != 0:
            print("<!-- %s: busy run failed (%s): %s -->" % (name, status, json.dumps(r)[:300]))
            return
        times.append(time.monotonic() - t0)
    print("<!-- %s: busy run in %s: %s s (median %.1f s) -->" % (
        name, vid[:8], ", ".join("%.1f" % t for t in times), sorted(times)[len(times) // 2]))


def pids_of(metrics, vm_dir=None):
    """The VM's processes; under the libvirt configuration, libvirt's QEMU in place of the wrapper the
    daemon started (its PID in the VM's directory)."""
    host = (metrics or {}).get("host") or {}
    pids = [p["pid"] for p in host.get("processes") or [] if p.get("pid")] or ([host["pid"]] if host.get("pid") else [])
    try:
        with open(os.path.join(vm_dir, "libvirt-qemu.pid")) as f:
            qemu = int(f.read())
        return [qemu if pid == host.get("pid") else pid for pid in pids]
    except (TypeError, OSError, ValueError):
        return pids


class Libvirt:
    """Debian's libvirtd for the libvirt configuration: the one running, or one started here (with
    virtlogd) and stopped in stop(). Its qemu.conf runs QEMU as root, through a bind mount in a mount
    namespace of its own: the wrapper's domains use the daemon's files, and libvirt's check of /dev/kvm
    as its own QEMU user would otherwise find a KVM that its QEMU probe saw usable and probe again on
    every domain start."""

    def __init__(self, work):
        self.pids, self.started = {}, []
        for cmd, pkg in (("virsh", "libvirt-clients"), ("libvirtd", "libvirt-daemon"),
                         ("virtlogd", "libvirt-daemon"), ("unshare", "util-linux")):
            if not shutil.which(cmd):
                raise SystemExit("%s is missing (package %s; tools/install-deps.sh bench)" % (cmd, pkg))
        for name in ("virtlogd", "libvirtd"):
            pidfile = "/run/%s.pid" % name
            if self._alive(pidfile):
                self.pids[name] = self._read(pidfile)
                print("<!-- libvirt: using the %s that runs (pid %d); a libvirtd whose QEMU user cannot open "
                      "/dev/kvm probes QEMU again at every start -->" % (name, self.pids[name]))
                continue
            if name == "virtlogd":
                subprocess.run(["virtlogd", "-d"], check=True)
            else:
                conf = os.path.join(work, "qemu.conf")
                with open(conf, "w") as f:
                    f.write('user = "root"\ngroup = "root"\n')
                subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                'mount --bind "$0" /etc/libvirt/qemu.conf && exec libvirtd -d', conf], check=True)
            deadline = time.monotonic() + 30
            while not self._alive(pidfile) and time.monotonic() < deadline:
                time.sleep(0.1)
            self.pids[name] = self._read(pidfile)
            self.started.append(name)
        # QEMU's capabilities probed once, before the first domain
        subprocess.run(["virsh", "-q", "-c", "qemu:///system", "domcapabilities", "--virttype", "qemu",
                        "--machine", "q35", "--emulatorbin", shutil.which("qemu-system-x86_64")],
                       check=True, stdout=subprocess.DEVNULL)

    @staticmethod
    def _read(pidfile):
        with open(pidfile) as f:
            return int(f.read().strip())

    def _alive(self, pidfile):
        try:
            os.kill(self._read(pidfile), 0)
            return True
        except (OSError, ValueError):
            return False

    def stop(self):
        for name in reversed(self.started):
            try:
                os.kill(self.pids[name], signal.SIGTERM)
            except OSError:
                pass


def serve_env(name):
    """The daemon's environment: under libvirt, the wrapper first on PATH, the real QEMU named."""
    if name != "libvirt":
        return None
    env = dict(os.environ)
    env["LIBVIRT_QEMU_REAL"] = shutil.which("qemu-system-x86_64")
    env["PATH"] = LIBVIRT_WRAPPER + ":" + env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def run_config(name, binary, images, n, settle, window, extra, work, limits):
    """n None: as many as room_for_one_more() allows, up to limits["cap"]."""
    state = os.path.join(work, name)
    lv = Libvirt(work) if name == "libvirt" else None
    p, port = serve_ready(binary, state, images, CONFIGS[name] + extra, env=serve_env(name))
    rows, made, growth, ram = [], [], [], {}
    vm_dir = lambda vid: os.path.join(state, "vms", vid)  # noqa: E731
    avail0 = mem_available_mib()
    try:
        for i in range(n if n is not None else limits["cap"]):
            if n is None and not room_for_one_more(growth, limits["reserve"]):
                print("<!-- %s: stopped before VM %d: MemAvailable %.0f MiB -->" % (name, i, mem_available_mib()))
                break
            t0 = time.monotonic()
            status, vm = api(port, "POST", "/vms", {"name": "dense-%d" % i, "wait_for": "ready"}, timeout=900)
            took = time.monotonic() - t0
            if status != 201:
                print("<!-- %s: VM %d was not created (%s): %s -->" % (name, i, status, json.dumps(vm)[:300]))
                break
            made.append(vm["id"])
            ram[vm["id"]] = vm.get("memoryMiB", 2048)
            growth.append((i + 1, took, avail0 - mem_available_mib()))
            print("<!-- %s: dense-%d ready in %.0f s, host MemAvailable %.0f MiB -->"
                  % (name, i, took, mem_available_mib()), flush=True)
        time.sleep(settle)
        before = {}
        for vid in made:
            _, m = api(port, "GET", "/vms/%s/metrics" % vid)
            before[vid] = {pid: cpu_ticks(pid) for pid in pids_of(m, vm_dir(vid))}
        services = dict(lv.pids if lv else {}, **{"vm-manager": p.pid})
        host_before = {k: cpu_ticks(pid) for k, pid in services.items()}
        t0 = time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - t0
        for vid in made:
            ticks = sum((cpu_ticks(pid) or 0) - (t or 0) for pid, t in before[vid].items() if t is not None)
            pss = sum(pss_bytes(pid) or 0 for pid in before[vid])
            rows.append({"vm": vid[:8], "cpu": 100.0 * ticks / TICKS / elapsed, "pss": pss / 2**20,
                         "guest": guest_mib(port, vid, ram[vid])})
        print("<!-- %s: host services over the window: %s -->" % (name, ", ".join(
            "%s PSS %.0f MiB, CPU %.1f %%" % (k, (pss_bytes(pid) or 0) / 2**20,
                                              100.0 * ((cpu_ticks(pid) or 0) - (host_before[k] or 0)) / TICKS / elapsed)
            for k, pid in services.items())))
        if limits.get("busy") and made:
            busy_run(name, port, made[0], limits["busy"])
    finally:
        for vid in made:
            api(port, "DELETE", "/vms/%s" % vid, timeout=300)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            p.kill()
        if lv:
            lv.stop()
    return rows, growth


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    binary, images = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    n = sys.argv[3] if len(sys.argv) > 3 else "4"
    n = None if n == "max" else int(n)
    limits = {"reserve": float(os.environ.get("RESERVE", "2048")), "cap": int(os.environ.get("CAP", "64")),
              "busy": os.environ.get("BUSY")}
    configs = [c for c in os.environ.get("CONFIGS", "vm-manager,before").split(",") if c]
    settle, window = int(os.environ.get("SETTLE", "60")), int(os.environ.get("WINDOW", "120"))
    extra = os.environ.get("EXTRA", "").split()
    mem_total = meminfo_mib("MemTotal")
    work = tempfile.mkdtemp(prefix="vmm-density-")
    summary = []
    try:
        for c in configs:
            rows, growth = run_config(c, binary, images, n, settle, window, extra, work, limits)
            print("\n%s, %d VMs, settle %d s, window %d s\n" % (c, len(rows), settle, window))
            if n is None:
                print("| VMs | create -> ready of the last (s) | host memory taken since the daemon started (MemAvailable, MiB) |")
                print("|---|---|---|")
                for k, took, used in growth:
                    print("| %d | %.0f | %.0f |" % (k, took, used))
                print()
            print("| VM | host PSS MiB | guest MemTotal - MemFree MiB | guest RAM - MemFree MiB | PSS - guest "
                  "(MemTotal, RAM) MiB | CPU % of a core |")
            print("|---|---|---|---|---|---|")
            for r in rows:
                used, held = r["guest"]
                f = lambda x: "%.0f" % x if x is not None else "-"  # noqa: E731
                print("| %s | %.0f | %s | %s | %s, %s | %.1f |" % (
                    r["vm"], r["pss"], f(used), f(held), f(used and r["pss"] - used), f(held and r["pss"] - held),
                    r["cpu"]))
            if rows:
                pss = sum(r["pss"] for r in rows) / len(rows)
                cpu = sum(r["cpu"] for r in rows) / len(rows)
                summary.append((c, len(rows), pss, cpu, mem_total / pss, 200.0 / cpu if cpu > 0 else float("inf")))
        print("\n| configuration | VMs | mean host PSS MiB | mean idle CPU %% | fit by memory (%.0f MiB) | fit by CPU (2 cores) |"
              % mem_total)
        print("|---|---|---|---|---|---|")
        for c, k, pss, cpu, fm, fc in summary:
            print("| %s | %d | %.0f | %.1f | %.0f | %.0f |" % (c, k, pss, cpu, fm, fc))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
