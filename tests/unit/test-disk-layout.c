/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "disk-layout.h"
#include "fs-util.h"
#include "gpt.h"
#include "host-install.h"

#define ESP "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"
#define ROOT "4f68bce3-e8cd-4db1-96e7-fbcaf984b709"
#define VAR "4d21b016-b534-45c2-a9fb-5c16e091fd2d"
#define ESP_UUID "bf064d66-0504-4883-8e6e-e06160077334"
#define ROOT_UUID "3699d702-14a6-145c-7de9-f06ffb2c2761"

static void guid(const char *s, GptGuid g) {
        assert_ok(gpt_guid_from_string(s, g));
}

static void counting_uuid(GptGuid ret) {
        static uint8_t n;
        memset(ret, 0, 16);
        ret[0] = 0xa0;
        ret[15] = ++n;
}

/* An image table like the real image's: an ESP at 1 MiB (1 MiB), a root after it (2 MiB). */
static GptTable image_table(void) {
        GptTable t = { .first_usable = 34 };
        guid(ESP, t.entries[0].type);
        guid(ESP_UUID, t.entries[0].uuid);
        t.entries[0].first_lba = 2048;
        t.entries[0].last_lba = 4095;
        strcpy(t.entries[0].name, "esp");
        guid(ROOT, t.entries[1].type);
        guid(ROOT_UUID, t.entries[1].uuid);
        t.entries[1].first_lba = 4096;
        t.entries[1].last_lba = 8191;
        t.entries[1].attrs = UINT64_C(1) << GPT_ATTR_READ_ONLY;
        strcpy(t.entries[1].name, "root_1.0");
        t.n_entries = 2;
        guid("30b6ebbf-9747-4434-95d5-532cdb5502ba", t.disk_guid);
        return t;
}

#define IMAGE_SECTORS 10240U /* 5 MiB */
#define HALF ((size_t) 1 << 19)

static void test_guid_strings(void **state) {
        GptGuid g;
        char buf[37];

        assert_ok(gpt_guid_from_string("C12A7328-F81F-11D2-BA4B-00A0C93EC93B", g));
        /* on disk the first three fields are little-endian */
        assert_int_equal(g[0], 0x28);
        assert_int_equal(g[3], 0xc1);
        assert_int_equal(g[4], 0x1f);
        assert_int_equal(g[6], 0xd2);
        assert_int_equal(g[8], 0xba);
        assert_string_equal(gpt_guid_to_string(g, buf), ESP);
        assert_errno(gpt_guid_from_string("c12a7328f81f-11d2-ba4b-00a0c93ec93b00", g), -EINVAL);
        assert_errno(gpt_guid_from_string("c12a7328-f81f-11d2-ba4b-00a0c93ec93g", g), -EINVAL);
        assert_errno(gpt_guid_from_string("", g), -EINVAL);
}

