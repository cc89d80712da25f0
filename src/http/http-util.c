/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "http-util.h"
#include "macro.h"

/* The core classifies a failure by its stable code; only here does a code become a status, so the
 * layers below the HTTP surfaces never speak HTTP. */
static const unsigned error_status[_API_ERROR_CODE_MAX] = {
        [API_ERROR_INTERNAL] = 500,  [API_ERROR_NOT_FOUND] = 404,    [API_ERROR_INVALID_REQUEST] = 400,
        [API_ERROR_CONFLICT] = 409,  [API_ERROR_UNSUPPORTED] = 501,  [API_ERROR_TIMEOUT] = 504,
        [API_ERROR_VM_FAILED] = 500, [API_ERROR_UNAUTHORIZED] = 401,
};

unsigned http_status_from_error(const ApiError *e) {
        assert(e);
        /* A body over its limit is still an invalid request, but HTTP has a precise status for it. */
        if (e->code == API_ERROR_INVALID_REQUEST && (e->error == -EFBIG || e->error == -E2BIG))
                return 413;
        if (e->code < 0 || e->code >= _API_ERROR_CODE_MAX)
                return 500;
        return error_status[e->code];
}

/* ":port" or nothing. */
static bool port_suffix_ok(const char *s, size_t len) {
        if (len == 0)
                return true;
        if (s[0] != ':' || len < 2 || len > 6)
                return false;
        for (size_t i = 1; i < len; i++)
                if (s[i] < '0' || s[i] > '9')
                        return false;
        return true;
}

