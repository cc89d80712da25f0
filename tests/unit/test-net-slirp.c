/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cleanup.h"
#include "net-slirp.h"
#include "socket-util.h"
#include "time-util.h"

/* A real libslirp on a real sd-event loop, driven by hand-built frames from one guest,
 * 52:54:00:12:34:56 with 10.77.0.2 on 10.77.0.0/24 (gateway .1, host alias .254). */

#define NETWORK "10.77.0.0"
#define NETMASK "255.255.255.0"
#define GATEWAY "10.77.0.1"
#define HOST_ALIAS "10.77.0.254"
#define GUEST "10.77.0.2"

static const uint8_t guest_mac[6] = { 0x52, 0x54, 0x00, 0x12, 0x34, 0x56 };
static const uint8_t gateway_mac[6] = { 0x52, 0x55, 0x0a, 0x4d, 0x00, 0x01 }; /* slirp: 52:55:<ip> */
static const uint8_t broadcast_mac[6] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_PSH 0x08
#define TH_ACK 0x10

#define MAX_FRAMES 1024
#define RUN_TIMEOUT_MS 1500

/* libslirp 4.7's slirp_remove_guestfwd() frees a forward but not its unix path (misc.c,
 * remove_guestfwd()): the path of a unix forward that is removed again is leaked by the library.
 * The test that removes one adds it with leak tracking off, when built with LeakSanitizer. */
void __lsan_disable(void) __attribute__((weak));
void __lsan_enable(void) __attribute__((weak));

static struct in_addr addr(const char *s) {
        struct in_addr a;

        assert_int_equal(inet_pton(AF_INET, s, &a), 1);
        return a;
}

/* Frames */

static void put16(uint8_t *p, uint16_t v) {
        p[0] = v >> 8;
        p[1] = v & 0xff;
}

static void put32(uint8_t *p, uint32_t v) {
        put16(p, v >> 16);
        put16(p + 2, v & 0xffff);
}

