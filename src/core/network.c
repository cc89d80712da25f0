/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/un.h>

#include "cleanup.h"
#include "fs-util.h"
#include "hex-util.h"
#include "json-util.h"
#include "log.h"
#include "network.h"
#include "parse-util.h"
#include "socket-util.h"
#include "string-util.h"

/* <state_dir>/networks.json, written whole with write_file_atomic() after every change:
 *
 *   {
 *     "version": 1,
 *     "networks": [                           (sorted by name)
 *       {
 *         "name": "lan",
 *         "cidr": "10.0.0.0/24",              (as submitted)
 *         "dnsSearchDomain": "example.com",   (only when set)
 *         "enableIMDS": true,
 *         "enableHostAlias": false,
 *         "leases": [                         (sorted by IP)
 *           { "vmID": "0a1b2c3d", "mac": "02:xx:0a:00:00:02", "ip": "10.0.0.2" }
 *         ]
 *       }
 *     ]
 *   }
 *
 * Loading accepts no unknown key and checks everything network_create() and
 * network_lease_acquire() would: names, CIDRs, leases inside the pool, one holder per address,
 * one lease per VM, MACs derived from the address. */

#define NETWORKS_FILE "networks.json"
#define NETWORKS_FILE_VERSION 1U
#define NETWORKS_FILE_SIZE_MAX (64U * 1024U * 1024U)
#define DNS_NAME_MAX 253U
#define DNS_LABEL_MAX 63U
#define VM_ID_MAX 255U

struct NetworkRegistry {
        char *state_dir;
        char *path;         /* <state_dir>/networks.json */
        Network **networks; /* sorted by name; pointers stay put while others come and go */
        size_t n_networks;
        size_t n_allocated;
        FileWriter *writer; /* borrowed; NULL: saves are written here, at once */
};

/* Addresses are handled in host byte order inside this file. */
static uint32_t addr_host(struct in_addr a) {
        return ntohl(a.s_addr);
}

static struct in_addr addr_net(uint32_t h) {
        return (struct in_addr){ .s_addr = htonl(h) };
}

static uint32_t prefix_mask(unsigned len) {
        return len == 0 ? 0 : UINT32_MAX << (32 - len);
}

static uint32_t broadcast_of(const Network *n) {
        return addr_host(n->prefix) | ~prefix_mask(n->prefixlen);
}

/* The lease pool is .2 up to broadcast-2: .0 is the network, .1 the gateway, broadcast-1 the host
 * alias. */
static uint32_t pool_first(const Network *n) {
        return addr_host(n->prefix) + 2;
}

static uint32_t pool_last(const Network *n) {
        return broadcast_of(n) - 2;
}

static const char *format_ip(struct in_addr a, char buf[static INET_ADDRSTRLEN]) {
        return inet_ntop(AF_INET, &a, buf, INET_ADDRSTRLEN);
}

static const char *format_ip_host(uint32_t h, char buf[static INET_ADDRSTRLEN]) {
        return format_ip(addr_net(h), buf);
}

static bool ascii_is_digit(char c) {
        return c >= '0' && c <= '9';
}

static bool ascii_is_lower_alnum(char c) {
        return ascii_is_digit(c) || (c >= 'a' && c <= 'z');
}

static bool ascii_is_alnum(char c) {
        return ascii_is_lower_alnum(c) || (c >= 'A' && c <= 'Z');
}

/* Exactly four decimal octets 0-255 separated by dots, without leading zeros, spanning all of the
 * len bytes of s. */
static int parse_ipv4_strict(const char *s, size_t len, uint32_t *ret) {
        uint32_t a = 0;
        size_t i = 0;

        for (unsigned octet = 0; octet < 4; octet++) {
                unsigned v = 0, digits = 0;

                if (octet > 0) {
                        if (i >= len || s[i] != '.')
                                return -EINVAL;
                        i++;
                }
                for (; i < len && ascii_is_digit(s[i]); i++) {
                        if (digits == 3 || (digits == 1 && v == 0))
                                return -EINVAL; /* too long, or a leading zero */
                        v = v * 10 + (unsigned) (s[i] - '0');
                        digits++;
                }
                if (digits == 0 || v > 255)
                        return -EINVAL;
                a = a << 8 | v;
        }
        if (i != len)
                return -EINVAL;

        *ret = a;
        return 0;
}

int network_validate_name(const char *name, ApiError *reterr) {
        if (!name)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "field \"name\" is required");

        if (!dns_label_is_valid(name))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "name \"%s\" must be a DNS label (1-63 characters of a-z, 0-9 and '-', not starting or ending with '-')",
                        name);
        return 0;
}

static const struct {
        uint32_t prefix;
        unsigned len;
        const char *what;
} reserved_ranges[] = {
        { UINT32_C(0xa9fe0000), 16, "169.254.0.0/16, the link-local range reserved for IMDS" },
        { UINT32_C(0x7f000000), 8, "127.0.0.0/8, the loopback range" },
        { UINT32_C(0x00000000), 8, "0.0.0.0/8, the \"this network\" range" },
        { UINT32_C(0xe0000000), 4, "224.0.0.0/4, the multicast range" },
        { UINT32_C(0xf0000000), 4, "240.0.0.0/4, the reserved range" },
};

