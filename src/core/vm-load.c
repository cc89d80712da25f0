/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Start-up: every <state>/vms/<id>/vm.json loaded again; VMs whose units an earlier daemon left
 * running attached to (VM_EVENT_REATTACHED or _FAILED), the rest stopped or failed as their record
 * says; records that do not load set aside in quarantine; and what a crash left behind (an empty
 * directory, a record left deleting or creating, stray leases and disks) finished or removed. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs-util.h"
#include "json-util.h"
#include "log.h"
#include "network.h"
#include "storage.h"
#include "vm-internal.h"

static int vm_from_json(Manager *m, const char *id, json_t *j, Vm **ret) {
        _cleanup_(vm_unrefp) Vm *v = vm_new(m);
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        if (!v)
                return -ENOMEM;
        r = vm_record_from_json(j, id, &v->rec, &e);
        if (r < 0) {
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", id }),
                        "VM record %s: %s",
                        id,
                        e.message ?: strerror(-r));
                return r;
        }
        v->qemu_pid = v->rec.processes[VM_ROLE_QEMU].pid;
        v->swtpm_pid = v->rec.processes[VM_ROLE_SWTPM].pid;
        if (asprintf(&v->dir, "%s/vms/%s", manager_state_dir(m), id) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(v);
        return 0;
}

int vm_cmp_created(const void *a, const void *b) {
        Vm *x = *(Vm *const *) a, *y = *(Vm *const *) b;

        if (x->rec.created_at != y->rec.created_at)
                return x->rec.created_at < y->rec.created_at ? -1 : 1;
        return strcmp(x->rec.id, y->rec.id);
}

static void on_qmp_reattached(QmpClient *c, int error, void *userdata) {
        if (c != ((Vm *) userdata)->qmp)
                return; /* a connection we dropped: whoever dropped it settles the state */
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);

        if (!v->qemu)
                return; /* it ended meanwhile; the exit settled the state */
        if (error < 0) {
                _cleanup_free_ char *why = vm_message(
                        v, VM_MESSAGE_QMP_SILENT, &(VmMessageArgs){ .errno_text = strerror(-error) });
                (void) vm_set_state(
                        v,
                        VM_EVENT_REATTACH_FAILED,
                        &(VmEventArgs){ .detail = why ?: "its QMP socket did not answer" },
                        NULL);
                return;
        }
        log_struct(
                LOG_INFO,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "Reattached to VM %s (%s), %s.",
                v->rec.id,
                v->rec.spec.name,
                vm_state_to_string(v->rec.state));
        /* a QEMU of an older daemon may have no balloon: its statistics then say so */
        vm_balloon_start(v);
        (void) vm_set_state(v, VM_EVENT_REATTACHED, NULL, NULL);
}

/* Attaches to the units an earlier daemon left running: QEMU (required), swtpm and
 * vhost-device-vsock (tolerated when gone), QMP, and the READY=1 listener. */
static int vm_reattach(Vm *v) {
        Manager *m = v->manager;
        _cleanup_free_ char *qmp = vm_path(v, "qmp.sock");
        int r;

        if (!manager_units(m))
                return -EOPNOTSUPP;
        if (!v->rec.processes[VM_ROLE_QEMU].unit)
                return -ENOENT;
        if (!qmp)
                return -ENOMEM;
        r = vm_launched_attach(
                &v->qemu,
                manager_units(m),
                v->rec.processes[VM_ROLE_QEMU].unit,
                v->rec.processes[VM_ROLE_QEMU].pid,
                vm_on_qemu_exit,
                v);
        if (r < 0)
                return r;
        /* its state is read on the loop: a unit that is gone fails the reattach from there */
        vm_launched_set_started(v->qemu, vm_on_process_started);
        /* the disk's lease, as the daemon that started it held it; this waits for the storage
         * provider, which start-up may do: the loop serves nothing before vm_load_all() is done */
        if (vm_acquire_volume(v, VOLUME_OPEN, NULL) < 0)
                log_warning("VM %s: cannot take the lease on its disk again, ignoring.", v->rec.id);
        v->qemu_pid = vm_launched_pid(v->qemu);
        /* the helpers are tolerated when gone */
        for (VmRole i = VM_ROLE_SWTPM; i < _VM_ROLE_MAX; i++) {
                VmLaunched **l = i == VM_ROLE_SWTPM ? &v->swtpm : &v->vsockd;
                const VmProcessRecord *p = v->rec.processes + i;

                if (!p->unit)
                        continue;
                if (vm_launched_attach(l, manager_units(m), p->unit, p->pid, vm_on_helper_exit, v) < 0)
                        log_warning(
                                "VM %s: cannot attach to its %s unit.",
                                v->rec.id,
                                i == VM_ROLE_SWTPM ? "swtpm" : "vhost-device-vsock");
                else
                        vm_launched_set_started(*l, vm_on_process_started);
        }
        v->swtpm_pid = vm_launched_pid(v->swtpm);
        r = vm_notify_listen_again(v);
        if (r < 0)
                log_warning_errno(r, "VM %s: cannot listen for READY=1 again, ignoring: %m", v->rec.id);
        return qmp_client_connect_retry(
                &v->qmp,
                manager_event(m),
                qmp,
                vm_qmp_on_event,
                vm_qmp_on_disconnect,
                v,
                manager_settings(v->manager)->qmp_timeout,
                on_qmp_reattached);
}

