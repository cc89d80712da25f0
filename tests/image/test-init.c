/* test-init: PID 1 of the vm-manager test image (tests/image/build.sh puts it in the UKI's
 * initramfs as /init). Built with gcc -static -Os; it needs nothing else in the initramfs but
 * the kernel modules listed in /modules/order.
 *
 * One image, two boots:
 * - installer boot (a credential vm.install-target, the kernel command line test_vm.phase=install,
 *   or both virtio disks "installer" and "target" present): copies the installer disk onto the
 *   target, prints "install: copied N bytes" and powers off (QEMU runs with -no-reboot).
 * - installed boot (anything else): sends READY=1 to the host over AF_VSOCK the way systemd's
 *   PID 1 does for the credential vmm.notify_socket=vsock-stream:CID:PORT, then waits for the
 *   ACPI power button and powers off.
 *
 * Credentials come from SMBIOS type 11 strings "io.systemd.credential:NAME=VALUE" and
 * "io.systemd.credential.binary:NAME=BASE64" (/sys/firmware/dmi/entries/11-*\/raw).
 * Every step is printed to /dev/console with the time since boot. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/input.h>
#include <linux/vm_sockets.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_CREDS 64
#define MAX_DISKS 16
#define COPY_CHUNK (4u << 20)
#define NOTIFY_CONNECT_TRIES 20
#define NOTIFY_EOF_TIMEOUT_MS 30000

struct cred {
        char *name;
        char *value;
};

struct disk {
        char dev[32];    /* /dev/vda */
        char serial[64]; /* "" when none */
};

static struct cred creds[MAX_CREDS];
static size_t n_creds;
static struct disk disks[MAX_DISKS];
static size_t n_disks;
static char cmdline[4096];

static double uptime(void) {
        struct timespec ts;

        clock_gettime(CLOCK_BOOTTIME, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static void say(const char *fmt, ...) {
        char buf[1024];
        int n;
        va_list ap;

        n = snprintf(buf, sizeof(buf), "[%8.3f] test-init: ", uptime());
        va_start(ap, fmt);
        n += vsnprintf(buf + n, sizeof(buf) - (size_t) n - 2, fmt, ap);
        va_end(ap);
        if (n > (int) sizeof(buf) - 2)
                n = (int) sizeof(buf) - 2;
        buf[n++] = '\n';
        (void) !write(STDOUT_FILENO, buf, (size_t) n);
}

static void power_off(void) {
        say("sync and power off");
        sync();
        reboot(RB_POWER_OFF);
        say("reboot(RB_POWER_OFF) failed: %s", strerror(errno));
        for (;;)
                pause();
}

static void setup_console(void) {
        int fd;

        fd = open("/dev/console", O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (fd < 0)
                return;
        dup2(fd, STDIN_FILENO);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        if (fd > STDERR_FILENO)
                close(fd);
}

static void mount_one(const char *src, const char *dir, const char *type) {
        (void) mkdir(dir, 0755);
        if (mount(src, dir, type, MS_NOSUID | MS_NOEXEC, NULL) < 0 && errno != EBUSY)
                say("mount %s on %s: %s", type, dir, strerror(errno));
}

static ssize_t read_file(const char *path, char *buf, size_t size) {
        ssize_t n, total = 0;
        int fd;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -1;
        while ((size_t) total < size - 1) {
                n = read(fd, buf + total, size - 1 - (size_t) total);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                total += n;
        }
        close(fd);
        buf[total] = '\0';
        return total;
}

static void chomp(char *s) {
        size_t n = strlen(s);

        while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' '))
                s[--n] = '\0';
}

/* Loads the modules named in /modules/order, one file name per line, in that order (the
 * build resolved the order from the kernel's modules.dep). */
static void load_modules(void) {
        char list[4096], path[512], *line, *save = NULL;
        int fd, loaded = 0;
        double t0 = uptime();

        if (read_file("/modules/order", list, sizeof(list)) < 0) {
                say("no /modules/order: loading no modules");
                return;
        }
        for (line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (!*line)
                        continue;
                snprintf(path, sizeof(path), "/modules/%s", line);
                fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd < 0) {
                        say("module %s: %s", line, strerror(errno));
                        continue;
                }
                if (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST)
                        say("module %s: finit_module: %s", line, strerror(errno));
                else
                        loaded++;
                close(fd);
        }
        say("loaded %d modules in %.0f ms", loaded, (uptime() - t0) * 1000);
}

