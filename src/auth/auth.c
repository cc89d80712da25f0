/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "auth-internal.h"
#include "log.h"
#include "string-table.h"

static const char *const auth_provider_table[_AUTH_PROVIDER_MAX] = {
        [AUTH_PROVIDER_DEX] = "dex",
        [AUTH_PROVIDER_GOOGLE] = "google",
};

DEFINE_STRING_TABLE_LOOKUP(auth_provider, AuthProvider);

/* ---- configuration ---- */

static bool url_has_path(const char *url) {
        const char *p = strstr(url, "://");

        p = p ? p + 3 : url;
        p += strcspn(p, "/?#");
        return *p && !streq(p, "/");
}

int auth_config_check(const AuthConfig *c, char **ret_message) {
        char *m = NULL;

        assert_return(c && ret_message, -EINVAL);

        if (!c->base_url || !*c->base_url)
                asprintf_or_null(&m, "oauth: base URL is required (--oauth-base-url)");
        else if (!auth_url_is_acceptable(c->base_url))
                asprintf_or_null(
                        &m,
                        "oauth: base URL '%s' must be https, or http on localhost, 127.0.0.1 or ::1 (--oauth-base-url)",
                        c->base_url);
        else if (url_has_path(c->base_url))
                asprintf_or_null(
                        &m,
                        "oauth: base URL '%s' must be an origin without a path, such as https://vmm.example (--oauth-base-url)",
                        c->base_url);
        else if (
                c->provider == AUTH_PROVIDER_DEX &&
                (!c->dex_issuer_url || !*c->dex_issuer_url || !c->dex_client_id || !*c->dex_client_id ||
                 !c->dex_client_secret || !*c->dex_client_secret))
                asprintf_or_null(
                        &m,
                        "oauth: dex issuer URL, client ID and client secret are required (--dex-issuer-url, --dex-client-id, --dex-client-secret)");
        else if (c->provider == AUTH_PROVIDER_DEX && !auth_url_is_acceptable(c->dex_issuer_url))
                asprintf_or_null(
                        &m,
                        "oauth: dex issuer URL '%s' must be https, or http on localhost, 127.0.0.1 or ::1 (--dex-issuer-url)",
                        c->dex_issuer_url);
        else if (c->provider == AUTH_PROVIDER_DEX && c->dex_ca_file && access(c->dex_ca_file, R_OK) < 0)
                asprintf_or_null(&m, "oauth: cannot read the CA file '%s': %m (--dex-ca-file)", c->dex_ca_file);
        else if (
                c->provider == AUTH_PROVIDER_GOOGLE &&
                (!c->google_client_id || !*c->google_client_id || !c->google_client_secret ||
                 !*c->google_client_secret))
                asprintf_or_null(
                        &m,
                        "oauth: google client ID and client secret are required (--google-client-id, --google-client-secret)");
        else if (c->provider < 0 || c->provider >= _AUTH_PROVIDER_MAX)
                asprintf_or_null(&m, "oauth: provider: want dex or google (--oauth-provider)");
        else if (!c->mcp_path || c->mcp_path[0] != '/' || !c->state_dir)
                asprintf_or_null(&m, "oauth: the MCP path and the state directory are required");
        else
                return 0;
        *ret_message = m;
        return -EINVAL;
}

/* ---- verified-token cache ---- */

static void token_digest(Auth *a, const char *token, size_t n, uint8_t ret[static 32]) {
        unsigned len = 32;

        /* the digest fetched once: OpenSSL 3's implicit fetch per call takes locks and lookups */
        if (EVP_Digest(token, n, ret, &len, a->sha256, NULL) != 1)
                memset(ret, 0, 32); /* an all-zero digest matches no entry: see cache_slot() users */
}

static AuthCacheEntry *cache_slot(Auth *a, const uint8_t digest[static 32]) {
        uint64_t h;

        memcpy(&h, digest, sizeof(h));
        return &a->cache[h % AUTH_CACHE_SIZE];
}

static void cache_entry_done(AuthCacheEntry *e) {
        e->caller = caller_free(e->caller);
        memset(e, 0, sizeof(*e));
}

