/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* `vm-manager firmware-run` (hidden): one firmware run, in a process of its own (manager-firmware.h).
 * It blocks on its swtpm and its QEMU, which is why it is not the daemon. Both are its children
 * with SIGKILL as their parent-death signal, so they end with it whatever ends it (the daemon's
 * time limit is a SIGKILL). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attest-fwlog.h"
#include "attest-predict.h"
#include "fs-util.h"
#include "json-util.h"
#include "manager-firmware.h"
#include "parse-util.h"
#include "process-util.h"
#include "time-util.h"

#ifndef VMM_LIBEXECDIR
#        define VMM_LIBEXECDIR "/usr/libexec"
#endif

#define FWLOG_INIT "vm-manager-fwlog-init"
/* QEMU gets this long; the daemon's own limit (FIRMWARE_RUN_TIMEOUT_USEC) is longer. */
#define QEMU_TIMEOUT_USEC (150 * USEC_PER_SEC)
#define SWTPM_SOCKET_WAIT_USEC (5 * USEC_PER_SEC)
#define CONSOLE_MAX ((size_t) 8 << 20)
#define KERNEL_MAX ((size_t) 256 << 20)
#define INIT_MAX ((size_t) 16 << 20)
/* A UKI carries its kernel, initrd and more: ours are about 60 MiB. */
#define UKI_MAX ((size_t) 1 << 30)

static int fail(const char *format, ...) _printf_(1, 2);
static int fail(const char *format, ...) {
        va_list ap;

        fputs("firmware run: ", stderr);
        va_start(ap, format);
        vfprintf(stderr, format, ap);
        va_end(ap);
        fputs("\n", stderr);
        return EXIT_FAILURE;
}

/* Whether the kernel's build configuration (/boot/config-<version>) has what the run needs: the
 * EFI stub (OVMF loads the kernel as an EFI application, and the stub hands the firmware's event
 * log over), the CRB TPM driver and securityfs built in (the initramfs has no modules). */
static bool kernel_config_fits(const char *config) {
        static const char *const need[] = { "CONFIG_EFI_STUB=y", "CONFIG_TCG_CRB=y", "CONFIG_SECURITYFS=y" };
        _cleanup_free_ char *text = NULL;

        if (read_full_file(config, 4U << 20, &text, NULL) < 0)
                return false;
        for (size_t i = 0; i < ELEMENTSOF(need); i++) {
                const char *p = text;
                bool found = false;

                while ((p = strstr(p, need[i]))) {
                        if ((p == text || p[-1] == '\n') &&
                            (p[strlen(need[i])] == '\n' || !p[strlen(need[i])])) {
                                found = true;
                                break;
                        }
                        p++;
                }
                if (!found)
                        return false;
        }
        return true;
}

/* $VM_MANAGER_FIRMWARE_KERNEL, else the newest readable /boot/vmlinuz-<version> whose config fits. */
static char *find_kernel(void) {
        _cleanup_free_ char *best = NULL;
        const char *env = secure_getenv("VM_MANAGER_FIRMWARE_KERNEL");
        DIR *d;
        struct dirent *de;

        if (env && *env)
                return strdup(env);
        d = opendir("/boot");
        if (!d)
                return NULL;
        while ((de = readdir(d))) {
                _cleanup_free_ char *kernel = NULL, *config = NULL;
                const char *version;

                if (strncmp(de->d_name, "vmlinuz-", 8) != 0)
                        continue;
                version = de->d_name + 8;
                if (asprintf(&kernel, "/boot/%s", de->d_name) < 0 ||
                    asprintf(&config, "/boot/config-%s", version) < 0)
                        break;
                if (access(kernel, R_OK) < 0 || !kernel_config_fits(config))
                        continue;
                if (!best || strverscmp(kernel, best) > 0) {
                        free(best);
                        best = TAKE_PTR(kernel);
                }
        }
        closedir(d);
        return TAKE_PTR(best);
}

