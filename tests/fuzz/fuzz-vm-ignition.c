/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "vm-ignition.h"

/* create_vm's user_data, which the daemon translates when it is Ignition 2.x: a verdict for every
 * input, a message with every refusal, and what it writes is a 3.3.0 config that parses. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char *out = NULL, *msg = NULL;
        int r = vm_ignition_translate((const char *) data, size, &out, &msg);

        assert(r == 0 || r == 1 || r == -EINVAL || r == -ENOMEM);
        assert((r == 1) == !!out);
        assert((r == -EINVAL) == !!msg);
        if (out) {
                json_t *j = json_loads(out, 0, NULL);
                assert(j);
                assert(strcmp(json_string_value(json_object_get(json_object_get(j, "ignition"), "version")),
                              VM_IGNITION_TARGET_VERSION) == 0);
                json_decref(j);
        }
        free(out);
        free(msg);
        return 0;
}
