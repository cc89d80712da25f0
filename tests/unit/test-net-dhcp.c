/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "test-util.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>

#include "macro.h"
#include "net-dhcp.h"

#define IP(a, b, c, d) htonl(((uint32_t) (a) << 24) | ((uint32_t) (b) << 16) | ((uint32_t) (c) << 8) | (d))

#define GATEWAY IP(10, 77, 0, 1)
#define LEASE IP(10, 77, 0, 23)
#define OTHER_IP IP(10, 77, 0, 99)
#define XID 0xdeadbeefU

static const uint8_t known_mac[NET_ETH_ALEN] = { 0x52, 0x54, 0x00, 0x12, 0x34, 0x56 };
static const uint8_t unknown_mac[NET_ETH_ALEN] = { 0x52, 0x54, 0x00, 0xff, 0xff, 0xff };
static const uint8_t cookie[4] = { 99, 130, 83, 99 };

static NetDhcpConfig config(void) {
        return (NetDhcpConfig){
                .server = GATEWAY,
                .netmask = IP(255, 255, 255, 0),
                .mtu = 1500,
                .lease_seconds = 3600,
                .search_domain = "dev.example.com",
        };
}

static int lookup(const uint8_t mac[NET_ETH_ALEN], uint32_t *ret_ip, void *userdata) {
        int *calls = userdata;

        if (calls)
                (*calls)++;
        if (memcmp(mac, known_mac, NET_ETH_ALEN) != 0)
                return -ENOENT;
        *ret_ip = LEASE;
        return 0;
}

static int lookup_fails(const uint8_t mac[NET_ETH_ALEN], uint32_t *ret_ip, void *userdata) {
        return -EIO;
}

/* A client's message, as a dhclient-like client builds it. Zero fields are left out. */
typedef struct TestRequest {
        uint8_t op;   /* 0 → BOOTREQUEST */
        uint8_t type; /* option 53, 0 → none */
        const uint8_t *mac;
        uint16_t flags;                                   /* host byte order */
        uint32_t ciaddr, giaddr, requested_ip, server_id; /* be32 */
        bool no_end;
} TestRequest;

static size_t build_request(uint8_t *buf, size_t size, const TestRequest *t) {
        static const uint8_t prl[] = { 1, 3, 6, 12, 15, 26, 28, 51, 54, 58, 59, 119 };
        uint32_t xid = htonl(XID);
        uint16_t flags = htons(t->flags);
        size_t o = 240;

        assert_true(size >= 548);
        memset(buf, 0, size);
        buf[0] = t->op ?: 1;
        buf[1] = 1;
        buf[2] = 6;
        memcpy(buf + 4, &xid, 4);
        buf[9] = 3; /* secs */
        memcpy(buf + 10, &flags, 2);
        memcpy(buf + 12, &t->ciaddr, 4);
        memcpy(buf + 24, &t->giaddr, 4);
        memcpy(buf + 28, t->mac ?: known_mac, NET_ETH_ALEN);
        memcpy(buf + 236, cookie, 4);

        if (t->type) {
                buf[o++] = 53;
                buf[o++] = 1;
                buf[o++] = t->type;
        }
        buf[o++] = 61; /* client identifier */
        buf[o++] = 7;
        buf[o++] = 1;
        memcpy(buf + o, t->mac ?: known_mac, NET_ETH_ALEN);
        o += NET_ETH_ALEN;
        if (t->requested_ip) {
                buf[o++] = 50;
                buf[o++] = 4;
                memcpy(buf + o, &t->requested_ip, 4);
                o += 4;
        }
        if (t->server_id) {
                buf[o++] = 54;
                buf[o++] = 4;
                memcpy(buf + o, &t->server_id, 4);
                o += 4;
        }
        buf[o++] = 55;
        buf[o++] = sizeof(prl);
        memcpy(buf + o, prl, sizeof(prl));
        o += sizeof(prl);
        buf[o++] = 12; /* host name */
        buf[o++] = 4;
        memcpy(buf + o, "vm-a", 4);
        o += 4;
        if (!t->no_end)
                buf[o++] = 255;
        return o;
}

/* Runs the server on a copy of the request that is exactly len bytes long, so that an overread
 * is caught by AddressSanitizer, into a reply buffer of exactly NET_DHCP_REPLY_MAX bytes. */
