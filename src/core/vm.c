/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A VM: the object, its accessors, and vm_set_state(), the one place where a transition decided by
 * src/vm/vm-state.c is applied (systemd's service_set_state() is the model): the timers, the
 * processes, the waiters, the record on disk and the metrics all change here, in one order. */
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs-util.h"
#include "json-util.h"
#include "log.h"
#include "string-util.h"
#include "vm-internal.h"

#define VM_CONSOLE_TAIL_BYTES (64U * 1024U)
#define VM_ERROR_CONSOLE_LINES 40
#define VM_ERROR_CONSOLE_BYTES (8U * 1024U)
/* How long after READY=1 a VM that must attest may take to post its ready-stage quote (or the boot
 * timeout, when that is shorter). */
#define VM_READY_QUOTE_GRACE (2 * USEC_PER_MINUTE)

/* ---- the object ---- */

Vm *vm_new(Manager *m) {
        Vm *v = calloc(1, sizeof(Vm));

        if (!v)
                return NULL;
        v->n_ref = 1;
        v->manager = m;
        v->notify_fd = -EBADF;
        v->volume_fd = -EBADF;
        v->rec.phase = _VM_PHASE_INVALID;
        v->rec.install_mode = VM_INSTALL_BOOT;
        return v;
}

static Vm *vm_free(Vm *v) {
        /* a VM caught mid-start cannot be handed over: its chain would have no one to finish it */
        if (manager_detaching(v->manager) &&
            !IN_SET(v->sub, VM_SUB_START_HELPERS, VM_SUB_START_QMP, VM_SUB_HOST_INSTALL))
                vm_detach_processes(v);
        else
                vm_kill(v);
        vm_observers_free(v);
        vm_waiters_free(v);
        vm_record_done(&v->rec);
        image_unref(v->image);
        free(v->fail_reason);
        free(v->dir);
        safe_close(v->volume_fd);
        sd_event_source_disable_unref(v->imds_source);
        free(v->notify_path);
        free(v->guest_exit_status);
        free(v->balloon_error);
        vm_guest_done(&v->guest);
        explicit_bzero(&v->challenge, sizeof(v->challenge));
        vm_vars_copy_forget(v);
        free(v);
        return NULL;
}

const Image *vm_image(Vm *v) {
        if (!v->image && v->rec.spec.image) {
                _cleanup_(image_unrefp)
                        Image *i = image_catalog_acquire(manager_images(v->manager), v->rec.spec.image);

                /* a bare id resolves to its newest version: only the very image the VM was made of */
                if (i && streq(i->ref, v->rec.spec.image))
                        v->image = TAKE_PTR(i);
        }
        return v->image;
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

/* ---- accessors ---- */

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

const VmGuest *vm_guest(Vm *v) {
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

const VmSpec *vm_spec(Vm *v) {
        return &v->rec.spec;
}

const char *vm_ssh_public_key(Vm *v) {
        return v->rec.ssh_public_key;
}

bool vm_user_data_released(Vm *v) {
        return v->rec.att.released;
}

const char *vm_ip(Vm *v) {
        return v->rec.ip;
}

Manager *vm_manager(Vm *v) {
        return v->manager;
}

char *vm_path(Vm *v, const char *name) {
        char *p = NULL;

        if (asprintf(&p, "%s/%s", v->dir, name) < 0)
                return NULL;
        return p;
}

char *vm_process_unit(Vm *v, const char *role) {
        char *unit = NULL;

        if (asprintf(&unit, "vm-manager-%s-%s.service", v->rec.id, role) < 0)
                return NULL;
        return unit;
}

/* ---- the record ---- */

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

int vm_save(Vm *v) {
        _cleanup_free_ char *path = vm_path(v, "vm.json");
        json_t *j = vm_record_json(v, true);
        int r;

        if (!path || !j) {
                json_decref(j);
                return -ENOMEM;
        }
        /* Queued: rendered, written and fsynced off the loop, after every earlier save (an answer
         * that reports the record waits for it, manager_sync()); a record of 64 KiB of control
         * characters in its metadata renders to 400 KB, and a shutdown saves every VM at once. The
         * tree is new, and shares only values the record never changes (the spec's metadata,
         * createdBy). Never a record the next start refuses to read (the request limits keep it
         * far below VM_RECORD_MAX): a larger one fails, and is logged, on the thread. */
        r = manager_write_json(v->manager, path, j, VM_RECORD_MAX, 0600);
        if (r < 0)
                log_struct(
                        LOG_ERR, LOG_FIELDS({ "VM_ID", v->rec.id }), "Failed to save %s: %s", path, strerror(-r));
        return r;
}

/* Every change goes to disk and bumps the records' generation; waiters look at it. */
void vm_changed(Vm *v) {
        (void) vm_save(v);
        manager_touch(v->manager);
        vm_waiters_check(v);
}

void vm_set_error(Vm *v, const char *text) {
        free(v->rec.last_error);
        v->rec.last_error = text ? strdup(text) : NULL;
        v->rec.console_tail = mfree(v->rec.console_tail);
}

/* ---- the console ---- */

int vm_console_open(Vm *v, uint64_t *ret_size, uint64_t *ret_ino) {
        _cleanup_free_ char *path = vm_path(v, "console.log");
        _cleanup_close_ int fd = -EBADF;
        struct stat st;

        if (!path)
                return -ENOMEM;
        /* O_NONBLOCK: should the file ever be a FIFO, the open and the reads must still not wait. */
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EBADFD;
        *ret_size = (uint64_t) st.st_size;
        *ret_ino = (uint64_t) st.st_ino;
        return TAKE_FD(fd);
}

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

char *vm_file_tail(Vm *v, const char *name, size_t max) {
        _cleanup_free_ char *path = vm_path(v, name);
        _cleanup_close_ int fd = -EBADF;
        struct stat st;
        char *buf;
        ssize_t k;
        off_t off = 0;

        if (!path)
                return NULL;
        fd = open(path, O_RDONLY | O_CLOEXEC);
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

/* consoleTail of a failure: the console's last lines as they were then, without the terminal's
 * escape sequences, cut from the front (at a line) to VM_ERROR_CONSOLE_BYTES. */
static void vm_capture_console(Vm *v) {
        _cleanup_free_ char *tail = console_tail(v, VM_ERROR_CONSOLE_LINES);
        size_t n;

        if (!tail || !*tail)
                return;
        strip_terminal_escapes(tail);
        n = strlen(tail);
        /* the last lines are the telling ones */
        if (n > VM_ERROR_CONSOLE_BYTES) {
                const char *start = tail + n - VM_ERROR_CONSOLE_BYTES, *nl = strchr(start, '\n');
                memmove(tail, nl ? nl + 1 : start, strlen(nl ? nl + 1 : start) + 1);
        }
        if (*tail) {
                free(v->rec.console_tail);
                v->rec.console_tail = TAKE_PTR(tail);
        }
}

/* ---- the lifecycle ---- */

VmStatus vm_status(Vm *v) {
        return (VmStatus){
                .state = v->rec.state,
                .sub = v->sub,
                .phase = v->rec.phase,
                .gate = vm_attest_gate(v),
                .failing = v->fail_reason != NULL,
                .installed = v->rec.installed_at != 0,
                .shutting_down = manager_shutting_down(v->manager),
        };
}

static usec_t vm_ready_quote_grace(Vm *v) {
        return MIN(VM_READY_QUOTE_GRACE, manager_settings(v->manager)->boot_timeout);
}

char *vm_message(Vm *v, VmMessage m, const VmMessageArgs *extra) {
        const ManagerSettings *st = manager_settings(v->manager);
        VmMessageArgs a = extra ? *extra : (VmMessageArgs){ .state = v->rec.state };

        a.id = a.id ?: v->rec.id;
        if (a.duration == 0)
                a.duration = m == VM_MESSAGE_INSTALL_TIMEOUT ? st->install_timeout :
                        m == VM_MESSAGE_NO_READY             ? st->boot_timeout :
                        m == VM_MESSAGE_NO_READY_QUOTE       ? vm_ready_quote_grace(v) :
                        m == VM_MESSAGE_QMP_TIMEOUT          ? st->qmp_timeout :
                                                               0;
        return vm_message_format(m, &a);
}

static int on_phase_timeout(sd_event_source *s, usec_t usec, void *userdata) {
        Vm *v = userdata;

        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        if (v->rec.phase == VM_PHASE_INSTALL)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "Installer of VM %s overran, killing it.",
                        v->rec.id);
        (void) vm_set_state(v, VM_EVENT_PHASE_TIMEOUT, NULL, NULL);
        return 0;
}

void vm_arm_phase_timer(Vm *v, usec_t timeout, usec_t accuracy) {
        int r;

        v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        r = sd_event_add_time_relative(
                manager_event(v->manager),
                &v->phase_timer,
                CLOCK_MONOTONIC,
                timeout,
                accuracy,
                on_phase_timeout,
                v);
        if (r < 0)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "No phase timer for %s, ignoring: %s",
                        v->rec.id,
                        strerror(-r));
}

/* A new installed boot starts afresh: readiness, status, errors, attestation. */
static void vm_begin_boot(Vm *v) {
        v->rec.booted_at = now_usec(CLOCK_REALTIME);
        v->rec.ready_at = 0;
        v->rec.status = mfree(v->rec.status);
        vm_set_error(v, NULL);
        vm_attest_reset(v);
        v->guest_exit_status = mfree(v->guest_exit_status);
        v->fail_reason = mfree(v->fail_reason);
}

static void vm_state_change(Vm *v, VmState s) {
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
        vm_observers_notify(v);
        manager_vm_event(v->manager, v, MANAGER_VM_STATE);
}

/* The text of the transition's message: what lastError becomes, or why the event is refused. */
static char *transition_text(Vm *v, const VmStatus *s, const VmTransition *t, const VmEventArgs *a) {
        _cleanup_free_ char *cause = NULL;
        const char *detail = a->detail;

        if (IN_SET(t->message, VM_MESSAGE_NONE, VM_MESSAGE_CLEAR))
                return NULL;
        if (IN_SET(t->message, VM_MESSAGE_GUEST_FAILED, VM_MESSAGE_QEMU_EXIT))
                cause = vm_attest_boot_rejection(v);
        if (!detail && t->message == VM_MESSAGE_READY_REJECTED)
                detail = v->rec.att.initrd.message;
        if (!detail && t->message == VM_MESSAGE_DETAIL)
                detail = v->fail_reason; /* powered off for a verdict: lastError still says why */
        return vm_message(
                v,
                t->message,
                &(VmMessageArgs){
                        .state = s->state,
                        .exit_status = a->exit_status,
                        .guest_status = v->guest_exit_status,
                        .cause = cause,
                        .stage = a->stage,
                        .detail = detail,
                });
}

static int refusal(Vm *v, const VmStatus *s, const VmTransition *t, ApiError *reterr) {
        _cleanup_free_ char *text = transition_text(v, s, t, &(VmEventArgs){});

        return api_error_set(reterr, t->error, API_ERROR_CONFLICT, "%s", text ?: "refused");
}

int vm_check_event(Vm *v, VmEvent e, ApiError *reterr) {
        VmStatus s = vm_status(v);
        VmTransition t = vm_state_next(&s, e);

        return t.error < 0 ? refusal(v, &s, &t, reterr) : 0;
}

/* The record's facts a transition sets: a new boot, installed, ready. */
static void apply_facts(Vm *v, VmAction actions) {
        if (actions & VM_ACTION_BEGIN_BOOT)
                vm_begin_boot(v);
        if (actions & VM_ACTION_INSTALLED) {
                v->rec.installed_at = now_usec(CLOCK_REALTIME);
                if (v->rec.created_at > 0 && v->rec.installed_at >= v->rec.created_at)
                        manager_observe_install(v->manager, v->rec.installed_at - v->rec.created_at);
        }
        if (actions & VM_ACTION_BECOME_READY) {
                v->rec.ready_at = now_usec(CLOCK_REALTIME);
                if (v->rec.booted_at > 0 && v->rec.ready_at >= v->rec.booted_at)
                        manager_observe_boot_to_ready(v->manager, v->rec.ready_at - v->rec.booted_at);
                v->rec.booted = true;
        }
}

/* The state, the sub-state, and the reason a failing boot ends with. */
static void apply_state(Vm *v, const VmStatus *s, const VmTransition *t, const char *text) {
        if (t->failing && !s->failing) {
                /* a boot that cannot succeed: the waiters hear why at once, the VM is failed once
                 * QEMU is gone */
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s (%s) failed: %s; powering it off.",
                        v->rec.id,
                        v->rec.spec.name,
                        text ?: "?");
                free(v->fail_reason);
                v->fail_reason = strdup(text ?: "attestation rejected");
        } else if (!t->failing)
                v->fail_reason = mfree(v->fail_reason);
        v->sub = t->sub;
        v->rec.phase = t->phase;
        vm_state_change(v, t->state);
}

/* lastError, and what explains it. */
static void apply_error(Vm *v, const VmTransition *t, const VmEventArgs *a, const char *text) {
        if (t->message == VM_MESSAGE_CLEAR)
                vm_set_error(v, NULL);
        else if (t->message != VM_MESSAGE_NONE)
                vm_set_error(v, text);
        if (t->actions & VM_ACTION_CLEAR_REJECTION) {
                /* a verified retry clears the rejection of its stage */
                _cleanup_free_ char *prefix = NULL;
                if (asprintf(&prefix, "%s attestation rejected: ", a->stage ?: "?") >= 0 &&
                    v->rec.last_error && startswith(v->rec.last_error, prefix))
                        vm_set_error(v, NULL);
        }
        if (t->actions & VM_ACTION_CONSOLE)
                vm_capture_console(v);
}

/* The processes and the timers of the run. */
static int apply_run(Vm *v, VmAction actions, ApiError *reterr) {
        const ManagerSettings *st = manager_settings(v->manager);
        int r;

        if (actions & VM_ACTION_HOST_INSTALL) {
                r = vm_host_install_start(v, reterr);
                if (r < 0)
                        return r;
        }
        if (actions & VM_ACTION_SPAWN_HELPERS) {
                r = vm_start_helpers(v, reterr);
                if (r < 0)
                        return r;
        }
        if (actions & VM_ACTION_SPAWN_QEMU) {
                r = vm_start_qemu(v, reterr);
                if (r < 0)
                        return r;
        }
        if (actions & VM_ACTION_LINK)
                vm_net_attach(v);
        if (actions & VM_ACTION_PHASE_TIMER) {
                vm_arm_phase_timer(
                        v,
                        v->rec.phase == VM_PHASE_INSTALL ? st->install_timeout : st->boot_timeout,
                        USEC_PER_SEC);
                vm_console_watch_start(v);
        }
        if (actions & VM_ACTION_GRACE_TIMER)
                vm_arm_phase_timer(v, vm_ready_quote_grace(v), USEC_PER_MSEC);
        return 0;
}

/* The start chain's waiters hear how it ended: failed or deleted, with the text of the transition. */
static void finish_start(Vm *v, const VmTransition *t, const VmEventArgs *a, const char *text) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        bool failed = IN_SET(t->state, VM_STATE_FAILED, VM_STATE_DELETING);

        if (failed)
                (void) api_error_set(
                        &e, a->error < 0 ? a->error : -EIO, API_ERROR_INTERNAL, "%s", text ?: "start failed");
        vm_waiters_finish_start(v, failed ? e.error : 0, failed ? &e : NULL);
}

