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

/* The order of `vm-manager help`. */
static const CliCommand commands[] = {
        { .group = "vm",
          .verb = "list",
          .op = "list_vms",
          .positional = NULL,
          .metavar = NULL,
          .summary = "list the VMs" },
        { .group = "vm",
          .verb = "get",
          .op = "get_vm",
          .positional = "id",
          .metavar = "NAME",
          .summary = "show one VM" },
        { .group = "vm",
          .verb = "create",
          .op = "create_vm",
          .positional = "name",
          .metavar = "NAME",
          .summary = "create a VM and follow it until it is ready",
          .files = create_vm_files,
          .extra_flags = create_vm_extra },
        { .group = "vm",
          .verb = "start",
          .op = "start_vm",
          .positional = "id",
          .metavar = "NAME",
          .summary = "boot a stopped VM" },
        { .group = "vm",
          .verb = "stop",
          .op = "stop_vm",
          .positional = "id",
          .metavar = "NAME",
          .summary = "power a VM down" },
        { .group = "vm",
          .verb = "reboot",
          .op = "reboot_vm",
          .positional = "id",
          .metavar = "NAME",
          .summary = "stop, then start a VM" },
        { .group = "vm",
          .verb = "delete",
          .op = "delete_vm",
          .positional = "id",
          .metavar = "NAME",
          .summary = "delete a VM and its disk" },
        { .group = "vm",
          .verb = "exec",
          .op = "exec_vm",
          .positional = "id",
          .metavar = "NAME -- CMD...",
          .summary = "run a command in a VM, stdin, output and exit status passed through",
          .rest_argv = true },
        { .group = "vm",
          .verb = "console",
          .op = "get_vm_console",
          .positional = "id",
          .metavar = "NAME",
          .summary = "show a VM's serial console; --follow streams it",
          .extra_flags = console_extra },
        { .group = "network",
          .verb = "list",
          .op = "list_networks",
          .positional = NULL,
          .metavar = NULL,
          .summary = "list the networks" },
        { .group = "network",
          .verb = "get",
          .op = "get_network",
          .positional = "name",
          .metavar = "NAME",
          .summary = "show one network" },
        { .group = "network",
          .verb = "create",
          .op = "create_network",
          .positional = "name",
          .metavar = "NAME",
          .summary = "create a network (--cidr)" },
        { .group = "network",
          .verb = "delete",
          .op = "delete_network",
          .positional = "name",
          .metavar = "NAME",
          .summary = "delete a network" },
        { .group = "image",
          .verb = "list",
          .op = "list_images",
          .positional = NULL,
          .metavar = NULL,
          .summary = "list the images" },
        { .group = "host",
          .verb = NULL,
          .op = "get_host",
          .positional = NULL,
          .metavar = NULL,
          .summary = "what this host offers VMs, and what it misses" },
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

int cli_parse(const CliCommand *c, int argc, char **argv, CliParsed *ret, char **ret_error) {
        _cleanup_(cli_parsed_done) CliParsed p = {};
        const Operation *op = operation_find(c->op);
        bool positional_seen = false;
        int i, r;

        assert_return(op && ret && ret_error, -EINVAL);
        p.args = json_object();
        p.file_paths = json_object();
        p.extra = json_object();
        if (!p.args || !p.file_paths || !p.extra)
                return -ENOMEM;

        for (i = 0; i < argc; i++) {
                const char *a = argv[i], *value = NULL;
                _cleanup_free_ char *flag = NULL;
                const OperationParam *param;
                const CliFileFlag *ff;
                char metavar[32];
                bool negated = false;

                if (streq(a, "--help") || streq(a, "-h")) {
                        p.help = true;
                        *ret = p;
                        p = (CliParsed){};
                        return 0;
                }
                if (streq(a, "--")) {
                        i++;
                        break;
                }
                if (!strneq(a, "--", 2) || a[2] == 0) {
                        if (c->positional && !positional_seen) {
                                if (json_object_set_new(p.args, c->positional, json_string(a)) < 0)
                                        return -ENOMEM;
                                positional_seen = true;
                                continue;
                        }
                        if (c->rest_argv)
                                break;
                        return parse_error(ret_error, "unexpected argument '%s'", a);
                }

                const char *eq = strchr(a + 2, '=');
                flag = eq ? strndup(a + 2, eq - a - 2) : strdup(a + 2);
                if (!flag)
                        return -ENOMEM;
                if (eq)
                        value = eq + 1;

                if (extra_flag_find(c, flag, metavar, sizeof(metavar))) {
                        if (!*metavar) {
                                if (value)
                                        return parse_error(ret_error, "--%s takes no value", flag);
                                r = json_object_set_new(p.extra, flag, json_true());
                        } else {
                                if (!value && i + 1 >= argc)
                                        return parse_error(ret_error, "--%s needs a value (%s)", flag, metavar);
                                r = json_object_set_new(p.extra, flag, json_string(value ?: argv[++i]));
                        }
                        if (r < 0)
                                return -ENOMEM;
                        continue;
                }

                ff = file_flag_find(c, flag);
                if (ff) {
                        json_t *l;
                        if (!value && i + 1 >= argc)
                                return parse_error(ret_error, "--%s needs a value (FILE)", flag);
                        l = json_object_get(p.file_paths, ff->param);
                        if (!l) {
                                l = json_array();
                                if (!l || json_object_set_new(p.file_paths, ff->param, l) < 0)
                                        return -ENOMEM;
                        }
                        if (json_array_append_new(l, json_string(value ?: argv[++i])) < 0)
                                return -ENOMEM;
                        continue;
                }

                param = param_of_flag(c, op, flag);
                if (!param && strneq(flag, "no-", 3)) {
                        param = param_of_flag(c, op, flag + 3);
                        if (param && param->type == PARAM_BOOLEAN && !value)
                                negated = true;
                        else
                                param = NULL;
                }
                if (!param)
                        return parse_error(ret_error, "unknown flag '--%s'", flag);
                if (param->type == PARAM_BOOLEAN && !value)
                        value = negated ? "false" : "true";
                if (!value) {
                        if (i + 1 >= argc)
                                return parse_error(ret_error, "--%s needs a value", flag);
                        value = argv[++i];
                }
                r = set_value(p.args, param, negated ? flag + 3 : flag, value, ret_error);
                if (r < 0)
                        return r;
        }

        if (c->rest_argv) {
                json_t *cmd = json_array();
                if (!cmd || json_object_set_new(p.args, "command", cmd) < 0)
                        return -ENOMEM;
                for (; i < argc; i++)
                        if (json_array_append_new(cmd, json_string(argv[i])) < 0)
                                return -ENOMEM;
                if (json_array_size(cmd) == 0)
                        return parse_error(ret_error, "no command: give it after --, e.g. -- uptime");
        }
        if (c->positional && !positional_seen)
                return parse_error(ret_error, "missing %s", c->metavar ?: c->positional);

        *ret = p;
        p = (CliParsed){};
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

        fprintf(f,
                "Usage: vm-manager %s%s%s%s%s [FLAGS]\n\n",
                c->group,
                c->verb ? " " : "",
                c->verb ?: "",
                c->metavar ? " " : "",
                c->metavar ?: "");
        fprintf(f, "%s.\n\n", c->summary);
        if (op)
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
