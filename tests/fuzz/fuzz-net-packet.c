/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "fuzz.h"
#include "net-packet.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        return 0;
}
