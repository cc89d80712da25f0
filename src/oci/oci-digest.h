/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <openssl/evp.h>
#include <stddef.h>

#include "oci-ref.h"

/* SHA-256 of a stream, as an OCI digest ("sha256:<64 hex>"). */
typedef struct OciDigester {
        EVP_MD_CTX *ctx;
} OciDigester;

int oci_digester_init(OciDigester *d);
/* Returns 0, or -EIO when OpenSSL fails. */
int oci_digester_update(OciDigester *d, const void *p, size_t n);
/* Writes the digest of everything given so far (OCI_DIGEST_SHA256_LEN + 1 bytes); the digester
 * can be used for nothing else afterwards but oci_digester_done(). */
int oci_digester_final(OciDigester *d, char ret[static OCI_DIGEST_SHA256_LEN + 1]);
void oci_digester_done(OciDigester *d);

/* The digest of a buffer. */
int oci_digest_buffer(const void *p, size_t n, char ret[static OCI_DIGEST_SHA256_LEN + 1]);

/* The digest and size of a whole regular file read from fd (from offset 0, with pread). */
int oci_digest_fd(int fd, char ret[static OCI_DIGEST_SHA256_LEN + 1], uint64_t *ret_size);
