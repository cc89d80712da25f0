/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "api-error.h"
#include "attest-expect.h"
#include "caller.h"
#include "cleanup.h"
#include "core-forward.h"
#include "file-writer.h"
#include "host-probe.h"
#include "loop-watchdog.h"
#include "time-util.h"
#include "vm-state.h"

/* The service behind both surfaces: it owns the records (networks, images, host facts, VMs) and the
 * settings VMs run with. REST and MCP reach it through operation.h only; the VM rooms through the
 * accessors below. Opaque: its fields are manager.c's alone. */

typedef struct AttestNonceStore AttestNonceStore;
typedef struct ImageCatalog ImageCatalog;
typedef struct NetSwitch NetSwitch;
typedef struct Storage Storage;
typedef struct VmSpawner VmSpawner;
typedef struct VmUnitManager VmUnitManager;
typedef struct Worker Worker;

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
        bool firmware_run; /* --firmware-run: learn the firmware's PCRs 0-6 with firmware runs */
        usec_t install_timeout;
        usec_t boot_timeout;
        usec_t stop_timeout;
        usec_t qmp_timeout;           /* QEMU spawned to QMP answering; 0: 30 s */
        uint32_t tcg_tb_size_mib;     /* TCG's translation cache per VM; 0: QEMU's default (1 GiB) */
        usec_t guest_report_interval; /* the guest's report uploads (vm.report-interval); 0: once */
        uint32_t notify_port;         /* 0: the port recorded in the state dir, else a new one */
        VmLauncherKind launcher;
        VmInstallMode install_mode; /* create_vm's default; host falls back to boot per image */
        bool detach_vms_on_exit;
        size_t guest_series_limit; /* series kept per VM from a guest report; 0: the default */
        /* our own executable (O_PATH, taken at start-up), which the helpers of host installs and
         * exec_vm run: borrowed, for the manager's lifetime */
        int self_exe_fd;
        const LoopStats *loop_stats; /* the event loop's iterations, for /metrics (borrowed; may be NULL) */
        /* the build, for get_info */
        const char *version;
        const char *commit;
        const char *built;
} ManagerConfig;

/* Loads the state directory (networks and leases), scans the image directory (and watches it),
 * probes the host, loads the VMs (attaching to those still running), and ensures the default
 * network. */
int manager_new(Manager **ret, sd_event *event, const ManagerConfig *cfg, ApiError *reterr);
Manager *manager_free(Manager *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Manager *, manager_free);

/* ---- what VMs run with, fixed at start-up ---- */

struct ManagerSettings {
        const char *ovmf_code, *ovmf_vars;
        usec_t install_timeout, boot_timeout, stop_timeout, qmp_timeout;
        uint32_t notify_port; /* the vsock port guests send READY=1 to */
        uint32_t tcg_tb_size_mib;
        usec_t guest_report_interval;
        AttestMode attestation;
        bool learn_golden;
        size_t guest_series_limit;
        VmInstallMode install_mode; /* create_vm's default (--install-mode) */
        int self_exe_fd;            /* ManagerConfig's, -EBADF when it gave none */
};

const ManagerSettings *manager_settings(Manager *m);
/* The PCR 7 events of the OVMF variable store template, derived at start-up; NULL when the template
 * has Secure Boot keys or could not be read (PCR 7 then needs a golden value). Borrowed. */
const AttestExpectedPcr *manager_expected_pcr7(Manager *m);
/* A firmware run's PCR 7 events (up to its separator), as the run loads: when they differ from the
 * template's prediction in the SecureBoot event only (the form edk2 2025.02 measures, Debian 13),
 * the prediction takes the run's (attest_varstore_pcr7_adopt()), logged once. Without a prediction,
 * nothing. */
void manager_firmware_pcr7(Manager *m, const AttestExpectedPcr *run);
/* The firmware runs (manager-firmware.h): the expected PCR 0, 2, 3, 6 events per VM shape. */
FirmwareRuns *manager_firmware_runs(Manager *m);

/* ---- the registries and services it owns (borrowed) ---- */

