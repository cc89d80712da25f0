/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <endian.h>
#include <errno.h>
#include <string.h>

#include "macro.h"
#include "net-packet.h"
#include "string-table.h"

/* ARP for IPv4 over Ethernet (RFC 826): the fixed part, then sha, spa, tha, tpa. */
#define ARP_FIXED_LEN 8
#define ARP_LEN 28
#define ARP_HTYPE_ETHERNET 1
#define ARP_OP_REQUEST 1
#define ARP_OP_REPLY 2

#define IPV4_MIN_HLEN 20
#define IPV4_FLAG_MF 0x2000
#define IPV4_OFFSET_MASK 0x1fff
#define IPV4_TTL 64
#define IPV4_OFF_TOTAL_LENGTH 2
#define IPV4_OFF_FRAGMENT 6
#define IPV4_OFF_PROTO 9
#define IPV4_OFF_CHECKSUM 10
#define IPV4_OFF_SRC 12
#define IPV4_OFF_DST 16

#define UDP_HLEN 8
#define UDP_OFF_CHECKSUM 6
#define TCP_MIN_HLEN 20
#define TCP_OFF_CHECKSUM 16
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define DHCP_SERVER_PORT 67
#define DHCP_CLIENT_PORT 68

/* The largest UDP payload an IPv4 datagram without options can carry. */
#define UDP_PAYLOAD_MAX (UINT16_MAX - IPV4_MIN_HLEN - UDP_HLEN)

static const uint8_t eth_broadcast[NET_ETH_ALEN] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

static uint16_t get_be16(const uint8_t *p) {
        return (uint16_t) (p[0] << 8 | p[1]);
}

static void put_be16(uint8_t *p, uint16_t v) {
        p[0] = (uint8_t) (v >> 8);
        p[1] = (uint8_t) v;
}

/* IPv4 addresses stay in network byte order: these copy the four bytes as they are. */
static uint32_t get_addr(const uint8_t *p) {
        uint32_t a;

        memcpy(&a, p, sizeof(a));
        return a;
}

static void put_addr(uint8_t *p, uint32_t a) {
        memcpy(p, &a, sizeof(a));
}

uint32_t net_checksum_add(uint32_t sum, const void *data, size_t len) {
        /* Words are summed big-endian; an odd last byte is the high half of a word padded with zero.
         * The sum is chained over several calls only if every chunk but the last has an even
         * length. It is accumulated in 64 bits and folded on return, so no length overflows it. */
        const uint8_t *p = data;
        uint64_t acc = sum;
        size_t i;

        for (i = 0; i + 1 < len; i += 2)
                acc += get_be16(p + i);
        if (i < len)
                acc += (uint32_t) p[i] << 8;

        while (acc >> 16)
                acc = (acc & 0xffff) + (acc >> 16);
        return (uint32_t) acc;
}

uint16_t net_checksum_fold(uint32_t sum) {
        while (sum >> 16)
                sum = (sum & 0xffff) + (sum >> 16);
        return (uint16_t) sum;
}

static int parse_arp(const uint8_t *frame, size_t len, NetFrame *f) {
        const uint8_t *a = frame + NET_ETH_HLEN;
        size_t avail = len - NET_ETH_HLEN;
        uint8_t hlen, plen;

        if (avail < ARP_FIXED_LEN)
                return -EBADMSG;

        hlen = a[4];
        plen = a[5];
        if (avail < ARP_FIXED_LEN + 2 * (size_t) hlen + 2 * (size_t) plen)
                return -EBADMSG; /* its addresses would lie beyond the frame */

        if (get_be16(a) != ARP_HTYPE_ETHERNET || get_be16(a + 2) != NET_ETHERTYPE_IPV4)
                return 0; /* well formed, but not IPv4 over Ethernet: not ours to read */
        if (hlen != NET_ETH_ALEN || plen != sizeof(uint32_t))
                return -EBADMSG; /* Ethernet and IPv4 addresses have one length each */

        f->is_arp = true;
        f->arp_op = get_be16(a + 6);
        f->arp_sha = a + 8;
        f->arp_spa = get_addr(a + 14);
        f->arp_tha = a + 18;
        f->arp_tpa = get_addr(a + 24);
        return 0;
}

