/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>

#include "test-golden.h"
#include "test-util.h"

#include "cleanup.h"
#include "fs-util.h"
#include "parse-util.h"
#include "vm-state.h"

/* The lifecycle's decisions, three ways: a table of the transitions that matter written from what
 * the lifecycle must do (README, api-contract §5), every message as a user reads it, and a walk of
 * every state with every sub-state and every event checked for the rules that hold for all of them
 * and compared with tests/data/vm-state/walk.txt (VM_MANAGER_TEST_REGENERATE=1 rewrites it; review the
 * difference like code). */

#define A(x) VM_ACTION_##x

static const char *const all_enum_names_checked = "state sub gate event message wait";

static void test_strings(void **state) {
        for (VmState s = 0; s < _VM_STATE_MAX; s++)
                assert_int_equal(vm_state_from_string(vm_state_to_string(s)), s);
        for (VmSubState s = 0; s < _VM_SUB_MAX; s++)
                assert_int_equal(vm_sub_state_from_string(vm_sub_state_to_string(s)), s);
        for (VmGate g = 0; g < _VM_GATE_MAX; g++)
                assert_int_equal(vm_gate_from_string(vm_gate_to_string(g)), g);
        for (VmEvent e = 0; e < _VM_EVENT_MAX; e++)
                assert_int_equal(vm_event_from_string(vm_event_to_string(e)), e);
        for (VmMessage m = 0; m < _VM_MESSAGE_MAX; m++)
                assert_int_equal(vm_message_from_string(vm_message_to_string(m)), m);
        for (VmWaitFor w = 0; w < _VM_WAIT_MAX; w++)
                assert_int_equal(vm_wait_for_from_string(vm_wait_for_to_string(w)), w);
        assert_string_equal(vm_state_to_string(VM_STATE_ATTESTING), "attesting");
        assert_string_equal(vm_wait_for_to_string(VM_WAIT_ATTESTED), "attested");
        assert_int_equal(vm_state_from_string("bogus"), _VM_STATE_INVALID);
        assert_null(vm_state_to_string(_VM_STATE_MAX));
        assert_non_null(all_enum_names_checked);

        /* QEMU belongs to these states */
        for (VmState s = 0; s < _VM_STATE_MAX; s++)
                assert_int_equal(
                        vm_state_is_live(s),
                        s == VM_STATE_INSTALLING || s == VM_STATE_BOOTING || s == VM_STATE_ATTESTING ||
                                s == VM_STATE_READY || s == VM_STATE_RUNNING || s == VM_STATE_STOPPING);
}

typedef struct Row {
        /* the status */
        VmState state;
        VmSubState sub;
        VmPhase phase;
        VmGate gate;
        bool failing, installed, shutting_down;
        VmEvent event;
        /* the answer: a refusal, ignored, or a transition */
        int error;
        bool ignored;
        VmState next;
        VmSubState next_sub;
        VmAction actions;
        VmMessage message;
} Row;

#define INSTALL VM_PHASE_INSTALL
#define BOOT VM_PHASE_BOOT
#define NOPHASE _VM_PHASE_INVALID
#define S(x) VM_STATE_##x
#define U(x) VM_SUB_##x
#define E(x) VM_EVENT_##x
#define M(x) VM_MESSAGE_##x
#define G(x) VM_GATE_##x

/* status columns: state, sub, phase, gate, failing, installed, shutting_down */
#define REFUSED(err, m) .error = (err), .message = M(m)
#define IGNORED .ignored = true