static int b64_value(char c) {
        if (c >= 'A' && c <= 'Z')
                return c - 'A';
        if (c >= 'a' && c <= 'z')
                return c - 'a' + 26;
        if (c >= '0' && c <= '9')
                return c - '0' + 52;
        if (c == '+' || c == '-')
                return 62;
        if (c == '/' || c == '_')
                return 63;
        return -1;
}

/* Decodes base64 in place; stops at the first character that is not base64 ('=' included). */
static void b64_decode(char *s) {
        unsigned acc = 0;
        int bits = 0, v;
        char *out = s;

        for (const char *in = s; *in; in++) {
                if (*in == '\n' || *in == '\r' || *in == ' ')
                        continue;
                v = b64_value(*in);
                if (v < 0)
                        break;
                acc = (acc << 6) | (unsigned) v;
                bits += 6;
                if (bits >= 8) {
                        bits -= 8;
                        *out++ = (char) ((acc >> bits) & 0xff);
                }
        }
        *out = '\0';
}

static void add_cred_string(const char *s) {
        static const char text[] = "io.systemd.credential:";
        static const char binary[] = "io.systemd.credential.binary:";
        const char *rest, *eq;
        bool is_binary;

        if (strncmp(s, text, strlen(text)) == 0) {
                rest = s + strlen(text);
                is_binary = false;
        } else if (strncmp(s, binary, strlen(binary)) == 0) {
                rest = s + strlen(binary);
                is_binary = true;
        } else {
                return;
        }
        eq = strchr(rest, '=');
        if (!eq || eq == rest || n_creds >= MAX_CREDS)
                return;
        creds[n_creds].name = strndup(rest, (size_t) (eq - rest));
        creds[n_creds].value = strdup(eq + 1);
        if (!creds[n_creds].name || !creds[n_creds].value)
                return;
        if (is_binary)
                b64_decode(creds[n_creds].value);
        n_creds++;
}

/* An SMBIOS structure: type, length, handle, then `length` bytes of formatted area in all,
 * then the string set (NUL-terminated strings, ended by an empty one). For type 11 (OEM
 * strings) every string is one entry. */
static void read_smbios_type11(void) {
        static char raw[65536];
        char path[300];
        struct dirent *de;
        ssize_t n;
        DIR *d;

        d = opendir("/sys/firmware/dmi/entries");
        if (!d) {
                say("no /sys/firmware/dmi/entries: %s", strerror(errno));
                return;
        }
        while ((de = readdir(d))) {
                if (strncmp(de->d_name, "11-", 3) != 0)
                        continue;
                snprintf(path, sizeof(path), "/sys/firmware/dmi/entries/%s/raw", de->d_name);
                n = read_file(path, raw, sizeof(raw));
                if (n < 5 || raw[0] != 11 || (unsigned char) raw[1] > n)
                        continue;
                for (ssize_t off = (unsigned char) raw[1]; off < n && raw[off];) {
                        add_cred_string(raw + off);
                        off += (ssize_t) strlen(raw + off) + 1;
                }
        }
        closedir(d);
        for (size_t i = 0; i < n_creds; i++)
                say("credential %s (%zu bytes)", creds[i].name, strlen(creds[i].value));
}

static const char *cred(const char *name) {
        for (size_t i = 0; i < n_creds; i++)
                if (strcmp(creds[i].name, name) == 0)
                        return creds[i].value;
        return NULL;
}

/* The value of KEY=... on the kernel command line, or NULL. */
static const char *cmdline_value(const char *key, char *buf, size_t size) {
        size_t klen = strlen(key);

        for (const char *p = cmdline; *p;) {
                size_t len = strcspn(p, " \t\n");

                if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
                        snprintf(buf, size, "%.*s", (int) (len - klen - 1), p + klen + 1);
                        return buf;
                }
                p += len;
                p += strspn(p, " \t\n");
        }
        return NULL;
}

