/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "curl-util.h"
#include "hex-util.h"
#include "oci-auth.h"
#include "oci-digest.h"
#include "oci-registry.h"

#define ERROR_BODY_MAX ((size_t) 64 << 10)
#define TOKEN_BODY_MAX ((size_t) 1 << 20)
#define CONNECT_TIMEOUT_SEC 30L
/* a transfer slower than this for this long counts as a broken connection */
#define LOW_SPEED_BYTES 1024L
#define LOW_SPEED_SEC 60L
/* a transfer that times out this close to the deadline ran out of it (curl may fire a little
 * early): its other limits (connect, low speed) are 30 s and more */
#define DEADLINE_SLACK_USEC (1 * USEC_PER_SEC)
#define BUFFER_SIZE (512L << 10)

struct OciClient {
        CURL *curl;
        char *base; /* "https://host[:port]" */
        char *host;
        char *repository;
        char *username, *password;
        char *authorization; /* the header value in use, or NULL */
        char *ca_file;
        char *user_agent;
        bool plain_http, push;
        uint64_t chunk_size;
        unsigned retries, retry_delay_ms;
        OciProgressFunc progress;
        void *progress_userdata;
        uint64_t bytes_sent, bytes_received;
        bool reached;         /* the registry answered once: a refused connection later is worth a retry */
        usec_t deadline;      /* CLOCK_MONOTONIC, 0: none */
        bool deadline_passed; /* an exchange ended by it: no more attempts, and -ETIMEDOUT */
};

/* One HTTP exchange. */
typedef struct Request {
        const char *method;
        const char *url;
        const char *accept;
        const char *content_type;
        char *content_range;       /* owned */
        uint64_t range_from;       /* GET: "Range: bytes=N-" when > 0 */
        bool follow;               /* follow redirects (blob GETs, which registries send to storage) */
        const char *authorization; /* sent instead of the registry's (the token server's Basic) */
        bool no_auth_retry;
        /* the body: memory, or a file range */
        bool has_body;
        const void *body;
        int body_fd;
        uint64_t body_offset, body_size, body_pos;
        /* the answer's body goes to the sink when the status is 200 or 206, else it is kept */
        int (*sink)(const void *p, size_t n, void *userdata);
        void *sink_userdata;
        size_t keep_max; /* how much of a kept body is wanted; more aborts */
        /* progress of the body going up */
        const char *label, *digest;
        uint64_t progress_base, progress_total;
} Request;

typedef struct Response {
        long status;
        char *location, *range, *content_range, *digest, *content_type, *www_authenticate;
        char *body;
        size_t body_size;
        bool body_too_big;
        int sink_error;
        CURLcode code;
        char errbuf[CURL_ERROR_SIZE];
} Response;

static char *erase(char *s) {
        if (s)
                explicit_bzero(s, strlen(s));
        return mfree(s);
}

static void erase_freep(char **s) {
        *s = erase(*s);
}

static void response_done(Response *r) {
        r->location = mfree(r->location);
        r->range = mfree(r->range);
        r->content_range = mfree(r->content_range);
        r->digest = mfree(r->digest);
        r->content_type = mfree(r->content_type);
        r->www_authenticate = mfree(r->www_authenticate);
        r->body = mfree(r->body);
        r->body_size = 0;
        r->body_too_big = false;
        r->status = 0;
        r->sink_error = 0;
        r->code = CURLE_OK;
        r->errbuf[0] = 0;
}

static void request_done(Request *r) {
        r->content_range = mfree(r->content_range);
}

typedef struct Exchange {
        OciClient *client;
        Request *req;
        Response *resp;
} Exchange;

static size_t on_header(char *buffer, size_t size, size_t n, void *userdata) {
        Response *resp = ((Exchange *) userdata)->resp;
        size_t len = size * n, nlen;
        const char *colon, *v, *end;
        char **dest = NULL;

        if (len >= 5 && strneq(buffer, "HTTP/", 5)) {
                /* a new status line (after a redirect or a 100 Continue): forget the previous headers */
                const char *sp = memchr(buffer, ' ', len);
                resp->location = mfree(resp->location);
                resp->range = mfree(resp->range);
                resp->content_range = mfree(resp->content_range);
                resp->digest = mfree(resp->digest);
                resp->content_type = mfree(resp->content_type);
                resp->www_authenticate = mfree(resp->www_authenticate);
                resp->status = sp && (size_t) (sp - buffer) + 4 <= len ? strtol(sp + 1, NULL, 10) : 0;
                return len;
        }
        colon = memchr(buffer, ':', len);
        if (!colon)
                return len;
        nlen = (size_t) (colon - buffer);
#define HEADER_IS(name) (nlen == strlen(name) && strncasecmp(buffer, name, nlen) == 0)
        if (HEADER_IS("Location"))
                dest = &resp->location;
        else if (HEADER_IS("Range"))
                dest = &resp->range;
        else if (HEADER_IS("Content-Range"))
                dest = &resp->content_range;
        else if (HEADER_IS("Docker-Content-Digest"))
                dest = &resp->digest;
        else if (HEADER_IS("Content-Type"))
                dest = &resp->content_type;
        else if (HEADER_IS("WWW-Authenticate"))
                dest = &resp->www_authenticate;
#undef HEADER_IS
        if (!dest || *dest) /* the first of repeated headers wins */
                return len;
        v = colon + 1;
        end = buffer + len;
        while (v < end && (*v == ' ' || *v == '\t'))
                v++;
        while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
                end--;
        *dest = strndup(v, (size_t) (end - v));
        return *dest ? len : 0;
}

