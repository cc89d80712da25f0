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
"$repo/images/smoke-boot.py" "$out"
t2=$(date +%s)
echo "guest image: build or cache $((t1 - t0)) s, verify and smoke boot $((t2 - t1)) s"
