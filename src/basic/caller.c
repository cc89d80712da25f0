/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "caller.h"
#include "string-table.h"

static const char *const caller_source_table[_CALLER_SOURCE_MAX] = {
        [CALLER_SOURCE_SSO] = "sso",
        [CALLER_SOURCE_OAUTH] = "oauth",
};

DEFINE_STRING_TABLE_LOOKUP(caller_source, CallerSource);

Caller *caller_dup(const Caller *c) {
        _cleanup_(caller_freep) Caller *d = NULL;
        size_t n;

        assert(c && c->subject);
        n = strv_length(c->groups);

        d = calloc(1, sizeof(Caller));
        if (!d)
                return NULL;
        d->source = c->source;
        d->subject = strdup(c->subject);
        if (!d->subject)
                return NULL;
        if (c->email && !(d->email = strdup(c->email)))
                return NULL;
        if (c->groups) {
                d->groups = calloc(n + 1, sizeof(char *));
                if (!d->groups)
                        return NULL;
                for (size_t i = 0; i < n; i++)
                        if (!(d->groups[i] = strdup(c->groups[i])))
                                return NULL;
        }
        return TAKE_PTR(d);
}

Caller *caller_free(Caller *c) {
        if (!c)
                return NULL;
        free(c->subject);
        free(c->email);
        strv_free(c->groups);
        free(c);
        return NULL;
}

json_t *caller_created_by_json(const Caller *c) {
        json_auto_t *j = NULL;

        assert(c && c->subject);

        j = json_pack("{s:s}", "subject", c->subject);
        if (!j)
                return NULL;
        if (c->email && json_object_set_new(j, "email", json_string(c->email)) < 0)
                return NULL;
        return TAKE_PTR(j);
}
