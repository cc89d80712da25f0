/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "oci-digest.h"
#include "oci-tar.h"

static char *workdir;

static int setup(void **state) {
        workdir = strdup("/tmp/test-oci-tar-XXXXXX");
        assert_non_null(mkdtemp(workdir));
        return 0;
}

static int teardown(void **state) {
        (void) rm_rf(workdir);
        workdir = mfree(workdir);
        return 0;
}

static char *at(const char *rel) {
        char *p;
        assert_true(asprintf(&p, "%s/%s", workdir, rel) >= 0);
        return p;
}

static void put_file(const char *rel, const void *data, size_t n, mode_t mode) {
        _cleanup_free_ char *p = at(rel);
        _cleanup_close_ int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

        assert_true(fd >= 0);
        assert_ok(loop_write(fd, data, n));
        assert_ok(fchmod(fd, mode));
}

static void put_dir(const char *rel) {
        _cleanup_free_ char *p = at(rel);
        assert_ok(mkdir_p(p, 0755));
}

typedef struct Buf {
        char *data;
        size_t len;
} Buf;

static int buf_sink(const void *p, size_t n, void *userdata) {
        Buf *b = userdata;
        char *d = realloc(b->data, b->len + n + 1);

        if (!d)
                return -ENOMEM;
        memcpy(d + b->len, p, n);
        b->data = d;
        b->len += n;
        return 0;
}

static int buf_gz_sink(const void *p, size_t n, void *userdata, ApiError *reterr) {
        return buf_sink(p, n, userdata);
}

/* ---- archives by hand ---- */

typedef struct HeaderSpec {
        const char *name, *prefix, *magic, *version;
        char type;
        uint64_t size;
        bool base256_size, bad_checksum, sparse_map;
} HeaderSpec;

static void header(Buf *b, const HeaderSpec *h) {
        unsigned char blk[512] = {};
        unsigned sum = 0;

        memcpy(blk, h->name, MIN(strlen(h->name), (size_t) 100));
        snprintf((char *) blk + 100, 8, "%07o", 0644);
        snprintf((char *) blk + 108, 8, "%07o", 0);
        snprintf((char *) blk + 116, 8, "%07o", 0);
        if (h->base256_size) {
                blk[124] = 0x80;
                for (int i = 0; i < 8; i++)
                        blk[135 - i] = (unsigned char) (h->size >> (8 * i));
        } else
                snprintf((char *) blk + 124, 12, "%011llo", (unsigned long long) h->size);
        snprintf((char *) blk + 136, 12, "%011o", 1700000000);
        blk[156] = (unsigned char) h->type;
        memcpy(blk + 257, h->magic ?: "ustar", 6);
        memcpy(blk + 263, h->version ?: "00", 2);
        if (h->prefix)
                memcpy(blk + 345, h->prefix, strlen(h->prefix));
        if (h->sparse_map) {
                /* GNU's old sparse header: one piece of 1 byte at offset 0, and the real size */
                snprintf((char *) blk + 386, 12, "%011o", 0);
                snprintf((char *) blk + 398, 12, "%011o", 1);
                snprintf((char *) blk + 483, 12, "%011o", 4096);
        }
        memset(blk + 148, ' ', 8);
        for (int i = 0; i < 512; i++)
                sum += blk[i];
        snprintf((char *) blk + 148, 8, "%06o", sum + (h->bad_checksum ? 1 : 0));
        blk[155] = ' ';
        assert_ok(buf_sink(blk, 512, b));
}

static void data(Buf *b, const void *p, size_t n) {
        static const char zeros[512];
        assert_ok(buf_sink(p, n, b));
        if (n % 512)
                assert_ok(buf_sink(zeros, 512 - n % 512, b));
}

static void end(Buf *b) {
        static const char zeros[1024];
        assert_ok(buf_sink(zeros, sizeof(zeros), b));
}