sd_event *manager_event(Manager *m);
typedef struct AttestCa AttestCa;
AttestCa *manager_attest_ca(Manager *m);
const char *manager_state_dir(Manager *m);
const char *manager_image_dir(Manager *m);
NetworkRegistry *manager_networks(Manager *m);
ImageCatalog *manager_images(Manager *m);
HostProbe *manager_host(Manager *m);
Storage *manager_storage(Manager *m);
AttestNonceStore *manager_nonces(Manager *m);
VmUnitManager *manager_units(Manager *m); /* the systemd launcher's connection; NULL: plain children */
VmNotify *manager_notify(Manager *m);
VmReports *manager_reports(Manager *m);
/* The thread that clones plain children (vm-process.h). */
VmSpawner *manager_spawner(Manager *m);
/* The pool that parses exec_vm's results off the loop (vm-exec.c), made on first use. Borrowed. */
int manager_exec_worker(Manager *m, Worker **ret);
FileWriter *manager_writer(Manager *m);
/* The durable tasks (task.h), loaded after the VMs. */
TaskRegistry *manager_tasks(Manager *m);
ManagerMetrics *manager_metrics(Manager *m);
/* The event loop's iterations as the daemon measures them; NULL when it does not. */
const LoopStats *manager_loop_stats(Manager *m);
const char *manager_version(Manager *m);
const char *manager_commit(Manager *m);
const char *manager_built(Manager *m);

/* ---- records ---- */

/* Files are written off the loop, by one thread, in the order asked for (file-writer.h): a later
 * write of a path never overtakes an earlier one, and a removal comes after the writes before it.
 * manager_write_file() queues write_file_atomic(path, …); manager_remove_tree() queues rm_rf(path);
 * manager_unlink_file() queues unlink(path) (a VM's disk: freeing its blocks takes time);
 * a failure is logged when it happens. manager_sync() calls done once everything asked for before
 * is on disk (or failed and logged): an answer that reports a record waits for it. While
 * manager_new() runs (before the loop serves anything) files are written at once. */
int manager_write_file(Manager *m, const char *path, const void *data, size_t size, mode_t mode);
/* v (taken) rendered by json_dumps_pretty() and written as manager_write_file() writes, rendered on
 * the writer's thread too (file_writer_write_json()): -EFBIG past max bytes. */
int manager_write_json(Manager *m, const char *path, json_t *v, size_t max, mode_t mode);
int manager_remove_tree(Manager *m, const char *path);
int manager_unlink_file(Manager *m, const char *path);
int manager_sync(Manager *m, FileWriterDoneFunc done, void *userdata);

/* Bumped on every change to a record, so that surfaces can cache what they rendered. */
void manager_touch(Manager *m);
uint64_t manager_generation(Manager *m);

#define MANAGER_VMS_MAX 1024U

/* VMs, oldest first. */
size_t manager_n_vms(Manager *m);
Vm *manager_vm_at(Manager *m, size_t i);
#define MANAGER_FOREACH_VM(v, m, i) \
        for (size_t i = 0; i < manager_n_vms(m) && ((v) = manager_vm_at((m), i)); i++)
Vm *manager_find_vm(Manager *m, const char *id);
Vm *manager_find_vm_by_name(Manager *m, const char *name);
int manager_add_vm(Manager *m, Vm *v);     /* takes a reference; -E2BIG beyond MANAGER_VMS_MAX */
void manager_remove_vm(Manager *m, Vm *v); /* drops the manager's reference */
void manager_sort_vms(Manager *m, int (*cmp)(const void *a, const void *b));
/* Who hears of every VM, whichever operation moves it: MCP's resource subscriptions. A watcher is
 * called on the loop, inside the change (from vm_set_state(), manager_add_vm() or
 * manager_remove_vm()): it must not block, nor change the VM or the registry; it copies what it
 * needs and returns. At most MANAGER_VM_WATCHERS_MAX watchers (-E2BIG beyond). */
