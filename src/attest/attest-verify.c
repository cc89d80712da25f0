/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attest-quote.h"
#include "attest-verify.h"
#include "cleanup.h"
#include "string-table.h"
#include "time-util.h"

static const char *const attest_stage_table[_ATTEST_STAGE_MAX] = {
        [ATTEST_STAGE_INITRD] = "initrd",
        [ATTEST_STAGE_READY] = "ready",
};

DEFINE_STRING_TABLE_LOOKUP(attest_stage, AttestStage);

const char *attest_stage_phase(AttestStage s) {
        return s == ATTEST_STAGE_READY   ? ATTEST_PHASE_READY :
                s == ATTEST_STAGE_INITRD ? ATTEST_PHASE_INITRD :
                                           NULL;
}

void attest_result_done(AttestResult *r) {
        if (!r)
                return;
        free(r->message);
        free(r->ak_fingerprint);
        for (size_t i = 0; i < ATTEST_PCR_SLOTS; i++)
                free(r->pcrs[i]);
        *r = (AttestResult){};
}

/* The verdict's message; a rejection unless the result is marked verified afterwards. Returns 1, so
 * that the steps of verify() below can tell "stop here, the message says why" from "go on" (0). */
_printf_(2, 3) static int set_message(AttestResult *res, const char *format, ...) {
        char *m = NULL;
        va_list ap;
        int k;

        va_start(ap, format);
        k = vasprintf(&m, format, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        free(res->message);
        res->message = m;
        return 1;
}

/* "0,1,2" for a mask of indexes, ascending. */
static char *index_list(uint32_t mask, char buf[static 3 * ATTEST_PCR_SLOTS]) {
        size_t n = 0;

        buf[0] = 0;
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                if (mask & (1U << i))
                        n += (size_t) snprintf(buf + n, 3 * ATTEST_PCR_SLOTS - n, "%s%u", n ? "," : "", i);
        return buf;
}

/* 0–7 and 11, 13 at the ready stage, and 12 at both where the image's policy says its agent quotes
 * it: an image built before PCR 12 was predicted has an agent that leaves it out. */
static uint32_t required_pcrs(AttestStage stage, const AttestPolicy *policy) {
        uint32_t m = 0xffU | 1U << 11;

        if (policy && policy->pcr12_predicted)
                m |= 1U << 12;
        return stage == ATTEST_STAGE_READY ? m | 1U << 13 : m;
}

/* PCR 1 (SMBIOS type-11 credentials) and 5 (the GPT) differ per VM: quoted, recorded, not compared. */
static const unsigned golden_pcrs[] = { 0, 2, 3, 4, 6, 7 };

typedef struct Decoded {
        uint8_t *bytes[ATTEST_PCR_SLOTS];
        AttestPcrValue values[ATTEST_PCR_SLOTS];
} Decoded;

static void decoded_done(Decoded *d) {
        for (size_t i = 0; i < ATTEST_PCR_SLOTS; i++)
                free(d->bytes[i]);
}

/* The steps of verify() below each return a negative errno, 1 when they rejected the quote (the
 * result's message says why) or 0 to go on. */

/* The nonce is spent first, whatever else is wrong, so that a rejected quote cannot be replayed. */
static int check_request(
        AttestNonceStore *nonces,
        const AttestQuoteRequest *req,
        const AttestVerifyParams *p,
        AttestResult *res,
        AttestStage *ret_stage) {

        AttestStage stage;

        if (!attest_nonce_consume(nonces, p->vm_id, req->nonce, p->now)) {
                res->retryable = true; /* the guest asks for a new nonce and quotes again */
                return set_message(res, "unknown or expired nonce");
        }

        stage = attest_stage_from_string(req->stage);
        if (stage < 0) {
                _cleanup_free_ char *quoted = attest_go_quote(req->stage ?: "", strlen(req->stage ?: ""));
                if (!quoted)
                        return -ENOMEM;
                return set_message(res, "unknown stage %s", quoted);
        }

        if (!p->policy)
                return set_message(res, "%s", p->no_policy_message ?: "no attestation policy");
        *ret_stage = stage;
        return 0;
}

/* The quote's structure, its signature by the AK it carries, its nonce and its bank. */
static int check_quote(const AttestQuoteRequest *req, AttestResult *res, AttestQuote *q) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        int r;

        r = attest_quote_parse(
                req->quote,
                req->quote_size,
                req->signature,
                req->signature_size,
                req->ak_pub,
                req->ak_pub_size,
                q,
                &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return set_message(res, "quote: %s", err.message ?: "malformed quote");
        res->ak_fingerprint = strdup(q->ak_fingerprint);
        if (!res->ak_fingerprint)
                return -ENOMEM;

        r = attest_quote_verify_signature(q, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return set_message(res, "signature: %s", err.message ?: "signature does not verify");

        if (!attest_quote_nonce_matches(q, req->nonce))
                return set_message(res, "nonce: quote qualifying data does not match the nonce");

        if (q->bank_alg != TPM2_ALG_SHA256)
                return set_message(res, "quote selects pcr bank %s, want sha256", q->bank);
        return 0;
}

/* The PCR values the guest sent: decoded into d, checked against the quote's digest, kept in the
 * result as hex, and complete for the stage. */
static int check_pcrs(
        const AttestQuoteRequest *req,
        const AttestQuote *q,
        const AttestPolicy *policy,
        AttestStage stage,
        Decoded *d,
        AttestResult *res) {

        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        char list[3 * ATTEST_PCR_SLOTS], list2[3 * ATTEST_PCR_SLOTS];
        uint32_t missing;
        int r;

        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++) {
                const char *s = req->pcrs_sha256[i];

                if (!(q->pcr_mask & (1U << i)))
                        continue;
                if (!s)
                        return set_message(res, "pcrs.sha256 lacks index %u which the quote covers", i);
                r = attest_hex_decode(s, strlen(s), &d->bytes[i], &d->values[i].size, /* reterr_go= */ NULL);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return set_message(res, "pcrs.sha256[%u] is not hex", i);
                d->values[i].set = true;
                d->values[i].data = d->bytes[i];
        }

        r = attest_quote_verify_pcrs(q, d->values, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return set_message(res, "pcr digest: %s", err.message ?: "pcr digest mismatch");
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                if (q->pcr_mask & (1U << i)) {
                        res->pcrs[i] = hex_encode(d->values[i].data, d->values[i].size);
                        if (!res->pcrs[i])
                                return -ENOMEM;
                }

        missing = required_pcrs(stage, policy) & ~q->pcr_mask;
        if (missing)
                return set_message(
                        res,
                        "quote covers pcrs %s but stage %s also needs %s",
                        index_list(q->pcr_mask, list),
                        attest_stage_to_string(stage),
                        index_list(missing, list2));
        return 0;
}

/* PCR 11 against the policy's phase, then each golden PCR (and 13 at the ready stage): a value the
 * policy lacks is learned where allowed, listed as unknown otherwise; then PCR 12 against the
 * command line the daemon passed (where the policy declares it predicted). *ret_pcr12 says whether
 * PCR 12 was compared. */
static int check_golden(
        const AttestVerifyParams *p,
        AttestStage stage,
        const char *phase,
        AttestResult *res,
        AttestText *learned,
        const char **ret_kubernetes,
        bool *ret_pcr12) {

        _cleanup_(attest_text_done) AttestText mismatched = {}, unknown = {}, firmware = {};
        const char *want, *matched_kubernetes = NULL;

        want = attest_policy_pcr11(p->policy, phase);
        if (!want || !streq(want, res->pcrs[11]))
                return set_message(
                        res,
                        "pcr 11 mismatch for phase %s: expected %s, got %s",
                        phase,
                        want ?: "",
                        res->pcrs[11]);

        for (size_t k = 0; k < ELEMENTSOF(golden_pcrs) + (stage == ATTEST_STAGE_READY); k++) {
                unsigned i = k < ELEMENTSOF(golden_pcrs) ? golden_pcrs[k] : 13;
                const char *got = res->pcrs[i], *kubernetes = NULL;

                /* checked event by event already (check_events()) */
                if ((i == 4 && p->policy->n_pcr4 > 0) || (i == 7 && p->expected_pcr7) ||
                    (p->firmware && (ATTEST_FIRMWARE_CHECKED & (1U << i))))
                        continue;

                want = attest_policy_expected(p->policy, i, p->kubernetes_version, &kubernetes);
                if (!want && !p->learn_golden && p->firmware_missing && (ATTEST_FIRMWARE_CHECKED & (1U << i)))
                        attest_text_add(&firmware, "%s%u", firmware.n ? "," : "", i);
                else if (!want && (p->learn_golden || i == 13)) {
                        res->learned[res->n_learned++] = i;
                        attest_text_add(learned, "%s%u=%s", learned->n ? " " : "", i, got);
                } else if (!want)
                        attest_text_add(&unknown, "%s%u", unknown.n ? "," : "", i);
                else if (!streq(want, got)) {
                        if (kubernetes)
                                attest_text_add(
                                        &mismatched,
                                        "%spcr %u expected %s for kubernetes %s, got %s",
                                        mismatched.n ? "; " : "",
                                        i,
                                        want,
                                        kubernetes,
                                        got);
                        else
                                attest_text_add(
                                        &mismatched,
                                        "%spcr %u expected %s, got %s",
                                        mismatched.n ? "; " : "",
                                        i,
                                        want,
                                        got);
                } else if (kubernetes)
                        matched_kubernetes = kubernetes;
        }
        if (mismatched.oom || unknown.oom || learned->oom || firmware.oom)
                return -ENOMEM;
        if (mismatched.n > 0)
                return set_message(res, "golden mismatch: %s", mismatched.s);
        /* No expectation for the firmware's PCRs is not a mismatch: say why none is known, and let a
         * quote sent once the run is done verify. */
        if (firmware.n > 0) {
                res->retryable = p->firmware_retryable;
                return set_message(res, "no expected events for pcr %s: %s", firmware.s, p->firmware_missing);
        }
        if (unknown.n > 0)
                return set_message(
                        res,
                        "no golden value for pcr %s in the image policy: record one with `vm-manager image "
                        "golden` or run with --attestation-learn-golden",
                        unknown.s);

        /* Last, once the firmware is known to be the expected one (another firmware changes more
         * than PCR 12, and its golden mismatch is the verdict that explains it): the stub measured
         * the kernel-cmdline-extra string it found, and another value than the one predicted means
         * the command line was changed between vm-manager and the guest. */
        if (p->policy->pcr12_predicted && p->expected_pcr12 && !streq(p->expected_pcr12, res->pcrs[12]))
                return set_message(
                        res,
                        "pcr 12 mismatch: %s from what vm-manager passed: expected %s, got %s",
                        p->policy->pcr12_credentials ?
                                "the kernel command line or the credentials handed to the vm differ" :
                                "the kernel command line handed to the vm differs",
                        p->expected_pcr12,
                        res->pcrs[12]);
        *ret_pcr12 = p->policy->pcr12_predicted && p->expected_pcr12;
        *ret_kubernetes = matched_kubernetes;
        return 0;
}

/* PCR 4 against the image's expected events and PCR 7 against the template's, where known, once
 * the logs are known to explain the quote: a verdict that names the event differing says more than
 * a final value. *ret_pcr4 is the way of booting PCR 4 matched, NULL when it was not checked. */
static int check_events(
        const AttestQuoteRequest *req,
        const AttestVerifyParams *p,
        AttestResult *res,
        const AttestExpectedPcr **ret_pcr4) {

        _cleanup_free_ AttestLogEvent *events = NULL;
        _cleanup_free_ char *message = NULL;
        size_t n = 0;
        int r;

        *ret_pcr4 = NULL;
        if (p->policy->n_pcr4 == 0 && !p->expected_pcr7 && !p->firmware)
                return 0;

        r = attest_event_log_events(
                req->event_log,
                req->event_log_size,
                req->userspace_log,
                req->userspace_log_size,
                res->event_log.userspace_events,
                1U << 4 | 1U << 7 | (p->firmware ? ATTEST_FIRMWARE_CHECKED : 0),
                &events,
                &n);
        if (r < 0)
                return r == -ENOMEM ? r : set_message(res, "event log: does not parse a second time");

        /* The firmware's PCRs first: another firmware explains any later difference. */
        for (unsigned i = 0; p->firmware && i < ELEMENTSOF(p->firmware->pcr); i++) {
                if (!(ATTEST_FIRMWARE_CHECKED & (1U << i)))
                        continue;
                r = attest_expect_check(
                        i, p->firmware->pcr + i, 1, events, n, /* ret_matched= */ NULL, &message);
                if (r < 0)
                        return r;
                if (message)
                        return set_message(res, "%s", message);
        }
        if (p->policy->n_pcr4 > 0) {
                r = attest_expect_check(4, p->policy->pcr4, p->policy->n_pcr4, events, n, ret_pcr4, &message);
                if (r < 0)
                        return r;
                if (message)
                        return set_message(res, "%s", message);
        }
        if (p->expected_pcr7) {
                r = attest_expect_check(7, p->expected_pcr7, 1, events, n, /* ret_matched= */ NULL, &message);
                if (r < 0)
                        return r;
                if (message)
                        return set_message(res, "%s; expected from %s", message, p->expected_pcr7->name ?: "?");
        }
        return 0;
}

static int verify(
        AttestNonceStore *nonces, const AttestQuoteRequest *req, const AttestVerifyParams *p, AttestResult *res) {

        _cleanup_(decoded_done) Decoded d = {};
        _cleanup_(attest_text_done) AttestText learned = {};
        _cleanup_free_ AttestQuote *q = NULL;
        _cleanup_free_ char *log_message = NULL;
        const char *phase, *matched_kubernetes = NULL;
        const AttestExpectedPcr *pcr4 = NULL;
        AttestStage stage = _ATTEST_STAGE_INVALID;
        bool pcr12 = false;
        int r;

        r = check_request(nonces, req, p, res, &stage);
        if (r != 0)
                return r;
        phase = attest_stage_phase(stage);

        q = malloc(sizeof(*q));
        if (!q)
                return -ENOMEM;
        r = check_quote(req, res, q);
        if (r != 0)
                return r;
        r = check_pcrs(req, q, p->policy, stage, &d, res);
        if (r != 0)
                return r;

        if (p->pinned_ak && p->ak_activated && !streq(p->pinned_ak, q->ak_fingerprint))
                return set_message(
                        res,
                        ATTEST_AK_NOT_ACTIVATED ": ak %.*s is not the key activated for it (%.*s)",
                        ATTEST_SHORT_FP,
                        q->ak_fingerprint,
                        ATTEST_SHORT_FP,
                        p->pinned_ak);
        if (!p->pinned_ak && p->no_ak_message) {
                res->retryable = p->no_ak_retryable;
                return set_message(res, "%s", p->no_ak_message);
        }
        if (p->pinned_ak && !streq(p->pinned_ak, q->ak_fingerprint))
                return set_message(
                        res,
                        "ak %.*s is not the key enrolled for this vm (%.*s)",
                        ATTEST_SHORT_FP,
                        q->ak_fingerprint,
                        ATTEST_SHORT_FP,
                        p->pinned_ak);

        r = attest_event_log_check(
                req->event_log,
                req->event_log_size,
                req->userspace_log,
                req->userspace_log_size,
                q->pcr_mask,
                d.values,
                &res->event_log,
                &log_message);
        if (r < 0)
                return r;
        res->has_event_log = true;
        if (log_message)
                return set_message(res, "%s", log_message);

        r = check_events(req, p, res, &pcr4);
        if (r != 0)
                return r;

        r = check_golden(p, stage, phase, res, &learned, &matched_kubernetes, &pcr12);
        if (r != 0)
                return r;

        r = set_message(
                res,
                "verified: ak %.*s, pcr 11 phase %s%s%s%s%s%s%s%s%s%s%s",
                ATTEST_SHORT_FP,
                q->ak_fingerprint,
                phase,
                p->firmware ? ", pcrs 0,2,3,6 events of this host's firmware" : "",
                pcr4 ? ", pcr 4 events of the image's " : "",
                pcr4 ? (pcr4->name ? pcr4->name : "?") : "",
                pcr4 ? " boot" : "",
                p->expected_pcr7 ? ", pcr 7 events of the variable store template" : "",
                pcr12 ? (p->policy->pcr12_credentials ? ", pcr 12 command line and credentials as passed" :
                                                        ", pcr 12 command line as passed") :
                        p->policy->pcr12_predicted ?
                        ", pcr 12 not compared (the command line of this run is unknown)" :
                        "",
                matched_kubernetes ? ", pcr 13 kubernetes " : "",
                matched_kubernetes ?: "",
                learned.n ? "; accepted without golden value: " : "",
                learned.n ? learned.s : "");
        if (r < 0)
                return r;

        /* trust on first use: the first verified initrd quote enrolls its AK */
        if (!p->pinned_ak) {
                if (stage != ATTEST_STAGE_INITRD)
                        return set_message(
                                res, "no ak enrolled for this vm: an initrd-stage quote must verify first");
                res->enroll = true;
        }
        res->verified = true;
        return 0;
}

int attest_verify_quote(
        AttestNonceStore *nonces, const AttestQuoteRequest *req, const AttestVerifyParams *p, AttestResult *ret) {
        _cleanup_(attest_result_done) AttestResult res = {};
        int r;

        assert_return(nonces, -EINVAL);
        assert_return(req, -EINVAL);
        assert_return(p && p->vm_id, -EINVAL);
        assert_return(ret, -EINVAL);

        res.at = p->at;
        r = verify(nonces, req, p, &res);
        if (r < 0)
                return r;
        *ret = res;
        res = (AttestResult){};
        return 0;
}

/* Go sorts a map's keys by their text: 0, 1, 11, 13, 2, … */
static int cmp_index_text(const void *a, const void *b) {
        char x[4], y[4];

        (void) snprintf(x, sizeof(x), "%u", *(const unsigned *) a);
        (void) snprintf(y, sizeof(y), "%u", *(const unsigned *) b);
        return strcmp(x, y);
}

json_t *attest_result_to_json(const AttestResult *r) {
        json_auto_t *o = NULL;
        char at[RFC3339_MAX];

        assert_return(r, NULL);

        format_rfc3339(r->at, at);
        o = json_pack("{s:b}", "verified", r->verified);
        if (!o)
                return NULL;
        if (r->message && *r->message && json_object_set_new(o, "message", json_string(r->message)) < 0)
                return NULL;
        if (json_object_set_new(o, "at", json_string(at)) < 0)
                return NULL;
        if (r->ak_fingerprint && *r->ak_fingerprint &&
            json_object_set_new(o, "akFingerprint", json_string(r->ak_fingerprint)) < 0)
                return NULL;

        unsigned idx[ATTEST_PCR_SLOTS];
        size_t n = 0;
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                if (r->pcrs[i])
                        idx[n++] = i;
        if (n > 0) {
                json_t *pcrs = json_object();

                if (!pcrs || json_object_set_new(o, "pcrs", pcrs) < 0)
                        return NULL;
                qsort(idx, n, sizeof(unsigned), cmp_index_text);
                for (size_t k = 0; k < n; k++) {
                        char key[4];

                        (void) snprintf(key, sizeof(key), "%u", idx[k]);
                        if (json_object_set_new(pcrs, key, json_string(r->pcrs[idx[k]])) < 0)
                                return NULL;
                }
        }
        if (r->has_event_log &&
            json_object_set_new(
                    o,
                    "eventLog",
                    json_pack(
                            "{s:b,s:I,s:I}",
                            "replayed",
                            r->event_log.replayed,
                            "firmwareEvents",
                            (json_int_t) r->event_log.firmware_events,
                            "userspaceEvents",
                            (json_int_t) r->event_log.userspace_events)) < 0)
                return NULL;
        if (r->n_learned > 0) {
                json_t *l = json_array();

                if (!l || json_object_set_new(o, "learned", l) < 0)
                        return NULL;
                for (size_t k = 0; k < r->n_learned; k++)
                        if (json_array_append_new(l, json_integer(r->learned[k])) < 0)
                                return NULL;
        }
        return TAKE_PTR(o);
}

int attest_result_from_json(json_t *v, AttestResult *ret) {
        _cleanup_(attest_result_done) AttestResult res = {};
        json_t *e, *pcrs, *learned;
        const char *key;
        size_t i;

        assert_return(ret, -EINVAL);

        if (!json_is_object(v) || !json_is_boolean(json_object_get(v, "verified")))
                return -EINVAL;
        res.verified = json_is_true(json_object_get(v, "verified"));

        e = json_object_get(v, "message");
        if (e) {
                if (!json_is_string(e))
                        return -EINVAL;
                res.message = strdup(json_string_value(e));
                if (!res.message)
                        return -ENOMEM;
        }
        e = json_object_get(v, "at");
        if (e && (!json_is_string(e) || parse_rfc3339(json_string_value(e), &res.at) < 0))
                return -EINVAL;
        e = json_object_get(v, "akFingerprint");
        if (e) {
                if (!json_is_string(e))
                        return -EINVAL;
                res.ak_fingerprint = strdup(json_string_value(e));
                if (!res.ak_fingerprint)
                        return -ENOMEM;
        }
        pcrs = json_object_get(v, "pcrs");
        if (pcrs && !json_is_object(pcrs))
                return -EINVAL;
        json_object_foreach(pcrs, key, e) {
                char *end;
                unsigned long k = strtoul(key, &end, 10);

                if (*end || end == key || k >= ATTEST_PCR_SLOTS || !json_is_string(e) || res.pcrs[k])
                        return -EINVAL;
                res.pcrs[k] = strdup(json_string_value(e));
                if (!res.pcrs[k])
                        return -ENOMEM;
        }
        e = json_object_get(v, "eventLog");
        if (e) {
                json_t *fw = json_object_get(e, "firmwareEvents"), *us = json_object_get(e, "userspaceEvents");

                if (!json_is_boolean(json_object_get(e, "replayed")) || !json_is_integer(fw) ||
                    !json_is_integer(us) || json_integer_value(fw) < 0 || json_integer_value(fw) > UINT32_MAX ||
                    json_integer_value(us) < 0 || json_integer_value(us) > UINT32_MAX)
                        return -EINVAL;
                res.has_event_log = true;
                res.event_log = (AttestEventLogSummary){
                        .replayed = json_is_true(json_object_get(e, "replayed")),
                        .firmware_events = (unsigned) json_integer_value(fw),
                        .userspace_events = (unsigned) json_integer_value(us),
                };
        }
        learned = json_object_get(v, "learned");
        if (learned && (!json_is_array(learned) || json_array_size(learned) > ATTEST_PCR_SLOTS))
                return -EINVAL;
        json_array_foreach(learned, i, e) {
                if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                    json_integer_value(e) >= (json_int_t) ATTEST_PCR_SLOTS)
                        return -EINVAL;
                res.learned[res.n_learned++] = (unsigned) json_integer_value(e);
        }

        *ret = res;
        res = (AttestResult){};
        return 0;
}

uint32_t attest_policy_missing_golden(const AttestPolicy *policy, bool pcr7_expected, bool firmware_expected) {
        uint32_t missing = 0;

        for (size_t k = 0; k < ELEMENTSOF(golden_pcrs); k++)
                if (!policy || !attest_policy_expected(policy, golden_pcrs[k], NULL, NULL))
                        missing |= 1U << golden_pcrs[k];
        if (policy && policy->n_pcr4 > 0)
                missing &= ~(1U << 4);
        if (pcr7_expected)
                missing &= ~(1U << 7);
        if (firmware_expected)
                missing &= ~ATTEST_FIRMWARE_CHECKED;
        return missing;
}
