#!/usr/bin/env bash
# The event loop under load: /healthz latency (wrk) and the longest event loop iteration the daemon
# measured, on an idle daemon and while rounds of 10 VMs are created, stopped and deleted on the fake
# QEMU, with the systemd launcher against a private `systemd --user` where one can be started here
# (tests/integration/with-systemd-user.sh, as root), else with plain children (bench/loop.py says
# how). Prints a markdown table for docs/benchmarks.md.
#   usage: bench/loop.sh [[LABEL=]path/to/vm-manager ...]  (DURATION=10 VMS=10 CONNECTIONS=16 THREADS=1
#                                                          ROUNDS=1 WHERE=1 LAUNCHER=process)
# Several binaries are run interleaved, ROUNDS times (before=old/vm-manager after=new/vm-manager).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 1 ] || set -- build/src/daemon/vm-manager

. "$here/../tools/need.sh"
need_cmds bench bench wrk python3

WITH_SYSTEMD_USER_OPTIONAL=1 exec "$here/../tests/integration/with-systemd-user.sh" python3 "$here/loop.py" "$@"
