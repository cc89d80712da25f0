/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* What a VM holds outside its processes: its directory and record, the per-VM ssh key, the
 * user-data, the disk (the storage lease), the network lease and the vsock CID. create_vm acquires
 * them in vm_provision_begin() (directory, disk) and vm_provision_finish() (the rest, once the storage
 * provider answered); a VmProvision undoes exactly that when the create fails before its start chain
 * runs, and delete_vm (or the discard of a create whose installer never started) gives it all back
 * with vm_release(). */
#include <arpa/inet.h>
#include <libssh/libssh.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "attest-nonce.h"
#include "fs-util.h"
#include "hex-util.h"
#include "log.h"
#include "network.h"
#include "storage.h"
#include "string-util.h"
#include "vm-internal.h"

/* The lease taken over: the fd, and the path QEMU gets (for a provider volume without a name in the
 * file system, our /proc fd link). */
static int vm_take_volume(Vm *v, Volume *vol) {
        _cleanup_free_ char *path = NULL;

        if (vol->path)
                path = strdup(vol->path);
        else if (asprintf(&path, "/proc/%d/fd/%d", (int) getpid(), vol->fd) < 0)
                path = NULL;
        if (!path)
                return -ENOMEM;
        safe_close(v->volume_fd);
        v->volume_fd = TAKE_FD(vol->fd);
        free(v->rec.volume);
        v->rec.volume = TAKE_PTR(path);
        return 0;
}

typedef struct VolumeCall {
        Vm *vm;
        VmVolumeFunc done;
        void *userdata;
} VolumeCall;

static void on_volume(StorageCall *call, int r, Volume *vol, ApiError *e, void *userdata) {
        _cleanup_free_ VolumeCall *c = userdata;
        _cleanup_(vm_unrefp) Vm *v = c->vm;

        v->volume_call = NULL;
        if (r >= 0) {
                r = vm_take_volume(v, vol);
                if (r < 0)
                        (void) api_error_set(e, r, API_ERROR_INTERNAL, "out of memory");
        }
        c->done(v, r, e, c->userdata);
}

/* The VM's disk volume "vm-<id>": created at create_vm, reopened by the first start after a daemon
 * restart. */
int vm_acquire_volume_async(Vm *v, VolumeCreate mode, VmVolumeFunc done, void *userdata, ApiError *reterr) {
        _cleanup_free_ char *name = NULL;
        _cleanup_free_ VolumeCall *c = NULL;
        int r;

        assert(done);
        if (v->volume_call)
                return api_error_set(
                        reterr, -EBUSY, API_ERROR_CONFLICT, "vm %s: its disk is being opened already", v->rec.id);
        if (asprintf(&name, "vm-%s", v->rec.id) < 0)
                return -ENOMEM;
        c = calloc(1, sizeof(VolumeCall));
        if (!c)
                return -ENOMEM;
        *c = (VolumeCall){ .vm = v, .done = done, .userdata = userdata };
        r = storage_acquire_async(
                manager_storage(v->manager),
                manager_event(v->manager),
                name,
                v->rec.spec.disk_gib << 30,
                mode,
                on_volume,
                c,
                &v->volume_call,
                reterr);
        if (r < 0)
                return r;
        vm_ref(v);
        TAKE_PTR(c);
        return 0;
}

int vm_acquire_volume(Vm *v, VolumeCreate mode, ApiError *reterr) {
        _cleanup_(volume_done) Volume vol = VOLUME_NULL;
        _cleanup_free_ char *name = NULL;
        int r;

        if (asprintf(&name, "vm-%s", v->rec.id) < 0)
                return -ENOMEM;
        r = storage_acquire(manager_storage(v->manager), name, v->rec.spec.disk_gib << 30, mode, &vol, reterr);
        if (r < 0)
                return r;
        return vm_take_volume(v, &vol);
}

void vm_delete_volume(Manager *m, const char *id) {
        _cleanup_free_ char *name = NULL, *path = NULL;

        if (asprintf(&name, "vm-%s", id) < 0)
                return;
        if (storage_delete_path(manager_storage(m), name, &path, NULL) >= 0 && path)
                (void) manager_unlink_file(m, path); /* after the writes queued before; a failure is logged */
}

void vm_release(Vm *v) {
        Network *n = network_registry_get(manager_networks(v->manager), v->rec.spec.network);

        /* a start that was opening the disk ends with -ECANCELED */
        storage_call_cancel(v->volume_call);

        vm_net_detach(v, /* remove= */ true);
        if (manager_nonces(v->manager))
                attest_nonce_forget(manager_nonces(v->manager), v->rec.id);
        if (n && network_lease_find(n, v->rec.id))
                (void) network_lease_release(manager_networks(v->manager), n, v->rec.id);
        v->volume_fd = safe_close(v->volume_fd);
        /* by its name, not its recorded path: a create stopped by a crash acquired it without
         * recording it */
        vm_delete_volume(v->manager, v->rec.id);
        if (v->dir) /* only our files live there; after the writes into it still queued */
                (void) manager_remove_tree(v->manager, v->dir);
}

int vm_random_hex(char *buf, size_t bytes) {
        uint8_t rnd[32];

        assert(bytes <= sizeof(rnd));
        if (getrandom(rnd, bytes, 0) != (ssize_t) bytes)
                return -EIO;
        for (size_t i = 0; i < bytes; i++)
                snprintf(buf + 2 * i, 3, "%02x", rnd[i]);
        return 0;
}

