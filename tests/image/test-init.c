/* test-init: PID 1 of the vm-manager test image (tests/image/build.sh puts it in the UKI's
 * initramfs as /init). Built with gcc -static -Os; it needs nothing else in the initramfs but
 * the kernel modules listed in /modules/order.
 *
 * One image, two boots:
 * - installer boot (a credential vm.install-target, the kernel command line test_vm.phase=install,
 *   or both virtio disks "installer" and "target" present): copies the installer disk onto the
 *   target, prints "install: copied N bytes" and powers off (QEMU runs with -no-reboot).
 * - installed boot (anything else): takes a DHCP lease on the first Ethernet interface and
 *   prints it, GETs the IMDS keys hostname and instance-id from 169.254.169.254 and prints them
 *   (at most 20 s for all of it; without a NIC, nothing), then sends READY=1 to the host over
 *   AF_VSOCK the way systemd's PID 1 does for the credential
 *   vmm.notify_socket=vsock-stream:CID:PORT, then waits for the ACPI power button and powers off.
 *
 * Credentials come from SMBIOS type 11 strings "io.systemd.credential:NAME=VALUE" and
 * "io.systemd.credential.binary:NAME=BASE64" (/sys/firmware/dmi/entries/11-*\/raw).
 * Every step is printed to /dev/console with the time since boot. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <linux/input.h>
#include <linux/vm_sockets.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
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

static void send_notify(const char *msg) {
        const char *spec = cred("vmm.notify_socket");
        unsigned cid, port;
        int type;

        if (!spec || !*spec) {
                say("notify: no vmm.notify_socket credential; not sending %s", msg);
                return;
        }
        if (parse_notify_socket(spec, &type, &cid, &port) < 0) {
                say("notify: unsupported vmm.notify_socket '%s'", spec);
                return;
        }
        for (int i = 1; i <= NOTIFY_CONNECT_TRIES; i++) {
                say("notify: sending %s to vsock cid %u port %u (try %d)", msg, cid, port, i);
                if (notify_once(type, cid, port, msg) == 0)
                        return;
                usleep(250000);
        }
        say("notify: giving up");
}

/* The same message systemd's PID 1 sends when the boot is complete. */
static void send_ready(void) {
        send_notify("READY=1\nSTATUS=Ready.");
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

/* ---- the network: a DHCP lease, then two IMDS keys ----
 *
 * vm-manager links the VM's virtio-net NIC to its network's switch, which answers DHCP from the
 * VM's static lease and forwards TCP to 169.254.169.254:80 to the VM's own metadata service. The
 * installed boot takes the lease (DISCOVER/OFFER/REQUEST/ACK on a UDP socket bound to the NIC:
 * Linux sends from 0.0.0.0 and takes in broadcasts on an interface without an address), sets the
 * address, mask, MTU and default route with ioctls and GETs two IMDS keys, before READY=1, so the
 * host may rely on it once the VM is ready. All of it shares one budget: a VM without a NIC, or
 * with a NIC nothing answers on, prints why and sends READY=1 anyway. */

#define NET_BUDGET_MS 20000   /* the most networking ever holds READY=1 back */
#define NET_NIC_WAIT_MS 2000  /* for the interface of a virtio-net device to appear */
#define DHCP_RETRY_MIN_MS 500 /* then doubled, up to DHCP_RETRY_MAX_MS */
#define DHCP_RETRY_MAX_MS 2000
#define DHCP_BOOTP_LEN 236 /* the fixed BOOTP header, then the magic cookie and the options */
#define DHCP_MIN_LEN 300
#define DHCP_MAX_LEN 1500
#define IMDS_ADDRESS "169.254.169.254"
#define IMDS_BASE_PATH "/giantswarm/v1"
#define HTTP_MAX_REPLY 8192

enum {
        DHCP_DISCOVER = 1,
        DHCP_OFFER = 2,
        DHCP_REQUEST = 3,
        DHCP_ACK = 5,
        DHCP_NAK = 6,
};

static const uint8_t dhcp_cookie[4] = { 99, 130, 83, 99 };

struct dhcp_lease {
        struct in_addr addr, mask, router, server;
        unsigned mtu;     /* option 26, 0 when absent */
        uint32_t lease_s; /* option 51 */
        char domain[256]; /* option 15, "" when absent */
};

/* Milliseconds left until deadline (an uptime()), 0 once it passed. */
static int ms_left(double deadline) {
        double ms = (deadline - uptime()) * 1000;

        return ms <= 0 ? 0 : ms > 3600000 ? 3600000 : (int) ms + 1;
}

/* Whether a virtio device of type 1 (network) is on the virtio bus. */
static bool have_virtio_net(void) {
        char path[300], id[32];
        struct dirent *de;
        bool found = false;
        DIR *d;

        d = opendir("/sys/bus/virtio/devices");
        while (d && !found && (de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "/sys/bus/virtio/devices/%s/device", de->d_name);
                if (read_file(path, id, sizeof(id)) < 0)
                        continue;
                chomp(id);
                found = strcmp(id, "0x0001") == 0;
        }
        if (d)
                closedir(d);
        return found;
}

/* The first (by name) Ethernet interface in /sys/class/net: eth0 here, as there is no udev to
 * rename it. Returns 0 and the name, or -1. */
static int find_ethernet(char name[static IFNAMSIZ]) {
        char path[300], type[16];
        struct dirent *de;
        DIR *d;

        name[0] = '\0';
        d = opendir("/sys/class/net");
        while (d && (de = readdir(d))) {
                if (de->d_name[0] == '.' || strlen(de->d_name) >= IFNAMSIZ)
                        continue;
                snprintf(path, sizeof(path), "/sys/class/net/%s/type", de->d_name);
                if (read_file(path, type, sizeof(type)) < 0)
                        continue;
                chomp(type);
                if (strcmp(type, "1") != 0) /* ARPHRD_ETHER */
                        continue;
                if (!name[0] || strcmp(de->d_name, name) < 0)
                        snprintf(name, IFNAMSIZ, "%.*s", IFNAMSIZ - 1, de->d_name);
        }
        if (d)
                closedir(d);
        return name[0] ? 0 : -1;
}

static void ifreq_init(struct ifreq *ifr, const char *ifname) {
        memset(ifr, 0, sizeof(*ifr));
        snprintf(ifr->ifr_name, sizeof(ifr->ifr_name), "%s", ifname);
}

static int if_set_addr(int fd, const char *ifname, unsigned long request, struct in_addr a) {
        struct ifreq ifr;
        struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr = a };

        ifreq_init(&ifr, ifname);
        memcpy(&ifr.ifr_addr, &sin, sizeof(sin));
        return ioctl(fd, request, &ifr);
}

