#!/usr/bin/env bash
# Static analysis of src/ with cppcheck (Debian 12's 2.10; issue 35): fails on any finding of the
# error, warning, portability or performance kinds that tools/cppcheck.supp does not suppress with
# a reason. Its style kind is left out: it mostly asks for what this code does on purpose (a
# variable initialised at its declaration, a _cleanup_ variable set to NULL and then assigned).
#   usage: tools/check-cppcheck.sh [SOURCE_ROOT [CACHE_DIR]]   (CACHE_DIR keeps the analysis of
#                                  unchanged files between runs: seconds cold, under one warm)
#          tools/check-cppcheck.sh --self-test                 (a planted overflow must fail)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/need.sh"
need_cmds check-cppcheck check cppcheck

if [ "${1:-}" = --self-test ]; then
        t=$(mktemp -d)
        trap 'rm -rf "$t"' EXIT
        mkdir -p "$t/src/core"
        printf 'int planted(void) {\n        int a[4] = { 0 };\n\n        a[4] = 1;\n        return a[0];\n}\n' \
                >"$t/src/core/planted.c"
        # It must fail, and for the planted overflow, not for some other reason.
        if "$here/check-cppcheck.sh" "$t" >/dev/null 2>"$t/err" || ! grep -q 'planted.c:4: .*arrayIndexOutOfBounds' "$t/err"; then
                echo "check-cppcheck: a planted out-of-bounds write passed the check" >&2
                cat "$t/err" >&2
                exit 1
        fi
        echo "check-cppcheck: a planted out-of-bounds write fails the check"
        exit 0
fi
root=${1:-$here/..}
cache=${2:-}
[ -d "$root/src" ] || {
        echo "check-cppcheck: no $root/src" >&2
        exit 1
}

cd "$root"
# The headers are included by their base name, as meson's include directories have them.
incs=()
for d in src/*/; do
        incs+=("-I${d%/}")
done
opts=()
if [ -n "$cache" ]; then
        mkdir -p "$cache"
        opts+=("--cppcheck-build-dir=$cache")
fi
# Paths in the suppressions are relative to the source root, which is why cppcheck runs from it.
if ! cppcheck -j"$(nproc)" --quiet --std=c11 --enable=warning,portability,performance \
        --suppressions-list="$here/cppcheck.supp" --error-exitcode=1 "${opts[@]}" "${incs[@]}" \
        --template='{file}:{line}: {severity}/{id}: {message}' src; then
        echo "check-cppcheck: fix the findings above; a false positive goes into tools/cppcheck.supp with its reason" >&2
        exit 1
fi
echo "check-cppcheck: no finding in src/"
