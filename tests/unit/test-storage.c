/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "log.h"
#include "socket-util.h"
#include "storage.h"
#include "time-util.h"

/* A fake io.systemd.StorageProvider: a thread serving a unix socket, one call per connection. Acquire
 * works on <volumes>/<name>.volume like systemd's fs provider; a name prefix picks a misbehaviour. */
#define FAKE_HUNG_MAX 8
typedef struct Fake {
        char *socket;
        char *volumes;
        char *elsewhere;
        bool no_storage_interface;
        int listen_fd;
        int stop_fd;
        pthread_t thread;
        pthread_mutex_t lock;
        json_t *last; /* the parameters of the last Acquire */
        unsigned acquires;
        int hung[FAKE_HUNG_MAX]; /* "hang-": connections never answered, closed by fake_stop() */
        size_t n_hung;
} Fake;

typedef struct Fixture {
        char *base;
        char *state;
        Fake fake;
        Storage *storage;
} Fixture;

static char *join(const char *a, const char *b) {
        char *s;

        assert_true(asprintf(&s, "%s/%s", a, b) >= 0);
        return s;
}

/* Sends buf; the fd (if any) goes with the first byte; split sends in two parts with a pause between,
 * so that the client has to read twice. */
static void fake_send(int conn, const char *buf, size_t size, int fd, bool split) {
        union {
                struct cmsghdr h;
                uint8_t buf[CMSG_SPACE(sizeof(int))];
        } control = {};
        size_t first = split ? size / 2 : size;
        struct iovec iov = { .iov_base = (void *) buf, .iov_len = first };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t n;

        if (fd >= 0) {
                mh.msg_control = &control;
                mh.msg_controllen = sizeof(control);
                struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        n = sendmsg(conn, &mh, MSG_NOSIGNAL);
        if (n <= 0)
                return;
        buf += n;
        size -= (size_t) n;
        if (split)
                (void) usleep(50 * 1000);
        while (size > 0) {
                n = send(conn, buf, size, MSG_NOSIGNAL);
                if (n <= 0)
                        return;
                buf += n;
                size -= (size_t) n;
        }
}

static void fake_reply(int conn, json_t *reply, int fd, bool split) {
        _cleanup_free_ char *s = json_dumps(reply, JSON_COMPACT);

        assert(s);
        fake_send(conn, s, strlen(s) + 1, fd, split);
        json_decref(reply);
}

static void fake_error(int conn, const char *error) {
        fake_reply(conn, json_pack("{s:s,s:{}}", "error", error, "parameters"), -EBADF, false);
}

static int fake_create(const char *dir, const char *name, json_int_t size, bool excl) {
        _cleanup_free_ char *fn = NULL, *path = NULL;
        int fd;

        assert_true(asprintf(&fn, "%s.volume", name) >= 0);
        path = join(dir, fn);
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | (excl ? O_EXCL : 0), 0600);
        if (fd >= 0 && ftruncate(fd, size) < 0) {
                close(fd);
                return -errno;
        }
        return fd < 0 ? -errno : fd;
}

static int fake_open(const char *dir, const char *name) {
        _cleanup_free_ char *fn = NULL, *path = NULL;
        int fd;

        assert_true(asprintf(&fn, "%s.volume", name) >= 0);
        path = join(dir, fn);
        fd = open(path, O_RDWR | O_CLOEXEC);
        return fd < 0 ? -errno : fd;
}

