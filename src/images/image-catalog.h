/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <systemd/sd-event.h>

#include "api-error.h"
#include "cleanup.h"

/* The catalog of bootable images in one directory (the contract of --image-dir):
 *
 *   <dir>/<id>_<version>.efi            UKI
 *   <dir>/<id>_<version>.raw            base disk image; an image is a .efi with its .raw beside it
 *   <dir>/<id>_<version>.layout.json    optional disk layout of that image for a host install
 *                                       (disk-layout.h); without it the image is boot-only
 *   <dir>/<id>_<version>.policy.json    optional PCR policy of that image
 *   <dir>/policy.json                   optional policy; applies when its image_id/image_version match
 *   <dir>/sysupdate/kubernetes/SHA256SUMS   names kubernetes_<v>.raw, one line per Kubernetes version
 *
 * Lone files and names that are not <id>_<version> (split at the last underscore) are skipped with a
 * debug message. The list is ordered by id ascending, then by version descending. */

/* Images considered per scan; any beyond are ignored. */
#define IMAGE_CATALOG_MAX 1024U
/* Size limits of the files the catalog reads. */
#define IMAGE_POLICY_SIZE_MAX ((size_t) 1 << 20)
#define IMAGE_SUMS_SIZE_MAX ((size_t) 1 << 20)

typedef struct Image {
        unsigned n_ref;
        char *id, *version, *ref; /* ref = "<id>_<version>" */
        char *uki, *disk;         /* absolute paths */
        char *layout;             /* absolute path of the layout file, NULL when none */
        json_t *policy;           /* owned; NULL when none */
} Image;

/* An image of the catalog is reference-counted: a rescan drops the catalog's reference, and one a
 * user took (a VM's, from the request that created it) keeps the image's paths and policy as they
 * were found, whatever the directory holds since. Both accept NULL and return their argument
 * (image_unref(): NULL). */
Image *image_ref(Image *i);
Image *image_unref(Image *i);
DEFINE_TRIVIAL_CLEANUP_FUNC(Image *, image_unref);

typedef struct ImageCatalog ImageCatalog;

typedef void (*ImageCatalogChangeFunc)(ImageCatalog *c, void *userdata);

/* Scans image_dir once. When event is non-NULL the directory is also watched with inotify (and so are
 * image_dir/sysupdate and image_dir/sysupdate/kubernetes, from when they appear), and the catalog
 * rescans about 200 ms after the last change, so new images appear without a restart. A relative
 * image_dir is made absolute against the working directory. A missing image_dir is -ENOENT, with an
 * ApiError naming it. */
int image_catalog_new(ImageCatalog **ret, sd_event *event, const char *image_dir, ApiError *reterr);
ImageCatalog *image_catalog_free(ImageCatalog *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(ImageCatalog *, image_catalog_free);

/* Reads the directory again and replaces the list; returns the number of images. When the directory
 * cannot be read, the previous list stays and a negative errno is returned. Calls the change callback
 * when the result differs from the previous list. */
int image_catalog_rescan(ImageCatalog *c);

/* Called after every rescan (explicit or from the watch) whose result differs from the list before.
 * The callback must not free the catalog. cb = NULL removes it. */
void image_catalog_set_change_callback(ImageCatalog *c, ImageCatalogChangeFunc cb, void *userdata);

/* Images and strings handed out below are borrowed: they stay valid until the next rescan, which,
 * with an event loop, may happen whenever control returns to the loop. Copy what must outlive that. */

size_t image_catalog_size(ImageCatalog *c);
/* The i-th image in list order; NULL when i is out of range. */
const Image *image_catalog_at(ImageCatalog *c, size_t i);

/* The first image in list order whose "<id>_<version>" equals ref or whose id equals it, so a bare id
 * selects its newest version. NULL or "" selects the default image: the highest version across all
 * ids (ties: the first in list order). NULL when nothing matches or the catalog is empty. Borrowed;
 * image_catalog_acquire() returns the same image as a new reference. */
const Image *image_catalog_resolve(ImageCatalog *c, const char *ref);
Image *image_catalog_acquire(ImageCatalog *c, const char *ref);

/* The Kubernetes versions of <dir>/sysupdate/kubernetes/SHA256SUMS, newest first; the same for every
 * image. NULL when there are none. */
char **image_catalog_kubernetes_versions(ImageCatalog *c);
/* Why a Kubernetes version of sysupdate/kubernetes is not offered (its extension cannot run a node,
 * says the build's manifest.json), or NULL when it is offered or not there at all. Borrowed. */
const char *image_catalog_kubernetes_unusable(ImageCatalog *c, const char *version);

/* The image directory, absolute and without trailing slash. */
const char *image_catalog_dir(ImageCatalog *c);

/* Returns a new reference, NULL on OOM: an object with the keys id, version, uki, disk, layout (when
 * the image has one), then
 * sysupdateDir (when <dir>/sysupdate is a directory), kubernetesVersions (when there are any) and
 * policy (a copy; when the image has one). */
json_t *image_to_json(ImageCatalog *c, const Image *i);
/* Returns a new reference, NULL on OOM: the array of all images in list order, [] when empty. */
json_t *image_catalog_to_json(ImageCatalog *c);
/* Resolves ref as image_catalog_resolve() and renders it; an unknown ref is -ENOENT, not_found:
 * image "<ref>". */
int image_catalog_get_json(ImageCatalog *c, const char *ref, json_t **ret, ApiError *reterr);

/* Orders versions: split on '.', compare component by component. Two numbers compare numerically; a
 * number against a non-number compares the leading digits first, then the shorter suffix wins, so
 * "0" > "0-rc1" and a missing component sorts lowest; two non-numbers compare byte-wise. Returns < 0,
 * 0 or > 0. "1.0" and "1.0.0" are equal. */
int image_version_compare(const char *a, const char *b) _pure_;
