#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The container image (deploy/container/build.sh) built here with mmdebstrap and buildah (rootful,
vfs, runc, the project's containers.conf; the Debian root cached under /var/cache/vm-manager), then:

  * the chart's pod as podman runs it: its init container (`vm-manager image pull`) fetches the
    test image, pushed with `vm-manager image push` to a loopback docker-registry, into the state
    volume; the daemon starts on it with the pod's arguments and environment, the host network and
    /dev/kvm where there is one; its probes answer, and get_host names the pinned OVMF package and
    version, QEMU 10 (bookworm-backports), swtpm and a READY=1 transport;
  * a VM of the test image (tests/image, real boots under TCG) created through the API in the
    container reaches ready; stopping the container ends it;
  * the chart's test pod (`helm test`), rendered for this image and port, runs its command in the
    image as the pod would (user 65534, read-only root, no capabilities) and gets /healthz;
  * the image goes to a loopback docker-registry with `podman push` and comes back with `podman
    pull` into an empty storage: the same manifest digest, and the pulled image runs.

Skips (exit 0, "1..0 # SKIP") without root, podman, buildah, runc or mmdebstrap; without docker-registry,
helm or PyYAML the chart's part and the registry's are skipped and the daemon runs on a copy of the
test image.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
from ocitest import REGISTRY_BIN, Registry  # noqa: E402
from vmmtest import SANITIZER_RE, api, free_port, http_request, tap  # noqa: E402

SOURCE_ROOT = os.path.abspath(os.path.join(here, "..", ".."))
BIN = os.environ.get("VM_MANAGER_BIN")
IMAGE_DIR = os.environ.get("VM_MANAGER_TEST_IMAGE_DIR")
STORAGE_DIR = os.environ.get("VM_MANAGER_CONTAINER_STORAGE")
BUILD_SH = os.path.join(SOURCE_ROOT, "deploy", "container", "build.sh")
CONTAINERS_CONF = os.path.join(SOURCE_ROOT, "deploy", "container", "containers.conf")
CREATE = {"memory_mib": 512, "disk_gib": 1, "require_attestation": False}
TAG = "test-%d" % os.getpid()
NAME = "localhost/vm-manager:" + TAG
HELM_CACHE = os.environ.get("VM_MANAGER_HELM_CACHE")


def pinned_ovmf():
    with open(BUILD_SH) as f:
        return re.search(r"^OVMF_VERSION=(\S+)$", f.read(), re.M).group(1)


def podman_env(storage):
    env = dict(os.environ)
    env.update(CONTAINERS_CONF=CONTAINERS_CONF, CONTAINERS_STORAGE_CONF=os.path.join(storage, "storage.conf"),
               TMPDIR=os.path.join(storage, "tmp"))
    return env


