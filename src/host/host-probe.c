/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "host-probe.h"
#include "log.h"
#include "parse-util.h"
#include "string-table.h"
#include "time-util.h"

extern char **environ;

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static const char *const host_accel_table[_HOST_ACCEL_MAX] = {
        [HOST_ACCEL_AUTO] = "auto",
        [HOST_ACCEL_KVM] = "kvm",
        [HOST_ACCEL_TCG] = "tcg",
};

DEFINE_STRING_TABLE_LOOKUP(host_accel, HostAccel);

static const char *const host_notify_table[_HOST_NOTIFY_MAX] = {
        [HOST_NOTIFY_AUTO] = "auto",
        [HOST_NOTIFY_VHOST] = "vhost",
        [HOST_NOTIFY_VHOST_USER] = "vhost-user",
        [HOST_NOTIFY_NONE] = "none",
};

static const char *const notify_transport_names[_HOST_NOTIFY_MAX] = {
        [HOST_NOTIFY_VHOST] = "vhost-vsock",
        [HOST_NOTIFY_VHOST_USER] = "vhost-user-vsock",
        [HOST_NOTIFY_NONE] = "none",
};

DEFINE_STRING_TABLE_LOOKUP(host_notify, HostNotify);

const char *host_notify_transport_name(HostNotify n) {
        return n >= 0 && n < _HOST_NOTIFY_MAX ? notify_transport_names[n] : NULL;
}

/* The files and directories probed on every call, below cfg->root. */
typedef enum HostFile {
        HOST_FILE_KVM,
        HOST_FILE_VSOCK,
        HOST_FILE_OSRELEASE,
        HOST_FILE_MEMINFO,
        HOST_FILE_MODULE_KVM_INTEL,
        HOST_FILE_MODULE_KVM_AMD,
        HOST_FILE_MODULE_KVM_PVM,
        HOST_FILE_STORAGE_PROVIDERS,
        HOST_FILE_KSM,
        _HOST_FILE_MAX,
} HostFile;

static const char *const host_files[_HOST_FILE_MAX] = {
        [HOST_FILE_KVM] = "/dev/kvm",
        [HOST_FILE_VSOCK] = "/dev/vhost-vsock",
        [HOST_FILE_OSRELEASE] = "/proc/sys/kernel/osrelease",
        [HOST_FILE_MEMINFO] = "/proc/meminfo",
        [HOST_FILE_MODULE_KVM_INTEL] = "/sys/module/kvm_intel",
        [HOST_FILE_MODULE_KVM_AMD] = "/sys/module/kvm_amd",
        [HOST_FILE_MODULE_KVM_PVM] = "/sys/module/kvm_pvm",
        [HOST_FILE_STORAGE_PROVIDERS] = "/run/systemd/io.systemd.StorageProvider",
        [HOST_FILE_KSM] = "/sys/kernel/mm/ksm",
};

/* The tools probed once at start-up; version = the field after marker on the first output line. */
typedef enum HostTool {
        HOST_TOOL_QEMU,
        HOST_TOOL_SWTPM,
        HOST_TOOL_SYSTEMD,
        _HOST_TOOL_MAX,
} HostTool;

static const struct {
        const char *binary;
        const char *key;
        const char *marker;
} host_tools[_HOST_TOOL_MAX] = {
        [HOST_TOOL_QEMU] = { "qemu-system-x86_64", "qemu", "version" },
        [HOST_TOOL_SWTPM] = { "swtpm", "swtpm", "version" },
        [HOST_TOOL_SYSTEMD] = { "systemctl", "systemd", "systemd" },
};

#define DPKG_QUERY "dpkg-query"
#define VHOST_DEVICE_VSOCK "vhost-device-vsock"

typedef struct ToolState {
        bool found;
        char *version; /* NULL when the first line has no field after the marker */
        char *error;
} ToolState;

struct HostProbe {
        char *files[_HOST_FILE_MAX]; /* host_files[] below the root */
        char *path;                  /* $PATH for the tools */
        char *ovmf_code;             /* as configured; NULL when none */
        char *ovmf_code_text;        /* the same, made valid UTF-8 for JSON and messages */
        HostAccel accel;
        HostNotify notify;

        ToolState tools[_HOST_TOOL_MAX];

        /* The firmware, probed at start-up; fw_sha256 is NULL when ovmf_code was not a readable regular
         * file. */
        char *fw_sha256;
        char *fw_package;
        char *fw_version;
        char *fw_error;
        char *fw_summary;
};

static bool isempty(const char *s) {
        return !s || !*s;
}

static char *strip_whitespace(char *s, size_t *ret_len) {
        size_t n;

        s += strspn(s, " \t\r\n\v\f");
        n = strlen(s);
        while (n > 0 && strchr(" \t\r\n\v\f", s[n - 1]))
                n--;
        s[n] = 0;
        if (ret_len)
                *ret_len = n;
        return s;
}

/* The length of the valid UTF-8 sequence at p, 0 when p does not start one. */
static size_t utf8_sequence_length(const unsigned char *p) {
        uint32_t c;
        size_t n;

        if (p[0] < 0x80)
                return 1;
        if (p[0] >= 0xC2 && p[0] <= 0xDF) {
                n = 2;
                c = p[0] & 0x1F;
        } else if ((p[0] & 0xF0) == 0xE0) {
                n = 3;
                c = p[0] & 0x0F;
        } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
                n = 4;
                c = p[0] & 0x07;
        } else
                return 0;
        for (size_t i = 1; i < n; i++) {
                if ((p[i] & 0xC0) != 0x80) /* also stops at the terminating NUL */
                        return 0;
                c = (c << 6) | (p[i] & 0x3F);
        }
        if (n == 3 && c < 0x800) /* overlong */
                return 0;
        if (n == 4 && (c < 0x10000 || c > 0x10FFFF))
                return 0;
        if (c >= 0xD800 && c <= 0xDFFF) /* surrogates */
                return 0;
        return n;
}

