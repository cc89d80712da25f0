/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fs-util.h"
#include "oci-digest.h"
#include "oci-tar.h"
#include "oci-util.h"

#define BLOCK 512U
#define ZBUF ((size_t) 256 << 10)
#define SPARSE_BLOCK 4096U
#define PACK_DEPTH_MAX 32
#define OCTAL_11_MAX 077777777777ULL /* the largest value of an 11-digit octal field: 8 GiB - 1 */

/* ---- the ustar header ---- */

typedef struct TarHeader {
        char name[100];
        char mode[8];
        char uid[8];
        char gid[8];
        char size[12];
        char mtime[12];
        char chksum[8];
        char typeflag;
        char linkname[100];
        char magic[6];
        char version[2];
        char uname[32];
        char gname[32];
        char devmajor[8];
        char devminor[8];
        char prefix[155];
        char pad[12];
} TarHeader;

_Static_assert(sizeof(TarHeader) == BLOCK, "a tar header is one block");

static unsigned header_checksum(const unsigned char *b) {
        unsigned sum = 0;

        for (size_t i = 0; i < BLOCK; i++)
                sum += (i >= 148 && i < 156) ? ' ' : b[i];
        return sum;
}

/* A numeric field: octal digits (leading spaces allowed, ended by NUL or space), or GNU's base-256
 * with the high bit of the first byte set. Negative base-256 values are refused. */
static int parse_number(const char *f, size_t n, uint64_t *ret) {
        uint64_t v = 0;
        size_t i = 0;

        if ((unsigned char) f[0] & 0x80) {
                if ((unsigned char) f[0] != 0x80)
                        return -EINVAL;
                for (i = 1; i < n; i++) {
                        if (v >> 56)
                                return -ERANGE;
                        v = (v << 8) | (unsigned char) f[i];
                }
                *ret = v;
                return 0;
        }
        while (i < n && f[i] == ' ')
                i++;
        if (i == n || f[i] < '0' || f[i] > '7')
                return -EINVAL;
        for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
                if (v >> 60)
                        return -ERANGE;
                v = v * 8 + (uint64_t) (f[i] - '0');
        }
        for (; i < n; i++)
                if (f[i] != ' ' && f[i] != 0)
                        return -EINVAL;
        *ret = v;
        return 0;
}

static void format_octal(char *f, size_t n, uint64_t v) {
        /* n-1 digits and a NUL, as GNU tar and Go write them */
        snprintf(f, n, "%0*" PRIo64, (int) n - 1, v);
}

/* ---- gzip output ---- */

typedef struct GzipWriter {
        z_stream z;
        bool init;
        unsigned char *out;
        OciSinkFunc sink;
        void *userdata;
        OciDigester tar_digest; /* of the bytes before compression */
} GzipWriter;

static void gzip_writer_done(GzipWriter *g) {
        if (g->init)
                (void) deflateEnd(&g->z);
        g->init = false;
        g->out = mfree(g->out);
        oci_digester_done(&g->tar_digest);
}

