#!/usr/bin/env python3
"""VM records that load after every accepted write, and nothing a crash leaves behind (issue:
hardening), against the fake QEMU of tests/integration/fakes with the process launcher:

  * a NUL in any string of create_vm is refused (it used to be accepted, and the record it wrote
    did not load at the next start); so are fields over their limits (metadata, keys, user-data,
    references), before anything is allocated, in one answer;
  * a create at every limit at once answers 201, and its record loads again after a restart,
    field for field;
  * 10,000 or 200,000 ssh keys are refused at once (the daemon stays responsive), 32 keys of 1000
    bytes reach QEMU in its credential;
  * a record that does not load is quarantined: the log and get_host say so, list_vms does not
    show it, its disk and lease stay until delete_vm of its id removes them;
  * a VM directory without a record (a create or a delete killed at the wrong moment) is removed
    with its disk and lease; a record left in state deleting is deleted; a record left in state
    creating whose disk was never recorded loses that disk when deleted;
  * records are written off the event loop, yet an answer that reports one comes only once it is on
    disk: kill -9 right after the answer of create_network, create_vm, stop_vm and delete_network
    loses none of them, and no temporary file is left;
  * kill -9 of the daemon during bursts of create, delete, start and stop: no process of a VM
    outlives the daemon, and after the restart every directory is a listed VM, every disk and
    every lease belongs to one, every acknowledged create is listed and every acknowledged delete
    is gone; deleting everything leaves an empty state.
"""

import http.client
import json
import os
import random
import signal
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (Daemon, HOST, base_env, free_port, http_request, processes_under, run,  # noqa: E402
                     start_thread, tap)

FAKES = os.path.join(here, "fakes")
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False, "wait_for": "none"}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host"


