#!/usr/bin/env python3
"""VMs on real boots: QEMU under TCG, OVMF, swtpm and vhost-device-vsock, driven through the API.

The guest is the tiny test image of tests/image (a UKI whose init copies the installer disk onto
the target in the installer boot, and sends READY=1 over vsock and powers off on ACPI in the
installed boot), built into VM_MANAGER_TEST_IMAGE_DIR by tests/image/build.sh.

  * create_vm (wait_for ready) -> get_vm_console -> stop_vm -> start_vm -> reboot_vm -> delete_vm,
    with the states, the console text, and nothing left behind: no process, file, lease;
  * the guest's network, from its console: before READY=1 it took exactly the lease get_vm shows
    over DHCP from the network's switch, and the IMDS at 169.254.169.254 told it its hostname and
    its VM id;
  * the same chain over MCP for create and delete;
  * an installer that never finishes: failed, the cause in lastError and the console in consoleTail;
  * kill -9 of the daemon while a VM runs: the VM's processes end with it, and the next start
    finds the record stopped with a note; start_vm boots it again.

Skips (exit 0, "1..0 # SKIP") when QEMU, swtpm, OVMF or vhost-device-vsock are missing.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vmmtest import (BIN, Daemon, HOST, McpClient, base_env, free_port, http_request, processes_gone,  # noqa: E402
                     processes_under, run, tap, tool_json)

IMAGE_DIR = os.environ.get("VM_MANAGER_TEST_IMAGE_DIR")
SOURCE_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False}


def missing_tools():
    missing = ["%s (package %s)" % (t, p) for t, p in (
        ("qemu-system-x86_64", "qemu-system-x86"), ("swtpm", "swtpm"),
        ("vhost-device-vsock", "vhost-device-vsock, from sid by tools/fetch-sid-package.sh")) if not shutil.which(t)]
    if not os.path.exists("/usr/share/OVMF/OVMF_CODE_4M.fd"):
        missing.append("/usr/share/OVMF/OVMF_CODE_4M.fd (package ovmf)")
    return missing


def api(port, method, path, body=None, timeout=600):
    status, headers, data = http_request(port, method, "/api/v1" + path,
                                         body=json.dumps(body).encode() if body is not None else None,
                                         timeout=timeout)
    return status, (json.loads(data) if data else None)


def console_lines(text):
    return [line.rstrip("\r") for line in text.splitlines()]


def guest_network_lines(vm, net):
    """What test-init prints once it has its lease and the IMDS answered."""
    prefix = net["spec"]["cidr"].split("/")[1]
    return ["test-init: dhcp lease %s/%s router %s mtu %d" % (vm["ip"], prefix, net["gateway"], net["spec"]["mtu"]),
            "test-init: imds hostname=%s" % (vm.get("hostname") or vm["name"]),
            "test-init: imds instance-id=%s" % vm["id"]]


def has_line(lines, want):
    return any(line.endswith(want) for line in lines)


def wait_state(port, vm_id, states, timeout):
    deadline = time.monotonic() + timeout
    vm = None
    while time.monotonic() < deadline:
        status, vm = api(port, "GET", "/vms/" + vm_id)
        if status == 200 and vm["state"] in states:
            return vm
        time.sleep(0.5)
    return vm


def start_daemon(work, name, state, port, *extra):
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", IMAGE_DIR,
                            "--log-level", "debug", *extra], env=base_env(work))
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "%s: serving" % name, why)
    return d


def test_lifecycle(work):
    state = os.path.join(work, "s1")
    port = free_port()
    d = start_daemon(work, "lifecycle", state, port)

    t0 = time.monotonic()
    # more memory than this host has: refused before anything is made
    with open("/proc/meminfo") as f:
        host_mib = next(int(l.split()[1]) for l in f if l.startswith("MemTotal:")) // 1024
    status, err = api(port, "POST", "/vms", dict(CREATE, name="huge", memory_mib=host_mib + 1))
    _, vms = api(port, "GET", "/vms")
    tap.result(status == 400 and err["error"]["code"] == "invalid_request"
               and ("memory_mib %d is more than this host has (%d MiB)" % (host_mib + 1, host_mib))
               in err["error"]["message"] and not any(v["name"] == "huge" for v in (vms if isinstance(vms, list) else [])),
               "create_vm with more memory than the host has: 400 invalid_request, no VM made",
               repr(err)[:300])
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="life"))
    took = time.monotonic() - t0
    tap.result(status == 201 and vm["state"] == "ready",
               "create_vm (wait_for ready): 201 in state ready (%.1f s)" % took, "status %r: %r" % (status, vm))
    if status != 201:
        return
    vm_id = vm["id"]
    tap.result(vm.get("installedAt") and vm.get("readyAt") and vm["booted"] and vm["phase"] == "boot",
               "... installedAt, readyAt, booted, phase boot", json.dumps(vm)[:400])
    tap.result(vm["ip"] == "192.168.127.2" and vm["mac"] == "02:de:c0:a8:7f:02",
               "... the first lease of the default network and its derived MAC", "%s %s" % (vm["ip"], vm["mac"]))
    tap.result(len(processes_under(vm["paths"]["dir"])) == 3, "... QEMU, swtpm and vhost-device-vsock run",
               "\n".join(processes_under(vm["paths"]["dir"])))
    status, net = api(port, "GET", "/networks/default")
    tap.result(any(l["vmID"] == vm_id for l in net["leases"]), "... the network lists its lease", json.dumps(net))
    # the metrics of a real boot: the durations get_vm_metrics and /metrics report
    status, m = api(port, "GET", "/vms/%s/metrics" % vm_id)
    h = (m or {}).get("host", {})
    tap.result(status == 200 and h.get("state") == "ready" and h.get("install_seconds", 0) > 0
               and h.get("boot_to_ready_seconds", 0) > 0 and h.get("pid", 0) > 0 and h.get("memory_rss_bytes", 0) > 0,
               "get_vm_metrics: install and boot-to-ready seconds, QEMU's pid and RSS", repr(m)[:400])
    _, _, text = http_request(port, "GET", "/metrics", timeout=30)
    text = text.decode()
    tap.result("vm_manager_vm_boot_to_ready_duration_seconds_count 1\n" in text
               and "vm_manager_vm_install_duration_seconds_count 1\n" in text
               and ('vm_manager_vm_state{vm="%s",name="life",state="ready"} 1\n' % vm_id) in text,
               "/metrics: one install and one boot-to-ready observed, the VM ready",
               "\n".join(l for l in text.splitlines() if "_count" in l or ("state=\"ready\"" in l and vm_id in l)))

    status, con = api(port, "GET", "/vms/%s/console?lines=1000" % vm_id)
    tap.result(status == 200 and "READY=1" in con["console"],
               "get_vm_console: the installed boot's console, READY=1 sent", con["console"][-500:] if con else "")
    lines = console_lines(con["console"]) if status == 200 else []
    status, got = api(port, "GET", "/vms/" + vm_id)
    lease, hostname, instance_id = guest_network_lines(got, net)
    guest_net = "\n".join(l for l in lines if any(k in l for k in ("test-init: net", "test-init: dhcp", "imds")))
    tap.result(has_line(lines, lease), "... the guest took its lease over DHCP: '%s'" % lease, guest_net)
    tap.result(has_line(lines, hostname) and has_line(lines, instance_id),
               "... and the IMDS told it its hostname and its VM id", guest_net)
    status, con5 = api(port, "GET", "/vms/%s/console?lines=2" % vm_id)
    tap.result(status == 200 and con5["lines"] == 2 and con5["console"].count("\n") == 1,
               "get_vm_console?lines=2: two lines", repr(con5))
    status, err = api(port, "GET", "/vms/%s/console?lines=many" % vm_id)
    tap.result(status == 400 and err["error"]["code"] == "invalid_request", "console?lines=many: 400", repr(err))

    status, err = api(port, "POST", "/vms/%s/start" % vm_id)
    tap.result(status == 409 and err["error"]["message"] == "conflict: vm %s is ready" % vm_id,
               "start_vm while ready: 409 conflict", repr(err))

    t0 = time.monotonic()
    status, vm = api(port, "POST", "/vms/%s/stop" % vm_id)
    tap.result(status == 200 and vm["state"] == "stopped",
               "stop_vm: returns once stopped (ACPI honoured, %.2f s)" % (time.monotonic() - t0), repr(vm)[:300])
    left = processes_gone(vm["paths"]["dir"])
    tap.result(left == [], "... no process of the VM is left", "\n".join(left))
    status, err = api(port, "POST", "/vms/%s/stop" % vm_id)
    tap.result(status == 409 and err["error"]["message"] == "conflict: vm %s is not running (stopped)" % vm_id,
               "stop_vm while stopped: 409", repr(err))

    status, vm = api(port, "POST", "/vms/%s/start" % vm_id)
    tap.result(status == 200 and vm["state"] == "booting" and "readyAt" not in vm, "start_vm: booting", repr(vm)[:300])
    vm = wait_state(port, vm_id, ("ready", "failed"), 300)
    tap.result(vm["state"] == "ready", "... and ready again", repr(vm)[:300])
    status, con = api(port, "GET", "/vms/%s/console" % vm_id)
    tap.result("install:" not in con["console"] and "READY=1" in con["console"],
               "... the console holds this boot only", con["console"][-300:])
    tap.result(all(has_line(console_lines(con["console"]), want) for want in guest_network_lines(vm, net)),
               "... and took its lease and its IMDS answers again", con["console"][-800:])

    status, vm = api(port, "POST", "/vms/%s/reboot" % vm_id)
    tap.result(status == 200 and vm["state"] == "booting", "reboot_vm: booting", repr(vm)[:300])
    vm = wait_state(port, vm_id, ("ready", "failed"), 300)
    tap.result(vm["state"] == "ready", "... and ready again", repr(vm)[:300])

    paths = vm["paths"]
    status, body = api(port, "DELETE", "/vms/" + vm_id)
    tap.result(status == 204 and body is None, "delete_vm: 204", repr(body))
    left = processes_gone(paths["dir"])
    tap.result(left == [], "... no process left", "\n".join(left))
    tap.result(not os.path.exists(paths["dir"]) and not os.path.exists(paths["volume"]),
               "... no directory, no volume", "%s %s" % (os.path.exists(paths["dir"]), os.path.exists(paths["volume"])))
    status, net = api(port, "GET", "/networks/default")
    tap.result(net["leases"] == [], "... no lease", json.dumps(net))
    status, err = api(port, "GET", "/vms/" + vm_id)
    tap.result(status == 404, "... get_vm: 404", repr(err))
    status, vms = api(port, "GET", "/vms")
    tap.result(vms == [], "... list_vms: []", repr(vms))

    rc, _ = d.stop(signal.SIGTERM, timeout=60)
    tap.result(rc == 0, "SIGTERM: exit 0", "exit %r" % rc)


def sse_tool_call(port, session, name, arguments, token):
    """tools/call with a progressToken: returns (content type, [messages]) from the event stream."""
    import http.client
    conn = http.client.HTTPConnection(HOST, port, timeout=600)
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments, "_meta": {"progressToken": token}}})
    conn.request("POST", "/mcp", body=body, headers={"Content-Type": "application/json",
                                                      "Accept": "application/json, text/event-stream",
                                                      "Mcp-Session-Id": session})
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    ctype = resp.getheader("Content-Type")
    if ctype == "text/event-stream":
        msgs = [json.loads(line[6:]) for line in data.splitlines() if line.startswith("data: ")]
    else:
        msgs = [json.loads(data)]
    return ctype, msgs


def test_mcp_and_shutdown(work):
    state = os.path.join(work, "s2")
    port = free_port()
    d = start_daemon(work, "mcp", state, port)
    mcp = McpClient(port)
    mcp.initialize()

    # With a progressToken, create_vm answers as an event stream: one notifications/progress per
    # state change, then the result.
    ctype, msgs = sse_tool_call(port, mcp.session, "create_vm", dict(CREATE, name="watched", wait_for="installed"),
                                "tok-1")
    notes = [m for m in msgs if m.get("method") == "notifications/progress"]
    final = msgs[-1] if msgs else {}
    tap.result(ctype == "text/event-stream" and notes and all(n["params"]["progressToken"] == "tok-1" for n in notes)
               and [n["params"]["progress"] for n in notes] == list(range(1, len(notes) + 1))
               and any(n["params"]["message"].endswith(" is installing") for n in notes),
               "MCP create_vm with a progressToken: progress notifications per state, numbered",
               "%s %r" % (ctype, msgs)[:600])
    watched = tool_json(final.get("result", {}))[0] if "result" in final and not final["result"].get("isError") else None
    tap.result(final.get("id") == 7 and watched and watched.get("installedAt"),
               "... and the last event is the result, at the milestone", repr(final)[:400])
    if watched:
        mcp.call("delete_vm", {"id": watched["id"]})

    result = mcp.call("create_vm", dict(CREATE, name="agent", wait_for="none"))
    vm = tool_json(result)[0] if not result.get("isError") else None
    tap.result(vm is not None and vm["state"] == "installing",
               "MCP create_vm (wait_for none): answered while installing", repr(result)[:400])
    if not vm:
        return
    vm_id = vm["id"]
    result = mcp.call("get_vm", {"id": vm_id})
    tap.result(tool_json(result)[0]["id"] == vm_id, "MCP get_vm finds it", repr(result)[:300])

    # The daemon stops its plain-child VMs on SIGTERM, and leaves the record stopped.
    vm = wait_state(port, vm_id, ("booting", "ready", "failed"), 300)
    rc, _ = d.stop(signal.SIGTERM, timeout=90)
    tap.result(rc == 0, "SIGTERM with a VM running: exit 0", "exit %r" % rc)
    left = processes_gone(os.path.join(state, "vms"))
    tap.result(left == [], "... and the VM's processes are gone", "\n".join(left))
    with open(os.path.join(state, "vms", vm_id, "vm.json")) as f:
        rec = json.load(f)
    tap.result(rec["state"] in ("stopped", "failed"), "... the record says %s" % rec["state"], json.dumps(rec)[:300])

    port = free_port()
    d = start_daemon(work, "mcp-again", state, port)
    mcp = McpClient(port)
    mcp.initialize()
    result = mcp.call("delete_vm", {"id": vm_id})
    tap.result(tool_json(result)[0] == {"id": vm_id, "deleted": True}, "MCP delete_vm: {id, deleted}",
               repr(result)[:300])
    d.stop(signal.SIGTERM, timeout=60)


def test_kill9(work):
    state = os.path.join(work, "s3")
    port = free_port()
    d = start_daemon(work, "kill9", state, port)
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="orphan"))
    tap.result(status == 201 and vm["state"] == "ready", "create_vm: ready", repr(vm)[:300])
    if status != 201:
        return
    d.proc.kill()
    d.proc.wait()
    left = processes_gone(vm["paths"]["dir"])
    tap.result(left == [], "kill -9 of the daemon: the VM's processes end with it", "\n".join(left))

    port = free_port()
    d = start_daemon(work, "kill9-again", state, port)
    status, again = api(port, "GET", "/vms/" + vm["id"])
    tap.result(status == 200 and again["state"] == "stopped" and "could not reattach" in again.get("lastError", ""),
               "after the restart: stopped, with a note in lastError", repr(again)[:400])
    status, again = api(port, "POST", "/vms/%s/start" % vm["id"])
    tap.result(status == 200 and again["state"] == "booting", "start_vm boots it again", repr(again)[:300])
    again = wait_state(port, vm["id"], ("ready", "failed"), 300)
    tap.result(again["state"] == "ready", "... to ready", repr(again)[:300])
    d.stop(signal.SIGTERM, timeout=60)


def test_install_failure(work):
    # An "image" whose UKI is not one: OVMF never gets anywhere, the installer overruns.
    images = os.path.join(work, "bad-images")
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "broken_1.0" + ext), "wb") as f:
            f.write(b"\0" * 65536)
    state = os.path.join(work, "s4")
    port = free_port()
    d = Daemon(work, "broken", ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                                "--install-timeout", "15s", "--stop-timeout", "2s"], env=base_env(work))
    d.wait_healthy(port, timeout=20)
    status, err = api(port, "POST", "/vms", dict(CREATE, name="doomed", wait_for="installed"))
    msg = err["error"]["message"] if err and "error" in err else ""
    tap.result(status == 500 and err["error"]["code"] == "vm_failed" and "installer did not finish within 15s" in msg,
               "an installer that overruns: 500 vm_failed, with the VM id", repr(err)[:400])
    status, vms = api(port, "GET", "/vms")
    tap.result(len(vms) == 1 and vms[0]["state"] == "failed"
               and vms[0].get("lastError") == "installer did not finish within 15s" and vms[0].get("consoleTail"),
               "... the VM is kept, failed: the cause in lastError, the console's tail in consoleTail",
               repr([(v.get("state"), v.get("lastError"), (v.get("consoleTail") or "")[-200:]) for v in vms]))

    # A guest that ignores ACPI (firmware with nothing to boot): stop_vm escalates to SIGTERM after
    # --stop-timeout.
    status, vm = api(port, "POST", "/vms", dict(CREATE, name="stubborn", wait_for="none"))
    tap.result(status == 201 and vm["state"] == "installing", "create_vm (wait_for none): installing", repr(vm)[:300])
    t0 = time.monotonic()
    status, vm = api(port, "POST", "/vms/%s/stop" % vm["id"])
    took = time.monotonic() - t0
    tap.result(status == 200 and vm["state"] == "stopped" and 2.0 <= took < 10.0,
               "stop_vm of a guest that ignores ACPI: SIGTERM after the 2s stop timeout (%.1f s)" % took,
               repr(vm)[:300])
    left = processes_gone(vm["paths"]["dir"])
    tap.result(left == [], "... and nothing of it runs", "\n".join(left))
    d.stop(signal.SIGTERM, timeout=30)


def test_guest_exit(work):
    # A guest whose PID 1 exits with a failure instead of sending READY=1 (the test init plays it
    # for the hostname exit-70; the guest image does it instead of sitting in emergency mode).
    state = os.path.join(work, "s5")
    port = free_port()
    d = start_daemon(work, "exiter", state, port)
    try:
        status, err = api(port, "POST", "/vms", dict(CREATE, name="exiter", hostname="exit-70"))
        tap.result(status == 500 and (err or {}).get("error", {}).get("code") == "vm_failed",
                   "create_vm of a guest that exits with status 70: 500 vm_failed", repr(err)[:400])
        status, vms = api(port, "GET", "/vms")
        last = vms[0].get("lastError", "") if vms else ""
        tail = vms[0].get("consoleTail", "") if vms else ""
        tap.result(vms and vms[0]["state"] == "failed" and last == "guest shut down (EXIT_STATUS=70)"
                   and tail and "\x1b" not in tail and "\r" not in tail,
                   "... failed, lastError names EXIT_STATUS=70, the console's tail (no escapes) is in consoleTail",
                   repr(vms)[:600])
    finally:
        d.stop(signal.SIGTERM, timeout=60)


if __name__ == "__main__":
    missing = missing_tools()
    if missing or not IMAGE_DIR:
        print("TAP version 13\n1..0 # SKIP needs %s" % (", ".join(missing) if missing else "VM_MANAGER_TEST_IMAGE_DIR"))
        sys.exit(0)
    build = subprocess.run(["bash", os.path.join(SOURCE_ROOT, "tests/image/build.sh"), IMAGE_DIR],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if build.returncode != 0:
        print("TAP version 13\nnot ok 1 - tests/image/build.sh\n# " +
              build.stdout.decode(errors="replace").replace("\n", "\n# ") + "\n1..1")
        sys.exit(1)
    sys.exit(run([test_lifecycle, test_mcp_and_shutdown, test_kill9, test_install_failure, test_guest_exit], 1500,
                 "vmm-vm-"))