/* Replaces every byte that does not belong to valid UTF-8 with '?', so that json_string() accepts the
 * text: tool output, file names and the kernel release are not ours to trust. */
static char *utf8_sanitize(char *s) {
        unsigned char *p = (unsigned char *) s;

        while (*p) {
                size_t n = utf8_sequence_length(p);
                if (n == 0)
                        *p++ = '?';
                else
                        p += n;
        }
        return s;
}

/* Go's text for an errno: glibc's description with a lower-case first letter ("no such file or
 * directory", "permission denied", "input/output error"). Returns a new string, NULL on OOM. */
static char *errno_text(int r) {
        const char *d = strerrordesc_np(ABS(r));
        char *s;

        if (!d)
                return asprintf(&s, "errno %d", ABS(r)) < 0 ? NULL : s;
        s = strdup(d);
        if (s && s[0] >= 'A' && s[0] <= 'Z' && !(s[1] >= 'A' && s[1] <= 'Z'))
                s[0] = (char) (s[0] - 'A' + 'a');
        return s;
}

/* Go's text for a signal ("killed", "segmentation fault"); borrowed or in buf. */
static const char *signal_text(int sig, char *buf, size_t size) {
        const char *d = sigdescr_np(sig);

        if (!d) {
                (void) snprintf(buf, size, "signal %d", sig);
                return buf;
        }
        (void) snprintf(buf, size, "%s", d);
        if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
                buf[0] = (char) (buf[0] - 'A' + 'a');
        return buf;
}

/* Like exec.LookPath: the first regular, executable file called name in an absolute directory of
 * search_path. Relative entries (and empty ones, which mean ".") are skipped, as Go refuses them too. */
static int find_executable(const char *search_path, const char *name, char **ret) {
        const char *p = search_path;

        for (;;) {
                size_t n = strcspn(p, ":");

                if (n > 0 && p[0] == '/') {
                        _cleanup_free_ char *f = NULL;
                        struct stat st;

                        if (asprintf(&f, "%.*s/%s", (int) n, p, name) < 0)
                                return -ENOMEM;
                        if (stat(f, &st) >= 0 && S_ISREG(st.st_mode) &&
                            faccessat(AT_FDCWD, f, X_OK, AT_EACCESS) >= 0) {
                                *ret = TAKE_PTR(f);
                                return 0;
                        }
                }
                if (p[n] == 0)
                        return -ENOENT;
                p += n + 1;
        }
}

typedef struct SpawnResult {
        char *output; /* NUL-terminated, at most HOST_PROBE_TOOL_OUTPUT_MAX bytes */
        int status;   /* as from waitpid() */
        bool timed_out;
} SpawnResult;

static void spawn_result_done(SpawnResult *r) {
        r->output = mfree(r->output);
}

