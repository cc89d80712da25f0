/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* vm-manager-fwlog-init: PID 1 of the firmware run (docs/design.md "Attestation", issue 36).
 *
 * The daemon boots the host's OVMF with a fresh swtpm and a kernel whose initramfs holds only this
 * program, to learn the events the firmware measures before any image runs (PCRs 0-7 up to their
 * separators). The kernel takes the firmware's TCG2 event log from the EFI configuration table and
 * exposes it in securityfs; this program copies it onto the serial console and powers off. It must
 * be static: the initramfs has no C library and no other file.
 *
 * Console protocol (parsed by attest_fwlog_parse(), src/attest/attest-fwlog.h): one line
 * "vmm-fwlog: begin", then lines "vmm-fwlog: " followed by up to 48 bytes of the log in lower-case
 * hex, then "vmm-fwlog: end <total bytes>", or "vmm-fwlog: error <text>" when there is no log. The
 * firmware's own lines may come before and the kernel's may interleave; only lines with the
 * prefix count. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <unistd.h>

#define PREFIX "vmm-fwlog: "
#define EVENT_LOG "/sys/kernel/security/tpm0/binary_bios_measurements"

/* The kernel may start us without a console on fd 1 (the initramfs has no /dev/console node), so
 * the console is opened again from devtmpfs. */
static void open_console(void) {
        int fd;

        (void) mkdir("/dev", 0755);
        (void) mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
        fd = open("/dev/ttyS0", O_WRONLY | O_NOCTTY | O_CLOEXEC);
        if (fd < 0)
                fd = open("/dev/console", O_WRONLY | O_NOCTTY | O_CLOEXEC);
        if (fd < 0)
                return;
        (void) dup2(fd, STDOUT_FILENO);
        if (fd != STDOUT_FILENO)
                (void) close(fd);
}

static void dump_log(void) {
        unsigned char buf[48];
        size_t total = 0;
        int fd;

        /* What the firmware wrote last may still hold the line (OVMF 2025.02 of Debian 13 clears the
         * screen with escape sequences and no line end, and "quiet" keeps the kernel from ending it):
         * start a new one, so that ours begin with the prefix. */
        putchar('\n');
        fd = open(EVENT_LOG, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                printf(PREFIX "error %s: %s\n", EVENT_LOG, strerror(errno));
                return;
        }

        printf(PREFIX "begin\n");
        /* The file is a seq_file: short reads are normal, so each line is filled until EOF. */
        for (;;) {
                size_t got = 0;
                ssize_t n = 0;

                while (got < sizeof(buf) && (n = read(fd, buf + got, sizeof(buf) - got)) > 0)
                        got += (size_t) n;
                if (n < 0) {
                        printf(PREFIX "error reading %s: %s\n", EVENT_LOG, strerror(errno));
                        (void) close(fd);
                        return;
                }
                if (got == 0)
                        break;
                fputs(PREFIX, stdout);
                for (size_t i = 0; i < got; i++)
                        printf("%02x", buf[i]);
                fputs("\n", stdout);
                total += got;
                if (got < sizeof(buf))
                        break;
        }
        (void) close(fd);
        printf(PREFIX "end %zu\n", total);
}

int main(void) {
        open_console();
        (void) mkdir("/sys", 0755);
        (void) mount("sysfs", "/sys", "sysfs", 0, NULL);
        (void) mount("securityfs", "/sys/kernel/security", "securityfs", 0, NULL);
        dump_log();
        (void) fflush(stdout);
        sync();
        (void) reboot(RB_POWER_OFF);
        for (;;)
                pause();
}
