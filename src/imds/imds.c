/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file-writer.h"
#include "fs-util.h"
#include "http-server.h"
#include "imds-keys.h"
#include "imds.h"
#include "json-util.h"
#include "list.h"
#include "log.h"
#include "parse-util.h"

typedef struct HeldQuote HeldQuote;

struct ImdsServer {
        Manager *manager;
        HttpServer *http;
        HeldQuote *held; /* quotes whose answer waits for a firmware run, at most one per VM */
};

/* A quote whose answer waits for the firmware run of its VM's shape (vm_attest_quote_wait()): its
 * request stays suspended, the VM referenced, until the run ends or its limit passes. */
struct HeldQuote {
        ImdsServer *server;
        HeldQuote *prev, *next;
        HttpRequest *req;
        Vm *vm;
        FirmwareWait *wait;
};

#define TEXT "text/plain; charset=utf-8"

static void reply_text(HttpRequest *req, unsigned status, const char *text) {
        (void) http_request_reply(req, status, TEXT, text, strlen(text));
}

/* systemd-imdsd treats a >= 300 answer with a body as an error of its own; only a bodyless 404 is
 * "no such key". */
static void reply_no_key(HttpRequest *req) {
        (void) http_request_reply(req, 404, TEXT, "", 0);
}

static void reply_value(HttpRequest *req, const char *value) {
        if (!value || !value[0])
                reply_no_key(req);
        else
                reply_text(req, 200, value);
}

/* A single path segment: no slash, not "." or "..", not empty. */
static bool segment_ok(const char *s) {
        return s && s[0] && !strchr(s, '/') && !streq(s, ".") && !streq(s, "..");
}

static void serve_public_keys(HttpRequest *req, Vm *v, const char *rest) {
        const VmSpec *spec = vm_spec(v);
        size_t n = 1 + strv_length(spec->ssh_authorized_keys);
        uint32_t i;

        if (rest[0] == 0) {
                /* The bare path lists the valid indexes, one per line and without a trailing
                 * newline, so that the guest can fetch each key by its index. */
                _cleanup_free_ char *buf = NULL;
                size_t size = 0;
                FILE *f = open_memstream(&buf, &size);
                if (!f) {
                        reply_text(req, 500, "out of memory");
                        return;
                }
                for (size_t k = 0; k < n; k++)
                        fprintf(f, k ? "\n%zu" : "%zu", k);
                if (fclose(f) != 0) {
                        reply_text(req, 500, "out of memory");
                        return;
                }
                reply_text(req, 200, buf ?: "");
                return;
        }
        if (safe_atou32(rest, &i) < 0 || i >= n) {
                reply_no_key(req);
                return;
        }
        reply_value(req, i == 0 ? vm_ssh_public_key(v) : spec->ssh_authorized_keys[i - 1]);
}

static void serve_user_data(HttpRequest *req, Vm *v) {
        _cleanup_free_ char *path = vm_path(v, "user-data"), *data = NULL;
        size_t size = 0;
        int r;

        if (!path) {
                reply_text(req, 500, "out of memory");
                return;
        }
        if (!vm_user_data_released(v)) {
                (void) http_request_add_header(req, "Retry-After", IMDS_RETRY_AFTER);
                reply_text(req, 503, IMDS_USER_DATA_GATED);
                return;
        }
        r = read_full_file(path, (size_t) 64 << 20, &data, &size);
        if (r == -ENOENT || (r >= 0 && size == 0)) {
                (void) http_request_reply(req, 204, TEXT, "", 0);
                return;
        }
        if (r < 0) {
                reply_text(req, 500, "user-data unavailable");
                return;
        }
        (void) http_request_reply(req, 200, TEXT, data, size);
}

