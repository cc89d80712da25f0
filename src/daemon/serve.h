/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The address serve listens on when neither --listen nor $VM_MANAGER_LISTEN says: also where the
 * client commands (vm, network, image list, host) look for the daemon by default. */
#define SERVE_LISTEN_DEFAULT "127.0.0.1:8080"

/* "vm-manager serve": parses its flags, runs the daemon until SIGTERM/SIGINT. Returns the process
 * exit status. */
int serve_main(int argc, char **argv);
void serve_help(void);
/* The state directory serve uses when none is given. */
int default_state_dir(char **ret);
