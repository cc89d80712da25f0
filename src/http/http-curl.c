/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "curl-util.h"
#include "http-curl.h"
#include "log.h"
#include "openssl-util.h"
#include "worker.h"

/* One transfer the glue runs. */
typedef struct CurlTransfer {
        CURL *easy;
        CurlGlueDone done;
        void *userdata;
        bool started; /* in the multi handle: the CA store was built when it came, or since */
        struct CurlTransfer *prev, *next;
} CurlTransfer;

/* The CA store being built on the glue's thread, which touches nothing else. */
typedef struct CaLoad {
        CurlGlue *glue; /* the loop's side only */
        char *bundle;   /* libcurl's default CA bundle, parsed whole; NULL: none */
        char *dir;      /* its default CA directory, looked up by hash when a chain needs it; NULL: none */
        char *extra;    /* the caller's PEM bundle; NULL: none */
        X509_STORE *store;
        int r;
} CaLoad;

/* A socket libcurl asked us to watch. */
typedef struct CurlWatch {
        int fd;
        sd_event_source *source;
} CurlWatch;

struct CurlGlue {
        sd_event *event;
        char *description;
        CURLM *multi;
        bool global;
        sd_event_source *timer;
        CurlWatch *watches;
        size_t n_watches;
        CurlTransfer *transfers;
        unsigned n_transfers;

        Worker *worker;       /* builds the CA store, once */
        bool ca_ready;        /* built, or failed: transfers start */
        X509_STORE *ca_store; /* NULL when it could not be built */
};

static CaLoad *ca_load_free(CaLoad *j) {
        if (!j)
                return NULL;
        X509_STORE_free(j->store);
        free(j->bundle);
        free(j->dir);
        free(j->extra);
        free(j);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(CaLoad *, ca_load_free);

static void transfer_unlink(CurlGlue *g, CurlTransfer *t) {
        if (t->prev)
                t->prev->next = t->next;
        else
                g->transfers = t->next;
        if (t->next)
                t->next->prev = t->prev;
        assert(g->n_transfers > 0);
        g->n_transfers--;
        if (t->started)
                (void) curl_multi_remove_handle(g->multi, t->easy);
        (void) curl_easy_setopt(t->easy, CURLOPT_PRIVATE, NULL);
        free(t);
}

/* Hands every finished transfer to its owner. */
static void glue_collect(CurlGlue *g) {
        CURLMsg *msg;
        int left;

        while ((msg = curl_multi_info_read(g->multi, &left))) {
                CurlTransfer *t = NULL;
                CURLcode result = msg->data.result;
                CURL *easy = msg->easy_handle;
                CurlGlueDone done;
                void *userdata;

                if (msg->msg != CURLMSG_DONE)
                        continue;
                (void) curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **) &t);
                if (!t)
                        continue;
                done = t->done;
                userdata = t->userdata;
                transfer_unlink(g, t);
                /* may add or remove transfers: info_read copes with that */
                done(g, easy, result, userdata);
        }
}

static CurlWatch *watch_find(CurlGlue *g, int fd) {
        for (size_t i = 0; i < g->n_watches; i++)
                if (g->watches[i].fd == fd)
                        return &g->watches[i];
        return NULL;
}

static int on_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        CurlGlue *g = userdata;
        int action = 0, running;

        if (revents & EPOLLIN)
                action |= CURL_CSELECT_IN;
        if (revents & EPOLLOUT)
                action |= CURL_CSELECT_OUT;
        if (revents & (EPOLLERR | EPOLLHUP))
                action |= CURL_CSELECT_ERR;
        if (curl_multi_socket_action(g->multi, fd, action, &running) != CURLM_OK)
                log_debug("%s: curl_multi_socket_action() failed, ignoring.", g->description);
        glue_collect(g);
        return 0;
}

