#!/usr/bin/env bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# The switch against a real kernel stack: net-harness puts one port on a tap device, the tap goes
# into a network namespace, and the namespace is the guest. busybox's udhcpc takes the lease while
# dumpcap records the DHCP exchange on the tap, and the replies are checked, decoded by tshark, as
# they were on the wire (not as the client understood them). Then curl fetches the IMDS through the
# rewrite, and a TCP connection goes out through slirp's NAT to a listener on the host's own
# address. A second run at MTU 9000 checks that option 26 follows the configuration and that frames
# of that size cross the switch in both directions.
#
# Needs root, /dev/net/tun, "ip netns", tshark and dumpcap, busybox (udhcpc), curl and python3;
# otherwise the whole test is skipped. NET_HARNESS names the net-harness binary.
set -uo pipefail

harness=${NET_HARNESS:-}
skip() {
        echo "1..0 # SKIP $*"
        exit 0
}
[ "$(id -u)" -eq 0 ] || skip "not root"
[ -c /dev/net/tun ] || skip "no /dev/net/tun"
{ [ -n "$harness" ] && [ -x "$harness" ]; } || skip "NET_HARNESS does not name the net-harness binary"
. "$(dirname "${BASH_SOURCE[0]}")/../../tools/need.sh"
missing=$(missing_cmds ip tshark dumpcap busybox curl python3) || skip "missing $missing (tools/install-deps.sh check)"
busybox udhcpc --help >/dev/null 2>&1 || skip "this busybox has no udhcpc"

ns=nw$$
tap=nwtap$$
mac=02:00:0a:4d:00:0a
lease=10.77.0.10
gateway=10.77.0.1
work=$(mktemp -d /tmp/test-net-wire.XXXXXX)
pids=()

