/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "string-util.h"

#define ESC '\033'
#define BEL '\007'

char *strip_terminal_escapes(char *s) {
        char *w = s;

        if (!s)
                return NULL;
        for (const char *r = s; *r;) {
                unsigned char c = (unsigned char) *r;

                if (c == ESC && r[1] == '[') {
                        /* CSI: parameter and intermediate bytes (0x20-0x3f), then one final byte */
                        r += 2;
                        while (*r && (unsigned char) *r >= 0x20 && (unsigned char) *r <= 0x3f)
                                r++;
                        if (*r)
                                r++;
                        continue;
                }
                if (c == ESC && r[1] == ']') {
                        /* OSC: up to BEL or the string terminator ESC \ */
                        r += 2;
                        while (*r && *r != BEL && !(*r == ESC && r[1] == '\\'))
                                r++;
                        if (*r == BEL)
                                r++;
                        else if (*r)
                                r += 2;
                        continue;
                }
                if (c == ESC) {
                        /* other escape sequences: intermediate bytes (0x20-0x2f), then a final byte */
                        r++;
                        while (*r && (unsigned char) *r >= 0x20 && (unsigned char) *r <= 0x2f)
                                r++;
                        if (*r)
                                r++;
                        continue;
                }
                if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
                        r++;
                        continue;
                }
                *w++ = *r++;
        }
        *w = 0;
        return s;
}

uint32_t fnv1a_32(const char *s) {
        uint32_t h = UINT32_C(2166136261);

        for (; *s; s++) {
                h ^= (uint8_t) *s;
                h *= UINT32_C(16777619);
        }
        return h;
}

char *strv_join(char *const *l, const char *sep) {
        size_t n = 1, k = strlen(sep);
        char *s, *p;

        for (char *const *i = l; i && *i; i++)
                n += strlen(*i) + (i != l ? k : 0);
        s = p = malloc(n);
        if (!s)
                return NULL;
        *p = 0;
        for (char *const *i = l; i && *i; i++) {
                if (i != l)
                        p = stpcpy(p, sep);
                p = stpcpy(p, *i);
        }
        return s;
}

char **strv_copy(char *const *l) {
        size_t n = strv_length(l);
        char **c = calloc(n + 1, sizeof(char *));

        if (!c)
                return NULL;
        for (size_t i = 0; i < n; i++)
                if (!(c[i] = strdup(l[i])))
                        return strv_free(c);
        return c;
}
