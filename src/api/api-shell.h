/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "http-server.h"
#include "operation.h"

/* GET /api/v1/vms/{id}/shell with "Upgrade: vm-manager-shell": an interactive root shell (vm shell),
 * REST only. Refusals are the usual JSON errors; a request the VM can take is answered 101, and the
 * connection then carries the frames of shell-frame.h, in a helper process that owns the session
 * (vm_shell_start()). The server closes the connection once that helper has exited. */

#define API_SHELL_PROTOCOL "vm-manager-shell"
/* Sessions at once, over all clients: each is a helper process with an ssh session. */
#define API_SHELLS_MAX 16U
/* How often the sessions' VMs are looked at: a VM that stopped ends its shells within this. */
#define API_SHELL_WATCH_USEC (1 * USEC_PER_SEC)

typedef struct ApiShells ApiShells;

ApiShells *api_shells_new(Manager *m);
/* Ends every session still open: helpers killed, connections closed. */
ApiShells *api_shells_free(ApiShells *s);

/* Serves the request for VM vm_id (the path's {id}); replies in every case. */
void api_shell(ApiShells *s, HttpRequest *req, const char *vm_id);
