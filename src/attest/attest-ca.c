/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The host CA of vTPM EK certificates (attest-ca.h). The key is made here with OpenSSL rather than by
 * swtpm_localca on its first run, so that its creation, mode and place are ours and happen once, at
 * start-up, instead of inside whichever VM's swtpm_setup happens to be first (two at once would
 * race). swtpm_localca only reads it, through the configuration files written beside it. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <tss2/tss2_mu.h>

#include "attest-ca.h"
#include "fs-util.h"
#include "openssl-util.h"
#include "string-table.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(X509 *, X509_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(X509_STORE_CTX *, X509_STORE_CTX_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(BIGNUM *, BN_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(BIO *, BIO_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(X509_EXTENSION *, X509_EXTENSION_free);

/* The CA outlives every VM it certified: a century, like swtpm_localca's own root. */
#define CA_DAYS (100L * 365L)
#define CA_PEM_MAX (64U * 1024U)

struct AttestCa {
        char *dir;
        char *setup_config;
        X509 *cert;
};

static const char *const attest_ek_verdict_table[_ATTEST_EK_VERDICT_MAX] = {
        [ATTEST_EK_ABSENT] = "absent",
        [ATTEST_EK_CERTIFIED] = "certified",
        [ATTEST_EK_FOREIGN] = "foreign",
};
DEFINE_STRING_TABLE_LOOKUP(attest_ek_verdict, AttestEkVerdict);

AttestCa *attest_ca_free(AttestCa *ca) {
        if (!ca)
                return NULL;
        free(ca->dir);
        free(ca->setup_config);
        X509_free(ca->cert);
        free(ca);
        return NULL;
}

static char *path_in(const char *dir, const char *name) {
        char *p;

        if (asprintf(&p, "%s/%s", dir, name) < 0)
                return NULL;
        return p;
}

static int bio_to_file(BIO *b, const char *path, mode_t mode) {
        char *data;
        long n = BIO_get_mem_data(b, &data);

        if (n <= 0)
                return -EIO;
        return write_file_atomic(path, data, (size_t) n, mode);
}

static int add_ext(X509 *cert, int nid, const char *value) {
        _cleanup_(X509_EXTENSION_freep) X509_EXTENSION *ext = NULL;
        X509V3_CTX ctx;

        X509V3_set_ctx_nodb(&ctx);
        X509V3_set_ctx(&ctx, cert, cert, NULL, NULL, 0);
        ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
        if (!ext || !X509_add_ext(cert, ext, -1))
                return -EIO;
        return 0;
}

/* A new key and its self-signed certificate, the key written first (0600) so that a crash between
 * the two leaves a key without a certificate, which the next start replaces. */
static int ca_create(const char *key_path, const char *cert_path, const char *common_name) {
        _cleanup_(EVP_PKEY_freep) EVP_PKEY *key = EVP_EC_gen("P-256");
        _cleanup_(X509_freep) X509 *cert = X509_new();
        _cleanup_(BIO_freep) BIO *kb = BIO_new(BIO_s_mem()), *cb = BIO_new(BIO_s_mem());
        _cleanup_(BN_freep) BIGNUM *serial = BN_new();
        X509_NAME *name;
        int r;

        if (!key || !cert || !kb || !cb || !serial)
                return -ENOMEM;
        /* a random serial, so that two hosts' CAs of one name are still told apart */
        if (!BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
            !BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert)) ||
            !X509_set_version(cert, X509_VERSION_3) || !X509_gmtime_adj(X509_getm_notBefore(cert), 0) ||
            !X509_time_adj_ex(X509_getm_notAfter(cert), CA_DAYS, 0, NULL) || !X509_set_pubkey(cert, key))
                return -EIO;
        name = X509_get_subject_name(cert);
        if (!X509_NAME_add_entry_by_txt(
                    name, "O", MBSTRING_UTF8, (const unsigned char *) "vm-manager", -1, -1, 0) ||
            !X509_NAME_add_entry_by_txt(
                    name, "CN", MBSTRING_UTF8, (const unsigned char *) common_name, -1, -1, 0) ||
            !X509_set_issuer_name(cert, name))
                return -EIO;
        r = add_ext(cert, NID_basic_constraints, "critical,CA:TRUE");
        if (r >= 0)
                r = add_ext(cert, NID_key_usage, "critical,keyCertSign,cRLSign");
        if (r >= 0)
                r = add_ext(cert, NID_subject_key_identifier, "hash");
        if (r < 0)
                return r;
        if (!X509_sign(cert, key, EVP_sha256()))
                return -EIO;
        if (!PEM_write_bio_PrivateKey(kb, key, NULL, NULL, 0, NULL, NULL) || !PEM_write_bio_X509(cb, cert))
                return -EIO;
        r = bio_to_file(kb, key_path, 0600);
        if (r < 0)
                return r;
        return bio_to_file(cb, cert_path, 0644);
}

