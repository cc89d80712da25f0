/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* vm-manager image push|pull: one image of an --image-dir as an OCI artifact in a registry, and back
 * (src/oci/oci-image.h has the layout and the install). */
#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "flags.h"
#include "image-golden.h"
#include "image-oci.h"
#include "json-util.h"
#include "oci-auth.h"
#include "oci-image.h"
#include "oci-ref.h"
#include "oci-registry.h"
#include "parse-util.h"
#include "serve.h"
#include "time-util.h"
#include "version.h"

#define PASSWORD_MAX 4096
#define PROGRESS_INTERVAL_USEC (100 * USEC_PER_MSEC)

static char *arg_image_dir = NULL, *arg_username = NULL, *arg_ca_file = NULL, *arg_policy = NULL;
static bool arg_password_stdin = false, arg_plain_http = false, arg_json = false;
static uint64_t arg_chunk_size = 0;
static uint32_t arg_gzip_level = 0;
static usec_t arg_timeout = 0;

#define CHUNK_SIZE_MIN ((uint64_t) 64 << 10)
/* the trees hold erofs partitions compressed with lz4hc and the UKI: zlib saves about 15 % of
 * them, 7 % of the image, at 20-30 MB/s of CPU on a build machine, which makes a push two to four
 * times slower and pays only on links slower than that (docs/benchmarks.md); so they are stored */
#define GZIP_LEVEL_DEFAULT "0"
/* a whole pull: a 2 GB image at 10 Mbit/s takes about 27 minutes */
#define PULL_TIMEOUT_DEFAULT "30m"

static int parse_timeout(const Flag *f, const char *value, const char **ret_reason) {
        int r = flag_parse_duration(f, value, ret_reason);

        if (r < 0)
                return r;
        if (*(usec_t *) f->dest == 0) {
                *ret_reason = "want a duration above 0, such as 30m or 2h";
                return -EINVAL;
        }
        return 0;
}

static int parse_gzip_level(const Flag *f, const char *value, const char **ret_reason) {
        uint32_t v;

        if (safe_atou32(value, &v) < 0 || v > 9) {
                *ret_reason = "want a zlib level from 0 to 9";
                return -EINVAL;
        }
        *(uint32_t *) f->dest = v;
        return 0;
}

static int parse_chunk_size(const Flag *f, const char *value, const char **ret_reason) {
        uint64_t v;

        if (parse_size(value, &v) < 0 || v < CHUNK_SIZE_MIN) {
                *ret_reason = "want a size of at least 64K, e.g. 32M";
                return -EINVAL;
        }
        *(uint64_t *) f->dest = v;
        return 0;
}

#define COMMON_FLAGS                                                                                       \
        { .name = "image-dir",                                                                             \
          .env = "VM_MANAGER_IMAGE_DIR",                                                                   \
          .metavar = "DIR",                                                                                \
          .help = "the image directory (default: the server's default, <state-dir>/images)",               \
          .parse = flag_parse_directory,                                                                   \
          .dest = &arg_image_dir },                                                                        \
                { .name = "username",                                                                      \
                  .metavar = "NAME",                                                                       \
                  .help = "registry user; the password comes from --password-stdin",                       \
                  .parse = flag_parse_string,                                                              \
                  .dest = &arg_username },                                                                 \
                { .name = "password-stdin",                                                                \
                  .help = "read the password (or token) for --username from standard input",               \
                  .parse = flag_parse_bool,                                                                \
                  .dest = &arg_password_stdin,                                                             \
                  .is_bool = true },                                                                       \
                { .name = "plain-http",                                                                    \
                  .help = "talk to the registry over plain http instead of https",                         \
                  .parse = flag_parse_bool,                                                                \
                  .dest = &arg_plain_http,                                                                 \
                  .is_bool = true },                                                                       \
                { .name = "ca-file",                                                                       \
                  .metavar = "FILE",                                                                       \
                  .help = "PEM certificates to trust for the registry instead of the system's",            \
                  .parse = flag_parse_string,                                                              \
                  .dest = &arg_ca_file },                                                                  \
        {                                                                                                  \
                .name = "json", .help = "print the result as one JSON object (with the digest) on stdout", \
                .parse = flag_parse_bool, .dest = &arg_json, .is_bool = true                               \
        }