static ssize_t handle_full(
        const NetDhcpConfig *c,
        NetDhcpLookup l,
        void *userdata,
        const uint8_t *req,
        size_t len,
        uint8_t reply[static NET_DHCP_REPLY_MAX],
        NetDhcpReply *info) {

        uint8_t *copy = malloc(len ?: 1), *out = malloc(NET_DHCP_REPLY_MAX);
        ssize_t r;

        assert_non_null(copy);
        assert_non_null(out);
        memcpy(copy, req, len);
        r = net_dhcp_handle(c, l, userdata, copy, len, out, NET_DHCP_REPLY_MAX, info);
        memcpy(reply, out, NET_DHCP_REPLY_MAX);
        free(copy);
        free(out);
        return r;
}

static ssize_t handle(const TestRequest *t, uint8_t reply[static NET_DHCP_REPLY_MAX], NetDhcpReply *info) {
        NetDhcpConfig c = config();
        uint8_t req[548];
        size_t len = build_request(req, sizeof(req), t);

        return handle_full(&c, lookup, NULL, req, len, reply, info);
}

/* Finds option code in a reply, checking the option framing on the way. */
static const uint8_t *find_option(const uint8_t *p, size_t len, uint8_t code, size_t *ret_len) {
        for (size_t i = 240; i < len;) {
                if (p[i] == 0) {
                        i++;
                        continue;
                }
                if (p[i] == 255)
                        return NULL;
                assert_true(i + 2 <= len);
                assert_true(i + 2 + p[i + 1] <= len);
                if (p[i] == code) {
                        *ret_len = p[i + 1];
                        return p + i + 2;
                }
                i += 2 + p[i + 1];
        }
        fail_msg("no END option");
        return NULL;
}

static uint32_t get_be32(const uint8_t *p) {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
}

/* The header of every reply: a BOOTREPLY to our client with the xid echoed. */
static void assert_reply_header(const uint8_t *r, ssize_t n, uint32_t yiaddr, uint32_t ciaddr) {
        static const uint8_t zero[192] = {};

        assert_true(n >= 300);
        assert_true(n <= NET_DHCP_REPLY_MAX);
        assert_int_equal(r[0], 2);
        assert_int_equal(r[1], 1);
        assert_int_equal(r[2], 6);
        assert_int_equal(r[3], 0);
        assert_int_equal(ntohl(get_be32(r + 4)), XID);
        assert_int_equal(r[8], 0); /* secs */
        assert_int_equal(r[9], 0);
        assert_int_equal(get_be32(r + 12), ciaddr);
        assert_int_equal(get_be32(r + 16), yiaddr);
        assert_int_equal(get_be32(r + 20), 0); /* siaddr */
        assert_memory_equal(r + 28, known_mac, NET_ETH_ALEN);
        assert_memory_equal(r + 34, zero, 10);
        assert_memory_equal(r + 44, zero, 192); /* sname and file */
        assert_memory_equal(r + 236, cookie, 4);
}

/* The options of an OFFER or ACK for config(), in order, with the message type patched in. */
static const uint8_t lease_options[] = {
        53,  1,  2,                      /* type */
        54,  4,  10,   77,   0,    1,    /* server */
        51,  4,  0,    0,    0x0e, 0x10, /* lease 3600 */
        58,  4,  0,    0,    0x07, 0x08, /* T1 1800 */
        59,  4,  0,    0,    0x0c, 0x4e, /* T2 3150 */
        1,   4,  255,  255,  255,  0,    /* netmask */
        3,   4,  10,   77,   0,    1,    /* router */
        6,   4,  10,   77,   0,    1,    /* DNS */
        26,  2,  0x05, 0xdc,             /* MTU 1500 */
        119, 17, 3,    'd',  'e',  'v',  7,   'e', 'x', 'a', 'm', 'p', 'l', 'e', 3,   'c', 'o', 'm', 0,
        15,  15, 'd',  'e',  'v',  '.',  'e', 'x', 'a', 'm', 'p', 'l', 'e', '.', 'c', 'o', 'm', 255,
};

static void assert_lease_options(const uint8_t *r, ssize_t n, uint8_t type) {
        uint8_t expected[sizeof(lease_options)];
        static const uint8_t zero[300] = {};

        memcpy(expected, lease_options, sizeof(expected));
        expected[2] = type;
        assert_int_equal(n, MAX((size_t) 300, 240 + sizeof(expected)));
        assert_memory_equal(r + 240, expected, sizeof(expected));
        assert_memory_equal(r + 240 + sizeof(expected), zero, (size_t) n - 240 - sizeof(expected));
}

