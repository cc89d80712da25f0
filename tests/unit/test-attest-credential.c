/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* TPM2_MakeCredential on the host (attest-credential.c). A credential is random by construction
 * (the seed), so there is no fixed expected output: correctness is shown by a TPM taking it. A swtpm
 * creates an EK and an AK, this code wraps a secret for the AK's name, and tpm2_activatecredential
 * must give the secret back; for another name it must refuse. The names and public-key conversions
 * are checked against the fixtures of tests/data/attest/credential/, which tpm2-tools wrote:
 *
 *   tpm2_createek -c 0x81010001 -G rsa -u ek.pub
 *   tpm2_createak -C 0x81010001 -c ak.ctx -G ecc -g sha256 -s ecdsa -u ak.pub -n ak.name
 *   tpm2_readpublic -c 0x81010001 -n ek.name -f pem -o ek.pem
 *   tpm2_createek -c 0x81010016 -G ecc -u ekecc.pub
 *   tpm2_readpublic -c 0x81010016 -n ekecc.name -f pem -o ekecc.pem
 *
 * The round trips are skipped when swtpm or tpm2-tools are not installed. */
#include <openssl/pem.h>
#include <tss2/tss2_mu.h>

#include "test-attest-fixtures.h"
#include "test-swtpm.h"

#include "openssl-util.h"

#include "attest-credential.h"

static void load_public(const char *file, TPM2B_PUBLIC *ret) {
        _cleanup_free_ uint8_t *data = NULL;
        size_t size = 0, off = 0;

        data = fixture_read(file, &size);
        memset(ret, 0, sizeof(*ret));
        assert_int_equal(Tss2_MU_TPM2B_PUBLIC_Unmarshal(data, size, &off, ret), TSS2_RC_SUCCESS);
        assert_int_equal(off, size);
}

static void assert_name(const TPM2B_NAME *name, const uint8_t *want, size_t want_size) {
        assert_int_equal(name->size, want_size);
        assert_memory_equal(name->name, want, want_size);
}

static void test_name_matches_tpm2_tools(void **state) {
        static const char *const pairs[][2] = {
                { "credential/ak.pub", "credential/ak.name" },
                { "credential/ek.pub", "credential/ek.name" },
                { "credential/ekecc.pub", "credential/ekecc.name" },
        };

        for (size_t i = 0; i < ELEMENTSOF(pairs); i++) {
                _cleanup_free_ uint8_t *want = NULL;
                TPM2B_PUBLIC pub;
                TPM2B_NAME name;
                size_t want_size = 0;

                load_public(pairs[i][0], &pub);
                want = fixture_read(pairs[i][1], &want_size);
                assert_ok(attest_tpm_name(&pub.publicArea, &name));
                assert_name(&name, want, want_size);
        }
}

static void test_name_unknown_algorithm(void **state) {
        TPM2B_PUBLIC pub;
        TPM2B_NAME name = { .size = 7 };

        load_public("credential/ak.pub", &pub);
        pub.publicArea.nameAlg = TPM2_ALG_SM3_256;
        assert_errno(attest_tpm_name(&pub.publicArea, &name), -EOPNOTSUPP);
        assert_int_equal(name.size, 7);
}

static char *parse_error(const uint8_t *data, size_t size, int want) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        TPMT_PUBLIC pub;

        assert_errno(attest_ek_public_parse(data, size, &pub, &err), want);
        assert_non_null(err.message);
        return TAKE_PTR(err.message);
}

