#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""`vm-manager image push` and `image pull` against real parts (tests/integration/ocitest.py):
Debian's docker-registry (distribution 2.8) on 127.0.0.1 with a filesystem store, oras 1.3 from
sid, htpasswd (bcrypt) and token auth, TLS with a CA of the test's own, and a proxy in front of the
registry that logs every request and cuts, stalls or answers in its place.

  * layout: the manifest (v1.1, artifactType, empty config, a layer per file or tree with oras's
    annotations); oras pulls our artifact into the same files, we pull oras's;
  * the layout file (<ref>.layout.json): pushed as a layer and pulled byte for byte; an image without
    one pushes and pulls without it; a pull of a build without one removes an older build's from the
    directory (and a failed pull does not);
  * nothing twice: a second pull of the same digest, a second push of the same image send no blob;
  * resume: a download cut in the middle continues with a Range request; an upload cut inside a
    chunk starts that blob again (distribution 2.8 drops such an upload), one cut between chunks
    continues where the registry got to;
  * hostile artifacts (traversal in a title, a tar leaving its directory, a layer larger than it
    says, a digest mismatch, 100,000 layers, a 1 GiB config, no image at all) fail with one line and
    leave the directory as it was; so does a pull killed with -9, whose leftovers the next pull
    removes, and one whose --timeout passes while the registry trickles a blob (the error naming
    the blob and the bytes received);
  * auth: anonymous, Basic from --password-stdin and from credentials files, the token flow, wrong
    passwords; no credential ever in a message; TLS only with --ca-file, plain http only when asked;
  * --policy keep|replace, a policy.json of another image left alone, the directory lock;
  * a daemon serving the directory while pulls replace its image: list_images never shows it half
    (nor a build without a layout file with the other build's), lists the pulled layout file,
    a VM created before keeps its state, and files it had open keep their old bytes.

Skips when docker-registry is missing; the oras checks skip without oras.
"""

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

from vmmtest import BIN, Daemon, HOST, base_env, diff_snapshots, free_port, http_request, run, snapshot_tree, tap  # noqa: E402
import ocitest  # noqa: E402
from ocitest import Proxy, Registry, TokenServer, blob_rule, make_image, nth_rule  # noqa: E402

FAKES = os.path.join(here, "fakes")
IMAGE = "giantswarm-vm-base_1.0"
ARTIFACT_TYPE = "application/vnd.giantswarm.vm-image.v1"
PASSWORD = "s3cret-Pa55word"


def env_for(work, **extra):
    env = base_env(work)
    for k in list(env):
        if k.lower().endswith("_proxy") or k in ("DOCKER_CONFIG", "REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR"):
            del env[k]
    env.update(extra)
    return env


def vmm(work, args, stdin=None, env=None, timeout=120):
    """Runs vm-manager; (exit status, stdout, stderr)."""
    p = subprocess.run([BIN] + args, input=stdin, capture_output=True, timeout=timeout,
                       env=env if env is not None else env_for(work))
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def push(work, image_dir, ref, *extra, **kw):
    return vmm(work, ["image", "push", "--plain-http", "--json", "--image-dir", image_dir, *extra, IMAGE, ref], **kw)


def pull(work, image_dir, ref, *extra, **kw):
    return vmm(work, ["image", "pull", "--plain-http", "--json", "--image-dir", image_dir, *extra, ref], **kw)


def result(rc, out, err):
    if rc != 0:
        raise AssertionError("exit %d: %s" % (rc, err.strip()))
    return json.loads(out)


def one_error_line(rc, err, words):
    lines = [x for x in err.splitlines() if x.strip()]
    ok = rc == 1 and len(lines) == 1 and lines[0].startswith("Error: ") and all(w in lines[0] for w in words)
    return ok, "exit %d, stderr %r" % (rc, err[-600:])


def tree_equal(a, b, ignore=(".%s.oci.json" % IMAGE,)):
    sa = {k: v[:3] for k, v in snapshot_tree(a).items() if k not in ignore and k != "."}
    sb = {k: v[:3] for k, v in snapshot_tree(b).items() if k not in ignore and k != "."}
    return sa == sb, diff_snapshots(sa, sb)[:2000]


def leftovers(d):
    return [n for n in os.listdir(d) if n.startswith(".pull-")]


def blob_requests(log, method="GET"):
    return [e for e in log if e.method == method and "/blobs/" in e.path and "/uploads/" not in e.path]


def oras_pull(work, ref, name):
    """oras pull of ref into a new directory work/name; (that directory, the finished process)."""
    out_dir = os.path.join(work, name)
    os.makedirs(out_dir)
    return out_dir, subprocess.run([ocitest.ORAS_BIN, "pull", "--plain-http", ref], cwd=out_dir,
                                   capture_output=True, env=env_for(work))


state = {}


# ---------------------------------------------------------------------------------------------
# 1. layout and interop


def test_layout_and_interop(work):
    reg = Registry(work, "plain")
    proxy = Proxy(reg.port)
    state.update(reg=reg, proxy=proxy)
    src = os.path.join(work, "src")
    make_image(src, gen="a")
    ref = "%s/vm/base:1.0" % proxy.host

    rc, out, err = push(work, src, ref)
    tap.check("push: exit 0 and --json names the image, the reference and the manifest digest",
              lambda: ((res := result(rc, out, err))["image"] == IMAGE and res["reference"] == ref
                       and res["digest"].startswith("sha256:") and res["layers"] == 6, out + err))
    pushed = json.loads(out) if rc == 0 else {}
    state["digest_a"] = pushed.get("digest")

    m, raw = ocitest.get_manifest(reg.host, "vm/base", "1.0")

    def layout():
        problems = []
        if m.get("mediaType") != "application/vnd.oci.image.manifest.v1+json" or m.get("schemaVersion") != 2:
            problems.append("not an OCI image manifest")
        if m.get("artifactType") != ARTIFACT_TYPE:
            problems.append("artifactType %r" % m.get("artifactType"))
        cfg = m.get("config", {})
        if (cfg.get("mediaType"), cfg.get("digest"), cfg.get("size")) != (
                "application/vnd.oci.empty.v1+json", ocitest.sha256(b"{}"), 2):
            problems.append("config %r" % cfg)
        titles = [x.get("annotations", {}).get("org.opencontainers.image.title") for x in m["layers"]]
        if titles != [IMAGE + ".efi", IMAGE + ".raw", "policy.json", "manifest.json", "sysupdate/base",
                      "sysupdate/kubernetes"]:
            problems.append("titles %r" % titles)
        for x in m["layers"][4:]:
            a = x["annotations"]
            if x["mediaType"] != "application/vnd.oci.image.layer.v1.tar+gzip" or a.get(
                    "io.deis.oras.content.unpack") != "true" or not a.get("io.deis.oras.content.digest", "").startswith(
                    "sha256:"):
                problems.append("tree layer %r" % x)
        for x, name in zip(m["layers"][:2], (IMAGE + ".efi", IMAGE + ".raw")):
            data = open(os.path.join(src, name), "rb").read()
            if x["digest"] != ocitest.sha256(data) or x["size"] != len(data):
                problems.append("%s: digest or size differ from the file" % name)
        if ocitest.sha256(raw) != state["digest_a"]:
            problems.append("the digest printed is not that of the manifest")
        return not problems, "; ".join(problems) + "\n" + json.dumps(m, indent=1)[:1500]

    tap.check("the artifact: OCI manifest v1.1, artifactType, the empty config, one layer per file and per "
              "tree, titles and oras's unpack/digest annotations, file layers are the files' bytes", layout)

    if ocitest.ORAS_BIN:
        out_dir, p = oras_pull(work, ref, "oras-out")
        tap.check("oras pull of our artifact gives the same files (the sysupdate trees included, long paths too)",
                  lambda: (p.returncode == 0 and tree_equal(src, out_dir)[0],
                           p.stderr.decode()[-500:] + tree_equal(src, out_dir)[1]))
    else:
        tap.skip("oras pull of our artifact", "no oras")

    dst = os.path.join(work, "dst")
    proxy.reset()
    rc, out, err = pull(work, dst, ref)
    tap.check("pull into a new directory: exit 0, the same files, digest and image in --json",
              lambda: ((res := result(rc, out, err))["digest"] == state["digest_a"] and res["image"] == IMAGE
                       and not res["upToDate"] and tree_equal(src, dst)[0], out + err + tree_equal(src, dst)[1]))
    st = os.stat(os.path.join(dst, IMAGE + ".raw"))
    tap.check("the disk is written sparse (its run of zeros is a hole)",
              lambda: (st.st_blocks * 512 < st.st_size * 0.8, "%d of %d bytes allocated" % (st.st_blocks * 512, st.st_size)))
    tap.check("no staging directory is left behind", lambda: (leftovers(dst) == [], os.listdir(dst)))

    proxy.reset()
    rc, out, err = pull(work, dst, ref)
    log = proxy.log()
    tap.check("a second pull of the same digest: up to date, and only a HEAD of the manifest went out",
              lambda: (rc == 0 and json.loads(out)["upToDate"] and json.loads(out)["received"] == 0
                       and [e.method for e in log] == ["HEAD"] and "/manifests/1.0" in log[0].path, "%r %s" % (log, out + err)))

    proxy.reset()
    rc, out, err = push(work, src, ref)
    log = proxy.log()
    uploads = [e for e in log if e.method in ("PATCH", "PUT", "POST") and "/blobs/" in e.path]
    tap.check("a second push of the same image: the same digest, every blob HEADed and none sent again",
              lambda: (rc == 0 and json.loads(out)["digest"] == state["digest_a"] and json.loads(out)["sent"] == 0
                       and not uploads and len(blob_requests(log, "HEAD")) == 7, "%r %s" % (log, out + err)))

    if ocitest.ORAS_BIN:
        oras_ref = "%s/vm/oras:1.0" % reg.host
        names = [IMAGE + ".efi", IMAGE + ".raw", "policy.json", "manifest.json", "sysupdate/base", "sysupdate/kubernetes"]
        p = subprocess.run([ocitest.ORAS_BIN, "push", "--plain-http", "--artifact-type", ARTIFACT_TYPE, oras_ref] + names,
                           cwd=src, capture_output=True, env=env_for(work))
        from_oras = os.path.join(work, "from-oras")
        rc, out, err = pull(work, from_oras, oras_ref)
        tap.check("we pull what oras push made of the same files, into the same files",
                  lambda: (p.returncode == 0 and rc == 0 and tree_equal(src, from_oras)[0],
                           p.stderr.decode()[-300:] + err + tree_equal(src, from_oras)[1]))
    else:
        tap.skip("we pull what oras push made", "no oras")

    # an index in front of the manifest: the entry of our artifactType is followed
    idx = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": state["digest_a"], "size": len(raw),
         "artifactType": ARTIFACT_TYPE}]}
    body = json.dumps(idx).encode()
    status, _, _ = ocitest.reg_request(reg.host, "PUT", "/v2/vm/base/manifests/indexed", body=body,
                                       headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
    via_index = os.path.join(work, "via-index")
    rc, out, err = pull(work, via_index, "%s/vm/base:indexed" % reg.host)
    tap.check("a tag naming an index: its entry of our artifactType is pulled",
              lambda: (status == 201 and rc == 0 and tree_equal(src, via_index)[0], err + str(status)))

    by_digest = os.path.join(work, "by-digest")
    rc, out, err = pull(work, by_digest, "%s/vm/base@%s" % (reg.host, state["digest_a"]))
    tap.check("pull by @sha256 digest", lambda: (rc == 0 and tree_equal(src, by_digest)[0], err))
    state["src"] = src


# ---------------------------------------------------------------------------------------------
# 1b. the layout file


LAYOUT = IMAGE + ".layout.json"
LAYOUT_TYPE = "application/vnd.giantswarm.vm-image.layout.v1+json"


def add_layout(d, gen):
    """A layout file as images/scripts/layout.py writes one, marked with gen."""
    doc = {"format": "vm-manager-layout/1", "image": IMAGE, "gen": gen, "partitions": [
        {"type": "c12a7328-f81f-11d2-ba4b-00a0c93ec93b", "label": "esp", "content": "copy",
         "uuid": "0f0e0d0c-0b0a-4908-8706-0504030201%02x" % len(gen), "sizeBytes": 268435456},
        {"type": "4d21b016-b534-45c2-a9fb-5c16e091fd2d", "label": "var", "content": "ext4", "grow": True}]}
    with open(os.path.join(d, LAYOUT), "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    with open(os.path.join(d, LAYOUT), "rb") as f:
        return f.read()


def file_bytes(p):
    try:
        with open(p, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def test_layout_file(work):
    reg = state["reg"]
    with_ref, without_ref = "%s/vm/lay:with" % reg.host, "%s/vm/lay:without" % reg.host
    src = os.path.join(work, "lay-src")
    make_image(src, gen="l1")
    layout = add_layout(src, "l1")

    rc, out, err = push(work, src, with_ref)
    m = ocitest.get_manifest(reg.host, "vm/lay", "with")[0] if rc == 0 else {"layers": []}
    mine = [x for x in m["layers"] if x.get("annotations", {}).get("org.opencontainers.image.title") == LAYOUT]
    tap.check("layout: an image with a layout file pushes it as a layer of its own (title, media type, the "
              "file's digest and size)",
              lambda: (rc == 0 and json.loads(out)["layers"] == 7 and len(mine) == 1
                       and mine[0]["mediaType"] == LAYOUT_TYPE and mine[0]["digest"] == ocitest.sha256(layout)
                       and mine[0]["size"] == len(layout), err + json.dumps(m)[:1500]))

    dst = os.path.join(work, "lay-dst")
    rc, out, err = pull(work, dst, with_ref)
    tap.check("layout: the pull installs %s byte for byte, beside the rest of the image" % LAYOUT,
              lambda: (rc == 0 and file_bytes(os.path.join(dst, LAYOUT)) == layout and tree_equal(src, dst)[0],
                       err + tree_equal(src, dst)[1]))

    if ocitest.ORAS_BIN:
        out_dir, p = oras_pull(work, with_ref, "lay-oras")
        tap.check("layout: oras pull gives the same files, the layout file included",
                  lambda: (p.returncode == 0 and file_bytes(os.path.join(out_dir, LAYOUT)) == layout
                           and tree_equal(src, out_dir)[0], p.stderr.decode()[-500:] + tree_equal(src, out_dir)[1]))
    else:
        tap.skip("layout: oras pull of an artifact with a layout file", "no oras")

    # the next build has no layout file
    src2 = os.path.join(work, "lay-src2")
    make_image(src2, gen="l2")
    rc, out, err = push(work, src2, without_ref)
    m2 = ocitest.get_manifest(reg.host, "vm/lay", "without")[0] if rc == 0 else {"layers": []}
    titles = [x.get("annotations", {}).get("org.opencontainers.image.title") for x in m2["layers"]]
    fresh = os.path.join(work, "lay-fresh")
    rc2, out2, err2 = pull(work, fresh, without_ref)
    tap.check("layout: an image without one pushes without that layer and pulls into a new directory with no "
              "layout file", lambda: (rc == 0 and json.loads(out)["layers"] == 6 and LAYOUT not in titles
                                      and LAYOUT_TYPE not in [x["mediaType"] for x in m2["layers"]]
                                      and rc2 == 0 and not os.path.exists(os.path.join(fresh, LAYOUT))
                                      and tree_equal(src2, fresh)[0], err + err2 + repr(titles)))

    # a failing pull of it (its policy names another image) leaves the old layout where it is
    policy = json.load(open(os.path.join(src2, "policy.json")))
    policy["image_version"] = "9.9"
    pol = json.dumps(policy).encode()
    efi, raw = file_bytes(os.path.join(src2, IMAGE + ".efi")), file_bytes(os.path.join(src2, IMAGE + ".raw"))
    status, body, _ = craft(reg, "vm/lay", "bad-policy", [layer(efi, IMAGE + ".efi"), layer(raw, IMAGE + ".raw"),
                                                          layer(pol, "policy.json")], None, [efi, raw, pol])
    before = snapshot_tree(dst)
    rc, out, err = pull(work, dst, "%s/vm/lay:bad-policy" % reg.host)
    tap.check("layout: a failed pull of an artifact without a layout leaves the directory, its layout file "
              "included, as it was", lambda: (status == 201 and rc == 1 and "names another image" in err
                                              and snapshot_tree(dst) == before
                                              and file_bytes(os.path.join(dst, LAYOUT)) == layout,
                                              err + diff_snapshots(before, snapshot_tree(dst))))

    rc, out, err = pull(work, dst, without_ref)
    tap.check("layout: pulling a build without a layout over one with: the old build's layout file is gone "
              "(it would lay the new disk out by the old partitions), the rest is the new build",
              lambda: (rc == 0 and not os.path.exists(os.path.join(dst, LAYOUT)) and tree_equal(src2, dst)[0]
                       and leftovers(dst) == [], err + repr(sorted(os.listdir(dst))) + tree_equal(src2, dst)[1]))

    rc, out, err = pull(work, dst, with_ref)
    tap.check("layout: and pulling the build with a layout again brings it back",
              lambda: (rc == 0 and file_bytes(os.path.join(dst, LAYOUT)) == layout and tree_equal(src, dst)[0], err))


# ---------------------------------------------------------------------------------------------
# 2. broken connections


def test_resume(work):
    reg, proxy = state["reg"], state["proxy"]
    src = os.path.join(work, "big")
    make_image(src, gen="big", raw_mb=8)
    raw = open(os.path.join(src, IMAGE + ".raw"), "rb").read()
    raw_digest = ocitest.sha256(raw)

    # an upload cut inside its second 1 MiB chunk: distribution 2.8 cancels the upload ("upload
    # resumed at wrong offset"), so the blob starts over
    proxy.reset()
    proxy.rules.append(nth_rule("PATCH", 2, cut_request_after=300000))
    rc, out, err = push(work, src, "%s/vm/resume:cut-inside" % proxy.host, "--chunk-size", "1M")
    log = proxy.log()
    cut = [i for i, e in enumerate(log) if e.cut]
    later = log[cut[0] + 1:] if cut else []
    restarted = [e for e in later if e.method == "POST"][:1] and [
        e for e in later if e.method == "PATCH" and e.headers.get("content-range", "").startswith("0-")]
    tap.check("an upload cut inside a chunk: the push still succeeds; distribution dropped the upload, so that "
              "blob starts again from byte 0 in a new upload",
              lambda: (rc == 0 and len(cut) == 1 and log[cut[0]].headers.get("content-range") == "0-1048575"
                       and restarted and os.path.getsize(reg.blob_path(raw_digest)) == len(raw)
                       and "upload resumed at wrong offest" in reg.log(tail=1 << 30),
                       "%r %r %r\n%s" % (cut, log[:12], [(e.method, e.headers.get("content-range")) for e in later][:8], err)))

    # cut after the headers of a chunk, before any of its bytes: the registry still has the upload
    # at the end of the previous chunk, and we continue from there
    src2 = os.path.join(work, "big2")
    make_image(src2, gen="big2", raw_mb=8)
    raw2 = open(os.path.join(src2, IMAGE + ".raw"), "rb").read()
    proxy.reset()
    proxy.rules.append(nth_rule("PATCH", 3, cut_request_after=0))
    rc, out, err = push(work, src2, "%s/vm/resume:cut-between" % proxy.host, "--chunk-size", "1M")
    log = proxy.log()
    statuses = [e for e in log if e.method == "GET" and "/blobs/uploads/" in e.path]
    patches = [e for e in log if e.method == "PATCH"]
    ranges = [e.headers.get("content-range") for e in patches]
    after_cut = ranges[3] if len(ranges) > 3 else None
    sent = sum(e.sent for e in log if e.method in ("PATCH", "PUT") and "/blobs/uploads/" in e.path)
    tap.check("an upload cut between chunks: the client asks the registry how far it got and continues "
              "from that offset, sending nothing twice",
              lambda: (rc == 0 and statuses and statuses[0].status == 204 and after_cut == ranges[2]
                       and ocitest.sha256(open(reg.blob_path(ocitest.sha256(raw2)), "rb").read()) == ocitest.sha256(raw2)
                       and sent < len(raw2) + 2 * (2 << 20), "ranges %r, %d bytes sent\n%r\n%s" % (ranges, sent, log[-25:], err)))

    # a download cut in the middle of the disk: continued with Range
    dst = os.path.join(work, "resumed")
    proxy.reset()
    proxy.rules.append(blob_rule(raw_digest, cut_response_after=3 << 20))
    rc, out, err = pull(work, dst, "%s/vm/resume:cut-inside" % proxy.host)
    log = proxy.log()
    gets = [e for e in blob_requests(log) if e.path.endswith(raw_digest)]
    tap.check("a download cut at 3 MiB: continued with Range: bytes=3145728-, %d bytes in all, the files intact"
              % len(raw),
              lambda: (rc == 0 and len(gets) == 2 and gets[0].cut and gets[1].headers.get("range") == "bytes=3145728-"
                       and gets[0].received + gets[1].received == len(raw) and tree_equal(src, dst)[0],
                       "%r\n%s" % (gets, err)))


# ---------------------------------------------------------------------------------------------
# 3. hostile artifacts


def craft(reg, repo, tag, layers, config=None, blobs=()):
    for b in blobs:
        ocitest.put_blob(reg.host, repo, b)
    ocitest.put_blob(reg.host, repo, b"{}")
    doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "artifactType": ARTIFACT_TYPE,
           "config": config or {"mediaType": "application/vnd.oci.empty.v1+json", "digest": ocitest.sha256(b"{}"), "size": 2},
           "layers": layers}
    return ocitest.put_manifest(reg.host, repo, tag, doc)


def layer(data, title, **extra):
    d = {"mediaType": "application/octet-stream", "digest": ocitest.sha256(data), "size": len(data),
         "annotations": {"org.opencontainers.image.title": title}}
    d.update(extra)
    return d


def tar_gz(entries):
    import io
    import tarfile
    import gzip
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, data in entries:
            ti = tarfile.TarInfo(name)
            if kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, "/etc"
            elif kind == "dir":
                ti.type = tarfile.DIRTYPE
            else:
                ti.size = len(data)
            t.addfile(ti, io.BytesIO(data) if kind == "file" else None)
    tar = bio.getvalue()
    return gzip.compress(tar, mtime=0), ocitest.sha256(tar)


def tree_layer(gz, tar_digest, title):
    d = layer(gz, title, mediaType="application/vnd.oci.image.layer.v1.tar+gzip")
    d["annotations"].update({"io.deis.oras.content.unpack": "true", "io.deis.oras.content.digest": tar_digest})
    return d


def test_hostile(work):
    reg, proxy = state["reg"], state["proxy"]
    dst = os.path.join(work, "victim")
    rc, out, err = pull(work, dst, "%s/vm/base:1.0" % reg.host)
    tap.result(rc == 0, "hostile: a directory with an image installed", err)
    efi, raw = b"MZ hostile efi", b"hostile raw" * 1000
    ok_layers = [layer(efi, IMAGE + ".efi"), layer(raw, IMAGE + ".raw")]
    outside = os.path.join(work, "escaped")

    cases = []
    cases.append(("a title with ../ in it", [layer(efi, IMAGE + ".efi"), layer(raw, "../escaped")], None, [efi, raw],
                  ["not a safe relative path"]))
    cases.append(("an absolute title", ok_layers + [layer(b"x", "/tmp/escaped")], None, [efi, raw, b"x"],
                  ["not a safe relative path"]))
    gz, td = tar_gz([("sysupdate/base/../../../escaped", "file", b"boo")])
    cases.append(("a tree whose tar leaves its directory", ok_layers + [tree_layer(gz, td, "sysupdate/base")], None,
                  [efi, raw, gz], ["not a safe relative path"]))
    gz2, td2 = tar_gz([("sysupdate/base", "dir", b""), ("sysupdate/base/link", "sym", b"")])
    cases.append(("a tree with a symlink", ok_layers + [tree_layer(gz2, td2, "sysupdate/base")], None, [efi, raw, gz2],
                  ["is a symlink"]))
    gz3, _ = tar_gz([("sysupdate/base/x", "file", b"1")])
    cases.append(("a tree whose tar digest is not the one annotated",
                  ok_layers + [tree_layer(gz3, ocitest.sha256(b"other"), "sysupdate/base")], None, [efi, raw, gz3],
                  ["io.deis.oras.content.digest"]))
    small = dict(layer(raw, IMAGE + ".raw"), size=len(raw) - 100)
    cases.append(("a layer larger than the manifest declares", [layer(efi, IMAGE + ".efi"), small], None, [efi, raw],
                  ["larger than the %d bytes the manifest declares" % (len(raw) - 100), ocitest.sha256(raw)]))
    big_config = {"mediaType": "application/vnd.oci.empty.v1+json", "digest": ocitest.sha256(b"{}"), "size": 1 << 30}
    cases.append(("a 1 GiB config", ok_layers, big_config, [efi, raw], ["config is 1073741824 bytes"]))
    cases.append(("an artifact that is no image", [layer(b"hello", "hello.txt")], None, [b"hello"],
                  ["not a VM image"]))
    cases.append(("a second UKI", ok_layers + [layer(b"MZ2", "other_2.efi")], None, [efi, raw, b"MZ2"],
                  ["second UKI"]))

    before = snapshot_tree(dst)
    for i, (name, layers, config, blobs, words) in enumerate(cases):
        tag = "hostile-%d" % i
        status, body, _ = craft(reg, "vm/hostile", tag, layers, config, blobs)
        if status != 201:
            tap.result(False, "hostile: the registry takes the manifest of %s" % name, body)
            continue
        rc, out, err = pull(work, dst, "%s/vm/hostile:%s" % (reg.host, tag))
        tap.check("hostile: %s fails with one line naming it" % name, one_error_line, rc, err, words)
        after = snapshot_tree(dst)
        tap.check("... and the directory is as it was, nothing outside it", lambda: (
            before == after and not os.path.exists(outside) and not os.path.exists("/tmp/escaped"),
            diff_snapshots(before, after)))

    # a digest mismatch: the registry's stored bytes changed under it
    tampered = b"tampered raw" * 1000
    status, body, _ = craft(reg, "vm/hostile", "tampered", [layer(efi, IMAGE + ".efi"), layer(tampered, IMAGE + ".raw")],
                            None, [efi, tampered])
    path = reg.blob_path(ocitest.sha256(tampered))
    with open(path, "r+b") as f:
        f.seek(5)
        f.write(b"X")
    rc, out, err = pull(work, dst, "%s/vm/hostile:tampered" % reg.host)
    tap.check("hostile: a blob whose bytes do not hash to its digest fails naming the blob, digest mismatch",
              one_error_line, rc, err, ["digest mismatch", ocitest.sha256(tampered), IMAGE + ".raw"])
    tap.check("... and the directory is as it was", lambda: (snapshot_tree(dst) == before, diff_snapshots(before, snapshot_tree(dst))))

    # 100,000 layers: more than a registry should hand out; served by the proxy in its place
    many = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": ocitest.sha256(b"{}"), "size": 2},
            "layers": [layer(efi, "f%d" % i) for i in range(100000)]}
    body = json.dumps(many).encode()
    proxy.reset()
    for _ in range(2):  # the HEAD, then the GET by the digest the HEAD said
        proxy.rules.append(lambda ex: {"answer": (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json",
                                                         "Docker-Content-Digest": ocitest.sha256(body)}, body)}
                           if "/v2/vm/hostile/manifests/" in ex.path else None)
    rc, out, err = pull(work, dst, "%s/vm/hostile:many" % proxy.host)
    tap.check("hostile: a manifest of 100,000 layers (%.1f MB) is refused before anything is fetched" % (len(body) / 1e6),
              one_error_line, rc, err, ["manifest", "larger than 4194304 bytes"])
    tap.check("... no blob was asked for, the directory is as it was",
              lambda: (not blob_requests(proxy.log()) and snapshot_tree(dst) == before, repr(proxy.log())))
    proxy.reset()


# ---------------------------------------------------------------------------------------------
# 4. kill -9 in the middle, and the lock


def test_interrupted(work):
    reg, proxy = state["reg"], state["proxy"]
    dst = os.path.join(work, "interrupted")
    rc, _, err = pull(work, dst, "%s/vm/base:1.0" % reg.host)
    before = snapshot_tree(dst)
    src = os.path.join(work, "gen-b")
    make_image(src, gen="b", kube="1.32.0")
    rc, out, err = push(work, src, "%s/vm/base:b" % reg.host)
    raw_digest = ocitest.sha256(open(os.path.join(src, IMAGE + ".raw"), "rb").read())
    event = threading.Event()
    proxy.reset()
    proxy.rules.append(blob_rule(raw_digest, stall_response_after=1 << 20, event=event))
    p = subprocess.Popen([BIN, "image", "pull", "--plain-http", "--image-dir", dst, "%s/vm/base:b" % proxy.host],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env_for(work))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(e.received >= (1 << 20) for e in blob_requests(proxy.log())):
        time.sleep(0.05)
    stage = leftovers(dst)
    p.kill()
    p.wait()
    event.set()
    after = {k: v for k, v in snapshot_tree(dst).items() if not k.startswith(".pull-")}
    tap.check("a pull killed with -9 in the middle of a blob leaves the image as it was (and its stage)",
              lambda: (len(stage) == 1 and after == before, "%r %s" % (stage, diff_snapshots(before, after))))
    proxy.reset()
    rc, out, err = pull(work, dst, "%s/vm/base:b" % reg.host)
    tap.check("the next pull removes the leftover stage and installs", lambda: (
        rc == 0 and leftovers(dst) == [] and tree_equal(src, dst)[0], err + repr(os.listdir(dst))))

    # the lock: a second pull into the same directory while one runs
    fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    rc, out, err = pull(work, dst, "%s/vm/base:1.0" % reg.host)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    tap.check("a pull into a directory another pull holds fails at once", one_error_line, rc, err,
              ["another pull into", dst, "is running"])


def test_deadline(work):
    """A registry that trickles a blob (a byte a second, which curl's low-speed limit takes 60 s to
    notice, and then again at each of 6 attempts): --timeout ends the pull when it passes, naming the
    blob and how far it got, and the directory is left as it was."""
    reg, proxy = state["reg"], state["proxy"]
    dst = os.path.join(work, "deadline")
    rc, _, err = pull(work, dst, "%s/vm/base:1.0" % reg.host)
    before = snapshot_tree(dst)
    src = os.path.join(work, "gen-slow")
    make_image(src, gen="slow", kube="1.32.1")
    rc, out, err = push(work, src, "%s/vm/base:slow" % reg.host)
    raw = open(os.path.join(src, IMAGE + ".raw"), "rb").read()
    raw_digest = ocitest.sha256(raw)
    proxy.reset()
    proxy.rules.append(blob_rule(raw_digest, trickle_response_after=1 << 20))
    t0 = time.monotonic()
    rc, out, err = pull(work, dst, "%s/vm/base:slow" % proxy.host, "--timeout", "4s", timeout=100)
    took = time.monotonic() - t0
    got = [e.received for e in blob_requests(proxy.log()) if e.path.endswith(raw_digest)]
    tap.check("a blob trickled at 1 byte/s: --timeout 4s ends the pull within seconds, naming the blob, the bytes "
              "received and the flag", lambda: (
                  one_error_line(rc, err, [raw_digest, "%s.raw" % IMAGE, "of its %d bytes" % len(raw), "--timeout 4s",
                                           "deadline"])[0] and took < 15 and len(got) == 1
                  and re.search(r"\b%d of its" % got[0], err), "took %.1f s, received %r\n%s" % (took, got, err)))
    after = {k: v for k, v in snapshot_tree(dst).items() if not k.startswith(".pull-")}
    tap.check("the pull that ran out of time leaves the image as it was, and no stage",
              lambda: (after == before and leftovers(dst) == [], diff_snapshots(before, after)))
    proxy.reset()
    rc, out, err = pull(work, dst, "%s/vm/base:slow" % proxy.host, "--timeout", "1m")
    tap.check("the same pull with time enough (and a registry that sends) installs",
              lambda: (rc == 0 and tree_equal(src, dst)[0], err))
    for value, words in (("0", ["--timeout", "above 0"]), ("soon", ["--timeout", "duration"]),
                         ("-5s", ["--timeout"])):
        rc, out, err = vmm(work, ["image", "pull", "--image-dir", dst, "--timeout", value, "r.io/vm:1"])
        tap.check("image pull --timeout %s: refused, one line" % value, one_error_line, rc, err, words)
    rc, out, err = vmm(work, ["image", "pull", "--help"])
    tap.check("image pull --help names --timeout and its default", lambda: (
        rc == 0 and re.search(r"--timeout DURATION[^\n]*\n(.*\n)*?.*default: 30m", out), out))


# ---------------------------------------------------------------------------------------------
# 5. policy.json


def read_json(p):
    with open(p) as f:
        return json.load(f)


def test_policy(work):
    reg = state["reg"]
    src = os.path.join(work, "pol-src")
    dst = os.path.join(work, "pol-dst")
    make_image(src, gen="p1")
    push(work, src, "%s/vm/pol:1" % reg.host)
    rc, out, err = pull(work, dst, "%s/vm/pol:1" % reg.host)
    # what `vm-manager image golden --from-vm` would have recorded
    golden = read_json(ocitest.POLICY_TEMPLATE)
    local = read_json(os.path.join(dst, "policy.json"))
    local["golden"], local["golden_firmware"] = golden["golden"], golden["golden_firmware"]
    with open(os.path.join(dst, "policy.json"), "w") as f:
        json.dump(local, f)

    make_image(src, gen="p2")
    push(work, src, "%s/vm/pol:2" % reg.host)
    rc, out, err = pull(work, dst, "%s/vm/pol:2" % reg.host)
    now = read_json(os.path.join(dst, "policy.json"))
    tap.check("--policy keep (the default): a new build without golden values keeps the recorded ones",
              lambda: (rc == 0 and json.loads(out)["keptGolden"] and now.get("gen") == "p2"
                       and now.get("golden") == golden["golden"] and now.get("golden_firmware") == golden["golden_firmware"],
                       out + err + json.dumps(now)[:400]))

    make_image(src, gen="p3")
    push(work, src, "%s/vm/pol:3" % reg.host)
    rc, out, err = pull(work, dst, "%s/vm/pol:3" % reg.host, "--policy", "replace")
    now = read_json(os.path.join(dst, "policy.json"))
    tap.check("--policy replace: the artifact's policy as it is, without the golden values",
              lambda: (rc == 0 and now.get("gen") == "p3" and "golden" not in now, out + err))

    make_image(src, gen="p4", golden=True)
    theirs = read_json(os.path.join(src, "policy.json"))
    theirs["golden"]["sha256"]["0"] = "ab" * 32
    with open(os.path.join(src, "policy.json"), "w") as f:
        json.dump(theirs, f)
    push(work, src, "%s/vm/pol:4" % reg.host)
    rc, out, err = pull(work, dst, "%s/vm/pol:4" % reg.host)
    now = read_json(os.path.join(dst, "policy.json"))
    tap.check("an artifact with golden values of its own: they win, keep or not",
              lambda: (rc == 0 and now["golden"]["sha256"]["0"] == "ab" * 32 and not json.loads(out)["keptGolden"], out + err))

    # another image beside: its policy.json is not ours to replace
    other = "giantswarm-vm-base_2.0"
    src2 = os.path.join(work, "pol-src2")
    make_image(src2, ref=other, gen="q")
    rc, out, err = vmm(work, ["image", "push", "--plain-http", "--json", "--image-dir", src2, other,
                              "%s/vm/pol:other" % reg.host])
    before = open(os.path.join(dst, "policy.json")).read()
    rc, out, err = pull(work, dst, "%s/vm/pol:other" % reg.host)
    tap.check("an image beside another: its policy goes to <id>_<version>.policy.json, the other's policy.json "
              "is untouched", lambda: (
                  rc == 0 and json.loads(out)["policyFile"] == other + ".policy.json"
                  and read_json(os.path.join(dst, other + ".policy.json"))["gen"] == "q"
                  and open(os.path.join(dst, "policy.json")).read() == before, out + err))
    rc, out, err = vmm(work, ["image", "push", "--plain-http", "--json", "--image-dir", dst, other,
                              "%s/vm/pol:other-again" % reg.host])
    tap.check("... and a push of that image takes <id>_<version>.policy.json as its policy.json",
              lambda: (rc == 0 and json.loads(out)["digest"] == json.loads(vmm(
                  work, ["image", "push", "--plain-http", "--json", "--image-dir", src2, other,
                         "%s/vm/pol:other" % reg.host])[1])["digest"], out + err))


# ---------------------------------------------------------------------------------------------
# 6. authentication and TLS


def test_basic_auth(work):
    auth = ocitest.htpasswd_auth(work, "alice", PASSWORD)
    reg = Registry(work, "basic", auth=auth)
    src = state["src"]
    ref = "%s/vm/base:1.0" % reg.host
    everything = []

    rc, out, err = push(work, src, ref)
    everything.append(out + err)
    tap.check("basic auth: without credentials, one line saying the registry wants them", one_error_line, rc, err,
              ["HTTP 401", "--username", "--password-stdin"])
    rc, out, err = push(work, src, ref, "--username", "alice", "--password-stdin", stdin=b"wrong\n")
    everything.append(out + err)
    tap.check("... a wrong password: one line, refused", one_error_line, rc, err, ["refused the credentials"])
    rc, out, err = push(work, src, ref, "--username", "alice", "--password-stdin", stdin=PASSWORD.encode() + b"\n")
    everything.append(out + err)
    tap.check("... --username with --password-stdin pushes", lambda: (rc == 0, err))
    rc, out, err = push(work, src, ref, "--username", "alice")
    tap.check("... --username alone is a usage error", one_error_line, rc, err, ["--password-stdin"])

    cfg_dir = os.path.join(work, "docker-config")
    os.makedirs(cfg_dir)
    import base64
    with open(os.path.join(cfg_dir, "config.json"), "w") as f:
        json.dump({"auths": {"http://" + reg.host: {"auth": base64.b64encode(("alice:" + PASSWORD).encode()).decode()}}}, f)
    dst = os.path.join(work, "basic-dst")
    rc, out, err = pull(work, dst, ref, env=env_for(work, DOCKER_CONFIG=cfg_dir))
    everything.append(out + err)
    tap.check("... DOCKER_CONFIG/config.json (a key with a scheme) pulls", lambda: (rc == 0 and tree_equal(src, dst)[0], err))
    auth_file = os.path.join(work, "auth.json")
    with open(auth_file, "w") as f:
        json.dump({"auths": {reg.host: {"auth": base64.b64encode(("alice:" + PASSWORD).encode()).decode()}}}, f)
    rc, out, err = pull(work, os.path.join(work, "basic-dst2"), ref, env=env_for(work, REGISTRY_AUTH_FILE=auth_file))
    everything.append(out + err)
    tap.check("... REGISTRY_AUTH_FILE pulls", lambda: (rc == 0, err))
    with open(auth_file, "w") as f:
        f.write("{not json")
    rc, out, err = pull(work, os.path.join(work, "basic-dst3"), ref, env=env_for(work, REGISTRY_AUTH_FILE=auth_file))
    tap.check("... a broken credentials file is an error naming it, not anonymity", one_error_line, rc, err,
              [auth_file, "not a JSON object"])
    b64 = base64.b64encode(("alice:" + PASSWORD).encode()).decode()
    tap.check("no password (or its base64) in anything the command printed",
              lambda: (not any(PASSWORD in x or b64 in x for x in everything), "found"))
    if ocitest.ORAS_BIN:
        d = os.path.join(work, "basic-oras")
        os.makedirs(d)
        p = subprocess.run([ocitest.ORAS_BIN, "pull", "--plain-http", "-u", "alice", "--password-stdin", ref], cwd=d,
                           input=PASSWORD.encode(), capture_output=True, env=env_for(work))
        tap.check("... oras pulls it with the same credentials", lambda: (p.returncode == 0 and tree_equal(src, d)[0],
                                                                          p.stderr.decode()[-300:]))
    reg.stop()


def test_token_auth(work):
    ts = TokenServer(work, {"alice": PASSWORD}, anonymous_pull=True)
    reg = Registry(work, "token", auth=ts.registry_auth())
    src = state["src"]
    ref = "%s/vm/base:1.0" % reg.host

    rc, out, err = push(work, src, ref)
    tap.check("token auth: an anonymous push gets a pull-only token and is refused", lambda: (
        rc == 1 and "401" in err or "denied" in err.lower() or "refused" in err, err))
    rc, out, err = push(work, src, ref, "--username", "alice", "--password-stdin", stdin=PASSWORD.encode())
    tap.check("... with credentials: the token server sees them as Basic, asked for pull,push; the push works",
              lambda: (rc == 0 and any(u == "alice" and any(s.endswith("vm/base:pull,push") for s in scopes)
                                       for u, scopes, _ in ts.requests), "%s %r" % (err, [(u, s) for u, s, _ in ts.requests])))
    dst = os.path.join(work, "token-dst")
    n = len(ts.requests)
    rc, out, err = pull(work, dst, ref)
    tap.check("... an anonymous pull gets its token without credentials and pulls",
              lambda: (rc == 0 and tree_equal(src, dst)[0] and all(a is None for _, _, a in ts.requests[n:]), err))
    rc, out, err = pull(work, os.path.join(work, "token-dst2"), ref, "--username", "alice", "--password-stdin",
                        stdin=b"nope")
    tap.check("... a wrong password at the token server: one line naming the token server", one_error_line, rc, err,
              ["token server", "refused the credentials"])
    ts.anonymous_pull = False
    rc, out, err = pull(work, os.path.join(work, "token-dst3"), ref)
    tap.check("... with anonymous access off, an anonymous pull is refused with a hint", one_error_line, rc, err,
              ["token server", "anonymous access", "--username"])
    reg.stop()
    ts.stop()


def test_tls(work):
    ca, cert, key = ocitest.make_ca(work)
    reg = Registry(work, "tls", tls=(cert, key))
    src = state["src"]
    ref = "%s/vm/base:1.0" % reg.host
    rc, out, err = vmm(work, ["image", "push", "--image-dir", src, IMAGE, ref])
    tap.check("TLS: a registry whose CA we do not trust: one line pointing at --ca-file", one_error_line, rc, err,
              ["--ca-file"])
    rc, out, err = vmm(work, ["image", "push", "--json", "--ca-file", ca, "--image-dir", src, IMAGE, ref])
    tap.check("... with --ca-file the push works over https", lambda: (rc == 0, err))
    dst = os.path.join(work, "tls-dst")
    rc, out, err = vmm(work, ["image", "pull", "--ca-file", ca, "--image-dir", dst, ref])
    tap.check("... and the pull", lambda: (rc == 0 and tree_equal(src, dst)[0], err))
    reg.stop()
    plain = state["reg"]
    rc, out, err = vmm(work, ["image", "pull", "--image-dir", dst, "%s/vm/base:1.0" % plain.host])
    tap.check("a plain-http registry without --plain-http: refused, one line pointing at --plain-http",
              one_error_line, rc, err, ["--plain-http"])


# ---------------------------------------------------------------------------------------------
# 7. the command line


def test_cli(work):
    d = os.path.join(work, "cli")
    os.makedirs(d)
    cases = [
        (["image", "pull", "--image-dir", d, "vm/base:1"], ["does not start with a registry host"]),
        (["image", "pull", "--image-dir", d, "r.io/VM:1"], ["not a repository name"]),
        (["image", "pull", "--image-dir", d, "r.io/vm@sha512:" + "0" * 128], ["only sha256"]),
        (["image", "pull", "--image-dir", d], ["want REF"]),
        (["image", "pull", "--image-dir", d, "--policy", "merge", "r.io/vm:1"], ["--policy"]),
        (["image", "push", "--image-dir", d, "nope", "%s/vm/x:1" % state["reg"].host], ["no image 'nope'"]),
        (["image", "push", "--image-dir", d, "--chunk-size", "1K", "x", "r.io/vm:1"], ["--chunk-size"]),
        (["image", "pull", "--image-dir", d, "--ca-file", "/nonexistent.pem", "r.io/vm:1"], ["--ca-file"]),
        (["image", "fetch"], ["golden, push or pull"]),
    ]
    for args, words in cases:
        rc, out, err = vmm(work, args)
        tap.check("usage: vm-manager %s: exit 1, one line" % " ".join(args[1:]).replace(d, "DIR"), one_error_line, rc,
                  err, words)
    for args in (["image", "push", "--help"], ["image", "pull", "--help"], ["help", "image", "pull"], ["image", "--help"]):
        rc, out, err = vmm(work, args)
        tap.check("vm-manager %s prints usage" % " ".join(args), lambda: (rc == 0 and "Usage: vm-manager image" in out, out + err))
    rc, out, err = vmm(work, ["image", "pull", "--plain-http", "--image-dir", d, "%s/vm/nothing:1" % state["reg"].host])
    tap.check("a tag that does not exist: one line with the HTTP status and the registry's code", one_error_line, rc,
              err, ["HTTP 404", "MANIFEST_UNKNOWN", "vm/nothing:1"])
    rc, out, err = vmm(work, ["image", "pull", "--plain-http", "--image-dir", d, "127.0.0.1:%d/vm/x:1" % free_port()])
    tap.check("a registry that is not there: one line", one_error_line, rc, err, ["127.0.0.1"])
    rc, out, err = vmm(work, ["image", "pull", "--plain-http", "--image-dir", d, "%s/vm/base:1.0" % state["reg"].host])
    tap.check("without --json and not on a terminal: one result line on stdout, nothing on stderr",
              lambda: (rc == 0 and out.count("\n") == 1 and out.startswith("pulled ") and err == "", out + err))


# ---------------------------------------------------------------------------------------------
# 8. a daemon serving the directory


def test_daemon(work):
    reg = state["reg"]
    imgdir = os.path.join(work, "served")
    gens = {"a": "1.30.0", "b": "1.31.0"}
    layouts = {}
    for g, kube in gens.items():
        src = os.path.join(work, "served-src-" + g)
        make_image(src, gen=g, kube=kube)
        if g == "a":  # build a has a layout file, build b none
            layouts[g] = add_layout(src, g)
        rc, out, err = push(work, src, "%s/vm/served:%s" % (reg.host, g))
        assert rc == 0, err
    rc, out, err = pull(work, imgdir, "%s/vm/served:a" % reg.host)
    assert rc == 0, err

    vars_ = os.path.join(work, "vars")
    with open(vars_, "wb") as f:
        f.write(b"\0" * 4096)
    env = base_env(work)
    env["PATH"] = FAKES + ":" + env.get("PATH", "/usr/bin:/bin")
    port = free_port()
    d = Daemon(work, "served", ["--listen", "%s:%d" % (HOST, port), "--state-dir", os.path.join(work, "served-state"),
                                "--image-dir", imgdir, "--ovmf-code", vars_, "--ovmf-vars", vars_,
                                "--launcher", "process", "--log-level", "debug"], env=env)
    ok, why = d.wait_healthy(port, timeout=20)
    tap.result(ok, "daemon: serving the pulled directory (fake QEMU)", why)
    if not ok:
        return

    def images():
        status, _, body = http_request(port, "GET", "/api/v1/images")
        return json.loads(body) if status == 200 else None

    status, _, body = http_request(port, "POST", "/api/v1/vms", body=json.dumps(
        {"name": "before", "memory_mib": 512, "disk_gib": 1, "require_attestation": False, "wait_for": "none",
         "install_mode": "boot"}).encode())  # the test's layout file describes no real disk
    vm = json.loads(body)
    tap.check("daemon: a VM is created from the image before the pulls", lambda: (status == 201, body[:300]))
    # what QEMU holds open stays what it was, whatever the pulls do to the names
    held = {ext: os.open(os.path.join(imgdir, IMAGE + ext), os.O_RDONLY) for ext in (".efi", ".raw")}
    held_digest = {ext: hashlib.sha256(os.pread(fd, 64 << 20, 0)).hexdigest() for ext, fd in held.items()}

    seen, bad, stop = [], [], threading.Event()

    def poll():
        while not stop.is_set():
            # A short pause: without it the requests' debug lines outrun this harness's reading of
            # the daemon's stderr, and the loop waits in write() (the loop check fails on that).
            time.sleep(0.01)
            lst = images()
            if lst is None:
                continue
            mine = [i for i in lst if i["id"] + "_" + i["version"] == IMAGE]
            if not mine:
                seen.append("absent")
                continue
            i = mine[0]
            gen = (i.get("policy") or {}).get("gen")
            kube = i.get("kubernetesVersions", [None])[0]
            if gen not in gens or gens[gen] != kube or not i.get("uki") or not i.get("disk") or (
                    "layout" in i) != (gen in layouts):
                bad.append(i)
            seen.append(gen)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    pulls = []
    for n in range(8):
        g = "b" if n % 2 == 0 else "a"
        pulls.append(pull(work, imgdir, "%s/vm/served:%s" % (reg.host, g))[0])
        time.sleep(0.3)  # the daemon's rescan runs 200 ms after the last change
    stop.set()
    t.join(timeout=10)
    final = images()
    tap.check("daemon: 8 pulls replacing the image, each exit 0", lambda: (pulls == [0] * 8, pulls))
    tap.check("daemon: %d list_images during them never showed the image half (policy, Kubernetes versions and "
              "layout file of one build; build b, which has none, never with a's)" % len(seen),
              lambda: (not bad and len(seen) > 20 and {"a", "b"} <= set(seen),
                       "bad %r; seen %r" % (bad[:3], sorted(set(seen)))))
    tap.check("daemon: the image is listed as the last pull left it, with the layout file it pulled",
              lambda: (final and final[0].get("policy", {}).get("gen") == "a"
                       and final[0].get("layout") == os.path.join(imgdir, LAYOUT)
                       and file_bytes(final[0]["layout"]) == layouts["a"], final))
    status, _, body = http_request(port, "GET", "/api/v1/vms/" + vm.get("id", "x"))
    cur = json.loads(body) if status == 200 else {}
    tap.check("daemon: the VM created before is still there and not failed, its QEMU alive",
              lambda: (status == 200 and cur.get("state") not in ("failed", None), body[:300]))
    now = {ext: hashlib.sha256(os.pread(fd, 64 << 20, 0)).hexdigest() for ext, fd in held.items()}
    tap.check("daemon: files opened before the pulls still read their old bytes (renamed, never rewritten)",
              lambda: (now == held_digest, "%r %r" % (now, held_digest)))
    for fd in held.values():
        os.close(fd)
    tap.check("daemon: no sanitizer reports", lambda: (not d.sanitizer_lines(), d.sanitizer_lines()))
    d.stop()


def teardown(work):
    Registry.stop_all()
    if "proxy" in state:
        state["proxy"].close()


def main():
    if not ocitest.REGISTRY_BIN or not ocitest.HTPASSWD_BIN or not ocitest.OPENSSL_BIN:
        print("TAP version 13\n1..0 # SKIP needs docker-registry, htpasswd (apache2-utils) and openssl "
              "(tools/install-deps.sh check)", flush=True)
        return 77

    def guarded(fn):
        def section(work):
            if "reg" not in state and fn is not test_layout_and_interop:
                return
            fn(work)
        section.__name__ = fn.__name__
        return section

    sections = [guarded(f) for f in (test_layout_and_interop, test_layout_file, test_resume, test_hostile,
                                     test_interrupted, test_deadline, test_policy, test_basic_auth, test_token_auth, test_tls,
                                     test_cli, test_daemon)]
    try:
        return run(sections + [teardown], 280, "vmm-oci-")
    finally:
        Registry.stop_all()


if __name__ == "__main__":
    sys.exit(main())
