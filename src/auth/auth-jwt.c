/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <cjose/header.h>
#include <cjose/jws.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth-jwt.h"
#include "cjose-util.h"
#include "hex-util.h"
#include "log.h"
#include "string-table.h"

typedef enum AuthKeyType {
        AUTH_KEY_EC_P256,
        AUTH_KEY_RSA,
} AuthKeyType;

typedef struct AuthKey {
        char *kid; /* may be NULL */
        AuthKeyType type;
        cjose_jwk_t *jwk;
} AuthKey;

struct AuthKeySet {
        AuthKey *keys;
        size_t n;
};

#define AUTH_KEYS_MAX 64
#define AUTH_RSA_BITS_MIN 2048

static const char *const auth_alg_table[_AUTH_ALG_MAX] = {
        [AUTH_ALG_ES256] = "ES256",
        [AUTH_ALG_RS256] = "RS256",
        [AUTH_ALG_PS256] = "PS256",
};

DEFINE_STRING_TABLE_LOOKUP(auth_alg, AuthAlg);

static AuthKeyType alg_key_type(AuthAlg a) {
        return a == AUTH_ALG_ES256 ? AUTH_KEY_EC_P256 : AUTH_KEY_RSA;
}

/* ---- key sets ---- */

AuthKeySet *auth_keyset_free(AuthKeySet *s) {
        if (!s)
                return NULL;
        for (size_t i = 0; i < s->n; i++) {
                free(s->keys[i].kid);
                cjose_jwk_release(s->keys[i].jwk);
        }
        free(s->keys);
        free(s);
        return NULL;
}

size_t auth_keyset_size(const AuthKeySet *s) {
        return s ? s->n : 0;
}

bool auth_keyset_has_kid(const AuthKeySet *s, const char *kid) {
        for (size_t i = 0; s && kid && i < s->n; i++)
                if (s->keys[i].kid && streq(s->keys[i].kid, kid))
                        return true;
        return false;
}

/* Whether s is base64url as strict as ours. libcjose 0.6.2 aborts on an assertion for some
 * malformed base64 (a length of 4k+1), so nothing reaches it unchecked. */
static bool is_base64url(const char *s, size_t n) {
        _cleanup_free_ uint8_t *d = NULL;
        size_t size;

        return base64url_decode(s, n, &d, &size) >= 0;
}

/* The key members of a JWK that libcjose decodes: all strict base64url where present. */
static bool jwk_members_valid(json_t *jwk) {
        static const char *const members[] = { "n", "e", "x", "y", "d", "p", "q", "dp", "dq", "qi", "k" };

        for (size_t i = 0; i < ELEMENTSOF(members); i++) {
                json_t *v = json_object_get(jwk, members[i]);

                if (v && (!json_is_string(v) || !is_base64url(json_string_value(v), json_string_length(v))))
                        return false;
        }
        return true;
}

/* One JWK: 1 imported, 0 skipped. */
static int keyset_add(AuthKeySet *s, json_t *jwk) {
        const char *kty = json_string_value(json_object_get(jwk, "kty"));
        const char *use = json_string_value(json_object_get(jwk, "use"));
        const char *kid = json_string_value(json_object_get(jwk, "kid"));
        json_t *alg = json_object_get(jwk, "alg");
        _cleanup_(cjose_jwk_releasep) cjose_jwk_t *k = NULL;
        cjose_err err;
        AuthKeyType type;

        if (!json_is_object(jwk) || !kty)
                return 0;
        if (json_object_get(jwk, "use") && (!use || !streq(use, "sig")))
                return 0;
        if (streq(kty, "EC")) {
                const char *crv = json_string_value(json_object_get(jwk, "crv"));
                if (!crv || !streq(crv, "P-256"))
                        return 0;
                type = AUTH_KEY_EC_P256;
        } else if (streq(kty, "RSA"))
                type = AUTH_KEY_RSA;
        else
                return 0; /* "oct" (HMAC) above all: a shared secret is never a verification key */
        /* a key that names its algorithm is used with that one only */
        if (alg) {
                AuthAlg a = auth_alg_from_string(json_string_value(alg));
                if (a < 0 || alg_key_type(a) != type)
                        return 0;
        }
        if (kid && strlen(kid) > AUTH_CLAIM_STRING_MAX)
                return 0;
        if (!jwk_members_valid(jwk))
                return 0;

        k = cjose_jwk_import_json((cjose_header_t *) jwk, &err);
        if (!k) {
                log_debug("Skipping a JWK that does not import: %s", err.message ?: "unknown error");
                return 0;
        }
        if (type == AUTH_KEY_RSA && cjose_jwk_get_keysize(k, &err) < AUTH_RSA_BITS_MIN)
                return 0;
        s->keys[s->n] = (AuthKey){ .type = type };
        if (kid && !(s->keys[s->n].kid = strdup(kid)))
                return -ENOMEM;
        s->keys[s->n].jwk = TAKE_PTR(k);
        s->n++;
        return 1;
}

