/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "image-catalog.h"
#include "json-util.h"
#include "manager-firmware.h"
#include "network.h"
#include "operation.h"
#include "parse-util.h"

static int op_get_info(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        json_auto_t *tools = json_array(), *info = NULL;
        size_t n;
        const Operation *table = operation_table(&n);

        if (!tools)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                if (table[i].name && json_array_append_new(tools, json_string(table[i].name)) < 0)
                        return -ENOMEM;
        info = json_pack(
                "{s:s,s:s,s:s,s:O}",
                "version",
                manager_version(m),
                "commit",
                manager_commit(m),
                "built",
                manager_built(m),
                "tools",
                tools);
        if (!info)
                return -ENOMEM;
        *ret = TAKE_PTR(info);
        return 0;
}

static int op_get_host(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        json_auto_t *h = host_probe_to_json(manager_host(m));
        const ManagerSettings *st = manager_settings(m);
        json_t *a;

        if (!h)
                return -ENOMEM;
        /* how quotes are judged here; learn mode and noop are never for production, and say so */
        a = json_pack(
                "{s:s,s:b}", "mode", attest_mode_to_string(st->attestation), "learnGolden", st->learn_golden);
        if (!a || json_object_set_new(h, "attestation", a) < 0)
                return -ENOMEM;
        if (st->attestation == ATTEST_MODE_NOOP || st->learn_golden)
                json_object_set_new(
                        a,
                        "warning",
                        json_string(
                                st->attestation == ATTEST_MODE_NOOP ?
                                        "noop attestation: any quote echoing a fresh nonce passes; never for production" :
                                        "golden PCRs without a value are learned and accepted; never for production"));
        /* what the firmware measures, per VM shape: learned by firmware runs, not golden values */
        if (json_object_set_new(h, "firmwareRuns", firmware_runs_to_json(manager_firmware_runs(m))) < 0)
                return -ENOMEM;
        /* VM records that did not load: set aside, not lost */
        if (json_object_set_new(h, "quarantine", manager_quarantine_to_json(m)) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(h);
        return 0;
}

static int op_list_images(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        json_t *l = image_catalog_to_json(manager_images(m));

        if (!l)
                return -ENOMEM;
        *ret = l;
        return 0;
}

/* The decoded arguments of get_image. */
typedef struct ImageRefArgs {
        char *ref;
} ImageRefArgs;

static int op_get_image(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        const ImageRefArgs *a = req->decoded;

        return image_catalog_get_json(manager_images(m), a->ref, ret, reterr);
}

static int op_list_networks(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        json_t *l = network_registry_to_json(manager_networks(m));

        if (!l)
                return -ENOMEM;
        *ret = l;
        return 0;
}

/* The decoded arguments of get_network and delete_network. */
typedef struct NetworkNameArgs {
        char *name;
} NetworkNameArgs;

static int lookup_network(Manager *m, const char *name, Network **ret, ApiError *reterr) {
        Network *n = network_registry_get(manager_networks(m), name);

        if (!n)
                return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "network \"%s\"", name);
        *ret = n;
        return 0;
}

static int op_get_network(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        const NetworkNameArgs *a = req->decoded;
        Network *n = NULL;
        int r;

        r = lookup_network(m, a->name, &n, reterr);
        if (r < 0)
                return r;
        *ret = network_to_json(n);
        return *ret ? 0 : -ENOMEM;
}

static int op_create_network(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        Network *n = NULL;
        int r;

        r = manager_create_network(m, req->decoded, &n, reterr);
        if (r < 0)
                return r;
        *ret = network_to_json(n);
        return *ret ? 0 : -ENOMEM;
}

static int op_delete_network(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        const NetworkNameArgs *a = req->decoded;
        int r;

        r = manager_delete_network(m, a->name, reterr);
        if (r < 0)
                return r;
        /* REST shows nothing of a deletion, but MCP gets this record of what was removed. */
        *ret = json_pack("{s:s,s:b}", "id", a->name, "deleted", true);
        return *ret ? 0 : -ENOMEM;
}

/* The decoded arguments of the operations on one VM: each starts with the VmIdArgs that
 * request_vm() reads. */
typedef struct VmIdArgs {
        char *id;
} VmIdArgs;

typedef struct VmConsoleArgs {
        VmIdArgs vm;
        int64_t lines;
} VmConsoleArgs;

typedef struct VmExecArgs {
        VmIdArgs vm;
        char **command;
        int64_t timeout_seconds;
        char *input;
} VmExecArgs;

typedef struct VmForwardArgs {
        VmIdArgs vm;
        int64_t port;
} VmForwardArgs;

static int lookup_vm(Manager *m, const char *id, Vm **ret, ApiError *reterr) {
        Vm *v = manager_find_vm(m, id);

        if (!v)
                return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "vm \"%s\"", id);
        *ret = v;
        return 0;
}

static int request_vm(Manager *m, const OperationRequest *req, Vm **ret, ApiError *reterr) {
        const VmIdArgs *a = req->decoded;

        return lookup_vm(m, a->id, ret, reterr);
}

static int op_get_vm_attestation(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        Vm *v = NULL;
        int r = request_vm(m, req, &v, reterr);

        if (r < 0)
                return r;
        *ret = vm_attestation_to_json(v);
        return *ret ? 0 : -ENOMEM;
}

static int op_get_vm_metrics(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        Vm *v = NULL;
        int r = request_vm(m, req, &v, reterr);

        if (r < 0)
                return r;
        return vm_metrics_json(v, ret, reterr);
}

static int op_list_vms(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        json_auto_t *l = json_array();

        if (!l)
                return -ENOMEM;
        for (size_t i = 0; i < manager_n_vms(m); i++)
                if (json_array_append_new(l, vm_to_json(manager_vm_at(m, i))) < 0)
                        return -ENOMEM;
        *ret = TAKE_PTR(l);
        return 0;
}

static int op_get_vm(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        Vm *v = NULL;
        int r = request_vm(m, req, &v, reterr);

        if (r < 0)
                return r;
        *ret = vm_to_json(v);
        return *ret ? 0 : -ENOMEM;
}

/* lines met its range in the decoder, before the lookup: a bad argument is refused whether or not the
 * VM exists. */
static int op_get_vm_console(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        const VmConsoleArgs *a = req->decoded;
        Vm *v = NULL;
        int r = request_vm(m, req, &v, reterr);

        if (r < 0)
                return r;
        return vm_console_json(v, a->lines, ret, reterr);
}

static int op_create_vm(
        Manager *m,
        const OperationRequest *req,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr) {
        return vm_create(m, req->decoded, req->caller, done, progress, userdata, reterr);
}

