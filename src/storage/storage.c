/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
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
        usec_t acquire_timeout;
        StorageCall *calls; /* in flight */
        unsigned n_calls;
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

/* One call on a fresh connection, on an sd-event loop: {"method","parameters"} is sent as the socket
 * takes it, the reply read as it comes until its NUL, and a timer ends the call at its deadline. Bytes
 * after the NUL (further messages) are ignored: one connection carries one call, and the call asks for
 * one reply. Nothing here waits. */
typedef struct VarlinkCall VarlinkCall;

/* The end of a call, once, from the loop: r < 0 when there is no reply (-ETIMEDOUT, -ECONNRESET, a
 * socket error, -EBADMSG/-EMSGSIZE/-EPROTO for one that is not a reply), else its parameters and its
 * error name (NULL on success), both borrowed; the descriptors that came with it are in c->fds, for the
 * callee to take. The callee may free the call's container (after varlink_call_done()). */
typedef void (*VarlinkReplyFunc)(VarlinkCall *c, int r, json_t *parameters, const char *error, void *userdata);

struct VarlinkCall {
        int fd;
        sd_event_source *io, *timer;
        const char *socket_path, *method; /* borrowed: they outlive the call (logs only) */
        char *request;                    /* with its NUL */
        size_t request_size, sent;
        char *buf; /* the reply as read so far */
        size_t len, cap;
        VarlinkFds fds;
        bool connected;
        VarlinkReplyFunc callback;
        void *userdata;
};

#define VARLINK_CALL_NULL ((VarlinkCall){ .fd = -EBADF })

static void varlink_call_done(VarlinkCall *c) {
        c->io = sd_event_source_disable_unref(c->io);
        c->timer = sd_event_source_disable_unref(c->timer);
        c->fd = safe_close(c->fd);
        c->request = mfree(c->request);
        c->buf = mfree(c->buf);
        c->len = c->cap = c->request_size = c->sent = 0;
        varlink_fds_done(&c->fds);
        c->callback = NULL;
}

/* Ends the call: the sources stop, the callback runs (and may free c). */
static void varlink_call_end(VarlinkCall *c, int r, json_t *parameters, const char *error) {
        VarlinkReplyFunc cb = c->callback;

        (void) sd_event_source_set_enabled(c->io, SD_EVENT_OFF);
        (void) sd_event_source_set_enabled(c->timer, SD_EVENT_OFF);
        c->callback = NULL;
        if (r < 0)
                log_debug_errno(r, "No reply to %s from %s: %m", c->method, c->socket_path);
        if (cb)
                cb(c, r, parameters, error, c->userdata);
}

/* Sends what the socket takes: 1 once the whole request is out. */
static int varlink_send_some(VarlinkCall *c) {
        while (c->sent < c->request_size) {
                ssize_t n = send(c->fd, c->request + c->sent, c->request_size - c->sent, MSG_NOSIGNAL);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                return 0;
                        return -errno;
                }
                c->sent += (size_t) n;
        }
        return 1;
}

/* Reads what there is, up to the first NUL: 1 once the reply is whole (c->len is then its length
 * without the NUL), 0 when the socket has nothing more for now. Descriptors arriving with any of the
 * reads are kept in c->fds. */
static int varlink_receive_some(VarlinkCall *c) {
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
                if (c->len > VARLINK_MESSAGE_MAX)
                        return -EMSGSIZE;
                want = MIN(VARLINK_READ_SIZE, VARLINK_MESSAGE_MAX + 1 - c->len);
                if (c->cap - c->len < want) {
                        size_t ncap = MIN(MAX(c->cap * 2, c->len + want), VARLINK_MESSAGE_MAX + 1);
                        char *p = realloc(c->buf, ncap);

                        if (!p)
                                return -ENOMEM;
                        c->buf = p;
                        c->cap = ncap;
                }

                iov = (struct iovec){ .iov_base = c->buf + c->len, .iov_len = want };
                n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                return 0;
                        return -errno;
                }
                varlink_fds_collect(&c->fds, &mh);
                if (mh.msg_flags & MSG_CTRUNC)
                        return -EBADMSG;
                if (n == 0)
                        return -ECONNRESET;

                nul = memchr(c->buf + c->len, 0, (size_t) n);
                if (nul) {
                        c->len = (size_t) (nul - c->buf);
                        return 1;
                }
                c->len += (size_t) n;
        }
}