/* ---- records that do not load, and what crashes leave behind ---- */

#define VM_QUARANTINE_REASON_FILE "quarantine-reason"

/* The records set aside by earlier starts: <state>/quarantine/<id>, with the reason beside them. */
static int vm_quarantine_load(Manager *m) {
        _cleanup_free_ char *qdir = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;

        if (asprintf(&qdir, "%s/quarantine", manager_state_dir(m)) < 0)
                return -ENOMEM;
        d = opendir(qdir);
        if (!d)
                return errno == ENOENT ? 0 : -errno;
        while ((de = readdir(d))) {
                _cleanup_free_ char *path = NULL, *rpath = NULL, *reason = NULL;
                int r;

                if (de->d_name[0] == '.' || manager_find_quarantined(m, de->d_name))
                        continue;
                if (asprintf(&path, "%s/%s", qdir, de->d_name) < 0 ||
                    asprintf(&rpath, "%s/" VM_QUARANTINE_REASON_FILE, path) < 0)
                        return -ENOMEM;
                if (read_full_file(rpath, 4096, &reason, NULL) < 0)
                        reason = strdup("unknown");
                if (!reason)
                        return -ENOMEM;
                reason[strcspn(reason, "\n")] = 0;
                r = manager_quarantine_add(m, de->d_name, path, reason);
                if (r < 0)
                        return r;
                log_warning(
                        "VM record %s stays in quarantine (%s); delete_vm %s removes it with its disk and lease.",
                        path,
                        reason,
                        de->d_name);
        }
        return 0;
}

/* A record that does not load is never skipped silently: its directory moves to
 * <state>/quarantine/<id> (its disk and lease stay, for delete_vm to remove), the log and get_host
 * say so, and it does not stand in the way of a VM of the same name. */
static int vm_quarantine(Manager *m, const char *vms_dir, const char *id, const char *reason) {
        _cleanup_free_ char *from = NULL, *qdir = NULL, *to = NULL, *rpath = NULL;
        int r;

        if (asprintf(&from, "%s/%s", vms_dir, id) < 0 ||
            asprintf(&qdir, "%s/quarantine", manager_state_dir(m)) < 0 ||
            asprintf(&to, "%s/%s", qdir, id) < 0 || asprintf(&rpath, "%s/" VM_QUARANTINE_REASON_FILE, to) < 0)
                return -ENOMEM;
        r = mkdir_p(qdir, 0700);
        if (r < 0)
                return r;
        if (access(to, F_OK) >= 0)
                (void) rm_rf(to); /* an older quarantine of the same id: the newer one wins */
        if (rename(from, to) < 0)
                return -errno;
        (void) write_file_atomic(rpath, reason, strlen(reason), 0600);
        log_struct(
                LOG_ERR,
                LOG_FIELDS({ "VM_ID", id }),
                "VM record %s/vm.json does not load (%s): moved to %s; its disk and lease stay until delete_vm %s.",
                from,
                reason,
                to,
                id);
        r = manager_quarantine_add(m, id, to, reason);
        if (r < 0)
                return r;
        return 0;
}