static void create_vm_args_done(void *args) {
        vm_spec_input_done(args);
}

/* The VM operations that wait: look the VM up (an unknown one is not_found before anything else), report its
 * state changes to progress while the operation runs, and hand over to the lifecycle. */
static int run_on_vm(
        int (*fn)(Vm *v, VmDoneFunc done, void *userdata, ApiError *reterr),
        Manager *m,
        const OperationRequest *req,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr) {
        Vm *v = NULL;
        int r = request_vm(m, req, &v, reterr);

        if (r < 0)
                return r;
        r = vm_observe(v, progress, userdata);
        if (r >= 0)
                r = fn(v, done, userdata, reterr);
        if (r < 0)
                vm_unobserve(v, userdata);
        return r;
}

static int op_start_vm(
        Manager *m,
        const OperationRequest *req,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr) {
        return run_on_vm(vm_start, m, req, done, progress, userdata, reterr);
}

static int op_stop_vm(
        Manager *m,
        const OperationRequest *req,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr) {
        return run_on_vm(vm_stop, m, req, done, progress, userdata, reterr);
}

static int op_reboot_vm(
        Manager *m,
        const OperationRequest *req,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr) {
        return run_on_vm(vm_reboot, m, req, done, progress, userdata, reterr);
}

static int op_delete_vm(
        Manager *m,
        const OperationRequest *req,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr) {
        const VmIdArgs *a = req->decoded;

        /* a record that did not load at start-up goes with its disk and lease (get_host lists them) */
        if (!manager_find_vm(m, a->id) && manager_find_quarantined(m, a->id)) {
                json_auto_t *gone = NULL;
                int r = vm_delete_quarantined(m, a->id, &gone, reterr);
                if (r < 0)
                        return r;
                done(0, gone, NULL, userdata);
                return 0;
        }
        return run_on_vm(vm_delete, m, req, done, progress, userdata, reterr);
}

/* The command (not empty) and the timeout met their declarations in the decoder, before the lookup. */
static int op_exec_vm(
        Manager *m,
        const OperationRequest *req,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr) {
        const VmExecArgs *a = req->decoded;
        Vm *v = NULL;
        int r = request_vm(m, req, &v, reterr);

        if (r < 0)
                return r;
        return vm_exec(
                v, a->command, a->input, (usec_t) a->timeout_seconds * USEC_PER_SEC, done, userdata, reterr);
}

/* The port met its range in the decoder, before the lookup. */
static int op_forward_port(Manager *m, const OperationRequest *req, json_t **ret, ApiError *reterr) {
        const VmForwardArgs *a = req->decoded;
        Vm *v = NULL;
        int r = request_vm(m, req, &v, reterr);

        if (r < 0)
                return r;
        return vm_forward_port(v, a->port, ret, reterr);
}

static const OperationParam no_params[] = { { .name = NULL } };

static const OperationParam image_ref_params[] = {
        { .name = "ref",
          .type = PARAM_STRING,
          .flags = PARAM_REQUIRED | PARAM_IN_PATH,
          .description = "Image reference: \"<id>_<version>\" as listed by list_images, or a bare id for its newest version",
          .offset = offsetof(ImageRefArgs, ref) },
        { .name = NULL },
};

static const OperationParam network_name_params[] = {
        { .name = "name",
          .type = PARAM_STRING,
          .flags = PARAM_REQUIRED | PARAM_IN_PATH,
          .description = "Network name as returned by create_network or list_networks",
          .offset = offsetof(NetworkNameArgs, name) },
        { .name = NULL },
};

static const OperationParam create_network_params[] = {
        { .name = "name",
          .type = PARAM_STRING,
          .flags = PARAM_REQUIRED,
          .description = "Network name: lowercase letters, digits and dashes, 1-63 characters, starting and ending with a letter or digit",
          .offset = offsetof(NetworkCreateArgs, name) },
        { .name = "cidr",
          .type = PARAM_STRING,
          .flags = PARAM_REQUIRED,
          .description = "IPv4 network, /16 to /29, outside 169.254.0.0/16, its address without host bits, e.g. 192.168.128.0/24 (not 192.168.128.5/24); .1 is the gateway, VMs get .2 upwards",
          .offset = offsetof(NetworkCreateArgs, cidr) },
        { .name = "dns_search_domain",
          .type = PARAM_STRING,
          .flags = PARAM_NOT_EMPTY,
          .description = "DNS search domain handed to guests by DHCP, e.g. lab.internal (optional)",
          .absent_means = "none",
          .offset = offsetof(NetworkCreateArgs, dns_search_domain) },
        { .name = "enable_host_alias",
          .type = PARAM_BOOLEAN,
          .flags = PARAM_NOT_NULL,
          .description = "Expose the host's loopback to guests: a guest's connection to the network's host alias (the last address before the broadcast, e.g. .254 of a /24) reaches 127.0.0.1 on the host, every service listening there included (vm-manager's own API when it listens on loopback). Default false",
          .offset = offsetof(NetworkCreateArgs, enable_host_alias) },
        { .name = "mtu",
          .type = PARAM_INTEGER,
          .flags = PARAM_NOT_NULL,
          .description = "MTU of the network, 576 to 65520, default 1500; guests learn it from DHCP and their NIC. Large MTUs make guest traffic through the gateway several times faster",
          .min = NETWORK_MTU_MIN,
          .max = NETWORK_MTU_MAX,
          .range_wording = PARAM_RANGE_BETWEEN,
          .default_integer = NETWORK_MTU_DEFAULT,
          .offset = offsetof(NetworkCreateArgs, mtu) },
        { .name = NULL },
};

/* The VM an operation acts on, the first parameter of each. */
#define VM_ID_PARAM(args, field)                                                                             \
        {                                                                                                    \
                .name = "id", .type = PARAM_STRING, .flags = PARAM_REQUIRED | PARAM_IN_PATH,                 \
                .description = "VM id as returned by create_vm or list_vms", .offset = offsetof(args, field) \
        }

static const OperationParam vm_id_params[] = {
        VM_ID_PARAM(VmIdArgs, id),
        { .name = NULL },
};

static const OperationParam vm_console_params[] = {
        VM_ID_PARAM(VmConsoleArgs, vm.id),
        { .name = "lines",
          .type = PARAM_INTEGER,
          .flags = PARAM_IN_QUERY,
          .description = "How many of the last lines to return: 1 to 10000, default 100",
          .min = 1,
          .max = VM_CONSOLE_LINES_MAX,
          .range_wording = PARAM_RANGE_PARENTHESIZED,
          .default_integer = VM_CONSOLE_LINES_DEFAULT,
          .offset = offsetof(VmConsoleArgs, lines) },
        { .name = NULL },
};

