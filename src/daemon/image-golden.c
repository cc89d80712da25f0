/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* vm-manager image golden <image> (--from-vm <id> | --clear): records the golden PCRs of an image's
 * policy.json from a VM whose ready-stage quote verified, as a client of a running server's REST API
 * (GET /vms/<id>/attestation and GET /host), or clears them for a new round of learning. */
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attest-policy.h"
#include "cleanup.h"
#include "curl-util.h"
#include "flags.h"
#include "fs-util.h"
#include "image-golden.h"
#include "json-util.h"
#include "macro.h"
#include "serve.h"

#define GOLDEN_RESPONSE_MAX ((size_t) 1 << 20)
#define GOLDEN_TIMEOUT_SEC 10L

static char *arg_from_vm = NULL, *arg_server = NULL, *arg_token = NULL, *arg_image_dir = NULL;
static bool arg_clear = false;

static const Flag golden_flags[] = {
        { .name = "from-vm",
          .metavar = "ID",
          .help = "record the golden PCRs of this VM's verified ready-stage quote",
          .parse = flag_parse_string,
          .dest = &arg_from_vm },
        { .name = "clear",
          .help = "delete golden and golden_firmware from the policy",
          .parse = flag_parse_bool,
          .dest = &arg_clear,
          .is_bool = true },
        { .name = "server",
          .env = "VM_MANAGER_SERVER",
          .default_value = "http://127.0.0.1:8080",
          .metavar = "URL",
          .help = "the vm-manager server to ask",
          .parse = flag_parse_string,
          .dest = &arg_server },
        { .name = "token",
          .env = "VM_MANAGER_TOKEN",
          .metavar = "TOKEN",
          .help = "sent as Authorization: Bearer",
          .parse = flag_parse_string,
          .dest = &arg_token },
        { .name = "image-dir",
          .env = "VM_MANAGER_IMAGE_DIR",
          .metavar = "DIR",
          .help = "the image directory (default: the server's default, <state-dir>/images)",
          .parse = flag_parse_directory,
          .dest = &arg_image_dir },
};

void image_golden_help(void) {
        printf("Usage: vm-manager image golden IMAGE (--from-vm ID | --clear) [FLAGS]\n\n"
               "Records in IMAGE's policy.json the golden sha256 PCRs 0,2,3,4,6,7,13 that VM ID's verified\n"
               "ready-stage quote carried, with the firmware build of the server's host; or, with --clear,\n"
               "removes them. A server serving the directory reads the new policy within a second (it watches\n"
               "the directory); `make golden` in a checkout does the whole bring-up.\n\nFlags:\n");
        flags_print_help(stdout, golden_flags, ELEMENTSOF(golden_flags));
}

/* GET <server>/api/v1<path> → a JSON value, or an error printed on stderr. */
static int get_json(const char *path, json_t **ret) {
        _cleanup_free_ char *url = NULL, *auth = NULL;
        struct curl_slist *headers = NULL;
        _cleanup_(curl_buffer_done) CurlBuffer b = { .max = GOLDEN_RESPONSE_MAX };
        long status = 0;
        CURLcode c;
        CURL *h;
        int r = -EIO;

        if (asprintf(&url, "%s/api/v1%s", arg_server, path) < 0)
                return -ENOMEM;
        h = curl_easy_init();
        if (!h)
                return -ENOMEM;
        (void) curl_easy_setopt(h, CURLOPT_URL, url);
        (void) curl_easy_setopt(h, CURLOPT_TIMEOUT, GOLDEN_TIMEOUT_SEC);
        (void) curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, curl_buffer_write);
        (void) curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        (void) curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        if (arg_token && asprintf(&auth, "Authorization: Bearer %s", arg_token) >= 0)
                headers = curl_slist_append(headers, auth);
        if (headers)
                (void) curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
        c = curl_easy_perform(h);
        (void) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (c != CURLE_OK)
                fprintf(stderr,
                        "Error: GET %s: %s\n",
                        url,
                        b.too_big ? "the answer is larger than 1 MiB" : curl_easy_strerror(c));
        else if (status != 200)
                fprintf(stderr, "Error: GET %s: HTTP %ld: %s\n", url, status, b.data ?: "");
        else if (!(*ret = json_loadb(b.data ?: "", b.len, 0, NULL)))
                fprintf(stderr, "Error: GET %s: the answer is not JSON\n", url);
        else
                r = 0;
        curl_slist_free_all(headers);
        curl_easy_cleanup(h);
        return r;
}

