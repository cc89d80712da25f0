/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/fs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "log.h"
#include "socket-util.h"
#include "storage.h"
#include "string-table.h"
#include "time-util.h"

#define VOLUME_SUFFIX ".volume"

static const char *strempty(const char *s) {
        return s ?: "";
}
/* File descriptors kept from one reply; any beyond are closed. */
#define VARLINK_FDS_MAX 16U
#define VARLINK_READ_SIZE ((size_t) 64U * 1024U)

struct Storage {
        StorageKind kind;
        char *dir;    /* files: <state>/volumes; provider: its volume directory, or NULL */
        char *socket; /* provider only */
        char *description;
};

static const char *const storage_kind_table[_STORAGE_KIND_MAX] = {
        [STORAGE_FILES] = "files",
        [STORAGE_PROVIDER] = "provider",
};

DEFINE_STRING_TABLE_LOOKUP(storage_kind, StorageKind);

static const char *const volume_create_table[_VOLUME_CREATE_MAX] = {
        [VOLUME_OPEN] = "open",
        [VOLUME_NEW] = "new",
        [VOLUME_ANY] = "any",
};

DEFINE_STRING_TABLE_LOOKUP(volume_create, VolumeCreate);

bool volume_name_is_valid(const char *name) {
        size_t n;

        if (!name || !*name)
                return false;
        if (streq(name, ".") || streq(name, ".."))
                return false;
        if (strchr(name, '/'))
                return false;
        n = strlen(name);
        return n + strlen(VOLUME_SUFFIX) <= NAME_MAX;
}

void volume_done(Volume *v) {
        if (!v)
                return;
        v->name = mfree(v->name);
        v->path = mfree(v->path);
        v->fd = safe_close(v->fd);
        v->size = 0;
        v->block = v->read_only = false;
}

static char *volume_path(const char *dir, const char *name) {
        char *p;

        if (asprintf(&p, "%s/%s" VOLUME_SUFFIX, dir, name) < 0)
                return NULL;
        return p;
}

/* ---- varlink ---- */

int varlink_parse_reply(
        const char *buf, size_t len, json_t **ret_parameters, char **ret_error, bool *ret_continues) {
        _cleanup_free_ char *error = NULL;
        json_auto_t *root = NULL;
        json_error_t jerr;
        json_t *parameters, *continues, *e;

        assert_return(buf || len == 0, -EINVAL);

        if (len > VARLINK_MESSAGE_MAX)
                return -EMSGSIZE;
        if (len == 0 || memchr(buf, 0, len))
                return -EBADMSG;

        /* Without JSON_DECODE_ANY only an object or array is accepted, trailing bytes are refused; a
         * duplicate key would make the reply mean two things. */
        root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!root)
                return json_error_code(&jerr) == json_error_out_of_memory ? -ENOMEM : -EBADMSG;
        if (!json_is_object(root))
                return -EBADMSG;

        parameters = json_object_get(root, "parameters");
        if (parameters && !json_is_object(parameters))
                return -EBADMSG;

        continues = json_object_get(root, "continues");
        if (continues && !json_is_boolean(continues))
                return -EBADMSG;

        e = json_object_get(root, "error");
        if (e) {
                if (!json_is_string(e) || json_string_length(e) == 0 ||
                    strlen(json_string_value(e)) != json_string_length(e))
                        return -EBADMSG;
                if (json_is_true(continues))
                        return -EBADMSG;
                error = strdup(json_string_value(e));
                if (!error)
                        return -ENOMEM;
        }

        if (ret_parameters) {
                json_t *p = parameters ? json_incref(parameters) : json_object();
                if (!p)
                        return -ENOMEM;
                *ret_parameters = p;
        }
        if (ret_error)
                *ret_error = TAKE_PTR(error);
        if (ret_continues)
                *ret_continues = json_is_true(continues);
        return 0;
}

/* Waits for events on fd until the deadline (CLOCK_MONOTONIC); -ETIMEDOUT when it passes. */
static int fd_wait_until(int fd, short events, usec_t deadline) {
        for (;;) {
                struct pollfd p = { .fd = fd, .events = events };
                usec_t n = now_usec(CLOCK_MONOTONIC);
                int r;

                if (n >= deadline)
                        return -ETIMEDOUT;

                /* Rounded up, so that a wait never ends just before the deadline. */
                usec_t left_ms = (deadline - n + USEC_PER_MSEC - 1) / USEC_PER_MSEC;
                r = poll(&p, 1, (int) MIN(left_ms, (usec_t) INT_MAX));
                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (r > 0)
                        return 0;
        }
}