static const OperationParam exec_vm_params[] = {
        VM_ID_PARAM(VmExecArgs, vm.id),
        { .name = "command",
          .type = PARAM_STRING_ARRAY,
          .flags = PARAM_REQUIRED | PARAM_NOT_EMPTY,
          .description = "The program and its arguments, e.g. [\"systemctl\", \"is-system-running\"]; each word is "
                         "quoted for the guest's shell, nothing is expanded",
          .offset = offsetof(VmExecArgs, command) },
        { .name = "timeout_seconds",
          .type = PARAM_INTEGER,
          .description = "Give up on the command after this long, 1 to 3600, default 300",
          .min = 1,
          .max = VM_EXEC_TIMEOUT_MAX / USEC_PER_SEC,
          .range_wording = PARAM_RANGE_BETWEEN,
          .default_integer = VM_EXEC_TIMEOUT_DEFAULT / USEC_PER_SEC,
          .offset = offsetof(VmExecArgs, timeout_seconds) },
        { .name = "stdin",
          .type = PARAM_STRING,
          .max_length = VM_EXEC_OUTPUT_MAX,
          .description = "Text for the command's standard input, at most 1 MiB, followed by end of file; default none "
                         "(end of file at once)",
          .offset = offsetof(VmExecArgs, input) },
        { .name = NULL },
};

static const OperationParam forward_port_params[] = {
        VM_ID_PARAM(VmForwardArgs, vm.id),
        { .name = "port",
          .type = PARAM_INTEGER,
          .flags = PARAM_REQUIRED,
          .description = "Guest TCP port, 1-65535",
          .min = 1,
          .max = 65535,
          .range_wording = PARAM_RANGE_UNSTATED,
          .offset = offsetof(VmForwardArgs, port) },
        { .name = NULL },
};

static const char *const wait_for_values[] = { "none", "installed", "attested", "ready", NULL };
static const char *const install_mode_values[] = { "host", "boot", NULL };

/* create_vm decodes into a VmSpecInput: each parameter's declaration here is all it takes to add
 * one (its type, limits and default), and vm_spec_check_request() has the rules between them. */
static const OperationParam create_vm_params[] = {
        { .name = "name",
          .type = PARAM_STRING,
          .flags = PARAM_REQUIRED,
          .description = "VM name: a DNS label (lowercase letters, digits, dashes), unique on this host",
          .valid = dns_label_is_valid,
          .invalid_text = "must be a DNS label (lowercase letters, digits, dashes)",
          .offset = offsetof(VmSpecInput, name) },
        { .name = "image",
          .type = PARAM_STRING,
          .flags = PARAM_NOT_EMPTY,
          .max_length = VM_REF_MAX,
          .description = "Image reference from list_images (\"<id>_<version>\" or a bare id); default the newest image",
          .offset = offsetof(VmSpecInput, image) },
        { .name = "kubernetes_version",
          .type = PARAM_STRING,
          .flags = PARAM_NOT_EMPTY,
          .max_length = VM_REF_MAX,
          .description = "Kubernetes version among the image's kubernetesVersions; default the newest it offers",
          .offset = offsetof(VmSpecInput, kubernetes_version) },
        { .name = "cpus",
          .type = PARAM_INTEGER,
          .description = "Virtual CPUs, default 2, 1 to 256",
          .min = 1,
          .max = 256,
          .default_integer = VM_CPUS_DEFAULT,
          .offset = offsetof(VmSpecInput, cpus) },
        { .name = "memory_mib",
          .type = PARAM_INTEGER,
          .range_wording = PARAM_RANGE_BOUNDS_APART,
          .description = "Memory in MiB, default 2048, 256 to 16777216",
          .min = 256,
          .max = VM_MEMORY_MIB_MAX,
          .default_integer = VM_MEMORY_MIB_DEFAULT,
          .offset = offsetof(VmSpecInput, memory_mib) },
        { .name = "disk_gib",
          .type = PARAM_INTEGER,
          .description = "Disk size in GiB, default 20, 1 to 4096",
          .min = 1,
          .max = 4096,
          .default_integer = VM_DISK_GIB_DEFAULT,
          .offset = offsetof(VmSpecInput, disk_gib) },
        { .name = "network",
          .type = PARAM_STRING,
          .flags = PARAM_NOT_EMPTY,
          .max_length = VM_REF_MAX,
          .description = "Network to attach to, default \"default\"",
          .default_string = VM_NETWORK_DEFAULT,
          .offset = offsetof(VmSpecInput, network) },
        { .name = "user_data",
          .type = PARAM_STRING,
          .max_length = VM_USER_DATA_MAX,
          .description = "Ignition JSON as a string (Cluster API's bootstrap data, spec 2.x as its kubeadm provider writes it, or 3.x), at most 1 MiB; the metadata service releases it only after attestation. A kubeadm.service in it runs once the Kubernetes extension and its runtime are up, and ready waits for it",
          .offset = offsetof(VmSpecInput, user_data) },
        { .name = "ssh_authorized_keys",
          .type = PARAM_STRING_ARRAY,
          .max_length = VM_SSH_KEY_MAX,
          .description = "SSH public keys for root, one line each: at most 32 keys of at most 4096 bytes, 32 KiB together",
          .offset = offsetof(VmSpecInput, ssh_authorized_keys) },
        { .name = "hostname",
          .type = PARAM_STRING,
          .flags = PARAM_NOT_EMPTY,
          .description = "Guest hostname, a DNS label; default the name",
          .valid = dns_label_is_valid,
          .invalid_text = "must be a DNS label",
          .offset = offsetof(VmSpecInput, hostname) },
        { .name = "metadata",
          .type = PARAM_STRING_MAP,
          .max_length = VM_METADATA_VALUE_MAX,
          .description = "Free-form string labels; keys without slashes or spaces: at most 64 entries, keys of 128 and values of 16384 bytes, 64 KiB together",
          .offset = offsetof(VmSpecInput, metadata) },
        { .name = "require_attestation",
          .type = PARAM_BOOLEAN,
          .description = "Release user_data only after a verified TPM quote, and report ready only after a verified ready-stage quote; default true. Refused when the image has no golden PCR values (unless the server learns them); false releases user_data as soon as the installed boot starts",
          .default_integer = true,
          .offset = offsetof(VmSpecInput, require_attestation) },
        { .name = "wait_for",
          .type = PARAM_STRING,
          .flags = PARAM_NOT_EMPTY,
          .enum_values = wait_for_values,
          .description = "Milestone to block on: none, installed, attested or ready (default)",
          .default_string = "ready",
          .offset = offsetof(VmSpecInput, wait_for) },
        { .name = "install_mode",
          .type = PARAM_STRING,
          .flags = PARAM_NOT_EMPTY,
          .enum_values = install_mode_values,
          .description = "How the disk is written: host (laid out by the server from the image's layout file, then the first boot is the installed one; unsupported for an image without one) or boot (an installer boot of the image); default the server's --install-mode",
          .offset = offsetof(VmSpecInput, install_mode) },
        { .name = NULL },
};