static const Flag push_flags[] = {
        COMMON_FLAGS,
        { .name = "chunk-size",
          .default_value = "32M",
          .metavar = "SIZE",
          .help = "blobs larger than this are uploaded in PATCH requests of this size (at least 64K)",
          .parse = parse_chunk_size,
          .dest = &arg_chunk_size },
        { .name = "gzip-level",
          .default_value = GZIP_LEVEL_DEFAULT,
          .metavar = "0-9",
          .help = "zlib level of the sysupdate trees' tar+gzip: 0 stores (their partitions are compressed "
                  "already), 1-9 compress",
          .parse = parse_gzip_level,
          .dest = &arg_gzip_level },
};

static const Flag pull_flags[] = {
        COMMON_FLAGS,
        { .name = "policy",
          .default_value = "keep",
          .metavar = "keep|replace",
          .help = "when the artifact's policy.json has no golden PCRs: keep those of the local one, or replace it",
          .parse = flag_parse_string,
          .dest = &arg_policy },
        { .name = "timeout",
          .default_value = PULL_TIMEOUT_DEFAULT,
          .metavar = "DURATION",
          .help = "give up on the pull after this long (90s, 30m, 2h), naming the blob that was still coming "
                  "and how much of it had arrived; nothing is changed",
          .parse = parse_timeout,
          .dest = &arg_timeout },
};

static void free_args(void) {
        arg_image_dir = mfree(arg_image_dir);
        arg_username = mfree(arg_username);
        arg_ca_file = mfree(arg_ca_file);
        arg_policy = mfree(arg_policy);
        arg_password_stdin = arg_plain_http = arg_json = false;
        arg_chunk_size = 0;
        arg_gzip_level = 0;
        arg_timeout = 0;
}

void image_push_help(void) {
        printf("Usage: vm-manager image push [FLAGS] IMAGE REF\n\n"
               "Publishes IMAGE (<id>_<version>, or an id for its newest version) of the image directory as\n"
               "one OCI artifact to REF (host[:port]/repository[:tag] or @sha256:<digest>): the .efi, the\n"
               ".raw, its .layout.json, policy.json and manifest.json as files, each tree of sysupdate/ as\n"
               "tar+gzip, with "
               "oras's annotations. Blobs the registry has are not sent again.\n\nFlags:\n");
        flags_print_help(stdout, push_flags, ELEMENTSOF(push_flags));
        printf("\nCredentials: --username with --password-stdin, else the entry of the registry's host in\n"
               "$REGISTRY_AUTH_FILE, $DOCKER_CONFIG/config.json, ~/.docker/config.json or\n"
               "$XDG_RUNTIME_DIR/containers/auth.json; anonymous otherwise.\n");
}

void image_pull_help(void) {
        printf("Usage: vm-manager image pull [FLAGS] REF\n\n"
               "Fetches the image artifact REF names into the image directory: every blob's digest is\n"
               "checked while it streams, everything is staged in the directory first and then moved in\n"
               "so that a running server never sees half an image; a failed pull changes nothing. A pull\n"
               "of the digest already installed fetches nothing.\n\nFlags:\n");
        flags_print_help(stdout, pull_flags, ELEMENTSOF(pull_flags));
        printf("\nCredentials: as for image push.\n");
}

void image_help(void) {
        printf("Usage: vm-manager image SUBCOMMAND ...\n\n"
               "  golden IMAGE (--from-vm ID | --clear)  record or clear an image's golden PCRs\n"
               "  push [FLAGS] IMAGE REF                  publish an image as an OCI artifact\n"
               "  pull [FLAGS] REF                        install an image from an OCI artifact\n\n"
               "vm-manager help image golden|push|pull, or --help after a subcommand, says more.\n");
}

/* One line of text for the terminal: control characters (a registry's message may carry any)
 * become spaces. */
static void print_error(const char *prog, const char *message) {
        _cleanup_free_ char *m = strdup(message ?: "failed");

        if (m)
                for (char *p = m; *p; p++)
                        if ((unsigned char) *p < 0x20 || *p == 0x7f)
                                *p = ' ';
        fprintf(stderr, "Error: %s: %s\n", prog, m ?: "failed");
}

/* ---- progress ---- */

typedef struct Progress {
        bool tty;
        char *label;
        usec_t started, shown;
} Progress;