static void test_gpt_roundtrip(void **state) {
        GptTable t = image_table(), back;
        _cleanup_free_ uint8_t *head = NULL, *tail = NULL;
        _cleanup_free_ uint8_t *disk = calloc(IMAGE_SECTORS, GPT_SECTOR);

        assert_non_null(disk);
        assert_ok(gpt_build(&t, IMAGE_SECTORS, &head, &tail));
        /* the protective MBR */
        assert_int_equal(head[450], 0xee);
        assert_int_equal(head[510], 0x55);
        assert_int_equal(head[511], 0xaa);
        memcpy(disk, head, GPT_HEAD_SECTORS * GPT_SECTOR);
        memcpy(disk + (IMAGE_SECTORS - GPT_TAIL_SECTORS) * GPT_SECTOR, tail, GPT_TAIL_SECTORS * GPT_SECTOR);
        assert_ok(gpt_parse(disk, 1 << 20, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, &back));
        assert_int_equal(back.n_entries, 2);
        assert_memory_equal(back.disk_guid, t.disk_guid, 16);
        assert_memory_equal(back.entries[1].uuid, t.entries[1].uuid, 16);
        assert_int_equal(back.entries[1].first_lba, 4096);
        assert_int_equal(back.entries[1].last_lba, 8191);
        assert_int_equal(back.entries[1].attrs, UINT64_C(1) << 60);
        assert_string_equal(back.entries[1].name, "root_1.0");
        assert_int_equal(back.last_usable, IMAGE_SECTORS - 34);
        /* the backup header points back at the primary one */
        assert_memory_equal(disk + (IMAGE_SECTORS - 1) * GPT_SECTOR, "EFI PART", 8);

        /* a flipped bit in an entry breaks the entries' CRC; in the header, the header's */
        disk[2 * GPT_SECTOR + 40] ^= 1;
        assert_errno(gpt_parse(disk, 1 << 20, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, &back), -EBADMSG);
        disk[2 * GPT_SECTOR + 40] ^= 1;
        disk[GPT_SECTOR + 40] ^= 1;
        assert_errno(gpt_parse(disk, 1 << 20, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, &back), -EBADMSG);
        disk[GPT_SECTOR + 40] ^= 1;
        /* the entries must lie within what was read, the partitions within the disk */
        assert_errno(gpt_parse(disk, 8 * GPT_SECTOR, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, &back), -EBADMSG);
        assert_errno(gpt_parse(disk, 1 << 20, 4096 * GPT_SECTOR, &back), -EBADMSG);
        /* no signature at all */
        memset(disk + GPT_SECTOR, 0, 8);
        assert_errno(gpt_parse(disk, 1 << 20, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, &back), -ENOMEDIUM);
}

static void test_gpt_build_refuses(void **state) {
        GptTable t = image_table();
        uint8_t *head = NULL, *tail = NULL;

        /* overlapping entries */
        t.entries[1].first_lba = 4000;
        assert_errno(gpt_build(&t, IMAGE_SECTORS, &head, &tail), -EINVAL);
        t = image_table();
        /* beyond the usable range: into the backup table */
        t.entries[1].last_lba = IMAGE_SECTORS - 2;
        assert_errno(gpt_build(&t, IMAGE_SECTORS, &head, &tail), -EINVAL);
        t = image_table();
        assert_errno(gpt_build(&t, 40, &head, &tail), -EINVAL);
        assert_null(head);
}

#define LAYOUT(parts) "{\"format\":\"vm-manager-layout/1\",\"partitions\":[" parts "]}"
#define P_ESP                                                                               \
        "{\"type\":\"" ESP "\",\"label\":\"esp\",\"content\":\"copy\",\"uuid\":\"" ESP_UUID \
        "\",\"sizeBytes\":2097152}"
#define P_ROOT                                                                              \
        "{\"type\":\"" ROOT "\",\"label\":\"r\",\"content\":\"copy\",\"uuid\":\"" ROOT_UUID \
        "\",\"sizeBytes\":4194304}"
#define P_EMPTY             \
        "{\"type\":\"" ROOT \
        "\",\"label\":\"_empty\",\"content\":\"empty\",\"sizeBytes\":4194304,\"attrBits\":[63]}"
#define P_VAR "{\"type\":\"" VAR "\",\"label\":\"var\",\"content\":\"ext4\",\"grow\":true}"
#define GOOD LAYOUT(P_ESP "," P_ROOT "," P_EMPTY "," P_VAR)