/* Registration order: get_info lists the tools in this order. */
static const Operation operations[] = {
        {
                .name = "get_info",
                .result_schema = "Info",
                .description = "Read-only. This server's build (release version, commit, build time) and the names of its tools. "
                               "Call get_host next to learn whether this host can run VMs.",
                .hints = OP_HINTS_READ,
                .params = no_params,
                .handler = op_get_info,
        },
        {
                .name = "get_host",
                .result_schema = "Host",
                .description =
                        "Read-only. Host capabilities: kernel, CPUs, memory, /dev/kvm and /dev/vhost-vsock, the qemu, swtpm "
                        "and systemd versions, the OVMF firmware image and its build (sha256, package, version), "
                        "storage providers, the accelerator VMs will use and why, and ready plus missing. Call this "
                        "first: it says whether VMs can run here and what to install when they cannot.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/host",
                .success = OPERATION_SUCCESS_RESULT,
                .params = no_params,
                .handler = op_get_host,
        },
        {
                .name = "list_images",
                .result_schema = "Image",
                .description =
                        "Read-only. The bootable OS images found in the image directory: id, version, UKI and disk "
                        "paths, the Kubernetes sysext versions offered, and the PCR policy. An empty list means no "
                        "image has been built or --image-dir points elsewhere. Call get_host first; pass an image "
                        "to create_vm, or let it default to the newest.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/images",
                .success = OPERATION_SUCCESS_RESULT,
                .list_key = "images",
                .cacheable = true,
                .params = no_params,
                .handler = op_list_images,
        },
        {
                .name = "get_image",
                .result_schema = "Image",
                .description = "Read-only. Describe one image by \"<id>_<version>\", or by a bare id for its newest version. "
                               "Call list_images first to see what exists.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/images/{ref}",
                .success = OPERATION_SUCCESS_RESULT,
                .params = image_ref_params,
                .handler = op_get_image,
                .args_size = sizeof(ImageRefArgs),
        },
        {
                .name = "list_networks",
                .result_schema = "Network",
                .description = "Read-only. The virtual networks with their CIDR, gateway and leases (the MAC and IP of each "
                               "attached VM). A network named \"default\" exists from start-up. Call this before "
                               "create_vm to pick a network, or create_network to make another.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/networks",
                .success = OPERATION_SUCCESS_RESULT,
                .list_key = "networks",
                .cacheable = true,
                .params = no_params,
                .handler = op_list_networks,
        },
        {
                .name = "get_network",
                .result_schema = "Network",
                .description = "Read-only. Describe one network: spec, gateway and leases. Call list_networks first for the "
                               "names.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/networks/{name}",
                .success = OPERATION_SUCCESS_RESULT,
                .params = network_name_params,
                .handler = op_get_network,
                .args_size = sizeof(NetworkNameArgs),
        },
        {
                .name = "list_vms",
                .result_schema = "VM",
                .description = "Read-only. Every VM record, oldest first: state, address, attestation, last error. "
                               "Call get_host first to know whether VMs can run here.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/vms",
                .success = OPERATION_SUCCESS_RESULT,
                .list_key = "vms",
                .params = no_params,
                .handler = op_list_vms,
        },
        {
                .name = "get_vm",
                .result_schema = "VM",
                .description =
                        "Read-only. One VM record: state (creating, installing, booting, attesting, ready, running, "
                        "stopping, stopped, failed, deleting), IP and MAC, attestation, the guest's STATUS= and "
                        "lastError. Poll it after create_vm with wait_for none or after start, stop and reboot; "
                        "call list_vms first for the ids.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/vms/{id}",
                .success = OPERATION_SUCCESS_RESULT,
                .params = vm_id_params,
                .handler = op_get_vm,
                .args_size = sizeof(VmIdArgs),
        },
        {
                .name = "get_vm_console",
                .result_schema = "Console",
                .description =
                        "Read-only. The tail of the VM's serial console (lines, default 100, at most 10000). The "
                        "first stop when a VM failed or seems stuck; call get_vm first for its state and lastError.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/vms/{id}/console",
                .success = OPERATION_SUCCESS_RESULT,
                .params = vm_console_params,
                .handler = op_get_vm_console,
                .args_size = sizeof(VmConsoleArgs),
        },
        {
                .name = "get_vm_metrics",
                .result_schema = "Metrics",
                .description =
                        "Read-only. The VM seen from the host (state, attestation, QEMU pid, CPU seconds and resident "
                        "memory, disk bytes, install and boot-to-ready seconds, its network's byte counters and "
                        "leases) and a summary of the guest's last systemd-report upload (when it arrived, families, "
                        "series exported and dropped, the first 10 entries). The full upload is at raw_report_url "
                        "(REST only). Call get_vm first for the VM's state.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/vms/{id}/metrics",
                .success = OPERATION_SUCCESS_RESULT,
                .params = vm_id_params,
                .handler = op_get_vm_metrics,
                .args_size = sizeof(VmIdArgs),
        },
        {
                .name = "get_vm_attestation",
                .result_schema = "Attestation",
                .description =
                        "Read-only. The attestation of the VM's current boot: whether it is required, whether "
                        "user-data was released, when the guest asked for its first nonce, and the verdicts of its "
                        "initrd and ready quotes (message, AK fingerprint, PCR values, PCRs learned). Reset on every "
                        "installed boot. Call get_vm first for the VM's state and lastError.",
                .hints = OP_HINTS_READ,
                .method = "GET",
                .path = "/vms/{id}/attestation",
                .success = OPERATION_SUCCESS_RESULT,
                .params = vm_id_params,
                .handler = op_get_vm_attestation,
                .args_size = sizeof(VmIdArgs),
        },
        {
                .name = "create_network",
                .result_schema = "Network",
                .description =
                        "WRITES: create a rootless virtual network with DHCP, DNS, NAT to whatever the host reaches, "
                        "and the instance metadata service at 169.254.169.254. VMs on different networks never see "
                        "each other, even when their CIDRs overlap. Call list_networks first: the \"default\" "
                        "network may be all you need.",
                .hints = OP_HINTS_CREATE,
                .method = "POST",
                .path = "/networks",
                .success = OPERATION_SUCCESS_CREATED,
                .rest_body = true,
                .params = create_network_params,
                .handler = op_create_network,
                .args_size = sizeof(NetworkCreateArgs),
        },
        {
                .name = "delete_network",
                .result_schema = "Deleted",
                .description = "WRITES (destructive): delete a network. Fails with conflict while any VM is attached: call "
                               "get_network to see its leases and delete those VMs first.",
                .hints = OP_HINTS_DESTRUCTIVE,
                .method = "DELETE",
                .path = "/networks/{name}",
                .success = OPERATION_SUCCESS_EMPTY,
                .params = network_name_params,
                .handler = op_delete_network,
                .args_size = sizeof(NetworkNameArgs),
        },
        {
                .name = "create_vm",
                .result_schema = "VM",
                .description =
                        "WRITES: create a VM: allocates a disk, a vTPM, an address on the network and a notify id, "
                        "writes the disk (on the host from the image's layout, or with an installer boot: "
                        "install_mode), then the installed boot, attestation and READY=1. By default it "
                        "blocks until the VM is ready (wait_for); on failure or timeout the message carries the VM "
                        "id and the VM is kept for get_vm_console and delete_vm. Call get_host, list_images and "
                        "list_networks first.",
                .hints = OP_HINTS_CREATE,
                .method = "POST",
                .path = "/vms",
                .success = OPERATION_SUCCESS_CREATED,
                .rest_body = true,
                .params = create_vm_params,
                .async_handler = op_create_vm,
                .task = true,
                .args_size = sizeof(VmSpecInput),
                .args_done = create_vm_args_done,
                .args_check = vm_spec_check_request,
        },
        {
                .name = "start_vm",
                .result_schema = "VM",
                .description = "WRITES: boot a stopped or failed VM from its disk (attestation runs again) and return it in "
                               "state booting; poll get_vm for ready. A conflict when it runs or never finished "
                               "installing; call get_vm first.",
                .hints = OP_HINTS_IDEMPOTENT,
                .method = "POST",
                .path = "/vms/{id}/start",
                .success = OPERATION_SUCCESS_RESULT,
                .params = vm_id_params,
                .async_handler = op_start_vm,
                .task = true,
                .args_size = sizeof(VmIdArgs),
        },
        {
                .name = "stop_vm",
                .result_schema = "VM",
                .description =
                        "WRITES: power a VM down: ACPI first, then SIGTERM and SIGKILL after the stop timeout; "
                        "returns once it stopped. The disk stays, start_vm boots it again. Call get_vm first.",
                .hints = OP_HINTS_IDEMPOTENT,
                .method = "POST",
                .path = "/vms/{id}/stop",
                .success = OPERATION_SUCCESS_RESULT,
                .params = vm_id_params,
                .async_handler = op_stop_vm,
                .task = true,
                .args_size = sizeof(VmIdArgs),
        },
        {
                .name = "reboot_vm",
                .result_schema = "VM",
                .description = "WRITES: stop, then start a VM; returns it in state booting. Call get_vm first.",
                .hints = OP_HINTS_IDEMPOTENT,
                .method = "POST",
                .path = "/vms/{id}/reboot",
                .success = OPERATION_SUCCESS_RESULT,
                .params = vm_id_params,
                .async_handler = op_reboot_vm,
                .task = true,
                .args_size = sizeof(VmIdArgs),
        },
        {
                .name = "delete_vm",
                .result_schema = "Deleted",
                .description = "WRITES (destructive): stop the VM if it runs and remove its disk, vTPM state, address "
                               "lease and record; not undoable. Call get_vm first to be sure of the id.",
                .hints = OP_HINTS_DESTRUCTIVE,
                .method = "DELETE",
                .path = "/vms/{id}",
                .success = OPERATION_SUCCESS_EMPTY,
                .params = vm_id_params,
                .async_handler = op_delete_vm,
                .task = true,
                .args_size = sizeof(VmIdArgs),
        },
        {
                .name = "exec_vm",
                .result_schema = "ExecResult",
                .description =
                        "WRITES (destructive): run a command in the guest as root over ssh with the VM's own key (the "
                        "guest's host key is pinned on first use) and return {stdout, stderr, exitCode}; a non-zero "
                        "exit is a result, not an error. Each stream keeps its first MiB (stdoutTruncated/stderrTruncated "
                        "say when more was dropped); a command still running after timeout_seconds (default 300) "
                        "is abandoned with a timeout error. Needs a VM whose sshd is up: call get_vm first. One "
                        "still installing or booting whose sshd does not answer yet gets a conflict: try again "
                        "once it is ready.",
                .hints = OP_HINTS_EXEC,
                .method = "POST",
                .path = "/vms/{id}/exec",
                .success = OPERATION_SUCCESS_RESULT,
                .rest_body = true,
                .params = exec_vm_params,
                .async_handler = op_exec_vm,
                .args_size = sizeof(VmExecArgs),
        },
        {
                .name = "forward_port",
                .result_schema = "Forward",
                .description =
                        "WRITES: expose a guest TCP port (e.g. 22 or 6443) on a listener at 127.0.0.1 and "
                        "return its address; asking again for the same port returns the same forward. Forwards "
                        "are listed in the VM's record and last until the VM is deleted, across vm-manager "
                        "restarts; while the VM is not running, a connection to one is closed at once. The VM "
                        "needs an address, not a running guest: call get_vm first for its ip and forwards.",
                .hints = OP_HINTS_IDEMPOTENT,
                .method = "POST",
                .path = "/vms/{id}/forward",
                .success = OPERATION_SUCCESS_RESULT,
                .rest_body = true,
                .params = forward_port_params,
                .handler = op_forward_port,
                .args_size = sizeof(VmForwardArgs),
        },
};