static int spawn_setup(posix_spawn_file_actions_t *fa, posix_spawnattr_t *attr, int out_fd) {
        sigset_t mask;
        int r;

        /* The daemon blocks SIGCHLD (sd-event) and may ignore SIGPIPE: the child inherits neither, nor any
         * descriptor above stderr that lacks O_CLOEXEC. Its own process group lets a time-out kill whatever
         * it started, too. */
        r = posix_spawn_file_actions_addopen(fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        if (r == 0)
                r = posix_spawn_file_actions_adddup2(fa, out_fd, STDOUT_FILENO);
        if (r == 0)
                r = posix_spawn_file_actions_adddup2(fa, out_fd, STDERR_FILENO);
        if (r == 0)
                r = posix_spawn_file_actions_addclosefrom_np(fa, STDERR_FILENO + 1);
        if (r == 0)
                r = posix_spawnattr_setflags(
                        attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
        if (r == 0) {
                (void) sigemptyset(&mask);
                r = posix_spawnattr_setsigmask(attr, &mask);
        }
        if (r == 0) {
                (void) sigfillset(&mask);
                r = posix_spawnattr_setsigdefault(attr, &mask);
        }
        if (r == 0)
                r = posix_spawnattr_setpgroup(attr, 0);
        return -r;
}

/* Reads what is available on fd into the bounded buffer; beyond the bound the bytes are drained and
 * dropped, so that a chatty child does not block on a full pipe. Returns 1 at EOF. */
static int read_some(int fd, char *buf, size_t *size) {
        char scratch[4096];
        ssize_t k;

        if (*size < HOST_PROBE_TOOL_OUTPUT_MAX)
                k = read(fd, buf + *size, HOST_PROBE_TOOL_OUTPUT_MAX - *size);
        else
                k = read(fd, scratch, sizeof(scratch));
        if (k < 0)
                return errno == EINTR || errno == EAGAIN ? 0 : -errno;
        if (k == 0)
                return 1;
        if (*size < HOST_PROBE_TOOL_OUTPUT_MAX)
                *size += (size_t) k;
        return 0;
}

/* Runs exe with argv, stdin on /dev/null and stdout+stderr into one pipe, for at most timeout. Blocks.
 * Returns < 0 when the child could not be started. */
static int spawn_capture(const char *exe, char *const argv[], usec_t timeout, SpawnResult *ret) {
        _cleanup_close_ int rfd = -EBADF, wfd = -EBADF, pidfd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t attr;
        bool eof = false, reaped = false, timed_out = false;
        size_t size = 0;
        int fds[2], status = 0, r;
        pid_t pid;

        buf = malloc(HOST_PROBE_TOOL_OUTPUT_MAX + 1);
        if (!buf)
                return -ENOMEM;

        if (pipe2(fds, O_CLOEXEC) < 0)
                return -errno;
        rfd = fds[0];
        wfd = fds[1];

        r = -posix_spawn_file_actions_init(&fa);
        if (r < 0)
                return r;
        r = -posix_spawnattr_init(&attr);
        if (r < 0) {
                (void) posix_spawn_file_actions_destroy(&fa);
                return r;
        }
        r = spawn_setup(&fa, &attr, wfd);
        if (r >= 0)
                r = -posix_spawn(&pid, exe, &fa, &attr, argv, environ);
        (void) posix_spawn_file_actions_destroy(&fa);
        (void) posix_spawnattr_destroy(&attr);
        if (r < 0)
                return r;
        wfd = safe_close(wfd);

        pidfd = pidfd_open(pid, 0); /* optional: without it, exit is polled every 10 ms */
        if (pidfd < 0)
                pidfd = -EBADF;

        usec_t deadline = now_usec(CLOCK_MONOTONIC) + timeout;
        for (;;) {
                struct pollfd p[1];
                nfds_t n = 0;

                if (eof) {
                        pid_t w = waitpid(pid, &status, WNOHANG);
                        if (w == pid) {
                                reaped = true;
                                break;
                        }
                        if (w < 0 && errno != EINTR) {
                                r = -errno; /* e.g. SIGCHLD set to SIG_IGN: the kernel reaped it */
                                break;
                        }
                }

                usec_t t = now_usec(CLOCK_MONOTONIC);
                if (t >= deadline) {
                        timed_out = true;
                        break;
                }
                int ms = (int) MIN((deadline - t + USEC_PER_MSEC - 1) / USEC_PER_MSEC, (usec_t) INT32_MAX);

                if (!eof)
                        p[n++] = (struct pollfd){ .fd = rfd, .events = POLLIN };
                else if (pidfd >= 0)
                        p[n++] = (struct pollfd){ .fd = pidfd, .events = POLLIN };
                else
                        ms = MIN(ms, 10);

                if (poll(p, n, ms) < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        break;
                }
                if (!eof && p[0].revents != 0) {
                        int k = read_some(rfd, buf, &size);
                        if (k != 0) /* EOF, or a read error, which ends the output all the same */
                                eof = true;
                }
        }

        if (!reaped) {
                /* Time-out or a local failure: kill the child's whole process group, then reap it. */
                (void) kill(-pid, SIGKILL);
                (void) kill(pid, SIGKILL);
                for (;;) {
                        pid_t w = waitpid(pid, &status, 0);
                        if (w >= 0 || errno != EINTR)
                                break;
                }
                if (!timed_out)
                        return r < 0 ? r : -EIO;
        }

        buf[size] = 0;
        *ret = (SpawnResult){
                .output = TAKE_PTR(buf),
                .status = status,
                .timed_out = timed_out,
        };
        return 0;
}

/* The first line of s, whitespace-trimmed, in place. */
static char *first_line(char *s) {
        s[strcspn(s, "\n")] = 0;
        return strip_whitespace(s, NULL);
}

/* Runs `name args…` found on p->path, for at most HOST_PROBE_TOOL_TIMEOUT_USEC. On exit status 0 sets
 * *ret_output (its whole output), else *ret_error (the Go-style reason, see host-probe.h). Returns 0, or
 * -ENOMEM. */
static int run_tool(
        const HostProbe *p, const char *name, const char *const *args, char **ret_output, char **ret_error) {
        _cleanup_(spawn_result_done) SpawnResult res = {};
        _cleanup_free_ char *exe = NULL, *e = NULL;
        const char *argv[8] = { name };
        char buf[64];
        size_t n = 1;
        int r, k = 0;

        for (; args && *args; args++) {
                assert(n < ELEMENTSOF(argv) - 1);
                argv[n++] = *args;
        }

        r = find_executable(p->path, name, &exe);
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                k = asprintf(ret_error, "%s: executable file not found in $PATH", name);
                return k < 0 ? -ENOMEM : 0;
        }

        r = spawn_capture(exe, (char *const *) argv, HOST_PROBE_TOOL_TIMEOUT_USEC, &res);
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                e = errno_text(r);
                if (!e)
                        return -ENOMEM;
                k = asprintf(ret_error, "%s: %s", name, e);
        } else if (res.timed_out)
                k = asprintf(
                        ret_error,
                        "%s: timed out after %s",
                        name,
                        format_duration(buf, sizeof(buf), HOST_PROBE_TOOL_TIMEOUT_USEC));
        else if (WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0) {
                *ret_output = TAKE_PTR(res.output);
                return 0;
        } else if (WIFEXITED(res.status)) {
                const char *line = first_line(res.output);
                k = asprintf(
                        ret_error, "%s: exit status %d%s%s", name, WEXITSTATUS(res.status), *line ? ": " : "", line);
        } else if (WIFSIGNALED(res.status))
                k = asprintf(
                        ret_error,
                        "%s: signal: %s%s",
                        name,
                        signal_text(WTERMSIG(res.status), buf, sizeof(buf)),
                        WCOREDUMP(res.status) ? " (core dumped)" : "");
        else
                k = asprintf(ret_error, "%s: unexpected wait status 0x%x", name, (unsigned) res.status);
        if (k < 0)
                return -ENOMEM;
        (void) utf8_sanitize(*ret_error);
        return 0;
}