static void test_layout_parse(void **state) {
        static const struct {
                const char *text, *why;
        } bad[] = {
                { "[]", "not a JSON object" },
                { "{\"format\":\"other/1\",\"partitions\":[" P_VAR "]}", "format" },
                { LAYOUT(""), "1 to 128" },
                { LAYOUT(P_VAR "," P_EMPTY), "only the last" },
                { LAYOUT("{\"type\":\"" ROOT "\",\"label\":\"x\",\"content\":\"btrfs\",\"sizeBytes\":512}"),
                  "content" },
                { LAYOUT("{\"type\":\"" ROOT "\",\"label\":\"x\",\"content\":\"empty\",\"sizeBytes\":100}"),
                  "multiple of 512" },
                { LAYOUT("{\"type\":\"" ROOT "\",\"label\":\"x\",\"content\":\"copy\",\"sizeBytes\":512}"),
                  "uuid" },
                { LAYOUT("{\"type\":\"00000000-0000-0000-0000-000000000000\",\"label\":\"x\",\"content\":\"empty\",\"sizeBytes\":512}"),
                  "type" },
                { LAYOUT("{\"type\":\"" ROOT
                         "\",\"label\":\"x\",\"content\":\"empty\",\"sizeBytes\":512,\"attrBits\":[64]}"),
                  "attrBits" },
                { LAYOUT("{\"type\":\"" ROOT
                         "\",\"label\":\"0123456789012345678901234567890123456\",\"content\":\"empty\",\"sizeBytes\":512}"),
                  "36 characters" },
        };
        DiskLayout l;
        const char *why = NULL;

        assert_ok(disk_layout_parse(GOOD, strlen(GOOD), &l, &why));
        assert_int_equal(l.n, 4);
        assert_int_equal(l.p[0].content, DISK_CONTENT_COPY);
        assert_int_equal(l.p[2].attrs, UINT64_C(1) << 63);
        assert_true(l.p[3].grow);
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                why = NULL;
                assert_errno(disk_layout_parse(bad[i].text, strlen(bad[i].text), &l, &why), -EBADMSG);
                assert_non_null(why);
                assert_contains(why, bad[i].why);
        }
}

static void test_plan(void **state) {
        GptTable img = image_table();
        DiskLayout l;
        DiskPlan p;
        const char *why = NULL;
        uint64_t disk = (uint64_t) 512 << 20;

        assert_ok(disk_layout_parse(GOOD, strlen(GOOD), &l, &why));
        assert_ok(disk_plan_make(
                &l, &img, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, disk, counting_uuid, &p, &why));
        assert_int_equal(p.n, 4);
        /* 1 MiB aligned, in order; the copies keep the image's UUIDs, names and attributes */
        assert_int_equal(p.steps[0].offset, 1 << 20);
        assert_int_equal(p.steps[0].src_offset, 2048 * 512);
        assert_int_equal(p.steps[0].src_size, 1 << 20);
        assert_int_equal(p.steps[1].offset, 3 << 20);
        assert_memory_equal(p.table.entries[1].uuid, img.entries[1].uuid, 16);
        assert_string_equal(p.table.entries[1].name, "root_1.0");
        assert_int_equal(p.table.entries[1].attrs, UINT64_C(1) << 60);
        assert_int_equal(p.steps[2].offset, 7 << 20);
        assert_int_equal(p.table.entries[2].uuid[0], 0xa0);
        /* var takes the rest, up to the backup table */
        assert_int_equal(p.steps[3].offset, 11 << 20);
        assert_true(p.steps[3].offset + p.steps[3].size <= disk - 33 * 512);
        assert_true(p.steps[3].offset + p.steps[3].size > disk - (1 << 20));

        /* too small a disk */
        assert_errno(
                disk_plan_make(
                        &l, &img, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, 64 << 20, counting_uuid, &p, &why),
                -ENOSPC);
        /* a source the image does not have, or of another type, or beyond the image, or larger than its slot */
        img.entries[1].uuid[0] ^= 1;
        assert_errno(
                disk_plan_make(&l, &img, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, disk, counting_uuid, &p, &why),
                -EBADMSG);
        assert_contains(why, "no partition with a UUID");
        img = image_table();
        guid(VAR, img.entries[1].type);
        assert_errno(
                disk_plan_make(&l, &img, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, disk, counting_uuid, &p, &why),
                -EBADMSG);
        assert_contains(why, "type differs");
        img = image_table();
        assert_errno(disk_plan_make(&l, &img, 6000 * GPT_SECTOR, disk, counting_uuid, &p, &why), -EBADMSG);
        assert_contains(why, "beyond the end");
        l.p[1].size = 1 << 20;
        assert_errno(
                disk_plan_make(&l, &img, (uint64_t) IMAGE_SECTORS * GPT_SECTOR, disk, counting_uuid, &p, &why),
                -EBADMSG);
        assert_contains(why, "larger than its slot");
}