int network_parse_cidr(const char *cidr, struct in_addr *ret_prefix, unsigned *ret_prefixlen, ApiError *reterr) {
        const char *slash, *len_str;
        unsigned len = 0;
        size_t digits;
        uint32_t a;

        if (!cidr)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "field \"cidr\" is required");

        slash = strchr(cidr, '/');
        if (!slash || parse_ipv4_strict(cidr, (size_t) (slash - cidr), &a) < 0)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "cidr \"%s\": expected an IPv4 prefix a.b.c.d/length (decimal octets 0-255 without leading zeros)",
                        cidr);

        len_str = slash + 1;
        digits = strspn(len_str, "0123456789");
        if (digits == 0 || len_str[digits] != 0 || (len_str[0] == '0' && digits > 1))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "cidr \"%s\": prefix length \"%s\" is not a decimal number",
                        cidr,
                        len_str);
        for (size_t i = 0; i < digits && i < 3; i++)
                len = len * 10 + (unsigned) (len_str[i] - '0');
        if (digits > 2 || len < NETWORK_PREFIXLEN_MIN || len > NETWORK_PREFIXLEN_MAX)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "cidr \"%s\": prefix length must be /%u to /%u",
                        cidr,
                        NETWORK_PREFIXLEN_MIN,
                        NETWORK_PREFIXLEN_MAX);

        a &= prefix_mask(len);

        /* Every reserved range is wider than the shortest prefix we accept, so the network overlaps
         * one exactly when it lies inside it. */
        for (size_t i = 0; i < ELEMENTSOF(reserved_ranges); i++)
                if ((a & prefix_mask(reserved_ranges[i].len)) == reserved_ranges[i].prefix)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "cidr \"%s\": overlaps %s",
                                cidr,
                                reserved_ranges[i].what);

        if (ret_prefix)
                *ret_prefix = addr_net(a);
        if (ret_prefixlen)
                *ret_prefixlen = len;
        return 0;
}

static int dns_name_error(ApiError *reterr, const char *name, const char *format, ...) _printf_(3, 4);
static int dns_name_error(ApiError *reterr, const char *name, const char *format, ...) {
        _cleanup_free_ char *reason = NULL;
        va_list ap;

        va_start(ap, format);
        int k = vasprintf(&reason, format, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;

        return api_error_set(
                reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "\"%s\" is not a valid DNS name: %s", name, reason);
}

int dns_name_validate(const char *name, ApiError *reterr) {
        size_t n, label = 0;

        if (!name)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "DNS name is missing");

        n = strlen(name);
        if (n > 0 && name[n - 1] == '.')
                n--; /* one trailing dot: the name is fully qualified */
        if (n == 0)
                return dns_name_error(reterr, name, "it is empty");
        if (n > DNS_NAME_MAX)
                return dns_name_error(reterr, name, "it is longer than %u characters", DNS_NAME_MAX);

        for (size_t i = 0; i < n; i++) {
                char c = name[i];

                if (c == '.') {
                        if (label == 0)
                                return dns_name_error(reterr, name, "it has an empty label");
                        if (name[i - 1] == '-')
                                return dns_name_error(reterr, name, "a label ends with '-'");
                        label = 0;
                        continue;
                }
                if (!ascii_is_alnum(c) && c != '-') {
                        if (c > 0x20 && c < 0x7f)
                                return dns_name_error(reterr, name, "character '%c' is not allowed", c);
                        return dns_name_error(reterr, name, "byte 0x%02x is not allowed", (unsigned char) c);
                }
                if (c == '-' && label == 0)
                        return dns_name_error(reterr, name, "a label starts with '-'");
                if (++label > DNS_LABEL_MAX)
                        return dns_name_error(
                                reterr, name, "a label is longer than %u characters", DNS_LABEL_MAX);
        }
        if (label == 0)
                return dns_name_error(reterr, name, "it has an empty label");
        if (name[n - 1] == '-')
                return dns_name_error(reterr, name, "a label ends with '-'");
        return 0;
}

void network_mac_for(const char *network_name, struct in_addr ip, uint8_t ret_mac[6]) {
        uint32_t a = addr_host(ip);

        assert(network_name);
        assert(ret_mac);

        ret_mac[0] = 0x02; /* locally administered, unicast */
        ret_mac[1] = (uint8_t) (fnv1a_32(network_name) & 0xff);
        ret_mac[2] = (uint8_t) (a >> 24);
        ret_mac[3] = (uint8_t) (a >> 16);
        ret_mac[4] = (uint8_t) (a >> 8);
        ret_mac[5] = (uint8_t) a;
}

struct in_addr network_gateway(const Network *n) {
        assert(n);
        return addr_net(addr_host(n->prefix) + 1);
}

struct in_addr network_host_alias(const Network *n) {
        assert(n);
        return addr_net(broadcast_of(n) - 1);
}

/* VM ids come from the VM layer (8 hex digits today); accept any short printable ASCII word, so
 * that they can be written to JSON and quoted in messages as they are. */
static bool vm_id_is_valid(const char *id) {
        size_t n = strlen(id);

        if (n == 0 || n > VM_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (id[i] <= 0x20 || id[i] >= 0x7f || id[i] == '/')
                        return false;
        return true;
}

/* unix sockets limit their path to SOCKADDR_UN_PATH_MAX bytes. */
static int check_socket_path(const char *state_dir, const char *name, ApiError *reterr) {
        const size_t max = SOCKADDR_UN_PATH_MAX;
        size_t len = strlen(state_dir) + strlen("/networks/") + strlen(name) + strlen("/qemu.sock");

        if (len > max)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "name \"%s\": the socket path %s/networks/%s/qemu.sock would be %zu bytes, more than the %zu a unix socket allows (the state dir takes %zu)",
                        name,
                        state_dir,
                        name,
                        len,
                        max,
                        strlen(state_dir));
        return 0;
}