/* Brings ifname up and reads its MAC. */
static int link_up(int fd, const char *ifname, uint8_t mac[static 6]) {
        struct ifreq ifr;

        ifreq_init(&ifr, ifname);
        if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0) {
                say("net: SIOCGIFFLAGS %s: %s", ifname, strerror(errno));
                return -1;
        }
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0) {
                say("net: SIOCSIFFLAGS %s up: %s", ifname, strerror(errno));
                return -1;
        }
        ifreq_init(&ifr, ifname);
        if (ioctl(fd, SIOCGIFHWADDR, &ifr) < 0) {
                say("net: SIOCGIFHWADDR %s: %s", ifname, strerror(errno));
                return -1;
        }
        memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
        return 0;
}

/* A DISCOVER, or a REQUEST for the address and server of offer. Returns its length. */
static size_t dhcp_build(
        uint8_t buf[static DHCP_MIN_LEN],
        uint8_t type,
        uint32_t xid,
        const uint8_t mac[static 6],
        const struct dhcp_lease *offer) {
        static const uint8_t params[] = { 1, 3, 6, 15, 26, 51, 54, 119 };
        size_t o = DHCP_BOOTP_LEN;

        memset(buf, 0, DHCP_MIN_LEN);
        buf[0] = 1; /* BOOTREQUEST */
        buf[1] = 1; /* Ethernet */
        buf[2] = 6;
        memcpy(buf + 4, &xid, 4);
        buf[10] = 0x80; /* broadcast replies: there is no address to take a unicast on yet */
        memcpy(buf + 28, mac, 6);
        memcpy(buf + o, dhcp_cookie, sizeof(dhcp_cookie));
        o += sizeof(dhcp_cookie);
        buf[o++] = 53;
        buf[o++] = 1;
        buf[o++] = type;
        if (offer) {
                buf[o++] = 50;
                buf[o++] = 4;
                memcpy(buf + o, &offer->addr, 4);
                o += 4;
        }
        if (offer && offer->server.s_addr) {
                buf[o++] = 54;
                buf[o++] = 4;
                memcpy(buf + o, &offer->server, 4);
                o += 4;
        }
        buf[o++] = 55;
        buf[o++] = sizeof(params);
        memcpy(buf + o, params, sizeof(params));
        o += sizeof(params);
        buf[o++] = 255;
        return o < DHCP_MIN_LEN ? DHCP_MIN_LEN : o;
}

