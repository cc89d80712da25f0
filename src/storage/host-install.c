/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "disk-layout.h"
#include "fs-util.h"
#include "host-install.h"
#include "macro.h"
#include "parse-util.h"

#define HEAD_BYTES ((uint64_t) 1 << 20) /* read from the image for its table; zeroed on the target */
#define CHUNK ((size_t) 1 << 20)

extern char **environ;

static int say(int r, const char *fmt, ...) _printf_(2, 3);
static int say(int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        fputs("host-install: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        return r;
}

static void random_uuid(GptGuid ret) {
        if (getrandom(ret, 16, 0) != 16)
                abort();
        ret[7] = (ret[7] & 0x0f) | 0x40; /* version 4 (the third field is little-endian) */
        ret[8] = (ret[8] & 0x3f) | 0x80;
}

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
        const uint8_t *p = buf;

        while (n > 0) {
                ssize_t k = pwrite(fd, p, n, (off_t) off);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += k;
                n -= (size_t) k;
                off += (uint64_t) k;
        }
        return 0;
}

/* Zeros [off, off + len): a hole punched in a file, BLKZEROOUT on a block device, written zeros where
 * neither works. */
static int zero_range(int fd, bool blockdev, uint64_t off, uint64_t len, HostInstallStats *st) {
        static const uint8_t zeros[65536];

        if (len == 0)
                return 0;
        st->zeroed += len;
        if (!blockdev &&
            fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t) off, (off_t) len) >= 0)
                return 0;
        if (blockdev && ioctl(fd, BLKZEROOUT, (uint64_t[2]){ off, len }) >= 0)
                return 0;
        while (len > 0) {
                size_t n = len < sizeof(zeros) ? (size_t) len : sizeof(zeros);
                int r = pwrite_all(fd, zeros, n, off);
                if (r < 0)
                        return r;
                off += n;
                len -= n;
        }
        return 0;
}

/* One extent of data: reflinked where the file system shares blocks (both ends 4 KiB aligned),
 * else copy_file_range, else read and write. */
static int copy_extent(int src, uint64_t soff, int dst, uint64_t doff, uint64_t len, HostInstallStats *st) {
        _cleanup_free_ uint8_t *buf = NULL;

        if (soff % 4096 == 0 && doff % 4096 == 0 && len % 4096 == 0) {
                struct file_clone_range fcr = {
                        .src_fd = src, .src_offset = soff, .src_length = len, .dest_offset = doff
                };
                if (ioctl(dst, FICLONERANGE, &fcr) >= 0) {
                        st->cloned += len;
                        return 0;
                }
        }
        while (len > 0) {
                loff_t a = (loff_t) soff, b = (loff_t) doff;
                ssize_t k = copy_file_range(src, &a, dst, &b, len, 0);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        break; /* EXDEV, EINVAL, EOPNOTSUPP, a short source: the plain way */
                soff += (uint64_t) k;
                doff += (uint64_t) k;
                len -= (uint64_t) k;
                st->copied += (uint64_t) k;
        }
        if (len == 0)
                return 0;
        buf = malloc(CHUNK);
        if (!buf)
                return -ENOMEM;
        while (len > 0) {
                size_t n = len < CHUNK ? (size_t) len : CHUNK;
                ssize_t k = pread(src, buf, n, (off_t) soff);
                int r;

                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return k < 0 ? -errno : -EIO;
                r = pwrite_all(dst, buf, (size_t) k, doff);
                if (r < 0)
                        return r;
                soff += (uint64_t) k;
                doff += (uint64_t) k;
                len -= (uint64_t) k;
                st->copied += (uint64_t) k;
        }
        return 0;
}

/* A partition of the image onto the target, its holes as holes (or zeros) there. */
static int copy_partition(int src, const DiskPlanStep *s, int dst, bool blockdev, HostInstallStats *st) {
        uint64_t at = s->src_offset, end = s->src_offset + s->src_size;
        int r;

        while (at < end) {
                off_t data = lseek(src, (off_t) at, SEEK_DATA), hole;

                if (data < 0 && errno == ENXIO)
                        data = (off_t) end; /* only a hole is left */
                else if (data < 0)
                        data = (off_t) at; /* no SEEK_DATA: all data */
                if ((uint64_t) data > end)
                        data = (off_t) end;
                r = zero_range(dst, blockdev, s->offset + (at - s->src_offset), (uint64_t) data - at, st);
                if (r < 0)
                        return r;
                at = (uint64_t) data;
                if (at >= end)
                        break;
                hole = lseek(src, data, SEEK_HOLE);
                if (hole < 0 || (uint64_t) hole > end)
                        hole = (off_t) end;
                r = copy_extent(src, at, dst, s->offset + (at - s->src_offset), (uint64_t) hole - at, st);
                if (r < 0)
                        return r;
                at = (uint64_t) hole;
        }
        /* the slot beyond the copied bytes */
        return zero_range(dst, blockdev, s->offset + s->src_size, s->size - s->src_size, st);
}

