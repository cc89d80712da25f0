/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <endian.h>
#include <stdlib.h>

#include "test-util.h"

#include "macro.h"
#include "net-packet.h"

/* The network of these tests: 10.77.0.0/24, gateway .1, guests .2 and .3, host alias .254. */
#define ADDR(a, b, c, d) htobe32((uint32_t) (a) << 24 | (uint32_t) (b) << 16 | (uint32_t) (c) << 8 | (d))
#define NETWORK ADDR(10, 77, 0, 0)
#define NETMASK ADDR(255, 255, 255, 0)
#define GATEWAY ADDR(10, 77, 0, 1)
#define GUEST ADDR(10, 77, 0, 2)
#define OTHER_GUEST ADDR(10, 77, 0, 3)
#define HOST_ALIAS ADDR(10, 77, 0, 254)
#define DIRECTED_BROADCAST ADDR(10, 77, 0, 255)
#define LIMITED_BROADCAST ADDR(255, 255, 255, 255)
#define INTERNET ADDR(1, 1, 1, 1)
#define IMDS_PROXY_PORT 10002

#define ETHERTYPE_VLAN 0x8100
#define TCP_SYN 0x02
#define TCP_ACK 0x10
#define IP_MF 0x2000
#define IP_DF 0x4000

static const uint8_t guest_mac[NET_ETH_ALEN] = { 0x02, 0xbc, 0x0a, 0x4d, 0x00, 0x02 };
static const uint8_t other_guest_mac[NET_ETH_ALEN] = { 0x02, 0xbc, 0x0a, 0x4d, 0x00, 0x03 };
static const uint8_t gateway_mac[NET_ETH_ALEN] = { 0x52, 0x55, 0x0a, 0x4d, 0x00, 0x01 };
static const uint8_t broadcast_mac[NET_ETH_ALEN] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

static NetNetworkPolicy test_network(void) {
        return (NetNetworkPolicy){
                .network = NETWORK,
                .netmask = NETMASK,
                .gateway = GATEWAY,
                .host_alias = HOST_ALIAS,
                .host_alias_enabled = false,
                .imds_enabled = true,
        };
}

static NetPortPolicy test_port(void) {
        NetPortPolicy p = { .ip = GUEST };

        memcpy(p.mac, guest_mac, NET_ETH_ALEN);
        return p;
}

/* An independent checksum, so the module's own helpers are not checked against themselves. */
static uint16_t ref_sum(uint32_t start, const uint8_t *p, size_t n) {
        uint64_t s = start;

        for (size_t i = 0; i < n; i++)
                s += i % 2 == 0 ? (uint64_t) p[i] << 8 : p[i];
        while (s >> 16)
                s = (s & 0xffff) + (s >> 16);
        return (uint16_t) s;
}

static uint16_t be16_at(const uint8_t *p) {
        return (uint16_t) (p[0] << 8 | p[1]);
}

static void put16(uint8_t *p, uint16_t v) {
        p[0] = (uint8_t) (v >> 8);
        p[1] = (uint8_t) v;
}

/* The sum of the TCP/UDP pseudo-header for the IPv4 header at ip. */
static uint32_t ref_pseudo(const uint8_t *ip, uint16_t l4_length) {
        uint8_t ph[12];

        memcpy(ph, ip + 12, 8);
        ph[8] = 0;
        ph[9] = ip[9];
        put16(ph + 10, l4_length);
        return ref_sum(0, ph, sizeof(ph));
}

/* True when the IPv4 header checksum and the TCP or UDP checksum of a parsed frame verify. */
static bool checksums_valid(const uint8_t *frame, const NetFrame *f) {
        const uint8_t *ip = frame + f->l3_offset;
        size_t hlen = f->l4_offset - f->l3_offset;

        if (ref_sum(0, ip, hlen) != 0xffff)
                return false;
        if (f->ip_proto != NET_IPPROTO_TCP && f->ip_proto != NET_IPPROTO_UDP)
                return true;
        return ref_sum(ref_pseudo(ip, (uint16_t) f->l4_length), frame + f->l4_offset, f->l4_length) == 0xffff;
}

/* A frame described by its fields; zero means the usual value. Checksums are always right. */
typedef struct TestPacket {
        const uint8_t *src_mac; /* NULL: the guest's */
        uint16_t ethertype;     /* 0: IPv4 */

        /* ARP (ethertype ARP): sender and target protocol addresses are src and dst */
        uint16_t arp_htype;     /* 0: Ethernet */
        uint16_t arp_op;        /* 0: request */
        const uint8_t *arp_sha; /* NULL: src_mac */

        uint32_t src, dst;
        uint8_t proto; /* 0: TCP */
        uint16_t sport, dport;
        uint8_t tcp_flags;
        uint16_t tcp_urgent;
        uint16_t ip_id;
        uint16_t frag;      /* flags and fragment offset */
        size_t ip_options;  /* bytes, a multiple of 4 */
        size_t tcp_options; /* bytes, a multiple of 4 */
        size_t payload_len;
        size_t padding; /* Ethernet padding after the IPv4 datagram */
} TestPacket;

static size_t build_packet(uint8_t *buf, size_t size, const TestPacket *p) {
        const uint8_t *src_mac = p->src_mac ?: guest_mac;
        uint16_t ethertype = p->ethertype ?: NET_ETHERTYPE_IPV4;
        uint8_t proto = p->proto ?: NET_IPPROTO_TCP;
        size_t hlen = 20 + p->ip_options, l4hlen, total, len;
        uint8_t *ip = buf + NET_ETH_HLEN, *l4;

        memcpy(buf, gateway_mac, NET_ETH_ALEN);
        memcpy(buf + NET_ETH_ALEN, src_mac, NET_ETH_ALEN);
        put16(buf + 12, ethertype);

        if (ethertype == NET_ETHERTYPE_ARP) {
                uint8_t *a = ip;

                assert_true(size >= NET_ARP_FRAME_LEN);
                put16(a, p->arp_htype ?: 1);
                put16(a + 2, NET_ETHERTYPE_IPV4);
                a[4] = 6;
                a[5] = 4;
                put16(a + 6, p->arp_op ?: 1);
                memcpy(a + 8, p->arp_sha ?: src_mac, NET_ETH_ALEN);
                memcpy(a + 14, &p->src, 4);
                memset(a + 18, 0, NET_ETH_ALEN);
                memcpy(a + 24, &p->dst, 4);
                return NET_ARP_FRAME_LEN;
        }
        if (ethertype != NET_ETHERTYPE_IPV4) {
                /* Something that is not ours to parse (an IPv6 header would start like this). */
                assert_true(size >= NET_ETH_HLEN + 40);
                memset(ip, 0, 40);
                ip[0] = 0x60;
                return NET_ETH_HLEN + 40;
        }

        l4hlen = proto == NET_IPPROTO_TCP ? 20 + p->tcp_options : proto == NET_IPPROTO_UDP ? 8 : 0;
        total = hlen + l4hlen + p->payload_len;
        len = NET_ETH_HLEN + total + p->padding;
        assert_true(len <= size);
        memset(ip, 0, total + p->padding);

        ip[0] = (uint8_t) (0x40 | hlen / 4);
        put16(ip + 2, (uint16_t) total);
        put16(ip + 4, p->ip_id);
        put16(ip + 6, p->frag);
        ip[8] = 64;
        ip[9] = proto;
        memcpy(ip + 12, &p->src, 4);
        memcpy(ip + 16, &p->dst, 4);
        for (size_t i = 20; i < hlen; i++)
                ip[i] = 1; /* NOP options */
        put16(ip + 10, (uint16_t) ~ref_sum(0, ip, hlen));

        l4 = ip + hlen;
        for (size_t i = 0; i < p->payload_len; i++)
                l4[l4hlen + i] = (uint8_t) (i * 7 + 3);
        for (size_t i = 0; i < p->padding; i++)
                l4[l4hlen + p->payload_len + i] = 0xee;

        if (proto == NET_IPPROTO_TCP) {
                put16(l4, p->sport);
                put16(l4 + 2, p->dport);
                put16(l4 + 4, 0x1111);
                put16(l4 + 6, 0x2222);
                l4[12] = (uint8_t) (l4hlen / 4 << 4);
                l4[13] = p->tcp_flags;
                put16(l4 + 14, 0xfaf0);
                put16(l4 + 18, p->tcp_urgent);
                for (size_t i = 20; i < l4hlen; i++)
                        l4[i] = 1;
                put16(l4 + 16,
                      (uint16_t) ~ref_sum(ref_pseudo(ip, (uint16_t) (total - hlen)), l4, total - hlen));
        } else if (proto == NET_IPPROTO_UDP) {
                put16(l4, p->sport);
                put16(l4 + 2, p->dport);
                put16(l4 + 4, (uint16_t) (total - hlen));
                put16(l4 + 6,
                      (uint16_t) ~ref_sum(ref_pseudo(ip, (uint16_t) (total - hlen)), l4, total - hlen));
        }
        return len;
}

