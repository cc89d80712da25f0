/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "attest-expect.h"
#include "cleanup.h"
#include "fuzz.h"

/* An OVMF variable store template, as the daemon reads the one it copies for every VM. The parser
 * predicts PCR 7, says which Secure Boot keys are set, or refuses the bytes with a reason; it never
 * reads outside them. The seeds are stores shaped like Debian's OVMF_VARS_4M.fd, with and without
 * keys. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(attest_expected_pcr_done) AttestExpectedPcr e = {};
        _cleanup_free_ char *why = NULL;
        int r;

        if (size > ((size_t) 16 << 20))
                return 0;

        r = attest_varstore_pcr7(data, size, &e, &why);
        assert(r == ATTEST_VARSTORE_PREDICTED || r == ATTEST_VARSTORE_SECURE_BOOT || r == -EBADMSG ||
               r == -ENOMEM);
        if (r == ATTEST_VARSTORE_PREDICTED)
                assert(e.n_events == 6 && !why);
        else
                assert(e.n_events == 0 && (r == -ENOMEM || (why && why[0])));
        return 0;
}
