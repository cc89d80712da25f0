/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "json-util.h"
#include "network.h"
#include "operation.h"

/* A request body, as REST receives it: parsed, then checked against every operation's
 * parameters (and decoded by the operations that decode theirs), and its string fields through the
 * network validators. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        json_auto_t *v = NULL;
        const Operation *table;
        const char *key;
        json_t *field;
        size_t n;

        if (json_parse_body(data, size, &v, &e) < 0)
                return 0;

        table = operation_table(&n);
        for (size_t i = 0; i < n; i++) {
                api_error_done(&e);
                (void) operation_check_args(&table[i], v, &e);
                if (table[i].args_size > 0) {
                        _cleanup_free_ void *decoded = calloc(1, table[i].args_size);

                        api_error_done(&e);
                        if (decoded && operation_decode(&table[i], v, decoded, &e) >= 0)
                                operation_args_done(&table[i], decoded);
                }
        }

        if (!json_is_object(v))
                return 0;
        json_object_foreach(v, key, field) {
                struct in_addr prefix;
                unsigned len;
                const char *s = json_string_value(field);

                if (!s)
                        continue;
                api_error_done(&e);
                (void) network_validate_name(s, &e);
                api_error_done(&e);
                (void) network_parse_cidr(s, &prefix, &len, &e);
                api_error_done(&e);
                (void) dns_name_validate(s, &e);
        }
        return 0;
}