const Operation *operation_table(size_t *ret_n) {
        *ret_n = ELEMENTSOF(operations);
        return operations;
}

const Operation *operation_find(const char *name) {
        if (!name)
                return NULL;
        for (size_t i = 0; i < ELEMENTSOF(operations); i++)
                if (streq(operations[i].name, name))
                        return &operations[i];
        return NULL;
}

static const char *param_type_expect(ParamType t) {
        switch (t) {
        case PARAM_STRING:
                return "a string";
        case PARAM_INTEGER:
                return "an integer";
        case PARAM_BOOLEAN:
                return "a boolean";
        case PARAM_STRING_ARRAY:
                return "an array of strings";
        case PARAM_STRING_MAP:
                return "an object of strings";
        default:
                return "a value";
        }
}

static bool param_type_matches(ParamType t, json_t *v) {
        const char *k;
        json_t *e;
        size_t i;

        switch (t) {
        case PARAM_STRING:
                return json_is_string(v);
        case PARAM_INTEGER:
                return json_is_integer(v);
        case PARAM_BOOLEAN:
                return json_is_boolean(v);
        case PARAM_STRING_ARRAY:
                if (!json_is_array(v))
                        return false;
                json_array_foreach(v, i, e) if (!json_is_string(e)) return false;
                return true;
        case PARAM_STRING_MAP:
                if (!json_is_object(v))
                        return false;
                json_object_foreach(v, k, e) if (!json_is_string(e)) return false;
                return true;
        default:
                return false;
        }
}

