/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "agent-imds.h"
#include "agent-util.h"
#include "cleanup.h"
#include "macro.h"

/* The nonce is 64 hex characters; anything beyond 1 KiB is not read. */
#define NONCE_BODY_MAX 1024U
/* A QuoteResult is a few hundred bytes. */
#define RESULT_BODY_MAX (64U * 1024U)
/* How much of a non-JSON answer makes it into an error message. */
#define ERROR_TEXT_MAX 512U

#define BACKOFF_FIRST (250 * USEC_PER_MSEC)
#define BACKOFF_MAX (5 * USEC_PER_SEC)
/* One connection attempt; a black-holed address must not eat the whole timeout in one try. */
#define CONNECT_TIMEOUT_MAX (10 * USEC_PER_SEC)

DEFINE_TRIVIAL_CLEANUP_FUNC(CURL *, curl_easy_cleanup);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct curl_slist *, curl_slist_free_all);

typedef struct Answer {
        long status;
        char *content_type;
        char *body;
        size_t size;
        size_t max;
} Answer;

static void answer_done(Answer *a) {
        a->content_type = mfree(a->content_type);
        a->body = mfree(a->body);
        a->size = 0;
}

void agent_verdict_done(AgentVerdict *v) {
        if (!v)
                return;
        v->stage = mfree(v->stage);
        v->message = mfree(v->message);
}

int agent_imds_normalize_url(const char *url, char **ret, ApiError *reterr) {
        char *s;
        size_t n;

        assert_return(url, -EINVAL);
        assert_return(ret, -EINVAL);

        if (!startswith(url, "http://") && !startswith(url, "https://"))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INTERNAL, "imds url '%s' is not an http(s) url", url);
        n = strlen(url);
        while (n > 0 && url[n - 1] == '/')
                n--;
        s = strndup(url, n);
        if (!s)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        *ret = s;
        return 0;
}

/* Keeps the first a->max bytes of the body and discards the rest, as Go's io.LimitReader does. */
static size_t on_body(char *data, size_t size, size_t nmemb, void *userdata) {
        Answer *a = userdata;
        size_t n = size * nmemb, take = MIN(n, a->max - a->size);

        if (take > 0) {
                char *t = realloc(a->body, a->size + take + 1);
                if (!t)
                        return 0; /* CURLE_WRITE_ERROR */
                a->body = t;
                memcpy(a->body + a->size, data, take);
                a->size += take;
                a->body[a->size] = 0;
        }
        return n;
}

static void sleep_usec(usec_t usec) {
        struct timespec ts = {
                .tv_sec = (time_t) (usec / USEC_PER_SEC),
                .tv_nsec = (long) (usec % USEC_PER_SEC * NSEC_PER_USEC),
        };

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

static char *format_delay(char *buf, size_t size, usec_t usec) {
        if (usec % USEC_PER_SEC == 0)
                (void) snprintf(buf, size, "%llus", (unsigned long long) (usec / USEC_PER_SEC));
        else
                (void) snprintf(buf, size, "%llums", (unsigned long long) (usec / USEC_PER_MSEC));
        return buf;
}

/* Whether another try may succeed: everything but a bad URL and our own failures, since the IMDS
 * may simply not be up yet (no route, refused, reset, timed out). */
static bool curl_error_is_transient(CURLcode cc) {
        switch (cc) {
        case CURLE_UNSUPPORTED_PROTOCOL:
        case CURLE_URL_MALFORMAT:
        case CURLE_NOT_BUILT_IN:
        case CURLE_OUT_OF_MEMORY:
        case CURLE_WRITE_ERROR:
        case CURLE_BAD_FUNCTION_ARGUMENT:
                return false;
        default:
                return true;
        }
}

/* One HTTP exchange, bounded by the deadline. Returns 0 with the answer, -EAGAIN for a transport
 * failure worth retrying (message in reterr), or another negative errno for a failure that will not
 * get better. */
static int attempt(const AgentImds *imds, const char *url, const char *body, Answer *answer, ApiError *reterr) {
        _cleanup_(curl_easy_cleanupp) CURL *c = NULL;
        _cleanup_(curl_slist_free_allp) struct curl_slist *headers = NULL;
        char errbuf[CURL_ERROR_SIZE] = "";
        const char *ct = NULL;
        usec_t now = now_usec(CLOCK_MONOTONIC), remaining;
        CURLcode cc;

        remaining = imds->deadline > now ? imds->deadline - now : 0;

        c = curl_easy_init();
        if (!c)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        if (body) {
                headers = curl_slist_append(NULL, "Content-Type: application/json");
                /* No "Expect: 100-continue" round trip for larger quotes. */
                if (!headers || !curl_slist_append(headers, "Expect:"))
                        return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        }

        if (curl_easy_setopt(c, CURLOPT_URL, url) != CURLE_OK ||
            curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK ||
            curl_easy_setopt(c, CURLOPT_USERAGENT, imds->user_agent) != CURLE_OK ||
            /* The IMDS is link-local: a proxy from the environment can never reach it. */
            curl_easy_setopt(c, CURLOPT_NOPROXY, "*") != CURLE_OK ||
            curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK ||
            curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf) != CURLE_OK ||
            curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long) MAX(remaining / USEC_PER_MSEC, (usec_t) 1)) !=
                    CURLE_OK ||
            curl_easy_setopt(
                    c,
                    CURLOPT_CONNECTTIMEOUT_MS,
                    (long) MAX(MIN(remaining, CONNECT_TIMEOUT_MAX) / USEC_PER_MSEC, (usec_t) 1)) != CURLE_OK ||
            curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body) != CURLE_OK ||
            curl_easy_setopt(c, CURLOPT_WRITEDATA, answer) != CURLE_OK)
                return api_error_set(reterr, -EINVAL, API_ERROR_INTERNAL, "set up the http client");
        if (body &&
            (curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers) != CURLE_OK ||
             curl_easy_setopt(c, CURLOPT_POSTFIELDS, body) != CURLE_OK ||
             curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) strlen(body)) != CURLE_OK))
                return api_error_set(reterr, -EINVAL, API_ERROR_INTERNAL, "set up the http client");

        answer_done(answer);
        cc = curl_easy_perform(c);
        if (cc != CURLE_OK) {
                int r = curl_error_is_transient(cc) ? -EAGAIN : -EINVAL;

                answer_done(answer);
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
        }

        (void) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &answer->status);
        (void) curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
        if (ct) {
                answer->content_type = strdup(ct);
                if (!answer->content_type)
                        return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        }
        return 0;
}

