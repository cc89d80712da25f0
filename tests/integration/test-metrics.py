#!/usr/bin/env python3
"""Metrics through the daemon, with the fake QEMU of tests/integration/fakes (the installer exits 0,
the installed boot runs) and, for one VM, tests/net/fake-guest on its NIC so that its network
carries bytes:

  - GET /metrics before and after VMs, networks and guest reports exist, checked by promtool
    (Debian's prometheus package, unpacked by tools/install-deps.sh) and by the names, labels and
    values a dashboard would read;
  - guest reports uploaded on a VM's own IMDS listener (<vm>/imds.sock, as the gateway delivers
    them): the mapping of systemd-report's format, the series limit with 10,000 entries, bad uploads,
    an upload that is JSON but no report;
  - get_vm_metrics on REST and MCP, GET /vms/{id}/report;
  - the reports survive a restart of the daemon; --metrics-enabled=false removes the route.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (Daemon, HOST, McpClient, api, base_env, fake_image_dir, free_port, http_request,  # noqa: E402
                     imds_request, run, tap, tool_json, wait_state)

FAKES = os.path.join(here, "fakes")
CREATE = {"memory_mib": 512, "disk_gib": 2, "require_attestation": False, "wait_for": "none"}
PROMTOOL = os.environ.get("PROMTOOL") or shutil.which("promtool") or "/var/cache/vm-manager/prometheus/usr/bin/promtool"
LIMIT = 50

# A report in systemd-report's format: entries of the io.systemd.* families it collects, with an
# object (a unit, a link), fields, a string value, a bool, a declared counter.
REPORT = {
    "mediaType": "application/vnd.io.systemd.report",
    "timestamp": "Sat 2026-09-12 14:17:48 UTC",
    "metrics": [
        {"name": "io.systemd.Manager.NRestarts", "object": "sshd.service", "value": 2},
        {"name": "io.systemd.Manager.NRestarts", "object": "vm-agent.service", "value": 0},
        {"name": "io.systemd.Manager.UnitActiveState", "object": "sshd.service", "value": "active"},
        {"name": "io.systemd.Network.IPv4AddressState", "object": "enp0s1", "value": "routable"},
        {"name": "io.systemd.Network.CarrierState", "object": "enp0s1", "fields": {"kind": "ether", "mtu": 1500},
         "value": True},
        {"name": "io.systemd.Basic.MemoryAvailable", "value": 1843200000, "type": "gauge"},
        {"name": "io.systemd.Basic.BootCount", "value": "7", "type": "counter"},
        {"name": "org.example.Quoted", "fields": {"path": "C:\\dir \"x\"\nnext"}, "value": 1},
        {"name": "io.systemd.Manager.NRestarts", "object": "sshd.service", "value": 9},
        {"name": "io.systemd.Broken", "value": None},
        {"name": "io.systemd.Broken", "value": [1, 2]},
    ],
}


def upload(state, vid, doc):
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    status, _, payload = imds_request(os.path.join(state, "vms", vid, "imds.sock"), "POST", "/giantswarm/v1/report",
                                      body)
    return status, payload


def wait_mapped(port, vid, timeout=60):
    """get_vm_metrics once the stored report a restarted daemon maps again (off its loop) is back."""
    deadline = time.monotonic() + timeout
    while True:
        status, m = api(port, "GET", "/vms/%s/metrics" % vid)
        if status != 200 or m.get("guest") is not None or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def scrape(port):
    status, headers, data = http_request(port, "GET", "/metrics", timeout=30)
    return status, {k.lower(): v for k, v in headers.items()}, data.decode("utf-8", "replace")


def promtool_check(text):
    if not os.access(PROMTOOL, os.X_OK):
        return None, "promtool not found (tools/install-deps.sh check unpacks it)"
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    return p.returncode == 0, (p.stdout + p.stderr).decode()[-2000:]


SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """[(name, {label: value}, float)] of the sample lines; label values unescaped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        if not m:
            raise ValueError("not a sample line: %r" % line)
        labels = {}
        for k, v in LABEL_RE.findall(m.group(3) or ""):
            labels[k] = v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def find(_samples, _metric, **labels):
    return [v for n, l, v in _samples if n == _metric and all(l.get(k) == x for k, x in labels.items())]


