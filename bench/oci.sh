#!/usr/bin/env bash
# Push and pull of the guest image to a registry on loopback: `vm-manager image push|pull` side by
# side with `oras push|pull` of the same files, in one run. Each measurement gets a fresh registry
# (Debian's docker-registry 2.8, filesystem store on the same disk) and a fresh target directory;
# the rounds alternate which tool goes first; the medians go into docs/benchmarks.md.
#
#   usage: bench/oci.sh [path/to/vm-manager]        (ROUNDS=3, IMAGE_DIR=..., WORK=/var/tmp)
#
# IMAGE_DIR is the image directory to move (default: the newest build in
# /var/cache/vm-manager/images, else images/build). Without one, a directory of the same layout and
# about 700 MB of incompressible data is generated, and the output says so. The image is copied
# first (sparse), so that a cache rotating underneath does not matter.
set -euo pipefail

bin=${1:-build/src/daemon/vm-manager}
root=$(cd "$(dirname "$0")/.." && pwd)
registry=$(command -v docker-registry || echo /var/cache/vm-manager/docker-registry/usr/bin/docker-registry)
for t in "$bin" "$registry"; do
        [ -x "$t" ] || { echo "bench: $t is missing (make build; tools/install-deps.sh bench)" >&2; exit 1; }
done
command -v oras >/dev/null || { echo "bench: oras is missing (tools/install-deps.sh bench)" >&2; exit 1; }

image_dir=${IMAGE_DIR:-}
if [ -z "$image_dir" ]; then
        image_dir=$(ls -1dt /var/cache/vm-manager/images/image-*/ 2>/dev/null | head -n 1 || true)
        [ -n "$image_dir" ] || { [ -d "$root/images/build" ] && image_dir=$root/images/build; } || true
fi

exec python3 - "$bin" "$registry" "$image_dir" "${ROUNDS:-3}" "${WORK:-/var/tmp}" <<'EOF'
import glob, json, os, random, shutil, socket, statistics, subprocess, sys, tempfile, time

vmm, registry, image_dir, rounds, workroot = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
ART = "application/vnd.giantswarm.vm-image.v1"
work = tempfile.mkdtemp(prefix="bench-oci-", dir=workroot)
env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
src = os.path.join(work, "src")

def sh(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, env=env, **kw)

