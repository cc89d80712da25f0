#!/usr/bin/env bash
# VM lifecycle figures, side by side in one run, on the tiny test guest of tests/image (512 MiB,
# 2 vCPUs, TCG, swtpm):
#   - vm-manager through its REST API;
#   - the same processes by hand (bench/vm-replay.py): the swtpm, vhost-device-vsock and QEMU
#     command lines vm-manager used for the VM of the same round, read from /proc/<pid>/cmdline
#     while it ran, replayed in a scratch directory;
#   - libvirt 9.0 (bench/vm-libvirt.sh): libvirtd started by hand, an equivalent domain;
#   - a QEMU with the light argv of the peer baselines, and tests/image/boot-test.py (an argv of
#     its own) for reference.
# Rounds are interleaved (vm-manager, by hand, libvirt, boot-test.py, then the next round), one
# guest at a time.
#   usage: bench/vm.sh [path/to/vm-manager]
#          (ROUNDS=3 QMP_RUNS=10 LIBVIRT=1 LIBVIRT_RUNS=5 BOOT_TEST=1 RAW_DIR=)
#          TABLES_FROM=RAW_DIR/figures.sh bench/vm.sh     (the tables of a past run again)
# Prints markdown tables for docs/benchmarks.md; RAW_DIR keeps every raw figure there (the
# command lines replayed, each side's JSON, figures.sh). Ratios of the boot rows are the median
# of the per-round ratios: a round's two boots run back to back, so they share the host's load.
set -euo pipefail