def podman(storage, *args, timeout=600, check=False):
    p = subprocess.run(["podman", "--tmpdir", os.path.join(storage, "libpod")] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=podman_env(storage),
                       timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("podman %s: exit %d: %s" % (" ".join(args), p.returncode, p.stdout[-2000:]))
    return p


def new_storage(path):
    """An empty containers storage of our own, as build.sh writes it."""
    os.makedirs(os.path.join(path, "tmp"), exist_ok=True)
    with open(os.path.join(path, "storage.conf"), "w") as f:
        f.write('[storage]\ndriver = "vfs"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' % (path, path))
    return path


def wait_healthy(port, proc_alive, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _, _ = http_request(port, "GET", "/healthz", timeout=5)
            if status == 200:
                return True
        except OSError:
            pass
        if not proc_alive():
            return False
        time.sleep(0.3)
    return False


def build():
    t0 = time.monotonic()
    env = dict(os.environ, STORAGE_DIR=STORAGE_DIR)
    p = subprocess.run(["bash", BUILD_SH, BIN, NAME], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, timeout=1800)
    took = time.monotonic() - t0
    cached = "from the cache" in p.stdout
    tap.result(p.returncode == 0, "deploy/container/build.sh: %s in %.0f s (root %s)"
               % (NAME, took, "from the cache" if cached else "made by mmdebstrap"), p.stdout[-3000:])
    if p.returncode != 0:
        return False
    p = podman(STORAGE_DIR, "image", "inspect", NAME)
    info = json.loads(p.stdout)[0] if p.returncode == 0 else {}
    layers = info.get("RootFS", {}).get("Layers", [])
    config = info.get("Config", {})
    tap.result(len(layers) == 2 and config.get("Entrypoint") == ["/usr/bin/vm-manager"]
               and "VM_MANAGER_LAUNCHER=process" in config.get("Env", []),
               "two layers (the Debian root, the daemon), the daemon as entrypoint, the process launcher",
               json.dumps({"layers": layers, "config": config})[:1500])
    return True


def fetch_helm():
    if not HELM_CACHE:
        return None, "no VM_MANAGER_HELM_CACHE"
    p = subprocess.run([os.path.join(SOURCE_ROOT, "tools", "fetch-helm.sh"), os.path.join(HELM_CACHE, "helm")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    return (p.stdout.strip().splitlines()[-1], "") if p.returncode == 0 else (None, "no helm: " + p.stdout[-300:])


def render_chart(helm, values):
    """The chart's objects for values, as the cluster would get them (None when it does not render)."""
    import yaml

    p = subprocess.run([helm, "template", "r", os.path.join(SOURCE_ROOT, "deploy", "helm", "vm-manager"), "-n", "vms",
                        "-f", "-"], input=json.dumps(values), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    if p.returncode != 0:
        tap.diag(p.stdout[-1500:])
        return None
    return [o for o in yaml.safe_load_all(p.stdout) if o]


def env_args(container, port):
    """A container's env as podman -e flags; the listener on loopback (the pod's would face the host's
    network here)."""
    out = []
    for e in container.get("env", []):
        value = e.get("value", "")
        if e["name"] == "VM_MANAGER_LISTEN":
            value = "127.0.0.1:%d" % port
        out += ["-e", "%s=%s" % (e["name"], value)]
    return out


def test_run(work, registry_port):
    """The StatefulSet's pod as podman runs it: the init container pulls the guest image (pushed by
    `vm-manager image push` to the loopback registry) into the state volume, then the daemon starts on
    it with the pod's arguments and environment."""
    state = os.path.join(work, "state")
    os.makedirs(os.path.join(state, "images"))
    port = free_port()
    helm, why = fetch_helm()
    try:
        import yaml  # noqa: F401
    except ImportError:
        helm, why = None, "no python3-yaml"
    objs = None
    if helm and registry_port:
        repo = "127.0.0.1:%d/giantswarm/vm-manager-guest-image" % registry_port
        p = subprocess.run([BIN, "image", "push", "--plain-http", "--image-dir", IMAGE_DIR, "test-vm_1.0", repo + ":1.0"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                           env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
        tap.result(p.returncode == 0, "vm-manager image push of the test image to the loopback registry", p.stdout[-1500:])
        objs = render_chart(helm, {"image": {"registry": "localhost", "repository": "vm-manager", "tag": TAG},
                                   "guestImage": {"repository": repo, "tag": "1.0", "plainHttp": True},
                                   "service": {"port": port}})
    if objs is None:
        tap.skip("the chart's pod (init container, daemon, test pod) in podman",
                 why or "no docker-registry (tools/install-deps.sh check)")
        for f in os.listdir(IMAGE_DIR):
            if f.endswith((".efi", ".raw")):
                shutil.copy(os.path.join(IMAGE_DIR, f), os.path.join(state, "images"))
        pod, daemon, args = {}, {"env": [{"name": "VM_MANAGER_LISTEN"}]}, []
    else:
        pod = next(o for o in objs if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
        daemon = pod["containers"][0]
        args = daemon["args"]
        init = pod["initContainers"][0]
        sc = init["securityContext"]
        flags = (["--read-only"] if sc.get("readOnlyRootFilesystem") else []) + \
            (["--cap-drop", "ALL"] if "ALL" in sc.get("capabilities", {}).get("drop", []) else []) + \
            (["--security-opt", "no-new-privileges"] if sc.get("allowPrivilegeEscalation") is False else [])
        t0 = time.monotonic()
        p = podman(STORAGE_DIR, "run", "--rm", "--network", "host", *flags,
                   "-v", "%s:%s" % (state, init["volumeMounts"][0]["mountPath"]), *env_args(init, port),
                   init["image"], *init["args"])
        tap.result(p.returncode == 0 and os.path.exists(os.path.join(state, "images", "test-vm_1.0.efi")),
                   "the chart's init container (%s) pulls the guest image into the state volume (%.0f s)"
                   % (" ".join(init["args"]), time.monotonic() - t0), p.stdout[-2000:])

    name = "vmm-test-%d" % os.getpid()
    devices = []
    for dev in ("/dev/kvm", "/dev/vhost-vsock", "/dev/net/tun"):
        if os.path.exists(dev):
            devices += ["--device", dev]
    p = podman(STORAGE_DIR, "run", "-d", "--name", name, "--network", "host", *devices,
               "-v", "%s:/var/lib/vm-manager" % state, *env_args(daemon, port),
               "-e", "ASAN_OPTIONS=detect_leaks=0", NAME, *args)
    tap.result(p.returncode == 0, "podman run --network host %s %s %s" % (" ".join(devices), NAME, " ".join(args)),
               p.stdout[-2000:])
    if p.returncode != 0:
        return
    try:
        def alive():
            return podman(STORAGE_DIR, "inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true"

        ok = wait_healthy(port, alive)
        tap.result(ok, "the daemon in the container serves /healthz", podman(STORAGE_DIR, "logs", name).stdout[-3000:])
        if not ok:
            return
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            path = daemon.get(probe, {}).get("httpGet", {}).get("path")
            if path:
                status, _, _ = http_request(port, "GET", path)
                tap.result(status == 200, "the pod's %s (%s) answers 200" % (probe, path), str(status))
        status, host = api(port, "GET", "/host")
        fw = (host or {}).get("firmware", {})
        tap.result(status == 200 and fw.get("package") == "ovmf" and fw.get("version") == pinned_ovmf(),
                   "get_host: the firmware is the pinned package, ovmf %s" % pinned_ovmf(), json.dumps(host)[:1500])
        qemu = (host or {}).get("qemu", {})
        tap.result(qemu.get("found") and str(qemu.get("version", "")).startswith("10.")
                   and host.get("swtpm", {}).get("found") and host.get("notify", {}).get("transport") != "none",
                   "get_host: QEMU 10, swtpm and a READY=1 transport in the image", json.dumps(host)[:1500])

        if objs:
            test_chart_test_pod(objs)

        t0 = time.monotonic()
        status, vm = api(port, "POST", "/vms", dict(CREATE, name="pod"), timeout=600)
        tap.result(status == 201 and vm.get("state") == "ready",
                   "create_vm through the container's API: ready (%.0f s)" % (time.monotonic() - t0),
                   repr(vm)[:1500] + podman(STORAGE_DIR, "logs", name).stdout[-3000:])
        top = podman(STORAGE_DIR, "top", name, "args").stdout
        tap.result(status != 201 or "qemu-system-x86_64" in top, "... its QEMU runs inside the container", top[-1500:])
    finally:
        logs = podman(STORAGE_DIR, "logs", name).stdout
        p = podman(STORAGE_DIR, "stop", "-t", "60", name)
        code = podman(STORAGE_DIR, "inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        tap.result(p.returncode == 0 and code == "0", "podman stop: the daemon powers the VM down and exits 0",
                   p.stdout + code)
        podman(STORAGE_DIR, "rm", "-f", name)
        bad = [line for line in logs.splitlines() if SANITIZER_RE.search(line)]
        tap.result(not bad, "no sanitizer report in the container's log", "\n".join(bad[:20]))


def test_chart_test_pod(objs):
    """The chart's `helm test` pod, run as its securityContext says, with the Service's name pointing
    at the daemon."""
    pod = next((o for o in objs if o["kind"] == "Pod" and
                o["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"), None)
    if not tap.result(pod is not None and pod["spec"]["containers"][0]["image"] == NAME,
                      "the chart renders its test pod for this image", json.dumps(pod)[:1500]):
        return
    c = pod["spec"]["containers"][0]
    user = pod["spec"]["securityContext"]["runAsUser"]
    host = c["command"][-1].split("//", 1)[1].split(":", 1)[0]
    r = podman(STORAGE_DIR, "run", "--rm", "--network", "host", "--add-host", "%s:127.0.0.1" % host,
               "--user", "%d:%d" % (user, user), "--read-only", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "--entrypoint", c["command"][0], NAME, *c["command"][1:])
    tap.result(r.returncode == 0 and r.stdout.rstrip().endswith("ok"),
               "the chart's test pod: %s gets ok" % c["command"][-1], r.stdout[-1500:])


def test_registry(work, port):
    if not port:
        tap.skip("push to and pull from a loopback registry", "no docker-registry (tools/install-deps.sh check)")
        return
    remote = "127.0.0.1:%d/giantswarm/vm-manager:test" % port
    digest_file = os.path.join(work, "digest")
    t0 = time.monotonic()
    p = podman(STORAGE_DIR, "push", "--tls-verify=false", "--digestfile", digest_file, NAME, remote)
    tap.result(p.returncode == 0, "podman push to the loopback docker-registry (%.0f s)" % (time.monotonic() - t0),
               p.stdout[-2000:])
    if p.returncode != 0:
        return
    with open(digest_file) as f:
        pushed = f.read().strip()

    other = new_storage(os.path.join(work, "pulled"))
    t0 = time.monotonic()
    p = podman(other, "pull", "--tls-verify=false", remote)
    took = time.monotonic() - t0
    q = podman(other, "image", "inspect", "-f", "{{.Digest}}", remote)
    tap.result(p.returncode == 0 and q.stdout.strip() == pushed,
               "podman pull into an empty storage: the digest that was pushed (%.0f s)" % took,
               p.stdout[-2000:] + q.stdout + " pushed " + pushed)
    r = podman(other, "run", "--rm", "--network", "none", remote, "version")
    # (podman's own warnings share the output)
    tap.result(r.returncode == 0 and re.search(r"^vm-manager version ", r.stdout, re.M),
               "the pulled image runs: vm-manager version", r.stdout[-1000:])
    podman(other, "rmi", "-a", "-f")


def main():
    print("TAP version 13", flush=True)
    missing = [t for t in ("podman", "buildah", "runc", "mmdebstrap") if not shutil.which(t)]
    if os.geteuid() != 0:
        print("1..0 # SKIP needs root (rootful buildah and podman, mmdebstrap)")
        return 0
    if missing:
        print("1..0 # SKIP needs %s (tools/install-deps.sh deploy)" % ", ".join(missing))
        return 0
    if not BIN or not IMAGE_DIR or not STORAGE_DIR:
        print("1..0 # SKIP needs VM_MANAGER_BIN, VM_MANAGER_TEST_IMAGE_DIR and VM_MANAGER_CONTAINER_STORAGE")
        return 0
    started = time.monotonic()
    b = subprocess.run(["bash", os.path.join(SOURCE_ROOT, "tests/image/build.sh"), IMAGE_DIR],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not tap.result(b.returncode == 0, "tests/image/build.sh", b.stdout[-2000:]):
        print("1..%d" % tap.n)
        return 1
    work = tempfile.mkdtemp(prefix="vmm-container-")
    try:
        if build():
            # the registry of the image push/pull tests (tests/integration/ocitest.py)
            registry = Registry(work, "registry") if REGISTRY_BIN else None
            port = registry.port if registry else None
            try:
                for section in (test_run, test_registry):
                    t0 = time.monotonic()
                    try:
                        section(work, port)
                    except Exception:  # noqa: BLE001
                        import traceback
                        tap.result(False, "%s ran to the end" % section.__name__, traceback.format_exc())
                    tap.diag("%s: %.1f s" % (section.__name__, time.monotonic() - t0))
            finally:
                if registry:
                    registry.stop()
    finally:
        podman(STORAGE_DIR, "rmi", "-f", NAME)
        shutil.rmtree(work, ignore_errors=True)
    tap.diag("total: %.1f s" % (time.monotonic() - started))
    print("1..%d" % tap.n, flush=True)
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
