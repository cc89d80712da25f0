/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <endian.h>
#include <errno.h>
#include <string.h>

#include "macro.h"
#include "net-dhcp.h"

/* The fixed BOOTP header (RFC 951, RFC 2131 §2), then the magic cookie and the options. */
#define BOOTP_OP 0
#define BOOTP_HTYPE 1
#define BOOTP_HLEN 2
#define BOOTP_XID 4
#define BOOTP_FLAGS 10
#define BOOTP_CIADDR 12
#define BOOTP_YIADDR 16
#define BOOTP_GIADDR 24
#define BOOTP_CHADDR 28 /* 16 bytes, then sname (64) and file (128), zero in our replies */
#define BOOTP_HEADER_LEN 236
#define DHCP_COOKIE_OFFSET BOOTP_HEADER_LEN
#define DHCP_OPTIONS_OFFSET (DHCP_COOKIE_OFFSET + 4)

#define BOOTREQUEST 1
#define BOOTREPLY 2
#define BOOTP_HTYPE_ETHERNET 1
#define BOOTP_FLAG_BROADCAST 0x80 /* high bit of the flags field, first byte in network order */
#define BOOTP_MIN_LEN 300         /* the legacy BOOTP length; some clients drop anything shorter */

/* Our replies stay within the 548 bytes of DHCP message that fit a 576-byte IPv4 datagram (the
 * minimum every client must accept, RFC 2131 §2), below NET_DHCP_REPLY_MAX. */
#define DHCP_REPLY_LIMIT (576 - 20 - 8)
_Static_assert(DHCP_REPLY_LIMIT <= NET_DHCP_REPLY_MAX, "a reply must fit the caller's buffer");

enum {
        DHCP_OPTION_PAD = 0,
        DHCP_OPTION_SUBNET_MASK = 1,
        DHCP_OPTION_ROUTER = 3,
        DHCP_OPTION_DNS_SERVER = 6,
        DHCP_OPTION_DOMAIN_NAME = 15,
        DHCP_OPTION_MTU = 26,
        DHCP_OPTION_REQUESTED_IP = 50,
        DHCP_OPTION_LEASE_TIME = 51,
        DHCP_OPTION_MESSAGE_TYPE = 53,
        DHCP_OPTION_SERVER_ID = 54,
        DHCP_OPTION_RENEWAL_TIME = 58,
        DHCP_OPTION_REBINDING_TIME = 59,
        DHCP_OPTION_DOMAIN_SEARCH = 119,
        DHCP_OPTION_END = 255,
};

static const uint8_t dhcp_cookie[4] = { 99, 130, 83, 99 };

/* A domain name in DNS wire format: at most 253 characters as text, 255 bytes as labels. */
#define DNS_NAME_TEXT_MAX 253
#define DNS_NAME_WIRE_MAX (DNS_NAME_TEXT_MAX + 2)
#define DNS_LABEL_MAX 63

/* What the answer depends on, out of a request. Pointers are into the request. */
typedef struct DhcpRequest {
        const uint8_t *header; /* BOOTP_HEADER_LEN bytes */
        uint8_t type;          /* option 53, 0 when absent */
        bool has_requested_ip, has_server_id;
        uint32_t requested_ip, server_id; /* be32 */
} DhcpRequest;

static uint32_t read_be32_raw(const uint8_t *p) {
        uint32_t v;

        /* Addresses stay in network byte order: copy the bytes as they are. */
        memcpy(&v, p, sizeof(v));
        return v;
}

/* Encodes name as uncompressed DNS labels (RFC 1035 §3.1), which is what option 119 carries (RFC
 * 3397) when it holds one domain. One trailing dot is accepted. Returns the encoded length, always
 * the text length without the dot plus 2, or -EINVAL for an empty label, a label longer than 63
 * bytes or a name longer than 253. */
static int dns_name_to_wire(const char *name, uint8_t out[static DNS_NAME_WIRE_MAX]) {
        size_t n = strlen(name), o = 0, start = 0;

        if (n > 0 && name[n - 1] == '.')
                n--;
        if (n == 0 || n > DNS_NAME_TEXT_MAX)
                return -EINVAL;

        for (size_t i = 0; i <= n; i++) {
                size_t l;

                if (i < n && name[i] != '.')
                        continue;

                l = i - start;
                if (l == 0 || l > DNS_LABEL_MAX)
                        return -EINVAL;
                out[o++] = (uint8_t) l;
                memcpy(out + o, name + start, l);
                o += l;
                start = i + 1;
        }
        out[o++] = 0;

        assert(o == n + 2);
        return (int) o;
}

/* Checks the fixed header, the cookie and the option framing, and picks out the options the answer
 * depends on. Returns 0, or -EBADMSG for bytes that are not a DHCP message. Options 50, 53 and 54
 * must have their exact length and appear once (RFC 3396 would concatenate repeats into a value of
 * the wrong length). Option overload (52) is not followed: nothing we need lives in sname or file. */
