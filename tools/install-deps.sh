#!/usr/bin/env bash
# Installs, with apt-get alone, every Debian package that building, testing and running
# vm-manager needs. Idempotent: packages already present are not touched, and the package
# lists are refreshed only when they are missing or older than a day. The check group adds
# nodejs and npm only when the node or npm command is missing.
#
# usage: tools/install-deps.sh [build|check|run|image|bench|fuzz|deploy]...   (default: build check run)
#
# Every command a script of this repository runs comes from one of these groups (or from the base
# system: coreutils, grep, sed, awk, find, apt, dpkg); the scripts check for theirs up front
# (tools/need.sh) and name the package. make run asks for build and run, and images/Makefile (which
# make run calls) for build and image; make check for build, check and image.
# tools/fresh-root-check.sh proves both in fresh Debian 12 (bookworm) and 13 (trixie) roots.
#
# The groups name Debian 12's packages. On Debian 13 (trixie) the few that differ are replaced at
# the end of the lists (see "Release differences" below): the pinned clang-format-14 and
# similarity-tester come from bookworm. vhost-device-vsock comes from sid on both. On Debian 12 QEMU
# comes from bookworm-backports (below, "QEMU").
set -euo pipefail

# The release's code name (bookworm, trixie), from os-release as apt itself reads it.
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")

build=(meson ninja-build pkgconf gcc libc6-dev
       libsystemd-dev libmicrohttpd-dev libjansson-dev libssl-dev
       libslirp-dev libglib2.0-dev libssh-dev libtss2-dev libcurl4-openssl-dev
       libcjose-dev libarchive-dev
       python3 python3-yaml)  # tools/gen-schemas.py: api/openapi.yaml's schemas as MCP's outputSchema
# tests: exec_vm against sshd in a network namespace, swtpm and tpm2-tools for quotes
check=(libcmocka-dev clang-format-14 curl python3 procps iproute2 openssh-server openssh-client tpm2-tools swtpm-tools)
# the style suite's gates (issue 35): complexity (tools/check-complexity.sh), static analysis
# (tools/check-cppcheck.sh), copies (tools/check-duplicates.sh: sim_c)
check+=(pmccabe cppcheck similarity-tester)
# tests/integration/test-oauth.py: a private CA for its https Dex
check+=(openssl)
# tests/net/test-net-wire.sh: a namespace on a tap, busybox's udhcpc as the DHCP client, tshark to
# read the DHCP replies off the wire.
check+=(busybox tshark)
# tools/fresh-root-check.sh: a fresh Debian 12 root made with mmdebstrap, in which make run and
# make check's set-up must work with nothing installed beforehand; with-systemd-user.sh: a private
# systemd --user.
check+=(mmdebstrap git systemd)
# tests/integration/test-image-oci.py: htpasswd (bcrypt) for the registry's basic auth; the registry
# itself (docker-registry) and oras are fetched below.
check+=(apache2-utils)
# tests/integration/test-mcp-sdk.py runs the MCP TypeScript SDK: node (>= 18) and npm. Debian's
# packages only when a command is missing: a node from elsewhere (NodeSource's nodejs, which
# conflicts with Debian's npm and brings its own) stays as it is.
command -v node >/dev/null 2>&1 || check+=(nodejs)
command -v npm >/dev/null 2>&1 || check+=(npm)
# VMs: QEMU, the firmware, the vTPM (swtpm-tools: swtpm_setup and swtpm_localca manufacture a new
# VM's vTPM with an EK certificate of the host's CA). vhost-device-vsock (READY=1 where /dev/vhost-vsock is missing)
# comes from Debian sid through tools/fetch-sid-package.sh, below (trixie does not have it either).
# e2fsprogs: the host install formats a VM's var partition with mke2fs; Debian 12's minimal system
# has it (Priority: required), Debian 13's no longer does.
vms=(qemu-system-x86 ovmf swtpm swtpm-tools e2fsprogs)
run=("${vms[@]}")
# tests/image/build.sh: the test guest (kernel, systemd stub, a static init, a GPT disk with an ESP)
test_image=(linux-image-cloud-amd64 systemd-boot-efi binutils cpio gzip dosfstools mtools fdisk)
check+=("${vms[@]}" "${test_image[@]}")
# bench/: load generators, and the peers measured side by side (libvirt, slirp4netns, pasta);
# bench/vm.sh also runs VMs (vhost-device-vsock from sid, below) and its helpers are Python.
bench=(wrk curl procps time python3 iperf3 iproute2 slirp4netns passt libvirt-daemon-system libvirt-clients
       swtpm-tools "${vms[@]}" "${test_image[@]}")
