#!/usr/bin/env python3
"""Attestation end to end with real quotes: agent/vm-agent quotes a swtpm through its TCTI and posts to
the daemon's metadata service on a VM's own listener (<vm>/imds.sock, reached through a small TCP
relay, as the gateway would), the daemon verifies against the image's policy.json and opens the
user-data gate. Then the tampers, each rejected with its own message."""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import Daemon, HOST, base_env, free_port, http_request, run, tap  # noqa: E402

FAKES = os.path.join(here, "fakes")
ZERO = "00" * 32


def api(port, method, path, body=None, timeout=60):
    status, headers, data = http_request(port, method, "/api/v1" + path,
                                         body=json.dumps(body).encode() if body is not None else None,
                                         timeout=timeout)
    return status, (json.loads(data) if data else None)


def relay(unix_path):
    """A TCP listener on 127.0.0.1 whose connections go to unix_path: the guest's way to its IMDS."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def pipe(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        finally:
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def loop():
        while True:
            c, _ = srv.accept()
            u = socket.socket(socket.AF_UNIX)
            u.connect(unix_path)
            threading.Thread(target=pipe, args=(c, u), daemon=True).start()
            threading.Thread(target=pipe, args=(u, c), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
    return srv.getsockname()[1]


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
    tpmdir = os.path.join(work, "tpm")
    os.makedirs(tpmdir)
    sock = os.path.join(tpmdir, "sock")
    sw = subprocess.Popen(["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + tpmdir,
                           "--server", "type=unixio,path=" + sock, "--ctrl", "type=unixio,path=" + sock + ".ctrl",
                           "--flags", "not-need-init,startup-clear"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tcti = "swtpm:path=" + sock
    tenv = dict(os.environ, TPM2TOOLS_TCTI=tcti, TSS2_LOG="all+none")
    for _ in range(50):
        if os.path.exists(sock):
            break
        time.sleep(0.1)

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
    env = base_env(work, FAKE_QEMU="")
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
                                                "wait_for": "none"})
        tap.result(status == 201, "create_vm with require_attestation (the default)", repr(vm)[:200])
        if status != 201:
            return
        vid = vm["id"]
        rport = relay(os.path.join(state, "vms", vid, "imds.sock"))
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
        fp = ini.get("akFingerprint", "")
        tap.result(len(fp) == 64 and sorted(ini.get("pcrs", {}), key=int) == [str(i) for i in list(range(8)) + [11]],
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

        # a golden mismatch on PCR 0
        subprocess.run(["tpm2_pcrextend", "0:sha256=" + "42" * 32], env=tenv, check=True, capture_output=True)
        rc, out = attest("initrd")
        tap.result(rc == 2 and "golden mismatch: pcr 0 expected " + ZERO in out,
                   "a golden mismatch on PCR 0 is rejected (vm-agent exits 2)", out[-300:])

        # PCR 11 that is not in the policy
        subprocess.run(["tpm2_pcrextend", "11:sha256=" + "43" * 32], env=tenv, check=True, capture_output=True)
        rc, out = attest("initrd")
        tap.result(rc == 2 and "pcr 11 mismatch for phase enter-initrd: expected " + ZERO in out,
                   "a PCR 11 the policy does not know is rejected", out[-300:])

        # another AK after pinning
        subprocess.run(["tpm2_evictcontrol", "-C", "o", "-c", "0x81010002"], env=tenv, check=True, capture_output=True)
        rc, out = attest("initrd")
        tap.result(rc == 2 and "is not the key enrolled for this vm (%s)" % fp[:16] in out,
                   "a different AK after pinning is rejected", out[-300:])
    finally:
        d.stop(signal.SIGTERM, timeout=30)
        sw.kill()
        sw.wait()


if __name__ == "__main__":
    sys.exit(run([test_attest], 240, "vmm-att-"))
