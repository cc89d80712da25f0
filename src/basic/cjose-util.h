/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Cleanups for libcjose types, kept in one place (link with cjose to use them). The release
 * functions return nothing and accept NULL, so the trivial form fits. */

#include <cjose/header.h>
#include <cjose/jwk.h>
#include <cjose/jws.h>

#include "cleanup.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(cjose_jwk_t *, cjose_jwk_release);
DEFINE_TRIVIAL_CLEANUP_FUNC(cjose_jws_t *, cjose_jws_release);
DEFINE_TRIVIAL_CLEANUP_FUNC(cjose_header_t *, cjose_header_release);