static void scan_disks(void) {
        char path[300], serial[64];
        struct dirent *de;
        DIR *d;

        n_disks = 0;
        d = opendir("/sys/block");
        if (!d)
                return;
        while ((de = readdir(d)) && n_disks < MAX_DISKS) {
                if (strncmp(de->d_name, "vd", 2) != 0 || strlen(de->d_name) > 8)
                        continue;
                snprintf(disks[n_disks].dev, sizeof(disks[n_disks].dev), "/dev/%.20s", de->d_name);
                snprintf(path, sizeof(path), "/sys/block/%s/serial", de->d_name);
                if (read_file(path, serial, sizeof(serial)) < 0)
                        serial[0] = '\0';
                chomp(serial);
                snprintf(disks[n_disks].serial, sizeof(disks[n_disks].serial), "%s", serial);
                n_disks++;
        }
        closedir(d);
}

static const char *disk_by_serial(const char *serial) {
        for (size_t i = 0; i < n_disks; i++)
                if (strcmp(disks[i].serial, serial) == 0)
                        return disks[i].dev;
        return NULL;
}

/* /dev/disk/by-id/virtio-SERIAL (there is no udev here) or a plain device path. */
static const char *resolve_disk(const char *spec) {
        static const char by_id[] = "/dev/disk/by-id/virtio-";

        if (strncmp(spec, by_id, strlen(by_id)) == 0)
                return disk_by_serial(spec + strlen(by_id));
        if (access(spec, F_OK) == 0)
                return spec;
        return NULL;
}

static int write_all(int fd, const char *buf, size_t len) {
        while (len > 0) {
                ssize_t n = write(fd, buf, len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return -1;
                buf += n;
                len -= (size_t) n;
        }
        return 0;
}

static int copy_disk(const char *src, const char *dst) {
        uint64_t src_size = 0, dst_size = 0, done = 0;
        int in = -1, out = -1, ret = -1;
        double t0 = uptime();
        char *buf = NULL;
        ssize_t n;

        in = open(src, O_RDONLY | O_CLOEXEC);
        out = open(dst, O_WRONLY | O_CLOEXEC);
        if (in < 0 || out < 0) {
                say("install: open %s: %s", in < 0 ? src : dst, strerror(errno));
                goto out;
        }
        if (ioctl(in, BLKGETSIZE64, &src_size) < 0 || ioctl(out, BLKGETSIZE64, &dst_size) < 0) {
                say("install: BLKGETSIZE64: %s", strerror(errno));
                goto out;
        }
        say("install: copying %s (%llu bytes) onto %s (%llu bytes)",
            src,
            (unsigned long long) src_size,
            dst,
            (unsigned long long) dst_size);
        if (dst_size < src_size) {
                say("install: target is smaller than the installer image");
                goto out;
        }
        buf = malloc(COPY_CHUNK);
        if (!buf)
                goto out;
        while (done < src_size) {
                n = read(in, buf, COPY_CHUNK);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        say("install: read %s at %llu: %s",
                            src,
                            (unsigned long long) done,
                            n < 0 ? strerror(errno) : "end of device");
                        goto out;
                }
                if (write_all(out, buf, (size_t) n) < 0) {
                        say("install: write %s at %llu: %s", dst, (unsigned long long) done, strerror(errno));
                        goto out;
                }
                done += (uint64_t) n;
        }
        if (fsync(out) < 0) {
                say("install: fsync %s: %s", dst, strerror(errno));
                goto out;
        }
        say("install: copied %llu bytes in %.0f ms", (unsigned long long) done, (uptime() - t0) * 1000);
        ret = 0;
out:
        free(buf);
        if (in >= 0)
                close(in);
        if (out >= 0)
                close(out);
        return ret;
}

/* vmm.notify_socket: "vsock-stream:CID:PORT", "vsock-seqpacket:CID:PORT" or "vsock:CID:PORT"
 * (systemd tries datagram first for the last; vsock has no datagrams under QEMU, so stream). */