int auth_keyset_from_json(const json_t *jwks, AuthKeySet **ret, const char **ret_reason) {
        _cleanup_(auth_keyset_freep) AuthKeySet *s = NULL;
        json_t *keys = json_object_get(jwks, "keys");
        size_t n = json_array_size(keys);
        const char *reason;
        int r;

        assert_return(ret, -EINVAL);

        if (!json_is_array(keys)) {
                reason = "the JWKS has no \"keys\" array";
                goto bad;
        }
        s = calloc(1, sizeof(AuthKeySet));
        if (!s)
                return -ENOMEM;
        s->keys = calloc(MIN(n, (size_t) AUTH_KEYS_MAX) + 1, sizeof(AuthKey));
        if (!s->keys)
                return -ENOMEM;
        for (size_t i = 0; i < n && s->n < AUTH_KEYS_MAX; i++) {
                r = keyset_add(s, json_array_get(keys, i));
                if (r < 0)
                        return r;
        }
        if (s->n == 0) {
                reason = "the JWKS holds no EC P-256 or RSA signing key";
                goto bad;
        }
        *ret = TAKE_PTR(s);
        return 0;

bad:
        if (ret_reason)
                *ret_reason = reason;
        return -EINVAL;
}

/* ---- tokens ---- */

AuthToken *auth_token_free(AuthToken *t) {
        if (!t)
                return NULL;
        free(t->kid);
        json_decref(t->header);
        json_decref(t->claims);
        free(t->compact);
        free(t);
        return NULL;
}

static json_t *decode_json_part(const char *s, size_t n) {
        _cleanup_free_ uint8_t *raw = NULL;
        size_t size;

        if (n == 0 || base64url_decode(s, n, &raw, &size) < 0)
                return NULL;
        /* duplicate member names are a classic way to show two parsers two different tokens */
        return json_loadb((const char *) raw, size, JSON_REJECT_DUPLICATES, NULL);
}

static bool typ_allowed(const char *typ) {
        return strcasecmp(typ, "JWT") == 0 || strcasecmp(typ, "at+jwt") == 0 ||
                strcasecmp(typ, "application/at+jwt") == 0;
}