static size_t on_body(char *ptr, size_t size, size_t n, void *userdata) {
        Exchange *x = userdata;
        Response *resp = x->resp;
        Request *req = x->req;
        size_t len = size * n;

        if (req->sink && (resp->status == 200 || resp->status == 206)) {
                int r = req->sink(ptr, len, req->sink_userdata);
                if (r < 0) {
                        resp->sink_error = r;
                        return 0;
                }
                return len;
        }
        if (resp->body_size + len > req->keep_max) {
                resp->body_too_big = true;
                return 0;
        }
        char *b = realloc(resp->body, resp->body_size + len + 1);
        if (!b)
                return 0;
        memcpy(b + resp->body_size, ptr, len);
        resp->body = b;
        resp->body_size += len;
        b[resp->body_size] = 0;
        return len;
}

static size_t on_read(char *buffer, size_t size, size_t n, void *userdata) {
        Exchange *x = userdata;
        Request *req = x->req;
        size_t want = MIN(size * n, (size_t) (req->body_size - req->body_pos));

        if (want == 0)
                return 0;
        if (req->body)
                memcpy(buffer, (const char *) req->body + req->body_pos, want);
        else {
                ssize_t k;
                do
                        k = pread(req->body_fd, buffer, want, (off_t) (req->body_offset + req->body_pos));
                while (k < 0 && errno == EINTR);
                if (k <= 0)
                        return CURL_READFUNC_ABORT;
                want = (size_t) k;
        }
        req->body_pos += want;
        return want;
}

static int on_xferinfo(
        void *userdata, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
        Exchange *x = userdata;
        OciClient *c = x->client;
        Request *req = x->req;

        if (c->progress && req->label && req->has_body && req->body_size > 0 && ulnow > 0)
                c->progress(
                        &(OciProgress){
                                .label = req->label,
                                .digest = req->digest,
                                .done = req->progress_base + (uint64_t) ulnow,
                                .total = req->progress_total,
                        },
                        c->progress_userdata);
        return 0;
}

/* Whether url points at the registry itself (same scheme, host and port), so that it may carry
 * the registry's Authorization header. */
static bool url_is_registry(OciClient *c, const char *url) {
        size_t n = strlen(c->base);
        return strneq(url, c->base, n) && (url[n] == '/' || url[n] == 0);
}

/* Resolves a Location header (absolute, or relative to the request's URL). */
static int resolve_url(const char *base_url, const char *location, char **ret) {
        CURLU *u = curl_url();
        char *out = NULL;
        int r = -EBADMSG;

        if (!u)
                return -ENOMEM;
        if (curl_url_set(u, CURLUPART_URL, base_url, 0) == CURLUE_OK &&
            curl_url_set(u, CURLUPART_URL, location, 0) == CURLUE_OK &&
            curl_url_get(u, CURLUPART_URL, &out, 0) == CURLUE_OK) {
                *ret = strdup(out);
                r = *ret ? 0 : -ENOMEM;
        }
        curl_free(out);
        curl_url_cleanup(u);
        return r;
}

static int perform(OciClient *c, Request *req, Response *resp) {
        _cleanup_(curl_slist_free_allp) struct curl_slist *headers = NULL;
        _cleanup_(erase_freep) char *h_auth = NULL;
        _cleanup_free_ char *h_accept = NULL, *h_type = NULL, *h_range = NULL, *range = NULL;
        Exchange x = { .client = c, .req = req, .resp = resp };
        CURL *h = c->curl;
        struct curl_slist *l;
        const char *protocols = c->plain_http ? "http,https" : "https";

        response_done(resp);
        req->body_pos = 0;
        curl_easy_reset(h);

        if (c->deadline > 0 && now_usec(CLOCK_MONOTONIC) >= c->deadline) {
                c->deadline_passed = true;
                resp->code = CURLE_OPERATION_TIMEDOUT;
                return 0;
        }

#define ADD_HEADER(s)                                \
        do {                                         \
                if (!(s))                            \
                        return -ENOMEM;              \
                l = curl_slist_append(headers, (s)); \
                if (!l)                              \
                        return -ENOMEM;              \
                headers = l;                         \
        } while (0)

        if (req->accept) {
                if (asprintf(&h_accept, "Accept: %s", req->accept) < 0)
                        h_accept = NULL;
                ADD_HEADER(h_accept);
        }
        if (req->content_type) {
                if (asprintf(&h_type, "Content-Type: %s", req->content_type) < 0)
                        h_type = NULL;
                ADD_HEADER(h_type);
        }
        if (req->content_range) {
                if (asprintf(&h_range, "Content-Range: %s", req->content_range) < 0)
                        h_range = NULL;
                ADD_HEADER(h_range);
        }
        if (req->authorization || (c->authorization && url_is_registry(c, req->url))) {
                if (asprintf(&h_auth, "Authorization: %s", req->authorization ?: c->authorization) < 0)
                        h_auth = NULL;
                ADD_HEADER(h_auth);
        }
#undef ADD_HEADER

        (void) curl_easy_setopt(h, CURLOPT_URL, req->url);
        (void) curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        (void) curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, protocols);
        (void) curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, protocols);
        (void) curl_easy_setopt(h, CURLOPT_ERRORBUFFER, resp->errbuf);
        (void) curl_easy_setopt(h, CURLOPT_USERAGENT, c->user_agent);
        (void) curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_SEC);
        (void) curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, LOW_SPEED_BYTES);
        (void) curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, LOW_SPEED_SEC);
        (void) curl_easy_setopt(h, CURLOPT_BUFFERSIZE, BUFFER_SIZE);
        (void) curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, BUFFER_SIZE);
        (void) curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        (void) curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
        (void) curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        (void) curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
        (void) curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
        if (c->deadline > 0)
                (void) curl_easy_setopt(
                        h,
                        CURLOPT_TIMEOUT_MS,
                        (long) MIN(
                                (c->deadline - now_usec(CLOCK_MONOTONIC) + USEC_PER_MSEC - 1) / USEC_PER_MSEC,
                                (usec_t) LONG_MAX));
        if (c->ca_file)
                (void) curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
        if (req->follow) {
                (void) curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
                (void) curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
        }

        if (streq(req->method, "HEAD"))
                (void) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        else if (streq(req->method, "GET")) {
                if (req->range_from > 0) {
                        if (asprintf(&range, "%" PRIu64 "-", req->range_from) < 0)
                                return -ENOMEM;
                        (void) curl_easy_setopt(h, CURLOPT_RANGE, range);
                }
        } else if (streq(req->method, "POST") && !req->has_body) {
                (void) curl_easy_setopt(h, CURLOPT_POST, 1L);
                (void) curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
                (void) curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) 0);
        } else {
                /* PUT and PATCH, with or without a body */
                (void) curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
                (void) curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
                (void) curl_easy_setopt(h, CURLOPT_READDATA, &x);
                (void) curl_easy_setopt(
                        h, CURLOPT_INFILESIZE_LARGE, (curl_off_t) (req->has_body ? req->body_size : 0));
                if (!streq(req->method, "PUT"))
                        (void) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
                if (c->progress && req->label) {
                        (void) curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
                        (void) curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_xferinfo);
                        (void) curl_easy_setopt(h, CURLOPT_XFERINFODATA, &x);
                }
        }

        resp->code = curl_easy_perform(h);
        if (resp->code == CURLE_OPERATION_TIMEDOUT && c->deadline > 0 &&
            now_usec(CLOCK_MONOTONIC) + DEADLINE_SLACK_USEC >= c->deadline)
                c->deadline_passed = true;
        if (resp->code == CURLE_OK) {
                long status = 0;
                (void) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
                resp->status = status;
        }
        if (resp->status > 0 && url_is_registry(c, req->url))
                c->reached = true;
        return 0;
}

