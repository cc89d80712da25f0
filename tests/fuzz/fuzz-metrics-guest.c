/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <jansson.h>
#include <string.h>

#include "fuzz.h"
#include "metrics-guest.h"

/* A POST /report body as a guest could send it (a systemd-report upload), mapped with a small
 * series limit so that the limit is reached too. Checks what the exposition relies on: names and
 * label names Prometheus accepts, label values that are valid UTF-8 and bounded, and every entry
 * accounted for exactly once. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

/* jansson refuses to make a string of anything but valid UTF-8. */
static bool utf8_valid(const char *s) {
        json_t *j = json_string(s);

        json_decref(j);
        return j != NULL;
}

static void check_series(const GuestSeries *s, size_t limit) {
        size_t n = strlen(s->name);

        assert(strncmp(s->name, "vm_guest_", 9) == 0 && n > 9);
        assert(strspn(s->name, "abcdefghijklmnopqrstuvwxyz0123456789_") == n);
        assert(s->name[9] != '_' && !strstr(s->name, "__"));
        assert(s->family);
        switch (s->kind) {
        case GUEST_SERIES_COUNTER:
                assert(n > 6 && streq(s->name + n - 6, "_total"));
                break;
        case GUEST_SERIES_INFO:
                assert(n > 5 && streq(s->name + n - 5, "_info"));
                assert(s->value == 1);
                assert(s->n_labels >= 2 && streq(s->label_names[s->n_labels - 1], "value"));
                break;
        default:
                assert(s->kind == GUEST_SERIES_GAUGE);
        }

        assert(s->n_labels >= 1 && streq(s->label_names[0], "object"));
        assert(!s->label_names[s->n_labels] && !s->label_values[s->n_labels]);
        for (size_t i = 0; i < s->n_labels; i++) {
                const char *l = s->label_names[i], *v = s->label_values[i];
                size_t k = strlen(v);

                assert(l[0] && !(l[0] >= '0' && l[0] <= '9') && l[0] != '_');
                assert(strspn(l, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") ==
                       strlen(l));
                assert(!streq(l, "vm"));
                for (size_t j = 0; j < i; j++)
                        assert(!streq(l, s->label_names[j]));
                assert(utf8_valid(v));
                assert(k <= GUEST_LABEL_VALUE_MAX ||
                       (k <= GUEST_LABEL_VALUE_MAX - 1 + 3 && streq(v + k - 3, "…")));
        }
        (void) limit;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(guest_report_freep) GuestReport *r = NULL;
        size_t limit = 1 + size % 16;
        uint64_t dropped = 0;
        int k;

        k = guest_report_parse(data, size, limit, &r);
        if (k < 0) {
                assert(k == -EMSGSIZE || k == -ELOOP || k == -EBADMSG || k == -ENOMEM);
                assert(!r);
                return 0;
        }
        assert(k == 0 && r);

        if (!r->is_report) {
                assert(r->n_series == 0 && r->n_entries == 0 && !r->sample);
                return 0;
        }
        for (GuestDropReason d = 0; d < _GUEST_DROP_MAX; d++)
                dropped += r->dropped[d];
        assert(r->n_series + dropped == r->n_entries);
        assert(r->n_series <= limit);
        assert(r->n_families <= r->n_entries);
        assert(r->dropped[GUEST_DROP_LIMIT] == 0 || r->n_series == limit);
        if (r->n_entries == 0)
                assert(json_is_null(r->sample));
        else
                assert(json_array_size(r->sample) ==
                       (r->n_entries < GUEST_SAMPLE_MAX ? r->n_entries : GUEST_SAMPLE_MAX));
        for (size_t i = 0; i < r->n_series; i++)
                check_series(r->series + i, limit);
        return 0;
}
