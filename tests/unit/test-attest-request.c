/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* POST /attest/quote bodies (network-imds-attest.md §2.3, §2.4): a real agent body decodes, the
 * validation messages come in the reference's order, malformed bodies give "malformed quote: …"
 * with Go's words where they are reproducible, and every field has its limit. */
#include <openssl/evp.h>

#include "test-attest-fixtures.h"

static char *b64(const uint8_t *data, size_t size) {
        char *s = malloc(4 * ((size + 2) / 3) + 1);

        assert_non_null(s);
        assert_true(EVP_EncodeBlock((unsigned char *) s, data, (int) size) >= 0);
        return s;
}

static char *fixture_b64(const char *key, const char *file) {
        _cleanup_free_ char *name = fixture_name(key, file);
        _cleanup_free_ uint8_t *data = NULL;
        size_t size;

        data = fixture_read(name, &size);
        return b64(data, size);
}

/* The body the agent posts for key's initrd quote. */
static char *agent_body(const char *key) {
        _cleanup_free_ char *nonce = fixture_text("nonce.hex"), *pcrs = fixture_text("pcrs-initrd.json"),
                            *ak = fixture_b64(key, "ak.pub"), *q = fixture_b64(key, "initrd.msg"),
                            *s = fixture_b64(key, "initrd.sig");
        char *body = NULL;

        pcrs[strcspn(pcrs, "\n")] = 0;
        assert_true(
                asprintf(
                        &body,
                        "{\"stage\":\"initrd\",\"nonce\":\"%s\",\"ak_pub\":\"%s\",\"quote\":\"%s\","
                        "\"signature\":\"%s\",\"pcrs\":%s,\"event_log\":\"AAEC\"}",
                        nonce,
                        ak,
                        q,
                        s,
                        pcrs) > 0);
        return body;
}

static void test_agent_body(void **state) {
        _cleanup_(attest_quote_request_done) AttestQuoteRequest req = {}, want = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        _cleanup_free_ char *body = agent_body("rsapss");

        assert_ok(attest_quote_request_decode(body, strlen(body), &req, &err));
        fixture_request("rsapss", "initrd", &want);
        assert_string_equal(req.stage, "initrd");
        assert_string_equal(req.nonce, want.nonce);
        assert_int_equal(req.quote_size, want.quote_size);
        assert_memory_equal(req.quote, want.quote, want.quote_size);
        assert_int_equal(req.signature_size, want.signature_size);
        assert_memory_equal(req.signature, want.signature, want.signature_size);
        assert_int_equal(req.ak_pub_size, want.ak_pub_size);
        assert_memory_equal(req.ak_pub, want.ak_pub, want.ak_pub_size);
        assert_null(req.ek_pub);
        assert_int_equal(req.event_log_size, 3);
        assert_int_equal(req.n_pcr_banks, 1);
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                if (want.pcrs_sha256[i])
                        assert_string_equal(req.pcrs_sha256[i], want.pcrs_sha256[i]);
                else
                        assert_null(req.pcrs_sha256[i]);
}

static void check(const char *body, int error, const char *message) {
        _cleanup_(attest_quote_request_done) AttestQuoteRequest req = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;

        assert_errno(attest_quote_request_decode(body, strlen(body), &req, &err), error);
        assert_null(req.stage);
        if (!err.message)
                fail_msg("no message for %s", body);
        assert_string_equal(err.message, message);
        assert_int_equal(err.code, API_ERROR_INVALID_REQUEST);
        /* The error travels with the code, so that a field over its limit (-EFBIG) can be told apart. */
        assert_int_equal(err.error, error);
}

#define Q "\"quote\":\"AQ==\",\"signature\":\"Ag==\",\"ak_pub\":\"Aw==\""

static void test_validation_order(void **state) {
        check("{}", -EINVAL, "invalid request: stage must be \"initrd\" or \"ready\"");
        check("null", -EINVAL, "invalid request: stage must be \"initrd\" or \"ready\"");
        check("{\"stage\":\"boot\",\"nonce\":\"\"}",
              -EINVAL,
              "invalid request: stage must be \"initrd\" or \"ready\"");
        check("{\"stage\":\"initrd\"}", -EINVAL, "invalid request: nonce is required");
        check("{\"stage\":\"ready\",\"nonce\":\"\"," Q "}", -EINVAL, "invalid request: nonce is required");
        check("{\"stage\":\"ready\",\"nonce\":\"ab\",\"quote\":\"AQ==\",\"signature\":\"Ag==\"}",
              -EINVAL,
              "invalid request: ak_pub, quote and signature are required");
        check("{\"stage\":\"ready\",\"nonce\":\"ab\"," Q ",\"signature\":\"\"}",
              -EINVAL,
              "invalid request: ak_pub, quote and signature are required");
        check("{\"stage\":\"ready\",\"nonce\":\"ab\"," Q "}", -EINVAL, "invalid request: pcrs is required");
        check("{\"stage\":\"ready\",\"nonce\":\"ab\"," Q ",\"pcrs\":{}}",
              -EINVAL,
              "invalid request: pcrs is required");
        check("{\"stage\":\"ready\",\"nonce\":\"ab\"," Q ",\"pcrs\":null}",
              -EINVAL,
              "invalid request: pcrs is required");
}

