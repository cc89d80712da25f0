#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Firmware runs as the daemon makes them (src/core/manager-firmware.c), with the real helper
(`vm-manager firmware-run`) and a fake QEMU that prints the console of a recorded real run
(tests/fuzz/corpus/attest-fwlog/run-console) instead of booting:

- at start-up the daemon runs the firmware once for create_vm's default shape, keeps the result in
  <state>/firmware/, and get_host's firmwareRuns says so; a restart reuses it without a run; another
  OVMF build (--ovmf-code) gets a run of its own;
- a quote that arrives while the run of its VM's shape is going is not answered "still going"
  (the agent would give up for good): its answer waits for the run, then judges the quote with the
  run's result; after a failed run, with the image's golden values;
- with a variable store template without keys, PCR 7 is predicted from it; a run whose PCR 7 has
  SecureBoot off in edk2 2025.02's form (no data: Debian 13) puts that form into the prediction,
  said once per start; a run that differs in more than that leaves the prediction as it is."""

import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, HOST, api, base_env, free_port, imds_relay, run, tap  # noqa: E402

FAKES = os.path.join(here, "fakes")
CONSOLE = os.path.join(here, "..", "fuzz", "corpus", "attest-fwlog", "run-console")
ZERO = "00" * 32


def firmware_file(work, name, fill):
    path = os.path.join(work, name)
    with open(path, "wb") as f:
        f.write(fill * 4096)
    return path, hashlib.sha256(fill * 4096).hexdigest()


def setup(work):
    """The image directory (an image whose policy has golden zeros), the fake helpers' files, and
    the environment: firmware runs on, the fake QEMU and swtpm on PATH."""
    images = os.path.join(work, "images")
    os.makedirs(images, exist_ok=True)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    policy = {"image_id": "fake", "image_version": "1.0",
              "pcr11": {"enter-initrd": ZERO, "enter-initrd:leave-initrd:sysinit:ready": ZERO},
              "golden": {"sha256": {str(i): ZERO for i in (0, 2, 3, 4, 6, 7)}}}
    with open(os.path.join(images, "fake_1.0.policy.json"), "w") as f:
        json.dump(policy, f)
    kernel = os.path.join(work, "vmlinuz")
    init = os.path.join(work, "fwlog-init")
    for path in (kernel, init):
        with open(path, "wb") as f:
            f.write(b"not booted by the fake QEMU\n")
    runs = os.path.join(work, "firmware-runs")
    env = base_env(work, FAKE_QEMU="install-exit:0", FAKE_FIRMWARE_CONSOLE=CONSOLE, FAKE_FIRMWARE_RUNS=runs,
                   VM_MANAGER_FIRMWARE_RUN="true", VM_MANAGER_FIRMWARE_KERNEL=kernel,
                   VM_MANAGER_FWLOG_INIT=init)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    return images, env, runs


def plain_store(work):
    """A variable store template without any variable (no Secure Boot keys): a firmware volume of
    4 KiB with an empty authenticated variable store."""
    d = bytearray(b"\xff" * 4096)
    d[0:72] = bytes(72)
    struct.pack_into("<Q", d, 32, len(d))
    d[40:44] = b"_FVH"
    struct.pack_into("<H", d, 48, 72)
    d[72:88] = bytes.fromhex("782cf3aa7b949a43a1802e144ec37792")
    struct.pack_into("<I", d, 88, len(d) - 72)
    d[92:100] = b"\x5a\xfe" + bytes(6)
    path = os.path.join(work, "vars-plain")
    with open(path, "wb") as f:
        f.write(d)
    return path


BANKS = {0x4: hashlib.sha1, 0xB: hashlib.sha256, 0xC: hashlib.sha384, 0xD: hashlib.sha512}


def console_log(path):
    """The TCG2 log of a console's vmm-fwlog lines."""
    hexes, on = [], False
    with open(path, "rb") as f:
        for line in f.read().decode("latin-1").splitlines():
            at = line.find("vmm-fwlog: ")
            word = line[at + 11:].strip() if at >= 0 else ""
            if word == "begin":
                on = True
            elif word.startswith("end"):
                break
            elif on and word:
                hexes.append(word)
    return bytes.fromhex("".join(hexes))


