# shellcheck shell=bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# Sourced by the wrappers that start a private service manager in cgroups of its own
# (tests/integration/with-systemd-user.sh, tests/deploy/with-systemd-system.sh).

# cgroup_remove NAME: kills what is left in /sys/fs/cgroup/{unified,systemd}/NAME (a unit process
# the manager did not reap in time; at most 2 s of trying) and removes the directories.
cgroup_remove() {
        local h d i procs
        for h in unified systemd; do
                d=/sys/fs/cgroup/$h/$1
                [ -d "$d" ] || continue
                for i in $(seq 20); do
                        procs=$(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null)
                        [ -z "$procs" ] && break
                        kill -KILL $procs 2>/dev/null
                        sleep 0.1
                done
                find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
        done
}