static void test_ek_parse(void **state) {
        _cleanup_free_ uint8_t *rsa = NULL, *ecc = NULL, *ak = NULL;
        size_t rsa_size = 0, ecc_size = 0, ak_size = 0;
        TPM2B_PUBLIC want;
        TPMT_PUBLIC pub;

        rsa = fixture_read("credential/ek.pub", &rsa_size);
        ecc = fixture_read("credential/ekecc.pub", &ecc_size);
        ak = fixture_read("credential/ak.pub", &ak_size);

        /* The agent's form (TPM2B_PUBLIC) and the bare public area. */
        load_public("credential/ek.pub", &want);
        assert_ok(attest_ek_public_parse(rsa, rsa_size, &pub, NULL));
        assert_memory_equal(&pub, &want.publicArea, sizeof(pub));
        assert_ok(attest_ek_public_parse(rsa + 2, rsa_size - 2, &pub, NULL));
        assert_memory_equal(&pub, &want.publicArea, sizeof(pub));
        assert_ok(attest_ek_public_parse(ecc, ecc_size, &pub, NULL));
        assert_int_equal(pub.type, TPM2_ALG_ECC);

        /* Every truncation is malformed, and so is a trailing byte. */
        for (size_t n = 0; n < rsa_size; n++) {
                _cleanup_free_ char *m = parse_error(rsa, n, -EBADMSG);
                assert_true(strneq(m, "malformed endorsement key: ", 27));
        }
        {
                _cleanup_free_ uint8_t *longer = malloc(rsa_size + 1);
                _cleanup_free_ char *m = NULL;

                assert_non_null(longer);
                memcpy(longer, rsa, rsa_size);
                longer[rsa_size] = 0;
                m = parse_error(longer, rsa_size + 1, -EBADMSG);
                assert_string_equal(m, "malformed endorsement key: 1 trailing byte");
        }

        /* A signing key (the AK) cannot receive a credential. */
        {
                _cleanup_free_ char *m = parse_error(ak, ak_size, -EPERM);
                assert_string_equal(
                        m,
                        "unsupported endorsement key: attributes 0x00050072 are not those of a restricted decryption key fixed to its tpm");
        }
}

/* The EK of want, edited by edit, marshalled and parsed again: the message of the refusal. */
static char *edited_ek_error(void (*edit)(TPMT_PUBLIC *p)) {
        uint8_t buf[sizeof(TPMT_PUBLIC)];
        TPM2B_PUBLIC pub;
        size_t off = 0;

        load_public("credential/ek.pub", &pub);
        edit(&pub.publicArea);
        assert_int_equal(Tss2_MU_TPMT_PUBLIC_Marshal(&pub.publicArea, buf, sizeof(buf), &off), TSS2_RC_SUCCESS);
        return parse_error(buf, off, -EPERM);
}

static void edit_name_alg(TPMT_PUBLIC *p) {
        p->nameAlg = TPM2_ALG_SHA1;
}

static void edit_symmetric(TPMT_PUBLIC *p) {
        p->parameters.rsaDetail.symmetric.mode.aes = TPM2_ALG_CBC;
}

static void edit_modulus(TPMT_PUBLIC *p) {
        p->unique.rsa.size = 128;
}

static void test_ek_refused(void **state) {
        _cleanup_free_ char *a = edited_ek_error(edit_name_alg), *b = edited_ek_error(edit_symmetric),
                            *c = edited_ek_error(edit_modulus);

        assert_string_equal(a, "unsupported endorsement key: name algorithm 0x0004, want sha256 or sha384");
        assert_string_equal(
                b,
                "unsupported endorsement key: symmetric algorithm 0x0006/128/0x0042, want aes-128 or aes-256 in cfb mode");
        assert_string_equal(c, "unsupported endorsement key: rsa key of 2048 bits with a 128-byte modulus");
}

static EVP_PKEY *load_pem(const char *file) {
        _cleanup_free_ char *p = fixture_path(file);
        _cleanup_fclose_ FILE *f = fopen(p, "re");
        EVP_PKEY *pkey;

        assert_non_null(f);
        pkey = PEM_read_PUBKEY(f, NULL, NULL, NULL);
        assert_non_null(pkey);
        return pkey;
}

