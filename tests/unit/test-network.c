/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "network.h"
#include "operation.h"

#define _cleanup_json_ _cleanup_(json_decrefp)
#define _cleanup_api_error_ _cleanup_(api_error_done)

typedef struct Fixture {
        char *dir;  /* the state dir */
        char *file; /* <dir>/networks.json */
} Fixture;

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static int setup(void **state) {
        char t[] = "/tmp/test-network.XXXXXX";
        Fixture *f;

        if (!mkdtemp(t))
                return -1;
        f = calloc(1, sizeof(Fixture));
        if (!f)
                return -1;
        f->dir = strdup(t);
        if (!f->dir || asprintf(&f->file, "%s/networks.json", t) < 0)
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        (void) nftw(f->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(f->dir);
        free(f->file);
        free(f);
        return 0;
}

/* The whole file, or NULL when it does not exist. */
static char *slurp(const char *path) {
        char *s = NULL;
        int r = read_full_file(path, 64 * 1024 * 1024, &s, NULL);

        if (r == -ENOENT)
                return NULL;
        assert_ok(r);
        return s;
}

static void put(const char *path, const char *content) {
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

        assert_true(fd >= 0);
        assert_ok(loop_write(fd, content, strlen(content)));
}

static void assert_same_file(const char *before, const char *path) {
        _cleanup_free_ char *after = slurp(path);

        if (!before) {
                assert_null(after);
                return;
        }
        assert_non_null(after);
        assert_string_equal(after, before);
}

/* A create_network request as the API takes it: decoded by the operation table (types, the empty
 * search domain, the MTU's range), then created. */
static int create_request(NetworkRegistry *reg, json_t *req, Network **ret, ApiError *e) {
        const Operation *op = operation_find("create_network");
        NetworkCreateArgs a;
        int r;

        assert_non_null(op);
        r = operation_decode(op, req, &a, e);
        if (r < 0)
                return r;
        r = network_create(reg, &a, ret, e);
        operation_args_done(op, &a);
        return r;
}

static NetworkRegistry *load(const Fixture *f) {
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        NetworkRegistry *reg = NULL;
        int r = network_registry_load(&reg, f->dir, &e);

        if (r < 0)
                fail_msg("loading %s failed: %s", f->dir, e.message ?: test_errno_name(r));
        assert_non_null(reg);
        return reg;
}

/* Creates a network from request text; fails the test on error. */
static Network *create(NetworkRegistry *reg, const char *text) {
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_json_ json_t *req = json_loads(text, 0, NULL);
        Network *n = NULL;
        int r;

        assert_non_null(req);
        r = create_request(reg, req, &n, &e);
        if (r < 0)
                fail_msg("creating %s failed: %s", text, e.message ?: test_errno_name(r));
        assert_non_null(n);
        return n;
}

static const NetworkLease *acquire(NetworkRegistry *reg, Network *n, const char *vm_id) {
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        const NetworkLease *l = NULL;
        int r = network_lease_acquire(reg, n, vm_id, &l, &e);

        if (r < 0)
                fail_msg("leasing on %s for %s failed: %s", n->name, vm_id, e.message ?: test_errno_name(r));
        assert_non_null(l);
        return l;
}

static const char *ip_str(struct in_addr a, char buf[static INET_ADDRSTRLEN]) {
        assert_non_null(inet_ntop(AF_INET, &a, buf, INET_ADDRSTRLEN));
        return buf;
}

static void assert_ip(struct in_addr a, const char *expected) {
        char buf[INET_ADDRSTRLEN];

        assert_string_equal(ip_str(a, buf), expected);
}

static char *dump(json_t *v) {
        char *s;

        assert_non_null(v);
        s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
        assert_non_null(s);
        return s;
}

static char *network_dump(const Network *n) {
        _cleanup_json_ json_t *v = network_to_json(n);

        return dump(v);
}

static char *registry_dump(NetworkRegistry *reg) {
        _cleanup_json_ json_t *v = network_registry_to_json(reg);

        return dump(v);
}

/* FNV-1a-32, written out here again so that the MAC derivation is checked, not copied. */
static uint8_t fnv1a_low_byte(const char *s) {
        uint32_t h = 0x811c9dc5;

        for (; *s; s++) {
                h ^= (uint8_t) *s;
                h *= 0x01000193;
        }
        return (uint8_t) h;
}

/* The MAC a lease of ip on network name must carry, as text. */
static char *mac_text(const char *name, const char *ip) {
        unsigned a, b, c, d;
        char *s;

        assert_int_equal(sscanf(ip, "%u.%u.%u.%u", &a, &b, &c, &d), 4);
        assert_true(asprintf(&s, "02:%02x:%02x:%02x:%02x:%02x", fnv1a_low_byte(name), a, b, c, d) > 0);
        return s;
}

static void test_create_get_list(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f), *again = NULL;
        _cleanup_free_ char *list = NULL, *list_again = NULL;
        struct stat st;
        Network *n;

        assert_int_equal(network_registry_size(reg), 0);
        assert_null(network_registry_at(reg, 0));
        assert_null(slurp(f->file)); /* nothing is written before the first change */

        create(reg, "{\"name\":\"zeta\",\"cidr\":\"10.3.0.0/24\"}");
        create(reg, "{\"name\":\"alpha\",\"cidr\":\"10.1.0.0/24\",\"dns_search_domain\":\"corp.example\"}");
        n = create(reg, "{\"name\":\"mid\",\"cidr\":\"192.168.5.0/29\",\"dns_search_domain\":null}");

        /* The CIDR is kept as submitted (a request's has no host bits: test_create_invalid; a record's
         * may, and its prefix is masked: test_load_host_bits). */
        assert_string_equal(n->name, "mid");
        assert_string_equal(n->cidr, "192.168.5.0/29");
        assert_ip(n->prefix, "192.168.5.0");
        assert_int_equal(n->prefixlen, 29);
        assert_null(n->dns_search_domain);
        assert_true(n->enable_imds);
        assert_false(n->enable_host_alias);
        assert_int_equal(n->n_leases, 0);
        assert_ip(network_gateway(n), "192.168.5.1");
        assert_ip(network_host_alias(n), "192.168.5.6");

        assert_int_equal(network_registry_size(reg), 3);
        assert_string_equal(network_registry_at(reg, 0)->name, "alpha");
        assert_string_equal(network_registry_at(reg, 1)->name, "mid");
        assert_string_equal(network_registry_at(reg, 2)->name, "zeta");
        assert_null(network_registry_at(reg, 3));
        assert_ptr_equal(network_registry_get(reg, "mid"), n);
        assert_string_equal(network_registry_get(reg, "alpha")->dns_search_domain, "corp.example");
        assert_null(network_registry_get(reg, "nope"));
        assert_null(network_registry_get(reg, "mi"));

        list = registry_dump(reg);
        assert_string_equal(
                list,
                "[{\"spec\":{\"name\":\"alpha\",\"cidr\":\"10.1.0.0/24\",\"dnsSearchDomain\":\"corp.example\",\"enableIMDS\":true,\"mtu\":1500},\"gateway\":\"10.1.0.1\",\"leases\":[]},"
                "{\"spec\":{\"name\":\"mid\",\"cidr\":\"192.168.5.0/29\",\"enableIMDS\":true,\"mtu\":1500},\"gateway\":\"192.168.5.1\",\"leases\":[]},"
                "{\"spec\":{\"name\":\"zeta\",\"cidr\":\"10.3.0.0/24\",\"enableIMDS\":true,\"mtu\":1500},\"gateway\":\"10.3.0.1\",\"leases\":[]}]");

        /* Persisted, readable by the group only. */
        assert_ok(RET_NERRNO(stat(f->file, &st)));
        assert_int_equal(st.st_mode & 07777, 0640);
        again = load(f);
        list_again = registry_dump(again);
        assert_string_equal(list_again, list);
}

