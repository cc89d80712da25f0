/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The layout file an image build writes next to the .raw (<id>_<version>.layout.json, made by
 * images/scripts/layout.py from the image's repart.sysinstall.d and the built GPT), and the plan of
 * a VM's disk made from it and the image's own partition table. Both are untrusted input (an image
 * directory, a pulled OCI artifact); both functions are pure.
 *
 *   { "format": "vm-manager-layout/1",
 *     "partitions": [
 *       { "type": "<guid>", "label": "esp", "content": "copy", "uuid": "<guid of the image's partition>",
 *         "sizeBytes": 268435456, "attrBits": [] },
 *       { "type": "<guid>", "label": "_empty", "content": "empty", "sizeBytes": 1073741824, "attrBits": [63]
 * }, { "type": "<guid>", "label": "var", "content": "ext4", "grow": true } ] }
 *
 * copy: the image's partition with that UUID (and the same type), bit for bit, keeping its UUID,
 * label and attributes; the slot is sizeBytes (at least the source's size). empty: a slot of
 * sizeBytes, zeroed head and tail, a fresh UUID. ext4: formatted on the host; grow takes the rest of
 * the disk (one partition at most, the last). Partitions start at 1 MiB boundaries. */

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpt.h"

#define DISK_LAYOUT_FORMAT "vm-manager-layout/1"
#define DISK_LAYOUT_SIZE_MAX ((size_t) 64 << 10)
#define DISK_LAYOUT_ALIGN ((uint64_t) 1 << 20)
#define DISK_LAYOUT_GROW_MIN ((uint64_t) 256 << 20) /* the least a grown partition gets */

typedef enum DiskContent {
        DISK_CONTENT_COPY,
        DISK_CONTENT_EMPTY,
        DISK_CONTENT_EXT4,
        _DISK_CONTENT_MAX,
        _DISK_CONTENT_INVALID = -EINVAL,
} DiskContent;

typedef struct DiskLayoutPartition {
        GptGuid type, uuid; /* uuid: of the source for copy, else null */
        char label[GPT_NAME_CHARS + 1];
        DiskContent content;
        uint64_t size; /* bytes; 0 with grow */
        uint64_t attrs;
        bool grow;
} DiskLayoutPartition;

typedef struct DiskLayout {
        size_t n;
        DiskLayoutPartition p[GPT_ENTRIES];
} DiskLayout;

/* Parses the file's bytes. -EBADMSG with a reason in error (a static string) for anything that is
 * not a layout as described above. */
int disk_layout_parse(const char *text, size_t size, DiskLayout *ret, const char **error);

/* What the host does for one partition of the VM's disk. */
typedef struct DiskPlanStep {
        DiskContent content;
        uint64_t offset, size;         /* bytes on the target */
        uint64_t src_offset, src_size; /* bytes in the image, for copy */
} DiskPlanStep;

typedef struct DiskPlan {
        GptTable table; /* what the target's GPT will say; disk_guid left to the caller */
        size_t n;
        DiskPlanStep steps[GPT_ENTRIES];
} DiskPlan;

/* The plan for a disk of disk_size bytes from the layout and the image's table (image_size bytes).
 * random_uuid fills the UUIDs of the new partitions. -EBADMSG (copy source missing, of another type,
 * larger than its slot, beyond the image), -ENOSPC (the disk is too small), with a reason in error. */
int disk_plan_make(
        const DiskLayout *l,
        const GptTable *image,
        uint64_t image_size,
        uint64_t disk_size,
        void (*random_uuid)(GptGuid ret),
        DiskPlan *ret,
        const char **error);

/* The least disk the layout needs, in bytes (copy slots taken at sizeBytes). */
uint64_t disk_layout_min_size(const DiskLayout *l);
