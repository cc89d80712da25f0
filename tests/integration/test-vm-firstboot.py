#!/usr/bin/env python3
"""A first VM that works, or says at once why not (issue: a new user's first hour), and no VM that
must attest becoming ready without having attested. Against the fake QEMU of tests/integration/fakes
(an installer that exits 0, then an installed boot that runs until powered down), a real swtpm quoted
by agent/vm-agent through the VM's own metadata listener, and READY=1 sent by the test on the VM's
notify socket, as vhost-device-vsock would hand it over:

  * create_vm with require_attestation on an image without golden values (verify mode, no learn
    flag) is refused before anything is allocated, naming the bring-up (make golden); allowed with
    require_attestation false or in learn mode;
  * a rejected initrd quote (a golden mismatch) fails the VM at once: the waiting create_vm answers
    vm_failed with the verdict, the VM is failed and powered off, lastError is the verdict;
  * a stale nonce is the guest's to retry: the VM goes on;
  * READY=1 from a guest that never attested fails the VM (it is never ready);
  * READY=1 before the ready-stage quote waits for it, and the verified quote makes the VM ready;
  * READY=1 without a ready-stage quote fails the VM once the grace is over;
  * on an image whose policy says "pcr12": "predicted", PCR 12 must be what systemd-stub measures for
    the kernel-cmdline-extra string the daemon passed (the swtpm is extended as the stub would): the
    same string verifies, another one is rejected with its own verdict. An image without the flag
    is judged as before (the cases above, whose swtpm leaves PCR 12 at zero).
"""

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (Daemon, HOST, base_env, free_port, http_request, imds_relay, imds_request,  # noqa: E402
                     processes_under, run, tap)

FAKES = os.path.join(here, "fakes")
ZERO = "00" * 32
NOTIFY_PORT = 5005
AGENT = os.environ.get("VM_AGENT")
CREATE = {"memory_mib": 512, "disk_gib": 1}
TIMINGS = {}


def api(port, method, path, body=None, timeout=120):
    status, headers, data = http_request(port, method, "/api/v1" + path,
                                         body=json.dumps(body).encode() if body is not None else None,
                                         timeout=timeout)
    return status, (json.loads(data) if data else None)


def policy(golden, pcr12=False):
    p = {"image_id": "fake", "image_version": "1.0",
         "pcr11": {"enter-initrd": ZERO, "enter-initrd:leave-initrd:sysinit:ready": ZERO}}
    if golden:
        p["golden"] = {"sha256": {str(i): golden for i in (0, 2, 3, 4, 6, 7)}}
    if pcr12:
        p["pcr12"] = pcr12 if isinstance(pcr12, str) else "predicted"
    return p


def credentials_of(argv):
    """The credentials of QEMU's command line (-smbios type=11 io.systemd.credential strings, QEMU's
    ",," unescaped), as the guest's PID 1 would store them: name -> bytes."""
    creds = {}
    for i, a in enumerate(argv[:-1]):
        if a != "-smbios" or not argv[i + 1].startswith("type=11,value="):
            continue
        v = argv[i + 1][len("type=11,value="):].replace(",,", ",")
        for prefix, binary in (("io.systemd.credential:", False), ("io.systemd.credential.binary:", True)):
            if v.startswith(prefix):
                name, _, value = v[len(prefix):].partition("=")
                creds[name] = base64.b64decode(value) if binary else value.encode()
    return creds


def credentials_word(argv, change=None):
    """What the image's vm-measure-credentials extends PCR 12 with, from the credentials of QEMU's
    command line; change maps a name to another value (a credential altered on the way)."""
    creds = credentials_of(argv)
    creds.update({k: v.encode() for k, v in (change or {}).items()})
    lines = "".join("%s=%s\n" % (n, hashlib.sha256(creds[n]).hexdigest()) for n in sorted(creds))
    return "vm-credentials:" + hashlib.sha256(lines.encode()).hexdigest()


def stub_cmdline_digest(extra):
    """The EV_IPL digest systemd-stub extends PCR 12 with for a kernel-cmdline-extra string (ASCII,
    already trimmed): UTF-16LE with its NUL terminator."""
    return hashlib.sha256(extra.encode("utf-16-le") + b"\0\0").hexdigest()