void auth_cache_flush(Auth *a) {
        for (size_t i = 0; i < AUTH_CACHE_SIZE; i++)
                cache_entry_done(&a->cache[i]);
}

static uint64_t current_generation(Auth *a, bool own) {
        return own ? UINT64_MAX : auth_issuer_generation(a->upstream);
}

static const Caller *cache_lookup(Auth *a, const uint8_t digest[static 32], usec_t now) {
        static const uint8_t zero[32] = {};
        AuthCacheEntry *e = cache_slot(a, digest);

        if (!e->caller || memcmp(e->digest, digest, 32) != 0 || memcmp(digest, zero, 32) == 0)
                return NULL;
        if (now >= e->expires || e->generation != current_generation(a, e->generation == UINT64_MAX)) {
                cache_entry_done(e);
                return NULL;
        }
        return e->caller;
}

static void cache_store(Auth *a, const uint8_t digest[static 32], const Caller *c, usec_t expires, bool own) {
        AuthCacheEntry *e = cache_slot(a, digest);
        Caller *copy = caller_dup(c);

        if (!copy)
                return;
        cache_entry_done(e);
        memcpy(e->digest, digest, 32);
        e->caller = copy;
        e->expires = expires;
        e->generation = current_generation(a, own);
}

/* ---- token verification ---- */

int auth_verify_upstream(
        Auth *a,
        const AuthToken *t,
        char *const *audiences,
        const char *nonce,
        Caller **ret_caller,
        const char **ret_reason) {
        int r;

        r = auth_token_verify(t, auth_issuer_keys(a->upstream), ret_reason);
        if (r < 0)
                return r;
        r = auth_token_check_claims(
                t,
                &(AuthClaimCheck){ .issuer = a->upstream_issuer,
                                   .audiences = audiences,
                                   .now = now_usec(CLOCK_REALTIME),
                                   .skew = AUTH_CLOCK_SKEW_DEFAULT,
                                   .nonce = nonce },
                ret_reason);
        if (r < 0)
                return r;
        return auth_token_caller(t, CALLER_SOURCE_SSO, ret_caller);
}

static int verify_own(Auth *a, const AuthToken *t, Caller **ret_caller, const char **ret_reason) {
        const char *jti;
        int r;

        r = auth_token_verify(t, a->own_keys, ret_reason);
        if (IN_SET(r, -ENOKEY, -EKEYREJECTED)) /* our keys never change while we run */
                r = -EBADMSG;
        if (r < 0)
                return r;
        r = auth_token_check_claims(
                t,
                &(AuthClaimCheck){ .issuer = a->base_url,
                                   .audiences = a->own_audiences,
                                   .now = now_usec(CLOCK_REALTIME),
                                   .skew = AUTH_CLOCK_SKEW_DEFAULT },
                ret_reason);
        if (r < 0)
                return r;
        jti = auth_token_claim_string(t, "jti");
        if (!jti || auth_server_is_revoked(a, jti)) {
                if (ret_reason)
                        *ret_reason = jti ? "the token was revoked" : "the token has no jti";
                return -EACCES;
        }
        return auth_token_caller(t, CALLER_SOURCE_OAUTH, ret_caller);
}

/* ---- the guard ---- */

struct AuthCheck {
        Auth *auth;
        HttpRequest *request;
        AuthToken *token;
        uint8_t digest[32];
        HttpHandler next;
        void *userdata;
        AuthIssuerWait *wait;
        sd_event_source *timer;
        AuthCheck *prev, *next_check;
};

