/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <errno.h>

#include "attest-predict.h"
#include "attest-request.h"
#include "fuzz.h"

/* A PE image as a user could upload it in a UKI. The Authenticode digest and the section lookup
 * either succeed or refuse it as malformed, and agree on which; a section found lies inside the
 * image, and a .linux found is digested in turn, as the PCR 4 prediction does with the kernel. The
 * seeds are the images of tests/data/attest/pe/ and a few broken ones. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        uint8_t digest[ATTEST_SHA256_SIZE];
        const uint8_t *section;
        size_t section_size;
        int r, s;

        if (size > ATTEST_LOG_MAX)
                return 0;

        r = attest_pe_authenticode_sha256(data, size, digest);
        assert(r == 0 || r == -EBADMSG || r == -ENOMEM);

        s = attest_pe_section(data, size, ".linux", &section, &section_size);
        assert(s == 0 || s == -ENOENT || s == -EBADMSG || s == -ENOMEM);
        /* Only a section's own VirtualSize can refuse what the digest accepted. */
        if (r == -EBADMSG)
                assert(s == -EBADMSG || s == -ENOMEM);
        if (s == 0) {
                assert(r == 0);
                assert(section >= data && section_size <= size &&
                       (size_t) (section - data) <= size - section_size);
                r = attest_pe_authenticode_sha256(section, section_size, digest);
                assert(r == 0 || r == -EBADMSG || r == -ENOMEM);
        }
        return 0;
}
