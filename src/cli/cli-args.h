/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "operation.h"

/* The client's commands (`vm-manager vm list`, `network create`…), each one operation of the table:
 * its flags are the operation's parameters (name with dashes, type, description), so the command line
 * cannot drift from REST and MCP. A few parameters are better given as files (user_data, keys): a
 * command names those in files[]. Pure: parsing touches no network and no file. */

/* A parameter given as a file: the flag names the file and the value is its contents (user_data)
 * or its non-empty lines (an array, ssh_authorized_keys); "-" is stdin. */
typedef struct CliFileFlag {
        const char *param;
        const char *flag; /* without "--" */
        const char *help;
} CliFileFlag;

typedef struct CliCommand {
        const char *group;        /* "vm", "network", "image", "host" */
        const char *verb;         /* NULL for `vm-manager host` */
        const char *op;           /* the operation's name; NULL: the command is the client's own (shell) */
        const char *positional;   /* the parameter given as the one positional argument (NAME, ID) */
        const char *summary;      /* one line for the command list; the op's description is the help */
        const char *help;         /* the help instead of the op's description, for a command that is not
                                   * that operation (vm shell takes get_vm's parameters only) */
        const CliFileFlag *files; /* terminated by a NULL param, or NULL */
        bool rest_argv;           /* takes "-- CMD…" into the op's command parameter */
        const char *const *extra_flags; /* the client's own flags, "name\tMETAVAR\thelp" (METAVAR
                                         * empty for a boolean), NULL-terminated */
} CliCommand;

const CliCommand *cli_commands(size_t *ret_n);
const CliCommand *cli_command_find(const char *group, const char *verb);
/* How usage lines show the positional argument: "NAME", "NAME -- CMD..." (rest_argv), or NULL. */
const char *cli_command_metavar(const CliCommand *c);

/* The flag of a parameter: "memory_mib" → "memory-mib". buf holds at least strlen(name) + 1. */
void cli_flag_name(const char *param, char *buf);

/* A command line parsed against a command. args holds the operation's arguments as JSON (strings,
 * integers, booleans, arrays, maps; files only named: file_paths maps a parameter to the path to
 * read); extra holds the client's own flags (name → string, or true). */
typedef struct CliParsed {
        json_t *args;
        json_t *file_paths;
        json_t *extra;
        bool help;
} CliParsed;

void cli_parsed_done(CliParsed *p);

/* Parses argv (after the verb). Errors are -EINVAL with a message in *ret_error (malloc()ed),
 * naming the flag or argument. */
int cli_parse(const CliCommand *c, int argc, char **argv, CliParsed *ret, char **ret_error);

void cli_command_help(FILE *f, const CliCommand *c);
