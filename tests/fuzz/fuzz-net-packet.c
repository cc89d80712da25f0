/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <endian.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "macro.h"
#include "net-packet.h"

/* Frames as a guest sends them: whatever the bytes, the parse stays inside them and tells the
 * truth about them, the filter gives a verdict consistent with the policy, and the IMDS rewrite
 * changes only the address, the port and the two checksums, keeps valid checksums valid, and
 * is undone exactly by the rewrite of the reply. The reset built for a TCP segment goes back to its
 * sender, parses, and has valid checksums. */

#define NETWORK htobe32(0x0a4d0000U) /* 10.77.0.0/24 */
#define NETMASK htobe32(0xffffff00U)
#define GATEWAY htobe32(0x0a4d0001U)
#define HOST_ALIAS htobe32(0x0a4d00feU)
#define PROXY_PORT 10002

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

static uint16_t be16_at(const uint8_t *p) {
        return (uint16_t) (p[0] << 8 | p[1]);
}

static uint32_t addr_at(const uint8_t *p) {
        uint32_t a;

        memcpy(&a, p, sizeof(a));
        return a;
}

static uint16_t sum16(uint32_t start, const uint8_t *p, size_t n) {
        return net_checksum_fold(net_checksum_add(start, p, n));
}

static bool ip_checksum_valid(const uint8_t *frame, const NetFrame *f) {
        return sum16(0, frame + f->l3_offset, f->l4_offset - f->l3_offset) == 0xffff;
}

static bool tcp_checksum_valid(const uint8_t *frame, const NetFrame *f) {
        const uint8_t *ip = frame + f->l3_offset;
        uint8_t pseudo[12];

        memcpy(pseudo, ip + 12, 8);
        pseudo[8] = 0;
        pseudo[9] = NET_IPPROTO_TCP;
        pseudo[10] = (uint8_t) (f->l4_length >> 8);
        pseudo[11] = (uint8_t) f->l4_length;
        return sum16(sum16(0, pseudo, sizeof(pseudo)), frame + f->l4_offset, f->l4_length) == 0xffff;
}

static void check_parse(const uint8_t *data, size_t size, const NetFrame *f) {
        assert(f->dst == data && f->src == data + NET_ETH_ALEN);
        assert(f->ethertype == be16_at(data + 12));
        assert(!(f->is_arp && f->is_ipv4));

        if (f->is_arp) {
                const uint8_t *arp = data + NET_ETH_HLEN;

                assert(f->ethertype == NET_ETHERTYPE_ARP && size >= NET_ARP_FRAME_LEN);
                assert(f->arp_sha == arp + 8 && f->arp_tha == arp + 18);
                assert(f->arp_spa == addr_at(arp + 14) && f->arp_tpa == addr_at(arp + 24));
                assert(f->arp_op == be16_at(arp + 6));
        } else
                assert(!f->arp_sha && !f->arp_tha && f->arp_op == 0 && f->arp_spa == 0 && f->arp_tpa == 0);

        if (!f->is_ipv4) {
                assert(f->ethertype != NET_ETHERTYPE_IPV4);
                assert(f->l3_offset == 0 && f->l4_offset == 0 && f->l4_length == 0);
                assert(f->ip_src == 0 && f->ip_dst == 0 && f->ip_proto == 0 && !f->ip_fragment);
                assert(!f->has_ports);
                return;
        }

        assert(f->ethertype == NET_ETHERTYPE_IPV4);
        assert(f->l3_offset == NET_ETH_HLEN);
        assert(f->l4_offset >= f->l3_offset + 20 && f->l4_offset <= f->l3_offset + 60);
        assert(f->l4_offset <= size && f->l4_length <= size - f->l4_offset);
        assert(f->l4_offset - f->l3_offset + f->l4_length == be16_at(data + f->l3_offset + 2));
        assert(f->ip_src == addr_at(data + f->l3_offset + 12));
        assert(f->ip_dst == addr_at(data + f->l3_offset + 16));

        if (f->has_ports) {
                const uint8_t *l4 = data + f->l4_offset;

                assert(!f->ip_fragment);
                assert(f->ip_proto == NET_IPPROTO_TCP || f->ip_proto == NET_IPPROTO_UDP);
                assert(f->l4_length >= (f->ip_proto == NET_IPPROTO_TCP ? 20u : 8u));
                assert(f->sport == be16_at(l4) && f->dport == be16_at(l4 + 2));
                if (f->ip_proto == NET_IPPROTO_TCP)
                        assert(f->tcp_flags == l4[13] && (size_t) (l4[12] >> 4) * 4 <= f->l4_length);
        } else
                assert(f->sport == 0 && f->dport == 0 && f->tcp_flags == 0);
}