def rewrite_pcr7(log, change):
    """The log with each PCR 7 event's data passed through change(number, data) (number counting
    PCR 7's events from 0), its digests made anew; and the sha256 digests of PCR 7's events."""
    size = struct.unpack_from("<I", log, 28)[0]  # the header event's (TCG_PCR_EVENT)
    out, off, n, pcr7 = bytearray(log[:32 + size]), 32 + size, 0, []
    while off < len(log):
        pcr, kind, count = struct.unpack_from("<III", log, off)
        p, algs = off + 12, []
        for _ in range(count):
            alg = struct.unpack_from("<H", log, p)[0]
            algs.append(alg)
            p += 2 + BANKS[alg]().digest_size
        length = struct.unpack_from("<I", log, p)[0]
        data = log[p + 4:p + 4 + length]
        if pcr == 7:
            data = change(n, data)
            n += 1
            head = bytearray(struct.pack("<III", pcr, kind, count))
            for alg in algs:
                head += struct.pack("<H", alg) + BANKS[alg](data).digest()
            out += head + struct.pack("<I", len(data)) + data
            pcr7.append(hashlib.sha256(data).digest())
        else:
            out += log[off:p + 4 + length]
        off = p + 4 + length
    return bytes(out), pcr7


def write_console(path, log):
    with open(path, "w") as f:
        f.write("vmm-fwlog: begin\r\n")
        for i in range(0, len(log), 48):
            f.write("vmm-fwlog: %s\r\n" % log[i:i + 48].hex())
        f.write("vmm-fwlog: end %d\r\n" % len(log))


def pcr_value(digests):
    pcr = bytes(32)
    for d in digests:
        pcr = hashlib.sha256(pcr + d).digest()
    return pcr.hex()


def no_data(n, data):
    """SecureBoot as edk2 2025.02 measures it in a store without the variable: UEFI_VARIABLE_DATA
    with VariableDataLength 0 and no data (2022.11: length 1, the byte 0)."""
    if n != 0:
        return data
    name_len = struct.unpack_from("<Q", data, 16)[0]
    return data[:24] + struct.pack("<Q", 0) + data[32:32 + 2 * name_len]


def runs_made(path):
    try:
        with open(path) as f:
            return f.read().split("\n")[:-1]
    except FileNotFoundError:
        return []


def firmware_runs(port):
    status, host = api(port, "GET", "/host")
    return host.get("firmwareRuns", {}) if status == 200 else {}