static int varlink_connect(const char *path, usec_t deadline, int *ret) {
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_un sa;
        int r, len;

        len = sockaddr_un_set_path(&sa, path);
        if (len < 0)
                return -EINVAL;

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;

        if (connect(fd, (const struct sockaddr *) &sa, (socklen_t) len) < 0) {
                if (errno != EINPROGRESS)
                        return -errno;
                r = fd_wait_until(fd, POLLOUT, deadline);
                if (r < 0)
                        return r;

                int err = 0;
                socklen_t err_len = sizeof(err);
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) < 0)
                        return -errno;
                if (err != 0)
                        return -err;
        }

        *ret = TAKE_FD(fd);
        return 0;
}

static int varlink_send(int fd, const char *buf, size_t size, usec_t deadline) {
        while (size > 0) {
                ssize_t n = send(fd, buf, size, MSG_NOSIGNAL);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno != EAGAIN)
                                return -errno;
                        int r = fd_wait_until(fd, POLLOUT, deadline);
                        if (r < 0)
                                return r;
                        continue;
                }
                buf += n;
                size -= (size_t) n;
        }
        return 0;
}

typedef struct VarlinkFds {
        int fds[VARLINK_FDS_MAX];
        size_t n;
} VarlinkFds;

static void varlink_fds_done(VarlinkFds *f) {
        for (size_t i = 0; i < f->n; i++)
                f->fds[i] = safe_close(f->fds[i]);
        f->n = 0;
}

/* Keeps the descriptors of a control message (closing those beyond the limit). */
static void varlink_fds_collect(VarlinkFds *f, struct msghdr *mh) {
        for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
                size_t n;

                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < n; i++) {
                        int fd;

                        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                        if (f->n < VARLINK_FDS_MAX)
                                f->fds[f->n++] = fd;
                        else
                                (void) safe_close(fd);
                }
        }
}

/* Reads until the first NUL. Bytes after it (further messages) are ignored: one connection carries one
 * call, and the call asks for one reply. Descriptors arriving with any of the reads are kept in fds. */
static int varlink_receive(int fd, usec_t deadline, VarlinkFds *fds, char **ret, size_t *ret_len) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0, cap = 0;

        for (;;) {
                union {
                        struct cmsghdr h;
                        uint8_t buf[CMSG_SPACE(sizeof(int) * VARLINK_FDS_MAX)];
                } control = {};
                struct iovec iov;
                struct msghdr mh = {
                        .msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = &control,
                        .msg_controllen = sizeof(control),
                };
                size_t want;
                ssize_t n;
                char *nul;

                /* The message and its NUL must fit in VARLINK_MESSAGE_MAX + 1 bytes. */
                if (len > VARLINK_MESSAGE_MAX)
                        return -EMSGSIZE;
                want = MIN(VARLINK_READ_SIZE, VARLINK_MESSAGE_MAX + 1 - len);
                if (cap - len < want) {
                        size_t ncap = MAX(cap * 2, len + want);
                        char *p;

                        ncap = MIN(ncap, VARLINK_MESSAGE_MAX + 1);
                        p = realloc(buf, ncap);
                        if (!p)
                                return -ENOMEM;
                        buf = p;
                        cap = ncap;
                }

                iov = (struct iovec){ .iov_base = buf + len, .iov_len = want };
                n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno != EAGAIN)
                                return -errno;
                        int r = fd_wait_until(fd, POLLIN, deadline);
                        if (r < 0)
                                return r;
                        continue;
                }
                varlink_fds_collect(fds, &mh);
                if (mh.msg_flags & MSG_CTRUNC)
                        return -EBADMSG;
                if (n == 0)
                        return -ECONNRESET;

                nul = memchr(buf + len, 0, (size_t) n);
                len += (size_t) n;
                if (nul) {
                        *ret_len = (size_t) (nul - buf);
                        *ret = TAKE_PTR(buf);
                        return 0;
                }
        }
}

