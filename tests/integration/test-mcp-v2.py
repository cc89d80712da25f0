#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""vm-manager's MCP endpoint at revision 2026-07-28 and 2025-11-25, against official clients.

1. The MCP conformance suite (npm @modelcontextprotocol/conformance) runs its generic server
   scenarios against one daemon, at both revisions. The checks that need tools or features this
   server does not have (the suite's reference tools, prompts, resources, logging) are listed in
   mcp-v2/conformance-<revision>.yml as expected failures, check by check; the scenarios made of
   nothing else are listed in NOT_APPLICABLE below and not run. Any other failing check fails.
2. mcp-v2/client-v2.mjs: the TypeScript SDK v2 client pinned to 2026-07-28 (stateless) on the fake
   QEMU of tests/integration/fakes calls every tool once, an error on purpose included, and
   validates each structuredContent against the tool's outputSchema (Ajv, JSON Schema 2020-12).
3. mcp-v2/task-restart-v2.mjs: the SDK v2 client pinned to 2026-07-28 creates a VM as a task of the
   Tasks extension (through its generic request(): 2.4.0 has no task helpers), the daemon is killed
   and started again on its state directory while the task works, and the finished task is read
   afterwards by a new client.

The packages are pinned in mcp-v2/package.json and package-lock.json and installed with `npm ci`
into a cache directory outside the source tree, again only when the lock file changes. The
conformance suite imports fs.globSync, which Node 22 has; on an older Node the installed file takes
it from npm's glob (pinned alongside) instead.

Without node (>= 20) or npm this prints "1..0 # SKIP" and exits 0 (meson 1.0.1 turns exit status 77
of a TAP test into an ERROR). tools/install-deps.sh check installs both.

environment: VM_MANAGER_BIN (else argv[1]) the binary; MCP_V2_CACHE_DIR (else argv[2], else
$XDG_CACHE_HOME/vm-manager/mcp-v2) where npm installs; MCP_V2_DIR the directory with package.json,
package-lock.json and the scripts (default: mcp-v2 next to this script).
Only the npm registry (npm ci, cold cache only) and 127.0.0.1 are contacted.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import importlib.util  # noqa: E402

# The daemon, TAP and npm plumbing of test-mcp-sdk.py, shared rather than copied.
_spec = importlib.util.spec_from_file_location("mcp_sdk_test", os.path.join(HERE, "test-mcp-sdk.py"))
sdk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sdk)
tap, tail, start_daemon, stop_daemon, read_text = sdk.tap, sdk.tail, sdk.start_daemon, sdk.stop_daemon, sdk.read_text

V2_DIR = os.environ.get("MCP_V2_DIR") or os.path.join(HERE, "mcp-v2")
BIN = os.environ.get("VM_MANAGER_BIN") or (sys.argv[1] if len(sys.argv) > 1 else None)
CACHE_DIR = (
    os.environ.get("MCP_V2_CACHE_DIR")
    or (sys.argv[2] if len(sys.argv) > 2 else None)
    or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vm-manager", "mcp-v2"
    )
)
NODE_MIN_MAJOR = 20
NPM_CI_TIMEOUT = 120
SCENARIO_TIMEOUT = 90
CLIENT_TIMEOUT = 110  # client-v2.mjs bails out by itself after 100 s
TASK_CLIENT_TIMEOUT = 160  # task-restart-v2.mjs bails out by itself after 150 s
TASK_READY_AFTER = 30  # the task's VM would be ready only long after the restart
STAMP_FORMAT = b"vm-manager mcp-v2 cache v1\0"
CONFORMANCE = os.path.join("node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")

# The generic server scenarios, run at each revision.
SCENARIOS = {
    "2026-07-28": ["server-stateless", "tools-list", "caching", "http-header-validation",
                   "dns-rebinding-protection", "server-sse-multiple-streams", "resources-list",
                   "sep-2164-resource-not-found"],
    "2025-11-25": ["server-initialize", "ping", "tools-list", "server-session-lifecycle",
                   "dns-rebinding-protection", "server-sse-multiple-streams", "server-sse-polling",
                   "resources-list"],
}
# Scenarios of those revisions that need what this server does not have: not run.
NOT_APPLICABLE = {
    "json-schema-2020-12": "calls the suite's reference tool json_schema_2020_12_tool",
    "http-custom-header-server-validation": "needs a tool with x-mcp-header parameters",
    "logging-set-level": "this server has no logging capability (2025-11-25)",
    "tools-call-*, tools-call-with-*": "call the suite's reference tools (test_simple_text, ...)",
    "resources-read-*, resources-templates-read, resources-subscribe, resources-unsubscribe":
        "read or follow the suite's reference resources (test://static-text, test://watched-resource, ...); "
        "this server's resources are its VMs, tested by test-mcp-resources.py",
    "prompts-*, completion-complete": "this server has no prompts and no completions",
    "input-required-result-*, elicitation-*": "need the suite's reference tools asking the client for input",
    "tasks-* (extension)": "call the suite's reference tools (slow_compute, failing_job, ...); the extension "
                           "itself is tested by test-tasks.py",
}


