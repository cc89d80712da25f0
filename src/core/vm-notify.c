/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* READY=1 from the guest's PID 1 (sd_notify over vsock): one message per connection, which the guest
 * sends and then waits for us to close. Two transports: the kernel's vhost-vsock, one AF_VSOCK
 * listener on the notify port for every VM (the manager holds it; a guest is known by its CID), and
 * vhost-user, where vhost-device-vsock hands a guest's connection to the VM's own unix socket. */
#include <linux/vm_sockets.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host-probe.h"
#include "log.h"
#include "socket-util.h"
#include "vm-internal.h"

#define VM_NOTIFY_MESSAGE_MAX (64U * 1024U)

/* A listener whose accept() fails for want of descriptors or memory stays readable: level-triggered,
 * it would run the loop hot. Past this many dispatches in a tenth of a second it pauses until the
 * tenth is over, which no guest's real traffic comes near (a VM holds 16 metadata connections). */
#define VM_LISTENER_BURST 200U
int vm_listener_ratelimit(sd_event_source *s) {
        return sd_event_source_set_ratelimit(s, 100 * USEC_PER_MSEC, VM_LISTENER_BURST);
}

/* A message: STATUS= and EXIT_STATUS= are kept, READY=1 is the event. */
static void vm_notify_message(Vm *v, char *msg) {
        bool ready = false;

        for (char *line = strtok(msg, "\n"); line; line = strtok(NULL, "\n")) {
                if (streq(line, "READY=1"))
                        ready = true;
                else if (strneq(line, "STATUS=", 7) && line[7]) {
                        free(v->rec.status);
                        v->rec.status = strdup(line + 7);
                } else if (strneq(line, "EXIT_STATUS=", 12)) {
                        free(v->guest_exit_status);
                        v->guest_exit_status = strdup(line + 12);
                } else if (strneq(line, "X_SYSTEMD_UNIT_ACTIVE=", 22))
                        log_struct(
                                LOG_INFO,
                                LOG_FIELDS({ "VM_ID", v->rec.id }, { "GUEST_UNIT", line + 22 }),
                                "VM %s: guest unit %s is active",
                                v->rec.id,
                                line + 22);
        }
        if (ready)
                (void) vm_set_state(v, VM_EVENT_READY, NULL, NULL);
        else
                vm_changed(v);
}

typedef struct NotifyConn {
        Vm *vm;
        sd_event_source *source;
        char buf[VM_NOTIFY_MESSAGE_MAX + 1];
        size_t len;
} NotifyConn;

static int on_notify_data(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        NotifyConn *c = userdata;
        ssize_t k = read(fd, c->buf + c->len, VM_NOTIFY_MESSAGE_MAX - c->len);

        if (k > 0)
                c->len += (size_t) k;
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
                return 0;
        /* One message per connection: the sender waits for us to close, so take what came and close. */
        c->buf[c->len] = 0;
        if (c->len > 0 && c->vm)
                vm_notify_message(c->vm, c->buf);
        vm_unref(c->vm);
        sd_event_source_disable_unref(c->source);
        free(c);
        return 0;
}

/* Takes the connection, whatever happens. */
static int notify_conn_new(Vm *v, int fd) {
        _cleanup_close_ int cfd = fd;
        NotifyConn *c;
        int r;

        c = calloc(1, sizeof(NotifyConn));
        if (!c)
                return -ENOMEM;
        c->vm = vm_ref(v);
        r = sd_event_add_io(manager_event(v->manager), &c->source, cfd, EPOLLIN, on_notify_data, c);
        if (r < 0) {
                vm_unref(c->vm);
                free(c);
                return r;
        }
        (void) sd_event_source_set_io_fd_own(c->source, true);
        TAKE_FD(cfd);
        return 0;
}

static int on_notify_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (cfd >= 0)
                (void) notify_conn_new(userdata, cfd);
        return 0;
}

/* vhost-device-vsock hands a guest connection to host port P to the unix socket <uds>_<P>. */
int vm_notify_listen(Vm *v) {
        _cleanup_close_ int fd = -EBADF;
        int r;

        vm_notify_close(v);
        if (asprintf(&v->notify_path, "%s/vsock_%u", v->dir, manager_settings(v->manager)->notify_port) < 0) {
                v->notify_path = NULL;
                return -ENOMEM;
        }
        fd = unix_stream_listen(v->notify_path, 8);
        if (fd < 0)
                return fd;
        r = sd_event_add_io(manager_event(v->manager), &v->notify_source, fd, EPOLLIN, on_notify_accept, v);
        if (r < 0)
                return r;
        (void) vm_listener_ratelimit(v->notify_source);
        v->notify_fd = TAKE_FD(fd);
        return 0;
}

void vm_notify_close(Vm *v) {
        v->notify_source = sd_event_source_disable_unref(v->notify_source);
        v->notify_fd = safe_close(v->notify_fd);
        if (v->notify_path) {
                (void) unlink(v->notify_path);
                v->notify_path = mfree(v->notify_path);
        }
}

/* The kernel's vhost-vsock: one AF_VSOCK listener on the notify port for every VM, a guest known by
 * the CID its connection comes from. The manager holds it; it listens from the first VM that needs it. */
