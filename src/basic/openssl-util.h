/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Cleanups for OpenSSL types, kept in one place (link with libcrypto to use them). */

#include <openssl/evp.h>
#include <openssl/x509_vfy.h>

#include "cleanup.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(EVP_MD_CTX *, EVP_MD_CTX_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(EVP_PKEY *, EVP_PKEY_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(X509_STORE *, X509_STORE_free);
