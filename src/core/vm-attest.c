/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A VM's attestation: the nonces its guest asks for and the quotes it posts to the metadata service,
 * judged by src/attest against the policy of the VM's image, and the gate they open. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "attest-ca.h"
#include "attest-credential.h"
#include "attest-nonce.h"
#include "attest-policy.h"
#include "attest-predict.h"
#include "attest-quote.h"
#include "attest-request.h"
#include "fs-util.h"
#include "hex-util.h"
#include "host-probe.h"
#include "image-catalog.h"
#include "json-util.h"
#include "log.h"
#include "manager-firmware.h"
#include "parse-util.h"
#include "string-table.h"
#include "vm-internal.h"

#define NOOP_VERIFIED "nonce matched; quote not verified (noop attestor)"
#define NOOP_UNKNOWN "unknown or expired nonce"
/* The message of a quote that could not be judged: the guest learns no more than that it may retry. */
#define QUOTE_NOT_PROCESSED "quote not processed"

json_t *vm_attestation_to_json(Vm *v) {
        return vm_attestation_to_json_full(&v->rec.att, /* for_disk= */ false);
}

void vm_attest_reset(Vm *v) {
        VmAttestation *a = &v->rec.att;

        a->required = v->rec.spec.require_attestation;
        a->released = !v->rec.spec.require_attestation;
        a->nonce_issued_at = 0;
        attest_result_done(&a->initrd);
        attest_result_done(&a->ready);
        a->has_initrd = a->has_ready = false;
}

VmGate vm_attest_gate(Vm *v) {
        const VmAttestation *a = &v->rec.att;

        if (!a->required)
                return VM_GATE_NONE;
        if (a->has_ready && a->ready.verified)
                return VM_GATE_READY;
        if (a->has_initrd && a->initrd.verified)
                return VM_GATE_INITRD;
        if (a->has_initrd)
                return VM_GATE_REJECTED;
        return a->nonce_issued_at ? VM_GATE_NONCE : VM_GATE_CLOSED;
}

char *vm_attest_boot_rejection(Vm *v) {
        const VmAttestation *a = &v->rec.att;
        const AttestResult *r = a->has_initrd && !a->initrd.verified ? &a->initrd :
                a->has_ready && !a->ready.verified                   ? &a->ready :
                                                                       NULL;
        char *t = NULL;

        if (!a->required || !r)
                return NULL;
        asprintf_or_null(
                &t, "%s attestation rejected: %s", r == &a->initrd ? "initrd" : "ready", r->message ?: "?");
        return t;
}

/* Without golden values the boot would be rejected minutes from now: create_vm is refused before
 * anything is allocated, with the way to record them. */
int vm_attest_check_image(Manager *m, const Image *img, const VmSpec *spec, ApiError *reterr) {
        _cleanup_(attest_policy_freep) AttestPolicy *p = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        const AttestFirmwareExpect *fw;
        const char *fw_why = NULL;
        bool fw_pending = false;
        char list[3 * 32] = "";
        uint32_t missing;

        if (!spec->require_attestation || manager_settings(m)->attestation != ATTEST_MODE_VERIFY ||
            manager_settings(m)->learn_golden)
                return 0;
        if (!img->policy)
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "vm requires attestation, but image %s has no policy.json to verify its quotes against; "
                        "use an image built by images/ (make image), or create the vm with require_attestation "
                        "false",
                        img->ref);
        if (attest_policy_from_json(img->policy, &p, &e) < 0)
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "vm requires attestation, but the policy.json of image %s does not load: %s",
                        img->ref,
                        e.message ?: "invalid policy");
        /* The firmware's PCRs: known from a firmware run for this VM's shape, or being learned now
         * (the run takes less than the VM's boot to its first quote); only when no run can be made
         * do they need golden values. */
        fw = firmware_runs_lookup(
                manager_firmware_runs(m), spec->memory_mib, spec->cpus, /* start= */ true, &fw_why, &fw_pending);
        missing = attest_policy_missing_golden(p, manager_expected_pcr7(m) != NULL, fw || fw_pending);
        if (missing == 0)
                return 0;
        if ((missing & ATTEST_FIRMWARE_CHECKED) && fw_why)
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_UNSUPPORTED,
                        "vm requires attestation, but this host's firmware measurements (pcr 0,2,3,6) are not "
                        "known: %s; and image %s has no golden value for them. Pin them once with `make golden` "
                        "(or `vm-manager image golden %s --from-vm <id>` after a boot with "
                        "--attestation-learn-golden), or create this vm with require_attestation false",
                        fw_why,
                        img->ref,
                        img->ref);
        for (unsigned i = 0, n = 0; i < 32; i++)
                if (missing & (1U << i))
                        n += (unsigned) snprintf(list + n, sizeof(list) - n, "%s%u", n ? "," : "", i);
        return api_error_set(
                reterr,
                -EOPNOTSUPP,
                API_ERROR_UNSUPPORTED,
                "vm requires attestation, but image %s has no golden value for pcr %s, so its quotes cannot "
                "verify (attestation verify, learn mode off). Record them once: run `make golden`, or serve "
                "with --attestation-learn-golden, create one vm with require_attestation and wait_for ready, "
                "then run `vm-manager image golden %s --from-vm <id>`. Or create this vm with "
                "require_attestation false",
                img->ref,
                list,
                img->ref);
}