static Network *network_free(Network *n) {
        if (!n)
                return NULL;

        for (size_t i = 0; i < n->n_leases; i++)
                free(n->leases[i].vm_id);
        free(n->leases);
        free(n->name);
        free(n->cidr);
        free(n->dns_search_domain);
        free(n);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(Network *, network_free);

/* Validates a spec and builds a network without leases. An empty dns_search_domain means none. */
static int network_new(
        const char *state_dir,
        const char *name,
        const char *cidr,
        const char *dns_search_domain,
        bool enable_imds,
        bool enable_host_alias,
        unsigned mtu,
        Network **ret,
        ApiError *reterr) {

        _cleanup_(network_freep) Network *n = NULL;
        struct in_addr prefix;
        unsigned prefixlen;
        int r;

        assert(state_dir);
        assert(ret);

        r = network_validate_name(name, reterr);
        if (r < 0)
                return r;

        r = network_parse_cidr(cidr, &prefix, &prefixlen, reterr);
        if (r < 0)
                return r;

        if (dns_search_domain && *dns_search_domain == 0)
                dns_search_domain = NULL;
        if (dns_search_domain) {
                r = dns_name_validate(dns_search_domain, reterr);
                if (r < 0) {
                        (void) api_error_prefix(reterr, "dns_search_domain");
                        return r;
                }
        }

        if (mtu == 0)
                mtu = NETWORK_MTU_DEFAULT;
        if (mtu < NETWORK_MTU_MIN || mtu > NETWORK_MTU_MAX)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "mtu %u must be between %u and %u",
                        mtu,
                        NETWORK_MTU_MIN,
                        NETWORK_MTU_MAX);

        r = check_socket_path(state_dir, name, reterr);
        if (r < 0)
                return r;

        n = calloc(1, sizeof(Network));
        if (!n)
                return -ENOMEM;
        n->name = strdup(name);
        n->cidr = strdup(cidr);
        if (dns_search_domain)
                n->dns_search_domain = strdup(dns_search_domain);
        if (!n->name || !n->cidr || (dns_search_domain && !n->dns_search_domain))
                return -ENOMEM;
        n->prefix = prefix;
        n->prefixlen = prefixlen;
        n->enable_imds = enable_imds;
        n->enable_host_alias = enable_host_alias;
        n->mtu = mtu;

        *ret = TAKE_PTR(n);
        return 0;
}

NetworkRegistry *network_registry_free(NetworkRegistry *reg) {
        if (!reg)
                return NULL;

        for (size_t i = 0; i < reg->n_networks; i++)
                network_free(reg->networks[i]);
        free(reg->networks);
        free(reg->state_dir);
        free(reg->path);
        free(reg);
        return NULL;
}

size_t network_registry_size(NetworkRegistry *reg) {
        return reg ? reg->n_networks : 0;
}

