#!/usr/bin/env bash
# Prints the path of the sid tools tree (mkosi's ToolsTree=), building it first when the cache has
# none for the current tools/mkosi.conf. The tree holds systemd 262's repart, ukify and measure,
# erofs-utils, cryptsetup and apt, so that the bookworm host needs none of them.
# usage: images/scripts/tools-tree.sh      (IMAGE_CACHE_DIR, default /var/cache/vm-manager/images)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
images=$(cd "$here/.." && pwd)
CACHE=${IMAGE_CACHE_DIR:-/var/cache/vm-manager/images}
key=$(cat "$images/tools/mkosi.conf" "$images"/tools/mkosi.skeleton/etc/resolv.conf | sha256sum | cut -c1-16)
dir=$CACHE/tools-$key
if [ ! -x "$dir/tools/usr/bin/ukify" ]; then
        echo "image: building the sid tools tree into $dir" >&2
        rm -rf "$dir"
        mkdir -p "$dir"
        "$here/mkosi" -C "$images/tools" --output-directory="$dir" -f build >&2
fi
echo "$dir/tools"