/* One call on a fresh connection: sends {"method","parameters"}, returns the reply's parameters (new
 * reference), its error name (NULL for success) and the descriptors that came with it. */
static int varlink_call(
        const char *socket_path,
        const char *method,
        json_t *parameters,
        usec_t timeout,
        json_t **ret_parameters,
        char **ret_error,
        VarlinkFds *ret_fds) {

        _cleanup_(varlink_fds_done) VarlinkFds fds = {};
        _cleanup_free_ char *request = NULL, *reply = NULL, *error = NULL;
        _cleanup_close_ int fd = -EBADF;
        json_auto_t *msg = NULL, *params = NULL;
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + timeout;
        bool continues;
        size_t len = 0;
        int r;

        msg = json_pack("{s:s,s:O}", "method", method, "parameters", parameters);
        if (!msg)
                return -ENOMEM;
        request = json_dumps(msg, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!request)
                return -ENOMEM;

        r = varlink_connect(socket_path, deadline, &fd);
        if (r < 0)
                return log_debug_errno(r, "Cannot connect to varlink socket %s: %m", socket_path);

        /* The terminating NUL is part of the message. */
        r = varlink_send(fd, request, strlen(request) + 1, deadline);
        if (r < 0)
                return log_debug_errno(r, "Cannot send %s to %s: %m", method, socket_path);

        r = varlink_receive(fd, deadline, &fds, &reply, &len);
        if (r < 0)
                return log_debug_errno(r, "No reply to %s from %s: %m", method, socket_path);

        r = varlink_parse_reply(reply, len, &params, &error, &continues);
        if (r < 0)
                return log_debug_errno(r, "Invalid reply to %s from %s: %m", method, socket_path);
        if (continues)
                /* We never set "more", so a reply that announces more is a protocol violation. */
                return log_debug_errno(
                        SYNTHETIC_ERRNO(EPROTO),
                        "Unrequested continued reply to %s from %s",
                        method,
                        socket_path);

        *ret_parameters = TAKE_PTR(params);
        *ret_error = TAKE_PTR(error);
        if (ret_fds) {
                *ret_fds = fds;
                fds.n = 0;
        }
        return 0;
}

/* Whether the socket answers GetInfo in time, listing the storage provider interface. */
static bool provider_probe(const char *socket_path) {
        _cleanup_free_ char *error = NULL;
        json_auto_t *empty = NULL, *reply = NULL;
        struct stat st;
        size_t i;
        json_t *v;
        int r;

        if (stat(socket_path, &st) < 0) {
                (void) log_debug_errno(errno, "No storage provider socket %s: %m", socket_path);
                return false;
        }
        if (!S_ISSOCK(st.st_mode)) {
                log_debug("%s is not a socket, ignoring.", socket_path);
                return false;
        }

        empty = json_object();
        if (!empty)
                return false;
        r = varlink_call(
                socket_path,
                "org.varlink.service.GetInfo",
                empty,
                STORAGE_GETINFO_TIMEOUT_USEC,
                &reply,
                &error,
                /* ret_fds= */ NULL);
        if (r < 0)
                return false;
        if (error) {
                log_debug("GetInfo on %s failed: %s", socket_path, error);
                return false;
        }

        json_array_foreach(
                json_object_get(reply, "interfaces"),
                i,
                v) if (json_is_string(v) && streq(json_string_value(v), STORAGE_PROVIDER_INTERFACE)) return true;

        log_debug("%s does not offer %s.", socket_path, STORAGE_PROVIDER_INTERFACE);
        return false;
}

static int user_paths(char **ret_socket, char **ret_volumes) {
        _cleanup_free_ char *socket_path = NULL, *volumes = NULL;
        const char *e;
        int k;

        e = secure_getenv("XDG_RUNTIME_DIR");
        if (e && *e == '/')
                k = asprintf(&socket_path, "%s/" STORAGE_PROVIDER_USER_SOCKET, e);
        else
                k = asprintf(&socket_path, "/run/user/%u/" STORAGE_PROVIDER_USER_SOCKET, (unsigned) getuid());
        if (k < 0)
                return -ENOMEM;

        /* Without a state home or $HOME the volume directory stays unknown. */
        e = secure_getenv("XDG_STATE_HOME");
        if (e && *e == '/')
                k = asprintf(&volumes, "%s/" STORAGE_PROVIDER_USER_VOLUMES, e);
        else if ((e = secure_getenv("HOME")) && *e == '/')
                k = asprintf(&volumes, "%s/.local/state/" STORAGE_PROVIDER_USER_VOLUMES, e);
        else
                k = 0;
        if (k < 0)
                return -ENOMEM;

        *ret_socket = TAKE_PTR(socket_path);
        *ret_volumes = TAKE_PTR(volumes);
        return 0;
}

