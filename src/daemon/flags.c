/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cleanup.h"
#include "flags.h"
#include "log.h"
#include "parse-util.h"

static const Flag *flag_find(const Flag *table, size_t n, const char *name, size_t len) {
        for (size_t i = 0; i < n; i++)
                if (strlen(table[i].name) == len && strneq(table[i].name, name, len))
                        return &table[i];
        return NULL;
}

static int flag_apply(const Flag *f, const char *value, const char *origin, const char *prog) {
        const char *reason = NULL;
        int r;

        r = f->parse(f, value, &reason);
        if (r == -ENOMEM) {
                fprintf(stderr, "Error: %s: out of memory\n", prog);
                return r;
        }
        if (r < 0) {
                fprintf(stderr,
                        "Error: %s: invalid value '%s' for --%s%s%s%s: %s\n",
                        prog,
                        value,
                        f->name,
                        origin ? " (from $" : "",
                        origin ?: "",
                        origin ? ")" : "",
                        reason ?: strerror(-r));
                return -EINVAL;
        }
        return 0;
}

int flags_parse(
        const Flag *table, size_t n_table, int argc, char **argv, const char *prog, bool *ret_help, char ***ret_args) {
        _cleanup_free_ char **args = NULL;
        size_t n_args = 0;
        int r;

        assert_return(table || n_table == 0, -EINVAL);
        assert_return(ret_help, -EINVAL);

        args = calloc((size_t) argc + 1, sizeof(char *));
        if (!args)
                return -ENOMEM;

        /* --help short-circuits everything, as a user typing it expects. */
        for (int i = 0; i < argc; i++) {
                if (streq(argv[i], "--"))
                        break;
                if (streq(argv[i], "--help") || streq(argv[i], "-h")) {
                        *ret_help = true;
                        return 0;
                }
        }
        *ret_help = false;

        for (size_t i = 0; i < n_table; i++)
                if (table[i].default_value) {
                        r = flag_apply(&table[i], table[i].default_value, NULL, prog);
                        if (r < 0)
                                return r;
                }

        for (size_t i = 0; i < n_table; i++) {
                const char *e;

                if (!table[i].env)
                        continue;
                e = secure_getenv(table[i].env);
                if (!e || *e == 0) /* empty means unset, as for any shell variable */
                        continue;
                r = flag_apply(&table[i], e, table[i].env, prog);
                if (r < 0)
                        return r;
        }

        for (int i = 0; i < argc; i++) {
                const char *a = argv[i], *name, *eq, *value;
                const Flag *f;

                if (streq(a, "--")) {
                        for (i++; i < argc; i++)
                                args[n_args++] = argv[i];
                        break;
                }
                if (!strneq(a, "--", 2)) {
                        if (a[0] == '-' && a[1] != 0) {
                                fprintf(stderr, "Error: %s: unknown flag '%s'\n", prog, a);
                                return -EINVAL;
                        }
                        args[n_args++] = argv[i];
                        continue;
                }

                name = a + 2;
                eq = strchr(name, '=');
                f = flag_find(table, n_table, name, eq ? (size_t) (eq - name) : strlen(name));
                if (!f) {
                        fprintf(stderr,
                                "Error: %s: unknown flag '--%.*s'\n",
                                prog,
                                (int) (eq ? eq - name : (long) strlen(name)),
                                name);
                        return -EINVAL;
                }
                if (eq)
                        value = eq + 1;
                else if (f->is_bool)
                        value = "true";
                else if (i + 1 < argc)
                        value = argv[++i];
                else {
                        fprintf(stderr, "Error: %s: flag --%s needs a value\n", prog, f->name);
                        return -EINVAL;
                }
                r = flag_apply(f, value, NULL, prog);
                if (r < 0)
                        return r;
        }

        if (!ret_args && n_args > 0) {
                fprintf(stderr, "Error: %s: unexpected argument '%s'\n", prog, args[0]);
                return -EINVAL;
        }
        if (ret_args)
                *ret_args = TAKE_PTR(args);
        return 0;
}

void flags_print_help(FILE *f, const Flag *table, size_t n_table) {
        for (size_t i = 0; i < n_table; i++) {
                const Flag *t = &table[i];
                const char *def = t->default_help ?: t->default_value;

                fprintf(f, "  --%s%s%s\n", t->name, t->metavar ? " " : "", t->metavar ?: "");
                fprintf(f, "        %s\n", t->help);
                if (t->env)
                        fprintf(f, "        environment: %s\n", t->env);
                if (def && *def)
                        fprintf(f, "        default: %s\n", def);
        }
}

