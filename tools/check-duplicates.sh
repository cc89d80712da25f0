#!/usr/bin/env bash
# Keeps copied code in src/ from growing (issue 35): counts the pairs of similar runs that sim_c
# (Debian's similarity-tester) finds over src/*.[ch], and fails when the count is above the one
# committed in tools/duplicates.baseline. A run counts when it is at least MIN_TOKENS tokens and
# MIN_LINES lines long on both sides; layout, comments and the names of variables do not make
# two runs differ, the names of called functions do (-F), and runs are whole bracketed units (-f),
# so that a shared tail of two unrelated functions does not count.
#   usage: tools/check-duplicates.sh [SOURCE_ROOT]
#          tools/check-duplicates.sh --list [SOURCE_ROOT]     (the pairs counted)
#          tools/check-duplicates.sh --update [SOURCE_ROOT]   (write the count to the baseline)
#          tools/check-duplicates.sh --self-test              (a planted copy must fail)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/need.sh"
need_cmds check-duplicates check sim_c

MIN_TOKENS=60
MIN_LINES=6
baseline_file=$here/duplicates.baseline

# The counted pairs, one a line: "a.c: line 10-30 | b.c: line 40-60 [tokens]".
pairs() {
        (cd "$1" && find src -name '*.[ch]' | LC_ALL=C sort | sim_c -i -f -F -n -T -r "$MIN_TOKENS") |
                awk -v min="$MIN_LINES" '/\|/ {
                        s = $0; n = 0
                        while (match(s, /line [0-9]+-[0-9]+/)) {
                                split(substr(s, RSTART + 5, RLENGTH - 5), a, "-")
                                len[++n] = a[2] - a[1] + 1
                                s = substr(s, RSTART + RLENGTH)
                        }
                        if (n == 2 && len[1] >= min && len[2] >= min)
                                print
                }'
}

baseline() {
        grep -vE '^[[:space:]]*(#|$)' "$baseline_file" | head -1
}

mode=check
case "${1:-}" in
--list | --update)
        mode=${1#--}
        shift
        ;;
--self-test)
        t=$(mktemp -d)
        trap 'rm -rf "$t"' EXIT
        (cd "$here/.." && find src -name '*.[ch]' -exec cp --parents -t "$t" {} +)
        # One function, twice: the same calls, other names.
        for n in 1 2; do
                cat >"$t/src/core/planted$n.c" <<EOC
static int planted$n(const char *path, char **ret) {
        _cleanup_free_ char *text$n = NULL;
        size_t size$n = 0;
        int r$n;

        r$n = read_full_file(path, 4096, &text$n, &size$n);
        if (r$n < 0)
                return log_debug_errno(r$n, "cannot read %s: %m", path);
        if (size$n == 0 || memchr(text$n, 0, size$n))
                return log_debug_errno(-EBADMSG, "%s is empty or binary", path);
        *ret = strndup(text$n, strcspn(text$n, "\\n"));
        if (!*ret)
                return log_oom_debug();
        return 0;
}
EOC
        done
        # It must fail, and for the planted copy, not for some other reason: measured against the tree's
        # own count, so that a baseline not yet lowered after a clean-up cannot hide the copy.
        if DUPLICATES_BASELINE=$(pairs "$here/.." | grep -c . || true) \
                "$here/check-duplicates.sh" "$t" >/dev/null 2>"$t/err" || ! grep -q 'planted1.c' "$t/err"; then
                echo "check-duplicates: a planted copy of a function passed the check" >&2
                cat "$t/err" >&2
                exit 1
        fi
        echo "check-duplicates: a planted copy of a function fails the check"
        exit 0
        ;;
esac
root=${1:-$here/..}
[ -d "$root/src" ] || {
        echo "check-duplicates: no $root/src" >&2
        exit 1
}

found=$(pairs "$root")
count=$(grep -c . <<<"$found" || true)
case "$mode" in
list)
        printf '%s\n' "$found"
        exit 0
        ;;
update)
        sed -i -E "s/^[0-9]+$/$count/" "$baseline_file"
        echo "check-duplicates: baseline set to $count pairs"
        exit 0
        ;;
esac

limit=${DUPLICATES_BASELINE:-$(baseline)}
if [ "$count" -gt "$limit" ]; then
        echo "check-duplicates: $count pairs of similar code in src/, more than the baseline's $limit (tools/duplicates.baseline)." >&2
        echo "Factor the new copy into a function; the pairs (tools/check-duplicates.sh --list):" >&2
        printf '%s\n' "$found" >&2
        exit 1
fi
if [ "$count" -lt "$limit" ]; then
        echo "check-duplicates: $count pairs, fewer than the baseline's $limit: lower it with tools/check-duplicates.sh --update"
else
        echo "check-duplicates: $count pairs of similar code in src/ (baseline $limit)"
fi