/* The policy file of an image: <ref>.policy.json next to it, else the directory's shared policy.json. */
static int find_policy(const char *ref, char **ret) {
        _cleanup_free_ char *own = NULL, *shared = NULL;

        if (asprintf(&own, "%s/%s.policy.json", arg_image_dir, ref) < 0 ||
            asprintf(&shared, "%s/policy.json", arg_image_dir) < 0)
                return -ENOMEM;
        if (access(own, F_OK) == 0) {
                *ret = TAKE_PTR(own);
                return 0;
        }
        if (access(shared, F_OK) == 0) {
                *ret = TAKE_PTR(shared);
                return 0;
        }
        return -ENOENT;
}

static int write_policy(const char *path, json_t *policy) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(attest_policy_freep) AttestPolicy *p = NULL;
        _cleanup_free_ char *text = json_dumps(policy, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        _cleanup_free_ char *with_nl = NULL;

        if (!text || asprintf(&with_nl, "%s\n", text) < 0)
                return -ENOMEM;
        if (attest_policy_from_json(policy, &p, &e) < 0) {
                fprintf(stderr, "Error: the new policy would not be valid: %s\n", e.message ?: "?");
                return -EINVAL;
        }
        return write_file_atomic(path, with_nl, strlen(with_nl), 0644);
}

static int golden(const char *ref) {
        _cleanup_free_ char *path = NULL, *data = NULL, *vm_path = NULL;
        json_auto_t *policy = NULL, *att = NULL, *host = NULL, *gold = NULL, *fw = NULL;
        static const unsigned indexes[] = { 0, 2, 3, 4, 6, 7, 13 };
        json_t *ready, *pcrs, *hostfw;
        const char *fp, *sha, *pkg, *ver;
        size_t size = 0, found = 0;
        int r;

        r = find_policy(ref, &path);
        if (r < 0) {
                fprintf(stderr,
                        "Error: image %s has no policy.json in %s; run make image-verify and copy build/policy.json "
                        "next to the image\n",
                        ref,
                        arg_image_dir);
                return r;
        }
        r = read_full_file(path, (size_t) 4 << 20, &data, &size);
        if (r >= 0 && !(policy = json_loadb(data, size, 0, NULL)))
                r = -EBADMSG;
        if (r < 0 || !json_is_object(policy)) {
                fprintf(stderr, "Error: cannot read %s as a JSON object\n", path);
                return r < 0 ? r : -EBADMSG;
        }

        if (arg_clear) {
                (void) json_object_del(policy, "golden");
                (void) json_object_del(policy, "golden_firmware");
                r = write_policy(path, policy);
                if (r < 0)
                        return r;
                printf("cleared the golden PCR values of %s in %s; restart the server with --attestation-learn-golden, "
                       "boot one VM and record them with --from-vm\n",
                       ref,
                       path);
                return 0;
        }

        if (asprintf(&vm_path, "/vms/%s/attestation", arg_from_vm) < 0)
                return -ENOMEM;
        r = get_json(vm_path, &att);
        if (r < 0)
                return r;
        ready = json_object_get(att, "ready");
        if (!json_is_true(json_object_get(ready, "verified"))) {
                fprintf(stderr,
                        "Error: vm %s has no verified ready-stage quote (initrd verified: %s); boot it with "
                        "--attestation=verify\n",
                        arg_from_vm,
                        json_is_true(json_object_get(json_object_get(att, "initrd"), "verified")) ? "true" :
                                                                                                    "false");
                return -ENOENT;
        }
        pcrs = json_object_get(ready, "pcrs");
        gold = json_object();
        if (!gold)
                return -ENOMEM;
        for (size_t i = 0; i < ELEMENTSOF(indexes); i++) {
                char key[4];
                json_t *v;
                snprintf(key, sizeof(key), "%u", indexes[i]);
                v = json_object_get(pcrs, key);
                if (json_is_string(v)) {
                        json_object_set(gold, key, v);
                        found++;
                }
        }
        if (found != ELEMENTSOF(indexes)) {
                fprintf(stderr,
                        "Error: ready quote of vm %s carries %zu of the %zu golden PCRs; the server must run with "
                        "--attestation=verify\n",
                        arg_from_vm,
                        found,
                        ELEMENTSOF(indexes));
                return -ENOENT;
        }
        r = get_json("/host", &host);
        if (r < 0)
                return r;
        hostfw = json_object_get(host, "firmware");
        sha = json_string_value(json_object_get(hostfw, "sha256"));
        if (!sha) {
                fprintf(stderr, "Error: the server reports no firmware; it needs an OVMF code image\n");
                return -ENOENT;
        }
        pkg = json_string_value(json_object_get(hostfw, "package"));
        ver = json_string_value(json_object_get(hostfw, "version"));
        fw = json_pack("{s:s}", "sha256", sha);
        if (!fw || (pkg && json_object_set_new(fw, "package", json_string(pkg)) < 0) ||
            (ver && json_object_set_new(fw, "version", json_string(ver)) < 0) ||
            json_object_set_new(policy, "golden", json_pack("{s:O}", "sha256", gold)) < 0 ||
            json_object_set(policy, "golden_firmware", fw) < 0)
                return -ENOMEM;
        r = write_policy(path, policy);
        if (r < 0)
                return r;
        fp = json_string_value(json_object_get(ready, "akFingerprint"));
        printf("recorded golden sha256 PCRs 0,2,3,4,6,7,13 of vm %s (ak %s, firmware %s %s (sha256 %.16s)) into %s\n",
               arg_from_vm,
               fp ?: "?",
               pkg ?: "unknown",
               ver ?: "",
               sha,
               path);
        return 0;
}

