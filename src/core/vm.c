/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <libssh/libssh.h>
#include <linux/fs.h>
#include <linux/vm_sockets.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "attest-nonce.h"
#include "attest-policy.h"
#include "fs-util.h"
#include "hex-util.h"
#include "host-probe.h"
#include "image-catalog.h"
#include "json-util.h"
#include "log.h"
#include "manager.h"
#include "net-switch.h"
#include "network.h"
#include "parse-util.h"
#include "socket-util.h"
#include "storage.h"
#include "string-table.h"
#include "string-util.h"
#include "time-util.h"
#include "vm-cmdline.h"
#include "vm-launch.h"
#include "vm-qmp.h"
#include "vm-unit.h"
#include "vm.h"

#define VM_CONSOLE_TAIL_BYTES (64U * 1024U)
#define VM_CONSOLE_LINES_DEFAULT 100
#define VM_ERROR_CONSOLE_LINES 40
#define VM_ERROR_CONSOLE_BYTES (8U * 1024U)
/* How long after READY=1 a VM that must attest may take to post its ready-stage quote (or the boot
 * timeout, when that is shorter). */
#define VM_READY_QUOTE_GRACE (2 * USEC_PER_MINUTE)
#define VM_SWTPM_START_TIMEOUT (5 * USEC_PER_SEC)
#define VM_STOP_GRACE (5 * USEC_PER_SEC)
#define VM_PROBE_INTERVAL (5 * USEC_PER_MSEC)
#define VM_NOTIFY_MESSAGE_MAX (64U * 1024U)
#define VM_RECORD_MAX (4U * 1024U * 1024U)

/* ---- the record ---- */

typedef enum PendingKind {
        PENDING_STARTED,   /* the current start chain finished */
        PENDING_MILESTONE, /* create_vm's wait_for */
        PENDING_STOPPED,   /* the process is gone */
} PendingKind;

typedef struct Pending Pending;
struct Pending {
        PendingKind kind;
        VmWaitFor milestone;
        usec_t timeout; /* for the message */
        sd_event_source *deadline;
        VmDoneFunc done;
        void *userdata;
        Vm *vm;
        /* what to do once this one completes successfully (reboot: start; delete: tear down) */
        enum { THEN_NOTHING, THEN_START } then;
        Pending *next;
};

struct Vm {
        unsigned n_ref;
        Manager *manager;

        VmRecord rec;  /* what vm.json keeps */
        char *dir;     /* <state>/vms/<id> */
        int volume_fd; /* the storage lease, held while the VM exists in this daemon */
        pid_t qemu_pid, swtpm_pid;
        VmGuest guest;

        /* the processes and the start chain of the current run */
        VmLaunched *qemu, *swtpm, *vsockd;
        QmpClient *qmp;
        sd_event_source *phase_timer; /* install or boot timeout */
        sd_event_source *probe_timer; /* start chain: swtpm and vhost-device-vsock readiness */
        sd_event_source *stop_timer;  /* stop escalation */
        int notify_fd;
        sd_event_source *notify_source;
        sd_event_source *imds_source; /* <vm>/imds.sock: whoever connects there is this VM */
        char *notify_path;
        usec_t probe_deadline;
        bool starting;
        int start_step; /* START_* while starting */
        bool swtpm_up;
        char *guest_exit_status; /* EXIT_STATUS= from the guest's PID 1, for lastError */
        bool install_timed_out;
        char *fail_reason;   /* a verdict that ended the boot: the VM is failed once QEMU is gone */
        bool ready_reported; /* READY=1 arrived before the ready-stage quote it must wait for */
        int stop_step;       /* 0: none, 1: powerdown sent, 2: SIGTERM sent, 3: SIGKILL sent */
        Pending *pending;
        struct VmObserver {
                VmProgressFunc fn;
                void *userdata;
                struct VmObserver *next;
        } * observers;
};

static void vm_changed(Vm *v);
static void vm_check_pending(Vm *v);
static int vm_start_phase(Vm *v, VmPhase phase, ApiError *reterr);
static int vm_acquire_volume(Vm *v, VolumeCreate mode, ApiError *reterr);

static void vm_stop_processes_now(Vm *v);
static void vm_net_detach(Vm *v, bool remove);
static void vm_begin_stop(Vm *v);
static int on_stop_timer(sd_event_source *s, usec_t usec, void *userdata);
static int on_phase_timeout(sd_event_source *s, usec_t usec, void *userdata);
static void vm_ready_unattested(Vm *v);
static usec_t vm_ready_quote_grace(Vm *v);

void vm_unobserve(Vm *v, void *userdata) {
        for (struct VmObserver **i = &v->observers; *i;)
                if ((*i)->userdata == userdata) {
                        struct VmObserver *o = *i;
                        *i = o->next;
                        free(o);
                } else
                        i = &(*i)->next;
}

int vm_observe(Vm *v, VmProgressFunc progress, void *userdata) {
        struct VmObserver *o;

        if (!progress)
                return 0;
        o = calloc(1, sizeof(*o));
        if (!o)
                return -ENOMEM;
        o->fn = progress;
        o->userdata = userdata;
        o->next = v->observers;
        v->observers = o;
        return 0;
}

static void vm_detach_processes(Vm *v);

static Vm *vm_free(Vm *v) {
        /* a VM caught mid-start cannot be handed over: its chain would have no one to finish it */
        if (manager_detaching(v->manager) && !v->starting)
                vm_detach_processes(v);
        else
                vm_stop_processes_now(v);
        while (v->observers) {
                struct VmObserver *o = v->observers;
                v->observers = o->next;
                free(o);
        }
        while (v->pending) {
                Pending *p = v->pending;
                v->pending = p->next;
                sd_event_source_disable_unref(p->deadline);
                free(p);
        }
        vm_record_done(&v->rec);
        free(v->fail_reason);
        free(v->dir);
        safe_close(v->volume_fd);
        sd_event_source_disable_unref(v->imds_source);
        free(v->notify_path);
        free(v->guest_exit_status);
        vm_guest_done(&v->guest);
        free(v);
        return NULL;
}

Vm *vm_ref(Vm *v) {
        if (v)
                v->n_ref++;
        return v;
}

Vm *vm_unref(Vm *v) {
        if (!v)
                return NULL;
        assert(v->n_ref > 0);
        if (--v->n_ref > 0)
                return NULL;
        return vm_free(v);
}

const char *vm_id(Vm *v) {
        return v->rec.id;
}

const char *vm_name(Vm *v) {
        return v->rec.spec.name;
}

const char *vm_network(Vm *v) {
        return v->rec.spec.network;
}

VmState vm_state(Vm *v) {
        return v->rec.state;
}

usec_t vm_created_at(Vm *v) {
        return v->rec.created_at;
}

VmGuest *vm_guest(Vm *v) {
        return &v->guest;
}

void vm_times(Vm *v, usec_t *ret_created, usec_t *ret_installed, usec_t *ret_booted, usec_t *ret_ready) {
        if (ret_created)
                *ret_created = v->rec.created_at;
        if (ret_installed)
                *ret_installed = v->rec.installed_at;
        if (ret_booted)
                *ret_booted = v->rec.booted_at;
        if (ret_ready)
                *ret_ready = v->rec.ready_at;
}

pid_t vm_qemu_pid(Vm *v) {
        return vm_state_is_live(v->rec.state) ? v->qemu_pid : 0;
}

uint64_t vm_disk_bytes(Vm *v) {
        struct stat st;
        uint64_t size;

        if (v->volume_fd >= 0 && fstat(v->volume_fd, &st) >= 0) {
                if (S_ISREG(st.st_mode) && st.st_size > 0)
                        return (uint64_t) st.st_size;
                if (S_ISBLK(st.st_mode) && ioctl(v->volume_fd, BLKGETSIZE64, &size) >= 0)
                        return size;
        }
        return v->rec.spec.disk_gib << 30;
}

VmAttestation *vm_attestation(Vm *v) {
        return &v->rec.att;
}

const VmSpec *vm_spec(Vm *v) {
        return &v->rec.spec;
}

const char *vm_ssh_public_key(Vm *v) {
        return v->rec.ssh_public_key;
}

bool vm_user_data_released(Vm *v) {
        return v->rec.att.released;
}

char *vm_path(Vm *v, const char *name) {
        char *p = NULL;

        if (asprintf(&p, "%s/%s", v->dir, name) < 0)
                return NULL;
        return p;
}

/* The record as the API shows it, or as vm.json keeps it: with the units and pids a successor
 * attaches to (those of the processes that run now). */
static json_t *vm_record_json(Vm *v, bool for_disk) {
        if (for_disk) {
                VmLaunched *procs[_VM_ROLE_MAX] = { v->qemu, v->swtpm, v->vsockd };

                for (VmRole i = 0; i < _VM_ROLE_MAX; i++) {
                        const char *unit = procs[i] ? vm_launched_unit(procs[i]) : NULL;
                        char *copy = NULL;

                        if (unit && !(copy = strdup(unit)))
                                return NULL;
                        free(v->rec.processes[i].unit);
                        v->rec.processes[i] = (VmProcessRecord){
                                .unit = copy,
                                .pid = procs[i] ? vm_launched_pid(procs[i]) : 0,
                        };
                }
        }
        return vm_record_to_json(&v->rec, v->dir, for_disk);
}

json_t *vm_to_json(Vm *v) {
        return vm_record_json(v, false);
}

static int vm_save(Vm *v) {
        _cleanup_free_ char *path = vm_path(v, "vm.json"), *text = NULL;
        json_auto_t *j = vm_record_json(v, true);
        size_t n;
        int r;

        if (!path || !j)
                return -ENOMEM;
        text = json_dumps_pretty(j, &n);
        if (!text)
                return -ENOMEM;
        /* never a record the next start refuses to read (the request limits keep it far below) */
        if (n > VM_RECORD_MAX)
                r = -EFBIG;
        else
                r = write_file_atomic(path, text, n, 0600);
        if (r < 0)
                log_struct(
                        LOG_ERR, LOG_FIELDS({ "VM_ID", v->rec.id }), "Failed to save %s: %s", path, strerror(-r));
        return r;
}

/* Every change goes to disk and bumps the records' generation; waiters look at it. */
static void vm_changed(Vm *v) {
        (void) vm_save(v);
        manager_touch(v->manager);
        vm_check_pending(v);
}

VmForwards *vm_forwards(Vm *v) {
        return &v->rec.forwards;
}

void vm_forwards_changed(Vm *v) {
        vm_changed(v);
}

static void vm_set_state(Vm *v, VmState s) {
        if (v->rec.state == s)
                return;
        log_struct(
                LOG_INFO,
                LOG_FIELDS({ "VM_ID", v->rec.id }, { "VM_STATE", vm_state_to_string(s) }),
                "VM %s (%s): %s -> %s",
                v->rec.id,
                v->rec.spec.name,
                vm_state_to_string(v->rec.state),
                vm_state_to_string(s));
        v->rec.state = s;
        if (v->observers) {
                _cleanup_free_ char *msg = NULL;
                if (asprintf(&msg, "vm %s is %s", v->rec.id, vm_state_to_string(s)) >= 0)
                        for (struct VmObserver *o = v->observers; o; o = o->next)
                                o->fn(msg, o->userdata);
        }
}

/* lastError, with no console tail: a failure that has one adds it after (vm_set_failure()). */
static void vm_set_error(Vm *v, const char *text) {
        free(v->rec.last_error);
        v->rec.last_error = text ? strdup(text) : NULL;
        v->rec.console_tail = mfree(v->rec.console_tail);
}

static char *console_tail(Vm *v, int64_t n);
static void vm_become_ready(Vm *v);
static void vm_fail_boot(Vm *v, const char *reason, bool graceful);

/* The boot failed: state failed, lastError what (the root cause first), and the console's last lines
 * as they were then in consoleTail, without the terminal's escape sequences. */
static void vm_set_failure(Vm *v, const char *what, bool with_console) {
        vm_set_state(v, VM_STATE_FAILED);
        vm_set_error(v, what);
        if (with_console) {
                _cleanup_free_ char *tail = console_tail(v, VM_ERROR_CONSOLE_LINES);
                if (tail && *tail) {
                        size_t n;
                        strip_terminal_escapes(tail);
                        n = strlen(tail);
                        /* the last lines are the telling ones: cut from the front, at a line */
                        if (n > VM_ERROR_CONSOLE_BYTES) {
                                const char *start = tail + n - VM_ERROR_CONSOLE_BYTES,
                                           *nl = strchr(start, '\n');
                                memmove(tail, nl ? nl + 1 : start, strlen(nl ? nl + 1 : start) + 1);
                        }
                        if (*tail)
                                v->rec.console_tail = TAKE_PTR(tail);
                }
        }
}

/* The attestation verdict that explains this boot's end, when the VM had to attest and a quote of
 * this boot was rejected: the root cause of what the guest did next. NULL otherwise. */
