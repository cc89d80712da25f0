/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The verifier end to end on real swtpm quotes (tests/data/attest/): what verifies, and each
 * tamper rejected at its own step with the reference's message (network-imds-attest.md §4.1). */
#include "test-attest-fixtures.h"

#include "attest-expect.h"
#include "attest-fwlog.h"
#include "attest-predict.h"
#include "attest-verify.h"
#include "fs-util.h"

#define T0 ((usec_t) 1000 * USEC_PER_SEC)
#define AT ((usec_t) 1714564800 * USEC_PER_SEC + 123456) /* 2024-05-01T12:00:00.123456Z */

typedef struct Ctx {
        AttestNonceStore *nonces;
        AttestPolicy *policy;
        AttestQuoteRequest req;
        AttestResult res;
        AttestVerifyParams params;
        char *nonce;
} Ctx;

static int setup(void **state) {
        Ctx *c = calloc(1, sizeof(Ctx));

        assert_non_null(c);
        assert_ok(attest_nonce_store_new(&c->nonces));
        c->policy = fixture_policy();
        c->nonce = fixture_text("nonce.hex");
        c->params = (AttestVerifyParams){
                .vm_id = FIXTURE_VM,
                .now = T0,
                .at = AT,
                .policy = c->policy,
                .no_policy_message = "no attestation policy: image base has no policy.json",
        };
        *state = c;
        return 0;
}

static int teardown(void **state) {
        Ctx *c = *state;

        attest_quote_request_done(&c->req);
        attest_result_done(&c->res);
        attest_policy_free(c->policy);
        attest_nonce_store_free(c->nonces);
        free(c->nonce);
        free(c);
        return 0;
}

/* Issues the fixture nonce to the VM and verifies c->req with c->params. */
static void run(Ctx *c) {
        attest_result_done(&c->res);
        assert_ok(attest_nonce_add(c->nonces, FIXTURE_VM, c->nonce, c->params.now));
        assert_ok(attest_verify_quote(c->nonces, &c->req, &c->params, &c->res));
}

static void load(Ctx *c, const char *key, const char *stage) {
        attest_quote_request_done(&c->req);
        fixture_request(key, stage, &c->req);
}

static char *short_fp(const char *fp) {
        return strndup(fp, 16);
}

static void verifies_initrd(Ctx *c, const char *key) {
        _cleanup_free_ char *fp = NULL, *want = NULL;

        load(c, key, "initrd");
        run(c);
        assert_true(c->res.verified);
        assert_true(c->res.enroll);
        assert_non_null(c->res.ak_fingerprint);
        assert_int_equal(strlen(c->res.ak_fingerprint), 64);
        fp = short_fp(c->res.ak_fingerprint);
        assert_true(asprintf(&want, "verified: ak %s, pcr 11 phase enter-initrd", fp) > 0);
        assert_string_equal(c->res.message, want);
        assert_int_equal(c->res.n_learned, 0);
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                if (i <= 7 || i == 11)
                        assert_string_equal(c->res.pcrs[i], c->req.pcrs_sha256[i]);
                else
                        assert_null(c->res.pcrs[i]);
        /* the logs replayed: OVMF's 36 measurements, systemd's enter-initrd and os-separator */
        assert_true(c->res.has_event_log && c->res.event_log.replayed);
        assert_int_equal(c->res.event_log.firmware_events, 36);
        assert_int_equal(c->res.event_log.userspace_events, 2);
        /* the nonce was used up */
        assert_int_equal(attest_nonce_count(c->nonces, FIXTURE_VM), 0);
}

static void test_ecdsa_initrd(void **state) {
        verifies_initrd(*state, "ecdsa");
}

static void test_rsassa_initrd(void **state) {
        verifies_initrd(*state, "rsassa");
}

static void test_rsapss_initrd(void **state) {
        verifies_initrd(*state, "rsapss");
}

/* initrd enrolls, ready verifies against the pin with PCR 13 from the policy's pcr13 entry. */
static void test_tofu_then_ready(void **state) {
        const char *keys[] = { "ecdsa", "rsassa", "rsapss" };
        Ctx *c = *state;

        for (size_t k = 0; k < ELEMENTSOF(keys); k++) {
                _cleanup_free_ char *pin = NULL, *want = NULL, *fp = NULL;

                load(c, keys[k], "initrd");
                c->params.pinned_ak = NULL;
                run(c);
                assert_true(c->res.verified && c->res.enroll);
                pin = strdup(c->res.ak_fingerprint);

                load(c, keys[k], "ready");
                c->params.pinned_ak = pin;
                c->params.kubernetes_version = FIXTURE_KUBERNETES;
                run(c);
                fp = short_fp(pin);
                assert_true(
                        asprintf(
                                &want,
                                "verified: ak %s, pcr 11 phase enter-initrd:leave-initrd:sysinit:ready, pcr 13 "
                                "kubernetes 1.36.4",
                                fp) > 0);
                assert_string_equal(c->res.message, want);
                assert_true(c->res.verified);
                assert_false(c->res.enroll);
                assert_string_equal(c->res.ak_fingerprint, pin);
                assert_non_null(c->res.pcrs[13]);
                c->params.kubernetes_version = NULL;
        }
}

static void test_ready_without_pin(void **state) {
        Ctx *c = *state;

        load(c, "ecdsa", "ready");
        c->params.kubernetes_version = FIXTURE_KUBERNETES;
        run(c);
        assert_false(c->res.verified);
        assert_false(c->res.enroll);
        assert_string_equal(
                c->res.message, "no ak enrolled for this vm: an initrd-stage quote must verify first");
        /* what was learned on the way is kept */
        assert_non_null(c->res.ak_fingerprint);
        assert_non_null(c->res.pcrs[13]);
}

