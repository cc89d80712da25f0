/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "api-error.h"
#include "cleanup.h"

/* A reference to an artifact in a registry: host[:port]/repository[:tag][@sha256:<hex>]. The host
 * is never implied (there is no default registry): the first path component must be a host name
 * with a dot or a port, "localhost", or an IP address ([v6] in brackets). The repository follows
 * the distribution spec's grammar (lower-case components separated by '/'); the tag is at most 128
 * characters of [A-Za-z0-9_.-] not starting with '.' or '-'. Without a tag or digest the tag is
 * "latest". */

#define OCI_DIGEST_SHA256_PREFIX "sha256:"
#define OCI_DIGEST_SHA256_LEN (7 + 64) /* "sha256:" and 64 hex digits */

typedef struct OciRef {
        char *host;       /* "registry.example.com:5000", "[::1]:5000" */
        char *repository; /* "team/vm-image" */
        char *tag;        /* NULL when only a digest was given */
        char *digest;     /* "sha256:…", or NULL */
} OciRef;

/* Parses s. -EINVAL with a message naming what is wrong; -EOPNOTSUPP for a digest of another
 * algorithm than sha256. */
int oci_ref_parse(const char *s, OciRef *ret, ApiError *reterr);
void oci_ref_done(OciRef *r);

/* host/repository followed by :tag or @digest (the digest when there is one). NULL on OOM. */
char *oci_ref_to_string(const OciRef *r);

/* Whether s is "sha256:" and 64 lower-case hex digits. */
bool oci_digest_is_valid(const char *s);

/* Whether s is a tag as above. */
bool oci_tag_is_valid(const char *s);