static void decodes(const char *body, AttestQuoteRequest *req) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;

        if (attest_quote_request_decode(body, strlen(body), req, &err) < 0)
                fail_msg("%s: %s", body, err.message);
}

static void test_go_decoding(void **state) {
        _cleanup_(attest_quote_request_done) AttestQuoteRequest req = {};

        /* any bank counts for "pcrs is required"; the verifier then finds no sha256 values */
        decodes("{\"stage\":\"ready\",\"nonce\":\"ab\"," Q ",\"pcrs\":{\"sha1\":{}}}", &req);
        assert_int_equal(req.n_pcr_banks, 1);
        assert_null(req.pcrs_sha256[0]);
        attest_quote_request_done(&req);

        /* keys case-insensitively, the last of two wins, unknown keys, nulls and trailing bytes
         * ignored, base64 with line breaks */
        decodes("{\"Stage\":\"initrd\",\"NONCE\":\"x\",\"nonce\":\"ab\",\"quote\":\"AQ\\n==\",\"signature\":\"Ag==\","
                "\"ak_pub\":\"Aw==\",\"ek_pub\":null,\"extra\":[1,{}],\"pcrs\":{\"sha256\":{\"0\":\"00\",\"01\":\"11\","
                "\"31\":\"ff\",\"32\":\"ee\",\"x\":\"dd\",\"2\":null},\"sha1\":null}} trailing",
                &req);
        assert_string_equal(req.stage, "initrd");
        assert_string_equal(req.nonce, "ab");
        assert_int_equal(req.quote_size, 1);
        assert_int_equal(req.quote[0], 1);
        assert_null(req.ek_pub);
        assert_int_equal(req.n_pcr_banks, 2);
        assert_string_equal(req.pcrs_sha256[0], "00");
        assert_null(req.pcrs_sha256[1]);
        assert_string_equal(req.pcrs_sha256[2], "");
        assert_string_equal(req.pcrs_sha256[31], "ff");
        attest_quote_request_done(&req);

        /* a pcr value that is not hex is the verifier's business */
        decodes("{\"stage\":\"initrd\",\"nonce\":\"ab\"," Q ",\"pcrs\":{\"sha256\":{\"0\":\"xyz\"}}}", &req);
        assert_string_equal(req.pcrs_sha256[0], "xyz");
}

static void test_malformed(void **state) {
        check("", -EBADMSG, "malformed quote: EOF");
        check(" \n", -EBADMSG, "malformed quote: EOF");
        check("{\"stage\":", -EBADMSG, "malformed quote: unexpected EOF");
        check("[]",
              -EBADMSG,
              "malformed quote: json: cannot unmarshal array into Go value of type imds.QuoteRequest");
        check("\"x\"",
              -EBADMSG,
              "malformed quote: json: cannot unmarshal string into Go value of type imds.QuoteRequest");
        check("{\"nonce\":1}",
              -EBADMSG,
              "malformed quote: json: cannot unmarshal number into Go struct field QuoteRequest.nonce of type string");
        check("{\"stage\":true}",
              -EBADMSG,
              "malformed quote: json: cannot unmarshal bool into Go struct field QuoteRequest.stage of type imds.Stage");
        check("{\"quote\":[1]}",
              -EBADMSG,
              "malformed quote: json: cannot unmarshal array into Go struct field QuoteRequest.quote of type []uint8");
        check("{\"pcrs\":[]}",
              -EBADMSG,
              "malformed quote: json: cannot unmarshal array into Go struct field QuoteRequest.pcrs of type "
              "map[string]map[string]string");
        check("{\"pcrs\":{\"sha256\":{\"0\":0}}}",
              -EBADMSG,
              "malformed quote: json: cannot unmarshal number into Go struct field QuoteRequest.pcrs of type string");
        check("{\"quote\":\"AAA\"}", -EBADMSG, "malformed quote: illegal base64 data at input byte 0");
        check("{\"signature\":\"AA=A\"}", -EBADMSG, "malformed quote: illegal base64 data at input byte 2");
        check("{\"ak_pub\":\"QUJD!\"}", -EBADMSG, "malformed quote: illegal base64 data at input byte 4");
        check("{\"nonce\":\"ab\\u0000cd\"}", -EBADMSG, "malformed quote: nonce contains a NUL character");
        check("{\"stage\":\"initrd\\u0000\"}", -EBADMSG, "malformed quote: stage contains a NUL character");

        /* the first error in the body wins */
        check("{\"quote\":\"!\",\"nonce\":1}", -EBADMSG, "malformed quote: illegal base64 data at input byte 0");
}