static void assert_nak(const uint8_t *r, ssize_t n, const NetDhcpReply *info, uint32_t ciaddr) {
        static const uint8_t expected[] = { 53, 1, 6, 54, 4, 10, 77, 0, 1, 255 };
        static const uint8_t zero[300] = {};

        assert_int_equal(n, 300);
        assert_reply_header(r, n, 0, 0);
        assert_memory_equal(r + 240, expected, sizeof(expected));
        assert_memory_equal(r + 240 + sizeof(expected), zero, 300 - 240 - sizeof(expected));
        assert_int_equal(info->type, NET_DHCP_NAK);
        assert_int_equal(info->yiaddr, 0);
        assert_int_equal(info->ciaddr, ciaddr);
        assert_true(info->broadcast);
}

static void test_discover_offer(void **state) {
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;
        ssize_t n;

        n = handle(&(TestRequest){ .type = NET_DHCP_DISCOVER }, r, &info);
        assert_int_equal(n, 326);
        assert_reply_header(r, n, LEASE, 0);
        assert_int_equal(r[10], 0); /* flags */
        assert_int_equal(r[11], 0);
        assert_lease_options(r, n, NET_DHCP_OFFER);

        assert_int_equal(info.type, NET_DHCP_OFFER);
        assert_int_equal(info.yiaddr, LEASE);
        assert_int_equal(info.ciaddr, 0);
        assert_memory_equal(info.chaddr, known_mac, NET_ETH_ALEN);
        assert_true(info.broadcast);
}

static void test_discover_flags_giaddr(void **state) {
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;
        ssize_t n;

        /* A client's requested address in a DISCOVER does not change the offer. */
        n = handle(
                &(TestRequest){
                        .type = NET_DHCP_DISCOVER,
                        .flags = 0x8000,
                        .giaddr = IP(192, 168, 1, 1),
                        .requested_ip = OTHER_IP,
                },
                r,
                &info);
        assert_reply_header(r, n, LEASE, 0);
        assert_int_equal(r[10], 0x80);
        assert_int_equal(r[11], 0);
        assert_int_equal(get_be32(r + 24), IP(192, 168, 1, 1));
        assert_lease_options(r, n, NET_DHCP_OFFER);
        assert_true(info.broadcast);
}

static void test_request_selecting(void **state) {
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;
        ssize_t n;

        n = handle(
                &(TestRequest){ .type = NET_DHCP_REQUEST, .requested_ip = LEASE, .server_id = GATEWAY },
                r,
                &info);
        assert_reply_header(r, n, LEASE, 0);
        assert_lease_options(r, n, NET_DHCP_ACK);
        assert_int_equal(info.type, NET_DHCP_ACK);
        assert_int_equal(info.yiaddr, LEASE);
        assert_true(info.broadcast);
}

static void test_request_init_reboot(void **state) {
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;
        ssize_t n;

        n = handle(&(TestRequest){ .type = NET_DHCP_REQUEST, .requested_ip = LEASE }, r, &info);
        assert_reply_header(r, n, LEASE, 0);
        assert_lease_options(r, n, NET_DHCP_ACK);
        assert_true(info.broadcast);

        /* Neither option 50 nor ciaddr: nothing to refuse. */
        n = handle(&(TestRequest){ .type = NET_DHCP_REQUEST }, r, &info);
        assert_reply_header(r, n, LEASE, 0);
        assert_lease_options(r, n, NET_DHCP_ACK);
}

static void test_request_other_ip_nak(void **state) {
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;
        ssize_t n;

        n = handle(
                &(TestRequest){ .type = NET_DHCP_REQUEST, .requested_ip = OTHER_IP, .server_id = GATEWAY },
                r,
                &info);
        assert_nak(r, n, &info, 0);
        assert_int_equal(r[10], 0); /* no relay: flags as the client sent them */

        n = handle(&(TestRequest){ .type = NET_DHCP_REQUEST, .requested_ip = OTHER_IP }, r, &info);
        assert_nak(r, n, &info, 0);

        /* Option 50 wins over ciaddr. */
        n = handle(
                &(TestRequest){ .type = NET_DHCP_REQUEST, .requested_ip = OTHER_IP, .ciaddr = LEASE }, r, &info);
        assert_nak(r, n, &info, LEASE);
        n = handle(
                &(TestRequest){ .type = NET_DHCP_REQUEST, .requested_ip = LEASE, .ciaddr = OTHER_IP }, r, &info);
        assert_int_equal(info.type, NET_DHCP_ACK);

        /* Renewing an address that is not the lease. */
        n = handle(&(TestRequest){ .type = NET_DHCP_REQUEST, .ciaddr = OTHER_IP }, r, &info);
        assert_nak(r, n, &info, OTHER_IP);

        /* Through a relay the NAK is broadcast (RFC 2131 §4.3.2). */
        n = handle(
                &(TestRequest){
                        .type = NET_DHCP_REQUEST, .requested_ip = OTHER_IP, .giaddr = IP(192, 168, 1, 1) },
                r,
                &info);
        assert_nak(r, n, &info, 0);
        assert_int_equal(r[10], 0x80);
        assert_int_equal(get_be32(r + 24), IP(192, 168, 1, 1));
}

