/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>
#include <tss2/tss2_mu.h>

#include "attest-quote.h"
#include "cleanup.h"
#include "openssl-util.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(EVP_PKEY_CTX *, EVP_PKEY_CTX_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(OSSL_PARAM_BLD *, OSSL_PARAM_BLD_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(OSSL_PARAM *, OSSL_PARAM_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(ECDSA_SIG *, ECDSA_SIG_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(BIGNUM *, BN_free);

static const struct {
        TPMI_ALG_HASH alg;
        const char *name;
        size_t size;
} hashes[] = {
        { TPM2_ALG_SHA1, "sha1", 20 },
        { TPM2_ALG_SHA256, "sha256", 32 },
        { TPM2_ALG_SHA384, "sha384", 48 },
        { TPM2_ALG_SHA512, "sha512", 64 },
};

size_t attest_hash_size(TPMI_ALG_HASH alg) {
        for (size_t i = 0; i < ELEMENTSOF(hashes); i++)
                if (hashes[i].alg == alg)
                        return hashes[i].size;
        return 0;
}

const char *attest_hash_name(TPMI_ALG_HASH alg) {
        for (size_t i = 0; i < ELEMENTSOF(hashes); i++)
                if (hashes[i].alg == alg)
                        return hashes[i].name;
        return NULL;
}

static const EVP_MD *hash_md(TPMI_ALG_HASH alg) {
        const char *name = attest_hash_name(alg);
        return name ? EVP_get_digestbyname(name) : NULL;
}

/* What a tss2 unmarshal failure means, for "malformed quote: <part>: …". */
static const char *mu_error(TSS2_RC rc) {
        switch (rc & 0xffffU) { /* the base code, whichever layer reported it */
        case TSS2_BASE_RC_INSUFFICIENT_BUFFER:
                return "unexpected end of data";
        case TSS2_BASE_RC_BAD_VALUE:
                return "invalid value";
        case TSS2_BASE_RC_BAD_SIZE:
        case TSS2_BASE_RC_MALFORMED_RESPONSE:
                return "invalid size";
        default:
                return "cannot be decoded";
        }
}

static int malformed(ApiError *reterr, const char *part, TSS2_RC rc, size_t trailing) {
        if (rc != TSS2_RC_SUCCESS)
                return attest_error_set(reterr, -EBADMSG, "malformed quote: %s: %s", part, mu_error(rc));
        return attest_error_set(
                reterr,
                -EBADMSG,
                "malformed quote: %s: %zu trailing byte%s",
                part,
                trailing,
                trailing == 1 ? "" : "s");
}

static int decode_selection(const TPML_PCR_SELECTION *sel, AttestQuote *q, ApiError *reterr) {
        bool found = false;

        for (uint32_t i = 0; i < sel->count && i < TPM2_NUM_PCR_BANKS; i++) {
                const TPMS_PCR_SELECTION *s = sel->pcrSelections + i;
                uint32_t mask = 0;

                for (unsigned b = 0; b < s->sizeofSelect && b < TPM2_PCR_SELECT_MAX; b++)
                        mask |= (uint32_t) s->pcrSelect[b] << (8 * b);
                if (mask == 0)
                        continue;
                if (found)
                        return attest_error_set(
                                reterr, -EBADMSG, "malformed quote: quote selects more than one pcr bank");
                if (!attest_hash_name(s->hash))
                        return attest_error_set(
                                reterr, -EPERM, "unsupported pcr bank: pcr bank 0x%04x", s->hash);
                q->bank_alg = s->hash;
                q->bank = attest_hash_name(s->hash);
                q->pcr_mask = mask;
                found = true;
        }
        if (!found)
                return attest_error_set(reterr, -EBADMSG, "malformed quote: quote selects no pcr");
        return 0;
}

/* TPMT_PUBLIC first; a TPM2B_PUBLIC whose size covers exactly its contents second. A failure
 * reports why the TPMT_PUBLIC did not decode. */
