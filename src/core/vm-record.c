/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "json-util.h"
#include "parse-util.h"
#include "string-table.h"
#include "vm-record.h"

/* <state>/vms/<id>/vm.json, as written since the first release (keys in this order):
 *
 *   id, name, image, kubernetesVersion?, cpus, memoryMiB, diskGiB, network, sshAuthorizedKeys?,
 *   hostname?, metadata?, region?, zone?, requireAttestation, state, phase?, vsock? (since READY=1
 *   over the kernel's vhost-vsock; vhost-user before), installMode? (since the host install; boot
 *   before), processes? (on disk, while processes run:
 *   {"qemu"|"swtpm"|"vsock": {"pid", "unit"? (since the systemd launcher)}}), ip?, mac?, cid,
 *   machineID, booted, status?, sshPublicKey, attestation ({"required", "userDataReleased",
 *   "nonceIssuedAt"?, "initrd"?, "ready"?, "akPinned"? (on disk), "akActivated"? (since credential
 *   activation), "kernelCmdlineExtra"? (on disk, since PCR 12 is predicted), "bootedVersion"? (since
 * in-place updates), "credentialsWord"? (on disk, since PCR 12 covers credentials)}; the verdicts since
 * quotes were judged), createdAt, createdBy? (since OAuth), installedAt?, bootedAt?, readyAt?, lastError?,
 * consoleTail? (since failures kept the console), forwards (since forward_port kept them), paths ({"dir",
 * "volume", "console", "tpmState", "ovmfVars", "qmpSocket", "sshKey", "userData", "report", "qemuLog"}:
 * derived from the directory, only "volume" is read back).
 *
 * A key that was never written is refused, and so is a value of the wrong type: such a record is
 * quarantined (vm-load.c), never half loaded. */

#define FORWARD_ADDRESS_PREFIX "127.0.0.1:"

static const char *const vm_role_table[_VM_ROLE_MAX] = {
        [VM_ROLE_QEMU] = "qemu",
        [VM_ROLE_SWTPM] = "swtpm",
        [VM_ROLE_VSOCK] = "vsock",
};

DEFINE_STRING_TABLE_LOOKUP(vm_role, VmRole);

void vm_attestation_done(VmAttestation *a) {
        attest_result_done(&a->initrd);
        attest_result_done(&a->ready);
        free(a->ak_pin);
        free(a->ak_activated);
        free(a->ek_why);
        free(a->cmdline_extra);
        free(a->credentials_word);
        free(a->booted_version);
        *a = (VmAttestation){};
}

void vm_record_done(VmRecord *r) {
        free(r->id);
        vm_spec_done(&r->spec);
        free(r->ip);
        free(r->mac);
        free(r->status);
        free(r->ssh_public_key);
        vm_attestation_done(&r->att);
        json_decref(r->created_by);
        free(r->last_error);
        free(r->console_tail);
        free(r->volume);
        for (VmRole i = 0; i < _VM_ROLE_MAX; i++)
                free(r->processes[i].unit);
        *r = (VmRecord){};
}

VmForward *vm_forwards_find(VmForwards *f, uint16_t port) {
        for (size_t i = 0; i < f->n; i++)
                if (f->items[i].port == port)
                        return f->items + i;
        return NULL;
}

/* ---- to JSON ---------------------------------------------------------------------------------- */

int vm_json_set_time(json_t *o, const char *key, usec_t t) {
        char buf[RFC3339_MAX];

        if (t == 0)
                return 0;
        return json_object_set_new(o, key, json_string(format_rfc3339(t, buf)));
}

static int json_set_str(json_t *o, const char *key, const char *s) {
        if (!s || !*s)
                return 0;
        return json_object_set_new(o, key, json_string(s));
}

json_t *vm_forward_to_json(const VmForward *f) {
        char address[sizeof(FORWARD_ADDRESS_PREFIX) + 5];

        snprintf(address, sizeof(address), FORWARD_ADDRESS_PREFIX "%u", (unsigned) f->host_port);
        return json_pack("{s:i,s:s}", "port", (int) f->port, "address", address);
}