/* The index of the first network whose name is not below name. */
static size_t registry_lower_bound(NetworkRegistry *reg, const char *name) {
        size_t lo = 0, hi = reg->n_networks;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (strcmp(reg->networks[mid]->name, name) < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

Network *network_registry_get(NetworkRegistry *reg, const char *name) {
        size_t i;

        assert_return(reg, NULL);
        assert_return(name, NULL);

        i = registry_lower_bound(reg, name);
        if (i < reg->n_networks && streq(reg->networks[i]->name, name))
                return reg->networks[i];
        return NULL;
}

Network *network_registry_at(NetworkRegistry *reg, size_t i) {
        assert_return(reg, NULL);

        return i < reg->n_networks ? reg->networks[i] : NULL;
}

static bool registry_owns(NetworkRegistry *reg, const Network *n) {
        return n && n->name && network_registry_get(reg, n->name) == n;
}

/* Makes room for one more network, so that inserting (or undoing a removal) cannot fail. */
static int registry_reserve(NetworkRegistry *reg) {
        Network **p;
        size_t k;

        if (reg->n_networks < reg->n_allocated)
                return 0;

        k = MAX(reg->n_allocated * 2, (size_t) 8);
        p = reallocarray(reg->networks, k, sizeof(Network *));
        if (!p)
                return -ENOMEM;
        reg->networks = p;
        reg->n_allocated = k;
        return 0;
}

static void registry_insert_at(NetworkRegistry *reg, size_t i, Network *n) {
        assert(reg->n_networks < reg->n_allocated);
        assert(i <= reg->n_networks);

        memmove(reg->networks + i + 1, reg->networks + i, (reg->n_networks - i) * sizeof(Network *));
        reg->networks[i] = n;
        reg->n_networks++;
}

static Network *registry_remove_at(NetworkRegistry *reg, size_t i) {
        Network *n;

        assert(i < reg->n_networks);

        n = reg->networks[i];
        memmove(reg->networks + i, reg->networks + i + 1, (reg->n_networks - i - 1) * sizeof(Network *));
        reg->n_networks--;
        return n;
}

/* Leases have no spare capacity: the array grows by one before an insertion, and a removal never
 * shrinks it, so undoing a removal always has room. */
static void leases_insert_at(Network *n, size_t i, NetworkLease l) {
        assert(i <= n->n_leases);

        memmove(n->leases + i + 1, n->leases + i, (n->n_leases - i) * sizeof(NetworkLease));
        n->leases[i] = l;
        n->n_leases++;
}

static NetworkLease leases_remove_at(Network *n, size_t i) {
        NetworkLease l;

        assert(i < n->n_leases);

        l = n->leases[i];
        memmove(n->leases + i, n->leases + i + 1, (n->n_leases - i - 1) * sizeof(NetworkLease));
        n->n_leases--;
        return l;
}

static json_t *leases_to_json(const Network *n) {
        json_auto_t *a = json_array();

        if (!a)
                return NULL;

        for (size_t i = 0; i < n->n_leases; i++) {
                const NetworkLease *l = n->leases + i;
                char mac[ETHER_ADDR_STRLEN], ip[INET_ADDRSTRLEN];
                json_t *o = json_object();

                if (json_array_append_new(a, o) < 0 ||
                    json_object_set_new(o, "vmID", json_string(l->vm_id)) < 0 ||
                    json_object_set_new(o, "mac", json_string(ether_addr_format(l->mac, mac))) < 0 ||
                    json_object_set_new(o, "ip", json_string(format_ip(l->ip, ip))) < 0)
                        return NULL;
        }
        return TAKE_PTR(a);
}

json_t *network_to_json(const Network *n) {
        json_auto_t *v = NULL, *spec = NULL;
        char gateway[INET_ADDRSTRLEN];

        assert_return(n, NULL);

        spec = json_object();
        if (!spec || json_object_set_new(spec, "name", json_string(n->name)) < 0 ||
            json_object_set_new(spec, "cidr", json_string(n->cidr)) < 0 ||
            (n->dns_search_domain &&
             json_object_set_new(spec, "dnsSearchDomain", json_string(n->dns_search_domain)) < 0) ||
            json_object_set_new(spec, "enableIMDS", json_boolean(n->enable_imds)) < 0 ||
            (n->enable_host_alias && json_object_set_new(spec, "enableHostAlias", json_true()) < 0) ||
            json_object_set_new(spec, "mtu", json_integer(n->mtu)) < 0)
                return NULL;

        v = json_object();
        if (!v || json_object_set_new(v, "spec", TAKE_PTR(spec)) < 0 ||
            json_object_set_new(v, "gateway", json_string(format_ip(network_gateway(n), gateway))) < 0 ||
            json_object_set_new(v, "leases", leases_to_json(n)) < 0)
                return NULL;
        return TAKE_PTR(v);
}

json_t *network_registry_to_json(NetworkRegistry *reg) {
        json_auto_t *a = NULL;

        assert_return(reg, NULL);

        a = json_array();
        if (!a)
                return NULL;
        for (size_t i = 0; i < reg->n_networks; i++)
                if (json_array_append_new(a, network_to_json(reg->networks[i])) < 0)
                        return NULL;
        return TAKE_PTR(a);
}

/* One entry of networks.json (see the top of this file). */
static json_t *network_record_to_json(const Network *n) {
        json_auto_t *o = json_object();

        if (!o || json_object_set_new(o, "name", json_string(n->name)) < 0 ||
            json_object_set_new(o, "cidr", json_string(n->cidr)) < 0 ||
            (n->dns_search_domain &&
             json_object_set_new(o, "dnsSearchDomain", json_string(n->dns_search_domain)) < 0) ||
            json_object_set_new(o, "enableIMDS", json_boolean(n->enable_imds)) < 0 ||
            json_object_set_new(o, "enableHostAlias", json_boolean(n->enable_host_alias)) < 0 ||
            json_object_set_new(o, "mtu", json_integer(n->mtu)) < 0 ||
            json_object_set_new(o, "leases", leases_to_json(n)) < 0)
                return NULL;
        return TAKE_PTR(o);
}

static void on_saved(int r, const char *path, void *userdata) {
        /* Memory keeps the change: the next save writes the whole registry again. */
        if (r < 0)
                log_error_errno(r, "Failed to save '%s', the next change tries again: %m", path);
}

static int registry_save(NetworkRegistry *reg) {
        json_auto_t *root = NULL, *list = NULL;
        _cleanup_free_ char *data = NULL;
        size_t size;
        int r;

        list = json_array();
        if (!list)
                return -ENOMEM;
        for (size_t i = 0; i < reg->n_networks; i++)
                if (json_array_append_new(list, network_record_to_json(reg->networks[i])) < 0)
                        return -ENOMEM;

        root = json_object();
        if (!root || json_object_set_new(root, "version", json_integer(NETWORKS_FILE_VERSION)) < 0 ||
            json_object_set_new(root, "networks", TAKE_PTR(list)) < 0)
                return -ENOMEM;

        data = json_dumps_pretty(root, &size);
        if (!data)
                return -ENOMEM;

        r = mkdir_p(reg->state_dir, 0750);
        if (r < 0)
                return r;

        if (!reg->writer)
                return write_file_atomic(reg->path, data, size, 0640);
        /* off the loop, after every record write asked for before; an answer waits for it */
        return file_writer_write(reg->writer, reg->path, data, size, 0640, on_saved, reg);
}

void network_registry_set_writer(NetworkRegistry *reg, FileWriter *w) {
        reg->writer = w;
}

/* Called after a failed save, once the caller has undone its change in memory. write_file_atomic()
 * leaves the old content or the new one in full, the new one only when the final fsync of the
 * directory failed: writing the (old again) state back keeps disk and memory in step. */
static int registry_save_failed(NetworkRegistry *reg, int r, ApiError *reterr) {
        int k;

        k = registry_save(reg);
        if (k < 0)
                log_debug_errno(k, "Failed to write back %s, ignoring: %m", reg->path);

        if (r == -ENOMEM)
                return r;
        return api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot save %s: %s", reg->path, strerror(-r));
}

static int registry_add(
        NetworkRegistry *reg,
        const char *name,
        const char *cidr,
        const char *dns_search_domain,
        bool enable_host_alias,
        unsigned mtu,
        Network **ret,
        ApiError *reterr) {

        _cleanup_(network_freep) Network *n = NULL;
        size_t i;
        int r;

        r = network_new(
                reg->state_dir,
                name,
                cidr,
                dns_search_domain,
                /* enable_imds= */ true,
                enable_host_alias,
                mtu,
                &n,
                reterr);
        if (r < 0)
                return r;

        i = registry_lower_bound(reg, n->name);
        if (i < reg->n_networks && streq(reg->networks[i]->name, n->name))
                return api_error_set(
                        reterr, -EEXIST, API_ERROR_CONFLICT, "network \"%s\" already exists", n->name);
        if (reg->n_networks >= NETWORKS_MAX)
                return api_error_set(
                        reterr,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "network \"%s\": at most %u networks can exist",
                        n->name,
                        NETWORKS_MAX);

        r = registry_reserve(reg);
        if (r < 0)
                return r;

        registry_insert_at(reg, i, n);
        r = registry_save(reg);
        if (r < 0) {
                (void) registry_remove_at(reg, i);
                return registry_save_failed(reg, r, reterr);
        }

        log_debug("Network '%s' (%s) created.", n->name, n->cidr);
        if (ret)
                *ret = n;
        TAKE_PTR(n);
        return 0;
}

/* A request's CIDR names a network, so its address is the network's: "10.77.0.5/24" is refused
 * naming 10.77.0.0/24, not stored as given (networks.json and --network-subnet may still hold such
 * a CIDR from before; they load as they were written). */
static int cidr_check_network(const char *cidr, ApiError *reterr) {
        struct in_addr prefix;
        unsigned len;
        uint32_t a;
        int r;

        r = network_parse_cidr(cidr, &prefix, &len, reterr);
        if (r < 0)
                return r;
        r = parse_ipv4_strict(cidr, (size_t) (strchr(cidr, '/') - cidr), &a); /* it parsed above */
        assert(r >= 0);
        if (a != addr_host(prefix)) {
                char net[INET_ADDRSTRLEN];

                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "cidr \"%s\" has host bits set: the network is %s/%u",
                        cidr,
                        inet_ntop(AF_INET, &prefix, net, sizeof(net)) ?: "?",
                        len);
        }
        return 0;
}

int network_create(NetworkRegistry *reg, const NetworkCreateArgs *args, Network **ret, ApiError *reterr) {
        int r;

        assert_return(reg, -EINVAL);
        assert_return(args, -EINVAL);
        /* the decoder held mtu to its range; a record's 0 (the default) is no request's */
        assert_return(args->mtu >= NETWORK_MTU_MIN && args->mtu <= NETWORK_MTU_MAX, -EINVAL);

        /* the checks network_new() does, in its order, and a request's own after the CIDR's */
        r = network_validate_name(args->name, reterr);
        if (r < 0)
                return r;
        r = cidr_check_network(args->cidr, reterr);
        if (r < 0)
                return r;
        return registry_add(
                reg,
                args->name,
                args->cidr,
                args->dns_search_domain,
                args->enable_host_alias,
                (unsigned) args->mtu,
                ret,
                reterr);
}

static int strcmp_ptr(const void *a, const void *b) {
        return strcmp(*(const char *const *) a, *(const char *const *) b);
}

int network_delete(
        NetworkRegistry *reg, const char *name, NetworkVmNameFunc vm_name, void *userdata, ApiError *reterr) {

        Network *n;
        size_t i;
        int r;

        assert_return(reg, -EINVAL);
        assert_return(name, -EINVAL);

        i = registry_lower_bound(reg, name);
        if (i >= reg->n_networks || !streq(reg->networks[i]->name, name))
                return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "network \"%s\"", name);
        n = reg->networks[i];

        if (n->n_leases > 0) {
                _cleanup_free_ const char **names = NULL;
                _cleanup_free_ char *joined = NULL;
                size_t len = 0;
                char *p;

                names = calloc(n->n_leases, sizeof(char *));
                if (!names)
                        return -ENOMEM;
                for (size_t j = 0; j < n->n_leases; j++) {
                        const char *s = vm_name ? vm_name(n->leases[j].vm_id, userdata) : NULL;

                        names[j] = s ?: n->leases[j].vm_id;
                        len += strlen(names[j]) + 2;
                }
                qsort(names, n->n_leases, sizeof(char *), strcmp_ptr);

                joined = malloc(len + 1);
                if (!joined)
                        return -ENOMEM;
                p = joined;
                for (size_t j = 0; j < n->n_leases; j++)
                        p = stpcpy(stpcpy(p, j > 0 ? ", " : ""), names[j]);

                return api_error_set(
                        reterr, -EBUSY, API_ERROR_CONFLICT, "network \"%s\" is used by vm %s", name, joined);
        }

        (void) registry_remove_at(reg, i);
        r = registry_save(reg);
        if (r < 0) {
                registry_insert_at(reg, i, n); /* the slot is still allocated */
                return registry_save_failed(reg, r, reterr);
        }

        log_debug("Network '%s' deleted.", name);
        network_free(n);
        return 0;
}