static void fake_acquire(Fake *f, int conn, json_t *params) {
        const char *name = json_string_value(json_object_get(params, "name"));
        const char *mode = json_string_value(json_object_get(params, "createMode"));
        json_t *size = json_object_get(params, "createSizeBytes");
        _cleanup_close_ int fd = -EBADF;
        const char *type = "reg";
        bool split = false;

        pthread_mutex_lock(&f->lock);
        json_decref(f->last);
        f->last = json_incref(params);
        f->acquires++;
        pthread_mutex_unlock(&f->lock);

        if (!name || !mode)
                return fake_error(conn, "org.varlink.service.InvalidParameter");

        if (startswith(name, "unsupported-"))
                return fake_error(conn, "io.systemd.StorageProvider.TypeNotSupported");
        if (startswith(name, "bogus-"))
                return fake_error(conn, "com.example.Weird");
        if (startswith(name, "continues-"))
                return fake_reply(
                        conn, json_pack("{s:{},s:b}", "parameters", "continues", true), -EBADF, false);
        if (startswith(name, "nofd-"))
                return fake_reply(
                        conn,
                        json_pack(
                                "{s:{s:i,s:s,s:b}}",
                                "parameters",
                                "fileDescriptorIndex",
                                0,
                                "type",
                                "reg",
                                "readOnly",
                                false),
                        -EBADF,
                        false);
        if (startswith(name, "nonul-")) {
                /* Whitespace is valid JSON padding, but the message never ends within the limit. */
                size_t n = VARLINK_MESSAGE_MAX + 64 * 1024;
                _cleanup_free_ char *junk = malloc(n);

                assert(junk);
                memset(junk, ' ', n);
                fake_send(conn, junk, n, -EBADF, false);
                return;
        }

        if (startswith(name, "dir-")) {
                fd = open(f->volumes, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                type = "dir";
        } else if (startswith(name, "tmpfile-")) {
                fd = open(f->volumes, O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
                assert(fd >= 0);
                assert(ftruncate(fd, 4096) >= 0);
        } else if (startswith(name, "elsewhere-"))
                fd = fake_create(f->elsewhere, name, 4096, false);
        else {
                split = startswith(name, "split-");

                if (!streq(mode, "new")) {
                        fd = fake_open(f->volumes, name);
                        if (fd == -ENOENT && streq(mode, "open"))
                                return fake_error(conn, "io.systemd.StorageProvider.NoSuchVolume");
                }
                if (fd < 0) {
                        if (!json_is_integer(size))
                                return fake_error(conn, "io.systemd.StorageProvider.CreateSizeRequired");
                        fd = fake_create(f->volumes, name, json_integer_value(size), true);
                        if (fd == -EEXIST)
                                return fake_error(conn, "io.systemd.StorageProvider.VolumeExists");
                }
        }
        assert(fd >= 0);

        json_t *reply = json_pack(
                "{s:{s:i,s:s,s:b}}", "parameters", "fileDescriptorIndex", 0, "type", type, "readOnly", false);
        if (startswith(name, "multi-")) {
                /* The reply, then a second message in the same write: the client takes the first. */
                _cleanup_free_ char *s = json_dumps(reply, JSON_COMPACT);
                _cleanup_free_ char *both = NULL;
                int n = asprintf(
                        &both, "%s%c{\"error\":\"io.systemd.StorageProvider.NoSuchVolume\"}%c", s, 0, 0);

                assert(n > 0);
                fake_send(conn, both, (size_t) n, fd, false);
                json_decref(reply);
                return;
        }
        fake_reply(conn, reply, fd, split);
}

/* Returns true when it keeps conn ("hang-": open, never answered). */
static bool fake_serve(Fake *f, int conn) {
        char buf[64 * 1024];
        size_t len = 0;
        json_auto_t *req = NULL;
        const char *method;

        for (;;) {
                ssize_t n = recv(conn, buf + len, sizeof(buf) - len, 0);
                if (n <= 0)
                        return false;
                len += (size_t) n;
                if (memchr(buf, 0, len))
                        break;
                if (len == sizeof(buf))
                        return false;
        }

        req = json_loads(buf, 0, NULL);
        assert(req);
        method = json_string_value(json_object_get(req, "method"));
        assert(method);
        assert(json_is_object(json_object_get(req, "parameters")));

        if (streq(method, "org.varlink.service.GetInfo"))
                fake_reply(
                        conn,
                        json_pack(
                                "{s:{s:s,s:s,s:s,s:s,s:[ss]}}",
                                "parameters",
                                "vendor",
                                "test",
                                "product",
                                "fake-storage",
                                "version",
                                "261",
                                "url",
                                "https://example.invalid/",
                                "interfaces",
                                f->no_storage_interface ? "io.example.Other" : "io.systemd.StorageProvider",
                                "org.varlink.service"),
                        -EBADF,
                        false);
        else if (streq(method, "io.systemd.StorageProvider.Acquire")) {
                json_t *params = json_object_get(req, "parameters");
                const char *name = json_string_value(json_object_get(params, "name")) ?: "";

                if (startswith(name, "hang-") && f->n_hung < FAKE_HUNG_MAX) {
                        f->hung[f->n_hung++] = conn;
                        return true;
                }
                /* "slow-": answers after 300 ms, while the client's loop goes on */
                if (startswith(name, "slow-"))
                        (void) usleep(300 * 1000);
                fake_acquire(f, conn, params);
        } else
                fake_error(conn, "org.varlink.service.MethodNotFound");
        return false;
}

static void *fake_thread(void *p) {
        Fake *f = p;

        for (;;) {
                struct pollfd pf[2] = {
                        { .fd = f->listen_fd, .events = POLLIN },
                        { .fd = f->stop_fd, .events = POLLIN },
                };
                int conn;

                if (poll(pf, 2, -1) < 0)
                        continue;
                if (pf[1].revents)
                        return NULL;
                conn = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
                if (conn < 0)
                        continue;
                if (!fake_serve(f, conn))
                        close(conn);
        }
}

static void fake_start(Fake *f, const char *socket_path, const char *volumes, const char *elsewhere) {
        struct sockaddr_un sa;
        int len;
        _cleanup_free_ char *parent = strdup(socket_path);

        assert_non_null(parent);
        *strrchr(parent, '/') = 0;
        assert_ok(mkdir_p(parent, 0755));
        assert_ok(mkdir_p(volumes, 0755));
        assert_ok(mkdir_p(elsewhere, 0755));

        f->socket = strdup(socket_path);
        f->volumes = strdup(volumes);
        f->elsewhere = strdup(elsewhere);
        assert_true(f->socket && f->volumes && f->elsewhere);

        len = sockaddr_un_set_path(&sa, socket_path);
        assert_ok(len);
        f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(f->listen_fd >= 0);
        assert_ok(RET_NERRNO(bind(f->listen_fd, (struct sockaddr *) &sa, (socklen_t) len)));
        assert_ok(RET_NERRNO(listen(f->listen_fd, 16)));
        f->stop_fd = eventfd(0, EFD_CLOEXEC);
        assert_true(f->stop_fd >= 0);
        assert_int_equal(pthread_mutex_init(&f->lock, NULL), 0);
        assert_int_equal(pthread_create(&f->thread, NULL, fake_thread, f), 0);
}

static void fake_stop(Fake *f) {
        if (!f->socket)
                return;
        assert_ok(RET_NERRNO(eventfd_write(f->stop_fd, 1)));
        assert_int_equal(pthread_join(f->thread, NULL), 0);
        close(f->listen_fd);
        close(f->stop_fd);
        for (size_t i = 0; i < f->n_hung; i++)
                close(f->hung[i]);
        pthread_mutex_destroy(&f->lock);
        json_decref(f->last);
        free(f->socket);
        free(f->volumes);
        free(f->elsewhere);
        *f = (Fake){};
}

/* A copy of the parameters of the last Acquire the fake received. */
static json_t *fake_last(Fake *f) {
        json_t *v;

        pthread_mutex_lock(&f->lock);
        v = json_deep_copy(f->last);
        pthread_mutex_unlock(&f->lock);
        assert_non_null(v);
        return v;
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        char tmpl[] = "/tmp/test-storage.XXXXXX";

        if (!f || !mkdtemp(tmpl))
                return -1;
        f->base = strdup(tmpl);
        f->state = join(tmpl, "state");
        if (!f->base || mkdir_p(f->state, 0755) < 0)
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        f->storage = storage_free(f->storage);
        fake_stop(&f->fake);
        (void) rm_rf(f->base);
        free(f->base);
        free(f->state);
        free(f);
        return 0;
}

/* The file provider, chosen because the given socket does not exist. */
static Storage *files_storage(Fixture *f) {
        _cleanup_free_ char *nosock = join(f->base, "no-such.sock");

        assert_ok(storage_new(&f->storage, f->state, nosock));
        assert_int_equal(storage_kind(f->storage), STORAGE_FILES);
        return f->storage;
}

/* A provider on a fake at <base>/fs, volumes in <base>/volumes. */
static Storage *provider_storage(Fixture *f, bool with_volume_dir) {
        _cleanup_free_ char *sock = join(f->base, "fs"), *vols = join(f->base, "volumes"),
                            *other = join(f->base, "elsewhere");

        fake_start(&f->fake, sock, vols, other);
        assert_ok(storage_new(&f->storage, f->state, sock));
        assert_int_equal(storage_kind(f->storage), STORAGE_PROVIDER);
        assert_null(storage_volume_dir(f->storage));
        if (with_volume_dir)
                assert_ok(storage_set_volume_dir(f->storage, vols));
        return f->storage;
}

static void assert_api_error(ApiError *e, int r, int expected, ApiErrorCode code, const char *needle) {
        assert_errno(r, expected);
        assert_int_equal(e->error, expected);
        assert_string_equal(api_error_code_to_string(e->code), api_error_code_to_string(code));
        assert_contains(e->message, needle);
        api_error_done(e);
}

static void test_files_acquire(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(volume_done) Volume v = VOLUME_NULL, w = VOLUME_NULL, x = VOLUME_NULL;
        _cleanup_free_ char *dir = join(f->state, "volumes"), *desc = NULL, *path = NULL;
        Storage *s = files_storage(f);
        struct stat st;
        uint64_t size = 64ULL << 20;

        assert_true(asprintf(&desc, "files in %s", dir) >= 0);
        assert_string_equal(storage_description(s), desc);
        assert_string_equal(storage_volume_dir(s), dir);
        assert_ok(RET_NERRNO(stat(dir, &st)));
        assert_int_equal(st.st_mode & 07777, 0750);

        /* NEW: a sparse file of the size, 0600. */
        assert_ok(storage_acquire(s, "vm-0000abcd", size, VOLUME_NEW, &v, &e));
        path = join(dir, "vm-0000abcd.volume");
        assert_string_equal(v.name, "vm-0000abcd");
        assert_string_equal(v.path, path);
        assert_int_equal(v.size, size);
        assert_false(v.block);
        assert_false(v.read_only);
        assert_true(v.fd >= 0);
        assert_ok(RET_NERRNO(fstat(v.fd, &st)));
        assert_true(S_ISREG(st.st_mode));
        assert_int_equal(st.st_mode & 07777, 0600);
        assert_int_equal(st.st_size, (off_t) size);
        assert_true((uint64_t) st.st_blocks * 512 < 1024 * 1024);
        assert_true(fcntl(v.fd, F_GETFD) & FD_CLOEXEC);
        assert_int_equal(pwrite(v.fd, "data", 4, 4096), 4);

        /* NEW again: conflict; OPEN: the existing size, whatever size is asked for. */
        assert_api_error(
                &e,
                storage_acquire(s, "vm-0000abcd", size, VOLUME_NEW, &w, &e),
                -EEXIST,
                API_ERROR_CONFLICT,
                "volume vm-0000abcd exists");
        assert_int_equal(w.fd, -EBADF);
        assert_ok(storage_acquire(s, "vm-0000abcd", 1, VOLUME_OPEN, &w, &e));
        assert_int_equal(w.size, size);
        assert_string_equal(w.path, path);
        volume_done(&w);
        assert_int_equal(w.fd, -EBADF);
        assert_null(w.path);

        /* ANY: opens the existing one, creates a missing one. */
        assert_ok(storage_acquire(s, "vm-0000abcd", 4096, VOLUME_ANY, &w, &e));
        assert_int_equal(w.size, size);
        assert_ok(storage_acquire(s, "other", 8192, VOLUME_ANY, &x, &e));
        assert_int_equal(x.size, 8192);
        assert_ok(RET_NERRNO(fstat(x.fd, &st)));
        assert_int_equal(st.st_size, 8192);

        /* Missing, and creating without a size. */
        volume_done(&w);
        assert_api_error(
                &e,
                storage_acquire(s, "missing", 0, VOLUME_OPEN, &w, &e),
                -ENOENT,
                API_ERROR_NOT_FOUND,
                "not found: volume missing");
        assert_api_error(
                &e,
                storage_acquire(s, "empty", 0, VOLUME_NEW, &w, &e),
                -EINVAL,
                API_ERROR_INVALID_REQUEST,
                "needs a size");
        assert_api_error(
                &e,
                storage_acquire(s, "empty", 0, VOLUME_ANY, &w, &e),
                -EINVAL,
                API_ERROR_INVALID_REQUEST,
                "needs a size");
        assert_int_equal(access(dir, F_OK), 0);
        _cleanup_free_ char *empty = join(dir, "empty.volume");
        assert_int_equal(access(empty, F_OK), -1);
        assert_int_equal(w.fd, -EBADF);

        /* A directory in the way is not a volume. */
        _cleanup_free_ char *d = join(dir, "adir.volume");
        assert_ok(RET_NERRNO(mkdir(d, 0700)));
        assert_api_error(
                &e,
                storage_acquire(s, "adir", 0, VOLUME_OPEN, &w, &e),
                -EMEDIUMTYPE,
                API_ERROR_CONFLICT,
                "volume adir is not a regular file");
}

static void test_names(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        Volume v = VOLUME_NULL;
        Storage *s = files_storage(f);
        char longest[249], too_long[250];

        memset(longest, 'a', sizeof(longest) - 1);
        longest[sizeof(longest) - 1] = 0;
        memset(too_long, 'b', sizeof(too_long) - 1);
        too_long[sizeof(too_long) - 1] = 0;

        assert_true(volume_name_is_valid("vm-0000abcd"));
        assert_true(volume_name_is_valid("a.b"));
        assert_true(volume_name_is_valid("..."));
        assert_true(volume_name_is_valid(longest)); /* 248 + ".volume" = 255 */
        assert_false(volume_name_is_valid(too_long));
        assert_false(volume_name_is_valid(NULL));
        assert_false(volume_name_is_valid(""));
        assert_false(volume_name_is_valid("."));
        assert_false(volume_name_is_valid(".."));
        assert_false(volume_name_is_valid("a/b"));
        assert_false(volume_name_is_valid("/abs"));

        const char *bad[] = { "", ".", "..", "a/b", "../x", too_long };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                assert_api_error(
                        &e,
                        storage_acquire(s, bad[i], 4096, VOLUME_ANY, &v, &e),
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "invalid volume name");
                assert_api_error(
                        &e,
                        storage_delete(s, bad[i], &e),
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "invalid volume name");
        }
        assert_errno(storage_acquire(s, NULL, 4096, VOLUME_ANY, &v, /* reterr= */ NULL), -EINVAL);

        assert_ok(storage_acquire(s, longest, 4096, VOLUME_NEW, &v, &e));
        volume_done(&v);

        assert_string_equal(volume_create_to_string(VOLUME_ANY), "any");
        assert_int_equal(volume_create_from_string("new"), VOLUME_NEW);
        assert_int_equal(volume_create_from_string("bogus"), _VOLUME_CREATE_INVALID);
        assert_string_equal(storage_kind_to_string(STORAGE_PROVIDER), "provider");
        assert_int_equal(storage_kind_from_string("files"), STORAGE_FILES);
}

static void test_files_delete(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(volume_done) Volume v = VOLUME_NULL, w = VOLUME_NULL;
        Storage *s = files_storage(f);
        char buf[4];

        assert_ok(storage_acquire(s, "gone", 4096, VOLUME_NEW, &v, &e));
        assert_int_equal(storage_delete(s, "gone", &e), 1);
        assert_int_equal(storage_delete(s, "gone", &e), 0);
        assert_int_equal(storage_delete(s, "never", &e), 0);
        assert_false(api_error_is_set(&e));
        assert_int_equal(access(v.path, F_OK), -1);

        /* The lease survives the deletion. */
        assert_int_equal(pwrite(v.fd, "abcd", 4, 0), 4);
        assert_int_equal(pread(v.fd, buf, 4, 0), 4);
        assert_memory_equal(buf, "abcd", 4);

        assert_api_error(
                &e, storage_acquire(s, "gone", 0, VOLUME_OPEN, &w, &e), -ENOENT, API_ERROR_NOT_FOUND, "gone");
        assert_ok(storage_acquire(s, "gone", 4096, VOLUME_NEW, &w, &e));
}

static void test_fallback(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *sock = join(f->base, "fs"), *vols = join(f->base, "volumes"),
                            *other = join(f->base, "elsewhere"), *file = join(f->base, "plain");

        /* A socket that answers, but is no storage provider. */
        f->fake.no_storage_interface = true;
        fake_start(&f->fake, sock, vols, other);
        assert_ok(storage_new(&f->storage, f->state, sock));
        assert_int_equal(storage_kind(f->storage), STORAGE_FILES);
        assert_startswith(storage_description(f->storage), "files in ");
        f->storage = storage_free(f->storage);

        /* Not a socket at all. */
        assert_ok(write_file_atomic(file, "x", 1, 0644));
        assert_ok(storage_new(&f->storage, f->state, file));
        assert_int_equal(storage_kind(f->storage), STORAGE_FILES);
        assert_errno(storage_set_volume_dir(f->storage, "/x"), -EINVAL);
}

static void test_detect_user(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *runtime = join(f->base, "run"), *statehome = join(f->base, "statehome"),
                            *sock = NULL, *vols = join(statehome, "storage"),
                            *other = join(f->base, "elsewhere"), *desc = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(volume_done) Volume v = VOLUME_NULL;
        _cleanup_free_ char *expected = join(vols, "vm-1.volume");

        if (access(STORAGE_PROVIDER_SYSTEM_SOCKET, F_OK) >= 0)
                skip(); /* a real system provider would win as root */

        sock = join(runtime, STORAGE_PROVIDER_USER_SOCKET);
        fake_start(&f->fake, sock, vols, other);
        assert_ok(RET_NERRNO(setenv("XDG_RUNTIME_DIR", runtime, 1)));
        assert_ok(RET_NERRNO(setenv("XDG_STATE_HOME", statehome, 1)));

        assert_ok(storage_new(&f->storage, f->state, /* provider_socket= */ NULL));
        assert_int_equal(storage_kind(f->storage), STORAGE_PROVIDER);
        assert_true(asprintf(&desc, "systemd storage provider at %s", sock) >= 0);
        assert_string_equal(storage_description(f->storage), desc);
        assert_string_equal(storage_volume_dir(f->storage), vols);

        assert_ok(storage_acquire(f->storage, "vm-1", 1 << 20, VOLUME_NEW, &v, &e));
        assert_string_equal(v.path, expected);

        (void) unsetenv("XDG_RUNTIME_DIR");
        (void) unsetenv("XDG_STATE_HOME");
}

static void test_provider_acquire(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(volume_done) Volume v = VOLUME_NULL, w = VOLUME_NULL, x = VOLUME_NULL;
        Storage *s = provider_storage(f, /* with_volume_dir= */ true);
        _cleanup_free_ char *path = join(f->fake.volumes, "vm-0000abcd.volume");
        json_auto_t *req = NULL, *req2 = NULL, *req3 = NULL;
        struct stat st, pst;

        assert_ok(storage_acquire(s, "vm-0000abcd", 1 << 20, VOLUME_NEW, &v, &e));
        assert_string_equal(v.name, "vm-0000abcd");
        assert_string_equal(v.path, path);
        assert_int_equal(v.size, 1 << 20);
        assert_false(v.block);
        assert_false(v.read_only);
        assert_ok(RET_NERRNO(fstat(v.fd, &st)));
        assert_ok(RET_NERRNO(stat(path, &pst)));
        assert_int_equal(st.st_ino, pst.st_ino);
        assert_true(fcntl(v.fd, F_GETFD) & FD_CLOEXEC);

        /* Creating: requestAs and the size are sent, readOnly always. */
        req = fake_last(&f->fake);
        assert_string_equal(json_string_value(json_object_get(req, "name")), "vm-0000abcd");
        assert_string_equal(json_string_value(json_object_get(req, "createMode")), "new");
        assert_true(json_is_false(json_object_get(req, "readOnly")));
        assert_string_equal(json_string_value(json_object_get(req, "requestAs")), "reg");
        assert_int_equal(json_integer_value(json_object_get(req, "createSizeBytes")), 1 << 20);
        assert_null(json_object_get(req, "template"));

        /* Opening: neither requestAs nor a size. */
        assert_ok(storage_acquire(s, "vm-0000abcd", 4096, VOLUME_OPEN, &w, &e));
        assert_int_equal(w.size, 1 << 20);
        assert_string_equal(w.path, path);
        req2 = fake_last(&f->fake);
        assert_string_equal(json_string_value(json_object_get(req2, "createMode")), "open");
        assert_true(json_is_false(json_object_get(req2, "readOnly")));
        assert_null(json_object_get(req2, "requestAs"));
        assert_null(json_object_get(req2, "createSizeBytes"));

        /* ANY without a size: requestAs, no createSizeBytes. */
        assert_ok(storage_acquire(s, "vm-0000abcd", 0, VOLUME_ANY, &x, &e));
        req3 = fake_last(&f->fake);
        assert_string_equal(json_string_value(json_object_get(req3, "createMode")), "any");
        assert_string_equal(json_string_value(json_object_get(req3, "requestAs")), "reg");
        assert_null(json_object_get(req3, "createSizeBytes"));
}

static void test_provider_errors(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(volume_done) Volume v = VOLUME_NULL, w = VOLUME_NULL;
        Storage *s = provider_storage(f, /* with_volume_dir= */ true);

        assert_api_error(
                &e,
                storage_acquire(s, "missing", 0, VOLUME_OPEN, &w, &e),
                -ENOENT,
                API_ERROR_NOT_FOUND,
                "not found: volume missing");
        assert_ok(storage_acquire(s, "there", 4096, VOLUME_NEW, &v, &e));
        assert_api_error(
                &e,
                storage_acquire(s, "there", 4096, VOLUME_NEW, &w, &e),
                -EEXIST,
                API_ERROR_CONFLICT,
                "conflict: volume there exists");
        assert_api_error(
                &e,
                storage_acquire(s, "nosize", 0, VOLUME_NEW, &w, &e),
                -EINVAL,
                API_ERROR_INVALID_REQUEST,
                "creating volume nosize needs a size");
        assert_api_error(
                &e,
                storage_acquire(s, "unsupported-1", 4096, VOLUME_NEW, &w, &e),
                -EOPNOTSUPP,
                API_ERROR_UNSUPPORTED,
                "unsupported-1");
        assert_api_error(
                &e,
                storage_acquire(s, "dir-1", 0, VOLUME_OPEN, &w, &e),
                -EOPNOTSUPP,
                API_ERROR_UNSUPPORTED,
                "dir-1 is a directory volume");
        assert_api_error(
                &e,
                storage_acquire(s, "bogus-1", 0, VOLUME_OPEN, &w, &e),
                -EPROTO,
                API_ERROR_INTERNAL,
                "com.example.Weird");
        assert_api_error(
                &e,
                storage_acquire(s, "continues-1", 0, VOLUME_OPEN, &w, &e),
                -EPROTO,
                API_ERROR_INTERNAL,
                "continues-1");
        assert_api_error(
                &e, storage_acquire(s, "nofd-1", 0, VOLUME_OPEN, &w, &e), -EBADMSG, API_ERROR_INTERNAL, "nofd-1");
        assert_api_error(
                &e,
                storage_acquire(s, "a/b", 0, VOLUME_OPEN, &w, &e),
                -EINVAL,
                API_ERROR_INVALID_REQUEST,
                "invalid volume name");
        assert_int_equal(w.fd, -EBADF);
        assert_null(w.path);
}

static void test_provider_paths(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(volume_done) Volume v = VOLUME_NULL, w = VOLUME_NULL, x = VOLUME_NULL;
        Storage *s = provider_storage(f, /* with_volume_dir= */ true);
        _cleanup_free_ char *other = join(f->fake.elsewhere, "elsewhere-1.volume"),
                            *here = join(f->fake.volumes, "plain.volume");

        /* Not the inode in the volume directory: the fd's link target. */
        assert_ok(storage_acquire(s, "elsewhere-1", 0, VOLUME_OPEN, &v, &e));
        assert_string_equal(v.path, other);
        assert_int_equal(v.size, 4096);

        /* An O_TMPFILE volume has no path, only its fd. */
        assert_ok(storage_acquire(s, "tmpfile-1", 4096, VOLUME_NEW, &w, &e));
        assert_null(w.path);
        assert_true(w.fd >= 0);
        assert_int_equal(w.size, 4096);

        /* Without a known volume directory, the link target still names the file. */
        assert_ok(storage_set_volume_dir(s, /* dir= */ NULL));
        assert_ok(storage_acquire(s, "plain", 4096, VOLUME_ANY, &x, &e));
        assert_string_equal(x.path, here);
}

static void test_provider_wire(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(volume_done) Volume v = VOLUME_NULL, w = VOLUME_NULL, x = VOLUME_NULL;
        Storage *s = provider_storage(f, /* with_volume_dir= */ true);
        _cleanup_free_ char *split = join(f->fake.volumes, "split-1.volume");

        /* A reply arriving in two reads, the fd with the first. */
        assert_ok(storage_acquire(s, "split-1", 8192, VOLUME_NEW, &v, &e));
        assert_string_equal(v.path, split);
        assert_int_equal(v.size, 8192);

        /* Two messages in one read: the first is the reply. */
        assert_ok(storage_acquire(s, "multi-1", 8192, VOLUME_NEW, &w, &e));
        assert_int_equal(w.size, 8192);

        /* No NUL within 16 MiB. */
        assert_api_error(
                &e,
                storage_acquire(s, "nonul-1", 0, VOLUME_OPEN, &x, &e),
                -EMSGSIZE,
                API_ERROR_INTERNAL,
                "nonul-1");
        assert_int_equal(x.fd, -EBADF);

        /* The provider still serves the next connection. */
        assert_ok(storage_acquire(s, "split-1", 0, VOLUME_OPEN, &x, &e));
}

static void test_provider_delete(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(volume_done) Volume v = VOLUME_NULL;
        Storage *s = provider_storage(f, /* with_volume_dir= */ true);
        _cleanup_free_ char *d = join(f->fake.volumes, "adir.volume");

        assert_ok(storage_acquire(s, "vm-2", 4096, VOLUME_NEW, &v, &e));
        assert_int_equal(storage_delete(s, "vm-2", &e), 1);
        assert_int_equal(access(v.path, F_OK), -1);
        assert_int_equal(storage_delete(s, "vm-2", &e), 0);
        assert_false(api_error_is_set(&e));
        assert_int_equal(pwrite(v.fd, "x", 1, 0), 1);

        assert_ok(RET_NERRNO(mkdir(d, 0700)));
        assert_api_error(
                &e,
                storage_delete(s, "adir", &e),
                -EOPNOTSUPP,
                API_ERROR_UNSUPPORTED,
                "adir is a directory volume, which vm-manager does not manage");
        assert_int_equal(access(d, F_OK), 0);

        assert_ok(storage_set_volume_dir(s, /* dir= */ NULL));
        assert_api_error(
                &e,
                storage_delete(s, "vm-2", &e),
                -EOPNOTSUPP,
                API_ERROR_UNSUPPORTED,
                "volume directory is unknown");
}

/* ---- the asynchronous acquire, on a loop ---- */

typedef struct Outcome {
        unsigned calls;
        int r;
        Volume volume;
        ApiError error;
} Outcome;

#define OUTCOME_NULL ((Outcome){ .volume = VOLUME_NULL, .error = API_ERROR_NULL })

static void outcome_done(Outcome *o) {
        volume_done(&o->volume);
        api_error_done(&o->error);
        *o = OUTCOME_NULL;
}

static void on_acquired(StorageCall *c, int r, Volume *v, ApiError *e, void *userdata) {
        Outcome *o = userdata;

        o->calls++;
        o->r = r;
        o->volume = *v;
        *v = VOLUME_NULL;
        o->error = *e;
        *e = API_ERROR_NULL;
}

static int on_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        unsigned *ticks = userdata;

        (*ticks)++;
        assert_ok(sd_event_source_set_time_relative(s, 10 * USEC_PER_MSEC));
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

/* Runs the loop until o has its outcome; fails after 5 s. */
static void run_until(sd_event *e, Outcome *o) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;

        while (o->calls == 0) {
                assert_true(now_usec(CLOCK_MONOTONIC) < deadline);
                assert_ok(sd_event_run(e, 100 * USEC_PER_MSEC));
        }
        assert_int_equal(o->calls, 1);
}

