/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "json-util.h"
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

static int dispatch_tristate(const char *name, json_t *v, void *dest, ApiError *reterr) {
        if (!json_is_boolean(v))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "field \"%s\": expected a boolean, got %s",
                        name,
                        json_type_name(v));
        *(int *) dest = json_is_true(v);
        return 0;
}

/* An integer; the one that spells VM_SPEC_UNSET is out of every range as its neighbour is, not absent. */
static int dispatch_count(const char *name, json_t *v, void *dest, ApiError *reterr) {
        int r = json_dispatch_int64(name, v, dest, reterr);

        if (r >= 0 && *(int64_t *) dest == VM_SPEC_UNSET)
                *(int64_t *) dest = VM_SPEC_UNSET + 1;
        return r;
}

/* Appends "; "-separated problems. */
static void problem(char **acc, const char *fmt, ...) _printf_(2, 3);
static void problem(char **acc, const char *fmt, ...) {
        _cleanup_free_ char *p = NULL;
        char *n = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&p, fmt, ap) < 0)
                p = NULL;
        va_end(ap);
        if (!p)
                return;
        if (asprintf(&n, "%s%s%s", *acc ?: "", *acc ? "; " : "", p) < 0)
                return;
        free(*acc);
        *acc = n;
}

/* The size limits of a request (vm-spec.h). Records written before they existed still load, so a
 * record is checked for its shape only. */
static void check_limits(const VmSpecInput *c, char **problems) {
        size_t total = 0, n = 0;
        const char *key;
        json_t *val;

        if (c->image && strlen(c->image) > VM_REF_MAX)
                problem(problems, "image must be at most %u bytes", VM_REF_MAX);
        if (c->kubernetes_version && strlen(c->kubernetes_version) > VM_REF_MAX)
                problem(problems, "kubernetes_version must be at most %u bytes", VM_REF_MAX);
        if (c->network && strlen(c->network) > VM_REF_MAX)
                problem(problems, "network must be at most %u bytes", VM_REF_MAX);
        for (char **k = c->ssh_authorized_keys; k && *k; k++, n++) {
                if (strlen(*k) > VM_SSH_KEY_MAX) {
                        problem(problems, "ssh authorized keys must be at most %u bytes each", VM_SSH_KEY_MAX);
                        break;
                }
                total += strlen(*k) + 1;
        }
        if (n > VM_SSH_KEYS_MAX)
                problem(problems, "at most %u ssh authorized keys", VM_SSH_KEYS_MAX);
        else if (total > VM_SSH_KEYS_TOTAL_MAX)
                problem(problems,
                        "ssh authorized keys must be at most %u bytes together",
                        VM_SSH_KEYS_TOTAL_MAX);
        if (c->metadata) {
                total = 0;
                if (json_object_size(c->metadata) > VM_METADATA_MAX)
                        problem(problems, "metadata must have at most %u entries", VM_METADATA_MAX);
                json_object_foreach(c->metadata, key, val) {
                        if (strlen(key) > VM_METADATA_KEY_MAX) {
                                problem(problems, "metadata keys must be at most %u bytes", VM_METADATA_KEY_MAX);
                                break;
                        }
                        if (json_string_length(val) > VM_METADATA_VALUE_MAX) {
                                problem(problems,
                                        "metadata value of \"%s\" must be at most %u bytes",
                                        key,
                                        VM_METADATA_VALUE_MAX);
                                break;
                        }
                        total += strlen(key) + json_string_length(val);
                }
                if (total > VM_METADATA_TOTAL_MAX)
                        problem(problems, "metadata must be at most %u bytes together", VM_METADATA_TOTAL_MAX);
        }
        if (c->user_data && strlen(c->user_data) > VM_USER_DATA_MAX)
                problem(problems, "user_data must be at most %u bytes", VM_USER_DATA_MAX);
}

/* A count absent, or in a record written before 0 was refused: the default. */
static bool count_unset(int64_t v, bool request) {
        return v == VM_SPEC_UNSET || (!request && v == 0);
}

/* A request's "" is refused (absent or null asks for the default); a record's means the default. */
static bool string_unset(const char *s, bool request) {
        return !s || (!request && !*s);
}

