#!/usr/bin/env python3
"""A service manager that answers slowly, for tests: a proxy on a unix socket in front of a
manager's private D-Bus socket ($XDG_RUNTIME_DIR/systemd/private) that holds chosen messages of the
manager for seconds before passing them on.

  dbus-delay-proxy.py LISTEN UPSTREAM CONFIG

LISTEN is the socket to create (a client finds it as <runtime dir>/systemd/private), UPSTREAM the
manager's. CONFIG is a JSON file, read again whenever it changes:

  {"reply:StartTransientUnit": 3.0, "signal:JobRemoved": 3.0}

"reply:<member>" holds the reply (or error) to a call of that method, "signal:<member>" that signal,
for that many seconds from when it came; everything else passes at once, so a held message is
overtaken by later ones (a JobRemoved held less than the reply naming its job arrives first). The
client's messages pass at once. Each held message is logged on stderr.

Only the framing is parsed (the header's type, serial, MEMBER and REPLY_SERIAL): the SASL lines pass
as they are, and no file descriptors are passed on (the systemd launcher sends none).
"""

import asyncio
import heapq
import json
import os
import struct
import sys
import time

METHOD_CALL, METHOD_RETURN, ERROR, SIGNAL = 1, 2, 3, 4
FIELD_MEMBER, FIELD_REPLY_SERIAL = 3, 5


def align(n, a):
    return (n + a - 1) // a * a


def message(buf):
    """(length, type, serial, {field code: value}) of the message at the start of buf, or None when
    it is not all there yet."""
    if len(buf) < 16:
        return None
    endian = "<" if buf[0:1] == b"l" else ">"
    body_len, serial, fields_len = struct.unpack(endian + "III", buf[4:16])
    end = 16 + fields_len
    total = align(end, 8) + body_len
    if len(buf) < total:
        return None
    fields = {}
    pos = 16
    while pos < end:
        code, n = buf[pos], buf[pos + 1]
        sig = buf[pos + 2:pos + 2 + n].decode()
        pos += 3 + n
        if sig in ("s", "o"):
            pos = align(pos, 4)
            (size,) = struct.unpack(endian + "I", buf[pos:pos + 4])
            fields[code] = buf[pos + 4:pos + 4 + size].decode(errors="replace")
            pos += 4 + size + 1
        elif sig == "g":
            fields[code] = buf[pos + 1:pos + 1 + buf[pos]].decode()
            pos += 1 + buf[pos] + 1
        elif sig == "u":
            pos = align(pos, 4)
            (fields[code],) = struct.unpack(endian + "I", buf[pos:pos + 4])
            pos += 4
        else:
            raise ValueError("header field of signature %r" % sig)
        pos = align(pos, 8)
    return total, buf[1], serial, fields


class Config:
    def __init__(self, path):
        self.path = path
        self.mtime = None
        self.delays = {}

    def delay(self, key):
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime != self.mtime:
                with open(self.path) as f:
                    self.delays = json.load(f)
                self.mtime = mtime
        except (OSError, ValueError):
            pass
        return float(self.delays.get(key, 0))


class Connection:
    def __init__(self, config, reader, writer, up_reader, up_writer):
        self.config = config
        self.client = (reader, writer)
        self.upstream = (up_reader, up_writer)
        self.calls = {}  # serial of a client's method call -> its member
        self.queue = []  # (due, seq, bytes) of the manager's messages
        self.seq = 0
        self.wake = asyncio.Event()

    async def client_to_manager(self):
        reader, (_, writer) = self.client[0], self.upstream
        buf, text = b"", True
        while True:
            data = await reader.read(65536)
            if not data:
                break
            buf += data
            while text:
                nl = buf.find(b"\r\n")
                if nl < 0:
                    break
                line, buf = buf[:nl + 2], buf[nl + 2:]
                writer.write(line)
                text = line.lstrip(b"\0") != b"BEGIN\r\n"
            while not text:
                m = message(buf)
                if not m:
                    break
                total, kind, serial, fields = m
                if kind == METHOD_CALL and FIELD_MEMBER in fields:
                    self.calls[serial] = fields[FIELD_MEMBER]
                writer.write(buf[:total])
                buf = buf[total:]
            await writer.drain()
        writer.close()

    async def manager_to_client(self):
        reader = self.upstream[0]
        buf, text = b"", True
        while True:
            data = await reader.read(65536)
            if not data:
                break
            buf += data
            while text and buf:
                if buf[:1] in (b"l", b"B"):  # a message; SASL lines start with OK, AGREE_UNIX_FD, ...
                    text = False
                    break
                nl = buf.find(b"\r\n")
                if nl < 0:
                    break
                self.push(0, buf[:nl + 2])
                buf = buf[nl + 2:]
            while not text:
                m = message(buf)
                if not m:
                    break
                total, kind, serial, fields = m
                key = None
                if kind in (METHOD_RETURN, ERROR):
                    key = "reply:%s" % self.calls.pop(fields.get(FIELD_REPLY_SERIAL), "?")
                elif kind == SIGNAL:
                    key = "signal:%s" % fields.get(FIELD_MEMBER, "?")
                delay = self.config.delay(key) if key else 0
                if delay > 0:
                    print("dbus-delay-proxy: holding %s for %.1f s" % (key, delay), file=sys.stderr, flush=True)
                self.push(delay, buf[:total])
                buf = buf[total:]
        self.push(0, None)

    def push(self, delay, data):
        heapq.heappush(self.queue, (time.monotonic() + delay, self.seq, data))
        self.seq += 1
        self.wake.set()

    async def sender(self):
        writer = self.client[1]
        while True:
            if not self.queue:
                self.wake.clear()
                await self.wake.wait()
                continue
            due = self.queue[0][0]
            now = time.monotonic()
            if due > now:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), due - now)
                except asyncio.TimeoutError:
                    pass
                continue
            _, _, data = heapq.heappop(self.queue)
            if data is None:
                break
            writer.write(data)
            await writer.drain()
        writer.close()


async def main(listen, upstream, config_path):
    config = Config(config_path)

    async def accept(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(upstream)
        except OSError as e:
            print("dbus-delay-proxy: %s: %s" % (upstream, e), file=sys.stderr, flush=True)
            writer.close()
            return
        c = Connection(config, reader, writer, up_reader, up_writer)
        tasks = [asyncio.ensure_future(t) for t in (c.client_to_manager(), c.manager_to_client(), c.sender())]
        try:
            await asyncio.gather(*tasks)
        except (ConnectionError, ValueError) as e:
            print("dbus-delay-proxy: connection ended: %r" % e, file=sys.stderr, flush=True)
        finally:
            for t in tasks:
                t.cancel()
            writer.close()
            up_writer.close()

    server = await asyncio.start_unix_server(accept, path=listen)
    os.chmod(listen, 0o666)
    print("dbus-delay-proxy: listening on %s" % listen, file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    asyncio.run(main(*sys.argv[1:]))