static void test_request_foreign_server(void **state) {
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info = { .type = NET_DHCP_NONE };

        assert_int_equal(
                handle(&(TestRequest){ .type = NET_DHCP_REQUEST,
                                       .requested_ip = LEASE,
                                       .server_id = IP(10, 77, 0, 2) },
                       r,
                       &info),
                0);
        /* Even when the address would be refused: the other server answers. */
        assert_int_equal(
                handle(&(TestRequest){ .type = NET_DHCP_REQUEST,
                                       .requested_ip = OTHER_IP,
                                       .server_id = IP(10, 77, 0, 2) },
                       r,
                       &info),
                0);
        assert_int_equal(info.type, NET_DHCP_NONE);
}

static void test_renew_unicast(void **state) {
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;
        ssize_t n;

        n = handle(&(TestRequest){ .type = NET_DHCP_REQUEST, .ciaddr = LEASE }, r, &info);
        assert_reply_header(r, n, LEASE, LEASE);
        assert_lease_options(r, n, NET_DHCP_ACK);
        assert_int_equal(info.type, NET_DHCP_ACK);
        assert_int_equal(info.yiaddr, LEASE);
        assert_int_equal(info.ciaddr, LEASE);
        assert_false(info.broadcast);

        /* Rebinding with the broadcast flag set. */
        n = handle(&(TestRequest){ .type = NET_DHCP_REQUEST, .ciaddr = LEASE, .flags = 0x8000 }, r, &info);
        assert_reply_header(r, n, LEASE, LEASE);
        assert_int_equal(r[10], 0x80);
        assert_int_equal(info.ciaddr, LEASE);
        assert_true(info.broadcast);
}

static void test_inform(void **state) {
        static const uint8_t expected[] = {
                53,  1,   5,   54,  4,   10,  77,  0,   1,   1,   4,   255, 255,  255,  0,   3,   4,
                10,  77,  0,   1,   6,   4,   10,  77,  0,   1,   26,  2,   0x05, 0xdc, 119, 17,  3,
                'd', 'e', 'v', 7,   'e', 'x', 'a', 'm', 'p', 'l', 'e', 3,   'c',  'o',  'm', 0,   15,
                15,  'd', 'e', 'v', '.', 'e', 'x', 'a', 'm', 'p', 'l', 'e', '.',  'c',  'o', 'm', 255,
        };
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;
        size_t l;
        ssize_t n;

        n = handle(&(TestRequest){ .type = NET_DHCP_INFORM, .ciaddr = LEASE }, r, &info);
        assert_int_equal(n, 308);
        assert_reply_header(r, n, 0, LEASE);
        assert_memory_equal(r + 240, expected, sizeof(expected));
        assert_null(find_option(r, (size_t) n, 51, &l));
        assert_null(find_option(r, (size_t) n, 58, &l));
        assert_null(find_option(r, (size_t) n, 59, &l));
        assert_int_equal(info.type, NET_DHCP_ACK);
        assert_int_equal(info.yiaddr, 0);
        assert_int_equal(info.ciaddr, LEASE);
        assert_false(info.broadcast);

        assert_int_equal(
                handle(&(TestRequest){ .type = NET_DHCP_INFORM, .ciaddr = LEASE, .mac = unknown_mac }, r, &info),
                0);
}

static void test_no_reply_types(void **state) {
        static const uint8_t types[] = { 2, 4, 5, 6, 7, 9, 18, 255 };
        uint8_t r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;

        for (size_t i = 0; i < ELEMENTSOF(types); i++)
                assert_int_equal(
                        handle(&(TestRequest){ .type = types[i], .ciaddr = LEASE, .server_id = GATEWAY },
                               r,
                               &info),
                        0);
}

