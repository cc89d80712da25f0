/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "fuzz.h"
#include "oci-tar.h"

/* A tree layer as a registry sends it: the first byte picks gzip (odd) or a plain tar (even) and
 * the size of the pieces the gunzip gets; the rest is written to a memfd, gunzipped (which measures
 * the tar, as a pull does while it downloads), and unpacked by libarchive and the extractor into a
 * fresh directory, with the prefix "t" and a budget of 1 MiB. Whatever the input, nothing may
 * appear outside that directory (checked through a sibling that must stay empty). */

static char *base;

static void cleanup(void) {
        if (base)
                (void) rm_rf(base);
        free(base);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        base = strdup("/tmp/fuzz-oci-tar-XXXXXX");
        if (!base || !mkdtemp(base))
                abort();
        atexit(cleanup);
        return 0;
}

static int count(const void *p, size_t n, void *userdata, ApiError *reterr) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(oci_gunzip_freep) OciGunzip *g = NULL;
        _cleanup_free_ char *root = NULL, *sibling = NULL;
        _cleanup_close_ int fd = -EBADF, mfd = -EBADF;
        OciTarExtract x;
        uint64_t tar_size;
        size_t step;
        bool gz;
        int k = 0;

        if (size < 1)
                return 0;
        gz = data[0] & 1;
        step = 1 + (data[0] >> 1) * 37;
        data++;
        size--;

        if (asprintf(&root, "%s/root", base) < 0 || asprintf(&sibling, "%s/sibling", base) < 0)
                abort();
        (void) rm_rf(root);
        (void) rm_rf(sibling);
        if (mkdir(root, 0755) < 0 || mkdir(sibling, 0755) < 0)
                abort();
        fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        mfd = memfd_create("fuzz-oci-tar", MFD_CLOEXEC);
        if (fd < 0 || mfd < 0 || loop_write(mfd, data, size) < 0 || lseek(mfd, 0, SEEK_SET) < 0)
                abort();

        tar_size = size;
        if (gz) {
                if (oci_gunzip_new(&g, count, NULL) < 0)
                        abort();
                for (size_t i = 0; i < size && k >= 0; i += step)
                        k = oci_gunzip_feed(g, data + i, step < size - i ? step : size - i, NULL);
                if (k >= 0)
                        k = oci_gunzip_finish(g, NULL);
                tar_size = oci_gunzip_total_out(g);
        }
        oci_tar_extract_init(&x, fd, "t", 1 << 20);
        if (k >= 0)
                (void) oci_tar_extract(&x, mfd, gz, tar_size, NULL);

        /* nothing escaped: the root holds at most "t", and the sibling nothing */
        {
                _cleanup_(closedirp) DIR *d = opendir(sibling);
                struct dirent *de;
                while (d && (de = readdir(d)))
                        if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                                abort();
        }
        {
                _cleanup_(closedirp) DIR *d = opendir(root);
                struct dirent *de;
                while (d && (de = readdir(d)))
                        if (!streq(de->d_name, ".") && !streq(de->d_name, "..") && !streq(de->d_name, "t"))
                                abort();
        }
        return 0;
}
