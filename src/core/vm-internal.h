/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The inside of a VM, shared by vm.c and its rooms (vm-*.c) and by nothing else:
 *
 *   vm.c           the object, its accessors, vm_set_state() (the one place a transition of
 *                  src/vm/vm-state.c is applied), the record on disk, the console
 *   vm-spec.c      request -> spec (pure)            vm-record.c   vm.json both ways (pure)
 *   vm-provision.c key, user-data, disk, lease, CID: acquired for create_vm, undone on failure
 *   vm-install.c   the host install: the disk laid out by a helper process before the first boot
 *   vm-start.c     the start chain: swtpm, vhost-device-vsock, QEMU, its monitor
 *   vm-stop.c      the stop escalation, QEMU's end, the processes torn down or left running
 *   vm-notify.c    READY=1: the per-VM socket, the AF_VSOCK listener the manager holds, the message
 *   vm-net.c       the switch port, the metadata listener, forwards
 *   vm-wait.c      waiters (operations that wait for the lifecycle), deadlines, progress observers
 *   vm-load.c      start-up: records loaded, units reattached, quarantine, what crashes left
 *   vm-ops.c       the operations: create, start, stop, reboot, delete, and shutdown
 *   vm-attest.c    nonces and quotes, the verdicts as events
 *   vm-exec.c      exec_vm         vm-report.c guest reports      vm-metrics.c get_vm_metrics
 *
 * Rooms include this header; everything else sees vm.h. The Manager is reached through manager.h's
 * accessors only. */

#include <systemd/sd-event.h>

#include "image-catalog.h"
#include "manager.h"
#include "net-switch.h"
#include "storage.h"
#include "vm-balloon.h"
#include "vm-launch.h"
#include "vm-qmp.h"
#include "vm-record.h"
#include "vm-state.h"
#include "vm.h"

typedef struct VmWaiter VmWaiter;
typedef struct VmObserver VmObserver;

/* The secret a credential was made with and the AK it was made for, until the guest answers. */
#define VM_CHALLENGE_SECRET_SIZE 32U
typedef struct VmChallenge {
        uint8_t secret[VM_CHALLENGE_SECRET_SIZE];
        char ak_fingerprint[65]; /* hex sha256 of the AK's TPMT_PUBLIC */
        usec_t issued;           /* CLOCK_MONOTONIC; 0 when none is outstanding */
} VmChallenge;

struct Vm {
        unsigned n_ref;
        Manager *manager;

        VmRecord rec; /* what vm.json keeps (vm-record.c) */
        char *dir;    /* <state>/vms/<id> */
        Image *image; /* rec.spec.image, a reference: resolved once by create_vm, or by the first
                       * vm_image() of a VM loaded from its record; NULL until then */

        /* the lifecycle beyond the record (vm.c) */
        VmSubState sub;
        char *fail_reason;       /* the verdict that ends the boot: lastError once QEMU is gone */
        char *guest_exit_status; /* EXIT_STATUS= from the guest's PID 1, for lastError */

        /* the disk (vm-provision.c) */
        int volume_fd;            /* the storage lease, held while the VM exists in this daemon */
        StorageCall *volume_call; /* its acquire in flight (create, or the first start after a restart) */

        /* the host install's helper (vm-install.c) */
        VmLaunched *installer;
        VmLaunched *tpm_setup; /* swtpm_setup manufacturing a new VM's vTPM, before its first swtpm */
        usec_t tpm_setup_started;
        usec_t install_started;         /* CLOCK_MONOTONIC */
        sd_event_source *install_timer; /* the install timeout: the helper killed, the VM failed */
        bool install_timed_out;

