/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "gpt.h"
#include "hex-util.h"
#include "macro.h"

#define HEADER_SIZE 92U
static const char signature[8] = { 'E', 'F', 'I', ' ', 'P', 'A', 'R', 'T' };

static uint32_t le32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static uint64_t le64(const uint8_t *p) {
        return (uint64_t) le32(p) | (uint64_t) le32(p + 4) << 32;
}

static void put32(uint8_t *p, uint32_t v) {
        for (unsigned i = 0; i < 4; i++)
                p[i] = v >> (8 * i);
}

static void put64(uint8_t *p, uint64_t v) {
        put32(p, (uint32_t) v);
        put32(p + 4, (uint32_t) (v >> 32));
}

static uint32_t crc(const uint8_t *p, size_t n) {
        return (uint32_t) crc32(crc32(0L, Z_NULL, 0), p, (uInt) n);
}

uint64_t gpt_first_usable(void) {
        return GPT_HEAD_SECTORS;
}

uint64_t gpt_last_usable(uint64_t disk_sectors) {
        return disk_sectors > GPT_TAIL_SECTORS + 1 ? disk_sectors - GPT_TAIL_SECTORS - 1 : 0;
}

bool gpt_guid_is_null(const GptGuid g) {
        for (unsigned i = 0; i < 16; i++)
                if (g[i])
                        return false;
        return true;
}

/* byte i of the text form (without dashes) is byte order[i] on disk */
static const uint8_t order[16] = { 3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15 };

int gpt_guid_from_string(const char *s, GptGuid ret) {
        /* the text form is groups of 8-4-4-4-12 digits separated by dashes */
        static const uint8_t group[] = { 8, 4, 4, 4, 12 };
        uint8_t text[16];
        size_t at = 0, n = 0;

        if (!s || strlen(s) != 36)
                return -EINVAL;
        for (size_t k = 0; k < ELEMENTSOF(group); k++) {
                if (k > 0 && s[at++] != '-')
                        return -EINVAL;
                if (hex_decode(s + at, group[k], /* lower_only= */ false, text + n, /* reterr_offset= */ NULL) <
                    0)
                        return -EINVAL;
                at += group[k];
                n += group[k] / 2;
        }
        for (unsigned i = 0; i < 16; i++)
                ret[order[i]] = text[i];
        return 0;
}

char *gpt_guid_to_string(const GptGuid g, char buf[static 37]) {
        size_t at = 0;

        for (unsigned i = 0; i < 16; i++) {
                at += (size_t) snprintf(buf + at, 37 - at, "%02x", g[order[i]]);
                if (i == 3 || i == 5 || i == 7 || i == 9)
                        buf[at++] = '-';
        }
        buf[36] = 0;
        return buf;
}

static int parse_entry(const uint8_t *e, GptEntry *ret) {
        GptEntry x = {};

        memcpy(x.type, e, 16);
        memcpy(x.uuid, e + 16, 16);
        x.first_lba = le64(e + 32);
        x.last_lba = le64(e + 40);
        x.attrs = le64(e + 48);
        for (unsigned i = 0; i < GPT_NAME_CHARS; i++) {
                uint16_t c = (uint16_t) (e[56 + 2 * i] | e[57 + 2 * i] << 8);
                if (c == 0)
                        break;
                if (c < 0x20 || c > 0x7e)
                        return -EBADMSG;
                x.name[i] = (char) c;
        }
        *ret = x;
        return 0;
}

/* Entries sorted by their place in the array; none may overlap another or leave the usable range. */
static int check_entries(const GptEntry *e, size_t n, uint64_t first, uint64_t last) {
        for (size_t i = 0; i < n; i++) {
                if (e[i].first_lba < first || e[i].last_lba > last || e[i].first_lba > e[i].last_lba)
                        return -1;
                for (size_t j = 0; j < i; j++)
                        if (e[i].first_lba <= e[j].last_lba && e[j].first_lba <= e[i].last_lba)
                                return -1;
        }
        return 0;
}

