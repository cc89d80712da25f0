#!/usr/bin/env python3
"""Keeps the includes of src/ pointing down its layers (issue 35).

The rule is docs/design.md's "Layers of src/": a file includes the headers of its own directory
and of the directories its row lists, and of some directories only the headers named there.
Headers are included by their base name (meson's include directories are flat), so each name is
looked up in src/*/ to find the directory it belongs to.

  usage: tools/check-includes.py [SOURCE_ROOT]
         tools/check-includes.py --self-test   (a planted upward include must fail)
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

# docs/design.md, "Layers of src/": directory -> the directories it may include besides itself.
BELOW_BASIC = ["basic"]
LAYERS = {
    "basic": [],
    "http": BELOW_BASIC,
    "vm": BELOW_BASIC,
    "net": BELOW_BASIC,
    "attest": BELOW_BASIC,
    "images": BELOW_BASIC,
    "metrics": BELOW_BASIC,
    "host": BELOW_BASIC,
    "storage": BELOW_BASIC,
    "trace": ["basic", "http"],
    "auth": ["basic", "http"],
    "oci": ["basic", "attest", "images"],
    "core": ["basic", "vm", "net", "attest", "images", "metrics", "host", "storage"],
    "api": ["basic", "http", "trace", "core"],
    "mcp": ["basic", "http", "trace", "core"],
    "imds": ["basic", "http", "core"],
    "cli": ["basic", "core"],
    "daemon": ["basic", "http", "vm", "net", "attest", "images", "metrics", "host", "storage",
               "trace", "auth", "oci", "core", "api", "mcp", "imds", "cli"],
}

# The same section: of these (directory, included directory) pairs only the headers named.
ONLY = {
    ("api", "core"): {"operation.h"},
    ("mcp", "core"): {"operation.h"},
    ("imds", "core"): {"operation.h"},
    ("cli", "core"): {"operation.h"},
    ("daemon", "core"): {"manager.h", "vm-exec-helper.h", "manager-firmware.h"},
}

# Known exceptions: (file, header, why it is acceptable). An entry that no longer occurs fails the
# check, so that the list only shrinks.
BASELINE = [
    ("src/daemon/serve.c", "network.h",
     "the flags --network-subnet and --default-network are checked with network.h's pure parsers "
     "while the command line is read, before there is a manager to ask"),
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def header_dirs(src):
    """Maps each header's base name to its directory under src/."""
    where = {}
    for d in sorted(os.listdir(src)):
        path = os.path.join(src, d)
        if not os.path.isdir(path):
            continue
        for name in os.listdir(path):
            if name.endswith(".h"):
                where.setdefault(name, d)
    return where


def problem(rel, d, header, hd):
    """Why rel (in directory d) may not include header (in directory hd), or None."""
    base = os.path.basename(rel)
    if header.endswith("-internal.h") and hd != d:
        return "%s is internal to src/%s" % (header, hd)
    if header == "vm-internal.h" and not base.startswith("vm"):
        return "vm-internal.h is for the core's vm*.c rooms alone"
    if hd == d:
        return None
    if hd not in LAYERS[d]:
        return "src/%s may not include src/%s (it may include: %s)" % (
            d, hd, ", ".join(LAYERS[d]) or "nothing of ours")
    only = ONLY.get((d, hd))
    if only is not None and header not in only:
        return "of src/%s, src/%s includes only %s" % (hd, d, ", ".join(sorted(only)))
    return None


def check(root):
    src = os.path.join(root, "src")
    if not os.path.isdir(src):
        print("check-includes: no %s" % src, file=sys.stderr)
        return 1
    where = header_dirs(src)
    baseline = {(f, h): why for f, h, why in BASELINE}
    seen = set()
    bad = 0
    files = 0
    for d in sorted(os.listdir(src)):
        path = os.path.join(src, d)
        if not os.path.isdir(path):
            continue
        if d not in LAYERS:
            print("check-includes: src/%s is in no layer: add it to docs/design.md's \"Layers of src/\" "
                  "and to tools/check-includes.py" % d, file=sys.stderr)
            bad = 1
            continue
        for name in sorted(os.listdir(path)):
            if not name.endswith((".c", ".h")):
                continue
            files += 1
            rel = "src/%s/%s" % (d, name)
            with open(os.path.join(path, name), encoding="utf-8") as f:
                text = f.read()
            for m in INCLUDE.finditer(text):
                header = os.path.basename(m.group(1))
                hd = where.get(header)
                if hd is None:
                    continue  # not one of ours (a generated header, or one meson finds elsewhere)
                why = problem(rel, d, header, hd)
                if why is None:
                    continue
                if (rel, header) in baseline:
                    seen.add((rel, header))
                    continue
                line = text.count("\n", 0, m.start()) + 1
                print("%s:%d: includes %s: %s (docs/design.md, \"Layers of src/\")" % (rel, line, header, why),
                      file=sys.stderr)
                bad = 1
    for key in baseline:
        if key not in seen:
            print("check-includes: %s no longer includes %s against the layers: remove it from BASELINE" % key,
                  file=sys.stderr)
            bad = 1
    if not bad:
        print("check-includes: %d files include down the layers (%d known exceptions)" % (files, len(baseline)))
    return bad


def self_test():
    t = tempfile.mkdtemp()
    try:
        for d, name, text in [
            ("vm", "vm-state.h", "#pragma once\n"),
            ("basic", "planted.c", '#include "vm-state.h"\n'),
            ("daemon", "serve.c", '#include "network.h"\n'),
            ("core", "network.h", "#pragma once\n"),
        ]:
            os.makedirs(os.path.join(t, "src", d), exist_ok=True)
            with open(os.path.join(t, "src", d, name), "w", encoding="utf-8") as f:
                f.write(text)
        p = subprocess.run([sys.executable, os.path.abspath(__file__), t], capture_output=True, text=True)
        if p.returncode == 0 or "src/basic/planted.c:1: includes vm-state.h" not in p.stderr:
            print("check-includes: a planted include of src/vm from src/basic passed the check", file=sys.stderr)
            sys.stderr.write(p.stderr)
            return 1
        print("check-includes: a planted include of src/vm from src/basic fails the check")
        return 0
    finally:
        shutil.rmtree(t)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(check(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
