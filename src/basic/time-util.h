/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdint.h>
#include <time.h>

typedef uint64_t usec_t;

#define USEC_INFINITY ((usec_t) UINT64_MAX)
#define NSEC_PER_USEC ((uint64_t) 1000ULL)
#define USEC_PER_MSEC ((usec_t) 1000ULL)
#define USEC_PER_SEC ((usec_t) 1000000ULL)
#define USEC_PER_MINUTE ((usec_t) (60ULL * USEC_PER_SEC))
#define USEC_PER_HOUR ((usec_t) (60ULL * USEC_PER_MINUTE))

usec_t now_usec(clockid_t clock);

/* "2026-12-01T10:20:30.5Z" and the like: RFC 3339 in UTC, the fraction to the microsecond with its
 * trailing zeros trimmed (none when it is zero), as the API shows times and Go's time.Time marshals
 * them. */
#define RFC3339_MAX 40
char *format_rfc3339(usec_t t, char buf[static RFC3339_MAX]);
/* The reverse, for UTC ("Z") only; digits of the fraction beyond the microsecond are ignored.
 * -EINVAL for NULL, anything else, or a time before 1970. */
int parse_rfc3339(const char *s, usec_t *ret);