/* Strings reach file names, logs, records and other programs: no NUL (C would cut them there, and the
 * record would not load again), and a sane size. Also the elements of arrays and values of maps. */
static int check_string(const char *name, json_t *v, size_t max, ApiError *reterr) {
        if (json_string_length(v) > max)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "field \"%s\": longer than %zu bytes",
                        name,
                        max);
        if (memchr(json_string_value(v), 0, json_string_length(v)))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "field \"%s\": contains a NUL character",
                        name);
        return 0;
}

int operation_check_args(const Operation *op, json_t *args, ApiError *reterr) {
        const char *key;
        json_t *v;
        int r;

        assert_return(op, -EINVAL);

        if (!json_is_object(args))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "expected a JSON object, got %s",
                        args ? json_type_name(args) : "nothing");

        json_object_foreach(args, key, v) {
                const OperationParam *p = NULL;

                for (const OperationParam *i = op->params; i->name; i++)
                        if (streq(i->name, key)) {
                                p = i;
                                break;
                        }
                if (!p)
                        return api_error_set(
                                reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "unknown field \"%s\"", key);
                if (json_is_null(v) && !(p->flags & (PARAM_REQUIRED | PARAM_NOT_NULL)))
                        continue;
                if (!param_type_matches(p->type, v))
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INVALID_REQUEST,
                                "field \"%s\": expected %s, got %s",
                                key,
                                param_type_expect(p->type),
                                json_type_name(v));
                if (p->type == PARAM_STRING_ARRAY || p->type == PARAM_STRING_MAP) {
                        const char *k;
                        json_t *e;
                        size_t i;

                        json_array_foreach(v, i, e) {
                                r = check_string(key, e, p->max_length ?: PARAM_STRING_MAX, reterr);
                                if (r < 0)
                                        return r;
                        }
                        if (json_is_object(v))
                                json_object_foreach(v, k, e) {
                                        r = check_string(key, e, p->max_length ?: PARAM_STRING_MAX, reterr);
                                        if (r < 0)
                                                return r;
                                }
                }
                if (p->type == PARAM_STRING) {
                        r = check_string(key, v, p->max_length ?: PARAM_STRING_MAX, reterr);
                        if (r < 0)
                                return r;
                        if (p->enum_values) {
                                bool ok = false;
                                for (const char *const *e = p->enum_values; *e; e++)
                                        ok = ok || streq(*e, json_string_value(v));
                                if (!ok)
                                        return api_error_set(
                                                reterr,
                                                -EINVAL,
                                                API_ERROR_INVALID_REQUEST,
                                                "field \"%s\": \"%s\" is not one of the allowed values",
                                                key,
                                                json_string_value(v));
                        }
                }
        }

        for (const OperationParam *p = op->params; p->name; p++) {
                v = json_object_get(args, p->name);
                if ((p->flags & PARAM_REQUIRED) && (!v || json_is_null(v)))
                        return api_error_set(
                                reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "field \"%s\" is required", p->name);
        }
        return 0;
}

const OperationParam *operation_param_find(const Operation *op, const char *name) {
        if (!op || !name)
                return NULL;
        for (const OperationParam *p = op->params; p->name; p++)
                if (streq(p->name, name))
                        return p;
        return NULL;
}

void operation_problem(char **problems, const char *fmt, ...) {
        _cleanup_free_ char *p = NULL;
        char *n = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&p, fmt, ap) < 0)
                p = NULL;
        va_end(ap);
        if (!p)
                return;
        if (asprintf(&n, "%s%s%s", *problems ?: "", *problems ? "; " : "", p) < 0)
                return;
        free(*problems);
        *problems = n;
}

void operation_param_check_integer(const OperationParam *p, int64_t v, char **problems) {
        if (p->min == 0 && p->max == 0)
                return;
        if (v >= p->min && v <= p->max)
                return;
        switch (p->range_wording) {
        case PARAM_RANGE_BOUNDS_APART:
                if (v < p->min)
                        operation_problem(problems, "%s must be at least %" PRIi64, p->name, p->min);
                else
                        operation_problem(problems, "%s must be at most %" PRIi64, p->name, p->max);
                return;
        case PARAM_RANGE_BETWEEN:
                operation_problem(
                        problems,
                        "%s %" PRIi64 " must be between %" PRIi64 " and %" PRIi64,
                        p->name,
                        v,
                        p->min,
                        p->max);
                return;
        case PARAM_RANGE_PARENTHESIZED:
                operation_problem(
                        problems,
                        "%s: %" PRIi64 " is out of range (%" PRIi64 "..%" PRIi64 ")",
                        p->name,
                        v,
                        p->min,
                        p->max);
                return;
        case PARAM_RANGE_UNSTATED:
                operation_problem(problems, "%s %" PRIi64 " out of range", p->name, v);
                return;
        default:
                operation_problem(problems, "%s must be %" PRIi64 "..%" PRIi64, p->name, p->min, p->max);
                return;
        }
}

void operation_args_done(const Operation *op, void *args) {
        uint8_t *a = args;

        if (!op || !args)
                return;
        if (op->args_done) {
                op->args_done(args);
                return;
        }
        for (const OperationParam *p = op->params; p->name; p++) {
                void *field = a + p->offset;

                switch (p->type) {
                case PARAM_STRING:
                        *(char **) field = mfree(*(char **) field);
                        break;
                case PARAM_STRING_ARRAY:
                        *(char ***) field = strv_free(*(char ***) field);
                        break;
                case PARAM_STRING_MAP:
                        json_decref(*(json_t **) field);
                        *(json_t **) field = NULL;
                        break;
                default:
                        break;
                }
        }
}