static int load_cert(const char *path, X509 **ret) {
        _cleanup_free_ char *text = NULL;
        _cleanup_(BIO_freep) BIO *b = NULL;
        size_t size;
        int r;

        r = read_full_file(path, CA_PEM_MAX, &text, &size);
        if (r < 0)
                return r;
        b = BIO_new_mem_buf(text, (int) size);
        if (!b)
                return -ENOMEM;
        *ret = PEM_read_bio_X509(b, NULL, NULL, NULL);
        return *ret ? 0 : -EBADMSG;
}

/* swtpm_setup's and swtpm_localca's configuration, rewritten on each start so that a moved state
 * directory or a newer layout takes effect; certserial is swtpm_localca's, left as it is. */
static int write_configs(AttestCa *ca, const char *key_path, const char *cert_path) {
        _cleanup_free_ char *localca = path_in(ca->dir, "localca.conf"),
                            *options = path_in(ca->dir, "localca.options"),
                            *serial = path_in(ca->dir, "certserial"), *text = NULL;
        int r;

        if (!localca || !options || !serial)
                return -ENOMEM;
        if (asprintf(
                    &text,
                    "statedir = %s\nsigningkey = %s\nissuercert = %s\ncertserial = %s\n",
                    ca->dir,
                    key_path,
                    cert_path,
                    serial) < 0)
                return -ENOMEM;
        r = write_file_atomic(localca, text, strlen(text), 0644);
        if (r < 0)
                return r;
        static const char opts[] =
                "--platform-manufacturer vm-manager\n--platform-version 1\n"
                "--platform-model vm-manager\n";
        r = write_file_atomic(options, opts, strlen(opts), 0644);
        if (r < 0)
                return r;
        free(text);
        text = NULL;
        /* sha256 alone: the bank the attestation quotes; the host's /etc/swtpm_setup.conf (and its
         * CA under /var/lib/swtpm-localca) is never read, since --config names this file */
        if (asprintf(
                    &text,
                    "create_certs_tool = /usr/bin/swtpm_localca\ncreate_certs_tool_config = %s\n"
                    "create_certs_tool_options = %s\nactive_pcr_banks = sha256\n",
                    localca,
                    options) < 0)
                return -ENOMEM;
        return write_file_atomic(ca->setup_config, text, strlen(text), 0644);
}

int attest_ca_open(const char *dir, const char *common_name, AttestCa **ret) {
        _cleanup_(attest_ca_freep) AttestCa *ca = NULL;
        _cleanup_free_ char *key_path = NULL, *cert_path = NULL;
        int r;

        assert(dir && common_name && ret);
        ca = calloc(1, sizeof(AttestCa));
        if (!ca)
                return -ENOMEM;
        ca->dir = strdup(dir);
        key_path = path_in(dir, "ca-key.pem");
        cert_path = path_in(dir, "ca-cert.pem");
        ca->setup_config = path_in(dir, "swtpm_setup.conf");
        if (!ca->dir || !key_path || !cert_path || !ca->setup_config)
                return -ENOMEM;
        r = mkdir_p(dir, 0700);
        if (r < 0)
                return r;
        if (access(key_path, F_OK) < 0 || access(cert_path, F_OK) < 0) {
                r = ca_create(key_path, cert_path, common_name);
                if (r < 0)
                        return r;
        }
        r = load_cert(cert_path, &ca->cert);
        if (r < 0)
                return r;
        r = write_configs(ca, key_path, cert_path);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(ca);
        return 0;
}

