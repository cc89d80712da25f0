#!/usr/bin/env python3
"""What a VM costs the host in memory, through the daemon on the fake QEMU of tests/integration/fakes:

  - QEMU's command line: the balloon with free page reporting on every VM, and under TCG the
    translation cache of --tcg-tb-size-mib (256 by default, 0 for QEMU's own, out of range refused);
  - get_host (REST and MCP) reports KSM as /sys/kernel/mm/ksm says, and /metrics its figures;
  - get_vm_metrics reports the PSS of each process of the VM's run and their sum, and the balloon's
    statistics as QEMU answers qom-get guest-stats (with QEMU's 2^64-1 for "not reported" in the
    same reply), or why there are none (a QEMU without the device); /metrics has the same as
    per-VM series.
"""

import json
import os
import signal
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (HOST, Daemon, McpClient, api, base_env, fake_image_dir, free_port, http_request,  # noqa: E402
                     run, tap, tool_json, wait_state)

FAKES = os.path.join(here, "fakes")
CREATE = {"memory_mib": 512, "disk_gib": 2, "require_attestation": False, "wait_for": "none"}
KSM = "/sys/kernel/mm/ksm"


def setup(work, **extra_env):
    images, firmware = fake_image_dir(work)
    env = base_env(work, FAKE_QEMU="install-exit:0", **extra_env)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    return images, firmware, env


def start(work, name, images, firmware, env, extra=()):
    port = free_port()
    state = os.path.join(work, "s-" + name)
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                            "--ovmf-code", firmware, "--ovmf-vars", firmware, "--launcher", "process",
                            "--accel", "tcg"] + list(extra), env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    return d, port, state, ok, why


def booted_vm(port, state, name):
    """A VM whose installed boot runs on the fake QEMU: (id, QEMU's argv) or (None, why)."""
    status, vm = api(port, "POST", "/vms", dict(CREATE, name=name, hostname=name))
    if status != 201:
        return None, repr(vm)[:300]
    got = wait_state(port, vm["id"], ("booting",), 60, 0.2)
    if not got or got.get("state") != "booting":
        return None, repr(got)[:300]
    with open(os.path.join(state, "vms", vm["id"], "qemu.argv.json")) as f:
        return vm["id"], json.load(f)


def option_values(argv, option):
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == option]


def scrape(port):
    status, _, data = http_request(port, "GET", "/metrics", timeout=30)
    samples = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return status, samples


def series(samples, name, **labels):
    """The values of name whose labels include labels."""
    out = []
    for key, value in samples.items():
        if key == name or key.startswith(name + "{"):
            if all(('%s="%s"' % kv) in key for kv in labels.items()):
                out.append(value)
    return out


def read_ksm():
    if not os.path.isdir(KSM):
        return None
    return {f: int(open(os.path.join(KSM, f)).read()) for f in ("run", "pages_shared", "pages_sharing")}


def check_ksm(host, where):
    k, now = host.get("ksm") or {}, read_ksm()
    if now is None:
        tap.result(k.get("available") is False and k.get("running") is False and "no KSM" in k.get("note", ""),
                   "%s: ksm says the kernel has none" % where, repr(k))
        return
    page = os.sysconf("SC_PAGE_SIZE")
    tap.result(k.get("available") is True and k.get("run") == now["run"] and k.get("running") == (now["run"] == 1)
               and k.get("savedBytes") == k.get("pagesSharing", -1) * page and isinstance(k.get("pagesShared"), int)
               and (now["run"] == 1 or "off" in k.get("note", "")),
               "%s: ksm as /sys/kernel/mm/ksm says (run %d), saved bytes = pages_sharing x page size, a note "
               "when off" % (where, now["run"]), repr(k))


