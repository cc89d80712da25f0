/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define SD_JOURNAL_SUPPRESS_LOCATION
#include <systemd/sd-journal.h>

#include "cleanup.h"
#include "log.h"
#include "string-table.h"

static int log_max_level = LOG_INFO;
static LogTarget log_target = LOG_TARGET_AUTO;
static int log_journal_detected = -1; /* -1: not yet checked */

static const char *const log_level_table[] = {
        [LOG_EMERG] = "emerg",     [LOG_ALERT] = "alert",   [LOG_CRIT] = "crit", [LOG_ERR] = "error",
        [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice", [LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

void log_set_max_level(int level) {
        assert(level >= LOG_EMERG && level <= LOG_DEBUG);
        log_max_level = level;
}

int log_get_max_level(void) {
        return log_max_level;
}

void log_set_target(LogTarget target) {
        assert(target >= 0 && target < _LOG_TARGET_MAX);
        log_target = target;
        log_journal_detected = -1;
}

static bool stderr_is_journal(void) {
        const char *e = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;

        if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2)
                return false;
        if (fstat(STDERR_FILENO, &st) < 0)
                return false;
        return (unsigned long long) st.st_dev == dev && (unsigned long long) st.st_ino == ino;
}

LogTarget log_get_target(void) {
        if (log_target != LOG_TARGET_AUTO)
                return log_target;
        if (log_journal_detected < 0)
                log_journal_detected = stderr_is_journal();
        return log_journal_detected ? LOG_TARGET_JOURNAL : LOG_TARGET_STDERR;
}

int log_level_from_string(const char *s) {
        ssize_t i = string_table_lookup(log_level_table, ELEMENTSOF(log_level_table), s);

        if (i >= 0)
                return (int) i;
        if (!s)
                return -EINVAL;
        /* the aliases and numbers syslog knows them by */
        if (streq(s, "warn"))
                return LOG_WARNING;
        if (streq(s, "err"))
                return LOG_ERR;
        if (s[0] >= '0' && s[0] <= '7' && s[1] == 0)
                return s[0] - '0';
        return -EINVAL;
}

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(log_level, int);

/* Writes value for the key=value format: bare when it is a plain token, else double-quoted with
 * backslash escapes. Control characters never reach the terminal raw. */
static void write_value(FILE *f, const char *v) {
        bool plain = *v != 0;

        for (const char *p = v; *p; p++)
                if ((unsigned char) *p <= ' ' || *p == '"' || *p == '=' || *p == '\\' ||
                    (unsigned char) *p == 0x7f) {
                        plain = false;
                        break;
                }
        if (plain) {
                fputs(v, f);
                return;
        }
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) v; *p; p++) {
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p == '\n')
                        fputs("\\n", f);
                else if (*p == '\t')
                        fputs("\\t", f);
                else if (*p < ' ' || *p == 0x7f)
                        fprintf(f, "\\x%02x", *p);
                else
                        fputc(*p, f);
        }
        fputc('"', f);
}

static const char *basename_of(const char *path) {
        const char *s = strrchr(path, '/');
        return s ? s + 1 : path;
}

static void log_to_stderr(
        int level, int error, const char *file, int line, const LogField *fields, const char *msg) {
        char ts[64];
        struct timespec now;
        struct tm tm;
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        _cleanup_fclose_ FILE *f = NULL;

        (void) clock_gettime(CLOCK_REALTIME, &now);
        (void) gmtime_r(&now.tv_sec, &tm);
        (void) strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);

        /* Assemble the line in memory first so concurrent writers (child processes sharing stderr)
         * never interleave within a line. */
        f = open_memstream(&buf, &size);
        if (!f)
                return;
        fprintf(f, "time=%s.%03ldZ level=%s msg=", ts, now.tv_nsec / 1000000, log_level_to_string(level));
        write_value(f, msg);
        for (const LogField *i = fields; i && i->key; i++) {
                fputc(' ', f);
                for (const char *k = i->key; *k; k++)
                        fputc(tolower((unsigned char) *k), f);
                fputc('=', f);
                write_value(f, i->value ?: "");
        }
        if (error != 0)
                fprintf(f, " errno=%d", ABS(error));
        if (log_max_level >= LOG_DEBUG)
                fprintf(f, " src=%s:%d", basename_of(file), line);
        fputc('\n', f);
        if (fclose(TAKE_PTR(f)) != 0)
                return;
        (void) !write(STDERR_FILENO, buf, size);
}

static void log_to_journal(
        int level, int error, const char *file, int line, const char *func, const LogField *fields, const char *msg) {
        size_t n = 0, nfields = 0;

        for (const LogField *i = fields; i && i->key; i++)
                nfields++;

        _cleanup_free_ struct iovec *iov = calloc(7 + nfields, sizeof(struct iovec));
        _cleanup_free_ char *m = NULL, *p = NULL, *cf = NULL, *cl = NULL, *cfn = NULL, *e = NULL;
        _cleanup_strv_free_ char **extra = calloc(nfields + 1, sizeof(char *));

        if (!iov || !extra)
                return;
        if (asprintf(&m, "MESSAGE=%s", msg) < 0 || asprintf(&p, "PRIORITY=%d", level) < 0 ||
            asprintf(&cf, "CODE_FILE=%s", file) < 0 || asprintf(&cl, "CODE_LINE=%d", line) < 0 ||
            asprintf(&cfn, "CODE_FUNC=%s", func) < 0)
                return;
        iov[n++] = (struct iovec){ m, strlen(m) };
        iov[n++] = (struct iovec){ p, strlen(p) };
        iov[n++] = (struct iovec){ cf, strlen(cf) };
        iov[n++] = (struct iovec){ cl, strlen(cl) };
        iov[n++] = (struct iovec){ cfn, strlen(cfn) };
        iov[n++] = (struct iovec){ (char *) "SYSLOG_IDENTIFIER=vm-manager",
                                   strlen("SYSLOG_IDENTIFIER=vm-manager") };
        if (error != 0) {
                if (asprintf(&e, "ERRNO=%d", ABS(error)) < 0)
                        return;
                iov[n++] = (struct iovec){ e, strlen(e) };
        }
        size_t k = 0;
        for (const LogField *i = fields; i && i->key; i++) {
                if (asprintf(&extra[k], "%s=%s", i->key, i->value ?: "") < 0)
                        return;
                iov[n++] = (struct iovec){ extra[k], strlen(extra[k]) };
                k++;
        }
        (void) sd_journal_sendv(iov, (int) n);
}

int log_internal(
        int level,
        int error,
        const char *file,
        int line,
        const char *func,
        const LogField *fields,
        const char *format,
        ...) {
        char msg[2048];
        va_list ap;
        int saved_errno = errno;

        /* %m prints the error this record is about, not whatever errno happens to hold. */
        errno = ABS(error);
        va_start(ap, format);
        (void) vsnprintf(msg, sizeof(msg), format, ap);
        va_end(ap);

        if (log_get_target() == LOG_TARGET_JOURNAL)
                log_to_journal(level, error, file, line, func, fields, msg);
        else
                log_to_stderr(level, error, file, line, fields, msg);

        errno = saved_errno;
        return -ABS(error);
}
