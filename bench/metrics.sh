#!/usr/bin/env bash
# The cost of a /metrics scrape: 50 VMs (the fake QEMU of tests/integration/fakes: real processes
# whose /proc the scrape reads, no guests), each with a guest report of 1,000 entries loaded through
# its IMDS listener, then GET /metrics and, side by side under the same load, GET /api/v1/vms.
# Prints the figures for docs/benchmarks.md.
#   usage: bench/metrics.sh [path/to/vm-manager]      (VMS=50 ENTRIES=1000 DURATION=10s)
set -euo pipefail

bin=${1:-build/src/daemon/vm-manager}
vms=${VMS:-50}
entries=${ENTRIES:-1000}
duration=${DURATION:-10s}
root=${ROOT:-$(cd "$(dirname "$0")/.." && pwd)}

. "$root/tools/need.sh"
need_cmds bench bench wrk curl python3

work=$(mktemp -d)
mkdir -p "$work/images" "$work/state"
head -c 4096 /dev/zero >"$work/images/fake_1.0.efi"
head -c 4096 /dev/zero >"$work/images/fake_1.0.raw"
head -c 4096 /dev/zero >"$work/vars"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
PATH="$root/tests/integration/fakes:$PATH" FAKE_QEMU=install-exit:0 \
        "$bin" serve --listen "127.0.0.1:$port" --state-dir "$work/state" --image-dir "$work/images" \
        --ovmf-code "$work/vars" --ovmf-vars "$work/vars" --launcher process --log-level warning \
        --metrics-guest-series-limit "$entries" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT

for _ in $(seq 200); do
        curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
        sleep 0.05
done

wrk_line() { # prints "req/s p50 p99"
        awk '/^Requests\/sec:/ { r = $2 } $1 == "50%" { p50 = $2 } $1 == "99%" { p99 = $2 } END { print r, p50, p99 }'
}
scrape() { # $1 path: one request, prints "bytes seconds"
        curl -fsS -o /dev/null -w '%{size_download} %{time_total}\n' "http://127.0.0.1:$port$1"
}

read -r empty_bytes _ < <(scrape /metrics)
read -r empty_rps empty_p50 empty_p99 < <(wrk -t1 -c1 -d"$duration" --latency "http://127.0.0.1:$port/metrics" | wrk_line)

python3 - "$port" "$work/state" "$vms" "$entries" <<'EOF'
import json, socket, sys, time, urllib.request
port, state, n, entries = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
api = "http://127.0.0.1:%s/api/v1" % port
ids = []
for i in range(n):
    body = json.dumps({"name": "bench-%d" % i, "memory_mib": 512, "disk_gib": 1, "require_attestation": False,
                       "wait_for": "none"}).encode()
    req = urllib.request.Request(api + "/vms", data=body, method="POST", headers={"Content-Type": "application/json"})
    ids.append(json.load(urllib.request.urlopen(req))["id"])
deadline = time.monotonic() + 300
for vid in ids:
    while json.load(urllib.request.urlopen(api + "/vms/" + vid))["state"] != "booting":
        if time.monotonic() > deadline:
            sys.exit("bench: VM %s did not reach booting" % vid)
        time.sleep(0.1)
for vid in ids:
    report = {"mediaType": "application/vnd.io.systemd.report", "timestamp": "Sun 2026-11-29 12:00:00 UTC",
              "metrics": [{"name": "io.systemd.Manager.NRestarts" if k % 2 else "io.systemd.Unit.ActiveState",
                           "object": "unit-%04d.service" % k, "value": k if k % 2 else "active"}
                          for k in range(entries)]}
    body = json.dumps(report).encode()
    s = socket.socket(socket.AF_UNIX)
    s.connect("%s/vms/%s/imds.sock" % (state, vid))
    s.sendall(b"POST /giantswarm/v1/report HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    answer = s.recv(4096)
    s.close()
    if b" 204 " not in answer.split(b"\r\n")[0]:
        sys.exit("bench: report upload refused: %r" % answer[:200])
EOF

kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$pid/status"; }
read -r full_bytes full_once < <(scrape /metrics)
series=$(curl -fsS "http://127.0.0.1:$port/metrics" | grep -vc '^#')
read -r m_rps m_p50 m_p99 < <(wrk -t1 -c1 -d"$duration" --latency "http://127.0.0.1:$port/metrics" | wrk_line)
read -r l_rps l_p50 l_p99 < <(wrk -t1 -c1 -d"$duration" --latency "http://127.0.0.1:$port/api/v1/vms" | wrk_line)
read -r list_bytes _ < <(scrape /api/v1/vms)
rss=$(kib VmRSS)
ratio=$(awk -v a="$l_rps" -v b="$m_rps" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "n/a" }')

cat <<EOF
| Measure ($vms VMs, $entries-entry guest reports, one connection) | Value |
|---|---|
| /metrics with no VMs: size, req/s, p50, p99 | $empty_bytes B, $empty_rps, $empty_p50, $empty_p99 |
| /metrics loaded: size, sample lines | $full_bytes B, $series |
| /metrics loaded: req/s, p50, p99 | $m_rps, $m_p50, $m_p99 |
| GET /api/v1/vms side by side: size, req/s, p50, p99 | $list_bytes B, $l_rps, $l_p50, $l_p99 |
| list_vms req/s ÷ /metrics req/s | $ratio |
| daemon RSS with the reports loaded | $rss KiB |
EOF