static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp) {
        CurlGlue *g = userp;
        CurlWatch *w = watch_find(g, fd);
        uint32_t events = 0;
        int r;

        if (what == CURL_POLL_REMOVE) {
                if (w) {
                        sd_event_source_disable_unref(w->source);
                        *w = g->watches[--g->n_watches];
                }
                return 0;
        }
        if (what & CURL_POLL_IN)
                events |= EPOLLIN;
        if (what & CURL_POLL_OUT)
                events |= EPOLLOUT;

        if (w)
                r = sd_event_source_set_io_events(w->source, events);
        else {
                CurlWatch *a = reallocarray(g->watches, g->n_watches + 1, sizeof(CurlWatch));
                sd_event_source *source = NULL;

                if (!a)
                        return -1;
                g->watches = a;
                r = sd_event_add_io(g->event, &source, fd, events, on_io, g);
                if (r >= 0) {
                        (void) sd_event_source_set_description(source, g->description);
                        g->watches[g->n_watches++] = (CurlWatch){ fd, source };
                }
        }
        if (r < 0) {
                log_debug_errno(r, "%s: failed to watch a socket: %m", g->description);
                return -1;
        }
        return 0;
}

static int on_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        CurlGlue *g = userdata;
        int running;

        if (curl_multi_socket_action(g->multi, CURL_SOCKET_TIMEOUT, 0, &running) != CURLM_OK)
                log_debug("%s: curl_multi_socket_action() failed, ignoring.", g->description);
        glue_collect(g);
        return 0;
}

static int on_timer_change(CURLM *multi, long timeout_ms, void *userp) {
        CurlGlue *g = userp;
        usec_t when;
        int r;

        if (timeout_ms < 0) {
                if (g->timer)
                        (void) sd_event_source_set_enabled(g->timer, SD_EVENT_OFF);
                return 0;
        }
        when = now_usec(CLOCK_MONOTONIC) + (usec_t) timeout_ms * USEC_PER_MSEC;
        if (!g->timer) {
                /* accuracy 1 µs: the default 250 ms would stall every transfer step */
                r = sd_event_add_time(g->event, &g->timer, CLOCK_MONOTONIC, when, 1, on_timer, g);
                if (r >= 0)
                        (void) sd_event_source_set_description(g->timer, g->description);
        } else {
                r = sd_event_source_set_time(g->timer, when);
                if (r >= 0)
                        r = sd_event_source_set_enabled(g->timer, SD_EVENT_ONESHOT);
        }
        if (r < 0) {
                log_debug_errno(r, "%s: failed to arm the timer: %m", g->description);
                return -1;
        }
        return 0;
}

/* On the glue's thread. What libcurl would do for each connection with its defaults and
 * CURLOPT_CAINFO: parse the bundles, add the directory, set its flags. */
static void ca_load_run(void *userdata) {
        CaLoad *j = userdata;
        _cleanup_(X509_STORE_freep) X509_STORE *store = X509_STORE_new();

        if (!store)
                j->r = -ENOMEM;
        else if (j->bundle && !X509_STORE_load_file(store, j->bundle))
                j->r = -EBADMSG;
        else if (j->dir && !X509_STORE_load_path(store, j->dir))
                j->r = -EBADMSG;
        else if (j->extra && !X509_STORE_load_file(store, j->extra))
                j->r = -EBADMSG;
        else if (!X509_STORE_set_flags(store, X509_V_FLAG_TRUSTED_FIRST | X509_V_FLAG_PARTIAL_CHAIN))
                j->r = -ENOMEM;
        else
                j->store = TAKE_PTR(store);
        ERR_clear_error(); /* this thread's queue: nobody reads it */
}

static void glue_start_pending(CurlGlue *g) {
        for (;;) {
                CurlTransfer *t = g->transfers;
                CurlGlueDone done;
                CURL *easy;
                void *userdata;

                while (t && t->started)
                        t = t->next;
                if (!t)
                        return;
                if (curl_multi_add_handle(g->multi, t->easy) == CURLM_OK) {
                        t->started = true;
                        continue;
                }
                /* from a loop callback, as done must be; it may add or remove transfers */
                done = t->done;
                easy = t->easy;
                userdata = t->userdata;
                transfer_unlink(g, t);
                done(g, easy, CURLE_OUT_OF_MEMORY, userdata);
        }
}