        /* the processes of the current run (vm-start.c, vm-stop.c) */
        VmLaunched *qemu, *swtpm, *vsockd;
        pid_t qemu_pid, swtpm_pid;
        QmpClient *qmp;
        sd_event_source *qmp_grace;   /* the monitor hung up before answering: the wait for QEMU's exit */
        sd_event_source *phase_timer; /* install or boot timeout, or the ready quote's grace */
        sd_event_source *probe_timer; /* the start chain: swtpm and vhost-device-vsock readiness */
        sd_event_source *swtpm_probe; /* ... one connection to swtpm's control channel, its answer */
        usec_t swtpm_probe_started;
        sd_event_source *stop_timer;    /* the stop escalation */
        sd_event_source *console_watch; /* the panic watch until readiness (vm-console-watch.c) */
        uint64_t console_offset;        /* ... how much of console.log it has looked at */
        usec_t probe_deadline;
        bool swtpm_up;
        bool helpers_prestarted; /* swtpm and vhost-device-vsock spawned beside the host install */
        bool qemu_prestarted;    /* QEMU spawned paused (-S) beside the host install: cont starts it */
        bool qemu_paused;        /* ... and its monitor answers */
        /* the firmware's variables copied into the VM's directory off the loop (file-writer.h): QEMU
         * waits for the copy; the copy's completion finds the VM through vars_copy, or nothing */
        struct VmVarsCopy *vars_copy;
        int vars_error; /* how the last copy ended: 0, or a negative errno the chain fails with */

        /* READY=1 over vhost-user (vm-notify.c) */
        int notify_fd;
        sd_event_source *notify_source;
        char *notify_path;

        /* the network (vm-net.c) */
        sd_event_source *imds_source; /* <vm>/imds.sock: whoever connects there is this VM */

        /* guest reports (vm-report.c) */
        VmGuest guest;

        /* the balloon's statistics of the current monitor (vm-metrics.c): asked of QEMU when a
         * reader of metrics comes, at most every VM_BALLOON_REFRESH, and kept for the next one */
        VmBalloonStats balloon;
        bool balloon_started; /* the polling interval was sent on this monitor */
        bool balloon_have;    /* balloon holds a reply of this monitor */
        bool balloon_pending; /* a qom-get of this monitor awaits its reply */
        usec_t balloon_asked; /* CLOCK_MONOTONIC, of the last qom-get */
        char *balloon_error;  /* QEMU's answer to the last failed command (no balloon device …) */

        /* the PSS of the run's processes (vm-metrics.c): smaps_rollup makes the kernel walk a
         * process's page tables (about 10 ms per GiB mapped), so a worker thread reads it when a
         * reader of metrics comes, at most every VM_MEMORY_REFRESH, and the figures wait here */
        ProcMemory mem[_VM_ROLE_MAX];
        pid_t mem_pid[_VM_ROLE_MAX]; /* whose figures mem holds; 0: none */
        bool mem_pending;
        usec_t mem_asked; /* CLOCK_MONOTONIC */

        /* the credential activation's outstanding challenge (vm-attest.c), in memory only: one per
         * VM, a new one replaces it, and any answer uses it up */
        VmChallenge challenge;

        /* operations waiting for the lifecycle, and who hears its progress (vm-wait.c) */
        VmWaiter *waiters;
        VmObserver *observers;
};

/* ---- vm.c ---- */

/* A VM not yet in the registry, its fds closed, no phase: create_vm and start-up fill it. */
Vm *vm_new(Manager *m);

/* What vm_state_next() decides on. */
VmStatus vm_status(Vm *v);

/* What an event brings: a start chain's or a verdict's text, QEMU's exit status, the errno a start
 * failure passes to its waiters. */
typedef struct VmEventArgs {
        int error;               /* START_FAILED: what the waiters get (-EIO when 0) */
        const char *detail;      /* VM_MESSAGE_DETAIL, a verdict's message, why a reattach failed */
        const char *exit_status; /* QEMU's, for the exit events */
        const char *stage;       /* of a quote: "initrd" or "ready" */
} VmEventArgs;

/* Applies the transition vm_state_next() gives for e: refused (a conflict with its message, nothing
 * changes), ignored, or the next state and sub-state with their side effects, in the order of
 * VmAction. Returns the refusal, or the failure of a spawn (the caller ends the start chain with
 * VM_EVENT_START_FAILED; what came before the spawn stays applied). a may be NULL. */
int vm_set_state(Vm *v, VmEvent e, const VmEventArgs *a, ApiError *reterr);
/* The refusal vm_set_state() would give, without applying anything. */
int vm_check_event(Vm *v, VmEvent e, ApiError *reterr);

