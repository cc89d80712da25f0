#!/usr/bin/env bash
# The cost of a stateless MCP request (revision 2026-07-28: envelope in params._meta, headers
# checked against the body, no session) against a session request (2025-11-25: Mcp-Session-Id
# after initialize), side by side: the same tools/call on the same daemon under the same load,
# alternating, ROUNDS times each. Prints a markdown table with the medians and their ratio.
#   usage: bench/mcp-stateless.sh [path/to/vm-manager]   (DURATION=5s CONNECTIONS=16 THREADS=1
#          ROUNDS=3 MCP_TOOL=list_networks)
set -euo pipefail

bin=${1:-build/src/daemon/vm-manager}
duration=${DURATION:-5s}
conns=${CONNECTIONS:-16}
threads=${THREADS:-1}
rounds=${ROUNDS:-3}
export MCP_TOOL=${MCP_TOOL:-list_networks}
here=$(cd "$(dirname "$0")" && pwd)

. "$here/../tools/need.sh"
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

export MCP_SESSION
MCP_SESSION=$(curl -fsS -D - -o /dev/null "http://127.0.0.1:$port/mcp" -H 'Content-Type: application/json' \
        -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}' |
        awk -F': ' 'tolower($1) == "mcp-session-id" { print $2 }' | tr -d '\r')
[ -n "$MCP_SESSION" ] || { echo "initialize gave no session" >&2; exit 1; }

run() { # prints "req/s p50(us) p99(us)" of one wrk run with script $1
        wrk -t"$threads" -c"$conns" -d"$duration" --latency -s "$here/$1" "http://127.0.0.1:$port/mcp" |
                awk 'function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; return v * 1000000 }
                     /^Requests\/sec:/ { r = $2 } $1 == "50%" { p50 = us($2) } $1 == "99%" { p99 = us($2) }
                     /Non-2xx/ { print "wrk: " $0 > "/dev/stderr"; bad = 1 }
                     END { if (bad) exit 1; print r, p50, p99 }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

: >"$state/session" ; : >"$state/stateless"
for _ in $(seq "$rounds"); do
        run mcp-call.lua >>"$state/session"
        run mcp-stateless.lua >>"$state/stateless"
done
for kind in session stateless; do
        read -r rps p50 p99 < <(paste <(cut -d' ' -f1 "$state/$kind" | median) \
                <(cut -d' ' -f2 "$state/$kind" | median) <(cut -d' ' -f3 "$state/$kind" | median) | tr '\t' ' ')
        eval "${kind}_rps=$rps ${kind}_p50=$p50 ${kind}_p99=$p99"
done

echo "| MCP tools/call $MCP_TOOL, $conns connections, $threads wrk thread, median of $rounds × $duration | req/s | p50 | p99 |"
echo "|---|---|---|---|"
echo "| 2025-11-25, in a session | $session_rps | ${session_p50} µs | ${session_p99} µs |"
echo "| 2026-07-28, stateless | $stateless_rps | ${stateless_p50} µs | ${stateless_p99} µs |"
awk -v a="$stateless_rps" -v b="$session_rps" 'BEGIN { printf "| stateless / session | %.2f | | |\n", a / b }'
echo
echo "machine: $(nproc) cores, $(uname -r); binary: $bin"
