#!/usr/bin/env bash
# Proves the README's two commands on a fresh Debian machine, 12 (bookworm) or 13 (trixie): a root
# of that release made for the purpose with mmdebstrap (variant minbase, plus git and make, which a user needs to clone the
# repository and to type `make`), entered with unshare + chroot, and a clean clone of the commit
# under test in /root/vm-manager. Inside, as root and with nothing else installed:
#   1. `make run` (on a port of 127.0.0.1 the kernel picks), until GET /healthz answers 200 and
#      GET /api/v1/images lists the guest image and offers the Kubernetes version whose sysext
#      images/build/manifest.json says holds kubelet and kubeadm; a first create_vm (attestation
#      required, as the README's quick start) verifies with nothing learned, and is deleted; then
#      SIGTERM to the daemon, and make must exit 0;
#   2. `make build-check`, make check's set-up (its packages and the ASan build), not its tests.
# A package missing from an install-deps group makes one of them fail, and the failure names it.
#
# The root shares the host's network, its image cache /var/cache/vm-manager (the guest image, its
# mkosi tools tree, mkosi itself, the sid apt view) and /var/cache/apt/archives (downloads only):
# the guest image comes from the cache, and the root's cache key must equal the host's, which
# `images/scripts/build.sh --print-key` computes on the host from a clone of the same commit. No
# service starts inside (policy-rc.d says no, as in any chroot); there is no systemd as PID 1.
#
# usage: tools/fresh-root-check.sh [WORK_DIR]       (as root; WORK_DIR default: a new /var/tmp dir)
# Environment: FRESH_ROOT_SUITE (the release: bookworm, the default, or trixie), VM_MANAGER (a built
#   daemon for the host's key; default build-asan's, then build's), FRESH_ROOT_KEEP=1 (keep the
#   root), FRESH_ROOT_MIRROR (the archive; default the host's apt source of bookworm, which serves
#   trixie too), FRESH_ROOT_COLD=1 (an empty image cache of the root's own: the whole image build).
# Exit status: 0 passed, 1 failed (the reason last), 77 cannot run here (the reason printed).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
IMAGE_CACHE=/var/cache/vm-manager
APT_ARCHIVES=/var/cache/apt/archives
IMAGE_NAME=giantswarm-vm-base
t0=$(date +%s)

say() { echo "fresh-root: [$(($(date +%s) - t0)) s] $*"; }
skip() {
        echo "fresh-root: SKIP: $*"
        exit 77
}
fail() {
        echo "fresh-root: FAIL: $*"
        exit 1
}