static char *boot_rejection(Vm *v) {
        const AttestResult *r = v->rec.att.has_initrd && !v->rec.att.initrd.verified ? &v->rec.att.initrd :
                v->rec.att.has_ready && !v->rec.att.ready.verified                   ? &v->rec.att.ready :
                                                                                       NULL;
        char *t = NULL;

        if (!v->rec.att.required || !r)
                return NULL;
        asprintf_or_null(
                &t,
                "%s attestation rejected: %s",
                r == &v->rec.att.initrd ? "initrd" : "ready",
                r->message ?: "?");
        return t;
}

void vm_attest_changed(Vm *v, bool nonce) {
        /* the guest asks for its first nonce of the boot: it is attesting */
        if (nonce && v->rec.att.required && v->rec.state == VM_STATE_BOOTING)
                vm_set_state(v, VM_STATE_ATTESTING);
        vm_changed(v);
}

static bool vm_is_booting(Vm *v) {
        return v->rec.phase >= 0 && v->rec.phase == VM_PHASE_BOOT && v->qemu &&
                (v->rec.state == VM_STATE_BOOTING || v->rec.state == VM_STATE_ATTESTING ||
                 v->rec.state == VM_STATE_RUNNING || v->rec.state == VM_STATE_READY);
}

void vm_attest_verdict(Vm *v, const char *stage, bool verified, const char *message) {
        _cleanup_free_ char *prefix = NULL, *text = NULL;
        bool ready = stage && streq(stage, "ready");

        if (asprintf(&prefix, "%s attestation rejected: ", stage ?: "?") < 0)
                prefix = NULL;
        if (!verified) {
                const AttestResult *r = ready ? &v->rec.att.ready : &v->rec.att.initrd;

                asprintf_or_null(&text, "%s%s", prefix ?: "", message ?: "");
                /* A VM that must attest and whose quote was rejected for good (a golden mismatch, no
                 * golden value, another AK) will not get further: it is failed now, not minutes later
                 * when the guest gives up. A stale nonce is the guest's to retry. */
                if (v->rec.att.required && vm_is_booting(v) && !r->retryable &&
                    manager_settings(v->manager)->attestation != ATTEST_MODE_NOOP) {
                        /* in the initrd the guest waits for its user-data and can go at once */
                        vm_fail_boot(v, text ?: "attestation rejected", /* graceful= */ ready);
                        return;
                }
                vm_set_error(v, text);
        } else {
                if (prefix && v->rec.last_error && startswith(v->rec.last_error, prefix))
                        vm_set_error(v, NULL); /* a verified retry clears the rejection */
                /* READY=1 came first and waited for this quote */
                if (ready && v->ready_reported && vm_is_booting(v) && v->rec.state != VM_STATE_READY) {
                        vm_become_ready(v);
                        return;
                }
        }
        vm_changed(v);
}

/* ---- the console ---- */

/* The last n lines of console.log, from its final 64 KiB (a line cut there is dropped). */
static char *console_tail(Vm *v, int64_t n) {
        _cleanup_free_ char *path = vm_path(v, "console.log"), *buf = NULL;
        _cleanup_close_ int fd = -EBADF;
        struct stat st;
        off_t off = 0;
        ssize_t k;
        char *start, *end;

        if (!path)
                return NULL;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) < 0)
                return strdup("");
        if (st.st_size > (off_t) VM_CONSOLE_TAIL_BYTES)
                off = st.st_size - (off_t) VM_CONSOLE_TAIL_BYTES;
        buf = malloc(VM_CONSOLE_TAIL_BYTES + 1);
        if (!buf)
                return NULL;
        k = pread(fd, buf, VM_CONSOLE_TAIL_BYTES, off);
        if (k < 0)
                return strdup("");
        buf[k] = 0;
        start = buf;
        if (off > 0) {
                char *nl = strchr(buf, '\n');
                start = nl ? nl + 1 : buf + k;
        }
        /* serial consoles write \r\n; keep \n */
        end = buf + strlen(buf);
        {
                char *w = start;
                for (char *r = start; r < end; r++)
                        if (*r != '\r')
                                *w++ = *r;
                *w = 0;
                end = w;
        }
        while (end > start && end[-1] == '\n')
                *--end = 0;
        for (char *p = end; p > start; p--)
                if (p[-1] == '\n' && --n == 0) {
                        start = p;
                        break;
                }
        return strdup(start);
}

int vm_console_json(Vm *v, int64_t lines, json_t **ret, ApiError *reterr) {
        _cleanup_free_ char *text = NULL;
        int64_t n = lines <= 0 ? VM_CONSOLE_LINES_DEFAULT : lines;

        text = console_tail(v, MIN(n, (int64_t) VM_CONSOLE_LINES_MAX));
        if (!text)
                return -ENOMEM;
        *ret = json_pack("{s:s,s:I,s:s}", "id", v->rec.id, "lines", (json_int_t) n, "console", text);
        return *ret ? 0 : -ENOMEM;
}

/* ---- waiters ---- */

static void pending_complete(Vm *v, Pending *p, int r, const ApiError *e);

static void pending_unlink(Vm *v, Pending *p) {
        for (Pending **i = &v->pending; *i; i = &(*i)->next)
                if (*i == p) {
                        *i = p->next;
                        break;
                }
        p->deadline = sd_event_source_disable_unref(p->deadline);
}

static int on_pending_deadline(sd_event_source *s, usec_t usec, void *userdata) {
        Pending *p = userdata;
        Vm *v = p->vm;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        char d[32];

        format_duration(d, sizeof(d), p->timeout);
        (void) api_error_set(
                &e,
                -ETIMEDOUT,
                API_ERROR_TIMEOUT,
                "vm %s did not reach %s within %s (state %s); vm %s is %s%s%s (follow it with get_vm %s, delete it with delete_vm)",
                v->rec.id,
                vm_wait_for_to_string(p->milestone),
                d,
                vm_state_to_string(v->rec.state),
                v->rec.id,
                vm_state_to_string(v->rec.state),
                v->rec.last_error ? ": " : "",
                v->rec.last_error ?: "",
                v->rec.id);
        pending_complete(v, p, e.error, &e);
        return 0;
}

static Pending *pending_add(Vm *v, PendingKind kind, VmDoneFunc done, void *userdata) {
        Pending *p = calloc(1, sizeof(Pending));

        if (!p)
                return NULL;
        p->kind = kind;
        p->done = done;
        p->userdata = userdata;
        p->vm = v;
        /* append: completions run in the order the operations arrived */
        Pending **i = &v->pending;
        while (*i)
                i = &(*i)->next;
        *i = p;
        return p;
}

static int pending_set_deadline(Vm *v, Pending *p, usec_t timeout) {
        p->timeout = timeout;
        return sd_event_add_time_relative(
                manager_event(v->manager),
                &p->deadline,
                CLOCK_MONOTONIC,
                timeout,
                USEC_PER_MSEC,
                on_pending_deadline,
                p);
}

static void pending_complete(Vm *v, Pending *p, int r, const ApiError *e) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        _cleanup_(api_error_done) ApiError e2 = API_ERROR_NULL;
        json_auto_t *record = NULL;
        VmDoneFunc done = p->done;
        void *userdata = p->userdata;
        int then = p->then;

        pending_unlink(v, p);
        free(p);
        if (r < 0 || then != THEN_START)
                vm_unobserve(v, userdata); /* the operation ends here: no more progress for it */

        if (r >= 0 && then == THEN_START) {
                /* reboot: the stop finished, now the start; its completion answers the caller */
                if (vm_start(v, done, userdata, &e2) < 0) {
                        vm_unobserve(v, userdata);
                        if (done)
                                done(e2.error, NULL, &e2, userdata);
                }
                return;
        }
        if (!done)
                return;
        if (r < 0) {
                done(r, NULL, e, userdata);
                return;
        }
        record = vm_to_json(v);
        if (!record) {
                (void) api_error_set(&e2, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                done(e2.error, NULL, &e2, userdata);
                return;
        }
        done(0, record, NULL, userdata);
}

static bool milestone_reached(Vm *v, VmWaitFor w) {
        switch (w) {
        case VM_WAIT_NONE:
                return true;
        case VM_WAIT_INSTALLED:
                return v->rec.installed_at != 0;
        case VM_WAIT_ATTESTED:
                return v->rec.booted_at != 0 && v->rec.att.released;
        case VM_WAIT_READY:
                return v->rec.ready_at != 0;
        default:
                return false;
        }
}

/* Settles whatever the current state decides: milestones reached or failed, stops finished. */
static void vm_check_pending(Vm *v) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        bool again = true;

        while (again) {
                again = false;
                for (Pending *p = v->pending; p; p = p->next) {
                        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

                        if (p->kind == PENDING_STOPPED && !v->qemu && !v->starting) {
                                pending_complete(v, p, 0, NULL);
                                again = true;
                                break;
                        }
                        if (p->kind != PENDING_MILESTONE)
                                continue;
                        if (v->rec.state != VM_STATE_FAILED && milestone_reached(v, p->milestone)) {
                                pending_complete(v, p, 0, NULL);
                                again = true;
                                break;
                        }
                        if (v->rec.state == VM_STATE_FAILED || v->rec.state == VM_STATE_STOPPING ||
                            v->rec.state == VM_STATE_STOPPED || v->rec.state == VM_STATE_DELETING) {
                                if (v->rec.state == VM_STATE_FAILED || v->fail_reason)
                                        (void) api_error_set(
                                                &e,
                                                -EIO,
                                                API_ERROR_VM_FAILED,
                                                "%s; vm %s is failed (follow it with get_vm %s, delete it with delete_vm)",
                                                v->fail_reason            ?:
                                                        v->rec.last_error ?:
                                                                            "unknown error",
                                                v->rec.id,
                                                v->rec.id);
                                else
                                        (void) api_error_set(
                                                &e,
                                                -EIO,
                                                API_ERROR_VM_FAILED,
                                                "vm is %s; vm %s is %s (follow it with get_vm %s, delete it with delete_vm)",
                                                vm_state_to_string(v->rec.state),
                                                v->rec.id,
                                                vm_state_to_string(v->rec.state),
                                                v->rec.id);
                                pending_complete(v, p, e.error, &e);
                                again = true;
                                break;
                        }
                }
        }
}

static void start_finished(Vm *v, int r, const ApiError *e) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);

        Pending *mine = NULL, **tail = &mine;

        v->starting = false;
        v->probe_timer = sd_event_source_disable_unref(v->probe_timer);
        /* Take this chain's waiters out first: a completion may start another chain (reboot). */
        for (Pending **i = &v->pending; *i;)
                if ((*i)->kind == PENDING_STARTED) {
                        Pending *p = *i;
                        *i = p->next;
                        p->next = NULL;
                        *tail = p;
                        tail = &p->next;
                } else
                        i = &(*i)->next;
        while (mine) {
                Pending *p = mine;
                mine = p->next;
                pending_complete(v, p, r, e);
        }
        vm_check_pending(v);
}

/* ---- processes ---- */

static void notify_close(Vm *v) {
        v->notify_source = sd_event_source_disable_unref(v->notify_source);
        v->notify_fd = safe_close(v->notify_fd);
        if (v->notify_path) {
                (void) unlink(v->notify_path);
                v->notify_path = mfree(v->notify_path);
        }
}

/* Closes the QMP connection. It is detached from v first: closing calls the client's callbacks
 * (a pending readiness one among them), which must find it is no longer ours. */
static void vm_qmp_drop(Vm *v) {
        QmpClient *q = TAKE_PTR(v->qmp);

        if (!q)
                return;
        qmp_client_close(q);
        qmp_client_unref(q);
}

static void vm_stop_processes_now(Vm *v) {
        vm_qmp_drop(v);
        if (v->qemu)
                (void) vm_launched_kill(v->qemu, SIGKILL, true);
        if (v->swtpm)
                (void) vm_launched_kill(v->swtpm, SIGKILL, true);
        if (v->vsockd)
                (void) vm_launched_kill(v->vsockd, SIGKILL, true);
        v->qemu = vm_launched_free(v->qemu);
        v->swtpm = vm_launched_free(v->swtpm);
        v->vsockd = vm_launched_free(v->vsockd);
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        v->probe_timer = sd_event_source_disable_unref(v->probe_timer);
        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        v->stop_step = 0;
        notify_close(v);
}

/* The daemon goes, the VM stays: forget the units (they keep running) and close our ends. */
static void vm_detach_processes(Vm *v) {
        vm_qmp_drop(v);
        v->qemu = vm_launched_detach(v->qemu);
        v->swtpm = vm_launched_detach(v->swtpm);
        v->vsockd = vm_launched_detach(v->vsockd);
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        v->probe_timer = sd_event_source_disable_unref(v->probe_timer);
        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        /* the READY=1 socket goes with us; the next daemon listens again */
        v->notify_source = sd_event_source_disable_unref(v->notify_source);
        v->notify_fd = safe_close(v->notify_fd);
        v->notify_path = mfree(v->notify_path);
}

/* The helpers end with QEMU: swtpm by itself (--terminate), asked again here; vhost-device-vsock
 * would wait for the next frontend forever, and holds no state, so it is killed. */
static void stop_helpers(Vm *v) {
        if (v->swtpm)
                (void) vm_launched_kill(v->swtpm, SIGTERM, false);
        v->vsockd = vm_launched_free(v->vsockd);
}

