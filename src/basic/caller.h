/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>

#include "cleanup.h"

/* Who made a request, as an OAuth token says (src/auth fills it in; http carries it on the request;
 * core records it on what the request creates). Without --enable-oauth there is no caller. */

typedef enum CallerSource {
        CALLER_SOURCE_SSO,   /* a token of the upstream IdP for a trusted audience (muster, the portal) */
        CALLER_SOURCE_OAUTH, /* a token of vm-manager's own authorization server */
        _CALLER_SOURCE_MAX,
        _CALLER_SOURCE_INVALID = -EINVAL,
} CallerSource;

typedef struct Caller {
        char *subject; /* "sub", never NULL */
        char *email;   /* may be NULL */
        char **groups; /* NULL-terminated, may be NULL */
        CallerSource source;
} Caller;

const char *caller_source_to_string(CallerSource s);
CallerSource caller_source_from_string(const char *s);

/* A deep copy; NULL on OOM. */
Caller *caller_dup(const Caller *c);
Caller *caller_free(Caller *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(Caller *, caller_free);

/* {"subject":…,"email":…} (email left out when unknown), the createdBy of a record; a new
 * reference, NULL on OOM. */
json_t *caller_created_by_json(const Caller *c);
