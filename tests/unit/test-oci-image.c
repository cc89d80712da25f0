/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "image-catalog.h"
#include "oci-image-internal.h"
#include "oci-image.h"

/* This binary is linked with -Wl,--wrap=renameat -Wl,--wrap=renameat2: every rename of the install
 * lands here, runs, and then the image catalog (the daemon's own scanner) reads the directory, as a
 * rescan at that instant would. A test can also make the n-th rename fail. */
int __real_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
int __wrap_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
int __real_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags);
int __wrap_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags);

static char *workdir, *imgdir, *stagedir;

static struct {
        void (*check)(void); /* run after every rename */
        unsigned calls;
        unsigned fail_at; /* 1-based call to fail with EIO; 0: none */
        unsigned checks;
} hook;

static void after_rename(void) {
        if (hook.check) {
                hook.checks++;
                hook.check();
        }
}

int __wrap_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
        int r;

        if (++hook.calls == hook.fail_at) {
                errno = EIO;
                return -1;
        }
        r = __real_renameat(olddirfd, oldpath, newdirfd, newpath);
        if (r >= 0)
                after_rename();
        return r;
}

int __wrap_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags) {
        int r;

        if (++hook.calls == hook.fail_at) {
                errno = EIO;
                return -1;
        }
        r = __real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
        if (r >= 0)
                after_rename();
        return r;
}

static void write_at(const char *dir, const char *rel, const char *content) {
        _cleanup_free_ char *p = NULL, *parent = NULL;
        _cleanup_close_ int fd = -EBADF;

        assert_true(asprintf(&p, "%s/%s", dir, rel) >= 0);
        parent = strdup(p);
        *strrchr(parent, '/') = 0;
        assert_ok(mkdir_p(parent, 0755));
        fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        assert_ok(loop_write(fd, content, strlen(content)));
}

/* One generation of an image: every file says which generation it is, the Kubernetes tree names a
 * version of its own. */
static void make_image(
        const char *dir, const char *ref, const char *gen, const char *kube, const char *policy_name) {
        _cleanup_free_ char *efi = NULL, *raw = NULL, *pol = NULL, *sums = NULL, *id = strdup(ref);
        char *us = strrchr(id, '_');

        *us = 0;
        assert_true(asprintf(&efi, "%s.efi", ref) >= 0 && asprintf(&raw, "%s.raw", ref) >= 0);
        assert_true(
                asprintf(&pol, "{\"image_id\":\"%s\",\"image_version\":\"%s\",\"gen\":\"%s\"}", id, us + 1, gen) >=
                0);
        assert_true(asprintf(&sums, "%064d  kubernetes_%s.raw\n", 0, kube) >= 0);
        write_at(dir, efi, gen);
        write_at(dir, raw, gen);
        write_at(dir, policy_name, pol);
        write_at(dir, "sysupdate/base/x.raw", gen);
        write_at(dir, "sysupdate/kubernetes/SHA256SUMS", sums);
}

static int setup(void **state) {
        workdir = strdup("/tmp/test-oci-image-XXXXXX");
        assert_non_null(mkdtemp(workdir));
        assert_true(asprintf(&imgdir, "%s/img", workdir) >= 0);
        assert_true(asprintf(&stagedir, "%s/img/.pull-test", workdir) >= 0);
        assert_ok(mkdir_p(stagedir, 0700));
        hook = (typeof(hook)){};
        return 0;
}

static int teardown(void **state) {
        hook = (typeof(hook)){};
        (void) rm_rf(workdir);
        workdir = mfree(workdir);
        imgdir = mfree(imgdir);
        stagedir = mfree(stagedir);
        return 0;
}

static char *slurp(const char *path) {
        char *s = NULL;
        if (read_full_file(path, 1 << 20, &s, NULL) < 0)
                return NULL;
        return s;
}

/* What a rescan sees of the image ref: NULL when it is not listed, else its generation, after
 * checking that its UKI, disk, policy and the trees all belong to that one generation. */