static json_t *forwards_to_json(const VmForwards *fw) {
        json_auto_t *a = json_array();

        if (!a)
                return NULL;
        for (size_t i = 0; i < fw->n; i++)
                if (json_array_append_new(a, vm_forward_to_json(fw->items + i)) < 0)
                        return NULL;
        return TAKE_PTR(a);
}

const char *vm_attestation_ak_trust(const VmAttestation *a) {
        return a->ak_activated ? "activated" : a->ak_pin ? "pinned" : "none";
}

json_t *vm_attestation_to_json_full(const VmAttestation *a, bool for_disk) {
        json_auto_t *o = json_pack("{s:b,s:b}", "required", a->required, "userDataReleased", a->released);

        if (!o)
                return NULL;
        if (vm_json_set_time(o, "nonceIssuedAt", a->nonce_issued_at) < 0)
                return NULL;
        if (a->has_initrd && json_object_set_new(o, "initrd", attest_result_to_json(&a->initrd)) < 0)
                return NULL;
        if (a->has_ready && json_object_set_new(o, "ready", attest_result_to_json(&a->ready)) < 0)
                return NULL;
        if (for_disk && a->ak_pin && json_object_set_new(o, "akPinned", json_string(a->ak_pin)) < 0)
                return NULL;
        if (a->ak_activated && json_object_set_new(o, "akActivated", json_string(a->ak_activated)) < 0)
                return NULL;
        if (!for_disk && json_object_set_new(o, "akTrust", json_string(vm_attestation_ak_trust(a))) < 0)
                return NULL;
        if (for_disk && a->ek_pending && json_object_set_new(o, "ekPending", json_true()) < 0)
                return NULL;
        /* a record from before EK certificates has none: absent, which is what the vTPM is */
        if (json_object_set_new(o, "ekCertificate", json_string(attest_ek_verdict_to_string(a->ek))) < 0)
                return NULL;
        if (a->ek_why && json_object_set_new(o, "ekCertificateMessage", json_string(a->ek_why)) < 0)
                return NULL;
        if (for_disk && a->cmdline_extra &&
            json_object_set_new(o, "kernelCmdlineExtra", json_string(a->cmdline_extra)) < 0)
                return NULL;
        if (for_disk && json_set_str(o, "credentialsWord", a->credentials_word) < 0)
                return NULL;
        if (json_set_str(o, "bootedVersion", a->booted_version) < 0)
                return NULL;
        return TAKE_PTR(o);
}

static json_t *processes_to_json(const VmRecord *r) {
        json_auto_t *p = json_object();
        bool any = false;

        if (!p)
                return NULL;
        for (VmRole i = 0; i < _VM_ROLE_MAX; i++) {
                json_t *e;

                if (r->processes[i].pid <= 0 && !r->processes[i].unit)
                        continue;
                e = json_pack("{s:i}", "pid", (int) r->processes[i].pid);
                if (!e || json_object_set_new(p, vm_role_to_string(i), e) < 0)
                        return NULL;
                if (r->processes[i].unit &&
                    json_object_set_new(e, "unit", json_string(r->processes[i].unit)) < 0)
                        return NULL;
                any = true;
        }
        return any ? TAKE_PTR(p) : json_null();
}

static json_t *paths_to_json(const VmRecord *r, const char *dir) {
        static const struct {
                const char *key, *name;
        } files[] = {
                { "console", "console.log" }, { "tpmState", "tpm" },     { "ovmfVars", "ovmf_vars.fd" },
                { "qmpSocket", "qmp.sock" },  { "sshKey", "ssh_key" },   { "userData", "user-data" },
                { "report", "report.json" },  { "qemuLog", "qemu.log" },
        };
        json_auto_t *o = json_pack("{s:s,s:s}", "dir", dir, "volume", r->volume ?: "");

        if (!o)
                return NULL;
        for (size_t i = 0; i < ELEMENTSOF(files); i++) {
                _cleanup_free_ char *p = NULL;

                if (asprintf(&p, "%s/%s", dir, files[i].name) < 0)
                        return NULL;
                if (json_object_set_new(o, files[i].key, json_string(p)) < 0)
                        return NULL;
        }
        return TAKE_PTR(o);
}

