/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Verifications per second of the attestation verifier, on the swtpm quotes of tests/data/attest:
 * the whole path of a POST /attest/quote body (JSON decode, nonce, structures, signature, digest,
 * policy) for each key type. usage: bench-attest <tests/data/attest> [seconds per key, default 3] */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
        static const char *const keys[] = { "ecdsa", "rsassa", "rsapss" };
        const char *dir = argc > 1 ? argv[1] : "tests/data/attest";
        double seconds = argc > 2 ? atof(argv[2]) : 3.0;
        _cleanup_free_ char *nonce = NULL, *pcrs = NULL, *pol = NULL, *p1 = NULL, *p2 = NULL, *p3 = NULL;
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
                            "\"pcrs\":%s}",
                            nonce,
                            ak,
                            quote,
                            sig,
                            pcrs) < 0)
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
        return 0;
}