/* The public key alone (as in an EK certificate) gives the TPM's public area, so the same name. */
static void test_ek_from_pkey(void **state) {
        static const char *const pairs[][2] = {
                { "credential/ek.pem", "credential/ek.pub" },
                { "credential/ekecc.pem", "credential/ekecc.pub" },
        };

        for (size_t i = 0; i < ELEMENTSOF(pairs); i++) {
                _cleanup_(EVP_PKEY_freep) EVP_PKEY *pkey = load_pem(pairs[i][0]);
                TPM2B_PUBLIC want;
                TPMT_PUBLIC pub;
                TPM2B_NAME a, b;

                load_public(pairs[i][1], &want);
                assert_ok(attest_ek_public_from_pkey(pkey, &pub, NULL));
                assert_ok(attest_tpm_name(&pub, &a));
                assert_ok(attest_tpm_name(&want.publicArea, &b));
                assert_name(&a, b.name, b.size);
        }

        {
                _cleanup_(EVP_PKEY_freep)
                        EVP_PKEY *small = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t) 1024);
                _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
                TPMT_PUBLIC pub;

                assert_non_null(small);
                assert_errno(attest_ek_public_from_pkey(small, &pub, &err), -EOPNOTSUPP);
                assert_string_equal(
                        err.message,
                        "unsupported endorsement key: rsa key of 1024 bits, the default template has 2048");
        }
}

static void ek_and_name(const char *ek_file, TPMT_PUBLIC *ret_ek, TPM2B_NAME *ret_name) {
        TPM2B_PUBLIC ek, ak;

        load_public(ek_file, &ek);
        load_public("credential/ak.pub", &ak);
        *ret_ek = ek.publicArea;
        assert_ok(attest_tpm_name(&ak.publicArea, ret_name));
}

static void test_make_shape(void **state) {
        static const uint8_t secret[32] = { 1, 2, 3 };
        AttestCredential a, b;
        TPMT_PUBLIC ek;
        TPM2B_NAME name;

        /* RSA: a 2-byte size, integrityHMAC (2 + 32) and encIdentity (2 + 32 encrypted); the seed
         * encrypted to 2048 bits. */
        ek_and_name("credential/ek.pub", &ek, &name);
        assert_ok(attest_make_credential(&ek, &name, secret, sizeof(secret), &a, NULL));
        assert_int_equal(a.blob_size, 2 + 2 + 32 + 2 + 32);
        assert_memory_equal(a.blob, ((const uint8_t[]){ 0x00, 0x44, 0x00, 0x20 }), 4);
        assert_int_equal(a.secret_size, 2 + 256);
        assert_memory_equal(a.secret, ((const uint8_t[]){ 0x01, 0x00 }), 2);

        /* A fresh seed every time. */
        assert_ok(attest_make_credential(&ek, &name, secret, sizeof(secret), &b, NULL));
        assert_memory_not_equal(a.secret, b.secret, a.secret_size);
        assert_memory_not_equal(a.blob, b.blob, a.blob_size);

        /* ECC: the ephemeral point, two 32-byte coordinates. */
        ek_and_name("credential/ekecc.pub", &ek, &name);
        assert_ok(attest_make_credential(&ek, &name, secret, 5, &a, NULL));
        assert_int_equal(a.blob_size, 2 + 2 + 32 + 2 + 5);
        assert_int_equal(a.secret_size, 2 + 2 + 32 + 2 + 32);
}

static void test_make_refused(void **state) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        uint8_t secret[33] = {};
        AttestCredential c = { .blob_size = 99 };
        TPMT_PUBLIC ek;
        TPM2B_NAME name;

        ek_and_name("credential/ek.pub", &ek, &name);
        assert_errno(attest_make_credential(&ek, &name, secret, sizeof(secret), &c, &err), -EINVAL);
        assert_string_equal(err.message, "credential of 33 bytes: the endorsement key takes 1 to 32");
        api_error_done(&err);
        assert_errno(attest_make_credential(&ek, &name, secret, 0, &c, &err), -EINVAL);
        api_error_done(&err);
        name.size = 1;
        assert_errno(attest_make_credential(&ek, &name, secret, 16, &c, &err), -EINVAL);
        assert_string_equal(err.message, "object name of 1 bytes");
        assert_int_equal(c.blob_size, 99);
}

/* tpm2-tools' credential file (tpm2_makecredential -o, tpm2_activatecredential -i): a magic, a
 * version, then the two marshalled structures. */