int auth_token_parse(const char *s, size_t n, AuthToken **ret, const char **ret_reason) {
        _cleanup_(auth_token_freep) AuthToken *t = NULL;
        const char *dot1, *dot2, *end = s + n, *reason, *alg, *typ, *kid;
        json_t *v;

        assert_return(ret && (s || n == 0), -EINVAL);

        if (n > AUTH_TOKEN_MAX) {
                if (ret_reason)
                        *ret_reason = "the token is larger than 8 KiB";
                return -E2BIG;
        }
        dot1 = memchr(s, '.', n);
        dot2 = dot1 ? memchr(dot1 + 1, '.', (size_t) (end - dot1 - 1)) : NULL;
        if (!dot2 || memchr(dot2 + 1, '.', (size_t) (end - dot2 - 1))) {
                reason = "not a compact JWS (three dot-separated parts)";
                goto bad;
        }
        /* libcjose decodes the signature again, and aborts on some malformed base64 */
        if (!is_base64url(dot2 + 1, (size_t) (end - dot2 - 1))) {
                reason = "the signature is not base64url";
                goto bad;
        }

        t = calloc(1, sizeof(AuthToken));
        if (!t)
                return -ENOMEM;
        t->header = decode_json_part(s, (size_t) (dot1 - s));
        if (!json_is_object(t->header)) {
                reason = "the header is not base64url-encoded JSON";
                goto bad;
        }
        alg = json_string_value(json_object_get(t->header, "alg"));
        if (!alg) {
                reason = "the header has no alg";
                goto bad;
        }
        t->alg = auth_alg_from_string(alg);
        if (t->alg < 0) {
                reason = strcasecmp(alg, "none") == 0 ? "alg none is refused" :
                        alg[0] == 'H'                 ? "HMAC algorithms are refused" :
                                                        "the algorithm is not ES256, RS256 or PS256";
                goto bad;
        }
        if (dot2 + 1 == end) {
                reason = "the token is unsigned";
                goto bad;
        }
        v = json_object_get(t->header, "typ");
        typ = json_string_value(v);
        if (v && (!typ || !typ_allowed(typ))) {
                reason = "typ is neither JWT nor at+jwt";
                goto bad;
        }
        if (json_object_get(t->header, "crit")) {
                reason = "the header has crit parameters we do not understand";
                goto bad;
        }
        v = json_object_get(t->header, "kid");
        kid = json_string_value(v);
        if (v && (!kid || strlen(kid) > AUTH_CLAIM_STRING_MAX)) {
                reason = "kid is not a string";
                goto bad;
        }
        if (kid && !(t->kid = strdup(kid)))
                return -ENOMEM;

        t->claims = decode_json_part(dot1 + 1, (size_t) (dot2 - dot1 - 1));
        if (!json_is_object(t->claims)) {
                reason = "the payload is not a base64url-encoded JSON object";
                goto bad;
        }
        t->compact = strndup(s, n);
        if (!t->compact)
                return -ENOMEM;
        t->size = n;
        *ret = TAKE_PTR(t);
        return 0;

bad:
        if (ret_reason)
                *ret_reason = reason;
        return -EBADMSG;
}

const char *auth_token_claim_string(const AuthToken *t, const char *name) {
        return json_string_value(json_object_get(t->claims, name));
}

int auth_token_verify(const AuthToken *t, const AuthKeySet *keys, const char **ret_reason) {
        AuthKeyType type = alg_key_type(t->alg);
        cjose_err err;
        bool tried = false, ok = false;

        assert_return(t && t->compact, -EINVAL);

        for (size_t i = 0; keys && i < keys->n && !ok; i++) {
                const AuthKey *k = &keys->keys[i];

                if (t->kid && (!k->kid || !streq(t->kid, k->kid)))
                        continue;
                if (k->type != type)
                        continue;
                /* cjose keeps the verification state in the JWS: a fresh import for each key */
                _cleanup_(cjose_jws_releasep) cjose_jws_t *jws = cjose_jws_import(t->compact, t->size, &err);
                if (!jws) {
                        if (ret_reason)
                                *ret_reason = "libcjose cannot import the token";
                        return -EBADMSG;
                }
                tried = true;
                ok = cjose_jws_verify(jws, k->jwk, &err);
        }
        if (ok)
                return 0;
        if (!tried) {
                if (ret_reason)
                        *ret_reason = t->kid ? "no key with the token's kid" : "no key of the token's type";
                return -ENOKEY;
        }
        if (ret_reason)
                *ret_reason = "the signature does not verify";
        return -EKEYREJECTED;
}

/* A NumericDate claim: 1 with the value, 0 absent, -EBADMSG not a number. */
static int claim_time(const AuthToken *t, const char *name, double *ret) {
        json_t *v = json_object_get(t->claims, name);

        if (!v)
                return 0;
        if (!json_is_number(v))
                return -EBADMSG;
        *ret = json_number_value(v);
        return 1;
}

static bool audience_matches(json_t *aud, char *const *audiences) {
        if (json_is_string(aud)) {
                for (char *const *a = audiences; a && *a; a++)
                        if (streq(*a, json_string_value(aud)))
                                return true;
                return false;
        }
        if (json_is_array(aud)) {
                size_t i;
                json_t *e;

                json_array_foreach(
                        aud, i, e) if (json_is_string(e) && audience_matches(e, audiences)) return true;
        }
        return false;
}