/* The event logs of each stage's last quote, as the guest sent them, kept in the VM's directory
 * (so delete_vm removes them): <vm>/attest-<stage>-firmware.log (TCG2 binary) and
 * <vm>/attest-<stage>-userspace.log (systemd's JSON sequence). Each is at most ATTEST_LOG_MAX
 * bytes, as the request decoder refuses a bigger one, so a VM keeps at most 16 MiB of them. */
static const char *const log_kinds[] = { "firmware", "userspace" };

static char *log_path(Vm *v, const char *stage, const char *kind) {
        _cleanup_free_ char *name = NULL;

        if (asprintf(&name, "attest-%s-%s.log", stage, kind) < 0)
                return NULL;
        return vm_path(v, name);
}

/* Replaces the stage's stored logs with the quote's (a log it left out is removed); a failure is
 * logged and changes no verdict. */
static void store_logs(Vm *v, const char *stage, const AttestQuoteRequest *req) {
        const struct {
                const uint8_t *data;
                size_t size;
        } logs[] = { { req->event_log, req->event_log_size }, { req->userspace_log, req->userspace_log_size } };

        for (size_t k = 0; k < ELEMENTSOF(logs); k++) {
                _cleanup_free_ char *path = log_path(v, stage, log_kinds[k]);
                int r;

                if (!path)
                        r = -ENOMEM;
                else if (logs[k].size > 0)
                        r = manager_write_file(v->manager, path, logs[k].data, logs[k].size, 0600);
                else
                        /* The removal is queued behind the writes of the same path that are still
                         * pending, so an older quote's log cannot reappear after it. */
                        r = manager_remove_tree(v->manager, path);
                if (r < 0)
                        log_warning_errno(
                                r,
                                "VM %s: cannot keep the %s %s event log, ignoring: %m",
                                vm_id(v),
                                stage,
                                log_kinds[k]);
        }
}

/* A new boot's first nonce: the logs of the boot before are no longer the VM's. */
static void remove_logs(Vm *v) {
        for (AttestStage s = 0; s < _ATTEST_STAGE_MAX; s++)
                for (size_t k = 0; k < ELEMENTSOF(log_kinds); k++) {
                        _cleanup_free_ char *path = log_path(v, attest_stage_to_string(s), log_kinds[k]);

                        /* The removal is queued behind the writes of the same path that are still
                         * pending, so the last boot's logs cannot land after it. */
                        int r = path ? manager_remove_tree(vm_manager(v), path) : -ENOMEM;

                        if (r < 0)
                                log_warning_errno(r, "VM %s: cannot remove %s, ignoring: %m", vm_id(v), path);
                }
}

int vm_attest_nonce(Vm *v, char ret[static 65]) {
        Manager *m = vm_manager(v);
        VmAttestation *a = &v->rec.att;
        int r;

        r = attest_nonce_issue(manager_nonces(m), vm_id(v), now_usec(CLOCK_MONOTONIC), ret);
        if (r < 0)
                return r;
        if (a->nonce_issued_at == 0) {
                remove_logs(v);
                a->nonce_issued_at = now_usec(CLOCK_REALTIME);
                (void) vm_set_state(v, VM_EVENT_NONCE, NULL, NULL);
        }
        return 0;
}