static void write_tools_credential(const TestSwtpm *t, const char *file, const AttestCredential *c) {
        uint8_t buf[8 + sizeof(c->blob) + sizeof(c->secret)] = { 0xba, 0xdc, 0xc0, 0xde, 0, 0, 0, 1 };

        memcpy(buf + 8, c->blob, c->blob_size);
        memcpy(buf + 8 + c->blob_size, c->secret, c->secret_size);
        test_swtpm_write(t, file, buf, 8 + c->blob_size + c->secret_size);
}

/* Activates cred.bin with the AK of ak.ctx and the EK at ek_handle through a PolicySecret(EH)
 * session, as the guest will; the exit status of tpm2_activatecredential. */
static int activate(const TestSwtpm *t, const char *ek_handle) {
        int r;

        (void) test_swtpm_sh(t, "rm -f out.bin session.ctx");
        assert_int_equal(test_swtpm_sh(t, "tpm2_startauthsession --policy-session -S session.ctx"), 0);
        assert_int_equal(test_swtpm_sh(t, "tpm2_policysecret -S session.ctx -c e"), 0);
        r = test_swtpm_sh(
                t,
                "tpm2_activatecredential -c ak.ctx -C %s -i cred.bin -o out.bin -P session:session.ctx",
                ek_handle);
        (void) test_swtpm_sh(t, "tpm2_flushcontext session.ctx; tpm2_flushcontext -t");
        return r;
}

static bool have_tools(void) {
        return test_have("swtpm") && test_have("tpm2_activatecredential") && test_have("tpm2_createak");
}

/* A swtpm per round trip, stopped by the teardown also when an assertion failed; none (and the test
 * skipped) without swtpm and tpm2-tools. */
static int swtpm_setup(void **state) {
        TestSwtpm *t = calloc(1, sizeof(TestSwtpm));

        assert_non_null(t);
        if (!have_tools() || !test_swtpm_start(t))
                t = mfree(t);
        *state = t;
        return 0;
}

static int swtpm_teardown(void **state) {
        TestSwtpm *t = *state;

        if (t) {
                test_swtpm_stop(t);
                free(t);
        }
        return 0;
}

static void round_trip(TestSwtpm *t, const char *algorithm, const char *ek_handle) {
        static const uint8_t secret[] = "the AK lives with the EK here";
        _cleanup_free_ uint8_t *ek_bytes = NULL, *ak_bytes = NULL, *ak_name = NULL, *out = NULL;
        size_t ek_size = 0, ak_size = 0, ak_name_size = 0, out_size = 0, off = 0;
        TPMT_PUBLIC ek;
        TPM2B_PUBLIC ak = {};
        TPM2B_NAME name;
        AttestCredential c;

        if (!t)
                skip();

        assert_int_equal(
                test_swtpm_sh(
                        t, "tpm2_createek -c %s -G %s -u ek.pub && tpm2_flushcontext -t", ek_handle, algorithm),
                0);
        assert_int_equal(
                test_swtpm_sh(
                        t,
                        "tpm2_createak -C %s -c ak.ctx -G ecc -g sha256 -s ecdsa -u ak.pub -n ak.name && "
                        "tpm2_flushcontext -t",
                        ek_handle),
                0);

        /* The daemon's view: the EK as the agent reports it, the AK's name computed from its public
         * area (and equal to the TPM's). */
        ek_bytes = test_swtpm_read(t, "ek.pub", &ek_size);
        assert_ok(attest_ek_public_parse(ek_bytes, ek_size, &ek, NULL));
        ak_bytes = test_swtpm_read(t, "ak.pub", &ak_size);
        assert_int_equal(Tss2_MU_TPM2B_PUBLIC_Unmarshal(ak_bytes, ak_size, &off, &ak), TSS2_RC_SUCCESS);
        assert_ok(attest_tpm_name(&ak.publicArea, &name));
        ak_name = test_swtpm_read(t, "ak.name", &ak_name_size);
        assert_name(&name, ak_name, ak_name_size);

        assert_ok(attest_make_credential(&ek, &name, secret, sizeof(secret), &c, NULL));
        write_tools_credential(t, "cred.bin", &c);
        assert_int_equal(activate(t, ek_handle), 0);
        out = test_swtpm_read(t, "out.bin", &out_size);
        assert_int_equal(out_size, sizeof(secret));
        assert_memory_equal(out, secret, sizeof(secret));

        /* Made for another object, the TPM refuses it (the integrity HMAC covers the name). */
        name.name[name.size - 1] ^= 1;
        assert_ok(attest_make_credential(&ek, &name, secret, sizeof(secret), &c, NULL));
        write_tools_credential(t, "cred.bin", &c);
        assert_int_not_equal(activate(t, ek_handle), 0);

        /* A flipped bit of the wrapped seed as well. */
        name.name[name.size - 1] ^= 1;
        assert_ok(attest_make_credential(&ek, &name, secret, sizeof(secret), &c, NULL));
        c.secret[c.secret_size - 1] ^= 1;
        write_tools_credential(t, "cred.bin", &c);
        assert_int_not_equal(activate(t, ek_handle), 0);
}