static uint16_t get16(const uint8_t *p) {
        return (uint16_t) (p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p) {
        return (uint32_t) get16(p) << 16 | get16(p + 2);
}

static uint32_t csum_add(uint32_t sum, const uint8_t *p, size_t n) {
        for (size_t i = 0; i + 1 < n; i += 2)
                sum += get16(p + i);
        if (n & 1)
                sum += (uint32_t) p[n - 1] << 8;
        return sum;
}

static uint16_t csum_fold(uint32_t sum) {
        while (sum >> 16)
                sum = (sum & 0xffff) + (sum >> 16);
        return (uint16_t) ~sum;
}

static size_t build_eth(uint8_t *buf, const uint8_t dst[6], const uint8_t src[6], uint16_t type) {
        memcpy(buf, dst, 6);
        memcpy(buf + 6, src, 6);
        put16(buf + 12, type);
        return 14;
}

static size_t build_arp(
        uint8_t *buf,
        uint16_t op,
        const uint8_t dst[6],
        const uint8_t sha[6],
        struct in_addr spa,
        const uint8_t tha[6],
        struct in_addr tpa) {
        uint8_t *a = buf + build_eth(buf, dst, sha, 0x0806);

        put16(a, 1);
        put16(a + 2, 0x0800);
        a[4] = 6;
        a[5] = 4;
        put16(a + 6, op);
        memcpy(a + 8, sha, 6);
        memcpy(a + 14, &spa, 4);
        memcpy(a + 18, tha, 6);
        memcpy(a + 24, &tpa, 4);
        return 14 + 28;
}

typedef struct Segment {
        struct in_addr saddr, daddr;
        uint16_t sport, dport;
        uint32_t seq, ack;
        uint8_t flags;
        uint16_t win; /* 0 for 65535 when building */
        const uint8_t *payload;
        size_t len;
} Segment;

/* A TCP segment from the guest to the gateway's MAC. */
static size_t build_tcp(uint8_t *buf, const Segment *t) {
        uint8_t *ip = buf + build_eth(buf, gateway_mac, guest_mac, 0x0800);
        uint8_t *tcp = ip + 20;
        uint8_t pseudo[12];
        uint32_t sum;

        memset(ip, 0, 40);
        ip[0] = 0x45;
        put16(ip + 2, (uint16_t) (40 + t->len));
        put16(ip + 4, 1);
        put16(ip + 6, 0x4000);
        ip[8] = 64;
        ip[9] = 6;
        memcpy(ip + 12, &t->saddr, 4);
        memcpy(ip + 16, &t->daddr, 4);
        put16(ip + 10, csum_fold(csum_add(0, ip, 20)));

        put16(tcp, t->sport);
        put16(tcp + 2, t->dport);
        put32(tcp + 4, t->seq);
        put32(tcp + 8, t->ack);
        tcp[12] = 5 << 4;
        tcp[13] = t->flags;
        put16(tcp + 14, t->win ?: 65535);
        if (t->len > 0)
                memcpy(tcp + 20, t->payload, t->len);

        memcpy(pseudo, &t->saddr, 4);
        memcpy(pseudo + 4, &t->daddr, 4);
        pseudo[8] = 0;
        pseudo[9] = 6;
        put16(pseudo + 10, (uint16_t) (20 + t->len));
        sum = csum_add(0, pseudo, sizeof(pseudo));
        sum = csum_add(sum, tcp, 20 + t->len);
        put16(tcp + 16, csum_fold(sum));
        return 14 + 40 + t->len;
}

static bool parse_ipv4(const uint8_t *f, size_t len, uint8_t proto, const uint8_t **ret_l4, size_t *ret_l4_len) {
        size_t ihl, tot;

        if (len < 14 + 20 || get16(f + 12) != 0x0800)
                return false;
        f += 14;
        ihl = (size_t) (f[0] & 0x0f) * 4;
        tot = get16(f + 2);
        if ((f[0] >> 4) != 4 || ihl < 20 || tot < ihl || tot > len - 14 || f[9] != proto)
                return false;
        *ret_l4 = f + ihl;
        *ret_l4_len = tot - ihl;
        return true;
}

static bool parse_tcp(const uint8_t *f, size_t len, Segment *ret) {
        const uint8_t *tcp;
        size_t l, off;

        if (!parse_ipv4(f, len, 6, &tcp, &l) || l < 20)
                return false;
        off = (size_t) (tcp[12] >> 4) * 4;
        if (off < 20 || off > l)
                return false;

        *ret = (Segment){
                .sport = get16(tcp),
                .dport = get16(tcp + 2),
                .seq = get32(tcp + 4),
                .ack = get32(tcp + 8),
                .flags = tcp[13],
                .win = get16(tcp + 14),
                .payload = tcp + off,
                .len = l - off,
        };
        memcpy(&ret->saddr, f + 14 + 12, 4);
        memcpy(&ret->daddr, f + 14 + 16, 4);
        return true;
}

typedef struct Arp {
        uint16_t op;
        uint8_t sha[6];
        struct in_addr spa, tpa;
} Arp;

static bool parse_arp(const uint8_t *f, size_t len, Arp *ret) {
        if (len < 14 + 28 || get16(f + 12) != 0x0806)
                return false;
        f += 14;
        if (get16(f) != 1 || get16(f + 2) != 0x0800 || f[4] != 6 || f[5] != 4)
                return false;
        ret->op = get16(f + 6);
        memcpy(ret->sha, f + 8, 6);
        memcpy(&ret->spa, f + 14, 4);
        memcpy(&ret->tpa, f + 24, 4);
        return true;
}

/* Harness: the slirp instance, its output, and an automatic ARP answer for the guest. */

typedef struct Harness {
        sd_event *event;
        NetSlirp *slirp;
        char dir[64];

        uint8_t *frames[MAX_FRAMES];
        size_t lens[MAX_FRAMES];
        size_t n_frames;
        size_t cursor; /* frames before it were matched or skipped already */
        unsigned n_dropped;

        bool answer_arp;
        unsigned n_arp_answered;
        int arp_error;
} Harness;

static void on_output(const uint8_t *frame, size_t len, void *userdata) {
        Harness *h = userdata;
        Arp a;

        if (h->n_frames >= MAX_FRAMES) {
                h->n_dropped++;
                return;
        }
        h->frames[h->n_frames] = malloc(len);
        if (!h->frames[h->n_frames]) {
                h->n_dropped++;
                return;
        }
        memcpy(h->frames[h->n_frames], frame, len);
        h->lens[h->n_frames++] = len;

        /* slirp asks for the guest's MAC before it sends to it: the guest answers. slirp must not
         * be re-entered from here, hence input_later. */
        if (h->answer_arp && parse_arp(frame, len, &a) && a.op == 1 && a.tpa.s_addr == addr(GUEST).s_addr) {
                uint8_t reply[64];
                size_t n = build_arp(reply, 2, a.sha, guest_mac, addr(GUEST), a.sha, a.spa);
                int r = net_slirp_input_later(h->slirp, reply, n);

                if (r < 0)
                        h->arp_error = r;
                else
                        h->n_arp_answered++;
        }
}

static void harness_start(Harness *h, bool host_alias_enabled) {
        NetSlirpConfig c = {
                .network = addr(NETWORK),
                .netmask = addr(NETMASK),
                .gateway = addr(GATEWAY),
                .host_alias = addr(HOST_ALIAS),
                .host_alias_enabled = host_alias_enabled,
        };

        h->slirp = net_slirp_free(h->slirp);
        assert_ok(net_slirp_new(h->event, &c, on_output, h, &h->slirp));
}

/* Forgets the frames seen so far. */
static void harness_clear_frames(Harness *h) {
        for (size_t i = 0; i < h->n_frames; i++)
                h->frames[i] = mfree(h->frames[i]);
        h->n_frames = h->cursor = 0;
}

static int setup(void **state) {
        Harness *h = calloc(1, sizeof(Harness));

        assert_non_null(h);
        assert_ok(sd_event_new(&h->event));
        strcpy(h->dir, "/tmp/test-net-slirp-XXXXXX");
        assert_non_null(mkdtemp(h->dir));
        *state = h;
        return 0;
}

static int teardown(void **state) {
        Harness *h = *state;
        DIR *d;

        net_slirp_free(h->slirp);
        sd_event_unref(h->event);
        harness_clear_frames(h);

        d = opendir(h->dir);
        if (d) {
                struct dirent *de;

                while ((de = readdir(d)))
                        if (de->d_name[0] != '.')
                                (void) unlinkat(dirfd(d), de->d_name, 0);
                closedir(d);
        }
        (void) rmdir(h->dir);
        free(h);
        return 0;
}

static void harness_path(Harness *h, const char *name, char *buf, size_t size) {
        int n = snprintf(buf, size, "%s/%s", h->dir, name);
        assert_true(n > 0 && (size_t) n < size);
}

static void send_tcp(Harness *h, const Segment *t) {
        uint8_t buf[2048];

        net_slirp_input(h->slirp, buf, build_tcp(buf, t));
}

/* Runs the loop until cond holds, for at most RUN_TIMEOUT_MS. */
static bool run_until(Harness *h, bool (*cond)(Harness *h, void *userdata), void *userdata) {
        usec_t end = now_usec(CLOCK_MONOTONIC) + RUN_TIMEOUT_MS * USEC_PER_MSEC;

        for (;;) {
                if (cond(h, userdata))
                        return true;
                if (now_usec(CLOCK_MONOTONIC) >= end)
                        return false;
                assert_true(sd_event_run(h->event, 10 * USEC_PER_MSEC) >= 0);
        }
}

static void run_for(Harness *h, unsigned ms) {
        usec_t end = now_usec(CLOCK_MONOTONIC) + ms * USEC_PER_MSEC;

        while (now_usec(CLOCK_MONOTONIC) < end)
                assert_true(sd_event_run(h->event, 10 * USEC_PER_MSEC) >= 0);
}

/* A segment from slirp to the guest: addresses and ports given are matched (0 = any), the flags
 * in 'set' must be set and those in 'clear' clear; found becomes the segment. */
typedef struct TcpMatch {
        struct in_addr saddr;
        uint16_t sport, dport;
        uint8_t set, clear;
        bool match_ack;
        uint32_t ack;
        size_t min_len;
        Segment found;
} TcpMatch;

static bool cond_tcp(Harness *h, void *userdata) {
        TcpMatch *m = userdata;

        for (; h->cursor < h->n_frames; h->cursor++) {
                Segment t;

                if (!parse_tcp(h->frames[h->cursor], h->lens[h->cursor], &t))
                        continue;
                if (t.daddr.s_addr != addr(GUEST).s_addr)
                        continue;
                if ((m->saddr.s_addr && t.saddr.s_addr != m->saddr.s_addr) ||
                    (m->sport && t.sport != m->sport) || (m->dport && t.dport != m->dport))
                        continue;
                if ((t.flags & m->set) != m->set || (t.flags & m->clear) != 0)
                        continue;
                if ((m->match_ack && t.ack != m->ack) || t.len < m->min_len)
                        continue;

                m->found = t;
                h->cursor++;
                return true;
        }
        return false;
}

typedef struct Accept {
        int listen_fd;
        int fd;
} Accept;

static bool cond_accept(Harness *h, void *userdata) {
        Accept *a = userdata;

        a->fd = accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (a->fd >= 0)
                return true;
        assert_int_equal(errno, EAGAIN);
        return false;
}

typedef struct Read {
        int fd;
        char buf[256];
        size_t len;
        const char *want;
} Read;

static bool cond_read(Harness *h, void *userdata) {
        Read *r = userdata;
        ssize_t n;

        n = read(r->fd, r->buf + r->len, sizeof(r->buf) - 1 - r->len);
        if (n < 0)
                assert_int_equal(errno, EAGAIN);
        else
                r->len += (size_t) n;
        r->buf[r->len] = 0;
        return r->len >= strlen(r->want);
}

static bool cond_frames(Harness *h, void *userdata) {
        return h->n_frames >= *(size_t *) userdata;
}

static bool cond_icmp_unreachable(Harness *h, void *userdata) {
        for (; h->cursor < h->n_frames; h->cursor++) {
                const uint8_t *icmp;
                size_t l;

                if (parse_ipv4(h->frames[h->cursor], h->lens[h->cursor], 1, &icmp, &l) && l >= 8 &&
                    icmp[0] == 3) {
                        h->cursor++;
                        return true;
                }
        }
        return false;
}

static int unix_listener(const char *path) {
        int fd = unix_stream_listen(path, 4);

        assert_ok(fd);
        return fd;
}

static int unix_connect(const char *path) {
        int fd = unix_stream_connect(path, /* nonblock= */ false);

        if (fd >= 0)
                assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
        return fd;
}

/* Tests */

static void test_arp_gateway(void **state) {
        Harness *h = *state;
        uint8_t buf[64];
        size_t n;
        Arp a;

        harness_start(h, false);
        n = build_arp(buf, 1, broadcast_mac, guest_mac, addr(GUEST), (const uint8_t[6]){ 0 }, addr(GATEWAY));

        /* At once: the reply comes out of net_slirp_input() itself. */
        net_slirp_input(h->slirp, buf, n);
        assert_int_equal(h->n_frames, 1);
        assert_true(parse_arp(h->frames[0], h->lens[0], &a));
        assert_int_equal(a.op, 2);
        assert_int_equal(a.spa.s_addr, addr(GATEWAY).s_addr);
        assert_int_equal(a.tpa.s_addr, addr(GUEST).s_addr);
        assert_memory_equal(a.sha, gateway_mac, 6);
        assert_memory_equal(h->frames[0], guest_mac, 6);

        /* Later: nothing until the loop runs. */
        assert_ok(net_slirp_input_later(h->slirp, buf, n));
        assert_int_equal(h->n_frames, 1);
        assert_true(run_until(h, cond_frames, (size_t[]){ 2 }));
        assert_int_equal(h->n_frames, 2);
        assert_true(parse_arp(h->frames[1], h->lens[1], &a));
        assert_int_equal(a.op, 2);
        assert_int_equal(a.spa.s_addr, addr(GATEWAY).s_addr);

        /* Nothing for an address slirp does not own. */
        n = build_arp(
                buf, 1, broadcast_mac, guest_mac, addr(GUEST), (const uint8_t[6]){ 0 }, addr("10.77.0.9"));
        net_slirp_input(h->slirp, buf, n);
        run_for(h, 20);
        assert_int_equal(h->n_frames, 2);

        assert_errno(net_slirp_input_later(h->slirp, buf, 10), -EINVAL);
}

/* The guest connects from sport to the unix forward on dport (sequence numbers from 1000 on): the
 * unix side's fd once slirp connected it; slirp's ISN and window in ret_isn and ret_win. */
static int handshake(
        Harness *h, int listen_fd, uint16_t sport, uint16_t dport, uint32_t *ret_isn, uint32_t *ret_win) {
        TcpMatch m;
        Accept ac;

        send_tcp(
                h,
                &(Segment){ .saddr = addr(GUEST),
                            .daddr = addr(NETWORK),
                            .sport = sport,
                            .dport = dport,
                            .seq = 1000,
                            .flags = TH_SYN });
        m = (TcpMatch){ .saddr = addr(NETWORK), .sport = dport, .dport = sport, .set = TH_SYN | TH_ACK };
        assert_true(run_until(h, cond_tcp, &m));
        *ret_isn = m.found.seq;
        *ret_win = m.found.win;
        send_tcp(
                h,
                &(Segment){ .saddr = addr(GUEST),
                            .daddr = addr(NETWORK),
                            .sport = sport,
                            .dport = dport,
                            .seq = 1001,
                            .ack = m.found.seq + 1,
                            .flags = TH_ACK });
        ac = (Accept){ .listen_fd = listen_fd, .fd = -EBADF };
        assert_true(run_until(h, cond_accept, &ac));
        harness_clear_frames(h);
        return ac.fd;
}

static void test_unix_forward(void **state) {
        Harness *h = *state;
        char path[128];
        _cleanup_close_ int listen_fd = -EBADF, conn = -EBADF;
        TcpMatch m;
        Accept ac;
        Read rd;
        uint32_t isn;

        harness_start(h, false);
        h->answer_arp = true;
        harness_path(h, "imds.sock", path, sizeof(path));
        listen_fd = unix_listener(path);
        assert_ok(net_slirp_add_unix_forward(h->slirp, path, addr(NETWORK), 10002));

        /* SYN: slirp ARPs for the guest (answered by the harness), then answers SYN-ACK. */
        send_tcp(
                h,
                &(Segment){ .saddr = addr(GUEST),
                            .daddr = addr(NETWORK),
                            .sport = 40000,
                            .dport = 10002,
                            .seq = 1000,
                            .flags = TH_SYN });
        m = (TcpMatch){ .saddr = addr(NETWORK),
                        .sport = 10002,
                        .dport = 40000,
                        .set = TH_SYN | TH_ACK,
                        .match_ack = true,
                        .ack = 1001 };
        assert_true(run_until(h, cond_tcp, &m));
        assert_true(h->n_arp_answered >= 1);
        assert_ok(h->arp_error);
        isn = m.found.seq;

        /* The handshake completes: slirp connects to the unix socket. */
        send_tcp(
                h,
                &(Segment){ .saddr = addr(GUEST),
                            .daddr = addr(NETWORK),
                            .sport = 40000,
                            .dport = 10002,
                            .seq = 1001,
                            .ack = isn + 1,
                            .flags = TH_ACK });
        ac = (Accept){ .listen_fd = listen_fd, .fd = -EBADF };
        assert_true(run_until(h, cond_accept, &ac));
        conn = ac.fd;

        /* Guest → unix socket. A window change keeps slirp off its fast path, so the ACK is a
         * delayed one: not sent from net_slirp_input(), but by the pass the timeout source runs. */
        send_tcp(
                h,
                &(Segment){ .saddr = addr(GUEST),
                            .daddr = addr(NETWORK),
                            .sport = 40000,
                            .dport = 10002,
                            .seq = 1001,
                            .ack = isn + 1,
                            .flags = TH_PSH | TH_ACK,
                            .win = 32768,
                            .payload = (const uint8_t *) "GET /",
                            .len = 5 });
        m = (TcpMatch){ .saddr = addr(NETWORK), .sport = 10002, .set = TH_ACK, .match_ack = true, .ack = 1006 };
        assert_false(cond_tcp(h, &m));
        assert_true(run_until(h, cond_tcp, &m));
        rd = (Read){ .fd = conn, .want = "GET /" };
        assert_true(run_until(h, cond_read, &rd));
        assert_string_equal(rd.buf, "GET /");

        /* Unix socket → guest. */
        assert_int_equal(write(conn, "HTTP/1.0 200 OK\r\n", 17), 17);
        m = (TcpMatch){ .saddr = addr(NETWORK), .sport = 10002, .dport = 40000, .set = TH_ACK, .min_len = 17 };
        assert_true(run_until(h, cond_tcp, &m));
        assert_int_equal(m.found.seq, isn + 1);
        assert_int_equal(m.found.len, 17);
        assert_memory_equal(m.found.payload, "HTTP/1.0 200 OK\r\n", 17);

        /* The unix side closes: FIN to the guest. */
        conn = safe_close(conn);
        m = (TcpMatch){ .saddr = addr(NETWORK), .sport = 10002, .set = TH_FIN };
        assert_true(run_until(h, cond_tcp, &m));
        assert_int_equal(h->n_dropped, 0);
}

/* Bulk data both ways through one unix forward connection, with a guest TCP that ACKs every
 * segment and honours slirp's window: exercises flow control (sockets dropping out of and back
 * into the poll set as buffers fill and drain). */
#define BULK_SIZE (512U * 1024U)
#define BULK_MSS 1460U

static uint8_t bulk_byte(size_t i) {
        return (uint8_t) (i * 7 + i / 251);
}

static void test_bulk(void **state) {
        Harness *h = *state;
        char path[128];
        _cleanup_close_ int listen_fd = -EBADF, conn = -EBADF;
        _cleanup_free_ uint8_t *out = NULL, *in = NULL, *pattern = NULL;
        size_t written = 0, received = 0, to_guest = 0;
        uint32_t isn, snd_una = 1001, snd_nxt = 1001, rcv_nxt, win = 0;
        usec_t end, last_progress;

        out = malloc(BULK_SIZE);
        in = malloc(BULK_SIZE);
        pattern = malloc(BULK_SIZE);
        assert_non_null(out);
        assert_non_null(in);
        assert_non_null(pattern);
        for (size_t i = 0; i < BULK_SIZE; i++)
                pattern[i] = bulk_byte(i);

        harness_start(h, false);
        h->answer_arp = true;
        harness_path(h, "bulk.sock", path, sizeof(path));
        listen_fd = unix_listener(path);
        assert_ok(net_slirp_add_unix_forward(h->slirp, path, addr(NETWORK), 10005));

        conn = handshake(h, listen_fd, 40005, 10005, &isn, &win);
        rcv_nxt = isn + 1;

        end = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;
        last_progress = now_usec(CLOCK_MONOTONIC);
        while (received < BULK_SIZE || to_guest < BULK_SIZE) {
                bool ack = false;
                ssize_t n;

                assert_true(now_usec(CLOCK_MONOTONIC) < end);

                /* The unix side writes its half and reads the guest's. */
                if (written < BULK_SIZE) {
                        n = write(conn, pattern + written, BULK_SIZE - written);
                        if (n < 0)
                                assert_int_equal(errno, EAGAIN);
                        else
                                written += (size_t) n;
                }
                if (received < BULK_SIZE) {
                        n = read(conn, in + received, BULK_SIZE - received);
                        if (n < 0)
                                assert_int_equal(errno, EAGAIN);
                        else {
                                assert_true(n > 0);
                                received += (size_t) n;
                        }
                }

                /* The guest sends within slirp's window, going back after a stall. */
                if (now_usec(CLOCK_MONOTONIC) > last_progress + 300 * USEC_PER_MSEC)
                        snd_nxt = snd_una;
                while (snd_nxt - 1001 < BULK_SIZE && snd_nxt - snd_una + BULK_MSS <= win) {
                        size_t off = snd_nxt - 1001, len = MIN((size_t) BULK_MSS, BULK_SIZE - off);

                        send_tcp(
                                h,
                                &(Segment){ .saddr = addr(GUEST),
                                            .daddr = addr(NETWORK),
                                            .sport = 40005,
                                            .dport = 10005,
                                            .seq = snd_nxt,
                                            .ack = rcv_nxt,
                                            .flags = TH_ACK,
                                            .payload = pattern + off,
                                            .len = len });
                        snd_nxt += len;
                }

                assert_true(sd_event_run(h->event, 10 * USEC_PER_MSEC) >= 0);

                /* The guest takes in-order data and ACKs. */
                for (; h->cursor < h->n_frames; h->cursor++) {
                        Segment t;

                        if (parse_tcp(h->frames[h->cursor], h->lens[h->cursor], &t) && t.sport == 10005) {
                                assert_true((t.flags & (TH_RST | TH_FIN)) == 0);
                                if (t.flags & TH_ACK && (int32_t) (t.ack - snd_una) >= 0) {
                                        if (t.ack != snd_una)
                                                last_progress = now_usec(CLOCK_MONOTONIC);
                                        snd_una = t.ack;
                                        win = t.win;
                                }
                                if (t.len > 0 && t.seq == rcv_nxt) {
                                        assert_true(to_guest + t.len <= BULK_SIZE);
                                        memcpy(out + to_guest, t.payload, t.len);
                                        to_guest += t.len;
                                        rcv_nxt += (uint32_t) t.len;
                                        last_progress = now_usec(CLOCK_MONOTONIC);
                                }
                                if (t.len > 0)
                                        ack = true;
                        }
                        h->frames[h->cursor] = mfree(h->frames[h->cursor]);
                }
                harness_clear_frames(h);
                if (ack)
                        send_tcp(
                                h,
                                &(Segment){ .saddr = addr(GUEST),
                                            .daddr = addr(NETWORK),
                                            .sport = 40005,
                                            .dport = 10005,
                                            .seq = snd_nxt,
                                            .ack = rcv_nxt,
                                            .flags = TH_ACK });
        }

        assert_memory_equal(out, pattern, BULK_SIZE);
        assert_memory_equal(in, pattern, BULK_SIZE);
        assert_int_equal(h->n_dropped, 0);
}

/* The unix side shuts down while slirp still holds bytes of the guest's it could not write there
 * (the daemon had stopped reading), or closes once it read all its socket held while slirp holds
 * more. slirp then only wants to write to the socket, and epoll reports its hangup for as long as
 * slirp keeps it. A hangup handed over as such makes slirp read again (the end of the stream, once
 * more) and never try the write that would fail and end the connection: the loop would wake up for
 * it again and again. It must go quiet instead. */
static void peer_closed_pending(Harness *h, bool drain_and_close) {
        char path[128];
        _cleanup_close_ int listen_fd = -EBADF, conn = -EBADF;
        _cleanup_free_ uint8_t *pattern = NULL;
        uint32_t isn, snd_una = 1001, snd_nxt = 1001, win;
        unsigned dispatched = 0;
        usec_t end, last_progress;

        pattern = malloc(BULK_MSS);
        assert_non_null(pattern);
        memset(pattern, 'x', BULK_MSS);

        harness_start(h, false);
        h->answer_arp = true;
        harness_path(h, "pending.sock", path, sizeof(path));
        listen_fd = unix_listener(path);
        assert_ok(net_slirp_add_unix_forward(h->slirp, path, addr(NETWORK), 10006));

        conn = handshake(h, listen_fd, 40006, 10006, &isn, &win);

        /* The guest sends within slirp's window until it closes: the unix side reads nothing, so
         * its socket fills first, then slirp's buffer. */
        end = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;
        last_progress = now_usec(CLOCK_MONOTONIC);
        while (now_usec(CLOCK_MONOTONIC) < last_progress + 300 * USEC_PER_MSEC) {
                assert_true(now_usec(CLOCK_MONOTONIC) < end);
                if (snd_nxt != snd_una && now_usec(CLOCK_MONOTONIC) > last_progress + 100 * USEC_PER_MSEC)
                        snd_nxt = snd_una;
                while (snd_nxt - snd_una + BULK_MSS <= win) {
                        send_tcp(
                                h,
                                &(Segment){ .saddr = addr(GUEST),
                                            .daddr = addr(NETWORK),
                                            .sport = 40006,
                                            .dport = 10006,
                                            .seq = snd_nxt,
                                            .ack = isn + 1,
                                            .flags = TH_ACK,
                                            .payload = pattern,
                                            .len = BULK_MSS });
                        snd_nxt += BULK_MSS;
                }
                assert_true(sd_event_run(h->event, 10 * USEC_PER_MSEC) >= 0);
                for (; h->cursor < h->n_frames; h->cursor++) {
                        Segment t;

                        if (parse_tcp(h->frames[h->cursor], h->lens[h->cursor], &t) && t.sport == 10006 &&
                            t.flags & TH_ACK && (int32_t) (t.ack - snd_una) >= 0) {
                                if (t.ack != snd_una)
                                        last_progress = now_usec(CLOCK_MONOTONIC);
                                snd_una = t.ack;
                                win = t.win;
                        }
                }
                harness_clear_frames(h);
        }
        /* slirp took more than the unix socket did: some of it waits in slirp */
        assert_true(win < BULK_MSS);
        assert_true(snd_una - 1001 > 0);

        if (drain_and_close) {
                /* as MHD closes a connection after reading what it had: nothing left unread in
                 * the socket, which would make it a reset */
                uint8_t buf[65536];

                while (read(conn, buf, sizeof(buf)) > 0)
                        ;
                conn = safe_close(conn);
        } else
                /* as the HTTP server ends a connection it gives up on: the fd stays open until
                 * MHD lets go of it */
                assert_int_equal(shutdown(conn, SHUT_RDWR), 0);
        run_for(h, 100);
        harness_clear_frames(h);

        /* Quiet now: slirp's timers wake the loop a few hundred times a second at most. */
        end = now_usec(CLOCK_MONOTONIC) + 500 * USEC_PER_MSEC;
        while (now_usec(CLOCK_MONOTONIC) < end) {
                int r = sd_event_run(h->event, 10 * USEC_PER_MSEC);

                assert_true(r >= 0);
                if (r > 0)
                        dispatched++;
                harness_clear_frames(h);
        }
        print_message("# %u dispatches in 500 ms after the unix side went away\n", dispatched);
        assert_true(dispatched < 400);
        assert_int_equal(h->n_dropped, 0);
}

static void test_peer_shut_down_pending(void **state) {
        peer_closed_pending(*state, false);
}

static void test_peer_closed_pending(void **state) {
        peer_closed_pending(*state, true);
}

static void test_unix_forward_remove(void **state) {
        Harness *h = *state;
        char path[128];
        int r;

        harness_start(h, false);
        harness_path(h, "imds.sock", path, sizeof(path));

        if (__lsan_disable)
                __lsan_disable();
        r = net_slirp_add_unix_forward(h->slirp, path, addr(NETWORK), 10003);
        if (__lsan_enable)
                __lsan_enable();
        assert_ok(r);

        assert_errno(net_slirp_add_unix_forward(h->slirp, path, addr(NETWORK), 10003), -EEXIST);
        assert_ok(net_slirp_remove_unix_forward(h->slirp, addr(NETWORK), 10003));
        assert_errno(net_slirp_remove_unix_forward(h->slirp, addr(NETWORK), 10003), -ENOENT);
        /* Freed by net_slirp_free(). */
        assert_ok(net_slirp_add_unix_forward(h->slirp, path, addr(NETWORK), 10003));
        assert_ok(net_slirp_add_unix_forward(h->slirp, path, addr(NETWORK), 10004));
        assert_ok(net_slirp_add_unix_forward(h->slirp, path, addr("10.77.0.7"), 10003));
}

static void test_host_forward(void **state) {
        Harness *h = *state;
        char path[128];
        _cleanup_close_ int client = -EBADF;
        TcpMatch m;
        Read rd;
        uint32_t isn;

        harness_start(h, false);
        h->answer_arp = true;
        harness_path(h, "ssh.sock", path, sizeof(path));
        assert_ok(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 22));
        assert_errno(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 22), -EEXIST);
        assert_int_equal(access(path, F_OK), 0);

        /* A connection to the path becomes a SYN from the host alias to guest:22. */
        client = unix_connect(path);
        assert_true(client >= 0);
        m = (TcpMatch){ .saddr = addr(HOST_ALIAS), .dport = 22, .set = TH_SYN, .clear = TH_ACK };
        assert_true(run_until(h, cond_tcp, &m));
        assert_true(h->n_arp_answered >= 1);
        isn = m.found.seq;

        /* The guest accepts and speaks first; the client reads it. */
        send_tcp(
                h,
                &(Segment){ .saddr = addr(GUEST),
                            .daddr = addr(HOST_ALIAS),
                            .sport = 22,
                            .dport = m.found.sport,
                            .seq = 5000,
                            .ack = isn + 1,
                            .flags = TH_SYN | TH_ACK });
        send_tcp(
                h,
                &(Segment){ .saddr = addr(GUEST),
                            .daddr = addr(HOST_ALIAS),
                            .sport = 22,
                            .dport = m.found.sport,
                            .seq = 5001,
                            .ack = isn + 1,
                            .flags = TH_PSH | TH_ACK,
                            .payload = (const uint8_t *) "SSH-2.0-x\r\n",
                            .len = 11 });
        rd = (Read){ .fd = client, .want = "SSH-2.0-x\r\n" };
        assert_true(run_until(h, cond_read, &rd));
        assert_string_equal(rd.buf, "SSH-2.0-x\r\n");

        /* Removal closes the listener and removes the socket file; the path can be used again. */
        assert_ok(net_slirp_remove_host_forward(h->slirp, path));
        assert_errno(net_slirp_remove_host_forward(h->slirp, path), -ENOENT);
        assert_int_equal(access(path, F_OK), -1);
        assert_int_equal(unix_connect(path), -ENOENT);
        assert_ok(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 22));
        run_for(h, 20);
}

