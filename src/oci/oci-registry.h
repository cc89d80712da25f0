/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdint.h>

#include "api-error.h"
#include "cleanup.h"
#include "oci-manifest.h"
#include "oci-tar.h"
#include "time-util.h"

/* A client of one repository of an OCI distribution-spec registry, on libcurl's easy interface
 * (it blocks: it serves the image push and pull commands, never the daemon's loop).
 *
 * Authentication follows the registry's 401 challenges: Basic with the credentials given, or the
 * token flow (GET <realm>?service=…&scope=repository:<name>:pull[,push], with the credentials as
 * Basic when there are any, anonymous otherwise). Credentials and tokens travel only in
 * Authorization headers, and only to the registry's own host and to the token server; they are never
 * part of a URL, a message or a log line.
 *
 * Transfers survive broken connections: a blob download continues with a Range request from the
 * byte it reached; an upload asks the registry how far it got (GET on the upload URL) and continues
 * from there, or starts the blob again when the registry has dropped the upload (distribution 2.8
 * does once a chunk arrived in part). Each blob gets OCI_CLIENT_RETRIES_DEFAULT more attempts, with a
 * pause that doubles from half a second.
 *
 * A connection that moves less than 1 KiB/s for 60 s counts as broken, so a registry that trickles
 * could hold one blob for the six attempts' 6 minutes: the deadline bounds the client as a whole.
 * Past it, the exchange in progress is cut and every call fails with -ETIMEDOUT (API_ERROR_TIMEOUT),
 * the message naming what was being moved and, for a blob, how many of its bytes had arrived. */

#define OCI_CLIENT_CHUNK_DEFAULT ((uint64_t) 32 << 20)
#define OCI_CLIENT_RETRIES_DEFAULT 5U

typedef struct OciProgress {
        const char *label; /* what the blob is: a file name, "config", "manifest" */
        const char *digest;
        uint64_t done, total;
        bool finished;
        bool existed; /* push: the registry had it, nothing was sent */
} OciProgress;

typedef void (*OciProgressFunc)(const OciProgress *p, void *userdata);

typedef struct OciClientConfig {
        const char *host; /* "name[:port]" as in the reference */
        const char *repository;
        bool plain_http;      /* http:// instead of https:// (only when asked for) */
        const char *ca_file;  /* PEM bundle trusted instead of the system's, or NULL */
        const char *username; /* NULL for anonymous access */
        const char *password;
        bool push; /* ask token servers for push access too */
        const char *user_agent;
        uint64_t chunk_size;     /* uploads larger than this go in PATCH chunks of it; 0: the default */
        unsigned retries;        /* 0: the default */
        unsigned retry_delay_ms; /* the first pause; 0: 500 */
        usec_t deadline;         /* CLOCK_MONOTONIC; 0: none */
        OciProgressFunc progress;
        void *progress_userdata;
} OciClientConfig;

typedef struct OciClient OciClient;

int oci_client_new(OciClient **ret, const OciClientConfig *config);
OciClient *oci_client_free(OciClient *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(OciClient *, oci_client_free);

/* Body bytes of blobs moved so far (manifests and token requests not counted). */
uint64_t oci_client_bytes_sent(const OciClient *c);
uint64_t oci_client_bytes_received(const OciClient *c);

/* HEAD of a blob: 1 when the registry has it, 0 when not. */
int oci_client_blob_exists(OciClient *c, const char *digest, ApiError *reterr);

/* Uploads size bytes read from fd (pread from offset 0) as the blob digest, unless the registry has
 * it already (then 0; 1 when it was sent). */
int oci_client_blob_push_fd(
        OciClient *c, int fd, uint64_t size, const char *digest, const char *label, ApiError *reterr);
int oci_client_blob_push_data(
        OciClient *c, const void *data, size_t size, const char *digest, const char *label, ApiError *reterr);

/* Downloads the blob d describes into sink, refusing more bytes than d->size and checking the
 * digest at the end; the sink sees every byte once, in order, across resumed connections. A sink
 * error stops the download and is returned as it is. */
typedef int (*OciBlobSink)(const void *p, size_t n, void *userdata, ApiError *reterr);
int oci_client_blob_fetch(
        OciClient *c, const OciDescriptor *d, const char *label, OciBlobSink sink, void *userdata, ApiError *reterr);

/* GET of a manifest or index by tag or digest: the bytes (at most OCI_MANIFEST_SIZE_MAX), their
 * Content-Type and their digest, which is checked against the reference when it is one and against
 * the registry's Docker-Content-Digest when it sends one. */
int oci_client_manifest_get(
        OciClient *c,
        const char *reference,
        char **ret_data,
        size_t *ret_size,
        char **ret_content_type,
        char **ret_digest,
        ApiError *reterr);

/* HEAD of a manifest: its digest as the registry reports it, or NULL when it reports none. -ENOENT
 * when there is no such manifest. */
int oci_client_manifest_head(OciClient *c, const char *reference, char **ret_digest, ApiError *reterr);

/* PUT of a manifest under reference (a tag or its digest); returns its digest. */
int oci_client_manifest_put(
        OciClient *c,
        const char *reference,
        const char *media_type,
        const void *data,
        size_t size,
        char **ret_digest,
        ApiError *reterr);
