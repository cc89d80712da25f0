/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "fs-util.h"
#include "hex-util.h"
#include "json-util.h"
#include "log.h"
#include "operation.h"
#include "string-table.h"
#include "task.h"
#include "vm.h"

#define TASK_RECORD_VERSION 1
/* A record holds the operation's result: a VM record with its metadata at the limit is about 400 KB. */
#define TASK_RECORD_MAX ((size_t) 4 * 1024 * 1024)

struct Task {
        unsigned n_ref;
        TaskRegistry *reg; /* NULL once forgotten, or once the registry is gone */
        char id[33];
        const Operation *op;
        char *vm_id;   /* create_vm: known once the VM exists */
        char *vm_name; /* create_vm's */
        VmWaitFor wait_for;
        TaskStatus status;
        usec_t created_at, updated_at; /* CLOCK_REALTIME */
        json_t *result;
        ApiError error;
        bool live;       /* its operation runs in this daemon, which hears how it ends */
        bool registered; /* recorded: in reg's list and on disk */
};

struct TaskRegistry {
        Manager *manager;
        char *dir;
        Task **tasks; /* oldest first */
        size_t n;
        TaskEndedFunc on_end;
        void *on_end_userdata;
};

static const char *const task_status_table[_TASK_STATUS_MAX] = {
        [TASK_WORKING] = "working",
        [TASK_COMPLETED] = "completed",
        [TASK_FAILED] = "failed",
        [TASK_CANCELLED] = "cancelled",
};

DEFINE_STRING_TABLE_LOOKUP(task_status, TaskStatus);

static Task *task_free(Task *t) {
        free(t->vm_id);
        free(t->vm_name);
        json_decref(t->result);
        api_error_done(&t->error);
        return mfree(t);
}

Task *task_ref(Task *t) {
        if (t)
                t->n_ref++;
        return t;
}

Task *task_unref(Task *t) {
        if (!t || --t->n_ref > 0)
                return NULL;
        return task_free(t);
}

const char *task_id(Task *t) {
        return t->id;
}

const Operation *task_operation(Task *t) {
        return t->op;
}

TaskStatus task_status(Task *t) {
        return t->status;
}

const char *task_vm_id(Task *t) {
        return t->vm_id;
}

usec_t task_created_at(Task *t) {
        return t->created_at;
}

usec_t task_updated_at(Task *t) {
        return t->updated_at;
}

json_t *task_result(Task *t) {
        return t->status == TASK_COMPLETED ? t->result : NULL;
}

const ApiError *task_error(Task *t) {
        return IN_SET(t->status, TASK_FAILED, TASK_CANCELLED) ? &t->error : NULL;
}

static void task_save(Task *t);

/* The task's VM, if it exists. A create learns its VM's id when the VM exists (vm_create() makes it
 * after the image is resolved, so not always before it returns): until then it finds it by name,
 * which is unique on the host. */
static Vm *task_vm(Task *t) {
        Vm *v;

        if (!t->reg)
                return NULL;
        if (t->vm_id)
                return manager_find_vm(t->reg->manager, t->vm_id);
        if (!t->vm_name || t->status != TASK_WORKING)
                return NULL;
        v = manager_find_vm_by_name(t->reg->manager, t->vm_name);
        if (v) {
                t->vm_id = strdup(vm_id(v));
                if (t->vm_id)
                        task_save(t);
        }
        return v;
}

bool task_follows_vm(Task *t, const char *id) {
        Vm *v;

        if (t->status != TASK_WORKING || !id)
                return false;
        v = task_vm(t);
        return v && streq(vm_id(v), id);
}

void task_registry_on_end(TaskRegistry *reg, TaskEndedFunc fn, void *userdata) {
        if (!reg)
                return;
        reg->on_end = fn;
        reg->on_end_userdata = userdata;
}

char *task_status_message(Task *t) {
        char *s = NULL;
        Vm *v;

        switch (t->status) {
        case TASK_WORKING:
                v = task_vm(t);
                if (v)
                        asprintf_or_null(
                                &s, "%s: vm %s is %s", t->op->name, vm_id(v), vm_state_to_string(vm_state(v)));
                else
                        asprintf_or_null(&s, "%s: starting", t->op->name);
                return s;
        case TASK_COMPLETED:
                asprintf_or_null(&s, "%s completed", t->op->name);
                return s;
        default:
                return strdup(t->error.message ?: "failed");
        }
}

/* ---- records ---- */

