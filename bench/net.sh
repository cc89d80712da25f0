#!/usr/bin/env bash
# The network data plane side by side with its peers: TCP throughput (iperf3, one stream, both
# directions) from a network namespace to a server on the host, through
#   switch      our NetSwitch + libslirp (tests/net/net-harness on a tap),
#   slirp4netns the same libslirp behind slirp4netns's own loop,
#   pasta       passt's L2-to-L4 translator,
#   veth        a kernel veth pair, routed (no userspace at all: the ceiling, for scale),
# at MTU 1500 and 65520, interleaved (rep 1 of every cell, then rep 2, ...) so that all see the same
# load; plus the IMDS GET latency through the switch (a new connection per request), and the same GET
# loop through slirp4netns and veth to a responder on the host, for scale. Prints markdown tables for
# docs/benchmarks.md. Raw iperf3 JSON stays in $OUT.
#
#   usage: bench/net.sh [path/to/net-harness]     (as root)
#   env:   DURATION=10 REPS=5 MTUS="1500 65520" PATHS="switch slirp4netns pasta veth" IMDS_REQUESTS=2000
#          OUT=<dir for raw results> (default: a new /tmp/bench-net.XXXXXX)
#          REPORT_ONLY=1 OUT=<dir>: print the tables of an earlier run again
#
# The iperf3 server listens on the host's own non-loopback address, which every path reaches through
# its NAT: the switch refuses host loopback by design, so nobody gets it here.
set -euo pipefail

harness=${1:-build/tests/net/net-harness}
duration=${DURATION:-10}
reps=${REPS:-5}
mtus=${MTUS:-1500 65520}
paths=${PATHS:-switch slirp4netns pasta veth}
imds_requests=${IMDS_REQUESTS:-2000}
out=${OUT:-$(mktemp -d /tmp/bench-net.XXXXXX)}
mkdir -p "$out"

die() {
        echo "bench/net: $*" >&2
        exit 1
}
say() { echo "bench/net: $*" >&2; }

