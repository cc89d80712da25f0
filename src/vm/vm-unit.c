/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The systemd launcher. Apart from the connection, made once at start-up, nothing here waits for
 * the service manager: every call is sent with sd_bus_call_async() and answered in a callback on the
 * event loop, and a unit goes through its steps (UnitStep) as the answers come.
 *
 * Jobs. StartTransientUnit and StopUnit answer with the path of the job they queued; the job is done
 * when the manager's JobRemoved signal names that path. One match for JobRemoved serves the whole
 * connection (installed at connection time; on a direct connection the manager sends the signal to
 * every client, on the system bus to subscribers) and hands the signal to the unit whose job it is.
 * The manager sends the reply before the signal, but nothing on the way promises that we dispatch them
 * in that order (a proxy, a busy broker): while a call that creates a job is in flight for a unit,
 * JobRemoved signals naming that unit are kept with the unit, and the reply's job path is looked up
 * among them first, as systemd-machined matches jobs by unit as well as by path.
 *
 * Time. Each step has a deadline timer (a whole start 15 s, a stop job 15 s, reading an exit status
 * 5 s); polls (a unit being collected, an exit status being recorded) are timers; every call also has
 * sd-bus's method call timeout (15 s). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
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
#ifndef __NR_pidfd_send_signal
#        define __NR_pidfd_send_signal 424
#endif

#define SD_DESTINATION "org.freedesktop.systemd1"
#define SD_PATH "/org/freedesktop/systemd1"
#define SD_MANAGER "org.freedesktop.systemd1.Manager"
#define SD_UNIT "org.freedesktop.systemd1.Unit"
#define SD_SERVICE "org.freedesktop.systemd1.Service"
#define DBUS_PROPERTIES "org.freedesktop.DBus.Properties"

#define SD_ERROR_NO_SUCH_UNIT "org.freedesktop.systemd1.NoSuchUnit"
#define SD_ERROR_NO_SUCH_PROCESS "org.freedesktop.systemd1.NoSuchProcess"
#define SD_ERROR_UNIT_EXISTS "org.freedesktop.systemd1.UnitExists"

#define POLKIT_DESTINATION "org.freedesktop.PolicyKit1"
#define POLKIT_PATH "/org/freedesktop/PolicyKit1/Authority"
#define POLKIT_AUTHORITY "org.freedesktop.PolicyKit1.Authority"
#define POLKIT_ACTION_MANAGE_UNITS "org.freedesktop.systemd1.manage-units"

#define VM_UNIT_SLICE "vm-manager.slice"
#define VM_UNIT_CALL_USEC (15 * USEC_PER_SEC)       /* every method call, a whole start, a stop job */
#define VM_UNIT_EXIT_POLL_USEC (50 * USEC_PER_MSEC) /* reading the exit status after the exit */
#define VM_UNIT_EXIT_WAIT_USEC (5 * USEC_PER_SEC)
#define VM_UNIT_GONE_POLL_USEC (20 * USEC_PER_MSEC) /* a stopped and reset unit, until collected */
#define VM_UNIT_EARLY_JOBS 4                        /* JobRemoved kept per unit before its reply */

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
        sd_bus_slot *job_removed; /* the match for every JobRemoved */
        VmUnit *units;            /* every unit: its owner's, or one being released (ours) */
};

/* Where a unit stands. A start goes QUEUED (only while a release of its name is under way) ->
 * CHECKING -> (CLEARING -> COLLECTING, for a leftover of its name without a process) -> STARTING ->
 * WATCHING -> RUNNING -> EXITING -> DONE; an attach starts at WATCHING. A failure anywhere before
 * RUNNING goes to DONE with the error. vm_unit_release() turns any step into RELEASING. */
typedef enum UnitStep {
        UNIT_QUEUED,     /* waits for a release of the same name to end */
        UNIT_CHECKING,   /* reads whether a unit of that name is loaded */
        UNIT_CLEARING,   /* a leftover of that name: StopUnit, its job followed, ResetFailedUnit */
        UNIT_COLLECTING, /* ... read every 20 ms until the manager has collected it */
        UNIT_STARTING,   /* StartTransientUnit sent, its job followed */
        UNIT_WATCHING,   /* MainPID read, its pidfd opened, MainPID read again */
        UNIT_RUNNING,    /* the main process watched through its pidfd */
        UNIT_EXITING,    /* it ended: ExecMainCode/ExecMainStatus read until recorded */
        UNIT_DONE,       /* on_exit called */
        UNIT_RELEASING,  /* let go by its owner: StopUnit, its job followed, ResetFailedUnit, freed */
} UnitStep;

/* What the manager says about one unit. */
typedef struct UnitState {
        bool loaded;
        pid_t main_pid;      /* the live main process, 0 once it ended */
        pid_t exec_main_pid; /* the last main process, kept after the exit */
        int exec_main_code;  /* si_code, 0 while running or never started */
        int exec_main_status;
} UnitState;

