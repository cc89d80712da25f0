#!/usr/bin/env python3
"""Writes a container image as an OCI image layout archive that `ctr images import` takes, from a
directory that becomes its one layer. The Kubernetes sysext carries the control-plane images so
that kubeadm finds them in containerd under the names it asks for and never pulls.

usage: oci-archive.py --name REF --rootfs DIR --out FILE [--entrypoint PATH] [--epoch SECONDS]

The layer is an uncompressed tar (the sysext's erofs compresses it, and the guest does not gunzip
it under emulation); owners are root, times are --epoch (SOURCE_DATE_EPOCH), entries sorted, so
the same inputs give the same bytes. The index names the image twice: io.containerd.image.name
(the full reference, which ctr uses) and org.opencontainers.image.ref.name (its tag, per the
image layout specification).
"""
import argparse
import hashlib
import io
import json
import os
import stat
import tarfile

ARCH = "amd64"


def add_tree(tar, root, epoch):
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            entries.append(os.path.join(dirpath, name))
    for path in sorted(entries, key=lambda p: os.path.relpath(p, root)):
        rel = os.path.relpath(path, root)
        info = tar.gettarinfo(path, arcname=rel)
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = epoch
        if info.isreg():
            with open(path, "rb") as f:
                tar.addfile(info, f)
        else:
            tar.addfile(info)


def blob(tar, data, epoch):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mtime = epoch
    info.mode = 0o444
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True, help="full reference, e.g. k8s.gcr.io/pause:3.2")
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--entrypoint")
    ap.add_argument("--epoch", type=int, default=int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    a = ap.parse_args()
    if ":" not in a.name.rsplit("/", 1)[-1]:
        ap.error(f"--name {a.name} has no tag")
    if not os.path.isdir(a.rootfs):
        ap.error(f"--rootfs {a.rootfs} is not a directory")

    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        add_tree(t, a.rootfs, a.epoch)
    layer = layer_buf.getvalue()
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()

    config = {
        "architecture": ARCH,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "vm-manager images/scripts/oci-archive.py"}],
    }
    if a.entrypoint:
        config["config"]["Entrypoint"] = [a.entrypoint]

    tmp = a.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as t:
        layer_desc = blob(t, layer, a.epoch)
        layer_desc["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
        config_desc = blob(t, json.dumps(config, sort_keys=True).encode(), a.epoch)
        config_desc["mediaType"] = "application/vnd.oci.image.config.v1+json"
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = blob(t, json.dumps(manifest, sort_keys=True).encode(), a.epoch)
        manifest_desc["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
        manifest_desc["platform"] = {"architecture": ARCH, "os": "linux"}
        manifest_desc["annotations"] = {
            "io.containerd.image.name": a.name,
            "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[1],
        }
        for name, doc in (("oci-layout", {"imageLayoutVersion": "1.0.0"}),
                          ("index.json", {"schemaVersion": 2, "manifests": [manifest_desc]})):
            data = json.dumps(doc, sort_keys=True).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = a.epoch
            info.mode = 0o444
            t.addfile(info, io.BytesIO(data))
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