static void test_async_provider(void **state) {
        Fixture *f = *state;
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(sd_event_source_disable_unrefp) sd_event_source *tick = NULL;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        _cleanup_free_ char *slow = join(f->base, "volumes/slow-1.volume");
        Storage *s = provider_storage(f, /* with_volume_dir= */ true);
        Outcome o = OUTCOME_NULL;
        StorageCall *call = NULL;
        unsigned ticks = 0, before;
        usec_t t;

        assert_ok(sd_event_new(&e));
        assert_ok(sd_event_add_time_relative(e, &tick, CLOCK_MONOTONIC, 0, /* accuracy= */ 1, on_tick, &ticks));

        /* A provider that takes 300 ms: the loop goes on ticking meanwhile, and the answer comes from
         * the loop, never from within the call. */
        assert_ok(storage_acquire_async(s, e, "slow-1", 4096, VOLUME_NEW, on_acquired, &o, &call, &err));
        assert_non_null(call);
        assert_int_equal(o.calls, 0);
        run_until(e, &o);
        assert_ok(o.r);
        assert_string_equal(o.volume.path, slow);
        assert_int_equal(o.volume.size, 4096);
        assert_true(o.volume.fd >= 0);
        assert_true(ticks >= 10);
        outcome_done(&o);

        /* A provider that never answers: the time limit is a timer. */
        storage_set_acquire_timeout(s, 200 * USEC_PER_MSEC);
        before = ticks;
        t = now_usec(CLOCK_MONOTONIC);
        assert_ok(storage_acquire_async(s, e, "hang-1", 4096, VOLUME_NEW, on_acquired, &o, &call, &err));
        run_until(e, &o);
        t = now_usec(CLOCK_MONOTONIC) - t;
        assert_errno(o.r, -ETIMEDOUT);
        assert_int_equal(o.error.code, API_ERROR_TIMEOUT);
        assert_contains(o.error.message, "did not answer Acquire of volume hang-1");
        assert_int_equal(o.volume.fd, -EBADF);
        assert_true(t >= 190 * USEC_PER_MSEC && t < 2 * USEC_PER_SEC);
        assert_true(ticks - before >= 5);
        outcome_done(&o);

        /* Cancelled: the callback runs at once, with -ECANCELED. */
        assert_ok(storage_acquire_async(s, e, "hang-2", 4096, VOLUME_NEW, on_acquired, &o, &call, &err));
        assert_null(storage_call_cancel(call));
        assert_int_equal(o.calls, 1);
        assert_errno(o.r, -ECANCELED);
        assert_contains(o.error.message, "hang-2");
        outcome_done(&o);

        /* Freed with a call in flight: the same. */
        assert_ok(storage_acquire_async(s, e, "hang-3", 4096, VOLUME_NEW, on_acquired, &o, &call, &err));
        f->storage = storage_free(f->storage);
        assert_int_equal(o.calls, 1);
        assert_errno(o.r, -ECANCELED);
        outcome_done(&o);
        assert_false(api_error_is_set(&err));
}