/* PCR 13 without a pcr13 entry for the VM's version nor a golden value: accepted, reported. */
static void test_ready_pcr13_learned(void **state) {
        _cleanup_free_ char *pcr13 = fixture_pcr("ready", 13), *tail = NULL;
        Ctx *c = *state;

        load(c, "rsapss", "initrd");
        run(c);
        _cleanup_free_ char *pin = strdup(c->res.ak_fingerprint);

        load(c, "rsapss", "ready");
        c->params.pinned_ak = pin;
        c->params.kubernetes_version = "1.35.0";
        run(c);
        assert_true(c->res.verified);
        assert_int_equal(c->res.n_learned, 1);
        assert_int_equal(c->res.learned[0], 13);
        assert_true(
                asprintf(
                        &tail,
                        "phase enter-initrd:leave-initrd:sysinit:ready; accepted without golden value: 13=%s",
                        pcr13) > 0);
        assert_contains(c->res.message, tail);
}

/* pcr13 selected by the VM's Kubernetes version, and the two mismatch texts. */
static void test_pcr13_by_kubernetes(void **state) {
        _cleanup_free_ char *pcr13 = fixture_pcr("ready", 13), *want = NULL;
        json_auto_t *pj = fixture_policy_json();
        AttestPolicy *edited;
        const char *wrong = "00000000000000000000000000000000000000000000000000000000000000ff";
        Ctx *c = *state;

        load(c, "ecdsa", "initrd");
        run(c);
        _cleanup_free_ char *pin = strdup(c->res.ak_fingerprint);
        c->params.pinned_ak = pin;

        /* the entry for 1.36.4 is wrong */
        assert_ok(json_object_set_new(json_object_get(pj, "pcr13"), "1.36.4", json_string(wrong)));
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        c->params.kubernetes_version = FIXTURE_KUBERNETES;
        load(c, "ecdsa", "ready");
        run(c);
        assert_false(c->res.verified);
        assert_true(
                asprintf(&want, "golden mismatch: pcr 13 expected %s for kubernetes 1.36.4, got %s", wrong, pcr13) >
                0);
        assert_string_equal(c->res.message, want);

        /* another version falls back to golden 13, which is wrong too */
        assert_ok(json_object_set_new(
                json_object_get(json_object_get(pj, "golden"), "sha256"), "13", json_string(wrong)));
        attest_policy_free(edited);
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        c->params.kubernetes_version = "1.30.0";
        load(c, "ecdsa", "ready");
        run(c);
        free(want);
        assert_true(asprintf(&want, "golden mismatch: pcr 13 expected %s, got %s", wrong, pcr13) > 0);
        assert_string_equal(c->res.message, want);

        /* and the right golden 13 verifies without the kubernetes suffix */
        assert_ok(json_object_set_new(
                json_object_get(json_object_get(pj, "golden"), "sha256"), "13", json_string(pcr13)));
        attest_policy_free(edited);
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        load(c, "ecdsa", "ready");
        run(c);
        assert_true(c->res.verified);
        assert_int_equal(c->res.n_learned, 0);
        assert_contains(c->res.message, "pcr 11 phase enter-initrd:leave-initrd:sysinit:ready");
        assert_null(strstr(c->res.message, "kubernetes"));

        c->params.policy = c->policy;
        attest_policy_free(edited);
}

static void test_nonce_failures(void **state) {
        char other[ATTEST_NONCE_HEX + 1];
        Ctx *c = *state;

        load(c, "ecdsa", "initrd");

        /* never issued */
        assert_ok(attest_verify_quote(c->nonces, &c->req, &c->params, &c->res));
        assert_false(c->res.verified);
        assert_string_equal(c->res.message, "unknown or expired nonce");
        assert_null(c->res.ak_fingerprint);

        /* reused */
        run(c);
        assert_true(c->res.verified);
        attest_result_done(&c->res);
        assert_ok(attest_verify_quote(c->nonces, &c->req, &c->params, &c->res));
        assert_string_equal(c->res.message, "unknown or expired nonce");

        /* expired: the TTL itself is still fine, a microsecond more is not */
        assert_ok(attest_nonce_add(c->nonces, FIXTURE_VM, c->nonce, T0));
        c->params.now = T0 + ATTEST_NONCE_TTL + 1;
        attest_result_done(&c->res);
        assert_ok(attest_verify_quote(c->nonces, &c->req, &c->params, &c->res));
        assert_string_equal(c->res.message, "unknown or expired nonce");
        assert_ok(attest_nonce_add(c->nonces, FIXTURE_VM, c->nonce, T0));
        c->params.now = T0 + ATTEST_NONCE_TTL;
        attest_result_done(&c->res);
        assert_ok(attest_verify_quote(c->nonces, &c->req, &c->params, &c->res));
        assert_true(c->res.verified);
        c->params.now = T0;

        /* issued to another VM */
        assert_ok(attest_nonce_add(c->nonces, "vm-2", c->nonce, T0));
        attest_result_done(&c->res);
        assert_ok(attest_verify_quote(c->nonces, &c->req, &c->params, &c->res));
        assert_string_equal(c->res.message, "unknown or expired nonce");

        /* a fresh nonce of this VM that the quote does not carry */
        assert_ok(attest_nonce_issue(c->nonces, FIXTURE_VM, T0, other));
        free(c->req.nonce);
        c->req.nonce = strdup(other);
        attest_result_done(&c->res);
        assert_ok(attest_verify_quote(c->nonces, &c->req, &c->params, &c->res));
        assert_false(c->res.verified);
        assert_string_equal(c->res.message, "nonce: quote qualifying data does not match the nonce");
        assert_non_null(c->res.ak_fingerprint);
        assert_null(c->res.pcrs[0]);
}

