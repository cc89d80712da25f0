#!/usr/bin/env bash
# Lays out what the Kubernetes sysext carries beyond its Debian packages, into TREE (mkosi's extra
# tree for the kubernetes image, see ../mkosi.images/kubernetes/mkosi.conf), and prints two lines:
# the Kubernetes version (1.20.2) and a note on where the binaries came from.
#
#   usr/bin/{kubelet,kubeadm,kubectl,crictl}        Kubernetes's own programs
#   usr/bin/{containerd,containerd-shim-runc-v2,ctr}, usr/sbin/runc, containerd.service
#                                                    a runtime that speaks this kubelet's CRI
#   usr/share/vm-image/kubernetes-images/*.tar       the images kubeadm asks for by default, as OCI
#                                                    archives that kubernetes-images.service imports
#   usr/share/vm-image/containerd/config.toml        containerd's settings, sandbox image included
#   usr/share/vm-image/kubernetes-images/images.txt  what is there and what is not
#
# The binaries come from KUBERNETES_BIN_DIR when given (kubelet, kubeadm, kubectl and crictl;
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and pause where it has them),
# else from Debian's kubernetes source (scripts/kubernetes-bins.sh, cached). The runtime is
# bookworm's containerd 1.6 and runc 1.1 for Kubernetes up to 1.25 (kubelet 1.20 speaks CRI
# v1alpha2 only, which containerd 2 dropped) and sid's containerd 2 for 1.26 and later (CRI v1
# only, and kubelet 1.36 refuses containerd 1.x). etcd is Debian's etcd-server of the same suite as
# the runtime; CoreDNS is in no Debian release, so its image name carries cluster-dns, a cluster DNS
# built from the same source tree (images.txt says so).
#
# usage: kubernetes-sysext.sh TREE     (as root; run by scripts/build.sh)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
images=$(cd "$here/.." && pwd)
repo=$(cd "$images/.." && pwd)
tree=${1:?usage: kubernetes-sysext.sh TREE}
fetch=$repo/tools/fetch-sid-package.sh
epoch=${SOURCE_DATE_EPOCH:-0}

say() { echo "kubernetes-sysext: $*" >&2; }
die() { say "$*"; exit 1; }

if [ -n "${KUBERNETES_BIN_DIR:-}" ]; then
        bins=$(cd "$KUBERNETES_BIN_DIR" && pwd)
        note="Kubernetes binaries from KUBERNETES_BIN_DIR ($bins)"
else
        entry=$("$here/kubernetes-bins.sh")
        bins=$entry/bin
        note="Kubernetes built from Debian's kubernetes source $(cat "$entry/source-version") (cached in $entry)"