static char *task_path(TaskRegistry *reg, const char *id) {
        char *p = NULL;

        asprintf_or_null(&p, "%s/%s.json", reg->dir, id);
        return p;
}

static json_t *timestamp_json(usec_t t) {
        char buf[RFC3339_MAX];

        return json_string(format_rfc3339(t, buf));
}

/* What the record and the REST resource both start with: the task, its operation and VM, its status
 * and times. */
static json_t *task_json_head(Task *t) {
        json_auto_t *j = json_pack(
                "{s:s,s:s,s:s,s:o,s:o}",
                "id",
                t->id,
                "operation",
                t->op->name,
                "status",
                task_status_to_string(t->status),
                "createdAt",
                timestamp_json(t->created_at),
                "updatedAt",
                timestamp_json(t->updated_at));

        if (!j)
                return NULL;
        if (t->vm_id && json_object_set_new(j, "vmId", json_string(t->vm_id)) < 0)
                return NULL;
        return TAKE_PTR(j);
}

static json_t *task_record_json(Task *t) {
        json_auto_t *j = task_json_head(t);

        if (!j || json_object_set_new(j, "version", json_integer(TASK_RECORD_VERSION)) < 0)
                return NULL;
        if (t->vm_name && json_object_set_new(j, "vmName", json_string(t->vm_name)) < 0)
                return NULL;
        if (streq(t->op->name, "create_vm") &&
            json_object_set_new(j, "waitFor", json_string(vm_wait_for_to_string(t->wait_for))) < 0)
                return NULL;
        if (t->status == TASK_COMPLETED && t->result && json_object_set(j, "result", t->result) < 0)
                return NULL;
        if (task_error(t) && json_object_set_new(j, "error", api_error_to_json(&t->error)) < 0)
                return NULL;
        return TAKE_PTR(j);
}

/* Queues the record's write: on disk before anything answered after the next manager_sync(). */
static void task_save(Task *t) {
        _cleanup_free_ char *path = NULL;
        json_t *j;
        int r;

        if (!t->reg || !t->registered)
                return;
        path = task_path(t->reg, t->id);
        j = task_record_json(t);
        if (!path || !j) {
                json_decref(j);
                log_warning("task %s: out of memory recording it, ignoring.", t->id);
                return;
        }
        r = manager_write_json(t->reg->manager, path, j, TASK_RECORD_MAX, 0640);
        if (r < 0)
                log_warning_errno(r, "task %s: cannot queue its record, ignoring: %m", t->id);
}

/* The errno a stable code stands for, for an error read back from a record. */
static int error_errno(ApiErrorCode c) {
        switch (c) {
        case API_ERROR_NOT_FOUND:
                return -ENOENT;
        case API_ERROR_INVALID_REQUEST:
                return -EINVAL;
        case API_ERROR_CONFLICT:
                return -EBUSY;
        case API_ERROR_UNSUPPORTED:
                return -EOPNOTSUPP;
        case API_ERROR_TIMEOUT:
                return -ETIMEDOUT;
        default:
                return -EIO;
        }
}

/* A copy as it is: its message already carries the code's sentinel. */
static int error_copy(ApiError *dst, int r, ApiErrorCode code, const char *message) {
        api_error_done(dst);
        *dst = (ApiError){ .error = r, .code = code, .message = strdup(message ?: "failed") };
        return dst->message ? 0 : -ENOMEM;
}

static int task_sync(Task *t, TaskSyncedFunc done, void *userdata);

static void on_end_synced(int r, Task *t, const ApiError *e, void *userdata) {
        if (t->reg && t->reg->on_end)
                t->reg->on_end(t, t->reg->on_end_userdata);
}

static void task_end(Task *t, TaskStatus status) {
        int r;

        t->status = status;
        t->updated_at = now_usec(CLOCK_REALTIME);
        t->live = false;
        task_save(t);
        if (!t->reg || !t->registered || !t->reg->on_end)
                return;
        r = task_sync(t, on_end_synced, NULL);
        if (r < 0)
                log_debug_errno(r, "task %s: nobody hears that it ended: %m", t->id);
}