static AttestPolicy *policy_of(const Image *img, char **ret_why) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        AttestPolicy *p = NULL;

        if (!img->policy) {
                asprintf_or_null(ret_why, "no attestation policy: image %s has no policy.json", img->ref);
                return NULL;
        }
        if (attest_policy_from_json(img->policy, &p, &e) < 0) {
                asprintf_or_null(ret_why, "no attestation policy: %s", e.message ?: "invalid policy.json");
                return NULL;
        }
        return p;
}

/* Whether the quote's PCR 11 is the one policy p expects at the stage's phase. */
static bool pcr11_matches(const AttestPolicy *p, AttestStage stage, const char *quoted) {
        const char *phase = attest_stage_phase(stage), *want = phase ? attest_policy_pcr11(p, phase) : NULL;

        return want && quoted && strcasecmp(want, quoted) == 0;
}

/* The policy a quote is judged by, or why there is none (a rejection, not a failure), and the image
 * version it belongs to in *ret_version (borrowed from the catalog until its next rescan).
 *
 * The quote, not the record, says which version booted: a VM updates itself in place (systemd-sysupdate
 * writes the next version into its B slot, and systemd-boot boots it on trial), so its UKI may be a
 * later version of the image it was created from. The VM's own version is taken when the quoted PCR 11
 * is its value, otherwise the version of the same image id whose policy expects the quoted PCR 11 (the
 * claimed value only chooses; the verification then proves it against the signed quote). Where none
 * does, the VM's own policy judges, and *ret_note says that no version this host serves matches. */
static AttestPolicy *policy_for(
        Vm *v,
        AttestStage stage,
        const char *quoted_pcr11,
        const char **ret_version,
        char **ret_note,
        char **ret_why) {
        Manager *m = vm_manager(v);
        ImageCatalog *c = manager_images(m);
        const char *ref = vm_spec(v)->image;
        const Image *img = image_catalog_resolve(c, ref);
        _cleanup_(attest_policy_freep) AttestPolicy *own = NULL;
        _cleanup_free_ char *versions = NULL, *unjudged = NULL;

        *ret_version = NULL;
        if (!img) {
                asprintf_or_null(ret_why, "no attestation policy: image %s is not in the catalog", ref);
                return NULL;
        }
        own = policy_of(img, ret_why);
        if (own && (!quoted_pcr11 || pcr11_matches(own, stage, quoted_pcr11))) {
                *ret_version = img->version;
                return TAKE_PTR(own);
        }
        for (size_t k = 0; quoted_pcr11 && k < image_catalog_size(c); k++) {
                const Image *other = image_catalog_at(c, k);
                _cleanup_free_ char *ignored = NULL, *more = NULL;
                char **list;
                AttestPolicy *p;

                if (other == img || !streq(other->id, img->id))
                        continue;
                p = policy_of(other, &ignored);
                if (p && pcr11_matches(p, stage, quoted_pcr11)) {
                        *ret_version = other->version;
                        return p;
                }
                list = p ? &versions : &unjudged;
                attest_policy_free(p);
                if (asprintf(&more, "%s%s%s", *list ?: "", *list ? ", " : "", other->version) < 0)
                        return NULL;
                free(*list);
                *list = TAKE_PTR(more);
        }
        if (own) {
                *ret_version = img->version;
                asprintf_or_null(
                        ret_note,
                        "; the quoted pcr 11 is no version of image %s this host has a policy for (%s%s%s%s%s): the "
                        "vm booted a uki that is not in the catalog%s",
                        img->id,
                        img->version,
                        versions ? ", " : "",
                        versions ?: "",
                        unjudged ? "; without a policy.json: " : "",
                        unjudged ?: "",
                        unjudged ? " or has no policy" : "");
        }
        return TAKE_PTR(own);
}

/* Where the host's firmware is not the one the golden values were recorded with, the verdict says so. */
static char *firmware_note(Vm *v, const AttestPolicy *p) {
        const char *host = host_probe_firmware_sha256(manager_host(vm_manager(v)));
        char *note = NULL;

        if (!p || !p->has_golden_firmware || !host || strcasecmp(host, p->golden_firmware_sha256) == 0)
                return NULL;
        asprintf_or_null(
                &note,
                "; the image's golden values were recorded with firmware %s %s (sha256 %.16s), this host boots "
                "sha256 %.16s",
                p->golden_firmware_package ?: "?",
                p->golden_firmware_version ?: "?",
                p->golden_firmware_sha256,
                host);
        return note;
}

