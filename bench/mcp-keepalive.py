#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""What the MCP keep-alives cost (the figures of docs/benchmarks.md, "MCP keep-alives").

  wire  One session's GET stream at the default --mcp-keepalive (15 s), read raw for 61 s: the
        bytes of the HTTP body (chunk framing included) and the TCP segments it took, per minute.
  cpu   STREAMS sessions, each with its GET stream open, for SECONDS with --mcp-keepalive 1s, then
        the same with --mcp-keepalive 1h (no keep-alive in the window): the daemon's CPU time
        (utime + stime from /proc) over the window, per keep-alive sent.

usage: bench/mcp-keepalive.py VM_MANAGER_BINARY [STREAMS [SECONDS]]   (default 500 streams, 30 s)
Prints one JSON object. Uses its own temporary state directory and free 127.0.0.1 ports.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(port, body, session=None):
    s = socket.create_connection((HOST, port))
    data = json.dumps(body).encode()
    head = "POST /mcp HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
        HOST, port, len(data))
    if session:
        head += "Mcp-Session-Id: %s\r\n" % session
    s.sendall(head.encode() + b"Connection: close\r\n\r\n" + data)
    reply = b""
    while True:
        piece = s.recv(65536)
        if not piece:
            break
        reply += piece
    s.close()
    return reply


def session(port):
    reply = post(port, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}})
    for line in reply.split(b"\r\n"):
        if line.lower().startswith(b"mcp-session-id:"):
            return line.split(b":", 1)[1].strip().decode()
    raise RuntimeError("initialize: no session id in %r" % reply[:300])


def open_stream(port, sid):
    s = socket.create_connection((HOST, port))
    s.sendall(("GET /mcp HTTP/1.1\r\nHost: %s:%d\r\nAccept: text/event-stream\r\nMcp-Session-Id: %s\r\n\r\n"
               % (HOST, port, sid)).encode())
    head = b""
    while b": stream open" not in head:
        piece = s.recv(4096)
        if not piece:
            raise RuntimeError("GET stream closed: %r" % head)
        head += piece
    return s


class Daemon:
    def __init__(self, binary, work, keepalive):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("VM_MANAGER_")}
        env["HOME"] = work
        self.proc = subprocess.Popen([binary, "serve", "--listen", "%s:%d" % (HOST, self.port), "--state-dir",
                                      os.path.join(work, "state-" + keepalive), "--log-level", "warning",
                                      "--mcp-keepalive", keepalive],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=env)
        for _ in range(200):
            try:
                socket.create_connection((HOST, self.port)).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the daemon did not listen")

    def cpu(self):
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def wire(binary, work):
    d = Daemon(binary, work, "15s")
    try:
        s = open_stream(d.port, session(d.port))
        s.settimeout(1)
        payload, segments, start = 0, 0, time.monotonic()
        while time.monotonic() - start < 61:
            try:
                piece = s.recv(65536)
            except socket.timeout:
                continue
            if not piece:
                break
            payload += len(piece)
            segments += 1
        s.close()
        return {"interval_s": 15, "window_s": 61, "body_bytes": payload, "segments": segments,
                "body_bytes_per_min": round(payload * 60 / 61, 1)}
    finally:
        d.stop()


def cpu(binary, work, streams, seconds):
    out = {}
    for keepalive in ("1s", "1h"):
        d = Daemon(binary, work, keepalive)
        try:
            socks = [open_stream(d.port, session(d.port)) for _ in range(streams)]
            for s in socks:
                s.setblocking(False)
            time.sleep(1.5)
            c0, t0 = d.cpu(), time.monotonic()
            received = 0
            while time.monotonic() - t0 < seconds:
                time.sleep(0.5)
                for s in socks:
                    try:
                        received += len(s.recv(65536))
                    except BlockingIOError:
                        pass
            out[keepalive] = {"cpu_s": round(d.cpu() - c0, 3), "window_s": round(time.monotonic() - t0, 1),
                              "bytes_received": received}
            for s in socks:
                s.close()
        finally:
            d.stop()
    sent = streams * seconds  # one keep-alive per stream and second
    extra = out["1s"]["cpu_s"] - out["1h"]["cpu_s"]
    out["streams"] = streams
    out["keepalives_sent"] = sent
    out["cpu_us_per_keepalive"] = round(extra * 1e6 / sent, 1)
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = os.path.abspath(sys.argv[1])
    streams = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    seconds = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    work = tempfile.mkdtemp(prefix="vmm-bench-ka-")
    try:
        result = {"wire": wire(binary, work), "cpu": cpu(binary, work, streams, seconds)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