static void test_checksum(void **state) {
        /* The example of RFC 1071 section 3. */
        static const uint8_t rfc[] = { 0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7 };
        static const uint8_t odd[] = { 0x12, 0x34, 0x56 };

        assert_int_equal(net_checksum_fold(net_checksum_add(0, rfc, sizeof(rfc))), 0xddf2);
        assert_int_equal(net_checksum_fold(0x2ddf0), 0xddf2);
        assert_int_equal(net_checksum_fold(0), 0);
        assert_int_equal(net_checksum_fold(0xffffffff), 0xffff);

        /* An odd last byte is the high half of a padded word. */
        assert_int_equal(net_checksum_fold(net_checksum_add(0, odd, sizeof(odd))), 0x1234 + 0x5600);

        /* Chained over even chunks it is the sum of the whole, whatever it started from. */
        assert_int_equal(net_checksum_fold(net_checksum_add(net_checksum_add(0, rfc, 4), rfc + 4, 4)), 0xddf2);
        assert_int_equal(
                net_checksum_fold(net_checksum_add(0xffffffff, rfc, sizeof(rfc))),
                ref_sum(0xffff, rfc, sizeof(rfc)));
        assert_int_equal(net_checksum_add(0x1234, NULL, 0), 0x1234);

        /* A long run of 0xff does not overflow the accumulator. */
        size_t n = 1 << 20;
        uint8_t *big = malloc(n);
        assert_non_null(big);
        memset(big, 0xff, n);
        assert_int_equal(net_checksum_fold(net_checksum_add(0, big, n)), 0xffff);
        free(big);
}

static void test_parse_ethernet(void **state) {
        uint8_t frame[64] = {};
        NetFrame f = { .ethertype = 0x5a5a };

        memcpy(frame, broadcast_mac, NET_ETH_ALEN);
        memcpy(frame + 6, guest_mac, NET_ETH_ALEN);
        put16(frame + 12, 0x88b5); /* local experimental */

        for (size_t len = 0; len < NET_ETH_HLEN; len++)
                assert_errno(net_frame_parse(frame, len, &f), -EBADMSG);
        assert_errno(net_frame_parse(NULL, 0, &f), -EBADMSG);
        assert_int_equal(f.ethertype, 0x5a5a); /* untouched on failure */
        assert_errno(net_frame_parse(frame, sizeof(frame), NULL), -EINVAL);
        assert_errno(net_frame_parse(NULL, 20, &f), -EINVAL);

        /* Unknown ethertypes parse, with neither ARP nor IPv4 facts. */
        assert_ok(net_frame_parse(frame, NET_ETH_HLEN, &f));
        assert_ptr_equal(f.dst, frame);
        assert_ptr_equal(f.src, frame + 6);
        assert_int_equal(f.ethertype, 0x88b5);
        assert_false(f.is_arp);
        assert_false(f.is_ipv4);
        assert_false(f.has_ports);

        /* IPv6 is one of them: the filter, not the parser, refuses it. */
        TestPacket p = { .ethertype = NET_ETHERTYPE_IPV6 };
        size_t len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_int_equal(f.ethertype, NET_ETHERTYPE_IPV6);
        assert_false(f.is_ipv4);
        assert_int_equal(f.l4_offset, 0);
}

static void test_parse_tcp(void **state) {
        uint8_t frame[256];
        TestPacket p = {
                .src = GUEST,
                .dst = INTERNET,
                .sport = 40000,
                .dport = 443,
                .tcp_flags = TCP_SYN,
                .ip_options = 8,
                .tcp_options = 12,
                .payload_len = 11,
        };
        size_t len = build_packet(frame, sizeof(frame), &p);
        NetFrame f;

        assert_ok(net_frame_parse(frame, len, &f));
        assert_int_equal(f.ethertype, NET_ETHERTYPE_IPV4);
        assert_true(f.is_ipv4);
        assert_false(f.is_arp);
        assert_int_equal(f.ip_src, GUEST);
        assert_int_equal(f.ip_dst, INTERNET);
        assert_int_equal(f.ip_proto, NET_IPPROTO_TCP);
        assert_false(f.ip_fragment);
        assert_int_equal(f.l3_offset, NET_ETH_HLEN);
        assert_int_equal(f.l4_offset, NET_ETH_HLEN + 28);
        assert_int_equal(f.l4_length, 32 + 11);
        assert_true(f.has_ports);
        assert_int_equal(f.sport, 40000);
        assert_int_equal(f.dport, 443);
        assert_int_equal(f.tcp_flags, TCP_SYN);
        assert_true(checksums_valid(frame, &f));
}

static void test_parse_udp_with_padding(void **state) {
        /* A short datagram padded to the Ethernet minimum: its length comes from IPv4, not the frame. */
        uint8_t frame[128];
        TestPacket p = {
                .src = GUEST,
                .dst = GATEWAY,
                .proto = NET_IPPROTO_UDP,
                .sport = 5353,
                .dport = 53,
                .payload_len = 3,
                .padding = 15,
        };
        size_t len = build_packet(frame, sizeof(frame), &p);
        NetFrame f;

        assert_int_equal(len, 60);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_true(f.is_ipv4);
        assert_int_equal(f.l4_length, 8 + 3);
        assert_true(f.has_ports);
        assert_int_equal(f.sport, 5353);
        assert_int_equal(f.dport, 53);
        assert_int_equal(f.tcp_flags, 0);
        assert_true(checksums_valid(frame, &f));

        /* ICMP has an L4 but no ports. */
        p = (TestPacket){ .src = GUEST, .dst = INTERNET, .proto = NET_IPPROTO_ICMP, .payload_len = 8 };
        len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_int_equal(f.ip_proto, NET_IPPROTO_ICMP);
        assert_int_equal(f.l4_length, 8);
        assert_false(f.has_ports);
        assert_int_equal(f.sport, 0);
}

