/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "archive-util.h"
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
        *x = (OciTarExtract){ .rootfd = rootfd, .prefix = prefix, .max_bytes = max_bytes };
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

/* What libarchive reports when it stops, in our words, with libarchive's for the detail. Its reader
 * cannot tell a first header without the ustar magic from one with a bad checksum: both are "not a
 * tar archive" to its format detection. Warnings count as errors: on untrusted input a record
 * libarchive chose to ignore is a record nobody checked. */
static int archive_refused(struct archive *a, ApiError *reterr) {
        static const struct {
                const char *libarchive, *ours;
        } table[] = {
                { "Truncated", "the archive is cut short" },
                { "Unrecognized archive format",
                  "not a ustar archive: the first header has no ustar magic or a checksum that does not match" },
                { "Damaged tar archive", "a header is damaged: its checksum does not match" },
                { "malformed pax", "a pax header record is malformed" },
        };
        const char *why = archive_error_string(a) ?: "unknown error", *ours = "the archive is malformed";

        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (strstr(why, table[i].libarchive)) {
                        ours = table[i].ours;
                        break;
                }
        return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "%s (libarchive: %s)", ours, why);
}

/* Only regular files and directories are unpacked; what else an entry may be is refused with its
 * name. libarchive reads GNU sparse files as regular files with a map: those are refused too. */
static int entry_type_check(struct archive_entry *e, const char *name, ApiError *reterr) {
        mode_t type = archive_entry_filetype(e);
        const char *what;

        /* libarchive gives a hard link of size 0 no file type at all, and no link name when the
         * header has none */
        if (archive_entry_hardlink(e) || type == 0)
                what = "is a hard link: only files and directories are accepted";
        else if (type == AE_IFLNK)
                what = "is a symlink: only files and directories are accepted";
        else if (IN_SET(type, AE_IFCHR, AE_IFBLK, AE_IFIFO))
                what = "is a device or FIFO: only files and directories are accepted";
        else if ((type == AE_IFREG && archive_entry_sparse_count(e) == 0) || type == AE_IFDIR)
                return 0;
        else
                what = "has an entry type that is not accepted";
        return api_error_set(reterr, -EMEDIUMTYPE, API_ERROR_INTERNAL, "'%.300s' %s", name, what);
}

static int extract_file_data(struct archive *a, int fd, const char *path, ApiError *reterr) {
        for (;;) {
                const void *buf;
                size_t n;
                la_int64_t offset;
                uint64_t at;
                int r;

                r = archive_read_data_block(a, &buf, &n, &offset);
                if (r == ARCHIVE_EOF)
                        return 0;
                if (r != ARCHIVE_OK)
                        return archive_refused(a, reterr);
                if (offset < 0)
                        return api_error_set(
                                reterr,
                                -EBADMSG,
                                API_ERROR_INTERNAL,
                                "the archive has data of '%s' at a negative offset",
                                path);
                at = (uint64_t) offset;
                r = oci_sparse_write(fd, buf, n, &at);
                if (r < 0)
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot write '%s': %m", path);
        }
}

static int extract_entry(OciTarExtract *x, struct archive *a, struct archive_entry *e, ApiError *reterr) {
        const char *name = archive_entry_pathname(e) ?: "";
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int dfd = -EBADF, fd = -EBADF;
        struct timespec ts[2];
        const char *last, *below;
        la_int64_t size = archive_entry_size(e);
        bool dir = archive_entry_filetype(e) == AE_IFDIR;
        int r;

        r = entry_type_check(e, name, reterr);
        if (r < 0)
                return r;
        r = oci_tar_path_normalize(name, &path);
        if (r < 0)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the archive entry '%.300s' is not a safe relative path",
                        name);
        below = startswith(path, x->prefix);
        if (!below || (*below != 0 && *below != '/'))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the archive entry '%.300s' is outside '%s'",
                        path,
                        x->prefix);
        if (*below == 0 && !dir)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the archive entry '%s' is a file, but the layer is a directory",
                        path);

        dfd = open_parent(x->rootfd, path, &last);
        if (dfd < 0)
                return api_error_set(
                        reterr, dfd, API_ERROR_INTERNAL, "cannot create the directories of '%s': %m", path);

        if (dir) {
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

        if (size < 0 || x->bytes + (uint64_t) size > x->max_bytes || x->bytes + (uint64_t) size < x->bytes)
                return api_error_set(
                        reterr,
                        -EFBIG,
                        API_ERROR_INTERNAL,
                        "the archive unpacks to more than %" PRIu64 " bytes",
                        x->max_bytes);
        fd = openat(
                dfd,
                last,
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                (archive_entry_perm(e) & 0111) ? 0755 : 0644);
        if (fd < 0)
                return api_error_set(
                        reterr,
                        -errno,
                        API_ERROR_INTERNAL,
                        errno == EEXIST ? "the archive has '%s' twice" : "cannot create '%s': %m",
                        path);
        x->bytes += (uint64_t) size;
        r = extract_file_data(a, fd, path, reterr);
        if (r < 0)
                return r;
        if (ftruncate(fd, (off_t) size) < 0)
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot write '%s': %m", path);
        ts[0] = ts[1] = (struct timespec){ .tv_sec = archive_entry_mtime(e) };
        (void) futimens(fd, ts);
        return 0;
}