static void free_args(void) {
        arg_from_vm = mfree(arg_from_vm);
        arg_server = mfree(arg_server);
        arg_token = mfree(arg_token);
        arg_image_dir = mfree(arg_image_dir);
        arg_clear = false;
}

int image_main(int argc, char **argv) {
        _cleanup_free_ char **args = NULL;
        bool help = false;
        int r;

        if (argc < 1 || !streq(argv[0], "golden")) {
                if (argc > 0 && (streq(argv[0], "--help") || streq(argv[0], "-h"))) {
                        image_golden_help();
                        return EXIT_SUCCESS;
                }
                fprintf(stderr, "Error: image: want the subcommand golden, push or pull\n");
                return EXIT_FAILURE;
        }
        r = flags_parse(
                golden_flags, ELEMENTSOF(golden_flags), argc - 1, argv + 1, "image golden", &help, &args);
        if (r < 0) {
                free_args();
                return EXIT_FAILURE;
        }
        if (help) {
                image_golden_help();
                free_args();
                return EXIT_SUCCESS;
        }
        if (!args || !args[0] || args[1] || !!arg_from_vm == arg_clear) {
                fprintf(stderr,
                        "Error: image golden: want one image and exactly one of --from-vm ID or --clear\n");
                free_args();
                return EXIT_FAILURE;
        }
        if (!arg_image_dir) {
                /* serve's default: <state-dir>/images */
                _cleanup_free_ char *state = getenv("VM_MANAGER_STATE_DIR") ?
                        strdup(getenv("VM_MANAGER_STATE_DIR")) :
                        NULL;
                if ((!state && default_state_dir(&state) < 0) ||
                    asprintf(&arg_image_dir, "%s/images", state) < 0) {
                        arg_image_dir = NULL;
                        free_args();
                        return EXIT_FAILURE;
                }
        }
        curl_global_init(CURL_GLOBAL_DEFAULT);
        r = golden(args[0]);
        curl_global_cleanup();
        free_args();
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