static int task_parse(TaskRegistry *reg, const char *path, Task **ret) {
        _cleanup_(task_unrefp) Task *t = NULL;
        _cleanup_free_ char *text = NULL;
        json_auto_t *j = NULL;
        json_error_t jerr;
        const char *id, *op, *status, *created, *updated, *vm_id = NULL, *vm_name = NULL, *wait_for = NULL;
        json_t *result = NULL, *error = NULL;
        int version, r;

        r = read_full_file(path, TASK_RECORD_MAX, &text, /* ret_size= */ NULL);
        if (r < 0)
                return r;
        j = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
        if (!j)
                return -EBADMSG;
        if (json_unpack(
                    j,
                    "{s:i,s:s,s:s,s:s,s:s,s:s,s?s,s?s,s?s,s?o,s?o}",
                    "version",
                    &version,
                    "id",
                    &id,
                    "operation",
                    &op,
                    "status",
                    &status,
                    "createdAt",
                    &created,
                    "updatedAt",
                    &updated,
                    "vmId",
                    &vm_id,
                    "vmName",
                    &vm_name,
                    "waitFor",
                    &wait_for,
                    "result",
                    &result,
                    "error",
                    &error) < 0 ||
            version != TASK_RECORD_VERSION || strlen(id) != 32)
                return -EBADMSG;
        t = calloc(1, sizeof(Task));
        if (!t)
                return -ENOMEM;
        *t = (Task){ .n_ref = 1, .error = API_ERROR_NULL };
        memcpy(t->id, id, 33);
        t->op = operation_find(op);
        t->status = task_status_from_string(status);
        t->wait_for = wait_for ? vm_wait_for_from_string(wait_for) : VM_WAIT_READY;
        if (!t->op || !t->op->task || t->status < 0 || t->wait_for < 0 ||
            parse_rfc3339(created, &t->created_at) < 0 || parse_rfc3339(updated, &t->updated_at) < 0)
                return -EBADMSG;
        if ((vm_id && !(t->vm_id = strdup(vm_id))) || (vm_name && !(t->vm_name = strdup(vm_name))))
                return -ENOMEM;
        if (t->status == TASK_COMPLETED)
                t->result = json_incref(result ?: json_object());
        if (IN_SET(t->status, TASK_FAILED, TASK_CANCELLED)) {
                json_t *e = json_object_get(error, "error");
                ApiErrorCode code = api_error_code_from_string(json_string_value(json_object_get(e, "code")));
                const char *message = json_string_value(json_object_get(e, "message"));

                if (code < 0 || !message)
                        return -EBADMSG;
                r = error_copy(&t->error, error_errno(code), code, message);
                if (r < 0)
                        return r;
        }
        *ret = TAKE_PTR(t);
        return 0;
}

static int task_cmp_created(const void *a, const void *b) {
        const Task *x = *(Task *const *) a, *y = *(Task *const *) b;

        return x->created_at < y->created_at ? -1 : x->created_at > y->created_at ? 1 : strcmp(x->id, y->id);
}

static bool task_expired(Task *t, usec_t now) {
        return t->status != TASK_WORKING && now > t->updated_at && now - t->updated_at > TASK_KEEP;
}

/* Drops the task from the registry and its record from disk. */
static void task_forget(TaskRegistry *reg, size_t i) {
        Task *t = reg->tasks[i];
        _cleanup_free_ char *path = task_path(reg, t->id);

        memmove(reg->tasks + i, reg->tasks + i + 1, (reg->n - i - 1) * sizeof(Task *));
        reg->n--;
        if (path)
                (void) manager_unlink_file(reg->manager, path);
        t->reg = NULL;
        t->registered = false;
        task_unref(t);
}

static void task_registry_expire(TaskRegistry *reg) {
        usec_t now = now_usec(CLOCK_REALTIME);

        for (size_t i = 0; i < reg->n;)
                if (task_expired(reg->tasks[i], now))
                        task_forget(reg, i);
                else
                        i++;
}