json_t *vm_record_to_json(const VmRecord *r, const char *dir, bool for_disk) {
        json_auto_t *o = json_object(), *att = NULL;

        if (!o || !dir)
                return NULL;
        if (json_object_set_new(o, "id", json_string(r->id)) < 0 || vm_spec_to_json(&r->spec, o) < 0 ||
            json_object_set_new(o, "state", json_string(vm_state_to_string(r->state))) < 0)
                return NULL;
        if (r->phase >= 0 &&
            (json_object_set_new(o, "phase", json_string(vm_phase_to_string(r->phase))) < 0 ||
             json_object_set_new(o, "vsock", json_string(vm_vsock_to_string(r->vsock))) < 0))
                return NULL;
        if (r->install_mode >= 0 &&
            json_object_set_new(o, "installMode", json_string(vm_install_mode_to_string(r->install_mode))) < 0)
                return NULL;
        if (for_disk) {
                /* what a successor needs to attach to them: units and pids */
                json_t *p = processes_to_json(r);
                if (!p)
                        return NULL;
                if (json_is_null(p))
                        json_decref(p);
                else if (json_object_set_new(o, "processes", p) < 0)
                        return NULL;
        }
        if (json_set_str(o, "ip", r->ip) < 0 || json_set_str(o, "mac", r->mac) < 0 ||
            json_object_set_new(o, "cid", json_integer(r->cid)) < 0 ||
            json_object_set_new(o, "machineID", json_string(r->machine_id)) < 0 ||
            json_object_set_new(o, "booted", json_boolean(r->booted)) < 0 ||
            json_set_str(o, "status", r->status) < 0 ||
            json_object_set_new(o, "sshPublicKey", json_string(r->ssh_public_key ?: "")) < 0)
                return NULL;

        att = vm_attestation_to_json_full(&r->att, for_disk);
        if (!att || json_object_set(o, "attestation", att) < 0)
                return NULL;
        /* get_vm names the version the VM runs beside the one it was created from ("image"); on disk
         * it lives in the attestation only */
        if (!for_disk && json_set_str(o, "bootedVersion", r->att.booted_version) < 0)
                return NULL;

        if (vm_json_set_time(o, "createdAt", r->created_at) < 0 ||
            (r->created_by && json_object_set(o, "createdBy", r->created_by) < 0) ||
            vm_json_set_time(o, "installedAt", r->installed_at) < 0 ||
            vm_json_set_time(o, "bootedAt", r->booted_at) < 0 ||
            vm_json_set_time(o, "readyAt", r->ready_at) < 0 ||
            json_set_str(o, "lastError", r->last_error) < 0 ||
            json_set_str(o, "consoleTail", r->console_tail) < 0 ||
            json_object_set_new(o, "forwards", forwards_to_json(&r->forwards)) < 0 ||
            json_object_set_new(o, "paths", paths_to_json(r, dir)) < 0)
                return NULL;
        return TAKE_PTR(o);
}

/* ---- from JSON -------------------------------------------------------------------------------- */

static int bad(ApiError *reterr, const char *fmt, ...) _printf_(2, 3);
static int bad(ApiError *reterr, const char *fmt, ...) {
        _cleanup_free_ char *text = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&text, fmt, ap) < 0)
                text = NULL;
        va_end(ap);
        return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "%s", text ?: "malformed record");
}

/* The decoders below store into a RecordInput, whose spec part goes through vm_spec_build(). */
typedef struct RecordInput {
        VmRecord *rec;
        VmSpecInput spec;
        char *state, *phase, *vsock, *install_mode, *machine_id;
        json_t *attestation, *processes, *paths, *forwards, *created_by;
        char *created_at, *installed_at, *booted_at, *ready_at;
        uint32_t cid;
        bool booted;
        json_t *checked; /* values read from the object itself below (and ones only checked) */
} RecordInput;

