/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "fs-util.h"
#include "hex-util.h"
#include "oci-auth.h"

#define AUTH_FILE_MAX ((size_t) 1 << 20)
#define TOKEN_ANSWER_MAX ((size_t) 1 << 20)

void oci_challenge_done(OciChallenge *c) {
        if (!c)
                return;
        c->realm = mfree(c->realm);
        c->service = mfree(c->service);
        c->scope = mfree(c->scope);
        c->error = mfree(c->error);
        c->scheme = _OCI_AUTH_SCHEME_INVALID;
}

static bool is_tchar(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                strchr("!#$%&'*+-.^_`|~", c);
}

static const char *skip_ws(const char *p) {
        while (*p == ' ' || *p == '\t')
                p++;
        return p;
}

/* A token at p: its length (0 when there is none). */
static size_t token_len(const char *p) {
        size_t n = 0;
        while (p[n] && is_tchar(p[n]))
                n++;
        return n;
}

/* A quoted string at p (which is '"'): the unescaped value, and p advanced past the closing quote. */
static int parse_quoted(const char **p, char **ret) {
        const char *s = *p + 1;
        _cleanup_free_ char *v = malloc(strlen(s) + 1);
        size_t n = 0;

        if (!v)
                return -ENOMEM;
        for (;; s++) {
                if (*s == 0)
                        return -EBADMSG;
                if (*s == '"')
                        break;
                if (*s == '\\') {
                        s++;
                        if (*s == 0)
                                return -EBADMSG;
                }
                if ((unsigned char) *s < 0x20 && *s != '\t')
                        return -EBADMSG;
                v[n++] = *s;
        }
        v[n] = 0;
        *p = s + 1;
        *ret = TAKE_PTR(v);
        return 0;
}

int oci_challenge_parse(const char *value, OciChallenge *ret) {
        _cleanup_(oci_challenge_done) OciChallenge bearer = OCI_CHALLENGE_NULL, basic = OCI_CHALLENGE_NULL;
        const char *p;
        int r;

        assert_return(value, -EINVAL);
        assert_return(ret, -EINVAL);

        p = value;
        for (;;) {
                _cleanup_(oci_challenge_done) OciChallenge cur = OCI_CHALLENGE_NULL;
                bool first_param = true;
                size_t n;

                p += strspn(p, ", \t");
                if (*p == 0)
                        break;
                n = token_len(p);
                if (n == 0)
                        return -EBADMSG;
                if (n == 6 && strncasecmp(p, "Bearer", 6) == 0)
                        cur.scheme = OCI_AUTH_BEARER;
                else if (n == 5 && strncasecmp(p, "Basic", 5) == 0)
                        cur.scheme = OCI_AUTH_BASIC;
                p = skip_ws(p + n);

                /* auth-params until the next challenge: name = value, separated by commas */
                for (;;) {
                        _cleanup_free_ char *v = NULL;
                        const char *name;
                        size_t nlen;

                        if (*p == ',') {
                                p = skip_ws(p + 1);
                                continue;
                        }
                        if (*p == 0)
                                break;
                        name = p;
                        nlen = token_len(p);
                        if (nlen == 0) {
                                /* a token68 (e.g. "Negotiate abc==") is not ours to read: skip it */
                                if (!first_param)
                                        return -EBADMSG;
                                p += strcspn(p, ",");
                                first_param = false;
                                continue;
                        }
                        p = skip_ws(p + nlen);
                        if (*p != '=') {
                                if (first_param && (*p == ',' || *p == 0)) {
                                        /* "Scheme token68" with a token68 that looks like a token */
                                        first_param = false;
                                        if (*p == 0)
                                                break;
                                        continue;
                                }
                                /* the start of the next challenge */
                                p = name;
                                break;
                        }
                        p = skip_ws(p + 1);
                        if (*p == '"')
                                r = parse_quoted(&p, &v);
                        else {
                                size_t vlen = token_len(p);
                                /* token68 characters that are not tchars: '/' and '=' padding */
                                while (p[vlen] == '/' || p[vlen] == '=')
                                        vlen += 1 + token_len(p + vlen + 1);
                                if (vlen == 0)
                                        return -EBADMSG;
                                v = strndup(p, vlen);
                                r = v ? 0 : -ENOMEM;
                                p += vlen;
                        }
                        if (r < 0)
                                return r;
                        first_param = false;
                        p = skip_ws(p);
                        if (*p != ',' && *p != 0)
                                return -EBADMSG;
                        if (cur.scheme >= 0) {
                                char **dest = nlen == 5 && strncasecmp(name, "realm", 5) == 0 ? &cur.realm :
                                        nlen == 7 && strncasecmp(name, "service", 7) == 0 ? &cur.service :
                                        nlen == 5 && strncasecmp(name, "scope", 5) == 0   ? &cur.scope :
                                        nlen == 5 && strncasecmp(name, "error", 5) == 0   ? &cur.error :
                                                                                            NULL;
                                if (dest) {
                                        free(*dest);
                                        *dest = TAKE_PTR(v);
                                }
                        }
                }

                if (cur.scheme == OCI_AUTH_BEARER && bearer.scheme < 0) {
                        bearer = cur;
                        cur = OCI_CHALLENGE_NULL;
                } else if (cur.scheme == OCI_AUTH_BASIC && basic.scheme < 0) {
                        basic = cur;
                        cur = OCI_CHALLENGE_NULL;
                }
        }

        if (bearer.scheme >= 0) {
                if (!bearer.realm || !bearer.realm[0])
                        return -EBADMSG;
                *ret = bearer;
                bearer = OCI_CHALLENGE_NULL;
                return 0;
        }
        if (basic.scheme >= 0) {
                *ret = basic;
                basic = OCI_CHALLENGE_NULL;
                return 0;
        }
        return -EOPNOTSUPP;
}

