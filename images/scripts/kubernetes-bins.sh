#!/usr/bin/env bash
# Builds the Kubernetes node and control-plane binaries from Debian's own source of Kubernetes
# (bookworm's `kubernetes` source package, the full upstream tree) and caches them, keyed by the
# source version and this build's own inputs. Prints the cache entry's directory, whose bin/ holds
# kubelet, kubeadm, kubectl, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
# crictl (../kubernetes/crictl/main.go, built in the same tree), cluster-dns (../kubernetes/cluster-dns,
# the cluster DNS carried as kubeadm's CoreDNS image, tested with `go test` before it is built) and
# pause (build/pause/linux/pause.c, linked statically), and whose version file names the Kubernetes
# version (v1.20.2).
#
# The source comes through the isolated apt view of bookworm (tools/fetch-sid-package.sh --suite),
# so the host's apt sources stay as they are and any Debian release can build it; so does the Go
# compiler the package was built with, bookworm's golang-1.19, unpacked (not installed) under the
# cache. The build runs in GOPATH mode with cgo off, as the package's own debian/rules does it. A cold build takes about 9 CPU-minutes; later calls print the
# cached entry at once. Environment: KUBERNETES_CACHE_DIR (default /var/cache/vm-manager/kubernetes),
# KUBERNETES_SOURCE_SUITE (default bookworm), KUBERNETES_CACHE_KEEP (entries kept, default 2).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
images=$(cd "$here/.." && pwd)
repo=$(cd "$images/.." && pwd)
CACHE=${KUBERNETES_CACHE_DIR:-/var/cache/vm-manager/kubernetes}
SUITE=${KUBERNETES_SOURCE_SUITE:-bookworm}
bins=(kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy crictl cluster-dns)

say() { echo "kubernetes-bins: $*" >&2; }
die() { say "$*"; exit 1; }

. "$repo/tools/need.sh"
need_cmds image "build the Kubernetes binaries" dpkg-source dpkg-deb rsync gcc make strip

"$repo/tools/fetch-sid-package.sh" --suite "$SUITE" --refresh-lists >&2
# The Go toolchain of the source's own release, unpacked once.
goroot=$CACHE/go-1.19/usr/lib/go-1.19
GO=$goroot/bin
if [ ! -x "$GO/go" ]; then
        rm -rf "$CACHE/go-1.19" "$CACHE/.go-debs"
        mkdir -p "$CACHE/.go-debs"
        "$repo/tools/fetch-sid-package.sh" --suite bookworm --download-only "$CACHE/.go-debs" golang-1.19-go golang-1.19-src
        for d in "$CACHE"/.go-debs/*.deb; do dpkg-deb -x "$d" "$CACHE/go-1.19.new"; done
        mv "$CACHE/go-1.19.new" "$CACHE/go-1.19"
        rm -rf "$CACHE/.go-debs"
fi
export GOROOT=$goroot
srcver=$(APT_CONFIG=/var/cache/vm-manager/$SUITE-apt/apt.conf apt-cache showsrc kubernetes 2>/dev/null |
        awk '/^Version:/ { print $2 }' | sort -V | tail -n 1)
[ -n "$srcver" ] || die "no kubernetes source package in $SUITE"
key=$( {
        echo "$srcver"
        sha256sum "$images/kubernetes/crictl/main.go" "$images"/kubernetes/cluster-dns/*.go "$here/kubernetes-bins.sh" |
                cut -d' ' -f1
        "$GO/go" version
} | sha256sum | cut -c1-16)
entry=$CACHE/bin-$srcver-$key
if [ -f "$entry/version" ]; then
        say "cached: $entry ($(cat "$entry/version"), source $srcver)"
        echo "$entry"
        exit 0
fi

t0=$(date +%s)
work=$CACHE/.work-$key
rm -rf "$work"
mkdir -p "$work/src"
say "building from the $SUITE source $srcver (cache miss; about 9 CPU-minutes)"
"$repo/tools/fetch-sid-package.sh" --suite "$SUITE" --source "$work/src" kubernetes
(cd "$work/src" && dpkg-source --no-check -x ./*.dsc tree >&2)
tree=$work/src/tree
# Kubernetes 1.20 vendors modern-go/reflect2 1.0.1, whose map iteration breaks under Go 1.18 and
# later (kubeadm init panics in json-iterator marshalling kubelet's configuration); 1.0.2 is the
# fix upstream took for its later releases, and bookworm packages it.
"$repo/tools/fetch-sid-package.sh" --suite "$SUITE" --download-only "$work/reflect2" golang-github-modern-go-reflect2-dev
dpkg-deb -x "$work"/reflect2/golang-github-modern-go-reflect2-dev_*.deb "$work/reflect2/x"
r2=$work/reflect2/x/usr/share/gocode/src/github.com/modern-go/reflect2
[ -f "$r2/reflect2.go" ] || die "golang-github-modern-go-reflect2-dev has no reflect2.go"
rm -rf "$tree/vendor/github.com/modern-go/reflect2"
mkdir -p "$tree/vendor/github.com/modern-go/reflect2"
find "$r2" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' -exec cp {} "$tree/vendor/github.com/modern-go/reflect2/" \;
mkdir -p "$tree/.go/src/k8s.io" "$tree/cmd/crictl" "$tree/cmd/cluster-dns"
ln -s ../../.. "$tree/.go/src/k8s.io/kubernetes"
cp "$images/kubernetes/crictl/main.go" "$tree/cmd/crictl/main.go"
cp "$images"/kubernetes/cluster-dns/*.go "$tree/cmd/cluster-dns/"
(
        cd "$tree/.go/src/k8s.io/kubernetes"
        export GOPATH=$tree/.go PATH=$GO:$PATH CGO_ENABLED=0 GO111MODULE=off HOME=$work/home \
                GOCACHE=$work/gocache
        # cluster-dns's own tests: queries over the loopback against client-go's fake API server.
        go test ./cmd/cluster-dns >&2
        make WHAT="$(printf 'cmd/%s ' "${bins[@]}")" >&2
) || die "the Kubernetes build failed (its output is above)"
mkdir -p "$work/out/bin"
for b in "${bins[@]}"; do
        install -m 0755 "$tree/_output/bin/$b" "$work/out/bin/$b"
done
# The sandbox ("pause") container's program, from the same tree, static so that its image is one file.
gcc -Os -static -Wall -DVERSION="\"$(cd "$tree" && sed -n "s/^TAG ?*= *//p" build/pause/Makefile)\"" \
        -o "$work/out/bin/pause" "$tree/build/pause/linux/pause.c"
strip "$work/out/bin/pause"
version=$("$work/out/bin/kubeadm" version -o short)
[[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] || die "kubeadm version said '$version'"
echo "$version" >"$work/out/version"
echo "$srcver" >"$work/out/source-version"
echo $(( $(date +%s) - t0 )) >"$work/out/build-seconds"
rm -rf "$entry"
mv "$work/out" "$entry"
rm -rf "$work"
ls -1dt "$CACHE"/bin-* 2>/dev/null | tail -n +$(( ${KUBERNETES_CACHE_KEEP:-2} + 1 )) | xargs -r rm -rf
say "built Kubernetes $version from $srcver in $(cat "$entry/build-seconds") s -> $entry"
echo "$entry"
