/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* forward_port: the host's 127.0.0.1 into a guest's TCP port, through the network's gateway.
 *
 * A forward belongs to its VM until the VM is deleted. It is listed in the record (the API's and
 * vm.json's "forwards"), so a second forward_port for the same guest port answers with it instead of
 * opening another listener, and the next daemon listens again on the same host port (a new one when
 * another process took it meanwhile). It listens whether or not the VM runs: while the VM's NIC is
 * not linked, the switch resets what the gateway sends towards it, so a connection then ends at once
 * and works again once the VM runs. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "macro.h"
#include "parse-util.h"
#include "vm.h"

#define FORWARD_ADDRESS_PREFIX "127.0.0.1:"

int vm_forward_port(Vm *v, int64_t port, json_t **ret, ApiError *reterr) {
        VmForwards *fw = vm_forwards(v);
        uint16_t host_port = 0;
        VmForward *f;
        NetPort *p;
        json_t *j;
        int r;

        if (port < 1 || port > 65535)
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "port %" PRIi64 " out of range", port);
        if (!vm_ip(v) || vm_state(v) == VM_STATE_DELETING)
                return api_error_set(
                        reterr,
                        -EADDRNOTAVAIL,
                        API_ERROR_CONFLICT,
                        "vm %s has no address (%s)",
                        vm_id(v),
                        vm_state_to_string(vm_state(v)));
        f = vm_forwards_find(fw, (uint16_t) port);
        if (!f) {
                if (fw->n >= VM_FORWARDS_MAX)
                        return api_error_set(
                                reterr,
                                -EBUSY,
                                API_ERROR_CONFLICT,
                                "vm %s has %u forwards, the most a VM can have",
                                vm_id(v),
                                VM_FORWARDS_MAX);
                p = vm_port(v, true);
                if (!p)
                        return api_error_set(
                                reterr,
                                -ENOENT,
                                API_ERROR_INTERNAL,
                                "forward port %" PRIi64 ": the network has no switch",
                                port);
                r = net_port_add_loopback_forward(p, (uint16_t) port, /* host_port= */ 0, &host_port);
                if (r < 0)
                        return api_error_set(
                                reterr, r, API_ERROR_INTERNAL, "forward port %" PRIi64 ": %s", port, strerror(-r));
                f = fw->items + fw->n++;
                *f = (VmForward){ .port = (uint16_t) port, .host_port = host_port };
                log_struct(
                        LOG_INFO,
                        LOG_FIELDS({ "VM_ID", vm_id(v) }),
                        "VM %s: guest port %u forwarded from " FORWARD_ADDRESS_PREFIX "%u.",
                        vm_id(v),
                        (unsigned) f->port,
                        (unsigned) f->host_port);
                vm_forwards_changed(v);
        }
        j = vm_forward_to_json(f);
        if (!j || json_object_set_new(j, "id", json_string(vm_id(v))) < 0) {
                json_decref(j);
                return -ENOMEM;
        }
        *ret = j;
        return 0;
}

void vm_forwards_restore(Vm *v) {
        VmForwards *fw = vm_forwards(v);
        bool changed = false;
        NetPort *p;

        if (fw->n == 0)
                return;
        p = vm_port(v, true);
        for (size_t i = 0; i < fw->n;) {
                VmForward *f = fw->items + i;
                uint16_t host_port = 0;
                int r = p ? net_port_add_loopback_forward(p, f->port, f->host_port, &host_port) : -ENOENT;

                if (r == -EADDRINUSE) {
                        r = net_port_add_loopback_forward(p, f->port, /* host_port= */ 0, &host_port);
                        if (r >= 0)
                                log_struct(
                                        LOG_NOTICE,
                                        LOG_FIELDS({ "VM_ID", vm_id(v) }),
                                        "VM %s: " FORWARD_ADDRESS_PREFIX
                                        "%u, the forward of guest port %u, was taken by another process; "
                                        "the forward moved to " FORWARD_ADDRESS_PREFIX "%u.",
                                        vm_id(v),
                                        (unsigned) f->host_port,
                                        (unsigned) f->port,
                                        (unsigned) host_port);
                }
                if (r < 0) {
                        log_struct(
                                LOG_WARNING,
                                LOG_FIELDS({ "VM_ID", vm_id(v) }),
                                "VM %s: the forward of guest port %u from " FORWARD_ADDRESS_PREFIX
                                "%u cannot listen again and is dropped: %s",
                                vm_id(v),
                                (unsigned) f->port,
                                (unsigned) f->host_port,
                                p ? strerror(-r) : "the VM has no port on its network");
                        memmove(f, f + 1, (fw->n - i - 1) * sizeof(VmForward));
                        fw->n--;
                        changed = true;
                        continue;
                }
                if (host_port != f->host_port) {
                        f->host_port = host_port;
                        changed = true;
                }
                i++;
        }
        if (changed)
                vm_forwards_changed(v);
}
