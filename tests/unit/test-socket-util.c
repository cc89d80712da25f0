/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "socket-util.h"

static void test_sockaddr_un_set_path(void **state) {
        struct sockaddr_un sa = { .sun_family = AF_UNSPEC };
        char path[SOCKADDR_UN_PATH_MAX + 2];

        assert_int_equal(sockaddr_un_set_path(&sa, "/run/x.sock"), offsetof(struct sockaddr_un, sun_path) + 12);
        assert_int_equal(sa.sun_family, AF_UNIX);
        assert_string_equal(sa.sun_path, "/run/x.sock");

        memset(path, 'a', sizeof(path));
        path[0] = '/';
        path[SOCKADDR_UN_PATH_MAX] = 0; /* the longest that fits */
        assert_int_equal(sockaddr_un_set_path(&sa, path), sizeof(struct sockaddr_un));
        path[SOCKADDR_UN_PATH_MAX] = 'a';
        path[SOCKADDR_UN_PATH_MAX + 1] = 0;
        sa = (struct sockaddr_un){ .sun_family = AF_UNSPEC };
        assert_errno(sockaddr_un_set_path(&sa, path), -ENAMETOOLONG);
        assert_errno(sockaddr_un_set_path(&sa, ""), -EINVAL);
        assert_errno(sockaddr_un_set_path(&sa, NULL), -EINVAL);
        assert_int_equal(sa.sun_family, AF_UNSPEC); /* untouched */
}

static void test_listen_connect(void **state) {
        char dir[] = "/tmp/test-socket-util-XXXXXX";
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int l = -EBADF, c = -EBADF, a = -EBADF, again = -EBADF;
        char buf[4] = "";

        assert_non_null(mkdtemp(dir));
        assert_true(asprintf(&path, "%s/s.sock", dir) > 0);

        assert_errno(unix_stream_connect(path, false), -ENOENT);
        l = unix_stream_listen(path, 4);
        assert_ok(l);
        c = unix_stream_connect(path, false);
        assert_ok(c);
        a = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        assert_ok(a);
        assert_int_equal(write(c, "hey", 3), 3);
        assert_int_equal(read(a, buf, 3), 3);
        assert_string_equal(buf, "hey");

        /* a socket file left behind does not stand in the way */
        l = safe_close(l);
        again = unix_stream_listen(path, 4);
        assert_ok(again);

        assert_ok(rm_rf(dir));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_sockaddr_un_set_path),
                cmocka_unit_test(test_listen_connect),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
