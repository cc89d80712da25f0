#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""vm-agent against a swtpm: `pcrs`, and `attest --print` checked independently with tpm2-tools
(tpm2_checkquote over the printed quote, signature, PCR values and nonce; tpm2_readpublic and
tpm2_createek for the keys). Also the reuse of the persistent AK, a persisted EK, the event logs
(through the cmd TCTI, since the agent leaves them out for a swtpm socket) and a foreign key at the
AK's handle.

Skips when swtpm or tpm2-tools are missing.
"""

import base64
import json
import os
import re
import struct
import sys

import agenttest
from agenttest import TPM2_ALG_ECC, TPM2_ALG_ECDSA, TPM2_ALG_SHA256, b64

HERE = os.path.dirname(os.path.abspath(__file__))
NONCE = "5d0c7f1e3a9b8c2d4e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5"
AK_ATTRIBUTES = 0x00050472  # fixedTPM|fixedParent|sensitiveDataOrigin|userWithAuth|noDA|restricted|sign
INITRD = [0, 1, 2, 3, 4, 5, 6, 7, 11, 12]
READY = INITRD + [13]


def pcrread(tpm, indexes, path):
    tpm.tool("tpm2_pcrread", "sha256:" + ",".join(map(str, indexes)), "-o", path)
    data = open(path, "rb").read()
    return [data[i:i + 32] for i in range(0, len(data), 32)]


def checkquote(tpm, workdir, name, req, indexes, pubkey, nonce, pcr_values=None):
    """tpm2_checkquote over the request's quote and signature, with the printed PCR values (or
    pcr_values) and nonce. Returns the CompletedProcess."""
    msg, sig, pcrs = (os.path.join(workdir, "%s.%s" % (name, ext)) for ext in ("msg", "sig", "pcrs"))
    open(msg, "wb").write(b64(req["quote"]))
    open(sig, "wb").write(b64(req["signature"]))
    if pcr_values is None:
        pcr_values = [bytes.fromhex(req["pcrs"]["sha256"][str(i)]) for i in indexes]
    open(pcrs, "wb").write(agenttest.tools_pcr_file(TPM2_ALG_SHA256, indexes, pcr_values))
    return tpm.tool("tpm2_checkquote", "-u", pubkey, "-m", msg, "-s", sig, "-f", pcrs, "-g", "sha256",
                    "-q", nonce, check=False)


def test(tap, workdir):
    tpm = agenttest.Swtpm(workdir)
    try:
        run(tap, workdir, tpm)
    finally:
        tpm.close()


def run(tap, workdir, tpm):
    r = agenttest.run_agent(["version"])
    tap.ok(r.rc == 0 and re.fullmatch(r"vm-agent version \S+\n  commit: \S+\n  built:  \S+\n", r.out),
           "version prints the version, the commit and the build time", r)

    # Make the PCRs worth quoting: a firmware-like PCR 0 and 7, the phase PCR 11 and the sysext PCR 13.
    for i, word in ((0, "firmware"), (7, "secureboot"), (11, "enter-initrd"), (13, "os-separator")):
        tpm.tool("tpm2_pcrextend", "%d:sha256=%s" % (i, (word.encode().hex() * 32)[:64]))

    # 1. pcrs
    r = agenttest.run_agent(["pcrs", "--tpm=" + tpm.tcti])
    lines = r.out.splitlines()
    want = pcrread(tpm, range(24), os.path.join(workdir, "all.pcrs"))
    tap.ok(r.rc == 0 and len(lines) == 24, "pcrs prints 24 lines", r)
    tap.ok(lines == ["%2d: %s" % (i, want[i].hex()) for i in range(24)],
           "pcrs prints '%2d: <hex>' with the values tpm2_pcrread reads", r)
    r = agenttest.run_agent(["pcrs", "--bank=sha1", "--tpm=" + tpm.sock])
    tap.ok(r.rc == 0 and len(r.out.splitlines()) == 24
           and all(re.fullmatch(r"[ 12]\d: [0-9a-f]{40}", l) for l in r.out.splitlines()),
           "pcrs --bank=sha1 with the socket path as --tpm prints 20-byte values", r)
    r = agenttest.run_agent(["pcrs", "--bank=md5", "--tpm=" + tpm.tcti])
    tap.ok(r.rc == 1 and 'unknown pcr bank "md5"' in r.err, "pcrs refuses an unknown bank", r)
    r = agenttest.run_agent(["pcrs", "--tpm=swtpm:path=" + os.path.join(workdir, "nothing")])
    tap.ok(r.rc == 1 and r.err.startswith("Error: open tpm"), "pcrs fails on a TPM that is not there", r)

    # 2. attest --print, checked with tpm2-tools
    r = agenttest.run_agent(["-v", "attest", "--stage=initrd", "--print", "--nonce=" + NONCE, "--tpm=" + tpm.tcti])
    if not tap.ok(r.rc == 0, "attest --print --nonce succeeds without an IMDS", r):
        return
    tap.ok("created the attestation key at 0x81010002" in r.err, "the first run creates the AK", r.err)
    # Before any tool runs that flushes what is loaded: swtpm has no resource manager.
    handles = tpm.transient_handles()
    tap.ok(handles == [], "no transient object is left in the TPM (SRK, AK, EK flushed)", handles)
    req = json.loads(r.out)
    tap.ok(list(req) == ["stage", "nonce", "ak_pub", "ek_pub", "quote", "signature", "pcrs"],
           "the request has the QuoteRequest fields, no event logs for a swtpm", list(req))
    tap.ok(req["stage"] == "initrd" and req["nonce"] == NONCE, "stage and nonce are echoed", req)
    try:
        ak_pub, ek_pub, quote, sig = (b64(req[k]) for k in ("ak_pub", "ek_pub", "quote", "signature"))
        tap.ok(True, "ak_pub, ek_pub, quote and signature are standard padded base64")
    except ValueError as e:
        tap.ok(False, "ak_pub, ek_pub, quote and signature are standard padded base64", e)
        return
    tap.ok(list(req["pcrs"]) == ["sha256"] and list(map(int, req["pcrs"]["sha256"])) == INITRD,
           "pcrs carries the sha256 bank, PCRs 0-7, 11 and 12", req["pcrs"])
    want = pcrread(tpm, INITRD, os.path.join(workdir, "initrd.pcrs"))
    tap.ok([req["pcrs"]["sha256"][str(i)] for i in INITRD] == [v.hex() for v in want],
           "the printed PCR values are the TPM's (lower-case hex)", req["pcrs"])

    att = agenttest.parse_attest(quote)
    tap.ok(att["magic"] == 0xFF544347 and att["type"] == 0x8018 and att["rest"] == 0,
           "quote is a bare TPMS_ATTEST of a quote (no size prefix)", att)
    tap.ok(att["extra"] == bytes.fromhex(NONCE), "the quote's qualifying data is the decoded nonce", att)
    tap.ok(att["selections"] == [(TPM2_ALG_SHA256, INITRD)], "the quote selects sha256 PCRs 0-7, 11 and 12", att)
    tap.ok(struct.unpack_from(">HH", sig) == (TPM2_ALG_ECDSA, TPM2_ALG_SHA256) and len(sig) == 72,
           "signature is a marshalled TPMT_SIGNATURE, ECDSA with SHA-256", sig.hex())
    pub = agenttest.parse_public(ak_pub)
    tap.ok(pub == {"type": TPM2_ALG_ECC, "nameAlg": TPM2_ALG_SHA256, "attributes": AK_ATTRIBUTES},
           "ak_pub is a TPMT_PUBLIC of the AK template", pub)

    tss = tpm.tool("tpm2_readpublic", "-c", "0x81010002", "-o", os.path.join(workdir, "ak.tss"))
    tpm.tool("tpm2_readpublic", "-c", "0x81010002", "-f", "pem", "-o", os.path.join(workdir, "ak.pem"))
    tap.ok(open(os.path.join(workdir, "ak.tss"), "rb").read()[2:] == ak_pub,
           "ak_pub is the public area tpm2_readpublic reads at 0x81010002", tss.stdout)
    ek_file = os.path.join(workdir, "ek.pub")
    tpm.tool("tpm2_createek", "-c", "-", "-G", "rsa", "-u", ek_file)
    tap.ok(ek_pub == open(ek_file, "rb").read(),
           "ek_pub is the TPM2B_PUBLIC of tpm2_createek's RSA-2048 EK", ek_pub.hex())

    p = checkquote(tpm, workdir, "initrd", req, INITRD, os.path.join(workdir, "ak.pem"), NONCE)
    tap.ok(p.returncode == 0, "tpm2_checkquote verifies the quote with the AK's PEM, the pcrs and the nonce",
           p.stderr)
    ak_tss = os.path.join(workdir, "ak-from-request.tss")
    open(ak_tss, "wb").write(struct.pack(">H", len(ak_pub)) + ak_pub)
    p = checkquote(tpm, workdir, "initrd2", req, INITRD, ak_tss, NONCE)
    tap.ok(p.returncode == 0, "... and with the request's own ak_pub", p.stderr)
    p = checkquote(tpm, workdir, "wrongnonce", req, INITRD, ak_tss, "00" + NONCE[2:])
    tap.ok(p.returncode != 0, "tpm2_checkquote refuses another nonce", p.stdout)
    bad = [bytes.fromhex(req["pcrs"]["sha256"][str(i)]) for i in INITRD]
    bad[INITRD.index(11)] = bytes(32)
    p = checkquote(tpm, workdir, "wrongpcr", req, INITRD, ak_tss, NONCE, pcr_values=bad)
    tap.ok(p.returncode != 0, "tpm2_checkquote refuses a PCR 11 value other than the quoted one", p.stdout)

    # A second run reuses the persistent AK.
    r = agenttest.run_agent(["-v", "attest", "--stage=ready", "--print", "--nonce=" + NONCE.upper(), "--tpm=" + tpm.tcti])
    req2 = json.loads(r.out) if r.rc == 0 else {}
    tap.ok(r.rc == 0 and req2.get("ak_pub") == req["ak_pub"] and "created the attestation key" not in r.err,
           "a second run reuses the persistent AK (same ak_pub)", r)
    tap.ok(list(map(int, req2.get("pcrs", {}).get("sha256", {}))) == READY,
           "stage ready quotes PCRs 0-7, 11, 12 and 13", req2.get("pcrs"))
    if req2:
        p = checkquote(tpm, workdir, "ready", req2, READY, os.path.join(workdir, "ak.pem"), NONCE)
        tap.ok(p.returncode == 0, "tpm2_checkquote verifies the ready quote (11 PCRs, two PCR_Read rounds)",
               p.stderr)

    # An EK the TPM persists at 0x81010001 is read rather than derived.
    tpm.tool("tpm2_createek", "-c", "0x81010001", "-G", "rsa", "-u", ek_file)
    r = agenttest.run_agent(["-v", "attest", "--stage=initrd", "--print", "--nonce=" + NONCE, "--tpm=" + tpm.tcti])
    tap.ok(r.rc == 0 and b64(json.loads(r.out)["ek_pub"]) == open(ek_file, "rb").read()
           and "reading the endorsement key at 0x81010001" in r.err,
           "the EK persisted at 0x81010001 is the one sent", r)

    # Event logs: through the cmd TCTI (a pipe to the swtpm) the TPM is no simulator any more.
    cmd_tcti = "cmd:%s %s %s" % (sys.executable, os.path.join(HERE, "tcti-proxy.py"), tpm.sock)
    firmware = os.path.join(workdir, "binary_bios_measurements")
    userspace = os.path.join(workdir, "tpm2-measure.log")
    open(firmware, "wb").write(os.urandom(70000))
    open(userspace, "wb").write(b'\x1e{"content_type":"phase","content":{"string":"enter-initrd"}}\n')
    env = {"VM_AGENT_EVENT_LOG": firmware, "VM_AGENT_USERSPACE_LOG": userspace}
    r = agenttest.run_agent(["attest", "--stage=initrd", "--print", "--nonce=" + NONCE, "--tpm=" + cmd_tcti], env=env)
    req3 = json.loads(r.out) if r.rc == 0 else {}
    tap.ok(req3 and b64(req3.get("event_log", "")) == open(firmware, "rb").read()
           and b64(req3.get("userspace_log", "")) == open(userspace, "rb").read(),
           "the firmware and userspace logs are attached when the TPM is not a swtpm socket", r)
    os.unlink(userspace)
    r = agenttest.run_agent(["attest", "--stage=initrd", "--print", "--nonce=" + NONCE, "--tpm=" + cmd_tcti], env=env)
    req3 = json.loads(r.out) if r.rc == 0 else {}
    tap.ok(req3 and "event_log" in req3 and "userspace_log" not in req3, "a missing log is left out", r)
    open(firmware, "wb").write(bytes(4 * 1024 * 1024 + 1))
    r = agenttest.run_agent(["attest", "--stage=initrd", "--print", "--nonce=" + NONCE, "--tpm=" + cmd_tcti], env=env)
    tap.ok(r.rc == 1 and "larger than 4194304 bytes" in r.err, "a log over 4 MiB is an error", r)

    r = agenttest.run_agent(["attest", "--stage=initrd", "--print", "--nonce=xyz", "--tpm=" + tpm.tcti])
    tap.ok(r.rc == 1 and r.err == "Error: build quote: nonce is not hex\n", "a nonce that is not hex is refused", r)

    # A key at 0x81010002 that the agent did not create is refused, not adopted.
    tpm.tool("tpm2_evictcontrol", "-C", "o", "-c", "0x81010002")
    ctx = os.path.join(workdir, "primary.ctx")
    tpm.tool("tpm2_createprimary", "-C", "o", "-G", "ecc", "-c", ctx)
    tpm.tool("tpm2_evictcontrol", "-C", "o", "-c", ctx, "0x81010002")
    r = agenttest.run_agent(["attest", "--stage=initrd", "--print", "--nonce=" + NONCE, "--tpm=" + tpm.tcti])
    tap.ok(r.rc == 1 and "persistent object is not the vm-manager attestation key" in r.err and r.out == "",
           "a foreign key at 0x81010002 is refused", r)


if __name__ == "__main__":
    agenttest.main(test, need=("swtpm", "tpm2_checkquote", "tpm2_readpublic", "tpm2_createek"))
