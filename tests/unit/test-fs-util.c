/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"

/* This binary is linked with -Wl,--wrap=renameat -Wl,--wrap=fsync: every call to them, including
 * those inside libbasic, lands here first, so a test can make the kernel "fail" at a chosen step. */
int __real_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
int __wrap_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
int __real_fsync(int fd);
int __wrap_fsync(int fd);

static struct {
        int renameat_error;   /* errno to fail renameat() with; 0 passes through */
        int fsync_file_error; /* errno to fail fsync() of a regular file with */
        int fsync_dir_error;  /* errno to fail fsync() of a directory with */
        char calls[32];       /* 'F' fsync(file), 'D' fsync(dir), 'R' renameat, in call order */

        /* When set, renameat() first records what a crash at that instant would leave behind. */
        const char *watch_target;
        bool seen_rename;
        char *target_before_rename; /* content of watch_target, NULL if it did not exist */
        char *source_before_rename; /* content of the file about to be renamed over it */
        mode_t source_mode;
} inject;

static void inject_reset(void) {
        free(inject.target_before_rename);
        free(inject.source_before_rename);
        inject = (typeof(inject)){};
}

static void record_call(char c) {
        size_t n = strlen(inject.calls);

        if (n + 1 < sizeof(inject.calls))
                inject.calls[n] = c;
}

/* Reads a whole file with plain libc, for checking results independently of read_full_file(). */
static char *slurp_at(int dirfd, const char *path) {
        _cleanup_close_ int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;

        if (fd < 0)
                return NULL;
        for (;;) {
                char *n = realloc(buf, size + 4096 + 1);
                if (!n)
                        return NULL;
                buf = n;
                ssize_t k = read(fd, buf + size, 4096);
                if (k < 0)
                        return NULL;
                if (k == 0)
                        break;
                size += (size_t) k;
        }
        buf[size] = 0;
        return TAKE_PTR(buf);
}

static char *slurp(const char *path) {
        return slurp_at(AT_FDCWD, path);
}

int __wrap_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
        record_call('R');
        if (inject.watch_target) {
                struct stat st;

                inject.seen_rename = true;
                inject.target_before_rename = slurp(inject.watch_target);
                inject.source_before_rename = slurp_at(olddirfd, oldpath);
                if (fstatat(olddirfd, oldpath, &st, AT_SYMLINK_NOFOLLOW) >= 0)
                        inject.source_mode = st.st_mode & 07777;
        }
        if (inject.renameat_error != 0) {
                errno = inject.renameat_error;
                return -1;
        }
        return __real_renameat(olddirfd, oldpath, newdirfd, newpath);
}

int __wrap_fsync(int fd) {
        struct stat st;
        bool dir = fstat(fd, &st) >= 0 && S_ISDIR(st.st_mode);
        int error = dir ? inject.fsync_dir_error : inject.fsync_file_error;

        record_call(dir ? 'D' : 'F');
        if (error != 0) {
                errno = error;
                return -1;
        }
        return __real_fsync(fd);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static int setup(void **state) {
        char t[] = "/tmp/test-fs-util.XXXXXX";

        if (!mkdtemp(t))
                return -1;
        *state = strdup(t);
        inject_reset();
        return *state ? 0 : -1;
}

static int teardown(void **state) {
        inject_reset();
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

static void put(const char *path, const char *content, mode_t mode) {
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

        assert_true(fd >= 0);
        assert_ok(loop_write(fd, content, strlen(content)));
        assert_ok(RET_NERRNO(fchmod(fd, mode)));
}

static mode_t mode_of(const char *path) {
        struct stat st;

        assert_ok(RET_NERRNO(lstat(path, &st)));
        return st.st_mode;
}

/* How many write_file_atomic() temporary files (".#name.*") are left in dir. */
static unsigned leftover_temp_files(const char *dir) {
        DIR *d = opendir(dir);
        struct dirent *de;
        unsigned n = 0;

        assert_non_null(d);
        while ((de = readdir(d)))
                if (strncmp(de->d_name, ".#", 2) == 0)
                        n++;
        closedir(d);
        return n;
}

static void assert_file_content(const char *path, const char *expected) {
        _cleanup_free_ char *s = slurp(path);

        assert_non_null(s);
        assert_string_equal(s, expected);
}

static void test_write_new_file(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "config.json");
        const char data[] = "{ \"name\": \"vm-1\" }\n";

        assert_ok(write_file_atomic(p, data, strlen(data), 0644));
        assert_file_content(p, data);
        assert_true(S_ISREG(mode_of(p)));
        assert_int_equal(mode_of(p) & 07777, 0644);
        assert_int_equal(leftover_temp_files(dir), 0);

        /* The data is on disk before it replaces the target, and the rename itself is made durable. */
        assert_string_equal(inject.calls, "FRD");
}

static void test_cleanup_removes_only_our_temp_files(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "networks.json"),
                            *ours = join(dir, ".#networks.json.0123456789abcdef"),
                            *other = join(dir, ".#networks.json.not-ours"),
                            *foreign = join(dir, ".#vm.json.0123456789abcdef");

        assert_ok(write_file_atomic(p, "[]\n", 3, 0640));
        assert_ok(write_file_atomic(ours, "x", 1, 0600));
        assert_ok(write_file_atomic(other, "x", 1, 0600));
        assert_ok(write_file_atomic(foreign, "x", 1, 0600));

        /* What a crash between create and rename leaves is removed; nothing else is touched. */
        assert_int_equal(write_file_atomic_cleanup(p), 1);
        assert_int_equal(access(ours, F_OK), -1);
        assert_int_equal(access(other, F_OK), 0);
        assert_int_equal(access(foreign, F_OK), 0);
        assert_file_content(p, "[]\n");
        assert_int_equal(write_file_atomic_cleanup(p), 0);
}

