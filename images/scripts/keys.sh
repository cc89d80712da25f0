#!/usr/bin/env bash
# Makes the per-build signing keys in KEYS_DIR (default images/keys, git-ignored):
#   verity.key / verity.crt   signs the root's dm-verity hash and the Kubernetes sysext's; the
#                             certificate ships in the image (/usr/lib/verity.d) so the base trusts it
#   pcr.key / pcr.crt         signs the UKI's expected PCR 11 values (.pcrsig; .pcrpkey is pcr.crt's key)
#   gpg/                      a GnuPG home with the key that signs SHA256SUMS (SHA256SUMS.gpg)
#   import-pubring.pgp        its public half, which ships in the image for systemd-sysupdate
# Existing keys are kept: the script only makes what is missing. The daemon never sees these.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KEYS_DIR=${KEYS_DIR:-$here/../keys}
CN=${KEYS_CN:-vm-manager guest image}
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
