#!/usr/bin/env bash
# VM lifecycle figures, side by side in one run: vm-manager against the same QEMU started by hand
# (tests/image/boot-test.py, the same argv shape, swtpm included), on the tiny test image.
#   usage: bench/vm.sh [path/to/vm-manager]        (ROUNDS=3)
# Prints a markdown table for docs/benchmarks.md.
set -euo pipefail

bin=$(realpath "${1:-build/src/daemon/vm-manager}")
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${ROUNDS:-3}
work=$(mktemp -d)
img=${IMAGE_DIR:-$top/build/test-image}
trap 'pkill -f "state-dir $work" 2>/dev/null || true; sleep 1; rm -rf "$work"' EXIT

bash "$top/tests/image/build.sh" "$img" >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" --state-dir "$work/state" --image-dir "$img" --log-level warning 2>"$work/log" &
pid=$!
for _ in $(seq 200); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.05; done
api="http://127.0.0.1:$port/api/v1"
kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$2/status"; }
rss0=$(kib VmRSS $pid)

field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
secs() { # seconds between two RFC 3339 times of a record
        python3 -c "
import json,sys,datetime
v=json.load(sys.stdin)
p=lambda s: datetime.datetime.fromisoformat(s.replace('Z','+00:00'))
print('%.1f' % (p(v['$2'])-p(v['$1'])).total_seconds())"
}

create=() install=() ready=() stop=()
for i in $(seq "$rounds"); do
        t=$(curl -sS -o "$work/vm.json" -w '%{time_total}' -X POST "$api/vms" \
                -d "{\"name\":\"bench-$i\",\"memory_mib\":512,\"disk_gib\":1,\"require_attestation\":false,\"wait_for\":\"none\"}")
        id=$(field '["id"]' <"$work/vm.json")
        create+=("$(awk -v t="$t" 'BEGIN { printf "%.0f", t * 1000 }')")
        for _ in $(seq 600); do
                curl -sS "$api/vms/$id" >"$work/vm.json"
                st=$(field '["state"]' <"$work/vm.json")
                [ "$st" = ready ] || [ "$st" = failed ] && break
                sleep 0.5
        done
        install+=("$(secs createdAt installedAt <"$work/vm.json")")
        ready+=("$(secs bootedAt readyAt <"$work/vm.json")")
        t=$(curl -sS -o /dev/null -w '%{time_total}' -X POST "$api/vms/$id/stop")
        stop+=("$(awk -v t="$t" 'BEGIN { printf "%.0f", t * 1000 }')")
done
rss_stopped=$(kib VmRSS $pid)

# 50 stopped records: copies of the last one under new ids, loaded by a fresh start.
kill $pid; wait $pid 2>/dev/null || true
rec=$(ls "$work"/state/vms/*/vm.json | head -1)
for n in $(seq 1 50); do
        nid=$(printf 'b%07x' "$n")
        mkdir -p "$work/state/vms/$nid"
        sed -e "s/\"id\": \"[0-9a-f]*\"/\"id\": \"$nid\"/" -e "s/\"name\": \"[^\"]*\"/\"name\": \"rec-$n\"/" \
                -e "s#/vms/[0-9a-f]\{8\}#/vms/$nid#g" "$rec" >"$work/state/vms/$nid/vm.json"
done
"$bin" serve --listen "127.0.0.1:$port" --state-dir "$work/state" --image-dir "$img" --log-level warning 2>>"$work/log" &
pid=$!
for _ in $(seq 200); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.05; done
sleep 1
n_records=$(curl -sS "$api/vms" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
rss50=$(kib VmRSS $pid)
kill $pid; wait $pid 2>/dev/null || true

# The same boots by hand.
raw_install=() raw_ready=()
for i in $(seq "$rounds"); do
        out=$(python3 "$top/tests/image/boot-test.py" "$img" --tpm --memory 512 2>&1 || true)
        raw_install+=("$(sed -n 's/^installer boot: QEMU exited with 0 at \([0-9.]*\)s.*/\1/p' <<<"$out")")
        raw_ready+=("$(sed -n 's/^installed boot: READY=1 at \([0-9.]*\)s.*/\1/p' <<<"$out")")
done

median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "| measure ($rounds rounds, median) | vm-manager | by hand | ratio |"
echo "|---|---|---|---|"
echo "| create_vm (wait_for none) answered, QMP up (swtpm, vhost-device-vsock, QEMU started) | $(median "${create[@]}") ms | — | — |"
mi=$(median "${install[@]}") ri=$(median "${raw_install[@]}")
echo "| installer boot, create → installed | ${mi} s | ${ri} s (exec → exit) | $(awk -v a="$mi" -v b="$ri" 'BEGIN { printf "%.2f", a / b }') |"
mr=$(median "${ready[@]}") rr=$(median "${raw_ready[@]}")
echo "| installed boot → READY=1 | ${mr} s | ${rr} s | $(awk -v a="$mr" -v b="$rr" 'BEGIN { printf "%.2f", a / b }') |"
echo "| stop_vm of a guest that honours ACPI, answered once stopped | $(median "${stop[@]}") ms | — | — |"
echo "| daemon RSS: 0 VMs / $rounds stopped records / $n_records records | ${rss0} / ${rss_stopped} / ${rss50} KiB | — | — |"
echo
echo "rounds: create ${create[*]} ms; install ${install[*]} s vs ${raw_install[*]} s; ready ${ready[*]} s vs ${raw_ready[*]} s; stop ${stop[*]} ms"
