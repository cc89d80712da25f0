/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <strings.h>

#include "macro.h"
#include "parse-util.h"

static bool is_digit(char c) {
        return c >= '0' && c <= '9';
}

/* Reads decimal digits from *p into *ret, advancing *p. Needs at least one digit. */
static int read_digits(const char **p, uint64_t *ret) {
        uint64_t v = 0;
        const char *s = *p;

        if (!is_digit(*s))
                return -EINVAL;
        for (; is_digit(*s); s++) {
                unsigned d = (unsigned) (*s - '0');
                if (v > (UINT64_MAX - d) / 10)
                        return -ERANGE;
                v = v * 10 + d;
        }
        *p = s;
        *ret = v;
        return 0;
}

int safe_atou64(const char *s, uint64_t *ret) {
        uint64_t v;
        int r;

        assert_return(s, -EINVAL);
        if (*s == '-' || *s == '+')
                return -EINVAL;
        r = read_digits(&s, &v);
        if (r < 0)
                return r;
        if (*s != 0)
                return -EINVAL;
        if (ret)
                *ret = v;
        return 0;
}

int safe_atou32(const char *s, uint32_t *ret) {
        uint64_t v;
        int r = safe_atou64(s, &v);

        if (r < 0)
                return r;
        if (v > UINT32_MAX)
                return -ERANGE;
        if (ret)
                *ret = (uint32_t) v;
        return 0;
}

int safe_atou16(const char *s, uint16_t *ret) {
        uint64_t v;
        int r = safe_atou64(s, &v);

        if (r < 0)
                return r;
        if (v > UINT16_MAX)
                return -ERANGE;
        if (ret)
                *ret = (uint16_t) v;
        return 0;
}

int safe_atoi64(const char *s, int64_t *ret) {
        bool neg = false;
        uint64_t v;
        int r;

        assert_return(s, -EINVAL);
        if (*s == '-') {
                neg = true;
                s++;
        }
        r = safe_atou64(s, &v);
        if (r < 0)
                return r;
        if (neg ? v > (uint64_t) INT64_MAX + 1 : v > (uint64_t) INT64_MAX)
                return -ERANGE;
        if (ret)
                *ret = neg ? (int64_t) (0 - v) : (int64_t) v;
        return 0;
}

int parse_boolean(const char *s) {
        static const char *const yes[] = { "1", "true", "yes", "on", "t", "y" };
        static const char *const no[] = { "0", "false", "no", "off", "f", "n" };

        assert_return(s, -EINVAL);
        for (size_t i = 0; i < ELEMENTSOF(yes); i++)
                if (strcasecmp(s, yes[i]) == 0)
                        return 1;
        for (size_t i = 0; i < ELEMENTSOF(no); i++)
                if (strcasecmp(s, no[i]) == 0)
                        return 0;
        return -EINVAL;
}

/* Multiplies with overflow detection. */
static int mul_u64(uint64_t a, uint64_t b, uint64_t *ret) {
        if (__builtin_mul_overflow(a, b, ret))
                return -ERANGE;
        return 0;
}

static int add_u64(uint64_t a, uint64_t b, uint64_t *ret) {
        if (__builtin_add_overflow(a, b, ret))
                return -ERANGE;
        return 0;
}

