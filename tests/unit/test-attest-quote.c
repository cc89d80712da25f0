/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* TPM structures (network-imds-attest.md §4.2): the swtpm fixtures parse and verify in both AK
 * forms, every truncation and every flipped byte is refused cleanly, and each refusal of a key,
 * a signature or a selection has the reference's text. Refused structures are built by editing
 * the fixtures through tss2-mu, so each reaches exactly the check it is meant for. */
#include <tss2/tss2_mu.h>

#include <openssl/evp.h>

#include "test-attest-fixtures.h"

#include "attest-quote.h"

typedef struct Parts {
        uint8_t *quote, *sig, *pub;
        size_t quote_size, sig_size, pub_size;
} Parts;

static void parts_load(Parts *p, const char *key, const char *stage) {
        _cleanup_free_ char *a = fixture_name(key, "ak.pub"), *m = NULL, *s = NULL, *mf = NULL, *sf = NULL;

        assert_true(asprintf(&mf, "%s.msg", stage) > 0);
        assert_true(asprintf(&sf, "%s.sig", stage) > 0);
        m = fixture_name(key, mf);
        s = fixture_name(key, sf);
        p->quote = fixture_read(m, &p->quote_size);
        p->sig = fixture_read(s, &p->sig_size);
        p->pub = fixture_read(a, &p->pub_size);
}

static void parts_done(Parts *p) {
        free(p->quote);
        free(p->sig);
        free(p->pub);
}

/* Parses p; on failure returns the message in a new string, on success NULL (and *ret). */
static char *parse(const Parts *p, AttestQuote *ret) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestQuote q;
        int r;

        r = attest_quote_parse(p->quote, p->quote_size, p->sig, p->sig_size, p->pub, p->pub_size, &q, &err);
        if (r >= 0) {
                assert_null(err.message);
                if (ret)
                        *ret = q;
                return NULL;
        }
        assert_true(r == -EBADMSG || r == -EPERM);
        assert_non_null(err.message);
        assert_int_equal(err.error, r);
        return TAKE_PTR(err.message);
}

static void assert_parse_fails(const Parts *p, const char *want) {
        _cleanup_free_ char *m = parse(p, NULL);

        if (!m)
                fail_msg("parsed, expected \"%s\"", want);
        assert_string_equal(m, want);
}

/* Re-marshals the AK after edit() into p->pub (as a TPMT_PUBLIC). */
static void edit_public(Parts *p, void (*edit)(TPMT_PUBLIC *pub)) {
        TPM2B_PUBLIC w = {};
        size_t off = 0;

        assert_int_equal(Tss2_MU_TPM2B_PUBLIC_Unmarshal(p->pub, p->pub_size, &off, &w), TSS2_RC_SUCCESS);
        edit(&w.publicArea);
        free(p->pub);
        p->pub = malloc(sizeof(TPMT_PUBLIC));
        off = 0;
        assert_int_equal(
                Tss2_MU_TPMT_PUBLIC_Marshal(&w.publicArea, p->pub, sizeof(TPMT_PUBLIC), &off),
                TSS2_RC_SUCCESS);
        p->pub_size = off;
}

static void edit_attest(Parts *p, void (*edit)(TPMS_ATTEST *a)) {
        TPMS_ATTEST a = {};
        size_t off = 0;

        assert_int_equal(Tss2_MU_TPMS_ATTEST_Unmarshal(p->quote, p->quote_size, &off, &a), TSS2_RC_SUCCESS);
        edit(&a);
        free(p->quote);
        p->quote = malloc(sizeof(TPMS_ATTEST));
        off = 0;
        assert_int_equal(Tss2_MU_TPMS_ATTEST_Marshal(&a, p->quote, sizeof(TPMS_ATTEST), &off), TSS2_RC_SUCCESS);
        p->quote_size = off;
}

