/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <libslirp.h>
#include <net/ethernet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "log.h"
#include "net-slirp.h"
#include "socket-util.h"
#include "time-util.h"

/* How slirp runs on sd-event.
 *
 * slirp wants, in one thread: slirp_pollfds_fill() (which sockets, which events, how long to
 * sleep), poll(), then slirp_pollfds_poll() (the results, plus its TCP timers). Here:
 *
 *  - fill runs from the prepare callback of the timeout source, just before the loop sleeps, and
 *    only when slirp was entered since the last fill (input, a poll pass, a forward changed):
 *    otherwise its answer cannot have changed. add_poll creates or updates one io source per fd
 *    and returns the fd itself as the index, so indexes stay valid across fills; fds slirp did
 *    not ask for this time are disabled (not set to no events: epoll reports HUP and ERR
 *    regardless, and slirp ignores a socket it did not ask about). Masks are only touched when
 *    they change, so a steady connection costs no epoll_ctl().
 *  - an io source records its revents on the fd and schedules a poll pass: a oneshot defer source
 *    at the io sources' priority. Older than an fd that fires again, it runs first; io sources
 *    pending from the same epoll_wait() usually join the same pass. A pass can leave an fd it
 *    read pending in sd-event with readiness that is gone: that dispatch is skipped (see
 *    net_slirp_poll()), and the fds are made non-blocking as a second line of defence. A hangup
 *    or error on an fd slirp only wants to write to is handed over as writability (see
 *    revents_for_slirp()).
 *  - the timeout source (always on: it carries the prepare callback), armed from fill's timeout,
 *    runs a pass itself when it expires: that is what drives slirp's TCP timers (delayed ACKs,
 *    retransmits, keepalive). Its deadline only moves earlier between expiries; an early expiry
 *    just costs one idle pass. slirp never asks for more than a second, so an idle instance
 *    wakes up once a second.
 *  - slirp's own timers (only the IPv6 RA timer in 4.7, never armed without IPv6) are oneshot
 *    time sources.
 *
 * fd lifetime in libslirp 4.7: every fd that slirp polls and later closes gets
 * unregister_poll_fd() first (tcp_close, udp_detach, icmp_detach, removal of a host forward), so
 * the io source is dropped before the fd number can be reused. register_poll_fd() however is not
 * called for listening sockets (host forwards), so sources are created lazily by add_poll, not
 * at registration. As a safety net, a registration of an fd we still track drops the old entry
 * (its socket must be gone), and a failing epoll update recreates the source. */

#define NET_SLIRP_MTU_DEFAULT 1500U
#define NET_SLIRP_MTU_MIN 68U    /* IF_MTU_MIN */
#define NET_SLIRP_MTU_MAX 65521U /* IF_MTU_MAX */
#define NET_SLIRP_FRAME_MIN 14U  /* an Ethernet header */
#define NET_SLIRP_FRAME_MAX (14U + 65535U)
#define NET_SLIRP_QUEUE_MAX 1024U /* frames waiting in net_slirp_input_later() */
#define NET_SLIRP_UNIX_FORWARDS_MAX 4096U
#define NET_SLIRP_HOST_FORWARDS_MAX 4096U
#define NET_SLIRP_TIMER_ACCURACY USEC_PER_MSEC
#define NET_SLIRP_GUEST_ERRORS_PER_SEC 10U

typedef struct NetSlirpFd {
        NetSlirp *slirp;
        int fd;
        size_t pos; /* index in NetSlirp.fds */
        sd_event_source *source;
        uint32_t events; /* EPOLL* the source is set to */
        bool enabled;
        int revents;       /* SLIRP_POLL_* seen since the last poll pass */
        bool stale;        /* the pending event predates a pass that read the fd: skip it */
        uint64_t fill_gen; /* the last fill that asked for this fd */
} NetSlirpFd;

typedef struct NetSlirpTimer {
        NetSlirp *slirp;
        SlirpTimerId id;
        void *cb_opaque;
        sd_event_source *source;
        struct NetSlirpTimer *prev, *next;
} NetSlirpTimer;

typedef struct NetSlirpUnixForward {
        struct in_addr addr;
        uint16_t port;
} NetSlirpUnixForward;

typedef struct NetSlirpFrame {
        struct NetSlirpFrame *next;
        size_t len;
        uint8_t data[];
} NetSlirpFrame;

struct NetSlirp {
        sd_event *event;
        Slirp *slirp;
        NetSlirpConfig config;
        NetSlirpOutput output;
        void *userdata;
        bool freeing;