int firmware_run_uki_kernel(const char *image_dir, const char *out, char **ret_source) {
        _cleanup_free_ char *best = NULL, *data = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        const uint8_t *linux_data;
        size_t size = 0, linux_size = 0;
        struct dirent *de;
        struct timespec newest = {};
        int r;

        assert_return(image_dir && out && ret_source, -EINVAL);

        d = opendir(image_dir);
        if (!d)
                return -errno;
        /* The newest UKI: the image a VM is most likely to boot, and the kernel most likely to
         * have what the run needs; every image of this project has it (EFI stub, CRB TPM driver
         * and securityfs built in). */
        while ((de = readdir(d))) {
                _cleanup_free_ char *path = NULL;
                struct stat st;
                size_t n = strlen(de->d_name);

                if (n <= 4 || !streq(de->d_name + n - 4, ".efi") || de->d_name[0] == '.')
                        continue;
                if (asprintf(&path, "%s/%s", image_dir, de->d_name) < 0)
                        return -ENOMEM;
                if (stat(path, &st) < 0 || !S_ISREG(st.st_mode) || access(path, R_OK) < 0)
                        continue;
                if (best &&
                    (st.st_mtim.tv_sec < newest.tv_sec ||
                     (st.st_mtim.tv_sec == newest.tv_sec && st.st_mtim.tv_nsec <= newest.tv_nsec)))
                        continue;
                free(best);
                best = TAKE_PTR(path);
                newest = st.st_mtim;
        }
        if (!best)
                return -ENOENT;
        r = read_full_file(best, UKI_MAX, &data, &size);
        if (r < 0)
                return r;
        r = attest_pe_section((const uint8_t *) data, size, ".linux", &linux_data, &linux_size);
        if (r < 0)
                return r == -ENOENT ? -ENOEXEC : r;
        r = write_file_atomic(out, linux_data, linux_size, 0600);
        if (r < 0)
                return r;
        if (asprintf(ret_source, "%s (.linux)", best) < 0)
                return -ENOMEM;
        return 0;
}

/* $VM_MANAGER_FWLOG_INIT, else beside our own executable (the build tree), else in libexecdir. */
static char *find_init(void) {
        const char *env = secure_getenv("VM_MANAGER_FWLOG_INIT");
        char self[4096];
        ssize_t n;
        char *p = NULL;

        if (env && *env)
                return strdup(env);
        n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n > 0) {
                self[n] = 0;
                if (asprintf(&p, "%s/" FWLOG_INIT, dirname(self)) < 0)
                        return NULL;
                if (access(p, R_OK) == 0)
                        return p;
                free(p);
        }
        return strdup(VMM_LIBEXECDIR "/" FWLOG_INIT);
}

static int cpio_entry(FILE *f, const char *name, uint32_t mode, const void *data, size_t size) {
        static const char zeros[4] = {};
        size_t namesize = strlen(name) + 1;

        /* newc: "070701", then 13 fields of 8 hex digits; the name and the data each padded to 4 */
        fprintf(f,
                "070701%08X%08X%08X%08X%08X%08X%08zX%08X%08X%08X%08X%08zX%08X",
                1U,
                mode,
                0U,
                0U,
                1U,
                0U,
                size,
                0U,
                0U,
                0U,
                0U,
                namesize,
                0U);
        fwrite(name, 1, namesize, f);
        fwrite(zeros, 1, (4 - (110 + namesize) % 4) % 4, f);
        if (size > 0)
                fwrite(data, 1, size, f);
        fwrite(zeros, 1, (4 - size % 4) % 4, f);
        return ferror(f) ? -EIO : 0;
}

/* An initramfs of one file, /init; the program makes /dev, /sys and the rest itself. */
static int write_initramfs(const char *path, const char *init) {
        _cleanup_free_ char *data = NULL;
        _cleanup_fclose_ FILE *f = NULL;
        size_t size = 0;
        int r;

        r = read_full_file(init, INIT_MAX, &data, &size);
        if (r < 0)
                return r;
        f = fopen(path, "we");
        if (!f)
                return -errno;
        r = cpio_entry(f, "init", 0100755, data, size);
        if (r >= 0)
                r = cpio_entry(f, "TRAILER!!!", 0, NULL, 0);
        if (r >= 0 && fflush(f) != 0)
                r = -errno;
        return r;
}

