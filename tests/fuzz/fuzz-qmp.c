/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <string.h>

#include "fuzz.h"
#include "vm-balloon.h"
#include "vm-qmp.h"

/* The QMP stream as the client sees it: cut at '\n' into lines, each parsed on its own. Whatever a
 * line holds, the parser returns a message with the fields its type promises, or an error; a reply
 * also goes through the balloon statistics' reader. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

static void check_line(const char *line, size_t len) {
        _cleanup_(qmp_message_done) QmpMessage m = QMP_MESSAGE_NULL;
        int r;

        r = qmp_parse_message(line, len, &m);
        if (r < 0) {
                assert(r == -ENODATA || r == -EMSGSIZE || r == -EBADMSG || r == -ENOMEM);
                assert(!m.root);
                return;
        }

        assert(m.root && json_is_object(m.root));
        assert(qmp_message_type_from_string(qmp_message_type_to_string(m.type)) == m.type);
        switch (m.type) {
        case QMP_MESSAGE_GREETING:
                assert(json_is_object(m.value));
                break;
        case QMP_MESSAGE_RETURN: {
                VmBalloonStats st;

                assert(m.value);
                /* any reply may be read as the balloon's statistics (the guest chooses their values):
                 * what is had is whole and non-negative, and renders */
                if (vm_balloon_stats_parse(m.value, &st) >= 0) {
                        json_t *j = vm_balloon_stats_to_json(&st);
                        json_decref(j);
                }
                break;
        }
        case QMP_MESSAGE_ERROR:
                assert(m.error_class && m.error_desc);
                break;
        case QMP_MESSAGE_EVENT:
                assert(m.event && m.event[0]);
                assert(!m.value || json_is_object(m.value));
                break;
        default:
                assert(false);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const char *p = (const char *) data, *end = p + size;

        if (size > 4 * QMP_LINE_MAX)
                return 0;

        while (p < end) {
                const char *nl = memchr(p, '\n', (size_t) (end - p));
                size_t len = (size_t) ((nl ?: end) - p);

                check_line(p, len);
                p += len + 1;
        }
        return 0;
}
