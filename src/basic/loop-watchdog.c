/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "fs-util.h"
#include "log.h"
#include "loop-watchdog.h"

#define STACK_FRAMES_MAX 64
#define FRAME_TEXT_MAX 512
#define SYSCALL_TEXT_MAX 64
/* How often the watcher looks at the loop, and how much of a blocked stack it reads. */
#define WATCH_INTERVAL (5 * USEC_PER_MSEC)
#define STACK_SCAN_MAX ((size_t) 256 * 1024)

/* The signal that samples a loop that is running: a real-time one nothing else here uses. */
#define SAMPLE_SIGNAL (SIGRTMIN + 7)

/* The sanitizers' runtime names a frame (function, file, line); weak, so that other builds link. */
void __sanitizer_symbolize_pc(void *pc, const char *fmt, char *out_buf, size_t out_buf_size)
        __attribute__((weak));

const usec_t loop_stats_bounds[LOOP_STATS_N_BOUNDS] = { LOOP_STATS_BOUNDS_USEC };

struct LoopWatchdog {
        sd_event *event;
        bool enabled;
        char *report_path;
        LoopStats stats;

        /* With the watchdog on: a watcher thread looks at the loop's thread every 5 ms. It shares
         * only the atomics below and the sample, which it (or the signal handler it sends) writes for
         * one iteration and publishes with sample_iteration; the loop reads it when that iteration
         * has ended. No locks. */
        int schedstat_fd; /* the loop thread's /proc/thread-self/schedstat, or -EBADF */
        int syscall_fd;   /* the loop thread's /proc/thread-self/syscall, or -EBADF */
        pthread_t loop_thread, watcher;
        bool have_watcher, have_action;
        struct sigaction old_action;
        const void *self_base;                /* where our executable is mapped: frames there are ours */
        uintptr_t text_low, text_high;        /* its code */
        uintptr_t stack_low, stack_high;      /* the loop thread's stack */
        atomic_bool stop;                     /* the watcher ends */
        _Atomic uint64_t iteration;           /* the loop's current iteration */
        _Atomic usec_t started;               /* when it started (its wait left out), 0 while waiting */
        _Atomic uint64_t sample_iteration;    /* the iteration the sample is of */
        _Atomic uint64_t signalled_iteration; /* the iteration the watcher sent the signal in */
        size_t n_frames;
        void *frames[STACK_FRAMES_MAX];
        bool frames_scanned;            /* read off a blocked stack (return addresses), not unwound */
        void *interrupted;              /* unwound: the instruction the signal interrupted */
        char syscall[SYSCALL_TEXT_MAX]; /* "poll", "fsync", …, or "" when it was running */
};

/* The running loop's stack, unwound in its own thread. */
static void on_sample_signal(int sig, siginfo_t *si, void *ucontext) {
        LoopWatchdog *w;
        uint64_t it;
        int saved_errno = errno;

        if (si->si_code != SI_QUEUE || !(w = si->si_value.sival_ptr))
                return;
        it = atomic_load(&w->signalled_iteration);
        if (it == atomic_load(&w->iteration) && atomic_load(&w->sample_iteration) != it) {
                const ucontext_t *uc = ucontext;
                int n;

#if defined(__x86_64__)
                w->interrupted = (void *) uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
                w->interrupted = (void *) uc->uc_mcontext.pc;
#else
                (void) uc;
                w->interrupted = NULL;
#endif
                n = backtrace(w->frames, STACK_FRAMES_MAX);

                w->n_frames = n > 0 ? (size_t) n : 0;
                w->frames_scanned = false;
                w->syscall[0] = 0;
                atomic_store(&w->sample_iteration, it);
        }
        errno = saved_errno;
}