def stub_cmdline_log(path, extra):
    """A TCG2 event log (crypto agile, sha256 only) holding the one PCR 12 event systemd-stub logs for
    a kernel-cmdline-extra string: what the guest's firmware log would add to an otherwise empty boot."""
    spec = b"Spec ID Event03\0" + struct.pack("<IBBBBIHHB", 0, 0, 2, 0, 2, 1, 0x000B, 32, 0)
    data = extra.encode("utf-16-le") + b"\0\0"
    with open(path, "wb") as f:
        f.write(struct.pack("<II", 0, 3) + b"\0" * 20 + struct.pack("<I", len(spec)) + spec)
        f.write(struct.pack("<IIIH", 12, 0x0D, 1, 0x000B) + hashlib.sha256(data).digest()
                + struct.pack("<I", len(data)) + data)


def daemon(work, name, golden, *extra, boot_timeout="2m", pcr12=False):
    images = os.path.join(work, "images-" + name)
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    with open(os.path.join(images, "fake_1.0.policy.json"), "w") as f:
        json.dump(policy(golden, pcr12), f)
    vars_ = os.path.join(work, "vars-" + name)
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="install-exit:0")
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    state = os.path.join(work, "s-" + name)
    d = Daemon(work, name, ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
                            "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process", "--vsock",
                            "vhost-user", "--notify-port", str(NOTIFY_PORT), "--boot-timeout", boot_timeout,
                            "--stop-timeout", "3s", "--log-level", "debug", *extra], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "%s: serving with the fake QEMU" % name, why)
    return d, port, state