def wait_balloon(port, vid, timeout=20):
    """get_vm_metrics once its balloon has statistics and its processes a measurement (the first read
    asks QEMU and the worker thread, a later one has their answers)."""
    deadline = time.monotonic() + timeout
    while True:
        status, m = api(port, "GET", "/vms/%s/metrics" % vid)
        b = m.get("balloon") if status == 200 else None
        ready = b and b.get("stats") and b["stats"].get("updated_at") and m["host"].get("processes")
        if ready or time.monotonic() > deadline:
            return status, m
        time.sleep(0.5)


def test_memory(work):
    images, firmware, env = setup(work)
    d, port, state, ok, why = start(work, "mem", images, firmware, env)
    tap.result(ok, "serving with the fake QEMU", why)
    if not ok:
        return
    try:
        status, host = api(port, "GET", "/host")
        tap.result(status == 200, "get_host", repr(host)[:300])
        check_ksm(host, "get_host")
        mcp = McpClient(port)
        mcp.initialize()
        mhost, _ = tool_json(mcp.call("get_host", {}))
        check_ksm(mhost, "MCP get_host")

        vid, argv = booted_vm(port, state, "mem-a")
        tap.result(vid is not None, "a VM boots on the fake QEMU", "" if vid else argv)
        if not vid:
            return
        tap.result(option_values(argv, "-accel") == ["tcg,thread=multi,tb-size=256"],
                   "QEMU's command line: -accel tcg with tb-size=256 by default", repr(option_values(argv, "-accel")))
        tap.result(option_values(argv, "-device").count("virtio-balloon-pci,id=balloon0,free-page-reporting=on") == 1,
                   "QEMU's command line: the balloon with free page reporting", repr(option_values(argv, "-device")))

        status, m = wait_balloon(port, vid)
        h = m.get("host", {})
        procs = {p["role"]: p for p in h.get("processes", [])}
        q = procs.get("qemu", {})
        tap.result(status == 200 and q.get("pid") == h.get("pid") and q.get("pss_bytes", 0) > 0
                   and q.get("rss_bytes", 0) >= q.get("pss_bytes", 0)
                   and all(k in q for k in ("pss_anon_bytes", "pss_file_bytes", "pss_shmem_bytes", "swap_pss_bytes")),
                   "get_vm_metrics: QEMU's PSS, RSS and PSS by kind from smaps_rollup", repr(h)[:600])
        tap.result(h.get("memory_pss_bytes") == sum(p["pss_bytes"] for p in procs.values())
                   and set(procs) <= {"qemu", "swtpm", "vsock"} and "swtpm" in procs,
                   "get_vm_metrics: each process of the run (qemu, swtpm, ...) and the sum of their PSS",
                   repr(sorted(procs)))
        b = m.get("balloon") or {}
        st = b.get("stats") or {}
        tap.result(b.get("free_page_reporting") is True and b.get("poll_interval_seconds") == 30
                   and st.get("free_memory_bytes") == 1428705280 and st.get("total_memory_bytes") == 2061062144
                   and st.get("available_memory_bytes") == 1622937600 and st.get("disk_caches_bytes") == 330297344
                   and st.get("major_faults") == 1051 and st.get("swap_in_bytes") == 0
                   and "hugetlb_allocations" not in st and "note" not in b,
                   "get_vm_metrics balloon: the guest's statistics, QEMU's 2^64-1 ('not reported') left out",
                   repr(b))

        status, s = scrape(port)
        qpss = series(s, "vm_manager_vm_process_memory_pss_bytes", vm=vid, process="qemu")
        tap.result(status == 200 and len(qpss) == 1 and qpss[0] > 0
                   and len(series(s, "vm_manager_vm_process_memory_pss_bytes", vm=vid, process="swtpm")) == 1,
                   "/metrics: vm_manager_vm_process_memory_pss_bytes of QEMU and swtpm",
                   repr({k: v for k, v in s.items() if "pss" in k}))
        tap.result(series(s, "vm_manager_vm_balloon_free_memory_bytes", vm=vid) == [1428705280.0]
                   and series(s, "vm_manager_vm_balloon_major_faults_total", vm=vid) == [1051.0]
                   and series(s, "vm_manager_vm_balloon_total_memory_bytes", vm=vid) == [2061062144.0],
                   "/metrics: the balloon's statistics per VM",
                   repr({k: v for k, v in s.items() if "balloon" in k}))
        now = read_ksm()
        if now is None:
            tap.result(not series(s, "vm_manager_host_ksm_running"), "/metrics: no KSM series without KSM", "")
        else:
            tap.result(series(s, "vm_manager_host_ksm_running") == [1.0 if now["run"] == 1 else 0.0]
                       and len(series(s, "vm_manager_host_ksm_saved_bytes")) == 1
                       and len(series(s, "vm_manager_host_ksm_pages_sharing")) == 1,
                       "/metrics: KSM's state and savings",
                       repr({k: v for k, v in s.items() if "ksm" in k}))
        status, _ = api(port, "POST", "/vms/%s/stop" % vid, {})
        got = wait_state(port, vid, ("stopped",), 60, 0.2)
        status, m = api(port, "GET", "/vms/%s/metrics" % vid)
        tap.result(got and got.get("state") == "stopped" and m.get("balloon") is None
                   and "processes" not in m.get("host", {}),
                   "a stopped VM: no balloon, no processes", repr(m)[:400])
    finally:
        d.stop(signal.SIGTERM, timeout=60)


