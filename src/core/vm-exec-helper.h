/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* exec_vm's ssh session, in a helper process: the daemon's own executable, run again through the
 * handle it took at start-up, as `vm-manager exec-ssh` (hidden). libssh blocks, and the gateway that
 * carries its bytes is on the daemon's loop, so the session cannot run there; and a forked copy of
 * the daemon must not run libssh, OpenSSL or jansson, whose locks a thread of the daemon may have
 * held at fork(). A fresh process has none of that.
 *
 * stdin: one JSON object, the session's parameters, all strings:
 *   "socket"   the gateway's unix listener whose connections reach the guest's port 22
 *   "host"     the guest's address, for libssh (the connection is "socket"'s)
 *   "address"  "<ip>:22", for messages
 *   "vm"       the VM's id, for messages
 *   "key"      the VM's private key (root's authorized key in the guest)
 *   "pin"      the file that pins the guest's host key (written, 0600, on first use)
 *   "command"  the command line for the remote shell
 *   "stdin"    (optional) the command's standard input; end of file follows it either way
 *   "shell"    (optional, boolean) vm shell: no command, an interactive login shell in a pty instead
 *              (vm_shell_start()); stdout is then the client's connection, read and written in the
 *              frames of shell-frame.h, nothing else written on it, and the helper exits when the
 *              shell does (an EXIT frame out) or the client leaves (an end of file in)
 *
 * stdout: one JSON object, then the helper exits 0:
 *   {"stdout","stderr","exitCode"[,"stdoutTruncated","stderrTruncated"]}: the command ran
 *     (VM_EXEC_OUTPUT_MAX bytes per stream at most);
 *   {"error": text, "unreached": bool}: it did not; unreached while no ssh handshake happened (a
 *     guest still booting may have no sshd yet).
 * Parameters it cannot read: exit status 2 and a line on stderr, nothing on stdout. */

int vm_exec_helper_main(int argc, char **argv);