static int decode_public(const uint8_t *data, size_t size, TPMT_PUBLIC *ret, ApiError *reterr) {
        TPM2B_PUBLIC wrapped;
        size_t off = 0, off2 = 0;
        TSS2_RC rc, rc2;

        memset(ret, 0, sizeof(*ret));
        rc = Tss2_MU_TPMT_PUBLIC_Unmarshal(data, size, &off, ret);
        if (rc == TSS2_RC_SUCCESS && off == size)
                return 0;

        /* tss2 refuses to unmarshal into a TPM2B whose size is not zero */
        memset(&wrapped, 0, sizeof(wrapped));
        rc2 = Tss2_MU_TPM2B_PUBLIC_Unmarshal(data, size, &off2, &wrapped);
        if (rc2 == TSS2_RC_SUCCESS && off2 == size && size >= 2 &&
            (size_t) (data[0] << 8 | data[1]) == size - 2) {
                *ret = wrapped.publicArea;
                return 0;
        }
        return malformed(reterr, "ak_pub", rc, size - off);
}

/* The AK must only ever sign TPM-internal data: fixed to this TPM and its parent, TPM-generated,
 * restricted, signing and not decrypting; ECC P-256 with ECDSA or RSA 2048 with RSASSA or RSAPSS.
 * Missing attributes are listed as Go prints a sorted []string: "[fixedTPM sign]". */
static int check_ak(const TPMT_PUBLIC *pub, ApiError *reterr) {
        /* in the order of Go's sort.Strings */
        static const struct {
                const char *name;
                TPMA_OBJECT bit;
        } required[] = {
                { "fixedParent", TPMA_OBJECT_FIXEDPARENT },
                { "fixedTPM", TPMA_OBJECT_FIXEDTPM },
                { "restricted", TPMA_OBJECT_RESTRICTED },
                { "sensitiveDataOrigin", TPMA_OBJECT_SENSITIVEDATAORIGIN },
                { "sign", TPMA_OBJECT_SIGN_ENCRYPT },
        };
        char missing[128] = "";
        TPMA_OBJECT a = pub->objectAttributes;

        for (size_t i = 0; i < ELEMENTSOF(required); i++)
                if (!(a & required[i].bit)) {
                        if (missing[0])
                                strcat(missing, " ");
                        strcat(missing, required[i].name);
                }
        if (missing[0])
                return attest_error_set(reterr, -EPERM, "attestation key attributes: [%s] not set", missing);
        if (a & TPMA_OBJECT_DECRYPT)
                return attest_error_set(reterr, -EPERM, "attestation key attributes: decrypt is set");

        switch (pub->type) {
        case TPM2_ALG_ECC: {
                const TPMS_ECC_PARMS *p = &pub->parameters.eccDetail;

                if (p->curveID != TPM2_ECC_NIST_P256)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "unsupported attestation key: ecc curve 0x%04x, want P-256",
                                p->curveID);
                if (p->scheme.scheme != TPM2_ALG_ECDSA)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "unsupported attestation key: ecc scheme 0x%04x, want ECDSA",
                                p->scheme.scheme);
                return 0;
        }
        case TPM2_ALG_RSA: {
                const TPMS_RSA_PARMS *p = &pub->parameters.rsaDetail;

                if (p->keyBits != 2048)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "unsupported attestation key: rsa %u bits, want 2048",
                                p->keyBits);
                if (p->scheme.scheme != TPM2_ALG_RSASSA && p->scheme.scheme != TPM2_ALG_RSAPSS)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "unsupported attestation key: rsa scheme 0x%04x, want RSASSA or RSAPSS",
                                p->scheme.scheme);
                return 0;
        }
        default:
                return attest_error_set(reterr, -EPERM, "unsupported attestation key: type 0x%04x", pub->type);
        }
}

int attest_ak_public_parse(const uint8_t *data, size_t size, TPMT_PUBLIC *ret, ApiError *reterr) {
        TPMT_PUBLIC pub;
        int r;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        r = decode_public(data, size, &pub, reterr);
        if (r < 0)
                return r;
        r = check_ak(&pub, reterr);
        if (r < 0)
                return r;
        *ret = pub;
        return 0;
}

/* The hash the signature names, which must suit the key. */
static int signature_hash(
        const TPMT_PUBLIC *pub, const TPMT_SIGNATURE *sig, TPMI_ALG_HASH *ret, ApiError *reterr) {
        TPMI_ALG_HASH alg;

        switch (sig->sigAlg) {
        case TPM2_ALG_ECDSA:
                if (pub->type != TPM2_ALG_ECC)
                        return attest_error_set(
                                reterr, -EPERM, "signature does not verify: ecdsa signature from a non-ecc key");
                alg = sig->signature.ecdsa.hash;
                break;
        case TPM2_ALG_RSASSA:
        case TPM2_ALG_RSAPSS:
                if (pub->type != TPM2_ALG_RSA)
                        return attest_error_set(
                                reterr, -EPERM, "signature does not verify: rsa signature from a non-rsa key");
                alg = sig->sigAlg == TPM2_ALG_RSASSA ? sig->signature.rsassa.hash : sig->signature.rsapss.hash;
                break;
        default:
                return attest_error_set(
                        reterr, -EPERM, "signature does not verify: scheme 0x%04x", sig->sigAlg);
        }
        if (!hash_md(alg))
                return attest_error_set(
                        reterr, -EPERM, "signature does not verify: signature hash 0x%04x", alg);
        *ret = alg;
        return 0;
}

