/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

#include "cleanup.h"
#include "log.h"

static size_t count_char(const char *s, char c) {
        size_t n = 0;

        for (; *s; s++)
                if (*s == c)
                        n++;
        return n;
}

/* Checks that out is exactly one line "time=<RFC 3339 UTC, milliseconds> <rest>" and returns rest. */
static const char *check_line(const char *out) {
        regex_t re;
        regmatch_t m;

        assert_int_equal(count_char(out, '\n'), 1);
        assert_true(out[strlen(out) - 1] == '\n');
        assert_int_equal(
                regcomp(&re,
                        "^time=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z ",
                        REG_EXTENDED),
                0);
        int r = regexec(&re, out, 1, &m, 0);
        regfree(&re);
        if (r != 0)
                fail_msg("no timestamp at the start of \"%s\"", out);
        return out + m.rm_eo;
}

static int setup(void **state) {
        log_set_target(LOG_TARGET_STDERR);
        log_set_max_level(LOG_INFO);
        return 0;
}

static void test_level_from_string(void **state) {
        static const struct {
                const char *s;
                int level;
        } cases[] = {
                { "emerg", LOG_EMERG },  { "alert", LOG_ALERT },   { "crit", LOG_CRIT },
                { "error", LOG_ERR },    { "err", LOG_ERR },       { "warning", LOG_WARNING },
                { "warn", LOG_WARNING }, { "notice", LOG_NOTICE }, { "info", LOG_INFO },
                { "debug", LOG_DEBUG },  { "0", LOG_EMERG },       { "3", LOG_ERR },
                { "6", LOG_INFO },       { "7", LOG_DEBUG },
        };
        static const char *const invalid[] = { "",    "8",     "-1",    "07",    "66",
                                               "inf", "infos", " info", "info ", "verbose" };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++)
                assert_int_equal(log_level_from_string(cases[i].s), cases[i].level);
        for (size_t i = 0; i < ELEMENTSOF(invalid); i++)
                assert_errno(log_level_from_string(invalid[i]), -EINVAL);
        assert_errno(log_level_from_string(NULL), -EINVAL);
}

static void test_level_to_string(void **state) {
        assert_string_equal(log_level_to_string(LOG_EMERG), "emerg");
        assert_string_equal(log_level_to_string(LOG_ERR), "error");
        assert_string_equal(log_level_to_string(LOG_WARNING), "warning");
        assert_string_equal(log_level_to_string(LOG_NOTICE), "notice");
        assert_string_equal(log_level_to_string(LOG_INFO), "info");
        assert_string_equal(log_level_to_string(LOG_DEBUG), "debug");
        assert_null(log_level_to_string(-1));
        assert_null(log_level_to_string(LOG_DEBUG + 1));

        /* Every level survives a round trip through its name. */
        for (int l = LOG_EMERG; l <= LOG_DEBUG; l++) {
                const char *s = log_level_to_string(l);

                assert_non_null(s);
                assert_int_equal(log_level_from_string(s), l);
        }
}

static void test_max_level(void **state) {
        log_set_max_level(LOG_DEBUG);
        assert_int_equal(log_get_max_level(), LOG_DEBUG);
        log_set_max_level(LOG_WARNING);
        assert_int_equal(log_get_max_level(), LOG_WARNING);
}

static void test_stderr_plain(void **state) {
        _cleanup_free_ char *out = NULL;
        TestCapture c;

        test_capture_start(&c);
        log_info("started");
        out = test_capture_end(&c);

        assert_string_equal(check_line(out), "level=info msg=started\n");
}

static void test_stderr_fields_and_escaping(void **state) {
        _cleanup_free_ char *out = NULL;
        TestCapture c;

        test_capture_start(&c);
        log_struct(
                LOG_WARNING,
                LOG_FIELDS(
                        { "VM_ID", "vm-1" },
                        { "NOTE", "say \"hi\"\nbye" },
                        { "EXPR", "a=b" },
                        { "PATH", "C:\\dir" },
                        { "TAB", "a\tb" },
                        { "CTRL", "\x01\x1b[31m\x7f" },
                        { "EMPTY", "" },
                        { "UNSET", NULL }),
                "hello %s",
                "world");
        out = test_capture_end(&c);

        assert_string_equal(
                check_line(out),
                "level=warning msg=\"hello world\" vm_id=vm-1 note=\"say \\\"hi\\\"\\nbye\" expr=\"a=b\""
                " path=\"C:\\\\dir\" tab=\"a\\tb\" ctrl=\"\\x01\\x1b[31m\\x7f\" empty=\"\" unset=\"\"\n");
}

static void test_stderr_message_escaping(void **state) {
        _cleanup_free_ char *out = NULL;
        TestCapture c;

        /* A message can never forge a second record or a field of its own. */
        test_capture_start(&c);
        log_error("line one\ntime=x level=emerg msg=forged");
        out = test_capture_end(&c);

        assert_string_equal(check_line(out), "level=error msg=\"line one\\ntime=x level=emerg msg=forged\"\n");
}

