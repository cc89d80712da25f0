#!/usr/bin/env python3
"""Credential activation instead of trust on first use: a VM's vTPM is manufactured with an EK
certificate of the daemon's CA (real swtpm_setup, through fakes/swtpm_setup), and the simulated guest
is a real swtpm running on a copy of that very vTPM state, driven by agent/vm-agent. The daemon makes
a credential for the guest's AK with the certified EK (attest/challenge), the guest unwraps it with
TPM2_ActivateCredential and returns the secret (attest/activate), and only then do that AK's quotes
count. Quotes before activation, a wrong secret, a foreign EK and a second AK are each refused with
their own text, and the activation outlives the daemon."""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, HOST, base_env, free_port, http_request, imds_relay, run, tap  # noqa: E402

FAKES = os.path.join(here, "fakes")
ZERO = "00" * 32
NOT_ACTIVATED = "attestation key not activated for this vm's vTPM"


def api(port, method, path, body=None):
    status, _, data = http_request(port, method, "/api/v1" + path,
                                   body=json.dumps(body).encode() if body is not None else None, timeout=60)
    return status, (json.loads(data) if data else None)


def imds(port, method, path, body=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    req = "%s /giantswarm/v1%s HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n" % (method, path)
    if body is not None:
        body = json.dumps(body).encode() if not isinstance(body, bytes) else body
        req += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    s.sendall(req.encode() + b"\r\n" + (body or b""))
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    head, _, payload = data.partition(b"\r\n\r\n")
    if method == "GET":
        return int(head.split()[1]), payload.decode()
    try:
        return int(head.split()[1]), json.loads(payload)
    except ValueError:
        return int(head.split()[1]), payload.decode(errors="replace")


def start_swtpm(statedir):
    sock = os.path.join(statedir, "guest.sock")
    sw = subprocess.Popen(["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + statedir,
                           "--server", "type=unixio,path=" + sock, "--ctrl", "type=unixio,path=" + sock + ".ctrl",
                           "--flags", "not-need-init,startup-clear"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(sock):
            break
        time.sleep(0.1)
    return sw, "swtpm:path=" + sock


def test_activate(work):
    agent = os.environ.get("VM_AGENT")
    if (not agent or not os.access(agent, os.X_OK) or
            not all(shutil.which(t) for t in ("swtpm", "swtpm_setup", "tpm2_evictcontrol"))):
        tap.skip("credential activation", "needs agent/vm-agent, swtpm, swtpm_setup (package swtpm-tools) and "
                 "tpm2_evictcontrol (tpm2-tools)")
        return
    images = os.path.join(work, "images")
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    # swtpm_setup extends nothing: every PCR of the copy is zero, which is what this policy expects
    policy = {"image_id": "fake", "image_version": "1.0",
              "pcr11": {"enter-initrd": ZERO, "enter-initrd:leave-initrd:sysinit:ready": ZERO},
              "golden": {"sha256": {str(i): ZERO for i in (0, 2, 3, 4, 6, 7)}}}
    with open(os.path.join(images, "fake_1.0.policy.json"), "w") as f:
        json.dump(policy, f)
    vars_ = os.path.join(work, "vars")
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="install-exit:0")
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    state = os.path.join(work, "state")
    args = ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
            "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process", "--log-level", "debug"]
    d = Daemon(work, "act", args, env=env)
    sw = None
    try:
        ok, why = d.wait_healthy(port, timeout=20)
        tap.result(ok, "serving with the fake QEMU", why)
        if not ok:
            return
        status, vm = api(port, "POST", "/vms", {"name": "act", "memory_mib": 512, "disk_gib": 1,
                                                "require_attestation": False, "wait_for": "installed"})
        tap.result(status == 201, "create_vm, its vTPM manufactured with an EK certificate", repr(vm)[:300])
        if status != 201:
            return
        vid = vm["id"]
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(att.get("ekCertificate") == "certified" and att.get("akTrust") == "none"
                   and "akActivated" not in att, "a new VM: certified EK, no AK trusted yet", repr(att))

        # the guest's TPM is the VM's own vTPM, copied as swtpm_setup left it
        guest = os.path.join(work, "guest-tpm")
        shutil.copytree(os.path.join(state, "vms", vid, "tpm"), guest,
                        ignore=shutil.ignore_patterns("*.sock", "*.sock.ctrl"))
        sw, tcti = start_swtpm(guest)
        tenv = dict(os.environ, TPM2TOOLS_TCTI=tcti, TSS2_LOG="all+none")
        rport = imds_relay(os.path.join(state, "vms", vid, "imds.sock"))
        url = "http://127.0.0.1:%d/giantswarm/v1" % rport

        def printed():
            """The agent's initrd quote over a fresh nonce, not posted (and so not activated)."""
            st, nonce = imds(rport, "GET", "/attest/nonce")
            p = subprocess.run([agent, "attest", "--stage=initrd", "--print", "--nonce=" + str(nonce),
                                "--tpm=" + tcti], capture_output=True, text=True, env=tenv, timeout=60)
            return json.loads(p.stdout)

        def attest(stage):
            p = subprocess.run([agent, "attest", "--stage=" + stage, "--imds-url=" + url, "--tpm=" + tcti,
                                "--timeout=20s", "--verbose"], capture_output=True, text=True, env=tenv,
                               timeout=90)
            return p.returncode, p.stdout + p.stderr

        # a quote before any activation
        req = printed()
        st, res = imds(rport, "POST", "/attest/quote", req)
        tap.result(st == 403 and isinstance(res, dict) and res.get("verified") is False
                   and res.get("message", "").startswith(NOT_ACTIVATED + ": no credential activation yet"),
                   "a quote before the credential activation is rejected", "%d %r" % (st, res))

        # a challenge, answered with the wrong secret
        challenge = {"ak_pub": req["ak_pub"], "ek_pub": req["ek_pub"]}
        st, cred = imds(rport, "POST", "/attest/challenge", challenge)
        tap.result(st == 200 and isinstance(cred, dict) and set(cred) == {"credential_blob", "encrypted_secret"},
                   "attest/challenge answers a credential for the AK", "%d %r" % (st, cred))
        st, res = imds(rport, "POST", "/attest/activate", {"secret": base64.b64encode(b"\x55" * 32).decode()})
        tap.result(st == 403 and "credential activation failed: the secret is not the one" in str(res),
                   "attest/activate with a wrong secret is refused", "%d %r" % (st, res))
        st, res = imds(rport, "POST", "/attest/activate", {"secret": base64.b64encode(b"\x55" * 32).decode()})
        tap.result(st == 409 and "no credential challenge outstanding" in str(res),
                   "the challenge is used up by one answer, right or wrong", "%d %r" % (st, res))
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(att.get("akTrust") == "none", "nothing is activated by a wrong secret", repr(att))

        # malformed bodies
        st, res = imds(rport, "POST", "/attest/challenge", {"ak_pub": req["ak_pub"]})
        st2, res2 = imds(rport, "POST", "/attest/activate", {"secret": "%%%", "x": 1})
        tap.result(st == 400 and "ak_pub and ek_pub are required" in str(res) and st2 == 400
                   and str(res2).startswith("malformed activation: "),
                   "malformed challenge and activation bodies are 400s", "%d %r %d %r" % (st, res, st2, res2))
        ek_as_ak = dict(challenge, ak_pub=req["ek_pub"])
        st, res = imds(rport, "POST", "/attest/challenge", ek_as_ak)
        tap.result(st == 403 and "attestation key attributes" in str(res),
                   "a challenge for a key that is not a restricted signing key is refused", "%d %r" % (st, res))

        # what a challenge costs the daemon: the certificate check and TPM2_MakeCredential (RSA-OAEP)
        t0 = time.monotonic()
        for _ in range(20):
            st, _ = imds(rport, "POST", "/attest/challenge", challenge)
        tap.diag("attest/challenge round trip (this build): %.1f ms" % ((time.monotonic() - t0) / 20 * 1000))

        # a foreign EK
        other = bytearray(base64.b64decode(req["ek_pub"]))
        other[-10] ^= 0xFF  # in the RSA modulus
        st, res = imds(rport, "POST", "/attest/challenge",
                       dict(challenge, ek_pub=base64.b64encode(bytes(other)).decode()))
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(st == 403 and str(res).startswith("endorsement key foreign: the guest's EK is not the one "
                                                     "certified for this VM")
                   and att.get("ekCertificate") == "foreign",
                   "a challenge with an EK that is not the VM's gets the foreign verdict",
                   "%d %r %r" % (st, res, att))

        # the honest guest: activation, then a verified quote
        t0 = time.monotonic()
        rc, out = attest("initrd")
        took_initrd = time.monotonic() - t0
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        ini = att.get("initrd", {})
        fp = ini.get("akFingerprint", "")
        tap.result(rc == 0 and "activated with the endorsement key" in out and ini.get("verified") is True
                   and att.get("akTrust") == "activated" and att.get("akActivated") == fp and len(fp) == 64
                   and att.get("ekCertificate") == "certified",
                   "vm-agent activates its AK, then its initrd quote verifies", "rc %d %s %r" % (rc, out[-600:], att))
        with open(os.path.join(state, "vms", vid, "vm.json")) as f:
            rec = json.load(f)
        tap.result(rec["attestation"].get("akActivated") == fp and "akPinned" not in rec["attestation"],
                   "vm.json keeps the activated AK, and pins nothing", repr(rec["attestation"])[:300])
        st, res = imds(rport, "POST", "/attest/quote", printed())
        tap.result(st == 200 and res.get("verified") is True, "a later quote of the activated AK verifies",
                   "%d %r" % (st, res))
        t0 = time.monotonic()
        rc, out = attest("ready")
        took_ready = time.monotonic() - t0
        tap.result(rc == 0 and "activated with the endorsement key" not in out and "/attest/challenge" not in out,
                   "the ready quote goes without a new activation", "rc %d %s" % (rc, out[-400:]))
        tap.diag("vm-agent attest on a swtpm (this build): initrd with the activation %.2f s, ready without %.2f s"
                 % (took_initrd, took_ready))

        def restart(name, edit=None):
            """The daemon stopped and started again, vm.json edited in between; the guest running
            again (the stop took its QEMU down), so that its metadata listener is back."""
            nonlocal d, rport, url
            d.stop(signal.SIGTERM, timeout=30)
            if edit:
                path = os.path.join(state, "vms", vid, "vm.json")
                with open(path) as f:
                    rec = json.load(f)
                edit(rec["attestation"])
                with open(path, "w") as f:
                    json.dump(rec, f)
            d = Daemon(work, name, args, env=env)
            ok, why = d.wait_healthy(port, timeout=20)
            status, vmrec = api(port, "GET", "/vms/" + vid)
            if vmrec.get("state") != "running":
                api(port, "POST", "/vms/%s/start" % vid)
            for _ in range(100):
                try:
                    socket.socket(socket.AF_UNIX).connect(os.path.join(state, "vms", vid, "imds.sock"))
                    break
                except OSError:
                    time.sleep(0.1)
            rport = imds_relay(os.path.join(state, "vms", vid, "imds.sock"))
            url = "http://127.0.0.1:%d/giantswarm/v1" % rport
            return ok, why

        # the activation outlives the daemon
        ok, why = restart("act2")
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(ok and att.get("akTrust") == "activated" and att.get("akActivated") == fp,
                   "after a restart the AK is still the activated one", "%s %r" % (why, att))
        st, res = imds(rport, "POST", "/attest/quote", printed())
        tap.result(st == 200 and res.get("verified") is True,
                   "after a restart a quote of the activated AK verifies without a new activation",
                   "%d %r" % (st, res))

        # a ready quote the daemon answers "not activated" (the record lost its activation): the agent
        # activates and quotes once more
        ok, why = restart("act2b", lambda a: a.pop("akActivated", None))
        rc, out = attest("ready")
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(ok and rc == 0 and "activated with the endorsement key" in out and att.get("akActivated") == fp
                   and att.get("ready", {}).get("verified") is True,
                   "a ready quote rejected as not activated: vm-agent activates and quotes again",
                   "%s rc %d %s %r" % (why, rc, out[-600:], att))

        # a second AK in the same vTPM
        subprocess.run(["tpm2_evictcontrol", "-C", "o", "-c", "0x81010002"], env=tenv, check=True,
                       capture_output=True)
        req = printed()
        st, res = imds(rport, "POST", "/attest/quote", req)
        tap.result(st == 403 and res.get("message", "").startswith(
                   NOT_ACTIVATED + ": ak ") and ("(%s)" % fp[:16]) in res.get("message", ""),
                   "a quote of a second AK is rejected: not the activated one", "%d %r" % (st, res))
        rc, out = attest("initrd")
        tap.result(rc == 2 and "another attestation key is already activated for this vm's vTPM" in out,
                   "a second AK cannot be activated (vm-agent exits 2)", "rc %d %s" % (rc, out[-400:]))
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(att.get("akActivated") == fp, "the first AK stays the activated one", repr(att))
        fp2 = att.get("initrd", {}).get("akFingerprint", "")

        # a record from before credential activation: a pin, and a vTPM without an EK certificate
        def legacy(a):
            a.pop("akActivated", None)
            a.pop("ekCertificateMessage", None)
            a["akPinned"] = fp2
            a["ekCertificate"] = "absent"
            os.unlink(os.path.join(state, "vms", vid, "tpm", "ek-rsa2048.crt"))
        ok, why = restart("act3", legacy)
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        st, res = imds(rport, "POST", "/attest/quote", printed())
        tap.result(ok and att.get("akTrust") == "pinned" and "akActivated" not in att
                   and st == 200 and res.get("verified") is True,
                   "a VM from before keeps its pinned AK, and its quotes verify", "%s %r %d %r" % (why, att, st, res))
        st, res = imds(rport, "POST", "/attest/challenge", {"ak_pub": req["ak_pub"], "ek_pub": req["ek_pub"]})
        tap.result(st == 409 and "credential activation is not possible: this vm's vTPM has no EK certificate"
                   in str(res), "a vTPM without an EK certificate has nothing to activate against (409)",
                   "%d %r" % (st, res))

        # without the pin, nothing can be trusted, and the verdict says why
        ok, why = restart("act4", lambda a: a.pop("akPinned", None))
        st, res = imds(rport, "POST", "/attest/quote", printed())
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(st == 403 and res.get("message", "").startswith(
                   "attestation key cannot be activated: this vm's vTPM has no EK certificate: its vTPM was made "
                   "without one") and att.get("akTrust") == "none",
                   "a VM without an EK certificate and no pin: every quote is rejected with the reason",
                   "%d %r %r" % (st, res, att))
    finally:
        d.stop(signal.SIGTERM, timeout=30)
        if sw:
            sw.kill()
            sw.wait()


if __name__ == "__main__":
    sys.exit(run([test_activate], 280, "vmm-act-"))
