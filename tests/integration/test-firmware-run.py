#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""One real firmware run (src/core/manager-firmware.h): `vm-manager firmware-run` boots the host's
OVMF with a fresh swtpm and the host's kernel under TCG (512 MiB, one CPU, so that it stays light),
and its cache entry holds the firmware's events up to the separators: PCR 0 with the S-CRTM
version, two firmware volumes and its separator, PCRs 2, 3, 6 with their separator only. About half
a minute here. Skipped (77) without qemu, swtpm, OVMF or a kernel the run can boot."""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CODE = os.environ.get("OVMF_CODE", "/usr/share/OVMF/OVMF_CODE_4M.fd")
VARS = os.environ.get("OVMF_VARS", "/usr/share/OVMF/OVMF_VARS_4M.fd")
SEPARATOR = "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119"
S_CRTM_VERSION = "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"


def skip(why):
    print("1..0 # SKIP " + why)
    sys.exit(77)


def main():
    for tool in ("qemu-system-x86_64", "swtpm"):
        if not shutil.which(tool):
            skip(tool + " is missing")
    if not (os.access(CODE, os.R_OK) and os.access(VARS, os.R_OK)):
        skip("no OVMF (package ovmf)")
    if not os.environ.get("VM_MANAGER_FIRMWARE_KERNEL") and not any(
            os.access(k, os.R_OK) for k in glob.glob("/boot/vmlinuz-*")):
        skip("no readable /boot/vmlinuz-*")
    sha = hashlib.sha256(open(CODE, "rb").read()).hexdigest()

    print("1..2")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        started = time.monotonic()
        p = subprocess.run([os.environ["VM_MANAGER_BIN"], "firmware-run", out, CODE, VARS, "512", "1", "tcg", sha],
                           capture_output=True, text=True, timeout=240)
        took = time.monotonic() - started
        if p.returncode != 0 and "no kernel to boot" in p.stderr:
            skip(p.stderr.strip())
        if p.returncode != 0:
            print("not ok 1 - firmware run\n# " + p.stderr.strip().replace("\n", "\n# "))
            print("not ok 2 - cache entry # SKIP no run")
            return 1
        print("ok 1 - firmware run in %.1f s" % took)

        entry = json.load(open(out))
        pcrs = entry["pcrs"]
        problems = []
        if entry["firmwareSha256"] != sha or entry["memoryMiB"] != 512 or entry["cpus"] != 1:
            problems.append("key fields: %r" % {k: entry[k] for k in ("firmwareSha256", "memoryMiB", "cpus")})
        pcr0 = pcrs["0"]
        if [e["type"] for e in pcr0] != [0x8, 0x80000008, 0x80000008, 0x4]:
            problems.append("pcr 0 events: %r" % pcr0)
        elif pcr0[0]["digest"] != S_CRTM_VERSION or pcr0[3]["digest"] != SEPARATOR:
            problems.append("pcr 0 digests: %r" % pcr0)
        for i in ("2", "3", "6"):
            if pcrs[i] != [{"type": 4, "digest": SEPARATOR}]:
                problems.append("pcr %s: %r" % (i, pcrs[i]))
        if [f for f in os.listdir(tmp) if f != "run.json"]:
            problems.append("left behind: %r" % os.listdir(tmp))
        print(("ok" if not problems else "not ok") + " 2 - cache entry: pcr 0 %s, 2/3/6 separators; run %.1f s" %
              (pcr0[1]["digest"][:16] if len(pcr0) > 1 else "?", entry.get("seconds", 0)))
        for line in problems:
            print("# " + line)
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