static void on_helper_exit(VmLaunched *p, int code, int status, void *userdata) {
        Vm *v = userdata;
        _cleanup_free_ char *st = vm_exit_status_to_string(code, status);

        if (p == v->swtpm) {
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "swtpm of %s exited: %s",
                        v->rec.id,
                        st ?: "?");
                v->swtpm = vm_launched_free(v->swtpm);
                v->swtpm_pid = 0;
        } else if (p == v->vsockd) {
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "vhost-device-vsock of %s exited: %s",
                        v->rec.id,
                        st ?: "?");
                v->vsockd = vm_launched_free(v->vsockd);
        }
}

static char *file_tail(const char *path, size_t max) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        char *buf;
        ssize_t k;
        off_t off = 0;

        if (fd < 0 || fstat(fd, &st) < 0)
                return strdup("");
        if (st.st_size > (off_t) max)
                off = st.st_size - (off_t) max;
        buf = malloc(max + 1);
        if (!buf)
                return NULL;
        k = pread(fd, buf, max, off);
        buf[k > 0 ? k : 0] = 0;
        for (size_t n = strlen(buf); n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '); n--)
                buf[n - 1] = 0;
        return buf;
}

static void on_qemu_exit(VmLaunched *p, int code, int status, void *userdata) {
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        _cleanup_free_ char *st = vm_exit_status_to_string(code, status), *msg = NULL;
        bool ok = code == CLD_EXITED && status == 0;

        vm_qmp_drop(v);
        vm_net_detach(v, false);
        v->qemu = vm_launched_free(v->qemu);
        v->qemu_pid = 0;
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        v->stop_step = 0;
        notify_close(v);
        stop_helpers(v);

        log_struct(
                LOG_INFO, LOG_FIELDS({ "VM_ID", v->rec.id }), "QEMU of VM %s exited: %s", v->rec.id, st ?: "?");

        if (v->starting) {
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
                _cleanup_free_ char *qlog = vm_path(v, "qemu.log"),
                                    *tail = qlog ? file_tail(qlog, 8192) : NULL;

                (void) api_error_set(
                        &e, -EIO, API_ERROR_INTERNAL, "qemu exited during start (%s): %s", st ?: "?", tail ?: "");
                vm_set_failure(v, e.message, /* with_console= */ false);
                (void) vm_save(v);
                manager_touch(v->manager);
                start_finished(v, e.error, &e);
                return;
        }

        switch (v->rec.state) {
        case VM_STATE_DELETING:
                break;
        case VM_STATE_STOPPING:
                if (v->fail_reason) {
                        /* powered off for a verdict: failed, and lastError still says why */
                        _cleanup_free_ char *why = TAKE_PTR(v->fail_reason);
                        vm_set_failure(v, why, /* with_console= */ false);
                } else
                        vm_set_state(v, VM_STATE_STOPPED);
                break;
        default:
                if (v->rec.phase >= 0 && v->rec.phase == VM_PHASE_INSTALL) {
                        if (ok && !v->install_timed_out && v->rec.state == VM_STATE_INSTALLING) {
                                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

                                v->rec.installed_at = now_usec(CLOCK_REALTIME);
                                if (v->rec.created_at > 0 && v->rec.installed_at >= v->rec.created_at)
                                        manager_observe_install(
                                                v->manager, v->rec.installed_at - v->rec.created_at);
                                if (manager_shutting_down(v->manager)) {
                                        vm_set_state(v, VM_STATE_STOPPED);
                                        vm_set_error(
                                                v,
                                                "vm-manager shut down before the installed boot started; start the VM");
                                        break;
                                }
                                if (vm_start_phase(v, VM_PHASE_BOOT, &e) < 0) {
                                        _cleanup_free_ char *t = NULL;
                                        asprintf_or_null(&t, "start installed boot: %s", e.message ?: "error");
                                        vm_set_failure(v, t ?: "start installed boot failed", false);
                                }
                                break;
                        }
                        if (v->install_timed_out) {
                                char d[32];
                                format_duration(d, sizeof(d), manager_settings(v->manager)->install_timeout);
                                asprintf_or_null(&msg, "installer did not finish within %s", d);
                        } else
                                asprintf_or_null(&msg, "installer exited: %s", st ?: "?");
                        vm_set_failure(v, msg ?: "installer failed", /* with_console= */ true);
                        break;
                }
                if (ok && v->guest_exit_status && !streq(v->guest_exit_status, "0")) {
                        /* a guest whose PID 1 exited with a failure (the image does so instead of
                         * sitting in emergency mode): a failed boot, the rejected quote that made
                         * it give up first when there is one, and the console to say the rest */
                        _cleanup_free_ char *cause = boot_rejection(v);
                        asprintf_or_null(
                                &msg,
                                "%s%sguest shut down (EXIT_STATUS=%s)",
                                cause ?: "",
                                cause ? "; then the " : "",
                                v->guest_exit_status);
                        vm_set_failure(v, msg ?: "guest shut down with a failure", /* with_console= */ true);
                } else if (ok) {
                        vm_set_state(v, VM_STATE_STOPPED);
                        vm_set_error(v, "guest shut down");
                } else {
                        _cleanup_free_ char *cause = boot_rejection(v);
                        asprintf_or_null(
                                &msg, "%s%sqemu exited: %s", cause ?: "", cause ? "; then " : "", st ?: "?");
                        vm_set_failure(v, msg ?: "qemu failed", /* with_console= */ true);
                }
        }
        v->install_timed_out = false;
        vm_changed(v);
}

static int on_phase_timeout(sd_event_source *s, usec_t usec, void *userdata) {
        Vm *v = userdata;
        char d[32];

        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        if (v->rec.phase == VM_PHASE_INSTALL) {
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "Installer of VM %s overran, killing it.",
                        v->rec.id);
                v->install_timed_out = true;
                if (v->qemu)
                        (void) vm_launched_kill(v->qemu, SIGKILL, true);
                return 0;
        }
        if (v->ready_reported &&
            (v->rec.state == VM_STATE_BOOTING || v->rec.state == VM_STATE_ATTESTING ||
             v->rec.state == VM_STATE_RUNNING)) {
                _cleanup_free_ char *t = NULL;
                format_duration(d, sizeof(d), vm_ready_quote_grace(v));
                asprintf_or_null(
                        &t,
                        "attestation required: the guest sent READY=1, but no verified ready-stage quote followed "
                        "within %s (its ready-stage attestation did not run or did not reach the metadata service)",
                        d);
                vm_fail_boot(v, t ?: "attestation required: no ready-stage quote", /* graceful= */ true);
                return 0;
        }
        if (v->rec.state == VM_STATE_BOOTING || v->rec.state == VM_STATE_ATTESTING) {
                _cleanup_free_ char *t = NULL;
                format_duration(d, sizeof(d), manager_settings(v->manager)->boot_timeout);
                asprintf_or_null(&t, "no READY=1 within %s; the guest is up but has not reported ready", d);
                vm_set_state(v, VM_STATE_RUNNING);
                vm_set_error(v, t);
                vm_changed(v);
        }
        return 0;
}

static void on_ready_message(Vm *v, char *msg) {
        bool ready = false;

        for (char *line = strtok(msg, "\n"); line; line = strtok(NULL, "\n")) {
                if (streq(line, "READY=1"))
                        ready = true;
                else if (strneq(line, "STATUS=", 7) && line[7]) {
                        free(v->rec.status);
                        v->rec.status = strdup(line + 7);
                } else if (strneq(line, "EXIT_STATUS=", 12)) {
                        free(v->guest_exit_status);
                        v->guest_exit_status = strdup(line + 12);
                } else if (strneq(line, "X_SYSTEMD_UNIT_ACTIVE=", 22))
                        log_struct(
                                LOG_INFO,
                                LOG_FIELDS({ "VM_ID", v->rec.id }, { "GUEST_UNIT", line + 22 }),
                                "VM %s: guest unit %s is active",
                                v->rec.id,
                                line + 22);
        }
        if (ready &&
            (v->rec.state == VM_STATE_BOOTING || v->rec.state == VM_STATE_ATTESTING ||
             v->rec.state == VM_STATE_RUNNING)) {
                if (v->rec.att.required && !(v->rec.att.has_ready && v->rec.att.ready.verified)) {
                        vm_ready_unattested(v);
                        return;
                }
                vm_become_ready(v);
                return;
        }
        vm_changed(v);
}

static void vm_become_ready(Vm *v) {
        v->rec.ready_at = now_usec(CLOCK_REALTIME);
        if (v->rec.booted_at > 0 && v->rec.ready_at >= v->rec.booted_at)
                manager_observe_boot_to_ready(v->manager, v->rec.ready_at - v->rec.booted_at);
        v->rec.booted = true;
        v->ready_reported = false;
        vm_set_error(v, NULL);
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        vm_set_state(v, VM_STATE_READY);
        vm_changed(v);
}

/* READY=1 from a VM that must attest and has no verified ready-stage quote yet. Without a verified
 * initrd quote it never will: it booted without its user-data, and is failed. Otherwise its ready
 * quote may still be on the way, for VM_READY_QUOTE_GRACE. */
static usec_t vm_ready_quote_grace(Vm *v) {
        return MIN(VM_READY_QUOTE_GRACE, manager_settings(v->manager)->boot_timeout);
}

static void vm_ready_unattested(Vm *v) {
        _cleanup_free_ char *t = NULL;
        int r;

        v->ready_reported = true;
        if (!(v->rec.att.has_initrd && v->rec.att.initrd.verified)) {
                asprintf_or_null(
                        &t,
                        "attestation required: the guest sent READY=1 without a verified initrd quote (%s%s); "
                        "its user-data was not released",
                        v->rec.att.has_initrd ? "its quote was rejected: " :
                                v->rec.att.nonce_issued_at ?
                                                "it asked for a nonce but posted no quote" :
                                                "it never asked for a nonce: does the image run vm-agent?",
                        v->rec.att.has_initrd ? v->rec.att.initrd.message ?: "?" : "");
                vm_fail_boot(v, t ?: "attestation required: no verified initrd quote", /* graceful= */ true);
                return;
        }
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        r = sd_event_add_time_relative(
                manager_event(v->manager),
                &v->phase_timer,
                CLOCK_MONOTONIC,
                vm_ready_quote_grace(v),
                USEC_PER_MSEC,
                on_phase_timeout,
                v);
        if (r < 0)
                log_warning_errno(r, "No timer for the ready quote of %s, ignoring: %m", v->rec.id);
        vm_changed(v);
}

/* Ends a boot that cannot succeed: the waiters hear reason at once, QEMU is powered off (SIGTERM at
 * once, or ACPI first when graceful), and the VM is failed with reason as lastError once it is gone. */
static void vm_fail_boot(Vm *v, const char *reason, bool graceful) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);

        if (v->fail_reason || v->rec.state == VM_STATE_STOPPING || v->rec.state == VM_STATE_DELETING)
                return; /* on its way down already */
        log_struct(
                LOG_WARNING,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "VM %s (%s) failed: %s; powering it off.",
                v->rec.id,
                v->rec.spec.name,
                reason);
        v->ready_reported = false;
        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        if (!v->qemu) {
                vm_set_failure(v, reason, /* with_console= */ false);
                vm_changed(v);
                return;
        }
        v->fail_reason = strdup(reason);
        vm_set_error(v, reason);
        vm_set_state(v, VM_STATE_STOPPING);
        vm_changed(v);
        if (graceful)
                vm_begin_stop(v);
        else if (v->qemu && v->stop_step == 0) {
                v->stop_step = 1;
                (void) on_stop_timer(NULL, 0, v); /* SIGTERM now, SIGKILL after the grace */
        }
}

/* A listener whose accept() fails for want of descriptors or memory stays readable: level-triggered,
 * it would run the loop hot. Past this many dispatches in a tenth of a second it pauses until the
 * tenth is over, which no guest's real traffic comes near (a VM holds 16 metadata connections). */
#define VM_LISTENER_BURST 200U
static int listener_ratelimit(sd_event_source *s) {
        return sd_event_source_set_ratelimit(s, 100 * USEC_PER_MSEC, VM_LISTENER_BURST);
}

typedef struct NotifyConn {
        Vm *vm;
        sd_event_source *source;
        char buf[VM_NOTIFY_MESSAGE_MAX + 1];
        size_t len;
} NotifyConn;

static int on_notify_data(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        NotifyConn *c = userdata;
        ssize_t k = read(fd, c->buf + c->len, VM_NOTIFY_MESSAGE_MAX - c->len);

        if (k > 0)
                c->len += (size_t) k;
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
                return 0;
        /* One message per connection: the sender waits for us to close, so take what came and close. */
        c->buf[c->len] = 0;
        if (c->len > 0 && c->vm)
                on_ready_message(c->vm, c->buf);
        vm_unref(c->vm);
        sd_event_source_disable_unref(c->source);
        free(c);
        return 0;
}