/* A message of vm-state.c with what the VM knows filled in (the id, the state, the timeouts); a
 * new string, NULL on OOM. */
char *vm_message(Vm *v, VmMessage m, const VmMessageArgs *extra);

/* The record to disk; the generation bumped; waiters looked at. */
/* The copy of the firmware's variables running for v, if any, no longer reports to it. */
void vm_vars_copy_forget(Vm *v);
int vm_save(Vm *v);
void vm_changed(Vm *v);
/* lastError, and no console tail (a failure adds that after). */
void vm_set_error(Vm *v, const char *text);
/* The phase timer: the install or boot timeout, or the ready quote's grace. */
void vm_arm_phase_timer(Vm *v, usec_t timeout, usec_t accuracy);
/* The last max bytes of a file of the VM's directory, trailing blanks cut; "" when it cannot be read. */
char *vm_file_tail(Vm *v, const char *name, size_t max);

/* ---- vm-console-watch.c ---- */

/* The panic watch, from the start of console.log: once a second until the boot is ready, or the run
 * ends; a kernel panic line is VM_EVENT_GUEST_PANIC. */
void vm_console_watch_start(Vm *v);
void vm_console_watch_stop(Vm *v);

/* ---- vm-install.c ---- */

/* Whether the image's layout fits a disk of disk_gib (invalid_request when not); a layout that does
 * not parse passes here and fails the VM in the helper. */
/* The VM's image (borrowed from v): the one create_vm resolved, or for a VM loaded from its record the
 * catalog's image of exactly rec.spec.image, looked up once and kept. NULL when the catalog has none. */
const Image *vm_image(Vm *v);

int vm_host_install_check(Manager *m, const Image *img, uint64_t disk_gib, ApiError *reterr);
/* VM_ACTION_HOST_INSTALL: the helper started and watched, the install timeout armed; its end is an
 * event. */
int vm_host_install_start(Vm *v, ApiError *reterr);

/* ---- vm-provision.c ---- */

/* What vm_provision_begin() and vm_provision_finish() acquired for a new VM. Unless committed,
 * vm_provision_undo() gives all of it back (processes, port, lease, disk, directory) and takes the VM
 * out of the registry: create_vm's one unwind. */
struct VmProvision {
        Vm *vm;          /* borrowed */
        bool dir;        /* its directory was made */
        bool disk;       /* its disk was asked for (the undo deletes it by name) */
        bool registered; /* it is in the manager's registry, its first record written */
        bool committed;
};

/* The outcome of an acquire of the VM's disk, from the loop: on success the lease is the VM's already
 * (volume_fd, rec.volume); on failure e says why (the callee may take its contents). */
typedef void (*VmVolumeFunc)(Vm *v, int r, ApiError *e, void *userdata);

/* create_vm's provisioning comes in two steps around the disk, which the storage provider makes in its
 * own time while the loop goes on. begin: the directory, then the disk asked for (done follows from the
 * loop unless this fails). The VM is in no registry yet: a crash from here on leaves a directory without
 * a record, which the next start removes with the disk of its name (vm-load.c). */
int vm_provision_begin(VmProvision *p, Vm *v, VmVolumeFunc done, void *userdata, ApiError *reterr);
/* finish, once the disk is there: the CID, the registry and the first record, the per-VM ssh key, the
 * user-data, the network lease; on failure reterr says which, and p knows what to undo. */
int vm_provision_finish(VmProvision *p, const char *user_data, Network *net, ApiError *reterr);
void vm_provision_commit(VmProvision *p);
void vm_provision_undo(VmProvision *p);
/* bytes random bytes as 2 * bytes hex digits into buf (NUL-terminated). */
int vm_random_hex(char *buf, size_t bytes);

/* The disk volume "vm-<id>": created at create_vm (VOLUME_NEW), reopened by the first start after a
 * daemon restart (VOLUME_OPEN), on the loop: done gets the outcome. -EBUSY (conflict) while another
 * acquire of the VM's disk is in flight; vm_release() cancels one (done then gets -ECANCELED). The fd
 * is the lease. */
