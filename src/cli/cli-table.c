/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "cli-table.h"
#include "string-util.h"

static void sanitize(char *s) {
        for (; *s; s++)
                if ((unsigned char) *s < 0x20 || *s == 0x7f)
                        *s = '?';
}

static const json_t *lookup(const json_t *obj, const char *key) {
        const char *dot = strchr(key, '.');
        char first[64];

        if (!dot || (size_t) (dot - key) >= sizeof(first))
                return json_object_get(obj, key);
        snprintf(first, sizeof(first), "%.*s", (int) (dot - key), key);
        return lookup(json_object_get(obj, first), dot + 1);
}

char *cli_cell(const json_t *v, const char *format) {
        char *s = NULL;

        if (!v || json_is_null(v))
                return strdup("-");
        if (format && streq(format, "count") && (json_is_array(v) || json_is_object(v))) {
                size_t n = json_is_array(v) ? json_array_size(v) : json_object_size(v);
                return asprintf(&s, "%zu", n) < 0 ? NULL : s;
        }
        if (format && streq(format, "mib") && json_is_integer(v)) {
                json_int_t m = json_integer_value(v);
                if (m >= 1024 && m % 1024 == 0)
                        return asprintf(&s, "%lld GiB", (long long) (m / 1024)) < 0 ? NULL : s;
                return asprintf(&s, "%lld MiB", (long long) m) < 0 ? NULL : s;
        }
        if (json_is_string(v))
                s = strdup(json_string_value(v));
        else if (json_is_array(v)) {
                size_t i, len = 0;
                json_t *e;
                bool strings = true;

                json_array_foreach(v, i, e) {
                        if (!json_is_string(e))
                                strings = false;
                        else
                                len += strlen(json_string_value(e)) + 1;
                }
                if (json_array_size(v) == 0)
                        return strdup("-");
                if (strings) {
                        s = malloc(len);
                        if (!s)
                                return NULL;
                        *s = 0;
                        json_array_foreach(v, i, e) {
                                if (i > 0)
                                        strcat(s, ",");
                                strcat(s, json_string_value(e));
                        }
                } else
                        s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        } else
                s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (s)
                sanitize(s);
        return s;
}

/* Display width of a UTF-8 string, counting code points: good enough for names and addresses. */
static size_t width(const char *s) {
        size_t n = 0;

        for (; *s; s++)
                if (((unsigned char) *s & 0xc0) != 0x80)
                        n++;
        return n;
}

char *cli_table(const json_t *rows, const CliColumn *columns, const char *what) {
        _cleanup_free_ size_t *widths = NULL;
        _cleanup_free_ char **cells = NULL;
        size_t n_cols = 0, n_rows = json_array_size(rows), size = 0;
        char *buf = NULL;
        FILE *f;

        if (n_rows == 0) {
                char *s;
                return asprintf(&s, "No %s.\n", what) < 0 ? NULL : s;
        }
        while (columns[n_cols].header)
                n_cols++;
        widths = calloc(n_cols, sizeof(size_t));
        cells = calloc(n_cols * n_rows, sizeof(char *));
        if (!widths || !cells)
                return NULL;
        for (size_t c = 0; c < n_cols; c++)
                widths[c] = width(columns[c].header);

        for (size_t r = 0; r < n_rows; r++)
                for (size_t c = 0; c < n_cols; c++) {
                        char *cell = cli_cell(
                                lookup(json_array_get(rows, r), columns[c].key), columns[c].format);
                        if (!cell)
                                goto fail;
                        cells[r * n_cols + c] = cell;
                        widths[c] = MAX(widths[c], width(cell));
                }

        f = open_memstream(&buf, &size);
        if (!f)
                goto fail;
        for (size_t r = 0; r <= n_rows; r++) {
                for (size_t c = 0; c < n_cols; c++) {
                        const char *s = r == 0 ? columns[c].header : cells[(r - 1) * n_cols + c];
                        if (c + 1 == n_cols)
                                fputs(s, f);
                        else
                                fprintf(f, "%s%*s", s, (int) (widths[c] - width(s) + 2), "");
                }
                fputc('\n', f);
        }
        if (fclose(f) != 0) {
                free(buf);
                buf = NULL;
        }
fail:
        for (size_t i = 0; i < n_cols * n_rows; i++)
                free(cells[i]);
        return buf;
}

char *cli_object(const json_t *obj) {
        size_t size = 0, w = 0;
        const char *key;
        char *buf = NULL;
        json_t *v;
        FILE *f;

        json_object_foreach((json_t *) obj, key, v) w = MAX(w, strlen(key));
        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        json_object_foreach((json_t *) obj, key, v) {
                _cleanup_free_ char *cell = cli_cell(v, NULL);
                fprintf(f, "%s:%*s %s\n", key, (int) (w - strlen(key)), "", cell ?: "?");
        }
        if (fclose(f) != 0) {
                free(buf);
                return NULL;
        }
        return buf;
}
