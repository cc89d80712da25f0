/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "attest-eventlog.h"
#include "attest-expect.h"
#include "attest-predict.h"
#include "attest-request.h"
#include "cleanup.h"
#include "fuzz.h"

/* A firmware event log (the "event_log" of a quote) as a guest could send it. The parser replays
 * it or refuses it with a reason; a log that replays is then checked against its own replay as the
 * quoted values, with every PCR quoted, which must say it replays (and count the same events); its
 * PCR 4 and 7 events are then walked and checked against the Secure Boot off PCR 7 expectation,
 * which gives a verdict or none, never an error. The seeds are a real OVMF log
 * (tests/data/attest/firmware.log) and variants gen.sh makes of it. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        _cleanup_free_ char *message = NULL;
        AttestPcrValue values[ATTEST_PCR_SLOTS] = {};
        AttestEventLogSummary summary;
        AttestPcrBank bank;
        int r;

        if (size > ATTEST_LOG_MAX)
                return 0;

        attest_pcr_bank_reset(&bank);
        r = attest_firmware_log_replay(data, size, &bank, &err);
        if (r < 0) {
                assert(r == -EBADMSG || r == -ENOMEM);
                assert(r == -ENOMEM || (err.message && err.message[0]));
                return 0;
        }
        assert(!err.message);
        assert(size > 0 || r == 0);

        for (unsigned i = 0; i < ATTEST_PCR_SLOTS; i++)
                values[i] = (AttestPcrValue){ .set = true, .data = bank.pcr[i], .size = ATTEST_SHA256_SIZE };
        r = attest_event_log_check(
                data, size, /* userspace_log= */ NULL, 0, UINT32_MAX, values, &summary, &message);
        if (r == -ENOMEM)
                return 0;
        assert(r == 0);
        assert(!message);
        assert(summary.replayed && summary.userspace_events == 0);

        _cleanup_free_ AttestLogEvent *events = NULL;
        _cleanup_free_ char *verdict = NULL;
        _cleanup_(attest_expected_pcr_done) AttestExpectedPcr pcr7 = {};
        uint8_t d[ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS][ATTEST_SHA256_SIZE];
        size_t n = 0;

        r = attest_event_log_events(
                data, size, /* userspace_log= */ NULL, 0, 0, 1U << 4 | 1U << 7, &events, &n);
        if (r == -ENOMEM)
                return 0;
        assert(r == 0);
        for (size_t i = 0; i < n; i++)
                assert(events[i].pcr == 4 || events[i].pcr == 7);
        if (attest_pcr7_secure_boot_off_events(d) < 0)
                return 0;
        for (unsigned i = 0; i < ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS; i++)
                if (attest_expected_pcr_add(
                            &pcr7, i < 5 ? EV_EFI_VARIABLE_DRIVER_CONFIG : EV_SEPARATOR, d[i], NULL) < 0)
                        return 0;
        r = attest_expect_check(7, &pcr7, 1, events, n, /* ret_matched= */ NULL, &verdict);
        assert(r == 0 || r == -ENOMEM);
        return 0;
}
