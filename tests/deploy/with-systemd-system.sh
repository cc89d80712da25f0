#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Runs COMMAND... beside a private `systemd --system`, started for it alone as PID 1 of new pid,
# mount and uts namespaces on the host's root (route 3 of reference/systemd-manager-probe.md):
#   * its own cgroup directories, the v1 controller hierarchies read-only (its units stay in ours);
#   * a tmpfs on /run, and writable overlays on /etc, /var and /usr/local whose upper layers live in a
#     scratch directory: what is installed or created in there (users, units, state) never reaches
#     the host;
#   * SYSTEMD_UNIT_PATH = a unit directory of its own (stub targets, the system bus, polkit, the
#     journal) followed by /usr/local/lib/systemd/system, so no host unit is ever started;
#   * container=with-systemd-system, so that the manager skips host-global set-up.
# COMMAND gets SDSYSTEM_PID (the manager's pid: nsenter -t $SDSYSTEM_PID -m -p -u runs a command
# inside) and SDSYSTEM_UNITS (the unit directory, for drop-ins). Prints "1..0 # SKIP reason" and
# exits 0 only when the manager cannot be started here; otherwise exits with COMMAND's status. Then
# the whole pid namespace is killed and the scratch directory removed (KEEP=1 keeps it).

set -u
. "$(dirname "$0")/../cgroup-util.sh"

skip() {
        echo "1..0 # SKIP $*"
        exit 0
}

[ $# -ge 1 ] || {
        echo "usage: $0 COMMAND..." >&2
        exit 2
}

. "$(dirname "$0")/../../tools/need.sh"
systemd=/usr/lib/systemd/systemd
[ -x "$systemd" ] || skip "no $systemd (package systemd)"
missing=$(missing_cmds unshare nsenter setsid runuser systemctl systemd-analyze systemd-sysusers dbus-daemon) ||
        skip "missing $missing (tools/install-deps.sh deploy)"
[ "$(id -u)" = 0 ] || skip "needs root for namespaces, overlays and cgroup directories"
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null
grep -qw overlay /proc/filesystems || skip "the kernel has no overlay file system"
for h in unified systemd; do
        [ -d /sys/fs/cgroup/$h ] && [ -w /sys/fs/cgroup/$h ] ||
                skip "/sys/fs/cgroup/$h is not a writable cgroup hierarchy (needs a v1/v2 hybrid host)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/systemd-system.XXXXXX") || exit 1
chmod 755 "$work"
cg="systemd-system-$$"
manager_pid=

cleanup() {
        # SIGKILL of the namespace's PID 1 ends every process in it, the mounts go with it
        [ -n "$manager_pid" ] && kill -KILL "$manager_pid" 2>/dev/null
        cgroup_remove "$cg"
        [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

for h in unified systemd; do
        mkdir "/sys/fs/cgroup/$h/$cg" || skip "cannot create /sys/fs/cgroup/$h/$cg"
done

units=$work/units
mkdir -p "$units"
for t in default sysinit basic sockets shutdown local-fs network multi-user slices timers paths; do
        printf '[Unit]\nDescription=%s (stub)\n' "$t" >"$units/$t.target"
done
printf 'Wants=dbus.socket dbus.service systemd-journald.socket systemd-journald.service\n' >>"$units/default.target"
printf '[Unit]\nDefaultDependencies=no\n' >"$units/system.slice"
for u in dbus.socket dbus.service polkit.service systemd-journald.service systemd-journald.socket \
        systemd-journald-dev-log.socket systemd-journald-audit.socket; do
        for d in /usr/lib/systemd/system /lib/systemd/system; do
                if [ -f "$d/$u" ]; then
                        # /dev is the host's: no /dev/log symlink into our /run
                        grep -v '^Symlinks=' "$d/$u" >"$units/$u"
                        break
                fi
        done
done
[ -f "$units/dbus.service" ] || skip "no dbus.service (package dbus)"

for d in etc var usr/local; do
        mkdir -p "$work/overlay/$d/upper" "$work/overlay/$d/work"
done

# The inner shell moves itself into the new cgroups before it becomes the manager, so the manager
# never takes over the root cgroup and this script stays where it was.
setsid unshare --pid --fork --mount --uts --propagation private --mount-proc sh -c '
        set -e
        for h in unified systemd; do echo $$ > /sys/fs/cgroup/$h/'"$cg"'/cgroup.procs; done
        mount -t tmpfs -o mode=755 sdsys-run /run
        for c in /sys/fs/cgroup/*; do
                case $c in */unified|*/systemd) ;; *) mount -o bind,ro "$c" "$c" ;; esac
        done
        for d in etc var usr/local; do
                o='"$work"'/overlay/$d
                mount -t overlay "sdsys-$(echo $d | tr / -)" -o "lowerdir=/$d,upperdir=$o/upper,workdir=$o/work" "/$d"
        done
        hostname with-systemd-system
        export container=with-systemd-system SYSTEMD_UNIT_PATH='"$units"':/usr/local/lib/systemd/system
        exec '"$systemd"' --system --unit=default.target' </dev/null >"$work/manager.log" 2>&1 &
outer=$!

# unshare --fork: the manager is the child of the unshare process
i=0
while [ $i -lt 50 ] && [ -z "$manager_pid" ]; do
        manager_pid=$(pgrep -P "$outer" 2>/dev/null | head -n1)
        kill -0 "$outer" 2>/dev/null || break
        [ -n "$manager_pid" ] || sleep 0.1
        i=$((i + 1))
done
[ -n "$manager_pid" ] || skip "the private systemd did not start: $(tr '\n' ' ' <"$work/manager.log" | cut -c1-300)"

ready=
i=0
while [ $i -lt 100 ]; do
        kill -0 "$manager_pid" 2>/dev/null ||
                skip "the private systemd exited at start: $(tr '\n' ' ' <"$work/manager.log" | cut -c1-300)"
        state=$(nsenter -t "$manager_pid" -m -p -u systemctl is-system-running 2>/dev/null)
        case "$state" in
        running | degraded) ready=1; break ;;
        esac
        sleep 0.1
        i=$((i + 1))
done
[ -n "$ready" ] || skip "the private systemd did not become ready within 10 s (state '$state')"

export SDSYSTEM_PID=$manager_pid SDSYSTEM_UNITS=$units
"$@"
rc=$?
if [ $rc -ne 0 ]; then
        echo "# manager log:" && sed 's/^/# /' "$work/manager.log" | tail -n 30
fi
exit $rc