static const char *syscall_name(long nr) {
        /* the calls a loop may be caught waiting in */
        static const struct {
                long nr;
                const char *name;
        } table[] = {
#if defined(__x86_64__)
                { 0, "read" },
                { 1, "write" },
                { 7, "poll" },
                { 23, "select" },
                { 35, "nanosleep" },
                { 42, "connect" },
                { 43, "accept" },
                { 44, "sendto" },
                { 45, "recvfrom" },
                { 46, "sendmsg" },
                { 47, "recvmsg" },
                { 61, "wait4" },
                { 73, "flock" },
                { 74, "fsync" },
                { 75, "fdatasync" },
                { 76, "truncate" },
                { 77, "ftruncate" },
                { 82, "rename" },
                { 87, "unlink" },
                { 202, "futex" },
                { 230, "clock_nanosleep" },
                { 232, "epoll_wait" },
                { 247, "waitid" },
                { 257, "openat" },
                { 263, "unlinkat" },
                { 264, "renameat" },
                { 270, "pselect6" },
                { 271, "ppoll" },
                { 288, "accept4" },
                { 316, "renameat2" },
                { 281, "epoll_pwait" },
                { 285, "fallocate" },
#endif
        };

        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (table[i].nr == nr)
                        return table[i].name;
        return NULL;
}

/* Whether the code before addr is a call, so that addr is a return address: call rel32 (e8), or an
 * indirect call (ff /2) through a register or memory, 2 to 7 bytes long. addr is in our code. */
__attribute__((no_sanitize_address)) static bool after_call(uintptr_t addr) {
#if defined(__x86_64__)
        const uint8_t *p = (const uint8_t *) addr;

        if (p[-5] == 0xe8)
                return true;
        for (size_t k = 2; k <= 7; k++)
                if (p[-k] == 0xff && ((p[-k + 1] >> 3) & 7) == 2)
                        return true;
        return false;
#else
        return true;
#endif
}

static bool frame_is_ours(LoopWatchdog *w, void *pc) {
        Dl_info info = {};

        return w->self_base && dladdr(pc, &info) != 0 && info.dli_fbase == w->self_base;
}

/* A loop blocked in a system call cannot be unwound from here, and a signal would cut its wait short
 * (EINTR: poll() and sleeps are never restarted, sd_bus_call() fails with it). Its stack can be read,
 * though: the return addresses into our code found above the stack pointer, innermost first, are the
 * calls it is waiting under (the frames of a sampler that reads words, not one that unwinds: an old
 * return address left in a dead slot may show up among them). Reads the loop's stack while it sleeps:
 * not for the sanitizers. */
__attribute__((no_sanitize_address)) static size_t
        stack_scan(LoopWatchdog *w, uintptr_t sp, uintptr_t pc, void **frames, size_t max) {
        size_t n = 0;

        if (pc && n < max)
                frames[n++] = (void *) pc;
        if (sp < w->stack_low || sp >= w->stack_high)
                return n;
        for (uintptr_t a = sp & ~(uintptr_t) 7;
             a + sizeof(uintptr_t) <= w->stack_high && a < sp + STACK_SCAN_MAX && n < max;
             a += sizeof(uintptr_t)) {
                uintptr_t v = *(const volatile uintptr_t *) a;

                if (v >= w->text_low + 8 && v < w->text_high && after_call(v))
                        frames[n++] = (void *) v;
        }
        return n;
}

