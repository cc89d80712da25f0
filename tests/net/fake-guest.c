/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * fake-guest: plays a VM on a QEMU "-netdev stream" link, where each Ethernet frame (without FCS) is
 * preceded by its length as a 32-bit big-endian integer. It carries a tiny blocking IPv4 stack:
 * Ethernet, ARP, a DHCP client, UDP, and a minimal TCP client and server (fixed window, in-order
 * data only, no retransmission except for SYNs). The actions given on the command line run in
 * order and each prints exactly one line on stdout, starting with "ok " or "fail ".
 *
 * While any action waits, ARP requests for the guest's own address are answered and unrelated
 * frames are ignored. FAKE_GUEST_DEBUG=1 prints every frame on stderr.
 */

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME 65536
#define ETH_HLEN 14
#define IP_HLEN 20
#define TCP_HLEN 20
#define LINK_MTU 1500
#define ETHERTYPE_IPV4 0x0800
#define ETHERTYPE_ARP 0x0806
#define ETHERTYPE_IPV6 0x86dd
#define PROTO_ICMP 1
#define PROTO_TCP 6
#define PROTO_UDP 17
#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_PSH 0x08
#define TH_ACK 0x10
#define TCP_WINDOW 65535
#define SYN_RETRY_MS 1000
#define GREETING_DELAY_MS 200
#define MAX_CONNS 32
#define HTTP_MAX (64 * 1024)
#define BODY_MAX 200
#define DHCP_FIXED 240

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
#define streq(a, b) (strcmp((a), (b)) == 0)

enum { DHCP_DISCOVER = 1, DHCP_OFFER = 2, DHCP_REQUEST = 3, DHCP_ACK = 5, DHCP_NAK = 6 };

static const uint8_t mac_broadcast[6] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
static const uint8_t mac_zero[6] = {};

typedef struct Guest {
        int fd;
        bool debug;
        uint8_t mac[6];
        uint32_t ip, mask, router; /* host byte order; 0 when unknown */
        uint8_t router_mac[6];
        bool router_mac_known;
        uint16_t ip_id;
        size_t rlen;
        uint8_t rbuf[2 * (4 + MAX_FRAME)]; /* bytes read from the stream, not yet split into frames */
        size_t flen;
        uint8_t frame[MAX_FRAME]; /* the frame recv_frame() returned last */
} Guest;

/* A parsed frame. Pointers borrow from the frame buffer. */
typedef struct Pkt {
        const uint8_t *dst_mac, *src_mac;
        uint16_t type;
        const uint8_t *l3;
        size_t l3len;
        uint32_t src, dst; /* IPv4 */
        uint8_t proto;
        const uint8_t *l4;
        size_t l4len;
        uint16_t sport, dport; /* UDP and TCP */
        uint32_t seq, ack;     /* TCP */
        uint8_t flags;
        const uint8_t *data;
        size_t dlen;
} Pkt;

typedef struct Conn {
        bool used, established, replied, fin_sent, fin_rcvd;
        uint8_t mac[6]; /* next hop */
        uint32_t rip;
        uint16_t lport, rport;
        uint32_t iss, snd_nxt, rcv_nxt;
        uint64_t established_at;
} Conn;

typedef enum ActionType {
        ACTION_DHCP,
        ACTION_DHCP_NONE,
        ACTION_ARP,
        ACTION_TCP,
        ACTION_TCP_FAIL,
        ACTION_HTTP,
        ACTION_SERVE,
        ACTION_SPOOF_IP,
        ACTION_SPOOF_MAC,
        ACTION_SLEEP,
        ACTION_IPV6,
        _ACTION_MAX,
        _ACTION_INVALID = -EINVAL,
} ActionType;

static const struct {
        const char *name;
        unsigned n_args;
} action_table[_ACTION_MAX] = {
        [ACTION_DHCP] = { "dhcp", 0 },
        [ACTION_DHCP_NONE] = { "dhcp-none", 0 },
        [ACTION_ARP] = { "arp", 1 },
        [ACTION_TCP] = { "tcp", 1 },
        [ACTION_TCP_FAIL] = { "tcp-fail", 1 },
        [ACTION_HTTP] = { "http", 2 },
        [ACTION_SERVE] = { "serve", 1 },
        [ACTION_SPOOF_IP] = { "send-spoofed-ip", 1 },
        [ACTION_SPOOF_MAC] = { "send-spoofed-mac", 1 },
        [ACTION_SLEEP] = { "sleep", 1 },
        [ACTION_IPV6] = { "ipv6", 0 },
};

typedef struct Action {
        ActionType type;
        char **args; /* borrowed from argv, action_table[type].n_args of them */
        uint32_t ip;
        uint16_t port;
        uint8_t mac[6];
        const char *path;
        unsigned long ms;
} Action;

typedef struct IpStr {
        char s[INET_ADDRSTRLEN];
} IpStr;

typedef struct MacStr {
        char s[18];
} MacStr;