/* Waits up to timeout for pid; *ret_status its wait status. -ETIMEDOUT when it is still running. */
static int wait_for(pid_t pid, usec_t timeout, int *ret_status) {
        usec_t end = now_usec(CLOCK_MONOTONIC) + timeout;

        for (;;) {
                pid_t k = waitpid(pid, ret_status, WNOHANG);

                if (k == pid)
                        return 0;
                if (k < 0 && errno != EINTR)
                        return -errno;
                if (now_usec(CLOCK_MONOTONIC) >= end)
                        return -ETIMEDOUT;
                (void) nanosleep(&(struct timespec){ .tv_nsec = 100 * 1000 * 1000 }, NULL);
        }
}

static void end_child(pid_t pid) {
        if (pid <= 0)
                return;
        (void) kill(pid, SIGKILL);
        (void) waitpid(pid, NULL, 0);
}

typedef struct Run {
        const char *out, *code, *vars, *accel, *sha256;
        uint64_t memory_mib;
        unsigned cpus;
        char *work;
        pid_t swtpm, qemu;
} Run;

static void run_done(Run *r) {
        end_child(r->qemu);
        end_child(r->swtpm);
        if (r->work) {
                (void) rm_rf(r->work);
                free(r->work);
        }
}

static char *work_path(const Run *r, const char *name) {
        char *p = NULL;

        return asprintf(&p, "%s/%s", r->work, name) < 0 ? NULL : p;
}

