/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "macro.h"
#include "time-util.h"

usec_t now_usec(clockid_t clock) {
        struct timespec ts;

        if (clock_gettime(clock, &ts) < 0)
                return 0;
        return (usec_t) ts.tv_sec * 1000000ULL + (usec_t) ts.tv_nsec / 1000ULL;
}

char *format_rfc3339(usec_t t, char buf[static RFC3339_MAX]) {
        time_t sec = (time_t) (t / USEC_PER_SEC);
        unsigned frac = (unsigned) (t % USEC_PER_SEC);
        struct tm tm;
        size_t n;

        (void) gmtime_r(&sec, &tm);
        n = strftime(buf, RFC3339_MAX, "%Y-%m-%dT%H:%M:%S", &tm);
        if (frac > 0) {
                char f[8];

                (void) snprintf(f, sizeof(f), "%06u", frac);
                for (size_t k = strlen(f); k > 0 && f[k - 1] == '0'; k--)
                        f[k - 1] = 0;
                n += (size_t) snprintf(buf + n, RFC3339_MAX - n, ".%s", f);
        }
        (void) snprintf(buf + n, RFC3339_MAX - n, "Z");
        return buf;
}

int parse_rfc3339(const char *s, usec_t *ret) {
        struct tm tm = {};
        usec_t frac = 0, scale = 100000;
        const char *e;
        time_t sec;

        if (!s)
                return -EINVAL;
        e = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
        if (!e)
                return -EINVAL;
        if (*e == '.')
                for (e++; *e >= '0' && *e <= '9'; e++, scale /= 10)
                        frac += scale * (usec_t) (*e - '0');
        if (!streq(e, "Z"))
                return -EINVAL;
        sec = timegm(&tm);
        if (sec < 0)
                return -EINVAL;
        *ret = (usec_t) sec * USEC_PER_SEC + frac;
        return 0;
}
