/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <cjose/header.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "auth-internal.h"
#include "cjose-util.h"
#include "fs-util.h"
#include "hex-util.h"
#include "log.h"

/* The authorization server: RFC 8414 and RFC 9728 metadata, /oauth/authorize (code + PKCE S256,
 * exact redirect URIs) handing the login to the upstream IdP, /oauth/callback back from it,
 * /oauth/token (authorization_code, refresh_token with rotation and replay detection),
 * /oauth/register (RFC 7591, only when allowed), /oauth/revoke (RFC 7009), /oauth/jwks.
 *
 * Kept in <state>/oauth (0700): signing-key.json (our ES256 key, 0600) and state.json (0600: the
 * registered clients with their secrets hashed, the refresh tokens by SHA-256 only, the revoked
 * access tokens' jti until they expire). Codes and logins in progress live in memory: they last a
 * minute or ten, a restart costs a user one more login. */

#define STATE_FILE "state.json"
#define KEY_FILE "signing-key.json"
#define STATE_MAX ((size_t) 64 << 20)
#define REGISTER_BODY_MAX ((size_t) 64 << 10)
#define REDIRECT_URIS_MAX 16
#define URI_MAX 2048
#define PARAM_MAX 2048
#define UPSTREAM_SCOPE_DEX "openid email profile groups"
#define UPSTREAM_SCOPE_GOOGLE "openid email profile"

struct AuthFlow {
        Auth *auth;
        char *id; /* the state we give the IdP */
        char *client_id, *redirect_uri, *state, *code_challenge, *scope;
        char *nonce, *verifier; /* ours toward the IdP */
        usec_t expires;         /* CLOCK_MONOTONIC */
        HttpRequest *request;   /* the authorize or callback request waiting, if any */
        AuthFetch *fetch;
        AuthIssuerWait *wait;
        sd_event_source *timer;
        char *id_token; /* from the IdP, while its keys are fetched */
        AuthFlow *prev, *next;
};

struct AuthCode {
        uint8_t digest[32];
        char *client_id, *redirect_uri, *code_challenge, *scope;
        Caller *caller;
        usec_t expires; /* CLOCK_MONOTONIC */
        AuthCode *prev, *next;
};

/* ---- small helpers ---- */

static json_t *json_decref_and_null(json_t *j) {
        json_decref(j);
        return NULL;
}

static void sha256(const void *data, size_t size, uint8_t ret[static 32]) {
        unsigned len = 32;

        if (EVP_Digest(data, size, ret, &len, EVP_sha256(), NULL) != 1)
                memset(ret, 0, 32);
}

static char *sha256_hex(const char *s) {
        uint8_t d[32];

        sha256(s, strlen(s), d);
        return hex_encode(d, sizeof(d));
}

/* A fresh secret: n random bytes, base64url. */
static int random_token(size_t n, char **ret) {
        uint8_t b[64];

        assert(n <= sizeof(b));
        if (getrandom(b, n, 0) != (ssize_t) n)
                return -EIO;
        *ret = base64url_encode(b, n);
        return *ret ? 0 : -ENOMEM;
}

/* The PKCE S256 challenge of a verifier. */
static int pkce_challenge(const char *verifier, char **ret) {
        uint8_t d[32];

        sha256(verifier, strlen(verifier), d);
        *ret = base64url_encode(d, sizeof(d));
        return *ret ? 0 : -ENOMEM;
}

static bool pkce_verifier_valid(const char *v) {
        size_t n = v ? strlen(v) : 0;

        if (n < 43 || n > 128)
                return false;
        for (const char *p = v; *p; p++)
                if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~", *p))
                        return false;
        return true;
}

static bool secrets_equal(const char *a, const char *b) {
        return a && b && strlen(a) == strlen(b) && CRYPTO_memcmp(a, b, strlen(a)) == 0;
}

static int url_encode_append(char **s, const char *key, const char *value) {
        size_t n = *s ? strlen(*s) : 0, k = strlen(key), v = strlen(value);
        char *b = realloc(*s, n + 1 + k * 3 + 1 + v * 3 + 1), *o;

        if (!b)
                return -ENOMEM;
        *s = b;
        o = b + n;
        if (n > 0)
                *o++ = '&';
        for (int part = 0; part < 2; part++) {
                for (const unsigned char *p = (const unsigned char *) (part ? value : key); *p; p++)
                        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                            (*p >= '0' && *p <= '9') || strchr("-._~", *p))
                                *o++ = (char) *p;
                        else
                                o += sprintf(o, "%%%02X", *p);
                if (part == 0)
                        *o++ = '=';
        }
        *o = 0;
        return 0;
}

/* application/x-www-form-urlencoded into {"key":"value"}; NULL for a malformed body or a repeated
 * parameter (RFC 6749 §3.1). */
static json_t *form_parse(const char *s, size_t n) {
        json_auto_t *o = json_object();
        const char *end = s + n;

        if (!o)
                return NULL;
        while (s < end) {
                const char *amp = memchr(s, '&', (size_t) (end - s)) ?: end;
                const char *eq = memchr(s, '=', (size_t) (amp - s));
                _cleanup_free_ char *k = NULL, *v = NULL;

                if (amp == s) {
                        s++;
                        continue;
                }
                for (int part = 0; part < 2; part++) {
                        const char *from = part ? (eq ? eq + 1 : amp) : s, *to = part ? amp : (eq ?: amp);
                        char *d = malloc((size_t) (to - from) + 1), *o2 = d;

                        if (!d)
                                return NULL;
                        for (const char *p = from; p < to; p++) {
                                if (*p == '+')
                                        *o2++ = ' ';
                                else if (*p == '%') {
                                        int hi = p + 2 < to ? unhexchar(p[1]) : -1,
                                            lo = p + 2 < to ? unhexchar(p[2]) : -1;
                                        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                                                free(d);
                                                return NULL;
                                        }
                                        *o2++ = (char) (hi << 4 | lo);
                                        p += 2;
                                } else
                                        *o2++ = *p;
                        }
                        *o2 = 0;
                        if (part)
                                v = d;
                        else
                                k = d;
                }
                if (json_object_get(o, k) || strlen(v) > PARAM_MAX)
                        return NULL;
                if (json_object_set_new(o, k, json_string(v)) < 0)
                        return NULL; /* not UTF-8 */
                s = amp + 1;
        }
        return TAKE_PTR(o);
}

static const char *form_get(json_t *form, const char *key) {
        return json_string_value(json_object_get(form, key));
}

static void reply_json_no_store(HttpRequest *req, unsigned status, json_t *j) {
        (void) http_request_add_header(req, "Cache-Control", "no-store");
        (void) http_request_add_header(req, "Pragma", "no-cache");
        (void) http_request_reply_json(req, status, j);
}

/* An OAuth error (RFC 6749 §5.2), the format OAuth clients parse. */
static void reply_oauth_error(HttpRequest *req, unsigned status, const char *error, const char *description) {
        json_auto_t *j = json_pack("{s:s,s:s}", "error", error, "error_description", description);

        log_debug("OAuth %s %s: %s: %s", http_request_method(req), http_request_path(req), error, description);
        if (status == 401)
                (void) http_request_add_header(req, "WWW-Authenticate", "Basic realm=\"vm-manager\"");
        if (j)
                reply_json_no_store(req, status, j);
        else
                (void) http_request_reply_text(req, 500, "out of memory\n");
}

