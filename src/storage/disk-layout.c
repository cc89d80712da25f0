/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "disk-layout.h"

static const char *const content_names[_DISK_CONTENT_MAX] = {
        [DISK_CONTENT_COPY] = "copy",
        [DISK_CONTENT_EMPTY] = "empty",
        [DISK_CONTENT_EXT4] = "ext4",
};

static DiskContent content_from_string(const char *s) {
        for (int i = 0; i < _DISK_CONTENT_MAX; i++)
                if (s && strcmp(s, content_names[i]) == 0)
                        return (DiskContent) i;
        return _DISK_CONTENT_INVALID;
}

static int fail(const char **error, const char *why) {
        if (error)
                *error = why;
        return -EBADMSG;
}

static int parse_partition(json_t *o, DiskLayoutPartition *p, const char **error) {
        json_t *type = json_object_get(o, "type"), *label = json_object_get(o, "label"),
               *content = json_object_get(o, "content"), *uuid = json_object_get(o, "uuid"),
               *size = json_object_get(o, "sizeBytes"), *grow = json_object_get(o, "grow"),
               *bits = json_object_get(o, "attrBits"), *b;
        size_t i;

        *p = (DiskLayoutPartition){};
        if (!json_is_object(o))
                return fail(error, "a partition is not an object");
        if (!json_is_string(type) || gpt_guid_from_string(json_string_value(type), p->type) < 0 ||
            gpt_guid_is_null(p->type))
                return fail(error, "a partition has no valid type GUID");
        if (!json_is_string(label) || json_string_length(label) > GPT_NAME_CHARS)
                return fail(error, "a partition's label is missing or longer than 36 characters");
        for (const char *c = json_string_value(label); *c; c++)
                if (*c < 0x20 || *c > 0x7e)
                        return fail(error, "a partition's label is not printable ASCII");
        strcpy(p->label, json_string_value(label));
        p->content = content_from_string(json_string_value(content));
        if (p->content < 0)
                return fail(error, "a partition's content is not copy, empty or ext4");
        if (p->content == DISK_CONTENT_COPY) {
                if (!json_is_string(uuid) || gpt_guid_from_string(json_string_value(uuid), p->uuid) < 0 ||
                    gpt_guid_is_null(p->uuid))
                        return fail(error, "a copied partition names no valid source uuid");
        } else if (uuid)
                return fail(error, "only a copied partition names a uuid");
        if (grow && !json_is_boolean(grow))
                return fail(error, "grow is not a boolean");
        p->grow = json_is_true(grow);
        if (p->grow) {
                if (size || p->content != DISK_CONTENT_EXT4)
                        return fail(error, "only an ext4 partition without sizeBytes may grow");
        } else {
                if (!json_is_integer(size) || json_integer_value(size) <= 0 ||
                    json_integer_value(size) > ((json_int_t) 1 << 50) ||
                    json_integer_value(size) % GPT_SECTOR != 0)
                        return fail(error, "a partition's sizeBytes is not a positive multiple of 512");
                p->size = (uint64_t) json_integer_value(size);
        }
        if (bits && !json_is_array(bits))
                return fail(error, "attrBits is not an array");
        json_array_foreach(bits, i, b) {
                if (!json_is_integer(b) || json_integer_value(b) < 0 || json_integer_value(b) > 63)
                        return fail(error, "attrBits holds something other than a bit number 0-63");
                p->attrs |= UINT64_C(1) << json_integer_value(b);
        }
        return 0;
}

int disk_layout_parse(const char *text, size_t size, DiskLayout *ret, const char **error) {
        json_t *root, *format, *parts, *o;
        DiskLayout *l;
        size_t i;
        int r;

        if (size > DISK_LAYOUT_SIZE_MAX)
                return fail(error, "the layout file is too large");
        root = json_loadb(text, size, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(root)) {
                json_decref(root);
                return fail(error, "the layout file is not a JSON object");
        }
        format = json_object_get(root, "format");
        parts = json_object_get(root, "partitions");
        l = calloc(1, sizeof(DiskLayout));
        if (!l) {
                json_decref(root);
                return -ENOMEM;
        }
        r = 0;
        if (!json_is_string(format) || strcmp(json_string_value(format), DISK_LAYOUT_FORMAT) != 0)
                r = fail(error, "the layout file's format is not " DISK_LAYOUT_FORMAT);
        else if (!json_is_array(parts) || json_array_size(parts) == 0 || json_array_size(parts) > GPT_ENTRIES)
                r = fail(error, "the layout file's partitions are not an array of 1 to 128");
        json_array_foreach(r < 0 ? NULL : parts, i, o) {
                r = parse_partition(o, &l->p[i], error);
                if (r < 0)
                        break;
                if (l->p[i].grow && i + 1 != json_array_size(parts)) {
                        r = fail(error, "only the last partition may grow");
                        break;
                }
                l->n++;
        }
        if (r >= 0)
                *ret = *l;
        free(l);
        json_decref(root);
        return r;
}

