/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "time-util.h"

usec_t now_usec(clockid_t clock) {
        struct timespec ts;

        if (clock_gettime(clock, &ts) < 0)
                return 0;
        return (usec_t) ts.tv_sec * 1000000ULL + (usec_t) ts.tv_nsec / 1000ULL;
}
