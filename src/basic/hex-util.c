/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "hex-util.h"

int unhexchar(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

char *hex_format(const void *data, size_t size, char *out) {
        static const char digits[] = "0123456789abcdef";
        const uint8_t *p = data;

        for (size_t i = 0; i < size; i++) {
                out[2 * i] = digits[p[i] >> 4];
                out[2 * i + 1] = digits[p[i] & 15];
        }
        out[2 * size] = 0;
        return out;
}

char *hex_encode(const void *data, size_t size) {
        char *s = malloc(2 * size + 1);

        return s ? hex_format(data, size, s) : NULL;
}

int unbase64char(char c, bool url) {
        if (c >= 'A' && c <= 'Z')
                return c - 'A';
        if (c >= 'a' && c <= 'z')
                return c - 'a' + 26;
        if (c >= '0' && c <= '9')
                return c - '0' + 52;
        if (c == (url ? '-' : '+'))
                return 62;
        if (c == (url ? '_' : '/'))
                return 63;
        return -1;
}