/* Runs one exchange, retrying transport failures with backoff until the deadline. Any answer, with any
 * status, is returned. */
static int request(const AgentImds *imds, const char *path, const char *body, Answer *answer, ApiError *reterr) {
        _cleanup_free_ char *url = NULL;
        ApiError last = API_ERROR_NULL;
        usec_t delay = BACKOFF_FIRST;
        int r;

        if (asprintf(&url, "%s%s", imds->base, path) < 0)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        for (unsigned n = 1;; n++) {
                usec_t now = now_usec(CLOCK_MONOTONIC), remaining;
                char d[32];

                if (now >= imds->deadline)
                        break;
                agent_debug("%s %s (attempt %u)", body ? "POST" : "GET", url, n);
                r = attempt(imds, url, body, answer, &last);
                if (r >= 0) {
                        api_error_done(&last);
                        agent_debug(
                                "HTTP %ld, %zu bytes of %s",
                                answer->status,
                                answer->size,
                                answer->content_type ?: "no content type");
                        return 0;
                }
                if (r != -EAGAIN) {
                        r = api_error_set(reterr, r, API_ERROR_INTERNAL, "%s", last.message ?: "http request");
                        api_error_done(&last);
                        return r;
                }

                now = now_usec(CLOCK_MONOTONIC);
                if (now >= imds->deadline)
                        break;
                remaining = imds->deadline - now;
                agent_warning(
                        "imds not reachable, retrying in %s: %s",
                        format_delay(d, sizeof(d), MIN(delay, remaining)),
                        last.message);
                sleep_usec(MIN(delay, remaining));
                delay = MIN(delay * 2, BACKOFF_MAX);
        }

        if (last.message)
                r = api_error_set(
                        reterr,
                        -ETIMEDOUT,
                        API_ERROR_INTERNAL,
                        "imds not reachable within the timeout: %s",
                        last.message);
        else
                r = api_error_set(
                        reterr, -ETIMEDOUT, API_ERROR_INTERNAL, "imds not reachable within the timeout");
        api_error_done(&last);
        return r;
}

/* A non-JSON answer as it appears in an error: "HTTP 403: <text>". An empty 403 is what the IMDS
 * answers an address it does not know, which deserves words. */
static char *describe(const Answer *a) {
        _cleanup_free_ char *text = NULL;
        char *s = NULL;

        text = text_trim(a->body ?: "", a->size, ERROR_TEXT_MAX);
        if (!text)
                return NULL;
        if (a->status == 403 && !text[0])
                asprintf_or_null(&s, "HTTP 403: the IMDS does not map this address to a VM");
        else if (!text[0])
                asprintf_or_null(&s, "HTTP %ld", a->status);
        else
                asprintf_or_null(&s, "HTTP %ld: %s", a->status, text);
        return s;
}