        /* The fds slirp polls: by number (sparse, for add_poll and get_revents) and densely. */
        NetSlirpFd **by_fd;
        size_t n_by_fd;
        NetSlirpFd **fds;
        size_t n_fds, n_fds_alloc;

        uint64_t fill_gen;
        bool fill_needed;
        sd_event_source *timeout_source; /* its prepare callback runs fill */
        usec_t timeout_deadline;         /* USEC_INFINITY: not armed */
        sd_event_source *poll_source;    /* defer: one slirp_pollfds_poll() pass */

        NetSlirpTimer *timers;

        sd_event_source *input_source; /* defer: drains the queue */
        NetSlirpFrame *queue, **queue_tail;
        size_t n_queued;

        NetSlirpUnixForward *unix_forwards;
        size_t n_unix_forwards;
        char **host_forwards; /* socket paths slirp listens on */
        size_t n_host_forwards;

        usec_t guest_error_window;
        unsigned n_guest_errors;
};

DEFINE_TRIVIAL_CLEANUP_FUNC(NetSlirp *, net_slirp_free);

static uint32_t poll_to_epoll(int events) {
        uint32_t r = 0;

        if (events & SLIRP_POLL_IN)
                r |= EPOLLIN;
        if (events & SLIRP_POLL_OUT)
                r |= EPOLLOUT;
        if (events & SLIRP_POLL_PRI)
                r |= EPOLLPRI;
        if (events & SLIRP_POLL_ERR)
                r |= EPOLLERR;
        if (events & SLIRP_POLL_HUP)
                r |= EPOLLHUP;
        return r;
}

static int epoll_to_poll(uint32_t events) {
        int r = 0;

        if (events & EPOLLIN)
                r |= SLIRP_POLL_IN;
        if (events & EPOLLOUT)
                r |= SLIRP_POLL_OUT;
        if (events & EPOLLPRI)
                r |= SLIRP_POLL_PRI;
        if (events & EPOLLERR)
                r |= SLIRP_POLL_ERR;
        if (events & EPOLLHUP)
                r |= SLIRP_POLL_HUP;
        return r;
}

static void net_slirp_schedule_poll(NetSlirp *s) {
        int r;

        r = sd_event_source_set_enabled(s->poll_source, SD_EVENT_ONESHOT);
        if (r < 0)
                log_debug_errno(r, "slirp: cannot schedule a poll pass, ignoring: %m");
}

/* One slirp_pollfds_poll() pass: the revents recorded since the last one, and slirp's timers. */
static int cb_get_revents(int idx, void *opaque) {
        NetSlirp *s = opaque;

        if (idx < 0 || (size_t) idx >= s->n_by_fd || !s->by_fd[idx])
                return 0;
        return s->by_fd[idx]->revents;
}

static void net_slirp_poll(NetSlirp *s) {
        (void) sd_event_source_set_enabled(s->poll_source, SD_EVENT_OFF);

        slirp_pollfds_poll(s->slirp, /* select_error= */ 0, cb_get_revents, s);
        s->fill_needed = true;

        /* An fd slirp may have read in this pass can still be pending in sd-event from an epoll_wait()
         * before it, and that readiness may be gone: handing it to slirp next time could make it
         * block in accept() or recvfrom() (its listening, UDP and ICMP sockets are blocking).
         * Skip that dispatch; if the fd is still ready, level-triggered epoll reports it again. */
        for (size_t i = 0; i < s->n_fds; i++) {
                NetSlirpFd *f = s->fds[i];

                if (f->revents != 0 && f->source && sd_event_source_get_pending(f->source) != 0)
                        f->stale = true;
                f->revents = 0;
        }
}

static int on_poll(sd_event_source *source, void *userdata) {
        net_slirp_poll(userdata);
        return 0;
}

static int on_timeout(sd_event_source *source, uint64_t usec, void *userdata) {
        NetSlirp *s = userdata;

        s->timeout_deadline = USEC_INFINITY;
        net_slirp_poll(s);
        return 0;
}

/* What slirp is told of revents. slirp reads a TCP socket on any of IN, HUP and ERR, but it asks
 * for HUP only together with IN, while epoll reports HUP and ERR whatever was asked. A socket slirp
 * only wants to write to (it saw the end of the stream already, or its buffer towards the guest is
 * full) and whose peer shut down both ways would be read again (the end of the stream once more,
 * or nothing to read into) and never written: the write that fails and ends the connection would
 * not come, and level-triggered epoll would report the hangup again at once, for as long as the
 * peer keeps its end open. Such a hangup or error is handed over as writability instead: the write
 * tells slirp. */