/* Whether a failed exchange is worth another attempt: the connection broke or stalled, or the
 * registry answered 5xx/429. */
static bool retryable(const OciClient *c, const Response *resp) {
        if (c->deadline_passed)
                return false;
        switch (resp->code) {
        case CURLE_OK:
                return resp->status >= 500 || resp->status == 429;
        case CURLE_COULDNT_CONNECT:
                /* a registry that never answered is more likely a wrong address than a hiccup */
                return c->reached;
        case CURLE_SEND_ERROR:
        case CURLE_RECV_ERROR:
        case CURLE_PARTIAL_FILE:
        case CURLE_GOT_NOTHING:
        case CURLE_OPERATION_TIMEDOUT:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
                return resp->sink_error == 0;
        default:
                return false;
        }
}

static void pause_before_retry(OciClient *c, unsigned attempt) {
        uint64_t ms = (uint64_t) c->retry_delay_ms << MIN(attempt, 4U);
        usec_t now = now_usec(CLOCK_MONOTONIC);

        /* no pause past the deadline: the next attempt then fails at once */
        if (c->deadline > 0)
                ms = MIN(ms, c->deadline > now ? (c->deadline - now + USEC_PER_MSEC - 1) / USEC_PER_MSEC : 0);
        struct timespec ts = { .tv_sec = (time_t) (ms / 1000), .tv_nsec = (long) (ms % 1000) * 1000000L };

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

/* What went wrong in an exchange, as one line: the transport error, or the HTTP status with the
 * registry's error code and message. */
static char *describe_failure(OciClient *c, const Response *resp) {
        char *s = NULL;

        if (resp->code != CURLE_OK) {
                const char *hint = "";

                if (resp->code == CURLE_PEER_FAILED_VERIFICATION)
                        hint = " (give the registry's CA certificate with --ca-file)";
                else if (resp->code == CURLE_SSL_CONNECT_ERROR && !c->plain_http)
                        hint = " (a registry without TLS needs --plain-http)";
                else if (resp->code == CURLE_UNSUPPORTED_PROTOCOL && !c->plain_http)
                        hint = " (plain http is used only with --plain-http)";
                asprintf_or_null(
                        &s, "%s%s", resp->errbuf[0] ? resp->errbuf : curl_easy_strerror(resp->code), hint);
                return s;
        }
        if (resp->body && resp->body_size > 0) {
                json_auto_t *v = json_loadb(resp->body, resp->body_size, 0, NULL);
                json_t *e = json_array_get(json_object_get(v, "errors"), 0);
                const char *code = json_string_value(json_object_get(e, "code")),
                           *message = json_string_value(json_object_get(e, "message"));
                if (code || message) {
                        asprintf_or_null(&s, "HTTP %ld %.64s: %.300s", resp->status, code ?: "", message ?: "");
                        return s;
                }
        }
        asprintf_or_null(&s, "HTTP %ld", resp->status);
        return s;
}

/* The failure of an exchange the deadline ended. */
static int fail_deadline(ApiError *reterr, const char *what) {
        return api_error_set(
                reterr, -ETIMEDOUT, API_ERROR_TIMEOUT, "%s: the deadline passed before it completed", what);
}

static int fail_exchange(OciClient *c, const Response *resp, int r, ApiError *reterr, const char *what) {
        _cleanup_free_ char *why = NULL;

        if (c->deadline_passed)
                return fail_deadline(reterr, what);
        why = describe_failure(c, resp);

        if (resp->code == CURLE_OK && resp->status == 404)
                return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "%s: %s", what, why ?: "HTTP 404");
        return api_error_set(reterr, r, API_ERROR_INTERNAL, "%s: %s", what, why ?: "failed");
}

