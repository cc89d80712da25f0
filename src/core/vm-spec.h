/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What create_vm builds: a request in, a spec with the API's defaults applied and every field checked
 * out. Pure: nothing here looks at images, networks or the disk (vm-ops.c resolves those). The same
 * checks load the spec part of a record again (vm-record.c), without the request's rules that came
 * later (the size limits, no 0 or ""). */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "api-error.h"
#include "core-forward.h"
#include "vm-state.h"

struct VmSpec {
        char *name;
        char *image; /* resolved "<id>_<version>" once created */
        char *kubernetes_version;
        unsigned cpus;
        uint64_t memory_mib;
        uint64_t disk_gib;
        char *network;
        char **ssh_authorized_keys;
        char *hostname;
        json_t *metadata; /* object of strings, or NULL */
        char *region;
        char *zone;
        bool require_attestation;
        VmInstallMode install_mode; /* as asked (create_vm's install_mode); _VM_INSTALL_INVALID: the
                                     * daemon's --install-mode. Not in the record: VmRecord has the one used */
};

void vm_spec_done(VmSpec *s);

/* Limits of what create_vm takes (api/openapi.yaml documents them): they keep a VM's record, its
 * QEMU argv (the keys travel as an SMBIOS credential, one argument, which the kernel caps at 128 KiB)
 * and the metadata service's answers bounded, and they are checked before anything is allocated. */
#define VM_SSH_KEYS_MAX 32U
#define VM_SSH_KEY_MAX 4096U                  /* bytes of one key line */
#define VM_SSH_KEYS_TOTAL_MAX (32U * 1024U)   /* bytes of all keys */
#define VM_METADATA_MAX 64U                   /* entries */
#define VM_METADATA_KEY_MAX 128U              /* bytes */
#define VM_METADATA_VALUE_MAX (16U * 1024U)   /* bytes */
#define VM_METADATA_TOTAL_MAX (64U * 1024U)   /* bytes of keys and values */
#define VM_USER_DATA_MAX (1U * 1024U * 1024U) /* bytes */
#define VM_REF_MAX 255U                       /* bytes of image, kubernetes_version, network */

/* The API's defaults. */
#define VM_CPUS_DEFAULT 2
#define VM_MEMORY_MIB_DEFAULT 2048
#define VM_MEMORY_MIB_MAX (16 * 1024 * 1024)
#define VM_DISK_GIB_DEFAULT 20
#define VM_NETWORK_DEFAULT "default"

/* The fields as they come. From a record, before defaults: NULL, VM_SPEC_UNSET or -1
 * (require_attestation) when absent (or null). From a request, as create_vm's operation table decoded
 * them (its parameters' offsets point here), with its defaults; hostname NULL when absent. */
#define VM_SPEC_UNSET INT64_MIN

typedef struct VmSpecInput {
        char *name, *image, *kubernetes_version, *network, *user_data, *hostname, *wait_for, *install_mode;
        int64_t cpus, memory_mib, disk_gib;
        char **ssh_authorized_keys;
        json_t *metadata;
        int require_attestation;
} VmSpecInput;

#define VM_SPEC_INPUT_NULL                           \
        ((VmSpecInput){ .cpus = VM_SPEC_UNSET,       \
                        .memory_mib = VM_SPEC_UNSET, \
                        .disk_gib = VM_SPEC_UNSET,   \
                        .require_attestation = -1 })

void vm_spec_input_done(VmSpecInput *in);

/* create_vm's args_check (operation.h): the rules its parameters' declarations cannot say, each
 * relating fields or entries to each other (a hostname defaults to the name; counts and totals of keys
 * and metadata; metadata key names; single-line keys), then user_data translated from Ignition 2.x
 * when all else passed. args is a VmSpecInput the table decoded. */
int vm_spec_check_request(void *args, char **problems);

/* The spec of a VmSpecInput; takes the strings out of in. request: in was decoded and checked by
 * create_vm's operation table (operation_decode()), defaults included, and only the hostname (the
 * name) is filled in. A record (!request) gets here what a request's decoding does, from the same
 * declarations: the defaults (0 and "" meaning the default, as they did when the record was written)
 * and each field's range and rule, and the rules of vm_spec_check_request() except the limits on
 * counts and totals that came later. Every problem is collected into one invalid_request message. */
int vm_spec_build(
        VmSpecInput *in, bool request, VmSpec *ret, char **ret_user_data, VmWaitFor *ret_wait_for, ApiError *reterr);

/* Decodes and validates a create_vm request as the operation table does (operation_decode()), then
 * builds the spec. ret_user_data and ret_wait_for (optional) are the parts that never enter the
 * record. */
int vm_spec_from_request(
        json_t *request, VmSpec *ret, char **ret_user_data, VmWaitFor *ret_wait_for, ApiError *reterr);

/* Appends the spec to a record as the API shows it (camelCase, the reference's key order): name,
 * image, kubernetesVersion, cpus, memoryMiB, diskGiB, network, sshAuthorizedKeys, hostname, metadata,
 * region, zone, requireAttestation; empty optional fields are left out. */
int vm_spec_to_json(const VmSpec *s, json_t *o);
