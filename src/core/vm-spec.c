/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "json-util.h"
#include "operation.h"
#include "parse-util.h"
#include "vm-ignition.h"
#include "vm-spec.h"

void vm_spec_done(VmSpec *s) {
        free(s->name);
        free(s->image);
        free(s->kubernetes_version);
        free(s->network);
        strv_free(s->ssh_authorized_keys);
        free(s->hostname);
        json_decref(s->metadata);
        free(s->region);
        free(s->zone);
        *s = (VmSpec){};
}

void vm_spec_input_done(VmSpecInput *c) {
        free(c->name);
        free(c->image);
        free(c->kubernetes_version);
        free(c->network);
        free(c->user_data);
        free(c->hostname);
        free(c->wait_for);
        free(c->install_mode);
        strv_free(c->ssh_authorized_keys);
        json_decref(c->metadata);
        *c = VM_SPEC_INPUT_NULL;
}

/* The rules of a spec that no single field's declaration says: a hostname defaults to the name (so a
 * bad name is a bad hostname too), metadata keys, key lines. request adds the limits on counts and
 * totals, which records written before them skip. */
static void check_rules(const VmSpecInput *c, bool request, char **problems) {
        size_t total = 0, n = 0;
        const char *key;
        json_t *val;

        if (!c->hostname && !dns_label_is_valid(c->name))
                operation_problem(problems, "hostname must be a DNS label");
        if (c->metadata)
                json_object_foreach(c->metadata, key, val) {
                        if (!*key || strpbrk(key, "/ \t\n\r"))
                                operation_problem(
                                        problems,
                                        "metadata key \"%s\" must not be empty or contain slashes or spaces",
                                        key);
                        else if (!json_is_string(val))
                                operation_problem(problems, "metadata value of \"%s\" must be a string", key);
                }
        for (char **k = c->ssh_authorized_keys; k && *k; k++)
                if (strpbrk(*k, "\r\n")) {
                        operation_problem(problems, "ssh authorized keys must be single lines");
                        break;
                }
        if (!request)
                return;

        for (char **k = c->ssh_authorized_keys; k && *k; k++, n++)
                total += strlen(*k) + 1;
        if (n > VM_SSH_KEYS_MAX)
                operation_problem(problems, "at most %u ssh authorized keys", VM_SSH_KEYS_MAX);
        else if (total > VM_SSH_KEYS_TOTAL_MAX)
                operation_problem(
                        problems,
                        "ssh authorized keys must be at most %u bytes together",
                        VM_SSH_KEYS_TOTAL_MAX);
        if (c->metadata) {
                total = 0;
                if (json_object_size(c->metadata) > VM_METADATA_MAX)
                        operation_problem(problems, "metadata must have at most %u entries", VM_METADATA_MAX);
                json_object_foreach(c->metadata, key, val) {
                        if (strlen(key) > VM_METADATA_KEY_MAX) {
                                operation_problem(
                                        problems, "metadata keys must be at most %u bytes", VM_METADATA_KEY_MAX);
                                break;
                        }
                        total += strlen(key) + json_string_length(val);
                }
                if (total > VM_METADATA_TOTAL_MAX)
                        operation_problem(
                                problems, "metadata must be at most %u bytes together", VM_METADATA_TOTAL_MAX);
        }
}

/* Cluster API's Ignition output is spec 2.3; the guest's Ignition reads 3.x (vm-ignition.h). Only a
 * request that passed everything else is translated. */
static int translate_user_data(VmSpecInput *c, char **problems) {
        _cleanup_free_ char *translated = NULL, *why = NULL;
        int r;

        if (!c->user_data || *problems)
                return 0;
        r = vm_ignition_translate(c->user_data, strlen(c->user_data), &translated, &why);
        if (r == -ENOMEM)
                return -ENOMEM;
        if (r < 0)
                operation_problem(
                        problems, "user_data is an Ignition 2.x config that has no 3.x equivalent: %s", why);
        else if (r > 0) {
                free(c->user_data);
                c->user_data = TAKE_PTR(translated);
        }
        return 0;
}

int vm_spec_check_request(void *args, char **problems) {
        VmSpecInput *c = args;

        check_rules(c, /* request= */ true, problems);
        return translate_user_data(c, problems);
}

/* A record's field checked against the declaration of create_vm's parameter of that name: the same
 * range and rule a request meets. */
static void check_record_field(const char *name, int64_t v, const char *s, char **problems) {
        const OperationParam *p = operation_param_find(operation_find("create_vm"), name);

        assert(p);
        if (p->type == PARAM_INTEGER)
                operation_param_check_integer(p, v, problems);
        else if (p->valid && !p->valid(s))
                operation_problem(problems, "%s %s", name, p->invalid_text);
}

/* A count or string absent from a record, or one written before 0 and "" were refused: the default. */
static bool count_unset(int64_t v) {
        return v == VM_SPEC_UNSET || v == 0;
}

static bool string_unset(const char *s) {
        return !s || !*s;
}

