/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "attest-fwlog.h"
#include "cleanup.h"
#include "core-forward.h"
#include "time-util.h"

/* Firmware runs (issue 36, docs/design.md "Attestation"): what the host's OVMF measures into PCRs
 * 0-6 before any image runs, learned without booting an image, so that PCRs 0, 2, 3 and 6 need no
 * golden value.
 *
 * A run boots the OVMF code with a copy of the variable store template, a fresh swtpm and the
 * host's kernel with vm-manager-fwlog-init as its only userspace, on the machine a VM gets (q35,
 * tpm-crb, the accelerator and CPU model of this host, -m and -smp of the VM), and keeps the
 * events the firmware logged. PCR 0's PEI firmware volume digest changes with the memory size and
 * the CPU count (measured: -m 512 and -m 2048, -smp 1 and -smp 1,maxcpus=4 give three digests), so
 * a run is made per firmware hash, memory size, CPU count and accelerator, and its result is cached
 * in <state>/firmware/<sha256>-<MiB>m-<cpus>c-<accel>.json for every later start.
 *
 * The run itself is `vm-manager firmware-run` (hidden), a helper process the daemon starts through
 * the spawner and watches as a child event with a time limit; it blocks on its own swtpm and QEMU
 * and writes the cache entry atomically. One run at a time; the others queue. */

/* A run ends with SIGKILL after this long (three minutes; about 25-40 s under TCG here). */
#define FIRMWARE_RUN_TIMEOUT_SEC 180U
#define FIRMWARE_RUN_TIMEOUT_USEC (FIRMWARE_RUN_TIMEOUT_SEC * USEC_PER_SEC)
/* VM shapes kept in memory (known, failed, queued): create_vm's sizes are few in practice. */
#define FIRMWARE_RUNS_MAX 32U

/* enabled false: cached results are used, no run is started (--firmware-run=false). */
int firmware_runs_new(Manager *m, bool enabled, FirmwareRuns **ret);
FirmwareRuns *firmware_runs_free(FirmwareRuns *f);
DEFINE_TRIVIAL_CLEANUP_FUNC(FirmwareRuns *, firmware_runs_free);

/* The expected events for a VM of this shape (borrowed, valid until the next call), loaded from
 * the cache when known. Otherwise NULL, with *ret_why saying why (borrowed: "the firmware run for
 * 2048 MiB, 2 CPUs is still going (started 12 s ago)", "the firmware run for … failed: …", "firmware
 * runs are off (--firmware-run=false)"), *ret_pending true when a run is queued or going (start
 * queues one when none was made). */
const AttestFirmwareExpect *firmware_runs_lookup(
        FirmwareRuns *f, uint64_t memory_mib, unsigned cpus, bool start, const char **ret_why, bool *ret_pending);

/* A FirmwareWait is a wait for the run of one VM shape, owned by the waiter (firmware_wait_free()
 * cancels it). Its FirmwareWaitDone is called once, on the loop: 0 when the run ended (known or
 * failed: firmware_runs_lookup() says which), -ETIMEDOUT when FIRMWARE_RUN_TIMEOUT_USEC passed first
 * (the run is still queued or going). The callee may free the wait. */
/* Waits for the run of this shape to end, without blocking anything: 1 with *ret, and done follows
 * once unless *ret is freed first; 0 when no run of this shape is queued or going, so that there is
 * nothing to wait for (*ret untouched). The bound is the run's own limit: a queued run waits longer
 * only behind others, and a quote must not outwait its nonce (five minutes). */
int firmware_runs_wait(
        FirmwareRuns *f,
        uint64_t memory_mib,
        unsigned cpus,
        FirmwareWaitDone done,
        void *userdata,
        FirmwareWait **ret);
FirmwareWait *firmware_wait_free(FirmwareWait *w);
DEFINE_TRIVIAL_CLEANUP_FUNC(FirmwareWait *, firmware_wait_free);

/* get_host's "firmwareRuns": {"enabled","cacheDir","runs":[{"memoryMiB","cpus","accel","state":
 * "known|queued|running|failed","pcrs":[0,2,3,6] (known),"ranAt","seconds","kernel","error"}]}.
 * New reference, NULL on OOM. */
json_t *firmware_runs_to_json(FirmwareRuns *f);

/* The kernel a run boots: $VM_MANAGER_FIRMWARE_KERNEL, else the host's newest /boot/vmlinuz-* with
 * the EFI stub, the CRB TPM driver and securityfs built in, else (a daemon in a container has no
 * /boot) the .linux section of the newest UKI (*.efi) in the image directory, written to out, with
 * *ret_source naming it ("<uki> (.linux)"). -ENOENT when image_dir has no UKI, -ENOEXEC when the
 * newest has no .linux, -EBADMSG when it is no PE image. */
int firmware_run_uki_kernel(const char *image_dir, const char *out, char **ret_source);

/* `vm-manager firmware-run OUT CODE VARS MEMORY_MIB CPUS ACCEL SHA256 [IMAGE_DIR]`: the helper (see
 * above); IMAGE_DIR is where an image's kernel is taken from when the host has none.
 * Exit status 0 once OUT is written; 1 with the reason as the last line on stderr. */
int firmware_run_main(int argc, char **argv);
