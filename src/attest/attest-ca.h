/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "cleanup.h"

/* The host's own certificate authority for vTPMs: one EC P-256 key and its self-signed certificate,
 * made once under the daemon's state directory (the key 0600, read by nobody but swtpm_localca,
 * never served). swtpm_setup signs each new vTPM's EK certificate with it through swtpm_localca and
 * the configuration files written beside the key, so that a guest's EK can later be traced back to
 * this host. Files in the CA directory:
 *   ca-key.pem       the private key (0600)
 *   ca-cert.pem      the certificate EK certificates chain to
 *   certserial       swtpm_localca's serial counter
 *   localca.conf, localca.options, swtpm_setup.conf   what swtpm_setup --config names */

typedef struct AttestCa AttestCa;

/* What a VM's EK certificate says about the EK its guest presents. */
typedef enum AttestEkVerdict {
        ATTEST_EK_ABSENT,    /* the vTPM was manufactured without a certificate (an older VM) */
        ATTEST_EK_CERTIFIED, /* signed by this host's CA, and the presented EK is the certified one */
        ATTEST_EK_FOREIGN,   /* signed by another CA, unreadable, or the presented EK is another one */
        _ATTEST_EK_VERDICT_MAX,
        _ATTEST_EK_VERDICT_INVALID = -EINVAL,
} AttestEkVerdict;

const char *attest_ek_verdict_to_string(AttestEkVerdict v);
AttestEkVerdict attest_ek_verdict_from_string(const char *s);

/* Opens the CA in dir, creating the directory, the key, the certificate and the configuration files
 * when they are not there yet. common_name names the CA in its certificate (the host's name, say).
 * Takes a few milliseconds (an EC key), once per host. */
int attest_ca_open(const char *dir, const char *common_name, AttestCa **ret);
AttestCa *attest_ca_free(AttestCa *ca);
DEFINE_TRIVIAL_CLEANUP_FUNC(AttestCa *, attest_ca_free);

/* The file to pass as swtpm_setup --config. */
const char *attest_ca_setup_config(const AttestCa *ca);

/* Judges a VM's EK certificate (DER, as swtpm_setup --write-ek-cert-files writes it; NULL for
 * none) and, when ek_pub is not NULL, the EK a guest presented (a marshalled TPM2B_PUBLIC, RSA):
 * certified when the certificate chains to this CA and certifies that same key. *ret_why, when not
 * NULL, gets a sentence for a foreign verdict. */
AttestEkVerdict attest_ca_check_ek(
        const AttestCa *ca,
        const void *cert_der,
        size_t cert_size,
        const void *ek_pub,
        size_t ek_pub_size,
        char **ret_why);