static int gzip_writer_init(GzipWriter *g, int level, OciSinkFunc sink, void *userdata) {
        int r;

        *g = (GzipWriter){ .sink = sink, .userdata = userdata };
        g->out = malloc(ZBUF);
        if (!g->out)
                return -ENOMEM;
        /* 15 + 16: a gzip wrapper; zlib writes its header with time stamp 0 */
        if (deflateInit2(&g->z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
                return -ENOMEM;
        g->init = true;
        r = oci_digester_init(&g->tar_digest);
        return r;
}

static int gzip_run(GzipWriter *g, const void *p, size_t n, int flush) {
        int r;

        r = oci_digester_update(&g->tar_digest, p, n);
        if (r < 0)
                return r;
        g->z.next_in = (Bytef *) p;
        g->z.avail_in = (uInt) n;
        do {
                int z;

                g->z.next_out = g->out;
                g->z.avail_out = (uInt) ZBUF;
                z = deflate(&g->z, flush);
                if (z == Z_STREAM_ERROR)
                        return -EIO;
                if (ZBUF - g->z.avail_out > 0) {
                        r = g->sink(g->out, ZBUF - g->z.avail_out, g->userdata);
                        if (r < 0)
                                return r;
                }
                if (flush == Z_FINISH && z == Z_STREAM_END)
                        return 0;
        } while (g->z.avail_out == 0 || g->z.avail_in > 0 || flush == Z_FINISH);
        return 0;
}

static int gzip_write(GzipWriter *g, const void *p, size_t n) {
        const char *c = p;

        /* avail_in is an unsigned int */
        while (n > 0) {
                size_t k = MIN(n, (size_t) 1 << 30);
                int r = gzip_run(g, c, k, Z_NO_FLUSH);
                if (r < 0)
                        return r;
                c += k;
                n -= k;
        }
        return 0;
}

/* ---- tar output ---- */

static int pax_record(char **buf, size_t *len, const char *key, const char *value) {
        /* "<len> key=value\n", where len counts itself */
        size_t body = 1 + strlen(key) + 1 + strlen(value) + 1, total = body + 1;
        char *n;

        while (total != body + (size_t) snprintf(NULL, 0, "%zu", total))
                total = body + (size_t) snprintf(NULL, 0, "%zu", total);
        n = realloc(*buf, *len + total + 1);
        if (!n)
                return -ENOMEM;
        snprintf(n + *len, total + 1, "%zu %s=%s\n", total, key, value);
        *buf = n;
        *len += total;
        return 0;
}

static void header_finish(TarHeader *h) {
        memcpy(h->magic, "ustar", 6);
        memcpy(h->version, "00", 2);
        memset(h->chksum, ' ', sizeof(h->chksum));
        snprintf(h->chksum, sizeof(h->chksum), "%06o", header_checksum((const unsigned char *) h));
        h->chksum[7] = ' ';
}

static int write_padding(GzipWriter *g, uint64_t size) {
        static const char zeros[BLOCK];
        size_t pad = (BLOCK - size % BLOCK) % BLOCK;

        return pad > 0 ? gzip_write(g, zeros, pad) : 0;
}

static int write_header(GzipWriter *g, const char *name, char type, const struct stat *st) {
        _cleanup_free_ char *pax = NULL;
        size_t pax_len = 0, len = strlen(name);
        uint64_t size = type == '0' ? (uint64_t) st->st_size : 0;
        /* a directory's mtime changes with every file added, so it is not kept: a pulled tree packs to
         * the same bytes as the tree it came from */
        int64_t mtime = type == '5' ? 0 : st->st_mtim.tv_sec;
        const char *split = NULL;
        TarHeader h = {};
        int r;

        if (len > sizeof(h.name)) {
                /* ustar: prefix (up to 155) '/' name (up to 100) */
                for (const char *s = strchr(name, '/'); s; s = strchr(s + 1, '/'))
                        if ((size_t) (s - name) <= sizeof(h.prefix) &&
                            len - (size_t) (s - name) - 1 <= sizeof(h.name) && s[1] != 0) {
                                split = s;
                                break;
                        }
                if (!split && (r = pax_record(&pax, &pax_len, "path", name)) < 0)
                        return r;
        }
        if (size > OCTAL_11_MAX) {
                char v[32];
                snprintf(v, sizeof(v), "%" PRIu64, size);
                r = pax_record(&pax, &pax_len, "size", v);
                if (r < 0)
                        return r;
        }
        if (mtime < 0 || (uint64_t) mtime > OCTAL_11_MAX) {
                char v[32];
                snprintf(v, sizeof(v), "%" PRId64, mtime);
                r = pax_record(&pax, &pax_len, "mtime", v);
                if (r < 0)
                        return r;
                mtime = 0;
        }

        if (pax) {
                TarHeader x = {};
                snprintf(
                        x.name,
                        sizeof(x.name),
                        "PaxHeaders.0/%.80s",
                        strrchr(name, '/') ? strrchr(name, '/') + 1 : name);
                format_octal(x.mode, sizeof(x.mode), 0644);
                format_octal(x.uid, sizeof(x.uid), 0);
                format_octal(x.gid, sizeof(x.gid), 0);
                format_octal(x.size, sizeof(x.size), pax_len);
                format_octal(x.mtime, sizeof(x.mtime), 0);
                x.typeflag = 'x';
                header_finish(&x);
                if ((r = gzip_write(g, &x, sizeof(x))) < 0 || (r = gzip_write(g, pax, pax_len)) < 0 ||
                    (r = write_padding(g, pax_len)) < 0)
                        return r;
        }

        if (split) {
                memcpy(h.prefix, name, (size_t) (split - name));
                memcpy(h.name, split + 1, len - (size_t) (split - name) - 1);
        } else
                memcpy(h.name, name, MIN(len, sizeof(h.name)));
        format_octal(h.mode, sizeof(h.mode), st->st_mode & 07777 & ~(mode_t) 07000);
        format_octal(h.uid, sizeof(h.uid), 0);
        format_octal(h.gid, sizeof(h.gid), 0);
        format_octal(h.size, sizeof(h.size), size > OCTAL_11_MAX ? 0 : size);
        format_octal(h.mtime, sizeof(h.mtime), (uint64_t) mtime);
        h.typeflag = type;
        header_finish(&h);
        return gzip_write(g, &h, sizeof(h));
}

static int pack_file(
        GzipWriter *g, int dirfd, const char *name, const char *path, const struct stat *st, ApiError *reterr) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        uint64_t left = (uint64_t) st->st_size;
        int r;

        fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot open %s: %m", path);
        r = write_header(g, path, '0', st);
        if (r < 0)
                return r;
        buf = malloc(ZBUF);
        if (!buf)
                return -ENOMEM;
        while (left > 0) {
                ssize_t n = read(fd, buf, MIN(left, (uint64_t) ZBUF));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot read %s: %m", path);
                if (n == 0)
                        return api_error_set(
                                reterr, -EIO, API_ERROR_INTERNAL, "%s shrank while it was packed", path);
                r = gzip_write(g, buf, (size_t) n);
                if (r < 0)
                        return r;
                left -= (uint64_t) n;
        }
        return write_padding(g, (uint64_t) st->st_size);
}

static int name_cmp(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

static int pack_dir(
        GzipWriter *g, int dirfd, const char *path, const struct stat *st, unsigned depth, ApiError *reterr) {
        _cleanup_(closedirp) DIR *d = NULL;
        _cleanup_strv_free_ char **names = NULL;
        size_t n = 0, allocated = 0;
        struct dirent *de;
        int r;

        if (depth > PACK_DEPTH_MAX)
                return api_error_set(reterr, -ELOOP, API_ERROR_INTERNAL, "%s is nested too deep", path);
        r = write_header(g, path, '5', st);
        if (r < 0)
                return r;

        d = oci_opendir_fd(dirfd);
        if (!d)
                return -errno;
        while ((errno = 0, de = readdir(d))) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                if (n + 2 > allocated) {
                        char **l = reallocarray(names, allocated * 2 + 16, sizeof(char *));
                        if (!l)
                                return -ENOMEM;
                        names = l;
                        allocated = allocated * 2 + 16;
                }
                names[n] = strdup(de->d_name);
                if (!names[n])
                        return -ENOMEM;
                names[++n] = NULL;
        }
        if (errno != 0)
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot read the directory %s: %m", path);
        if (n > 0)
                qsort(names, n, sizeof(char *), name_cmp);

        for (size_t i = 0; i < n; i++) {
                _cleanup_free_ char *child = NULL;
                struct stat cst;

                if (asprintf(&child, "%s/%s", path, names[i]) < 0)
                        return -ENOMEM;
                if (fstatat(dirfd, names[i], &cst, AT_SYMLINK_NOFOLLOW) < 0)
                        return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot stat %s: %m", child);
                if (S_ISREG(cst.st_mode))
                        r = pack_file(g, dirfd, names[i], child, &cst, reterr);
                else if (S_ISDIR(cst.st_mode)) {
                        _cleanup_close_ int sub = openat(
                                dirfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub < 0)
                                return api_error_set(
                                        reterr, -errno, API_ERROR_INTERNAL, "cannot open %s: %m", child);
                        r = pack_dir(g, sub, child, &cst, depth + 1, reterr);
                } else
                        return api_error_set(
                                reterr,
                                -EMEDIUMTYPE,
                                API_ERROR_INVALID_REQUEST,
                                "%s is %s: only regular files and directories can be packed",
                                child,
                                S_ISLNK(cst.st_mode) ? "a symlink" : "a special file");
                if (r < 0)
                        return r;
        }
        return 0;
}

int oci_tar_gz_pack(
        int dirfd,
        const char *title,
        int level,
        OciSinkFunc sink,
        void *userdata,
        char ret_tar_digest[static OCI_DIGEST_SHA256_LEN + 1],
        ApiError *reterr) {
        static const char end[2 * BLOCK];
        _cleanup_(gzip_writer_done) GzipWriter g = {};
        _cleanup_close_ int fd = -EBADF;
        struct stat st;
        int r;

        assert_return(title, -EINVAL);
        assert_return(sink, -EINVAL);

        fd = openat(dirfd, title, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) < 0)
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot open the directory %s: %m", title);
        r = gzip_writer_init(&g, level, sink, userdata);
        if (r < 0)
                return r;
        r = pack_dir(&g, fd, title, &st, 0, reterr);
        if (r < 0)
                return r;
        r = gzip_write(&g, end, sizeof(end));
        if (r < 0)
                return r;
        r = gzip_run(&g, NULL, 0, Z_FINISH);
        if (r < 0)
                return r;
        return oci_digester_final(&g.tar_digest, ret_tar_digest);
}

