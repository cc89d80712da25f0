/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cleanup.h"
#include "flags.h"
#include "fs-util.h"
#include "log.h"
#include "time-util.h"

static char *arg_addr;
static bool arg_enabled;
static usec_t arg_timeout;
static uint32_t arg_limit;
static char *arg_path;

static const Flag table[] = {
        { .name = "listen",
          .env = "TEST_LISTEN",
          .default_value = "127.0.0.1:8080",
          .metavar = "ADDR",
          .help = "listen address",
          .parse = flag_parse_listen,
          .dest = &arg_addr },
        { .name = "enabled",
          .env = "TEST_ENABLED",
          .default_value = "false",
          .help = "a switch",
          .parse = flag_parse_bool,
          .dest = &arg_enabled,
          .is_bool = true },
        { .name = "timeout",
          .env = "TEST_TIMEOUT",
          .default_value = "5m",
          .metavar = "DURATION",
          .help = "a duration",
          .parse = flag_parse_duration,
          .dest = &arg_timeout },
        { .name = "limit",
          .env = "TEST_LIMIT",
          .default_value = "1000",
          .metavar = "N",
          .help = "a count",
          .parse = flag_parse_uint32,
          .dest = &arg_limit },
        { .name = "path",
          .env = "TEST_PATH",
          .default_value = "/mcp",
          .metavar = "PATH",
          .help = "a URL path",
          .parse = flag_parse_url_path,
          .dest = &arg_path },
};

/* Runs flags_parse() with stderr captured; returns its result, *ret_err gets what it printed. */
static int parse(char **argv, char **ret_err) {
        char tmpl[] = "/tmp/test-flags-XXXXXX";
        int argc = 0, saved, fd, r;
        bool help = false;

        while (argv[argc])
                argc++;
        fd = mkstemp(tmpl);
        assert_true(fd >= 0);
        (void) unlink(tmpl);
        fflush(stderr);
        saved = dup(STDERR_FILENO);
        assert_true(saved >= 0);
        assert_true(dup2(fd, STDERR_FILENO) >= 0);

        r = flags_parse(table, ELEMENTSOF(table), argc, argv, "test", &help, /* ret_args= */ NULL);

        fflush(stderr);
        assert_true(dup2(saved, STDERR_FILENO) >= 0);
        close(saved);
        if (ret_err) {
                char path[64];
                snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
                assert_int_equal(read_full_file(path, 1 << 16, ret_err, NULL), 0);
        }
        close(fd);
        return r;
}

static int setup(void **state) {
        unsetenv("TEST_LISTEN");
        unsetenv("TEST_ENABLED");
        unsetenv("TEST_TIMEOUT");
        unsetenv("TEST_LIMIT");
        unsetenv("TEST_PATH");
        return 0;
}

static int teardown(void **state) {
        arg_addr = mfree(arg_addr);
        arg_path = mfree(arg_path);
        return 0;
}

static void test_defaults(void **state) {
        char *argv[] = { NULL };

        assert_int_equal(parse(argv, NULL), 0);
        assert_string_equal(arg_addr, "127.0.0.1:8080");
        assert_false(arg_enabled);
        assert_int_equal(arg_timeout, 5 * USEC_PER_MINUTE);
        assert_int_equal(arg_limit, 1000);
        assert_string_equal(arg_path, "/mcp");
}

static void test_env_then_flags(void **state) {
        char *argv[] = { (char *) "--listen", (char *) "0.0.0.0:9000", (char *) "--timeout=90s", NULL };

        setenv("TEST_LISTEN", "127.0.0.1:7000", 1);
        setenv("TEST_TIMEOUT", "1h", 1);
        setenv("TEST_LIMIT", "7", 1);
        setenv("TEST_ENABLED", "yes", 1);
        assert_int_equal(parse(argv, NULL), 0);
        assert_string_equal(arg_addr, "0.0.0.0:9000"); /* the flag wins */
        assert_int_equal(arg_timeout, 90 * USEC_PER_SEC);
        assert_int_equal(arg_limit, 7); /* the environment beats the default */
        assert_true(arg_enabled);
}

static void test_empty_env_is_unset(void **state) {
        char *argv[] = { NULL };

        setenv("TEST_LIMIT", "", 1);
        assert_int_equal(parse(argv, NULL), 0);
        assert_int_equal(arg_limit, 1000);
}

static void test_bad_env_names_variable(void **state) {
        _cleanup_free_ char *err = NULL;
        char *argv[] = { NULL };

        setenv("TEST_TIMEOUT", "soon", 1);
        assert_int_equal(parse(argv, &err), -EINVAL);
        assert_non_null(strstr(err, "--timeout"));
        assert_non_null(strstr(err, "'soon'"));
        assert_non_null(strstr(err, "$TEST_TIMEOUT"));
}