/* The timeout source keeps running fills after it fired: with nothing to do, slirp asks for a pass a
 * second later; a host forward added after that expiry must still get its listener polled. */
static void test_timeout_rearms(void **state) {
        Harness *h = *state;
        char path[128];
        _cleanup_close_ int client = -EBADF;
        TcpMatch m;

        harness_start(h, false);
        h->answer_arp = true;
        run_for(h, 1100);

        harness_path(h, "late.sock", path, sizeof(path));
        assert_ok(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 22));
        client = unix_connect(path);
        assert_true(client >= 0);
        m = (TcpMatch){ .saddr = addr(HOST_ALIAS), .dport = 22, .set = TH_SYN, .clear = TH_ACK };
        assert_true(run_until(h, cond_tcp, &m));
}

static bool cond_arp_for_guest(Harness *h, void *userdata) {
        for (; h->cursor < h->n_frames; h->cursor++) {
                Arp a;

                if (parse_arp(h->frames[h->cursor], h->lens[h->cursor], &a) && a.op == 1 &&
                    a.tpa.s_addr == addr(GUEST).s_addr) {
                        h->cursor++;
                        return true;
                }
        }
        return false;
}

/* The pass that accepts a connection runs while the listener's io source is pending again from an
 * epoll_wait() before it; that readiness is gone by the time it is dispatched, and slirp's
 * listening socket is blocking: handed to slirp, it would hang the loop in accept(). (Nothing
 * else is pending here, which makes that order certain: the guest does not answer ARP.) */