/* The loop has been in iteration it for more than the threshold: where is it? */
static void sample(LoopWatchdog *w, uint64_t it) {
        char buf[256];
        long nr;
        unsigned long long args[6], sp, pc;
        ssize_t k;

        k = w->syscall_fd >= 0 ? pread(w->syscall_fd, buf, sizeof(buf) - 1, 0) : -1;
        if (k <= 0)
                return;
        buf[k] = 0;
        if (strneq(buf, "running", 7)) {
                /* on a CPU, not in a system call: unwound by itself, from the signal handler */
                if (w->have_action) {
                        atomic_store(&w->signalled_iteration, it);
                        (void) pthread_sigqueue(
                                w->loop_thread, SAMPLE_SIGNAL, (union sigval){ .sival_ptr = w });
                }
                return;
        }
        /* "nr args×6 sp pc" in a system call; "-1 sp pc" blocked outside one (a page fault) */
        if (sscanf(buf, "%ld", &nr) != 1)
                return;
        if (nr == -1 ? sscanf(buf, "%ld %llx %llx", &nr, &sp, &pc) != 3 :
                       sscanf(buf,
                              "%ld %llx %llx %llx %llx %llx %llx %llx %llx",
                              &nr,
                              &args[0],
                              &args[1],
                              &args[2],
                              &args[3],
                              &args[4],
                              &args[5],
                              &sp,
                              &pc) != 9)
                return;
        if (atomic_load(&w->iteration) != it)
                return; /* it ended meanwhile */
        const char *name = nr == -1 ? "no system call (a page fault)" : syscall_name(nr);
        if (name)
                snprintf(w->syscall, sizeof(w->syscall), "%s", name);
        else
                snprintf(w->syscall, sizeof(w->syscall), "syscall %ld", nr);
        w->n_frames = stack_scan(w, (uintptr_t) sp, (uintptr_t) pc, w->frames, STACK_FRAMES_MAX);
        w->frames_scanned = true;
        atomic_store(&w->sample_iteration, it);
}

static void *watcher_thread(void *userdata) {
        LoopWatchdog *w = userdata;
        uint64_t last = 0;

        while (!atomic_load(&w->stop)) {
                struct timespec ts = { .tv_nsec = (long) (WATCH_INTERVAL * NSEC_PER_USEC) };
                usec_t started;
                uint64_t it;

                (void) nanosleep(&ts, NULL);
                it = atomic_load(&w->iteration);
                started = atomic_load(&w->started);
                if (started == 0 || it == last || now_usec(CLOCK_MONOTONIC) < started + LOOP_WATCHDOG_THRESHOLD)
                        continue;
                last = it;
                sample(w, it);
        }
        return NULL;
}

/* What the kernel accounts to the loop's thread, in nanoseconds (schedstat's first two fields). */
typedef struct ThreadTimes {
        uint64_t cpu;  /* on a CPU */
        uint64_t wait; /* runnable, but waiting for a CPU */
} ThreadTimes;

static ThreadTimes thread_times(LoopWatchdog *w) {
        char buf[96];
        unsigned long long run, wait;
        ssize_t n;

        if (w->schedstat_fd < 0)
                return (ThreadTimes){};
        n = pread(w->schedstat_fd, buf, sizeof(buf) - 1, 0);
        if (n <= 0)
                return (ThreadTimes){};
        buf[n] = 0;
        if (sscanf(buf, "%llu %llu", &run, &wait) != 2)
                return (ThreadTimes){};
        return (ThreadTimes){ .cpu = run, .wait = wait };
}

static int find_text(struct dl_phdr_info *info, size_t size, void *userdata) {
        LoopWatchdog *w = userdata;

        if ((const void *) info->dlpi_addr != w->self_base)
                return 0;
        for (size_t i = 0; i < info->dlpi_phnum; i++) {
                const ElfW(Phdr) *ph = info->dlpi_phdr + i;

                if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
                        w->text_low = info->dlpi_addr + ph->p_vaddr;
                        w->text_high = w->text_low + ph->p_memsz;
                        return 1;
                }
        }
        return 0;
}