static AuthCheck *check_free(AuthCheck *c) {
        if (!c)
                return NULL;
        if (c->auth) {
                if (c->prev)
                        c->prev->next_check = c->next_check;
                else
                        c->auth->checks = c->next_check;
                if (c->next_check)
                        c->next_check->prev = c->prev;
        }
        auth_issuer_wait_cancel(c->wait);
        sd_event_source_disable_unref(c->timer);
        auth_token_free(c->token);
        http_request_unref(c->request);
        free(c);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(AuthCheck *, check_free);

/* Whether a refusal may be logged at info: at most AUTH_REFUSALS_LOGGED_PER_SEC a second, so that
 * a client hammering with bad tokens cannot flood the journal; the rest go to debug and are counted
 * in the next line that is logged. */
static bool refusal_log_allowed(Auth *a, unsigned *ret_suppressed) {
        usec_t now = now_usec(CLOCK_MONOTONIC);

        *ret_suppressed = 0;
        if (now >= a->refusal_window + USEC_PER_SEC) {
                *ret_suppressed = a->refusals_suppressed;
                a->refusal_window = now;
                a->refusals_logged = 0;
                a->refusals_suppressed = 0;
        }
        if (a->refusals_logged >= AUTH_REFUSALS_LOGGED_PER_SEC) {
                a->refusals_suppressed++;
                return false;
        }
        a->refusals_logged++;
        return true;
}

static void reply_unauthorized(Auth *a, HttpRequest *req, bool invalid_token, const char *reason) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *challenge = NULL;
        unsigned suppressed = 0;

        if (invalid_token && refusal_log_allowed(a, &suppressed)) {
                if (suppressed > 0)
                        log_info(
                                "%u more requests were refused in the second before, logged at debug level only.",
                                suppressed);
                log_info(
                        "Refused %s %s (request %" PRIu64 "): %s.",
                        http_request_method(req),
                        http_request_path(req),
                        http_request_id(req),
                        reason);
        } else
                log_debug(
                        "Refused %s %s (request %" PRIu64 "): %s.",
                        http_request_method(req),
                        http_request_path(req),
                        http_request_id(req),
                        reason);

        asprintf_or_null(
                &challenge,
                "Bearer resource_metadata=\"%s\"%s",
                a->resource_metadata_url,
                invalid_token ? ", error=\"invalid_token\"" : "");
        if (challenge)
                (void) http_request_add_header(req, "WWW-Authenticate", challenge);
        (void) http_request_add_header(req, "Cache-Control", "no-store");
        (void) api_error_set(&e, -EACCES, API_ERROR_UNAUTHORIZED, "a valid bearer token is required");
        (void) http_request_reply_error(req, &e);
}

/* A request whose credentials are malformed rather than wrong (RFC 6750 §3.1: 400 with error
 * "invalid_request"): more than one Authorization header, which would leave which one counts to
 * whoever reads them (the first, for libmicrohttpd; the last, for some proxies). */
static void reply_invalid_request(Auth *a, HttpRequest *req, const char *message) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *challenge = NULL;

        log_debug(
                "Refused %s %s (request %" PRIu64 "): %s.",
                http_request_method(req),
                http_request_path(req),
                http_request_id(req),
                message);
        asprintf_or_null(
                &challenge,
                "Bearer resource_metadata=\"%s\", error=\"invalid_request\"",
                a->resource_metadata_url);
        if (challenge)
                (void) http_request_add_header(req, "WWW-Authenticate", challenge);
        (void) http_request_add_header(req, "Cache-Control", "no-store");
        (void) api_error_set(&e, -EINVAL, API_ERROR_INVALID_REQUEST, "%s", message);
        (void) http_request_reply_error(req, &e);
}

static void log_caller(HttpRequest *req, const Caller *c) {
        _cleanup_free_ char *groups = NULL;
        size_t n = 0;

        if (log_get_max_level() < LOG_DEBUG)
                return;
        for (char **g = c->groups; g && *g; g++)
                n += strlen(*g) + 1;
        groups = calloc(n + 1, 1);
        for (char **g = c->groups; groups && g && *g; g++) {
                if (g != c->groups)
                        strcat(groups, ",");
                strcat(groups, *g);
        }
        log_debug(
                "Request %" PRIu64 " %s %s by subject '%s' email '%s' groups '%s' source %s.",
                http_request_id(req),
                http_request_method(req),
                http_request_path(req),
                c->subject,
                c->email ?: "",
                groups ?: "",
                caller_source_to_string(c->source));
}

