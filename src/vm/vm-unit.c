/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <systemd/sd-bus.h>

#include "log.h"
#include "time-util.h"
#include "vm-unit.h"

#ifndef __NR_pidfd_open
#        define __NR_pidfd_open 434
#endif

#define SD_DESTINATION "org.freedesktop.systemd1"
#define SD_PATH "/org/freedesktop/systemd1"
#define SD_MANAGER "org.freedesktop.systemd1.Manager"
#define SD_UNIT "org.freedesktop.systemd1.Unit"
#define SD_SERVICE "org.freedesktop.systemd1.Service"

#define SD_ERROR_NO_SUCH_UNIT "org.freedesktop.systemd1.NoSuchUnit"
#define SD_ERROR_NO_SUCH_PROCESS "org.freedesktop.systemd1.NoSuchProcess"
#define SD_ERROR_UNIT_EXISTS "org.freedesktop.systemd1.UnitExists"

#define POLKIT_DESTINATION "org.freedesktop.PolicyKit1"
#define POLKIT_PATH "/org/freedesktop/PolicyKit1/Authority"
#define POLKIT_AUTHORITY "org.freedesktop.PolicyKit1.Authority"
#define POLKIT_ACTION_MANAGE_UNITS "org.freedesktop.systemd1.manage-units"

#define VM_UNIT_SLICE "vm-manager.slice"
#define VM_UNIT_CALL_USEC (15 * USEC_PER_SEC)       /* every method call, and a whole start */
#define VM_UNIT_EXIT_POLL_USEC (50 * USEC_PER_MSEC) /* reading the exit status after the exit */
#define VM_UNIT_EXIT_WAIT_USEC (5 * USEC_PER_SEC)

struct VmUnitManager {
        sd_event *event;
        sd_bus *bus; /* a direct connection to the manager's private socket, or the system bus */
        bool on_bus; /* the system bus (a daemon that is not root): signals carry a sender */
        /* Units of the system manager started by a daemon that is not root run with its credentials
         * (User=, Group=, SupplementaryGroups=), not as root. */
        bool as_caller;
        uid_t uid;
        gid_t gid;
        gid_t *groups;
        size_t n_groups;
};

struct VmUnit {
        VmUnitManager *manager; /* borrowed */
        char *name;
        pid_t pid;
        sd_event_source *pidfd_source; /* owns the pidfd; NULL once the process ended */
        sd_event_source *exit_source;  /* defer, then timer: reads the recorded exit status */
        bool exit_timer;               /* exit_source is the timer */
        usec_t exit_deadline;
        bool exited;
        bool reported;
        VmUnitExitFunc on_exit;
        void *userdata;
};

/* What the manager says about one unit. */
typedef struct UnitState {
        bool loaded;
        pid_t main_pid;      /* the live main process, 0 once it ended */
        pid_t exec_main_pid; /* the last main process, kept after the exit */
        int exec_main_code;  /* si_code, 0 while running or never started */
        int exec_main_status;
} UnitState;

static int pidfd_open(pid_t pid) {
        return (int) syscall(__NR_pidfd_open, pid, 0);
}

static int bus_error_to_errno(const sd_bus_error *error, int r) {
        if (sd_bus_error_has_name(error, SD_ERROR_NO_SUCH_UNIT) ||
            sd_bus_error_has_name(error, SD_ERROR_NO_SUCH_PROCESS))
                return -ESRCH;
        if (sd_bus_error_has_name(error, SD_ERROR_UNIT_EXISTS))
                return -EBUSY;
        return r;
}

static int make_absolute(const char *p, char **ret) {
        _cleanup_free_ char *cwd = NULL;
        char *s;

        if (p[0] == '/')
                s = strdup(p);
        else {
                cwd = getcwd(NULL, 0);
                if (!cwd)
                        return -errno;
                if (asprintf(&s, "%s/%s", cwd, p) < 0)
                        s = NULL;
        }
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}

static bool is_executable_file(const char *p) {
        struct stat st;

        return stat(p, &st) >= 0 && S_ISREG(st.st_mode) && access(p, X_OK) >= 0;
}

/* The manager needs an absolute ExecStart path: resolve name on our PATH, as execvp() would. */
static int find_executable(const char *name, char **ret) {
        const char *path, *p;

        if (strchr(name, '/')) {
                _cleanup_free_ char *abs = NULL;
                int r;

                r = make_absolute(name, &abs);
                if (r < 0)
                        return r;
                if (!is_executable_file(abs))
                        return -ENOENT;
                *ret = TAKE_PTR(abs);
                return 0;
        }

        path = secure_getenv("PATH") ?: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        for (p = path;; p++) {
                size_t n = strcspn(p, ":");
                _cleanup_free_ char *candidate = NULL;

                /* Relative entries (".", "") are skipped: the manager runs in another directory. */
                if (n > 0 && p[0] == '/') {
                        if (asprintf(&candidate, "%.*s/%s", (int) n, p, name) < 0)
                                return -ENOMEM;
                        if (is_executable_file(candidate)) {
                                *ret = TAKE_PTR(candidate);
                                return 0;
                        }
                }
                p += n;
                if (!*p)
                        break;
        }
        return -ENOENT;
}