fi
version=$("$bins/kubeadm" version -o short)
[[ "$version" =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+ ]] || die "kubeadm version said '$version'"
minor=${BASH_REMATCH[2]}
[ "${BASH_REMATCH[1]}" = 1 ] || die "Kubernetes $version: only 1.x is known"
kver=${version#v}
kver=${kver%%[-+]*}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- Kubernetes's programs
install -d "$tree/usr/bin"
# kubeadm's preflight refuses a CRI runtime without crictl in PATH.
for b in kubelet kubeadm kubectl crictl; do
        [ -x "$bins/$b" ] || die "no $b in $bins (the sysext needs kubelet, kubeadm, kubectl and crictl)"
        install -m 0755 "$bins/$b" "$tree/usr/bin/$b"
done

# kubelet's FlexVolume plugin directory, which kubeadm's kube-controller-manager manifest mounts
# (hostPath, DirectoryOrCreate): /usr is read-only in the VM, so it must come with the extension,
# or the controller manager never starts.
# mkosi leaves empty directories out of an extension: a hidden file (FlexVolume skips dot files)
# keeps it.
install -d "$tree/usr/libexec/kubernetes/kubelet-plugins/volume/exec"
echo "FlexVolume plugins: kubelet and kube-controller-manager look here (vm-manager's Kubernetes sysext)" \
        >"$tree/usr/libexec/kubernetes/kubelet-plugins/volume/exec/.vm-image"

# --- the runtime
if [ "$minor" -le 25 ]; then
        suite=bookworm
else
        suite=sid
fi
"$fetch" --suite "$suite" --download-only "$work/debs" containerd runc etcd-server >&2
for p in containerd runc etcd-server; do
        dpkg-deb -x "$work"/debs/${p}_*.deb "$work/$p"
done
install -m 0755 "$work"/containerd/usr/bin/{containerd,containerd-shim-runc-v2,ctr} "$tree/usr/bin/"
install -D -m 0755 "$work/runc/usr/sbin/runc" "$tree/usr/sbin/runc"
unit=$(find "$work/containerd" -name containerd.service -path '*/systemd/system/*' | head -n 1)
[ -n "$unit" ] || die "the $suite containerd package has no containerd.service"
install -D -m 0644 "$unit" "$tree/usr/lib/systemd/system/containerd.service"
runtime="containerd $(dpkg-deb -f "$work"/debs/containerd_*.deb Version), runc $(dpkg-deb -f "$work"/debs/runc_*.deb Version) ($suite)"

# --- images: the names kubeadm of this version pulls by default
mapfile -t wanted < <("$bins/kubeadm" config images list --kubernetes-version "$version" 2>/dev/null)
[ ${#wanted[@]} -gt 0 ] || die "kubeadm config images list --kubernetes-version $version printed nothing"
out=$tree/usr/share/vm-image/kubernetes-images
install -d "$out"
# The C library for the images whose programs link it (etcd, iptables); Debian's, of the runtime's suite.
"$fetch" --suite "$suite" --download-only "$work/libdebs" libc6 >&2
libc=$work/libc
dpkg-deb -x "$work"/libdebs/libc6_*.deb "$libc"
rm -rf "$libc/usr/share" "$libc"/usr/lib/x86_64-linux-gnu/gconv "$libc/etc"
# kube-proxy runs iptables (nft) and conntrack inside its own image.
proxydebs=(iptables libip4tc2 libip6tc2 libxtables12 libnftnl11 libmnl0 libnetfilter-conntrack3 libnfnetlink0 conntrack)
pause_tag=
listing=
for ref in "${wanted[@]}"; do
        name=${ref##*/}
        name=${name%%:*}
        root=$work/rootfs-$name
        mkdir -p "$root/usr/local/bin"
        entrypoint=
        carries=
        case "$name" in
        kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy)
                if [ ! -x "$bins/$name" ]; then
                        listing+="$ref absent: no $name in $bins"$'\n'
                        continue
                fi
                install -m 0755 "$bins/$name" "$root/usr/local/bin/$name"
                if [ "$name" = kube-proxy ]; then
                        "$fetch" --suite "$suite" --download-only "$work/proxydebs" "${proxydebs[@]}" >&2
                        for d in "$work"/proxydebs/*.deb; do dpkg-deb -x "$d" "$root"; done
                        cp -a "$libc/." "$root/"
                        rm -rf "$root/usr/share" "$root/etc"
                        # The alternatives a package install would set up: iptables is the nft variant.
                        for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
                                ln -sf xtables-nft-multi "$root/usr/sbin/$t"
                        done
                fi
                ;;
        pause)
                if [ ! -x "$bins/pause" ]; then
                        listing+="$ref absent: no pause in $bins"$'\n'
                        continue
                fi
                install -m 0755 "$bins/pause" "$root/pause"
                entrypoint=/pause
                pause_tag=$ref
                ;;
        etcd)
                install -m 0755 "$work/etcd-server/usr/bin/etcd" "$root/usr/local/bin/etcd"
                cp -a "$libc/." "$root/"
                ;;
        coredns)
                # No Debian release has CoreDNS: the image carries cluster-dns, which serves the
                # Corefile kubeadm writes (../kubernetes/cluster-dns/main.go says how far).
                if [ ! -x "$bins/cluster-dns" ]; then
                        listing+="$ref absent: no cluster-dns in $bins (a registry may serve CoreDNS's image)"$'\n'
                        continue
                fi
                install -m 0755 "$bins/cluster-dns" "$root/cluster-dns"
                entrypoint=/cluster-dns
                carries="cluster-dns: vm-manager's cluster DNS from the Kubernetes source tree, not CoreDNS"
                ;;
        *)
                listing+="$ref absent: in no Debian release; kubeadm's $name addon waits for a registry"$'\n'
                continue
                ;;
        esac
        "$here/oci-archive.py" --name "$ref" --rootfs "$root" --out "$out/$name.tar" --epoch "$epoch" ${entrypoint:+--entrypoint "$entrypoint"}
        listing+="$ref $name.tar${carries:+ $carries}"$'\n'
        rm -rf "$root"
done
printf '%s' "$listing" >"$out/images.txt"
[ -n "$pause_tag" ] || die "no pause image: kubelet cannot start a pod without one"

# --- containerd's settings: this version's sandbox image, the systemd cgroup driver kubelet uses too
install -D -m 0644 /dev/stdin "$tree/usr/share/vm-image/containerd/config.toml" <<TOML
# Default containerd configuration of the Kubernetes sysext, copied to /etc/containerd/config.toml when absent.
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  # kubeadm's default for Kubernetes $kver, imported from the sysext (kubernetes-images.service)
  sandbox_image = "$pause_tag"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
TOML

say "Kubernetes $kver: $note; $runtime; images: $(awk '{ print $1 ($2 == "absent:" ? " (absent)" : "") }' "$out/images.txt" | tr '\n' ' ')"
echo "$kver"
echo "$note; $runtime"
