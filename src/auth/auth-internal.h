/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What auth.c (the guard) and auth-server.c (the authorization server) share. Not for other
 * modules. */

#include <cjose/jwk.h>
#include <jansson.h>
#include <openssl/evp.h>

#include "auth-fetch.h"
#include "auth-jwks.h"
#include "auth-jwt.h"
#include "auth.h"

#define AUTH_USEC_PER_DAY (24 * USEC_PER_HOUR)
#define AUTH_ACCESS_TOKEN_LIFETIME (10 * USEC_PER_MINUTE)
#define AUTH_REFRESH_TOKEN_LIFETIME (30 * AUTH_USEC_PER_DAY)
#define AUTH_CODE_LIFETIME (60 * USEC_PER_SEC)
#define AUTH_FLOW_LIFETIME (10 * USEC_PER_MINUTE) /* a login at the IdP, start to callback */
#define AUTH_WAIT_MAX (8 * USEC_PER_SEC)          /* a request waiting for keys or the IdP */
#define AUTH_CLIENTS_MAX 1000
#define AUTH_FLOWS_MAX 1000
#define AUTH_CODES_MAX 1000
#define AUTH_REFRESH_MAX 10000
#define AUTH_CACHE_SIZE 1024 /* verified tokens remembered, direct-mapped by digest */
#define AUTH_REFUSALS_LOGGED_PER_SEC 20

typedef struct AuthFlow AuthFlow;
typedef struct AuthCode AuthCode;
typedef struct AuthCheck AuthCheck;

/* A verified token, remembered so that the next request with it costs a digest and a lookup. */
typedef struct AuthCacheEntry {
        uint8_t digest[32];
        Caller *caller;
        usec_t expires;      /* CLOCK_REALTIME: the token's exp */
        uint64_t generation; /* the issuer's key set it was verified with; ~0: our own */
} AuthCacheEntry;

struct Auth {
        sd_event *event;

        char *base_url; /* our issuer */
        char *resource; /* base_url + mcp_path */
        char *resource_metadata_url;
        char *mcp_path;
        AuthProvider provider;
        char *upstream_issuer;
        char *client_id, *client_secret;
        char **own_audiences; /* the resource */
        char **sso_audiences; /* the resource and the trusted audiences */
        bool allow_private_oauth_urls, allow_registration;
        char *dir; /* <state>/oauth */

        AuthFetcher *fetcher;
        AuthIssuer *upstream;

        cjose_jwk_t *signing_key;
        char *signing_kid;
        AuthKeySet *own_keys;
        json_t *own_jwks; /* what /oauth/jwks serves */

        json_t *state; /* {"clients":{}, "refresh":{}, "revoked":{}}, kept in <dir>/state.json */

        AuthFlow *flows;
        unsigned n_flows;
        AuthCode *codes;
        unsigned n_codes;
        AuthCheck *checks; /* requests waiting for keys */

        EVP_MD *sha256;
        AuthCacheEntry cache[AUTH_CACHE_SIZE];

        /* refusals logged at info in the current second, and those that were not */
        usec_t refusal_window;
        unsigned refusals_logged, refusals_suppressed;
};

/* auth-server.c */
int auth_server_init(Auth *a);
void auth_server_done(Auth *a);
/* Serves the OAuth routes; false when path is none of them. */
bool auth_server_handle(Auth *a, HttpRequest *req);
/* Whether our own token with this jti was revoked. */
bool auth_server_is_revoked(Auth *a, const char *jti);

/* auth.c */
/* Forgets every verified token (after a revocation). */
void auth_cache_flush(Auth *a);
/* Verifies an id_token or access token of the upstream IdP for the given audiences; 0 with
 * *ret_caller; -ENOKEY (no key of the token's kid) or -EKEYREJECTED (its signature does not verify)
 * when the keys are worth fetching again first; other errors with a reason. */
int auth_verify_upstream(
        Auth *a,
        const AuthToken *t,
        char *const *audiences,
        const char *nonce,
        Caller **ret_caller,
        const char **ret_reason);
