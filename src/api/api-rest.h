/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>

#include "http-server.h"
#include "manager.h"

#define API_REST_PREFIX "/api/v1"

/* Serves every request below /api/v1 from the operation table, and /api/v1/openapi.yaml. Returns
 * false, without replying, when the path is not below /api/v1. */
bool api_rest_handle(Manager *m, HttpRequest *req);

/* The embedded OpenAPI document. */
extern const char api_openapi_yaml[];
extern const size_t api_openapi_yaml_size;
