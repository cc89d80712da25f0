/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "cli-args.h"
#include "parse-util.h"
#include "string-util.h"

static const CliFileFlag create_vm_files[] = {
        { .param = "user_data",
          .flag = "user-data",
          .help = "Ignition JSON for the guest, read from FILE (- for stdin)" },
        { .param = "ssh_authorized_keys",
          .flag = "ssh-key",
          .help = "root's authorized SSH keys, one a line, read from FILE (e.g. ~/.ssh/id_ed25519.pub); repeatable" },
        { .param = NULL },
};

static const char *const create_vm_extra[] = {
        "no-wait\t\tanswer as soon as the VM exists (wait_for none): no progress, the record is printed",
        NULL,
};
static const char *const console_extra[] = {
        "follow\t\tgo on showing the console as it grows, until Ctrl-] (or the VM is deleted)",
        NULL,
};

static const char shell_help[] =
        "A login shell as root in the VM, in a pseudo-terminal, over the same ssh path as vm exec (the "
        "VM's own key, no port to forward; GET /api/v1/vms/{id}/shell upgraded to vm-manager-shell). "
        "The terminal is raw while it runs: keys, Ctrl-C included, go to the shell, and the window size "
        "follows the terminal's. Ctrl-] detaches (exit 0, the shell is hung up on). The command exits "
        "with the shell's exit status, and 255 when there was no session or it broke, with the reason "
        "on stderr (the API's message: not found, conflict when the VM is not running, ...). stdin must "
        "be a terminal (exit 2 otherwise): from a script, use vm exec NAME -- sh. docs/cli.md has the "
        "details.";

/* One command: group, verb, operation, positional parameter, summary, then any of files,
 * rest_argv and extra_flags as designated initializers. */
#define COMMAND(g, v, o, pos, sum, ...) \
        { .group = g, .verb = v, .op = o, .positional = pos, .summary = sum, __VA_ARGS__ }

/* The order of `vm-manager help`. */
static const CliCommand commands[] = {
        COMMAND("vm", "list", "list_vms", NULL, "list the VMs"),
        COMMAND("vm", "get", "get_vm", "id", "show one VM"),
        COMMAND("vm",
                "create",
                "create_vm",
                "name",
                "create a VM and follow it until it is ready",
                .files = create_vm_files,
                .extra_flags = create_vm_extra),
        COMMAND("vm", "start", "start_vm", "id", "boot a stopped VM"),
        COMMAND("vm", "stop", "stop_vm", "id", "power a VM down"),
        COMMAND("vm", "reboot", "reboot_vm", "id", "stop, then start a VM"),
        COMMAND("vm", "delete", "delete_vm", "id", "delete a VM and its disk"),
        COMMAND("vm",
                "exec",
                "exec_vm",
                "id",
                "run a command in a VM, stdin, output and exit status passed through",
                .rest_argv = true),
        COMMAND("vm",
                "console",
                "get_vm_console",
                "id",
                "show a VM's serial console; --follow streams it",
                .extra_flags = console_extra),
        /* not an operation (an upgraded connection, api-shell.h): get_vm's parameters, the VM alone */
        COMMAND("vm",
                "shell",
                "get_vm",
                "id",
                "an interactive root shell in a VM; Ctrl-] detaches",
                .help = shell_help),
        COMMAND("network", "list", "list_networks", NULL, "list the networks"),
        COMMAND("network", "get", "get_network", "name", "show one network"),
        COMMAND("network", "create", "create_network", "name", "create a network (--cidr)"),
        COMMAND("network", "delete", "delete_network", "name", "delete a network"),
        COMMAND("image", "list", "list_images", NULL, "list the images"),
        COMMAND("host", NULL, "get_host", NULL, "what this host offers VMs, and what it misses"),
};

const CliCommand *cli_commands(size_t *ret_n) {
        *ret_n = ELEMENTSOF(commands);
        return commands;
}

const CliCommand *cli_command_find(const char *group, const char *verb) {
        for (size_t i = 0; i < ELEMENTSOF(commands); i++)
                if (streq(commands[i].group, group) &&
                    (commands[i].verb ? verb && streq(commands[i].verb, verb) : !verb))
                        return &commands[i];
        return NULL;
}

const char *cli_command_metavar(const CliCommand *c) {
        if (!c->positional)
                return NULL;
        return c->rest_argv ? "NAME -- CMD..." : "NAME";
}

void cli_flag_name(const char *param, char *buf) {
        size_t i;

        for (i = 0; param[i]; i++)
                buf[i] = param[i] == '_' ? '-' : param[i];
        buf[i] = 0;
}