/* ---- The connection ---- */

static bool system_manager_booted(void) {
        return access("/run/systemd/system", F_OK) >= 0;
}

static int user_manager_address(char **ret, const char **ret_reason) {
        const char *dir = secure_getenv("XDG_RUNTIME_DIR");
        struct stat st;
        char *address;
        int r;

        if (dir && dir[0] == '/')
                r = asprintf(&address, "unix:path=%s/systemd/private", dir);
        else
                r = asprintf(&address, "unix:path=/run/user/%u/systemd/private", (unsigned) geteuid());
        if (r < 0)
                return -ENOMEM;
        if (stat(address + strlen("unix:path="), &st) < 0 || !S_ISSOCK(st.st_mode)) {
                log_debug("no service manager socket at '%s'", address + strlen("unix:path="));
                free(address);
                *ret_reason = dir && dir[0] == '/' ?
                        "no user service manager at $XDG_RUNTIME_DIR/systemd/private "
                        "(for a service user: loginctl enable-linger)" :
                        "no user service manager at /run/user/<uid>/systemd/private "
                        "(for a service user: loginctl enable-linger)";
                return -EHOSTDOWN;
        }
        *ret = address;
        return 0;
}

/* Where to reach the manager: *ret is the address of a private socket, or NULL for the system bus
 * (the system manager for a daemon that is not root, which asks polkit before it obeys). AUTO picks
 * the system manager as root on a host booted with systemd; otherwise the user's own manager when it
 * runs, else the system manager over the bus. */
static int manager_address(VmUnitScope scope, char **ret, const char **ret_reason) {
        bool root = geteuid() == 0;
        char *address;
        int r;

        if (scope == VM_UNIT_SCOPE_AUTO) {
                if (root)
                        scope = system_manager_booted() ? VM_UNIT_SCOPE_SYSTEM : VM_UNIT_SCOPE_USER;
                else {
                        r = user_manager_address(ret, ret_reason);
                        if (r != -EHOSTDOWN || !system_manager_booted())
                                return r;
                        *ret_reason = NULL;
                        scope = VM_UNIT_SCOPE_SYSTEM;
                }
        }

        if (scope == VM_UNIT_SCOPE_USER)
                return user_manager_address(ret, ret_reason);

        if (!system_manager_booted()) {
                *ret_reason = root ? "running as root but /run/systemd/system does not exist" :
                                     "the host was not booted with systemd (no /run/systemd/system)";
                return -EHOSTDOWN;
        }
        if (!root) {
                *ret = NULL;
                return 0;
        }
        address = strdup("unix:path=/run/systemd/private");
        if (!address)
                return -ENOMEM;
        *ret = address;
        return 0;
}

/* The system manager lets a caller that is not root start and stop units only with polkit's consent
 * for org.freedesktop.systemd1.manage-units (deploy/polkit-1/rules.d/vm-manager.rules grants it to
 * the vm-manager user). Asked once, at connection time, the way the manager itself will ask: for
 * this bus name, without interaction. */
static int check_polkit(VmUnitManager *m, const char **ret_reason) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        const char *unique;
        int authorized, challenge, r;

        r = sd_bus_get_unique_name(m->bus, &unique);
        if (r < 0)
                return r;
        r = sd_bus_call_method(
                m->bus,
                POLKIT_DESTINATION,
                POLKIT_PATH,
                POLKIT_AUTHORITY,
                "CheckAuthorization",
                &error,
                &reply,
                "(sa{sv})sa{ss}us",
                "system-bus-name",
                1,
                "name",
                "s",
                unique,
                POLKIT_ACTION_MANAGE_UNITS,
                0,
                UINT32_C(0),
                "");
        if (r < 0) {
                log_debug_errno(r, "polkit CheckAuthorization: %s", error.message ?: "-");
                *ret_reason = sd_bus_error_has_names(
                                      &error,
                                      "org.freedesktop.DBus.Error.ServiceUnknown",
                                      "org.freedesktop.DBus.Error.NameHasNoOwner") ?
                        "the system service manager takes units from a user other than root only with "
                        "polkit's consent, and polkit (polkitd) is not on the system bus" :
                        "polkit did not answer whether this user may manage units";
                return -EHOSTDOWN;
        }
        r = sd_bus_message_enter_container(reply, 'r', "bba{ss}");
        if (r >= 0)
                r = sd_bus_message_read(reply, "bb", &authorized, &challenge);
        if (r < 0)
                return log_debug_errno(r, "polkit's answer: %m");
        if (!authorized) {
                log_debug(
                        "polkit: uid %u may not %s%s",
                        (unsigned) m->uid,
                        POLKIT_ACTION_MANAGE_UNITS,
                        challenge ? " without authentication" : "");
                *ret_reason =
                        "polkit does not allow this user to manage the system's units "
                        "(org.freedesktop.systemd1.manage-units; the vm-manager user gets it from "
                        "deploy/polkit-1/rules.d/vm-manager.rules)";
                return -EHOSTDOWN;
        }
        return 0;
}

