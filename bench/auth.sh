#!/usr/bin/env bash
# The cost of --enable-oauth on the API: GET /api/v1/vms anonymous (a daemon without OAuth) against
# the same route with a bearer token (a daemon with OAuth, its IdP the oidc-provider of
# tests/integration/oidc), side by side in one run, rounds alternating, medians reported. Loads:
#   anonymous        no OAuth at all
#   anonymous+header no OAuth, but the same Authorization header sent (what the bytes alone cost)
#   token, warm      one access token of the IdP (RS256), verified once and then found in the cache
#   token, cold      3000 distinct tokens in turn: more than the cache holds, so every request pays
#                    the signature check (the worst case, not the usual one)
# Prints a markdown table for docs/benchmarks.md.
#   usage: bench/auth.sh [path/to/vm-manager]     (DURATION=5s CONNECTIONS=64 THREADS=2 ROUNDS=5)
# The npm packages come from OIDC_CACHE_DIR (default: build/tests/integration/oidc-cache, where
# test-oauth installs them); npm ci fills it when it is empty.
set -euo pipefail

bin=${1:-build/src/daemon/vm-manager}
duration=${DURATION:-5s}
conns=${CONNECTIONS:-64}
threads=${THREADS:-2}
rounds=${ROUNDS:-5}
here=$(cd "$(dirname "$0")" && pwd)
oidc=$here/../tests/integration/oidc
cache=${OIDC_CACHE_DIR:-$(dirname "$(dirname "$(dirname "$bin")")")/tests/integration/oidc-cache}

for t in wrk curl node npm python3; do
        command -v "$t" >/dev/null || { echo "bench: $t is missing (tools/install-deps.sh bench check)" >&2; exit 1; }
done
if [ ! -d "$cache/node_modules/oidc-provider" ]; then
        mkdir -p "$cache"
        cp "$oidc/package.json" "$oidc/package-lock.json" "$cache/"
        (cd "$cache" && npm ci --no-audit --no-fund --ignore-scripts >/dev/null)
fi
cp "$oidc/provider.mjs" "$cache/"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$work"' EXIT

anon_port=$(free_port)
auth_port=$(free_port)
(cd "$cache" && OIDC_TEST_KEYS=$oidc/test-keys.json exec node provider.mjs "http://127.0.0.1:$auth_port/oauth/callback" \
        >"$work/provider.out" 2>"$work/provider.err") &
pids+=($!)
for _ in $(seq 100); do
        grep -q READY "$work/provider.out" 2>/dev/null && break
        sleep 0.05
done
idp_port=$(awk '/READY/ { print $2 }' "$work/provider.out")
issuer=http://127.0.0.1:$idp_port

"$bin" serve --listen "127.0.0.1:$anon_port" --state-dir "$work/anon" --log-level warning &
pids+=($!)
"$bin" serve --listen "127.0.0.1:$auth_port" --state-dir "$work/auth" --log-level warning \
        --enable-oauth --oauth-base-url "http://127.0.0.1:$auth_port" --dex-issuer-url "$issuer" \
        --dex-client-id vm-manager --dex-client-secret dex-secret --allow-private-oauth-urls &
pids+=($!)
for port in "$anon_port" "$auth_port"; do
        for _ in $(seq 100); do
                curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
                sleep 0.05
        done
done

resource=http://127.0.0.1:$auth_port/mcp
token=$(curl -fsS -u svc:svc-secret -d grant_type=client_credentials -d scope=vm:read \
        --data-urlencode "resource=$resource" "$issuer/token" | python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])')
curl -fsS -o /dev/null -H "Authorization: Bearer $token" "http://127.0.0.1:$auth_port/api/v1/vms"

# 3000 distinct tokens of the IdP's signing key, minted through its test control
python3 - "$idp_port" "$issuer" "$resource" >"$work/tokens" <<'PY'
import http.client, json, sys, time
port, issuer, resource = int(sys.argv[1]), sys.argv[2], sys.argv[3]
c = http.client.HTTPConnection("127.0.0.1", port)
now = int(time.time())
for i in range(3000):
    body = json.dumps({"kid": "test-rsa-1", "header": {"typ": "at+jwt"},
                       "claims": {"iss": issuer, "sub": "bench-%d" % i, "aud": resource, "iat": now, "exp": now + 3600}})
    c.request("POST", "/_test/mint", body=body, headers={"Content-Type": "application/json"})
    print(json.loads(c.getresponse().read())["token"])
PY

wrk_line() { # prints "req/s p50 p99", the latencies in ms
        awk 'function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
             /^Requests\/sec:/ { r = $2 } $1 == "50%" { p50 = ms($2) } $1 == "99%" { p99 = ms($2) } END { print r, p50, p99 }'
}
declare -A rps p99
run() { # name, then wrk arguments
        local name=$1 r l50 l99
        shift
        read -r r l50 l99 < <(wrk -t"$threads" -c"$conns" -d"$duration" --latency "$@" | wrk_line)
        rps[$name]+="$r "
        p99[$name]+="$l99 "
}
export BEARER_TOKENS=$work/tokens
for _ in $(seq "$rounds"); do
        run anonymous "http://127.0.0.1:$anon_port/api/v1/vms"
        run anonymous+header -H "Authorization: Bearer $token" "http://127.0.0.1:$anon_port/api/v1/vms"
        run warm -H "Authorization: Bearer $token" "http://127.0.0.1:$auth_port/api/v1/vms"
        run cold -s "$here/bearer-tokens.lua" "http://127.0.0.1:$auth_port/api/v1/vms"
done

median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { printf "%s", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
base=$(median "${rps[anonymous]}")
echo "| GET /api/v1/vms, $conns connections, $threads wrk threads, $rounds × $duration each | req/s (rounds) | median | vs anonymous | p99 median |"
echo "|---|---|---|---|---|"
for name in anonymous anonymous+header warm cold; do
        m=$(median "${rps[$name]}")
        echo "| $name | ${rps[$name]% } | $m | $(awk -v a="$m" -v b="$base" 'BEGIN { printf "%.2fx", a / b }') | $(median "${p99[$name]}") ms |"
done
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -r)"
