/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* One libslirp instance, the gateway of one network, run on an sd-event loop: slirp's sockets
 * become io sources and its timeouts and timers become timer sources, all in the caller's thread.
 * Frames from the guests go in with net_slirp_input(); frames slirp emits come out through the
 * output callback. The only file that sees libslirp (and GLib's types) is net-slirp.c. */

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

typedef struct NetSlirp NetSlirp;

typedef struct NetSlirpConfig {
        struct in_addr network, netmask;
        struct in_addr gateway;    /* slirp's vnameserver: answers ARP, DNS on :53 goes to the host */
        struct in_addr host_alias; /* slirp's vhost: the source of slirp's own frames and forwards */
        bool host_alias_enabled;   /* false: disable_host_loopback */
        unsigned mtu;              /* if_mtu and if_mru; 0 for 1500 */
} NetSlirpConfig;

/* Called for every frame slirp sends, from inside net_slirp_input() or from the loop. It must not
 * call back into this NetSlirp synchronously: use net_slirp_input_later() for that. */
typedef void (*NetSlirpOutput)(const uint8_t *frame, size_t len, void *userdata);

int net_slirp_new(
        sd_event *e, const NetSlirpConfig *config, NetSlirpOutput output, void *userdata, NetSlirp **ret);
NetSlirp *net_slirp_free(NetSlirp *s);

/* Hands a frame to slirp at once. */
void net_slirp_input(NetSlirp *s, const uint8_t *frame, size_t len);
/* Copies the frame and hands it to slirp from the loop, after the current callback returns. */
int net_slirp_input_later(NetSlirp *s, const uint8_t *frame, size_t len);

/* Guest → host: a guest's TCP connection to addr:port (addr inside the network, neither the gateway
 * nor the host alias) becomes a connection to the unix socket at path. -EINVAL for a path over 107
 * bytes, -EEXIST/-EINVAL as slirp refuses. */
int net_slirp_add_unix_forward(NetSlirp *s, const char *path, struct in_addr addr, uint16_t port);
int net_slirp_remove_unix_forward(NetSlirp *s, struct in_addr addr, uint16_t port);

/* Host → guest: a connection to the unix socket at path (slirp listens there) becomes a TCP
 * connection from the host alias to guest:port. */
int net_slirp_add_host_forward(NetSlirp *s, const char *path, struct in_addr guest, uint16_t port);
int net_slirp_remove_host_forward(NetSlirp *s, const char *path);

/* Host → guest over TCP: slirp listens on 127.0.0.1 at host_port, or at a free port when it is 0
 * (*ret_host_port says which), and turns each connection there into one from the host alias to
 * guest:port. A host_port already taken is -EADDRINUSE. */
int net_slirp_add_loopback_forward(
        NetSlirp *s, struct in_addr guest, uint16_t port, uint16_t host_port, uint16_t *ret_host_port);
int net_slirp_remove_loopback_forward(NetSlirp *s, uint16_t host_port);
