/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oci-ref.h"

#define REPOSITORY_MAX 255
#define TAG_MAX 128

static bool is_lower_alnum(char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static bool is_alnum(char c) {
        return is_lower_alnum(c) || (c >= 'A' && c <= 'Z');
}

bool oci_digest_is_valid(const char *s) {
        const char *hex;

        if (!s || !(hex = startswith(s, OCI_DIGEST_SHA256_PREFIX)) || strlen(hex) != 64)
                return false;
        for (; *hex; hex++)
                if (!((*hex >= '0' && *hex <= '9') || (*hex >= 'a' && *hex <= 'f')))
                        return false;
        return true;
}

bool oci_tag_is_valid(const char *s) {
        size_t n = s ? strlen(s) : 0;

        if (n == 0 || n > TAG_MAX || !(is_alnum(s[0]) || s[0] == '_'))
                return false;
        for (size_t i = 1; i < n; i++)
                if (!(is_alnum(s[i]) || s[i] == '_' || s[i] == '.' || s[i] == '-'))
                        return false;
        return true;
}

/* One path component: runs of [a-z0-9] separated by '.', '_', '__' or a run of '-'. */
static bool component_is_valid(const char *s, size_t n) {
        size_t i = 0;

        if (n == 0 || !is_lower_alnum(s[0]) || !is_lower_alnum(s[n - 1]))
                return false;
        while (i < n) {
                size_t j = i;

                if (is_lower_alnum(s[i])) {
                        i++;
                        continue;
                }
                while (j < n && !is_lower_alnum(s[j]))
                        j++;
                if (!((j - i == 1 && (s[i] == '.' || s[i] == '_')) ||
                      (j - i == 2 && strneq(s + i, "__", 2)) || strspn(s + i, "-") >= j - i))
                        return false;
                i = j;
        }
        return true;
}

static bool repository_is_valid(const char *s) {
        size_t n = strlen(s);

        if (n == 0 || n > REPOSITORY_MAX)
                return false;
        for (const char *p = s;;) {
                const char *slash = strchr(p, '/');
                size_t len = slash ? (size_t) (slash - p) : strlen(p);

                if (!component_is_valid(p, len))
                        return false;
                if (!slash)
                        return true;
                p = slash + 1;
        }
}

/* A DNS name or IPv4 address (labels of [A-Za-z0-9-], not starting or ending with '-'), or an IPv6
 * address in brackets; then an optional :port of 1-5 digits. */
static bool host_is_valid(const char *s) {
        const char *port = NULL;

        if (s[0] == '[') {
                const char *end = strchr(s, ']');

                if (!end || end == s + 1 ||
                    strspn(s + 1, "0123456789abcdefABCDEF:.") != (size_t) (end - s - 1))
                        return false;
                if (end[1] != 0 && end[1] != ':')
                        return false;
                port = end[1] == ':' ? end + 2 : NULL;
        } else {
                const char *colon = strchr(s, ':');
                size_t n = colon ? (size_t) (colon - s) : strlen(s), label = 0;

                if (n == 0 || n > 253)
                        return false;
                for (size_t i = 0; i < n; i++) {
                        if (s[i] == '.') {
                                if (label == 0 || s[i - 1] == '-')
                                        return false;
                                label = 0;
                                continue;
                        }
                        if (!is_alnum(s[i]) && !(s[i] == '-' && label > 0))
                                return false;
                        label++;
                }
                if (label == 0 || s[n - 1] == '-')
                        return false;
                port = colon ? colon + 1 : NULL;
        }
        if (port) {
                size_t n = strlen(port);
                if (n == 0 || n > 5 || strspn(port, "0123456789") != n || strtoul(port, NULL, 10) > 65535)
                        return false;
        }
        return true;
}

void oci_ref_done(OciRef *r) {
        if (!r)
                return;
        r->host = mfree(r->host);
        r->repository = mfree(r->repository);
        r->tag = mfree(r->tag);
        r->digest = mfree(r->digest);
}

int oci_ref_parse(const char *s, OciRef *ret, ApiError *reterr) {
        _cleanup_free_ char *host = NULL, *repository = NULL, *tag = NULL, *digest = NULL;
        const char *slash, *at, *colon, *name_end;

        assert_return(s, -EINVAL);
        assert_return(ret, -EINVAL);

        slash = strchr(s, '/');
        if (!slash || slash == s)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "'%s' is not a reference: want host[:port]/repository[:tag][@sha256:…]",
                        s);
        host = strndup(s, (size_t) (slash - s));
        if (!host)
                return -ENOMEM;
        /* as docker decides: a first component with a dot or a port, or localhost, is a host */
        if (!(strpbrk(host, ".:[") || streq(host, "localhost")) || !host_is_valid(host))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "'%s' does not start with a registry host: want host[:port]/repository[:tag]",
                        s);

        at = strchr(slash + 1, '@');
        name_end = at ?: slash + 1 + strlen(slash + 1);
        if (at) {
                if (!startswith(at + 1, OCI_DIGEST_SHA256_PREFIX))
                        return api_error_set(
                                reterr,
                                -EOPNOTSUPP,
                                API_ERROR_UNSUPPORTED,
                                "digest '%s': only sha256 digests are supported",
                                at + 1);
                if (!oci_digest_is_valid(at + 1))
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "'%s' is not a sha256 digest (sha256: and 64 lower-case hex digits)",
                                at + 1);
                digest = strdup(at + 1);
                if (!digest)
                        return -ENOMEM;
        }
        /* a tag is after the last ':' of the name, unless a '/' follows it */
        colon = memrchr(slash + 1, ':', (size_t) (name_end - slash - 1));
        if (colon && memchr(colon, '/', (size_t) (name_end - colon)))
                colon = NULL;
        repository = strndup(slash + 1, (size_t) ((colon ?: name_end) - slash - 1));
        if (!repository)
                return -ENOMEM;
        if (!repository_is_valid(repository))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "'%s' is not a repository name: lower-case letters, digits and separators "
                        "(. _ __ -) between them, components split by '/', at most %d characters",
                        repository,
                        REPOSITORY_MAX);
        if (colon) {
                tag = strndup(colon + 1, (size_t) (name_end - colon - 1));
                if (!tag)
                        return -ENOMEM;
                if (!oci_tag_is_valid(tag))
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "'%s' is not a tag: up to %d of [A-Za-z0-9_.-], not starting with . or -",
                                tag,
                                TAG_MAX);
        } else if (!digest) {
                tag = strdup("latest");
                if (!tag)
                        return -ENOMEM;
        }

        *ret = (OciRef){
                .host = TAKE_PTR(host),
                .repository = TAKE_PTR(repository),
                .tag = TAKE_PTR(tag),
                .digest = TAKE_PTR(digest),
        };
        return 0;
}

char *oci_ref_to_string(const OciRef *r) {
        char *s;

        if (asprintf(&s, "%s/%s%s%s", r->host, r->repository, r->digest ? "@" : ":", r->digest ?: r->tag) < 0)
                return NULL;
        return s;
}