static int manager_take_credentials(VmUnitManager *m) {
        int n;

        m->uid = geteuid();
        m->gid = getegid();
        n = getgroups(0, NULL);
        if (n < 0)
                return -errno;
        if (n > 0) {
                m->groups = calloc(n, sizeof(gid_t));
                if (!m->groups)
                        return -ENOMEM;
                n = getgroups(n, m->groups);
                if (n < 0)
                        return -errno;
        }
        m->n_groups = n;
        m->as_caller = true;
        return 0;
}

int vm_unit_manager_new(VmUnitManager **ret, sd_event *e, VmUnitScope scope, const char **ret_reason) {
        _cleanup_(vm_unit_manager_freep) VmUnitManager *m = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_free_ char *address = NULL, *version = NULL;
        const char *reason = NULL, *where;
        int r;

        assert_return(ret && e, -EINVAL);
        assert_return(scope >= VM_UNIT_SCOPE_AUTO && scope <= VM_UNIT_SCOPE_USER, -EINVAL);

        r = manager_address(scope, &address, &reason);
        if (r < 0)
                goto fail;
        where = address ? address : "the system bus";

        m = calloc(1, sizeof(VmUnitManager));
        if (!m)
                return -ENOMEM;
        m->event = sd_event_ref(e);
        m->on_bus = !address;

        if (m->on_bus) {
                r = manager_take_credentials(m);
                if (r < 0)
                        return r;
                r = sd_bus_open_system_with_description(&m->bus, "vm-manager-units");
                if (r < 0) {
                        log_debug_errno(r, "cannot connect to the system bus: %m");
                        reason = "the system bus does not accept connections";
                        r = -EHOSTDOWN;
                        goto fail;
                }
        } else {
                r = sd_bus_new(&m->bus);
                if (r < 0)
                        return r;
                r = sd_bus_set_address(m->bus, address);
                if (r < 0)
                        return r;
        }
        r = sd_bus_set_method_call_timeout(m->bus, VM_UNIT_CALL_USEC);
        if (r < 0)
                return r;
        if (!m->on_bus) {
                r = sd_bus_start(m->bus);
                if (r < 0) {
                        log_debug_errno(r, "cannot connect to '%s': %m", address);
                        reason = "the service manager does not accept connections on its private socket";
                        r = -EHOSTDOWN;
                        goto fail;
                }
        }

        /* Authentication happens with the first call: one property read proves the manager answers. */
        r = sd_bus_get_property_string(
                m->bus, SD_DESTINATION, SD_PATH, SD_MANAGER, "Version", &error, &version);
        if (r < 0) {
                log_debug_errno(r, "service manager at '%s' does not answer: %s", where, error.message ?: "-");
                reason = m->on_bus ? "the system service manager does not answer on the system bus" :
                                     "the service manager does not answer on its private socket";
                r = -EHOSTDOWN;
                goto fail;
        }

        if (m->on_bus) {
                r = check_polkit(m, &reason);
                if (r < 0)
                        goto fail;
                /* On the bus the manager sends JobRemoved only to subscribers. */
                r = sd_bus_call_method(
                        m->bus, SD_DESTINATION, SD_PATH, SD_MANAGER, "Subscribe", &error, NULL, NULL);
                if (r < 0)
                        return log_debug_errno(r, "Subscribe: %s", error.message ?: "-");
        }
        log_debug("connected to systemd %s at '%s'", version, where);

        r = sd_bus_attach_event(m->bus, e, SD_EVENT_PRIORITY_NORMAL);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(m);
        return 0;

fail:
        if (ret_reason && reason)
                *ret_reason = reason;
        return r;
}

