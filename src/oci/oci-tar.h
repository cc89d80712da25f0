/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "api-error.h"
#include "cleanup.h"
#include "oci-ref.h"

/* Directory trees as tar+gzip layers, the way oras packs them: every entry is named below the
 * layer's title ("sysupdate/base", "sysupdate/base/SHA256SUMS"), the first one being the title's
 * directory itself.
 *
 * Writing is deterministic (names sorted, uid/gid 0, no user or group names, the files' own modes
 * and mtimes, a gzip header without time stamp), so a tree packs to the same digest every time.
 *
 * Reading is libarchive's (its tar reader: ustar with POSIX pax and GNU long-name headers, base-256
 * numbers), over a file: the layer is downloaded and its digest checked before a byte of it is
 * parsed. What libarchive reads, our extractor writes: regular files and directories only (links,
 * devices, FIFOs, sparse files and magic-less old tar entries are refused), under a directory
 * without ever following a symlink or leaving it. An archive needs its end-of-archive marker, and
 * after a lone zero block nothing may follow. */

#define OCI_TAR_ENTRIES_MAX 100000U
#define OCI_TAR_PATH_MAX 4096U

/* Where bytes go: 0, or a negative errno that stops the writer. */
typedef int (*OciSinkFunc)(const void *p, size_t n, void *userdata);

/* Packs the directory dirfd/title (title a relative path) as tar+gzip at the given zlib level into
 * sink, and stores the digest of the uncompressed tar in ret_tar_digest. Symlinks, devices and the
 * like in the tree are refused (-EMEDIUMTYPE, with the path in the message). */
int oci_tar_gz_pack(
        int dirfd,
        const char *title,
        int level,
        OciSinkFunc sink,
        void *userdata,
        char ret_tar_digest[static OCI_DIGEST_SHA256_LEN + 1],
        ApiError *reterr);

/* gzip decompression as a push stream, for the digest of a layer's tar while it downloads (the
 * extractor decompresses again, through libarchive). The stream may have several members; bytes
 * after the last one are refused. */
typedef struct OciGunzip OciGunzip;
typedef int (*OciGunzipSink)(const void *p, size_t n, void *userdata, ApiError *reterr);
int oci_gunzip_new(OciGunzip **ret, OciGunzipSink sink, void *userdata);
OciGunzip *oci_gunzip_free(OciGunzip *g);
DEFINE_TRIVIAL_CLEANUP_FUNC(OciGunzip *, oci_gunzip_free);
int oci_gunzip_feed(OciGunzip *g, const void *p, size_t n, ApiError *reterr);
/* -EBADMSG when the compressed stream was cut short. */
int oci_gunzip_finish(OciGunzip *g, ApiError *reterr);
/* Bytes produced so far. */
uint64_t oci_gunzip_total_out(const OciGunzip *g);

/* Normalises an archive path: '/'-separated, "." and empty components dropped, no "..", not
 * absolute, no control characters or '\\', at most OCI_TAR_PATH_MAX bytes. -EINVAL otherwise. */
int oci_tar_path_normalize(const char *path, char **ret);

/* Writes buf at *offset of fd, leaving holes for whole zero blocks of 4 KiB (the file must be
 * ftruncate()d to its full size at the end), and advances *offset. */
int oci_sparse_write(int fd, const void *buf, size_t n, uint64_t *offset);

/* The extractor: creates the entries of an archive below rootfd. Every entry must be prefix itself
 * (a directory) or below it. Files are created new (O_EXCL: a second entry of the same name is
 * refused), with mode 0755 when the archive gives any execute bit and 0644 otherwise, and their
 * mtimes; directories 0755. At most max_bytes of file data in all. */
typedef struct OciTarExtract {
        int rootfd;
        const char *prefix;
        uint64_t max_bytes;
        /* what was unpacked so far */
        uint64_t bytes, entries;
} OciTarExtract;

void oci_tar_extract_init(OciTarExtract *x, int rootfd, const char *prefix, uint64_t max_bytes);
/* Unpacks the archive that fd holds from its current offset, gzip-compressed when gzip is set.
 * tar_size is the size of the (uncompressed) archive, so that what follows its end is seen. At the
 * end, the prefix directory exists (made when the archive had no entry for it). Errors: -EBADMSG
 * (malformed, cut short), -EINVAL (an unsafe or outside path), -EMEDIUMTYPE (an entry that is not
 * a file or directory), -EEXIST (a name twice), -EFBIG (over max_bytes), -E2BIG (too many
 * entries), or what creating the files gave. */
int oci_tar_extract(OciTarExtract *x, int fd, bool gzip, uint64_t tar_size, ApiError *reterr);