int gpt_parse(const void *buf, size_t size, uint64_t disk_size, GptTable *ret) {
        const uint8_t *b = buf, *h;
        uint8_t hdr[HEADER_SIZE];
        uint64_t disk_sectors = disk_size / GPT_SECTOR, entries_lba;
        uint32_t hsize, n, esize;
        GptTable *t;
        int r = -EBADMSG;

        if (size < 2 * GPT_SECTOR)
                return -EBADMSG;
        h = b + GPT_SECTOR;
        if (memcmp(h, signature, sizeof(signature)) != 0)
                return -ENOMEDIUM;
        hsize = le32(h + 12);
        if (hsize < HEADER_SIZE || hsize > GPT_SECTOR)
                return -EBADMSG;
        /* the CRC covers the header with its own field zeroed */
        memcpy(hdr, h, HEADER_SIZE);
        memset(hdr + 16, 0, 4);
        if (hsize != HEADER_SIZE) {
                uint8_t full[GPT_SECTOR];
                memcpy(full, h, hsize);
                memset(full + 16, 0, 4);
                if (crc(full, hsize) != le32(h + 16))
                        return -EBADMSG;
        } else if (crc(hdr, HEADER_SIZE) != le32(h + 16))
                return -EBADMSG;
        if (le64(h + 24) != 1 || disk_sectors < GPT_HEAD_SECTORS + GPT_TAIL_SECTORS)
                return -EBADMSG;

        entries_lba = le64(h + 72);
        n = le32(h + 80);
        esize = le32(h + 84);
        if (esize < GPT_ENTRY_SIZE || esize > 4096 || esize % 8 != 0 || n > 4096 || entries_lba < 2 ||
            entries_lba > size / GPT_SECTOR || (uint64_t) n * esize > size - entries_lba * GPT_SECTOR)
                return -EBADMSG;
        if (crc(b + entries_lba * GPT_SECTOR, (size_t) n * esize) != le32(h + 88))
                return -EBADMSG;

        t = calloc(1, sizeof(GptTable));
        if (!t)
                return -ENOMEM;
        memcpy(t->disk_guid, h + 56, 16);
        t->first_usable = le64(h + 40);
        t->last_usable = le64(h + 48);
        if (t->first_usable > t->last_usable || t->last_usable >= disk_sectors ||
            t->first_usable < entries_lba + ((uint64_t) n * esize + GPT_SECTOR - 1) / GPT_SECTOR)
                goto finish;
        for (uint32_t i = 0; i < n; i++) {
                const uint8_t *e = b + entries_lba * GPT_SECTOR + (size_t) i * esize;
                GptGuid type;

                memcpy(type, e, 16);
                if (gpt_guid_is_null(type))
                        continue;
                if (t->n_entries >= GPT_ENTRIES || parse_entry(e, &t->entries[t->n_entries]) < 0)
                        goto finish;
                t->n_entries++;
        }
        if (check_entries(t->entries, t->n_entries, t->first_usable, t->last_usable) < 0)
                goto finish;
        *ret = *t;
        r = 0;
finish:
        free(t);
        return r;
}

static void put_header(
        uint8_t *h, const GptTable *t, uint64_t my, uint64_t alt, uint64_t last, uint64_t entries, uint32_t ecrc) {
        memcpy(h, signature, sizeof(signature));
        put32(h + 8, 0x00010000U);
        put32(h + 12, HEADER_SIZE);
        put64(h + 24, my);
        put64(h + 32, alt);
        put64(h + 40, gpt_first_usable());
        put64(h + 48, last);
        memcpy(h + 56, t->disk_guid, 16);
        put64(h + 72, entries);
        put32(h + 80, GPT_ENTRIES);
        put32(h + 84, GPT_ENTRY_SIZE);
        put32(h + 88, ecrc);
        put32(h + 16, crc(h, HEADER_SIZE));
}

int gpt_build(const GptTable *t, uint64_t disk_sectors, uint8_t **ret_head, uint8_t **ret_tail) {
        uint64_t last = gpt_last_usable(disk_sectors);
        const size_t array = GPT_ENTRIES * GPT_ENTRY_SIZE;
        uint8_t *head, *tail, *mbr;
        uint32_t ecrc;

        if (disk_sectors < GPT_HEAD_SECTORS + GPT_TAIL_SECTORS + 1 || t->n_entries > GPT_ENTRIES ||
            check_entries(t->entries, t->n_entries, gpt_first_usable(), last) < 0)
                return -EINVAL;
        for (size_t i = 0; i < t->n_entries; i++)
                if (gpt_guid_is_null(t->entries[i].type) || strlen(t->entries[i].name) > GPT_NAME_CHARS)
                        return -EINVAL;

        head = calloc(GPT_HEAD_SECTORS, GPT_SECTOR);
        tail = calloc(GPT_TAIL_SECTORS, GPT_SECTOR);
        if (!head || !tail) {
                free(head);
                free(tail);
                return -ENOMEM;
        }

        /* the entries, at LBA 2 and again before the backup header */
        for (size_t i = 0; i < t->n_entries; i++) {
                const GptEntry *x = &t->entries[i];
                uint8_t *e = head + 2 * GPT_SECTOR + i * GPT_ENTRY_SIZE;

                memcpy(e, x->type, 16);
                memcpy(e + 16, x->uuid, 16);
                put64(e + 32, x->first_lba);
                put64(e + 40, x->last_lba);
                put64(e + 48, x->attrs);
                for (size_t c = 0; x->name[c]; c++)
                        e[56 + 2 * c] = (uint8_t) x->name[c];
        }
        ecrc = crc(head + 2 * GPT_SECTOR, array);
        memcpy(tail, head + 2 * GPT_SECTOR, array);

        /* the protective MBR: one partition of type 0xee over the whole disk (or what 32 bits reach) */
        mbr = head + 446;
        mbr[1] = 0x00;
        mbr[2] = 0x02;
        mbr[4] = 0xee;
        mbr[5] = mbr[6] = mbr[7] = 0xff;
        put32(mbr + 8, 1);
        put32(mbr + 12, disk_sectors - 1 > UINT32_MAX ? UINT32_MAX : (uint32_t) (disk_sectors - 1));
        head[510] = 0x55;
        head[511] = 0xaa;

        put_header(head + GPT_SECTOR, t, 1, disk_sectors - 1, last, 2, ecrc);
        put_header(
                tail + (GPT_TAIL_SECTORS - 1) * GPT_SECTOR,
                t,
                disk_sectors - 1,
                1,
                last,
                disk_sectors - GPT_TAIL_SECTORS,
                ecrc);
        *ret_head = head;
        *ret_tail = tail;
        return 0;
}
