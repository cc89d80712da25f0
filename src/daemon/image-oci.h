/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* vm-manager image push [FLAGS] IMAGE REF and vm-manager image pull [FLAGS] REF: argv after the
 * subcommand's name. */
int image_push_main(int argc, char **argv);
int image_pull_main(int argc, char **argv);
void image_push_help(void);
void image_pull_help(void);
/* The summary of every image subcommand (golden, push, pull). */
void image_help(void);