static int dhcp_request_parse(const uint8_t *p, size_t len, DhcpRequest *ret) {
        DhcpRequest req = { .header = p };
        bool seen_type = false;

        if (len < DHCP_OPTIONS_OFFSET)
                return -EBADMSG;
        if (memcmp(p + DHCP_COOKIE_OFFSET, dhcp_cookie, sizeof(dhcp_cookie)) != 0)
                return -EBADMSG;

        for (size_t i = DHCP_OPTIONS_OFFSET; i < len;) {
                uint8_t code = p[i], olen;
                const uint8_t *v;

                if (code == DHCP_OPTION_PAD) {
                        i++;
                        continue;
                }
                if (code == DHCP_OPTION_END)
                        break;

                /* A missing END is forgiven, an option cut short is not. */
                if (len - i < 2)
                        return -EBADMSG;
                olen = p[i + 1];
                if (len - i - 2 < olen)
                        return -EBADMSG;
                v = p + i + 2;
                i += 2 + (size_t) olen;

                switch (code) {
                case DHCP_OPTION_MESSAGE_TYPE:
                        if (olen != 1 || seen_type)
                                return -EBADMSG;
                        req.type = v[0];
                        seen_type = true;
                        break;
                case DHCP_OPTION_REQUESTED_IP:
                        if (olen != 4 || req.has_requested_ip)
                                return -EBADMSG;
                        req.requested_ip = read_be32_raw(v);
                        req.has_requested_ip = true;
                        break;
                case DHCP_OPTION_SERVER_ID:
                        if (olen != 4 || req.has_server_id)
                                return -EBADMSG;
                        req.server_id = read_be32_raw(v);
                        req.has_server_id = true;
                        break;
                default:
                        break;
                }
        }

        if (!seen_type)
                return -EBADMSG;

        *ret = req;
        return 0;
}

static void option_append(uint8_t *buf, size_t *offset, uint8_t code, const void *data, size_t len) {
        assert(len <= UINT8_MAX);
        /* Room is always left for the END option. */
        assert(*offset + 2 + len + 1 <= DHCP_REPLY_LIMIT);

        buf[*offset] = code;
        buf[*offset + 1] = (uint8_t) len;
        memcpy(buf + *offset + 2, data, len);
        *offset += 2 + len;
}

static void option_append_be32(uint8_t *buf, size_t *offset, uint8_t code, uint32_t be) {
        option_append(buf, offset, code, &be, sizeof(be));
}

static void option_append_u32(uint8_t *buf, size_t *offset, uint8_t code, uint32_t v) {
        option_append_be32(buf, offset, code, htobe32(v));
}

typedef struct DhcpAnswer {
        NetDhcpMessage type;     /* OFFER, ACK or NAK */
        uint32_t yiaddr, ciaddr; /* be32, as written into the reply header */
        bool lease_times;        /* 51, 58 and 59 */
        const uint8_t *search;   /* option 119 value, NULL for none */
        size_t search_len;
} DhcpAnswer;

/* Writes the reply into out (at least DHCP_REPLY_LIMIT bytes) and returns its length, at most
 * DHCP_REPLY_LIMIT: the fixed options take 50 bytes and option 119 at most 257, so everything but
 * option 15 always fits, and option 15 is left out when it does not. */
static size_t dhcp_reply_build(
        const NetDhcpConfig *config, const DhcpRequest *req, const DhcpAnswer *a, uint8_t *out) {
        const uint8_t *h = req->header;
        uint8_t type = (uint8_t) a->type;
        size_t o = DHCP_OPTIONS_OFFSET;

        memset(out, 0, DHCP_REPLY_LIMIT);
        out[BOOTP_OP] = BOOTREPLY;
        out[BOOTP_HTYPE] = BOOTP_HTYPE_ETHERNET;
        out[BOOTP_HLEN] = NET_ETH_ALEN;
        memcpy(out + BOOTP_XID, h + BOOTP_XID, 4);
        memcpy(out + BOOTP_FLAGS, h + BOOTP_FLAGS, 2);
        memcpy(out + BOOTP_CIADDR, &a->ciaddr, 4);
        memcpy(out + BOOTP_YIADDR, &a->yiaddr, 4);
        memcpy(out + BOOTP_GIADDR, h + BOOTP_GIADDR, 4);
        memcpy(out + BOOTP_CHADDR, h + BOOTP_CHADDR, NET_ETH_ALEN);
        memcpy(out + DHCP_COOKIE_OFFSET, dhcp_cookie, sizeof(dhcp_cookie));

        /* A relay can only reach a client that is refused through a broadcast (RFC 2131 §4.3.2). */
        if (a->type == NET_DHCP_NAK && read_be32_raw(h + BOOTP_GIADDR) != 0)
                out[BOOTP_FLAGS] |= BOOTP_FLAG_BROADCAST;

        option_append(out, &o, DHCP_OPTION_MESSAGE_TYPE, &type, 1);
        option_append_be32(out, &o, DHCP_OPTION_SERVER_ID, config->server);

        if (a->type != NET_DHCP_NAK) {
                if (a->lease_times) {
                        uint64_t lease = config->lease_seconds;

                        option_append_u32(out, &o, DHCP_OPTION_LEASE_TIME, (uint32_t) lease);
                        option_append_u32(out, &o, DHCP_OPTION_RENEWAL_TIME, (uint32_t) (lease / 2));
                        option_append_u32(out, &o, DHCP_OPTION_REBINDING_TIME, (uint32_t) (lease * 7 / 8));
                }
                option_append_be32(out, &o, DHCP_OPTION_SUBNET_MASK, config->netmask);
                option_append_be32(out, &o, DHCP_OPTION_ROUTER, config->server);
                option_append_be32(out, &o, DHCP_OPTION_DNS_SERVER, config->server);
                if (config->mtu > 0) {
                        uint16_t mtu = htobe16(config->mtu);
                        option_append(out, &o, DHCP_OPTION_MTU, &mtu, sizeof(mtu));
                }
                if (a->search) {
                        /* The wire form is the text plus 2: the text is the name without its dot. */
                        size_t text_len = a->search_len - 2;

                        option_append(out, &o, DHCP_OPTION_DOMAIN_SEARCH, a->search, a->search_len);
                        if (o + 2 + text_len + 1 <= DHCP_REPLY_LIMIT)
                                option_append(
                                        out, &o, DHCP_OPTION_DOMAIN_NAME, config->search_domain, text_len);
                }
        }

        out[o++] = DHCP_OPTION_END;
        return MAX(o, (size_t) BOOTP_MIN_LEN);
}