int flag_parse_string(const Flag *f, const char *value, const char **ret_reason) {
        char **dest = f->dest, *s;

        s = strdup(value);
        if (!s)
                return -ENOMEM;
        free(*dest);
        *dest = s;
        return 0;
}

int flag_parse_bool(const Flag *f, const char *value, const char **ret_reason) {
        int r = parse_boolean(value);

        if (r < 0) {
                *ret_reason = "want true or false (also 1/0, yes/no, on/off)";
                return r;
        }
        *(bool *) f->dest = r;
        return 0;
}

int flag_parse_duration(const Flag *f, const char *value, const char **ret_reason) {
        usec_t u;
        int r = parse_duration(value, &u);

        if (r == -ERANGE) {
                *ret_reason = "duration out of range";
                return r;
        }
        if (r < 0) {
                *ret_reason = "want a duration such as 90s, 5m or 1h30m";
                return r;
        }
        *(usec_t *) f->dest = u;
        return 0;
}

int flag_parse_uint32(const Flag *f, const char *value, const char **ret_reason) {
        uint32_t u;
        int r = safe_atou32(value, &u);

        if (r == -ERANGE) {
                *ret_reason = "number out of range";
                return r;
        }
        if (r < 0) {
                *ret_reason = "want a non-negative decimal integer";
                return r;
        }
        *(uint32_t *) f->dest = u;
        return 0;
}

int flag_parse_log_level(const Flag *f, const char *value, const char **ret_reason) {
        int l = log_level_from_string(value);

        if (l < 0) {
                *ret_reason = "want debug, info, notice, warning or error";
                return l;
        }
        *(int *) f->dest = l;
        return 0;
}

int flag_parse_listen(const Flag *f, const char *value, const char **ret_reason) {
        const char *colon, *port;
        uint16_t p;

        if (value[0] == '[') {
                const char *end = strchr(value, ']');
                if (!end || end == value + 1 || end[1] != ':') {
                        *ret_reason = "want host:port, [ipv6]:port or :port";
                        return -EINVAL;
                }
                colon = end + 1;
        } else {
                colon = strrchr(value, ':');
                if (!colon || strchr(value, ':') != colon) {
                        *ret_reason = "want host:port, [ipv6]:port or :port";
                        return -EINVAL;
                }
        }
        port = colon + 1;
        if (safe_atou16(port, &p) < 0) {
                *ret_reason = "the port must be a number from 0 to 65535";
                return -EINVAL;
        }
        return flag_parse_string(f, value, ret_reason);
}

int flag_parse_url_path(const Flag *f, const char *value, const char **ret_reason) {
        if (value[0] != '/' || value[1] == 0) {
                *ret_reason = "want an absolute path below /, such as /mcp";
                return -EINVAL;
        }
        for (const char *p = value; *p; p++)
                if ((unsigned char) *p <= ' ' || *p == '?' || *p == '#' || *p == '%' ||
                    (unsigned char) *p == 0x7f) {
                        *ret_reason = "the path may not contain spaces, control characters, '?', '#' or '%'";
                        return -EINVAL;
                }
        if (strstr(value, "//") || value[strlen(value) - 1] == '/') {
                *ret_reason = "the path may not contain empty segments or end in '/'";
                return -EINVAL;
        }
        return flag_parse_string(f, value, ret_reason);
}

int flag_parse_directory(const Flag *f, const char *value, const char **ret_reason) {
        _cleanup_free_ char *abs = NULL, *cwd = NULL;
        char **dest = f->dest;

        if (*value == 0) {
                *ret_reason = "the path is empty";
                return -EINVAL;
        }
        if (value[0] == '/')
                abs = strdup(value);
        else {
                cwd = getcwd(NULL, 0);
                if (!cwd)
                        return -errno;
                if (asprintf(&abs, "%s/%s", cwd, value) < 0)
                        abs = NULL;
        }
        if (!abs)
                return -ENOMEM;
        /* Trailing slashes would only make the paths built below it ugly. */
        for (size_t n = strlen(abs); n > 1 && abs[n - 1] == '/'; n--)
                abs[n - 1] = 0;
        if (strlen(abs) >= PATH_MAX) {
                *ret_reason = "the path is too long";
                return -ENAMETOOLONG;
        }
        free(*dest);
        *dest = TAKE_PTR(abs);
        return 0;
}