static void test_write_binary_and_empty(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "blob"), *q = join(dir, "empty"), *got = NULL;
        const char data[] = { 'a', 0, 'b', '\n', 0 };
        size_t size;

        assert_ok(write_file_atomic(p, data, sizeof(data), 0600));
        assert_ok(read_full_file(p, 1024, &got, &size));
        assert_int_equal(size, sizeof(data));
        assert_memory_equal(got, data, sizeof(data));

        assert_ok(write_file_atomic(q, NULL, 0, 0600));
        assert_file_content(q, "");
        assert_int_equal(leftover_temp_files(dir), 0);
}

static void test_write_replaces_file(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "state");
        _cleanup_close_ int reader = -EBADF;

        put(p, "old content that is longer than the new one\n", 0600);
        reader = open(p, O_RDONLY | O_CLOEXEC);
        assert_true(reader >= 0);

        assert_ok(write_file_atomic(p, "new\n", 4, 0640));
        assert_file_content(p, "new\n");
        assert_int_equal(mode_of(p) & 07777, 0640);
        assert_int_equal(leftover_temp_files(dir), 0);

        /* A reader that opened the file before still sees the whole old version, never a mix. */
        char buf[128] = {};
        assert_true(pread(reader, buf, sizeof(buf) - 1, 0) > 0);
        assert_string_equal(buf, "old content that is longer than the new one\n");
}

static void test_write_mode_despite_umask(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "a"), *q = join(dir, "b");
        mode_t saved = umask(0077);

        assert_ok(write_file_atomic(p, "x", 1, 0644));
        assert_int_equal(mode_of(p) & 07777, 0644);

        (void) umask(0777);
        assert_ok(write_file_atomic(q, "y", 1, 0755));
        assert_int_equal(mode_of(q) & 07777, 0755);

        /* Narrowing works too: the new file does not inherit the old file's mode. */
        (void) umask(0);
        assert_ok(write_file_atomic(p, "z", 1, 0600));
        assert_int_equal(mode_of(p) & 07777, 0600);

        (void) umask(saved);
}

static void test_write_relative_path(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *cwd = getcwd(NULL, 0), *p = join(dir, "rel");

        assert_non_null(cwd);
        assert_ok(RET_NERRNO(chdir(dir)));
        int r = write_file_atomic("rel", "relative\n", 9, 0644);
        assert_ok(RET_NERRNO(chdir(cwd)));

        assert_ok(r);
        assert_file_content(p, "relative\n");
        assert_int_equal(leftover_temp_files(dir), 0);
}

static void test_write_errors(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *missing = join(dir, "no/such/dir/file"), *slash = join(dir, "sub/"),
                            *sub = join(dir, "sub");

        assert_errno(write_file_atomic(missing, "x", 1, 0644), -ENOENT);
        assert_errno(write_file_atomic(NULL, "x", 1, 0644), -EINVAL);
        assert_errno(write_file_atomic(missing, NULL, 1, 0644), -EINVAL);

        /* A directory is never replaced by a file. */
        assert_ok(RET_NERRNO(mkdir(sub, 0755)));
        assert_errno(write_file_atomic(slash, "x", 1, 0644), -EISDIR);
        assert_errno(write_file_atomic(sub, "x", 1, 0644), -EISDIR);
        assert_true(S_ISDIR(mode_of(sub)));
        assert_int_equal(leftover_temp_files(dir), 0);
        assert_int_equal(leftover_temp_files(sub), 0);
}