/* PCR 12 as systemd-stub leaves it for the kernel-cmdline-extra string this run was started with, as
 * 64 lowercase hex into ret; NULL when the daemon does not know what it passed (a run an older
 * vm-manager started), or passed something the prediction does not cover. */
/* PCR 12 as this run of the VM must show it: from the command-line addition it was started with,
 * and, where the image measures its credentials (its policy says so), from those too. */
static const char *expected_pcr12(Vm *v, const AttestPolicy *policy, char ret[static ATTEST_SHA256_HEX + 1]) {
        const char *extra = v->rec.att.cmdline_extra, *word = NULL;
        uint8_t pcr[ATTEST_SHA256_SIZE];
        int r;

        if (!extra)
                return NULL;
        if (policy && policy->pcr12_credentials) {
                word = v->rec.att.credentials_word;
                if (!word) /* a run an older vm-manager started: not predictable */
                        return NULL;
        }
        r = attest_predict_pcr12_credentials(*extra ? extra : NULL, word, pcr);
        if (r < 0) {
                log_debug_errno(r, "VM %s: no PCR 12 prediction for its command line, ignoring: %m", vm_id(v));
                return NULL;
        }
        hex_format(pcr, sizeof(pcr), ret);
        return ret;
}

/* A verdict, once recorded, is an event of the lifecycle: verified, rejected for good (a golden
 * mismatch, no golden value, another AK: a VM that must attest is failed at once), or rejected for
 * the guest to retry (a stale nonce; anything in noop mode). */
static void verdict_event(Vm *v, AttestStage stage) {
        const AttestResult *r = stage == ATTEST_STAGE_READY ? &v->rec.att.ready : &v->rec.att.initrd;
        bool ready = stage == ATTEST_STAGE_READY;
        VmEvent e;

        if (r->verified)
                e = ready ? VM_EVENT_QUOTE_VERIFIED_READY : VM_EVENT_QUOTE_VERIFIED_INITRD;
        else if (r->retryable || manager_settings(v->manager)->attestation == ATTEST_MODE_NOOP)
                e = VM_EVENT_QUOTE_RETRYABLE;
        else
                e = ready ? VM_EVENT_QUOTE_REJECTED_READY : VM_EVENT_QUOTE_REJECTED_INITRD;
        (void) vm_set_state(
                v, e, &(VmEventArgs){ .stage = attest_stage_to_string(stage), .detail = r->message ?: "" }, NULL);
}

static const char *const vm_quote_verdict_table[_VM_QUOTE_VERDICT_MAX] = {
        [VM_QUOTE_VERIFIED] = "verified",
        [VM_QUOTE_REJECTED] = "rejected",
};
DEFINE_STRING_TABLE_LOOKUP(vm_quote_verdict, VmQuoteVerdict);

/* Keeps the verdict as its stage's, where the VM's record and the gate read it: a verified initrd
 * quote opens the gate. A quote of no known stage never decodes, so it is only logged. Takes res. */
static void record_verdict(Vm *v, AttestStage stage, AttestResult *res) {
        VmAttestation *a = &v->rec.att;

        if (stage == ATTEST_STAGE_INITRD) {
                attest_result_done(&a->initrd);
                a->initrd = *res;
                a->has_initrd = true;
                if (res->verified)
                        a->released = true;
        } else if (stage == ATTEST_STAGE_READY) {
                attest_result_done(&a->ready);
                a->ready = *res;
                a->has_ready = true;
        } else
                attest_result_done(res);
        /* The result's strings belong to the record now, so the caller must not free them again. */
        *res = (AttestResult){};
}

/* The EK certificate swtpm_setup left for this VM's vTPM (tpm/ek-rsa2048.crt) and the CA that judges
 * it: 0, or -ENOKEY with the reason there is none to judge in *ret_why (static text). */