/* A PARAM_NOT_EMPTY parameter given empty: "" or []. */
static bool param_given_empty(const OperationParam *p, const uint8_t *args) {
        if (!(p->flags & PARAM_NOT_EMPTY))
                return false;
        if (p->type == PARAM_STRING) {
                const char *s = *(char *const *) (args + p->offset);
                return s && !*s;
        }
        if (p->type == PARAM_STRING_ARRAY) {
                char *const *l = *(char **const *) (args + p->offset);
                return l && !l[0];
        }
        return false;
}

/* One parameter into its place in the arguments struct: the value, or its default when absent or
 * null. The shape was checked by operation_check_args(). */
static int decode_param(const OperationParam *p, json_t *v, uint8_t *args) {
        void *dest = args + p->offset;

        if (json_is_null(v))
                v = NULL;
        switch (p->type) {
        case PARAM_STRING: {
                const char *s = v ? json_string_value(v) : p->default_string;
                if (s && !(*(char **) dest = strdup(s)))
                        return -ENOMEM;
                return 0;
        }
        case PARAM_INTEGER:
                *(int64_t *) dest = v ? (int64_t) json_integer_value(v) : p->default_integer;
                return 0;
        case PARAM_BOOLEAN:
                *(int *) dest = v ? json_is_true(v) : p->default_integer != 0;
                return 0;
        case PARAM_STRING_ARRAY: {
                _cleanup_strv_free_ char **l = NULL;
                size_t n = json_array_size(v);

                if (!v)
                        return 0;
                l = calloc(n + 1, sizeof(char *));
                if (!l)
                        return -ENOMEM;
                for (size_t i = 0; i < n; i++)
                        if (!(l[i] = strdup(json_string_value(json_array_get(v, i)))))
                                return -ENOMEM;
                *(char ***) dest = TAKE_PTR(l);
                return 0;
        }
        case PARAM_STRING_MAP:
                *(json_t **) dest = json_incref(v);
                return 0;
        default:
                return -EINVAL;
        }
}

/* A decoded parameter's own limits: not empty, in range, valid. */
static void check_param(const OperationParam *p, const uint8_t *args, char **problems) {
        const void *src = args + p->offset;

        if (p->type == PARAM_INTEGER)
                operation_param_check_integer(p, *(const int64_t *) src, problems);
        if (p->type == PARAM_STRING) {
                const char *s = *(char *const *) src;

                if (!s)
                        return;
                if (!*s && (p->flags & PARAM_NOT_EMPTY))
                        return; /* said first, by operation_decode() */
                if (p->valid && !p->valid(s))
                        operation_problem(problems, "%s %s", p->name, p->invalid_text);
        }
}

int operation_decode(const Operation *op, json_t *args, void *ret, ApiError *reterr) {
        _cleanup_free_ char *problems = NULL;
        uint8_t *a = ret;
        int r;

        assert_return(op && op->args_size > 0 && ret, -EINVAL);

        r = operation_check_args(op, args, reterr);
        if (r < 0)
                return r;

        memset(a, 0, op->args_size);
        for (const OperationParam *p = op->params; p->name; p++) {
                r = decode_param(p, json_object_get(args, p->name), a);
                if (r < 0)
                        goto fail;
        }
        /* the empty values first: "leave it out" is the answer whatever else is wrong */
        for (const OperationParam *p = op->params; p->name; p++) {
                if (!param_given_empty(p, a))
                        continue;
                if (p->flags & PARAM_REQUIRED)
                        operation_problem(&problems, "%s is empty", p->name);
                else
                        operation_problem(
                                &problems,
                                "%s must not be empty (leave it out for %s)",
                                p->name,
                                p->absent_means ?: "the default");
        }
        for (const OperationParam *p = op->params; p->name; p++)
                check_param(p, a, &problems);
        if (op->args_check) {
                r = op->args_check(a, &problems);
                if (r < 0)
                        goto fail;
        }
        if (problems) {
                r = api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "%s", problems);
                goto fail;
        }
        return 0;

fail:
        operation_args_done(op, a);
        memset(a, 0, op->args_size);
        return r;
}

/* The request a handler gets: the arguments checked and, for an operation that declares them,
 * decoded; released by operation_request_done() once the handler returned. */
static int operation_request_begin(
        const Operation *op, json_t *args, const Caller *caller, OperationRequest *req, ApiError *reterr) {
        _cleanup_free_ void *decoded = NULL;
        int r;

        if (op->args_size == 0) {
                r = operation_check_args(op, args, reterr);
                if (r < 0)
                        return r;
        } else {
                decoded = malloc(op->args_size);
                if (!decoded)
                        return -ENOMEM;
                r = operation_decode(op, args, decoded, reterr);
                if (r < 0)
                        return r;
        }
        req->args = args;
        req->decoded = TAKE_PTR(decoded);
        req->caller = caller;
        return 0;
}

static void operation_request_done(OperationRequest *req) {
        operation_args_done(req->op, req->decoded);
        req->decoded = mfree(req->decoded);
}

/* An answer that reports a change waits until the records written for it (and before it) are on
 * disk: the operation's result is held until a barrier of the manager's writer comes back. */
typedef struct SyncedCall {
        OperationDone done;
        void *userdata;
        int r;
        json_t *result;
        ApiError error;
} SyncedCall;

