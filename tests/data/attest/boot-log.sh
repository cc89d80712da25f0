#!/usr/bin/env bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# Records a real firmware event log for the attest fixtures: boots OVMF with a swtpm once, the way
# vm-manager starts a VM (q35, OVMF_CODE_4M, tpm-crb, the GiantSwarm SMBIOS identity), from a disk
# whose ESP holds a UKI on systemd's stub (tests/image/build.sh with capture-init.c as /init), and
# keeps what the guest's kernel saw:
#   firmware.log         /sys/kernel/security/tpm0/binary_bios_measurements (TCG2, crypto agile):
#                        OVMF's measurements, the stub's PCR 11 sections, the kernel's PCR 9 initrd
#   firmware-pcrs.json   {"sha256":{"0":…,"23":…}}, the guest's /sys/class/tpm/tpm0/pcr-sha256/*
# Then gen.sh replays firmware.log into its own swtpm, so the fixture quotes cover real values.
# One boot under TCG, about a minute (ACCEL=kvm where KVM works); never run by the tests.
#   usage: tests/data/attest/boot-log.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
code=${OVMF_CODE:-/usr/share/OVMF/OVMF_CODE_4M.fd}
vars=${OVMF_VARS:-/usr/share/OVMF/OVMF_VARS_4M.fd}

for tool in qemu-system-x86_64 swtpm python3; do
        command -v "$tool" >/dev/null || { echo "boot-log.sh: $tool is missing" >&2; exit 77; }
done
[ -r "$code" ] && [ -r "$vars" ] || { echo "boot-log.sh: $code or $vars is missing (package ovmf)" >&2; exit 77; }

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

# the test image's builder, with capture-init.c as its init
mkdir "$work/image"
cp "$top/tests/image/build.sh" "$work/image/build.sh"
cp "$here/capture-init.c" "$work/image/test-init.c"
TEST_VM_CMDLINE="console=ttyS0,115200 quiet loglevel=1 panic=-1" FORCE=1 \
        bash "$work/image/build.sh" "$work/out" >/dev/null

mkdir "$work/tpm"
swtpm socket --tpm2 --tpmstate dir="$work/tpm" --ctrl type=unixio,path="$work/tpm.sock" --terminate \
        >"$work/swtpm.log" 2>&1 &
swtpm_pid=$!
for _ in $(seq 50); do
        [ -S "$work/tpm.sock" ] && break
        sleep 0.1
done
cp "$vars" "$work/vars.fd"
timeout 300 qemu-system-x86_64 -machine q35 -accel "${ACCEL:-tcg}" -m 512 -smp 1 -nodefaults -no-reboot \
        -display none -monitor none -serial "file:$work/console.log" \
        -drive "if=pflash,format=raw,unit=0,readonly=on,file=$code" \
        -drive "if=pflash,format=raw,unit=1,file=$work/vars.fd" \
        -chardev "socket,id=chrtpm,path=$work/tpm.sock" -tpmdev emulator,id=tpm0,chardev=chrtpm \
        -device tpm-crb,tpmdev=tpm0 \
        -smbios type=1,manufacturer=GiantSwarm,product=vm-manager,serial=attest-fixture \
        -drive "if=virtio,format=raw,readonly=on,file=$work/out/test-vm_1.0.raw"

grep -q '^capture: done' "$work/console.log" || {
        echo "boot-log.sh: the guest did not finish; its console:" >&2
        tail -n 40 "$work/console.log" >&2
        exit 1
}
python3 - "$work/console.log" "$here" <<'EOF'
import json, sys
console, out = sys.argv[1], sys.argv[2]
log, pcrs = bytearray(), {}
for line in open(console, errors="replace"):
    line = line.strip()
    if line.startswith("log:"):
        log += bytes.fromhex(line[4:])
    elif line.startswith("pcr:"):
        _, index, value = line.split(":")
        pcrs[index] = value
if not log or len(pcrs) != 24:
    sys.exit("boot-log.sh: the console has %d log bytes and %d PCRs" % (len(log), len(pcrs)))
open(out + "/firmware.log", "wb").write(log)
with open(out + "/firmware-pcrs.json", "w") as f:
    json.dump({"sha256": pcrs}, f, indent=2)
    f.write("\n")
print("boot-log.sh: firmware.log has %d bytes" % len(log))
EOF
chmod 644 "$here/firmware.log" "$here/firmware-pcrs.json"