/* The message type of a reply to xid for mac (DHCP_OFFER, DHCP_ACK, DHCP_NAK, ...) with what it
 * says in ret, or -1 for anything else. */
static int dhcp_parse(
        const uint8_t *p, size_t len, uint32_t xid, const uint8_t mac[static 6], struct dhcp_lease *ret) {
        struct dhcp_lease l = {};
        int type = -1;

        if (len < DHCP_BOOTP_LEN + 4 || p[0] != 2 || memcmp(p + 4, &xid, 4) != 0 ||
            memcmp(p + 28, mac, 6) != 0 || memcmp(p + DHCP_BOOTP_LEN, dhcp_cookie, 4) != 0)
                return -1;
        memcpy(&l.addr, p + 16, 4);
        for (size_t i = DHCP_BOOTP_LEN + 4; i < len;) {
                uint8_t code = p[i], olen;
                const uint8_t *v;

                if (code == 0) {
                        i++;
                        continue;
                }
                if (code == 255 || len - i < 2 || len - i - 2 < p[i + 1])
                        break;
                olen = p[i + 1];
                v = p + i + 2;
                i += 2 + (size_t) olen;
                if (code == 53 && olen == 1)
                        type = v[0];
                else if (code == 1 && olen == 4)
                        memcpy(&l.mask, v, 4);
                else if (code == 3 && olen >= 4)
                        memcpy(&l.router, v, 4);
                else if (code == 54 && olen == 4)
                        memcpy(&l.server, v, 4);
                else if (code == 26 && olen == 2)
                        l.mtu = (unsigned) v[0] << 8 | v[1];
                else if (code == 51 && olen == 4)
                        l.lease_s = (uint32_t) v[0] << 24 | (uint32_t) v[1] << 16 | (uint32_t) v[2] << 8 |
                                v[3];
                else if (code == 15)
                        snprintf(l.domain, sizeof(l.domain), "%.*s", (int) olen, (const char *) v);
        }
        *ret = l;
        return type;
}

/* Broadcasts msg and waits for a reply of type want (or a NAK) to it, sending again after 0.5, 1,
 * 2, 2... s. Returns the type of the reply, or -1 when deadline passed. */
