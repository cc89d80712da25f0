/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "cli-args.h"
#include "cli-table.h"
#include "cli.h"

static int parse(const char *group, const char *verb, char **argv, CliParsed *ret, char **ret_error) {
        const CliCommand *c = cli_command_find(group, verb);
        int argc = 0;

        assert_non_null(c);
        while (argv[argc])
                argc++;
        return cli_parse(c, argc, argv, ret, ret_error);
}

/* Flags come from create_vm's declaration: names with dashes, typed values, booleans both ways. */
static void test_create_flags(void **state) {
        _cleanup_(cli_parsed_done) CliParsed p = {};
        _cleanup_free_ char *error = NULL, *dump = NULL;
        char *argv[] = { (char *) "web",
                         (char *) "--memory-mib",
                         (char *) "512",
                         (char *) "--cpus=4",
                         (char *) "--no-require-attestation",
                         (char *) "--metadata",
                         (char *) "team=infra",
                         (char *) "--ssh-key",
                         (char *) "a.pub",
                         (char *) "--ssh-key=b.pub",
                         (char *) "--no-wait",
                         NULL };

        assert_int_equal(parse("vm", "create", argv, &p, &error), 0);
        dump = json_dumps(p.args, JSON_COMPACT | JSON_SORT_KEYS);
        assert_string_equal(
                dump,
                "{\"cpus\":4,\"memory_mib\":512,\"metadata\":{\"team\":\"infra\"},\"name\":\"web\","
                "\"require_attestation\":false}");
        free(dump);
        dump = json_dumps(p.file_paths, JSON_COMPACT | JSON_SORT_KEYS);
        assert_string_equal(dump, "{\"ssh_authorized_keys\":[\"a.pub\",\"b.pub\"]}");
        assert_true(json_is_true(json_object_get(p.extra, "no-wait")));
}

