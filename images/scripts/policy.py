#!/usr/bin/env python3
"""Writes or checks an image's policy.json: the expected PCR 11 values per boot phase path, computed
by systemd-measure from the UKI's own sections, and the expected PCR 13 per Kubernetes version
(from the signed verity root hash of each version's sysext). It also declares "pcr12":
"predicted-credentials": the image's vm-agent quotes PCR 12, which vm-manager predicts per VM from
the kernel-cmdline-extra string it passes (systemd-stub measures only that there; the ESP holds no
addons or credentials) and from the credentials it passes, which the initrd measures there
(vm-measure-credentials).
And "pcr4": per way the image boots, the PCR 4 events OVMF and the stub measure and the value they
give, from the Authenticode SHA-256 of each PE image that runs (docs/design.md, "Attestation"):
  installed  firmware -> \EFI\BOOT\BOOTX64.EFI (systemd-boot) -> the UKI in \EFI\Linux
  installer  QEMU's -kernel (the UKI itself)
The UKI's .linux is in neither: systemd-stub 262 starts the kernel with its own PE loader, not the
firmware's LoadImage, so nothing measures it into PCR 4 (seen in a real boot's event log; older
stubs, such as bookworm's 252 that made tests/data/attest/firmware.log, did use LoadImage). The
kernel is still covered: it is the UKI's .linux section, inside the UKI's Authenticode digest.
Both read from the ESP of IMAGE_DIR/<id>_<version>.raw (mtools), so what is recorded is what boots.

  policy.py write  IMAGE_DIR --measure CMD   (re)writes IMAGE_DIR/policy.json; keeps golden values
  policy.py verify IMAGE_DIR --measure CMD [--pcrlock CMD]
                                             recomputes them and compares them with policy.json; with
                                             --pcrlock (systemd-pcrlock 262), also each PE digest with
                                             what `systemd-pcrlock lock-pe` computes

CMD runs systemd-measure (262), e.g. a wrapper that runs it from the tools tree. The UKI is
IMAGE_DIR/<id>_<version>.efi; Kubernetes versions come from IMAGE_DIR/sysupdate/kubernetes/SHA256SUMS,
each sysext from the file it names there.
"""
import argparse
import hashlib
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile

# The sections systemd-stub measures into PCR 11, each passed to systemd-measure by its option.
# .pcrsig is not measured (it holds the signatures of the very values measured).
SECTIONS = ["linux", "osrel", "cmdline", "initrd", "ucode", "splash", "dtb", "uname", "sbat", "pcrpkey",
            "profile", "dtbauto", "hwids", "efifw"]
PHASES = ["enter-initrd", "enter-initrd:leave-initrd", "enter-initrd:leave-initrd:sysinit",
          "enter-initrd:leave-initrd:sysinit:ready"]
SEPARATOR = "os-separator"
# How vm-manager judges PCR 12 of this image's quotes (its agent quotes it since issue 36; its initrd
# measures its credentials there too).
PCR12 = "predicted-credentials"