int attest_ak_fingerprint(const TPMT_PUBLIC *pub, char ret[static ATTEST_SHA256_HEX + 1]) {
        _cleanup_free_ uint8_t *buf = NULL;
        uint8_t digest[ATTEST_SHA256_SIZE];
        size_t off = 0;

        assert_return(pub, -EINVAL);

        buf = malloc(sizeof(TPMT_PUBLIC));
        if (!buf)
                return -ENOMEM;
        if (Tss2_MU_TPMT_PUBLIC_Marshal(pub, buf, sizeof(TPMT_PUBLIC), &off) != TSS2_RC_SUCCESS)
                return -EINVAL;
        if (!EVP_Digest(buf, off, digest, NULL, EVP_sha256(), NULL))
                return -ENOMEM;
        hex_format(digest, sizeof(digest), ret);
        return 0;
}

int attest_quote_parse(
        const uint8_t *quote,
        size_t quote_size,
        const uint8_t *signature,
        size_t signature_size,
        const uint8_t *ak_pub,
        size_t ak_pub_size,
        AttestQuote *ret,
        ApiError *reterr) {

        _cleanup_free_ TPMS_ATTEST *att = NULL;
        _cleanup_free_ AttestQuote *q = NULL;
        uint32_t magic;
        size_t off = 0;
        TSS2_RC rc;
        int r;

        assert_return(quote || quote_size == 0, -EINVAL);
        assert_return(signature || signature_size == 0, -EINVAL);
        assert_return(ak_pub || ak_pub_size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        if (quote_size < 4)
                return attest_error_set(reterr, -EBADMSG, "malformed quote: attest is %zu bytes", quote_size);
        magic = (uint32_t) quote[0] << 24 | (uint32_t) quote[1] << 16 | (uint32_t) quote[2] << 8 | quote[3];
        if (magic != TPM2_GENERATED_VALUE)
                return attest_error_set(
                        reterr, -EPERM, "quote magic is not TPM_GENERATED_VALUE: got 0x%08x", magic);

        att = calloc(1, sizeof(*att));
        q = calloc(1, sizeof(*q));
        if (!att || !q)
                return -ENOMEM;

        rc = Tss2_MU_TPMS_ATTEST_Unmarshal(quote, quote_size, &off, att);
        if (rc != TSS2_RC_SUCCESS || off != quote_size)
                return malformed(reterr, "attest", rc, quote_size - off);
        if (att->type != TPM2_ST_ATTEST_QUOTE)
                return attest_error_set(reterr, -EPERM, "attestation is not a quote: type 0x%04x", att->type);

        r = decode_selection(&att->attested.quote.pcrSelect, q, reterr);
        if (r < 0)
                return r;

        off = 0;
        rc = Tss2_MU_TPMT_SIGNATURE_Unmarshal(signature, signature_size, &off, &q->signature);
        if (rc != TSS2_RC_SUCCESS || off != signature_size)
                return malformed(reterr, "signature", rc, signature_size - off);

        r = decode_public(ak_pub, ak_pub_size, &q->public, reterr);
        if (r < 0)
                return r;
        r = check_ak(&q->public, reterr);
        if (r < 0)
                return r;
        r = signature_hash(&q->public, &q->signature, &q->hash_alg, reterr);
        if (r < 0)
                return r;
        r = attest_ak_fingerprint(&q->public, q->ak_fingerprint);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return attest_error_set(reterr, -EBADMSG, "malformed quote: ak_pub: cannot be encoded");

        q->attest = quote;
        q->attest_size = quote_size;
        q->extra_data_size = MIN((size_t) att->extraData.size, sizeof(q->extra_data));
        memcpy(q->extra_data, att->extraData.buffer, q->extra_data_size);
        q->pcr_digest_size = MIN((size_t) att->attested.quote.pcrDigest.size, sizeof(q->pcr_digest));
        memcpy(q->pcr_digest, att->attested.quote.pcrDigest.buffer, q->pcr_digest_size);

        *ret = *q;
        return 0;
}

int attest_public_to_pkey(const TPMT_PUBLIC *pub, const char *what, EVP_PKEY **ret, ApiError *reterr) {
        _cleanup_(EVP_PKEY_CTX_freep) EVP_PKEY_CTX *ctx = NULL;
        _cleanup_(OSSL_PARAM_BLD_freep) OSSL_PARAM_BLD *bld = NULL;
        _cleanup_(OSSL_PARAM_freep) OSSL_PARAM *params = NULL;
        _cleanup_(BN_freep) BIGNUM *n = NULL, *e = NULL;
        uint8_t point[1 + 2 * 32] = { 0x04 };
        EVP_PKEY *pkey = NULL;

        bld = OSSL_PARAM_BLD_new();
        if (!bld)
                return -ENOMEM;

        if (pub->type == TPM2_ALG_ECC) {
                const TPM2B_ECC_PARAMETER *x = &pub->unique.ecc.x, *y = &pub->unique.ecc.y;

                if (x->size > 32 || y->size > 32)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "unsupported %s: ecc point of %u and %u bytes, want 32",
                                what,
                                x->size,
                                y->size);
                /* left-padded to the field size */
                memcpy(point + 1 + 32 - x->size, x->buffer, x->size);
                memcpy(point + 1 + 64 - y->size, y->buffer, y->size);
                if (!OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) ||
                    !OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point, sizeof(point)))
                        return -ENOMEM;
                ctx = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
        } else {
                const TPM2B_PUBLIC_KEY_RSA *m = &pub->unique.rsa;

                if (m->size == 0)
                        return attest_error_set(reterr, -EPERM, "unsupported %s: rsa modulus is empty", what);
                n = BN_bin2bn(m->buffer, m->size, NULL);
                e = BN_new();
                if (!n || !e || !BN_set_word(e, pub->parameters.rsaDetail.exponent ?: 65537))
                        return -ENOMEM;
                if (!OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, n) ||
                    !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, e))
                        return -ENOMEM;
                ctx = EVP_PKEY_CTX_new_from_name(NULL, "RSA", NULL);
        }
        params = OSSL_PARAM_BLD_to_param(bld);
        if (!ctx || !params)
                return -ENOMEM;
        if (EVP_PKEY_fromdata_init(ctx) <= 0 ||
            EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) <= 0) {
                ERR_clear_error();
                return attest_error_set(
                        reterr,
                        -EPERM,
                        "unsupported %s: %s",
                        what,
                        pub->type == TPM2_ALG_ECC ? "ecc point is not on the curve" : "rsa key is invalid");
        }
        *ret = pkey;
        return 0;
}

