#!/usr/bin/env bash
# Builds the vm-manager test image from Debian packages already installed on this host
# (nothing is downloaded):
#
#   OUT_DIR/test-vm_1.0.efi   a UKI: systemd-boot's stub + the cloud kernel + an initramfs whose
#                             /init is tests/image/test-init.c (static) plus the few modules it
#                             loads + the kernel command line
#   OUT_DIR/test-vm_1.0.raw   a 64 MiB GPT disk (512-byte sectors) with one ESP holding the UKI
#                             as \EFI\BOOT\BOOTX64.EFI
#   OUT_DIR/test-vm_1.0.stamp the hash of the inputs the pair was built from
#
# No loop devices, no mounts, no root needed: the FAT file system is made with mkfs.vfat on a
# plain file and filled with mtools, the partition table is written by sfdisk into the image
# file, and the FAT image is dd'ed into the partition's offset. The initramfs is a newc cpio
# made from a staging directory, with /dev/console appended as a hand-written cpio entry.
#
# Idempotent and cached: when OUT_DIR already holds both outputs and a stamp for the same
# inputs (this script, test-init.c, the kernel version and the kernel, stub and module files),
# nothing is rebuilt. FORCE=1 rebuilds anyway.
#
# Needs (Debian 12 packages): linux-image-cloud-amd64, systemd-boot-efi, binutils (objcopy),
# gcc + libc6-dev (static glibc), cpio, gzip, dosfstools, mtools, fdisk (sfdisk), coreutils.
#
# usage: tests/image/build.sh OUT_DIR
#        KERNEL_VERSION=6.1.0-57-cloud-amd64 tests/image/build.sh OUT_DIR
set -euo pipefail

NAME=test-vm
VERSION=1.0
CMDLINE=${TEST_VM_CMDLINE:-console=ttyS0,115200 quiet panic=-1}
STUB=${TEST_VM_STUB:-/usr/lib/systemd/boot/efi/linuxx64.efi.stub}
DISK_MIB=64 # the whole .raw
ESP_START=2048 # in 512-byte sectors (1 MiB)
ESP_MIB=62 # leaves 1 MiB at the end for the backup GPT
ESP_TYPE=C12A7328-F81F-11D2-BA4B-00A0C93EC93B
# Fixed identifiers keep the output the same from build to build.
DISK_GUID=6D1E7C8A-3F0B-4C57-9A52-2E5A0C1B7E01
ESP_GUID=6D1E7C8A-3F0B-4C57-9A52-2E5A0C1B7E02
FAT_VOLID=7E570001
# Modules test-init needs; their dependencies are added from modules.dep. virtio-pci and
# virtio-blk for the disks; vsock over virtio (vhost-vsock-pci and vhost-user-vsock-pci both
# show up as a virtio-vsock device); button + evdev for the ACPI power button as
# /dev/input/event*; virtio_net (with net_failover and failover, from modules.dep) for the NIC
# the installed boot takes its DHCP lease and its IMDS answers on. In the bookworm cloud kernel
# all of these are modules (=m); PACKET, INET and UNIX are built in.
MODULES=(virtio_pci virtio_blk vmw_vsock_virtio_transport button evdev virtio_net)

die() {
        echo "build.sh: $*" >&2
        exit 1
}