static void test_parse_ipv4_lies(void **state) {
        uint8_t good[128], frame[128];
        TestPacket p = { .src = GUEST, .dst = INTERNET, .sport = 1, .dport = 2, .payload_len = 4 };
        size_t len = build_packet(good, sizeof(good), &p);
        NetFrame f;

        /* Not version 4. */
        memcpy(frame, good, len);
        frame[14] = 0x65;
        assert_errno(net_frame_parse(frame, len, &f), -EBADMSG);

        /* IHL below 5. */
        for (uint8_t ihl = 0; ihl < 5; ihl++) {
                memcpy(frame, good, len);
                frame[14] = (uint8_t) (0x40 | ihl);
                assert_errno(net_frame_parse(frame, len, &f), -EBADMSG);
        }

        /* IHL beyond the total length, and beyond the frame. */
        memcpy(frame, good, len);
        frame[14] = 0x4f;
        assert_errno(net_frame_parse(frame, len, &f), -EBADMSG);

        /* Total length shorter than the header, and longer than the frame. */
        memcpy(frame, good, len);
        put16(frame + 16, 19);
        assert_errno(net_frame_parse(frame, len, &f), -EBADMSG);
        put16(frame + 16, (uint16_t) (len - NET_ETH_HLEN + 1));
        assert_errno(net_frame_parse(frame, len, &f), -EBADMSG);
        put16(frame + 16, 0xffff);
        assert_errno(net_frame_parse(frame, len, &f), -EBADMSG);

        /* A total length of the header alone is an empty datagram: fine, but without ports. */
        put16(frame + 16, 20);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_int_equal(f.l4_length, 0);
        assert_false(f.has_ports);
}

static void test_parse_fragments(void **state) {
        uint8_t frame[128];
        NetFrame f;
        static const uint16_t fragments[] = { IP_MF, 1, IP_MF | 1, IP_DF | 185, 0x1fff };

        for (size_t i = 0; i < ELEMENTSOF(fragments); i++) {
                TestPacket p = {
                        .src = GUEST,
                        .dst = INTERNET,
                        .proto = NET_IPPROTO_UDP,
                        .sport = 1000,
                        .dport = 53,
                        .frag = fragments[i],
                        .payload_len = 16,
                };
                size_t len = build_packet(frame, sizeof(frame), &p);

                assert_ok(net_frame_parse(frame, len, &f));
                assert_true(f.is_ipv4);
                assert_true(f.ip_fragment);
                assert_false(f.has_ports);
                assert_int_equal(f.sport, 0);
                assert_int_equal(f.dport, 0);
                assert_int_equal(f.l4_length, 24);
        }

        /* Don't Fragment alone is a whole datagram. */
        TestPacket p = { .src = GUEST, .dst = INTERNET, .sport = 1, .dport = 2, .frag = IP_DF };
        size_t len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_false(f.ip_fragment);
        assert_true(f.has_ports);
}

static void test_parse_l4_header_must_fit(void **state) {
        /* Ports appear once the whole L4 header is inside the datagram, never before. */
        uint8_t frame[128];
        TestPacket p = { .src = GUEST, .dst = INTERNET, .sport = 40000, .dport = 80, .tcp_options = 8 };
        size_t len = build_packet(frame, sizeof(frame), &p);
        NetFrame f;

        for (uint16_t l4 = 0; l4 <= 28; l4++) {
                put16(frame + 16, (uint16_t) (20 + l4));
                assert_ok(net_frame_parse(frame, len, &f));
                assert_int_equal(f.l4_length, l4);
                assert_int_equal(f.has_ports, l4 >= 28);
        }

        /* A TCP data offset below 5 words, or beyond the segment, gives no ports. */
        put16(frame + 16, 48);
        for (uint8_t doff = 0; doff < 16; doff++) {
                frame[NET_ETH_HLEN + 20 + 12] = (uint8_t) (doff << 4);
                assert_ok(net_frame_parse(frame, len, &f));
                assert_int_equal(f.has_ports, doff >= 5 && doff <= 7);
                assert_int_equal(f.tcp_flags, 0);
        }

        /* UDP needs its 8 bytes. */
        p = (TestPacket){ .src = GUEST, .dst = INTERNET, .proto = NET_IPPROTO_UDP, .sport = 1, .dport = 2 };
        len = build_packet(frame, sizeof(frame), &p);
        for (uint16_t l4 = 0; l4 <= 8; l4++) {
                put16(frame + 16, (uint16_t) (20 + l4));
                assert_ok(net_frame_parse(frame, len, &f));
                assert_int_equal(f.has_ports, l4 == 8);
        }
}

static void test_parse_truncated_at_every_length(void **state) {
        /* Each prefix of a valid TCP frame, in a buffer of exactly that size, so that ASan sees any
         * read past the end. Short of the whole datagram the frame lies about its length. */
        uint8_t full[256];
        TestPacket p = {
                .src = GUEST,
                .dst = NET_IMDS_ADDRESS,
                .sport = 40000,
                .dport = 80,
                .tcp_flags = TCP_SYN,
                .ip_options = 4,
                .tcp_options = 12,
                .payload_len = 9,
                .padding = 6,
        };
        size_t len = build_packet(full, sizeof(full), &p), datagram_end = len - 6;
        NetFrame whole, f;

        assert_ok(net_frame_parse(full, len, &whole));

        for (size_t n = 0; n <= len; n++) {
                uint8_t *buf = malloc(MAX(n, (size_t) 1));
                int r;

                assert_non_null(buf);
                memcpy(buf, full, n);
                r = net_frame_parse(buf, n, &f);
                if (n < datagram_end)
                        assert_errno(r, -EBADMSG);
                else {
                        assert_ok(r);
                        assert_true(f.is_ipv4 && f.has_ports);
                        assert_int_equal(f.ip_src, whole.ip_src);
                        assert_int_equal(f.ip_dst, whole.ip_dst);
                        assert_int_equal(f.l4_offset, whole.l4_offset);
                        assert_int_equal(f.l4_length, whole.l4_length);
                        assert_int_equal(f.sport, whole.sport);
                        assert_int_equal(f.dport, whole.dport);
                        assert_int_equal(f.tcp_flags, TCP_SYN);
                }
                free(buf);
        }

        /* The same for ARP: every prefix short of the 28 bytes of ARP is refused. */
        p = (TestPacket){ .ethertype = NET_ETHERTYPE_ARP, .src = GUEST, .dst = GATEWAY };
        len = build_packet(full, sizeof(full), &p);
        for (size_t n = 0; n <= len; n++) {
                uint8_t *buf = malloc(MAX(n, (size_t) 1));

                assert_non_null(buf);
                memcpy(buf, full, n);
                if (n < NET_ARP_FRAME_LEN)
                        assert_errno(net_frame_parse(buf, n, &f), -EBADMSG);
                else
                        assert_ok(net_frame_parse(buf, n, &f));
                free(buf);
        }
}

