#!/usr/bin/env bash
# Installs binary packages that only Debian sid (unstable) has, on a bookworm host, through an
# apt view of sid kept apart from the system's: its own sources list, state, lists and cache
# under $SID_APT_DIR (default /var/cache/vm-manager/sid-apt). The system's apt sources,
# preferences and lists are never touched. The .deb is fetched with `apt-get download` from
# that view and installed with the system's apt-get (which runs dpkg -i and takes any
# dependencies from the system's own suites; nothing else comes from sid). Meant for
# self-contained packages such as vhost-device-vsock (Depends: libc6, libgcc-s1).
#
# Idempotent: a package that dpkg already reports as installed is left alone (no network);
# the sid lists are refreshed only when missing or older than a day.
#
# usage: tools/fetch-sid-package.sh NAME...          (as root)
#        SID_APT_DIR=/path tools/fetch-sid-package.sh NAME...
#        tools/fetch-sid-package.sh --download-only DIR NAME...   (only fetch the .debs into DIR)
#        tools/fetch-sid-package.sh --refresh-lists   (only make sure the sid lists are there and fresh,
#                                                      for callers that read them through $SID_APT_DIR/apt.conf)
#        tools/fetch-sid-package.sh --suite bookworm --download-only DIR NAME...
#        tools/fetch-sid-package.sh --suite bookworm --source DIR NAME   (a source package's files into DIR)
#        tools/fetch-sid-package.sh --suite bookworm-backports --replace NAME...   (install the suite's
#                                                      version even where dpkg has another installed)
#
# --suite SUITE gives the same isolated view of another suite of the archive, with its source
# packages too (under /var/cache/vm-manager/SUITE-apt): the Kubernetes sysext's runtime and
# Kubernetes itself are built from bookworm's packages even on a host of another release.
set -euo pipefail

suite=sid
if [ "${1:-}" = "--suite" ]; then
        [ $# -ge 2 ] || { echo "usage: $0 --suite SUITE ..." >&2; exit 2; }
        suite=$2
        shift 2
        case "$suite" in
        *[!a-z-]* | "") echo "fetch-sid-package: bad suite '$suite'" >&2; exit 2 ;;
        esac
fi
if [ "$suite" = sid ]; then
        A=${SID_APT_DIR:-/var/cache/vm-manager/sid-apt}
else
        A=/var/cache/vm-manager/$suite-apt
