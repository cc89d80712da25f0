/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attest-eventlog.h"
#include "attest-fwlog.h"
#include "hex-util.h"
#include "parse-util.h"

static int fail(char **ret_why, const char *format, ...) _printf_(2, 3);
static int fail(char **ret_why, const char *format, ...) {
        va_list ap;
        int k;

        if (!ret_why)
                return -EBADMSG;
        va_start(ap, format);
        k = vasprintf(ret_why, format, ap);
        va_end(ap);
        if (k < 0) {
                *ret_why = NULL;
                return -ENOMEM;
        }
        return -EBADMSG;
}

int attest_fwlog_parse(const char *console, size_t size, uint8_t **ret, size_t *ret_size, char **ret_why) {
        const size_t prefix = strlen(ATTEST_FWLOG_PREFIX);
        _cleanup_free_ uint8_t *log = NULL;
        size_t n = 0, cap = 0, line = 0;
        bool begun = false;

        assert_return(console || size == 0, -EINVAL);
        assert_return(ret && ret_size, -EINVAL);

        if (ret_why)
                *ret_why = NULL;
        for (size_t off = 0; off < size;) {
                const char *s = console + off, *nl = memchr(s, '\n', size - off);
                size_t len = nl ? (size_t) (nl - s) : size - off;

                off += len + (nl ? 1 : 0);
                line++;
                if (len > 0 && s[len - 1] == '\r')
                        len--;
                /* The kernel's messages may share a line with ours when they interleave, so the
                 * prefix counts wherever it starts a line's own text. */
                if (len < prefix || memcmp(s, ATTEST_FWLOG_PREFIX, prefix) != 0)
                        continue;
                s += prefix;
                len -= prefix;

                if (len >= 6 && memcmp(s, "error ", 6) == 0)
                        return fail(
                                ret_why, "the guest reported: %.*s", (int) MIN(len - 6, (size_t) 200), s + 6);
                if (len == 5 && memcmp(s, "begin", 5) == 0) {
                        if (begun)
                                return fail(ret_why, "line %zu begins a second log", line);
                        begun = true;
                        continue;
                }
                if (!begun)
                        continue;
                if (len > 4 && memcmp(s, "end ", 4) == 0) {
                        _cleanup_free_ char *t = strndup(s + 4, len - 4);
                        uint64_t total;

                        if (!t)
                                return -ENOMEM;
                        if (safe_atou64(t, &total) < 0)
                                return fail(ret_why, "line %zu: the end line's size is not a number", line);
                        if (total != n)
                                return fail(
                                        ret_why,
                                        "the log ends after %zu of the %" PRIu64 " bytes announced",
                                        n,
                                        total);
                        if (n == 0)
                                return fail(ret_why, "the guest's event log is empty");
                        *ret = TAKE_PTR(log);
                        *ret_size = n;
                        return 0;
                }
                if (len == 0 || len % 2 != 0)
                        return fail(ret_why, "line %zu is not hex", line);
                if (n + len / 2 > ATTEST_FWLOG_MAX)
                        return fail(ret_why, "the log is bigger than %zu bytes", ATTEST_FWLOG_MAX);
                if (n + len / 2 > cap) {
                        size_t c = MAX(cap * 2, n + len / 2);
                        uint8_t *p = realloc(log, c);

                        if (!p)
                                return -ENOMEM;
                        log = p;
                        cap = c;
                }
                for (size_t i = 0; i < len; i += 2) {
                        int hi = unhexchar(s[i]), lo = unhexchar(s[i + 1]);

                        if (hi < 0 || lo < 0)
                                return fail(ret_why, "line %zu is not hex", line);
                        log[n++] = (uint8_t) (hi << 4 | lo);
                }
        }
        if (!begun)
                return fail(ret_why, "the console has no '" ATTEST_FWLOG_PREFIX "begin' line");
        return fail(ret_why, "the log ends after %zu bytes without its end line", n);
}

void attest_firmware_expect_done(AttestFirmwareExpect *f) {
        if (!f)
                return;
        for (size_t i = 0; i < ELEMENTSOF(f->pcr); i++)
                attest_expected_pcr_done(f->pcr + i);
}

#define HOST_FIRMWARE "this host's firmware"

static int name_pcr(AttestExpectedPcr *e, unsigned pcr) {
        if (asprintf(&e->name, "the firmware run (pcr %u)", pcr) < 0) {
                e->name = NULL;
                return -ENOMEM;
        }
        return 0;
}