static void format_bytes(uint64_t n, char *buf, size_t size) {
        if (n >= (uint64_t) 1 << 30)
                snprintf(buf, size, "%.2f GB", (double) n / 1e9);
        else if (n >= 1000000)
                snprintf(buf, size, "%.1f MB", (double) n / 1e6);
        else if (n >= 1000)
                snprintf(buf, size, "%.1f kB", (double) n / 1e3);
        else
                snprintf(buf, size, "%" PRIu64 " B", n);
}

static void on_progress(const OciProgress *p, void *userdata) {
        Progress *s = userdata;
        usec_t now = now_usec(CLOCK_MONOTONIC);
        char done[32], total[32];
        double secs;

        if (!s->tty)
                return;
        if (!s->label || !streq(s->label, p->label)) {
                free(s->label);
                s->label = strdup(p->label);
                s->started = now;
                s->shown = 0;
        }
        if (!p->finished && now - s->shown < PROGRESS_INTERVAL_USEC)
                return;
        s->shown = now;
        format_bytes(p->done, done, sizeof(done));
        format_bytes(p->total, total, sizeof(total));
        secs = (double) (now - s->started) / 1e6;
        if (p->existed)
                fprintf(stderr, "\r\033[K  %-44.44s  %10s  already in the registry\n", p->label, total);
        else
                fprintf(stderr,
                        "\r\033[K  %-44.44s  %10s / %-10s %7.1f MB/s%s",
                        p->label,
                        done,
                        total,
                        secs > 0 ? (double) p->done / 1e6 / secs : 0.0,
                        p->finished ? "\n" : "");
        fflush(stderr);
        if (p->finished)
                s->label = mfree(s->label);
}

/* ---- set-up shared by both ---- */

static int read_password(char **ret) {
        _cleanup_free_ char *buf = calloc(1, PASSWORD_MAX + 1);
        size_t n = 0;

        if (!buf)
                return -ENOMEM;
        while (n < PASSWORD_MAX) {
                ssize_t k = read(STDIN_FILENO, buf + n, PASSWORD_MAX - n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                if (k == 0)
                        break;
                n += (size_t) k;
        }
        if (n == PASSWORD_MAX)
                return -E2BIG;
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
                buf[--n] = 0;
        if (n == 0 || memchr(buf, 0, n))
                return -EINVAL;
        *ret = TAKE_PTR(buf);
        return 0;
}

/* Credentials for host: from the flags, else from the first credentials file with an entry. */
static int find_credentials(const char *host, char **ret_user, char **ret_pass, ApiError *reterr) {
        _cleanup_free_ char *docker = NULL, *home = NULL, *runtime = NULL;
        const char *files[4] = {};
        size_t n = 0;
        int r;

        if (arg_username || arg_password_stdin) {
                if (!arg_username || !arg_password_stdin)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INTERNAL,
                                "--username and --password-stdin go together");
                r = read_password(ret_pass);
                if (r < 0)
                        return api_error_set(
                                reterr,
                                r,
                                API_ERROR_INTERNAL,
                                "%s",
                                r == -E2BIG ? "the password on standard input is longer than 4096 bytes" :
                                        r == -EINVAL ? "no password (or one with a NUL) on standard input" :
                                                       "cannot read the password from standard input");
                *ret_user = strdup(arg_username);
                return *ret_user ? 0 : -ENOMEM;
        }

        if (getenv("REGISTRY_AUTH_FILE") && *getenv("REGISTRY_AUTH_FILE"))
                files[n++] = getenv("REGISTRY_AUTH_FILE");
        if (getenv("DOCKER_CONFIG") && *getenv("DOCKER_CONFIG")) {
                if (asprintf(&docker, "%s/config.json", getenv("DOCKER_CONFIG")) < 0)
                        return -ENOMEM;
                files[n++] = docker;
        } else if (getenv("HOME") && *getenv("HOME")) {
                if (asprintf(&home, "%s/.docker/config.json", getenv("HOME")) < 0)
                        return -ENOMEM;
                files[n++] = home;
        }
        if (getenv("XDG_RUNTIME_DIR") && *getenv("XDG_RUNTIME_DIR")) {
                if (asprintf(&runtime, "%s/containers/auth.json", getenv("XDG_RUNTIME_DIR")) < 0)
                        return -ENOMEM;
                files[n++] = runtime;
        }
        for (size_t i = 0; i < n; i++) {
                r = oci_auth_file_lookup(files[i], host, ret_user, ret_pass, reterr);
                if (r < 0)
                        return r;
                if (r > 0)
                        return 0;
        }
        *ret_user = *ret_pass = NULL;
        return 0;
}