static void reply_redirect(HttpRequest *req, const char *location) {
        (void) http_request_add_header(req, "Location", location);
        (void) http_request_add_header(req, "Cache-Control", "no-store");
        (void) http_request_reply_text(req, 302, "redirecting\n");
}

/* base?params: appended with & when base has a query already. */
static char *url_with_query(const char *base, const char *params) {
        char *s = NULL;

        asprintf_or_null(&s, "%s%s%s", base, strchr(base, '?') ? "&" : "?", params);
        return s;
}

/* ---- persistence ---- */

static int state_save(Auth *a) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        json_t *refresh = json_object_get(a->state, "refresh"),
               *revoked = json_object_get(a->state, "revoked"), *v;
        double now = (double) now_usec(CLOCK_REALTIME) / USEC_PER_SEC;
        const char *k;
        void *tmp;
        int r;

        json_object_foreach_safe(refresh, tmp, k, v) if (json_number_value(json_object_get(v, "expires")) <= now)
                json_object_del(refresh, k);
        json_object_foreach_safe(
                revoked, tmp, k, v) if (json_number_value(v) + AUTH_CLOCK_SKEW_DEFAULT / USEC_PER_SEC <= now)
                json_object_del(revoked, k);

        text = json_dumps(a->state, JSON_COMPACT | JSON_SORT_KEYS);
        asprintf_or_null(&path, "%s/" STATE_FILE, a->dir);
        if (!text || !path)
                return log_oom();
        r = write_file_atomic(path, text, strlen(text), 0600);
        if (r < 0)
                return log_error_errno(r, "Failed to save the OAuth state to '%s': %m", path);
        return 0;
}

static int state_load(Auth *a) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        json_error_t error;
        size_t size;
        int r;

        asprintf_or_null(&path, "%s/" STATE_FILE, a->dir);
        if (!path)
                return -ENOMEM;
        r = read_full_file(path, STATE_MAX, &text, &size);
        if (r == -ENOENT) {
                a->state = json_pack("{s:{},s:{},s:{}}", "clients", "refresh", "revoked");
                return a->state ? 0 : -ENOMEM;
        }
        if (r < 0)
                return r;
        a->state = json_loadb(text, size, 0, &error);
        if (!json_is_object(a->state)) {
                log_error("'%s' is not JSON (line %d: %s).", path, error.line, error.text);
                return -EBADMSG;
        }
        for (size_t i = 0; i < 3; i++) {
                const char *key = (const char *[]){ "clients", "refresh", "revoked" }[i];
                if (!json_is_object(json_object_get(a->state, key)) &&
                    json_object_set_new(a->state, key, json_object()) < 0)
                        return -ENOMEM;
        }
        return 0;
}

/* Our signing key: read, or made and saved on first start. */
static int signing_key_load(Auth *a) {
        _cleanup_free_ char *path = NULL, *text = NULL, *kid = NULL;
        _cleanup_(cjose_jwk_releasep) cjose_jwk_t *k = NULL;
        cjose_err err;
        size_t size;
        int r;

        asprintf_or_null(&path, "%s/" KEY_FILE, a->dir);
        if (!path)
                return -ENOMEM;
        r = read_full_file(path, 64 << 10, &text, &size);
        if (r >= 0) {
                k = cjose_jwk_import(text, size, &err);
                if (!k || cjose_jwk_get_kty(k, &err) != CJOSE_JWK_KTY_EC || !cjose_jwk_get_kid(k, &err)) {
                        log_error("'%s' is not an EC signing key with a kid.", path);
                        return -EBADMSG;
                }
        } else if (r == -ENOENT) {
                uint8_t b[12];
                char *jwk;

                k = cjose_jwk_create_EC_random(CJOSE_JWK_EC_P_256, &err);
                if (!k)
                        return -ENOMEM;
                if (getrandom(b, sizeof(b), 0) != sizeof(b) || !(kid = base64url_encode(b, sizeof(b))) ||
                    !cjose_jwk_set_kid(k, kid, strlen(kid), &err))
                        return -EIO;
                jwk = cjose_jwk_to_json(k, true, &err);
                if (!jwk)
                        return -ENOMEM;
                r = write_file_atomic(path, jwk, strlen(jwk), 0600);
                explicit_bzero(jwk, strlen(jwk));
                free(jwk);
                if (r < 0)
                        return log_error_errno(r, "Failed to save the OAuth signing key to '%s': %m", path);
                log_info("Created the OAuth signing key %s in '%s'.", kid, path);
        } else
                return log_error_errno(r, "Failed to read '%s': %m", path);
        if (text)
                explicit_bzero(text, size);

        a->signing_kid = strdup(cjose_jwk_get_kid(k, &err));
        if (!a->signing_kid)
                return -ENOMEM;
        a->signing_key = TAKE_PTR(k);
        return 0;
}

static int own_jwks_build(Auth *a) {
        _cleanup_free_ char *pub = NULL;
        json_auto_t *key = NULL;
        const char *reason = NULL;
        cjose_err err;

        pub = cjose_jwk_to_json(a->signing_key, false, &err);
        if (!pub)
                return -ENOMEM;
        key = json_loads(pub, 0, NULL);
        if (!key || json_object_set_new(key, "use", json_string("sig")) < 0 ||
            json_object_set_new(key, "alg", json_string("ES256")) < 0 ||
            json_object_set_new(key, "kid", json_string(a->signing_kid)) < 0)
                return -ENOMEM;
        a->own_jwks = json_pack("{s:[O]}", "keys", key);
        if (!a->own_jwks)
                return -ENOMEM;
        return auth_keyset_from_json(a->own_jwks, &a->own_keys, &reason);
}

int auth_server_init(Auth *a) {
        int r;

        r = mkdir_p(a->dir, 0700);
        if (r < 0)
                return r;
        (void) chmod(a->dir, 0700);
        r = signing_key_load(a);
        if (r < 0)
                return r;
        r = own_jwks_build(a);
        if (r < 0)
                return r;
        r = state_load(a);
        if (r < 0)
                return r;
        return state_save(a); /* prunes what expired while we were down */
}

static AuthFlow *flow_free(AuthFlow *f);
static AuthCode *code_free(AuthCode *c);

void auth_server_done(Auth *a) {
        while (a->flows)
                flow_free(a->flows);
        while (a->codes)
                code_free(a->codes);
        cjose_jwk_release(a->signing_key);
        a->signing_key = NULL;
        a->signing_kid = mfree(a->signing_kid);
        a->own_keys = auth_keyset_free(a->own_keys);
        a->own_jwks = json_decref_and_null(a->own_jwks);
        a->state = json_decref_and_null(a->state);
}

bool auth_server_is_revoked(Auth *a, const char *jti) {
        return json_object_get(json_object_get(a->state, "revoked"), jti) != NULL;
}

/* ---- metadata ---- */