/* Releases the leases the VM id holds on every network. */
static void vm_release_leases_of(Manager *m, const char *id) {
        for (size_t i = 0; i < network_registry_size(manager_networks(m)); i++) {
                Network *n = network_registry_at(manager_networks(m), i);
                if (network_lease_find(n, id))
                        (void) network_lease_release(manager_networks(m), n, id);
        }
}

static void vm_remove_leftovers(Manager *m, const char *vms_dir, const char *id) {
        _cleanup_free_ char *path = NULL;

        if (asprintf(&path, "%s/%s", vms_dir, id) < 0)
                return;
        vm_release_leases_of(m, id);
        vm_delete_volume(m, id);
        (void) rm_rf(path);
        log_struct(
                LOG_NOTICE,
                LOG_FIELDS({ "VM_ID", id }),
                "Removed %s, a VM directory without a record (a create or delete that vm-manager was killed in), with its disk and lease.",
                path);
}

static bool vm_id_known(Manager *m, const char *id) {
        return manager_find_vm(m, id) || manager_find_quarantined(m, id);
}

/* Leases whose VM is gone (released by no one because a crash came first). */
static void vm_release_stray_leases(Manager *m) {
        for (size_t i = 0; i < network_registry_size(manager_networks(m)); i++) {
                Network *n = network_registry_at(manager_networks(m), i);
                for (size_t k = 0; k < n->n_leases;) {
                        _cleanup_free_ char *id = strdup(n->leases[k].vm_id);
                        if (!id || vm_id_known(m, id)) {
                                k++;
                                continue;
                        }
                        log_notice("Releasing the lease of VM %s on network %s: no such VM.", id, n->name);
                        if (network_lease_release(manager_networks(m), n, id) < 0)
                                k++;
                }
        }
}

/* Sparse-file disks (under the state dir, so ours alone) whose VM is gone. A provider's volume
 * directory may be shared with others, and is left alone. */
static void vm_remove_stray_volumes(Manager *m) {
        _cleanup_free_ char *own = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        const char *vdir = storage_volume_dir(manager_storage(m));
        struct dirent *de;

        if (!vdir || asprintf(&own, "%s/volumes", manager_state_dir(m)) < 0 || !streq(vdir, own))
                return;
        d = opendir(vdir);
        if (!d)
                return;
        while ((de = readdir(d))) {
                char id[9];
                const char *rest = startswith(de->d_name, "vm-");

                if (!rest || strlen(rest) != 8 + strlen(".volume") || !streq(rest + 8, ".volume"))
                        continue;
                memcpy(id, rest, 8);
                id[8] = 0;
                if (vm_id_known(m, id))
                        continue;
                log_notice("Removing the disk %s/%s: no VM %s.", vdir, de->d_name, id);
                vm_delete_volume(m, id);
        }
}

int vm_delete_quarantined(Manager *m, const char *id, json_t **ret, ApiError *reterr) {
        const ManagerQuarantine *q = manager_find_quarantined(m, id);

        if (!q)
                return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", id);
        vm_release_leases_of(m, id);
        vm_delete_volume(m, id);
        (void) manager_remove_tree(m, q->path);
        log_struct(LOG_INFO, LOG_FIELDS({ "VM_ID", id }), "Quarantined VM record %s deleted.", q->path);
        manager_quarantine_remove(m, id);
        manager_touch(m);
        *ret = json_pack("{s:s,s:b}", "id", id, "deleted", true);
        return *ret ? 0 : -ENOMEM;
}

/* A create the previous daemon did not finish may have left the units it started beside the host
 * install (swtpm, vhost-device-vsock, QEMU paused, or the first boot's chain after it): they go with
 * the VM's failure. By their names, which are fixed, not by the record, which a daemon killed between
 * a spawn and the next save does not have. */
static void vm_stop_leftover_units(Vm *v) {
        static const char *const roles[] = { "qemu", "swtpm", "vsock" };
        VmUnitManager *units = manager_units(v->manager);

        if (!units)
                return;
        log_struct(
                LOG_NOTICE,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "VM %s: stopping what units a create the previous daemon did not finish left.",
                v->rec.id);
        for (size_t i = 0; i < ELEMENTSOF(roles); i++) {
                _cleanup_free_ char *unit = vm_process_unit(v, roles[i]);

                /* on the loop: each is stopped and reset when loaded, and ignored otherwise */
                if (!unit || vm_launched_stop_unit(units, unit) < 0)
                        log_warning("VM %s: cannot stop its unit %s.", v->rec.id, unit ?: roles[i]);
        }
}