static void edit_signature(Parts *p, void (*edit)(TPMT_SIGNATURE *s)) {
        TPMT_SIGNATURE s = {};
        size_t off = 0;

        assert_int_equal(Tss2_MU_TPMT_SIGNATURE_Unmarshal(p->sig, p->sig_size, &off, &s), TSS2_RC_SUCCESS);
        edit(&s);
        free(p->sig);
        p->sig = malloc(sizeof(TPMT_SIGNATURE));
        off = 0;
        assert_int_equal(
                Tss2_MU_TPMT_SIGNATURE_Marshal(&s, p->sig, sizeof(TPMT_SIGNATURE), &off), TSS2_RC_SUCCESS);
        p->sig_size = off;
}

static void test_fixtures_parse_and_verify(void **state) {
        const char *keys[] = { "ecdsa", "rsassa", "rsapss" }, *stages[] = { "initrd", "ready" };
        const TPMI_ALG_SIG_SCHEME schemes[] = { TPM2_ALG_ECDSA, TPM2_ALG_RSASSA, TPM2_ALG_RSAPSS };
        _cleanup_free_ char *nonce = fixture_text("nonce.hex");

        for (size_t k = 0; k < ELEMENTSOF(keys); k++)
                for (size_t s = 0; s < ELEMENTSOF(stages); s++) {
                        _cleanup_(parts_done) Parts p = {};
                        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
                        uint8_t digest[32];
                        char fp[65];
                        AttestQuote q, q2;

                        parts_load(&p, keys[k], stages[s]);
                        assert_null(parse(&p, &q));
                        assert_int_equal(q.signature.sigAlg, schemes[k]);
                        assert_int_equal(q.hash_alg, TPM2_ALG_SHA256);
                        assert_int_equal(q.bank_alg, TPM2_ALG_SHA256);
                        assert_string_equal(q.bank, "sha256");
                        assert_int_equal(q.pcr_mask, s == 0 ? 0x8ffU : 0x28ffU);
                        assert_int_equal(q.pcr_digest_size, 32);
                        assert_true(q.attest == p.quote && q.attest_size == p.quote_size);
                        assert_ok(attest_quote_verify_signature(&q, &err));
                        assert_true(attest_quote_nonce_matches(&q, nonce));

                        /* the fingerprint is the sha256 of the TPMT_PUBLIC, i.e. of ak.pub without its
                         * size, and the same for the TPMT form */
                        assert_true(EVP_Digest(p.pub + 2, p.pub_size - 2, digest, NULL, EVP_sha256(), NULL));
                        assert_string_equal(q.ak_fingerprint, hex_format(digest, 32, fp));
                        memmove(p.pub, p.pub + 2, p.pub_size - 2);
                        p.pub_size -= 2;
                        assert_null(parse(&p, &q2));
                        assert_string_equal(q.ak_fingerprint, q2.ak_fingerprint);
                        assert_ok(attest_quote_verify_signature(&q2, &err));
                }
}

static void test_nonce_matches(void **state) {
        _cleanup_(parts_done) Parts p = {};
        _cleanup_free_ char *nonce = fixture_text("nonce.hex");
        AttestQuote q;

        parts_load(&p, "ecdsa", "initrd");
        assert_null(parse(&p, &q));
        assert_true(attest_quote_nonce_matches(&q, nonce));
        /* hex of either case, as Go decodes it */
        for (char *c = nonce; *c; c++)
                if (*c >= 'a' && *c <= 'f')
                        *c = (char) (*c - 'a' + 'A');
        assert_true(attest_quote_nonce_matches(&q, nonce));
        nonce[63] = nonce[63] == '0' ? '1' : '0';
        assert_false(attest_quote_nonce_matches(&q, nonce));
        nonce[62] = 0;
        assert_false(attest_quote_nonce_matches(&q, nonce));
        assert_false(attest_quote_nonce_matches(&q, ""));
        assert_false(attest_quote_nonce_matches(&q, "zz"));
        assert_false(attest_quote_nonce_matches(&q, NULL));
}

