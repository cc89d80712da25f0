#!/usr/bin/env python3
"""The network data plane through the daemon: VMs whose NIC is played by tests/net/fake-guest (a
small guest with its own IPv4 stack, listening on the VM's -netdev stream socket as QEMU does),
started by the fake QEMU of tests/integration/fakes. Two networks with the same CIDR, three guests:

  a (net1)  DHCP with the network's options, the IMDS through 169.254.169.254, a guest on the same
            network, NAT to a host address; and what must fail: host loopback, the host alias,
            link-local, the IMDS proxy address itself;
  b (net1)  serves TCP for a;
  c (net2)  same addresses as net1, and must not reach b;
  p (net2)  holds net2's .2 with no guest on its NIC;

The IMDS itself is also asked directly on a VM's listener (<vm>/imds.sock), as the gateway does.
"""

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
from vmmtest import (  # noqa: E402
    FAKES,
    HOST,
    Daemon,
    McpClient,
    base_env,
    fake_daemon,
    fake_image_dir,
    forward_read,
    free_port,
    http_request,
    imds_request,
    run,
    tap,
    tool_json,
    wait_state,
)

CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False, "wait_for": "none"}


def api(port, method, path, body=None, timeout=60):
    status, headers, data = http_request(port, method, "/api/v1" + path,
                                         body=json.dumps(body).encode() if body is not None else None,
                                         timeout=timeout)
    return status, (json.loads(data) if data else None)