def test_flags(work):
    images, firmware, env = setup(work)
    for value, want in (("0", "tcg,thread=multi"), ("64", "tcg,thread=multi,tb-size=64")):
        d, port, state, ok, why = start(work, "tb-" + value, images, firmware, env, ["--tcg-tb-size-mib", value])
        try:
            vid, argv = booted_vm(port, state, "tb-" + value) if ok else (None, why)
            tap.result(vid is not None and option_values(argv, "-accel") == [want],
                       "--tcg-tb-size-mib %s: -accel %s" % (value, want), repr(argv)[:300])
        finally:
            d.stop(signal.SIGTERM, timeout=60)

    bad = Daemon(work, "tb-bad", ["--listen", "%s:%d" % (HOST, free_port()), "--state-dir",
                                  os.path.join(work, "s-bad"), "--tcg-tb-size-mib", "5000"], env=env)
    try:
        rc = bad.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        rc = None
    err = bad.stderr()
    tap.result(rc == 1 and "--tcg-tb-size-mib" in err and "4096" in err,
               "--tcg-tb-size-mib 5000 is refused at start-up", err[-400:])


def test_no_balloon(work):
    images, firmware, env = setup(work, FAKE_NO_BALLOON="1")
    d, port, state, ok, why = start(work, "noballoon", images, firmware, env)
    try:
        vid, argv = booted_vm(port, state, "nb") if ok else (None, why)
        tap.result(vid is not None, "a VM boots on a QEMU without the balloon", "" if vid else argv)
        if not vid:
            return
        deadline = time.monotonic() + 15
        while True:
            status, m = api(port, "GET", "/vms/%s/metrics" % vid)
            b = m.get("balloon") or {}
            if ("not found" in b.get("note", "") and m["host"].get("processes")) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        tap.result(status == 200 and b.get("stats") is None and "not found" in b.get("note", "")
                   and m["host"].get("memory_pss_bytes", 0) > 0,
                   "a QEMU without the balloon: no statistics, QEMU's error as the note, PSS still there", repr(m)[:500])
        status, s = scrape(port)
        tap.result(status == 200 and not series(s, "vm_manager_vm_balloon_free_memory_bytes", vm=vid),
                   "... and no balloon series in /metrics", "")
    finally:
        d.stop(signal.SIGTERM, timeout=60)


if __name__ == "__main__":
    sys.exit(run([test_memory, test_flags, test_no_balloon], 280, "vmm-memory-"))
