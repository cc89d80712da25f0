/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Verifications per second of the attestation verifier, on the swtpm quotes of tests/data/attest:
 * the whole path of a POST /attest/quote body with its event logs (JSON decode, nonce, structures,
 * signature, digest, event log replay, policy) for each key type; then the replay of the logs
 * alone, one thread, timed in CPU seconds. usage: bench-attest <tests/data/attest> [CPU seconds per key,
 * default 3] */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attest-eventlog.h"
#include "attest-nonce.h"
#include "attest-policy.h"
#include "attest-request.h"
#include "attest-verify.h"
#include "cleanup.h"
#include "fs-util.h"
#include "json-util.h"

static char *b64_file(const char *dir, const char *key, const char *file) {
        _cleanup_free_ char *path = NULL, *data = NULL;
        size_t size = 0;
        char *out;

        if (asprintf(&path, "%s/%s/%s", dir, key, file) < 0 || read_full_file(path, 1 << 20, &data, &size) < 0)
                return NULL;
        out = malloc(4 * ((size + 2) / 3) + 1);
        if (out)
                EVP_EncodeBlock((unsigned char *) out, (const unsigned char *) data, (int) size);
        return out;
}

/* The CPU time of this thread: on a machine other jobs share, what a verification costs, not how
 * much of the CPU the scheduler happened to give us. */
static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* attest_event_log_check() alone, on the decoded logs and PCR values of the initrd quotes. */
static int bench_replay(const char *dir, double seconds) {
        _cleanup_free_ char *p1 = NULL, *p2 = NULL, *p3 = NULL, *fw = NULL, *us = NULL, *pcrs = NULL;
        json_auto_t *v = NULL;
        AttestPcrValue values[ATTEST_PCR_SLOTS] = {};
        uint8_t bytes[ATTEST_PCR_SLOTS][32];
        size_t fw_size = 0, us_size = 0;
        uint32_t mask = 0;
        AttestEventLogSummary s = {};
        unsigned long count = 0;
        const char *key;
        json_t *e;
        double t0, t;

        if (asprintf(&p1, "%s/firmware.log", dir) < 0 || asprintf(&p2, "%s/tpm2-measure-initrd.log", dir) < 0 ||
            asprintf(&p3, "%s/pcrs-initrd.json", dir) < 0 || read_full_file(p1, 1 << 22, &fw, &fw_size) < 0 ||
            read_full_file(p2, 1 << 22, &us, &us_size) < 0 || read_full_file(p3, 65536, &pcrs, NULL) < 0 ||
            !(v = json_loads(pcrs, 0, NULL)))
                return 1;
        json_object_foreach(json_object_get(v, "sha256"), key, e) {
                unsigned i = (unsigned) atoi(key);

                for (unsigned k = 0; k < 32; k++)
                        (void) sscanf(json_string_value(e) + 2 * k, "%2hhx", &bytes[i][k]);
                values[i] = (AttestPcrValue){ .set = true, .data = bytes[i], .size = 32 };
                mask |= 1U << i;
        }
        t0 = now_s();
        do {
                _cleanup_free_ char *message = NULL;

                if (attest_event_log_check(
                            (uint8_t *) fw, fw_size, (uint8_t *) us, us_size, mask, values, &s, &message) < 0 ||
                    message) {
                        fprintf(stderr, "bench-attest: the logs do not replay: %s\n", message ?: "?");
                        return 1;
                }
                count++;
        } while ((t = now_s() - t0) < seconds);
        printf("\n| event logs | replays/s | per replay |\n|---|---|---|\n");
        printf("| %zu + %zu bytes, %u + %u events | %.0f | %.1f µs |\n",
               fw_size,
               us_size,
               s.firmware_events,
               s.userspace_events,
               (double) count / t,
               t / (double) count * 1e6);
        return 0;
}

int main(int argc, char **argv) {
        static const char *const keys[] = { "ecdsa", "rsassa", "rsapss" };
        const char *dir = argc > 1 ? argv[1] : "tests/data/attest";
        double seconds = argc > 2 ? atof(argv[2]) : 3.0;
        _cleanup_free_ char *nonce = NULL, *pcrs = NULL, *pol = NULL, *p1 = NULL, *p2 = NULL, *p3 = NULL,
                            *fw = NULL, *us = NULL;
        _cleanup_(attest_policy_freep) AttestPolicy *policy = NULL;
        _cleanup_(attest_nonce_store_freep) AttestNonceStore *store = NULL;
        size_t n = 0;

        (void) setenv("TSS2_LOG", "all+none", 0);
        if (asprintf(&p1, "%s/nonce.hex", dir) < 0 || asprintf(&p2, "%s/pcrs-initrd.json", dir) < 0 ||
            asprintf(&p3, "%s/policy.json", dir) < 0 || read_full_file(p1, 4096, &nonce, NULL) < 0 ||
            read_full_file(p2, 65536, &pcrs, NULL) < 0 || read_full_file(p3, 65536, &pol, &n) < 0 ||
            attest_policy_parse(pol, n, &policy, NULL) < 0 || attest_nonce_store_new(&store) < 0) {
                fprintf(stderr, "bench-attest: cannot read the fixtures in %s\n", dir);
                return 1;
        }
        nonce[strcspn(nonce, "\n")] = 0;
        fw = b64_file(dir, ".", "firmware.log");
        us = b64_file(dir, ".", "tpm2-measure-initrd.log");
        if (!fw || !us) {
                fprintf(stderr, "bench-attest: cannot read the event logs in %s\n", dir);
                return 1;
        }
        printf("| key | verifications/s | per verification |\n|---|---|---|\n");
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
                _cleanup_free_ char *quote = b64_file(dir, keys[k], "initrd.msg"),
                                    *sig = b64_file(dir, keys[k], "initrd.sig"),
                                    *ak = b64_file(dir, keys[k], "ak.pub"), *body = NULL;
                unsigned long count = 0;
                double t0, t;

                if (!quote || !sig || !ak ||
                    asprintf(
                            &body,
                            "{\"stage\":\"initrd\",\"nonce\":\"%s\",\"ak_pub\":\"%s\",\"quote\":\"%s\",\"signature\":\"%s\","
                            "\"pcrs\":%s,\"event_log\":\"%s\",\"userspace_log\":\"%s\"}",
                            nonce,
                            ak,
                            quote,
                            sig,
                            pcrs,
                            fw,
                            us) < 0)
                        return 1;
                t0 = now_s();
                do {
                        _cleanup_(attest_quote_request_done) AttestQuoteRequest req = {};
                        _cleanup_(attest_result_done) AttestResult res = {};
                        if (attest_quote_request_decode(body, strlen(body), &req, NULL) < 0 ||
                            attest_nonce_add(store, "vm", nonce, 0) < 0 ||
                            attest_verify_quote(
                                    store,
                                    &req,
                                    &(AttestVerifyParams){ .vm_id = "vm", .now = 0, .at = 0, .policy = policy },
                                    &res) < 0 ||
                            !res.verified) {
                                fprintf(stderr,
                                        "bench-attest: %s did not verify: %s\n",
                                        keys[k],
                                        res.message ?: "?");
                                return 1;
                        }
                        count++;
                } while ((t = now_s() - t0) < seconds);
                printf("| %s | %.0f | %.1f µs |\n", keys[k], (double) count / t, t / (double) count * 1e6);
        }
        return bench_replay(dir, seconds);
}
