/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "macro.h"
#include "parse-util.h"
#include "process-util.h"

/* /proc/<pid>/stat (utime, stime, starttime, vsize after the last ')') and statm (resident pages). */
int proc_stats(pid_t pid, ProcStats *ret) {
        char path[64], buf[1024], *p;
        unsigned long long f[24];
        long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
        unsigned long long size_pages, resident;
        ssize_t n;
        int fd, k = 0;
        FILE *sf;

        if (pid <= 0 || tck <= 0 || page <= 0)
                return -EINVAL;
        snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return -EIO;
        buf[n] = 0;
        p = strrchr(buf, ')');
        if (!p)
                return -EBADMSG;
        /* after ") ": state, then numbered fields from ppid (field 4 of the line) on */
        p += 2;
        p = strchr(p, ' ');
        while (p && k < (int) ELEMENTSOF(f)) {
                char *end;
                f[k] = strtoull(p + 1, &end, 10);
                if (end == p + 1)
                        break;
                k++;
                p = *end == ' ' ? end : NULL;
        }
        /* f[0] is field 4 (ppid): utime 14, stime 15, starttime 22, vsize 23 */
        if (k < 20)
                return -EBADMSG;
        snprintf(path, sizeof(path), "/proc/%d/statm", (int) pid);
        sf = fopen(path, "re");
        if (!sf)
                return -errno;
        if (fscanf(sf, "%llu %llu", &size_pages, &resident) != 2) {
                fclose(sf);
                return -EBADMSG;
        }
        fclose(sf);
        *ret = (ProcStats){
                .cpu_seconds = (double) (f[10] + f[11]) / (double) tck,
                .start_seconds = (double) f[18] / (double) tck,
                .vsize_bytes = f[19],
                .rss_bytes = resident * (unsigned long long) page,
        };
        return 0;
}

/* The field of m that smaps_rollup's line key fills, or NULL for the lines we do not keep. */
static uint64_t *rollup_field(ProcMemory *m, const char *key, size_t len) {
        const char *const names[] = { "Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "SwapPss" };
        uint64_t *const fields[] = { &m->rss,      &m->pss,       &m->pss_anon,
                                     &m->pss_file, &m->pss_shmem, &m->swap_pss };

        for (size_t i = 0; i < ELEMENTSOF(names); i++)
                if (strlen(names[i]) == len && strncmp(names[i], key, len) == 0)
                        return fields[i];
        return NULL;
}

int proc_memory_parse(const char *text, ProcMemory *ret) {
        ProcMemory m = {};
        bool have_rss = false, have_pss = false;

        assert_return(text, -EINVAL);
        assert_return(ret, -EINVAL);

        for (const char *line = text; *line;) {
                size_t len = strcspn(line, "\n"), klen = strcspn(line, ":\n");
                uint64_t *field = klen < len ? rollup_field(&m, line, klen) : NULL;

                if (field) {
                        /* "   1234 kB": the digits, then exactly " kB" to the end of the line */
                        const char *p = line + klen + 1, *e;
                        char num[24];
                        uint64_t kib;

                        p += strspn(p, " \t");
                        e = p + strspn(p, "0123456789");
                        if (e == p || (size_t) (e - p) >= sizeof(num) || line + len - e != 3 ||
                            strncmp(e, " kB", 3) != 0)
                                return -EBADMSG;
                        memcpy(num, p, (size_t) (e - p));
                        num[e - p] = 0;
                        if (safe_atou64(num, &kib) < 0 || kib > UINT64_MAX / 1024)
                                return -EBADMSG;
                        *field = kib * 1024;
                        have_rss = have_rss || field == &m.rss;
                        have_pss = have_pss || field == &m.pss;
                }
                line += len + (line[len] == '\n');
        }
        if (!have_rss || !have_pss)
                return -EBADMSG;
        *ret = m;
        return 0;
}

int proc_memory(pid_t pid, ProcMemory *ret) {
        _cleanup_free_ char *text = NULL;
        char path[64];
        int r;

        if (pid <= 0)
                return -EINVAL;
        snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int) pid);
        /* about 1 KiB in Linux 6.x; anything much longer is not smaps_rollup */
        r = read_full_file(path, 64 * 1024, &text, NULL);
        if (r < 0)
                return r;
        return proc_memory_parse(text, ret);
}

pid_t process_fork_exec(char *const *argv, int out_fd) {
        pid_t parent = getpid(), pid;
        sigset_t none;

        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid > 0) {
                /* the child's own setpgid() may not have run yet when the caller signals the group */
                (void) setpgid(pid, pid);
                return pid;
        }
        (void) setpgid(0, 0);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
                _exit(127);
        sigemptyset(&none);
        (void) sigprocmask(SIG_SETMASK, &none, NULL);
        if (out_fd >= 0 && (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(out_fd, STDERR_FILENO) < 0))
                _exit(127);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot execute '%s': %m\n", argv[0]);
        _exit(127);
}