fuzz=(clang-14 libclang-rt-14-dev)
[ "$codename" != trixie ] || fuzz=(clang-19 libclang-rt-19-dev) # the Makefile's fuzz target picks clang-19
# deploy/ and tests/deploy: the container image (mmdebstrap, buildah, podman with runc), the unit under
# a private systemd --system with its bus, polkit and systemd-analyze, PyYAML to read the chart; make
# check runs those tests.
deploy=(mmdebstrap buildah podman runc systemd dbus polkitd python3-yaml)
check+=("${deploy[@]}")
# images/ (the guest image, group "image"): mkosi 27 (from sid, unpacked by images/scripts/mkosi) runs
# on the system's python3 and apt and builds everything else inside its sid tools tree; git lists
# the files the cache key hashes; openssl and gnupg make the keys, gnupg signs SHA256SUMS and gpgv
# checks it; sfdisk (fdisk) reads the partition UUIDs of a fresh build, mtools copies systemd-boot and
# the UKI off its ESP for policy.json's PCR 4; zstd and cpio unpack the
# initrd in tests/image/test-guest-image.sh; the smoke boot runs the VMs.
guest_image=(python3 apt dpkg debian-archive-keyring git gnupg gpgv openssl ca-certificates fdisk mtools zstd cpio
             "${vms[@]}")
# The Kubernetes sysext's binaries, built from Debian's kubernetes source (images/scripts/kubernetes-bins.sh):
# dpkg-source unpacks it, the tree's Makefile wants make and rsync, gcc links the pause program
# statically (libc6-dev), strip (binutils) trims it. The Go compiler is fetched by the script itself.
guest_image+=(dpkg-dev make rsync gcc libc6-dev binutils)

# Release differences. Trixie has no LLVM 14 and no similarity-tester: the style suite's formatter
# stays Debian 12's clang-format-14 (other versions format differently) and sim_c is a libc-only
# program, so both come from bookworm through the same isolated apt view as sid's packages, with
# their libraries (libllvm14 and libclang-cpp14 install on trixie's own libraries).
drop() { # drop NAME ARRAY...: removes NAME from each array
        local n=$1 a
        shift
        for a in "$@"; do
                local -n arr=$a
                local kept=() x
                for x in "${arr[@]}"; do [ "$x" = "$n" ] || kept+=("$x"); done
                arr=("${kept[@]}")
        done
}
bookworm_pkgs=()
if [ "$codename" = trixie ]; then
        drop clang-format-14 check
        drop similarity-tester check
fi

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(build check run)

want=()
for g in "${groups[@]}"; do
        case "$g" in
        build) want+=("${build[@]}") ;;
        check) want+=("${build[@]}" "${check[@]}") ;;
        run) want+=("${build[@]}" "${run[@]}") ;;
        bench) want+=("${build[@]}" "${bench[@]}") ;;
        fuzz) want+=("${build[@]}" "${check[@]}" "${fuzz[@]}") ;;
        image) want+=("${guest_image[@]}") ;;
        deploy) want+=("${deploy[@]}") ;;
        *)
                echo "install-deps: unknown group '$g' (want build, check, run, bench, fuzz, image or deploy)" >&2
                exit 1
                ;;
        esac
done

# QEMU. Debian 12's QEMU 7.2 kills a guest kernel now and then under multi-threaded TCG (an "Oops:
# int3" where the kernel patches live code; docs/benchmarks.md, "Guest crashes under TCG"), so on
# bookworm QEMU comes from bookworm-backports (10.0, built for bookworm, the version trixie carries)
# through the isolated apt view, with the seabios it needs; its libraries come from bookworm. Below
# that version the packages are replaced; VM_MANAGER_SYSTEM_QEMU=1 keeps the release's own QEMU.
backports_qemu=()
if [ "$codename" = bookworm ] && [ -z "${VM_MANAGER_SYSTEM_QEMU:-}" ] &&
        [[ " ${want[*]} " == *" qemu-system-x86 "* ]]; then
        qv=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
        if [ -z "$qv" ] || dpkg --compare-versions "$qv" lt 1:10.0; then
                backports_qemu=(qemu-system-x86 qemu-system-common qemu-system-data seabios)
        fi
        drop qemu-system-x86 want