static void test_create_accepts_edges(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
        Network *n;

        n = create(reg, "{\"name\":\"a\",\"cidr\":\"172.20.0.0/16\"}");
        assert_int_equal(n->prefixlen, 16);
        assert_ip(network_gateway(n), "172.20.0.1");
        assert_ip(network_host_alias(n), "172.20.255.254");

        n = create(reg, "{\"name\":\"0\",\"cidr\":\"10.9.9.0/29\",\"dns_search_domain\":null}");
        assert_null(n->dns_search_domain); /* null means none */
        assert_ip(network_host_alias(n), "10.9.9.6");

        n = create(
                reg,
                "{\"name\":\"abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefgh\","
                "\"cidr\":\"223.255.255.0/24\",\"dns_search_domain\":\"Example.COM.\"}");
        assert_int_equal(strlen(n->name), 63);
        assert_string_equal(n->dns_search_domain, "Example.COM.");

        /* Overlapping CIDRs are separate segments. */
        create(reg, "{\"name\":\"b\",\"cidr\":\"172.20.0.0/16\"}");
        create(reg, "{\"name\":\"c\",\"cidr\":\"169.253.0.0/16\"}");
        create(reg, "{\"name\":\"d\",\"cidr\":\"169.255.0.0/16\"}");
        create(reg, "{\"name\":\"e\",\"cidr\":\"1.0.0.0/16\"}");
        create(reg, "{\"name\":\"f\",\"cidr\":\"126.255.0.0/16\"}");
        assert_int_equal(network_registry_size(reg), 8);

        /* The host alias, off unless asked for. */
        n = create(reg, "{\"name\":\"g\",\"cidr\":\"10.8.0.0/24\",\"enable_host_alias\":true}");
        assert_true(n->enable_host_alias);
        n = create(reg, "{\"name\":\"h\",\"cidr\":\"10.8.1.0/24\",\"enable_host_alias\":false}");
        assert_false(n->enable_host_alias);
}

typedef struct InvalidCase {
        const char *request;
        const char *field;  /* must occur in the message */
        const char *detail; /* must occur too, when set */
} InvalidCase;