static void varlink_call_reply(VarlinkCall *c) {
        _cleanup_free_ char *error = NULL;
        json_auto_t *params = NULL;
        bool continues;
        int r;

        r = varlink_parse_reply(c->buf, c->len, &params, &error, &continues);
        if (r < 0) {
                log_debug_errno(r, "Invalid reply to %s from %s: %m", c->method, c->socket_path);
                return varlink_call_end(c, r, NULL, NULL);
        }
        if (continues) {
                /* We never set "more", so a reply that announces more is a protocol violation. */
                log_debug("Unrequested continued reply to %s from %s", c->method, c->socket_path);
                return varlink_call_end(c, -EPROTO, NULL, NULL);
        }
        varlink_call_end(c, 0, params, error);
}

static int varlink_on_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        VarlinkCall *c = userdata;
        int r;

        if (!c->connected) {
                int err = 0;
                socklen_t err_len = sizeof(err);

                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) < 0)
                        err = errno;
                if (err != 0) {
                        varlink_call_end(c, -err, NULL, NULL);
                        return 0;
                }
                c->connected = true;
        }

        if (c->sent < c->request_size) {
                r = varlink_send_some(c);
                if (r <= 0) {
                        if (r < 0)
                                varlink_call_end(c, r, NULL, NULL);
                        return 0;
                }
                r = sd_event_source_set_io_events(s, EPOLLIN);
                if (r < 0)
                        varlink_call_end(c, r, NULL, NULL);
                return 0; /* the reply, when it comes, wakes us again */
        }

        r = varlink_receive_some(c);
        if (r < 0)
                varlink_call_end(c, r, NULL, NULL);
        else if (r > 0)
                varlink_call_reply(c);
        return 0;
}

static int varlink_on_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        varlink_call_end(userdata, -ETIMEDOUT, NULL, NULL);
        return 0;
}

/* Starts the call on event: connects (non-blocking), and the rest happens on the loop until callback.
 * A connection refused at once is returned here (the callback is then not called). */
static int varlink_call_start(
        VarlinkCall *c,
        sd_event *event,
        const char *socket_path,
        const char *method,
        json_t *parameters,
        usec_t timeout,
        VarlinkReplyFunc callback,
        void *userdata) {

        json_auto_t *msg = NULL;
        struct sockaddr_un sa;
        int r, len;

        *c = VARLINK_CALL_NULL;
        c->socket_path = socket_path;
        c->method = method;
        c->callback = callback;
        c->userdata = userdata;

        msg = json_pack("{s:s,s:O}", "method", method, "parameters", parameters);
        if (!msg)
                return -ENOMEM;
        c->request = json_dumps(msg, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!c->request)
                return -ENOMEM;
        c->request_size = strlen(c->request) + 1; /* the terminating NUL is part of the message */

        len = sockaddr_un_set_path(&sa, socket_path);
        if (len < 0)
                return -EINVAL;
        c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (c->fd < 0)
                return -errno;
        if (connect(c->fd, (const struct sockaddr *) &sa, (socklen_t) len) >= 0)
                c->connected = true;
        else if (errno != EINPROGRESS)
                return log_debug_errno(errno, "Cannot connect to varlink socket %s: %m", socket_path);

        r = sd_event_add_io(event, &c->io, c->fd, EPOLLOUT, varlink_on_io, c);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(c->io, "storage-varlink");
        r = sd_event_add_time_relative(
                event, &c->timer, CLOCK_MONOTONIC, timeout, USEC_PER_MSEC, varlink_on_timeout, c);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(c->timer, "storage-varlink-timeout");
        return 0;
}

typedef struct VarlinkSync {
        bool done;
        int r;
        json_t *parameters;
        char *error;
} VarlinkSync;