static void record_input_done(RecordInput *in) {
        vm_spec_input_done(&in->spec);
        free(in->state);
        free(in->phase);
        free(in->vsock);
        free(in->install_mode);
        free(in->machine_id);
        json_decref(in->attestation);
        json_decref(in->processes);
        json_decref(in->paths);
        json_decref(in->forwards);
        json_decref(in->created_by);
        free(in->created_at);
        free(in->installed_at);
        free(in->booted_at);
        free(in->ready_at);
        json_decref(in->checked);
}

static int dispatch_tristate(const char *name, json_t *v, void *dest, ApiError *reterr) {
        if (!json_is_boolean(v))
                return bad(reterr, "field \"%s\": expected a boolean, got %s", name, json_type_name(v));
        *(int *) dest = json_is_true(v);
        return 0;
}

/* Times that do not parse were never refused: they stay unset. */
static usec_t time_or_unset(const char *s) {
        usec_t t = 0;

        if (s && parse_rfc3339(s, &t) < 0)
                t = 0;
        return t;
}

/* Forwards that do not parse were never refused: they are skipped. */
static void forwards_from_json(json_t *a, VmForwards *fw) {
        size_t i;
        json_t *e;

        json_array_foreach(a, i, e) {
                json_int_t port = json_integer_value(json_object_get(e, "port"));
                const char *address = json_string_value(json_object_get(e, "address"));
                const char *s = address ? startswith(address, FORWARD_ADDRESS_PREFIX) : NULL;
                uint16_t host_port;

                if (port < 1 || port > 65535 || !s || safe_atou16(s, &host_port) < 0 || host_port == 0 ||
                    vm_forwards_find(fw, (uint16_t) port) || fw->n >= VM_FORWARDS_MAX)
                        continue;
                fw->items[fw->n++] = (VmForward){ .port = (uint16_t) port, .host_port = host_port };
        }
}

typedef struct AttestationInput {
        bool required, released;
        char *ak_pin;
        char *ak_activated;
        bool ek_pending;
        char *ek;
        char *ek_why;
        char *cmdline_extra;
        char *booted_version;
        char *credentials_word;
        json_t *checked;
} AttestationInput;

static int attestation_from_json(json_t *o, VmAttestation *a, ApiError *reterr) {
#define ATT(f) offsetof(AttestationInput, f)
        static const JsonDispatch table[] = {
                { "required", json_dispatch_bool, ATT(required), JSON_NULLABLE },
                { "userDataReleased", json_dispatch_bool, ATT(released), JSON_NULLABLE },
                { "nonceIssuedAt", json_dispatch_variant, ATT(checked), JSON_NULLABLE },
                { "initrd", json_dispatch_variant, ATT(checked), JSON_NULLABLE },
                { "ready", json_dispatch_variant, ATT(checked), JSON_NULLABLE },
                { "akPinned", json_dispatch_string, ATT(ak_pin), JSON_NULLABLE },
                { "akActivated", json_dispatch_string, ATT(ak_activated), JSON_NULLABLE },
                { "kernelCmdlineExtra", json_dispatch_string, ATT(cmdline_extra), JSON_NULLABLE },
                { "ekPending", json_dispatch_bool, ATT(ek_pending), JSON_NULLABLE },
                { "ekCertificate", json_dispatch_string, ATT(ek), JSON_NULLABLE },
                { "ekCertificateMessage", json_dispatch_string, ATT(ek_why), JSON_NULLABLE },
                { "bootedVersion", json_dispatch_string, ATT(booted_version), JSON_NULLABLE },
                { "credentialsWord", json_dispatch_string, ATT(credentials_word), JSON_NULLABLE },
                {},
        };
#undef ATT
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        AttestationInput in = {};
        int r;

        if (!o)
                return 0;
        r = json_dispatch(o, table, &in, &e);
        json_decref(in.checked);
        if (r < 0) {
                free(in.ak_pin);
                free(in.ak_activated);
                free(in.ek_why);
                free(in.ek);
                free(in.cmdline_extra);
                free(in.booted_version);
                free(in.credentials_word);
                return r == -ENOMEM ? r : bad(reterr, "field \"attestation\": %s", e.message ?: "malformed");
        }
        a->required = in.required;
        a->released = in.released;
        a->ak_pin = in.ak_pin;
        a->ak_activated = in.ak_activated;
        a->ek_pending = in.ek_pending;
        a->ek = in.ek ? attest_ek_verdict_from_string(in.ek) : ATTEST_EK_ABSENT;
        if (a->ek < 0)
                a->ek = ATTEST_EK_ABSENT; /* a verdict of a newer daemon: not one this one vouches for */
        free(in.ek);
        a->ek_why = in.ek_why;
        a->cmdline_extra = in.cmdline_extra;
        a->booted_version = in.booted_version;
        a->credentials_word = in.credentials_word;
        a->nonce_issued_at = time_or_unset(json_string_value(json_object_get(o, "nonceIssuedAt")));
        a->has_initrd = attest_result_from_json(json_object_get(o, "initrd"), &a->initrd) >= 0;
        a->has_ready = attest_result_from_json(json_object_get(o, "ready"), &a->ready) >= 0;
        return 0;
}

