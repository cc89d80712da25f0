#!/usr/bin/env bash
# The guest image end to end, without the daemon: build it with images/ (or take it from the
# cache), check policy.json and the signed manifests (images/scripts/verify.sh), then boot it under
# TCG (images/smoke-boot.py): the installer installs onto a blank disk, the installed boot sends
# READY=1 over vhost-user vsock, and PCR 11 read in the guest matches policy.json.
#
# usage: tests/image/test-guest-image.sh VM_MANAGER OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export REPO=$repo
vm_manager=$1
out=$2

if [ "$(id -u)" -ne 0 ]; then
        echo "SKIP: building the guest image needs root"
        exit 77
fi
. "$repo/tools/need.sh"
# build.sh, verify.sh and smoke-boot.py check their own tools; these are this script's
need_cmds test-guest-image "build check image" python3 zstd cpio chroot
t0=$(date +%s)
VM_MANAGER=$vm_manager "$repo/images/scripts/build.sh" "$out"
t1=$(date +%s)
"$repo/images/scripts/verify.sh" "$out"
# ...and a policy.json whose PCR 11 value is off by one digit must fail the same check.
tamper=$(mktemp -d)
trap 'rm -rf "$tamper"' EXIT
ln -s "$out"/*.efi "$out"/*.raw "$out/sysupdate" "$tamper/"
python3 - "$out/policy.json" "$tamper/policy.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
v = doc["pcr11"]["enter-initrd"]
doc["pcr11"]["enter-initrd"] = ("1" if v[0] != "1" else "2") + v[1:]
json.dump(doc, open(sys.argv[2], "w"))
PY
if "$repo/images/scripts/verify.sh" "$tamper" >/dev/null 2>&1; then
        echo "FAIL: verify.sh accepted a policy.json with a wrong pcr11 value"
        exit 1
fi
echo "verify.sh rejects a policy.json with a wrong pcr11 value"
# PCR 13 per Kubernetes version comes from the sysext's signed verity root hash (what vm-kubernetes
# measures from the merged extension's dm-verity table). systemd-repart names the sysext's root and
# verity partitions after the two halves of that hash: the root hash policy.py read from the
# signature partition must be the one the partitions were made for.
python3 - "$out" <<'PY'
import glob, importlib.util, os, sys
spec = importlib.util.spec_from_file_location("policy", os.path.join(os.environ["REPO"], "images/scripts/policy.py"))
policy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(policy)
raws = glob.glob(os.path.join(sys.argv[1], "sysupdate", "kubernetes", "kubernetes_*.raw"))
if not raws:
    sys.exit("FAIL: no sysext in sysupdate/kubernetes")
for raw in raws:
    root = policy.sysext_root_hash(raw)
    uuids = {p.get("name"): p["uuid"].replace("-", "").lower() for p in policy.gpt_partitions(raw)}
    if uuids.get("root-x86-64") != root[:32] or uuids.get("root-x86-64-verity") != root[32:]:
        sys.exit(f"FAIL: {os.path.basename(raw)}: root hash {root} does not name its partitions {uuids}")
    print(f"{os.path.basename(raw)}: the signed root hash {root[:16]}... names its root and verity partitions")
PY
# vm-agent runs in the initrd before anything can log in: every library it links must be in the
# initrd (the smoke boot has no NIC, so it never starts the agent). The UKI's .initrd section starts
# with mkosi's initrd cpio (the kernel modules' cpio follows); the initrd's own dynamic loader,
# run in a chroot of it, resolves exactly what the guest would.
ird=$tamper/initrd
mkdir -p "$ird"
python3 - "$out" "$tamper/initrd.zst" <<'PY'
import glob, importlib.util, os, sys
spec = importlib.util.spec_from_file_location("policy", os.path.join(os.environ["REPO"], "images/scripts/policy.py"))
policy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(policy)
uki = glob.glob(os.path.join(sys.argv[1], "*.efi"))[0]
open(sys.argv[2], "wb").write(policy.pe_sections(uki)[".initrd"])
PY
(cd "$ird" && zstd -dcq "$tamper/initrd.zst" 2>/dev/null | cpio -idm --quiet 2>/dev/null) || true
missing=$(chroot "$ird" /usr/lib64/ld-linux-x86-64.so.2 --list /usr/bin/vm-agent 2>&1 | grep -i -e "not found" -e "error while loading" || true)
if [ ! -x "$ird/usr/bin/vm-agent" ] || [ -n "$missing" ]; then
        echo "FAIL: vm-agent in the initrd cannot run: ${missing:-no /usr/bin/vm-agent}"
        exit 1
fi
echo "vm-agent in the initrd finds all its libraries"
"$repo/images/smoke-boot.py" "$out"
t2=$(date +%s)
echo "guest image: build or cache $((t1 - t0)) s, verify and smoke boot $((t2 - t1)) s"