int vm_spec_build(
        VmSpecInput *in, bool request, VmSpec *ret, char **ret_user_data, VmWaitFor *ret_wait_for, ApiError *reterr) {
        _cleanup_(vm_spec_input_done) VmSpecInput c = TAKE_GENERIC(*in, VmSpecInput, VM_SPEC_INPUT_NULL);
        _cleanup_free_ char *problems = NULL;
        VmWaitFor w = VM_WAIT_READY;

        if (!request) {
                /* A record: what a request's decoding did (defaults, each field's declared limits)
                 * is done here from the same declarations, without the limits that came later. */
                if (count_unset(c.cpus))
                        c.cpus = VM_CPUS_DEFAULT;
                if (count_unset(c.memory_mib))
                        c.memory_mib = VM_MEMORY_MIB_DEFAULT;
                if (count_unset(c.disk_gib))
                        c.disk_gib = VM_DISK_GIB_DEFAULT;
                if (string_unset(c.network)) {
                        free(c.network);
                        c.network = strdup(VM_NETWORK_DEFAULT);
                        if (!c.network)
                                return -ENOMEM;
                }
                if (string_unset(c.hostname))
                        c.hostname = mfree(c.hostname);
                if (c.require_attestation < 0)
                        c.require_attestation = 1;
                check_record_field("name", 0, c.name, &problems);
                if (c.hostname)
                        check_record_field("hostname", 0, c.hostname, &problems);
                check_record_field("cpus", c.cpus, NULL, &problems);
                check_record_field("memory_mib", c.memory_mib, NULL, &problems);
                check_record_field("disk_gib", c.disk_gib, NULL, &problems);
                if (c.install_mode && *c.install_mode && vm_install_mode_from_string(c.install_mode) < 0)
                        operation_problem(&problems, "install_mode must be host or boot");
                check_rules(&c, /* request= */ false, &problems);
                if (problems)
                        return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "%s", problems);
        }

        /* a request's fields were decoded and checked by the operation table (operation_decode()) */
        if (!c.hostname && c.name && !(c.hostname = strdup(c.name)))
                return -ENOMEM;
        if (c.wait_for)
                w = vm_wait_for_from_string(c.wait_for);
        assert(w >= 0 || !request);

        *ret = (VmSpec){
                .name = TAKE_PTR(c.name),
                .image = TAKE_PTR(c.image),
                .kubernetes_version = TAKE_PTR(c.kubernetes_version),
                .cpus = (unsigned) c.cpus,
                .memory_mib = (uint64_t) c.memory_mib,
                .disk_gib = (uint64_t) c.disk_gib,
                .network = TAKE_PTR(c.network),
                .ssh_authorized_keys = TAKE_PTR(c.ssh_authorized_keys),
                .hostname = TAKE_PTR(c.hostname),
                .metadata = TAKE_PTR(c.metadata),
                .require_attestation = c.require_attestation != 0,
                .install_mode = c.install_mode && *c.install_mode ?
                        vm_install_mode_from_string(c.install_mode) :
                        _VM_INSTALL_INVALID,
        };
        if (ret_user_data)
                *ret_user_data = TAKE_PTR(c.user_data);
        if (ret_wait_for)
                *ret_wait_for = w;
        return 0;
}

int vm_spec_from_request(
        json_t *request, VmSpec *ret, char **ret_user_data, VmWaitFor *ret_wait_for, ApiError *reterr) {
        _cleanup_(vm_spec_input_done) VmSpecInput c = VM_SPEC_INPUT_NULL;
        int r;

        r = operation_decode(operation_find("create_vm"), request, &c, reterr);
        if (r < 0)
                return r;
        return vm_spec_build(&c, /* request= */ true, ret, ret_user_data, ret_wait_for, reterr);
}

static int json_set_str(json_t *o, const char *key, const char *s) {
        if (!s || !*s)
                return 0;
        return json_object_set_new(o, key, json_string(s));
}

int vm_spec_to_json(const VmSpec *s, json_t *o) {
        if (json_object_set_new(o, "name", json_string(s->name)) < 0 ||
            json_object_set_new(o, "image", json_string(s->image)) < 0 ||
            json_set_str(o, "kubernetesVersion", s->kubernetes_version) < 0 ||
            json_object_set_new(o, "cpus", json_integer(s->cpus)) < 0 ||
            json_object_set_new(o, "memoryMiB", json_integer((json_int_t) s->memory_mib)) < 0 ||
            json_object_set_new(o, "diskGiB", json_integer((json_int_t) s->disk_gib)) < 0 ||
            json_object_set_new(o, "network", json_string(s->network)) < 0)
                return -ENOMEM;
        if (s->ssh_authorized_keys && s->ssh_authorized_keys[0]) {
                json_t *a = json_array();
                for (char **k = s->ssh_authorized_keys; a && *k; k++)
                        if (json_array_append_new(a, json_string(*k)) < 0)
                                return -ENOMEM;
                if (json_object_set_new(o, "sshAuthorizedKeys", a) < 0)
                        return -ENOMEM;
        }
        if (json_set_str(o, "hostname", s->hostname) < 0)
                return -ENOMEM;
        if (s->metadata && json_object_size(s->metadata) > 0 && json_object_set(o, "metadata", s->metadata) < 0)
                return -ENOMEM;
        if (json_set_str(o, "region", s->region) < 0 || json_set_str(o, "zone", s->zone) < 0 ||
            json_object_set_new(o, "requireAttestation", json_boolean(s->require_attestation)) < 0)
                return -ENOMEM;
        return 0;
}