/* Takes the connection, whatever happens. */
static int notify_conn_new(Vm *v, int fd) {
        _cleanup_close_ int cfd = fd;
        NotifyConn *c;
        int r;

        c = calloc(1, sizeof(NotifyConn));
        if (!c)
                return -ENOMEM;
        c->vm = vm_ref(v);
        r = sd_event_add_io(manager_event(v->manager), &c->source, cfd, EPOLLIN, on_notify_data, c);
        if (r < 0) {
                vm_unref(c->vm);
                free(c);
                return r;
        }
        (void) sd_event_source_set_io_fd_own(c->source, true);
        TAKE_FD(cfd);
        return 0;
}

static int on_notify_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (cfd >= 0)
                (void) notify_conn_new(userdata, cfd);
        return 0;
}

/* vhost-device-vsock hands a guest connection to host port P to the unix socket <uds>_<P>. */
static int notify_listen(Vm *v) {
        _cleanup_close_ int fd = -EBADF;
        int r;

        notify_close(v);
        if (asprintf(&v->notify_path, "%s/vsock_%u", v->dir, manager_settings(v->manager)->notify_port) < 0) {
                v->notify_path = NULL;
                return -ENOMEM;
        }
        fd = unix_stream_listen(v->notify_path, 8);
        if (fd < 0)
                return fd;
        r = sd_event_add_io(manager_event(v->manager), &v->notify_source, fd, EPOLLIN, on_notify_accept, v);
        if (r < 0)
                return r;
        (void) listener_ratelimit(v->notify_source);
        v->notify_fd = TAKE_FD(fd);
        return 0;
}

/* The kernel's vhost-vsock: one AF_VSOCK listener on the notify port for every VM, a guest known by
 * the CID its connection comes from. The manager holds it; it listens from the first VM that needs it. */
struct VmNotify {
        Manager *manager;
        int fd;
        sd_event_source *source;
};

int vm_notify_new(VmNotify **ret, Manager *m) {
        VmNotify *n = calloc(1, sizeof(VmNotify));

        if (!n)
                return -ENOMEM;
        n->manager = m;
        n->fd = -EBADF;
        *ret = n;
        return 0;
}

VmNotify *vm_notify_free(VmNotify *n) {
        if (!n)
                return NULL;
        sd_event_source_disable_unref(n->source);
        safe_close(n->fd);
        free(n);
        return NULL;
}

static Vm *vm_by_cid(Manager *m, uint32_t cid) {
        Vm *v;

        MANAGER_FOREACH_VM(v, m, i)
        if (v->rec.vsock == VM_VSOCK_VHOST && v->rec.cid == cid && v->rec.phase >= 0)
                return v;
        return NULL;
}

static int on_vsock_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        VmNotify *n = userdata;
        struct sockaddr_vm peer = {};
        socklen_t len = sizeof(peer);
        _cleanup_close_ int cfd = accept4(fd, (struct sockaddr *) &peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        Vm *v;

        if (cfd < 0)
                return 0;
        v = len >= sizeof(peer) && peer.svm_family == AF_VSOCK ? vm_by_cid(n->manager, peer.svm_cid) : NULL;
        if (!v) {
                log_debug("READY=1 connection from unknown CID %u, closed.", (unsigned) peer.svm_cid);
                return 0;
        }
        (void) notify_conn_new(v, TAKE_FD(cfd));
        return 0;
}

static int vsock_listen(VmNotify *n) {
        _cleanup_close_ int fd = -EBADF;
        uint32_t port = manager_settings(n->manager)->notify_port;
        struct sockaddr_vm sa = {
                .svm_family = AF_VSOCK,
                .svm_cid = VMADDR_CID_ANY,
                .svm_port = port,
        };
        int r;

        if (n->source)
                return 0;
        fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(fd, 64) < 0)
                return -errno;
        r = sd_event_add_io(manager_event(n->manager), &n->source, fd, EPOLLIN, on_vsock_accept, n);
        if (r < 0)
                return r;
        (void) listener_ratelimit(n->source);
        n->fd = TAKE_FD(fd);
        log_debug("Listening for READY=1 on vsock port %u.", (unsigned) port);
        return 0;
}

/* The transport of a VM's next run: the host's choice; a kernel vhost-vsock whose listener cannot be
 * opened leaves the VM without READY=1 rather than without a start. */
static VmVsock vm_pick_vsock(Vm *v) {
        int r;

        switch (host_probe_notify(manager_host(v->manager), NULL)) {
        case HOST_NOTIFY_VHOST:
                r = vsock_listen(manager_notify(v->manager));
                if (r >= 0)
                        return VM_VSOCK_VHOST;
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s starts without READY=1: no AF_VSOCK listener on port %u: %s",
                        v->rec.id,
                        (unsigned) manager_settings(v->manager)->notify_port,
                        strerror(-r));
                return VM_VSOCK_NONE;
        case HOST_NOTIFY_VHOST_USER:
                return VM_VSOCK_VHOST_USER;
        default:
                return VM_VSOCK_NONE;
        }
}

/* ---- the network ---- */

Manager *vm_manager(Vm *v) {
        return v->manager;
}

const char *vm_ip(Vm *v) {
        return v->rec.ip;
}

/* The VM's port on its network's switch, added on first use: the lease is the port's identity. */
NetPort *vm_port(Vm *v, bool create) {
        NetSwitch *sw = manager_switch_get(v->manager, v->rec.spec.network);
        Network *n = network_registry_get(manager_networks(v->manager), v->rec.spec.network);
        const NetworkLease *l = n ? network_lease_find(n, v->rec.id) : NULL;
        NetPort *p;

        if (!sw)
                return NULL;
        p = net_switch_find_port(sw, v->rec.id);
        if (p || !create || !l)
                return p;
        if (net_switch_add_port(sw, v->rec.id, l->mac, l->ip, &p) < 0)
                return NULL;
        return p;
}

static int on_imds_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Vm *v = userdata;
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (cfd < 0)
                return 0;
        if (v->rec.state == VM_STATE_DELETING || !manager_imds_accept(v->manager, v, cfd))
                (void) close(cfd);
        return 0;
}

/* The VM's metadata listener, which the gateway connects the guest's IMDS requests to. The listener
 * is the identity: nothing but this VM's port reaches it. */
static int vm_imds_listen(Vm *v, NetPort *p) {
        _cleanup_free_ char *path = vm_path(v, "imds.sock");
        _cleanup_close_ int fd = -EBADF;
        int r;

        if (!path)
                return -ENOMEM;
        if (!v->imds_source) {
                fd = unix_stream_listen(path, 64);
                if (fd < 0)
                        return fd;
                r = sd_event_add_io(manager_event(v->manager), &v->imds_source, fd, EPOLLIN, on_imds_accept, v);
                if (r < 0)
                        return r;
                (void) listener_ratelimit(v->imds_source);
                (void) sd_event_source_set_io_fd_own(v->imds_source, true);
                TAKE_FD(fd);
        }
        return net_port_set_imds(p, path);
}

/* QEMU listens on <vm>/net.sock; the switch dials it once QEMU's monitor answers, and again after a
 * daemon restart. A VM whose NIC cannot be linked still runs, without a network, and says so. */
static void vm_net_attach(Vm *v) {
        _cleanup_free_ char *path = vm_path(v, "net.sock");
        NetPort *p = vm_port(v, true);
        int r;

        if (!path)
                return;
        r = p ? net_port_dial(p, path) : -ENOENT;
        if (p) {
                /* the metadata listener stands whether or not the NIC answered this time */
                Network *n = network_registry_get(manager_networks(v->manager), v->rec.spec.network);
                int k = n && n->enable_imds ? vm_imds_listen(v, p) : 0;
                if (k < 0)
                        log_struct(
                                LOG_WARNING,
                                LOG_FIELDS({ "VM_ID", v->rec.id }),
                                "VM %s has no metadata service: %s",
                                v->rec.id,
                                strerror(-k));
        }
        if (r < 0)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s has no network: linking its NIC to network %s failed: %s",
                        v->rec.id,
                        v->rec.spec.network,
                        strerror(-r));
}

static void vm_net_detach(Vm *v, bool remove) {
        NetPort *p = vm_port(v, false);

        if (remove) {
                net_port_remove(p);
                v->imds_source = sd_event_source_disable_unref(v->imds_source);
        } else
                net_port_disconnect(p);
}

/* swtpm's control channel answers CMD_GET_CAPABILITY (00 00 00 01) with 8 bytes once it is up. */
static bool swtpm_answers(const char *ctrl) {
        _cleanup_close_ int fd = unix_stream_connect(ctrl, /* nonblock= */ false);
        static const uint8_t cmd[4] = { 0, 0, 0, 1 };
        struct pollfd pfd;
        uint8_t answer[8];

        if (fd < 0)
                return false;
        if (write(fd, cmd, sizeof(cmd)) != sizeof(cmd))
                return false;
        pfd = (struct pollfd){ .fd = fd, .events = POLLIN };
        if (poll(&pfd, 1, 200) <= 0)
                return false;
        return read(fd, answer, sizeof(answer)) == sizeof(answer);
}

/* ---- the start chain: swtpm, vhost-device-vsock, QEMU, QMP ---- */

enum {
        START_SWTPM, /* waiting for swtpm's control socket and vhost-device-vsock's socket */
        START_QMP,   /* waiting for QEMU's monitor */
};

static void start_fail(Vm *v, int r, const char *what) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        (void) api_error_set(&e, r < 0 ? r : -EIO, API_ERROR_INTERNAL, "%s", what);
        vm_stop_processes_now(v);
        v->qemu_pid = v->swtpm_pid = 0;
        vm_set_state(v, VM_STATE_FAILED);
        vm_set_error(v, e.message);
        (void) vm_save(v);
        manager_touch(v->manager);
        start_finished(v, e.error, &e);
}

/* role names the unit (vm-manager-<id>-<role>.service) under the systemd launcher. */
static int vm_spawn(Vm *v, char **argv, const char *log_name, const char *role, VmLaunched **ret) {
        _cleanup_free_ char *log = vm_path(v, log_name), *unit = NULL;
        bool qemu = streq(role, "qemu");

        if (!log || asprintf(&unit, "vm-manager-%s-%s.service", v->rec.id, role) < 0)
                return -ENOMEM;
        return vm_launched_spawn(
                ret,
                manager_event(v->manager),
                manager_units(v->manager),
                unit,
                &(VmProcessOptions){
                        .argv = argv,
                        .log_file = log,
                        .working_dir = v->dir,
                        .block_io_uring = qemu,
                },
                qemu ? on_qemu_exit : on_helper_exit,
                v);
}

static void on_qmp_event(QmpClient *c, const char *event, json_t *data, void *userdata) {
        Vm *v = userdata;

        if (event)
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", v->rec.id }, { "QMP_EVENT", event }),
                        "QMP event %s",
                        event);
}

static void on_qmp_disconnect(QmpClient *c, void *userdata) {
        /* QEMU's exit is what counts; the pidfd reports it. */
}

static void on_qmp_ready(QmpClient *c, int error, void *userdata) {
        if (c != ((Vm *) userdata)->qmp)
                return; /* a connection we dropped: whoever dropped it settles the state */
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        usec_t timeout;
        int r;

        if (!v->starting)
                return;
        if (error < 0) {
                _cleanup_free_ char *qlog = vm_path(v, "qemu.log"), *qmp = vm_path(v, "qmp.sock"),
                                    *tail = qlog ? file_tail(qlog, 8192) : NULL, *msg = NULL;
                char d[32];

                asprintf_or_null(
                        &msg,
                        "qemu QMP at %s did not answer within %s: %s (%s)",
                        qmp ?: "qmp.sock",
                        format_duration(d, sizeof(d), manager_settings(v->manager)->qmp_timeout),
                        strerror(-error),
                        tail && *tail ? tail : "qemu wrote nothing to its log");
                start_fail(v, error, msg ?: "qemu QMP did not answer");
                return;
        }

        vm_set_state(v, v->rec.phase == VM_PHASE_INSTALL ? VM_STATE_INSTALLING : VM_STATE_BOOTING);
        vm_net_attach(v);
        timeout = v->rec.phase == VM_PHASE_INSTALL ? manager_settings(v->manager)->install_timeout :
                                                     manager_settings(v->manager)->boot_timeout;
        r = sd_event_add_time_relative(
                manager_event(v->manager),
                &v->phase_timer,
                CLOCK_MONOTONIC,
                timeout,
                USEC_PER_SEC,
                on_phase_timeout,
                v);
        if (r < 0)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "No phase timer for %s: %s",
                        v->rec.id,
                        strerror(-r));
        (void) vm_save(v);
        manager_touch(v->manager);
        start_finished(v, 0, NULL);
        vm_check_pending(v);
}