static void test_async_unreachable(void **state) {
        Fixture *f = *state;
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        Storage *s = provider_storage(f, /* with_volume_dir= */ true);
        Outcome o = OUTCOME_NULL;

        /* The provider went away after start-up: the refused connection is an outcome like any other,
         * from the loop. */
        assert_ok(sd_event_new(&e));
        assert_ok(RET_NERRNO(unlink(f->fake.socket)));
        assert_ok(storage_acquire_async(
                s, e, "vm-1", 4096, VOLUME_NEW, on_acquired, &o, /* ret_call= */ NULL, &err));
        assert_int_equal(o.calls, 0);
        run_until(e, &o);
        assert_errno(o.r, -ENOENT);
        assert_int_equal(o.error.code, API_ERROR_INTERNAL);
        assert_contains(o.error.message, "storage provider failed on volume vm-1");
        outcome_done(&o);
}

static void test_async_files(void **state) {
        Fixture *f = *state;
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        Storage *s = files_storage(f);
        Outcome o = OUTCOME_NULL, many[STORAGE_CALLS_MAX];
        char name[32];

        assert_ok(sd_event_new(&e));
        assert_ok(storage_acquire_async(
                s, e, "a", 4096, VOLUME_NEW, on_acquired, &o, /* ret_call= */ NULL, &err));
        assert_int_equal(o.calls, 0);
        run_until(e, &o);
        assert_ok(o.r);
        assert_int_equal(o.volume.size, 4096);
        outcome_done(&o);

        /* Refused at once, the callback never called: a bad name, and one call beyond the limit. */
        assert_errno(
                storage_acquire_async(
                        s, e, "a/b", 4096, VOLUME_NEW, on_acquired, &o, /* ret_call= */ NULL, &err),
                -EINVAL);
        assert_int_equal(err.code, API_ERROR_INVALID_REQUEST);
        api_error_done(&err);
        for (unsigned i = 0; i < STORAGE_CALLS_MAX; i++) {
                many[i] = OUTCOME_NULL;
                snprintf(name, sizeof(name), "n-%u", i);
                assert_ok(storage_acquire_async(
                        s, e, name, 4096, VOLUME_NEW, on_acquired, &many[i], /* ret_call= */ NULL, &err));
        }
        assert_errno(
                storage_acquire_async(
                        s, e, "one-more", 4096, VOLUME_NEW, on_acquired, &o, /* ret_call= */ NULL, &err),
                -EAGAIN);
        assert_int_equal(err.code, API_ERROR_CONFLICT);
        api_error_done(&err);
        for (unsigned i = 0; i < STORAGE_CALLS_MAX; i++) {
                run_until(e, &many[i]);
                assert_ok(many[i].r);
                outcome_done(&many[i]);
        }
        assert_int_equal(o.calls, 0);
}