/* An ed25519 pair: the private key in OpenSSH's format (0600), which ssh and libssh both read, and
 * the public line "ssh-ed25519 <base64> <comment>". */
static int make_ssh_key(Manager *m, const char *path, const char *comment, char **ret_public) {
        ssh_key key = NULL;
        char *priv = NULL, *pub = NULL, *line = NULL;
        int r = -EIO;

        if (ssh_pki_generate(SSH_KEYTYPE_ED25519, 0, &key) != SSH_OK)
                return -EIO;
        if (ssh_pki_export_privkey_base64(key, NULL, NULL, NULL, &priv) != SSH_OK ||
            ssh_pki_export_pubkey_base64(key, &pub) != SSH_OK)
                goto finish;
        r = manager_write_file(m, path, priv, strlen(priv), 0600);
        if (r < 0)
                goto finish;
        if (asprintf(&line, "ssh-ed25519 %s %s", pub, comment) < 0) {
                r = -ENOMEM;
                goto finish;
        }
        *ret_public = line;
        r = 0;
finish:
        if (priv)
                explicit_bzero(priv, strlen(priv));
        ssh_string_free_char(priv);
        ssh_string_free_char(pub);
        ssh_key_free(key);
        return r;
}

static uint32_t allocate_cid(Manager *m) {
        uint32_t base = 3 + (fnv1a_32(manager_state_dir(m)) % (1U << 20));

        for (uint32_t cid = base;; cid = cid + 1 >= 0xFFFFFFFEU ? 3 : cid + 1) {
                bool used = false;
                for (size_t i = 0; i < manager_n_vms(m) && !used; i++)
                        used = manager_vm_at(m, i)->rec.cid == cid;
                if (!used)
                        return cid;
        }
}

void vm_provision_undo(VmProvision *p) {
        Vm *v = p->vm;

        if (!v || p->committed)
                return;
        assert(!v->volume_call); /* the undo runs from the acquire's outcome, never before it */
        if (p->registered) {
                /* whatever the steps got to: processes, port, lease, disk, directory, record */
                vm_kill(v);
                vm_release(v);
                manager_remove_vm(v->manager, v);
                manager_touch(v->manager);
        } else {
                if (p->disk) {
                        /* by its name: a provider that timed out may have made it all the same */
                        v->volume_fd = safe_close(v->volume_fd);
                        vm_delete_volume(v->manager, v->rec.id);
                }
                if (p->dir)
                        (void) manager_remove_tree(v->manager, v->dir);
        }
        *p = (VmProvision){};
}

int vm_provision_begin(VmProvision *p, Vm *v, VmVolumeFunc done, void *userdata, ApiError *reterr) {
        int r;

        assert(!p->vm);
        *p = (VmProvision){ .vm = v };

        r = mkdir_p(v->dir, 0700);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "creating %s: %s", v->dir, strerror(-r));
        p->dir = true;

        /* the disk: from the systemd storage provider where one answers, else a sparse file */
        r = vm_acquire_volume_async(v, VOLUME_NEW, done, userdata, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "disk of vm %s", v->rec.id);
                return r;
        }
        p->disk = true;
        return 0;
}

int vm_provision_finish(VmProvision *p, const char *user_data, Network *net, ApiError *reterr) {
        Vm *v = p->vm;
        _cleanup_free_ char *key_path = vm_path(v, "ssh_key"), *ud_path = vm_path(v, "user-data");
        Manager *m = v->manager;
        const NetworkLease *lease;
        char ip[INET_ADDRSTRLEN], mac[ETHER_ADDR_STRLEN];
        int r;

        assert(p->dir && p->disk && !p->registered);
        if (!key_path || !ud_path)
                return -ENOMEM;

        /* the CID and the first record, in the registry */
        v->rec.cid = allocate_cid(m);
        r = manager_add_vm(m, v);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_CONFLICT, "too many VMs");
        p->registered = true;
        (void) vm_save(v);

        /* the per-VM key, the user-data */
        r = make_ssh_key(m, key_path, "vm-manager", &v->rec.ssh_public_key);
        if (r >= 0) {
                char *withid = NULL;
                if (asprintf(&withid, "%s@%s", v->rec.ssh_public_key, v->rec.id) < 0)
                        r = -ENOMEM;
                else {
                        free(v->rec.ssh_public_key);
                        v->rec.ssh_public_key = withid;
                }
        }
        if (r >= 0 && user_data)
                r = manager_write_file(m, ud_path, user_data, strlen(user_data), 0600);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "provisioning vm %s: %s", v->rec.id, strerror(-r));

        /* the address */
        r = network_lease_acquire(manager_networks(m), net, v->rec.id, &lease, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "attach network");
                return r;
        }
        inet_ntop(AF_INET, &lease->ip, ip, sizeof(ip));
        v->rec.ip = strdup(ip);
        v->rec.mac = strdup(ether_addr_format(lease->mac, mac));
        if (!v->rec.ip || !v->rec.mac)
                return -ENOMEM;
        return 0;
}

void vm_provision_commit(VmProvision *p) {
        p->committed = true;
}