static bool in6_is_loopback(const struct in6_addr *a) {
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

bool http_host_is_loopback(const char *host, size_t len) {
        char buf[INET6_ADDRSTRLEN + 1];
        const char *end;
        size_t n;

        if (!host || len == 0)
                return false;

        if (host[0] == '[') {
                struct in6_addr a6;

                end = memchr(host, ']', len);
                if (!end)
                        return false;
                n = (size_t) (end - host) - 1;
                if (n == 0 || n >= sizeof(buf))
                        return false;
                memcpy(buf, host + 1, n);
                buf[n] = 0;
                if (!port_suffix_ok(end + 1, len - (size_t) (end + 1 - host)))
                        return false;
                return inet_pton(AF_INET6, buf, &a6) == 1 && in6_is_loopback(&a6);
        }

        end = memchr(host, ':', len);
        n = end ? (size_t) (end - host) : len;
        if (end && !port_suffix_ok(end, len - n))
                return false;
        if (n == strlen("localhost") && strncasecmp(host, "localhost", n) == 0)
                return true;
        if (n == 0 || n >= sizeof(buf))
                return false;
        memcpy(buf, host, n);
        buf[n] = 0;

        struct in_addr a4;
        /* inet_pton takes dotted quads only: "127.1" or "0x7f.1" are names, not addresses */
        return inet_pton(AF_INET, buf, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127;
}

bool http_origin_is_loopback(const char *origin) {
        const char *p;

        if (!origin)
                return false;
        p = strstr(origin, "://");
        if (!p || p == origin)
                return false;
        for (const char *c = origin; c < p; c++)
                if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.", *c))
                        return false;
        p += 3;
        return http_host_is_loopback(p, strcspn(p, "/"));
}

bool http_content_type_is_json(const char *ct) {
        static const char want[] = "application/json";
        size_t n;

        if (!ct)
                return false;
        ct += strspn(ct, " \t");
        n = strcspn(ct, "; \t");
        if (n != strlen(want) || strncasecmp(ct, want, n) != 0)
                return false;
        ct += n;
        ct += strspn(ct, " \t");
        return *ct == 0 || *ct == ';';
}

bool http_sockaddr_is_loopback(const struct sockaddr *sa, socklen_t len) {
        if (!sa)
                return false;
        if (sa->sa_family == AF_INET && len >= (socklen_t) sizeof(struct sockaddr_in))
                return (ntohl(((const struct sockaddr_in *) sa)->sin_addr.s_addr) >> 24) == 127;
        if (sa->sa_family == AF_INET6 && len >= (socklen_t) sizeof(struct sockaddr_in6))
                return in6_is_loopback(&((const struct sockaddr_in6 *) sa)->sin6_addr);
        return false;
}

bool http_sockaddr_peer(const struct sockaddr *sa, socklen_t len, char ret[static HTTP_PEER_MAX]) {
        char host[INET6_ADDRSTRLEN];

        if (!sa)
                return false;
        if (sa->sa_family == AF_INET && len >= (socklen_t) sizeof(struct sockaddr_in)) {
                if (!inet_ntop(AF_INET, &((const struct sockaddr_in *) sa)->sin_addr, host, sizeof(host)))
                        return false;
                snprintf(ret, HTTP_PEER_MAX, "%s", host);
                return true;
        }
        if (sa->sa_family == AF_INET6 && len >= (socklen_t) sizeof(struct sockaddr_in6)) {
                struct in6_addr a = ((const struct sockaddr_in6 *) sa)->sin6_addr;

                if (IN6_IS_ADDR_V4MAPPED(&a)) {
                        if (!inet_ntop(AF_INET, &a.s6_addr[12], host, sizeof(host)))
                                return false;
                        snprintf(ret, HTTP_PEER_MAX, "%s", host);
                        return true;
                }
                if (IN6_IS_ADDR_LOOPBACK(&a)) {
                        snprintf(ret, HTTP_PEER_MAX, "::1");
                        return true;
                }
                memset(&a.s6_addr[8], 0, 8);
                if (!inet_ntop(AF_INET6, &a, host, sizeof(host)))
                        return false;
                snprintf(ret, HTTP_PEER_MAX, "%s/64", host);
                return true;
        }
        return false;
}

/* The NUL bytes libmicrohttpd wrote over a line end at p ("\r\n" or "\n"), and what else is there:
 * returns the first byte that is not NUL, or end. */
static const char *skip_nul(const char *p, const char *end) {
        while (p < end && *p == 0)
                p++;
        return p;
}

static int head_fail(int error, size_t field, size_t *reterr_field) {
        if (reterr_field)
                *reterr_field = field;
        return error;
}

int http_head_check(const HttpHead *h, size_t *reterr_field) {
        const char *end, *p, *q;

        if (!h || !h->start || !h->version)
                return head_fail(-EPROTO, HTTP_HEAD_REQUEST_LINE, reterr_field);
        end = h->start + h->size;
        if (h->version <= h->start || (size_t) (end - h->version) < strlen("HTTP/1.1"))
                return head_fail(-EPROTO, HTTP_HEAD_REQUEST_LINE, reterr_field);

        /* The request line: method, NUL (its first space), more spaces, target, NUL, version. */
        p = h->start + strnlen(h->start, (size_t) (h->version - h->start));
        if (h->target) {
                if (h->target <= p || h->target >= h->version)
                        return head_fail(-EPROTO, HTTP_HEAD_REQUEST_LINE, reterr_field);
                for (q = p + 1; q < h->target; q++)
                        if (*q != ' ')
                                return head_fail(-EBADMSG, HTTP_HEAD_REQUEST_LINE, reterr_field);
                if (h->target_len != (size_t) (h->version - h->target) - 1)
                        return head_fail(-EBADMSG, HTTP_HEAD_REQUEST_LINE, reterr_field);
        }
        p = h->version + strnlen(h->version, (size_t) (end - h->version));

        for (size_t i = 0; i < h->n_fields; i++) {
                const HttpHeadField *f = &h->fields[i];
                size_t prev = i > 0 ? i - 1 : HTTP_HEAD_REQUEST_LINE;

                /* Each field in place, after the one before it, its value after its name. */
                if (!f->name || !f->value || f->name <= p || f->name >= end ||
                    f->name_len >= (size_t) (end - f->name) || f->value <= f->name + f->name_len ||
                    f->value > end || f->value_len > (size_t) (end - f->value))
                        return head_fail(-EPROTO, i, reterr_field);
                /* Between the previous line's last byte and this name: that line's end, nothing else. */
                q = skip_nul(p, f->name);
                if (q != f->name || q - p > 2)
                        return head_fail(-EBADMSG, prev, reterr_field);
                if (f->name[f->name_len] != 0)
                        return head_fail(-EPROTO, i, reterr_field);
                for (q = f->name + f->name_len + 1; q < f->value; q++)
                        if (*q != ' ' && *q != '\t')
                                return head_fail(-EBADMSG, i, reterr_field);
                p = f->value + f->value_len;
        }

        /* The last line's end and the empty line's, then the end of the head. */
        q = skip_nul(p, end);
        if (q != end || q - p < 2 || q - p > 4)
                return head_fail(
                        -EBADMSG, h->n_fields > 0 ? h->n_fields - 1 : HTTP_HEAD_REQUEST_LINE, reterr_field);
        return 0;
}