/* A unit's state read is three calls (GetUnit, LoadState, the Service properties); then this. */
typedef void (*UnitStateFunc)(VmUnit *u, int r, const UnitState *st);

/* A JobRemoved that came before the reply naming its job. */
typedef struct EarlyJob {
        char *path;
        char *result;
} EarlyJob;

struct VmUnit {
        VmUnitManager *manager; /* borrowed */
        VmUnit *prev, *next;    /* in manager->units */
        char *name;
        UnitStep step;
        bool attach;   /* attached to, not started */
        bool owned;    /* we started it (StartTransientUnit sent) or attached to it: a release stops it */
        bool released; /* its owner let go: the manager frees it once stopped */
        int error;     /* why the start or the attach failed */
        pid_t pid;
        int pidfd;                  /* WATCHING: opened, not yet confirmed */
        sd_bus_message *start_call; /* StartTransientUnit, built at vm_unit_start(), sent at STARTING */
        sd_bus_slot *call;          /* the call of the current step */
        bool job_call;              /* ... it creates a job: JobRemoved signals for this unit are kept */
        char *job;                  /* the job the current step follows */
        EarlyJob early[VM_UNIT_EARLY_JOBS];
        unsigned n_early;
        UnitStateFunc read_done; /* a state read under way */
        char *read_path;
        UnitState read_state;
        sd_event_source *deadline;     /* the current step's time limit */
        sd_event_source *poll;         /* the next state read (COLLECTING, EXITING) */
        sd_event_source *pidfd_source; /* owns the pidfd (RUNNING) */
        VmUnitStartedFunc on_started;
        VmUnitExitFunc on_exit;
        void *userdata;
};

static int pidfd_open(pid_t pid) {
        return (int) syscall(__NR_pidfd_open, pid, 0);
}

static int pidfd_send_signal(int fd, int sig) {
        return (int) syscall(__NR_pidfd_send_signal, fd, sig, NULL, 0);
}

