#!/usr/bin/env bash
# Fairness between guests on the metadata service: /healthz and another VM's IMDS latency while
# one VM floods 8 MiB report uploads or holds 4,200 idle connections, beside an idle baseline, and
# a restart with 50 stored 8 MiB reports (bench/imds-fairness.py says how). Prints markdown for
# docs/benchmarks.md.
#   usage: bench/imds-fairness.sh [path/to/vm-manager]      (DURATION=15 HELD=4200 STORED=50)
set -euo pipefail

bin=${1:-build/src/daemon/vm-manager}
held=${HELD:-4200}

# the held connections need as many descriptors in the bench and in the daemon, which inherits them
want=$((held + 1024))
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$want" ]; then
        echo "bench: RLIMIT_NOFILE's hard limit ($hard) is below $want; lower HELD" >&2
        exit 1
fi
[ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt "$want" ] && ulimit -Sn "$want"

exec python3 "$(dirname "$0")/imds-fairness.py" "$bin"