int auth_token_check_claims(const AuthToken *t, const AuthClaimCheck *c, const char **ret_reason) {
        double now = (double) c->now / USEC_PER_SEC, skew = (double) c->skew / USEC_PER_SEC, v;
        const char *iss = auth_token_claim_string(t, "iss"), *sub = auth_token_claim_string(t, "sub"), *reason;
        int r;

        assert_return(t && c && c->issuer, -EINVAL);

        if (!iss || !streq(iss, c->issuer)) {
                reason = "wrong issuer";
                goto bad;
        }
        if (!audience_matches(json_object_get(t->claims, "aud"), c->audiences)) {
                reason = "the audience is neither this server nor a trusted one";
                goto bad;
        }
        r = claim_time(t, "exp", &v);
        if (r <= 0) {
                reason = "exp is missing";
                goto bad;
        }
        if (now >= v + skew) {
                reason = "the token has expired";
                goto bad;
        }
        r = claim_time(t, "nbf", &v);
        if (r < 0 || (r > 0 && v > now + skew)) {
                reason = "the token is not valid yet (nbf)";
                goto bad;
        }
        r = claim_time(t, "iat", &v);
        if (r < 0 || (r > 0 && v > now + skew)) {
                reason = "the token was issued in the future (iat)";
                goto bad;
        }
        if (!sub || !*sub || strlen(sub) > AUTH_CLAIM_STRING_MAX) {
                reason = "sub is missing";
                goto bad;
        }
        if (c->nonce) {
                const char *nonce = auth_token_claim_string(t, "nonce");
                if (!nonce || !streq(nonce, c->nonce)) {
                        reason = "the nonce does not match";
                        goto bad;
                }
        }
        return 0;

bad:
        if (ret_reason)
                *ret_reason = reason;
        return -EACCES;
}

usec_t auth_token_expiry(const AuthToken *t) {
        double v;

        if (claim_time(t, "exp", &v) <= 0 || v <= 0)
                return 0;
        if (v >= (double) (USEC_INFINITY / USEC_PER_SEC))
                return USEC_INFINITY - 1;
        return (usec_t) v * USEC_PER_SEC;
}

int auth_token_caller(const AuthToken *t, CallerSource source, Caller **ret) {
        _cleanup_(caller_freep) Caller *c = NULL;
        const char *sub = auth_token_claim_string(t, "sub"), *email = auth_token_claim_string(t, "email");
        json_t *groups = json_object_get(t->claims, "groups"), *g;
        size_t i, n = 0;

        assert_return(ret && sub, -EINVAL);

        c = calloc(1, sizeof(Caller));
        if (!c)
                return -ENOMEM;
        c->source = source;
        c->subject = strdup(sub);
        if (!c->subject)
                return -ENOMEM;
        if (email && strlen(email) <= AUTH_CLAIM_STRING_MAX && !(c->email = strdup(email)))
                return -ENOMEM;
        if (json_is_array(groups)) {
                c->groups = calloc(MIN(json_array_size(groups), (size_t) AUTH_GROUPS_MAX) + 1, sizeof(char *));
                if (!c->groups)
                        return -ENOMEM;
                json_array_foreach(groups, i, g) {
                        if (n >= AUTH_GROUPS_MAX)
                                break;
                        if (!json_is_string(g) || json_string_length(g) > AUTH_CLAIM_STRING_MAX)
                                continue;
                        if (!(c->groups[n++] = strdup(json_string_value(g))))
                                return -ENOMEM;
                }
        }
        *ret = TAKE_PTR(c);
        return 0;
}

int auth_jwt_sign(const json_t *claims, const cjose_jwk_t *key, const char *kid, const char *typ, char **ret) {
        _cleanup_free_ char *payload = NULL;
        _cleanup_(cjose_header_releasep) cjose_header_t *h = NULL;
        _cleanup_(cjose_jws_releasep) cjose_jws_t *jws = NULL;
        const char *compact = NULL;
        cjose_err err;
        char *s;

        assert_return(claims && key && kid && typ && ret, -EINVAL);

        payload = json_dumps(claims, JSON_COMPACT);
        h = cjose_header_new(&err);
        if (!payload || !h)
                return -ENOMEM;
        if (!cjose_header_set(h, CJOSE_HDR_ALG, CJOSE_HDR_ALG_ES256, &err) ||
            !cjose_header_set(h, CJOSE_HDR_KID, kid, &err) || !cjose_header_set(h, "typ", typ, &err))
                return -ENOMEM;
        jws = cjose_jws_sign(key, h, (const uint8_t *) payload, strlen(payload), &err);
        if (!jws) {
                log_debug("Signing a token failed: %s", err.message ?: "unknown error");
                return -EIO;
        }
        if (!cjose_jws_export(jws, &compact, &err) || !compact)
                return -EIO;
        s = strdup(compact);
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}
