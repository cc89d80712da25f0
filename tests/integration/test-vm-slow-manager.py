#!/usr/bin/env python3
"""The systemd launcher against a service manager that answers slowly. dbus-delay-proxy.py sits
between the daemon and a private `systemd --user` (with-systemd-user.sh) and holds the manager's
replies to StartTransientUnit and StopUnit, and its JobRemoved signals, for seconds. The daemon must
not wait for them: on the fake QEMU of tests/integration/fakes (seconds),

  * while VM b's start jobs are held, /healthz, get_vm and the IMDS of VM a, and stop_vm of a (its
    QEMU ends; its units are released in the background) each answer within a second, and b still
    reaches booting;
  * with the replies held longer than JobRemoved (the signal arrives first), start_vm of a reaches
    booting, and the daemon says the job had finished before the reply naming it;
  * while the stop jobs are held, delete_vm of both answers promptly, and no process or unit is left;
  * SIGTERM: the daemon exits 0 with releases still under way.

Skips without a service manager (run under with-systemd-user.sh) or without systemctl.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import (  # noqa: E402
    FAKES,
    api,
    base_env,
    fake_daemon,
    fake_image_dir,
    http_request,
    imds_request,
    processes_gone,
    run,
    tap,
    wait_state,
)

PROMPT = 1.0  # seconds: an answer that took longer waited for the manager
HOLD = 4.0  # seconds the proxy holds a message
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False, "wait_for": "none"}


def timed(fn, *args, **kw):
    t0 = time.monotonic()
    result = fn(*args, **kw)
    return result, time.monotonic() - t0


class Prober:
    """GET /healthz every 50 ms in a thread; the slowest answer is what the loop took at worst."""

    def __init__(self, port):
        self.port = port
        self.worst = 0.0
        self.failures = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                status, _, _ = http_request(self.port, "GET", "/healthz", timeout=30)
                if status != 200:
                    self.failures.append(status)
            except OSError as e:
                self.failures.append(repr(e))
            self.worst = max(self.worst, time.monotonic() - t0)
            time.sleep(0.05)

    def finish(self):
        self.stop.set()
        self.thread.join()
        return self.worst


def units_left():
    out = subprocess.run(["systemctl", "--user", "list-units", "--all", "--plain", "--no-legend", "vm-manager-*"],
                         capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_slow_manager(work):
    if not shutil.which("systemctl"):
        tap.skip("the systemd launcher against a slow manager", "needs systemctl")
        return
    rt = os.path.join(work, "rt")
    os.makedirs(os.path.join(rt, "systemd"), mode=0o700)
    config = os.path.join(work, "delays.json")

    def hold(**delays):
        with open(config + ".tmp", "w") as f:
            json.dump({k.replace("_", ":", 1): v for k, v in delays.items()}, f)
        os.replace(config + ".tmp", config)

    hold()
    proxy_log = open(os.path.join(work, "proxy.log"), "wb")
    proxy = subprocess.Popen([sys.executable, os.path.join(here, "dbus-delay-proxy.py"),
                              os.path.join(rt, "systemd", "private"),
                              os.path.join(os.environ["XDG_RUNTIME_DIR"], "systemd", "private"), config],
                             stdout=proxy_log, stderr=subprocess.STDOUT)
    # units get the manager's environment, not the daemon's
    subprocess.run(["systemctl", "--user", "set-environment", "FAKE_QEMU=install-exit:0"], check=True)
    try:
        for _ in range(100):
            if os.path.exists(os.path.join(rt, "systemd", "private")):
                break
            time.sleep(0.05)
        run_slow_manager(work, rt, hold)
    finally:
        subprocess.run(["systemctl", "--user", "unset-environment", "FAKE_QEMU"])
        proxy.kill()
        proxy.wait()
        proxy_log.close()
        with open(os.path.join(work, "proxy.log"), errors="replace") as f:
            held = sum(1 for line in f if "holding" in line)
        tap.diag("the proxy held %d messages" % held)


def run_slow_manager(work, rt, hold):
    images, vars_ = fake_image_dir(work, "slow")
    env = base_env(work)
    env["XDG_RUNTIME_DIR"] = rt  # the daemon finds the proxy as its manager
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    d, port, ok, why = fake_daemon(work, "slow", os.path.join(work, "state"), images, vars_, env,
                                   launcher="systemd", timeout=30)
    tap.result(ok, "serving with --launcher systemd through the proxy", why)
    if not ok:
        return

    status, a = api(port, "POST", "/vms", dict(CREATE, name="a", hostname="a"))
    tap.result(status == 201, "create_vm a (nothing held)", repr(a)[:300])
    if status != 201:
        return
    a = wait_state(port, a["id"], ("booting", "failed"), 60, 0.2)
    tap.result(a and a["state"] == "booting", "a boots", repr(a)[:300])
    if not a or a["state"] != "booting":
        return

    # ---- b starts while the manager holds its start jobs; a is served meanwhile
    hold(reply_StartTransientUnit=HOLD, signal_JobRemoved=HOLD, reply_StopUnit=HOLD)
    prober = Prober(port)
    t0 = time.monotonic()
    (status, b), took = timed(api, port, "POST", "/vms", dict(CREATE, name="b", hostname="b"))
    tap.result(status == 201 and took < PROMPT, "create_vm b (wait_for none) answers in %.3f s" % took, repr(b)[:300])
    if status != 201:
        prober.finish()
        return
    swtpm_runs = "unit 'vm-manager-%s-swtpm.service' runs" % b["id"]
    time.sleep(0.5)  # b's swtpm and vhost-device-vsock units are being started

    (status, _, _), took = timed(http_request, port, "GET", "/healthz")
    tap.result(status == 200 and took < PROMPT, "a start job is held: /healthz answers in %.3f s" % took)
    (status, got), took = timed(api, port, "GET", "/vms/" + a["id"])
    tap.result(status == 200 and got["state"] == "booting" and took < PROMPT,
               "... get_vm a answers in %.3f s" % took, repr(got)[:200])
    sock = os.path.join(a["paths"]["dir"], "imds.sock")
    (status, _, body), took = timed(imds_request, sock, "GET", "/giantswarm/v1/hostname")
    tap.result(status == 200 and body.strip() == b"a" and took < PROMPT,
               "... a's IMDS answers in %.3f s" % took, repr((status, body)))
    (status, got), took = timed(api, port, "POST", "/vms/%s/stop" % a["id"])
    tap.result(status == 200 and got["state"] == "stopped" and took < 2 * PROMPT,
               "... stop_vm a answers in %.3f s: stopped (its units are released in the background)" % took,
               repr(got)[:300])
    tap.result(time.monotonic() - t0 < HOLD and swtpm_runs not in d.stderr(),
               "... all of it while the start job of b's swtpm unit was still held (%.1f s)" % (time.monotonic() - t0))

    b = wait_state(port, b["id"], ("booting", "failed"), 120, 0.2)
    worst = prober.finish()
    tap.result(b and b["state"] == "booting", "b boots: its installer's units were released and the "
               "installed boot's started, each behind a held job (%.1f s)" % (time.monotonic() - t0), repr(b)[:300])
    tap.result(worst < PROMPT and not prober.failures,
               "/healthz every 50 ms meanwhile: the slowest took %.3f s" % worst, repr(prober.failures[:5]))

    # ---- JobRemoved before the reply naming its job
    hold(reply_StartTransientUnit=2.0)
    status, got = api(port, "POST", "/vms/%s/start" % a["id"])
    a = wait_state(port, a["id"], ("booting", "failed", "stopped"), 60, 0.2)
    tap.result(a and a["state"] == "booting", "JobRemoved first, the reply 2 s later: start_vm a boots",
               repr((status, got, a))[:400])
    deadline = time.monotonic() + 10
    while "had finished before the reply naming it" not in d.stderr() and time.monotonic() < deadline:
        time.sleep(0.2)
    tap.result("had finished before the reply naming it" in d.stderr(),
               "... and once the replies came, the daemon took the jobs' ends from the signals that came first",
               d.stderr()[-1500:])

    # ---- deletes while the stop jobs are held
    hold(reply_StopUnit=HOLD, signal_JobRemoved=HOLD)
    prober = Prober(port)
    for vm in (a, b):
        status, _ = api(port, "DELETE", "/vms/" + vm["id"])
        (st, _, _), took = timed(http_request, port, "GET", "/healthz")
        tap.result(status == 204 and st == 200 and took < PROMPT,
                   "delete_vm %s: 204, /healthz right after in %.3f s" % (vm["name"], took))
    for vm in (a, b):
        left = processes_gone(vm["paths"]["dir"], timeout=30)
        tap.result(left == [], "... nothing of %s runs" % vm["name"], "\n".join(left))
    deadline = time.monotonic() + 4 * HOLD + 10
    while units_left() and time.monotonic() < deadline:
        time.sleep(0.2)
    tap.result(units_left() == [], "... its units were stopped, reset and collected", repr(units_left()))
    worst = prober.finish()
    tap.result(worst < PROMPT and not prober.failures,
               "/healthz meanwhile: the slowest took %.3f s" % worst, repr(prober.failures[:5]))

    # ---- an exit with releases under way
    status, c = api(port, "POST", "/vms", dict(CREATE, name="c", hostname="c"))
    c = wait_state(port, c["id"], ("booting", "failed"), 120, 0.2) if status == 201 else None
    tap.result(c and c["state"] == "booting", "create_vm c boots with stop jobs held", repr(c)[:300])
    if c:
        api(port, "POST", "/vms/%s/stop" % c["id"])  # its units' releases are held
    rc, took = d.stop(signal.SIGTERM, timeout=30)
    tap.result(rc == 0 and took < HOLD, "SIGTERM with releases under way: exit 0 in %.1f s" % took, "exit %r" % rc)


if __name__ == "__main__":
    if not os.environ.get("XDG_RUNTIME_DIR"):
        print("TAP version 13\n1..0 # SKIP needs a service manager (run under with-systemd-user.sh)")
        sys.exit(0)
    sys.exit(run([test_slow_manager], 600, "vmm-slowsd-"))