int oci_token_parse(const void *data, size_t size, char **ret) {
        json_auto_t *v = NULL;
        const char *t;
        char *s;

        assert_return(ret, -EINVAL);

        if (size > TOKEN_ANSWER_MAX)
                return -EFBIG;
        v = json_loadb(data, size, 0, NULL);
        if (!json_is_object(v))
                return -EBADMSG;
        t = json_string_value(json_object_get(v, "token"));
        if (!t || !t[0])
                t = json_string_value(json_object_get(v, "access_token"));
        if (!t || !t[0])
                return -EBADMSG;
        /* it goes into a header: printable ASCII without spaces only */
        for (const char *c = t; *c; c++)
                if (*c <= ' ' || *c >= 0x7f)
                        return -EBADMSG;
        s = strdup(t);
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}

/* The "auth" of a docker config: padded base64 of user:password, NUL-terminated. */
static int auth_decode(const char *s, char **ret, size_t *ret_size) {
        _cleanup_free_ uint8_t *d = NULL;
        size_t n = strlen(s), size = 0;
        char *t;
        int r;

        if (n == 0 || n % 4 != 0)
                return -EBADMSG;
        r = base64_decode(s, n, (size_t) 1 << 20, &d, &size, /* reterr_offset= */ NULL);
        if (r < 0)
                return r == -ENOMEM ? r : -EBADMSG;
        t = realloc(d, size + 1);
        if (!t)
                return -ENOMEM;
        d = NULL;
        t[size] = 0;
        *ret = t;
        *ret_size = size;
        return 0;
}

/* The host an "auths" key names: the key without scheme and path ("https://h:5000/v1/" → "h:5000"). */
static bool auth_key_matches(const char *key, const char *host) {
        const char *k = key, *rest;
        size_t n;

        if ((rest = startswith(k, "https://")) || (rest = startswith(k, "http://")))
                k = rest;
        n = strcspn(k, "/");
        return n == strlen(host) && strncasecmp(k, host, n) == 0;
}

int oci_auth_file_lookup(
        const char *path, const char *host, char **ret_username, char **ret_password, ApiError *reterr) {
        _cleanup_free_ char *data = NULL, *user = NULL, *pass = NULL;
        json_auto_t *v = NULL;
        json_t *auths, *entry = NULL, *e;
        const char *key;
        size_t size = 0;
        int r;

        assert_return(path, -EINVAL);
        assert_return(host, -EINVAL);
        assert_return(ret_username && ret_password, -EINVAL);

        r = read_full_file(path, AUTH_FILE_MAX, &data, &size);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "cannot read the credentials file %s: %m", path);
        v = json_loadb(data, size, 0, NULL);
        if (!json_is_object(v))
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "the credentials file %s is not a JSON object",
                        path);
        auths = json_object_get(v, "auths");
        if (!auths)
                return 0;
        if (!json_is_object(auths))
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "%s: \"auths\" is not an object", path);
        /* the exact key first, then the forms with a scheme or a path */
        entry = json_object_get(auths, host);
        if (!entry)
                json_object_foreach(auths, key, e) if (auth_key_matches(key, host)) {
                        entry = e;
                        break;
                }
        if (!entry)
                return 0;
        if (!json_is_object(entry))
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "%s: the entry of %s is not an object", path, host);

        if (json_is_string(json_object_get(entry, "auth")) &&
            json_string_length(json_object_get(entry, "auth")) > 0) {
                _cleanup_free_ char *decoded = NULL;
                size_t dlen = 0;
                char *colon;

                r = auth_decode(json_string_value(json_object_get(entry, "auth")), &decoded, &dlen);
                if (r < 0 || memchr(decoded, 0, dlen) || !(colon = strchr(decoded, ':')) || colon == decoded)
                        return api_error_set(
                                reterr,
                                -EBADMSG,
                                API_ERROR_INTERNAL,
                                "%s: the \"auth\" of %s is not base64 of user:password",
                                path,
                                host);
                user = strndup(decoded, (size_t) (colon - decoded));
                pass = strdup(colon + 1);
                explicit_bzero(decoded, dlen);
        } else if (json_is_string(json_object_get(entry, "username")) && json_is_string(json_object_get(entry, "password"))) {
                user = strdup(json_string_value(json_object_get(entry, "username")));
                pass = strdup(json_string_value(json_object_get(entry, "password")));
        } else if (json_object_get(entry, "identitytoken"))
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "%s: the entry of %s holds an identity token, which is not supported; use "
                        "--username and --password-stdin",
                        path,
                        host);
        else
                return 0;
        if (!user || !pass)
                return -ENOMEM;
        *ret_username = TAKE_PTR(user);
        *ret_password = TAKE_PTR(pass);
        return 1;
}
