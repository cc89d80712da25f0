#!/usr/bin/env bash
# Checks a built image directory (default images/build): policy.json against PCR 11 values that
# systemd-measure recomputes from the UKI and PCR 13 values recomputed from the sysext's SHA256SUMS
# line, and both sysupdate manifests against their signatures and their files.
# usage: images/scripts/verify.sh [IMAGE_DIR]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
images=$(cd "$here/.." && pwd)
dir=${1:-$images/build}
. "$images/../tools/need.sh"
need_cmds verify "build image" gpgv sha256sum sfdisk python3
IMAGE_TOOLS_TREE=$("$here/tools-tree.sh")
export IMAGE_TOOLS_TREE
"$here/policy.py" verify "$dir" --measure "$here/in-tools systemd-measure" --pcrlock "$here/in-tools systemd-pcrlock"
ring=$(mktemp -d)
trap 'rm -rf "$ring"' EXIT
for d in "$dir"/sysupdate/*/; do
        [ -f "$d/SHA256SUMS" ] || continue
        gpgv --keyring "$images/keys/import-pubring.pgp" "$d/SHA256SUMS.gpg" "$d/SHA256SUMS" 2>"$ring/gpgv.log" ||
                { cat "$ring/gpgv.log" >&2; echo "verify: bad signature on $d/SHA256SUMS" >&2; exit 1; }
        (cd "$d" && sha256sum --quiet -c SHA256SUMS) || { echo "verify: $d does not match its SHA256SUMS" >&2; exit 1; }
        echo "sysupdate/$(basename "$d"): SHA256SUMS signed and matching ($(grep -c . "$d/SHA256SUMS") files)"
done
echo "verify: $dir is consistent"
