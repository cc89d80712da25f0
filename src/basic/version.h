/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Stamped by the build (tools/gen-version.sh). */
extern const char vmm_version[];
extern const char vmm_commit[];
extern const char vmm_build_time[];
