/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The value of one hexadecimal digit (either case), or -1. */
int unhexchar(char c);

/* size bytes of data as lower-case hex into out (2 * size + 1 bytes, NUL-terminated); returns out. */
char *hex_format(const void *data, size_t size, char *out);

/* The same into a new string; NULL on OOM. */
char *hex_encode(const void *data, size_t size);

/* The value of one base64 digit, or -1: of the standard alphabet (RFC 4648 §4, "+/"), or of the
 * URL-safe one (§5, "-_") when url is set. Padding is no digit. */
int unbase64char(char c, bool url);
