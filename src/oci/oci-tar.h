/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

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
 * Reading is a push parser over untrusted bytes: ustar with POSIX pax ('x', 'g') and GNU long-name
 * ('L', 'K') headers, base-256 numbers; regular files and directories only. Links, devices, FIFOs
 * and sparse entries are refused, as is anything after a lone zero block. The extractor below
 * writes what it reads under a directory without ever following a symlink or leaving it. */

#define OCI_TAR_ENTRIES_MAX 100000U
#define OCI_TAR_PATH_MAX 4096U
#define OCI_TAR_PAX_MAX ((size_t) 1 << 16)

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

typedef enum OciTarType {
        OCI_TAR_FILE,
        OCI_TAR_DIRECTORY,
} OciTarType;

typedef struct OciTarEntry {
        const char *path; /* as the archive names it (pax path, GNU long name or prefix/name) */
        OciTarType type;
        uint64_t size;
        uint32_t mode;
        int64_t mtime;
} OciTarEntry;

typedef struct OciTarCallbacks {
        /* an entry starts; a file's data follows in data() calls, then entry_end() */
        int (*entry)(const OciTarEntry *e, void *userdata, ApiError *reterr);
        int (*data)(const void *p, size_t n, void *userdata, ApiError *reterr);
        int (*entry_end)(void *userdata, ApiError *reterr);
} OciTarCallbacks;

typedef struct OciTarReader OciTarReader;

int oci_tar_reader_new(OciTarReader **ret, const OciTarCallbacks *cb, void *userdata);
OciTarReader *oci_tar_reader_free(OciTarReader *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(OciTarReader *, oci_tar_reader_free);
/* Parses more of the archive. Errors are sticky: once a call failed, every later one fails. */
int oci_tar_reader_feed(OciTarReader *r, const void *p, size_t n, ApiError *reterr);
/* The archive ended: -EBADMSG unless its end-of-archive marker was seen. */
int oci_tar_reader_finish(OciTarReader *r, ApiError *reterr);

/* gzip decompression in front of a tar reader (or anything that takes bytes). The stream may have
 * several members; bytes after the last one are refused. */
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

/* The extractor: tar callbacks that create the entries below rootfd. Every entry must be prefix
 * itself (a directory) or below it. Files are created new (O_EXCL: a second entry of the same name
 * is refused), with mode 0755 when the archive gives any execute bit and 0644 otherwise, and their
 * mtimes; directories 0755. At most max_bytes of file data in all. */
typedef struct OciTarExtract {
        int rootfd;
        const char *prefix;
        uint64_t max_bytes;
        /* state */
        int fd;
        char *path;
        uint64_t offset, size, bytes, entries;
        int64_t mtime;
} OciTarExtract;

extern const OciTarCallbacks oci_tar_extract_callbacks;
void oci_tar_extract_init(OciTarExtract *x, int rootfd, const char *prefix, uint64_t max_bytes);
void oci_tar_extract_done(OciTarExtract *x);
/* After the archive ended: the prefix directory exists (made when the archive had no entry for it). */
int oci_tar_extract_finish(OciTarExtract *x, ApiError *reterr);