static SyncedCall *synced_call_free(SyncedCall *c) {
        if (!c)
                return NULL;
        json_decref(c->result);
        api_error_done(&c->error);
        free(c);
        return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(SyncedCall *, synced_call_free);

static void synced_answer(int r, const char *path, void *userdata) {
        _cleanup_(synced_call_freep) SyncedCall *c = userdata;

        c->done(c->r, c->result, c->r < 0 ? &c->error : NULL, c->userdata);
}

/* Keeps the operation's outcome and asks for the barrier; without one (out of memory) it answers
 * at once. */
static void synced_done(Manager *m, SyncedCall *c, int r, json_t *result, const ApiError *e) {
        c->r = r;
        c->result = json_incref(result);
        if (r < 0 && e) {
                /* a copy as it is: its message already carries the code's sentinel */
                c->error = (ApiError){
                        .error = e->error,
                        .code = e->code,
                        .message = e->message ? strdup(e->message) : NULL,
                        .details = json_incref(e->details),
                };
                if (e->message && !c->error.message)
                        (void) api_error_set(&c->error, e->error, e->code, "out of memory");
        } else if (r < 0)
                api_error_from_errno(&c->error, r, "operation");
        /* nothing queued: every write asked for is done, the answer goes now */
        if (file_writer_pending(manager_writer(m)) == 0 || manager_sync(m, synced_answer, c) < 0)
                synced_answer(0, /* path= */ NULL, c);
}

typedef struct AsyncCall {
        Manager *manager;
        SyncedCall *synced;
        OperationProgress progress;
} AsyncCall;

static void async_done(int r, json_t *result, const ApiError *e, void *userdata) {
        AsyncCall *a = userdata;

        synced_done(a->manager, a->synced, r, result, e);
        free(a);
}

static void async_progress(const char *message, void *userdata) {
        AsyncCall *a = userdata;

        if (a->progress)
                a->progress(message, a->synced->userdata);
}

int operation_run_async(
        const Operation *op,
        Manager *m,
        const Caller *caller,
        json_t *args,
        OperationDone done,
        OperationProgress progress,
        void *userdata,
        ApiError *reterr) {
        _cleanup_(synced_call_freep) SyncedCall *c = NULL;
        _cleanup_free_ AsyncCall *a = NULL;
        _cleanup_(operation_request_done) OperationRequest req = { .op = op };
        int r;

        assert_return(op->async_handler || !(op->hints & OP_READ_ONLY), -EINVAL);
        c = calloc(1, sizeof(SyncedCall));
        if (!c)
                return -ENOMEM;
        *c = (SyncedCall){ .done = done, .userdata = userdata, .error = API_ERROR_NULL };

        if (!op->async_handler) {
                /* a change answered at once: the answer waits for its records all the same */
                json_auto_t *result = NULL;

                r = operation_run(op, m, caller, args, &result, reterr);
                if (r < 0)
                        return r;
                synced_done(m, TAKE_PTR(c), 0, result, /* e= */ NULL);
                return 0;
        }

        r = operation_request_begin(op, args, caller, &req, reterr);
        if (r < 0)
                return r;
        a = calloc(1, sizeof(AsyncCall));
        if (!a)
                return -ENOMEM;
        *a = (AsyncCall){ .manager = m, .synced = c, .progress = progress };
        r = op->async_handler(m, &req, async_done, progress ? async_progress : NULL, a, reterr);
        if (r < 0) {
                api_error_from_errno(reterr, r, op->name);
                return r;
        }
        /* async_done() owns both now, whether it ran already or will */
        TAKE_PTR(a);
        TAKE_PTR(c);
        manager_touch(m);
        return 0;
}

int operation_run(
        const Operation *op, Manager *m, const Caller *caller, json_t *args, json_t **ret, ApiError *reterr) {
        _cleanup_(operation_request_done) OperationRequest req = { .op = op };
        json_auto_t *result = NULL;
        int r;

        r = operation_request_begin(op, args, caller, &req, reterr);
        if (r < 0)
                return r;
        r = op->handler(m, &req, &result, reterr);
        if (r < 0) {
                api_error_from_errno(reterr, r, op->name);
                return r;
        }
        if (!(op->hints & OP_READ_ONLY))
                manager_touch(m);
        *ret = TAKE_PTR(result);
        return 0;
}

const char *param_type_to_json_schema(ParamType t) {
        switch (t) {
        case PARAM_STRING:
                return "string";
        case PARAM_INTEGER:
                return "integer";
        case PARAM_BOOLEAN:
                return "boolean";
        case PARAM_STRING_ARRAY:
                return "array";
        case PARAM_STRING_MAP:
                return "object";
        default:
                return NULL;
        }
}

json_t *operation_tool_json(const Operation *op) {
        json_auto_t *props = json_object(), *required = json_array(), *tool = NULL;

        if (!props || !required)
                return NULL;
        for (const OperationParam *p = op->params; p->name; p++) {
                json_auto_t *s = json_pack(
                        "{s:s,s:s}", "type", param_type_to_json_schema(p->type), "description", p->description);
                if (!s)
                        return NULL;
                if (p->type == PARAM_STRING_ARRAY &&
                    json_object_set_new(s, "items", json_pack("{s:s}", "type", "string")) < 0)
                        return NULL;
                if (p->type == PARAM_STRING_MAP &&
                    json_object_set_new(s, "additionalProperties", json_pack("{s:s}", "type", "string")) < 0)
                        return NULL;
                if (p->enum_values) {
                        json_t *e = json_array();
                        for (const char *const *i = p->enum_values; *i; i++)
                                json_array_append_new(e, json_string(*i));
                        if (json_object_set_new(s, "enum", e) < 0)
                                return NULL;
                }
                /* the limits and defaults the decoder applies, as JSON Schema says them */
                if (p->min != 0 || p->max != 0) {
                        if (json_object_set_new(s, "minimum", json_integer(p->min)) < 0 ||
                            json_object_set_new(s, "maximum", json_integer(p->max)) < 0)
                                return NULL;
                }
                if (p->type == PARAM_STRING && p->max_length > 0 &&
                    json_object_set_new(s, "maxLength", json_integer((json_int_t) p->max_length)) < 0)
                        return NULL;
                if (p->type == PARAM_STRING && (p->flags & PARAM_NOT_EMPTY) &&
                    json_object_set_new(s, "minLength", json_integer(1)) < 0)
                        return NULL;
                if (p->type == PARAM_STRING_ARRAY && (p->flags & PARAM_NOT_EMPTY) &&
                    json_object_set_new(s, "minItems", json_integer(1)) < 0)
                        return NULL;
                /* a required parameter has no default to state */
                if (op->args_size > 0 && !(p->flags & PARAM_REQUIRED)) {
                        json_t *d = NULL;

                        if (p->type == PARAM_STRING && p->default_string)
                                d = json_string(p->default_string);
                        else if (p->type == PARAM_INTEGER)
                                d = json_integer(p->default_integer);
                        else if (p->type == PARAM_BOOLEAN)
                                d = json_boolean(p->default_integer != 0);
                        if (d && json_object_set_new(s, "default", d) < 0)
                                return NULL;
                }
                if (json_object_set(props, p->name, s) < 0)
                        return NULL;
                if ((p->flags & PARAM_REQUIRED) && json_array_append_new(required, json_string(p->name)) < 0)
                        return NULL;
        }

        tool = json_pack(
                "{s:s,s:s,s:{s:s,s:O,s:O,s:b},s:{s:b,s:b,s:b,s:b}}",
                "name",
                op->name,
                "description",
                op->description,
                "inputSchema",
                "type",
                "object",
                "properties",
                props,
                "required",
                required,
                "additionalProperties",
                false,
                "annotations",
                "readOnlyHint",
                (op->hints & OP_READ_ONLY) != 0,
                "destructiveHint",
                (op->hints & OP_DESTRUCTIVE) != 0,
                "idempotentHint",
                (op->hints & OP_IDEMPOTENT) != 0,
                "openWorldHint",
                (op->hints & OP_OPEN_WORLD) != 0);
        return TAKE_PTR(tool);
}