static void serve_protected_resource(Auth *a, HttpRequest *req) {
        json_auto_t *j = json_pack(
                "{s:s,s:[s],s:[s],s:s}",
                "resource",
                a->resource,
                "authorization_servers",
                a->base_url,
                "bearer_methods_supported",
                "header",
                "resource_name",
                "vm-manager");

        if (!j)
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        (void) http_request_reply_json(req, 200, j);
}

static void serve_authorization_server(Auth *a, HttpRequest *req) {
        _cleanup_free_ char *authorize = NULL, *token = NULL, *reg = NULL, *revoke = NULL, *jwks = NULL;
        json_auto_t *j = NULL;

        asprintf_or_null(&authorize, "%s/oauth/authorize", a->base_url);
        asprintf_or_null(&token, "%s/oauth/token", a->base_url);
        asprintf_or_null(&reg, "%s/oauth/register", a->base_url);
        asprintf_or_null(&revoke, "%s/oauth/revoke", a->base_url);
        asprintf_or_null(&jwks, "%s/oauth/jwks", a->base_url);
        if (authorize && token && reg && revoke && jwks)
                j = json_pack(
                        "{s:s,s:s,s:s,s:s,s:s,s:[s],s:[s],s:[ss],s:[s],s:[sss],s:[sss],s:b}",
                        "issuer",
                        a->base_url,
                        "authorization_endpoint",
                        authorize,
                        "token_endpoint",
                        token,
                        "revocation_endpoint",
                        revoke,
                        "jwks_uri",
                        jwks,
                        "response_types_supported",
                        "code",
                        "response_modes_supported",
                        "query",
                        "grant_types_supported",
                        "authorization_code",
                        "refresh_token",
                        "code_challenge_methods_supported",
                        "S256",
                        "token_endpoint_auth_methods_supported",
                        "none",
                        "client_secret_basic",
                        "client_secret_post",
                        "revocation_endpoint_auth_methods_supported",
                        "none",
                        "client_secret_basic",
                        "client_secret_post",
                        "authorization_response_iss_parameter_supported",
                        true);
        if (j && a->allow_registration && json_object_set_new(j, "registration_endpoint", json_string(reg)) < 0)
                j = json_decref_and_null(j);
        if (!j)
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        (void) http_request_reply_json(req, 200, j);
}

/* ---- clients ---- */

static json_t *client_find(Auth *a, const char *client_id) {
        return client_id ? json_object_get(json_object_get(a->state, "clients"), client_id) : NULL;
}

static bool client_has_redirect_uri(json_t *client, const char *uri) {
        json_t *v;
        size_t i;

        json_array_foreach(
                json_object_get(client, "redirect_uris"),
                i,
                v) if (json_is_string(v) && streq(json_string_value(v), uri)) return true;
        return false;
}

static bool redirect_uri_acceptable(const char *uri) {
        const char *colon;

        if (strlen(uri) > URI_MAX || strchr(uri, '#'))
                return false;
        if (startswith(uri, "https://") || startswith(uri, "http://"))
                return auth_url_is_acceptable(uri); /* https anywhere, http on loopback only (RFC 8252) */
        /* a private-use scheme of a native app: reverse domain name, RFC 8252 §7.1 */
        colon = strchr(uri, ':');
        if (!colon || colon == uri || !memchr(uri, '.', (size_t) (colon - uri)))
                return false;
        for (const char *p = uri; p < colon; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || strchr("+.-", *p)))
                        return false;
        return true;
}

/* Who calls the token or revocation endpoint: client_secret_basic, client_secret_post or a public
 * client's client_id. NULL (after replying 401) when the client does not authenticate. */
static json_t *client_authenticate(Auth *a, HttpRequest *req, json_t *form, const char **ret_client_id) {
        _cleanup_free_ char *id = NULL, *secret = NULL;
        const char *h = http_request_header(req, "Authorization"), *method, *want;
        json_t *client;

        if (h && strncasecmp(h, "Basic ", 6) == 0) {
                _cleanup_free_ uint8_t *raw = NULL;
                _cleanup_(json_decrefp) json_t *pair = NULL;
                _cleanup_free_ char *conv = NULL;
                size_t size;
                EVP_ENCODE_CTX *ctx = NULL;
                int outl = 0, fin = 0;
                const char *b64 = h + 6, *colon;

                raw = malloc(strlen(b64) + 4);
                ctx = EVP_ENCODE_CTX_new();
                if (raw && ctx) {
                        EVP_DecodeInit(ctx);
                        if (EVP_DecodeUpdate(ctx, raw, &outl, (const unsigned char *) b64, (int) strlen(b64)) <
                                    0 ||
                            EVP_DecodeFinal(ctx, raw + outl, &fin) < 0)
                                outl = -1;
                }
                EVP_ENCODE_CTX_free(ctx);
                if (!raw || outl < 0) {
                        reply_oauth_error(req, 401, "invalid_client", "the Basic credentials are not base64");
                        return NULL;
                }
                size = (size_t) (outl + fin);
                raw[size] = 0;
                colon = memchr(raw, ':', size);
                if (!colon || memchr(raw, 0, size)) {
                        reply_oauth_error(
                                req, 401, "invalid_client", "the Basic credentials are not id:secret");
                        return NULL;
                }
                /* RFC 6749 §2.3.1: both parts are form-encoded */
                asprintf_or_null(
                        &conv, "i=%.*s&s=%s", (int) ((const char *) colon - (const char *) raw), raw, colon + 1);
                pair = conv ? form_parse(conv, strlen(conv)) : NULL;
                if (!pair) {
                        reply_oauth_error(req, 401, "invalid_client", "the Basic credentials do not decode");
                        return NULL;
                }
                id = strdup(form_get(pair, "i"));
                secret = strdup(form_get(pair, "s"));
                if (!id || !secret)
                        return reply_oauth_error(req, 500, "server_error", "out of memory"), NULL;
                if (form_get(form, "client_id") && !streq(form_get(form, "client_id"), id)) {
                        reply_oauth_error(req, 401, "invalid_client", "two different client_ids");
                        return NULL;
                }
                method = "client_secret_basic";
        } else {
                if (form_get(form, "client_id") && !(id = strdup(form_get(form, "client_id"))))
                        return reply_oauth_error(req, 500, "server_error", "out of memory"), NULL;
                if (form_get(form, "client_secret") && !(secret = strdup(form_get(form, "client_secret"))))
                        return reply_oauth_error(req, 500, "server_error", "out of memory"), NULL;
                method = secret ? "client_secret_post" : "none";
        }

        client = client_find(a, id);
        if (!client) {
                reply_oauth_error(req, 401, "invalid_client", "unknown client");
                return NULL;
        }
        want = json_string_value(json_object_get(client, "token_endpoint_auth_method"));
        if (!want || !streq(want, method)) {
                reply_oauth_error(req, 401, "invalid_client", "the client authenticates another way");
                return NULL;
        }
        if (secret) {
                _cleanup_free_ char *hash = sha256_hex(secret);

                if (!hash ||
                    !secrets_equal(hash, json_string_value(json_object_get(client, "client_secret_sha256")))) {
                        reply_oauth_error(req, 401, "invalid_client", "wrong client secret");
                        return NULL;
                }
        }
        *ret_client_id = json_object_iter_key(json_object_iter_at(json_object_get(a->state, "clients"), id));
        return client;
}

