/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <endian.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "metrics-guest.h"
#include "string-table.h"

#define METRIC_PREFIX "vm_guest_"
#define FIELD_PREFIX "field_"
#define ELLIPSIS "\xe2\x80\xa6" /* U+2026 */

static const char *const guest_drop_reason_table[_GUEST_DROP_MAX] = {
        [GUEST_DROP_LIMIT] = "limit",
        [GUEST_DROP_UNSUPPORTED] = "unsupported",
        [GUEST_DROP_DUPLICATE] = "duplicate",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(guest_drop_reason, GuestDropReason);

static bool ascii_upper(char c) {
        return c >= 'A' && c <= 'Z';
}

static bool ascii_lower_or_digit(char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static bool endswith(const char *s, size_t n, const char *suffix) {
        size_t k = strlen(suffix);
        return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

char *guest_metric_name(const char *family, GuestSeriesKind kind) {
        _cleanup_free_ char *s = NULL;
        size_t n, start, len;
        bool prev_lower = false;

        if (!family || (size_t) kind >= _GUEST_SERIES_KIND_MAX) {
                errno = EINVAL;
                return NULL;
        }

        /* every input byte gives at most two output bytes (an uppercase letter after a lowercase one) */
        len = strlen(family);
        s = malloc(strlen(METRIC_PREFIX) + 2 * len + strlen("_total") + 1);
        if (!s) {
                errno = ENOMEM;
                return NULL;
        }
        n = start = strlen(METRIC_PREFIX);
        memcpy(s, METRIC_PREFIX, n);

        /* A non-ASCII rune is neither an ASCII letter nor a digit, so each of its bytes maps to '_'
         * and the doubles collapse: walking bytes gives the same result as walking runes. */
        for (const char *p = family; *p; p++) {
                char c = *p;

                if (ascii_upper(c)) {
                        if (prev_lower)
                                s[n++] = '_';
                        s[n++] = (char) (c - 'A' + 'a');
                        prev_lower = false;
                } else if (ascii_lower_or_digit(c)) {
                        s[n++] = c;
                        prev_lower = true;
                } else {
                        /* no leading '_', no doubles */
                        if (n > start && s[n - 1] != '_')
                                s[n++] = '_';
                        prev_lower = false;
                }
        }
        while (n > start && s[n - 1] == '_')
                n--;
        if (n == start) {
                errno = EINVAL;
                return NULL;
        }

        if (kind == GUEST_SERIES_COUNTER && !endswith(s, n, "_total")) {
                memcpy(s + n, "_total", strlen("_total"));
                n += strlen("_total");
        } else if (kind == GUEST_SERIES_INFO) {
                memcpy(s + n, "_info", strlen("_info"));
                n += strlen("_info");
        }
        s[n] = 0;
        return TAKE_PTR(s);
}

char *guest_label_name(const char *key) {
        _cleanup_free_ char *t = NULL;
        const char *p;
        size_t n = 0;
        char *s;

        if (!key)
                return NULL;

        t = malloc(strlen(key) + 1);
        if (!t)
                return NULL;
        for (const char *c = key; *c; c++) {
                unsigned char u = (unsigned char) *c;

                if ((u & 0xc0) == 0x80) /* the continuation of a rune already replaced */
                        continue;
                t[n++] = (ascii_upper(*c) || ascii_lower_or_digit(*c) || *c == '_') ? *c : '_';
        }
        t[n] = 0;

        p = t + strspn(t, "_");
        if (!*p || (*p >= '0' && *p <= '9') || streq(p, "vm") || streq(p, "object") || streq(p, "value")) {
                s = malloc(strlen(FIELD_PREFIX) + strlen(p) + 1);
                if (!s)
                        return NULL;
                strcpy(stpcpy(s, FIELD_PREFIX), p);
                return s;
        }
        return strdup(p);
}

/* Takes s; gives it back, or a copy cut at a rune boundary at or before GUEST_LABEL_VALUE_MAX - 1
 * bytes with "…" appended when it is longer than GUEST_LABEL_VALUE_MAX bytes. NULL on OOM. */
static char *label_value_truncate(char *s) {
        size_t n, cut;
        char *t;

        if (!s)
                return NULL;
        n = strlen(s);
        if (n <= GUEST_LABEL_VALUE_MAX)
                return s;

        cut = GUEST_LABEL_VALUE_MAX - 1;
        while (cut > 0 && ((unsigned char) s[cut] & 0xc0) == 0x80)
                cut--;
        t = realloc(s, cut + strlen(ELLIPSIS) + 1);
        if (!t) {
                free(s);
                return NULL;
        }
        strcpy(t + cut, ELLIPSIS);
        return t;
}

/* The shortest of %.15g, %.16g, %.17g that reads back as the same double. */
static char *format_double(double d) {
        char buf[64];

        for (int prec = 15; prec <= 17; prec++) {
                (void) snprintf(buf, sizeof(buf), "%.*g", prec, d);
                if (strtod(buf, NULL) == d)
                        break;
        }
        return strdup(buf);
}

static char *label_value_raw(const json_t *v) {
        char *s = NULL;

        switch (json_typeof(v)) {
        case JSON_STRING:
                /* enough to see that it is too long, and to find the rune boundary */
                return strndup(json_string_value(v), GUEST_LABEL_VALUE_MAX + 1);
        case JSON_INTEGER:
                asprintf_or_null(&s, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
                return s;
        case JSON_REAL:
                return format_double(json_real_value(v));
        case JSON_TRUE:
                return strdup("true");
        case JSON_FALSE:
                return strdup("false");
        case JSON_NULL:
        case JSON_OBJECT:
        case JSON_ARRAY:
                break;
        }
        return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

char *guest_label_value(const json_t *v) {
        if (!v)
                return strdup("");
        return label_value_truncate(label_value_raw(v));
}

/* Go's time.Parse with the layout "Mon 2006-01-02 15:04:05 MST". */

static const char *skip_spaces(const char *s) {
        while (*s == ' ')
                s++;
        return s;
}

/* A space of the layout matches any run of spaces; at least one unless the text has ended. */
static const char *parse_space(const char *s) {
        if (*s && *s != ' ')
                return NULL;
        return skip_spaces(s);
}

static const char *parse_literal(const char *s, char c) {
        return *s == c ? s + 1 : NULL;
}

/* Go's getnum: one or two digits, exactly two when fixed. */
static const char *parse_num2(const char *s, bool fixed, int *ret) {
        if (!(s[0] >= '0' && s[0] <= '9'))
                return NULL;
        if (!(s[1] >= '0' && s[1] <= '9')) {
                if (fixed)
                        return NULL;
                *ret = s[0] - '0';
                return s + 1;
        }
        *ret = (s[0] - '0') * 10 + (s[1] - '0');
        return s + 2;
}

static const char *parse_weekday(const char *s) {
        static const char *const days[] = { "sun", "mon", "tue", "wed", "thu", "fri", "sat" };

        for (size_t i = 0; i < ELEMENTSOF(days); i++)
                if (strncasecmp(s, days[i], 3) == 0)
                        return s + 3;
        return NULL;
}

/* Go's parseSignedOffset: a sign and an hour 0-23 written with any number of digits; 0 when bad. */
static size_t signed_offset_length(const char *s) {
        size_t n = 1;
        uint64_t x = 0;

        if (s[0] != '+' && s[0] != '-')
                return 0;
        while (s[n] >= '0' && s[n] <= '9') {
                if (x <= 23)
                        x = x * 10 + (uint64_t) (s[n] - '0');
                n++;
        }
        if (n == 1 || x > 23)
                return 0;
        return n;
}

/* Go's parseTimeZone, with its "UTC" shortcut first. The length of the zone, or 0. */
static size_t zone_length(const char *s) {
        size_t n_upper = 0;

        if (strneq(s, "UTC", 3))
                return 3;
        if (strlen(s) < 3)
                return 0;
        if (strneq(s, "ChST", 4) || strneq(s, "MeST", 4))
                return 4;
        if (strneq(s, "GMT", 3))
                return 3 + (s[3] ? signed_offset_length(s + 3) : 0);
        if (s[0] == '+' || s[0] == '-')
                return signed_offset_length(s);

        while (n_upper < 6 && ascii_upper(s[n_upper]))
                n_upper++;
        switch (n_upper) {
        case 3:
                return 3;
        case 4:
                return s[3] == 'T' || strneq(s, "WITA", 4) ? 4 : 0;
        case 5:
                return s[4] == 'T' ? 5 : 0;
        default:
                return 0;
        }
}

static bool leap_year(int64_t y) {
        return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int days_in_month(int64_t y, int m) {
        static const int days[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        return m == 2 && leap_year(y) ? 29 : days[m - 1];
}

/* Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d) {
        int64_t era, yoe, doy, doe;

        y -= m <= 2;
        era = (y >= 0 ? y : y - 399) / 400;
        yoe = y - era * 400;
        doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
        doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return era * 146097 + doe - 719468;
}

int guest_report_parse_timestamp(const char *s, usec_t *ret) {
        int year = 0, month, day, hour, minute, second;
        uint64_t nsec = 0;
        int64_t secs;
        size_t k;

        assert_return(s, -EINVAL);
        assert_return(ret, -EINVAL);

        s = parse_weekday(s);
        if (!s || !(s = parse_space(s)))
                return -EINVAL;
        for (int i = 0; i < 4; i++, s++) {
                if (!(*s >= '0' && *s <= '9'))
                        return -EINVAL;
                year = year * 10 + (*s - '0');
        }
        if (!(s = parse_literal(s, '-')) || !(s = parse_num2(s, true, &month)) ||
            !(s = parse_literal(s, '-')) || !(s = parse_num2(s, true, &day)) || !(s = parse_space(s)) ||
            !(s = parse_num2(s, false, &hour)) || !(s = parse_literal(s, ':')) ||
            !(s = parse_num2(s, true, &minute)) || !(s = parse_literal(s, ':')) ||
            !(s = parse_num2(s, true, &second)))
                return -EINVAL;

        /* a fraction of a second the layout does not have: Go takes it, to nanoseconds */
        if ((s[0] == '.' || s[0] == ',') && s[1] >= '0' && s[1] <= '9') {
                size_t n = 1;
                for (; s[n] >= '0' && s[n] <= '9'; n++)
                        if (n <= 9)
                                nsec = nsec * 10 + (uint64_t) (s[n] - '0');
                for (size_t i = n; i <= 9; i++)
                        nsec *= 10;
                s += n;
        }

        if (!(s = parse_space(s)))
                return -EINVAL;
        k = zone_length(s);
        if (k == 0 || s[k] != 0)
                return -EINVAL;

        if (month < 1 || month > 12 || hour > 23 || minute > 59 || second > 59)
                return -EINVAL;
        if (day < 1 || day > days_in_month(year, month))
                return -EINVAL;

        /* Every zone Go does not find in the local zone gets offset 0, GMT+3 included: the host's
         * zone is UTC, so the wall clock of the report is taken as UTC. */
        secs = days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second;
        if (secs < 0)
                return -ERANGE;
        *ret = (usec_t) secs * USEC_PER_SEC + nsec / NSEC_PER_USEC;
        return 0;
}

/* The structure checks before the parser: nesting of arrays and objects outside strings, and the
 * number of values (containers and commas), which bounds what jansson allocates: 8 MiB of "{}," would
 * otherwise be millions of objects, seconds of the loop and hundreds of MiB. */
static int check_depth(const uint8_t *p, size_t size) {
        bool in_string = false, escaped = false;
        unsigned depth = 0;
        size_t values = 0;

        for (size_t i = 0; i < size; i++) {
                if (in_string) {
                        if (escaped)
                                escaped = false;
                        else if (p[i] == '\\')
                                escaped = true;
                        else if (p[i] == '"')
                                in_string = false;
                        continue;
                }
                switch (p[i]) {
                case '"':
                        in_string = true;
                        break;
                case '[':
                case '{':
                        if (++depth > GUEST_REPORT_DEPTH_MAX)
                                return -ELOOP;
                        if (++values > GUEST_REPORT_VALUES_MAX)
                                return -E2BIG;
                        break;
                case ',':
                        if (++values > GUEST_REPORT_VALUES_MAX)
                                return -E2BIG;
                        break;
                case ']':
                case '}':
                        if (depth > 0)
                                depth--;
                        break;
                default:
                        break;
                }
        }
        return 0;
}

/* SipHash-2-4, keyed per upload: the keys of the sets below come from the guest. */
#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND(v0, v1, v2, v3)     \
        do {                         \
                v0 += v1;            \
                v1 = ROTL64(v1, 13); \
                v1 ^= v0;            \
                v0 = ROTL64(v0, 32); \
                v2 += v3;            \
                v3 = ROTL64(v3, 16); \
                v3 ^= v2;            \
                v0 += v3;            \
                v3 = ROTL64(v3, 21); \
                v3 ^= v0;            \
                v2 += v1;            \
                v1 = ROTL64(v1, 17); \
                v1 ^= v2;            \
                v2 = ROTL64(v2, 32); \
        } while (0)

static uint64_t load_le64(const uint8_t *p) {
        uint64_t x;
        memcpy(&x, p, sizeof(x));
        return le64toh(x);
}

static uint64_t siphash24(const void *data, size_t size, const uint8_t key[static 16]) {
        const uint8_t *in = data;
        uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
        uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
        uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
        uint64_t b = (uint64_t) size << 56;
        size_t i;

        for (i = 0; i + 8 <= size; i += 8) {
                uint64_t m = load_le64(in + i);
                v3 ^= m;
                SIPROUND(v0, v1, v2, v3);
                SIPROUND(v0, v1, v2, v3);
                v0 ^= m;
        }
        for (size_t j = 0; i + j < size; j++)
                b |= (uint64_t) in[i + j] << (8 * j);
        v3 ^= b;
        SIPROUND(v0, v1, v2, v3);
        SIPROUND(v0, v1, v2, v3);
        v0 ^= b;
        v2 ^= 0xff;
        for (int r = 0; r < 4; r++)
                SIPROUND(v0, v1, v2, v3);
        return v0 ^ v1 ^ v2 ^ v3;
}

/* A set of byte strings: open addressing, linear probing, at most half full. */
typedef struct KeySlot {
        uint64_t hash;
        char *key; /* NULL: free */
        size_t size;
} KeySlot;

typedef struct KeySet {
        const uint8_t *hash_key;
        KeySlot *slots;
        size_t n_slots; /* a power of two */
        size_t n;
} KeySet;

static void key_set_done(KeySet *s) {
        for (size_t i = 0; i < s->n_slots; i++)
                free(s->slots[i].key);
        s->slots = mfree(s->slots);
        s->n_slots = s->n = 0;
}

static KeySlot *key_set_find(KeySlot *slots, size_t n_slots, uint64_t hash, const char *key, size_t size) {
        for (size_t i = hash & (n_slots - 1);; i = (i + 1) & (n_slots - 1)) {
                KeySlot *slot = slots + i;
                if (!slot->key)
                        return slot;
                if (slot->hash == hash && slot->size == size && memcmp(slot->key, key, size) == 0)
                        return slot;
        }
}

static int key_set_grow(KeySet *s) {
        size_t n_slots = s->n_slots > 0 ? s->n_slots * 2 : 64;
        KeySlot *slots;

        if (n_slots > SIZE_MAX / sizeof(KeySlot))
                return -ENOMEM;
        slots = calloc(n_slots, sizeof(KeySlot));
        if (!slots)
                return -ENOMEM;
        for (size_t i = 0; i < s->n_slots; i++) {
                KeySlot *old = s->slots + i;
                if (old->key)
                        *key_set_find(slots, n_slots, old->hash, old->key, old->size) = *old;
        }
        free(s->slots);
        s->slots = slots;
        s->n_slots = n_slots;
        return 0;
}

/* 1 when the key was added (copied), 0 when it was there already. */
static int key_set_add(KeySet *s, const char *key, size_t size) {
        uint64_t hash = siphash24(key, size, s->hash_key);
        KeySlot *slot;
        int r;

        if (2 * (s->n + 1) > s->n_slots) {
                r = key_set_grow(s);
                if (r < 0)
                        return r;
        }
        slot = key_set_find(s->slots, s->n_slots, hash, key, size);
        if (slot->key)
                return 0;
        slot->key = malloc(size > 0 ? size : 1);
        if (!slot->key)
                return -ENOMEM;
        memcpy(slot->key, key, size);
        slot->hash = hash;
        slot->size = size;
        s->n++;
        return 1;
}

/* A growing byte buffer for the series keys. */
typedef struct Buffer {
        char *data;
        size_t size, allocated;
} Buffer;

static int buffer_append(Buffer *b, const char *s, bool nul) {
        size_t n = strlen(s) + nul;

        if (b->size + n > b->allocated) {
                size_t a = MAX(b->allocated * 2, b->size + n + 256);
                char *d = realloc(b->data, a);
                if (!d)
                        return -ENOMEM;
                b->data = d;
                b->allocated = a;
        }
        memcpy(b->data + b->size, s, n); /* with the NUL when asked, strlen(s) + 1 bytes */
        b->size += n;
        return 0;
}

static void buffer_done(Buffer *b) {
        b->data = mfree(b->data);
        b->size = b->allocated = 0;
}

static void guest_series_done(GuestSeries *s) {
        free(s->name);
        free(s->family);
        strv_free(s->label_names);
        strv_free(s->label_values);
        *s = (GuestSeries){};
}

GuestReport *guest_report_free(GuestReport *r) {
        if (!r)
                return NULL;
        for (size_t i = 0; i < r->n_series; i++)
                guest_series_done(r->series + i);
        free(r->series);
        json_decref(r->sample);
        return mfree(r);
}

/* Go's strconv.ParseFloat as far as strtod goes: the whole string, NaN and Inf included, no
 * leading space, no overflow to infinity. */
static bool parse_float(const char *s, double *ret) {
        char *end;
        double d;

        if (!*s || *s == ' ' || (*s >= '\t' && *s <= '\r'))
                return false;
        errno = 0;
        d = strtod(s, &end);
        if (*end)
                return false;
        if (errno == ERANGE && isinf(d))
                return false;
        *ret = d;
        return true;
}

/* What an entry exports, before its labels are built. */
typedef struct EntryClass {
        const char *family;
        GuestSeriesKind kind;
        double value;
        const json_t *info; /* the JSON value of the "value" label of an info series */
} EntryClass;

static bool entry_classify(const json_t *entry, EntryClass *ret) {
        const json_t *name, *type, *value;
        GuestSeriesKind kind;
        const char *family;
        bool declared = false;
        double d;

        name = json_object_get(entry, "name");
        if (!json_is_string(name))
                return false;
        family = json_string_value(name);
        if (!family[strcspn(family, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")])
                return false; /* the snake case would be empty */

        value = json_object_get(entry, "value");
        if (!value || json_is_null(value) || json_is_array(value) || json_is_object(value))
                return false;

        type = json_object_get(entry, "type");
        if (type && !json_is_null(type)) {
                const char *t = json_string_value(type);
                if (!t)
                        return false;
                if (streq(t, "counter"))
                        kind = GUEST_SERIES_COUNTER;
                else if (streq(t, "gauge"))
                        kind = GUEST_SERIES_GAUGE;
                else if (streq(t, "string"))
                        kind = GUEST_SERIES_INFO;
                else
                        return false;
                declared = true;
        } else if (json_is_string(value))
                kind = GUEST_SERIES_INFO;
        else if (streq(family, "io.systemd.Manager.NRestarts") || streq(family, "io.systemd.Manager.ReloadCount"))
                kind = GUEST_SERIES_COUNTER;
        else
                kind = GUEST_SERIES_GAUGE;

        if (kind == GUEST_SERIES_INFO)
                d = 1;
        else if (json_is_number(value))
                d = json_number_value(value);
        else if (json_is_boolean(value))
                d = json_is_true(value) ? 1 : 0;
        else if (!declared || !parse_float(json_string_value(value), &d))
                return false;

        *ret = (EntryClass){
                .family = family,
                .kind = kind,
                .value = d,
                .info = kind == GUEST_SERIES_INFO ? value : NULL,
        };
        return true;
}

typedef struct LabelRef {
        const char *name;
        size_t index;
} LabelRef;

static int label_ref_compare(const void *a, const void *b) {
        const LabelRef *x = a, *y = b;
        int c = strcmp(x->name, y->name);

        if (c != 0)
                return c;
        return x->index < y->index ? -1 : x->index > y->index;
}

/* Builds the series of a classified entry, and its key for the duplicate check in key: the name,
 * then "object", "value" (info series) and the field labels sorted by name, each name and value
 * NUL-terminated. Field labels whose sanitized name an earlier field has already taken are left out. */
static int series_build(const json_t *entry, const EntryClass *c, GuestSeries *ret, Buffer *key) {
        _cleanup_(guest_series_done) GuestSeries s = {};
        _cleanup_free_ LabelRef *refs = NULL;
        _cleanup_free_ bool *drop = NULL;
        _cleanup_free_ char *info = NULL;
        const json_t *object, *fields, *v;
        size_t n_fields = 0, n;
        const char *k;
        int r;

        object = json_object_get(entry, "object");
        fields = json_object_get(entry, "fields");
        if (json_is_object(fields))
                n_fields = json_object_size(fields);

        s.kind = c->kind;
        s.value = c->value;
        s.family = strdup(c->family);
        if (!s.family)
                return -ENOMEM;
        s.name = guest_metric_name(c->family, c->kind);
        if (!s.name)
                return -errno;

        n = 1 + n_fields + (c->kind == GUEST_SERIES_INFO);
        s.label_names = calloc(n + 1, sizeof(char *));
        s.label_values = calloc(n + 1, sizeof(char *));
        if (!s.label_names || !s.label_values)
                return -ENOMEM;

        s.label_names[0] = strdup("object");
        s.label_values[0] = guest_label_value(json_is_null(object) ? NULL : object);
        if (!s.label_names[0] || !s.label_values[0])
                return -ENOMEM;
        s.n_labels = 1;

        if (n_fields > 0) {
                refs = calloc(n_fields, sizeof(LabelRef));
                drop = calloc(n_fields + 1, sizeof(bool));
                if (!refs || !drop)
                        return -ENOMEM;
        }
        json_object_foreach((json_t *) fields, k, v) {
                size_t i = s.n_labels;

                if (i > n_fields)
                        break;
                s.label_names[i] = guest_label_name(k);
                s.label_values[i] = guest_label_value(v);
                s.n_labels++;
                if (!s.label_names[i] || !s.label_values[i])
                        return -ENOMEM;
                refs[i - 1] = (LabelRef){ .name = s.label_names[i], .index = i };
        }
        n_fields = s.n_labels - 1;
        if (n_fields > 1)
                qsort(refs, n_fields, sizeof(LabelRef), label_ref_compare);

        key->size = 0;
        r = buffer_append(key, s.name, true);
        if (r >= 0)
                r = buffer_append(key, "object", true);
        if (r >= 0)
                r = buffer_append(key, s.label_values[0], true);
        if (r >= 0 && c->kind == GUEST_SERIES_INFO) {
                info = guest_label_value(c->info);
                if (!info)
                        return -ENOMEM;
                r = buffer_append(key, "value", true);
                if (r >= 0)
                        r = buffer_append(key, info, true);
        }
        if (r < 0)
                return r;
        for (size_t j = 0; j < n_fields; j++) {
                /* sorted by name, then by position: the first field of a name comes first */
                if (j > 0 && streq(refs[j].name, refs[j - 1].name)) {
                        drop[refs[j].index] = true;
                        continue;
                }
                r = buffer_append(key, refs[j].name, true);
                if (r >= 0)
                        r = buffer_append(key, s.label_values[refs[j].index], true);
                if (r < 0)
                        return r;
        }

        /* leave the fields out that collided, keeping the order */
        n = 1;
        for (size_t i = 1; i <= n_fields; i++) {
                if (drop[i]) {
                        s.label_names[i] = mfree(s.label_names[i]);
                        s.label_values[i] = mfree(s.label_values[i]);
                        continue;
                }
                if (n < i) {
                        s.label_names[n] = TAKE_PTR(s.label_names[i]);
                        s.label_values[n] = TAKE_PTR(s.label_values[i]);
                }
                n++;
        }
        s.n_labels = n;

        if (info) {
                s.label_names[n] = strdup("value");
                if (!s.label_names[n])
                        return -ENOMEM;
                s.label_values[n] = TAKE_PTR(info);
                s.n_labels++;
        }

        *ret = s;
        s = (GuestSeries){};
        return 0;
}

static int report_map(GuestReport *report, const json_t *metrics, size_t series_limit) {
        _cleanup_(key_set_done) KeySet families = {}, seen = {};
        _cleanup_(buffer_done) Buffer key = {};
        uint8_t hash_key[16];
        size_t n_entries, n_sample;
        int r;

        /* a secret key per upload; without the kernel's randomness, an address of the stack */
        if (getrandom(hash_key, sizeof(hash_key), GRND_NONBLOCK) != (ssize_t) sizeof(hash_key)) {
                uintptr_t a = (uintptr_t) &key;
                memset(hash_key, 0x5a, sizeof(hash_key));
                memcpy(hash_key, &a, sizeof(a));
        }
        families.hash_key = seen.hash_key = hash_key;

        n_entries = json_array_size(metrics);
        report->n_entries = n_entries;

        n_sample = MIN(n_entries, (size_t) GUEST_SAMPLE_MAX);
        report->sample = n_sample > 0 ? json_array() : json_null();
        if (!report->sample)
                return -ENOMEM;
        for (size_t i = 0; i < n_sample; i++)
                if (json_array_append(report->sample, json_array_get(metrics, i)) < 0)
                        return -ENOMEM;

        if (n_entries > 0) {
                report->series = calloc(MIN(n_entries, series_limit), sizeof(GuestSeries));
                if (!report->series)
                        return -ENOMEM;
        }

        for (size_t i = 0; i < n_entries; i++) {
                const json_t *entry = json_array_get(metrics, i), *name = json_object_get(entry, "name");
                GuestSeries s;
                EntryClass c;

                if (json_is_string(name)) {
                        r = key_set_add(&families, json_string_value(name), json_string_length(name));
                        if (r < 0)
                                return r;
                }

                if (!json_is_object(entry) || !entry_classify(entry, &c)) {
                        report->dropped[GUEST_DROP_UNSUPPORTED]++;
                        continue;
                }
                if (report->n_series >= series_limit) {
                        report->dropped[GUEST_DROP_LIMIT]++;
                        continue;
                }

                r = series_build(entry, &c, &s, &key);
                if (r < 0)
                        return r;
                r = key_set_add(&seen, key.data, key.size);
                if (r <= 0) {
                        guest_series_done(&s);
                        if (r < 0)
                                return r;
                        report->dropped[GUEST_DROP_DUPLICATE]++;
                        continue;
                }
                report->series[report->n_series++] = s;
        }
        report->n_families = families.n;
        return 0;
}

int guest_report_parse(const void *data, size_t size, size_t series_limit, GuestReport **ret) {
        _cleanup_(guest_report_freep) GuestReport *report = NULL;
        json_auto_t *root = NULL;
        const json_t *metrics, *timestamp;
        json_error_t err;
        int r;

        assert_return(data || size == 0, -EINVAL);
        assert_return(series_limit >= 1, -EINVAL);
        assert_return(ret, -EINVAL);

        if (size > GUEST_REPORT_SIZE_MAX)
                return -EMSGSIZE;
        r = check_depth(data, size);
        if (r < 0)
                return r;
        if (size == 0)
                return -EBADMSG;

        /* Any JSON value, nothing after it. An integer beyond int64 (systemd writes UINT64_MAX for
         * "infinity") is valid JSON: read the numbers as doubles then, as Go does. */
        root = json_loadb(data, size, JSON_DECODE_ANY, &err);
        if (!root && json_error_code(&err) == json_error_numeric_overflow)
                root = json_loadb(data, size, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &err);
        if (!root)
                return json_error_code(&err) == json_error_out_of_memory ? -ENOMEM : -EBADMSG;

        report = calloc(1, sizeof(GuestReport));
        if (!report)
                return -ENOMEM;

        metrics = json_object_get(root, "metrics");
        if (!json_is_array(metrics)) {
                *ret = TAKE_PTR(report);
                return 0;
        }
        report->is_report = true;

        /* generated_at stays 0 when the timestamp is missing or not Go's layout */
        timestamp = json_object_get(root, "timestamp");
        if (json_is_string(timestamp))
                (void) guest_report_parse_timestamp(json_string_value(timestamp), &report->generated_at);

        r = report_map(report, metrics, series_limit);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(report);
        return 0;
}
