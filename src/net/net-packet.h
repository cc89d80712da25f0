/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Ethernet frames as the switch sees them: a bounds-checked parse into a view, the per-port ingress
 * filter, the stateless IMDS address rewrite, and builders for the frames the switch answers with
 * itself (ARP replies and requests, UDP datagrams for DHCP). Pure functions, no I/O: every byte
 * they read comes from a guest and is untrusted.
 *
 * IPv4 addresses are uint32_t in network byte order ("be32") throughout, as in struct in_addr. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NET_ETH_ALEN 6
#define NET_ETH_HLEN 14
#define NET_ETHERTYPE_IPV4 0x0800
#define NET_ETHERTYPE_ARP 0x0806
#define NET_ETHERTYPE_IPV6 0x86dd
#define NET_ARP_FRAME_LEN 42 /* Ethernet + ARP for IPv4 over Ethernet, without padding */
#define NET_IPPROTO_ICMP 1
#define NET_IPPROTO_TCP 6
#define NET_IPPROTO_UDP 17

/* 169.254.169.254, in network byte order. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#        define NET_IMDS_ADDRESS __builtin_bswap32(0xa9fea9feU)
#else
#        define NET_IMDS_ADDRESS 0xa9fea9feU
#endif
#define NET_IMDS_PORT 80

typedef struct NetFrame {
        /* Ethernet */
        const uint8_t *dst, *src; /* NET_ETH_ALEN bytes each, inside the frame */
        uint16_t ethertype;       /* host byte order; a VLAN tag is not looked through */

        /* ARP (ethertype ARP, hardware Ethernet, protocol IPv4, lengths 6 and 4), else all zero */
        bool is_arp;
        uint16_t arp_op; /* 1 request, 2 reply */
        const uint8_t *arp_sha, *arp_tha;
        uint32_t arp_spa, arp_tpa;

        /* IPv4, else all zero */
        bool is_ipv4;
        uint32_t ip_src, ip_dst;
        uint8_t ip_proto;
        bool ip_fragment; /* MF set or a non-zero offset: L4 fields are unset on every fragment */
        size_t l3_offset; /* offset of the IPv4 header in the frame */
        size_t l4_offset; /* offset of the L4 header */
        size_t l4_length; /* from the IPv4 total length, not the frame size (padding ignored) */

        /* UDP or TCP on an unfragmented datagram whose L4 header fits, else zero; host byte order */
        bool has_ports;
        uint16_t sport, dport;
        uint8_t tcp_flags;
} NetFrame;

/* Parses a frame (no FCS). Returns 0, or -EBADMSG for a frame too short for its Ethernet header or
 * for an ARP/IPv4 header that lies (lengths beyond the frame, IHL < 5, version != 4). Unknown
 * ethertypes (IPv6 included) parse fine with is_arp and is_ipv4 false. */
int net_frame_parse(const uint8_t *frame, size_t len, NetFrame *ret);

/* The facts the ingress filter needs, per network and per port. */
typedef struct NetNetworkPolicy {
        uint32_t network; /* network address, the IMDS proxy address guests must never reach */
        uint32_t netmask;
        uint32_t gateway;
        uint32_t host_alias; /* broadcast - 1 */
        bool host_alias_enabled;
        bool imds_enabled;
} NetNetworkPolicy;

typedef struct NetPortPolicy {
        uint8_t mac[NET_ETH_ALEN];
        uint32_t ip; /* the lease */
} NetPortPolicy;

typedef enum NetVerdict {
        NET_PASS,
        NET_DROP_MALFORMED,
        NET_DROP_SPOOFED_MAC, /* Ethernet source (or ARP sender hardware address) not the port's */
        NET_DROP_SPOOFED_IP,  /* IPv4/ARP source not the lease (0.0.0.0 only for DHCP to port 67) */
        NET_DROP_IPV6,
        NET_DROP_ETHERTYPE,      /* neither IPv4 nor ARP */
        NET_DROP_FORBIDDEN_DEST, /* 127/8, 0/8, 224/4, 240/4 (but the limited broadcast for DHCP),
                                  * the network address, 169.254/16 but the IMDS */
        NET_DROP_IMDS_DISABLED,  /* 169.254.169.254 on a network without IMDS */
        NET_DROP_HOST_ALIAS,     /* the host alias while it is not enabled */
        _NET_VERDICT_MAX,
} NetVerdict;

const char *net_verdict_to_string(NetVerdict v);

/* Decides whether a frame a guest sent on its port may enter the network. ARP is checked on its
 * sender fields (a probe with sender IP 0.0.0.0 passes). */
NetVerdict net_filter_ingress(const NetNetworkPolicy *net, const NetPortPolicy *port, const NetFrame *f);

/* The IMDS rewrite, stateless, ports kept on the guest's side. Guest → gateway: TCP to
 * 169.254.169.254:80 becomes TCP to network:port. Gateway → guest: TCP from network:port becomes
 * TCP from 169.254.169.254:80. IPv4 and TCP checksums are updated in place. Each returns true when
 * it rewrote the frame, false when the frame is not one it applies to (f must describe frame). */
bool net_imds_rewrite_to_gateway(uint8_t *frame, size_t len, const NetFrame *f, uint32_t network, uint16_t port);
bool net_imds_rewrite_to_guest(uint8_t *frame, size_t len, const NetFrame *f, uint32_t network, uint16_t port);

/* Builds an ARP frame (NET_ARP_FRAME_LEN bytes) into out. A reply goes from sha/spa to tha/tpa;
 * a request is broadcast, asking who has tpa. */
void net_arp_build_reply(
        uint8_t out[NET_ARP_FRAME_LEN],
        const uint8_t sha[NET_ETH_ALEN],
        uint32_t spa,
        const uint8_t tha[NET_ETH_ALEN],
        uint32_t tpa);
void net_arp_build_request(
        uint8_t out[NET_ARP_FRAME_LEN], const uint8_t sha[NET_ETH_ALEN], uint32_t spa, uint32_t tpa);

/* Builds Ethernet + IPv4 (TTL 64, DF clear, no options) + UDP around payload, both checksums set.
 * Returns the frame length, or -ENOBUFS when out is too small. */
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
        size_t payload_len);

/* Builds the reset a host answers a TCP segment with when it belongs to no connection there (RFC 9293
 * 3.10.7.1): from the segment's destination back to its source; with the sequence number the segment
 * acknowledged, or, when it acknowledged nothing (a SYN), sequence 0 and an ACK of what it occupied.
 * Returns NET_TCP_RESET_FRAME_LEN, or -EINVAL when f (describing seg) is not TCP on an unfragmented
 * IPv4 datagram, or is itself a reset. */
#define NET_TCP_RESET_FRAME_LEN (NET_ETH_HLEN + 20 + 20)
int net_tcp_build_reset(
        uint8_t out[static NET_TCP_RESET_FRAME_LEN], const uint8_t *seg, size_t len, const NetFrame *f);

/* The Internet checksum (RFC 1071) of data, folded, not inverted, starting from sum. */
uint32_t net_checksum_add(uint32_t sum, const void *data, size_t len);
uint16_t net_checksum_fold(uint32_t sum);