try:
    synthetic = not image_dir
    if synthetic:
        # the layout of images/build, 700 MB of random bytes (nothing compresses)
        os.makedirs(os.path.join(src, "sysupdate", "base"))
        os.makedirs(os.path.join(src, "sysupdate", "kubernetes"))
        ref = "giantswarm-vm-base_0.1.0"
        def rnd(path, mb):
            with open(path, "wb") as f:
                for _ in range(mb):
                    f.write(random.randbytes(1 << 20))
        rnd(os.path.join(src, ref + ".efi"), 77)
        rnd(os.path.join(src, ref + ".raw"), 300)
        rnd(os.path.join(src, "sysupdate", "base", ref + "_root.raw"), 156)
        rnd(os.path.join(src, "sysupdate", "kubernetes", "kubernetes_1.36.4.raw"), 167)
        for d in ("base", "kubernetes"):
            for n in ("SHA256SUMS", "SHA256SUMS.gpg"):
                open(os.path.join(src, "sysupdate", d, n), "w").write("x\n")
        template = json.load(open(os.path.join(os.path.dirname(vmm), "../../../tests/data/attest/policy.json")))
        template.update(image_version="0.1.0", uki=ref + ".efi")
        json.dump(template, open(os.path.join(src, "policy.json"), "w"))
        json.dump({"image": ref}, open(os.path.join(src, "manifest.json"), "w"))
    else:
        sh("cp", "-a", "--sparse=always", os.path.join(image_dir, "."), src)
        ref = [f[:-4] for f in os.listdir(src) if f.endswith(".efi")][0]
    files = [ref + ".efi", ref + ".raw", "policy.json", "manifest.json"]
    trees = sorted("sysupdate/" + d for d in os.listdir(os.path.join(src, "sysupdate")))
    total = 0
    for dp, _, fs in os.walk(src):
        total += sum(os.path.getsize(os.path.join(dp, f)) for f in fs)
    print("image: %s (%s), %d files, %.1f MB%s" % (ref, image_dir or "generated", len(files) + len(trees), total / 1e6,
                                                   "; synthetic: random data in the layout of images/build" if synthetic else ""))

    def free_port():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        return p

    def start_registry(name):
        port = free_port()
        store = os.path.join(work, "store-" + name)
        cfg = os.path.join(work, name + ".yml")
        open(cfg, "w").write("version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n"
                             "  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%d\n" % (store, port))
        p = subprocess.Popen([registry, "serve", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        return p, "127.0.0.1:%d" % port, store

    def timed(args, cwd=None):
        t0 = time.monotonic()
        out = sh(*args, cwd=cwd)
        return time.monotonic() - t0, out.stdout.decode()

    TOOLS = ["vm-manager", "vm-manager --gzip-level 1", "oras"]
    results = {t: {} for t in TOOLS}
    def add(tool, what, secs):
        results[tool].setdefault(what, []).append(secs)

    wire = {}
    for r in range(rounds):
        order = TOOLS if r % 2 == 0 else TOOLS[::-1]
        for i, tool in enumerate(order):
            proc, host, store = start_registry("%d-%d" % (i, r))
            target = "%s/bench/image:%d" % (host, r)
            dst = os.path.join(work, "pull-%d-%d" % (i, r))
            try:
                if tool.startswith("vm-manager"):
                    extra = tool.split()[1:]
                    secs, out = timed([vmm, "image", "push", "--plain-http", "--json", "--image-dir", src] + extra + [ref, target])
                    add(tool, "push", secs)
                    wire[tool] = json.loads(out)["size"]
                    secs, _ = timed([vmm, "image", "push", "--plain-http", "--image-dir", src] + extra + [ref, target])
                    add(tool, "push again", secs)
                    secs, _ = timed([vmm, "image", "pull", "--plain-http", "--image-dir", dst, target])
                    add(tool, "pull", secs)
                    secs, _ = timed([vmm, "image", "pull", "--plain-http", "--image-dir", dst, target])
                    add(tool, "pull again", secs)
                else:
                    secs, _ = timed(["oras", "push", "--plain-http", "--artifact-type", ART, target] + files + trees, cwd=src)
                    add(tool, "push", secs)
                    m = json.loads(sh("oras", "manifest", "fetch", "--plain-http", target).stdout)
                    wire[tool] = sum(l["size"] for l in m["layers"])
                    secs, _ = timed(["oras", "push", "--plain-http", "--artifact-type", ART, target] + files + trees, cwd=src)
                    add(tool, "push again", secs)
                    os.makedirs(dst)
                    secs, _ = timed(["oras", "pull", "--plain-http", target, "-o", dst])
                    add(tool, "pull", secs)
                    secs, _ = timed(["oras", "pull", "--plain-http", target, "-o", dst])
                    add(tool, "pull again", secs)
                same = subprocess.run(["diff", "-r", "-x", ".*", src, dst], capture_output=True).returncode == 0
                if not same:
                    sys.exit("bench: %s's pull differs from the source" % tool)
            finally:
                proc.terminate()
                proc.wait()
                shutil.rmtree(store, ignore_errors=True)
                shutil.rmtree(dst, ignore_errors=True)

    print("rounds: %d; MB/s = the image's %.1f MB of files / wall-clock seconds (median)" % (rounds, total / 1e6))
    print("")
    print("| tool | push | push MB/s | pull | pull MB/s | push again | pull again | bytes on the wire |")
    print("|---|---|---|---|---|---|---|---|")
    for tool in TOOLS:
        m = {k: statistics.median(v) for k, v in results[tool].items()}
        print("| `%s` | %.1f s | %.0f | %.1f s | %.0f | %.2f s | %.2f s | %.1f MB |" % (
            tool, m["push"], total / 1e6 / m["push"], m["pull"], total / 1e6 / m["pull"], m["push again"],
            m["pull again"], wire[tool] / 1e6))
    print("")
    for tool in TOOLS:
        print("%s: %s" % (tool, "; ".join("%s %s" % (k, " ".join("%.2f" % x for x in v)) for k, v in results[tool].items())))
finally:
    shutil.rmtree(work, ignore_errors=True)
EOF