/* Every prefix of each part is refused with a parse message, never a crash. */
static void test_truncations(void **state) {
        const char *keys[] = { "ecdsa", "rsassa", "rsapss" };

        for (size_t k = 0; k < ELEMENTSOF(keys); k++) {
                _cleanup_(parts_done) Parts p = {};
                size_t full;

                parts_load(&p, keys[k], "ready");

                full = p.quote_size;
                for (size_t n = 0; n < full; n++) {
                        _cleanup_free_ char *m = NULL, *want = NULL;

                        p.quote_size = n;
                        m = parse(&p, NULL);
                        assert_non_null(m);
                        if (n < 4)
                                assert_true(asprintf(&want, "malformed quote: attest is %zu bytes", n) > 0);
                        else
                                want = strdup("malformed quote: attest: unexpected end of data");
                        assert_string_equal(m, want);
                }
                p.quote_size = full;

                full = p.sig_size;
                for (size_t n = 0; n < full; n++) {
                        _cleanup_free_ char *m = NULL;

                        p.sig_size = n;
                        m = parse(&p, NULL);
                        assert_non_null(m);
                        assert_startswith(m, "malformed quote: signature: ");
                }
                p.sig_size = full;

                full = p.pub_size;
                for (size_t n = 0; n < full; n++) {
                        _cleanup_free_ char *m = NULL;

                        p.pub_size = n;
                        m = parse(&p, NULL);
                        /* a TPM2B cut by two bytes is a whole TPMT_PUBLIC minus its first two bytes,
                         * which does not decode either */
                        assert_non_null(m);
                        assert_startswith(m, "malformed quote: ak_pub: ");
                }
                p.pub_size = full;
                assert_null(parse(&p, NULL));
        }
}

static void test_trailing_bytes(void **state) {
        _cleanup_(parts_done) Parts p = {};

        parts_load(&p, "ecdsa", "initrd");
        p.quote = realloc(p.quote, p.quote_size + 1);
        p.quote[p.quote_size++] = 0;
        assert_parse_fails(&p, "malformed quote: attest: 1 trailing byte");
        p.quote_size--;

        p.sig = realloc(p.sig, p.sig_size + 3);
        memset(p.sig + p.sig_size, 0, 3);
        p.sig_size += 3;
        assert_parse_fails(&p, "malformed quote: signature: 3 trailing bytes");
        p.sig_size -= 3;

        /* a TPM2B_PUBLIC whose size does not cover exactly its contents: the error is the one of the
         * first reading, as a TPMT_PUBLIC */
        p.pub = realloc(p.pub, p.pub_size + 1);
        p.pub[p.pub_size++] = 0;
        assert_parse_fails(&p, "malformed quote: ak_pub: unexpected end of data");
        p.pub[1]++;
        assert_parse_fails(&p, "malformed quote: ak_pub: unexpected end of data");
        p.pub[1]--;
        p.pub_size--;
        assert_null(parse(&p, NULL));
}

/* Flipping any single byte of the quote or the signature never yields a verified quote. */
static void test_flips(void **state) {
        const char *keys[] = { "ecdsa", "rsassa", "rsapss" };

        for (size_t k = 0; k < ELEMENTSOF(keys); k++) {
                _cleanup_(parts_done) Parts p = {};
                uint8_t *parts[] = { NULL, NULL };
                size_t sizes[2];

                parts_load(&p, keys[k], "initrd");
                parts[0] = p.quote;
                parts[1] = p.sig;
                sizes[0] = p.quote_size;
                sizes[1] = p.sig_size;
                for (size_t w = 0; w < 2; w++)
                        for (size_t i = 0; i < sizes[w]; i++) {
                                _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
                                _cleanup_free_ char *m = NULL;
                                AttestQuote q;

                                parts[w][i] ^= 0x41;
                                m = parse(&p, &q);
                                if (!m) {
                                        int r = attest_quote_verify_signature(&q, &err);
                                        if (r >= 0)
                                                fail_msg(
                                                        "%s: flipping byte %zu of part %zu verifies",
                                                        keys[k],
                                                        i,
                                                        w);
                                        assert_int_equal(r, -EPERM);
                                        assert_startswith(err.message, "signature does not verify");
                                }
                                parts[w][i] ^= 0x41;
                        }
        }
}