/* The answer to an upload, once the report worker is done with it; userdata is the request. */
static void on_report_done(int r, const ApiError *e, void *userdata) {
        HttpRequest *req = userdata;
        /* The guest reads plain text, so the API's "invalid request: " sentinel is cut off. */
        const char *m = e && e->message ? (startswith(e->message, "invalid request: ") ?: e->message) : NULL;

        if (r >= 0)
                (void) http_request_reply(req, 204, NULL, "", 0);
        else {
                log_debug(
                        "VM %s: its report upload was refused: %s",
                        http_request_connection_tag(req) ?: "?",
                        m ?: strerror(-r));
                if (r == -EMSGSIZE)
                        reply_text(req, 413, m ?: "report too large");
                else if (e && e->code == API_ERROR_INVALID_REQUEST)
                        reply_text(req, 400, m ?: "report refused");
                else
                        reply_text(req, 500, "report not stored");
        }
        http_request_unref(req);
}

/* An upload refused because others are in flight: 429 while this VM's is, 503 while the daemon-wide
 * number is. Returns whether r was one of those. */
static bool reply_report_busy(HttpRequest *req, int r) {
        if (r != -EBUSY && r != -EAGAIN)
                return false;
        (void) http_request_add_header(req, "Retry-After", IMDS_REPORT_RETRY_AFTER);
        if (r == -EBUSY)
                reply_text(req, 429, IMDS_REPORT_BUSY);
        else
                reply_text(req, 503, IMDS_REPORTS_BUSY);
        return true;
}

/* Parsing and storing run off the loop: the request waits for them, suspended, while this VM's other
 * requests and every other VM's go on. One upload per VM at a time, VM_REPORT_UPLOADS_MAX in all. */
static void serve_report(HttpRequest *req, Vm *v) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        const void *body;
        size_t size;
        int r;

        body = http_request_body(req, &size);
        r = vm_report_upload(v, body, size, on_report_done, http_request_ref(req), &e);
        if (reply_report_busy(req, r)) {
                http_request_unref(req);
                return;
        }
        if (r < 0) {
                /* on_report_done() drops the reference serve_report() took for the worker. */
                on_report_done(r, &e, req);
                return;
        }
        http_request_suspend(req);
}

static void serve_bootstrap_failed(HttpRequest *req, Vm *v) {
        size_t size;
        const void *body = http_request_body(req, &size);
        int r = vm_bootstrap_failed(v, body, size);

        if (r == -ESTALE)
                reply_text(req, 409, "the VM is not booting: nothing to fail\n");
        else if (r < 0)
                reply_text(req, 500, "the failure could not be recorded\n");
        else
                reply_text(req, 200, "recorded: the boot fails\n");
}

static void serve_nonce(HttpRequest *req, Vm *v) {
        char nonce[65];

        if (vm_attest_nonce(v, nonce) < 0) {
                reply_text(req, 500, "attestation unavailable");
                return;
        }
        reply_text(req, 200, nonce);
}

/* A verdict is answered with the QuoteResult: 200 when the quote verified, 403 when it was rejected.
 * A body that does not decode is a 400 with the decoder's text, a field over its limit included
 * (the original answers 400 there, not 413); a quote that could not be judged is a 500. */
static unsigned quote_verdict_status(VmQuoteVerdict verdict) {
        return verdict == VM_QUOTE_VERIFIED ? 200 : 403;
}

static void judge_quote(HttpRequest *req, Vm *v) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *result = NULL;
        const void *body;
        size_t size;
        int r;

        body = http_request_body(req, &size);
        r = vm_attest_quote(v, body ?: "", size, &result, &e);
        if (r >= 0)
                (void) http_request_reply_json(req, quote_verdict_status(r), result);
        else if (e.code == API_ERROR_INVALID_REQUEST)
                reply_text(req, 400, e.message ?: "malformed quote");
        else
                reply_text(req, 500, "quote not processed");
}

static HeldQuote *held_quote_free(HeldQuote *h) {
        if (!h)
                return NULL;
        LIST_REMOVE(h->server->held, h);
        vm_attest_quote_wait_free(h->wait);
        http_request_unref(h->req);
        vm_unref(h->vm);
        free(h);
        return NULL;
}

static void on_quote_waited(int r, void *userdata) {
        HeldQuote *h = userdata;
        _cleanup_(http_request_unrefp) HttpRequest *req = http_request_ref(h->req);
        _cleanup_(vm_unrefp) Vm *v = vm_ref(h->vm);
        Manager *m = h->server->manager;

        held_quote_free(h);
        /* a client that went away quotes again with a new nonce: this one is not judged */
        if (!http_request_is_connected(req))
                return;
        if (manager_find_vm(m, vm_id(v)) != v || vm_state(v) == VM_STATE_DELETING) {
                reply_text(req, 403, IMDS_FORBIDDEN);
                return;
        }
        judge_quote(req, v);
}

