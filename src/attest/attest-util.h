/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "api-error.h"
#include "hex-util.h"

/* Helpers shared by the attestation library. The verifier's messages are data that clients and
 * tests compare byte for byte (reference/network-imds-attest.md §4), so the decoders here fail with
 * the texts Go's encoding/hex and encoding/base64 produce. */

/* PCR indexes a quote can select (4 bytes of selection bitmap) and a policy can name (0–23). */
#define ATTEST_PCR_SLOTS 32U
#define ATTEST_PCR_POLICY_MAX 24U
#define ATTEST_SHA256_SIZE 32U
#define ATTEST_SHA256_HEX (2U * ATTEST_SHA256_SIZE)
/* The 16 hex characters of a fingerprint that messages show. */
#define ATTEST_SHORT_FP 16

/* Fills reterr (when not NULL) with exactly the given message, without the code's sentinel prefix
 * ("invalid request: "…) api_error_set() adds, and returns r. The verifier's texts are fixed by
 * the reference and reach clients unchanged. */
int attest_error_set(ApiError *reterr, int r, const char *format, ...) _printf_(3, 4);

/* Decodes hex of either case as Go's hex.DecodeString does, into a new buffer (NULL with size 0
 * for ""). On a bad input returns -EINVAL and, when reterr_go is not NULL, Go's error text
 * ("encoding/hex: invalid byte: U+0067 'g'", "encoding/hex: odd length hex string") in a new
 * string. -ENOMEM on OOM. */
int attest_hex_decode(const char *s, size_t len, uint8_t **ret, size_t *ret_size, char **reterr_go);

/* Decodes standard padded base64 as Go's base64.StdEncoding does (\r and \n ignored, non-zero
 * trailing bits accepted). max bounds the decoded size (-EFBIG beyond it, checked before any work).
 * On a bad input returns -EINVAL with Go's text "illegal base64 data at input byte N" in
 * *reterr_go. */
int attest_base64_decode(const char *s, size_t len, size_t max, uint8_t **ret, size_t *ret_size, char **reterr_go);

/* s quoted as Go's %q renders it for the ASCII range: "x", with \" \\ \n \r \t and \xNN escapes. */
char *attest_go_quote(const char *s, size_t len);

/* Constant-time equality of two byte strings; unequal sizes compare unequal. */
bool attest_memeq(const void *a, size_t a_size, const void *b, size_t b_size);

/* The name Go's encoding/json gives a JSON value's type in its unmarshal errors. */
const char *attest_json_go_type(const json_t *v);

/* A growing text for the joined parts of a message: attest_text_add() appends, and on OOM sets oom
 * and ignores what follows. s is NULL until something was added. */
typedef struct AttestText {
        char *s;
        size_t n;
        bool oom;
} AttestText;

void attest_text_add(AttestText *t, const char *format, ...) _printf_(2, 3);
void attest_text_done(AttestText *t);