int task_registry_new(Manager *m, TaskRegistry **ret) {
        _cleanup_(task_registry_freep) TaskRegistry *reg = NULL;
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;
        int r;

        reg = calloc(1, sizeof(TaskRegistry));
        if (!reg)
                return -ENOMEM;
        reg->manager = m;
        if (asprintf(&reg->dir, "%s/tasks", manager_state_dir(m)) < 0) {
                reg->dir = NULL;
                return -ENOMEM;
        }
        r = mkdir_p(reg->dir, 0750);
        if (r < 0)
                return log_error_errno(r, "Cannot create %s: %m", reg->dir);
        d = opendir(reg->dir);
        if (!d)
                return log_error_errno(errno, "Cannot read %s: %m", reg->dir);
        while ((de = readdir(d))) {
                _cleanup_(task_unrefp) Task *t = NULL;
                _cleanup_free_ char *path = NULL;
                size_t len = strlen(de->d_name);
                Task **a;

                /* write_file_atomic()'s temporary files start with a dot */
                if (de->d_name[0] == '.' || len != 32 + 5 || !streq(de->d_name + 32, ".json"))
                        continue;
                if (asprintf(&path, "%s/%s", reg->dir, de->d_name) < 0) {
                        path = NULL;
                        return -ENOMEM;
                }
                r = task_parse(reg, path, &t);
                if (r == -ENOMEM)
                        return r;
                if (r < 0 || !strneq(de->d_name, t->id, 32)) {
                        log_warning("Task record %s is not valid, removing it.", path);
                        (void) unlink(path);
                        continue;
                }
                a = reallocarray(reg->tasks, reg->n + 1, sizeof(Task *));
                if (!a)
                        return -ENOMEM;
                reg->tasks = a;
                t->reg = reg;
                t->registered = true;
                reg->tasks[reg->n++] = TAKE_PTR(t);
        }
        if (reg->n > 1)
                qsort(reg->tasks, reg->n, sizeof(Task *), task_cmp_created);
        task_registry_expire(reg);
        /* an older daemon's excess, the oldest first */
        while (reg->n > TASKS_MAX)
                task_forget(reg, 0);
        if (reg->n > 0)
                log_info("Tasks: %zu recorded in %s.", reg->n, reg->dir);
        *ret = TAKE_PTR(reg);
        return 0;
}

TaskRegistry *task_registry_free(TaskRegistry *reg) {
        if (!reg)
                return NULL;
        for (size_t i = 0; i < reg->n; i++) {
                reg->tasks[i]->reg = NULL;
                task_unref(reg->tasks[i]);
        }
        free(reg->tasks);
        free(reg->dir);
        return mfree(reg);
}

/* Room for one more: the expired go, then the oldest ended one; a registry full of working tasks
 * refuses. */
static int task_registry_make_room(TaskRegistry *reg, ApiError *reterr) {
        task_registry_expire(reg);
        if (reg->n < TASKS_MAX)
                return 0;
        for (size_t i = 0; i < reg->n; i++)
                if (reg->tasks[i]->status != TASK_WORKING) {
                        task_forget(reg, i);
                        return 0;
                }
        return api_error_set(
                reterr,
                -EBUSY,
                API_ERROR_CONFLICT,
                "%u tasks are working already; wait for one of them to end",
                TASKS_MAX);
}

/* ---- judging a task its daemon did not see end ---- */

static void task_fail(Task *t, ApiErrorCode code, const char *fmt, ...) _printf_(3, 4);
static void task_fail(Task *t, ApiErrorCode code, const char *fmt, ...) {
        _cleanup_free_ char *text = NULL;
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&text, fmt, ap);
        va_end(ap);
        if (r < 0)
                text = NULL;
        (void) api_error_set(&t->error, error_errno(code), code, "%s", text ?: "task failed");
        task_end(t, TASK_FAILED);
}

static void task_complete(Task *t, json_t *result) {
        json_decref(t->result);
        t->result = json_incref(result);
        task_end(t, TASK_COMPLETED);
}

static void task_fail_vm(Task *t, Vm *v) {
        json_auto_t *j = vm_to_json(v);
        const char *last = json_string_value(json_object_get(j, "lastError"));

        task_fail(
                t,
                API_ERROR_VM_FAILED,
                "%s of vm %s did not finish: the vm is %s%s%s",
                t->op->name,
                vm_id(v),
                vm_state_to_string(vm_state(v)),
                last ? ": " : "",
                last ?: "");
}

/* A task recorded as working that no operation of this daemon runs: its daemon ended first. The
 * VM's state now says how it ended, as a waiter for it would have been answered. */
