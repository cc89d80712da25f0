/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The client commands (cli.h). Requests are plain REST calls; the only state is the Cli below. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "api-error.h"
#include "cleanup.h"
#include "cli-args.h"
#include "cli-table.h"
#include "cli.h"
#include "curl-util.h"
#include "fs-util.h"
#include "shell-frame.h"
#include "string-util.h"

/* Largest answer or file the client takes: a list of many VMs, user-data (1 MiB) escaped. */
#define CLI_BODY_MAX ((size_t) 64 << 20)
/* stdin of vm exec: as much as the guest's output may be, held in memory and sent whole. */
#define CLI_STDIN_MAX ((size_t) 1 << 20)
#define CLI_DETACH_KEY 0x1d /* Ctrl-] */

static bool streq_ptr(const char *a, const char *b) {
        return a && b ? streq(a, b) : a == b;
}

typedef struct Cli {
        char *base; /* "http://host:port" */
        char *token;
        bool json;
} Cli;

static void cli_done(Cli *c) {
        free(c->base);
        free(c->token);
}

int cli_exit_code(const char *code) {
        static const struct {
                const char *code;
                int status;
        } map[] = {
                { "invalid_request", CLI_EXIT_INVALID_REQUEST },
                { "not_found", CLI_EXIT_NOT_FOUND },
                { "conflict", CLI_EXIT_CONFLICT },
                { "unsupported", CLI_EXIT_UNSUPPORTED },
                { "timeout", CLI_EXIT_TIMEOUT },
                { "vm_failed", CLI_EXIT_VM_FAILED },
                { "unauthorized", CLI_EXIT_UNAUTHORIZED },
        };

        for (size_t i = 0; code && i < ELEMENTSOF(map); i++)
                if (streq(map[i].code, code))
                        return map[i].status;
        return CLI_EXIT_INTERNAL;
}

char *cli_base_url(const char *flag, const char *env_url, const char *env_listen, const char *default_listen) {
        const char *u = flag && *flag ? flag : env_url && *env_url ? env_url : NULL;
        const char *listen = env_listen && *env_listen ? env_listen : default_listen;
        char *s = NULL;

        if (u) {
                size_t n = strlen(u);
                if (strstr(u, "://"))
                        s = strndup(u, n > 0 && u[n - 1] == '/' ? n - 1 : n);
                else if (asprintf(&s, "http://%s", u) < 0)
                        s = NULL;
                return s;
        }
        /* The daemon's own listener: a wildcard or empty host is reached on loopback. */
        if (listen[0] == ':')
                return asprintf(&s, "http://127.0.0.1%s", listen) < 0 ? NULL : s;
        if (strneq(listen, "0.0.0.0:", 8))
                return asprintf(&s, "http://127.0.0.1%s", listen + 7) < 0 ? NULL : s;
        if (strneq(listen, "[::]:", 5))
                return asprintf(&s, "http://[::1]%s", listen + 4) < 0 ? NULL : s;
        return asprintf(&s, "http://%s", listen) < 0 ? NULL : s;
}

/* ---- HTTP ---- */

typedef struct Request {
        CURL *easy;
        struct curl_slist *headers;
        char *body;
        CurlBuffer answer;
        char errbuf[CURL_ERROR_SIZE];
} Request;

static void request_done(Request *r) {
        curl_easy_cleanup(r->easy);
        curl_slist_free_all(r->headers);
        free(r->body);
        curl_buffer_done(&r->answer);
}

static int request_init(Cli *c, Request *r, const char *method, const char *path, const json_t *body) {
        _cleanup_free_ char *url = NULL, *auth = NULL;

        *r = (Request){ .answer.max = CLI_BODY_MAX };
        if (asprintf(&url, "%s/api/v1%s", c->base, path) < 0) {
                url = NULL;
                return -ENOMEM;
        }
        r->easy = curl_easy_init();
        if (!r->easy)
                return -ENOMEM;
        r->headers = curl_slist_append(NULL, "Accept: application/json");
        if (body) {
                r->body = json_dumps(body, JSON_COMPACT);
                if (!r->body)
                        return -ENOMEM;
                r->headers = curl_slist_append(r->headers, "Content-Type: application/json");
                (void) curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body);
        }
        if (c->token) {
                if (asprintf(&auth, "Authorization: Bearer %s", c->token) < 0) {
                        auth = NULL;
                        return -ENOMEM;
                }
                r->headers = curl_slist_append(r->headers, auth);
        }
        if (!r->headers)
                return -ENOMEM;
        (void) curl_easy_setopt(r->easy, CURLOPT_URL, url);
        (void) curl_easy_setopt(r->easy, CURLOPT_CUSTOMREQUEST, method);
        (void) curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->headers);
        (void) curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, curl_buffer_write);
        (void) curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, &r->answer);
        (void) curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, r->errbuf);
        (void) curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
        (void) curl_easy_setopt(r->easy, CURLOPT_CONNECTTIMEOUT, 10L);
        (void) curl_easy_setopt(r->easy, CURLOPT_PROTOCOLS_STR, "http,https");
        return 0;
}

/* An answer that is the API's: a status and, for an error, the code and the message. */
typedef struct Answer {
        long status;
        json_t *json; /* the parsed body, NULL for none */
        int exit;     /* what the client exits with if this is the end */
} Answer;

static void answer_done(Answer *a) {
        json_decref(a->json);
}