VmUnitManager *vm_unit_manager_free(VmUnitManager *m) {
        if (!m)
                return NULL;
        if (m->bus) {
                (void) sd_bus_flush(m->bus);
                (void) sd_bus_detach_event(m->bus);
                m->bus = sd_bus_close_unref(m->bus);
        }
        sd_event_unref(m->event);
        free(m->groups);
        free(m);
        return NULL;
}

/* ---- Unit state and jobs ---- */

static int unit_read_state(VmUnitManager *m, const char *name, UnitState *ret) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_free_ char *load_state = NULL;
        const char *path;
        uint32_t main_pid, exec_main_pid;
        int32_t code, status;
        int r;

        r = sd_bus_call_method(
                m->bus, SD_DESTINATION, SD_PATH, SD_MANAGER, "GetUnit", &error, &reply, "s", name);
        if (r < 0) {
                r = bus_error_to_errno(&error, r);
                if (r == -ESRCH) {
                        *ret = (UnitState){ .loaded = false };
                        return 0;
                }
                return log_debug_errno(r, "GetUnit '%s': %s", name, error.message ?: "-");
        }
        r = sd_bus_message_read(reply, "o", &path);
        if (r < 0)
                return r;

        r = sd_bus_get_property_string(m->bus, SD_DESTINATION, path, SD_UNIT, "LoadState", &error, &load_state);
        if (r >= 0)
                r = sd_bus_get_property_trivial(
                        m->bus, SD_DESTINATION, path, SD_SERVICE, "MainPID", &error, 'u', &main_pid);
        if (r >= 0)
                r = sd_bus_get_property_trivial(
                        m->bus, SD_DESTINATION, path, SD_SERVICE, "ExecMainPID", &error, 'u', &exec_main_pid);
        if (r >= 0)
                r = sd_bus_get_property_trivial(
                        m->bus, SD_DESTINATION, path, SD_SERVICE, "ExecMainCode", &error, 'i', &code);
        if (r >= 0)
                r = sd_bus_get_property_trivial(
                        m->bus, SD_DESTINATION, path, SD_SERVICE, "ExecMainStatus", &error, 'i', &status);
        if (r < 0) {
                r = bus_error_to_errno(&error, r);
                if (r == -ESRCH) { /* collected between the calls */
                        *ret = (UnitState){ .loaded = false };
                        return 0;
                }
                return log_debug_errno(r, "reading unit '%s': %s", name, error.message ?: "-");
        }

        *ret = (UnitState){
                .loaded = !streq(load_state, "") && !streq(load_state, "not-found"),
                .main_pid = (pid_t) main_pid,
                .exec_main_pid = (pid_t) exec_main_pid,
                .exec_main_code = code,
                .exec_main_status = status,
        };
        return 0;
}

/* Waiting for a job: the JobRemoved match is installed before the call that creates the job, and
 * sd_bus_call() only queues signals, so the job path is known before any JobRemoved is dispatched. */
typedef struct JobWait {
        sd_bus_slot *slot;
        char *path;
        bool done;
        int error; /* 0 for the result "done" */
} JobWait;

static void job_wait_done(JobWait *w) {
        w->slot = sd_bus_slot_unref(w->slot);
        w->path = mfree(w->path);
}

static int on_job_removed(sd_bus_message *msg, void *userdata, sd_bus_error *reterr) {
        JobWait *w = userdata;
        const char *path, *unit, *result;
        uint32_t id;

        if (sd_bus_message_read(msg, "uoss", &id, &path, &unit, &result) < 0)
                return 0;
        if (w->done || !w->path || !streq(path, w->path))
                return 0;

        w->done = true;
        w->error = streq(result, "done")  ? 0 :
                streq(result, "timeout")  ? -ETIMEDOUT :
                streq(result, "canceled") ? -ECANCELED :
                                            -EIO;
        if (w->error < 0)
                log_debug("job %s for '%s' finished with '%s'", path, unit, result);
        return 0;
}

static int job_wait_begin(VmUnitManager *m, JobWait *w) {
        /* A direct connection has no sender names: match without one there (as systemd's
         * bus-wait-for-jobs); on the bus only the manager's signals count. */
        return sd_bus_match_signal(
                m->bus,
                &w->slot,
                m->on_bus ? SD_DESTINATION : NULL,
                SD_PATH,
                SD_MANAGER,
                "JobRemoved",
                on_job_removed,
                w);
}

static int job_wait_set_path(JobWait *w, sd_bus_message *reply) {
        const char *path;
        int r;

        r = sd_bus_message_read(reply, "o", &path);
        if (r < 0)
                return r;
        w->path = strdup(path);
        return w->path ? 0 : -ENOMEM;
}