/* One <state>/vms/<name>: loaded, finished, quarantined or removed. */
static int vm_load_one(Manager *m, const char *dir, const char *name, ApiError *reterr) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        _cleanup_(vm_unrefp) Vm *v = NULL;
        json_auto_t *j = NULL;
        int r;

        if (name[0] == '.')
                return 0;
        if (asprintf(&path, "%s/%s/vm.json", dir, name) < 0)
                return -ENOMEM;
        (void) write_file_atomic_cleanup(path);
        r = read_full_file(path, VM_RECORD_MAX, &text, NULL);
        if (r == -ENOENT) {
                /* a create killed before its first record, or a delete killed after removing
                 * it: nothing of the VM is left to show, so what remains goes */
                vm_remove_leftovers(m, dir, name);
                return 0;
        }
        if (r >= 0) {
                json_error_t err;
                j = json_loads(text, 0, &err);
                r = j ? vm_from_json(m, name, j, &v) : -EBADMSG;
        }
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                r = vm_quarantine(m, dir, name, strerror(-r));
                if (r < 0)
                        return api_error_set(
                                reterr, r, API_ERROR_INTERNAL, "quarantining %s: %s", path, strerror(-r));
                return 0;
        }

        if (v->rec.state == VM_STATE_DELETING) {
                /* a delete_vm the previous daemon did not finish: finish it */
                log_struct(
                        LOG_NOTICE,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "Finishing the deletion of VM %s (%s) that vm-manager was killed in.",
                        v->rec.id,
                        v->rec.spec.name);
                vm_release(v);
                return 0;
        }
        /* a create the previous daemon did not finish is failed, saying so */
        if (v->rec.state == VM_STATE_CREATING)
                vm_stop_leftover_units(v);
        (void) vm_set_state(v, VM_EVENT_RESTARTED, NULL, NULL);
        if (!vm_state_is_live(v->rec.state))
                v->qemu_pid = v->swtpm_pid = 0;
        vm_report_load(v);
        r = manager_add_vm(m, v);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "too many VM records");
        if (vm_state_is_live(v->rec.state)) {
                r = vm_reattach(v);
                if (r < 0) {
                        _cleanup_free_ char *why = NULL;
                        if (r == -EOPNOTSUPP || r == -ENOENT)
                                why = vm_message(
                                        v,
                                        v->rec.processes[VM_ROLE_QEMU].unit ? VM_MESSAGE_NO_UNITS :
                                                                              VM_MESSAGE_WAS_CHILD,
                                        NULL);
                        else
                                why = strdup(strerror(-r));
                        /* a leftover process from a daemon killed with SIGKILL must not keep the disk */
                        if (!v->rec.processes[VM_ROLE_QEMU].unit && v->qemu_pid > 0 &&
                            kill(v->qemu_pid, 0) >= 0)
                                log_warning(
                                        "VM %s: pid %d from the previous run still exists and is not ours to stop.",
                                        v->rec.id,
                                        (int) v->qemu_pid);
                        (void) vm_set_state(
                                v,
                                VM_EVENT_REATTACH_FAILED,
                                &(VmEventArgs){ .detail = why ?: "out of memory" },
                                NULL);
                }
        } else
                (void) vm_save(v);
        vm_forwards_restore(v);
        return 0;
}

int vm_load_all(Manager *m, ApiError *reterr) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;
        int r;

        r = vm_quarantine_load(m);
        if (r < 0)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "reading %s/quarantine: %s",
                        manager_state_dir(m),
                        strerror(-r));
        if (asprintf(&dir, "%s/vms", manager_state_dir(m)) < 0)
                return -ENOMEM;
        d = opendir(dir);
        if (!d)
                return errno == ENOENT ? 0 : api_error_set(reterr, -errno, API_ERROR_INTERNAL, "%s: %m", dir);
        while ((de = readdir(d))) {
                r = vm_load_one(m, dir, de->d_name, reterr);
                if (r < 0)
                        return r;
        }
        manager_sort_vms(m, vm_cmp_created);
        vm_release_stray_leases(m);
        vm_remove_stray_volumes(m);
        return 0;
}