int vm_acquire_volume_async(Vm *v, VolumeCreate mode, VmVolumeFunc done, void *userdata, ApiError *reterr);
/* The same, waiting for it: only for start-up, before the loop serves (vm-load.c reattaching the VMs an
 * earlier daemon left running). */
int vm_acquire_volume(Vm *v, VolumeCreate mode, ApiError *reterr);
void vm_delete_volume(Manager *m, const char *id);
/* Everything the VM holds outside its process: the port, the nonces, the lease, the disk, the
 * directory. */
void vm_release(Vm *v);

/* ---- vm-start.c ---- */

/* VM_ACTION_SPAWN_HELPERS: swtpm and vhost-device-vsock side by side, probed until both answer. */
int vm_start_helpers(Vm *v, ApiError *reterr);
/* swtpm and vhost-device-vsock spawned early, beside the host install (they do not need the disk),
 * probed, and QEMU after them with its vCPUs stopped (-S): none of them reads the disk before cont.
 * The start chain that follows the install only probes the helpers and sends cont, unless something
 * of the prestart ended meanwhile (then that part starts again). */
int vm_prestart(Vm *v, ApiError *reterr);
/* The prestarted QEMU ended, or its monitor did not answer: it goes, and the chain after the install
 * starts one of its own. */
void vm_prestart_drop_qemu(Vm *v, const char *why);
/* The helpers' readiness probe ends: its timer, and a question to swtpm awaiting its answer. */
void vm_probe_stop(Vm *v);
/* VM_ACTION_SPAWN_QEMU: the READY=1 socket, QEMU, its monitor (or cont for a prestarted QEMU). */
int vm_start_qemu(Vm *v, ApiError *reterr);
/* How an exit of swtpm or vhost-device-vsock is taken, and QEMU's (vm-stop.c); a unit that did not
 * start (or that a restart could not attach to) comes the same way, with vm_launched_error(). */
void vm_on_helper_exit(VmLaunched *p, int code, int status, void *userdata);
void vm_qmp_on_event(QmpClient *c, const char *event, json_t *data, void *userdata);
void vm_qmp_on_disconnect(QmpClient *c, void *userdata);
/* QEMU's unit did not start, or a restart could not attach to it (vm_on_qemu_exit() with
 * vm_launched_error()): the start chain fails (VM_MESSAGE_QEMU_SPAWN), a prestarted QEMU is dropped,
 * or the reattach fails (VM_EVENT_REATTACH_FAILED). */
void vm_qemu_launch_failed(Vm *v, VmLaunched *p, int error);
/* A process runs (a unit's main process, or a plain child the spawner cloned): its pid recorded
 * (VmLaunchedStartedFunc of every process of a run). */
void vm_on_process_started(VmLaunched *l, void *userdata);
/* The probing of the start chain ends: its timer, a swtpm probe under way. */
void vm_probe_stop(Vm *v);

/* ---- vm-stop.c ---- */

/* VM_ACTION_KILL: every process of the run ended at once, the start chain's timers with them. */
void vm_kill(Vm *v);
/* VM_ACTION_TEARDOWN: what QEMU's end leaves: the monitor, the NIC, the READY=1 socket, timers; the
 * helpers are asked to go. */
void vm_teardown(Vm *v);
/* The daemon goes, the VM stays: the units are forgotten (they keep running), our ends closed. */
void vm_detach_processes(Vm *v);
/* VM_ACTION_POWERDOWN, VM_ACTION_SIGTERM, VM_ACTION_SIGKILL. */
void vm_powerdown(Vm *v);
void vm_signal(Vm *v, int sig);
void vm_on_qemu_exit(VmLaunched *p, int code, int status, void *userdata);
/* Closes the QMP connection, detached from v first: closing calls the client's callbacks (a
 * pending readiness one among them), which must find it is no longer ours. */
void vm_qmp_drop(Vm *v);

/* ---- vm-notify.c ---- */

/* The transport of the VM's next run: the host's choice; a kernel vhost-vsock whose listener cannot
 * be opened leaves the VM without READY=1 rather than without a start. */
