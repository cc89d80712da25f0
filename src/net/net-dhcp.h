/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The network's DHCP server, as a pure function: a BOOTP/DHCP request (the UDP payload a guest sent
 * to port 67) in, the reply payload out. Leases are static, looked up by MAC: a MAC without a lease
 * gets no answer at all. No I/O and no state: the switch wraps the reply into UDP/IPv4/Ethernet. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "net-packet.h"

#define NET_DHCP_REPLY_MAX 576 /* every reply fits in the minimum datagram a client must accept */

typedef struct NetDhcpConfig {
        uint32_t server;           /* the gateway: server identifier (54), router (3) and DNS server (6) */
        uint32_t netmask;          /* option 1 */
        uint16_t mtu;              /* option 26 */
        uint32_t lease_seconds;    /* option 51; renewal (58) at 1/2, rebinding (59) at 7/8 */
        const char *search_domain; /* option 119 (RFC 3397 encoding, uncompressed), NULL or "" for none */
} NetDhcpConfig;

/* Returns 0 and the lease (be32) of mac, or -ENOENT when the MAC has none. */
typedef int (*NetDhcpLookup)(const uint8_t mac[NET_ETH_ALEN], uint32_t *ret_ip, void *userdata);

typedef enum NetDhcpMessage {
        NET_DHCP_NONE = 0,
        NET_DHCP_DISCOVER = 1,
        NET_DHCP_OFFER = 2,
        NET_DHCP_REQUEST = 3,
        NET_DHCP_DECLINE = 4,
        NET_DHCP_ACK = 5,
        NET_DHCP_NAK = 6,
        NET_DHCP_RELEASE = 7,
        NET_DHCP_INFORM = 8,
} NetDhcpMessage;

typedef struct NetDhcpReply {
        NetDhcpMessage type;          /* OFFER, ACK or NAK */
        uint32_t yiaddr;              /* the address given, be32 (0 for a NAK) */
        uint8_t chaddr[NET_ETH_ALEN]; /* the client, for the Ethernet destination */
        uint32_t ciaddr;              /* the client's own address when it renews (unicast), else 0 */
        bool broadcast;               /* answer to 255.255.255.255 and ff:ff:ff:ff:ff:ff */
} NetDhcpReply;

/* DISCOVER → OFFER and REQUEST → ACK with the lease; a REQUEST for another address than the lease
 * (option 50 or ciaddr) → NAK; INFORM → ACK without yiaddr. DECLINE, RELEASE and anything else get
 * no reply. Returns the reply's length (> 0) with info filled, 0 for "no reply" (unknown MAC, not a
 * BOOTREQUEST, hardware type not Ethernet, a message type we do not answer), or -EBADMSG for bytes
 * that are not a well-formed DHCP message (short, no magic cookie, an option running past the end,
 * no message type). -ENOBUFS when reply_size < NET_DHCP_REPLY_MAX. */
ssize_t net_dhcp_handle(
        const NetDhcpConfig *config,
        NetDhcpLookup lookup,
        void *userdata,
        const uint8_t *request,
        size_t len,
        uint8_t *reply,
        size_t reply_size,
        NetDhcpReply *info);