static void test_unknown_mac(void **state) {
        static const uint8_t types[] = {
                NET_DHCP_DISCOVER, NET_DHCP_REQUEST, NET_DHCP_INFORM, NET_DHCP_RELEASE, NET_DHCP_DECLINE
        };
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX], req[548];
        NetDhcpReply info;
        int calls = 0;

        for (size_t i = 0; i < ELEMENTSOF(types); i++) {
                size_t len = build_request(
                        req,
                        sizeof(req),
                        &(TestRequest){ .type = types[i], .mac = unknown_mac, .requested_ip = LEASE });
                assert_int_equal(handle_full(&c, lookup, &calls, req, len, r, &info), 0);
        }
        /* Looked up for the three types we answer, not for RELEASE and DECLINE. */
        assert_int_equal(calls, 3);
}

static void test_lookup_error(void **state) {
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX], req[548];
        NetDhcpReply info;
        size_t len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });

        assert_errno(handle_full(&c, lookup_fails, NULL, req, len, r, &info), -EIO);
}

static void test_not_for_us(void **state) {
        uint8_t r[NET_DHCP_REPLY_MAX], req[548];
        NetDhcpConfig c = config();
        NetDhcpReply info;
        size_t len;

        /* Another server's BOOTREPLY seen on port 67. */
        assert_int_equal(handle(&(TestRequest){ .op = 2, .type = NET_DHCP_OFFER }, r, &info), 0);
        assert_int_equal(handle(&(TestRequest){ .op = 2, .type = NET_DHCP_DISCOVER }, r, &info), 0);

        len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });
        req[1] = 6; /* IEEE 802 */
        assert_int_equal(handle_full(&c, lookup, NULL, req, len, r, &info), 0);
        req[1] = 1;
        req[2] = 16;
        assert_int_equal(handle_full(&c, lookup, NULL, req, len, r, &info), 0);
}

static void test_malformed(void **state) {
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX], req[548], bad[548];
        NetDhcpReply info;
        size_t len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });

        /* No cookie (plain BOOTP), or a wrong one. */
        memcpy(bad, req, len);
        memset(bad + 236, 0, 4);
        assert_errno(handle_full(&c, lookup, NULL, bad, len, r, &info), -EBADMSG);
        bad[236] = 99;
        bad[237] = 130;
        bad[238] = 83;
        bad[239] = 98;
        assert_errno(handle_full(&c, lookup, NULL, bad, len, r, &info), -EBADMSG);

        /* No message type. */
        len = build_request(req, sizeof(req), &(TestRequest){ .type = 0 });
        assert_errno(handle_full(&c, lookup, NULL, req, len, r, &info), -EBADMSG);

        /* Only the header and the cookie, or the cookie and END. */
        len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });
        assert_errno(handle_full(&c, lookup, NULL, req, 240, r, &info), -EBADMSG);
        memcpy(bad, req, 240);
        bad[240] = 255;
        bad[241] = 53; /* after END: ignored */
        bad[242] = 1;
        bad[243] = 1;
        assert_errno(handle_full(&c, lookup, NULL, bad, 244, r, &info), -EBADMSG);

        /* An option whose length byte is missing, and one whose value runs past the end. */
        memcpy(bad, req, 240);
        memcpy(bad + 240, (const uint8_t[]){ 53, 1, 1, 12 }, 4);
        assert_errno(handle_full(&c, lookup, NULL, bad, 244, r, &info), -EBADMSG);
        memcpy(bad + 240, (const uint8_t[]){ 53, 1, 1, 12, 10, 'v', 'm' }, 7);
        assert_errno(handle_full(&c, lookup, NULL, bad, 247, r, &info), -EBADMSG);
        memcpy(bad + 240, (const uint8_t[]){ 12, 200, 'v', 'm', 53, 1, 1, 255 }, 8);
        assert_errno(handle_full(&c, lookup, NULL, bad, 248, r, &info), -EBADMSG);

        /* Option 53, 50 or 54 with the wrong length, or twice. */
        memcpy(bad + 240, (const uint8_t[]){ 53, 2, 1, 1, 255 }, 5);
        assert_errno(handle_full(&c, lookup, NULL, bad, 245, r, &info), -EBADMSG);
        memcpy(bad + 240, (const uint8_t[]){ 53, 0, 255 }, 3);
        assert_errno(handle_full(&c, lookup, NULL, bad, 243, r, &info), -EBADMSG);
        memcpy(bad + 240, (const uint8_t[]){ 53, 1, 1, 53, 1, 3, 255 }, 7);
        assert_errno(handle_full(&c, lookup, NULL, bad, 247, r, &info), -EBADMSG);
        memcpy(bad + 240, (const uint8_t[]){ 53, 1, 3, 50, 3, 10, 77, 0, 255 }, 9);
        assert_errno(handle_full(&c, lookup, NULL, bad, 249, r, &info), -EBADMSG);
        memcpy(bad + 240, (const uint8_t[]){ 53, 1, 3, 54, 5, 10, 77, 0, 1, 0, 255 }, 11);
        assert_errno(handle_full(&c, lookup, NULL, bad, 251, r, &info), -EBADMSG);
        memcpy(bad + 240, (const uint8_t[]){ 53, 1, 3, 50, 4, 10, 77, 0, 23, 50, 4, 10, 77, 0, 23, 255 }, 16);
        assert_errno(handle_full(&c, lookup, NULL, bad, 256, r, &info), -EBADMSG);

        /* Shorter than the fixed header, and empty. */
        assert_errno(handle_full(&c, lookup, NULL, req, 100, r, &info), -EBADMSG);
        assert_errno(handle_full(&c, lookup, NULL, req, 0, r, &info), -EBADMSG);
        assert_errno(net_dhcp_handle(&c, lookup, NULL, NULL, 0, r, sizeof(r), &info), -EBADMSG);
}

