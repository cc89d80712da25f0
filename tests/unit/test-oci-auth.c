/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "oci-auth.h"

static void test_bearer(void **state) {
        _cleanup_(oci_challenge_done) OciChallenge c = OCI_CHALLENGE_NULL;

        assert_ok(oci_challenge_parse(
                "Bearer realm=\"https://auth.example.com/token\",service=\"registry.example.com\","
                "scope=\"repository:vm/base:pull,push\"",
                &c));
        assert_int_equal(c.scheme, OCI_AUTH_BEARER);
        assert_string_equal(c.realm, "https://auth.example.com/token");
        assert_string_equal(c.service, "registry.example.com");
        assert_string_equal(c.scope, "repository:vm/base:pull,push");
        assert_null(c.error);
}

static void test_basic_and_order(void **state) {
        _cleanup_(oci_challenge_done) OciChallenge a = OCI_CHALLENGE_NULL, b = OCI_CHALLENGE_NULL,
                                                   d = OCI_CHALLENGE_NULL;

        assert_ok(oci_challenge_parse("Basic realm=\"Registry Realm\"", &a));
        assert_int_equal(a.scheme, OCI_AUTH_BASIC);
        assert_string_equal(a.realm, "Registry Realm");

        /* Bearer wins over Basic, whatever the order; unknown schemes and their token68 are skipped */
        assert_ok(oci_challenge_parse(
                "Negotiate abc==, Basic realm=\"x\", bearer  realm = \"https://t/\" , error=insufficient_scope",
                &b));
        assert_int_equal(b.scheme, OCI_AUTH_BEARER);
        assert_string_equal(b.realm, "https://t/");
        assert_string_equal(b.error, "insufficient_scope");

        /* quoted strings keep commas and escaped quotes */
        assert_ok(oci_challenge_parse("Bearer realm=\"https://t/a,b\",service=\"s\\\"q\\\\\"", &d));
        assert_string_equal(d.realm, "https://t/a,b");
        assert_string_equal(d.service, "s\"q\\");
}

static void test_bad_challenges(void **state) {
        OciChallenge c = OCI_CHALLENGE_NULL;

        assert_errno(oci_challenge_parse("", &c), -EOPNOTSUPP);
        assert_errno(oci_challenge_parse("Negotiate", &c), -EOPNOTSUPP);
        assert_errno(oci_challenge_parse("Digest realm=\"x\", nonce=\"y\"", &c), -EOPNOTSUPP);
        assert_errno(oci_challenge_parse("Bearer service=\"s\"", &c), -EBADMSG); /* no realm */
        assert_errno(oci_challenge_parse("Bearer realm=\"unterminated", &c), -EBADMSG);
        assert_errno(oci_challenge_parse("Bearer realm=", &c), -EBADMSG);
        assert_errno(oci_challenge_parse("Bearer realm=\"x\" junk", &c), -EBADMSG);
        assert_errno(oci_challenge_parse("\"Bearer\"", &c), -EBADMSG);
        assert_int_equal(c.scheme, _OCI_AUTH_SCHEME_INVALID);
        assert_null(c.realm);
}

static void test_token(void **state) {
        _cleanup_free_ char *a = NULL, *b = NULL, *x = NULL;

        assert_ok(oci_token_parse("{\"token\":\"abc.def.ghi\",\"expires_in\":300}", 40, &a));
        assert_string_equal(a, "abc.def.ghi");
        assert_ok(oci_token_parse("{\"access_token\":\"xyz\"}", 22, &b));
        assert_string_equal(b, "xyz");
        assert_errno(oci_token_parse("{\"token\":\"\"}", 12, &x), -EBADMSG);
        assert_errno(oci_token_parse("{\"token\":\"a b\"}", 15, &x), -EBADMSG);
        assert_errno(oci_token_parse("{\"token\":\"a\\r\\nX-Evil: 1\"}", 27, &x), -EBADMSG);
        assert_errno(oci_token_parse("[]", 2, &x), -EBADMSG);
        assert_errno(oci_token_parse("{\"token\":1}", 11, &x), -EBADMSG);
        assert_null(x);
}

static char *write_tmp(const char *content) {
        char *path = strdup("/tmp/test-oci-auth-XXXXXX");
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        assert_ok(loop_write(fd, content, strlen(content)));
        close(fd);
        return path;
}

static void lookup(const char *content, const char *host, int want, const char *user, const char *pass) {
        _cleanup_free_ char *path = write_tmp(content), *u = NULL, *p = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        assert_errno(oci_auth_file_lookup(path, host, &u, &p, &e), want);
        if (user) {
                assert_string_equal(u, user);
                assert_string_equal(p, pass);
        } else
                assert_null(u);
        if (want < 0)
                assert_non_null(e.message);
        unlink(path);
}

static void test_auth_file(void **state) {
        /* "auth" is base64 of user:password; the password may hold ':' */
        lookup("{\"auths\":{\"r.io:5000\":{\"auth\":\"dXNlcjpwYTpzcw==\"}}}", "r.io:5000", 1, "user", "pa:ss");
        /* the key may carry a scheme and a path */
        lookup("{\"auths\":{\"https://r.io:5000/v1/\":{\"auth\":\"dXNlcjpwYXNz\"}}}",
               "r.io:5000",
               1,
               "user",
               "pass");
        lookup("{\"auths\":{\"http://R.IO\":{\"username\":\"u\",\"password\":\"p\"}}}", "r.io", 1, "u", "p");
        /* another host, another port, no auths, an empty entry: nothing */
        lookup("{\"auths\":{\"r.io\":{\"auth\":\"dXNlcjpwYXNz\"}}}", "r.io:5000", 0, NULL, NULL);
        lookup("{\"auths\":{\"r.io.evil\":{\"auth\":\"dXNlcjpwYXNz\"}}}", "r.io", 0, NULL, NULL);
        lookup("{\"credsStore\":\"desktop\"}", "r.io", 0, NULL, NULL);
        lookup("{\"auths\":{\"r.io\":{}}}", "r.io", 0, NULL, NULL);
        /* broken files and entries are errors, not silent anonymity */
        lookup("not json", "r.io", -EBADMSG, NULL, NULL);
        lookup("{\"auths\":[]}", "r.io", -EBADMSG, NULL, NULL);
        lookup("{\"auths\":{\"r.io\":{\"auth\":\"!!!\"}}}", "r.io", -EBADMSG, NULL, NULL);
        lookup("{\"auths\":{\"r.io\":{\"auth\":\"bm9jb2xvbg==\"}}}", "r.io", -EBADMSG, NULL, NULL); /* "nocolon" */
        lookup("{\"auths\":{\"r.io\":{\"identitytoken\":\"t\"}}}", "r.io", -EOPNOTSUPP, NULL, NULL);

        _cleanup_free_ char *u = NULL, *p = NULL;
        assert_errno(oci_auth_file_lookup("/nonexistent/config.json", "r.io", &u, &p, NULL), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_bearer),         cmocka_unit_test(test_basic_and_order),
                cmocka_unit_test(test_bad_challenges), cmocka_unit_test(test_token),
                cmocka_unit_test(test_auth_file),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
