/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <syslog.h>

#include "macro.h"

/* The agent's own logging: plain lines on stderr ("vm-agent: …"). It does not use basic/log.c, whose
 * journal backend would make libsystemd a dependency of a binary that runs in the initrd. */
void agent_log_set_max_level(int level);
int agent_log_get_max_level(void);
void agent_log_internal(int level, const char *format, ...) _printf_(2, 3);

#define agent_log(level, ...)                                     \
        do {                                                      \
                if ((level) <= agent_log_get_max_level())         \
                        agent_log_internal((level), __VA_ARGS__); \
        } while (false)

#define agent_debug(...) agent_log(LOG_DEBUG, __VA_ARGS__)
#define agent_info(...) agent_log(LOG_INFO, __VA_ARGS__)
#define agent_warning(...) agent_log(LOG_WARNING, __VA_ARGS__)

/* Reads a whole file of at most max bytes (also files whose st_size is 0, as in securityfs).
 * -ENOENT when it does not exist, -EFBIG when it is larger than max. */
int read_file_capped(const char *path, size_t max, uint8_t **ret, size_t *ret_size);

/* Text from a peer, made fit for one line of a message: surrounding whitespace trimmed and at most
 * max bytes kept. Returns a new string or NULL on OOM. */
char *text_trim(const void *data, size_t size, size_t max);