static int read_ek_certificate(Vm *v, AttestCa **ret_ca, char **ret_der, size_t *ret_size, const char **ret_why) {
        _cleanup_free_ char *path = vm_path(v, "tpm/ek-rsa2048.crt"), *der = NULL;
        AttestCa *ca = manager_attest_ca(vm_manager(v));
        size_t size = 0;
        int r;

        if (!path)
                return -ENOMEM;
        if (!ca) {
                *ret_why = "this host has no attestation CA (swtpm_setup is not installed)";
                return -ENOKEY;
        }
        if (v->rec.att.ek_pending) {
                *ret_why = "its vTPM has not been manufactured yet";
                return -ENOKEY;
        }
        r = read_full_file(path, 16384, &der, &size);
        if (r == -ENOMEM)
                return r;
        if (r < 0 || size == 0) {
                *ret_why =
                        "its vTPM was made without one (the vm predates EK certificates, or swtpm_setup "
                        "was missing when it was created)";
                return -ENOKEY;
        }
        *ret_ca = ca;
        *ret_der = TAKE_PTR(der);
        *ret_size = size;
        return 0;
}

/* The EK the guest presents against the one certified for this VM when its vTPM was manufactured:
 * the verdict get_vm_attestation reports, returned. Absent stays absent. */
static AttestEkVerdict check_presented_ek(Vm *v, const uint8_t *ek_pub, size_t ek_pub_size) {
        _cleanup_free_ char *der = NULL, *why = NULL;
        VmAttestation *a = &v->rec.att;
        const char *none = NULL;
        AttestEkVerdict verdict;
        AttestCa *ca = NULL;
        size_t size = 0;

        if (read_ek_certificate(v, &ca, &der, &size, &none) < 0)
                return a->ek;
        verdict = attest_ca_check_ek(ca, der, size, ek_pub, ek_pub_size, &why);
        if (verdict == ATTEST_EK_FOREIGN && verdict != a->ek)
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", vm_id(v) }),
                        "VM %s: EK certificate foreign: %s",
                        vm_id(v),
                        why ?: "?");
        a->ek = verdict;
        free(a->ek_why);
        a->ek_why = TAKE_PTR(why);
        return verdict;
}

/* The challenge's answer: the credential as the guest's TPM2_ActivateCredential takes it. */
static json_t *credential_to_json(const AttestCredential *c) {
        _cleanup_free_ char *blob = base64_encode(c->blob, c->blob_size),
                            *secret = base64_encode(c->secret, c->secret_size);

        if (!blob || !secret)
                return NULL;
        return json_pack("{s:s,s:s}", "credential_blob", blob, "encrypted_secret", secret);
}