static void test_bad_flag_names_flag(void **state) {
        _cleanup_free_ char *err = NULL;
        char *argv[] = { (char *) "--limit=-3", NULL };

        assert_int_equal(parse(argv, &err), -EINVAL);
        assert_non_null(strstr(err, "--limit"));
        assert_non_null(strstr(err, "'-3'"));
}

static void test_overflow_rejected(void **state) {
        _cleanup_free_ char *err = NULL;
        char *argv[] = { (char *) "--limit", (char *) "4294967296", NULL };

        assert_int_equal(parse(argv, &err), -EINVAL);
        assert_non_null(strstr(err, "out of range"));
}

static void test_unknown_and_missing(void **state) {
        _cleanup_free_ char *e1 = NULL, *e2 = NULL, *e3 = NULL, *e4 = NULL;
        char *a1[] = { (char *) "--nope", NULL };
        char *a2[] = { (char *) "--limit", NULL };
        char *a3[] = { (char *) "stray", NULL };
        char *a4[] = { (char *) "-x", NULL };

        assert_int_equal(parse(a1, &e1), -EINVAL);
        assert_non_null(strstr(e1, "unknown flag '--nope'"));
        assert_int_equal(parse(a2, &e2), -EINVAL);
        assert_non_null(strstr(e2, "needs a value"));
        assert_int_equal(parse(a3, &e3), -EINVAL);
        assert_non_null(strstr(e3, "unexpected argument 'stray'"));
        assert_int_equal(parse(a4, &e4), -EINVAL);
        assert_non_null(strstr(e4, "unknown flag '-x'"));
}

static void test_bool_forms(void **state) {
        char *a1[] = { (char *) "--enabled", NULL };
        char *a2[] = { (char *) "--enabled=false", NULL };

        assert_int_equal(parse(a1, NULL), 0);
        assert_true(arg_enabled);
        setenv("TEST_ENABLED", "1", 1);
        assert_int_equal(parse(a2, NULL), 0);
        assert_false(arg_enabled);
}

static void test_help_short_circuits(void **state) {
        char *argv[] = { (char *) "--limit=bad", (char *) "--help", NULL };
        bool help = false;

        assert_int_equal(flags_parse(table, ELEMENTSOF(table), 2, argv, "test", &help, NULL), 0);
        assert_true(help);
}

static void test_value_parsers(void **state) {
        const char *reason = NULL;
        char *dir = NULL;
        Flag f = { .name = "x", .dest = &arg_addr };
        Flag d = { .name = "d", .dest = &dir };

        assert_int_equal(flag_parse_listen(&f, "nonsense", &reason), -EINVAL);
        assert_int_equal(flag_parse_listen(&f, "1.2.3.4:99999", &reason), -EINVAL);
        assert_int_equal(flag_parse_listen(&f, "a:b:c", &reason), -EINVAL);
        assert_int_equal(flag_parse_listen(&f, "[::1]:80", &reason), 0);
        assert_int_equal(flag_parse_listen(&f, ":8080", &reason), 0);

        f.dest = &arg_path;
        assert_int_equal(flag_parse_url_path(&f, "mcp", &reason), -EINVAL);
        assert_int_equal(flag_parse_url_path(&f, "/", &reason), -EINVAL);
        assert_int_equal(flag_parse_url_path(&f, "/a//b", &reason), -EINVAL);
        assert_int_equal(flag_parse_url_path(&f, "/a b", &reason), -EINVAL);
        assert_int_equal(flag_parse_url_path(&f, "/x/mcp", &reason), 0);
        assert_string_equal(arg_path, "/x/mcp");

        assert_int_equal(flag_parse_directory(&d, "/var/lib/x//", &reason), 0);
        assert_string_equal(dir, "/var/lib/x");
        assert_int_equal(flag_parse_directory(&d, "rel", &reason), 0);
        assert_true(dir[0] == '/');
        assert_non_null(strstr(dir, "/rel"));
        assert_int_equal(flag_parse_directory(&d, "", &reason), -EINVAL);
        free(dir);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
                cmocka_unit_test_setup_teardown(test_env_then_flags, setup, teardown),
                cmocka_unit_test_setup_teardown(test_empty_env_is_unset, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_env_names_variable, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_flag_names_flag, setup, teardown),
                cmocka_unit_test_setup_teardown(test_overflow_rejected, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unknown_and_missing, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bool_forms, setup, teardown),
                cmocka_unit_test_setup_teardown(test_help_short_circuits, setup, teardown),
                cmocka_unit_test_setup_teardown(test_value_parsers, setup, teardown),
        };
        log_set_max_level(LOG_ERR);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