int network_ensure_default(NetworkRegistry *reg, const char *name, const char *cidr, ApiError *reterr) {
        struct in_addr prefix;
        unsigned prefixlen;
        Network *n;
        int r;

        assert_return(reg, -EINVAL);
        assert_return(name, -EINVAL);
        assert_return(cidr, -EINVAL);

        n = network_registry_get(reg, name);
        if (!n) {
                r = registry_add(
                        reg,
                        name,
                        cidr,
                        /* dns_search_domain= */ NULL,
                        /* enable_host_alias= */ false,
                        NETWORK_MTU_DEFAULT,
                        /* ret= */ NULL,
                        reterr);
                return r < 0 ? r : 1;
        }

        /* A configured CIDR that is not valid is a configuration error even when it is not used. */
        r = network_parse_cidr(cidr, &prefix, &prefixlen, reterr);
        if (r < 0)
                return r;
        if (prefix.s_addr != n->prefix.s_addr || prefixlen != n->prefixlen)
                log_warning(
                        "Network '%s' exists with CIDR %s, not the configured %s; keeping it.",
                        name,
                        n->cidr,
                        cidr);
        return 0;
}

const NetworkLease *network_lease_find(Network *n, const char *vm_id) {
        assert_return(n, NULL);
        assert_return(vm_id, NULL);

        for (size_t i = 0; i < n->n_leases; i++)
                if (streq(n->leases[i].vm_id, vm_id))
                        return n->leases + i;
        return NULL;
}

