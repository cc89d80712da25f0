/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Where a firmware run's kernel comes from when the host has none (a daemon in a container): the
 * .linux of the newest UKI in the image directory, byte for byte the kernel the UKI carries. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs-util.h"
#include "manager-firmware.h"
#include "test-util.h"

static char *data_path(const char *name) {
        const char *dir = getenv("VM_MANAGER_TEST_DATA");
        char *p = NULL;

        assert_non_null(dir);
        assert_true(asprintf(&p, "%s/attest/pe/%s", dir, name) > 0);
        return p;
}

static void copy_to(const char *name, const char *dir, const char *as, time_t mtime) {
        _cleanup_free_ char *src = data_path(name), *dst = NULL, *data = NULL;
        size_t size = 0;

        assert_ok(read_full_file(src, 16U << 20, &data, &size));
        assert_true(asprintf(&dst, "%s/%s", dir, as) > 0);
        assert_ok(write_file_atomic(dst, data, size, 0644));
        assert_ok(utimensat(AT_FDCWD, dst, (struct timespec[]){ { .tv_sec = mtime }, { .tv_sec = mtime } }, 0));
}

static void test_uki_kernel(void **state) {
        char dir[] = "/tmp/test-manager-firmware.XXXXXX";
        _cleanup_free_ char *out = NULL, *source = NULL, *got = NULL, *want = NULL, *kernel = NULL,
                            *images = NULL;
        size_t got_size = 0, want_size = 0;

        assert_non_null(mkdtemp(dir));
        assert_true(asprintf(&out, "%s/vmlinuz", dir) > 0);
        assert_true(asprintf(&images, "%s/images", dir) > 0);
        assert_ok(mkdir(images, 0755));

        /* no image, no kernel */
        assert_int_equal(firmware_run_uki_kernel(images, out, &source), -ENOENT);
        assert_null(source);

        /* the newest UKI counts: an older image without .linux is passed over */
        copy_to("kernel.efi", images, "old_1.0.efi", 1000);
        copy_to("uki.efi", images, "flatcar_2.0.efi", 2000);
        assert_ok(firmware_run_uki_kernel(images, out, &source));
        kernel = data_path("kernel.efi");
        assert_ok(read_full_file(kernel, 16U << 20, &want, &want_size));
        assert_ok(read_full_file(out, 16U << 20, &got, &got_size));
        assert_int_equal(got_size, want_size);
        assert_memory_equal(got, want, want_size);
        assert_non_null(strstr(source, "/flatcar_2.0.efi (.linux)"));

        /* a newer image whose UKI has no .linux: said so, not skipped silently */
        copy_to("kernel.efi", images, "broken_3.0.efi", 3000);
        free(source);
        source = NULL;
        assert_int_equal(firmware_run_uki_kernel(images, out, &source), -ENOEXEC);
        assert_null(source);

        assert_ok(rm_rf(dir));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_uki_kernel),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