static void file_entry(Buf *b, const char *name, const char *content) {
        header(b, &(HeaderSpec){ .name = name, .type = '0', .size = strlen(content) });
        data(b, content, strlen(content));
}

static int count_sink(const void *p, size_t n, void *userdata, ApiError *reterr) {
        return 0;
}

/* A memfd holding b, at offset 0. */
static int memfd_of(const Buf *b) {
        int fd = memfd_create("test-oci-tar", MFD_CLOEXEC);

        assert_true(fd >= 0);
        assert_ok(loop_write(fd, b->data, b->len));
        assert_ok(lseek(fd, 0, SEEK_SET));
        return fd;
}

/* Extracts a plain tar (or tar.gz) into workdir/out under prefix, the way a pull does: a tar.gz is
 * gunzipped first (in pieces of step bytes) to measure the tar, then unpacked from a file. */
static int extract(const Buf *b, bool gz, const char *prefix, size_t step, uint64_t max, char **ret_message) {
        _cleanup_(oci_gunzip_freep) OciGunzip *g = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *out = at("out");
        _cleanup_close_ int fd = -EBADF, mfd = memfd_of(b);
        uint64_t tar_size = b->len;
        OciTarExtract x;
        int k = 0;

        (void) rm_rf(out);
        assert_ok(mkdir(out, 0755));
        fd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(fd >= 0);
        if (gz) {
                assert_ok(oci_gunzip_new(&g, count_sink, NULL));
                for (size_t i = 0; i < b->len && k >= 0; i += step)
                        k = oci_gunzip_feed(g, b->data + i, MIN(step, b->len - i), &e);
                if (k >= 0)
                        k = oci_gunzip_finish(g, &e);
                tar_size = oci_gunzip_total_out(g);
        }
        oci_tar_extract_init(&x, fd, prefix, max);
        if (k >= 0)
                k = oci_tar_extract(&x, mfd, gz, tar_size, &e);
        if (ret_message)
                *ret_message = e.message ? strdup(e.message) : NULL;
        return k;
}

static char *read_out(const char *rel) {
        _cleanup_free_ char *p = NULL;
        char *s = NULL;
        assert_true(asprintf(&p, "%s/out/%s", workdir, rel) >= 0);
        if (read_full_file(p, 1 << 24, &s, NULL) < 0)
                return NULL;
        return s;
}

/* ---- tests ---- */

