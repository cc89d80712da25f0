#!/usr/bin/env bash
# Builds the guest image into OUT_DIR (default images/build), in the layout of vm-manager's
# --image-dir:
#   giantswarm-vm-base_<v>.efi   the UKI (expected PCR 11 values signed: .pcrsig, .pcrpkey)
#   giantswarm-vm-base_<v>.raw   ESP, erofs root, verity and signature partitions
#   policy.json                  pcr11 per phase path (systemd-measure), pcr13 per Kubernetes version
#   sysupdate/base/              the A/B update artifacts, SHA256SUMS, SHA256SUMS.gpg
#   sysupdate/kubernetes/        kubernetes_<kv>.raw, SHA256SUMS, SHA256SUMS.gpg
#   manifest.json                versions, what the sysext holds, sizes, build time
#
# Steps: keys (scripts/keys.sh), the sid tools tree (tools/mkosi.conf, cached), then a cache
# lookup keyed by the image definition, the vm-agent sources, the hwdb record, the Kubernetes tree
# (binaries, runtime, images) and the versions of every sid package the image pulls in. On a hit the cached
# build is copied; otherwise mkosi 27 builds it (scripts/mkosi) and the result is stored.
#
# `build.sh --print-key [OUT_DIR]` prints the cache key and stops there (tools/fresh-root-check.sh
# compares the key of a fresh root with the host's).
#
# Environment: VM_MANAGER (the daemon binary, for `vm-manager imds-hwdb`; default build/...),
# KUBERNETES_BIN_DIR (Kubernetes binaries to use instead of those built from Debian's source;
# scripts/kubernetes-sysext.sh), IMAGE_CACHE_DIR (default
# /var/cache/vm-manager/images), IMAGE_CACHE=0 (build even on a hit), IMAGE_CACHE_KEEP (entries
# kept, default 3), IMAGE_VERSION (the version to build instead of mkosi.version's, e.g. the N+1 of an
# A/B update test; scripts/add-version.sh publishes it beside the other).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
images=$(cd "$here/.." && pwd)
repo=$(cd "$images/.." && pwd)
print_key=
if [ "${1:-}" = --print-key ]; then
        print_key=1
        shift
fi
OUT=${1:-$images/build}
CACHE=${IMAGE_CACHE_DIR:-/var/cache/vm-manager/images}
VM_MANAGER=${VM_MANAGER:-$repo/build/src/daemon/vm-manager}
work=$images/.work
t_start=$(date +%s)
version=${IMAGE_VERSION:-$(cat "$images/mkosi.version")}

say() { echo "image: $*" >&2; }
die() { say "$*"; exit 1; }
[[ "$version" =~ ^[0-9][0-9A-Za-z.~^-]*$ ]] || die "IMAGE_VERSION '$version' is not a version (digits first; letters, digits, . ~ ^ -)"

[ "$(id -u)" -eq 0 ] || die "run as root (mkosi needs to create file ownership and namespaces)"
# Every command of a build, the cache miss included, before anything starts: a missing tool must not
# surface after minutes of mkosi (mkosi itself runs on /usr/bin/python3; the rest comes from the
# tools tree).
. "$repo/tools/need.sh"
need_cmds image "build image" git python3 apt-get dpkg-deb sha256sum sfdisk gpg gpg-connect-agent openssl
[ -x /usr/bin/python3 ] ||
        die "mkosi runs on /usr/bin/python3, which is missing: install python3 (tools/install-deps.sh build image)"
[ -x "$VM_MANAGER" ] || die "$VM_MANAGER is missing: build the daemon first (make build)"
mkdir -p "$CACHE" "$work"

"$here/keys.sh" >&2

# --- the tools tree: a sid directory image with the build tools (mkosi, repart, ukify, measure)
IMAGE_TOOLS_TREE=$("$here/tools-tree.sh")
export IMAGE_TOOLS_TREE
measure="$here/in-tools systemd-measure"