static void test_crash_before_rename_keeps_old(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "vm.json");

        put(p, "old\n", 0600);
        inject.watch_target = p;

        assert_ok(write_file_atomic(p, "new content\n", 12, 0644));

        /* Had the machine crashed at the rename, the target would still be the old file, and the new
         * data would already be complete, with its final mode, and synced ('F' before 'R'). */
        assert_true(inject.seen_rename);
        assert_non_null(inject.target_before_rename);
        assert_string_equal(inject.target_before_rename, "old\n");
        assert_non_null(inject.source_before_rename);
        assert_string_equal(inject.source_before_rename, "new content\n");
        assert_int_equal(inject.source_mode, 0644);
        assert_string_equal(inject.calls, "FRD");

        assert_file_content(p, "new content\n");
        assert_int_equal(leftover_temp_files(dir), 0);
}

static void test_rename_failure_keeps_old(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "vm.json");

        put(p, "old\n", 0600);
        inject.renameat_error = EIO;

        assert_errno(write_file_atomic(p, "new content\n", 12, 0644), -EIO);
        assert_file_content(p, "old\n");
        assert_int_equal(mode_of(p) & 07777, 0600);
        assert_int_equal(leftover_temp_files(dir), 0);

        inject.renameat_error = EXDEV;
        assert_errno(write_file_atomic(p, "new content\n", 12, 0644), -EXDEV);
        assert_file_content(p, "old\n");
        assert_int_equal(leftover_temp_files(dir), 0);

        /* Once the fault is gone, the same call succeeds. */
        inject.renameat_error = 0;
        assert_ok(write_file_atomic(p, "new content\n", 12, 0644));
        assert_file_content(p, "new content\n");
}

static void test_rename_failure_new_file(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "fresh");

        inject.renameat_error = ENOSPC;
        assert_errno(write_file_atomic(p, "data", 4, 0644), -ENOSPC);
        assert_errno(RET_NERRNO(access(p, F_OK)), -ENOENT);
        assert_int_equal(leftover_temp_files(dir), 0);
}

static void test_data_fsync_failure_keeps_old(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "vm.json");

        put(p, "old\n", 0600);
        inject.fsync_file_error = EIO;

        assert_errno(write_file_atomic(p, "new content\n", 12, 0644), -EIO);
        assert_file_content(p, "old\n");
        assert_int_equal(mode_of(p) & 07777, 0600);
        assert_int_equal(leftover_temp_files(dir), 0);
        /* Data that may not be on disk is never renamed into place. */
        assert_null(strchr(inject.calls, 'R'));

        inject.fsync_file_error = ENOSPC;
        assert_errno(write_file_atomic(p, "new content\n", 12, 0644), -ENOSPC);
        assert_file_content(p, "old\n");
        assert_int_equal(leftover_temp_files(dir), 0);
}

static void test_dir_fsync_failure_reports_error(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "vm.json");

        put(p, "old\n", 0600);
        inject.fsync_dir_error = EIO;

        /* The rename happened, so the file holds the new content in full, but the caller learns that
         * it may not be durable. */
        assert_errno(write_file_atomic(p, "new content\n", 12, 0644), -EIO);
        assert_file_content(p, "new content\n");
        assert_int_equal(leftover_temp_files(dir), 0);
}

static void test_mkdir_p(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *deep = join(dir, "a/b/c"), *a = join(dir, "a"), *ab = join(dir, "a/b"),
                            *messy = join(dir, "x//y///z/"), *xyz = join(dir, "x/y/z");
        mode_t saved = umask(022);

        assert_ok(mkdir_p(deep, 0750));
        assert_true(S_ISDIR(mode_of(a)));
        assert_true(S_ISDIR(mode_of(ab)));
        assert_true(S_ISDIR(mode_of(deep)));
        assert_int_equal(mode_of(deep) & 07777, 0750);
        assert_int_equal(mode_of(a) & 07777, 0750);

        /* Existing directories are fine, and left as they are. */
        assert_ok(RET_NERRNO(chmod(a, 0700)));
        assert_ok(mkdir_p(deep, 0755));
        assert_ok(mkdir_p(a, 0755));
        assert_ok(mkdir_p(dir, 0755));
        assert_int_equal(mode_of(a) & 07777, 0700);

        assert_ok(mkdir_p(messy, 0755));
        assert_true(S_ISDIR(mode_of(xyz)));

        (void) umask(saved);
}