static int storage_new_provider(Storage **ret, const char *socket_path, const char *volume_dir) {
        _cleanup_(storage_freep) Storage *s = NULL;

        s = calloc(1, sizeof(Storage));
        if (!s)
                return -ENOMEM;
        s->kind = STORAGE_PROVIDER;
        s->socket = strdup(socket_path);
        if (!s->socket)
                return -ENOMEM;
        if (volume_dir) {
                s->dir = strdup(volume_dir);
                if (!s->dir)
                        return -ENOMEM;
        }
        if (asprintf(&s->description, "systemd storage provider at %s", socket_path) < 0) {
                s->description = NULL;
                return -ENOMEM;
        }

        log_debug("Using the %s, volumes in %s.", s->description, s->dir ?: "an unknown directory");
        *ret = TAKE_PTR(s);
        return 0;
}

int storage_new(Storage **ret, const char *state_dir, const char *provider_socket) {
        _cleanup_(storage_freep) Storage *s = NULL;
        _cleanup_free_ char *user_socket = NULL, *user_volumes = NULL;
        int r;

        assert_return(ret, -EINVAL);
        assert_return(state_dir && *state_dir, -EINVAL);

        if (provider_socket) {
                if (provider_probe(provider_socket))
                        return storage_new_provider(ret, provider_socket, /* volume_dir= */ NULL);
        } else {
                struct {
                        const char *socket, *volumes;
                } candidates[2];

                r = user_paths(&user_socket, &user_volumes);
                if (r < 0)
                        return r;

                candidates[0] = (typeof(candidates[0])){ STORAGE_PROVIDER_SYSTEM_SOCKET,
                                                         STORAGE_PROVIDER_SYSTEM_VOLUMES };
                candidates[1] = (typeof(candidates[1])){ user_socket, user_volumes };
                if (geteuid() != 0) {
                        candidates[1] = candidates[0];
                        candidates[0] = (typeof(candidates[0])){ user_socket, user_volumes };
                }

                for (size_t i = 0; i < ELEMENTSOF(candidates); i++)
                        if (provider_probe(candidates[i].socket))
                                return storage_new_provider(ret, candidates[i].socket, candidates[i].volumes);
        }

        s = calloc(1, sizeof(Storage));
        if (!s)
                return -ENOMEM;
        s->kind = STORAGE_FILES;
        if (asprintf(&s->dir, "%s/volumes", state_dir) < 0) {
                s->dir = NULL;
                return -ENOMEM;
        }
        r = mkdir_p(s->dir, 0750);
        if (r < 0)
                return log_debug_errno(r, "Cannot create volume directory %s: %m", s->dir);
        if (asprintf(&s->description, "files in %s", s->dir) < 0) {
                s->description = NULL;
                return -ENOMEM;
        }

        log_debug("No storage provider answered, using %s.", s->description);
        *ret = TAKE_PTR(s);
        return 0;
}

Storage *storage_free(Storage *s) {
        if (!s)
                return NULL;
        free(s->dir);
        free(s->socket);
        free(s->description);
        return mfree(s);
}

StorageKind storage_kind(Storage *s) {
        assert(s);
        return s->kind;
}

const char *storage_description(Storage *s) {
        assert(s);
        return s->description;
}

const char *storage_volume_dir(Storage *s) {
        assert(s);
        return s->dir;
}

int storage_set_volume_dir(Storage *s, const char *dir) {
        char *d = NULL;

        assert_return(s, -EINVAL);
        assert_return(s->kind == STORAGE_PROVIDER, -EINVAL);
        assert_return(!dir || *dir == '/', -EINVAL);

        if (dir) {
                d = strdup(dir);
                if (!d)
                        return -ENOMEM;
        }
        free(s->dir);
        s->dir = d;
        return 0;
}

/* ---- file provider ---- */

