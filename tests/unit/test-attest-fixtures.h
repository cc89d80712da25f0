/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The swtpm quotes of tests/data/attest/ (made by its gen.sh), for the attest tests: three AKs
 * (ecdsa, rsassa, rsapss), each with an initrd quote over sha256:0-7,11 and a ready quote over
 * sha256:0-7,11,13, all with the nonce of nonce.hex, the event logs that replay to their PCRs
 * (firmware.log, tpm2-measure-<stage>.log) and the policy they satisfy. */

#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "attest-policy.h"
#include "attest-request.h"
#include "cleanup.h"
#include "fs-util.h"
#include "test-util.h"

#define FIXTURE_VM "vm-1"
#define FIXTURE_KUBERNETES "1.36.4"

static inline char *fixture_path(const char *name) {
        const char *dir = getenv("VM_MANAGER_TEST_DATA");
        char *p = NULL;

        assert_non_null(dir);
        assert_true(asprintf(&p, "%s/attest/%s", dir, name) > 0);
        return p;
}

/* A fixture file's bytes (NUL-terminated too, for the text ones). */
static inline uint8_t *fixture_read(const char *name, size_t *ret_size) {
        _cleanup_free_ char *p = fixture_path(name);
        char *data = NULL;
        size_t size = 0;

        assert_ok(read_full_file(p, 1 << 20, &data, &size));
        if (ret_size)
                *ret_size = size;
        return (uint8_t *) data;
}

static inline char *fixture_text(const char *name) {
        return (char *) fixture_read(name, NULL);
}

static inline char *fixture_name(const char *key, const char *file) {
        char *n = NULL;
        assert_true(asprintf(&n, "%s/%s", key, file) > 0);
        return n;
}

/* The value of PCR index in pcrs-<stage>.json, as a new string; NULL if absent. */
static inline char *fixture_pcr(const char *stage, unsigned index) {
        _cleanup_free_ char *file = NULL, *text = NULL;
        json_auto_t *v = NULL;
        char key[4];
        json_t *e;

        assert_true(asprintf(&file, "pcrs-%s.json", stage) > 0);
        text = fixture_text(file);
        v = json_loads(text, 0, NULL);
        assert_non_null(v);
        (void) snprintf(key, sizeof(key), "%u", index);
        e = json_object_get(json_object_get(v, "sha256"), key);
        return e ? strdup(json_string_value(e)) : NULL;
}

/* The event logs of stage into req (the firmware's, and systemd's as it stood at that quote). */
static inline void fixture_logs(const char *stage, AttestQuoteRequest *req) {
        _cleanup_free_ char *us = NULL;

        assert_true(asprintf(&us, "tpm2-measure-%s.log", stage) > 0);
        free(req->event_log);
        free(req->userspace_log);
        req->event_log = fixture_read("firmware.log", &req->event_log_size);
        req->userspace_log = fixture_read(us, &req->userspace_log_size);
}

/* A decoded QuoteRequest of key's quote for stage (file "initrd" or "ready", or another quote of
 * the key, e.g. "partial"), with the PCR values of pcrs_stage. */
static inline void fixture_request_full(
        const char *key, const char *stage, const char *quote, const char *pcrs_stage, AttestQuoteRequest *ret) {
        _cleanup_free_ char *a = fixture_name(key, "ak.pub"), *m = NULL, *s = NULL, *mf = NULL, *sf = NULL;

        *ret = (AttestQuoteRequest){};
        assert_true(asprintf(&mf, "%s.msg", quote) > 0);
        assert_true(asprintf(&sf, "%s.sig", quote) > 0);
        m = fixture_name(key, mf);
        s = fixture_name(key, sf);
        ret->stage = strdup(stage);
        ret->nonce = fixture_text("nonce.hex");
        ret->ak_pub = fixture_read(a, &ret->ak_pub_size);
        ret->quote = fixture_read(m, &ret->quote_size);
        ret->signature = fixture_read(s, &ret->signature_size);
        ret->n_pcr_banks = 1;
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                ret->pcrs_sha256[i] = fixture_pcr(pcrs_stage, i);
        fixture_logs(pcrs_stage, ret);
}

static inline void fixture_request(const char *key, const char *stage, AttestQuoteRequest *ret) {
        fixture_request_full(key, stage, stage, stage, ret);
}

static inline AttestPolicy *fixture_policy_from(const char *json) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        AttestPolicy *p = NULL;
        int r;

        r = attest_policy_parse(json, strlen(json), &p, &err);
        if (r < 0)
                fail_msg("policy does not parse: %s", err.message);
        return p;
}

static inline AttestPolicy *fixture_policy(void) {
        _cleanup_free_ char *text = fixture_text("policy.json");
        return fixture_policy_from(text);
}

/* The fixture policy as JSON, for tests that edit it. */
static inline json_t *fixture_policy_json(void) {
        _cleanup_free_ char *text = fixture_text("policy.json");
        json_t *v = json_loads(text, 0, NULL);
        assert_non_null(v);
        return v;
}

static inline AttestPolicy *fixture_policy_edited(json_t *v) {
        _cleanup_free_ char *s = json_dumps(v, 0);
        assert_non_null(s);
        return fixture_policy_from(s);
}