static int start_qemu(Vm *v) {
        _cleanup_free_ char *vars = vm_path(v, "ovmf_vars.fd"), *net = vm_path(v, "net.sock"),
                            *vhost = vm_path(v, "vhost-vsock.sock"), *tpm = vm_path(v, "tpm/swtpm.sock"),
                            *qmp = vm_path(v, "qmp.sock"), *keys = NULL, *notify = NULL;
        _cleanup_strv_free_ char **argv = NULL;
        const Image *img = image_catalog_resolve(manager_images(v->manager), v->rec.spec.image);
        const Network *net_rec = network_registry_get(manager_networks(v->manager), v->rec.spec.network);
        VmCredential creds[5];
        size_t n = 0;
        int r;

        if (!vars || !net || !vhost || !tpm || !qmp)
                return -ENOMEM;
        if (v->rec.phase == VM_PHASE_INSTALL && (!img || !streq(img->ref, v->rec.spec.image)))
                return -ENOENT;

        /* the per-VM key first, then the caller's, one per line */
        {
                size_t len = strlen(v->rec.ssh_public_key) + 2, at = 0;
                for (char **k = v->rec.spec.ssh_authorized_keys; k && *k; k++)
                        len += strlen(*k) + 1;
                keys = malloc(len);
                if (!keys)
                        return -ENOMEM;
                at = stpcpy(stpcpy(keys, v->rec.ssh_public_key), "\n") - keys;
                for (char **k = v->rec.spec.ssh_authorized_keys; k && *k; k++)
                        at = stpcpy(stpcpy(keys + at, *k), "\n") - keys;
        }
        if (asprintf(&notify, "vsock-stream:2:%u", manager_settings(v->manager)->notify_port) < 0)
                return -ENOMEM;

        creds[n++] = (VmCredential){ "firstboot.hostname", v->rec.spec.hostname };
        creds[n++] = (VmCredential){ "ssh.authorized_keys.root", keys };
        creds[n++] = (VmCredential){ "system.machine_id", v->rec.machine_id };
        if (v->rec.phase == VM_PHASE_INSTALL)
                creds[n++] = (VmCredential){ "vm.install-target", "/dev/disk/by-id/virtio-target" };
        creds[n++] = (VmCredential){ "vmm.notify_socket", notify };

        r = vm_cmdline_build(
                &(VmCmdlineSpec){
                        .qemu = "qemu-system-x86_64",
                        .id = v->rec.id,
                        .dir = v->dir,
                        .phase = v->rec.phase,
                        .accel = host_probe_accel(manager_host(v->manager), NULL) == HOST_ACCEL_KVM ?
                                VM_ACCEL_KVM :
                                VM_ACCEL_TCG,
                        .vsock = v->rec.vsock,
                        .cpus = v->rec.spec.cpus,
                        .memory_mib = v->rec.spec.memory_mib,
                        .ovmf_code = manager_settings(v->manager)->ovmf_code,
                        .ovmf_vars = vars,
                        .uki = img ? img->uki : NULL,
                        .image_raw = img ? img->disk : NULL,
                        .volume = v->rec.volume,
                        .net_socket = net,
                        .mtu = net_rec ? net_rec->mtu : 0,
                        .mac = v->rec.mac,
                        .cid = v->rec.cid,
                        .vsock_socket = vhost,
                        .tpm_socket = tpm,
                        .credentials = creds,
                        .n_credentials = n,
                        .kernel_cmdline_extra = v->rec.phase == VM_PHASE_BOOT && !v->rec.booted ?
                                "ignition.firstboot" :
                                NULL,
                },
                &argv);
        if (r < 0)
                return r;
        (void) unlink(qmp);
        r = vm_spawn(v, argv, "qemu.log", "qemu", &v->qemu);
        if (r < 0)
                return r;
        v->qemu_pid = vm_launched_pid(v->qemu);
        v->start_step = START_QMP;
        r = qmp_client_connect_retry(
                &v->qmp,
                manager_event(v->manager),
                qmp,
                on_qmp_event,
                on_qmp_disconnect,
                v,
                manager_settings(v->manager)->qmp_timeout,
                on_qmp_ready);
        if (r < 0) {
                (void) vm_launched_kill(v->qemu, SIGKILL, true);
                return r;
        }
        return 0;
}

static int start_vsockd(Vm *v) {
        _cleanup_free_ char *vhost = vm_path(v, "vhost-vsock.sock"), *uds = vm_path(v, "vsock");
        _cleanup_strv_free_ char **argv = NULL;
        int r;

        if (!vhost || !uds)
                return -ENOMEM;
        (void) unlink(vhost);
        v->vsockd = vm_launched_free(v->vsockd); /* a leftover of the previous run */
        r = vm_vhost_user_vsock_cmdline_build("vhost-device-vsock", v->rec.cid, vhost, uds, &argv);
        if (r < 0)
                return r;
        r = vm_spawn(v, argv, "vsock.log", "vsock", &v->vsockd);
        if (r < 0)
                return r;
        return 0;
}

/* swtpm and vhost-device-vsock start side by side; QEMU follows once both answer. */
static int on_probe(sd_event_source *s, usec_t usec, void *userdata) {
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        _cleanup_free_ char *ctrl = vm_path(v, "tpm/swtpm.sock"), *vhost = vm_path(v, "vhost-vsock.sock");
        bool vsock_up;
        int r;

        if (!v->starting || v->start_step != START_SWTPM || !ctrl || !vhost)
                return 0;

        if (!v->swtpm_up && swtpm_answers(ctrl))
                v->swtpm_up = true;
        if (!v->swtpm_up && (!v->swtpm || usec >= v->probe_deadline)) {
                _cleanup_free_ char *log = vm_path(v, "tpm/swtpm.log"),
                                    *tail = log ? file_tail(log, 2048) : NULL, *msg = NULL;
                asprintf_or_null(
                        &msg,
                        "vtpm not responding: swtpm control socket did not answer within 5s: %s",
                        tail ?: "");
                start_fail(v, -ETIMEDOUT, msg ?: "vtpm not responding");
                return 0;
        }
        vsock_up = v->rec.vsock != VM_VSOCK_VHOST_USER || access(vhost, F_OK) >= 0;
        if (!vsock_up && (!v->vsockd || usec >= v->probe_deadline)) {
                _cleanup_free_ char *log = vm_path(v, "vsock.log"),
                                    *tail = log ? file_tail(log, 2048) : NULL, *msg = NULL;
                asprintf_or_null(&msg, "vhost-device-vsock did not come up within 5s: %s", tail ?: "");
                start_fail(v, -ETIMEDOUT, msg ?: "vhost-device-vsock did not come up");
                return 0;
        }

        if (v->swtpm_up && vsock_up) {
                if (v->rec.phase == VM_PHASE_BOOT && v->rec.vsock == VM_VSOCK_VHOST_USER &&
                    (r = notify_listen(v)) < 0) {
                        start_fail(v, r, "failed to listen for READY=1");
                        return 0;
                }
                r = start_qemu(v);
                if (r < 0) {
                        /* under systemd a QEMU that dies at once fails the start job: its log says why */
                        _cleanup_free_ char *qlog = vm_path(v, "qemu.log"),
                                            *tail = qlog ? file_tail(qlog, 2048) : NULL, *msg = NULL;
                        asprintf_or_null(
                                &msg,
                                "failed to start qemu: %s%s%s",
                                strerror(-r),
                                tail && *tail ? ": " : "",
                                tail ?: "");
                        start_fail(v, r, msg ?: "failed to start qemu");
                }
                return 0; /* QMP takes over */
        }

        (void) sd_event_source_set_time(s, usec + VM_PROBE_INTERVAL);
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

static int copy_file_excl(const char *from, const char *to, mode_t mode) {
        _cleanup_free_ char *data = NULL;
        _cleanup_close_ int fd = -EBADF;
        size_t size;
        int r;

        r = read_full_file(from, 64U * 1024U * 1024U, &data, &size);
        if (r < 0)
                return r;
        fd = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd < 0)
                return errno == EEXIST ? 0 : -errno;
        r = loop_write(fd, data, size);
        if (r >= 0)
                r = RET_NERRNO(fsync(fd));
        if (r < 0)
                (void) unlink(to);
        return r;
}

static int vm_start_phase(Vm *v, VmPhase phase, ApiError *reterr) {
        _cleanup_free_ char *tpm = vm_path(v, "tpm"), *ctrl = vm_path(v, "tpm/swtpm.sock"),
                            *tlog = vm_path(v, "tpm/swtpm.log"), *tprev = vm_path(v, "tpm/swtpm.prev.log"),
                            *vars = vm_path(v, "ovmf_vars.fd"), *console = vm_path(v, "console.log");
        _cleanup_strv_free_ char **argv = NULL;
        int r;

        if (!tpm || !ctrl || !tlog || !tprev || !vars || !console)
                return -ENOMEM;
        if (manager_shutting_down(v->manager))
                return api_error_set(reterr, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");

        v->rec.phase = phase;
        v->starting = true;
        v->install_timed_out = false;
        if (phase == VM_PHASE_BOOT) {
                /* every installed boot starts afresh: readiness, status, errors, attestation */
                v->rec.booted_at = now_usec(CLOCK_REALTIME);
                v->rec.ready_at = 0;
                v->rec.status = mfree(v->rec.status);
                vm_set_error(v, NULL);
                v->rec.att.required = v->rec.spec.require_attestation;
                v->rec.att.released = !v->rec.spec.require_attestation;
                v->rec.att.nonce_issued_at = 0;
                attest_result_done(&v->rec.att.initrd);
                attest_result_done(&v->rec.att.ready);
                v->rec.att.has_initrd = v->rec.att.has_ready = false;
                v->guest_exit_status = mfree(v->guest_exit_status);
                v->ready_reported = false;
                v->fail_reason = mfree(v->fail_reason);
        }

        r = mkdir_p(tpm, 0700);
        if (r >= 0)
                r = copy_file_excl(manager_settings(v->manager)->ovmf_vars, vars, 0600);
        if (r < 0) {
                v->starting = false;
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "preparing %s: %s", v->dir, strerror(-r));
        }
        (void) unlink(ctrl);
        (void) rename(tlog, tprev);

        v->swtpm = vm_launched_free(v->swtpm); /* a leftover of the previous run */
        r = vm_swtpm_cmdline_build("swtpm", tpm, ctrl, tlog, &argv);
        if (r >= 0)
                r = vm_spawn(v, argv, "tpm/swtpm.out", "swtpm", &v->swtpm);
        if (r < 0) {
                v->starting = false;
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "starting swtpm: %s", strerror(-r));
        }
        v->swtpm_pid = vm_launched_pid(v->swtpm);
        v->swtpm_up = false;
        v->rec.vsock = vm_pick_vsock(v);
        v->vsockd = vm_launched_free(v->vsockd); /* a leftover of the previous run */
        r = v->rec.vsock == VM_VSOCK_VHOST_USER ? start_vsockd(v) : 0;
        if (r < 0) {
                vm_stop_processes_now(v);
                v->starting = false;
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "starting vhost-device-vsock: %s", strerror(-r));
        }
        v->start_step = START_SWTPM;
        v->probe_deadline = now_usec(CLOCK_MONOTONIC) + VM_SWTPM_START_TIMEOUT;
        r = sd_event_add_time_relative(
                manager_event(v->manager), &v->probe_timer, CLOCK_MONOTONIC, VM_PROBE_INTERVAL, 1, on_probe, v);
        if (r < 0) {
                vm_stop_processes_now(v);
                v->starting = false;
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "starting %s: %s", v->rec.id, strerror(-r));
        }
        (void) vm_save(v);
        return 0;
}

/* ---- stopping ---- */

static int on_stop_timer(sd_event_source *s, usec_t usec, void *userdata) {
        Vm *v = userdata;

        v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
        if (!v->qemu)
                return 0;
        if (v->stop_step < 2) {
                v->stop_step = 2;
                (void) vm_launched_kill(v->qemu, SIGTERM, false);
                return sd_event_add_time_relative(
                        manager_event(v->manager),
                        &v->stop_timer,
                        CLOCK_MONOTONIC,
                        VM_STOP_GRACE,
                        USEC_PER_MSEC,
                        on_stop_timer,
                        v);
        }
        v->stop_step = 3;
        (void) vm_launched_kill(v->qemu, SIGKILL, true);
        return 0;
}

static void on_powerdown_reply(QmpClient *c, int error, json_t *result, const char *desc, void *userdata) {
        Vm *v = userdata;

        if (error < 0 && v->qemu && v->stop_step == 1) {
                /* no ACPI path: go straight to SIGTERM */
                v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
                (void) on_stop_timer(NULL, 0, v);
        }
}

/* ACPI power-down, then SIGTERM at the stop timeout, then SIGKILL 5 s later. */
static void vm_begin_stop(Vm *v) {
        int r;

        if (!v->qemu || v->stop_step > 0)
                return;
        v->stop_step = 1;
        r = sd_event_add_time_relative(
                manager_event(v->manager),
                &v->stop_timer,
                CLOCK_MONOTONIC,
                manager_settings(v->manager)->stop_timeout,
                USEC_PER_MSEC,
                on_stop_timer,
                v);
        if (r < 0)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "No stop timer for %s: %s",
                        v->rec.id,
                        strerror(-r));
        if (!v->qmp || qmp_client_execute(v->qmp, "system_powerdown", NULL, 0, on_powerdown_reply, v) < 0) {
                v->stop_timer = sd_event_source_disable_unref(v->stop_timer);
                (void) on_stop_timer(NULL, 0, v);
        }
}

/* ---- operations ---- */

