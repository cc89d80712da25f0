/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* create_network and delete_network: the record (network.c) and its data plane (the switch and its
 * gateway) come and go together. */
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "manager.h"
#include "network.h"

int manager_create_network(Manager *m, const NetworkCreateArgs *args, Network **ret, ApiError *reterr) {
        Network *n = NULL;
        int r;

        r = network_create(manager_networks(m), args, &n, reterr);
        if (r < 0)
                return r;
        r = manager_switch_start(m, n);
        if (r < 0) {
                /* a record nothing switches is worse than none */
                _cleanup_free_ char *name = strdup(n->name);
                if (name)
                        (void) network_delete(manager_networks(m), name, manager_vm_name, m, NULL);
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "starting the switch of network: %s", strerror(-r));
        }
        if (ret)
                *ret = n;
        return 0;
}

int manager_delete_network(Manager *m, const char *name, ApiError *reterr) {
        int r;

        r = network_delete(manager_networks(m), name, manager_vm_name, m, reterr);
        if (r < 0)
                return r;
        manager_switch_stop(m, name);
        return 0;
}
