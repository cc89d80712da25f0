/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "attest-util.h"

/* PCR values predicted from artifacts rather than learned from a boot (issue 36): the digests the
 * firmware and systemd's stub extend for the events of a boot we know the inputs of, on the sha256
 * bank. Pure functions over caller-owned bytes: no files, no TPM, no logging.
 *
 * - A boot-service application (sd-boot, a UKI, the .linux the stub loads) is measured into PCR 4 as
 *   EV_EFI_BOOT_SERVICES_APPLICATION with its PE/COFF Authenticode SHA-256, the digest edk2's
 *   DxeTpm2MeasureBootLib computes: the headers without the CheckSum field and the certificate table
 *   entry, the sections' file data in file order, then the bytes after the last section up to the
 *   certificate table. The image bytes are untrusted (a UKI a user uploaded): every offset is checked
 *   against the size, and a malformed image is refused with -EBADMSG.
 * - EV_SEPARATOR is the 4 zero bytes OVMF measures into PCRs 0-7 before handing over to the boot
 *   option; EV_EFI_ACTION the ASCII string without a NUL.
 * - EV_EFI_VARIABLE_DRIVER_CONFIG (PCR 7) measures a UEFI_VARIABLE_DATA: the vendor GUID (EFI_GUID
 *   byte order, its first three fields little endian), the name's length in UTF-16 characters and
 *   the data's length in bytes (each 64-bit little endian), the UTF-16LE name without NUL, the data.
 * - systemd-stub (262) measures the SMBIOS string io.systemd.stub.kernel-cmdline-extra into PCR 12
 *   as EV_IPL: the value with leading and trailing control characters and spaces dropped and the
 *   inner ones turned into spaces, as UTF-16LE with its NUL terminator. It measures nothing when
 *   the string is absent or blank after that, so PCR 12 stays at zero.
 *
 * Every PCR predicted here starts at zero (PCRs 0-16 reset to zero); OpenSSL failures are
 * reported as -ENOMEM, as allocation is all that can make a SHA-256 fail. */

/* EFI_GUID bytes of the variables PCR 7 names: EFI_GLOBAL_VARIABLE (SecureBoot, PK, KEK) and
 * EFI_IMAGE_SECURITY_DATABASE_GUID (db, dbx). */
#define ATTEST_EFI_GUID_SIZE 16U
extern const uint8_t attest_efi_global_variable_guid[ATTEST_EFI_GUID_SIZE];
extern const uint8_t attest_efi_image_security_database_guid[ATTEST_EFI_GUID_SIZE];

/* The EV_EFI_ACTION strings of the TCG PC Client Platform Firmware Profile that OVMF measures into
 * PCR 4 (the first) and PCR 5 (the others). */
#define ATTEST_EFI_ACTION_BOOT_OPTION "Calling EFI Application from Boot Option"
#define ATTEST_EFI_ACTION_RETURNING "Returning from EFI Application from Boot Option"
#define ATTEST_EFI_ACTION_EXIT_BOOT_SERVICES "Exit Boot Services Invocation"
#define ATTEST_EFI_ACTION_EXIT_BOOT_SERVICES_OK "Exit Boot Services Returned with Success"

/* PCR 7 with Secure Boot off and no keys enrolled (Debian's OVMF_VARS_4M.fd): SecureBoot (one
 * byte, 0), PK, KEK, db and dbx (empty), then the separator. */
#define ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS 6U

/* sha256(data) into ret. */
int attest_sha256(const void *data, size_t size, uint8_t ret[static ATTEST_SHA256_SIZE]);

/* pcr = sha256(pcr ‖ digest): one TPM2_PCR_Extend on the sha256 bank. */
int attest_pcr_extend(uint8_t pcr[static ATTEST_SHA256_SIZE], const uint8_t digest[static ATTEST_SHA256_SIZE]);

/* The value a PCR reset to zero holds after the n digests are extended in order (zero for n = 0). */
int attest_pcr_replay(
        const uint8_t (*digests)[ATTEST_SHA256_SIZE], size_t n, uint8_t ret[static ATTEST_SHA256_SIZE]);

/* The Authenticode SHA-256 of a PE/COFF image (PE32 or PE32+), as its EV_EFI_BOOT_SERVICES_APPLICATION
 * digest. -EBADMSG when the bytes are no PE image, or one whose headers, sections or certificate table
 * reach past its end or overlap so that no consistent digest exists; -ENOMEM on OOM. */
int attest_pe_authenticode_sha256(const uint8_t *image, size_t size, uint8_t ret[static ATTEST_SHA256_SIZE]);

