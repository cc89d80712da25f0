#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""vm-manager's MCP endpoint against a real MCP client: the official TypeScript SDK.

Installs @modelcontextprotocol/sdk and undici (pinned in mcp-sdk/package.json and
mcp-sdk/package-lock.json) with `npm ci` into a cache directory outside the source tree, reused
while the lock file is unchanged; starts the daemon on a free 127.0.0.1 port with a temporary state
directory; runs mcp-sdk/client.mjs against it and passes the client's TAP through (renumbered).

Meanwhile mcp-sdk/keepalive.mjs runs a 90 s create_vm through a client whose fetch gives up after
30 s of silence, against two more daemons on the fake QEMU of tests/integration/fakes (its guest
sends READY=1 90 s into the installed boot): one with the default --mcp-keepalive, where the call
gets its result, and one with --mcp-keepalive 60s, where it fails with a body timeout. That takes
about 95 s, the longest part of this test.

Every daemon is stopped with SIGTERM and must exit with status 0 (under ASan that includes no leak).

Without node (>= 18) or npm this prints "1..0 # SKIP" and exits 0: meson 1.0.1 turns exit status 77
of a TAP test into an ERROR. tools/install-deps.sh check installs both.

environment: VM_MANAGER_BIN (else argv[1]) the binary; MCP_SDK_CACHE_DIR (else argv[2], else
$XDG_CACHE_HOME/vm-manager/mcp-sdk) where npm installs; MCP_SDK_DIR the directory with package.json,
package-lock.json and client.mjs (default: mcp-sdk next to this script).
Only the npm registry (npm ci, cold cache only) and 127.0.0.1 are contacted.
"""

import fcntl
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HOST = "127.0.0.1"
GLOBAL_DEADLINE = 280  # seconds, npm ci on a cold cache included; meson allows 300
NPM_CI_TIMEOUT = 90
CLIENT_TIMEOUT = 50  # client.mjs bails out by itself after 45 s
KEEPALIVE_CLIENT_TIMEOUT = 180  # keepalive.mjs bails out by itself after 170 s
FAKE_READY_AFTER = 90  # seconds from the fake guest's installed boot to READY=1 (keepalive.mjs knows it too)
FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakes")
NODE_MIN_MAJOR = 18
STAMP_FORMAT = b"vm-manager mcp-sdk cache v1\0"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vmmtest import check_loop_reports, loop_env  # noqa: E402
SDK_DIR = os.environ.get("MCP_SDK_DIR") or os.path.join(HERE, "mcp-sdk")
BIN = os.environ.get("VM_MANAGER_BIN") or (sys.argv[1] if len(sys.argv) > 1 else None)
CACHE_DIR = (
    os.environ.get("MCP_SDK_CACHE_DIR")
    or (sys.argv[2] if len(sys.argv) > 2 else None)
    or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vm-manager", "mcp-sdk"
    )
)

# Environment variables that would change what the daemon does (see test-serve.py).
SCRUB_ENV = (
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "JOURNAL_STREAM",
)


class GlobalTimeout(Exception):
    pass


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def diag(self, text):
        for line in str(text).splitlines() or [""]:
            print("# " + line, flush=True)

    def result(self, ok, name, diag=None):
        self.n += 1
        if not ok:
            self.failed += 1
            # meson test --print-errorlogs shows a TAP test's stderr only: repeat failures there.
            print("not ok %d - %s" % (self.n, name), file=sys.stderr, flush=True)
            if diag:
                print(str(diag).rstrip("\n"), file=sys.stderr, flush=True)
        print("%s %d - %s" % ("ok" if ok else "not ok", self.n, name), flush=True)
        if diag:
            self.diag(diag)
        return ok


tap = Tap()


def tail(text, lines=40):
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else (text or "")
    rows = text.rstrip("\n").splitlines()
    if len(rows) > lines:
        rows = ["[... %d lines ...]" % (len(rows) - lines)] + rows[-lines:]
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# node, npm and the SDK


def find_tools():
    """Returns (node, npm, node version) or a reason to skip."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return None, "no %s on PATH (tools/install-deps.sh check installs them)" % " or ".join(
            n for n, p in (("node", node), ("npm", npm)) if not p
        )
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "%s --version failed: %r" % (node, e)
    m = re.match(r"v(\d+)\.", version)
    if not m or int(m.group(1)) < NODE_MIN_MAJOR:
        return None, "node %s at %s is older than %d" % (version or "(unknown)", node, NODE_MIN_MAJOR)
    return (node, npm, version), None


