#!/usr/bin/env bash
# Quote verifications per second (DESIGN.md §4: under 2 ms each), on the swtpm quotes of
# tests/data/attest, through the whole path of a POST /attest/quote body.
#   usage: bench/attest.sh [build dir, default build] [seconds per key, default 5]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
build=${1:-$top/build}
ninja -C "$build" bench/bench-attest >/dev/null
"$build/bench/bench-attest" "$top/tests/data/attest" "${2:-5}"