/* ---- reading ---- */

typedef enum ReaderState {
        STATE_HEADER, /* collecting a header block */
        STATE_DATA,   /* a file's data */
        STATE_SKIP,   /* data nobody wants (a directory's, a global pax header's) */
        STATE_META,   /* collecting a pax or GNU long-name header's data */
        STATE_PAD,    /* padding to the next block */
        STATE_END,    /* two zero blocks seen; the rest is ignored */
} ReaderState;

struct OciTarReader {
        const OciTarCallbacks *cb;
        void *userdata;
        ReaderState state;
        int error;
        unsigned char block[BLOCK];
        size_t fill;
        uint64_t left; /* of DATA, SKIP, META or PAD */
        unsigned zero_blocks;
        uint64_t entries;

        /* META: what is being collected */
        char meta_type;
        char *meta;
        size_t meta_len;
        uint64_t meta_pad;

        /* what the pax and GNU headers said about the next entry */
        char *next_path;
        bool next_has_size, next_has_mtime;
        uint64_t next_size;
        int64_t next_mtime;
};

int oci_tar_reader_new(OciTarReader **ret, const OciTarCallbacks *cb, void *userdata) {
        OciTarReader *r;

        assert_return(ret, -EINVAL);
        assert_return(cb && cb->entry && cb->data && cb->entry_end, -EINVAL);

        r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->cb = cb;
        r->userdata = userdata;
        *ret = r;
        return 0;
}