static int parse_notify_socket(const char *s, int *type, unsigned *cid, unsigned *port) {
        const char *rest;
        char *end;
        unsigned long c, p;

        if (strncmp(s, "vsock-stream:", 13) == 0) {
                *type = SOCK_STREAM;
                rest = s + 13;
        } else if (strncmp(s, "vsock-seqpacket:", 16) == 0) {
                *type = SOCK_SEQPACKET;
                rest = s + 16;
        } else if (strncmp(s, "vsock:", 6) == 0) {
                *type = SOCK_STREAM;
                rest = s + 6;
        } else {
                return -1;
        }
        errno = 0;
        c = strtoul(rest, &end, 10);
        if (errno || end == rest || *end != ':')
                return -1;
        rest = end + 1;
        p = strtoul(rest, &end, 10);
        if (errno || end == rest || *end || c > UINT32_MAX || p > UINT32_MAX)
                return -1;
        *cid = (unsigned) c;
        *port = (unsigned) p;
        return 0;
}

/* What systemd's sd_notify does for an AF_VSOCK stream: bind a privileged source port (1023
 * down), connect, write the message, shut down the write side and wait for EOF from the host. */
static int notify_once(int type, unsigned cid, unsigned port, const char *msg) {
        struct sockaddr_vm local = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = 1023 };
        struct sockaddr_vm peer = { .svm_family = AF_VSOCK, .svm_cid = cid, .svm_port = port };
        struct pollfd pfd;
        char c;
        int fd, r;
        ssize_t n;

        fd = socket(AF_VSOCK, type | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                say("notify: socket(AF_VSOCK): %s", strerror(errno));
                return -1;
        }
        while ((r = bind(fd, (struct sockaddr *) &local, sizeof(local))) < 0 && errno == EADDRINUSE &&
               --local.svm_port > 0)
                ;
        if (r < 0)
                say("notify: bind to a privileged port: %s (continuing)", strerror(errno));
        if (connect(fd, (struct sockaddr *) &peer, sizeof(peer)) < 0) {
                say("notify: connect vsock %u:%u: %s", cid, port, strerror(errno));
                close(fd);
                return -1;
        }
        if (write_all(fd, msg, strlen(msg)) < 0) {
                say("notify: write: %s", strerror(errno));
                close(fd);
                return -1;
        }
        if (shutdown(fd, SHUT_WR) < 0)
                say("notify: shutdown(SHUT_WR): %s", strerror(errno));
        say("notify: sent from port %u, waiting for the host to close", local.svm_port);
        pfd = (struct pollfd){ .fd = fd, .events = POLLIN };
        r = poll(&pfd, 1, NOTIFY_EOF_TIMEOUT_MS);
        if (r == 0) {
                say("notify: host did not close within %d ms; going on", NOTIFY_EOF_TIMEOUT_MS);
        } else if (r > 0) {
                n = recv(fd, &c, 1, MSG_NOSIGNAL);
                if (n > 0)
                        say("notify: unexpected data from the host");
                else if (n < 0)
                        say("notify: waiting for EOF: %s", strerror(errno));
                else
                        say("notify: host closed the connection");
        }
        close(fd);
        return 0;
}

static void send_ready(void) {
        /* The same message systemd's PID 1 sends when the boot is complete. */
        static const char msg[] = "READY=1\nSTATUS=Ready.";
        const char *spec = cred("vmm.notify_socket");
        unsigned cid, port;
        int type;

        if (!spec || !*spec) {
                say("notify: no vmm.notify_socket credential; not sending READY=1");
                return;
        }
        if (parse_notify_socket(spec, &type, &cid, &port) < 0) {
                say("notify: unsupported vmm.notify_socket '%s'", spec);
                return;
        }
        for (int i = 1; i <= NOTIFY_CONNECT_TRIES; i++) {
                say("notify: sending READY=1 to vsock cid %u port %u (try %d)", cid, port, i);
                if (notify_once(type, cid, port, msg) == 0)
                        return;
                usleep(250000);
        }
        say("notify: giving up");
}

static struct pollfd buttons[8];
static nfds_t n_buttons;

/* Opens every input device called "Power Button" (the ACPI button driver registers one for
 * the fixed power button and one per PNP0C0C device). Done before READY=1 is sent: an event
 * device queues key presses from the moment it is opened, so a system_powerdown that the host
 * sends right after it saw READY=1 is not lost. */
