/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdint.h>

#include "api-error.h"
#include "oci-ref.h"
#include "oci-registry.h"

/* One image of an --image-dir (image-catalog.h) as one OCI artifact, and back.
 *
 * The artifact is an image manifest (OCI 1.1) of artifactType OCI_IMAGE_ARTIFACT_TYPE with the empty
 * config and one layer per file or tree, each named by its org.opencontainers.image.title:
 *
 *   <id>_<version>.efi      the UKI                      (a file layer)
 *   <id>_<version>.raw      the disk                     (a file layer)
 *   <id>_<version>.layout.json  the disk's layout for a host install (a file layer; when the image
 *                                                          has one)
 *   policy.json             the image's policy           (a file layer; from <ref>.policy.json or a
 *                                                          policy.json for this image)
 *   manifest.json           the build's manifest         (a file layer; likewise)
 *   sysupdate/<component>   each tree of sysupdate/      (tar+gzip, unpacked: oras's annotations)
 *
 * which `oras pull` unpacks into the same files, and which `oras push` of those paths makes.
 *
 * A pull stages everything in <dir>/.pull-XXXXXX, checks it, and then moves it in with one rename
 * per file or tree (an exchange where something is replaced): the image's .efi, which is what makes
 * the daemon's catalog see an image, leaves first (when the image is being replaced) and comes back
 * last, so a rescan at any moment sees the image whole, or not at all. An artifact without a layout
 * takes the directory's <id>_<version>.layout.json away in the same moves (an earlier build's layout
 * does not fit the new disk), and a failed pull puts it back. A failure before or during
 * the moves puts back what was there; the directory is then as it was. A record of the pull
 * (<dir>/.<ref>.oci.json) lets the next pull of the same digest stop before any blob moves. */

#define OCI_IMAGE_ARTIFACT_TYPE "application/vnd.giantswarm.vm-image.v1"
#define OCI_IMAGE_MEDIA_TYPE_UKI "application/vnd.giantswarm.vm-image.uki.v1"
#define OCI_IMAGE_MEDIA_TYPE_DISK "application/vnd.giantswarm.vm-image.disk.v1.raw"
#define OCI_IMAGE_MEDIA_TYPE_POLICY "application/vnd.giantswarm.vm-image.policy.v1+json"
#define OCI_IMAGE_MEDIA_TYPE_MANIFEST "application/vnd.giantswarm.vm-image.manifest.v1+json"
#define OCI_IMAGE_MEDIA_TYPE_LAYOUT "application/vnd.giantswarm.vm-image.layout.v1+json"

/* What a pull does with a local policy that has recorded golden values when the artifact's policy
 * has none: keep them (copied into the new policy) or replace the policy as it comes. */
typedef enum OciPolicyMode {
        OCI_POLICY_KEEP,
        OCI_POLICY_REPLACE,
        _OCI_POLICY_MODE_MAX,
        _OCI_POLICY_MODE_INVALID = -EINVAL,
} OciPolicyMode;

const char *oci_policy_mode_to_string(OciPolicyMode m) _const_;
OciPolicyMode oci_policy_mode_from_string(const char *s) _pure_;

typedef struct OciPushResult {
        char *image;  /* <id>_<version> */
        char *digest; /* of the manifest */
        size_t n_layers;
        uint64_t size; /* of all layers */
} OciPushResult;

void oci_push_result_done(OciPushResult *r);

/* Pushes image (a ref or bare id, resolved as the daemon does) of image_dir to ref's tag (or digest,
 * which must then be that of the manifest). gzip_level: the zlib level for the trees. */
int oci_image_push(
        OciClient *c,
        const char *image_dir,
        const char *image,
        const OciRef *ref,
        int gzip_level,
        OciPushResult *ret,
        ApiError *reterr);

typedef struct OciPullOptions {
        OciPolicyMode policy;
        uint64_t tree_bytes_max; /* unpacked size of all trees together; 0: 64 GiB */
} OciPullOptions;

typedef struct OciPullResult {
        char *image;
        char *digest;    /* what ref resolved to (an index's digest when it named one) */
        bool up_to_date; /* a record showed this digest installed: nothing was fetched */
        bool kept_golden;
        char *policy_file; /* where the policy went (NULL: the artifact had none) */
        size_t n_layers;
        uint64_t size;
} OciPullResult;

void oci_pull_result_done(OciPullResult *r);

int oci_image_pull(
        OciClient *c,
        const OciRef *ref,
        const char *image_dir,
        const OciPullOptions *o,
        OciPullResult *ret,
        ApiError *reterr);
