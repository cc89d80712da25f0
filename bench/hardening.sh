#!/usr/bin/env bash
# /healthz latency while another client misbehaves: holds idle connections, sends requests a byte
# at a time, or sends oversized requests (bench/hostile-client.py), each side by side with an idle
# baseline in the same run, against one daemon started as the tests start it (the fake QEMU of
# tests/integration/fakes first on PATH, --launcher process). Prints a markdown table for
# docs/benchmarks.md.
#   usage: bench/hardening.sh [path/to/vm-manager]      (DURATION=10s CONNECTIONS=8 WARMUP=2)
#
# A scenario is one line of $scenarios: "label|hostile-client arguments" ("-": no hostile client).
# Another misbehaviour is a mode of bench/hostile-client.py and a line here.
set -euo pipefail

bin=${1:-build/src/daemon/vm-manager}
duration=${DURATION:-10s}
conns=${CONNECTIONS:-8}
warmup=${WARMUP:-2}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

for t in wrk curl python3; do
        command -v "$t" >/dev/null || { echo "bench: $t is missing (tools/install-deps.sh bench)" >&2; exit 1; }
done

scenarios=(
        "idle baseline|-"
        "1,100 idle connections from the same address as wrk (127.0.0.1)|idle --count 1100 --from 127.0.0.1"
        "300 idle connections from each of 6 other addresses (1,800)|idle --count 300 --from 127.0.0.2 127.0.0.3 127.0.0.4 127.0.0.5 127.0.0.6 127.0.0.7"
        "1,100 slowloris connections (a byte every 100 ms each) from 127.0.0.2|slowloris --count 1100 --from 127.0.0.2 --gap 0.1"
        "oversized requests (2,000 query arguments, 40 KB header, 1,000 headers, 9 MiB body), 4 clients in a loop|oversized --clients 4"
)

work=$(mktemp -d)
mkdir -p "$work/images" "$work/state"
head -c 4096 /dev/zero >"$work/images/fake_1.0.efi"
head -c 4096 /dev/zero >"$work/images/fake_1.0.raw"
head -c 4096 /dev/zero >"$work/vars"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
PATH="$root/tests/integration/fakes:$PATH" \
        "$bin" serve --listen "127.0.0.1:$port" --state-dir "$work/state" --image-dir "$work/images" \
        --ovmf-code "$work/vars" --ovmf-vars "$work/vars" --launcher process --log-level warning &
pid=$!
hostile=
cleanup() {
        [ -z "$hostile" ] || kill "$hostile" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
        wait 2>/dev/null || true
        rm -rf "$work"
}
trap cleanup EXIT

for _ in $(seq 200); do
        curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
        sleep 0.05
done

wrk_line() { # prints "req/s p50 p99 max errors"
        awk '/^Requests\/sec:/ { r = $2 }
             $1 == "50%" { p50 = $2 } $1 == "99%" { p99 = $2 } $1 == "Latency" && max == "" { max = $4 }
             /Socket errors/ { sub(/^ *Socket errors: /, ""); gsub(/ /, "_"); e = $0 }
             END { print r, p50, p99, max, (e == "" ? "none" : e) }'
}

echo "| while another client… | /healthz req/s | p50 | p99 | max | wrk errors | the other client |"
echo "|---|---|---|---|---|---|---|"
for s in "${scenarios[@]}"; do
        label=${s%%|*}
        args=${s#*|}
        summary="-"
        if [ "$args" != "-" ]; then
                # shellcheck disable=SC2086 # the arguments are words
                python3 "$here/hostile-client.py" ${args%% *} "$port" ${args#* } >"$work/hostile.out" 2>&1 &
                hostile=$!
                sleep "$warmup"
        fi
        read -r rps p50 p99 max errors < <(wrk -t1 -c"$conns" -d"$duration" --latency \
                "http://127.0.0.1:$port/healthz" | wrk_line)
        if [ -n "$hostile" ]; then
                kill -TERM "$hostile" 2>/dev/null || true
                wait "$hostile" 2>/dev/null || true
                hostile=
                summary=$(tail -n1 "$work/hostile.out")
        fi
        kill -0 "$pid" 2>/dev/null || { echo "bench: the daemon died during '$label'" >&2; exit 1; }
        echo "| $label | $rps | $p50 | $p99 | $max | ${errors//_/ } | $summary |"
        sleep 1
done
echo
echo "wrk: 1 thread, $conns connections, $duration per row, after ${warmup}s of the other client;" \
        "daemon: $("$bin" version | head -n1), log level warning"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -r)"