static const InvalidCase invalid_cases[] = {
        /* decoding */
        { "{}", "\"name\"", "required" },
        { "{\"cidr\":\"10.0.0.0/24\"}", "\"name\"", "required" },
        { "{\"name\":\"x\"}", "\"cidr\"", "required" },
        { "{\"name\":1,\"cidr\":\"10.0.0.0/24\"}", "\"name\"", "expected a string" },
        { "{\"name\":null,\"cidr\":\"10.0.0.0/24\"}", "\"name\"", "expected a string" },
        { "{\"name\":\"x\",\"cidr\":24}", "\"cidr\"", "expected a string" },
        { "{\"name\":\"x\",\"cidr\":[\"10.0.0.0/24\"]}", "\"cidr\"", "expected a string" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":5}",
          "\"dns_search_domain\"",
          "expected a string" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"enable_host_alias\":\"yes\"}",
          "\"enable_host_alias\"",
          "expected a boolean" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"enableHostAlias\":true}",
          "\"enableHostAlias\"",
          "unknown field" },
        /* name */
        { "{\"name\":\"\",\"cidr\":\"10.0.0.0/24\"}", "name \"\"", "DNS label" },
        { "{\"name\":\"Lan\",\"cidr\":\"10.0.0.0/24\"}", "name \"Lan\"", "DNS label" },
        { "{\"name\":\"-lan\",\"cidr\":\"10.0.0.0/24\"}", "name \"-lan\"", "DNS label" },
        { "{\"name\":\"lan-\",\"cidr\":\"10.0.0.0/24\"}", "name \"lan-\"", "DNS label" },
        { "{\"name\":\"a/b\",\"cidr\":\"10.0.0.0/24\"}", "name \"a/b\"", "DNS label" },
        { "{\"name\":\"..\",\"cidr\":\"10.0.0.0/24\"}", "name \"..\"", "DNS label" },
        { "{\"name\":\"a..b\",\"cidr\":\"10.0.0.0/24\"}", "name \"a..b\"", "DNS label" },
        { "{\"name\":\"a b\",\"cidr\":\"10.0.0.0/24\"}", "name \"a b\"", "DNS label" },
        { "{\"name\":\"l\\u00e4n\",\"cidr\":\"10.0.0.0/24\"}", "name \"", "DNS label" },
        { "{\"name\":\"abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi\",\"cidr\":\"10.0.0.0/24\"}",
          "name \"",
          "DNS label" },
        /* cidr syntax */
        { "{\"name\":\"x\",\"cidr\":\"\"}", "cidr \"\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0\"}", "cidr \"10.0.0.0\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"010.0.0.0/24\"}", "cidr \"010.0.0.0/24\"", "leading zeros" },
        { "{\"name\":\"x\",\"cidr\":\"10.00.0.0/24\"}", "cidr \"10.00.0.0/24\"", "leading zeros" },
        { "{\"name\":\"x\",\"cidr\":\" 10.0.0.0/24\"}", "cidr \" 10.0.0.0/24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0 /24\"}", "cidr \"10.0.0.0 /24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24 \"}", "cidr \"10.0.0.0/24 \"", "not a decimal number" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/ 24\"}", "cidr \"10.0.0.0/ 24\"", "not a decimal number" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/\"}", "cidr \"10.0.0.0/\"", "not a decimal number" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/024\"}", "cidr \"10.0.0.0/024\"", "not a decimal number" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/+24\"}", "cidr \"10.0.0.0/+24\"", "not a decimal number" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/2x\"}", "cidr \"10.0.0.0/2x\"", "not a decimal number" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0/24\"}", "cidr \"10.0.0/24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0.0/24\"}", "cidr \"10.0.0.0.0/24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"10..0.0/24\"}", "cidr \"10..0.0/24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"256.0.0.0/24\"}", "cidr \"256.0.0.0/24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"1000.0.0.0/24\"}", "cidr \"1000.0.0.0/24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"0x0a.0.0.0/24\"}", "cidr \"0x0a.0.0.0/24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"-1.0.0.0/24\"}", "cidr \"-1.0.0.0/24\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"fd00::/64\"}", "cidr \"fd00::/64\"", NULL },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24/24\"}", "cidr \"10.0.0.0/24/24\"", "not a decimal number" },
        /* prefix length */
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/8\"}", "cidr \"10.0.0.0/8\"", "prefix length must be /16 to /29" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/15\"}",
          "cidr \"10.0.0.0/15\"",
          "prefix length must be /16 to /29" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/30\"}",
          "cidr \"10.0.0.0/30\"",
          "prefix length must be /16 to /29" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/0\"}", "cidr \"10.0.0.0/0\"", "prefix length must be /16 to /29" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/33\"}",
          "cidr \"10.0.0.0/33\"",
          "prefix length must be /16 to /29" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/100\"}",
          "cidr \"10.0.0.0/100\"",
          "prefix length must be /16 to /29" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/99999999999999999999\"}",
          "cidr \"",
          "prefix length must be /16 to /29" },
        /* reserved ranges, each named */
        { "{\"name\":\"x\",\"cidr\":\"169.254.0.0/16\"}",
          "cidr \"169.254.0.0/16\"",
          "169.254.0.0/16, the link-local range reserved for IMDS" },
        { "{\"name\":\"x\",\"cidr\":\"169.254.169.0/29\"}", "cidr \"169.254.169.0/29\"", "link-local" },
        { "{\"name\":\"x\",\"cidr\":\"127.1.0.0/16\"}",
          "cidr \"127.1.0.0/16\"",
          "127.0.0.0/8, the loopback range" },
        { "{\"name\":\"x\",\"cidr\":\"0.0.0.0/16\"}", "cidr \"0.0.0.0/16\"", "0.0.0.0/8" },
        { "{\"name\":\"x\",\"cidr\":\"0.255.255.0/24\"}", "cidr \"0.255.255.0/24\"", "0.0.0.0/8" },
        { "{\"name\":\"x\",\"cidr\":\"224.0.0.0/24\"}",
          "cidr \"224.0.0.0/24\"",
          "224.0.0.0/4, the multicast range" },
        { "{\"name\":\"x\",\"cidr\":\"239.255.255.0/24\"}", "cidr \"239.255.255.0/24\"", "multicast" },
        { "{\"name\":\"x\",\"cidr\":\"240.0.0.0/16\"}",
          "cidr \"240.0.0.0/16\"",
          "240.0.0.0/4, the reserved range" },
        { "{\"name\":\"x\",\"cidr\":\"255.255.255.248/29\"}", "cidr \"255.255.255.248/29\"", "reserved range" },
        /* dns_search_domain */
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"a..b\"}",
          "dns_search_domain",
          "empty label" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\".\"}", "dns_search_domain", "empty" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"..\"}",
          "dns_search_domain",
          "empty label" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\".example.com\"}",
          "dns_search_domain",
          "empty label" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"-a.example\"}",
          "dns_search_domain",
          "starts with '-'" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"a-.example\"}",
          "dns_search_domain",
          "ends with '-'" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"example-\"}",
          "dns_search_domain",
          "ends with '-'" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"a_b.example\"}",
          "dns_search_domain",
          "'_'" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"a/b\"}", "dns_search_domain", "'/'" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"a b\"}",
          "dns_search_domain",
          "0x20" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"b\\u00fccher.example\"}",
          "dns_search_domain",
          "0xc3" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi.example\"}",
          "dns_search_domain",
          "longer than 63" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"\"}",
          "dns_search_domain must not be empty",
          "leave it out" },
        /* a CIDR names a network: host bits are refused, naming the network */
        { "{\"name\":\"x\",\"cidr\":\"10.77.0.5/24\"}",
          "cidr \"10.77.0.5/24\" has host bits set",
          "the network is 10.77.0.0/24" },
        { "{\"name\":\"x\",\"cidr\":\"172.20.0.1/16\"}",
          "cidr \"172.20.0.1/16\"",
          "the network is 172.20.0.0/16" },
        { "{\"name\":\"x\",\"cidr\":\"10.9.9.7/29\"}", "cidr \"10.9.9.7/29\"", "the network is 10.9.9.0/29" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"mtu\":575}", "mtu 575", "between 576 and 65520" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"mtu\":65521}", "mtu 65521", "between 576 and 65520" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"mtu\":0}", "mtu 0", "between 576 and 65520" },
        { "{\"name\":\"x\",\"cidr\":\"10.0.0.0/24\",\"mtu\":\"9000\"}", "mtu", NULL },
};

/* Runs one refused create_network request and checks what a user sees: invalid_request naming the
 * field, no new network, networks.json untouched. */
static void check_refused(
        const Fixture *f, NetworkRegistry *reg, json_t *req, const char *field, const char *detail) {
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *before = slurp(f->file);
        size_t size = network_registry_size(reg);
        Network *n = NULL;
        int r;

        r = create_request(reg, req, &n, &e);
        if (r >= 0) {
                _cleanup_free_ char *shown = json_dumps(req, JSON_COMPACT);
                fail_msg("%s was accepted", shown ?: "(request)");
        }
        assert_errno(r, -EINVAL);
        assert_errno(e.error, -EINVAL);
        assert_int_equal(e.code, API_ERROR_INVALID_REQUEST);
        assert_startswith(e.message, "invalid request: ");
        assert_contains(e.message, field);
        if (detail)
                assert_contains(e.message, detail);
        assert_null(n);
        assert_int_equal(network_registry_size(reg), size);
        assert_null(network_registry_get(reg, "x"));
        assert_same_file(before, f->file);
}

static void check_all_refused(const Fixture *f, NetworkRegistry *reg) {
        for (size_t i = 0; i < ELEMENTSOF(invalid_cases); i++) {
                _cleanup_json_ json_t *req = json_loads(invalid_cases[i].request, 0, NULL);

                if (!req)
                        fail_msg("bad test case %s", invalid_cases[i].request);
                check_refused(f, reg, req, invalid_cases[i].field, invalid_cases[i].detail);
        }

        /* Strings jansson would never parse from a request, built directly. */
        _cleanup_json_ json_t *nul_name = json_pack(
                "{s:s%,s:s}", "name", "a\0b", (size_t) 3, "cidr", "10.0.0.0/24");
        _cleanup_json_ json_t *nul_cidr = json_pack(
                "{s:s,s:s%}", "name", "x", "cidr", "10.0.0.0/24\0", (size_t) 12);
        _cleanup_json_ json_t *nul_dns = json_pack(
                "{s:s,s:s,s:s%}",
                "name",
                "x",
                "cidr",
                "10.0.0.0/24",
                "dns_search_domain",
                "a\0.example",
                (size_t) 10);
        _cleanup_json_ json_t *bad_utf8 = json_pack(
                "{s:o,s:s}", "name", json_string_nocheck("l\xff\xfen"), "cidr", "10.0.0.0/24");
        _cleanup_json_ json_t *not_object = json_pack("[s,s]", "x", "10.0.0.0/24");

        check_refused(f, reg, nul_name, "\"name\"", "NUL");
        check_refused(f, reg, nul_cidr, "\"cidr\"", "NUL");
        check_refused(f, reg, nul_dns, "\"dns_search_domain\"", "NUL");
        check_refused(f, reg, bad_utf8, "name \"", "DNS label");
        check_refused(f, reg, not_object, "JSON object", NULL);
}

