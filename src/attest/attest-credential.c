/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>
#include <tss2/tss2_mu.h>

#include "attest-credential.h"
#include "attest-quote.h"
#include "attest-util.h"
#include "cleanup.h"
#include "openssl-util.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(EVP_PKEY_CTX *, EVP_PKEY_CTX_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(EVP_CIPHER_CTX *, EVP_CIPHER_CTX_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(BIGNUM *, BN_free);

/* The "use" labels of part 1 §24 and §11.4.10. The TPM hashes them with their terminating NUL, so
 * sizeof() and not strlen() is their length. */
static const char label_identity[] = "IDENTITY";
static const char label_storage[] = "STORAGE";
static const char label_integrity[] = "INTEGRITY";

/* What a key made from the TCG templates L-1 and L-2 carries: fixed to its TPM, a restricted
 * decryption key that only its policy may administer. */
#define EK_ATTRIBUTES                                                                       \
        (TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_SENSITIVEDATAORIGIN | \
         TPMA_OBJECT_ADMINWITHPOLICY | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT)
#define EK_REQUIRED_ATTRIBUTES \
        (TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT)

/* PolicySecret(TPM_RH_ENDORSEMENT) with SHA-256: the authPolicy of the L templates. */
static const TPM2B_DIGEST ek_policy = {
        .size = 32,
        .buffer = {
                0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xb3, 0xf8, 0x1a, 0x90, 0xcc,
                0x8d, 0x46, 0xa5, 0xd7, 0x24, 0xfd, 0x52, 0xd7, 0x6e, 0x06, 0x52,
                0x0b, 0x64, 0xf2, 0xa1, 0xda, 0x1b, 0x33, 0x14, 0x69, 0xaa,
        },
};

#define P256_BYTES 32U

static const EVP_MD *name_md(TPMI_ALG_HASH alg) {
        const char *name = attest_hash_name(alg);

        return name ? EVP_get_digestbyname(name) : NULL;
}

int attest_tpm_name(const TPMT_PUBLIC *pub, TPM2B_NAME *ret) {
        uint8_t buf[sizeof(TPMT_PUBLIC)];
        TPM2B_NAME name = {};
        const EVP_MD *md;
        size_t off = 0;
        unsigned n = 0;

        assert_return(pub, -EINVAL);
        assert_return(ret, -EINVAL);

        md = name_md(pub->nameAlg);
        if (!md)
                return -EOPNOTSUPP;
        if (Tss2_MU_TPMT_PUBLIC_Marshal(pub, buf, sizeof(buf), &off) != TSS2_RC_SUCCESS)
                return -EINVAL;

        name.name[0] = (uint8_t) (pub->nameAlg >> 8);
        name.name[1] = (uint8_t) pub->nameAlg;
        if (EVP_Digest(buf, off, name.name + 2, &n, md, /* impl= */ NULL) != 1)
                return -ENOMEM;
        name.size = (UINT16) (2 + n);
        *ret = name;
        return 0;
}

static int check_symmetric(const TPMT_SYM_DEF_OBJECT *sym, ApiError *reterr) {
        if (sym->algorithm != TPM2_ALG_AES || sym->mode.aes != TPM2_ALG_CFB ||
            !IN_SET(sym->keyBits.aes, 128, 256))
                return attest_error_set(
                        reterr,
                        -EPERM,
                        "unsupported endorsement key: symmetric algorithm 0x%04x/%u/0x%04x, want aes-128 or aes-256 in cfb mode",
                        sym->algorithm,
                        (unsigned) sym->keyBits.aes,
                        sym->mode.aes);
        return 0;
}

/* Everything MakeCredential relies on: a restricted decryption key (the TPM only decrypts the seed
 * of a credential with one), the algorithms the seed and the wrapping use, and a public key
 * OpenSSL takes. */