/* A quote is judged at once, unless the firmware run of its VM's shape is still to say what PCRs 0,
 * 2, 3 and 6 must hold: the guest's agent takes a verdict as final, so its answer waits, suspended,
 * for the run to end (at most the run's own limit) while everything else is served. */
static void serve_quote(HttpRequest *req, ImdsServer *s, Vm *v) {
        HeldQuote *h;
        int r;

        /* The agent quotes one at a time: an older held quote of this VM is one it gave up on. */
        for (h = s->held; h; h = h->next)
                if (h->vm == v) {
                        reply_text(h->req, 503, IMDS_QUOTE_SUPERSEDED);
                        held_quote_free(h);
                        break;
                }

        h = calloc(1, sizeof(HeldQuote));
        if (!h) {
                (void) http_request_add_header(req, "Retry-After", IMDS_RETRY_AFTER);
                reply_text(req, 503, IMDS_QUOTE_BUSY);
                return;
        }
        *h = (HeldQuote){ .server = s };
        r = vm_attest_quote_wait(v, on_quote_waited, h, &h->wait);
        if (r <= 0) {
                free(h);
                if (r < 0) {
                        (void) http_request_add_header(req, "Retry-After", IMDS_RETRY_AFTER);
                        reply_text(req, 503, IMDS_QUOTE_BUSY);
                        return;
                }
                judge_quote(req, v);
                return;
        }
        h->req = http_request_ref(req);
        h->vm = vm_ref(v);
        LIST_PREPEND(s->held, h);
        log_info("VM %s: its quote waits for the firmware run of its memory size and CPU count.", vm_id(v));
        http_request_suspend(req);
}

/* The credential activation's answers: JSON on success; otherwise the text of the refusal, whose
 * status says what the guest can do: 400 fix the request, 403 refused (a foreign EK, a key that is
 * not an attestation key, another key already activated, a wrong secret), 409 nothing to activate
 * against (the vTPM has no EK certificate) or no challenge outstanding, 500 retry later. */
static void reply_activation(HttpRequest *req, int r, json_t *answer, const ApiError *e) {
        if (r >= 0) {
                (void) http_request_reply_json(req, 200, answer);
                return;
        }
        switch (r) {
        case -EBADMSG:
        case -EINVAL:
        case -EFBIG:
                reply_text(req, 400, e->message ?: "malformed request");
                break;
        case -EPERM:
                reply_text(req, 403, e->message ?: "refused");
                break;
        case -EOPNOTSUPP:
        case -ESTALE:
                reply_text(req, 409, e->message ?: "conflict");
                break;
        default:
                reply_text(req, 500, "credential activation not processed");
        }
}

static void serve_challenge(HttpRequest *req, Vm *v) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *answer = NULL;
        const void *body;
        size_t size;
        int r;

        body = http_request_body(req, &size);
        r = vm_attest_challenge(v, body ?: "", size, &answer, &e);
        reply_activation(req, r, answer, &e);
}

/* An activation's answer, held until the record that keeps the activated key is on disk. */
typedef struct ActivationReply {
        HttpRequest *req;
        json_t *answer;
} ActivationReply;

static void on_activation_synced(int r, const char *path, void *userdata) {
        ActivationReply *a = userdata;

        (void) http_request_reply_json(a->req, 200, a->answer);
        http_request_unref(a->req);
        json_decref(a->answer);
        free(a);
}

/* A guest told "activated" is never one a daemon restart forgets: the answer waits for the VM's
 * record to be written (off the loop, as every save is). */