/* Whether the media type of a Content-Type header is application/json (parameters and case do not
 * matter). */
static bool is_json(const char *content_type) {
        size_t n;

        if (!content_type)
                return false;
        content_type += strspn(content_type, " \t");
        n = strcspn(content_type, "; \t");
        return n == strlen("application/json") && strncasecmp(content_type, "application/json", n) == 0;
}

int agent_imds_fetch_nonce(const AgentImds *imds, char **ret, ApiError *reterr) {
        _cleanup_(answer_done) Answer a = { .max = NONCE_BODY_MAX };
        _cleanup_free_ char *nonce = NULL, *what = NULL;
        int r;

        assert_return(imds, -EINVAL);
        assert_return(ret, -EINVAL);

        r = request(imds, "/attest/nonce", /* body= */ NULL, &a, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "fetch nonce");
                return r;
        }
        if (a.status != 200) {
                what = describe(&a);
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "fetch nonce: %s", what ?: "error");
        }

        nonce = text_trim(a.body ?: "", a.size, a.size);
        if (!nonce)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        if (!nonce[0])
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "fetch nonce: empty nonce");
        if (strlen(nonce) % 2 != 0 || strspn(nonce, "0123456789abcdefABCDEF") != strlen(nonce))
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "fetch nonce: nonce is not hex");

        agent_debug("nonce received, %zu bytes", strlen(nonce) / 2);
        *ret = TAKE_PTR(nonce);
        return 0;
}

int agent_imds_post_quote(const AgentImds *imds, const char *body, AgentVerdict *ret, ApiError *reterr) {
        _cleanup_(answer_done) Answer a = { .max = RESULT_BODY_MAX };
        _cleanup_free_ char *what = NULL;
        json_auto_t *v = NULL;
        json_error_t err;
        json_t *verified, *released, *stage, *message;
        AgentVerdict verdict = {};
        int r;

        assert_return(imds, -EINVAL);
        assert_return(body, -EINVAL);
        assert_return(ret, -EINVAL);

        r = request(imds, "/attest/quote", body, &a, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "post quote");
                return r;
        }

        if (!is_json(a.content_type)) {
                what = describe(&a);
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "post quote: %s", what ?: "error");
        }

        /* Like Go's json.Decoder: the first value counts, unknown fields are fine. */
        v = json_loadb(a.body ?: "", a.size, JSON_DISABLE_EOF_CHECK, &err);
        if (!v || !json_is_object(v))
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "post quote: decode answer (HTTP %ld): %s",
                        a.status,
                        v ? "not a JSON object" : err.text);

        verified = json_object_get(v, "verified");
        released = json_object_get(v, "user_data_released");
        stage = json_object_get(v, "stage");
        message = json_object_get(v, "message");
        if ((verified && !json_is_boolean(verified)) || (released && !json_is_boolean(released)) ||
            (stage && !json_is_string(stage) && !json_is_null(stage)) ||
            (message && !json_is_string(message) && !json_is_null(message)))
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "post quote: decode answer (HTTP %ld): a field has the wrong type",
                        a.status);

        if (a.status != 200 && a.status != 403)
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "post quote: HTTP %ld: %s",
                        a.status,
                        json_is_string(message) ? json_string_value(message) : "");

        verdict.verified = a.status == 200 && json_is_true(verified);
        verdict.user_data_released = json_is_true(released);
        if (json_is_string(stage) && !(verdict.stage = strdup(json_string_value(stage))))
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        if (json_is_string(message) && !(verdict.message = strdup(json_string_value(message)))) {
                agent_verdict_done(&verdict);
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        }

        *ret = verdict;
        return 0;
}

int agent_imds_post(
        const AgentImds *imds,
        const char *path,
        const char *body,
        long *ret_status,
        json_t **ret_json,
        char **ret_text,
        ApiError *reterr) {
        _cleanup_(answer_done) Answer a = { .max = RESULT_BODY_MAX };
        json_t *v = NULL;
        char *text = NULL;
        int r;

        assert_return(imds, -EINVAL);
        assert_return(path, -EINVAL);
        assert_return(body, -EINVAL);
        assert_return(ret_status && ret_json && ret_text, -EINVAL);

        r = request(imds, path, body, &a, reterr);
        if (r < 0)
                return r;
        if (is_json(a.content_type)) {
                v = json_loadb(a.body ?: "", a.size, 0, /* error= */ NULL);
                if (v && !json_is_object(v)) {
                        json_decref(v);
                        v = NULL;
                }
        }
        if (!v) {
                text = describe(&a);
                if (!text)
                        return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        }
        *ret_status = a.status;
        *ret_json = v;
        *ret_text = text;
        return 0;
}