bool vm_has_process(Vm *v) {
        return v->qemu || v->starting;
}

int vm_stop(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        Pending *p;

        if (v->rec.state == VM_STATE_DELETING)
                return api_error_set(reterr, -EBUSY, API_ERROR_CONFLICT, "vm %s is being deleted", v->rec.id);
        /* A start chain (swtpm, vsock, QEMU, QMP) takes a moment: stop once it stands. */
        if (v->starting)
                return api_error_set(
                        reterr,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "vm %s is %s and still starting; try again in a moment",
                        v->rec.id,
                        vm_state_to_string(v->rec.state));
        if (!vm_has_process(v))
                return api_error_set(
                        reterr,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "vm %s is not running (%s)",
                        v->rec.id,
                        vm_state_to_string(v->rec.state));
        p = pending_add(v, PENDING_STOPPED, done, userdata);
        if (!p)
                return -ENOMEM;
        vm_set_state(v, VM_STATE_STOPPING);
        vm_changed(v);
        vm_begin_stop(v);
        return 0;
}

int vm_start(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        Pending *p;
        int r;

        if (manager_shutting_down(v->manager))
                return api_error_set(reterr, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
        if (v->rec.state == VM_STATE_DELETING)
                return api_error_set(reterr, -EBUSY, API_ERROR_CONFLICT, "vm %s is being deleted", v->rec.id);
        if (vm_has_process(v))
                return api_error_set(
                        reterr,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "vm %s is %s",
                        v->rec.id,
                        vm_state_to_string(v->rec.state));
        if (v->rec.installed_at == 0)
                return api_error_set(
                        reterr,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "vm %s never finished installing; delete and recreate it",
                        v->rec.id);

        if (v->volume_fd < 0) {
                /* first start since the daemon did: take the disk's lease again */
                r = vm_acquire_volume(v, VOLUME_OPEN, reterr);
                if (r < 0)
                        return api_error_prefix(reterr, "disk of vm %s", v->rec.id);
        }
        p = pending_add(v, PENDING_STARTED, done, userdata);
        if (!p)
                return -ENOMEM;
        r = vm_start_phase(v, VM_PHASE_BOOT, reterr);
        if (r < 0) {
                pending_unlink(v, p);
                free(p);
                vm_set_state(v, VM_STATE_FAILED);
                vm_set_error(v, reterr && reterr->message ? reterr->message : "start failed");
                vm_changed(v);
                return r;
        }
        vm_changed(v);
        return 0;
}

int vm_reboot(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        int r;

        if (manager_shutting_down(v->manager))
                return api_error_set(reterr, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
        if (v->rec.installed_at == 0)
                return api_error_set(
                        reterr,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "vm %s never finished installing; delete and recreate it",
                        v->rec.id);
        r = vm_stop(v, done, userdata, reterr);
        if (r < 0)
                return r;
        /* the stop's waiter is the last one added: chain the start to it */
        for (Pending *p = v->pending; p; p = p->next)
                if (!p->next)
                        p->then = THEN_START;
        vm_check_pending(v);
        return 0;
}

static void vm_delete_volume(Manager *m, const char *id) {
        _cleanup_free_ char *name = NULL;

        if (asprintf(&name, "vm-%s", id) >= 0)
                (void) storage_delete(manager_storage(m), name, NULL);
}

static int release_resources(Vm *v) {
        Network *n = network_registry_get(manager_networks(v->manager), v->rec.spec.network);
        int r = 0;

        vm_net_detach(v, true);
        if (manager_nonces(v->manager))
                attest_nonce_forget(manager_nonces(v->manager), v->rec.id);
        if (n && network_lease_find(n, v->rec.id))
                r = network_lease_release(manager_networks(v->manager), n, v->rec.id);
        v->volume_fd = safe_close(v->volume_fd);
        /* by its name, not its recorded path: a create stopped by a crash acquired it without
         * recording it */
        vm_delete_volume(v->manager, v->rec.id);
        if (v->dir)
                (void) rm_rf(v->dir); /* only our files live there */
        return r;
}

static void delete_finish(int r, json_t *record, const ApiError *e, void *userdata);

typedef struct DeleteCall {
        Vm *vm;
        VmDoneFunc done;
        void *userdata;
} DeleteCall;

static void delete_finish(int r, json_t *record, const ApiError *e, void *userdata) {
        DeleteCall *c = userdata;
        _cleanup_(vm_unrefp) Vm *v = c->vm;
        Manager *m = v->manager;
        json_auto_t *gone = NULL;

        vm_unobserve(v, c->userdata);
        (void) release_resources(v);
        log_struct(
                LOG_INFO, LOG_FIELDS({ "VM_ID", v->rec.id }), "VM %s (%s) deleted.", v->rec.id, v->rec.spec.name);
        gone = json_pack("{s:s,s:b}", "id", v->rec.id, "deleted", true);
        manager_remove_vm(m, v);
        manager_touch(m);
        if (c->done)
                c->done(0, gone, NULL, c->userdata);
        free(c);
}

int vm_delete(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v); /* the deletion may complete before we return */
        DeleteCall *c;
        Pending *p;

        if (v->rec.state == VM_STATE_DELETING)
                return api_error_set(
                        reterr, -EBUSY, API_ERROR_CONFLICT, "vm %s is already being deleted", v->rec.id);
        c = calloc(1, sizeof(DeleteCall));
        if (!c)
                return -ENOMEM;
        c->vm = vm_ref(v);
        c->done = done;
        c->userdata = userdata;

        if (v->starting)
                start_fail(v, -ECANCELED, "deleted while starting");
        vm_set_state(v, VM_STATE_DELETING);
        p = pending_add(v, PENDING_STOPPED, delete_finish, c);
        if (!p) {
                vm_unref(c->vm);
                free(c);
                return -ENOMEM;
        }
        vm_changed(v);
        vm_begin_stop(v);
        vm_check_pending(v);
        return 0;
}

/* ---- create ---- */

/* The VM's disk volume "vm-<id>": created at create_vm, reopened by the first start after a daemon
 * restart. The fd is the lease; QEMU gets the path (or, for a provider volume without a name in
 * the file system, our /proc fd link). */
static int vm_acquire_volume(Vm *v, VolumeCreate mode, ApiError *reterr) {
        _cleanup_(volume_done) Volume vol = VOLUME_NULL;
        _cleanup_free_ char *name = NULL, *path = NULL;
        int r;

        if (asprintf(&name, "vm-%s", v->rec.id) < 0)
                return -ENOMEM;
        r = storage_acquire(manager_storage(v->manager), name, v->rec.spec.disk_gib << 30, mode, &vol, reterr);
        if (r < 0)
                return r;
        if (vol.path)
                path = strdup(vol.path);
        else if (asprintf(&path, "/proc/%d/fd/%d", (int) getpid(), vol.fd) < 0)
                path = NULL;
        if (!path)
                return -ENOMEM;
        safe_close(v->volume_fd);
        v->volume_fd = TAKE_FD(vol.fd);
        free(v->rec.volume);
        v->rec.volume = TAKE_PTR(path);
        return 0;
}

static int random_hex(char *buf, size_t bytes) {
        uint8_t rnd[32];

        assert(bytes <= sizeof(rnd));
        if (getrandom(rnd, bytes, 0) != (ssize_t) bytes)
                return -EIO;
        for (size_t i = 0; i < bytes; i++)
                snprintf(buf + 2 * i, 3, "%02x", rnd[i]);
        return 0;
}

/* An ed25519 key: the private half as PEM (0600) at path, the public half as an OpenSSH line. */
/* An ed25519 pair: the private key in OpenSSH's format (0600), which ssh and libssh both read, and
 * the public line "ssh-ed25519 <base64> <comment>". */
static int make_ssh_key(const char *path, const char *comment, char **ret_public) {
        ssh_key key = NULL;
        char *priv = NULL, *pub = NULL, *line = NULL;
        int r = -EIO;

        if (ssh_pki_generate(SSH_KEYTYPE_ED25519, 0, &key) != SSH_OK)
                return -EIO;
        if (ssh_pki_export_privkey_base64(key, NULL, NULL, NULL, &priv) != SSH_OK ||
            ssh_pki_export_pubkey_base64(key, &pub) != SSH_OK)
                goto finish;
        r = write_file_atomic(path, priv, strlen(priv), 0600);
        if (r < 0)
                goto finish;
        if (asprintf(&line, "ssh-ed25519 %s %s", pub, comment) < 0) {
                r = -ENOMEM;
                goto finish;
        }
        *ret_public = line;
        r = 0;
finish:
        if (priv)
                explicit_bzero(priv, strlen(priv));
        ssh_string_free_char(priv);
        ssh_string_free_char(pub);
        ssh_key_free(key);
        return r;
}

static uint32_t allocate_cid(Manager *m) {
        uint32_t base = 3 + (fnv1a_32(manager_state_dir(m)) % (1U << 20));

        for (uint32_t cid = base;; cid = cid + 1 >= 0xFFFFFFFEU ? 3 : cid + 1) {
                bool used = false;
                for (size_t i = 0; i < manager_n_vms(m) && !used; i++)
                        used = manager_vm_at(m, i)->rec.cid == cid;
                if (!used)
                        return cid;
        }
}

typedef struct CreateCall {
        Vm *vm;
        VmWaitFor wait_for;
        VmDoneFunc done;
        void *userdata;
} CreateCall;

/* A create that fails before the installer runs leaves nothing behind. */
static void create_discard(Vm *v) {
        vm_stop_processes_now(v);
        (void) release_resources(v);
        manager_remove_vm(v->manager, v);
        manager_touch(v->manager);
}

/* The installer is up (or could not start): answer now, or wait for the milestone. */
static void create_started(int r, json_t *record, const ApiError *e, void *userdata) {
        _cleanup_free_ CreateCall *c = userdata;
        _cleanup_(vm_unrefp) Vm *v = c->vm;
        _cleanup_(api_error_done) ApiError e2 = API_ERROR_NULL;
        Pending *w;

        if (r < 0 || c->wait_for == VM_WAIT_NONE)
                vm_unobserve(v, c->userdata);
        if (r < 0) {
                create_discard(v);
                if (c->done)
                        c->done(r, NULL, e, c->userdata);
                return;
        }
        if (c->wait_for == VM_WAIT_NONE) {
                if (c->done)
                        c->done(0, record, NULL, c->userdata);
                return;
        }
        /* From here on the VM exists whatever happens: a failed wait names it, it is not removed. */
        w = pending_add(v, PENDING_MILESTONE, c->done, c->userdata);
        if (!w ||
            pending_set_deadline(
                    v,
                    w,
                    manager_settings(v->manager)->install_timeout + manager_settings(v->manager)->stop_timeout +
                            (c->wait_for == VM_WAIT_INSTALLED ? 0 :
                                                                manager_settings(v->manager)->boot_timeout)) <
                    0) {
                if (w) {
                        pending_unlink(v, w);
                        free(w);
                }
                (void) api_error_set(&e2, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                if (c->done)
                        c->done(e2.error, NULL, &e2, c->userdata);
                return;
        }
        w->milestone = c->wait_for;
        vm_check_pending(v);
}

/* A VM that must attest is verified against its image's policy, which needs every golden value
 * unless learn mode records them: without them the boot would be rejected minutes from now, so the
 * create is refused before anything is allocated, with the way to record them. */
static int vm_check_attestable(Manager *m, const Image *img, const VmSpec *spec, ApiError *reterr) {
        _cleanup_(attest_policy_freep) AttestPolicy *p = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        char list[3 * 32] = "";
        uint32_t missing;

        if (!spec->require_attestation || manager_settings(m)->attestation != ATTEST_MODE_VERIFY ||
            manager_settings(m)->learn_golden)
                return 0;
        if (!img->policy)
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "vm requires attestation, but image %s has no policy.json to verify its quotes against; "
                        "use an image built by images/ (make image), or create the vm with require_attestation "
                        "false",
                        img->ref);
        if (attest_policy_from_json(img->policy, &p, &e) < 0)
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "vm requires attestation, but the policy.json of image %s does not load: %s",
                        img->ref,
                        e.message ?: "invalid policy");
        missing = attest_policy_missing_golden(p);
        if (missing == 0)
                return 0;
        for (unsigned i = 0, n = 0; i < 32; i++)
                if (missing & (1U << i))
                        n += (unsigned) snprintf(list + n, sizeof(list) - n, "%s%u", n ? "," : "", i);
        return api_error_set(
                reterr,
                -EOPNOTSUPP,
                API_ERROR_UNSUPPORTED,
                "vm requires attestation, but image %s has no golden value for pcr %s, so its quotes cannot "
                "verify (attestation verify, learn mode off). Record them once: run `make golden`, or serve "
                "with --attestation-learn-golden, create one vm with require_attestation and wait_for ready, "
                "then run `vm-manager image golden %s --from-vm <id>`. Or create this vm with "
                "require_attestation false",
                img->ref,
                list,
                img->ref);
}

