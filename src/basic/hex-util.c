/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cleanup.h"
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

int hex_decode(const char *s, size_t len, bool lower_only, uint8_t *out, size_t *reterr_offset) {
        /* Every character is checked before anything is written, so that out is only changed on
         * success, and an odd last character is judged as a digit first. */
        for (size_t i = 0; i < len; i++)
                if (unhexchar(s[i]) < 0 || (lower_only && s[i] >= 'A' && s[i] <= 'F')) {
                        if (reterr_offset)
                                *reterr_offset = i;
                        return -EINVAL;
                }
        if (len % 2 == 1) {
                if (reterr_offset)
                        *reterr_offset = len;
                return -EINVAL;
        }
        for (size_t i = 0; i < len / 2; i++)
                out[i] = (uint8_t) (unhexchar(s[2 * i]) << 4 | unhexchar(s[2 * i + 1]));
        return 0;
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

static char *base64_encode_full(const void *data, size_t size, bool url) {
        const char *table = url ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" :
                                  "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const uint8_t *p = data;
        char *s, *o;

        if (size > (SIZE_MAX - 1) / 4 * 3 - 2)
                return NULL;
        s = o = malloc((size + 2) / 3 * 4 + 1);
        if (!s)
                return NULL;
        for (size_t i = 0; i < size; i += 3) {
                size_t left = size - i;
                uint32_t v = (uint32_t) p[i] << 16;

                if (left > 1)
                        v |= (uint32_t) p[i + 1] << 8;
                if (left > 2)
                        v |= p[i + 2];
                *o++ = table[v >> 18 & 63];
                *o++ = table[v >> 12 & 63];
                if (left > 1)
                        *o++ = table[v >> 6 & 63];
                else if (!url)
                        *o++ = '=';
                if (left > 2)
                        *o++ = table[v & 63];
                else if (!url)
                        *o++ = '=';
        }
        *o = 0;
        return s;
}

char *base64_encode(const void *data, size_t size) {
        return base64_encode_full(data, size, /* url= */ false);
}

char *base64url_encode(const void *data, size_t size) {
        return base64_encode_full(data, size, /* url= */ true);
}

static int base64_corrupt(size_t at, size_t *reterr_offset) {
        if (reterr_offset)
                *reterr_offset = at;
        return -EINVAL;
}

static bool is_newline(char c) {
        return c == '\n' || c == '\r';
}

/* One quantum of Go's decodeQuantum(): up to four symbols from s[*si], newlines skipped, padding
 * only at the very end. Returns the bytes produced (0-3), or -EINVAL; *done is set at the end. */
static int base64_quantum(
        const char *s, size_t len, size_t *si, uint8_t out[3], bool *done, size_t *reterr_offset) {
        uint8_t d[4] = {};
        size_t dlen = 4;

        for (size_t j = 0; j < 4; j++) {
                int v;
                char c;

                if (*si == len) {
                        if (j == 0) {
                                *done = true;
                                return 0;
                        }
                        return base64_corrupt(*si - j, reterr_offset);
                }
                c = s[(*si)++];
                v = unbase64char(c, /* url= */ false);
                if (v >= 0) {
                        d[j] = (uint8_t) v;
                        continue;
                }
                if (is_newline(c)) {
                        j--;
                        continue;
                }
                if (c != '=' || j < 2)
                        return base64_corrupt(*si - 1, reterr_offset);
                if (j == 2) {
                        /* "==" is expected; the first '=' is already consumed */
                        while (*si < len && is_newline(s[*si]))
                                (*si)++;
                        if (*si == len)
                                return base64_corrupt(len, reterr_offset);
                        if (s[*si] != '=')
                                return base64_corrupt(*si - 1, reterr_offset);
                        (*si)++;
                }
                while (*si < len && is_newline(s[*si]))
                        (*si)++;
                if (*si < len)
                        return base64_corrupt(*si, reterr_offset);
                dlen = j;
                *done = true;
                break;
        }

        uint32_t val = (uint32_t) d[0] << 18 | (uint32_t) d[1] << 12 | (uint32_t) d[2] << 6 | d[3];
        out[0] = (uint8_t) (val >> 16);
        out[1] = (uint8_t) (val >> 8);
        out[2] = (uint8_t) val;
        return (int) dlen - 1;
}

int base64_decode(const char *s, size_t len, size_t max, uint8_t **ret, size_t *ret_size, size_t *reterr_offset) {
        _cleanup_free_ uint8_t *buf = NULL;
        size_t si = 0, n = 0, symbols = 0;
        bool done = false;

        assert_return(s || len == 0, -EINVAL);
        assert_return(ret && ret_size, -EINVAL);

        /* Bound the work by what the symbols could decode to, newlines and padding not counted. */
        for (size_t i = 0; i < len; i++)
                if (!is_newline(s[i]) && s[i] != '=')
                        symbols++;
        if (symbols / 4 * 3 + (symbols % 4 ? symbols % 4 - 1 : 0) > max)
                return -EFBIG;

        buf = malloc(symbols / 4 * 3 + 3);
        if (!buf)
                return -ENOMEM;
        while (!done) {
                int k = base64_quantum(s, len, &si, buf + n, &done, reterr_offset);
                if (k < 0)
                        return k;
                n += (size_t) k;
        }
        if (n == 0)
                buf = mfree(buf);
        *ret = TAKE_PTR(buf);
        *ret_size = n;
        return 0;
}

int base64url_decode(const char *s, size_t len, uint8_t **ret, size_t *ret_size) {
        _cleanup_free_ uint8_t *out = NULL;
        size_t k = 0;
        uint32_t acc = 0;
        unsigned bits = 0;

        assert_return(ret && ret_size && (s || len == 0), -EINVAL);

        if (len % 4 == 1) /* no length leaves one character over */
                return -EBADMSG;
        out = malloc(len / 4 * 3 + 3);
        if (!out)
                return -ENOMEM;
        for (size_t i = 0; i < len; i++) {
                int v = unbase64char(s[i], /* url= */ true);

                if (v < 0)
                        return -EBADMSG;
                acc = (acc << 6) | (uint32_t) v;
                bits += 6;
                if (bits >= 8) {
                        bits -= 8;
                        out[k++] = (uint8_t) (acc >> bits);
                        acc &= (1u << bits) - 1;
                }
        }
        if (acc != 0) /* the unused low bits of the last character must be zero: one encoding only */
                return -EBADMSG;
        out[k] = 0;
        *ret_size = k;
        *ret = TAKE_PTR(out);
        return 0;
}

char *ether_addr_format(const uint8_t addr[static 6], char buf[static ETHER_ADDR_STRLEN]) {
        (void) snprintf(
                buf,
                ETHER_ADDR_STRLEN,
                "%02x:%02x:%02x:%02x:%02x:%02x",
                addr[0],
                addr[1],
                addr[2],
                addr[3],
                addr[4],
                addr[5]);
        return buf;
}