OciTarReader *oci_tar_reader_free(OciTarReader *r) {
        if (!r)
                return NULL;
        free(r->meta);
        free(r->next_path);
        return mfree(r);
}

_printf_(4, 5) static int fail(OciTarReader *r, int error, ApiError *reterr, const char *format, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, format);
        if (vasprintf(&msg, format, ap) < 0)
                msg = NULL;
        va_end(ap);
        r->error = error;
        return api_error_set(reterr, error, API_ERROR_INTERNAL, "%s", msg ?: "the archive is malformed");
}

/* Applies the records of a pax header ("<len> <key>=<value>\n"…) to the next entry. Global
 * headers ('g') are checked the same way and then forgotten. */
static int apply_pax(OciTarReader *r, bool global, ApiError *reterr) {
        const char *p = r->meta, *end = r->meta + r->meta_len;

        while (p < end) {
                const char *sp, *eq, *rec_end;
                uint64_t len = 0;

                for (sp = p; sp < end && *sp >= '0' && *sp <= '9'; sp++) {
                        len = len * 10 + (uint64_t) (*sp - '0');
                        if (len > r->meta_len)
                                return fail(
                                        r, -EBADMSG, reterr, "a pax header record is longer than the header");
                }
                if (sp == p || sp >= end || *sp != ' ' || len > (uint64_t) (end - p) ||
                    len < (uint64_t) (sp - p) + 3)
                        return fail(r, -EBADMSG, reterr, "a pax header record is malformed");
                rec_end = p + len;
                if (rec_end[-1] != '\n')
                        return fail(r, -EBADMSG, reterr, "a pax header record does not end with a newline");
                eq = memchr(sp + 1, '=', (size_t) (rec_end - sp - 1));
                if (!eq || eq == sp + 1)
                        return fail(r, -EBADMSG, reterr, "a pax header record has no key");

                if (!global) {
                        size_t klen = (size_t) (eq - sp - 1), vlen = (size_t) (rec_end - 1 - eq - 1);
                        const char *v = eq + 1;

                        if (klen == 4 && strneq(sp + 1, "path", 4)) {
                                if (vlen == 0 || memchr(v, 0, vlen) || vlen > OCI_TAR_PATH_MAX)
                                        return fail(
                                                r,
                                                -EBADMSG,
                                                reterr,
                                                "a pax path is empty, too long or has a NUL");
                                free(r->next_path);
                                r->next_path = strndup(v, vlen);
                                if (!r->next_path)
                                        return -ENOMEM;
                        } else if (klen == 4 && strneq(sp + 1, "size", 4)) {
                                uint64_t s = 0;
                                if (vlen == 0 || vlen > 19)
                                        return fail(r, -EBADMSG, reterr, "a pax size is not a number");
                                for (size_t i = 0; i < vlen; i++) {
                                        if (v[i] < '0' || v[i] > '9')
                                                return fail(r, -EBADMSG, reterr, "a pax size is not a number");
                                        s = s * 10 + (uint64_t) (v[i] - '0');
                                }
                                r->next_size = s;
                                r->next_has_size = true;
                        } else if (klen == 5 && strneq(sp + 1, "mtime", 5)) {
                                /* seconds, with an optional sign and fraction (dropped) */
                                int64_t s = 0;
                                size_t i = 0;
                                bool neg = vlen > 0 && v[0] == '-';

                                for (i = neg ? 1 : 0; i < vlen && v[i] >= '0' && v[i] <= '9' && i < 19; i++)
                                        s = s * 10 + (v[i] - '0');
                                if (i == (neg ? 1U : 0U) || (i < vlen && v[i] != '.'))
                                        return fail(r, -EBADMSG, reterr, "a pax mtime is not a number");
                                r->next_mtime = neg ? -s : s;
                                r->next_has_mtime = true;
                        }
                }
                p = rec_end;
        }
        return 0;
}

static void forget_next(OciTarReader *r) {
        r->next_path = mfree(r->next_path);
        r->next_has_size = r->next_has_mtime = false;
}

static bool block_is_zero(const unsigned char *b) {
        for (size_t i = 0; i < BLOCK; i++)
                if (b[i])
                        return false;
        return true;
}

