/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "api-error.h"
#include "cleanup.h"
#include "file-writer.h"

/* The control-plane records of the virtual networks: their specs and address leases, persisted in
 * <state_dir>/networks.json. Nothing here touches packets, sockets or directories; the switch and
 * the gateway read these records. */

#define NETWORKS_MAX 256U
#define NETWORK_PREFIXLEN_MIN 16U
#define NETWORK_PREFIXLEN_MAX 29U
#define NETWORK_MTU_DEFAULT 1500U
#define NETWORK_MTU_MIN 576U
#define NETWORK_MTU_MAX 65520U

typedef struct NetworkLease {
        char *vm_id;
        uint8_t mac[6];
        struct in_addr ip;
} NetworkLease;

typedef struct Network {
        char *name;
        char *cidr;              /* as submitted */
        struct in_addr prefix;   /* masked network address */
        unsigned prefixlen;      /* 16..29 */
        char *dns_search_domain; /* NULL when none */
        bool enable_imds;        /* always true for now */
        bool enable_host_alias;  /* false by default */
        unsigned mtu;            /* NETWORK_MTU_MIN..NETWORK_MTU_MAX, NETWORK_MTU_DEFAULT when not given */
        NetworkLease *leases;    /* sorted by IP */
        size_t n_leases;
} Network;

/* Opaque: the state dir and the networks, sorted by name. */
typedef struct NetworkRegistry NetworkRegistry;

/* Reads <state_dir>/networks.json and validates every record again. A missing file is an empty
 * registry; a file that cannot be read or holds anything invalid is an internal_error naming the
 * file and the problem, never an empty registry. */
int network_registry_load(NetworkRegistry **ret, const char *state_dir, ApiError *reterr);
NetworkRegistry *network_registry_free(NetworkRegistry *reg);
/* From now on saves go through w (borrowed, outliving the registry): written and fsynced off the
 * loop, in order with the other records. A save then fails at once only when it cannot be queued
 * (the change is undone as before); a write that fails later is logged, memory keeps the change and
 * the next save writes it. Without a writer, saves are written at once and their failure undoes the
 * change. */
void network_registry_set_writer(NetworkRegistry *reg, FileWriter *w);
DEFINE_TRIVIAL_CLEANUP_FUNC(NetworkRegistry *, network_registry_free);

size_t network_registry_size(NetworkRegistry *reg);
/* Borrowed, NULL if absent. Valid until the network is deleted or the registry freed. */
Network *network_registry_get(NetworkRegistry *reg, const char *name);
/* Borrowed, in name order; NULL when i is out of range. */
Network *network_registry_at(NetworkRegistry *reg, size_t i);

/* A create_network request as its operation table decoded it (the parameters' offsets point here):
 * types checked, dns_search_domain NULL or not empty, mtu in range or its default. */
typedef struct NetworkCreateArgs {
        char *name;
        char *cidr;
        char *dns_search_domain;
        int enable_host_alias;
        int64_t mtu;
} NetworkCreateArgs;

/* Validates a decoded create_network request (the name, the CIDR and the search domain, each with
 * a message naming what is wrong), refuses a duplicate name (conflict) or a network beyond
 * NETWORKS_MAX (conflict), adds it and saves networks.json. On failure nothing changes, in memory
 * or on disk. ret (optional) is borrowed. */
int network_create(NetworkRegistry *reg, const NetworkCreateArgs *args, Network **ret, ApiError *reterr);

/* Returns the name to show for a VM id, or NULL when unknown. The string is borrowed and must stay
 * valid until network_delete() returns. */
typedef const char *(*NetworkVmNameFunc)(const char *vm_id, void *userdata);

/* Deletes a network and saves. not_found when absent; conflict, naming the VMs (sorted), while any
 * lease is held. The Network pointer is invalid afterwards. */
int network_delete(
        NetworkRegistry *reg, const char *name, NetworkVmNameFunc vm_name, void *userdata, ApiError *reterr);

/* Creates the startup network (IMDS on) when it is missing and returns 1; returns 0 when a network
 * of that name exists already, which is kept as it is (with a warning if its CIDR differs). */
int network_ensure_default(NetworkRegistry *reg, const char *name, const char *cidr, ApiError *reterr);

/* Leases the lowest free pool address (.2 up to broadcast-2) to vm_id and saves; returns 1. A VM
 * that holds a lease already gets that one back, and 0. conflict when the pool is full. ret
 * (optional) is borrowed, valid until the next change to the leases of n. */
int network_lease_acquire(
        NetworkRegistry *reg, Network *n, const char *vm_id, const NetworkLease **ret, ApiError *reterr);
/* Releases the lease of vm_id and saves: 0, -ENOENT when it holds none, or the save error (then the
 * lease is kept). */
int network_lease_release(NetworkRegistry *reg, Network *n, const char *vm_id);
/* Borrowed, NULL if vm_id holds no lease on n. */
const NetworkLease *network_lease_find(Network *n, const char *vm_id);

struct in_addr network_gateway(const Network *n);    /* prefix + 1 */
struct in_addr network_host_alias(const Network *n); /* broadcast - 1 */

/* Returns a new reference, NULL on OOM:
 * {"spec":{"name","cidr","dnsSearchDomain"?,"enableIMDS","enableHostAlias"?},"gateway",
 *  "leases":[{"vmID","mac","ip"}]}; dnsSearchDomain only when set, enableHostAlias only when true. */
json_t *network_to_json(const Network *n);
/* Returns a new reference (an array in name order), NULL on OOM. */
json_t *network_registry_to_json(NetworkRegistry *reg);

/* Validators; each failure is invalid_request naming the field (dns_name_validate() quotes the name;
 * network_create() adds the field "dns_search_domain" in front). */
int network_validate_name(const char *name, ApiError *reterr); /* ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ */
/* Strict a.b.c.d/len (no leading zeros, no whitespace), len 16..29, outside the reserved ranges
 * (0/8, 127/8, 169.254/16, 224/4, 240/4). ret_prefix is masked. */
int network_parse_cidr(const char *cidr, struct in_addr *ret_prefix, unsigned *ret_prefixlen, ApiError *reterr);
/* Labels of 1-63 [A-Za-z0-9-] not starting or ending with '-', at most 253 characters, an optional
 * single trailing dot. */
int dns_name_validate(const char *name, ApiError *reterr);

/* 02:HH:A:B:C:D, HH the low byte of FNV-1a-32(network_name), A.B.C.D the address. */
void network_mac_for(const char *network_name, struct in_addr ip, uint8_t ret_mac[6]);