def pe_sections(path):
    """The sections of a PE file: name -> bytes, VirtualSize long (what is loaded and measured)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"MZ":
        raise SystemExit(f"{path}: not a PE file")
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[pe:pe + 4] != b"PE\0\0":
        raise SystemExit(f"{path}: no PE header")
    nsec, = struct.unpack_from("<H", data, pe + 6)
    opt_size, = struct.unpack_from("<H", data, pe + 20)
    table = pe + 24 + opt_size
    out = {}
    for i in range(nsec):
        h = table + 40 * i
        name = data[h:h + 8].rstrip(b"\0").decode()
        vsize, _vaddr, rsize, rptr = struct.unpack_from("<IIII", data, h + 8)
        blob = data[rptr:rptr + min(vsize, rsize)]
        out[name] = blob + b"\0" * (vsize - len(blob))
    return out


def find_uki(image_dir):
    for f in sorted(os.listdir(image_dir), reverse=True):
        if f.endswith(".efi") and os.path.exists(os.path.join(image_dir, f[:-4] + ".raw")):
            stem = f[:-4]
            image_id, _, version = stem.rpartition("_")
            return os.path.join(image_dir, f), image_id, version
    raise SystemExit(f"no <id>_<version>.efi with its .raw in {image_dir}")


def pcr11(uki, measure):
    secs = pe_sections(uki)
    with tempfile.TemporaryDirectory() as tmp:
        args = []
        for s in SECTIONS:
            if "." + s in secs:
                p = os.path.join(tmp, s)
                with open(p, "wb") as f:
                    f.write(secs["." + s])
                args.append(f"--{s}={p}")
        if "--linux=" not in " ".join(args):
            raise SystemExit(f"{uki}: no .linux section, not a UKI")
        out = {}
        for phase in PHASES:
            r = subprocess.run(shlex.split(measure) + ["calculate", "--json=short", "--bank=sha256",
                                                        f"--phase={phase}"] + args,
                               check=True, capture_output=True, text=True)
            doc = json.loads(r.stdout)
            vals = [e["hash"] for e in doc["sha256"] if e["pcr"] == 11]
            if len(vals) != 1:
                raise SystemExit(f"systemd-measure gave no single PCR 11 value: {r.stdout}")
            out[phase] = vals[0].lower()
        return out


def extend(pcr, word):
    return hashlib.sha256(pcr + hashlib.sha256(word.encode()).digest()).digest()


def authenticode_sha256(data):
    """The Authenticode SHA-256 of a PE image, the digest OVMF measures for an
    EV_EFI_BOOT_SERVICES_APPLICATION: the headers without CheckSum and the certificate table entry,
    the sections' file data in file order, the rest of the file up to the certificate table.
    src/attest/attest-predict.c computes the same in the daemon."""
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[:2] != b"MZ" or data[pe:pe + 4] != b"PE\0\0":
        raise SystemExit("policy: not a PE image")
    nsec, = struct.unpack_from("<H", data, pe + 6)
    opt_size, = struct.unpack_from("<H", data, pe + 20)
    opt = pe + 24
    magic, = struct.unpack_from("<H", data, opt)
    checksum = opt + 64
    directories = opt + (96 if magic == 0x10B else 112)
    security = directories + 8 * 4  # the certificate table is directory 4
    header_size, = struct.unpack_from("<I", data, opt + 60)
    h = hashlib.sha256()
    h.update(data[:checksum])
    h.update(data[checksum + 4:security])
    h.update(data[security + 8:header_size])
    sections = []
    for i in range(nsec):
        _vsize, _vaddr, rsize, rptr = struct.unpack_from("<IIII", data, opt + opt_size + 40 * i + 8)
        if rsize:
            sections.append((rptr, rsize))
    hashed = header_size
    for rptr, rsize in sorted(sections):
        h.update(data[rptr:rptr + rsize])
        hashed += rsize
    cert_offset, cert_size = struct.unpack_from("<II", data, security)
    end = len(data) - (cert_size if cert_offset else 0)
    if end > hashed:
        h.update(data[hashed:end])
    return h.hexdigest()


ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
SD_BOOT = "/EFI/BOOT/BOOTX64.EFI"
BOOT_OPTION = "Calling EFI Application from Boot Option"


def esp_files(raw, tmp):
    """systemd-boot and the one UKI of the disk image's ESP, copied out with mtools: (sd-boot path,
    UKI path, UKI name on the ESP)."""
    esp = [p for p in gpt_partitions(raw) if p["type"].upper() == ESP_TYPE]
    if len(esp) != 1:
        raise SystemExit(f"policy: {raw} has {len(esp)} ESPs, want 1")
    img = f"{raw}@@{esp[0]['start'] * 512}"
    listing = subprocess.run(["mdir", "-b", "-i", img, "::/EFI/Linux"], check=True, capture_output=True,
                             text=True).stdout.split()
    # mdir -b lists full names, "::/EFI/Linux/<name>.efi"
    ukis = [f.removeprefix("::") for f in listing if f.lower().endswith(".efi")]
    if len(ukis) != 1:
        raise SystemExit(f"policy: the ESP of {raw} has {len(ukis)} UKIs in \\EFI\\Linux, want 1: {ukis}")
    out = []
    for src, name in ((SD_BOOT, "sd-boot.efi"), (ukis[0], "uki.efi")):
        dst = os.path.join(tmp, name)
        subprocess.run(["mcopy", "-n", "-i", img, "::" + src, dst], check=True, capture_output=True)
        out.append(dst)
    return out[0], out[1], ukis[0].split("/")[-1]


def pcr4_boot(apps):
    """One way of booting as policy.json records it: the boot option's call, the separator, then
    one application event per (what, digest), and the PCR 4 they give from zero."""
    events = [{"type": "EV_EFI_ACTION", "sha256": hashlib.sha256(BOOT_OPTION.encode()).hexdigest(),
               "what": BOOT_OPTION},
              {"type": "EV_SEPARATOR", "sha256": hashlib.sha256(bytes(4)).hexdigest(), "what": "the separator"}]
    events += [{"type": "EV_EFI_BOOT_SERVICES_APPLICATION", "sha256": d, "what": w} for w, d in apps]
    pcr = bytes(32)
    for e in events:
        pcr = hashlib.sha256(pcr + bytes.fromhex(e["sha256"])).digest()
    return {"events": events, "value": pcr.hex()}


def pcr4(image_dir, uki, pcrlock=None):
    """PCR 4 per way of booting, from the ESP of the image's disk and the UKI the daemon boots with
    -kernel. With pcrlock, every digest is checked against systemd-pcrlock lock-pe's."""
    raw = uki[:-4] + ".raw"
    with open(uki, "rb") as f:
        uki_bytes = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        sd_boot, esp_uki, esp_name = esp_files(raw, tmp)
        with open(sd_boot, "rb") as f:
            sd_bytes = f.read()
        with open(esp_uki, "rb") as f:
            esp_uki_bytes = f.read()
        digests = {"sd-boot": (sd_boot, authenticode_sha256(sd_bytes)),
                   "uki": (esp_uki, authenticode_sha256(esp_uki_bytes))}
        if pcrlock:
            for name, (path, digest) in digests.items():
                lock = os.path.join(tmp, name + ".pcrlock")
                subprocess.run(shlex.split(pcrlock) + ["lock-pe", path, f"--pcrlock={lock}"], check=True,
                               capture_output=True)
                with open(lock) as f:
                    recs = json.load(f)["records"]
                theirs = [d["digest"] for r in recs if r["pcr"] == 4 for d in r["digests"] if d["hashAlg"] == "sha256"]
                if theirs != [digest]:
                    raise SystemExit(f"policy: {name}: authenticode {digest}, systemd-pcrlock lock-pe {theirs}")
                print(f"pcr4 {name}: {digest} = systemd-pcrlock lock-pe")
        uki_digest = authenticode_sha256(uki_bytes)
    return {
        "installed": pcr4_boot([("systemd-boot " + SD_BOOT.replace("/", "\\"), digests["sd-boot"][1]),
                                ("the UKI \\EFI\\Linux\\" + esp_name, digests["uki"][1])]),
        "installer": pcr4_boot([("the UKI " + os.path.basename(uki) + " (-kernel)", uki_digest)]),
    }