static void ca_load_done(void *userdata, bool ran) {
        _cleanup_(ca_load_freep) CaLoad *j = userdata;
        CurlGlue *g = j->glue;

        if (!ran)
                j->r = -ECANCELED;
        if (j->r < 0)
                log_debug_errno(
                        j->r, "%s: cannot build the CA store, TLS transfers will fail: %m", g->description);
        g->ca_store = TAKE_PTR(j->store);
        g->ca_ready = true;
        glue_start_pending(g);
}

/* Every TLS connection gets the store built once, instead of parsing the bundle again. */
static CURLcode on_ssl_ctx(CURL *easy, void *ssl_ctx, void *userdata) {
        CurlGlue *g = userdata;

        if (!g->ca_store)
                return CURLE_SSL_CACERT_BADFILE;
        if (!X509_STORE_up_ref(g->ca_store))
                return CURLE_OUT_OF_MEMORY;
        SSL_CTX_set_cert_store(ssl_ctx, g->ca_store); /* takes the reference */
        return CURLE_OK;
}

static int ca_load_start(CurlGlue *g, const char *ca_file) {
        _cleanup_(ca_load_freep) CaLoad *j = NULL;
        _cleanup_(curl_easy_cleanupp) CURL *probe = NULL;
        const char *bundle = NULL, *dir = NULL;
        int r;

        j = calloc(1, sizeof(CaLoad));
        probe = curl_easy_init();
        if (!j || !probe)
                return -ENOMEM;
        j->glue = g;
        /* libcurl's built-in defaults (Debian: /etc/ssl/certs/ca-certificates.crt and /etc/ssl/certs) */
        (void) curl_easy_getinfo(probe, CURLINFO_CAINFO, &bundle);
        (void) curl_easy_getinfo(probe, CURLINFO_CAPATH, &dir);
        if ((bundle && !(j->bundle = strdup(bundle))) || (dir && !(j->dir = strdup(dir))) ||
            (ca_file && !(j->extra = strdup(ca_file))))
                return -ENOMEM;

        r = worker_new(
                g->event,
                &(WorkerOptions){ .name = "vmm-curl-ca", .threads = 1, .max_jobs = 1, .nice = 10 },
                &g->worker);
        if (r < 0)
                return r;
        r = worker_submit(g->worker, j, ca_load_run, ca_load_done);
        if (r < 0)
                return r;
        TAKE_PTR(j);
        return 0;
}

int curl_glue_new(CurlGlue **ret, sd_event *event, const char *description, const char *ca_file) {
        _cleanup_(curl_glue_freep) CurlGlue *g = NULL;
        int r;

        assert_return(ret && event && description, -EINVAL);

        g = calloc(1, sizeof(CurlGlue));
        if (!g)
                return -ENOMEM;
        g->event = sd_event_ref(event);
        g->description = strdup(description);
        if (!g->description)
                return -ENOMEM;
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
                return -EIO;
        g->global = true;
        g->multi = curl_multi_init();
        if (!g->multi)
                return -ENOMEM;
        if (curl_multi_setopt(g->multi, CURLMOPT_SOCKETFUNCTION, on_socket) != CURLM_OK ||
            curl_multi_setopt(g->multi, CURLMOPT_SOCKETDATA, g) != CURLM_OK ||
            curl_multi_setopt(g->multi, CURLMOPT_TIMERFUNCTION, on_timer_change) != CURLM_OK ||
            curl_multi_setopt(g->multi, CURLMOPT_TIMERDATA, g) != CURLM_OK)
                return -EIO;
        r = ca_load_start(g, ca_file);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(g);
        return 0;
}

