/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes as text and back: hex, base64 (RFC 4648) and MAC addresses. */

/* The value of one hexadecimal digit (either case), or -1. */
int unhexchar(char c);

/* Decodes the len characters of s into len / 2 bytes at out. Digits of either case, or only lower
 * case when lower_only is set (formats such as W3C trace context refuse upper case). -EINVAL when a
 * character is not a digit, or when len is odd; *reterr_offset (optional) is then the offset of the
 * first character that is not a digit, scanning left to right, or len for an odd length made only
 * of digits. This is the order Go's encoding/hex reports errors in. */
int hex_decode(const char *s, size_t len, bool lower_only, uint8_t *out, size_t *reterr_offset);

/* size bytes of data as lower-case hex into out (2 * size + 1 bytes, NUL-terminated); returns out. */
char *hex_format(const void *data, size_t size, char *out);

/* The same into a new string; NULL on OOM. */
char *hex_encode(const void *data, size_t size);

/* The value of one base64 digit, or -1: of the standard alphabet (RFC 4648 §4, "+/"), or of the
 * URL-safe one (§5, "-_") when url is set. Padding is no digit. */
int unbase64char(char c, bool url);

/* The standard alphabet with padding (what systemd's credentials, HTTP Basic auth and Go's
 * encoding/json for []byte use); a new string, NULL on OOM or an input too large to encode. */
char *base64_encode(const void *data, size_t size);
/* The URL-safe alphabet without padding, as JOSE uses it; a new string, NULL on OOM. */
char *base64url_encode(const void *data, size_t size);

/* Standard padded base64 as Go's base64.StdEncoding decodes it: \r and \n are skipped anywhere,
 * padding only at the very end, non-zero unused bits accepted. -EFBIG when it would decode to more
 * than max bytes (judged before decoding); -EINVAL for bad input, the offset of the offending byte
 * in *reterr_offset (optional). *ret is malloc'd, NULL for an empty result. */
int base64_decode(const char *s, size_t len, size_t max, uint8_t **ret, size_t *ret_size, size_t *reterr_offset);
/* base64url without padding, strictly: one encoding per value (a length of 4k+1 and non-zero
 * unused bits are refused), -EBADMSG otherwise. *ret is malloc'd and NUL-terminated. */
int base64url_decode(const char *s, size_t len, uint8_t **ret, size_t *ret_size);

/* "02:00:0a:00:00:02" */
#define ETHER_ADDR_STRLEN sizeof("xx:xx:xx:xx:xx:xx")
char *ether_addr_format(const uint8_t addr[static 6], char buf[static ETHER_ADDR_STRLEN]);
