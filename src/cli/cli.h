/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdio.h>

/* The client commands of the vm-manager binary: `vm-manager vm|network|image list|host …` against a
 * running daemon over its REST API. A separate process from the daemon, so it may block: it waits on
 * one HTTP request at a time (two while vm create shows progress), with libcurl.
 *
 * Where the daemon is: --url, else $VM_MANAGER_URL, else http://<$VM_MANAGER_LISTEN>, else
 * http://<default_listen> (serve's own default). A bearer token (--enable-oauth daemons): the
 * contents of --token-file or $VM_MANAGER_TOKEN_FILE, else $VM_MANAGER_TOKEN.
 *
 * Exit status (cli_exit_code()): 0 success; 1 internal_error or an answer that is not the API's;
 * 2 a usage error of the command line; 3 invalid_request; 4 not_found; 5 conflict; 6 unsupported;
 * 7 timeout; 8 vm_failed; 9 unauthorized; 10 the daemon cannot be reached. vm exec exits with the
 * command's own status, and 255 when it could not run it (as ssh does). */

enum {
        CLI_EXIT_OK = 0,
        CLI_EXIT_INTERNAL = 1,
        CLI_EXIT_USAGE = 2,
        CLI_EXIT_INVALID_REQUEST = 3,
        CLI_EXIT_NOT_FOUND = 4,
        CLI_EXIT_CONFLICT = 5,
        CLI_EXIT_UNSUPPORTED = 6,
        CLI_EXIT_TIMEOUT = 7,
        CLI_EXIT_VM_FAILED = 8,
        CLI_EXIT_UNAUTHORIZED = 9,
        CLI_EXIT_UNREACHABLE = 10,
        CLI_EXIT_EXEC_FAILED = 255,
};

/* The exit status of an API error code ("not_found"…); unknown codes are internal. */
int cli_exit_code(const char *code);

/* The daemon's URL from the flag, the environment and the default, as described above; "http://"
 * is added to a bare host:port, and a wildcard listener's host becomes loopback. A new string. */
char *cli_base_url(const char *flag, const char *env_url, const char *env_listen, const char *default_listen);

/* `vm-manager GROUP …` (argv[0] is the group). */
int cli_main(int argc, char **argv, const char *default_listen);
/* Whether GROUP is a client command group (vm, network, host; image only with "list"). */
bool cli_handles(int argc, char **argv);
void cli_help(FILE *f);