static int boot(Run *r, const char *kernel, const char *initrd, char **ret_console, size_t *ret_size) {
        _cleanup_free_ char *tpm = work_path(r, "tpm"), *sock = work_path(r, "swtpm.sock"),
                            *vars = work_path(r, "vars.fd"), *console = work_path(r, "console.log"),
                            *vars_data = NULL, *tpmstate = NULL, *ctrl = NULL, *chardev = NULL,
                            *code_drive = NULL, *vars_drive = NULL, *serial = NULL, *mem = NULL, *smp = NULL;
        size_t vars_size = 0;
        int status = 0, k;

        if (!tpm || !sock || !vars || !console)
                return fail("out of memory");
        k = read_full_file(r->vars, 64U << 20, &vars_data, &vars_size);
        if (k < 0)
                return fail("cannot read the variable store template %s: %s", r->vars, strerror(-k));
        k = write_file_atomic(vars, vars_data, vars_size, 0600);
        if (k < 0 || mkdir(tpm, 0700) < 0)
                return fail("cannot prepare %s: %s", r->work, strerror(k < 0 ? -k : errno));

        if (asprintf(&tpmstate, "dir=%s", tpm) < 0 || asprintf(&ctrl, "type=unixio,path=%s", sock) < 0 ||
            asprintf(&chardev, "socket,id=chrtpm,path=%s", sock) < 0 ||
            asprintf(&code_drive, "if=pflash,format=raw,unit=0,readonly=on,file=%s", r->code) < 0 ||
            asprintf(&vars_drive, "if=pflash,format=raw,unit=1,file=%s", vars) < 0 ||
            asprintf(&serial, "file:%s", console) < 0 || asprintf(&mem, "%" PRIu64 "M", r->memory_mib) < 0 ||
            asprintf(&smp, "%u", r->cpus) < 0)
                return fail("out of memory");

        char *swtpm_argv[] = {
                (char *) "swtpm",
                (char *) "socket",
                (char *) "--tpm2",
                (char *) "--tpmstate",
                tpmstate,
                (char *) "--ctrl",
                ctrl,
                (char *) "--terminate",
                NULL,
        };
        r->swtpm = process_fork_exec(swtpm_argv, STDERR_FILENO);
        if (r->swtpm < 0)
                return fail("cannot fork: %s", strerror((int) -r->swtpm));
        for (usec_t end = now_usec(CLOCK_MONOTONIC) + SWTPM_SOCKET_WAIT_USEC; access(sock, F_OK) < 0;) {
                if (waitpid(r->swtpm, &status, WNOHANG) == r->swtpm) {
                        r->swtpm = 0;
                        return fail("swtpm exited before it listened");
                }
                if (now_usec(CLOCK_MONOTONIC) >= end)
                        return fail("swtpm did not listen on %s within 5 s", sock);
                (void) nanosleep(&(struct timespec){ .tv_nsec = 50 * 1000 * 1000 }, NULL);
        }

        /* The machine of a VM (src/vm/vm-cmdline.c), as far as the firmware's measurements can
         * tell: q35, the accelerator and CPU model, -m and -smp, the two flash drives, tpm-crb.
         * Disks, NICs (romfile= empty: no option ROM) and SMBIOS strings measure nothing before
         * the separators. */
        bool tcg = streq(r->accel, "tcg");
        char *qemu_argv[] = {
                (char *) "qemu-system-x86_64",
                (char *) "-machine",
                (char *) "q35",
                (char *) "-accel",
                (char *) (tcg ? "tcg,thread=multi" : "kvm"),
                (char *) "-cpu",
                (char *) (tcg ? "max" : "host"),
                (char *) "-smp",
                smp,
                (char *) "-m",
                mem,
                (char *) "-nodefaults",
                (char *) "-no-reboot",
                (char *) "-display",
                (char *) "none",
                (char *) "-monitor",
                (char *) "none",
                (char *) "-serial",
                serial,
                (char *) "-drive",
                code_drive,
                (char *) "-drive",
                vars_drive,
                (char *) "-chardev",
                chardev,
                (char *) "-tpmdev",
                (char *) "emulator,id=tpm0,chardev=chrtpm",
                (char *) "-device",
                (char *) "tpm-crb,tpmdev=tpm0",
                (char *) "-smbios",
                (char *) "type=1,manufacturer=GiantSwarm,product=vm-manager,serial=firmware-run",
                (char *) "-kernel",
                (char *) kernel,
                (char *) "-initrd",
                (char *) initrd,
                (char *) "-append",
                (char *) "console=ttyS0 quiet panic=-1 rdinit=/init",
                NULL,
        };
        r->qemu = process_fork_exec(qemu_argv, STDERR_FILENO);
        if (r->qemu < 0)
                return fail("cannot fork: %s", strerror((int) -r->qemu));
        k = wait_for(r->qemu, QEMU_TIMEOUT_USEC, &status);
        if (k == -ETIMEDOUT)
                return fail(
                        "QEMU did not power off within %u s", (unsigned) (QEMU_TIMEOUT_USEC / USEC_PER_SEC));
        if (k < 0)
                return fail("waiting for QEMU: %s", strerror(-k));
        r->qemu = 0;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                return fail("QEMU ended with status %d", status);

        k = read_full_file(console, CONSOLE_MAX, ret_console, ret_size);
        if (k < 0)
                return fail("cannot read the console %s: %s", console, strerror(-k));
        return 0;
}