static void test_pack_and_extract(void **state) {
        _cleanup_free_ char *blob = malloc(100000), *longdir = NULL, *longname = NULL, *got = NULL;
        char tar1[OCI_DIGEST_SHA256_LEN + 1], tar2[OCI_DIGEST_SHA256_LEN + 1], gzd[OCI_DIGEST_SHA256_LEN + 1];
        _cleanup_close_ int root = -EBADF;
        Buf a = {}, b = {};
        struct stat st;

        for (size_t i = 0; i < 100000; i++)
                blob[i] = (char) (i * 7 + i / 1000);
        put_dir("tree/sysupdate/base/sub");
        put_file("tree/sysupdate/base/SHA256SUMS", "abc  x.raw\n", 11, 0644);
        put_file("tree/sysupdate/base/x.raw", blob, 100000, 0644);
        put_file("tree/sysupdate/base/empty", "", 0, 0600);
        put_file("tree/sysupdate/base/sub/tool", "#!/bin/sh\n", 10, 0755);
        /* a name longer than 100 (ustar prefix) and a path longer than 255 (pax) */
        assert_true(asprintf(&longname, "sub/%0120d", 7) >= 0);
        put_file(
                (longdir = NULL, asprintf(&longdir, "tree/sysupdate/base/%s", longname) >= 0 ? longdir : NULL),
                "long",
                4,
                0644);
        free(longdir);
        assert_true(asprintf(&longdir, "tree/sysupdate/base/%0150d/%0150d", 1, 2) >= 0);
        put_dir(longdir);
        free(longdir);
        assert_true(asprintf(&longdir, "tree/sysupdate/base/%0150d/%0150d/f", 1, 2) >= 0);
        put_file(longdir, "deep", 4, 0644);

        {
                _cleanup_free_ char *t = at("tree");
                root = open(t, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        }
        assert_true(root >= 0);
        assert_ok(oci_tar_gz_pack(root, "sysupdate/base", 6, buf_sink, &a, tar1, NULL));
        assert_ok(oci_tar_gz_pack(root, "sysupdate/base", 6, buf_sink, &b, tar2, NULL));
        /* deterministic: the same tree packs to the same bytes */
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.data, b.data, a.len);
        assert_string_equal(tar1, tar2);
        assert_ok(oci_digest_buffer(a.data, a.len, gzd));
        assert_string_not_equal(gzd, tar1);

        /* gunzipped whole, and one byte at a time (every state boundary inside a feed) */
        assert_ok(extract(&a, true, "sysupdate/base", a.len, UINT64_MAX, NULL));
        assert_ok(extract(&a, true, "sysupdate/base", 1, UINT64_MAX, NULL));
        got = read_out("sysupdate/base/x.raw");
        assert_non_null(got);
        assert_memory_equal(got, blob, 100000);
        free(got);
        got = read_out("sysupdate/base/SHA256SUMS");
        assert_string_equal(got, "abc  x.raw\n");
        free(got);
        got = read_out("sysupdate/base/empty");
        assert_string_equal(got, "");
        free(got);
        free(longdir);
        assert_true(asprintf(&longdir, "sysupdate/base/%s", longname) >= 0);
        got = read_out(longdir);
        assert_string_equal(got, "long");
        free(got);
        free(longdir);
        assert_true(asprintf(&longdir, "sysupdate/base/%0150d/%0150d/f", 1, 2) >= 0);
        got = read_out(longdir);
        assert_string_equal(got, "deep");
        free(got);
        got = NULL;
        {
                _cleanup_free_ char *p = at("out/sysupdate/base/sub/tool"),
                                    *q = at("out/sysupdate/base/empty");
                assert_ok(stat(p, &st));
                assert_int_equal(st.st_mode & 07777, 0755);
                assert_ok(stat(q, &st));
                assert_int_equal(st.st_mode & 07777, 0644);
        }
        free(a.data);
        free(b.data);
}