def wait_run(port, mib, cpus, states=("known", "failed"), timeout=60):
    """The run of that shape in get_host once it is in one of states, else None."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for r in firmware_runs(port).get("runs", []):
            if r["memoryMiB"] == mib and r["cpus"] == cpus and r["state"] in states:
                return r
        time.sleep(0.3)
    return None


def test_cache(work):
    work = os.path.join(work, "cache")
    os.makedirs(work)
    images, env, runs = setup(work)
    code_a, sha_a = firmware_file(work, "code-a", b"a")
    code_b, sha_b = firmware_file(work, "code-b", b"b")
    vars_, _ = firmware_file(work, "vars", b"\0")
    state = os.path.join(work, "state")
    port = free_port()

    def daemon(name, code):
        args = ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                "--ovmf-code", code, "--ovmf-vars", vars_, "--launcher", "process"]
        d = Daemon(work, name, args, env=env)
        ok, why = d.wait_healthy(port, timeout=20)
        return d, ok, why

    d, ok, why = daemon("cache1", code_a)
    try:
        run_ = wait_run(port, 2048, 2) if ok else None
        accel = (run_ or {}).get("accel", "?")
        entry = os.path.join(state, "firmware", "%s-2048m-2c-%s.json" % (sha_a, accel))
        cached = json.load(open(entry)) if os.path.exists(entry) else {}
        tap.result(ok and run_ is not None and run_["state"] == "known" and run_.get("pcrs") == [0, 2, 3, 6]
                   and runs_made(runs) == ["2048M 2"] and cached.get("firmwareSha256") == sha_a
                   and [e["type"] for e in cached.get("pcrs", {}).get("0", [])] == [0x8, 0x80000008, 0x80000008, 0x4],
                   "at start-up the daemon runs the firmware once for 2048 MiB, 2 CPUs and caches its events",
                   "%s %r runs %r entry %r" % (why, run_, runs_made(runs), sorted(cached)))
    finally:
        d.stop(signal.SIGTERM, timeout=30)

    d, ok, why = daemon("cache2", code_a)
    try:
        known = ok and wait_run(port, 2048, 2, timeout=1)
        time.sleep(2)  # a run it would start now would have reached the fake QEMU by then
        tap.result(bool(known) and known["state"] == "known" and runs_made(runs) == ["2048M 2"],
                   "after a restart the cached run is reused: known at once, no second run",
                   "%s %r runs %r" % (why, known, runs_made(runs)))
    finally:
        d.stop(signal.SIGTERM, timeout=30)

    d, ok, why = daemon("cache3", code_b)
    try:
        run_ = wait_run(port, 2048, 2) if ok else None
        accel = (run_ or {}).get("accel", "?")
        files = sorted(os.listdir(os.path.join(state, "firmware")))
        want = sorted("%s-2048m-2c-%s.%s" % (sha, accel, ext) for sha in (sha_a, sha_b) for ext in ("json", "log"))
        tap.result(bool(run_) and run_["state"] == "known" and runs_made(runs) == ["2048M 2", "2048M 2"]
                   and files == want,
                   "another OVMF build (--ovmf-code) gets a run and a cache entry of its own",
                   "%s %r runs %r files %r" % (why, run_, runs_made(runs), files))
    finally:
        d.stop(signal.SIGTERM, timeout=30)


def test_held_quote(work):
    agent = os.environ.get("VM_AGENT")
    if not agent or not os.access(agent, os.X_OK) or not all(shutil.which(t) for t in ("swtpm", "swtpm_setup")):
        tap.skip("a quote held for the firmware run", "needs agent/vm-agent, swtpm and swtpm_setup")
        return
    work = os.path.join(work, "held")
    os.makedirs(work)
    images, env, runs = setup(work)
    vars_, _ = firmware_file(work, "vars", b"\0")
    state = os.path.join(work, "state")
    port = free_port()
    procs = {"daemon": None, "swtpm": None}

    def daemon(name, code, **extra):
        args = ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                "--ovmf-code", code, "--ovmf-vars", vars_, "--launcher", "process"]
        procs["daemon"] = Daemon(work, name, args, env=dict(env, **extra))
        return procs["daemon"].wait_healthy(port, timeout=20)

    def imds_url(vid):
        for _ in range(100):
            try:
                socket.socket(socket.AF_UNIX).connect(os.path.join(state, "vms", vid, "imds.sock"))
                break
            except OSError:
                time.sleep(0.1)
        return "http://127.0.0.1:%d/giantswarm/v1" % imds_relay(os.path.join(state, "vms", vid, "imds.sock"))

    def attest(url, tcti):
        t0 = time.monotonic()
        p = subprocess.run([agent, "attest", "--stage=initrd", "--imds-url=" + url, "--tpm=" + tcti,
                            "--timeout=60s"], capture_output=True, text=True,
                           env=dict(os.environ, TSS2_LOG="all+none"), timeout=120)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0

    code_a, _ = firmware_file(work, "code-a", b"a")
    try:
        # The default shape's run is made at once; the VM's shape (512 MiB, 1 CPU) gets its run
        # from its first quote, slowed to 20 s: longer than the IMDS keeps an idle connection.
        ok, why = daemon("held1", code_a, FAKE_FIRMWARE_DELAY="0")
        ok = ok and wait_run(port, 2048, 2) is not None
        status, vm = api(port, "POST", "/vms", {"name": "held", "memory_mib": 512, "cpus": 1, "disk_gib": 1,
                                                       "require_attestation": False, "wait_for": "installed"})
        tap.result(ok and status == 201, "serving, a VM of 512 MiB and 1 CPU", "%s %d %r" % (why, status, vm))
        if status != 201:
            return
        vid = vm["id"]
        guest = os.path.join(work, "guest-tpm")
        shutil.copytree(os.path.join(state, "vms", vid, "tpm"), guest,
                        ignore=shutil.ignore_patterns("*.sock", "*.sock.ctrl"))
        sock = os.path.join(guest, "guest.sock")
        procs["swtpm"] = subprocess.Popen(
            ["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + guest, "--server", "type=unixio,path=" + sock,
             "--ctrl", "type=unixio,path=" + sock + ".ctrl", "--flags", "not-need-init,startup-clear"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        tcti = "swtpm:path=" + sock
        procs["daemon"].stop(signal.SIGTERM, timeout=30)

        ok, why = daemon("held2", code_a, FAKE_FIRMWARE_DELAY="20")
        api(port, "POST", "/vms/%s/start" % vid)
        url = imds_url(vid)
        # a quote the guest gave up on (posted by hand, held like any other) is answered 503 once the
        # agent's next quote takes its place
        early = socket.create_connection(("127.0.0.1", int(url.split(":")[2].split("/")[0])), timeout=60)
        early.sendall(b"POST /giantswarm/v1/attest/quote HTTP/1.1\r\nHost: 169.254.169.254\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        time.sleep(1)
        rc, out, took = attest(url, tcti)
        answer = b""
        try:
            while True:
                chunk = early.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except OSError as e:
            answer += repr(e).encode()
        early.close()
        tap.result(answer.startswith(b"HTTP/1.1 503") and b"superseded by a newer quote of this vm" in answer,
                   "a held quote is answered 503 \"superseded\" when the VM's next quote arrives", repr(answer[:400]))
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        ini = att.get("initrd", {})
        run_ = wait_run(port, 512, 1, timeout=1)
        # The guest's log has no firmware events (its swtpm's PCRs are zero): the run's events show.
        tap.result(ok and rc == 2 and took >= 18 and run_ and run_["state"] == "known"
                   and ini.get("verified") is False and "pcr 0" in ini.get("message", "")
                   and "still going" not in out and runs_made(runs)[-1] == "512M 1",
                   "a quote during the run of its shape is answered once the run is done, against its events",
                   "rc %d in %.1f s %r %r %s" % (rc, took, run_, ini, out[-500:]))
        procs["daemon"].stop(signal.SIGTERM, timeout=30)

        # Another firmware build: a new run for the VM's shape, which fails after 5 s. The held
        # quote is then judged with the image's golden values, which it matches.
        code_c, _ = firmware_file(work, "code-c", b"c")
        ok, why = daemon("held3", code_c, FAKE_FIRMWARE_DELAY="5", FAKE_FIRMWARE_CONSOLE="fail")
        api(port, "POST", "/vms/%s/start" % vid)
        rc, out, took = attest(imds_url(vid), tcti)
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        ini = att.get("initrd", {})
        run_ = wait_run(port, 512, 1, timeout=1)
        tap.result(ok and rc == 0 and took >= 4 and run_ and run_["state"] == "failed"
                   and ini.get("verified") is True,
                   "a quote held for a run that fails is judged with the golden values after it",
                   "rc %d in %.1f s %r %r %s" % (rc, took, run_, ini, out[-500:]))
    finally:
        if procs["daemon"]:
            procs["daemon"].stop(signal.SIGTERM, timeout=30)
        if procs["swtpm"]:
            procs["swtpm"].kill()
            procs["swtpm"].wait()


def test_pcr7(work):
    work = os.path.join(work, "pcr7")
    os.makedirs(work)
    images, env, runs = setup(work)
    vars_ = plain_store(work)
    state = os.path.join(work, "state")
    port = free_port()
    recorded = console_log(CONSOLE)
    _, pcr7_12 = rewrite_pcr7(recorded, lambda n, data: data)
    log13, pcr7_13 = rewrite_pcr7(recorded, no_data)
    console13 = os.path.join(work, "console-13")
    write_console(console13, log13)
    # SecureBoot in the new form, and PK measured with one byte of data: not the template's
    logx, _ = rewrite_pcr7(recorded, lambda n, data: no_data(n, data) if n == 0 else
                           data[:24] + struct.pack("<Q", 1) + data[32:] + b"\0" if n == 1 else data)
    consolex = os.path.join(work, "console-x")
    write_console(consolex, logx)
    notice = "measures SecureBoot off in its own form"
    differs = "PCR 7 differs from the prediction"

    def daemon(name, code, console):
        args = ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                "--ovmf-code", code, "--ovmf-vars", vars_, "--launcher", "process"]
        d = Daemon(work, name, args, env=dict(env, FAKE_FIRMWARE_CONSOLE=console))
        ok, why = d.wait_healthy(port, timeout=20)
        run_ = wait_run(port, 2048, 2) if ok else None
        return d, ok and run_ is not None and run_["state"] == "known", why or repr(run_)

    code_a, sha_a = firmware_file(work, "code-a", b"a")
    d, ok, why = daemon("pcr7-12", code_a, CONSOLE)
    try:
        err = d.stderr()
        accel = firmware_runs(port).get("runs", [{}])[0].get("accel", "?")
        entry = os.path.join(state, "firmware", "%s-2048m-2c-%s.json" % (sha_a, accel))
        cached = json.load(open(entry)) if os.path.exists(entry) else {}
        tap.result(ok and "PCR 7 expected from the OVMF variable store template" in err
                   and pcr_value(pcr7_12) in err and notice not in err and differs not in err
                   and [bytes.fromhex(e["digest"]) for e in cached.get("pcrs", {}).get("7", [])] == pcr7_12,
                   "a run of edk2 2022.11 (Debian 12) records PCR 7, which is the template's prediction",
                   "%s %r\n%s" % (why, cached.get("pcrs", {}).get("7"), err[-3000:]))
    finally:
        d.stop(signal.SIGTERM, timeout=30)

    code_b, _ = firmware_file(work, "code-b", b"b")
    for name, how in (("pcr7-13", "a run"), ("pcr7-13-cached", "its cache entry after a restart")):
        d, ok, why = daemon(name, code_b, console13)
        try:
            err = d.stderr()
            lines = [line for line in err.splitlines() if notice in line]
            tap.result(ok and len(lines) == 1 and pcr_value(pcr7_13) in lines[0] and differs not in err,
                       "SecureBoot off in edk2 2025.02's form (Debian 13): %s puts it into the PCR 7 "
                       "expected, said once" % how, "%s %r runs %r\n%s" % (why, lines, runs_made(runs), err[-3000:]))
        finally:
            d.stop(signal.SIGTERM, timeout=30)
    tap.result(runs_made(runs) == ["2048M 2", "2048M 2"], "the restart made no run", repr(runs_made(runs)))

    code_c, _ = firmware_file(work, "code-c", b"c")
    d, ok, why = daemon("pcr7-x", code_c, consolex)
    try:
        err = d.stderr()
        lines = [line for line in err.splitlines() if differs in line]
        tap.result(ok and len(lines) == 1 and "event 1" in lines[0] and notice not in err,
                   "a run whose PCR 7 differs beyond SecureBoot leaves the prediction, with a warning",
                   "%s %r\n%s" % (why, lines, err[-3000:]))
    finally:
        d.stop(signal.SIGTERM, timeout=30)


if __name__ == "__main__":
    sys.exit(run([test_cache, test_held_quote, test_pcr7], 280, "vmm-fwd-"))