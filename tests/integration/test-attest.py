#!/usr/bin/env python3
"""Attestation end to end with real quotes: agent/vm-agent quotes a swtpm through its TCTI and posts to
the daemon's metadata service on a VM's own listener (<vm>/imds.sock, reached through a small TCP
relay, as the gateway would), the daemon verifies against the image's policy.json and opens the
user-data gate. Then the tampers, each rejected with its own message."""

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, HOST, base_env, free_port, http_request, imds_relay, run, tap  # noqa: E402

FAKES = os.path.join(here, "fakes")
TESTS = os.path.dirname(here)
ZERO = "00" * 32


def api(port, method, path, body=None, timeout=60):
    status, headers, data = http_request(port, method, "/api/v1" + path,
                                         body=json.dumps(body).encode() if body is not None else None,
                                         timeout=timeout)
    return status, (json.loads(data) if data else None)


def http(port, method, path, body=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    req = "%s /giantswarm/v1%s HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n" % (method, path)
    if body is not None:
        req += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    s.sendall(req.encode() + b"\r\n" + (body or b""))
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


def test_attest(work):
    agent = os.environ.get("VM_AGENT")
    tools = [shutil.which(t) for t in ("swtpm", "tpm2_pcrextend", "tpm2_evictcontrol")]
    if not agent or not os.access(agent, os.X_OK) or not all(tools):
        tap.skip("attestation end to end", "needs agent/vm-agent, swtpm (package swtpm) and tpm2_pcrextend and "
                 "tpm2_evictcontrol (package tpm2-tools)")
        return
    if not shutil.which("swtpm_setup"):
        tap.skip("attestation end to end", "needs swtpm_setup (package swtpm-tools): quotes count only from an "
                 "AK activated with the EK of a certified vTPM")
        return
    tpmdir = os.path.join(work, "tpm")
    sock = os.path.join(tpmdir, "sock")
    tcti = "swtpm:path=" + sock
    tenv = dict(os.environ, TPM2TOOLS_TCTI=tcti, TSS2_LOG="all+none")
    sw = None

    images = os.path.join(work, "images")
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    # a fresh swtpm: every PCR is zero, and that is what this policy expects
    policy = {"image_id": "fake", "image_version": "1.0",
              "pcr11": {"enter-initrd": ZERO, "enter-initrd:leave-initrd:sysinit:ready": ZERO},
              "golden": {"sha256": {str(i): ZERO for i in (0, 2, 3, 4, 6, 7)}}}
    with open(os.path.join(images, "fake_1.0.policy.json"), "w") as f:
        json.dump(policy, f)
    vars_ = os.path.join(work, "vars")
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    # the installer exits at once, so that the attestation happens on an installed boot, which
    # stop_vm and start_vm can follow with another one
    env = base_env(work, FAKE_QEMU="install-exit:0")
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    state = os.path.join(work, "state")
    d = Daemon(work, "attest", ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                                "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process",
                                "--log-level", "debug"], env=env)
    try:
        ok, why = d.wait_healthy(port, timeout=20)
        tap.result(ok, "serving with the fake QEMU", why)
        status, vm = api(port, "POST", "/vms", {"name": "att", "memory_mib": 512, "disk_gib": 1,
                                                "user_data": "{\"ignition\":{\"version\":\"3.4.0\"}}",
                                                "wait_for": "installed"})
        tap.result(status == 201, "create_vm with require_attestation (the default)", repr(vm)[:200])
        if status != 201:
            return
        vid = vm["id"]
        # The guest's TPM is the VM's own vTPM as swtpm_setup manufactured it (a copy: the VM's swtpm is
        # the fake one), so that its EK is the certified one its AK is activated with.
        shutil.copytree(os.path.join(state, "vms", vid, "tpm"), tpmdir,
                        ignore=shutil.ignore_patterns("*.sock", "*.sock.ctrl"))
        sw = subprocess.Popen(["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + tpmdir,
                               "--server", "type=unixio,path=" + sock, "--ctrl", "type=unixio,path=" + sock + ".ctrl",
                               "--flags", "not-need-init,startup-clear"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        for _ in range(50):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        rport = imds_relay(os.path.join(state, "vms", vid, "imds.sock"))
        url = "http://127.0.0.1:%d/giantswarm/v1" % rport

        def attest(stage, *extra):
            p = subprocess.run([agent, "attest", "--stage=" + stage, "--imds-url=" + url, "--tpm=" + tcti,
                                "--timeout=20s", *extra], capture_output=True, text=True, env=tenv, timeout=60)
            return p.returncode, p.stdout + p.stderr

        st, body = http(rport, "GET", "/user-data")
        tap.result(st == 503, "user-data is gated before any quote", "%d %r" % (st, body[:80]))

        rc, out = attest("initrd")
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        ini = (att or {}).get("initrd", {})
        tap.result(rc == 0 and ini.get("verified") is True and ini.get("message", "").startswith("verified: ak ")
                   and "pcr 11 phase enter-initrd" in ini.get("message", "") and att.get("userDataReleased") is True,
                   "a real initrd quote verifies and releases user-data", "rc %d %s %r" % (rc, out[-300:], att))
        tap.result(ini.get("eventLog") == {"replayed": True, "firmwareEvents": 0, "userspaceEvents": 0},
                   "a fresh swtpm measured nothing: the quote replays without logs", repr(ini.get("eventLog")))
        fp = ini.get("akFingerprint", "")
        tap.result(len(fp) == 64 and sorted(ini.get("pcrs", {}), key=int) == [str(i) for i in list(range(8)) + [11, 12]],
                   "get_vm_attestation shows the AK fingerprint and the quoted PCRs", repr(ini)[:300])
        st, body = http(rport, "GET", "/user-data")
        tap.result(st == 200 and body == b"{\"ignition\":{\"version\":\"3.4.0\"}}", "user-data is served once released",
                   "%d %r" % (st, body[:80]))

        rc, out = attest("ready")
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        rd = (att or {}).get("ready", {})
        tap.result(rc == 0 and rd.get("verified") is True and rd.get("akFingerprint") == fp and "13" in rd.get("pcrs", {}),
                   "the ready quote verifies with the same AK and PCR 13", "rc %d %s %r" % (rc, out[-300:], rd))

        # image golden: the verified ready quote's PCRs into the policy, then cleared again
        bin_ = os.environ["VM_MANAGER_BIN"]
        pol_path = os.path.join(images, "fake_1.0.policy.json")
        g = subprocess.run([bin_, "image", "golden", "fake_1.0", "--from-vm", vid, "--server",
                            "http://%s:%d" % (HOST, port), "--image-dir", images], capture_output=True, text=True)
        with open(pol_path) as f:
            pol = json.load(f)
        tap.result(g.returncode == 0 and sorted(pol.get("golden", {}).get("sha256", {}), key=int) == ["0", "2", "3", "4", "6", "7", "13"]
                   and len(pol.get("golden_firmware", {}).get("sha256", "")) == 64 and pol.get("pcr11") == policy["pcr11"]
                   and g.stdout.startswith("recorded golden sha256 PCRs 0,2,3,4,6,7,13 of vm %s (ak %s" % (vid, fp)),
                   "image golden --from-vm records PCRs 0,2,3,4,6,7,13 and the firmware, keeping the rest",
                   g.stdout + g.stderr)
        g = subprocess.run([bin_, "image", "golden", "fake_1.0", "--clear", "--image-dir", images],
                           capture_output=True, text=True)
        with open(pol_path) as f:
            pol = json.load(f)
        tap.result(g.returncode == 0 and "golden" not in pol and "golden_firmware" not in pol
                   and g.stdout.startswith("cleared the golden PCR values of fake_1.0 in " + pol_path),
                   "image golden --clear removes them", g.stdout + g.stderr)
        g = subprocess.run([bin_, "image", "golden", "fake_1.0", "--from-vm", "nope", "--server",
                            "http://%s:%d" % (HOST, port), "--image-dir", images], capture_output=True, text=True)
        tap.result(g.returncode == 1 and "HTTP 404" in g.stderr, "image golden --from-vm of an unknown VM fails",
                   g.stderr)
        with open(pol_path, "w") as f:
            json.dump(policy, f)
        # the catalog picks the restored policy up through inotify: wait until it shows
        for _ in range(100):
            status, img = api(port, "GET", "/images/fake_1.0")
            if status == 200 and (img.get("policy") or {}).get("golden"):
                break
            time.sleep(0.1)

        # tampers, posted by hand from the agent's own request
        def request():
            nonce_st, nonce = http(rport, "GET", "/attest/nonce")
            p = subprocess.run([agent, "attest", "--stage=initrd", "--print", "--nonce=" + nonce.decode(),
                                "--tpm=" + tcti], capture_output=True, text=True, env=tenv, timeout=60)
            return json.loads(p.stdout)

        def post(req):
            st, body = http(rport, "POST", "/attest/quote", json.dumps(req).encode())
            try:
                return st, json.loads(body)
            except ValueError:
                return st, {"text": body.decode(errors="replace")}

        req = request()
        st, res = post(req)
        tap.result(st == 200 and res.get("verified") is True, "a hand-posted quote verifies", repr(res))
        st, res = post(req)
        tap.result(st == 403 and res.get("message") == "unknown or expired nonce", "a reused nonce is rejected", repr(res))
        req = request()
        req["nonce"] = "ab" * 32
        st, res = post(req)
        tap.result(st == 403 and res.get("message") == "unknown or expired nonce", "a wrong nonce is rejected", repr(res))
        req = request()
        req["pcrs"]["sha256"]["3"] = "11" * 32
        st, res = post(req)
        tap.result(st == 403 and res.get("message") == "pcr digest: pcr digest mismatch",
                   "an edited PCR value is rejected", repr(res))
        req = request()
        sig = bytearray(base64.b64decode(req["signature"]))
        sig[-1] ^= 1
        req["signature"] = base64.b64encode(bytes(sig)).decode()
        st, res = post(req)
        tap.result(st == 403 and res.get("message", "").startswith("signature: signature does not verify"),
                   "a flipped signature is rejected", repr(res))
        req = request()
        req["quote"] = base64.b64encode(base64.b64decode(req["quote"])[:20]).decode()
        st, res = post(req)
        tap.result(st == 403 and res.get("message", "").startswith("quote: malformed quote"),
                   "a truncated quote is rejected", repr(res))
        st, res = post({"stage": "initrd"})
        tap.result(st == 400, "a request without a nonce is a 400", "%d %r" % (st, res))
        status, vmrec = api(port, "GET", "/vms/" + vid)
        tap.result("initrd attestation rejected:" in (vmrec or {}).get("lastError", ""),
                   "a rejected initrd quote is named in lastError", (vmrec or {}).get("lastError"))

        # a measurement into PCR 0 that no event log explains
        subprocess.run(["tpm2_pcrextend", "0:sha256=" + "42" * 32], env=tenv, check=True, capture_output=True)
        rc, out = attest("initrd")
        tap.result(rc == 2 and "Attestation rejected: no event log: the quote carries none, but pcr 0 is not at its "
                   "reset value" in out, "a measured PCR without an event log is rejected (vm-agent exits 2)", out[-300:])

        # Through the cmd TCTI the agent sends the logs it is pointed at, as in a VM: a userspace log
        # whose record explains the measurement, so that the golden value decides.
        vmdir = os.path.join(state, "vms", vid)
        uslog = os.path.join(work, "tpm2-measure.log")
        proxy = "cmd:%s %s %s" % (sys.executable, os.path.join(TESTS, "agent", "tcti-proxy.py"), sock)

        def record(pcr, digest):
            return (b'\x1e{"pcr":%d,"digests":[{"hashAlg":"sha256","digest":"%s"}],"content_type":"systemd",'
                    b'"content":{"string":"test"}}\n' % (pcr, digest.encode()))

        def attest_logged(log, stage="initrd"):
            with open(uslog, "wb") as f:
                f.write(log)
            env = dict(tenv, VM_AGENT_USERSPACE_LOG=uslog, VM_AGENT_EVENT_LOG=os.path.join(work, "none"))
            p = subprocess.run([agent, "attest", "--stage=" + stage, "--imds-url=" + url, "--tpm=" + proxy,
                                "--timeout=20s"], capture_output=True, text=True, env=env, timeout=60)
            return p.returncode, p.stdout + p.stderr

        def extended(*digests):
            v = bytes(32)
            for d in digests:
                v = hashlib.sha256(v + bytes.fromhex(d)).digest()
            return v.hex()

        log0 = record(0, "42" * 32)
        rc, out = attest_logged(log0)
        status, att = api(port, "GET", "/vms/%s/attestation" % vid)
        ini = (att or {}).get("initrd", {})
        tap.result(rc == 2 and "golden mismatch: pcr 0 expected " + ZERO in out
                   and ini.get("eventLog") == {"replayed": True, "firmwareEvents": 0, "userspaceEvents": 1},
                   "with its event log, a golden mismatch on PCR 0 is rejected (vm-agent exits 2)",
                   "%s %r" % (out[-300:], ini.get("eventLog")))
        # the daemon's file writer keeps the logs off the loop: they land shortly after the verdict
        for _ in range(100):
            try:
                kept = open(os.path.join(vmdir, "attest-initrd-userspace.log"), "rb").read()
                if kept == log0:
                    break
            except OSError as e:
                kept = repr(e)
            time.sleep(0.05)
        tap.result(kept == log0 and not os.path.exists(os.path.join(vmdir, "attest-initrd-firmware.log")),
                   "the quote's userspace log is kept in the VM's directory, the missing firmware log is not",
                   repr(kept)[:200])

        # a log whose digest is not what the TPM measured
        rc, out = attest_logged(record(0, "41" * 32))
        tap.result(rc == 2 and "event log mismatch: pcr 0 replays to %s but the quote says %s; the quote carries "
                   "no firmware log" % (extended("41" * 32), extended("42" * 32)) in out,
                   "an event log that does not replay to the quote is rejected", out[-300:])

        # PCR 11 that is not in the policy
        subprocess.run(["tpm2_pcrextend", "11:sha256=" + "43" * 32], env=tenv, check=True, capture_output=True)
        rc, out = attest_logged(log0 + record(11, "43" * 32))
        tap.result(rc == 2 and "pcr 11 mismatch for phase enter-initrd: expected " + ZERO in out,
                   "a PCR 11 the policy does not know is rejected", out[-300:])

        # the next boot's first nonce removes the logs of the boot before; delete_vm the directory
        kept = sorted(f for f in os.listdir(vmdir) if f.startswith("attest-"))
        # the rejections above ended the boot of this VM, which must attest: it is failed, powered off
        status, stopped = api(port, "GET", "/vms/" + vid)
        tap.result(status == 200 and stopped["state"] == "failed"
                   and stopped.get("lastError", "").startswith("initrd attestation rejected: "),
                   "the first rejection that a new quote cannot cure failed the VM (it must attest)",
                   repr(stopped)[:300])
        status2, started = api(port, "POST", "/vms/%s/start" % vid)
        st, _ = http(rport, "GET", "/attest/nonce")
        left = sorted(f for f in os.listdir(vmdir) if f.startswith("attest-"))
        tap.result(kept == ["attest-initrd-userspace.log"] and status == 200 and status2 == 200 and st == 200
                   and left == [], "a new boot's first nonce removes the event logs of the boot before",
                   "%r %d %d %d %r %r %r" % (kept, status, status2, st, left, stopped, started))

        # An update in place: version 1.1 of the image is published beside 1.0, and the VM's quote
        # carries 1.1's PCR 11 (its guest installed 1.1 into its B slot and booted it). The quote, not
        # the record, says which version booted: it is judged by 1.1's policy, and get_vm shows 1.1.
        for ext in (".efi", ".raw"):
            with open(os.path.join(images, "fake_1.1" + ext), "wb") as f:
                f.write(b"\0" * 4096)
        newer = {"image_id": "fake", "image_version": "1.1",
                 "pcr11": {"enter-initrd": extended("43" * 32), "enter-initrd:leave-initrd:sysinit:ready": ZERO},
                 "golden": {"sha256": dict({str(i): ZERO for i in (2, 3, 4, 6, 7)}, **{"0": extended("42" * 32)})}}
        with open(os.path.join(images, "fake_1.1.policy.json"), "w") as f:
            json.dump(newer, f)
        for _ in range(100):
            status, img = api(port, "GET", "/images/fake_1.1")
            if status == 200 and img.get("policy"):
                break
            time.sleep(0.1)
        rc, out = attest_logged(log0 + record(11, "43" * 32))
        status, vmrec = api(port, "GET", "/vms/" + vid)
        status2, att = api(port, "GET", "/vms/%s/attestation" % vid)
        tap.result(rc == 0 and (vmrec or {}).get("bootedVersion") == "1.1" and vmrec.get("image") == "fake_1.0"
                   and (att or {}).get("bootedVersion") == "1.1" and att.get("initrd", {}).get("verified") is True,
                   "a quote of version 1.1's UKI is judged by 1.1's policy: verified, get_vm shows bootedVersion 1.1",
                   "rc %d %s %r %r" % (rc, out[-300:], vmrec, att))

        # a rejected quote's logs are kept too, until delete_vm removes the VM's directory; this one
        # measured a UKI of no version the catalog holds
        subprocess.run(["tpm2_pcrextend", "11:sha256=" + "44" * 32], env=tenv, check=True, capture_output=True)
        rc, out = attest_logged(log0 + record(11, "43" * 32) + record(11, "44" * 32))
        kept = os.path.exists(os.path.join(vmdir, "attest-initrd-userspace.log"))
        tap.result(rc == 2 and "pcr 11 mismatch for phase enter-initrd: expected " + ZERO in out
                   and "the quoted pcr 11 is no version of image fake this host has a policy for (1.0, 1.1): the vm booted a uki "
                   "that is not in the catalog" in out,
                   "a PCR 11 of no version in the catalog is rejected, and the verdict says so", out[-400:])

        # another AK after the activation
        subprocess.run(["tpm2_evictcontrol", "-C", "o", "-c", "0x81010002"], env=tenv, check=True, capture_output=True)
        rc2, out = attest("initrd")
        tap.result(rc2 == 2 and "another attestation key is already activated for this vm's vTPM: ak %s" % fp[:16] in out,
                   "a different AK after the activation is refused", out[-300:])
        status, _ = api(port, "DELETE", "/vms/" + vid)
        tap.result(rc == 2 and kept and status == 204 and not os.path.exists(vmdir),
                   "a rejected quote's logs are kept, and delete_vm removes them with the VM's directory",
                   "%d %r %d %r" % (rc, kept, status, os.path.exists(vmdir)))
    finally:
        d.stop(signal.SIGTERM, timeout=30)
        if sw:
            sw.kill()
            sw.wait()


if __name__ == "__main__":
    sys.exit(run([test_attest], 240, "vmm-att-"))
