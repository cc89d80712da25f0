/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "disk-layout.h"
#include "fuzz.h"

/* An image's layout file, then the plan for a disk from it and a fixed image table. The parser
 * refuses with a reason or returns a layout; a plan, when one is made, has its partitions in order,
 * apart, and within the disk, and builds into a GPT. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

static void zero_uuid(GptGuid ret) {
        memset(ret, 0x11, 16);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        DiskLayout *l = malloc(sizeof(DiskLayout));
        DiskPlan *p = malloc(sizeof(DiskPlan));
        GptTable *img = calloc(1, sizeof(GptTable));
        const char *why = NULL;
        uint64_t disk = (uint64_t) 4 << 30;
        uint8_t *head = NULL, *tail = NULL;
        int r;

        assert(l && p && img);
        /* the image: an ESP and a root, as in the corpus */
        assert(gpt_guid_from_string("c12a7328-f81f-11d2-ba4b-00a0c93ec93b", img->entries[0].type) == 0);
        assert(gpt_guid_from_string("bf064d66-0504-4883-8e6e-e06160077334", img->entries[0].uuid) == 0);
        img->entries[0].first_lba = 2048;
        img->entries[0].last_lba = 526335;
        assert(gpt_guid_from_string("4f68bce3-e8cd-4db1-96e7-fbcaf984b709", img->entries[1].type) == 0);
        assert(gpt_guid_from_string("3699d702-14a6-145c-7de9-f06ffb2c2761", img->entries[1].uuid) == 0);
        img->entries[1].first_lba = 526336;
        img->entries[1].last_lba = 832639;
        img->n_entries = 2;

        r = disk_layout_parse((const char *) data, size, l, &why);
        if (r < 0) {
                assert(r == -EBADMSG || r == -ENOMEM);
                assert(r == -ENOMEM || why);
                goto finish;
        }
        assert(l->n > 0 && l->n <= GPT_ENTRIES);
        r = disk_plan_make(l, img, (uint64_t) 853096 * 512, disk, zero_uuid, p, &why);
        if (r < 0) {
                assert(r == -EBADMSG || r == -ENOSPC || r == -ENOMEM);
                goto finish;
        }
        for (size_t i = 0; i < p->n; i++) {
                assert(p->steps[i].offset % DISK_LAYOUT_ALIGN == 0);
                assert(p->steps[i].size > 0 && p->steps[i].offset + p->steps[i].size <= disk);
                assert(i == 0 || p->steps[i].offset >= p->steps[i - 1].offset + p->steps[i - 1].size);
                assert(p->steps[i].src_size <= p->steps[i].size);
        }
        assert(gpt_build(&p->table, disk / GPT_SECTOR, &head, &tail) == 0);
finish:
        free(head);
        free(tail);
        free(l);
        free(p);
        free(img);
        return 0;
}