static int process_header(OciTarReader *r, ApiError *reterr) {
        const TarHeader *h = (const TarHeader *) r->block;
        _cleanup_free_ char *path = NULL;
        uint64_t chk, size, mtime, mode;
        bool posix, gnu;
        int k;

        if (block_is_zero(r->block)) {
                if (++r->zero_blocks == 2)
                        r->state = STATE_END;
                return 0;
        }
        if (r->zero_blocks > 0)
                return fail(r, -EBADMSG, reterr, "the archive goes on after a lone zero block");

        posix = memcmp(h->magic, "ustar\0", 6) == 0 && memcmp(h->version, "00", 2) == 0;
        gnu = memcmp(h->magic, "ustar ", 6) == 0 && memcmp(h->version, " \0", 2) == 0;
        if (!posix && !gnu)
                return fail(r, -EBADMSG, reterr, "not a ustar archive (a header without the ustar magic)");
        if (parse_number(h->chksum, sizeof(h->chksum), &chk) < 0 || chk != header_checksum(r->block))
                return fail(r, -EBADMSG, reterr, "a header's checksum does not match");
        if (parse_number(h->size, sizeof(h->size), &size) < 0 ||
            parse_number(h->mtime, sizeof(h->mtime), &mtime) < 0 ||
            parse_number(h->mode, sizeof(h->mode), &mode) < 0)
                return fail(r, -EBADMSG, reterr, "a header has a malformed number");

        switch (h->typeflag) {
        case 'x':
        case 'g':
        case 'L':
        case 'K':
                if (size > OCI_TAR_PAX_MAX)
                        return fail(r, -EBADMSG, reterr, "an extended header is larger than 64 KiB");
                r->meta_type = h->typeflag;
                r->meta = mfree(r->meta);
                r->meta = malloc(size + 1);
                if (!r->meta)
                        return -ENOMEM;
                r->meta_len = 0;
                r->left = size;
                r->meta_pad = (BLOCK - size % BLOCK) % BLOCK;
                r->state = size > 0 ? STATE_META : STATE_HEADER;
                if (size == 0) {
                        r->meta[0] = 0;
                        /* an empty extended header changes nothing */
                }
                return 0;
        default:
                break;
        }

        if (r->next_path)
                path = TAKE_PTR(r->next_path);
        else if (posix && h->prefix[0]) {
                if (asprintf(
                            &path,
                            "%.*s/%.*s",
                            (int) strnlen(h->prefix, sizeof(h->prefix)),
                            h->prefix,
                            (int) strnlen(h->name, sizeof(h->name)),
                            h->name) < 0)
                        return -ENOMEM;
        } else {
                path = strndup(h->name, sizeof(h->name));
                if (!path)
                        return -ENOMEM;
        }
        if (r->next_has_size)
                size = r->next_size;
        if (r->next_has_mtime)
                mtime = (uint64_t) r->next_mtime;
        forget_next(r);

        if (++r->entries > OCI_TAR_ENTRIES_MAX)
                return fail(r, -E2BIG, reterr, "the archive has more than 100000 entries");

        switch (h->typeflag) {
        case '0':
        case '\0':
        case '7':
        case '5': {
                OciTarEntry e = {
                        .path = path,
                        .type = h->typeflag == '5' ? OCI_TAR_DIRECTORY : OCI_TAR_FILE,
                        .size = h->typeflag == '5' ? 0 : size,
                        .mode = (uint32_t) (mode & 07777),
                        .mtime = (int64_t) mtime,
                };
                if (h->typeflag == '5' && path[0] && path[strlen(path) - 1] == '/')
                        path[strlen(path) - 1] = 0;
                k = r->cb->entry(&e, r->userdata, reterr);
                if (k < 0) {
                        r->error = k;
                        return k;
                }
                r->left = size;
                r->meta_pad = (BLOCK - size % BLOCK) % BLOCK;
                if (h->typeflag == '5')
                        r->state = size > 0 ? STATE_SKIP : STATE_HEADER;
                else if (size > 0)
                        r->state = STATE_DATA;
                else {
                        k = r->cb->entry_end(r->userdata, reterr);
                        if (k < 0) {
                                r->error = k;
                                return k;
                        }
                        r->state = STATE_HEADER;
                }
                return 0;
        }
        case '1':
                return fail(
                        r,
                        -EMEDIUMTYPE,
                        reterr,
                        "'%.300s' is a hard link: only files and directories are accepted",
                        path);
        case '2':
                return fail(
                        r,
                        -EMEDIUMTYPE,
                        reterr,
                        "'%.300s' is a symlink: only files and directories are accepted",
                        path);
        case '3':
        case '4':
        case '6':
                return fail(
                        r,
                        -EMEDIUMTYPE,
                        reterr,
                        "'%.300s' is a device or FIFO: only files and directories are accepted",
                        path);
        default:
                return fail(r, -EMEDIUMTYPE, reterr, "'%.300s' has an entry type that is not accepted", path);
        }
}

