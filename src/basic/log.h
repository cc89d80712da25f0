/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <syslog.h>

#include "macro.h"

/* One structured field of a log record: KEY is upper case (journal style); the stderr backend
 * prints it in lower case as key=value. */
typedef struct LogField {
        const char *key;
        const char *value;
} LogField;

typedef enum LogTarget {
        LOG_TARGET_AUTO, /* journal when stderr is connected to it, else stderr */
        LOG_TARGET_JOURNAL,
        LOG_TARGET_STDERR,
        _LOG_TARGET_MAX,
        _LOG_TARGET_INVALID = -EINVAL,
} LogTarget;

void log_set_max_level(int level);
int log_get_max_level(void);
void log_set_target(LogTarget target);
/* Decides AUTO: journal if $JOURNAL_STREAM names our stderr. */
LogTarget log_get_target(void);

/* Parses "debug", "info", "notice", "warning", "error" (and syslog's numeric 0-7). */
int log_level_from_string(const char *s);
const char *log_level_to_string(int level);

/* Writes one record. Returns -ABS(error), so that "return log_error_errno(r, ...)" works. */
int log_internal(
        int level,
        int error,
        const char *file,
        int line,
        const char *func,
        const LogField *fields,
        const char *format,
        ...) _printf_(7, 8);

#define LOG_FIELDS(...)         \
        ((const LogField[]){    \
                __VA_ARGS__,    \
                { NULL, NULL }, \
        })

#define log_full_errno_fields(level, error, fields, ...)                                              \
        ({                                                                                            \
                int _level = (level), _e = (error);                                                   \
                _level <= log_get_max_level() ?                                                       \
                        log_internal(_level, _e, __FILE__, __LINE__, __func__, fields, __VA_ARGS__) : \
                        -ABS(_e);                                                                     \
        })

#define log_full_errno(level, error, ...) log_full_errno_fields(level, error, NULL, __VA_ARGS__)
#define log_full(level, ...) (void) log_full_errno(level, 0, __VA_ARGS__)

#define log_debug(...) log_full(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_full(LOG_INFO, __VA_ARGS__)
#define log_notice(...) log_full(LOG_NOTICE, __VA_ARGS__)
#define log_warning(...) log_full(LOG_WARNING, __VA_ARGS__)
#define log_error(...) log_full(LOG_ERR, __VA_ARGS__)

#define log_debug_errno(error, ...) log_full_errno(LOG_DEBUG, error, __VA_ARGS__)
#define log_info_errno(error, ...) log_full_errno(LOG_INFO, error, __VA_ARGS__)
#define log_notice_errno(error, ...) log_full_errno(LOG_NOTICE, error, __VA_ARGS__)
#define log_warning_errno(error, ...) log_full_errno(LOG_WARNING, error, __VA_ARGS__)
#define log_error_errno(error, ...) log_full_errno(LOG_ERR, error, __VA_ARGS__)

/* log_struct(LOG_INFO, LOG_FIELDS({ "VM_ID", id }), "vm %s started", id) */
#define log_struct(level, fields, ...) (void) log_full_errno_fields(level, 0, fields, __VA_ARGS__)

#define log_oom() log_error_errno(ENOMEM, "Out of memory.")

/* Marks an errno as meant for logging only, matching systemd's idiom. */
#define SYNTHETIC_ERRNO(num) (num)