/* A seed's path: relative, no empty, "." or ".." component. */
static bool seed_path_ok(const char *path) {
        if (!path || !*path || path[0] == '/')
                return false;
        for (const char *p = path; *p;) {
                size_t n = strcspn(p, "/");
                if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
                        return false;
                p += n;
                if (*p == '/')
                        p++;
                if (*p == 0 && p[-1] == '/')
                        return false;
        }
        return true;
}

/* The directory mke2fs -d copies the seed from: <dir>/<path>. */
typedef struct SeedStage {
        char *dir, *file;
} SeedStage;

/* Removes the staged file and every directory up to and including the stage itself: file is
 * <dir>/<path>, so each '/' at or after dir's end ends one of them. */
static void seed_stage_done(SeedStage *s) {
        if (s->file) {
                size_t keep = strlen(s->dir);
                (void) unlink(s->file);
                for (char *slash; (slash = strrchr(s->file, '/')) && (size_t) (slash - s->file) >= keep;) {
                        *slash = 0;
                        (void) rmdir(s->file);
                }
        } else if (s->dir)
                (void) rmdir(s->dir);
        s->file = mfree(s->file);
        s->dir = mfree(s->dir);
}

static int seed_stage(const HostInstallSeed *seed, SeedStage *ret, HostInstallStats *st) {
        _cleanup_close_ int src = -EBADF, dst = -EBADF;
        struct stat sst;
        int r;

        if (!seed_path_ok(seed->path))
                return say(-EINVAL, "bad path for %s in the file system: '%s'", seed->source, seed->path);
        src = open(seed->source, O_RDONLY | O_CLOEXEC);
        if (src < 0 || fstat(src, &sst) < 0)
                return say(-errno, "cannot open %s: %m", seed->source);
        if (!S_ISREG(sst.st_mode))
                return say(-EINVAL, "%s is not a regular file", seed->source);
        ret->dir = strdup("var-seed.XXXXXX");
        if (!ret->dir)
                return say(-ENOMEM, "out of memory");
        if (!mkdtemp(ret->dir)) {
                r = -errno;
                ret->dir = mfree(ret->dir);
                return say(r, "cannot make a staging directory in the working directory: %s", strerror(-r));
        }
        /* mke2fs -d gives the file system's root the stage's mode: that of /var, not mkdtemp's 0700 */
        if (chmod(ret->dir, 0755) < 0 || asprintf(&ret->file, "%s/%s", ret->dir, seed->path) < 0) {
                ret->file = NULL;
                return say(-errno, "cannot prepare the staging directory: %m");
        }
        for (char *p = ret->file + strlen(ret->dir) + 1; (p = strchr(p, '/')); p++) {
                *p = 0;
                r = mkdir(ret->file, 0755) < 0 && errno != EEXIST ? -errno : 0;
                *p = '/';
                if (r < 0)
                        return say(r, "cannot make the staging directory for %s: %s", seed->path, strerror(-r));
        }
        dst = open(ret->file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
        if (dst < 0)
                return say(-errno, "cannot stage %s: %m", seed->path);
        r = copy_extent(src, 0, dst, 0, (uint64_t) sst.st_size, st);
        if (r < 0)
                return say(r, "cannot stage %s: %s", seed->path, strerror(-r));
        return 0;
}

/* from: NULL, or a directory whose tree the new file system starts with (mke2fs -d). */
static int run_mke2fs(const char *target, const DiskPlanStep *s, const GptEntry *e, const char *from) {
        char opts[128], size[32], uuid[37];
        char *argv[16] = { (char *) "mke2fs",
                           (char *) "-q",
                           (char *) "-F",
                           (char *) "-t",
                           (char *) "ext4",
                           (char *) "-L",
                           (char *) e->name,
                           (char *) "-U",
                           uuid,
                           (char *) "-E",
                           opts };
        size_t n = 11;
        pid_t pid;
        int status, r;

        if (from) {
                argv[n++] = (char *) "-d";
                argv[n++] = (char *) from;
        }
        argv[n++] = (char *) target;
        argv[n++] = size;
        argv[n] = NULL;
        /* the file system's UUID need not be the partition's; a fresh one */
        {
                GptGuid g;
                random_uuid(g);
                gpt_guid_to_string(g, uuid);
        }
        snprintf(opts, sizeof(opts), "offset=%" PRIu64 ",nodiscard", s->offset);
        snprintf(size, sizeof(size), "%" PRIu64 "k", s->size / 1024);
        r = posix_spawnp(&pid, "mke2fs", NULL, NULL, argv, environ);
        if (r != 0)
                return say(-r, "cannot run mke2fs: %s", strerror(r));
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return say(-errno, "waiting for mke2fs: %m");
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                return say(-EIO, "mke2fs failed for partition %s (status %d)", e->name, status);
        return 0;
}

static int target_size(int fd, bool *ret_blockdev, uint64_t *ret) {
        struct stat st;

        if (fstat(fd, &st) < 0)
                return -errno;
        *ret_blockdev = S_ISBLK(st.st_mode);
        if (S_ISBLK(st.st_mode))
                return ioctl(fd, BLKGETSIZE64, ret) < 0 ? -errno : 0;
        if (!S_ISREG(st.st_mode))
                return -ENOTBLK;
        *ret = (uint64_t) st.st_size;
        return 0;
}

static int wipe_table(int fd, bool blockdev, uint64_t disk, HostInstallStats *st) {
        int r = zero_range(fd, blockdev, 0, HEAD_BYTES, st);
        if (r >= 0)
                r = zero_range(fd, blockdev, disk - HEAD_BYTES, HEAD_BYTES, st);
        if (r >= 0 && fsync(fd) < 0)
                r = -errno;
        return r;
}

static int
        lay_out(int src,
                int dst,
                bool blockdev,
                const char *target,
                uint64_t disk,
                const DiskPlan *plan,
                const HostInstallSeed *seed,
                HostInstallStats *st) {
        _cleanup_free_ uint8_t *head = NULL, *tail = NULL;
        _cleanup_(seed_stage_done) SeedStage stage = {};
        bool seeded = false;
        int r;

        r = gpt_build(&plan->table, disk / GPT_SECTOR, &head, &tail);
        if (r < 0)
                return say(r, "cannot build the partition table: %s", strerror(-r));
        for (size_t i = 0; i < plan->n; i++) {
                const DiskPlanStep *s = &plan->steps[i];
                const GptEntry *e = &plan->table.entries[i];

                switch (s->content) {
                case DISK_CONTENT_COPY:
                        r = copy_partition(src, s, dst, blockdev, st);
                        if (r < 0)
                                return say(r, "copying partition %s: %s", e->name, strerror(-r));
                        break;
                case DISK_CONTENT_EMPTY:
                        r = zero_range(dst, blockdev, s->offset, s->size, st);
                        if (r < 0)
                                return say(r, "clearing partition %s: %s", e->name, strerror(-r));
                        break;
                case DISK_CONTENT_EXT4:
                        r = zero_range(dst, blockdev, s->offset, s->size, st);
                        if (r < 0)
                                return say(r, "clearing partition %s: %s", e->name, strerror(-r));
                        if (fsync(dst) < 0)
                                return say(-errno, "flushing %s: %m", target);
                        /* the seed goes into the first file system formatted (var) */
                        if (seed && !seeded) {
                                r = seed_stage(seed, &stage, st);
                                if (r < 0)
                                        return r;
                                seeded = true;
                        }
                        r = run_mke2fs(target, s, e, stage.dir);
                        seed_stage_done(&stage);
                        if (r < 0)
                                return r;
                        break;
                default:
                        return say(-EINVAL, "unknown content of partition %s", e->name);
                }
        }
        if (seed && !seeded)
                return say(-EINVAL, "the layout formats no file system to put %s into", seed->path);
        /* the data first, then the backup table, then the primary one: only a complete disk has one */
        if (fsync(dst) < 0)
                return say(-errno, "flushing %s: %m", target);
        r = pwrite_all(dst, tail, GPT_TAIL_SECTORS * GPT_SECTOR, disk - GPT_TAIL_SECTORS * GPT_SECTOR);
        if (r >= 0 && fsync(dst) < 0)
                r = -errno;
        if (r >= 0)
                r = pwrite_all(dst, head, GPT_HEAD_SECTORS * GPT_SECTOR, 0);
        if (r >= 0 && fsync(dst) < 0)
                r = -errno;
        if (r < 0)
                return say(r, "writing the partition table to %s: %s", target, strerror(-r));
        return 0;
}

int host_install_run(
        const char *image,
        const char *layout,
        const char *target,
        uint64_t disk_size,
        const HostInstallSeed *seed,
        HostInstallStats *ret) {
        _cleanup_free_ char *text = NULL;
        _cleanup_free_ uint8_t *head = NULL;
        _cleanup_free_ DiskLayout *l = NULL;
        _cleanup_free_ GptTable *img = NULL;
        _cleanup_free_ DiskPlan *plan = NULL;
        _cleanup_close_ int src = -EBADF, dst = -EBADF;
        HostInstallStats st = {};
        const char *why = NULL;
        struct stat ist;
        uint64_t disk;
        bool blockdev;
        size_t size;
        ssize_t k;
        int r;

        l = calloc(1, sizeof(DiskLayout));
        img = calloc(1, sizeof(GptTable));
        plan = calloc(1, sizeof(DiskPlan));
        head = malloc(HEAD_BYTES);
        if (!l || !img || !plan || !head)
                return say(-ENOMEM, "out of memory");

        r = read_full_file(layout, DISK_LAYOUT_SIZE_MAX, &text, &size);
        if (r < 0)
                return say(r, "cannot read the layout file %s: %s", layout, strerror(-r));
        r = disk_layout_parse(text, size, l, &why);
        if (r < 0)
                return say(r, "bad layout file %s: %s", layout, why ?: strerror(-r));

        src = open(image, O_RDONLY | O_CLOEXEC);
        if (src < 0 || fstat(src, &ist) < 0)
                return say(-errno, "cannot open the image %s: %m", image);
        k = pread(src, head, HEAD_BYTES, 0);
        if (k < 0)
                return say(-errno, "cannot read the image %s: %m", image);
        r = gpt_parse(head, (size_t) k, (uint64_t) ist.st_size, img);
        if (r < 0)
                return say(r, "the image %s has no valid GPT partition table", image);

        dst = open(target, O_RDWR | O_CLOEXEC);
        if (dst < 0)
                return say(-errno, "cannot open the disk %s: %m", target);
        r = target_size(dst, &blockdev, &disk);
        if (r < 0)
                return say(r, "cannot size the disk %s: %s", target, strerror(-r));
        /* a provider may round a volume up; never down */
        if (disk_size > 0 && disk < disk_size)
                return say(
                        -EINVAL, "the disk %s is %" PRIu64 " bytes, less than %" PRIu64, target, disk, disk_size);
        r = disk_plan_make(l, img, (uint64_t) ist.st_size, disk, random_uuid, plan, &why);
        if (r < 0)
                return say(r, "cannot lay out the disk: %s", why ?: strerror(-r));
        random_uuid(plan->table.disk_guid);

        r = wipe_table(dst, blockdev, disk, &st);
        if (r < 0)
                return say(r, "clearing the partition table of %s: %s", target, strerror(-r));
        r = lay_out(src, dst, blockdev, target, disk, plan, seed, &st);
        if (r < 0) {
                (void) wipe_table(dst, blockdev, disk, &st);
                return r;
        }
        if (ret)
                *ret = st;
        return 0;
}

int host_install_main(int argc, char **argv) {
        HostInstallStats st = {};
        uint64_t size = 0;
        int r;

        if (argc < 3 || argc > 6 || argc == 5) {
                fprintf(stderr,
                        "Usage: vm-manager host-install IMAGE LAYOUT TARGET [SIZE [VAR_FILE VAR_PATH]]\n");
                return 2;
        }
        if (argc >= 4 && parse_size(argv[3], &size) < 0) {
                fprintf(stderr, "host-install: bad size '%s'\n", argv[3]);
                return 2;
        }
        r = host_install_run(
                argv[0],
                argv[1],
                argv[2],
                size,
                argc == 6 ? &(HostInstallSeed){ .source = argv[4], .path = argv[5] } : NULL,
                &st);
        if (r < 0)
                return 1;
        fprintf(stderr,
                "host-install: done: %" PRIu64 " bytes copied, %" PRIu64 " reflinked, %" PRIu64 " zeroed\n",
                st.copied,
                st.cloned,
                st.zeroed);
        return 0;
}