def host_address():
    """A non-loopback IPv4 address of this host, for the NAT check; None when there is none."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("192.0.2.1", 9))  # no packet leaves: this only picks the route's source
        addr = s.getsockname()[0]
        s.close()
        return None if addr.startswith("127.") else addr
    except OSError:
        return None


def listener(addr):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 0))
    s.listen(16)
    hits = []

    def loop():
        while True:
            try:
                c, peer = s.accept()
            except OSError:
                return
            hits.append(peer)
            c.close()
    threading.Thread(target=loop, daemon=True).start()
    return s.getsockname()[1], hits


def wait_guest(vmdir, timeout=60):
    path = os.path.join(vmdir, "fake-guest.out")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                text = f.read()
            if "\nexit " in "\n" + text:
                return text
        except OSError:
            pass
        time.sleep(0.2)
    try:
        with open(path) as f:
            return f.read() + "\n(timed out)"
    except OSError:
        return "(no output)"


def check(out, expect, what):
    """expect: a substring of the line the action printed, e.g. 'ok http 169.254.169.254:80'"""
    found = [l for l in out.splitlines() if l.startswith(expect)]
    tap.result(bool(found), what, found[0] if found else "want %r in:\n%s" % (expect, out))
    return found[0] if found else ""


def test_network(work):
    guest = os.environ.get("FAKE_GUEST")
    if not guest or not os.access(guest, os.X_OK):
        tap.skip("network", "FAKE_GUEST (tests/net/fake-guest) not built")
        return
    images = os.path.join(work, "images")
    os.makedirs(os.path.join(images, "sysupdate", "kubernetes"))
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    with open(os.path.join(images, "sysupdate", "kubernetes", "kubernetes_1.31.raw"), "wb") as f:
        f.write(b"sysext bytes")
    vars_ = os.path.join(work, "vars")
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)

    hostip = host_address()
    loop_port, loop_hits = listener("127.0.0.1")
    nat_port, nat_hits = listener(hostip) if hostip else (None, [])
    api_port = free_port()

    plan = {
        "guest-b": ["--timeout-ms", "20000", "dhcp", "serve", "8080"],
        "guest-a": ["--timeout-ms", "4000", "dhcp", "arp", "10.50.0.1",
                    "http", "169.254.169.254:80", "/giantswarm/v1/hostname",
                    "http", "169.254.169.254:80", "/giantswarm/v1/instance-id",
                    "sleep", "1000",
                    "tcp", "10.50.0.2:8080",
                    "tcp-fail", "127.0.0.1:%d" % loop_port,
                    "tcp-fail", "127.0.0.1:%d" % api_port,
                    "tcp-fail", "10.50.0.254:%d" % loop_port,
                    "tcp-fail", "169.254.1.1:80",
                    "tcp-fail", "10.50.0.0:2"]
        + (["tcp", "%s:%d" % (hostip, nat_port)] if hostip else []),
        "guest-c": ["--timeout-ms", "4000", "dhcp", "sleep", "1500", "tcp-fail", "10.50.0.2:8080"],
    }
    plan_file = os.path.join(work, "plan.json")
    with open(plan_file, "w") as f:
        json.dump(plan, f)

    env = base_env(work, FAKE_QEMU="", FAKE_GUEST=guest, FAKE_GUEST_PLAN=plan_file)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    state = os.path.join(work, "state")
    d = Daemon(work, "net", ["--listen", "%s:%d" % (HOST, api_port), "--state-dir", state,
                             "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                             "--launcher", "process", "--log-level", "debug"], env=env)
    ok, why = d.wait_healthy(api_port, timeout=20)
    tap.result(ok, "serving with the fake QEMU and fake guests", why)
    if not ok:
        return

    for name in ("net1", "net2"):
        status, n = api(api_port, "POST", "/networks",
                        {"name": name, "cidr": "10.50.0.0/24", "dns_search_domain": "corp.example.com"})
        tap.result(status == 201, "create_network %s 10.50.0.0/24 (the same CIDR twice)" % name, repr(n)[:200])

    vms = {}
    # net2's .2 is held by a VM without a guest on its NIC, so that c (.3) asks for .2, which is b on net1
    for host, net in (("guest-b", "net1"), ("guest-a", "net1"), ("guest-p", "net2"), ("guest-c", "net2")):
        status, vm = api(api_port, "POST", "/vms", dict(CREATE, name=host, hostname=host, network=net,
                                                         metadata={"role": "worker"}))
        tap.result(status == 201, "create_vm %s on %s" % (host, net), repr(vm)[:300])
        if status != 201:
            d.stop(signal.SIGTERM, timeout=30)
            return
        vms[host] = vm
    ips = {h: v["ip"] for h, v in vms.items()}
    tap.result(ips == {"guest-b": "10.50.0.2", "guest-a": "10.50.0.3", "guest-p": "10.50.0.2", "guest-c": "10.50.0.3"},
               "leases: the lowest free address on each network, the same addresses on both", repr(ips))
    vmdir = {h: os.path.join(state, "vms", v["id"]) for h, v in vms.items()}

    out_a = wait_guest(vmdir["guest-a"])
    out_b = wait_guest(vmdir["guest-b"], timeout=30)
    out_c = wait_guest(vmdir["guest-c"])

    check(out_a, "ok dhcp ip=%s router=10.50.0.1 dns=10.50.0.1 mask=255.255.255.0 mtu=1500" % ips["guest-a"],
          "a: DHCP gives the static lease, router, DNS, mask and MTU")
    l = check(out_a, "ok dhcp", "a: DHCP lease time and search domain")
    tap.result("search=corp.example.com" in l and "lease=" in l, "a: ... option 119 carries corp.example.com", l)
    check(out_a, "ok arp 10.50.0.1 is-at", "a: the gateway answers ARP")
    check(out_a, "ok http 169.254.169.254:80 /giantswarm/v1/hostname status=200 body=guest-a",
          "a: the IMDS at 169.254.169.254 answers its hostname")
    check(out_a, "ok http 169.254.169.254:80 /giantswarm/v1/instance-id status=200 body=%s" % vms["guest-a"]["id"],
          "a: ... and its instance id: the listener is the identity")
    check(out_a, "ok tcp 10.50.0.2:8080", "a: reaches b on the same network")
    check(out_a, "ok tcp-fail 127.0.0.1:%d" % loop_port, "a: cannot reach a host loopback listener")
    check(out_a, "ok tcp-fail 127.0.0.1:%d" % api_port, "a: cannot reach the daemon's own API on loopback")
    check(out_a, "ok tcp-fail 10.50.0.254:%d" % loop_port, "a: the host alias is off by default")
    check(out_a, "ok tcp-fail 169.254.1.1:80", "a: link-local addresses other than the IMDS are dropped")
    check(out_a, "ok tcp-fail 10.50.0.0:2", "a: the IMDS proxy address cannot be reached directly")
    tap.result(loop_hits == [], "the loopback listener saw no connection", repr(loop_hits))
    if hostip:
        check(out_a, "ok tcp %s:%d" % (hostip, nat_port), "a: NAT to a host address works")
    else:
        tap.skip("a: NAT to a host address", "this host has no non-loopback IPv4 address")
    check(out_c, "ok dhcp ip=10.50.0.3", "c: DHCP on the second network, the same address as a")
    check(out_c, "ok tcp-fail 10.50.0.2:8080", "c: cannot reach b, whose address is on the first network")
    check(out_b, "ok dhcp", "b: DHCP")

    # the IMDS on a VM's own listener, as the gateway reaches it
    sock = os.path.join(vmdir["guest-a"], "imds.sock")
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/hostname")
    tap.result(st == 200 and body == b"guest-a" and h.get("content-type") == "text/plain; charset=utf-8",
               "imds: /hostname is the VM's hostname, text/plain, no newline added", "%d %r %r" % (st, h, body))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/region")
    tap.result(st == 200 and body == socket.gethostname().encode(), "imds: /region is the host's name",
               "%d %r" % (st, body))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/zone")
    tap.result(st == 200 and body == b"net1", "imds: /zone is the network", "%d %r" % (st, body))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/public-keys/")
    tap.result(st == 200 and body == b"0", "imds: /public-keys/ lists index 0", "%d %r" % (st, body))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/public-keys/0")
    tap.result(st == 200 and body.startswith(b"ssh-ed25519 ") and body.endswith(b"vm-manager@" + vms["guest-a"]["id"].encode()),
               "imds: /public-keys/0 is the VM's own key", "%d %r" % (st, body[:80]))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/public-keys/7")
    tap.result(st == 404 and body == b"", "imds: a missing key is a 404 with an empty body", "%d %r" % (st, body))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/metadata/role")
    tap.result(st == 200 and body == b"worker", "imds: /metadata/role", "%d %r" % (st, body))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/user-data")
    tap.result(st == 503 and h.get("retry-after") == "2"
               and body == b"user-data is released after the initrd-stage attestation verifies",
               "imds: user-data is gated (503, Retry-After) until the installed boot", "%d %r %r" % (st, h, body))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/sysupdate/kubernetes/kubernetes_1.31.raw")
    tap.result(st == 200 and body == b"sysext bytes", "imds: a sysupdate file from the image directory", "%d %r" % (st, body))
    st, h, body = imds_request(sock, "GET", "/giantswarm/v1/sysupdate/kubernetes/../../fake_1.0.raw")
    tap.result(st != 200, "imds: no way out of the sysupdate tree", "%d" % st)
    st, h, body = imds_request(sock, "POST", "/giantswarm/v1/report", b'{"ok": true}')
    tap.result(st == 204 and os.path.exists(os.path.join(vmdir["guest-a"], "report.json")),
               "imds: a report upload is stored, 204", "%d %r" % (st, body))
    st, h, body = imds_request(sock, "POST", "/giantswarm/v1/report", b'not json')
    tap.result(st == 400 and body == b"report is not valid JSON", "imds: a report that is not JSON is a 400", "%d %r" % (st, body))
    st, h, body = imds_request(sock, "POST", "/giantswarm/v1/hostname", b"")
    tap.result(st == 405, "imds: the wrong method is a 405", "%d" % st)

    # the network records show the leases
    status, n = api(api_port, "GET", "/networks/net1")
    tap.result(status == 200 and sorted(l["ip"] for l in n["leases"]) == ["10.50.0.2", "10.50.0.3"],
               "get_network lists the leases", repr(n)[:300])

    # deleting a VM: its listener answers no more
    status, _ = api(api_port, "DELETE", "/vms/" + vms["guest-c"]["id"], timeout=60)
    tap.result(status in (200, 204) and not os.path.exists(vmdir["guest-c"]),
               "delete_vm removes the VM with its metadata listener", "%d" % status)
    d.stop(signal.SIGTERM, timeout=30)


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw)


def test_exec_forward(work):
    """exec_vm and forward_port against a real sshd: the VM's NIC is a tap in a network namespace
    (the fake QEMU's tap mode), where sshd trusts the VM's own key."""
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None)
    if os.geteuid() != 0 or not sshd or not os.path.exists("/dev/net/tun") or not shutil.which("ip"):
        tap.skip("exec_vm and forward_port against sshd", "needs root, /dev/net/tun, ip and sshd (openssh-server)")
        return
    ns = "vmm-exec-%d" % os.getpid()
    sh("ip", "netns", "add", ns)
    procs = []
    try:
        run_exec_forward(work, ns, sshd, procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def start_sshd(work, ns, sshd, ip, pubkey, name):
    key = os.path.join(work, "host-" + name)
    if not os.path.exists(key):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
    auth = os.path.join(work, "authorized_keys")
    with open(auth, "w") as f:
        f.write(pubkey + "\n")
    os.chmod(auth, 0o600)
    conf = os.path.join(work, "sshd_config-" + name)
    with open(conf, "w") as f:
        f.write("Port 22\nListenAddress %s\nHostKey %s\nAuthorizedKeysFile %s\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "PidFile none\n" % (ip, key, auth))
    os.makedirs("/run/sshd", exist_ok=True)
    p = subprocess.Popen(["ip", "netns", "exec", ns, sshd, "-D", "-e", "-f", conf],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "sshd-%s.log" % name), "w"))
    for _ in range(50):
        if subprocess.run(["ip", "netns", "exec", ns, "bash", "-c", "exec 3<>/dev/tcp/%s/22" % ip],
                          capture_output=True).returncode == 0 or p.poll() is not None:
            break
        time.sleep(0.1)
    return p


def run_exec_forward(work, ns, sshd, procs):
    images, vars_ = fake_image_dir(work, "x")
    tapname = "vmmx%d" % (os.getpid() % 100000)
    plan_file = os.path.join(work, "plan-x.json")
    with open(plan_file, "w") as f:
        json.dump({"sshguest": {"netns": ns, "tap": tapname}}, f)
    env = base_env(work, FAKE_QEMU="", FAKE_GUEST=os.environ.get("FAKE_GUEST", ""), FAKE_GUEST_PLAN=plan_file)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, "exec", ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "state-x"),
                              "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                              "--launcher", "process", "--log-level", "debug"], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "exec: serving", why)
    if not ok:
        return
    try:
        status, vm = api(port, "POST", "/vms", dict(CREATE, name="sshguest", hostname="sshguest"))
        tap.result(status == 201, "exec: create_vm whose NIC is a tap with an sshd behind it", repr(vm)[:300])
        if status != 201:
            return
        vid, ip, mac = vm["id"], vm["ip"], vm["mac"]
        gw = ip.rsplit(".", 1)[0] + ".1"
        for _ in range(50):
            if subprocess.run(["ip", "-n", ns, "link", "show", tapname], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        sh("ip", "-n", ns, "link", "set", tapname, "address", mac)
        sh("ip", "-n", ns, "link", "set", tapname, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", tapname)
        sh("ip", "-n", ns, "route", "add", "default", "via", gw)
        # no sshd in the guest yet, which is still installing: come back later, not an internal error
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["true"]}, timeout=60)
        msg = ((r or {}).get("error") or {}).get("message", "") if isinstance(r, dict) else ""
        tap.result(status == 409 and r["error"]["code"] == "conflict"
                   and msg.startswith("conflict: vm %s is installing and its sshd does not answer yet (" % vid)
                   and msg.endswith("); try again once it is ready"),
                   "exec_vm before the guest's sshd answers, while it installs: 409 conflict, try again", repr(r)[:400])
        procs.append(start_sshd(work, ns, sshd, ip, vm["sshPublicKey"], "a"))

        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["echo", "hello", "it's"]}, timeout=60)
        tap.result(status == 200 and r == {"stdout": "hello it's\n", "stderr": "", "exitCode": 0},
                   "exec_vm runs the command as root over ssh, words quoted for the shell", repr(r)[:300])
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["sh", "-c", "echo oops >&2; exit 3"]})
        tap.result(status == 200 and r == {"stdout": "", "stderr": "oops\n", "exitCode": 3},
                   "exec_vm: a non-zero exit is a result with stderr", repr(r)[:300])
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["id", "-u"]})
        tap.result(status == 200 and r.get("stdout") == "0\n", "exec_vm: as root", repr(r)[:300])
        pin = os.path.join(work, "state-x", "vms", vid, "ssh_host_key")
        pinned = open(pin).read() if os.path.exists(pin) else ""
        tap.result(pinned.startswith("ssh-ed25519 ") and oct(os.stat(pin).st_mode & 0o777) == "0o600",
                   "exec_vm pins the host key on first use (ssh_host_key, 0600)", pinned[:80])
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["head", "-c", "1500000", "/dev/zero"]})
        tap.result(status == 200 and len(r.get("stdout", "")) == 1 << 20 and r.get("stdoutTruncated") is True,
                   "exec_vm keeps the first MiB of output and says it dropped the rest",
                   "%d %d bytes" % (status, len((r or {}).get("stdout", ""))))
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["sleep", "30"], "timeout_seconds": 1})
        tap.result(status == 504 and r["error"]["code"] == "timeout", "exec_vm gives up after timeout_seconds",
                   repr(r)[:300])
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": []})
        tap.result(status == 400 and r["error"]["message"] == "invalid request: command is empty",
                   "exec_vm: an empty command is a 400", repr(r)[:300])

        status, fw = api(port, "POST", "/vms/%s/forward" % vid, {"port": 22})
        banner = b""
        if status == 200:
            h, p = fw["address"].rsplit(":", 1)
            s = socket.create_connection((h, int(p)), timeout=10)
            s.settimeout(10)
            banner = s.recv(64)
            s.close()
        tap.result(status == 200 and fw["id"] == vid and fw["port"] == 22 and fw["address"].startswith("127.0.0.1:")
                   and banner.startswith(b"SSH-2.0"), "forward_port 22: a loopback address that shows sshd's banner",
                   "%r %r" % (fw, banner))
        status, r = api(port, "POST", "/vms/%s/forward" % vid, {"port": 0})
        tap.result(status == 400 and r["error"]["message"] == "invalid request: port 0 out of range",
                   "forward_port: port 0 is out of range", repr(r)[:200])

        # another host key: the pin holds
        procs.pop().kill()
        time.sleep(0.3)
        procs.append(start_sshd(work, ns, sshd, ip, vm["sshPublicKey"], "b"))
        status, r = api(port, "POST", "/vms/%s/exec" % vid, {"command": ["true"]})
        tap.result(status == 500 and r["error"]["message"].endswith("host key of vm %s changed" % vid),
                   "exec_vm refuses a guest whose host key changed", repr(r)[:300])

        status, _ = api(port, "DELETE", "/vms/" + vid, timeout=60)
        refused = False
        if fw and status in (200, 204):
            h, p = fw["address"].rsplit(":", 1)
            try:
                socket.create_connection((h, int(p)), timeout=3).close()
            except OSError:
                refused = True
        tap.result(refused, "delete_vm closes its forwards", fw and fw.get("address"))
    finally:
        d.stop(signal.SIGTERM, timeout=30)


def test_forwards(work):
    """forward_port on the fake guest's TCP server (serve 8080): the same forward again for the same
    port on REST and MCP, the forwards in the VM record, a stopped VM's forward that ends connections
    at once and works again after start_vm, and forwards that come back after a daemon restart, on
    the same port or, when another process took it meanwhile, on a new one."""
    guest = os.environ.get("FAKE_GUEST")
    if not guest or not os.access(guest, os.X_OK):
        tap.skip("forwards", "FAKE_GUEST (tests/net/fake-guest) not built")
        return
    images, vars_ = fake_image_dir(work, "f")
    plan_file = os.path.join(work, "plan-f.json")
    with open(plan_file, "w") as f:
        json.dump({"fwd": ["--timeout-ms", "120000", "dhcp", "serve", "8080"]}, f)
    env = base_env(work, FAKE_QEMU="install-exit:0", FAKE_GUEST=guest, FAKE_GUEST_PLAN=plan_file)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    state = os.path.join(work, "state-f")

    def start(name):
        d, port, ok, why = fake_daemon(work, name, state, images, vars_, env)
        tap.result(ok, "forwards: %s serving" % name, why)
        return d, port, ok

    d, port, ok = start("fwd-1")
    if not ok:
        return
    try:
        status, vm = api(port, "POST", "/vms", dict(CREATE, name="fwd", hostname="fwd"))
        tap.result(status == 201 and vm.get("forwards") == [], "create_vm: the record has an empty forwards array",
                   repr(vm)[:300])
        if status != 201:
            return
        vid = vm["id"]
        hello = ("hello from %s\n" % vm["ip"]).encode()
        # while the installer runs: the forward is the VM's, not the boot's
        status, fw = api(port, "POST", "/vms/%s/forward" % vid, {"port": 8080})
        tap.result(status == 200 and fw["id"] == vid and fw["port"] == 8080 and fw["address"].startswith("127.0.0.1:"),
                   "forward_port 8080 during the install: a loopback address", repr(fw)[:200])
        if status != 200:
            return
        vm = wait_state(port, vid, ("booting",), 60, 0.2)
        tap.result(vm and vm["state"] == "booting", "the fake installer exits 0, the installed boot runs",
                   repr(vm)[:200])
        got = forward_read(fw["address"])
        tap.result(got == ("data", hello), "the forward reaches the guest's server in the installed boot", repr(got))

        status, again = api(port, "POST", "/vms/%s/forward" % vid, {"port": 8080})
        tap.result(status == 200 and again == fw, "forward_port 8080 again (REST): the same forward, same address",
                   "%r, first %r" % (again, fw))
        mcp = McpClient(port)
        mcp.initialize()
        text, sc = tool_json(mcp.call("forward_port", {"id": vid, "port": 8080}))
        tap.result(text == fw and sc == fw, "forward_port 8080 again (MCP): the same forward, same address",
                   "%r %r" % (text, sc))
        status, fw2 = api(port, "POST", "/vms/%s/forward" % vid, {"port": 9090})
        tap.result(status == 200 and fw2["address"] != fw["address"], "forward_port 9090: another address",
                   repr(fw2)[:200])
        want = [{"port": 8080, "address": fw["address"]}, {"port": 9090, "address": fw2["address"]}]
        status, rec = api(port, "GET", "/vms/" + vid)
        tap.result(status == 200 and rec.get("forwards") == want, "get_vm lists both forwards (REST)",
                   repr(rec.get("forwards")))
        text, sc = tool_json(mcp.call("get_vm", {"id": vid}))
        tap.result(text.get("forwards") == want and sc.get("forwards") == want, "get_vm lists both forwards (MCP)",
                   repr(text.get("forwards")))
        status, vms = api(port, "GET", "/vms")
        tap.result(status == 200 and [v.get("forwards") for v in vms] == [want], "list_vms shows them too",
                   repr(vms)[:300])
        text, sc = tool_json(mcp.call("list_vms"))
        tap.result([v.get("forwards") for v in text] == [want] and [v.get("forwards") for v in sc["vms"]] == [want],
                   "... on MCP as well", repr(sc)[:300])
        with open(os.path.join(state, "vms", vid, "vm.json")) as f:
            disk = json.load(f)
        tap.result(disk.get("forwards") == want, "vm.json keeps them", repr(disk.get("forwards")))

        # stopped: the forward stays, and a connection ends at once instead of hanging
        status, rec = api(port, "POST", "/vms/%s/stop" % vid)
        tap.result(status == 200 and rec["state"] == "stopped" and rec.get("forwards") == want,
                   "stop_vm: stopped, the forwards still listed", repr(rec)[:300])
        t0 = time.monotonic()
        got = forward_read(fw["address"], timeout=20)
        tap.result(got == ("closed", b""),
                   "a forward of a stopped VM ends the connection at once (%.2f s)" % (time.monotonic() - t0),
                   repr(got))
        status, rec = api(port, "POST", "/vms/%s/start" % vid)
        tap.result(status == 200, "start_vm", repr(rec)[:300])
        got = forward_read(fw["address"])
        tap.result(got == ("data", hello), "... and the same forward reaches the guest again", repr(got))
    finally:
        d.stop(signal.SIGTERM, timeout=30)

    # the process launcher stops the VM with the daemon; its forwards come back with the next one
    d, port, ok = start("fwd-2")
    if not ok:
        return
    try:
        status, rec = api(port, "GET", "/vms/" + vid)
        tap.result(status == 200 and rec["state"] == "stopped" and rec.get("forwards") == want,
                   "after a restart: the forwards are listed, same addresses", repr(rec)[:300])
        got = forward_read(fw["address"])
        tap.result(got == ("closed", b""), "... and listen (the VM is stopped: the connection ends)", repr(got))
    finally:
        d.stop(signal.SIGTERM, timeout=30)

    # another process takes 8080's host port while no daemon runs: the next one moves the forward
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the TIME_WAIT of the last connection
    taken.bind(("127.0.0.1", int(fw["address"].rsplit(":", 1)[1])))
    taken.listen(1)
    try:
        d, port, ok = start("fwd-3")
        if not ok:
            return
        try:
            status, rec = api(port, "GET", "/vms/" + vid)
            moved = (rec or {}).get("forwards") or []
            tap.result(status == 200 and len(moved) == 2 and moved[0]["port"] == 8080
                       and moved[0]["address"] not in (fw["address"], fw2["address"]) and moved[1] == want[1],
                       "a host port taken meanwhile: that forward moves to a new port, the other stays",
                       "%r, before %r" % (moved, want))
            tap.result("was taken by another process; the forward moved to %s" % (moved[0]["address"] if moved else "?")
                       in d.stderr(), "... and the daemon says so in its log", d.stderr()[-600:])
            with open(os.path.join(state, "vms", vid, "vm.json")) as f:
                disk = json.load(f)
            tap.result(disk.get("forwards") == moved, "... and records the new address", repr(disk.get("forwards")))
            status, rec = api(port, "POST", "/vms/%s/start" % vid)
            got = forward_read(moved[0]["address"]) if moved else None
            tap.result(status == 200 and got == ("data", hello), "start_vm: the moved forward reaches the guest",
                       repr(got))
            # a VM has at most 32 forwards; at the limit, the ones it has are still answered
            codes = [api(port, "POST", "/vms/%s/forward" % vid, {"port": 10000 + i})[0] for i in range(30)]
            status, r = api(port, "POST", "/vms/%s/forward" % vid, {"port": 11000})
            tap.result(codes == [200] * 30 and status == 409 and r["error"]["code"] == "conflict"
                       and r["error"]["message"] == "conflict: vm %s has 32 forwards, the most a VM can have" % vid,
                       "a 33rd forward is a conflict", "%r %r" % (codes, r))
            status, r = api(port, "POST", "/vms/%s/forward" % vid, {"port": 8080})
            tap.result(status == 200 and r["address"] == moved[0]["address"], "... an existing one is still answered",
                       repr(r))
            status, _ = api(port, "DELETE", "/vms/" + vid, timeout=60)
            gone = [forward_read(f["address"], timeout=3)[0] for f in moved]
            tap.result(status == 204 and gone == ["refused", "refused"], "delete_vm closes every forward", repr(gone))
        finally:
            d.stop(signal.SIGTERM, timeout=30)
    finally:
        taken.close()


def test_host_alias(work):
    """create_network's enable_host_alias: with it on (REST), a guest reaches a host loopback listener
    through the network's .254; with it off (MCP, explicitly false), it does not."""
    guest = os.environ.get("FAKE_GUEST")
    if not guest or not os.access(guest, os.X_OK):
        tap.skip("host alias", "FAKE_GUEST (tests/net/fake-guest) not built")
        return
    images, vars_ = fake_image_dir(work, "h")
    loop_port, loop_hits = listener("127.0.0.1")
    plan_file = os.path.join(work, "plan-h.json")
    with open(plan_file, "w") as f:
        json.dump({"ha-on": ["--timeout-ms", "4000", "dhcp", "tcp", "10.61.0.254:%d" % loop_port],
                   "ha-off": ["--timeout-ms", "4000", "dhcp", "tcp-fail", "10.62.0.254:%d" % loop_port]}, f)
    env = base_env(work, FAKE_QEMU="", FAKE_GUEST=guest, FAKE_GUEST_PLAN=plan_file)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    state = os.path.join(work, "state-h")
    d, port, ok, why = fake_daemon(work, "alias", state, images, vars_, env)
    tap.result(ok, "alias: serving", why)
    if not ok:
        return
    try:
        status, n = api(port, "POST", "/networks", {"name": "alias-on", "cidr": "10.61.0.0/24",
                                                     "enable_host_alias": True})
        tap.result(status == 201 and n["spec"].get("enableHostAlias") is True,
                   "create_network enable_host_alias true (REST): the spec says so", repr(n)[:300])
        mcp = McpClient(port)
        mcp.initialize()
        text, sc = tool_json(mcp.call("create_network", {"name": "alias-off", "cidr": "10.62.0.0/24",
                                                         "enable_host_alias": False}))
        tap.result("enableHostAlias" not in text["spec"] and sc == text,
                   "create_network enable_host_alias false (MCP): off, as by default", repr(text)[:300])
        status, n = api(port, "GET", "/networks/alias-on")
        text, _ = tool_json(mcp.call("get_network", {"name": "alias-on"}))
        tap.result(status == 200 and n["spec"].get("enableHostAlias") is True and text == n,
                   "get_network shows enableHostAlias on REST and MCP", repr(n)[:300])
        vmdir = {}
        for host, net in (("ha-on", "alias-on"), ("ha-off", "alias-off")):
            status, vm = api(port, "POST", "/vms", dict(CREATE, name=host, hostname=host, network=net))
            tap.result(status == 201, "create_vm %s on %s" % (host, net), repr(vm)[:300])
            if status != 201:
                return
            vmdir[host] = os.path.join(state, "vms", vm["id"])
        out_on, out_off = wait_guest(vmdir["ha-on"]), wait_guest(vmdir["ha-off"])
        check(out_on, "ok tcp 10.61.0.254:%d" % loop_port,
              "alias on: the guest reaches the host's 127.0.0.1 through 10.61.0.254")
        check(out_off, "ok tcp-fail 10.62.0.254:%d" % loop_port, "alias off: 10.62.0.254 reaches nothing")
        tap.result(len(loop_hits) == 1, "the loopback listener saw exactly the one connection", repr(loop_hits))
    finally:
        d.stop(signal.SIGTERM, timeout=30)


if __name__ == "__main__":
    sys.exit(run([test_network, test_exec_forward, test_forwards, test_host_alias], 300, "vmm-net-"))