def families(text):
    """{name: type} from the TYPE lines, and the names that have a HELP line."""
    types, helps = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            types[name] = typ
        elif line.startswith("# HELP "):
            helps.add(line.split(" ", 3)[2])
    return types, helps


def setup(work):
    images, vars_ = fake_image_dir(work)
    plan = os.path.join(work, "plan.json")
    with open(plan, "w") as f:
        json.dump({"m-a": ["--timeout-ms", "4000", "dhcp", "http", "169.254.169.254:80", "/giantswarm/v1/hostname",
                           "sleep", "600000"]}, f)
    env = base_env(work, FAKE_QEMU="install-exit:0", FAKE_GUEST=os.environ.get("FAKE_GUEST", ""),
                   FAKE_GUEST_PLAN=plan)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    return images, vars_, env


def start(work, name, state, images, vars_, env, extra=()):
    port = free_port()
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                            "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process",
                            "--metrics-guest-series-limit", str(LIMIT)] + list(extra), env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    return d, port, ok, why


def test_metrics(work):
    images, vars_, env = setup(work)
    state = os.path.join(work, "state")
    d, port, ok, why = start(work, "metrics", state, images, vars_, env)
    tap.result(ok, "serving with the fake QEMU", why)
    if not ok:
        return
    try:
        run_checks(work, d, port, state, images, vars_, env)
    finally:
        d.stop(signal.SIGTERM, timeout=60)


