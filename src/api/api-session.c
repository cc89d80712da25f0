/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The checks shared by the endpoints that hold a connection for a VM (api-session.h). */
#include <errno.h>

#include "api-session.h"

Vm *api_session_vm(HttpRequest *req, Manager *m, const char *vm_id) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        Vm *v = manager_find_vm(m, vm_id);

        if (v)
                return v;
        (void) api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", vm_id);
        (void) http_request_reply_error(req, &e);
        return NULL;
}

bool api_session_admit(HttpRequest *req, unsigned n, unsigned max, const char *what) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        if (n < max)
                return true;
        /* the sessions are people's and end in minutes: a client that waits a little gets one */
        (void) http_request_add_header(req, "Retry-After", "5");
        (void) api_error_set(
                &e,
                -EAGAIN,
                API_ERROR_CONFLICT,
                "%u %s are open, the most this server keeps; try again later",
                max,
                what);
        (void) http_request_reply_error_status(req, 503, &e);
        return false;
}