/* Attaches a copy of the caller; false on OOM (then the request got its answer). */
static bool attach_caller(HttpRequest *req, const Caller *c) {
        Caller *copy = caller_dup(c);

        if (!copy) {
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
                (void) api_error_set(&e, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                (void) http_request_reply_error(req, &e);
                return false;
        }
        log_caller(req, c);
        http_request_set_caller(req, copy);
        return true;
}

/* Checks the token of a request that waited for keys, then answers or passes it on. */
static void check_finish(AuthCheck *c, int r, const char *error) {
        _unused_ _cleanup_(check_freep) AuthCheck *pin = c;
        _cleanup_(caller_freep) Caller *caller = NULL;
        Auth *a = c->auth;
        const char *reason = error;

        if (r >= 0)
                r = auth_verify_upstream(a, c->token, a->sso_audiences, /* nonce= */ NULL, &caller, &reason);
        if (r < 0) {
                _cleanup_free_ char *why = NULL;

                asprintf_or_null(&why, "token of '%s': %s", a->upstream_issuer, reason ?: strerror(-r));
                reply_unauthorized(a, c->request, true, why ?: "out of memory");
                return;
        }
        cache_store(a, c->digest, caller, auth_token_expiry(c->token), false);
        http_request_set_caller(c->request, NULL);
        if (!attach_caller(c->request, caller))
                return;
        http_request_continue(c->request, c->next, c->userdata);
}

static void on_check_ready(int r, const char *error, void *userdata) {
        AuthCheck *c = userdata;

        c->wait = NULL;
        if (r == 0)
                error = NULL;
        check_finish(c, r, error ?: "the signing keys could not be fetched");
}

static int on_check_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        AuthCheck *c = userdata;

        check_finish(c, -ETIMEDOUT, "timed out waiting for the issuer's signing keys");
        return 0;
}

static const char *bearer_token(HttpRequest *req) {
        const char *h = http_request_header(req, "Authorization"), *t;

        if (!h || strncasecmp(h, "Bearer ", 7) != 0)
                return NULL;
        t = h + 7;
        while (*t == ' ')
                t++;
        return *t ? t : NULL;
}

