/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* PCR values predicted from artifacts: Authenticode digests of the PE images of
 * tests/data/attest/pe/ (made by its gen.py; the expected digests were computed by an independent
 * Python implementation and, for uki.efi and signed32.efi, confirmed by osslsigncode 2.9's
 * "Calculated message digest"), malformed images refused, UKI sections extracted, and the events of
 * the recorded OVMF boot (firmware.log, firmware-pcrs.json) predicted: PCR 7 entirely, PCRs 2, 3, 6
 * and 12, and PCR 4 from the applications' digests the log names. */
#include <jansson.h>

#include "test-attest-fixtures.h"

#include "attest-predict.h"

static void assert_hex(const uint8_t digest[static ATTEST_SHA256_SIZE], const char *want) {
        char got[ATTEST_SHA256_HEX + 1];

        for (size_t i = 0; i < ATTEST_SHA256_SIZE; i++)
                sprintf(got + 2 * i, "%02x", digest[i]);
        assert_string_equal(got, want);
}

static void unhex(const char *s, uint8_t ret[static ATTEST_SHA256_SIZE]) {
        assert_int_equal(strlen(s), ATTEST_SHA256_HEX);
        for (size_t i = 0; i < ATTEST_SHA256_SIZE; i++)
                assert_int_equal(sscanf(s + 2 * i, "%2hhx", &ret[i]), 1);
}

/* The value of PCR index the guest of the recorded boot read (firmware-pcrs.json), as a new string. */
static char *firmware_pcr(unsigned index) {
        _cleanup_free_ char *text = fixture_text("firmware-pcrs.json");
        json_auto_t *v = json_loads(text, 0, NULL);
        char key[4];
        json_t *e;

        assert_non_null(v);
        snprintf(key, sizeof(key), "%u", index);
        e = json_object_get(json_object_get(v, "sha256"), key);
        assert_true(json_is_string(e));
        return strdup(json_string_value(e));
}