/* r‖s as the DER ECDSA-Sig-Value EVP_DigestVerify wants. */
static int ecdsa_der(const TPMS_SIGNATURE_ECDSA *s, uint8_t **ret, size_t *ret_size) {
        _cleanup_(ECDSA_SIG_freep) ECDSA_SIG *sig = NULL;
        BIGNUM *r = NULL, *ss = NULL;
        uint8_t *der = NULL;
        int n;

        sig = ECDSA_SIG_new();
        r = BN_bin2bn(s->signatureR.buffer, s->signatureR.size, NULL);
        ss = BN_bin2bn(s->signatureS.buffer, s->signatureS.size, NULL);
        if (!sig || !r || !ss || !ECDSA_SIG_set0(sig, r, ss)) {
                BN_free(r);
                BN_free(ss);
                return -ENOMEM;
        }
        n = i2d_ECDSA_SIG(sig, &der);
        if (n <= 0)
                return -ENOMEM;
        *ret = der;
        *ret_size = (size_t) n;
        return 0;
}

int attest_quote_verify_signature(const AttestQuote *q, ApiError *reterr) {
        _cleanup_(EVP_MD_CTX_freep) EVP_MD_CTX *mctx = NULL;
        _cleanup_(EVP_PKEY_freep) EVP_PKEY *pkey = NULL;
        EVP_PKEY_CTX *pctx = NULL;
        uint8_t *der = NULL;
        const uint8_t *sig;
        size_t sig_size;
        const EVP_MD *md;
        int r, ok;

        assert_return(q, -EINVAL);

        md = hash_md(q->hash_alg);
        if (!md)
                return attest_error_set(
                        reterr, -EPERM, "signature does not verify: signature hash 0x%04x", q->hash_alg);

        switch (q->signature.sigAlg) {
        case TPM2_ALG_ECDSA:
                if (q->public.type != TPM2_ALG_ECC)
                        return attest_error_set(
                                reterr, -EPERM, "signature does not verify: ecdsa signature with a non-ecc key");
                r = ecdsa_der(&q->signature.signature.ecdsa, &der, &sig_size);
                if (r < 0)
                        return r;
                sig = der;
                break;
        case TPM2_ALG_RSASSA:
        case TPM2_ALG_RSAPSS:
                if (q->public.type != TPM2_ALG_RSA)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "signature does not verify: %s signature with a non-rsa key",
                                q->signature.sigAlg == TPM2_ALG_RSASSA ? "rsassa" : "rsapss");
                /* rsassa and rsapss share one layout */
                sig = q->signature.signature.rsassa.sig.buffer;
                sig_size = q->signature.signature.rsassa.sig.size;
                break;
        default:
                return attest_error_set(
                        reterr, -EPERM, "signature does not verify: scheme 0x%04x", q->signature.sigAlg);
        }

        r = attest_public_to_pkey(&q->public, "attestation key", &pkey, reterr);
        if (r < 0) {
                OPENSSL_free(der);
                return r;
        }

        mctx = EVP_MD_CTX_new();
        if (!mctx) {
                OPENSSL_free(der);
                return -ENOMEM;
        }
        ok = EVP_DigestVerifyInit(mctx, &pctx, md, NULL, pkey) == 1;
        if (ok && q->signature.sigAlg == TPM2_ALG_RSASSA)
                ok = EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PADDING) > 0;
        if (ok && q->signature.sigAlg == TPM2_ALG_RSAPSS)
                ok = EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) > 0 &&
                        EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_AUTO) > 0 &&
                        EVP_PKEY_CTX_set_rsa_mgf1_md(pctx, md) > 0;
        if (ok)
                ok = EVP_DigestVerify(mctx, sig, sig_size, q->attest, q->attest_size) == 1;
        OPENSSL_free(der);
        ERR_clear_error();
        if (!ok)
                return attest_error_set(reterr, -EPERM, "signature does not verify");
        return 0;
}

