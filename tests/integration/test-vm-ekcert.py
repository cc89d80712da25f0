#!/usr/bin/env python3
"""vTPMs certified by the host: a new VM's vTPM is manufactured by swtpm_setup (real, through
fakes/swtpm_setup) with an EK certificate of the daemon's own CA (<state>/attest-ca), which chains to
that CA and certifies the EK the vTPM really has; a guest presenting another EK is reported foreign;
a VM record from before EK certificates keeps working and is reported absent.

swtpm_setup starts a swtpm of its own, which the daemon's parent-death signal does not reach: with
the swtpm it manufactures with slowed down (FAKE_SWTPM_SETUP=slow:S, so that swtpm_setup is caught waiting for its
child), neither swtpm_setup nor its swtpm outlives a delete_vm, a daemon stopped with SIGTERM, or a
daemon killed with SIGKILL; and the next daemon manufactures vTPMs again."""

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (Daemon, HOST, base_env, free_port, http_request, imds_relay, processes_gone,  # noqa: E402
                     processes_under, run, start_thread, tap)

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


def daemon_setup(work, name, **fake):
    """Images, firmware, environment and arguments of a daemon on the fakes: (env, args, state, port)."""
    images = os.path.join(work, "images-" + name)
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    vars_ = os.path.join(work, "vars-" + name)
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work, FAKE_QEMU="install-exit:0", **fake)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    state = os.path.join(work, "state-" + name)
    port = free_port()
    args = ["--listen", "%s:%d" % (HOST, port), "--state-dir", state, "--image-dir", images,
            "--ovmf-code", vars_, "--ovmf-vars", vars_, "--launcher", "process", "--attestation", "noop",
            "--log-level", "debug"]
    return env, args, state, port


def missing_tools():
    return not all(shutil.which(t) for t in ("swtpm", "swtpm_setup", "tpm2_readpublic", "openssl"))


def test_ekcert(work):
    if missing_tools():
        tap.skip("vTPM EK certificates", "needs swtpm, swtpm_setup (package swtpm-tools), tpm2_readpublic "
                 "(tpm2-tools) and openssl")
        return
    env, args, state, port = daemon_setup(work, "ek")
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


def manufacturing_swtpm(vms):
    """Whether the slowed swtpm that swtpm_setup manufactures with (given --server, and naming a VM's
    directory) runs: swtpm_setup's quick queries through the same wrapper do not count, they end by
    themselves."""
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any("slow-swtpm/swtpm" in a for a in argv) and "--server" in argv and any(vms in a for a in argv):
            return True
    return False


def setup_caught(vms, timeout=60):
    """Waits until swtpm_setup runs for a VM with its (slowed) manufacturing swtpm: the processes
    under vms, or None when that did not happen in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if manufacturing_swtpm(vms):
            left = processes_under(vms)
            if any("bin/swtpm_setup" in p for p in left):
                return left
        time.sleep(0.05)
    return None


def kill_leftovers(left):
    """What a failed check left running must not outlive the test."""
    for line in left:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except OSError:
            pass


def create_caught(port, vms, name):
    """create_vm (its answer comes once the vTPM is made, so it is sent from a thread), and
    swtpm_setup caught with its swtpm: (vm id, processes), or (None, why)."""
    answer = {}

    def create():
        try:
            answer["r"] = api(port, "POST", "/vms", {"name": name, "memory_mib": 512, "disk_gib": 1,
                                                     "require_attestation": False, "wait_for": "none"})
        except OSError as e:  # the daemon killed meanwhile
            answer["r"] = (0, str(e))

    before = set(os.listdir(vms)) if os.path.isdir(vms) else set()
    start_thread(create)
    caught = setup_caught(vms, timeout=30)
    if caught is None:
        return None, "no swtpm_setup with its own swtpm under %s: %r, create_vm: %r" % (
            vms, processes_under(vms), answer.get("r"))
    new = sorted(set(os.listdir(vms)) - before)
    return (new[0] if len(new) == 1 else None), caught


def test_setup_orphans(work):
    """Nothing of swtpm_setup outlives its VM or the daemon, however that ends."""
    if missing_tools():
        tap.skip("swtpm_setup's processes end with the daemon", "needs swtpm and swtpm_setup")
        return
    env, args, state, port = daemon_setup(work, "orphans", FAKE_SWTPM_SETUP="slow:30")
    vms = os.path.join(state, "vms")

    d = Daemon(work, "orphans-1", args, env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "orphans: serving with the swtpm of swtpm_setup 30 s late", why)
    if not ok:
        return
    vid, caught = create_caught(port, vms, "deleted")
    tap.result(vid is not None, "swtpm_setup is caught waiting for its own swtpm", caught)
    if vid:
        tap.diag("caught: " + " | ".join(caught))
        status, _ = api(port, "DELETE", "/vms/" + vid)
        left = processes_gone(vms, timeout=5)
        tap.result(status == 204 and left == [], "delete_vm during swtpm_setup: neither it nor its swtpm is left",
                   "status %d, left:\n%s" % (status, "\n".join(left)))
        kill_leftovers(left)

        vid, caught = create_caught(port, vms, "sigterm")
        d.stop()
        left = processes_gone(vms, timeout=5)
        tap.result(vid is not None and left == [],
                   "the daemon stopped (SIGTERM) during swtpm_setup: neither it nor its swtpm is left",
                   "%r\nleft:\n%s" % (caught, "\n".join(left)))
        kill_leftovers(left)
    else:
        d.stop()

    d = Daemon(work, "orphans-2", args, env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "orphans: the daemon starts again", why)
    if not ok:
        return
    vid, caught = create_caught(port, vms, "killed")
    if vid is None:
        tap.result(False, "swtpm_setup is caught again", caught)
        d.stop()
        return
    d.proc.kill()
    d.proc.wait(timeout=10)
    left = processes_gone(vms, timeout=5)
    # and a while later: an orphan of the slowed swtpm would be sleeping still, or running as swtpm
    time.sleep(1)
    left += processes_under(vms)
    tap.result(left == [], "the daemon killed (SIGKILL) during swtpm_setup: neither it nor its swtpm is left",
               "caught:\n%s\nleft:\n%s" % ("\n".join(caught), "\n".join(left)))
    kill_leftovers(left)

    # the next daemon, with a plain swtpm_setup: the VM the kill caught in its creation goes, a new one
    # gets its certified vTPM
    env.pop("FAKE_SWTPM_SETUP")
    d = Daemon(work, "orphans-3", args, env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "orphans: the daemon starts after the kill", why)
    if not ok:
        return
    try:
        status_d, _ = api(port, "DELETE", "/vms/" + vid) if vid else (0, None)
        status, vm = api(port, "POST", "/vms", {"name": "after", "memory_mib": 512, "disk_gib": 1,
                                                "require_attestation": False, "wait_for": "installed"})
        att = api(port, "GET", "/vms/%s/attestation" % vm["id"])[1] if status == 201 else None
        tap.result(status_d == 204 and status == 201 and (att or {}).get("ekCertificate") == "certified",
                   "after the kill: the VM it caught is deleted, a new one gets its certified vTPM",
                   "delete %d, create %d %r, attestation %r" % (status_d, status, vm, att))
    finally:
        d.stop()


if __name__ == "__main__":
    sys.exit(run([test_ekcert, test_setup_orphans], 240, "vmm-ek-"))