typedef struct ProcessInput {
        int64_t pid;
        char *unit;
} ProcessInput;

static int processes_from_json(json_t *o, VmRecord *rec, ApiError *reterr) {
        const char *key;
        json_t *v;

        if (!o)
                return 0;
        json_object_foreach(o, key, v) {
                static const JsonDispatch table[] = {
                        { "pid", json_dispatch_int64, offsetof(ProcessInput, pid), JSON_MANDATORY },
                        { "unit", json_dispatch_string, offsetof(ProcessInput, unit), JSON_NULLABLE },
                        {},
                };
                ProcessInput p = {};
                VmRole role = vm_role_from_string(key);
                int r;

                if (role < 0)
                        return bad(reterr, "field \"processes\": unknown process \"%s\"", key);
                r = json_dispatch(v, table, &p, /* reterr= */ NULL);
                if (r < 0 || p.pid < 0 || p.pid > INT32_MAX) {
                        free(p.unit);
                        return r == -ENOMEM ? r : bad(reterr, "field \"processes\": \"%s\" is malformed", key);
                }
                free(rec->processes[role].unit);
                rec->processes[role] = (VmProcessRecord){ .unit = p.unit, .pid = (pid_t) p.pid };
        }
        return 0;
}

static int volume_from_paths(json_t *o, VmRecord *rec, ApiError *reterr) {
        static const char *const keys[] = { "dir",       "volume", "console",  "tpmState", "ovmfVars",
                                            "qmpSocket", "sshKey", "userData", "report",   "qemuLog" };
        const char *key, *volume;
        json_t *v;

        if (!o)
                return 0;
        json_object_foreach(o, key, v) {
                bool known = false;

                for (size_t i = 0; i < ELEMENTSOF(keys) && !known; i++)
                        known = streq(key, keys[i]);
                if (!known)
                        return bad(reterr, "field \"paths\": unknown field \"%s\"", key);
                if (!json_is_string(v))
                        return bad(reterr, "field \"paths\": \"%s\" is not a string", key);
        }
        volume = json_string_value(json_object_get(o, "volume"));
        if (volume && *volume && !(rec->volume = strdup(volume)))
                return -ENOMEM;
        return 0;
}

/* The decoded fields become the record: the spec checked as a request is, the enums parsed, the
 * nested objects read. */
