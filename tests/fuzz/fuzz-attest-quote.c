/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "attest-quote.h"
#include "attest-verify.h"
#include "fuzz.h"

/* TPM quote parts as a guest could send them, through the parser and the whole verifier. Input:
 *
 *   flags:u8  quote_len:u16be  signature_len:u16be  ak_pub_len:u16be  quote  signature  ak_pub
 *   then 32-byte PCR values, given in turn to the indexes the quote selects, ascending
 *   then firmware_log_len:u32be  firmware_log  userspace_log (the rest), the quote's event logs
 *
 * The policy is made from the input, so that a real quote (the seeds come from the swtpm fixtures
 * of tests/data/attest/) gets through every check: PCR 11 of both phases is the value sent, and
 * flags pick the rest:
 *   0x01 ready stage           0x02 learn mode           0x04 golden 0,2,3,4,6,7 = values sent
 *   0x08 golden 0 wrong        0x10 pcr13[1.36.4] = sent 0x20 the VM runs kubernetes 1.36.4
 *   0x40 pinned: this AK       0x80 pinned: another AK
 * The nonce is the quote's own qualifying data when that is 32 bytes. Whatever the bytes, the
 * parser returns a quote or a message, and the verifier a verdict with a message. */

#define VM "vm-fuzz"

static AttestNonceStore *nonces;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        /* tss2-mu writes every structure it cannot decode to stderr */
        (void) setenv("TSS2_LOG", "all+none", 1);
        assert(attest_nonce_store_new(&nonces) >= 0);
        return 0;
}

static size_t u16(const uint8_t *p) {
        return (size_t) p[0] << 8 | p[1];
}

