/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <curl/curl.h>
#include <systemd/sd-event.h>

#include "cleanup.h"
#include "time-util.h"

/* libcurl's multi interface driven by an sd-event loop: CURLMOPT_SOCKETFUNCTION becomes io sources,
 * CURLMOPT_TIMERFUNCTION one time source. Transfers run while the loop runs and never block it.
 * Shared by every client the daemon runs (span export, the OAuth fetches). */

typedef struct CurlGlue CurlGlue;

/* Called exactly once for a transfer that ended, successfully or not, from a loop callback (never
 * from within curl_glue_add()). The easy handle is already out of the multi handle and belongs to
 * the caller again. */
typedef void (*CurlGlueDone)(CurlGlue *g, CURL *easy, CURLcode result, void *userdata);

/* description names the event sources ("trace-curl"). Calls curl_global_init() once per glue.
 *
 * TLS: the glue builds one CA store, libcurl's default bundle and directory and ca_file (may be
 * NULL: a PEM bundle trusted in addition), on a thread of its own, since parsing the system's
 * bundle takes tens of milliseconds (more under the sanitizers), and every connection shares it
 * (CURLOPT_SSL_CTX_FUNCTION): libcurl would parse it again for each new connection, on the loop
 * (its CA cache does not apply while a CA directory is set, as Debian's libcurl has by default).
 * Transfers added before the store is built start once it is; a store that cannot be built fails
 * TLS transfers as an unreadable CURLOPT_CAINFO would (CURLE_SSL_CACERT_BADFILE). Callers leave
 * CURLOPT_CAINFO and CURLOPT_CAPATH alone: the glue clears them. */
int curl_glue_new(CurlGlue **ret, sd_event *event, const char *description, const char *ca_file);
/* Abandons transfers still running, without calling their done. */
CurlGlue *curl_glue_free(CurlGlue *g);
DEFINE_TRIVIAL_CLEANUP_FUNC(CurlGlue *, curl_glue_free);

/* Starts a transfer. The glue uses CURLOPT_PRIVATE itself: callers keep their state in userdata. */
int curl_glue_add(CurlGlue *g, CURL *easy, CurlGlueDone done, void *userdata);
/* Abandons a transfer without calling its done; no-op for a handle the glue does not run. */
void curl_glue_remove(CurlGlue *g, CURL *easy);
/* Transfers running. */
unsigned curl_glue_active(const CurlGlue *g);

/* Leaves the event loop (for good): from here on transfers added wait for curl_glue_drain(). For a
 * last flush at shutdown, when the loop may already be gone. */
void curl_glue_detach(CurlGlue *g);
/* Detaches, then runs the transfers with libcurl's own poll until they end (their done is called)
 * or the deadline (CLOCK_MONOTONIC) passes; those left are abandoned. */
void curl_glue_drain(CurlGlue *g, usec_t deadline);