int vm_set_state(Vm *v, VmEvent e, const VmEventArgs *a, ApiError *reterr) {
        _unused_ _cleanup_(vm_unrefp) Vm *pin = vm_ref(v);
        _cleanup_free_ char *text = NULL;
        VmStatus s = vm_status(v);
        VmTransition t = vm_state_next(&s, e);
        VmEventArgs none = {};
        int r;

        a = a ?: &none;
        if (t.error < 0)
                return refusal(v, &s, &t, reterr);
        if (t.ignored)
                return 0;
        text = transition_text(v, &s, &t, a);
        if (t.sub != s.sub)
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s: %s/%s + %s -> %s/%s",
                        v->rec.id,
                        vm_state_to_string(s.state),
                        vm_sub_state_to_string(s.sub),
                        vm_event_to_string(e),
                        vm_state_to_string(t.state),
                        vm_sub_state_to_string(t.sub));

        /* what goes first: QEMU's end, a run killed, the phase timer */
        if (t.actions & VM_ACTION_TEARDOWN)
                vm_teardown(v);
        if (t.actions & VM_ACTION_KILL)
                vm_kill(v);
        if (t.actions & VM_ACTION_DISARM)
                v->phase_timer = sd_event_source_disable_unref(v->phase_timer);
        if (t.actions & VM_ACTION_DROP_DISK) {
                /* a create that did not finish leaves no disk behind, not even half of one */
                v->volume_fd = safe_close(v->volume_fd);
                vm_delete_volume(v->manager, v->rec.id);
        }

        apply_facts(v, t.actions);
        apply_state(v, &s, &t, text);
        apply_error(v, &t, a, text);
        r = apply_run(v, t.actions, reterr);
        if (r < 0)
                return r; /* the caller ends the start chain */
        if (t.actions & VM_ACTION_SAVE)
                vm_changed(v);

        /* the stop escalation */
        if (t.actions & VM_ACTION_POWERDOWN)
                vm_powerdown(v);
        if (t.actions & VM_ACTION_SIGTERM)
                vm_signal(v, SIGTERM);
        if (t.actions & VM_ACTION_SIGKILL)
                vm_signal(v, SIGKILL);

        if (t.actions & VM_ACTION_FINISH_START)
                finish_start(v, &t, a, text);
        return 0;
}