static char *observe(const char *ref, bool trees_follow) {
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        _cleanup_free_ char *uki = NULL, *raw = NULL, *base = NULL, *path = NULL;
        const Image *img = NULL;
        const char *gen;
        char **kv;

        assert_ok(image_catalog_new(&c, /* event= */ NULL, imgdir, NULL));
        for (size_t i = 0; i < image_catalog_size(c); i++)
                if (streq(image_catalog_at(c, i)->ref, ref))
                        img = image_catalog_at(c, i);
        if (!img)
                return NULL;
        uki = slurp(img->uki);
        raw = slurp(img->disk);
        assert_non_null(uki);
        assert_non_null(raw);
        if (!streq(uki, raw))
                fail_msg("%s: the UKI is of generation %s, the disk of %s", ref, uki, raw);
        if (!img->policy)
                fail_msg("%s (%s) is listed without its policy", ref, uki);
        gen = json_string_value(json_object_get(img->policy, "gen"));
        if (!gen || !streq(gen, uki))
                fail_msg("%s: the UKI is of generation %s, the policy of %s", ref, uki, gen ?: "(none)");
        if (img->layout) {
                _cleanup_free_ char *layout = slurp(img->layout);
                if (!layout || !streq(layout, uki))
                        fail_msg(
                                "%s of generation %s is listed with the layout of %s",
                                ref,
                                uki,
                                layout ?: "(none)");
        }
        if (trees_follow) {
                kv = image_catalog_kubernetes_versions(c);
                assert_non_null(kv);
                if (!streq(kv[0], streq(uki, "old") ? "1.30.0" : "1.31.0"))
                        fail_msg("%s of generation %s is listed with Kubernetes %s", ref, uki, kv[0]);
                assert_true(asprintf(&path, "%s/sysupdate/base/x.raw", imgdir) >= 0);
                base = slurp(path);
                if (!base || !streq(base, uki))
                        fail_msg(
                                "%s of generation %s is listed with the base tree of %s",
                                ref,
                                uki,
                                base ?: "(none)");
        }
        return strdup(uki);
}

static unsigned seen_old, seen_new, seen_absent;

static void check_replace(void) {
        _cleanup_free_ char *g = observe("vm_1.0", /* trees_follow= */ true);

        if (!g)
                seen_absent++;
        else if (streq(g, "old"))
                seen_old++;
        else
                seen_new++;
}

static const OciStaged replace_items[] = {
        { OCI_STAGED_TREE, "sysupdate/base", NULL },
        { OCI_STAGED_TREE, "sysupdate/kubernetes", NULL },
        { OCI_STAGED_FILE, "vm_1.0.raw", "vm_1.0.raw" },
        { OCI_STAGED_FILE, "policy.json", "policy.json" },
};

