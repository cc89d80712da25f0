/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

#include "api-error.h"
#include "cleanup.h"
#include "fs-util.h"
#include "image-catalog.h"
#include "time-util.h"

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static int setup(void **state) {
        char t[] = "/tmp/test-image-catalog.XXXXXX";

        if (!mkdtemp(t))
                return -1;
        *state = strdup(t);
        return *state ? 0 : -1;
}

static int teardown(void **state) {
        (void) nftw(*state, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(*state);
        return 0;
}

static char *join(const char *dir, const char *name) {
        char *p;

        if (asprintf(&p, "%s/%s", dir, name) < 0)
                return NULL;
        return p;
}

static void put(const char *dir, const char *name, const char *content) {
        _cleanup_free_ char *p = join(dir, name);
        _cleanup_close_ int fd = -EBADF;

        assert_non_null(p);
        fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        assert_ok(loop_write(fd, content, strlen(content)));
}

static void put_dir(const char *dir, const char *name) {
        _cleanup_free_ char *p = join(dir, name);

        assert_non_null(p);
        assert_ok(mkdir_p(p, 0755));
}

/* Drops <stem>.efi and <stem>.raw into dir. */
static void put_image(const char *dir, const char *stem) {
        _cleanup_free_ char *efi = NULL, *raw = NULL;

        assert_true(asprintf(&efi, "%s.efi", stem) >= 0);
        assert_true(asprintf(&raw, "%s.raw", stem) >= 0);
        put(dir, efi, "uki");
        put(dir, raw, "disk");
}

static void rm(const char *dir, const char *name) {
        _cleanup_free_ char *p = join(dir, name);

        assert_ok(RET_NERRNO(unlink(p)));
}

static ImageCatalog *catalog_open(const char *dir) {
        ImageCatalog *c = NULL;
        ApiError e = API_ERROR_NULL;

        assert_ok(image_catalog_new(&c, /* event= */ NULL, dir, &e));
        assert_false(api_error_is_set(&e));
        assert_non_null(c);
        return c;
}

/* "id_version id_version …" in list order, for compact assertions. */
static char *catalog_refs(ImageCatalog *c) {
        char *s = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&s, &n);

        assert_non_null(f);
        for (size_t i = 0; i < image_catalog_size(c); i++)
                fprintf(f, "%s%s", i > 0 ? " " : "", image_catalog_at(c, i)->ref);
        assert_int_equal(fclose(f), 0);
        return s;
}

static void assert_refs(ImageCatalog *c, const char *expected) {
        _cleanup_free_ char *s = catalog_refs(c);

        assert_string_equal(s, expected);
}

static char *dump(const json_t *v) {
        char *s = json_dumps(v, JSON_COMPACT);

        assert_non_null(s);
        return s;
}

/* sign(a ⋚ b), checked both ways round. */
static int vcmp(const char *a, const char *b) {
        int r = image_version_compare(a, b), q = image_version_compare(b, a);

        r = (r > 0) - (r < 0);
        q = (q > 0) - (q < 0);
        assert_int_equal(r, -q);
        return r;
}

static void test_version_compare(void **state) {
        /* The cases of the reference. */
        assert_int_equal(vcmp("0.10.0", "0.9.0"), 1);
        assert_int_equal(vcmp("1.0", "1.0.0"), 0);
        assert_int_equal(vcmp("1.0.0", "1.0.0-rc1"), 1);
        assert_int_equal(vcmp("1.0.0-rc2", "1.0.0-rc1"), 1);

        /* Numbers compare as numbers, whatever their length or leading zeros. */
        assert_int_equal(vcmp("10", "9"), 1);
        assert_int_equal(vcmp("1.10", "1.9"), 1);
        assert_int_equal(vcmp("1.01", "1.1"), 0);
        assert_int_equal(vcmp("1.00", "1.0"), 0);
        assert_int_equal(vcmp("1.99999999999999999999999", "1.9999999999999999999999"), 1);
        assert_int_equal(vcmp("2.0", "10.0"), -1);

        /* Number against non-number: leading digits first, then the shorter suffix wins. */
        assert_int_equal(vcmp("10a", "9"), 1);
        assert_int_equal(vcmp("2", "10a"), -1);
        assert_int_equal(vcmp("0", "0-rc1"), 1);
        assert_int_equal(vcmp("1.0.0", "1.0.0-rc10"), 1);
        assert_int_equal(vcmp("rc", "1"), -1);
        assert_int_equal(vcmp("0", "x"), 1); /* prefix 0 == 0, "" shorter than "x" */

        /* Two non-numbers compare byte-wise: "rc10" < "rc2", as in the original. */
        assert_int_equal(vcmp("1.0.0-rc10", "1.0.0-rc2"), -1);
        assert_int_equal(vcmp("a", "b"), -1);
        assert_int_equal(vcmp("1.a", "1.b"), -1);
        assert_int_equal(vcmp("beta", "alpha"), 1);

        /* A missing component is lowest. */
        assert_int_equal(vcmp("1.0.1", "1.0"), 1);
        assert_int_equal(vcmp("1", "1.0.0.0"), 0);
        assert_int_equal(vcmp("1.0.0-rc1", "1.0"), 1);

        assert_int_equal(vcmp("", ""), 0);
        assert_int_equal(vcmp("1.2.3", "1.2.3"), 0);
}