static void test_stale_readiness(void **state) {
        Harness *h = *state;
        char path[128];
        _cleanup_close_ int client = -EBADF;
        uint8_t buf[64];
        TcpMatch m;

        harness_start(h, false);
        harness_path(h, "ssh.sock", path, sizeof(path));
        assert_ok(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 22));
        client = unix_connect(path);
        assert_true(client >= 0);

        alarm(10);
        assert_true(run_until(h, cond_arp_for_guest, NULL));
        run_for(h, 50);
        alarm(0);

        /* The connection was accepted once, and its SYN leaves once the guest answers. */
        net_slirp_input(
                h->slirp,
                buf,
                build_arp(
                        buf,
                        2,
                        (const uint8_t[6]){ 0x52, 0x55, 0x0a, 0x4d, 0x00, 0xfe },
                        guest_mac,
                        addr(GUEST),
                        guest_mac,
                        addr(HOST_ALIAS)));
        m = (TcpMatch){ .saddr = addr(HOST_ALIAS), .dport = 22, .set = TH_SYN, .clear = TH_ACK };
        assert_true(run_until(h, cond_tcp, &m));
        run_for(h, 20);
        assert_false(cond_tcp(h, &m));
}

static void test_refusals(void **state) {
        Harness *h = *state;
        char path[128], long_path[200];
        _cleanup_close_ int fd = -EBADF;
        NetSlirp *s;
        NetSlirpConfig bad = {
                .network = addr(NETWORK),
                .netmask = addr(NETMASK),
                .gateway = addr("10.78.0.1"),
                .host_alias = addr(HOST_ALIAS),
        };

        harness_start(h, false);
        harness_path(h, "x.sock", path, sizeof(path));
        memset(long_path, 'a', sizeof(long_path));
        long_path[0] = '/';
        long_path[108] = 0; /* 108 bytes: one too many for sun_path */

        /* Unix forwards only to guest addresses inside the network. */
        assert_errno(net_slirp_add_unix_forward(h->slirp, path, addr(GATEWAY), 80), -EINVAL);
        assert_errno(net_slirp_add_unix_forward(h->slirp, path, addr(HOST_ALIAS), 80), -EINVAL);
        assert_errno(net_slirp_add_unix_forward(h->slirp, path, addr("169.254.169.254"), 80), -EINVAL);
        assert_errno(net_slirp_add_unix_forward(h->slirp, path, addr(NETWORK), 0), -EINVAL);
        assert_errno(net_slirp_add_unix_forward(h->slirp, long_path, addr(NETWORK), 80), -EINVAL);
        long_path[107] = 0; /* 107 bytes fit */
        assert_ok(net_slirp_add_unix_forward(h->slirp, long_path, addr(NETWORK), 80));
        assert_errno(net_slirp_add_unix_forward(h->slirp, "", addr(NETWORK), 81), -EINVAL);
        assert_errno(net_slirp_remove_unix_forward(h->slirp, addr(NETWORK), 81), -ENOENT);

        /* Host forwards. */
        long_path[107] = 'a';
        assert_errno(net_slirp_add_host_forward(h->slirp, long_path, addr(GUEST), 22), -EINVAL);
        assert_errno(net_slirp_add_host_forward(h->slirp, path, addr(GATEWAY), 22), -EINVAL);
        assert_errno(net_slirp_add_host_forward(h->slirp, path, addr("10.1.2.3"), 22), -EINVAL);
        assert_errno(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 0), -EINVAL);
        assert_errno(net_slirp_remove_host_forward(h->slirp, path), -ENOENT);

        /* A stale socket is replaced, any other file is left alone. */
        fd = unix_listener(path);
        fd = safe_close(fd);
        assert_ok(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 22));
        assert_ok(net_slirp_remove_host_forward(h->slirp, path));
        fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_errno(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 22), -EEXIST);
        assert_int_equal(access(path, F_OK), 0);
        harness_path(h, "missing/y.sock", path, sizeof(path));
        assert_errno(net_slirp_add_host_forward(h->slirp, path, addr(GUEST), 22), -ENOENT);

        /* Bad configurations. */
        assert_errno(net_slirp_new(h->event, &bad, on_output, h, &s), -EINVAL);
        bad.gateway = addr(HOST_ALIAS);
        assert_errno(net_slirp_new(h->event, &bad, on_output, h, &s), -EINVAL);
        bad.gateway = addr(GATEWAY);
        bad.mtu = 20;
        assert_errno(net_slirp_new(h->event, &bad, on_output, h, &s), -EINVAL);
}

