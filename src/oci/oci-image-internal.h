/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The install step of oci-image.c, which tests/unit/test-oci-image.c checks rename by rename. Not
 * for other modules. */

#include <stddef.h>

#include "api-error.h"

typedef enum OciStagedKind {
        OCI_STAGED_FILE, /* name in the stage, dest in the directory */
        OCI_STAGED_TREE, /* sysupdate/<component>, the same in both */
        OCI_STAGED_GONE, /* dest leaves the directory (into the stage) when it is there; name unused */
} OciStagedKind;

typedef struct OciStaged {
        OciStagedKind kind;
        const char *name;
        const char *dest;
} OciStaged;

/* Moves a staged image into dirfd: <image>.efi (staged under that name) leaves the directory first
 * when it is there, then the trees and the files go in (each with one rename, or an exchange with
 * what they replace), the files the new image has no counterpart of leave (a rename into the stage),
 * and <image>.efi comes last. On failure every step is undone. What was replaced or removed ends up
 * in the stage. */
int oci_image_install(
        int dirfd, int stagefd, const char *image, const OciStaged *items, size_t n, ApiError *reterr);
