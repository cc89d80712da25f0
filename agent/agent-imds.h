/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>

#include "api-error.h"
#include "time-util.h"

#define AGENT_IMDS_URL_DEFAULT "http://169.254.169.254/giantswarm/v1"

/* The IMDS as the agent talks to it: a base URL and a deadline (CLOCK_MONOTONIC) that bounds the
 * whole run, including the wait for the IMDS to become reachable. */
typedef struct AgentImds {
        const char *base; /* no trailing slash */
        const char *user_agent;
        usec_t deadline;
} AgentImds;

/* The verifier's answer to a quote (the IMDS's QuoteResult). */
typedef struct AgentVerdict {
        bool verified;
        bool user_data_released;
        char *stage;
        char *message;
} AgentVerdict;

void agent_verdict_done(AgentVerdict *v);

/* Checks that url is an http:// or https:// URL and returns it without trailing slashes. */
int agent_imds_normalize_url(const char *url, char **ret, ApiError *reterr);

/* GET <base>/attest/nonce: a 200 answer whose trimmed body (at most 1 KiB is read) is hex. A
 * transport failure is retried with backoff (250 ms, doubling up to 5 s) until the deadline. */
int agent_imds_fetch_nonce(const AgentImds *imds, char **ret, ApiError *reterr);

/* POST <base>/attest/quote with body (JSON), retried like the nonce fetch. Returns 0 with the verdict
 * when the IMDS answered with JSON at 200 or 403 (verified or not); any other answer is an error. */
int agent_imds_post_quote(const AgentImds *imds, const char *body, AgentVerdict *ret, ApiError *reterr);

/* POST <base><path> with body (JSON), retried like the nonce fetch, for the answers that are JSON on
 * success and text otherwise: returns 0 with the HTTP status and, for a JSON object answer,
 * *ret_json, otherwise *ret_text ("HTTP 403: <text>"). */
int agent_imds_post(
        const AgentImds *imds,
        const char *path,
        const char *body,
        long *ret_status,
        json_t **ret_json,
        char **ret_text,
        ApiError *reterr);
