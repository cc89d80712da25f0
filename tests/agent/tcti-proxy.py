#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A TPM behind tss2's cmd TCTI ("cmd:tcti-proxy.py SOCKET"): TPM commands arrive on stdin, are
forwarded to a swtpm's unix socket, and the responses go back on stdout. To the agent this TPM is
not a swtpm socket, so it attaches the event logs, which the tests need."""

import socket
import struct
import sys


def read_exactly(read, n):
    data = b""
    while len(data) < n:
        chunk = read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_message(read):
    header = read_exactly(read, 10)
    if header is None:
        return None
    size = struct.unpack(">I", header[2:6])[0]
    return header + (read_exactly(read, size - 10) or b"")


def main():
    tpm = socket.socket(socket.AF_UNIX)
    tpm.connect(sys.argv[1])
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        command = read_message(stdin.read)
        if command is None:
            return
        tpm.sendall(command)
        stdout.write(read_message(tpm.recv))
        stdout.flush()


if __name__ == "__main__":
    main()
