#!/usr/bin/env bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# Regenerates the TPM quote fixtures of tests/unit/test-attest-*.c and the seeds of the attest fuzz
# targets from a software TPM (swtpm + tpm2-tools, reference/network-imds-attest.md §9.3), so the
# tests themselves need neither. Run from anywhere; writes next to itself and into
# tests/fuzz/corpus/attest-*/. Review the diff like code.
#
# What the TPM holds when it quotes, and the event logs that explain it:
#   firmware.log   a real firmware event log (boot-log.sh records it from one OVMF boot): its
#                  sha256 measurements are replayed into the TPM first (PCRs 0-7, 9 and the
#                  systemd stub's PCR 11 sections), which must give firmware-pcrs.json's values
#   tpm2-measure-initrd.log   systemd's userspace log at the initrd quote: "enter-initrd" (PCR 11),
#                  "os-separator" (PCR 13)
#   tpm2-measure-ready.log    the same log at the ready quote: then "leave-initrd", the machine id
#                  (PCR 15), "sysinit", the sysext line "<sha256>  kubernetes_1.36.4.raw" (the
#                  SysextPCR rule of §4.3, PCR 13) and "ready"
# Each record of those logs is extended into the TPM as it is written, with its sha256 digest.
# Three attestation keys, children of an ECC SRK, persisted: ECC P-256/ECDSA-SHA256 (0x81010002,
# the agent's template), RSA 2048/RSASSA-SHA256 (0x81010003), RSA 2048/RSAPSS-SHA256 (0x81010004).
#
# Files (per key directory ecdsa/, rsassa/, rsapss/):
#   ak.pub                      TPM2B_PUBLIC of the AK (tpm2_create -u)
#   initrd.msg / initrd.sig     quote over sha256:0-7,11 (TPMS_ATTEST, TPMT_SIGNATURE)
#   ready.msg / ready.sig       quote over sha256:0-7,11,13
# ecdsa/ also has sha1.msg/.sig (the sha1 bank) and partial.msg/.sig (sha256:0-7, no 11).
# Shared: nonce.hex (the qualifying data of every quote), pcrs-initrd.json and pcrs-ready.json (the
# "pcrs" member of a QuoteRequest), sysext.txt (the measured sysext line), policy.json, and the logs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
corpus=$here/../../fuzz/corpus

for tool in swtpm tpm2_createprimary tpm2_quote tpm2_eventlog od base64 sha256sum sha1sum python3; do
        command -v "$tool" >/dev/null || { echo "gen.sh: $tool is missing" >&2; exit 77; }
done

work=$(mktemp -d)
swtpm_pid=
cleanup() {
        if [ -n "$swtpm_pid" ]; then
                kill "$swtpm_pid" 2>/dev/null || true
                wait "$swtpm_pid" 2>/dev/null || true
        fi
        rm -rf "$work"
}
trap cleanup EXIT

mkdir "$work/state"
swtpm socket --tpm2 --tpmstate dir="$work/state" \
        --server type=unixio,path="$work/tpm.sock" --ctrl type=unixio,path="$work/tpm.sock.ctrl" \
        --flags not-need-init,startup-clear >"$work/swtpm.log" 2>&1 &
swtpm_pid=$!
for _ in $(seq 50); do
        [ -S "$work/tpm.sock" ] && break
        sleep 0.1
done
export TPM2TOOLS_TCTI="swtpm:path=$work/tpm.sock"

# swtpm has no resource manager: transient objects and sessions pile up unless flushed.
flush() {
        tpm2_flushcontext -t >/dev/null
        tpm2_flushcontext -s >/dev/null
}
# sha256 of a string, lowercase hex
sha() {
        printf '%s' "$1" | sha256sum | cut -c1-64
}
# a file as one line of lowercase hex
hexof() {
        od -An -v -tx1 "$1" | tr -d ' \n'
}
# a 16-bit big-endian length as two raw bytes
u16() {
        printf '%b' "\\$(printf %03o $(($1 >> 8)))\\$(printf %03o $(($1 & 255)))"
}
extend() {
        tpm2_pcrextend "$1:sha256=$2" >/dev/null
        flush
}

nonce=$(sha "vm-manager attestation fixture nonce")
kube=1.36.4
sysext="$(sha "kubernetes sysext fixture")  kubernetes_$kube.raw"
attrs="fixedtpm|fixedparent|sensitivedataorigin|userwithauth|noda|restricted|sign"