static void test_option_framing(void **state) {
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX], req[548], msg[548];
        NetDhcpReply info;
        size_t len;
        ssize_t n;

        /* Pads anywhere, no END, an overload option (52) that is not followed. */
        build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });
        memcpy(msg, req, 240);
        memcpy(msg + 240, (const uint8_t[]){ 0, 0, 52, 1, 3, 0, 53, 1, 1, 0, 12, 0 }, 12);
        len = 252;
        n = handle_full(&c, lookup, NULL, msg, len, r, &info);
        assert_int_equal(n, 326);
        assert_lease_options(r, n, NET_DHCP_OFFER);

        /* A DISCOVER cut right after option 53. */
        n = handle_full(&c, lookup, NULL, msg, 249, r, &info);
        assert_lease_options(r, n, NET_DHCP_OFFER);

        /* Whatever follows END, garbage included, is padding. */
        len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });
        memset(req + len, 0xee, sizeof(req) - len);
        n = handle_full(&c, lookup, NULL, req, sizeof(req), r, &info);
        assert_lease_options(r, n, NET_DHCP_OFFER);

        /* The request built without END parses too. */
        len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER, .no_end = true });
        n = handle_full(&c, lookup, NULL, req, len, r, &info);
        assert_lease_options(r, n, NET_DHCP_OFFER);
}

/* Every prefix of a valid message: an error or a valid reply, never a crash or an overread. */
static void test_truncated(void **state) {
        const TestRequest requests[] = {
                { .type = NET_DHCP_DISCOVER },
                { .type = NET_DHCP_REQUEST, .requested_ip = LEASE, .server_id = GATEWAY },
                { .type = NET_DHCP_INFORM, .ciaddr = LEASE },
        };
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX], req[548];

        for (size_t k = 0; k < ELEMENTSOF(requests); k++) {
                size_t len = build_request(req, sizeof(req), &requests[k]);
                unsigned valid = 0;

                for (size_t l = 0; l <= len; l++) {
                        NetDhcpReply info;
                        ssize_t n = handle_full(&c, lookup, NULL, req, l, r, &info);

                        if (n < 0) {
                                assert_errno(n, -EBADMSG);
                                continue;
                        }
                        assert_true(l >= 243); /* the cookie and option 53 at least */
                        assert_true(n >= 300 && n <= NET_DHCP_REPLY_MAX);
                        assert_reply_header(r, n, info.yiaddr, requests[k].ciaddr);
                        valid++;
                }
                /* The full message, and prefixes that end between two options. */
                assert_true(valid >= 2);
        }
}

static void test_small_buffer(void **state) {
        NetDhcpConfig c = config();
        uint8_t req[548], r[NET_DHCP_REPLY_MAX + 1];
        NetDhcpReply info = { .type = NET_DHCP_NONE };
        size_t len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });

        memset(r, 0x5a, sizeof(r));
        assert_errno(net_dhcp_handle(&c, lookup, NULL, req, len, r, NET_DHCP_REPLY_MAX - 1, &info), -ENOBUFS);
        assert_errno(net_dhcp_handle(&c, lookup, NULL, req, len, r, 0, &info), -ENOBUFS);
        assert_int_equal(info.type, NET_DHCP_NONE);
        assert_int_equal(r[0], 0x5a);

        assert_int_equal(net_dhcp_handle(&c, lookup, NULL, req, len, r, NET_DHCP_REPLY_MAX, &info), 326);
        assert_int_equal(r[NET_DHCP_REPLY_MAX], 0x5a);
}

