/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* vm-manager image golden IMAGE (--from-vm ID | --clear): argv after "image". */
int image_main(int argc, char **argv);
void image_golden_help(void);