static uint16_t get16(const uint8_t *p) {
        return (uint16_t) (p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p) {
        return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

static void put16(uint8_t *p, uint16_t v) {
        p[0] = v >> 8;
        p[1] = v & 0xff;
}

static void put32(uint8_t *p, uint32_t v) {
        put16(p, v >> 16);
        put16(p + 2, v & 0xffff);
}

static IpStr ip_str(uint32_t ip) {
        struct in_addr a = { .s_addr = htonl(ip) };
        IpStr r;

        (void) inet_ntop(AF_INET, &a, r.s, sizeof(r.s));
        return r;
}

static MacStr mac_str(const uint8_t *m) {
        MacStr r;

        (void) snprintf(r.s, sizeof(r.s), "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
        return r;
}

static uint64_t now_ms(void) {
        struct timespec ts;
        int r;

        r = clock_gettime(CLOCK_MONOTONIC, &ts);
        assert(r == 0);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

static uint32_t random32(void) {
        uint32_t v;

        if (getrandom(&v, sizeof(v), 0) != (ssize_t) sizeof(v))
                v = (uint32_t) now_ms() * 2654435761u ^ (uint32_t) getpid();
        return v;
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

/* The TCP/UDP checksum over the IPv4 pseudo header; 0 when checking a segment with a valid one. */
static uint16_t l4_csum(uint32_t src, uint32_t dst, uint8_t proto, const uint8_t *l4, size_t len) {
        uint8_t ph[12] = {};

        put32(ph, src);
        put32(ph + 4, dst);
        ph[9] = proto;
        put16(ph + 10, (uint16_t) len);
        return csum_fold(csum_add(csum_add(0, ph, sizeof(ph)), l4, len));
}

/* Fills *p; false for malformed frames and bad IPv4/UDP/TCP checksums (a real guest drops those). */
static bool parse_frame(const uint8_t *f, size_t len, Pkt *p) {
        *p = (Pkt){};
        if (len < ETH_HLEN)
                return false;
        p->dst_mac = f;
        p->src_mac = f + 6;
        p->type = get16(f + 12);
        p->l3 = f + ETH_HLEN;
        p->l3len = len - ETH_HLEN;
        if (p->type != ETHERTYPE_IPV4)
                return true;

        const uint8_t *ip = p->l3;
        if (p->l3len < IP_HLEN || ip[0] >> 4 != 4)
                return false;
        size_t hl = (ip[0] & 0xf) * 4u, tl = get16(ip + 2);
        if (hl < IP_HLEN || tl < hl || tl > p->l3len || csum_fold(csum_add(0, ip, hl)) != 0)
                return false;
        if ((get16(ip + 6) & 0x3fff) != 0) /* fragments are not supported */
                return false;
        p->src = get32(ip + 12);
        p->dst = get32(ip + 16);
        p->proto = ip[9];
        p->l4 = ip + hl;
        p->l4len = tl - hl;

        if (p->proto == PROTO_UDP) {
                if (p->l4len < 8 || get16(p->l4 + 4) < 8 || get16(p->l4 + 4) > p->l4len)
                        return false;
                p->l4len = get16(p->l4 + 4);
                if (get16(p->l4 + 6) != 0 && l4_csum(p->src, p->dst, p->proto, p->l4, p->l4len) != 0)
                        return false;
                p->data = p->l4 + 8;
                p->dlen = p->l4len - 8;
        } else if (p->proto == PROTO_TCP) {
                if (p->l4len < TCP_HLEN)
                        return false;
                size_t off = (p->l4[12] >> 4) * 4u;
                if (off < TCP_HLEN || off > p->l4len || l4_csum(p->src, p->dst, p->proto, p->l4, p->l4len) != 0)
                        return false;
                p->seq = get32(p->l4 + 4);
                p->ack = get32(p->l4 + 8);
                p->flags = p->l4[13];
                p->data = p->l4 + off;
                p->dlen = p->l4len - off;
        } else
                return true;

        p->sport = get16(p->l4);
        p->dport = get16(p->l4 + 2);
        return true;
}

static void debug_frame(const Guest *g, const char *dir, const uint8_t *f, size_t len) {
        Pkt p;

        if (!g->debug)
                return;
        if (!parse_frame(f, len, &p)) {
                fprintf(stderr, "fake-guest: %s %zu bytes, malformed or bad checksum\n", dir, len);
                return;
        }
        fprintf(stderr,
                "fake-guest: %s %zu bytes %s > %s",
                dir,
                len,
                mac_str(p.src_mac).s,
                mac_str(p.dst_mac).s);
        fprintf(stderr, " type 0x%04x", p.type);
        if (p.type == ETHERTYPE_ARP && p.l3len >= 28)
                fprintf(stderr,
                        " arp op %u %s > %s",
                        get16(p.l3 + 6),
                        ip_str(get32(p.l3 + 14)).s,
                        ip_str(get32(p.l3 + 24)).s);
        if (p.type == ETHERTYPE_IPV4)
                fprintf(stderr, " ip %s > %s proto %u", ip_str(p.src).s, ip_str(p.dst).s, p.proto);
        if (p.proto == PROTO_UDP || p.proto == PROTO_TCP)
                fprintf(stderr, " port %u > %u data %zu", p.sport, p.dport, p.dlen);
        if (p.proto == PROTO_TCP)
                fprintf(stderr, " flags 0x%02x seq %u ack %u", p.flags, p.seq, p.ack);
        fputc('\n', stderr);
}

static int send_frame(Guest *g, const uint8_t *f, size_t len) {
        uint8_t buf[4 + ETH_HLEN + LINK_MTU];
        size_t done = 0;

        assert(len <= sizeof(buf) - 4);
        put32(buf, (uint32_t) len);
        memcpy(buf + 4, f, len);
        debug_frame(g, "tx", f, len);

        while (done < 4 + len) {
                ssize_t n = write(g->fd, buf + done, 4 + len - done);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                done += (size_t) n;
        }
        return 0;
}

static void eth_header(uint8_t *f, const uint8_t *dst, const uint8_t *src, uint16_t type) {
        memcpy(f, dst, 6);
        memcpy(f + 6, src, 6);
        put16(f + 12, type);
}

static int send_arp(Guest *g, uint16_t op, const uint8_t *dst_mac, uint32_t target_ip, const uint8_t *target_mac) {
        uint8_t f[ETH_HLEN + 28];
        uint8_t *a = f + ETH_HLEN;

        eth_header(f, dst_mac, g->mac, ETHERTYPE_ARP);
        put16(a, 1);
        put16(a + 2, ETHERTYPE_IPV4);
        a[4] = 6;
        a[5] = 4;
        put16(a + 6, op);
        memcpy(a + 8, g->mac, 6);
        put32(a + 14, g->ip);
        memcpy(a + 18, target_mac, 6);
        put32(a + 24, target_ip);
        return send_frame(g, f, sizeof(f));
}

/* Returns the ARP operation of an Ethernet/IPv4 ARP packet, or 0. */
static uint16_t arp_op(const Pkt *p) {
        if (p->type != ETHERTYPE_ARP || p->l3len < 28 || get16(p->l3) != 1 ||
            get16(p->l3 + 2) != ETHERTYPE_IPV4 || p->l3[4] != 6 || p->l3[5] != 4)
                return 0;
        return get16(p->l3 + 6);
}

static void answer_arp(Guest *g) {
        Pkt p;

        if (g->ip == 0 || !parse_frame(g->frame, g->flen, &p) || arp_op(&p) != 1 || get32(p.l3 + 24) != g->ip)
                return;
        (void) send_arp(g, 2, p.l3 + 8, get32(p.l3 + 14), p.l3 + 8);
}

/* Returns 1 with the next frame in g->frame, 0 at the deadline, or a negative errno when the link
 * fails. ARP requests for our address are answered on the way (and still returned). */
static int recv_frame(Guest *g, uint64_t deadline) {
        for (;;) {
                if (g->rlen >= 4) {
                        uint32_t len = get32(g->rbuf);
                        if (len > MAX_FRAME)
                                return -EMSGSIZE;
                        if (g->rlen >= 4 + len) {
                                memcpy(g->frame, g->rbuf + 4, len);
                                g->flen = len;
                                g->rlen -= 4 + len;
                                memmove(g->rbuf, g->rbuf + 4 + len, g->rlen);
                                debug_frame(g, "rx", g->frame, g->flen);
                                answer_arp(g);
                                return 1;
                        }
                }

                uint64_t now = now_ms();
                if (now >= deadline)
                        return 0;
                struct pollfd pfd = { .fd = g->fd, .events = POLLIN };
                int r = poll(&pfd, 1, (int) MIN(deadline - now, (uint64_t) INT_MAX));
                if (r < 0 && errno != EINTR)
                        return -errno;
                if (r <= 0)
                        continue;

                ssize_t n = read(g->fd, g->rbuf + g->rlen, sizeof(g->rbuf) - g->rlen);
                if (n < 0 && errno != EINTR)
                        return -errno;
                if (n == 0)
                        return -ECONNRESET;
                if (n > 0)
                        g->rlen += (size_t) n;
        }
}

/* Returns 0, -ETIMEDOUT, or a link error. */
static int arp_resolve(Guest *g, uint32_t ip, uint64_t deadline, uint8_t ret_mac[6]) {
        uint64_t next = 0;
        Pkt p;
        int r;

        for (;;) {
                if (now_ms() >= next) {
                        r = send_arp(g, 1, mac_broadcast, ip, mac_zero);
                        if (r < 0)
                                return r;
                        next = now_ms() + 500;
                }
                r = recv_frame(g, MIN(next, deadline));
                if (r < 0)
                        return r;
                if (r == 0 && now_ms() >= deadline)
                        return -ETIMEDOUT;
                if (r > 0 && parse_frame(g->frame, g->flen, &p) && arp_op(&p) == 2 && get32(p.l3 + 14) == ip) {
                        memcpy(ret_mac, p.l3 + 8, 6);
                        return 0;
                }
        }
}

static int gateway_mac(Guest *g, uint64_t deadline, uint8_t ret_mac[6]) {
        int r;

        if (g->router == 0)
                return -ENETUNREACH;
        if (!g->router_mac_known) {
                r = arp_resolve(g, g->router, deadline, g->router_mac);
                if (r < 0)
                        return r == -ETIMEDOUT ? -ENETUNREACH : r;
                g->router_mac_known = true;
        }
        memcpy(ret_mac, g->router_mac, 6);
        return 0;
}

/* The MAC to send to for ip: its own on the local subnet, else the gateway's. */
static int next_hop(Guest *g, uint32_t ip, uint64_t deadline, uint8_t ret_mac[6]) {
        int r;

        if (g->ip != 0 && ((ip ^ g->ip) & g->mask) == 0) {
                r = arp_resolve(g, ip, deadline, ret_mac);
                return r == -ETIMEDOUT ? -EHOSTDOWN : r;
        }
        return gateway_mac(g, deadline, ret_mac);
}

/* Sends an IPv4 packet around the l4 bytes, filling in the UDP or TCP checksum. */
static int send_ipv4(
        Guest *g,
        const uint8_t *dst_mac,
        const uint8_t *src_mac,
        uint32_t src,
        uint32_t dst,
        uint8_t proto,
        const uint8_t *l4,
        size_t l4len) {
        uint8_t f[ETH_HLEN + LINK_MTU];
        uint8_t *ip = f + ETH_HLEN, *seg = ip + IP_HLEN;
        size_t csum_off = proto == PROTO_TCP ? 16 : proto == PROTO_UDP ? 6 : 0;

        assert(l4len <= LINK_MTU - IP_HLEN);
        eth_header(f, dst_mac, src_mac, ETHERTYPE_IPV4);
        memset(ip, 0, IP_HLEN);
        ip[0] = 0x45;
        put16(ip + 2, (uint16_t) (IP_HLEN + l4len));
        put16(ip + 4, g->ip_id++);
        put16(ip + 6, 0x4000); /* DF */
        ip[8] = 64;
        ip[9] = proto;
        put32(ip + 12, src);
        put32(ip + 16, dst);
        put16(ip + 10, csum_fold(csum_add(0, ip, IP_HLEN)));
        memcpy(seg, l4, l4len);
        if (csum_off > 0) {
                put16(seg + csum_off, 0);
                uint16_t c = l4_csum(src, dst, proto, seg, l4len);
                put16(seg + csum_off, proto == PROTO_UDP && c == 0 ? 0xffff : c);
        }
        return send_frame(g, f, ETH_HLEN + IP_HLEN + l4len);
}

static int send_udp(
        Guest *g,
        const uint8_t *dst_mac,
        const uint8_t *src_mac,
        uint32_t src,
        uint16_t sport,
        uint32_t dst,
        uint16_t dport,
        const void *data,
        size_t len) {
        uint8_t u[LINK_MTU - IP_HLEN] = {};

        assert(len <= sizeof(u) - 8);
        put16(u, sport);
        put16(u + 2, dport);
        put16(u + 4, (uint16_t) (8 + len));
        memcpy(u + 8, data, len);
        return send_ipv4(g, dst_mac, src_mac, src, dst, PROTO_UDP, u, 8 + len);
}

static bool report(const Action *a, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prints the action's one result line and returns ok. */
static bool report(const Action *a, bool ok, const char *fmt, ...) {
        va_list ap;

        printf("%s %s", ok ? "ok" : "fail", action_table[a->type].name);
        for (unsigned i = 0; i < action_table[a->type].n_args; i++)
                printf(" %s", a->args[i]);
        if (fmt) {
                putchar(' ');
                va_start(ap, fmt);
                vprintf(fmt, ap);
                va_end(ap);
        }
        putchar('\n');
        fflush(stdout);
        return ok;
}

static bool report_link(const Action *a, int r) {
        return report(a, false, "link: %s", strerror(-r));
}

/* ---- DHCP ---- */

static void dhcp_put_option(uint8_t *m, size_t *i, uint8_t code, const void *v, uint8_t len) {
        m[(*i)++] = code;
        m[(*i)++] = len;
        memcpy(m + *i, v, len);
        *i += len;
}

static int dhcp_send(Guest *g, uint8_t type, uint32_t xid, uint32_t requested, uint32_t server) {
        static const uint8_t prl[] = { 1, 3, 6, 15, 26, 51, 54, 119 };
        uint8_t m[300] = {}, v[4];
        size_t i = DHCP_FIXED;

        m[0] = 1; /* BOOTREQUEST, Ethernet, 6-byte addresses */
        m[1] = 1;
        m[2] = 6;
        put32(m + 4, xid);
        put16(m + 10, 0x8000); /* broadcast */
        memcpy(m + 28, g->mac, 6);
        put32(m + 236, 0x63825363);
        dhcp_put_option(m, &i, 53, &type, 1);
        put32(v, requested);
        if (requested != 0)
                dhcp_put_option(m, &i, 50, v, 4);
        put32(v, server);
        if (server != 0)
                dhcp_put_option(m, &i, 54, v, 4);
        dhcp_put_option(m, &i, 55, prl, sizeof(prl));
        m[i] = 255;
        return send_udp(g, mac_broadcast, g->mac, 0, 68, UINT32_MAX, 67, m, sizeof(m));
}

/* Concatenates every instance of option code (RFC 3396) into out; returns its length or -ENOENT. */
static int dhcp_option(const Pkt *p, uint8_t code, uint8_t *out, size_t size) {
        const uint8_t *o = p->data + DHCP_FIXED;
        size_t len = p->dlen - DHCP_FIXED, n = 0;
        bool found = false;

        for (size_t i = 0; i < len && o[i] != 255;) {
                if (o[i] == 0) {
                        i++;
                        continue;
                }
                if (i + 2 > len || i + 2 + o[i + 1] > len)
                        break;
                if (o[i] == code) {
                        if (n + o[i + 1] > size)
                                return -EMSGSIZE;
                        memcpy(out + n, o + i + 2, o[i + 1]);
                        n += o[i + 1];
                        found = true;
                }
                i += 2 + o[i + 1];
        }
        return found ? (int) n : -ENOENT;
}

static uint32_t dhcp_option_ip(const Pkt *p, uint8_t code) {
        uint8_t v[255];

        return dhcp_option(p, code, v, sizeof(v)) >= 4 ? get32(v) : 0;
}

/* Parses the current frame as a DHCP reply to us; returns its message type or 0. */
static int dhcp_reply(const Guest *g, uint32_t xid, Pkt *p) {
        uint8_t type;

        if (!parse_frame(g->frame, g->flen, p) || p->type != ETHERTYPE_IPV4 || p->proto != PROTO_UDP ||
            p->sport != 67 || p->dport != 68 || p->dlen < DHCP_FIXED + 4)
                return 0;
        if (p->data[0] != 2 || get32(p->data + 4) != xid || memcmp(p->data + 28, g->mac, 6) != 0 ||
            get32(p->data + 236) != 0x63825363)
                return 0;
        return dhcp_option(p, 53, &type, 1) == 1 ? type : 0;
}

static bool append_char(char *out, size_t size, size_t *n, char c) {
        if (*n + 1 >= size)
                return false;
        out[(*n)++] = c;
        out[*n] = '\0';
        return true;
}

/* Decodes option 119, a list of RFC 1035 names with RFC 1035 compression (RFC 3397), as "a.b,c.d". */
static int decode_search(const uint8_t *d, size_t len, char *out, size_t size) {
        size_t n = 0;

        out[0] = '\0';
        for (size_t pos = 0; pos < len;) {
                size_t i = pos, jumps = 0;
                bool jumped = false, first = true;

                if (n > 0 && !append_char(out, size, &n, ','))
                        return -ENOBUFS;
                for (;;) {
                        if (i >= len)
                                return -EBADMSG;
                        uint8_t l = d[i];
                        if (l == 0) {
                                if (!jumped)
                                        pos = i + 1;
                                break;
                        }
                        if ((l & 0xc0) == 0xc0) {
                                if (i + 1 >= len || ++jumps > 64)
                                        return -EBADMSG;
                                if (!jumped)
                                        pos = i + 2;
                                jumped = true;
                                i = (size_t) (l & 0x3f) << 8 | d[i + 1];
                                continue;
                        }
                        if ((l & 0xc0) != 0 || i + 1 + l > len)
                                return -EBADMSG;
                        if (!first && !append_char(out, size, &n, '.'))
                                return -ENOBUFS;
                        first = false;
                        for (size_t k = i + 1; k < i + 1 + l; k++) {
                                char c = d[k] > 0x20 && d[k] < 0x7f && d[k] != ',' ? (char) d[k] : '?';
                                if (!append_char(out, size, &n, c))
                                        return -ENOBUFS;
                        }
                        i += 1 + l;
                }
        }
        return 0;
}

static void print_dhcp_ack(FILE *f, const Pkt *p) {
        uint8_t v[1024];
        char search[1024];
        int n;

        fprintf(f, "ip=%s", ip_str(get32(p->data + 16)).s);
        if (dhcp_option_ip(p, 3) != 0)
                fprintf(f, " router=%s", ip_str(dhcp_option_ip(p, 3)).s);
        n = dhcp_option(p, 6, v, sizeof(v));
        for (int i = 0; i + 4 <= n; i += 4)
                fprintf(f, "%s%s", i == 0 ? " dns=" : ",", ip_str(get32(v + i)).s);
        if (dhcp_option_ip(p, 1) != 0)
                fprintf(f, " mask=%s", ip_str(dhcp_option_ip(p, 1)).s);
        if (dhcp_option(p, 26, v, sizeof(v)) == 2)
                fprintf(f, " mtu=%u", get16(v));
        if (dhcp_option(p, 51, v, sizeof(v)) == 4)
                fprintf(f, " lease=%u", get32(v));
        n = dhcp_option(p, 119, v, sizeof(v));
        if (n >= 0)
                fprintf(f,
                        " search=%s",
                        decode_search(v, (size_t) n, search, sizeof(search)) < 0 ? "<invalid>" : search);
}

static bool act_dhcp(Guest *g, const Action *a, uint64_t deadline) {
        uint32_t xid = random32(), offered = 0, server = 0;
        bool expect_none = a->type == ACTION_DHCP_NONE;
        Pkt p;
        int r, type;

        r = dhcp_send(g, DHCP_DISCOVER, xid, 0, 0);
        if (r < 0)
                return report_link(a, r);
        while (offered == 0) {
                r = recv_frame(g, deadline);
                if (r < 0)
                        return report_link(a, r);
                if (r == 0)
                        return expect_none ? report(a, true, NULL) : report(a, false, "no offer");
                if (dhcp_reply(g, xid, &p) != DHCP_OFFER)
                        continue;
                offered = get32(p.data + 16);
                server = dhcp_option_ip(&p, 54) ?: p.src;
        }
        if (expect_none)
                return report(a, false, "offer ip=%s from %s", ip_str(offered).s, ip_str(server).s);

        r = dhcp_send(g, DHCP_REQUEST, xid, offered, server);
        if (r < 0)
                return report_link(a, r);
        for (;;) {
                r = recv_frame(g, deadline);
                if (r < 0)
                        return report_link(a, r);
                if (r == 0)
                        return report(a, false, "no ack for %s", ip_str(offered).s);
                type = dhcp_reply(g, xid, &p);
                if (type == DHCP_NAK)
                        return report(a, false, "nak for %s", ip_str(offered).s);
                if (type == DHCP_ACK)
                        break;
        }

        g->ip = get32(p.data + 16);
        g->mask = dhcp_option_ip(&p, 1) ?: 0xffffff00;
        g->router = dhcp_option_ip(&p, 3);
        g->router_mac_known = false;

        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        if (!f)
                return report(a, false, "%s", strerror(errno));
        print_dhcp_ack(f, &p);
        fclose(f);
        report(a, true, "%s", text);
        free(text);
        return true;
}

/* ---- TCP ---- */

static const char *tcp_error_str(int r) {
        switch (r) {
        case -ETIMEDOUT:
                return "silence";
        case -ECONNREFUSED:
                return "rst";
        case -EHOSTUNREACH:
                return "icmp";
        case -EHOSTDOWN:
                return "no-arp";
        case -ENETUNREACH:
                return "no-gateway";
        default:
                return strerror(-r);
        }
}

static int tcp_send(Guest *g, Conn *c, uint8_t flags, const void *data, size_t len) {
        uint8_t s[TCP_HLEN + 4 + 1400] = {};
        size_t hl = flags & TH_SYN ? TCP_HLEN + 4 : TCP_HLEN;

        assert(len <= 1400);
        put16(s, c->lport);
        put16(s + 2, c->rport);
        put32(s + 4, c->snd_nxt);
        put32(s + 8, flags & TH_ACK ? c->rcv_nxt : 0);
        s[12] = (uint8_t) (hl / 4) << 4;
        s[13] = flags;
        put16(s + 14, TCP_WINDOW);
        if (flags & TH_SYN) { /* MSS */
                s[20] = 2;
                s[21] = 4;
                put16(s + 22, LINK_MTU - IP_HLEN - TCP_HLEN);
        }
        if (len > 0)
                memcpy(s + hl, data, len);
        c->snd_nxt += (uint32_t) len + !!(flags & TH_SYN) + !!(flags & TH_FIN);
        return send_ipv4(g, c->mac, g->mac, g->ip, c->rip, PROTO_TCP, s, hl + len);
}

static bool tcp_match(const Guest *g, const Conn *c, const Pkt *p) {
        return p->type == ETHERTYPE_IPV4 && p->proto == PROTO_TCP && p->src == c->rip && p->dst == g->ip &&
                p->sport == c->rport && p->dport == c->lport;
}

/* ICMP destination unreachable quoting our segment? */
static bool icmp_unreach_match(const Conn *c, const Pkt *p) {
        if (p->type != ETHERTYPE_IPV4 || p->proto != PROTO_ICMP || p->l4len < 8 + IP_HLEN + 4 || p->l4[0] != 3)
                return false;
        const uint8_t *in = p->l4 + 8;
        size_t hl = (in[0] & 0xf) * 4u;
        return hl >= IP_HLEN && p->l4len >= 8 + hl + 4 && in[9] == PROTO_TCP && get32(in + 16) == c->rip &&
                get16(in + hl) == c->lport && get16(in + hl + 2) == c->rport;
}

/* Takes the in-order data and FIN of a segment, copying data up to the space left in buf; returns
 * true when rcv_nxt moved (so the segment must be ACKed). */
static bool tcp_take(Conn *c, const Pkt *p, uint8_t *buf, size_t *n, size_t size) {
        if (p->seq != c->rcv_nxt || (p->dlen == 0 && !(p->flags & TH_FIN)))
                return false;
        if (buf && p->dlen > 0) {
                size_t k = MIN(p->dlen, size - *n);
                memcpy(buf + *n, p->data, k);
                *n += k;
        }
        c->rcv_nxt += (uint32_t) p->dlen;
        if (p->flags & TH_FIN) {
                c->rcv_nxt++;
                c->fin_rcvd = true;
        }
        return true;
}

/* Returns 0 once established, or -ETIMEDOUT (silence), -ECONNREFUSED (RST), -EHOSTUNREACH (ICMP),
 * -EHOSTDOWN (no ARP reply for the next hop), -ENETUNREACH (no gateway), or a link error. */
static int tcp_connect(Guest *g, Conn *c, uint32_t ip, uint16_t port, uint64_t deadline) {
        Pkt p;
        int r;

        *c = (Conn){
                .rip = ip,
                .rport = port,
                .lport = (uint16_t) (49152 + random32() % 16384),
                .iss = random32(),
        };
        if (g->ip == 0)
                return -ENETUNREACH;
        r = next_hop(g, ip, deadline, c->mac);
        if (r < 0)
                return r;

        for (unsigned attempt = 0;; attempt++) {
                uint64_t next = deadline;

                if (attempt < 3) { /* the first SYN and two resends */
                        c->snd_nxt = c->iss;
                        r = tcp_send(g, c, TH_SYN, NULL, 0);
                        if (r < 0)
                                return r;
                        next = MIN(deadline, now_ms() + SYN_RETRY_MS);
                }
                for (;;) {
                        r = recv_frame(g, next);
                        if (r < 0)
                                return r;
                        if (r == 0)
                                break;
                        if (!parse_frame(g->frame, g->flen, &p))
                                continue;
                        if (icmp_unreach_match(c, &p))
                                return -EHOSTUNREACH;
                        if (!tcp_match(g, c, &p))
                                continue;
                        if (p.flags & TH_RST) {
                                if (!(p.flags & TH_ACK) || p.ack == c->iss + 1)
                                        return -ECONNREFUSED;
                                continue;
                        }
                        if ((p.flags & (TH_SYN | TH_ACK)) == (TH_SYN | TH_ACK) && p.ack == c->iss + 1) {
                                c->rcv_nxt = p.seq + 1;
                                c->established = true;
                                return tcp_send(g, c, TH_ACK, NULL, 0);
                        }
                }
                if (now_ms() >= deadline)
                        return -ETIMEDOUT;
        }
}

/* Closes with FIN and waits (briefly) for the peer's FIN; falls back to RST. */
static void tcp_close(Guest *g, Conn *c, uint64_t deadline) {
        Pkt p;

        deadline = MIN(deadline, now_ms() + 1000);
        if (tcp_send(g, c, TH_FIN | TH_ACK, NULL, 0) < 0)
                return;
        while (recv_frame(g, deadline) > 0) {
                if (!parse_frame(g->frame, g->flen, &p) || !tcp_match(g, c, &p))
                        continue;
                if (p.flags & TH_RST)
                        return;
                if (tcp_take(c, &p, NULL, NULL, 0) || p.dlen > 0)
                        (void) tcp_send(g, c, TH_ACK, NULL, 0);
                if (c->fin_rcvd)
                        return;
        }
        (void) tcp_send(g, c, TH_RST | TH_ACK, NULL, 0);
}

static bool act_tcp(Guest *g, const Action *a, uint64_t deadline) {
        Conn c;
        int r;

        r = tcp_connect(g, &c, a->ip, a->port, deadline);
        if (a->type == ACTION_TCP) {
                if (r < 0)
                        return report(a, false, "%s", tcp_error_str(r));
                tcp_close(g, &c, deadline);
                return report(a, true, NULL);
        }

        switch (r) {
        case 0:
                (void) tcp_send(g, &c, TH_RST | TH_ACK, NULL, 0);
                return report(a, false, "handshake completed");
        case -ETIMEDOUT:
        case -ECONNREFUSED:
        case -EHOSTUNREACH:
        case -EHOSTDOWN:
                return report(a, true, "%s", tcp_error_str(r));
        default:
                return report(a, false, "%s", tcp_error_str(r));
        }
}

static void print_escaped(const uint8_t *s, size_t n) {
        for (size_t i = 0; i < n; i++) {
                if (s[i] == '\n')
                        fputs("\\n", stdout);
                else if (s[i] == '\r')
                        fputs("\\r", stdout);
                else if (s[i] == '\\')
                        fputs("\\\\", stdout);
                else if (s[i] < 0x20 || s[i] >= 0x7f)
                        printf("\\x%02x", s[i]);
                else
                        putchar(s[i]);
        }
}

static bool act_http(Guest *g, const Action *a, uint64_t deadline) {
        char req[1400];
        Conn c;
        Pkt p;
        size_t n = 0;
        int r, len;

        len = snprintf(
                req,
                sizeof(req),
                "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                a->path,
                ip_str(a->ip).s);
        assert(len > 0 && (size_t) len < sizeof(req)); /* the path length is checked when parsing */

        r = tcp_connect(g, &c, a->ip, a->port, deadline);
        if (r < 0)
                return report(a, false, "connect: %s", tcp_error_str(r));
        r = tcp_send(g, &c, TH_PSH | TH_ACK, req, (size_t) len);
        if (r < 0)
                return report_link(a, r);

        uint8_t *resp = malloc(HTTP_MAX + 1);
        if (!resp)
                return report(a, false, "out of memory");
        while (!c.fin_rcvd) {
                r = recv_frame(g, deadline);
                if (r <= 0) {
                        (void) tcp_send(g, &c, TH_RST | TH_ACK, NULL, 0);
                        free(resp);
                        return r < 0 ? report_link(a, r) : report(a, false, "timeout after %zu bytes", n);
                }
                if (!parse_frame(g->frame, g->flen, &p) || !tcp_match(g, &c, &p))
                        continue;
                if (p.flags & TH_RST) {
                        free(resp);
                        return report(a, false, "reset after %zu bytes", n);
                }
                if (tcp_take(&c, &p, resp, &n, HTTP_MAX))
                        r = tcp_send(g, &c, c.fin_rcvd ? TH_FIN | TH_ACK : TH_ACK, NULL, 0);
                else if (p.dlen > 0 || (p.flags & TH_FIN))
                        r = tcp_send(g, &c, TH_ACK, NULL, 0); /* duplicate ACK for out-of-order data */
        }
        resp[n] = '\0'; /* for sscanf() */

        const uint8_t *end = memmem(resp, n, "\r\n\r\n", 4);
        unsigned status = 0;
        if (!end || n < 12 || memcmp(resp, "HTTP/1.", 7) != 0 ||
            sscanf((const char *) resp + 8, " %3u", &status) != 1) {
                report(a, false, "malformed response (%zu bytes)", n);
                free(resp);
                return false;
        }

        const uint8_t *body = end + 4;
        size_t body_len = n - (size_t) (body - resp);
        printf("ok http %s %s status=%u body=", a->args[0], a->args[1], status);
        print_escaped(body, MIN(body_len, (size_t) BODY_MAX));
        putchar('\n');
        fflush(stdout);
        free(resp);
        return true;
}

/* ---- serve ---- */

static int serve_reply(Guest *g, Conn *c, bool http) {
        char text[64], msg[256];
        int n;

        (void) snprintf(text, sizeof(text), "hello from %s\n", ip_str(g->ip).s);
        if (http)
                n = snprintf(
                        msg,
                        sizeof(msg),
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                        "Connection: close\r\n\r\n%s",
                        strlen(text),
                        text);
        else
                n = snprintf(msg, sizeof(msg), "%s", text);
        c->replied = c->fin_sent = true;
        return tcp_send(g, c, TH_PSH | TH_ACK | TH_FIN, msg, (size_t) n);
}

/* Answers SYNs to the port until the deadline. A connection gets "hello from <ip>\n" (wrapped in an
 * HTTP response if the first data looks like a request) and FIN after its first data, its FIN, or
 * GREETING_DELAY_MS of silence. SYNs to other ports get RST. */
static bool act_serve(Guest *g, const Action *a, uint64_t deadline) {
        Conn conns[MAX_CONNS] = {};
        unsigned count = 0;
        Pkt p;
        int r = 0;

        if (g->ip == 0)
                return report(a, false, "no address (use --ip or dhcp first)");

        for (;;) {
                uint64_t now = now_ms(), wake = deadline;

                for (size_t i = 0; i < ELEMENTSOF(conns); i++) {
                        Conn *c = conns + i;
                        if (!c->used || !c->established || c->replied)
                                continue;
                        if (now >= c->established_at + GREETING_DELAY_MS) {
                                r = serve_reply(g, c, /* http= */ false);
                                if (r < 0)
                                        return report_link(a, r);
                        } else
                                wake = MIN(wake, c->established_at + GREETING_DELAY_MS);
                }
                if (now >= deadline)
                        break;

                r = recv_frame(g, wake);
                if (r < 0)
                        return report_link(a, r);
                if (r == 0 || !parse_frame(g->frame, g->flen, &p) || p.type != ETHERTYPE_IPV4 ||
                    p.proto != PROTO_TCP || p.dst != g->ip)
                        continue;

                bool syn = (p.flags & (TH_SYN | TH_ACK | TH_RST)) == TH_SYN;
                if (p.dport != a->port) {
                        Conn rst = { .rip = p.src, .rport = p.sport, .lport = p.dport, .rcv_nxt = p.seq + 1 };
                        memcpy(rst.mac, p.src_mac, 6);
                        if (syn)
                                (void) tcp_send(g, &rst, TH_RST | TH_ACK, NULL, 0);
                        continue;
                }

                Conn *c = NULL;
                for (size_t i = 0; i < ELEMENTSOF(conns) && !c; i++)
                        if (conns[i].used && tcp_match(g, conns + i, &p))
                                c = conns + i;
                if (!c) {
                        for (size_t i = 0; i < ELEMENTSOF(conns) && !c && syn; i++)
                                if (!conns[i].used)
                                        c = conns + i;
                        if (!c)
                                continue;
                        *c = (Conn){
                                .used = true,
                                .rip = p.src,
                                .rport = p.sport,
                                .lport = p.dport,
                                .iss = random32(),
                                .rcv_nxt = p.seq + 1,
                        };
                        memcpy(c->mac, p.src_mac, 6);
                }

                if (p.flags & TH_RST) {
                        c->used = false;
                        continue;
                }
                if (p.flags & TH_SYN) { /* new, or a retransmitted SYN */
                        if (!c->established) {
                                c->snd_nxt = c->iss;
                                r = tcp_send(g, c, TH_SYN | TH_ACK, NULL, 0);
                        }
                        continue;
                }
                if (!c->established) {
                        if (!(p.flags & TH_ACK) || p.ack != c->iss + 1)
                                continue;
                        c->established = true;
                        c->established_at = now_ms();
                        count++;
                }

                uint8_t head[8];
                size_t n = 0;
                bool took = tcp_take(c, &p, head, &n, sizeof(head));
                if (took && !c->replied)
                        r = serve_reply(
                                g, c, n >= 4 && (memcmp(head, "GET ", 4) == 0 || memcmp(head, "HEAD", 4) == 0));
                else if (took || p.dlen > 0) {
                        bool fin = c->fin_rcvd && !c->fin_sent;
                        c->fin_sent = c->fin_sent || fin;
                        r = tcp_send(g, c, fin ? TH_FIN | TH_ACK : TH_ACK, NULL, 0);
                }
                if (r < 0)
                        return report_link(a, r);
                if (c->fin_rcvd && c->fin_sent)
                        c->used = false;
        }
        return report(a, true, "connections=%u", count);
}

/* ---- the rest ---- */

static bool act_spoof(Guest *g, const Action *a, uint64_t deadline) {
        static const char payload[] = "fake-guest spoofed frame";
        uint8_t mac[6];
        int r;

        if (g->ip == 0)
                return report(a, false, "no address (use --ip or dhcp first)");
        r = gateway_mac(g, deadline, mac);
        if (r < 0)
                return report(a, false, "gateway: %s", tcp_error_str(r));
        if (a->type == ACTION_SPOOF_IP)
                r = send_udp(g, mac, g->mac, a->ip, 40000, g->router, 9, payload, sizeof(payload) - 1);
        else
                r = send_udp(g, mac, a->mac, g->ip, 40000, g->router, 9, payload, sizeof(payload) - 1);
        return r < 0 ? report_link(a, r) : report(a, true, NULL);
}

/* Sends an ICMPv6 router solicitation from the EUI-64 link-local address. */
static bool act_ipv6(Guest *g, const Action *a) {
        static const uint8_t mac_all_routers[6] = { 0x33, 0x33, 0, 0, 0, 2 };
        uint8_t f[ETH_HLEN + 40 + 16] = {};
        uint8_t *ip = f + ETH_HLEN, *icmp = ip + 40;
        uint32_t sum;
        int r;

        eth_header(f, mac_all_routers, g->mac, ETHERTYPE_IPV6);
        ip[0] = 0x60;
        put16(ip + 4, 16);
        ip[6] = 58; /* ICMPv6 */
        ip[7] = 255;
        ip[8] = 0xfe;
        ip[9] = 0x80;
        ip[16] = g->mac[0] ^ 0x02;
        memcpy(ip + 17, g->mac + 1, 2);
        ip[19] = 0xff;
        ip[20] = 0xfe;
        memcpy(ip + 21, g->mac + 3, 3);
        ip[24] = 0xff; /* ff02::2 */
        ip[25] = 0x02;
        ip[39] = 0x02;
        icmp[0] = 133;
        icmp[8] = 1; /* source link-layer address option */
        icmp[9] = 1;
        memcpy(icmp + 10, g->mac, 6);
        sum = csum_add(csum_add(0, ip + 8, 32), icmp, 16) + 16 + 58;
        put16(icmp + 2, csum_fold(sum));

        r = send_frame(g, f, sizeof(f));
        return r < 0 ? report_link(a, r) : report(a, true, NULL);
}

static bool act_sleep(Guest *g, const Action *a, uint64_t deadline) {
        int r;

        while ((r = recv_frame(g, deadline)) > 0)
                ;
        return r < 0 ? report_link(a, r) : report(a, true, NULL);
}

static bool act_arp(Guest *g, const Action *a, uint64_t deadline) {
        uint8_t mac[6];
        int r;

        r = arp_resolve(g, a->ip, deadline, mac);
        if (r == -ETIMEDOUT)
                return report(a, false, "no reply");
        if (r < 0)
                return report_link(a, r);
        return report(a, true, "is-at %s", mac_str(mac).s);
}

static bool run_action(Guest *g, const Action *a, unsigned long timeout_ms) {
        uint64_t deadline = now_ms() + (a->type == ACTION_SLEEP ? a->ms : timeout_ms);

        switch (a->type) {
        case ACTION_DHCP:
        case ACTION_DHCP_NONE:
                return act_dhcp(g, a, deadline);
        case ACTION_ARP:
                return act_arp(g, a, deadline);
        case ACTION_TCP:
        case ACTION_TCP_FAIL:
                return act_tcp(g, a, deadline);
        case ACTION_HTTP:
                return act_http(g, a, deadline);
        case ACTION_SERVE:
                return act_serve(g, a, deadline);
        case ACTION_SPOOF_IP:
        case ACTION_SPOOF_MAC:
                return act_spoof(g, a, deadline);
        case ACTION_SLEEP:
                return act_sleep(g, a, deadline);
        case ACTION_IPV6:
                return act_ipv6(g, a);
        default:
                assert(!"unknown action");
                return false;
        }
}

/* ---- command line ---- */

static int parse_ulong(const char *s, unsigned long max, unsigned long *ret) {
        unsigned long v;
        char *end;

        if (s[0] < '0' || s[0] > '9')
                return -EINVAL;
        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno != 0 || *end != '\0' || v > max)
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_ipv4(const char *s, uint32_t *ret) {
        struct in_addr a;

        if (inet_pton(AF_INET, s, &a) != 1)
                return -EINVAL;
        *ret = ntohl(a.s_addr);
        return 0;
}

static int parse_ip_port(const char *s, uint32_t *ret_ip, uint16_t *ret_port) {
        char ip[INET_ADDRSTRLEN];
        const char *colon = strrchr(s, ':');
        unsigned long port;

        if (!colon || (size_t) (colon - s) >= sizeof(ip) || parse_ulong(colon + 1, 65535, &port) < 0 ||
            port == 0)
                return -EINVAL;
        memcpy(ip, s, (size_t) (colon - s));
        ip[colon - s] = '\0';
        if (parse_ipv4(ip, ret_ip) < 0)
                return -EINVAL;
        *ret_port = (uint16_t) port;
        return 0;
}

static int hex_digit(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
                return (c | 0x20) - 'a' + 10;
        return -EINVAL;
}

static int parse_mac(const char *s, uint8_t ret[6]) {
        uint8_t m[6];

        if (strlen(s) != 17)
                return -EINVAL;
        for (size_t i = 0; i < 6; i++) {
                int hi = hex_digit(s[3 * i]), lo = hex_digit(s[3 * i + 1]);
                if (hi < 0 || lo < 0 || (i < 5 && s[3 * i + 2] != ':'))
                        return -EINVAL;
                m[i] = (uint8_t) (hi << 4 | lo);
        }
        memcpy(ret, m, 6);
        return 0;
}

/* Parses the action at argv[0]; returns the number of words it takes, or -EINVAL. */
static int parse_action(int argc, char **argv, Action *ret) {
        Action a = { .type = _ACTION_INVALID, .args = argv + 1 };
        unsigned long v;
        int r = 0;

        for (size_t i = 0; i < _ACTION_MAX; i++)
                if (streq(argv[0], action_table[i].name))
                        a.type = (ActionType) i;
        if (a.type < 0) {
                fprintf(stderr, "fake-guest: unknown action '%s'\n", argv[0]);
                return -EINVAL;
        }
        if (argc < 1 + (int) action_table[a.type].n_args) {
                fprintf(stderr,
                        "fake-guest: action '%s' needs %u argument(s)\n",
                        argv[0],
                        action_table[a.type].n_args);
                return -EINVAL;
        }

        switch (a.type) {
        case ACTION_ARP:
        case ACTION_SPOOF_IP:
                r = parse_ipv4(a.args[0], &a.ip);
                break;
        case ACTION_TCP:
        case ACTION_TCP_FAIL:
                r = parse_ip_port(a.args[0], &a.ip, &a.port);
                break;
        case ACTION_HTTP:
                r = parse_ip_port(a.args[0], &a.ip, &a.port);
                a.path = a.args[1];
                if (a.path[0] != '/' || strlen(a.path) > 1024 || strpbrk(a.path, " \r\n"))
                        r = -EINVAL;
                break;
        case ACTION_SERVE:
                r = parse_ulong(a.args[0], 65535, &v);
                a.port = (uint16_t) v;
                if (r >= 0 && v == 0)
                        r = -EINVAL;
                break;
        case ACTION_SPOOF_MAC:
                r = parse_mac(a.args[0], a.mac);
                break;
        case ACTION_SLEEP:
                r = parse_ulong(a.args[0], 24 * 3600 * 1000, &a.ms);
                break;
        default:
                break;
        }
        if (r < 0) {
                fprintf(stderr, "fake-guest: invalid argument for '%s': '%s'\n", argv[0], argv[1]);
                return r;
        }
        *ret = a;
        return 1 + (int) action_table[a.type].n_args;
}

static void help(void) {
        printf("Usage: fake-guest --mac MAC (--listen PATH | --fd N) [--timeout-ms MS] [--ip A.B.C.D[/N]]\n"
               "                  [--gateway A.B.C.D] ACTION...\n\n"
               "Plays a guest on a QEMU -netdev stream link. Actions:\n"
               "  dhcp | dhcp-none | arp IP | tcp IP:PORT | tcp-fail IP:PORT | http IP:PORT PATH\n"
               "  serve PORT | send-spoofed-ip IP | send-spoofed-mac MAC | sleep MS | ipv6\n");
}

static int open_link(const char *listen_path, unsigned long fd) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int s, c;

        if (!listen_path)
                return fcntl((int) fd, F_GETFD) < 0 ? -errno : (int) fd;
        if (strlen(listen_path) >= sizeof(sa.sun_path))
                return -ENAMETOOLONG;
        strcpy(sa.sun_path, listen_path);

        s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return -errno;
        (void) unlink(listen_path);
        if (bind(s, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(s, 1) < 0) {
                c = -errno;
                (void) close(s);
                return c;
        }
        printf("listening\n");
        fflush(stdout);
        do
                c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
        while (c < 0 && errno == EINTR);
        if (c < 0)
                c = -errno;
        (void) close(s);
        return c;
}

int main(int argc, char *argv[]) {
        enum { ARG_MAC = 0x100, ARG_LISTEN, ARG_FD, ARG_TIMEOUT, ARG_IP, ARG_GATEWAY };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "mac", required_argument, NULL, ARG_MAC },
                { "listen", required_argument, NULL, ARG_LISTEN },
                { "fd", required_argument, NULL, ARG_FD },
                { "timeout-ms", required_argument, NULL, ARG_TIMEOUT },
                { "ip", required_argument, NULL, ARG_IP },
                { "gateway", required_argument, NULL, ARG_GATEWAY },
                {},
        };
        const char *listen_path = NULL, *debug = secure_getenv("FAKE_GUEST_DEBUG");
        unsigned long fd = ULONG_MAX, timeout_ms = 3000, prefix = 24;
        uint32_t ip = 0, gateway = 0;
        uint8_t mac[6];
        bool have_mac = false, ok = true;
        int c, r, idx = 0;

        while ((c = getopt_long(argc, argv, "+h", options, &idx)) >= 0) {
                char *slash;

                r = 0;
                switch (c) {
                case 'h':
                        help();
                        return 0;
                case ARG_MAC:
                        r = parse_mac(optarg, mac);
                        have_mac = r >= 0;
                        break;
                case ARG_LISTEN:
                        listen_path = optarg;
                        break;
                case ARG_FD:
                        r = parse_ulong(optarg, INT_MAX, &fd);
                        break;
                case ARG_TIMEOUT:
                        r = parse_ulong(optarg, 24 * 3600 * 1000, &timeout_ms);
                        break;
                case ARG_IP:
                        slash = strchr(optarg, '/');
                        if (slash) {
                                *slash = '\0';
                                r = parse_ulong(slash + 1, 30, &prefix);
                        }
                        if (r >= 0)
                                r = parse_ipv4(optarg, &ip);
                        if (r >= 0 && (ip == 0 || prefix == 0))
                                r = -EINVAL;
                        break;
                case ARG_GATEWAY:
                        r = parse_ipv4(optarg, &gateway);
                        break;
                default:
                        return 2;
                }
                if (r < 0) {
                        fprintf(stderr, "fake-guest: invalid value for --%s: '%s'\n", options[idx].name, optarg);
                        return 2;
                }
        }
        if (!have_mac || !listen_path == (fd == ULONG_MAX) || optind >= argc) {
                fprintf(stderr, "fake-guest: need --mac, one of --listen or --fd, and at least one action\n");
                return 2;
        }

        Action *actions = calloc((size_t) argc, sizeof(Action));
        size_t n_actions = 0;
        if (!actions)
                return 2;
        for (int i = optind; i < argc; i += r) {
                r = parse_action(argc - i, argv + i, actions + n_actions++);
                if (r < 0) {
                        free(actions);
                        return 2;
                }
        }

        Guest *g = calloc(1, sizeof(Guest));
        if (!g) {
                free(actions);
                return 1;
        }
        g->debug = debug && streq(debug, "1");
        memcpy(g->mac, mac, 6);
        g->ip = ip;
        g->mask = ip != 0 ? UINT32_MAX << (32 - prefix) : 0;
        g->router = gateway != 0 ? gateway : ip != 0 ? (ip & g->mask) + 1 : 0;

        (void) signal(SIGPIPE, SIG_IGN);
        g->fd = open_link(listen_path, fd);
        if (g->fd < 0) {
                fprintf(stderr, "fake-guest: cannot open the link: %s\n", strerror(-g->fd));
                ok = false;
        } else
                for (size_t i = 0; i < n_actions; i++)
                        ok = run_action(g, actions + i, timeout_ms) && ok;

        if (g->fd >= 0)
                (void) close(g->fd);
        if (listen_path)
                (void) unlink(listen_path);
        free(g);
        free(actions);
        return ok ? 0 : 1;
}