static void test_stage_and_policy(void **state) {
        Ctx *c = *state;

        load(c, "ecdsa", "initrd");
        free(c->req.stage);
        c->req.stage = strdup("bogus");
        run(c);
        assert_string_equal(c->res.message, "unknown stage \"bogus\"");

        load(c, "ecdsa", "initrd");
        c->params.policy = NULL;
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(c->res.message, "no attestation policy: image base has no policy.json");
        c->params.policy = c->policy;
}

static void test_pcr_tampering(void **state) {
        Ctx *c = *state;
        char *v;

        /* one nibble of PCR 3 changed */
        load(c, "rsassa", "initrd");
        v = c->req.pcrs_sha256[3];
        v[10] = v[10] == '0' ? '1' : '0';
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(c->res.message, "pcr digest: pcr digest mismatch");
        assert_non_null(c->res.ak_fingerprint);
        assert_null(c->res.pcrs[3]);

        load(c, "rsassa", "initrd");
        c->req.pcrs_sha256[4] = mfree(c->req.pcrs_sha256[4]);
        run(c);
        assert_string_equal(c->res.message, "pcrs.sha256 lacks index 4 which the quote covers");

        load(c, "rsassa", "initrd");
        c->req.pcrs_sha256[5][0] = 'x';
        run(c);
        assert_string_equal(c->res.message, "pcrs.sha256[5] is not hex");

        load(c, "rsassa", "initrd");
        c->req.pcrs_sha256[6][62] = 0;
        run(c);
        assert_string_equal(c->res.message, "pcr digest: pcr value: pcr 6 has 31 bytes, sha256 needs 32");

        load(c, "rsassa", "initrd");
        c->req.pcrs_sha256[7][0] = 0;
        run(c);
        assert_string_equal(c->res.message, "pcr digest: pcr value: pcr 7 has 0 bytes, sha256 needs 32");

        /* uppercase hex is hex; values of PCRs the quote does not cover are ignored */
        load(c, "rsassa", "initrd");
        for (char *p = c->req.pcrs_sha256[2]; *p; p++)
                if (*p >= 'a' && *p <= 'f')
                        *p = (char) (*p - 'a' + 'A');
        c->req.pcrs_sha256[20] = strdup("not hex at all");
        run(c);
        assert_true(c->res.verified);
        assert_null(c->res.pcrs[20]);
        assert_null(strpbrk(c->res.pcrs[2], "ABCDEF"));
}

static void test_signature_tampering(void **state) {
        Ctx *c = *state;

        load(c, "ecdsa", "initrd");
        c->req.signature[c->req.signature_size - 5] ^= 0x01;
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(c->res.message, "signature: signature does not verify");
        assert_non_null(c->res.ak_fingerprint);

        load(c, "rsapss", "initrd");
        c->req.signature[100] ^= 0x80;
        run(c);
        assert_string_equal(c->res.message, "signature: signature does not verify");

        /* a byte of the signed data: the clock info */
        load(c, "rsassa", "ready");
        c->req.quote[c->req.quote_size - 60] ^= 0x01;
        run(c);
        assert_string_equal(c->res.message, "signature: signature does not verify");

        /* a signature of another key */
        load(c, "ecdsa", "initrd");
        _cleanup_free_ char *other = fixture_name("rsassa", "initrd.sig");
        free(c->req.signature);
        c->req.signature = fixture_read(other, &c->req.signature_size);
        run(c);
        assert_string_equal(
                c->res.message, "quote: signature does not verify: rsa signature from a non-rsa key");
}

static void test_parse_failure_message(void **state) {
        Ctx *c = *state;

        load(c, "ecdsa", "initrd");
        c->req.quote_size = 40;
        run(c);
        assert_string_equal(c->res.message, "quote: malformed quote: attest: unexpected end of data");
        assert_null(c->res.ak_fingerprint);
}

static void test_coverage(void **state) {
        Ctx *c = *state;

        attest_quote_request_done(&c->req);
        fixture_request_full("ecdsa", "initrd", "partial", "initrd", &c->req);
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(c->res.message, "quote covers pcrs 0,1,2,3,4,5,6,7 but stage initrd also needs 11");
        /* the digest matched, so the values are recorded */
        assert_non_null(c->res.pcrs[7]);

        load(c, "ecdsa", "initrd");
        free(c->req.stage);
        c->req.stage = strdup("ready");
        run(c);
        assert_string_equal(
                c->res.message, "quote covers pcrs 0,1,2,3,4,5,6,7,11 but stage ready also needs 13");

        attest_quote_request_done(&c->req);
        fixture_request_full("ecdsa", "initrd", "sha1", "initrd", &c->req);
        run(c);
        assert_string_equal(c->res.message, "quote selects pcr bank sha1, want sha256");
}

/* An image whose policy declares PCR 12 predicted has an agent that quotes it: a quote without it (an
 * agent of an older image under a newer policy) is rejected, at both stages. Without the
 * declaration the same quote verifies, as it always did (test_ecdsa_initrd), whatever the daemon
 * predicts. */