static void clear_fixed_tpm_and_sign(TPMT_PUBLIC *pub) {
        pub->objectAttributes &= ~(TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_SIGN_ENCRYPT);
}

static void clear_all_required(TPMT_PUBLIC *pub) {
        pub->objectAttributes &= ~(
                TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_SENSITIVEDATAORIGIN |
                TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_SIGN_ENCRYPT);
}

static void set_decrypt(TPMT_PUBLIC *pub) {
        pub->objectAttributes |= TPMA_OBJECT_DECRYPT;
}

static void curve_p384(TPMT_PUBLIC *pub) {
        pub->parameters.eccDetail.curveID = TPM2_ECC_NIST_P384;
}

static void scheme_ecdaa(TPMT_PUBLIC *pub) {
        pub->parameters.eccDetail.scheme.scheme = TPM2_ALG_ECDAA;
        pub->parameters.eccDetail.scheme.details.ecdaa.hashAlg = TPM2_ALG_SHA256;
}

static void rsa_3072(TPMT_PUBLIC *pub) {
        pub->parameters.rsaDetail.keyBits = 3072;
}

static void rsa_oaep(TPMT_PUBLIC *pub) {
        pub->parameters.rsaDetail.scheme.scheme = TPM2_ALG_OAEP;
        pub->parameters.rsaDetail.scheme.details.oaep.hashAlg = TPM2_ALG_SHA256;
}

static void keyedhash(TPMT_PUBLIC *pub) {
        TPMT_PUBLIC k = {
                .type = TPM2_ALG_KEYEDHASH,
                .nameAlg = TPM2_ALG_SHA256,
                .objectAttributes = pub->objectAttributes,
                .parameters.keyedHashDetail.scheme.scheme = TPM2_ALG_NULL,
        };
        *pub = k;
}

static void ecc_point_off_curve(TPMT_PUBLIC *pub) {
        pub->unique.ecc.y.buffer[31] ^= 1;
}