static void test_create_invalid(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_json_ json_t *req = json_pack("{s:s,s:s}", "name", "x", "cidr", "10.0.0.0/8");

        /* The message, exactly. */
        assert_errno(create_request(reg, req, NULL, &e), -EINVAL);
        assert_string_equal(
                e.message, "invalid request: cidr \"10.0.0.0/8\": prefix length must be /16 to /29");

        /* With no networks.json yet: none appears. */
        check_all_refused(f, reg);
        assert_null(slurp(f->file));

        /* With one: it stays byte-identical. */
        create(reg, "{\"name\":\"base\",\"cidr\":\"10.0.0.0/24\"}");
        check_all_refused(f, reg);
        assert_int_equal(network_registry_size(reg), 1);
}

static void test_socket_path_limit(void **state) {
        Fixture *f = *state;
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *dir = NULL, *file = NULL, *name_ok = NULL, *name_long = NULL, *req = NULL;
        _cleanup_json_ json_t *long_req = NULL;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = NULL;
        Fixture sub;
        size_t pad;

        /* A state dir of 64 bytes leaves 107 - 64 - strlen("/networks/") - strlen("/qemu.sock") = 23 for
         * the name. */
        pad = 64 - strlen(f->dir) - 1;
        assert_true(asprintf(&dir, "%s/%0*d", f->dir, (int) pad, 0) > 0);
        assert_int_equal(strlen(dir), 64);
        assert_ok(RET_NERRNO(mkdir(dir, 0750)));
        assert_true(asprintf(&file, "%s/networks.json", dir) > 0);
        sub = (Fixture){ .dir = dir, .file = file };
        reg = load(&sub);

        name_ok = strdup("abcdefghij-abcdefghij-a");
        name_long = strdup("abcdefghij-abcdefghij-ab");
        assert_int_equal(strlen(name_ok), 23);

        long_req = json_pack("{s:s,s:s}", "name", name_long, "cidr", "10.0.0.0/24");
        check_refused(&sub, reg, long_req, "name \"abcdefghij-abcdefghij-ab\"", "state dir takes 64");
        assert_errno(create_request(reg, long_req, NULL, &e), -EINVAL);
        assert_contains(e.message, "would be 108 bytes");

        assert_true(asprintf(&req, "{\"name\":\"%s\",\"cidr\":\"10.0.0.0/24\"}", name_ok) > 0);
        create(reg, req);
        assert_int_equal(network_registry_size(reg), 1);
}

static void test_duplicate(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_json_ json_t *req = json_pack("{s:s,s:s}", "name", "lan", "cidr", "10.7.0.0/24");
        _cleanup_free_ char *before = NULL;
        Network *n = NULL, *first;

        first = create(reg, "{\"name\":\"lan\",\"cidr\":\"10.0.0.0/24\"}");
        before = slurp(f->file);

        assert_errno(create_request(reg, req, &n, &e), -EEXIST);
        assert_int_equal(e.code, API_ERROR_CONFLICT);
        assert_string_equal(e.message, "conflict: network \"lan\" already exists");
        assert_null(n);
        assert_int_equal(network_registry_size(reg), 1);
        assert_ptr_equal(network_registry_get(reg, "lan"), first);
        assert_string_equal(first->cidr, "10.0.0.0/24");
        assert_same_file(before, f->file);
}

static void test_network_limit(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f), *again = NULL;
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_json_ json_t *req = json_pack("{s:s,s:s}", "name", "one-more", "cidr", "10.0.0.0/24");
        _cleanup_free_ char *before = NULL;

        for (unsigned i = 0; i < NETWORKS_MAX; i++) {
                char text[64];

                (void) snprintf(text, sizeof(text), "{\"name\":\"n%03u\",\"cidr\":\"10.0.0.0/24\"}", i);
                create(reg, text);
        }
        assert_int_equal(network_registry_size(reg), 256);
        before = slurp(f->file);

        assert_errno(create_request(reg, req, NULL, &e), -EBUSY);
        assert_int_equal(e.code, API_ERROR_CONFLICT);
        assert_contains(e.message, "at most 256 networks");
        assert_int_equal(network_registry_size(reg), 256);
        assert_same_file(before, f->file);

        again = load(f);
        assert_int_equal(network_registry_size(again), 256);
        assert_string_equal(network_registry_at(again, 255)->name, "n255");
}

static void test_lease_allocation(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *json = NULL;
        const NetworkLease *l = NULL;
        Network *n;

        n = create(reg, "{\"name\":\"lan\",\"cidr\":\"10.0.0.0/24\"}");

        /* From .2 up. */
        assert_ip(acquire(reg, n, "aaaa0001")->ip, "10.0.0.2");
        assert_ip(acquire(reg, n, "aaaa0002")->ip, "10.0.0.3");
        assert_ip(acquire(reg, n, "aaaa0003")->ip, "10.0.0.4");
        assert_ip(acquire(reg, n, "aaaa0004")->ip, "10.0.0.5");

        /* Idempotent: the same VM gets its lease back, and nothing new is taken. */
        assert_int_equal(network_lease_acquire(reg, n, "aaaa0002", &l, NULL), 0);
        assert_ip(l->ip, "10.0.0.3");
        assert_int_equal(n->n_leases, 4);

        /* The lowest free address is reused first. */
        assert_ok(network_lease_release(reg, n, "aaaa0003"));
        assert_ok(network_lease_release(reg, n, "aaaa0002"));
        assert_null(network_lease_find(n, "aaaa0002"));
        assert_errno(network_lease_release(reg, n, "aaaa0002"), -ENOENT);
        assert_errno(network_lease_release(reg, n, "unknown"), -ENOENT);
        assert_int_equal(network_lease_acquire(reg, n, "bbbb0001", &l, NULL), 1);
        assert_ip(l->ip, "10.0.0.3");
        assert_ip(acquire(reg, n, "bbbb0002")->ip, "10.0.0.4");
        assert_ip(acquire(reg, n, "bbbb0003")->ip, "10.0.0.6");
        assert_ip(network_lease_find(n, "bbbb0002")->ip, "10.0.0.4");

        /* Leases are listed by IP, with their MAC. */
        json = network_dump(n);
        assert_string_equal(
                json,
                "{\"spec\":{\"name\":\"lan\",\"cidr\":\"10.0.0.0/24\",\"enableIMDS\":true,\"mtu\":1500},\"gateway\":\"10.0.0.1\",\"leases\":["
                "{\"vmID\":\"aaaa0001\",\"mac\":\"02:10:0a:00:00:02\",\"ip\":\"10.0.0.2\"},"
                "{\"vmID\":\"bbbb0001\",\"mac\":\"02:10:0a:00:00:03\",\"ip\":\"10.0.0.3\"},"
                "{\"vmID\":\"bbbb0002\",\"mac\":\"02:10:0a:00:00:04\",\"ip\":\"10.0.0.4\"},"
                "{\"vmID\":\"aaaa0004\",\"mac\":\"02:10:0a:00:00:05\",\"ip\":\"10.0.0.5\"},"
                "{\"vmID\":\"bbbb0003\",\"mac\":\"02:10:0a:00:00:06\",\"ip\":\"10.0.0.6\"}]}");
        assert_int_equal(fnv1a_low_byte("lan"), 0x10);

        /* VM ids that cannot be a VM's. */
        assert_errno(network_lease_acquire(reg, n, "", &l, &e), -EINVAL);
        assert_int_equal(e.code, API_ERROR_INVALID_REQUEST);
        assert_string_equal(e.message, "invalid request: vm id is empty");
        assert_errno(network_lease_acquire(reg, n, "a b", &l, &e), -EINVAL);
        assert_errno(network_lease_acquire(reg, n, "../x", &l, &e), -EINVAL);
        assert_int_equal(n->n_leases, 5);
}