static void watch_setup(LoopWatchdog *w) {
        pthread_attr_t attr;
        void *stack_addr;
        size_t stack_size;
        Dl_info self;
        void *warm[2];

        /* Opened by the loop's thread: thread-self is resolved when opened. */
        w->schedstat_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (w->schedstat_fd < 0)
                log_debug_errno(errno, "Cannot open /proc/thread-self/schedstat, ignoring: %m");
        w->syscall_fd = open("/proc/thread-self/syscall", O_RDONLY | O_CLOEXEC);
        if (w->syscall_fd < 0)
                log_debug_errno(
                        errno, "Cannot open /proc/thread-self/syscall, the loop watchdog says no place: %m");
        w->loop_thread = pthread_self();
        if (pthread_getattr_np(w->loop_thread, &attr) == 0) {
                if (pthread_attr_getstack(&attr, &stack_addr, &stack_size) == 0) {
                        w->stack_low = (uintptr_t) stack_addr;
                        w->stack_high = (uintptr_t) stack_addr + stack_size;
                }
                (void) pthread_attr_destroy(&attr);
        }
        if (dladdr((const void *) loop_watchdog_new, &self) != 0) {
                w->self_base = self.dli_fbase;
                (void) dl_iterate_phdr(find_text, w);
        }

        /* The first backtrace() loads the unwinder (a dlopen() and malloc()): not in a signal handler. */
        (void) backtrace(warm, ELEMENTSOF(warm));

        struct sigaction sa = {
                .sa_sigaction = on_sample_signal,
                .sa_flags = SA_SIGINFO | SA_RESTART,
        };
        sigemptyset(&sa.sa_mask);
        if (sigaction(SAMPLE_SIGNAL, &sa, &w->old_action) < 0)
                log_debug_errno(
                        errno,
                        "Cannot catch signal %d, the loop watchdog samples no running stack: %m",
                        SAMPLE_SIGNAL);
        else
                w->have_action = true;
}

/* The watcher runs while the loop does: start-up (which forks a hashing child in the host probe)
 * stays single-threaded. It takes no signal: they are the loop's (signalfd). */
static void watcher_start(LoopWatchdog *w) {
        sigset_t all, old;
        int r;

        if (!w->enabled || w->have_watcher)
                return;
        sigfillset(&all);
        if (pthread_sigmask(SIG_SETMASK, &all, &old) != 0)
                return;
        r = pthread_create(&w->watcher, NULL, watcher_thread, w);
        (void) pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r != 0) {
                log_debug_errno(r, "Cannot start the loop watchdog's watcher, it says no place: %m");
                return;
        }
        w->have_watcher = true;
        (void) pthread_setname_np(w->watcher, "vmm-loop-watch");
}

static void watcher_stop(LoopWatchdog *w) {
        if (!w->have_watcher)
                return;
        atomic_store(&w->stop, true);
        (void) pthread_join(w->watcher, NULL);
        w->have_watcher = false;
        atomic_store(&w->stop, false);
}

int loop_watchdog_new(LoopWatchdog **ret, sd_event *event, const LoopWatchdogOptions *o) {
        _cleanup_(loop_watchdog_freep) LoopWatchdog *w = NULL;

        assert_return(ret, -EINVAL);
        assert_return(event, -EINVAL);
        assert_return(o, -EINVAL);

        w = calloc(1, sizeof(LoopWatchdog));
        if (!w)
                return -ENOMEM;
        w->event = sd_event_ref(event);
        w->schedstat_fd = w->syscall_fd = -EBADF;
        w->enabled = o->enabled || o->report_path;
        if (o->report_path) {
                w->report_path = strdup(o->report_path);
                if (!w->report_path)
                        return -ENOMEM;
        }
        if (w->enabled)
                watch_setup(w);

        *ret = TAKE_PTR(w);
        return 0;
}

LoopWatchdog *loop_watchdog_free(LoopWatchdog *w) {
        if (!w)
                return NULL;
        watcher_stop(w);
        if (w->have_action)
                (void) sigaction(SAMPLE_SIGNAL, &w->old_action, NULL);
        safe_close(w->schedstat_fd);
        safe_close(w->syscall_fd);
        sd_event_unref(w->event);
        free(w->report_path);
        return mfree(w);
}

const LoopStats *loop_watchdog_stats(LoopWatchdog *w) {
        assert(w);
        return &w->stats;
}

bool loop_watchdog_enabled(LoopWatchdog *w) {
        return w && w->enabled;
}

static void stats_observe(LoopStats *s, usec_t t) {
        size_t i = 0;

        while (i < LOOP_STATS_N_BOUNDS && t > loop_stats_bounds[i])
                i++;
        s->buckets[i]++;
        s->iterations++;
        s->sum += t;
        s->worst = MAX(s->worst, t);
}

