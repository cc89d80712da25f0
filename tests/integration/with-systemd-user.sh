#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Runs COMMAND... with a private `systemd --user` started for it alone (reference route 1 of
# systemd-manager-probe.md): the manager gets its own cgroup directories and a private mount
# namespace with a tmpfs on /run/systemd, so that its sd_booted() check passes without making the
# host look booted with systemd. COMMAND finds it through $XDG_RUNTIME_DIR/systemd/private.
# Prints "1..0 # SKIP reason" and exits 0 only when the manager cannot be started here; otherwise
# exits with COMMAND's status. The manager and its units are stopped afterwards. With
# WITH_SYSTEMD_USER_OPTIONAL=1, COMMAND runs without a manager (and without XDG_RUNTIME_DIR) instead
# of being skipped: for a suite of which only some tests need one.

set -u
. "$(dirname "$0")/../cgroup-util.sh"

skip() {
        if [ -n "${WITH_SYSTEMD_USER_OPTIONAL:-}" ]; then
                echo "# no service manager: $*" >&2
                [ -n "${cleanup_set:-}" ] && cleanup
                unset XDG_RUNTIME_DIR
                trap - EXIT
                exec "${command[@]}"
        fi
        echo "1..0 # SKIP $*"
        exit 0
}

[ $# -ge 1 ] || {
        echo "usage: $0 COMMAND..." >&2
        exit 2
}
command=("$@")

systemd=/usr/lib/systemd/systemd
[ -x "$systemd" ] || skip "no $systemd (package systemd)"
command -v unshare >/dev/null 2>&1 || skip "unshare is not on PATH (package util-linux)"
command -v setsid >/dev/null 2>&1 || skip "setsid is not on PATH (package util-linux)"
[ "$(id -u)" = 0 ] || skip "needs root for a private mount namespace and cgroup directories"
for h in unified systemd; do
        [ -d /sys/fs/cgroup/$h ] && [ -w /sys/fs/cgroup/$h ] || skip "/sys/fs/cgroup/$h is not a writable cgroup hierarchy"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/systemd-user.XXXXXX") || exit 1
cg="systemd-user-$$"
manager_pid=

cleanup() {
        if [ -n "$manager_pid" ]; then
                # SIGTERM makes the manager stop its units; SIGKILL of what is left after 5 s.
                kill -TERM "$manager_pid" 2>/dev/null
                i=0
                while kill -0 "$manager_pid" 2>/dev/null && [ $i -lt 50 ]; do
                        sleep 0.1
                        i=$((i + 1))
                done
                kill -KILL "$manager_pid" 2>/dev/null
        fi
        cgroup_remove "$cg"
        [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
cleanup_set=1

for h in unified systemd; do
        mkdir "/sys/fs/cgroup/$h/$cg" || skip "cannot create /sys/fs/cgroup/$h/$cg"
done

mkdir -m 700 "$work/rt"
export XDG_RUNTIME_DIR="$work/rt"

# The inner shell moves itself into the new cgroups before it becomes the manager, so the manager
# never takes over the root cgroup and this script stays where it was.
setsid unshare --mount --propagation private sh -c '
        for h in unified systemd; do echo $$ > /sys/fs/cgroup/$h/'"$cg"'/cgroup.procs || exit 1; done
        mount -t tmpfs -o mode=755 systemd-user /run/systemd || exit 1
        mkdir /run/systemd/system || exit 1
        exec '"$systemd"' --user' </dev/null >"$work/manager.log" 2>&1 &
manager_pid=$!

# Ready when the private socket exists and, where the user bus is socket-activated (dbus-user-session),
# Manager.SystemState has left "initializing"/"starting"; at most 10 s. (busctl --address= cannot
# be used on the private socket: busctl sends Hello, which a direct connection refuses.)
ready=
i=0
while [ $i -lt 100 ]; do
        if ! kill -0 "$manager_pid" 2>/dev/null; then
                manager_pid=
                skip "systemd --user exited at start: $(tr '\n' ' ' <"$work/manager.log" | cut -c1-200)"
        fi
        if [ -S "$XDG_RUNTIME_DIR/systemd/private" ]; then
                [ -S "$XDG_RUNTIME_DIR/bus" ] || { ready=1; break; }
                state=$(busctl --user get-property org.freedesktop.systemd1 /org/freedesktop/systemd1 \
                        org.freedesktop.systemd1.Manager SystemState 2>/dev/null)
                case "$state" in
                *running* | *degraded*) ready=1; break ;;
                esac
        fi
        sleep 0.1
        i=$((i + 1))
done
[ -n "$ready" ] || skip "systemd --user did not become ready within 10 s (no $XDG_RUNTIME_DIR/systemd/private)"

"$@"
rc=$?
if [ $rc -ne 0 ]; then
        echo "# manager log:" && sed 's/^/# /' "$work/manager.log" | tail -n 30
fi
exit $rc