VmVsock vm_notify_pick(Vm *v);
/* Listens on <vm>/vsock_<port> (vhost-user: vhost-device-vsock hands the guest's connection there). */
int vm_notify_listen(Vm *v);
/* Listens again after a restart, as the recorded transport wants. */
int vm_notify_listen_again(Vm *v);
void vm_notify_close(Vm *v);
/* A listener that cannot accept stays readable: paced so that it never runs the loop hot. */
int vm_listener_ratelimit(sd_event_source *s);

/* ---- vm-net.c ---- */

/* The VM's port on its network's switch; added (unconnected) on first use when create is set. NULL
 * when the VM holds no lease or the network has no switch. */
NetPort *vm_port(Vm *v, bool create);

/* VM_ACTION_LINK: the switch dials QEMU's NIC; the metadata listener stands. */
void vm_net_attach(Vm *v);
/* The NIC unlinked (QEMU gone), or the port removed with the metadata listener (remove). */
void vm_net_detach(Vm *v, bool remove);
/* At start-up, once the VM is loaded: its forwards listen again (on a new port, logged, recorded,
 * when another process took one meanwhile). */
void vm_forwards_restore(Vm *v);

/* ---- vm-wait.c ---- */

typedef enum VmWaiterKind {
        VM_WAITER_STARTED,   /* the current start chain finished */
        VM_WAITER_MILESTONE, /* create_vm's wait_for */
        VM_WAITER_STOPPED,   /* the process is gone */
} VmWaiterKind;

VmWaiter *vm_waiter_add(Vm *v, VmWaiterKind kind, VmDoneFunc done, void *userdata);
void vm_waiter_drop(Vm *v, VmWaiter *w);
/* MILESTONE: which one, and the deadline after which the waiter hears a timeout. */
int vm_waiter_set_milestone(Vm *v, VmWaiter *w, VmWaitFor milestone, usec_t timeout);
/* STOPPED: once done, the VM is started again and the start's end answers (reboot). */
void vm_waiter_then_start(VmWaiter *w);
/* Settles the waiters the VM's state decides: milestones reached or failed, stops finished. */
void vm_waiters_check(Vm *v);
/* VM_ACTION_FINISH_START: the start chain's waiters hear how it ended (r < 0: e). */
void vm_waiters_finish_start(Vm *v, int r, const ApiError *e);
/* The daemon exits at once: every waiter hears e now, while its owner (a request, a shutdown's
 * stop of all VMs) can still answer and free what it holds. */
void vm_waiters_abandon(Vm *v, const ApiError *e);
void vm_waiters_free(Vm *v);
/* Tells the observers "vm <id> is <state>". */
void vm_observers_notify(Vm *v);
void vm_observers_free(Vm *v);

/* ---- vm-attest.c ---- */

/* A VM that must attest is verified against its image's policy, which needs every golden value
 * unless learn mode records them: create_vm is refused before anything is allocated when they are
 * missing, with the way to record them. */
int vm_attest_check_image(Manager *m, const Image *img, const VmSpec *spec, ApiError *reterr);
/* The verdict that explains a boot's end, when the VM had to attest and a quote of this boot was
 * rejected: "initrd attestation rejected: ..."; NULL otherwise. */
char *vm_attest_boot_rejection(Vm *v);
/* The attestation of a new installed boot starts afresh. */
void vm_attest_reset(Vm *v);
VmGate vm_attest_gate(Vm *v);

/* ---- vm-metrics.c ---- */

/* A monitor of a new run answers: the guest is asked for balloon statistics every
 * VM_BALLOON_POLL_SECONDS from now on (qom-set, not waited for). */
void vm_balloon_start(Vm *v);
/* The monitor goes: what it said is forgotten. */
void vm_balloon_forget(Vm *v);
/* A reader of metrics comes: QEMU is asked for the statistics again unless a reply is pending or the
 * last question is younger than VM_BALLOON_REFRESH. The reply lands in v->balloon for the next reader. */
void vm_balloon_refresh(Vm *v);

/* ---- vm-load.c ---- */

int vm_cmp_created(const void *a, const void *b);
