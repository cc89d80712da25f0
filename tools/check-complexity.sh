#!/usr/bin/env bash
# Keeps every function in src/ readable in one sitting (issue 35): fails when pmccabe's modified
# cyclomatic complexity of a function (a switch counts once, however many cases it has; curl's rule
# uses the same figure) is above LIMIT. A function over it is split along its steps, not listed.
#   usage: tools/check-complexity.sh [SOURCE_ROOT]
#          tools/check-complexity.sh --self-test     (a planted function of 51 branches must fail)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/need.sh"
need_cmds check-complexity check pmccabe

limit=50

if [ "${1:-}" = --self-test ]; then
        t=$(mktemp -d)
        trap 'rm -rf "$t"' EXIT
        mkdir -p "$t/src/core"
        {
                printf 'int planted(int x) {\n        int n = 0;\n'
                for i in $(seq 1 $limit); do
                        printf '        if (x == %d)\n                n++;\n' "$i"
                done
                printf '        return n;\n}\n'
        } >"$t/src/core/planted.c"
        # It must fail, and for the planted function, not for some other reason.
        if "$here/check-complexity.sh" "$t" >/dev/null 2>"$t/err" || ! grep -q ' planted: complexity' "$t/err"; then
                echo "check-complexity: a planted function of complexity $((limit + 1)) passed the check" >&2
                cat "$t/err" >&2
                exit 1
        fi
        echo "check-complexity: a planted function of complexity $((limit + 1)) fails the check"
        exit 0
fi
root=${1:-$here/..}
[ -d "$root/src" ] || {
        echo "check-complexity: no $root/src" >&2
        exit 1
}

# pmccabe prints "modified traditional statements first-line lines file(line): function".
mapfile -t files < <(find "$root/src" -name '*.[ch]' | sort)
bad=0
max=0
while read -r modified _ _ _ _ where name; do
        [ "$modified" -gt "$max" ] && max=$modified
        if [ "$modified" -gt "$limit" ]; then
                echo "${where#"$root"/} $name: complexity $modified, more than $limit; split it along its steps (issue 35)" >&2
                bad=1
        fi
done < <(pmccabe "${files[@]}")
[ "$bad" = 0 ] && echo "check-complexity: ${#files[@]} files, the most complex function at $max (limit $limit)"
exit "$bad"
