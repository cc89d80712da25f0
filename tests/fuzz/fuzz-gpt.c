/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "gpt.h"

/* The start of an image's disk as the host install reads it. Whatever the bytes, the parser refuses
 * them or returns entries that lie in the usable range without overlapping, and a table it accepts
 * builds again into one it parses back the same. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        GptTable *t = malloc(sizeof(GptTable)), *back = malloc(sizeof(GptTable));
        uint64_t disk = (uint64_t) 16 << 30;
        uint8_t *head = NULL, *tail = NULL;
        int r;

        assert(t && back);
        r = gpt_parse(data, size, disk, t);
        if (r < 0) {
                assert(r == -EBADMSG || r == -ENOMEDIUM || r == -ENOMEM);
                goto finish;
        }
        for (size_t i = 0; i < t->n_entries; i++) {
                assert(t->entries[i].first_lba >= t->first_usable);
                assert(t->entries[i].last_lba <= t->last_usable);
                assert(t->entries[i].last_lba < disk / GPT_SECTOR);
                assert(strlen(t->entries[i].name) <= GPT_NAME_CHARS);
        }
        /* rebuilt for the same disk: only entries in the usable range of our own layout survive */
        if (gpt_build(t, disk / GPT_SECTOR, &head, &tail) >= 0) {
                uint8_t *buf = calloc(1, GPT_HEAD_SECTORS * GPT_SECTOR);
                assert(buf);
                memcpy(buf, head, GPT_HEAD_SECTORS * GPT_SECTOR);
                assert(gpt_parse(buf, GPT_HEAD_SECTORS * GPT_SECTOR, disk, back) == 0);
                assert(back->n_entries == t->n_entries);
                assert(memcmp(back->entries, t->entries, t->n_entries * sizeof(GptEntry)) == 0);
                free(buf);
        }
finish:
        free(head);
        free(tail);
        free(t);
        free(back);
        return 0;
}
