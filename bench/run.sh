#!/usr/bin/env bash
# Measures the daemon's idle footprint and /healthz throughput on loopback, and prints the
# figures as a markdown table for docs/benchmarks.md.
#   usage: bench/run.sh [path/to/vm-manager]      (DURATION=10s CONNECTIONS=64 THREADS=2)
set -euo pipefail

bin=${1:-build/src/daemon/vm-manager}
duration=${DURATION:-10s}
conns=${CONNECTIONS:-64}
threads=${THREADS:-2}

. "$(dirname "$0")/../tools/need.sh"
need_cmds bench bench wrk curl python3

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

# The API: 100 networks recorded (as many records as the VM budget's 100 VMs), then the list route
# and an MCP tools/call of get_host, each under the same load as /healthz.
for i in $(seq 100); do
        curl -fsS -o /dev/null -X POST "http://127.0.0.1:$port/api/v1/networks" -H "Content-Type: application/json" \
                -d "{\"name\":\"bench-$i\",\"cidr\":\"10.$((i / 256)).$((i % 256)).0/24\"}"
done
rss_100=$(kib VmRSS)
wrk_line() { # prints "req/s p50 p99"
        awk '/^Requests\/sec:/ { r = $2 } $1 == "50%" { p50 = $2 } $1 == "99%" { p99 = $2 } END { print r, p50, p99 }'
}
read -r net_rps net_p50 net_p99 < <(wrk -t"$threads" -c"$conns" -d"$duration" --latency \
        "http://127.0.0.1:$port/api/v1/networks" | wrk_line)

session=$(curl -fsS -D - -o /dev/null "http://127.0.0.1:$port/mcp" -H 'Content-Type: application/json' \
        -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}' |
        awk -F': ' 'tolower($1) == "mcp-session-id" { print $2 }' | tr -d '\r')
here=$(cd "$(dirname "$0")" && pwd)
read -r mcp_rps mcp_p50 mcp_p99 < <(MCP_SESSION=$session MCP_TOOL=get_host wrk -t"$threads" -c"$conns" \
        -d"$duration" --latency -s "$here/mcp-call.lua" "http://127.0.0.1:$port/mcp" | wrk_line)

echo "| metric | value |"
echo "|---|---|"
echo "| idle RSS after start-up | $((idle_rss)) KiB ($(awk -v k="$idle_rss" 'BEGIN { printf "%.2f", k / 1024 }') MiB) |"
echo "| GET /healthz, $conns connections, $threads wrk threads, $duration | $rps req/s |"
echo "| latency p50 / p99 | $p50 / $p99 |"
echo "| RSS after the load / peak | $after_rss KiB / $peak_rss KiB |"
[ -z "$errors" ] || echo "| wrk errors | $errors |"
echo "| RSS with 100 networks recorded | $rss_100 KiB |"
echo "| GET /api/v1/networks (100 networks, 24 KiB body) | $net_rps req/s, p50 $net_p50, p99 $net_p99 |"
echo "| MCP tools/call get_host | $mcp_rps req/s, p50 $mcp_p50, p99 $mcp_p99 |"
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -r)"
