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
vm_manager=$1
out=$2

if [ "$(id -u)" -ne 0 ]; then
        echo "SKIP: building the guest image needs root"
        exit 77
fi
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
"$repo/images/smoke-boot.py" "$out"
t2=$(date +%s)
echo "guest image: build or cache $((t1 - t0)) s, verify and smoke boot $((t2 - t1)) s"