# ---- inside: the steps in the root, run by `chroot ROOT bash /root/fresh-root-steps.sh` ----
if [ "${1:-}" = --steps ]; then
        port=$2 host_key=$3 cached=$4
        cd /root/vm-manager || exit 1
        say() { echo "fresh-root: [in the root] $*"; }
        bad() {
                echo "fresh-root: FAIL: $*"
                exit 1
        }
        # what a failed step's log says is missing: the scripts' own "missing X (package Y)" lines,
        # the shell's "command not found", apt's "Unable to locate package"
        why() { # why LOG
                echo "---- the last 40 lines of $1:"
                tail -n 40 "$1"
                echo "----"
                grep -E "missing .*\(package |command not found|Unable to locate package" "$1" |
                        sort -u | head -n 10 | sed 's/^/fresh-root: cause: /'
        }
        http_get() { # http_get PATH: prints the status line's code, then the body, from 127.0.0.1:$port
                local line code= body=0
                exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
                printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&3
                while IFS= read -r -t 10 line <&3 || [ -n "$line" ]; do
                        line=${line%$'\r'}
                        if [ -z "$code" ]; then
                                code=${line#HTTP/1.? }
                                code=${code%% *}
                                echo "$code"
                        elif [ $body = 0 ] && [ -z "$line" ]; then
                                body=1
                        elif [ $body = 1 ]; then
                                echo "$line"
                        fi
                done
                exec 3<&-
        }

        # 1. make run, as the README says, in the background until it serves
        t=$(date +%s)
        # Port 0: the kernel picks a free one as the daemon binds (one picked here could be taken by
        # the time make run gets there, minutes later), and the daemon's log names it.
        setsid make run ARGS="--listen 127.0.0.1:0" </dev/null >/root/make-run.log 2>&1 &
        mk=$!
        served=
        while kill -0 "$mk" 2>/dev/null; do
                port=$(sed -n 's|.* serving on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' /root/make-run.log | tail -n 1)
                if [ -n "$port" ] && [ "$(http_get /healthz 2>/dev/null | head -n 1)" = 200 ]; then
                        served=1
                        break
                fi
                [ $(($(date +%s) - t)) -lt 2700 ] || break
                sleep 2
        done
        if [ -z "$served" ]; then
                if kill -0 "$mk" 2>/dev/null; then
                        kill -TERM -- "-$mk" 2>/dev/null
                        why /root/make-run.log
                        bad "make run did not serve /healthz within 45 minutes"
                fi
                wait "$mk"
                rc=$?
                why /root/make-run.log
                bad "make run exited with status $rc before serving"
        fi
        t_run=$(($(date +%s) - t))
        say "make run serves on 127.0.0.1:$port after $t_run s"
        say "QEMU in the root: qemu-system-x86 $(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || echo missing)"
        key=$(sed -n 's/^image: cache key \([0-9a-f]*\)$/\1/p' /root/make-run.log | tail -n 1)
        if grep -q "^image: cache hit" /root/make-run.log; then
                image="cache hit, key $key"
        else
                image="built in the root (cache miss), key $key"
        fi
        say "guest image: $image"
        images=$(http_get /api/v1/images)
        # A first VM as the README's quick start makes it: attestation required (the default), nothing
        # learned and no golden values anywhere. Its initrd quote must verify against the daemon's
        # firmware run and the image's policy, and its user-data be released; then it is deleted.
        t=$(date +%s)
        first=$(python3 - "$port" <<'PY' 2>&1
import json, sys, urllib.request
base = "http://127.0.0.1:%s/api/v1" % sys.argv[1]
def call(method, path, body=None, timeout=900):
    req = urllib.request.Request(base + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
            return r.status, json.loads(data) if data else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
st, vm = call("POST", "/vms", {"name": "first", "wait_for": "attested"})
if st != 201:
    print("create_vm answered %d: %s" % (st, json.dumps(vm)[:600]))
    sys.exit(1)
st, att = call("GET", "/vms/%s/attestation" % vm["id"])
ini = att.get("initrd") or {}
ok = ini.get("verified") is True and not ini.get("learned") and att.get("userDataReleased")
print(("verified: " if ok else "not verified: ") + (ini.get("message") or json.dumps(att)[:600]))
call("DELETE", "/vms/" + vm["id"])
sys.exit(0 if ok else 1)
PY
)
        rc=$?
        t_vm=$(($(date +%s) - t))
        if [ "$rc" != 0 ]; then
                why /root/make-run.log
                kill -TERM -- "-$mk" 2>/dev/null
                bad "the first attested VM of make run's daemon: $first"
        fi
        say "a first VM (require_attestation, nothing learned) verified in $t_vm s: $first"
        # the daemon: make's child (make execs the recipe's command, or a shell that execs it)
        daemon=
        for s in /proc/[0-9]*/stat; do
                read -r pid comm _ ppid _ <"$s" 2>/dev/null || continue
                if [ "$ppid" = "$mk" ] && [ "$comm" = "(vm-manager)" ]; then
                        daemon=$pid
                fi
        done
        [ -n "$daemon" ] || { why /root/make-run.log; bad "no vm-manager process under make run"; }
        kill -TERM "$daemon"
        for _ in $(seq 600); do
                kill -0 "$mk" 2>/dev/null || break
                sleep 0.1
        done
        if kill -0 "$mk" 2>/dev/null; then
                kill -KILL -- "-$mk" 2>/dev/null
                bad "make run did not exit within 60 s of SIGTERM to the daemon"
        fi
        wait "$mk"
        rc=$?
        case "$(head -n 1 <<<"$images")" in
        200) ;;
        *) bad "GET /api/v1/images: $(head -c 300 <<<"$images")" ;;
        esac
        grep -Eq "\"id\": ?\"$IMAGE_NAME\"" <<<"$images" ||
                bad "GET /api/v1/images does not list $IMAGE_NAME: $(tail -n +2 <<<"$images" | head -c 300)"
        say "GET /api/v1/images lists $IMAGE_NAME"
        # The Kubernetes extension can run a node: kubelet and kubeadm in it, and the daemon offers it.
        node=$(python3 -c '
import json, sys
k = json.load(open(sys.argv[1])).get("kubernetes", {})
bins = k.get("binaries", [])
print(k.get("version", ""), "node" if k.get("node") and "kubelet" in bins and "kubeadm" in bins else "no-node")
' images/build/manifest.json 2>&1) || bad "images/build/manifest.json: $node"
        case "$node" in
        *" node") ;;
        *) bad "the Kubernetes sysext of make run's image cannot run a node (kubelet, kubeadm): $node" ;;
        esac
        grep -Eq "\"kubernetesVersions\": ?\[ *\"${node%% *}\"" <<<"$(tr -d '\n' <<<"$images")" ||
                bad "GET /api/v1/images does not offer Kubernetes ${node%% *}: $(tail -n +2 <<<"$images" | head -c 600)"
        say "the Kubernetes sysext ${node%% *} lists kubelet and kubeadm, and GET /api/v1/images offers it"
        [ "$rc" = 0 ] || { why /root/make-run.log; bad "make run exited with status $rc after SIGTERM (want 0)"; }
        say "SIGTERM: the daemon and make run exited 0"
        if [ -n "$host_key" ]; then
                [ "$key" = "$host_key" ] ||
                        bad "the root's image cache key is '$key', the host's $host_key: the root would not reuse the host's cache"
                if [ "$cached" = 1 ] && ! grep -q "^image: cache hit" /root/make-run.log; then
                        bad "the host's cache holds image-$host_key, but the root's make run did not take it"
                fi
        fi

        # 2. make check's set-up
        t=$(date +%s)
        make build-check </dev/null >/root/make-build-check.log 2>&1
        rc=$?
        t_check=$(($(date +%s) - t))
        [ "$rc" = 0 ] || { why /root/make-build-check.log; bad "make build-check exited with status $rc"; }
        say "make build-check passed in $t_check s"
        echo "fresh-root: times: make run to serving $t_run s ($image), the first attested VM $t_vm s, make build-check $t_check s"
        exit 0
