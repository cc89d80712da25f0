/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "attest-fwlog.h"
#include "cleanup.h"
#include "fuzz.h"

/* The serial console of a firmware run, as the helper reads it back: whatever a guest printed. The
 * parser returns the log or refuses with a reason, and a log it returns is walked for the
 * expectations (which refuse it or record separators for every checked PCR). The seeds are a
 * run's console and cut or corrupted copies of it. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(attest_firmware_expect_done) AttestFirmwareExpect fw = {};
        _cleanup_free_ uint8_t *log = NULL;
        _cleanup_free_ char *why = NULL;
        size_t n = 0;
        int r;

        if (size > ((size_t) 8 << 20))
                return 0;

        r = attest_fwlog_parse((const char *) data, size, &log, &n, &why);
        assert(r == 0 || r == -EBADMSG || r == -ENOMEM);
        if (r < 0) {
                assert(!log && (r == -ENOMEM || (why && why[0])));
                return 0;
        }
        assert(log && n > 0 && n <= ATTEST_FWLOG_MAX && !why);

        r = attest_firmware_expect_from_log(log, n, &fw, &why);
        assert(r == 0 || r == -EBADMSG || r == -ENOMEM);
        if (r == 0)
                for (unsigned i = 0; i < 8; i++)
                        if (ATTEST_FIRMWARE_CHECKED & (1U << i))
                                assert(fw.pcr[i].n_events > 0 &&
                                       fw.pcr[i].events[fw.pcr[i].n_events - 1].type == EV_SEPARATOR);
        return 0;
}
