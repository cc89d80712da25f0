/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Cleanups for libcurl's types, kept in one place (link with libcurl to use them). */

#include <curl/curl.h>

#include "cleanup.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(CURL *, curl_easy_cleanup);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct curl_slist *, curl_slist_free_all);