static void test_pool_exhaustion(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *before = NULL;
        const NetworkLease *l = NULL;
        Network *n;

        /* A /29: .0 network, .1 gateway, .2-.5 leasable, .6 host alias, .7 broadcast. */
        n = create(reg, "{\"name\":\"tiny\",\"cidr\":\"10.9.9.0/29\"}");
        assert_ip(network_gateway(n), "10.9.9.1");
        assert_ip(network_host_alias(n), "10.9.9.6");
        assert_ip(acquire(reg, n, "vm-1")->ip, "10.9.9.2");
        assert_ip(acquire(reg, n, "vm-2")->ip, "10.9.9.3");
        assert_ip(acquire(reg, n, "vm-3")->ip, "10.9.9.4");
        assert_ip(acquire(reg, n, "vm-4")->ip, "10.9.9.5");
        before = slurp(f->file);

        assert_errno(network_lease_acquire(reg, n, "vm-5", &l, &e), -EBUSY);
        assert_int_equal(e.code, API_ERROR_CONFLICT);
        assert_string_equal(e.message, "conflict: network tiny has no free address");
        assert_null(l);
        assert_int_equal(n->n_leases, 4);
        assert_same_file(before, f->file);

        /* A VM that holds a lease still gets it back on a full network. */
        assert_int_equal(network_lease_acquire(reg, n, "vm-4", &l, NULL), 0);
        assert_ip(l->ip, "10.9.9.5");

        assert_ok(network_lease_release(reg, n, "vm-2"));
        assert_ip(acquire(reg, n, "vm-5")->ip, "10.9.9.3");
}

static void test_mac_default_network(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
        _cleanup_free_ char *expected = NULL, *json = NULL;
        char text[32];
        uint8_t mac[6];
        Network *n;

        assert_int_equal(network_ensure_default(reg, "default", "192.168.127.0/24", NULL), 1);
        n = network_registry_get(reg, "default");
        assert_non_null(n);
        const NetworkLease *l = acquire(reg, n, "0a1b2c3d");
        assert_ip(l->ip, "192.168.127.2");

        (void) snprintf(
                text,
                sizeof(text),
                "%02x:%02x:%02x:%02x:%02x:%02x",
                l->mac[0],
                l->mac[1],
                l->mac[2],
                l->mac[3],
                l->mac[4],
                l->mac[5]);
        expected = mac_text("default", "192.168.127.2");
        assert_string_equal(text, expected);
        assert_string_equal(text, "02:de:c0:a8:7f:02");

        /* The values the reference lists. */
        assert_int_equal(fnv1a_low_byte("default"), 0xde);
        assert_int_equal(fnv1a_low_byte("dev"), 0xbc);
        assert_int_equal(fnv1a_low_byte("tiny"), 0x6b);
        network_mac_for("dev", (struct in_addr){ .s_addr = htonl(0x0a2a0002) }, mac);
        assert_memory_equal(mac, ((const uint8_t[]){ 0x02, 0xbc, 0x0a, 0x2a, 0x00, 0x02 }), 6);

        json = network_dump(n);
        assert_contains(json, "{\"vmID\":\"0a1b2c3d\",\"mac\":\"02:de:c0:a8:7f:02\",\"ip\":\"192.168.127.2\"}");
}

typedef struct VmNames {
        unsigned calls;
} VmNames;

static const char *name_of_vm(const char *vm_id, void *userdata) {
        VmNames *v = userdata;

        v->calls++;
        if (streq(vm_id, "b2b2b2b2"))
                return "node-2";
        if (streq(vm_id, "a1a1a1a1"))
                return "node-1";
        return NULL; /* unknown: the id is shown */
}

static void test_delete(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f), *again = NULL;
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *before = NULL;
        VmNames names = {};
        Network *n;

        n = create(reg, "{\"name\":\"lan\",\"cidr\":\"10.0.0.0/24\"}");
        create(reg, "{\"name\":\"other\",\"cidr\":\"10.0.0.0/24\"}");
        acquire(reg, n, "b2b2b2b2");
        acquire(reg, n, "c3c3c3c3");
        acquire(reg, n, "a1a1a1a1");
        before = slurp(f->file);

        assert_errno(network_delete(reg, "lan", name_of_vm, &names, &e), -EBUSY);
        assert_int_equal(e.code, API_ERROR_CONFLICT);
        assert_string_equal(e.message, "conflict: network \"lan\" is used by vm c3c3c3c3, node-1, node-2");
        assert_int_equal(names.calls, 3);
        assert_ptr_equal(network_registry_get(reg, "lan"), n);
        assert_same_file(before, f->file);

        /* Without a callback the ids are shown. */
        assert_errno(network_delete(reg, "lan", NULL, NULL, &e), -EBUSY);
        assert_string_equal(e.message, "conflict: network \"lan\" is used by vm a1a1a1a1, b2b2b2b2, c3c3c3c3");

        assert_ok(network_lease_release(reg, n, "a1a1a1a1"));
        assert_ok(network_lease_release(reg, n, "b2b2b2b2"));
        assert_errno(network_delete(reg, "lan", name_of_vm, &names, &e), -EBUSY);
        assert_string_equal(e.message, "conflict: network \"lan\" is used by vm c3c3c3c3");
        assert_ok(network_lease_release(reg, n, "c3c3c3c3"));

        assert_ok(network_delete(reg, "lan", name_of_vm, &names, NULL));
        assert_null(network_registry_get(reg, "lan"));
        assert_int_equal(network_registry_size(reg), 1);

        assert_errno(network_delete(reg, "lan", name_of_vm, &names, &e), -ENOENT);
        assert_int_equal(e.code, API_ERROR_NOT_FOUND);
        assert_string_equal(e.message, "not found: network \"lan\"");

        again = load(f);
        assert_null(network_registry_get(again, "lan"));
        assert_non_null(network_registry_get(again, "other"));
}

