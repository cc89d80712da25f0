# SPDX-License-Identifier: LGPL-2.1-or-later
"""Shared helpers of the black-box tests in this directory (standard library only).

TAP output (with TODO support for known daemon bugs), free 127.0.0.1 ports, a scrubbed
environment, plain HTTP helpers, the Daemon wrapper that starts `vm-manager serve`, an MCP
streamable-HTTP client, a state-directory snapshot, and `run()`, the main() skeleton that owns
the global deadline, the work directory and the clean-up (every daemon is killed in a finally).

The loop watchdog: every daemon started here gets a report file
($VM_MANAGER_LOOP_WATCHDOG_REPORT, <work>/<name>.loop.jsonl), to which it appends each event loop
iteration over 50 ms (src/basic/loop-watchdog.h); run() ends with a TAP line that fails when any
daemon of the test reported one, naming the daemon, the section and where the loop was.

test-serve.py predates this module and keeps its own copies; new tests import this one.
"""

import hashlib
import http.client
import json
import os
import queue
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HOST = "127.0.0.1"

BIN = os.environ.get("VM_MANAGER_BIN") or (sys.argv[1] if len(sys.argv) > 1 else None)

# Environment variables that would change what the daemon does and must not leak in from the
# caller: our own flags' fallbacks, systemd socket activation, sd_notify and journal detection.
SCRUB_ENV = (
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "JOURNAL_STREAM",
)

SANITIZER_RE = re.compile(r"ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:")

# The loop watchdog's report file (src/basic/loop-watchdog.h), and the longest an iteration may take.
LOOP_REPORT_ENV = "VM_MANAGER_LOOP_WATCHDOG_REPORT"
LOOP_THRESHOLD_MS = 50

# Places where the loop is known to take too long today, each with the reason (issue 33, found by the
# watchdog over the integration suite and reported): a slow iteration whose innermost frame of ours is
# one of them is a TODO (shown, not failing the test); anywhere else it fails. Fixing one means taking
# its line out, which re-arms the check for it.
LOOP_STRICT_ENV = "VM_MANAGER_LOOP_STRICT"
LOOP_KNOWN = (
)


