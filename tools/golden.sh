#!/usr/bin/env bash
# Records the golden PCR values of the newest image in an image directory, once per image and host
# firmware, so that VMs that must attest can verify: a daemon of its own in learn mode (a state
# directory of its own and a free port, so a `make run` daemon may keep running) boots one VM with
# require_attestation and waits for ready, `vm-manager image golden --from-vm` writes the values
# that VM's verified ready-stage quote carried into the image's policy.json, and the VM, the daemon
# and their state go. A daemon serving the same directory sees the new policy at once (inotify).
#
# usage: tools/golden.sh VM_MANAGER IMAGE_DIR        (make golden)
#        GOLDEN_KEEP=1 keeps the state directory of a failed run, GOLDEN_TIMEOUT (seconds) bounds the wait.
set -euo pipefail

bin=${1:?usage: $0 VM_MANAGER IMAGE_DIR}
images=${2:?usage: $0 VM_MANAGER IMAGE_DIR}
timeout=${GOLDEN_TIMEOUT:-1800}
say() { printf 'golden: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

for tool in curl python3; do
        command -v "$tool" >/dev/null || die "needs $tool (apt-get install $tool)"
done
[ -x "$bin" ] || die "no vm-manager binary at $bin (make build)"
[ -d "$images" ] || die "no image directory $images (make image)"

state=$(mktemp -d /var/tmp/vm-manager-golden.XXXXXX)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port
pid=
cleanup() {
        local rc=$?
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
                kill -TERM "$pid" 2>/dev/null || true
                wait "$pid" 2>/dev/null || true
        fi
        if [ "$rc" -ne 0 ] && [ -n "${GOLDEN_KEEP:-}" ]; then
                say "kept $state (daemon log: $state/daemon.log)"
        else
                [ "$rc" -eq 0 ] || { say "the daemon's last words:"; tail -n 20 "$state/daemon.log" >&2 || true; }
                rm -rf "$state"
        fi
}
trap cleanup EXIT

say "learning daemon on $base, state in $state"
"$bin" serve --listen "127.0.0.1:$port" --state-dir "$state" --image-dir "$images" \
        --attestation verify --attestation-learn-golden --launcher process \
        --network-subnet 192.168.251.0/24 >"$state/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
        curl -fsS "$base/readyz" >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || die "the daemon exited at start"
        sleep 0.2
done
curl -fsS "$base/readyz" >/dev/null || die "the daemon did not become ready"

image=$(curl -fsS "$base/api/v1/images" | python3 -c 'import json, sys; l = json.load(sys.stdin); print(l[0]["id"] + "_" + l[0]["version"] if l else "")')
[ -n "$image" ] || die "no image in $images"

say "creating a VM of $image that must attest and waiting for ready (minutes under TCG)"
t0=$(date +%s)
answer=$(curl -sS --max-time "$timeout" -H 'Content-Type: application/json' -X POST "$base/api/v1/vms" \
        -d "{\"name\":\"golden\",\"image\":\"$image\",\"memory_mib\":2048,\"disk_gib\":4,\"require_attestation\":true,\"wait_for\":\"ready\"}") ||
        die "create_vm did not answer within ${timeout}s"
vm=$(printf '%s' "$answer" | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("id", "") if d.get("state") == "ready" else "")')
if [ -z "$vm" ]; then
        say "the VM did not become ready: $answer"
        # what the daemon knows of it: the root cause, the console's last lines, the attestation verdicts
        curl -fsS "$base/api/v1/vms" | python3 -c '
import json, sys
for v in json.load(sys.stdin):
    print("golden: lastError:", v.get("lastError"), file=sys.stderr)
    print("golden: console tail:", v.get("consoleTail") or "(none)", sep="\n", file=sys.stderr)
    print(v["id"])' | while read -r id; do
                say "attestation: $(curl -fsS "$base/api/v1/vms/$id/attestation" || echo '(none)')"
        done || true
        die "the VM did not become ready (GOLDEN_KEEP=1 keeps $state for a closer look)"
fi
say "VM $vm ready after $(( $(date +%s) - t0 )) s"

"$bin" image golden "$image" --from-vm "$vm" --server "$base" --image-dir "$images"
curl -fsS -X DELETE "$base/api/v1/vms/$vm" >/dev/null || say "deleting VM $vm failed, ignoring (its state goes with $state)"
say "done: $images/policy.json holds the golden values of $image on this host's firmware"