static void test_pairing_and_skipping(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        _cleanup_free_ char *uki = join(dir, "base_1.0.efi"), *disk = join(dir, "base_1.0.raw");
        const Image *i;

        put_image(dir, "base_1.0");
        put(dir, "lone_1.efi", "");   /* no disk */
        put(dir, "orphan_1.raw", ""); /* no UKI */
        put_image(dir, "noversion");  /* no underscore */
        put_image(dir, "_1.0");       /* empty id */
        put_image(dir, "empty_");     /* empty version */
        put_dir(dir, "dir_1.efi");    /* a directory named like a UKI */
        put(dir, "dir_1.raw", "");
        put(dir, "rawdir_1.efi", ""); /* the disk is a directory */
        put_dir(dir, "rawdir_1.raw");
        put(dir, "upper_1.EFI", ""); /* suffixes are case-sensitive */
        put(dir, "upper_1.raw", "");
        put(dir, "base_1.0.efi.partial", ""); /* not a UKI name */
        put(dir, "README", "");
        put_image(dir, "\xff\xfe_1"); /* not UTF-8, could not be rendered as JSON */

        c = catalog_open(dir);
        assert_int_equal(image_catalog_size(c), 1);
        assert_null(image_catalog_at(c, 1));

        i = image_catalog_at(c, 0);
        assert_non_null(i);
        assert_string_equal(i->id, "base");
        assert_string_equal(i->version, "1.0");
        assert_string_equal(i->ref, "base_1.0");
        assert_string_equal(i->uki, uki);
        assert_string_equal(i->disk, disk);
        assert_null(i->policy);
        assert_null(image_catalog_kubernetes_versions(c));
        assert_string_equal(image_catalog_dir(c), dir);

        /* The lone UKI gets its disk: a rescan finds it. */
        put(dir, "lone_1.raw", "");
        assert_int_equal(image_catalog_rescan(c), 2);
        assert_refs(c, "base_1.0 lone_1");
}

static void test_several_underscores(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;

        put_image(dir, "giantswarm_vm_base_1.2.3");
        put_image(dir, "a_b_c");
        put_image(dir, "x__1");

        c = catalog_open(dir);
        assert_refs(c, "a_b_c giantswarm_vm_base_1.2.3 x__1");

        assert_string_equal(image_catalog_at(c, 0)->id, "a_b");
        assert_string_equal(image_catalog_at(c, 0)->version, "c");
        assert_string_equal(image_catalog_at(c, 1)->id, "giantswarm_vm_base");
        assert_string_equal(image_catalog_at(c, 1)->version, "1.2.3");
        assert_string_equal(image_catalog_at(c, 2)->id, "x_");
        assert_string_equal(image_catalog_at(c, 2)->version, "1");
}

static void test_names_utf8(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        json_auto_t *j = NULL;

        put_image(dir, "b\xc3\xa4se_1\xe2\x80\x93rc"); /* "bäse_1–rc" */
        put_image(dir, "over\xc0\xaflong_1");          /* overlong '/' */
        put_image(dir, "sur\xed\xa0\x80rogate_1");     /* UTF-16 surrogate */
        put_image(dir, "short\xe2\x80_1");             /* truncated sequence */
        put_image(dir, "big\xf4\x90\x80\x80_1");       /* above U+10FFFF */

        c = catalog_open(dir);
        assert_refs(c, "b\xc3\xa4se_1\xe2\x80\x93rc");
        j = image_catalog_to_json(c);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(json_array_get(j, 0), "id")), "b\xc3\xa4se");
}

static void test_ordering(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;

        put_image(dir, "zeta_1.0.0");
        put_image(dir, "base_0.9.0");
        put_image(dir, "base_1.0.0-rc1");
        put_image(dir, "base_0.10.0");
        put_image(dir, "base_1.0.0");
        put_image(dir, "base_1.0.0-rc2");
        put_image(dir, "alpha_2");
        put_image(dir, "base-x_1");

        c = catalog_open(dir);
        /* id ascending, byte-wise ("base" < "base-x"), then version descending. */
        assert_refs(
                c,
                "alpha_2 base_1.0.0 base_1.0.0-rc2 base_1.0.0-rc1 base_0.10.0 base_0.9.0 base-x_1 "
                "zeta_1.0.0");
}

