#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
# Writes the small PE/COFF images test-attest-predict.c and fuzz-attest-pe read, built from the
# PE format specification rather than by a toolchain, so that each exercises one rule of the
# Authenticode digest. None of them runs; the bytes inside sections are patterns.
#   kernel.efi    PE32+, .text, .data and a few bytes after them: the payload of uki.efi's .linux
#   uki.efi       PE32+, a UKI's shape: .text, .osrel, .cmdline, .linux (kernel.efi, VirtualSize
#                 below its file-aligned raw size), a .bss without file data; .cmdline listed before
#                 .linux in the section table but stored after it; a non-zero CheckSum
#   signed32.efi  PE32, bytes after the last section (hashed) and a certificate table at the end
#                 (not hashed), named by the security directory entry
#   fewdirs.efi   PE32+ whose optional header has 4 data directories, so no certificate entry to
#                 skip, plus trailing bytes
# The expected digests in the test come from a separate Python Authenticode implementation (the
# issue 36 research prototype; kernel, uki, signed32), confirmed for uki.efi and signed32.efi by
# osslsigncode's "Calculated message digest" after signing a copy, and for fewdirs.efi (which the
# prototype does not handle: it always skips a certificate entry) from the byte ranges printed by
# this script with --ranges.
#   usage: tests/data/attest/pe/gen.py [--ranges]
import os
import struct
import sys

HEADER_SIZE = 0x400
FILE_ALIGN = 0x200
SECTION_ALIGN = 0x1000


def align(n, a):
    return (n + a - 1) // a * a


def pattern(seed, n):
    # Deterministic, non-repeating enough bytes for a section body.
    out = bytearray()
    x = seed
    while len(out) < n:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(x >> 16 & 0xFF)
    return bytes(out)


def make_pe(plus, sections, n_rva=16, checksum=0, trailer=b"", cert=None, file_order=None):
    """sections: (name, data, virtual_size or None) in section-table order; file_order lists
    their indexes in the order their data is stored."""
    opt_dirs = 112 if plus else 96
    opt_size = opt_dirs + 8 * n_rva
    pe_off = 0x80
    table = pe_off + 24 + opt_size
    assert table + 40 * len(sections) <= HEADER_SIZE

    raw = {}
    pos = HEADER_SIZE
    for i in file_order or range(len(sections)):
        name, data, vsize = sections[i]
        if not data:
            raw[i] = (0, 0)
            continue
        raw[i] = (pos, align(len(data), FILE_ALIGN))
        pos += raw[i][1]
    end_of_sections = pos
    image = bytearray(pos)

    image[0:2] = b"MZ"
    struct.pack_into("<I", image, 0x3C, pe_off)
    image[0x40:0x40 + 39] = b"This program cannot be run in DOS mode."
    image[pe_off:pe_off + 4] = b"PE\0\0"
    struct.pack_into(
        "<HHIIIHH", image, pe_off + 4, 0x8664 if plus else 0x14C, len(sections), 0, 0, 0, opt_size, 0x0206)

    opt = pe_off + 24
    struct.pack_into("<H", image, opt, 0x20B if plus else 0x10B)
    struct.pack_into("<I", image, opt + 16, SECTION_ALIGN)  # AddressOfEntryPoint
    if plus:
        struct.pack_into("<Q", image, opt + 24, 0x10000000)  # ImageBase
    else:
        struct.pack_into("<II", image, opt + 24, 0, 0x400000)  # BaseOfData, ImageBase
    struct.pack_into("<II", image, opt + 32, SECTION_ALIGN, FILE_ALIGN)
    size_of_image = SECTION_ALIGN * (len(sections) + 1)
    struct.pack_into("<IIIHH", image, opt + 56, size_of_image, HEADER_SIZE, checksum, 10, 0)
    struct.pack_into("<I", image, opt_dirs - 4 + opt, n_rva)

    for i, (name, data, vsize) in enumerate(sections):
        h = table + 40 * i
        offset, size = raw[i]
        vs = vsize if vsize is not None else len(data)
        image[h:h + 8] = name.ljust(8, b"\0")
        struct.pack_into("<IIII", image, h + 8, vs, SECTION_ALIGN * (i + 1), size, offset)
        struct.pack_into("<I", image, h + 36, 0x40000040)
        image[offset:offset + len(data)] = data

    image += trailer
    if cert is not None:
        while len(image) % 8:
            image.append(0)
        blob = struct.pack("<IHH", 8 + len(cert), 0x0200, 0x0002) + cert
        assert n_rva > 4
        struct.pack_into("<II", image, opt + opt_dirs + 4 * 8, len(image), len(blob))
        image += blob
    return bytes(image), end_of_sections, opt


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    kernel, _, _ = make_pe(
        True, [(b".text", pattern(1, 700), None), (b".data", pattern(2, 100), None)], trailer=b"kernel tail")
    uki, _, _ = make_pe(
        True,
        [
            (b".text", pattern(3, 300), None),
            (b".osrel", b"ID=test\nVERSION_ID=1\n", None),
            (b".cmdline", b"console=ttyS0 quiet", None),
            (b".linux", kernel, None),
            (b".bss", b"", 0x2000),
        ],
        checksum=0x1234ABCD,
        file_order=[0, 1, 3, 2, 4],
    )
    signed32, _, _ = make_pe(
        False,
        [(b".text", pattern(4, 1000), None), (b".reloc", pattern(5, 12), None)],
        trailer=b"trailing debug data!",
        cert=pattern(6, 60),
    )
    fewdirs, end, opt = make_pe(True, [(b".text", pattern(7, 200), None)], n_rva=4, trailer=b"tail")

    for name, data in (("kernel.efi", kernel), ("uki.efi", uki), ("signed32.efi", signed32),
                       ("fewdirs.efi", fewdirs)):
        with open(os.path.join(here, name), "wb") as f:
            f.write(data)

    if "--ranges" in sys.argv:
        # fewdirs.efi: everything but the CheckSum, in file order (its one section follows the
        # headers, the tail follows the section).
        checksum = opt + 64
        print("fewdirs.efi ranges: [0,%#x) [%#x,%#x)" % (checksum, checksum + 4, len(fewdirs)), end)


if __name__ == "__main__":
    main()