int vm_create(
        Manager *m, json_t *request, VmDoneFunc done, VmProgressFunc progress, void *userdata, ApiError *reterr) {
        _cleanup_(vm_spec_done) VmSpec spec = {};
        _cleanup_free_ char *user_data = NULL, *key_path = NULL, *ud_path = NULL;
        _cleanup_(vm_unrefp) Vm *v = NULL;
        const Image *img;
        Network *net;
        const NetworkLease *lease;
        char **kv;
        VmWaitFor wait_for;
        Vm *other;
        Pending *p;
        CreateCall *call;
        int r;

        r = vm_spec_from_request(request, &spec, &user_data, &wait_for, reterr);
        if (r < 0)
                return r;

        /* image and Kubernetes version: 400, not 404, since they are arguments */
        img = image_catalog_resolve(manager_images(m), spec.image);
        if (!img) {
                if (!spec.image || !*spec.image)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "image \"\": not found: no images in %s",
                                manager_image_dir(m));
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "image \"%s\": not found: image \"%s\"",
                        spec.image,
                        spec.image);
        }
        free(spec.image);
        spec.image = strdup(img->ref);
        if (!spec.image)
                return -ENOMEM;
        kv = image_catalog_kubernetes_versions(manager_images(m));
        if (spec.kubernetes_version && *spec.kubernetes_version) {
                bool found = false;
                for (char **k = kv; k && *k && !found; k++)
                        found = streq(*k, spec.kubernetes_version);
                if (!found) {
                        _cleanup_free_ char *avail = strv_join(kv, ", ");
                        if (!avail)
                                return -ENOMEM;
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "kubernetes version \"%s\" is not available for image %s (available: %s)",
                                spec.kubernetes_version,
                                img->ref,
                                *avail ? avail : "none");
                }
        } else {
                free(spec.kubernetes_version);
                spec.kubernetes_version = kv && kv[0] ? strdup(kv[0]) : NULL;
        }
        net = network_registry_get(manager_networks(m), spec.network);
        if (!net)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "network \"%s\": not found: network \"%s\"",
                        spec.network,
                        spec.network);

        r = vm_check_attestable(m, img, &spec, reterr);
        if (r < 0)
                return r;

        if (manager_shutting_down(m))
                return api_error_set(reterr, -ESHUTDOWN, API_ERROR_CONFLICT, "vm-manager is shutting down");
        other = manager_find_vm_by_name(m, spec.name);
        if (other)
                return api_error_set(
                        reterr,
                        -EEXIST,
                        API_ERROR_CONFLICT,
                        "vm name \"%s\" is in use by %s",
                        spec.name,
                        vm_id(other));

        v = calloc(1, sizeof(Vm));
        if (!v)
                return -ENOMEM;
        v->n_ref = 1;
        v->manager = m;
        v->notify_fd = -EBADF;
        v->volume_fd = -EBADF;
        v->rec.phase = _VM_PHASE_INVALID;
        v->rec.id = calloc(1, 9);
        if (!v->rec.id)
                return -ENOMEM;
        do {
                r = random_hex(v->rec.id, 4);
                if (r < 0)
                        return r;
        } while (manager_find_vm(m, v->rec.id));
        r = random_hex(v->rec.machine_id, 16);
        if (r < 0)
                return r;
        v->rec.spec = spec;
        spec = (VmSpec){};
        if (!v->rec.spec.region) {
                char host[256] = "";
                if (gethostname(host, sizeof(host)) >= 0 && *host)
                        v->rec.spec.region = strdup(host);
        }
        v->rec.spec.zone = strdup(v->rec.spec.network);
        v->rec.cid = allocate_cid(m);
        v->rec.state = VM_STATE_CREATING;
        v->rec.created_at = now_usec(CLOCK_REALTIME);
        if (manager_caller(m) && !(v->rec.created_by = caller_created_by_json(manager_caller(m))))
                return -ENOMEM;
        v->rec.att.required = v->rec.spec.require_attestation;
        if (asprintf(&v->dir, "%s/vms/%s", manager_state_dir(m), v->rec.id) < 0)
                return -ENOMEM;

        r = mkdir_p(v->dir, 0700);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "creating %s: %s", v->dir, strerror(-r));
        r = manager_add_vm(m, v);
        if (r < 0) {
                (void) rm_rf(v->dir);
                return api_error_set(reterr, r, API_ERROR_CONFLICT, "too many VMs");
        }
        (void) vm_save(v);

        /* provision: key, user-data, volume, lease; any failure discards it all */
        key_path = vm_path(v, "ssh_key");
        ud_path = vm_path(v, "user-data");
        if (!key_path || !ud_path) {
                create_discard(v);
                return -ENOMEM;
        }
        r = make_ssh_key(key_path, "vm-manager", &v->rec.ssh_public_key);
        if (r >= 0) {
                char *withid = NULL;
                if (asprintf(&withid, "%s@%s", v->rec.ssh_public_key, v->rec.id) < 0)
                        r = -ENOMEM;
                else {
                        free(v->rec.ssh_public_key);
                        v->rec.ssh_public_key = withid;
                }
        }
        if (r >= 0 && user_data)
                r = write_file_atomic(ud_path, user_data, strlen(user_data), 0600);
        if (r < 0) {
                create_discard(v);
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "provisioning vm %s: %s", v->rec.id, strerror(-r));
        }
        /* the disk: from the systemd storage provider where one answers, else a sparse file */
        r = vm_acquire_volume(v, VOLUME_NEW, reterr);
        if (r < 0) {
                api_error_prefix(reterr, "disk of vm %s", v->rec.id);
                create_discard(v);
                return r;
        }
        r = network_lease_acquire(manager_networks(m), net, v->rec.id, &lease, reterr);
        if (r < 0) {
                api_error_prefix(reterr, "attach network");
                create_discard(v);
                return r;
        }
        {
                char ip[INET_ADDRSTRLEN], mac[ETHER_ADDR_STRLEN];
                inet_ntop(AF_INET, &lease->ip, ip, sizeof(ip));
                v->rec.ip = strdup(ip);
                v->rec.mac = strdup(ether_addr_format(lease->mac, mac));
                if (!v->rec.ip || !v->rec.mac) {
                        create_discard(v);
                        return -ENOMEM;
                }
        }

        call = calloc(1, sizeof(CreateCall));
        if (!call) {
                create_discard(v);
                return -ENOMEM;
        }
        if (vm_observe(v, progress, userdata) < 0) {
                free(call);
                create_discard(v);
                return -ENOMEM;
        }
        call->vm = vm_ref(v);
        call->wait_for = wait_for;
        call->done = done;
        call->userdata = userdata;
        p = pending_add(v, PENDING_STARTED, create_started, call);
        if (!p) {
                vm_unref(call->vm);
                free(call);
                create_discard(v);
                return -ENOMEM;
        }
        r = vm_start_phase(v, VM_PHASE_INSTALL, reterr);
        if (r < 0) {
                vm_unobserve(v, userdata);
                pending_unlink(v, p);
                vm_unref(call->vm);
                free(p);
                free(call);
                create_discard(v);
                return r;
        }
        manager_touch(m);
        log_struct(
                LOG_INFO,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "Creating VM %s (%s) from %s.",
                v->rec.id,
                v->rec.spec.name,
                v->rec.spec.image);
        return 0;
}

/* ---- start-up and shutdown ---- */

static int vm_from_json(Manager *m, const char *id, json_t *j, Vm **ret) {
        _cleanup_(vm_unrefp) Vm *v = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        v = calloc(1, sizeof(Vm));
        if (!v)
                return -ENOMEM;
        v->n_ref = 1;
        v->manager = m;
        v->notify_fd = -EBADF;
        v->volume_fd = -EBADF;
        v->rec.phase = _VM_PHASE_INVALID;
        r = vm_record_from_json(j, id, &v->rec, &e);
        if (r < 0) {
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", id }),
                        "VM record %s: %s",
                        id,
                        e.message ?: strerror(-r));
                return r;
        }
        v->qemu_pid = v->rec.processes[VM_ROLE_QEMU].pid;
        v->swtpm_pid = v->rec.processes[VM_ROLE_SWTPM].pid;
        if (asprintf(&v->dir, "%s/vms/%s", manager_state_dir(m), id) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(v);
        return 0;
}

static int vm_cmp_created(const void *a, const void *b) {
        Vm *x = *(Vm *const *) a, *y = *(Vm *const *) b;

        if (x->rec.created_at != y->rec.created_at)
                return x->rec.created_at < y->rec.created_at ? -1 : 1;
        return strcmp(x->rec.id, y->rec.id);
}

static void reattach_failed(Vm *v, const char *why) {
        _cleanup_free_ char *t = NULL;

        asprintf_or_null(
                &t,
                "vm-manager restarted while the VM was %s and could not reattach to its QEMU (%s); start the VM again",
                vm_state_to_string(v->rec.state),
                why);
        vm_stop_processes_now(v);
        v->qemu_pid = v->swtpm_pid = 0;
        vm_set_state(v, VM_STATE_STOPPED);
        vm_set_error(v, t);
        vm_changed(v);
}

static void on_qmp_reattached(QmpClient *c, int error, void *userdata) {
        if (c != ((Vm *) userdata)->qmp)
                return; /* a connection we dropped: whoever dropped it settles the state */
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        usec_t timeout = 0;
        int r;

        if (!v->qemu)
                return; /* it ended meanwhile; the exit settled the state */
        if (error < 0) {
                _cleanup_free_ char *why = NULL;
                asprintf_or_null(&why, "its QMP socket did not answer: %s", strerror(-error));
                reattach_failed(v, why ?: "its QMP socket did not answer");
                return;
        }
        log_struct(
                LOG_INFO,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "Reattached to VM %s (%s), %s.",
                v->rec.id,
                v->rec.spec.name,
                vm_state_to_string(v->rec.state));
        vm_net_attach(v);
        /* the phase's clock starts again from the reattach */
        if (v->rec.state == VM_STATE_INSTALLING)
                timeout = manager_settings(v->manager)->install_timeout;
        else if (v->rec.state == VM_STATE_BOOTING || v->rec.state == VM_STATE_ATTESTING)
                timeout = manager_settings(v->manager)->boot_timeout;
        if (timeout > 0) {
                r = sd_event_add_time_relative(
                        manager_event(v->manager),
                        &v->phase_timer,
                        CLOCK_MONOTONIC,
                        timeout,
                        USEC_PER_SEC,
                        on_phase_timeout,
                        v);
                if (r < 0)
                        log_warning_errno(r, "No phase timer for %s, ignoring: %m", v->rec.id);
        }
        if (v->rec.state == VM_STATE_STOPPING)
                vm_begin_stop(v); /* an interrupted stop goes on */
        vm_changed(v);
}

/* Attaches to the units an earlier daemon left running: QEMU (required), swtpm and
 * vhost-device-vsock (tolerated when gone), QMP, and the READY=1 listener. */
static int vm_reattach(Vm *v) {
        Manager *m = v->manager;
        _cleanup_free_ char *qmp = vm_path(v, "qmp.sock");
        int r;

        if (!manager_units(m))
                return -EOPNOTSUPP;
        if (!v->rec.processes[VM_ROLE_QEMU].unit)
                return -ENOENT;
        if (!qmp)
                return -ENOMEM;
        r = vm_launched_attach(
                &v->qemu,
                manager_units(m),
                v->rec.processes[VM_ROLE_QEMU].unit,
                v->rec.processes[VM_ROLE_QEMU].pid,
                on_qemu_exit,
                v);
        if (r < 0)
                return r;
        /* the disk's lease, as the daemon that started it held it */
        if (vm_acquire_volume(v, VOLUME_OPEN, NULL) < 0)
                log_warning("VM %s: cannot take the lease on its disk again, ignoring.", v->rec.id);
        v->qemu_pid = vm_launched_pid(v->qemu);
        if (v->rec.processes[VM_ROLE_SWTPM].unit &&
            vm_launched_attach(
                    &v->swtpm,
                    manager_units(m),
                    v->rec.processes[VM_ROLE_SWTPM].unit,
                    v->rec.processes[VM_ROLE_SWTPM].pid,
                    on_helper_exit,
                    v) < 0)
                log_warning("VM %s: its swtpm unit is gone.", v->rec.id);
        if (v->rec.processes[VM_ROLE_VSOCK].unit &&
            vm_launched_attach(
                    &v->vsockd,
                    manager_units(m),
                    v->rec.processes[VM_ROLE_VSOCK].unit,
                    v->rec.processes[VM_ROLE_VSOCK].pid,
                    on_helper_exit,
                    v) < 0)
                log_warning("VM %s: its vhost-device-vsock unit is gone.", v->rec.id);
        v->swtpm_pid = vm_launched_pid(v->swtpm);
        if (v->rec.phase >= 0 && v->rec.phase == VM_PHASE_BOOT) {
                r = v->rec.vsock == VM_VSOCK_VHOST_USER ? notify_listen(v) :
                        v->rec.vsock == VM_VSOCK_VHOST  ? vsock_listen(manager_notify(m)) :
                                                          0;
                if (r < 0)
                        log_warning_errno(r, "VM %s: cannot listen for READY=1 again, ignoring: %m", v->rec.id);
        }
        return qmp_client_connect_retry(
                &v->qmp,
                manager_event(m),
                qmp,
                on_qmp_event,
                on_qmp_disconnect,
                v,
                manager_settings(v->manager)->qmp_timeout,
                on_qmp_reattached);
}

