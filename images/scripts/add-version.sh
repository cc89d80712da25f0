#!/usr/bin/env bash
# Publishes one build of the image (scripts/build.sh's OUT_DIR) into an image directory that
# already serves another version, the way an operator rolls out version N+1 beside N:
#   add-version.sh BUILD_DIR IMAGE_DIR
# Copies the UKI, the disk and its layout; writes the build's policy.json as
# <id>_<version>.policy.json (IMAGE_DIR's policy.json names its own version, and the catalog takes
# it only for that one), its PCR 13 values for the Kubernetes versions the directory serves already
# taken from the directory's policies; adds the build's sysupdate/<component>/ files beside those of the other
# versions and signs the merged SHA256SUMS again with images/keys/gpg, so that the guests'
# systemd-sysupdate, which trusts that key, sees both versions and updates to the newest.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
images=$(cd "$here/.." && pwd)
say() { echo "add-version: $*" >&2; }
die() { say "$*"; exit 1; }

[ $# -eq 2 ] || die "usage: add-version.sh BUILD_DIR IMAGE_DIR"
src=$1 dst=$2
[ -f "$src/policy.json" ] || die "$src has no policy.json: not a build of scripts/build.sh"
[ -d "$dst" ] || die "$dst is not a directory"
read -r id version < <(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
print(p["image_id"], p["image_version"])' "$src/policy.json") || die "$src/policy.json names no image_id and image_version"
stem=${id}_$version
for f in "$stem.efi" "$stem.raw"; do
        [ -f "$src/$f" ] || die "$src has no $f"
done
if [ -f "$dst/policy.json" ] && python3 -c '
import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("image_version") == sys.argv[2] else 1)' "$dst/policy.json" "$version"; then
        die "$dst serves version $version already (its policy.json)"
fi

for f in "$stem.efi" "$stem.raw" "$stem.layout.json"; do
        [ -f "$src/$f" ] && cp --sparse=always --reflink=auto "$src/$f" "$dst/$f.tmp" && mv "$dst/$f.tmp" "$dst/$f"
done
# The directory serves one kubernetes_<kv>.raw per Kubernetes version: a version it serves already
# stays (the VMs that run it measured it into PCR 13), and the new policy's pcr13 entry for it is
# taken from the directory's policies, which describe the file served, instead of the build's own
# (its sysext is another build of the same version, with another verity root hash).
python3 - "$src/policy.json" "$dst" "$dst/$stem.policy.json.tmp" <<'PY' || die "cannot write $stem.policy.json"
import glob, json, os, sys
src, dst, out = sys.argv[1:]
policy = json.load(open(src))
served = {}
for path in [os.path.join(dst, "policy.json")] + sorted(glob.glob(os.path.join(dst, "*.policy.json"))):
    try:
        served.update({k: v for k, v in json.load(open(path)).get("pcr13", {}).items() if k not in served})
    except (OSError, ValueError):
        pass
for kv in list(policy.get("pcr13", {})):
    if os.path.exists(os.path.join(dst, "sysupdate", "kubernetes", "kubernetes_%s.raw" % kv)) and kv in served:
        policy["pcr13"][kv] = served[kv]
with open(out, "w") as f:
    json.dump(policy, f, indent=2)
    f.write("\n")
PY
mv "$dst/$stem.policy.json.tmp" "$dst/$stem.policy.json"

for d in "$src"/sysupdate/*/; do
        c=$(basename "$d")
        mkdir -p "$dst/sysupdate/$c"
        (cd "$d" && shopt -s nullglob && for f in *.raw *.efi; do
                [ -e "$dst/sysupdate/$c/$f" ] || cp --sparse=always --reflink=auto "$f" "$dst/sysupdate/$c/$f"
        done)
        (cd "$dst/sysupdate/$c" && shopt -s nullglob && sha256sum -- *.raw *.efi > SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
        gpg --homedir "$images/keys/gpg" --batch --quiet --yes --detach-sign \
                --output "$dst/sysupdate/$c/SHA256SUMS.gpg.tmp" "$dst/sysupdate/$c/SHA256SUMS"
        mv "$dst/sysupdate/$c/SHA256SUMS.gpg.tmp" "$dst/sysupdate/$c/SHA256SUMS.gpg"
done
say "$stem published into $dst"
