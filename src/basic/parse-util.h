/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "time-util.h"

/* Every parser here accepts exactly one value: no leading whitespace or sign, no trailing junk.
 * Negative values are -EINVAL, values beyond the type are -ERANGE. ret is set only on success. */

int safe_atou64(const char *s, uint64_t *ret);
int safe_atou32(const char *s, uint32_t *ret);
int safe_atou16(const char *s, uint16_t *ret);
/* Allows a leading '-'. */
int safe_atoi64(const char *s, int64_t *ret);

/* "1", "0", "true", "false", "yes", "no", "on", "off", "t", "f", "y", "n" (any case). */
int parse_boolean(const char *s);

/* A duration as Go writes it: one or more <number><unit> terms, with units ns, us, µs, ms, s, m,
 * h, and decimal fractions ("1.5s", "1h30m", "250ms"). A bare "0" is zero. Rounded down to
 * microseconds. */
int parse_duration(const char *s, usec_t *ret);

/* A byte count with an optional binary suffix: K, M, G, T or KiB, MiB, GiB, TiB, or a bare B for
 * bytes ("4096B"). "8M" is 8388608; "8MB" is refused, as it is ambiguous. */
int parse_size(const char *s, uint64_t *ret);

/* A lower-case DNS label: 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-'. */
bool dns_label_is_valid(const char *s);

/* Writes a duration back in the form parse_duration() reads ("5m", "1h30m", "250ms"). */
char *format_duration(char *buf, size_t size, usec_t usec);
