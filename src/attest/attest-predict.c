/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "attest-predict.h"
#include "cleanup.h"
#include "hex-util.h"
#include "macro.h"
#include "openssl-util.h"

/* EFI_GLOBAL_VARIABLE 8be4df61-93ca-11d2-aa0d-00e098032b8c, in EFI_GUID memory order. */
const uint8_t attest_efi_global_variable_guid[ATTEST_EFI_GUID_SIZE] = {
        0x61, 0xdf, 0xe4, 0x8b, 0xca, 0x93, 0xd2, 0x11, 0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c,
};

/* EFI_IMAGE_SECURITY_DATABASE_GUID d719b2cb-3d3a-4596-a3bc-dad00e67656f. */
const uint8_t attest_efi_image_security_database_guid[ATTEST_EFI_GUID_SIZE] = {
        0xcb, 0xb2, 0x19, 0xd7, 0x3a, 0x3d, 0x96, 0x45, 0xa3, 0xbc, 0xda, 0xd0, 0x0e, 0x67, 0x65, 0x6f,
};

/* PE/COFF layout (Microsoft PE Format specification), all fields little endian. */
#define DOS_E_LFANEW 0x3c
#define DOS_HEADER_SIZE 0x40
#define COFF_HEADER_SIZE 20 /* after the 4-byte "PE\0\0" signature */
#define COFF_NUMBER_OF_SECTIONS 2
#define COFF_SIZE_OF_OPTIONAL_HEADER 16
#define OPT_MAGIC_PE32 0x10b
#define OPT_MAGIC_PE32_PLUS 0x20b
#define OPT_SIZE_OF_HEADERS 60
#define OPT_CHECKSUM 64
#define OPT_PE32_NUMBER_OF_RVA 92
#define OPT_PE32_PLUS_NUMBER_OF_RVA 108
#define DATA_DIRECTORY_SIZE 8
#define DIRECTORY_SECURITY 4
#define SECTION_HEADER_SIZE 40
#define SECTION_NAME_SIZE 8
#define SECTION_VIRTUAL_SIZE 8
#define SECTION_SIZE_OF_RAW_DATA 16
#define SECTION_POINTER_TO_RAW_DATA 20

/* The PCR 12 event is the string as UTF-16 with NUL; a SMBIOS string is at most 64 KiB, so this
 * bounds what any real extra can be without limiting it. */
#define CMDLINE_EXTRA_MAX ((size_t) 64 << 10)

static uint16_t le16(const uint8_t *p) {
        return (uint16_t) (p[0] | p[1] << 8);
}