static int default_image_dir(void) {
        _cleanup_free_ char *state = NULL;
        const char *env = getenv("VM_MANAGER_STATE_DIR");

        if (arg_image_dir)
                return 0;
        if (env && *env) {
                state = strdup(env);
                if (!state)
                        return -ENOMEM;
        } else if (default_state_dir(&state) < 0)
                return -ENOMEM;
        if (asprintf(&arg_image_dir, "%s/images", state) < 0) {
                arg_image_dir = NULL;
                return -ENOMEM;
        }
        return 0;
}

static char *erase_string(char *s) {
        if (s)
                explicit_bzero(s, strlen(s));
        return mfree(s);
}

typedef struct Session {
        OciRef ref;
        OciClient *client;
        Progress progress;
        char *user_agent;
} Session;

static void session_done(Session *s) {
        s->client = oci_client_free(s->client);
        oci_ref_done(&s->ref);
        s->progress.label = mfree(s->progress.label);
        s->user_agent = mfree(s->user_agent);
}

/* Now plus --timeout, saturated. */
static usec_t pull_deadline(void) {
        usec_t now = now_usec(CLOCK_MONOTONIC);

        if (arg_timeout == 0)
                return 0;
        return arg_timeout > USEC_INFINITY - now ? USEC_INFINITY : now + arg_timeout;
}

static int session_open(Session *s, const char *refstr, bool push, ApiError *reterr) {
        _cleanup_free_ char *user = NULL;
        char *pass = NULL;
        int r;

        *s = (Session){ .progress.tty = isatty(STDERR_FILENO) };
        r = oci_ref_parse(refstr, &s->ref, reterr);
        if (r < 0)
                return r;
        if (arg_ca_file && access(arg_ca_file, R_OK) < 0)
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot read --ca-file %s: %m", arg_ca_file);
        r = find_credentials(s->ref.host, &user, &pass, reterr);
        if (r < 0)
                return r;
        if (asprintf(&s->user_agent, "vm-manager/%s", vmm_version) < 0) {
                s->user_agent = NULL;
                pass = erase_string(pass);
                return -ENOMEM;
        }
        r = oci_client_new(
                &s->client,
                &(OciClientConfig){
                        .host = s->ref.host,
                        .repository = s->ref.repository,
                        .plain_http = arg_plain_http,
                        .ca_file = arg_ca_file,
                        .username = user,
                        .password = pass,
                        .push = push,
                        .chunk_size = arg_chunk_size,
                        /* counted from here: the pull's every exchange, pauses between attempts included */
                        .deadline = push ? 0 : pull_deadline(),
                        .user_agent = s->user_agent,
                        .progress = on_progress,
                        .progress_userdata = &s->progress,
                });
        pass = erase_string(pass);
        return r;
}

/* Runs a subcommand's argument handling; returns 1 when it should go on, 0 when it is done (help),
 * < 0 on a usage error (already printed). */
static int parse_args(
        const Flag *table,
        size_t n,
        int argc,
        char **argv,
        const char *prog,
        void (*help)(void),
        size_t want_args,
        char ***ret_args) {
        bool help_wanted = false;
        int r;

        r = flags_parse(table, n, argc, argv, prog, &help_wanted, ret_args);
        if (r < 0)
                return r;
        if (help_wanted) {
                help();
                return 0;
        }
        if (strv_length(*ret_args) != want_args) {
                fprintf(stderr,
                        "Error: %s: want %s; see vm-manager %s --help\n",
                        prog,
                        want_args == 2 ? "IMAGE and REF" : "REF",
                        prog);
                return -EINVAL;
        }
        r = default_image_dir();
        if (r < 0)
                return r;
        return 1;
}