static int revents_for_slirp(const NetSlirpFd *f, uint32_t revents) {
        int r = epoll_to_poll(revents);

        if (!(f->events & EPOLLIN) && (r & (SLIRP_POLL_HUP | SLIRP_POLL_ERR))) {
                r &= ~(SLIRP_POLL_HUP | SLIRP_POLL_ERR);
                if (f->events & EPOLLOUT)
                        r |= SLIRP_POLL_OUT;
        }
        return r;
}

static int on_io(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        NetSlirpFd *f = userdata;

        if (f->stale) {
                f->stale = false;
                return 0;
        }
        f->revents |= revents_for_slirp(f, revents);
        net_slirp_schedule_poll(f->slirp);
        return 0;
}

static NetSlirpFd *fd_get(NetSlirp *s, int fd) {
        if (fd < 0 || (size_t) fd >= s->n_by_fd)
                return NULL;
        return s->by_fd[fd];
}

static int fd_add(NetSlirp *s, int fd, NetSlirpFd **ret) {
        _cleanup_free_ NetSlirpFd *f = NULL;
        int flags;

        assert(fd >= 0);
        assert(!fd_get(s, fd));

        if ((size_t) fd >= s->n_by_fd) {
                size_t n = MAX((size_t) fd + 1, s->n_by_fd * 2);
                NetSlirpFd **a = reallocarray(s->by_fd, n, sizeof(NetSlirpFd *));
                if (!a)
                        return -ENOMEM;
                memset(a + s->n_by_fd, 0, (n - s->n_by_fd) * sizeof(NetSlirpFd *));
                s->by_fd = a;
                s->n_by_fd = n;
        }

        if (s->n_fds >= s->n_fds_alloc) {
                size_t n = MAX((size_t) 16, s->n_fds_alloc * 2);
                NetSlirpFd **a = reallocarray(s->fds, n, sizeof(NetSlirpFd *));
                if (!a)
                        return -ENOMEM;
                s->fds = a;
                s->n_fds_alloc = n;
        }

        f = calloc(1, sizeof(NetSlirpFd));
        if (!f)
                return -ENOMEM;
        f->slirp = s;
        f->fd = fd;
        f->pos = s->n_fds;

        /* slirp leaves listening, UDP and ICMP sockets blocking. Nothing here should let it see
         * readiness that is gone, but if it ever did, a spurious EAGAIN beats a stuck loop (and a
         * full UDP send buffer then drops a datagram instead of blocking the loop). */
        flags = fcntl(fd, F_GETFL);
        if (flags < 0 || (!(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0))
                log_debug_errno(errno, "slirp: cannot make fd %d non-blocking, ignoring: %m", fd);

        s->fds[s->n_fds++] = f;
        s->by_fd[fd] = f;
        *ret = TAKE_PTR(f);
        return 0;
}

static void fd_drop(NetSlirp *s, NetSlirpFd *f) {
        assert(s->fds[f->pos] == f);

        f->source = sd_event_source_disable_unref(f->source);
        s->by_fd[f->fd] = NULL;

        s->n_fds--;
        if (f->pos < s->n_fds) {
                s->fds[f->pos] = s->fds[s->n_fds];
                s->fds[f->pos]->pos = f->pos;
        }
        free(f);
}

/* Makes the fd's io source watch events, creating it if needed. */
static int fd_watch(NetSlirp *s, NetSlirpFd *f, uint32_t events) {
        int r;

        if (f->source) {
                if (f->enabled && f->events == events)
                        return 0;

                r = 0;
                if (f->events != events)
                        r = sd_event_source_set_io_events(f->source, events);
                if (r >= 0 && !f->enabled)
                        r = sd_event_source_set_enabled(f->source, SD_EVENT_ON);
                if (r >= 0) {
                        f->events = events;
                        f->enabled = true;
                        return 0;
                }

                /* The number may belong to a new socket now, if the old one was closed without
                 * unregister_poll_fd(): start over with a new source. */
                log_debug_errno(r, "slirp: cannot update the io source of fd %d, recreating it: %m", f->fd);
                f->source = sd_event_source_disable_unref(f->source);
                f->enabled = false;
                f->stale = false;
        }

        r = sd_event_add_io(s->event, &f->source, f->fd, events, on_io, f);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(f->source, "slirp-io");
        f->events = events;
        f->enabled = true;
        return 0;
}

static int cb_add_poll(int fd, int events, void *opaque) {
        NetSlirp *s = opaque;
        NetSlirpFd *f;
        int r;

        if (fd < 0)
                return -1;

        f = fd_get(s, fd);
        if (!f) {
                r = fd_add(s, fd, &f);
                if (r < 0)
                        goto fail;
        }

        f->fill_gen = s->fill_gen;
        r = fd_watch(s, f, poll_to_epoll(events));
        if (r < 0)
                goto fail;

        return fd;

fail:
        /* slirp does not poll this fd this time; try again at the next fill. */
        log_debug_errno(r, "slirp: cannot watch fd %d, ignoring: %m", fd);
        s->fill_needed = true;
        return -1;
}

static void net_slirp_fill(NetSlirp *s) {
        uint32_t timeout = UINT32_MAX;
        usec_t deadline;
        int r;

        s->fill_needed = false;
        s->fill_gen++;
        slirp_pollfds_fill(s->slirp, &timeout, cb_add_poll, s);

        for (size_t i = 0; i < s->n_fds; i++) {
                NetSlirpFd *f = s->fds[i];

                if (f->fill_gen == s->fill_gen || !f->enabled)
                        continue;
                r = sd_event_source_set_enabled(f->source, SD_EVENT_OFF);
                if (r < 0) {
                        log_debug_errno(
                                r, "slirp: cannot disable the io source of fd %d, dropping it: %m", f->fd);
                        f->source = sd_event_source_disable_unref(f->source);
                }
                f->enabled = false;
        }

        /* slirp caps the timeout at a second (TIMEOUT_DEFAULT), so the deadline is always finite. */
        if (timeout == UINT32_MAX)
                return;
        deadline = now_usec(CLOCK_MONOTONIC) + (usec_t) timeout * USEC_PER_MSEC;
        if (deadline >= s->timeout_deadline)
                return;

        r = sd_event_source_set_time(s->timeout_source, deadline);
        if (r < 0) {
                log_debug_errno(r, "slirp: cannot arm the timeout, ignoring: %m");
                return;
        }
        s->timeout_deadline = deadline;
}

static int on_prepare(sd_event_source *source, void *userdata) {
        NetSlirp *s = userdata;

        if (s->fill_needed)
                net_slirp_fill(s);
        return 0;
}

/* slirp callbacks */

static ssize_t cb_send_packet(const void *buf, size_t len, void *opaque) {
        NetSlirp *s = opaque;

        if (!s->freeing)
                s->output(buf, len, s->userdata);
        return (ssize_t) len;
}

static void cb_guest_error(const char *msg, void *opaque) {
        NetSlirp *s = opaque;
        usec_t now = now_usec(CLOCK_MONOTONIC);

        /* A guest decides how often this happens: keep the log bounded. */
        if (now >= s->guest_error_window + USEC_PER_SEC) {
                s->guest_error_window = now;
                s->n_guest_errors = 0;
        }
        if (s->n_guest_errors++ < NET_SLIRP_GUEST_ERRORS_PER_SEC)
                log_debug("slirp: guest error: %s", msg);
}

static int64_t cb_clock_get_ns(void *opaque) {
        struct timespec ts;

        if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
                return 0;
        return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int on_slirp_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        NetSlirpTimer *t = userdata;
        NetSlirp *s = t->slirp;

        slirp_handle_timer(s->slirp, t->id, t->cb_opaque);
        s->fill_needed = true;
        return 0;
}

static void *cb_timer_new_opaque(SlirpTimerId id, void *cb_opaque, void *opaque) {
        NetSlirp *s = opaque;
        _cleanup_free_ NetSlirpTimer *t = NULL;
        int r;

        t = calloc(1, sizeof(NetSlirpTimer));
        if (!t) {
                log_debug_errno(ENOMEM, "slirp: cannot allocate a timer, ignoring: %m");
                return NULL;
        }
        t->slirp = s;
        t->id = id;
        t->cb_opaque = cb_opaque;

        r = sd_event_add_time(
                s->event, &t->source, CLOCK_MONOTONIC, USEC_INFINITY, NET_SLIRP_TIMER_ACCURACY, on_slirp_timer, t);
        if (r < 0) {
                log_debug_errno(r, "slirp: cannot create a timer, ignoring: %m");
                return NULL;
        }
        (void) sd_event_source_set_enabled(t->source, SD_EVENT_OFF);
        (void) sd_event_source_set_description(t->source, "slirp-timer");

        t->next = s->timers;
        if (s->timers)
                s->timers->prev = t;
        s->timers = t;
        return TAKE_PTR(t);
}

static void *cb_timer_new(SlirpTimerCb cb, void *cb_opaque, void *opaque) {
        /* Only used by slirp when timer_new_opaque is missing, which it never is here. */
        return NULL;
}

static void cb_timer_free(void *timer, void *opaque) {
        NetSlirp *s = opaque;
        NetSlirpTimer *t = timer;

        if (!t)
                return;

        if (t->prev)
                t->prev->next = t->next;
        else
                s->timers = t->next;
        if (t->next)
                t->next->prev = t->prev;

        sd_event_source_disable_unref(t->source);
        free(t);
}

static void cb_timer_mod(void *timer, int64_t expire_time, void *opaque) {
        NetSlirpTimer *t = timer;
        int r;

        if (!t)
                return;

        /* expire_time is in milliseconds of cb_clock_get_ns()'s clock, CLOCK_MONOTONIC. */
        r = sd_event_source_set_time(t->source, (usec_t) MAX(expire_time, (int64_t) 0) * USEC_PER_MSEC);
        if (r >= 0)
                r = sd_event_source_set_enabled(t->source, SD_EVENT_ONESHOT);
        if (r < 0)
                log_debug_errno(r, "slirp: cannot arm a timer, ignoring: %m");
}

static void cb_register_poll_fd(int fd, void *opaque) {
        NetSlirp *s = opaque;
        NetSlirpFd *f = fd_get(s, fd);

        /* A new socket with a number we still track: the old socket is gone. */
        if (f)
                fd_drop(s, f);
}

static void cb_unregister_poll_fd(int fd, void *opaque) {
        NetSlirp *s = opaque;
        NetSlirpFd *f = fd_get(s, fd);

        /* slirp also calls this with -1, for sockets that never got an fd. */
        if (f)
                fd_drop(s, f);
}

static void cb_notify(void *opaque) {
        NetSlirp *s = opaque;

        /* Room appeared in a socket buffer: what to poll for has changed. slirp only calls this
         * from inside slirp_*(), so the loop iterates (and fills) right after anyway. */
        s->fill_needed = true;
}

static const SlirpCb net_slirp_callbacks = {
        .send_packet = cb_send_packet,
        .guest_error = cb_guest_error,
        .clock_get_ns = cb_clock_get_ns,
        .timer_new = cb_timer_new,
        .timer_free = cb_timer_free,
        .timer_mod = cb_timer_mod,
        .register_poll_fd = cb_register_poll_fd,
        .unregister_poll_fd = cb_unregister_poll_fd,
        .notify = cb_notify,
        .timer_new_opaque = cb_timer_new_opaque,
};

/* Input */

static void net_slirp_input_one(NetSlirp *s, const uint8_t *frame, size_t len) {
        slirp_input(s->slirp, frame, (int) len);
        s->fill_needed = true;

        /* ARP may resolve a guest slirp holds packets for. Those leave on the next poll pass, not
         * from slirp_input(): do not let them wait for the timeout (they expire after a second). */
        if (((unsigned) frame[12] << 8 | frame[13]) == ETHERTYPE_ARP)
                net_slirp_schedule_poll(s);
}

void net_slirp_input(NetSlirp *s, const uint8_t *frame, size_t len) {
        assert(s);

        if (!frame || len < NET_SLIRP_FRAME_MIN || len > NET_SLIRP_FRAME_MAX)
                return;
        net_slirp_input_one(s, frame, len);
}

static int on_input(sd_event_source *source, void *userdata) {
        NetSlirp *s = userdata;
        NetSlirpFrame *q = s->queue;

        /* Frames queued while these are handed over wait for the next dispatch. */
        s->queue = NULL;
        s->queue_tail = &s->queue;
        s->n_queued = 0;

        while (q) {
                NetSlirpFrame *next = q->next;

                net_slirp_input_one(s, q->data, q->len);
                free(q);
                q = next;
        }
        return 0;
}

int net_slirp_input_later(NetSlirp *s, const uint8_t *frame, size_t len) {
        NetSlirpFrame *q;
        int r;

        assert_return(s, -EINVAL);
        assert_return(frame, -EINVAL);
        assert_return(len >= NET_SLIRP_FRAME_MIN, -EINVAL);
        assert_return(len <= NET_SLIRP_FRAME_MAX, -EMSGSIZE);

        if (s->n_queued >= NET_SLIRP_QUEUE_MAX)
                return -ENOBUFS;

        q = malloc(offsetof(NetSlirpFrame, data) + len);
        if (!q)
                return -ENOMEM;
        q->next = NULL;
        q->len = len;
        memcpy(q->data, frame, len);

        r = sd_event_source_set_enabled(s->input_source, SD_EVENT_ONESHOT);
        if (r < 0) {
                free(q);
                return r;
        }

        *s->queue_tail = q;
        s->queue_tail = &q->next;
        s->n_queued++;
        return 0;
}

/* Forwards */

static bool net_slirp_is_guest_address(const NetSlirp *s, struct in_addr a) {
        const NetSlirpConfig *c = &s->config;

        return (a.s_addr & c->netmask.s_addr) == c->network.s_addr && a.s_addr != c->gateway.s_addr &&
                a.s_addr != c->host_alias.s_addr;
}

/* Slirp's forwards name their unix socket by address: every problem with the path is -EINVAL here. */
static int make_sockaddr_un(const char *path, struct sockaddr_un *ret, socklen_t *ret_len) {
        int len = sockaddr_un_set_path(ret, path);

        if (len < 0)
                return -EINVAL;
        *ret_len = (socklen_t) len;
        return 0;
}

static ssize_t net_slirp_find_unix_forward(NetSlirp *s, struct in_addr addr, uint16_t port) {
        for (size_t i = 0; i < s->n_unix_forwards; i++)
                if (s->unix_forwards[i].addr.s_addr == addr.s_addr && s->unix_forwards[i].port == port)
                        return (ssize_t) i;
        return -1;
}

int net_slirp_add_unix_forward(NetSlirp *s, const char *path, struct in_addr addr, uint16_t port) {
        NetSlirpUnixForward *a;
        struct sockaddr_un sa;
        socklen_t sa_len;
        struct in_addr guest = addr;
        int r;

        assert_return(s, -EINVAL);
        assert_return(port > 0, -EINVAL);

        if (!net_slirp_is_guest_address(s, addr))
                return -EINVAL;
        r = make_sockaddr_un(path, &sa, &sa_len);
        if (r < 0)
                return r;

        /* slirp 4.7 would take the same address and port twice: its check compares the port in
         * host order with the stored one in network order. */
        if (net_slirp_find_unix_forward(s, addr, port) >= 0)
                return -EEXIST;
        if (s->n_unix_forwards >= NET_SLIRP_UNIX_FORWARDS_MAX)
                return -ENOSPC;
        a = reallocarray(s->unix_forwards, s->n_unix_forwards + 1, sizeof(NetSlirpUnixForward));
        if (!a)
                return -ENOMEM;
        s->unix_forwards = a;

        if (slirp_add_unix(s->slirp, path, &guest, port) < 0)
                return -EINVAL;

        s->unix_forwards[s->n_unix_forwards++] = (NetSlirpUnixForward){ .addr = addr, .port = port };
        return 0;
}

int net_slirp_remove_unix_forward(NetSlirp *s, struct in_addr addr, uint16_t port) {
        ssize_t i;

        assert_return(s, -EINVAL);

        i = net_slirp_find_unix_forward(s, addr, port);
        if (i < 0)
                return -ENOENT;

        /* Connections made through the forward stay up: they own their sockets. */
        if (slirp_remove_guestfwd(s->slirp, addr, port) < 0)
                log_debug("slirp: unix forward to port %u was not registered, ignoring", port);

        s->unix_forwards[i] = s->unix_forwards[--s->n_unix_forwards];
        return 0;
}

static ssize_t net_slirp_find_host_forward(NetSlirp *s, const char *path) {
        for (size_t i = 0; i < s->n_host_forwards; i++)
                if (streq(s->host_forwards[i], path))
                        return (ssize_t) i;
        return -1;
}

/* Removes the socket file at path, if it is one: never a file of another kind. */
static int unlink_socket(const char *path) {
        struct stat st;

        if (lstat(path, &st) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISSOCK(st.st_mode))
                return -EEXIST;
        return RET_NERRNO(unlink(path));
}

int net_slirp_add_host_forward(NetSlirp *s, const char *path, struct in_addr guest, uint16_t port) {
        _cleanup_free_ char *p = NULL;
        struct sockaddr_un sa;
        struct sockaddr_in ga;
        socklen_t sa_len;
        char **a;
        int r;

        assert_return(s, -EINVAL);
        assert_return(port > 0, -EINVAL);

        if (!net_slirp_is_guest_address(s, guest))
                return -EINVAL;
        r = make_sockaddr_un(path, &sa, &sa_len);
        if (r < 0)
                return r;
        if (net_slirp_find_host_forward(s, path) >= 0)
                return -EEXIST;
        if (s->n_host_forwards >= NET_SLIRP_HOST_FORWARDS_MAX)
                return -ENOSPC;

        p = strdup(path);
        if (!p)
                return -ENOMEM;
        a = reallocarray(s->host_forwards, s->n_host_forwards + 1, sizeof(char *));
        if (!a)
                return -ENOMEM;
        s->host_forwards = a;

        /* A socket left by an earlier run would make bind() fail. */
        r = unlink_socket(path);
        if (r < 0)
                return r;

        ga = (struct sockaddr_in){
                .sin_family = AF_INET,
                .sin_addr = guest,
                .sin_port = htons(port),
        };
        errno = 0;
        if (slirp_add_hostxfwd(
                    s->slirp,
                    (const struct sockaddr *) &sa,
                    sa_len,
                    (const struct sockaddr *) &ga,
                    sizeof(ga),
                    /* flags= */ 0) < 0)
                return errno > 0 ? -errno : -EIO;

        s->host_forwards[s->n_host_forwards++] = TAKE_PTR(p);
        s->fill_needed = true; /* a new listening socket to poll */
        return 0;
}

int net_slirp_remove_host_forward(NetSlirp *s, const char *path) {
        struct sockaddr_un sa;
        socklen_t sa_len;
        ssize_t i;
        int r;

        assert_return(s, -EINVAL);

        r = make_sockaddr_un(path, &sa, &sa_len);
        if (r < 0)
                return r;
        i = net_slirp_find_host_forward(s, path);
        if (i < 0)
                return -ENOENT;

        if (slirp_remove_hostxfwd(s->slirp, (const struct sockaddr *) &sa, sa_len, /* flags= */ 0) < 0)
                log_debug("slirp: no listener for host forward '%s', ignoring", path);

        r = unlink_socket(path);
        if (r < 0)
                log_debug_errno(r, "slirp: cannot remove '%s', ignoring: %m", path);

        free(s->host_forwards[i]);
        s->host_forwards[i] = s->host_forwards[--s->n_host_forwards];
        s->fill_needed = true;
        return 0;
}

/* A free loopback port, by binding port 0 and letting it go: slirp cannot say which port it took for
 * 0 itself. Another process may grab it in between; the caller tries again. */
static int pick_loopback_port(uint16_t *ret) {
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr = { htonl(INADDR_LOOPBACK) } };
        socklen_t len = sizeof(sa);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), r = 0;

        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ||
            getsockname(fd, (struct sockaddr *) &sa, &len) < 0)
                r = -errno;
        (void) close(fd);
        if (r < 0)
                return r;
        *ret = ntohs(sa.sin_port);
        return 0;
}