static int install(const char *image, const OciStaged *items, size_t n, ApiError *e) {
        _cleanup_close_ int dfd = open(imgdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC),
                            sfd = open(stagedir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

        assert_true(dfd >= 0 && sfd >= 0);
        return oci_image_install(dfd, sfd, image, items, n, e);
}

/* The same image, rebuilt: at no rename does a rescan see it mixed; it is old, briefly absent, new. */
static void test_replace_is_never_half(void **state) {
        _cleanup_free_ char *g = NULL;

        make_image(imgdir, "vm_1.0", "old", "1.30.0", "policy.json");
        make_image(stagedir, "vm_1.0", "new", "1.31.0", "policy.json");
        seen_old = seen_new = seen_absent = 0;
        hook.check = check_replace;
        assert_ok(install("vm_1.0", replace_items, ELEMENTSOF(replace_items), NULL));
        hook.check = NULL;

        assert_int_equal(hook.checks, 6); /* hide, two trees, two files, show */
        assert_true(seen_absent > 0);
        assert_int_equal(seen_new, 1); /* only the last rename shows it, and whole */
        g = observe("vm_1.0", true);
        assert_string_equal(g, "new");
}

static void check_add(void) {
        _cleanup_free_ char *a = observe("vm_1.0", false), *b = observe("vm_2.0", false);

        if (!a || !streq(a, "old"))
                fail_msg("vm_1.0 should stay listed as it was, it is %s", a ?: "gone");
        if (b) {
                assert_string_equal(b, "new");
                seen_new++;
        } else
                seen_absent++;
}

/* A new version beside the old one: the old one never leaves the list, the new one arrives whole
 * with the last rename, and the old one's policy.json is not taken over. */
static void test_add_version(void **state) {
        static const OciStaged items[] = {
                { OCI_STAGED_TREE, "sysupdate/kubernetes", NULL },
                { OCI_STAGED_FILE, "vm_2.0.raw", "vm_2.0.raw" },
                { OCI_STAGED_FILE, "policy.json", "vm_2.0.policy.json" },
        };
        _cleanup_free_ char *p = NULL, *old_policy = NULL;

        make_image(imgdir, "vm_1.0", "old", "1.30.0", "policy.json");
        make_image(stagedir, "vm_2.0", "new", "1.31.0", "policy.json");
        seen_new = seen_absent = 0;
        hook.check = check_add;
        assert_ok(install("vm_2.0", items, ELEMENTSOF(items), NULL));
        hook.check = NULL;
        assert_int_equal(seen_new, 1);
        assert_true(seen_absent >= 2);
        assert_true(asprintf(&p, "%s/policy.json", imgdir) >= 0);
        old_policy = slurp(p);
        assert_non_null(strstr(old_policy, "\"gen\":\"old\""));
}

/* Every file and its content below imgdir, the stage left out. */
static char *snapshot(void) {
        _cleanup_free_ char *cmd = NULL, *out = NULL;
        FILE *f;
        char *s = NULL;
        size_t n = 0;

        assert_true(
                asprintf(
                        &cmd,
                        "cd '%s' && find . -path ./.pull-test -prune -o -type f -print | sort | "
                        "while read -r f; do echo \"$f=$(cat \"$f\")\"; done; find . -path ./.pull-test -prune "
                        "-o -type d -print | sort",
                        imgdir) >= 0);
        f = popen(cmd, "r");
        assert_non_null(f);
        assert_true(getdelim(&s, &n, 0, f) > 0);
        pclose(f);
        return s;
}

/* Whichever rename fails, everything moved so far goes back: the directory is as it was. With
 * old_layout the directory's image has a layout file (the new one has none). */
static void fail_at_each_step(const OciStaged *items, size_t n, unsigned steps_expected, bool old_layout) {
        unsigned steps;

        /* count the renames of a good run */
        make_image(imgdir, "vm_1.0", "old", "1.30.0", "policy.json");
        if (old_layout)
                write_at(imgdir, "vm_1.0.layout.json", "old");
        make_image(stagedir, "vm_1.0", "new", "1.31.0", "policy.json");
        assert_ok(install("vm_1.0", items, n, NULL));
        steps = hook.calls;
        assert_int_equal(steps, steps_expected);

        for (unsigned k = 1; k <= steps; k++) {
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
                _cleanup_free_ char *before = NULL, *after = NULL;

                (void) rm_rf(imgdir);
                assert_ok(mkdir_p(stagedir, 0700));
                make_image(imgdir, "vm_1.0", "old", "1.30.0", "policy.json");
                if (old_layout)
                        write_at(imgdir, "vm_1.0.layout.json", "old");
                make_image(stagedir, "vm_1.0", "new", "1.31.0", "policy.json");
                before = snapshot();
                hook = (typeof(hook)){ .fail_at = k };
                assert_errno(install("vm_1.0", items, n, &e), -EIO);
                assert_non_null(strstr(e.message, "the directory is as it was"));
                after = snapshot();
                if (!streq(before, after))
                        fail_msg(
                                "after a failure at rename %u of %u the directory changed:\n%s\n----\n%s",
                                k,
                                steps,
                                before,
                                after);
        }
}

static void test_failure_at_each_step_restores(void **state) {
        fail_at_each_step(replace_items, ELEMENTSOF(replace_items), 6, /* old_layout= */ false);
}

/* The new build has no layout file: the old one's leaves with the rest of the old image. */
static const OciStaged gone_items[] = {
        { OCI_STAGED_TREE, "sysupdate/base", NULL },     { OCI_STAGED_TREE, "sysupdate/kubernetes", NULL },
        { OCI_STAGED_FILE, "vm_1.0.raw", "vm_1.0.raw" }, { OCI_STAGED_FILE, "policy.json", "policy.json" },
        { OCI_STAGED_GONE, NULL, "vm_1.0.layout.json" },
};

/* At no rename does a rescan list the new disk with the old build's layout, and afterwards the
 * layout is gone. */
static void test_stale_layout_leaves(void **state) {
        _cleanup_free_ char *g = NULL, *layout = NULL;

        make_image(imgdir, "vm_1.0", "old", "1.30.0", "policy.json");
        write_at(imgdir, "vm_1.0.layout.json", "old");
        make_image(stagedir, "vm_1.0", "new", "1.31.0", "policy.json");
        seen_old = seen_new = seen_absent = 0;
        hook.check = check_replace;
        assert_ok(install("vm_1.0", gone_items, ELEMENTSOF(gone_items), NULL));
        hook.check = NULL;

        assert_int_equal(hook.checks, 7); /* hide, two trees, two files, the layout leaves, show */
        assert_int_equal(seen_new, 1);
        g = observe("vm_1.0", true);
        assert_string_equal(g, "new");
        assert_true(asprintf(&layout, "%s/vm_1.0.layout.json", imgdir) >= 0);
        assert_true(access(layout, F_OK) < 0 && errno == ENOENT);
}

/* Nothing to remove: no rename for it, and the install is as without the item. */
static void test_no_layout_to_remove(void **state) {
        _cleanup_free_ char *g = NULL;

        make_image(imgdir, "vm_1.0", "old", "1.30.0", "policy.json");
        make_image(stagedir, "vm_1.0", "new", "1.31.0", "policy.json");
        assert_ok(install("vm_1.0", gone_items, ELEMENTSOF(gone_items), NULL));
        assert_int_equal(hook.calls, 6);
        g = observe("vm_1.0", true);
        assert_string_equal(g, "new");
}

static void test_failure_restores_the_layout(void **state) {
        fail_at_each_step(gone_items, ELEMENTSOF(gone_items), 7, /* old_layout= */ true);
}

/* A first install into an empty directory creates sysupdate/; a failure removes it again. */
static void test_fresh_directory(void **state) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *g = NULL, *sys = NULL;

        make_image(stagedir, "vm_1.0", "new", "1.31.0", "policy.json");
        hook.fail_at = 4; /* the disk, after the two trees */
        assert_errno(install("vm_1.0", replace_items, ELEMENTSOF(replace_items), &e), -EIO);
        assert_true(asprintf(&sys, "%s/sysupdate", imgdir) >= 0);
        assert_true(access(sys, F_OK) < 0);
        hook = (typeof(hook)){};
        assert_ok(install("vm_1.0", replace_items, ELEMENTSOF(replace_items), NULL));
        g = observe("vm_1.0", true);
        assert_string_equal(g, "new");
}

static void test_policy_modes(void **state) {
        assert_int_equal(oci_policy_mode_from_string("keep"), OCI_POLICY_KEEP);
        assert_int_equal(oci_policy_mode_from_string("replace"), OCI_POLICY_REPLACE);
        assert_int_equal(oci_policy_mode_from_string("merge"), _OCI_POLICY_MODE_INVALID);
        assert_int_equal(oci_policy_mode_from_string(NULL), _OCI_POLICY_MODE_INVALID);
        assert_string_equal(oci_policy_mode_to_string(OCI_POLICY_REPLACE), "replace");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_replace_is_never_half, setup, teardown),
                cmocka_unit_test_setup_teardown(test_add_version, setup, teardown),
                cmocka_unit_test_setup_teardown(test_failure_at_each_step_restores, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stale_layout_leaves, setup, teardown),
                cmocka_unit_test_setup_teardown(test_no_layout_to_remove, setup, teardown),
                cmocka_unit_test_setup_teardown(test_failure_restores_the_layout, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fresh_directory, setup, teardown),
                cmocka_unit_test(test_policy_modes),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