[ $# -eq 1 ] || die "usage: $0 OUT_DIR"
out=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$here/test-init.c

. "$here/../../tools/need.sh"
need_cmds tests/image/build.sh "build check" gcc objcopy cpio gzip mkfs.vfat mmd mcopy sfdisk sha256sum
[ -r "$STUB" ] || die "$STUB is missing: install systemd-boot-efi"

kver=${KERNEL_VERSION:-}
if [ -z "$kver" ]; then
        kver=$(find /boot -maxdepth 1 -name 'vmlinuz-*-cloud-amd64' -printf '%f\n' 2>/dev/null |
                sed 's/^vmlinuz-//' | sort -V | tail -n1)
fi
[ -n "$kver" ] || die "no /boot/vmlinuz-*-cloud-amd64: install linux-image-cloud-amd64"
vmlinuz=/boot/vmlinuz-$kver
[ -r "$vmlinuz" ] || die "$vmlinuz is missing or unreadable"
moddir=
for d in /lib/modules/$kver /usr/lib/modules/$kver; do
        [ -r "$d/modules.dep" ] && { moddir=$d; break; }
done
[ -n "$moddir" ] || die "no modules.dep for $kver"

# Resolves MODULES against modules.dep into load order (dependencies first, each once),
# skipping modules built into the kernel. Prints paths relative to $moddir.
resolve_modules() {
        declare -A dep=() seen=()
        local line mod deps
        while IFS= read -r line; do
                mod=${line%%:*}
                deps=${line#*:}
                dep[$mod]=$deps
        done <"$moddir/modules.dep"
        # module name (dashes and underscores are the same) -> path
        declare -A path=()
        local p n
        for p in "${!dep[@]}"; do
                n=${p##*/}
                n=${n%%.ko*}
                path[${n//-/_}]=$p
        done
        visit() {
                local p=$1 d
                [ -n "${seen[$p]:-}" ] && return 0
                seen[$p]=1
                for d in ${dep[$p]}; do
                        visit "$d"
                done
                echo "$p"
        }
        local m
        for m in "${MODULES[@]}"; do
                m=${m//-/_}
                if [ -n "${path[$m]:-}" ]; then
                        visit "${path[$m]}"
                elif grep -Eq "/${m//_/[-_]}\.ko" "$moddir/modules.builtin" 2>/dev/null; then
                        echo "build.sh: $m is built into $kver" >&2
                else
                        die "module $m not found for $kver"
                fi
        done
}

modlist=$(resolve_modules)
mapfile -t modules <<<"$modlist"
# compressed modules (bookworm's cloud kernel ships them plain)
case "$modlist" in *.ko.xz*) need_cmds tests/image/build.sh check xz ;; esac
case "$modlist" in *.ko.zst*) need_cmds tests/image/build.sh check zstd ;; esac

inputs_hash() {
        {
                echo "kernel $kver"
                echo "cmdline $CMDLINE"
                sha256sum "${BASH_SOURCE[0]}" "$src" "$vmlinuz" "$STUB" | awk '{ print $1 }'
                for m in "${modules[@]}"; do
                        echo "$m $(sha256sum <"$moddir/$m" | awk '{ print $1 }')"
                done
                gcc -dumpfullversion 2>/dev/null || true
        } | sha256sum | awk '{ print $1 }'
}

mkdir -p "$out"
efi=$out/${NAME}_$VERSION.efi
raw=$out/${NAME}_$VERSION.raw
stamp=$out/${NAME}_$VERSION.stamp
hash=$(inputs_hash)
if [ "${FORCE:-0}" != 1 ] && [ -f "$efi" ] && [ -f "$raw" ] && [ -f "$stamp" ] &&
        [ "$(cat "$stamp")" = "$hash" ]; then
        echo "build.sh: $efi and $raw are up to date (kernel $kver)"
        exit 0
fi

work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
epoch=@$SOURCE_DATE_EPOCH

# 1. /init
root=$work/root
mkdir -p "$root/dev" "$root/proc" "$root/sys" "$root/modules"
${CC:-gcc} -static -Os -s -Wall -Wextra -o "$root/init" "$src"

# 2. modules, uncompressed (finit_module also takes compressed ones only when the kernel
#    was built for it), and their load order
: >"$root/modules/order"
for m in "${modules[@]}"; do
        base=${m##*/}
        case "$base" in
        *.ko) cp "$moddir/$m" "$root/modules/$base" ;;
        *.ko.xz) base=${base%.xz}; xz -dc "$moddir/$m" >"$root/modules/$base" ;;
        *.ko.zst) base=${base%.zst}; zstd -qdc "$moddir/$m" >"$root/modules/$base" ;;
        *.ko.gz) base=${base%.gz}; gzip -dc "$moddir/$m" >"$root/modules/$base" ;;
        *) die "unknown module file $m" ;;
        esac
        echo "$base" >>"$root/modules/order"