static void test_round_trip_rsa(void **state) {
        round_trip(*state, "rsa", "0x81010001");
}

static void test_round_trip_ecc(void **state) {
        round_trip(*state, "ecc", "0x81010016");
}

/* A credential made from the EK's PEM (what its certificate holds) activates as well. */
static void test_round_trip_from_pem(void **state) {
        static const uint8_t secret[16] = "0123456789abcdef";
        _cleanup_(EVP_PKEY_freep) EVP_PKEY *pkey = NULL;
        _cleanup_free_ uint8_t *ak_bytes = NULL, *out = NULL;
        _cleanup_free_ char *pem = NULL;
        _cleanup_fclose_ FILE *f = NULL;
        size_t ak_size = 0, out_size = 0, off = 0;
        TestSwtpm *t = *state;
        TPMT_PUBLIC ek;
        TPM2B_PUBLIC ak = {};
        TPM2B_NAME name;
        AttestCredential c;

        if (!t)
                skip();

        assert_int_equal(
                test_swtpm_sh(
                        t,
                        "tpm2_createek -c 0x81010001 -G rsa -u ek.pub && tpm2_flushcontext -t && "
                        "tpm2_readpublic -c 0x81010001 -f pem -o ek.pem && "
                        "tpm2_createak -C 0x81010001 -c ak.ctx -G ecc -g sha256 -s ecdsa -u ak.pub && "
                        "tpm2_flushcontext -t"),
                0);
        pem = test_swtpm_path(t, "ek.pem");
        f = fopen(pem, "re");
        assert_non_null(f);
        pkey = PEM_read_PUBKEY(f, NULL, NULL, NULL);
        assert_non_null(pkey);
        assert_ok(attest_ek_public_from_pkey(pkey, &ek, NULL));

        ak_bytes = test_swtpm_read(t, "ak.pub", &ak_size);
        assert_int_equal(Tss2_MU_TPM2B_PUBLIC_Unmarshal(ak_bytes, ak_size, &off, &ak), TSS2_RC_SUCCESS);
        assert_ok(attest_tpm_name(&ak.publicArea, &name));
        assert_ok(attest_make_credential(&ek, &name, secret, sizeof(secret), &c, NULL));
        write_tools_credential(t, "cred.bin", &c);
        assert_int_equal(activate(t, "0x81010001"), 0);
        out = test_swtpm_read(t, "out.bin", &out_size);
        assert_int_equal(out_size, sizeof(secret));
        assert_memory_equal(out, secret, sizeof(secret));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_name_matches_tpm2_tools),
                cmocka_unit_test(test_name_unknown_algorithm),
                cmocka_unit_test(test_ek_parse),
                cmocka_unit_test(test_ek_refused),
                cmocka_unit_test(test_ek_from_pkey),
                cmocka_unit_test(test_make_shape),
                cmocka_unit_test(test_make_refused),
                cmocka_unit_test_setup_teardown(test_round_trip_rsa, swtpm_setup, swtpm_teardown),
                cmocka_unit_test_setup_teardown(test_round_trip_ecc, swtpm_setup, swtpm_teardown),
                cmocka_unit_test_setup_teardown(test_round_trip_from_pem, swtpm_setup, swtpm_teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
