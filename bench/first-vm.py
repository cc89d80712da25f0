#!/usr/bin/env python3
"""How long a first VM that cannot work takes to say so, request to answer:

  refused   create_vm (require_attestation, verify mode) on an image without golden values: refused
            before anything is allocated. 300 requests on one connection; /healthz beside it.
  rejected  create_vm (wait_for ready) of the real guest image whose policy.json holds golden values
            that do not match this host (every golden PCR set to ff..ff): the boot runs until the
            initrd quote, whose verdict answers the request. With BASELINE_BIN (an older
            vm-manager), the same create on it, one after the other in the same run.

usage: bench/first-vm.py VM_MANAGER [IMAGE_DIR]      (IMAGE_DIR default images/build; without an
       image there, only the refused case runs). Prints markdown rows for docs/benchmarks.md.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "integration"))
from vmmtest import serve_ready  # noqa: E402
FAKES = os.path.join(here, "..", "tests", "integration", "fakes")


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(120)
    except subprocess.TimeoutExpired:
        p.kill()


def timed(conn, method, path, body=None):
    t0 = time.perf_counter()
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"} if body is not None else {})
    r = conn.getresponse()
    data = r.read()
    return time.perf_counter() - t0, r.status, data


def ms(xs, q):
    xs = sorted(xs)
    return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))]


def refused(binary, work):
    images = os.path.join(work, "images-refused")
    os.makedirs(images)
    for ext in (".efi", ".raw"):
        with open(os.path.join(images, "fake_1.0" + ext), "wb") as f:
            f.write(b"\0" * 4096)
    zero = "00" * 32
    with open(os.path.join(images, "fake_1.0.policy.json"), "w") as f:
        json.dump({"image_id": "fake", "image_version": "1.0",
                   "pcr11": {"enter-initrd": zero, "enter-initrd:leave-initrd:sysinit:ready": zero}}, f)
    env = dict(os.environ, PATH=FAKES + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
    p, port = serve_ready(binary, os.path.join(work, "s-refused"), images,
                          ["--launcher", "process", "--log-level", "warning"], env=env)
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        creates, health = [], []
        for i in range(300):
            t, status, data = timed(c, "POST", "/api/v1/vms", {"name": "first%d" % i})
            assert status == 501, (status, data[:200])
            creates.append(t)
            t, status, _ = timed(c, "GET", "/healthz")
            health.append(t)
        print("| refused create_vm (no golden values), request to answer, 300 on one connection | p50 %.2f ms, "
              "p99 %.2f ms, max %.2f ms (GET /healthz beside it: p50 %.2f ms) |"
              % (ms(creates, .5), ms(creates, .99), 1000 * max(creates), ms(health, .5)))
    finally:
        stop(p)


def rejected(binary, label, work, image_dir):
    images = os.path.join(work, "images-" + label)
    shutil.copytree(image_dir, images, copy_function=os.link)
    pol_path = os.path.join(images, "policy.json")
    with open(pol_path) as f:
        pol = json.load(f)
    pol["golden"] = {"sha256": {str(i): "ff" * 32 for i in (0, 2, 3, 4, 6, 7)}}
    pol.pop("golden_firmware", None)
    os.unlink(pol_path)  # a hard link: write a file of its own
    with open(pol_path, "w") as f:
        json.dump(pol, f)
    p, port = serve_ready(binary, os.path.join(work, "s-" + label), images,
                          ["--launcher", "process", "--attestation", "verify", "--install-timeout", "30m",
                           "--boot-timeout", "20m"])
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        t, status, data = timed(c, "POST", "/api/v1/vms", {"name": "rejected", "memory_mib": 2048, "disk_gib": 4,
                                                            "wait_for": "ready"})
        err = (json.loads(data or b"{}").get("error") or {})
        print("| rejected boot of the real image (%s), create_vm request to answer | %.0f s, %d %s: %s |"
              % (label, t, status, err.get("code", ""), err.get("message", "")[:120].replace("|", "/")))
    finally:
        stop(p)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    image_dir = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "images", "build"))
    work = tempfile.mkdtemp(prefix="bench-first-", dir="/var/tmp")
    try:
        print("| case | figure |")
        print("|---|---|")
        refused(binary, work)
        if os.path.exists(os.path.join(image_dir, "policy.json")):
            rejected(binary, "this build", work, image_dir)
            if os.environ.get("BASELINE_BIN"):
                rejected(os.path.abspath(os.environ["BASELINE_BIN"]), "baseline", work, image_dir)
        else:
            print("| rejected boot | skipped: no image in %s |" % image_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