static int meta_done(OciTarReader *r, ApiError *reterr) {
        r->meta[r->meta_len] = 0;
        switch (r->meta_type) {
        case 'x':
                return apply_pax(r, false, reterr);
        case 'g':
                return apply_pax(r, true, reterr);
        case 'L': {
                size_t n = strnlen(r->meta, r->meta_len);
                if (n == 0 || n > OCI_TAR_PATH_MAX)
                        return fail(r, -EBADMSG, reterr, "a GNU long name is empty or too long");
                free(r->next_path);
                r->next_path = strndup(r->meta, n);
                return r->next_path ? 0 : -ENOMEM;
        }
        default: /* 'K': the long target of a link, which is refused when it comes */
                return 0;
        }
}

int oci_tar_reader_feed(OciTarReader *r, const void *p, size_t n, ApiError *reterr) {
        const unsigned char *c = p;
        int k;

        assert_return(r, -EINVAL);
        assert_return(p || n == 0, -EINVAL);

        if (r->error < 0)
                return api_error_set(reterr, r->error, API_ERROR_INTERNAL, "the archive was already refused");

        while (n > 0) {
                size_t take;

                switch (r->state) {
                case STATE_HEADER:
                        take = MIN(n, (size_t) BLOCK - r->fill);
                        memcpy(r->block + r->fill, c, take);
                        r->fill += take;
                        if (r->fill == BLOCK) {
                                r->fill = 0;
                                k = process_header(r, reterr);
                                if (k < 0) {
                                        r->error = k;
                                        return k;
                                }
                        }
                        break;
                case STATE_DATA:
                        take = (size_t) MIN((uint64_t) n, r->left);
                        k = r->cb->data(c, take, r->userdata, reterr);
                        if (k < 0) {
                                r->error = k;
                                return k;
                        }
                        r->left -= take;
                        if (r->left == 0) {
                                k = r->cb->entry_end(r->userdata, reterr);
                                if (k < 0) {
                                        r->error = k;
                                        return k;
                                }
                                r->left = r->meta_pad;
                                r->state = r->left > 0 ? STATE_PAD : STATE_HEADER;
                        }
                        break;
                case STATE_SKIP:
                case STATE_PAD:
                        take = (size_t) MIN((uint64_t) n, r->left);
                        r->left -= take;
                        if (r->left == 0) {
                                if (r->state == STATE_SKIP && r->meta_pad > 0) {
                                        r->left = r->meta_pad;
                                        r->meta_pad = 0;
                                        r->state = STATE_PAD;
                                } else
                                        r->state = STATE_HEADER;
                        }
                        break;
                case STATE_META:
                        take = (size_t) MIN((uint64_t) n, r->left);
                        memcpy(r->meta + r->meta_len, c, take);
                        r->meta_len += take;
                        r->left -= take;
                        if (r->left == 0) {
                                k = meta_done(r, reterr);
                                if (k < 0) {
                                        r->error = k;
                                        return k;
                                }
                                r->left = r->meta_pad;
                                r->meta_pad = 0;
                                r->state = r->left > 0 ? STATE_PAD : STATE_HEADER;
                        }
                        break;
                case STATE_END:
                default:
                        take = n;
                        break;
                }
                c += take;
                n -= take;
        }
        return 0;
}

int oci_tar_reader_finish(OciTarReader *r, ApiError *reterr) {
        assert_return(r, -EINVAL);

        if (r->error < 0)
                return api_error_set(reterr, r->error, API_ERROR_INTERNAL, "the archive was already refused");
        /* one zero block at the very end is what some writers leave; treat it as the end too */
        if (r->state == STATE_END || (r->state == STATE_HEADER && r->fill == 0 && r->zero_blocks == 1))
                return 0;
        r->error = -EBADMSG;
        return api_error_set(
                reterr, -EBADMSG, API_ERROR_INTERNAL, "the archive is cut short (no end-of-archive marker)");
}

/* ---- gunzip ---- */

struct OciGunzip {
        z_stream z;
        bool init, ended;
        unsigned char *out;
        OciGunzipSink sink;
        void *userdata;
        uint64_t total_out;
};

int oci_gunzip_new(OciGunzip **ret, OciGunzipSink sink, void *userdata) {
        _cleanup_(oci_gunzip_freep) OciGunzip *g = NULL;

        assert_return(ret, -EINVAL);
        assert_return(sink, -EINVAL);

        g = calloc(1, sizeof(*g));
        if (!g)
                return -ENOMEM;
        g->sink = sink;
        g->userdata = userdata;
        g->out = malloc(ZBUF);
        if (!g->out)
                return -ENOMEM;
        if (inflateInit2(&g->z, 15 + 16) != Z_OK)
                return -ENOMEM;
        g->init = true;
        *ret = TAKE_PTR(g);
        return 0;
}

