#!/usr/bin/env bash
# Keeps the event loop free of calls that wait for another process or sleep (issue 33): fails when
# one of them appears in src/ outside the places listed below, each of which runs off the loop or
# before it starts. A new entry needs a reason that says why the loop never gets there.
#   usage: tools/check-loop-calls.sh [SOURCE_ROOT]
#          tools/check-loop-calls.sh --self-test     (a planted usleep() must fail the check)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --self-test ]; then
        t=$(mktemp -d)
        trap 'rm -rf "$t"' EXIT
        mkdir -p "$t/src/core"
        printf 'static void f(void) {\n        usleep(100000);\n}\n' >"$t/src/core/planted.c"
        if "$here/check-loop-calls.sh" "$t" >/dev/null 2>&1; then
                echo "check-loop-calls: a planted usleep() passed the check" >&2
                exit 1
        fi
        echo "check-loop-calls: a planted usleep() fails the check"
        exit 0
fi
root=${1:-$here/..}

# file:function-or-call  reason
allowed=(
        "src/basic/loop-watchdog.c:nanosleep         the watcher thread's sampling pause, never the loop's"
        "src/daemon/serve.c:nanosleep                the debug builds' test hook that sleeps on the loop on purpose"
        "src/host/host-probe.c:waitpid               the host probe runs at start-up, before the loop serves"
        "src/host/host-probe.c:poll                  the host probe runs at start-up, before the loop serves"
        "src/oci/oci-registry.c:nanosleep            image push/pull is the command line's, not the daemon's"
        "src/cli/cli.c:sleep                         the client commands run in their own process, never on the loop"
        "src/cli/cli.c:poll                          vm shell's relay is the client's own process, never the loop"
        "src/core/vm-exec-helper.c:poll              vm shell's relay runs in the exec-ssh helper process, not the loop's"
        "src/storage/host-install.c:waitpid          the host install runs in its own helper process"
        "src/storage/storage.c:varlink_call_sync     start-up only: GetInfo and the reattach of VMs before the loop serves"
        "src/vm/vm-process.c:waitpid                 reaps a child just SIGKILLed whose watch could not be added"
        "src/core/manager-firmware-run.c:waitpid     the firmware run is a helper process of its own, not the loop's"
        "src/core/manager-firmware-run.c:nanosleep   the firmware run is a helper process of its own, not the loop's"
        "src/vm/vm-guard.c:waitpid                   the guard around swtpm_setup is a process of its own, not the loop's"
)

pattern='\b(sd_bus_call|sd_bus_wait|sd_varlink_call|usleep|sleep|nanosleep|clock_nanosleep|poll|ppoll|select|pselect|waitpid|wait|varlink_call_sync)[[:space:]]*\('
bad=0
while IFS=: read -r file line text; do
        rel=${file#"$root"/}
        # comments are not calls
        trimmed=${text#"${text%%[![:space:]]*}"}
        case "$trimmed" in
        '*'* | '/*'* | '//'*) continue ;;
        esac
        call=$(grep -oE "$pattern" <<<"$text" | head -1 | sed -E 's/[[:space:]]*\($//')
        [ -n "$call" ] || continue
        ok=
        for a in "${allowed[@]}"; do
                key=${a%%[[:space:]]*}
                if [ "$key" = "$rel:$call" ]; then
                        ok=1
                        break
                fi
        done
        if [ -z "$ok" ] && grep -qE "^[a-z][a-zA-Z0-9_ *]*[ *]$call\(" <<<"$text"; then
                ok=1 # the function's own definition
        fi
        if [ -z "$ok" ]; then
                echo "$rel:$line: $call() waits; the loop must not (issue 33). If this never runs on the loop, add it to tools/check-loop-calls.sh with the reason." >&2
                bad=1
        fi
done < <(grep -rnE "$pattern" "$root/src" --include='*.c' --include='*.h' | sed -E 's/^([^:]+):([0-9]+):/\1:\2:/')
[ "$bad" = 0 ] && echo "check-loop-calls: no waiting call outside the listed places"
exit "$bad"