# --- generated content: the hwdb record from the daemon's key table, the keys' public halves
gen=$work/generated
rm -rf "$gen"
for t in base initrd kubernetes; do mkdir -p "$gen/$t"; done
for t in base initrd; do
        install -D -m 0644 /dev/null "$gen/$t/usr/lib/udev/hwdb.d/60-vm-manager-imds.hwdb"
        "$VM_MANAGER" imds-hwdb > "$gen/$t/usr/lib/udev/hwdb.d/60-vm-manager-imds.hwdb"
        install -D -m 0644 "$images/keys/verity.crt" "$gen/$t/usr/lib/verity.d/vm-image.crt"
done
install -D -m 0644 "$images/keys/import-pubring.pgp" "$gen/base/usr/lib/systemd/import-pubring.pgp"
# The exitrd's systemd-shutdown: the standalone build (no libsystemd-shared), which Debian packages
# apart because it conflicts with systemd; only the binary is taken, not the package.
exitrd=$work/exitrd-deb
rm -rf "$exitrd"
mkdir -p "$exitrd"
"$repo/tools/fetch-sid-package.sh" --download-only "$exitrd" systemd-standalone-shutdown >&2
dpkg-deb -x "$exitrd"/systemd-standalone-shutdown_*.deb "$exitrd/x"
install -D -m 0755 "$exitrd/x/usr/lib/systemd/systemd-shutdown" "$gen/base/usr/lib/vm-image/exitrd/systemd-shutdown"
# The Kubernetes node: kubelet, kubeadm, kubectl, crictl, a runtime for their CRI and the
# control-plane images, built from Debian's kubernetes source (cached) or taken from
# KUBERNETES_BIN_DIR (scripts/kubernetes-sysext.sh).
{ read -r kver; read -r kube_note; } < <("$here/kubernetes-sysext.sh" "$gen/kubernetes")
[ -n "$kver" ] || die "scripts/kubernetes-sysext.sh named no Kubernetes version"
say "Kubernetes $kver: $kube_note"

