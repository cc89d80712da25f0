/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "attest-eventlog.h"
#include "attest-request.h"
#include "cleanup.h"
#include "fuzz.h"

/* systemd's userspace measurement log (the "userspace_log" of a quote) as a guest could send it.
 * The parser replays it or refuses it with "record N …"; a log that replays is then checked against
 * its own replay with every PCR quoted, which must say it replays with all of its PCR records (a
 * shorter prefix cannot match: each record changes a quoted PCR). Seeds: the logs of
 * tests/data/attest/ and variants gen.sh makes of them. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        _cleanup_free_ char *message = NULL;
        AttestPcrValue values[ATTEST_PCR_SLOTS] = {};
        AttestEventLogSummary summary;
        AttestPcrBank bank, again;
        int r, matched = -2;

        if (size > ATTEST_LOG_MAX)
                return 0;

        attest_pcr_bank_reset(&bank);
        r = attest_userspace_log_replay(
                data, size, &bank, /* mask= */ 0, /* quoted= */ NULL, /* ret_matched= */ NULL, &err);
        if (r < 0) {
                assert(r == -EBADMSG || r == -ENOMEM);
                assert(r == -ENOMEM || (err.message && strncmp(err.message, "record ", 7) == 0));
                return 0;
        }
        assert(!err.message);

        /* the same log matched against its own end state */
        attest_pcr_bank_reset(&again);
        r = attest_userspace_log_replay(data, size, &again, UINT32_MAX, &bank, &matched, /* reterr= */ NULL);
        if (r == -ENOMEM)
                return 0;
        assert(r >= 0 && matched == r);
        assert(memcmp(&again, &bank, sizeof(bank)) == 0);

        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                values[i] = (AttestPcrValue){ .set = true, .data = bank.pcr[i], .size = ATTEST_SHA256_SIZE };
        r = attest_event_log_check(
                /* firmware_log= */ NULL, 0, data, size, UINT32_MAX, values, &summary, &message);
        if (r == -ENOMEM)
                return 0;
        assert(r == 0 && !message);
        assert(summary.replayed && summary.firmware_events == 0 && (int) summary.userspace_events == matched);
        return 0;
}
