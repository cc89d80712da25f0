# SPDX-License-Identifier: LGPL-2.1-or-later
"""Shared helpers of the vm-agent tests (standard library only): TAP output, a swtpm on a unix
socket in a temporary directory, running vm-agent and tpm2-tools against it, and decoding the TPM
structures of a quote request far enough to check them.

The tests skip ("1..0 # SKIP") when swtpm is not installed.
"""

import base64
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

AGENT = os.environ.get("VM_AGENT_BIN") or (sys.argv[1] if len(sys.argv) > 1 else None)

SANITIZER_RE = re.compile(r"ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:")

TPM2_ALG_SHA256 = 0x000B
TPM2_ALG_ECC = 0x0023
TPM2_ALG_ECDSA = 0x0018


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def diag(self, text):
        for line in str(text).splitlines() or [""]:
            print("# " + line, flush=True)

    def ok(self, cond, name, diag=None):
        self.n += 1
        name = " ".join(str(name).split()).replace("#", "no.")
        print("%s %d - %s" % ("ok" if cond else "not ok", self.n, name), flush=True)
        if not cond:
            self.failed += 1
            if diag is not None:
                self.diag(diag)
        return bool(cond)

    def done(self):
        print("1..%d" % self.n, flush=True)
        return 1 if self.failed else 0


def skip_all(reason):
    print("1..0 # SKIP " + reason, flush=True)
    sys.exit(0)


class Result:
    def __init__(self, rc, out, err, elapsed):
        self.rc, self.out, self.err, self.elapsed = rc, out, err, elapsed

    def __repr__(self):
        return "rc=%s elapsed=%.2fs\nstdout:\n%s\nstderr:\n%s" % (self.rc, self.elapsed, self.out, self.err)


def agent_env(extra=None):
    env = dict(os.environ)
    for k in ("TSS2_LOG", "VM_AGENT_EVENT_LOG", "VM_AGENT_USERSPACE_LOG", "http_proxy", "HTTP_PROXY"):
        env.pop(k, None)
    env.update(extra or {})
    return env


def run_agent(args, env=None, timeout=30):
    start = time.monotonic()
    p = subprocess.run([AGENT] + list(args), capture_output=True, text=True, env=agent_env(env), timeout=timeout)
    r = Result(p.returncode, p.stdout, p.stderr, time.monotonic() - start)
    if SANITIZER_RE.search(p.stderr):
        raise AssertionError("sanitizer report from vm-agent %s:\n%s" % (" ".join(args), p.stderr))
    return r


class Swtpm:
    """`swtpm socket --tpm2` on a unix socket, state in a fresh directory, started up (startup-clear),
    as docs/agent.md describes for development hosts."""

    def __init__(self, workdir):
        self.dir = os.path.join(workdir, "swtpm")
        os.makedirs(self.dir)
        self.sock = os.path.join(self.dir, "s")
        self.tcti = "swtpm:path=" + self.sock
        self.log = open(os.path.join(self.dir, "swtpm.log"), "w")
        self.proc = subprocess.Popen(
            ["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + self.dir,
             "--server", "type=unixio,path=" + self.sock,
             "--ctrl", "type=unixio,path=" + self.sock + ".ctrl",
             "--flags", "not-need-init,startup-clear"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("swtpm exited with %s" % self.proc.returncode)
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.sock)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def tool(self, *args, check=True, binary=False):
        """Runs a tpm2-tools command against this swtpm. What creates objects is followed by a flush
        of the transient ones: swtpm has no resource manager, and they would pile up."""
        env = dict(os.environ, TPM2TOOLS_TCTI=self.tcti)
        p = subprocess.run(list(args), capture_output=True, env=env, timeout=30)
        if args[0] in ("tpm2_createek", "tpm2_createprimary", "tpm2_create", "tpm2_load", "tpm2_evictcontrol"):
            subprocess.run(["tpm2_flushcontext", "-t"], capture_output=True, env=env, timeout=30)
        if check and p.returncode != 0:
            raise RuntimeError("%s failed (%d): %s" % (" ".join(args), p.returncode, p.stderr.decode(errors="replace")))
        return p if binary else subprocess.CompletedProcess(
            p.args, p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))

    def transient_handles(self):
        out = self.tool("tpm2_getcap", "handles-transient").stdout
        return [line for line in out.splitlines() if line.strip()]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def b64(s):
    """Strict standard base64 with padding: decodes, and encodes back to the same text."""
    raw = base64.b64decode(s, validate=True)
    if base64.b64encode(raw).decode() != s:
        raise ValueError("not canonical padded base64")
    return raw