fi

missing=()
for p in $(printf '%s\n' "${want[@]}" | sort -u); do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [ "$status" = "install ok installed" ] || missing+=("$p")
done
if [ ${#backports_qemu[@]} -gt 0 ] && [ "$(id -u)" -ne 0 ]; then
        echo "install-deps: QEMU from bookworm-backports not installed; run this script as root" >&2
        exit 1
fi

sid=()
for g in "${groups[@]}"; do
        case "$g" in run | check | bench | image | deploy) sid=(vhost-device-vsock) ;; esac
done
if [ "$codename" = trixie ]; then
        for g in "${groups[@]}"; do
                case "$g" in check | fuzz) bookworm_pkgs=(clang-format-14 libclang-cpp14 libllvm14 similarity-tester) ;; esac
        done
fi

if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" -ne 0 ]; then
                echo "install-deps: missing packages: ${missing[*]}; run this script as root" >&2
                exit 1
        fi
        export DEBIAN_FRONTEND=noninteractive
        lists=/var/lib/apt/lists
        if ! compgen -G "$lists/*_Packages*" >/dev/null ||
                [ -n "$(find "$lists" -maxdepth 1 -name '*_InRelease' -mmin +1440 -print -quit)" ]; then
                apt-get update -q
        fi
        echo "install-deps: installing ${missing[*]}"
        apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# promtool (tests check the /metrics exposition with it) comes from Debian's prometheus package,
# unpacked, not installed: installing it would start a Prometheus server.
for g in "${groups[@]}"; do
        case "$g" in check | fuzz)
                promdir=/var/cache/vm-manager/prometheus
                if [ ! -x "$promdir/usr/bin/promtool" ]; then
                        tmp=$(mktemp -d)
                        chmod 755 "$tmp" # apt's _apt user downloads into it
                        (cd "$tmp" && apt-get download -q prometheus)
                        mkdir -p "$promdir"
                        dpkg-deb -x "$tmp"/prometheus_*.deb "$promdir"
                        rm -rf "$tmp"
                fi
                ;;
        esac
done

# docker-registry (distribution 2.8) for the image push/pull tests and their benchmark, unpacked, not
# installed: installing it would start a registry on :5000 as a service.
for g in "${groups[@]}"; do
        case "$g" in check | bench)
                regdir=/var/cache/vm-manager/docker-registry
                if [ ! -x "$regdir/usr/bin/docker-registry" ]; then
                        tmp=$(mktemp -d)
                        chmod 755 "$tmp"
                        (cd "$tmp" && apt-get download -q docker-registry)
                        mkdir -p "$regdir"
                        dpkg-deb -x "$tmp"/docker-registry_*.deb "$regdir"
                        rm -rf "$tmp"
                fi
                ;;
        esac
done

# oras 1.3 (only sid has it; depends on libc alone) for the same tests and benchmark
for g in "${groups[@]}"; do
        case "$g" in check | bench) [[ " ${sid[*]} " == *" oras "* ]] || sid+=(oras) ;; esac
done

# From sid, in an apt view of its own (the system's sources are never touched); a no-op once
# installed.
if [ ${#sid[@]} -gt 0 ]; then
        "$(dirname "$0")/fetch-sid-package.sh" "${sid[@]}"
fi
if [ ${#backports_qemu[@]} -gt 0 ]; then
        "$(dirname "$0")/fetch-sid-package.sh" --suite bookworm-backports --replace "${backports_qemu[@]}"
fi
# On trixie, Debian 12's packages that trixie lacks, from bookworm's view the same way.
if [ ${#bookworm_pkgs[@]} -gt 0 ]; then
        "$(dirname "$0")/fetch-sid-package.sh" --suite bookworm "${bookworm_pkgs[@]}"
fi