/* The whitespace-separated field after marker on line, trailing ',' and ';' stripped; NULL when the
 * marker is absent or last. Returns 0 or -ENOMEM. */
static int field_after(const char *line, const char *marker, char **ret) {
        const char *ws = " \t\r\n\v\f";
        bool matched = false;

        for (const char *s = line + strspn(line, ws); *s; s += strspn(s, ws)) {
                size_t n = strcspn(s, ws);

                if (matched) {
                        while (n > 0 && (s[n - 1] == ',' || s[n - 1] == ';'))
                                n--;
                        *ret = strndup(s, n);
                        return *ret ? 0 : -ENOMEM;
                }
                matched = n == strlen(marker) && strneq(s, marker, n);
                s += n;
        }
        *ret = NULL;
        return 0;
}

static int probe_tool(HostProbe *p, HostTool t) {
        static const char *const args[] = { "--version", NULL };
        _cleanup_free_ char *out = NULL;
        ToolState *s = &p->tools[t];
        int r;

        r = run_tool(p, host_tools[t].binary, args, &out, &s->error);
        if (r < 0)
                return r;
        if (s->error) {
                log_debug("Host probe: %s", s->error);
                return 0;
        }
        s->found = true;
        r = field_after(first_line(out), host_tools[t].marker, &s->version);
        if (r < 0)
                return r;
        if (s->version)
                (void) utf8_sanitize(s->version);
        if (t == HOST_TOOL_QEMU && s->version && s->version[0] >= '1' && s->version[0] <= '7' &&
            s->version[1] == '.')
                /* QEMU 7.2's multi-threaded TCG (Debian 12's own) kills a guest kernel now and then
                 * early in a boot; the VM then fails with the panic line (docs/operations.md). */
                log_warning(
                        "QEMU %s: under TCG (no usable KVM) it has killed guest kernels now and then early in a "
                        "boot; tools/install-deps.sh installs QEMU 10 from bookworm-backports.",
                        s->version);
        return 0;
}

/* The dpkg package that installed path and its version. A failure is stored in p->fw_error. */
static int probe_firmware_package(HostProbe *p, const char *path) {
        const char *search_args[] = { "--search", path, NULL };
        _cleanup_free_ char *out = NULL, *out2 = NULL, *pkg = NULL;
        char *line, *colon;
        int r;

        r = run_tool(p, DPKG_QUERY, search_args, &out, &p->fw_error);
        if (r < 0 || p->fw_error)
                return r;

        /* "ovmf: /usr/share/OVMF/OVMF_CODE_4M.fd", or "pkg1, pkg2: path" (the first wins); diversion
         * lines ("diversion by X from: path") come first and name no owner. */
        line = out;
        for (;;) {
                char *next = strchr(line, '\n');
                if (next)
                        *next = 0;
                if (!strneq(line, "diversion by ", strlen("diversion by ")) || !next)
                        break;
                line = next + 1;
        }
        line = strip_whitespace(line, NULL);
        colon = strstr(line, ": ");
        if (!colon) {
                r = asprintf(&p->fw_error, DPKG_QUERY " --search %s: unexpected output \"%s\"", path, line);
                if (r < 0)
                        return -ENOMEM;
                (void) utf8_sanitize(p->fw_error);
                return 0;
        }
        pkg = strndup(line, MIN((size_t) (colon - line), strcspn(line, ",")));
        if (!pkg)
                return -ENOMEM;

        const char *show_args[] = { "--show", "--showformat=${Version}", pkg, NULL };
        r = run_tool(p, DPKG_QUERY, show_args, &out2, &p->fw_error);
        if (r < 0 || p->fw_error)
                return r;

        p->fw_version = strdup(strip_whitespace(out2, NULL));
        if (!p->fw_version)
                return -ENOMEM;
        p->fw_package = TAKE_PTR(pkg);
        (void) utf8_sanitize(p->fw_package);
        (void) utf8_sanitize(p->fw_version);
        return 0;
}

/* The SHA-256 of the file at path, in hex, from coreutils' sha256sum: OpenSSL's digest machinery
 * would leave a couple of MiB of libcrypto resident in the idle daemon, which needs it only for
 * this. The child execs at once (posix_spawn): a forked copy of the daemon running OpenSSL hung when
 * another thread (libcurl's CA store, built at start-up) held a lock at the fork. */
static int sha256_file(const HostProbe *p, const char *path, char hex[static 65]) {
        _cleanup_(spawn_result_done) SpawnResult res = {};
        _cleanup_free_ char *exe = NULL;
        const char *argv[] = { "sha256sum", "--", path, NULL };
        int r;

        r = find_executable(p->path, "sha256sum", &exe);
        if (r == -ENOMEM)
                return r;
        if (r < 0 && !(exe = strdup("/usr/bin/sha256sum")))
                return -ENOMEM;
        r = spawn_capture(exe, (char *const *) argv, HOST_PROBE_TOOL_TIMEOUT_USEC, &res);
        if (r < 0)
                return r;
        if (res.timed_out)
                return -ETIMEDOUT;
        if (!WIFEXITED(res.status) || WEXITSTATUS(res.status) != 0 || !res.output ||
            strspn(res.output, "0123456789abcdef") != 64)
                return -EIO;
        memcpy(hex, res.output, 64);
        hex[64] = 0;
        return 0;
}