static void test_mkdir_p_errors(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *file = join(dir, "file"), *below = join(dir, "file/sub/dir");

        put(file, "not a directory", 0644);
        assert_errno(mkdir_p(below, 0755), -ENOTDIR);
        assert_errno(mkdir_p(file, 0755), -ENOTDIR);
        assert_file_content(file, "not a directory");

        assert_errno(mkdir_p("", 0755), -EINVAL);
        assert_errno(mkdir_p(NULL, 0755), -EINVAL);
}

static void test_read_full_file(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "f"), *s = NULL, *t = NULL;
        size_t size = 0;

        put(p, "hello\nworld", 0644);
        assert_ok(read_full_file(p, 1024, &s, &size));
        assert_int_equal(size, 11);
        assert_string_equal(s, "hello\nworld");

        /* ret_size is optional; the buffer is NUL-terminated either way. */
        assert_ok(read_full_file(p, 1024, &t, NULL));
        assert_string_equal(t, "hello\nworld");
}

static void test_read_full_file_large(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "big"), *data = malloc(100001), *s = NULL;
        size_t size = 0;

        assert_non_null(data);
        for (size_t i = 0; i < 100000; i++)
                data[i] = (char) ('a' + i % 26);
        data[100000] = 0;
        put(p, data, 0644);

        assert_ok(read_full_file(p, 100000, &s, &size));
        assert_int_equal(size, 100000);
        assert_memory_equal(s, data, 100000);
        assert_int_equal(s[100000], 0);
}

static void test_read_full_file_limit(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "ten"), *big = join(dir, "big"), *data = malloc(20001), *s = NULL;
        size_t size = 0;

        put(p, "0123456789", 0644);
        assert_ok(read_full_file(p, 10, &s, &size)); /* exactly at the limit */
        assert_int_equal(size, 10);
        assert_string_equal(s, "0123456789");
        s = mfree(s);

        assert_errno(read_full_file(p, 9, &s, &size), -EFBIG);
        assert_null(s);
        assert_errno(read_full_file(p, 0, &s, &size), -EFBIG);
        assert_null(s);

        assert_non_null(data);
        memset(data, 'x', 20000);
        data[20000] = 0;
        put(big, data, 0644);
        assert_errno(read_full_file(big, 4096, &s, &size), -EFBIG);
        assert_errno(read_full_file(big, 19999, &s, &size), -EFBIG);
        assert_null(s);
        assert_ok(read_full_file(big, 20000, &s, &size));
        assert_int_equal(size, 20000);
}

static void test_read_full_file_empty(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *p = join(dir, "empty"), *s = NULL, *t = NULL;
        size_t size = 1;

        put(p, "", 0644);
        assert_ok(read_full_file(p, 1024, &s, &size));
        assert_non_null(s);
        assert_string_equal(s, "");
        assert_int_equal(size, 0);

        size = 1;
        assert_ok(read_full_file(p, 0, &t, &size));
        assert_non_null(t);
        assert_int_equal(size, 0);
}

static void test_read_full_file_errors(void **state) {
        const char *dir = *state;
        _cleanup_free_ char *missing = join(dir, "missing"), *s = NULL;

        assert_errno(read_full_file(dir, 1024, &s, NULL), -EISDIR);
        assert_errno(read_full_file(missing, 1024, &s, NULL), -ENOENT);
        assert_errno(read_full_file(NULL, 1024, &s, NULL), -EINVAL);
        assert_null(s);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_write_new_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_binary_and_empty, setup, teardown),
                cmocka_unit_test_setup_teardown(test_cleanup_removes_only_our_temp_files, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_replaces_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_mode_despite_umask, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_relative_path, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_errors, setup, teardown),
                cmocka_unit_test_setup_teardown(test_crash_before_rename_keeps_old, setup, teardown),
                cmocka_unit_test_setup_teardown(test_rename_failure_keeps_old, setup, teardown),
                cmocka_unit_test_setup_teardown(test_rename_failure_new_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_data_fsync_failure_keeps_old, setup, teardown),
                cmocka_unit_test_setup_teardown(test_dir_fsync_failure_reports_error, setup, teardown),
                cmocka_unit_test_setup_teardown(test_mkdir_p, setup, teardown),
                cmocka_unit_test_setup_teardown(test_mkdir_p_errors, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_full_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_full_file_large, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_full_file_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_full_file_empty, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_full_file_errors, setup, teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