void cli_parsed_done(CliParsed *p) {
        json_decref(p->args);
        json_decref(p->file_paths);
        json_decref(p->extra);
        *p = (CliParsed){};
}

_printf_(2, 3) static int parse_error(char **ret_error, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(ret_error, fmt, ap) < 0)
                *ret_error = NULL;
        va_end(ap);
        return -EINVAL;
}

static const CliFileFlag *file_flag_find(const CliCommand *c, const char *flag) {
        for (const CliFileFlag *f = c->files; f && f->param; f++)
                if (streq(f->flag, flag))
                        return f;
        return NULL;
}

static bool file_flag_param(const CliCommand *c, const char *param) {
        for (const CliFileFlag *f = c->files; f && f->param; f++)
                if (streq(f->param, param))
                        return true;
        return false;
}

/* The client's own flag named flag: its METAVAR ("" for a boolean), or NULL when there is none. */
static const char *extra_flag_find(const CliCommand *c, const char *flag, char *metavar, size_t size) {
        for (const char *const *e = c->extra_flags; e && *e; e++) {
                const char *tab = strchr(*e, '\t'), *tab2 = tab ? strchr(tab + 1, '\t') : NULL;
                if (!tab || !tab2 || (size_t) (tab - *e) != strlen(flag) || !strneq(*e, flag, strlen(flag)))
                        continue;
                snprintf(metavar, size, "%.*s", (int) (tab2 - tab - 1), tab + 1);
                return metavar;
        }
        return NULL;
}

/* The parameter behind --flag, when the operation declares it and it is given as a flag. */
static const OperationParam *param_of_flag(const CliCommand *c, const Operation *op, const char *flag) {
        char name[128];

        for (const OperationParam *p = op->params; p->name; p++) {
                if (strlen(p->name) >= sizeof(name) || (p->flags & PARAM_IN_PATH) ||
                    (c->positional && streq(p->name, c->positional)) || file_flag_param(c, p->name) ||
                    (c->rest_argv && streq(p->name, "command")))
                        continue;
                cli_flag_name(p->name, name);
                if (streq(name, flag))
                        return p;
        }
        return NULL;
}

static int set_value(
        json_t *args, const OperationParam *p, const char *flag, const char *value, char **ret_error) {
        json_t *v = NULL;
        int64_t i;
        int b;

        switch (p->type) {
        case PARAM_STRING:
                v = json_string(value);
                break;
        case PARAM_INTEGER:
                if (safe_atoi64(value, &i) < 0)
                        return parse_error(ret_error, "--%s: '%s' is not an integer", flag, value);
                v = json_integer(i);
                break;
        case PARAM_BOOLEAN:
                b = parse_boolean(value);
                if (b < 0)
                        return parse_error(
                                ret_error, "--%s: '%s' is not a boolean (true or false)", flag, value);
                v = json_boolean(b);
                break;
        case PARAM_STRING_ARRAY: {
                json_t *a = json_object_get(args, p->name);
                if (!a) {
                        a = json_array();
                        if (!a || json_object_set_new(args, p->name, a) < 0)
                                return -ENOMEM;
                }
                return json_array_append_new(a, json_string(value)) < 0 ? -ENOMEM : 0;
        }
        case PARAM_STRING_MAP: {
                const char *eq = strchr(value, '=');
                json_t *m = json_object_get(args, p->name);
                _cleanup_free_ char *key = NULL;

                if (!eq || eq == value)
                        return parse_error(ret_error, "--%s: '%s' is not KEY=VALUE", flag, value);
                key = strndup(value, eq - value);
                if (!key)
                        return -ENOMEM;
                if (!m) {
                        m = json_object();
                        if (!m || json_object_set_new(args, p->name, m) < 0)
                                return -ENOMEM;
                }
                return json_object_set_new(m, key, json_string(eq + 1)) < 0 ? -ENOMEM : 0;
        }
        default:
                return -EINVAL;
        }
        if (!v)
                return -ENOMEM;
        return json_object_set_new(args, p->name, v) < 0 ? -ENOMEM : 0;
}

/* A command line being parsed: where it is in argv, and what it has gathered so far. */
typedef struct ArgParser {
        const CliCommand *command;
        const Operation *op;
        int argc;
        char **argv;
        int i; /* the argument being parsed */
        bool positional_seen;
        CliParsed parsed;
        char **ret_error;
} ArgParser;

/* The value of a flag that takes one: after '=' (given), else the next argument, consumed; NULL when
 * the command line ends first. */
static const char *take_value(ArgParser *a, const char *given) {
        if (given)
                return given;
        if (a->i + 1 >= a->argc)
                return NULL;
        return a->argv[++a->i];
}