static void serve_activate(HttpRequest *req, Manager *m, Vm *v) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *answer = NULL;
        ActivationReply *a;
        const void *body;
        size_t size;
        int r;

        body = http_request_body(req, &size);
        r = vm_attest_activate(v, body ?: "", size, &answer, &e);
        if (r < 0 || file_writer_pending(manager_writer(m)) == 0) {
                reply_activation(req, r, answer, &e);
                return;
        }
        a = calloc(1, sizeof(ActivationReply));
        if (!a) {
                reply_activation(req, r, answer, &e);
                return;
        }
        *a = (ActivationReply){ .req = http_request_ref(req), .answer = TAKE_PTR(answer) };
        http_request_suspend(req);
        if (manager_sync(m, on_activation_synced, a) < 0)
                on_activation_synced(0, /* path= */ NULL, a);
}

static void serve_sysupdate(HttpRequest *req, Manager *m, const char *rest) {
        _cleanup_free_ char *component = NULL, *path = NULL;
        _cleanup_close_ int fd = -EBADF;
        const char *slash = strchr(rest, '/');
        struct stat st;

        if (!slash)
                goto not_found;
        component = strndup(rest, (size_t) (slash - rest));
        if (!component)
                goto fail;
        if (!segment_ok(component) || !segment_ok(slash + 1))
                goto not_found;
        if (asprintf(&path, "%s/sysupdate/%s/%s", manager_image_dir(m), component, slash + 1) < 0) {
                path = NULL;
                goto fail;
        }
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
                if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR)
                        goto not_found;
                goto fail;
        }
        if (fstat(fd, &st) < 0)
                goto fail;
        if (!S_ISREG(st.st_mode))
                goto not_found;
        (void) http_request_reply_fd(req, 200, "application/octet-stream", TAKE_FD(fd), (uint64_t) st.st_size);
        return;

not_found:
        reply_text(req, 404, "404 page not found\n");
        return;
fail:
        reply_text(req, 500, "artifact unavailable");
}

/* A path outside the table: the answer Go's ServeMux gives. */
static void reply_unknown(HttpRequest *req) {
        reply_text(req, 404, "404 page not found\n");
}

void imds_handle(HttpRequest *req, void *userdata) {
        ImdsServer *s = userdata;
        Manager *m = s->manager;
        const char *tag = http_request_connection_tag(req), *path = http_request_path(req),
                   *method = http_request_method(req), *rest;
        bool get = streq(method, "GET") || streq(method, "HEAD"), post = streq(method, "POST");
        Vm *v;

        /* The caller's identity is checked before routing, so that a stranger learns nothing,
         * not even which paths exist. */
        v = tag ? manager_find_vm(m, tag) : NULL;
        if (!v || vm_state(v) == VM_STATE_DELETING) {
                reply_text(req, 403, IMDS_FORBIDDEN);
                return;
        }
        if (!startswith(path, IMDS_BASE_PATH "/")) {
                reply_unknown(req);
                return;
        }
        path += strlen(IMDS_BASE_PATH);

        if ((rest = startswith(path, "/sysupdate/"))) {
                if (!get)
                        goto method;
                serve_sysupdate(req, m, rest);
                return;
        }
        if ((rest = startswith(path, "/public-keys/"))) {
                if (!get)
                        goto method;
                serve_public_keys(req, v, rest);
                return;
        }
        if ((rest = startswith(path, "/metadata/")) && segment_ok(rest)) {
                json_t *value = json_object_get(vm_spec(v)->metadata, rest);
                if (!get)
                        goto method;
                if (!json_is_string(value))
                        reply_no_key(req);
                else
                        /* An empty value is a key that exists, so it is a 200 and not a 404. */
                        reply_text(req, 200, json_string_value(value));
                return;
        }
        if (streq(path, "/hostname")) {
                if (!get)
                        goto method;
                reply_value(
                        req,
                        vm_spec(v)->hostname && vm_spec(v)->hostname[0] ? vm_spec(v)->hostname : vm_name(v));
        } else if (streq(path, "/region")) {
                if (!get)
                        goto method;
                reply_value(req, vm_spec(v)->region);
        } else if (streq(path, "/zone")) {
                if (!get)
                        goto method;
                reply_value(req, vm_spec(v)->zone);
        } else if (streq(path, "/instance-id")) {
                if (!get)
                        goto method;
                reply_value(req, vm_id(v));
        } else if (streq(path, "/kubernetes-version")) {
                if (!get)
                        goto method;
                reply_value(req, vm_spec(v)->kubernetes_version);
        } else if (streq(path, "/user-data")) {
                if (!get)
                        goto method;
                serve_user_data(req, v);
        } else if (streq(path, "/attest/nonce")) {
                if (!get)
                        goto method;
                serve_nonce(req, v);
        } else if (streq(path, "/attest/quote")) {
                if (!post)
                        goto method;
                serve_quote(req, s, v);
        } else if (streq(path, "/attest/challenge")) {
                if (!post)
                        goto method;
                serve_challenge(req, v);
        } else if (streq(path, "/attest/activate")) {
                if (!post)
                        goto method;
                serve_activate(req, m, v);
        } else if (streq(path, "/bootstrap/failed")) {
                if (!post)
                        goto method;
                serve_bootstrap_failed(req, v);
        } else if (streq(path, "/report")) {
                if (!post)
                        goto method;
                serve_report(req, v);
        } else
                reply_unknown(req);
        return;

method:
        reply_text(req, 405, "Method Not Allowed\n");
}