/* Prints what went wrong, the API's message as it is; returns the exit status. */
static int request_finish(Cli *c, Request *r, CURLcode cc, Answer *ret) {
        json_error_t jerr;

        *ret = (Answer){};
        if (cc != CURLE_OK) {
                fprintf(stderr,
                        "Error: cannot reach vm-manager at %s: %s\n"
                        "Is the daemon running (vm-manager serve)? --url or $VM_MANAGER_URL names another.\n",
                        c->base,
                        r->errbuf[0] ? r->errbuf : curl_easy_strerror(cc));
                return ret->exit = CLI_EXIT_UNREACHABLE;
        }
        (void) curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &ret->status);
        if (r->answer.len > 0) {
                ret->json = json_loadb(r->answer.data, r->answer.len, JSON_DECODE_ANY, &jerr);
                if (!ret->json) {
                        fprintf(stderr,
                                "Error: %s answered HTTP %ld with something that is not JSON: %.200s\n",
                                c->base,
                                ret->status,
                                r->answer.data);
                        return ret->exit = CLI_EXIT_INTERNAL;
                }
        }
        if (ret->status >= 200 && ret->status < 300)
                return ret->exit = CLI_EXIT_OK;

        json_t *e = json_object_get(ret->json, "error");
        const char *code = json_string_value(json_object_get(e, "code")),
                   *message = json_string_value(json_object_get(e, "message"));
        if (!message) {
                fprintf(stderr, "Error: %s answered HTTP %ld\n", c->base, ret->status);
                return ret->exit = CLI_EXIT_INTERNAL;
        }
        fprintf(stderr, "%s\n", message);
        if (ret->status == 401 && !c->token)
                fprintf(stderr,
                        "The daemon wants a bearer token: set $VM_MANAGER_TOKEN or --token-file FILE.\n");
        return ret->exit = cli_exit_code(code);
}

/* One request, waited for. */
static int call(Cli *c, const char *method, const char *path, const json_t *body, Answer *ret) {
        _cleanup_(request_done) Request r = {};
        int k;

        k = request_init(c, &r, method, path, body);
        if (k < 0) {
                fprintf(stderr, "Error: out of memory\n");
                *ret = (Answer){ .exit = CLI_EXIT_INTERNAL };
                return CLI_EXIT_INTERNAL;
        }
        return request_finish(c, &r, curl_easy_perform(r.easy), ret);
}

static char *escape_segment(const char *s) {
        _cleanup_(curl_easy_cleanupp) CURL *e = curl_easy_init();
        char *t, *d;

        if (!e)
                return NULL;
        t = curl_easy_escape(e, s, 0);
        if (!t)
                return NULL;
        d = strdup(t);
        curl_free(t);
        return d;
}

/* A VM by id or by name: the id of an existing VM in *ret_id, or the exit status. */
static int resolve_vm(Cli *c, const char *ref, char **ret_id) {
        _cleanup_(answer_done) Answer a = {}, l = {};
        _cleanup_free_ char *seg = escape_segment(ref), *path = NULL;
        size_t i;
        json_t *v;
        int k;

        if (!seg || asprintf(&path, "/vms/%s", seg) < 0)
                return CLI_EXIT_INTERNAL;
        /* By name first, quietly: a name is what people type, and an id is a lookup in the same list. */
        k = call(c, "GET", "/vms", NULL, &l);
        if (k != 0)
                return k;
        json_array_foreach(l.json, i, v) if (
                streq_ptr(json_string_value(json_object_get(v, "name")), ref) ||
                streq_ptr(json_string_value(json_object_get(v, "id")), ref)) {
                *ret_id = strdup(json_string_value(json_object_get(v, "id")));
                return *ret_id ? 0 : CLI_EXIT_INTERNAL;
        }
        /* Neither: the daemon's own not_found, as every other client sees it. */
        k = call(c, "GET", path, NULL, &a);
        if (k != 0)
                return k;
        *ret_id = strdup(ref);
        return *ret_id ? 0 : CLI_EXIT_INTERNAL;
}

/* ---- output ---- */

/* A column: header, key, and a format (cli-table.h) given as .format = …, a few a line. */
#define COLUMN(h, k, ...) \
        { .header = h, .key = k, __VA_ARGS__ }

static const CliColumn vm_columns[] = { COLUMN("NAME", "name"),
                                        COLUMN("ID", "id"),
                                        COLUMN("STATE", "state"),
                                        COLUMN("IP", "ip"),
                                        COLUMN("IMAGE", "image"),
                                        COLUMN("CPUS", "cpus"),
                                        COLUMN("MEMORY", "memoryMiB", .format = "mib"),
                                        {} };
static const CliColumn network_columns[] = { COLUMN("NAME", "spec.name"),
                                             COLUMN("CIDR", "spec.cidr"),
                                             COLUMN("GATEWAY", "gateway"),
                                             COLUMN("MTU", "spec.mtu"),
                                             COLUMN("VMS", "leases", .format = "count"),
                                             {} };
static const CliColumn image_columns[] = {
        COLUMN("ID", "id"), COLUMN("VERSION", "version"), COLUMN("KUBERNETES", "kubernetesVersions"), {}
};

static int print_text(char *s) {
        if (!s) {
                fprintf(stderr, "Error: out of memory\n");
                return CLI_EXIT_INTERNAL;
        }
        fputs(s, stdout);
        free(s);
        return 0;
}

static int print_result(Cli *c, const CliCommand *cmd, const json_t *v) {
        if (!v)
                return 0;
        if (c->json) {
                _cleanup_free_ char *s = json_dumps(v, JSON_INDENT(2) | JSON_ENCODE_ANY);
                if (!s)
                        return CLI_EXIT_INTERNAL;
                puts(s);
                return 0;
        }
        if (json_is_array(v)) {
                if (streq(cmd->group, "vm"))
                        return print_text(cli_table(v, vm_columns, "VMs"));
                if (streq(cmd->group, "network"))
                        return print_text(cli_table(v, network_columns, "networks"));
                return print_text(cli_table(v, image_columns, "images (is --image-dir right?)"));
        }
        return print_text(cli_object(v));
}

/* ---- arguments from files ---- */

static int read_input(const char *path, size_t max, char **ret) {
        if (streq(path, "-")) {
                /* stdin is read as a body is received: into the same bounded buffer. */
                _cleanup_(curl_buffer_done) CurlBuffer b = { .max = max };
                char chunk[65536];
                ssize_t n;

                while ((n = read(STDIN_FILENO, chunk, sizeof(chunk))) != 0) {
                        if (n < 0) {
                                if (errno == EINTR)
                                        continue;
                                return -errno;
                        }
                        if (curl_buffer_write(chunk, 1, (size_t) n, &b) != (size_t) n)
                                return b.too_big ? -EFBIG : -ENOMEM;
                }
                *ret = b.data ? TAKE_PTR(b.data) : strdup("");
                return *ret ? 0 : -ENOMEM;
        }
        return read_full_file(path, max, ret, NULL);
}