static int record_build(RecordInput *in, VmRecord *rec, ApiError *reterr) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        /* the spec goes through the same checks as a request, without the rules that came later */
        {
                VmSpec spec = {};

                spec.region = TAKE_PTR(rec->spec.region);
                spec.zone = TAKE_PTR(rec->spec.zone);
                r = vm_spec_build(&in->spec, /* request= */ false, &rec->spec, NULL, NULL, &e);
                rec->spec.region = TAKE_PTR(spec.region);
                rec->spec.zone = TAKE_PTR(spec.zone);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return bad(reterr, "spec: %s", e.message ?: "invalid");
        }
        if (!rec->spec.image && !(rec->spec.image = strdup("")))
                return -ENOMEM;

        rec->state = vm_state_from_string(in->state);
        if (rec->state < 0)
                return bad(reterr, "field \"state\": \"%s\" is no state", in->state);
        if (in->phase)
                rec->phase = streq(in->phase, "install") ? VM_PHASE_INSTALL : VM_PHASE_BOOT;
        /* records written before the kernel's vhost-vsock was supported: vhost-user */
        rec->vsock = in->vsock ? vm_vsock_from_string(in->vsock) : VM_VSOCK_VHOST_USER;
        if (rec->vsock < 0)
                return bad(reterr, "field \"vsock\": \"%s\" is no transport", in->vsock);
        /* records written before the host install: the installer boot */
        rec->install_mode = in->install_mode ? vm_install_mode_from_string(in->install_mode) : VM_INSTALL_BOOT;
        if (rec->install_mode < 0)
                return bad(reterr, "field \"installMode\": \"%s\" is no install mode", in->install_mode);
        if (strlen(in->machine_id) != 32 || strspn(in->machine_id, "0123456789abcdef") != 32)
                return bad(reterr, "field \"machineID\": not 32 lower-case hex digits");
        memcpy(rec->machine_id, in->machine_id, 33);
        rec->cid = in->cid;
        rec->booted = in->booted;

        r = attestation_from_json(in->attestation, &rec->att, reterr);
        if (r < 0)
                return r;
        r = processes_from_json(in->processes, rec, reterr);
        if (r < 0)
                return r;
        r = volume_from_paths(in->paths, rec, reterr);
        if (r < 0)
                return r;
        forwards_from_json(in->forwards, &rec->forwards);

        rec->created_at = time_or_unset(in->created_at);
        rec->installed_at = time_or_unset(in->installed_at);
        rec->booted_at = time_or_unset(in->booted_at);
        rec->ready_at = time_or_unset(in->ready_at);
        /* createdBy without a subject was never written; such a value is dropped */
        if (json_is_string(json_object_get(in->created_by, "subject")))
                rec->created_by = TAKE_PTR(in->created_by);

        return 0;
}