/* clang-format off */
static const Row rows[] = {
        /* create_vm: the installer's chain, unless the daemon is going */
        { S(CREATING), U(NONE), NOPHASE, G(NONE), 0, 0, 0, E(CREATE),
          .next = S(CREATING), .next_sub = U(START_HELPERS), .actions = A(SPAWN_HELPERS) | A(SAVE) },
        { S(CREATING), U(NONE), NOPHASE, G(NONE), 0, 0, 1, E(CREATE),
          REFUSED(-ESHUTDOWN, SHUTTING_DOWN) },
        /* create_vm in install mode host: the helper writes the disk, then the first boot's chain
         * runs, still under creating, and its monitor makes the VM booting */
        { S(CREATING), U(NONE), NOPHASE, G(NONE), 0, 0, 0, E(CREATE_HOST),
          .next = S(CREATING), .next_sub = U(HOST_INSTALL), .actions = A(HOST_INSTALL) | A(SAVE) },
        { S(CREATING), U(NONE), NOPHASE, G(NONE), 0, 0, 1, E(CREATE_HOST),
          REFUSED(-ESHUTDOWN, SHUTTING_DOWN) },
        { S(CREATING), U(HOST_INSTALL), INSTALL, G(NONE), 0, 0, 0, E(HOST_INSTALLED),
          .next = S(CREATING), .next_sub = U(START_HELPERS), .actions = A(INSTALLED) | A(BEGIN_BOOT) | A(SPAWN_HELPERS) | A(SAVE) },
        { S(CREATING), U(HOST_INSTALL), INSTALL, G(NONE), 0, 0, 1, E(HOST_INSTALLED),
          .next = S(STOPPED), .next_sub = U(NONE), .actions = A(INSTALLED) | A(KILL) | A(SAVE) | A(FINISH_START), .message = M(SHUTDOWN_BEFORE_BOOT) },
        /* the first boot's QEMU, started paused beside the install, answers: create_vm answers */
        { S(CREATING), U(HOST_INSTALL), INSTALL, G(NONE), 0, 0, 0, E(QMP_UP),
          .next = S(CREATING), .next_sub = U(HOST_INSTALL), .actions = A(SAVE) | A(FINISH_START) },
        { S(CREATING), U(HOST_INSTALL), INSTALL, G(NONE), 0, 0, 0, E(HOST_INSTALL_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(KILL) | A(DROP_DISK) | A(SAVE) | A(FINISH_START), .message = M(DETAIL) },
        { S(CREATING), U(HOST_INSTALL), INSTALL, G(NONE), 0, 0, 0, E(START_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(KILL) | A(DROP_DISK) | A(SAVE) | A(FINISH_START), .message = M(DETAIL) },
        { S(CREATING), U(HOST_INSTALL), INSTALL, G(NONE), 0, 0, 0, E(DELETE),
          .next = S(DELETING), .next_sub = U(NONE), .actions = A(KILL) | A(SAVE) | A(FINISH_START), .message = M(DELETED_STARTING) },
        { S(CREATING), U(HOST_INSTALL), INSTALL, G(NONE), 0, 0, 0, E(STOP),
          REFUSED(-EBUSY, STILL_STARTING) },
        { S(CREATING), U(HOST_INSTALL), INSTALL, G(NONE), 0, 0, 0, E(START),
          REFUSED(-EBUSY, HAS_PROCESS) },
        { S(CREATING), U(START_HELPERS), BOOT, G(NONE), 0, 1, 0, E(HELPERS_UP),
          .next = S(CREATING), .next_sub = U(START_QMP), .actions = A(SPAWN_QEMU) },
        { S(CREATING), U(START_QMP), BOOT, G(INITRD), 0, 1, 0, E(QMP_UP),
          .next = S(BOOTING), .next_sub = U(NONE), .actions = A(LINK) | A(PHASE_TIMER) | A(SAVE) | A(FINISH_START) },
        { S(CREATING), U(START_QMP), BOOT, G(NONE), 0, 1, 0, E(START_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(KILL) | A(SAVE) | A(FINISH_START), .message = M(DETAIL) },
        /* a delete of a guest that ignores the power button escalates as a stop does */
        { S(DELETING), U(STOP_POWERDOWN), BOOT, G(NONE), 0, 1, 0, E(STOP_TIMEOUT),
          .next = S(DELETING), .next_sub = U(STOP_SIGTERM), .actions = A(SIGTERM) },
        { S(DELETING), U(STOP_SIGTERM), BOOT, G(NONE), 0, 1, 0, E(STOP_TIMEOUT),
          .next = S(DELETING), .next_sub = U(STOP_SIGKILL), .actions = A(SIGKILL) },
        { S(DELETING), U(STOP_POWERDOWN), INSTALL, G(NONE), 0, 0, 0, E(POWERDOWN_FAILED),
          .next = S(DELETING), .next_sub = U(STOP_SIGTERM), .actions = A(SIGTERM) },
        { S(FAILED), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(HOST_INSTALLED),
          IGNORED },
        { S(FAILED), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(HOST_INSTALL_FAILED),
          IGNORED },
        /* the chain: helpers, QEMU, its monitor */
        { S(CREATING), U(START_HELPERS), INSTALL, G(NONE), 0, 0, 0, E(HELPERS_UP),
          .next = S(CREATING), .next_sub = U(START_QMP), .actions = A(SPAWN_QEMU) },
        { S(CREATING), U(START_QMP), INSTALL, G(NONE), 0, 0, 0, E(QMP_UP),
          .next = S(INSTALLING), .next_sub = U(NONE), .actions = A(LINK) | A(PHASE_TIMER) | A(SAVE) | A(FINISH_START) },
        { S(STOPPED), U(START_QMP), BOOT, G(INITRD), 0, 1, 0, E(QMP_UP),
          .next = S(BOOTING), .next_sub = U(NONE), .actions = A(LINK) | A(PHASE_TIMER) | A(SAVE) | A(FINISH_START) },
        { S(CREATING), U(START_HELPERS), INSTALL, G(NONE), 0, 0, 0, E(START_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(KILL) | A(SAVE) | A(FINISH_START), .message = M(DETAIL) },
        { S(STOPPED), U(START_QMP), BOOT, G(NONE), 0, 1, 0, E(START_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(KILL) | A(SAVE) | A(FINISH_START), .message = M(DETAIL) },
        { S(CREATING), U(START_QMP), INSTALL, G(NONE), 0, 0, 0, E(EXIT_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(SAVE) | A(FINISH_START), .message = M(START_EXIT) },
        /* late answers of a chain that ended are ignored */
        { S(FAILED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(QMP_UP),
          IGNORED },
        { S(FAILED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(HELPERS_UP),
          IGNORED },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(START_FAILED),
          IGNORED },
        /* the installer's end */
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(EXIT),
          .next = S(INSTALLING), .next_sub = U(START_HELPERS), .actions = A(TEARDOWN) | A(INSTALLED) | A(BEGIN_BOOT) | A(SPAWN_HELPERS) | A(SAVE) },
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(EXIT_GUEST_FAILED),
          .next = S(INSTALLING), .next_sub = U(START_HELPERS), .actions = A(TEARDOWN) | A(INSTALLED) | A(BEGIN_BOOT) | A(SPAWN_HELPERS) | A(SAVE) },
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 1, E(EXIT),
          .next = S(STOPPED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(INSTALLED) | A(SAVE), .message = M(SHUTDOWN_BEFORE_BOOT) },
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(EXIT_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(CONSOLE) | A(SAVE), .message = M(INSTALL_EXIT) },
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(PHASE_TIMEOUT),
          .next = S(INSTALLING), .next_sub = U(STOP_SIGKILL), .actions = A(SIGKILL) },
        { S(INSTALLING), U(STOP_SIGKILL), INSTALL, G(NONE), 0, 0, 0, E(EXIT_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(CONSOLE) | A(SAVE), .message = M(INSTALL_TIMEOUT) },
        { S(INSTALLING), U(STOP_SIGKILL), INSTALL, G(NONE), 0, 0, 0, E(EXIT),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(CONSOLE) | A(SAVE), .message = M(INSTALL_TIMEOUT) },
        /* an installed boot's end */
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(EXIT),
          .next = S(STOPPED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(SAVE), .message = M(GUEST_SHUTDOWN) },
        { S(BOOTING), U(NONE), BOOT, G(REJECTED), 0, 1, 0, E(EXIT_GUEST_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(CONSOLE) | A(SAVE), .message = M(GUEST_FAILED) },
        { S(RUNNING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(EXIT_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(CONSOLE) | A(SAVE), .message = M(QEMU_EXIT) },
        { S(STOPPING), U(STOP_POWERDOWN), BOOT, G(NONE), 0, 1, 0, E(EXIT),
          .next = S(STOPPED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(SAVE) },
        { S(STOPPING), U(STOP_SIGKILL), BOOT, G(NONE), 0, 1, 0, E(EXIT_FAILED),
          .next = S(STOPPED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(SAVE) },
        { S(STOPPING), U(STOP_SIGTERM), BOOT, G(REJECTED), 1, 1, 0, E(EXIT_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(SAVE), .message = M(DETAIL) },
        { S(DELETING), U(STOP_POWERDOWN), BOOT, G(NONE), 0, 1, 0, E(EXIT),
          .next = S(DELETING), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(SAVE) },
        /* start_vm */
        { S(STOPPED), U(NONE), BOOT, G(READY), 0, 1, 0, E(START),
          .next = S(STOPPED), .next_sub = U(START_HELPERS), .actions = A(BEGIN_BOOT) | A(SPAWN_HELPERS) | A(SAVE) },
        { S(FAILED), U(NONE), BOOT, G(REJECTED), 0, 1, 0, E(START),
          .next = S(FAILED), .next_sub = U(START_HELPERS), .actions = A(BEGIN_BOOT) | A(SPAWN_HELPERS) | A(SAVE) },
        { S(STOPPED), U(NONE), BOOT, G(NONE), 0, 1, 1, E(START),
          REFUSED(-ESHUTDOWN, SHUTTING_DOWN) },
        { S(DELETING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(START),
          REFUSED(-EBUSY, BEING_DELETED) },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(START),
          REFUSED(-EBUSY, HAS_PROCESS) },
        { S(STOPPED), U(START_QMP), BOOT, G(NONE), 0, 1, 0, E(START),
          REFUSED(-EBUSY, HAS_PROCESS) },
        { S(STOPPED), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(START),
          REFUSED(-EBUSY, NOT_INSTALLED) },
        { S(FAILED), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(START),
          REFUSED(-EBUSY, NOT_INSTALLED) },
        /* stop_vm: the power button, then SIGTERM, then SIGKILL */
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(STOP),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(SAVE) | A(POWERDOWN) },
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(STOP),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(SAVE) | A(POWERDOWN) },
        { S(RUNNING), U(READY_QUOTE), BOOT, G(INITRD), 0, 1, 0, E(STOP),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(SAVE) | A(POWERDOWN) },
        { S(STOPPING), U(STOP_SIGTERM), BOOT, G(NONE), 0, 1, 0, E(STOP),
          .next = S(STOPPING), .next_sub = U(STOP_SIGTERM), .actions = A(SAVE) },
        { S(STOPPING), U(STOP_POWERDOWN), BOOT, G(NONE), 0, 1, 0, E(STOP_TIMEOUT),
          .next = S(STOPPING), .next_sub = U(STOP_SIGTERM), .actions = A(SIGTERM) },
        { S(STOPPING), U(STOP_SIGTERM), BOOT, G(NONE), 0, 1, 0, E(STOP_TIMEOUT),
          .next = S(STOPPING), .next_sub = U(STOP_SIGKILL), .actions = A(SIGKILL) },
        { S(STOPPING), U(STOP_SIGKILL), BOOT, G(NONE), 0, 1, 0, E(STOP_TIMEOUT),
          IGNORED },
        { S(STOPPING), U(STOP_POWERDOWN), BOOT, G(NONE), 0, 1, 0, E(POWERDOWN_FAILED),
          .next = S(STOPPING), .next_sub = U(STOP_SIGTERM), .actions = A(SIGTERM) },
        { S(STOPPING), U(STOP_SIGTERM), BOOT, G(NONE), 0, 1, 0, E(POWERDOWN_FAILED),
          IGNORED },
        { S(STOPPED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(STOP_TIMEOUT),
          IGNORED },
        { S(STOPPED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(STOP),
          REFUSED(-EBUSY, NOT_RUNNING) },
        { S(FAILED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(STOP),
          REFUSED(-EBUSY, NOT_RUNNING) },
        { S(CREATING), U(START_HELPERS), INSTALL, G(NONE), 0, 0, 0, E(STOP),
          REFUSED(-EBUSY, STILL_STARTING) },
        { S(DELETING), U(STOP_POWERDOWN), BOOT, G(NONE), 0, 1, 0, E(STOP),
          REFUSED(-EBUSY, BEING_DELETED) },
        /* reboot_vm: a stop first, refused as start_vm would be refused afterwards */
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(REBOOT),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(SAVE) | A(POWERDOWN) },
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(REBOOT),
          REFUSED(-EBUSY, NOT_INSTALLED) },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 1, E(REBOOT),
          REFUSED(-ESHUTDOWN, SHUTTING_DOWN) },
        { S(STOPPED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(REBOOT),
          REFUSED(-EBUSY, NOT_RUNNING) },
        /* delete_vm */
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(DELETE),
          .next = S(DELETING), .next_sub = U(STOP_POWERDOWN), .actions = A(SAVE) | A(POWERDOWN) },
        { S(STOPPED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(DELETE),
          .next = S(DELETING), .next_sub = U(NONE), .actions = A(SAVE) },
        { S(STOPPING), U(STOP_SIGTERM), BOOT, G(NONE), 0, 1, 0, E(DELETE),
          .next = S(DELETING), .next_sub = U(STOP_SIGTERM), .actions = A(SAVE) },
        { S(CREATING), U(START_QMP), INSTALL, G(NONE), 0, 0, 0, E(DELETE),
          .next = S(DELETING), .next_sub = U(NONE), .actions = A(KILL) | A(SAVE) | A(FINISH_START), .message = M(DELETED_STARTING) },
        { S(DELETING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(DELETE),
          REFUSED(-EBUSY, ALREADY_DELETING) },
        /* timeouts of an installed boot */
        { S(BOOTING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(PHASE_TIMEOUT),
          .next = S(RUNNING), .next_sub = U(NONE), .actions = A(SAVE), .message = M(NO_READY) },
        { S(ATTESTING), U(NONE), BOOT, G(NONCE), 0, 1, 0, E(PHASE_TIMEOUT),
          .next = S(RUNNING), .next_sub = U(NONE), .actions = A(SAVE), .message = M(NO_READY) },
        { S(RUNNING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(PHASE_TIMEOUT),
          IGNORED },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(PHASE_TIMEOUT),
          IGNORED },
        { S(RUNNING), U(READY_QUOTE), BOOT, G(INITRD), 0, 1, 0, E(PHASE_TIMEOUT),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(DISARM) | A(SAVE) | A(POWERDOWN), .message = M(NO_READY_QUOTE) },
        /* READY=1 and the attestation gate */
        { S(BOOTING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(READY),
          .next = S(READY), .next_sub = U(NONE), .actions = A(BECOME_READY) | A(DISARM) | A(SAVE), .message = M(CLEAR) },
        { S(RUNNING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(READY),
          .next = S(READY), .next_sub = U(NONE), .actions = A(BECOME_READY) | A(DISARM) | A(SAVE), .message = M(CLEAR) },
        { S(ATTESTING), U(NONE), BOOT, G(READY), 0, 1, 0, E(READY),
          .next = S(READY), .next_sub = U(NONE), .actions = A(BECOME_READY) | A(DISARM) | A(SAVE), .message = M(CLEAR) },
        { S(ATTESTING), U(NONE), BOOT, G(INITRD), 0, 1, 0, E(READY),
          .next = S(ATTESTING), .next_sub = U(READY_QUOTE), .actions = A(GRACE_TIMER) | A(SAVE) },
        { S(BOOTING), U(NONE), BOOT, G(CLOSED), 0, 1, 0, E(READY),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(DISARM) | A(SAVE) | A(POWERDOWN), .message = M(READY_NO_NONCE) },
        { S(ATTESTING), U(NONE), BOOT, G(NONCE), 0, 1, 0, E(READY),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(DISARM) | A(SAVE) | A(POWERDOWN), .message = M(READY_NO_QUOTE) },
        { S(ATTESTING), U(NONE), BOOT, G(REJECTED), 0, 1, 0, E(READY),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(DISARM) | A(SAVE) | A(POWERDOWN), .message = M(READY_REJECTED) },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(READY),
          .next = S(READY), .next_sub = U(NONE), .actions = A(SAVE) },
        { S(STOPPED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(READY),
          .next = S(STOPPED), .next_sub = U(NONE), .actions = A(SAVE) },
        /* nonces and verdicts */
        { S(BOOTING), U(NONE), BOOT, G(NONCE), 0, 1, 0, E(NONCE),
          .next = S(ATTESTING), .next_sub = U(NONE), .actions = A(SAVE) },
        { S(BOOTING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(NONCE),
          .next = S(BOOTING), .next_sub = U(NONE), .actions = A(SAVE) },
        { S(RUNNING), U(NONE), BOOT, G(NONCE), 0, 1, 0, E(NONCE),
          .next = S(RUNNING), .next_sub = U(NONE), .actions = A(SAVE) },
        { S(ATTESTING), U(NONE), BOOT, G(REJECTED), 0, 1, 0, E(QUOTE_REJECTED_INITRD),
          .next = S(STOPPING), .next_sub = U(STOP_SIGTERM), .actions = A(DISARM) | A(SAVE) | A(SIGTERM), .message = M(QUOTE_REJECTED) },
        { S(READY), U(NONE), BOOT, G(INITRD), 0, 1, 0, E(QUOTE_REJECTED_READY),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(DISARM) | A(SAVE) | A(POWERDOWN), .message = M(QUOTE_REJECTED) },
        { S(ATTESTING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(QUOTE_REJECTED_INITRD),
          .next = S(ATTESTING), .next_sub = U(NONE), .actions = A(SAVE), .message = M(QUOTE_REJECTED) },
        { S(ATTESTING), U(NONE), BOOT, G(NONCE), 0, 1, 0, E(QUOTE_RETRYABLE),
          .next = S(ATTESTING), .next_sub = U(NONE), .actions = A(SAVE), .message = M(QUOTE_REJECTED) },
        /* a kernel panic on the console before readiness: killed, failed with the panic line */
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(GUEST_PANIC),
          .next = S(STOPPING), .next_sub = U(STOP_SIGTERM), .actions = A(DISARM) | A(SAVE) | A(SIGTERM), .message = M(GUEST_PANIC) },
        { S(BOOTING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(GUEST_PANIC),
          .next = S(STOPPING), .next_sub = U(STOP_SIGTERM), .actions = A(DISARM) | A(SAVE) | A(SIGTERM), .message = M(GUEST_PANIC) },
        { S(ATTESTING), U(NONE), BOOT, G(NONCE), 0, 1, 0, E(GUEST_PANIC),
          .next = S(STOPPING), .next_sub = U(STOP_SIGTERM), .actions = A(DISARM) | A(SAVE) | A(SIGTERM), .message = M(GUEST_PANIC) },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(GUEST_PANIC), IGNORED },
        { S(STOPPING), U(STOP_POWERDOWN), BOOT, G(NONE), 0, 1, 0, E(GUEST_PANIC), IGNORED },
        { S(BOOTING), U(START_QMP), BOOT, G(NONE), 0, 1, 0, E(GUEST_PANIC), IGNORED },
        /* the user-data's bootstrap failed: the boot fails with the unit's lines, powered off */
        { S(BOOTING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(BOOTSTRAP_FAILED),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(DISARM) | A(SAVE) | A(POWERDOWN), .message = M(BOOTSTRAP_FAILED) },
        { S(ATTESTING), U(READY_QUOTE), BOOT, G(INITRD), 0, 1, 0, E(BOOTSTRAP_FAILED),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(DISARM) | A(SAVE) | A(POWERDOWN), .message = M(BOOTSTRAP_FAILED) },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(BOOTSTRAP_FAILED), IGNORED },
        { S(INSTALLING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(BOOTSTRAP_FAILED), IGNORED },
        { S(STOPPED), U(NONE), BOOT, G(NONE), 0, 1, 0, E(BOOTSTRAP_FAILED), IGNORED },
        /* ... and once QEMU is gone: failed, the panic line as lastError */
        { S(STOPPING), U(STOP_SIGTERM), INSTALL, G(NONE), 1, 0, 0, E(EXIT_FAILED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(TEARDOWN) | A(SAVE), .message = M(DETAIL) },
        /* ... on its way down already: lastError says so until QEMU is gone (then the reason again) */
        { S(STOPPING), U(STOP_POWERDOWN), BOOT, G(REJECTED), 1, 1, 0, E(QUOTE_REJECTED_INITRD),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(SAVE), .message = M(QUOTE_REJECTED) },
        { S(STOPPING), U(STOP_POWERDOWN), BOOT, G(INITRD), 1, 1, 0, E(READY),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(SAVE) },
        { S(STOPPING), U(STOP_POWERDOWN), BOOT, G(NONE), 0, 1, 0, E(PHASE_TIMEOUT),
          IGNORED },
        { S(STOPPING), U(STOP_POWERDOWN), INSTALL, G(NONE), 0, 0, 0, E(PHASE_TIMEOUT),
          .next = S(STOPPING), .next_sub = U(STOP_SIGKILL), .actions = A(SIGKILL) },
        { S(ATTESTING), U(NONE), BOOT, G(INITRD), 0, 1, 0, E(QUOTE_VERIFIED_INITRD),
          .next = S(ATTESTING), .next_sub = U(NONE), .actions = A(CLEAR_REJECTION) | A(SAVE) },
        { S(ATTESTING), U(READY_QUOTE), BOOT, G(READY), 0, 1, 0, E(QUOTE_VERIFIED_READY),
          .next = S(READY), .next_sub = U(NONE), .actions = A(CLEAR_REJECTION) | A(BECOME_READY) | A(DISARM) | A(SAVE), .message = M(CLEAR) },
        { S(ATTESTING), U(NONE), BOOT, G(READY), 0, 1, 0, E(QUOTE_VERIFIED_READY),
          .next = S(ATTESTING), .next_sub = U(NONE), .actions = A(CLEAR_REJECTION) | A(SAVE) },
        /* a daemon restart */
        { S(CREATING), U(NONE), INSTALL, G(NONE), 0, 0, 0, E(RESTARTED),
          .next = S(FAILED), .next_sub = U(NONE), .actions = A(DROP_DISK), .message = M(RESTARTED) },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(RESTARTED),
          IGNORED },
        { S(BOOTING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(REATTACHED),
          .next = S(BOOTING), .next_sub = U(NONE), .actions = A(LINK) | A(PHASE_TIMER) | A(SAVE) },
        { S(READY), U(NONE), BOOT, G(NONE), 0, 1, 0, E(REATTACHED),
          .next = S(READY), .next_sub = U(NONE), .actions = A(LINK) | A(SAVE) },
        { S(STOPPING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(REATTACHED),
          .next = S(STOPPING), .next_sub = U(STOP_POWERDOWN), .actions = A(LINK) | A(SAVE) | A(POWERDOWN) },
        { S(RUNNING), U(NONE), BOOT, G(NONE), 0, 1, 0, E(REATTACH_FAILED),
          .next = S(STOPPED), .next_sub = U(NONE), .actions = A(KILL) | A(SAVE), .message = M(NOT_REATTACHED) },
};
/* clang-format on */

static void test_table(void **state) {
        for (size_t i = 0; i < ELEMENTSOF(rows); i++) {
                const Row *r = rows + i;
                VmStatus s = {
                        .state = r->state,
                        .sub = r->sub,
                        .phase = r->phase,
                        .gate = r->gate,
                        .failing = r->failing,
                        .installed = r->installed,
                        .shutting_down = r->shutting_down,
                };
                VmTransition t = vm_state_next(&s, r->event);

                print_message(
                        "# row %zu: %s/%s + %s\n",
                        i,
                        vm_state_to_string(r->state),
                        vm_sub_state_to_string(r->sub),
                        vm_event_to_string(r->event));
                assert_int_equal(t.error, r->error);
                assert_int_equal(t.ignored, r->ignored);
                assert_int_equal(t.message, r->message);
                if (r->error < 0 || r->ignored)
                        continue;
                assert_string_equal(vm_state_to_string(t.state), vm_state_to_string(r->next));
                assert_string_equal(vm_sub_state_to_string(t.sub), vm_sub_state_to_string(r->next_sub));
                assert_int_equal(t.actions, r->actions);
        }
}

/* Every message as a user reads it. */
static void test_messages(void **state) {
        static const VmMessageArgs a = {
                .id = "1a2b3c4d",
                .state = VM_STATE_BOOTING,
                .exit_status = "exited with status 1",
                .guest_status = "70",
                .cause = "initrd attestation rejected: golden mismatch",
                .stage = "ready",
                .detail = "the detail",
                .errno_text = "No such file or directory",
                .what = "/state/vms/1a2b3c4d/qmp.sock",
                .duration = 150 * USEC_PER_SEC,
        };
        static const struct {
                VmMessage m;
                const char *text;
        } texts[] = {
                { VM_MESSAGE_SHUTTING_DOWN, "vm-manager is shutting down" },
                { VM_MESSAGE_BEING_DELETED, "vm 1a2b3c4d is being deleted" },
                { VM_MESSAGE_ALREADY_DELETING, "vm 1a2b3c4d is already being deleted" },
                { VM_MESSAGE_STILL_STARTING,
                  "vm 1a2b3c4d is booting and still starting; try again in a moment" },
                { VM_MESSAGE_NOT_RUNNING, "vm 1a2b3c4d is not running (booting)" },
                { VM_MESSAGE_HAS_PROCESS, "vm 1a2b3c4d is booting" },
                { VM_MESSAGE_NOT_INSTALLED, "vm 1a2b3c4d never finished installing; delete and recreate it" },
                { VM_MESSAGE_DETAIL, "the detail" },
                { VM_MESSAGE_START_EXIT, "qemu exited during start (exited with status 1): the detail" },
                { VM_MESSAGE_INSTALL_TIMEOUT, "installer did not finish within 2m30s" },
                { VM_MESSAGE_INSTALL_EXIT, "installer exited: exited with status 1" },
                { VM_MESSAGE_SHUTDOWN_BEFORE_BOOT,
                  "vm-manager shut down before the installed boot started; start the VM" },
                { VM_MESSAGE_START_BOOT, "start installed boot: the detail" },
                { VM_MESSAGE_GUEST_FAILED,
                  "initrd attestation rejected: golden mismatch; then the guest shut down (EXIT_STATUS=70)" },
                { VM_MESSAGE_GUEST_SHUTDOWN, "guest shut down" },
                { VM_MESSAGE_QEMU_EXIT,
                  "initrd attestation rejected: golden mismatch; then qemu exited: exited with status 1" },
                { VM_MESSAGE_NO_READY, "no READY=1 within 2m30s; the guest is up but has not reported ready" },
                { VM_MESSAGE_NO_READY_QUOTE,
                  "attestation required: the guest sent READY=1, but no verified ready-stage quote followed "
                  "within 2m30s (its ready-stage attestation did not run or did not reach the metadata "
                  "service)" },
                { VM_MESSAGE_GUEST_PANIC, "guest kernel panicked while booting: the detail" },
                { VM_MESSAGE_BOOTSTRAP_FAILED, "the guest's bootstrap failed while booting: the detail" },
                { VM_MESSAGE_READY_NO_NONCE,
                  "attestation required: the guest sent READY=1 without a verified initrd quote (it never "
                  "asked for a nonce: does the image run vm-agent?); its user-data was not released" },
                { VM_MESSAGE_READY_NO_QUOTE,
                  "attestation required: the guest sent READY=1 without a verified initrd quote (it asked for "
                  "a nonce but posted no quote); its user-data was not released" },
                { VM_MESSAGE_READY_REJECTED,
                  "attestation required: the guest sent READY=1 without a verified initrd quote (its quote was "
                  "rejected: the detail); its user-data was not released" },
                { VM_MESSAGE_QUOTE_REJECTED, "ready attestation rejected: the detail" },
                { VM_MESSAGE_RESTARTED, "vm-manager restarted while the VM was booting; delete it" },
                { VM_MESSAGE_NOT_REATTACHED,
                  "vm-manager restarted while the VM was booting and could not reattach to its QEMU (the "
                  "detail); start the VM again" },
                { VM_MESSAGE_VTPM_TIMEOUT,
                  "vtpm not responding: swtpm control socket did not answer within 5s: the detail" },
                { VM_MESSAGE_VSOCKD_TIMEOUT, "vhost-device-vsock did not come up within 5s: the detail" },
                { VM_MESSAGE_NOTIFY_LISTEN, "failed to listen for READY=1" },
                { VM_MESSAGE_QEMU_SPAWN, "failed to start qemu: No such file or directory: the detail" },
                { VM_MESSAGE_QMP_TIMEOUT,
                  "qemu QMP at /state/vms/1a2b3c4d/qmp.sock did not answer within 2m30s: No such file or "
                  "directory (the detail)" },
                { VM_MESSAGE_DELETED_STARTING, "deleted while starting" },
                { VM_MESSAGE_PREPARE, "preparing /state/vms/1a2b3c4d/qmp.sock: No such file or directory" },
                { VM_MESSAGE_SWTPM_SPAWN, "starting swtpm: No such file or directory" },
                { VM_MESSAGE_VSOCKD_SPAWN, "starting vhost-device-vsock: No such file or directory" },
                { VM_MESSAGE_PROBE_TIMER, "starting 1a2b3c4d: No such file or directory" },
                { VM_MESSAGE_TPM_SETUP,
                  "vtpm could not be manufactured: swtpm_setup exited with status 1: the detail" },
                { VM_MESSAGE_NO_UNITS, "no service manager to find its units in" },
                { VM_MESSAGE_WAS_CHILD, "it ran as a plain child process, which ends with the daemon" },
                { VM_MESSAGE_QMP_SILENT, "its QMP socket did not answer: No such file or directory" },
                { VM_MESSAGE_HOST_INSTALL,
                  "host install failed (exited with status 1): the detail; the disk was removed" },
                { VM_MESSAGE_HOST_INSTALL_SPAWN,
                  "host install failed: cannot start its helper: No such file or directory; the disk was removed" },
                { VM_MESSAGE_HOST_INSTALL_UNSUPPORTED,
                  "image /state/vms/1a2b3c4d/qmp.sock cannot be installed on the host: it has no layout file "
                  "(/state/vms/1a2b3c4d/qmp.sock.layout.json); use install_mode boot" },
                { VM_MESSAGE_WAIT_TIMEOUT,
                  "vm 1a2b3c4d did not reach /state/vms/1a2b3c4d/qmp.sock within 2m30s (state booting); vm "
                  "1a2b3c4d is booting: the detail (follow it with get_vm 1a2b3c4d, delete it with "
                  "delete_vm)" },
                { VM_MESSAGE_WAIT_FAILED,
                  "the detail; vm 1a2b3c4d is failed (follow it with get_vm 1a2b3c4d, delete it with "
                  "delete_vm)" },
                { VM_MESSAGE_WAIT_ENDED,
                  "vm is booting; vm 1a2b3c4d is booting (follow it with get_vm 1a2b3c4d, delete it with "
                  "delete_vm)" },
        };
        bool seen[_VM_MESSAGE_MAX] = {};

        for (size_t i = 0; i < ELEMENTSOF(texts); i++) {
                _cleanup_free_ char *s = vm_message_format(texts[i].m, &a);

                assert_string_equal(s, texts[i].text);
                seen[texts[i].m] = true;
        }
        /* every message has its line above */
        for (VmMessage m = VM_MESSAGE_SHUTTING_DOWN; m < _VM_MESSAGE_MAX; m++)
                if (!seen[m])
                        fail_msg("message %s has no expected text", vm_message_to_string(m));
        assert_null(vm_message_format(VM_MESSAGE_NONE, &a));
        assert_null(vm_message_format(VM_MESSAGE_CLEAR, &a));

        /* the texts without their optional parts */
        static const struct {
                VmMessage m;
                VmMessageArgs a;
                const char *text;
        } bare[] = {
                { VM_MESSAGE_GUEST_FAILED, { .guest_status = "1" }, "guest shut down (EXIT_STATUS=1)" },
                { VM_MESSAGE_QEMU_EXIT,
                  { .exit_status = "killed by SIGKILL" },
                  "qemu exited: killed by SIGKILL" },
                { VM_MESSAGE_QEMU_SPAWN,
                  { .errno_text = "Permission denied" },
                  "failed to start qemu: Permission denied" },
                { VM_MESSAGE_QMP_TIMEOUT,
                  { .errno_text = "Connection refused", .duration = 30 * USEC_PER_SEC },
                  "qemu QMP at qmp.sock did not answer within 30s: Connection refused (qemu wrote nothing to its log)" },
                { VM_MESSAGE_START_BOOT, {}, "start installed boot: error" },
                { VM_MESSAGE_WAIT_FAILED,
                  { .id = "x" },
                  "unknown error; vm x is failed (follow it with get_vm x, delete it with delete_vm)" },
                { VM_MESSAGE_WAIT_TIMEOUT,
                  { .id = "x", .state = VM_STATE_INSTALLING, .what = "ready", .duration = USEC_PER_MINUTE },
                  "vm x did not reach ready within 1m (state installing); vm x is installing (follow it with get_vm x, delete it with delete_vm)" },
        };
        for (size_t i = 0; i < ELEMENTSOF(bare); i++) {
                _cleanup_free_ char *s = vm_message_format(bare[i].m, &bare[i].a);

                assert_string_equal(s, bare[i].text);
        }
}

static void test_wait(void **state) {
        VmMilestones none = {}, installed = { .installed = true },
                     all = { .installed = true, .attested = true, .ready = true };
        VmStatus s = { .state = VM_STATE_INSTALLING };

        assert_int_equal(vm_state_wait(&s, &none, VM_WAIT_NONE), VM_WAIT_REACHED);
        assert_int_equal(vm_state_wait(&s, &none, VM_WAIT_INSTALLED), VM_WAIT_PENDING);
        assert_int_equal(vm_state_wait(&s, &installed, VM_WAIT_INSTALLED), VM_WAIT_REACHED);
        assert_int_equal(vm_state_wait(&s, &installed, VM_WAIT_READY), VM_WAIT_PENDING);
        /* a failed VM never meets a milestone */
        s.state = VM_STATE_FAILED;
        assert_int_equal(vm_state_wait(&s, &all, VM_WAIT_READY), VM_WAIT_FAILED);
        assert_int_equal(vm_state_wait(&s, &all, VM_WAIT_NONE), VM_WAIT_FAILED);
        /* stopping for a verdict is failing */
        s = (VmStatus){ .state = VM_STATE_STOPPING, .failing = true };
        assert_int_equal(vm_state_wait(&s, &installed, VM_WAIT_READY), VM_WAIT_FAILED);
        s.failing = false;
        assert_int_equal(vm_state_wait(&s, &installed, VM_WAIT_READY), VM_WAIT_ABANDONED);
        assert_int_equal(vm_state_wait(&s, &all, VM_WAIT_READY), VM_WAIT_REACHED);
        s.state = VM_STATE_STOPPED;
        assert_int_equal(vm_state_wait(&s, &installed, VM_WAIT_ATTESTED), VM_WAIT_ABANDONED);
        s.state = VM_STATE_DELETING;
        assert_int_equal(vm_state_wait(&s, &installed, VM_WAIT_READY), VM_WAIT_ABANDONED);
        s.state = VM_STATE_RUNNING;
        assert_int_equal(vm_state_wait(&s, &installed, VM_WAIT_READY), VM_WAIT_PENDING);
}

/* ---- the walk -------------------------------------------------------------------------------- */

static const char *action_names[] = {
        "teardown",        "kill",      "disarm",        "begin-boot", "installed", "become-ready",
        "clear-rejection", "console",   "spawn-helpers", "spawn-qemu", "link",      "phase-timer",
        "grace-timer",     "save",      "powerdown",     "sigterm",    "sigkill",   "finish-start",
        "host-install",    "drop-disk",
};

static void print_actions(FILE *f, VmAction a) {
        bool first = true;

        for (size_t i = 0; i < ELEMENTSOF(action_names); i++)
                if (a & (1 << i)) {
                        fprintf(f, "%s%s", first ? "" : ",", action_names[i]);
                        first = false;
                }
        if (first)
                fputs("-", f);
}

/* The status a VM has in a state and sub-state, as the lifecycle gives it. */
static VmStatus natural(VmState st, VmSubState u) {
        bool chain = u == VM_SUB_START_HELPERS || u == VM_SUB_START_QMP;
        VmPhase phase = st == VM_STATE_CREATING || (st == VM_STATE_INSTALLING && !chain) ? VM_PHASE_INSTALL :
                                                                                           VM_PHASE_BOOT;

        return (VmStatus){
                .state = st,
                .sub = u,
                .phase = phase,
                .gate = VM_GATE_INITRD,
                .installed = phase == VM_PHASE_BOOT || !IN_SET(st, VM_STATE_CREATING, VM_STATE_INSTALLING),
        };
}

/* Rules every answer keeps. */
static void check_answer(const VmStatus *s, VmEvent e, const VmTransition *t) {
        VmStatus next;

        assert_true(t->error <= 0);
        assert_true(t->message >= 0 && t->message < _VM_MESSAGE_MAX);
        if (t->error < 0) {
                _cleanup_free_ char *text = NULL;

                /* a refusal changes nothing and says why */
                assert_int_equal(t->actions, 0);
                assert_int_equal(t->state, s->state);
                assert_int_equal(t->sub, s->sub);
                text = vm_message_format(t->message, &(VmMessageArgs){ .id = "x", .state = s->state });
                assert_non_null(text);
                return;
        }
        assert_true(t->state >= 0 && t->state < _VM_STATE_MAX);
        assert_true(t->sub >= 0 && t->sub < _VM_SUB_MAX);
        assert_true((unsigned) t->actions < (1U << ELEMENTSOF(action_names)));
        if (t->ignored || !vm_status_is_valid(s))
                return;

        /* from a status the lifecycle reaches, only to another */
        next = (VmStatus){
                .state = t->state,
                .sub = t->sub,
                .phase = t->phase,
                .gate = s->gate,
                .failing = t->failing,
                .installed = s->installed || (t->actions & VM_ACTION_INSTALLED),
                .shutting_down = s->shutting_down,
        };
        if (!vm_status_is_valid(&next))
                fail_msg(
                        "%s/%s/%s + %s leads to %s/%s/%s",
                        vm_state_to_string(s->state),
                        vm_sub_state_to_string(s->sub),
                        vm_phase_to_string(s->phase) ?: "-",
                        vm_event_to_string(e),
                        vm_state_to_string(next.state),
                        vm_sub_state_to_string(next.sub),
                        vm_phase_to_string(next.phase) ?: "-");
        /* a stop escalation runs only where QEMU runs */
        if (t->actions & (VM_ACTION_POWERDOWN | VM_ACTION_SIGTERM | VM_ACTION_SIGKILL))
                assert_true(
                        vm_state_is_live(s->state) || vm_state_is_live(t->state) ||
                        (s->state == VM_STATE_DELETING && s->sub >= VM_SUB_STOP_POWERDOWN &&
                         s->sub <= VM_SUB_STOP_SIGKILL));
        /* processes are spawned only for a start chain, the host install's helper only for it */
        if (t->actions & (VM_ACTION_SPAWN_HELPERS | VM_ACTION_SPAWN_QEMU))
                assert_true(t->sub == VM_SUB_START_HELPERS || t->sub == VM_SUB_START_QMP);
        if (t->actions & VM_ACTION_HOST_INSTALL)
                assert_true(t->sub == VM_SUB_HOST_INSTALL && s->sub == VM_SUB_NONE);
        /* the start chain's waiters (create_vm's from its host install on) hear its end exactly when it
         * ends, or when the paused QEMU beside the host install answers */
        assert_int_equal(
                (t->actions & VM_ACTION_FINISH_START) != 0,
                ((s->sub == VM_SUB_START_HELPERS || s->sub == VM_SUB_START_QMP ||
                  s->sub == VM_SUB_HOST_INSTALL) &&
                 t->sub != VM_SUB_START_HELPERS && t->sub != VM_SUB_START_QMP &&
                 t->sub != VM_SUB_HOST_INSTALL) ||
                        (s->sub == VM_SUB_HOST_INSTALL && e == VM_EVENT_QMP_UP));
        /* the disk goes only with a create that did not finish, into failed */
        if (t->actions & VM_ACTION_DROP_DISK)
                assert_true(t->state == VM_STATE_FAILED && !s->installed && s->state == VM_STATE_CREATING);
        /* a failure that captures the console says why */
        if (t->actions & VM_ACTION_CONSOLE)
                assert_true(t->state == VM_STATE_FAILED && t->message != VM_MESSAGE_NONE);
        /* nothing leaves deleting */
        if (s->state == VM_STATE_DELETING)
                assert_int_equal(t->state, VM_STATE_DELETING);
}

static char *walk(void) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        assert_non_null(f);
        fputs("# state sub event -> next-state next-sub actions message, for every state and sub-state the\n"
              "# lifecycle reaches (the phase and installedAt as they are there, the gate at initrd)\n",
              f);
        for (VmState st = 0; st < _VM_STATE_MAX; st++)
                for (VmSubState u = 0; u < _VM_SUB_MAX; u++)
                        for (VmEvent e = 0; e < _VM_EVENT_MAX; e++) {
                                VmStatus s = natural(st, u);
                                VmTransition t;

                                if (!vm_status_is_valid(&s))
                                        continue;
                                t = vm_state_next(&s, e);

                                check_answer(&s, e, &t);
                                fprintf(f,
                                        "%s %s %s -> ",
                                        vm_state_to_string(st),
                                        vm_sub_state_to_string(u),
                                        vm_event_to_string(e));
                                if (t.error < 0)
                                        fprintf(f,
                                                "refused %s %s\n",
                                                test_errno_name(t.error),
                                                vm_message_to_string(t.message));
                                else if (t.ignored)
                                        fputs("ignored\n", f);
                                else {
                                        fprintf(f,
                                                "%s %s ",
                                                vm_state_to_string(t.state),
                                                vm_sub_state_to_string(t.sub));
                                        print_actions(f, t.actions);
                                        fprintf(f, " %s\n", vm_message_to_string(t.message));
                                }
                        }
        assert_int_equal(fclose(f), 0);
        return TAKE_PTR(buf);
}

static char *golden_path(void) {
        const char *dir = secure_getenv("VM_MANAGER_TEST_DATA");
        char *p;

        assert_non_null(dir);
        assert_true(asprintf(&p, "%s/vm-state/walk.txt", dir) >= 0);
        return p;
}

static void test_walk(void **state) {
        _cleanup_free_ char *path = golden_path(), *got = walk();

        /* every combination of every status field, against the rules alone */
        for (VmState st = 0; st < _VM_STATE_MAX; st++)
                for (VmSubState u = 0; u < _VM_SUB_MAX; u++)
                        for (VmGate gt = 0; gt < _VM_GATE_MAX; gt++)
                                for (unsigned bits = 0; bits < 8; bits++)
                                        for (int ph = -1; ph < _VM_PHASE_MAX; ph++)
                                                for (VmEvent ev = 0; ev < _VM_EVENT_MAX; ev++) {
                                                        VmStatus s = {
                                                                .state = st,
                                                                .sub = u,
                                                                .phase = ph < 0 ? _VM_PHASE_INVALID :
                                                                                  (VmPhase) ph,
                                                                .gate = gt,
                                                                .failing = bits & 1,
                                                                .installed = bits & 2,
                                                                .shutting_down = bits & 4,
                                                        };
                                                        VmTransition t = vm_state_next(&s, ev);

                                                        check_answer(&s, ev, &t);
                                                }

        assert_true(test_golden_matches(path, got, "table"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_strings),  cmocka_unit_test(test_table),
                cmocka_unit_test(test_messages), cmocka_unit_test(test_wait),
                cmocka_unit_test(test_walk),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
