/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "macro.h"

/* Removes what a terminal would interpret rather than show: escape sequences (CSI "ESC [ … final",
 * OSC "ESC ] … BEL or ESC \", and the others: "ESC", intermediate bytes, a final byte), and control
 * characters other than newline and tab. Carriage returns go too, so that "\r\n" line ends become "\n". In
 * place; returns s. */
char *strip_terminal_escapes(char *s);

/* FNV-1a, 32 bits, of a NUL-terminated string: a stable, cheap spread of names (not a secure hash). */
uint32_t fnv1a_32(const char *s) _pure_;

/* The strings of l joined with sep between them; "" for an empty or NULL l. A new string, NULL on OOM. */
char *strv_join(char *const *l, const char *sep);
/* A deep copy of l (NULL-terminated; NULL copies as empty), freed with strv_free(); NULL on OOM. */
char **strv_copy(char *const *l);
