/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* "vm-manager serve": parses its flags, runs the daemon until SIGTERM/SIGINT. Returns the process
 * exit status. */
int serve_main(int argc, char **argv);
void serve_help(void);
