/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api-error.h"
#include "attest-util.h"

/* The body of POST /giantswarm/v1/attest/quote (reference/network-imds-attest.md §2.3, §2.4):
 *
 *   {"stage":"initrd"|"ready", "nonce":"<hex>", "ak_pub":"<b64>", "ek_pub":"<b64>",
 *    "quote":"<b64>", "signature":"<b64>", "pcrs":{"sha256":{"0":"<hex>",…}},
 *    "event_log":"<b64>", "userspace_log":"<b64>"}
 *
 * decoded as the original's Go decoder does (standard padded base64, keys matched
 * case-insensitively, unknown keys and trailing bytes ignored, null as absent), with a size limit
 * for every field. PCR values stay text here: the verifier reports a bad one with its own message
 * (pcrs.sha256[N] is not hex). */

#define ATTEST_QUOTE_MAX ((size_t) 4096)
#define ATTEST_SIGNATURE_MAX ((size_t) 1024)
#define ATTEST_PUBLIC_MAX ((size_t) 2048)
#define ATTEST_LOG_MAX ((size_t) 4 << 20)
/* Longer than any nonce the store issues; a longer one is refused as malformed, a shorter unknown
 * one is rejected by the verifier ("unknown or expired nonce"). */
#define ATTEST_NONCE_MAX ((size_t) 1024)
#define ATTEST_PCR_BANKS_MAX 16U
#define ATTEST_PCRS_PER_BANK_MAX 24U
#define ATTEST_PCR_VALUE_MAX ((size_t) 128) /* hex characters of a sha512 value */

typedef struct AttestQuoteRequest {
        char *stage; /* as sent ("" when absent); the decoder only accepts "initrd" and "ready" */
        char *nonce; /* as sent */
        uint8_t *ak_pub;
        size_t ak_pub_size;
        uint8_t *ek_pub;
        size_t ek_pub_size;
        uint8_t *quote;
        size_t quote_size;
        uint8_t *signature;
        size_t signature_size;
        unsigned n_pcr_banks; /* how many banks "pcrs" has, sha256 or not */
        /* pcrs.sha256 by index as sent (keys "0"…"31"), NULL where absent; other keys are kept by
         * nobody, as the original looks values up by their decimal index only */
        char *pcrs_sha256[ATTEST_PCR_SLOTS];
        uint8_t *event_log;
        size_t event_log_size;
        uint8_t *userspace_log;
        size_t userspace_log_size;
} AttestQuoteRequest;

void attest_quote_request_done(AttestQuoteRequest *r);

/* Decodes and validates a request body. On failure reterr's message is the exact text of the IMDS's
 * 400 answer:
 *   -EBADMSG  "malformed quote: <decode error>" (bad JSON, a wrong type, bad base64, a NUL in a
 *             string, a field over its limit: -EFBIG then)
 *   -EINVAL   "invalid request: stage must be \"initrd\" or \"ready\"", "invalid request: nonce is
 *             required", "invalid request: ak_pub, quote and signature are required",
 *             "invalid request: pcrs is required" (checked in this order)
 * *ret is filled only on success. */
int attest_quote_request_decode(const void *body, size_t size, AttestQuoteRequest *ret, ApiError *reterr);

/* The QuoteResult answer: {"stage","verified","user_data_released","message"(when not empty)}, where
 * user_data_released = verified && stage == "initrd". New reference, NULL on OOM. */
json_t *attest_quote_result_to_json(const char *stage, bool verified, const char *message);

/* The bodies of the credential activation (docs/design.md, Attestation), which a guest runs before
 * the daemon trusts any quote of its attestation key:
 *
 *   POST /giantswarm/v1/attest/challenge  {"ak_pub":"<b64>", "ek_pub":"<b64>"}
 *   POST /giantswarm/v1/attest/activate   {"secret":"<b64>"}
 *
 * These have no Go original to follow, so the decoder is strict: standard padded base64, exact key
 * names, no unknown keys, nothing after the object. ak_pub and ek_pub are TPM2B_PUBLIC (or bare
 * TPMT_PUBLIC) as in a quote; the secret is the credential TPM2_ActivateCredential returned. */

#define ATTEST_ACTIVATE_SECRET_MAX ((size_t) 64)

typedef struct AttestChallengeRequest {
        uint8_t *ak_pub;
        size_t ak_pub_size;
        uint8_t *ek_pub;
        size_t ek_pub_size;
} AttestChallengeRequest;

void attest_challenge_request_done(AttestChallengeRequest *r);

/* -EBADMSG "malformed challenge: <why>" (not a JSON object, a wrong type, bad base64, an unknown
 * field), -EFBIG for a field over its limit, -EINVAL "invalid request: ak_pub and ek_pub are
 * required". *ret is filled only on success. */
int attest_challenge_request_decode(const void *body, size_t size, AttestChallengeRequest *ret, ApiError *reterr);

typedef struct AttestActivateRequest {
        uint8_t secret[ATTEST_ACTIVATE_SECRET_MAX];
        size_t secret_size;
} AttestActivateRequest;

/* As above, "malformed activation: <why>" and "invalid request: secret is required". */
int attest_activate_request_decode(const void *body, size_t size, AttestActivateRequest *ret, ApiError *reterr);