# GPT partition type of the root verity signature for x86-64 (the Discoverable Partitions
# Specification); its partition holds {"rootHash": ..., "signature": ...} padded with NULs.
ROOT_VERITY_SIG_X86_64 = "41092B05-9FC8-4523-994F-2DEF0408B176"


def gpt_partitions(path):
    """The partitions of a GPT disk image as sfdisk --json lists them (type, uuid, name, start and
    size in 512-byte sectors), the way scripts/layout.py reads the image's own table."""
    out = subprocess.run(["sfdisk", "--json", path], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"policy: {path}: no partition table: {out.stderr.strip()}")
    table = json.loads(out.stdout)["partitiontable"]
    if table.get("label") != "gpt" or table.get("sectorsize", 512) != 512:
        raise SystemExit(f"policy: {path} has no GPT with 512-byte sectors")
    return table.get("partitions", [])


def sysext_root_hash(path):
    """The signed dm-verity root hash of a sysext DDI: the rootHash of its root verity signature
    partition. systemd-sysext merges the extension only through a verity device with this root hash
    after checking the signature over it."""
    for p in gpt_partitions(path):
        if p["type"].upper() != ROOT_VERITY_SIG_X86_64:
            continue
        with open(path, "rb") as f:
            f.seek(p["start"] * 512)
            blob = f.read(p["size"] * 512).rstrip(b"\0")
        try:
            root = json.loads(blob)["rootHash"].lower()
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise SystemExit(f"policy: {path}: unreadable verity signature partition: {err}")
        if not re.fullmatch(r"[0-9a-f]{64}", root):
            raise SystemExit(f"policy: {path}: root hash {root!r} is not SHA-256")
        return root
    raise SystemExit(f"policy: {path}: no root verity signature partition")


