/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <openssl/crypto.h>

#include "attest-util.h"
#include "cleanup.h"
#include "hex-util.h"

int attest_error_set(ApiError *reterr, int r, const char *format, ...) {
        char *msg = NULL;
        va_list ap;
        int k;

        assert(r < 0);

        if (!reterr)
                return r;

        va_start(ap, format);
        k = vasprintf(&msg, format, ap);
        va_end(ap);

        api_error_done(reterr);
        reterr->error = r;
        reterr->code = API_ERROR_INVALID_REQUEST;
        reterr->message = k < 0 ? NULL : msg;
        return r;
}

/* Go's InvalidByteError: "%#U" of the byte taken as a rune, which shows the character only when
 * strconv.IsPrint holds (printable ASCII, and Latin-1 letters and symbols except NBSP and SHY). */
static char *go_invalid_byte(uint8_t b) {
        char c[3] = {}, *s = NULL;

        if (b >= 0x20 && b < 0x7f)
                c[0] = (char) b;
        else if (b > 0xa0 && b != 0xad) {
                /* the rune U+00XX in UTF-8 */
                c[0] = (char) (0xc0 | (b >> 6));
                c[1] = (char) (0x80 | (b & 0x3f));
        }
        if (c[0])
                asprintf_or_null(&s, "encoding/hex: invalid byte: U+%04X '%s'", b, c);
        else
                asprintf_or_null(&s, "encoding/hex: invalid byte: U+%04X", b);
        return s;
}

int attest_hex_decode(const char *s, size_t len, uint8_t **ret, size_t *ret_size, char **reterr_go) {
        _cleanup_free_ uint8_t *buf = NULL;
        size_t at = 0;
        int r;

        assert_return(s || len == 0, -EINVAL);
        assert_return(ret && ret_size, -EINVAL);

        if (len >= 2) {
                buf = malloc(len / 2);
                if (!buf)
                        return -ENOMEM;
        }
        /* hex_decode() finds the error Go reports: the first bad byte, else the odd length */
        r = hex_decode(s, len, /* lower_only= */ false, buf, &at);
        if (r < 0) {
                if (reterr_go)
                        *reterr_go = at < len ? go_invalid_byte((uint8_t) s[at]) :
                                                strdup("encoding/hex: odd length hex string");
                return r;
        }
        *ret = TAKE_PTR(buf);
        *ret_size = len / 2;
        return 0;
}

int attest_base64_decode(
        const char *s, size_t len, size_t max, uint8_t **ret, size_t *ret_size, char **reterr_go) {
        size_t at = 0;
        int r;

        r = base64_decode(s, len, max, ret, ret_size, &at);
        if (r == -EINVAL && reterr_go)
                asprintf_or_null(reterr_go, "illegal base64 data at input byte %zu", at);
        return r;
}

char *attest_go_quote(const char *s, size_t len) {
        char *out = malloc(len * 4 + 3), *o = out;

        if (!out)
                return NULL;
        *o++ = '"';
        for (size_t i = 0; i < len; i++) {
                uint8_t c = (uint8_t) s[i];
                size_t seq = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 1;
                bool valid = seq > 1 && i + seq <= len;

                for (size_t k = 1; valid && k < seq; k++)
                        valid = ((uint8_t) s[i + k] & 0xc0) == 0x80;
                if (valid) {
                        memcpy(o, s + i, seq);
                        o += seq;
                        i += seq - 1;
                        continue;
                }
                switch (c) {
                case '"':
                case '\\':
                        *o++ = '\\';
                        *o++ = (char) c;
                        break;
                case '\a':
                        o += sprintf(o, "\\a");
                        break;
                case '\b':
                        o += sprintf(o, "\\b");
                        break;
                case '\f':
                        o += sprintf(o, "\\f");
                        break;
                case '\n':
                        o += sprintf(o, "\\n");
                        break;
                case '\r':
                        o += sprintf(o, "\\r");
                        break;
                case '\t':
                        o += sprintf(o, "\\t");
                        break;
                case '\v':
                        o += sprintf(o, "\\v");
                        break;
                default:
                        if (c >= 0x20 && c < 0x7f)
                                *o++ = (char) c;
                        else
                                o += sprintf(o, "\\x%02x", c);
                }
        }
        *o++ = '"';
        *o = 0;
        return out;
}

bool attest_memeq(const void *a, size_t a_size, const void *b, size_t b_size) {
        if (a_size != b_size)
                return false;
        return a_size == 0 || CRYPTO_memcmp(a, b, a_size) == 0;
}

const char *attest_json_go_type(const json_t *v) {
        switch (json_typeof(v)) {
        case JSON_OBJECT:
                return "object";
        case JSON_ARRAY:
                return "array";
        case JSON_STRING:
                return "string";
        case JSON_INTEGER:
        case JSON_REAL:
                return "number";
        case JSON_TRUE:
        case JSON_FALSE:
                return "bool";
        case JSON_NULL:
                return "null";
        }
        return "value";
}

void attest_text_add(AttestText *t, const char *format, ...) {
        char *part = NULL, *s;
        va_list ap;
        int k;

        if (t->oom)
                return;
        va_start(ap, format);
        k = vasprintf(&part, format, ap);
        va_end(ap);
        if (k < 0) {
                t->oom = true;
                return;
        }
        s = realloc(t->s, t->n + (size_t) k + 1);
        if (!s) {
                free(part);
                t->oom = true;
                return;
        }
        memcpy(s + t->n, part, (size_t) k + 1);
        t->s = s;
        t->n += (size_t) k;
        free(part);
}

void attest_text_done(AttestText *t) {
        free(t->s);
}
