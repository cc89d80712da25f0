#!/bin/sh
# The guest image's first-boot hostname (images/.../usr/libexec/vm-image/vm-firstboot), run on the
# host in its own mount and UTS namespaces with a tmpfs as /etc: the hostname credential alone is
# written to /etc/hostname and the kernel, and every other case is handed to systemd-firstboot (a
# stand-in here that records its call) with nothing written. TAP output; needs root (unshare).
set -eu

script=$(cd "$(dirname "$0")/../.." && pwd)/images/mkosi.images/base/mkosi.extra/usr/libexec/vm-image/vm-firstboot
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
printf '#!/bin/sh\necho systemd-firstboot-called\n' >"$work/bin/systemd-firstboot"
chmod +x "$work/bin/systemd-firstboot"

n=0
failed=0
echo "1..8"

# case NAME EXPECT [cred=value ...] [--etc-hostname=X] [--no-creds]; EXPECT is "hostname:NAME" or
# "fallback"
case_() {
        title=$1 expect=$2
        shift 2
        creds=$work/creds.$n
        rm -rf "$creds"
        mkdir "$creds"
        pre=
        for a in "$@"; do
                case $a in
                --etc-hostname=*) pre=${a#--etc-hostname=} ;;
                --no-creds) rmdir "$creds"; creds= ;;
                *=*) printf '%s' "${a#*=}" >"$creds/${a%%=*}" ;;
                esac
        done
        out=$(unshare --mount --uts --propagation private /bin/sh -c '
                mount -t tmpfs tmpfs /etc
                hostname before-test
                [ -z "$3" ] || printf "%s\n" "$3" >/etc/hostname
                PATH="$1:$PATH" CREDENTIALS_DIRECTORY="$2" /bin/sh "$4"; rc=$?
                echo "rc=$rc"
                echo "kernel=$(cat /proc/sys/kernel/hostname)"
                if [ -e /etc/hostname ]; then echo "etc=$(cat /etc/hostname)"; else echo "etc=-"; fi
        ' sh "$work/bin" "$creds" "$pre" "$script" 2>&1) || :
        n=$((n + 1))
        case $expect in
        hostname:*)
                want=${expect#hostname:}
                ok=$(printf '%s\n' "$out" | grep -qx "rc=0" && printf '%s\n' "$out" | grep -qx "kernel=$want" &&
                        printf '%s\n' "$out" | grep -qx "etc=$want" &&
                        ! printf '%s\n' "$out" | grep -q systemd-firstboot-called && echo yes || echo no)
                ;;
        fallback)
                etc=${pre:--}
                ok=$(printf '%s\n' "$out" | grep -q systemd-firstboot-called && printf '%s\n' "$out" | grep -qx "kernel=before-test" &&
                        printf '%s\n' "$out" | grep -qx "etc=$etc" && echo yes || echo no)
                ;;
        esac
        if [ "$ok" = yes ]; then
                echo "ok $n - $title"
        else
                echo "not ok $n - $title"
                printf '%s\n' "$out" | sed 's/^/# /'
                failed=$((failed + 1))
        fi
}

case_ "the hostname credential alone sets /etc/hostname and the kernel's hostname" hostname:node-1 \
        firstboot.hostname="node-1
"
case_ "a credential without a trailing newline is taken whole" hostname:a.b-c.example firstboot.hostname=a.b-c.example
case_ "another firstboot credential goes to systemd-firstboot, nothing written" fallback \
        firstboot.hostname=node-1 firstboot.timezone=Europe/Berlin
case_ "a root password credential goes to systemd-firstboot" fallback \
        firstboot.hostname=node-1 passwd.hashed-password.root=x
case_ "a name systemd might refuse (a space) goes to systemd-firstboot" fallback "firstboot.hostname=bad name"
case_ "a name longer than 64 characters goes to systemd-firstboot" fallback \
        firstboot.hostname=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
case_ "an existing /etc/hostname is left to systemd-firstboot" fallback firstboot.hostname=node-1 --etc-hostname=kept
case_ "no credentials at all: systemd-firstboot" fallback --no-creds

echo "# $((n - failed)) of $n passed"
[ "$failed" -eq 0 ]
