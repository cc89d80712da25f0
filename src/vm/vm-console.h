/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>

/* The guest's serial console (QEMU's -serial file, console.log), read by the daemon while a boot has
 * not reported ready: a kernel panic there ends the install or the boot at once, instead of the
 * install or boot timeout. The bytes are the guest's: anything at all. */

#define VM_CONSOLE_PANIC_MARKER "Kernel panic - not syncing"
#define VM_CONSOLE_PANIC_LINE_MAX 200U /* of the line kept for lastError */

/* Looks for the kernel's panic line in buf (n bytes of the console, the part not yet looked at).
 * Returns 1 with the line in *ret_line (from the marker to its end, control characters and bytes
 * beyond ASCII left out, at most VM_CONSOLE_PANIC_LINE_MAX bytes) once the line is complete: a line
 * end follows, or the line is that long already. Otherwise 0, and *ret_done says how many bytes the
 * next look may skip: all but a tail that could be the start of the marker, or the marker's line
 * that is still being written. -ENOMEM. */
int vm_console_find_panic(const char *buf, size_t n, size_t *ret_done, char **ret_line);