/* ---- records that do not load, and what crashes leave behind ---- */

#define VM_QUARANTINE_REASON_FILE "quarantine-reason"

/* The records set aside by earlier starts: <state>/quarantine/<id>, with the reason beside them. */
static int vm_quarantine_load(Manager *m) {
        _cleanup_free_ char *qdir = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;

        if (asprintf(&qdir, "%s/quarantine", manager_state_dir(m)) < 0)
                return -ENOMEM;
        d = opendir(qdir);
        if (!d)
                return errno == ENOENT ? 0 : -errno;
        while ((de = readdir(d))) {
                _cleanup_free_ char *path = NULL, *rpath = NULL, *reason = NULL;
                int r;

                if (de->d_name[0] == '.' || manager_find_quarantined(m, de->d_name))
                        continue;
                if (asprintf(&path, "%s/%s", qdir, de->d_name) < 0 ||
                    asprintf(&rpath, "%s/" VM_QUARANTINE_REASON_FILE, path) < 0)
                        return -ENOMEM;
                if (read_full_file(rpath, 4096, &reason, NULL) < 0)
                        reason = strdup("unknown");
                if (!reason)
                        return -ENOMEM;
                reason[strcspn(reason, "\n")] = 0;
                r = manager_quarantine_add(m, de->d_name, path, reason);
                if (r < 0)
                        return r;
                log_warning(
                        "VM record %s stays in quarantine (%s); delete_vm %s removes it with its disk and lease.",
                        path,
                        reason,
                        de->d_name);
        }
        return 0;
}

/* A record that does not load is never skipped silently: its directory moves to
 * <state>/quarantine/<id> (its disk and lease stay, for delete_vm to remove), the log and get_host
 * say so, and it does not stand in the way of a VM of the same name. */
static int vm_quarantine(Manager *m, const char *vms_dir, const char *id, const char *reason) {
        _cleanup_free_ char *from = NULL, *qdir = NULL, *to = NULL, *rpath = NULL;
        int r;

        if (asprintf(&from, "%s/%s", vms_dir, id) < 0 ||
            asprintf(&qdir, "%s/quarantine", manager_state_dir(m)) < 0 ||
            asprintf(&to, "%s/%s", qdir, id) < 0 || asprintf(&rpath, "%s/" VM_QUARANTINE_REASON_FILE, to) < 0)
                return -ENOMEM;
        r = mkdir_p(qdir, 0700);
        if (r < 0)
                return r;
        if (access(to, F_OK) >= 0)
                (void) rm_rf(to); /* an older quarantine of the same id: the newer one wins */
        if (rename(from, to) < 0)
                return -errno;
        (void) write_file_atomic(rpath, reason, strlen(reason), 0600);
        log_struct(
                LOG_ERR,
                LOG_FIELDS({ "VM_ID", id }),
                "VM record %s/vm.json does not load (%s): moved to %s; its disk and lease stay until delete_vm %s.",
                from,
                reason,
                to,
                id);
        r = manager_quarantine_add(m, id, to, reason);
        if (r < 0)
                return r;
        return 0;
}

/* Releases the leases the VM id holds on every network. */
static void vm_release_leases_of(Manager *m, const char *id) {
        for (size_t i = 0; i < network_registry_size(manager_networks(m)); i++) {
                Network *n = network_registry_at(manager_networks(m), i);
                if (network_lease_find(n, id))
                        (void) network_lease_release(manager_networks(m), n, id);
        }
}

static void vm_remove_leftovers(Manager *m, const char *vms_dir, const char *id) {
        _cleanup_free_ char *path = NULL;

        if (asprintf(&path, "%s/%s", vms_dir, id) < 0)
                return;
        vm_release_leases_of(m, id);
        vm_delete_volume(m, id);
        (void) rm_rf(path);
        log_struct(
                LOG_NOTICE,
                LOG_FIELDS({ "VM_ID", id }),
                "Removed %s, a VM directory without a record (a create or delete that vm-manager was killed in), with its disk and lease.",
                path);
}

static bool vm_id_known(Manager *m, const char *id) {
        return manager_find_vm(m, id) || manager_find_quarantined(m, id);
}

/* Leases whose VM is gone (released by no one because a crash came first). */
static void vm_release_stray_leases(Manager *m) {
        for (size_t i = 0; i < network_registry_size(manager_networks(m)); i++) {
                Network *n = network_registry_at(manager_networks(m), i);
                for (size_t k = 0; k < n->n_leases;) {
                        _cleanup_free_ char *id = strdup(n->leases[k].vm_id);
                        if (!id || vm_id_known(m, id)) {
                                k++;
                                continue;
                        }
                        log_notice("Releasing the lease of VM %s on network %s: no such VM.", id, n->name);
                        if (network_lease_release(manager_networks(m), n, id) < 0)
                                k++;
                }
        }
}

/* Sparse-file disks (under the state dir, so ours alone) whose VM is gone. A provider's volume
 * directory may be shared with others, and is left alone. */
static void vm_remove_stray_volumes(Manager *m) {
        _cleanup_free_ char *own = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        const char *vdir = storage_volume_dir(manager_storage(m));
        struct dirent *de;

        if (!vdir || asprintf(&own, "%s/volumes", manager_state_dir(m)) < 0 || !streq(vdir, own))
                return;
        d = opendir(vdir);
        if (!d)
                return;
        while ((de = readdir(d))) {
                char id[9];
                const char *rest = startswith(de->d_name, "vm-");

                if (!rest || strlen(rest) != 8 + strlen(".volume") || !streq(rest + 8, ".volume"))
                        continue;
                memcpy(id, rest, 8);
                id[8] = 0;
                if (vm_id_known(m, id))
                        continue;
                log_notice("Removing the disk %s/%s: no VM %s.", vdir, de->d_name, id);
                vm_delete_volume(m, id);
        }
}

int vm_delete_quarantined(Manager *m, const char *id, json_t **ret, ApiError *reterr) {
        const ManagerQuarantine *q = manager_find_quarantined(m, id);

        if (!q)
                return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", id);
        vm_release_leases_of(m, id);
        vm_delete_volume(m, id);
        (void) rm_rf(q->path);
        log_struct(LOG_INFO, LOG_FIELDS({ "VM_ID", id }), "Quarantined VM record %s deleted.", q->path);
        manager_quarantine_remove(m, id);
        manager_touch(m);
        *ret = json_pack("{s:s,s:b}", "id", id, "deleted", true);
        return *ret ? 0 : -ENOMEM;
}

int vm_load_all(Manager *m, ApiError *reterr) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;
        int r;

        r = vm_quarantine_load(m);
        if (r < 0)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "reading %s/quarantine: %s",
                        manager_state_dir(m),
                        strerror(-r));
        if (asprintf(&dir, "%s/vms", manager_state_dir(m)) < 0)
                return -ENOMEM;
        d = opendir(dir);
        if (!d)
                return errno == ENOENT ? 0 : api_error_set(reterr, -errno, API_ERROR_INTERNAL, "%s: %m", dir);
        while ((de = readdir(d))) {
                _cleanup_free_ char *path = NULL, *text = NULL;
                _cleanup_(vm_unrefp) Vm *v = NULL;
                json_auto_t *j = NULL;

                if (de->d_name[0] == '.')
                        continue;
                if (asprintf(&path, "%s/%s/vm.json", dir, de->d_name) < 0)
                        return -ENOMEM;
                (void) write_file_atomic_cleanup(path);
                r = read_full_file(path, VM_RECORD_MAX, &text, NULL);
                if (r == -ENOENT) {
                        /* a create killed before its first record, or a delete killed after removing
                         * it: nothing of the VM is left to show, so what remains goes */
                        vm_remove_leftovers(m, dir, de->d_name);
                        continue;
                }
                if (r >= 0) {
                        json_error_t err;
                        j = json_loads(text, 0, &err);
                        r = j ? vm_from_json(m, de->d_name, j, &v) : -EBADMSG;
                }
                if (r == -ENOMEM)
                        return r;
                if (r < 0) {
                        r = vm_quarantine(m, dir, de->d_name, strerror(-r));
                        if (r < 0)
                                return api_error_set(
                                        reterr, r, API_ERROR_INTERNAL, "quarantining %s: %s", path, strerror(-r));
                        continue;
                }

                if (v->rec.state == VM_STATE_DELETING) {
                        /* a delete_vm the previous daemon did not finish: finish it */
                        log_struct(
                                LOG_NOTICE,
                                LOG_FIELDS({ "VM_ID", v->rec.id }),
                                "Finishing the deletion of VM %s (%s) that vm-manager was killed in.",
                                v->rec.id,
                                v->rec.spec.name);
                        (void) release_resources(v);
                        continue;
                }
                if (v->rec.state == VM_STATE_CREATING) {
                        _cleanup_free_ char *t = NULL;
                        asprintf_or_null(
                                &t,
                                "vm-manager restarted while the VM was %s; delete it",
                                vm_state_to_string(v->rec.state));
                        vm_set_state(v, VM_STATE_FAILED);
                        vm_set_error(v, t);
                }
                if (!vm_state_is_live(v->rec.state))
                        v->qemu_pid = v->swtpm_pid = 0;
                vm_report_load(v);
                r = manager_add_vm(m, v);
                if (r < 0)
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, "too many VM records");
                if (vm_state_is_live(v->rec.state)) {
                        r = vm_reattach(v);
                        if (r < 0) {
                                _cleanup_free_ char *why = NULL;
                                if (r == -EOPNOTSUPP || r == -ENOENT)
                                        why = strdup(
                                                v->rec.processes[VM_ROLE_QEMU].unit ?
                                                        "no service manager to find its units in" :
                                                        "it ran as a plain child process, which ends with the daemon");
                                else
                                        asprintf_or_null(&why, "%s", strerror(-r));
                                /* a leftover process from a daemon killed with SIGKILL must not keep the disk */
                                if (!v->rec.processes[VM_ROLE_QEMU].unit && v->qemu_pid > 0 &&
                                    kill(v->qemu_pid, 0) >= 0)
                                        log_warning(
                                                "VM %s: pid %d from the previous run still exists and is not ours to stop.",
                                                v->rec.id,
                                                (int) v->qemu_pid);
                                reattach_failed(v, why ?: "out of memory");
                        }
                } else
                        (void) vm_save(v);
                vm_forwards_restore(v);
        }
        manager_sort_vms(m, vm_cmp_created);
        vm_release_stray_leases(m);
        vm_remove_stray_volumes(m);
        return 0;
}

void vm_detach_all(Manager *m) {
        Vm *v;

        MANAGER_FOREACH_VM(v, m, i) {
                if (v->qemu)
                        log_struct(
                                LOG_INFO,
                                LOG_FIELDS({ "VM_ID", v->rec.id }),
                                "VM %s (%s) left running in %s.",
                                v->rec.id,
                                v->rec.spec.name,
                                vm_launched_unit(v->qemu) ?: "?");
                (void) vm_save(v); /* its units and pids, for the next daemon */
        }
}

typedef struct StopAll {
        unsigned left;
        void (*done)(void *userdata);
        void *userdata;
} StopAll;

static void stop_all_one(int r, json_t *record, const ApiError *e, void *userdata) {
        StopAll *s = userdata;

        if (--s->left == 0) {
                if (s->done)
                        s->done(s->userdata);
                free(s);
        }
}

void vm_stop_all(Manager *m, void (*done)(void *userdata), void *userdata) {
        StopAll *s = calloc(1, sizeof(StopAll));

        if (!s) {
                for (size_t i = 0; i < manager_n_vms(m); i++)
                        vm_stop_processes_now(manager_vm_at(m, i));
                if (done)
                        done(userdata);
                return;
        }
        s->done = done;
        s->userdata = userdata;
        s->left = 1; /* held until every stop was issued */
        /* a snapshot: stopping may remove records (a create in flight is discarded) */
        _cleanup_free_ Vm **snapshot = calloc(manager_n_vms(m) + 1, sizeof(Vm *));
        size_t n = manager_n_vms(m);
        if (snapshot)
                for (size_t i = 0; i < n; i++)
                        snapshot[i] = vm_ref(manager_vm_at(m, i));
        for (size_t i = 0; snapshot && i < n; i++) {
                _cleanup_(vm_unrefp) Vm *v = snapshot[i];
                if (!vm_has_process(v) || v->rec.state == VM_STATE_DELETING)
                        continue;
                if (v->starting) {
                        /* nothing to power down yet: end the chain (a create is discarded) */
                        start_fail(v, -ESHUTDOWN, "vm-manager is shutting down");
                        continue;
                }
                s->left++;
                if (v->rec.state == VM_STATE_STOPPING) {
                        if (!pending_add(v, PENDING_STOPPED, stop_all_one, s))
                                s->left--;
                } else if (vm_stop(v, stop_all_one, s, NULL) < 0)
                        s->left--;
        }
        stop_all_one(0, NULL, NULL, s);
}