/* Takes the request (true) or lets it through with its caller attached (false). */
static bool guard(Auth *a, HttpRequest *req, HttpHandler next, void *userdata) {
        _cleanup_(auth_token_freep) AuthToken *t = NULL;
        _cleanup_(caller_freep) Caller *caller = NULL;
        _cleanup_(check_freep) AuthCheck *c = NULL;
        const char *token = bearer_token(req), *reason = NULL, *iss, *error = NULL;
        usec_t now = now_usec(CLOCK_REALTIME);
        uint8_t digest[32];
        const Caller *cached;
        size_t n;
        int r;

        /* RFC 6750 §2: one method, one token. Checked before anything else, the cache included: a
         * request whose second header holds a good token is as malformed as one whose first does. */
        if (http_request_header_count(req, "Authorization") > 1) {
                reply_invalid_request(a, req, "the request has more than one Authorization header");
                return true;
        }
        if (!token) {
                reply_unauthorized(
                        a,
                        req,
                        http_request_header(req, "Authorization"),
                        http_request_header(req, "Authorization") ? "the Authorization header is not Bearer" :
                                                                    "no bearer token");
                return true;
        }
        n = strlen(token);
        if (n > AUTH_TOKEN_MAX) {
                reply_unauthorized(a, req, true, "the token is larger than 8 KiB");
                return true;
        }

        token_digest(a, token, n, digest);
        cached = cache_lookup(a, digest, now);
        if (cached)
                return attach_caller(req, cached) ? false : true;

        r = auth_token_parse(token, n, &t, &reason);
        if (r == -ENOMEM)
                reason = "out of memory";
        if (r < 0) {
                reply_unauthorized(a, req, true, reason);
                return true;
        }
        iss = auth_token_claim_string(t, "iss");
        if (iss && streq(iss, a->base_url)) {
                r = verify_own(a, t, &caller, &reason);
                if (r < 0) {
                        reply_unauthorized(a, req, true, reason ?: strerror(-r));
                        return true;
                }
                cache_store(a, digest, caller, auth_token_expiry(t), true);
                return attach_caller(req, caller) ? false : true;
        }
        if (!iss || !streq(iss, a->upstream_issuer)) {
                reply_unauthorized(a, req, true, "the token's issuer is neither this server nor the IdP");
                return true;
        }

        /* the IdP's token: its keys, fetched if need be. A kid we do not know, or a signature that
         * does not verify under one we do (the IdP may have put a new key under an old kid), gets
         * the keys fetched again, rate-limited, and one more try against them. */
        r = -ENOKEY;
        if (auth_issuer_keys(a->upstream)) {
                r = auth_verify_upstream(a, t, a->sso_audiences, /* nonce= */ NULL, &caller, &reason);
                if (r >= 0) {
                        cache_store(a, digest, caller, auth_token_expiry(t), false);
                        return attach_caller(req, caller) ? false : true;
                }
                if (!IN_SET(r, -ENOKEY, -EKEYREJECTED)) {
                        reply_unauthorized(a, req, true, reason ?: strerror(-r));
                        return true;
                }
        }

        c = calloc(1, sizeof(AuthCheck));
        if (!c) {
                reply_unauthorized(a, req, true, "out of memory");
                return true;
        }
        r = auth_issuer_need_keys(
                a->upstream,
                /* refetch= */ auth_issuer_keys(a->upstream) != NULL,
                on_check_ready,
                c,
                &c->wait,
                &error);
        if (r == 0) /* keys arrived meanwhile (a background refresh): check against them */
                r = auth_verify_upstream(a, t, a->sso_audiences, /* nonce= */ NULL, &caller, &reason);
        if (r == 0) {
                cache_store(a, digest, caller, auth_token_expiry(t), false);
                return attach_caller(req, caller) ? false : true;
        }
        if (r < 0) {
                _cleanup_free_ char *why = NULL;
                /* -ENOKEY: the refetch is rate-limited, and reason says what the keys we have found */
                bool limited = r == -ENOKEY && error;

                asprintf_or_null(
                        &why,
                        "token of '%s' (kid '%s'): %s%s%s%s",
                        a->upstream_issuer,
                        t->kid ?: "",
                        r == -ENOKEY   ? reason ?: "unknown key" :
                                error  ?:
                                reason ?:
                                         strerror(-r),
                        limited ? " (" : "",
                        limited ? error : "",
                        limited ? ")" : "");
                reply_unauthorized(a, req, true, why ?: "out of memory");
                return true;
        }

        /* wait, suspended, for the fetch: it is bounded, and so is the wait */
        r = sd_event_add_time_relative(
                a->event, &c->timer, CLOCK_MONOTONIC, AUTH_WAIT_MAX, 0, on_check_timeout, c);
        if (r < 0) {
                reply_unauthorized(a, req, true, "cannot wait for the signing keys");
                return true;
        }
        c->auth = a;
        c->request = http_request_ref(req);
        c->token = TAKE_PTR(t);
        memcpy(c->digest, digest, 32);
        c->next = next;
        c->userdata = userdata;
        c->next_check = a->checks;
        if (a->checks)
                a->checks->prev = c;
        a->checks = TAKE_PTR(c);
        http_request_suspend(req);
        return true;
}

bool auth_path_is_public(const char *path) {
        return startswith(path, "/.well-known/oauth-") || startswith(path, "/oauth/");
}

bool auth_handle(Auth *a, HttpRequest *req, HttpHandler next, void *userdata) {
        assert(a && req && next);

        /* the OAuth routes need no token; a path in their space that is none of them is the
         * caller's to answer (404) */
        if (auth_path_is_public(http_request_path(req)))
                return auth_server_handle(a, req);
        return guard(a, req, next, userdata);
}

const char *auth_resource(const Auth *a) {
        return a->resource;
}

/* ---- life cycle ---- */

static char **audiences_new(const char *resource, char *const *extra) {
        size_t n = strv_length(extra), k = 0;
        _cleanup_strv_free_ char **l = calloc(n + 2, sizeof(char *));

        if (!l)
                return NULL;
        if (!(l[k++] = strdup(resource)))
                return NULL;
        for (size_t i = 0; i < n; i++)
                if (!(l[k++] = strdup(extra[i])))
                        return NULL;
        return TAKE_PTR(l);
}