static int add_files(const CliParsed *p, const CliCommand *cmd) {
        for (const CliFileFlag *ff = cmd->files; ff && ff->param; ff++) {
                const OperationParam *op = operation_param_find(operation_find(cmd->op), ff->param);
                json_t *paths = json_object_get(p->file_paths, ff->param), *e;
                size_t i;

                if (!paths || !op)
                        continue;
                if (op->type == PARAM_STRING && json_array_size(paths) > 1) {
                        fprintf(stderr, "Error: --%s takes one file\n", ff->flag);
                        return CLI_EXIT_USAGE;
                }
                json_array_foreach(paths, i, e) {
                        _cleanup_free_ char *text = NULL;
                        const char *path = json_string_value(e);
                        int k = read_input(path, CLI_BODY_MAX, &text);

                        if (k < 0) {
                                fprintf(stderr, "Error: --%s %s: %s\n", ff->flag, path, strerror(-k));
                                return CLI_EXIT_USAGE;
                        }
                        if (op->type == PARAM_STRING) {
                                json_object_set_new(p->args, ff->param, json_string(text));
                                continue;
                        }
                        json_t *a = json_object_get(p->args, ff->param);
                        if (!a) {
                                a = json_array();
                                json_object_set_new(p->args, ff->param, a);
                        }
                        for (char *line = strtok(text, "\r\n"); line; line = strtok(NULL, "\r\n"))
                                if (*line && *line != '#')
                                        json_array_append_new(a, json_string(line));
                }
        }
        return 0;
}

/* ---- generic operations ---- */

/* The REST path of op with its {param} segments filled from args (escaped), and the body or query. */
static int op_request_path(const Operation *op, json_t *args, char **ret_path, json_t **ret_body) {
        _cleanup_free_ char *path = NULL;
        json_auto_t *body = json_object();
        size_t size = 0;
        FILE *f = open_memstream(&path, &size);
        const char *key;
        json_t *v;
        bool query = false;

        if (!f || !body) {
                if (f)
                        fclose(f);
                return -ENOMEM;
        }
        for (const char *s = op->path; *s;) {
                if (*s == '{') {
                        const char *end = strchr(s, '}');
                        char name[64];
                        _cleanup_free_ char *seg = NULL;

                        snprintf(name, sizeof(name), "%.*s", (int) (end - s - 1), s + 1);
                        seg = escape_segment(json_string_value(json_object_get(args, name)) ?: "");
                        fputs(seg ?: "", f);
                        s = end + 1;
                } else
                        fputc(*s++, f);
        }
        json_object_foreach(args, key, v) {
                const OperationParam *p = operation_param_find(op, key);
                if (!p || (p->flags & PARAM_IN_PATH))
                        continue;
                if (p->flags & PARAM_IN_QUERY) {
                        _cleanup_free_ char *cell = cli_cell(v, NULL),
                                            *esc = cell ? escape_segment(cell) : NULL;
                        fprintf(f, "%c%s=%s", query ? '&' : '?', key, esc ?: "");
                        query = true;
                } else
                        json_object_set(body, key, v);
        }
        if (fclose(f) != 0)
                return -ENOMEM;
        *ret_path = TAKE_PTR(path);
        *ret_body = op->rest_body ? TAKE_PTR(body) : NULL;
        return 0;
}

static int run_op(Cli *c, const CliCommand *cmd, json_t *args, Answer *ret) {
        const Operation *op = operation_find(cmd->op);
        _cleanup_free_ char *path = NULL;
        json_auto_t *body = NULL;

        if (op_request_path(op, args, &path, &body) < 0)
                return CLI_EXIT_INTERNAL;
        return call(c, op->method, path, body, ret);
}

/* ---- vm create: progress ---- */