static void le32_put(uint8_t *p, uint32_t v) {
        for (unsigned i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

/* Offsets in gen.py's images: the PE header at 0x80, the optional header after its 24 bytes. */
#define PE 0x80
#define OPT (PE + 24)
#define TABLE_PLUS (OPT + 112 + 16 * 8)
#define TABLE_PE32 (OPT + 96 + 16 * 8)

#define KERNEL_DIGEST "6b0700279a578f35f36ecc6a45fe27c209f81e094d6d545211e2be7b9927ed87"
#define UKI_DIGEST "b94f64bd5fbca3a3b79603d38256ce55a088ae7a47a6b4fb6e021e744f0ed806"
#define SIGNED32_DIGEST "4c9f73c9755cbcc66e4029f58874af3cc74c22daaebb2cd68c40b7b7c515662d"
#define FEWDIRS_DIGEST "2c37e1738e2a61eab28ed8105b8f57443173e205023a5cded70848fc6ee01c96"

static void test_authenticode_vectors(void **state) {
        static const struct {
                const char *file, *digest;
        } vectors[] = {
                { "pe/kernel.efi", KERNEL_DIGEST },
                { "pe/uki.efi", UKI_DIGEST },
                { "pe/signed32.efi", SIGNED32_DIGEST },
                { "pe/fewdirs.efi", FEWDIRS_DIGEST },
        };

        for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
                _cleanup_free_ uint8_t *image = NULL;
                uint8_t digest[ATTEST_SHA256_SIZE];
                size_t size;

                image = fixture_read(vectors[i].file, &size);
                assert_ok(attest_pe_authenticode_sha256(image, size, digest));
                assert_hex(digest, vectors[i].digest);
        }
}

/* What signing changes leaves the digest alone; what the loader runs does not. */
static void test_authenticode_covers(void **state) {
        _cleanup_free_ uint8_t *uki = NULL, *signed32 = NULL;
        uint8_t digest[ATTEST_SHA256_SIZE], want[ATTEST_SHA256_SIZE];
        size_t uki_size, signed32_size;

        uki = fixture_read("pe/uki.efi", &uki_size);
        signed32 = fixture_read("pe/signed32.efi", &signed32_size);

        /* the CheckSum */
        le32_put(uki + OPT + 64, 0xdeadbeef);
        assert_ok(attest_pe_authenticode_sha256(uki, uki_size, digest));
        assert_hex(digest, UKI_DIGEST);

        /* the certificate's bytes (its last one) */
        signed32[signed32_size - 1] ^= 0xff;
        assert_ok(attest_pe_authenticode_sha256(signed32, signed32_size, digest));
        assert_hex(digest, SIGNED32_DIGEST);

        /* a byte of .cmdline, stored last */
        uki[uki_size - 0x200] ^= 1;
        assert_ok(attest_pe_authenticode_sha256(uki, uki_size, digest));
        unhex(UKI_DIGEST, want);
        assert_memory_not_equal(digest, want, ATTEST_SHA256_SIZE);
        uki[uki_size - 0x200] ^= 1;

        /* a byte after the last section of signed32.efi, before its certificate */
        signed32[0xa00] ^= 1;
        assert_ok(attest_pe_authenticode_sha256(signed32, signed32_size, digest));
        unhex(SIGNED32_DIGEST, want);
        assert_memory_not_equal(digest, want, ATTEST_SHA256_SIZE);
}

static void assert_refused(const uint8_t *image, size_t size) {
        uint8_t digest[ATTEST_SHA256_SIZE];
        const uint8_t *section;
        size_t section_size;

        assert_errno(attest_pe_authenticode_sha256(image, size, digest), -EBADMSG);
        assert_errno(attest_pe_section(image, size, ".text", &section, &section_size), -EBADMSG);
}

static void test_authenticode_malformed(void **state) {
        _cleanup_free_ uint8_t *image = NULL, *copy = NULL, *signed32 = NULL;
        size_t size, signed32_size;

        image = fixture_read("pe/uki.efi", &size);
        copy = malloc(size);
        assert_non_null(copy);

        /* Every strict prefix: uki.efi ends with its last section's data. */
        for (size_t n = 0; n < size; n++)
                assert_refused(image, n);
        assert_refused(NULL, 0);

#define MUTATE(stmt)                        \
        do {                                \
                memcpy(copy, image, size);  \
                stmt;                       \
                assert_refused(copy, size); \
        } while (0)

        MUTATE(copy[0] = 'X');                               /* no MZ */
        MUTATE(copy[PE + 1] = 'X');                          /* no PE signature */
        MUTATE(le32_put(copy + 0x3c, UINT32_C(0xfffffffc))); /* e_lfanew past the end */
        MUTATE(le32_put(copy + 0x3c, (uint32_t) size - 8));  /* PE header cut by the end */
        MUTATE(copy[OPT] = 0x07);                            /* neither PE32 nor PE32+ magic */
        MUTATE(copy[PE + 20] = 8);                           /* optional header too small for its fields */
        MUTATE(le32_put(copy + OPT + 108, 100));             /* more data directories than it holds */
        MUTATE(le32_put(copy + OPT + 60, (uint32_t) size + 1)); /* SizeOfHeaders past the end */
        MUTATE(le32_put(copy + OPT + 60, TABLE_PLUS + 40));     /* section table past SizeOfHeaders */
        MUTATE(copy[PE + 6] = 0xff);                            /* 255 sections: same */
        /* .text's data past the end, and at an offset whose sum with its size wraps 32 bits */
        MUTATE(le32_put(copy + TABLE_PLUS + 20, (uint32_t) size));
        MUTATE(le32_put(copy + TABLE_PLUS + 20, UINT32_C(0xffffff00)));
        MUTATE(le32_put(copy + TABLE_PLUS + 16, UINT32_C(0xffffffff)));
        /* .osrel pointing at .linux with its size: the bytes counted exceed the file's */
        MUTATE(le32_put(copy + TABLE_PLUS + 40 + 16, 0xc00); le32_put(copy + TABLE_PLUS + 40 + 20, 0x800));
#undef MUTATE

        /* A certificate table larger than what follows the sections. */
        signed32 = fixture_read("pe/signed32.efi", &signed32_size);
        le32_put(signed32 + OPT + 96 + 4 * 8 + 4, (uint32_t) (signed32_size - 0xa00 + 1));
        assert_refused(signed32, signed32_size);
}

static void test_section(void **state) {
        _cleanup_free_ uint8_t *uki = NULL, *kernel = NULL;
        uint8_t digest[ATTEST_SHA256_SIZE];
        size_t uki_size, kernel_size, n;
        const uint8_t *p;

        uki = fixture_read("pe/uki.efi", &uki_size);
        kernel = fixture_read("pe/kernel.efi", &kernel_size);

        /* .linux holds kernel.efi: VirtualSize bytes of its file-aligned raw data. */
        assert_ok(attest_pe_section(uki, uki_size, ".linux", &p, &n));
        assert_int_equal(n, kernel_size);
        assert_memory_equal(p, kernel, kernel_size);
        assert_ok(attest_pe_authenticode_sha256(p, n, digest));
        assert_hex(digest, KERNEL_DIGEST);

        assert_ok(attest_pe_section(uki, uki_size, ".cmdline", &p, &n));
        assert_int_equal(n, strlen("console=ttyS0 quiet"));
        assert_memory_equal(p, "console=ttyS0 quiet", n);
        assert_ok(attest_pe_section(uki, uki_size, ".osrel", &p, &n));
        assert_memory_equal(p, "ID=test\nVERSION_ID=1\n", n);

        /* .bss is all zero fill, which the file does not hold */
        assert_errno(attest_pe_section(uki, uki_size, ".bss", &p, &n), -EBADMSG);
        assert_errno(attest_pe_section(uki, uki_size, ".initrd", &p, &n), -ENOENT);
        assert_errno(attest_pe_section(uki, uki_size, ".linu", &p, &n), -ENOENT);
        assert_errno(attest_pe_section(uki, uki_size, "", &p, &n), -EINVAL);
        assert_errno(attest_pe_section(uki, uki_size, ".toolongname", &p, &n), -EINVAL);

        /* A section that claims more memory than its raw data. */
        le32_put(uki + TABLE_PLUS + 2 * 40 + 8, 0x201);
        assert_errno(attest_pe_section(uki, uki_size, ".cmdline", &p, &n), -EBADMSG);
}

/* sd-boot as the host's systemd-boot-efi package ships it, when it is the build the digest was
 * computed for (252.39-1~deb12u2's, by the same Python implementation). */
static void test_authenticode_host_sd_boot(void **state) {
        _cleanup_free_ char *data = NULL;
        uint8_t digest[ATTEST_SHA256_SIZE];
        size_t size;

        if (read_full_file("/usr/lib/systemd/boot/efi/systemd-bootx64.efi", 1 << 20, &data, &size) < 0)
                skip();
        assert_ok(attest_sha256(data, size, digest));
        if (memcmp(digest,
                   "\x10\x28\x8f\xec\xe5\xe9\x0c\xe3\xba\x3e\x71\x60\xf4\x96\x95\xb0"
                   "\x22\xd6\x48\xf7\xef\x41\x77\x46\x78\xdb\x8c\x77\x77\x4d\xb1\x67",
                   ATTEST_SHA256_SIZE) != 0) {
                /* another build (Debian 13's 257): skip() leaves by longjmp, past the cleanup */
                data = mfree(data);
                skip();
        }
        assert_ok(attest_pe_authenticode_sha256((const uint8_t *) data, size, digest));
        assert_hex(digest, "7843e376e57323bcdfebcffc8d5109eb39721c83d8bedab1dfd6431596875c2c");
}

static void test_event_digests(void **state) {
        static const uint8_t zero = 0;
        uint8_t digest[ATTEST_SHA256_SIZE];

        assert_ok(attest_digest_separator(digest));
        assert_hex(digest, "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119");
        assert_ok(attest_digest_efi_action(ATTEST_EFI_ACTION_BOOT_OPTION, digest));
        assert_hex(digest, "3d6772b4f84ed47595d72a2c4c5ffd15f5bb72c7507fe26f2aaee2c69d5633ba");

        /* The SecureBoot event of the recorded log. */
        assert_ok(attest_digest_efi_variable(attest_efi_global_variable_guid, "SecureBoot", &zero, 1, digest));
        assert_hex(digest, "115aa827dbccfb44d216ad9ecfda56bdea620b860a94bed5b7a27bba1c4d02d8");

        assert_errno(attest_digest_efi_variable(attest_efi_global_variable_guid, "", NULL, 0, digest), -EINVAL);
        assert_errno(
                attest_digest_efi_variable(attest_efi_global_variable_guid, "Bo\xc3\xb6t", NULL, 0, digest),
                -EINVAL);
}

/* The recorded boot's PCR 7: Secure Boot off, no keys, every event as the log has it. */
static void test_fixture_pcr7(void **state) {
        static const char *logged[ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS] = {
                "115aa827dbccfb44d216ad9ecfda56bdea620b860a94bed5b7a27bba1c4d02d8", /* SecureBoot */
                "dea7b80ab53a3daaa24d5cc46c64e1fa9ffd03739f90aadbd8c0867c4a5b4890", /* PK */
                "e670e121fcebd473b8bc41bb801301fc1d9afa33904f06f7149b74f12c47a68f", /* KEK */
                "baf89a3ccace52750c5f0128351e0422a41597a1adfd50822aa363b9d124ea7c", /* db */
                "9f75b6823bff6af1024a4e2036719cdd548d3cbc2bf1de8e7ef4d0ed01f94bf9", /* dbx */
                "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119", /* separator */
        };
        uint8_t events[ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS][ATTEST_SHA256_SIZE], pcr[ATTEST_SHA256_SIZE];
        _cleanup_free_ char *want = firmware_pcr(7);

        assert_ok(attest_pcr7_secure_boot_off_events(events));
        for (size_t i = 0; i < ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS; i++)
                assert_hex(events[i], logged[i]);
        assert_ok(attest_pcr_replay(events, ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS, pcr));
        assert_hex(pcr, want);
}

/* PCRs 2, 3 and 6 hold the separator only; PCR 12 nothing (the boot had no extra cmdline). */
static void test_fixture_separator_pcrs(void **state) {
        uint8_t separator[1][ATTEST_SHA256_SIZE], pcr[ATTEST_SHA256_SIZE];
        _cleanup_free_ char *pcr12 = firmware_pcr(12);

        assert_ok(attest_digest_separator(separator[0]));
        assert_ok(attest_pcr_replay(separator, 1, pcr));
        for (unsigned i = 2; i <= 6; i += i == 3 ? 3 : 1) {
                _cleanup_free_ char *want = firmware_pcr(i);
                assert_hex(pcr, want);
        }

        assert_ok(attest_predict_pcr12(NULL, pcr));
        assert_hex(pcr, pcr12);
}

/* PCR 4 of the recorded boot (firmware → the test image's UKI → its .linux), from the two
 * applications' digests as tpm2_eventlog shows them in firmware.log. */
static void test_fixture_pcr4(void **state) {
        uint8_t apps[2][ATTEST_SHA256_SIZE], pcr[ATTEST_SHA256_SIZE], recorded[ATTEST_SHA256_SIZE];
        _cleanup_free_ char *want = firmware_pcr(4);

        unhex("f452cbeaabdbf0e342f94299dbfb46bc428f4ae55974d364b2cda5d75b6c0681", apps[0]);
        unhex("65c89335d8a5d25a8eeffd4de4a02087ac8dcf26165dbff8806a19f68ecd2842", apps[1]);
        assert_ok(attest_predict_pcr4(apps, 2, pcr));
        assert_hex(pcr, want);

        /* One application fewer is another value. */
        assert_ok(attest_predict_pcr4(apps, 1, pcr));
        unhex(want, recorded);
        assert_memory_not_equal(pcr, recorded, ATTEST_SHA256_SIZE);
}

static void test_pcr12(void **state) {
        uint8_t digest[ATTEST_SHA256_SIZE], pcr[ATTEST_SHA256_SIZE];

        assert_int_equal(attest_digest_stub_cmdline_extra("systemd.journald.forward_to_console=1", digest), 1);
        assert_hex(digest, "929a685e78a2f709b9d5f1d540847ee90b1defe4ba18ddd5a10328b76065e8ac");
        assert_ok(attest_predict_pcr12("systemd.journald.forward_to_console=1", pcr));
        assert_hex(pcr, "e76cd54437fb5ea9a6dfb33bd083aa7785696ee35648530caefbbe28c89171fb");

        /* Outer whitespace dropped, inner control characters each turned into one space. */
        assert_ok(attest_predict_pcr12("  console=ttyS0\tfoo  ", pcr));
        assert_hex(pcr, "dae6a39d53598c2c066d012f55645a254606b62e63dc297201d6166ef6fd7b1a");
        assert_ok(attest_predict_pcr12(
                "a\t\tb\x7f"
                "c",
                pcr));
        assert_hex(pcr, "b3e0c090c109265b69a8399815cbb0e671bf892321d3937b00bd640c4f1244d0");
        assert_ok(attest_predict_pcr12("a  b c", pcr));
        assert_hex(pcr, "b3e0c090c109265b69a8399815cbb0e671bf892321d3937b00bd640c4f1244d0");

        /* Blank measures nothing: PCR 12 stays zero. */
        assert_int_equal(attest_digest_stub_cmdline_extra(" \t\n", digest), 0);
        assert_int_equal(attest_digest_stub_cmdline_extra(NULL, digest), 0);
        assert_ok(attest_predict_pcr12("", pcr));
        assert_hex(pcr, "0000000000000000000000000000000000000000000000000000000000000000");

        assert_errno(attest_predict_pcr12("console=tty\xc3\xa9", pcr), -EINVAL);

        /* As a quote shows it, systemd's os-separator after the stub: the values of a real boot of
         * the image under OVMF (first installed boot, then a later one without the extra string). */
        assert_ok(attest_predict_pcr12_booted("ignition.firstboot", pcr));
        assert_hex(pcr, "a48c906841f7db416c2eab0aab159b7d813c4b0f82288a9a9cbc17a08536608c");
        assert_ok(attest_predict_pcr12_booted(NULL, pcr));
        assert_memory_not_equal(pcr, (uint8_t[ATTEST_SHA256_SIZE]){}, ATTEST_SHA256_SIZE);
}

/* The credentials word: names in byte order, each value's SHA-256, the SHA-256 of the lines (what
 * the image's vm-measure-credentials computes with ls, sha256sum and cut); then PCR 12 with it after
 * the os-separator. The expected values are computed independently (Python's hashlib). */
static void test_pcr12_credentials(void **state) {
        const AttestVmCredential creds[] = {
                { "system.machine_id", "0123456789abcdef0123456789abcdef" },
                { "firstboot.hostname", "e2e-a" },
        };
        _cleanup_free_ char *word = NULL, *empty = NULL, *bad = NULL;
        uint8_t pcr[ATTEST_SHA256_SIZE];

        assert_ok(attest_credentials_word(creds, ELEMENTSOF(creds), &word));
        assert_string_equal(
                word, "vm-credentials:84b7d02300bec3b9b048a6861ee0e4202d37188f92116ca7e7f498832a8ff73d");
        /* none at all: the SHA-256 of nothing */
        assert_ok(attest_credentials_word(NULL, 0, &empty));
        assert_string_equal(
                empty, "vm-credentials:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        /* a name that would make two sets read alike */
        assert_errno(attest_credentials_word((const AttestVmCredential[]){ { "a=b", "c" } }, 1, &bad), -EINVAL);
        assert_null(bad);

        assert_ok(attest_predict_pcr12_credentials(NULL, word, pcr));
        assert_hex(pcr, "969e601710b0a4fa12cdea7f488b01ac55b14e02fd9f99afe2445ee82b02824f");
        /* without a word, as the image that does not measure its credentials */
        uint8_t booted[ATTEST_SHA256_SIZE];
        assert_ok(attest_predict_pcr12_credentials("ignition.firstboot", NULL, pcr));
        assert_ok(attest_predict_pcr12_booted("ignition.firstboot", booted));
        assert_memory_equal(pcr, booted, ATTEST_SHA256_SIZE);
}

static void test_replay(void **state) {
        uint8_t digests[2][ATTEST_SHA256_SIZE] = {}, pcr[ATTEST_SHA256_SIZE], manual[ATTEST_SHA256_SIZE] = {};

        assert_ok(attest_pcr_replay(NULL, 0, pcr));
        assert_memory_equal(pcr, manual, ATTEST_SHA256_SIZE);

        assert_ok(attest_sha256("a", 1, digests[0]));
        assert_ok(attest_sha256("b", 1, digests[1]));
        assert_ok(attest_pcr_extend(manual, digests[0]));
        assert_ok(attest_pcr_extend(manual, digests[1]));
        assert_ok(attest_pcr_replay(digests, 2, pcr));
        assert_memory_equal(pcr, manual, ATTEST_SHA256_SIZE);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_authenticode_vectors),
                cmocka_unit_test(test_authenticode_covers),
                cmocka_unit_test(test_authenticode_malformed),
                cmocka_unit_test(test_section),
                cmocka_unit_test(test_authenticode_host_sd_boot),
                cmocka_unit_test(test_event_digests),
                cmocka_unit_test(test_fixture_pcr7),
                cmocka_unit_test(test_fixture_separator_pcrs),
                cmocka_unit_test(test_fixture_pcr4),
                cmocka_unit_test(test_pcr12),
                cmocka_unit_test(test_pcr12_credentials),
                cmocka_unit_test(test_replay),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