static void test_bad_arguments(void **state) {
        NetDhcpConfig c = config();
        uint8_t req[548], r[NET_DHCP_REPLY_MAX];
        NetDhcpReply info;
        size_t len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });

        assert_errno(net_dhcp_handle(NULL, lookup, NULL, req, len, r, sizeof(r), &info), -EINVAL);
        assert_errno(net_dhcp_handle(&c, NULL, NULL, req, len, r, sizeof(r), &info), -EINVAL);
        assert_errno(net_dhcp_handle(&c, lookup, NULL, NULL, len, r, sizeof(r), &info), -EINVAL);
        assert_errno(net_dhcp_handle(&c, lookup, NULL, req, len, NULL, sizeof(r), &info), -EINVAL);
        assert_errno(net_dhcp_handle(&c, lookup, NULL, req, len, r, sizeof(r), NULL), -EINVAL);
}

static ssize_t discover_with(const NetDhcpConfig *c, uint8_t r[static NET_DHCP_REPLY_MAX]) {
        uint8_t req[548];
        NetDhcpReply info;
        size_t len = build_request(req, sizeof(req), &(TestRequest){ .type = NET_DHCP_DISCOVER });

        return handle_full(c, lookup, NULL, req, len, r, &info);
}

static void test_search_domain(void **state) {
        static const uint8_t corp[] = { 4,   'c', 'o', 'r', 'p', 7,   'e', 'x', 'a',
                                        'm', 'p', 'l', 'e', 3,   'c', 'o', 'm', 0 };
        static const char *const names[] = { "corp.example.com", "corp.example.com." };
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX];
        const uint8_t *v;
        size_t l;
        ssize_t n;

        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                c.search_domain = names[i];
                n = discover_with(&c, r);
                assert_true(n >= 300);
                v = find_option(r, (size_t) n, 119, &l);
                assert_non_null(v);
                assert_int_equal(l, sizeof(corp));
                assert_memory_equal(v, corp, sizeof(corp));
                v = find_option(r, (size_t) n, 15, &l);
                assert_non_null(v);
                assert_int_equal(l, strlen("corp.example.com"));
                assert_memory_equal(v, "corp.example.com", l);
        }

        c.search_domain = "lan";
        n = discover_with(&c, r);
        v = find_option(r, (size_t) n, 119, &l);
        assert_non_null(v);
        assert_int_equal(l, 5);
        assert_memory_equal(v, "\3lan\0", 5);

        /* None: neither 119 nor 15. */
        c.search_domain = NULL;
        n = discover_with(&c, r);
        assert_int_equal(n, 300);
        assert_null(find_option(r, (size_t) n, 119, &l));
        assert_null(find_option(r, (size_t) n, 15, &l));
        c.search_domain = "";
        n = discover_with(&c, r);
        assert_int_equal(n, 300);
        assert_null(find_option(r, (size_t) n, 119, &l));
        assert_null(find_option(r, (size_t) n, 15, &l));
}

