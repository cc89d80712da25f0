/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Cleanups for libarchive types, kept in one place (link with libarchive to use them). */

#include <archive.h>

#include "cleanup.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(struct archive *, archive_read_free);
