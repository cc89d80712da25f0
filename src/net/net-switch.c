/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"
#include "net-dhcp.h"
#include "net-packet.h"
#include "net-slirp.h"
#include "net-switch.h"
#include "socket-util.h"

/* The largest frame a port may carry: an MTU of NET_MTU_MAX plus the Ethernet header, with room for
 * a VLAN tag. A stream peer announcing more is broken and gets disconnected. */
#define FRAME_MAX (NET_MTU_MAX + NET_ETH_HLEN + 4U)
#define STREAM_BUFFER (256U * 1024U)

static const uint8_t broadcast_mac[NET_ETH_ALEN] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

typedef struct QueuedFrame {
        struct QueuedFrame *next;
        size_t len, done;
        uint8_t data[];
} QueuedFrame;

typedef struct HostForward {
        struct HostForward *next;
        char *path;         /* a unix listener, or NULL for: */
        uint16_t host_port; /* a TCP listener on 127.0.0.1 */
} HostForward;

struct NetPort {
        NetSwitch *sw;
        NetPort *next;
        char *id;
        NetPortPolicy policy;
        uint16_t imds_port; /* 0 while the port has no IMDS */
        char *imds_path;
        HostForward *forwards;

        int fd;
        NetPortFraming framing;
        sd_event_source *io;
        sd_event_source *reaper; /* closes a link that failed mid-switching, from the loop */
        bool dead;
        uint8_t *rbuf; /* stream framing: what was read and not yet switched */
        size_t rlen;
        QueuedFrame *queue, **queue_tail;
        size_t queued;
        NetStats stats;
};

struct NetSwitch {
        sd_event *event;
        NetSwitchConfig config;
        char *search_domain;
        NetNetworkPolicy policy;
        NetDhcpConfig dhcp;
        NetSlirp *slirp;
        NetPort *ports;
        NetStats stats;
};

static bool mac_eq(const uint8_t *a, const uint8_t *b) {
        return memcmp(a, b, NET_ETH_ALEN) == 0;
}

static bool mac_is_group(const uint8_t *m) {
        return m[0] & 1;
}

static NetPort *port_by_mac(NetSwitch *s, const uint8_t *mac) {
        for (NetPort *p = s->ports; p; p = p->next)
                if (mac_eq(p->policy.mac, mac))
                        return p;
        return NULL;
}

static NetPort *port_by_ip(NetSwitch *s, uint32_t ip) {
        for (NetPort *p = s->ports; p; p = p->next)
                if (p->policy.ip == ip)
                        return p;
        return NULL;
}

/* ---- sending to a port ---- */

static void port_count_tx(NetPort *p, size_t wire) {
        p->stats.tx_bytes += wire;
        p->stats.tx_frames++;
        p->sw->stats.tx_bytes += wire;
        p->sw->stats.tx_frames++;
}

static void port_drop(NetPort *p) {
        p->stats.dropped++;
        p->sw->stats.dropped++;
}

static void port_update_events(NetPort *p) {
        if (p->io)
                (void) sd_event_source_set_io_events(p->io, EPOLLIN | (p->queue ? EPOLLOUT : 0));
}