static int parse_ipv4(const uint8_t *frame, size_t len, NetFrame *f) {
        const uint8_t *ip = frame + NET_ETH_HLEN, *l4;
        size_t avail = len - NET_ETH_HLEN, hlen, total;

        if (avail < IPV4_MIN_HLEN)
                return -EBADMSG;
        if (ip[0] >> 4 != 4)
                return -EBADMSG;

        hlen = (size_t) (ip[0] & 0x0f) * 4;
        total = get_be16(ip + IPV4_OFF_TOTAL_LENGTH);
        /* Bytes past the total length are Ethernet padding; bytes missing before it are a lie. */
        if (hlen < IPV4_MIN_HLEN || total < hlen || total > avail)
                return -EBADMSG;

        f->is_ipv4 = true;
        f->ip_src = get_addr(ip + IPV4_OFF_SRC);
        f->ip_dst = get_addr(ip + IPV4_OFF_DST);
        f->ip_proto = ip[IPV4_OFF_PROTO];
        f->ip_fragment = (get_be16(ip + IPV4_OFF_FRAGMENT) & (IPV4_FLAG_MF | IPV4_OFFSET_MASK)) != 0;
        f->l3_offset = NET_ETH_HLEN;
        f->l4_offset = NET_ETH_HLEN + hlen;
        f->l4_length = total - hlen;

        /* A fragment's ports are either absent or belong to a datagram we do not see whole. */
        if (f->ip_fragment)
                return 0;

        l4 = frame + f->l4_offset;
        if (f->ip_proto == NET_IPPROTO_UDP && f->l4_length >= UDP_HLEN) {
                f->has_ports = true;
                f->sport = get_be16(l4);
                f->dport = get_be16(l4 + 2);
        } else if (f->ip_proto == NET_IPPROTO_TCP && f->l4_length >= TCP_MIN_HLEN) {
                size_t doff = (size_t) (l4[12] >> 4) * 4;

                if (doff >= TCP_MIN_HLEN && doff <= f->l4_length) {
                        f->has_ports = true;
                        f->sport = get_be16(l4);
                        f->dport = get_be16(l4 + 2);
                        f->tcp_flags = l4[13];
                }
        }
        return 0;
}