static int append_query(char **url, const char *key, const char *value) {
        CURL *h = NULL;
        char *escaped, *n;
        int r;

        h = curl_easy_init();
        if (!h)
                return -ENOMEM;
        escaped = curl_easy_escape(h, value, 0);
        curl_easy_cleanup(h);
        if (!escaped)
                return -ENOMEM;
        r = asprintf(&n, "%s%s%s=%s", *url, strchr(*url, '?') ? "&" : "?", key, escaped);
        curl_free(escaped);
        if (r < 0)
                return -ENOMEM;
        free(*url);
        *url = n;
        return 0;
}

/* "Basic <base64 of user:password>"; NULL on OOM. */
static char *basic_authorization(OciClient *c) {
        _cleanup_(erase_freep) char *pair = NULL, *b64 = NULL;
        char *v;

        if (asprintf(&pair, "%s:%s", c->username, c->password ?: "") < 0)
                return NULL;
        b64 = base64_encode(pair, strlen(pair));
        if (!b64 || asprintf(&v, "Basic %s", b64) < 0)
                return NULL;
        return v;
}

static int get_token(OciClient *c, const OciChallenge *ch, ApiError *reterr) {
        _cleanup_free_ char *url = strdup(ch->realm), *scope = NULL;
        _cleanup_(erase_freep) char *basic = NULL, *token = NULL;
        _cleanup_(response_done) Response resp = {};
        Request req = { .method = "GET", .keep_max = TOKEN_BODY_MAX };
        int r;

        if (!url)
                return -ENOMEM;
        if (!startswith(url, "https://") && !(c->plain_http && startswith(url, "http://")))
                return api_error_set(
                        reterr,
                        -EPROTO,
                        API_ERROR_INTERNAL,
                        "the registry sends us for a token to '%.200s', which is not https (plain http "
                        "only with --plain-http)",
                        ch->realm);
        if (asprintf(&scope, "repository:%s:%s", c->repository, c->push ? "pull,push" : "pull") < 0)
                return -ENOMEM;
        if ((ch->service && (r = append_query(&url, "service", ch->service)) < 0) ||
            (r = append_query(&url, "scope", scope)) < 0)
                return r;
        /* a scope the registry asked for besides ours (another repository, say) */
        if (ch->scope && !streq(ch->scope, scope) && (r = append_query(&url, "scope", ch->scope)) < 0)
                return r;
        /* the token server gets the credentials as Basic; without any we ask anonymously */
        if (c->username) {
                basic = basic_authorization(c);
                if (!basic)
                        return -ENOMEM;
                req.authorization = basic;
        }
        req.url = url;
        for (unsigned attempt = 0;; attempt++) {
                r = perform(c, &req, &resp);
                if (r < 0)
                        return r;
                if (!retryable(c, &resp) || attempt >= c->retries)
                        break;
                pause_before_retry(c, attempt);
        }
        if (c->deadline_passed)
                return fail_deadline(reterr, "the token request");
        if (resp.code != CURLE_OK || resp.status != 200) {
                _cleanup_free_ char *why = describe_failure(c, &resp);
                return api_error_set(
                        reterr,
                        -EACCES,
                        API_ERROR_INTERNAL,
                        "the token server %.200s refused %s: %s",
                        ch->realm,
                        c->username ? "the credentials" :
                                      "anonymous access (give --username and --password-stdin, or a "
                                      "credentials file)",
                        why ?: "failed");
        }
        r = oci_token_parse(resp.body, resp.body_size, &token);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "the token server %.200s sent no usable token", ch->realm);
        erase(c->authorization);
        if (asprintf(&c->authorization, "Bearer %s", token) < 0) {
                c->authorization = NULL;
                return -ENOMEM;
        }
        return 0;
}

/* Answers a 401: basic credentials, or a token for our repository. */
static int authenticate(OciClient *c, const Response *resp, ApiError *reterr) {
        _cleanup_(oci_challenge_done) OciChallenge ch = OCI_CHALLENGE_NULL;
        int r;

        r = resp->www_authenticate ? oci_challenge_parse(resp->www_authenticate, &ch) : -EBADMSG;
        if (r < 0)
                return api_error_set(
                        reterr,
                        -EACCES,
                        API_ERROR_INTERNAL,
                        "HTTP 401 without a Basic or Bearer challenge the client understands");
        if (ch.scheme == OCI_AUTH_BEARER)
                return get_token(c, &ch, reterr);

        if (!c->username)
                return api_error_set(
                        reterr,
                        -EACCES,
                        API_ERROR_INTERNAL,
                        "HTTP 401: the registry wants credentials; give --username and --password-stdin, "
                        "or a credentials file (DOCKER_CONFIG, REGISTRY_AUTH_FILE)");
        if (c->authorization && startswith(c->authorization, "Basic "))
                return api_error_set(
                        reterr, -EACCES, API_ERROR_INTERNAL, "HTTP 401: the registry refused the credentials");
        erase(c->authorization);
        c->authorization = basic_authorization(c);
        if (!c->authorization)
                return -ENOMEM;
        return 0;
}

/* perform() with authentication: after a 401 it authenticates once and asks again. */
static int request(OciClient *c, Request *req, Response *resp, ApiError *reterr) {
        int r;

        for (unsigned attempt = 0;; attempt++) {
                r = perform(c, req, resp);
                if (r < 0)
                        return r;
                if (resp->code != CURLE_OK || resp->status != 401 || req->no_auth_retry)
                        return 0;
                if (attempt > 0) {
                        _cleanup_free_ char *why = describe_failure(c, resp);
                        if (c->username)
                                return api_error_set(
                                        reterr,
                                        -EACCES,
                                        API_ERROR_INTERNAL,
                                        "%s %s: the registry refused the credentials: %s",
                                        req->method,
                                        req->url,
                                        why ?: "HTTP 401");
                        return api_error_set(
                                reterr,
                                -EACCES,
                                API_ERROR_INTERNAL,
                                "%s %s: the registry refused anonymous access: %s; give --username and "
                                "--password-stdin, or a credentials file",
                                req->method,
                                req->url,
                                why ?: "HTTP 401");
                }
                r = authenticate(c, resp, reterr);
                if (r < 0)
                        return r;
        }
}

