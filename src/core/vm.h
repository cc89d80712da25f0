/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A VM, as the operations, the metadata service and the manager see it: opaque, with accessors and
 * the operations that change it. Its inside is vm-internal.h's, for the rooms of vm.c only. */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "api-error.h"
#include "caller.h"
#include "cleanup.h"
#include "core-forward.h"
#include "metrics-guest.h"
#include "process-util.h"
#include "time-util.h"
#include "vm-balloon.h"
#include "vm-record.h"
#include "vm-spec.h"
#include "vm-state.h"

/* Progress of an operation: a sentence such as "vm 1a2b3c4d is installing", per state change. */
typedef void (*VmProgressFunc)(const char *message, void *userdata);

/* Completion of an asynchronous VM operation: r < 0 with e set, or the VM record JSON. */
typedef void (*VmDoneFunc)(int r, json_t *record, const ApiError *e, void *userdata);

Vm *vm_ref(Vm *v);
Vm *vm_unref(Vm *v);
DEFINE_TRIVIAL_CLEANUP_FUNC(Vm *, vm_unref);

/* ---- what a VM is (borrowed) ---- */

const char *vm_id(Vm *v);
const char *vm_name(Vm *v);
const char *vm_network(Vm *v);
const VmSpec *vm_spec(Vm *v);
const char *vm_ssh_public_key(Vm *v);
const char *vm_ip(Vm *v); /* the lease, NULL while it has none */
Manager *vm_manager(Vm *v);
VmState vm_state(Vm *v);
usec_t vm_created_at(Vm *v);
/* When the VM was created, installed, last booted (installed boot) and last became ready;
 * CLOCK_REALTIME, 0 = not yet. */
void vm_times(Vm *v, usec_t *ret_created, usec_t *ret_installed, usec_t *ret_booted, usec_t *ret_ready);
/* QEMU runs, or its start chain does. */
bool vm_has_process(Vm *v);
/* The QEMU main PID while a process runs, else 0. */
pid_t vm_qemu_pid(Vm *v);
/* The size of the VM's open volume, else its diskGiB in bytes. */
uint64_t vm_disk_bytes(Vm *v);
/* A file of the VM's directory; NULL on OOM. */
char *vm_path(Vm *v, const char *name);
/* The systemd unit of one of the VM's processes under the systemd launcher,
 * vm-manager-<id>-<role>.service (role: qemu, swtpm, vsock); NULL on OOM. */
char *vm_process_unit(Vm *v, const char *role);
/* The record as the API shows it (camelCase, the reference's key order); a new reference. */
json_t *vm_to_json(Vm *v);

/* The console tail: the last lines (1..VM_CONSOLE_LINES_MAX, 0 for the default) of console.log,
 * from its final 64 KiB. */
#define VM_CONSOLE_LINES_DEFAULT 100
#define VM_CONSOLE_LINES_MAX 10000
int vm_console_json(Vm *v, int64_t lines, json_t **ret, ApiError *reterr);
/* console.log opened for reading (non-blocking), with its size and inode now: a new run of QEMU
 * truncates or replaces it. The fd, or -ENOENT before QEMU first ran, or another negative errno. */
int vm_console_open(Vm *v, uint64_t *ret_size, uint64_t *ret_ino);

/* ---- the operations (vm-ops.c) ---- */

/* create_vm: from the request decoded and checked by the operation table (its strings are taken out
 * of in), resolves the image once, allocates and provisions, starts the installer, and calls done at
 * the milestone. caller (borrowed, NULL: anonymous) is recorded as createdBy. progress (optional)
 * hears every state change until then. */
int vm_create(
        Manager *m,
        VmSpecInput *in,
        const Caller *caller,
        VmDoneFunc done,
        VmProgressFunc progress,
        void *userdata,
        ApiError *reterr);
int vm_start(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr);
int vm_stop(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr);
int vm_reboot(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr);
int vm_delete(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr);

/* Where v stands against create_vm's milestone: what a waiter for it would be answered now. A task
 * that outlived the daemon which ran its create judges the VM with it (task.c). */
VmWaitVerdict vm_wait_verdict(Vm *v, VmWaitFor milestone);

