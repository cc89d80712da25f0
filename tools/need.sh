# shellcheck shell=sh
# Sourced by the scripts of images/, tests/, bench/ and tools/ to check, before they start, that the
# commands they run are installed, and to name the Debian package of each one that is not:
#
#   . "$repo/tools/need.sh"
#   need_cmds WHO GROUPS CMD...    exits 1 with "WHO: missing sfdisk (package fdisk), ...; install
#                                  with tools/install-deps.sh GROUPS (or apt-get install fdisk ...)"
#   missing_cmds CMD...            prints "sfdisk (package fdisk), ..." for the missing ones and
#                                  returns 1 if any is missing (for scripts that skip instead)
#
# A command counts when it is on PATH (root's PATH has /usr/sbin, where sfdisk and mkfs.vfat are).
# POSIX sh, so that sh and bash scripts can both source it.

# The Debian 12 package that installs CMD (the command's own name when it has no entry here).
pkg_of() {
        case "$1" in
        sfdisk | fdisk) echo fdisk ;;
        gpg | gpg-connect-agent) echo gnupg ;;
        gpgv) echo gpgv ;;
        dpkg-deb | dpkg-query | dpkg) echo dpkg ;;
        apt-get | apt-cache) echo apt ;;
        mkfs.vfat) echo dosfstools ;;
        mmd | mcopy) echo mtools ;;
        objcopy | strip) echo binutils ;;
        dpkg-source) echo dpkg-dev ;;
        gcc) echo gcc ;;
        qemu-system-x86_64 | qemu-img) echo qemu-system-x86 ;;
        swtpm | swtpm_setup) echo swtpm ;;
        swtpm_ioctl) echo swtpm-tools ;;
        tpm2_*) echo tpm2-tools ;;
        vhost-device-vsock) echo "vhost-device-vsock (from sid: tools/fetch-sid-package.sh)" ;;
        ip) echo iproute2 ;;
        ps | pgrep | pkill) echo procps ;;
        sshd) echo openssh-server ;;
        ssh | ssh-keygen) echo openssh-client ;;
        dumpcap) echo wireshark-common ;;
        node) echo nodejs ;;
        ninja) echo ninja-build ;;
        pkg-config) echo pkgconf ;;
        unshare | setsid | findmnt | mount | umount | nsenter | runuser) echo util-linux ;;
        systemctl | systemd-analyze | systemd-sysusers) echo systemd ;;
        dbus-daemon) echo dbus ;;
        ldd) echo libc-bin ;;
        busctl) echo systemd ;;
        virsh) echo libvirt-clients ;;
        libvirtd | virtlogd) echo libvirt-daemon ;;
        pasta) echo passt ;;
        time) echo time ;;
        xz) echo xz-utils ;;
        git) echo git ;;
        sim_c) echo similarity-tester ;;
        mke2fs | debugfs) echo e2fsprogs ;;
        *) echo "$1" ;;
        esac
}

have_cmd() {
        command -v "$1" >/dev/null 2>&1
}

missing_cmds() {
        _need_out=
        for _need_c in "$@"; do
                have_cmd "$_need_c" && continue
                _need_out="$_need_out${_need_out:+, }$_need_c (package $(pkg_of "$_need_c"))"
        done
        [ -z "$_need_out" ] && return 0
        echo "$_need_out"
        return 1
}

need_cmds() {
        _need_who=$1
        _need_groups=$2
        shift 2
        _need_missing=$(missing_cmds "$@") && return 0
        _need_pkgs=
        for _need_c in "$@"; do
                have_cmd "$_need_c" && continue
                case "$(pkg_of "$_need_c")" in
                *" "*) ;; # not from the system's suites
                *) _need_pkgs="$_need_pkgs $(pkg_of "$_need_c")" ;;
                esac
        done
        echo "$_need_who: missing $_need_missing; install with tools/install-deps.sh" \
                "$_need_groups${_need_pkgs:+ (or apt-get install$_need_pkgs)}" >&2
        exit 1
}