/* request() again while the failure is worth another attempt, until the status want comes back:
 * 0 then, else the failure as one message that starts with what. */
static int request_until(
        OciClient *c, Request *req, Response *resp, long want, const char *what, ApiError *reterr) {
        int r;

        for (unsigned attempt = 0;; attempt++) {
                r = request(c, req, resp, reterr);
                if (r < 0)
                        return r;
                if (resp->body_too_big)
                        return api_error_set(
                                reterr,
                                -EFBIG,
                                API_ERROR_INTERNAL,
                                "%s is larger than %zu bytes",
                                what,
                                req->keep_max);
                if (resp->code == CURLE_OK && resp->status == want)
                        return 0;
                if (!retryable(c, resp) || attempt >= c->retries)
                        return fail_exchange(c, resp, -EIO, reterr, what);
                pause_before_retry(c, attempt);
        }
}

/* "<prefix> host/repository:tag" or "…@digest", for messages. NULL on OOM. */
static char *manifest_what(OciClient *c, const char *prefix, const char *reference) {
        char *s;

        if (asprintf(
                    &s,
                    "%s %s/%s%s%s",
                    prefix,
                    c->host,
                    c->repository,
                    oci_digest_is_valid(reference) ? "@" : ":",
                    reference) < 0)
                return NULL;
        return s;
}

int oci_client_new(OciClient **ret, const OciClientConfig *config) {
        _cleanup_(oci_client_freep) OciClient *c = NULL;

        assert_return(ret, -EINVAL);
        assert_return(config && config->host && config->repository, -EINVAL);

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->plain_http = config->plain_http;
        c->push = config->push;
        c->chunk_size = config->chunk_size ?: OCI_CLIENT_CHUNK_DEFAULT;
        c->retries = config->retries ?: OCI_CLIENT_RETRIES_DEFAULT;
        c->retry_delay_ms = config->retry_delay_ms ?: 500;
        c->deadline = config->deadline;
        c->progress = config->progress;
        c->progress_userdata = config->progress_userdata;
        if (asprintf(&c->base, "%s://%s", c->plain_http ? "http" : "https", config->host) < 0) {
                c->base = NULL;
                return -ENOMEM;
        }
        c->host = strdup(config->host);
        c->repository = strdup(config->repository);
        c->user_agent = strdup(config->user_agent ?: "vm-manager");
        if (!c->host || !c->repository || !c->user_agent)
                return -ENOMEM;
        if (config->ca_file && !(c->ca_file = strdup(config->ca_file)))
                return -ENOMEM;
        if (config->username) {
                c->username = strdup(config->username);
                c->password = strdup(config->password ?: "");
                if (!c->username || !c->password)
                        return -ENOMEM;
        }
        c->curl = curl_easy_init();
        if (!c->curl)
                return -ENOMEM;
        *ret = TAKE_PTR(c);
        return 0;
}

OciClient *oci_client_free(OciClient *c) {
        if (!c)
                return NULL;
        if (c->curl)
                curl_easy_cleanup(c->curl);
        free(c->base);
        free(c->host);
        free(c->repository);
        free(c->ca_file);
        free(c->user_agent);
        erase(c->username);
        erase(c->password);
        erase(c->authorization);
        return mfree(c);
}

uint64_t oci_client_bytes_sent(const OciClient *c) {
        return c ? c->bytes_sent : 0;
}

uint64_t oci_client_bytes_received(const OciClient *c) {
        return c ? c->bytes_received : 0;
}

static int repo_url(OciClient *c, const char *kind, const char *reference, char **ret) {
        if (asprintf(ret, "%s/v2/%s/%s/%s", c->base, c->repository, kind, reference ?: "") < 0) {
                *ret = NULL;
                return -ENOMEM;
        }
        return 0;
}

int oci_client_blob_exists(OciClient *c, const char *digest, ApiError *reterr) {
        _cleanup_free_ char *url = NULL, *what = NULL;
        _cleanup_(response_done) Response resp = {};
        Request req = { .method = "HEAD", .follow = true, .keep_max = ERROR_BODY_MAX };
        int r;

        assert_return(c, -EINVAL);
        assert_return(oci_digest_is_valid(digest), -EINVAL);

        r = repo_url(c, "blobs", digest, &url);
        if (r < 0)
                return r;
        req.url = url;
        for (unsigned attempt = 0;; attempt++) {
                r = request(c, &req, &resp, reterr);
                if (r < 0)
                        return r;
                if (resp.code == CURLE_OK && resp.status == 200)
                        return 1;
                if (resp.code == CURLE_OK && resp.status == 404)
                        return 0;
                if (!retryable(c, &resp) || attempt >= c->retries)
                        break;
                pause_before_retry(c, attempt);
        }
        asprintf_or_null(&what, "HEAD of blob %s", digest);
        return fail_exchange(c, &resp, -EIO, reterr, what ?: "HEAD of a blob");
}

static void
        report(OciClient *c,
               const char *label,
               const char *digest,
               uint64_t done,
               uint64_t total,
               bool finished,
               bool existed) {
        if (c->progress && label)
                c->progress(
                        &(OciProgress){
                                .label = label,
                                .digest = digest,
                                .done = done,
                                .total = total,
                                .finished = finished,
                                .existed = existed,
                        },
                        c->progress_userdata);
}