static void test_resolve(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        const Image *i;

        c = catalog_open(dir);
        assert_int_equal(image_catalog_size(c), 0);
        assert_null(image_catalog_resolve(c, NULL));
        assert_null(image_catalog_resolve(c, ""));
        assert_null(image_catalog_resolve(c, "base"));

        put_image(dir, "base_0.9.0");
        put_image(dir, "base_0.10.0");
        put_image(dir, "other_0.2");
        assert_int_equal(image_catalog_rescan(c), 3);

        i = image_catalog_resolve(c, "base_0.9.0");
        assert_non_null(i);
        assert_string_equal(i->ref, "base_0.9.0");

        /* A bare id is its newest version. */
        i = image_catalog_resolve(c, "base");
        assert_non_null(i);
        assert_string_equal(i->ref, "base_0.10.0");
        i = image_catalog_resolve(c, "other");
        assert_non_null(i);
        assert_string_equal(i->ref, "other_0.2");

        /* Default: the highest version across all ids. */
        i = image_catalog_resolve(c, NULL);
        assert_non_null(i);
        assert_string_equal(i->ref, "base_0.10.0");
        assert_ptr_equal(image_catalog_resolve(c, ""), i);

        assert_null(image_catalog_resolve(c, "nope"));
        assert_null(image_catalog_resolve(c, "base_0.11.0"));
        assert_null(image_catalog_resolve(c, "bas"));
        assert_null(image_catalog_resolve(c, "base_"));

        /* Another id with a higher version becomes the default. */
        put_image(dir, "another_1.0");
        assert_int_equal(image_catalog_rescan(c), 4);
        assert_string_equal(image_catalog_resolve(c, NULL)->ref, "another_1.0");

        /* Ties go to the first in list order. */
        put_image(dir, "zzz_1.0.0");
        put_image(dir, "aaa_1");
        assert_int_equal(image_catalog_rescan(c), 6);
        assert_string_equal(image_catalog_resolve(c, NULL)->ref, "aaa_1");
}

static const char sums[] =
        "0123abcd  kubernetes_1.31.4.raw\n"
        "4567ef01 *kubernetes_1.32.0.raw\n"
        "\n"
        "just-one-field\n"
        "kubernetes_9.9.9.raw\n"                       /* one field only */
        "deadbeef  base_1.0.raw\n"                     /* another component */
        "deadbeef  kubernetes_.raw\n"                  /* no version */
        "deadbeef  kubernetes_1.2.3.raw.sig\n"         /* wrong suffix */
        "deadbeef  Kubernetes_1.2.3.raw\n"             /* case-sensitive */
        "  \t cafe0000\t kubernetes_1.30.10.raw  \r\n" /* odd whitespace, CRLF */
        "feed0000  kubernetes_1.9.0.raw\n"
        "feed0001  kubernetes_1.32.0.raw\n" /* a duplicate */
        "a b c kubernetes_1.32.0-rc1.raw";  /* more fields, no final newline */

static void test_kubernetes_versions(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        json_auto_t *j = NULL;
        char **kv;

        put_image(dir, "base_1");
        put_image(dir, "other_2");

        /* No sysupdate tree: no versions, no sysupdateDir. */
        c = catalog_open(dir);
        assert_null(image_catalog_kubernetes_versions(c));

        /* A tree without SHA256SUMS: still none, silently. */
        put_dir(dir, "sysupdate/kubernetes");
        assert_int_equal(image_catalog_rescan(c), 2);
        assert_null(image_catalog_kubernetes_versions(c));

        put(dir, "sysupdate/kubernetes/SHA256SUMS", sums);
        assert_int_equal(image_catalog_rescan(c), 2);
        kv = image_catalog_kubernetes_versions(c);
        assert_non_null(kv);
        assert_string_equal(kv[0], "1.32.0");
        assert_string_equal(kv[1], "1.32.0-rc1");
        assert_string_equal(kv[2], "1.31.4");
        assert_string_equal(kv[3], "1.30.10");
        assert_string_equal(kv[4], "1.9.0");
        assert_null(kv[5]);

        /* The same list on every image. */
        j = image_catalog_to_json(c);
        assert_non_null(j);
        assert_int_equal(json_array_size(j), 2);
        for (size_t i = 0; i < 2; i++) {
                _cleanup_free_ char *t = dump(json_object_get(json_array_get(j, i), "kubernetesVersions"));
                assert_string_equal(t, "[\"1.32.0\",\"1.32.0-rc1\",\"1.31.4\",\"1.30.10\",\"1.9.0\"]");
        }

        /* Only junk: none. */
        put(dir, "sysupdate/kubernetes/SHA256SUMS", "x\ny z\n\n");
        assert_int_equal(image_catalog_rescan(c), 2);
        assert_null(image_catalog_kubernetes_versions(c));
}

/* The build's manifest.json marks a version whose extension cannot run a node: it is not offered,
 * and the images say why; the versions it does not describe stay. */
