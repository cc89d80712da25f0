/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "http-curl.h"
#include "log.h"

/* One transfer the glue runs. */
typedef struct CurlTransfer {
        CURL *easy;
        CurlGlueDone done;
        void *userdata;
        struct CurlTransfer *prev, *next;
} CurlTransfer;

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
};

static void transfer_unlink(CurlGlue *g, CurlTransfer *t) {
        if (t->prev)
                t->prev->next = t->next;
        else
                g->transfers = t->next;
        if (t->next)
                t->next->prev = t->prev;
        assert(g->n_transfers > 0);
        g->n_transfers--;
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

int curl_glue_new(CurlGlue **ret, sd_event *event, const char *description) {
        _cleanup_(curl_glue_freep) CurlGlue *g = NULL;

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
        *t = (CurlTransfer){ .easy = easy, .done = done, .userdata = userdata };
        if (curl_easy_setopt(easy, CURLOPT_PRIVATE, t) != CURLE_OK ||
            curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L) != CURLE_OK ||
            curl_multi_add_handle(g->multi, easy) != CURLM_OK) {
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
