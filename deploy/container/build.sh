#!/usr/bin/env bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Builds vm-manager's container image on this machine, with no docker daemon and no registry pull:
#   1. a Debian 12 root made by mmdebstrap: QEMU 10 from bookworm-backports (as tools/install-deps.sh
#      installs it on a bookworm host), swtpm, the pinned OVMF, curl (the chart's test pod),
#      vhost-device-vsock from sid (both through tools/fetch-sid-package.sh --download-only)
#      and the libraries the given binary links, found with ldd and dpkg -S on this (bookworm) host;
#      kept as a tarball in $CACHE_DIR/<key>, where key hashes what it is made from (mmdebstrap's
#      options, the packages, the mirror, the downloaded packages), since it takes minutes;
#   2. buildah (rootful, vfs storage, the settings of deploy/container/containers.conf) commits that
#      root as the image localhost/vm-manager-root:<key> (once), and on top of it the binary and the
#      image's configuration: two layers, so that a new binary changes only the small one.
#
# usage: deploy/container/build.sh VM_MANAGER_BINARY IMAGE_NAME   (as root)
#   STORAGE_DIR  containers storage (default /var/cache/vm-manager/containers): storage.conf is
#                written there and used through CONTAINERS_STORAGE_CONF
#   CACHE_DIR    root tarballs (default /var/cache/vm-manager/container-root)
#   MIRROR       a Debian mirror (default: mmdebstrap's, deb.debian.org with updates and security),
#   SECURITY_MIRROR  and its security archive (default http://deb.debian.org/debian-security)
# Prints the image name and its id on the last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

# The firmware every VM of this image boots with: its hash is part of the golden PCR values of a
# release, so it moves only on purpose. get_host reports this package and version.
OVMF_VERSION=2022.11-6+deb12u2

[ $# -eq 2 ] || {
        echo "usage: $0 VM_MANAGER_BINARY IMAGE_NAME" >&2
        exit 2
}
bin=$(realpath "$1")
name=$2
[ -x "$bin" ] || { echo "build.sh: $bin is not an executable" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "build.sh: needs root (mmdebstrap, rootful buildah)" >&2; exit 1; }
. "$root/tools/need.sh"
need_cmds deploy/container/build.sh deploy mmdebstrap buildah runc dpkg-query ldd sha256sum

STORAGE_DIR=${STORAGE_DIR:-/var/cache/vm-manager/containers}
CACHE_DIR=${CACHE_DIR:-/var/cache/vm-manager/container-root}
mkdir -p "$STORAGE_DIR/tmp" "$CACHE_DIR"
cat >"$STORAGE_DIR/storage.conf" <<EOC
[storage]
driver = "vfs"
graphroot = "$STORAGE_DIR/storage"
runroot = "$STORAGE_DIR/run"
EOC
export CONTAINERS_CONF=$here/containers.conf CONTAINERS_STORAGE_CONF=$STORAGE_DIR/storage.conf
export TMPDIR=$STORAGE_DIR/tmp