int vm_attest_challenge(Vm *v, const void *body, size_t size, json_t **ret, ApiError *reterr) {
        _cleanup_(attest_challenge_request_done) AttestChallengeRequest req = {};
        _cleanup_free_ char *der = NULL;
        char fingerprint[ATTEST_SHA256_HEX + 1];
        VmAttestation *a = &v->rec.att;
        AttestCredential cred = {};
        VmChallenge c = {};
        TPMT_PUBLIC ek, ak;
        TPM2B_NAME name;
        const char *none = NULL;
        AttestCa *ca = NULL;
        json_t *answer;
        size_t der_size = 0;
        int r;

        assert(ret);

        r = attest_challenge_request_decode(body, size, &req, reterr);
        if (r < 0)
                return r;

        /* Nothing the guest sends is believed before the certificate vouches for its EK. */
        r = read_ek_certificate(v, &ca, &der, &der_size, &none);
        if (r == -ENOKEY)
                return attest_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        "credential activation is not possible: this vm's vTPM has no EK certificate: %s",
                        none);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "challenge not made");
        if (check_presented_ek(v, req.ek_pub, req.ek_pub_size) != ATTEST_EK_CERTIFIED)
                return attest_error_set(
                        reterr,
                        -EPERM,
                        "endorsement key foreign: %s",
                        a->ek_why ?: "the guest's EK is not the one certified for this VM");
        r = attest_ek_public_parse(req.ek_pub, req.ek_pub_size, &ek, reterr);
        if (r < 0)
                return r;

        /* The AK's name is computed here from its public area, never taken from the guest. */
        r = attest_ak_public_parse(req.ak_pub, req.ak_pub_size, &ak, reterr);
        if (r < 0)
                return r;
        r = attest_ak_fingerprint(&ak, fingerprint);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "challenge not made");
        if (a->ak_activated && !streq(a->ak_activated, fingerprint))
                return attest_error_set(
                        reterr,
                        -EPERM,
                        "another attestation key is already activated for this vm's vTPM: ak %.*s, not %.*s",
                        ATTEST_SHORT_FP,
                        a->ak_activated,
                        ATTEST_SHORT_FP,
                        fingerprint);
        r = attest_tpm_name(&ak, &name);
        if (r < 0)
                return attest_error_set(
                        reterr, -EPERM, "unsupported attestation key: name algorithm 0x%04x", ak.nameAlg);

        r = RET_NERRNO(getrandom(c.secret, sizeof(c.secret), 0));
        if (r >= 0 && (size_t) r != sizeof(c.secret))
                r = -EIO;
        if (r >= 0)
                r = attest_make_credential(&ek, &name, c.secret, sizeof(c.secret), &cred, /* reterr= */ NULL);
        if (r < 0) {
                explicit_bzero(&c, sizeof(c));
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "challenge not made");
        }
        answer = credential_to_json(&cred);
        if (!answer) {
                explicit_bzero(&c, sizeof(c));
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "challenge not made");
        }
        memcpy(c.ak_fingerprint, fingerprint, sizeof(fingerprint));
        c.issued = now_usec(CLOCK_MONOTONIC);
        /* The new challenge replaces any other: a guest has one outstanding at a time. */
        v->challenge = c;
        explicit_bzero(&c, sizeof(c));
        log_debug("VM %s: credential challenge for ak %.*s", vm_id(v), ATTEST_SHORT_FP, fingerprint);
        *ret = answer;
        return 0;
}

int vm_attest_activate(Vm *v, const void *body, size_t size, json_t **ret, ApiError *reterr) {
        AttestActivateRequest req = {};
        VmAttestation *a = &v->rec.att;
        _cleanup_free_ char *fp = NULL;
        VmChallenge c;
        json_t *answer;
        bool equal;
        int r;

        assert(ret);

        r = attest_activate_request_decode(body, size, &req, reterr);
        if (r < 0)
                return r;
        /* Any answer uses the challenge up, so that a guest gets one guess per credential. */
        c = v->challenge;
        explicit_bzero(&v->challenge, sizeof(v->challenge));
        if (c.issued == 0)
                r = attest_error_set(
                        reterr, -ESTALE, "no credential challenge outstanding: post attest/challenge first");
        else if (now_usec(CLOCK_MONOTONIC) - c.issued > VM_CHALLENGE_LIFETIME)
                r = attest_error_set(
                        reterr, -ESTALE, "the credential challenge expired: post attest/challenge again");
        if (r < 0)
                goto finish;
        equal = attest_memeq(req.secret, req.secret_size, c.secret, sizeof(c.secret));
        if (!equal) {
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", vm_id(v) }),
                        "VM %s: credential activation failed: the secret does not match",
                        vm_id(v));
                r = attest_error_set(
                        reterr,
                        -EPERM,
                        "credential activation failed: the secret is not the one the credential carried");
                goto finish;
        }

        if (!a->ak_activated || !streq(a->ak_activated, c.ak_fingerprint)) {
                fp = strdup(c.ak_fingerprint);
                if (!fp) {
                        r = api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "activation not recorded");
                        goto finish;
                }
                free(a->ak_activated);
                a->ak_activated = TAKE_PTR(fp);
                r = vm_save(v);
                if (r < 0)
                        log_warning_errno(
                                r, "VM %s: cannot save the activated attestation key, ignoring: %m", vm_id(v));
                log_struct(
                        LOG_INFO,
                        LOG_FIELDS({ "VM_ID", vm_id(v) }),
                        "VM %s: attestation key %.*s activated with the vTPM's certified EK",
                        vm_id(v),
                        ATTEST_SHORT_FP,
                        c.ak_fingerprint);
        }
        answer = json_pack("{s:b,s:s}", "activated", true, "ak_fingerprint", c.ak_fingerprint);
        if (!answer) {
                r = api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "activation not recorded");
                goto finish;
        }
        *ret = answer;
        r = 0;
