/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A VM on its network: its port on the switch (the lease is the port's identity), the metadata
 * listener the gateway connects the guest's IMDS requests to (the listener is the identity: nothing
 * but this VM's port reaches it), and forward_port.
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
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"
#include "net-switch.h"
#include "network.h"
#include "parse-util.h"
#include "socket-util.h"
#include "vm-internal.h"

#define FORWARD_ADDRESS_PREFIX "127.0.0.1:"

/* The lease is the port's identity. */
NetPort *vm_port(Vm *v, bool create) {
        NetSwitch *sw = manager_switch_get(v->manager, v->rec.spec.network);
        Network *n = network_registry_get(manager_networks(v->manager), v->rec.spec.network);
        const NetworkLease *l = n ? network_lease_find(n, v->rec.id) : NULL;
        NetPort *p;

        if (!sw)
                return NULL;
        p = net_switch_find_port(sw, v->rec.id);
        if (p || !create || !l)
                return p;
        if (net_switch_add_port(sw, v->rec.id, l->mac, l->ip, &p) < 0)
                return NULL;
        return p;
}

static int on_imds_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Vm *v = userdata;
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (cfd < 0)
                return 0;
        if (v->rec.state == VM_STATE_DELETING || !manager_imds_accept(v->manager, v, cfd))
                (void) close(cfd);
        return 0;
}

/* The VM's metadata listener, which the gateway connects the guest's IMDS requests to. The listener
 * is the identity: nothing but this VM's port reaches it. */
static int imds_listen(Vm *v, NetPort *p) {
        _cleanup_free_ char *path = vm_path(v, "imds.sock");
        _cleanup_close_ int fd = -EBADF;
        int r;

        if (!path)
                return -ENOMEM;
        if (!v->imds_source) {
                fd = unix_stream_listen(path, 64);
                if (fd < 0)
                        return fd;
                r = sd_event_add_io(manager_event(v->manager), &v->imds_source, fd, EPOLLIN, on_imds_accept, v);
                if (r < 0)
                        return r;
                (void) vm_listener_ratelimit(v->imds_source);
                (void) sd_event_source_set_io_fd_own(v->imds_source, true);
                TAKE_FD(fd);
        }
        return net_port_set_imds(p, path);
}

/* QEMU listens on <vm>/net.sock; the switch dials it once QEMU's monitor answers, and again after a
 * daemon restart. A VM whose NIC cannot be linked still runs, without a network, and says so. */
void vm_net_attach(Vm *v) {
        _cleanup_free_ char *path = vm_path(v, "net.sock");
        NetPort *p = vm_port(v, true);
        int r;

        if (!path)
                return;
        r = p ? net_port_dial(p, path) : -ENOENT;
        if (p) {
                /* the metadata listener stands whether or not the NIC answered this time */
                Network *n = network_registry_get(manager_networks(v->manager), v->rec.spec.network);
                int k = n && n->enable_imds ? imds_listen(v, p) : 0;
                if (k < 0)
                        log_struct(
                                LOG_WARNING,
                                LOG_FIELDS({ "VM_ID", v->rec.id }),
                                "VM %s has no metadata service: %s",
                                v->rec.id,
                                strerror(-k));
        }
        if (r < 0)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s has no network: linking its NIC to network %s failed: %s",
                        v->rec.id,
                        v->rec.spec.network,
                        strerror(-r));
}

void vm_net_detach(Vm *v, bool remove) {
        NetPort *p = vm_port(v, false);

        if (remove) {
                net_port_remove(p);
                v->imds_source = sd_event_source_disable_unref(v->imds_source);
        } else
                net_port_disconnect(p);
}

int vm_forward_port(Vm *v, int64_t port, json_t **ret, ApiError *reterr) {
        VmForwards *fw = &v->rec.forwards;
        uint16_t host_port = 0;
        VmForward *f;
        NetPort *p;
        json_t *j;
        int r;

        /* forward_port's declaration holds a request's port to 1..65535 */
        assert_return(port >= 1 && port <= 65535, -EINVAL);
        if (!v->rec.ip || v->rec.state == VM_STATE_DELETING)
                return api_error_set(
                        reterr,
                        -EADDRNOTAVAIL,
                        API_ERROR_CONFLICT,
                        "vm %s has no address (%s)",
                        vm_id(v),
                        vm_state_to_string(v->rec.state));
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
                vm_changed(v);
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
        VmForwards *fw = &v->rec.forwards;
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
                vm_changed(v);
}
