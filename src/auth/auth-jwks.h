/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>

#include "auth-fetch.h"
#include "auth-jwt.h"
#include "time-util.h"

/* An OpenID provider we trust, as its discovery document and JWKS describe it: fetched on first
 * use (issuer + /.well-known/openid-configuration, then jwks_uri), kept, refreshed in the
 * background once older than AUTH_JWKS_TTL, and fetched again on a token with an unknown kid or
 * with a signature that its kid's key does not verify (a rotation that reuses kids), at most once
 * per AUTH_JWKS_REFETCH_MIN. After a failed fetch the next try waits
 * AUTH_JWKS_RETRY_MIN; meanwhile tokens that need the keys are refused at once.
 *
 * Requests that need keys the cache does not have wait for the fetch in progress (one fetch for
 * all of them). The fetch itself is bounded (auth-fetch.h), so every waiter hears back within
 * seconds, with keys or with an error. */

#define AUTH_JWKS_TTL (15 * USEC_PER_MINUTE)
#define AUTH_JWKS_REFETCH_MIN (5 * USEC_PER_SEC)
#define AUTH_JWKS_RETRY_MIN (2 * USEC_PER_SEC)

typedef struct AuthIssuer AuthIssuer;

/* fetcher is borrowed. allow_private and private_flag as in AuthFetchRequest. */
int auth_issuer_new(
        AuthIssuer **ret, AuthFetcher *fetcher, const char *issuer, bool allow_private, const char *private_flag);
AuthIssuer *auth_issuer_free(AuthIssuer *i);
DEFINE_TRIVIAL_CLEANUP_FUNC(AuthIssuer *, auth_issuer_free);

const char *auth_issuer_url(const AuthIssuer *i);
/* Borrowed; NULL until the first successful fetch. */
const AuthKeySet *auth_issuer_keys(const AuthIssuer *i);
/* From the discovery document (borrowed); NULL until it was fetched. */
const char *auth_issuer_endpoint(const AuthIssuer *i, const char *name);
/* Bumped whenever the key set changes: what was verified against an older one is checked again. */
uint64_t auth_issuer_generation(const AuthIssuer *i);

/* r < 0 with a sentence for the log (error) when the keys could not be had. */
typedef void (*AuthIssuerReady)(int r, const char *error, void *userdata);
typedef struct AuthIssuerWait AuthIssuerWait;

/* Makes sure keys are there: 0 when they are (nothing is called); -EHOSTUNREACH (with *ret_error,
 * borrowed) when the last fetch failed and the retry pause still runs, -ENOKEY when refetch was
 * asked for and the rate limit forbids it; 1 when a fetch runs and ready will be called
 * (*ret_wait cancels it). refetch: the keys we have lack the one a token names, or it does not
 * verify the token's signature. */
int auth_issuer_need_keys(
        AuthIssuer *i,
        bool refetch,
        AuthIssuerReady ready,
        void *userdata,
        AuthIssuerWait **ret_wait,
        const char **ret_error);
/* Stops waiting (ready is not called). NULL is fine. */
void auth_issuer_wait_cancel(AuthIssuerWait *w);