tpm2_createprimary -C o -g sha256 -G ecc256:aes128cfb -c "$work/srk.ctx" >/dev/null
flush
make_ak() { # dir alg handle
        mkdir -p "$here/$1"
        tpm2_create -C "$work/srk.ctx" -g sha256 -G "$2" -a "$attrs" -u "$here/$1/ak.pub" -r "$work/$1.priv" >/dev/null
        flush
        tpm2_load -C "$work/srk.ctx" -u "$here/$1/ak.pub" -r "$work/$1.priv" -c "$work/$1.ctx" >/dev/null
        flush
        tpm2_evictcontrol -C o -c "$work/$1.ctx" "$3" >/dev/null
        flush
}
make_ak ecdsa ecc256:ecdsa-sha256:null 0x81010002
make_ak rsassa rsa2048:rsassa-sha256:null 0x81010003
make_ak rsapss rsa2048:rsapss-sha256:null 0x81010004

quote() { # dir handle name selection [scheme]
        tpm2_quote -c "$2" -l "$4" -q "$nonce" -m "$here/$1/$3.msg" -s "$here/$1/$3.sig" -g sha256 \
                ${5:+--scheme "$5"} >/dev/null
        flush
}
pcrs_json() { # selection output
        local i first=1 v
        tpm2_pcrread "sha256:$1" -o "$work/pcrs.bin" >/dev/null
        flush
        v=$(hexof "$work/pcrs.bin")
        {
                printf '{"sha256":{'
                for i in ${1//,/ }; do
                        [ $first = 1 ] || printf ','
                        first=0
                        printf '"%s":"%s"' "$i" "${v:0:64}"
                        v=${v:64}
                done
                printf '}}\n'
        } >"$2"
        cp "$work/pcrs.bin" "$work/$(basename "$2" .json).bin"
}

# The firmware's measurements, as tpm2_eventlog (not our parser) reads them from the log, in one
# tpm2_pcrextend call: PCR:sha256=DIGEST for every event but EV_NO_ACTION, in log order.
mapfile -t measurements < <(tpm2_eventlog "$here/firmware.log" 2>/dev/null | awk '
        /^- EventNum:/ { pcr = ""; type = ""; alg = "" }
        /^  PCRIndex:/ { pcr = $2 }
        /^  EventType:/ { type = $2 }
        /^  - AlgorithmId:/ { alg = $3 }
        /^    Digest:/ && alg == "sha256" && type != "EV_NO_ACTION" { gsub(/"/, "", $2); print pcr ":sha256=" $2 }')
tpm2_pcrextend "${measurements[@]}" >/dev/null
flush
for i in 0 1 2 3 4 5 6 7 9 11; do
        want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sha256"][sys.argv[2]])' \
                "$here/firmware-pcrs.json" "$i")
        got=$(tpm2_pcrread "sha256:$i" -o "$work/p" >/dev/null && hexof "$work/p")
        flush
        [ "$got" = "$want" ] || { echo "gen.sh: pcr $i replays to $got, the boot had $want" >&2; exit 1; }
done

# systemd's userspace log: one json-seq record per measurement (sha1 and sha256 digests, as
# systemd writes every bank), extended as it is written
boot_id=8f1d2c3b4a5e46f7a8b9c0d1e2f3a4b5
stamp=1000000
measure() { # log pcr text [eventType]
        stamp=$((stamp + 250000))
        printf '\036{"pcr":%d,"digests":[{"hashAlg":"sha1","digest":"%s"},{"hashAlg":"sha256","digest":"%s"}],' \
                "$2" "$(printf '%s' "$3" | sha1sum | cut -c1-40)" "$(sha "$3")" >>"$1"
        printf '"content_type":"systemd","content":{"string":"%s","bootId":"%s","timestamp":%d%s}}\n' \
                "$3" "$boot_id" "$stamp" "${4:+,\"eventType\":\"$4\"}" >>"$1"
        extend "$2" "$(sha "$3")"
}
uslog=$work/tpm2-measure.log
: >"$uslog"
measure "$uslog" 11 enter-initrd phase
measure "$uslog" 13 os-separator
cp "$uslog" "$here/tpm2-measure-initrd.log"

initrd_sel=0,1,2,3,4,5,6,7,11
ready_sel=0,1,2,3,4,5,6,7,11,13
pcrs_json $initrd_sel "$here/pcrs-initrd.json"
quote ecdsa 0x81010002 initrd sha256:$initrd_sel
quote rsassa 0x81010003 initrd sha256:$initrd_sel
quote rsapss 0x81010004 initrd sha256:$initrd_sel rsapss
quote ecdsa 0x81010002 sha1 sha1:$initrd_sel
quote ecdsa 0x81010002 partial sha256:0,1,2,3,4,5,6,7
pcr11_initrd=$(tpm2_pcrread sha256:11 -o "$work/p11" >/dev/null && hexof "$work/p11")
flush

measure "$uslog" 11 leave-initrd phase
measure "$uslog" 15 "machine-id:$(sha machine-id | cut -c1-32)" machine-id
measure "$uslog" 11 sysinit phase
measure "$uslog" 13 "$sysext"
measure "$uslog" 11 ready phase
cp "$uslog" "$here/tpm2-measure-ready.log"

pcrs_json $ready_sel "$here/pcrs-ready.json"
quote ecdsa 0x81010002 ready sha256:$ready_sel
quote rsassa 0x81010003 ready sha256:$ready_sel
quote rsapss 0x81010004 ready sha256:$ready_sel rsapss
v=$(hexof "$work/pcrs-ready.bin")
pcr() { # index among ready_sel → hex
        local k=0 i
        for i in ${ready_sel//,/ }; do
                [ "$i" = "$1" ] && { printf '%s' "${v:$((k * 64)):64}"; return; }
                k=$((k + 1))
        done
}

printf '%s' "$nonce" >"$here/nonce.hex"
printf '%s' "$sysext" >"$here/sysext.txt"
cat >"$here/policy.json" <<EOF
{
  "image_id": "giantswarm-vm-base",
  "image_version": "0.1.0",
  "uki": "giantswarm-vm-base_0.1.0.efi",
  "roothash": "$(sha roothash)",
  "pcr11": {
    "enter-initrd": "$pcr11_initrd",
    "enter-initrd:leave-initrd:sysinit:ready": "$(pcr 11)"
  },
  "pcr13": {
    "$kube": "$(pcr 13)"
  },
  "golden": {
    "sha256": {
      "0": "$(pcr 0)",
      "2": "$(pcr 2)",
      "3": "$(pcr 3)",
      "4": "$(pcr 4)",
      "6": "$(pcr 6)",
      "7": "$(pcr 7)"
    }
  },
  "golden_firmware": {
    "sha256": "$(sha "OVMF fixture")",
    "package": "ovmf",
    "version": "2022.11-6+deb12u2"
  }
}
EOF

# Fuzz seeds. attest-request: POST /attest/quote bodies as the agent sends them (ak_pub as TPMT or
# TPM2B, both logs). attest-quote: the layout fuzz-attest-quote.c splits, <flags> <len quote>
# <len signature> <len ak_pub> quote signature ak_pub <32-byte PCR values of the selection,
# ascending> <len firmware log, 32 bits> firmware log <userspace log>; the flags (see there) make a
# seed verify (4: golden from the values; 117: ready, golden, pcr13, kubernetes, pinned), learn (2),
# mismatch golden 0 (12) or meet another pinned AK (132). attest-firmware-log and
# attest-userspace-log: the logs, and variants of them the parsers must take or refuse.
rm -rf "$corpus/attest-request" "$corpus/attest-quote" "$corpus/attest-firmware-log" "$corpus/attest-userspace-log"
mkdir -p "$corpus/attest-request" "$corpus/attest-quote" "$corpus/attest-firmware-log" "$corpus/attest-userspace-log"
b64() {
        base64 -w0 "$1"
}
request() { # dir stage out [tpmt]
        local ak=$here/$1/ak.pub
        if [ -n "${4:-}" ]; then
                tail -c +3 "$ak" >"$work/tpmt"
                ak=$work/tpmt
        fi
        printf '{"stage":"%s","nonce":"%s","ak_pub":"%s","quote":"%s","signature":"%s","pcrs":%s,' \
                "$2" "$nonce" "$(b64 "$ak")" "$(b64 "$here/$1/$2.msg")" "$(b64 "$here/$1/$2.sig")" \
                "$(cat "$here/pcrs-$2.json")" >"$corpus/attest-request/$3"
        printf '"event_log":"%s","userspace_log":"%s"}\n' "$(b64 "$here/firmware.log")" \
                "$(b64 "$here/tpm2-measure-$2.log")" >>"$corpus/attest-request/$3"
}
request ecdsa initrd initrd-ecdsa tpmt
request rsassa initrd initrd-rsassa
request rsapss ready ready-rsapss tpmt
request ecdsa ready ready-ecdsa
printf '%s' '{"stage":"boot","nonce":1}' >"$corpus/attest-request/bad-stage"
printf '%s' '{"Stage":"initrd","nonce":"00","quote":"AA=A\n"} trailing' >"$corpus/attest-request/bad-base64"
printf '%s' '{"stage":"ready","nonce":"ab","quote":"AQ==","signature":"Ag==","ak_pub":"Aw==","pcrs":{"sha1":{"0":"zz"},"sha256":null}}' \
        >"$corpus/attest-request/tiny"
u32() { # a 32-bit big-endian length as four raw bytes
        u16 $(($1 >> 16))
        u16 $(($1 & 65535))
}
seed() { # dir stage flags out
        local q=$here/$1/$2.msg s=$here/$1/$2.sig a=$here/$1/ak.pub
        {
                printf '%b' "\\$(printf %03o "$3")"
                u16 "$(stat -c %s "$q")"
                u16 "$(stat -c %s "$s")"
                u16 "$(stat -c %s "$a")"
                cat "$q" "$s" "$a" "$work/pcrs-$2.bin"
                u32 "$(stat -c %s "$here/firmware.log")"
                cat "$here/firmware.log" "$here/tpm2-measure-$2.log"
        } >"$corpus/attest-quote/$4"
}
seed ecdsa initrd 4 initrd-ecdsa
seed rsassa initrd 4 initrd-rsassa
seed rsapss initrd 2 initrd-rsapss-learn
seed rsassa initrd 12 initrd-rsassa-golden-mismatch
seed ecdsa initrd 132 initrd-ecdsa-other-pin
seed ecdsa ready 117 ready-ecdsa
seed rsapss ready 117 ready-rsapss
cp "$here/tpm2-measure-initrd.log" "$here/tpm2-measure-ready.log" "$corpus/attest-userspace-log/"
cp "$here/firmware.log" "$corpus/attest-firmware-log/ovmf"
python3 - "$here/firmware.log" "$here/tpm2-measure-ready.log" "$corpus" <<'PY'
import struct, sys
fw, us, corpus = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), sys.argv[3]
def put(d, name, data):
    open("%s/%s/%s" % (corpus, d, name), "wb").write(data)
# the header: TCG_PCR_EVENT (pcr, type, sha1 digest, size) and its Spec ID data
size = struct.unpack_from("<I", fw, 28)[0]
header, events = fw[:32 + size], fw[32 + size:]
algs = [struct.unpack_from("<HH", header, 32 + 28 + 4 * i) for i in range(struct.unpack_from("<I", header, 32 + 24)[0])]
def event2(pcr, etype, data):
    digests = b"".join(struct.pack("<H", a) + bytes(n) for a, n in algs)
    return struct.pack("<III", pcr, etype, len(algs)) + digests + struct.pack("<I", len(data)) + data
locality = event2(0, 3, b"StartupLocality\0" + bytes([3]))
put("attest-firmware-log", "startup-locality-3", header + locality + events)
put("attest-firmware-log", "locality-after-pcr0", header + events + locality)
put("attest-firmware-log", "zero-padded", fw + bytes(4096))
put("attest-firmware-log", "truncated", fw[:-50])
put("attest-firmware-log", "sha1-log", struct.pack("<II", 0, 8) + bytes(20) + struct.pack("<I", 2) + b"\0\0")
put("attest-firmware-log", "unknown-alg", header + struct.pack("<III", 4, 13, 1) + struct.pack("<H", 0x99) + bytes(32) + struct.pack("<I", 0))
put("attest-firmware-log", "no-sha256", header + struct.pack("<III", 4, 13, 0) + struct.pack("<I", 0))
put("attest-firmware-log", "pcr-24", header + event2(24, 13, b"x"))
put("attest-userspace-log", "being-written", us + b'\x1e{"pcr":11,"digests":[{"hashAlg":"sha256","dig')
put("attest-userspace-log", "nv-index", us + b'\x1e{"nv_index":25165825,"digests":[{"hashAlg":"sha256","digest":"' + b"ab" * 32 + b'"}],"content_type":"systemd","content":{"nvIndexName":"verity","string":"verity:root"}}\n')
put("attest-userspace-log", "pcr-24", b'\x1e{"pcr":24,"digests":[]}\n')
put("attest-userspace-log", "no-separator", b'{"pcr":11,"digests":[]}\n')
put("attest-userspace-log", "not-json", us + b"\x1e{pcr:11}\n\x1e{}\n")
put("attest-userspace-log", "short-digest", b'\x1e\n\x1e{"pcr":0,"digests":[{"hashAlg":"sha1","digest":"00"},{"hashAlg":"sha256","digest":"0g"}]}\n')
PY
chmod 644 "$here"/*/*.pub "$here"/*/*.msg "$here"/*/*.sig
echo "fixtures written to $here"