def api(port, method, path, body=None, timeout=120, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    status, headers, out = http_request(port, method, "/api/v1" + path, body=data, timeout=timeout)
    try:
        return status, (json.loads(out) if out else None)
    except ValueError:
        return status, out


class Env:
    def __init__(self, work, name):
        self.work = work
        self.name = name
        self.state = os.path.join(work, "s-" + name)
        self.images = os.path.join(work, "images-" + name)
        os.makedirs(self.images)
        for ext in (".efi", ".raw"):
            with open(os.path.join(self.images, "fake_1.0" + ext), "wb") as f:
                f.write(b"\0" * 4096)
        self.vars = os.path.join(work, "vars-" + name)
        with open(self.vars, "wb") as f:
            f.write(b"\0" * 4096)
        self.n = 0
        self.d = None
        self.port = None

    def start(self, mode=""):
        self.n += 1
        env = base_env(self.work, FAKE_QEMU=mode)
        env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
        self.port = free_port()
        self.d = Daemon(self.work, "%s-%d" % (self.name, self.n),
                        ["--listen", "%s:%d" % (HOST, self.port), "--state-dir", self.state, "--image-dir",
                         self.images, "--ovmf-code", self.vars, "--ovmf-vars", self.vars, "--launcher", "process",
                         "--stop-timeout", "2s", "--log-level", "debug"], env=env)
        ok, why = self.d.wait_healthy(self.port, timeout=30)
        return ok, why

    def stop(self):
        if self.d:
            self.d.stop(signal.SIGTERM, timeout=60)
            self.d = None

    def api(self, method, path, body=None, **kw):
        return api(self.port, method, path, body, **kw)

    def vm_dirs(self):
        p = os.path.join(self.state, "vms")
        return sorted(os.listdir(p)) if os.path.isdir(p) else []

    def volumes(self):
        p = os.path.join(self.state, "volumes")
        return sorted(f[3:11] for f in os.listdir(p) if f.startswith("vm-")) if os.path.isdir(p) else []

    def leases(self):
        with open(os.path.join(self.state, "networks.json")) as f:
            reg = json.load(f)
        return sorted(l["vmID"] for n in reg["networks"] for l in n.get("leases", []))

    def listed(self):
        status, vms = self.api("GET", "/vms")
        return sorted(v["id"] for v in vms) if status == 200 else None


def error_of(answer):
    status, body = answer
    return status, ((body or {}).get("error") or {}) if isinstance(body, dict) else {}


def test_bad_input(work):
    e = Env(work, "input")
    ok, why = e.start()
    tap.result(ok, "daemon on fakes starts", why)
    if not ok:
        return
    try:
        cases = [
            ("a NUL in a metadata value", dict(CREATE, name="nul1", metadata={"k": "v\u0000x"})),
            ("a NUL in the name", dict(CREATE, name="nul\u00002")),
            ("a NUL in user_data", dict(CREATE, name="nul3", user_data="{}\u0000")),
            ("a NUL in an ssh key", dict(CREATE, name="nul4", ssh_authorized_keys=[KEY + "\u0000x"])),
            ("100 metadata values of 60 KB", dict(CREATE, name="big1", metadata={"k%d" % i: "x" * 60000
                                                                                  for i in range(100)})),
            ("65 metadata entries", dict(CREATE, name="big2", metadata={"k%d" % i: "v" for i in range(65)})),
            ("a metadata key of 129 bytes", dict(CREATE, name="big3", metadata={"k" * 129: "v"})),
            ("a metadata value of 16 KiB + 1", dict(CREATE, name="big4", metadata={"k": "v" * 16385})),
            ("five metadata values of 16 KiB (over 64 KiB together)",
             dict(CREATE, name="big5", metadata={"k%d" % i: "v" * 16000 for i in range(5)})),
            ("33 ssh keys", dict(CREATE, name="big6", ssh_authorized_keys=[KEY] * 33)),
            ("an ssh key of 4097 bytes", dict(CREATE, name="big7", ssh_authorized_keys=["ssh-rsa " + "A" * 4089])),
            ("two ssh keys of 60 KB", dict(CREATE, name="big8", ssh_authorized_keys=["ssh-rsa " + "A" * 60000] * 2)),
            ("user_data over 1 MiB", dict(CREATE, name="big9", user_data="x" * (1024 * 1024 + 1))),
            ("an image reference of 256 bytes", dict(CREATE, name="big10", image="i" * 256)),
        ]
        for label, body in cases:
            before = (e.vm_dirs(), e.volumes(), e.leases())
            t0 = time.monotonic()
            status, err = error_of(e.api("POST", "/vms", body))
            took = time.monotonic() - t0
            after = (e.vm_dirs(), e.volumes(), e.leases())
            tap.result(status == 400 and err.get("code") == "invalid_request" and before == after,
                       "%s: 400 invalid_request, nothing allocated (%.2f s)" % (label, took),
                       "%r %r" % (status, err))
        tap.result(e.listed() == [], "... and list_vms is still empty", "")

        # Ten thousand keys: refused at once, and the daemon stays responsive meanwhile.
        for n in (10000, 80000):
            t0 = time.monotonic()
            status, err = error_of(e.api("POST", "/vms", dict(CREATE, name="keys%d" % n,
                                                              ssh_authorized_keys=[KEY] * n)))
            took = time.monotonic() - t0
            tap.result(status in (400, 413) and took < 5, "%d ssh keys: refused (%d) in %.2f s" % (n, status, took),
                       repr(err)[:200])
    finally:
        e.stop()


def test_limits_round_trip(work):
    e = Env(work, "limits")
    ok, why = e.start()
    if not ok:
        tap.result(False, "daemon on fakes starts", why)
        return
    try:
        keys = ["ssh-ed25519 " + ("%02d" % i) * 495 + " k%d" % i for i in range(32)]  # 32 keys of ~1000 bytes
        meta = {("m%03d" % i).ljust(128, "k"): "v" * 700 for i in range(64)}  # 64 entries, ~52 KiB
        body = dict(CREATE, name="a" * 63, hostname="h" * 63, ssh_authorized_keys=keys, metadata=meta,
                    user_data="u" * (1024 * 1024))
        status, vm = e.api("POST", "/vms", body)
        tap.result(status == 201, "a create at every limit at once: 201", repr(vm)[:300])
        if status != 201:
            return
        time.sleep(0.5)
        argv_path = os.path.join(vm["paths"]["dir"], "qemu.argv.json")
        with open(argv_path) as f:
            argv = json.load(f)
        cred = [a for a in argv if "ssh.authorized_keys.root" in a]
        tap.result(len(cred) == 1 and len(cred[0]) < 128 * 1024,
                   "... QEMU got the 32 keys in one credential argument of %d bytes (< 128 KiB)"
                   % (len(cred[0]) if cred else 0), "")
        status, before = e.api("GET", "/vms/" + vm["id"])
        e.stop()
        ok, why = e.start()
        tap.result(ok, "... the daemon starts again", why)
        status, after = e.api("GET", "/vms/" + vm["id"])
        keep = ("name", "hostname", "sshAuthorizedKeys", "metadata", "cpus", "memoryMiB", "diskGiB", "image")
        tap.result(status == 200 and all(after.get(k) == before.get(k) for k in keep),
                   "... and its record loads again, field for field", repr(after)[:300])
        status, _ = e.api("DELETE", "/vms/" + vm["id"])
        tap.result(status == 204 and e.vm_dirs() == [] and e.volumes() == [] and e.leases() == [],
                   "... delete_vm leaves nothing", "%r %r %r" % (e.vm_dirs(), e.volumes(), e.leases()))
    finally:
        e.stop()


def test_quarantine(work):
    e = Env(work, "quarantine")
    ok, why = e.start()
    if not ok:
        tap.result(False, "daemon on fakes starts", why)
        return
    try:
        ids = []
        for name in ("bad", "good"):
            status, vm = e.api("POST", "/vms", dict(CREATE, name=name))
            ids.append(vm["id"])
        status, _ = e.api("POST", "/vms/%s/stop" % ids[0])
        e.stop()
        bad = ids[0]
        with open(os.path.join(e.state, "vms", bad, "vm.json"), "w") as f:
            f.write('{"id": "%s", "name": "bad", "state": "stop' % bad)
        ok, why = e.start()
        tap.result(ok, "the daemon starts over a record that does not load", why)
        qdir = os.path.join(e.state, "quarantine", bad)
        tap.result(e.listed() == [ids[1]] and os.path.isdir(qdir) and bad not in e.vm_dirs(),
                   "... list_vms shows the others; the record moved to quarantine/%s" % bad,
                   "%r %r" % (e.listed(), e.vm_dirs()))
        status, host = e.api("GET", "/host")
        q = (host or {}).get("quarantine")
        tap.result(status == 200 and len(q or []) == 1 and q[0]["id"] == bad and q[0]["path"] == qdir
                   and q[0]["reason"],
                   "... get_host lists it with the reason", repr(q))
        tap.result("does not load" in e.d.stderr() and bad in e.d.stderr(),
                   "... and the log says so", e.d.stderr()[-500:])
        tap.result(bad in e.volumes() and bad in e.leases(),
                   "... its disk and lease are kept for delete_vm", "%r %r" % (e.volumes(), e.leases()))
        status, vm = e.api("POST", "/vms", dict(CREATE, name="bad"))
        tap.result(status == 201, "... a new VM may take its name", repr(vm)[:200])
        ids.append(vm["id"])
        e.stop()
        ok, why = e.start()
        status, host = e.api("GET", "/host")
        tap.result([x["id"] for x in host.get("quarantine", [])] == [bad],
                   "after another restart it is still reported", repr(host.get("quarantine")))
        status, _ = e.api("DELETE", "/vms/" + bad)
        status2, host = e.api("GET", "/host")
        tap.result(status == 204 and host["quarantine"] == [] and not os.path.exists(qdir)
                   and bad not in e.volumes() and bad not in e.leases(),
                   "delete_vm of its id removes it with its disk and lease", "%r %r" % (status, host["quarantine"]))
        status, err = error_of(e.api("DELETE", "/vms/" + bad))
        tap.result(status == 404, "... then it is unknown (404)", repr(err))
    finally:
        e.stop()


def test_leftovers(work):
    e = Env(work, "leftovers")
    ok, why = e.start()
    if not ok:
        tap.result(False, "daemon on fakes starts", why)
        return
    try:
        ids = []
        for name in ("creating", "deleting", "keep"):
            status, vm = e.api("POST", "/vms", dict(CREATE, name=name))
            ids.append(vm["id"])
        for i in ids:
            e.api("POST", "/vms/%s/stop" % i)
        e.stop()

        def edit(vid, fn):
            p = os.path.join(e.state, "vms", vid, "vm.json")
            with open(p) as f:
                rec = json.load(f)
            fn(rec)
            with open(p, "w") as f:
                json.dump(rec, f)

        # killed in create before the disk was recorded; killed in delete; an empty directory of a
        # create killed before its first record; a disk of no VM at all
        edit(ids[0], lambda r: (r.__setitem__("state", "creating"), r["paths"].__setitem__("volume", "")))
        edit(ids[1], lambda r: r.__setitem__("state", "deleting"))
        os.makedirs(os.path.join(e.state, "vms", "0badc0de"))
        with open(os.path.join(e.state, "volumes", "vm-0badc0de.volume"), "wb") as f:
            f.truncate(1 << 20)
        with open(os.path.join(e.state, "volumes", "vm-feedf00d.volume"), "wb") as f:
            f.truncate(1 << 20)
        ok, why = e.start()
        tap.result(ok, "the daemon starts over what crashes left", why)
        tap.result(e.listed() == sorted([ids[0], ids[2]]) and e.vm_dirs() == sorted([ids[0], ids[2]]),
                   "a record left deleting is deleted, an empty directory removed",
                   "%r %r" % (e.listed(), e.vm_dirs()))
        # a create the restart interrupted loses its disk at once (blank, or half written by a host
        # install); its lease stays until delete_vm
        tap.result(e.volumes() == [ids[2]] and e.leases() == sorted([ids[0], ids[2]]),
                   "... with their disks and leases; a disk of no VM is removed, and the disk of a create left "
                   "creating", "%r %r" % (e.volumes(), e.leases()))
        status, v = e.api("GET", "/vms/" + ids[0])
        tap.result(v["state"] == "failed" and "restarted while the VM was creating" in v.get("lastError", ""),
                   "a record left creating is failed, saying so", repr(v)[:300])
        status, _ = e.api("DELETE", "/vms/" + ids[0])
        tap.result(status == 204 and ids[0] not in e.volumes() and ids[0] not in e.leases(),
                   "... and delete_vm removes it with its lease", repr(e.volumes()))
    finally:
        e.stop()


def test_crash(work):
    """kill -9 during bursts of create, delete, start and stop. Every disk and lease belongs to a listed
    VM, and every listed VM has both, but one whose create the kill caught before it took them (it
    is failed, saying so, and delete_vm removes it)."""
    e = Env(work, "crash")
    seed = int(os.environ.get("VM_MANAGER_TEST_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    tap.diag("crash seed %d (VM_MANAGER_TEST_SEED)" % seed)
    ok, why = e.start()
    tap.result(ok, "crash: the first daemon starts", why)
    if not ok:
        return
    acked_creates, acked_deletes, deletes_sent = set(), set(), set()
    rounds = 8
    for rnd in range(rounds):
        known = e.listed() or []
        ops = []
        for i in range(12):
            kind = rng.choice(["create", "create", "delete", "stop", "start"])
            ops.append((kind, rng.choice(known) if known and kind != "create" else None, "c%d-%d" % (rnd, i)))
        progress = {"done": 0}

        def fire(port=e.port, ops=ops, progress=progress):
            for kind, vid, name in ops:
                try:
                    if kind == "create":
                        status, vm = api(port, "POST", "/vms", dict(CREATE, name=name), timeout=10)
                        if status == 201:
                            acked_creates.add(vm["id"])
                    elif vid and kind == "delete":
                        deletes_sent.add(vid)  # a delete the kill interrupts is finished at the next start
                        status, _ = api(port, "DELETE", "/vms/" + vid, timeout=10)
                        if status == 204:
                            acked_deletes.add(vid)
                    elif vid:
                        api(port, "POST", "/vms/%s/%s" % (vid, kind), timeout=10)
                    progress["done"] += 1
                except (OSError, http.client.HTTPException, ValueError):
                    return  # the kill

        t = start_thread(fire)
        time.sleep(rng.uniform(0.05, 1.5))
        e.d.proc.kill()
        e.d.proc.wait(timeout=10)
        t.join(15)
        label = "crash round %d (%d ops done)" % (rnd + 1, progress["done"])
        time.sleep(0.5)
        left = processes_under(os.path.join(e.state, "vms"))
        tap.result(left == [], "%s: no process of any VM outlives the daemon" % label, "\n".join(left))
        for line in left:
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except OSError:
                pass
        e.d = None
        ok, why = e.start()
        tap.result(ok, "%s: the daemon starts again" % label, why)
        if not ok:
            return
        listed = e.listed()
        status, vms = e.api("GET", "/vms")
        # a create killed before it allocated its disk and lease leaves a failed VM without them
        half = {v["id"] for v in vms if v["state"] == "failed" and "while the VM was creating" in v.get("lastError", "")}
        problems = []
        if listed != e.vm_dirs():
            problems.append("directories %r are not the listed VMs %r" % (e.vm_dirs(), listed))
        for what, have in (("disks", e.volumes()), ("leases", e.leases())):
            if not set(have) <= set(listed) or not set(listed) - half <= set(have):
                problems.append("%s %r are not the listed VMs %r (created half-way: %r)"
                                % (what, have, listed, sorted(half)))
        lost = sorted((acked_creates - deletes_sent) - set(listed))
        if lost:
            problems.append("acknowledged creates lost: %r" % lost)
        back = sorted(acked_deletes & set(listed))
        if back:
            problems.append("acknowledged deletes back: %r" % back)
        status, host = e.api("GET", "/host")
        if host.get("quarantine"):
            problems.append("quarantined: %r" % host["quarantine"])
        tap.result(not problems, "%s: every directory, disk and lease is a listed VM; no acknowledged write lost"
                   % label, "\n".join(problems))
    # the end: delete everything, nothing may be left
    for vid in e.listed() or []:
        e.api("DELETE", "/vms/" + vid)
    tap.result(e.listed() == [] and e.vm_dirs() == [] and e.volumes() == [] and e.leases() == []
               and processes_under(os.path.join(e.state, "vms")) == [],
               "crash: deleting every VM leaves no directory, disk, lease or process",
               "%r %r %r %r %r" % (e.listed(), e.vm_dirs(), e.volumes(), e.leases(), processes_under(os.path.join(e.state, "vms"))))
    e.stop()


def test_kill_after_answer(work):
    """The records are written and fsynced on a worker thread; the answer waits for them."""
    e = Env(work, "answered")
    ok, why = e.start()
    tap.result(ok, "answered: daemon on fakes starts", why)
    if not ok:
        return

    def kill_and_restart(label):
        e.d.stop(signal.SIGKILL, timeout=30)
        e.d = None
        ok, why = e.start()
        tap.result(ok, "answered: %s, kill -9 at once: the daemon starts again" % label, why)
        return ok

    def temporaries():
        found = []
        for root, _, files in os.walk(e.state):
            found += [os.path.join(root, f) for f in files if f.startswith(".#")]
        return found

    status, _ = e.api("POST", "/networks", {"name": "kept", "cidr": "10.71.0.0/24"})
    tap.result(status == 201, "answered: create_network 201", repr(status))
    if not kill_and_restart("create_network answered"):
        return
    status, nets = e.api("GET", "/networks")
    tap.result(status == 200 and "kept" in [n["spec"]["name"] for n in nets],
               "answered: the network is there after the kill", repr(nets)[:300])

    status, vm = e.api("POST", "/vms", dict(CREATE, name="kept-vm", network="kept"))
    vid = (vm or {}).get("id")
    tap.result(status == 201 and vid, "answered: create_vm 201", repr(vm)[:300])
    if not vid or not kill_and_restart("create_vm answered"):
        return
    status, got = e.api("GET", "/vms/" + vid)
    tap.result(status == 200 and (got.get("spec") or got).get("name") == "kept-vm" and got.get("ip", "").startswith("10.71.0."),
               "answered: the VM and its lease are there after the kill", repr(got)[:300])

    # stop_vm is refused while the start chain runs: wait for it to end (the fake guest may stop
    # by itself meanwhile, which is as good for what follows)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (e.api("GET", "/vms/" + vid)[1] or {}).get("state") not in ("running",
                                                                                                     "stopped"):
        time.sleep(0.2)
    status, got = e.api("POST", "/vms/%s/stop" % vid, {})
    tap.result(status == 200 or (status == 409 and "(stopped)" in json.dumps(got)),
               "answered: stop_vm 200 (or stopped already)", "%r %r" % (status, got))
    if not kill_and_restart("stop_vm answered"):
        return
    status, got = e.api("GET", "/vms/" + vid)
    tap.result(status == 200 and got.get("state") == "stopped",
               "answered: the VM is stopped after the kill", repr(got)[:300])

    status, _ = e.api("DELETE", "/vms/" + vid)
    tap.result(status in (200, 204) and e.vm_dirs() == [],
               "answered: delete_vm answered with the directory gone", "%r %r" % (status, e.vm_dirs()))
    status, _ = e.api("DELETE", "/networks/kept")
    tap.result(status == 204, "answered: delete_network 204", repr(status))
    if not kill_and_restart("delete_network answered"):
        return
    status, nets = e.api("GET", "/networks")
    tap.result(status == 200 and "kept" not in [n["spec"]["name"] for n in nets] and e.listed() == [],
               "answered: network and VM stay deleted after the kill", repr(nets)[:300])
    tap.result(temporaries() == [], "answered: no temporary file left", repr(temporaries()))
    e.stop()


if __name__ == "__main__":
    sys.exit(run([test_bad_input, test_limits_round_trip, test_quarantine, test_leftovers, test_crash,
                  test_kill_after_answer],
                 deadline=500, prefix="vmm-rec-"))