static int files_open(Storage *s, const char *name, const char *path, Volume *ret, ApiError *reterr) {
        _cleanup_close_ int fd = -EBADF;
        struct stat st;

        fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
        if (fd < 0) {
                if (errno == ENOENT)
                        return -ENOENT; /* the caller decides: not found, or create */
                if (errno == EISDIR)
                        return api_error_set(
                                reterr, -EMEDIUMTYPE, API_ERROR_CONFLICT, "volume %s is not a regular file", name);
                if (errno == EACCES || errno == EROFS)
                        return api_error_set(
                                reterr, -EROFS, API_ERROR_CONFLICT, "volume %s is read-only", name);
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot open volume %s: %s", name, strerror(errno));
        }
        if (fstat(fd, &st) < 0)
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot stat volume %s: %s", name, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return api_error_set(
                        reterr, -EMEDIUMTYPE, API_ERROR_CONFLICT, "volume %s is not a regular file", name);

        ret->fd = TAKE_FD(fd);
        ret->size = (uint64_t) st.st_size;
        return 0;
}

static int files_create(
        Storage *s, const char *name, const char *path, uint64_t size, Volume *ret, ApiError *reterr) {
        _cleanup_close_ int fd = -EBADF;
        int r;

        if (size > (uint64_t) INT64_MAX)
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "volume size %" PRIu64 " too large", size);

        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0600);
        if (fd < 0) {
                if (errno == EEXIST)
                        return -EEXIST; /* the caller decides: conflict, or open */
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot create volume %s: %s", name, strerror(errno));
        }
        if (ftruncate(fd, (off_t) size) < 0) {
                r = -errno;
                (void) unlink(path);
                if (r == -EFBIG || r == -EINVAL)
                        return api_error_set(
                                reterr, r, API_ERROR_INVALID_REQUEST, "volume size %" PRIu64 " too large", size);
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "cannot size volume %s: %s", name, strerror(-r));
        }

        ret->fd = TAKE_FD(fd);
        ret->size = size;
        return 0;
}

static int files_acquire(
        Storage *s, const char *name, uint64_t size, VolumeCreate mode, Volume *ret, ApiError *reterr) {
        _cleanup_(volume_done) Volume v = VOLUME_NULL;
        int r;

        v.name = strdup(name);
        v.path = volume_path(s->dir, name);
        if (!v.name || !v.path)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        /* ANY: open, else create; a racing creator or remover sends us round again, a few times. */
        for (unsigned attempt = 0;; attempt++) {
                if (mode != VOLUME_NEW) {
                        r = files_open(s, name, v.path, &v, reterr);
                        if (r >= 0)
                                break;
                        if (r != -ENOENT)
                                return r;
                        if (mode == VOLUME_OPEN || attempt >= 3)
                                return api_error_set(reterr, r, API_ERROR_NOT_FOUND, "volume %s", name);
                }

                if (size == 0)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "creating volume %s needs a size",
                                name);
                r = files_create(s, name, v.path, size, &v, reterr);
                if (r >= 0)
                        break;
                if (r != -EEXIST)
                        return r;
                if (mode == VOLUME_NEW || attempt >= 3)
                        return api_error_set(reterr, r, API_ERROR_CONFLICT, "volume %s exists", name);
        }

        *ret = v;
        v = VOLUME_NULL;
        return 0;
}

static int files_delete(Storage *s, const char *name, ApiError *reterr) {
        _cleanup_free_ char *path = volume_path(s->dir, name);

        if (!path)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        if (unlink(path) < 0) {
                if (errno == ENOENT)
                        return 0;
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot delete volume %s: %s", name, strerror(errno));
        }
        return 1;
}

/* ---- systemd storage provider ---- */

#define PROVIDER_ERROR_PREFIX STORAGE_PROVIDER_INTERFACE "."

