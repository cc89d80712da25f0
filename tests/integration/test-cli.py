#!/usr/bin/env python3
"""The client commands (vm-manager vm|network|image list|host) against a daemon on the fake QEMU, as a
person or a script runs them: tables, --output json, create's progress on a terminal (a pty), the
console followed as it grows, exec with stdin and the exit status through a real sshd (the fake QEMU's
tap mode in a network namespace, as test-network does), and the exit status and message of each
error code a user meets first: not_found, conflict, invalid_request."""

import http.server
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import BIN, FAKES, HOST, Daemon, base_env, fake_image_dir, free_port, run, start_thread, tap  # noqa: E402
from vmmtest import api as rest  # noqa: E402

NO_ATTEST = ["--memory-mib", "512", "--disk-gib", "1", "--no-require-attestation"]


def cli(port, *args, stdin=None, env_extra=None, timeout=120):
    env = base_env("/tmp", VM_MANAGER_URL="%s:%d" % (HOST, port))
    env.update(env_extra or {})
    p = subprocess.run([BIN, *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def cli_pty(port, *args, timeout=120):
    """Runs the client with its stdin, stdout and stderr on a terminal: (exit status, what it wrote)."""
    env = base_env("/tmp", VM_MANAGER_URL="%s:%d" % (HOST, port))
    master, slave = pty.openpty()
    p = subprocess.Popen([BIN, *args], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    return p.returncode, out.decode(errors="replace")


def start(work, name, extra_env=None):
    images, vars_ = fake_image_dir(work, name)
    env = base_env(work, FAKE_QEMU="install-exit:0", FAKE_READY_AFTER="2", **(extra_env or {}))
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "state-" + name),
                            "--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                            "--launcher", "process", "--vsock", "vhost-user", "--log-level", "debug"], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "%s: serving" % name, why)
    return d, port, ok


def test_commands(work):
    d, port, ok = start(work, "cli")
    if not ok:
        return
    try:
        rc, out, err = cli(port, "vm", "list")
        tap.result(rc == 0 and out == "No VMs.\n", "vm list with no VMs: says so", "%d %r %r" % (rc, out, err))

        rc, out = cli_pty(port, "vm", "create", "web", *NO_ATTEST)
        lines = [l for l in out.replace("\x1b[K", "").replace("\r", "\n").split("\n") if l.strip()]
        states = [l.split("] ", 1)[1].split(":")[0] for l in lines if l.startswith("[") and "s] " in l]
        tap.result(rc == 0 and "installing" in states and states[-1] == "ready"
                   and states.index("installing") < states.index("ready"),
                   "vm create on a terminal: the states as they happen, ending ready", repr(out)[-600:])
        tap.result("\x1b[K" in out and any(c + " " in out for c in "|/-\\"),
                   "vm create on a terminal: one line kept alive by a spinner", repr(out)[:400])
        tap.result("Next: vm-manager vm shell web" in out, "vm create ends with the command to run next",
                   repr(out)[-300:])

        rc, out, err = cli(port, "vm", "create", "plain", *NO_ATTEST)
        tap.result(rc == 0 and "\x1b" not in err and "] ready" in err and "Next: vm-manager vm shell plain" in out,
                   "vm create into a pipe: plain lines, no terminal codes", repr(err)[-300:])

        rc, out, err = cli(port, "vm", "list")
        rows = [l.split() for l in out.splitlines()]
        tap.result(rc == 0 and rows[0][:4] == ["NAME", "ID", "STATE", "IP"]
                   and sorted(r[0] for r in rows[1:]) == ["plain", "web"] and all(r[2] == "ready" for r in rows[1:]),
                   "vm list: a table of the VMs", out)
        rc, out, err = cli(port, "vm", "list", "--output", "json")
        vms = json.loads(out) if rc == 0 else []
        status, want = rest(port, "GET", "/vms")
        tap.result(rc == 0 and vms == want, "vm list --output json: the API's JSON", out[:300])
        web = next(v for v in vms if v["name"] == "web")
        plain_id = next(v for v in vms if v["name"] == "plain")["id"]

        rc, out, err = cli(port, "vm", "get", web["id"], "-o", "json")
        tap.result(rc == 0 and json.loads(out)["name"] == "web", "vm get by id", err)

        # the error paths: the API's message as it is, and the exit status of its code
        rc, out, err = cli(port, "vm", "get", "nope")
        tap.result(rc == 4 and err == 'not found: vm "nope"\n' and out == "",
                   "not_found: exit 4 and the API's message", "%d %r" % (rc, err))
        rc, out, err = cli(port, "vm", "create", "web", *NO_ATTEST)
        tap.result(rc == 5 and ('conflict: vm name "web" is in use by %s\n' % web["id"]) in err
                   and "] ready" not in err, "conflict: exit 5, and no progress shown of the other VM", repr(err))
        rc, out, err = cli(port, "network", "create", "lab", "--cidr", "10.1.2.3/24")
        tap.result(rc == 3 and err.startswith("invalid request: ") and "10.1.2.3/24" in err,
                   "invalid_request: exit 3 and the API's message", repr(err))
        rc, out, err = cli(port, "vm", "create", "x", "--cpus", "many")
        tap.result(rc == 2 and "--cpus: 'many' is not an integer" in err, "a bad flag value: exit 2 before any request",
                   repr(err))
        rc, out, err = cli(port, "vm", "list", env_extra={"VM_MANAGER_URL": "127.0.0.1:%d" % free_port()})
        tap.result(rc == 10 and "cannot reach vm-manager" in err, "no daemon: exit 10", repr(err))

        rc, out, err = cli(port, "help")
        tap.result(rc == 0 and "vm exec" in out and "vm shell" in out, "help offers vm shell", out[-600:])

        # vm shell: what a user meets before any session (the fake guest has no sshd; test_exec has one)
        rc, out, err = cli(port, "vm", "shell", "--help")
        tap.result(rc == 0 and "A login shell as root in the VM" in out and "get_vm operation" not in out,
                   "vm shell --help: its own description, not get_vm's", out[:300])
        rc, out, err = cli(port, "vm", "shell", "web")
        tap.result(rc == 2 and out == "" and "vm shell needs a terminal on stdin" in err and "vm exec NAME --" in err,
                   "vm shell without a terminal: exit 2, pointing at vm exec", "%d %r" % (rc, err))
        rc, out = cli_pty_typed(port, [], "vm", "shell", "nope", timeout=30)
        tap.result(rc == 255 and 'not found: vm "nope"' in out, "vm shell: an unknown VM is 255 with not_found's message",
                   "%d %r" % (rc, out))
        rc, _, err = cli(port, "vm", "stop", "plain")
        rc, out = cli_pty_typed(port, [], "vm", "shell", "plain", timeout=30)
        tap.result(rc == 255 and ("conflict: vm %s is not running (stopped)" % plain_id) in out,
                   "vm shell: a VM not running is 255 with conflict's message", "%d %r" % (rc, out))
        rc, out = shell_against_old_server()
        tap.result(rc == 255 and "does not serve vm shell (it answered HTTP 404" in out and "vm exec NAME" in out
                   and "not found" in out, "vm shell against a server without it: 255, says so", "%d %r" % (rc, out))

        rc, out, err = cli(port, "vm", "create", "--help")
        tap.result(rc == 0 and "--memory-mib N" in out and "Memory in MiB" in out and "--ssh-key FILE" in out,
                   "vm create --help: flags from the operation table", out[:300])
        missing = []
        for args in (["vm", "list"], ["vm", "get"], ["vm", "start"], ["vm", "stop"], ["vm", "reboot"],
                     ["vm", "delete"], ["vm", "exec"], ["vm", "console"], ["vm", "shell"], ["network", "list"],
                     ["network", "create"], ["network", "delete"], ["image", "list"], ["host"]):
            rc, out, err = cli(port, *args, "--help")
            if rc != 0 or not out.startswith("Usage: vm-manager " + " ".join(args)):
                missing.append(" ".join(args))
        tap.result(not missing, "--help on every command", repr(missing))

        rc, out, err = cli(port, "network", "create", "lab", "--cidr", "10.1.2.0/24")
        rc2, out2, _ = cli(port, "network", "list")
        tap.result(rc == 0 and "lab" in out2 and "10.1.2.0/24" in out2, "network create and list", out + out2)
        rc, out, err = cli(port, "image", "list")
        tap.result(rc == 0 and out.split("\n")[1].split()[:2] == ["fake", "1.0"], "image list", out)
        rc, out, err = cli(port, "host", "-o", "json")
        tap.result(rc == 0 and "kernel" in json.loads(out), "host --output json", out[:200])

        # the console, followed as it grows, ended by the VM's deletion
        console = os.path.join(work, "state-cli", "vms", web["id"], "console.log")
        env = base_env(work, VM_MANAGER_URL="%s:%d" % (HOST, port))
        p = subprocess.Popen([BIN, "vm", "console", "web", "--follow"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        got = b""
        deadline = time.monotonic() + 20
        wrote = False
        while time.monotonic() < deadline and b"later line 2" not in got:
            r, _, _ = select.select([p.stdout], [], [], 0.5)
            if r:
                got += os.read(p.stdout.fileno(), 65536)
            if not wrote and b"installed boot" in got:
                with open(console, "a") as f:
                    f.write("later line 1\n")
                    f.flush()
                    time.sleep(0.6)
                    f.write("later line 2\n")
                wrote = True
        tap.result(b"fake guest: installed boot" in got and b"later line 1\nlater line 2\n" in got,
                   "vm console --follow: what was there, then what the guest writes as it writes it", repr(got)[-300:])
        rc, out, err = cli(port, "vm", "delete", "web")
        tap.result(rc == 0, "vm delete by name", err)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        tap.result(p.returncode == 0, "vm console --follow ends when the VM is deleted", "%r" % p.returncode)

        status, body = rest(port, "GET", "/vms/%s/console/stream?offset=x" % plain_id)
        tap.result(status == 400 and body["error"]["code"] == "invalid_request",
                   "console stream: a bad offset is invalid_request", repr(body)[:200])
    finally:
        d.stop(signal.SIGTERM, timeout=30)


def cli_pty_typed(port, keys, *args, timeout=60):
    """Runs the client on a terminal and types keys, one item each half second after it started."""
    env = base_env("/tmp", VM_MANAGER_URL="%s:%d" % (HOST, port))
    master, slave = pty.openpty()
    p = subprocess.Popen([BIN, *args], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    keys = list(keys)
    deadline = time.monotonic() + timeout
    next_key = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        if keys and time.monotonic() >= next_key:
            os.write(master, keys.pop(0))
            next_key = time.monotonic() + 0.5
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    return p.returncode, out.decode(errors="replace")


class OldServer(http.server.BaseHTTPRequestHandler):
    """A vm-manager from before vm shell: its VM is there, /vms/{id}/shell is no route."""
    VM = {"id": "0123abcd", "name": "old", "state": "ready"}

    def do_GET(self):
        if self.path == "/api/v1/vms":
            status, body = 200, [self.VM]
        elif self.path == "/api/v1/vms/" + self.VM["id"]:
            status, body = 200, self.VM
        else:
            status, body = 404, {"error": {"code": "not_found", "message": "not found: no route GET " + self.path}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def shell_against_old_server():
    srv = http.server.ThreadingHTTPServer((HOST, 0), OldServer)
    start_thread(srv.serve_forever)
    try:
        return cli_pty_typed(srv.server_address[1], [], "vm", "shell", "old", timeout=30)
    finally:
        srv.shutdown()
        srv.server_close()


def test_exec(work):
    """vm exec through a real sshd that trusts the VM's key, as test-network's exec test sets it up."""
    sys.path.insert(0, here)
    import importlib.util
    spec = importlib.util.spec_from_file_location("test_network", os.path.join(here, "test-network.py"))
    tn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tn)
    sshd = "/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None
    if os.geteuid() != 0 or not sshd or not os.path.exists("/dev/net/tun"):
        tap.skip("vm exec against sshd", "needs root, /dev/net/tun, ip and sshd (openssh-server)")
        return
    ns = "vmm-cli-%d" % os.getpid()
    tn.sh("ip", "netns", "add", ns)
    procs = []
    tapname = "vmmc%d" % (os.getpid() % 100000)
    plan = os.path.join(work, "plan-e.json")
    with open(plan, "w") as f:
        json.dump({"sshguest": {"netns": ns, "tap": tapname}}, f)
    d = None
    try:
        d, port, ok = start(work, "exec", {"FAKE_GUEST": os.environ.get("FAKE_GUEST", ""), "FAKE_GUEST_PLAN": plan})
        if not ok:
            return
        rc, out, err = cli(port, "vm", "create", "sshguest", "--hostname", "sshguest", *NO_ATTEST)
        tap.result(rc == 0, "exec: vm create", err[-300:])
        _, vm = rest(port, "GET", "/vms")
        vm = next(v for v in vm if v["name"] == "sshguest")
        ip, mac = vm["ip"], vm["mac"]
        gw = ip.rsplit(".", 1)[0] + ".1"
        for _ in range(50):
            if subprocess.run(["ip", "-n", ns, "link", "show", tapname], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        tn.sh("ip", "-n", ns, "link", "set", tapname, "address", mac)
        tn.sh("ip", "-n", ns, "link", "set", tapname, "up")
        tn.sh("ip", "-n", ns, "link", "set", "lo", "up")
        tn.sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", tapname)
        tn.sh("ip", "-n", ns, "route", "add", "default", "via", gw)
        procs.append(tn.start_sshd(work, ns, sshd, ip, vm["sshPublicKey"], "cli"))

        rc, out, err = cli(port, "vm", "exec", "sshguest", "--", "sh", "-c", "tr a-z A-Z; echo oops >&2; exit 3",
                           stdin="hello from stdin\n")
        tap.result(rc == 3 and out == "HELLO FROM STDIN\n" and err == "oops\n",
                   "vm exec: stdin in, stdout and stderr out, the exit status passed through",
                   "%d %r %r" % (rc, out, err))
        rc, out, err = cli(port, "vm", "exec", "sshguest", "--", "true")
        tap.result(rc == 0 and out == "", "vm exec: status 0", "%d %r %r" % (rc, out, err))
        rc, out, err = cli(port, "vm", "exec", "nope", "--", "true")
        tap.result(rc == 255 and err == 'not found: vm "nope"\n', "vm exec: its own failure is 255 with the message",
                   "%d %r" % (rc, err))

        # vm shell: a login shell in a pty, typed into, its exit status passed through
        # (the output, 42, is not in the echo of what was typed)
        rc, out = cli_pty_typed(port, [b"echo $((6*7)); exit 3\r"], "vm", "shell", "sshguest")
        tap.result(rc == 3 and re.search(r"[\r\n]42\r\n", out) is not None, "vm shell: a typed command's output, then exit 3 is the status",
                   "%d %r" % (rc, out[-200:]))
        # Ctrl-] detaches with status 0, the shell left behind
        rc, out = cli_pty_typed(port, [b"\x1d"], "vm", "shell", "sshguest")
        tap.result(rc == 0 and "Detached" in out, "vm shell: Ctrl-] detaches", "%d %r" % (rc, out[-400:]))
        # the endpoint wants the upgrade
        st, body = rest(port, "GET", "/vms/%s/shell" % vm["id"])
        tap.result(st == 426 and body["error"]["code"] == "invalid_request", "vm shell: no Upgrade is 426",
                   "%r %r" % (st, body))
        # the VM stopping under an open shell ends it: 255 and why, not a hang
        started = time.monotonic()
        t = start_thread(lambda: (time.sleep(5), cli(port, "vm", "stop", "sshguest")))
        rc, out = cli_pty_typed(port, [b"echo started; sleep 300\r"], "vm", "shell", "sshguest", timeout=90)
        t.join()
        tap.result(rc == 255 and "started" in out and "the VM is stopping or gone" in out and time.monotonic() - started < 80,
                   "vm shell: the VM stopped under it: 255 with the reason", "%d %.1fs %r" % (
                       rc, time.monotonic() - started, out[-400:]))
    finally:
        if d:
            d.stop(signal.SIGTERM, timeout=30)
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


if __name__ == "__main__":
    sys.exit(run([test_commands, test_exec], 600, "vmm-cli-"))