static int check_ek(const TPMT_PUBLIC *p, ApiError *reterr) {
        _cleanup_(EVP_PKEY_freep) EVP_PKEY *pkey = NULL;
        const TPMT_SYM_DEF_OBJECT *sym;
        int r;

        if (!IN_SET(p->nameAlg, TPM2_ALG_SHA256, TPM2_ALG_SHA384))
                return attest_error_set(
                        reterr,
                        -EPERM,
                        "unsupported endorsement key: name algorithm 0x%04x, want sha256 or sha384",
                        p->nameAlg);
        if ((p->objectAttributes & EK_REQUIRED_ATTRIBUTES) != EK_REQUIRED_ATTRIBUTES ||
            (p->objectAttributes & TPMA_OBJECT_SIGN_ENCRYPT))
                return attest_error_set(
                        reterr,
                        -EPERM,
                        "unsupported endorsement key: attributes 0x%08x are not those of a restricted decryption key fixed to its tpm",
                        (unsigned) p->objectAttributes);

        switch (p->type) {
        case TPM2_ALG_RSA:
                sym = &p->parameters.rsaDetail.symmetric;
                if (p->parameters.rsaDetail.keyBits < 2048 || p->parameters.rsaDetail.keyBits > 4096 ||
                    p->unique.rsa.size * 8U != p->parameters.rsaDetail.keyBits)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "unsupported endorsement key: rsa key of %u bits with a %u-byte modulus",
                                (unsigned) p->parameters.rsaDetail.keyBits,
                                (unsigned) p->unique.rsa.size);
                break;
        case TPM2_ALG_ECC:
                sym = &p->parameters.eccDetail.symmetric;
                if (p->parameters.eccDetail.curveID != TPM2_ECC_NIST_P256)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "unsupported endorsement key: curve 0x%04x, want nist p-256",
                                p->parameters.eccDetail.curveID);
                break;
        default:
                return attest_error_set(
                        reterr, -EPERM, "unsupported endorsement key: type 0x%04x, want rsa or ecc", p->type);
        }

        r = check_symmetric(sym, reterr);
        if (r < 0)
                return r;

        /* The key itself: a modulus OpenSSL takes, a point on the curve. */
        return attest_public_to_pkey(p, "endorsement key", &pkey, reterr);
}

int attest_ek_public_parse(const uint8_t *data, size_t size, TPMT_PUBLIC *ret, ApiError *reterr) {
        TPM2B_PUBLIC wrapped = {};
        TPMT_PUBLIC bare = {};
        size_t off = 0;
        TSS2_RC rc, rc2;
        int r;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        if (size > ATTEST_EK_PUBLIC_MAX)
                return attest_error_set(
                        reterr,
                        -EBADMSG,
                        "malformed endorsement key: %zu bytes, at most %u",
                        size,
                        ATTEST_EK_PUBLIC_MAX);

        /* The agent sends the TPM2B_PUBLIC of TPM2_CreatePrimary, whose size prefix must cover exactly
         * the rest; otherwise the bytes may be the bare public area. Whichever form decodes names the
         * trailing bytes of a refusal. */
        rc = Tss2_MU_TPM2B_PUBLIC_Unmarshal(data, size, &off, &wrapped);
        if (rc == TSS2_RC_SUCCESS)
                bare = wrapped.publicArea;
        if (rc != TSS2_RC_SUCCESS || off != size) {
                size_t off2 = 0;
                TPMT_PUBLIC p = {};

                rc2 = Tss2_MU_TPMT_PUBLIC_Unmarshal(data, size, &off2, &p);
                if (rc2 == TSS2_RC_SUCCESS && (off2 == size || rc != TSS2_RC_SUCCESS)) {
                        bare = p;
                        off = off2;
                        rc = rc2;
                }
        }
        if (rc != TSS2_RC_SUCCESS)
                return attest_error_set(reterr, -EBADMSG, "malformed endorsement key: cannot be decoded");
        if (off != size)
                return attest_error_set(
                        reterr,
                        -EBADMSG,
                        "malformed endorsement key: %zu trailing byte%s",
                        size - off,
                        size - off == 1 ? "" : "s");

        r = check_ek(&bare, reterr);
        if (r < 0)
                return r;
        *ret = bare;
        return 0;
}

/* An unsigned big number into a fixed-size big-endian field, left-padded with zeroes. */
static int bn_field(EVP_PKEY *pkey, const char *param, uint8_t *buf, size_t size) {
        _cleanup_(BN_freep) BIGNUM *bn = NULL;

        if (EVP_PKEY_get_bn_param(pkey, param, &bn) != 1 || BN_num_bytes(bn) > (int) size)
                return -EINVAL;
        return BN_bn2binpad(bn, buf, (int) size) == (int) size ? 0 : -EINVAL;
}