/* Hashes the firmware code image. A missing or unreadable image leaves p->fw_sha256 NULL (logged). */
static int probe_firmware(HostProbe *p) {
        _cleanup_close_ int fd = -EBADF;
        char hex[65];
        struct stat st;
        int r;

        if (!p->ovmf_code)
                return 0;

        /* O_NONBLOCK: a FIFO configured by mistake must not hang start-up. */
        fd = open(p->ovmf_code, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0 || fstat(fd, &st) < 0) {
                (void) log_debug_errno(errno, "Host probe: firmware code image %s: %m", p->ovmf_code_text);
                return 0;
        }
        if (!S_ISREG(st.st_mode)) {
                log_debug("Host probe: firmware code image %s is not a regular file.", p->ovmf_code_text);
                return 0;
        }

        r = sha256_file(p, p->ovmf_code, hex);
        if (r < 0) {
                (void) log_debug_errno(r, "Host probe: hashing %s: %m", p->ovmf_code_text);
                return r == -ENOMEM ? r : 0;
        }
        p->fw_sha256 = strdup(hex);
        if (!p->fw_sha256)
                return -ENOMEM;

        r = probe_firmware_package(p, p->ovmf_code);
        if (r < 0)
                return r;
        if (p->fw_error)
                log_debug("Host probe: no dpkg package for %s: %s", p->ovmf_code_text, p->fw_error);

        if (p->fw_package && !isempty(p->fw_version))
                r = asprintf(
                        &p->fw_summary, "sha256 %s (package %s %s)", p->fw_sha256, p->fw_package, p->fw_version);
        else if (p->fw_package)
                r = asprintf(&p->fw_summary, "sha256 %s (package %s)", p->fw_sha256, p->fw_package);
        else
                r = asprintf(&p->fw_summary, "sha256 %s (package unknown: %s)", p->fw_sha256, p->fw_error);
        return r < 0 ? -ENOMEM : 0;
}

HostProbe *host_probe_free(HostProbe *p) {
        if (!p)
                return NULL;
        for (size_t i = 0; i < _HOST_FILE_MAX; i++)
                free(p->files[i]);
        for (size_t i = 0; i < _HOST_TOOL_MAX; i++) {
                free(p->tools[i].version);
                free(p->tools[i].error);
        }
        free(p->path);
        free(p->ovmf_code);
        free(p->ovmf_code_text);
        free(p->fw_sha256);
        free(p->fw_package);
        free(p->fw_version);
        free(p->fw_error);
        free(p->fw_summary);
        return mfree(p);
}

int host_probe_new(HostProbe **ret, const HostProbeConfig *cfg) {
        _cleanup_(host_probe_freep) HostProbe *p = NULL;
        size_t root_len = 0;
        int r;

        assert_return(ret, -EINVAL);
        assert_return(cfg, -EINVAL);
        assert_return(cfg->accel >= 0 && cfg->accel < _HOST_ACCEL_MAX, -EINVAL);
        assert_return(cfg->notify >= 0 && cfg->notify < _HOST_NOTIFY_MAX, -EINVAL);

        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->accel = cfg->accel;
        p->notify = cfg->notify;

        if (cfg->root) {
                root_len = strlen(cfg->root);
                while (root_len > 0 && cfg->root[root_len - 1] == '/')
                        root_len--;
        }
        for (size_t i = 0; i < _HOST_FILE_MAX; i++)
                if (asprintf(&p->files[i], "%.*s%s", (int) root_len, cfg->root ?: "", host_files[i]) < 0)
                        return -ENOMEM;

        p->path = strdup(cfg->path ?: getenv("PATH") ?: DEFAULT_PATH);
        if (!p->path)
                return -ENOMEM;
        if (!isempty(cfg->ovmf_code)) {
                p->ovmf_code = strdup(cfg->ovmf_code);
                p->ovmf_code_text = strdup(cfg->ovmf_code);
                if (!p->ovmf_code || !p->ovmf_code_text)
                        return -ENOMEM;
                (void) utf8_sanitize(p->ovmf_code_text);
        }

        for (HostTool t = 0; t < _HOST_TOOL_MAX; t++) {
                r = probe_tool(p, t);
                if (r < 0)
                        return r;
        }
        r = probe_firmware(p);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(p);
        return 0;
}

typedef struct DeviceState {
        bool accessible;
        int error; /* negative errno when not accessible */
} DeviceState;

static DeviceState probe_device(const HostProbe *p, HostFile f) {
        int fd = open(p->files[f], O_RDWR | O_CLOEXEC);

        if (fd < 0)
                return (DeviceState){ .error = -errno };
        (void) safe_close(fd);
        return (DeviceState){ .accessible = true };
}

static bool probe_exists(const HostProbe *p, HostFile f) {
        return access(p->files[f], F_OK) >= 0;
}

typedef struct AccelDecision {
        HostAccel selected;
        const char *reason;
        bool pvm_fallback; /* auto chose TCG because /dev/kvm is PVM */
} AccelDecision;