finish:
        explicit_bzero(&c, sizeof(c));
        explicit_bzero(&req, sizeof(req));
        return r;
}

/* What a quote's AK is held to: the activated one, the pin of a VM from before credential
 * activation, or none, and then why no quote can verify yet. */
static void trusted_ak(Vm *v, AttestVerifyParams *p, char **ret_why) {
        _cleanup_free_ char *der = NULL;
        VmAttestation *a = &v->rec.att;
        const char *none = NULL;
        AttestCa *ca = NULL;
        size_t size = 0;

        *ret_why = NULL;
        if (a->ak_activated) {
                p->pinned_ak = a->ak_activated;
                p->ak_activated = true;
                return;
        }
        if (a->ak_pin) {
                p->pinned_ak = a->ak_pin;
                return;
        }
        if (read_ek_certificate(v, &ca, &der, &size, &none) >= 0) {
                /* The guest can still activate its key and quote again. */
                p->no_ak_retryable = true;
                asprintf_or_null(
                        ret_why,
                        ATTEST_AK_NOT_ACTIVATED
                        ": no credential activation yet (the guest posts attest/challenge "
                        "and attest/activate before it quotes)");
        } else
                asprintf_or_null(
                        ret_why,
                        "attestation key cannot be activated: this vm's vTPM has no EK certificate: %s",
                        none ?: "?");
        p->no_ak_message = *ret_why ?: ATTEST_AK_NOT_ACTIVATED;
}

int vm_attest_quote_wait(Vm *v, FirmwareWaitDone done, void *userdata, FirmwareWait **ret) {
        Manager *m = vm_manager(v);
        const char *why;
        bool pending;

        assert_return(done && ret, -EINVAL);

        if (manager_settings(m)->attestation == ATTEST_MODE_NOOP)
                return 0;
        /* a VM from before this daemon's start may have a shape no run was asked for yet */
        if (firmware_runs_lookup(
                    manager_firmware_runs(m),
                    vm_spec(v)->memory_mib,
                    vm_spec(v)->cpus,
                    /* start= */ true,
                    &why,
                    &pending) ||
            !pending)
                return 0;
        return firmware_runs_wait(
                manager_firmware_runs(m), vm_spec(v)->memory_mib, vm_spec(v)->cpus, done, userdata, ret);
}

FirmwareWait *vm_attest_quote_wait_free(FirmwareWait *w) {
        return firmware_wait_free(w);
}