static void check_filter(const NetFrame *f) {
        NetNetworkPolicy net = {
                .network = NETWORK,
                .netmask = NETMASK,
                .gateway = GATEWAY,
                .host_alias = HOST_ALIAS,
                .imds_enabled = true,
        };
        NetPortPolicy port = { .ip = htobe32(0x0a4d0002U) };
        NetVerdict v;
        bool spoofed;

        /* A fixed port, which random frames mostly spoof. */
        memcpy(port.mac, (const uint8_t[]){ 0x02, 0xbc, 0x0a, 0x4d, 0x00, 0x02 }, NET_ETH_ALEN);
        spoofed = memcmp(f->src, port.mac, NET_ETH_ALEN) != 0 ||
                (f->is_arp && memcmp(f->arp_sha, port.mac, NET_ETH_ALEN) != 0);
        v = net_filter_ingress(&net, &port, f);
        assert(net_verdict_to_string(v));
        assert((v == NET_DROP_SPOOFED_MAC) == spoofed);

        /* A port that owns the frame's addresses, so that the destination rules are reached. */
        memcpy(port.mac, f->src, NET_ETH_ALEN);
        port.ip = f->is_arp ? f->arp_spa : f->ip_src;
        for (unsigned flags = 0; flags < 4; flags++) {
                net.imds_enabled = flags & 1;
                net.host_alias_enabled = flags & 2;
                v = net_filter_ingress(&net, &port, f);
                assert(net_verdict_to_string(v));

                if (f->ethertype == NET_ETHERTYPE_IPV6)
                        assert(v == NET_DROP_IPV6);
                if (f->ethertype != NET_ETHERTYPE_IPV4 && f->ethertype != NET_ETHERTYPE_ARP &&
                    f->ethertype != NET_ETHERTYPE_IPV6)
                        assert(v == NET_DROP_ETHERTYPE);
                if (v != NET_PASS || !f->is_ipv4)
                        continue;

                /* Whatever passes is from the lease (or DHCP) and to an allowed destination. */
                uint32_t dst = be32toh(f->ip_dst);
                assert(f->ip_src != 0 || (f->has_ports && f->sport == 68 && f->dport == 67));
                assert(f->ip_dst != NETWORK);
                assert(dst >> 24 != 127 && dst >> 24 != 0);
                assert(dst >> 28 < 0xe || (dst == UINT32_MAX && f->has_ports && f->dport == 67));
                assert(dst >> 16 != 0xa9fe ||
                       (net.imds_enabled && f->ip_dst == NET_IMDS_ADDRESS &&
                        f->ip_proto == NET_IPPROTO_TCP && f->dport == NET_IMDS_PORT));
                assert(net.host_alias_enabled || f->ip_dst != HOST_ALIAS);
        }
}

/* Swaps addresses and ports, as in the reply; the one's complement sums do not change. */
static void mirror(uint8_t *frame, const NetFrame *f) {
        uint8_t *ip = frame + f->l3_offset, *l4 = frame + f->l4_offset, t[4];

        memcpy(t, ip + 12, 4);
        memcpy(ip + 12, ip + 16, 4);
        memcpy(ip + 16, t, 4);
        memcpy(t, l4, 2);
        memcpy(l4, l4 + 2, 2);
        memcpy(l4 + 2, t, 2);
}

/* Only the address, the port and the checksums may change. */
static void check_changed_bytes(const uint8_t *a, const uint8_t *b, size_t size, const NetFrame *f, bool source) {
        size_t addr = f->l3_offset + (source ? 12 : 16), port = f->l4_offset + (source ? 0 : 2);

        for (size_t i = 0; i < size; i++) {
                if (a[i] == b[i])
                        continue;
                assert((i >= addr && i < addr + 4) || (i >= port && i < port + 2) ||
                       (i >= f->l3_offset + 10 && i < f->l3_offset + 12) ||
                       (i >= f->l4_offset + 16 && i < f->l4_offset + 18));
        }
}

