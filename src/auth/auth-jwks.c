/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "auth-jwks.h"
#include "log.h"

struct AuthIssuerWait {
        AuthIssuer *issuer;
        AuthIssuerReady ready;
        void *userdata;
        AuthIssuerWait *prev, *next;
};

struct AuthIssuer {
        AuthFetcher *fetcher;
        char *issuer;
        bool allow_private;
        const char *private_flag;

        json_t *discovery; /* the OpenID configuration, once fetched */
        AuthKeySet *keys;
        uint64_t generation;
        usec_t fetched;   /* CLOCK_MONOTONIC of the last good fetch, 0: never */
        usec_t attempted; /* of the last fetch started */
        usec_t failed;    /* when the last fetch failed */
        int failure;      /* of the last fetch: 0 or negative errno */
        char *failure_text;

        AuthFetch *fetch; /* in flight */
        AuthIssuerWait *waits;
};

int auth_issuer_new(
        AuthIssuer **ret, AuthFetcher *fetcher, const char *issuer, bool allow_private, const char *private_flag) {
        _cleanup_(auth_issuer_freep) AuthIssuer *i = NULL;

        assert_return(ret && fetcher && issuer, -EINVAL);

        i = calloc(1, sizeof(AuthIssuer));
        if (!i)
                return -ENOMEM;
        i->fetcher = fetcher;
        i->allow_private = allow_private;
        i->private_flag = private_flag;
        i->issuer = strdup(issuer);
        if (!i->issuer)
                return -ENOMEM;
        *ret = TAKE_PTR(i);
        return 0;
}

void auth_issuer_wait_cancel(AuthIssuerWait *w) {
        AuthIssuer *i;

        if (!w)
                return;
        i = w->issuer;
        if (w->prev)
                w->prev->next = w->next;
        else
                i->waits = w->next;
        if (w->next)
                w->next->prev = w->prev;
        free(w);
}

AuthIssuer *auth_issuer_free(AuthIssuer *i) {
        if (!i)
                return NULL;
        while (i->waits)
                auth_issuer_wait_cancel(i->waits);
        auth_fetch_cancel(i->fetch);
        json_decref(i->discovery);
        auth_keyset_free(i->keys);
        free(i->failure_text);
        free(i->issuer);
        free(i);
        return NULL;
}

const char *auth_issuer_url(const AuthIssuer *i) {
        return i->issuer;
}

const AuthKeySet *auth_issuer_keys(const AuthIssuer *i) {
        return i->keys;
}

const char *auth_issuer_endpoint(const AuthIssuer *i, const char *name) {
        return json_string_value(json_object_get(i->discovery, name));
}

uint64_t auth_issuer_generation(const AuthIssuer *i) {
        return i->generation;
}

/* Tells every waiter, one at a time: a callback may cancel the others or add new ones. */
static void issuer_notify(AuthIssuer *i, int r, const char *error) {
        AuthIssuerWait *w;

        while ((w = i->waits)) {
                AuthIssuerReady ready = w->ready;
                void *userdata = w->userdata;

                auth_issuer_wait_cancel(w);
                ready(r, error, userdata);
        }
}

static void issuer_fail(AuthIssuer *i, int r, const char *format, ...) _printf_(3, 4);
static void issuer_fail(AuthIssuer *i, int r, const char *format, ...) {
        _cleanup_free_ char *text = NULL;
        va_list ap;

        va_start(ap, format);
        if (vasprintf(&text, format, ap) < 0)
                text = NULL;
        va_end(ap);

        i->fetch = NULL;
        i->failure = r;
        i->failed = now_usec(CLOCK_MONOTONIC);
        free(i->failure_text);
        i->failure_text = TAKE_PTR(text);
        log_warning("Cannot fetch the keys of '%s': %s", i->issuer, i->failure_text ?: "out of memory");
        issuer_notify(i, r, i->failure_text ?: "out of memory");
}

static int issuer_fetch_jwks(AuthIssuer *i);

static void on_jwks(int r, long status, json_t *body, const char *error, void *userdata) {
        _cleanup_(auth_keyset_freep) AuthKeySet *keys = NULL;
        AuthIssuer *i = userdata;
        const char *reason = NULL, *uri = auth_issuer_endpoint(i, "jwks_uri");

        if (r < 0)
                return issuer_fail(i, r, "%s", error);
        if (status != 200)
                return issuer_fail(i, -EPROTO, "%s answered %ld", uri, status);
        r = auth_keyset_from_json(body, &keys, &reason);
        if (r == -ENOMEM)
                return issuer_fail(i, r, "out of memory");
        if (r < 0)
                return issuer_fail(i, r, "%s: %s", uri, reason);

        i->fetch = NULL;
        i->failure = 0;
        i->failure_text = mfree(i->failure_text);
        auth_keyset_free(i->keys);
        i->keys = TAKE_PTR(keys);
        i->generation++;
        i->fetched = now_usec(CLOCK_MONOTONIC);
        log_debug("Fetched %zu signing key(s) of '%s' from %s.", auth_keyset_size(i->keys), i->issuer, uri);
        issuer_notify(i, 0, NULL);
}

