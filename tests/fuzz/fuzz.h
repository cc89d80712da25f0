/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* The libFuzzer entry points. With -Dfuzzer=true (clang) libFuzzer drives them; otherwise
 * fuzz-main.c replays a corpus through them, so every corpus file runs in every test run. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