static void task_judge(Task *t) {
        Vm *v;

        if (t->live || t->status != TASK_WORKING || !t->reg)
                return;
        v = task_vm(t); /* a create recorded before its VM's id was known finds it by name */
        if (!v) {
                if (streq(t->op->name, "delete_vm")) {
                        json_auto_t *gone = json_pack("{s:s,s:b}", "id", t->vm_id ?: "", "deleted", true);
                        if (gone)
                                task_complete(t, gone);
                } else
                        task_fail(
                                t,
                                API_ERROR_NOT_FOUND,
                                "vm %s no longer exists: it was deleted before %s finished",
                                t->vm_id           ?:
                                        t->vm_name ?:
                                                     "(unknown)",
                                t->op->name);
                return;
        }
        if (streq(t->op->name, "create_vm")) {
                switch (vm_wait_verdict(v, t->wait_for)) {
                case VM_WAIT_REACHED: {
                        json_auto_t *j = vm_to_json(v);
                        if (j)
                                task_complete(t, j);
                        return;
                }
                case VM_WAIT_FAILED:
                case VM_WAIT_ABANDONED:
                        task_fail_vm(t, v);
                        return;
                default:
                        return;
                }
        }
        switch (vm_state(v)) {
        case VM_STATE_READY:
        case VM_STATE_RUNNING:
                if (streq(t->op->name, "start_vm") || streq(t->op->name, "reboot_vm")) {
                        json_auto_t *j = vm_to_json(v);
                        if (j)
                                task_complete(t, j);
                } else if (streq(t->op->name, "stop_vm") || streq(t->op->name, "delete_vm"))
                        task_fail_vm(t, v);
                return;
        case VM_STATE_STOPPED:
        case VM_STATE_FAILED:
                if (streq(t->op->name, "stop_vm")) {
                        json_auto_t *j = vm_to_json(v);
                        if (j)
                                task_complete(t, j);
                } else
                        task_fail_vm(t, v);
                return;
        default:
                return; /* on its way */
        }
}

Task *task_registry_get(TaskRegistry *reg, const char *id) {
        usec_t now = now_usec(CLOCK_REALTIME);

        if (!id)
                return NULL;
        for (size_t i = 0; i < reg->n; i++) {
                Task *t = reg->tasks[i];

                if (!streq(t->id, id))
                        continue;
                if (task_expired(t, now)) {
                        task_forget(reg, i);
                        return NULL;
                }
                task_judge(t);
                return t;
        }
        return NULL;
}

/* ---- running ---- */

typedef struct TaskSync {
        Task *task;
        TaskSyncedFunc done;
        void *userdata;
} TaskSync;

static void on_task_synced(int r, const char *path, void *userdata) {
        TaskSync *s = userdata;

        s->done(0, s->task, NULL, s->userdata);
        task_unref(s->task);
        free(s);
}

/* done hears t once everything queued so far, its record included, is on disk. */
static int task_sync(Task *t, TaskSyncedFunc done, void *userdata) {
        TaskSync *s = calloc(1, sizeof(TaskSync));
        int r;

        if (!s)
                return -ENOMEM;
        *s = (TaskSync){ .task = task_ref(t), .done = done, .userdata = userdata };
        r = manager_sync(t->reg->manager, on_task_synced, s);
        if (r < 0) {
                task_unref(s->task);
                free(s);
        }
        return r;
}

/* The operation's end, when the task still waits for it (a cancelled one does not). */
static void on_operation_done(int r, json_t *result, const ApiError *e, void *userdata) {
        _cleanup_(task_unrefp) Task *t = userdata;

        t->live = false;
        if (t->status != TASK_WORKING)
                return;
        if (!t->vm_id && json_is_string(json_object_get(result, "id")))
                t->vm_id = strdup(json_string_value(json_object_get(result, "id")));
        if (r >= 0)
                task_complete(t, result ?: json_object());
        else if (e && e->message) {
                if (error_copy(&t->error, e->error, e->code, e->message) < 0)
                        (void) api_error_set(&t->error, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
                task_end(t, TASK_FAILED);
        } else
                task_fail(t, API_ERROR_INTERNAL, "%s failed: %s", t->op->name, strerror(-r));
}

static int task_new(const Operation *op, Task **ret) {
        uint8_t rnd[16];
        Task *t;

        if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
                return -EIO;
        t = calloc(1, sizeof(Task));
        if (!t)
                return -ENOMEM;
        *t = (Task){ .n_ref = 1, .op = op, .status = TASK_WORKING, .error = API_ERROR_NULL };
        hex_format(rnd, sizeof(rnd), t->id);
        t->created_at = t->updated_at = now_usec(CLOCK_REALTIME);
        *ret = t;
        return 0;
}

int task_start(
        TaskRegistry *reg,
        const Operation *op,
        const Caller *caller,
        json_t *args,
        TaskSyncedFunc started,
        void *userdata,
        ApiError *reterr) {
        _cleanup_(task_unrefp) Task *t = NULL;
        Task **a;
        int r;

        assert_return(reg && op && started, -EINVAL);
        if (!op->task)
                return api_error_set(
                        reterr, -EOPNOTSUPP, API_ERROR_UNSUPPORTED, "%s does not run as a task", op->name);
        r = task_registry_make_room(reg, reterr);
        if (r < 0)
                return r;
        r = task_new(op, &t);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot make a task: %s", strerror(-r));
        if (streq(op->name, "create_vm")) {
                const char *w = json_string_value(json_object_get(args, "wait_for"));

                t->vm_name = strdup(json_string_value(json_object_get(args, "name")) ?: "");
                t->wait_for = w ? vm_wait_for_from_string(w) : VM_WAIT_READY;
                if (t->wait_for < 0)
                        t->wait_for = VM_WAIT_READY; /* the decoder refuses it below */
        } else if (json_is_string(json_object_get(args, "id")))
                t->vm_id = strdup(json_string_value(json_object_get(args, "id")));

        a = reallocarray(reg->tasks, reg->n + 1, sizeof(Task *));
        if (!a)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        reg->tasks = a;

        /* the operation's reference: its completion may come before we return */
        t->live = true;
        t->reg = reg;
        r = operation_run_async(
                op, reg->manager, caller, args, on_operation_done, /* progress= */ NULL, task_ref(t), reterr);
        if (r < 0) {
                t->reg = NULL;
                task_unref(t); /* the operation's, never called */
                return r;
        }
        reg->tasks[reg->n++] = task_ref(t);
        t->registered = true;
        (void) task_vm(t);
        task_save(t);
        r = task_sync(t, started, userdata);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "cannot record task %s: %s", t->id, strerror(-r));
        log_debug("Task %s: %s started.", t->id, op->name);
        return 0;
}