static void test_kubernetes_not_node(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        json_auto_t *j = NULL;
        json_t *u;
        char **kv;

        put_image(dir, "base_1");
        put_dir(dir, "sysupdate/kubernetes");
        put(dir, "sysupdate/kubernetes/SHA256SUMS", "ab  kubernetes_1.36.4.raw\ncd  kubernetes_1.20.2.raw\n");
        put(dir,
            "manifest.json",
            "{\"kubernetes\":{\"version\":\"1.36.4\",\"kubelet\":false,\"kubeadm\":false,"
            "\"note\":\"kubelet and kubeadm are not in Debian\"}}");
        c = catalog_open(dir);
        kv = image_catalog_kubernetes_versions(c);
        assert_non_null(kv);
        assert_string_equal(kv[0], "1.20.2");
        assert_null(kv[1]);
        assert_non_null(strstr(image_catalog_kubernetes_unusable(c, "1.36.4"), "cannot run a Kubernetes node"));
        assert_null(image_catalog_kubernetes_unusable(c, "1.20.2"));
        j = image_to_json(c, image_catalog_at(c, 0));
        u = json_array_get(json_object_get(j, "kubernetesUnusable"), 0);
        assert_string_equal(json_string_value(json_object_get(u, "version")), "1.36.4");
        assert_string_equal(
                json_string_value(json_object_get(u, "note")), "kubelet and kubeadm are not in Debian");

        /* a build that is a node: everything offered, nothing set apart */
        put(dir, "manifest.json", "{\"kubernetes\":{\"version\":\"1.36.4\",\"node\":true}}");
        assert_int_equal(image_catalog_rescan(c), 1);
        kv = image_catalog_kubernetes_versions(c);
        assert_string_equal(kv[0], "1.36.4");
        assert_string_equal(kv[1], "1.20.2");
        assert_null(image_catalog_kubernetes_unusable(c, "1.36.4"));

        /* the only version is no node: none offered */
        put(dir, "sysupdate/kubernetes/SHA256SUMS", "ab  kubernetes_1.36.4.raw\n");
        put(dir, "manifest.json", "{\"kubernetes\":{\"version\":\"1.36.4\",\"node\":false}}");
        assert_int_equal(image_catalog_rescan(c), 1);
        assert_null(image_catalog_kubernetes_versions(c));
}

static void test_sysupdate_symlink_not_followed(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        _cleanup_free_ char *images = join(dir, "images"), *outside = join(dir, "outside"),
                            *link = join(dir, "images/sysupdate");
        json_auto_t *j = NULL;

        put_dir(dir, "images");
        put_dir(dir, "outside/kubernetes");
        put(dir, "outside/kubernetes/SHA256SUMS", "abcd  kubernetes_1.30.0.raw\n");
        put_image(images, "base_1");
        assert_ok(RET_NERRNO(symlink(outside, link)));

        c = catalog_open(images);
        assert_null(image_catalog_kubernetes_versions(c));
        j = image_to_json(c, image_catalog_at(c, 0));
        assert_non_null(j);
        assert_null(json_object_get(j, "sysupdateDir"));
        assert_null(json_object_get(j, "kubernetesVersions"));
}