/* Reports v's state changes to progress until the operation whose userdata this is completes. */
int vm_observe(Vm *v, VmProgressFunc progress, void *userdata);
void vm_unobserve(Vm *v, void *userdata);

/* ---- the guest (vm-attest.c, vm-net.c, vm-exec.c, vm-report.c, vm-metrics.c) ---- */

/* Whether the IMDS serves user-data: a verified initrd quote, or at boot when no attestation is
 * required. */
bool vm_user_data_released(Vm *v);
/* get_vm_attestation: the attestation of the current installed boot (api-contract §5.5). */
json_t *vm_attestation_to_json(Vm *v);
/* The attestation of the current boot as one word: disabled, released, failed or pending. */
const char *vm_attestation_word(Vm *v);
/* GET /attest/nonce of the IMDS: a fresh nonce for the guest (64 hex). The first of a boot is recorded
 * and moves a VM that must attest from booting to attesting. */
int vm_attest_nonce(Vm *v, char ret[static 65]);
/* The verdict on a quote the guest posted. */
typedef enum VmQuoteVerdict {
        VM_QUOTE_VERIFIED,
        VM_QUOTE_REJECTED,
        _VM_QUOTE_VERDICT_MAX,
        _VM_QUOTE_VERDICT_INVALID = -EINVAL,
} VmQuoteVerdict;
const char *vm_quote_verdict_to_string(VmQuoteVerdict v) _const_;
VmQuoteVerdict vm_quote_verdict_from_string(const char *s) _pure_;
/* A quote the guest posted to the IMDS (body: the bytes it sent), decoded, judged against the policy
 * of the VM's image and recorded as its stage's verdict. Returns the verdict, with *ret the
 * QuoteResult to give the guest either way. Fails without recording a verdict: with invalid_request
 * when the body does not decode (reterr's message, "malformed quote: …" or "invalid request: …", is
 * the text the guest is told), otherwise with internal_error when the quote cannot be judged (only
 * "quote not processed" is the guest's to know). */
int vm_attest_quote(Vm *v, const void *body, size_t size, json_t **ret, ApiError *reterr);
/* Whether a quote of v must wait before it is judged: while the firmware run for v's shape (memory
 * size, CPU count) is queued or going, the verdict would only be "still going", and the guest's agent
 * does not quote again on a verdict; so the IMDS holds the quote's answer until the run ended or its
 * time limit passed, then judges it with waited true (a run still going then is a final verdict).
 * 1 with *ret (done follows once, unless *ret is freed first), 0 when there is nothing to wait for.
 * A shape no run was made for gets its run now. */
int vm_attest_quote_wait(Vm *v, FirmwareWaitDone done, void *userdata, FirmwareWait **ret);
/* Cancels a wait vm_attest_quote_wait() made (done is then not called). Returns NULL. */
FirmwareWait *vm_attest_quote_wait_free(FirmwareWait *w);
/* The credential activation (docs/design.md, Attestation), which binds the guest's attestation key
 * to the EK this VM's vTPM was certified with before any quote of that key counts.
 *
 * POST /attest/challenge: the body is {"ak_pub","ek_pub"}. The EK must be the certified one and the
 * AK a restricted signing key; its name is computed here. A credential is made for it with a fresh
 * secret, kept (replacing an earlier challenge), and *ret is {"credential_blob","encrypted_secret"}.
 * Fails, reterr's message being the guest's answer, with -EBADMSG, -EINVAL or -EFBIG (a body that
 * does not decode), -EPERM (a foreign EK, also recorded as the VM's ekCertificate verdict; an EK or
 * AK that is refused; another AK already activated), -EOPNOTSUPP (the vTPM has no EK certificate:
 * nothing to activate against), or another errno (only "challenge not made" is the guest's).
 *
 * POST /attest/activate: the body is {"secret"}, what TPM2_ActivateCredential gave the guest. It is
 * compared in constant time with the outstanding challenge's, which is used up either way; equal,
 * the challenge's AK is the VM's activated one (vm.json's "akActivated") and *ret is {"activated":
 * true,"ak_fingerprint"}. Fails with -ESTALE (no challenge outstanding, or it expired), -EPERM
 * (another secret), the decoder's errors as above, or -ENOMEM. */
