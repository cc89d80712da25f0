/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The panic watch: from the moment a run's QEMU answers until its guest is ready, the daemon reads
 * what the guest wrote to its serial console (console.log, QEMU's -serial file) once a second. A
 * kernel panic there (under TCG, QEMU 7.2 has been seen to oops a guest kernel early in its boot)
 * fails the install or the boot at once, with the panic line as lastError, where it would otherwise
 * wait out the install timeout (15 min under TCG) or leave the VM running with no READY=1. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "vm-console.h"
#include "vm-internal.h"

#define VM_CONSOLE_WATCH_INTERVAL USEC_PER_SEC
#define VM_CONSOLE_WATCH_CHUNK (64U * 1024U)
#define VM_CONSOLE_WATCH_CHUNKS 16U /* read per look at most: a console is far slower than this */

/* Whether a panic would still change anything: the state machine's rule (vm-state.c), not a copy. */
static bool console_watched(Vm *v) {
        VmStatus s = vm_status(v);

        return v->qemu && !vm_state_next(&s, VM_EVENT_GUEST_PANIC).ignored;
}

/* Reads what came since the last look: 1 with the panic line, 0, or a negative errno. */
static int console_look(Vm *v, char **ret_line) {
        _cleanup_free_ char *path = vm_path(v, "console.log"), *buf = NULL;
        _cleanup_close_ int fd = -EBADF;
        struct stat st;

        if (!path)
                return -ENOMEM;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return errno == ENOENT ? 0 : -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if ((uint64_t) st.st_size < v->console_offset)
                v->console_offset = 0; /* another QEMU's file: QEMU truncates it when it starts */
        if (v->console_offset == (uint64_t) st.st_size)
                return 0; /* nothing new */
        buf = malloc(VM_CONSOLE_WATCH_CHUNK);
        if (!buf)
                return -ENOMEM;
        for (unsigned i = 0; i < VM_CONSOLE_WATCH_CHUNKS && v->console_offset < (uint64_t) st.st_size; i++) {
                ssize_t k = pread(fd, buf, VM_CONSOLE_WATCH_CHUNK, (off_t) v->console_offset);
                size_t done;
                int r;

                if (k < 0)
                        return -errno;
                if (k == 0)
                        break;
                r = vm_console_find_panic(buf, (size_t) k, &done, ret_line);
                if (r != 0)
                        return r;
                v->console_offset += done;
                if ((size_t) k < VM_CONSOLE_WATCH_CHUNK || done == 0)
                        break; /* all of it, or a line still being written */
        }
        return 0;
}

static int on_console_watch(sd_event_source *s, usec_t usec, void *userdata) {
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        _cleanup_free_ char *line = NULL;
        int r;

        if (!console_watched(v)) {
                vm_console_watch_stop(v);
                return 0;
        }
        r = console_look(v, &line);
        if (r > 0) {
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "The guest kernel of VM %s panicked while %s: %s",
                        v->rec.id,
                        vm_state_to_string(v->rec.state),
                        line);
                vm_console_watch_stop(v);
                (void) vm_set_state(v, VM_EVENT_GUEST_PANIC, &(VmEventArgs){ .detail = line }, NULL);
                return 0;
        }
        if (r < 0)
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "Console of VM %s not read: %s",
                        v->rec.id,
                        strerror(-r));
        r = sd_event_source_set_time_relative(s, VM_CONSOLE_WATCH_INTERVAL);
        if (r >= 0)
                r = sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
        if (r < 0)
                vm_console_watch_stop(v);
        return 0;
}

void vm_console_watch_start(Vm *v) {
        int r;

        vm_console_watch_stop(v);
        v->console_offset = 0;
        r = sd_event_add_time_relative(
                manager_event(v->manager),
                &v->console_watch,
                CLOCK_MONOTONIC,
                VM_CONSOLE_WATCH_INTERVAL,
                VM_CONSOLE_WATCH_INTERVAL / 4,
                on_console_watch,
                v);
        if (r < 0)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "No console watch for VM %s, a guest kernel panic will wait out the timeout: %s",
                        v->rec.id,
                        strerror(-r));
}

void vm_console_watch_stop(Vm *v) {
        v->console_watch = sd_event_source_disable_unref(v->console_watch);
}