struct VmNotify {
        Manager *manager;
        int fd;
        sd_event_source *source;
};

int vm_notify_new(VmNotify **ret, Manager *m) {
        VmNotify *n = calloc(1, sizeof(VmNotify));

        if (!n)
                return -ENOMEM;
        n->manager = m;
        n->fd = -EBADF;
        *ret = n;
        return 0;
}

VmNotify *vm_notify_free(VmNotify *n) {
        if (!n)
                return NULL;
        sd_event_source_disable_unref(n->source);
        safe_close(n->fd);
        free(n);
        return NULL;
}

static Vm *vm_by_cid(Manager *m, uint32_t cid) {
        Vm *v;

        MANAGER_FOREACH_VM(v, m, i)
        if (v->rec.vsock == VM_VSOCK_VHOST && v->rec.cid == cid && v->rec.phase >= 0)
                return v;
        return NULL;
}

static int on_vsock_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        VmNotify *n = userdata;
        struct sockaddr_vm peer = {};
        socklen_t len = sizeof(peer);
        _cleanup_close_ int cfd = accept4(fd, (struct sockaddr *) &peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        Vm *v;

        if (cfd < 0)
                return 0;
        v = len >= sizeof(peer) && peer.svm_family == AF_VSOCK ? vm_by_cid(n->manager, peer.svm_cid) : NULL;
        if (!v) {
                log_debug("READY=1 connection from unknown CID %u, closed.", (unsigned) peer.svm_cid);
                return 0;
        }
        (void) notify_conn_new(v, TAKE_FD(cfd));
        return 0;
}

static int vsock_listen(VmNotify *n) {
        _cleanup_close_ int fd = -EBADF;
        uint32_t port = manager_settings(n->manager)->notify_port;
        struct sockaddr_vm sa = {
                .svm_family = AF_VSOCK,
                .svm_cid = VMADDR_CID_ANY,
                .svm_port = port,
        };
        int r;

        if (n->source)
                return 0;
        fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(fd, 64) < 0)
                return -errno;
        r = sd_event_add_io(manager_event(n->manager), &n->source, fd, EPOLLIN, on_vsock_accept, n);
        if (r < 0)
                return r;
        (void) vm_listener_ratelimit(n->source);
        n->fd = TAKE_FD(fd);
        log_debug("Listening for READY=1 on vsock port %u.", (unsigned) port);
        return 0;
}

VmVsock vm_notify_pick(Vm *v) {
        int r;

        switch (host_probe_notify(manager_host(v->manager), NULL)) {
        case HOST_NOTIFY_VHOST:
                r = vsock_listen(manager_notify(v->manager));
                if (r >= 0)
                        return VM_VSOCK_VHOST;
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s starts without READY=1: no AF_VSOCK listener on port %u: %s",
                        v->rec.id,
                        (unsigned) manager_settings(v->manager)->notify_port,
                        strerror(-r));
                return VM_VSOCK_NONE;
        case HOST_NOTIFY_VHOST_USER:
                return VM_VSOCK_VHOST_USER;
        default:
                return VM_VSOCK_NONE;
        }
}

int vm_notify_listen_again(Vm *v) {
        if (v->rec.phase != VM_PHASE_BOOT)
                return 0;
        switch (v->rec.vsock) {
        case VM_VSOCK_VHOST_USER:
                return vm_notify_listen(v);
        case VM_VSOCK_VHOST:
                return vsock_listen(manager_notify(v->manager));
        default:
                return 0;
        }
}

/* POST /bootstrap/failed of the IMDS: the guest's word that a unit of its user-data's bootstrap
 * failed (vm-bootstrap-failed@.service, the OnFailure= of kubeadm.service), with the unit's last
 * journal lines. Only printable text goes into lastError, at most VM_BOOTSTRAP_REPORT_MAX bytes;
 * lines are joined with " | ". */
int vm_bootstrap_failed(Vm *v, const void *body, size_t size) {
        _cleanup_free_ char *text = NULL;
        const char *b = body;
        size_t n = 0;
        VmStatus s = vm_status(v);

        assert(v);
        if (vm_state_next(&s, VM_EVENT_BOOTSTRAP_FAILED).ignored)
                return -ESTALE;
        size = MIN(size, (size_t) VM_BOOTSTRAP_REPORT_MAX);
        text = malloc(size * 3 + 1);
        if (!text)
                return -ENOMEM;
        for (size_t i = 0; i < size; i++) {
                unsigned char c = (unsigned char) b[i];
                if (c == '\n') {
                        if (n > 0 && i + 1 < size)
                                n += (size_t) sprintf(text + n, " | ");
                } else if (c >= 0x20 && c < 0x7f)
                        text[n++] = (char) c;
                else if (c != '\r')
                        text[n++] = '?';
        }
        while (n > 0 && strchr(" |", text[n - 1]))
                n--;
        text[n] = 0;
        log_struct(
                LOG_WARNING,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "VM %s: the guest's bootstrap failed: %s",
                v->rec.id,
                n ? text : "(no detail)");
        return vm_set_state(
                v, VM_EVENT_BOOTSTRAP_FAILED, &(VmEventArgs){ .detail = n ? text : "no detail" }, NULL);
}