static void serve_register(Auth *a, HttpRequest *req) {
        _cleanup_free_ char *id = NULL, *secret = NULL, *hash = NULL;
        json_auto_t *body = NULL, *client = NULL, *answer = NULL;
        json_t *uris, *v, *clients = json_object_get(a->state, "clients");
        const char *method, *name;
        size_t size, i;
        const void *data = http_request_body(req, &size);

        if (!a->allow_registration)
                return reply_oauth_error(
                        req,
                        403,
                        "access_denied",
                        "dynamic client registration is disabled (--allow-public-client-registration)");
        if (size > REGISTER_BODY_MAX)
                return reply_oauth_error(
                        req, 400, "invalid_client_metadata", "the request is larger than 64 KiB");
        body = json_loadb(data, size, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(body))
                return reply_oauth_error(req, 400, "invalid_client_metadata", "the body is not a JSON object");
        if (json_object_size(clients) >= AUTH_CLIENTS_MAX)
                return reply_oauth_error(
                        req, 400, "invalid_client_metadata", "too many clients are registered");

        uris = json_object_get(body, "redirect_uris");
        if (!json_is_array(uris) || json_array_size(uris) == 0 || json_array_size(uris) > REDIRECT_URIS_MAX)
                return reply_oauth_error(req, 400, "invalid_redirect_uri", "redirect_uris: want 1 to 16 URIs");
        json_array_foreach(uris, i, v) if (!json_is_string(v) || !redirect_uri_acceptable(json_string_value(v))) return reply_oauth_error(
                req,
                400,
                "invalid_redirect_uri",
                "redirect_uris: want https URIs, http on a loopback host, or a reverse-DNS scheme, without fragments");

        v = json_object_get(body, "token_endpoint_auth_method");
        method = v ? json_string_value(v) : "client_secret_basic";
        if (!method ||
            (!streq(method, "none") && !streq(method, "client_secret_basic") &&
             !streq(method, "client_secret_post")))
                return reply_oauth_error(
                        req,
                        400,
                        "invalid_client_metadata",
                        "token_endpoint_auth_method: want none, client_secret_basic or client_secret_post");
        json_array_foreach(json_object_get(body, "grant_types"), i, v) if (
                !json_is_string(v) ||
                (!streq(json_string_value(v), "authorization_code") &&
                 !streq(json_string_value(v),
                        "refresh_token"))) return reply_oauth_error(req, 400, "invalid_client_metadata", "grant_types: only authorization_code and refresh_token");
        json_array_foreach(json_object_get(body, "response_types"), i, v) if (
                !json_is_string(v) ||
                !streq(json_string_value(v),
                       "code")) return reply_oauth_error(req, 400, "invalid_client_metadata", "response_types: only code");
        v = json_object_get(body, "client_name");
        name = json_string_value(v);
        if (v && (!name || strlen(name) > 256))
                return reply_oauth_error(
                        req, 400, "invalid_client_metadata", "client_name: a string of up to 256 bytes");

        if (random_token(16, &id) < 0)
                return reply_oauth_error(req, 500, "server_error", "no randomness");
        client = json_pack(
                "{s:O,s:s,s:I,s:[ss],s:[s]}",
                "redirect_uris",
                uris,
                "token_endpoint_auth_method",
                method,
                "client_id_issued_at",
                (json_int_t) (now_usec(CLOCK_REALTIME) / USEC_PER_SEC),
                "grant_types",
                "authorization_code",
                "refresh_token",
                "response_types",
                "code");
        if (!client || (name && json_object_set_new(client, "client_name", json_string(name)) < 0))
                return reply_oauth_error(req, 500, "server_error", "out of memory");
        if (!streq(method, "none")) {
                if (random_token(32, &secret) < 0 || !(hash = sha256_hex(secret)))
                        return reply_oauth_error(req, 500, "server_error", "no randomness");
        }

        answer = json_deep_copy(client);
        if (!answer || json_object_set_new(answer, "client_id", json_string(id)) < 0)
                return reply_oauth_error(req, 500, "server_error", "out of memory");
        if (secret &&
            (json_object_set_new(answer, "client_secret", json_string(secret)) < 0 ||
             json_object_set_new(answer, "client_secret_expires_at", json_integer(0)) < 0 ||
             json_object_set_new(client, "client_secret_sha256", json_string(hash)) < 0))
                return reply_oauth_error(req, 500, "server_error", "out of memory");
        if (json_object_set(clients, id, client) < 0)
                return reply_oauth_error(req, 500, "server_error", "out of memory");
        if (state_save(a) < 0) {
                json_object_del(clients, id);
                return reply_oauth_error(req, 500, "server_error", "cannot save the client");
        }
        log_info("Registered OAuth client %s ('%s', %s).", id, name ?: "", method);
        reply_json_no_store(req, 201, answer);
}

/* ---- logins in progress, codes ---- */

