/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <openssl/evp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tss2/tss2_tpm2_types.h>

#include "api-error.h"
#include "attest-util.h"

/* TPM 2.0 quotes as the guest agent posts them (reference/network-imds-attest.md §4.2, §9.3):
 * quote is the TPMS_ATTEST TPM2_Quote produced (no size prefix, exactly the signed bytes),
 * signature a marshalled TPMT_SIGNATURE, ak_pub the attestation key's TPMT_PUBLIC (a TPM2B_PUBLIC
 * is accepted too). Pure: no state, no TPM, no policy; attest-verify.c applies nonces, the AK pin
 * and the image policy on top.
 *
 * Failures carry the reference's texts in reterr (exactly, no "invalid request: " prefix): -EBADMSG
 * for bytes that do not decode ("malformed quote: …"), -EPERM for a quote or key that decodes but is
 * refused or does not verify. */

typedef struct AttestQuote {
        /* TPMS_ATTEST as received; borrowed from the caller's buffer, which must outlive this. */
        const uint8_t *attest;
        size_t attest_size;

        TPMT_SIGNATURE signature;
        TPMT_PUBLIC public;
        char ak_fingerprint[ATTEST_SHA256_HEX + 1]; /* hex sha256 of the marshalled TPMT_PUBLIC */

        uint8_t extra_data[sizeof(TPMU_HA)]; /* the qualifying data: the nonce, hex-decoded */
        size_t extra_data_size;

        TPMI_ALG_HASH bank_alg; /* the one PCR bank the quote selects */
        const char *bank;       /* its name: "sha1", "sha256", "sha384" or "sha512" */
        uint32_t pcr_mask;      /* bit i: PCR i is selected */

        uint8_t pcr_digest[sizeof(TPMU_HA)]; /* the TPM's digest over the selected values */
        size_t pcr_digest_size;

        TPMI_ALG_HASH hash_alg; /* the signature's hash, which also made pcr_digest */
} AttestQuote;

/* One PCR value as sent by the guest (any length; checked against the bank). Borrowed. */
typedef struct AttestPcrValue {
        bool set;
        const uint8_t *data;
        size_t size;
} AttestPcrValue;

/* Decodes quote, signature and AK and checks everything that needs neither PCR values nor the
 * nonce: the TPM magic, the attestation type, a single PCR bank, the AK's algorithm and
 * attributes, and a signature scheme that suits the key. Fills *ret, which borrows quote. */
int attest_quote_parse(
        const uint8_t *quote,
        size_t quote_size,
        const uint8_t *signature,
        size_t signature_size,
        const uint8_t *ak_pub,
        size_t ak_pub_size,
        AttestQuote *ret,
        ApiError *reterr);

/* Verifies the signature over the attest bytes with the AK: ECDSA for ECC keys, RSASSA (PKCS#1
 * v1.5) or RSAPSS (salt length auto-detected) for RSA keys, hashed with the signature's hash. */
int attest_quote_verify_signature(const AttestQuote *q, ApiError *reterr);

/* Whether the qualifying data equals the hex-decoded nonce, compared in constant time; an empty
 * or non-hex nonce never matches. */
bool attest_quote_nonce_matches(const AttestQuote *q, const char *nonce_hex);

/* Checks that values (by index; values for unselected indexes are ignored) reproduce the quote's
 * PCR digest: the signature's hash over the selected values in ascending index order. Errors:
 * "pcr value: pcr N has L bytes, sha256 needs 32", "pcr value: no value for pcr N",
 * "pcr digest mismatch". */
int attest_quote_verify_pcrs(
        const AttestQuote *q, const AttestPcrValue values[static ATTEST_PCR_SLOTS], ApiError *reterr);

/* The digest size of a TPM hash algorithm (sha1, sha256, sha384, sha512), 0 for another. */
size_t attest_hash_size(TPMI_ALG_HASH alg);
/* "sha256" for TPM2_ALG_SHA256…, NULL for another. */
const char *attest_hash_name(TPMI_ALG_HASH alg);

/* The OpenSSL public key of an ECC P-256 or RSA TPMT_PUBLIC (the type is not checked again: anything
 * but TPM2_ALG_ECC is taken as RSA). A point off the curve or an empty modulus is -EPERM with
 * "unsupported <what>: …" in reterr. Returns a new reference. */
int attest_public_to_pkey(const TPMT_PUBLIC *pub, const char *what, EVP_PKEY **ret, ApiError *reterr);

/* An attestation key's public area as the guest sends it (ak_pub: a TPMT_PUBLIC or a TPM2B_PUBLIC,
 * consumed exactly), decoded and held to what a quote's AK must be: a restricted signing key fixed
 * to its TPM and generated there, ECC P-256 (ECDSA) or RSA 2048 (RSASSA, RSAPSS). -EBADMSG
 * "malformed quote: ak_pub: …" for bytes that do not decode, -EPERM "attestation key attributes: …"
 * or "unsupported attestation key: …" for a key that is refused. */
int attest_ak_public_parse(const uint8_t *data, size_t size, TPMT_PUBLIC *ret, ApiError *reterr);

/* The AK fingerprint of a TPMT_PUBLIC: hex sha256 of its marshalled form. */
int attest_ak_fingerprint(const TPMT_PUBLIC *pub, char ret[static ATTEST_SHA256_HEX + 1]);