/* One frame as text: "function file:line" from the sanitizers' symbolizer, else "symbol+0xoff
 * (module)" or "module+0xoff" for addr2line. */
static void frame_text(void *pc, bool return_address, char buf[static FRAME_TEXT_MAX]) {
        /* a return address points after its call: the call's line is the byte before */
        void *at = return_address ? (void *) ((uintptr_t) pc - 1) : pc;
        Dl_info info = {};

        if (__sanitizer_symbolize_pc) {
                __sanitizer_symbolize_pc(at, "%f %s:%l", buf, FRAME_TEXT_MAX);
                if (*buf && !strstr(buf, "<null>"))
                        return;
        }
        if (dladdr(at, &info) == 0 || !info.dli_fname) {
                snprintf(buf, FRAME_TEXT_MAX, "%p", pc);
                return;
        }
        const char *module = strrchr(info.dli_fname, '/');
        module = module ? module + 1 : info.dli_fname;
        if (info.dli_sname)
                snprintf(
                        buf,
                        FRAME_TEXT_MAX,
                        "%s+0x%tx (%s)",
                        info.dli_sname,
                        (char *) pc - (char *) info.dli_saddr,
                        module);
        else
                snprintf(buf, FRAME_TEXT_MAX, "%s+0x%tx", module, (char *) at - (char *) info.dli_fbase);
}

static void report_slow(LoopWatchdog *w, uint64_t it, usec_t wall, usec_t wait, usec_t cpu, const char *phase) {
        _cleanup_free_ char *line = NULL, *where = NULL;
        json_auto_t *stack = json_array(), *o = NULL;
        char text[FRAME_TEXT_MAX];
        bool sampled = atomic_load(&w->sample_iteration) == it;
        size_t n = sampled ? w->n_frames : 0, first = 0;

        /* An unwound stack starts with the handler's frames (the sanitizers', the signal trampoline):
         * it begins at the instruction the signal interrupted. A scanned one begins at the system
         * call's instruction. */
        if (sampled && !w->frames_scanned) {
                first = MIN(n, (size_t) 2);
                for (size_t i = 0; i < n; i++)
                        if (w->interrupted && w->frames[i] == w->interrupted) {
                                first = i;
                                break;
                        }
        }

        w->stats.slow++;
        for (size_t i = first; i < n; i++) {
                frame_text(w->frames[i], /* return_address= */ i > first, text);
                if (stack)
                        (void) json_array_append_new(stack, json_string(text));
                if (!where && frame_is_ours(w, w->frames[i]))
                        where = strdup(text);
        }

        log_warning(
                "Event loop iteration took %" PRIu64 ".%01" PRIu64 " ms (%" PRIu64 " ms of it on a CPU, %" PRIu64
                " ms waiting for one, in %s), over the %" PRIu64 " ms an iteration may take: %s%s%s%s",
                wall / USEC_PER_MSEC,
                (wall % USEC_PER_MSEC) / 100,
                cpu / USEC_PER_MSEC,
                wait / USEC_PER_MSEC,
                phase,
                LOOP_WATCHDOG_THRESHOLD / USEC_PER_MSEC,
                !sampled            ? "" :
                        *w->syscall ? "waiting in " :
                                      "running in ",
                sampled && *w->syscall ? w->syscall : "",
                sampled && *w->syscall ? "() under " : "",
                where ?: "no place sampled");

        if (!w->report_path)
                return;
        o = json_pack(
                "{s:I,s:I,s:I,s:s,s:s,s:s,s:O}",
                "usec",
                (json_int_t) wall,
                "waitUsec",
                (json_int_t) wait,
                "cpuUsec",
                (json_int_t) cpu,
                "phase",
                phase,
                "syscall",
                sampled ? w->syscall : "",
                "where",
                where ?: "",
                "stack",
                stack ?: json_null());
        if (!o)
                return (void) log_oom();
        line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!line)
                return (void) log_oom();

        /* One write of the whole line (its NUL becomes the newline), so that the lines of two daemons
         * sharing the file never mix. */
        size_t len = strlen(line);
        line[len] = '\n';
        _cleanup_close_ int fd = open(
                w->report_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644);
        if (fd < 0 || loop_write(fd, line, len + 1) < 0)
                log_warning_errno(errno, "Cannot append to %s, ignoring: %m", w->report_path);
}