static int dhcp_exchange(
        int fd,
        const uint8_t *msg,
        size_t len,
        uint32_t xid,
        const uint8_t mac[static 6],
        int want,
        struct dhcp_lease *ret,
        double deadline) {
        struct sockaddr_in to = { .sin_family = AF_INET,
                                  .sin_port = htons(67),
                                  .sin_addr.s_addr = htonl(INADDR_BROADCAST) };
        int interval = DHCP_RETRY_MIN_MS;
        uint8_t buf[DHCP_MAX_LEN];

        while (ms_left(deadline) > 0) {
                double resend = uptime() + interval / 1000.0;

                if (sendto(fd, msg, len, 0, (struct sockaddr *) &to, sizeof(to)) < 0)
                        say("dhcp: sendto: %s", strerror(errno));
                for (;;) {
                        int wait = ms_left(resend) < ms_left(deadline) ? ms_left(resend) : ms_left(deadline);
                        struct pollfd pfd = { .fd = fd, .events = POLLIN };
                        ssize_t n;
                        int type;

                        if (wait <= 0)
                                break;
                        if (poll(&pfd, 1, wait) <= 0)
                                continue;
                        n = recv(fd, buf, sizeof(buf), 0);
                        if (n <= 0)
                                continue;
                        type = dhcp_parse(buf, (size_t) n, xid, mac, ret);
                        if (type == want || type == DHCP_NAK)
                                return type;
                }
                if (interval < DHCP_RETRY_MAX_MS)
                        interval *= 2;
        }
        return -1;
}

/* DISCOVER, OFFER, REQUEST, ACK on ifname; a NAK starts over. */
static int dhcp_run(const char *ifname, const uint8_t mac[static 6], struct dhcp_lease *ret, double deadline) {
        struct sockaddr_in local = { .sin_family = AF_INET, .sin_port = htons(68) };
        struct dhcp_lease offer, ack;
        uint8_t msg[DHCP_MIN_LEN + 64];
        uint32_t xid;
        int fd, one = 1, type, r = -1;
        size_t len;

        fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                say("dhcp: socket: %s", strerror(errno));
                return -1;
        }
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
            setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one)) < 0 ||
            setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname, (socklen_t) strlen(ifname) + 1) < 0 ||
            bind(fd, (struct sockaddr *) &local, sizeof(local)) < 0) {
                say("dhcp: setting up the socket on %s: %s", ifname, strerror(errno));
                goto out;
        }
        /* not random, but unique enough: no other client is on this port's link */
        xid = (uint32_t) mac[2] << 24 | (uint32_t) mac[3] << 16 | (uint32_t) mac[4] << 8 | mac[5];
        xid ^= (uint32_t) (uptime() * 1e6);
        while (ms_left(deadline) > 0) {
                xid++;
                len = dhcp_build(msg, DHCP_DISCOVER, xid, mac, NULL);
                type = dhcp_exchange(fd, msg, len, xid, mac, DHCP_OFFER, &offer, deadline);
                if (type != DHCP_OFFER)
                        continue;
                len = dhcp_build(msg, DHCP_REQUEST, xid, mac, &offer);
                type = dhcp_exchange(fd, msg, len, xid, mac, DHCP_ACK, &ack, deadline);
                if (type == DHCP_NAK) {
                        say("dhcp: NAK for %s, starting over", inet_ntoa(offer.addr));
                        continue;
                }
                if (type != DHCP_ACK)
                        continue;
                *ret = ack;
                r = 0;
                break;
        }
out:
        close(fd);
        return r;
}

static int mask_prefix(struct in_addr mask) {
        return __builtin_popcount(ntohl(mask.s_addr));
}