def lock_digest():
    h = hashlib.sha256(STAMP_FORMAT)
    for name in ("package.json", "package-lock.json"):
        with open(os.path.join(SDK_DIR, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def pinned_sdk_version():
    with open(os.path.join(SDK_DIR, "package.json")) as f:
        return json.load(f)["dependencies"]["@modelcontextprotocol/sdk"]


def installed_sdk_version():
    try:
        with open(os.path.join(CACHE_DIR, "node_modules", "@modelcontextprotocol", "sdk", "package.json")) as f:
            return json.load(f).get("version")
    except (OSError, ValueError):
        return None


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def install_sdk(npm):
    """npm ci into CACHE_DIR unless the stamp there matches the lock file. Returns (ok, diag)."""
    os.makedirs(CACHE_DIR, exist_ok=True)
    stamp = os.path.join(CACHE_DIR, "lock.sha256")
    digest = lock_digest()
    want = pinned_sdk_version()
    try:
        with open(stamp) as f:
            cached = f.read().strip() == digest
    except OSError:
        cached = False
    if cached and installed_sdk_version() == want:
        return True, "cached: %s (lock sha256 %s)" % (CACHE_DIR, digest[:16])

    # Stale or missing: start from the lock file alone, and stamp only a complete install.
    if os.path.exists(stamp):
        os.unlink(stamp)
    shutil.rmtree(os.path.join(CACHE_DIR, "node_modules"), ignore_errors=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(os.path.join(SDK_DIR, name), os.path.join(CACHE_DIR, name))
    env = dict(os.environ, npm_config_update_notifier="false", npm_config_loglevel="warn")
    start = time.monotonic()
    try:
        p = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=CACHE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=NPM_CI_TIMEOUT,
        )
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"") + (e.stderr or b"")
        return False, "npm ci took longer than %d s\n%s" % (NPM_CI_TIMEOUT, tail(output))
    took = time.monotonic() - start
    if p.returncode != 0:
        output = tail(p.stdout + p.stderr)
        return False, "npm ci failed with status %d after %.1f s\n%s" % (p.returncode, took, output)
    got = installed_sdk_version()
    if got != want:
        return False, "npm ci installed @modelcontextprotocol/sdk %r, package.json pins %r" % (got, want)
    write_atomic(stamp, (digest + "\n").encode())
    return True, "npm ci into %s took %.1f s" % (CACHE_DIR, took)


def stage_client(name="client.mjs"):
    """The clients import the SDK by name: run them from the directory that holds node_modules."""
    path = os.path.join(CACHE_DIR, name)
    with open(os.path.join(SDK_DIR, name), "rb") as f:
        write_atomic(path, f.read())
    return path


# ---------------------------------------------------------------------------------------------
# the daemon


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((HOST, 0))
        return s.getsockname()[1]
    finally:
        s.close()


def daemon_env(work):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VM_MANAGER_") and k not in SCRUB_ENV}
    env["HOME"] = os.path.join(work, "home")
    env["XDG_STATE_HOME"] = os.path.join(work, "xdg-state")
    return env


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        return "(cannot read %s: %s)" % (path, e)


def wait_healthy(proc, port, stderr_path, timeout=10.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False, "exited with status %r before answering; stderr:\n%s" % (
                proc.returncode,
                tail(read_text(stderr_path)),
            )
        conn = http.client.HTTPConnection(HOST, port, timeout=1)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:
                return True, None
            last = "status %d" % resp.status
        except OSError as e:
            last = repr(e)
        finally:
            conn.close()
        time.sleep(0.05)
    return False, "no answer from /healthz on port %d within %.0f s (last: %s); stderr:\n%s" % (
        port,
        timeout,
        last,
        tail(read_text(stderr_path)),
    )


TAP_LINE = re.compile(r"^(not ok|ok)\b(?:\s+\d+)?\s*(.*)$")


def pass_through(out):
    """Re-emits the client's TAP under our numbering. Returns (tests seen, failed, plan, bailed)."""
    seen = failed = 0
    plan = None
    bailed = False
    in_failure = False  # the diagnostics of a failed test follow it: repeat them on stderr too
    for line in out.splitlines():
        m = TAP_LINE.match(line)
        in_failure = in_failure and line.startswith("#")
        if m:
            seen += 1
            tap.result(m.group(1) == "ok", m.group(2).lstrip("- ").strip() or "client test %d" % seen)
            failed += m.group(1) != "ok"
            in_failure = m.group(1) != "ok"
        elif in_failure:
            print(line, flush=True)
            print(line[2:] if line.startswith("# ") else line[1:], file=sys.stderr, flush=True)
        elif re.match(r"^1\.\.\d+", line):
            plan = int(line[3:].split()[0]) if line[3:].split() else None
        elif line.startswith("Bail out!"):
            bailed = True
            tap.result(False, "client: " + line)
        elif line.startswith("TAP version"):
            continue
        elif line.startswith("#"):
            print(line, flush=True)
        elif line.strip():
            tap.diag("client: " + line)
    return seen, failed, plan, bailed


def start_daemon(work, name, extra=(), fakes=False, policy=None, ready_after=FAKE_READY_AFTER, port=None):
    """vm-manager serve on a free port: (process, port, stderr path, (ok, diag) of its /healthz).
    policy: a policy.json for the fake image; ready_after None: the fake guest never sends READY=1.
    Started again with the same name and port, it is the same daemon restarted (its state directory,
    its log appended to)."""
    port = port or free_port()
    stderr_path = os.path.join(work, name + ".stderr")
    env = loop_env(daemon_env(work), work, name)
    args = [BIN, "serve", "--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, name),
            "--log-level", "debug"]
    if fakes:
        # The fake QEMU, swtpm and vhost-device-vsock first on PATH, a fake image and firmware.
        images, vars_ = os.path.join(work, name + "-images"), os.path.join(work, name + "-vars")
        os.makedirs(images, exist_ok=True)
        for path in (os.path.join(images, "fake_1.0.efi"), os.path.join(images, "fake_1.0.raw"), vars_):
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)
        if policy:
            with open(os.path.join(images, "fake_1.0.policy.json"), "w") as f:
                json.dump(policy, f)
        env.update(FAKE_QEMU="install-exit:0")
        if ready_after is not None:
            env.update(FAKE_READY_AFTER=str(ready_after))
        env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
        args += ["--image-dir", images, "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process",
                 "--vsock", "vhost-user"]
    with open(stderr_path, "ab") as err:
        proc = subprocess.Popen(args + list(extra), stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                                close_fds=True)
    return proc, port, stderr_path, wait_healthy(proc, port, stderr_path, timeout=20)


def start_client(node, script, args):
    cenv = {k: v for k, v in os.environ.items() if not k.startswith("VM_MANAGER_")}
    return subprocess.Popen([node, script] + [str(a) for a in args], cwd=CACHE_DIR, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cenv), time.monotonic()


def finish_client(name, c, start, timeout, stderr_paths):
    """Waits for a client started with start_client(), passes its TAP through and checks it ran to
    the end."""
    try:
        out, cerr = c.communicate(timeout=max(1, timeout - (time.monotonic() - start)))
        rc = c.returncode
    except subprocess.TimeoutExpired:
        c.kill()
        out, cerr = c.communicate()
        rc = None
    finally:
        if c.poll() is None:  # GlobalTimeout
            c.kill()
            c.wait()
    took = time.monotonic() - start
    seen, failed, plan, bailed = pass_through(out.decode("utf-8", "replace"))
    # Exit status 1 with a complete plan is the client reporting the failures listed above;
    # anything else (a crash, a bail-out, a missing plan, a kill) fails here.
    finished = seen > 0 and plan == seen and not bailed and rc == (1 if failed else 0)
    tap.result(
        finished,
        "%s: ran to the end, %d tests, %d failed (%.1f s)" % (name, seen, failed, took),
        None
        if finished
        else "exit status %r, plan %r, %d tests seen%s\nstderr:\n%s\n%s"
        % (
            rc,
            plan,
            seen,
            " (killed after %d s)" % timeout if rc is None else "",
            tail(cerr),
            "\n".join("daemon stderr %s:\n%s" % (p, tail(read_text(p))) for p in stderr_paths),
        ),
    )


def stop_daemon(name, proc, stderr_path):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = None
    text = read_text(stderr_path)
    problems = [
        line
        for line in text.splitlines()
        if "ERROR: AddressSanitizer" in line
        or "ERROR: LeakSanitizer" in line
        or "runtime error:" in line
        or line.startswith("SUMMARY:")
    ]
    if problems:
        # A sanitizer report runs to hundreds of lines: its start names the first culprits.
        lines = text.splitlines()
        first = next(i for i, line in enumerate(lines) if line in problems)
        summary = [p for p in problems if p.startswith("SUMMARY:")]
        report = "\n".join(lines[first : first + 50] + ["[...]"] + summary)
    else:
        report = tail(text)
    clean = rc == 0 and not problems
    tap.result(
        clean,
        "SIGTERM: daemon %s exits with status 0, no sanitizer report" % name,
        None if clean else "exit status %r%s\nstderr:\n%s" % (rc, " (killed)" if rc is None else "", report),
    )


ZERO = "00" * 32


def fake_policy(golden):
    p = {"image_id": "fake", "image_version": "1.0",
         "pcr11": {"enter-initrd": ZERO, "enter-initrd:leave-initrd:sysinit:ready": ZERO}}
    if golden:
        p["golden"] = {"sha256": {str(i): golden for i in (0, 2, 3, 4, 6, 7)}}
    return p


def first_vm_result(c, start, timeout):
    try:
        out, err = c.communicate(timeout=max(1, timeout - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        c.kill()
        out, err = c.communicate()
    try:
        return json.loads(out.decode().strip().splitlines()[-1]), time.monotonic() - start
    except (ValueError, IndexError):
        return {"exception": "no answer: %r %r" % (out[-300:], err[-300:])}, time.monotonic() - start


def first_vm(work, node, daemons):
    """A new user's first create_vm through the SDK, defaults and all: refused at once on an image
    without golden values when the daemon can make no firmware run (the test daemons are started
    with firmware runs off); failed at once by a rejected quote (the test plays the guest: a real swtpm
    quoted by vm-agent through the VM's metadata listener)."""
    script = stage_client("firstvm.mjs")
    daemons["nogolden"] = start_daemon(work, "nogolden", fakes=True, policy=fake_policy(None), ready_after=None)
    proc, port, stderr_path, (up, why) = daemons["nogolden"]
    if tap.result(up, "daemon nogolden on the fake QEMU starts", why):
        res, took = first_vm_result(*start_client(node, script, [port, "first"]), 60)
        text = res.get("text", "")
        tap.result(res.get("isError") is True and text.startswith("unsupported: ")
                   and "vm requires attestation" in text
                   and "firmware measurements (pcr 0,2,3,6) are not known" in text
                   and "firmware runs are off" in text and "make golden" in text,
                   "SDK: the first create_vm on an image without golden values is refused at once, naming "
                   "make golden (%.1f s)" % took, json.dumps(res)[:600])

    agent = os.environ.get("VM_AGENT")
    if not agent or not shutil.which("swtpm") or not shutil.which("swtpm_setup"):
        tap.result(True, "SDK: a rejected boot # SKIP needs VM_AGENT, swtpm and swtpm_setup")
        return
    sys.path.insert(0, HERE)
    from vmmtest import imds_relay  # noqa: E402
    daemons["reject"] = start_daemon(work, "reject", ["--stop-timeout", "3s"], fakes=True,
                                     policy=fake_policy("11" * 32), ready_after=None)
    proc, port, stderr_path, (up, why) = daemons["reject"]
    if not tap.result(up, "daemon reject on the fake QEMU starts", why):
        return
    tpmdir = os.path.join(work, "tpm")
    sock = os.path.join(tpmdir, "sock")
    sw = None
    try:
        c = start_client(node, script, [port, "rejected"])
        vm = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not vm:
            conn = http.client.HTTPConnection(HOST, port, timeout=5)
            conn.request("GET", "/api/v1/vms")
            vms = json.loads(conn.getresponse().read())
            conn.close()
            vm = next((v for v in vms if v.get("phase") == "boot" and v["state"] in ("booting", "attesting")), None)
            time.sleep(0.2)
        if not tap.result(vm is not None, "SDK: the VM's installed boot runs", ""):
            c.kill()
            return
        # The guest's TPM is a copy of the VM's own vTPM (the VM's swtpm is the fake one), so that the
        # agent's AK can be activated with the EK the host certified.
        shutil.copytree(vm["paths"]["tpmState"], tpmdir, ignore=shutil.ignore_patterns("*.sock", "*.sock.ctrl"))
        sw = subprocess.Popen(["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + tpmdir, "--server",
                               "type=unixio,path=" + sock, "--ctrl", "type=unixio,path=" + sock + ".ctrl",
                               "--flags", "not-need-init,startup-clear"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        for _ in range(50):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        url = "http://127.0.0.1:%d/giantswarm/v1" % imds_relay(os.path.join(vm["paths"]["dir"], "imds.sock"))
        posted = time.monotonic()
        subprocess.run([agent, "attest", "--stage=initrd", "--imds-url=" + url, "--tpm=swtpm:path=" + sock,
                        "--timeout=20s"], capture_output=True, env=dict(os.environ, TSS2_LOG="all+none"),
                       timeout=60)
        res, _ = first_vm_result(c[0], c[1], 60)
        took = time.monotonic() - posted
        text = res.get("text", "")
        tap.result(res.get("isError") is True and text.startswith("vm_failed: ")
                   and "initrd attestation rejected: golden mismatch: pcr 0" in text,
                   "SDK: a rejected initrd quote answers the first create_vm at once with the verdict "
                   "(%.1f s after the quote was posted)" % took, json.dumps(res)[:600])
    finally:
        if sw:
            sw.kill()
            sw.wait()


def run(work, node, npm):
    ok, diag = install_sdk(npm)
    if not tap.result(ok, "npm ci: @modelcontextprotocol/sdk %s installed or cached" % pinned_sdk_version(), diag):
        return
    client = stage_client()
    keepalive = stage_client("keepalive.mjs")

    daemons = {}
    try:
        # The long client first: it runs alongside client.mjs.
        daemons["keepalive"] = start_daemon(work, "keepalive", fakes=True)
        daemons["silent"] = start_daemon(work, "silent", ["--mcp-keepalive", "60s"], fakes=True)
        ok = True
        for name, (proc, port, stderr_path, (up, why)) in daemons.items():
            ok = tap.result(up, "daemon %s on the fake QEMU starts on 127.0.0.1:%d" % (name, port), why) and ok
        k = None
        if ok:
            k = start_client(node, keepalive, [daemons["keepalive"][1], daemons["silent"][1]])

        daemons["main"] = start_daemon(work, "main")
        proc, port, stderr_path, (up, why) = daemons["main"]
        if tap.result(up, "daemon starts on 127.0.0.1:%d and answers /healthz" % port, why):
            c = start_client(node, client, [port])
            finish_client("client.mjs", *c, CLIENT_TIMEOUT, [stderr_path])
        first_vm(work, node, daemons)
        if k:
            finish_client("keepalive.mjs", *k, KEEPALIVE_CLIENT_TIMEOUT,
                          [daemons["keepalive"][2], daemons["silent"][2]])
    finally:
        for name, (proc, port, stderr_path, _) in daemons.items():
            stop_daemon(name, proc, stderr_path)
        # the loop watchdog (vmmtest.py): no iteration over 50 ms in any daemon
        check_loop_reports([(name, "run", os.path.join(work, name + ".loop.jsonl")) for name in daemons], tap)


def main():
    print("TAP version 13", flush=True)
    if not BIN or not os.access(BIN, os.X_OK):
        print("1..0 # SKIP no vm-manager binary: set VM_MANAGER_BIN or pass it as argv[1]", flush=True)
        return 0
    tools, why = find_tools()
    if not tools:
        print("1..0 # SKIP %s" % why, flush=True)
        return 0
    node, npm, version = tools
    npm_version = subprocess.run([npm, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    tap.diag("binary: %s" % BIN)
    tap.diag("node %s (%s), npm %s (%s)" % (version, node, npm_version, npm))
    tap.diag("SDK cache: %s" % CACHE_DIR)

    def on_alarm(signum, frame):
        raise GlobalTimeout("the test ran out of its %d s budget" % GLOBAL_DEADLINE)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(GLOBAL_DEADLINE)

    os.makedirs(CACHE_DIR, exist_ok=True)
    work = tempfile.mkdtemp(prefix="vmm-sdk-")
    try:
        # One run at a time per cache directory: concurrent npm ci runs would trample each other.
        with open(os.path.join(CACHE_DIR, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            run(work, node, npm)
    except GlobalTimeout as e:
        tap.result(False, str(e))
    except Exception:  # noqa: BLE001
        tap.result(False, "unexpected exception", traceback.format_exc())
    finally:
        signal.alarm(0)
        shutil.rmtree(work, ignore_errors=True)
    print("1..%d" % tap.n, flush=True)
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