fi
MIRROR=${SID_APT_MIRROR:-http://deb.debian.org/debian}
download_only=
refresh_only=
source_only=
replace=

if [ "${1:-}" = "--replace" ]; then
        replace=1
        shift
elif [ "${1:-}" = "--refresh-lists" ]; then
        refresh_only=1
        shift
elif [ "${1:-}" = "--download-only" ]; then
        [ $# -ge 3 ] || { echo "usage: $0 --download-only DIR NAME..." >&2; exit 2; }
        download_only=$2
        shift 2
elif [ "${1:-}" = "--source" ]; then
        [ $# -eq 3 ] || { echo "usage: $0 [--suite SUITE] --source DIR NAME" >&2; exit 2; }
        source_only=$2
        download_only=$2
        shift 2
fi
[ $# -ge 1 ] || [ -n "$refresh_only" ] || { echo "usage: $0 [--download-only DIR] NAME... | --refresh-lists" >&2; exit 2; }

want=()
for p in "$@"; do
        case "$p" in
        *[!a-z0-9.+-]* | "") echo "fetch-sid-package: bad package name '$p'" >&2; exit 2 ;;
        esac
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        if [ -z "$download_only" ] && [ -z "$replace" ] && [ "$status" = "install ok installed" ]; then
                continue
        fi
        want+=("$p")
done
[ ${#want[@]} -gt 0 ] || [ -n "$refresh_only" ] || exit 0

if [ -z "$download_only" ] && [ "$(id -u)" -ne 0 ]; then
        echo "fetch-sid-package: ${want[*]} not installed; run this script as root" >&2
        exit 1
fi

mkdir -p "$A/etc/sources.list.d" "$A/etc/preferences.d" "$A/etc/apt.conf.d" \
        "$A/state/lists/partial" "$A/cache/archives/partial" "$A/debs"
rm -f "$A/etc/sources.list.d/sid.sources"
types=deb
[ "$suite" = sid ] || types="deb deb-src"
cat > "$A/etc/sources.list.d/$suite.sources" <<SRC
Types: $types
URIs: $MIRROR
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
: > "$A/etc/sources.list"
# Everything apt reads or writes is under $A, except dpkg's status file, which apt only reads
# here (to know what is installed), and the system keyring.
cat > "$A/apt.conf" <<CONF
Dir::Etc "$A/etc";
Dir::Etc::main "$A/apt.conf";
Dir::Etc::sourcelist "$A/etc/sources.list";
Dir::Etc::sourceparts "$A/etc/sources.list.d";
Dir::Etc::preferences "$A/etc/preferences";
Dir::Etc::preferencesparts "$A/etc/preferences.d";
Dir::Etc::parts "$A/etc/apt.conf.d";
Dir::Etc::trusted "/etc/apt/trusted.gpg";
Dir::Etc::trustedparts "/etc/apt/trusted.gpg.d";
Dir::State "$A/state";
Dir::State::lists "$A/state/lists";
Dir::State::status "/var/lib/dpkg/status";
Dir::Cache "$A/cache";
Dir::Cache::archives "$A/cache/archives";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
Acquire::Check-Valid-Until "false";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled "false";
Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled "false";
Acquire::IndexTargets::deb::Contents-udeb::DefaultEnabled "false";
Acquire::GzipIndexes "true";
Acquire::CompressionTypes::Order { "gz"; };
CONF
export APT_CONFIG="$A/apt.conf"

lists="$A/state/lists"
if ! compgen -G "$lists/*_Packages*" >/dev/null ||
        [ -n "$(find "$lists" -maxdepth 1 -name '*_InRelease' -mmin +1440 -print -quit)" ]; then
        apt-get update -q -o APT::Update::Error-Mode=any >&2
fi

[ -z "$refresh_only" ] || exit 0

if [ -n "$source_only" ]; then
        # The .dsc and its tarballs, checked against the signed Sources index by apt; not unpacked.
        mkdir -p "$source_only"
        (cd "$source_only" && apt-get source -q --download-only -o APT::Sandbox::User=root "${want[0]}" >&2)
        exit 0
fi

dest=${download_only:-$A/debs}
mkdir -p "$dest"
# apt downloads as the unprivileged _apt user when that user may write the target directory.
[ -n "$download_only" ] || ! id _apt >/dev/null 2>&1 || chown _apt "$dest"
debs=()
for p in "${want[@]}"; do
        # A download (or a --replace) takes the suite's own version: the candidate over the system's
        # status file would be the installed one where that is newer (bookworm's libc6 on a trixie
        # host), which no source of this view has.
        own=$download_only$replace
        ver=$(apt-cache policy ${own:+-o Dir::State::status=/dev/null} "$p" | awk '/Candidate:/ { print $2 }')
        if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
                echo "fetch-sid-package: $p is not in $suite" >&2
                exit 1
        fi
        (cd "$dest" && apt-get download -q ${download_only:+-o APT::Sandbox::User=root} "$p=$ver" >&2)
        # apt names the file NAME_VERSION_ARCH.deb, with an epoch's ':' written as %3a
        files=("$dest/${p}_${ver//:/%3a}_"*.deb)
        f=${files[0]}
        [ -f "$f" ] || { echo "fetch-sid-package: download of $p=$ver left no .deb in $dest" >&2; exit 1; }
        echo "fetch-sid-package: $p $ver -> $f" >&2
        debs+=("$f")
done

[ -z "$download_only" ] || exit 0

# The system's apt (not the sid view) installs the files: dependencies come from the system's
# suites only, and an unsatisfiable one stops the install before dpkg changes anything.
unset APT_CONFIG
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${debs[@]}"