/* A synchronous wait on the bus, bounded by deadline (CLOCK_MONOTONIC). */
static int job_wait_run(VmUnitManager *m, JobWait *w, usec_t deadline) {
        int r;

        for (;;) {
                usec_t n;

                r = sd_bus_process(m->bus, NULL);
                if (r < 0)
                        return r;
                if (w->done)
                        return w->error;
                if (r > 0)
                        continue;

                n = now_usec(CLOCK_MONOTONIC);
                if (n >= deadline)
                        return log_debug_errno(
                                SYNTHETIC_ERRNO(ETIMEDOUT), "job %s did not finish in time", w->path);
                r = sd_bus_wait(m->bus, deadline - n);
                if (r < 0)
                        return r;
        }
}

/* StopUnit, optionally waiting for the stop job, then ResetFailedUnit; failures are only logged. */
static void unit_stop_and_reset(VmUnitManager *m, const char *name, bool wait) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(job_wait_done) JobWait w = {};
        int r;

        if (wait) {
                r = job_wait_begin(m, &w);
                if (r < 0) {
                        log_debug_errno(r, "cannot watch jobs, not waiting for the stop: %m");
                        wait = false;
                }
        }

        r = sd_bus_call_method(
                m->bus, SD_DESTINATION, SD_PATH, SD_MANAGER, "StopUnit", &error, &reply, "ss", name, "replace");
        if (r < 0)
                log_debug_errno(r, "StopUnit '%s': %s, ignoring", name, error.message ?: "-");
        else if (wait) {
                r = job_wait_set_path(&w, reply);
                if (r >= 0)
                        r = job_wait_run(m, &w, now_usec(CLOCK_MONOTONIC) + VM_UNIT_CALL_USEC);
                if (r < 0)
                        log_debug_errno(r, "stopping '%s': %m, ignoring", name);
        }

        sd_bus_error_free(&error);
        r = sd_bus_call_method(
                m->bus, SD_DESTINATION, SD_PATH, SD_MANAGER, "ResetFailedUnit", &error, NULL, "s", name);
        if (r < 0 && bus_error_to_errno(&error, r) != -ESRCH)
                log_debug_errno(r, "ResetFailedUnit '%s': %s, ignoring", name, error.message ?: "-");
}

/* A stopped and reset unit is garbage-collected by the manager's next loop iteration; a transient
 * unit of the same name can only be created after that. */
static int unit_wait_gone(VmUnitManager *m, const char *name, usec_t deadline) {
        for (;;) {
                UnitState st;
                int r;

                r = unit_read_state(m, name, &st);
                if (r < 0)
                        return r;
                if (!st.loaded)
                        return 0;
                if (now_usec(CLOCK_MONOTONIC) >= deadline)
                        return log_debug_errno(SYNTHETIC_ERRNO(EBUSY), "unit '%s' stays loaded", name);
                (void) usleep(20 * USEC_PER_MSEC);
        }
}

/* ---- Exit watching ---- */

static void unit_exit_report(VmUnit *u, int code, int status) {
        if (u->reported)
                return;
        u->reported = true;
        u->exit_source = sd_event_source_disable_unref(u->exit_source);

        unit_stop_and_reset(u->manager, u->name, /* wait= */ false);
        if (u->on_exit)
                u->on_exit(u, code, status, u->userdata); /* may free u */
}

/* Once the process has ended the manager records its status when it reaps it: until MainPID is 0 and
 * ExecMainCode is set, poll every 50 ms for up to 5 s. The first read runs from a defer source. */
static int on_exit_timer(sd_event_source *s, uint64_t usec, void *userdata);

static void unit_exit_poll(VmUnit *u) {
        UnitState st = {};
        int r;

        r = unit_read_state(u->manager, u->name, &st);
        if (r >= 0 && !st.loaded) {
                log_debug("unit '%s' is gone, exit status unknown", u->name);
                unit_exit_report(u, 0, 0);
                return;
        }
        if (r >= 0 && st.main_pid == 0 && st.exec_main_code != 0) {
                unit_exit_report(u, st.exec_main_code, st.exec_main_status);
                return;
        }
        if (now_usec(CLOCK_MONOTONIC) >= u->exit_deadline) {
                if (r < 0)
                        log_debug_errno(r, "unit '%s': exit status unknown: %m", u->name);
                else
                        log_debug(
                                "unit '%s' still reports pid %d, exit status unknown",
                                u->name,
                                (int) st.main_pid);
                unit_exit_report(u, 0, 0);
                return;
        }

        if (u->exit_timer) {
                r = sd_event_source_set_time_relative(u->exit_source, VM_UNIT_EXIT_POLL_USEC);
                if (r >= 0)
                        r = sd_event_source_set_enabled(u->exit_source, SD_EVENT_ONESHOT);
        } else {
                u->exit_source = sd_event_source_disable_unref(u->exit_source);
                r = sd_event_add_time_relative(
                        u->manager->event,
                        &u->exit_source,
                        CLOCK_MONOTONIC,
                        VM_UNIT_EXIT_POLL_USEC,
                        0,
                        on_exit_timer,
                        u);
                u->exit_timer = r >= 0;
        }
        if (r < 0) {
                log_debug_errno(r, "unit '%s': cannot poll the exit status: %m", u->name);
                unit_exit_report(u, 0, 0);
        }
}