def find_tools():
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return None, "no %s on PATH (tools/install-deps.sh check installs them)" % " or ".join(
            n for n, p in (("node", node), ("npm", npm)) if not p)
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    m = re.match(r"v(\d+)\.", version)
    if not m or int(m.group(1)) < NODE_MIN_MAJOR:
        return None, "node %s at %s is older than %d" % (version or "(unknown)", node, NODE_MIN_MAJOR)
    return (node, npm, int(m.group(1))), None


def install(npm, node_major):
    """npm ci into CACHE_DIR unless the stamp there matches the lock file; then, on Node < 22, the
    conformance suite's globSync from npm's glob. Returns (ok, diag)."""
    h = hashlib.sha256(STAMP_FORMAT + b"node%d\0" % (node_major >= 22))
    for name in ("package.json", "package-lock.json"):
        with open(os.path.join(V2_DIR, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    digest = h.hexdigest()
    os.makedirs(CACHE_DIR, exist_ok=True)
    stamp = os.path.join(CACHE_DIR, "lock.sha256")
    try:
        with open(stamp) as f:
            if f.read().strip() == digest and os.path.exists(os.path.join(CACHE_DIR, CONFORMANCE)):
                return True, "cached: %s" % CACHE_DIR
    except OSError:
        pass
    if os.path.exists(stamp):
        os.unlink(stamp)
    shutil.rmtree(os.path.join(CACHE_DIR, "node_modules"), ignore_errors=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(os.path.join(V2_DIR, name), os.path.join(CACHE_DIR, name))
    env = dict(os.environ, npm_config_update_notifier="false", npm_config_loglevel="error")
    start = time.monotonic()
    try:
        p = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=CACHE_DIR, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=NPM_CI_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        return False, "npm ci took longer than %d s\n%s" % (NPM_CI_TIMEOUT, tail((e.stdout or b"") + (e.stderr or b"")))
    if p.returncode != 0:
        return False, "npm ci failed with status %d\n%s" % (p.returncode, tail(p.stdout + p.stderr))
    if node_major < 22:
        path = os.path.join(CACHE_DIR, CONFORMANCE)
        with open(path) as f:
            text = f.read()
        old = "import{existsSync as i,globSync as a,"
        if old not in text:
            return False, "%s: the fs import to redirect is not there (another version?)" % path
        with open(path, "w") as f:
            f.write(text.replace(old, 'import{globSync as a}from"glob";import{existsSync as i,', 1))
    with open(stamp, "w") as f:
        f.write(digest + "\n")
    return True, "npm ci into %s took %.1f s" % (CACHE_DIR, time.monotonic() - start)


SUMMARY = re.compile(r"Passed: (\d+)/(\d+), (\d+) failed, (\d+) warnings")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_scenario(node, url, version, scenario, work):
    baseline = os.path.join(V2_DIR, "conformance-%s.yml" % version)
    args = [node, CONFORMANCE, "server", "--url", url, "--scenario", scenario, "--spec-version", version]
    if os.path.exists(baseline):
        args += ["--expected-failures", baseline]
    start = time.monotonic()
    try:
        p = subprocess.run(args, cwd=CACHE_DIR, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=SCENARIO_TIMEOUT, env=dict(os.environ, NO_COLOR="1"))
        out, rc = ANSI.sub("", (p.stdout + p.stderr).decode("utf-8", "replace")), p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = ANSI.sub("", ((e.stdout or b"") + (e.stderr or b"")).decode("utf-8", "replace")), None
    m = SUMMARY.search(out)
    counts = "%s/%s checks passed, %s expected failures" % (m.group(1), m.group(2), m.group(3)) if m else "no summary"
    tap.result(rc == 0 and m is not None,
               "conformance %s %s: %s (%.1f s)" % (version, scenario, counts, time.monotonic() - start),
               None if rc == 0 and m else "exit status %r\n%s" % (rc, tail(out, 60)))
    return m


def task_restart(node, work, daemons):
    """mcp-v2/task-restart-v2.mjs: create_vm as a task through the SDK v2 client, the daemon killed
    (SIGKILL) and started again on the same port and state directory while the task works (the fake
    guest is ready only after TASK_READY_AFTER s), the finished task read afterwards."""
    daemons["task"] = start_daemon(work, "task", fakes=True, ready_after=TASK_READY_AFTER)
    proc, port, stderr_path, (healthy, why) = daemons["task"]
    if not tap.result(healthy, "daemon for the task test answers /healthz", why):
        return
    script = os.path.join(CACHE_DIR, "task-restart-v2.mjs")
    shutil.copyfile(os.path.join(V2_DIR, "task-restart-v2.mjs"), script)
    cenv = {k: v for k, v in os.environ.items() if not k.startswith("VM_MANAGER_")}
    start = time.monotonic()
    c = subprocess.Popen([node, script, "http://127.0.0.1:%d/mcp" % port], cwd=CACHE_DIR, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cenv)
    out, restarted = [], False
    for raw in c.stdout:
        line = raw.decode("utf-8", "replace")
        out.append(line)
        if line.startswith("# task "):
            proc.kill()
            proc.wait()
            daemons["task"] = start_daemon(work, "task", fakes=True, ready_after=TASK_READY_AFTER, port=port)
            restarted = daemons["task"][3][0]
            tap.diag("daemon killed (SIGKILL) and started again while task %s worked: %s" % (
                line.split()[2], "healthy" if restarted else daemons["task"][3][1]))
            c.stdin.write(b"restarted\n")
            c.stdin.flush()
            break
    try:
        rest, cerr = c.communicate(timeout=max(1, TASK_CLIENT_TIMEOUT - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        c.kill()
        rest, cerr = c.communicate()
    seen, failed, plan, bailed = sdk.pass_through("".join(out) + rest.decode("utf-8", "replace"))
    finished = restarted and seen > 0 and plan == seen and not bailed and c.returncode == (1 if failed else 0)
    tap.result(finished, "task-restart-v2.mjs (SDK v2, a task across a daemon restart): ran to the end, %d tests, "
               "%d failed (%.1f s)" % (seen, failed, time.monotonic() - start),
               None if finished else "exit %r, restarted %r\nstderr:\n%s\n%s" % (
                   c.returncode, restarted, tail(cerr), tail(read_text(stderr_path))))


def main():
    tools, why = find_tools()
    if not tools:
        print("1..0 # SKIP %s" % why)
        return 0
    if not BIN:
        print("1..0 # SKIP no vm-manager binary (VM_MANAGER_BIN)")
        return 0
    node, npm, major = tools
    ok, diag = install(npm, major)
    if not tap.result(ok, "npm ci of mcp-v2/package-lock.json (conformance, SDK v2 client, ajv)", diag):
        print("1..%d" % tap.n)
        return 1
    for name, why in NOT_APPLICABLE.items():
        tap.diag("not applicable: %s: %s" % (name, why))

    work = tempfile.mkdtemp(prefix="vmm-mcp-v2-")
    daemons = {}
    try:
        daemons["main"] = start_daemon(work, "main", fakes=True, ready_after=2)
        proc, port, stderr_path, (healthy, why) = daemons["main"]
        if not tap.result(healthy, "daemon answers /healthz", why):
            return 1
        url = "http://127.0.0.1:%d/mcp" % port
        for version, scenarios in SCENARIOS.items():
            for scenario in scenarios:
                run_scenario(node, url, version, scenario, work)
        # Node resolves the packages from the script's directory: run it from the cache.
        script = os.path.join(CACHE_DIR, "client-v2.mjs")
        shutil.copyfile(os.path.join(V2_DIR, "client-v2.mjs"), script)
        sdk.CACHE_DIR = CACHE_DIR
        c, start = sdk.start_client(node, script, [url])
        sdk.finish_client("client-v2.mjs (SDK v2, pinned 2026-07-28)", c, start, CLIENT_TIMEOUT, [stderr_path])
        task_restart(node, work, daemons)
    finally:
        for name, d in daemons.items():
            stop_daemon(name, d[0], d[2])
        shutil.rmtree(work, ignore_errors=True)
    print("1..%d" % tap.n)
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