int vm_spec_build(
        VmSpecInput *in, bool request, VmSpec *ret, char **ret_user_data, VmWaitFor *ret_wait_for, ApiError *reterr) {
        _cleanup_(vm_spec_input_done) VmSpecInput c = TAKE_GENERIC(*in, VmSpecInput, VM_SPEC_INPUT_NULL);
        _cleanup_free_ char *problems = NULL;
        VmWaitFor w;
        const char *key;
        json_t *val;

        if (request) {
                static const struct {
                        const char *name;
                        size_t offset;
                } strings[] = {
                        { "image", offsetof(VmSpecInput, image) },
                        { "kubernetes_version", offsetof(VmSpecInput, kubernetes_version) },
                        { "network", offsetof(VmSpecInput, network) },
                        { "hostname", offsetof(VmSpecInput, hostname) },
                        { "wait_for", offsetof(VmSpecInput, wait_for) },
                        { "install_mode", offsetof(VmSpecInput, install_mode) },
                };

                for (size_t i = 0; i < ELEMENTSOF(strings); i++) {
                        const char *s = *(char **) ((uint8_t *) &c + strings[i].offset);

                        if (s && !*s)
                                problem(&problems,
                                        "%s must not be empty (leave it out for the default)",
                                        strings[i].name);
                }
        }

        /* defaults for what is absent; what is given is checked below as it is */
        if (count_unset(c.cpus, request))
                c.cpus = VM_CPUS_DEFAULT;
        if (count_unset(c.memory_mib, request))
                c.memory_mib = VM_MEMORY_MIB_DEFAULT;
        if (count_unset(c.disk_gib, request))
                c.disk_gib = VM_DISK_GIB_DEFAULT;
        if (string_unset(c.network, request)) {
                free(c.network);
                c.network = strdup(VM_NETWORK_DEFAULT);
        }
        if (string_unset(c.hostname, request) && c.name) {
                free(c.hostname);
                c.hostname = strdup(c.name);
        }
        if (!c.network || (c.name && !c.hostname))
                return -ENOMEM;

        if (!dns_label_is_valid(c.name))
                problem(&problems, "name must be a DNS label (lowercase letters, digits, dashes)");
        if (!(c.hostname && !*c.hostname) && !dns_label_is_valid(c.hostname)) /* "": said above */
                problem(&problems, "hostname must be a DNS label");
        if (c.cpus < 1 || c.cpus > 256)
                problem(&problems, "cpus must be 1..256");
        if (c.memory_mib < 256)
                problem(&problems, "memory_mib must be at least 256");
        else if (c.memory_mib > VM_MEMORY_MIB_MAX)
                problem(&problems, "memory_mib must be at most %d", VM_MEMORY_MIB_MAX);
        if (c.disk_gib < 1 || c.disk_gib > 4096)
                problem(&problems, "disk_gib must be 1..4096");
        w = c.wait_for && *c.wait_for ? vm_wait_for_from_string(c.wait_for) : VM_WAIT_READY;
        if (w < 0)
                problem(&problems, "wait_for must be none, installed, attested or ready");
        if (c.install_mode && *c.install_mode && vm_install_mode_from_string(c.install_mode) < 0)
                problem(&problems, "install_mode must be host or boot");
        if (c.metadata)
                json_object_foreach(c.metadata, key, val) {
                        if (!*key || strpbrk(key, "/ \t\n\r"))
                                problem(&problems,
                                        "metadata key \"%s\" must not be empty or contain slashes or spaces",
                                        key);
                        else if (!json_is_string(val))
                                problem(&problems, "metadata value of \"%s\" must be a string", key);
                }
        for (char **k = c.ssh_authorized_keys; k && *k; k++)
                if (strpbrk(*k, "\r\n")) {
                        problem(&problems, "ssh authorized keys must be single lines");
                        break;
                }
        if (request)
                check_limits(&c, &problems);
        /* Cluster API's Ignition output is spec 2.3; the guest's Ignition reads 3.x (vm-ignition.h) */
        if (c.user_data && !problems) {
                _cleanup_free_ char *translated = NULL, *why = NULL;
                int r = vm_ignition_translate(c.user_data, strlen(c.user_data), &translated, &why);

                if (r == -ENOMEM)
                        return -ENOMEM;
                if (r < 0)
                        problem(&problems,
                                "user_data is an Ignition 2.x config that has no 3.x equivalent: %s",
                                why);
                else if (r > 0) {
                        free(c.user_data);
                        c.user_data = TAKE_PTR(translated);
                }
        }
        if (problems)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "%s", problems);

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
        static const JsonDispatch table[] = {
                { "name", json_dispatch_string, offsetof(VmSpecInput, name), JSON_NULLABLE },
                { "image", json_dispatch_string, offsetof(VmSpecInput, image), JSON_NULLABLE },
                { "kubernetes_version",
                  json_dispatch_string,
                  offsetof(VmSpecInput, kubernetes_version),
                  JSON_NULLABLE },
                { "cpus", dispatch_count, offsetof(VmSpecInput, cpus), JSON_NULLABLE },
                { "memory_mib", dispatch_count, offsetof(VmSpecInput, memory_mib), JSON_NULLABLE },
                { "disk_gib", dispatch_count, offsetof(VmSpecInput, disk_gib), JSON_NULLABLE },
                { "network", json_dispatch_string, offsetof(VmSpecInput, network), JSON_NULLABLE },
                { "user_data", json_dispatch_string, offsetof(VmSpecInput, user_data), JSON_NULLABLE },
                { "ssh_authorized_keys",
                  json_dispatch_strv,
                  offsetof(VmSpecInput, ssh_authorized_keys),
                  JSON_NULLABLE },
                { "hostname", json_dispatch_string, offsetof(VmSpecInput, hostname), JSON_NULLABLE },
                { "metadata", json_dispatch_object, offsetof(VmSpecInput, metadata), JSON_NULLABLE },
                { "require_attestation",
                  dispatch_tristate,
                  offsetof(VmSpecInput, require_attestation),
                  JSON_NULLABLE },
                { "wait_for", json_dispatch_string, offsetof(VmSpecInput, wait_for), JSON_NULLABLE },
                { "install_mode", json_dispatch_string, offsetof(VmSpecInput, install_mode), JSON_NULLABLE },
                {},
        };
        _cleanup_(vm_spec_input_done) VmSpecInput c = VM_SPEC_INPUT_NULL;
        int r;

        r = json_dispatch(request, table, &c, reterr);
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