static void on_cancel_deleted(int r, json_t *record, const ApiError *e, void *userdata) {
        if (r < 0)
                log_debug(
                        "A cancelled create's vm was not deleted: %s",
                        e && e->message ? e->message : strerror(-r));
}

int task_cancel(Task *t, TaskSyncedFunc done, void *userdata, ApiError *reterr) {
        Vm *v;
        int r;

        assert_return(t && t->reg && done, -EINVAL);
        task_judge(t);
        if (t->status != TASK_WORKING)
                return 1;
        if (!streq(t->op->name, "create_vm"))
                return api_error_set(
                        reterr,
                        -EBUSY,
                        API_ERROR_CONFLICT,
                        "task %s cannot be cancelled: %s runs to its end once started (only a create_vm that has not "
                        "reached its milestone can be); follow it until it ends",
                        t->id,
                        t->op->name);
        v = task_vm(t);
        if (v && vm_state(v) != VM_STATE_DELETING) {
                r = vm_delete(v, on_cancel_deleted, /* userdata= */ NULL, reterr);
                if (r < 0)
                        return r;
                manager_touch(t->reg->manager);
        }
        (void) api_error_set(
                &t->error,
                -ECANCELED,
                API_ERROR_CONFLICT,
                "task %s was cancelled: vm %s is deleted",
                t->id,
                t->vm_id           ?:
                        t->vm_name ?:
                                     "(none)");
        task_end(t, TASK_CANCELLED);
        r = task_sync(t, done, userdata);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "cannot record task %s: %s", t->id, strerror(-r));
        return 0;
}

/* ---- rendering ---- */

json_t *task_to_json(Task *t) {
        _cleanup_free_ char *message = task_status_message(t);
        json_auto_t *j = NULL;
        Vm *v = task_vm(t);

        if (!message)
                return NULL;
        j = task_json_head(t);
        if (!j || json_object_set_new(j, "statusMessage", json_string(message)) < 0)
                return NULL;
        if (v && json_object_set_new(j, "vmState", json_string(vm_state_to_string(vm_state(v)))) < 0)
                return NULL;
        if (t->status == TASK_WORKING &&
            json_object_set_new(j, "pollIntervalMs", json_integer(TASK_POLL_INTERVAL_MS)) < 0)
                return NULL;
        if (task_result(t) && json_object_set(j, "result", t->result) < 0)
                return NULL;
        if (task_error(t)) {
                json_auto_t *e = api_error_to_json(&t->error);
                if (!e || json_object_set(j, "error", json_object_get(e, "error")) < 0)
                        return NULL;
        }
        return TAKE_PTR(j);
}

json_t *task_registry_to_json(TaskRegistry *reg) {
        json_auto_t *l = json_array();

        if (!l)
                return NULL;
        task_registry_expire(reg);
        for (size_t i = reg->n; i > 0; i--) {
                Task *t = reg->tasks[i - 1];

                task_judge(t);
                if (json_array_append_new(l, task_to_json(t)) < 0)
                        return NULL;
        }
        return TAKE_PTR(l);
}
