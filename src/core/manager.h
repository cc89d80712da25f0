/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <systemd/sd-event.h>

#include "api-error.h"
#include "attest-nonce.h"
#include "caller.h"
#include "cleanup.h"
#include "host-probe.h"
#include "image-catalog.h"
#include "metrics-text.h"
#include "net-switch.h"
#include "network.h"
#include "storage.h"
#include "vm-unit.h"
#include "vm.h"
#include "worker.h"

/* The service behind both surfaces: it owns the records (networks, images, host facts, and the VMs
 * of later parts) and runs every operation. REST and MCP only translate to and from it. */

typedef enum VmLauncherKind {
        VM_LAUNCHER_AUTO,    /* systemd where a service manager is reachable, else process */
        VM_LAUNCHER_SYSTEMD, /* transient units; VMs survive the daemon */
        VM_LAUNCHER_PROCESS, /* plain children; VMs end with the daemon */
        _VM_LAUNCHER_MAX,
        _VM_LAUNCHER_INVALID = -EINVAL,
} VmLauncherKind;

const char *vm_launcher_to_string(VmLauncherKind k) _const_;
VmLauncherKind vm_launcher_from_string(const char *s) _pure_;

typedef enum AttestMode {
        ATTEST_MODE_VERIFY, /* quotes are verified against the image's policy */
        ATTEST_MODE_NOOP,   /* any quote echoing a fresh nonce passes: development only */
        _ATTEST_MODE_MAX,
        _ATTEST_MODE_INVALID = -EINVAL,
} AttestMode;

const char *attest_mode_to_string(AttestMode m) _const_;
AttestMode attest_mode_from_string(const char *s) _pure_;

typedef struct ManagerConfig {
        const char *state_dir;
        const char *image_dir;
        const char *default_network; /* created at start-up when missing */
        const char *network_subnet;  /* its CIDR */
        const char *ovmf_code;
        const char *ovmf_vars;
        HostAccel accel;
        HostNotify vsock;
        AttestMode attestation;
        bool attestation_learn_golden;
        usec_t install_timeout;
        usec_t boot_timeout;
        usec_t stop_timeout;
        usec_t qmp_timeout;   /* QEMU spawned to QMP answering; 0: 30 s */
        uint32_t notify_port; /* 0: the port recorded in the state dir, else a new one */
        VmLauncherKind launcher;
        bool detach_vms_on_exit;
        size_t guest_series_limit; /* series kept per VM from a guest report; 0: the default */
        /* the build, for get_info */
        const char *version;
        const char *commit;
        const char *built;
} ManagerConfig;

typedef struct Manager {
        sd_event *event;
        char *state_dir;
        char *image_dir;
        char *version, *commit, *built;
        NetworkRegistry *networks;
        ImageCatalog *images;
        HostProbe *host;

        /* VMs, oldest first */
        Vm **vms;
        size_t n_vms;
        char *ovmf_code, *ovmf_vars;
        usec_t install_timeout, boot_timeout, stop_timeout, qmp_timeout;
        uint32_t notify_port;
        /* attestation: the mode, learn mode, and the nonces handed to guests */
        AttestMode attestation;
        bool learn_golden;
        AttestNonceStore *nonces;

        /* the AF_VSOCK listener for guests on the kernel's vhost-vsock, opened on first use */
        int vsock_fd;
        sd_event_source *vsock_source;
        VmUnitManager *units; /* the systemd launcher's connection; NULL: plain children */
        Storage *storage;     /* where VM disks come from */
        bool detach_vms_on_exit;
        bool shutting_down;
        bool detaching; /* shutting down with VMs left running */

        /* the metadata server, set by the daemon: takes a connection a VM's guest opened to the IMDS */
        void (*imds_accept)(void *userdata, Vm *v, int fd);
        void *imds_userdata;

        /* the data plane: one switch per network record, in no particular order */
        struct ManagerSwitch {
                char *name;
                NetSwitch *sw;
        } * switches;
        size_t n_switches;

        /* metrics: durations observed since start-up, and the cap on a guest report's series */
        MetricsHistogram install_seconds, boot_to_ready_seconds;
        size_t guest_series_limit;
        size_t metrics_size_hint; /* bytes of the last exposition */
        Worker *report_worker;    /* parses and stores guest reports off the loop; made on first use */

        /* VM records that did not load at start-up, set aside in <state>/quarantine/<id>: get_host
         * lists them, delete_vm of their id removes them with their disk and lease. */
        struct ManagerQuarantine {
                char *id, *path, *reason;
        } * quarantine;
        size_t n_quarantine;

        /* Bumped on every change to a record, so that surfaces can cache what they rendered. */
        uint64_t generation;

        /* Who asked for the operation running now (borrowed): set by operation_run() and
         * operation_run_async() for the handler's duration; NULL when anonymous (no --enable-oauth).
         * create_vm records it as the VM's createdBy. */
        const Caller *caller;
} Manager;

/* Loads the state directory (networks and leases), scans the image directory (and watches it),
 * probes the host, and ensures the default network. */
int manager_new(Manager **ret, sd_event *event, const ManagerConfig *cfg, ApiError *reterr);
Manager *manager_free(Manager *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Manager *, manager_free);

static inline void manager_touch(Manager *m) {
        m->generation++;
}

/* The Prometheus exposition of every host and guest family (GET /metrics); *ret is malloc'd. */
int manager_metrics_text(Manager *m, char **ret, size_t *ret_size);

/* The name of the VM holding a lease, for messages; NULL when unknown. */
const char *manager_vm_name(const char *vm_id, void *userdata);

#define MANAGER_VMS_MAX 1024U

/* The switch of a network record: started when the network is loaded or created, stopped when it is
 * deleted. */
int manager_switch_start(Manager *m, const Network *n);
void manager_switch_stop(Manager *m, const char *name);
NetSwitch *manager_switch_get(Manager *m, const char *name);

Vm *manager_find_vm(Manager *m, const char *id);
Vm *manager_find_vm_by_name(Manager *m, const char *name);
/* A quarantined record (see Manager.quarantine), NULL when id is none. */
const struct ManagerQuarantine *manager_find_quarantined(Manager *m, const char *id);
int manager_add_vm(Manager *m, Vm *v);     /* takes a reference */
void manager_remove_vm(Manager *m, Vm *v); /* drops the manager's reference */