static AccelDecision decide_accel(const HostProbe *p, const DeviceState *kvm) {
        bool intel = probe_exists(p, HOST_FILE_MODULE_KVM_INTEL),
             amd = probe_exists(p, HOST_FILE_MODULE_KVM_AMD), pvm = probe_exists(p, HOST_FILE_MODULE_KVM_PVM);

        switch (p->accel) {
        case HOST_ACCEL_KVM:
                return (AccelDecision){
                        .selected = HOST_ACCEL_KVM,
                        .reason = !kvm->accessible    ? HOST_ACCEL_REASON_REQUESTED_KVM_INACCESSIBLE :
                                pvm && !intel && !amd ? HOST_ACCEL_REASON_REQUESTED_KVM_PVM :
                                                        HOST_ACCEL_REASON_REQUESTED_KVM,
                };
        case HOST_ACCEL_TCG:
                return (AccelDecision){ .selected = HOST_ACCEL_TCG, .reason = HOST_ACCEL_REASON_REQUESTED_TCG };
        default:
                break;
        }

        if (!kvm->accessible)
                return (AccelDecision){ .selected = HOST_ACCEL_TCG, .reason = HOST_ACCEL_REASON_NO_KVM };
        if (intel)
                return (AccelDecision){ .selected = HOST_ACCEL_KVM, .reason = HOST_ACCEL_REASON_KVM_INTEL };
        if (amd)
                return (AccelDecision){ .selected = HOST_ACCEL_KVM, .reason = HOST_ACCEL_REASON_KVM_AMD };
        if (pvm)
                return (AccelDecision){
                        .selected = HOST_ACCEL_TCG,
                        .reason = HOST_ACCEL_REASON_PVM,
                        .pvm_fallback = true,
                };
        return (AccelDecision){ .selected = HOST_ACCEL_TCG, .reason = HOST_ACCEL_REASON_NO_BACKEND };
}

HostAccel host_probe_accel(HostProbe *p, const char **ret_reason) {
        assert_return(p, _HOST_ACCEL_INVALID);

        DeviceState kvm = probe_device(p, HOST_FILE_KVM);
        AccelDecision d = decide_accel(p, &kvm);
        if (ret_reason)
                *ret_reason = d.reason;
        return d.selected;
}

typedef struct NotifyDecision {
        HostNotify selected;
        const char *reason;
        bool have_device, have_helper;
} NotifyDecision;

static int decide_notify(const HostProbe *p, const DeviceState *vsock, NotifyDecision *ret) {
        _cleanup_free_ char *helper = NULL;
        int r;

        /* one PATH lookup answers both which transport auto takes and whether a requested one is there */
        r = find_executable(p->path, VHOST_DEVICE_VSOCK, &helper);
        if (r == -ENOMEM)
                return r;
        *ret = (NotifyDecision){ .have_device = vsock->accessible, .have_helper = r >= 0 };
        switch (p->notify) {
        case HOST_NOTIFY_VHOST:
                ret->selected = HOST_NOTIFY_VHOST;
                ret->reason = HOST_NOTIFY_REASON_REQUESTED_VHOST;
                break;
        case HOST_NOTIFY_VHOST_USER:
                ret->selected = HOST_NOTIFY_VHOST_USER;
                ret->reason = HOST_NOTIFY_REASON_REQUESTED_VHOST_USER;
                break;
        case HOST_NOTIFY_NONE:
                ret->selected = HOST_NOTIFY_NONE;
                ret->reason = HOST_NOTIFY_REASON_REQUESTED_NONE;
                break;
        default:
                ret->selected = ret->have_device ? HOST_NOTIFY_VHOST :
                        ret->have_helper         ? HOST_NOTIFY_VHOST_USER :
                                                   HOST_NOTIFY_NONE;
                ret->reason = ret->have_device ? HOST_NOTIFY_REASON_VHOST :
                        ret->have_helper       ? HOST_NOTIFY_REASON_VHOST_USER :
                                                 HOST_NOTIFY_REASON_NONE;
        }
        return 0;
}

HostNotify host_probe_notify(HostProbe *p, const char **ret_reason) {
        NotifyDecision d;

        assert_return(p, _HOST_NOTIFY_INVALID);

        DeviceState vsock = probe_device(p, HOST_FILE_VSOCK);
        if (decide_notify(p, &vsock, &d) < 0) {
                /* out of memory for a path: the transport that needs no lookup */
                d.selected = p->notify == HOST_NOTIFY_AUTO ?
                        (vsock.accessible ? HOST_NOTIFY_VHOST : HOST_NOTIFY_NONE) :
                        p->notify;
                d.reason = HOST_NOTIFY_REASON_NONE;
        }
        if (ret_reason)
                *ret_reason = d.reason;
        return d.selected;
}

const char *host_probe_firmware_sha256(HostProbe *p) {
        return p ? p->fw_sha256 : NULL;
}

const char *host_probe_firmware_summary(HostProbe *p) {
        return p ? p->fw_summary : NULL;
}

/* json_object_set_new() takes value even on failure, and fails on a NULL value: one check covers OOM. */
static int put(json_t *o, const char *key, json_t *value) {
        return json_object_set_new(o, key, value) < 0 ? -ENOMEM : 0;
}

static int put_string_sanitized(json_t *o, const char *key, char *s) {
        return put(o, key, json_string(utf8_sanitize(s)));
}

static json_t *device_to_json(const char *path, const DeviceState *d) {
        json_auto_t *o = json_object();

        if (!o || put(o, "path", json_string(path)) < 0 ||
            put(o, "accessible", json_boolean(d->accessible)) < 0)
                return NULL;
        if (!d->accessible) {
                _cleanup_free_ char *e = errno_text(d->error);
                if (!e || put(o, "error", json_string(e)) < 0)
                        return NULL;
        }
        return TAKE_PTR(o);
}

