/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>

/* The metadata keys a guest's systemd-imdsd looks up, in one place: the server routes them, and the
 * guest image's hwdb record (vm-manager imds-hwdb) is generated from them. */

#define IMDS_VENDOR "giantswarm"
#define IMDS_ADDRESS "169.254.169.254"
#define IMDS_BASE_PATH "/giantswarm/v1"
#define IMDS_DATA_URL "http://" IMDS_ADDRESS IMDS_BASE_PATH

typedef struct ImdsKey {
        const char *hwdb; /* the IMDS_KEY_* property name */
        const char *path; /* below IMDS_BASE_PATH */
} ImdsKey;

extern const ImdsKey imds_keys[];
extern const size_t imds_keys_count;

/* The hwdb record, as text; a new string, NULL on OOM. */
char *imds_hwdb_record(void);