/* Starts an upload session: POST, and the Location to send the data to. */
static int upload_start(OciClient *c, const char *digest, char **ret_location, ApiError *reterr) {
        _cleanup_free_ char *url = NULL, *what = NULL;
        _cleanup_(response_done) Response resp = {};
        Request req = { .method = "POST", .keep_max = ERROR_BODY_MAX };
        int r;

        r = repo_url(c, "blobs/uploads", "", &url);
        if (r < 0)
                return r;
        asprintf_or_null(&what, "starting the upload of blob %s", digest);
        if (!what)
                return -ENOMEM;
        req.url = url;
        r = request_until(c, &req, &resp, 202, what, reterr);
        if (r < 0)
                return r;
        if (!resp.location)
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "%s: HTTP 202 without a Location", what);
        return resolve_url(url, resp.location, ret_location);
}

/* How far an upload got, as the registry says (GET on its URL): 0 and the offset to continue from,
 * or -ENOENT when the registry no longer knows the upload. */
static int upload_status(OciClient *c, char **location, uint64_t *ret_offset, ApiError *reterr) {
        _cleanup_(response_done) Response resp = {};
        Request req = { .method = "GET", .url = *location, .keep_max = ERROR_BODY_MAX };
        uint64_t start, end;
        int r;

        r = request(c, &req, &resp, reterr);
        if (r < 0)
                return r;
        if (resp.code != CURLE_OK || resp.status != 204)
                return -ENOENT;
        if (resp.range) {
                if (sscanf(resp.range, "%" SCNu64 "-%" SCNu64, &start, &end) != 2 || start != 0)
                        return -ENOENT;
                *ret_offset = end + 1;
        } else
                *ret_offset = 0;
        if (resp.location) {
                _cleanup_free_ char *next = NULL;
                r = resolve_url(*location, resp.location, &next);
                if (r < 0)
                        return r;
                free(*location);
                *location = TAKE_PTR(next);
        }
        return 0;
}

static int blob_push(
        OciClient *c,
        int fd,
        const void *data,
        uint64_t size,
        const char *digest,
        const char *label,
        ApiError *reterr) {
        _cleanup_free_ char *location = NULL, *what = NULL;
        _cleanup_(response_done) Response resp = {};
        uint64_t offset = 0;
        unsigned failures = 0;
        int r;

        assert_return(c, -EINVAL);
        assert_return(oci_digest_is_valid(digest), -EINVAL);

        r = oci_client_blob_exists(c, digest, reterr);
        if (r < 0)
                return r;
        if (r > 0) {
                report(c, label, digest, size, size, true, true);
                return 0;
        }
        asprintf_or_null(&what, "upload of blob %s (%s)", digest, label ?: "data");
        if (!what)
                return -ENOMEM;

        r = upload_start(c, digest, &location, reterr);
        if (r < 0)
                return r;

        for (;;) {
                _cleanup_(request_done) Request req = {
                        .has_body = true,
                        .body = data,
                        .body_fd = fd,
                        .keep_max = ERROR_BODY_MAX,
                        .label = label,
                        .digest = digest,
                        .progress_total = size,
                };
                _cleanup_free_ char *url = NULL;
                bool last = size - offset <= c->chunk_size;

                req.body_offset = offset;
                req.body_size = last ? size - offset : c->chunk_size;
                req.progress_base = offset;
                if (last) {
                        /* the rest (all of a small blob) goes with the PUT that completes the upload */
                        url = strdup(location);
                        if (!url || (r = append_query(&url, "digest", digest)) < 0)
                                return -ENOMEM;
                        req.method = "PUT";
                        req.content_type = "application/octet-stream";
                        if (req.body_size == 0)
                                req.has_body = false;
                } else {
                        url = strdup(location);
                        if (!url)
                                return -ENOMEM;
                        req.method = "PATCH";
                        req.content_type = "application/octet-stream";
                        if (asprintf(
                                    &req.content_range,
                                    "%" PRIu64 "-%" PRIu64,
                                    offset,
                                    offset + req.body_size - 1) < 0) {
                                req.content_range = NULL;
                                return -ENOMEM;
                        }
                }
                req.url = url;

                r = request(c, &req, &resp, reterr);
                if (r < 0)
                        return r;
                if (resp.code == CURLE_OK && last && resp.status == 201) {
                        if (resp.digest && !streq(resp.digest, digest))
                                return api_error_set(
                                        reterr,
                                        -EBADMSG,
                                        API_ERROR_INTERNAL,
                                        "%s: the registry stored it as %.80s",
                                        what,
                                        resp.digest);
                        c->bytes_sent += req.body_size;
                        report(c, label, digest, size, size, true, false);
                        return 1;
                }
                if (resp.code == CURLE_OK && !last && resp.status == 202 && resp.location) {
                        _cleanup_free_ char *next = NULL;
                        uint64_t start, end;

                        c->bytes_sent += req.body_size;
                        r = resolve_url(location, resp.location, &next);
                        if (r < 0)
                                return r;
                        free(location);
                        location = TAKE_PTR(next);
                        if (resp.range && sscanf(resp.range, "%" SCNu64 "-%" SCNu64, &start, &end) == 2 &&
                            start == 0 && end + 1 <= size)
                                offset = end + 1;
                        else
                                offset += req.body_size;
                        continue;
                }
                if (!retryable(c, &resp) || ++failures > c->retries)
                        return fail_exchange(c, &resp, -EIO, reterr, what);

                /* the connection broke: continue where the registry got to, or from the start */
                pause_before_retry(c, failures - 1);
                if (last) {
                        r = oci_client_blob_exists(c, digest, NULL);
                        if (r > 0) {
                                report(c, label, digest, size, size, true, false);
                                return 1;
                        }
                }
                r = upload_status(c, &location, &offset, NULL);
                if (r < 0 || offset > size) {
                        location = mfree(location);
                        r = upload_start(c, digest, &location, reterr);
                        if (r < 0)
                                return r;
                        offset = 0;
                }
        }
}

