/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>

#include "http-server.h"
#include "operation.h"
#include "trace.h"

#define API_REST_PREFIX "/api/v1"

typedef struct ApiRest ApiRest;

/* tracer (borrowed, may be NULL) gets one server span per request. */
int api_rest_new(ApiRest **ret, Manager *m, Tracer *tracer);
ApiRest *api_rest_free(ApiRest *a);
DEFINE_TRIVIAL_CLEANUP_FUNC(ApiRest *, api_rest_free);

/* Serves every request below /api/v1 from the operation table, and /api/v1/openapi.yaml. Returns
 * false, without replying, when the path is not below /api/v1. */
bool api_rest_handle(ApiRest *a, HttpRequest *req);

/* The embedded OpenAPI document. */
extern const char api_openapi_yaml[];
extern const size_t api_openapi_yaml_size;