static void test_stderr_long_message(void **state) {
        _cleanup_free_ char *out = NULL, *big = malloc(10001);
        TestCapture c;

        assert_non_null(big);
        memset(big, 'x', 10000);
        big[10000] = 0;

        test_capture_start(&c);
        log_info("%s", big);
        out = test_capture_end(&c);

        /* Possibly cut, but still one well-formed line. */
        const char *rest = check_line(out);
        assert_startswith(rest, "level=info msg=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
        assert_int_equal(count_char(rest, ' '), 1);
}

static void test_below_max_level_dropped(void **state) {
        _cleanup_free_ char *out = NULL, *out2 = NULL;
        TestCapture c;

        test_capture_start(&c);
        log_debug("not shown");
        int r = log_debug_errno(EIO, "not shown either: %m");
        log_set_max_level(LOG_WARNING);
        log_info("hidden");
        log_notice("hidden");
        log_warning("shown");
        log_error("shown too");
        out = test_capture_end(&c);

        assert_errno(r, -EIO);
        assert_int_equal(count_char(out, '\n'), 2);
        assert_null(strstr(out, "hidden"));
        assert_null(strstr(out, "not shown"));
        assert_non_null(strstr(out, "level=warning msg=shown\n"));
        assert_non_null(strstr(out, "level=error msg=\"shown too\"\n"));

        log_set_max_level(LOG_ERR);
        test_capture_start(&c);
        log_warning("hidden");
        out2 = test_capture_end(&c);
        assert_string_equal(out2, "");
}

static void test_errno(void **state) {
        _cleanup_free_ char *out = NULL, *out2 = NULL;
        TestCapture c;
        int r, r2;

        errno = ENOENT;
        test_capture_start(&c);
        r = log_error_errno(EPERM, "cannot open %s: %m", "disk.qcow2");
        out = test_capture_end(&c);

        assert_errno(r, -EPERM);
        /* The caller's errno is left alone. */
        assert_int_equal(errno, ENOENT);
        assert_string_equal(
                check_line(out),
                "level=error msg=\"cannot open disk.qcow2: Operation not permitted\" errno=1\n");

        /* A negative error is the same error. */
        test_capture_start(&c);
        r2 = log_warning_errno(-ECONNREFUSED, "qmp: %m");
        out2 = test_capture_end(&c);

        assert_errno(r2, -ECONNREFUSED);
        assert_string_equal(check_line(out2), "level=warning msg=\"qmp: Connection refused\" errno=111\n");
}

static void test_log_oom(void **state) {
        _cleanup_free_ char *out = NULL;
        TestCapture c;

        test_capture_start(&c);
        int r = log_oom();
        out = test_capture_end(&c);

        assert_errno(r, -ENOMEM);
        assert_string_equal(check_line(out), "level=error msg=\"Out of memory.\" errno=12\n");
}

static void test_debug_names_source(void **state) {
        _cleanup_free_ char *out = NULL, *expected = NULL;
        TestCapture c;

        log_set_max_level(LOG_DEBUG);
        test_capture_start(&c);
        const int line = __LINE__ + 1;
        log_debug("checking");
        out = test_capture_end(&c);

        assert_true(asprintf(&expected, "level=debug msg=checking src=test-log.c:%d\n", line) > 0);
        assert_string_equal(check_line(out), expected);
}

static void test_target_auto(void **state) {
        _cleanup_free_ char *stream = NULL;
        struct stat st;

        assert_ok(RET_NERRNO(fstat(STDERR_FILENO, &st)));

        /* systemd sets $JOURNAL_STREAM to the device:inode of the stream it gave us as stderr. */
        assert_true(
                asprintf(&stream, "%llu:%llu", (unsigned long long) st.st_dev, (unsigned long long) st.st_ino) >
                0);
        assert_ok(setenv("JOURNAL_STREAM", stream, 1));
        log_set_target(LOG_TARGET_AUTO);
        assert_int_equal(log_get_target(), LOG_TARGET_JOURNAL);

        /* A stream inherited from further up (stderr redirected since) does not count. */
        assert_ok(setenv("JOURNAL_STREAM", "1:1", 1));
        log_set_target(LOG_TARGET_AUTO);
        assert_int_equal(log_get_target(), LOG_TARGET_STDERR);

        assert_ok(unsetenv("JOURNAL_STREAM"));
        log_set_target(LOG_TARGET_AUTO);
        assert_int_equal(log_get_target(), LOG_TARGET_STDERR);

        /* An explicit target wins over the environment. */
        assert_ok(setenv("JOURNAL_STREAM", stream, 1));
        log_set_target(LOG_TARGET_STDERR);
        assert_int_equal(log_get_target(), LOG_TARGET_STDERR);
        assert_ok(unsetenv("JOURNAL_STREAM"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup(test_level_from_string, setup),
                cmocka_unit_test_setup(test_level_to_string, setup),
                cmocka_unit_test_setup(test_max_level, setup),
                cmocka_unit_test_setup(test_stderr_plain, setup),
                cmocka_unit_test_setup(test_stderr_fields_and_escaping, setup),
                cmocka_unit_test_setup(test_stderr_message_escaping, setup),
                cmocka_unit_test_setup(test_stderr_long_message, setup),
                cmocka_unit_test_setup(test_below_max_level_dropped, setup),
                cmocka_unit_test_setup(test_errno, setup),
                cmocka_unit_test_setup(test_log_oom, setup),
                cmocka_unit_test_setup(test_debug_names_source, setup),
                cmocka_unit_test_setup(test_target_auto, setup),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
