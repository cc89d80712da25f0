/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* GUID partition tables as bytes, both ways, with 512-byte sectors: gpt_parse() reads the primary
 * header and its entry array from the start of a disk (untrusted bytes: an image's), gpt_build()
 * makes the protective MBR, the primary header with its entries (LBA 0-33) and the backup entries
 * and header (the last 33 sectors). Pure: no file is touched. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPT_SECTOR 512U
#define GPT_ENTRIES 128U     /* entries in the array gpt_build() writes, and the most parsed */
#define GPT_ENTRY_SIZE 128U  /* bytes of one entry as written */
#define GPT_NAME_CHARS 36U   /* UTF-16 code units of an entry's name */
#define GPT_HEAD_SECTORS 34U /* MBR, header, 32 sectors of entries */
#define GPT_TAIL_SECTORS 33U /* backup entries, backup header */
#define GPT_ATTR_READ_ONLY 60
#define GPT_ATTR_NO_AUTO 63

typedef uint8_t GptGuid[16]; /* as on disk: the first three fields little-endian */

typedef struct GptEntry {
        GptGuid type, uuid;
        uint64_t first_lba, last_lba; /* inclusive */
        uint64_t attrs;
        char name[GPT_NAME_CHARS + 1]; /* ASCII only: others are refused */
} GptEntry;

typedef struct GptTable {
        GptGuid disk_guid;
        uint64_t first_usable, last_usable;
        size_t n_entries; /* the used ones, in the order of the array */
        GptEntry entries[GPT_ENTRIES];
} GptTable;

/* Parses the table at the start of a disk of disk_size bytes: buf holds its first size bytes (the
 * header at LBA 1, the entries where it says, which must lie within buf). -EBADMSG for anything
 * malformed (signature, CRCs, sizes, entries beyond the disk or overlapping, names not ASCII),
 * -ENOMEDIUM when there is no GPT signature at all. ret is written only on success. */
int gpt_parse(const void *buf, size_t size, uint64_t disk_size, GptTable *ret);

/* The bytes of t for a disk of disk_sectors sectors: head (GPT_HEAD_SECTORS sectors, for LBA 0) and
 * tail (GPT_TAIL_SECTORS sectors, for the last ones), both malloc()ed. -EINVAL when an entry lies
 * outside t's usable range, entries overlap, or the disk is too small. */
int gpt_build(const GptTable *t, uint64_t disk_sectors, uint8_t **ret_head, uint8_t **ret_tail);

/* The usable range on a disk of disk_sectors: after the head, before the tail. */
uint64_t gpt_first_usable(void);
uint64_t gpt_last_usable(uint64_t disk_sectors);

/* "c12a7328-f81f-11d2-ba4b-00a0c93ec93b" (any case) <-> on-disk bytes. */
int gpt_guid_from_string(const char *s, GptGuid ret);
/* buf of 37 bytes; lower case. */
char *gpt_guid_to_string(const GptGuid g, char buf[static 37]);
bool gpt_guid_is_null(const GptGuid g);
