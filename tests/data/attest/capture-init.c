/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* capture-init: PID 1 of the guest boot-log.sh boots once to record a real firmware event log.
 * It prints, on the serial console, the TPM event log the kernel exposes
 * (/sys/kernel/security/tpm0/binary_bios_measurements) as "log:<hex>" lines of 32 bytes each,
 * then every sha256 PCR as the kernel reads it from the TPM ("pcr:<index>:<hex>"), then "done",
 * and powers off. boot-log.sh turns those lines back into firmware.log and firmware-pcrs.json.
 * Built by tests/image/build.sh in place of test-init.c (gcc -static). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <unistd.h>

static void say(const char *format, const char *detail) {
        printf(format, detail);
        fflush(stdout);
}

static void dump_log(void) {
        unsigned char buf[32];
        ssize_t n;
        int fd;

        fd = open("/sys/kernel/security/tpm0/binary_bios_measurements", O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                say("capture: no event log: %s\n", strerror(errno));
                return;
        }
        /* the file is a seq_file: short reads are normal, read until EOF */
        for (;;) {
                size_t got = 0;

                while (got < sizeof(buf) && (n = read(fd, buf + got, sizeof(buf) - got)) > 0)
                        got += (size_t) n;
                if (got == 0)
                        break;
                fputs("log:", stdout);
                for (size_t i = 0; i < got; i++)
                        printf("%02x", buf[i]);
                fputs("\n", stdout);
                if (got < sizeof(buf))
                        break;
        }
        fflush(stdout);
        close(fd);
}

static void dump_pcrs(void) {
        for (int i = 0; i < 24; i++) {
                char path[64], value[160];
                ssize_t n;
                int fd;

                snprintf(path, sizeof(path), "/sys/class/tpm/tpm0/pcr-sha256/%d", i);
                fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd < 0) {
                        say("capture: no %s\n", path);
                        continue;
                }
                n = read(fd, value, sizeof(value) - 1);
                close(fd);
                if (n <= 0)
                        continue;
                value[n] = 0;
                value[strcspn(value, "\n")] = 0;
                /* the kernel prints the value in upper case */
                for (char *p = value; *p; p++)
                        if (*p >= 'A' && *p <= 'F')
                                *p = (char) (*p - 'A' + 'a');
                printf("pcr:%d:%s\n", i, value);
        }
        fflush(stdout);
}

int main(void) {
        (void) mount("sysfs", "/sys", "sysfs", 0, NULL);
        (void) mount("securityfs", "/sys/kernel/security", "securityfs", 0, NULL);
        dump_log();
        dump_pcrs();
        say("capture: %s\n", "done");
        sync();
        (void) reboot(RB_POWER_OFF);
        for (;;)
                pause();
}