static AuthFlow *flow_free(AuthFlow *f) {
        if (!f)
                return NULL;
        if (f->auth) {
                if (f->prev)
                        f->prev->next = f->next;
                else
                        f->auth->flows = f->next;
                if (f->next)
                        f->next->prev = f->prev;
                f->auth->n_flows--;
        }
        auth_fetch_cancel(f->fetch);
        auth_issuer_wait_cancel(f->wait);
        sd_event_source_disable_unref(f->timer);
        if (f->request && http_request_is_connected(f->request))
                (void) http_request_reply_text(f->request, 503, "the login was abandoned\n");
        http_request_unref(f->request);
        free(f->id);
        free(f->client_id);
        free(f->redirect_uri);
        free(f->state);
        free(f->code_challenge);
        free(f->scope);
        free(f->nonce);
        free(f->verifier);
        free(f->id_token);
        free(f);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(AuthFlow *, flow_free);

static AuthCode *code_free(AuthCode *c) {
        if (!c)
                return NULL;
        free(c->client_id);
        free(c->redirect_uri);
        free(c->code_challenge);
        free(c->scope);
        caller_free(c->caller);
        free(c);
        return NULL;
}

static void code_unlink(Auth *a, AuthCode *c) {
        if (c->prev)
                c->prev->next = c->next;
        else
                a->codes = c->next;
        if (c->next)
                c->next->prev = c->prev;
        a->n_codes--;
}

static void expire_old(Auth *a) {
        usec_t now = now_usec(CLOCK_MONOTONIC);

        for (AuthFlow *f = a->flows, *n; f; f = n) {
                n = f->next;
                if (now >= f->expires && !f->request)
                        flow_free(f);
        }
        for (AuthCode *c = a->codes, *n; c; c = n) {
                n = c->next;
                if (now >= c->expires) {
                        code_unlink(a, c);
                        code_free(c);
                }
        }
}

/* Redirects the flow's client back with params (already encoded) and the client's state. */
static void flow_redirect_to_client(AuthFlow *f, HttpRequest *req, char *params) {
        _cleanup_free_ char *p = params, *url = NULL;

        if (p && f->state && url_encode_append(&p, "state", f->state) < 0)
                p = mfree(p);
        if (p && url_encode_append(&p, "iss", f->auth->base_url) < 0)
                p = mfree(p);
        url = p ? url_with_query(f->redirect_uri, p) : NULL;
        if (!url)
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        reply_redirect(req, url);
}

static void flow_fail(AuthFlow *f, HttpRequest *req, const char *error, const char *description) {
        char *p = NULL;

        log_info("OAuth login for client %s failed: %s: %s", f->client_id, error, description);
        if (url_encode_append(&p, "error", error) < 0 ||
            url_encode_append(&p, "error_description", description) < 0)
                p = mfree(p);
        flow_redirect_to_client(f, req, p);
}

/* ---- /oauth/authorize ---- */

/* Sends the browser on to the IdP; the discovery document must be there. */
static void flow_to_upstream(AuthFlow *f, HttpRequest *req) {
        Auth *a = f->auth;
        const char *endpoint = auth_issuer_endpoint(a->upstream, "authorization_endpoint");
        _cleanup_free_ char *p = NULL, *callback = NULL, *challenge = NULL, *url = NULL;

        if (!endpoint)
                return flow_fail(
                        f,
                        req,
                        "temporarily_unavailable",
                        "the identity provider names no authorization endpoint");
        asprintf_or_null(&callback, "%s/oauth/callback", a->base_url);
        if (!callback || pkce_challenge(f->verifier, &challenge) < 0 ||
            url_encode_append(&p, "response_type", "code") < 0 ||
            url_encode_append(&p, "client_id", a->client_id) < 0 ||
            url_encode_append(&p, "redirect_uri", callback) < 0 ||
            url_encode_append(
                    &p,
                    "scope",
                    a->provider == AUTH_PROVIDER_GOOGLE ? UPSTREAM_SCOPE_GOOGLE : UPSTREAM_SCOPE_DEX) < 0 ||
            url_encode_append(&p, "state", f->id) < 0 || url_encode_append(&p, "nonce", f->nonce) < 0 ||
            url_encode_append(&p, "code_challenge", challenge) < 0 ||
            url_encode_append(&p, "code_challenge_method", "S256") < 0 || !(url = url_with_query(endpoint, p)))
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        reply_redirect(req, url);
}

static void on_authorize_ready(int r, const char *error, void *userdata) {
        AuthFlow *f = userdata;
        _cleanup_(http_request_unrefp) HttpRequest *req = TAKE_PTR(f->request);

        f->wait = NULL;
        f->timer = sd_event_source_disable_unref(f->timer);
        if (r < 0 && !auth_issuer_endpoint(f->auth->upstream, "authorization_endpoint"))
                return flow_fail(f, req, "temporarily_unavailable", "the identity provider cannot be reached");
        flow_to_upstream(f, req);
}

static int on_flow_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        AuthFlow *f = userdata;
        _cleanup_(http_request_unrefp) HttpRequest *req = TAKE_PTR(f->request);

        f->timer = sd_event_source_disable_unref(f->timer);
        auth_issuer_wait_cancel(f->wait);
        f->wait = NULL;
        auth_fetch_cancel(f->fetch);
        f->fetch = NULL;
        if (req)
                flow_fail(f, req, "temporarily_unavailable", "the identity provider did not answer in time");
        return 0;
}

/* Parks req (suspending it, unless a wait before already did) until the flow's next step answers
 * it, for at most AUTH_WAIT_MAX. */
static int flow_wait(AuthFlow *f, HttpRequest *req, bool suspended) {
        int r;

        r = sd_event_add_time_relative(
                f->auth->event, &f->timer, CLOCK_MONOTONIC, AUTH_WAIT_MAX, 0, on_flow_timeout, f);
        if (r < 0)
                return r;
        f->request = http_request_ref(req);
        if (!suspended)
                http_request_suspend(req);
        return 0;
}

static void serve_authorize(Auth *a, HttpRequest *req) {
        _cleanup_(flow_freep) AuthFlow *f = NULL;
        const char *client_id = http_request_query(req, "client_id"),
                   *redirect_uri = http_request_query(req, "redirect_uri"),
                   *response_type = http_request_query(req, "response_type"),
                   *challenge = http_request_query(req, "code_challenge"),
                   *method = http_request_query(req, "code_challenge_method"),
                   *resource = http_request_query(req, "resource"), *state = http_request_query(req, "state"),
                   *scope = http_request_query(req, "scope"), *error = NULL;
        json_t *client = client_find(a, client_id);
        AuthFlow *flow;
        int r;

        /* Until the redirect URI is known good nothing goes back to it (RFC 6749 §4.1.2.1). */
        if (!client)
                return reply_oauth_error(req, 400, "invalid_request", "unknown client_id");
        if (!redirect_uri || !client_has_redirect_uri(client, redirect_uri))
                return reply_oauth_error(
                        req, 400, "invalid_request", "redirect_uri is not one the client registered");

        f = calloc(1, sizeof(AuthFlow));
        if (!f)
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        f->client_id = strdup(client_id);
        f->redirect_uri = strdup(redirect_uri);
        if (!f->client_id || !f->redirect_uri || (state && !(f->state = strdup(state))))
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        f->auth = NULL;
        {
                AuthFlow tmp = { .auth = a,
                                 .client_id = f->client_id,
                                 .redirect_uri = f->redirect_uri,
                                 .state = f->state };
                if (!response_type || !streq(response_type, "code"))
                        return flow_fail(&tmp, req, "unsupported_response_type", "response_type must be code");
                if (!challenge || !method || !streq(method, "S256") || strlen(challenge) != 43)
                        return flow_fail(
                                &tmp, req, "invalid_request", "PKCE with code_challenge_method S256 is required");
                if (resource && !streq(resource, a->resource) && !streq(resource, a->base_url))
                        return flow_fail(&tmp, req, "invalid_target", "resource is not this server");
                if (scope && strlen(scope) > PARAM_MAX)
                        return flow_fail(&tmp, req, "invalid_scope", "scope is too long");
                if (state && strlen(state) > PARAM_MAX)
                        return flow_fail(&tmp, req, "invalid_request", "state is too long");
                expire_old(a);
                if (a->n_flows >= AUTH_FLOWS_MAX)
                        return flow_fail(&tmp, req, "temporarily_unavailable", "too many logins in progress");
        }
        f->code_challenge = strdup(challenge);
        if (!f->code_challenge || (scope && !(f->scope = strdup(scope))) || random_token(24, &f->id) < 0 ||
            random_token(24, &f->nonce) < 0 || random_token(48, &f->verifier) < 0)
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        f->expires = now_usec(CLOCK_MONOTONIC) + AUTH_FLOW_LIFETIME;

        f->auth = a;
        f->next = a->flows;
        if (a->flows)
                a->flows->prev = f;
        a->flows = f;
        a->n_flows++;
        flow = TAKE_PTR(f);

        /* the IdP's discovery document names where to send the browser: fetched on first use */
        r = auth_issuer_need_keys(
                a->upstream, /* refetch= */ false, on_authorize_ready, flow, &flow->wait, &error);
        if (r == 0)
                return flow_to_upstream(flow, req);
        if (r < 0) {
                log_warning("Cannot send a login to '%s': %s", a->upstream_issuer, error ?: strerror(-r));
                return flow_fail(
                        flow, req, "temporarily_unavailable", "the identity provider cannot be reached");
        }
        if (flow_wait(flow, req, /* suspended= */ false) < 0) {
                auth_issuer_wait_cancel(flow->wait);
                flow->wait = NULL;
                return flow_fail(flow, req, "server_error", "cannot wait for the identity provider");
        }
}

