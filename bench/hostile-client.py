#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Misbehaving HTTP clients for bench/hardening.sh: each mode runs against 127.0.0.1:PORT until
SIGTERM or SIGINT, then prints one line saying what it did (the last column of the table).

  idle PORT --count N --from ADDR...       N connections from each address that send nothing; any the
                                           server closes is opened again
  slowloris PORT --count N --from ADDR     N connections sending a request a byte every --gap
                                           seconds; any the server cuts starts over
  oversized PORT --clients N               N clients sending, in turn, 2,000 query arguments, a 40 KB
                                           header, 1,000 headers and a 9 MiB Content-Length, each
                                           on a fresh connection, reading the answer

A new mode is a function taking (args, stop) and returning its summary, listed in MODES.
Standard library only.
"""

import argparse
import selectors
import signal
import socket
import sys
import threading
import time

HOST = "127.0.0.1"


def connect(port, source, blocking=False):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.connect((HOST, port))
    s.setblocking(blocking)
    return s


def mode_idle(args, stop):
    sel = selectors.DefaultSelector()
    opened = reopened = 0
    for source in args.sources:
        for _ in range(args.count):
            sel.register(connect(args.port, source), selectors.EVENT_READ, source)
            opened += 1
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.2):
            s, source = key.fileobj, key.data
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if data:
                continue
            sel.unregister(s)
            s.close()
            try:
                sel.register(connect(args.port, source), selectors.EVENT_READ, source)
                reopened += 1
            except OSError:
                pass
    held = len(sel.get_map())
    return "%d opened, %d reopened after the server closed them, %d open at the end" % (opened, reopened, held)


def mode_slowloris(args, stop):
    request = b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 4000 + b"\r\n\r\n"
    conns = {}
    cut = 0
    for _ in range(args.count):
        conns[connect(args.port, args.source)] = 0
    while not stop.is_set():
        t0 = time.monotonic()
        for s in list(conns):
            off = conns[s]
            try:
                if s.send(request[off:off + 1]) != 1:
                    raise OSError("short send")
                conns[s] = off + 1 if off + 1 < len(request) else 0
                try:
                    if s.recv(4096) == b"":
                        raise OSError("closed")
                except BlockingIOError:
                    pass
            except OSError:
                del conns[s]
                s.close()
                cut += 1
                try:
                    conns[connect(args.port, args.source)] = 0
                except OSError:
                    pass
        stop.wait(max(0.0, args.gap - (time.monotonic() - t0)))
    return "%d connections, %d cut by the server and started over" % (args.count, cut)


def oversized_requests():
    return [
        b"GET /api/v1/vms?" + b"&".join(b"a%d=1" % i for i in range(2000)) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n",
        b"GET /api/v1/vms HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(1000)) + b"\r\n",
        b"POST /api/v1/networks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 9437184\r\n\r\n{",
    ]


def mode_oversized(args, stop):
    requests = oversized_requests()
    counts = {"answered": 0, "unanswered": 0}
    lock = threading.Lock()

    def client():
        i = 0
        while not stop.is_set():
            req = requests[i % len(requests)]
            i += 1
            answered = False
            try:
                s = connect(args.port, HOST, blocking=True)
                s.settimeout(5)
                try:
                    s.sendall(req)
                except OSError:
                    pass
                try:
                    answered = s.recv(16).startswith(b"HTTP/1.1 4")
                except OSError:
                    pass
                s.close()
            except OSError:
                pass
            with lock:
                counts["answered" if answered else "unanswered"] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=6)
    return "%d oversized requests answered 4xx, %d without an answer" % (counts["answered"], counts["unanswered"])


MODES = {"idle": mode_idle, "slowloris": mode_slowloris, "oversized": mode_oversized}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("port", type=int)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--from", dest="sources", nargs="+", default=[HOST])
    p.add_argument("--gap", type=float, default=0.1)
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args()
    args.source = args.sources[0]

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(MODES[args.mode](args, stop), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