static void test_host_loopback(void **state) {
        Harness *h = *state;
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t sl = sizeof(sa);
        _cleanup_close_ int listen_fd = -EBADF, fd = -EBADF;
        Segment syn;
        Accept ac;

        listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        assert_true(listen_fd >= 0);
        assert_int_equal(bind(listen_fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        assert_int_equal(listen(listen_fd, 4), 0);
        assert_int_equal(getsockname(listen_fd, (struct sockaddr *) &sa, &sl), 0);

        syn = (Segment){ .saddr = addr(GUEST),
                         .daddr = addr(HOST_ALIAS),
                         .sport = 40001,
                         .dport = ntohs(sa.sin_port),
                         .seq = 7000,
                         .flags = TH_SYN };

        /* Disabled: slirp refuses with ICMP unreachable and the listener sees nothing. */
        harness_start(h, false);
        h->answer_arp = true;
        send_tcp(h, &syn);
        assert_true(run_until(h, cond_icmp_unreachable, NULL));
        run_for(h, 50);
        fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        assert_int_equal(fd, -1);
        assert_int_equal(errno, EAGAIN);

        /* Enabled: the same SYN reaches the host's loopback. */
        harness_start(h, true);
        send_tcp(h, &syn);
        ac = (Accept){ .listen_fd = listen_fd, .fd = -EBADF };
        assert_true(run_until(h, cond_accept, &ac));
        fd = ac.fd;
}

static void test_free_live(void **state) {
        Harness *h = *state;
        char fwd[128], imds[128];
        _cleanup_close_ int client = -EBADF, listen_fd = -EBADF;
        uint8_t buf[64];
        TcpMatch m;

        harness_start(h, false);
        h->answer_arp = true;
        harness_path(h, "ssh.sock", fwd, sizeof(fwd));
        harness_path(h, "imds.sock", imds, sizeof(imds));
        listen_fd = unix_listener(imds);
        assert_ok(net_slirp_add_unix_forward(h->slirp, imds, addr(NETWORK), 10002));
        assert_ok(net_slirp_add_host_forward(h->slirp, fwd, addr(GUEST), 22));

        /* A connection in flight, a guest connection half open, and frames still queued. */
        client = unix_connect(fwd);
        assert_true(client >= 0);
        m = (TcpMatch){ .saddr = addr(HOST_ALIAS), .dport = 22, .set = TH_SYN };
        assert_true(run_until(h, cond_tcp, &m));
        send_tcp(
                h,
                &(Segment){ .saddr = addr(GUEST),
                            .daddr = addr(NETWORK),
                            .sport = 40000,
                            .dport = 10002,
                            .seq = 1,
                            .flags = TH_SYN });
        for (unsigned i = 0; i < 8; i++)
                assert_ok(net_slirp_input_later(
                        h->slirp,
                        buf,
                        build_arp(
                                buf,
                                1,
                                broadcast_mac,
                                guest_mac,
                                addr(GUEST),
                                (const uint8_t[6]){ 0 },
                                addr(GATEWAY))));

        h->slirp = net_slirp_free(h->slirp);
        assert_null(net_slirp_free(NULL));

        /* The listener and its file are gone; the loop has nothing of slirp's left to run. */
        assert_int_equal(access(fwd, F_OK), -1);
        run_for(h, 20);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_arp_gateway, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unix_forward, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bulk, setup, teardown),
                cmocka_unit_test_setup_teardown(test_peer_shut_down_pending, setup, teardown),
                cmocka_unit_test_setup_teardown(test_peer_closed_pending, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unix_forward_remove, setup, teardown),
                cmocka_unit_test_setup_teardown(test_host_forward, setup, teardown),
                cmocka_unit_test_setup_teardown(test_timeout_rearms, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stale_readiness, setup, teardown),
                cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
                cmocka_unit_test_setup_teardown(test_host_loopback, setup, teardown),
                cmocka_unit_test_setup_teardown(test_free_live, setup, teardown),
        };

        /* slirp writes to sockets whose peer is gone, as in the daemon, which ignores SIGPIPE too */
        signal(SIGPIPE, SIG_IGN);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