/* One iteration: prepare, wait unless something is pending already, dispatch one source. The watcher
 * sees when it started (its wait left out) and which it is. */
static int loop_iteration(LoopWatchdog *w) {
        usec_t t0, t1, t2, t3, wall;
        ThreadTimes a = {}, b = {}, c = {}, d = {};
        uint64_t it = 0;
        int r;

        /* The thread's times are read around both halves, prepare and dispatch, so that neither half's
         * wait for a CPU counts as the loop's own time. */
        if (w->enabled)
                a = thread_times(w);
        t0 = now_usec(CLOCK_MONOTONIC);
        if (w->enabled) {
                it = atomic_fetch_add(&w->iteration, 1) + 1;
                atomic_store(&w->started, t0);
        }
        r = sd_event_prepare(w->event);
        t1 = t2 = now_usec(CLOCK_MONOTONIC);
        if (w->enabled)
                b = c = thread_times(w);
        if (r == 0) {
                if (w->enabled)
                        atomic_store(&w->started, 0);
                r = sd_event_wait(w->event, UINT64_MAX);
                t2 = now_usec(CLOCK_MONOTONIC);
                if (w->enabled) {
                        atomic_store(&w->started, t2 - (t1 - t0));
                        c = thread_times(w);
                }
        }
        if (r > 0)
                r = sd_event_dispatch(w->event);
        if (w->enabled) {
                atomic_store(&w->started, 0);
                d = thread_times(w);
        }
        t3 = now_usec(CLOCK_MONOTONIC);

        wall = (t1 - t0) + (t3 - t2);
        stats_observe(&w->stats, wall);
        if (w->enabled && wall > LOOP_WATCHDOG_THRESHOLD) {
                usec_t wait = (usec_t) ((b.wait - a.wait + d.wait - c.wait) / NSEC_PER_USEC),
                       cpu = (usec_t) ((b.cpu - a.cpu + d.cpu - c.cpu) / NSEC_PER_USEC);
                int code;

                /* Once the loop is told to exit it serves nothing more: the teardown that follows
                 * (every VM, pool and connection freed in one go) keeps nobody waiting. */
                if (sd_event_get_exit_code(w->event, &code) >= 0)
                        log_debug(
                                "Event loop iteration took %" PRIu64 " ms while exiting: not counted.",
                                wall / USEC_PER_MSEC);
                else if (wall - MIN(wait, wall) > LOOP_WATCHDOG_THRESHOLD)
                        report_slow(w, it, wall, wait, cpu, t1 - t0 > t3 - t2 ? "prepare" : "dispatch");
                else
                        log_debug(
                                "Event loop iteration took %" PRIu64 " ms, %" PRIu64
                                " ms of it waiting for a CPU: not the loop's doing.",
                                wall / USEC_PER_MSEC,
                                wait / USEC_PER_MSEC);
        }
        return r < 0 ? r : 0;
}

int loop_watchdog_run(LoopWatchdog *w) {
        _unused_ _cleanup_(sd_event_unrefp) sd_event *pin = sd_event_ref(w->event);
        int r, code;

        assert_return(w, -EINVAL);

        watcher_start(w);
        for (;;) {
                r = sd_event_get_state(w->event);
                if (r < 0)
                        break;
                if (r == SD_EVENT_FINISHED) {
                        r = sd_event_get_exit_code(w->event, &code);
                        if (r >= 0)
                                r = code;
                        break;
                }
                r = loop_iteration(w);
                if (r < 0)
                        break;
        }
        watcher_stop(w);
        return r;
}