static void check_rewrite(const uint8_t *data, size_t size, const NetFrame *f, bool to_guest) {
        uint8_t *copy;
        NetFrame g, h;
        bool applies, ip_valid, tcp_valid, exact;

        if (!f->is_ipv4 || size == 0)
                return;

        copy = malloc(size);
        assert(copy);
        memcpy(copy, data, size);

        applies = to_guest ? net_imds_rewrite_to_guest(copy, size, f, NETWORK, PROXY_PORT) :
                             net_imds_rewrite_to_gateway(copy, size, f, NETWORK, PROXY_PORT);
        assert(applies ==
               (f->ip_proto == NET_IPPROTO_TCP && f->has_ports &&
                (to_guest ? f->ip_src == NETWORK && f->sport == PROXY_PORT :
                            f->ip_dst == NET_IMDS_ADDRESS && f->dport == NET_IMDS_PORT)));
        if (!applies) {
                assert(memcmp(copy, data, size) == 0);
                free(copy);
                return;
        }

        check_changed_bytes(data, copy, size, f, to_guest);
        assert(net_frame_parse(copy, size, &g) == 0);
        assert(g.l4_offset == f->l4_offset && g.l4_length == f->l4_length && g.has_ports);
        assert(to_guest ? g.ip_src == NET_IMDS_ADDRESS && g.sport == NET_IMDS_PORT :
                          g.ip_dst == NETWORK && g.dport == PROXY_PORT);
        assert(to_guest ? g.ip_dst == f->ip_dst && g.dport == f->dport :
                          g.ip_src == f->ip_src && g.sport == f->sport);

        /* Valid checksums stay valid (RFC 1624 is exact). */
        ip_valid = ip_checksum_valid(data, f);
        tcp_valid = tcp_checksum_valid(data, f);
        assert(!ip_valid || ip_checksum_valid(copy, &g));
        assert(!tcp_valid || tcp_checksum_valid(copy, &g));

        /* The reverse mapping, applied to the mirrored frame, gives back the mirrored original;
         * bit for bit unless a checksum was the negative zero 0xffff. */
        exact = be16_at(data + f->l3_offset + 10) != 0xffff && be16_at(data + f->l4_offset + 16) != 0xffff;
        mirror(copy, &g);
        assert(net_frame_parse(copy, size, &h) == 0);
        applies = to_guest ? net_imds_rewrite_to_gateway(copy, size, &h, NETWORK, PROXY_PORT) :
                             net_imds_rewrite_to_guest(copy, size, &h, NETWORK, PROXY_PORT);
        assert(applies);
        assert(net_frame_parse(copy, size, &h) == 0);
        mirror(copy, &h);
        if (exact)
                assert(memcmp(copy, data, size) == 0);
        else {
                check_changed_bytes(data, copy, size, f, /* source= */ false);
                assert(net_frame_parse(copy, size, &h) == 0);
                assert(h.ip_dst == f->ip_dst && h.dport == f->dport && h.ip_src == f->ip_src);
        }
        assert(!ip_valid || ip_checksum_valid(copy, &h));
        assert(!tcp_valid || tcp_checksum_valid(copy, &h));

        free(copy);
}

static void check_reset(const uint8_t *data, size_t size, const NetFrame *f) {
        uint8_t out[NET_TCP_RESET_FRAME_LEN];
        NetFrame r;
        int n = net_tcp_build_reset(out, data, size, f);

        if (n < 0) {
                assert(n == -EINVAL);
                assert(!f->is_ipv4 || f->ip_proto != NET_IPPROTO_TCP || !f->has_ports ||
                       (f->tcp_flags & 0x04));
                return;
        }
        assert(n == NET_TCP_RESET_FRAME_LEN);
        assert(net_frame_parse(out, sizeof(out), &r) == 0);
        assert(r.is_ipv4 && r.has_ports && r.ip_proto == NET_IPPROTO_TCP && (r.tcp_flags & 0x04));
        assert(r.ip_src == f->ip_dst && r.ip_dst == f->ip_src && r.sport == f->dport && r.dport == f->sport);
        assert(memcmp(r.dst, f->src, NET_ETH_ALEN) == 0 && memcmp(r.src, f->dst, NET_ETH_ALEN) == 0);
        assert(ip_checksum_valid(out, &r) && tcp_checksum_valid(out, &r));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        NetFrame f;
        int r;

        if (size > NET_ETH_HLEN + 65535 + 64)
                return 0;

        r = net_frame_parse(data, size, &f);
        if (r < 0) {
                assert(r == -EBADMSG);
                return 0;
        }

        check_parse(data, size, &f);
        check_filter(&f);
        check_rewrite(data, size, &f, /* to_guest= */ false);
        check_rewrite(data, size, &f, /* to_guest= */ true);
        check_reset(data, size, &f);

        /* A frame parses the same with padding after it. */
        uint8_t *padded = malloc(size + 4);
        NetFrame p;
        assert(padded);
        memcpy(padded, data, size);
        memset(padded + size, 0, 4);
        assert(net_frame_parse(padded, size + 4, &p) == 0);
        assert(p.is_ipv4 == f.is_ipv4 && p.is_arp == f.is_arp && p.has_ports == f.has_ports);
        assert(p.l4_offset == f.l4_offset && p.l4_length == f.l4_length && p.sport == f.sport);
        free(padded);
        return 0;
}