static int on_exit_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        unit_exit_poll(userdata);
        return 0;
}

static int on_exit_defer(sd_event_source *s, void *userdata) {
        unit_exit_poll(userdata);
        return 0;
}

/* The process ended: read its status from the loop, never from within the caller. */
static int unit_exit_begin(VmUnit *u) {
        u->exited = true;
        u->pidfd_source = sd_event_source_disable_unref(u->pidfd_source);
        u->exit_deadline = now_usec(CLOCK_MONOTONIC) + VM_UNIT_EXIT_WAIT_USEC;
        u->exit_source = sd_event_source_disable_unref(u->exit_source);
        u->exit_timer = false;
        return sd_event_add_defer(u->manager->event, &u->exit_source, on_exit_defer, u);
}

static int on_pidfd(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        VmUnit *u = userdata;
        int r;

        r = unit_exit_begin(u);
        if (r < 0) {
                log_debug_errno(r, "unit '%s': cannot read the exit status: %m", u->name);
                unit_exit_report(u, 0, 0);
        }
        return 0;
}

/* Watches the unit's main process through a pidfd, or, when it already ended, reports its status. */
static int unit_watch(VmUnit *u) {
        _cleanup_close_ int fd = -EBADF;
        UnitState st, again;
        int r;

        r = unit_read_state(u->manager, u->name, &st);
        if (r < 0)
                return r;
        if (!st.loaded)
                return -ESRCH;

        if (st.main_pid > 0) {
                fd = pidfd_open(st.main_pid);
                if (fd < 0 && errno != ESRCH)
                        return log_debug_errno(errno, "pidfd_open(%d): %m", (int) st.main_pid);

                /* The pid could have been reused between the read and pidfd_open(): the manager clears
                 * MainPID only after reaping, so an unchanged MainPID means the pidfd is its process. */
                if (fd >= 0) {
                        r = unit_read_state(u->manager, u->name, &again);
                        if (r < 0)
                                return r;
                        if (again.main_pid != st.main_pid)
                                fd = safe_close(fd);
                        st = again;
                }
        }

        if (fd >= 0) {
                r = sd_event_add_io(u->manager->event, &u->pidfd_source, fd, EPOLLIN, on_pidfd, u);
                if (r < 0)
                        return r;
                r = sd_event_source_set_io_fd_own(u->pidfd_source, true);
                if (r < 0)
                        return r;
                TAKE_FD(fd);
                u->pid = st.main_pid;
                return 0;
        }

        u->pid = st.main_pid > 0 ? st.main_pid : st.exec_main_pid;
        return unit_exit_begin(u);
}

static int unit_new(VmUnit **ret, VmUnitManager *m, const char *name, VmUnitExitFunc on_exit, void *userdata) {
        size_t n = strlen(name);
        VmUnit *u;

        assert_return(n > 0 && !strchr(name, '/'), -EINVAL);

        u = calloc(1, sizeof(VmUnit));
        if (!u)
                return -ENOMEM;
        u->manager = m;
        u->on_exit = on_exit;
        u->userdata = userdata;
        if (n > strlen(".service") && streq(name + n - strlen(".service"), ".service"))
                u->name = strdup(name);
        else if (asprintf(&u->name, "%s.service", name) < 0)
                u->name = NULL;
        if (!u->name) {
                free(u);
                return -ENOMEM;
        }
        *ret = u;
        return 0;
}

/* ---- Public API ---- */

