/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The types of src/core, declared once so that headers can name each other's without including
 * each other (manager.h and vm.h do not). Typedefs only. */

typedef struct Manager Manager;                     /* manager.c: the service, its registries and settings */
typedef struct ManagerMetrics ManagerMetrics;       /* manager-metrics.c: the histograms of the exposition */
typedef struct ManagerQuarantine ManagerQuarantine; /* a VM record that did not load */
typedef struct ManagerSettings ManagerSettings;     /* what the VMs run with, fixed at start-up */

typedef struct Vm Vm;                   /* vm.c and its rooms, behind vm-internal.h */
typedef struct VmSpec VmSpec;           /* vm-spec.h: what create_vm builds */
typedef struct VmRecord VmRecord;       /* vm-record.h: what vm.json keeps */
typedef struct VmNotify VmNotify;       /* vm-notify.c: the READY=1 listener every VM shares */
typedef struct VmReports VmReports;     /* vm-report.c: the worker that parses guest reports */
typedef struct VmProvision VmProvision; /* vm-provision.c: what create_vm acquired, undone on failure */

typedef struct FirmwareRuns FirmwareRuns; /* manager-firmware.c: the firmware's events per VM shape */
typedef struct FirmwareWait FirmwareWait; /* manager-firmware.c: a wait for one shape's run */
typedef void (*FirmwareWaitDone)(int r, void *userdata);

typedef struct TaskRegistry TaskRegistry; /* task.c: the durable tasks, <state-dir>/tasks */

typedef struct Network Network; /* network.h */
typedef struct NetworkRegistry NetworkRegistry;
typedef struct NetworkCreateArgs NetworkCreateArgs; /* network.h: a decoded create_network request */