fi

# ---- inside the namespaces: make the root, mount, run the steps ----
if [ "${1:-}" = --inside ]; then
        work=$2 port=$3 host_key=$4 cached=$5
        root=$work/root
        # everything mounted from here on belongs to this mount namespace and ends with it
        mount --make-rprivate / || fail "cannot make the mount namespace private"
        mkdir -p "$root"
        apt_hooks=()
        if [ -d "$APT_ARCHIVES" ]; then
                apt_hooks=(--skip=essential/unlink
                        --setup-hook="mkdir -p \"\$1$APT_ARCHIVES\" && mount --bind $APT_ARCHIVES \"\$1$APT_ARCHIVES\""
                        --customize-hook="umount \"\$1$APT_ARCHIVES\"")
        fi
        say "mmdebstrap: $suite, variant minbase, with git and make, into $root"
        t=$(date +%s)
        if ! mmdebstrap --mode=root --variant=minbase --include=git,make "${apt_hooks[@]}" \
                "$suite" "$root" "$work/sources.list" >"$work/mmdebstrap.log" 2>&1; then
                tail -n 30 "$work/mmdebstrap.log"
                fail "mmdebstrap could not make the root (log: $work/mmdebstrap.log)"
        fi
        say "mmdebstrap done in $(($(date +%s) - t)) s"
        t_debootstrap=$(($(date +%s) - t))

        # a clean clone of the commit under test
        git -c advice.detachedHead=false clone -q "$repo" "$root/root/vm-manager" &&
                git -C "$root/root/vm-manager" checkout -q --detach "$(git -C "$repo" rev-parse HEAD)" ||
                fail "cannot clone $repo into the root"
        # services never start in a chroot
        printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
        chmod 755 "$root/usr/sbin/policy-rc.d"
        cp -L /etc/resolv.conf "$root/etc/resolv.conf"
        cp "${BASH_SOURCE[0]}" "$root/root/fresh-root-steps.sh"

        # the root a mount point, as / is on any machine (mkosi's sandbox remounts / and fails
        # with EINVAL on a plain directory), then what a booted system has mounted
        mount --bind "$root" "$root" &&
                mount -t proc proc "$root/proc" &&
                mount --rbind /sys "$root/sys" &&
                mount --rbind /dev "$root/dev" &&
                mount -t tmpfs -o mode=755 tmpfs "$root/run" ||
                fail "cannot mount /proc, /sys, /dev and /run in the root"
        if [ "${FRESH_ROOT_COLD:-0}" != 1 ]; then
                mkdir -p "$IMAGE_CACHE" "$root$IMAGE_CACHE"
                mount --bind "$IMAGE_CACHE" "$root$IMAGE_CACHE" || fail "cannot bind $IMAGE_CACHE into the root"
        fi
        if [ -d "$APT_ARCHIVES" ]; then
                mount --bind "$APT_ARCHIVES" "$root$APT_ARCHIVES" || fail "cannot bind $APT_ARCHIVES into the root"
        fi

        chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
                PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
                bash /root/fresh-root-steps.sh --steps "$port" "$host_key" "$cached"
        rc=$?
        cp "$root/root/make-run.log" "$root/root/make-build-check.log" "$work/" 2>/dev/null
        echo "fresh-root: mmdebstrap $t_debootstrap s"
        exit $rc