ssize_t net_dhcp_handle(
        const NetDhcpConfig *config,
        NetDhcpLookup lookup,
        void *userdata,
        const uint8_t *request,
        size_t len,
        uint8_t *reply,
        size_t reply_size,
        NetDhcpReply *info) {

        uint8_t search[DNS_NAME_WIRE_MAX];
        DhcpAnswer a = {};
        DhcpRequest req;
        uint32_t lease, ciaddr;
        const uint8_t *h;
        size_t n;
        int r;

        assert_return(config, -EINVAL);
        assert_return(lookup, -EINVAL);
        assert_return(request || len == 0, -EINVAL);
        assert_return(reply, -EINVAL);
        assert_return(info, -EINVAL);

        if (reply_size < NET_DHCP_REPLY_MAX)
                return -ENOBUFS;

        /* The configuration is checked whatever the request: a bad search domain is the caller's bug. */
        if (config->search_domain && config->search_domain[0] != 0) {
                r = dns_name_to_wire(config->search_domain, search);
                if (r < 0)
                        return r;
                a.search = search;
                a.search_len = (size_t) r;
        }

        r = dhcp_request_parse(request, len, &req);
        if (r < 0)
                return r;
        h = req.header;

        if (h[BOOTP_OP] != BOOTREQUEST || h[BOOTP_HTYPE] != BOOTP_HTYPE_ETHERNET ||
            h[BOOTP_HLEN] != NET_ETH_ALEN)
                return 0;
        if (req.type != NET_DHCP_DISCOVER && req.type != NET_DHCP_REQUEST && req.type != NET_DHCP_INFORM)
                return 0; /* DECLINE and RELEASE need no answer; the other types are not requests */

        /* The client chose another server's offer (RFC 2131 §4.3.2): not ours to answer. */
        if (req.type == NET_DHCP_REQUEST && req.has_server_id && req.server_id != config->server)
                return 0;

        r = lookup(h + BOOTP_CHADDR, &lease, userdata);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return r;

        ciaddr = read_be32_raw(h + BOOTP_CIADDR);
        switch (req.type) {
        case NET_DHCP_DISCOVER:
                a.type = NET_DHCP_OFFER;
                a.yiaddr = lease;
                a.lease_times = true;
                break;
        case NET_DHCP_REQUEST:
                /* SELECTING and INIT-REBOOT name the address in option 50, RENEWING and REBINDING in
                 * ciaddr. */
                if (req.has_requested_ip ? req.requested_ip != lease : ciaddr != 0 && ciaddr != lease) {
                        a.type = NET_DHCP_NAK;
                        break;
                }
                a.type = NET_DHCP_ACK;
                a.yiaddr = lease;
                a.ciaddr = ciaddr;
                a.lease_times = true;
                break;
        case NET_DHCP_INFORM:
                a.type = NET_DHCP_ACK;
                a.ciaddr = ciaddr;
                break;
        default:
                assert(false);
        }

        n = dhcp_reply_build(config, &req, &a, reply);
        assert(n <= NET_DHCP_REPLY_MAX);

        *info = (NetDhcpReply){
                .type = a.type,
                .yiaddr = a.yiaddr,
                .ciaddr = ciaddr,
                .broadcast = a.type == NET_DHCP_NAK || ciaddr == 0 || (h[BOOTP_FLAGS] & BOOTP_FLAG_BROADCAST),
        };
        memcpy(info->chaddr, h + BOOTP_CHADDR, NET_ETH_ALEN);

        return (ssize_t) n;
}