void curl_glue_detach(CurlGlue *g) {
        g->timer = sd_event_source_disable_unref(g->timer);
        for (size_t i = 0; i < g->n_watches; i++)
                sd_event_source_disable_unref(g->watches[i].source);
        g->watches = mfree(g->watches);
        g->n_watches = 0;
        if (g->multi) {
                (void) curl_multi_setopt(g->multi, CURLMOPT_SOCKETFUNCTION, NULL);
                (void) curl_multi_setopt(g->multi, CURLMOPT_TIMERFUNCTION, NULL);
        }
}

CurlGlue *curl_glue_free(CurlGlue *g) {
        if (!g)
                return NULL;
        curl_glue_detach(g);
        while (g->transfers)
                transfer_unlink(g, g->transfers);
        g->worker = worker_free(g->worker); /* waits for a store being built */
        X509_STORE_free(g->ca_store);
        if (g->multi)
                curl_multi_cleanup(g->multi);
        if (g->global)
                curl_global_cleanup();
        free(g->description);
        sd_event_unref(g->event);
        free(g);
        return NULL;
}

int curl_glue_add(CurlGlue *g, CURL *easy, CurlGlueDone done, void *userdata) {
        CurlTransfer *t;

        assert_return(g && easy && done, -EINVAL);

        t = calloc(1, sizeof(CurlTransfer));
        if (!t)
                return -ENOMEM;
        *t = (CurlTransfer){ .easy = easy, .done = done, .userdata = userdata, .started = g->ca_ready };
        /* the glue's store, and nothing for libcurl to parse (no file, no directory, no cache) */
        if (curl_easy_setopt(easy, CURLOPT_SSL_CTX_FUNCTION, on_ssl_ctx) != CURLE_OK ||
            curl_easy_setopt(easy, CURLOPT_SSL_CTX_DATA, g) != CURLE_OK ||
            curl_easy_setopt(easy, CURLOPT_CAINFO, NULL) != CURLE_OK ||
            curl_easy_setopt(easy, CURLOPT_CAPATH, NULL) != CURLE_OK ||
            curl_easy_setopt(easy, CURLOPT_CA_CACHE_TIMEOUT, 0L) != CURLE_OK) {
                free(t);
                return -EOPNOTSUPP; /* a libcurl on another TLS library than OpenSSL */
        }
        if (curl_easy_setopt(easy, CURLOPT_PRIVATE, t) != CURLE_OK ||
            curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L) != CURLE_OK ||
            (t->started && curl_multi_add_handle(g->multi, easy) != CURLM_OK)) {
                (void) curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
                free(t);
                return -EIO;
        }
        t->next = g->transfers;
        if (g->transfers)
                g->transfers->prev = t;
        g->transfers = t;
        g->n_transfers++;
        return 0;
}

void curl_glue_remove(CurlGlue *g, CURL *easy) {
        CurlTransfer *t = NULL;

        if (!g || !easy)
                return;
        (void) curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **) &t);
        for (CurlTransfer *i = g->transfers; i; i = i->next)
                if (i == t) {
                        transfer_unlink(g, t);
                        return;
                }
}

unsigned curl_glue_active(const CurlGlue *g) {
        return g ? g->n_transfers : 0;
}

void curl_glue_drain(CurlGlue *g, usec_t deadline) {
        if (!g)
                return;
        curl_glue_detach(g);
        if (!g->ca_ready)
                g->worker = worker_free(g->worker); /* the loop is gone: wait for the store here */
        while (g->transfers) {
                usec_t now;
                int running;

                (void) curl_multi_perform(g->multi, &running);
                glue_collect(g);
                now = now_usec(CLOCK_MONOTONIC);
                if (!g->transfers || now >= deadline)
                        break;
                (void) curl_multi_poll(
                        g->multi, NULL, 0, (int) MIN((deadline - now) / USEC_PER_MSEC + 1, (usec_t) 100), NULL);
        }
}