static void test_errors_name_the_flag(void **state) {
        static const struct {
                const char *group, *verb;
                const char *argv[4];
                const char *error;
        } cases[] = {
                { "vm", "create", { "web", "--cpus", "many" }, "--cpus: 'many' is not an integer" },
                { "vm",
                  "create",
                  { "web", "--require-attestation=maybe" },
                  "--require-attestation: 'maybe' is not a boolean (true or false)" },
                { "vm", "create", { "web", "--bogus" }, "unknown flag '--bogus'" },
                { "vm", "create", { "web", "--metadata", "novalue" }, "--metadata: 'novalue' is not KEY=VALUE" },
                { "vm", "create", { "web", "--image" }, "--image needs a value" },
                { "vm", "create", { "--cpus", "2" }, "missing NAME" },
                { "vm", "get", { "a", "b" }, "unexpected argument 'b'" },
                { "vm", "exec", { "a" }, "no command: give it after --, e.g. -- uptime" },
                { "vm", "create", { "web", "--name", "x" }, "unknown flag '--name'" }, /* the positional's */
                { "vm", "console", { "web", "--follow=yes" }, "--follow takes no value" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(cli_parsed_done) CliParsed p = {};
                _cleanup_free_ char *error = NULL;
                char *argv[5] = {};

                for (size_t j = 0; j < 4 && cases[i].argv[j]; j++)
                        argv[j] = (char *) cases[i].argv[j];
                assert_int_equal(parse(cases[i].group, cases[i].verb, argv, &p, &error), -EINVAL);
                assert_string_equal(error, cases[i].error);
        }
}

/* Everything after "--" (or after the VM) is the command, flags of its own included. */
static void test_exec_command(void **state) {
        _cleanup_(cli_parsed_done) CliParsed p = {}, q = {};
        _cleanup_free_ char *error = NULL, *dump = NULL;
        char *argv[] = { (char *) "web",
                         (char *) "--timeout-seconds",
                         (char *) "5",
                         (char *) "--",
                         (char *) "ls",
                         (char *) "--help",
                         NULL };
        char *argv2[] = { (char *) "web", (char *) "uname", (char *) "-a", NULL };

        assert_int_equal(parse("vm", "exec", argv, &p, &error), 0);
        assert_false(p.help);
        dump = json_dumps(p.args, JSON_COMPACT | JSON_SORT_KEYS);
        assert_string_equal(dump, "{\"command\":[\"ls\",\"--help\"],\"id\":\"web\",\"timeout_seconds\":5}");
        free(dump);
        assert_int_equal(parse("vm", "exec", argv2, &q, &error), 0);
        dump = json_dumps(json_object_get(q.args, "command"), JSON_COMPACT);
        assert_string_equal(dump, "[\"uname\",\"-a\"]");
}

static void test_help_and_commands(void **state) {
        _cleanup_(cli_parsed_done) CliParsed p = {};
        _cleanup_free_ char *error = NULL;
        char *argv[] = { (char *) "--bogus", (char *) "--help", NULL };
        size_t n;
        const CliCommand *t = cli_commands(&n);

        /* --help wins over what comes before it: a user asking for help gets it */
        assert_int_equal(parse("vm", "create", argv, &p, &error), -EINVAL);
        cli_parsed_done(&p);
        argv[0] = (char *) "--help";
        assert_int_equal(parse("vm", "create", argv, &p, &error), 0);
        assert_true(p.help);

        /* every command is an operation of the table */
        for (size_t i = 0; i < n; i++)
                assert_non_null(operation_find(t[i].op));
        assert_null(cli_command_find("vm", "fly"));
        assert_non_null(cli_command_find("host", NULL));
}

static void test_exit_codes_and_url(void **state) {
        _cleanup_free_ char *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL;

        assert_int_equal(cli_exit_code("not_found"), 4);
        assert_int_equal(cli_exit_code("conflict"), 5);
        assert_int_equal(cli_exit_code("invalid_request"), 3);
        assert_int_equal(cli_exit_code("unauthorized"), 9);
        assert_int_equal(cli_exit_code("internal_error"), 1);
        assert_int_equal(cli_exit_code("something_new"), 1);
        assert_int_equal(cli_exit_code(NULL), 1);

        a = cli_base_url("https://vmm.example/", NULL, NULL, "127.0.0.1:8080");
        assert_string_equal(a, "https://vmm.example");
        b = cli_base_url(NULL, "10.0.0.1:9000", NULL, "127.0.0.1:8080");
        assert_string_equal(b, "http://10.0.0.1:9000");
        c = cli_base_url(NULL, "", ":9001", "127.0.0.1:8080");
        assert_string_equal(c, "http://127.0.0.1:9001");
        d = cli_base_url(NULL, NULL, "[::]:9002", "127.0.0.1:8080");
        assert_string_equal(d, "http://[::1]:9002");
        e = cli_base_url(NULL, NULL, NULL, "127.0.0.1:8080");
        assert_string_equal(e, "http://127.0.0.1:8080");
}

static void test_table(void **state) {
        static const CliColumn columns[] = {
                { .header = "NAME", .key = "name" },
                { .header = "CIDR", .key = "spec.cidr" },
                { .header = "VMS", .key = "leases", .format = "count" },
                { .header = "MEMORY", .key = "mem", .format = "mib" },
                { .header = NULL },
        };
        json_auto_t *rows = json_loads(
                "[{\"name\":\"default\",\"spec\":{\"cidr\":\"10.0.0.0/24\"},\"leases\":[1,2],\"mem\":2048},"
                " {\"name\":\"a\\u001b[2Jb\",\"leases\":[],\"mem\":512}]",
                0,
                NULL);
        json_auto_t *empty = json_array();
        _cleanup_free_ char *t = NULL, *none = NULL, *obj = NULL;

        assert_non_null(rows);
        t = cli_table(rows, columns, "networks");
        /* padded to the widest cell, two spaces apart, no padding after the last column; a terminal
         * escape in a value is shown, not obeyed */
        assert_string_equal(
                t,
                "NAME     CIDR         VMS  MEMORY\n"
                "default  10.0.0.0/24  2    2 GiB\n"
                "a?[2Jb   -            0    512 MiB\n");
        none = cli_table(empty, columns, "networks");
        assert_string_equal(none, "No networks.\n");
        obj = cli_object(json_array_get(rows, 0));
        assert_string_equal(
                obj,
                "name:   default\n"
                "spec:   {\"cidr\":\"10.0.0.0/24\"}\n"
                "leases: [1,2]\n"
                "mem:    2048\n");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_create_flags),       cmocka_unit_test(test_errors_name_the_flag),
                cmocka_unit_test(test_exec_command),       cmocka_unit_test(test_help_and_commands),
                cmocka_unit_test(test_exit_codes_and_url), cmocka_unit_test(test_table),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