def tpm2b(buf, off):
    n = struct.unpack_from(">H", buf, off)[0]
    return buf[off + 2:off + 2 + n], off + 2 + n


def parse_attest(buf):
    """The fields of a TPMS_ATTEST a quote check needs (TPM 2.0 part 2, 10.12.12)."""
    magic, typ = struct.unpack_from(">IH", buf, 0)
    off = 6
    signer, off = tpm2b(buf, off)
    extra, off = tpm2b(buf, off)
    off += 8 + 4 + 4 + 1 + 8  # clockInfo, firmwareVersion
    count = struct.unpack_from(">I", buf, off)[0]
    off += 4
    sels = []
    for _ in range(count):
        alg, size = struct.unpack_from(">HB", buf, off)
        bits = buf[off + 3:off + 3 + size]
        off += 3 + size
        sels.append((alg, [i for i in range(size * 8) if bits[i // 8] & (1 << (i % 8))]))
    digest, off = tpm2b(buf, off)
    return {"magic": magic, "type": typ, "extra": extra, "selections": sels, "digest": digest, "rest": len(buf) - off}


def parse_public(buf):
    """type, nameAlg and objectAttributes of a TPMT_PUBLIC."""
    typ, name_alg, attrs = struct.unpack_from(">HHI", buf, 0)
    return {"type": typ, "nameAlg": name_alg, "attributes": attrs}


def tools_pcr_file(alg, indexes, values):
    """PCR values in the serialised form tpm2_quote -o writes and tpm2_checkquote -f reads: a native
    TPML_PCR_SELECTION, a count, then TPML_DIGESTs of 8. tpm2_checkquote 5.4 cannot use a plain
    values file with -l once 8 or more PCRs are selected (tpm2-tools issue 3542)."""
    sel = bytearray(4)
    for i in indexes:
        sel[i // 8] |= 1 << (i % 8)
    out = struct.pack("<I", 1) + struct.pack("<HB4sx", alg, 3, bytes(sel)) + bytes(8 * 15)
    chunks = [values[i:i + 8] for i in range(0, len(values), 8)]
    out += struct.pack("<I", len(chunks))
    for ch in chunks:
        out += struct.pack("<I", len(ch))
        out += b"".join(struct.pack("<H", len(v)) + v.ljust(64, b"\0") for v in ch)
        out += bytes(66 * (8 - len(ch)))
    return out


def main(body, need=("swtpm",)):
    """Runs body(tap, workdir) with the skip check, a work directory and the TAP plan."""
    if not AGENT or not os.access(AGENT, os.X_OK):
        print("Bail out! vm-agent binary not given (VM_AGENT_BIN)", flush=True)
        sys.exit(1)
    missing = ["%s (package %s)" % (t, "tpm2-tools" if t.startswith("tpm2_") else t) for t in need if not shutil.which(t)]
    if missing:
        skip_all("%s missing" % ", ".join(missing))
    tap = Tap()
    with tempfile.TemporaryDirectory(prefix="vm-agent-test-") as workdir:
        try:
            body(tap, workdir)
        except Exception:
            tap.ok(False, "the test ran to its end", traceback.format_exc())
    sys.exit(tap.done())
