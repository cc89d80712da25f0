#!/usr/bin/env python3
"""vTPMs certified by the host: a new VM's vTPM is manufactured by swtpm_setup (real, through
fakes/swtpm_setup) with an EK certificate of the daemon's own CA (<state>/attest-ca), which chains to
that CA and certifies the EK the vTPM really has; a guest presenting another EK is reported foreign;
a VM record from before EK certificates keeps working and is reported absent."""

import base64
import json
import os
import shutil
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, HOST, base_env, free_port, http_request, imds_relay, run, tap  # noqa: E402

FAKES = os.path.join(here, "fakes")
ZERO = "00" * 32


def api(port, method, path, body=None):
    status, _, data = http_request(port, method, "/api/v1" + path,
                                   body=json.dumps(body).encode() if body is not None else None, timeout=60)
    return status, (json.loads(data) if data else None)


def imds_post(rport, path, body):
    status, _, data = http_request(rport, "POST", "/giantswarm/v1" + path, body=body, timeout=10)
    return status, data


def read_ek_public(work, tpmdir):
    """The EK (TPM2B_PUBLIC) at 0x81010001 of a copy of the VM's vTPM state, read through a real swtpm."""
    copy = os.path.join(work, "tpm-copy")
    shutil.copytree(tpmdir, copy, ignore=shutil.ignore_patterns("*.sock", "*.sock.ctrl"))
    sock = os.path.join(copy, "s.sock")
    sw = subprocess.Popen(["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + copy,
                           "--server", "type=unixio,path=" + sock, "--ctrl", "type=unixio,path=" + sock + ".ctrl",
                           "--flags", "not-need-init,startup-clear"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        out = os.path.join(work, "ek.tss")
        env = dict(os.environ, TPM2TOOLS_TCTI="swtpm:path=" + sock, TSS2_LOG="all+none")
        p = subprocess.run(["tpm2_readpublic", "-c", "0x81010001", "-f", "tss", "-o", out], env=env,
                           capture_output=True, timeout=30)
        if p.returncode != 0:
            return None
        with open(out, "rb") as f:
            return f.read()
    finally:
        sw.terminate()
        sw.wait()


def quote_with_ek(rport, ek_pub):
    """A quote the noop attestor judges by its nonce alone, carrying ek_pub."""
    req = {"stage": "initrd", "nonce": "ab" * 32, "ak_pub": base64.b64encode(b"ak").decode(),
           "quote": base64.b64encode(b"q").decode(), "signature": base64.b64encode(b"s").decode(),
           "pcrs": {"sha256": {"0": ZERO}}, "ek_pub": base64.b64encode(ek_pub).decode()}
    return imds_post(rport, "/attest/quote", json.dumps(req).encode())


def test_ekcert(work):
    tools = [shutil.which(t) for t in ("swtpm", "swtpm_setup", "tpm2_readpublic", "openssl")]
    if not all(tools):
        tap.skip("vTPM EK certificates", "needs swtpm, swtpm_setup (package swtpm-tools), tpm2_readpublic "
                 "(tpm2-tools) and openssl")
        return
    images = os.path.join(work, "images")
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    vars_ = os.path.join(work, "vars")
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="install-exit:0")
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    state = os.path.join(work, "state")
    port = free_port()
    args = ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
            "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process", "--attestation", "noop",
            "--log-level", "debug"]
    d = Daemon(work, "ek", args, env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "serving with the fake QEMU", why)
    if not ok:
        return
    cadir = os.path.join(state, "attest-ca")
    key_mode = os.stat(os.path.join(cadir, "ca-key.pem")).st_mode & 0o777
    tap.result(key_mode == 0o600, "the host CA's key is made at start-up, mode 0600", oct(key_mode))

    t0 = time.monotonic()
    status, vm = api(port, "POST", "/vms", {"name": "ek", "memory_mib": 512, "disk_gib": 1,
                                            "require_attestation": False, "wait_for": "installed"})
    took = time.monotonic() - t0
    tap.result(status == 201, "create_vm with the vTPM manufactured first", repr(vm)[:300])
    if status != 201:
        return
    tap.diag("create_vm to installed, swtpm_setup included: %.2f s" % took)
    vid = vm["id"]
    tpmdir = os.path.join(state, "vms", vid, "tpm")
    status, att = api(port, "GET", "/vms/%s/attestation" % vid)
    tap.result(status == 200 and att.get("ekCertificate") == "certified",
               "get_vm_attestation: the EK certificate is certified by this host", repr(att))

    cert = os.path.join(tpmdir, "ek-rsa2048.crt")
    p = subprocess.run(["sh", "-c", 'openssl x509 -inform DER -in "$1" -out "$1.pem" && '
                        'openssl verify -CAfile "$2" "$1.pem"', "sh", cert, os.path.join(cadir, "ca-cert.pem")],
                       capture_output=True, text=True)
    tap.result(p.returncode == 0, "the EK certificate chains to the host CA (openssl verify)", p.stdout + p.stderr)
    with open(os.path.join(state, "vms", vid, "tpm", "swtpm_setup.log"), errors="replace") as f:
        setup_log = f.read()
    tap.result("/var/lib/swtpm-localca" not in setup_log and "Successfully created EK certificate" in setup_log,
               "swtpm_setup signed with the daemon's CA, not the host's swtpm-localca", setup_log[-400:])

    ek = read_ek_public(work, tpmdir)
    tap.result(ek is not None, "the vTPM's EK read back at 0x81010001 (tpm2_readpublic)")
    rport = imds_relay(os.path.join(state, "vms", vid, "imds.sock"))
    if ek:
        quote_with_ek(rport, ek)
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(att.get("ekCertificate") == "certified", "the guest presenting the vTPM's EK: certified",
                   repr(att))
        other = bytearray(ek)
        other[-10] ^= 0xFF  # in the RSA modulus
        quote_with_ek(rport, bytes(other))
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(att.get("ekCertificate") == "foreign" and
                   "not the one certified" in att.get("ekCertificateMessage", ""),
                   "a guest presenting another EK: foreign", repr(att))

    # a record from before EK certificates: no ekPending, no ekCertificate, a vTPM swtpm made itself
    d.stop()
    rec_path = os.path.join(state, "vms", vid, "vm.json")
    with open(rec_path) as f:
        rec = json.load(f)
    for k in ("ekPending", "ekCertificate", "ekCertificateMessage"):
        rec.get("attestation", {}).pop(k, None)
    with open(rec_path, "w") as f:
        json.dump(rec, f)
    for name in os.listdir(tpmdir):
        if name.startswith("ek-"):
            os.unlink(os.path.join(tpmdir, name))
    d = Daemon(work, "ek2", args, env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "the daemon restarts over the older record", why)
    status, att = api(port, "GET", "/vms/%s/attestation" % vid)
    tap.result(status == 200 and att.get("ekCertificate") == "absent", "an older VM's EK certificate: absent",
               repr(att))
    status, _ = api(port, "POST", "/vms/%s/stop" % vid, {})
    status, out = api(port, "POST", "/vms/%s/start" % vid, {"wait_for": "running"})
    with open(os.path.join(state, "vms", vid, "vm.json")) as f:
        after = json.load(f).get("attestation", {})
    tap.result(status in (200, 202) and "ekPending" not in after and
               not os.path.exists(os.path.join(tpmdir, "swtpm_setup.log.new")),
               "an older VM starts again without its vTPM manufactured anew", repr(out)[:300])


if __name__ == "__main__":
    sys.exit(run([test_ekcert], 180, "vmm-ek-"))