/* The helper's work on files: an image made here, a sparse disk laid out, read back. */
static void test_host_install(void **state) {
        _cleanup_free_ char *dir = strdup("/tmp/test-disk-layout-XXXXXX"), *image = NULL, *layout = NULL,
                            *disk = NULL, *back = NULL;
        _cleanup_free_ uint8_t *head = NULL, *tail = NULL, *buf = NULL, *root = NULL;
        _cleanup_close_ int fd = -EBADF;
        GptTable t = image_table(), got;
        HostInstallStats st = {};
        const uint64_t disk_size = (uint64_t) 512 << 20;

        assert_non_null(mkdtemp(dir));
        assert_true(asprintf(&image, "%s/img.raw", dir) > 0);
        assert_true(asprintf(&layout, "%s/img.layout.json", dir) > 0);
        assert_true(asprintf(&disk, "%s/disk", dir) > 0);

        /* the image: its table, a root of a recognisable pattern with a hole in the middle */
        assert_ok(gpt_build(&t, IMAGE_SECTORS, &head, &tail));
        fd = open(image, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_ok(ftruncate(fd, (off_t) IMAGE_SECTORS * GPT_SECTOR));
        assert_int_equal(pwrite(fd, head, GPT_HEAD_SECTORS * GPT_SECTOR, 0), GPT_HEAD_SECTORS * GPT_SECTOR);
        assert_int_equal(pwrite(fd, tail, GPT_TAIL_SECTORS * GPT_SECTOR, (IMAGE_SECTORS - 33) * 512), 33 * 512);
        root = malloc(HALF);
        assert_non_null(root);
        for (size_t i = 0; i < HALF; i++)
                root[i] = (uint8_t) (i * 7 + 1);
        /* the root is [2 MiB, 4 MiB) of the image: data, a hole of 1 MiB, data */
        assert_int_equal(pwrite(fd, root, HALF, 2 << 20), HALF);
        assert_int_equal(pwrite(fd, root, HALF, (2 << 20) + 3 * HALF), HALF);
        fd = safe_close(fd);
        assert_ok(write_file_atomic(layout, GOOD, strlen(GOOD), 0644));

        /* a disk with stale bytes where the table goes */
        fd = open(disk, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_ok(ftruncate(fd, (off_t) disk_size));
        assert_int_equal(pwrite(fd, "junk", 4, (3 << 20) + (1 << 20) + 10), 4);

        assert_ok(host_install_run(image, layout, disk, disk_size, NULL, &st));
        buf = malloc(1 << 20);
        assert_non_null(buf);
        assert_int_equal(pread(fd, buf, 1 << 20, 0), 1 << 20);
        assert_ok(gpt_parse(buf, 1 << 20, disk_size, &got));
        assert_int_equal(got.n_entries, 4);
        assert_memory_equal(got.entries[1].uuid, t.entries[1].uuid, 16);
        /* the root (at 3 MiB) copied with its hole: the stale junk in the hole is gone */
        assert_int_equal(pread(fd, buf, HALF, 3 << 20), HALF);
        assert_memory_equal(buf, root, HALF);
        assert_int_equal(pread(fd, buf, 1 << 20, (3 << 20) + HALF), 1 << 20);
        for (size_t i = 0; i < (1 << 20); i++)
                assert_int_equal(buf[i], 0);
        assert_int_equal(pread(fd, buf, HALF, (3 << 20) + 3 * HALF), HALF);
        assert_memory_equal(buf, root, HALF);
        /* var is ext4 (its superblock's magic) */
        assert_int_equal(pread(fd, buf, 2, (off_t) (got.entries[3].first_lba * 512 + 1024 + 56)), 2);
        assert_int_equal(buf[0], 0x53);
        assert_int_equal(buf[1], 0xef);

        /* a layout the image does not match: the install fails and leaves no table */
        assert_ok(unlink(layout));
        assert_ok(write_file_atomic(
                layout, LAYOUT(P_ROOT "," P_ROOT), strlen(LAYOUT(P_ROOT "," P_ROOT)), 0644));
        assert_true(host_install_run(image, layout, disk, disk_size, NULL, &st) < 0);
        /* the plan fails before the disk is touched: the old table is still there */
        assert_int_equal(pread(fd, buf, 1 << 20, 0), 1 << 20);
        assert_ok(gpt_parse(buf, 1 << 20, disk_size, &got));
        /* a failure after the copies (no mke2fs to run) leaves no table */
        assert_ok(unlink(layout));
        assert_ok(write_file_atomic(layout, GOOD, strlen(GOOD), 0644));
        back = strdup(getenv("PATH") ?: "/usr/sbin:/usr/bin:/sbin:/bin");
        assert_non_null(back);
        assert_ok(setenv("PATH", dir, 1));
        assert_true(host_install_run(image, layout, disk, disk_size, NULL, &st) < 0);
        assert_ok(setenv("PATH", back, 1));
        assert_int_equal(pread(fd, buf, 1 << 20, 0), 1 << 20);
        assert_errno(gpt_parse(buf, 1 << 20, disk_size, &got), -ENOMEDIUM);

        /* a file for var under a path that leaves var's root, or from a source that is not there:
         * refused at var's step, after the copies, so again no table is left */
        static const HostInstallSeed bad[] = {
                { .source = "/dev/null", .path = "../outside" },
                { .source = "/dev/null", .path = "/abs" },
                { .source = "/dev/null", .path = "lib//x" },
                { .source = "/dev/null", .path = "lib/./x" },
                { .source = "/dev/null", .path = "lib/x/" },
                { .source = "/dev/null", .path = "" },
                { .source = "/nonexistent/x", .path = "lib/x" },
                { .source = "/dev/null", .path = "lib/x" },
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                assert_ok(host_install_run(image, layout, disk, disk_size, NULL, &st));
                assert_true(host_install_run(image, layout, disk, disk_size, &bad[i], &st) < 0);
                assert_int_equal(pread(fd, buf, 1 << 20, 0), 1 << 20);
                assert_errno(gpt_parse(buf, 1 << 20, disk_size, &got), -ENOMEDIUM);
        }

        /* a good seed, but a layout that formats no file system to put it into: refused, no table */
        assert_ok(unlink(layout));
        assert_ok(write_file_atomic(layout, LAYOUT(P_ESP "," P_ROOT), strlen(LAYOUT(P_ESP "," P_ROOT)), 0644));
        assert_ok(host_install_run(image, layout, disk, disk_size, NULL, &st)); /* a table to lose */
        assert_true(
                host_install_run(
                        image,
                        layout,
                        disk,
                        disk_size,
                        &(HostInstallSeed){ .source = image, .path = "lib/x" },
                        &st) < 0);
        assert_int_equal(pread(fd, buf, 1 << 20, 0), 1 << 20);
        assert_errno(gpt_parse(buf, 1 << 20, disk_size, &got), -ENOMEDIUM);

        assert_ok(rm_rf(dir));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_guid_strings),
                cmocka_unit_test(test_gpt_roundtrip),
                cmocka_unit_test(test_gpt_build_refuses),
                cmocka_unit_test(test_layout_parse),
                cmocka_unit_test(test_plan),
                cmocka_unit_test(test_host_install),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
