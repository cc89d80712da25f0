/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdint.h>

#include "api-error.h"
#include "cleanup.h"

/* OCI image manifests (v1.1, with artifactType) and image indexes, as the distribution spec serves
 * them: parsed from untrusted bytes with hard limits, and written for a push. Docker's schema 2
 * manifest and manifest list are read too (the same shapes under other media types). */

#define OCI_MEDIA_TYPE_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define OCI_MEDIA_TYPE_INDEX "application/vnd.oci.image.index.v1+json"
#define OCI_MEDIA_TYPE_DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define OCI_MEDIA_TYPE_DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define OCI_MEDIA_TYPE_EMPTY "application/vnd.oci.empty.v1+json"
#define OCI_MEDIA_TYPE_LAYER_TAR_GZIP "application/vnd.oci.image.layer.v1.tar+gzip"
/* The Accept header of a manifest request: every type above that we can read. */
#define OCI_MANIFEST_ACCEPT                                                                   \
        OCI_MEDIA_TYPE_MANIFEST ", " OCI_MEDIA_TYPE_INDEX ", " OCI_MEDIA_TYPE_DOCKER_MANIFEST \
                                ", " OCI_MEDIA_TYPE_DOCKER_LIST

/* The empty config of an artifact: the two bytes "{}". */
#define OCI_EMPTY_DATA "{}"
#define OCI_EMPTY_DIGEST "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

/* The annotations oras reads and writes: a layer's file name, and for a directory packed as
 * tar+gzip, that it is to be unpacked and the digest of the uncompressed tar. */
#define OCI_ANNOTATION_TITLE "org.opencontainers.image.title"
#define OCI_ANNOTATION_UNPACK "io.deis.oras.content.unpack"
#define OCI_ANNOTATION_TAR_DIGEST "io.deis.oras.content.digest"

/* Limits on what a registry may hand us. */
#define OCI_MANIFEST_SIZE_MAX ((size_t) 4 << 20) /* the distribution spec's own suggestion */
#define OCI_LAYERS_MAX 128U
#define OCI_INDEX_MANIFESTS_MAX 1024U
#define OCI_ANNOTATIONS_MAX 64U
#define OCI_CONFIG_SIZE_MAX ((uint64_t) 1 << 20)
#define OCI_BLOB_SIZE_MAX (((uint64_t) 1 << 53) - 1)
#define OCI_TITLE_MAX 1024U

typedef struct OciDescriptor {
        char *media_type;
        char *digest;
        uint64_t size;
        char *artifact_type; /* NULL when absent */
        json_t *annotations; /* an object of strings (owned), or NULL */
        char *platform_os;   /* index entries: platform.os, platform.architecture, or NULL */
        char *platform_arch;
} OciDescriptor;

typedef struct OciManifest {
        char *media_type;    /* of the document: OCI_MEDIA_TYPE_MANIFEST or the Docker one */
        char *artifact_type; /* NULL when absent */
        OciDescriptor config;
        OciDescriptor *layers;
        size_t n_layers;
        json_t *annotations;
} OciManifest;

typedef struct OciIndex {
        char *media_type;
        OciDescriptor *manifests;
        size_t n_manifests;
} OciIndex;

typedef enum OciDocumentKind {
        OCI_DOCUMENT_MANIFEST,
        OCI_DOCUMENT_INDEX,
        _OCI_DOCUMENT_KIND_MAX,
        _OCI_DOCUMENT_KIND_INVALID = -EINVAL,
} OciDocumentKind;

/* Whether s is a media type: type "/" subtype, each 1-127 of RFC 6838's restricted-name characters,
 * and nothing else (no parameters). */
bool oci_media_type_is_valid(const char *s);

/* What a document is: by its own mediaType field, else by content_type (the Content-Type header,
 * parameters ignored; may be NULL), else by its shape ("manifests" or "layers"). -EBADMSG when it is
 * no JSON object, -EMEDIUMTYPE when it is neither. */
int oci_document_kind(
        const void *data, size_t size, const char *content_type, OciDocumentKind *ret, ApiError *reterr);

int oci_manifest_parse(const void *data, size_t size, OciManifest **ret, ApiError *reterr);
OciManifest *oci_manifest_free(OciManifest *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(OciManifest *, oci_manifest_free);

int oci_index_parse(const void *data, size_t size, OciIndex **ret, ApiError *reterr);
OciIndex *oci_index_free(OciIndex *i);
DEFINE_TRIVIAL_CLEANUP_FUNC(OciIndex *, oci_index_free);

/* The manifest of an index to follow: the one entry whose artifactType is artifact_type, else the
 * one for linux/amd64, else the only image manifest there is when it names no platform (one for
 * another platform is refused, as two would be). Entries that are indexes themselves are never
 * followed. Borrowed; -ENOENT with a message naming the platforms found when there is no such
 * entry. */
int oci_index_select(const OciIndex *i, const char *artifact_type, const OciDescriptor **ret, ApiError *reterr);

/* A descriptor's annotation, or NULL. */
const char *oci_descriptor_annotation(const OciDescriptor *d, const char *key);

void oci_descriptor_done(OciDescriptor *d);

/* The manifest JSON of an artifact (compact, keys in a fixed order, so the same input gives the same
 * digest): schemaVersion 2, mediaType, artifactType, the empty config, the layers with their
 * annotations, and annotations (may be NULL). */
int oci_manifest_format(
        const char *artifact_type,
        const OciDescriptor *layers,
        size_t n_layers,
        json_t *annotations,
        char **ret,
        size_t *ret_size);

/* Whether a layer title is a safe relative path: components separated by single '/', none empty,
 * "." or "..", no leading '/', no control characters or '\\', at most OCI_TITLE_MAX bytes. */
bool oci_title_is_safe(const char *s);