int net_slirp_add_loopback_forward(
        NetSlirp *s, struct in_addr guest, uint16_t port, uint16_t want_host_port, uint16_t *ret_host_port) {
        struct sockaddr_in ga = { .sin_family = AF_INET, .sin_addr = guest, .sin_port = htons(port) };
        int r = -EADDRINUSE;

        assert_return(s, -EINVAL);
        assert_return(port > 0, -EINVAL);
        assert_return(ret_host_port, -EINVAL);

        if (!net_slirp_is_guest_address(s, guest))
                return -EINVAL;
        /* a given port is tried once; a free one is picked again when another process took it */
        for (unsigned attempt = 0; attempt < (want_host_port > 0 ? 1 : 8); attempt++) {
                struct sockaddr_in ha = { .sin_family = AF_INET, .sin_addr = { htonl(INADDR_LOOPBACK) } };
                uint16_t host_port = want_host_port;

                if (host_port == 0) {
                        r = pick_loopback_port(&host_port);
                        if (r < 0)
                                return r;
                }
                ha.sin_port = htons(host_port);
                errno = 0;
                if (slirp_add_hostxfwd(
                            s->slirp,
                            (const struct sockaddr *) &ha,
                            sizeof(ha),
                            (const struct sockaddr *) &ga,
                            sizeof(ga),
                            /* flags= */ 0) >= 0) {
                        s->fill_needed = true;
                        *ret_host_port = host_port;
                        return 0;
                }
                r = errno > 0 ? -errno : -EADDRINUSE;
        }
        return r;
}