def run_checks(work, d, port, state, images, vars_, env):
    status, headers, text = scrape(port)
    tap.result(status == 200 and headers.get("content-type", "").startswith("text/plain; version=0.0.4"),
               "GET /metrics: 200, the text exposition's content type", "%r %r" % (status, headers))
    ok, out = promtool_check(text)
    tap.result(bool(ok), "promtool check metrics passes on a daemon without VMs", out)
    types, helps = families(text)
    want = {"vm_manager_build_info": "gauge", "vm_manager_vm_state": "gauge", "vm_manager_vm_attestation": "gauge",
            "vm_manager_vm_info": "gauge", "vm_manager_vm_created_timestamp_seconds": "gauge",
            "vm_manager_vm_install_seconds": "gauge", "vm_manager_vm_boot_to_ready_seconds": "gauge",
            "vm_manager_vm_cpu_seconds_total": "counter", "vm_manager_vm_memory_rss_bytes": "gauge",
            "vm_manager_vm_disk_bytes": "gauge", "vm_manager_vms": "gauge",
            "vm_manager_network_bytes_total": "counter", "vm_manager_network_leases": "gauge",
            "vm_manager_vm_install_duration_seconds": "histogram",
            "vm_manager_vm_boot_to_ready_duration_seconds": "histogram",
            "vm_guest_report_age_seconds": "gauge", "vm_guest_report_series": "gauge",
            "vm_guest_reports_total": "counter", "vm_guest_report_series_dropped_total": "counter",
            "process_cpu_seconds_total": "counter", "process_resident_memory_bytes": "gauge",
            "vm_manager_loop_iteration_seconds": "histogram", "vm_manager_loop_iteration_seconds_max": "gauge"}
    wrong = {k: (v, types.get(k)) for k, v in want.items() if types.get(k) != v}
    tap.result(not wrong, "every host family of the reference is there with its type", repr(wrong))
    tap.result(set(types) <= helps, "every family has a HELP line", repr(set(types) - helps))
    s = parse(text)
    count, worst = find(s, "vm_manager_loop_iteration_seconds_count"), find(s, "vm_manager_loop_iteration_seconds_max")
    tap.result(len(count) == 1 and count[0] > 0 and len(worst) == 1 and 0 < worst[0] < 60
               and find(s, "vm_manager_loop_iteration_seconds_bucket", le="+Inf") == count,
               "vm_manager_loop_iteration_seconds: the loop's iterations counted, the longest of them",
               repr((count, worst)))
    tap.result(len(find(s, "vm_manager_vms")) == 10 and set(find(s, "vm_manager_vms")) == {0.0},
               "vm_manager_vms: all 10 states, 0 each", repr(find(s, "vm_manager_vms")))
    tap.result(find(s, "vm_manager_vm_install_duration_seconds_bucket", le="300") == [0.0]
               and find(s, "vm_manager_vm_boot_to_ready_duration_seconds_bucket", le="120") == [0.0],
               "histograms with the reference's buckets (le=300 for installs, le=120 for boots)",
               repr([x for x in s if x[0].endswith("_bucket")]))
    status, _ = api(port, "POST", "/networks", {"name": "mnet", "cidr": "10.77.0.0/24"})
    tap.result(status == 201, "create_network mnet", status)

    vms = {}
    for name, net in (("m-a", "default"), ("m-b", "mnet"), ("m-c", "mnet")):
        status, vm = api(port, "POST", "/vms", dict(CREATE, name=name, hostname=name, network=net))
        tap.result(status == 201, "create_vm %s" % name, repr(vm)[:300])
        if status != 201:
            return
        vms[name] = vm["id"]
    for name, vid in vms.items():
        vm = wait_state(port, vid, ("booting",), 60, 0.2)
        tap.result(vm and vm.get("state") == "booting", "%s: the fake installer exits 0, the installed boot runs" % name,
                   repr(vm)[:300])

    # before any report
    vid = vms["m-a"]
    status, m = api(port, "GET", "/vms/%s/metrics" % vid)
    tap.result(status == 200 and m["id"] == vid and m["guest"] is None and "raw_report_url" not in m
               and m.get("note") == "no systemd-report upload from the guest yet; host metrics only",
               "get_vm_metrics before any upload: guest null, the note, no raw_report_url", repr(m)[:500])
    h = m.get("host", {}) if isinstance(m, dict) else {}
    tap.result(h.get("state") == "booting" and h.get("attestation") == "disabled" and h.get("pid", 0) > 0
               and h.get("cpu_seconds", -1) >= 0 and h.get("memory_rss_bytes", 0) > 0
               and h.get("disk_bytes") == 2 << 30 and h.get("install_seconds", -1) >= 0
               and "boot_to_ready_seconds" not in h,
               "get_vm_metrics host: state, attestation disabled, QEMU's pid, CPU and RSS from /proc, disk bytes, "
               "install seconds, no boot_to_ready before READY=1", repr(h))
    net = h.get("network", {})
    tap.result(net.get("name") == "default" and net.get("leases") == 1 and net.get("bytes_sent", 0) > 0
               and net.get("bytes_received", 0) > 0,
               "get_vm_metrics network: the network's name, leases and byte counters (the fake guest did DHCP)",
               repr(net))
    status, r = api(port, "GET", "/vms/%s/report" % vid)
    tap.result(status == 404 and r["error"] == {"code": "not_found",
                                                "message": 'not found: vm "%s" has no systemd-report upload yet' % vid},
               "GET /vms/{id}/report before any upload: 404 not_found", repr(r))
    status, r = api(port, "GET", "/vms/nosuchvm/metrics")
    tap.result(status == 404 and r["error"]["code"] == "not_found", "get_vm_metrics of an unknown VM: 404", repr(r))
    status, r = api(port, "GET", "/vms/nosuchvm/report")
    tap.result(status == 404 and r["error"]["code"] == "not_found", "GET /report of an unknown VM: 404", repr(r))

    # a report
    st, body = upload(state, vid, REPORT)
    tap.result(st == 204, "IMDS POST /report: 204", "%r %r" % (st, body))
    status, m = api(port, "GET", "/vms/%s/metrics" % vid)
    g = m.get("guest") or {}
    tap.result(g.get("series") == 11 and g.get("families") == 8 and g.get("series_exported") == 8
               and g.get("series_dropped") == 3 and g.get("generated_at") == "2026-09-12T14:17:48Z"
               and 0 <= g.get("report_age_seconds", -1) < 60 and isinstance(g.get("sample"), list)
               and len(g["sample"]) == 10 and g["sample"][0] == REPORT["metrics"][0]
               and m.get("raw_report_url") == "/api/v1/vms/%s/report" % vid and "note" not in m,
               "get_vm_metrics guest: 11 entries, 8 families, 8 exported, 3 dropped, the report's timestamp, "
               "the first 10 entries verbatim, raw_report_url", repr(m)[:1500])
    status, r = api(port, "GET", "/vms/%s/report" % vid)
    tap.result(status == 200 and r == REPORT, "GET /vms/{id}/report: the upload as JSON", repr(r)[:300])
    mcp = McpClient(port)
    mcp.initialize()
    text_doc, sc = tool_json(mcp.call("get_vm_metrics", {"id": vid}))
    tap.result(sc and sc["id"] == vid and sc["guest"]["series_exported"] == 8 and sc["host"]["state"] == "booting",
               "MCP get_vm_metrics: the same summary", repr(sc)[:300])

    status, _, text = scrape(port)
    ok, out = promtool_check(text)
    tap.result(bool(ok), "promtool check metrics passes with VMs, networks and a guest report loaded", out)
    s = parse(text)
    tap.result(find(s, "vm_guest_io_systemd_manager_nrestarts_total", vm=vid, object="sshd.service") == [2.0]
               and find(s, "vm_guest_io_systemd_manager_nrestarts_total", vm=vid, object="vm-agent.service") == [0.0],
               "NRestarts: a counter with _total, one series per unit, the first of two duplicates wins",
               repr(find(s, "vm_guest_io_systemd_manager_nrestarts_total")))
    tap.result(find(s, "vm_guest_io_systemd_network_ipv4_address_state_info", vm=vid, object="enp0s1",
                    value="routable") == [1.0],
               "IPv4AddressState: a string becomes an _info series with the value as a label",
               repr([x for x in s if "ipv4" in x[0]]))
    tap.result(find(s, "vm_guest_io_systemd_network_carrier_state", vm=vid, object="enp0s1", kind="ether",
                    mtu="1500") == [1.0],
               "CarrierState: a bool is 1, fields become labels (numbers in decimal)",
               repr([x for x in s if "carrier" in x[0]]))
    tap.result(find(s, "vm_guest_io_systemd_basic_memory_available", vm=vid, object="") == [1843200000.0]
               and find(s, "vm_guest_io_systemd_basic_boot_count_total", vm=vid) == [7.0],
               "a host-wide gauge has object=\"\"; a declared counter with a numeric string is parsed",
               repr([x for x in s if "basic" in x[0]]))
    tap.result(find(s, "vm_guest_org_example_quoted", vm=vid, path='C:\\dir "x"\nnext') == [1.0],
               "a label value with a backslash, quotes and a newline is escaped and reads back",
               repr([x for x in s if "quoted" in x[0]]) + "\n" + "\n".join(l for l in text.splitlines() if "quoted" in l))
    tap.result("Guest systemd-report family io.systemd.Manager.NRestarts." in text,
               "a guest family's HELP names the original family", "")
    tap.result(find(s, "vm_guest_reports_total", vm=vid) == [1.0]
               and find(s, "vm_guest_report_series", vm=vid) == [8.0]
               and find(s, "vm_guest_report_series_dropped_total", vm=vid, reason="duplicate") == [1.0]
               and find(s, "vm_guest_report_series_dropped_total", vm=vid, reason="unsupported") == [2.0]
               and find(s, "vm_guest_report_series_dropped_total", vm=vid, reason="limit") == [0.0]
               and 0 <= (find(s, "vm_guest_report_age_seconds", vm=vid) or [-1])[0] < 60,
               "bookkeeping: 1 upload, 8 series, drops by reason, the report's age",
               repr([x for x in s if x[0].startswith("vm_guest_report")]))
    tap.result(find(s, "vm_manager_vm_state", vm=vid, name="m-a", state="booting") == [1.0]
               and sum(find(s, "vm_manager_vm_state", vm=vid)) == 1.0
               and find(s, "vm_manager_vms", state="booting") == [3.0],
               "vm_state: 1 for the current state only; vms counts 3 booting",
               repr([x for x in s if x[0] in ("vm_manager_vm_state", "vm_manager_vms") and x[2]]))
    tap.result(find(s, "vm_manager_vm_info", vm=vid, name="m-a", network="default", image="fake_1.0") == [1.0]
               and find(s, "vm_manager_vm_attestation", vm=vid, state="disabled") == [1.0]
               and find(s, "vm_manager_vm_disk_bytes", vm=vid) == [float(2 << 30)]
               and len(find(s, "vm_manager_vm_cpu_seconds_total", vm=vid)) == 1
               and find(s, "vm_manager_vm_memory_rss_bytes", vm=vid)[0] > 0
               and len(find(s, "vm_manager_vm_install_seconds", vm=vid)) == 1
               and find(s, "vm_manager_vm_boot_to_ready_seconds", vm=vid) == [],
               "per-VM host series: info, attestation, disk, CPU and RSS, install seconds; no boot_to_ready yet",
               repr([x for x in s if x[1].get("vm") == vid and x[0].startswith("vm_manager")]))
    tap.result(find(s, "vm_manager_vm_install_duration_seconds_count") == [3.0]
               and find(s, "vm_manager_vm_install_duration_seconds_bucket", le="10") == [3.0],
               "the install histogram observed the three installs",
               repr([x for x in s if x[0].startswith("vm_manager_vm_install_duration")]))
    tap.result(find(s, "vm_manager_network_leases", network="mnet") == [2.0]
               and find(s, "vm_manager_network_leases", network="default") == [1.0]
               and find(s, "vm_manager_network_bytes_total", network="default", direction="sent")[0] > 0
               and find(s, "vm_manager_network_bytes_total", network="default", direction="received")[0] > 0
               and find(s, "vm_manager_network_bytes_total", network="mnet", direction="sent") == [0.0],
               "per network: leases, bytes sent to and received from the VMs",
               repr([x for x in s if x[0].startswith("vm_manager_network")]))

    # the limit with 10,000 entries, on another VM
    big = {"mediaType": "application/vnd.io.systemd.report", "timestamp": "Sun 2026-09-13 01:02:03 UTC",
           "metrics": [{"name": "org.example.Load", "object": "unit-%05d.service" % i, "value": i}
                       for i in range(10000)]}
    vb = vms["m-b"]
    t0 = time.monotonic()
    st, body = upload(state, vb, big)
    tap.result(st == 204, "a report of 10,000 entries is taken (%.2f s)" % (time.monotonic() - t0), repr(body))
    status, m = api(port, "GET", "/vms/%s/metrics" % vb)
    g = m.get("guest") or {}
    tap.result(g.get("series") == 10000 and g.get("series_exported") == LIMIT and g.get("series_dropped") == 10000 - LIMIT
               and g.get("families") == 1,
               "--metrics-guest-series-limit %d: %d exported, the rest dropped" % (LIMIT, LIMIT), repr(g)[:400])
    status, _, text = scrape(port)
    s = parse(text)
    tap.result(len(find(s, "vm_guest_org_example_load", vm=vb)) == LIMIT
               and find(s, "vm_guest_report_series_dropped_total", vm=vb, reason="limit") == [float(10000 - LIMIT)],
               "the exposition holds %d series of that VM and counts the rest as dropped (limit)" % LIMIT,
               repr(find(s, "vm_guest_report_series_dropped_total", vm=vb)))
    ok, out = promtool_check(text)
    tap.result(bool(ok), "promtool check metrics passes with two guests' families merged", out)

    # bad uploads change nothing
    for what, body, want in (("not JSON", b"{nope", 400), ("nested 40 deep", b"[" * 40 + b"]" * 40, 400),
                             ("larger than 8 MiB", b" " * (8 << 20) + b"{}", 413)):
        st, resp = upload(state, vid, body)
        status, m = api(port, "GET", "/vms/%s/metrics" % vid)
        status2, r = api(port, "GET", "/vms/%s/report" % vid)
        tap.result(st == want and (m.get("guest") or {}).get("series_exported") == 8 and r == REPORT,
                   "an upload %s is refused (%d) and the previous report stays" % (what, want),
                   "%r %r" % (st, resp[:200]))

    # JSON that is no report: stored, not exported; the last good series stay
    vc = vms["m-c"]
    st, _ = upload(state, vc, REPORT)
    st, _ = upload(state, vc, [1, 2, "three"])
    status, m = api(port, "GET", "/vms/%s/metrics" % vc)
    tap.result(st == 204 and m.get("guest") is None and m.get("raw_report_url") == "/api/v1/vms/%s/report" % vc
               and m.get("note") == "the guest's last upload is not a systemd-report and was not exported; "
                                    "see raw_report_url",
               "an upload that is JSON but no report: 204, guest null, the note, raw_report_url", repr(m)[:400])
    status, r = api(port, "GET", "/vms/%s/report" % vc)
    tap.result(status == 200 and r == [1, 2, "three"], "GET /report serves that upload", repr(r))
    status, _, text = scrape(port)
    s = parse(text)
    tap.result(find(s, "vm_guest_reports_total", vm=vc) == [2.0]
               and find(s, "vm_guest_io_systemd_manager_nrestarts_total", vm=vc, object="sshd.service") == [2.0],
               "... counted as an upload; the previous report's series stay exported",
               repr([x for x in s if x[1].get("vm") == vc and x[0].startswith("vm_guest")])[:600])

    # a restart: the reports come back from the state directory
    status, before = api(port, "GET", "/vms/%s/metrics" % vid)
    d.stop(signal.SIGTERM, timeout=60)
    d2, port2, ok, why = start(work, "metrics-2", state, images, vars_, env)
    tap.result(ok, "a second daemon on the same state directory", why)
    if not ok:
        return
    try:
        m = wait_mapped(port2, vid)
        wait_mapped(port2, vb)
        g, g0 = m.get("guest") or {}, before.get("guest") or {}
        tap.result(g.get("series_exported") == 8 and g.get("received_at") == g0.get("received_at")
                   and g.get("generated_at") == "2026-09-12T14:17:48Z",
                   "after a restart the report is mapped again, with its receive time", "%r\n%r" % (g, g0))
        status, r = api(port2, "GET", "/vms/%s/report" % vid)
        tap.result(status == 200 and r == REPORT, "... and GET /report still serves it", repr(r)[:200])
        status, _, text = scrape(port2)
        s = parse(text)
        tap.result(find(s, "vm_guest_io_systemd_manager_nrestarts_total", vm=vid, object="sshd.service") == [2.0]
                   and len(find(s, "vm_guest_org_example_load", vm=vb)) == LIMIT,
                   "... and /metrics exports its series", "")
        ok, out = promtool_check(text)
        tap.result(bool(ok), "promtool check metrics passes after the restart (VMs stopped)", out)
        status, r = api(port2, "DELETE", "/vms/" + vb, timeout=60)
        status, _, text = scrape(port2)
        tap.result(status == 200 and ('vm="%s"' % vb) not in text,
                   "delete_vm removes the VM's host and guest series", "")
    finally:
        d2.stop(signal.SIGTERM, timeout=60)

    d3, port3, ok, why = start(work, "metrics-off", state, images, vars_, env, ["--metrics-enabled=false"])
    try:
        status, _, _ = scrape(port3)
        tap.result(ok and status == 404, "--metrics-enabled=false: GET /metrics is 404", status)
    finally:
        d3.stop(signal.SIGTERM, timeout=60)
    d4 = Daemon(work, "metrics-bad", ["--listen", "%s:%d" % (HOST, free_port()), "--state-dir",
                                      os.path.join(work, "state-bad"), "--metrics-guest-series-limit", "0"], env=env)
    try:
        rc = d4.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        rc = None
    err = d4.stderr()
    tap.result(rc == 1 and "--metrics-guest-series-limit" in err and "must be at least 1" in err,
               "--metrics-guest-series-limit 0 is refused at start-up", err[-400:])


if __name__ == "__main__":
    sys.exit(run([test_metrics], 300, "vmm-metrics-"))