static void test_parse_arp(void **state) {
        uint8_t frame[64];
        TestPacket p = { .ethertype = NET_ETHERTYPE_ARP, .arp_op = 2, .src = GUEST, .dst = GATEWAY };
        size_t len = build_packet(frame, sizeof(frame), &p);
        NetFrame f;

        assert_ok(net_frame_parse(frame, len, &f));
        assert_true(f.is_arp);
        assert_false(f.is_ipv4);
        assert_int_equal(f.arp_op, 2);
        assert_ptr_equal(f.arp_sha, frame + 22);
        assert_memory_equal(f.arp_sha, guest_mac, NET_ETH_ALEN);
        assert_ptr_equal(f.arp_tha, frame + 32);
        assert_int_equal(f.arp_spa, GUEST);
        assert_int_equal(f.arp_tpa, GATEWAY);

        /* Padded to 60 bytes it is the same ARP. */
        memset(frame + len, 0, sizeof(frame) - len);
        assert_ok(net_frame_parse(frame, 60, &f));
        assert_true(f.is_arp);

        /* Another hardware type, well formed: parsed, but not as ARP we read. */
        p.arp_htype = 6;
        len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_false(f.is_arp);
        assert_int_equal(f.ethertype, NET_ETHERTYPE_ARP);
        assert_null(f.arp_sha);
        assert_int_equal(f.arp_spa, 0);

        /* Ethernet/IPv4 with other address lengths lies about itself. */
        p.arp_htype = 1;
        len = build_packet(frame, sizeof(frame), &p);
        frame[18] = 8;
        assert_errno(net_frame_parse(frame, sizeof(frame), &f), -EBADMSG);
        frame[18] = 6;
        frame[19] = 8;
        assert_errno(net_frame_parse(frame, sizeof(frame), &f), -EBADMSG);

        /* Address lengths that run past the frame, whatever the types. */
        put16(frame + 14, 6);
        frame[18] = 255;
        frame[19] = 255;
        assert_errno(net_frame_parse(frame, sizeof(frame), &f), -EBADMSG);
}

typedef struct FilterCase {
        const char *what;
        TestPacket packet;
        bool imds_disabled;
        bool host_alias_enabled;
        NetVerdict expected;
} FilterCase;