static uint64_t align_up(uint64_t v) {
        return (v + DISK_LAYOUT_ALIGN - 1) / DISK_LAYOUT_ALIGN * DISK_LAYOUT_ALIGN;
}

uint64_t disk_layout_min_size(const DiskLayout *l) {
        uint64_t at = DISK_LAYOUT_ALIGN;

        for (size_t i = 0; i < l->n; i++)
                at = align_up(at + (l->p[i].grow ? DISK_LAYOUT_GROW_MIN : l->p[i].size));
        return at + DISK_LAYOUT_ALIGN; /* room for the backup table */
}

static const GptEntry *find_source(const GptTable *image, const GptGuid uuid) {
        for (size_t i = 0; i < image->n_entries; i++)
                if (memcmp(image->entries[i].uuid, uuid, 16) == 0)
                        return &image->entries[i];
        return NULL;
}

int disk_plan_make(
        const DiskLayout *l,
        const GptTable *image,
        uint64_t image_size,
        uint64_t disk_size,
        void (*random_uuid)(GptGuid ret),
        DiskPlan *ret,
        const char **error) {
        uint64_t sectors = disk_size / GPT_SECTOR, at = DISK_LAYOUT_ALIGN,
                 end = (gpt_last_usable(sectors) + 1) * GPT_SECTOR;
        DiskPlan *p;
        int r = 0;

        if (l->n == 0 || l->n > GPT_ENTRIES)
                return fail(error, "the layout has no partitions");
        if (disk_size < disk_layout_min_size(l)) {
                if (error)
                        *error = "the disk is too small for the image's layout";
                return -ENOSPC;
        }
        p = calloc(1, sizeof(DiskPlan));
        if (!p)
                return -ENOMEM;
        for (size_t i = 0; i < l->n && r >= 0; i++) {
                const DiskLayoutPartition *x = &l->p[i];
                DiskPlanStep *s = &p->steps[i];
                GptEntry *e = &p->table.entries[i];
                uint64_t size = x->size;

                *s = (DiskPlanStep){ .content = x->content, .offset = at };
                memcpy(e->type, x->type, 16);
                strcpy(e->name, x->label);
                e->attrs = x->attrs;
                if (x->content == DISK_CONTENT_COPY) {
                        const GptEntry *src = find_source(image, x->uuid);
                        if (!src) {
                                r = fail(error, "the image has no partition with a UUID the layout copies");
                                break;
                        }
                        if (memcmp(src->type, x->type, 16) != 0) {
                                r = fail(error, "a copied partition's type differs from the image's");
                                break;
                        }
                        s->src_offset = src->first_lba * GPT_SECTOR;
                        s->src_size = (src->last_lba - src->first_lba + 1) * GPT_SECTOR;
                        if (s->src_offset + s->src_size > image_size) {
                                r = fail(error, "a copied partition lies beyond the end of the image");
                                break;
                        }
                        for (size_t j = 0; j < i; j++)
                                if (l->p[j].content == DISK_CONTENT_COPY &&
                                    memcmp(l->p[j].uuid, x->uuid, 16) == 0)
                                        r = fail(error, "the layout copies one partition twice");
                        if (r < 0)
                                break;
                        if (s->src_size > size) {
                                r = fail(error, "a copied partition is larger than its slot in the layout");
                                break;
                        }
                        memcpy(e->uuid, src->uuid, 16);
                        memcpy(e->name, src->name, sizeof(e->name));
                        e->attrs = src->attrs;
                } else
                        random_uuid(e->uuid);
                if (x->grow)
                        size = end > at ? (end - at) / 4096 * 4096 : 0;
                if (size == 0 || at + size > end) {
                        if (error)
                                *error = "the disk is too small for the image's layout";
                        r = -ENOSPC;
                        break;
                }
                s->size = size;
                e->first_lba = at / GPT_SECTOR;
                e->last_lba = (at + size) / GPT_SECTOR - 1;
                at = align_up(at + size);
        }
        if (r >= 0) {
                p->n = p->table.n_entries = l->n;
                p->table.first_usable = gpt_first_usable();
                p->table.last_usable = gpt_last_usable(sectors);
                *ret = *p;
        }
        free(p);
        return r;
}