/* ---- /oauth/callback ---- */

static void flow_issue_code(AuthFlow *f, HttpRequest *req, Caller *caller) {
        Auth *a = f->auth;
        _cleanup_free_ char *code = NULL;
        char *p = NULL;
        AuthCode *c;

        expire_old(a);
        if (a->n_codes >= AUTH_CODES_MAX)
                return flow_fail(f, req, "temporarily_unavailable", "too many codes waiting to be redeemed");
        c = calloc(1, sizeof(AuthCode));
        if (!c || random_token(32, &code) < 0) {
                free(c);
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        }
        sha256(code, strlen(code), c->digest);
        c->client_id = TAKE_PTR(f->client_id);
        c->redirect_uri = strdup(f->redirect_uri);
        c->code_challenge = TAKE_PTR(f->code_challenge);
        c->scope = TAKE_PTR(f->scope);
        c->caller = caller;
        c->expires = now_usec(CLOCK_MONOTONIC) + AUTH_CODE_LIFETIME;
        c->next = a->codes;
        if (a->codes)
                a->codes->prev = c;
        a->codes = c;
        a->n_codes++;
        f->client_id = strdup(c->client_id);
        log_info(
                "OAuth login of '%s' (%s) for client %s.",
                caller->subject,
                caller->email ?: "no email",
                c->client_id);

        if (url_encode_append(&p, "code", code) < 0)
                p = mfree(p);
        flow_redirect_to_client(f, req, p);
}

/* The id_token the IdP sent: checked against its keys (fetched if need be). */
static void flow_check_id_token(AuthFlow *f, HttpRequest *req, bool refetched);

static void on_callback_keys(int r, const char *error, void *userdata) {
        AuthFlow *f = userdata;
        _cleanup_(http_request_unrefp) HttpRequest *req = TAKE_PTR(f->request);
        _unused_ _cleanup_(flow_freep) AuthFlow *pin = f;

        f->wait = NULL;
        f->timer = sd_event_source_disable_unref(f->timer);
        if (r < 0 && !auth_issuer_keys(f->auth->upstream)) {
                log_warning(
                        "Cannot check an id_token of '%s': %s",
                        f->auth->upstream_issuer,
                        error ?: strerror(-r));
                return flow_fail(
                        f, req, "temporarily_unavailable", "the identity provider's keys cannot be fetched");
        }
        flow_check_id_token(f, req, true);
        if (f->request) /* waits again */
                pin = NULL;
}

static void flow_check_id_token(AuthFlow *f, HttpRequest *req, bool refetched) {
        _cleanup_(auth_token_freep) AuthToken *t = NULL;
        _cleanup_(caller_freep) Caller *caller = NULL;
        char *aud[] = { f->auth->client_id, NULL };
        const char *reason = NULL, *error = NULL;
        int r;

        r = auth_token_parse(f->id_token, strlen(f->id_token), &t, &reason);
        if (r >= 0)
                r = auth_verify_upstream(f->auth, t, aud, f->nonce, &caller, &reason);
        if (IN_SET(r, -ENOKEY, -EKEYREJECTED) && !refetched) {
                r = auth_issuer_need_keys(
                        f->auth->upstream,
                        auth_issuer_keys(f->auth->upstream) != NULL,
                        on_callback_keys,
                        f,
                        &f->wait,
                        &error);
                /* req waited for the code exchange already: it is suspended */
                if (r == 1 && flow_wait(f, req, /* suspended= */ true) >= 0)
                        return;
                if (r == 0)
                        r = auth_verify_upstream(f->auth, t, aud, f->nonce, &caller, &reason);
                if (r == 1)
                        r = -ENOMEM;
                if (error)
                        reason = error;
        }
        if (r < 0) {
                log_warning(
                        "Refusing the id_token of '%s': %s", f->auth->upstream_issuer, reason ?: strerror(-r));
                return flow_fail(f, req, "access_denied", "the identity provider's id_token was refused");
        }
        flow_issue_code(f, req, TAKE_PTR(caller));
}

static void on_upstream_token(int r, long status, json_t *body, const char *error, void *userdata) {
        AuthFlow *f = userdata;
        _cleanup_(http_request_unrefp) HttpRequest *req = TAKE_PTR(f->request);
        _unused_ _cleanup_(flow_freep) AuthFlow *pin = f;
        const char *id_token = json_string_value(json_object_get(body, "id_token"));

        f->fetch = NULL;
        f->timer = sd_event_source_disable_unref(f->timer);
        if (r < 0) {
                log_warning("The code exchange with '%s' failed: %s", f->auth->upstream_issuer, error);
                return flow_fail(f, req, "temporarily_unavailable", "the identity provider cannot be reached");
        }
        if (status != 200 || !id_token) {
                log_warning(
                        "The code exchange with '%s' failed: status %ld, error '%s'",
                        f->auth->upstream_issuer,
                        status,
                        json_string_value(json_object_get(body, "error")) ?: "(none)");
                return flow_fail(f, req, "access_denied", "the identity provider refused the code");
        }
        f->id_token = strdup(id_token);
        if (!f->id_token)
                return (void) http_request_reply_text(req, 500, "out of memory\n");
        flow_check_id_token(f, req, false);
        if (f->request) /* waits for keys */
                pin = NULL;
}

static void serve_callback(Auth *a, HttpRequest *req) {
        const char *state = http_request_query(req, "state"), *code = http_request_query(req, "code"),
                   *error = http_request_query(req, "error"), *endpoint;
        _cleanup_free_ char *form = NULL, *callback = NULL;
        AuthFlow *f = NULL;
        int r;

        expire_old(a);
        for (AuthFlow *i = a->flows; state && i; i = i->next)
                if (streq(i->id, state) && !i->request && !i->fetch && !i->id_token) {
                        f = i;
                        break;
                }
        if (!f)
                return reply_oauth_error(req, 400, "invalid_request", "unknown or expired login (state)");
        if (error || !code) {
                _unused_ _cleanup_(flow_freep) AuthFlow *pin = f;
                log_info("The identity provider ended a login with '%s'.", error ?: "no code");
                return flow_fail(f, req, "access_denied", "the login at the identity provider did not succeed");
        }
        endpoint = auth_issuer_endpoint(a->upstream, "token_endpoint");
        asprintf_or_null(&callback, "%s/oauth/callback", a->base_url);
        if (!endpoint || !callback || url_encode_append(&form, "grant_type", "authorization_code") < 0 ||
            url_encode_append(&form, "code", code) < 0 ||
            url_encode_append(&form, "redirect_uri", callback) < 0 ||
            url_encode_append(&form, "code_verifier", f->verifier) < 0) {
                _unused_ _cleanup_(flow_freep) AuthFlow *pin = f;
                return flow_fail(f, req, "server_error", "cannot build the code exchange");
        }
        r = auth_fetch(
                a->fetcher,
                &(AuthFetchRequest){ .url = endpoint,
                                     .form = form,
                                     .user = a->client_id,
                                     .password = a->client_secret,
                                     .allow_private = a->allow_private_oauth_urls,
                                     .private_flag = "allow-private-oauth-urls" },
                on_upstream_token,
                f,
                &f->fetch);
        if (r >= 0)
                r = flow_wait(f, req, /* suspended= */ false);
        if (r < 0) {
                _unused_ _cleanup_(flow_freep) AuthFlow *pin = f;
                return flow_fail(f, req, "server_error", "cannot start the code exchange");
        }
}

