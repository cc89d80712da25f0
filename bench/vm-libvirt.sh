# shellcheck shell=bash disable=SC2034  # the lv_* results are read by bench/vm.sh
# libvirt side of bench/vm.sh (sourced): Debian 12's libvirtd 9.0, started by hand (PID 1 here
# is no service manager), domains on qemu:///system, QEMU under TCG.
#
#   lv_start WORK         starts virtlogd and libvirtd, warms the QEMU capabilities cache;
#                         returns 1 (and says why in $lv_why) when libvirt cannot be measured
#   lv_rss                libvirtd's VmRSS in KiB
#   lv_records N CREDS    defines N more inactive domains vmbench-rec-*
#   lv_unrecord           undefines them
#   lv_round I DISK CREDS one round on a copy of an installed disk; sets lv_define lv_start_ms
#                         lv_boot lv_rss_running lv_shutdown lv_poweroff lv_gone lv_restart
#                         lv_destroy (ms, lv_boot in s)
#   lv_quick I CREDS      a new domain defined, started and destroyed at once; sets lv_define
#                         lv_start_ms lv_destroy (ms)
#   lv_stop               stops every domain it made and both daemons (by PID), then removes
#                         every file the daemons created under their run, state, log and cache
#                         directories during the run (listed before the start, compared after)
#
# CREDS is a file with one SMBIOS type 11 string per line (io.systemd.credential:NAME=VALUE), the
# credentials vm-manager passed to the same boot; they become <oemStrings>.
virsh_() { virsh -q -c qemu:///system "$@"; }
ms_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", (b - a) * 1000 }'; }
lv_pid_libvirtd='' lv_pid_virtlogd='' lv_work='' lv_why='' lv_names=()
lv_roots=(/run/libvirt /var/lib/libvirt /var/log/libvirt /var/log/swtpm /var/cache/libvirt /run/virtlogd.pid /run/libvirtd.pid)
lv_list() { find "${lv_roots[@]}" 2>/dev/null | LC_ALL=C sort || true; }

lv_start() {
        lv_work=$1/lv
        local p
        for p in libvirtd virtlogd virsh swtpm_setup; do
                command -v "$p" >/dev/null ||
                        { lv_why="$p is missing (package $(pkg_of "$p"); tools/install-deps.sh bench)"; return 1; }
        done
        [ "$(id -u)" = 0 ] || { lv_why="qemu:///system needs root"; return 1; }
        for p in /run/libvirtd.pid /run/virtlogd.pid; do
                if [ -s $p ] && kill -0 "$(cat $p)" 2>/dev/null; then
                        lv_why="a libvirtd or virtlogd is already running ($p); not touching it"
                        return 1
                fi
        done
        mkdir -p "$lv_work"
        lv_list >"$lv_work/before"
        chmod 755 "$lv_work"
        virtlogd -d || { lv_why="virtlogd -d failed"; return 1; }
        for _ in $(seq 100); do [ -s /run/virtlogd.pid ] && break; sleep 0.05; done
        lv_pid_virtlogd=$(cat /run/virtlogd.pid)
        libvirtd -d || { lv_why="libvirtd -d failed"; return 1; }
        for _ in $(seq 200); do [ -s /run/libvirtd.pid ] && [ -S /run/libvirt/libvirt-sock ] && break; sleep 0.05; done
        lv_pid_libvirtd=$(cat /run/libvirtd.pid)
        local t=$EPOCHREALTIME
        virsh_ version >/dev/null || { lv_why="virsh version failed: libvirtd did not answer"; return 1; }
        lv_warmup=$(ms_since "$t")
        lv_version=$(virsh_ version | awk '/Using library/ { print $4 }')
        t=$EPOCHREALTIME
        virsh_ list --all >/dev/null
        lv_noop=$(ms_since "$t")
        sleep 1
}

lv_rss() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$lv_pid_libvirtd/status"; }

xml_escape() { sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g'; }

# lv_xml NAME DIR DISK CREDS: the domain closest to a vm-manager VM that libvirt 9.0 describes
# natively: q35, OVMF (code read-only, variables from the template), 512 MiB, 2 vCPUs, TCG with
# -cpu max, the installed disk as virtio with serial "target", a virtio NIC on user-mode
# networking without option ROM, the console to a file, swtpm as tpm-crb, the same SMBIOS
# type 1 and type 11 strings. Missing: vsock (libvirt 9.0 knows only the kernel's vhost-vsock,
# absent here), hence also the shared memfd guest RAM that vhost-user needs.
lv_xml() {
        local name=$1 dir=$2 disk=$3 creds=$4 c
        cat <<EOF
<domain type='qemu'>
  <name>$name</name>
  <memory unit='MiB'>512</memory>
  <vcpu>2</vcpu>
  <sysinfo type='smbios'>
    <system>
      <entry name='manufacturer'>GiantSwarm</entry>
      <entry name='product'>vm-manager</entry>
      <entry name='serial'>$name</entry>
    </system>
    <oemStrings>
EOF
        while IFS= read -r c; do
                echo "      <entry>$(xml_escape <<<"$c")</entry>"
        done <"$creds"
        cat <<EOF
    </oemStrings>
  </sysinfo>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader>
    <nvram template='/usr/share/OVMF/OVMF_VARS_4M.fd'>$dir/ovmf_vars.fd</nvram>
    <smbios mode='sysinfo'/>
  </os>
  <features><acpi/></features>
  <cpu mode='maximum'/>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' discard='unmap'/>
      <source file='$disk'/>
      <target dev='vda' bus='virtio'/>
      <serial>target</serial>
      <boot order='1'/>
    </disk>
    <interface type='user'><model type='virtio'/><rom enabled='no'/></interface>
    <serial type='file'><source path='$dir/console.log'/></serial>
    <tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
EOF
}

lv_records() {
        local n=$1 creds=$2 i name base=${#lv_names[@]}
        mkdir -p "$lv_work/rec"
        for i in $(seq $((base + 1)) $((base + n))); do
                name=vmbench-rec-$i
                lv_xml "$name" "$lv_work/rec/$i" "$lv_work/rec/$i/disk" "$creds" >"$lv_work/rec/$i.xml"
                virsh_ define "$lv_work/rec/$i.xml" >/dev/null
                lv_names+=("$name")
        done
        sleep 1
}

lv_unrecord() {
        local name
        for name in "${lv_names[@]}"; do virsh_ undefine --nvram "$name" >/dev/null 2>&1 || true; done
        lv_names=()
}

# wait_console FILE TIMEOUT STRING: prints the time the console file first holds STRING. tail -F
# sleeps until the file grows, so the wait takes no CPU from the guest it watches.
wait_console() {
        local fd tp t=''
        exec {fd}< <(exec timeout "$2" tail -n +1 -F "$1" 2>/dev/null)
        tp=$!
        grep -m1 -qF "$3" <&"$fd" && t=$EPOCHREALTIME
        exec {fd}<&-
        kill "$tp" 2>/dev/null || true
        [ -n "$t" ] && echo "$t"
}

lv_round() {
        local i=$1 disk=$2 creds=$3 name=vmbench-$1 dir=$lv_work/$1 t t_start qpid
        mkdir -p "$dir"
        chmod 755 "$dir"
        cp --sparse=always "$disk" "$dir/disk"
        lv_xml "$name" "$dir" "$dir/disk" "$creds" >"$dir/domain.xml"
        t=$EPOCHREALTIME
        virsh_ define "$dir/domain.xml" >/dev/null
        lv_define=$(ms_since "$t")
        t_start=$EPOCHREALTIME
        virsh_ start "$name" >/dev/null
        lv_start_ms=$(ms_since "$t_start")
        lv_rss_running=$(lv_rss)
        qpid=$(cat "/run/libvirt/qemu/$name.pid")
        # The guest has no vsock here (and no vmm.notify_socket credential): it prints "phase:
        # boot" where it would send READY=1, then waits for the power button.
        t=$(wait_console "$dir/console.log" 120 "test-init: phase: boot") || { lv_why="round $i: no boot"; return 1; }
        lv_boot=$(awk -v a="$t_start" -v b="$t" 'BEGIN { printf "%.2f", b - a }')
        wait_console "$dir/console.log" 60 "waiting for the ACPI power button" >/dev/null || return 1
        # libvirt's lifecycle events say when the guest has powered off (QEMU's SHUTDOWN: "Shutdown
        # Finished") and when the domain is shut off ("Stopped"); tail --pid sees QEMU go. All
        # three wait without polling loops that would take CPU from what they time.
        local ev evp gone=$dir/gone line t_off='' t_stop=''
        exec {ev}< <(exec timeout 90 virsh -q -c qemu:///system event --domain "$name" --event lifecycle --loop)
        evp=$!
        (timeout 90 tail --pid="$qpid" -s 0.005 -f /dev/null; echo "$EPOCHREALTIME" >"$gone") &
        local tw=$!
        sleep 0.5 # virsh event has registered
        t=$EPOCHREALTIME
        virsh_ shutdown "$name" >/dev/null
        while IFS= read -r -u "$ev" line; do
                case $line in
                *"Shutdown Finished"*) t_off=$EPOCHREALTIME ;;
                *Stopped*) t_stop=$EPOCHREALTIME; break ;;
                esac
        done
        exec {ev}<&-
        kill "$evp" 2>/dev/null || true
        wait "$tw"
        if [ -z "$t_stop" ] || [ "$(virsh_ domstate "$name")" != "shut off" ]; then
                lv_why="round $i: not shut off after virsh shutdown"
                return 1
        fi
        lv_shutdown=$(awk -v a="$t" -v b="$t_stop" 'BEGIN { printf "%.0f", (b - a) * 1000 }')
        lv_poweroff=$(awk -v a="$t" -v b="${t_off:-$t_stop}" 'BEGIN { printf "%.0f", (b - a) * 1000 }')
        lv_gone=$(awk -v a="$t" -v b="$(cat "$gone")" 'BEGIN { printf "%.0f", (b - a) * 1000 }')
        # the same domain again (NVRAM and vTPM state exist now), destroyed while it boots
        t=$EPOCHREALTIME
        virsh_ start "$name" >/dev/null
        lv_restart=$(ms_since "$t")
        sleep 3
        t=$EPOCHREALTIME
        virsh_ destroy "$name" >/dev/null
        lv_destroy=$(ms_since "$t")
        virsh_ undefine --nvram --tpm "$name" >/dev/null
}

# lv_quick I CREDS: a new domain on an empty disk, defined, started, destroyed at once, undefined;
# sets lv_define lv_start_ms lv_destroy (ms)
lv_quick() {
        local name=vmbench-q$1 dir=$lv_work/q$1 t
        mkdir -p "$dir"
        chmod 755 "$dir"
        truncate -s 1G "$dir/disk"
        lv_xml "$name" "$dir" "$dir/disk" "$2" >"$dir/domain.xml"
        t=$EPOCHREALTIME
        virsh_ define "$dir/domain.xml" >/dev/null
        lv_define=$(ms_since "$t")
        t=$EPOCHREALTIME
        virsh_ start "$name" >/dev/null
        lv_start_ms=$(ms_since "$t")
        t=$EPOCHREALTIME
        virsh_ destroy "$name" >/dev/null
        lv_destroy=$(ms_since "$t")
        virsh_ undefine --nvram --tpm "$name" >/dev/null
        rm -rf "$dir"
}

lv_stop() {
        local name p
        if [ -n "$lv_pid_libvirtd" ] && kill -0 "$lv_pid_libvirtd" 2>/dev/null; then
                for name in $(virsh_ list --all --name 2>/dev/null | grep '^vmbench-' || true); do
                        virsh_ destroy "$name" >/dev/null 2>&1 || true
                        virsh_ undefine --nvram --tpm "$name" >/dev/null 2>&1 || true
                done
        fi
        for p in $lv_pid_libvirtd $lv_pid_virtlogd; do
                kill "$p" 2>/dev/null || continue
                for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        done
        if [ -f "$lv_work/before" ]; then
                lv_list | LC_ALL=C comm -13 "$lv_work/before" - | sort -r | while IFS= read -r p; do
                        rm -rf "$p"
                done
                rm -f "$lv_work/before"
        fi
        lv_pid_libvirtd='' lv_pid_virtlogd=''
}