/* The end of a subcommand: the one line of its error, then the clean-up; returns the exit status. */
static int finish(const char *prog, int r, const ApiError *e, Session *s) {
        if (r < 0)
                print_error(prog, api_error_is_set(e) ? e->message : strerror(-r));
        session_done(s);
        curl_global_cleanup();
        free_args();
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

static void print_json(json_t *j) {
        _cleanup_free_ char *text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        printf("%s\n", text ?: "{}");
}

int image_push_main(int argc, char **argv) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(oci_push_result_done) OciPushResult res = {};
        _cleanup_free_ char **args = NULL, *refstr = NULL;
        Session s = {};
        int r;

        r = parse_args(push_flags, ELEMENTSOF(push_flags), argc, argv, "image push", image_push_help, 2, &args);
        if (r <= 0) {
                free_args();
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        }
        curl_global_init(CURL_GLOBAL_DEFAULT);
        r = session_open(&s, args[1], /* push= */ true, &e);
        if (r >= 0)
                r = oci_image_push(s.client, arg_image_dir, args[0], &s.ref, (int) arg_gzip_level, &res, &e);
        if (r >= 0) {
                refstr = oci_ref_to_string(&s.ref);
                if (arg_json) {
                        json_auto_t *j = json_pack(
                                "{s:s, s:s, s:s, s:I, s:I, s:I}",
                                "image",
                                res.image,
                                "reference",
                                refstr ?: "",
                                "digest",
                                res.digest,
                                "layers",
                                (json_int_t) res.n_layers,
                                "size",
                                (json_int_t) res.size,
                                "sent",
                                (json_int_t) oci_client_bytes_sent(s.client));
                        print_json(j);
                } else
                        printf("pushed %s to %s (%s)\n", res.image, refstr ?: args[1], res.digest);
        }
        return finish("image push", r, &e, &s);
}

int image_pull_main(int argc, char **argv) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(oci_pull_result_done) OciPullResult res = {};
        _cleanup_free_ char **args = NULL, *refstr = NULL;
        Session s = {};
        OciPolicyMode mode;
        int r;

        r = parse_args(pull_flags, ELEMENTSOF(pull_flags), argc, argv, "image pull", image_pull_help, 1, &args);
        if (r <= 0) {
                free_args();
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        }
        mode = oci_policy_mode_from_string(arg_policy);
        if (mode < 0) {
                fprintf(stderr,
                        "Error: image pull: invalid value '%s' for --policy: want keep or replace\n",
                        arg_policy);
                free_args();
                return EXIT_FAILURE;
        }
        curl_global_init(CURL_GLOBAL_DEFAULT);
        r = session_open(&s, args[0], /* push= */ false, &e);
        if (r >= 0)
                r = oci_image_pull(
                        s.client, &s.ref, arg_image_dir, &(OciPullOptions){ .policy = mode }, &res, &e);
        if (r >= 0) {
                refstr = oci_ref_to_string(&s.ref);
                if (arg_json) {
                        json_auto_t *j = json_pack(
                                "{s:s, s:s, s:s, s:s, s:b, s:b, s:I}",
                                "image",
                                res.image,
                                "reference",
                                refstr ?: "",
                                "digest",
                                res.digest,
                                "directory",
                                arg_image_dir,
                                "upToDate",
                                res.up_to_date,
                                "keptGolden",
                                res.kept_golden,
                                "received",
                                (json_int_t) oci_client_bytes_received(s.client));
                        if (j && res.policy_file)
                                (void) json_object_set_new(j, "policyFile", json_string(res.policy_file));
                        print_json(j);
                } else if (res.up_to_date)
                        printf("%s in %s is up to date with %s (%s)\n",
                               res.image,
                               arg_image_dir,
                               refstr ?: args[0],
                               res.digest);
                else
                        printf("pulled %s (%s) into %s: %s%s\n",
                               refstr ?: args[0],
                               res.digest,
                               arg_image_dir,
                               res.image,
                               res.kept_golden ? "; kept the golden PCRs of the local policy" : "");
        }
        if (r == -ETIMEDOUT && api_error_is_set(&e)) {
                /* the registry client knows a deadline, the user a flag */
                char limit[64];
                char *m = NULL;

                asprintf_or_null(
                        &m, "%s (--timeout %s)", e.message, format_duration(limit, sizeof(limit), arg_timeout));
                if (m) {
                        free(e.message);
                        e.message = m;
                }
        }
        return finish("image pull", r, &e, &s);
}