int attest_ek_public_from_pkey(EVP_PKEY *pkey, TPMT_PUBLIC *ret, ApiError *reterr) {
        const TPMT_SYM_DEF_OBJECT aes128 = {
                .algorithm = TPM2_ALG_AES,
                .keyBits.aes = 128,
                .mode.aes = TPM2_ALG_CFB,
        };
        TPMT_PUBLIC p = {
                .nameAlg = TPM2_ALG_SHA256,
                .objectAttributes = EK_ATTRIBUTES,
                .authPolicy = ek_policy,
        };
        char group[64] = "";
        uint8_t e[4];

        assert_return(pkey, -EINVAL);
        assert_return(ret, -EINVAL);

        switch (EVP_PKEY_get_base_id(pkey)) {
        case EVP_PKEY_RSA:
                if (EVP_PKEY_get_bits(pkey) != 2048)
                        return attest_error_set(
                                reterr,
                                -EOPNOTSUPP,
                                "unsupported endorsement key: rsa key of %d bits, the default template has 2048",
                                EVP_PKEY_get_bits(pkey));
                /* Template L-1 leaves the exponent at 0, which means 65537: another one is another
                 * template, whose name this could not reproduce. */
                if (bn_field(pkey, OSSL_PKEY_PARAM_RSA_E, e, sizeof(e)) < 0 ||
                    memcmp(e, (const uint8_t[]){ 0, 1, 0, 1 }, sizeof(e)) != 0)
                        return attest_error_set(
                                reterr,
                                -EOPNOTSUPP,
                                "unsupported endorsement key: rsa exponent other than 65537");
                p.type = TPM2_ALG_RSA;
                p.parameters.rsaDetail.symmetric = aes128;
                p.parameters.rsaDetail.scheme.scheme = TPM2_ALG_NULL;
                p.parameters.rsaDetail.keyBits = 2048;
                p.unique.rsa.size = 256;
                if (bn_field(pkey, OSSL_PKEY_PARAM_RSA_N, p.unique.rsa.buffer, 256) < 0)
                        return -ENOMEM;
                break;
        case EVP_PKEY_EC:
                if (EVP_PKEY_get_utf8_string_param(
                            pkey, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof(group), /* out_len= */ NULL) != 1 ||
                    !streq(group, "prime256v1"))
                        return attest_error_set(
                                reterr,
                                -EOPNOTSUPP,
                                "unsupported endorsement key: ecc curve '%s', the default template has prime256v1",
                                group);
                p.type = TPM2_ALG_ECC;
                p.parameters.eccDetail.symmetric = aes128;
                p.parameters.eccDetail.scheme.scheme = TPM2_ALG_NULL;
                p.parameters.eccDetail.curveID = TPM2_ECC_NIST_P256;
                p.parameters.eccDetail.kdf.scheme = TPM2_ALG_NULL;
                p.unique.ecc.x.size = p.unique.ecc.y.size = P256_BYTES;
                if (bn_field(pkey, OSSL_PKEY_PARAM_EC_PUB_X, p.unique.ecc.x.buffer, P256_BYTES) < 0 ||
                    bn_field(pkey, OSSL_PKEY_PARAM_EC_PUB_Y, p.unique.ecc.y.buffer, P256_BYTES) < 0)
                        return -ENOMEM;
                break;
        default:
                return attest_error_set(
                        reterr, -EOPNOTSUPP, "unsupported endorsement key: neither rsa nor ecc");
        }

        *ret = p;
        return 0;
}

static void be32(uint8_t *p, uint32_t v) {
        p[0] = (uint8_t) (v >> 24);
        p[1] = (uint8_t) (v >> 16);
        p[2] = (uint8_t) (v >> 8);
        p[3] = (uint8_t) v;
}

/* Appends a KDF block to out, as much of it as is still wanted. */
static void take_block(uint8_t *out, size_t *done, size_t want, const uint8_t *block, unsigned block_size) {
        size_t n = MIN((size_t) block_size, want - *done);

        memcpy(out + *done, block, n);
        *done += n;
}

/* KDFa of part 1 §11.4.10.2, the SP 800-108 counter mode with HMAC: block i is
 * HMAC(key, [i]32 || label || 0 || contextU || [bits]32). contextV is empty in every use here.
 * bits is a multiple of 8. */