static void test_limits(void **state) {
        _cleanup_free_ char *body = NULL, *a = NULL, *bank = NULL;

        /* 4096 decoded bytes of quote pass the decoder, 4097 do not */
        a = test_repeat('A', 4 * 4096 / 3 + 4);
        a[4 * 1365] = 0; /* 1365 quanta = 4095 bytes */
        assert_true(asprintf(&body, "{\"quote\":\"%sAA==\"}", a) > 0);
        check(body, -EINVAL, "invalid request: stage must be \"initrd\" or \"ready\"");
        free(body);
        assert_true(asprintf(&body, "{\"quote\":\"%sAAA=\"}", a) > 0);
        check(body, -EFBIG, "malformed quote: quote is over 4096 bytes");
        free(body);
        free(a);

        a = test_repeat('A', 1368);
        assert_true(asprintf(&body, "{\"signature\":\"%s\"}", a) > 0);
        check(body, -EFBIG, "malformed quote: signature is over 1024 bytes");
        free(body);
        assert_true(asprintf(&body, "{\"ek_pub\":\"%s%s\"}", a, a) > 0);
        check(body, -EFBIG, "malformed quote: ek_pub is over 2048 bytes");
        free(body);
        free(a);

        a = test_repeat('a', ATTEST_NONCE_MAX + 1);
        assert_true(asprintf(&body, "{\"nonce\":\"%s\"}", a) > 0);
        check(body, -EFBIG, "malformed quote: nonce is over 1024 characters");
        free(body);
        free(a);

        a = test_repeat('0', 129);
        assert_true(asprintf(&body, "{\"pcrs\":{\"sha512\":{\"0\":\"%s\"}}}", a) > 0);
        check(body, -EFBIG, "malformed quote: pcrs value is over 128 characters");
        free(body);

        /* 24 values per bank, 16 banks */
        bank = strdup("{");
        for (unsigned i = 0; i < 25; i++) {
                char *t = NULL;
                assert_true(asprintf(&t, "%s%s\"%u\":\"00\"", bank, i ? "," : "", i) > 0);
                free(bank);
                bank = t;
        }
        assert_true(asprintf(&body, "{\"pcrs\":{\"sha256\":%s}}}", bank) > 0);
        check(body, -EFBIG, "malformed quote: a pcrs bank has over 24 values");
        free(body);
        free(bank);
        bank = strdup("");
        for (unsigned i = 0; i < 17; i++) {
                char *t = NULL;
                assert_true(asprintf(&t, "%s%s\"b%u\":{}", bank, i ? "," : "", i) > 0);
                free(bank);
                bank = t;
        }
        assert_true(asprintf(&body, "{\"pcrs\":{%s}}", bank) > 0);
        check(body, -EFBIG, "malformed quote: pcrs has over 16 banks");

        /* logs: 4 MiB each */
        _cleanup_free_ char *big = test_repeat('A', (ATTEST_LOG_MAX / 3 + 1) * 4);
        free(body);
        assert_true(asprintf(&body, "{\"event_log\":\"%s\"}", big) > 0);
        check(body, -EFBIG, "malformed quote: event_log is over 4194304 bytes");
}

static void test_quote_result(void **state) {
        struct {
                const char *stage;
                bool verified;
                const char *message, *json;
        } cases[] = {
                { "initrd",
                  true,
                  "verified: ak 0123456789abcdef, pcr 11 phase enter-initrd",
                  "{\"stage\":\"initrd\",\"verified\":true,\"user_data_released\":true,\"message\":\"verified: ak "
                  "0123456789abcdef, pcr 11 phase enter-initrd\"}" },
                { "ready", true, NULL, "{\"stage\":\"ready\",\"verified\":true,\"user_data_released\":false}" },
                { "initrd",
                  false,
                  "unknown or expired nonce",
                  "{\"stage\":\"initrd\",\"verified\":false,\"user_data_released\":false,\"message\":\"unknown or "
                  "expired nonce\"}" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                json_auto_t *v = attest_quote_result_to_json(
                        cases[i].stage, cases[i].verified, cases[i].message);
                _cleanup_free_ char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
                assert_string_equal(s, cases[i].json);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_agent_body),  cmocka_unit_test(test_validation_order),
                cmocka_unit_test(test_go_decoding), cmocka_unit_test(test_malformed),
                cmocka_unit_test(test_limits),      cmocka_unit_test(test_quote_result),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
