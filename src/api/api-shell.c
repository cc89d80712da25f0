/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* vm shell's endpoint (api-shell.h): the checks, the 101, and the hand-over to the helper. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api-session.h"
#include "api-shell.h"
#include "list.h"
#include "log.h"
#include "shell-frame.h"

typedef struct ShellSession ShellSession;

struct ApiShells {
        Manager *manager;
        ShellSession *sessions;
        unsigned n_sessions;    /* those answered 101, and those whose 101 is on its way */
        sd_event_source *watch; /* looks at the sessions' VMs while there are sessions */
};

struct ShellSession {
        ApiShells *owner;
        char *vm_id;
        HttpUpgrade *upgrade; /* set once the 101 went out */
        VmShell *shell;
        bool ending; /* vm_shell_end() was called: its VM stopped */
        ShellSession *prev, *next;
};

ApiShells *api_shells_new(Manager *m) {
        ApiShells *s = calloc(1, sizeof(ApiShells));

        if (s)
                s->manager = m;
        return s;
}

static void session_free(ShellSession *x) {
        ApiShells *s = x->owner;

        LIST_REMOVE(s->sessions, x);
        s->n_sessions--;
        vm_shell_free(x->shell);
        http_upgrade_close(x->upgrade);
        free(x->vm_id);
        free(x);
}

ApiShells *api_shells_free(ApiShells *s) {
        if (!s)
                return NULL;
        while (s->sessions)
                session_free(s->sessions);
        sd_event_source_disable_unref(s->watch);
        free(s);
        return NULL;
}

/* Ends the sessions whose VM stopped or went away: the session would otherwise hang on a TCP
 * connection to a guest that is no more, as nothing in core tells a shell of its VM's end. */
static int on_watch(sd_event_source *source, usec_t usec, void *userdata) {
        ApiShells *s = userdata;

        for (ShellSession *x = s->sessions; x; x = x->next) {
                Vm *v = manager_find_vm(s->manager, x->vm_id);

                if (!x->shell || x->ending || (v && vm_shell_check(v, /* reterr= */ NULL) >= 0))
                        continue;
                log_debug("vm shell in %s: the VM is stopping or gone, ending the session", x->vm_id);
                x->ending = vm_shell_end(x->shell) >= 0;
        }
        if (s->sessions) {
                (void) sd_event_source_set_time_relative(source, API_SHELL_WATCH_USEC);
                (void) sd_event_source_set_enabled(source, SD_EVENT_ONESHOT);
        }
        return 0;
}

static void watch_arm(ApiShells *s) {
        if (s->watch) {
                if (sd_event_source_get_enabled(s->watch, NULL) > 0)
                        return;
                (void) sd_event_source_set_time_relative(s->watch, API_SHELL_WATCH_USEC);
                (void) sd_event_source_set_enabled(s->watch, SD_EVENT_ONESHOT);
                return;
        }
        if (sd_event_add_time_relative(
                    manager_event(s->manager),
                    &s->watch,
                    CLOCK_MONOTONIC,
                    API_SHELL_WATCH_USEC,
                    API_SHELL_WATCH_USEC / 10,
                    on_watch,
                    s) < 0)
                log_debug("vm shell: cannot watch the sessions' VMs, ignoring");
}

static void on_shell_done(VmShell *shell, void *userdata) {
        session_free(userdata);
}

/* The 101 is out: the connection goes to the helper. What goes wrong now can only be told in a frame. */
static void on_upgraded(HttpUpgrade *u, int fd, const void *extra, size_t extra_size, void *userdata) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        ShellSession *x = userdata;
        Vm *v = manager_find_vm(x->owner->manager, x->vm_id);
        int r, cfd;

        if (!u) {
                session_free(x); /* the client left before its 101 */
                return;
        }
        x->upgrade = u;
        if (extra_size > 0)
                /* the client sent frames before it had the 101, which the protocol does not allow */
                r = api_error_set(&e, -EBADMSG, API_ERROR_INVALID_REQUEST, "vm shell: frames before the 101");
        else if (!v)
                r = api_error_set(&e, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", x->vm_id);
        else {
                cfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                r = cfd < 0 ? -errno : vm_shell_start(v, cfd, on_shell_done, x, &x->shell, &e);
                if (r >= 0)
                        watch_arm(x->owner);
        }
        if (r < 0) {
                const char *msg = e.message ?: strerror(-r);
                uint8_t h[SHELL_FRAME_HEADER_SIZE];
                size_t n = MIN(strlen(msg), SHELL_FRAME_PAYLOAD_MAX);

                log_debug("vm shell in %s refused after the 101: %s", x->vm_id, msg);
                /* a fresh connection's buffer has room for it: the write does not block the loop */
                shell_frame_header(h, SHELL_FRAME_ERROR, n);
                if (write(fd, h, sizeof(h)) == (ssize_t) sizeof(h))
                        (void) !write(fd, msg, n);
                session_free(x);
        }
}

void api_shell(ApiShells *s, HttpRequest *req, const char *vm_id) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        const char *upgrade = http_request_header(req, "Upgrade");
        ShellSession *x;
        Vm *v;
        int r;

        if (!upgrade || strcasecmp(upgrade, API_SHELL_PROTOCOL) != 0) {
                (void) http_request_add_header(req, "Upgrade", API_SHELL_PROTOCOL);
                (void) api_error_set(
                        &e,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "vm shell needs \"Upgrade: %s\" and \"Connection: Upgrade\"",
                        API_SHELL_PROTOCOL);
                (void) http_request_reply_error_status(req, 426, &e);
                return;
        }
        v = api_session_vm(req, s->manager, vm_id);
        if (!v)
                return;
        r = vm_shell_check(v, &e);
        if (r < 0) {
                (void) http_request_reply_error(req, &e);
                return;
        }
        if (!api_session_admit(req, s->n_sessions, API_SHELLS_MAX, "shells"))
                return;

        x = calloc(1, sizeof(ShellSession));
        if (x) {
                x->owner = s;
                x->vm_id = strdup(vm_id);
        }
        r = x && x->vm_id ? http_request_reply_upgrade(req, API_SHELL_PROTOCOL, on_upgraded, x) : -ENOMEM;
        if (r < 0) {
                if (x)
                        free(x->vm_id);
                free(x);
                (void) api_error_set(&e, r, API_ERROR_INTERNAL, "vm shell: %s", strerror(-r));
                (void) http_request_reply_error(req, &e);
                return;
        }
        /* counted from now: a 101 on its way is a session, lest a burst of them pass the limit */
        LIST_PREPEND(s->sessions, x);
        s->n_sessions++;
}