/* User=, Group= and SupplementaryGroups= of the caller, numerically (the manager accepts numbers). */
static int append_credentials(sd_bus_message *call, const VmUnitManager *m) {
        char uid[16], gid[16];
        int r;

        (void) snprintf(uid, sizeof(uid), "%u", (unsigned) m->uid);
        (void) snprintf(gid, sizeof(gid), "%u", (unsigned) m->gid);
        r = sd_bus_message_append(call, "(sv)(sv)", "User", "s", uid, "Group", "s", gid);
        if (r < 0)
                return r;

        r = sd_bus_message_open_container(call, 'r', "sv");
        if (r >= 0)
                r = sd_bus_message_append(call, "s", "SupplementaryGroups");
        if (r >= 0)
                r = sd_bus_message_open_container(call, 'v', "as");
        if (r >= 0)
                r = sd_bus_message_open_container(call, 'a', "s");
        for (size_t i = 0; i < m->n_groups && r >= 0; i++) {
                char g[16];

                if (m->groups[i] == m->gid)
                        continue;
                (void) snprintf(g, sizeof(g), "%u", (unsigned) m->groups[i]);
                r = sd_bus_message_append(call, "s", g);
        }
        for (int i = 0; i < 3 && r >= 0; i++)
                r = sd_bus_message_close_container(call);
        return r;
}

static int append_properties(
        sd_bus_message *call,
        const VmUnitManager *m,
        const char *exe,
        char **argv,
        const char *log_file,
        const char *working_dir,
        bool block_io_uring) {
        int r;

        r = sd_bus_message_open_container(call, 'a', "(sv)");
        if (r < 0)
                return r;
        r = sd_bus_message_append(
                call, "(sv)(sv)(sv)", "Slice", "s", VM_UNIT_SLICE, "Type", "s", "exec", "RemainAfterExit", "b", 1);
        if (r < 0)
                return r;
        if (m->as_caller) {
                r = append_credentials(call, m);
                if (r < 0)
                        return r;
        }

        /* ExecStart: a(sasb), one command: path, argv, ignore-failure. */
        r = sd_bus_message_open_container(call, 'r', "sv");
        if (r >= 0)
                r = sd_bus_message_append(call, "s", "ExecStart");
        if (r >= 0)
                r = sd_bus_message_open_container(call, 'v', "a(sasb)");
        if (r >= 0)
                r = sd_bus_message_open_container(call, 'a', "(sasb)");
        if (r >= 0)
                r = sd_bus_message_open_container(call, 'r', "sasb");
        if (r >= 0)
                r = sd_bus_message_append(call, "s", exe);
        if (r >= 0)
                r = sd_bus_message_append_strv(call, argv);
        if (r >= 0)
                r = sd_bus_message_append(call, "b", 0);
        for (int i = 0; i < 4 && r >= 0; i++)
                r = sd_bus_message_close_container(call);
        if (r < 0)
                return r;

        if (working_dir) {
                r = sd_bus_message_append(call, "(sv)", "WorkingDirectory", "s", working_dir);
                if (r < 0)
                        return r;
        }
        if (log_file) {
                r = sd_bus_message_append(call, "(sv)", "StandardOutputFileToAppend", "s", log_file);
                if (r >= 0)
                        r = sd_bus_message_append(call, "(sv)", "StandardErrorFileToAppend", "s", log_file);
                if (r < 0)
                        return r;
        }
        if (block_io_uring) {
                /* (bas): false makes it a deny list, then the names. QEMU falls back to epoll (runtime.md §4.3). */
                r = sd_bus_message_append(
                        call, "(sv)", "SystemCallFilter", "(bas)", false, 1, "io_uring_setup");
                if (r >= 0)
                        r = sd_bus_message_append(call, "(sv)", "SystemCallErrorNumber", "i", (int32_t) EPERM);
                if (r < 0)
                        return r;
        }
        return sd_bus_message_close_container(call);
}