static int port_flush(NetPort *p) {
        while (p->queue) {
                QueuedFrame *q = p->queue;
                ssize_t k;

                if (p->framing == NET_PORT_RAW)
                        k = write(p->fd, q->data, q->len);
                else
                        k = send(p->fd, q->data + q->done, q->len - q->done, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (k < 0) {
                        if (errno == EAGAIN || errno == EINTR)
                                break;
                        return -errno;
                }
                q->done += (size_t) k;
                if (p->framing == NET_PORT_STREAM && q->done < q->len)
                        break;
                p->queue = q->next;
                if (!p->queue)
                        p->queue_tail = &p->queue;
                p->queued -= q->len;
                free(q);
        }
        port_update_events(p);
        return 0;
}

static void port_disconnect_internal(NetPort *p);

static int on_reap(sd_event_source *source, void *userdata) {
        NetPort *p = userdata;

        log_debug("Port %s: link failed, closed.", p->id);
        port_disconnect_internal(p);
        return 0;
}

/* A link that fails while frames are being switched is closed from the loop, not under the feet of
 * the reader that may still hold a frame in its buffer. */
static void port_fail(NetPort *p) {
        if (p->dead)
                return;
        p->dead = true;
        if (p->io)
                (void) sd_event_source_set_enabled(p->io, SD_EVENT_OFF);
        if (!p->reaper && sd_event_add_defer(p->sw->event, &p->reaper, on_reap, p) < 0)
                log_debug("Port %s: cannot schedule closing the link.", p->id);
}

static void port_send(NetPort *p, const uint8_t *frame, size_t len) {
        size_t wire = len + (p->framing == NET_PORT_STREAM ? 4 : 0);
        QueuedFrame *q;

        if (p->fd < 0 || p->dead || len == 0 || len > FRAME_MAX) {
                port_drop(p);
                return;
        }
        if (!p->queue) {
                /* the common case: straight out, no copy */
                ssize_t k;
                if (p->framing == NET_PORT_RAW)
                        k = write(p->fd, frame, len);
                else {
                        uint32_t be = htonl((uint32_t) len);
                        struct iovec iov[2] = { { &be, 4 }, { (void *) frame, len } };
                        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
                        k = sendmsg(p->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
                }
                if (k == (ssize_t) wire) {
                        port_count_tx(p, wire);
                        return;
                }
                if (k < 0 && errno != EAGAIN && errno != EINTR) {
                        port_fail(p);
                        return;
                }
                if (p->framing == NET_PORT_RAW && k < 0) {
                        /* a tap that is full drops, as hardware would */
                        port_drop(p);
                        return;
                }
                /* a stream took part (or nothing): the rest waits, in order */
                q = malloc(sizeof(QueuedFrame) + wire);
                if (!q) {
                        port_fail(p); /* a half-sent frame cannot be taken back */
                        return;
                }
                q->len = wire;
                q->done = k > 0 ? (size_t) k : 0;
                q->next = NULL;
                memcpy(q->data, &(uint32_t){ htonl((uint32_t) len) }, 4);
                memcpy(q->data + 4, frame, len);
                *p->queue_tail = q;
                p->queue_tail = &q->next;
                p->queued += wire;
                port_count_tx(p, wire);
                port_update_events(p);
                return;
        }
        if (p->queued + wire > NET_PORT_QUEUE_MAX) {
                port_drop(p);
                return;
        }
        q = malloc(sizeof(QueuedFrame) + wire);
        if (!q) {
                port_drop(p);
                return;
        }
        q->len = wire;
        q->done = 0;
        q->next = NULL;
        if (p->framing == NET_PORT_STREAM) {
                memcpy(q->data, &(uint32_t){ htonl((uint32_t) len) }, 4);
                memcpy(q->data + 4, frame, len);
        } else
                memcpy(q->data, frame, len);
        *p->queue_tail = q;
        p->queue_tail = &q->next;
        p->queued += wire;
        port_count_tx(p, wire);
}

/* ---- from the gateway ---- */

static void slirp_output(const uint8_t *frame, size_t len, void *userdata) {
        NetSwitch *s = userdata;
        _cleanup_free_ uint8_t *copy = NULL;
        NetFrame f;
        NetPort *p;

        if (net_frame_parse(frame, len, &f) < 0)
                return;

        if (f.is_arp) {
                /* slirp asks who has a guest: answer from the leases at once, for every guest (its
                 * own cache holds 16), and never bother the guests with it */
                if (f.arp_op == 1 && (p = port_by_ip(s, f.arp_tpa))) {
                        uint8_t reply[NET_ARP_FRAME_LEN];
                        net_arp_build_reply(reply, p->policy.mac, p->policy.ip, f.arp_sha, f.arp_spa);
                        (void) net_slirp_input_later(s->slirp, reply, sizeof(reply));
                }
                return;
        }
        if (!f.is_ipv4)
                return;

        copy = malloc(len);
        if (!copy)
                return;
        memcpy(copy, frame, len);
        /* the gateway speaks with one MAC, the one guests learnt for it */
        memcpy(copy + NET_ETH_ALEN, s->config.gateway_mac, NET_ETH_ALEN);

        if (mac_is_group(f.dst)) {
                for (p = s->ports; p; p = p->next)
                        port_send(p, copy, len);
                return;
        }
        p = port_by_mac(s, f.dst);
        if (!p)
                return;
        /* No link behind the port (its VM does not run): TCP from the gateway is answered with a
         * reset, as a host without that connection would, so that a forward's connection ends at once
         * rather than hang on the host's side until slirp gives up. */
        if ((p->fd < 0 || p->dead) && f.is_ipv4 && f.ip_proto == NET_IPPROTO_TCP) {
                uint8_t rst[NET_TCP_RESET_FRAME_LEN];
                if (net_tcp_build_reset(rst, frame, len, &f) > 0)
                        (void) net_slirp_input_later(s->slirp, rst, sizeof(rst));
                port_drop(p);
                return;
        }
        /* the IMDS answers as 169.254.169.254:80, and only to the guest whose port it came in for */
        if (f.has_ports && f.ip_proto == NET_IPPROTO_TCP && f.ip_src == s->policy.network) {
                if (p->imds_port == 0 || f.sport != p->imds_port)
                        return;
                (void) net_imds_rewrite_to_guest(copy, len, &f, s->policy.network, p->imds_port);
        }
        port_send(p, copy, len);
}

/* ---- from a port ---- */

static int dhcp_lookup(const uint8_t mac[NET_ETH_ALEN], uint32_t *ret_ip, void *userdata) {
        NetPort *p = port_by_mac(userdata, mac);

        if (!p)
                return -ENOENT;
        *ret_ip = p->policy.ip;
        return 0;
}

static void port_dhcp(NetPort *p, const uint8_t *frame, const NetFrame *f) {
        NetSwitch *s = p->sw;
        uint8_t reply[NET_DHCP_REPLY_MAX], out[NET_ETH_HLEN + 60 + 8 + NET_DHCP_REPLY_MAX];
        NetDhcpReply info = {};
        ssize_t n;
        int k;

        if (f->l4_length < 8)
                return;
        n = net_dhcp_handle(
                &s->dhcp, dhcp_lookup, s, frame + f->l4_offset + 8, f->l4_length - 8, reply, sizeof(reply), &info);
        if (n <= 0)
                return;
        /* a port only ever hears about its own lease */
        if (!mac_eq(info.chaddr, p->policy.mac))
                return;
        k = net_udp_build(
                out,
                sizeof(out),
                info.broadcast ? broadcast_mac : p->policy.mac,
                s->config.gateway_mac,
                s->config.gateway.s_addr,
                info.broadcast ? INADDR_BROADCAST : (info.ciaddr ?: info.yiaddr),
                67,
                68,
                reply,
                (size_t) n);
        if (k > 0)
                port_send(p, out, (size_t) k);
}

static void port_input(NetPort *p, uint8_t *frame, size_t len) {
        NetSwitch *s = p->sw;
        NetFrame f;
        NetVerdict v;

        p->stats.rx_frames++;
        s->stats.rx_frames++;
        if (net_frame_parse(frame, len, &f) < 0) {
                port_drop(p);
                return;
        }
        v = net_filter_ingress(&s->policy, &p->policy, &f);
        if (v != NET_PASS) {
                log_debug("Port %s: dropped a frame (%s).", p->id, net_verdict_to_string(v));
                port_drop(p);
                return;
        }

        if (f.is_arp) {
                if (f.arp_op == 1 &&
                    (f.arp_tpa == s->config.gateway.s_addr ||
                     (s->config.imds_enabled && f.arp_tpa == NET_IMDS_ADDRESS) ||
                     f.arp_tpa == s->config.host_alias.s_addr)) {
                        uint8_t reply[NET_ARP_FRAME_LEN];
                        net_arp_build_reply(reply, s->config.gateway_mac, f.arp_tpa, f.arp_sha, f.arp_spa);
                        port_send(p, reply, sizeof(reply));
                        return;
                }
                /* between guests: plain L2 */
                if (mac_is_group(f.dst)) {
                        for (NetPort *o = s->ports; o; o = o->next)
                                if (o != p)
                                        port_send(o, frame, len);
                } else {
                        NetPort *o = port_by_mac(s, f.dst);
                        if (o && o != p)
                                port_send(o, frame, len);
                }
                return;
        }

        /* IPv4 (the filter lets nothing else through) */
        if (f.has_ports && f.ip_proto == NET_IPPROTO_UDP && f.dport == 67 && f.sport == 68 &&
            (f.ip_dst == INADDR_BROADCAST || f.ip_dst == s->config.gateway.s_addr)) {
                port_dhcp(p, frame, &f);
                return;
        }
        if (mac_is_group(f.dst)) {
                for (NetPort *o = s->ports; o; o = o->next)
                        if (o != p)
                                port_send(o, frame, len);
                return;
        }
        {
                NetPort *o = port_by_mac(s, f.dst);
                if (o) {
                        if (o != p)
                                port_send(o, frame, len);
                        return;
                }
        }
        /* to the gateway: the IMDS first, rewritten to this port's own forward */
        if (f.ip_dst == NET_IMDS_ADDRESS) {
                if (p->imds_port == 0 ||
                    !net_imds_rewrite_to_gateway(frame, len, &f, s->policy.network, p->imds_port)) {
                        port_drop(p);
                        return;
                }
        }
        net_slirp_input(s->slirp, frame, len);
}

static void port_disconnect_internal(NetPort *p) {
        p->io = sd_event_source_disable_unref(p->io);
        p->reaper = sd_event_source_disable_unref(p->reaper);
        p->dead = false;
        if (p->fd >= 0)
                (void) close(p->fd);
        p->fd = -EBADF;
        p->rbuf = mfree(p->rbuf);
        p->rlen = 0;
        while (p->queue) {
                QueuedFrame *q = p->queue;
                p->queue = q->next;
                free(q);
        }
        p->queue_tail = &p->queue;
        p->queued = 0;
}

static int port_read_stream(NetPort *p) {
        for (;;) {
                ssize_t k;
                size_t off = 0;

                k = recv(p->fd, p->rbuf + p->rlen, STREAM_BUFFER - p->rlen, MSG_DONTWAIT);
                if (k < 0)
                        return errno == EAGAIN || errno == EINTR ? 0 : -errno;
                if (k == 0)
                        return -ECONNRESET;
                p->rlen += (size_t) k;
                p->stats.rx_bytes += (size_t) k;
                p->sw->stats.rx_bytes += (size_t) k;

                while (p->rlen - off >= 4) {
                        uint32_t n;
                        memcpy(&n, p->rbuf + off, 4);
                        n = ntohl(n);
                        if (n == 0 || n > FRAME_MAX)
                                return -EBADMSG;
                        if (p->rlen - off - 4 < n)
                                break;
                        port_input(p, p->rbuf + off + 4, n);
                        if (p->dead) /* its link failed while switching */
                                return 0;
                        off += 4 + n;
                }
                memmove(p->rbuf, p->rbuf + off, p->rlen - off);
                p->rlen -= off;
                if ((size_t) k < STREAM_BUFFER / 2)
                        return 0; /* drained for now; level-triggered epoll brings us back */
        }
}

static int port_read_raw(NetPort *p) {
        uint8_t frame[FRAME_MAX];

        for (int i = 0; i < 64; i++) {
                ssize_t k = read(p->fd, frame, sizeof(frame));
                if (k < 0)
                        return errno == EAGAIN || errno == EINTR ? 0 : -errno;
                if (k == 0)
                        return -ECONNRESET;
                p->stats.rx_bytes += (size_t) k;
                p->sw->stats.rx_bytes += (size_t) k;
                port_input(p, frame, (size_t) k);
                if (p->dead)
                        return 0;
        }
        return 0;
}

static int on_port_io(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        NetPort *p = userdata;
        int r = 0;

        if (revents & EPOLLOUT)
                r = port_flush(p);
        if (r >= 0 && (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                r = p->framing == NET_PORT_STREAM ? port_read_stream(p) : port_read_raw(p);
        if (r < 0) {
                log_debug("Port %s: link closed: %s", p->id, strerror(-r));
                port_fail(p);
        }
        return 0;
}

int net_port_attach_fd(NetPort *p, int fd, NetPortFraming framing) {
        int r;

        if (!p || fd < 0)
                return -EINVAL;
        port_disconnect_internal(p);
        if (framing == NET_PORT_STREAM) {
                p->rbuf = malloc(STREAM_BUFFER);
                if (!p->rbuf) {
                        (void) close(fd);
                        return -ENOMEM;
                }
        }
        p->fd = fd;
        p->framing = framing;
        r = sd_event_add_io(p->sw->event, &p->io, fd, EPOLLIN, on_port_io, p);
        if (r < 0) {
                port_disconnect_internal(p);
                return r;
        }
        return 0;
}

int net_port_dial(NetPort *p, const char *path) {
        int fd;

        if (!p || !path)
                return -EINVAL;
        fd = unix_stream_connect(path, /* nonblock= */ true);
        if (fd == -ENAMETOOLONG)
                return -EINVAL;
        if (fd < 0)
                return fd;
        /* a bigger socket buffer smooths bursts at large MTUs */
        (void) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &(int){ 1024 * 1024 }, sizeof(int));
        (void) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &(int){ 1024 * 1024 }, sizeof(int));
        return net_port_attach_fd(p, fd, NET_PORT_STREAM);
}

void net_port_disconnect(NetPort *p) {
        if (p)
                port_disconnect_internal(p);
}

bool net_port_is_connected(NetPort *p) {
        return p && p->fd >= 0;
}

void net_port_get_stats(NetPort *p, NetStats *ret) {
        *ret = p->stats;
}

/* ---- ports ---- */

static uint16_t host_index(NetSwitch *s, uint32_t ip) {
        return (uint16_t) (ntohl(ip) & ~ntohl(s->config.netmask.s_addr));
}

int net_switch_add_port(
        NetSwitch *s, const char *id, const uint8_t mac[NET_ETH_ALEN], struct in_addr ip, NetPort **ret) {
        NetPort *p;

        if (!s || !id || !mac)
                return -EINVAL;
        if ((ip.s_addr & s->config.netmask.s_addr) != s->config.network.s_addr ||
            host_index(s, ip.s_addr) == 0 || (ip.s_addr | s->config.netmask.s_addr) == INADDR_BROADCAST ||
            ip.s_addr == s->config.gateway.s_addr || ip.s_addr == s->config.host_alias.s_addr)
                return -EINVAL;
        if (net_switch_find_port(s, id) || port_by_mac(s, mac) || port_by_ip(s, ip.s_addr))
                return -EEXIST;
        p = calloc(1, sizeof(NetPort));
        if (!p)
                return -ENOMEM;
        p->id = strdup(id);
        if (!p->id) {
                free(p);
                return -ENOMEM;
        }
        p->sw = s;
        p->fd = -EBADF;
        p->queue_tail = &p->queue;
        memcpy(p->policy.mac, mac, NET_ETH_ALEN);
        p->policy.ip = ip.s_addr;
        p->next = s->ports;
        s->ports = p;
        if (ret)
                *ret = p;
        return 0;
}

NetPort *net_switch_find_port(NetSwitch *s, const char *id) {
        for (NetPort *p = s ? s->ports : NULL; p; p = p->next)
                if (streq(p->id, id))
                        return p;
        return NULL;
}

static void port_free(NetPort *p) {
        port_disconnect_internal(p);
        if (p->imds_port > 0)
                (void) net_slirp_remove_unix_forward(p->sw->slirp, p->sw->config.network, p->imds_port);
        while (p->forwards) {
                HostForward *f = p->forwards;
                p->forwards = f->next;
                if (f->path) {
                        (void) net_slirp_remove_host_forward(p->sw->slirp, f->path);
                        (void) unlink(f->path);
                } else
                        (void) net_slirp_remove_loopback_forward(p->sw->slirp, f->host_port);
                free(f->path);
                free(f);
        }
        free(p->imds_path);
        free(p->id);
        free(p);
}

void net_port_remove(NetPort *p) {
        if (!p)
                return;
        for (NetPort **i = &p->sw->ports; *i; i = &(*i)->next)
                if (*i == p) {
                        *i = p->next;
                        break;
                }
        port_free(p);
}

int net_port_set_imds(NetPort *p, const char *path) {
        uint16_t port;
        int r;

        if (!p || !path)
                return -EINVAL;
        if (!p->sw->config.imds_enabled)
                return -EOPNOTSUPP;
        port = host_index(p->sw, p->policy.ip);
        /* once per port: libslirp 4.7 never frees the path of a unix forward it removes */
        if (p->imds_port > 0 && p->imds_path && streq(p->imds_path, path))
                return 0;
        free(p->imds_path);
        p->imds_path = strdup(path);
        if (!p->imds_path)
                return -ENOMEM;
        if (p->imds_port > 0)
                (void) net_slirp_remove_unix_forward(p->sw->slirp, p->sw->config.network, p->imds_port);
        p->imds_port = 0;
        r = net_slirp_add_unix_forward(p->sw->slirp, path, p->sw->config.network, port);
        if (r < 0)
                return r;
        p->imds_port = port;
        return 0;
}

int net_port_add_host_forward(NetPort *p, const char *path, uint16_t guest_port) {
        HostForward *f;
        int r;

        if (!p || !path || guest_port == 0)
                return -EINVAL;
        f = calloc(1, sizeof(HostForward));
        if (!f)
                return -ENOMEM;
        f->path = strdup(path);
        if (!f->path) {
                free(f);
                return -ENOMEM;
        }
        r = net_slirp_add_host_forward(p->sw->slirp, path, (struct in_addr){ p->policy.ip }, guest_port);
        if (r < 0) {
                free(f->path);
                free(f);
                return r;
        }
        f->next = p->forwards;
        p->forwards = f;
        return 0;
}

/* ---- the switch ---- */

int net_switch_new(sd_event *e, const NetSwitchConfig *config, NetSwitch **ret) {
        NetSwitch *s;
        int r;

        if (!e || !config || !ret)
                return -EINVAL;
        if (config->mtu != 0 && (config->mtu < NET_MTU_MIN || config->mtu > NET_MTU_MAX))
                return -EINVAL;
        s = calloc(1, sizeof(NetSwitch));
        if (!s)
                return -ENOMEM;
        s->event = sd_event_ref(e);
        s->config = *config;
        s->config.mtu = config->mtu ?: NET_MTU_DEFAULT;
        s->config.lease_seconds = config->lease_seconds ?: NET_LEASE_SECONDS_DEFAULT;
        if (config->search_domain && config->search_domain[0]) {
                s->search_domain = strdup(config->search_domain);
                if (!s->search_domain) {
                        net_switch_free(s);
                        return -ENOMEM;
                }
        }
        s->config.search_domain = s->search_domain;
        s->policy = (NetNetworkPolicy){
                .network = config->network.s_addr,
                .netmask = config->netmask.s_addr,
                .gateway = config->gateway.s_addr,
                .host_alias = config->host_alias.s_addr,
                .host_alias_enabled = config->host_alias_enabled,
                .imds_enabled = config->imds_enabled,
        };
        s->dhcp = (NetDhcpConfig){
                .server = config->gateway.s_addr,
                .netmask = config->netmask.s_addr,
                .mtu = (uint16_t) s->config.mtu,
                .lease_seconds = s->config.lease_seconds,
                .search_domain = s->search_domain,
        };
        r = net_slirp_new(
                e,
                &(NetSlirpConfig){
                        .network = config->network,
                        .netmask = config->netmask,
                        .gateway = config->gateway,
                        .host_alias = config->host_alias,
                        .host_alias_enabled = config->host_alias_enabled,
                        .mtu = s->config.mtu,
                },
                slirp_output,
                s,
                &s->slirp);
        if (r < 0) {
                net_switch_free(s);
                return r;
        }
        *ret = s;
        return 0;
}

NetSwitch *net_switch_free(NetSwitch *s) {
        if (!s)
                return NULL;
        while (s->ports) {
                NetPort *p = s->ports;
                s->ports = p->next;
                port_free(p);
        }
        net_slirp_free(s->slirp);
        sd_event_unref(s->event);
        free(s->search_domain);
        free(s);
        return NULL;
}

void net_switch_get_stats(NetSwitch *s, NetStats *ret) {
        *ret = s->stats;
}

int net_port_add_loopback_forward(NetPort *p, uint16_t guest_port, uint16_t host_port, uint16_t *ret_host_port) {
        HostForward *f;
        int r;

        if (!p || guest_port == 0 || !ret_host_port)
                return -EINVAL;
        f = calloc(1, sizeof(HostForward));
        if (!f)
                return -ENOMEM;
        r = net_slirp_add_loopback_forward(
                p->sw->slirp, (struct in_addr){ p->policy.ip }, guest_port, host_port, &f->host_port);
        if (r < 0) {
                free(f);
                return r;
        }
        f->next = p->forwards;
        p->forwards = f;
        *ret_host_port = f->host_port;
        return 0;
}