static json_t *tool_to_json(const ToolState *t) {
        json_auto_t *o = json_object();

        if (!o || put(o, "found", json_boolean(t->found)) < 0)
                return NULL;
        if (t->version && put(o, "version", json_string(t->version)) < 0)
                return NULL;
        if (t->error && put(o, "error", json_string(t->error)) < 0)
                return NULL;
        return TAKE_PTR(o);
}

static json_t *firmware_to_json(const HostProbe *p) {
        json_auto_t *o = json_object();

        if (!o || put(o, "sha256", json_string(p->fw_sha256)) < 0)
                return NULL;
        if (!isempty(p->fw_package) && put(o, "package", json_string(p->fw_package)) < 0)
                return NULL;
        if (!isempty(p->fw_version) && put(o, "version", json_string(p->fw_version)) < 0)
                return NULL;
        if (!isempty(p->fw_error) && put(o, "error", json_string(p->fw_error)) < 0)
                return NULL;
        return TAKE_PTR(o);
}

static int add_missing(json_t *a, const char *s) {
        return json_array_append_new(a, json_string(s)) < 0 ? -ENOMEM : 0;
}

static int compare_strings(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

/* Names of the non-directory entries (the provider sockets), sorted; [] when the directory is missing. */
static json_t *storage_providers_to_json(const HostProbe *p) {
        _cleanup_(closedirp) DIR *d = NULL;
        _cleanup_strv_free_ char **names = NULL;
        json_auto_t *a = json_array();
        size_t n = 0, allocated = 0;

        if (!a)
                return NULL;
        d = opendir(p->files[HOST_FILE_STORAGE_PROVIDERS]);
        if (!d)
                return TAKE_PTR(a);

        for (struct dirent *de; (de = readdir(d));) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                bool is_dir = de->d_type == DT_DIR;
                if (de->d_type == DT_UNKNOWN) {
                        struct stat st;
                        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                                continue;
                        is_dir = S_ISDIR(st.st_mode);
                }
                if (is_dir)
                        continue;
                if (n + 2 > allocated) {
                        size_t k = MAX(allocated * 2, (size_t) 8);
                        char **nn = reallocarray(names, k, sizeof(char *));
                        if (!nn)
                                return NULL;
                        names = nn;
                        allocated = k;
                }
                names[n] = strdup(de->d_name);
                if (!names[n])
                        return NULL;
                names[++n] = NULL;
        }
        if (n > 0)
                qsort(names, n, sizeof(char *), compare_strings);
        for (size_t i = 0; i < n; i++)
                if (json_array_append_new(a, json_string(utf8_sanitize(names[i]))) < 0)
                        return NULL;
        return TAKE_PTR(a);
}

static uint64_t read_mem_total(const HostProbe *p) {
        _cleanup_free_ char *s = NULL;
        uint64_t kib;

        if (read_full_file(p->files[HOST_FILE_MEMINFO], 1024 * 1024, &s, NULL) < 0)
                return 0;
        for (char *line = s; line && *line;) {
                char *next = strchr(line, '\n');
                if (next)
                        *next++ = 0;
                if (strneq(line, "MemTotal:", strlen("MemTotal:"))) {
                        char *v = line + strlen("MemTotal:");
                        v += strspn(v, " \t");
                        v[strcspn(v, " \t")] = 0;
                        if (safe_atou64(v, &kib) < 0 || kib > UINT64_MAX / 1024)
                                return 0;
                        return kib * 1024;
                }
                line = next;
        }
        return 0;
}

uint64_t host_probe_memory(HostProbe *p) {
        return read_mem_total(p);
}

int host_probe_ksm(HostProbe *p, HostKsm *ret) {
        assert_return(p, -EINVAL);
        return host_ksm_read(p->files[HOST_FILE_KSM], ret);
}

static json_t *ksm_to_json(HostProbe *p) {
        long page = sysconf(_SC_PAGESIZE);
        HostKsm k;
        int r;

        r = host_probe_ksm(p, &k);
        if (r < 0)
                return json_pack(
                        "{s:b,s:b,s:s}",
                        "available",
                        false,
                        "running",
                        false,
                        "note",
                        "/sys/kernel/mm/ksm does not read as KSM's");
        return host_ksm_to_json(&k, page > 0 ? (uint64_t) page : 4096);
}

static int usable_cpus(void) {
        cpu_set_t set;
        long n;

        if (sched_getaffinity(0, sizeof(set), &set) >= 0 && CPU_COUNT(&set) > 0)
                return CPU_COUNT(&set);
        n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int) MIN(n, (long) INT32_MAX) : 1;
}