static const struct {
        const char *name;
        int error;
        ApiErrorCode code;
        const char *format; /* with the volume name */
} provider_errors[] = {
        { PROVIDER_ERROR_PREFIX "NoSuchVolume", -ENOENT, API_ERROR_NOT_FOUND, "volume %s" },
        { PROVIDER_ERROR_PREFIX "VolumeExists", -EEXIST, API_ERROR_CONFLICT, "volume %s exists" },
        { PROVIDER_ERROR_PREFIX "WrongType", -EMEDIUMTYPE, API_ERROR_CONFLICT, "volume %s has the wrong type" },
        { PROVIDER_ERROR_PREFIX "ReadOnlyVolume", -EROFS, API_ERROR_CONFLICT, "volume %s is read-only" },
        { PROVIDER_ERROR_PREFIX "NoSuchTemplate",
          -EINVAL,
          API_ERROR_INVALID_REQUEST,
          "volume %s: no such template" },
        { PROVIDER_ERROR_PREFIX "BadTemplate", -EINVAL, API_ERROR_INVALID_REQUEST, "volume %s: bad template" },
        { PROVIDER_ERROR_PREFIX "CreateSizeRequired",
          -EINVAL,
          API_ERROR_INVALID_REQUEST,
          "creating volume %s needs a size" },
        { "org.varlink.service.InvalidParameter",
          -EINVAL,
          API_ERROR_INVALID_REQUEST,
          "volume %s: the storage provider refused a parameter" },
        { PROVIDER_ERROR_PREFIX "TypeNotSupported",
          -EOPNOTSUPP,
          API_ERROR_UNSUPPORTED,
          "volume %s: the storage provider does not support regular file volumes" },
        { PROVIDER_ERROR_PREFIX "CreateNotSupported",
          -EOPNOTSUPP,
          API_ERROR_UNSUPPORTED,
          "volume %s: the storage provider cannot create volumes" },
};

static int provider_error(const char *error, const char *name, ApiError *reterr) {
        for (size_t i = 0; i < ELEMENTSOF(provider_errors); i++)
                if (streq(error, provider_errors[i].name))
                        return api_error_set(
                                reterr,
                                provider_errors[i].error,
                                provider_errors[i].code,
                                provider_errors[i].format,
                                name);

        return api_error_set(
                reterr, -EPROTO, API_ERROR_INTERNAL, "volume %s: storage provider error %s", name, error);
}

/* The volume's name in the file system: <volumeDir>/<name>.volume when that is the fd's inode, else the
 * fd's link target, unless the file has none (created with O_TMPFILE, or deleted). */
static int provider_resolve_path(Storage *s, const char *name, int fd, const struct stat *st, char **ret) {
        _cleanup_free_ char *path = NULL, *proc = NULL, *target = NULL;
        struct stat pst;

        if (s->dir) {
                path = volume_path(s->dir, name);
                if (!path)
                        return -ENOMEM;
                if (stat(path, &pst) >= 0 && pst.st_dev == st->st_dev && pst.st_ino == st->st_ino) {
                        *ret = TAKE_PTR(path);
                        return 0;
                }
        }

        if (asprintf(&proc, "/proc/self/fd/%d", fd) < 0)
                return -ENOMEM;
        /* PATH_MAX bounds what the kernel returns for a link target. */
        target = malloc(PATH_MAX + 1);
        if (!target)
                return -ENOMEM;
        ssize_t n = readlink(proc, target, PATH_MAX);
        if (n < 0) {
                (void) log_debug_errno(errno, "Cannot read %s for volume %s, ignoring: %m", proc, name);
                *ret = NULL;
                return 0;
        }
        target[n] = 0;

        const char *deleted = " (deleted)";
        size_t dl = strlen(deleted);
        if (target[0] != '/' || ((size_t) n >= dl && streq(target + n - dl, deleted))) {
                *ret = NULL;
                return 0;
        }
        *ret = TAKE_PTR(target);
        return 0;
}