static void test_policy(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        const Image *i;

        put_image(dir, "base_1.0");
        put_image(dir, "base_2.0");
        put_image(dir, "other_1.0");

        /* Without files, nobody has a policy. */
        c = catalog_open(dir);
        for (size_t k = 0; k < image_catalog_size(c); k++)
                assert_null(image_catalog_at(c, k)->policy);

        /* A shared policy naming nothing applies to every image. */
        put(dir, "policy.json", "{\"pcr11\": {\"a\": \"b\"}}");
        assert_int_equal(image_catalog_rescan(c), 3);
        for (size_t k = 0; k < image_catalog_size(c); k++)
                assert_non_null(json_object_get(image_catalog_at(c, k)->policy, "pcr11"));

        /* image_id restricts it to one id, image_version to one version. */
        put(dir, "policy.json", "{\"image_id\": \"base\", \"shared\": true}");
        assert_int_equal(image_catalog_rescan(c), 3);
        assert_non_null(image_catalog_resolve(c, "base_1.0")->policy);
        assert_non_null(image_catalog_resolve(c, "base_2.0")->policy);
        assert_null(image_catalog_resolve(c, "other_1.0")->policy);

        put(dir, "policy.json", "{\"image_id\": \"base\", \"image_version\": \"2.0\", \"shared\": true}");
        assert_int_equal(image_catalog_rescan(c), 3);
        assert_null(image_catalog_resolve(c, "base_1.0")->policy);
        assert_true(json_is_true(json_object_get(image_catalog_resolve(c, "base_2.0")->policy, "shared")));
        assert_null(image_catalog_resolve(c, "other_1.0")->policy);

        /* Mismatching: no policy at all, also for an ill-typed key. */
        put(dir, "policy.json", "{\"image_id\": \"nope\"}");
        assert_int_equal(image_catalog_rescan(c), 3);
        for (size_t k = 0; k < image_catalog_size(c); k++)
                assert_null(image_catalog_at(c, k)->policy);
        put(dir, "policy.json", "{\"image_version\": 2}");
        assert_int_equal(image_catalog_rescan(c), 3);
        for (size_t k = 0; k < image_catalog_size(c); k++)
                assert_null(image_catalog_at(c, k)->policy);

        /* The per-image file wins over a matching shared one. */
        put(dir, "policy.json", "{\"shared\": true}");
        put(dir, "base_1.0.policy.json", "{\"own\": 1}");
        assert_int_equal(image_catalog_rescan(c), 3);
        i = image_catalog_resolve(c, "base_1.0");
        assert_non_null(json_object_get(i->policy, "own"));
        assert_null(json_object_get(i->policy, "shared"));
        assert_non_null(json_object_get(image_catalog_resolve(c, "base_2.0")->policy, "shared"));

        /* An invalid per-image file is no policy of its own: the shared one applies again. */
        put(dir, "base_1.0.policy.json", "{\"own\": ");
        assert_int_equal(image_catalog_rescan(c), 3);
        assert_non_null(json_object_get(image_catalog_resolve(c, "base_1.0")->policy, "shared"));
        put(dir, "base_1.0.policy.json", "[1, 2]");
        assert_int_equal(image_catalog_rescan(c), 3);
        assert_non_null(json_object_get(image_catalog_resolve(c, "base_1.0")->policy, "shared"));
        put(dir, "base_1.0.policy.json", "{} trailing");
        assert_int_equal(image_catalog_rescan(c), 3);
        assert_non_null(json_object_get(image_catalog_resolve(c, "base_1.0")->policy, "shared"));

        /* Invalid shared JSON: no policy. */
        put(dir, "policy.json", "{\"shared\": tru}");
        assert_int_equal(image_catalog_rescan(c), 3);
        for (size_t k = 0; k < image_catalog_size(c); k++)
                assert_null(image_catalog_at(c, k)->policy);

        /* Over the size limit: no policy. */
        _cleanup_free_ char *big = malloc(IMAGE_POLICY_SIZE_MAX + 16);
        assert_non_null(big);
        memset(big, ' ', IMAGE_POLICY_SIZE_MAX + 8);
        memcpy(big, "{}", 2);
        big[IMAGE_POLICY_SIZE_MAX + 8] = 0;
        put(dir, "base_2.0.policy.json", big);
        assert_int_equal(image_catalog_rescan(c), 3);
        assert_null(image_catalog_resolve(c, "base_2.0")->policy);
}

static void assert_keys(json_t *o, const char *const *keys) {
        void *it = json_object_iter(o);

        for (; *keys; keys++) {
                assert_non_null(it);
                assert_string_equal(json_object_iter_key(it), *keys);
                it = json_object_iter_next(o, it);
        }
        assert_null(it);
}