/* One of the client's own flags (--follow, --no-wait): 1 if flag is one, 0 if it is not. */
static int parse_extra_flag(ArgParser *a, const char *flag, const char *value) {
        char metavar[32];
        int r;

        if (!extra_flag_find(a->command, flag, metavar, sizeof(metavar)))
                return 0;
        if (!*metavar) {
                if (value)
                        return parse_error(a->ret_error, "--%s takes no value", flag);
                r = json_object_set_new(a->parsed.extra, flag, json_true());
        } else {
                value = take_value(a, value);
                if (!value)
                        return parse_error(a->ret_error, "--%s needs a value (%s)", flag, metavar);
                r = json_object_set_new(a->parsed.extra, flag, json_string(value));
        }
        return r < 0 ? -ENOMEM : 1;
}

/* A parameter given as a file (--user-data FILE): the path is noted, read later by the caller. 1 if
 * flag is one, 0 if it is not. */
static int parse_file_flag(ArgParser *a, const char *flag, const char *value) {
        const CliFileFlag *ff = file_flag_find(a->command, flag);
        json_t *l;

        if (!ff)
                return 0;
        value = take_value(a, value);
        if (!value)
                return parse_error(a->ret_error, "--%s needs a value (FILE)", flag);
        l = json_object_get(a->parsed.file_paths, ff->param);
        if (!l) {
                l = json_array();
                if (!l || json_object_set_new(a->parsed.file_paths, ff->param, l) < 0)
                        return -ENOMEM;
        }
        return json_array_append_new(l, json_string(value)) < 0 ? -ENOMEM : 1;
}

/* A parameter of the operation: --memory-mib 2048, --label k=v, --enable-tpm, --no-enable-tpm. */
static int parse_param_flag(ArgParser *a, const char *flag, const char *value) {
        const OperationParam *param = param_of_flag(a->command, a->op, flag);
        bool negated = false;

        if (!param && strneq(flag, "no-", 3)) {
                param = param_of_flag(a->command, a->op, flag + 3);
                if (param && param->type == PARAM_BOOLEAN && !value)
                        negated = true;
                else
                        param = NULL;
        }
        if (!param)
                return parse_error(a->ret_error, "unknown flag '--%s'", flag);
        if (param->type == PARAM_BOOLEAN && !value)
                value = negated ? "false" : "true";
        value = take_value(a, value);
        if (!value)
                return parse_error(a->ret_error, "--%s needs a value", flag);
        return set_value(a->parsed.args, param, negated ? flag + 3 : flag, value, a->ret_error);
}

/* --flag or --flag=value, whichever kind of flag it is. */
static int parse_flag(ArgParser *a, const char *arg) {
        const char *eq = strchr(arg + 2, '=');
        _cleanup_free_ char *flag = eq ? strndup(arg + 2, eq - arg - 2) : strdup(arg + 2);
        const char *value = eq ? eq + 1 : NULL;
        int r;

        if (!flag)
                return -ENOMEM;
        r = parse_extra_flag(a, flag, value);
        if (r == 0)
                r = parse_file_flag(a, flag, value);
        if (r == 0)
                r = parse_param_flag(a, flag, value);
        return r < 0 ? r : 0;
}

/* An argument that is not a flag: the positional one, or the start of the command (rest_argv).
 * 1 when the command starts here, 0 when parsing goes on. */
static int parse_positional(ArgParser *a, const char *arg) {
        const CliCommand *c = a->command;

        if (c->positional && !a->positional_seen) {
                if (json_object_set_new(a->parsed.args, c->positional, json_string(arg)) < 0)
                        return -ENOMEM;
                a->positional_seen = true;
                return 0;
        }
        if (c->rest_argv)
                return 1;
        return parse_error(a->ret_error, "unexpected argument '%s'", arg);
}

/* The arguments from a->i on are the command (exec's "-- CMD…"), which must not be empty. */
static int parse_rest_argv(ArgParser *a) {
        json_t *cmd = json_array();

        if (!cmd || json_object_set_new(a->parsed.args, "command", cmd) < 0)
                return -ENOMEM;
        for (; a->i < a->argc; a->i++)
                if (json_array_append_new(cmd, json_string(a->argv[a->i])) < 0)
                        return -ENOMEM;
        if (json_array_size(cmd) == 0)
                return parse_error(a->ret_error, "no command: give it after --, e.g. -- uptime");
        return 0;
}