static void check_parse(
        const uint8_t *quote,
        size_t qn,
        const uint8_t *sig,
        size_t sn,
        const uint8_t *pub,
        size_t pn,
        AttestQuote *q,
        bool *ok) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        int r;

        r = attest_quote_parse(quote, qn, sig, sn, pub, pn, q, &err);
        *ok = r >= 0;
        if (r < 0) {
                assert(r == -EBADMSG || r == -EPERM || r == -ENOMEM);
                assert(r == -ENOMEM || (err.message && err.message[0]));
                return;
        }
        assert(!err.message);
        assert(strlen(q->ak_fingerprint) == ATTEST_SHA256_HEX);
        assert(q->bank && q->pcr_mask != 0);
        assert(q->attest == quote && q->attest_size == qn);

        r = attest_quote_verify_signature(q, &err);
        if (r >= 0 || r == -ENOMEM)
                return;
        assert(r == -EPERM && err.message);
        assert(strncmp(err.message, "signature does not verify", 25) == 0 ||
               strncmp(err.message, "unsupported attestation key: ", 29) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(attest_result_done) AttestResult res = {};
        AttestQuoteRequest req = {};
        AttestPcrValue values[ATTEST_PCR_SLOTS] = {};
        AttestPcr13Entry pcr13 = { .kubernetes_version = (char *) "1.36.4" };
        AttestPolicy policy = {};
        AttestVerifyParams params;
        const uint8_t *quote, *sig, *pub, *rest;
        size_t qn, sn, pn, rn;
        char nonce[ATTEST_NONCE_HEX + 1] = "", other_fp[ATTEST_SHA256_HEX + 1];
        AttestQuote q = {};
        uint8_t flags;
        bool parsed;
        json_t *j;

        if (size < 7 || size > 65536)
                return 0;
        flags = data[0];
        qn = u16(data + 1);
        sn = u16(data + 3);
        pn = u16(data + 5);
        data += 7;
        size -= 7;
        if (qn > size || sn > size - qn || pn > size - qn - sn)
                return 0;
        quote = data;
        sig = quote + qn;
        pub = sig + sn;
        rest = pub + pn;
        rn = size - qn - sn - pn;

        check_parse(quote, qn, sig, sn, pub, pn, &q, &parsed);

        /* PCR values in selection order, as hex the way a request carries them */
        for (unsigned i = 0; i < ATTEST_PCR_SLOTS && rn > 0; i++) {
                size_t n = MIN(rn, (size_t) 32);

                if (parsed ? !(q.pcr_mask & (1U << i)) : i > 13)
                        continue;
                values[i] = (AttestPcrValue){ .set = true, .data = rest, .size = n };
                req.pcrs_sha256[i] = hex_encode(rest, n);
                assert(req.pcrs_sha256[i]);
                rest += n;
                rn -= n;
        }
        /* the event logs, whatever is left */
        if (rn >= 4) {
                size_t fn = (size_t) rest[0] << 24 | (size_t) rest[1] << 16 | (size_t) rest[2] << 8 | rest[3];

                rest += 4;
                rn -= 4;
                fn = MIN(fn, rn);
                req.event_log = (uint8_t *) rest;
                req.event_log_size = fn;
                req.userspace_log = (uint8_t *) rest + fn;
                req.userspace_log_size = rn - fn;
        }
        if (parsed) {
                _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
                int r = attest_quote_verify_pcrs(&q, values, &err);
                assert(r >= 0 || r == -ENOMEM || (r == -EPERM && err.message));
        }

        /* the policy the input asks for */
        if (values[11].set && values[11].size == 32) {
                hex_format(values[11].data, 32, policy.pcr11_initrd);
                hex_format(values[11].data, 32, policy.pcr11_ready);
        }
        static const unsigned golden[] = { 0, 2, 3, 4, 6, 7 };
        for (size_t k = 0; (flags & 0x04) && k < ELEMENTSOF(golden); k++)
                if (values[golden[k]].set && values[golden[k]].size == 32)
                        hex_format(values[golden[k]].data, 32, policy.golden[golden[k]]);
        if (flags & 0x08)
                memset(policy.golden[0], 'f', ATTEST_SHA256_HEX);
        if ((flags & 0x10) && values[13].set && values[13].size == 32) {
                hex_format(values[13].data, 32, pcr13.value);
                policy.pcr13 = &pcr13;
                policy.n_pcr13 = 1;
        }

        if (parsed && q.extra_data_size == ATTEST_NONCE_BYTES)
                hex_format(q.extra_data, q.extra_data_size, nonce);
        else
                memset(nonce, 'a', ATTEST_NONCE_HEX);
        assert(attest_nonce_add(nonces, VM, nonce, 1) >= 0);

        memset(other_fp, 'e', ATTEST_SHA256_HEX);
        other_fp[ATTEST_SHA256_HEX] = 0;
        req.stage = (char *) (flags & 0x01 ? "ready" : "initrd");
        req.nonce = nonce;
        req.quote = (uint8_t *) quote;
        req.quote_size = qn;
        req.signature = (uint8_t *) sig;
        req.signature_size = sn;
        req.ak_pub = (uint8_t *) pub;
        req.ak_pub_size = pn;
        req.n_pcr_banks = 1;
        params = (AttestVerifyParams){
                .vm_id = VM,
                .now = 1,
                .at = 1,
                .policy = &policy,
                .kubernetes_version = flags & 0x20 ? "1.36.4" : NULL,
                .pinned_ak = flags & 0x80      ? other_fp :
                        flags & 0x40 && parsed ? q.ak_fingerprint :
                                                 NULL,
                .learn_golden = flags & 0x02,
        };

        assert(attest_verify_quote(nonces, &req, &params, &res) >= 0);
        assert(res.message && res.message[0]);
        assert(!res.verified || strncmp(res.message, "verified: ak ", 13) == 0);
        assert(!res.enroll || (res.verified && !params.pinned_ak));
        assert(attest_nonce_count(nonces, VM) == 0);
        j = attest_result_to_json(&res);
        assert(j);
        json_decref(j);

        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                free(req.pcrs_sha256[i]);
        return 0;
}
