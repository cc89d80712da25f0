/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "hex-util.h"

static void test_hex(void **state) {
        _cleanup_free_ char *s = hex_encode("\x00\x01\xab\xff", 4);
        char buf[5];

        assert_string_equal(s, "0001abff");
        assert_string_equal(hex_format("\x12\xef", 2, buf), "12ef");
        assert_int_equal(unhexchar('a'), 10);
        assert_int_equal(unhexchar('F'), 15);
        assert_int_equal(unhexchar('g'), -1);
}

static void test_hex_decode(void **state) {
        uint8_t b[4] = { 0x55, 0x55, 0x55, 0x55 };
        size_t at = 99;

        assert_ok(hex_decode("00aBfF", 6, /* lower_only= */ false, b, &at));
        assert_memory_equal(b, "\x00\xab\xff\x55", 4);
        assert_int_equal(at, 99);
        assert_ok(hex_decode("", 0, /* lower_only= */ true, b, NULL));

        /* upper case only where allowed */
        assert_errno(hex_decode("0A", 2, /* lower_only= */ true, b, &at), -EINVAL);
        assert_int_equal(at, 1);
        /* the first bad character, left to right, and it wins over an odd length */
        assert_errno(hex_decode("12x4g", 5, /* lower_only= */ false, b, &at), -EINVAL);
        assert_int_equal(at, 2);
        assert_errno(hex_decode("123g", 4, /* lower_only= */ false, b, &at), -EINVAL);
        assert_int_equal(at, 3);
        assert_errno(hex_decode("12g", 3, /* lower_only= */ false, b, &at), -EINVAL);
        assert_int_equal(at, 2);
        /* an odd length of digits: the offset is the length */
        assert_errno(hex_decode("123", 3, /* lower_only= */ false, b, &at), -EINVAL);
        assert_int_equal(at, 3);
        /* a failed decode leaves out as it was */
        assert_memory_equal(b, "\x00\xab\xff\x55", 4);
}

/* RFC 4648 §10's test vectors, both alphabets */
static const struct {
        const char *in, *std, *url;
} vectors[] = {
        { "", "", "" },
        { "f", "Zg==", "Zg" },
        { "fo", "Zm8=", "Zm8" },
        { "foo", "Zm9v", "Zm9v" },
        { "foob", "Zm9vYg==", "Zm9vYg" },
        { "fooba", "Zm9vYmE=", "Zm9vYmE" },
        { "foobar", "Zm9vYmFy", "Zm9vYmFy" },
        { "\xfb\xff\xfe", "+//+", "-__-" },
};

static void test_base64_encode(void **state) {
        for (size_t i = 0; i < ELEMENTSOF(vectors); i++) {
                _cleanup_free_ char *a = base64_encode(vectors[i].in, strlen(vectors[i].in)),
                                    *b = base64url_encode(vectors[i].in, strlen(vectors[i].in));

                assert_string_equal(a, vectors[i].std);
                assert_string_equal(b, vectors[i].url);
        }
}

static void test_base64_decode(void **state) {
        for (size_t i = 0; i < ELEMENTSOF(vectors); i++) {
                _cleanup_free_ uint8_t *a = NULL, *b = NULL;
                size_t na, nb;

                assert_ok(base64_decode(vectors[i].std, strlen(vectors[i].std), 64, &a, &na, NULL));
                assert_int_equal(na, strlen(vectors[i].in));
                assert_memory_equal(a ?: (uint8_t *) "", vectors[i].in, na);
                assert_ok(base64url_decode(vectors[i].url, strlen(vectors[i].url), &b, &nb));
                assert_int_equal(nb, strlen(vectors[i].in));
                assert_memory_equal(b, vectors[i].in, nb);
                assert_int_equal(b[nb], 0);
        }
}

static void test_base64_decode_bad(void **state) {
        _cleanup_free_ uint8_t *d = NULL;
        size_t n, at = 0;

        /* standard: newlines anywhere, padding only at the end, the offset of the bad byte */
        assert_ok(base64_decode("Zm9v\r\nYg==\n", 11, 64, &d, &n, NULL));
        assert_int_equal(n, 4);
        d = mfree(d);
        assert_errno(base64_decode("Zm9v!", 5, 64, &d, &n, &at), -EINVAL);
        assert_int_equal(at, 4);
        assert_errno(base64_decode("Zg=a", 4, 64, &d, &n, &at), -EINVAL);
        assert_errno(base64_decode("Zg==Zg==", 8, 64, &d, &n, &at), -EINVAL);
        assert_int_equal(at, 4);
        assert_errno(base64_decode("Zm9vYmE=", 8, 4, &d, &n, NULL), -EFBIG);

        /* url: no padding, no standard alphabet, no spare bits, no length 4k+1 */
        assert_errno(base64url_decode("Zg=", 3, &d, &n), -EBADMSG);
        assert_errno(base64url_decode("Z+8", 3, &d, &n), -EBADMSG);
        assert_errno(base64url_decode("Zh", 2, &d, &n), -EBADMSG);
        assert_errno(base64url_decode("Zm9vY", 5, &d, &n), -EBADMSG);
        assert_null(d);
}

static void test_ether_addr_format(void **state) {
        char buf[ETHER_ADDR_STRLEN];

        assert_string_equal(
                ether_addr_format((const uint8_t[]){ 0x02, 0xab, 0x0a, 0x00, 0x00, 0xff }, buf),
                "02:ab:0a:00:00:ff");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_hex),
                cmocka_unit_test(test_hex_decode),
                cmocka_unit_test(test_base64_encode),
                cmocka_unit_test(test_base64_decode),
                cmocka_unit_test(test_base64_decode_bad),
                cmocka_unit_test(test_ether_addr_format),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