work=$(mktemp -d "$STORAGE_DIR/tmp/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The packages of the binary's libraries (merged /usr: try the path as ldd prints it and under /usr).
libs=()
while read -r lib; do
        pkg=$(dpkg-query -S "$lib" 2>/dev/null || dpkg-query -S "/usr$lib" 2>/dev/null ||
                dpkg-query -S "$(realpath "$lib")" 2>/dev/null || true)
        [ -n "$pkg" ] || { echo "build.sh: no Debian package ships $lib" >&2; exit 1; }
        libs+=("${pkg%%:*}")
done < <(ldd "$bin" | awk '/=> \// { print $3 }')
mapfile -t libs < <(printf '%s\n' "${libs[@]}" | sort -u)

packages=(swtpm swtpm-tools "ovmf=$OVMF_VERSION" curl ca-certificates "${libs[@]}")

"$root/tools/fetch-sid-package.sh" --download-only "$work/sid" vhost-device-vsock >/dev/null
deb=$(ls "$work"/sid/vhost-device-vsock_*.deb)
# QEMU from bookworm-backports: Debian 12's QEMU 7.2 kills a guest kernel now and then under
# multi-threaded TCG (docs/benchmarks.md, "Guest crashes under TCG"). The four packages as files;
# their libraries come from bookworm.
qemu_pkgs=(qemu-system-x86 qemu-system-common qemu-system-data seabios)
"$root/tools/fetch-sid-package.sh" --suite bookworm-backports --download-only "$work/bpo" "${qemu_pkgs[@]}" >/dev/null
qemu_debs=() qemu_includes=() # one --include per file: mmdebstrap takes a path only alone
for p in "${qemu_pkgs[@]}"; do
        cp "$work"/bpo/"$p"_*.deb "$work/$p.deb"
        qemu_debs+=("$work/$p.deb")
        qemu_includes+=("--include=$work/$p.deb")
done

# How the root is made; with the package list and the sid package, its cache key. A fixed
# SOURCE_DATE_EPOCH: the same inputs give the same tarball, and so the same layer.
epoch=1735689600
mmdebstrap_opts=(--variant=minbase --mode=root --format=tar
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
        --aptopt='Acquire::Languages "none"')
key=$( {
        printf '%s\n' "${mmdebstrap_opts[@]}" "${packages[@]}" "mirror=${MIRROR:-} ${SECURITY_MIRROR:-}" "epoch=$epoch"
        sha256sum <"$deb"
        cat "${qemu_debs[@]}" | sha256sum
} | sha256sum | cut -c1-16)
tarball=$CACHE_DIR/$key/rootfs.tar

if [ -f "$tarball" ]; then
        echo "build.sh: root $key from the cache"
        touch "$tarball"
else
        echo "build.sh: making root $key with mmdebstrap (minutes)"
        mkdir -p "$CACHE_DIR/$key"
        part=$(mktemp "$CACHE_DIR/$key/rootfs.tar.XXXXXX")
        cp "$deb" "$work/vhost-device-vsock.deb"
        mirrors=()
        if [ -n "${MIRROR:-}" ]; then
                mirrors=("deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main"
                        "deb ${SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main")
        fi
        if ! SOURCE_DATE_EPOCH=$epoch mmdebstrap "${mmdebstrap_opts[@]}" \
                --include="$(IFS=,; echo "${packages[*]}")" --include="$work/vhost-device-vsock.deb" \
                "${qemu_includes[@]}" \
                --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
                bookworm "$part" "${mirrors[@]}"; then
                rm -f "$part"
                echo "build.sh: mmdebstrap failed" >&2
                exit 1
        fi
        mv "$part" "$tarball"
        printf '%s\n' "${packages[@]}" "${qemu_debs[@]##*/}" >"$CACHE_DIR/$key/packages"
fi

# Roots unused for two weeks leave the cache (another build may use another key meanwhile).
find "$CACHE_DIR" -mindepth 2 -maxdepth 2 -name rootfs.tar -mtime +14 -printf '%h\n' | xargs -r rm -rf

base=localhost/vm-manager-root:$key
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
        c=$(buildah from scratch)
        buildah add --quiet "$c" "$tarball" /
        buildah commit --quiet --rm "$c" "$base" >/dev/null
        # the roots of earlier keys in this storage (a few hundred MB each under vfs)
        buildah images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/vm-manager-root:' | grep -vx "$base" |
                xargs -r buildah rmi >/dev/null 2>&1 || true
fi

version=$("$bin" version 2>/dev/null | awk 'NR == 1 { print $3 }' || true)
c=$(buildah from "$base")
buildah copy --quiet "$c" "$bin" /usr/bin/vm-manager
# The firmware run's static init, looked up beside the binary: without it the daemon in a pod could
# not learn this firmware's PCRs 0, 2, 3, 6 and would need golden values again.
fwlog_init=$(dirname "$bin")/vm-manager-fwlog-init
[ -x "$fwlog_init" ] || { echo "build.sh: $fwlog_init is missing (built beside the daemon)" >&2; exit 1; }
buildah copy --quiet "$c" "$fwlog_init" /usr/bin/vm-manager-fwlog-init
# In a pod the VMs are child processes of the daemon (a pod has no service manager of its own) and
# the state directory is the pod's volume (the chart's persistence).
buildah config \
        --env VM_MANAGER_STATE_DIR=/var/lib/vm-manager \
        --env VM_MANAGER_LAUNCHER=process \
        --port 8080 \
        --entrypoint '["/usr/bin/vm-manager"]' \
        --cmd serve \
        --label org.opencontainers.image.title=vm-manager \
        --label "org.opencontainers.image.version=${version:-unknown}" \
        --label "org.opencontainers.image.revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)" \
        --label "io.giantswarm.vm-manager.firmware=ovmf $OVMF_VERSION" \
        "$c"
id=$(buildah commit --quiet --rm "$c" "$name")
echo "$name $id"