static void test_parse_reply(void **state) {
        json_t *p = NULL;
        char *err = NULL;
        bool cont = true;

#define REPLY(s) s, strlen(s)
        assert_ok(varlink_parse_reply(REPLY("{\"parameters\":{\"a\":1}}"), &p, &err, &cont));
        assert_int_equal(json_integer_value(json_object_get(p, "a")), 1);
        assert_null(err);
        assert_false(cont);
        json_decref(p);

        assert_ok(varlink_parse_reply(REPLY("{\"error\":\"x.Y\",\"future\":1}"), &p, &err, &cont));
        assert_true(json_is_object(p) && json_object_size(p) == 0);
        assert_string_equal(err, "x.Y");
        json_decref(p);
        free(err);

        assert_ok(varlink_parse_reply(REPLY("{\"parameters\":{},\"continues\":true}"), &p, &err, &cont));
        assert_true(cont);
        json_decref(p);

        p = NULL;
        err = NULL;
        const char *bad[] = {
                "",
                "[]",
                "\"x\"",
                "{",
                "{} {}",
                "{\"parameters\":[]}",
                "{\"continues\":1}",
                "{\"error\":\"\"}",
                "{\"error\":\"a\\u0000b\"}",
                "{\"error\":\"x\",\"continues\":true}",
                "{\"parameters\":{},\"parameters\":{}}",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                assert_errno(varlink_parse_reply(REPLY(bad[i]), &p, &err, &cont), -EBADMSG);
        assert_errno(varlink_parse_reply("{}\0{}", 5, &p, &err, &cont), -EBADMSG);
        assert_errno(varlink_parse_reply("{}", VARLINK_MESSAGE_MAX + 1, &p, &err, &cont), -EMSGSIZE);
        assert_null(p);
        assert_null(err);
#undef REPLY
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_files_acquire, setup, teardown),
                cmocka_unit_test_setup_teardown(test_names, setup, teardown),
                cmocka_unit_test_setup_teardown(test_files_delete, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fallback, setup, teardown),
                cmocka_unit_test_setup_teardown(test_detect_user, setup, teardown),
                cmocka_unit_test_setup_teardown(test_provider_acquire, setup, teardown),
                cmocka_unit_test_setup_teardown(test_provider_errors, setup, teardown),
                cmocka_unit_test_setup_teardown(test_provider_paths, setup, teardown),
                cmocka_unit_test_setup_teardown(test_provider_wire, setup, teardown),
                cmocka_unit_test_setup_teardown(test_provider_delete, setup, teardown),
                cmocka_unit_test_setup_teardown(test_async_provider, setup, teardown),
                cmocka_unit_test_setup_teardown(test_async_unreachable, setup, teardown),
                cmocka_unit_test_setup_teardown(test_async_files, setup, teardown),
                cmocka_unit_test(test_parse_reply),
        };
        log_set_max_level(LOG_WARNING);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
