/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* One network's data plane: a switch whose ports are the VMs' NICs, with one libslirp instance as the
 * gateway (NAT and DNS), our own DHCP server and ARP answers, the per-port ingress filter and the IMDS
 * rewrite (DESIGN §2, reference/network-imds-attest.md §10). Everything runs on the caller's sd-event
 * loop. Different switches never exchange a frame, whatever their address ranges.
 *
 * A port is known by the socket it is attached to, never by what it claims: its MAC and lease are set
 * when it is added, and the ingress filter holds every frame to them. */

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "cleanup.h"
#include "net-packet.h"

#define NET_MTU_DEFAULT 1500U
#define NET_MTU_MIN 576U
#define NET_MTU_MAX 65520U
#define NET_LEASE_SECONDS_DEFAULT 3600U
/* A stream port's send queue: frames past it are dropped, as a full NIC ring would. */
#define NET_PORT_QUEUE_MAX (1024U * 1024U)

typedef struct NetSwitch NetSwitch;
typedef struct NetPort NetPort;

typedef struct NetSwitchConfig {
        struct in_addr network, netmask;
        struct in_addr gateway;    /* DHCP server, router and DNS */
        struct in_addr host_alias; /* broadcast - 1: the host's loopback, when enabled */
        bool host_alias_enabled;
        bool imds_enabled;
        unsigned mtu;              /* 0: NET_MTU_DEFAULT */
        const char *search_domain; /* DHCP option 119; NULL for none */
        uint32_t lease_seconds;    /* 0: NET_LEASE_SECONDS_DEFAULT */
        uint8_t gateway_mac[NET_ETH_ALEN];
} NetSwitchConfig;

typedef struct NetStats {
        /* From the guests' point of view: rx = bytes the switch read from ports (what VMs sent),
         * tx = bytes written to ports (what VMs received). Stream ports count their 4-byte length
         * prefixes too. */
        uint64_t rx_bytes, tx_bytes;
        uint64_t rx_frames, tx_frames;
        uint64_t dropped; /* refused by the ingress filter, or lost to a full send queue */
} NetStats;

typedef enum NetPortFraming {
        NET_PORT_STREAM, /* QEMU's -netdev stream: a 32-bit big-endian length, then the frame */
        NET_PORT_RAW,    /* one frame per read and write: a tap device or a datagram socket */
} NetPortFraming;

int net_switch_new(sd_event *e, const NetSwitchConfig *config, NetSwitch **ret);
NetSwitch *net_switch_free(NetSwitch *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(NetSwitch *, net_switch_free);

void net_switch_get_stats(NetSwitch *s, NetStats *ret);

/* Adds a port for a lease. id (a VM id) names it; -EEXIST when the id, the MAC or the address is
 * taken already, -EINVAL for an address outside the network. The port is unconnected: frames for it
 * are dropped (the gateway's TCP answered with a reset) until net_port_dial() or
 * net_port_attach_fd(). */
int net_switch_add_port(
        NetSwitch *s, const char *id, const uint8_t mac[NET_ETH_ALEN], struct in_addr ip, NetPort **ret);
NetPort *net_switch_find_port(NetSwitch *s, const char *id);
/* Disconnects and removes a port, and its IMDS and host forwards. NULL is fine. */
void net_port_remove(NetPort *p);

/* Connects to QEMU's listening stream socket (non-blocking, the 4-byte framing). A connection
 * already up is replaced. */
int net_port_dial(NetPort *p, const char *path);
/* Takes fd (connected, non-blocking or not) as the port's link. */
int net_port_attach_fd(NetPort *p, int fd, NetPortFraming framing);
void net_port_disconnect(NetPort *p);
bool net_port_is_connected(NetPort *p);
void net_port_get_stats(NetPort *p, NetStats *ret);

/* The port's IMDS: its guest's TCP connections to 169.254.169.254:80 are rewritten to
 * <network address>:<index> (index = the guest's host number, unique in the network) and handed by the
 * gateway to the unix socket at path, where the metadata server listens for this VM alone. -EOPNOTSUPP
 * on a switch without IMDS. */
int net_port_set_imds(NetPort *p, const char *path);

/* Host → guest: the gateway listens on the unix socket at path; each connection there becomes a TCP
 * connection from the host alias to the guest's port. Removed with the port. */
int net_port_add_host_forward(NetPort *p, const char *path, uint16_t guest_port);

/* Host → guest over TCP: a listener on 127.0.0.1:<*ret_host_port> whose connections reach the guest's
 * port; at host_port, or at a free port when it is 0 (-EADDRINUSE when host_port is taken). It
 * listens while the port has no link too: the gateway's TCP towards a port without a link is reset,
 * so a connection made then ends at once. Removed with the port. */
int net_port_add_loopback_forward(NetPort *p, uint16_t guest_port, uint16_t host_port, uint16_t *ret_host_port);