int vm_record_from_json(json_t *j, const char *id, VmRecord *ret, ApiError *reterr) {
#define REC(f) offsetof(RecordInput, f)
        static const JsonDispatch table[] = {
                { "id", json_dispatch_variant, REC(checked), JSON_MANDATORY },
                { "name", json_dispatch_string, REC(spec.name), JSON_NULLABLE },
                { "image", json_dispatch_string, REC(spec.image), JSON_NULLABLE },
                { "kubernetesVersion", json_dispatch_string, REC(spec.kubernetes_version), JSON_NULLABLE },
                { "cpus", json_dispatch_int64, REC(spec.cpus), JSON_NULLABLE },
                { "memoryMiB", json_dispatch_int64, REC(spec.memory_mib), JSON_NULLABLE },
                { "diskGiB", json_dispatch_int64, REC(spec.disk_gib), JSON_NULLABLE },
                { "network", json_dispatch_string, REC(spec.network), JSON_NULLABLE },
                { "sshAuthorizedKeys", json_dispatch_strv, REC(spec.ssh_authorized_keys), JSON_NULLABLE },
                { "hostname", json_dispatch_string, REC(spec.hostname), JSON_NULLABLE },
                { "metadata", json_dispatch_object, REC(spec.metadata), JSON_NULLABLE },
                { "region", json_dispatch_variant, REC(checked), JSON_NULLABLE },
                { "zone", json_dispatch_variant, REC(checked), JSON_NULLABLE },
                { "requireAttestation", dispatch_tristate, REC(spec.require_attestation), JSON_NULLABLE },
                { "state", json_dispatch_string, REC(state), JSON_MANDATORY },
                { "phase", json_dispatch_string, REC(phase), JSON_NULLABLE },
                { "vsock", json_dispatch_string, REC(vsock), JSON_NULLABLE },
                { "installMode", json_dispatch_string, REC(install_mode), JSON_NULLABLE },
                { "processes", json_dispatch_object, REC(processes), JSON_NULLABLE },
                { "ip", json_dispatch_variant, REC(checked), JSON_NULLABLE },
                { "mac", json_dispatch_variant, REC(checked), JSON_NULLABLE },
                { "cid", json_dispatch_uint32, REC(cid), JSON_NULLABLE },
                { "machineID", json_dispatch_string, REC(machine_id), JSON_MANDATORY },
                { "booted", json_dispatch_bool, REC(booted), JSON_NULLABLE },
                { "status", json_dispatch_variant, REC(checked), JSON_NULLABLE },
                { "sshPublicKey", json_dispatch_variant, REC(checked), JSON_NULLABLE },
                { "attestation", json_dispatch_object, REC(attestation), JSON_NULLABLE },
                { "createdAt", json_dispatch_string, REC(created_at), JSON_NULLABLE },
                { "createdBy", json_dispatch_variant, REC(created_by), JSON_NULLABLE },
                { "installedAt", json_dispatch_string, REC(installed_at), JSON_NULLABLE },
                { "bootedAt", json_dispatch_string, REC(booted_at), JSON_NULLABLE },
                { "readyAt", json_dispatch_string, REC(ready_at), JSON_NULLABLE },
                { "lastError", json_dispatch_variant, REC(checked), JSON_NULLABLE },
                { "consoleTail", json_dispatch_variant, REC(checked), JSON_NULLABLE },
                { "forwards", json_dispatch_variant, REC(forwards), JSON_NULLABLE },
                { "paths", json_dispatch_object, REC(paths), JSON_NULLABLE },
                {},
        };
#undef REC
        /* the plain strings of the record, copied straight into it */
        static const struct {
                const char *key;
                size_t offset;
        } strings[] = {
                { "region", offsetof(VmRecord, spec.region) },
                { "zone", offsetof(VmRecord, spec.zone) },
                { "ip", offsetof(VmRecord, ip) },
                { "mac", offsetof(VmRecord, mac) },
                { "status", offsetof(VmRecord, status) },
                { "sshPublicKey", offsetof(VmRecord, ssh_public_key) },
                { "lastError", offsetof(VmRecord, last_error) },
                { "consoleTail", offsetof(VmRecord, console_tail) },
        };
        _cleanup_(vm_record_done) VmRecord rec = { .phase = _VM_PHASE_INVALID };
        _cleanup_(record_input_done) RecordInput in = { .rec = &rec, .spec = VM_SPEC_INPUT_NULL };
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        assert_return(id, -EINVAL);

        if (!json_is_object(j))
                return bad(reterr, "not a JSON object");
        if (!streq(json_string_cstr(json_object_get(j, "id")) ?: "", id))
                return bad(reterr, "field \"id\": not \"%s\"", id);

        r = json_dispatch(j, table, &in, &e);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return bad(reterr, "%s", e.message ?: "malformed");
        for (size_t i = 0; i < ELEMENTSOF(strings); i++) {
                json_t *v = json_object_get(j, strings[i].key);
                char **dest = (char **) ((uint8_t *) &rec + strings[i].offset);

                if (!v || json_is_null(v))
                        continue;
                if (!json_string_cstr(v))
                        return bad(reterr, "field \"%s\": expected a string", strings[i].key);
                *dest = strdup(json_string_value(v));
                if (!*dest)
                        return -ENOMEM;
        }

        r = record_build(&in, &rec, reterr);
        if (r < 0)
                return r;
        if (!(rec.id = strdup(id)))
                return -ENOMEM;
        *ret = rec;
        rec = (VmRecord){};
        return 0;
}
