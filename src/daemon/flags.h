/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdio.h>

#include "macro.h"

/* One table describes every flag of a command: its name, its environment fallback, its default, its
 * help text and the parser that stores it. Defaults are applied first, then the environment, then
 * the command line, so flags win. A value that does not parse is an error that names the flag and
 * the value, wherever it came from. */

typedef struct Flag Flag;

/* Parses value into f->dest. Returns < 0 and, optionally, a short reason in *ret_reason (static). */
typedef int (*FlagParser)(const Flag *f, const char *value, const char **ret_reason);

struct Flag {
        const char *name;          /* without the leading "--" */
        const char *env;           /* environment fallback, or NULL */
        const char *default_value; /* parsed when nothing else sets the flag; NULL: leave dest as it is */
        const char *default_help;  /* shown in --help instead of default_value, when that is computed */
        const char *metavar;       /* shown in --help, e.g. "ADDR"; NULL for booleans */
        const char *help;
        FlagParser parse;
        void *dest;
        bool is_bool; /* "--flag" alone means true */
};

/* Parses argv (after the command name) against the table. Positional arguments are collected into
 * *ret_args (borrowed pointers into argv, NULL-terminated; may be NULL when none are allowed). Sets
 * *ret_help when --help/-h was given, in which case nothing else is validated. Errors are printed
 * to stderr prefixed with prog, and returned as -EINVAL. */
int flags_parse(
        const Flag *table, size_t n_table, int argc, char **argv, const char *prog, bool *ret_help, char ***ret_args);

void flags_print_help(FILE *f, const Flag *table, size_t n_table);

/* Standard parsers. */
int flag_parse_string(const Flag *f, const char *value, const char **ret_reason);    /* char ** */
int flag_parse_bool(const Flag *f, const char *value, const char **ret_reason);      /* bool * */
int flag_parse_duration(const Flag *f, const char *value, const char **ret_reason);  /* usec_t * */
int flag_parse_uint32(const Flag *f, const char *value, const char **ret_reason);    /* uint32_t * */
int flag_parse_log_level(const Flag *f, const char *value, const char **ret_reason); /* int * */
int flag_parse_listen(const Flag *f, const char *value, const char **ret_reason);    /* char ** */
int flag_parse_url_path(const Flag *f, const char *value, const char **ret_reason);  /* char ** */
int flag_parse_directory(const Flag *f, const char *value, const char **ret_reason); /* char **, made absolute */