int vm_attest_quote(Vm *v, const void *body, size_t size, json_t **ret, ApiError *reterr) {
        _cleanup_(attest_quote_request_done) AttestQuoteRequest req = {};
        _cleanup_(attest_result_done) AttestResult res = {};
        _cleanup_(attest_policy_freep) AttestPolicy *policy = NULL;
        _cleanup_free_ char *why = NULL, *note = NULL, *no_ak = NULL, *version_note = NULL;
        char pcr12[ATTEST_SHA256_HEX + 1];
        const char *version = NULL;
        json_auto_t *result = NULL;
        Manager *m = vm_manager(v);
        VmQuoteVerdict verdict;
        AttestStage stage;
        int r;

        assert(ret);

        /* The decoder's message is the guest's whole answer, so it is passed on as it is. */
        r = attest_quote_request_decode(body, size, &req, reterr);
        if (r < 0)
                return r;
        stage = attest_stage_from_string(req.stage);
        (void) check_presented_ek(v, req.ek_pub, req.ek_pub_size);

        if (manager_settings(m)->attestation == ATTEST_MODE_NOOP) {
                bool ok = attest_nonce_consume(
                        manager_nonces(m), vm_id(v), req.nonce, now_usec(CLOCK_MONOTONIC));
                res.verified = ok;
                res.message = strdup(ok ? NOOP_VERIFIED : NOOP_UNKNOWN);
                res.at = now_usec(CLOCK_REALTIME);
                if (!res.message)
                        return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, QUOTE_NOT_PROCESSED);
        } else {
                AttestVerifyParams params;
                const AttestFirmwareExpect *fw;
                const char *fw_why = NULL;
                _cleanup_free_ char *fw_late = NULL;
                bool fw_pending = false;

                policy = policy_for(v, stage, req.pcrs_sha256[11], &version, &version_note, &why);
                /* a VM from before this daemon's start may have a shape no run was asked for yet */
                fw = firmware_runs_lookup(
                        manager_firmware_runs(m),
                        vm_spec(v)->memory_mib,
                        vm_spec(v)->cpus,
                        /* start= */ true,
                        &fw_why,
                        &fw_pending);
                /* The IMDS holds every quote while its shape's run is pending (vm_attest_quote_wait()),
                 * so a quote judged with the run still pending waited out the run's limit: it is
                 * judged now, for good (the agent does not quote again on a verdict). */
                if (fw_pending) {
                        asprintf_or_null(
                                &fw_late,
                                "the firmware run for %" PRIu64
                                " MiB, %u CPUs did not finish within %u s of the quote; pin the "
                                "firmware with `vm-manager image golden`",
                                vm_spec(v)->memory_mib,
                                vm_spec(v)->cpus,
                                FIRMWARE_RUN_TIMEOUT_SEC);
                        if (fw_late)
                                fw_why = fw_late;
                }
                params = (AttestVerifyParams){
                        .vm_id = vm_id(v),
                        .now = now_usec(CLOCK_MONOTONIC),
                        .at = now_usec(CLOCK_REALTIME),
                        .policy = policy,
                        .no_policy_message = why ?: "no attestation policy",
                        .kubernetes_version = vm_spec(v)->kubernetes_version,
                        .expected_pcr12 = expected_pcr12(v, policy, pcr12),
                        .expected_pcr7 = manager_expected_pcr7(m),
                        .firmware = fw,
                        .firmware_missing = fw_why,
                        .learn_golden = manager_settings(m)->learn_golden,
                };
                trusted_ak(v, &params, &no_ak);
                r = attest_verify_quote(manager_nonces(m), &req, &params, &res);
                if (r < 0)
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, QUOTE_NOT_PROCESSED);
                if (!res.verified && res.message && strstr(res.message, "golden mismatch"))
                        note = firmware_note(v, policy);
                else if (!res.verified && res.message && (startswith(res.message, "pcr 11 ") || startswith(res.message, "pcr 4 ")))
                        note = TAKE_PTR(version_note); /* the UKI is none the catalog has a policy for */
                if (note) {
                        char *longer = NULL;
                        asprintf_or_null(&longer, "%s%s", res.message, note);
                        if (longer) {
                                free(res.message);
                                res.message = longer;
                        }
                }
                if (res.verified && version &&
                    (!v->rec.att.booted_version || !streq(v->rec.att.booted_version, version))) {
                        char *copy = strdup(version);
                        if (copy) {
                                if (v->rec.att.booted_version)
                                        log_info(
                                                "VM %s: boots version %s of its image now (was %s)",
                                                vm_id(v),
                                                version,
                                                v->rec.att.booted_version);
                                free(v->rec.att.booted_version);
                                v->rec.att.booted_version = copy;
                        }
                }
                /* Trust on first use is gone: no_ak_message is always set, so nothing enrolls. */
                assert(!res.enroll);
        }
        verdict = res.verified ? VM_QUOTE_VERIFIED : VM_QUOTE_REJECTED;

        log_struct(
                res.verified ? LOG_INFO : LOG_WARNING,
                LOG_FIELDS({ "VM_ID", vm_id(v) }, { "ATTEST_STAGE", attest_stage_to_string(stage) ?: "?" }),
                "VM %s: %s quote %s: %s",
                vm_id(v),
                attest_stage_to_string(stage) ?: "?",
                vm_quote_verdict_to_string(verdict),
                res.message ?: "");

        result = attest_quote_result_to_json(req.stage, res.verified, res.message);
        if (!result)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, QUOTE_NOT_PROCESSED);

        if (stage >= 0)
                store_logs(v, attest_stage_to_string(stage), &req);
        record_verdict(v, stage, &res);
        verdict_event(v, stage);
        *ret = TAKE_PTR(result);
        return verdict;
}

/* The attestation as one word: disabled, released, failed or pending (in that order). */
const char *vm_attestation_word(Vm *v) {
        VmAttestation *a = &v->rec.att;

        if (!vm_spec(v)->require_attestation)
                return "disabled";
        if (a->released)
                return "released";
        if (a->has_initrd && !a->initrd.verified)
                return "failed";
        return "pending";
}
