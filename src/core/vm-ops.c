/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The operations on VMs that both surfaces run: create_vm (spec -> new -> provision -> start, one
 * unwind), start_vm, stop_vm, reboot_vm, delete_vm. Each asks vm_set_state() first, so what a VM in a
 * given state may do is decided in one place (src/vm/vm-state.c), with its refusal's text. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image-catalog.h"
#include "log.h"
#include "network.h"
#include "storage.h"
#include "string-util.h"
#include "vm-internal.h"

/* ---- create_vm ---- */

/* The arguments that name other records: the image (and its newest version), the Kubernetes
 * version, the network, the attestation policy; then whether a VM may be created at all. They are
 * arguments, so an unknown one is an invalid_request and not a not_found. */
/* create_vm's refusals that may change while it waits for its disk: asked before and after. */
static int check_name_free(Manager *m, const char *name, ApiError *reterr) {
        Vm *other;

        if (manager_shutting_down(m))
                return api_error_set(reterr, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
        other = manager_find_vm_by_name(m, name);
        if (other)
                return api_error_set(
                        reterr, -EEXIST, API_ERROR_CONFLICT, "vm name \"%s\" is in use by %s", name, vm_id(other));
        return 0;
}

/* The image is looked up here, once for the request: *ret_image is a new reference, which the VM
 * keeps. */
static int create_resolve(Manager *m, VmSpec *spec, Image **ret_image, Network **ret_net, ApiError *reterr) {
        _cleanup_(image_unrefp) Image *img = NULL;
        Network *net;
        char **kv;
        uint64_t host_mib = host_probe_memory(manager_host(m)) / (1024 * 1024);
        int r;

        /* more memory than the host has: QEMU would refuse it or the guest would die of it later,
         * after a VM was made; refused here with nothing made */
        if (host_mib > 0 && spec->memory_mib > host_mib)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "memory_mib %" PRIu64 " is more than this host has (%" PRIu64 " MiB)",
                        spec->memory_mib,
                        host_mib);

        /* An unknown image or Kubernetes version is an invalid_request, not a not_found, since both
         * are arguments of the request and not the resource it names. */
        img = image_catalog_acquire(manager_images(m), spec->image);
        if (!img) {
                if (!spec->image || !*spec->image)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "image \"\": not found: no images in %s",
                                manager_image_dir(m));
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "image \"%s\": not found: image \"%s\"",
                        spec->image,
                        spec->image);
        }
        free(spec->image);
        spec->image = strdup(img->ref);
        if (!spec->image)
                return -ENOMEM;
        kv = image_catalog_kubernetes_versions(manager_images(m));
        if (spec->kubernetes_version && *spec->kubernetes_version) {
                bool found = false;
                for (char **k = kv; k && *k && !found; k++)
                        found = streq(*k, spec->kubernetes_version);
                if (!found) {
                        _cleanup_free_ char *avail = strv_join(kv, ", ");
                        const char *why = image_catalog_kubernetes_unusable(
                                manager_images(m), spec->kubernetes_version);

                        if (!avail)
                                return -ENOMEM;
                        if (why)
                                return api_error_set(
                                        reterr,
                                        -EINVAL,
                                        API_ERROR_INVALID_REQUEST,
                                        "kubernetes version \"%s\" of image %s is not offered: %s (available: %s)",
                                        spec->kubernetes_version,
                                        img->ref,
                                        why,
                                        *avail ? avail : "none");
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "kubernetes version \"%s\" is not available for image %s (available: %s)",
                                spec->kubernetes_version,
                                img->ref,
                                *avail ? avail : "none");
                }
        } else {
                free(spec->kubernetes_version);
                spec->kubernetes_version = kv && kv[0] ? strdup(kv[0]) : NULL;
        }
        net = network_registry_get(manager_networks(m), spec->network);
        if (!net)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "network \"%s\": not found: network \"%s\"",
                        spec->network,
                        spec->network);

        r = vm_attest_check_image(m, img, spec, reterr);
        if (r < 0)
                return r;

        r = check_name_free(m, spec->name, reterr);
        if (r < 0)
                return r;

        *ret_image = TAKE_PTR(img);
        *ret_net = net;
        return 0;
}

