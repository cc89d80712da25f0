/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
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

/* The signal of the sampling timer: a real-time one nothing else here uses. */
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

        /* with the watchdog on */
        int schedstat_fd; /* the loop thread's /proc/thread-self/schedstat, or -EBADF */
        timer_t timer;
        bool have_timer;
        bool have_action;
        struct sigaction old_action;
        const void *self_base; /* where our executable is mapped: frames there are ours */

        /* written by the signal handler, on the loop's thread (the only one the timer signals) */
        volatile sig_atomic_t sampled;
        volatile sig_atomic_t n_frames;
        void *frames[STACK_FRAMES_MAX];
        void *interrupted; /* the instruction the signal interrupted, where the handler can tell */
};

static void on_sample_signal(int sig, siginfo_t *si, void *ucontext) {
        LoopWatchdog *w;
        int saved_errno = errno;

        if (si->si_code != SI_TIMER)
                return;
        w = si->si_value.sival_ptr;
        if (w && !w->sampled) {
                const ucontext_t *uc = ucontext;

#if defined(__x86_64__)
                w->interrupted = (void *) uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
                w->interrupted = (void *) uc->uc_mcontext.pc;
#else
                (void) uc;
                w->interrupted = NULL;
#endif
                w->n_frames = backtrace(w->frames, STACK_FRAMES_MAX);
                w->sampled = 1;
        }
        errno = saved_errno;
}

static void timer_arm(LoopWatchdog *w, usec_t after) {
        struct itimerspec its = {
                .it_value = { .tv_sec = (time_t) (after / USEC_PER_SEC),
                              .tv_nsec = (long) ((after % USEC_PER_SEC) * NSEC_PER_USEC) },
        };

        if (w->have_timer)
                (void) timer_settime(w->timer, 0, &its, NULL);
}

static void timer_disarm(LoopWatchdog *w) {
        timer_arm(w, 0);
}

/* Nanoseconds the loop's thread has spent runnable but waiting for a CPU (schedstat's second field). */
static uint64_t runqueue_wait_nsec(LoopWatchdog *w) {
        char buf[96];
        unsigned long long run, wait;
        ssize_t n;

        if (w->schedstat_fd < 0)
                return 0;
        n = pread(w->schedstat_fd, buf, sizeof(buf) - 1, 0);
        if (n <= 0)
                return 0;
        buf[n] = 0;
        if (sscanf(buf, "%llu %llu", &run, &wait) != 2)
                return 0;
        return wait;
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
        w->schedstat_fd = -EBADF;
        w->enabled = o->enabled || o->report_path;
        if (o->report_path) {
                w->report_path = strdup(o->report_path);
                if (!w->report_path)
                        return -ENOMEM;
        }
        if (!w->enabled) {
                *ret = TAKE_PTR(w);
                return 0;
        }

        /* Opened by the loop's thread: thread-self is resolved when opened. */
        w->schedstat_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (w->schedstat_fd < 0) {
                log_debug_errno(errno, "Cannot open /proc/thread-self/schedstat, ignoring: %m");
                w->schedstat_fd = -EBADF;
        }

        Dl_info self;
        if (dladdr((const void *) loop_watchdog_new, &self) != 0)
                w->self_base = self.dli_fbase;

        /* The first backtrace() loads the unwinder (a dlopen() and malloc()): not in a signal handler. */
        void *warm[2];
        (void) backtrace(warm, ELEMENTSOF(warm));

        struct sigaction sa = {
                .sa_sigaction = on_sample_signal,
                .sa_flags = SA_SIGINFO | SA_RESTART,
        };
        sigemptyset(&sa.sa_mask);
        if (sigaction(SAMPLE_SIGNAL, &sa, &w->old_action) < 0)
                log_debug_errno(
                        errno, "Cannot catch signal %d, the loop watchdog says no place: %m", SAMPLE_SIGNAL);
        else {
                struct sigevent sev = {
                        .sigev_notify = SIGEV_THREAD_ID,
                        .sigev_signo = SAMPLE_SIGNAL,
                        .sigev_value.sival_ptr = w,
                };

                w->have_action = true;
                sev._sigev_un._tid = gettid(); /* sigev_notify_thread_id, which glibc 2.36 does not name */
                if (timer_create(CLOCK_MONOTONIC, &sev, &w->timer) < 0)
                        log_debug_errno(
                                errno,
                                "Cannot create the sampling timer, the loop watchdog says no place: %m");
                else
                        w->have_timer = true;
        }

        *ret = TAKE_PTR(w);
        return 0;
}