static int
        kdfa(const EVP_MD *md,
             const uint8_t *key,
             size_t key_size,
             const char *label,
             size_t label_size,
             const uint8_t *context,
             size_t context_size,
             size_t bits,
             uint8_t *ret) {
        uint8_t in[4 + 16 + sizeof(TPMU_NAME) + 4], block[EVP_MAX_MD_SIZE];
        size_t want = bits / 8, n;

        assert(bits % 8 == 0);
        if (label_size > 16 || context_size > sizeof(TPMU_NAME))
                return -EINVAL;

        for (size_t i = 1, done = 0; done < want; i++) {
                unsigned block_size = 0;

                be32(in, (uint32_t) i);
                memcpy(in + 4, label, label_size);
                n = 4 + label_size;
                if (context_size > 0)
                        memcpy(in + n, context, context_size);
                n += context_size;
                be32(in + n, (uint32_t) bits);
                n += 4;
                if (!HMAC(md, key, (int) key_size, in, n, block, &block_size) || block_size == 0)
                        return -ENOMEM;
                take_block(ret, &done, want, block, block_size);
        }
        OPENSSL_cleanse(block, sizeof(block));
        return 0;
}

/* KDFe of part 1 §11.4.10.3 (SP 800-56A's concatenation KDF): block i is
 * H([i]32 || Z || label || partyUInfo || partyVInfo). */
static int
        kdfe(const EVP_MD *md,
             const uint8_t *z,
             size_t z_size,
             const uint8_t *party_u,
             size_t party_u_size,
             const uint8_t *party_v,
             size_t party_v_size,
             size_t size,
             uint8_t *ret) {
        _cleanup_(EVP_MD_CTX_freep) EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        uint8_t block[EVP_MAX_MD_SIZE], counter[4];

        if (!ctx)
                return -ENOMEM;
        for (size_t i = 1, done = 0; done < size; i++) {
                unsigned block_size = 0;

                be32(counter, (uint32_t) i);
                if (EVP_DigestInit_ex(ctx, md, /* impl= */ NULL) != 1 ||
                    EVP_DigestUpdate(ctx, counter, sizeof(counter)) != 1 ||
                    EVP_DigestUpdate(ctx, z, z_size) != 1 ||
                    EVP_DigestUpdate(ctx, label_identity, sizeof(label_identity)) != 1 ||
                    EVP_DigestUpdate(ctx, party_u, party_u_size) != 1 ||
                    EVP_DigestUpdate(ctx, party_v, party_v_size) != 1 ||
                    EVP_DigestFinal_ex(ctx, block, &block_size) != 1)
                        return -ENOMEM;
                take_block(ret, &done, size, block, block_size);
        }
        OPENSSL_cleanse(block, sizeof(block));
        return 0;
}

/* A random seed, encrypted to the RSA EK with OAEP over the name algorithm and the label
 * "IDENTITY" (part 1 §24.4 and annex B.10.3). */
static int seed_rsa(
        const TPMT_PUBLIC *ek, const EVP_MD *md, uint8_t *seed, size_t seed_size, TPM2B_ENCRYPTED_SECRET *ret) {
        _cleanup_(EVP_PKEY_freep) EVP_PKEY *pkey = NULL;
        _cleanup_(EVP_PKEY_CTX_freep) EVP_PKEY_CTX *ctx = NULL;
        size_t out_size = sizeof(ret->secret);
        void *label;
        int r;

        r = attest_public_to_pkey(ek, "endorsement key", &pkey, /* reterr= */ NULL);
        if (r < 0)
                return r;
        if (RAND_bytes(seed, (int) seed_size) != 1)
                return -EIO;

        ctx = EVP_PKEY_CTX_new_from_pkey(/* libctx= */ NULL, pkey, /* propquery= */ NULL);
        if (!ctx || EVP_PKEY_encrypt_init(ctx) != 1 ||
            EVP_PKEY_CTX_set_rsa_padding(ctx, RSA_PKCS1_OAEP_PADDING) != 1 ||
            EVP_PKEY_CTX_set_rsa_oaep_md(ctx, md) != 1 || EVP_PKEY_CTX_set_rsa_mgf1_md(ctx, md) != 1)
                return -ENOMEM;

        /* The context takes the label over only when the call succeeds. */
        label = OPENSSL_memdup(label_identity, sizeof(label_identity));
        if (!label)
                return -ENOMEM;
        if (EVP_PKEY_CTX_set0_rsa_oaep_label(ctx, label, (int) sizeof(label_identity)) != 1) {
                OPENSSL_free(label);
                return -ENOMEM;
        }

        if (EVP_PKEY_encrypt(ctx, ret->secret, &out_size, seed, seed_size) != 1) {
                ERR_clear_error();
                return -EINVAL;
        }
        ret->size = (UINT16) out_size;
        return 0;
}

/* A seed agreed with the ECC EK through an ephemeral P-256 key (part 1 annex C.6.4): Z is the x
 * coordinate of ECDH(ephemeral, EK), seed = KDFe(Z, "IDENTITY", ephemeral.x, EK.x), and what the TPM
 * gets is the ephemeral public point, a marshalled TPMS_ECC_POINT. */