#define VM_CHALLENGE_LIFETIME (5 * USEC_PER_MINUTE)
int vm_attest_challenge(Vm *v, const void *body, size_t size, json_t **ret, ApiError *reterr);
int vm_attest_activate(Vm *v, const void *body, size_t size, json_t **ret, ApiError *reterr);
/* POST /bootstrap/failed of the IMDS: a unit of the user-data's bootstrap (kubeadm.service) failed
 * before the VM was ready; the body is the unit's last journal lines. The boot fails with them in
 * lastError (printable text, at most VM_BOOTSTRAP_REPORT_MAX bytes of the body). -ESTALE when the VM
 * is past that point (ready, stopping, not booting). */
#define VM_BOOTSTRAP_REPORT_MAX 4096
int vm_bootstrap_failed(Vm *v, const void *body, size_t size);

/* forward_port: a listener on 127.0.0.1 whose connections reach the guest's port, until the VM is
 * deleted. {"id","port","address"}; the same forward again for a port forwarded already. port is
 * 1..65535, as forward_port's parameter declares. */
int vm_forward_port(Vm *v, int64_t port, json_t **ret, ApiError *reterr);

/* exec_vm: runs command (argv) in the guest as root over ssh with the VM's own key, the guest's host
 * key pinned on first use, with input (NULL: none) as its stdin, then end of file. Output beyond
 * VM_EXEC_OUTPUT_MAX per stream is dropped (and flagged), and a command still running after timeout is
 * abandoned with a timeout error. done gets
 * {"stdout","stderr","exitCode"} (a non-zero exit is a result). */
#define VM_EXEC_OUTPUT_MAX ((size_t) 1 << 20)
#define VM_EXEC_TIMEOUT_DEFAULT (300 * USEC_PER_SEC)
#define VM_EXEC_TIMEOUT_MAX (3600 * USEC_PER_SEC)
#define VM_EXEC_HANDSHAKE_TIMEOUT_SEC 15
int vm_exec(
        Vm *v, char **command, const char *input, usec_t timeout, VmDoneFunc done, void *userdata, ApiError *reterr);

/* vm shell: an interactive root shell in a pty, over the same ssh path as exec_vm, for a client
 * connection (an upgraded HTTP connection) that speaks the frames of shell-frame.h. The session is the
 * helper's (vm-exec-helper.h): the loop hands it the connection and watches it exit, nothing else.
 * vm_shell_check() refuses what cannot take one: a VM not running (-ESRCH, conflict), without its ssh
 * key (-ENOKEY, conflict). vm_shell_start() takes fd whatever happens and calls done once the helper
 * exited; *ret is the caller's, and vm_shell_free() kills a helper still running (done not called). */
typedef struct VmShell VmShell;
typedef void (*VmShellDoneFunc)(VmShell *s, void *userdata);
int vm_shell_check(Vm *v, ApiError *reterr);
int vm_shell_start(Vm *v, int fd, VmShellDoneFunc done, void *userdata, VmShell **ret, ApiError *reterr);
VmShell *vm_shell_free(VmShell *s);
/* Ends the session from the server's side (the VM is stopping or gone): the helper tells the client in
 * an ERROR frame and exits, and done is called as for any end. */
int vm_shell_end(VmShell *s);

/* The guest's systemd-report uploads (IMDS POST /report). The raw bytes are kept in <vm>/report.json
 * (written atomically, loaded again at start-up); the mapped series live in memory. */
typedef struct VmGuest {
        GuestReport *report;               /* the last upload that was a report: what /metrics exports */
        bool has_upload;                   /* report.json exists */
        bool last_is_report;               /* the last upload parsed as a report */
        usec_t received_at;                /* CLOCK_REALTIME of the last upload */
        uint64_t uploads;                  /* since the daemon started */
        uint64_t dropped[_GUEST_DROP_MAX]; /* series dropped, summed over uploads */
        bool uploading;                    /* an upload is being parsed and stored */
        bool loading;                      /* the stored report waits to be mapped again (start-up) */
        bool load_running;                 /* ... and is being mapped */
} VmGuest;