int network_lease_acquire(
        NetworkRegistry *reg, Network *n, const char *vm_id, const NetworkLease **ret, ApiError *reterr) {

        _cleanup_free_ char *id = NULL;
        const NetworkLease *existing;
        NetworkLease *p;
        uint32_t want;
        size_t i;
        int r;

        assert_return(reg, -EINVAL);
        assert_return(registry_owns(reg, n), -EINVAL);

        if (!vm_id || *vm_id == 0)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "vm id is empty");
        if (!vm_id_is_valid(vm_id))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "vm id \"%s\" is not valid", vm_id);

        existing = network_lease_find(n, vm_id);
        if (existing) {
                if (ret)
                        *ret = existing;
                return 0;
        }

        /* The leases are sorted, distinct and inside the pool: the lowest free address is the first
         * one that breaks the run starting at the bottom of the pool. */
        want = pool_first(n);
        for (i = 0; i < n->n_leases; i++) {
                if (addr_host(n->leases[i].ip) != want)
                        break;
                want++;
        }
        if (want > pool_last(n))
                return api_error_set(
                        reterr, -EBUSY, API_ERROR_CONFLICT, "network %s has no free address", n->name);

        id = strdup(vm_id);
        if (!id)
                return -ENOMEM;
        p = reallocarray(n->leases, n->n_leases + 1, sizeof(NetworkLease));
        if (!p)
                return -ENOMEM;
        n->leases = p;

        NetworkLease l = { .vm_id = id, .ip = addr_net(want) };
        network_mac_for(n->name, l.ip, l.mac);
        leases_insert_at(n, i, l);

        r = registry_save(reg);
        if (r < 0) {
                (void) leases_remove_at(n, i);
                return registry_save_failed(reg, r, reterr);
        }

        TAKE_PTR(id);
        if (ret)
                *ret = n->leases + i;
        return 1;
}

int network_lease_release(NetworkRegistry *reg, Network *n, const char *vm_id) {
        NetworkLease l;
        size_t i;
        int r;

        assert_return(reg, -EINVAL);
        assert_return(registry_owns(reg, n), -EINVAL);
        assert_return(vm_id, -EINVAL);

        for (i = 0; i < n->n_leases; i++)
                if (streq(n->leases[i].vm_id, vm_id))
                        break;
        if (i >= n->n_leases)
                return -ENOENT;

        l = leases_remove_at(n, i);
        r = registry_save(reg);
        if (r < 0) {
                leases_insert_at(n, i, l);
                return registry_save_failed(reg, r, /* reterr= */ NULL);
        }

        free(l.vm_id);
        return 0;
}

/* Loading */

/* The text of e after its code's sentinel ("invalid request: "), to wrap it in another code. */
static const char *error_detail(const ApiError *e, int r) {
        const char *colon;

        if (!api_error_is_set(e))
                return strerror(ABS(r));
        if (e->code != API_ERROR_INTERNAL && (colon = strstr(e->message, ": ")))
                return colon + 2;
        return e->message;
}

/* A problem with the content of networks.json: internal_error "<path>: <problem>". */
static int corrupt(NetworkRegistry *reg, ApiError *reterr, int r, const char *format, ...) _printf_(4, 5);
static int corrupt(NetworkRegistry *reg, ApiError *reterr, int r, const char *format, ...) {
        _cleanup_free_ char *problem = NULL;
        va_list ap;

        if (r == -ENOMEM)
                return r;

        va_start(ap, format);
        int k = vasprintf(&problem, format, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;

        return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "%s: %s", reg->path, problem);
}

typedef struct LeaseRecord {
        char *vm_id;
        char *mac;
        char *ip;
} LeaseRecord;

