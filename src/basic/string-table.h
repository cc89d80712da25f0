/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#include "macro.h"

/* The names of an enum's values, kept in one table per enum:
 *
 *     static const char *const vm_phase_table[_VM_PHASE_MAX] = {
 *             [VM_PHASE_INSTALL] = "install",
 *             [VM_PHASE_BOOT] = "boot",
 *     };
 *     DEFINE_STRING_TABLE_LOOKUP(vm_phase, VmPhase);
 *
 * defines vm_phase_to_string() (NULL for a value outside the table) and vm_phase_from_string()
 * (the value, or -EINVAL for NULL and unknown names, which is what _FOO_INVALID is). */

/* The index of key in table, or -EINVAL when key is NULL or not in it. NULL entries never match. */
ssize_t string_table_lookup(const char *const *table, size_t len, const char *key) _pure_;

#define _DEFINE_STRING_TABLE_LOOKUP_TO_STRING(name, type, scope)                    \
        scope const char *name##_to_string(type i) {                                \
                if ((size_t) i >= ELEMENTSOF(name##_table))                         \
                        return NULL; /* negative values wrap to beyond the table */ \
                return name##_table[i];                                             \
        }

#define _DEFINE_STRING_TABLE_LOOKUP_FROM_STRING(name, type, scope)                            \
        scope type name##_from_string(const char *s) {                                        \
                return (type) string_table_lookup(name##_table, ELEMENTSOF(name##_table), s); \
        }

#define DEFINE_STRING_TABLE_LOOKUP_TO_STRING(name, type) _DEFINE_STRING_TABLE_LOOKUP_TO_STRING(name, type, )
#define DEFINE_STRING_TABLE_LOOKUP_FROM_STRING(name, type) \
        _DEFINE_STRING_TABLE_LOOKUP_FROM_STRING(name, type, )
#define DEFINE_STRING_TABLE_LOOKUP(name, type)              \
        _DEFINE_STRING_TABLE_LOOKUP_TO_STRING(name, type, ) \
        _DEFINE_STRING_TABLE_LOOKUP_FROM_STRING(name, type, )
#define DEFINE_PRIVATE_STRING_TABLE_LOOKUP(name, type)            \
        _DEFINE_STRING_TABLE_LOOKUP_TO_STRING(name, type, static) \
        _DEFINE_STRING_TABLE_LOOKUP_FROM_STRING(name, type, static)
