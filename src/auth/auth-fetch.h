/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <systemd/sd-event.h>

#include "cleanup.h"

/* The requests the OAuth side makes (OpenID discovery, JWKS, the token exchange with the upstream
 * IdP), on libcurl's multi interface in the daemon's loop: never blocking it, each bounded in time
 * (AUTH_FETCH_TIMEOUT) and size (AUTH_FETCH_MAX_BODY), no redirects followed, and guarded against
 * SSRF: unless the request allows it, a connection to a loopback, private, link-local or otherwise
 * non-public address is refused at connect time (so a name that resolves, or re-resolves, to one
 * is caught too). */

#define AUTH_FETCH_TIMEOUT_MS 5000
#define AUTH_FETCH_CONNECT_TIMEOUT_MS 3000
#define AUTH_FETCH_MAX_BODY ((size_t) 1 << 20)

typedef struct AuthFetcher AuthFetcher;
typedef struct AuthFetch AuthFetch;

/* ca_file (may be NULL): a PEM bundle trusted in addition to the system's roots. */
int auth_fetcher_new(AuthFetcher **ret, sd_event *event, const char *ca_file);
/* Abandons fetches in flight without calling their done. */
AuthFetcher *auth_fetcher_free(AuthFetcher *f);
DEFINE_TRIVIAL_CLEANUP_FUNC(AuthFetcher *, auth_fetcher_free);

typedef struct AuthFetchRequest {
        const char *url;
        const char *form; /* POST this application/x-www-form-urlencoded body; NULL: GET */
        const char *user; /* HTTP basic authentication (client_secret_basic), or NULL */
        const char *password;
        bool allow_private;       /* may connect to non-public addresses */
        const char *private_flag; /* the flag that allows it, named when refusing */
} AuthFetchRequest;

/* Called once: r < 0 with error (a sentence for the log) when no HTTP answer came; else r = 0, the
 * status, and the body parsed as JSON (NULL when it is not JSON). body is borrowed. */
typedef void (*AuthFetchDone)(int r, long status, json_t *body, const char *error, void *userdata);

/* Starts a fetch; done is called later from the loop, never from within this call. *ret (optional)
 * lets the caller cancel it. */
int auth_fetch(AuthFetcher *f, const AuthFetchRequest *req, AuthFetchDone done, void *userdata, AuthFetch **ret);
/* Abandons a fetch: its done is not called. NULL is fine. */
void auth_fetch_cancel(AuthFetch *x);

/* Whether an address is one a fetch may not reach by default: unspecified, loopback, RFC 1918 and
 * other private ranges, CGNAT, link-local, multicast, reserved, documentation, unique-local IPv6,
 * and IPv4-mapped or NAT64 forms of those. */
bool auth_address_is_private(const struct sockaddr *sa, socklen_t len);

/* Whether a URL is https, or http to a loopback host (localhost, 127.0.0.0/8, [::1]): what an
 * issuer or a base URL may be. */
bool auth_url_is_acceptable(const char *url);