/* Address, mask, MTU and the default route from the lease. */
static int configure(int fd, const char *ifname, const struct dhcp_lease *l) {
        struct sockaddr_in any = { .sin_family = AF_INET }, gw = { .sin_family = AF_INET };
        struct rtentry rt = {};
        char dev[IFNAMSIZ];
        struct ifreq ifr;

        if (if_set_addr(fd, ifname, SIOCSIFADDR, l->addr) < 0) {
                say("net: SIOCSIFADDR %s: %s", inet_ntoa(l->addr), strerror(errno));
                return -1;
        }
        if (l->mask.s_addr && if_set_addr(fd, ifname, SIOCSIFNETMASK, l->mask) < 0) {
                say("net: SIOCSIFNETMASK %s: %s", inet_ntoa(l->mask), strerror(errno));
                return -1;
        }
        if (l->mtu >= 68) {
                ifreq_init(&ifr, ifname);
                ifr.ifr_mtu = (int) l->mtu;
                if (ioctl(fd, SIOCSIFMTU, &ifr) < 0)
                        say("net: SIOCSIFMTU %u: %s (continuing)", l->mtu, strerror(errno));
        }
        if (!l->router.s_addr)
                return 0;
        gw.sin_addr = l->router;
        snprintf(dev, sizeof(dev), "%s", ifname);
        memcpy(&rt.rt_dst, &any, sizeof(any));
        memcpy(&rt.rt_genmask, &any, sizeof(any));
        memcpy(&rt.rt_gateway, &gw, sizeof(gw));
        rt.rt_flags = RTF_UP | RTF_GATEWAY;
        rt.rt_dev = dev;
        if (ioctl(fd, SIOCADDRT, &rt) < 0 && errno != EEXIST) {
                say("net: SIOCADDRT default via %s: %s", inet_ntoa(l->router), strerror(errno));
                return -1;
        }
        return 0;
}

/* Waits until fd is ready for events or deadline passes. */
static bool wait_fd(int fd, short events, double deadline) {
        struct pollfd pfd = { .fd = fd, .events = events };
        int r;

        do
                r = poll(&pfd, 1, ms_left(deadline));
        while (r < 0 && errno == EINTR);
        return r > 0;
}

/* GET http://169.254.169.254<path> (HTTP/1.1, Connection: close). Returns the status and the body
 * in body (NUL-terminated, cut to size), or -1 after printing why. */
static int http_get(const char *path, char *body, size_t size, double deadline) {
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(80) };
        char req[512], *reply = NULL, *p;
        size_t got = 0, sent = 0, reqlen;
        int fd, err = 0, status = -1;
        socklen_t errlen = sizeof(err);
        ssize_t n;

        inet_pton(AF_INET, IMDS_ADDRESS, &sa.sin_addr);
        reqlen = (size_t) snprintf(
                req,
                sizeof(req),
                "GET %s HTTP/1.1\r\nHost: " IMDS_ADDRESS
                "\r\nUser-Agent: test-init\r\nConnection: close\r\n\r\n",
                path);
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
                say("imds: socket: %s", strerror(errno));
                return -1;
        }
        if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
                say("imds: connect " IMDS_ADDRESS ":80: %s", strerror(errno));
                goto out;
        }
        if (!wait_fd(fd, POLLOUT, deadline)) {
                say("imds: connect " IMDS_ADDRESS ":80: timed out");
                goto out;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen) < 0 || err) {
                say("imds: connect " IMDS_ADDRESS ":80: %s", strerror(err ?: errno));
                goto out;
        }
        while (sent < reqlen) {
                n = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
                if (n < 0 && (errno == EAGAIN || errno == EINTR) && wait_fd(fd, POLLOUT, deadline))
                        continue;
                if (n <= 0) {
                        say("imds: send: %s", n < 0 ? strerror(errno) : "nothing sent");
                        goto out;
                }
                sent += (size_t) n;
        }
        reply = malloc(HTTP_MAX_REPLY + 1);
        if (!reply)
                goto out;
        for (;;) {
                if (got == HTTP_MAX_REPLY)
                        break; /* the rest is cut */
                n = recv(fd, reply + got, HTTP_MAX_REPLY - got, 0);
                if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                        if (wait_fd(fd, POLLIN, deadline))
                                continue;
                        say("imds: GET %s: no complete reply in time", path);
                        goto out;
                }
                if (n < 0) {
                        say("imds: GET %s: recv: %s", path, strerror(errno));
                        goto out;
                }
                if (n == 0)
                        break;
                got += (size_t) n;
        }
        reply[got] = '\0';
        if (sscanf(reply, "HTTP/1.%*d %d", &status) != 1 || !(p = strstr(reply, "\r\n\r\n"))) {
                say("imds: GET %s: not an HTTP reply (%zu bytes)", path, got);
                status = -1;
                goto out;
        }
        snprintf(body, size, "%s", p + 4);
