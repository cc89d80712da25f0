/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>
#include <tss2/tss2_tpm2_types.h>

#include "api-error.h"

/* Credential protection (TPM 2.0 part 1 §24, "Protected storage"; part 3 TPM2_MakeCredential), done on
 * the host with OpenSSL and no TPM. The daemon wraps a secret for one object (the AK, known by its
 * name) so that only the TPM holding the endorsement key can unwrap it, and only when that TPM also
 * holds an object of that name: TPM2_ActivateCredential in the guest then proves that the AK lives
 * in the same TPM as the EK.
 *
 * Pure: no state, no TPM, no I/O. The results are the marshalled bytes TPM2_ActivateCredential
 * takes, so they travel to the guest as they are. */

/* The endorsement keys a credential can be made for: RSA (2048 to 4096 bits, the TCG templates
 * L-1 and H-1..) or ECC NIST P-256 (templates L-2 and H-2), a restricted decryption key fixed to
 * its TPM, whose symmetric algorithm is AES-128 or AES-256 in CFB mode and whose name algorithm is
 * SHA-256 or SHA-384. The limit on the encoded public area, above the largest such key. */
#define ATTEST_EK_PUBLIC_MAX 1024U

/* TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET, marshalled with their size prefixes: the
 * credentialBlob and secret parameters of TPM2_ActivateCredential. */
typedef struct AttestCredential {
        uint8_t blob[sizeof(TPM2B_ID_OBJECT)];
        size_t blob_size;
        uint8_t secret[sizeof(TPM2B_ENCRYPTED_SECRET)];
        size_t secret_size;
} AttestCredential;

/* The name of a TPM object: its nameAlg (two bytes, big-endian) followed by the nameAlg digest of
 * its marshalled TPMT_PUBLIC. This is what TPM2_ReadPublic returns and what a credential is bound
 * to. -EOPNOTSUPP for a name algorithm other than SHA-1, SHA-256, SHA-384 or SHA-512. */
int attest_tpm_name(const TPMT_PUBLIC *pub, TPM2B_NAME *ret);

/* Decodes an EK public area as the agent reports it (ek_pub: a TPM2B_PUBLIC; a bare TPMT_PUBLIC is
 * accepted too), consuming the bytes exactly, and checks that a credential can be made for it (the
 * keys above). -EBADMSG for bytes that do not decode ("malformed endorsement key: …"), -EPERM for a
 * key that decodes but is refused ("unsupported endorsement key: …"). */
int attest_ek_public_parse(const uint8_t *data, size_t size, TPMT_PUBLIC *ret, ApiError *reterr);

/* The public area of an EK known only by its public key, as in its certificate: the TCG default
 * template L-1 for an RSA 2048 key and L-2 for an ECC P-256 key (PolicySecret(TPM_RH_ENDORSEMENT),
 * AES-128-CFB, SHA-256), so that its name is the one the TPM computes for a key created from that
 * template. -EOPNOTSUPP for another key type or size. */
int attest_ek_public_from_pkey(EVP_PKEY *pkey, TPMT_PUBLIC *ret, ApiError *reterr);

/* TPM2_MakeCredential: wraps credential (1 to the digest size of the EK's name algorithm, that is
 * 32 bytes for the L templates) for the object called name, to be activated by the TPM that holds
 * ek (which attest_ek_public_parse() or attest_ek_public_from_pkey() accepted). A fresh seed is
 * drawn each call: an RSA EK gets it encrypted with OAEP (label "IDENTITY"), an ECC EK by an
 * ephemeral ECDH. -EINVAL with a message for sizes out of range or an EK that is not supported. */
int attest_make_credential(
        const TPMT_PUBLIC *ek,
        const TPM2B_NAME *name,
        const uint8_t *credential,
        size_t credential_size,
        AttestCredential *ret,
        ApiError *reterr);