int vm_unit_start(
        VmUnit **ret,
        VmUnitManager *m,
        const char *name,
        char **argv,
        const char *log_file,
        const char *working_dir,
        bool block_io_uring,
        VmUnitExitFunc on_exit,
        void *userdata) {

        _cleanup_(sd_bus_message_unrefp) sd_bus_message *call = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_free_ char *exe = NULL, *log_path = NULL, *wd = NULL;
        _cleanup_(vm_unit_freep) VmUnit *u = NULL;
        _cleanup_(job_wait_done) JobWait w = {};
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + VM_UNIT_CALL_USEC;
        UnitState st;
        int r;

        assert_return(ret && m && name && argv && argv[0], -EINVAL);

        r = unit_new(&u, m, name, on_exit, userdata);
        if (r < 0)
                return r;
        r = find_executable(argv[0], &exe);
        if (r < 0)
                return log_debug_errno(r, "'%s' not found on PATH", argv[0]);
        if (log_file) {
                _cleanup_close_ int fd = -EBADF;

                r = make_absolute(log_file, &log_path);
                if (r < 0)
                        return r;
                /* Created here so that its mode is ours, not the manager's. */
                fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600);
                if (fd < 0)
                        return log_debug_errno(errno, "cannot create '%s': %m", log_path);
        }
        if (working_dir) {
                r = make_absolute(working_dir, &wd);
                if (r < 0)
                        return r;
        }

        r = unit_read_state(m, u->name, &st);
        if (r < 0)
                return r;
        if (st.loaded) {
                if (st.main_pid > 0)
                        return log_debug_errno(
                                SYNTHETIC_ERRNO(EBUSY),
                                "unit '%s' is already running (pid %d)",
                                u->name,
                                (int) st.main_pid);
                unit_stop_and_reset(m, u->name, /* wait= */ true);
                r = unit_wait_gone(m, u->name, deadline);
                if (r < 0)
                        return r;
        }

        r = job_wait_begin(m, &w);
        if (r < 0)
                return r;
        r = sd_bus_message_new_method_call(
                m->bus, &call, SD_DESTINATION, SD_PATH, SD_MANAGER, "StartTransientUnit");
        if (r < 0)
                return r;
        r = sd_bus_message_append(call, "ss", u->name, "fail");
        if (r < 0)
                return r;
        r = append_properties(call, m, exe, argv, log_path, wd, block_io_uring);
        if (r < 0)
                return r;
        r = sd_bus_message_append(call, "a(sa(sv))", 0);
        if (r < 0)
                return r;

        r = sd_bus_call(m->bus, call, 0, &error, &reply);
        if (r < 0)
                return log_debug_errno(
                        bus_error_to_errno(&error, r),
                        "StartTransientUnit '%s': %s",
                        u->name,
                        error.message ?: "-");
        r = job_wait_set_path(&w, reply);
        if (r >= 0)
                r = job_wait_run(m, &w, deadline);
        if (r >= 0)
                r = unit_watch(u);
        if (r < 0) {
                log_debug_errno(r, "starting '%s' failed: %m", u->name);
                unit_stop_and_reset(m, u->name, /* wait= */ true);
                return r;
        }

        log_debug("started unit '%s' (pid %d)", u->name, (int) u->pid);
        *ret = TAKE_PTR(u);
        return 0;
}

int vm_unit_attach(
        VmUnit **ret,
        VmUnitManager *m,
        const char *name,
        pid_t expected_pid,
        VmUnitExitFunc on_exit,
        void *userdata) {

        _cleanup_(vm_unit_freep) VmUnit *u = NULL;
        int r;

        assert_return(ret && m && name, -EINVAL);

        r = unit_new(&u, m, name, on_exit, userdata);
        if (r < 0)
                return r;
        r = unit_watch(u);
        if (r < 0)
                return log_debug_errno(r, "cannot attach to unit '%s': %m", u->name);
        if (expected_pid > 0 && u->pid != expected_pid)
                log_debug("unit '%s' has pid %d, recorded was %d", u->name, (int) u->pid, (int) expected_pid);

        *ret = TAKE_PTR(u);
        return 0;
}

static bool pidfd_readable(sd_event_source *s) {
        struct pollfd p = { .fd = sd_event_source_get_io_fd(s), .events = POLLIN };

        return p.fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

int vm_unit_kill(VmUnit *u, int sig, bool whole_unit) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        int r;

        assert_return(u, -EINVAL);
        assert_return(sig > 0 && sig < _NSIG, -EINVAL);

        /* KillUnit with "all" succeeds on an empty unit: ask the pidfd first. */
        if (u->exited || !u->pidfd_source || pidfd_readable(u->pidfd_source))
                return -ESRCH;

        r = sd_bus_call_method(
                u->manager->bus,
                SD_DESTINATION,
                SD_PATH,
                SD_MANAGER,
                "KillUnit",
                &error,
                NULL,
                "ssi",
                u->name,
                whole_unit ? "all" : "main",
                (int32_t) sig);
        if (r < 0)
                return log_debug_errno(
                        bus_error_to_errno(&error, r), "KillUnit '%s': %s", u->name, error.message ?: "-");
        return 0;
}

pid_t vm_unit_pid(VmUnit *u) {
        return u ? u->pid : 0;
}

const char *vm_unit_name(VmUnit *u) {
        return u ? u->name : NULL;
}

VmUnit *vm_unit_free(VmUnit *u) {
        if (!u)
                return NULL;
        sd_event_source_disable_unref(u->pidfd_source);
        sd_event_source_disable_unref(u->exit_source);
        free(u->name);
        free(u);
        return NULL;
}

VmUnit *vm_unit_release(VmUnit *u) {
        if (!u)
                return NULL;
        u->pidfd_source = sd_event_source_disable_unref(u->pidfd_source);
        u->exit_source = sd_event_source_disable_unref(u->exit_source);
        unit_stop_and_reset(u->manager, u->name, /* wait= */ true);
        return vm_unit_free(u);
}