static int seed_ecc(
        const TPMT_PUBLIC *ek, const EVP_MD *md, uint8_t *seed, size_t seed_size, TPM2B_ENCRYPTED_SECRET *ret) {
        _cleanup_(EVP_PKEY_freep) EVP_PKEY *pkey = NULL, *ephemeral = NULL;
        _cleanup_(EVP_PKEY_CTX_freep) EVP_PKEY_CTX *ctx = NULL;
        uint8_t z[P256_BYTES], encoded[1 + 2 * P256_BYTES];
        size_t z_size = sizeof(z), encoded_size = 0, off = 0;
        TPMS_ECC_POINT point = {};
        int r;

        r = attest_public_to_pkey(ek, "endorsement key", &pkey, /* reterr= */ NULL);
        if (r < 0)
                return r;

        ephemeral = EVP_PKEY_Q_keygen(/* libctx= */ NULL, /* propq= */ NULL, "EC", "P-256");
        if (!ephemeral)
                return -ENOMEM;
        ctx = EVP_PKEY_CTX_new_from_pkey(/* libctx= */ NULL, ephemeral, /* propquery= */ NULL);
        if (!ctx || EVP_PKEY_derive_init(ctx) != 1 || EVP_PKEY_derive_set_peer(ctx, pkey) != 1 ||
            EVP_PKEY_derive(ctx, z, &z_size) != 1 || z_size != sizeof(z)) {
                ERR_clear_error();
                return -EINVAL;
        }

        /* The uncompressed encoding: 0x04 || x || y, each coordinate left-padded. */
        if (EVP_PKEY_get_octet_string_param(
                    ephemeral, OSSL_PKEY_PARAM_PUB_KEY, encoded, sizeof(encoded), &encoded_size) != 1 ||
            encoded_size != sizeof(encoded) || encoded[0] != 0x04)
                return -EINVAL;
        point.x.size = point.y.size = P256_BYTES;
        memcpy(point.x.buffer, encoded + 1, P256_BYTES);
        memcpy(point.y.buffer, encoded + 1 + P256_BYTES, P256_BYTES);

        r = kdfe(
                md,
                z,
                z_size,
                point.x.buffer,
                point.x.size,
                ek->unique.ecc.x.buffer,
                ek->unique.ecc.x.size,
                seed_size,
                seed);
        OPENSSL_cleanse(z, sizeof(z));
        if (r < 0)
                return r;

        if (Tss2_MU_TPMS_ECC_POINT_Marshal(&point, ret->secret, sizeof(ret->secret), &off) != TSS2_RC_SUCCESS)
                return -EINVAL;
        ret->size = (UINT16) off;
        return 0;
}

/* encIdentity: the credential as a marshalled TPM2B_DIGEST, encrypted with AES-CFB under symKey =
 * KDFa(seed, "STORAGE", name) and a zero IV (part 1 §24.4). Returns its size. */
static int wrap_identity(
        const EVP_MD *md,
        const TPMT_SYM_DEF_OBJECT *sym,
        const uint8_t *seed,
        size_t seed_size,
        const TPM2B_NAME *name,
        const uint8_t *credential,
        size_t credential_size,
        uint8_t *ret) {
        _cleanup_(EVP_CIPHER_CTX_freep) EVP_CIPHER_CTX *ctx = NULL;
        uint8_t key[32], plain[sizeof(TPM2B_DIGEST)], iv[16] = {};
        TPM2B_DIGEST digest = { .size = (UINT16) credential_size };
        size_t plain_size = 0;
        int n = 0, tail = 0, r;

        memcpy(digest.buffer, credential, credential_size);
        if (Tss2_MU_TPM2B_DIGEST_Marshal(&digest, plain, sizeof(plain), &plain_size) != TSS2_RC_SUCCESS)
                return -EINVAL;

        r = kdfa(
                md,
                seed,
                seed_size,
                label_storage,
                sizeof(label_storage),
                name->name,
                name->size,
                sym->keyBits.aes,
                key);
        if (r < 0)
                return r;

        ctx = EVP_CIPHER_CTX_new();
        r = ctx &&
                EVP_EncryptInit_ex(
                        ctx,
                        sym->keyBits.aes == 256 ? EVP_aes_256_cfb128() : EVP_aes_128_cfb128(),
                        /* impl= */ NULL,
                        key,
                        iv) == 1 &&
                EVP_EncryptUpdate(ctx, ret, &n, plain, (int) plain_size) == 1 &&
                EVP_EncryptFinal_ex(ctx, ret + n, &tail) == 1;
        OPENSSL_cleanse(key, sizeof(key));
        OPENSSL_cleanse(plain, sizeof(plain));
        if (!r)
                return -ENOMEM;
        return n + tail;
}