static void test_reload_identical(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f), *again = NULL;
        _cleanup_free_ char *json = NULL, *json_again = NULL, *file = NULL, *file_again = NULL;
        Network *lan, *dmz, *tiny;

        lan = create(reg, "{\"name\":\"lan\",\"cidr\":\"10.0.0.0/24\",\"dns_search_domain\":\"corp.example\"}");
        dmz = create(reg, "{\"name\":\"dmz\",\"cidr\":\"172.20.0.0/16\"}");
        tiny = create(reg, "{\"name\":\"tiny\",\"cidr\":\"10.9.9.0/29\"}");
        acquire(reg, lan, "vm-a");
        acquire(reg, lan, "vm-b");
        acquire(reg, lan, "vm-c");
        acquire(reg, dmz, "vm-a");
        acquire(reg, tiny, "vm-d");
        assert_ok(network_lease_release(reg, lan, "vm-b"));    /* leaves a hole at .3 */
        lan->enable_host_alias = true;                         /* not settable through the API, but stored */
        assert_ip(acquire(reg, tiny, "vm-e")->ip, "10.9.9.3"); /* saves, with the flag */

        json = registry_dump(reg);
        file = slurp(f->file);
        assert_non_null(file);

        again = load(f);
        json_again = registry_dump(again);
        assert_string_equal(json_again, json);
        assert_true(network_registry_get(again, "lan")->enable_host_alias);
        assert_string_equal(network_registry_get(again, "lan")->cidr, "10.0.0.0/24");

        /* The hole is still the lowest free address after the reload. */
        lan = network_registry_get(again, "lan");
        assert_ip(acquire(again, lan, "vm-f")->ip, "10.0.0.3");
        assert_ok(network_lease_release(again, lan, "vm-f"));
        file_again = slurp(f->file);
        assert_string_equal(file_again, file); /* the same state is written the same way */
}

/* networks.json contents that must refuse to load, with a word of the problem. */
static void check_corrupt(const Fixture *f, const char *content, const char *problem) {
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        NetworkRegistry *reg = NULL;
        int r;

        put(f->file, content);
        r = network_registry_load(&reg, f->dir, &e);
        if (r >= 0)
                fail_msg("loaded: %s", content);
        assert_null(reg);
        assert_true(api_error_is_set(&e));
        assert_int_equal(e.code, API_ERROR_INTERNAL);
        assert_startswith(e.message, f->file);
        assert_contains(e.message, problem);
}

/* Requests never store a CIDR with host bits any more, but networks.json may hold one from before:
 * it loads as written, its prefix masked, and is written back the same. */
static void test_load_host_bits(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = NULL;
        Network *n;

        put(f->file,
            "{\"version\":1,\"networks\":[{\"name\":\"lan\",\"cidr\":\"10.0.0.9/24\",\"enableIMDS\":true,"
            "\"enableHostAlias\":false,\"leases\":[]}]}");
        reg = load(f);
        n = network_registry_get(reg, "lan");
        assert_non_null(n);
        assert_string_equal(n->cidr, "10.0.0.9/24");
        assert_ip(n->prefix, "10.0.0.0");
        assert_ip(network_gateway(n), "10.0.0.1");
        assert_ip(acquire(reg, n, "vm-a")->ip, "10.0.0.2");
        reg = network_registry_free(reg);
        reg = load(f);
        assert_string_equal(network_registry_get(reg, "lan")->cidr, "10.0.0.9/24");
}

static void test_corrupt_file(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *mac2 = mac_text("lan", "10.0.0.2"), *mac3 = mac_text("lan", "10.0.0.3"),
                            *good = NULL, *dup_ip = NULL, *dup_vm = NULL, *bad_mac = NULL, *outside = NULL,
                            *gateway = NULL, *dup_name = NULL, *bad_ip = NULL, *extra = NULL;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = NULL;
        _cleanup_free_ char *json = NULL;

#define NET(leases)                                                                                                    \
        "{\"name\":\"lan\",\"cidr\":\"10.0.0.0/29\",\"enableIMDS\":true,\"enableHostAlias\":false,\"leases\":[" leases \
        "]}"
#define LEASE "{\"vmID\":\"%s\",\"mac\":\"%s\",\"ip\":\"%s\"}"

        assert_true(
                asprintf(&good, "{\"version\":1,\"networks\":[" NET(LEASE) "]}", "vm-a", mac2, "10.0.0.2") > 0);
        assert_true(
                asprintf(
                        &dup_ip,
                        "{\"version\":1,\"networks\":[" NET(LEASE "," LEASE) "]}",
                        "vm-a",
                        mac2,
                        "10.0.0.2",
                        "vm-b",
                        mac2,
                        "10.0.0.2") > 0);
        assert_true(
                asprintf(
                        &dup_vm,
                        "{\"version\":1,\"networks\":[" NET(LEASE "," LEASE) "]}",
                        "vm-a",
                        mac2,
                        "10.0.0.2",
                        "vm-a",
                        mac3,
                        "10.0.0.3") > 0);
        assert_true(
                asprintf(&bad_mac, "{\"version\":1,\"networks\":[" NET(LEASE) "]}", "vm-a", mac3, "10.0.0.2") >
                0);
        assert_true(
                asprintf(
                        &outside,
                        "{\"version\":1,\"networks\":[" NET(LEASE) "]}",
                        "vm-a",
                        "02:10:0a:00:00:06",
                        "10.0.0.6") > 0);
        assert_true(
                asprintf(
                        &gateway,
                        "{\"version\":1,\"networks\":[" NET(LEASE) "]}",
                        "vm-a",
                        "02:10:0a:00:00:01",
                        "10.0.0.1") > 0);
        assert_true(
                asprintf(&bad_ip, "{\"version\":1,\"networks\":[" NET(LEASE) "]}", "vm-a", mac2, "10.0.0.02") >
                0);
        assert_true(asprintf(&dup_name, "{\"version\":1,\"networks\":[" NET("") "," NET("") "]}") > 0);
        assert_true(
                asprintf(
                        &extra,
                        "{\"version\":1,\"networks\":[" NET(
                                "{\"vmID\":\"vm-a\",\"mac\":\"%s\",\"ip\":\"10.0.0.2\",\"x\":1}") "]}",
                        mac2) > 0);

        /* The hand-written good file loads, so each case below fails for its own reason only. */
        put(f->file, good);
        reg = load(f);
        json = registry_dump(reg);
        assert_contains(json, "{\"vmID\":\"vm-a\",\"mac\":\"02:10:0a:00:00:02\",\"ip\":\"10.0.0.2\"}");

        check_corrupt(f, "", "malformed JSON");
        check_corrupt(f, "{\"version\":1,\"networks\":[", "malformed JSON");
        check_corrupt(f, "{\"version\":1,\"version\":1,\"networks\":[]}", "malformed JSON");
        check_corrupt(f, "[]", "expected a JSON object");
        check_corrupt(f, "{\"version\":2,\"networks\":[]}", "unsupported version 2");
        check_corrupt(f, "{\"networks\":[]}", "\"version\" is required");
        check_corrupt(f, "{\"version\":1,\"networks\":{}}", "expected an array");
        check_corrupt(f, "{\"version\":1,\"networks\":[],\"x\":1}", "unknown field \"x\"");
        check_corrupt(f, "{\"version\":1,\"networks\":[1]}", "networks[0]");
        check_corrupt(
                f,
                "{\"version\":1,\"networks\":[{\"name\":\"lan\",\"cidr\":\"10.0.0.0/8\",\"enableIMDS\":true,"
                "\"enableHostAlias\":false,\"leases\":[]}]}",
                "prefix length must be /16 to /29");
        check_corrupt(
                f,
                "{\"version\":1,\"networks\":[{\"name\":\"Lan\",\"cidr\":\"10.0.0.0/24\",\"enableIMDS\":true,"
                "\"enableHostAlias\":false,\"leases\":[]}]}",
                "must be a DNS label");
        check_corrupt(
                f,
                "{\"version\":1,\"networks\":[{\"name\":\"lan\",\"cidr\":\"10.0.0.0/24\",\"enableIMDS\":true,"
                "\"leases\":[]}]}",
                "\"enableHostAlias\" is required");
        check_corrupt(
                f,
                "{\"version\":1,\"networks\":[{\"name\":\"lan\",\"cidr\":\"10.0.0.0/24\",\"enableIMDS\":true,"
                "\"enableHostAlias\":false,\"leases\":{}}]}",
                "expected an array");
        check_corrupt(f, dup_ip, "lease 10.0.0.2 held by both");
        check_corrupt(f, dup_vm, "vm vm-a holds more than one lease");
        check_corrupt(f, bad_mac, "has MAC");
        check_corrupt(f, outside, "lease 10.0.0.6 for vm vm-a is outside the pool 10.0.0.2-10.0.0.5");
        check_corrupt(f, gateway, "outside the pool");
        check_corrupt(f, bad_ip, "\"10.0.0.02\" is not an IPv4 address");
        check_corrupt(f, dup_name, "network \"lan\" appears twice");
        check_corrupt(f, extra, "unknown field \"x\"");

        /* Unreadable is an error too, never an empty registry. */
        assert_ok(RET_NERRNO(unlink(f->file)));
        assert_ok(RET_NERRNO(mkdir(f->file, 0700)));
        {
                _cleanup_api_error_ ApiError e = API_ERROR_NULL;
                NetworkRegistry *r2 = NULL;

                assert_errno(network_registry_load(&r2, f->dir, &e), -EISDIR);
                assert_null(r2);
                assert_startswith(e.message, f->file);
        }
#undef NET
#undef LEASE
}