# ---- tables (TABLES_FROM=RAW_DIR/figures.sh prints them again from a run's figures) ----
median() { # the middle value, or the mean of the two middle ones, printed as given (ms or s)
        printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END {
                if (NR % 2) print a[(NR + 1) / 2]
                else { m = (a[NR / 2] + a[NR / 2 + 1]) / 2; d = index(a[1], ".") ? length(a[1]) - index(a[1], ".") : 0; printf "%.*f\n", d, m }
        }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
pairs() { # pairs A B: the per-round ratios A[k] ÷ B[k] of two arrays, by name
        local -n a=$1 b=$2
        local k
        for k in "${!a[@]}"; do printf '%s ' "$(ratio "${a[k]}" "${b[k]}")"; done
}
pratio() { # pratio A B: the median of the per-round ratios
        local -a r
        read -r -a r <<<"$(pairs "$1" "$2")"
        median "${r[@]}"
}
render() {
        read -r floor_qmp floor_greet <<<"$floor"
        mc=$(median "${s_create[@]}")
        hq=$(median "${s_hand[@]}") he=$(median "${s_exec[@]}")

        echo "### create → QMP answering ($qmp_runs runs side by side, median; ratio = that ÷ vm-manager)"
        echo
        echo "| measure | ms | ratio |"
        echo "|---|---|---|"
        echo "| vm-manager \`create_vm\` (wait_for none), answered once QMP answers | $mc | 1.00 |"
        echo "| … of which (process start times, 10 ms ticks): request → swtpm exec / → QEMU exec / → answer | $(median "${s_prep[@]}") / $(median "${s_helpers[@]}") / $(median "${s_qemu[@]}") | — |"
        echo "| by hand, same argv: swtpm + vhost-device-vsock started and probed, QEMU exec → \`qmp_capabilities\` answered | $hq | $(ratio "$hq" "$mc") |"
        echo "| by hand, same argv: QEMU exec → \`qmp_capabilities\` answered | $he | $(ratio "$he" "$mc") |"
        hp=$(median "${s_paused[@]}")
        echo "| by hand, same argv plus \`-S\` (vCPUs wait for \`cont\`, as under libvirt): QEMU exec → answered | $hp | $(ratio "$hp" "$mc") |"
        echo "| raw QEMU, light argv of the peer baselines: exec → \`qmp_capabilities\` answered (greeting at $floor_greet) | $floor_qmp | $(ratio "$floor_qmp" "$mc") |"
        if [ "$libvirt" = 1 ]; then
                nl=${#s_lvs[@]}
                ld=$(median "${s_lvd[@]}") ls=$(median "${s_lvs[@]}")
                mapfile -t sums < <(for k in $(seq "$nl"); do echo $((s_lvd[k - 1] + s_lvs[k - 1])); done)
                lds=$(median "${sums[@]}")
                echo "| libvirt $lv_version ($nl runs): \`virsh define\` + \`virsh start\` of a new domain (its vTPM state created) | $lds ($ld + $ls) | $(ratio "$lds" "$mc") |"
                echo "| libvirt ($rounds rounds): \`virsh start\` of a domain that has run before | $(median "${l_restart[@]}") | $(ratio "$(median "${l_restart[@]}")" "$mc") |"
                echo "| libvirt: \`virsh list --all\` (the virsh client's own cost) | $lv_noop | — |"
        fi
        echo
        echo "### stop of a guest that honours ACPI ($rounds rounds, median; ratio = that ÷ vm-manager)"
        echo
        echo "| measure | ms | ratio |"
        echo "|---|---|---|"
        ms_=$(median "${stop[@]}")
        row() { echo "| $1 | $2 | $(ratio "$2" "$ms_") |"; }
        row "vm-manager \`stop_vm\`, answered once stopped" "$ms_"
        row "by hand: QMP \`system_powerdown\` → QEMU exited" "$(median "${h_pd[@]}")"
        if [ "$libvirt" = 1 ]; then
                row "libvirt: \`virsh shutdown\` → lifecycle event \"Stopped\" (\`virsh domstate\`: shut off)" "$(median "${l_shutdown[@]}")"
                row "… of which the guest powered off (event \"Shutdown Finished\")" "$(median "${l_poweroff[@]}")"
                row "… and QEMU's process was gone" "$(median "${l_gone[@]}")"
                row "libvirt: \`virsh destroy\` (3 s into a boot)" "$(median "${l_destroy[@]}")"
        fi
        echo
        echo "### resident memory (VmRSS, KiB; each record count from a fresh start; ratio = libvirtd ÷ vm-manager)"
        echo
        echo "| records | vm-manager | libvirtd (inactive domains) | ratio |"
        echo "|---|---|---|---|"
        for n in 0 10 50; do
                lr=—
                [ "$libvirt" = 1 ] && lr=$(ratio "${lvrss[$n]}" "${rss[$n]}")
                echo "| $n | ${rss[$n]} | ${lvrss[$n]:-—} | $lr |"
        done
        pr() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 50 }'; }
        lvpr=— lr=—
        if [ "$libvirt" = 1 ]; then
                lvpr=$(pr "${lvrss[0]}" "${lvrss[50]}")
                lr=$(ratio "$lvpr" "$(pr "${rss[0]}" "${rss[50]}")")
        fi
        echo "| per record, 0 → 50 | $(pr "${rss[0]}" "${rss[50]}") | $lvpr | $lr |"
        echo
        echo "vm-manager live: $rss_start KiB at start, $rss_after KiB after $rounds VMs created, booted and stopped."
        [ "$libvirt" = 1 ] && echo "libvirtd with 1 running domain: $(median "${l_rss1[@]}") KiB (idle: ${lvrss[0]} KiB)."
        echo
        echo "### boot to ready ($rounds rounds, median; ratio = median of the per-round ratios vm-manager ÷ by hand)"
        echo
        echo "| measure | vm-manager | by hand, same argv | ratio | boot-test.py (different argv) |"
        echo "|---|---|---|---|---|"
        bi=— br=—
        if [ ${#b_install[@]} -gt 0 ]; then bi="$(median "${b_install[@]}") s" br="$(median "${b_ready[@]}") s"; fi
        echo "| installer boot: create (vm-manager) or helpers' start (by hand) → installer QEMU exited |" \
                "$(median "${install[@]}") s | $(median "${h_install[@]}") s | $(pratio install h_install) | $bi (QEMU exec → exit) |"
        echo "| first installed boot: helpers' start → READY=1 |" \
                "$(median "${ready[@]}") s | $(median "${h_ready[@]}") s | $(pratio ready h_ready) | $br (QEMU exec → READY=1) |"
        echo "| first installed boot: CPU time (user + system) QEMU had used at READY=1 |" \
                "$(median "${cpu[@]}") s | $(median "${h_cpu[@]}") s | $(pratio cpu h_cpu) | — |"
        echo "| by hand, QEMU exec → installer exit / → READY=1 | — |" \
                "$(median "${h_install_exec[@]}") s / $(median "${h_ready_exec[@]}") s | — | — |"
        if [ "$libvirt" = 1 ]; then
                echo "| \"phase: boot\" on the console: libvirt from \`virsh start\`, by hand from QEMU exec | — | $(median "${h_phase[@]}") s | — | libvirt: $(median "${l_boot[@]}") s |"
        fi
        echo
        echo "create→QMP series: vm-manager ${s_create[*]} (request→swtpm ${s_prep[*]}; swtpm→QEMU ${s_helpers[*]};" \
                "QEMU→answer ${s_qemu[*]}); by hand ${s_hand[*]} (exec→QMP ${s_exec[*]}; with -S ${s_paused[*]}) ms"
        [ "$libvirt" = 1 ] && echo "libvirt series: define ${s_lvd[*]}; start ${s_lvs[*]}; destroy at once ${s_lvx[*]} ms"
        echo "rounds: create ${create[*]} ms; by hand helpers→QMP ${h_tpm_qmp[*]}, exec→QMP ${h_exec_qmp[*]} ms;" \
                "install ${install[*]} s vs ${h_install[*]} s; ready ${ready[*]} s vs ${h_ready[*]} s;" \
                "QEMU CPU at READY=1 ${cpu[*]} s vs ${h_cpu[*]} s; stop ${stop[*]} ms, by hand ${h_pd[*]} ms; boot-test.py install ${b_install[*]:-} ready ${b_ready[*]:-}"
        echo "per-round ratios vm-manager ÷ by hand: installer $(pairs install h_install); READY=1 $(pairs ready h_ready);" \
                "CPU at READY=1 $(pairs cpu h_cpu)"
        if [ "$libvirt" = 1 ]; then
                echo "libvirt rounds: define ${l_define[*]}; start ${l_start[*]}; restart ${l_restart[*]}; shutdown ${l_shutdown[*]}" \
                        "(power down ${l_poweroff[*]}, QEMU gone ${l_gone[*]}); destroy ${l_destroy[*]} ms; phase boot ${l_boot[*]} s;" \
                        "first virsh call $lv_warmup ms"
        fi
        echo "load average (1, 5, 15 min): $load_start at the start, $load_end at the end; $total s in all"
        echo "light QEMU exec→QMP: $floor_list ms"
}
if [ -n "${TABLES_FROM:-}" ]; then
        export LC_ALL=C
        # shellcheck disable=SC1090
        . "$TABLES_FROM"
        render
        exit 0
fi

bin=$(realpath "${1:-build/src/daemon/vm-manager}")
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${ROUNDS:-3}
img=${IMAGE_DIR:-$top/build/test-image}
work=$(mktemp -d /tmp/vmb.XXXXXX)
chmod 711 "$work" # libvirt's QEMU runs as libvirt-qemu and must reach its files under lv/
raw=$work/raw
mkdir -p "$raw"
export LC_ALL=C
pid=
# shellcheck source=bench/vm-libvirt.sh
. "$here/vm-libvirt.sh"

cleanup() {
        # the daemon's VMs are plain children (--launcher process) and end with it
        [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
        lv_stop
        [ -n "${RAW_DIR:-}" ] && mkdir -p "$RAW_DIR" && cp -r "$raw/." "$RAW_DIR/"
        rm -rf "$work"
}
trap cleanup EXIT

. "$top/tools/need.sh"
need_cmds bench/vm.sh bench curl python3 qemu-system-x86_64 swtpm vhost-device-vsock
bash "$top/tests/image/build.sh" "$img" >/dev/null
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
# the interpreter itself: a version manager's shim would cost a shell and more on every call
py=$(python3 -c 'import sys; print(sys.executable)')
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
api="http://127.0.0.1:$port/api/v1"
kib() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$1/status"; }
ms() { awk -v t="$1" 'BEGIN { printf "%.0f", t * 1000 }'; }
jget() { "$py" -c "import json,sys; v=json.load(open(sys.argv[1])); print(eval('v' + sys.argv[2]))" "$@"; }
secs() { # seconds between two RFC 3339 times of a record
        "$py" -c "
import json,sys,datetime
v=json.load(open(sys.argv[1]))
p=lambda s: datetime.datetime.fromisoformat(s.replace('Z','+00:00'))
print('%.2f' % (p(v[sys.argv[3]])-p(v[sys.argv[2]])).total_seconds())" "$@"
}

serve() { # serve STATE-DIR [FLAG...]: starts the daemon, waits for /readyz
        "$bin" serve --listen "127.0.0.1:$port" --state-dir "$1" --image-dir "$img" --launcher process \
                --log-level warning "${@:2}" 2>>"$work/daemon.log" &
        pid=$!
        for _ in $(seq 200); do
                curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0
                sleep 0.05
        done
        echo "bench: vm-manager did not become ready" >&2
        exit 1
}
unserve() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

# ---- peers that need no VM of ours: libvirtd, the light QEMU ----
libvirt=${LIBVIRT:-1}
declare -A lvrss
if [ "$libvirt" = 1 ] && ! lv_start "$work"; then
        echo "bench: libvirt not measured: $lv_why" >&2
        libvirt=0
fi
# Credentials shaped like a VM's (same names, same lengths) for the inactive record domains.
"$py" - "$work/rec-creds" <<'EOF'
import base64, sys
key = base64.b64encode(b"ssh-ed25519 " + b"A" * 68 + b" vm-manager@00000000\n").decode()
open(sys.argv[1], "w").write("\n".join([
    "io.systemd.credential:firstboot.hostname=rec",
    "io.systemd.credential.binary:ssh.authorized_keys.root=" + key,
    "io.systemd.credential:system.machine_id=" + "0" * 32,
    "io.systemd.credential:vmm.notify_socket=vsock-stream:2:50000",
    "io.systemd.stub.kernel-cmdline-extra=ignition.firstboot"]) + "\n")
EOF
if [ "$libvirt" = 1 ]; then
        lvrss[0]=$(lv_rss)
        lv_records 10 "$work/rec-creds"
        lvrss[10]=$(lv_rss)
        lv_records 40 "$work/rec-creds"
        lvrss[50]=$(lv_rss)
        lv_unrecord
fi
"$py" "$here/vm-replay.py" qmp-floor --work "$work/floor" --runs 10 >"$raw/qmp-floor.json"

# ---- create → QMP answering, QMP_RUNS times side by side (one sample is ~0.2 s of a noisy host) ----
# vm-manager creates a VM and the command lines of its installer are copied; the VM is deleted (a
# daemon of its own, whose stop timeout of 1 s ends the installer quickly); the same command lines
# are started by hand up to QMP; libvirt defines and starts a new domain and destroys it.
qmp_runs=${QMP_RUNS:-10}
serve "$work/series" --stop-timeout 1s
s_create=() s_hand=() s_exec=() s_paused=() s_lvd=() s_lvs=() s_lvx=() s_prep=() s_helpers=() s_qemu=()
# process start times (/proc/PID/stat, clock ticks of CLOCK_BOOTTIME) against the wall clock
boot_offset=$("$py" -c 'import time as t; print(t.clock_gettime(t.CLOCK_REALTIME) - t.clock_gettime(t.CLOCK_BOOTTIME))')
hz=$(getconf CLK_TCK)
started() { awk -v o="$boot_offset" -v hz="$hz" '{ sub(/^.*\) /, ""); printf "%.3f", $20 / hz + o }' "/proc/$1/stat"; }
for k in $(seq "$qmp_runs"); do
        t0=$EPOCHREALTIME
        t=$(curl -sS -o "$work/vm.json" -w '%{time_total}' -X POST "$api/vms" -H 'Content-Type: application/json' \
                -d "{\"name\":\"series-$k\",\"memory_mib\":512,\"disk_gib\":1,\"require_attestation\":false,\"wait_for\":\"none\"}")
        t1=$EPOCHREALTIME
        s_create+=("$(ms "$t")")
        id=$(jget "$work/vm.json" '["id"]')
        dir=$work/series/vms/$id
        mkdir -p "$work/sargv/$k"
        "$py" "$here/vm-replay.py" follow --install-only --vm-json "$dir/vm.json" --argv-dir "$work/sargv/$k" \
                >"$work/follow.json"
        ts=$(started "$(jget "$work/follow.json" '["install_pids"]["swtpm"]')")
        tq=$(started "$(jget "$work/follow.json" '["install_pids"]["qemu"]')")
        s_prep+=("$(ms "$(awk -v a="$t0" -v b="$ts" 'BEGIN { print b - a }')")")
        s_helpers+=("$(ms "$(awk -v a="$ts" -v b="$tq" 'BEGIN { print b - a }')")")
        s_qemu+=("$(ms "$(awk -v a="$tq" -v b="$t1" 'BEGIN { print b - a }')")")
        old_volume=$(jget "$work/vm.json" '["paths"]["volume"]')
        curl -fsS -o /dev/null -X DELETE "$api/vms/$id"
        "$py" "$here/vm-replay.py" replay --qmp-only --argv-dir "$work/sargv/$k" --old-dir "$dir" \
                --old-volume "$old_volume" --volume-bytes $((1 << 30)) --old-state "$work/series" \
                --work "$work/shand/$k" >"$raw/series-hand-$k.json"
        rm -rf "$work/shand/$k"
        "$py" "$here/vm-replay.py" replay --qmp-only --paused --argv-dir "$work/sargv/$k" --old-dir "$dir" \
                --old-volume "$old_volume" --volume-bytes $((1 << 30)) --old-state "$work/series" \
                --work "$work/shand/$k" >"$raw/series-paused-$k.json"
        rm -rf "$work/shand/$k"
        s_hand+=("$(ms "$(jget "$raw/series-hand-$k.json" '["helpers_to_qmp"]')")")
        s_exec+=("$(ms "$(jget "$raw/series-hand-$k.json" '["exec_to_qmp"]')")")
        s_paused+=("$(ms "$(jget "$raw/series-paused-$k.json" '["exec_to_qmp"]')")")
        if [ "$libvirt" = 1 ] && [ "$k" -le "${LIBVIRT_RUNS:-5}" ]; then
                lv_quick "$k" "$work/rec-creds"
                s_lvd+=("$lv_define") s_lvs+=("$lv_start_ms") s_lvx+=("$lv_destroy")
        fi
done
unserve

# ---- the rounds ----
serve "$work/state"
sleep 1
rss_start=$(kib "$pid")

# The CPU time (user + system) QEMU had used at READY=1 is a figure the other jobs of a busy host
# disturb less than wall time.
create=() install=() ready=() stop=() cpu=() h_cpu=()
h_tpm_qmp=() h_exec_qmp=() h_install=() h_install_exec=() h_ready=() h_ready_exec=() h_phase=() h_pd=()
b_install=() b_ready=()
l_define=() l_start=() l_boot=() l_shutdown=() l_poweroff=() l_gone=() l_restart=() l_destroy=() l_rss1=()
for i in $(seq "$rounds"); do
        # vm-manager: create (answered once QEMU's QMP answers), installer, first boot, stop
        t=$(curl -sS -o "$work/vm.json" -w '%{time_total}' -X POST "$api/vms" -H 'Content-Type: application/json' \
                -d "{\"name\":\"bench-$i\",\"memory_mib\":512,\"disk_gib\":1,\"require_attestation\":false,\"wait_for\":\"none\"}")
        create+=("$(ms "$t")")
        id=$(jget "$work/vm.json" '["id"]')
        dir=$work/state/vms/$id
        argv=$work/argv/$i
        mkdir -p "$argv"
        "$py" "$here/vm-replay.py" follow --vm-json "$dir/vm.json" --argv-dir "$argv" --url "$api/vms/$id" \
                >"$raw/follow-$i.json"
        curl -sS "$api/vms/$id" >"$work/vm.json"
        st=$(jget "$work/vm.json" '["state"]')
        [ "$st" = ready ] || { echo "bench: VM $id is $st" >&2; exit 1; }
        cpu+=("$(printf '%.2f' "$(jget "$raw/follow-$i.json" '["cpu_at_ready"]')")")
        install+=("$(secs "$work/vm.json" createdAt installedAt)")
        ready+=("$(secs "$work/vm.json" bootedAt readyAt)")
        t=$(curl -sS -o /dev/null -w '%{time_total}' -X POST "$api/vms/$id/stop")
        stop+=("$(ms "$t")")
        cp "$work/vm.json" "$raw/vm-manager-$i.json"
        cp -r "$argv" "$raw/argv-$i"

        # by hand: the same command lines
        "$py" "$here/vm-replay.py" replay --argv-dir "$argv" --old-dir "$dir" \
                --old-volume "$(jget "$work/vm.json" '["paths"]["volume"]')" --old-state "$work/state" \
                --work "$work/hand/$i" >"$raw/hand-$i.json"
        h() { jget "$raw/hand-$i.json" "[\"$1\"]"; }
        h_tpm_qmp+=("$(ms "$(h install_helpers_to_qmp)")")
        h_exec_qmp+=("$(ms "$(h install_exec_to_qmp)")")
        h_install+=("$(printf '%.2f' "$(h install_helpers_to_exit)")")
        h_install_exec+=("$(printf '%.2f' "$(h install_exec_to_exit)")")
        h_ready+=("$(printf '%.2f' "$(h boot_helpers_to_ready)")")
        h_ready_exec+=("$(printf '%.2f' "$(h boot_exec_to_ready)")")
        h_phase+=("$(printf '%.2f' "$(h boot_exec_to_phase_boot)")")
        h_pd+=("$(ms "$(h boot_powerdown_to_exit)")")
        h_cpu+=("$(printf '%.2f' "$(h boot_cpu_at_ready)")")

        # libvirt: the installed disk the replay left, the credentials of vm-manager's first boot
        # but vmm.notify_socket (no vsock to send READY=1 over: the guest would retry for 5 s
        # before it listens to the power button)
        if [ "$libvirt" = 1 ]; then
                "$py" -c '
import sys
a = [x.decode() for x in open(sys.argv[1], "rb").read().split(b"\0") if x]
for i, x in enumerate(a[:-1]):
    if x == "-smbios" and a[i + 1].startswith("type=11,value="):
        print(a[i + 1][len("type=11,value="):].replace(",,", ","))' "$argv/boot.qemu" |
                        grep -v vmm.notify_socket >"$work/creds-$i"
                lv_round "$i" "$work/hand/$i/volume" "$work/creds-$i" || { echo "bench: libvirt: $lv_why" >&2; exit 1; }
                l_define+=("$lv_define") l_start+=("$lv_start_ms") l_boot+=("$lv_boot") l_shutdown+=("$lv_shutdown")
                l_poweroff+=("$lv_poweroff") l_gone+=("$lv_gone") l_restart+=("$lv_restart") l_destroy+=("$lv_destroy")
                l_rss1+=("$lv_rss_running")
        fi
        rm -rf "$work/hand/$i" "$work/lv/$i"

        # boot-test.py: its own argv (no NIC, no vhost-user-vsock in the installer, fewer credentials)
        if [ "${BOOT_TEST:-1}" = 1 ]; then
                out=$("$py" "$top/tests/image/boot-test.py" "$img" --tpm --memory 512 --work "$work/bt" 2>&1 || true)
                rm -rf "$work/bt"
                echo "$out" >"$raw/boot-test-$i.log"
                b_install+=("$(sed -n 's/^installer boot: QEMU exited with 0 at \([0-9.]*\)s.*/\1/p' <<<"$out")")
                b_ready+=("$(sed -n 's/^installed boot: READY=1 at \([0-9.]*\)s.*/\1/p' <<<"$out")")
        fi
done
rss_after=$(kib "$pid")
rec=$work/state/vms/$id/vm.json
unserve

# ---- daemon RSS with 0, 10 and 50 VM records, each from a fresh start ----
# Copies of the last (stopped) VM's record under new ids, names, addresses and volumes.
records() { # records STATE N
        mkdir -p "$1/vms" "$1/volumes"
        "$py" - "$rec" "$1" "$2" <<'EOF'
import json, os, sys
src, state, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
v0 = json.load(open(src))
old = v0["id"]
for k in range(1, n + 1):
    nid = "b%07x" % k
    text = json.dumps(v0).replace(old, nid).replace(os.path.dirname(os.path.dirname(os.path.dirname(src))), state)
    v = json.loads(text)
    v["name"] = v["hostname"] = "rec-%d" % k
    v["ip"] = "192.168.127.%d" % (10 + k)
    v["mac"] = "02:de:c0:a8:7f:%02x" % (10 + k)
    v["cid"] = 100000 + k
    v.pop("processes", None)
    os.makedirs(f"{state}/vms/{nid}", exist_ok=True)
    json.dump(v, open(f"{state}/vms/{nid}/vm.json", "w"), indent=2)
    with open(v["paths"]["volume"], "wb") as f:
        f.truncate(1 << 30)
EOF
}
declare -A rss
for n in 0 10 50; do
        records "$work/rss$n" "$n"
        serve "$work/rss$n"
        sleep 1
        got=$(curl -sS "$api/vms" | "$py" -c 'import json,sys; print(len(json.load(sys.stdin)))')
        [ "$got" = "$n" ] || { echo "bench: $got records loaded, not $n" >&2; exit 1; }
        rss[$n]=$(kib "$pid")
        unserve
done
[ "$libvirt" = 1 ] && lv_stop

# ---- figures, then the tables ----
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
total=$SECONDS
floor=$("$py" -c 'import json,sys,statistics as s; v=json.load(open(sys.argv[1]));
print("%.0f %.0f" % (s.median(v["exec_to_qmp_ms"]), s.median(v["exec_to_greeting_ms"])))' "$raw/qmp-floor.json")
floor_list=$(jget "$raw/qmp-floor.json" '["exec_to_qmp_ms"]')
declare -p rounds qmp_runs libvirt load_start load_end total floor floor_list \
        s_create s_prep s_helpers s_qemu s_hand s_exec s_paused create stop install ready cpu \
        h_tpm_qmp h_exec_qmp h_install h_install_exec h_ready h_ready_exec h_phase h_pd h_cpu b_install b_ready \
        rss rss_start rss_after >"$raw/figures.sh"
if [ "$libvirt" = 1 ]; then
        declare -p lv_version lv_noop lv_warmup lvrss s_lvd s_lvs s_lvx l_define l_start l_boot l_shutdown \
                l_poweroff l_gone l_restart l_destroy l_rss1 >>"$raw/figures.sh"
fi
render
