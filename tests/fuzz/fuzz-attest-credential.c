/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "attest-credential.h"
#include "cleanup.h"
#include "fuzz.h"

/* An endorsement key's public area as a guest agent reports it (ek_pub). The parser either accepts
 * it or refuses it with a message, as malformed or unsupported; a key it accepts has a name and
 * takes a credential for that name, whose structures have the sizes TPM2_ActivateCredential
 * expects. The seeds are the EKs of tests/data/attest/credential/ and a few broken ones. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        /* tss2-mu writes every structure it cannot decode to stderr */
        (void) setenv("TSS2_LOG", "all+none", 1);
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        static const uint8_t secret[16] = "fuzzed-secret-16";
        AttestCredential c;
        TPMT_PUBLIC ek;
        TPM2B_NAME name;
        int r;

        r = attest_ek_public_parse(data, size, &ek, &err);
        if (r < 0) {
                assert(r == -EBADMSG || r == -EPERM || r == -ENOMEM);
                assert(r == -ENOMEM ||
                       (err.message && strncmp(err.message, "malformed endorsement key: ", 27) == 0) ||
                       (err.message && strncmp(err.message, "unsupported endorsement key: ", 29) == 0));
                return 0;
        }
        assert(!err.message);
        assert(ek.type == TPM2_ALG_RSA || ek.type == TPM2_ALG_ECC);

        r = attest_tpm_name(&ek, &name);
        assert(r == 0);
        assert(name.size == 2 + (ek.nameAlg == TPM2_ALG_SHA256 ? 32 : 48));

        /* The EK's own name stands in for an AK's: any name of a supported size will do. */
        r = attest_make_credential(&ek, &name, secret, sizeof(secret), &c, &err);
        if (r == -ENOMEM)
                return 0;
        /* The parser checked what OpenSSL needs; an RSA modulus it cannot encrypt to remains possible
         * (a key of the right size that is not a product of primes still encrypts). */
        assert(r == 0 || r == -EINVAL);
        if (r < 0)
                return 0;
        assert(c.blob_size == 2 + (size_t) (c.blob[0] << 8 | c.blob[1]));
        assert(c.secret_size == 2 + (size_t) (c.secret[0] << 8 | c.secret[1]));
        assert(c.blob_size <= sizeof(c.blob) && c.secret_size <= sizeof(c.secret));
        return 0;
}