# --- the cache key
# the indented lines that follow Packages= in the mkosi.conf files
packages=$(awk '/^Packages=/ { p = 1; next } /^[^ \t]/ { p = 0 } p && NF == 1 { print $1 }' \
        "$images"/mkosi.conf "$images"/mkosi.images/*/mkosi.conf | sort -u)
"$repo/tools/fetch-sid-package.sh" --refresh-lists >&2
: > "$work/empty-status"
closure=$(APT_CONFIG=/var/cache/vm-manager/sid-apt/apt.conf apt-get -s -o Dir::State::status="$work/empty-status" \
        -o Debug::NoLocking=1 install --no-install-recommends $packages 2>/dev/null | awk '/^Inst/ { print $2, $3 }' | sort)
[ -n "$closure" ] || die "could not resolve the image's packages in sid"
key=$( {
        cd "$repo"
        # what goes into the image: its definition, the build scripts, vm-agent's sources (not the
        # docs or the smoke boot); a symlink by its target, since the units' .wants links point at
        # files of the image, which this host may or may not have
        git ls-files -co --exclude-standard images/mkosi.conf images/mkosi.version images/mkosi.repart \
                images/mkosi.images images/tools images/scripts agent src/basic meson.build meson_options.txt \
                tools/gen-version.sh tools/fetch-sid-package.sh | sort | while IFS= read -r f; do
                if [ -L "$f" ]; then
                        echo "$f -> $(readlink "$f")"
                else
                        sha256sum "$f"
                fi
        done
        sha256sum "$gen"/*/usr/lib/udev/hwdb.d/* | cut -d' ' -f1
        (cd "$gen/kubernetes" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
        sha256sum "$images"/keys/*.crt "$images/keys/import-pubring.pgp" | cut -d' ' -f1
        "$here/mkosi" --version
        echo "version $version"
        echo "$closure"
} | sha256sum | cut -c1-20)
entry=$CACHE/image-$key
say "cache key $key"
if [ -n "$print_key" ]; then
        echo "$key"
        exit 0
fi

publish() {
        rm -rf "$OUT.new"
        mkdir -p "$(dirname "$OUT")"
        cp -a --reflink=auto "$entry" "$OUT.new"
        # Golden values recorded into the published copy (make golden) belong to this very build:
        # they survive its next publication, and go with a new one.
        if [ -f "$OUT/policy.json" ] && cmp -s "$OUT/manifest.json" "$OUT.new/manifest.json"; then
                python3 - "$OUT/policy.json" "$OUT.new/policy.json" <<'PY'
import json, sys
old, new = (json.load(open(p)) for p in sys.argv[1:])
kept = {k: old[k] for k in ("golden", "golden_firmware") if k in old}
if kept:
    new.update(kept)
    with open(sys.argv[2], "w") as f:
        json.dump(new, f, indent=2)
        f.write("\n")
PY
        fi
        rm -rf "$OUT"
        mv "$OUT.new" "$OUT"
}

if [ "${IMAGE_CACHE:-1}" != 0 ] && [ -f "$entry/manifest.json" ]; then
        publish
        say "cache hit: $entry -> $OUT ($(( $(date +%s) - t_start )) s)"
        exit 0
fi

# --- build
say "building with mkosi (cache miss)"
t_mkosi=$(date +%s)
if [ "${IMAGE_REASSEMBLE:-0}" = 1 ] && [ -f "$work/out/kubernetes.raw" ]; then
        say "IMAGE_REASSEMBLE=1: reusing mkosi's last output in $work/out"
else
        rm -rf "$work/out"
        "$here/mkosi" -C "$images" --tools-tree="$IMAGE_TOOLS_TREE" --output-directory="$work/out" \
                --image-version="$version" -f build >&2
fi
t_mkosi=$(( $(date +%s) - t_mkosi ))

# --- assemble
o=$work/out
stem=giantswarm-vm-base_$version
asm=$work/assemble
rm -rf "$asm"
mkdir -p "$asm/sysupdate/base" "$asm/sysupdate/kubernetes"
cp --sparse=always "$o/$stem.efi" "$o/$stem.raw" "$asm/"
"$here/layout.py" "$images/mkosi.images/base/mkosi.extra/usr/lib/repart.sysinstall.d" "$asm/$stem.raw" "$asm/$stem.layout.json" >&2
cp "$o/$stem.efi" "$asm/sysupdate/base/$stem.efi"
# The partitions of the A/B update, named <id>_<version>_<partition uuid>.<kind>.raw as the image's
# sysupdate.d transfers expect: the UUIDs derive from the root hash, and the installed boot finds
# its root and verity partitions by them.
[ -f "$o/$stem.raw" ] || die "mkosi left no $stem.raw in $o"
table=$(sfdisk --json "$o/$stem.raw") || die "sfdisk could not read the partition table of $o/$stem.raw"
for kind in root:4f68bce3-e8cd-4db1-96e7-fbcaf984b709 root-verity:2c7357ed-ebd2-46d9-aec1-23d437ec2bf5 \
        root-verity-sig:41092b05-9fc8-4523-994f-2def0408b176; do
        name=${kind%%:*}
        uuid=$(python3 -c '
import json, sys
t = sys.argv[1].upper()
print(next((p["uuid"].lower() for p in json.loads(sys.argv[2])["partitiontable"]["partitions"]
            if p["type"].upper() == t), ""))
' "${kind#*:}" "$table") || die "could not parse sfdisk's table of $o/$stem.raw"
        [ -n "$uuid" ] || die "$o/$stem.raw has no $name partition (type ${kind#*:})"
        split=$o/$stem.${name/root/root-x86-64}.raw
        cp --sparse=always "$split" "$asm/sysupdate/base/${stem}_$uuid.$name.raw"
done
# The signature partition's file is padded with zeros to its slot's size (16 KiB, the
# repart.sysinstall.d configs): systemd-pull writes a shorter file into the slot and then zeroes the
# rest with BLKZEROOUT on the whole disk, which the kernel refuses (EBUSY) while the running root's
# partitions are open, so the update failed at its last partition.
sig=$(echo "$asm"/sysupdate/base/"${stem}"_*.root-verity-sig.raw)
[ "$(stat -c %s "$sig")" -le 16384 ] || die "$sig is larger than its 16 KiB slot"
truncate -s 16384 "$sig"

[ -f "$o/kubernetes.manifest" ] || die "mkosi left no kubernetes.manifest in $o"
cp --sparse=always "$o/kubernetes.raw" "$asm/sysupdate/kubernetes/kubernetes_$kver.raw"

for d in base kubernetes; do
        (cd "$asm/sysupdate/$d" && shopt -s nullglob && sha256sum -- *.raw *.efi > SHA256SUMS)
        gpg --homedir "$images/keys/gpg" --batch --quiet --yes --detach-sign \
                --output "$asm/sysupdate/$d/SHA256SUMS.gpg" "$asm/sysupdate/$d/SHA256SUMS"
done

"$here/policy.py" write "$asm" --measure "$measure" --pcrlock "$here/in-tools systemd-pcrlock" >&2

t_total=$(( $(date +%s) - t_start ))
python3 - "$asm" "$version" "$kver" "$kube_note" "$t_mkosi" "$t_total" "$o" "$gen/kubernetes" <<'PY' > "$asm/manifest.json"
import datetime, json, os, sys
asm, version, kver, note, t_mkosi, t_total, o, ktree = sys.argv[1:]
bins = [b for b in ("kubelet", "kubeadm", "kubectl", "crictl", "containerd", "ctr")
        if os.access(os.path.join(ktree, "usr/bin", b), os.X_OK)]
kimages = []
with open(os.path.join(ktree, "usr/share/vm-image/kubernetes-images/images.txt")) as f:
    for line in f:
        ref, _, rest = line.strip().partition(" ")
        if ref:
            absent = rest.startswith("absent:")
            carries = rest.partition(" ")[2].strip()
            kimages.append({"ref": ref, "included": not absent,
                            **({"why": rest.split(":", 1)[1].strip()} if absent else {}),
                            **({"carries": carries} if carries and not absent else {})})
def pkgs(name):
    try:
        return {p["name"]: p["version"] for p in json.load(open(os.path.join(o, name))).get("packages", [])}
    except FileNotFoundError:
        return {}
base = pkgs("base.manifest")
kube = pkgs("kubernetes.manifest")
def size(p):
    st = os.stat(os.path.join(asm, p))
    return {"bytes": st.st_size, "allocated": st.st_blocks * 512}
stem = f"giantswarm-vm-base_{version}"
doc = {
    "image": stem,
    "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "build_seconds": {"mkosi": int(t_mkosi), "total": int(t_total)},
    "packages": {k: base[k] for k in ("systemd", "linux-image-cloud-amd64", "openssh-server") if k in base},
    "kubernetes": {
        "version": kver,
        "sysext": f"kubernetes_{kver}.raw",
        "packages": {k: v for k, v in kube.items() if k not in base},
        "kubelet": "kubelet" in bins,
        "kubeadm": "kubeadm" in bins,
        "node": all(b in bins for b in ("kubelet", "kubeadm", "crictl", "containerd")),
        "binaries": bins,
        "images": kimages,
        "note": note,
    },
    "sizes": {p: size(p) for p in (f"{stem}.efi", f"{stem}.raw", f"sysupdate/kubernetes/kubernetes_{kver}.raw")},
}
json.dump(doc, sys.stdout, indent=2)
print()
PY

rm -rf "$entry.new"
mv "$asm" "$entry.new"
rm -rf "$entry"
mv "$entry.new" "$entry"
# keep the newest entries only
ls -1dt "$CACHE"/image-* 2>/dev/null | tail -n +$(( ${IMAGE_CACHE_KEEP:-3} + 1 )) | xargs -r rm -rf
publish
say "built $stem (kubernetes $kver) in $t_total s (mkosi $t_mkosi s) -> $OUT"