out:
        free(reply);
        close(fd);
        return status;
}

/* Prints imds NAME=VALUE for IMDS_BASE_PATH/NAME, with anything unprintable as '?'. */
static void imds_print(const char *name, double deadline) {
        char path[128], value[256];
        int status;

        snprintf(path, sizeof(path), IMDS_BASE_PATH "/%s", name);
        status = http_get(path, value, sizeof(value), deadline);
        if (status < 0)
                return;
        if (status != 200) {
                say("imds: GET %s: HTTP %d", path, status);
                return;
        }
        for (char *c = value; *c; c++)
                if ((unsigned char) *c < 0x20 || (unsigned char) *c >= 0x7f)
                        *c = '?';
        say("imds %s=%s", name, value);
}

static void net_setup(void) {
        double t0 = uptime(), deadline = t0 + NET_BUDGET_MS / 1000.0;
        char ifname[IFNAMSIZ], router[INET_ADDRSTRLEN], mtu[16] = "none";
        struct dhcp_lease lease;
        uint8_t mac[6];
        int fd = -1;

        if (!have_virtio_net()) {
                say("net: no virtio-net device, no network");
                return;
        }
        while (find_ethernet(ifname) < 0) {
                if (uptime() - t0 > NET_NIC_WAIT_MS / 1000.0) {
                        say("net: FAILED: a virtio-net device but no Ethernet interface");
                        return;
                }
                usleep(20000);
        }
        fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                say("net: socket: %s", strerror(errno));
                return;
        }
        if (link_up(fd, ifname, mac) < 0)
                goto out;
        say("net: %s (%02x:%02x:%02x:%02x:%02x:%02x) is up",
            ifname,
            mac[0],
            mac[1],
            mac[2],
            mac[3],
            mac[4],
            mac[5]);
        if (dhcp_run(ifname, mac, &lease, deadline) < 0) {
                say("net: FAILED: no DHCP lease on %s within %d ms", ifname, NET_BUDGET_MS);
                goto out;
        }
        snprintf(router, sizeof(router), "%s", lease.router.s_addr ? inet_ntoa(lease.router) : "none");
        if (lease.mtu)
                snprintf(mtu, sizeof(mtu), "%u", lease.mtu);
        say("dhcp lease %s/%d router %s mtu %s", inet_ntoa(lease.addr), mask_prefix(lease.mask), router, mtu);
        say("dhcp: from %s, lease time %" PRIu32 " s%s%s%s, after %.0f ms",
            inet_ntoa(lease.server),
            lease.lease_s,
            lease.domain[0] ? ", domain '" : "",
            lease.domain,
            lease.domain[0] ? "'" : "",
            (uptime() - t0) * 1000);
        if (configure(fd, ifname, &lease) < 0) {
                say("net: FAILED: configuring %s", ifname);
                goto out;
        }
        imds_print("hostname", deadline);
        imds_print("instance-id", deadline);
        say("net: done in %.0f ms", (uptime() - t0) * 1000);
out:
        close(fd);
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
        net_setup();
        /* The hostname "exit-70" plays a boot that failed: PID 1 exits with status 70 instead of
         * reporting ready, as the guest image does rather than wait in emergency mode. */
        const char *hostname = cred("firstboot.hostname");
        if (hostname && strcmp(hostname, "exit-70") == 0) {
                send_notify("EXIT_STATUS=70");
                power_off();
        }
        send_ready();
        wait_power_button();
        power_off();
        return 0;
}
