/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth-fetch.h"
#include "http-curl.h"
#include "log.h"

struct AuthFetcher {
        CurlGlue *glue;
        AuthFetch *fetches;
};

struct AuthFetch {
        AuthFetcher *fetcher;
        CURL *easy;
        struct curl_slist *headers;
        char *url, *form, *userpwd;
        char *body;
        size_t size;
        bool too_large;
        bool allow_private;
        const char *private_flag;
        char refused[INET6_ADDRSTRLEN + 1]; /* the address the SSRF guard refused, if it did */
        AuthFetchDone done;
        void *userdata;
        AuthFetch *prev, *next;
};

static bool v4_is_private(uint32_t a) {
        static const struct {
                uint32_t net, mask;
        } ranges[] = {
                { 0x00000000, 0xff000000 }, /* 0.0.0.0/8 "this network" */
                { 0x0a000000, 0xff000000 }, /* 10/8 */
                { 0x64400000, 0xffc00000 }, /* 100.64/10 CGNAT */
                { 0x7f000000, 0xff000000 }, /* 127/8 loopback */
                { 0xa9fe0000, 0xffff0000 }, /* 169.254/16 link-local, cloud metadata */
                { 0xac100000, 0xfff00000 }, /* 172.16/12 */
                { 0xc0000000, 0xffffff00 }, /* 192.0.0/24 IETF */
                { 0xc0000200, 0xffffff00 }, /* 192.0.2/24 TEST-NET-1 */
                { 0xc0a80000, 0xffff0000 }, /* 192.168/16 */
                { 0xc6120000, 0xfffe0000 }, /* 198.18/15 benchmarking */
                { 0xc6336400, 0xffffff00 }, /* 198.51.100/24 TEST-NET-2 */
                { 0xcb007100, 0xffffff00 }, /* 203.0.113/24 TEST-NET-3 */
                { 0xe0000000, 0xf0000000 }, /* 224/4 multicast */
                { 0xf0000000, 0xf0000000 }, /* 240/4 reserved, broadcast */
        };

        for (size_t i = 0; i < ELEMENTSOF(ranges); i++)
                if ((a & ranges[i].mask) == ranges[i].net)
                        return true;
        return false;
}

bool auth_address_is_private(const struct sockaddr *sa, socklen_t len) {
        if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
                return v4_is_private(ntohl(((const struct sockaddr_in *) sa)->sin_addr.s_addr));
        if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
                const uint8_t *b = ((const struct sockaddr_in6 *) sa)->sin6_addr.s6_addr;
                static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
                static const uint8_t nat64[12] = { 0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0 };
                static const uint8_t zero[15] = {};

                if (memcmp(b, mapped, 12) == 0 || memcmp(b, nat64, 12) == 0)
                        return v4_is_private(
                                (uint32_t) b[12] << 24 | (uint32_t) b[13] << 16 | (uint32_t) b[14] << 8 |
                                b[15]);
                if (memcmp(b, zero, 15) == 0) /* :: and ::1 */
                        return b[15] <= 1;
                if ((b[0] & 0xfe) == 0xfc) /* fc00::/7 unique local */
                        return true;
                if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) /* fe80::/10 link-local */
                        return true;
                if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) /* fec0::/10 site-local (deprecated) */
                        return true;
                if (b[0] == 0xff) /* multicast */
                        return true;
                if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8) /* 2001:db8::/32 */
                        return true;
                return false;
        }
        return true; /* anything else is no address of the Internet */
}