/* A VM of the spec, not yet anywhere: its id, machine ID, the region (this host) and zone (its
 * network), who asked for it. */
static int create_new(Manager *m, VmSpec *spec, const Caller *caller, Vm **ret) {
        _cleanup_(vm_unrefp) Vm *v = vm_new(m);
        int r;

        if (!v)
                return -ENOMEM;
        v->rec.id = calloc(1, 9);
        if (!v->rec.id)
                return -ENOMEM;
        do {
                r = vm_random_hex(v->rec.id, 4);
                if (r < 0)
                        return r;
        } while (manager_find_vm(m, v->rec.id));
        r = vm_random_hex(v->rec.machine_id, 16);
        if (r < 0)
                return r;
        v->rec.spec = *spec;
        *spec = (VmSpec){};
        if (!v->rec.spec.region) {
                char host[256] = "";
                if (gethostname(host, sizeof(host)) >= 0 && *host)
                        v->rec.spec.region = strdup(host);
        }
        v->rec.spec.zone = strdup(v->rec.spec.network);
        v->rec.state = VM_STATE_CREATING;
        v->rec.created_at = now_usec(CLOCK_REALTIME);
        if (caller && !(v->rec.created_by = caller_created_by_json(caller)))
                return -ENOMEM;
        v->rec.att.required = v->rec.spec.require_attestation;
        /* a new vTPM is manufactured with an EK certificate of the host's CA before its first swtpm */
        v->rec.att.ek_pending = manager_attest_ca(m) != NULL;
        if (asprintf(&v->dir, "%s/vms/%s", manager_state_dir(m), v->rec.id) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(v);
        return 0;
}

typedef struct CreateCall {
        Vm *vm;
        VmProvision provision; /* until create_provisioned() takes it */
        char *user_data;       /* until the VM's directory has it */
        VmWaitFor wait_for;
        VmDoneFunc done;
        VmProgressFunc progress;
        void *userdata;
        VmWaiter *waiter; /* until the start chain takes it */
        bool observing;
} CreateCall;

/* The waiter and the observer go first, then what was provisioned. */
static void create_call_detach(CreateCall *c) {
        vm_waiter_drop(c->vm, c->waiter);
        c->waiter = NULL;
        if (c->observing)
                vm_unobserve(c->vm, c->userdata);
        c->observing = false;
}

/* Unless the start chain took it: its waiter and observer go with it, and what was provisioned. */
static CreateCall *create_call_free(CreateCall *c) {
        if (!c)
                return NULL;
        create_call_detach(c);
        vm_provision_undo(&c->provision);
        free(c->user_data);
        vm_unref(c->vm);
        free(c);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(CreateCall *, create_call_free);

/* How the disk is written: create_vm's install_mode, else --install-mode. Host needs the image's
 * layout file: asked for explicitly, an image without one is unsupported; by default it falls back
 * to the installer boot. Decided before anything is allocated. */
static int create_install_mode(
        Manager *m, const VmSpec *spec, const Image *img, VmInstallMode *ret, ApiError *reterr) {
        VmInstallMode mode = spec->install_mode >= 0 ? spec->install_mode : manager_settings(m)->install_mode;

        if (mode == VM_INSTALL_HOST && img && !img->layout) {
                _cleanup_free_ char *text = vm_message_format(
                        VM_MESSAGE_HOST_INSTALL_UNSUPPORTED, &(VmMessageArgs){ .what = img->ref });

                if (spec->install_mode == VM_INSTALL_HOST)
                        return api_error_set(
                                reterr,
                                -EOPNOTSUPP,
                                API_ERROR_UNSUPPORTED,
                                "%s",
                                text ?: "host install unsupported");
                log_info(
                        "Image %s has no layout file (%s.layout.json): installing with an installer boot.",
                        img->ref,
                        img->ref);
                mode = VM_INSTALL_BOOT;
        }
        if (mode == VM_INSTALL_HOST && img) {
                int r = vm_host_install_check(m, img, spec->disk_gib, reterr);
                if (r < 0)
                        return r;
        }
        *ret = mode;
        return 0;
}

/* A create whose installer never ran leaves nothing behind. */
static void create_discard(Vm *v) {
        vm_kill(v);
        vm_release(v);
        manager_remove_vm(v->manager, v);
        manager_touch(v->manager);
}

/* The installer is up (or could not start): answer now, or wait for the milestone. */
static void create_started(int r, json_t *record, const ApiError *e, void *userdata) {
        _cleanup_free_ CreateCall *c = userdata;
        _cleanup_(vm_unrefp) Vm *v = c->vm;
        _cleanup_(api_error_done) ApiError e2 = API_ERROR_NULL;
        const ManagerSettings *st = manager_settings(v->manager);
        VmWaiter *w;

        if (r < 0 || c->wait_for == VM_WAIT_NONE)
                vm_unobserve(v, c->userdata);
        if (r < 0 && r != -ECANCELED && v->rec.install_mode == VM_INSTALL_HOST &&
            v->rec.state == VM_STATE_FAILED) {
                /* A host-mode create answers once the first boot's QEMU does: a host install (or
                 * that first start) that failed before leaves the VM failed, its reason in
                 * lastError (its disk, when the install failed, is gone already). */
                _cleanup_free_ char *text = vm_message(
                        v, VM_MESSAGE_WAIT_FAILED, &(VmMessageArgs){ .detail = v->rec.last_error });

                (void) api_error_set(&e2, -EIO, API_ERROR_VM_FAILED, "%s", text ?: "vm failed");
                if (c->done)
                        c->done(e2.error, NULL, &e2, c->userdata);
                return;
        }
        if (r < 0) {
                create_discard(v);
                if (c->done)
                        c->done(r, NULL, e, c->userdata);
                return;
        }
        if (c->wait_for == VM_WAIT_NONE) {
                if (c->done)
                        c->done(0, record, NULL, c->userdata);
                return;
        }
        /* From here on the VM exists whatever happens: a failed wait names it, it is not removed. */
        w = vm_waiter_add(v, VM_WAITER_MILESTONE, c->done, c->userdata);
        if (!w ||
            vm_waiter_set_milestone(
                    v,
                    w,
                    c->wait_for,
                    st->install_timeout + st->stop_timeout +
                            (c->wait_for == VM_WAIT_INSTALLED ? 0 : st->boot_timeout)) < 0) {
                vm_waiter_drop(v, w);
                (void) api_error_set(&e2, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                if (c->done)
                        c->done(e2.error, NULL, &e2, c->userdata);
                return;
        }
        vm_waiters_check(v);
}

/* The disk is there: what may have changed meanwhile is looked at again (shutdown, the name, the
 * network), the rest is provisioned, and the installer's start chain, whose end answers
 * (create_started), takes the call. On failure c is left as it was, for the caller to undo. */
static int create_provisioned(CreateCall *c, ApiError *reterr) {
        _cleanup_(vm_provision_undo) VmProvision provision = c->provision;
        _cleanup_free_ char *user_data = TAKE_PTR(c->user_data);
        Vm *v = c->vm;
        Manager *m = v->manager;
        Network *net;
        int r;

        c->provision = (VmProvision){};
        r = check_name_free(m, v->rec.spec.name, reterr);
        if (r < 0)
                return r;
        net = network_registry_get(manager_networks(m), v->rec.spec.network);
        if (!net)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "network \"%s\": not found: network \"%s\"",
                        v->rec.spec.network,
                        v->rec.spec.network);
        r = vm_provision_finish(&provision, user_data, net, reterr);
        if (r < 0)
                return r;

        r = vm_observe(v, c->progress, c->userdata);
        if (r < 0)
                return r;
        c->observing = true;
        c->waiter = vm_waiter_add(v, VM_WAITER_STARTED, create_started, c);
        if (!c->waiter) {
                create_call_detach(c);
                return -ENOMEM;
        }
        r = vm_set_state(
                v, v->rec.install_mode == VM_INSTALL_HOST ? VM_EVENT_CREATE_HOST : VM_EVENT_CREATE, NULL, reterr);
        if (r < 0) {
                create_call_detach(c); /* before the undo, as they came after what it undoes */
                return r;
        }

        /* the chain owns the call now (it may have answered already), and the VM exists */
        vm_provision_commit(&provision);
        manager_touch(m);
        log_struct(
                LOG_INFO,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "Creating VM %s (%s) from %s, install mode %s.",
                v->rec.id,
                v->rec.spec.name,
                v->rec.spec.image,
                vm_install_mode_to_string(v->rec.install_mode));
        return 0;
}

static void create_disk_acquired(Vm *v, int r, ApiError *e, void *userdata) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        _cleanup_(api_error_done) ApiError e2 = API_ERROR_NULL;
        CreateCall *c = userdata;
        VmDoneFunc done = c->done;
        void *done_userdata = c->userdata;

        if (r >= 0) {
                r = create_provisioned(c, &e2);
                if (r >= 0)
                        return;
                api_error_from_errno(&e2, r, "create_vm");
                e = &e2;
        } else
                (void) api_error_prefix(e, "disk of vm %s", v->rec.id);

        /* nothing of the VM is left when the answer goes */
        create_call_free(c);
        if (done)
                done(r, NULL, e, done_userdata);
}

int vm_create(
        Manager *m,
        VmSpecInput *in,
        const Caller *caller,
        VmDoneFunc done,
        VmProgressFunc progress,
        void *userdata,
        ApiError *reterr) {
        _cleanup_(vm_spec_done) VmSpec spec = {};
        _cleanup_(image_unrefp) Image *img = NULL;
        _cleanup_free_ char *user_data = NULL;
        _cleanup_(vm_unrefp) Vm *v = NULL;
        _cleanup_(create_call_freep) CreateCall *call = NULL;
        VmWaitFor wait_for;
        VmInstallMode mode = VM_INSTALL_BOOT;
        Network *net = NULL;
        int r;

        /* the spec */
        r = vm_spec_build(in, /* request= */ true, &spec, &user_data, &wait_for, reterr);
        if (r < 0)
                return r;
        r = create_resolve(m, &spec, &img, &net, reterr);
        if (r < 0)
                return r;
        r = create_install_mode(m, &spec, img, &mode, reterr);
        if (r < 0)
                return r;

        /* a new VM, its directory and its disk: from here on a failure undoes them all */
        r = create_new(m, &spec, caller, &v);
        if (r < 0)
                return r;
        v->rec.install_mode = mode;
        v->image = TAKE_PTR(img);
        call = calloc(1, sizeof(CreateCall));
        if (!call)
                return -ENOMEM;
        *call = (CreateCall){
                .vm = vm_ref(v),
                .user_data = TAKE_PTR(user_data),
                .wait_for = wait_for,
                .done = done,
                .progress = progress,
                .userdata = userdata,
        };
        /* The storage provider answers in its own time: the rest follows from the loop, in
         * create_disk_acquired(), which the call goes to. */
        r = vm_provision_begin(&call->provision, v, create_disk_acquired, call, reterr);
        if (r < 0)
                return r;
        TAKE_PTR(call);
        return 0;
}

/* ---- start, stop, reboot ---- */

bool vm_has_process(Vm *v) {
        return v->qemu || IN_SET(v->sub, VM_SUB_START_HELPERS, VM_SUB_START_QMP, VM_SUB_HOST_INSTALL);
}

/* The start chain of an installed boot, the disk's lease held. */
static int start_now(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        r = vm_set_state(v, VM_EVENT_START, NULL, &e);
        if (r < 0) {
                (void) vm_set_state(
                        v,
                        VM_EVENT_START_FAILED,
                        &(VmEventArgs){ .error = r, .detail = e.message ?: "start failed" },
                        NULL);
                if (reterr) {
                        api_error_done(reterr);
                        *reterr = e;
                        e = API_ERROR_NULL;
                }
                return r;
        }
        if (!vm_waiter_add(v, VM_WAITER_STARTED, done, userdata))
                return -ENOMEM;
        return 0;
}

typedef struct StartCall {
        VmDoneFunc done;
        void *userdata;
} StartCall;

static void start_disk_acquired(Vm *v, int r, ApiError *e, void *userdata) {
        _cleanup_free_ StartCall *c = userdata;
        _cleanup_(api_error_done) ApiError e2 = API_ERROR_NULL;

        if (r < 0) {
                (void) api_error_prefix(e, "disk of vm %s", v->rec.id);
                if (c->done)
                        c->done(r, NULL, e, c->userdata);
                return;
        }
        /* the VM may have moved on while its disk was opened */
        r = vm_check_event(v, VM_EVENT_START, &e2);
        if (r >= 0)
                r = start_now(v, c->done, c->userdata, &e2);
        if (r < 0) {
                api_error_from_errno(&e2, r, "start_vm");
                if (c->done)
                        c->done(r, NULL, &e2, c->userdata);
        }
}

int vm_start(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        StartCall *c;
        int r;

        r = vm_check_event(v, VM_EVENT_START, reterr);
        if (r < 0)
                return r;
        if (v->volume_fd >= 0)
                return start_now(v, done, userdata, reterr);

        /* first start since the daemon did: the disk's lease again, from the storage provider in its
         * own time; the start follows in start_disk_acquired() */
        c = calloc(1, sizeof(StartCall));
        if (!c)
                return -ENOMEM;
        *c = (StartCall){ .done = done, .userdata = userdata };
        r = vm_acquire_volume_async(v, VOLUME_OPEN, start_disk_acquired, c, reterr);
        if (r < 0) {
                free(c);
                (void) api_error_prefix(reterr, "disk of vm %s", v->rec.id);
                return r;
        }
        return 0;
}

int vm_stop(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        int r;

        r = vm_check_event(v, VM_EVENT_STOP, reterr);
        if (r < 0)
                return r;
        if (!vm_waiter_add(v, VM_WAITER_STOPPED, done, userdata))
                return -ENOMEM;
        return vm_set_state(v, VM_EVENT_STOP, NULL, reterr);
}

int vm_reboot(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        VmWaiter *w;
        int r;

        r = vm_check_event(v, VM_EVENT_REBOOT, reterr);
        if (r < 0)
                return r;
        /* the stop first; once it is done its waiter starts the VM, and the start answers */
        w = vm_waiter_add(v, VM_WAITER_STOPPED, done, userdata);
        if (!w)
                return -ENOMEM;
        vm_waiter_then_start(w);
        r = vm_set_state(v, VM_EVENT_REBOOT, NULL, reterr);
        if (r < 0)
                return r;
        vm_waiters_check(v);
        return 0;
}

/* ---- delete ---- */

typedef struct DeleteCall {
        Vm *vm;
        VmDoneFunc done;
        void *userdata;
} DeleteCall;

static void delete_finish(int r, json_t *record, const ApiError *e, void *userdata) {
        DeleteCall *c = userdata;
        _cleanup_(vm_unrefp) Vm *v = c->vm;
        Manager *m = v->manager;
        json_auto_t *gone = NULL;

        vm_unobserve(v, c->userdata);
        vm_release(v);
        log_struct(
                LOG_INFO, LOG_FIELDS({ "VM_ID", v->rec.id }), "VM %s (%s) deleted.", v->rec.id, v->rec.spec.name);
        gone = json_pack("{s:s,s:b}", "id", v->rec.id, "deleted", true);
        manager_remove_vm(m, v);
        manager_touch(m);
        if (c->done)
                c->done(0, gone, NULL, c->userdata);
        free(c);
}

int vm_delete(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v); /* the deletion may complete before we return */
        DeleteCall *c;
        int r;

        r = vm_check_event(v, VM_EVENT_DELETE, reterr);
        if (r < 0)
                return r;
        c = calloc(1, sizeof(DeleteCall));
        if (!c)
                return -ENOMEM;
        *c = (DeleteCall){ .vm = vm_ref(v), .done = done, .userdata = userdata };

        if (IN_SET(v->sub, VM_SUB_START_HELPERS, VM_SUB_START_QMP, VM_SUB_HOST_INSTALL)) {
                /* nothing to power down yet: the chain ends first (a create is discarded) */
                _cleanup_free_ char *text = vm_message(v, VM_MESSAGE_DELETED_STARTING, NULL);
                (void) vm_set_state(
                        v,
                        VM_EVENT_START_FAILED,
                        &(VmEventArgs){ .error = -ECANCELED, .detail = text ?: "deleted while starting" },
                        NULL);
        }
        if (!vm_waiter_add(v, VM_WAITER_STOPPED, delete_finish, c)) {
                vm_unref(c->vm);
                free(c);
                return -ENOMEM;
        }
        (void) vm_set_state(v, VM_EVENT_DELETE, NULL, NULL);
        vm_waiters_check(v);
        return 0;
}
