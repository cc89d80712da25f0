#!/usr/bin/env bash
# Measures the daemon's idle footprint and /healthz throughput on loopback, and prints the
# figures as a markdown table for docs/benchmarks.md.
#   usage: bench/run.sh [path/to/vm-manager]      (DURATION=10s CONNECTIONS=64 THREADS=2)
set -euo pipefail

bin=${1:-build/src/daemon/vm-manager}
duration=${DURATION:-10s}
conns=${CONNECTIONS:-64}
threads=${THREADS:-2}

for t in wrk curl; do
        command -v "$t" >/dev/null || { echo "bench: $t is missing (tools/install-deps.sh bench)" >&2; exit 1; }
done

state=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" --state-dir "$state" --log-level warning &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$state"' EXIT

for _ in $(seq 100); do
        curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
        sleep 0.05
done
sleep 1

kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$pid/status"; }
idle_rss=$(kib VmRSS)

out=$(wrk -t"$threads" -c"$conns" -d"$duration" --latency "http://127.0.0.1:$port/healthz")
rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
p50=$(awk '$1 == "50%" { print $2 }' <<<"$out")
p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
errors=$(awk '/Socket errors|Non-2xx/ { print }' <<<"$out")
peak_rss=$(kib VmHWM)
after_rss=$(kib VmRSS)

echo "| metric | value |"
echo "|---|---|"
echo "| idle RSS after start-up | $((idle_rss)) KiB ($(awk -v k="$idle_rss" 'BEGIN { printf "%.2f", k / 1024 }') MiB) |"
echo "| GET /healthz, $conns connections, $threads wrk threads, $duration | $rps req/s |"
echo "| latency p50 / p99 | $p50 / $p99 |"
echo "| RSS after the load / peak | $after_rss KiB / $peak_rss KiB |"
[ -z "$errors" ] || echo "| wrk errors | $errors |"
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -r)"