int oci_client_blob_push_fd(
        OciClient *c, int fd, uint64_t size, const char *digest, const char *label, ApiError *reterr) {
        assert_return(fd >= 0, -EBADF);
        return blob_push(c, fd, NULL, size, digest, label, reterr);
}

int oci_client_blob_push_data(
        OciClient *c, const void *data, size_t size, const char *digest, const char *label, ApiError *reterr) {
        assert_return(data || size == 0, -EINVAL);
        return blob_push(c, -EBADF, data ?: "", size, digest, label, reterr);
}

/* The download of one blob, across attempts. */
typedef struct Fetch {
        OciClient *client;
        const OciDescriptor *d;
        const char *label;
        OciBlobSink sink;
        void *userdata;
        OciDigester digest;
        uint64_t received; /* bytes given to the sink */
        uint64_t skip;     /* bytes of this answer already received before (a 200 to a Range request) */
        uint64_t range_from;
        bool started; /* the first bytes of this answer were seen */
        const Response *resp;
        ApiError *reterr;
        bool too_big;
} Fetch;

static void fetch_done(Fetch *f) {
        oci_digester_done(&f->digest);
}

static int fetch_sink(const void *p, size_t n, void *userdata) {
        Fetch *f = userdata;
        const char *c = p;
        int r;

        if (!f->started) {
                f->started = true;
                if (f->range_from > 0 && f->resp->status == 200)
                        f->skip = f->range_from;
                else if (f->range_from > 0) {
                        uint64_t start = 0;
                        if (!f->resp->content_range ||
                            sscanf(f->resp->content_range, "bytes %" SCNu64 "-", &start) != 1 ||
                            start != f->range_from)
                                return -EPROTO;
                }
        }
        if (f->skip > 0) {
                size_t k = (size_t) MIN((uint64_t) n, f->skip);
                f->skip -= k;
                c += k;
                n -= k;
        }
        if (n == 0)
                return 0;
        if (f->received + n > f->d->size) {
                f->too_big = true;
                return -EFBIG;
        }
        r = oci_digester_update(&f->digest, c, n);
        if (r < 0)
                return r;
        r = f->sink(c, n, f->userdata, f->reterr);
        if (r < 0)
                return r;
        f->received += n;
        f->client->bytes_received += n;
        report(f->client, f->label, f->d->digest, f->received, f->d->size, false, false);
        return 0;
}

int oci_client_blob_fetch(
        OciClient *c, const OciDescriptor *d, const char *label, OciBlobSink sink, void *userdata, ApiError *reterr) {
        _cleanup_free_ char *url = NULL, *what = NULL;
        _cleanup_(response_done) Response resp = {};
        _cleanup_(fetch_done) Fetch f = {};
        char got[OCI_DIGEST_SHA256_LEN + 1];
        unsigned failures = 0;
        int r;

        assert_return(c, -EINVAL);
        assert_return(d && oci_digest_is_valid(d->digest), -EINVAL);
        assert_return(sink, -EINVAL);

        f = (Fetch){ .client = c, .d = d, .label = label, .sink = sink, .userdata = userdata, .reterr = reterr };
        r = oci_digester_init(&f.digest);
        if (r < 0)
                return r;
        r = repo_url(c, "blobs", d->digest, &url);
        if (r < 0)
                return r;
        asprintf_or_null(&what, "blob %s (%s)", d->digest, label ?: "data");
        if (!what)
                return -ENOMEM;

        for (;;) {
                Request req = {
                        .method = "GET",
                        .url = url,
                        .follow = true,
                        .range_from = f.received,
                        .sink = fetch_sink,
                        .sink_userdata = &f,
                        .keep_max = ERROR_BODY_MAX,
                };

                f.skip = 0;
                f.started = false;
                f.range_from = f.received;
                f.resp = &resp;
                r = request(c, &req, &resp, reterr);
                if (r < 0)
                        return r;
                /* the header callback has seen the status before the body arrives; a 200 to a Range
                 * request starts from the beginning, and what we have is skipped (see fetch_sink) */
                if (resp.sink_error < 0) {
                        if (f.too_big)
                                return api_error_set(
                                        reterr,
                                        -EFBIG,
                                        API_ERROR_INTERNAL,
                                        "%s is larger than the %" PRIu64 " bytes the manifest declares",
                                        what,
                                        d->size);
                        if (resp.sink_error == -EPROTO)
                                return api_error_set(
                                        reterr,
                                        -EPROTO,
                                        API_ERROR_INTERNAL,
                                        "%s: the registry answered a Range request from byte %" PRIu64
                                        " with another range",
                                        what,
                                        f.range_from);
                        /* the sink's own error is already in reterr */
                        if (!api_error_is_set(reterr))
                                (void) api_error_set(
                                        reterr,
                                        resp.sink_error,
                                        API_ERROR_INTERNAL,
                                        "%s: cannot store it: %s",
                                        what,
                                        strerror(-resp.sink_error));
                        return resp.sink_error;
                }
                if (resp.code == CURLE_OK && (resp.status == 200 || resp.status == 206) &&
                    f.received == d->size)
                        break;
                if (resp.code == CURLE_OK && resp.status == 416 && f.received == d->size)
                        break;
                if (c->deadline_passed)
                        return api_error_set(
                                reterr,
                                -ETIMEDOUT,
                                API_ERROR_TIMEOUT,
                                "%s: the deadline passed with %" PRIu64 " of its %" PRIu64 " bytes received",
                                what,
                                f.received,
                                d->size);
                if (!(resp.code == CURLE_OK && (resp.status == 200 || resp.status == 206)) &&
                    !retryable(c, &resp))
                        return fail_exchange(c, &resp, -EIO, reterr, what);
                if (++failures > c->retries) {
                        if (resp.code == CURLE_OK)
                                return api_error_set(
                                        reterr,
                                        -EBADMSG,
                                        API_ERROR_INTERNAL,
                                        "%s ended after %" PRIu64 " of the %" PRIu64
                                        " bytes the manifest "
                                        "declares",
                                        what,
                                        f.received,
                                        d->size);
                        return fail_exchange(c, &resp, -EIO, reterr, what);
                }
                pause_before_retry(c, failures - 1);
        }

        r = oci_digester_final(&f.digest, got);
        if (r < 0)
                return r;
        if (!streq(got, d->digest))
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "%s: digest mismatch: the bytes hash to %s",
                        what,
                        got);
        report(c, label, d->digest, d->size, d->size, true, false);
        return 0;
}