/* An upload that would be refused as busy is answered before its body is read: a guest that ignores
 * Retry-After then costs the loop a request's headers, not 8 MiB of body per attempt. The limits are
 * checked again once the body is in (another upload may have started meanwhile). */
static void imds_early(HttpRequest *req, void *userdata) {
        ImdsServer *s = userdata;
        const char *tag = http_request_connection_tag(req), *cl;
        uint64_t size = 0;
        Vm *v;

        if (!streq(http_request_method(req), "POST") ||
            !streq(http_request_path(req), IMDS_BASE_PATH "/report"))
                return;
        v = tag ? manager_find_vm(s->manager, tag) : NULL;
        if (!v || vm_state(v) == VM_STATE_DELETING)
                return; /* A stranger gets imds_handle()'s 403, as on any other path. */
        cl = http_request_header(req, "Content-Length");
        if (cl && safe_atou64(cl, &size) < 0)
                size = 0; /* A bad Content-Length is the HTTP layer's to refuse, not ours. */
        (void) reply_report_busy(req, vm_report_upload_check(v, size, /* reterr= */ NULL));
}

/* A VM's connections are the VM's peer in the server: past IMDS_VM_CONNECTIONS_MAX the newcomer
 * closes that VM's idlest one, so what one guest holds never fills the server for the others. */
static void on_accept(void *userdata, Vm *v, int fd) {
        ImdsServer *s = userdata;
        int r = http_server_add_connection(s->http, fd, vm_id(v));

        if (r < 0)
                log_debug("VM %s: metadata connection dropped: %s", vm_id(v), strerror(-r));
}

int imds_server_new(Manager *m, ImdsServer **ret) {
        _cleanup_(imds_server_freep) ImdsServer *s = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        s = calloc(1, sizeof(ImdsServer));
        if (!s)
                return -ENOMEM;
        s->manager = m;
        r = http_server_new(
                &s->http,
                manager_event(m),
                &(HttpServerOptions){
                        .listen_fd = -EBADF,
                        .no_listen = true,
                        .max_body = IMDS_REPORT_MAX,
                        .max_connections = IMDS_CONNECTIONS_MAX,
                        /* Each VM's connections are tagged with its id, which the server counts
                         * as their peer. */
                        .max_connections_per_peer = IMDS_VM_CONNECTIONS_MAX,
                        .idle_timeout = IMDS_IDLE_TIMEOUT,
                        .request_timeout = IMDS_REQUEST_TIMEOUT,
                        .handler = imds_handle,
                        .early = imds_early,
                        .userdata = s,
                },
                &e);
        if (r < 0)
                return r;
        manager_set_imds(m, on_accept, s);
        *ret = TAKE_PTR(s);
        return 0;
}

ImdsServer *imds_server_free(ImdsServer *s) {
        if (!s)
                return NULL;
        if (s->manager)
                manager_unset_imds(s->manager, s);
        /* the server answers their requests as it does every suspended one */
        while (s->held)
                held_quote_free(s->held);
        http_server_free(s->http);
        free(s);
        return NULL;
}
