/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>

/* Tables for people: one row per object of a JSON array, one column per key, padded to the widest
 * cell, headers in capitals. Pure: it returns the text and writes nothing. */

typedef struct CliColumn {
        const char *header;
        const char *key; /* a key of the object, or "a.b" for a key of an object inside it */
        /* How a value is shown, when not as it is: NULL, or one of "count" (an array's or object's
         * size), "mib" (an integer of MiB as "2 GiB"/"512 MiB"). */
        const char *format;
} CliColumn;

/* The cell of one value: strings as they are (control characters as '?', so that a guest-set string
 * cannot drive the terminal), numbers and booleans as JSON, null or absent as "-", arrays of
 * strings joined with ",", anything else as compact JSON. A new string, NULL on OOM. */
char *cli_cell(const json_t *v, const char *format);

/* The table of rows (a JSON array of objects), NULL-terminated columns by header; "No <what>.\n"
 * for an empty array. A new string, NULL on OOM. */
char *cli_table(const json_t *rows, const CliColumn *columns, const char *what);

/* One object as "key: value" lines, keys aligned, scalar values as cells, nested values as compact
 * JSON. A new string, NULL on OOM. */
char *cli_object(const json_t *obj);
