/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* "vm-manager serve": parses its flags, runs the daemon until SIGTERM/SIGINT. Returns the process
 * exit status. */
int serve_main(int argc, char **argv);
void serve_help(void);
/* The state directory serve uses when none is given. */
int default_state_dir(char **ret);