int net_frame_parse(const uint8_t *frame, size_t len, NetFrame *ret) {
        NetFrame f = {};
        int r = 0;

        assert_return(frame || len == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        if (len < NET_ETH_HLEN)
                return -EBADMSG;

        f.dst = frame;
        f.src = frame + NET_ETH_ALEN;
        f.ethertype = get_be16(frame + 2 * NET_ETH_ALEN);

        if (f.ethertype == NET_ETHERTYPE_ARP)
                r = parse_arp(frame, len, &f);
        else if (f.ethertype == NET_ETHERTYPE_IPV4)
                r = parse_ipv4(frame, len, &f);
        if (r < 0)
                return r;

        *ret = f;
        return 0;
}

static const char *const net_verdict_table[_NET_VERDICT_MAX] = {
        [NET_PASS] = "pass",
        [NET_DROP_MALFORMED] = "malformed",
        [NET_DROP_SPOOFED_MAC] = "spoofed-mac",
        [NET_DROP_SPOOFED_IP] = "spoofed-ip",
        [NET_DROP_IPV6] = "ipv6",
        [NET_DROP_ETHERTYPE] = "ethertype",
        [NET_DROP_FORBIDDEN_DEST] = "forbidden-dest",
        [NET_DROP_IMDS_DISABLED] = "imds-disabled",
        [NET_DROP_HOST_ALIAS] = "host-alias",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(net_verdict, NetVerdict);

/* A DHCP client without an address yet: UDP 68 → 67, broadcast or straight to the server. */
static bool is_dhcp_request(const NetNetworkPolicy *net, const NetFrame *f) {
        return f->ip_proto == NET_IPPROTO_UDP && f->has_ports && f->sport == DHCP_CLIENT_PORT &&
                f->dport == DHCP_SERVER_PORT &&
                (f->ip_dst == htobe32(UINT32_MAX) || f->ip_dst == net->gateway);
}

static NetVerdict filter_destination(const NetNetworkPolicy *net, const NetFrame *f) {
        uint32_t dst = be32toh(f->ip_dst); /* host order, for the prefix tests */

        if (f->ip_dst == NET_IMDS_ADDRESS) {
                if (!net->imds_enabled)
                        return NET_DROP_IMDS_DISABLED;
                if (f->ip_proto == NET_IPPROTO_TCP && f->has_ports && f->dport == NET_IMDS_PORT)
                        return NET_PASS;
                return NET_DROP_FORBIDDEN_DEST;
        }

        /* slirp would dial link-local addresses for real: on a cloud host, the provider's metadata. */
        if (dst >> 16 == 0xa9fe)
                return NET_DROP_FORBIDDEN_DEST;

        /* The limited broadcast is for DHCP only (a fresh client, or a rebinding one). */
        if (dst == UINT32_MAX)
                return f->ip_proto == NET_IPPROTO_UDP && f->has_ports && f->dport == DHCP_SERVER_PORT ?
                        NET_PASS :
                        NET_DROP_FORBIDDEN_DEST;

        /* slirp dials 127/8 on the host even with disable_host_loopback; the rest is not routable. */
        if (dst >> 24 == 127 || dst >> 24 == 0 || dst >> 28 >= 0xe)
                return NET_DROP_FORBIDDEN_DEST;

        /* The IMDS proxy address: reached only through the rewrite, which picks the guest's port. */
        if (f->ip_dst == net->network)
                return NET_DROP_FORBIDDEN_DEST;

        if (f->ip_dst == (net->network | ~net->netmask))
                return NET_PASS;

        /* While the alias is off, a guest may not open anything there. It still answers what the host
         * opened towards it: forward_port and exec_vm connections come from the alias, and slirp takes
         * nothing at that address but segments of the connections it made itself. */
        if (f->ip_dst == net->host_alias && !net->host_alias_enabled &&
            !(f->has_ports && f->ip_proto == NET_IPPROTO_TCP && (f->tcp_flags & 0x10 /* ACK */)))
                return NET_DROP_HOST_ALIAS;

        return NET_PASS;
}

NetVerdict net_filter_ingress(const NetNetworkPolicy *net, const NetPortPolicy *port, const NetFrame *f) {
        assert_return(net, NET_DROP_MALFORMED);
        assert_return(port, NET_DROP_MALFORMED);
        assert_return(f, NET_DROP_MALFORMED);

        if (!f->src)
                return NET_DROP_MALFORMED;
        if (memcmp(f->src, port->mac, NET_ETH_ALEN) != 0)
                return NET_DROP_SPOOFED_MAC;

        switch (f->ethertype) {
        case NET_ETHERTYPE_IPV6:
                return NET_DROP_IPV6;

        case NET_ETHERTYPE_ARP:
                /* ARP for anything but IPv4 over Ethernet cannot be checked, so it does not enter. */
                if (!f->is_arp || !f->arp_sha)
                        return NET_DROP_MALFORMED;
                if (memcmp(f->arp_sha, port->mac, NET_ETH_ALEN) != 0)
                        return NET_DROP_SPOOFED_MAC;
                if (f->arp_spa != 0 && f->arp_spa != port->ip)
                        return NET_DROP_SPOOFED_IP;
                return NET_PASS;

        case NET_ETHERTYPE_IPV4:
                if (!f->is_ipv4)
                        return NET_DROP_MALFORMED;
                /* 0.0.0.0 is never the lease, even for a port that has none yet (ip 0). */
                if (f->ip_src == 0 ? !is_dhcp_request(net, f) : f->ip_src != port->ip)
                        return NET_DROP_SPOOFED_IP;
                return filter_destination(net, f);

        default:
                return NET_DROP_ETHERTYPE;
        }
}

/* Replaces the 16-bit word at field and updates both checksums incrementally, by RFC 1624 eqn. 3:
 * HC' = ~(~HC + ~m + m'). For any checksum but 0xffff, undoing the change restores it bit for bit. */
static void replace16(uint8_t *field, uint16_t v, uint8_t *ip_csum, uint8_t *tcp_csum) {
        uint16_t old = get_be16(field);
        uint8_t *csums[] = { ip_csum, tcp_csum };

        put_be16(field, v);
        for (size_t i = 0; i < ELEMENTSOF(csums); i++) {
                uint32_t sum;

                if (!csums[i])
                        continue;
                sum = (uint32_t) (uint16_t) ~get_be16(csums[i]) + (uint16_t) ~old + v;
                put_be16(csums[i], (uint16_t) ~net_checksum_fold(sum));
        }
}

static void replace_addr(uint8_t *field, uint32_t a, uint8_t *ip_csum, uint8_t *tcp_csum) {
        uint8_t b[sizeof(a)];

        put_addr(b, a);
        replace16(field, get_be16(b), ip_csum, tcp_csum);
        replace16(field + 2, get_be16(b + 2), ip_csum, tcp_csum);
}

/* Rewrites the source (or destination) address and port of an unfragmented TCP segment from
 * from_addr:from_port to to_addr:to_port. f decides; the frame bytes must agree with it. */
static bool imds_rewrite(
        uint8_t *frame,
        size_t len,
        const NetFrame *f,
        bool source,
        uint32_t from_addr,
        uint16_t from_port,
        uint32_t to_addr,
        uint16_t to_port) {
        uint8_t *ip, *tcp, *addr, *port;

        if (!frame || !f || !f->is_ipv4 || f->ip_fragment || f->ip_proto != NET_IPPROTO_TCP || !f->has_ports)
                return false;
        if ((source ? f->ip_src : f->ip_dst) != from_addr || (source ? f->sport : f->dport) != from_port)
                return false;

        /* f must describe this frame: the headers it points at lie inside it and say the same. */
        if (f->l4_offset > len || f->l4_offset < f->l3_offset ||
            f->l4_offset - f->l3_offset < IPV4_MIN_HLEN || len - f->l4_offset < TCP_MIN_HLEN)
                return false;
        ip = frame + f->l3_offset;
        tcp = frame + f->l4_offset;
        addr = ip + (source ? IPV4_OFF_SRC : IPV4_OFF_DST);
        port = tcp + (source ? 0 : 2);
        if (get_addr(addr) != from_addr || get_be16(port) != from_port || ip[IPV4_OFF_PROTO] != NET_IPPROTO_TCP)
                return false;

        /* The address is in the IPv4 header and in the TCP pseudo-header; the port only in TCP. */
        replace_addr(addr, to_addr, ip + IPV4_OFF_CHECKSUM, tcp + TCP_OFF_CHECKSUM);
        replace16(port, to_port, /* ip_csum= */ NULL, tcp + TCP_OFF_CHECKSUM);
        return true;
}

bool net_imds_rewrite_to_gateway(uint8_t *frame, size_t len, const NetFrame *f, uint32_t network, uint16_t port) {
        return imds_rewrite(frame, len, f, /* source= */ false, NET_IMDS_ADDRESS, NET_IMDS_PORT, network, port);
}

bool net_imds_rewrite_to_guest(uint8_t *frame, size_t len, const NetFrame *f, uint32_t network, uint16_t port) {
        return imds_rewrite(frame, len, f, /* source= */ true, network, port, NET_IMDS_ADDRESS, NET_IMDS_PORT);
}

static void arp_build(
        uint8_t out[NET_ARP_FRAME_LEN],
        const uint8_t eth_dst[NET_ETH_ALEN],
        uint16_t op,
        const uint8_t sha[NET_ETH_ALEN],
        uint32_t spa,
        const uint8_t tha[NET_ETH_ALEN],
        uint32_t tpa) {
        uint8_t *a = out + NET_ETH_HLEN;

        memcpy(out, eth_dst, NET_ETH_ALEN);
        memcpy(out + NET_ETH_ALEN, sha, NET_ETH_ALEN);
        put_be16(out + 2 * NET_ETH_ALEN, NET_ETHERTYPE_ARP);

        put_be16(a, ARP_HTYPE_ETHERNET);
        put_be16(a + 2, NET_ETHERTYPE_IPV4);
        a[4] = NET_ETH_ALEN;
        a[5] = sizeof(uint32_t);
        put_be16(a + 6, op);
        memcpy(a + 8, sha, NET_ETH_ALEN);
        put_addr(a + 14, spa);
        memcpy(a + 18, tha, NET_ETH_ALEN);
        put_addr(a + 24, tpa);
}

void net_arp_build_reply(
        uint8_t out[NET_ARP_FRAME_LEN],
        const uint8_t sha[NET_ETH_ALEN],
        uint32_t spa,
        const uint8_t tha[NET_ETH_ALEN],
        uint32_t tpa) {
        assert(out && sha && tha);
        arp_build(out, tha, ARP_OP_REPLY, sha, spa, tha, tpa);
}

void net_arp_build_request(
        uint8_t out[NET_ARP_FRAME_LEN], const uint8_t sha[NET_ETH_ALEN], uint32_t spa, uint32_t tpa) {
        static const uint8_t unknown[NET_ETH_ALEN] = {};

        assert(out && sha);
        /* The target hardware address is what is asked for: zero, as Linux sends it. */
        arp_build(out, eth_broadcast, ARP_OP_REQUEST, sha, spa, unknown, tpa);
}

int net_udp_build(
        uint8_t *out,
        size_t size,
        const uint8_t dst_mac[NET_ETH_ALEN],
        const uint8_t src_mac[NET_ETH_ALEN],
        uint32_t src_ip,
        uint32_t dst_ip,
        uint16_t sport,
        uint16_t dport,
        const uint8_t *payload,
        size_t payload_len) {
        size_t udp_len = UDP_HLEN + payload_len, len = NET_ETH_HLEN + IPV4_MIN_HLEN + udp_len;
        uint8_t pseudo[12], *ip, *udp;
        uint32_t sum;
        uint16_t csum;

        assert_return(out, -EINVAL);
        assert_return(dst_mac && src_mac, -EINVAL);
        assert_return(payload || payload_len == 0, -EINVAL);
        assert_return(payload_len <= UDP_PAYLOAD_MAX, -EMSGSIZE); /* the IPv4 total length is 16 bits */

        if (size < len)
                return -ENOBUFS;

        ip = out + NET_ETH_HLEN;
        udp = ip + IPV4_MIN_HLEN;

        /* The payload first: it may already sit where it belongs in out. */
        if (payload_len > 0)
                memmove(udp + UDP_HLEN, payload, payload_len);

        memcpy(out, dst_mac, NET_ETH_ALEN);
        memcpy(out + NET_ETH_ALEN, src_mac, NET_ETH_ALEN);
        put_be16(out + 2 * NET_ETH_ALEN, NET_ETHERTYPE_IPV4);

        memset(ip, 0, IPV4_MIN_HLEN);
        ip[0] = 0x45; /* version 4, no options */
        put_be16(ip + IPV4_OFF_TOTAL_LENGTH, (uint16_t) (IPV4_MIN_HLEN + udp_len));
        ip[8] = IPV4_TTL;
        ip[IPV4_OFF_PROTO] = NET_IPPROTO_UDP;
        put_addr(ip + IPV4_OFF_SRC, src_ip);
        put_addr(ip + IPV4_OFF_DST, dst_ip);
        put_be16(ip + IPV4_OFF_CHECKSUM, (uint16_t) ~net_checksum_fold(net_checksum_add(0, ip, IPV4_MIN_HLEN)));

        put_be16(udp, sport);
        put_be16(udp + 2, dport);
        put_be16(udp + 4, (uint16_t) udp_len);
        put_be16(udp + UDP_OFF_CHECKSUM, 0);

        put_addr(pseudo, src_ip);
        put_addr(pseudo + 4, dst_ip);
        pseudo[8] = 0;
        pseudo[9] = NET_IPPROTO_UDP;
        put_be16(pseudo + 10, (uint16_t) udp_len);
        sum = net_checksum_add(0, pseudo, sizeof(pseudo));
        sum = net_checksum_add(sum, udp, udp_len);
        csum = (uint16_t) ~net_checksum_fold(sum);
        /* 0 means "no checksum" in UDP; its one's complement twin says the same sum. */
        put_be16(udp + UDP_OFF_CHECKSUM, csum == 0 ? 0xffff : csum);

        return (int) len;
}

static uint32_t get_be32(const uint8_t *p) {
        return (uint32_t) get_be16(p) << 16 | get_be16(p + 2);
}

static void put_be32(uint8_t *p, uint32_t v) {
        put_be16(p, (uint16_t) (v >> 16));
        put_be16(p + 2, (uint16_t) v);
}

int net_tcp_build_reset(
        uint8_t out[static NET_TCP_RESET_FRAME_LEN], const uint8_t *seg, size_t len, const NetFrame *f) {
        uint8_t pseudo[12], *ip = out + NET_ETH_HLEN, *tcp = ip + IPV4_MIN_HLEN;
        const uint8_t *in;
        size_t doff;
        uint32_t sum;

        assert_return(seg && f, -EINVAL);

        if (!f->is_ipv4 || f->ip_fragment || f->ip_proto != NET_IPPROTO_TCP || !f->has_ports ||
            (f->tcp_flags & TCP_FLAG_RST))
                return -EINVAL;
        /* f must describe seg: its TCP header lies inside it */
        if (f->l4_offset > len || len - f->l4_offset < TCP_MIN_HLEN || f->l4_length < TCP_MIN_HLEN)
                return -EINVAL;
        in = seg + f->l4_offset;
        doff = (size_t) (in[12] >> 4) * 4;
        if (doff < TCP_MIN_HLEN || doff > f->l4_length)
                return -EINVAL;

        memcpy(out, f->src, NET_ETH_ALEN);
        memcpy(out + NET_ETH_ALEN, f->dst, NET_ETH_ALEN);
        put_be16(out + 2 * NET_ETH_ALEN, NET_ETHERTYPE_IPV4);

        memset(ip, 0, IPV4_MIN_HLEN + TCP_MIN_HLEN);
        ip[0] = 0x45;
        put_be16(ip + IPV4_OFF_TOTAL_LENGTH, IPV4_MIN_HLEN + TCP_MIN_HLEN);
        ip[8] = IPV4_TTL;
        ip[IPV4_OFF_PROTO] = NET_IPPROTO_TCP;
        put_addr(ip + IPV4_OFF_SRC, f->ip_dst);
        put_addr(ip + IPV4_OFF_DST, f->ip_src);
        put_be16(ip + IPV4_OFF_CHECKSUM, (uint16_t) ~net_checksum_fold(net_checksum_add(0, ip, IPV4_MIN_HLEN)));

        put_be16(tcp, f->dport);
        put_be16(tcp + 2, f->sport);
        if (f->tcp_flags & TCP_FLAG_ACK) {
                /* the sequence number the segment acknowledged */
                put_be32(tcp + 4, get_be32(in + 8));
                tcp[13] = TCP_FLAG_RST;
        } else {
                /* sequence 0, acknowledging all the segment occupied: data, SYN and FIN */
                uint32_t ack = get_be32(in + 4) + (uint32_t) (f->l4_length - doff) +
                        !!(f->tcp_flags & TCP_FLAG_SYN) + !!(f->tcp_flags & TCP_FLAG_FIN);
                put_be32(tcp + 8, ack);
                tcp[13] = TCP_FLAG_RST | TCP_FLAG_ACK;
        }
        tcp[12] = (TCP_MIN_HLEN / 4) << 4;

        put_addr(pseudo, f->ip_dst);
        put_addr(pseudo + 4, f->ip_src);
        pseudo[8] = 0;
        pseudo[9] = NET_IPPROTO_TCP;
        put_be16(pseudo + 10, TCP_MIN_HLEN);
        sum = net_checksum_add(0, pseudo, sizeof(pseudo));
        sum = net_checksum_add(sum, tcp, TCP_MIN_HLEN);
        put_be16(tcp + TCP_OFF_CHECKSUM, (uint16_t) ~net_checksum_fold(sum));
        return NET_TCP_RESET_FRAME_LEN;
}