/* The bytes of the first section called name (1-8 characters, as a UKI's ".linux", ".cmdline",
 * ".osrel") that the loader copies from the file: min(VirtualSize, SizeOfRawData) bytes at
 * PointerToRawData, as systemd's stub reads them. *ret points into image (borrowed). -ENOENT when
 * the image has no such section; -EBADMSG for a malformed image (as above) and for a section whose
 * VirtualSize exceeds its raw data, since its memory holds zero fill that these bytes lack;
 * -EINVAL for a name that cannot be a short section name. */
int attest_pe_section(const uint8_t *image, size_t size, const char *name, const uint8_t **ret, size_t *ret_size);

/* EV_SEPARATOR: sha256 of the 32-bit value 0 (the firmware's "no error" separator). */
int attest_digest_separator(uint8_t ret[static ATTEST_SHA256_SIZE]);

/* EV_EFI_ACTION: sha256 of the action string, without its NUL. */
int attest_digest_efi_action(const char *action, uint8_t ret[static ATTEST_SHA256_SIZE]);

/* EV_EFI_VARIABLE_*: sha256 of the UEFI_VARIABLE_DATA for the variable name (ASCII, converted to
 * UTF-16LE; -EINVAL for other bytes or an empty name) of vendor guid with size bytes of data. */
int attest_digest_efi_variable(
        const uint8_t guid[static ATTEST_EFI_GUID_SIZE],
        const char *name,
        const void *data,
        size_t size,
        uint8_t ret[static ATTEST_SHA256_SIZE]);

/* The PCR 7 events of ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS, in the order OVMF measures them. */
int attest_pcr7_secure_boot_off_events(
        uint8_t ret[static ATTEST_PCR7_SECURE_BOOT_OFF_EVENTS][ATTEST_SHA256_SIZE]);

/* PCR 4 after a boot that ran the n applications (their Authenticode digests, in load order) from
 * a boot option: EV_EFI_ACTION "Calling EFI Application from Boot Option", the separator, then
 * one EV_EFI_BOOT_SERVICES_APPLICATION per application. For our images the applications are
 * sd-boot, the UKI and the UKI's .linux. */
int attest_predict_pcr4(
        const uint8_t (*apps)[ATTEST_SHA256_SIZE], size_t n, uint8_t ret[static ATTEST_SHA256_SIZE]);

/* The EV_IPL digest systemd-stub measures into PCR 12 for the kernel-cmdline-extra SMBIOS string
 * extra (NUL-terminated). Returns 1 with the digest in ret, or 0 when the stub measures nothing
 * (extra is NULL or blank; ret untouched). -EINVAL when extra holds a byte above 0x7f: the stub
 * decodes UTF-8 in ways this prediction does not follow, so the daemon keeps the value ASCII. */
int attest_digest_stub_cmdline_extra(const char *extra, uint8_t ret[static ATTEST_SHA256_SIZE]);

/* PCR 12 as systemd-stub 262 leaves it when the kernel-cmdline-extra string is extra (NULL when the
 * VM has none) and the ESP holds no addons, credentials or confexts: all zeros, or the one
 * extension above. -EINVAL as above. */
int attest_predict_pcr12(const char *extra, uint8_t ret[static ATTEST_SHA256_SIZE]);

/* PCR 12 as a guest's quote shows it once systemd runs in the initrd: what the stub left
 * (attest_predict_pcr12()), then systemd's "os-separator" event, the SHA-256 of that string, which
 * systemd (262) measures into PCRs 0-7 and 12 early in the initrd and records in its userspace
 * event log. Seen on a real boot of the image under OVMF: "ignition.firstboot" gives a48c9068…. */
int attest_predict_pcr12_booted(const char *extra, uint8_t ret[static ATTEST_SHA256_SIZE]);

/* A credential as the daemon hands it to a VM (an SMBIOS type 11 io.systemd.credential string): the
 * guest's PID 1 stores value's bytes as /run/credentials/@system/NAME. */
typedef struct AttestVmCredential {
        const char *name;
        const char *value;
} AttestVmCredential;

#define ATTEST_CREDENTIALS_PREFIX "vm-credentials:"
/* The word the image's initrd extends PCR 12 with for the credentials it was handed
 * (vm-measure-credentials, after systemd's os-separator): "vm-credentials:" and the lower-case hex
 * SHA-256 of one line "NAME=<hex SHA-256 of the value>\n" per credential, the names in byte order.
 * systemd-pcrextend extends PCR 12 with the SHA-256 of that word. n may be 0. Returns a new string
 * in *ret; -EINVAL for a name holding '=' or a newline (it would make two sets read alike). */
int attest_credentials_word(const AttestVmCredential *c, size_t n, char **ret);

/* PCR 12 as above, followed by the credentials event of an image that measures them: extended with
 * the SHA-256 of credentials_word (attest_credentials_word()); NULL: no such event, as
 * attest_predict_pcr12_booted(). */
int attest_predict_pcr12_credentials(
        const char *extra, const char *credentials_word, uint8_t ret[static ATTEST_SHA256_SIZE]);