static double elapsed_since(const struct timespec *t0) {
        struct timespec t;

        clock_gettime(CLOCK_MONOTONIC, &t);
        return (double) (t.tv_sec - t0->tv_sec) + (double) (t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* The VM named name in a list_vms answer (borrowed), or NULL. */
static json_t *find_by_name(json_t *list, const char *name) {
        size_t i;
        json_t *v;

        json_array_foreach(
                list, i, v) if (streq_ptr(json_string_value(json_object_get(v, "name")), name)) return v;
        return NULL;
}

/* Sends create_vm as asked (its wait_for decides when it answers) and, while it waits, shows the
 * VM's states from list_vms: on a terminal one line that a spinner keeps alive, otherwise a plain
 * line per state. The answer is the daemon's, so success and failure are exactly the API's. */
static int cli_vm_create(Cli *c, const CliCommand *cmd, CliParsed *p) {
        static const char spinner[] = "|/-\\";
        _cleanup_(request_done) Request r = {};
        _cleanup_(answer_done) Answer a = {};
        _cleanup_free_ char *path = NULL, *last_state = NULL;
        json_auto_t *body = NULL, *existing = NULL;
        const char *name = json_string_value(json_object_get(p->args, "name"));
        bool tty = isatty(STDERR_FILENO) && !c->json, no_wait = json_object_get(p->extra, "no-wait");
        struct timespec t0;
        CURLM *multi;
        int running = 1, k, tick = 0;
        CURLcode cc = CURLE_OK;

        if (no_wait)
                json_object_set_new(p->args, "wait_for", json_string("none"));
        if (no_wait || c->json) {
                k = run_op(c, cmd, p->args, &a);
                return k != 0 ? k : print_result(c, cmd, a.json);
        }

        if (op_request_path(operation_find(cmd->op), p->args, &path, &body) < 0 ||
            request_init(c, &r, "POST", path, body) < 0)
                return CLI_EXIT_INTERNAL;
        multi = curl_multi_init();
        if (!multi || curl_multi_add_handle(multi, r.easy) != CURLM_OK)
                return CLI_EXIT_INTERNAL;

        /* A VM that has the name already is not the one being created: its states are not progress. */
        {
                _cleanup_(answer_done) Answer before = {};
                if (call(c, "GET", "/vms", NULL, &before) == 0)
                        existing = json_incref(find_by_name(before.json, name));
        }
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fprintf(stderr, "Creating VM %s on %s\n", name, c->base);
        while (running) {
                CURLMsg *m;
                int left;

                curl_multi_perform(multi, &running);
                while ((m = curl_multi_info_read(multi, &left)))
                        if (m->msg == CURLMSG_DONE)
                                cc = m->data.result;
                if (!running)
                        break;
                (void) curl_multi_poll(multi, NULL, 0, 500, NULL);

                /* Every half second: the VM's state as the daemon has it now. */
                _cleanup_(request_done) Request lr = {};
                if (request_init(c, &lr, "GET", "/vms", NULL) >= 0 && curl_easy_perform(lr.easy) == CURLE_OK) {
                        json_auto_t *list = json_loadb(lr.answer.data ?: "", lr.answer.len, 0, NULL);
                        json_t *vm = find_by_name(list, name);
                        if (vm && existing &&
                            streq_ptr(
                                    json_string_value(json_object_get(vm, "id")),
                                    json_string_value(json_object_get(existing, "id"))))
                                vm = NULL;
                        const char *state = json_string_value(json_object_get(vm, "state"));
                        const char *status = json_string_value(json_object_get(vm, "status"));

                        if (state && !streq_ptr(state, last_state)) {
                                if (tty)
                                        fprintf(stderr, "\r\033[K");
                                fprintf(stderr,
                                        "[%6.1fs] %s%s%s\n",
                                        elapsed_since(&t0),
                                        state,
                                        status ? ": " : "",
                                        status ?: "");
                                free(last_state);
                                last_state = strdup(state);
                        }
                }
                if (tty)
                        fprintf(stderr,
                                "\r\033[K%c %s %.0fs",
                                spinner[tick++ % 4],
                                last_state ?: "waiting",
                                elapsed_since(&t0));
        }
        if (tty)
                fprintf(stderr, "\r\033[K");
        curl_multi_remove_handle(multi, r.easy);
        curl_multi_cleanup(multi);

        k = request_finish(c, &r, cc, &a);
        if (k != 0) {
                if (k == CLI_EXIT_VM_FAILED || k == CLI_EXIT_TIMEOUT)
                        fprintf(stderr, "See what the guest printed: vm-manager vm console %s\n", name);
                return k;
        }
        const char *state = json_string_value(json_object_get(a.json, "state")),
                   *ip = json_string_value(json_object_get(a.json, "ip"));
        if (!streq_ptr(state, last_state))
                fprintf(stderr, "[%6.1fs] %s\n", elapsed_since(&t0), state ?: "?");
        printf("VM %s is %s after %.1fs%s%s.\n",
               name,
               state ?: "?",
               elapsed_since(&t0),
               ip ? ", address " : "",
               ip ?: "");
        printf("Next: vm-manager vm shell %s   (or vm exec %s -- CMD...)\n", name, name);
        return 0;
}

/* ---- vm exec ---- */

static int cli_vm_exec(Cli *c, const CliCommand *cmd, CliParsed *p, const char *id) {
        _cleanup_(answer_done) Answer a = {};
        const char *s;
        json_t *code;
        int k;

        json_object_set_new(p->args, "id", json_string(id));
        if (!isatty(STDIN_FILENO) && operation_param_find(operation_find(cmd->op), "stdin")) {
                _cleanup_free_ char *in = NULL;
                k = read_input("-", CLI_STDIN_MAX, &in);
                if (k < 0) {
                        fprintf(stderr, "Error: stdin: %s\n", k == -EFBIG ? "more than 1 MiB" : strerror(-k));
                        return CLI_EXIT_EXEC_FAILED;
                }
                json_t *text = json_string(in);
                if (!text) {
                        fprintf(stderr, "Error: stdin is not UTF-8 text, which is all exec_vm takes\n");
                        return CLI_EXIT_EXEC_FAILED;
                }
                json_object_set_new(p->args, "stdin", text);
        }
        k = run_op(c, cmd, p->args, &a);
        if (k != 0)
                return CLI_EXIT_EXEC_FAILED;
        if (c->json)
                return print_result(c, cmd, a.json);
        s = json_string_value(json_object_get(a.json, "stdout"));
        if (s)
                fputs(s, stdout);
        fflush(stdout);
        s = json_string_value(json_object_get(a.json, "stderr"));
        if (s)
                fputs(s, stderr);
        if (json_is_true(json_object_get(a.json, "stdoutTruncated")) ||
            json_is_true(json_object_get(a.json, "stderrTruncated")))
                fprintf(stderr, "vm-manager: the output was cut at 1 MiB per stream\n");
        code = json_object_get(a.json, "exitCode");
        return json_is_integer(code) ? (int) (json_integer_value(code) & 0xff) : CLI_EXIT_EXEC_FAILED;
}

/* ---- vm console ---- */

typedef struct Follow {
        uint64_t start, got;
        bool have_start;
        Request *req; /* the connection of now: an answer other than 200 goes to its buffer */
} Follow;

static size_t on_console(char *ptr, size_t size, size_t nmemb, void *userdata) {
        Follow *f = userdata;
        size_t n = size * nmemb;
        long status = 0;

        (void) curl_easy_getinfo(f->req->easy, CURLINFO_RESPONSE_CODE, &status);
        if (status != 200)
                return curl_buffer_write(ptr, size, nmemb, &f->req->answer);
        if (fwrite(ptr, 1, n, stdout) != n)
                return 0;
        fflush(stdout);
        f->got += n;
        return n;
}

static size_t on_console_header(char *buf, size_t size, size_t nmemb, void *userdata) {
        Follow *f = userdata;
        size_t n = size * nmemb;
        const char *h = "x-console-offset:";

        if (n > strlen(h) && strncasecmp(buf, h, strlen(h)) == 0) {
                f->start = strtoull(buf + strlen(h), NULL, 10);
                f->got = 0;
                f->have_start = true;
        }
        return n;
}

static struct termios saved_termios;
static bool termios_saved;

static void restore_terminal(void) {
        if (termios_saved)
                (void) tcsetattr(STDIN_FILENO, TCSANOW, &saved_termios);
}

/* Streams GET /vms/{id}/console/stream and reconnects where it left off when the stream ends and the
 * VM is still there; Ctrl-] on a terminal detaches. */
static int vm_console_follow(Cli *c, const char *id) {
        _cleanup_free_ char *seg = escape_segment(id);
        bool tty = isatty(STDIN_FILENO);
        Follow f = {};
        int result = 0;

        if (!seg)
                return CLI_EXIT_INTERNAL;
        if (tty && tcgetattr(STDIN_FILENO, &saved_termios) == 0) {
                struct termios raw = saved_termios;
                raw.c_lflag &= ~(ICANON | ECHO | ISIG);
                raw.c_cc[VMIN] = 1;
                raw.c_cc[VTIME] = 0;
                termios_saved = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
                atexit(restore_terminal);
                fprintf(stderr, "Following the console of %s; Ctrl-] detaches.\r\n", id);
        }

        for (;;) {
                _cleanup_(request_done) Request r = {};
                _cleanup_free_ char *path = NULL;
                CURLM *multi;
                CURLcode cc = CURLE_OK;
                int running = 1;
                bool detach = false;
                long status = 0;

                if ((f.have_start ? asprintf(
                                            &path,
                                            "/vms/%s/console/stream?offset=%llu",
                                            seg,
                                            (unsigned long long) (f.start + f.got)) :
                                    asprintf(&path, "/vms/%s/console/stream", seg)) < 0) {
                        path = NULL;
                        return CLI_EXIT_INTERNAL;
                }
                if (request_init(c, &r, "GET", path, NULL) < 0)
                        return CLI_EXIT_INTERNAL;
                (void) curl_easy_setopt(r.easy, CURLOPT_HEADERFUNCTION, on_console_header);
                (void) curl_easy_setopt(r.easy, CURLOPT_HEADERDATA, &f);
                (void) curl_easy_setopt(r.easy, CURLOPT_WRITEFUNCTION, on_console);
                (void) curl_easy_setopt(r.easy, CURLOPT_WRITEDATA, &f);
                f.req = &r;
                multi = curl_multi_init();
                if (!multi || curl_multi_add_handle(multi, r.easy) != CURLM_OK)
                        return CLI_EXIT_INTERNAL;

                while (running && !detach) {
                        struct curl_waitfd in = { .fd = STDIN_FILENO, .events = CURL_WAIT_POLLIN };
                        CURLMsg *m;
                        int left;

                        curl_multi_perform(multi, &running);
                        while ((m = curl_multi_info_read(multi, &left)))
                                if (m->msg == CURLMSG_DONE)
                                        cc = m->data.result;
                        if (!running)
                                break;
                        in.revents = 0;
                        (void) curl_multi_poll(multi, tty ? &in : NULL, tty ? 1 : 0, 1000, NULL);
                        if (tty && (in.revents & CURL_WAIT_POLLIN)) {
                                char ch[64];
                                ssize_t n = read(STDIN_FILENO, ch, sizeof(ch));
                                if (n <= 0 || memchr(ch, CLI_DETACH_KEY, (size_t) n))
                                        detach = true;
                        }
                }
                curl_multi_remove_handle(multi, r.easy);
                curl_multi_cleanup(multi);
                if (detach) {
                        fprintf(stderr, "\r\nDetached from the console of %s.\r\n", id);
                        break;
                }
                (void) curl_easy_getinfo(r.easy, CURLINFO_RESPONSE_CODE, &status);
                if (status != 200 || cc != CURLE_OK) {
                        _cleanup_(answer_done) Answer a = {};
                        /* a stream cut mid-way (a restarting daemon) is tried again; an error is final */
                        if (status == 200 && cc == CURLE_PARTIAL_FILE) {
                                sleep(1);
                                continue;
                        }
                        result = request_finish(c, &r, cc, &a);
                        break;
                }
                /* The stream ended: the VM is gone, or the server closed an idle stream. */
                _cleanup_(answer_done) Answer a = {};
                _cleanup_free_ char *vm_path = NULL;
                if (asprintf(&vm_path, "/vms/%s", seg) < 0)
                        return CLI_EXIT_INTERNAL;
                result = call(c, "GET", vm_path, NULL, &a);
                if (result != 0) {
                        if (result == CLI_EXIT_NOT_FOUND)
                                result = 0; /* deleted while followed: the console is over */
                        break;
                }
        }
        restore_terminal();
        termios_saved = false;
        return result;
}

static int cli_vm_console(Cli *c, const CliCommand *cmd, CliParsed *p, const char *id) {
        _cleanup_(answer_done) Answer a = {};
        int k;

        if (json_object_get(p->extra, "follow"))
                return vm_console_follow(c, id);
        json_object_set_new(p->args, "id", json_string(id));
        k = run_op(c, cmd, p->args, &a);
        if (k != 0)
                return k;
        if (c->json)
                return print_result(c, cmd, a.json);
        const char *text = json_string_value(json_object_get(a.json, "console"));
        if (text && *text)
                printf("%s\n", text);
        return 0;
}

/* ---- dispatch ---- */

/* ---- vm shell ---- */

static volatile sig_atomic_t window_changed;

static void on_sigwinch(int sig) {
        window_changed = 1;
}

/* SIGTERM or SIGHUP (the terminal went away) while the terminal is raw: the relay ends, the terminal
 * is given back as it was, and the client exits 128 + the signal, the shell hung up on. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
        stop_signal = sig;
}

/* All of n bytes through curl's connection (waiting for room as it needs). */
static int shell_send_all(CURL *e, curl_socket_t fd, const void *data, size_t n) {
        while (n > 0) {
                size_t sent = 0;
                CURLcode cc = curl_easy_send(e, data, n, &sent);

                if (cc == CURLE_AGAIN) {
                        struct pollfd p = { .fd = fd, .events = POLLOUT };
                        (void) poll(&p, 1, 1000);
                        continue;
                }
                if (cc != CURLE_OK)
                        return -EIO;
                data = (const char *) data + sent;
                n -= sent;
        }
        return 0;
}

static void shell_send_window(CURL *e, curl_socket_t fd) {
        struct winsize ws = {};
        uint8_t f[SHELL_FRAME_HEADER_SIZE + 4];

        if (ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) < 0 || ws.ws_row == 0 || ws.ws_col == 0)
                return;
        (void) shell_send_all(e, fd, f, shell_frame_resize(f, ws.ws_row, ws.ws_col));
}

/* Says that the server at c->base has no vm shell (what it answered instead is why): 255. */
static int shell_unsupported(Cli *c, long status, const char *message) {
        fprintf(stderr,
                "Error: %s does not serve vm shell (it answered HTTP %ld%s%s): a vm-manager older than this "
                "client, or a proxy that drops \"Upgrade\"?\n"
                "vm-manager vm exec NAME -- CMD runs commands there.\n",
                c->base,
                status,
                message ? ": " : "",
                message ?: "");
        return CLI_EXIT_EXEC_FAILED;
}

/* What a refusal of the upgrade means for the user: the API's message, or that the server has no vm
 * shell. The VM was found a moment ago (resolve_vm()), so a 404 is asked again: a VM still there
 * means the route is missing. Returns 255 once it was said. */
static int shell_refused(Cli *c, const char *id, long status, const char *body, size_t body_len) {
        _cleanup_(answer_done) Answer a = {};
        _cleanup_free_ char *seg = escape_segment(id), *path = NULL;
        json_auto_t *j = json_loadb(body, body_len, 0, NULL);
        json_t *err = json_object_get(j, "error");
        const char *m = json_string_value(json_object_get(err, "message"));

        if (!m || status < 400 || status == 405 || status == 426 || status == 501)
                return shell_unsupported(c, status, m);
        if (status == 404) {
                if (!seg || asprintf(&path, "/vms/%s", seg) < 0)
                        return CLI_EXIT_EXEC_FAILED;
                if (call(c, "GET", path, NULL, &a) != 0)
                        return CLI_EXIT_EXEC_FAILED; /* gone meanwhile: its not_found is printed */
                return shell_unsupported(c, status, m);
        }
        fprintf(stderr, "%s\n", m);
        if (status == 401 && !c->token)
                fprintf(stderr,
                        "The daemon wants a bearer token: set $VM_MANAGER_TOKEN or --token-file FILE.\n");
        return CLI_EXIT_EXEC_FAILED;
}

/* Whether the head (up to its blank line at end) names protocol in its Upgrade header. */
static bool shell_head_upgrades_to(const char *head, const char *end, const char *protocol) {
        const char *u = strcasestr(head, "\r\nupgrade:");

        if (!u || u > end)
                return false;
        u += strlen("\r\nupgrade:");
        u += strspn(u, " \t");
        return strncasecmp(u, protocol, strlen(protocol)) == 0 && strchr("\r \t;", u[strlen(protocol)]);
}

/* The answer to the upgrade request: 0 for the 101 to vm-manager-shell (bytes after it stay in buf,
 * *len of them), or 255 once what went wrong was printed. */
static int shell_read_answer(
        Cli *c, CURL *e, curl_socket_t fd, const char *id, char *buf, size_t size, size_t *len) {
        for (;;) {
                size_t got = 0;
                CURLcode cc;
                char *end;

                buf[*len] = 0;
                end = strstr(buf, "\r\n\r\n");
                if (end) {
                        const char *cl = strcasestr(buf, "\r\ncontent-length:");
                        size_t head = (size_t) (end + 4 - buf);
                        long status = strtol(buf + strcspn(buf, " "), NULL, 10);
                        size_t body_len = cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0;

                        if (status == 101) {
                                if (!shell_head_upgrades_to(buf, end, "vm-manager-shell"))
                                        return shell_unsupported(c, status, "another protocol");
                                memmove(buf, buf + head, *len - head);
                                *len -= head;
                                return 0;
                        }
                        if (*len - head >= body_len || body_len >= size - head)
                                return shell_refused(c, id, status, end + 4, MIN(*len - head, body_len));
                }
                if (*len >= size - 1) {
                        fprintf(stderr, "Error: %s answered with headers too large\n", c->base);
                        return CLI_EXIT_EXEC_FAILED;
                }
                cc = curl_easy_recv(e, buf + *len, size - 1 - *len, &got);
                if (cc == CURLE_AGAIN) {
                        struct pollfd p = { .fd = fd, .events = POLLIN };
                        (void) poll(&p, 1, 1000);
                        continue;
                }
                if (cc != CURLE_OK || got == 0) {
                        fprintf(stderr, "Error: %s closed the connection without an answer\n", c->base);
                        return CLI_EXIT_EXEC_FAILED;
                }
                *len += got;
        }
}

/* The server's frames in buf: output to stdout; *ret_status once EXIT or ERROR came (255 for an
 * ERROR, as ssh exits when it could not run). Returns the bytes taken, or -EBADMSG. */
static int shell_take_frames(const uint8_t *buf, size_t len, int *ret_status) {
        size_t off = 0;

        for (;;) {
                ShellFrame f;
                int k = shell_frame_parse(buf + off, len - off, &f);

                if (k <= 0)
                        return k < 0 ? k : (int) off;
                off += (size_t) k;
                if (f.type == SHELL_FRAME_DATA) {
                        if (fwrite(f.payload, 1, f.size, stdout) != f.size)
                                return -EIO;
                        fflush(stdout);
                } else if (f.type == SHELL_FRAME_EXIT)
                        *ret_status = (int) f.status;
                else if (f.type == SHELL_FRAME_ERROR) {
                        fprintf(stderr,
                                "%s%.*s\n",
                                termios_saved ? "\r\n" : "",
                                (int) f.size,
                                (const char *) f.payload);
                        *ret_status = 255;
                } else
                        return -EBADMSG;
        }
}

/* Relays stdin and stdout to the session until its end: the exit status to exit with. */
static int shell_relay(CURL *e, curl_socket_t fd, bool tty, uint8_t *in, size_t in_len, size_t in_size) {
        bool stdin_open = true;
        int status = -1;

        for (;;) {
                struct pollfd p[2] = { { .fd = fd, .events = POLLIN },
                                       { .fd = STDIN_FILENO, .events = POLLIN } };
                size_t got = 0;
                CURLcode cc;
                int k;

                k = shell_take_frames(in, in_len, &status);
                if (k < 0) {
                        fprintf(stderr, "\r\nvm shell: the server sent a frame it may not send\r\n");
                        return 255;
                }
                memmove(in, in + k, in_len - (size_t) k);
                in_len -= (size_t) k;
                if (status >= 0)
                        return status;
                if (stop_signal)
                        return 128 + stop_signal;
                if (window_changed) {
                        window_changed = 0;
                        shell_send_window(e, fd);
                }
                (void) poll(p, stdin_open ? 2 : 1, 1000);
                if (stdin_open && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
                        char keys[4096];
                        ssize_t n = read(STDIN_FILENO, keys, sizeof(keys));
                        char *detach = tty && n > 0 ? memchr(keys, CLI_DETACH_KEY, (size_t) n) : NULL;
                        uint8_t h[SHELL_FRAME_HEADER_SIZE];

                        if (detach)
                                n = detach - keys;
                        if (n > 0) {
                                shell_frame_header(h, SHELL_FRAME_DATA, (size_t) n);
                                if (shell_send_all(e, fd, h, sizeof(h)) < 0 ||
                                    shell_send_all(e, fd, keys, (size_t) n) < 0)
                                        return 255;
                        } else if (!detach)
                                stdin_open = false; /* the shell goes on: it ends when it exits */
                        if (detach) {
                                fprintf(stderr, "\r\nDetached from the shell.\r\n");
                                return 0;
                        }
                }
                cc = curl_easy_recv(e, in + in_len, in_size - in_len, &got);
                if (cc == CURLE_AGAIN)
                        continue;
                if (cc != CURLE_OK || got == 0) {
                        fprintf(stderr,
                                "%svm shell: the session ended without an exit status\n",
                                tty ? "\r\n" : "");
                        return 255;
                }
                in_len += got;
        }
}

static int cli_vm_shell(Cli *c, const char *id) {
        _cleanup_(curl_easy_cleanupp) CURL *e = curl_easy_init();
        _cleanup_free_ char *seg = escape_segment(id), *req = NULL, *host = NULL;
        _cleanup_free_ uint8_t *in = malloc(2 * (SHELL_FRAME_HEADER_SIZE + SHELL_FRAME_PAYLOAD_MAX));
        size_t in_len = 0, in_size = 2 * (SHELL_FRAME_HEADER_SIZE + SHELL_FRAME_PAYLOAD_MAX);
        bool tty = isatty(STDIN_FILENO);
        curl_socket_t fd = CURL_SOCKET_BAD;
        char errbuf[CURL_ERROR_SIZE] = "";
        CURLcode cc;
        int k;

        if (!e || !seg || !in)
                return CLI_EXIT_EXEC_FAILED;
        host = strdup(c->base + strcspn(c->base, "/") + 2);
        if (!host)
                return CLI_EXIT_EXEC_FAILED;
        host[strcspn(host, "/")] = 0;
        if (asprintf(
                    &req,
                    "GET /api/v1/vms/%s/shell HTTP/1.1\r\nHost: %s\r\nUpgrade: vm-manager-shell\r\n"
                    "Connection: Upgrade\r\n%s%s%s\r\n",
                    seg,
                    host,
                    c->token ? "Authorization: Bearer " : "",
                    c->token ?: "",
                    c->token ? "\r\n" : "") < 0) {
                req = NULL;
                return CLI_EXIT_EXEC_FAILED;
        }
        (void) curl_easy_setopt(e, CURLOPT_URL, c->base);
        (void) curl_easy_setopt(e, CURLOPT_CONNECT_ONLY, 1L);
        (void) curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
        (void) curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
        (void) curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
        cc = curl_easy_perform(e);
        if (cc == CURLE_OK)
                cc = curl_easy_getinfo(e, CURLINFO_ACTIVESOCKET, &fd);
        if (cc != CURLE_OK || fd == CURL_SOCKET_BAD) {
                fprintf(stderr,
                        "Error: cannot reach vm-manager at %s: %s\n",
                        c->base,
                        errbuf[0] ? errbuf : curl_easy_strerror(cc));
                return CLI_EXIT_EXEC_FAILED;
        }
        if (shell_send_all(e, fd, req, strlen(req)) < 0) {
                fprintf(stderr, "Error: %s closed the connection\n", c->base);
                return CLI_EXIT_EXEC_FAILED;
        }
        k = shell_read_answer(c, e, fd, id, (char *) in, in_size, &in_len);
        if (k != 0)
                return k;

        if (tty && tcgetattr(STDIN_FILENO, &saved_termios) == 0) {
                struct termios raw = saved_termios;

                cfmakeraw(&raw);
                termios_saved = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
                atexit(restore_terminal);
                (void) signal(SIGWINCH, on_sigwinch);
                (void) signal(SIGTERM, on_stop_signal);
                (void) signal(SIGHUP, on_stop_signal);
                shell_send_window(e, fd);
        }
        k = shell_relay(e, fd, tty, in, in_len, in_size);
        restore_terminal();
        termios_saved = false;
        return k;
}

void cli_help(FILE *f) {
        size_t n;
        const CliCommand *t = cli_commands(&n);

        fprintf(f, "Client commands, against a running daemon (--url, $VM_MANAGER_URL):\n");
        for (size_t i = 0; i < n; i++) {
                char left[64];
                snprintf(
                        left,
                        sizeof(left),
                        "%s%s%s %s",
                        t[i].group,
                        t[i].verb ? " " : "",
                        t[i].verb ?: "",
                        cli_command_metavar(&t[i]) ?: "");
                fprintf(f, "  %-24s %s\n", left, t[i].summary);
        }
}

static void group_help(FILE *f, const char *group) {
        size_t n;
        const CliCommand *t = cli_commands(&n);

        fprintf(f, "Usage: vm-manager %s COMMAND [FLAGS]\n\nCommands:\n", group);
        for (size_t i = 0; i < n; i++)
                if (streq(t[i].group, group))
                        fprintf(f, "  %-10s %s\n", t[i].verb ?: "", t[i].summary);
        fprintf(f, "\nEvery command takes --help; --output json prints the API's JSON.\n");
}

bool cli_handles(int argc, char **argv) {
        if (argc < 1)
                return false;
        if ((streq(argv[0], "vm") || streq(argv[0], "network") || streq(argv[0], "host")))
                return true;
        return streq(argv[0], "image") && argc >= 2 && streq(argv[1], "list");
}

/* Takes the global flags out of argv (up to a "--"): what remains is the command. */
static int take_global_flags(int *argc, char **argv, char **url, char **output, char **token_file) {
        int j = 0, i;

        for (i = 0; i < *argc; i++) {
                const char *a = argv[i];
                char **dest = NULL;
                const char *value = NULL;

                if (streq(a, "--")) {
                        break;
                }
                if (streq(a, "--url") || streq(a, "--output") || streq(a, "-o") || streq(a, "--token-file")) {
                        if (i + 1 >= *argc) {
                                fprintf(stderr, "Error: %s needs a value\n", a);
                                return -EINVAL;
                        }
                        value = argv[++i];
                        dest = streq(a, "--url") ? url : streq(a, "--token-file") ? token_file : output;
                } else if (strneq(a, "--url=", 6)) {
                        value = a + 6;
                        dest = url;
                } else if (strneq(a, "--output=", 9)) {
                        value = a + 9;
                        dest = output;
                } else if (strneq(a, "--token-file=", 13)) {
                        value = a + 13;
                        dest = token_file;
                }
                if (dest) {
                        free(*dest);
                        *dest = strdup(value);
                        if (!*dest)
                                return -ENOMEM;
                        continue;
                }
                argv[j++] = argv[i];
        }
        for (; i < *argc; i++)
                argv[j++] = argv[i];
        argv[j] = NULL;
        *argc = j;
        return 0;
}

static int load_token(const char *file, char **ret) {
        const char *f = file ?: secure_getenv("VM_MANAGER_TOKEN_FILE"), *t = secure_getenv("VM_MANAGER_TOKEN");
        _cleanup_free_ char *s = NULL;

        *ret = NULL;
        if (f && *f) {
                int k = read_full_file(f, 64 * 1024, &s, NULL);
                if (k < 0) {
                        fprintf(stderr, "Error: token file %s: %s\n", f, strerror(-k));
                        return k;
                }
                s[strcspn(s, "\r\n")] = 0;
                *ret = TAKE_PTR(s);
                return 0;
        }
        if (t && *t) {
                *ret = strdup(t);
                return *ret ? 0 : -ENOMEM;
        }
        return 0;
}

int cli_main(int argc, char **argv, const char *default_listen) {
        _cleanup_free_ char *url = NULL, *output = NULL, *token_file = NULL, *id = NULL, *error = NULL;
        _cleanup_(cli_done) Cli c = {};
        _cleanup_(cli_parsed_done) CliParsed p = {};
        _cleanup_(answer_done) Answer a = {};
        const CliCommand *cmd;
        const char *group, *verb;
        int k, rest;

        if (take_global_flags(&argc, argv, &url, &output, &token_file) < 0)
                return CLI_EXIT_USAGE;
        if (argc < 1)
                return CLI_EXIT_USAGE;
        group = argv[0];
        if (streq(group, "host")) {
                verb = NULL;
                rest = 1;
        } else {
                if (argc < 2 || streq(argv[1], "--help") || streq(argv[1], "-h") || streq(argv[1], "help")) {
                        group_help(argc < 2 ? stderr : stdout, group);
                        return argc < 2 ? CLI_EXIT_USAGE : 0;
                }
                verb = argv[1];
                rest = 2;
        }
        cmd = cli_command_find(group, verb);
        if (!cmd) {
                fprintf(stderr, "Error: unknown command '%s %s'\n", group, verb ?: "");
                group_help(stderr, group);
                return CLI_EXIT_USAGE;
        }
        k = cli_parse(cmd, argc - rest, argv + rest, &p, &error);
        if (k < 0) {
                fprintf(stderr,
                        "Error: %s %s: %s\nRun 'vm-manager %s %s --help' for its flags.\n",
                        group,
                        verb ?: "",
                        error ?: "out of memory",
                        group,
                        verb ?: "");
                return CLI_EXIT_USAGE;
        }
        if (p.help) {
                cli_command_help(stdout, cmd);
                return 0;
        }
        /* A shell without a terminal has no keys to relay and no window to size; commands from a
         * script or a pipe are what vm exec is for. Said before anything is sent. */
        if (streq_ptr(cmd->verb, "shell") && !isatty(STDIN_FILENO)) {
                fprintf(stderr,
                        "Error: vm shell needs a terminal on stdin; from a script or a pipe use\n"
                        "  vm-manager vm exec NAME -- sh -c 'CMD'   (stdin, output and exit status passed through)\n");
                return CLI_EXIT_USAGE;
        }
        if (output && !streq(output, "table") && !streq(output, "json")) {
                fprintf(stderr, "Error: --output must be table or json, not '%s'\n", output);
                return CLI_EXIT_USAGE;
        }
        c.json = output && streq(output, "json");
        c.base = cli_base_url(
                url, secure_getenv("VM_MANAGER_URL"), secure_getenv("VM_MANAGER_LISTEN"), default_listen);
        if (!c.base || load_token(token_file, &c.token) < 0)
                return CLI_EXIT_USAGE;
        k = add_files(&p, cmd);
        if (k != 0)
                return k;

        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
                return CLI_EXIT_INTERNAL;

        if (streq(cmd->op, "create_vm"))
                return cli_vm_create(&c, cmd, &p);

        /* A VM is named by its name or its id. */
        if (cmd->positional && streq(cmd->positional, "id")) {
                k = resolve_vm(&c, json_string_value(json_object_get(p.args, "id")), &id);
                if (k != 0)
                        return streq(cmd->op, "exec_vm") || streq_ptr(cmd->verb, "shell") ?
                                CLI_EXIT_EXEC_FAILED :
                                k;
                json_object_set_new(p.args, "id", json_string(id));
        }
        if (streq(cmd->op, "exec_vm"))
                return cli_vm_exec(&c, cmd, &p, id);
        if (streq(cmd->op, "get_vm_console"))
                return cli_vm_console(&c, cmd, &p, id);
        if (streq_ptr(cmd->verb, "shell"))
                return cli_vm_shell(&c, id);

        k = run_op(&c, cmd, p.args, &a);
        if (k != 0)
                return k;
        if (!a.json && !c.json) {
                const char *what = json_string_value(json_object_get(p.args, cmd->positional ?: "id"));
                printf("%s %s: %s\n", cmd->group, what ?: "", cmd->verb);
                return 0;
        }
        return print_result(&c, cmd, a.json);
}