const char *attest_ca_setup_config(const AttestCa *ca) {
        return ca->setup_config;
}

static AttestEkVerdict foreign(char **ret_why, const char *why) {
        if (ret_why)
                *ret_why = strdup(why);
        return ATTEST_EK_FOREIGN;
}

/* The RSA modulus of the presented EK against the certified key's. */
static bool same_rsa_key(EVP_PKEY *certified, const void *ek_pub, size_t ek_pub_size) {
        _cleanup_(BN_freep) BIGNUM *n = NULL;
        TPM2B_PUBLIC pub = {};
        size_t offset = 0;
        uint8_t buf[TPM2_MAX_RSA_KEY_BYTES];
        const TPM2B_PUBLIC_KEY_RSA *u;

        if (Tss2_MU_TPM2B_PUBLIC_Unmarshal(ek_pub, ek_pub_size, &offset, &pub) != TSS2_RC_SUCCESS ||
            offset != ek_pub_size || pub.publicArea.type != TPM2_ALG_RSA)
                return false;
        u = &pub.publicArea.unique.rsa;
        if (EVP_PKEY_get_base_id(certified) != EVP_PKEY_RSA ||
            !EVP_PKEY_get_bn_param(certified, OSSL_PKEY_PARAM_RSA_N, &n) || u->size > sizeof(buf) ||
            (size_t) BN_num_bytes(n) != u->size || BN_bn2binpad(n, buf, u->size) != u->size)
                return false;
        return memcmp(buf, u->buffer, u->size) == 0;
}

AttestEkVerdict attest_ca_check_ek(
        const AttestCa *ca,
        const void *cert_der,
        size_t cert_size,
        const void *ek_pub,
        size_t ek_pub_size,
        char **ret_why) {
        _cleanup_(X509_freep) X509 *cert = NULL;
        _cleanup_(X509_STORE_freep) X509_STORE *store = NULL;
        _cleanup_(X509_STORE_CTX_freep) X509_STORE_CTX *ctx = NULL;
        const unsigned char *p = cert_der;
        EVP_PKEY *key;

        assert(ca);
        if (ret_why)
                *ret_why = NULL;
        if (!cert_der || cert_size == 0)
                return ATTEST_EK_ABSENT;
        cert = d2i_X509(NULL, &p, (long) cert_size);
        if (!cert || p != (const unsigned char *) cert_der + cert_size)
                return foreign(ret_why, "the EK certificate does not parse");
        store = X509_STORE_new();
        ctx = X509_STORE_CTX_new();
        if (!store || !ctx || !X509_STORE_add_cert(store, ca->cert) ||
            !X509_STORE_CTX_init(ctx, store, cert, NULL))
                return foreign(ret_why, "the EK certificate could not be checked");
        if (X509_verify_cert(ctx) != 1) {
                _cleanup_free_ char *why = NULL;
                if (asprintf(
                            &why,
                            "the EK certificate is not signed by this host's CA: %s",
                            X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx))) < 0)
                        why = NULL;
                return foreign(ret_why, why ?: "the EK certificate is not signed by this host's CA");
        }
        key = X509_get0_pubkey(cert);
        if (ek_pub && (!key || !same_rsa_key(key, ek_pub, ek_pub_size)))
                return foreign(ret_why, "the guest's EK is not the one certified for this VM");
        return ATTEST_EK_CERTIFIED;
}
