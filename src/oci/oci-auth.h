/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>

#include "api-error.h"

/* Registry authentication, the parts that read untrusted or user-provided bytes: the
 * WWW-Authenticate challenge of a 401, the token server's answer, and docker-style credential
 * files. The requests themselves are made by oci-registry.c. */

typedef enum OciAuthScheme {
        OCI_AUTH_BASIC,
        OCI_AUTH_BEARER,
        _OCI_AUTH_SCHEME_MAX,
        _OCI_AUTH_SCHEME_INVALID = -EINVAL,
} OciAuthScheme;

typedef struct OciChallenge {
        OciAuthScheme scheme;
        char *realm;   /* Bearer: the token server's URL */
        char *service; /* may be NULL */
        char *scope;   /* may be NULL */
        char *error;   /* e.g. "insufficient_scope", or NULL */
} OciChallenge;

#define OCI_CHALLENGE_NULL ((OciChallenge){ .scheme = _OCI_AUTH_SCHEME_INVALID })

/* Parses a WWW-Authenticate value (RFC 9110: challenges of auth-params, quoted strings with
 * backslash escapes, several challenges separated by commas) and picks the first Bearer challenge,
 * else the first Basic one. -EOPNOTSUPP when it offers neither, -EBADMSG when it does not parse or
 * a Bearer challenge has no realm. */
int oci_challenge_parse(const char *value, OciChallenge *ret);
void oci_challenge_done(OciChallenge *c);

/* The token of a token server's JSON answer ("token", else "access_token"): -EBADMSG when there is
 * none or it is not a printable token. */
int oci_token_parse(const void *data, size_t size, char **ret);

/* Looks host ("name[:port]") up in a docker config.json / containers auth.json at path: its
 * "auths" entry keyed by the host, with or without a scheme and a "/v1/"-style path, holding "auth"
 * (base64 of user:password) or "username" and "password". Returns 1 and the credentials, 0 when
 * the file has no entry for the host (or does not exist), < 0 with a message when the file cannot
 * be read or the entry is malformed. */
int oci_auth_file_lookup(
        const char *path, const char *host, char **ret_username, char **ret_password, ApiError *reterr);
