/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "macro.h"
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