LoopWatchdog *loop_watchdog_free(LoopWatchdog *w) {
        if (!w)
                return NULL;
        if (w->have_timer)
                (void) timer_delete(w->timer);
        if (w->have_action)
                (void) sigaction(SAMPLE_SIGNAL, &w->old_action, NULL);
        safe_close(w->schedstat_fd);
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

static bool frame_is_ours(LoopWatchdog *w, void *pc) {
        Dl_info info = {};

        return w->self_base && dladdr(pc, &info) != 0 && info.dli_fbase == w->self_base;
}

static void report_slow(LoopWatchdog *w, usec_t wall, usec_t wait, const char *phase) {
        _cleanup_free_ char *line = NULL, *where = NULL;
        json_auto_t *stack = json_array(), *o = NULL;
        char text[FRAME_TEXT_MAX];
        size_t n = w->sampled ? (size_t) w->n_frames : 0, first = MIN(n, (size_t) 2);

        /* The handler's frames come first (with the sanitizers', and the signal trampoline): the
         * stack starts at the instruction the signal interrupted. */
        for (size_t i = 0; i < n; i++)
                if (w->interrupted && w->frames[i] == w->interrupted) {
                        first = i;
                        break;
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
                "Event loop iteration took %" PRIu64 ".%01" PRIu64 " ms (%" PRIu64
                " ms of it waiting for a CPU, in %s), over the %" PRIu64 " ms an iteration may take: %s",
                wall / USEC_PER_MSEC,
                (wall % USEC_PER_MSEC) / 100,
                wait / USEC_PER_MSEC,
                phase,
                LOOP_WATCHDOG_THRESHOLD / USEC_PER_MSEC,
                where ?: "no stack sampled");

        if (!w->report_path)
                return;
        o = json_pack(
                "{s:I,s:I,s:s,s:s,s:O}",
                "usec",
                (json_int_t) wall,
                "waitUsec",
                (json_int_t) wait,
                "phase",
                phase,
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

/* One iteration: prepare, wait unless something is pending already, dispatch one source. */
static int loop_iteration(LoopWatchdog *w) {
        usec_t t0, t1, t2, t3, wall;
        uint64_t wait0 = 0, wait1 = 0;
        int r;

        if (w->enabled) {
                w->sampled = 0;
                timer_arm(w, LOOP_WATCHDOG_THRESHOLD);
        }
        t0 = now_usec(CLOCK_MONOTONIC);
        r = sd_event_prepare(w->event);
        t1 = t2 = now_usec(CLOCK_MONOTONIC);
        if (r == 0) {
                if (w->enabled)
                        timer_disarm(w);
                r = sd_event_wait(w->event, UINT64_MAX);
                t2 = now_usec(CLOCK_MONOTONIC);
                if (w->enabled)
                        timer_arm(
                                w,
                                LOOP_WATCHDOG_THRESHOLD > t1 - t0 ? LOOP_WATCHDOG_THRESHOLD - (t1 - t0) : 1);
        }
        if (w->enabled)
                wait0 = runqueue_wait_nsec(w);
        if (r > 0)
                r = sd_event_dispatch(w->event);
        if (w->enabled) {
                timer_disarm(w);
                wait1 = runqueue_wait_nsec(w);
        }
        t3 = now_usec(CLOCK_MONOTONIC);

        wall = (t1 - t0) + (t3 - t2);
        stats_observe(&w->stats, wall);
        if (w->enabled && wall > LOOP_WATCHDOG_THRESHOLD) {
                usec_t wait = (usec_t) ((wait1 - wait0) / NSEC_PER_USEC);

                if (wall - MIN(wait, wall) > LOOP_WATCHDOG_THRESHOLD)
                        report_slow(w, wall, wait, t1 - t0 > t3 - t2 ? "prepare" : "dispatch");
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

        for (;;) {
                r = sd_event_get_state(w->event);
                if (r < 0)
                        return r;
                if (r == SD_EVENT_FINISHED)
                        break;
                r = loop_iteration(w);
                if (r < 0)
                        return r;
        }
        r = sd_event_get_exit_code(w->event, &code);
        return r < 0 ? r : code;
}