int firmware_run_main(int argc, char **argv) {
        _cleanup_(run_done) Run r = {};
        _cleanup_free_ char *kernel = NULL, *uki_kernel = NULL, *init = NULL, *initrd = NULL,
                            *console = NULL, *why = NULL, *text = NULL;
        const char *image_dir;
        _cleanup_free_ uint8_t *log = NULL;
        _cleanup_(attest_firmware_expect_done) AttestFirmwareExpect fw = {};
        json_auto_t *o = NULL, *pcrs = NULL;
        char template[4096], at[RFC3339_MAX];
        size_t console_size = 0, log_size = 0;
        usec_t started = now_usec(CLOCK_MONOTONIC);
        uint32_t cpus;
        int k;

        if ((argc != 7 && argc != 8) || safe_atou64(argv[3], &r.memory_mib) < 0 ||
            safe_atou32(argv[4], &cpus) < 0 || r.memory_mib == 0 || cpus == 0 || strlen(argv[0]) > 4000) {
                fprintf(stderr,
                        "usage: vm-manager firmware-run OUT CODE VARS MEMORY_MIB CPUS ACCEL SHA256 [IMAGE_DIR]\n");
                return 2;
        }
        image_dir = argc == 8 ? argv[7] : NULL;
        r.out = argv[0];
        r.code = argv[1];
        r.vars = argv[2];
        r.cpus = cpus;
        r.accel = argv[5];
        r.sha256 = argv[6];

        kernel = find_kernel();
        init = find_init();
        if (!init || access(init, R_OK) < 0)
                return fail(
                        "%s is missing: install vm-manager completely (or set VM_MANAGER_FWLOG_INIT)",
                        init ?: FWLOG_INIT);

        /* The scratch directory sits beside the result, in the state directory, under a short name:
         * swtpm's socket in it is a unix socket path (at most 107 bytes), which the cache entry's
         * name (a SHA-256 in hex) would overflow. */
        {
                const char *slash = strrchr(r.out, '/');
                int n = slash ? (int) (slash - r.out) : 1;

                (void) snprintf(template, sizeof(template), "%.*s/run.XXXXXX", n, slash ? r.out : ".");
        }
        if (!mkdtemp(template))
                return fail("cannot make a directory beside %s: %s", r.out, strerror(errno));
        r.work = strdup(template);
        initrd = r.work ? work_path(&r, "initrd.cpio") : NULL;
        if (!initrd)
                return fail("out of memory");
        /* Without a kernel of the host's (a daemon in a container has no /boot), the kernel of an
         * image the daemon serves: its UKI's .linux. */
        if (!kernel && image_dir) {
                _cleanup_free_ char *copy = work_path(&r, "vmlinuz");

                if (!copy)
                        return fail("out of memory");
                k = firmware_run_uki_kernel(image_dir, copy, &kernel);
                if (k < 0 && k != -ENOENT)
                        return fail(
                                "cannot take the kernel of an image's UKI in %s: %s", image_dir, strerror(-k));
                if (k >= 0)
                        uki_kernel = TAKE_PTR(copy);
        }
        if (!kernel)
                return fail(
                        "no kernel to boot: no readable /boot/vmlinuz-* whose /boot/config-* has CONFIG_EFI_STUB, "
                        "CONFIG_TCG_CRB and CONFIG_SECURITYFS built in, and no image's UKI in %s (install "
                        "linux-image-cloud-amd64, add an image, or set VM_MANAGER_FIRMWARE_KERNEL)",
                        image_dir ?: "(no image directory)");
        k = write_initramfs(initrd, init);
        if (k < 0)
                return fail("cannot write the initramfs from %s: %s", init, strerror(-k));

        k = boot(&r, uki_kernel ?: kernel, initrd, &console, &console_size);
        if (k != 0)
                return k;
        k = attest_fwlog_parse(console, console_size, &log, &log_size, &why);
        if (k < 0)
                return fail("the console of the run: %s", why ?: strerror(-k));
        free(why);
        why = NULL;
        k = attest_firmware_expect_from_log(log, log_size, &fw, &why);
        if (k < 0)
                return fail("the event log of the run: %s", why ?: strerror(-k));

        format_rfc3339(now_usec(CLOCK_REALTIME), at);
        pcrs = attest_firmware_expect_to_json(&fw);
        o = json_pack(
                "{s:s,s:I,s:I,s:s,s:s,s:s,s:f,s:O}",
                "firmwareSha256",
                r.sha256,
                "memoryMiB",
                (json_int_t) r.memory_mib,
                "cpus",
                (json_int_t) r.cpus,
                "accel",
                r.accel,
                "kernel",
                kernel,
                "ranAt",
                at,
                "seconds",
                (double) (now_usec(CLOCK_MONOTONIC) - started) / USEC_PER_SEC,
                "pcrs",
                pcrs);
        text = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
        if (!text)
                return fail("out of memory");
        k = write_file_atomic(r.out, text, strlen(text), 0644);
        if (k < 0)
                return fail("cannot write %s: %s", r.out, strerror(-k));
        return EXIT_SUCCESS;
}