fi

# ---- outside: can this run here, the host's key, then the namespaces ----
[ "$(id -u)" -eq 0 ] || skip "needs root (mmdebstrap, chroot, mounts)"
for c in unshare chroot mount; do
        command -v "$c" >/dev/null 2>&1 || skip "$c is missing (package util-linux / coreutils)"
done
unshare --mount --pid --fork --kill-child true 2>/dev/null || skip "cannot make mount and PID namespaces (unshare)"
. "$here/need.sh"
need_cmds fresh-root "build check" mmdebstrap git curl python3

suite=${FRESH_ROOT_SUITE:-bookworm}
case "$suite" in
bookworm | trixie) ;;
*) fail "FRESH_ROOT_SUITE=$suite: the supported releases are bookworm and trixie" ;;
esac
export suite

# The archive: the host's own apt sources of bookworm (a fresh machine would have these three), the
# same mirrors with the release's name in place of bookworm's for trixie: a fresh Debian 13 machine
# has trixie, trixie-updates and trixie-security from the mirror it was installed from.
if [ -n "${FRESH_ROOT_MIRROR:-}" ]; then
        mirrors="deb ${FRESH_ROOT_MIRROR} $suite main"
        archive=$FRESH_ROOT_MIRROR
else
        mirrors=$(apt-get indextargets --format '$(SITE) $(RELEASE) $(COMPONENT)' 'Created-By: Packages' 2>/dev/null |
                awk -v suite="$suite" '$2 ~ /^bookworm(-updates|-security)?$/ && $3 == "main" {
                        sub(/^bookworm/, suite, $2); print "deb " $1 " " $2 " main" }' | sort -u)
        archive=$(awk -v suite="$suite" '$3 == suite { print $2; exit }' <<<"$mirrors")
        [ -n "$archive" ] || skip "the host's apt has no bookworm source to make the root from (FRESH_ROOT_MIRROR=URL)"
fi
curl -fsS -m 30 -o /dev/null "$archive/dists/$suite/InRelease" 2>/dev/null ||
        skip "the archive $archive cannot be reached"

work=${1:-}
if [ -z "$work" ]; then
        work=$(mktemp -d /var/tmp/fresh-root.XXXXXX)
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
# a root of an earlier run (mounts of a namespace are never seen here, so this removes files only)
rm -rf "$work/root" "$work/host-clone"
echo "$mirrors" >"$work/sources.list"
cleanup() {
        [ "${FRESH_ROOT_KEEP:-0}" = 1 ] || rm -rf "$work/root" "$work/host-clone"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

say "$suite: commit $(git -C "$repo" rev-parse --short=12 HEAD), work directory $work"
host_key=
cached=0
if [ "${FRESH_ROOT_COLD:-0}" != 1 ]; then
        vm_manager=${VM_MANAGER:-}
        for b in build-asan build; do
                [ -n "$vm_manager" ] || [ ! -x "$repo/$b/src/daemon/vm-manager" ] || vm_manager=$repo/$b/src/daemon/vm-manager
        done
        [ -x "$vm_manager" ] || fail "no built vm-manager to compute the host's image key with (VM_MANAGER=)"
        git -c advice.detachedHead=false clone -q "$repo" "$work/host-clone" &&
                git -C "$work/host-clone" checkout -q --detach "$(git -C "$repo" rev-parse HEAD)" ||
                fail "cannot clone $repo"
        host_key=$(VM_MANAGER=$vm_manager "$work/host-clone/images/scripts/build.sh" --print-key 2>"$work/host-key.log") ||
                { tail -n 20 "$work/host-key.log"; fail "the host cannot compute the image's cache key"; }
        if [ -f "$IMAGE_CACHE/images/image-$host_key/manifest.json" ]; then
                cached=1
                say "host's image cache key $host_key: in the cache"
        else
                say "host's image cache key $host_key: not in the cache, the root builds the image (minutes)"
        fi
fi
port=0 # make run listens on a port the kernel picks; the steps read it from the daemon's log

unshare --mount --pid --fork --kill-child -- "${BASH_SOURCE[0]}" --inside "$work" "$port" "$host_key" "$cached"
rc=$?
say "done, status $rc (logs: $work/mmdebstrap.log, make-run.log, make-build-check.log)"
exit $rc