done

# 3. initramfs: the staging tree as newc, then a second archive with the /dev/console node
#    (so the kernel can give /init a console before devtmpfs is mounted; no mknod needed)
newc_entry() { # name mode rdevmajor rdevminor
        local name=$1 mode=$2 maj=$3 min=$4 namesize pad
        namesize=$((${#name} + 1))
        printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
                1 "$mode" 0 0 1 "$SOURCE_DATE_EPOCH" 0 0 0 "$maj" "$min" "$namesize" 0
        printf '%s\0' "$name"
        pad=$(((4 - (110 + namesize) % 4) % 4))
        head -c "$pad" /dev/zero
}
find "$root" -exec touch -h -d "$epoch" {} +
(
        cd "$root"
        find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
                cpio --quiet -o -H newc -R 0:0 --reproducible
        newc_entry dev/console $((8#020600)) 5 1
        newc_entry TRAILER!!! 0 0 0
) | gzip -n -9 >"$work/initrd.img"

# 4. UKI, assembled with objcopy as systemd 252 documents it for its stub: each part is a PE
#    section at a VMA of its own, above the stub's image
printf '%s' "$CMDLINE" >"$work/cmdline"
cat >"$work/os-release" <<EOF
ID=vm-manager-test
NAME="vm-manager test VM"
VERSION_ID=$VERSION
PRETTY_NAME="vm-manager test VM $VERSION"
EOF
align() { echo $((($1 + 0xFFFFF) / 0x100000 * 0x100000)); }
linux_vma=0x2000000
initrd_vma=$(printf '0x%X' "$(align $((linux_vma + $(stat -c %s "$vmlinuz"))))")
objcopy \
        --add-section .osrel="$work/os-release" --change-section-vma .osrel=0x20000 \
        --add-section .cmdline="$work/cmdline" --change-section-vma .cmdline=0x30000 \
        --add-section .linux="$vmlinuz" --change-section-vma .linux=$linux_vma \
        --add-section .initrd="$work/initrd.img" --change-section-vma .initrd="$initrd_vma" \
        "$STUB" "$work/uki.efi"

# 5. ESP (FAT32, 512-byte sectors) in a plain file, filled with mtools
esp=$work/esp.img
touch -d "$epoch" "$work/uki.efi"
mkfs.vfat -C -F 32 -S 512 -s 1 -n ESP -i "$FAT_VOLID" --invariant "$esp" $((ESP_MIB * 1024)) >/dev/null
export MTOOLS_SKIP_CHECK=1
mmd -i "$esp" ::/EFI ::/EFI/BOOT
mcopy -m -i "$esp" "$work/uki.efi" ::/EFI/BOOT/BOOTX64.EFI

# 6. GPT disk image with the ESP, then the FAT image at the partition's offset
disk=$work/disk.raw
truncate -s "${DISK_MIB}M" "$disk"
sfdisk --quiet --no-reread --no-tell-kernel "$disk" <<EOF
label: gpt
label-id: $DISK_GUID
unit: sectors
sector-size: 512
first-lba: 2048
start=$ESP_START, size=$((ESP_MIB * 2048)), type=$ESP_TYPE, uuid=$ESP_GUID, name="ESP"
EOF
dd if="$esp" of="$disk" bs=1M seek=$((ESP_START / 2048)) conv=notrunc,sparse status=none

mv -f "$work/uki.efi" "$efi"
mv -f "$disk" "$raw"
echo "$hash" >"$stamp"
echo "build.sh: built $efi ($(stat -c %s "$efi") bytes; initramfs $(stat -c %s "$work/initrd.img") bytes," \
        "${#modules[@]} modules) and $raw (${DISK_MIB} MiB) for kernel $kver"
