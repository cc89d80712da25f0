/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "oci-ref.h"

#define D64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void check(const char *s, const char *host, const char *repo, const char *tag, const char *digest) {
        _cleanup_(oci_ref_done) OciRef r = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        if (oci_ref_parse(s, &r, &e) < 0)
                fail_msg("'%s' did not parse: %s", s, e.message);
        assert_string_equal(r.host, host);
        assert_string_equal(r.repository, repo);
        if (tag)
                assert_string_equal(r.tag, tag);
        else
                assert_null(r.tag);
        if (digest)
                assert_string_equal(r.digest, digest);
        else
                assert_null(r.digest);
}

static void test_valid(void **state) {
        check("registry.example.com/vm/base:1.2.0", "registry.example.com", "vm/base", "1.2.0", NULL);
        check("127.0.0.1:5000/base", "127.0.0.1:5000", "base", "latest", NULL);
        check("localhost/a/b/c:x_y-Z.1", "localhost", "a/b/c", "x_y-Z.1", NULL);
        check("[::1]:5000/vm/base:v1", "[::1]:5000", "vm/base", "v1", NULL);
        check("r.io/vm@sha256:" D64, "r.io", "vm", NULL, "sha256:" D64);
        check("r.io:443/vm:t@sha256:" D64, "r.io:443", "vm", "t", "sha256:" D64);
        check("r.io/a.b_c__d---e/f:_t", "r.io", "a.b_c__d---e/f", "_t", NULL);
}

static void refuse(const char *s, int want) {
        _cleanup_(oci_ref_done) OciRef r = {};
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        assert_errno(oci_ref_parse(s, &r, &e), want);
        assert_non_null(e.message);
        assert_null(r.host);
}

static void test_invalid(void **state) {
        refuse("vm/base:1", -EINVAL);          /* no registry host: never docker.io by default */
        refuse("base", -EINVAL);               /* no slash at all */
        refuse("/vm/base", -EINVAL);           /* empty host */
        refuse("r.io/", -EINVAL);              /* no repository */
        refuse("r.io/VM/base", -EINVAL);       /* upper case */
        refuse("r.io/vm//base", -EINVAL);      /* empty component */
        refuse("r.io/vm/../base", -EINVAL);    /* '..' is no component */
        refuse("r.io/-vm", -EINVAL);           /* starts with a separator */
        refuse("r.io/vm_", -EINVAL);           /* ends with one */
        refuse("r.io/a...b", -EINVAL);         /* three dots are no separator */
        refuse("r.io/vm:", -EINVAL);           /* empty tag */
        refuse("r.io/vm:.x", -EINVAL);         /* tag starting with '.' */
        refuse("r.io/vm:a/b", -EINVAL);        /* ':' before a '/' is part of the path: 'vm:a' is bad */
        refuse("r.io:99999/vm", -EINVAL);      /* port out of range */
        refuse("r.io:/vm", -EINVAL);           /* empty port */
        refuse("-r.io/vm", -EINVAL);           /* label starting with '-' */
        refuse("r..io/vm", -EINVAL);           /* empty label */
        refuse("r.io/vm@sha256:abc", -EINVAL); /* short digest */
        refuse("r.io/vm@sha256:"
               "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
               -EINVAL);
        refuse("r.io/vm@sha512:" D64 D64, -EOPNOTSUPP);
        refuse("r.io/vm:t@", -EOPNOTSUPP);

        /* a tag of 129 characters */
        char tag[200] = "r.io/vm:";
        memset(tag + strlen(tag), 'a', 129);
        refuse(tag, -EINVAL);
}

static void test_to_string(void **state) {
        _cleanup_(oci_ref_done) OciRef a = {}, b = {};
        _cleanup_free_ char *sa = NULL, *sb = NULL;

        assert_ok(oci_ref_parse("127.0.0.1:5000/vm/base", &a, NULL));
        sa = oci_ref_to_string(&a);
        assert_string_equal(sa, "127.0.0.1:5000/vm/base:latest");
        assert_ok(oci_ref_parse("r.io/vm:t@sha256:" D64, &b, NULL));
        sb = oci_ref_to_string(&b);
        assert_string_equal(sb, "r.io/vm@sha256:" D64);
}

static void test_digest_and_tag_validity(void **state) {
        assert_true(oci_digest_is_valid("sha256:" D64));
        assert_false(oci_digest_is_valid("sha256:" D64 "0"));
        assert_false(oci_digest_is_valid("sha256:"));
        assert_false(oci_digest_is_valid("SHA256:" D64));
        assert_false(oci_digest_is_valid(NULL));
        assert_true(oci_tag_is_valid("v1.2.3-rc1_x"));
        assert_false(oci_tag_is_valid("-x"));
        assert_false(oci_tag_is_valid(""));
        assert_false(oci_tag_is_valid("a b"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_valid),
                cmocka_unit_test(test_invalid),
                cmocka_unit_test(test_to_string),
                cmocka_unit_test(test_digest_and_tag_validity),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