typedef enum ManagerVmEvent {
        MANAGER_VM_ADDED,   /* the VM entered the registry (a create, or loaded at start-up) */
        MANAGER_VM_STATE,   /* its state changed: vm_state() is the new one */
        MANAGER_VM_REMOVED, /* it left the registry (deleted, or a create that failed) */
        _MANAGER_VM_EVENT_MAX,
        _MANAGER_VM_EVENT_INVALID = -EINVAL,
} ManagerVmEvent;
typedef void (*ManagerVmWatchFunc)(Vm *v, ManagerVmEvent event, void *userdata);
#define MANAGER_VM_WATCHERS_MAX 8U
int manager_watch_vms(Manager *m, ManagerVmWatchFunc fn, void *userdata);
void manager_unwatch_vms(Manager *m, void *userdata);
/* Tells the watchers (vm.c calls it for state changes). */
void manager_vm_event(Manager *m, Vm *v, ManagerVmEvent event);

/* The name of the VM holding a lease, for messages; NULL when unknown. */
const char *manager_vm_name(const char *vm_id, void *userdata);

/* VM records that did not load at start-up, set aside in <state>/quarantine/<id>: get_host lists
 * them, delete_vm of their id removes them with their disk and lease. */
struct ManagerQuarantine {
        char *id, *path, *reason;
};

int manager_quarantine_add(Manager *m, const char *id, const char *path, const char *reason);
const ManagerQuarantine *manager_find_quarantined(Manager *m, const char *id);
void manager_quarantine_remove(Manager *m, const char *id);
/* [{"id","path","reason"}]; a new reference, NULL on OOM. */
json_t *manager_quarantine_to_json(Manager *m);

/* ---- networks (manager-network.c): the records and their switches ---- */

/* create_network: the record, then its switch; a switch that does not start takes the record
 * with it. ret is borrowed. */
int manager_create_network(Manager *m, const NetworkCreateArgs *args, Network **ret, ApiError *reterr);
/* delete_network: the record (refused while VMs hold leases), then its switch. */
int manager_delete_network(Manager *m, const char *name, ApiError *reterr);
/* The switch of a network record: started when the network is loaded or created, stopped when it is
 * deleted. */
int manager_switch_start(Manager *m, const Network *n);
int manager_switches_start(Manager *m, ApiError *reterr);
void manager_switch_stop(Manager *m, const char *name);
NetSwitch *manager_switch_get(Manager *m, const char *name);

/* ---- the metadata service ---- */

/* The daemon's IMDS takes the connections a VM's guest opens to 169.254.169.254 (fd is given away). */
typedef void (*ManagerImdsAccept)(void *userdata, Vm *v, int fd);
void manager_set_imds(Manager *m, ManagerImdsAccept accept, void *userdata);
/* Forgets the IMDS registered with userdata (another one stays). */
void manager_unset_imds(Manager *m, void *userdata);
/* Hands fd to the IMDS; false (fd untouched) when none is set. */
bool manager_imds_accept(Manager *m, Vm *v, int fd);

/* ---- metrics (manager-metrics.c) ---- */

int manager_metrics_new(ManagerMetrics **ret);
ManagerMetrics *manager_metrics_free(ManagerMetrics *mm);

/* Durations the exposition's histograms count. */
void manager_observe_install(Manager *m, usec_t duration);
void manager_observe_boot_to_ready(Manager *m, usec_t duration);
/* The Prometheus exposition of every host and guest family (GET /metrics); *ret is malloc'd. */
int manager_metrics_text(Manager *m, char **ret, size_t *ret_size);

/* ---- start-up and shutdown ---- */

bool manager_shutting_down(Manager *m);
/* Shutting down with VMs left running. */
bool manager_detaching(Manager *m);
/* While held (start-up), freeing the manager leaves the VMs of units running when
 * --detach-vms-on-exit asks for it: a failed start-up must not take them down. */
void manager_hold_vms(Manager *m, bool hold);
/* Shutdown: VMs in units stay for the next daemon when --detach-vms-on-exit asks for it (returns 0;
 * done is not called); otherwise every VM is stopped and done follows once all have exited
 * (returns 1; done may run before this returns). */
int manager_shutdown(Manager *m, void (*done)(void *userdata), void *userdata);
/* Exiting at once (a second signal): what still waits for a VM is answered "vm-manager is shutting
 * down" now, while the servers that carry the answers are still there. */
void manager_abandon(Manager *m);
