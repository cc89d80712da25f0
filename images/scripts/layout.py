#!/usr/bin/env python3
# Writes <id>_<version>.layout.json next to the built .raw: the target disk of a VM as the image's
# own /usr/lib/repart.sysinstall.d defines it, resolved against the .raw's GPT, in the form the
# daemon's host install reads (src/storage/disk-layout.h):
#   copied partitions (CopyBlocks=) name the image's partition by UUID, so the copy keeps the UUIDs the
#   root hash and the verity signature name; the ESP is the image's own (it already holds
#   systemd-boot and the UKI, which the installer boot put on a fresh one); Format=empty slots are
#   labelled _empty with the no-auto flag (sysupdate's free slots); var (Format=ext4) takes the rest.
# Usage: layout.py DEFINITIONS_DIR IMAGE.raw OUT.json
import json
import pathlib
import subprocess
import sys

TYPES = {
    "esp": "c12a7328-f81f-11d2-ba4b-00a0c93ec93b",
    "root": "4f68bce3-e8cd-4db1-96e7-fbcaf984b709",
    "root-verity": "2c7357ed-ebd2-46d9-aec1-23d437ec2bf5",
    "root-verity-sig": "41092b05-9fc8-4523-994f-2def0408b176",
    "var": "4d21b016-b534-45c2-a9fb-5c16e091fd2d",
}
NO_AUTO = 63
ALIGN = 4096


def die(msg):
    sys.exit(f"layout.py: {msg}")


def read_definition(path):
    keys, section = {}, None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Partition" and "=" in line:
            k, v = line.split("=", 1)
            keys[k.strip()] = v.strip()
    return keys


def size_bytes(v):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(v[:-1]) * units[v[-1]] if v and v[-1] in units else int(v)


def main():
    if len(sys.argv) != 4:
        die("usage: layout.py DEFINITIONS_DIR IMAGE.raw OUT.json")
    defs, raw, out = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
    table = json.loads(subprocess.run(["sfdisk", "--json", raw], check=True, capture_output=True,
                                      text=True).stdout)["partitiontable"]
    if table.get("label") != "gpt" or table.get("sectorsize", 512) != 512:
        die(f"{raw} has no GPT with 512-byte sectors")
    image_parts = table["partitions"]
    used = set()
    parts = []
    for conf in sorted(defs.glob("*.conf")):
        d = read_definition(conf)
        kind = d.get("Type")
        if kind not in TYPES:
            die(f"{conf.name}: type {kind!r} is not one the host install knows")
        type_guid = TYPES[kind]
        fmt = d.get("Format")
        size = size_bytes(d["SizeMinBytes"]) if "SizeMinBytes" in d else None
        if "SizeMaxBytes" in d and size is not None and size_bytes(d["SizeMaxBytes"]) != size:
            die(f"{conf.name}: only fixed sizes (SizeMinBytes = SizeMaxBytes) are supported")
        if "CopyBlocks" in d or kind == "esp":
            src = next((p for p in image_parts
                        if p["type"].lower() == type_guid and p["uuid"] not in used), None)
            if src is None:
                die(f"{conf.name}: {raw} has no {kind} partition to copy")
            used.add(src["uuid"])
            src_size = src["size"] * 512
            slot = max(size or 0, (src_size + ALIGN - 1) // ALIGN * ALIGN)
            parts.append({"type": type_guid, "label": src.get("name", ""), "content": "copy",
                          "uuid": src["uuid"].lower(), "sizeBytes": slot, "source": conf.name})
        elif fmt == "empty":
            if size is None:
                die(f"{conf.name}: an empty slot needs SizeMinBytes")
            parts.append({"type": type_guid, "label": "_empty", "content": "empty",
                          "sizeBytes": size, "attrBits": [NO_AUTO], "source": conf.name})
        elif fmt == "ext4":
            p = {"type": type_guid, "label": d.get("Label", kind), "content": "ext4",
                 "source": conf.name}
            if size is None:
                p["grow"] = True
            else:
                p["sizeBytes"] = size
            parts.append(p)
        else:
            die(f"{conf.name}: Format={fmt} is not one the host install knows")
    grown = [i for i, p in enumerate(parts) if p.get("grow")]
    if grown and grown != [len(parts) - 1]:
        die("only the last partition may take the rest of the disk")
    doc = {"format": "vm-manager-layout/1", "image": pathlib.Path(raw).stem, "partitions": parts}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    main()
