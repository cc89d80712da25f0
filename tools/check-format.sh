#!/bin/sh
# Fails when a tracked C file differs from .clang-format. The formatter is pinned to
# clang-format-14 (Debian 12's), since other versions format differently.
set -eu
cd "${1:-.}"
fmt=$(command -v clang-format-14 || true)
if [ -z "$fmt" ]; then
        echo "clang-format-14 is missing: run tools/install-deps.sh" >&2
        exit 1
fi
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find src tests agent -name '*.[ch]' 2>/dev/null)
[ -n "$files" ] || exit 0
# shellcheck disable=SC2086
"$fmt" --dry-run --Werror $files
echo "formatting ok: $(echo "$files" | wc -l) files"