static char *strip_slash(const char *s) {
        size_t n = strlen(s);

        while (n > 0 && s[n - 1] == '/')
                n--;
        return strndup(s, n);
}

int auth_new(Auth **ret, sd_event *event, const AuthConfig *cfg, ApiError *reterr) {
        _cleanup_(auth_freep) Auth *a = NULL;
        _cleanup_free_ char *message = NULL;
        int r;

        assert_return(ret && event && cfg, -EINVAL);

        r = auth_config_check(cfg, &message);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INVALID_REQUEST, "%s", message ?: "oauth: bad configuration");

        a = calloc(1, sizeof(Auth));
        if (!a)
                return -ENOMEM;
        a->event = sd_event_ref(event);
        a->provider = cfg->provider;
        a->base_url = strip_slash(cfg->base_url);
        a->mcp_path = strdup(cfg->mcp_path);
        a->upstream_issuer = cfg->provider == AUTH_PROVIDER_GOOGLE ? strdup(AUTH_GOOGLE_ISSUER) :
                                                                     strdup(cfg->dex_issuer_url);
        a->client_id = strdup(
                cfg->provider == AUTH_PROVIDER_GOOGLE ? cfg->google_client_id : cfg->dex_client_id);
        a->client_secret = strdup(
                cfg->provider == AUTH_PROVIDER_GOOGLE ? cfg->google_client_secret : cfg->dex_client_secret);
        if (!a->base_url || !a->mcp_path || !a->upstream_issuer || !a->client_id || !a->client_secret)
                return -ENOMEM;
        asprintf_or_null(&a->resource, "%s%s", a->base_url, cfg->mcp_path);
        asprintf_or_null(
                &a->resource_metadata_url,
                "%s/.well-known/oauth-protected-resource%s",
                a->base_url,
                cfg->mcp_path);
        asprintf_or_null(&a->dir, "%s/oauth", cfg->state_dir);
        if (!a->resource || !a->resource_metadata_url || !a->dir)
                return -ENOMEM;
        a->own_audiences = audiences_new(a->resource, NULL);
        a->sso_audiences = audiences_new(a->resource, cfg->trusted_audiences);
        if (!a->own_audiences || !a->sso_audiences)
                return -ENOMEM;
        a->allow_private_oauth_urls = cfg->allow_private_oauth_urls;
        a->allow_registration = cfg->allow_public_client_registration;
        a->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
        if (!a->sha256)
                return api_error_set(reterr, -EIO, API_ERROR_INTERNAL, "oauth: OpenSSL has no SHA-256");

        r = auth_fetcher_new(&a->fetcher, event, cfg->provider == AUTH_PROVIDER_DEX ? cfg->dex_ca_file : NULL);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "oauth: cannot set up libcurl: %s", strerror(-r));
        /* the keys of SSO tokens come from the IdP as well: either flag lets them be fetched from a
         * private address */
        r = auth_issuer_new(
                &a->upstream,
                a->fetcher,
                a->upstream_issuer,
                cfg->allow_private_oauth_urls || cfg->sso_allow_private_ips,
                "allow-private-oauth-urls or --sso-allow-private-ips");
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "oauth: %s", strerror(-r));

        r = auth_server_init(a);
        if (r < 0)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "oauth: cannot load the state in '%s': %s",
                        a->dir,
                        strerror(-r));

        *ret = TAKE_PTR(a);
        return 0;
}

Auth *auth_free(Auth *a) {
        if (!a)
                return NULL;
        while (a->checks)
                check_free(a->checks);
        auth_server_done(a);
        auth_cache_flush(a);
        a->upstream = auth_issuer_free(a->upstream);
        a->fetcher = auth_fetcher_free(a->fetcher);
        EVP_MD_free(a->sha256);
        strv_free(a->own_audiences);
        strv_free(a->sso_audiences);
        free(a->base_url);
        free(a->resource);
        free(a->resource_metadata_url);
        free(a->mcp_path);
        free(a->upstream_issuer);
        free(a->client_id);
        if (a->client_secret)
                explicit_bzero(a->client_secret, strlen(a->client_secret));
        free(a->client_secret);
        free(a->dir);
        sd_event_unref(a->event);
        free(a);
        return NULL;
}