bool attest_quote_nonce_matches(const AttestQuote *q, const char *nonce_hex) {
        _cleanup_free_ uint8_t *want = NULL;
        size_t n = 0;

        if (!q || !nonce_hex)
                return false;
        if (attest_hex_decode(nonce_hex, strlen(nonce_hex), &want, &n, /* reterr_go= */ NULL) < 0 || n == 0)
                return false;
        return attest_memeq(q->extra_data, q->extra_data_size, want, n);
}

int attest_quote_verify_pcrs(
        const AttestQuote *q, const AttestPcrValue values[static ATTEST_PCR_SLOTS], ApiError *reterr) {
        _cleanup_(EVP_MD_CTX_freep) EVP_MD_CTX *ctx = NULL;
        uint8_t digest[EVP_MAX_MD_SIZE];
        unsigned digest_size = 0;
        size_t bank_size;

        assert_return(q, -EINVAL);

        bank_size = attest_hash_size(q->bank_alg);
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                if ((q->pcr_mask & (1U << i)) && values[i].set && values[i].size != bank_size)
                        return attest_error_set(
                                reterr,
                                -EPERM,
                                "pcr value: pcr %u has %zu bytes, %s needs %zu",
                                i,
                                values[i].size,
                                q->bank,
                                bank_size);

        ctx = EVP_MD_CTX_new();
        if (!ctx || EVP_DigestInit_ex(ctx, hash_md(q->hash_alg), NULL) != 1)
                return -ENOMEM;
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++) {
                if (!(q->pcr_mask & (1U << i)))
                        continue;
                if (!values[i].set || values[i].size == 0)
                        return attest_error_set(reterr, -EPERM, "pcr value: no value for pcr %u", i);
                if (EVP_DigestUpdate(ctx, values[i].data, values[i].size) != 1)
                        return -ENOMEM;
        }
        if (EVP_DigestFinal_ex(ctx, digest, &digest_size) != 1)
                return -ENOMEM;
        if (!attest_memeq(digest, digest_size, q->pcr_digest, q->pcr_digest_size))
                return attest_error_set(reterr, -EPERM, "pcr digest mismatch");
        return 0;
}