static void on_discovery(int r, long status, json_t *body, const char *error, void *userdata) {
        AuthIssuer *i = userdata;
        const char *iss = json_string_value(json_object_get(body, "issuer")),
                   *jwks = json_string_value(json_object_get(body, "jwks_uri"));

        if (r < 0)
                return issuer_fail(i, r, "%s", error);
        if (status != 200)
                return issuer_fail(
                        i, -EPROTO, "the OpenID configuration of '%s' answered %ld", i->issuer, status);
        if (!json_is_object(body) || !jwks)
                return issuer_fail(i, -EPROTO, "the OpenID configuration of '%s' names no jwks_uri", i->issuer);
        /* OpenID Connect Discovery 1.0 §4.3: the document must name the issuer we asked */
        if (!iss || !streq(iss, i->issuer))
                return issuer_fail(
                        i, -EPROTO, "the OpenID configuration of '%s' names issuer '%s'", i->issuer, iss ?: "");
        json_decref(i->discovery);
        i->discovery = json_incref(body);
        r = issuer_fetch_jwks(i);
        if (r < 0)
                issuer_fail(i, r, "cannot start fetching %s: %s", jwks, strerror(-r));
}

static int issuer_fetch_jwks(AuthIssuer *i) {
        return auth_fetch(
                i->fetcher,
                &(AuthFetchRequest){ .url = auth_issuer_endpoint(i, "jwks_uri"),
                                     .allow_private = i->allow_private,
                                     .private_flag = i->private_flag },
                on_jwks,
                i,
                &i->fetch);
}

static int issuer_fetch(AuthIssuer *i) {
        _cleanup_free_ char *url = NULL;
        size_t n = strlen(i->issuer);

        i->attempted = now_usec(CLOCK_MONOTONIC);
        if (i->discovery)
                return issuer_fetch_jwks(i);
        asprintf_or_null(
                &url,
                "%.*s/.well-known/openid-configuration",
                (int) (n > 0 && i->issuer[n - 1] == '/' ? n - 1 : n),
                i->issuer);
        if (!url)
                return -ENOMEM;
        return auth_fetch(
                i->fetcher,
                &(AuthFetchRequest){
                        .url = url, .allow_private = i->allow_private, .private_flag = i->private_flag },
                on_discovery,
                i,
                &i->fetch);
}

int auth_issuer_need_keys(
        AuthIssuer *i,
        bool refetch,
        AuthIssuerReady ready,
        void *userdata,
        AuthIssuerWait **ret_wait,
        const char **ret_error) {
        usec_t now = now_usec(CLOCK_MONOTONIC);
        AuthIssuerWait *w;
        int r;

        assert_return(i && ready && ret_wait, -EINVAL);

        if (!i->fetch) {
                bool stale = i->keys && now >= i->fetched + AUTH_JWKS_TTL;

                if (i->keys && !refetch && !stale)
                        return 0;
                if (i->keys && !refetch) {
                        /* stale keys still serve while a background fetch renews them */
                        r = issuer_fetch(i);
                        if (r < 0)
                                log_debug_errno(
                                        r, "Cannot start renewing the keys of '%s', ignoring: %m", i->issuer);
                        return 0;
                }
                if (refetch && i->attempted > 0 && now < i->attempted + AUTH_JWKS_REFETCH_MIN) {
                        if (ret_error)
                                *ret_error = "the key set was fetched moments ago (refetches are rate-limited)";
                        return -ENOKEY;
                }
                if (!refetch && i->failure < 0 && now < i->failed + AUTH_JWKS_RETRY_MIN) {
                        if (ret_error)
                                *ret_error = i->failure_text ?: "the last fetch failed";
                        return -EHOSTUNREACH;
                }
                r = issuer_fetch(i);
                if (r < 0)
                        return r;
        } else if (i->keys && !refetch)
                return 0;

        w = calloc(1, sizeof(AuthIssuerWait));
        if (!w)
                return -ENOMEM;
        *w = (AuthIssuerWait){ .issuer = i, .ready = ready, .userdata = userdata, .next = i->waits };
        if (i->waits)
                i->waits->prev = w;
        i->waits = w;
        *ret_wait = w;
        return 1;
}
