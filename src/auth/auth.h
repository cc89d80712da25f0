/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <systemd/sd-event.h>

#include "api-error.h"
#include "cleanup.h"
#include "http-server.h"

/* Identity (--enable-oauth): an OAuth 2.1 resource server in front of REST and MCP, and an
 * authorization server of our own that delegates the login to the upstream IdP (Dex or Google).
 *
 * The guard: every request it is shown needs "Authorization: Bearer <JWT>", either
 *  - a token of our own authorization server (iss = the base URL, aud = the resource URL, signed
 *    by our key, not revoked): the caller's source is "oauth"; or
 *  - a token of the upstream IdP (iss = its issuer, checked against its JWKS) whose audience is the
 *    resource URL or one of the trusted audiences (muster's forwarded id_token, the portal's user
 *    token): source "sso".
 * A refusal is 401 with WWW-Authenticate: Bearer resource_metadata="…" (error="invalid_token" when
 * a token was sent) and the error envelope with code "unauthorized"; the reason goes to the log.
 *
 * The resource URL, the audience our tokens carry, is the MCP endpoint under the base URL
 * (https://vmm.example/mcp): what the protected-resource metadata advertises and what clients
 * send as the RFC 8707 resource. */

typedef enum AuthProvider {
        AUTH_PROVIDER_DEX,
        AUTH_PROVIDER_GOOGLE,
        _AUTH_PROVIDER_MAX,
        _AUTH_PROVIDER_INVALID = -EINVAL,
} AuthProvider;

const char *auth_provider_to_string(AuthProvider p);
AuthProvider auth_provider_from_string(const char *s);

#define AUTH_GOOGLE_ISSUER "https://accounts.google.com"

typedef struct AuthConfig {
        const char *base_url; /* public base URL: https, or http on a loopback host; no path */
        const char *mcp_path; /* "/mcp" */
        AuthProvider provider;
        const char *dex_issuer_url;
        const char *dex_client_id;
        const char *dex_client_secret;
        const char *dex_ca_file;
        const char *google_client_id;
        const char *google_client_secret;
        char *const *trusted_audiences; /* NULL-terminated, may be NULL */
        bool allow_private_oauth_urls;  /* upstream discovery, JWKS and code exchange may be private */
        bool sso_allow_private_ips;     /* the JWKS of SSO tokens may be private */
        bool allow_public_client_registration;
        const char *state_dir; /* the state is kept in <state_dir>/oauth */
} AuthConfig;

/* Checks a configuration before anything starts: -EINVAL with *ret_message (malloc'd) naming the
 * flag at fault. */
int auth_config_check(const AuthConfig *c, char **ret_message);

typedef struct Auth Auth;

int auth_new(Auth **ret, sd_event *event, const AuthConfig *c, ApiError *reterr);
Auth *auth_free(Auth *a);
DEFINE_TRIVIAL_CLEANUP_FUNC(Auth *, auth_free);

/* The resource URL (borrowed). */
const char *auth_resource(const Auth *a);

/* The hook in front of the API: serves the OAuth routes (metadata, /oauth/…), refuses a request
 * without a valid token, and otherwise attaches the caller to the request and passes it on to next
 * (at once, or later when the token needed keys that had to be fetched). Returns true when it took
 * the request (replied, suspended, or will call next itself); false when the request is the
 * caller's to serve now: its caller attached, or an unknown path among the open OAuth ones. */
bool auth_handle(Auth *a, HttpRequest *req, HttpHandler next, void *userdata);

/* Whether path is one of the OAuth routes the hook serves without a token. */
bool auth_path_is_public(const char *path);