const VmGuest *vm_guest(Vm *v);
void vm_guest_done(VmGuest *g);
/* Called on the loop once an upload is stored and mapped (r >= 0) or refused: problems of the upload
 * itself (not JSON, too deep, too large) are invalid_request errors and change nothing; valid JSON that is
 * not a report is stored and not exported. e is borrowed. */
typedef void (*VmReportDone)(int r, const ApiError *e, void *userdata);
/* Takes a copy of an upload, parsed, stored and mapped off the loop; done follows exactly once, always
 * after this returned 0. Refused at once, without done, as conflicts: -EBUSY while an upload of this
 * VM is in flight, -EAGAIN while VM_REPORT_UPLOADS_MAX of all VMs are. */
int vm_report_upload(Vm *v, const void *body, size_t size, VmReportDone done, void *userdata, ApiError *reterr);
/* Whether vm_report_upload() would refuse an upload of size bytes now, with its errors: lets the
 * caller refuse before receiving the body. 0 when it would take it (as far as can be told before). */
int vm_report_upload_check(Vm *v, uint64_t size, ApiError *reterr);
#define VM_REPORT_UPLOADS_MAX 4U
/* At start-up: the upload a previous daemon stored, mapped again off the loop (its file time is the
 * receive time). An upload that arrives first wins. */
void vm_report_load(Vm *v);
/* GET /vms/{id}/report: the stored upload, to be sent as it is (a file of 8 MiB is not parsed on the
 * loop): a new fd and its size. -EMEDIUMTYPE when it is not known to be JSON: vm_report_json() then. */
int vm_report_open(Vm *v, int *ret_fd, uint64_t *ret_size, ApiError *reterr);
/* ... the last upload re-encoded (a JSON string when it is not JSON); not_found when there is none. */
int vm_report_json(Vm *v, json_t **ret, ApiError *reterr);
/* get_vm_metrics: the host's view of the VM and a summary of its last report (api-contract §5.10). */
int vm_metrics_json(Vm *v, json_t **ret, ApiError *reterr);
/* The memory of one process of the VM's current run (QEMU, swtpm, vhost-device-vsock), from its
 * smaps_rollup as a worker thread last read it (at most 10 s ago; each call may ask for a new
 * reading): -ESRCH when the run has no such process, -ENODATA before the first reading of it. */
int vm_process_memory(Vm *v, VmRole role, pid_t *ret_pid, ProcMemory *ret);
/* The balloon statistics QEMU last gave for the current run (borrowed; false when there are none),
 * and QEMU asked again for the next reader (vm_balloon_refresh()). */
bool vm_balloon_stats(Vm *v, const VmBalloonStats **ret);

/* ---- for the manager: start-up, shutdown, and what it holds for every VM ---- */

/* Loads every <state>/vms/<id>/vm.json (vm-load.c): VMs whose processes are gone become stopped with
 * a note; creating becomes failed, deleting is finished; records that do not load are quarantined. */
int vm_load_all(Manager *m, ApiError *reterr);
/* delete_vm of a record that did not load (manager_find_quarantined()): its directory, disk and
 * leases go. {"id","deleted":true}; not_found when id is not quarantined. */
int vm_delete_quarantined(Manager *m, const char *id, json_t **ret, ApiError *reterr);

/* Shutdown leaving the VMs running (systemd launcher; manager_shutdown() decides): their records keep
 * what the next daemon needs to attach, and freeing the manager afterwards forgets the units without
 * stopping them. */
void vm_detach_all(Manager *m);
/* The daemon exits without waiting (a second SIGTERM): the operations still waiting for a VM are
 * answered "vm-manager is shutting down" (conflict) before the servers and VMs are freed. */
void vm_abandon_all(Manager *m);
/* Stops every VM (shutdown); calls done when all have exited. */
void vm_stop_all(Manager *m, void (*done)(void *userdata), void *userdata);

/* The READY=1 listener on the kernel's vhost-vsock (one AF_VSOCK port for all guests), opened when
 * the first VM needs it. */
int vm_notify_new(VmNotify **ret, Manager *m);
VmNotify *vm_notify_free(VmNotify *n);
/* The worker guest reports are parsed and stored on. Freeing it ends the queued jobs (their done
 * callbacks hear they did not run), so it goes before the VMs. */
int vm_reports_new(VmReports **ret);
VmReports *vm_reports_free(VmReports *q);