/* A request on /v2/<name>/manifests/<reference> with request_until(); *ret_what names the manifest
 * for later messages. */
static int manifest_request(
        OciClient *c,
        Request *req,
        Response *resp,
        const char *reference,
        const char *prefix,
        long want,
        char **ret_what,
        ApiError *reterr) {
        _cleanup_free_ char *url = NULL;
        int r;

        r = repo_url(c, "manifests", reference, &url);
        if (r < 0)
                return r;
        *ret_what = manifest_what(c, prefix, reference);
        if (!*ret_what)
                return -ENOMEM;
        req->url = url;
        r = request_until(c, req, resp, want, *ret_what, reterr);
        req->url = NULL;
        return r;
}

int oci_client_manifest_get(
        OciClient *c,
        const char *reference,
        char **ret_data,
        size_t *ret_size,
        char **ret_content_type,
        char **ret_digest,
        ApiError *reterr) {
        _cleanup_free_ char *what = NULL, *ct = NULL, *dg = NULL;
        _cleanup_(response_done) Response resp = {};
        Request req = { .method = "GET", .accept = OCI_MANIFEST_ACCEPT, .keep_max = OCI_MANIFEST_SIZE_MAX };
        char got[OCI_DIGEST_SHA256_LEN + 1];
        int r;

        assert_return(c, -EINVAL);
        assert_return(reference, -EINVAL);
        assert_return(ret_data && ret_size, -EINVAL);

        r = manifest_request(c, &req, &resp, reference, "manifest", 200, &what, reterr);
        if (r < 0)
                return r;
        r = oci_digest_buffer(resp.body ?: "", resp.body_size, got);
        if (r < 0)
                return r;
        if (oci_digest_is_valid(reference) && !streq(got, reference))
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "%s: digest mismatch: the bytes hash to %s",
                        what,
                        got);
        if (resp.digest && oci_digest_is_valid(resp.digest) && !streq(got, resp.digest))
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "%s: the registry says its digest is %s, but the bytes hash to %s",
                        what,
                        resp.digest,
                        got);
        if (ret_content_type && resp.content_type && !(ct = strdup(resp.content_type)))
                return -ENOMEM;
        if (ret_digest && !(dg = strdup(got)))
                return -ENOMEM;
        *ret_data = resp.body ? TAKE_PTR(resp.body) : strdup("");
        if (!*ret_data)
                return -ENOMEM;
        *ret_size = resp.body_size;
        if (ret_content_type)
                *ret_content_type = TAKE_PTR(ct);
        if (ret_digest)
                *ret_digest = TAKE_PTR(dg);
        return 0;
}

int oci_client_manifest_head(OciClient *c, const char *reference, char **ret_digest, ApiError *reterr) {
        _cleanup_free_ char *what = NULL;
        _cleanup_(response_done) Response resp = {};
        Request req = { .method = "HEAD", .accept = OCI_MANIFEST_ACCEPT, .keep_max = ERROR_BODY_MAX };
        int r;

        assert_return(c, -EINVAL);
        assert_return(reference, -EINVAL);
        assert_return(ret_digest, -EINVAL);

        r = manifest_request(c, &req, &resp, reference, "manifest", 200, &what, reterr);
        if (r < 0)
                return r;
        if (resp.digest && oci_digest_is_valid(resp.digest)) {
                *ret_digest = strdup(resp.digest);
                return *ret_digest ? 0 : -ENOMEM;
        }
        *ret_digest = NULL;
        return 0;
}

int oci_client_manifest_put(
        OciClient *c,
        const char *reference,
        const char *media_type,
        const void *data,
        size_t size,
        char **ret_digest,
        ApiError *reterr) {
        _cleanup_free_ char *what = NULL;
        _cleanup_(response_done) Response resp = {};
        Request req = {
                .method = "PUT",
                .content_type = media_type,
                .has_body = true,
                .body = data,
                .body_fd = -EBADF,
                .body_size = size,
                .keep_max = ERROR_BODY_MAX,
        };
        char digest[OCI_DIGEST_SHA256_LEN + 1];
        int r;

        assert_return(c, -EINVAL);
        assert_return(reference && media_type, -EINVAL);
        assert_return(data || size == 0, -EINVAL);

        r = oci_digest_buffer(data ?: "", size, digest);
        if (r < 0)
                return r;
        r = manifest_request(c, &req, &resp, reference, "PUT of the manifest", 201, &what, reterr);
        if (r < 0)
                return r;
        if (resp.digest && !streq(resp.digest, digest))
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "%s: the registry stored it as %.80s, but its bytes hash to %s",
                        what,
                        resp.digest,
                        digest);
        if (ret_digest) {
                *ret_digest = strdup(digest);
                if (!*ret_digest)
                        return -ENOMEM;
        }
        return 0;
}
