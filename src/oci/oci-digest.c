/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "hex-util.h"
#include "oci-digest.h"

#define READ_CHUNK ((size_t) 1 << 20)

int oci_digester_init(OciDigester *d) {
        assert_return(d, -EINVAL);

        d->ctx = EVP_MD_CTX_new();
        if (!d->ctx)
                return -ENOMEM;
        if (EVP_DigestInit_ex(d->ctx, EVP_sha256(), NULL) != 1) {
                oci_digester_done(d);
                return -EIO;
        }
        return 0;
}

int oci_digester_update(OciDigester *d, const void *p, size_t n) {
        assert_return(d && d->ctx, -EINVAL);

        if (n > 0 && EVP_DigestUpdate(d->ctx, p, n) != 1)
                return -EIO;
        return 0;
}

int oci_digester_final(OciDigester *d, char ret[static OCI_DIGEST_SHA256_LEN + 1]) {
        unsigned char md[32];
        unsigned len = 0;

        assert_return(d && d->ctx, -EINVAL);

        if (EVP_DigestFinal_ex(d->ctx, md, &len) != 1 || len != sizeof(md))
                return -EIO;
        memcpy(ret, OCI_DIGEST_SHA256_PREFIX, strlen(OCI_DIGEST_SHA256_PREFIX));
        hex_format(md, sizeof(md), ret + strlen(OCI_DIGEST_SHA256_PREFIX));
        return 0;
}

void oci_digester_done(OciDigester *d) {
        if (!d)
                return;
        EVP_MD_CTX_free(d->ctx);
        d->ctx = NULL;
}

int oci_digest_buffer(const void *p, size_t n, char ret[static OCI_DIGEST_SHA256_LEN + 1]) {
        _cleanup_(oci_digester_done) OciDigester d = {};
        int r;

        r = oci_digester_init(&d);
        if (r < 0)
                return r;
        r = oci_digester_update(&d, p, n);
        if (r < 0)
                return r;
        return oci_digester_final(&d, ret);
}

int oci_digest_fd(int fd, char ret[static OCI_DIGEST_SHA256_LEN + 1], uint64_t *ret_size) {
        _cleanup_(oci_digester_done) OciDigester d = {};
        _cleanup_free_ char *buf = malloc(READ_CHUNK);
        uint64_t off = 0;
        int r;

        if (!buf)
                return -ENOMEM;
        r = oci_digester_init(&d);
        if (r < 0)
                return r;
        for (;;) {
                ssize_t n = pread(fd, buf, READ_CHUNK, (off_t) off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                r = oci_digester_update(&d, buf, (size_t) n);
                if (r < 0)
                        return r;
                off += (uint64_t) n;
        }
        r = oci_digester_final(&d, ret);
        if (r < 0)
                return r;
        if (ret_size)
                *ret_size = off;
        return 0;
}