bool auth_url_is_acceptable(const char *url) {
        const char *host, *end;

        if (!url)
                return false;
        if (startswith(url, "https://"))
                return url[8] != 0 && url[8] != '/';
        host = startswith(url, "http://");
        if (!host)
                return false;
        end = host + strcspn(host, "/?#");
        if (host[0] == '[')
                return strneq(host, "[::1]", 5) && (host + 5 == end || host[5] == ':');
        for (const char *p = host; p < end; p++)
                if (*p == '@') /* userinfo: refuse rather than parse */
                        return false;
        {
                size_t n = strcspn(host, ":/?#");
                _cleanup_free_ char *name = strndup(host, n);
                struct in_addr a;

                if (!name)
                        return false;
                if (strcasecmp(name, "localhost") == 0)
                        return true;
                return inet_pton(AF_INET, name, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
        }
}

int auth_fetcher_new(AuthFetcher **ret, sd_event *event, const char *ca_file) {
        _cleanup_(auth_fetcher_freep) AuthFetcher *f = NULL;
        int r;

        assert_return(ret && event, -EINVAL);

        f = calloc(1, sizeof(AuthFetcher));
        if (!f)
                return -ENOMEM;
        /* the system's roots and ca_file, built into one store off the loop */
        r = curl_glue_new(&f->glue, event, "auth-curl", ca_file);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(f);
        return 0;
}

static AuthFetch *fetch_free(AuthFetch *x) {
        AuthFetcher *f;

        if (!x)
                return NULL;
        f = x->fetcher;
        if (f) {
                if (x->prev)
                        x->prev->next = x->next;
                else
                        f->fetches = x->next;
                if (x->next)
                        x->next->prev = x->prev;
                curl_glue_remove(f->glue, x->easy);
        }
        if (x->easy)
                curl_easy_cleanup(x->easy);
        curl_slist_free_all(x->headers);
        free(x->url);
        free(x->form);
        if (x->userpwd)
                explicit_bzero(x->userpwd, strlen(x->userpwd));
        free(x->userpwd);
        free(x->body);
        free(x);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(AuthFetch *, fetch_free);

AuthFetcher *auth_fetcher_free(AuthFetcher *f) {
        if (!f)
                return NULL;
        while (f->fetches)
                fetch_free(f->fetches);
        f->glue = curl_glue_free(f->glue);
        free(f);
        return NULL;
}

void auth_fetch_cancel(AuthFetch *x) {
        fetch_free(x);
}

static size_t on_write(char *p, size_t size, size_t n, void *userdata) {
        AuthFetch *x = userdata;
        size_t k = size * n;
        char *b;

        if (x->size + k > AUTH_FETCH_MAX_BODY) {
                x->too_large = true;
                return 0; /* aborts the transfer */
        }
        b = realloc(x->body, x->size + k + 1);
        if (!b)
                return 0;
        memcpy(b + x->size, p, k);
        x->size += k;
        b[x->size] = 0;
        x->body = b;
        return k;
}

/* The SSRF guard: runs for every address libcurl is about to connect to. */
static curl_socket_t on_open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *a) {
        AuthFetch *x = clientp;

        if (!x->allow_private && auth_address_is_private(&a->addr, a->addrlen)) {
                const void *in = a->family == AF_INET6 ?
                        (const void *) &((struct sockaddr_in6 *) &a->addr)->sin6_addr :
                        (const void *) &((struct sockaddr_in *) &a->addr)->sin_addr;
                if (!inet_ntop(a->family, in, x->refused, sizeof(x->refused)))
                        snprintf(x->refused, sizeof(x->refused), "(family %d)", a->family);
                return CURL_SOCKET_BAD;
        }
        return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

static void on_done(CurlGlue *g, CURL *easy, CURLcode result, void *userdata) {
        _cleanup_(fetch_freep) AuthFetch *x = userdata;
        _cleanup_free_ char *error = NULL;
        json_auto_t *body = NULL;
        long status = 0;

        (void) curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
        if (x->refused[0])
                asprintf_or_null(
                        &error,
                        "%s: refusing to connect to the non-public address %s (allow it with --%s)",
                        x->url,
                        x->refused,
                        x->private_flag ?: "allow-private-oauth-urls");
        else if (x->too_large)
                asprintf_or_null(
                        &error, "%s: the answer is larger than %zu bytes", x->url, AUTH_FETCH_MAX_BODY);
        else if (result != CURLE_OK)
                asprintf_or_null(&error, "%s: %s", x->url, curl_easy_strerror(result));
        if (error || result != CURLE_OK || x->too_large) {
                x->done(-EHOSTUNREACH, 0, NULL, error ?: "out of memory", x->userdata);
                return;
        }
        if (x->body)
                body = json_loadb(x->body, x->size, JSON_REJECT_DUPLICATES, NULL);
        x->done(0, status, body, NULL, x->userdata);
}

int auth_fetch(AuthFetcher *f, const AuthFetchRequest *req, AuthFetchDone done, void *userdata, AuthFetch **ret) {
        _cleanup_(fetch_freep) AuthFetch *x = NULL;
        CURLcode c = CURLE_OK;
        struct curl_slist *l;
        int r;

        assert_return(f && req && req->url && done, -EINVAL);

        x = calloc(1, sizeof(AuthFetch));
        if (!x)
                return -ENOMEM;
        x->done = done;
        x->userdata = userdata;
        x->allow_private = req->allow_private;
        x->private_flag = req->private_flag;
        x->url = strdup(req->url);
        x->easy = curl_easy_init();
        if (!x->url || !x->easy)
                return -ENOMEM;
        if (req->form && !(x->form = strdup(req->form)))
                return -ENOMEM;
        if (req->user) {
                /* CURLOPT_USERNAME/PASSWORD: no colon parsing; the values are form-encoded per RFC 6749 2.3.1 */
                char *u = curl_easy_escape(x->easy, req->user, 0),
                     *p = curl_easy_escape(x->easy, req->password ?: "", 0);
                if (u && p)
                        asprintf_or_null(&x->userpwd, "%s:%s", u, p);
                curl_free(u);
                curl_free(p);
                if (!x->userpwd)
                        return -ENOMEM;
        }
        l = curl_slist_append(NULL, "Accept: application/json");
        if (!l)
                return -ENOMEM;
        x->headers = l;

        c = curl_easy_setopt(x->easy, CURLOPT_URL, x->url);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_PROTOCOLS_STR, "http,https");
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_FOLLOWLOCATION, 0L);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->headers);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_USERAGENT, "vm-manager");
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, (long) AUTH_FETCH_TIMEOUT_MS);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_CONNECTTIMEOUT_MS, (long) AUTH_FETCH_CONNECT_TIMEOUT_MS);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t) AUTH_FETCH_MAX_BODY);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, on_write);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
        if (c == CURLE_OK)
                c = curl_easy_setopt(x->easy, CURLOPT_OPENSOCKETDATA, x);
        if (c == CURLE_OK && x->form) {
                c = curl_easy_setopt(x->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) strlen(x->form));
                if (c == CURLE_OK)
                        c = curl_easy_setopt(x->easy, CURLOPT_POSTFIELDS, x->form);
        }
        if (c == CURLE_OK && x->userpwd) {
                c = curl_easy_setopt(x->easy, CURLOPT_HTTPAUTH, (long) CURLAUTH_BASIC);
                if (c == CURLE_OK)
                        c = curl_easy_setopt(x->easy, CURLOPT_USERPWD, x->userpwd);
        }
        if (c != CURLE_OK) {
                log_debug("Failed to set up the request to %s: %s", x->url, curl_easy_strerror(c));
                return -EIO;
        }
        r = curl_glue_add(f->glue, x->easy, on_done, x);
        if (r < 0)
                return r;

        x->fetcher = f;
        x->next = f->fetches;
        if (f->fetches)
                f->fetches->prev = x;
        f->fetches = x;
        if (ret)
                *ret = x;
        TAKE_PTR(x);
        return 0;
}
