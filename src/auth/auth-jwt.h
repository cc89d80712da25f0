/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <cjose/jwk.h>
#include <jansson.h>
#include <stdbool.h>

#include "caller.h"
#include "cleanup.h"
#include "time-util.h"

/* JSON Web Tokens as bearer tokens: parsing, signature verification with libcjose against a key
 * set, and our own claim checks. Pure: no I/O, the clock is passed in. Every refusal comes with a
 * short static reason for the log (never for the client).
 *
 * Accepted: compact JWS with alg ES256 (EC P-256 keys), RS256 or PS256 (RSA keys of 2048 bits or
 * more); typ absent, "JWT" or "at+jwt" (RFC 9068, also "application/at+jwt"). Never "none", never
 * HMAC, never an algorithm that does not match the key's type. */

#define AUTH_TOKEN_MAX 8192        /* bytes of a whole token; larger ones are refused unread */
#define AUTH_CLAIM_STRING_MAX 1024 /* bytes of sub, email, iss, and of one group */
#define AUTH_GROUPS_MAX 256        /* groups kept from a token */
#define AUTH_CLOCK_SKEW_DEFAULT (60 * USEC_PER_SEC)

typedef enum AuthAlg {
        AUTH_ALG_ES256,
        AUTH_ALG_RS256,
        AUTH_ALG_PS256,
        _AUTH_ALG_MAX,
        _AUTH_ALG_INVALID = -EINVAL,
} AuthAlg;

const char *auth_alg_to_string(AuthAlg a);
AuthAlg auth_alg_from_string(const char *s);

/* The verification keys of a JWKS, by kid. */
typedef struct AuthKeySet AuthKeySet;

/* Imports every usable key of a JWKS document ({"keys":[…]}): EC P-256 and RSA (≥ 2048 bits) keys
 * whose "use" is absent or "sig"; symmetric, private-only or unknown keys are skipped. -EINVAL
 * (with a reason) for a document that is not a JWKS, or that holds no usable key. */
int auth_keyset_from_json(const json_t *jwks, AuthKeySet **ret, const char **ret_reason);
AuthKeySet *auth_keyset_free(AuthKeySet *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(AuthKeySet *, auth_keyset_free);
size_t auth_keyset_size(const AuthKeySet *s);
bool auth_keyset_has_kid(const AuthKeySet *s, const char *kid);

/* A token taken apart, not yet trusted. */
typedef struct AuthToken {
        AuthAlg alg;
        char *kid; /* NULL: the header names none */
        json_t *header;
        json_t *claims; /* the payload: an object */
        char *compact;  /* the token itself, NUL-terminated */
        size_t size;
} AuthToken;

/* Splits and decodes a compact JWS: three base64url parts, a JSON header with an allowed alg and
 * typ, a JSON object payload, a non-empty signature. -EBADMSG with a reason otherwise; -E2BIG for
 * a token over AUTH_TOKEN_MAX. */
int auth_token_parse(const char *s, size_t n, AuthToken **ret, const char **ret_reason);
AuthToken *auth_token_free(AuthToken *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(AuthToken *, auth_token_free);

/* A string claim (unverified until the checks pass); NULL when absent or not a string. */
const char *auth_token_claim_string(const AuthToken *t, const char *name);

/* Verifies the signature with the key the header's kid names (or, without a kid, every key of the
 * algorithm's type). -ENOKEY when no key fits, -EKEYREJECTED when the signature does not verify
 * with those that do: either way the caller may refetch the JWKS (a provider may put a new key
 * under an old kid) and try once more. -EBADMSG when the token cannot be imported. */
int auth_token_verify(const AuthToken *t, const AuthKeySet *keys, const char **ret_reason);

typedef struct AuthClaimCheck {
        const char *issuer;     /* iss must equal it */
        char *const *audiences; /* aud (a string or an array) must hold one of them */
        usec_t now;             /* CLOCK_REALTIME */
        usec_t skew;            /* tolerance for exp, nbf and iat */
        const char *nonce;      /* when not NULL, the nonce claim must equal it (id_tokens) */
} AuthClaimCheck;

/* iss, aud, exp (required), nbf and iat (when present), sub (required). -EACCES with a reason. */
int auth_token_check_claims(const AuthToken *t, const AuthClaimCheck *c, const char **ret_reason);

/* exp as a CLOCK_REALTIME usec_t, 0 when absent. */
usec_t auth_token_expiry(const AuthToken *t);

/* The caller the claims name: sub, email, groups. */
int auth_token_caller(const AuthToken *t, CallerSource source, Caller **ret);

/* Signs claims as a compact JWS with an EC P-256 key (ES256), kid and typ in the header. *ret is
 * malloc'd. */
int auth_jwt_sign(const json_t *claims, const cjose_jwk_t *key, const char *kid, const char *typ, char **ret);