report() { # the markdown tables, from the raw results in $out
        python3 - "$out" <<'PY'
import csv, statistics, sys
out = sys.argv[1]
rows = list(csv.reader(open(f"{out}/results.tsv"), delimiter="\t"))
cells = {}
for path, mtu, d, rep, gbps, cpu, retr in rows:
        cells.setdefault((path, int(mtu), d), []).append((float(gbps), int(cpu), int(retr)))

def med(v):
        v = [x for x in v if x == x]
        return statistics.median(v) if v else float("nan")

def fmt(key):
        v = cells.get(key)
        if not v:
                return "–", float("nan")
        g = [x[0] for x in v]
        m = med(g)
        s = f"**{m:.2f}**" + (f" ({min(g):.2f}–{max(g):.2f})" if len(g) > 1 else "")
        return s, m

print(open(f"{out}/env.txt").read().strip().replace("\n", "  \n"))
print()
print("| path | MTU | ns→host Gbit/s | vs slirp4netns | host→ns Gbit/s | vs slirp4netns | helper CPU % (→host / →ns) | Gbit/s per helper core (→host / →ns) | retransmits (→host / →ns) |")
print("|---|---|---|---|---|---|---|---|---|")
paths = []
for p, _, _ in cells:
        if p not in paths:
                paths.append(p)
for mtu in sorted({k[1] for k in cells}):
        for p in paths:
                cols = []
                for d in ("up", "down"):
                        s, m = fmt((p, mtu, d))
                        _, ref = fmt(("slirp4netns", mtu, d))
                        ratio = f"{m / ref:.2f}×" if ref == ref and ref > 0 and m == m else "–"
                        cols += [s, ratio]
                cpu = " / ".join(
                        f"{c:.0f}" if (c := med([x[1] for x in cells.get((p, mtu, d), [])])) >= 0 else "–"
                        for d in ("up", "down"))
                # throughput per core the helper actually got: fairer than Gbit/s alone on a shared host
                per_core = " / ".join(
                        f"{e:.2f}" if (e := med([x[0] * 100 / x[1] for x in cells.get((p, mtu, d), []) if x[1] > 0])) == e
                        else "–"
                        for d in ("up", "down"))
                retr = " / ".join(f"{med([x[2] for x in cells.get((p, mtu, d), [])]):.0f}" for d in ("up", "down"))
                print(f"| {p} | {mtu} | " + " | ".join(cols) + f" | {cpu} | {per_core} | {retr} |")
print()
lat = list(csv.reader(open(f"{out}/latency.tsv"), delimiter="\t"))
if lat:
        print("| GET, new connection each (median of runs) | MTU | runs × requests | p50 ms | p90 ms | p99 ms | max ms | failed |")
        print("|---|---|---|---|---|---|---|---|")
        groups = {}
        for name, mtu, rep, n, *v, err in lat:
                groups.setdefault((name, int(mtu)), []).append((int(n), [float(x) for x in v], int(err)))
        for (name, mtu), runs in groups.items():
                cols = []
                for i in range(4):
                        v = [r[1][i] for r in runs]
                        cols.append(f"{statistics.median(v):.2f}" + (f" ({min(v):.2f}–{max(v):.2f})" if len(v) > 1 else ""))
                print(f"| {name} | {mtu} | {len(runs)} × {runs[0][0]} | " + " | ".join(cols) + f" | {sum(r[2] for r in runs)} |")
        print()
imds = [r for r in lat if r[0].startswith("IMDS")]
print("Budgets (DESIGN.md §4); paired = switch / slirp4netns within each rep, run back to back:")
for mtu in sorted({k[1] for k in cells}):
        for d, name in (("up", "ns→host"), ("down", "host→ns")):
                _, sw = fmt(("switch", mtu, d))
                _, ref = fmt(("slirp4netns", mtu, d))
                if not (sw == sw and ref == ref):
                        continue
                reps_sw = {r: float(g) for p, m, dd, r, g, *_ in rows if (p, int(m), dd) == ("switch", mtu, d)}
                reps_s4 = {r: float(g) for p, m, dd, r, g, *_ in rows if (p, int(m), dd) == ("slirp4netns", mtu, d)}
                paired = [reps_sw[r] / reps_s4[r] for r in sorted(reps_sw) if r in reps_s4 and reps_s4[r] > 0]
                pm = statistics.median(paired) if paired else float("nan")
                verdict = "met" if sw > ref and pm > 1 else "NOT met"
                print(f"- switch+slirp above slirp4netns, {name}, MTU {mtu}: medians {sw:.2f} vs {ref:.2f} Gbit/s; "
                      f"paired {' '.join(f'{x:.2f}' for x in paired)} (median {pm:.2f}): {verdict}")
if imds:
        worst = max(float(r[6]) for r in imds)
        failed = sum(int(r[8]) for r in imds)
        p99s = sorted(float(r[6]) for r in imds)
        mid = statistics.median(p99s)
        print(f"- IMDS GET p99 < 2 ms: median p99 {mid:.2f} ms, worst {worst:.2f} ms over {len(imds)} runs "
              f"({failed} failed GETs), {'met' if worst < 2 else 'met in the median run only' if mid < 2 else 'NOT met'}")
print(f"\nraw results: {out}")
PY
}

# REPORT_ONLY=1 OUT=<dir>: only the tables, from an earlier run
if [ -n "${REPORT_ONLY:-}" ]; then
        [ -s "$out/results.tsv" ] || die "no results in '$out' (give OUT=<dir of an earlier run>)"
        report
        exit 0
fi

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, taps)"
[ -x "$harness" ] || die "no net-harness at '$harness' (ninja -C build, or give its path)"
. "$(dirname "$0")/../tools/need.sh"
need_cmds bench/net.sh bench ip iperf3 slirp4netns pasta python3

