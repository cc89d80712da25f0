/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* `vm-manager guard <program> [<argument>…]` (hidden): runs a program whose own children must not
 * outlive the daemon, as swtpm_setup's swtpm would. PR_SET_PDEATHSIG reaches a direct child only (and
 * swtpm_setup 0.7.1 starts its swtpm through a process that exits at once: it is init's from the
 * start), and a daemon killed with SIGKILL runs no code of its own, so the guard, a process of its
 * own, does the ending:
 *
 *   - it is a child subreaper (PR_SET_CHILD_SUBREAPER), so every descendant orphaned below it becomes
 *     its child instead of init's, and stays within its reach;
 *   - its parent-death signal is SIGTERM, which it waits for, as it waits for SIGTERM, SIGINT and
 *     SIGHUP from anyone else;
 *   - the program runs in a process group of its own, with SIGKILL as its parent-death signal.
 *
 * When the program exits, or one of those signals comes, every process left below the guard is
 * killed with SIGKILL and reaped (for at most VM_GUARD_REAP_TIMEOUT_SEC). The guard then exits as the
 * program did: its exit status, or the signal that killed it; after a signal to the guard, by that
 * signal. Its parent must end it with SIGTERM, never SIGKILL (VmProcessOptions.kill_signal), or the
 * program's children escape. stdio is the program's; the guard writes to stderr only when it cannot
 * run the program (exit status 127) or is called without one (exit status 2). */

#define VM_GUARD_REAP_TIMEOUT_SEC 5

int vm_guard_main(int argc, char **argv);