static void test_save_failure_changes_nothing(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_json_ json_t *req = json_pack("{s:s,s:s}", "name", "new", "cidr", "10.1.0.0/24");
        _cleanup_free_ char *before = NULL, *after = NULL;
        const NetworkLease *l = NULL;
        Network *n, *got = NULL;

        n = create(reg, "{\"name\":\"lan\",\"cidr\":\"10.0.0.0/24\"}");
        acquire(reg, n, "vm-a");
        before = registry_dump(reg);

        /* A directory in the way of networks.json makes every save fail. */
        assert_ok(RET_NERRNO(unlink(f->file)));
        assert_ok(RET_NERRNO(mkdir(f->file, 0700)));

        assert_errno(create_request(reg, req, &got, &e), -EISDIR);
        assert_int_equal(e.code, API_ERROR_INTERNAL);
        assert_contains(e.message, f->file);
        assert_null(got);
        assert_errno(network_lease_acquire(reg, n, "vm-b", &l, &e), -EISDIR);
        assert_null(l);
        assert_errno(network_lease_release(reg, n, "vm-a"), -EISDIR);
        assert_errno(network_delete(reg, "lan", NULL, NULL, &e), -EBUSY);
        assert_errno(network_ensure_default(reg, "default", "192.168.127.0/24", &e), -EISDIR);

        after = registry_dump(reg);
        assert_string_equal(after, before);
        assert_non_null(network_lease_find(n, "vm-a"));

        /* Once the way is clear, the same calls succeed. */
        assert_ok(RET_NERRNO(rmdir(f->file)));
        assert_ok(create_request(reg, req, &got, NULL));
        assert_ok(network_lease_release(reg, n, "vm-a"));
        assert_ok(RET_NERRNO(unlink(f->file)));
        assert_ok(RET_NERRNO(mkdir(f->file, 0700)));
        assert_errno(network_delete(reg, "lan", NULL, NULL, &e), -EISDIR);
        assert_non_null(network_registry_get(reg, "lan"));
        assert_int_equal(network_registry_size(reg), 2);
}

static void test_ensure_default(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f), *again = NULL;
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *before = NULL;
        Network *n;

        assert_errno(network_ensure_default(reg, "default", "192.168.127.0/8", &e), -EINVAL);
        assert_int_equal(e.code, API_ERROR_INVALID_REQUEST);
        assert_int_equal(network_registry_size(reg), 0);

        assert_int_equal(network_ensure_default(reg, "default", "192.168.127.0/24", NULL), 1);
        n = network_registry_get(reg, "default");
        assert_non_null(n);
        assert_string_equal(n->cidr, "192.168.127.0/24");
        assert_ip(network_gateway(n), "192.168.127.1");
        assert_ip(network_host_alias(n), "192.168.127.254");
        assert_true(n->enable_imds);
        assert_false(n->enable_host_alias);
        assert_null(n->dns_search_domain);
        assert_ip(acquire(reg, n, "vm-1")->ip, "192.168.127.2");
        before = slurp(f->file);

        /* Present already: kept as it is, even with another CIDR configured. */
        assert_int_equal(network_ensure_default(reg, "default", "192.168.127.0/24", NULL), 0);
        assert_int_equal(network_ensure_default(reg, "default", "10.10.0.0/16", NULL), 0);
        assert_ptr_equal(network_registry_get(reg, "default"), n);
        assert_string_equal(n->cidr, "192.168.127.0/24");
        assert_int_equal(n->n_leases, 1);
        assert_same_file(before, f->file);

        again = load(f);
        assert_int_equal(network_ensure_default(again, "default", "10.10.0.0/16", NULL), 0);
        assert_string_equal(network_registry_get(again, "default")->cidr, "192.168.127.0/24");
        assert_same_file(before, f->file);
}