OciGunzip *oci_gunzip_free(OciGunzip *g) {
        if (!g)
                return NULL;
        if (g->init)
                (void) inflateEnd(&g->z);
        free(g->out);
        return mfree(g);
}

uint64_t oci_gunzip_total_out(const OciGunzip *g) {
        return g ? g->total_out : 0;
}

int oci_gunzip_feed(OciGunzip *g, const void *p, size_t n, ApiError *reterr) {
        assert_return(g, -EINVAL);
        assert_return(p || n == 0, -EINVAL);

        g->z.next_in = (Bytef *) p;
        while (n > 0) {
                size_t chunk = MIN(n, (size_t) 1 << 30);

                g->z.next_in = (Bytef *) p;
                g->z.avail_in = (uInt) chunk;
                while (g->z.avail_in > 0) {
                        int z, r;

                        if (g->ended) {
                                /* another member may follow the one that ended */
                                if (inflateReset(&g->z) != Z_OK)
                                        return -EIO;
                                g->ended = false;
                        }
                        g->z.next_out = g->out;
                        g->z.avail_out = (uInt) ZBUF;
                        z = inflate(&g->z, Z_NO_FLUSH);
                        if (z != Z_OK && z != Z_STREAM_END && !(z == Z_BUF_ERROR && g->z.avail_in == 0))
                                return api_error_set(
                                        reterr,
                                        -EBADMSG,
                                        API_ERROR_INTERNAL,
                                        "the gzip stream is corrupt: %s",
                                        g->z.msg ?: "inflate failed");
                        if (ZBUF - g->z.avail_out > 0) {
                                g->total_out += ZBUF - g->z.avail_out;
                                r = g->sink(g->out, ZBUF - g->z.avail_out, g->userdata, reterr);
                                if (r < 0)
                                        return r;
                        }
                        if (z == Z_STREAM_END)
                                g->ended = true;
                }
                p = (const char *) p + chunk;
                n -= chunk;
        }
        return 0;
}

int oci_gunzip_finish(OciGunzip *g, ApiError *reterr) {
        assert_return(g, -EINVAL);

        if (!g->ended)
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "the gzip stream is cut short");
        return 0;
}

/* ---- paths and files ---- */

int oci_tar_path_normalize(const char *path, char **ret) {
        _cleanup_free_ char *out = NULL;
        size_t len = 0;

        assert_return(path, -EINVAL);
        assert_return(ret, -EINVAL);

        if (path[0] == '/' || strlen(path) > OCI_TAR_PATH_MAX)
                return -EINVAL;
        out = malloc(strlen(path) + 1);
        if (!out)
                return -ENOMEM;
        for (const char *p = path; *p;) {
                size_t n = strcspn(p, "/");

                if (n == 2 && strneq(p, "..", 2))
                        return -EINVAL;
                if (n > 0 && !(n == 1 && p[0] == '.')) {
                        for (size_t i = 0; i < n; i++)
                                if ((unsigned char) p[i] < 0x20 || p[i] == 0x7f || p[i] == '\\')
                                        return -EINVAL;
                        if (len > 0)
                                out[len++] = '/';
                        memcpy(out + len, p, n);
                        len += n;
                }
                p += n;
                p += strspn(p, "/");
        }
        if (len == 0)
                return -EINVAL;
        out[len] = 0;
        *ret = TAKE_PTR(out);
        return 0;
}