static void test_ak_checks(void **state) {
        static const struct {
                const char *key;
                void (*edit)(TPMT_PUBLIC *pub);
                const char *want;
        } cases[] = {
                { "ecdsa", clear_fixed_tpm_and_sign, "attestation key attributes: [fixedTPM sign] not set" },
                { "rsassa",
                  clear_all_required,
                  "attestation key attributes: [fixedParent fixedTPM restricted sensitiveDataOrigin sign] not set" },
                { "ecdsa", set_decrypt, "attestation key attributes: decrypt is set" },
                { "ecdsa", curve_p384, "unsupported attestation key: ecc curve 0x0004, want P-256" },
                { "ecdsa", scheme_ecdaa, "unsupported attestation key: ecc scheme 0x001a, want ECDSA" },
                { "rsassa", rsa_3072, "unsupported attestation key: rsa 3072 bits, want 2048" },
                { "rsapss", rsa_oaep, "unsupported attestation key: rsa scheme 0x0017, want RSASSA or RSAPSS" },
                { "ecdsa", keyedhash, "unsupported attestation key: type 0x0008" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(parts_done) Parts p = {};

                parts_load(&p, cases[i].key, "initrd");
                edit_public(&p, cases[i].edit);
                assert_parse_fails(&p, cases[i].want);
        }
}

static void test_ecc_point_off_curve(void **state) {
        _cleanup_(parts_done) Parts p = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestQuote q;

        parts_load(&p, "ecdsa", "initrd");
        edit_public(&p, ecc_point_off_curve);
        assert_null(parse(&p, &q));
        assert_int_equal(attest_quote_verify_signature(&q, &err), -EPERM);
        assert_string_equal(err.message, "unsupported attestation key: ecc point is not on the curve");
}

static void sig_hmac(TPMT_SIGNATURE *s) {
        *s = (TPMT_SIGNATURE){ .sigAlg = TPM2_ALG_HMAC, .signature.hmac.hashAlg = TPM2_ALG_SHA256 };
}

static void sig_hash_sm3(TPMT_SIGNATURE *s) {
        s->signature.ecdsa.hash = TPM2_ALG_SM3_256;
}

static void sig_hash_sha384(TPMT_SIGNATURE *s) {
        s->signature.rsassa.hash = TPM2_ALG_SHA384;
}

static void test_signature_checks(void **state) {
        _cleanup_(parts_done) Parts ecc = {}, rsa = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        uint8_t *t;
        size_t ts;
        AttestQuote q;

        parts_load(&ecc, "ecdsa", "initrd");
        parts_load(&rsa, "rsassa", "initrd");

        /* swap the signatures: each names a scheme the key cannot have made */
        t = ecc.sig, ts = ecc.sig_size;
        ecc.sig = rsa.sig, ecc.sig_size = rsa.sig_size;
        rsa.sig = t, rsa.sig_size = ts;
        assert_parse_fails(&ecc, "signature does not verify: rsa signature from a non-rsa key");
        assert_parse_fails(&rsa, "signature does not verify: ecdsa signature from a non-ecc key");
        t = ecc.sig, ts = ecc.sig_size;
        ecc.sig = rsa.sig, ecc.sig_size = rsa.sig_size;
        rsa.sig = t, rsa.sig_size = ts;

        edit_signature(&ecc, sig_hash_sm3);
        assert_parse_fails(&ecc, "signature does not verify: signature hash 0x0012");

        /* a hash the signature names but the TPM did not use: parses, does not verify */
        edit_signature(&rsa, sig_hash_sha384);
        assert_null(parse(&rsa, &q));
        assert_int_equal(q.hash_alg, TPM2_ALG_SHA384);
        assert_int_equal(attest_quote_verify_signature(&q, &err), -EPERM);
        assert_string_equal(err.message, "signature does not verify");

        edit_signature(&rsa, sig_hmac);
        assert_parse_fails(&rsa, "signature does not verify: scheme 0x0005");
}

static void magic(TPMS_ATTEST *a) {
        a->magic = 0x00544347;
}

static void certify(TPMS_ATTEST *a) {
        a->type = TPM2_ST_ATTEST_CERTIFY;
        a->attested.certify = (TPMS_CERTIFY_INFO){};
}

static void two_banks(TPMS_ATTEST *a) {
        TPML_PCR_SELECTION *s = &a->attested.quote.pcrSelect;

        s->pcrSelections[1] = s->pcrSelections[0];
        s->pcrSelections[1].hash = TPM2_ALG_SHA1;
        s->count = 2;
}

static void second_bank_empty(TPMS_ATTEST *a) {
        TPML_PCR_SELECTION *s = &a->attested.quote.pcrSelect;

        s->pcrSelections[1] = (TPMS_PCR_SELECTION){ .hash = TPM2_ALG_SM3_256, .sizeofSelect = 3 };
        s->count = 2;
}

static void no_pcr(TPMS_ATTEST *a) {
        memset(a->attested.quote.pcrSelect.pcrSelections[0].pcrSelect, 0, TPM2_PCR_SELECT_MAX);
}

static void no_selection(TPMS_ATTEST *a) {
        a->attested.quote.pcrSelect.count = 0;
}

static void bank_sm3(TPMS_ATTEST *a) {
        a->attested.quote.pcrSelect.pcrSelections[0].hash = TPM2_ALG_SM3_256;
}

static void test_attest_checks(void **state) {
        static const struct {
                void (*edit)(TPMS_ATTEST *a);
                const char *want; /* NULL: parses */
        } cases[] = {
                { magic, "quote magic is not TPM_GENERATED_VALUE: got 0x00544347" },
                { certify, "attestation is not a quote: type 0x8017" },
                { two_banks, "malformed quote: quote selects more than one pcr bank" },
                { second_bank_empty, NULL },
                { no_pcr, "malformed quote: quote selects no pcr" },
                { no_selection, "malformed quote: quote selects no pcr" },
                { bank_sm3, "unsupported pcr bank: pcr bank 0x0012" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(parts_done) Parts p = {};

                parts_load(&p, "ecdsa", "initrd");
                edit_attest(&p, cases[i].edit);
                if (cases[i].want)
                        assert_parse_fails(&p, cases[i].want);
                else
                        assert_null(parse(&p, NULL));
        }
}

static void test_sha1_bank(void **state) {
        _cleanup_(parts_done) Parts p = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestQuote q;

        parts_load(&p, "ecdsa", "sha1");
        assert_null(parse(&p, &q));
        assert_string_equal(q.bank, "sha1");
        assert_int_equal(q.bank_alg, TPM2_ALG_SHA1);
        /* the digest is still the signature's hash (sha256) over 20-byte values */
        assert_int_equal(q.hash_alg, TPM2_ALG_SHA256);
        assert_ok(attest_quote_verify_signature(&q, &err));
}

static void test_verify_pcrs(void **state) {
        _cleanup_(parts_done) Parts p = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        uint8_t *bytes[ATTEST_PCR_SLOTS] = {};
        AttestPcrValue v[ATTEST_PCR_SLOTS] = {};
        uint8_t short_value[31] = {}, extra[32] = {};
        AttestQuote q;

        parts_load(&p, "rsapss", "initrd");
        assert_null(parse(&p, &q));
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++) {
                _cleanup_free_ char *h = fixture_pcr("initrd", i);
                if (!h)
                        continue;
                assert_ok(attest_hex_decode(h, strlen(h), &bytes[i], &v[i].size, NULL));
                v[i].data = bytes[i];
                v[i].set = true;
        }
        assert_ok(attest_quote_verify_pcrs(&q, v, &err));

        /* values the quote does not cover change nothing */
        v[20] = (AttestPcrValue){ .set = true, .data = extra, .size = 3 };
        assert_ok(attest_quote_verify_pcrs(&q, v, &err));

        AttestPcrValue saved = v[4];
        v[4] = (AttestPcrValue){ .set = true, .data = short_value, .size = sizeof(short_value) };
        assert_int_equal(attest_quote_verify_pcrs(&q, v, &err), -EPERM);
        assert_string_equal(err.message, "pcr value: pcr 4 has 31 bytes, sha256 needs 32");

        v[4] = (AttestPcrValue){};
        assert_int_equal(attest_quote_verify_pcrs(&q, v, &err), -EPERM);
        assert_string_equal(err.message, "pcr value: no value for pcr 4");

        v[4] = saved;
        v[5] = v[6];
        assert_int_equal(attest_quote_verify_pcrs(&q, v, &err), -EPERM);
        assert_string_equal(err.message, "pcr digest mismatch");

        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                free(bytes[i]);
}

static void test_hash_names(void **state) {
        assert_string_equal(attest_hash_name(TPM2_ALG_SHA1), "sha1");
        assert_string_equal(attest_hash_name(TPM2_ALG_SHA512), "sha512");
        assert_null(attest_hash_name(TPM2_ALG_SM3_256));
        assert_int_equal(attest_hash_size(TPM2_ALG_SHA384), 48);
        assert_int_equal(attest_hash_size(TPM2_ALG_NULL), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fixtures_parse_and_verify),
                cmocka_unit_test(test_nonce_matches),
                cmocka_unit_test(test_truncations),
                cmocka_unit_test(test_trailing_bytes),
                cmocka_unit_test(test_flips),
                cmocka_unit_test(test_ak_checks),
                cmocka_unit_test(test_ecc_point_off_curve),
                cmocka_unit_test(test_signature_checks),
                cmocka_unit_test(test_attest_checks),
                cmocka_unit_test(test_sha1_bank),
                cmocka_unit_test(test_verify_pcrs),
                cmocka_unit_test(test_hash_names),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
