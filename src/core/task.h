/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Durable tasks: an operation of the table that waits for a VM (create, start, stop, reboot, delete),
 * run in the background and recorded in <state-dir>/tasks/<id>.json, so that its caller may go away
 * and ask later, of this daemon or of the next one on the same state directory. MCP serves them as
 * the Tasks extension (tasks/get, tasks/cancel), REST as operation resources (Prefer:
 * respond-async, /api/v1/operations/{id}); both read the same records through this interface.
 *
 * A record is written when the task starts and when it ends, never in between: a task's progress is
 * its VM's state, read when asked. A task whose daemon ended before it did is judged from its VM
 * when it is next read (its VM reached the milestone, failed, or is gone). The registry keeps at
 * most TASKS_MAX tasks; an ended one is forgotten TASK_KEEP after it ended, or sooner when a new
 * task needs its place, the oldest first. It never touches a VM beyond reading it, except for the
 * deletion a cancelled create asks for. */

#include <jansson.h>
#include <stdbool.h>

#include "api-error.h"
#include "caller.h"
#include "cleanup.h"
#include "manager.h"
#include "time-util.h"

#define TASKS_MAX 1000U
#define TASK_KEEP (24 * USEC_PER_HOUR)
/* What a client is told to wait between two reads of a task that works. */
#define TASK_POLL_INTERVAL_MS 2000

typedef enum TaskStatus {
        TASK_WORKING,
        TASK_COMPLETED, /* the operation succeeded: result */
        TASK_FAILED,    /* the operation failed: error, as its blocking call would have */
        TASK_CANCELLED,
        _TASK_STATUS_MAX,
        _TASK_STATUS_INVALID = -EINVAL,
} TaskStatus;

const char *task_status_to_string(TaskStatus s) _const_;
TaskStatus task_status_from_string(const char *s) _pure_;

typedef struct TaskRegistry TaskRegistry;
typedef struct Task Task;
typedef struct Operation Operation; /* operation.h, which includes this header for api/ and mcp/ */

/* Reads every record of <state-dir>/tasks (made when missing), at start-up, before the loop serves:
 * a record that does not parse is logged and removed. After the VMs are loaded. */
int task_registry_new(Manager *m, TaskRegistry **ret);
/* Tasks still running stay recorded as working; their operations' completions find them gone. */
TaskRegistry *task_registry_free(TaskRegistry *reg);
DEFINE_TRIVIAL_CLEANUP_FUNC(TaskRegistry *, task_registry_free);

Task *task_ref(Task *t);
Task *task_unref(Task *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(Task *, task_unref);

/* Called once the record named is on disk (r < 0: it could not be, and e says why). t is borrowed. */
typedef void (*TaskSyncedFunc)(int r, Task *t, const ApiError *e, void *userdata);

/* Runs op (one with a task flag) as a task: the arguments are checked and the operation started
 * first, so a bad request or an unknown VM fails here as its blocking call does; then the record is
 * queued and started hears the task once it is on disk. */
int task_start(
        TaskRegistry *reg,
        const Operation *op,
        const Caller *caller,
        json_t *args,
        TaskSyncedFunc started,
        void *userdata,
        ApiError *reterr);

/* The task of that id, judged against its VM first when its daemon is gone (borrowed); NULL when
 * unknown or forgotten. */
Task *task_registry_get(TaskRegistry *reg, const char *id);

/* Cancels a task. A create that has not reached its milestone is cancelled: its VM is deleted and
 * the task ends cancelled; done hears it once the record is on disk. Returns 0 then, 1 when the task
 * had ended already (nothing changes, done is not called), or a conflict: no other operation can be
 * taken back once it runs. */
int task_cancel(Task *t, TaskSyncedFunc done, void *userdata, ApiError *reterr);

const char *task_id(Task *t);
const Operation *task_operation(Task *t);
TaskStatus task_status(Task *t);
const char *task_vm_id(Task *t); /* NULL: not known (a create whose VM was never made) */
usec_t task_created_at(Task *t);
usec_t task_updated_at(Task *t);
/* A sentence on where the task stands: its VM's state while it works, how it ended after. */
char *task_status_message(Task *t);
/* The operation's result (borrowed) when completed, else NULL. */
json_t *task_result(Task *t);
/* Why it failed or was cancelled (borrowed), else NULL. */
const ApiError *task_error(Task *t);

/* Who hears each task end, once its ended record is on disk (MCP's notifications/tasks): one
 * listener, NULL to stop. Called on the loop; it may read the task, not change it. */
typedef void (*TaskEndedFunc)(Task *t, void *userdata);
void task_registry_on_end(TaskRegistry *reg, TaskEndedFunc fn, void *userdata);
/* Whether t still works and waits for the VM of that id (a create finds its VM by name until it
 * knows the id). */
bool task_follows_vm(Task *t, const char *vm_id);

/* The REST operation resource: {"id","operation","status","statusMessage","vmId","vmState",
 * "createdAt","updatedAt","result"|"error"}; a new reference. */
json_t *task_to_json(Task *t);
/* Every task, newest first, as task_to_json(); a new reference. */
json_t *task_registry_to_json(TaskRegistry *reg);