static bool is_zero(const unsigned char *p, size_t n) {
        return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

int oci_sparse_write(int fd, const void *buf, size_t n, uint64_t *offset) {
        const unsigned char *p = buf, *run = NULL;
        uint64_t off = *offset, run_off = 0;
        size_t run_len = 0;

        while (n > 0) {
                size_t piece = MIN(n, (size_t) (SPARSE_BLOCK - off % SPARSE_BLOCK));
                bool hole = piece == SPARSE_BLOCK && is_zero(p, piece);

                if (!hole) {
                        if (!run) {
                                run = p;
                                run_off = off;
                        }
                        run_len += piece;
                }
                if ((hole || piece == n) && run) {
                        while (run_len > 0) {
                                ssize_t w = pwrite(fd, run, run_len, (off_t) run_off);
                                if (w < 0 && errno == EINTR)
                                        continue;
                                if (w < 0)
                                        return -errno;
                                run += w;
                                run_off += (uint64_t) w;
                                run_len -= (size_t) w;
                        }
                        run = NULL;
                }
                p += piece;
                off += piece;
                n -= piece;
        }
        *offset = off;
        return 0;
}

/* ---- extraction ---- */

void oci_tar_extract_init(OciTarExtract *x, int rootfd, const char *prefix, uint64_t max_bytes) {
        *x = (OciTarExtract){ .rootfd = rootfd, .prefix = prefix, .max_bytes = max_bytes, .fd = -EBADF };
}

void oci_tar_extract_done(OciTarExtract *x) {
        if (!x)
                return;
        x->fd = safe_close(x->fd);
        x->path = mfree(x->path);
}

/* Opens (creating what is missing, as 0755 directories) the directory that holds the last
 * component of path, below rootfd, never following a symlink. Returns the fd, and in *ret_last the
 * last component (borrowed from path). */
static int open_parent(int rootfd, char *path, const char **ret_last) {
        _cleanup_close_ int fd = fcntl(rootfd, F_DUPFD_CLOEXEC, 3);
        char *p = path, *slash;

        if (fd < 0)
                return -errno;
        while ((slash = strchr(p, '/'))) {
                int sub;

                *slash = 0;
                if (mkdirat(fd, p, 0755) < 0 && errno != EEXIST) {
                        *slash = '/';
                        return -errno;
                }
                sub = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                *slash = '/';
                if (sub < 0)
                        return -errno;
                safe_close(fd);
                fd = sub;
                p = slash + 1;
        }
        *ret_last = p;
        return TAKE_FD(fd);
}

static int extract_entry(const OciTarEntry *e, void *userdata, ApiError *reterr) {
        OciTarExtract *x = userdata;
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int dfd = -EBADF;
        const char *last, *below;
        int r;

        r = oci_tar_path_normalize(e->path, &path);
        if (r < 0)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the archive entry '%.300s' is not a safe relative path",
                        e->path);
        below = startswith(path, x->prefix);
        if (!below || (*below != 0 && *below != '/'))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the archive entry '%.300s' is outside '%s'",
                        path,
                        x->prefix);
        if (*below == 0 && e->type != OCI_TAR_DIRECTORY)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the archive entry '%s' is a file, but the layer is a directory",
                        path);
        x->entries++;

        dfd = open_parent(x->rootfd, path, &last);
        if (dfd < 0)
                return api_error_set(
                        reterr, dfd, API_ERROR_INTERNAL, "cannot create the directories of '%s': %m", path);

        if (e->type == OCI_TAR_DIRECTORY) {
                struct stat st;

                if (mkdirat(dfd, last, 0755) < 0) {
                        if (errno != EEXIST)
                                return api_error_set(
                                        reterr, -errno, API_ERROR_INTERNAL, "cannot create '%s': %m", path);
                        if (fstatat(dfd, last, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
                                return api_error_set(
                                        reterr,
                                        -EEXIST,
                                        API_ERROR_INTERNAL,
                                        "the archive has '%s' twice, as a file and as a directory",
                                        path);
                }
                return 0;
        }

        if (x->bytes + e->size > x->max_bytes || x->bytes + e->size < x->bytes)
                return api_error_set(
                        reterr,
                        -EFBIG,
                        API_ERROR_INTERNAL,
                        "the archive unpacks to more than %" PRIu64 " bytes",
                        x->max_bytes);
        x->fd = openat(
                dfd, last, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (e->mode & 0111) ? 0755 : 0644);
        if (x->fd < 0)
                return api_error_set(
                        reterr,
                        -errno,
                        API_ERROR_INTERNAL,
                        errno == EEXIST ? "the archive has '%s' twice" : "cannot create '%s': %m",
                        path);
        x->path = TAKE_PTR(path);
        x->offset = 0;
        x->size = e->size;
        x->mtime = e->mtime;
        x->bytes += e->size;
        return 0;
}

static int extract_data(const void *p, size_t n, void *userdata, ApiError *reterr) {
        OciTarExtract *x = userdata;
        int r;

        if (x->fd < 0)
                return -EBADF;
        r = oci_sparse_write(x->fd, p, n, &x->offset);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot write '%s': %m", x->path);
        return 0;
}

static int extract_entry_end(void *userdata, ApiError *reterr) {
        OciTarExtract *x = userdata;
        struct timespec ts[2];

        if (x->fd < 0)
                return -EBADF;
        if (ftruncate(x->fd, (off_t) x->size) < 0)
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot write '%s': %m", x->path);
        ts[0] = ts[1] = (struct timespec){ .tv_sec = x->mtime };
        (void) futimens(x->fd, ts);
        x->fd = safe_close(x->fd);
        x->path = mfree(x->path);
        return 0;
}

const OciTarCallbacks oci_tar_extract_callbacks = {
        .entry = extract_entry,
        .data = extract_data,
        .entry_end = extract_entry_end,
};

int oci_tar_extract_finish(OciTarExtract *x, ApiError *reterr) {
        _cleanup_free_ char *copy = NULL;
        _cleanup_close_ int dfd = -EBADF;
        const char *last;

        assert_return(x, -EINVAL);

        if (x->fd >= 0)
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "the archive ends inside '%s'", x->path);
        copy = strdup(x->prefix);
        if (!copy)
                return -ENOMEM;
        dfd = open_parent(x->rootfd, copy, &last);
        if (dfd < 0 || (mkdirat(dfd, last, 0755) < 0 && errno != EEXIST))
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot create '%s': %m", x->prefix);
        return 0;
}