int attest_firmware_expect_from_log(const uint8_t *log, size_t size, AttestFirmwareExpect *ret, char **ret_why) {
        _cleanup_(attest_firmware_expect_done) AttestFirmwareExpect f = {};
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        _cleanup_free_ AttestLogEvent *events = NULL;
        bool sealed[8] = {};
        AttestPcrBank bank;
        size_t n = 0;
        int r;

        assert_return(log || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        if (ret_why)
                *ret_why = NULL;
        /* the replay names what is wrong with a log; the walk below then only collects */
        r = attest_firmware_log_replay(log, size, &bank, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return fail(ret_why, "firmware log: %s", err.message ?: "does not parse");
        r = attest_event_log_events(
                log, size, /* userspace_log= */ NULL, 0, 0, ATTEST_FIRMWARE_RECORDED, &events, &n);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return fail(ret_why, "firmware log: does not parse a second time");

        for (size_t k = 0; k < n; k++) {
                const AttestLogEvent *l = events + k;

                if (l->pcr >= ELEMENTSOF(f.pcr) || sealed[l->pcr])
                        continue;
                r = attest_expected_pcr_add(f.pcr + l->pcr, l->type, l->digest, HOST_FIRMWARE);
                if (r == -E2BIG)
                        return fail(
                                ret_why,
                                "pcr %u has more than %u events before its separator",
                                l->pcr,
                                ATTEST_EXPECTED_EVENTS_MAX);
                if (r < 0)
                        return r;
                if (l->type == EV_SEPARATOR)
                        sealed[l->pcr] = true;
        }
        for (unsigned i = 0; i < ELEMENTSOF(f.pcr); i++) {
                if (!(ATTEST_FIRMWARE_RECORDED & (1U << i)))
                        continue;
                if (!sealed[i] && (ATTEST_FIRMWARE_CHECKED & (1U << i)))
                        return fail(ret_why, "pcr %u has no separator in the firmware log", i);
                r = name_pcr(f.pcr + i, i);
                if (r >= 0)
                        r = attest_expected_pcr_seal(f.pcr + i);
                if (r < 0)
                        return r;
        }
        *ret = f;
        f = (AttestFirmwareExpect){};
        return 0;
}

json_t *attest_firmware_expect_to_json(const AttestFirmwareExpect *f) {
        json_auto_t *o = json_object();

        assert_return(f, NULL);

        if (!o)
                return NULL;
        for (unsigned i = 0; i < ELEMENTSOF(f->pcr); i++) {
                json_t *a;
                char key[4];

                if (!(ATTEST_FIRMWARE_RECORDED & (1U << i)))
                        continue;
                a = json_array();
                (void) snprintf(key, sizeof(key), "%u", i);
                if (!a || json_object_set_new(o, key, a) < 0)
                        return NULL;
                for (size_t k = 0; k < f->pcr[i].n_events; k++) {
                        char hex[ATTEST_SHA256_HEX + 1];

                        if (json_array_append_new(
                                    a,
                                    json_pack(
                                            "{s:I,s:s}",
                                            "type",
                                            (json_int_t) f->pcr[i].events[k].type,
                                            "digest",
                                            hex_format(f->pcr[i].events[k].digest, ATTEST_SHA256_SIZE, hex))) <
                            0)
                                return NULL;
                }
        }
        return TAKE_PTR(o);
}

int attest_firmware_expect_from_json(json_t *v, AttestFirmwareExpect *ret) {
        _cleanup_(attest_firmware_expect_done) AttestFirmwareExpect f = {};
        const char *key;
        json_t *a;
        int r;

        assert_return(ret, -EINVAL);

        if (!json_is_object(v))
                return -EINVAL;
        json_object_foreach(v, key, a) {
                uint32_t i;
                size_t k;
                json_t *e;

                if (safe_atou32(key, &i) < 0 || i >= ELEMENTSOF(f.pcr) ||
                    !(ATTEST_FIRMWARE_RECORDED & (1U << i)) || !json_is_array(a) ||
                    json_array_size(a) > ATTEST_EXPECTED_EVENTS_MAX)
                        return -EINVAL;
                json_array_foreach(a, k, e) {
                        json_t *type = json_object_get(e, "type"), *digest = json_object_get(e, "digest");
                        uint8_t d[ATTEST_SHA256_SIZE];

                        if (!json_is_integer(type) || json_integer_value(type) < 0 ||
                            json_integer_value(type) > UINT32_MAX || !json_is_string(digest) ||
                            json_string_length(digest) != ATTEST_SHA256_HEX ||
                            hex_decode(json_string_value(digest), ATTEST_SHA256_HEX, true, d, NULL) < 0)
                                return -EINVAL;
                        r = attest_expected_pcr_add(
                                f.pcr + i, (uint32_t) json_integer_value(type), d, HOST_FIRMWARE);
                        if (r < 0)
                                return r;
                }
        }
        for (unsigned i = 0; i < ELEMENTSOF(f.pcr); i++) {
                if (!(ATTEST_FIRMWARE_RECORDED & (1U << i)))
                        continue;
                if ((ATTEST_FIRMWARE_CHECKED & (1U << i)) &&
                    (f.pcr[i].n_events == 0 || f.pcr[i].events[f.pcr[i].n_events - 1].type != EV_SEPARATOR))
                        return -EINVAL;
                r = name_pcr(f.pcr + i, i);
                if (r >= 0)
                        r = attest_expected_pcr_seal(f.pcr + i);
                if (r < 0)
                        return r;
        }
        *ret = f;
        f = (AttestFirmwareExpect){};
        return 0;
}
