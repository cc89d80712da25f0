#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The loop watchdog (src/basic/loop-watchdog.h) and the harness's check of it (vmmtest.py):

  * a daemon whose loop sleeps 100 ms once ($VM_MANAGER_TEST_LOOP_SLEEP_MS, honoured by debug
    builds only) reports that iteration: its report file gets one line (100 ms or more, the
    dispatch phase, the test hook's callback as the place), its log a warning, /metrics a longest
    iteration of 0.1 s or more;
  * a test script run on vmmtest.run() with such a daemon fails (exit 1, a 'not ok' naming the
    daemon, its section and the place), and the same script without the hook passes: the harness
    fails any integration test whose daemon reported an iteration over 50 ms.

Skips (77) on a build without the test hooks (not buildtype debug).
"""

import os
import re
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from vmmtest import BIN, HOST, Daemon, base_env, free_port, http_request, run, tap  # noqa: E402

HOOK_ENV = "VM_MANAGER_TEST_LOOP_SLEEP_MS"

# A test of its own, on vmmtest.run(): one daemon, slept on or not as its argument says.
CHILD = r'''
import os, sys
sys.path.insert(0, %(here)r)
from vmmtest import HOST, Daemon, base_env, free_port, run, tap
import time

def section_daemon(work):
    env = base_env(work)
    if sys.argv[1] == "sleep":
        env["VM_MANAGER_TEST_LOOP_SLEEP_MS"] = "100"
    port = free_port()
    d = Daemon(work, "child", ["--listen", "%%s:%%d" %% (HOST, port), "--state-dir", os.path.join(work, "state")],
               env=env)
    ok, why = d.wait_healthy(port)
    tap.result(ok, "serving", why)
    time.sleep(1)

sys.exit(run([section_daemon], 60, "vmm-loop-child-"))
'''


def wait_report(d, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = d.slow_loop_iterations()
        if entries:
            return entries
        time.sleep(0.05)
    return []


def test_hook(work):
    env = base_env(work)
    env[HOOK_ENV] = "100"
    port = free_port()
    d = Daemon(work, "sleeper", ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "s-sleeper")],
               env=env)
    d.slow_loop_expected = True
    ok, why = d.wait_healthy(port)
    tap.result(ok, "a daemon with %s=100 serves" % HOOK_ENV, why)
    entries = wait_report(d)
    if not entries and "test hooks are in debug builds only" in d.stderr():
        return "skip"
    e = entries[0] if entries else {}
    where = e.get("where", "")
    tap.result(len(entries) == 1 and e.get("usec", 0) >= 100000 and e.get("phase") == "dispatch"
               and ("on_test_loop_sleep" in where or re.match(r"vm-manager\+0x", where)) and e.get("stack"),
               "the 100 ms sleep on the loop is reported: %.1f ms at %s" % (e.get("usec", 0) / 1000, where),
               repr(entries)[:2000])
    tap.result(re.search(r"level=warning msg=\"Event loop iteration took 10\d\.\d ms .*over the 50 ms", d.stderr())
               is not None, "... and logged as a warning", d.stderr()[-2000:])
    status, _, body = http_request(port, "GET", "/metrics")
    m = re.search(rb"^vm_manager_loop_iteration_seconds_max (\S+)$", body, re.M)
    slow = re.search(rb'^vm_manager_loop_iteration_seconds_bucket\{le="0.05"\} (\S+)$', body, re.M)
    count = re.search(rb"^vm_manager_loop_iteration_seconds_count (\S+)$", body, re.M)
    tap.result(status == 200 and m and float(m.group(1)) >= 0.1 and slow and count
               and float(count.group(1)) - float(slow.group(1)) == 1,
               "/metrics: the longest iteration 0.1 s or more, one iteration above 0.05 s",
               repr((status, m and m.group(1), slow and slow.group(1), count and count.group(1))))
    rc, _ = d.stop()
    tap.result(rc == 0, "SIGTERM: exit 0", "exit %r" % rc)
    return None


def test_harness(work):
    script = os.path.join(work, "child.py")
    with open(script, "w") as f:
        f.write(CHILD % {"here": here})
    # The default mode, as every integration test runs: a sleep is the loop's own doing and fails there.
    env = dict(os.environ, VM_MANAGER_BIN=BIN)
    env.pop("VM_MANAGER_LOOP_STRICT", None)
    for arg, want in (("sleep", 1), ("quiet", 0)):
        p = subprocess.run([sys.executable, script, arg], env=env, capture_output=True, text=True, timeout=90)
        line = next((x for x in p.stdout.splitlines() if "no event loop iteration over 50 ms" in x), "")
        if want:
            ok = (p.returncode == 1 and line.startswith("not ok")
                  and re.search(r"# child \(section_daemon\): 10\d\.\d ms .* in dispatch, waiting in "
                                r"clock_nanosleep\(\), at (on_test_loop_sleep|vm-manager\+0x)", p.stdout) is not None)
            name = "a test whose daemon slept 100 ms on the loop fails, naming the daemon, section and place"
        else:
            ok = p.returncode == 0 and line.startswith("ok")
            name = "the same test without the sleep passes"
        tap.result(ok, name, "exit %r\n%s\n%s" % (p.returncode, p.stdout[-3000:], p.stderr[-1000:]))


def main():
    skipped = []

    def hook(work):
        if test_hook(work) == "skip":
            skipped.append(True)

    def harness(work):
        if skipped:
            tap.skip("the harness fails a test whose daemon slept on the loop", "no test hooks in this build")
            return
        test_harness(work)

    rc = run([hook, harness], 110, "vmm-loop-")
    if skipped and rc == 0:
        # everything that ran passed, and the point of the test could not be made here
        return 77
    return rc


if __name__ == "__main__":
    sys.exit(main())
