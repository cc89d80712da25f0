#!/usr/bin/env bash
# Makes the per-build signing keys in KEYS_DIR (default images/keys, git-ignored):
#   verity.key / verity.crt   signs the root's dm-verity hash and the Kubernetes sysext's; the
#                             certificate ships in the image (/usr/lib/verity.d) so the base trusts it
#   pcr.key / pcr.crt         signs the UKI's expected PCR 11 values (.pcrsig; .pcrpkey is pcr.crt's key)
#   gpg/                      a GnuPG home with the key that signs SHA256SUMS (SHA256SUMS.gpg)
#   import-pubring.pgp        its public half, which ships in the image for systemd-sysupdate
# Existing keys are kept: the script only makes what is missing. A checkout without keys takes
# this host's from the image cache (IMAGE_CACHE_DIR/keys, root only), and new keys are saved there,
# so that a fresh clone on the same host reuses cached builds instead of rebuilding with new keys.
# ROTATE=1 makes a new set. The daemon never sees any of these.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KEYS_DIR=${KEYS_DIR:-$here/../keys}
CACHE=${IMAGE_CACHE_DIR:-/var/cache/vm-manager/images}
CN=${KEYS_CN:-vm-manager guest image}
. "$here/../../tools/need.sh"
need_cmds keys "build image" openssl gpg
if [ "${ROTATE:-0}" = 1 ]; then
        rm -rf "$KEYS_DIR" "$CACHE/keys"
fi
if [ ! -s "$KEYS_DIR/import-pubring.pgp" ] && [ -s "$CACHE/keys/import-pubring.pgp" ]; then
        mkdir -p "$KEYS_DIR"
        cp -a "$CACHE/keys/." "$KEYS_DIR/"
        echo "keys: took this host's keys from $CACHE/keys"
fi
mkdir -p "$KEYS_DIR"
chmod 0700 "$KEYS_DIR"
cd "$KEYS_DIR"

for k in verity pcr; do
        [ -s $k.key ] && [ -s $k.crt ] && continue
        openssl req -new -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
                -subj "/CN=$CN ($k)" -keyout $k.key -out $k.crt 2>/dev/null
        chmod 0600 $k.key
        echo "keys: made $k.key and $k.crt"
done

if [ ! -s import-pubring.pgp ]; then
        rm -rf gpg
        mkdir -m 0700 gpg
        gpg --homedir gpg --batch --quiet --pinentry-mode loopback --passphrase '' \
                --quick-gen-key "$CN <root@localhost>" rsa3072 sign never
        gpg --homedir gpg --batch --quiet --export > import-pubring.pgp
        gpg-connect-agent --homedir gpg KILLAGENT /bye >/dev/null 2>&1 || true
        echo "keys: made the SHA256SUMS signing key (gpg/, import-pubring.pgp)"
fi

if [ ! -s "$CACHE/keys/import-pubring.pgp" ]; then
        mkdir -p "$CACHE"
        rm -rf "$CACHE/keys.new"
        cp -a "$KEYS_DIR" "$CACHE/keys.new"
        chmod 0700 "$CACHE/keys.new"
        mv "$CACHE/keys.new" "$CACHE/keys"
fi