static void lease_record_done(LeaseRecord *rec) {
        free(rec->vm_id);
        free(rec->mac);
        free(rec->ip);
}

static int lease_load(NetworkRegistry *reg, Network *n, size_t index, json_t *v, ApiError *reterr) {
        static const JsonDispatch table[] = {
                { "vmID", json_dispatch_string, offsetof(LeaseRecord, vm_id), JSON_MANDATORY },
                { "mac", json_dispatch_string, offsetof(LeaseRecord, mac), JSON_MANDATORY },
                { "ip", json_dispatch_string, offsetof(LeaseRecord, ip), JSON_MANDATORY },
                {},
        };
        _cleanup_(lease_record_done) LeaseRecord rec = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        char first[INET_ADDRSTRLEN], last[INET_ADDRSTRLEN], mac[ETHER_ADDR_STRLEN];
        NetworkLease l = {};
        uint32_t ip;
        int r;

        r = json_dispatch(v, table, &rec, &e);
        if (r < 0)
                return corrupt(
                        reg, reterr, r, "network \"%s\": leases[%zu]: %s", n->name, index, error_detail(&e, r));
        if (!vm_id_is_valid(rec.vm_id))
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "network \"%s\": leases[%zu]: vm id \"%s\" is not valid",
                        n->name,
                        index,
                        rec.vm_id);
        if (parse_ipv4_strict(rec.ip, strlen(rec.ip), &ip) < 0)
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "network \"%s\": leases[%zu]: \"%s\" is not an IPv4 address",
                        n->name,
                        index,
                        rec.ip);
        if (ip < pool_first(n) || ip > pool_last(n))
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "network \"%s\": lease %s for vm %s is outside the pool %s-%s",
                        n->name,
                        rec.ip,
                        rec.vm_id,
                        format_ip_host(pool_first(n), first),
                        format_ip_host(pool_last(n), last));

        l.ip = addr_net(ip);
        network_mac_for(n->name, l.ip, l.mac);
        if (!streq(rec.mac, ether_addr_format(l.mac, mac)))
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "network \"%s\": lease %s for vm %s has MAC \"%s\", expected %s",
                        n->name,
                        rec.ip,
                        rec.vm_id,
                        rec.mac,
                        mac);

        l.vm_id = TAKE_PTR(rec.vm_id);
        n->leases[n->n_leases++] = l;
        return 0;
}

static int lease_cmp_ip(const void *a, const void *b) {
        uint32_t x = addr_host(((const NetworkLease *) a)->ip), y = addr_host(((const NetworkLease *) b)->ip);

        return x < y ? -1 : x > y;
}

static int leases_load(NetworkRegistry *reg, Network *n, json_t *leases, ApiError *reterr) {
        _cleanup_free_ const char **ids = NULL;
        char ip[INET_ADDRSTRLEN];
        size_t count, i;
        json_t *v;
        int r;

        if (!json_is_array(leases))
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "network \"%s\": field \"leases\": expected an array, got %s",
                        n->name,
                        json_type_name(leases));

        count = json_array_size(leases);
        if (count == 0)
                return 0;
        if (count > (size_t) (pool_last(n) - pool_first(n) + 1))
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "network \"%s\": %zu leases, more than its pool holds",
                        n->name,
                        count);

        n->leases = calloc(count, sizeof(NetworkLease));
        ids = calloc(count, sizeof(char *));
        if (!n->leases || !ids)
                return -ENOMEM;

        json_array_foreach(leases, i, v) {
                r = lease_load(reg, n, i, v, reterr);
                if (r < 0)
                        return r;
        }

        qsort(n->leases, n->n_leases, sizeof(NetworkLease), lease_cmp_ip);
        for (i = 1; i < n->n_leases; i++)
                if (n->leases[i].ip.s_addr == n->leases[i - 1].ip.s_addr)
                        return corrupt(
                                reg,
                                reterr,
                                -EBADMSG,
                                "network \"%s\": lease %s held by both %s and %s",
                                n->name,
                                format_ip(n->leases[i].ip, ip),
                                n->leases[i - 1].vm_id,
                                n->leases[i].vm_id);

        for (i = 0; i < n->n_leases; i++)
                ids[i] = n->leases[i].vm_id;
        qsort(ids, n->n_leases, sizeof(char *), strcmp_ptr);
        for (i = 1; i < n->n_leases; i++)
                if (streq(ids[i], ids[i - 1]))
                        return corrupt(
                                reg,
                                reterr,
                                -EBADMSG,
                                "network \"%s\": vm %s holds more than one lease",
                                n->name,
                                ids[i]);
        return 0;
}

typedef struct NetworkRecord {
        char *name;
        char *cidr;
        char *dns_search_domain;
        bool enable_imds;
        bool enable_host_alias;
        uint32_t mtu;
        json_t *leases;
} NetworkRecord;

static void network_record_done(NetworkRecord *rec) {
        free(rec->name);
        free(rec->cidr);
        free(rec->dns_search_domain);
        json_decref(rec->leases);
}