class Swtpm:
    """The guest's TPM that vm-agent quotes through its TCTI: a swtpm on a copy of a VM's own vTPM as
    swtpm_setup manufactured it (every PCR zero), so that its EK is the certified one the agent's AK is
    activated with. adopt() makes it a VM's; the VM's swtpm itself is the fake one."""

    def __init__(self, work, name):
        self.dir = os.path.join(work, "tpm-" + name)
        self.proc = None
        self.tcti = "swtpm:path=" + os.path.join(self.dir, "sock")

    def adopt(self, state, vid):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.copytree(os.path.join(state, "vms", vid, "tpm"), self.dir,
                        ignore=shutil.ignore_patterns("*.sock", "*.sock.ctrl"))
        sock = os.path.join(self.dir, "sock")
        self.proc = subprocess.Popen(
            ["swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + self.dir, "--server", "type=unixio,path=" + sock,
             "--ctrl", "type=unixio,path=" + sock + ".ctrl", "--flags", "not-need-init,startup-clear"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(50):
            if os.path.exists(sock):
                break
            time.sleep(0.1)

    def attest(self, url, stage, event_log=None):
        env = dict(os.environ, TSS2_LOG="all+none")
        if event_log:
            env["VM_AGENT_EVENT_LOG"] = event_log
            userspace = os.path.join(os.path.dirname(event_log), "userspace.log")
            if os.path.exists(userspace):
                env["VM_AGENT_USERSPACE_LOG"] = userspace
        p = subprocess.run([AGENT, "attest", "--stage=" + stage, "--imds-url=" + url, "--tpm=" + self.tcti,
                            "--timeout=20s"], capture_output=True, text=True, env=env, timeout=60)
        return p.returncode, p.stdout + p.stderr

    def stub_measures(self, extra):
        """PCR 12 extended as systemd-stub does for the kernel-cmdline-extra string extra; returns the
        event log that says so, for the agent to send along."""
        subprocess.run(["tpm2_pcrextend", "-T", self.tcti, "12:sha256=" + stub_cmdline_digest(extra)],
                       check=True, capture_output=True, timeout=30)
        # then systemd's os-separator in the initrd (SHA-256 of the string), as a real boot shows
        subprocess.run(["tpm2_pcrextend", "-T", self.tcti,
                        "12:sha256=" + hashlib.sha256(b"os-separator").hexdigest()],
                       check=True, capture_output=True, timeout=30)
        with open(os.path.join(self.dir, "userspace.log"), "w") as f:
            f.write("\x1e" + json.dumps({"pcr": 12, "digests": [
                {"hashAlg": "sha256", "digest": hashlib.sha256(b"os-separator").hexdigest()}],
                "content_type": "systemd", "content": {"string": "os-separator", "eventType": "os-separator"}}) + "\n")
        log = os.path.join(self.dir, "firmware.log")
        stub_cmdline_log(log, extra)
        return log

    def measures_credentials(self, word):
        """PCR 12 extended with the credentials word, after the separator, as vm-measure-credentials
        does with systemd-pcrextend, and its record in the userspace log."""
        digest = hashlib.sha256(word.encode()).hexdigest()
        subprocess.run(["tpm2_pcrextend", "-T", self.tcti, "12:sha256=" + digest],
                       check=True, capture_output=True, timeout=30)
        with open(os.path.join(self.dir, "userspace.log"), "a") as f:
            f.write("\x1e" + json.dumps({"pcr": 12, "digests": [{"hashAlg": "sha256", "digest": digest}],
                                          "content_type": "systemd", "content": {"string": word}}) + "\n")

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class Create:
    """create_vm (wait_for ready) on a thread: its answer arrives while the test plays the guest."""

    def __init__(self, port, body):
        self.answer = None
        self.done_at = None
        self.thread = threading.Thread(target=self.run, args=(port, body), daemon=True)
        self.thread.start()

    def run(self, port, body):
        self.answer = api(port, "POST", "/vms", body, timeout=300)
        self.done_at = time.monotonic()

    def wait(self, timeout):
        self.thread.join(timeout)
        return self.answer


def booting_vm(port, name, timeout=30):
    """The VM named name once its installed boot runs (the fake installer exits 0 after a second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, vms = api(port, "GET", "/vms")
        for v in vms or []:
            if v["name"] == name and v.get("phase") == "boot" and v["state"] in ("booting", "attesting"):
                return v
        time.sleep(0.2)
    return None


def send_ready(state, vid):
    """READY=1 as PID 1 sends it: one message on a connection to the VM's notify socket."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(state, "vms", vid, "vsock_%d" % NOTIFY_PORT))
    s.sendall(b"READY=1\nSTATUS=Startup finished\n")
    s.shutdown(socket.SHUT_WR)
    s.recv(16)  # the daemon closes once it has the message
    s.close()


def imds_url(state, vid):
    return "http://127.0.0.1:%d/giantswarm/v1" % imds_relay(os.path.join(state, "vms", vid, "imds.sock"))


def test_refused(work):
    d, port, state = daemon(work, "nogolden", golden=None)
    try:
        t0 = time.monotonic()
        status, err = api(port, "POST", "/vms", dict(CREATE, name="first"))
        TIMINGS["refused create_vm, request to answer"] = time.monotonic() - t0
        msg = (err or {}).get("error", {}).get("message", "")
        tap.result(status == 501 and err["error"]["code"] == "unsupported"
                   # firmware runs are off in these daemons (vmmtest.loop_env), so PCRs 0, 2, 3, 6 are named first
                   and "firmware measurements (pcr 0,2,3,6) are not known" in msg
                   and "firmware runs are off" in msg and "make golden" in msg
                   and "--attestation-learn-golden" in msg and "require_attestation false" in msg,
                   "require_attestation on an image without golden values: 501 unsupported, naming the bring-up",
                   repr(err)[:600])
        status, vms = api(port, "GET", "/vms")
        status, net = api(port, "GET", "/networks/default")
        vmdir = os.path.join(state, "vms")
        tap.result(vms == [] and net["leases"] == [] and (not os.path.isdir(vmdir) or os.listdir(vmdir) == []),
                   "... refused before anything was allocated: no record, no lease, no directory",
                   "%r %r" % (vms, net))
        status, vm = api(port, "POST", "/vms", dict(CREATE, name="plain", require_attestation=False,
                                                    wait_for="none"))
        tap.result(status == 201, "... the same image with require_attestation false is created", repr(vm)[:300])
        if status == 201:
            api(port, "DELETE", "/vms/" + vm["id"])
    finally:
        d.stop(signal.SIGTERM, timeout=30)
    d, port, state = daemon(work, "learn", None, "--attestation-learn-golden")
    try:
        status, vm = api(port, "POST", "/vms", dict(CREATE, name="learner", wait_for="none"))
        tap.result(status == 201 and vm["requireAttestation"] is True,
                   "... and in learn mode a VM that must attest is created (its boot records the values)",
                   repr(vm)[:300])
        if status == 201:
            api(port, "DELETE", "/vms/" + vm["id"])
    finally:
        d.stop(signal.SIGTERM, timeout=30)


def test_rejected(work):
    if not AGENT or not shutil.which("swtpm") or not shutil.which("swtpm_setup"):
        tap.skip("a rejected quote fails the VM", "needs agent/vm-agent, swtpm and swtpm_setup")
        return
    d, port, state = daemon(work, "reject", golden="11" * 32)
    tpm = Swtpm(work, "reject")
    try:
        t0 = time.monotonic()
        create = Create(port, dict(CREATE, name="rejected"))
        vm = booting_vm(port, "rejected")
        tap.result(vm is not None, "the VM's installed boot runs", "")
        if not vm:
            return
        url = imds_url(state, vm["id"])
        tpm.adopt(state, vm["id"])

        # a stale nonce first: the guest's to retry, nothing fails
        st, _, body = imds_request(os.path.join(state, "vms", vm["id"], "imds.sock"), "POST",
                                   "/giantswarm/v1/attest/quote",
                                        json.dumps({"stage": "initrd", "nonce": "ab" * 32, "ak_pub": "AAAA",
                                                    "quote": "AAAA", "signature": "AAAA",
                                                    "pcrs": {"sha256": {"0": ZERO}}}).encode())
        status, v = api(port, "GET", "/vms/" + vm["id"])
        tap.result(st == 403 and b"unknown or expired nonce" in body and v["state"] in ("booting", "attesting")
                   and create.answer is None,
                   "a quote with a stale nonce is rejected and the VM goes on (the guest retries)",
                   "%r %r %r" % (st, body[:200], v.get("state")))

        verdict_at = time.monotonic()  # vm-agent asks for a nonce, quotes and posts: the verdict follows
        rc, out = tpm.attest(url, "initrd")
        answer = create.wait(30)
        TIMINGS["rejected boot, quote posted to create_vm's answer"] = (create.done_at or time.monotonic()) - verdict_at
        TIMINGS["rejected boot, request to answer (fake QEMU)"] = (create.done_at or time.monotonic()) - t0
        status, err = answer or (None, None)
        msg = (err or {}).get("error", {}).get("message", "")
        tap.result(rc == 2 and status == 500 and err["error"]["code"] == "vm_failed"
                   and msg.startswith("vm failed: initrd attestation rejected: golden mismatch: pcr 0 expected "
                                      + "11" * 32),
                   "a golden mismatch fails the VM at once: create_vm answers vm_failed with the verdict",
                   "rc %r %s; %r %r" % (rc, out[-200:], status, err))
        tap.result(create.done_at is not None and create.done_at - verdict_at < 10,
                   "... within seconds of the quote (%.1f s)" % ((create.done_at or 0) - verdict_at), "")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status, v = api(port, "GET", "/vms/" + vm["id"])
            if v["state"] == "failed":
                break
            time.sleep(0.2)
        tap.result(v["state"] == "failed" and v["lastError"].startswith("initrd attestation rejected: golden mismatch")
                   and "\n" not in v["lastError"],
                   "... the VM is failed and lastError is the verdict", repr(v)[:500])
        tap.result(processes_under(v["paths"]["dir"]) == [], "... and powered off: nothing of it runs",
                   "\n".join(processes_under(v["paths"]["dir"])))
        status, att = api(port, "GET", "/vms/%s/attestation" % vm["id"])
        tap.result(att["initrd"]["verified"] is False and not att["userDataReleased"],
                   "... get_vm_attestation keeps the verdict; user-data was never released", repr(att)[:300])
    finally:
        tpm.stop()
        d.stop(signal.SIGTERM, timeout=30)


def test_ready_without_attestation(work):
    d, port, state = daemon(work, "noagent", golden=ZERO)
    try:
        create = Create(port, dict(CREATE, name="noagent"))
        vm = booting_vm(port, "noagent")
        tap.result(vm is not None, "a VM whose guest runs no attestation agent boots", "")
        if not vm:
            return
        send_ready(state, vm["id"])
        status, err = create.wait(30) or (None, None)
        msg = (err or {}).get("error", {}).get("message", "")
        tap.result(status == 500 and err["error"]["code"] == "vm_failed"
                   and msg.startswith("vm failed: attestation required: the guest sent READY=1 without a verified "
                                      "initrd quote")
                   and "never asked for a nonce" in msg,
                   "READY=1 from a guest that never attested: create_vm (wait_for ready) fails, it is never ready",
                   repr(err)[:500])
        status, v = api(port, "GET", "/vms/" + vm["id"])
        status, att = api(port, "GET", "/vms/%s/attestation" % vm["id"])
        tap.result(v["state"] in ("stopping", "failed") and v["lastError"].startswith("attestation required")
                   and not v.get("readyAt") and att.get("ekCertificate") in ("certified", "absent")
                   and att.get("akTrust") == "none"
                   and {k: x for k, x in att.items() if k not in ("ekCertificate", "akTrust")} == {
                       "required": True, "userDataReleased": False},
                   "... its state, lastError and attestation say what is missing", "%r %r" % (v, att))
    finally:
        d.stop(signal.SIGTERM, timeout=30)


def test_ready_waits_for_quote(work):
    if not AGENT or not shutil.which("swtpm") or not shutil.which("swtpm_setup"):
        tap.skip("READY=1 waits for the ready quote", "needs agent/vm-agent, swtpm and swtpm_setup")
        return
    d, port, state = daemon(work, "waits", golden=ZERO, boot_timeout="6s")
    tpm = Swtpm(work, "waits")
    try:
        create = Create(port, dict(CREATE, name="waits"))
        vm = booting_vm(port, "waits")
        if not vm:
            tap.result(False, "the VM's installed boot runs", "")
            return
        url = imds_url(state, vm["id"])
        tpm.adopt(state, vm["id"])
        rc, out = tpm.attest(url, "initrd")
        send_ready(state, vm["id"])
        time.sleep(1)
        status, v = api(port, "GET", "/vms/" + vm["id"])
        tap.result(rc == 0 and v["state"] == "attesting" and create.answer is None,
                   "READY=1 before the ready-stage quote: the VM is not ready yet (attesting)",
                   "rc %r %s %r" % (rc, out[-200:], v.get("state")))
        rc, out = tpm.attest(url, "ready")
        status, vm2 = create.wait(30) or (None, None)
        tap.result(rc == 0 and status == 201 and vm2["state"] == "ready" and vm2["attestation"]["ready"]["verified"],
                   "... the verified ready quote makes it ready, and create_vm answers 201",
                   "rc %r %s %r" % (rc, out[-200:], vm2))

        # The next one never posts its ready quote: failed once the grace (the 6 s boot timeout) is over.
        create = Create(port, dict(CREATE, name="late"))
        vm = booting_vm(port, "late")
        if not vm:
            tap.result(False, "the second VM's installed boot runs", "")
            return
        tpm.adopt(state, vm["id"])
        rc, out = tpm.attest(imds_url(state, vm["id"]), "initrd")
        send_ready(state, vm["id"])
        status, err = create.wait(30) or (None, None)
        msg = (err or {}).get("error", {}).get("message", "")
        tap.result(rc == 0 and status == 500 and err["error"]["code"] == "vm_failed"
                   and "no verified ready-stage quote followed within 6s" in msg,
                   "READY=1 and no ready-stage quote: failed once the grace is over",
                   "rc %r %s %r" % (rc, out[-200:], err))
    finally:
        tpm.stop()
        d.stop(signal.SIGTERM, timeout=30)


def test_pcr12(work):
    if not AGENT or not shutil.which("swtpm") or not shutil.which("swtpm_setup") or not shutil.which("tpm2_pcrextend"):
        tap.skip("PCR 12 predicted from the command line", "needs agent/vm-agent, swtpm, swtpm_setup and tpm2-tools")
        return
    d, port, state = daemon(work, "pcr12", golden=ZERO, pcr12=True)
    tpms = []
    try:
        # The first installed boot is handed io.systemd.stub.kernel-cmdline-extra=ignition.firstboot.
        tpm = Swtpm(work, "pcr12-same")
        tpms.append(tpm)
        create = Create(port, dict(CREATE, name="same-cmdline", wait_for="none"))
        vm = booting_vm(port, "same-cmdline")
        tap.result(vm is not None, "pcr12: the VM's installed boot runs", "")
        if not vm:
            return
        tpm.adopt(state, vm["id"])
        log = tpm.stub_measures("ignition.firstboot")
        rc, out = tpm.attest(imds_url(state, vm["id"]), "initrd", log)
        status, att = api(port, "GET", "/vms/%s/attestation" % vm["id"])
        initrd = (att or {}).get("initrd", {})
        tap.result(rc == 0 and initrd.get("verified") is True
                   and "pcr 12 command line as passed" in initrd.get("message", "")
                   and "12" in initrd.get("pcrs", {}) and initrd["pcrs"]["12"] != ZERO,
                   "PCR 12 of the command line the daemon passed verifies, and the verdict names it",
                   "rc %r %s %r" % (rc, out[-300:], att))

        # A guest whose stub saw another string: the command line was changed on the way.
        tpm = Swtpm(work, "pcr12-other")
        tpms.append(tpm)
        create = Create(port, dict(CREATE, name="other-cmdline"))
        vm = booting_vm(port, "other-cmdline")
        if not vm:
            tap.result(False, "pcr12: the second VM's installed boot runs", "")
            return
        tpm.adopt(state, vm["id"])
        log = tpm.stub_measures("ignition.firstboot init=/bin/sh")
        rc, out = tpm.attest(imds_url(state, vm["id"]), "initrd", log)
        status, err = create.wait(30) or (None, None)
        msg = (err or {}).get("error", {}).get("message", "")
        tap.result(rc == 2 and status == 500 and err["error"]["code"] == "vm_failed"
                   and "initrd attestation rejected: pcr 12 mismatch: the kernel command line handed to the vm "
                       "differs from what vm-manager passed" in msg,
                   "a changed command line (another PCR 12) is rejected with the PCR 12 verdict",
                   "rc %r %s; %r %r" % (rc, out[-300:], status, err))

        # The same image's quote without the stub's measurement (PCR 12 still zero) is rejected too.
        tpm = Swtpm(work, "pcr12-none")
        tpms.append(tpm)
        create = Create(port, dict(CREATE, name="no-cmdline", wait_for="none"))
        vm = booting_vm(port, "no-cmdline")
        if vm:
            tpm.adopt(state, vm["id"])
            rc, out = tpm.attest(imds_url(state, vm["id"]), "initrd")
            status, att = api(port, "GET", "/vms/%s/attestation" % vm["id"])
            tap.result(rc == 2 and "pcr 12 mismatch" in (att or {}).get("initrd", {}).get("message", ""),
                       "... and so is a boot whose stub measured nothing", "rc %r %r" % (rc, att))
    finally:
        for t in tpms:
            t.stop()
        d.stop(signal.SIGTERM, timeout=30)


def test_timings(work):
    for k, v in TIMINGS.items():
        tap.diag("timing: %s: %.3f s" % (k, v))


def test_pcr12_credentials(work):
    """An image whose initrd measures its credentials ("pcr12": "predicted-credentials"): PCR 12 must
    also show the credentials the daemon handed the VM; one changed on the way is rejected."""
    if not AGENT or not shutil.which("swtpm") or not shutil.which("swtpm_setup") or not shutil.which("tpm2_pcrextend"):
        tap.skip("PCR 12 with the credentials", "needs agent/vm-agent, swtpm, swtpm_setup and tpm2-tools")
        return
    d, port, state = daemon(work, "pcr12c", ZERO, "--guest-report-interval", "5m", pcr12="predicted-credentials")
    tpms = []
    try:
        for name, change, want in (("same-creds", None, True), ("other-creds", {"firstboot.hostname": "evil"}, False)):
            tpm = Swtpm(work, "pcr12c-" + name)
            tpms.append(tpm)
            create = Create(port, dict(CREATE, name=name, wait_for="none" if want else "ready"))
            vm = booting_vm(port, name)
            if not vm:
                tap.result(False, "pcr12c: the VM %s boots" % name, "")
                return
            tpm.adopt(state, vm["id"])
            with open(os.path.join(state, "vms", vm["id"], "qemu.argv.json")) as f:
                argv = json.load(f)
            word = credentials_word(argv, change)
            if want:
                got = credentials_of(argv).get("vm.report-interval")
                tap.result(got == b"300", "--guest-report-interval 5m: the boot is handed vm.report-interval=300 "
                           "(and PCR 12's credentials word covers it)", repr(got))
            log = tpm.stub_measures("ignition.firstboot")
            tpm.measures_credentials(word)
            rc, out = tpm.attest(imds_url(state, vm["id"]), "initrd", log)
            status, att = api(port, "GET", "/vms/%s/attestation" % vm["id"])
            msg = (att or {}).get("initrd", {}).get("message", "")
            if want:
                tap.result(rc == 0 and "pcr 12 command line and credentials as passed" in msg,
                           "PCR 12 with the credentials the daemon passed (measured by the initrd) verifies, "
                           "and the verdict names them",
                           "rc %r %s %r" % (rc, out[-300:], att))
            else:
                tap.result(rc == 2 and msg.startswith("pcr 12 mismatch: the kernel command line or the credentials "
                                                      "handed to the vm differ from what vm-manager passed"),
                           "a credential changed on the way (another PCR 12) is rejected with its own verdict",
                           "rc %r %s %r" % (rc, out[-300:], att))
    finally:
        for t in tpms:
            t.stop()
        d.stop(signal.SIGTERM, timeout=30)


if __name__ == "__main__":
    sys.exit(run([test_refused, test_rejected, test_ready_without_attestation, test_ready_waits_for_quote, test_pcr12,
                  test_pcr12_credentials,
                  test_timings], deadline=300, prefix="vmm-first-"))