static void test_pcr12_required(void **state) {
        Ctx *c = *state;

        c->policy->pcr12_predicted = true;
        c->params.expected_pcr12 =
                "00000000000000000000000000000000000000000000000000000000000000"
                "00";
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(
                c->res.message, "quote covers pcrs 0,1,2,3,4,5,6,7,11 but stage initrd also needs 12");

        load(c, "ecdsa", "ready");
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(
                c->res.message, "quote covers pcrs 0,1,2,3,4,5,6,7,11,13 but stage ready also needs 12");

        c->policy->pcr12_predicted = false;
        c->params.expected_pcr12 =
                "11111111111111111111111111111111111111111111111111111111111111"
                "11";
        load(c, "ecdsa", "initrd");
        run(c);
        assert_true(c->res.verified);
        assert_null(strstr(c->res.message, "pcr 12"));
}

static void test_pin_mismatch(void **state) {
        _cleanup_free_ char *want = NULL, *a = NULL, *b = NULL;
        Ctx *c = *state;

        load(c, "ecdsa", "initrd");
        run(c);
        _cleanup_free_ char *pin = strdup(c->res.ak_fingerprint);

        c->params.pinned_ak = pin;
        load(c, "rsassa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_false(c->res.enroll);
        a = short_fp(c->res.ak_fingerprint);
        b = short_fp(pin);
        assert_true(asprintf(&want, "ak %s is not the key enrolled for this vm (%s)", a, b) > 0);
        assert_string_equal(c->res.message, want);

        /* same at ready */
        load(c, "rsapss", "ready");
        c->params.kubernetes_version = FIXTURE_KUBERNETES;
        run(c);
        assert_startswith(c->res.message, "ak ");
        assert_contains(c->res.message, b);

        /* the pinned key itself passes again at initrd, without enrolling */
        load(c, "ecdsa", "initrd");
        run(c);
        assert_true(c->res.verified);
        assert_false(c->res.enroll);
}

/* With credential activation the AK is the activated one or nothing: no quote enrolls a key. */
static void test_activated_ak(void **state) {
        _cleanup_free_ char *want = NULL, *a = NULL, *b = NULL;
        Ctx *c = *state;

        /* no key activated yet: the caller's message, retryable as it says, and nothing enrolled */
        c->params.no_ak_message = ATTEST_AK_NOT_ACTIVATED ": no credential activation yet";
        c->params.no_ak_retryable = true;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_false(c->res.enroll);
        assert_true(c->res.retryable);
        assert_string_equal(c->res.message, ATTEST_AK_NOT_ACTIVATED ": no credential activation yet");
        _cleanup_free_ char *activated = strdup(c->res.ak_fingerprint);
        assert_non_null(activated);

        /* the activated key verifies, at initrd and at ready, without enrolling */
        c->params.pinned_ak = activated;
        c->params.ak_activated = true;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_true(c->res.verified);
        assert_false(c->res.enroll);

        /* another key is not the activated one, and that is final */
        load(c, "rsassa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_false(c->res.retryable);
        a = short_fp(c->res.ak_fingerprint);
        b = short_fp(activated);
        assert_true(
                asprintf(&want, ATTEST_AK_NOT_ACTIVATED ": ak %s is not the key activated for it (%s)", a, b) >
                0);
        assert_string_equal(c->res.message, want);
}

static void test_pcr11(void **state) {
        _cleanup_free_ char *got = fixture_pcr("initrd", 11), *want = NULL,
                            *ready11 = fixture_pcr("ready", 11);
        json_auto_t *pj = fixture_policy_json();
        const char *other = "1111111111111111111111111111111111111111111111111111111111111111";
        AttestPolicy *edited;
        Ctx *c = *state;

        assert_ok(json_object_set_new(json_object_get(pj, "pcr11"), "enter-initrd", json_string(other)));
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_true(
                asprintf(&want, "pcr 11 mismatch for phase enter-initrd: expected %s, got %s", other, got) > 0);
        assert_string_equal(c->res.message, want);
        assert_string_equal(c->res.pcrs[11], got);

        /* a ready quote presented as initrd carries the ready phase's PCR 11 */
        c->params.policy = c->policy;
        load(c, "ecdsa", "ready");
        free(c->req.stage);
        c->req.stage = strdup("initrd");
        run(c);
        free(want);
        assert_true(
                asprintf(&want, "pcr 11 mismatch for phase enter-initrd: expected %s, got %s", got, ready11) >
                0);
        assert_string_equal(c->res.message, want);

        /* the policy's case does not matter */
        for (char *p = got; *p; p++)
                if (*p >= 'a' && *p <= 'f')
                        *p = (char) (*p - 'a' + 'A');
        assert_ok(json_object_set_new(json_object_get(pj, "pcr11"), "enter-initrd", json_string(got)));
        attest_policy_free(edited);
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_true(c->res.verified);

        c->params.policy = c->policy;
        attest_policy_free(edited);
}

static void test_golden(void **state) {
        _cleanup_free_ char *pcr0 = fixture_pcr("initrd", 0), *pcr6 = fixture_pcr("initrd", 6), *want = NULL;
        json_auto_t *pj = fixture_policy_json();
        json_t *golden = json_object_get(json_object_get(pj, "golden"), "sha256");
        const char *z = "0000000000000000000000000000000000000000000000000000000000000000";
        AttestPolicy *edited;
        Ctx *c = *state;

        assert_ok(json_object_set_new(golden, "0", json_string(z)));
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        load(c, "rsapss", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_true(asprintf(&want, "golden mismatch: pcr 0 expected %s, got %s", z, pcr0) > 0);
        assert_string_equal(c->res.message, want);
        assert_int_equal(c->res.n_learned, 0);

        /* all mismatches, in index order; learn mode does not excuse a mismatch */
        assert_ok(json_object_set_new(golden, "6", json_string(z)));
        attest_policy_free(edited);
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        c->params.learn_golden = true;
        load(c, "rsapss", "initrd");
        run(c);
        free(want);
        assert_true(
                asprintf(
                        &want,
                        "golden mismatch: pcr 0 expected %s, got %s; pcr 6 expected %s, got %s",
                        z,
                        pcr0,
                        z,
                        pcr6) > 0);
        assert_string_equal(c->res.message, want);
        c->params.learn_golden = false;

        /* PCRs 1 and 5 are never compared, whatever the policy says */
        assert_ok(json_object_set_new(golden, "0", json_string(pcr0)));
        assert_ok(json_object_set_new(golden, "6", json_string(pcr6)));
        assert_ok(json_object_set_new(golden, "1", json_string(z)));
        assert_ok(json_object_set_new(golden, "5", json_string(z)));
        attest_policy_free(edited);
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        load(c, "rsapss", "initrd");
        run(c);
        assert_true(c->res.verified);
        assert_non_null(c->res.pcrs[1]);
        assert_non_null(c->res.pcrs[5]);

        c->params.policy = c->policy;
        attest_policy_free(edited);
}

static void test_learn_mode(void **state) {
        json_auto_t *pj = fixture_policy_json();
        AttestPolicy *edited;
        Ctx *c = *state;

        json_object_del(pj, "golden");
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;

        /* without learn mode: unknown */
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(
                c->res.message,
                "no golden value for pcr 0,2,3,4,6,7 in the image policy: record one with `vm-manager image golden` "
                "or run with --attestation-learn-golden");

        /* learn mode records 0,2,3,4,6,7 */
        c->params.learn_golden = true;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_true(c->res.verified);
        assert_int_equal(c->res.n_learned, 6);
        const unsigned want[] = { 0, 2, 3, 4, 6, 7 };
        for (size_t i = 0; i < ELEMENTSOF(want); i++)
                assert_int_equal(c->res.learned[i], want[i]);

        _cleanup_free_ char *tail = strdup("; accepted without golden value:");
        for (size_t i = 0; i < ELEMENTSOF(want); i++) {
                _cleanup_free_ char *v = fixture_pcr("initrd", want[i]);
                char *t = NULL;
                assert_true(asprintf(&t, "%s %u=%s", tail, want[i], v) > 0);
                free(tail);
                tail = t;
        }
        _cleanup_free_ char *fp = short_fp(c->res.ak_fingerprint), *msg = NULL;
        assert_true(asprintf(&msg, "verified: ak %s, pcr 11 phase enter-initrd%s", fp, tail) > 0);
        assert_string_equal(c->res.message, msg);

        /* at ready, 13 joins them */
        _cleanup_free_ char *pin = strdup(c->res.ak_fingerprint);
        c->params.pinned_ak = pin;
        load(c, "ecdsa", "ready");
        run(c);
        assert_true(c->res.verified);
        assert_int_equal(c->res.n_learned, 7);
        assert_int_equal(c->res.learned[6], 13);

        c->params.learn_golden = false;
        c->params.policy = c->policy;
        attest_policy_free(edited);
}

/* Check 11a: the logs replay to the quoted PCRs, after the digest, coverage and AK checks and before
 * PCR 11 and the golden values. */
static void test_event_log(void **state) {
        _cleanup_free_ char *pin = NULL, *want = NULL, *a = NULL, *b = NULL;
        json_auto_t *pj = fixture_policy_json();
        AttestPolicy *edited;
        Ctx *c = *state;
        char *d;

        /* a quote without its logs: nothing explains the measured PCRs */
        load(c, "ecdsa", "initrd");
        c->req.event_log = mfree(c->req.event_log);
        c->req.event_log_size = 0;
        c->req.userspace_log = mfree(c->req.userspace_log);
        c->req.userspace_log_size = 0;
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(
                c->res.message,
                "no event log: the quote carries none, but pcrs 0,1,2,3,4,5,6,7,11 are not at their reset values");
        assert_true(c->res.has_event_log);
        assert_false(c->res.event_log.replayed);
        assert_non_null(c->res.pcrs[0]);

        /* a userspace log whose enter-initrd record was edited: the log lies about PCR 11. It is
         * named before a PCR 11 and a golden value that do not match either. */
        assert_ok(json_object_set_new(
                json_object_get(pj, "pcr11"),
                "enter-initrd",
                json_string("1111111111111111111111111111111111111111111111111111111111111111")));
        assert_ok(json_object_set_new(
                json_object_get(json_object_get(pj, "golden"), "sha256"),
                "0",
                json_string("0000000000000000000000000000000000000000000000000000000000000000")));
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        load(c, "rsassa", "initrd");
        d = strstr((char *) c->req.userspace_log, "\"hashAlg\":\"sha256\",\"digest\":\"");
        assert_non_null(d);
        d += strlen("\"hashAlg\":\"sha256\",\"digest\":\"");
        d[0] = d[0] == '0' ? '1' : '0';
        run(c);
        assert_false(c->res.verified);
        assert_startswith(c->res.message, "event log mismatch: pcr 11 replays to ");
        assert_contains(c->res.message, c->req.pcrs_sha256[11]);
        assert_null(strchr(c->res.message, ';'));
        assert_false(c->res.event_log.replayed);
        c->params.policy = c->policy;
        attest_policy_free(edited);

        /* the AK pin is checked before it */
        load(c, "ecdsa", "initrd");
        run(c);
        pin = strdup(c->res.ak_fingerprint);
        c->params.pinned_ak = pin;
        load(c, "rsapss", "initrd");
        c->req.userspace_log_size = 0;
        run(c);
        a = short_fp(c->res.ak_fingerprint);
        b = short_fp(pin);
        assert_true(asprintf(&want, "ak %s is not the key enrolled for this vm (%s)", a, b) > 0);
        assert_string_equal(c->res.message, want);
        assert_false(c->res.has_event_log);
        c->params.pinned_ak = NULL;

        /* and the PCR digest too: a log cannot vouch for values the TPM did not sign */
        load(c, "rsapss", "initrd");
        c->req.pcrs_sha256[4][0] = c->req.pcrs_sha256[4][0] == '0' ? '1' : '0';
        run(c);
        assert_string_equal(c->res.message, "pcr digest: pcr digest mismatch");
        assert_false(c->res.has_event_log);

        /* at ready, the log has the records of both stages and replays to PCRs 11 and 13 */
        load(c, "ecdsa", "initrd");
        run(c);
        free(pin);
        pin = strdup(c->res.ak_fingerprint);
        c->params.pinned_ak = pin;
        c->params.kubernetes_version = FIXTURE_KUBERNETES;
        load(c, "ecdsa", "ready");
        run(c);
        assert_true(c->res.verified);
        assert_true(c->res.event_log.replayed);
        assert_int_equal(c->res.event_log.userspace_events, 7);

        /* the ready quote with the initrd's log falls short of PCRs 11 and 13 */
        load(c, "ecdsa", "ready");
        fixture_logs("initrd", &c->req);
        run(c);
        assert_startswith(c->res.message, "event log mismatch: pcr 11 replays to ");
        assert_contains(c->res.message, "; pcr 13 replays to ");
        c->params.pinned_ak = NULL;
        c->params.kubernetes_version = NULL;
}

/* The recorded boot's PCR 4 applications (the test image's UKI, booted as the boot option, and its
 * .linux) as tpm2_eventlog shows them, events 23 and 32. */
#define FIXTURE_UKI "f452cbeaabdbf0e342f94299dbfb46bc428f4ae55974d364b2cda5d75b6c0681"
#define FIXTURE_LINUX "65c89335d8a5d25a8eeffd4de4a02087ac8dcf26165dbff8806a19f68ecd2842"

/* policy.json's "pcr4" for one way of booting that runs the UKI uki and the kernel linux, with the
 * value the events replay to, as images/scripts/policy.py writes it. */
static json_t *pcr4_boot(const char *uki, const char *linux_) {
        const char *apps[] = { uki, linux_ };
        uint8_t digests[4][ATTEST_SHA256_SIZE];
        char hex[4][ATTEST_SHA256_HEX + 1], value[ATTEST_SHA256_HEX + 1];
        uint8_t pcr[ATTEST_SHA256_SIZE];

        assert_ok(attest_digest_efi_action(ATTEST_EFI_ACTION_BOOT_OPTION, digests[0]));
        assert_ok(attest_digest_separator(digests[1]));
        for (unsigned i = 0; i < 2; i++)
                assert_int_equal(
                        hex_decode(apps[i], ATTEST_SHA256_HEX, false, digests[2 + i], /* reterr_offset= */ NULL),
                        0);
        assert_ok(attest_pcr_replay(digests, 4, pcr));
        for (unsigned i = 0; i < 4; i++)
                hex_format(digests[i], ATTEST_SHA256_SIZE, hex[i]);
        return json_pack(
                "{s:[{s:s,s:s,s:s},{s:s,s:s},{s:s,s:s,s:s},{s:s,s:s,s:s}],s:s}",
                "events",
                "type",
                "EV_EFI_ACTION",
                "sha256",
                hex[0],
                "what",
                ATTEST_EFI_ACTION_BOOT_OPTION,
                "type",
                "EV_SEPARATOR",
                "sha256",
                hex[1],
                "type",
                "EV_EFI_BOOT_SERVICES_APPLICATION",
                "sha256",
                hex[2],
                "what",
                "the UKI",
                "type",
                "EV_EFI_BOOT_SERVICES_APPLICATION",
                "sha256",
                hex[3],
                "what",
                "the UKI's .linux",
                "value",
                hex_format(pcr, sizeof(pcr), value));
}

/* PCR 4 from the image's events and PCR 7 from the variable store template: no golden value is
 * needed for either, and a boot of another UKI is named by its event. */
static void test_expected_events(void **state) {
        _cleanup_(attest_expected_pcr_done) AttestExpectedPcr pcr7 = {};
        _cleanup_free_ char *fp = NULL, *want = NULL, *vars = NULL;
        json_auto_t *pj = fixture_policy_json();
        json_t *golden = json_object_get(json_object_get(pj, "golden"), "sha256");
        const char *other = "1234123412341234123412341234123412341234123412341234123412341234";
        AttestPolicy *edited;
        size_t size = 0;
        Ctx *c = *state;

        /* PCR 7 from a template built like Debian's (no keys), or Debian's own where installed */
        if (read_full_file("/usr/share/OVMF/OVMF_VARS_4M.fd", 16 << 20, &vars, &size) >= 0)
                assert_int_equal(
                        attest_varstore_pcr7((const uint8_t *) vars, size, &pcr7, /* ret_why= */ NULL),
                        ATTEST_VARSTORE_PREDICTED);
        else {
                uint8_t d[ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS][ATTEST_SHA256_SIZE];

                assert_ok(attest_pcr7_secure_boot_off_events(d));
                pcr7.name = strdup("the variable store template");
                for (unsigned i = 0; i < ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS; i++)
                        assert_ok(attest_expected_pcr_add(
                                &pcr7, i < 5 ? EV_EFI_VARIABLE_DRIVER_CONFIG : EV_SEPARATOR, d[i], NULL));
                assert_ok(attest_expected_pcr_seal(&pcr7));
        }

        /* the golden 4 and 7 go; the image's events and the template's stand in */
        assert_ok(json_object_del(golden, "4"));
        assert_ok(json_object_del(golden, "7"));
        assert_ok(json_object_set_new(
                pj, "pcr4", json_pack("{s:o}", "installer", pcr4_boot(FIXTURE_UKI, FIXTURE_LINUX))));
        edited = fixture_policy_edited(pj);
        assert_int_equal(
                attest_policy_missing_golden(edited, /* pcr7_expected= */ true, /* firmware_expected= */ false),
                0);
        assert_int_equal(
                attest_policy_missing_golden(edited, /* pcr7_expected= */ false, /* firmware_expected= */ false),
                1U << 7);
        c->params.policy = edited;
        c->params.expected_pcr7 = &pcr7;
        load(c, "ecdsa", "initrd");
        run(c);
        fp = short_fp(c->res.ak_fingerprint);
        assert_true(
                asprintf(
                        &want,
                        "verified: ak %s, pcr 11 phase enter-initrd, pcr 4 events of the image's installer boot, pcr "
                        "7 events of the variable store template",
                        fp) > 0);
        assert_string_equal(c->res.message, want);
        assert_true(c->res.verified);
        assert_int_equal(c->res.n_learned, 0);

        /* the image's UKI is another one than the boot ran: the event is named */
        attest_policy_free(edited);
        assert_ok(json_object_set_new(
                pj, "pcr4", json_pack("{s:o}", "installer", pcr4_boot(other, FIXTURE_LINUX))));
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(
                c->res.message,
                "pcr 4 event 23 (EV_EFI_BOOT_SERVICES_APPLICATION): digest " FIXTURE_UKI
                " is not the UKI (expected 1234123412341234123412341234123412341234123412341234123412341234)");

        /* the template would have measured another SecureBoot value */
        attest_policy_free(edited);
        assert_ok(json_object_set_new(
                pj, "pcr4", json_pack("{s:o}", "installer", pcr4_boot(FIXTURE_UKI, FIXTURE_LINUX))));
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        pcr7.events[0].digest[0] ^= 0xff;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(
                c->res.message,
                "pcr 7 event 4 (EV_EFI_VARIABLE_DRIVER_CONFIG): digest "
                "115aa827dbccfb44d216ad9ecfda56bdea620b860a94bed5b7a27bba1c4d02d8 is not SecureBoot (off) "
                "(expected ee5aa827dbccfb44d216ad9ecfda56bdea620b860a94bed5b7a27bba1c4d02d8); expected from the variable "
                "store template");

        c->params.expected_pcr7 = NULL;
        c->params.policy = c->policy;
        attest_policy_free(edited);
}

/* PCRs 0, 2, 3, 6 against a firmware run's events (here: the fixture boot's own log), with no
 * golden value for them: verified, and a firmware volume not this host's is named. */
static void test_firmware_events(void **state) {
        _cleanup_(attest_firmware_expect_done) AttestFirmwareExpect fw = {};
        _cleanup_free_ uint8_t *log = NULL;
        _cleanup_free_ char *fp = NULL, *want = NULL;
        json_auto_t *pj = fixture_policy_json();
        json_t *golden = json_object_get(json_object_get(pj, "golden"), "sha256");
        AttestPolicy *edited;
        size_t size = 0;
        Ctx *c = *state;

        log = fixture_read("firmware.log", &size);
        assert_ok(attest_firmware_expect_from_log(log, size, &fw, /* ret_why= */ NULL));
        for (const char *const *k = (const char *const[]){ "0", "2", "3", "6", NULL }; *k; k++)
                assert_ok(json_object_del(golden, *k));
        edited = fixture_policy_edited(pj);
        assert_int_equal(
                attest_policy_missing_golden(edited, /* pcr7_expected= */ false, /* firmware_expected= */ false),
                ATTEST_FIRMWARE_CHECKED);
        assert_int_equal(
                attest_policy_missing_golden(edited, /* pcr7_expected= */ false, /* firmware_expected= */ true),
                0);
        c->params.policy = edited;
        c->params.firmware = &fw;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_true(c->res.verified);
        fp = short_fp(c->res.ak_fingerprint);
        assert_true(
                asprintf(
                        &want,
                        "verified: ak %s, pcr 11 phase enter-initrd, pcrs 0,2,3,6 events of this host's firmware",
                        fp) > 0);
        assert_string_equal(c->res.message, want);

        /* the PEI firmware volume the quote's boot measured is not the one of the run */
        fw.pcr[0].events[1].digest[0] ^= 0xff;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(
                c->res.message,
                "pcr 0 event 2 (EV_EFI_PLATFORM_FIRMWARE_BLOB): digest "
                "f4f0c52697278027731926901650c9eccd0e4181d6b63339c07552c2c969915d is not this host's firmware "
                "(expected 0bf0c52697278027731926901650c9eccd0e4181d6b63339c07552c2c969915d)");
        fw.pcr[0].events[1].digest[0] ^= 0xff;

        /* no run known yet and no golden value: a clear verdict the next quote can cure */
        c->params.firmware = NULL;
        c->params.firmware_missing = "the firmware run for 512 MiB, 1 CPUs is still going (started 3 s ago)";
        c->params.firmware_retryable = true;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_true(c->res.retryable);
        assert_string_equal(
                c->res.message,
                "no expected events for pcr 0,2,3,6: the firmware run for 512 MiB, 1 CPUs is still going (started "
                "3 s ago)");

        /* golden values, where the image pins them, stand in for a run that is not known */
        c->params.policy = c->policy;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_true(c->res.verified);
        c->params.firmware_missing = NULL;
        c->params.firmware_retryable = false;
        attest_policy_free(edited);
}

/* An old policy.json (no "pcr4") and a daemon without the template's PCR 7: both golden, as before. */
static void test_expected_events_absent(void **state) {
        json_auto_t *pj = fixture_policy_json();
        AttestPolicy *edited;
        Ctx *c = *state;

        assert_int_equal(c->policy->n_pcr4, 0);
        assert_int_equal(
                attest_policy_missing_golden(
                        c->policy, /* pcr7_expected= */ false, /* firmware_expected= */ false),
                0);
        assert_ok(json_object_del(json_object_get(json_object_get(pj, "golden"), "sha256"), "4"));
        edited = fixture_policy_edited(pj);
        assert_int_equal(
                attest_policy_missing_golden(edited, /* pcr7_expected= */ true, /* firmware_expected= */ false),
                1U << 4);
        c->params.policy = edited;
        load(c, "ecdsa", "initrd");
        run(c);
        assert_false(c->res.verified);
        assert_string_equal(
                c->res.message,
                "no golden value for pcr 4 in the image policy: record one with `vm-manager image golden` or run "
                "with --attestation-learn-golden");
        c->params.policy = c->policy;
        attest_policy_free(edited);
}

static void test_result_json(void **state) {
        _cleanup_(attest_result_done) AttestResult back = {};
        _cleanup_free_ char *s = NULL, *s2 = NULL;
        json_auto_t *j2 = NULL, *pj = fixture_policy_json();
        AttestPolicy *edited;
        Ctx *c = *state;
        json_t *j;

        json_object_del(pj, "golden");
        edited = fixture_policy_edited(pj);
        c->params.policy = edited;
        c->params.learn_golden = true;
        load(c, "ecdsa", "initrd");
        run(c);
        c->params.learn_golden = false;
        c->params.policy = c->policy;
        attest_policy_free(edited);
        j = attest_result_to_json(&c->res);
        assert_non_null(j);
        s = json_dumps(j, JSON_PRESERVE_ORDER | JSON_COMPACT);
        json_decref(j);

        /* field order and formats of §4.5 */
        assert_startswith(s, "{\"verified\":true,\"message\":\"verified: ak ");
        assert_contains(s, "\"at\":\"2024-05-01T12:00:00.123456Z\",\"akFingerprint\":\"");
        assert_contains(s, "\"pcrs\":{\"0\":");
        assert_contains(s, ",\"11\":");
        assert_contains(
                s,
                "\"eventLog\":{\"replayed\":true,\"firmwareEvents\":36,\"userspaceEvents\":2},\"learned\":[0,2,3,4,6,7]}");
        /* Go orders map keys as text: 11 before 2 */
        assert_true(strstr(s, "\"11\":") < strstr(s, "\"2\":"));

        /* and back */
        j2 = json_loads(s, 0, NULL);
        assert_ok(attest_result_from_json(j2, &back));
        assert_true(back.verified);
        assert_int_equal(back.at, AT);
        assert_string_equal(back.message, c->res.message);
        assert_string_equal(back.ak_fingerprint, c->res.ak_fingerprint);
        assert_string_equal(back.pcrs[11], c->res.pcrs[11]);
        assert_int_equal(back.n_learned, 6);
        assert_true(back.has_event_log && back.event_log.replayed);
        assert_int_equal(back.event_log.firmware_events, 36);
        j = attest_result_to_json(&back);
        s2 = json_dumps(j, JSON_PRESERVE_ORDER | JSON_COMPACT);
        json_decref(j);
        assert_string_equal(s, s2);

        /* a rejection before parsing has neither fingerprint nor pcrs */
        attest_result_done(&c->res);
        assert_ok(attest_verify_quote(c->nonces, &c->req, &c->params, &c->res));
        j = attest_result_to_json(&c->res);
        free(s);
        s = json_dumps(j, JSON_PRESERVE_ORDER | JSON_COMPACT);
        json_decref(j);
        assert_string_equal(
                s,
                "{\"verified\":false,\"message\":\"unknown or expired nonce\",\"at\":\"2024-05-01T12:00:00.123456Z\"}");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_ecdsa_initrd, setup, teardown),
                cmocka_unit_test_setup_teardown(test_rsassa_initrd, setup, teardown),
                cmocka_unit_test_setup_teardown(test_rsapss_initrd, setup, teardown),
                cmocka_unit_test_setup_teardown(test_tofu_then_ready, setup, teardown),
                cmocka_unit_test_setup_teardown(test_ready_without_pin, setup, teardown),
                cmocka_unit_test_setup_teardown(test_ready_pcr13_learned, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pcr13_by_kubernetes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_nonce_failures, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stage_and_policy, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pcr_tampering, setup, teardown),
                cmocka_unit_test_setup_teardown(test_signature_tampering, setup, teardown),
                cmocka_unit_test_setup_teardown(test_parse_failure_message, setup, teardown),
                cmocka_unit_test_setup_teardown(test_coverage, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pcr12_required, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pin_mismatch, setup, teardown),
                cmocka_unit_test_setup_teardown(test_activated_ak, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pcr11, setup, teardown),
                cmocka_unit_test_setup_teardown(test_golden, setup, teardown),
                cmocka_unit_test_setup_teardown(test_learn_mode, setup, teardown),
                cmocka_unit_test_setup_teardown(test_event_log, setup, teardown),
                cmocka_unit_test_setup_teardown(test_expected_events, setup, teardown),
                cmocka_unit_test_setup_teardown(test_expected_events_absent, setup, teardown),
                cmocka_unit_test_setup_teardown(test_firmware_events, setup, teardown),
                cmocka_unit_test_setup_teardown(test_result_json, setup, teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