static void open_power_buttons(void) {
        char path[300], name[128];
        struct dirent *de;
        DIR *d;

        d = opendir("/sys/class/input");
        while (d && (de = readdir(d)) && n_buttons < 8) {
                if (strncmp(de->d_name, "event", 5) != 0)
                        continue;
                snprintf(path, sizeof(path), "/sys/class/input/%s/device/name", de->d_name);
                if (read_file(path, name, sizeof(name)) < 0)
                        continue;
                chomp(name);
                if (strcmp(name, "Power Button") != 0)
                        continue;
                snprintf(path, sizeof(path), "/dev/input/%s", de->d_name);
                buttons[n_buttons].fd = open(path, O_RDONLY | O_CLOEXEC);
                if (buttons[n_buttons].fd < 0) {
                        say("open %s: %s", path, strerror(errno));
                        continue;
                }
                buttons[n_buttons].events = POLLIN;
                say("watching %s (%s)", path, name);
                n_buttons++;
        }
        if (d)
                closedir(d);
        if (n_buttons == 0)
                say("no power button input device found");
}

/* Waits for KEY_POWER from one of the opened power buttons. */
static void wait_power_button(void) {
        struct input_event ev;

        if (n_buttons == 0) {
                say("no power button to wait for; waiting forever");
                for (;;)
                        pause();
        }
        say("waiting for the ACPI power button");
        for (;;) {
                if (poll(buttons, n_buttons, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        say("poll: %s", strerror(errno));
                        for (;;)
                                pause();
                }
                for (nfds_t i = 0; i < n_buttons; i++) {
                        if (!(buttons[i].revents & POLLIN))
                                continue;
                        if (read(buttons[i].fd, &ev, sizeof(ev)) != (ssize_t) sizeof(ev))
                                continue;
                        if (ev.type == EV_KEY && ev.code == KEY_POWER && ev.value == 1) {
                                say("power button pressed");
                                return;
                        }
                }
        }
}

static bool decide_install(const char **src, const char **dst) {
        char val[64];
        const char *phase = cmdline_value("test_vm.phase", val, sizeof(val));
        const char *target = cred("vm.install-target");
        bool install;

        if (phase)
                install = strcmp(phase, "install") == 0;
        else
                install = target || (disk_by_serial("installer") && disk_by_serial("target"));
        if (!install)
                return false;
        *src = disk_by_serial("installer");
        *dst = target ? resolve_disk(target) : disk_by_serial("target");
        return true;
}

int main(void) {
        const char *src = NULL, *dst = NULL;
        char release[128];

        mount_one("devtmpfs", "/dev", "devtmpfs");
        setup_console();
        mount_one("proc", "/proc", "proc");
        mount_one("sysfs", "/sys", "sysfs");
        if (read_file("/proc/sys/kernel/osrelease", release, sizeof(release)) < 0)
                release[0] = '\0';
        chomp(release);
        say("started as PID %d, kernel %s", (int) getpid(), release);
        if (read_file("/proc/cmdline", cmdline, sizeof(cmdline)) < 0)
                cmdline[0] = '\0';
        chomp(cmdline);
        say("cmdline: %s", cmdline);

        load_modules();
        read_smbios_type11();
        scan_disks();
        for (size_t i = 0; i < n_disks; i++)
                say("disk %s serial '%s'", disks[i].dev, disks[i].serial);

        if (decide_install(&src, &dst)) {
                say("phase: install");
                if (!src || !dst) {
                        say("install: FAILED: installer disk %s, target disk %s",
                            src ? src : "missing",
                            dst ? dst : "missing");
                } else if (copy_disk(src, dst) == 0) {
                        power_off();
                } else {
                        say("install: FAILED");
                }
                /* A failed install must not look like a finished one (a clean exit of QEMU):
                 * keep running until the host gives up or presses the power button. */
                open_power_buttons();
                wait_power_button();
                power_off();
        }

        say("phase: boot");
        printf("\n=== vm-manager test VM: installed boot, kernel %s ===\n\n", release);
        fflush(stdout);
        open_power_buttons();
        send_ready();
        wait_power_button();
        power_off();
        return 0;
}