static int network_load(NetworkRegistry *reg, size_t index, json_t *v, Network **ret, ApiError *reterr) {
        static const JsonDispatch table[] = {
                { "name", json_dispatch_string, offsetof(NetworkRecord, name), JSON_MANDATORY },
                { "cidr", json_dispatch_string, offsetof(NetworkRecord, cidr), JSON_MANDATORY },
                { "dnsSearchDomain", json_dispatch_string, offsetof(NetworkRecord, dns_search_domain), 0 },
                { "enableIMDS", json_dispatch_bool, offsetof(NetworkRecord, enable_imds), JSON_MANDATORY },
                { "enableHostAlias",
                  json_dispatch_bool,
                  offsetof(NetworkRecord, enable_host_alias),
                  JSON_MANDATORY },
                { "mtu", json_dispatch_uint32, offsetof(NetworkRecord, mtu), 0 }, /* older files: 1500 */
                { "leases", json_dispatch_variant, offsetof(NetworkRecord, leases), JSON_MANDATORY },
                {},
        };
        _cleanup_(network_record_done) NetworkRecord rec = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(network_freep) Network *n = NULL;
        int r;

        r = json_dispatch(v, table, &rec, &e);
        if (r < 0)
                return corrupt(reg, reterr, r, "networks[%zu]: %s", index, error_detail(&e, r));

        r = network_new(
                reg->state_dir,
                rec.name,
                rec.cidr,
                rec.dns_search_domain,
                rec.enable_imds,
                rec.enable_host_alias,
                rec.mtu,
                &n,
                &e);
        if (r < 0)
                return corrupt(reg, reterr, r, "networks[%zu]: %s", index, error_detail(&e, r));

        r = leases_load(reg, n, rec.leases, reterr);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(n);
        return 0;
}

static int network_cmp_name(const void *a, const void *b) {
        return strcmp((*(Network *const *) a)->name, (*(Network *const *) b)->name);
}

typedef struct RegistryRecord {
        uint32_t version;
        json_t *networks;
} RegistryRecord;

static void registry_record_done(RegistryRecord *rec) {
        json_decref(rec->networks);
}

static int registry_load_json(NetworkRegistry *reg, json_t *root, ApiError *reterr) {
        static const JsonDispatch table[] = {
                { "version", json_dispatch_uint32, offsetof(RegistryRecord, version), JSON_MANDATORY },
                { "networks", json_dispatch_variant, offsetof(RegistryRecord, networks), JSON_MANDATORY },
                {},
        };
        _cleanup_(registry_record_done) RegistryRecord rec = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        size_t count, i;
        json_t *v;
        int r;

        r = json_dispatch(root, table, &rec, &e);
        if (r < 0)
                return corrupt(reg, reterr, r, "%s", error_detail(&e, r));
        if (rec.version != NETWORKS_FILE_VERSION)
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "unsupported version %u, expected %u",
                        rec.version,
                        NETWORKS_FILE_VERSION);
        if (!json_is_array(rec.networks))
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "field \"networks\": expected an array, got %s",
                        json_type_name(rec.networks));

        count = json_array_size(rec.networks);
        if (count > NETWORKS_MAX)
                return corrupt(
                        reg, reterr, -EBADMSG, "%zu networks, more than the %u allowed", count, NETWORKS_MAX);

        reg->networks = calloc(MAX(count, (size_t) 1), sizeof(Network *));
        if (!reg->networks)
                return -ENOMEM;
        reg->n_allocated = MAX(count, (size_t) 1);

        json_array_foreach(rec.networks, i, v) {
                r = network_load(reg, i, v, reg->networks + reg->n_networks, reterr);
                if (r < 0)
                        return r;
                reg->n_networks++;
        }

        qsort(reg->networks, reg->n_networks, sizeof(Network *), network_cmp_name);
        for (i = 1; i < reg->n_networks; i++)
                if (streq(reg->networks[i]->name, reg->networks[i - 1]->name))
                        return corrupt(
                                reg, reterr, -EBADMSG, "network \"%s\" appears twice", reg->networks[i]->name);
        return 0;
}

int network_registry_load(NetworkRegistry **ret, const char *state_dir, ApiError *reterr) {
        _cleanup_(network_registry_freep) NetworkRegistry *reg = NULL;
        _cleanup_free_ char *data = NULL;
        json_auto_t *root = NULL;
        json_error_t error;
        size_t size;
        int r;

        assert_return(ret, -EINVAL);
        assert_return(state_dir && *state_dir, -EINVAL);

        reg = calloc(1, sizeof(NetworkRegistry));
        if (!reg)
                return -ENOMEM;
        reg->state_dir = strdup(state_dir);
        if (!reg->state_dir)
                return -ENOMEM;
        if (asprintf(&data, "%s/%s", state_dir, NETWORKS_FILE) < 0)
                return -ENOMEM;
        reg->path = TAKE_PTR(data);
        r = write_file_atomic_cleanup(reg->path);
        if (r > 0)
                log_debug("Removed %d temporary file(s) of %s left by an interrupted write.", r, reg->path);

        r = read_full_file(reg->path, NETWORKS_FILE_SIZE_MAX, &data, &size);
        if (r == -ENOENT) {
                *ret = TAKE_PTR(reg);
                return 0;
        }
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "%s: cannot read: %s", reg->path, strerror(-r));

        root = json_loadb(data, size, JSON_REJECT_DUPLICATES, &error);
        if (!root)
                return corrupt(
                        reg,
                        reterr,
                        -EBADMSG,
                        "malformed JSON at line %d, column %d: %s",
                        error.line,
                        error.column,
                        error.text);

        r = registry_load_json(reg, root, reterr);
        if (r < 0)
                return r;

        log_debug("Loaded %zu networks from %s.", reg->n_networks, reg->path);
        *ret = TAKE_PTR(reg);
        return 0;
}