static void test_json(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        _cleanup_free_ char *sysupdate = join(dir, "sysupdate"), *s = NULL, *uki = join(dir, "base_1.efi");
        json_auto_t *empty = NULL, *bare = NULL, *full = NULL, *all = NULL;

        c = catalog_open(dir);
        empty = image_catalog_to_json(c);
        assert_non_null(empty);
        s = dump(empty);
        assert_string_equal(s, "[]");
        s = mfree(s);

        /* Only the four mandatory keys when there is nothing else. */
        put_image(dir, "base_1");
        assert_int_equal(image_catalog_rescan(c), 1);
        bare = image_to_json(c, image_catalog_at(c, 0));
        assert_non_null(bare);
        assert_keys(bare, (const char *const[]){ "id", "version", "uki", "disk", NULL });
        assert_string_equal(json_string_value(json_object_get(bare, "id")), "base");
        assert_string_equal(json_string_value(json_object_get(bare, "version")), "1");
        assert_string_equal(json_string_value(json_object_get(bare, "uki")), uki);

        /* A layout file makes the image host-installable: its path, and a rescan sees it come and go. */
        put(dir, "base_1.layout.json", "{}");
        assert_int_equal(image_catalog_rescan(c), 1);
        assert_non_null(image_catalog_at(c, 0)->layout);
        assert_non_null(strstr(image_catalog_at(c, 0)->layout, "/base_1.layout.json"));
        {
                json_auto_t *with = image_to_json(c, image_catalog_at(c, 0));
                assert_keys(with, (const char *const[]){ "id", "version", "uki", "disk", "layout", NULL });
        }
        rm(dir, "base_1.layout.json");
        assert_int_equal(image_catalog_rescan(c), 1);
        assert_null(image_catalog_at(c, 0)->layout);

        /* All of them, in order, with the policy as it was written. */
        put(dir, "policy.json", "{\"image_id\": \"base\", \"pcr11\": {\"z\": \"1\", \"a\": \"2\"}}");
        put_dir(dir, "sysupdate/kubernetes");
        put(dir, "sysupdate/kubernetes/SHA256SUMS", "ab  kubernetes_1.30.0.raw\n");
        assert_int_equal(image_catalog_rescan(c), 1);
        full = image_to_json(c, image_catalog_at(c, 0));
        assert_non_null(full);
        assert_keys(
                full,
                (const char *const[]){
                        "id", "version", "uki", "disk", "sysupdateDir", "kubernetesVersions", "policy", NULL });
        assert_string_equal(json_string_value(json_object_get(full, "sysupdateDir")), sysupdate);
        s = dump(json_object_get(full, "policy"));
        assert_string_equal(s, "{\"image_id\":\"base\",\"pcr11\":{\"z\":\"1\",\"a\":\"2\"}}");
        s = mfree(s);

        /* The policy is a copy: changing the rendering leaves the catalog alone. */
        json_object_clear(json_object_get(full, "policy"));
        assert_non_null(json_object_get(image_catalog_at(c, 0)->policy, "pcr11"));

        /* sysupdateDir without versions. */
        rm(dir, "sysupdate/kubernetes/SHA256SUMS");
        rm(dir, "policy.json");
        assert_int_equal(image_catalog_rescan(c), 1);
        all = image_catalog_to_json(c);
        assert_non_null(all);
        assert_int_equal(json_array_size(all), 1);
        assert_keys(
                json_array_get(all, 0),
                (const char *const[]){ "id", "version", "uki", "disk", "sysupdateDir", NULL });
}

static void test_get_json(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        _cleanup_free_ char *expected = NULL;
        ApiError e = API_ERROR_NULL;
        json_t *v = NULL;

        c = catalog_open(dir);

        /* An empty catalog has no default either. */
        assert_errno(image_catalog_get_json(c, NULL, &v, &e), -ENOENT);
        assert_null(v);
        assert_true(asprintf(&expected, "not found: no images in %s", dir) >= 0);
        assert_string_equal(e.message, expected);
        api_error_done(&e);

        put_image(dir, "base_1.0");
        assert_int_equal(image_catalog_rescan(c), 1);

        assert_errno(image_catalog_get_json(c, "nope", &v, &e), -ENOENT);
        assert_null(v);
        assert_int_equal(e.error, -ENOENT);
        assert_int_equal(e.code, API_ERROR_NOT_FOUND);
        assert_string_equal(e.message, "not found: image \"nope\"");
        api_error_done(&e);

        /* reterr may be NULL. */
        assert_errno(image_catalog_get_json(c, "base_2.0", &v, /* reterr= */ NULL), -ENOENT);

        assert_ok(image_catalog_get_json(c, "base", &v, &e));
        assert_false(api_error_is_set(&e));
        assert_non_null(v);
        assert_string_equal(json_string_value(json_object_get(v, "version")), "1.0");
        json_decref(v);

        assert_ok(image_catalog_get_json(c, NULL, &v, &e));
        assert_string_equal(json_string_value(json_object_get(v, "id")), "base");
        json_decref(v);
}

static void test_missing_dir(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *missing = join(dir, "missing"), *file = join(dir, "file");
        ImageCatalog *c = NULL;
        ApiError e = API_ERROR_NULL;

        assert_errno(image_catalog_new(&c, /* event= */ NULL, missing, &e), -ENOENT);
        assert_null(c);
        assert_int_equal(e.code, API_ERROR_NOT_FOUND);
        assert_contains(e.message, missing);
        api_error_done(&e);

        /* The same with a watch. */
        _cleanup_(sd_event_unrefp) sd_event *event = NULL;
        assert_ok(sd_event_new(&event));
        assert_errno(image_catalog_new(&c, event, missing, &e), -ENOENT);
        assert_null(c);
        assert_contains(e.message, missing);
        api_error_done(&e);

        put(dir, "file", "");
        assert_errno(image_catalog_new(&c, /* event= */ NULL, file, &e), -ENOTDIR);
        assert_null(c);
        assert_contains(e.message, file);
        api_error_done(&e);

        assert_errno(image_catalog_new(&c, /* event= */ NULL, "", &e), -EINVAL);
        assert_errno(image_catalog_new(&c, /* event= */ NULL, NULL, /* reterr= */ NULL), -EINVAL);
        assert_null(c);
        api_error_done(&e);
}