static void test_search_domain_limits(void **state) {
        char label63[64], label64[65], longest[254], too_long[255], buf[300];
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX];
        const uint8_t *v;
        size_t l;
        ssize_t n;

        memset(label63, 'a', 63);
        label63[63] = 0;
        memset(label64, 'b', 64);
        label64[64] = 0;

        /* 63 + 1 + 63 + 1 + 63 + 1 + 61 = 253 characters, 255 bytes on the wire. */
        snprintf(longest, sizeof(longest), "%s.%s.%s.%.61s", label63, label63, label63, label63);
        assert_int_equal(strlen(longest), 253);
        snprintf(too_long, sizeof(too_long), "%s.%s.%s.%.62s", label63, label63, label63, label63);
        assert_int_equal(strlen(too_long), 254);

        c.search_domain = label63;
        n = discover_with(&c, r);
        v = find_option(r, (size_t) n, 119, &l);
        assert_non_null(v);
        assert_int_equal(l, 65);
        assert_int_equal(v[0], 63);
        assert_int_equal(v[64], 0);

        /* The longest name: option 119 is full, option 15 no longer fits and is left out. */
        c.search_domain = longest;
        n = discover_with(&c, r);
        assert_true(n > 300 && n <= NET_DHCP_REPLY_MAX);
        assert_true(n <= 548);
        v = find_option(r, (size_t) n, 119, &l);
        assert_non_null(v);
        assert_int_equal(l, 255);
        assert_int_equal(v[0], 63);
        assert_int_equal(v[64], 63);
        assert_int_equal(v[192], 61);
        assert_int_equal(v[254], 0);
        assert_null(find_option(r, (size_t) n, 15, &l));
        assert_non_null(find_option(r, (size_t) n, 26, &l));
        assert_int_equal(r[n - 1], 255);

        /* The same with a trailing dot. */
        snprintf(buf, sizeof(buf), "%s.", longest);
        c.search_domain = buf;
        assert_int_equal(discover_with(&c, r), n);

        /* Names that cannot be encoded are a configuration error, whatever the request. */
        c.search_domain = too_long;
        assert_errno(discover_with(&c, r), -EINVAL);
        c.search_domain = label64;
        assert_errno(discover_with(&c, r), -EINVAL);
        snprintf(buf, sizeof(buf), "dev.%s.com", label64);
        c.search_domain = buf;
        assert_errno(discover_with(&c, r), -EINVAL);
        c.search_domain = "dev..example.com";
        assert_errno(discover_with(&c, r), -EINVAL);
        c.search_domain = ".example.com";
        assert_errno(discover_with(&c, r), -EINVAL);
        c.search_domain = "example.com..";
        assert_errno(discover_with(&c, r), -EINVAL);
        c.search_domain = ".";
        assert_errno(discover_with(&c, r), -EINVAL);
        assert_errno(handle_full(&c, lookup, NULL, (const uint8_t *) "x", 1, r, &(NetDhcpReply){}), -EINVAL);
}

static void test_lease_times(void **state) {
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX];
        const uint8_t *v;
        size_t l;
        ssize_t n;

        c.lease_seconds = 86400;
        n = discover_with(&c, r);
        v = find_option(r, (size_t) n, 51, &l);
        assert_int_equal(ntohl(get_be32(v)), 86400);
        v = find_option(r, (size_t) n, 58, &l);
        assert_int_equal(ntohl(get_be32(v)), 43200);
        v = find_option(r, (size_t) n, 59, &l);
        assert_int_equal(ntohl(get_be32(v)), 75600);

        /* No overflow in 7/8 of the largest (infinite) lease. */
        c.lease_seconds = UINT32_MAX;
        n = discover_with(&c, r);
        v = find_option(r, (size_t) n, 51, &l);
        assert_int_equal(ntohl(get_be32(v)), UINT32_MAX);
        v = find_option(r, (size_t) n, 58, &l);
        assert_int_equal(ntohl(get_be32(v)), UINT32_MAX / 2);
        v = find_option(r, (size_t) n, 59, &l);
        assert_int_equal(ntohl(get_be32(v)), 3758096383U);
}

static void test_mtu_unset(void **state) {
        NetDhcpConfig c = config();
        uint8_t r[NET_DHCP_REPLY_MAX];
        size_t l;
        ssize_t n;

        c.mtu = 9000;
        n = discover_with(&c, r);
        assert_memory_equal(find_option(r, (size_t) n, 26, &l), "\x23\x28", 2);
        assert_int_equal(l, 2);

        c.mtu = 0;
        n = discover_with(&c, r);
        assert_int_equal(n, 322);
        assert_null(find_option(r, (size_t) n, 26, &l));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_discover_offer),
                cmocka_unit_test(test_discover_flags_giaddr),
                cmocka_unit_test(test_request_selecting),
                cmocka_unit_test(test_request_init_reboot),
                cmocka_unit_test(test_request_other_ip_nak),
                cmocka_unit_test(test_request_foreign_server),
                cmocka_unit_test(test_renew_unicast),
                cmocka_unit_test(test_inform),
                cmocka_unit_test(test_no_reply_types),
                cmocka_unit_test(test_unknown_mac),
                cmocka_unit_test(test_lookup_error),
                cmocka_unit_test(test_not_for_us),
                cmocka_unit_test(test_malformed),
                cmocka_unit_test(test_option_framing),
                cmocka_unit_test(test_truncated),
                cmocka_unit_test(test_small_buffer),
                cmocka_unit_test(test_bad_arguments),
                cmocka_unit_test(test_search_domain),
                cmocka_unit_test(test_search_domain_limits),
                cmocka_unit_test(test_lease_times),
                cmocka_unit_test(test_mtu_unset),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