static uint32_t le32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static void put_le64(uint8_t *p, uint64_t v) {
        for (unsigned i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

int attest_sha256(const void *data, size_t size, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        assert_return(data || size == 0, -EINVAL);

        if (EVP_Digest(data ?: "", size, ret, NULL, EVP_sha256(), NULL) != 1)
                return -ENOMEM;
        return 0;
}

int attest_pcr_extend(uint8_t pcr[static ATTEST_SHA256_SIZE], const uint8_t digest[static ATTEST_SHA256_SIZE]) {
        uint8_t buf[2 * ATTEST_SHA256_SIZE];

        memcpy(buf, pcr, ATTEST_SHA256_SIZE);
        memcpy(buf + ATTEST_SHA256_SIZE, digest, ATTEST_SHA256_SIZE);
        return attest_sha256(buf, sizeof(buf), pcr);
}

int attest_pcr_replay(
        const uint8_t (*digests)[ATTEST_SHA256_SIZE], size_t n, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        uint8_t pcr[ATTEST_SHA256_SIZE] = {};
        int r;

        assert_return(digests || n == 0, -EINVAL);

        for (size_t i = 0; i < n; i++) {
                r = attest_pcr_extend(pcr, digests[i]);
                if (r < 0)
                        return r;
        }
        memcpy(ret, pcr, ATTEST_SHA256_SIZE);
        return 0;
}

/* What the Authenticode digest and the section lookup need of an image, every offset checked. */
typedef struct PeSection {
        const uint8_t *header; /* the 40-byte section header */
        uint32_t raw_offset;
        uint32_t raw_size;
        unsigned index; /* in the section table, so that the sort is stable */
} PeSection;

typedef struct PeImage {
        size_t header_size;  /* SizeOfHeaders */
        size_t checksum;     /* offset of the optional header's CheckSum */
        size_t security;     /* offset of the certificate table entry; 0 when the image has none */
        uint32_t cert_size;  /* that entry's Size */
        PeSection *sections; /* the ones with file data, by file offset */
        size_t n_sections;
        uint64_t hashed;      /* SizeOfHeaders plus the sections' raw sizes */
        const uint8_t *table; /* the section table, every entry */
        size_t n_table;
} PeImage;

static void pe_image_done(PeImage *pe) {
        pe->sections = mfree(pe->sections);
}

static int section_cmp(const void *a, const void *b) {
        const PeSection *x = a, *y = b;

        if (x->raw_offset != y->raw_offset)
                return x->raw_offset < y->raw_offset ? -1 : 1;
        return x->index < y->index ? -1 : x->index > y->index;
}

static int pe_parse(const uint8_t *p, size_t size, PeImage *ret) {
        _cleanup_free_ PeSection *sections = NULL;
        size_t pe, opt, opt_size, n_table, table, rva_count_at, directories, n = 0;
        uint32_t n_rva;
        uint16_t magic;

        /* Sizes are compared as uint64_t: every field is at most 32 bits, so sums of two or three
         * cannot wrap, while size_t arithmetic on a 32-bit host could. */
        if (size < DOS_HEADER_SIZE || p[0] != 'M' || p[1] != 'Z')
                return -EBADMSG;
        pe = le32(p + DOS_E_LFANEW);
        if ((uint64_t) pe + 4 + COFF_HEADER_SIZE > size || memcmp(p + pe, "PE\0\0", 4) != 0)
                return -EBADMSG;

        n_table = le16(p + pe + 4 + COFF_NUMBER_OF_SECTIONS);
        opt_size = le16(p + pe + 4 + COFF_SIZE_OF_OPTIONAL_HEADER);
        opt = pe + 4 + COFF_HEADER_SIZE;
        if ((uint64_t) opt + opt_size > size || opt_size < 2)
                return -EBADMSG;

        magic = le16(p + opt);
        if (magic == OPT_MAGIC_PE32)
                rva_count_at = OPT_PE32_NUMBER_OF_RVA;
        else if (magic == OPT_MAGIC_PE32_PLUS)
                rva_count_at = OPT_PE32_PLUS_NUMBER_OF_RVA;
        else
                return -EBADMSG;
        directories = rva_count_at + 4;
        if (opt_size < directories)
                return -EBADMSG;
        n_rva = le32(p + opt + rva_count_at);
        if ((uint64_t) n_rva * DATA_DIRECTORY_SIZE > opt_size - directories)
                return -EBADMSG;

        *ret = (PeImage){
                .header_size = le32(p + opt + OPT_SIZE_OF_HEADERS),
                .checksum = opt + OPT_CHECKSUM,
        };
        if (n_rva > DIRECTORY_SECURITY) {
                ret->security = opt + directories + DIRECTORY_SECURITY * DATA_DIRECTORY_SIZE;
                ret->cert_size = le32(p + ret->security + 4);
        }

        /* The digest skips the CheckSum and the certificate entry inside SizeOfHeaders, and a loader
         * maps the section table from the headers: all of them must lie there. */
        table = opt + opt_size;
        if (ret->header_size > size ||
            (uint64_t) table + (uint64_t) n_table * SECTION_HEADER_SIZE > ret->header_size)
                return -EBADMSG;

        if (n_table > 0) {
                sections = calloc(n_table, sizeof(PeSection));
                if (!sections)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < n_table; i++) {
                const uint8_t *h = p + table + i * SECTION_HEADER_SIZE;
                uint32_t raw_size = le32(h + SECTION_SIZE_OF_RAW_DATA),
                         raw_offset = le32(h + SECTION_POINTER_TO_RAW_DATA);

                /* A section without file data (.bss) contributes nothing to the digest. */
                if (raw_size == 0)
                        continue;
                if ((uint64_t) raw_offset + raw_size > size)
                        return -EBADMSG;
                sections[n++] = (PeSection){
                        .header = h, .raw_offset = raw_offset, .raw_size = raw_size, .index = i
                };
        }
        if (n > 1)
                qsort(sections, n, sizeof(PeSection), section_cmp);

        /* edk2's digest then covers what follows, up to the certificate table it takes to end the
         * file. It counts bytes rather than following offsets: sections that overlap or repeat bytes
         * would make that count meaningless, and no linker writes them, so they are refused, as is a
         * certificate table larger than what the count leaves (edk2 refuses that too). */
        ret->hashed = ret->header_size;
        for (size_t i = 0; i < n; i++)
                ret->hashed += sections[i].raw_size;
        if (ret->hashed > size || (ret->hashed < size && ret->hashed + ret->cert_size > size))
                return -EBADMSG;

        ret->sections = TAKE_PTR(sections);
        ret->n_sections = n;
        ret->table = p + table;
        ret->n_table = n_table;
        return 0;
}

static int digest_range(EVP_MD_CTX *ctx, const uint8_t *p, size_t from, size_t to) {
        if (from > to)
                return -EBADMSG;
        if (EVP_DigestUpdate(ctx, p + from, to - from) != 1)
                return -ENOMEM;
        return 0;
}

int attest_pe_authenticode_sha256(const uint8_t *image, size_t size, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        _cleanup_(EVP_MD_CTX_freep) EVP_MD_CTX *ctx = NULL;
        _cleanup_(pe_image_done) PeImage pe = {};
        uint8_t digest[ATTEST_SHA256_SIZE];
        int r;

        assert_return(image || size == 0, -EINVAL);

        r = pe_parse(image, size, &pe);
        if (r < 0)
                return r;

        ctx = EVP_MD_CTX_new();
        if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
                return -ENOMEM;

        /* The headers, without the two fields signing changes: the CheckSum and the certificate
         * table entry (absent when the directory has fewer than five entries). */
        r = digest_range(ctx, image, 0, pe.checksum);
        if (r < 0)
                return r;
        if (pe.security > 0) {
                r = digest_range(ctx, image, pe.checksum + 4, pe.security);
                if (r >= 0)
                        r = digest_range(ctx, image, pe.security + DATA_DIRECTORY_SIZE, pe.header_size);
        } else
                r = digest_range(ctx, image, pe.checksum + 4, pe.header_size);
        if (r < 0)
                return r;

        for (size_t i = 0; i < pe.n_sections; i++) {
                const PeSection *s = pe.sections + i;

                r = digest_range(ctx, image, s->raw_offset, (size_t) s->raw_offset + s->raw_size);
                if (r < 0)
                        return r;
        }

        /* pe_parse() checked that the count and the certificate table fit. */
        if (pe.hashed < size) {
                r = digest_range(ctx, image, (size_t) pe.hashed, size - pe.cert_size);
                if (r < 0)
                        return r;
        }

        if (EVP_DigestFinal_ex(ctx, digest, NULL) != 1)
                return -ENOMEM;
        memcpy(ret, digest, ATTEST_SHA256_SIZE);
        return 0;
}

int attest_pe_section(const uint8_t *image, size_t size, const char *name, const uint8_t **ret, size_t *ret_size) {
        _cleanup_(pe_image_done) PeImage pe = {};
        char want[SECTION_NAME_SIZE] = {};
        size_t len;
        int r;

        assert_return(image || size == 0, -EINVAL);
        assert_return(name, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(ret_size, -EINVAL);

        len = strlen(name);
        if (len == 0 || len > SECTION_NAME_SIZE)
                return -EINVAL;
        memcpy(want, name, len);

        r = pe_parse(image, size, &pe);
        if (r < 0)
                return r;

        /* The first section of that name wins, as in the stub's section lookup. */
        for (size_t i = 0; i < pe.n_table; i++) {
                const uint8_t *h = pe.table + i * SECTION_HEADER_SIZE;
                uint32_t virtual_size = le32(h + SECTION_VIRTUAL_SIZE),
                         raw_size = le32(h + SECTION_SIZE_OF_RAW_DATA);
                uint32_t raw_offset = le32(h + SECTION_POINTER_TO_RAW_DATA);

                if (memcmp(h, want, SECTION_NAME_SIZE) != 0)
                        continue;

                if (virtual_size > raw_size)
                        return -EBADMSG;
                /* pe_parse() checked the raw data of every section that has some. */
                *ret = virtual_size > 0 ? image + raw_offset : image;
                *ret_size = virtual_size;
                return 0;
        }
        return -ENOENT;
}

int attest_digest_separator(uint8_t ret[static ATTEST_SHA256_SIZE]) {
        static const uint8_t zero[4] = {};

        return attest_sha256(zero, sizeof(zero), ret);
}

int attest_digest_efi_action(const char *action, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        assert_return(action, -EINVAL);

        return attest_sha256(action, strlen(action), ret);
}

int attest_digest_efi_variable(
        const uint8_t guid[static ATTEST_EFI_GUID_SIZE],
        const char *name,
        const void *data,
        size_t size,
        uint8_t ret[static ATTEST_SHA256_SIZE]) {
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len, total;
        uint8_t *q;

        assert_return(name, -EINVAL);
        assert_return(data || size == 0, -EINVAL);

        len = strlen(name);
        if (len == 0)
                return -EINVAL;
        for (size_t i = 0; i < len; i++)
                if ((unsigned char) name[i] > 0x7f)
                        return -EINVAL;

        /* The callers name a handful of variables with data of at most a few KiB (an enrolled
         * certificate list), so the sum cannot wrap; checked anyway as the sizes come from outside. */
        if (size > SIZE_MAX - ATTEST_EFI_GUID_SIZE - 16 - 2 * len)
                return -EINVAL;
        total = ATTEST_EFI_GUID_SIZE + 16 + 2 * len + size;
        buf = malloc(total);
        if (!buf)
                return -ENOMEM;

        q = buf;
        memcpy(q, guid, ATTEST_EFI_GUID_SIZE);
        q += ATTEST_EFI_GUID_SIZE;
        put_le64(q, len);
        put_le64(q + 8, size);
        q += 16;
        for (size_t i = 0; i < len; i++) {
                *q++ = (uint8_t) name[i];
                *q++ = 0;
        }
        if (size > 0)
                memcpy(q, data, size);

        return attest_sha256(buf, total, ret);
}

int attest_pcr7_secure_boot_off_events(
        uint8_t ret[static ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS][ATTEST_SHA256_SIZE]) {
        static const uint8_t secure_boot_off = 0;
        uint8_t events[ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS][ATTEST_SHA256_SIZE];
        int r;

        /* OVMF's Tcg2Dxe measures these five whether or not they exist, an absent one with no data. */
        r = attest_digest_efi_variable(
                attest_efi_global_variable_guid, "SecureBoot", &secure_boot_off, 1, events[0]);
        if (r >= 0)
                r = attest_digest_efi_variable(attest_efi_global_variable_guid, "PK", NULL, 0, events[1]);
        if (r >= 0)
                r = attest_digest_efi_variable(attest_efi_global_variable_guid, "KEK", NULL, 0, events[2]);
        if (r >= 0)
                r = attest_digest_efi_variable(
                        attest_efi_image_security_database_guid, "db", NULL, 0, events[3]);
        if (r >= 0)
                r = attest_digest_efi_variable(
                        attest_efi_image_security_database_guid, "dbx", NULL, 0, events[4]);
        if (r >= 0)
                r = attest_digest_separator(events[5]);
        if (r < 0)
                return r;

        memcpy(ret, events, sizeof(events));
        return 0;
}

int attest_predict_pcr4(
        const uint8_t (*apps)[ATTEST_SHA256_SIZE], size_t n, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        uint8_t pcr[ATTEST_SHA256_SIZE] = {}, digest[ATTEST_SHA256_SIZE];
        int r;

        assert_return(apps || n == 0, -EINVAL);

        r = attest_digest_efi_action(ATTEST_EFI_ACTION_BOOT_OPTION, digest);
        if (r >= 0)
                r = attest_pcr_extend(pcr, digest);
        if (r >= 0)
                r = attest_digest_separator(digest);
        if (r >= 0)
                r = attest_pcr_extend(pcr, digest);
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = attest_pcr_extend(pcr, apps[i]);
        if (r < 0)
                return r;

        memcpy(ret, pcr, ATTEST_SHA256_SIZE);
        return 0;
}

static bool stub_whitespace(unsigned char c) {
        /* The stub's rule: every control character, space and DEL. */
        return c <= 0x20 || c == 0x7f;
}

int attest_digest_stub_cmdline_extra(const char *extra, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        _cleanup_free_ uint8_t *utf16 = NULL;
        size_t start, end, len;
        int r;

        if (!extra)
                return 0;

        len = strlen(extra);
        if (len > CMDLINE_EXTRA_MAX)
                return -EINVAL;
        for (size_t i = 0; i < len; i++)
                if ((unsigned char) extra[i] > 0x7f)
                        return -EINVAL;

        for (start = 0; start < len && stub_whitespace(extra[start]); start++)
                ;
        for (end = len; end > start && stub_whitespace(extra[end - 1]); end--)
                ;
        if (start == end)
                return 0;

        /* Each inner whitespace character becomes one space (runs are not squeezed); the event is
         * the UTF-16LE string with its NUL. */
        utf16 = malloc(2 * (end - start + 1));
        if (!utf16)
                return -ENOMEM;
        for (size_t i = start; i < end; i++) {
                utf16[2 * (i - start)] = stub_whitespace(extra[i]) ? ' ' : (uint8_t) extra[i];
                utf16[2 * (i - start) + 1] = 0;
        }
        utf16[2 * (end - start)] = utf16[2 * (end - start) + 1] = 0;

        r = attest_sha256(utf16, 2 * (end - start + 1), ret);
        if (r < 0)
                return r;
        return 1;
}

int attest_predict_pcr12_booted(const char *extra, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        return attest_predict_pcr12_credentials(extra, NULL, ret);
}

int attest_predict_pcr12(const char *extra, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        uint8_t digest[ATTEST_SHA256_SIZE];
        int r;

        r = attest_digest_stub_cmdline_extra(extra, digest);
        if (r < 0)
                return r;
        return attest_pcr_replay(&digest, r > 0 ? 1 : 0, ret);
}

static int credential_compare(const void *a, const void *b) {
        const AttestVmCredential *x = a, *y = b;

        return strcmp(x->name, y->name);
}

int attest_credentials_word(const AttestVmCredential *c, size_t n, char **ret) {
        _cleanup_free_ AttestVmCredential *sorted = NULL;
        _cleanup_free_ char *lines = NULL;
        char hex[ATTEST_SHA256_HEX + 1];
        uint8_t digest[ATTEST_SHA256_SIZE];
        size_t size = 0;
        char *word;
        int r;

        assert_return(c || n == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        sorted = calloc(MAX(n, (size_t) 1), sizeof(AttestVmCredential));
        if (!sorted)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                if (!c[i].name || !c[i].value || strpbrk(c[i].name, "=\n"))
                        return -EINVAL;
                sorted[i] = c[i];
        }
        if (n > 1)
                qsort(sorted, n, sizeof(AttestVmCredential), credential_compare);

        for (size_t i = 0; i < n; i++) {
                char *more;

                r = attest_sha256(sorted[i].value, strlen(sorted[i].value), digest);
                if (r < 0)
                        return r;
                hex_format(digest, sizeof(digest), hex);
                if (asprintf(&more, "%s%s=%s\n", lines ?: "", sorted[i].name, hex) < 0)
                        return -ENOMEM;
                free(lines);
                lines = more;
                size = strlen(lines);
        }
        r = attest_sha256(lines ?: "", size, digest);
        if (r < 0)
                return r;
        hex_format(digest, sizeof(digest), hex);
        if (asprintf(&word, ATTEST_CREDENTIALS_PREFIX "%s", hex) < 0)
                return -ENOMEM;
        *ret = word;
        return 0;
}

int attest_predict_pcr12_credentials(
        const char *extra, const char *credentials_word, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        static const char separator[] = "os-separator";
        uint8_t digests[3][ATTEST_SHA256_SIZE];
        size_t n = 0;
        int r;

        r = attest_digest_stub_cmdline_extra(extra, digests[0]);
        if (r < 0)
                return r;
        if (r > 0)
                n++;
        r = attest_sha256(separator, strlen(separator), digests[n++]);
        if (r < 0)
                return r;
        if (credentials_word) {
                r = attest_sha256(credentials_word, strlen(credentials_word), digests[n++]);
                if (r < 0)
                        return r;
        }
        return attest_pcr_replay(digests, n, ret);
}