int parse_duration(const char *s, usec_t *ret) {
        static const struct {
                const char *suffix;
                uint64_t nsec;
        } units[] = {
                { "ns", 1ULL },
                { "us", 1000ULL },
                { "\xc2\xb5s", 1000ULL }, /* µs, U+00B5 */
                { "\xce\xbcs", 1000ULL }, /* μs, U+03BC */
                { "ms", 1000000ULL },
                { "s", 1000000000ULL },
                { "m", 60ULL * 1000000000ULL },
                { "h", 3600ULL * 1000000000ULL },
        };
        uint64_t total_nsec = 0;
        int r;

        assert_return(s, -EINVAL);
        if (streq(s, "0")) {
                if (ret)
                        *ret = 0;
                return 0;
        }
        if (*s == 0 || *s == '-' || *s == '+')
                return -EINVAL;

        while (*s) {
                uint64_t whole = 0, frac = 0, frac_scale = 1, unit = 0, term;
                bool have_whole = false, have_frac = false;

                if (is_digit(*s)) {
                        r = read_digits(&s, &whole);
                        if (r < 0)
                                return r;
                        have_whole = true;
                }
                if (*s == '.') {
                        s++;
                        /* keep at most 9 fractional digits: nanosecond precision is all a unit has */
                        for (; is_digit(*s); s++) {
                                if (frac_scale < 1000000000ULL) {
                                        frac = frac * 10 + (uint64_t) (*s - '0');
                                        frac_scale *= 10;
                                }
                                have_frac = true;
                        }
                }
                if (!have_whole && !have_frac)
                        return -EINVAL;

                size_t ulen = 0;
                for (size_t i = 0; i < ELEMENTSOF(units); i++) {
                        size_t l = strlen(units[i].suffix);
                        /* the longest suffix wins, so "ms" is never read as "m" */
                        if (strneq(s, units[i].suffix, l) && l > ulen) {
                                unit = units[i].nsec;
                                ulen = l;
                        }
                }
                if (unit == 0)
                        return -EINVAL; /* a missing unit is an error, as in Go */
                s += ulen;

                r = mul_u64(whole, unit, &term);
                if (r < 0)
                        return r;
                /* frac/frac_scale of a unit: unit <= 3.6e12 and frac < 1e9 keeps this in range */
                r = add_u64(term, (uint64_t) ((__uint128_t) frac * unit / frac_scale), &term);
                if (r < 0)
                        return r;
                r = add_u64(total_nsec, term, &total_nsec);
                if (r < 0)
                        return r;
        }

        if (ret)
                *ret = total_nsec / NSEC_PER_USEC;
        return 0;
}

int parse_size(const char *s, uint64_t *ret) {
        static const struct {
                const char *suffix;
                unsigned shift;
        } units[] = {
                { "", 0 },     { "B", 0 },  { "K", 10 },   { "KiB", 10 }, { "M", 20 },
                { "MiB", 20 }, { "G", 30 }, { "GiB", 30 }, { "T", 40 },   { "TiB", 40 },
        };
        uint64_t v;
        int r;

        assert_return(s, -EINVAL);
        if (*s == '-' || *s == '+')
                return -EINVAL;
        r = read_digits(&s, &v);
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(units); i++)
                if (streq(s, units[i].suffix)) {
                        if (units[i].shift > 0 && v > (UINT64_MAX >> units[i].shift))
                                return -ERANGE;
                        if (ret)
                                *ret = v << units[i].shift;
                        return 0;
                }
        return -EINVAL;
}

char *format_duration(char *buf, size_t size, usec_t usec) {
        usec_t h = usec / USEC_PER_HOUR, m = (usec / USEC_PER_MINUTE) % 60, sec = (usec / USEC_PER_SEC) % 60,
               sub = usec % USEC_PER_SEC;
        size_t n = 0;

        if (usec == 0) {
                snprintf(buf, size, "0s");
                return buf;
        }
        if (h > 0)
                n += (size_t) snprintf(buf + MIN(n, size), size - MIN(n, size), "%" PRIu64 "h", h);
        if (m > 0)
                n += (size_t) snprintf(buf + MIN(n, size), size - MIN(n, size), "%" PRIu64 "m", m);
        if (sub == 0) {
                if (sec > 0)
                        (void) snprintf(buf + MIN(n, size), size - MIN(n, size), "%" PRIu64 "s", sec);
        } else if (h == 0 && m == 0 && sec == 0 && sub % USEC_PER_MSEC == 0)
                (void) snprintf(buf + MIN(n, size), size - MIN(n, size), "%" PRIu64 "ms", sub / USEC_PER_MSEC);
        else if (h == 0 && m == 0 && sec == 0)
                (void) snprintf(buf + MIN(n, size), size - MIN(n, size), "%" PRIu64 "us", sub);
        else
                (void) snprintf(
                        buf + MIN(n, size), size - MIN(n, size), "%" PRIu64 ".%06" PRIu64 "s", sec, sub);
        return buf;
}

bool dns_label_is_valid(const char *s) {
        size_t n = s ? strlen(s) : 0;

        if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') || is_digit(s[i]) || s[i] == '-'))
                        return false;
        return true;
}