static void test_pack_refuses_symlink(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *link = at("tree/sysupdate/k/evil"), *t = at("tree");
        _cleanup_close_ int root = -EBADF;
        char d[OCI_DIGEST_SHA256_LEN + 1];
        Buf a = {};

        put_dir("tree/sysupdate/k");
        assert_ok(symlink("/etc/passwd", link));
        root = open(t, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_errno(oci_tar_gz_pack(root, "sysupdate/k", 1, buf_sink, &a, d, &e), -EMEDIUMTYPE);
        assert_non_null(strstr(e.message, "sysupdate/k/evil is a symlink"));
        free(a.data);
}

static void expect_refused(const Buf *b, const char *prefix, const char *words) {
        _cleanup_free_ char *msg = NULL;
        int r = extract(b, false, prefix, b->len, UINT64_MAX, &msg);

        if (r >= 0)
                fail_msg("the archive was accepted; expected '%s'", words);
        if (!msg || !strstr(msg, words))
                fail_msg("message '%s' lacks '%s'", msg ?: "(none)", words);
}

static void test_hostile_entries(void **state) {
        static const struct {
                const char *name;
                char type;
                const char *words;
        } cases[] = {
                { "t/../../escape", '0', "not a safe relative path" },
                { "/etc/cron.d/x", '0', "not a safe relative path" },
                { "../t/x", '0', "not a safe relative path" },
                { "other/x", '0', "is outside 't'" },
                { "tx", '0', "is outside 't'" },
                { "t", '0', "is a file, but the layer is a directory" },
                { "t/link", '2', "is a symlink" },
                { "t/hard", '1', "is a hard link" },
                { "t/dev", '3', "device or FIFO" },
                { "t/fifo", '6', "device or FIFO" },
                { "t/a\nb", '0', "not a safe relative path" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                Buf b = {};
                header(&b, &(HeaderSpec){ .name = cases[i].name, .type = cases[i].type });
                end(&b);
                expect_refused(&b, "t", cases[i].words);
                free(b.data);
        }

        /* a GNU sparse file (with its map: libarchive reads an unknown type as a regular file) */
        {
                Buf b = {};
                header(&b,
                       &(HeaderSpec){ .name = "t/sparse",
                                      .type = 'S',
                                      .size = 1,
                                      .magic = "ustar ",
                                      .version = " \0",
                                      .sparse_map = true });
                data(&b, "x", 1);
                end(&b);
                expect_refused(&b, "t", "entry type that is not accepted");
                free(b.data);
        }
}

static void test_malformed(void **state) {
        Buf b = {};

        /* a duplicate file */
        file_entry(&b, "t/x", "1");
        file_entry(&b, "t/x", "2");
        end(&b);
        expect_refused(&b, "t", "has 't/x' twice");
        free(b.data);

        /* a file where a directory was */
        b = (Buf){};
        header(&b, &(HeaderSpec){ .name = "t/d/", .type = '5' });
        file_entry(&b, "t/d", "x");
        end(&b);
        expect_refused(&b, "t", "has 't/d' twice");
        free(b.data);

        /* no end-of-archive marker: cut short */
        b = (Buf){};
        file_entry(&b, "t/x", "1");
        expect_refused(&b, "t", "cut short");
        free(b.data);

        /* cut inside a file's data */
        b = (Buf){};
        header(&b, &(HeaderSpec){ .name = "t/x", .type = '0', .size = 1000 });
        assert_ok(buf_sink("abc", 3, &b));
        expect_refused(&b, "t", "cut short");
        free(b.data);

        /* a lone zero block, then more */
        b = (Buf){};
        {
                static const char zero[512];
                file_entry(&b, "t/x", "1");
                assert_ok(buf_sink(zero, 512, &b));
                file_entry(&b, "t/y", "2");
                end(&b);
        }
        expect_refused(&b, "t", "lone zero block");
        free(b.data);

        /* checksums and magic */
        b = (Buf){};
        header(&b, &(HeaderSpec){ .name = "t/x", .type = '0', .bad_checksum = true });
        end(&b);
        expect_refused(&b, "t", "checksum");
        free(b.data);
        b = (Buf){};
        header(&b, &(HeaderSpec){ .name = "t/x", .type = '0', .magic = "xxxxx" });
        end(&b);
        expect_refused(&b, "t", "ustar magic");
        free(b.data);

        /* a pax header whose record lies about its length */
        b = (Buf){};
        header(&b, &(HeaderSpec){ .name = "pax", .type = 'x', .size = 20 });
        data(&b, "99 path=t/abcdefgh\n", 20);
        file_entry(&b, "t/x", "1");
        end(&b);
        expect_refused(&b, "t", "pax header record");
        free(b.data);

        /* a pax size that is no number */
        b = (Buf){};
        header(&b, &(HeaderSpec){ .name = "pax", .type = 'x', .size = 12 });
        data(&b, "12 size=1x\n", 11);
        file_entry(&b, "t/x", "1");
        end(&b);
        expect_refused(&b, "t", "pax");
        free(b.data);
}

static void test_pax_gnu_base256(void **state) {
        _cleanup_free_ char *got = NULL;
        Buf b = {};

        /* pax path and size override the header */
        header(&b, &(HeaderSpec){ .name = "PaxHeaders/x", .type = 'x', .size = 29 });
        data(&b,
             "16 path=t/paxed\n"
             "13 size=0005\n",
             29);
        header(&b, &(HeaderSpec){ .name = "t/ignored", .type = '0', .size = 999 });
        data(&b, "hello", 5);
        /* a global header is read and forgotten */
        header(&b, &(HeaderSpec){ .name = "g", .type = 'g', .size = 13 });
        data(&b, "13 comment=x\n", 13);
        /* GNU long name, GNU magic */
        header(&b,
               &(HeaderSpec){
                       .name = "././@LongLink", .type = 'L', .size = 8, .magic = "ustar ", .version = " \0" });
        data(&b, "t/gnuln\0", 8);
        header(&b,
               &(HeaderSpec){ .name = "t/short", .type = '0', .size = 3, .magic = "ustar ", .version = " \0" });
        data(&b, "gnu", 3);
        /* a base-256 size */
        header(&b, &(HeaderSpec){ .name = "t/b256", .type = '0', .size = 4, .base256_size = true });
        data(&b, "b256", 4);
        /* ustar prefix + name */
        header(&b, &(HeaderSpec){ .name = "name", .prefix = "t/pre", .type = '0', .size = 1 });
        data(&b, "p", 1);
        end(&b);

        assert_ok(extract(&b, false, "t", 7, UINT64_MAX, NULL));
        got = read_out("t/paxed");
        assert_string_equal(got, "hello");
        free(got);
        got = read_out("t/gnuln");
        assert_string_equal(got, "gnu");
        free(got);
        got = read_out("t/b256");
        assert_string_equal(got, "b256");
        free(got);
        got = read_out("t/pre/name");
        assert_string_equal(got, "p");
        free(b.data);
}

static void test_utf8_names(void **state) {
        _cleanup_free_ char *got = NULL;
        Buf b = {};

        /* a non-ASCII name in a pax path (as Go's archive/tar writes it) and in the header itself,
         * whatever the locale: names are bytes, and are not converted */
        header(&b, &(HeaderSpec){ .name = "PaxHeaders/x", .type = 'x', .size = 16 });
        data(&b, "16 path=t/caf\xc3\xa9\n", 16);
        file_entry(&b, "t/ignored", "pax");
        file_entry(&b, "t/na\xc3\xafve", "ustar");
        end(&b);
        assert_ok(extract(&b, false, "t", b.len, UINT64_MAX, NULL));
        got = read_out("t/caf\xc3\xa9");
        assert_string_equal(got, "pax");
        free(got);
        got = read_out("t/na\xc3\xafve");
        assert_string_equal(got, "ustar");
        free(b.data);
}

static void test_budget(void **state) {
        _cleanup_free_ char *msg = NULL;
        Buf b = {};

        file_entry(&b, "t/a", "0123456789");
        file_entry(&b, "t/b", "0123456789");
        end(&b);
        assert_ok(extract(&b, false, "t", b.len, 20, NULL));
        assert_true(extract(&b, false, "t", b.len, 19, &msg) < 0);
        assert_non_null(strstr(msg, "unpacks to more than 19 bytes"));
        free(b.data);
}

static void test_no_symlink_followed(void **state) {
        /* even a symlink that somebody planted below the root is never followed */
        _cleanup_free_ char *out = at("out2"), *outside = at("outside"), *link = at("out2/t");
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_close_ int fd = -EBADF, mfd = -EBADF;
        OciTarExtract x;
        Buf b = {};

        assert_ok(mkdir(out, 0755));
        assert_ok(mkdir(outside, 0755));
        assert_ok(symlink(outside, link));
        file_entry(&b, "t/x", "1");
        end(&b);
        mfd = memfd_of(&b);
        fd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        oci_tar_extract_init(&x, fd, "t", UINT64_MAX);
        assert_true(oci_tar_extract(&x, mfd, /* gzip= */ false, b.len, &e) < 0);
        {
                _cleanup_free_ char *escaped = at("outside/x");
                assert_true(access(escaped, F_OK) < 0);
        }
        free(b.data);
}

static void test_gunzip(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        unsigned char gz[256];
        uLongf n;
        Buf out = {};
        Buf two = {};
        OciGunzip *g = NULL;

        /* two members back to back are one stream */
        for (int i = 0; i < 2; i++) {
                z_stream z = {};
                assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
                z.next_in = (Bytef *) (i == 0 ? "hello " : "world");
                z.avail_in = i == 0 ? 6 : 5;
                z.next_out = gz;
                z.avail_out = sizeof(gz);
                assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
                n = sizeof(gz) - z.avail_out;
                deflateEnd(&z);
                assert_ok(buf_sink(gz, n, &two));
        }
        assert_ok(oci_gunzip_new(&g, buf_gz_sink, &out));
        assert_ok(oci_gunzip_feed(g, two.data, two.len, NULL));
        assert_ok(oci_gunzip_finish(g, NULL));
        assert_int_equal(out.len, 11);
        assert_memory_equal(out.data, "hello world", 11);
        g = oci_gunzip_free(g);

        /* cut short */
        out.len = 0;
        assert_ok(oci_gunzip_new(&g, buf_gz_sink, &out));
        assert_ok(oci_gunzip_feed(g, two.data, 10, NULL));
        assert_errno(oci_gunzip_finish(g, &e), -EBADMSG);
        g = oci_gunzip_free(g);

        /* garbage after a member */
        assert_ok(oci_gunzip_new(&g, buf_gz_sink, &out));
        assert_ok(buf_sink("garbage!", 8, &two));
        assert_errno(oci_gunzip_feed(g, two.data, two.len, NULL), -EBADMSG);
        g = oci_gunzip_free(g);
        free(out.data);
        free(two.data);
}

static void test_paths(void **state) {
        static const struct {
                const char *in, *out;
        } ok[] = {
                { "a/b", "a/b" },
                { "./a//b/", "a/b" },
                { "a/./b", "a/b" },
                { "a..b/c", "a..b/c" },
        };
        static const char *const bad[] = { "", "/", "/a", "..", "a/..", "a/../b", ".", "./", "a/\x01" };

        for (size_t i = 0; i < ELEMENTSOF(ok); i++) {
                _cleanup_free_ char *s = NULL;
                assert_ok(oci_tar_path_normalize(ok[i].in, &s));
                assert_string_equal(s, ok[i].out);
        }
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                char *s = NULL;
                assert_errno(oci_tar_path_normalize(bad[i], &s), -EINVAL);
                assert_null(s);
        }
}

static void test_sparse(void **state) {
        _cleanup_free_ char *p = at("sparse"), *buf = calloc(1, 1 << 20), *back = NULL;
        _cleanup_close_ int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        uint64_t off = 0;
        struct stat st;

        assert_non_null(buf);
        memcpy(buf + 100, "head", 4);
        memcpy(buf + (1 << 20) - 10, "tail", 4);
        /* odd pieces, so that 4 KiB blocks straddle the calls */
        assert_ok(oci_sparse_write(fd, buf, 5000, &off));
        assert_ok(oci_sparse_write(fd, buf + 5000, (1 << 20) - 5000, &off));
        assert_int_equal(off, 1 << 20);
        assert_ok(ftruncate(fd, 1 << 20));
        assert_ok(fstat(fd, &st));
        assert_true((uint64_t) st.st_blocks * 512 < (1 << 20) / 2);
        assert_ok(read_full_file(p, 1 << 21, &back, NULL));
        assert_memory_equal(back, buf, 1 << 20);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_pack_and_extract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pack_refuses_symlink, setup, teardown),
                cmocka_unit_test_setup_teardown(test_hostile_entries, setup, teardown),
                cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pax_gnu_base256, setup, teardown),
                cmocka_unit_test_setup_teardown(test_utf8_names, setup, teardown),
                cmocka_unit_test_setup_teardown(test_budget, setup, teardown),
                cmocka_unit_test_setup_teardown(test_no_symlink_followed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_gunzip, setup, teardown),
                cmocka_unit_test(test_paths),
                cmocka_unit_test_setup_teardown(test_sparse, setup, teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