host_ip=$(ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
[ -n "$host_ip" ] || host_ip=$(ip -4 -o addr show scope global | awk '{ sub("/.*", "", $4); print $4; exit }')
[ -n "$host_ip" ] || die "the host has no non-loopback IPv4 address"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
tick=$(getconf CLK_TCK)

ns=nbnet$$
helper=
server=
responder=
cleanup() {
        set +e # every step, whatever the others did
        local p
        for p in $responder $helper $server; do
                kill "$p" 2>/dev/null
                wait "$p" 2>/dev/null
        done
        ip netns del "$ns" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

iperf3 -s -B "$host_ip" -p "$port" >"$out/iperf3-server.log" 2>&1 &
server=$!
sleep 0.5

cpu_ticks() { # utime + stime of a process, in clock ticks; -1 without one (veth)
        if [ -n "$1" ]; then
                awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo -1
        else
                echo -1
        fi
}

wait_for() { # wait_for SECONDS COMMAND...
        local i
        for ((i = 0; i < $1 * 20; i++)); do
                "${@:2}" >/dev/null 2>&1 && return 0
                sleep 0.05
        done
        return 1
}

ns_new() {
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip netns exec "$ns" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6'
}

ns_del() {
        if [ -n "$helper" ]; then
                kill "$helper" 2>/dev/null || true
                wait "$helper" 2>/dev/null || true
                helper=
        fi
        ip netns del "$ns" 2>/dev/null || true
}

# Each path: a namespace whose default route leads through the helper to the host.
up_switch() { # MTU
        "$harness" --tap nbsw0 --mac 02:00:0a:4d:00:0a --ip 10.77.0.10 --cidr 10.77.0.0/24 --mtu "$1" --imds \
                >"$out/harness-$1.out" 2>&1 &
        helper=$!
        wait_for 5 grep -qx ready "$out/harness-$1.out" || die "net-harness did not start: $(cat "$out/harness-$1.out")"
        ip link set nbsw0 netns "$ns"
        ip -n "$ns" link set nbsw0 address 02:00:0a:4d:00:0a mtu "$1" up
        ip -n "$ns" addr add 10.77.0.10/24 dev nbsw0
        ip -n "$ns" route add default via 10.77.0.1
}

up_slirp4netns() { # MTU
        slirp4netns --configure --mtu="$1" --disable-host-loopback --netns-type=path "/var/run/netns/$ns" tap0 \
                >"$out/slirp4netns-$1.log" 2>&1 &
        helper=$!
        wait_for 5 sh -c "ip -n $ns -4 route | grep -q default" || die "slirp4netns did not configure tap0"
}

up_pasta() { # MTU
        # its own addresses (not a copy of the host's), so that the host's address stays the host's
        pasta -f -q --config-net -4 -m "$1" -a 10.88.0.2 -n 24 -g 10.88.0.1 --no-map-gw \
                -t none -u none -T none -U none --runas 0 --netns "/var/run/netns/$ns" \
                >"$out/pasta-$1.log" 2>&1 &
        helper=$!
        wait_for 5 sh -c "ip -n $ns -4 route | grep -q default" || die "pasta did not configure the namespace"
        # --config-net in this pasta may leave the link's MTU to DHCP: set it as the others do
        ip -n "$ns" link set "$(ip -n "$ns" -4 route show default | awk '{ print $5 }')" mtu "$1"
}

up_veth() { # MTU
        ip link add nbveth0 mtu "$1" type veth peer name nbveth1 mtu "$1" netns "$ns"
        ip addr add 10.99.0.1/24 dev nbveth0
        ip link set nbveth0 up
        ip -n "$ns" addr add 10.99.0.2/24 dev nbveth1
        ip -n "$ns" link set nbveth1 up
        ip -n "$ns" route add default via 10.99.0.1
}

iperf() { # PATH MTU DIR REP; DIR: up (namespace → host) or down (host → namespace, -R)
        local json=$out/iperf-$1-$2-$3-$4.json before after
        local r=()
        [ "$3" = down ] && r=(-R)
        before=$(cpu_ticks "${helper:-}")
        ip netns exec "$ns" timeout $((duration + 30)) iperf3 -c "$host_ip" -p "$port" -t "$duration" \
                --connect-timeout 5000 -J "${r[@]}" >"$json" 2>&1 || true
        after=$(cpu_ticks "${helper:-}")
        local cpu=-1
        [ "$before" -lt 0 ] || [ "$after" -lt 0 ] || cpu=$(((after - before) * 100 / tick))
        python3 - "$json" "$1" "$2" "$3" "$4" "$cpu" "$duration" <<'PY' >>"$out/results.tsv"
import json, sys
f, path, mtu, d, rep, cpu_ticks_pct, duration = sys.argv[1:]
try:
        j = json.load(open(f))
        gbps = j["end"]["sum_received"]["bits_per_second"] / 1e9
        retr = j["end"]["sum_sent"].get("retransmits", 0)
except Exception:
        gbps, retr = float("nan"), -1
# helper CPU as % of one core over the run, -1 without a helper
cpu = int(cpu_ticks_pct)
cpu = cpu / float(duration) if cpu >= 0 else -1
print(f"{path}\t{mtu}\t{d}\t{rep}\t{gbps:.3f}\t{cpu:.0f}\t{retr}")
PY
        say "$(tail -n 1 "$out/results.tsv")"
}

# The same GET loop through slirp4netns and veth, for scale: to a minimal responder on the host's
# address (Python, one connection at a time), since slirp4netns has no unix forwards.
responder_port=
start_responder() {
        python3 -u - "$host_ip" <<'PY' >"$out/responder.out" 2>&1 &
import socket, sys
ls = socket.create_server((sys.argv[1], 0), backlog=128)
print(ls.getsockname()[1], flush=True)
reply = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\nConnection: close\r\n\r\nharness"
while True:
        c, _ = ls.accept()
        buf = b""
        while b"\r\n\r\n" not in buf:
                d = c.recv(4096)
                if not d:
                        break
                buf += d
        c.sendall(reply)
        c.close()
PY
        responder=$!
        wait_for 5 grep -q . "$out/responder.out" || die "the host responder did not start"
        responder_port=$(head -n 1 "$out/responder.out")
}

get_loop() { # NAME MTU REP HOST PORT: sequential GETs from the namespace, a new connection each
        ip netns exec "$ns" python3 - "$imds_requests" "$@" <<'PY' >>"$out/latency.tsv"
import http.client, sys, time
n, name, mtu, rep, host, port = int(sys.argv[1]), *sys.argv[2:7]
lat, errors = [], 0
for i in range(n + 100):  # the first 100 warm up
        t = time.perf_counter()
        try:
                c = http.client.HTTPConnection(host, int(port), timeout=5)
                c.request("GET", "/giantswarm/v1/hostname")
                r = c.getresponse()
                ok = r.status == 200 and r.read() == b"harness"
                c.close()
        except (OSError, http.client.HTTPException) as e:
                print(f"GET {i}: {e}", file=sys.stderr)
                ok = False
        dt = (time.perf_counter() - t) * 1000
        if not ok:
                errors += 1  # counted, left out of the latencies
        elif i >= 100:
                lat.append(dt)
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
print(f"{name}\t{mtu}\t{rep}\t{len(lat)}\t{q(0.5):.3f}\t{q(0.9):.3f}\t{q(0.99):.3f}\t{lat[-1]:.3f}\t{errors}")
PY
        say "GET: $(tail -n 1 "$out/latency.tsv")"
}

: >"$out/results.tsv"
: >"$out/latency.tsv"
start_responder
{
        date -u +"date: %F %T UTC"
        echo "kernel: $(uname -r), $(nproc) CPUs, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "slirp4netns: $(slirp4netns --version 2>&1 | head -n 1)"
        echo "libslirp: $(slirp4netns --version 2>&1 | sed -n 's/^libslirp: //p')"
        echo "pasta: $(dpkg-query -W -f='${Version}' passt 2>/dev/null)"
        echo "iperf3: $(iperf3 --version | head -n 1)"
} >"$out/env.txt"

for rep in $(seq "$reps"); do
        for mtu in $mtus; do
                for p in $paths; do
                        ns_new
                        "up_$p" "$mtu"
                        iperf "$p" "$mtu" up "$rep"
                        iperf "$p" "$mtu" down "$rep"
                        if [ "$p" = switch ]; then
                                get_loop "IMDS through the switch" "$mtu" "$rep" 169.254.169.254 80
                                ns_del
                                say "net-harness: $(tail -n 1 "$out/harness-$mtu.out")"
                        else
                                [ "$p" = pasta ] ||
                                        get_loop "host responder through $p" "$mtu" "$rep" "$host_ip" "$responder_port"
                                ns_del
                        fi
                done
        done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/env.txt"

report