stop() { # stop PID: SIGTERM, and SIGKILL after 5 s
        kill -TERM "$1" 2>/dev/null || return 0
        for _ in $(seq 100); do
                kill -0 "$1" 2>/dev/null || break
                sleep 0.05
        done
        kill -KILL "$1" 2>/dev/null
        wait "$1" 2>/dev/null
}
cleanup() {
        local p
        for p in "${pids[@]}"; do
                stop "$p"
        done
        ip netns del "$ns" 2>/dev/null
        rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$ns" 2>/dev/null || skip "cannot create a network namespace"
nsx() { ip netns exec "$ns" "$@"; }
nsx ip link set lo up
# no IPv6 chatter: the switch filters it, and the counters stay readable
nsx sh -c "echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6 && echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6"

echo "1..20"
n=0
check() { # check DESCRIPTION COMMAND...
        local desc=$1
        shift
        n=$((n + 1))
        if "$@"; then
                echo "ok $n - $desc"
        else
                echo "not ok $n - $desc"
        fi
}
skip_check() { # skip_check DESCRIPTION REASON
        n=$((n + 1))
        echo "ok $n - $1 # SKIP $2"
}
eq() { # eq WHAT GOT WANT
        [ "$2" = "$3" ] && return 0
        echo "# $1: got '$2', want '$3'"
        return 1
}

# The host's own non-loopback address: slirp's NAT connects to it from the host, and unlike host
# loopback (refused by design) it is reachable from the guest.
host_ip=$(ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
[ -n "$host_ip" ] || host_ip=$(ip -4 -o addr show scope global | awk '{ sub("/.*", "", $4); print $4; exit }')

web_port=
if [ -n "$host_ip" ]; then
        mkdir -p "$work/www"
        echo "from the host" >"$work/www/hello.txt"
        head -c 1048576 /dev/urandom >"$work/www/blob"
        python3 -u -m http.server 0 --bind "$host_ip" --directory "$work/www" >"$work/web.log" 2>&1 &
        pids+=($!)
        for _ in $(seq 100); do
                web_port=$(sed -n 's/.* port \([0-9]*\) .*/\1/p' "$work/web.log")
                [ -n "$web_port" ] && break
                sleep 0.05
        done
fi

harness_pid=
start_harness() { # start_harness ARGS...; starts net-harness on the tap and moves the tap in
        : >"$work/harness.out"
        "$harness" --tap "$tap" --mac "$mac" --ip "$lease" --cidr 10.77.0.0/24 "$@" \
                >"$work/harness.out" 2>"$work/harness.err" &
        harness_pid=$!
        pids+=("$harness_pid")
        for _ in $(seq 200); do
                grep -qx ready "$work/harness.out" && break
                kill -0 "$harness_pid" 2>/dev/null || break
                sleep 0.02
        done
        grep -qx ready "$work/harness.out" || { sed 's/^/# /' "$work/harness.err"; return 1; }
        ip link set "$tap" netns "$ns" &&
                nsx ip link set "$tap" address "$mac" &&
                nsx ip link set "$tap" up
}

stop_harness() { # its counters stay in harness.out
        stop "$harness_pid"
}

capture_pid=
capture_count=
capture_start() { # capture_start FILE FILTER [COUNT]: dumpcap on the tap, in the namespace
        # dumpcap itself, not tshark: tshark hands the capture to a dumpcap child, which is still
        # writing the file when a SIGTERM has ended tshark. With COUNT the capture stops by itself
        # after that many frames.
        capture_count=${3:-}
        : >"$work/dumpcap.err"
        nsx dumpcap -q -i "$tap" -f "$2" ${capture_count:+-c "$capture_count"} -w "$1" 2>"$work/dumpcap.err" &
        capture_pid=$!
        pids+=("$capture_pid")
        # dumpcap names the file once the interface is open with its filter and the file created
        for _ in $(seq 300); do
                grep -q "^File: " "$work/dumpcap.err" && return 0
                kill -0 "$capture_pid" 2>/dev/null || break
                sleep 0.05
        done
        sed 's/^/# dumpcap: /' "$work/dumpcap.err"
        return 1
}

capture_stop() { # returns once dumpcap has exited, so the file is complete
        if [ -n "$capture_count" ]; then
                # the capture ends by itself with its last frame; SIGTERM only if it never comes
                for _ in $(seq 200); do
                        kill -0 "$capture_pid" 2>/dev/null || break
                        sleep 0.05
                done
        else
                sleep 0.3 # the last frames reach dumpcap
        fi
        stop "$capture_pid"
        wait "$capture_pid" 2>/dev/null
        capture_pid=
}

# udhcpc's script: the lease as the client saw it, and the link configured from it.
cat >"$work/udhcpc.script" <<'EOF'
#!/bin/sh
case "$1" in
bound | renew)
        env | grep -E '^(ip|mask|subnet|router|dns|mtu|search|domain|lease)=' | sort >"$LEASE_FILE"
        ip addr add "$ip/$mask" dev "$interface"
        [ -n "$mtu" ] && ip link set "$interface" mtu "$mtu"
        ip route add default via "$router" dev "$interface"
        ;;
esac
exit 0
EOF
chmod +x "$work/udhcpc.script"

dhcp() { # takes a lease in the namespace while the DHCP exchange is captured to FILE
        # the exchange is four frames: DISCOVER, OFFER, REQUEST, ACK
        capture_start "$1" "udp port 67 or udp port 68" 4 || return 1
        LEASE_FILE=$work/lease.env nsx busybox udhcpc -i "$tap" -f -n -q -t 5 -T 1 -O mtu -O search \
                -s "$work/udhcpc.script" >"$work/udhcpc.log" 2>&1
        local r=$?
        capture_stop
        [ $r -eq 0 ] || sed 's/^/# udhcpc: /' "$work/udhcpc.log"
        return $r
}

# The DHCPACK of a capture, decoded by tshark once: ACK[field] for each field below. The message
# types of the whole exchange, in order, go to ACK[types].
declare -A ACK
ack_fields=(ip.src dhcp.ip.your dhcp.option.dhcp_server_id dhcp.option.subnet_mask dhcp.option.router
        dhcp.option.domain_name_server dhcp.option.interface_mtu dhcp.option.ip_address_lease_time
        dhcp.option.renewal_time_value dhcp.option.rebinding_time_value
        dhcp.option.dhcp_dns_domain_search_list_fqdn dhcp.option.domain_name dhcp.option.type)
read_ack() { # read_ack FILE
        local args=() line i
        ACK=()
        for i in "${ack_fields[@]}"; do
                args+=(-e "$i")
        done
        line=$(tshark -r "$1" -Y "dhcp.option.dhcp == 5" -T fields -E separator='|' "${args[@]}" 2>/dev/null |
                head -n 1)
        IFS='|' read -r -a values <<<"$line"
        for i in "${!ack_fields[@]}"; do
                ACK[${ack_fields[$i]}]=${values[$i]:-}
        done
        ACK[types]=$(tshark -r "$1" -T fields -e dhcp.option.dhcp 2>/dev/null | paste -sd, -)
        if [ -z "$line" ]; then
                echo "# no DHCPACK in $1; what was captured:"
                tshark -r "$1" 2>&1 | sed 's/^/#   /'
        fi
}

# ---- run 1: MTU 1500 (the default), a search domain, the IMDS ----

check "net-harness starts and its tap moves into the namespace" \
        start_harness --imds --search-domain example.test
check "udhcpc takes the lease $lease" dhcp "$work/dhcp-1500.pcapng"
read_ack "$work/dhcp-1500.pcapng"

check "on the wire: DISCOVER, OFFER, REQUEST, ACK" eq "message types" "${ACK[types]}" "1,2,3,5"
check "ACK: yiaddr is the lease" eq yiaddr "${ACK[dhcp.ip.your]}" "$lease"
check "ACK: from the gateway (IP source and option 54)" eq "source, server id" \
        "${ACK[ip.src]},${ACK[dhcp.option.dhcp_server_id]}" "$gateway,$gateway"
check "ACK: option 1 subnet mask 255.255.255.0" eq mask "${ACK[dhcp.option.subnet_mask]}" 255.255.255.0
check "ACK: option 3 router is the gateway" eq router "${ACK[dhcp.option.router]}" "$gateway"
check "ACK: option 6 DNS server is the gateway" eq dns "${ACK[dhcp.option.domain_name_server]}" "$gateway"
check "ACK: option 26 interface MTU 1500" eq mtu "${ACK[dhcp.option.interface_mtu]}" 1500
check "ACK: option 51 lease time 3600 s (58: 1800, 59: 3150)" eq "lease times" \
        "${ACK[dhcp.option.ip_address_lease_time]},${ACK[dhcp.option.renewal_time_value]},${ACK[dhcp.option.rebinding_time_value]}" \
        3600,1800,3150
check "ACK: option 119 search list and option 15 domain name 'example.test'" eq "119, 15" \
        "${ACK[dhcp.option.dhcp_dns_domain_search_list_fqdn]},${ACK[dhcp.option.domain_name]}" \
        example.test,example.test
check "the client configured the lease it was acked" eq "client's view" \
        "$(paste -sd' ' - <"$work/lease.env" 2>/dev/null)" \
        "dns=$gateway domain=example.test ip=$lease lease=3600 mask=24 mtu=1500 router=$gateway search=example.test subnet=255.255.255.0"

body=$(nsx curl -sS --noproxy '*' -m 5 http://169.254.169.254/giantswarm/v1/hostname 2>&1)
check "IMDS: GET http://169.254.169.254/… answers 'harness' through the switch" eq body "$body" harness

if [ -n "$web_port" ]; then
        body=$(nsx curl -sS --noproxy '*' -m 5 "http://$host_ip:$web_port/hello.txt" 2>&1)
        check "NAT: TCP to the host's $host_ip:$web_port through slirp" eq body "$body" "from the host"
else
        skip_check "NAT: TCP to the host through slirp" "no non-loopback host address"
fi

stop_harness
check "net-harness stops on SIGTERM and reports the port's counters" \
        grep -qE '^rx_frames=[1-9][0-9]* .*imds_requests=1$' "$work/harness.out"
sed 's/^/# /' "$work/harness.out"

# ---- run 2: MTU 9000, no search domain ----
# The tap went away with the harness; a new one comes in with the new harness.
check "net-harness restarts with --mtu 9000" start_harness --mtu 9000
check "udhcpc takes the lease again" dhcp "$work/dhcp-9000.pcapng"
read_ack "$work/dhcp-9000.pcapng"
check "ACK: option 26 interface MTU 9000" eq mtu "${ACK[dhcp.option.interface_mtu]}" 9000
check "ACK: no option 119 (nor 15) without a search domain" eq "options 119 and 15" \
        "$(tr , '\n' <<<"${ACK[dhcp.option.type]}" | grep -cxE '119|15')" 0

if [ -n "$web_port" ]; then
        # The host's end of an upload: one connection, read to the end, answer with the SHA-256.
        sink() {
                python3 -u - "$host_ip" <<'PY'
import hashlib, socket, sys
ls = socket.create_server((sys.argv[1], 0))
print(ls.getsockname()[1], flush=True)
c, _ = ls.accept()
h = hashlib.sha256()
while True:
        b = c.recv(1 << 16)
        if not b:
                break
        h.update(b)
c.sendall(h.hexdigest().encode())
c.close()
PY
        }
        big_frames() { # 1 MiB down, 1 MiB up, then the largest frame on the tap each way
                local sum max_in max_out sink_port
                sink >"$work/sink.out" 2>"$work/sink.err" &
                pids+=($!)
                for _ in $(seq 100); do
                        sink_port=$(head -n 1 "$work/sink.out")
                        [ -n "$sink_port" ] && break
                        sleep 0.05
                done
                capture_start "$work/tcp-9000.pcapng" "tcp port $web_port or tcp port $sink_port" || return 1
                sum=$(nsx curl -sS --noproxy '*' -m 20 "http://$host_ip:$web_port/blob" | sha256sum | cut -d' ' -f1)
                eq "downloaded blob" "$sum" "$(sha256sum "$work/www/blob" | cut -d' ' -f1)" || return 1
                sum=$(nsx python3 - "$host_ip" "$sink_port" "$work/www/blob" <<'PY'
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
s.sendall(open(sys.argv[3], "rb").read())
s.shutdown(socket.SHUT_WR)
print(s.makefile().read())
PY
                )
                capture_stop
                eq "uploaded blob" "$sum" "$(sha256sum "$work/www/blob" | cut -d' ' -f1)" || return 1
                max_in=$(tshark -r "$work/tcp-9000.pcapng" -Y "ip.dst == $lease" -T fields -e frame.len 2>/dev/null |
                        sort -n | tail -n 1)
                max_out=$(tshark -r "$work/tcp-9000.pcapng" -Y "ip.src == $lease" -T fields -e frame.len 2>/dev/null |
                        sort -n | tail -n 1)
                echo "# largest frames on the tap: $max_in bytes to the guest, $max_out from it"
                [ "${max_in:-0}" -gt 1514 ] && [ "${max_out:-0}" -gt 1514 ]
        }
        check "MTU 9000: 1 MiB each way through slirp intact, in frames above 1514 bytes both ways" big_frames
else
        skip_check "MTU 9000: 1 MiB each way through slirp" "no non-loopback host address"
fi
stop_harness
sed 's/^/# /' "$work/harness.out"