static void varlink_sync_on_reply(VarlinkCall *c, int r, json_t *parameters, const char *error, void *userdata) {
        VarlinkSync *s = userdata;

        s->done = true;
        s->r = r;
        if (r < 0)
                return;
        s->parameters = json_incref(parameters);
        if (error && !(s->error = strdup(error)))
                s->r = -ENOMEM;
}

/* The same call, waited for on a private loop: for start-up only (provider detection). Descriptors that
 * come with the reply are closed. */
static int varlink_call_sync(
        const char *socket_path,
        const char *method,
        json_t *parameters,
        usec_t timeout,
        json_t **ret_parameters,
        char **ret_error) {

        _cleanup_(sd_event_unrefp) sd_event *event = NULL;
        _cleanup_(varlink_call_done) VarlinkCall c = VARLINK_CALL_NULL;
        VarlinkSync s = {};
        int r;

        r = sd_event_new(&event);
        if (r < 0)
                return r;
        r = varlink_call_start(&c, event, socket_path, method, parameters, timeout, varlink_sync_on_reply, &s);
        if (r < 0)
                return r;
        while (!s.done) {
                r = sd_event_run(event, UINT64_MAX);
                if (r < 0)
                        break;
        }
        if (r >= 0)
                r = s.r;
        if (r < 0) {
                json_decref(s.parameters);
                free(s.error);
                return r;
        }
        *ret_parameters = s.parameters;
        *ret_error = s.error;
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
        r = varlink_call_sync(
                socket_path, "org.varlink.service.GetInfo", empty, STORAGE_GETINFO_TIMEOUT_USEC, &reply, &error);
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
        s->acquire_timeout = STORAGE_ACQUIRE_TIMEOUT_USEC;
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

        /* The detection waits (two GetInfo calls of 3 s at most, each on a private loop): it runs once,
         * in manager_new(), before the daemon's loop serves anything, because what follows it there
         * needs its answer at once (the VMs an earlier daemon left running take their leases again, and
         * stray disks are looked for in the volume directory it names). The calls made while the
         * daemon serves are storage_acquire_async()'s. */

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
        s->acquire_timeout = STORAGE_ACQUIRE_TIMEOUT_USEC;
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
        while (s->calls)
                storage_call_cancel(s->calls);
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

void storage_set_acquire_timeout(Storage *s, usec_t timeout) {
        assert(s);
        s->acquire_timeout = timeout;
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

static int files_delete_path(Storage *s, const char *name, char **ret_path, ApiError *reterr) {
        char *path = volume_path(s->dir, name);

        if (!path)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        *ret_path = path;
        return 0;
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

/* The parameters of Acquire. */
static int provider_acquire_params(
        const char *name, uint64_t size, VolumeCreate mode, json_t **ret, ApiError *reterr) {
        json_auto_t *params = NULL;
        bool creating = mode != VOLUME_OPEN;

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
        *ret = TAKE_PTR(params);
        return 0;
}

/* The volume from Acquire's outcome: r < 0 when the call got no reply, else the reply's parameters, its
 * error name and the descriptors that came with it (the volume's is taken from fds). */
static int provider_acquire_finish(
        Storage *s,
        const char *name,
        int r,
        json_t *reply,
        const char *error,
        VarlinkFds *fds,
        Volume *ret,
        ApiError *reterr) {

        _cleanup_(volume_done) Volume v = VOLUME_NULL;
        const char *type;
        json_t *index, *ro;
        struct stat st;

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
        if (i < 0 || (size_t) i >= fds->n)
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "Acquire reply for volume %s names fd %" JSON_INTEGER_FORMAT " of %zu",
                        name,
                        i,
                        fds->n);
        v.fd = TAKE_FD(fds->fds[i]);

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

static int provider_delete_path(Storage *s, const char *name, char **ret_path, ApiError *reterr) {
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
        *ret_path = TAKE_PTR(path);
        return 0;
}

/* ---- dispatch ---- */

struct StorageCall {
        Storage *storage;
        StorageCall *prev, *next; /* in storage->calls */
        char *name;
        uint64_t size;
        VolumeCreate mode;
        VarlinkCall varlink;    /* the provider's Acquire */
        sd_event_source *defer; /* the file provider's open, or a provider not reached */
        int connect_error;      /* ... and why */
        StorageAcquireFunc callback;
        void *userdata;
};

static StorageCall *storage_call_free(StorageCall *c) {
        if (!c)
                return NULL;
        if (c->storage) {
                if (c->prev)
                        c->prev->next = c->next;
                else
                        c->storage->calls = c->next;
                if (c->next)
                        c->next->prev = c->prev;
                c->storage->n_calls--;
        }
        varlink_call_done(&c->varlink);
        sd_event_source_disable_unref(c->defer);
        free(c->name);
        return mfree(c);
}

DEFINE_TRIVIAL_CLEANUP_FUNC(StorageCall *, storage_call_free);

/* The one end of a call: the callback, then the call is freed with what the callback left. */
static void storage_call_complete(StorageCall *c, int r, Volume *v, ApiError *e) {
        Volume empty = VOLUME_NULL;
        ApiError none = API_ERROR_NULL;

        c->callback(c, r, v ?: &empty, e ?: &none, c->userdata);
        volume_done(v ?: &empty);
        api_error_done(e ?: &none);
        storage_call_free(c);
}

StorageCall *storage_call_cancel(StorageCall *c) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        if (!c)
                return NULL;
        (void) api_error_set(
                &e, -ECANCELED, API_ERROR_CONFLICT, "volume %s: the request was cancelled", c->name);
        storage_call_complete(c, -ECANCELED, /* v= */ NULL, &e);
        return NULL;
}

static void provider_on_reply(VarlinkCall *vc, int r, json_t *parameters, const char *error, void *userdata) {
        StorageCall *c = userdata;
        _cleanup_(volume_done) Volume v = VOLUME_NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        r = provider_acquire_finish(c->storage, c->name, r, parameters, error, &vc->fds, &v, &e);
        storage_call_complete(c, r, &v, &e);
}

static int on_defer(sd_event_source *s, void *userdata) {
        StorageCall *c = userdata;
        _cleanup_(volume_done) Volume v = VOLUME_NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        if (c->storage->kind == STORAGE_PROVIDER)
                r = provider_acquire_finish(
                        c->storage,
                        c->name,
                        c->connect_error,
                        /* reply= */ NULL,
                        /* error= */ NULL,
                        /* fds= */ NULL,
                        &v,
                        &e);
        else
                r = files_acquire(c->storage, c->name, c->size, c->mode, &v, &e);
        storage_call_complete(c, r, &v, &e);
        return 0;
}

int storage_acquire_async(
        Storage *s,
        sd_event *event,
        const char *name,
        uint64_t size,
        VolumeCreate mode,
        StorageAcquireFunc callback,
        void *userdata,
        StorageCall **ret_call,
        ApiError *reterr) {

        _cleanup_(storage_call_freep) StorageCall *c = NULL;
        json_auto_t *params = NULL;
        int r;

        assert_return(s, -EINVAL);
        assert_return(event, -EINVAL);
        assert_return(callback, -EINVAL);
        assert_return(mode >= 0 && mode < _VOLUME_CREATE_MAX, -EINVAL);

        if (!volume_name_is_valid(name))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "invalid volume name '%s'", strempty(name));
        if (s->n_calls >= STORAGE_CALLS_MAX)
                return api_error_set(
                        reterr,
                        -EAGAIN,
                        API_ERROR_CONFLICT,
                        "%u volume requests are in flight, try again later",
                        STORAGE_CALLS_MAX);
        if (s->kind == STORAGE_PROVIDER) {
                r = provider_acquire_params(name, size, mode, &params, reterr);
                if (r < 0)
                        return r;
        }

        c = calloc(1, sizeof(StorageCall));
        if (!c)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        c->varlink = VARLINK_CALL_NULL;
        c->size = size;
        c->mode = mode;
        c->callback = callback;
        c->userdata = userdata;
        c->name = strdup(name);
        if (!c->name)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        if (s->kind == STORAGE_PROVIDER) {
                r = varlink_call_start(
                        &c->varlink,
                        event,
                        s->socket,
                        STORAGE_PROVIDER_INTERFACE ".Acquire",
                        params,
                        s->acquire_timeout,
                        provider_on_reply,
                        c);
                if (r == -ENOMEM)
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, "out of memory");
                if (r < 0) {
                        /* not reached (refused, gone, ...): that is an outcome too, from the loop */
                        varlink_call_done(&c->varlink);
                        c->connect_error = r;
                }
        }
        if (s->kind != STORAGE_PROVIDER || c->connect_error < 0) {
                r = sd_event_add_defer(event, &c->defer, on_defer, c);
                if (r < 0)
                        return api_error_set(
                                reterr, r, API_ERROR_INTERNAL, "cannot acquire volume %s: %s", name, strerror(-r));
                (void) sd_event_source_set_description(c->defer, "storage-acquire");
                r = sd_event_source_set_enabled(c->defer, SD_EVENT_ONESHOT);
                if (r < 0)
                        return api_error_set(
                                reterr, r, API_ERROR_INTERNAL, "cannot acquire volume %s: %s", name, strerror(-r));
        }

        /* in flight: listed, so that storage_free() ends it */
        c->storage = s;
        c->next = s->calls;
        if (s->calls)
                s->calls->prev = c;
        s->calls = c;
        s->n_calls++;
        if (ret_call)
                *ret_call = c;
        TAKE_PTR(c);
        return 0;
}