/* ---- /oauth/token ---- */

static int issue_tokens(
        Auth *a, const char *client_id, const Caller *c, const char *scope, const char *family, json_t **ret) {
        _cleanup_free_ char *jti = NULL, *access = NULL, *refresh = NULL, *hash = NULL, *fam = NULL;
        json_auto_t *claims = NULL, *groups = json_array(), *record = NULL, *answer = NULL;
        usec_t now = now_usec(CLOCK_REALTIME);
        json_int_t iat = (json_int_t) (now / USEC_PER_SEC);
        int r;

        if (!groups)
                return -ENOMEM;
        for (char **g = c->groups; g && *g; g++)
                if (json_array_append_new(groups, json_string(*g)) < 0)
                        return -ENOMEM;
        if (random_token(16, &jti) < 0 || random_token(32, &refresh) < 0 || !(hash = sha256_hex(refresh)))
                return -EIO;
        if (!family && random_token(12, &fam) < 0)
                return -EIO;
        claims = json_pack(
                "{s:s,s:s,s:s,s:I,s:I,s:I,s:s,s:s,s:O}",
                "iss",
                a->base_url,
                "sub",
                c->subject,
                "aud",
                a->resource,
                "iat",
                iat,
                "nbf",
                iat,
                "exp",
                iat + (json_int_t) (AUTH_ACCESS_TOKEN_LIFETIME / USEC_PER_SEC),
                "jti",
                jti,
                "client_id",
                client_id,
                "groups",
                groups);
        if (!claims || (c->email && json_object_set_new(claims, "email", json_string(c->email)) < 0) ||
            (scope && json_object_set_new(claims, "scope", json_string(scope)) < 0))
                return -ENOMEM;
        r = auth_jwt_sign(claims, a->signing_key, a->signing_kid, "at+jwt", &access);
        if (r < 0)
                return r;

        record = json_pack(
                "{s:s,s:s,s:O,s:s,s:f,s:b}",
                "client_id",
                client_id,
                "sub",
                c->subject,
                "groups",
                groups,
                "family",
                family ?: fam,
                "expires",
                (double) (now + AUTH_REFRESH_TOKEN_LIFETIME) / USEC_PER_SEC,
                "used",
                false);
        if (!record || (c->email && json_object_set_new(record, "email", json_string(c->email)) < 0) ||
            (scope && json_object_set_new(record, "scope", json_string(scope)) < 0) ||
            json_object_set(json_object_get(a->state, "refresh"), hash, record) < 0)
                return -ENOMEM;
        r = state_save(a);
        if (r < 0) {
                json_object_del(json_object_get(a->state, "refresh"), hash);
                return r;
        }

        answer = json_pack(
                "{s:s,s:s,s:I,s:s}",
                "access_token",
                access,
                "token_type",
                "Bearer",
                "expires_in",
                (json_int_t) (AUTH_ACCESS_TOKEN_LIFETIME / USEC_PER_SEC),
                "refresh_token",
                refresh);
        if (!answer || (scope && json_object_set_new(answer, "scope", json_string(scope)) < 0))
                return -ENOMEM;
        *ret = TAKE_PTR(answer);
        return 0;
}

static void revoke_family(Auth *a, const char *family) {
        json_t *refresh = json_object_get(a->state, "refresh"), *v;
        const char *k;
        void *tmp;

        json_object_foreach_safe(refresh, tmp, k, v) {
                const char *f = json_string_value(json_object_get(v, "family"));
                if (f && streq(f, family))
                        json_object_del(refresh, k);
        }
}

static void grant_code(Auth *a, HttpRequest *req, json_t *form, const char *client_id) {
        const char *code = form_get(form, "code"), *verifier = form_get(form, "code_verifier"),
                   *redirect_uri = form_get(form, "redirect_uri"), *resource = form_get(form, "resource");
        _cleanup_free_ char *challenge = NULL;
        json_auto_t *answer = NULL;
        AuthCode *c = NULL;
        uint8_t d[32];
        int r;

        if (!code || !verifier || !redirect_uri)
                return reply_oauth_error(
                        req, 400, "invalid_request", "code, code_verifier and redirect_uri are required");
        expire_old(a);
        sha256(code, strlen(code), d);
        for (AuthCode *i = a->codes; i; i = i->next)
                if (CRYPTO_memcmp(i->digest, d, 32) == 0) {
                        c = i;
                        break;
                }
        if (!c)
                return reply_oauth_error(req, 400, "invalid_grant", "unknown, used or expired code");
        /* single use, whatever happens next */
        code_unlink(a, c);
        if (!streq(c->client_id, client_id) || !streq(c->redirect_uri, redirect_uri)) {
                code_free(c);
                return reply_oauth_error(
                        req, 400, "invalid_grant", "the code was issued to another client or redirect_uri");
        }
        if (!pkce_verifier_valid(verifier) || pkce_challenge(verifier, &challenge) < 0 ||
            !secrets_equal(challenge, c->code_challenge)) {
                code_free(c);
                return reply_oauth_error(
                        req, 400, "invalid_grant", "code_verifier does not match the code_challenge");
        }
        if (resource && !streq(resource, a->resource) && !streq(resource, a->base_url)) {
                code_free(c);
                return reply_oauth_error(req, 400, "invalid_target", "resource is not this server");
        }
        r = issue_tokens(a, client_id, c->caller, c->scope, /* family= */ NULL, &answer);
        code_free(c);
        if (r < 0)
                return reply_oauth_error(req, 500, "server_error", "cannot issue tokens");
        reply_json_no_store(req, 200, answer);
}