/* After the entries: the prefix directory exists (made when the archive had no entry for it). */
static int extract_prefix(OciTarExtract *x, ApiError *reterr) {
        _cleanup_free_ char *copy = NULL;
        _cleanup_close_ int dfd = -EBADF;
        const char *last;

        copy = strdup(x->prefix);
        if (!copy)
                return -ENOMEM;
        dfd = open_parent(x->rootfd, copy, &last);
        if (dfd < 0 || (mkdirat(dfd, last, 0755) < 0 && errno != EEXIST))
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot create '%s': %m", x->prefix);
        return 0;
}

static int extract_archive(OciTarExtract *x, int fd, bool gzip, uint64_t tar_size, ApiError *reterr) {
        _cleanup_(archive_read_freep) struct archive *a = NULL;
        struct archive_entry *e;
        uint64_t entries_end = 0, end;
        int r;

        a = archive_read_new();
        if (!a)
                return -ENOMEM;
        /* tar alone (ustar, pax and GNU; the old magic-less form is refused below), and gzip only
         * when asked: a plain tar that happens to look compressed is not decompressed */
        if (archive_read_support_format_tar(a) != ARCHIVE_OK ||
            (gzip ? archive_read_support_filter_gzip(a) : archive_read_support_filter_none(a)) != ARCHIVE_OK)
                return api_error_set(
                        reterr,
                        -ENOMEM,
                        API_ERROR_INTERNAL,
                        "cannot set up libarchive: %s",
                        archive_error_string(a));
        if (archive_read_open_fd(a, fd, 64 << 10) != ARCHIVE_OK)
                return archive_refused(a, reterr);

        for (;;) {
                r = archive_read_next_header(a, &e);
                if (r == ARCHIVE_EOF)
                        break;
                if (r != ARCHIVE_OK)
                        return archive_refused(a, reterr);
                if (archive_format(a) == ARCHIVE_FORMAT_TAR)
                        return api_error_set(
                                reterr,
                                -EBADMSG,
                                API_ERROR_INTERNAL,
                                "not a ustar archive (a header without the ustar magic)");
                if (++x->entries > OCI_TAR_ENTRIES_MAX)
                        return api_error_set(
                                reterr, -E2BIG, API_ERROR_INTERNAL, "the archive has more than 100000 entries");
                r = extract_entry(x, a, e, reterr);
                if (r < 0)
                        return r;
                /* the rest of a directory's data, and the padding of a file's */
                if (archive_read_data_skip(a) != ARCHIVE_OK)
                        return archive_refused(a, reterr);
                entries_end = (uint64_t) archive_filter_bytes(a, 0);
        }

        /* libarchive takes the end of the input for the end of the archive, and a single zero block
         * followed by anything for the end-of-archive marker. We want the marker, and after one zero
         * block nothing more (past two, the rest is padding that writers leave and is ignored). */
        end = (uint64_t) archive_filter_bytes(a, 0);
        if (end <= entries_end)
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "the archive is cut short (no end-of-archive marker)");
        if (end - entries_end < 2 * BLOCK && end < tar_size)
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "the archive goes on after a lone zero block");
        return extract_prefix(x, reterr);
}

int oci_tar_extract(OciTarExtract *x, int fd, bool gzip, uint64_t tar_size, ApiError *reterr) {
        locale_t utf8, old = (locale_t) 0;
        int r;

        assert_return(x, -EINVAL);
        assert_return(fd >= 0, -EINVAL);

        /* libarchive converts a pax path (UTF-8 by definition) to the charset of the current
         * locale, and in the C locale a program starts in, every non-ASCII name fails to convert.
         * Names are bytes to us: this thread reads the archive in C.UTF-8, where the conversion is
         * none, and the process's locale stays as it is. */
        utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t) 0);
        if (utf8)
                old = uselocale(utf8);
        r = extract_archive(x, fd, gzip, tar_size, reterr);
        if (utf8) {
                (void) uselocale(old);
                freelocale(utf8);
        }
        return r;
}