static int provider_acquire(
        Storage *s, const char *name, uint64_t size, VolumeCreate mode, Volume *ret, ApiError *reterr) {
        _cleanup_(varlink_fds_done) VarlinkFds fds = {};
        _cleanup_(volume_done) Volume v = VOLUME_NULL;
        _cleanup_free_ char *error = NULL;
        json_auto_t *params = NULL, *reply = NULL;
        const char *type;
        json_t *index, *ro;
        struct stat st;
        bool creating = mode != VOLUME_OPEN;
        int r;

        params = json_pack(
                "{s:s,s:s,s:b}", "name", name, "createMode", volume_create_to_string(mode), "readOnly", false);
        if (!params)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        /* Without requestAs the system provider would make a directory volume. */
        if (creating && json_object_set_new(params, "requestAs", json_string("reg")) < 0)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        if (creating && size > 0) {
                if (size > (uint64_t) INT64_MAX)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "volume size %" PRIu64 " too large",
                                size);
                if (json_object_set_new(params, "createSizeBytes", json_integer((json_int_t) size)) < 0)
                        return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        }

        r = varlink_call(
                s->socket,
                STORAGE_PROVIDER_INTERFACE ".Acquire",
                params,
                STORAGE_ACQUIRE_TIMEOUT_USEC,
                &reply,
                &error,
                &fds);
        if (r == -ETIMEDOUT)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_TIMEOUT,
                        "storage provider did not answer Acquire of volume %s",
                        name);
        if (r < 0)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "storage provider failed on volume %s: %s",
                        name,
                        strerror(-r));
        if (error)
                return provider_error(error, name, reterr);

        type = json_string_value(json_object_get(reply, "type"));
        index = json_object_get(reply, "fileDescriptorIndex");
        ro = json_object_get(reply, "readOnly");
        if (!type || !json_is_integer(index) || (ro && !json_is_boolean(ro)))
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "invalid Acquire reply for volume %s", name);
        if (streq(type, "dir"))
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "%s is a directory volume, which vm-manager does not manage",
                        name);
        if (!streq(type, "reg") && !streq(type, "blk"))
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "volume %s has unknown type %s", name, type);

        json_int_t i = json_integer_value(index);
        if (i < 0 || (size_t) i >= fds.n)
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "Acquire reply for volume %s names fd %" JSON_INTEGER_FORMAT " of %zu",
                        name,
                        i,
                        fds.n);
        v.fd = TAKE_FD(fds.fds[i]);

        if (fstat(v.fd, &st) < 0)
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot stat volume %s: %s", name, strerror(errno));
        v.block = streq(type, "blk");
        if (v.block ? !S_ISBLK(st.st_mode) : !S_ISREG(st.st_mode))
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "volume %s is not of type %s", name, type);
        if (v.block) {
                uint64_t bytes;

                if (ioctl(v.fd, BLKGETSIZE64, &bytes) < 0)
                        return api_error_set(
                                reterr,
                                -errno,
                                API_ERROR_INTERNAL,
                                "cannot size volume %s: %s",
                                name,
                                strerror(errno));
                v.size = bytes;
        } else
                v.size = (uint64_t) st.st_size;
        v.read_only = json_is_true(ro);

        v.name = strdup(name);
        if (!v.name)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        r = provider_resolve_path(s, name, v.fd, &st, &v.path);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "out of memory");

        *ret = v;
        v = VOLUME_NULL;
        return 0;
}

static int provider_delete(Storage *s, const char *name, ApiError *reterr) {
        _cleanup_free_ char *path = NULL;
        struct stat st;

        if (!s->dir)
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "cannot delete volume %s: the storage provider has no Delete method and its volume directory is unknown",
                        name);

        path = volume_path(s->dir, name);
        if (!path)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        if (lstat(path, &st) < 0) {
                if (errno == ENOENT)
                        return 0;
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot delete volume %s: %s", name, strerror(errno));
        }
        if (S_ISDIR(st.st_mode))
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "%s is a directory volume, which vm-manager does not manage",
                        name);
        if (unlink(path) < 0) {
                if (errno == ENOENT)
                        return 0;
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot delete volume %s: %s", name, strerror(errno));
        }
        return 1;
}

/* ---- dispatch ---- */

int storage_acquire(
        Storage *s, const char *name, uint64_t size, VolumeCreate mode, Volume *ret, ApiError *reterr) {
        assert_return(s, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(mode >= 0 && mode < _VOLUME_CREATE_MAX, -EINVAL);

        if (!volume_name_is_valid(name))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "invalid volume name '%s'", strempty(name));

        if (s->kind == STORAGE_PROVIDER)
                return provider_acquire(s, name, size, mode, ret, reterr);
        return files_acquire(s, name, size, mode, ret, reterr);
}

int storage_delete(Storage *s, const char *name, ApiError *reterr) {
        assert_return(s, -EINVAL);

        if (!volume_name_is_valid(name))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "invalid volume name '%s'", strempty(name));

        if (s->kind == STORAGE_PROVIDER)
                return provider_delete(s, name, reterr);
        return files_delete(s, name, reterr);
}
