/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>

#include "http-server.h"
#include "operation.h"

/* What the endpoints that keep a connection open for one VM (the console stream, vm shell) check
 * alike before they take one: the VM, and their limit on sessions. Each replies when it refuses, so
 * the caller only returns. */

/* The VM vm_id, or NULL once the request was answered not_found (404). */
Vm *api_session_vm(HttpRequest *req, Manager *m, const char *vm_id);

/* Whether one more session fits while n of at most max are open. When not, the request was answered
 * 503 with "Retry-After: 5" and a conflict that says "<n> <what> are open, ...". */
bool api_session_admit(HttpRequest *req, unsigned n, unsigned max, const char *what);