static int bus_error_to_errno(const sd_bus_error *error, int r) {
        /* a unit object that went away between two calls answers UnknownObject */
        if (sd_bus_error_has_names(
                    error,
                    SD_ERROR_NO_SUCH_UNIT,
                    SD_ERROR_NO_SUCH_PROCESS,
                    "org.freedesktop.DBus.Error.UnknownObject"))
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

static int on_job_removed(sd_bus_message *msg, void *userdata, sd_bus_error *reterr);

/* The one synchronous part: run once at start-up, before the event loop runs and before the listener
 * accepts anything. Whether units can be used decides how the records are loaded (reattached, or
 * marked stopped), so the answer is needed before the loop; a manager that does not answer within
 * the call timeout (15 s) makes the daemon run VMs as plain children, or fail with --launcher
 * systemd. */
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

        /* Every job of ours ends with JobRemoved: one match for all of them. A direct connection has
         * no sender names, so match without one there (as systemd's bus-wait-for-jobs); on the bus
         * only the manager's signals count (AddMatch, synchronous like the rest of this function). */
        r = sd_bus_match_signal(
                m->bus,
                &m->job_removed,
                m->on_bus ? SD_DESTINATION : NULL,
                SD_PATH,
                SD_MANAGER,
                "JobRemoved",
                on_job_removed,
                m);
        if (r < 0)
                return log_debug_errno(r, "cannot watch the manager's jobs: %m");
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

static void unit_destroy(VmUnit *u);
static int manager_send(
        VmUnitManager *m,
        sd_bus_slot **ret_slot,
        const char *path,
        const char *interface,
        const char *member,
        sd_bus_message_handler_t callback,
        void *userdata,
        const char *types,
        ...);

VmUnitManager *vm_unit_manager_free(VmUnitManager *m) {
        if (!m)
                return NULL;
        /* What is left are releases (owners free theirs first). Their StopUnit is on its way; after
         * the loop nobody follows the stop job, so the reset is asked for at once. */
        while (m->units) {
                VmUnit *u = m->units;

                assert(u->released);
                if (u->owned)
                        (void) manager_send(
                                m, NULL, SD_PATH, SD_MANAGER, "ResetFailedUnit", NULL, NULL, "s", u->name);
                unit_destroy(u);
        }
        m->job_removed = sd_bus_slot_unref(m->job_removed);
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

/* ---- Calls ---- */

/* An asynchronous method call to the manager (path and interface as given): callback gets the
 * reply, or sd-bus's error reply after the call timeout. ret_slot NULL: a floating call, for which
 * callback NULL means no reply is wanted. */
static int manager_send(
        VmUnitManager *m,
        sd_bus_slot **ret_slot,
        const char *path,
        const char *interface,
        const char *member,
        sd_bus_message_handler_t callback,
        void *userdata,
        const char *types,
        ...) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *call = NULL;
        va_list ap;
        int r;

        r = sd_bus_message_new_method_call(m->bus, &call, SD_DESTINATION, path, interface, member);
        if (r < 0)
                return r;
        va_start(ap, types);
        r = sd_bus_message_appendv(call, types, ap);
        va_end(ap);
        if (r < 0)
                return r;
        if (!callback && !ret_slot) {
                r = sd_bus_message_set_expect_reply(call, false);
                if (r < 0)
                        return r;
                return sd_bus_send(m->bus, call, NULL);
        }
        return sd_bus_call_async(m->bus, ret_slot, call, callback, userdata, 0);
}

/* 0 for a method return; for an error reply its negative errno (NoSuchUnit: -ESRCH), logged at debug
 * unless it is that. */
static int reply_error(sd_bus_message *reply, const char *what, const char *name) {
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        int r;

        if (!e)
                return 0;
        r = bus_error_to_errno(e, -(sd_bus_message_get_errno(reply) ?: EIO));
        if (r != -ESRCH)
                log_debug_errno(r, "%s '%s': %s", what, name, e->message ?: e->name);
        return r;
}

/* A call nobody waits for (KillUnit, a reset after the loop): its failure is only logged. */
static int on_floating_reply(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        (void) reply_error(reply, userdata, "-");
        return 0;
}

/* ---- Steps, timers ---- */

static void unit_unlink(VmUnit *u) {
        VmUnitManager *m = u->manager;

        if (u->prev)
                u->prev->next = u->next;
        else if (m->units == u)
                m->units = u->next;
        if (u->next)
                u->next->prev = u->prev;
        u->prev = u->next = NULL;
}

static void unit_early_clear(VmUnit *u) {
        for (unsigned i = 0; i < u->n_early; i++) {
                free(u->early[i].path);
                free(u->early[i].result);
        }
        u->n_early = 0;
}

/* Whatever the current step waits for: its call, its job, its timers, a state read. */
static void unit_cancel(VmUnit *u) {
        u->call = sd_bus_slot_unref(u->call);
        u->job_call = false;
        u->job = mfree(u->job);
        unit_early_clear(u);
        u->read_done = NULL;
        u->read_path = mfree(u->read_path);
        u->deadline = sd_event_source_disable_unref(u->deadline);
        u->poll = sd_event_source_disable_unref(u->poll);
        u->pidfd = safe_close(u->pidfd);
}

static void unit_destroy(VmUnit *u) {
        if (!u)
                return;
        unit_cancel(u);
        unit_unlink(u);
        u->pidfd_source = sd_event_source_disable_unref(u->pidfd_source);
        u->start_call = sd_bus_message_unref(u->start_call);
        free(u->name);
        free(u);
}

static int on_deadline(sd_event_source *s, uint64_t usec, void *userdata);

/* The current step's time limit, from now. */
static int unit_arm_deadline(VmUnit *u, usec_t usec) {
        u->deadline = sd_event_source_disable_unref(u->deadline);
        return sd_event_add_time_relative(
                u->manager->event, &u->deadline, CLOCK_MONOTONIC, usec, USEC_PER_MSEC, on_deadline, u);
}

static int on_poll(sd_event_source *s, uint64_t usec, void *userdata);

static int unit_arm_poll(VmUnit *u, usec_t usec) {
        int r;

        if (u->poll) {
                r = sd_event_source_set_time_relative(u->poll, usec);
                if (r >= 0)
                        r = sd_event_source_set_enabled(u->poll, SD_EVENT_ONESHOT);
                return r;
        }
        return sd_event_add_time_relative(
                u->manager->event, &u->poll, CLOCK_MONOTONIC, usec, USEC_PER_MSEC, on_poll, u);
}

/* The end of a unit's life as its owner sees it: on_exit, once. The callback may free u: the caller
 * returns at once. */
static void unit_report(VmUnit *u, int code, int status) {
        VmUnitExitFunc f = u->on_exit;

        unit_cancel(u);
        u->pidfd_source = sd_event_source_disable_unref(u->pidfd_source);
        u->step = UNIT_DONE;
        u->on_started = NULL;
        u->on_exit = NULL;
        if (f)
                f(u, code, status, u->userdata);
}

/* A start or an attach that did not get to the process. */
static void unit_fail(VmUnit *u, int r) {
        log_debug_errno(r, "%s unit '%s' failed: %m", u->attach ? "attaching to" : "starting", u->name);
        u->error = r;
        unit_report(u, 0, 0);
}

/* ---- State reads: GetUnit, then LoadState, then the Service properties ---- */

static void unit_read_finish(VmUnit *u, int r) {
        UnitStateFunc done = u->read_done;

        u->read_done = NULL;
        u->read_path = mfree(u->read_path);
        done(u, r, &u->read_state);
}

static int read_service_properties(sd_bus_message *reply, UnitState *st) {
        int r;

        r = sd_bus_message_enter_container(reply, 'a', "{sv}");
        if (r < 0)
                return r;
        for (;;) {
                const char *name;
                uint32_t pid;
                int32_t i;

                r = sd_bus_message_enter_container(reply, 'e', "sv");
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                r = sd_bus_message_read(reply, "s", &name);
                if (r < 0)
                        return r;
                if (streq(name, "MainPID") || streq(name, "ExecMainPID")) {
                        r = sd_bus_message_read(reply, "v", "u", &pid);
                        if (r < 0)
                                return r;
                        *(streq(name, "MainPID") ? &st->main_pid : &st->exec_main_pid) = (pid_t) pid;
                } else if (streq(name, "ExecMainCode") || streq(name, "ExecMainStatus")) {
                        r = sd_bus_message_read(reply, "v", "i", &i);
                        if (r < 0)
                                return r;
                        *(streq(name, "ExecMainCode") ? &st->exec_main_code : &st->exec_main_status) = i;
                } else {
                        r = sd_bus_message_skip(reply, "v");
                        if (r < 0)
                                return r;
                }
                r = sd_bus_message_exit_container(reply);
                if (r < 0)
                        return r;
        }
        return sd_bus_message_exit_container(reply);
}

static int on_read_service(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        VmUnit *u = userdata;
        int r;

        u->call = sd_bus_slot_unref(u->call);
        r = reply_error(reply, "reading", u->name);
        if (r == -ESRCH) /* collected between the calls */
                u->read_state = (UnitState){ .loaded = false };
        else if (r >= 0) {
                r = read_service_properties(reply, &u->read_state);
                if (r < 0)
                        log_debug_errno(r, "unit '%s': bad answer: %m", u->name);
        }
        unit_read_finish(u, r == -ESRCH ? 0 : r);
        return 0;
}

static int on_read_load_state(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        VmUnit *u = userdata;
        const char *load_state;
        int r;

        u->call = sd_bus_slot_unref(u->call);
        r = reply_error(reply, "LoadState of", u->name);
        if (r == -ESRCH) {
                u->read_state = (UnitState){ .loaded = false };
                unit_read_finish(u, 0);
                return 0;
        }
        if (r >= 0)
                r = sd_bus_message_read(reply, "v", "s", &load_state);
        if (r >= 0) {
                u->read_state.loaded = !streq(load_state, "") && !streq(load_state, "not-found");
                if (!u->read_state.loaded) {
                        unit_read_finish(u, 0);
                        return 0;
                }
                r = manager_send(
                        u->manager,
                        &u->call,
                        u->read_path,
                        DBUS_PROPERTIES,
                        "GetAll",
                        on_read_service,
                        u,
                        "s",
                        SD_SERVICE);
        }
        if (r < 0)
                unit_read_finish(u, r);
        return 0;
}

static int on_get_unit(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        VmUnit *u = userdata;
        const char *path;
        int r;

        u->call = sd_bus_slot_unref(u->call);
        r = reply_error(reply, "GetUnit", u->name);
        if (r == -ESRCH) {
                unit_read_finish(u, 0); /* not loaded */
                return 0;
        }
        if (r >= 0)
                r = sd_bus_message_read(reply, "o", &path);
        if (r >= 0) {
                u->read_path = strdup(path);
                if (!u->read_path)
                        r = -ENOMEM;
        }
        if (r >= 0)
                r = manager_send(
                        u->manager,
                        &u->call,
                        u->read_path,
                        DBUS_PROPERTIES,
                        "Get",
                        on_read_load_state,
                        u,
                        "ss",
                        SD_UNIT,
                        "LoadState");
        if (r < 0)
                unit_read_finish(u, r);
        return 0;
}

/* Reads what the manager says about the unit; done gets it (r < 0: the read failed). Only the sending
 * can fail here. */
static int unit_read_state(VmUnit *u, UnitStateFunc done) {
        u->read_done = done;
        u->read_path = mfree(u->read_path);
        u->read_state = (UnitState){};
        return manager_send(u->manager, &u->call, SD_PATH, SD_MANAGER, "GetUnit", on_get_unit, u, "s", u->name);
}

/* ---- Jobs ---- */

static int job_result_to_errno(const char *result) {
        return streq(result, "done")      ? 0 :
                streq(result, "timeout")  ? -ETIMEDOUT :
                streq(result, "canceled") ? -ECANCELED :
                                            -EIO;
}

static void unit_job_done(VmUnit *u, const char *result);

static int on_job_removed(sd_bus_message *msg, void *userdata, sd_bus_error *reterr) {
        VmUnitManager *m = userdata;
        const char *path, *unit, *result;
        uint32_t id;

        if (sd_bus_message_read(msg, "uoss", &id, &path, &unit, &result) < 0)
                return 0;

        for (VmUnit *u = m->units; u; u = u->next)
                if (u->job && streq(u->job, path)) {
                        unit_job_done(u, result); /* may free u: the list is not looked at again */
                        return 0;
                }

        /* Before the reply naming its job: kept with the unit whose call is in flight. */
        for (VmUnit *u = m->units; u; u = u->next) {
                EarlyJob *j;

                if (!u->job_call || !streq(u->name, unit))
                        continue;
                if (u->n_early == VM_UNIT_EARLY_JOBS) {
                        free(u->early[0].path);
                        free(u->early[0].result);
                        memmove(u->early, u->early + 1, (VM_UNIT_EARLY_JOBS - 1) * sizeof(EarlyJob));
                        u->n_early--;
                }
                j = u->early + u->n_early;
                j->path = strdup(path);
                j->result = strdup(result);
                if (!j->path || !j->result) {
                        free(j->path);
                        free(j->result);
                        continue;
                }
                u->n_early++;
        }
        return 0;
}

/* The reply of a call that queued a job: the job followed until JobRemoved names it, or finished at
 * once when that came first. */
static void unit_job_begin(VmUnit *u, sd_bus_message *reply) {
        const char *path;
        int r;

        u->job_call = false;
        r = sd_bus_message_read(reply, "o", &path);
        if (r < 0) {
                log_debug_errno(r, "unit '%s': bad job path: %m", u->name);
                unit_job_done(u, "failed");
                return;
        }
        for (unsigned i = 0; i < u->n_early; i++)
                if (streq(u->early[i].path, path)) {
                        _cleanup_free_ char *result = TAKE_PTR(u->early[i].result);

                        log_debug("job %s of '%s' had finished before the reply naming it", path, u->name);
                        unit_early_clear(u);
                        unit_job_done(u, result);
                        return;
                }
        unit_early_clear(u);
        u->job = strdup(path);
        if (!u->job)
                unit_job_done(u, "failed");
}

static void unit_watch_begin(VmUnit *u);
static void unit_clear_reset(VmUnit *u);
static void unit_release_reset(VmUnit *u);

/* The job the unit followed ended: the step goes on. */
static void unit_job_done(VmUnit *u, const char *result) {
        int r = job_result_to_errno(result);

        u->job = mfree(u->job);
        if (r < 0)
                log_debug("job of '%s' finished with '%s'", u->name, result);
        switch (u->step) {
        case UNIT_STARTING:
                if (r < 0)
                        unit_fail(u, r);
                else
                        unit_watch_begin(u);
                break;
        case UNIT_CLEARING:
                unit_clear_reset(u);
                break;
        case UNIT_RELEASING:
                unit_release_reset(u);
                break;
        default:
                break;
        }
}

/* ---- Starting ---- */

static void unit_start_send(VmUnit *u);

static void on_collect_state(VmUnit *u, int r, const UnitState *st) {
        if (r >= 0 && !st->loaded) {
                unit_start_send(u);
                return;
        }
        if (r < 0)
                log_debug_errno(r, "unit '%s': still loaded? %m", u->name);
        /* the deadline ends this */
        r = unit_arm_poll(u, VM_UNIT_GONE_POLL_USEC);
        if (r < 0)
                unit_fail(u, r);
}

static int on_clear_reset_reply(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        VmUnit *u = userdata;
        int r;

        u->call = sd_bus_slot_unref(u->call);
        (void) reply_error(reply, "ResetFailedUnit", u->name);
        /* A stopped and reset unit is collected in the manager's next loop iteration; a transient
         * unit of the same name can only be created after that. */
        u->step = UNIT_COLLECTING;
        r = unit_read_state(u, on_collect_state);
        if (r < 0)
                unit_fail(u, r);
        return 0;
}

static void unit_clear_reset(VmUnit *u) {
        int r;

        r = manager_send(
                u->manager, &u->call, SD_PATH, SD_MANAGER, "ResetFailedUnit", on_clear_reset_reply, u, "s", u->name);
        if (r < 0)
                unit_fail(u, r);
}

static int on_clear_stop_reply(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        VmUnit *u = userdata;

        u->call = sd_bus_slot_unref(u->call);
        u->job_call = false;
        if (reply_error(reply, "StopUnit", u->name) < 0) {
                unit_early_clear(u);
                unit_clear_reset(u); /* gone meanwhile, or it failed: the reset and the read tell */
        } else
                unit_job_begin(u, reply);
        return 0;
}

static void on_check_state(VmUnit *u, int r, const UnitState *st) {
        if (r < 0) {
                unit_fail(u, r);
                return;
        }
        if (!st->loaded) {
                unit_start_send(u);
                return;
        }
        if (st->main_pid > 0) {
                log_debug("unit '%s' is already running (pid %d)", u->name, (int) st->main_pid);
                unit_fail(u, -EBUSY);
                return;
        }

        /* left loaded without a process (RemainAfterExit after a detach): stopped and reset first */
        u->step = UNIT_CLEARING;
        r = manager_send(
                u->manager, &u->call, SD_PATH, SD_MANAGER, "StopUnit", on_clear_stop_reply, u, "ss", u->name, "replace");
        if (r < 0) {
                unit_fail(u, r);
                return;
        }
        u->job_call = true;
}

static int unit_check_begin(VmUnit *u) {
        u->step = UNIT_CHECKING;
        return unit_read_state(u, on_check_state);
}

static int on_start_reply(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        VmUnit *u = userdata;
        int r;

        u->call = sd_bus_slot_unref(u->call);
        u->job_call = false;
        r = reply_error(reply, "StartTransientUnit", u->name);
        if (r < 0) {
                if (r == -EBUSY)
                        u->owned = false; /* UnitExists: someone else's */
                unit_fail(u, r);
                return 0;
        }
        unit_job_begin(u, reply);
        return 0;
}

static void unit_start_send(VmUnit *u) {
        int r;

        u->step = UNIT_STARTING;
        r = sd_bus_call_async(u->manager->bus, &u->call, u->start_call, on_start_reply, u, 0);
        if (r < 0) {
                unit_fail(u, r);
                return;
        }
        u->start_call = sd_bus_message_unref(u->start_call);
        u->owned = true;
        u->job_call = true;
}

/* ---- Watching, the exit ---- */

static void unit_exit_begin(VmUnit *u);

static int on_pidfd(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        unit_exit_begin(userdata);
        return 0;
}

/* The process ended; its status is recorded when the manager reaps it: until MainPID is 0 and
 * ExecMainCode is set, read every 50 ms for up to 5 s. */
static void on_exit_state(VmUnit *u, int r, const UnitState *st) {
        if (r >= 0 && !st->loaded) {
                log_debug("unit '%s' is gone, exit status unknown", u->name);
                unit_report(u, 0, 0);
                return;
        }
        if (r >= 0 && st->main_pid == 0 && st->exec_main_code != 0) {
                unit_report(u, st->exec_main_code, st->exec_main_status);
                return;
        }
        if (r < 0)
                log_debug_errno(r, "unit '%s': exit status not read: %m", u->name);
        r = unit_arm_poll(u, VM_UNIT_EXIT_POLL_USEC);
        if (r < 0) {
                log_debug_errno(r, "unit '%s': cannot poll the exit status: %m", u->name);
                unit_report(u, 0, 0);
        }
}

static void unit_exit_begin(VmUnit *u) {
        int r;

        unit_cancel(u);
        u->pidfd_source = sd_event_source_disable_unref(u->pidfd_source);
        u->step = UNIT_EXITING;
        r = unit_arm_deadline(u, VM_UNIT_EXIT_WAIT_USEC);
        if (r >= 0)
                r = unit_read_state(u, on_exit_state);
        if (r < 0) {
                log_debug_errno(r, "unit '%s': cannot read the exit status: %m", u->name);
                unit_report(u, 0, 0);
        }
}

static void unit_run(VmUnit *u) {
        VmUnitStartedFunc f = u->on_started;
        int r;

        r = sd_event_add_io(u->manager->event, &u->pidfd_source, u->pidfd, EPOLLIN, on_pidfd, u);
        if (r >= 0)
                r = sd_event_source_set_io_fd_own(u->pidfd_source, true);
        if (r < 0) {
                u->pidfd_source = sd_event_source_disable_unref(u->pidfd_source);
                unit_fail(u, r);
                return;
        }
        u->pidfd = -EBADF;
        unit_cancel(u);
        u->step = UNIT_RUNNING;
        u->on_started = NULL;
        log_debug("unit '%s' runs (pid %d)", u->name, (int) u->pid);
        if (f)
                f(u, u->userdata);
}

static void on_watch_state(VmUnit *u, int r, const UnitState *st) {
        if (r < 0) {
                unit_fail(u, r);
                return;
        }
        if (!st->loaded) {
                unit_fail(u, -ESRCH);
                return;
        }

        if (u->pidfd >= 0) {
                /* The pid could have been reused between the first read and pidfd_open(): the manager
                 * clears MainPID only after reaping, so an unchanged MainPID means the pidfd is its
                 * process. */
                if (st->main_pid == u->pid) {
                        unit_run(u);
                        return;
                }
                u->pidfd = safe_close(u->pidfd);
        } else if (st->main_pid > 0) {
                if (u->attach && u->pid > 0 && u->pid != st->main_pid)
                        log_debug(
                                "unit '%s' has pid %d, recorded was %d",
                                u->name,
                                (int) st->main_pid,
                                (int) u->pid);
                u->pid = st->main_pid;
                u->pidfd = pidfd_open(st->main_pid);
                if (u->pidfd < 0 && errno != ESRCH) {
                        unit_fail(u, log_debug_errno(errno, "pidfd_open(%d): %m", (int) st->main_pid));
                        return;
                }
                if (u->pidfd >= 0) {
                        r = unit_read_state(u, on_watch_state);
                        if (r < 0)
                                unit_fail(u, r);
                        return;
                }
        }

        /* the process has ended already */
        u->pid = st->main_pid > 0 ? st->main_pid : st->exec_main_pid;
        if (st->main_pid == 0 && st->exec_main_code != 0) {
                unit_report(u, st->exec_main_code, st->exec_main_status);
                return;
        }
        unit_exit_begin(u);
}

static void unit_watch_begin(VmUnit *u) {
        int r;

        u->step = UNIT_WATCHING;
        r = unit_read_state(u, on_watch_state);
        if (r < 0)
                unit_fail(u, r);
}

/* ---- Releasing ---- */

static void manager_wake(VmUnitManager *m, const char *name);

static void unit_release_end(VmUnit *u) {
        VmUnitManager *m = u->manager;

        log_debug("unit '%s' released", u->name);
        unit_unlink(u);
        manager_wake(m, u->name);
        unit_destroy(u);
}

static int on_release_reset_reply(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        VmUnit *u = userdata;

        u->call = sd_bus_slot_unref(u->call);
        (void) reply_error(reply, "ResetFailedUnit", u->name);
        unit_release_end(u);
        return 0;
}

static void unit_release_reset(VmUnit *u) {
        int r;

        unit_cancel(u);
        r = manager_send(
                u->manager, &u->call, SD_PATH, SD_MANAGER, "ResetFailedUnit", on_release_reset_reply, u, "s", u->name);
        if (r < 0) {
                log_debug_errno(r, "ResetFailedUnit '%s': %m, ignoring", u->name);
                unit_release_end(u);
        }
}

static int on_release_stop_reply(sd_bus_message *reply, void *userdata, sd_bus_error *reterr) {
        VmUnit *u = userdata;
        int r;

        u->call = sd_bus_slot_unref(u->call);
        u->job_call = false;
        r = reply_error(reply, "StopUnit", u->name);
        if (r == -ESRCH)
                unit_release_end(u); /* not loaded: nothing to reset */
        else if (r < 0)
                unit_release_reset(u);
        else
                unit_job_begin(u, reply);
        return 0;
}

static void unit_release_begin(VmUnit *u) {
        int r;

        unit_cancel(u);
        u->pidfd_source = sd_event_source_disable_unref(u->pidfd_source);
        u->start_call = sd_bus_message_unref(u->start_call);
        u->on_started = NULL;
        u->on_exit = NULL;
        u->released = true;
        u->step = UNIT_RELEASING;
        r = unit_arm_deadline(u, VM_UNIT_CALL_USEC);
        if (r >= 0)
                r = manager_send(
                        u->manager,
                        &u->call,
                        SD_PATH,
                        SD_MANAGER,
                        "StopUnit",
                        on_release_stop_reply,
                        u,
                        "ss",
                        u->name,
                        "replace");
        if (r < 0) {
                log_debug_errno(r, "StopUnit '%s': %m", u->name);
                unit_release_reset(u);
                return;
        }
        u->job_call = true;
}

/* A release of name ended: the starts that waited for it go on, unless another release of that name
 * is still under way. Each start may fail at once (its owner's callback may free other units), so
 * the list is looked at afresh for each. */
static void manager_wake(VmUnitManager *m, const char *name) {
        for (;;) {
                VmUnit *queued = NULL;
                int r;

                for (VmUnit *u = m->units; u; u = u->next) {
                        if (!streq(u->name, name))
                                continue;
                        if (u->step == UNIT_RELEASING)
                                return;
                        if (u->step == UNIT_QUEUED && !queued)
                                queued = u;
                }
                if (!queued)
                        return;
                r = unit_check_begin(queued);
                if (r < 0)
                        unit_fail(queued, r);
        }
}

/* ---- Time, and a unit's beginning ---- */

static int on_deadline(sd_event_source *s, uint64_t usec, void *userdata) {
        VmUnit *u = userdata;

        switch (u->step) {
        case UNIT_QUEUED:
        case UNIT_CHECKING:
        case UNIT_CLEARING:
        case UNIT_COLLECTING:
        case UNIT_STARTING:
        case UNIT_WATCHING:
                unit_fail(u, -ETIMEDOUT);
                break;
        case UNIT_EXITING:
                log_debug("unit '%s': exit status not recorded in time, unknown", u->name);
                unit_report(u, 0, 0);
                break;
        case UNIT_RELEASING:
                log_debug("unit '%s': the stop job did not finish in time", u->name);
                unit_release_reset(u);
                break;
        default:
                break;
        }
        return 0;
}

static int on_poll(sd_event_source *s, uint64_t usec, void *userdata) {
        VmUnit *u = userdata;
        int r;

        if (u->call)
                return 0; /* a read is under way */
        r = unit_read_state(u, u->step == UNIT_COLLECTING ? on_collect_state : on_exit_state);
        if (r < 0) {
                if (u->step == UNIT_EXITING)
                        unit_report(u, 0, 0);
                else
                        unit_fail(u, r);
        }
        return 0;
}

static int unit_new(
        VmUnit **ret,
        VmUnitManager *m,
        const char *name,
        VmUnitStartedFunc on_started,
        VmUnitExitFunc on_exit,
        void *userdata) {
        size_t n = strlen(name);
        VmUnit *u;

        assert_return(n > 0 && !strchr(name, '/'), -EINVAL);

        u = calloc(1, sizeof(VmUnit));
        if (!u)
                return -ENOMEM;
        u->manager = m;
        u->pidfd = -EBADF;
        u->on_started = on_started;
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
        /* linked at once: unit_destroy() unlinks */
        u->next = m->units;
        if (m->units)
                m->units->prev = u;
        m->units = u;
        *ret = u;
        return 0;
}

static bool manager_releasing(VmUnitManager *m, const char *name) {
        for (VmUnit *u = m->units; u; u = u->next)
                if (u->step == UNIT_RELEASING && streq(u->name, name))
                        return true;
        return false;
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
        VmUnitStartedFunc on_started,
        VmUnitExitFunc on_exit,
        void *userdata) {

        _cleanup_free_ char *exe = NULL, *log_path = NULL, *wd = NULL;
        _cleanup_(vm_unit_freep) VmUnit *u = NULL;
        int r;

        assert_return(ret && m && name && argv && argv[0], -EINVAL);

        r = unit_new(&u, m, name, on_started, on_exit, userdata);
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

        /* The call is built now, while argv is there, and sent once the name is free. */
        r = sd_bus_message_new_method_call(
                m->bus, &u->start_call, SD_DESTINATION, SD_PATH, SD_MANAGER, "StartTransientUnit");
        if (r < 0)
                return r;
        r = sd_bus_message_append(u->start_call, "ss", u->name, "fail");
        if (r < 0)
                return r;
        r = append_properties(u->start_call, m, exe, argv, log_path, wd, block_io_uring);
        if (r < 0)
                return r;
        r = sd_bus_message_append(u->start_call, "a(sa(sv))", 0);
        if (r < 0)
                return r;

        r = unit_arm_deadline(u, VM_UNIT_CALL_USEC);
        if (r < 0)
                return r;
        if (manager_releasing(m, u->name)) {
                log_debug("unit '%s': waiting for its release to end", u->name);
                u->step = UNIT_QUEUED;
        } else {
                r = unit_check_begin(u);
                if (r < 0)
                        return r;
        }

        *ret = TAKE_PTR(u);
        return 0;
}

int vm_unit_attach(
        VmUnit **ret,
        VmUnitManager *m,
        const char *name,
        pid_t expected_pid,
        VmUnitStartedFunc on_started,
        VmUnitExitFunc on_exit,
        void *userdata) {

        _cleanup_(vm_unit_freep) VmUnit *u = NULL;
        int r;

        assert_return(ret && m && name, -EINVAL);

        r = unit_new(&u, m, name, on_started, on_exit, userdata);
        if (r < 0)
                return r;
        u->attach = u->owned = true;
        u->pid = expected_pid > 0 ? expected_pid : 0;
        u->step = UNIT_WATCHING;
        r = unit_arm_deadline(u, VM_UNIT_CALL_USEC);
        if (r >= 0)
                r = unit_read_state(u, on_watch_state);
        if (r < 0)
                return log_debug_errno(r, "cannot attach to unit '%s': %m", u->name);

        *ret = TAKE_PTR(u);
        return 0;
}

int vm_unit_kill(VmUnit *u, int sig, bool whole_unit) {
        int r;

        assert_return(u, -EINVAL);
        assert_return(sig > 0 && sig < _NSIG, -EINVAL);

        if (u->released || IN_SET(u->step, UNIT_EXITING, UNIT_DONE))
                return -ESRCH;
        if (u->step == UNIT_RUNNING && !whole_unit)
                return RET_NERRNO(pidfd_send_signal(sd_event_source_get_io_fd(u->pidfd_source), sig));
        if (!u->owned)
                return -ESRCH; /* nothing started yet */

        /* KillUnit "all" succeeds on an empty unit: the pidfd said above whether the process is
         * there. Before it is watched the manager finds it (or says there is none). */
        r = manager_send(
                u->manager,
                /* ret_slot= */ NULL,
                SD_PATH,
                SD_MANAGER,
                "KillUnit",
                on_floating_reply,
                (void *) "KillUnit",
                "ssi",
                u->name,
                whole_unit ? "all" : "main",
                (int32_t) sig);
        if (r < 0)
                return log_debug_errno(r, "KillUnit '%s': %m", u->name);
        return 0;
}

pid_t vm_unit_pid(VmUnit *u) {
        return u ? u->pid : 0;
}

const char *vm_unit_name(VmUnit *u) {
        return u ? u->name : NULL;
}

int vm_unit_error(VmUnit *u) {
        return u ? u->error : 0;
}

VmUnit *vm_unit_free(VmUnit *u) {
        if (!u)
                return NULL;
        assert(!u->released);
        unit_destroy(u);
        return NULL;
}

VmUnit *vm_unit_release(VmUnit *u) {
        if (!u)
                return NULL;
        assert(!u->released);
        if (!u->owned) {
                /* StartTransientUnit not sent: nothing of ours to stop */
                unit_destroy(u);
                return NULL;
        }
        unit_release_begin(u);
        return NULL;
}

int vm_unit_stop(VmUnitManager *m, const char *name) {
        VmUnit *u;
        int r;

        assert_return(m && name, -EINVAL);

        r = unit_new(&u, m, name, /* on_started= */ NULL, /* on_exit= */ NULL, /* userdata= */ NULL);
        if (r < 0)
                return r;
        u->owned = true;
        unit_release_begin(u);
        return 0;
}