/* What the host has: its name and kernel, CPUs and memory, devices, tools, firmware, storage. */
static int put_facts(HostProbe *p, json_t *o, const DeviceState *kvm, const DeviceState *vsock) {
        _cleanup_free_ char *kernel = NULL;
        struct utsname u = {};

        (void) uname(&u);
        if (read_full_file(p->files[HOST_FILE_OSRELEASE], 4096, &kernel, NULL) < 0) {
                kernel = strdup("");
                if (!kernel)
                        return -ENOMEM;
        }

        if (put_string_sanitized(o, "hostname", u.nodename) < 0 ||
            put_string_sanitized(o, "kernel", strip_whitespace(kernel, NULL)) < 0 ||
            put(o, "cpus", json_integer(usable_cpus())) < 0 ||
            put(o, "memoryBytes", json_integer((json_int_t) MIN(read_mem_total(p), (uint64_t) INT64_MAX))) < 0 ||
            put(o, "kvm", device_to_json(host_files[HOST_FILE_KVM], kvm)) < 0 ||
            put(o, "vhostVsock", device_to_json(host_files[HOST_FILE_VSOCK], vsock)) < 0 ||
            put(o, "ksm", ksm_to_json(p)) < 0)
                return -ENOMEM;
        for (HostTool t = 0; t < _HOST_TOOL_MAX; t++)
                if (put(o, host_tools[t].key, tool_to_json(&p->tools[t])) < 0)
                        return -ENOMEM;
        if (p->fw_sha256 &&
            (put(o, "ovmfCode", json_string(p->ovmf_code_text)) < 0 ||
             put(o, "firmware", firmware_to_json(p)) < 0))
                return -ENOMEM;
        if (put(o, "storageProviders", storage_providers_to_json(p)) < 0)
                return -ENOMEM;
        return 0;
}

/* The two decisions the probe makes: the accelerator and the notify transport, each with why. */
static int put_decisions(HostProbe *p, json_t *o, const AccelDecision *accel, const NotifyDecision *notify) {
        json_auto_t *acc = json_object(), *n = NULL;

        if (!acc || put(acc, "selected", json_string(host_accel_to_string(accel->selected))) < 0 ||
            put(acc, "requested", json_string(host_accel_to_string(p->accel))) < 0 ||
            put(acc, "reason", json_string(accel->reason)) < 0 || put(o, "accelerator", json_incref(acc)) < 0)
                return -ENOMEM;

        n = json_pack(
                "{s:s,s:s,s:s}",
                "transport",
                host_notify_transport_name(notify->selected),
                "requested",
                host_notify_to_string(p->notify),
                "reason",
                notify->reason);
        if (!n || put(o, "notify", json_incref(n)) < 0)
                return -ENOMEM;
        return 0;
}

/* What VMs need and the host lacks, in the order a user should fix it; empty when ready. */
static int list_missing(
        HostProbe *p,
        const DeviceState *kvm,
        const AccelDecision *accel,
        const NotifyDecision *notify,
        json_t *missing) {

        if (accel->selected == HOST_ACCEL_KVM && !kvm->accessible &&
            add_missing(missing, HOST_PROBE_MISSING_KVM) < 0)
                return -ENOMEM;
        if (accel->pvm_fallback && add_missing(missing, HOST_PROBE_MISSING_KVM_PVM) < 0)
                return -ENOMEM;
        /* With vhost-device-vsock, VMs get vsock through vhost-user instead (DESIGN §2). */
        if (p->notify == HOST_NOTIFY_AUTO && !notify->have_device && !notify->have_helper &&
            add_missing(missing, HOST_PROBE_MISSING_VSOCK) < 0)
                return -ENOMEM;
        if (p->notify == HOST_NOTIFY_VHOST && !notify->have_device &&
            add_missing(missing, HOST_PROBE_MISSING_VHOST_VSOCK) < 0)
                return -ENOMEM;
        if (p->notify == HOST_NOTIFY_VHOST_USER && !notify->have_helper &&
            add_missing(missing, HOST_PROBE_MISSING_VSOCK_HELPER) < 0)
                return -ENOMEM;
        if (!p->tools[HOST_TOOL_QEMU].found && add_missing(missing, host_tools[HOST_TOOL_QEMU].binary) < 0)
                return -ENOMEM;
        if (!p->tools[HOST_TOOL_SWTPM].found && add_missing(missing, host_tools[HOST_TOOL_SWTPM].binary) < 0)
                return -ENOMEM;
        if (!p->fw_sha256) {
                _cleanup_free_ char *s = NULL;
                if (asprintf(&s, "OVMF code image%s%s", p->ovmf_code ? " " : "", p->ovmf_code_text ?: "") < 0 ||
                    add_missing(missing, s) < 0)
                        return -ENOMEM;
        }
        return 0;
}

static int build_json(HostProbe *p, json_t *o) {
        json_auto_t *missing = NULL;
        NotifyDecision notify;
        int r;

        DeviceState kvm = probe_device(p, HOST_FILE_KVM);
        DeviceState vsock = probe_device(p, HOST_FILE_VSOCK);
        AccelDecision accel = decide_accel(p, &kvm);

        r = put_facts(p, o, &kvm, &vsock);
        if (r < 0)
                return r;
        r = decide_notify(p, &vsock, &notify);
        if (r < 0)
                return r;
        r = put_decisions(p, o, &accel, &notify);
        if (r < 0)
                return r;

        missing = json_array();
        if (!missing)
                return -ENOMEM;
        r = list_missing(p, &kvm, &accel, &notify, missing);
        if (r < 0)
                return r;
        if (put(o, "ready", json_boolean(json_array_size(missing) == 0)) < 0)
                return -ENOMEM;
        if (json_array_size(missing) > 0 && put(o, "missing", json_incref(missing)) < 0)
                return -ENOMEM;
        return 0;
}

json_t *host_probe_to_json(HostProbe *p) {
        json_auto_t *o = NULL;

        assert_return(p, NULL);

        o = json_object();
        if (!o || build_json(p, o) < 0)
                return NULL;
        return TAKE_PTR(o);
}