class GlobalTimeout(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# TAP


def _tap_name(name):
    # One line, and no '#': TAP would read what follows it as a directive.
    name = " ".join(str(name).split()).replace("#", "no.")
    return name if len(name) <= 240 else name[:237] + "..."


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0
        self.todo_failed = 0
        self.todo_passed = []

    def diag(self, text):
        for line in str(text).splitlines() or [""]:
            print("# " + line, flush=True)

    def result(self, ok, name, diag=None, todo=None):
        """todo: the reason a failure is expected today (a known daemon bug). Such a failure is
        'not ok ... # TODO' and does not fail the run; should it pass, meson reports an
        unexpected pass, the cue to drop the TODO."""
        self.n += 1
        name = _tap_name(name)
        directive = " # TODO %s" % " ".join(str(todo).split()) if todo else ""
        if not ok and not todo:
            self.failed += 1
        elif not ok:
            self.todo_failed += 1
        elif todo:
            self.todo_passed.append(name)
        print("%s %d - %s%s" % ("ok" if ok else "not ok", self.n, name, directive), flush=True)
        if diag and not ok:
            self.diag(str(diag)[:6000])
        elif ok and todo:
            self.diag("passes although marked TODO: the bug looks fixed, drop its TODO")
        elif diag:
            # A passing test keeps one short line of diagnostics.
            line = str(diag).strip().splitlines()[0] if str(diag).strip() else ""
            if line:
                self.diag(line if len(line) <= 200 else line[:200] + "...")
        return ok

    def skip(self, name, why):
        """A check that cannot run on this host, with the reason in the TAP output."""
        self.n += 1
        print("ok %d - %s # SKIP %s" % (self.n, _tap_name(name), " ".join(str(why).split())), flush=True)

    def check(self, name, fn, *args, todo=None):
        """fn returns (ok, diag) or a bool; an exception is a failure carrying its traceback."""
        try:
            r = fn(*args)
            ok, diag = r if isinstance(r, tuple) else (bool(r), None)
        except GlobalTimeout:
            raise
        except Exception:  # noqa: BLE001 - any exception is a failed check
            ok, diag = False, traceback.format_exc()
        return self.result(ok, name, diag, todo=todo)


tap = Tap()

# ---------------------------------------------------------------------------------------------
# plain helpers


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((HOST, 0))
        return s.getsockname()[1]
    finally:
        s.close()


def base_env(workdir, **extra):
    # OTEL_*: a tracer configured in the caller's environment would send our spans elsewhere
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VM_MANAGER_") and not k.startswith("OTEL_") and k not in SCRUB_ENV}
    # Should a default ever be used by mistake, it lands in our temporary directory.
    env["HOME"] = os.path.join(workdir, "home")
    env["XDG_STATE_HOME"] = os.path.join(workdir, "xdg-state")
    env.update(extra)
    return env


def http_request(port, method, path, body=None, headers=None, timeout=10):
    """One request on a fresh connection: (status, {lower-case header: value}, body bytes). A body
    sent without headers goes as application/json, as the REST API wants; pass headers to choose."""
    if headers is None and body is not None:
        headers = {"Content-Type": "application/json"}
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


class EventStream:
    """An HTTP request whose answer is an event stream, read by a thread: each JSON-RPC message of
    an event goes into .events (a queue)."""

    def __init__(self, port, method, headers, body=None, path="/mcp"):
        self.events, self.status, self.headers = queue.Queue(), None, {}
        self.sock = socket.create_connection((HOST, port), timeout=60)
        head = "%s %s HTTP/1.1\r\nHost: %s:%d\r\n" % (method, path, HOST, port)
        for k, v in headers.items():
            head += "%s: %s\r\n" % (k, v)
        if body is not None:
            head += "Content-Length: %d\r\n" % len(body)
        self.sock.sendall(head.encode() + b"\r\n" + (body or b""))
        self.buf = b""
        line = self._line()
        self.status = int(line.split()[1])
        while True:
            line = self._line()
            if not line:
                break
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode()

    def _body(self):
        """The body, dechunked, as it comes."""
        if self.headers.get("transfer-encoding", "").lower() != "chunked":
            while True:
                if self.buf:
                    out, self.buf = self.buf, b""
                    yield out
                self._fill()
        while True:
            size = int(self._line().split(";")[0], 16)
            if size == 0:
                return
            while len(self.buf) < size + 2:
                self._fill()
            yield self.buf[:size]
            self.buf = self.buf[size + 2:]

    def _read(self):
        text = b""
        try:
            for chunk in self._body():
                text += chunk
                while b"\n\n" in text:
                    event, text = text.split(b"\n\n", 1)
                    for line in event.decode().split("\n"):
                        if line.startswith("data: "):
                            self.events.put(json.loads(line[6:]))
        except (EOFError, OSError, ValueError):
            pass
        self.events.put(None)

    def next(self, timeout):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def api(port, method, path, body=None, timeout=60):
    """A REST call under /api/v1 with a JSON body: (status, parsed JSON, or the raw bytes when the
    answer is not JSON, or None when it is empty)."""
    status, _, data = http_request(port, method, "/api/v1" + path,
                                   body=json.dumps(body).encode() if body is not None else None, timeout=timeout)
    try:
        return status, (json.loads(data) if data else None)
    except ValueError:
        return status, data


def serve_ready(binary, state, images, args=(), env=None, timeout=120):
    """For bench/: `BINARY serve` on a free loopback port with STATE and IMAGES, then ARGS, its output
    in STATE.log, until /readyz answers 200: (Popen, port). SystemExit when it exits first or is not
    ready within timeout seconds."""
    port = free_port()
    with open(state + ".log", "w") as log:
        p = subprocess.Popen([binary, "serve", "--listen", "%s:%d" % (HOST, port), "--state-dir", state,
                              "--image-dir", images, *args], stdout=log, stderr=log, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if http_request(port, "GET", "/readyz", timeout=2)[0] == 200:
                return p, port
        except OSError:
            pass
        time.sleep(0.05)
    p.kill()
    p.wait()
    raise SystemExit("the daemon did not get ready; see %s.log" % state)


def wait_state(port, vm_id, states, timeout, step=0.5):
    """Polls get_vm until the VM is in one of states; returns the last record seen."""
    deadline = time.monotonic() + timeout
    vm = None
    while time.monotonic() < deadline:
        status, vm = api(port, "GET", "/vms/" + vm_id)
        if status == 200 and isinstance(vm, dict) and vm.get("state") in states:
            return vm
        time.sleep(step)
    return vm


def imds_request(sock_path, method, path, body=None, timeout=20):
    """One request to a VM's metadata listener (<vm>/imds.sock), as the gateway delivers a guest's:
    (status, {lower-case header: value}, payload). A body the server refuses by its Content-Length
    may be cut short; the answer is read all the same."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock_path)
    req = "%s %s HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n" % (method, path)
    if body is not None:
        req += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    try:
        s.sendall(req.encode() + b"\r\n" + (body or b""))
    except (BrokenPipeError, ConnectionResetError):
        pass
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, payload


def port_refuses(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect((HOST, port))
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        s.close()
    return False


def forward_read(address, timeout=20):
    """Connects to a forward_port address and reads until the other side ends the connection:
    ("data", bytes) when it answered, ("closed", b"") when it ended without a byte (a reset
    included), ("timeout", bytes so far) when nothing ended it, ("refused", b"") when nothing
    listens."""
    try:
        h, p = address.rsplit(":", 1)
        s = socket.create_connection((h, int(p)), timeout=timeout)
    except (OSError, AttributeError, ValueError):
        return "refused", b""
    s.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        return "timeout", data
    except ConnectionResetError:
        pass
    finally:
        s.close()
    return ("data" if data else "closed"), data


def content_type(headers):
    return headers.get("content-type", "").split(";")[0].strip()


def json_error_of(status, headers, body):
    """The (code, message) of a REST error envelope, or raises ValueError saying what is wrong."""
    if content_type(headers) != "application/json":
        raise ValueError("content-type %r, not application/json" % headers.get("content-type"))
    doc = json.loads(body)
    if not isinstance(doc, dict) or set(doc) != {"error"} or not isinstance(doc["error"], dict):
        raise ValueError("not an error envelope: %r" % body[:300])
    err = doc["error"]
    if set(err) != {"code", "message"} or not isinstance(err["code"], str) or not isinstance(err["message"], str):
        raise ValueError("error object is not {code, message}: %r" % body[:300])
    return err["code"], err["message"]


def check_json_error(status, headers, body, want_status, want_code, want_message=None):
    diag = "status=%r content-type=%r body=%r" % (status, headers.get("content-type"), body[:300])
    if status != want_status:
        return False, diag
    try:
        code, message = json_error_of(status, headers, body)
    except ValueError as e:
        return False, "%s; %s" % (e, diag)
    if code != want_code:
        return False, diag
    if want_message is not None and message != want_message:
        return False, "message %r, want %r" % (message, want_message)
    return True, "message: %s" % message


def mode_of(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def snapshot_tree(root):
    """{relative path: (kind, size, sha256, mode)} of everything under root, root included."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        out[rel] = ("dir", None, None, "%04o" % mode_of(dirpath))
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            st = os.lstat(p)
            digest = None
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
            kind = "file" if stat.S_ISREG(st.st_mode) else "other"
            out[os.path.relpath(p, root)] = (kind, st.st_size, digest, "%04o" % stat.S_IMODE(st.st_mode))
    return out


def diff_snapshots(a, b):
    lines = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            lines.append("%s: %r -> %r" % (k, a.get(k), b.get(k)))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# daemons


def fake_image_dir(workdir, name=""):
    """An image directory holding the tiny image fake_1.0 and a firmware file, for a daemon whose QEMU
    is the fake of tests/integration/fakes: (image dir, firmware path), images-NAME and vars-NAME in
    workdir (images and vars without a name); made once per name."""
    suffix = "-" + name if name else ""
    images = os.path.join(workdir, "images" + suffix)
    firmware = os.path.join(workdir, "vars" + suffix)
    os.makedirs(images, exist_ok=True)
    for path in (os.path.join(images, "fake_1.0.efi"), os.path.join(images, "fake_1.0.raw"), firmware):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
    return images, firmware


def loop_env(env, workdir, name):
    """env with the loop watchdog's report file of daemon name, unless env names one already."""
    env = dict(env)
    env.setdefault(LOOP_REPORT_ENV, os.path.join(workdir, name + ".loop.jsonl"))
    # A daemon under test boots no firmware run of its own (a QEMU run of half a minute on the
    # fake QEMU or the real one); test-firmware-run.py runs one on purpose.
    env.setdefault("VM_MANAGER_FIRMWARE_RUN", "false")
    return env


def read_loop_report(path):
    """The event loop iterations over 50 ms a daemon reported: a list of {"usec", "waitUsec",
    "phase", "where", "stack"} (an unreadable line is kept as {"line": ...})."""
    found = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    found.append({"line": line.strip()})
    except FileNotFoundError:
        pass
    return found


def loop_known(entry):
    """The reason a slow iteration is known (LOOP_KNOWN), or None."""
    where = entry.get("where") or ""
    return next((why for place, why in LOOP_KNOWN if where.startswith(place)), None)


# The system calls in which a sampled loop is waiting for something (the watchdog's names): an iteration
# that spent over the threshold off the CPU in one of these waited, and that is the loop's doing. The
# socket calls (accept4, connect, send/recv) are left out: the daemon's sockets are non-blocking, so a
# loop caught in one was descheduled there, not waiting.
LOOP_WAITING_SYSCALLS = frozenset((
    "read", "write", "poll", "select", "nanosleep", "wait4", "flock", "fsync", "fdatasync", "rename", "futex",
    "clock_nanosleep", "waitid", "openat", "renameat", "pselect6", "ppoll", "renameat2", "truncate", "ftruncate",
    "unlink", "unlinkat", "fallocate"))


def loop_own_doing(entry):
    """Whether a slow iteration is the loop's doing: over the threshold on a CPU, or off it waiting in a
    system call. An iteration whose time went to neither (the thread neither ran nor waited for a CPU,
    and was not caught in a wait: the host took the CPU away, as a hypervisor's steal does), or that
    was caught in the sanitizer runtime's own allocator work, is not: it is shown, and fails only
    under $VM_MANAGER_LOOP_STRICT. A report without CPU time counts as the loop's doing."""
    if "cpuUsec" not in entry or "usec" not in entry:
        return True
    # The sanitizers' allocator recycling its quarantine (ASan frees a batch of old chunks inside
    # some free() of ours) is the runtime's work, absent from the product's builds.
    if any("__sanitizer::Quarantine" in f or "__asan::" in f for f in (entry.get("stack") or [])[:3]):
        return False
    threshold = LOOP_THRESHOLD_MS * 1000
    blocked = entry["usec"] - entry.get("waitUsec", 0) - entry["cpuUsec"]
    return entry["cpuUsec"] > threshold or (blocked > threshold and entry.get("syscall") in LOOP_WAITING_SYSCALLS)


def loop_report_text(name, section, entries, stacks=2):
    """Lines for a TAP diagnostic: each slow iteration, and the stack of the first few."""
    lines = []
    for i, e in enumerate(entries):
        if "usec" not in e:
            lines.append("%s (%s): unreadable report line %r" % (name, section, e.get("line")))
            continue
        lines.append("%s (%s): %.1f ms (%s%.1f ms waiting for a CPU) in %s, %s, at %s" % (
            name, section, e["usec"] / 1000,
            "%.1f ms on a CPU, " % (e["cpuUsec"] / 1000) if "cpuUsec" in e else "", e.get("waitUsec", 0) / 1000,
            e.get("phase"),
            "waiting in %s()" % e["syscall"] if e.get("syscall") else "running" if "syscall" in e else "not sampled",
            e.get("where") or "?"))
        if i < stacks:
            lines += ["    " + frame for frame in e.get("stack") or []][:16]
    return lines


def check_loop_reports(daemons, t=None):
    """daemons: (name, section, report file); t: the TAP writer, this module's by default (a script
    with a writer of its own and no TODO gets the known places as a passing line). See
    Daemon.check_loops()."""
    t = t or tap
    seen, bad, host, known, reasons = set(), [], [], [], []
    for name, section, path in daemons:
        if path in seen:
            continue
        seen.add(path)
        entries = read_loop_report(path)
        bad += loop_report_text(name, section, [e for e in entries if not loop_known(e) and loop_own_doing(e)])
        host += loop_report_text(name, section, [e for e in entries if not loop_known(e) and not loop_own_doing(e)])
        known += loop_report_text(name, section, [e for e in entries if loop_known(e)], stacks=0)
        reasons += [loop_known(e) for e in entries if loop_known(e) and loop_known(e) not in reasons]
    name = "no event loop iteration over %d ms in any of the %d daemons" % (LOOP_THRESHOLD_MS, len(seen))
    strict = bool(os.environ.get(LOOP_STRICT_ENV))
    ok = t.result(not bad and not (strict and host), name, "\n".join(bad + (host if strict else [])))
    if host and not strict and isinstance(t, Tap):
        # Under the sanitizers on a shared machine an iteration now and then passes 50 ms although the
        # loop neither ran nor waited for it: shown, not fatal unless $VM_MANAGER_LOOP_STRICT is set.
        t.result(False, "no iteration over %d ms that the host or the sanitizers took from the loop" % LOOP_THRESHOLD_MS,
                 "\n".join(host), todo="the loop neither ran nor waited, or ASan recycled its quarantine; "
                 "VM_MANAGER_LOOP_STRICT=1 fails on it")
    if known and isinstance(t, Tap):
        t.result(False, "known: " + name, "\n".join(known), todo="; ".join(reasons))
    elif known:
        t.result(True, "known places, TODO (%s): %s" % ("; ".join(reasons), name), "\n".join(known))
    return ok


current_section = [None]  # the section run() runs, for the loop report's diagnostics


class Daemon:
    all = []

    def __init__(self, workdir, name, args, env=None):
        self.name = name
        self.section = current_section[0]
        self.stderr_path = os.path.join(workdir, name + ".stderr")
        self.stdout_path = os.path.join(workdir, name + ".stdout")
        env = loop_env(env if env is not None else base_env(workdir), workdir, name)
        self.loop_report = env[LOOP_REPORT_ENV]
        # A test that makes the loop slow on purpose (test-loop-watchdog.py) sets this.
        self.slow_loop_expected = False
        with open(self.stderr_path, "wb") as err, open(self.stdout_path, "wb") as out:
            self.proc = subprocess.Popen(
                [BIN, "serve"] + args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                close_fds=True,
            )
        Daemon.all.append(self)

    def slow_loop_iterations(self):
        return read_loop_report(self.loop_report)

    @property
    def pid(self):
        return self.proc.pid

    def stderr(self):
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_healthy(self, port, timeout=10.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False, "exited with status %r before answering; stderr:\n%s" % (
                    self.proc.returncode,
                    self.stderr()[-4000:],
                )
            try:
                status, _, body = http_request(port, "GET", "/healthz", timeout=1)
                if status == 200:
                    return True, None
                last = "status %r body %r" % (status, body)
            except OSError as e:
                last = repr(e)
            time.sleep(0.05)
        return False, "no answer from /healthz on port %d within %.0f s (last: %s); stderr:\n%s" % (
            port,
            timeout,
            last,
            self.stderr()[-4000:],
        )

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        """Sends sig (unless None) and waits; returns (exit status or None on timeout, seconds taken)."""
        start = time.monotonic()
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, time.monotonic() - start

    def sanitizer_lines(self):
        return [line for line in self.stderr().splitlines() if SANITIZER_RE.search(line)]

    @classmethod
    def kill_all(cls):
        for d in cls.all:
            if d.proc.poll() is None:
                d.proc.kill()
            try:
                d.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    @classmethod
    def check_loops(cls):
        """A TAP line: no daemon of the test reported an event loop iteration over 50 ms (those that
        expect one excepted), and, when some were at the known places of LOOP_KNOWN, a TODO line
        with them. A report file shared by daemons of one name is read once."""
        return check_loop_reports([(d.name, d.section, d.loop_report) for d in cls.all if not d.slow_loop_expected])


# ---------------------------------------------------------------------------------------------
# MCP


FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakes")


def fake_daemon(workdir, name, state, images, firmware, env, launcher="process", timeout=20):
    """`vm-manager serve` on the fake QEMU (env's PATH must start with FAKES) on a free port:
    (Daemon, port, ok, why)."""
    port = free_port()
    d = Daemon(workdir, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                               "--ovmf-code", firmware, "--ovmf-vars", firmware, "--launcher", launcher,
                               "--log-level", "debug"], env=env)
    ok, why = d.wait_healthy(port, timeout=timeout)
    return d, port, ok, why


class McpClient:
    """A minimal MCP streamable-HTTP client: one JSON-RPC message per POST, JSON answers."""

    def __init__(self, port, path="/mcp"):
        self.port = port
        self.path = path
        self.session = None
        self.next_id = 1

    def post_raw(self, body, headers=None, session=True, content_type="application/json"):
        h = {}
        if content_type is not None:
            h["Content-Type"] = content_type
        if session and self.session:
            h["Mcp-Session-Id"] = self.session
        h.update(headers or {})
        if isinstance(body, str):
            body = body.encode()
        return http_request(self.port, "POST", self.path, body=body, headers=h)

    def post(self, msg, **kw):
        """Posts a message; returns (status, headers, parsed JSON or None when the body is empty)."""
        status, headers, body = self.post_raw(json.dumps(msg), **kw)
        return status, headers, (json.loads(body) if body else None)

    def request(self, method, params=None, **kw):
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        self.next_id += 1
        if params is not None:
            msg["params"] = params
        return self.post(msg, **kw)

    def initialize(self, version="2025-11-25"):
        status, headers, doc = self.request(
            "initialize",
            {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "vmmtest", "version": "0"}},
            session=False,
        )
        if status != 200 or "mcp-session-id" not in headers:
            raise RuntimeError("initialize failed: %r %r %r" % (status, headers, doc))
        self.session = headers["mcp-session-id"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return doc

    def call(self, name, arguments=None, raw_arguments=False):
        """tools/call; returns the JSON-RPC result object (raises on a protocol error)."""
        params = {"name": name}
        if arguments is not None or raw_arguments:
            params["arguments"] = arguments
        status, headers, doc = self.request("tools/call", params)
        if status != 200 or not isinstance(doc, dict) or "result" not in doc:
            raise RuntimeError("tools/call %s: HTTP %r %r" % (name, status, doc))
        return doc["result"]


def tool_json(result):
    """(parsed text content, structuredContent) of a successful tool result; raises otherwise."""
    if result.get("isError"):
        raise ValueError("tool failed: %r" % result)
    content = result.get("content")
    if not (isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text"):
        raise ValueError("content is not one text item: %r" % content)
    return json.loads(content[0]["text"]), result.get("structuredContent")


def tool_error(result):
    """(code, message) of a failed tool result after checking its shape; raises otherwise."""
    if result.get("isError") is not True:
        raise ValueError("not an error result: %r" % str(result)[:500])
    content = result.get("content")
    if not (isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text"):
        raise ValueError("content is not one text item: %r" % content)
    sc = result.get("structuredContent")
    if not (isinstance(sc, dict) and set(sc) == {"error"} and set(sc["error"]) == {"code", "message"}):
        raise ValueError("structuredContent is not {error:{code,message}}: %r" % sc)
    code, message = sc["error"]["code"], sc["error"]["message"]
    if content[0]["text"] != "%s: %s" % (code, message):
        raise ValueError("text %r is not '<code>: <message>' of %r" % (content[0]["text"][:300], sc))
    return code, message


# ---------------------------------------------------------------------------------------------
# main() skeleton


def run(sections, deadline, prefix):
    """Prints TAP for each section(work) in turn, then the loop watchdog's check over every daemon
    (Daemon.check_loops()). Returns the exit status."""
    print("TAP version 13", flush=True)
    if not BIN or not os.access(BIN, os.X_OK):
        print("1..0 # SKIP no vm-manager binary: set VM_MANAGER_BIN or pass it as argv[1]", flush=True)
        return 1

    os.umask(0o022)

    def on_alarm(signum, frame):
        raise GlobalTimeout("the test ran out of its %d s budget" % deadline)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(deadline)

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix=prefix)
    tap.diag("binary: %s" % BIN)
    tap.diag("work dir: %s" % work)
    try:
        for section in sections:
            t0 = time.monotonic()
            current_section[0] = section.__name__
            try:
                section(work)
            except GlobalTimeout:
                raise
            except Exception:  # noqa: BLE001
                tap.result(False, "%s: ran to the end" % section.__name__, traceback.format_exc())
            tap.diag("%s: %.1f s" % (section.__name__, time.monotonic() - t0))
        current_section[0] = None
        Daemon.check_loops()
    except GlobalTimeout as e:
        tap.result(False, "global deadline", str(e))
    finally:
        signal.alarm(0)
        Daemon.kill_all()
        try:
            if tap.failed:
                for d in Daemon.all:
                    tap.diag("---- stderr of daemon '%s' (pid %d, exit %r) ----" % (d.name, d.pid, d.proc.returncode))
                    if os.path.exists(d.stderr_path):
                        tap.diag(d.stderr()[-2000:])
        finally:
            # VM_MANAGER_TEST_KEEP=1 keeps the work dir (state dirs, daemon logs) of a failed run.
            if tap.failed and os.environ.get("VM_MANAGER_TEST_KEEP"):
                tap.diag("kept %s" % work)
            else:
                shutil.rmtree(work, ignore_errors=True)
    tap.diag("total: %.1f s" % (time.monotonic() - started))
    print("1..%d" % tap.n, flush=True)
    return 1 if tap.failed else 0


def start_thread(fn, *args):
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def processes_under(path):
    """Processes whose command line mentions path (QEMU, swtpm and vhost-device-vsock all name the
    VM's directory)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmd:
            found.append("%s %s" % (pid, cmd[:120]))
    return found


def processes_gone(path, timeout=10):
    """processes_under(path), polled until it is empty or timeout seconds have passed: a process
    that has been told to end (QEMU's helpers after QEMU) may take a moment, more on a busy host."""
    deadline = time.monotonic() + timeout
    left = processes_under(path)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_under(path)
    return left


def imds_relay(unix_path):
    """A TCP listener on 127.0.0.1 whose connections go to unix_path (a VM's imds.sock), as the
    gateway hands a guest's connections over; returns its port. For clients that speak TCP only
    (vm-agent)."""
    srv = socket.socket()
    srv.bind((HOST, 0))
    srv.listen(16)

    def pipe(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        finally:
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def loop():
        while True:
            c, _ = srv.accept()
            u = socket.socket(socket.AF_UNIX)
            try:
                u.connect(unix_path)
            except OSError:
                c.close()
                continue
            start_thread(pipe, c, u)
            start_thread(pipe, u, c)

    start_thread(loop)
    return srv.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# npm packages of the tests (the MCP SDK, oidc-provider)

NPM_STAMP_FORMAT = b"vm-manager npm cache v1\0"


def node_tools(min_major=18):
    """(node, npm) or (None, reason to skip)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return None, "no node or npm on PATH (tools/install-deps.sh check installs them)"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    m = re.match(r"v(\d+)\.", version)
    if not m or int(m.group(1)) < min_major:
        return None, "node %s is older than %d" % (version or "(unknown)", min_major)
    return (node, npm), None


def npm_ci_cached(pkg_dir, cache_dir, timeout=120):
    """`npm ci` of pkg_dir's package.json and package-lock.json into cache_dir, skipped while the
    stamp there matches both files. Returns (ok, diag); the pinned packages are in
    cache_dir/node_modules after success."""
    os.makedirs(cache_dir, exist_ok=True)
    h = hashlib.sha256(NPM_STAMP_FORMAT)
    for name in ("package.json", "package-lock.json"):
        with open(os.path.join(pkg_dir, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    digest = h.hexdigest()
    stamp = os.path.join(cache_dir, "lock.sha256")
    try:
        with open(stamp) as f:
            if f.read().strip() == digest and os.path.isdir(os.path.join(cache_dir, "node_modules")):
                return True, "cached: %s" % cache_dir
    except OSError:
        pass
    if os.path.exists(stamp):
        os.unlink(stamp)
    shutil.rmtree(os.path.join(cache_dir, "node_modules"), ignore_errors=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(os.path.join(pkg_dir, name), os.path.join(cache_dir, name))
    env = dict(os.environ, npm_config_update_notifier="false", npm_config_loglevel="warn")
    start = time.monotonic()
    try:
        p = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=cache_dir, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "npm ci took longer than %d s" % timeout
    if p.returncode != 0:
        return False, "npm ci failed with status %d:\n%s" % (p.returncode, (p.stdout + p.stderr).decode()[-3000:])
    with open(stamp + ".tmp", "w") as f:
        f.write(digest + "\n")
    os.replace(stamp + ".tmp", stamp)
    return True, "npm ci into %s took %.1f s" % (cache_dir, time.monotonic() - start)