def pcr13(image_dir):
    """PCR 13 per Kubernetes version: "os-separator", then what vm-kubernetes measures once the
    extension is merged, "kubernetes_<v>.raw verity=<root hash>"."""
    d = os.path.join(image_dir, "sysupdate", "kubernetes")
    sums = os.path.join(d, "SHA256SUMS")
    out = {}
    if not os.path.exists(sums):
        return out
    with open(sums) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 2:
                continue
            name = fields[-1].lstrip("*")
            m = re.fullmatch(r"kubernetes_(.+)\.raw", name)
            if not m:
                continue
            root = sysext_root_hash(os.path.join(d, name))
            v = extend(extend(bytes(32), SEPARATOR), f"{name} verity={root}")
            out[m.group(1)] = v.hex()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["write", "verify"])
    ap.add_argument("image_dir")
    ap.add_argument("--measure", required=True, help="command that runs systemd-measure")
    ap.add_argument("--pcrlock", help="command that runs systemd-pcrlock, to cross-check the PE digests")
    args = ap.parse_args()
    uki, image_id, version = find_uki(args.image_dir)
    path = os.path.join(args.image_dir, "policy.json")
    want11 = pcr11(uki, args.measure)
    want13 = pcr13(args.image_dir)
    want4 = pcr4(args.image_dir, uki, args.pcrlock)
    if args.command == "write":
        doc = {}
        if os.path.exists(path):
            with open(path) as f:
                doc = json.load(f)
        doc.update({"image_id": image_id, "image_version": version, "pcr11": want11, "pcr12": PCR12,
                    "pcr4": want4})
        if want13:
            doc["pcr13"] = want13
        else:
            doc.pop("pcr13", None)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        print(f"policy: wrote {path}: pcr11 for {len(want11)} phases, pcr13 for {sorted(want13) or 'no'} "
              f"kubernetes versions, pcr4 for the {' and '.join(sorted(want4))} boots")
        return 0
    with open(path) as f:
        doc = json.load(f)
    bad = []
    if doc.get("image_id") != image_id or doc.get("image_version") != version:
        bad.append(f"names {doc.get('image_id')}_{doc.get('image_version')}, the UKI is {image_id}_{version}")
    for phase, v in want11.items():
        have = doc.get("pcr11", {}).get(phase, "").lower()
        print(f"pcr11 {phase}: {v} {'ok' if have == v else 'MISMATCH, policy.json has ' + (have or 'nothing')}")
        if have != v:
            bad.append(f"pcr11[{phase}]")
    print(f"pcr12: {doc.get('pcr12') or 'not declared'} {'ok' if doc.get('pcr12') == PCR12 else 'MISMATCH'}")
    if doc.get("pcr12") != PCR12:
        bad.append(f"pcr12 is not \"{PCR12}\" (rewrite the policy with policy.py write)")
    have13 = {k: v.lower() for k, v in doc.get("pcr13", {}).items()}
    for k, v in want13.items():
        print(f"pcr13 kubernetes {k}: {v} {'ok' if have13.get(k) == v else 'MISMATCH'}")
        if have13.get(k) != v:
            bad.append(f"pcr13[{k}]")
    for boot, want in sorted(want4.items()):
        have = doc.get("pcr4", {}).get(boot)
        print(f"pcr4 {boot}: {want['value']} {'ok' if have == want else 'MISMATCH'}")
        if have != want:
            bad.append(f"pcr4[{boot}]")
    for k in sorted(set(have13) - set(want13)):
        bad.append(f"pcr13[{k}] has no sysext in SHA256SUMS")
    if bad:
        print("policy: verify FAILED: " + "; ".join(bad), file=sys.stderr)
        return 1
    print(f"policy: {path} matches {os.path.basename(uki)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