static void test_json_key_order(void **state) {
        Fixture *f = *state;
        _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
        _cleanup_free_ char *a = NULL, *b = NULL, *c = NULL;
        Network *n, *m;

        n = create(reg, "{\"dns_search_domain\":\"example.com\",\"cidr\":\"10.1.2.0/24\",\"name\":\"lan\"}");
        a = network_dump(n);
        assert_string_equal(
                a,
                "{\"spec\":{\"name\":\"lan\",\"cidr\":\"10.1.2.0/24\",\"dnsSearchDomain\":\"example.com\",\"enableIMDS\":true,\"mtu\":1500},"
                "\"gateway\":\"10.1.2.1\",\"leases\":[]}");

        m = create(reg, "{\"name\":\"dmz\",\"cidr\":\"172.16.0.0/16\"}");
        acquire(reg, m, "0a1b2c3d");
        m->enable_host_alias = true;
        b = network_dump(m);
        assert_string_equal(
                b,
                "{\"spec\":{\"name\":\"dmz\",\"cidr\":\"172.16.0.0/16\",\"enableIMDS\":true,\"enableHostAlias\":true,\"mtu\":1500},"
                "\"gateway\":\"172.16.0.1\",\"leases\":[{\"vmID\":\"0a1b2c3d\",\"mac\":\"02:c0:ac:10:00:02\",\"ip\":\"172.16.0.2\"}]}");
        assert_int_equal(fnv1a_low_byte("dmz"), 0xc0);

        /* The state file keeps its own, documented shape. */
        c = slurp(f->file);
        assert_non_null(c);
        assert_string_equal(
                c,
                "{\n"
                "  \"version\": 1,\n"
                "  \"networks\": [\n"
                "    {\n"
                "      \"name\": \"dmz\",\n"
                "      \"cidr\": \"172.16.0.0/16\",\n"
                "      \"enableIMDS\": true,\n"
                "      \"enableHostAlias\": false,\n"
                "      \"mtu\": 1500,\n"
                "      \"leases\": [\n"
                "        {\n"
                "          \"vmID\": \"0a1b2c3d\",\n"
                "          \"mac\": \"02:c0:ac:10:00:02\",\n"
                "          \"ip\": \"172.16.0.2\"\n"
                "        }\n"
                "      ]\n"
                "    },\n"
                "    {\n"
                "      \"name\": \"lan\",\n"
                "      \"cidr\": \"10.1.2.0/24\",\n"
                "      \"dnsSearchDomain\": \"example.com\",\n"
                "      \"enableIMDS\": true,\n"
                "      \"enableHostAlias\": false,\n"
                "      \"mtu\": 1500,\n"
                "      \"leases\": []\n"
                "    }\n"
                "  ]\n"
                "}\n");
}

/* A network's MTU: given, kept across a restart, defaulted for records written before it existed. */
static void test_mtu(void **state) {
        Fixture *f = *state;
        {
                _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
                Network *n = create(reg, "{\"name\":\"jumbo\",\"cidr\":\"10.9.0.0/24\",\"mtu\":65520}");
                assert_int_equal(n->mtu, 65520);
                n = create(reg, "{\"name\":\"plain\",\"cidr\":\"10.8.0.0/24\"}");
                assert_int_equal(n->mtu, NETWORK_MTU_DEFAULT);
        }
        {
                _cleanup_(network_registry_freep) NetworkRegistry *reg = load(f);
                assert_int_equal(network_registry_get(reg, "jumbo")->mtu, 65520);
                assert_int_equal(network_registry_get(reg, "plain")->mtu, 1500);
        }
}

static void test_validators(void **state) {
        _cleanup_api_error_ ApiError e = API_ERROR_NULL;
        struct in_addr prefix;
        unsigned len = 0;
        char name64[65], label63[64], long_dns[300];

        assert_ok(network_parse_cidr("192.168.5.7/29", &prefix, &len, NULL));
        assert_ip(prefix, "192.168.5.0");
        assert_int_equal(len, 29);
        assert_ok(network_parse_cidr("10.255.255.255/16", &prefix, &len, NULL));
        assert_ip(prefix, "10.255.0.0");
        assert_int_equal(len, 16);
        assert_errno(network_parse_cidr("10.0.0.0/30", &prefix, &len, &e), -EINVAL);
        assert_string_equal(
                e.message, "invalid request: cidr \"10.0.0.0/30\": prefix length must be /16 to /29");
        assert_errno(network_parse_cidr(NULL, &prefix, &len, NULL), -EINVAL);

        assert_ok(network_validate_name("a", NULL));
        assert_ok(network_validate_name("0", NULL));
        assert_ok(network_validate_name("a-b-0", NULL));
        memset(name64, 'a', 64);
        name64[64] = 0;
        assert_errno(network_validate_name(name64, &e), -EINVAL);
        assert_startswith(e.message, "invalid request: name \"aaaa");
        name64[63] = 0;
        assert_ok(network_validate_name(name64, NULL));
        assert_errno(network_validate_name(NULL, NULL), -EINVAL);

        memset(label63, 'b', 63);
        label63[63] = 0;
        assert_ok(dns_name_validate(label63, NULL));
        assert_ok(dns_name_validate("example.com", NULL));
        assert_ok(dns_name_validate("example.com.", NULL));
        assert_ok(dns_name_validate("Example.COM", NULL));
        assert_ok(dns_name_validate("xn--bcher-kva.example", NULL));
        assert_ok(dns_name_validate("1.2.3.4", NULL));
        assert_errno(dns_name_validate("example.com..", &e), -EINVAL);
        assert_string_equal(
                e.message,
                "invalid request: \"example.com..\" is not a valid DNS name: it has an empty label");
        assert_errno(dns_name_validate("", NULL), -EINVAL);

        /* 253 characters is the longest name, with or without the trailing dot. */
        (void) snprintf(long_dns, sizeof(long_dns), "%s.%s.%s.%.61s", label63, label63, label63, label63);
        assert_int_equal(strlen(long_dns), 253);
        assert_ok(dns_name_validate(long_dns, NULL));
        strcat(long_dns, ".");
        assert_ok(dns_name_validate(long_dns, NULL));
        long_dns[253] = 'c';
        assert_errno(dns_name_validate(long_dns, &e), -EINVAL);
        assert_contains(e.message, "longer than 253");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_create_get_list, setup, teardown),
                cmocka_unit_test_setup_teardown(test_create_accepts_edges, setup, teardown),
                cmocka_unit_test_setup_teardown(test_create_invalid, setup, teardown),
                cmocka_unit_test_setup_teardown(test_socket_path_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_duplicate, setup, teardown),
                cmocka_unit_test_setup_teardown(test_network_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lease_allocation, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pool_exhaustion, setup, teardown),
                cmocka_unit_test_setup_teardown(test_mac_default_network, setup, teardown),
                cmocka_unit_test_setup_teardown(test_delete, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reload_identical, setup, teardown),
                cmocka_unit_test_setup_teardown(test_load_host_bits, setup, teardown),
                cmocka_unit_test_setup_teardown(test_corrupt_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_save_failure_changes_nothing, setup, teardown),
                cmocka_unit_test_setup_teardown(test_ensure_default, setup, teardown),
                cmocka_unit_test_setup_teardown(test_json_key_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_mtu, setup, teardown),
                cmocka_unit_test(test_validators),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