typedef struct AcquireSync {
        bool done;
        int r;
        Volume volume;
        ApiError error;
} AcquireSync;

static void acquire_sync_done(StorageCall *c, int r, Volume *v, ApiError *e, void *userdata) {
        AcquireSync *a = userdata;

        a->done = true;
        a->r = r;
        a->volume = *v;
        *v = VOLUME_NULL;
        a->error = *e;
        *e = API_ERROR_NULL;
}

int storage_acquire(
        Storage *s, const char *name, uint64_t size, VolumeCreate mode, Volume *ret, ApiError *reterr) {
        _cleanup_(sd_event_unrefp) sd_event *event = NULL;
        AcquireSync a = { .volume = VOLUME_NULL, .error = API_ERROR_NULL };
        StorageCall *c = NULL;
        int r;

        assert_return(s, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(mode >= 0 && mode < _VOLUME_CREATE_MAX, -EINVAL);

        r = sd_event_new(&event);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot acquire volume: %s", strerror(-r));
        r = storage_acquire_async(s, event, name, size, mode, acquire_sync_done, &a, &c, reterr);
        if (r < 0)
                return r;
        while (!a.done) {
                r = sd_event_run(event, UINT64_MAX);
                if (r < 0) {
                        storage_call_cancel(c); /* its sources belong to event: gone before it */
                        volume_done(&a.volume);
                        api_error_done(&a.error);
                        return api_error_set(
                                reterr, r, API_ERROR_INTERNAL, "cannot acquire volume %s: %s", name, strerror(-r));
                }
        }
        if (a.r < 0) {
                if (reterr) {
                        api_error_done(reterr);
                        *reterr = a.error;
                } else
                        api_error_done(&a.error);
                return a.r;
        }
        *ret = a.volume;
        return 0;
}

int storage_delete_path(Storage *s, const char *name, char **ret_path, ApiError *reterr) {
        assert_return(s && ret_path, -EINVAL);

        *ret_path = NULL;
        if (!volume_name_is_valid(name))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "invalid volume name '%s'", strempty(name));

        if (s->kind == STORAGE_PROVIDER)
                return provider_delete_path(s, name, ret_path, reterr);
        return files_delete_path(s, name, ret_path, reterr);
}

int storage_delete(Storage *s, const char *name, ApiError *reterr) {
        _cleanup_free_ char *path = NULL;
        int r;

        r = storage_delete_path(s, name, &path, reterr);
        if (r < 0 || !path)
                return r;
        if (unlink(path) < 0) {
                if (errno == ENOENT)
                        return 0;
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot delete volume %s: %s", name, strerror(errno));
        }
        return 1;
}
