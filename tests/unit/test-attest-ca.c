/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The host CA of vTPM EK certificates: made once with its key private, kept across opens, and the
 * verdicts on an EK certificate and the EK a guest presents (certified, absent, foreign). */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <openssl/core_names.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <tss2/tss2_mu.h>

#include "test-util.h"

#include "attest-ca.h"
#include "fs-util.h"

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static int setup(void **state) {
        char t[] = "/tmp/test-attest-ca.XXXXXX";

        if (!mkdtemp(t))
                return -1;
        *state = strdup(t);
        return *state ? 0 : -1;
}

static int teardown(void **state) {
        (void) nftw(*state, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(*state);
        return 0;
}

static char *in(const char *dir, const char *name) {
        char *p;

        assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
        return p;
}

static EVP_PKEY *read_key(const char *path) {
        FILE *f = fopen(path, "re");
        EVP_PKEY *k;

        assert_non_null(f);
        k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
        fclose(f);
        assert_non_null(k);
        return k;
}

/* An EK certificate for ek, as swtpm_localca would make it (DER), signed by signer under issuer. */
static unsigned char *ek_cert(EVP_PKEY *ek, EVP_PKEY *signer, const char *issuer_pem, size_t *ret_size) {
        X509 *c = X509_new(), *issuer;
        FILE *f = fopen(issuer_pem, "re");
        unsigned char *der = NULL;
        int n;

        assert_non_null(c);
        assert_true(X509_set_version(c, X509_VERSION_3));
        assert_true(ASN1_INTEGER_set(X509_get_serialNumber(c), 7));
        assert_non_null(X509_gmtime_adj(X509_getm_notBefore(c), 0));
        assert_non_null(X509_gmtime_adj(X509_getm_notAfter(c), 3600));
        assert_true(X509_NAME_add_entry_by_txt(
                X509_get_subject_name(c), "CN", MBSTRING_UTF8, (const unsigned char *) "unknown", -1, -1, 0));
        assert_non_null(f);
        issuer = PEM_read_X509(f, NULL, NULL, NULL);
        fclose(f);
        assert_non_null(issuer);
        assert_true(X509_set_issuer_name(c, X509_get_subject_name(issuer)));
        X509_free(issuer);
        assert_true(X509_set_pubkey(c, ek));
        assert_true(X509_sign(c, signer, EVP_sha256()));
        n = i2d_X509(c, &der);
        assert_true(n > 0);
        X509_free(c);
        *ret_size = (size_t) n;
        return der;
}

/* The EK as the agent sends it: a marshalled TPM2B_PUBLIC with the RSA modulus as unique. */
static size_t ek_public(EVP_PKEY *ek, uint8_t *buf, size_t size) {
        TPM2B_PUBLIC pub = { .publicArea = { .type = TPM2_ALG_RSA, .nameAlg = TPM2_ALG_SHA256 } };
        BIGNUM *n = NULL;
        size_t off = 0;

        pub.publicArea.parameters.rsaDetail.keyBits = (TPMI_RSA_KEY_BITS) EVP_PKEY_get_bits(ek);
        pub.publicArea.parameters.rsaDetail.symmetric.algorithm = TPM2_ALG_NULL;
        pub.publicArea.parameters.rsaDetail.scheme.scheme = TPM2_ALG_NULL;
        assert_true(EVP_PKEY_get_bn_param(ek, OSSL_PKEY_PARAM_RSA_N, &n));
        pub.publicArea.unique.rsa.size = (UINT16) BN_num_bytes(n);
        assert_int_equal(BN_bn2bin(n, pub.publicArea.unique.rsa.buffer), pub.publicArea.unique.rsa.size);
        BN_free(n);
        assert_int_equal(Tss2_MU_TPM2B_PUBLIC_Marshal(&pub, buf, size, &off), TSS2_RC_SUCCESS);
        return off;
}

static void test_created_once_key_private(void **state) {
        _cleanup_free_ char *dir = in(*state, "ca"), *key = in(dir, "ca-key.pem"),
                            *cert = in(dir, "ca-cert.pem"), *conf = in(dir, "swtpm_setup.conf"),
                            *first = NULL, *again = NULL, *text = NULL;
        _cleanup_(attest_ca_freep) AttestCa *ca = NULL;
        struct stat st;
        size_t size;

        assert_ok(attest_ca_open(dir, "host-a", &ca));
        assert_ok(stat(key, &st));
        assert_int_equal(st.st_mode & 0777, 0600);
        assert_ok(stat(dir, &st));
        assert_int_equal(st.st_mode & 0777, 0700);
        assert_string_equal(attest_ca_setup_config(ca), conf);
        assert_ok(read_full_file(conf, 4096, &text, &size));
        /* swtpm_setup is pointed at the CA here, never at the host's /var/lib/swtpm-localca */
        assert_non_null(strstr(text, "create_certs_tool_config = "));
        assert_non_null(strstr(text, dir));
        assert_null(strstr(text, "/var/lib/swtpm-localca"));
        assert_ok(read_full_file(cert, 65536, &first, &size));
        ca = attest_ca_free(ca);

        /* a second start keeps the CA every VM's certificate chains to */
        assert_ok(attest_ca_open(dir, "host-a", &ca));
        assert_ok(read_full_file(cert, 65536, &again, &size));
        assert_string_equal(first, again);
}

static void test_verdicts(void **state) {
        _cleanup_free_ char *dir = in(*state, "ca"), *other_dir = in(*state, "other"),
                            *key = in(dir, "ca-key.pem"), *other_key = in(other_dir, "ca-key.pem"),
                            *cert = in(dir, "ca-cert.pem"), *other_cert = in(other_dir, "ca-cert.pem"),
                            *why = NULL;
        _cleanup_(attest_ca_freep) AttestCa *ca = NULL, *other = NULL;
        EVP_PKEY *ca_key, *other_ca_key, *ek = EVP_RSA_gen(1024), *ek2 = EVP_RSA_gen(1024);
        unsigned char *good, *alien;
        uint8_t pub[sizeof(TPM2B_PUBLIC)], pub2[sizeof(TPM2B_PUBLIC)];
        size_t good_size, alien_size, pub_size, pub2_size;

        assert_non_null(ek);
        assert_non_null(ek2);
        assert_ok(attest_ca_open(dir, "host-a", &ca));
        assert_ok(attest_ca_open(other_dir, "host-b", &other));
        ca_key = read_key(key);
        other_ca_key = read_key(other_key);
        good = ek_cert(ek, ca_key, cert, &good_size);
        alien = ek_cert(ek, other_ca_key, other_cert, &alien_size);
        pub_size = ek_public(ek, pub, sizeof(pub));
        pub2_size = ek_public(ek2, pub2, sizeof(pub2));

        assert_int_equal(attest_ca_check_ek(ca, good, good_size, NULL, 0, &why), ATTEST_EK_CERTIFIED);
        assert_null(why);
        assert_int_equal(attest_ca_check_ek(ca, good, good_size, pub, pub_size, &why), ATTEST_EK_CERTIFIED);
        assert_int_equal(attest_ca_check_ek(ca, NULL, 0, pub, pub_size, &why), ATTEST_EK_ABSENT);

        assert_int_equal(attest_ca_check_ek(ca, good, good_size, pub2, pub2_size, &why), ATTEST_EK_FOREIGN);
        assert_string_equal(why, "the guest's EK is not the one certified for this VM");
        why = mfree(why);
        assert_int_equal(attest_ca_check_ek(ca, alien, alien_size, pub, pub_size, &why), ATTEST_EK_FOREIGN);
        assert_non_null(strstr(why, "not signed by this host's CA"));
        why = mfree(why);
        assert_int_equal(attest_ca_check_ek(other, good, good_size, NULL, 0, NULL), ATTEST_EK_FOREIGN);
        assert_int_equal(attest_ca_check_ek(ca, good, good_size - 1, NULL, 0, &why), ATTEST_EK_FOREIGN);
        why = mfree(why);
        assert_int_equal(attest_ca_check_ek(ca, good, good_size, pub, pub_size - 1, &why), ATTEST_EK_FOREIGN);
        why = mfree(why);

        assert_string_equal(attest_ek_verdict_to_string(ATTEST_EK_FOREIGN), "foreign");
        assert_int_equal(attest_ek_verdict_from_string("certified"), ATTEST_EK_CERTIFIED);

        OPENSSL_free(good);
        OPENSSL_free(alien);
        EVP_PKEY_free(ca_key);
        EVP_PKEY_free(other_ca_key);
        EVP_PKEY_free(ek);
        EVP_PKEY_free(ek2);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_created_once_key_private, setup, teardown),
                cmocka_unit_test_setup_teardown(test_verdicts, setup, teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