/* Walks argv up to the end, "--", or the first word of a rest_argv command; a->i is left there. */
static int parse_words(ArgParser *a) {
        int r;

        for (; a->i < a->argc; a->i++) {
                const char *arg = a->argv[a->i];

                if (streq(arg, "--help") || streq(arg, "-h")) {
                        a->parsed.help = true;
                        return 0;
                }
                if (streq(arg, "--")) {
                        a->i++;
                        return 0;
                }
                if (strneq(arg, "--", 2) && arg[2] != 0)
                        r = parse_flag(a, arg);
                else
                        r = parse_positional(a, arg);
                if (r < 0)
                        return r;
                if (r > 0)
                        return 0;
        }
        return 0;
}

static void arg_parser_done(ArgParser *a) {
        cli_parsed_done(&a->parsed);
}

int cli_parse(const CliCommand *c, int argc, char **argv, CliParsed *ret, char **ret_error) {
        _cleanup_(arg_parser_done) ArgParser a = {
                .command = c,
                .op = operation_find(c->op),
                .argc = argc,
                .argv = argv,
                .ret_error = ret_error,
        };
        int r;

        assert_return(a.op && ret && ret_error, -EINVAL);
        a.parsed.args = json_object();
        a.parsed.file_paths = json_object();
        a.parsed.extra = json_object();
        if (!a.parsed.args || !a.parsed.file_paths || !a.parsed.extra)
                return -ENOMEM;

        r = parse_words(&a);
        if (r < 0)
                return r;
        /* --help answers whatever else the line holds, so that a half-typed command gets its help. */
        if (!a.parsed.help) {
                if (c->rest_argv) {
                        r = parse_rest_argv(&a);
                        if (r < 0)
                                return r;
                }
                if (c->positional && !a.positional_seen)
                        return parse_error(ret_error, "missing %s", cli_command_metavar(c));
        }

        *ret = a.parsed;
        a.parsed = (CliParsed){};
        return 0;
}

static const char *param_metavar(const OperationParam *p) {
        switch (p->type) {
        case PARAM_INTEGER:
                return "N";
        case PARAM_BOOLEAN:
                return NULL;
        case PARAM_STRING_MAP:
                return "KEY=VALUE";
        default:
                return p->enum_values ? "WORD" : "VALUE";
        }
}

static void help_line(FILE *f, const char *flag, const char *metavar, const char *help) {
        char left[64];
        int n = snprintf(left, sizeof(left), "  --%s%s%s", flag, metavar ? " " : "", metavar ?: "");

        if (n < 26)
                fprintf(f, "%-26s %s\n", left, help);
        else
                fprintf(f, "%s\n%-26s %s\n", left, "", help);
}

void cli_command_help(FILE *f, const CliCommand *c) {
        const Operation *op = operation_find(c->op);
        char name[128];

        const char *usage = cli_command_metavar(c);

        fprintf(f,
                "Usage: vm-manager %s%s%s%s%s [FLAGS]\n\n",
                c->group,
                c->verb ? " " : "",
                c->verb ?: "",
                usage ? " " : "",
                usage ?: "");
        fprintf(f, "%s.\n\n", c->summary);
        if (c->help)
                fprintf(f, "%s\n\n", c->help);
        else if (op)
                fprintf(f, "The %s operation: %s\n\n", op->name, op->description);
        fprintf(f, "Flags:\n");
        for (const OperationParam *p = op ? op->params : NULL; p && p->name; p++) {
                if ((p->flags & PARAM_IN_PATH) || (c->positional && streq(p->name, c->positional)) ||
                    file_flag_param(c, p->name) || (c->rest_argv && streq(p->name, "command")) ||
                    strlen(p->name) >= sizeof(name))
                        continue;
                cli_flag_name(p->name, name);
                help_line(f, name, param_metavar(p), p->description);
        }
        for (const CliFileFlag *ff = c->files; ff && ff->param; ff++)
                help_line(f, ff->flag, "FILE", ff->help);
        for (const char *const *e = c->extra_flags; e && *e; e++) {
                const char *tab = strchr(*e, '\t'), *tab2 = tab ? strchr(tab + 1, '\t') : NULL;
                char flag[64], metavar[32];

                if (!tab || !tab2)
                        continue;
                snprintf(flag, sizeof(flag), "%.*s", (int) (tab - *e), *e);
                snprintf(metavar, sizeof(metavar), "%.*s", (int) (tab2 - tab - 1), tab + 1);
                help_line(f, flag, *metavar ? metavar : NULL, tab2 + 1);
        }
        help_line(f, "help", NULL, "show this help");
        fprintf(f,
                "\nGlobal flags (before or after the command): --url URL, --output table|json, --token-file FILE.\n");
}
