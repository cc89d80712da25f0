/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The host install (install mode host): between vm_provision() and the first boot's start chain,
 * the VM's disk is laid out from the image's layout file by a helper process, the daemon's own
 * binary (the file it was started from, through the handle taken at start-up) as
 * `vm-manager host-install IMAGE LAYOUT DISK SIZE` (src/storage/host-install.c), whose
 * output goes to <vm>/install.log. The loop only watches it (a pidfd, through vm-launch): its exit
 * is VM_EVENT_HOST_INSTALLED, or VM_EVENT_HOST_INSTALL_FAILED with the last line it wrote. It runs
 * as a plain child, never a unit: it ends with the daemon, and a restart finds the VM creating,
 * fails it and drops its disk (VM_EVENT_RESTARTED). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "disk-layout.h"
#include "fs-util.h"
#include "image-catalog.h"
#include "log.h"
#include "parse-util.h"
#include "vm-internal.h"

/* The last line of what the helper wrote: its reason. */
static char *install_reason(Vm *v) {
        _cleanup_free_ char *tail = vm_file_tail(v, "install.log", 4096);
        char *nl, *line;

        if (!tail)
                return NULL;
        nl = strrchr(tail, '\n');
        line = nl ? nl + 1 : tail;
        if (startswith(line, "host-install: "))
                line += strlen("host-install: ");
        return strdup(line);
}

static void on_install_exit(VmLaunched *l, int code, int status, void *userdata) {
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *st = vm_exit_status_to_string(code, status), *reason = NULL, *text = NULL;
        char took[32];
        int r, error;

        if (l != v->installer)
                return;
        error = vm_launched_error(l);
        v->installer = vm_launched_free(v->installer);
        v->install_timer = sd_event_source_disable_unref(v->install_timer);
        format_duration(took, sizeof(took), now_usec(CLOCK_MONOTONIC) - v->install_started);

        if (code == CLD_EXITED && status == 0) {
                log_struct(
                        LOG_INFO,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "Host install of VM %s done in %s.",
                        v->rec.id,
                        took);
                r = vm_set_state(v, VM_EVENT_HOST_INSTALLED, NULL, &e);
                if (r < 0)
                        (void) vm_set_state(
                                v,
                                VM_EVENT_START_FAILED,
                                &(VmEventArgs){ .error = r,
                                                .detail = e.message ?: "failed to start the first boot" },
                                NULL);
                return;
        }
        if (error < 0) {
                /* the helper never ran: exec()'s errno, not an exit status 127 to guess from */
                text = vm_message(
                        v, VM_MESSAGE_HOST_INSTALL_SPAWN, &(VmMessageArgs){ .errno_text = strerror(-error) });
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "Host install of VM %s failed: %s",
                        v->rec.id,
                        text ?: "?");
                (void) vm_set_state(
                        v,
                        VM_EVENT_HOST_INSTALL_FAILED,
                        &(VmEventArgs){ .error = error, .detail = text ?: "cannot start the host install" },
                        NULL);
                return;
        }
        if (v->install_timed_out) {
                char limit[32];
                format_duration(limit, sizeof(limit), manager_settings(v->manager)->install_timeout);
                if (asprintf(&reason, "it did not finish within %s (the install timeout)", limit) < 0)
                        reason = NULL;
        } else
                reason = install_reason(v);
        text = vm_message(v, VM_MESSAGE_HOST_INSTALL, &(VmMessageArgs){ .exit_status = st, .detail = reason });
        log_struct(
                LOG_WARNING,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "Host install of VM %s failed after %s: %s",
                v->rec.id,
                took,
                text ?: "?");
        /* KILL ends a paused QEMU beside it before the disk goes: SIGKILL and reaped, or for a unit
         * KillUnit and StopUnit sent (the manager ends it moments later; nothing waits for it) */
        (void) vm_set_state(
                v,
                VM_EVENT_HOST_INSTALL_FAILED,
                &(VmEventArgs){ .error = -EIO, .detail = text ?: "host install failed" },
                NULL);
}

static int on_install_timeout(sd_event_source *s, usec_t usec, void *userdata) {
        Vm *v = userdata;

        v->install_timer = sd_event_source_disable_unref(v->install_timer);
        if (!v->installer)
                return 0;
        v->install_timed_out = true;
        (void) vm_launched_kill(v->installer, SIGKILL, /* whole_unit= */ false);
        return 0;
}

static int arm_install_timer(Vm *v) {
        v->install_timed_out = false;
        v->install_timer = sd_event_source_disable_unref(v->install_timer);
        return sd_event_add_time_relative(
                manager_event(v->manager),
                &v->install_timer,
                CLOCK_MONOTONIC,
                manager_settings(v->manager)->install_timeout,
                USEC_PER_SEC,
                on_install_timeout,
                v);
}