static void test_relative_dir(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *cwd = getcwd(NULL, 0), *uki = join(dir, "sub/base_1.efi"),
                            *sub = join(dir, "sub");
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL, *d = NULL;
        ApiError e = API_ERROR_NULL;
        int r;

        put_dir(dir, "sub");
        put_image(sub, "base_1");

        assert_non_null(cwd);
        assert_ok(RET_NERRNO(chdir(dir)));
        r = image_catalog_new(&c, /* event= */ NULL, "./sub/", &e);
        assert_ok(RET_NERRNO(chdir(cwd)));
        assert_ok(r);

        assert_string_equal(image_catalog_dir(c), sub);
        assert_string_equal(image_catalog_at(c, 0)->uki, uki);

        /* Redundant slashes, "." and ".." are cleaned lexically. */
        _cleanup_free_ char *messy = NULL;
        assert_true(asprintf(&messy, "%s//sub/./../sub///", dir) >= 0);
        assert_ok(image_catalog_new(&d, /* event= */ NULL, messy, &e));
        assert_string_equal(image_catalog_dir(d), sub);
        assert_string_equal(image_catalog_at(d, 0)->uki, uki);
}

static void test_limit(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;

        for (unsigned i = 0; i < IMAGE_CATALOG_MAX + 5; i++) {
                char stem[32];
                (void) snprintf(stem, sizeof(stem), "img_%u", i);
                put_image(dir, stem);
        }

        c = catalog_open(dir);
        assert_int_equal(image_catalog_size(c), IMAGE_CATALOG_MAX);
        assert_int_equal(image_catalog_rescan(c), IMAGE_CATALOG_MAX);
}

typedef struct Watcher {
        unsigned changes;
        unsigned baseline;
        ImageCatalog *catalog;
} Watcher;

static void on_change(ImageCatalog *c, void *userdata) {
        Watcher *w = userdata;

        assert_ptr_equal(c, w->catalog);
        w->changes++;
}

static void test_rescan_callback(void **state) {
        const char *dir = *state;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        Watcher w = {};

        put_image(dir, "base_1");
        c = catalog_open(dir);
        w.catalog = c;
        image_catalog_set_change_callback(c, on_change, &w);

        /* Nothing changed, no call. */
        assert_int_equal(image_catalog_rescan(c), 1);
        assert_int_equal(w.changes, 0);

        put_image(dir, "base_2");
        assert_int_equal(image_catalog_rescan(c), 2);
        assert_int_equal(w.changes, 1);

        /* A changed policy or Kubernetes list is a change too. */
        put(dir, "base_2.policy.json", "{}");
        assert_int_equal(image_catalog_rescan(c), 2);
        assert_int_equal(w.changes, 2);
        put_dir(dir, "sysupdate/kubernetes");
        assert_int_equal(image_catalog_rescan(c), 2);
        assert_int_equal(w.changes, 3);
        put(dir, "sysupdate/kubernetes/SHA256SUMS", "ab  kubernetes_1.0.raw\n");
        assert_int_equal(image_catalog_rescan(c), 2);
        assert_int_equal(w.changes, 4);
        assert_int_equal(image_catalog_rescan(c), 2);
        assert_int_equal(w.changes, 4);

        /* A directory that went away keeps the previous list. */
        _cleanup_free_ char *moved = NULL;
        assert_true(asprintf(&moved, "%s.moved", dir) >= 0);
        assert_ok(RET_NERRNO(rename(dir, moved)));
        assert_errno(image_catalog_rescan(c), -ENOENT);
        assert_ok(RET_NERRNO(rename(moved, dir)));
        assert_int_equal(image_catalog_size(c), 2);
        assert_int_equal(w.changes, 4);

        image_catalog_set_change_callback(c, /* cb= */ NULL, /* userdata= */ NULL);
        rm(dir, "base_1.efi");
        assert_int_equal(image_catalog_rescan(c), 1);
        assert_int_equal(w.changes, 4);
}

/* Runs the loop until cond holds or about three seconds passed. */
static bool run_until(sd_event *e, bool (*cond)(Watcher *w), Watcher *w) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 3 * USEC_PER_SEC;

        while (!cond(w)) {
                if (now_usec(CLOCK_MONOTONIC) >= deadline)
                        return false;
                assert_ok(sd_event_run(e, 100 * USEC_PER_MSEC));
        }
        return true;
}

static bool has_one_image(Watcher *w) {
        return image_catalog_size(w->catalog) == 1;
}

static bool has_no_image(Watcher *w) {
        return image_catalog_size(w->catalog) == 0;
}

static bool has_fresh(Watcher *w) {
        return image_catalog_size(w->catalog) == 1 && streq(image_catalog_at(w->catalog, 0)->ref, "fresh_2");
}

static bool has_two_images(Watcher *w) {
        return image_catalog_size(w->catalog) == 2;
}

static bool has_changed(Watcher *w) {
        return w->changes > w->baseline;
}

static bool has_kubernetes(Watcher *w) {
        return image_catalog_kubernetes_versions(w->catalog) != NULL;
}

