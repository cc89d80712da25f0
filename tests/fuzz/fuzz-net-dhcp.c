/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "net-dhcp.h"

/* Whatever a guest sends to port 67, the server answers nothing, refuses it as malformed, or writes
 * a reply that fits NET_DHCP_REPLY_MAX and parses back as a BOOTREPLY to the same client: cookie,
 * option framing, an OFFER, ACK or NAK matching info. Each input runs against a short and the
 * longest encodable search domain. */

static const uint8_t known_macs[2][NET_ETH_ALEN] = {
        { 0x52, 0x54, 0x00, 0x00, 0x00, 0x01 },
        { 0x52, 0x54, 0x00, 0x00, 0x00, 0x02 },
};

static char longest_domain[254];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        /* Labels of 63, 63, 63 and 61 bytes: 253 characters. */
        memset(longest_domain, 'a', 253);
        longest_domain[63] = longest_domain[127] = longest_domain[191] = '.';
        longest_domain[253] = 0;
        return 0;
}

static int lookup(const uint8_t mac[NET_ETH_ALEN], uint32_t *ret_ip, void *userdata) {
        for (size_t i = 0; i < 2; i++)
                if (memcmp(mac, known_macs[i], NET_ETH_ALEN) == 0) {
                        *ret_ip = htonl(0x0a4d0002 + (uint32_t) i);
                        return 0;
                }
        return -ENOENT;
}

static uint32_t get_be32(const uint8_t *p) {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
}

static void check_reply(
        const uint8_t *req, const uint8_t *r, size_t n, const NetDhcpConfig *c, const NetDhcpReply *info) {
        static const uint8_t cookie[4] = { 99, 130, 83, 99 };
        bool seen_type = false, seen_end = false, seen_lease = false;
        uint32_t lease;

        assert(n >= 300 && n <= NET_DHCP_REPLY_MAX);
        assert(r[0] == 2 && r[1] == 1 && r[2] == 6);
        assert(memcmp(r + 4, req + 4, 4) == 0);              /* xid */
        assert(memcmp(r + 28, req + 28, NET_ETH_ALEN) == 0); /* chaddr */
        assert(memcmp(info->chaddr, req + 28, NET_ETH_ALEN) == 0);
        assert(get_be32(r + 16) == info->yiaddr);
        assert(get_be32(r + 20) == 0);
        assert(memcmp(r + 236, cookie, 4) == 0);
        assert(lookup(req + 28, &lease, NULL) == 0);

        for (size_t i = 240; i < n;) {
                uint8_t code = r[i], len;

                if (code == 0) {
                        i++;
                        continue;
                }
                if (code == 255) {
                        seen_end = true;
                        for (i++; i < n; i++)
                                assert(r[i] == 0);
                        break;
                }
                assert(i + 2 <= n);
                len = r[i + 1];
                assert(i + 2 + len <= n);
                switch (code) {
                case 53:
                        assert(len == 1 && !seen_type);
                        assert(r[i + 2] == NET_DHCP_OFFER || r[i + 2] == NET_DHCP_ACK ||
                               r[i + 2] == NET_DHCP_NAK);
                        assert(r[i + 2] == info->type);
                        seen_type = true;
                        break;
                case 54:
                        assert(len == 4 && get_be32(r + i + 2) == c->server);
                        break;
                case 51:
                        assert(len == 4 && info->type != NET_DHCP_NAK);
                        seen_lease = true;
                        break;
                default:
                        break;
                }
                i += 2 + (size_t) len;
        }
        assert(seen_type && seen_end);

        switch (info->type) {
        case NET_DHCP_OFFER:
                assert(info->yiaddr == lease && seen_lease);
                break;
        case NET_DHCP_ACK:
                /* With the lease, or without yiaddr and lease time for an INFORM. */
                assert(info->yiaddr == lease ? seen_lease : info->yiaddr == 0 && !seen_lease);
                break;
        case NET_DHCP_NAK:
                assert(info->yiaddr == 0 && info->broadcast);
                break;
        default:
                assert(false);
        }
        assert(info->ciaddr == get_be32(req + 12));
        assert(info->broadcast || info->ciaddr != 0);
}

static void check_one(const NetDhcpConfig *c, const uint8_t *data, size_t size) {
        NetDhcpReply info = {};
        uint8_t *reply;
        ssize_t n;

        /* Exactly NET_DHCP_REPLY_MAX bytes on the heap, so that writing past it is caught. */
        reply = malloc(NET_DHCP_REPLY_MAX);
        assert(reply);

        n = net_dhcp_handle(c, lookup, NULL, data, size, reply, NET_DHCP_REPLY_MAX, &info);
        assert(n == -EBADMSG || n >= 0);
        if (n > 0)
                check_reply(data, reply, (size_t) n, c, &info);
        free(reply);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        NetDhcpConfig c = {
                .server = htonl(0x0a4d0001),
                .netmask = htonl(0xffffff00),
                .mtu = 1500,
                .lease_seconds = 3600,
                .search_domain = "dev.example.com",
        };
        uint8_t *copy;

        if (size > 4096)
                return 0;

        /* A copy of exactly size bytes, so that reading past the input is caught too. */
        copy = malloc(size ?: 1);
        assert(copy);
        memcpy(copy, data, size);

        check_one(&c, copy, size);
        c.search_domain = longest_domain;
        check_one(&c, copy, size);

        free(copy);
        return 0;
}