int vm_host_install_check(Manager *m, const Image *img, uint64_t disk_gib, ApiError *reterr) {
        _cleanup_free_ char *text = NULL;
        DiskLayout *l;
        size_t size;
        int r;

        assert(img->layout);
        /* a layout that does not even parse fails the VM in the helper, with its reason */
        r = read_full_file(img->layout, DISK_LAYOUT_SIZE_MAX, &text, &size);
        if (r < 0)
                return 0;
        l = calloc(1, sizeof(DiskLayout));
        if (!l)
                return -ENOMEM;
        r = disk_layout_parse(text, size, l, NULL);
        if (r >= 0 && disk_layout_min_size(l) > (disk_gib << 30)) {
                uint64_t need = (disk_layout_min_size(l) + (1ULL << 30) - 1) >> 30;
                free(l);
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "disk_gib %" PRIu64 " is too small for image %s: its layout needs at least %" PRIu64
                        " GiB",
                        disk_gib,
                        img->ref,
                        need);
        }
        free(l);
        return 0;
}

/* The file the IMDS serves for the VM's Kubernetes version (sysupdate/kubernetes/kubernetes_<v>.raw
 * of the image directory) and its place in var, where systemd-sysupdate would put it; 0 when the VM
 * has no version or the file is not there (the guest's own download then fails the same way). */
static int kubernetes_seed(Vm *v, char **ret_source, char **ret_path) {
        const char *ver = v->rec.spec.kubernetes_version;
        _cleanup_free_ char *source = NULL, *path = NULL;
        struct stat st;

        if (!ver || !*ver || strchr(ver, '/') || ver[0] == '.')
                return 0;
        if (asprintf(&source, "%s/sysupdate/kubernetes/kubernetes_%s.raw", manager_image_dir(v->manager), ver) <
            0) {
                source = NULL;
                return -ENOMEM;
        }
        if (lstat(source, &st) < 0 || !S_ISREG(st.st_mode))
                return 0;
        if (asprintf(&path, "lib/extensions/kubernetes_%s.raw", ver) < 0) {
                path = NULL;
                return -ENOMEM;
        }
        *ret_source = TAKE_PTR(source);
        *ret_path = TAKE_PTR(path);
        return 1;
}

int vm_host_install_start(Vm *v, ApiError *reterr) {
        const Image *img = vm_image(v);
        _cleanup_free_ char *log = vm_path(v, "install.log"), *text = NULL;
        int self_exe = manager_settings(v->manager)->self_exe_fd;
        char size[32];
        int r;

        if (!log)
                return -ENOMEM;
        if (!img || !img->layout)
                r = -ENOENT;
        else if (self_exe < 0)
                r = -EBADF;
        else {
                _cleanup_free_ char *seed = NULL, *seed_path = NULL;
                char *argv[] = { (char *) "vm-manager",
                                 (char *) "host-install",
                                 img->disk,
                                 img->layout,
                                 v->rec.volume,
                                 size,
                                 NULL,
                                 NULL,
                                 NULL };

                /* the Kubernetes sysext the guest would download from the IMDS on its first boot goes
                 * into var now: vm-kubernetes finds it there and only merges and measures it */
                if (kubernetes_seed(v, &seed, &seed_path) > 0) {
                        argv[6] = seed;
                        argv[7] = seed_path;
                }
                snprintf(size, sizeof(size), "%" PRIu64, v->rec.spec.disk_gib << 30);
                (void) unlink(log);
                v->installer = vm_launched_free(v->installer);
                v->install_started = now_usec(CLOCK_MONOTONIC);
                /* our own executable through the handle taken at start-up, never a path read back:
                 * a rebuild replaces the file at the path, and /proc/self/exe then names a deleted
                 * one; what keeps it from running comes back through on_install_exit(), with the
                 * errno of exec() */
                r = vm_launched_spawn(
                        &v->installer,
                        manager_spawner(v->manager),
                        /* units= */ NULL, /* a plain child: it ends with the daemon */
                        NULL,
                        &(VmProcessOptions){
                                .argv = argv,
                                .exec_fd = self_exe,
                                .log_file = log,
                                .working_dir = v->dir,
                        },
                        on_install_exit,
                        v);
        }
        if (r >= 0)
                r = arm_install_timer(v);
        if (r >= 0)
                /* what does not read the disk starts beside it, QEMU with its vCPUs stopped: create_vm
                 * answers once QEMU's monitor does, and the first boot's chain then only sends cont */
                return vm_prestart(v, reterr);
        text = vm_message(v, VM_MESSAGE_HOST_INSTALL_SPAWN, &(VmMessageArgs){ .errno_text = strerror(-r) });
        return api_error_set(reterr, r, API_ERROR_INTERNAL, "%s", text ?: "cannot start the host install");
}
