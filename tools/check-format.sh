#!/bin/sh
# Fails when a tracked C file differs from .clang-format. The formatter is pinned to
# clang-format-14 (Debian 12's), since other versions format differently.
set -eu
. "$(dirname "$0")/need.sh"
cd "${1:-.}"
need_cmds check-format check clang-format-14
fmt=$(command -v clang-format-14)
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find src tests agent -name '*.[ch]' 2>/dev/null)
[ -n "$files" ] || exit 0
# shellcheck disable=SC2086
"$fmt" --dry-run --Werror $files
echo "formatting ok: $(echo "$files" | wc -l) files"