int net_slirp_remove_loopback_forward(NetSlirp *s, uint16_t host_port) {
        struct sockaddr_in ha = {
                .sin_family = AF_INET,
                .sin_addr = { htonl(INADDR_LOOPBACK) },
                .sin_port = htons(host_port),
        };

        assert_return(s, -EINVAL);
        if (slirp_remove_hostxfwd(s->slirp, (const struct sockaddr *) &ha, sizeof(ha), /* flags= */ 0) < 0)
                return -ENOENT;
        s->fill_needed = true;
        return 0;
}

/* Life cycle */

int net_slirp_new(
        sd_event *e, const NetSlirpConfig *config, NetSlirpOutput output, void *userdata, NetSlirp **ret) {
        _cleanup_(net_slirp_freep) NetSlirp *s = NULL;
        SlirpConfig cfg;
        unsigned mtu;
        int r;

        assert_return(e, -EINVAL);
        assert_return(config, -EINVAL);
        assert_return(output, -EINVAL);
        assert_return(ret, -EINVAL);

        mtu = config->mtu ?: NET_SLIRP_MTU_DEFAULT;
        if (mtu < NET_SLIRP_MTU_MIN || mtu > NET_SLIRP_MTU_MAX)
                return -EINVAL;
        if ((config->network.s_addr & ~config->netmask.s_addr) != 0 ||
            (config->gateway.s_addr & config->netmask.s_addr) != config->network.s_addr ||
            (config->host_alias.s_addr & config->netmask.s_addr) != config->network.s_addr ||
            config->gateway.s_addr == config->host_alias.s_addr)
                return -EINVAL;

        s = calloc(1, sizeof(NetSlirp));
        if (!s)
                return -ENOMEM;
        s->event = sd_event_ref(e);
        s->config = *config;
        s->config.mtu = mtu;
        s->output = output;
        s->userdata = userdata;
        s->queue_tail = &s->queue;
        s->timeout_deadline = USEC_INFINITY;
        s->fill_needed = true;

        r = sd_event_add_time(
                e, &s->timeout_source, CLOCK_MONOTONIC, USEC_INFINITY, NET_SLIRP_TIMER_ACCURACY, on_timeout, s);
        if (r < 0)
                return r;
        /* Time sources start out oneshot: this one must stay on, or its prepare callback (the
         * fill) would stop running after the first expiry. */
        r = sd_event_source_set_enabled(s->timeout_source, SD_EVENT_ON);
        if (r < 0)
                return r;
        r = sd_event_source_set_prepare(s->timeout_source, on_prepare);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(s->timeout_source, "slirp-timeout");

        r = sd_event_add_defer(e, &s->poll_source, on_poll, s);
        if (r < 0)
                return r;
        r = sd_event_source_set_enabled(s->poll_source, SD_EVENT_OFF);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(s->poll_source, "slirp-poll");

        r = sd_event_add_defer(e, &s->input_source, on_input, s);
        if (r < 0)
                return r;
        r = sd_event_source_set_enabled(s->input_source, SD_EVENT_OFF);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(s->input_source, "slirp-input");

        cfg = (SlirpConfig){
                .version = 4,
                .restricted = 0,
                .in_enabled = true,
                .vnetwork = config->network,
                .vnetmask = config->netmask,
                .vhost = config->host_alias,
                .in6_enabled = false,
                /* slirp's DHCP server is off; the address only has to be inside the network. */
                .vdhcp_start = config->host_alias,
                .vnameserver = config->gateway,
                .if_mtu = mtu,
                .if_mru = mtu,
                .disable_host_loopback = !config->host_alias_enabled,
                .disable_dhcp = true,
        };
        s->slirp = slirp_new(&cfg, &net_slirp_callbacks, s);
        if (!s->slirp)
                return -EINVAL;

        *ret = TAKE_PTR(s);
        return 0;
}

NetSlirp *net_slirp_free(NetSlirp *s) {
        if (!s)
                return NULL;

        /* slirp_cleanup() closes every socket (unregistering them) and frees its timers. */
        s->freeing = true;
        if (s->slirp)
                slirp_cleanup(s->slirp);

        while (s->n_fds > 0)
                fd_drop(s, s->fds[s->n_fds - 1]);
        while (s->timers)
                cb_timer_free(s->timers, s);

        sd_event_source_disable_unref(s->timeout_source);
        sd_event_source_disable_unref(s->poll_source);
        sd_event_source_disable_unref(s->input_source);

        while (s->queue) {
                NetSlirpFrame *next = s->queue->next;
                free(s->queue);
                s->queue = next;
        }

        for (size_t i = 0; i < s->n_host_forwards; i++) {
                (void) unlink_socket(s->host_forwards[i]);
                free(s->host_forwards[i]);
        }
        free(s->host_forwards);
        free(s->unix_forwards);

        free(s->by_fd);
        free(s->fds);
        sd_event_unref(s->event);
        return mfree(s);
}