int attest_make_credential(
        const TPMT_PUBLIC *ek,
        const TPM2B_NAME *name,
        const uint8_t *credential,
        size_t credential_size,
        AttestCredential *ret,
        ApiError *reterr) {
        uint8_t seed[EVP_MAX_MD_SIZE], hmac_key[EVP_MAX_MD_SIZE],
                mac_input[sizeof(TPM2B_DIGEST) + sizeof(TPMU_NAME)];
        TPM2B_ENCRYPTED_SECRET secret = {};
        TPM2B_ID_OBJECT id = {};
        AttestCredential out = {};
        const TPMT_SYM_DEF_OBJECT *sym;
        unsigned mac_size = 0;
        size_t digest_size, off;
        const EVP_MD *md;
        uint8_t *integrity, *identity;
        int r, identity_size;

        assert_return(ek, -EINVAL);
        assert_return(name, -EINVAL);
        assert_return(credential || credential_size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        r = check_ek(ek, reterr);
        if (r < 0)
                return r;
        md = name_md(ek->nameAlg);
        if (!md)
                return -ENOMEM;
        digest_size = (size_t) EVP_MD_get_size(md);

        if (credential_size == 0 || credential_size > digest_size)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "credential of %zu bytes: the endorsement key takes 1 to %zu",
                        credential_size,
                        digest_size);
        if (name->size < 2 || name->size > sizeof(name->name))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INTERNAL, "object name of %u bytes", (unsigned) name->size);

        if (ek->type == TPM2_ALG_RSA) {
                sym = &ek->parameters.rsaDetail.symmetric;
                r = seed_rsa(ek, md, seed, digest_size, &secret);
        } else {
                sym = &ek->parameters.eccDetail.symmetric;
                r = seed_ecc(ek, md, seed, digest_size, &secret);
        }
        if (r < 0) {
                r = api_error_set(reterr, r, API_ERROR_INTERNAL, "make credential: cannot protect the seed");
                goto finish;
        }

        /* TPM2B_ID_OBJECT's contents: integrityHMAC as a TPM2B_DIGEST, then encIdentity. */
        integrity = id.credential + 2;
        identity = integrity + digest_size;
        identity_size = wrap_identity(md, sym, seed, digest_size, name, credential, credential_size, identity);
        if (identity_size < 0) {
                r = identity_size;
                goto finish;
        }

        /* integrityHMAC = HMAC(KDFa(seed, "INTEGRITY"), encIdentity || name), so that the TPM refuses
         * a credential meant for another object before it decrypts anything. */
        r = kdfa(md, seed, digest_size, label_integrity, sizeof(label_integrity), NULL, 0, digest_size * 8, hmac_key);
        if (r < 0)
                goto finish;
        memcpy(mac_input, identity, (size_t) identity_size);
        memcpy(mac_input + identity_size, name->name, name->size);
        if (!HMAC(md, hmac_key, (int) digest_size, mac_input, (size_t) identity_size + name->size, integrity, &mac_size) ||
            mac_size != digest_size) {
                r = -ENOMEM;
                goto finish;
        }
        id.credential[0] = (uint8_t) (digest_size >> 8);
        id.credential[1] = (uint8_t) digest_size;
        id.size = (UINT16) (2 + digest_size + (size_t) identity_size);

        off = 0;
        if (Tss2_MU_TPM2B_ID_OBJECT_Marshal(&id, out.blob, sizeof(out.blob), &off) != TSS2_RC_SUCCESS) {
                r = -EINVAL;
                goto finish;
        }
        out.blob_size = off;
        off = 0;
        if (Tss2_MU_TPM2B_ENCRYPTED_SECRET_Marshal(&secret, out.secret, sizeof(out.secret), &off) !=
            TSS2_RC_SUCCESS) {
                r = -EINVAL;
                goto finish;
        }
        out.secret_size = off;
        *ret = out;
        r = 0;

finish:
        OPENSSL_cleanse(seed, sizeof(seed));
        OPENSSL_cleanse(hmac_key, sizeof(hmac_key));
        OPENSSL_cleanse(&id, sizeof(id));
        return r;
}