static void grant_refresh(Auth *a, HttpRequest *req, json_t *form, const char *client_id) {
        const char *token = form_get(form, "refresh_token"), *resource = form_get(form, "resource");
        _cleanup_free_ char *hash = NULL, *family = NULL;
        _cleanup_(caller_freep) Caller *caller = NULL;
        json_t *refresh = json_object_get(a->state, "refresh"), *rec, *v;
        json_auto_t *answer = NULL;
        const char *scope;
        size_t i, n = 0;
        int r;

        if (!token)
                return reply_oauth_error(req, 400, "invalid_request", "refresh_token is required");
        if (resource && !streq(resource, a->resource) && !streq(resource, a->base_url))
                return reply_oauth_error(req, 400, "invalid_target", "resource is not this server");
        hash = sha256_hex(token);
        rec = hash ? json_object_get(refresh, hash) : NULL;
        if (!rec ||
            json_number_value(json_object_get(rec, "expires")) <=
                    (double) now_usec(CLOCK_REALTIME) / USEC_PER_SEC)
                return reply_oauth_error(
                        req, 400, "invalid_grant", "unknown, revoked or expired refresh token");
        if (!streq(json_string_value(json_object_get(rec, "client_id")) ?: "", client_id))
                return reply_oauth_error(
                        req, 400, "invalid_grant", "the refresh token belongs to another client");
        family = strdup(json_string_value(json_object_get(rec, "family")) ?: "");
        if (!family)
                return reply_oauth_error(req, 500, "server_error", "out of memory");
        if (json_is_true(json_object_get(rec, "used"))) {
                /* a rotated token came back: someone holds a copy; end the whole family */
                log_warning(
                        "A rotated refresh token of client %s was used again; revoking its family.",
                        client_id);
                revoke_family(a, family);
                (void) state_save(a);
                return reply_oauth_error(req, 400, "invalid_grant", "the refresh token was already used");
        }

        caller = calloc(1, sizeof(Caller));
        if (!caller)
                return reply_oauth_error(req, 500, "server_error", "out of memory");
        caller->source = CALLER_SOURCE_OAUTH;
        caller->subject = strdup(json_string_value(json_object_get(rec, "sub")) ?: "");
        if (json_string_value(json_object_get(rec, "email")))
                caller->email = strdup(json_string_value(json_object_get(rec, "email")));
        caller->groups = calloc(json_array_size(json_object_get(rec, "groups")) + 1, sizeof(char *));
        if (!caller->subject || !caller->groups)
                return reply_oauth_error(req, 500, "server_error", "out of memory");
        json_array_foreach(json_object_get(rec, "groups"), i, v) if (
                json_is_string(v) &&
                !(caller->groups[n++] = strdup(json_string_value(
                          v)))) return reply_oauth_error(req, 500, "server_error", "out of memory");
        scope = json_string_value(json_object_get(rec, "scope"));

        /* rotation: the old token stays, marked used, until it expires, to recognise a replay */
        if (json_object_set_new(rec, "used", json_true()) < 0)
                return reply_oauth_error(req, 500, "server_error", "out of memory");
        r = issue_tokens(a, client_id, caller, scope, family, &answer);
        if (r < 0) {
                (void) json_object_set_new(rec, "used", json_false());
                return reply_oauth_error(req, 500, "server_error", "cannot issue tokens");
        }
        reply_json_no_store(req, 200, answer);
}

static json_t *request_form(HttpRequest *req) {
        size_t size;
        const char *body = http_request_body(req, &size);
        const char *ct = http_request_header(req, "Content-Type");

        if (!ct || strncasecmp(ct, "application/x-www-form-urlencoded", 33) != 0)
                return NULL;
        return form_parse(body, size);
}

static void serve_token(Auth *a, HttpRequest *req) {
        json_auto_t *form = request_form(req);
        const char *grant = form_get(form, "grant_type"), *client_id = NULL;

        if (!form)
                return reply_oauth_error(
                        req,
                        400,
                        "invalid_request",
                        "want an application/x-www-form-urlencoded body without repeated parameters");
        if (!client_authenticate(a, req, form, &client_id))
                return;
        if (grant && streq(grant, "authorization_code"))
                return grant_code(a, req, form, client_id);
        if (grant && streq(grant, "refresh_token"))
                return grant_refresh(a, req, form, client_id);
        reply_oauth_error(
                req, 400, "unsupported_grant_type", "grant_type: want authorization_code or refresh_token");
}

/* ---- /oauth/revoke (RFC 7009) ---- */

static void serve_revoke(Auth *a, HttpRequest *req) {
        json_auto_t *form = request_form(req);
        const char *token = form_get(form, "token"), *client_id = NULL, *reason = NULL;
        _cleanup_(auth_token_freep) AuthToken *t = NULL;
        _cleanup_free_ char *hash = NULL;
        json_t *rec;

        if (!form || !token)
                return reply_oauth_error(req, 400, "invalid_request", "token is required");
        if (!client_authenticate(a, req, form, &client_id))
                return;

        hash = sha256_hex(token);
        rec = hash ? json_object_get(json_object_get(a->state, "refresh"), hash) : NULL;
        if (rec && streq(json_string_value(json_object_get(rec, "client_id")) ?: "", client_id)) {
                _cleanup_free_ char *family = strdup(json_string_value(json_object_get(rec, "family")) ?: "");
                if (family) {
                        revoke_family(a, family);
                        (void) state_save(a);
                        log_info("Revoked a refresh token family of client %s.", client_id);
                }
        } else if (
                auth_token_parse(token, strlen(token), &t, &reason) >= 0 &&
                auth_token_verify(t, a->own_keys, &reason) >= 0 &&
                streq(auth_token_claim_string(t, "iss") ?: "", a->base_url) &&
                streq(auth_token_claim_string(t, "client_id") ?: "", client_id) &&
                auth_token_claim_string(t, "jti")) {
                double exp = (double) auth_token_expiry(t) / USEC_PER_SEC;

                if (json_object_set_new(
                            json_object_get(a->state, "revoked"),
                            auth_token_claim_string(t, "jti"),
                            json_real(exp)) >= 0) {
                        (void) state_save(a);
                        auth_cache_flush(a);
                        log_info("Revoked an access token of client %s.", client_id);
                }
        }
        /* RFC 7009 §2.2: 200 whether or not there was anything to revoke */
        (void) http_request_add_header(req, "Cache-Control", "no-store");
        (void) http_request_reply(req, 200, "application/json", "{}\n", 3);
}

/* ---- routing ---- */

bool auth_server_handle(Auth *a, HttpRequest *req) {
        const char *path = http_request_path(req), *method = http_request_method(req), *rest;
        bool get = streq(method, "GET") || streq(method, "HEAD"), post = streq(method, "POST");

        rest = startswith(path, "/.well-known/oauth-protected-resource");
        if (rest && get && (!*rest || streq(rest, a->mcp_path))) {
                serve_protected_resource(a, req);
                return true;
        }
        if (get && streq(path, "/.well-known/oauth-authorization-server")) {
                serve_authorization_server(a, req);
                return true;
        }
        if (get && streq(path, "/oauth/jwks")) {
                (void) http_request_reply_json(req, 200, a->own_jwks);
                return true;
        }
        if (get && streq(path, "/oauth/authorize")) {
                serve_authorize(a, req);
                return true;
        }
        if (get && streq(path, "/oauth/callback")) {
                serve_callback(a, req);
                return true;
        }
        if (post && streq(path, "/oauth/token")) {
                serve_token(a, req);
                return true;
        }
        if (post && streq(path, "/oauth/register")) {
                serve_register(a, req);
                return true;
        }
        if (post && streq(path, "/oauth/revoke")) {
                serve_revoke(a, req);
                return true;
        }
        return false;
}