static bool has_no_kubernetes(Watcher *w) {
        return image_catalog_kubernetes_versions(w->catalog) == NULL;
}

static void test_inotify(void **state) {
        const char *dir = *state;
        _cleanup_(sd_event_unrefp) sd_event *event = NULL;
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        ApiError e = API_ERROR_NULL;
        Watcher w = {};
        unsigned before;

        assert_ok(sd_event_new(&event));
        assert_ok(image_catalog_new(&c, event, dir, &e));
        assert_int_equal(image_catalog_size(c), 0);
        w.catalog = c;
        image_catalog_set_change_callback(c, on_change, &w);

        /* A new pair appears without an explicit rescan. */
        put_image(dir, "base_1.0");
        assert_true(run_until(event, has_one_image, &w));
        assert_int_equal(w.changes, 1);
        assert_string_equal(image_catalog_at(c, 0)->ref, "base_1.0");

        /* A lone UKI is no image, and no change. */
        put(dir, "lone_1.efi", "");
        for (unsigned i = 0; i < 5; i++)
                assert_ok(sd_event_run(event, 100 * USEC_PER_MSEC));
        assert_int_equal(image_catalog_size(c), 1);
        assert_int_equal(w.changes, 1);

        /* The Kubernetes tree appearing later, step by step, is followed as well: first sysupdate/
         * (a change, sysupdateDir appears), then kubernetes/ inside it, then its SHA256SUMS. */
        before = w.changes;
        put_dir(dir, "sysupdate");
        w.baseline = before;
        assert_true(run_until(event, has_changed, &w));
        put_dir(dir, "sysupdate/kubernetes");
        put(dir, "sysupdate/kubernetes/SHA256SUMS", "ab  kubernetes_1.30.0.raw\n");
        assert_true(run_until(event, has_kubernetes, &w));
        assert_string_equal(image_catalog_kubernetes_versions(c)[0], "1.30.0");
        rm(dir, "sysupdate/kubernetes/SHA256SUMS");
        assert_true(run_until(event, has_no_kubernetes, &w));

        /* Deleting the image removes it. */
        before = w.changes;
        rm(dir, "base_1.0.raw");
        assert_true(run_until(event, has_no_image, &w));
        assert_true(w.changes > before);

        /* A pair renamed into place (the way downloads finish) appears too. */
        _cleanup_free_ char *from = join(dir, "tmp.raw"), *to = join(dir, "lone_1.raw");
        put(dir, "tmp.raw", "disk");
        assert_ok(RET_NERRNO(rename(from, to)));
        assert_true(run_until(event, has_one_image, &w));
        assert_string_equal(image_catalog_at(c, 0)->ref, "lone_1");

        /* The whole directory replaced by a new copy under the same path (a build publishing with
         * rm + mv): the new copy's images show, and later changes inside it are still seen. */
        {
                _cleanup_free_ char *copy = NULL, *cmd = NULL;
                assert_true(asprintf(&copy, "%s.new", dir) > 0);
                assert_ok(RET_NERRNO(mkdir(copy, 0755)));
                put_image(copy, "fresh_2");
                assert_true(asprintf(&cmd, "rm -rf '%s' && mv '%s' '%s'", dir, copy, dir) > 0);
                assert_int_equal(system(cmd), 0);
                assert_true(run_until(event, has_fresh, &w));
                put_image(dir, "later_3");
                assert_true(run_until(event, has_two_images, &w));
        }

        /* Freed with events queued and a rescan pending. */
        put_image(dir, "late_1");
        assert_ok(sd_event_run(event, 100 * USEC_PER_MSEC));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_version_compare),
                cmocka_unit_test_setup_teardown(test_pairing_and_skipping, setup, teardown),
                cmocka_unit_test_setup_teardown(test_several_underscores, setup, teardown),
                cmocka_unit_test_setup_teardown(test_names_utf8, setup, teardown),
                cmocka_unit_test_setup_teardown(test_ordering, setup, teardown),
                cmocka_unit_test_setup_teardown(test_resolve, setup, teardown),
                cmocka_unit_test_setup_teardown(test_kubernetes_versions, setup, teardown),
                cmocka_unit_test_setup_teardown(test_kubernetes_not_node, setup, teardown),
                cmocka_unit_test_setup_teardown(test_sysupdate_symlink_not_followed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_policy, setup, teardown),
                cmocka_unit_test_setup_teardown(test_json, setup, teardown),
                cmocka_unit_test_setup_teardown(test_get_json, setup, teardown),
                cmocka_unit_test_setup_teardown(test_missing_dir, setup, teardown),
                cmocka_unit_test_setup_teardown(test_relative_dir, setup, teardown),
                cmocka_unit_test_setup_teardown(test_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_rescan_callback, setup, teardown),
                cmocka_unit_test_setup_teardown(test_inotify, setup, teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