static void test_filter_ingress(void **state) {
        const FilterCase cases[] = {
                /* What a guest does every day. */
                { "a guest reaches the internet over TCP",
                  { .src = GUEST, .dst = INTERNET, .sport = 40000, .dport = 443, .tcp_flags = TCP_SYN },
                  .expected = NET_PASS },
                { "a guest asks the gateway for DNS",
                  { .src = GUEST, .dst = GATEWAY, .proto = NET_IPPROTO_UDP, .sport = 5353, .dport = 53 },
                  .expected = NET_PASS },
                { "a guest pings another guest",
                  { .src = GUEST, .dst = OTHER_GUEST, .proto = NET_IPPROTO_ICMP, .payload_len = 8 },
                  .expected = NET_PASS },
                { "a guest sends fragments to the internet",
                  { .src = GUEST, .dst = INTERNET, .proto = NET_IPPROTO_UDP, .frag = IP_MF, .payload_len = 8 },
                  .expected = NET_PASS },
                { "a guest broadcasts on its network",
                  { .src = GUEST, .dst = DIRECTED_BROADCAST, .proto = NET_IPPROTO_UDP, .sport = 9, .dport = 9 },
                  .expected = NET_PASS },

                /* DHCP before and after the lease. */
                { "a DHCP discover from 0.0.0.0 to the limited broadcast passes",
                  { .src = 0, .dst = LIMITED_BROADCAST, .proto = NET_IPPROTO_UDP, .sport = 68, .dport = 67 },
                  .expected = NET_PASS },
                { "a DHCP request from 0.0.0.0 to the gateway passes",
                  { .src = 0, .dst = GATEWAY, .proto = NET_IPPROTO_UDP, .sport = 68, .dport = 67 },
                  .expected = NET_PASS },
                { "a rebinding guest broadcasts DHCP from its lease",
                  { .src = GUEST, .dst = LIMITED_BROADCAST, .proto = NET_IPPROTO_UDP, .sport = 68, .dport = 67 },
                  .expected = NET_PASS },

                /* Spoofing. */
                { "a guest spoofing another guest's MAC is dropped",
                  { .src_mac = other_guest_mac, .src = GUEST, .dst = INTERNET, .sport = 1, .dport = 2 },
                  .expected = NET_DROP_SPOOFED_MAC },
                { "a spoofed MAC is reported before anything else",
                  { .src_mac = other_guest_mac, .ethertype = NET_ETHERTYPE_IPV6 },
                  .expected = NET_DROP_SPOOFED_MAC },
                { "a guest spoofing another guest's IP is dropped",
                  { .src = OTHER_GUEST, .dst = INTERNET, .sport = 1, .dport = 2 },
                  .expected = NET_DROP_SPOOFED_IP },
                { "a guest spoofing the gateway's IP is dropped",
                  { .src = GATEWAY, .dst = OTHER_GUEST, .proto = NET_IPPROTO_ICMP },
                  .expected = NET_DROP_SPOOFED_IP },
                { "a spoofed source is dropped on fragments too",
                  { .src = OTHER_GUEST, .dst = INTERNET, .proto = NET_IPPROTO_UDP, .frag = 100 },
                  .expected = NET_DROP_SPOOFED_IP },
                { "0.0.0.0 over TCP is not DHCP",
                  { .src = 0, .dst = LIMITED_BROADCAST, .sport = 68, .dport = 67 },
                  .expected = NET_DROP_SPOOFED_IP },
                { "0.0.0.0 to the DHCP port of another host is not DHCP",
                  { .src = 0, .dst = INTERNET, .proto = NET_IPPROTO_UDP, .sport = 68, .dport = 67 },
                  .expected = NET_DROP_SPOOFED_IP },
                { "0.0.0.0 from a port other than 68 is not DHCP",
                  { .src = 0, .dst = LIMITED_BROADCAST, .proto = NET_IPPROTO_UDP, .sport = 69, .dport = 67 },
                  .expected = NET_DROP_SPOOFED_IP },
                { "0.0.0.0 fragments have no ports, so are not DHCP",
                  { .src = 0, .dst = LIMITED_BROADCAST, .proto = NET_IPPROTO_UDP, .frag = IP_MF },
                  .expected = NET_DROP_SPOOFED_IP },

                /* Not IPv4. */
                { "IPv6 is dropped", { .ethertype = NET_ETHERTYPE_IPV6 }, .expected = NET_DROP_IPV6 },
                { "VLAN-tagged frames are dropped, not looked through",
                  { .ethertype = ETHERTYPE_VLAN },
                  .expected = NET_DROP_ETHERTYPE },
                { "RARP is dropped", { .ethertype = 0x8035 }, .expected = NET_DROP_ETHERTYPE },

                /* ARP. */
                { "a guest asks who has the gateway",
                  { .ethertype = NET_ETHERTYPE_ARP, .src = GUEST, .dst = GATEWAY },
                  .expected = NET_PASS },
                { "an ARP probe from 0.0.0.0 passes",
                  { .ethertype = NET_ETHERTYPE_ARP, .src = 0, .dst = GUEST },
                  .expected = NET_PASS },
                { "ARP for the IMDS address passes (the switch answers it)",
                  { .ethertype = NET_ETHERTYPE_ARP, .src = GUEST, .dst = NET_IMDS_ADDRESS },
                  .expected = NET_PASS },
                { "an ARP reply poisoning another guest's address is dropped",
                  { .ethertype = NET_ETHERTYPE_ARP, .arp_op = 2, .src = OTHER_GUEST, .dst = GATEWAY },
                  .expected = NET_DROP_SPOOFED_IP },
                { "ARP with another sender hardware address is dropped",
                  { .ethertype = NET_ETHERTYPE_ARP, .arp_sha = other_guest_mac, .src = GUEST, .dst = GATEWAY },
                  .expected = NET_DROP_SPOOFED_MAC },
                { "ARP for another hardware type cannot be checked and is dropped",
                  { .ethertype = NET_ETHERTYPE_ARP, .arp_htype = 6, .src = GUEST, .dst = GATEWAY },
                  .expected = NET_DROP_MALFORMED },

                /* IMDS. */
                { "IMDS over TCP port 80 passes",
                  { .src = GUEST, .dst = NET_IMDS_ADDRESS, .sport = 40000, .dport = 80, .tcp_flags = TCP_SYN },
                  .expected = NET_PASS },
                { "IMDS on another port is forbidden",
                  { .src = GUEST, .dst = NET_IMDS_ADDRESS, .sport = 40000, .dport = 443 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "IMDS over UDP port 80 is forbidden",
                  { .src = GUEST, .dst = NET_IMDS_ADDRESS, .proto = NET_IPPROTO_UDP, .sport = 1, .dport = 80 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "IMDS in fragments is forbidden",
                  { .src = GUEST, .dst = NET_IMDS_ADDRESS, .frag = IP_MF, .payload_len = 8 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "IMDS on a network without it is dropped as disabled",
                  { .src = GUEST, .dst = NET_IMDS_ADDRESS, .sport = 40000, .dport = 80 },
                  .imds_disabled = true,
                  .expected = NET_DROP_IMDS_DISABLED },
                { "IMDS disabled wins over a forbidden port",
                  { .src = GUEST, .dst = NET_IMDS_ADDRESS, .proto = NET_IPPROTO_ICMP },
                  .imds_disabled = true,
                  .expected = NET_DROP_IMDS_DISABLED },

                /* Forbidden destinations. */
                { "the rest of 169.254/16 is forbidden (a cloud host's metadata lives there)",
                  { .src = GUEST, .dst = ADDR(169, 254, 0, 1), .sport = 1, .dport = 80 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "host loopback is forbidden",
                  { .src = GUEST, .dst = ADDR(127, 0, 0, 1), .sport = 40000, .dport = 8080 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "loopback in fragments is forbidden",
                  { .src = GUEST, .dst = ADDR(127, 1, 2, 3), .frag = 8, .payload_len = 8 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "0/8 is forbidden",
                  { .src = GUEST, .dst = ADDR(0, 1, 2, 3), .sport = 1, .dport = 2 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "multicast is forbidden",
                  { .src = GUEST, .dst = ADDR(224, 0, 0, 251), .proto = NET_IPPROTO_UDP, .sport = 5353, .dport = 5353 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "240/4 is forbidden",
                  { .src = GUEST, .dst = ADDR(240, 0, 0, 1), .sport = 1, .dport = 2 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "the limited broadcast is forbidden but for DHCP",
                  { .src = GUEST, .dst = LIMITED_BROADCAST, .proto = NET_IPPROTO_UDP, .sport = 68, .dport = 68 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "the limited broadcast over TCP is forbidden",
                  { .src = GUEST, .dst = LIMITED_BROADCAST, .sport = 68, .dport = 67 },
                  .expected = NET_DROP_FORBIDDEN_DEST },
                { "the network address (the IMDS proxy) is forbidden",
                  { .src = GUEST, .dst = NETWORK, .sport = 40000, .dport = IMDS_PROXY_PORT },
                  .expected = NET_DROP_FORBIDDEN_DEST },

                /* The host alias. */
                { "the host alias is dropped while disabled",
                  { .src = GUEST, .dst = HOST_ALIAS, .sport = 40000, .dport = 22, .tcp_flags = TCP_SYN },
                  .expected = NET_DROP_HOST_ALIAS },
                { "UDP to the host alias is dropped while disabled",
                  { .src = GUEST, .dst = HOST_ALIAS, .proto = NET_IPPROTO_UDP, .sport = 40000, .dport = 53 },
                  .expected = NET_DROP_HOST_ALIAS },
                { "a guest answers a connection the host opened from the alias (forward_port, exec_vm)",
                  { .src = GUEST, .dst = HOST_ALIAS, .sport = 22, .dport = 40000, .tcp_flags = TCP_SYN | 0x10 },
                  .expected = NET_PASS },
                { "the host alias passes once enabled",
                  { .src = GUEST, .dst = HOST_ALIAS, .sport = 40000, .dport = 22 },
                  .host_alias_enabled = true,
                  .expected = NET_PASS },
        };
        bool seen[_NET_VERDICT_MAX] = {};
        NetPortPolicy port = test_port();

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                const FilterCase *c = cases + i;
                NetNetworkPolicy net = test_network();
                uint8_t frame[256];
                size_t len = build_packet(frame, sizeof(frame), &c->packet);
                NetVerdict v;
                NetFrame f;

                net.imds_enabled = !c->imds_disabled;
                net.host_alias_enabled = c->host_alias_enabled;

                assert_ok(net_frame_parse(frame, len, &f));
                v = net_filter_ingress(&net, &port, &f);
                assert_true(v < _NET_VERDICT_MAX);
                if (v != c->expected)
                        fail_msg(
                                "%s: got %s, expected %s",
                                c->what,
                                net_verdict_to_string(v),
                                net_verdict_to_string(c->expected));
                seen[v] = true;
        }

        /* A NetFrame that claims IPv4 without its facts (not one net_frame_parse returns). */
        NetNetworkPolicy net = test_network();
        NetFrame bogus = { .src = guest_mac, .ethertype = NET_ETHERTYPE_IPV4 };
        assert_int_equal(net_filter_ingress(&net, &port, &bogus), NET_DROP_MALFORMED);
        bogus.src = NULL;
        assert_int_equal(net_filter_ingress(&net, &port, &bogus), NET_DROP_MALFORMED);
        assert_int_equal(net_filter_ingress(&net, &port, NULL), NET_DROP_MALFORMED);

        for (NetVerdict v = 0; v < _NET_VERDICT_MAX; v++)
                if (!seen[v])
                        fail_msg("no case yields %s", net_verdict_to_string(v));
}

static void test_filter_port_without_lease(void **state) {
        /* A port whose lease is still 0.0.0.0 gets DHCP and nothing else from that address. */
        NetNetworkPolicy net = test_network();
        NetPortPolicy port = test_port();
        uint8_t frame[128];
        NetFrame f;

        port.ip = 0;
        TestPacket dhcp = { .dst = LIMITED_BROADCAST, .proto = NET_IPPROTO_UDP, .sport = 68, .dport = 67 };
        assert_ok(net_frame_parse(frame, build_packet(frame, sizeof(frame), &dhcp), &f));
        assert_int_equal(net_filter_ingress(&net, &port, &f), NET_PASS);

        TestPacket web = { .dst = INTERNET, .sport = 40000, .dport = 443 };
        assert_ok(net_frame_parse(frame, build_packet(frame, sizeof(frame), &web), &f));
        assert_int_equal(net_filter_ingress(&net, &port, &f), NET_DROP_SPOOFED_IP);

        TestPacket stolen = { .src = OTHER_GUEST, .dst = INTERNET, .sport = 40000, .dport = 443 };
        assert_ok(net_frame_parse(frame, build_packet(frame, sizeof(frame), &stolen), &f));
        assert_int_equal(net_filter_ingress(&net, &port, &f), NET_DROP_SPOOFED_IP);
}

static void test_verdict_to_string(void **state) {
        static const char *const expected[] = {
                "pass",      "malformed",      "spoofed-mac",   "spoofed-ip", "ipv6",
                "ethertype", "forbidden-dest", "imds-disabled", "host-alias",
        };

        assert_int_equal(ELEMENTSOF(expected), _NET_VERDICT_MAX);
        for (NetVerdict v = 0; v < _NET_VERDICT_MAX; v++)
                assert_string_equal(net_verdict_to_string(v), expected[v]);
        assert_null(net_verdict_to_string(_NET_VERDICT_MAX));
        assert_null(net_verdict_to_string((NetVerdict) -1));
}

/* Swaps the addresses and the ports, as the reply to a segment has them. Checksums stay valid:
 * the one's complement sum does not depend on the order of the words. */
static void mirror(uint8_t *frame, const NetFrame *f) {
        uint8_t *ip = frame + f->l3_offset, *l4 = frame + f->l4_offset, t[4];

        memcpy(t, ip + 12, 4);
        memcpy(ip + 12, ip + 16, 4);
        memcpy(ip + 16, t, 4);
        memcpy(t, l4, 2);
        memcpy(l4, l4 + 2, 2);
        memcpy(l4 + 2, t, 2);
}

static void test_imds_rewrite_round_trip(void **state) {
        static const size_t payloads[] = { 0, 1, 2, 7, 100, 1001 };

        for (size_t ip_opt = 0; ip_opt <= 8; ip_opt += 8)
                for (size_t i = 0; i < ELEMENTSOF(payloads); i++) {
                        TestPacket request = {
                                .src = GUEST,
                                .dst = NET_IMDS_ADDRESS,
                                .sport = 40000 + (uint16_t) i,
                                .dport = NET_IMDS_PORT,
                                .tcp_flags = TCP_ACK,
                                .ip_options = ip_opt,
                                .tcp_options = 12,
                                .payload_len = payloads[i],
                                .padding = i % 2 ? 5 : 0,
                        };
                        TestPacket proxied = request;
                        uint8_t original[1200], frame[1200], expected[1200];
                        size_t len, changed = 0;
                        NetFrame f, g;

                        len = build_packet(original, sizeof(original), &request);
                        memcpy(frame, original, len);
                        assert_ok(net_frame_parse(frame, len, &f));

                        /* Guest → gateway: exactly what a sender of network:port would have built. */
                        assert_true(net_imds_rewrite_to_gateway(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
                        proxied.dst = NETWORK;
                        proxied.dport = IMDS_PROXY_PORT;
                        assert_int_equal(build_packet(expected, sizeof(expected), &proxied), len);
                        assert_memory_equal(frame, expected, len);

                        assert_ok(net_frame_parse(frame, len, &g));
                        assert_true(checksums_valid(frame, &g));
                        assert_int_equal(g.ip_dst, NETWORK);
                        assert_int_equal(g.dport, IMDS_PROXY_PORT);
                        assert_int_equal(g.ip_src, GUEST);
                        assert_int_equal(g.sport, request.sport);
                        assert_int_equal(g.l4_length, f.l4_length);
                        for (size_t k = 0; k < len; k++)
                                changed += frame[k] != original[k];
                        assert_true(changed <= 10); /* address, port, two checksums */

                        /* The reply, gateway → guest, comes back from 169.254.169.254:80, and is
                         * the original segment mirrored, to the bit. */
                        mirror(frame, &g);
                        assert_ok(net_frame_parse(frame, len, &g));
                        assert_false(net_imds_rewrite_to_gateway(frame, len, &g, NETWORK, IMDS_PROXY_PORT));
                        assert_true(net_imds_rewrite_to_guest(frame, len, &g, NETWORK, IMDS_PROXY_PORT));
                        assert_ok(net_frame_parse(frame, len, &g));
                        assert_true(checksums_valid(frame, &g));
                        assert_int_equal(g.ip_src, NET_IMDS_ADDRESS);
                        assert_int_equal(g.sport, NET_IMDS_PORT);
                        mirror(frame, &g);
                        assert_memory_equal(frame, original, len);
                }
}

static void test_imds_rewrite_to_guest(void **state) {
        TestPacket reply = {
                .src = NETWORK,
                .dst = GUEST,
                .sport = IMDS_PROXY_PORT,
                .dport = 40000,
                .tcp_flags = TCP_SYN | TCP_ACK,
                .payload_len = 333,
        };
        TestPacket seen = reply;
        uint8_t frame[512], expected[512];
        size_t len = build_packet(frame, sizeof(frame), &reply);
        NetFrame f;

        assert_ok(net_frame_parse(frame, len, &f));
        assert_true(net_imds_rewrite_to_guest(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
        seen.src = NET_IMDS_ADDRESS;
        seen.sport = NET_IMDS_PORT;
        build_packet(expected, sizeof(expected), &seen);
        assert_memory_equal(frame, expected, len);
}

static void test_imds_rewrite_zero_checksums(void **state) {
        /* Where a full computation gives a checksum of 0x0000, the incremental update must too, not
         * its one's complement twin 0xffff (RFC 1624 section 3, why eqn. 3 and not eqn. 2). The IP
         * ID and the TCP urgent pointer are chosen to bring both sums of the result to 0xffff. */
        TestPacket proxied = {
                .src = GUEST,
                .dst = NETWORK,
                .sport = 40000,
                .dport = IMDS_PROXY_PORT,
                .tcp_flags = TCP_ACK,
                .payload_len = 3,
        };
        TestPacket request;
        uint8_t frame[128], expected[128];
        size_t len;
        NetFrame f;

        len = build_packet(expected, sizeof(expected), &proxied);
        proxied.ip_id = (uint16_t) (0xffff - (uint16_t) ~be16_at(expected + 24));
        proxied.tcp_urgent = (uint16_t) (0xffff - (uint16_t) ~be16_at(expected + 50));
        build_packet(expected, sizeof(expected), &proxied);
        assert_int_equal(be16_at(expected + 24), 0);
        assert_int_equal(be16_at(expected + 50), 0);

        request = proxied;
        request.dst = NET_IMDS_ADDRESS;
        request.dport = NET_IMDS_PORT;
        build_packet(frame, sizeof(frame), &request);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_true(net_imds_rewrite_to_gateway(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
        assert_memory_equal(frame, expected, len);

        /* And the reply that comes out with both checksums 0x0000 on the guest's side. */
        TestPacket reply = {
                .src = NET_IMDS_ADDRESS,
                .dst = GUEST,
                .sport = NET_IMDS_PORT,
                .dport = 40000,
                .tcp_flags = TCP_ACK,
                .payload_len = 6,
        };
        len = build_packet(expected, sizeof(expected), &reply);
        reply.ip_id = (uint16_t) (0xffff - (uint16_t) ~be16_at(expected + 24));
        reply.tcp_urgent = (uint16_t) (0xffff - (uint16_t) ~be16_at(expected + 50));
        build_packet(expected, sizeof(expected), &reply);
        assert_int_equal(be16_at(expected + 24), 0);
        assert_int_equal(be16_at(expected + 50), 0);

        reply.src = NETWORK;
        reply.sport = IMDS_PROXY_PORT;
        build_packet(frame, sizeof(frame), &reply);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_true(net_imds_rewrite_to_guest(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
        assert_memory_equal(frame, expected, len);
}

static void test_imds_rewrite_not_applicable(void **state) {
        /* Frames the rewrite leaves alone, byte for byte. */
        const TestPacket to_gateway_not[] = {
                { .src = GUEST, .dst = NET_IMDS_ADDRESS, .sport = 40000, .dport = 443 },
                { .src = GUEST, .dst = NET_IMDS_ADDRESS, .proto = NET_IPPROTO_UDP, .sport = 1, .dport = 80 },
                { .src = GUEST, .dst = NET_IMDS_ADDRESS, .frag = IP_MF, .payload_len = 24 },
                { .src = GUEST, .dst = INTERNET, .sport = 40000, .dport = 80 },
                { .src = GUEST, .dst = NETWORK, .sport = 40000, .dport = IMDS_PROXY_PORT },
                { .ethertype = NET_ETHERTYPE_ARP, .src = GUEST, .dst = NET_IMDS_ADDRESS },
        };
        const TestPacket to_guest_not[] = {
                { .src = NETWORK, .dst = GUEST, .sport = IMDS_PROXY_PORT + 1, .dport = 40000 },
                { .src = GATEWAY, .dst = GUEST, .sport = IMDS_PROXY_PORT, .dport = 40000 },
                { .src = NETWORK, .dst = GUEST, .proto = NET_IPPROTO_UDP, .sport = IMDS_PROXY_PORT, .dport = 1 },
                { .src = NETWORK, .dst = GUEST, .frag = 3, .payload_len = 24 },
        };
        uint8_t frame[256], copy[256];
        size_t len;
        NetFrame f;

        for (size_t i = 0; i < ELEMENTSOF(to_gateway_not); i++) {
                len = build_packet(frame, sizeof(frame), to_gateway_not + i);
                memcpy(copy, frame, len);
                assert_ok(net_frame_parse(frame, len, &f));
                assert_false(net_imds_rewrite_to_gateway(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
                assert_false(net_imds_rewrite_to_guest(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
                assert_memory_equal(frame, copy, len);
        }
        for (size_t i = 0; i < ELEMENTSOF(to_guest_not); i++) {
                len = build_packet(frame, sizeof(frame), to_guest_not + i);
                memcpy(copy, frame, len);
                assert_ok(net_frame_parse(frame, len, &f));
                assert_false(net_imds_rewrite_to_guest(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
                assert_memory_equal(frame, copy, len);
        }

        /* A NetFrame that does not describe the bytes it is given. */
        TestPacket request = { .src = GUEST, .dst = NET_IMDS_ADDRESS, .sport = 40000, .dport = 80 };
        TestPacket other = { .src = GUEST, .dst = INTERNET, .sport = 40000, .dport = 80 };
        len = build_packet(frame, sizeof(frame), &request);
        assert_ok(net_frame_parse(frame, len, &f));
        build_packet(frame, sizeof(frame), &other);
        memcpy(copy, frame, len);
        assert_false(net_imds_rewrite_to_gateway(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
        assert_memory_equal(frame, copy, len);

        build_packet(frame, sizeof(frame), &request);
        assert_false(net_imds_rewrite_to_gateway(frame, f.l4_offset + 19, &f, NETWORK, IMDS_PROXY_PORT));
        assert_false(net_imds_rewrite_to_gateway(NULL, len, &f, NETWORK, IMDS_PROXY_PORT));
        assert_false(net_imds_rewrite_to_gateway(frame, len, NULL, NETWORK, IMDS_PROXY_PORT));
        NetFrame lying = f;
        lying.l4_offset = lying.l3_offset + 4;
        assert_false(net_imds_rewrite_to_gateway(frame, len, &lying, NETWORK, IMDS_PROXY_PORT));
        assert_true(net_imds_rewrite_to_gateway(frame, len, &f, NETWORK, IMDS_PROXY_PORT));
}

static void test_arp_build(void **state) {
        /* The frames as on the wire, one row per group of header fields. */
        /* clang-format off */
        static const uint8_t reply[NET_ARP_FRAME_LEN] = {
                /* Ethernet: to the asker, from the gateway, ARP */
                0x02, 0xbc, 0x0a, 0x4d, 0x00, 0x02, 0x52, 0x55, 0x0a, 0x4d, 0x00, 0x01, 0x08, 0x06,
                /* Ethernet, IPv4, 6, 4, reply */
                0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02,
                /* sender: the gateway MAC, for 169.254.169.254 */
                0x52, 0x55, 0x0a, 0x4d, 0x00, 0x01, 0xa9, 0xfe, 0xa9, 0xfe,
                /* target: the guest */
                0x02, 0xbc, 0x0a, 0x4d, 0x00, 0x02, 0x0a, 0x4d, 0x00, 0x02,
        };
        static const uint8_t request[NET_ARP_FRAME_LEN] = {
                /* Ethernet: broadcast, from the gateway, ARP */
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x55, 0x0a, 0x4d, 0x00, 0x01, 0x08, 0x06,
                /* Ethernet, IPv4, 6, 4, request */
                0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01,
                /* sender: the gateway */
                0x52, 0x55, 0x0a, 0x4d, 0x00, 0x01, 0x0a, 0x4d, 0x00, 0x01,
                /* who has 10.77.0.3? */
                0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x4d, 0x00, 0x03,
        };
        /* clang-format on */
        uint8_t out[NET_ARP_FRAME_LEN];
        NetFrame f;

        memset(out, 0xaa, sizeof(out));
        net_arp_build_reply(out, gateway_mac, NET_IMDS_ADDRESS, guest_mac, GUEST);
        assert_memory_equal(out, reply, sizeof(reply));

        memset(out, 0xaa, sizeof(out));
        net_arp_build_request(out, gateway_mac, GATEWAY, OTHER_GUEST);
        assert_memory_equal(out, request, sizeof(request));

        /* What the switch builds, it parses back. */
        assert_ok(net_frame_parse(out, sizeof(out), &f));
        assert_true(f.is_arp);
        assert_int_equal(f.arp_op, 1);
        assert_int_equal(f.arp_spa, GATEWAY);
        assert_int_equal(f.arp_tpa, OTHER_GUEST);
}

/* A DHCP server's broadcast: gateway:67 → 255.255.255.255:68. */
static int build_offer(uint8_t *out, size_t size, const uint8_t *payload, size_t payload_len) {
        return net_udp_build(
                out, size, broadcast_mac, gateway_mac, GATEWAY, LIMITED_BROADCAST, 67, 68, payload, payload_len);
}

static void test_udp_build(void **state) {
        /* The frames as on the wire, one row per group of header fields. */
        /* clang-format off */
        static const uint8_t expected[] = {
                /* Ethernet: broadcast, from the gateway, IPv4 */
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x55, 0x0a, 0x4d, 0x00, 0x01, 0x08, 0x00,
                /* IPv4: 33 bytes, id 0, DF clear, TTL 64, UDP, checksum; from .1 to 255.255.255.255 */
                0x45, 0x00, 0x00, 0x21, 0x00, 0x00, 0x00, 0x00, 0x40, 0x11, 0x70, 0x7f,
                0x0a, 0x4d, 0x00, 0x01, 0xff, 0xff, 0xff, 0xff,
                /* UDP 67 → 68, 13 bytes, checksum */
                0x00, 0x43, 0x00, 0x44, 0x00, 0x0d, 0xb1, 0x2d,
                'h', 'e', 'l', 'l', 'o',
        };
        /* clang-format on */
        uint8_t out[128];
        NetFrame f;
        int n;

        n = build_offer(out, sizeof(out), (const uint8_t *) "hello", 5);
        assert_int_equal(n, sizeof(expected));
        assert_memory_equal(out, expected, sizeof(expected));

        assert_ok(net_frame_parse(out, (size_t) n, &f));
        assert_true(f.has_ports);
        assert_int_equal(f.sport, 67);
        assert_int_equal(f.dport, 68);
        assert_int_equal(f.l4_length, 13);
        assert_true(checksums_valid(out, &f));

        /* Exactly the size it needs, and one byte less. */
        assert_int_equal(build_offer(out, sizeof(expected), (const uint8_t *) "hello", 5), sizeof(expected));
        assert_errno(build_offer(out, sizeof(expected) - 1, (const uint8_t *) "hello", 5), -ENOBUFS);
        assert_errno(build_offer(out, sizeof(out), NULL, 5), -EINVAL);

        /* No payload. */
        n = build_offer(out, sizeof(out), NULL, 0);
        assert_int_equal(n, 42);
        assert_ok(net_frame_parse(out, (size_t) n, &f));
        assert_true(checksums_valid(out, &f));

        /* The largest datagram IPv4 carries, and one byte more. */
        size_t big = 65535 - 28, size = NET_ETH_HLEN + 65535 + 1;
        uint8_t *payload = calloc(1, big + 1), *buf = malloc(size);
        assert_non_null(payload);
        assert_non_null(buf);
        n = build_offer(buf, size, payload, big);
        assert_int_equal(n, NET_ETH_HLEN + 65535);
        assert_ok(net_frame_parse(buf, (size_t) n, &f));
        assert_true(checksums_valid(buf, &f));
        assert_errno(build_offer(buf, size, payload, big + 1), -EMSGSIZE);
        free(payload);
        free(buf);
}

static void test_udp_build_zero_checksum(void **state) {
        /* A datagram whose checksum computes to 0 is sent with 0xffff, since 0 means "none". Find
         * the two payload bytes that make it so: the sum without them, plus them, must be 0xffff. */
        uint8_t out[64], payload[2] = {};
        uint16_t rest, word;
        NetFrame f;
        int n;

        n = net_udp_build(out, sizeof(out), guest_mac, gateway_mac, GATEWAY, GUEST, 67, 68, payload, 2);
        assert_int_equal(n, 44);
        rest = (uint16_t) ~be16_at(out + 40);
        word = (uint16_t) (0xffff - rest);
        put16(payload, word);

        n = net_udp_build(out, sizeof(out), guest_mac, gateway_mac, GATEWAY, GUEST, 67, 68, payload, 2);
        assert_int_equal(n, 44);
        assert_int_equal(be16_at(out + 40), 0xffff);
        assert_ok(net_frame_parse(out, (size_t) n, &f));
        assert_true(checksums_valid(out, &f));
}

/* The reset for a segment that belongs to no connection: addresses and ports swapped, checksums right,
 * and the numbers RFC 9293 3.10.7.1 asks for. */
static void test_tcp_build_reset(void **state) {
        uint8_t frame[256], out[NET_TCP_RESET_FRAME_LEN];
        TestPacket p = {
                .src_mac = other_guest_mac,
                .src = HOST_ALIAS,
                .dst = GUEST,
                .sport = 41000,
                .dport = 22,
                .tcp_flags = TCP_SYN,
                .tcp_options = 12,
        };
        size_t len = build_packet(frame, sizeof(frame), &p);
        NetFrame f, r;

        /* a SYN (sequence 0x11112222): sequence 0, ACK of the SYN */
        assert_ok(net_frame_parse(frame, len, &f));
        memset(out, 0xaa, sizeof(out));
        assert_int_equal(net_tcp_build_reset(out, frame, len, &f), NET_TCP_RESET_FRAME_LEN);
        assert_memory_equal(out, other_guest_mac, NET_ETH_ALEN);
        assert_memory_equal(out + NET_ETH_ALEN, gateway_mac, NET_ETH_ALEN);
        assert_ok(net_frame_parse(out, sizeof(out), &r));
        assert_true(r.is_ipv4 && r.has_ports);
        assert_int_equal(r.ip_src, GUEST);
        assert_int_equal(r.ip_dst, HOST_ALIAS);
        assert_int_equal(r.sport, 22);
        assert_int_equal(r.dport, 41000);
        assert_int_equal(r.tcp_flags, 0x04 | TCP_ACK);
        assert_int_equal(r.l4_length, 20);
        assert_true(checksums_valid(out, &r));
        assert_int_equal(be16_at(out + r.l4_offset + 4), 0);
        assert_int_equal(be16_at(out + r.l4_offset + 6), 0);
        assert_int_equal(be16_at(out + r.l4_offset + 8), 0x1111);
        assert_int_equal(be16_at(out + r.l4_offset + 10), 0x2223);

        /* a SYN with data and FIN: all of it acknowledged */
        p.tcp_flags = TCP_SYN | 0x01;
        p.payload_len = 5;
        len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_int_equal(net_tcp_build_reset(out, frame, len, &f), NET_TCP_RESET_FRAME_LEN);
        assert_ok(net_frame_parse(out, sizeof(out), &r));
        assert_true(checksums_valid(out, &r));
        assert_int_equal(be16_at(out + r.l4_offset + 10), 0x2222 + 5 + 2);

        /* a segment that acknowledges: the reset takes its sequence number from that, without ACK */
        p.tcp_flags = TCP_ACK;
        p.payload_len = 0;
        len = build_packet(frame, sizeof(frame), &p);
        put16(frame + NET_ETH_HLEN + 20 + 8, 0xdead);
        put16(frame + NET_ETH_HLEN + 20 + 10, 0xbeef);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_int_equal(net_tcp_build_reset(out, frame, len, &f), NET_TCP_RESET_FRAME_LEN);
        assert_ok(net_frame_parse(out, sizeof(out), &r));
        assert_true(checksums_valid(out, &r));
        assert_int_equal(r.tcp_flags, 0x04);
        assert_int_equal(be16_at(out + r.l4_offset + 4), 0xdead);
        assert_int_equal(be16_at(out + r.l4_offset + 6), 0xbeef);
        assert_int_equal(be16_at(out + r.l4_offset + 8), 0);
        assert_int_equal(be16_at(out + r.l4_offset + 10), 0);

        /* never a reset for a reset, nor for what is not TCP or not whole */
        p.tcp_flags = 0x04 | TCP_ACK;
        len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_errno(net_tcp_build_reset(out, frame, len, &f), -EINVAL);
        p.tcp_flags = TCP_SYN;
        p.proto = NET_IPPROTO_UDP;
        len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_errno(net_tcp_build_reset(out, frame, len, &f), -EINVAL);
        p.proto = 0;
        p.frag = IP_MF;
        len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_errno(net_tcp_build_reset(out, frame, len, &f), -EINVAL);
        /* f must describe the frame it is given */
        p.frag = 0;
        len = build_packet(frame, sizeof(frame), &p);
        assert_ok(net_frame_parse(frame, len, &f));
        assert_errno(net_tcp_build_reset(out, frame, NET_ETH_HLEN + 30, &f), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_checksum),
                cmocka_unit_test(test_parse_ethernet),
                cmocka_unit_test(test_parse_tcp),
                cmocka_unit_test(test_parse_udp_with_padding),
                cmocka_unit_test(test_parse_ipv4_lies),
                cmocka_unit_test(test_parse_fragments),
                cmocka_unit_test(test_parse_l4_header_must_fit),
                cmocka_unit_test(test_parse_truncated_at_every_length),
                cmocka_unit_test(test_parse_arp),
                cmocka_unit_test(test_filter_ingress),
                cmocka_unit_test(test_filter_port_without_lease),
                cmocka_unit_test(test_verdict_to_string),
                cmocka_unit_test(test_imds_rewrite_round_trip),
                cmocka_unit_test(test_imds_rewrite_to_guest),
                cmocka_unit_test(test_imds_rewrite_zero_checksums),
                cmocka_unit_test(test_imds_rewrite_not_applicable),
                cmocka_unit_test(test_arp_build),
                cmocka_unit_test(test_udp_build),
                cmocka_unit_test(test_udp_build_zero_checksum),
                cmocka_unit_test(test_tcp_build_reset),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
