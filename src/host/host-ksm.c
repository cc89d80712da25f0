/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cleanup.h"
#include "fs-util.h"
#include "host-ksm.h"
#include "parse-util.h"
#include "string-util.h"

/* One sysfs value: a decimal number on one line. Its text is a few bytes; 64 refuses anything else. */
static int read_number(const char *dir, const char *name, bool is_signed, int64_t *ret_signed, uint64_t *ret) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        const char *digits;
        int r;

        if (asprintf(&path, "%s/%s", dir, name) < 0)
                return -ENOMEM;
        r = read_full_file(path, 64, &text, NULL);
        if (r < 0)
                return r == -EFBIG ? -EBADMSG : r;
        text[strcspn(text, "\n")] = 0;
        digits = is_signed && text[0] == '-' ? text + 1 : text;
        if (digits[0] < '0' || digits[0] > '9')
                return -EBADMSG;

        uint64_t u;
        if (safe_atou64(digits, &u) < 0)
                return -EBADMSG;
        if (!is_signed) {
                *ret = u;
                return 0;
        }
        if (u > (uint64_t) INT64_MAX)
                return -EBADMSG;
        *ret_signed = digits == text ? (int64_t) u : -(int64_t) u;
        return 0;
}

int host_ksm_read(const char *dir, HostKsm *ret) {
        HostKsm k = { .available = true };
        struct stat st;
        int r;

        assert_return(dir, -EINVAL);
        assert_return(ret, -EINVAL);

        if (stat(dir, &st) < 0) {
                if (errno != ENOENT)
                        return -errno;
                *ret = (HostKsm){}; /* a kernel without CONFIG_KSM */
                return 0;
        }
        if (!S_ISDIR(st.st_mode))
                return -ENOTDIR;

        /* all of these are there since Linux 2.6.32 */
        const char *const names[] = {
                "run", "pages_shared", "pages_sharing", "pages_unshared", "pages_volatile", "full_scans"
        };
        uint64_t *const fields[] = {
                &k.run,       &k.pages_shared, &k.pages_sharing, &k.pages_unshared, &k.pages_volatile,
                &k.full_scans
        };
        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                r = read_number(dir, names[i], false, NULL, fields[i]);
                if (r < 0)
                        return r == -ENOENT ? -EBADMSG : r;
        }

        r = read_number(dir, "general_profit", true, &k.general_profit, NULL);
        if (r >= 0)
                k.have_general_profit = true;
        else if (r != -ENOENT)
                return r;

        *ret = k;
        return 0;
}

uint64_t host_ksm_saved_bytes(const HostKsm *k, uint64_t page_size) {
        return k->pages_sharing > UINT64_MAX / (page_size ?: 1) ? UINT64_MAX : k->pages_sharing * page_size;
}

static const char *ksm_note(const HostKsm *k) {
        if (!k->available)
                return "this kernel has no KSM (/sys/kernel/mm/ksm is absent)";
        if (k->run == 0)
                return "KSM is off: echo 1 > /sys/kernel/mm/ksm/run turns it on; it merges only private memory, "
                       "not the shared memfd guest RAM of vhost-user VMs";
        if (k->run == 2)
                return "KSM is off and has unmerged everything (run is 2)";
        return "KSM is on; it merges only private memory, not the shared memfd guest RAM of vhost-user VMs";
}

json_t *host_ksm_to_json(const HostKsm *k, uint64_t page_size) {
        json_auto_t *o = NULL;
        uint64_t saved;

        assert_return(k, NULL);

        saved = host_ksm_saved_bytes(k, page_size);
        o = json_pack(
                "{s:b,s:b,s:s}",
                "available",
                k->available,
                "running",
                k->available && k->run == 1,
                "note",
                ksm_note(k));
        if (!o)
                return NULL;
        if (!k->available)
                return TAKE_PTR(o);
        if (json_object_set_new(o, "run", json_integer((json_int_t) MIN(k->run, (uint64_t) INT64_MAX))) < 0 ||
            json_object_set_new(
                    o, "pagesShared", json_integer((json_int_t) MIN(k->pages_shared, (uint64_t) INT64_MAX))) <
                    0 ||
            json_object_set_new(
                    o, "pagesSharing", json_integer((json_int_t) MIN(k->pages_sharing, (uint64_t) INT64_MAX))) <
                    0 ||
            json_object_set_new(o, "savedBytes", json_integer((json_int_t) MIN(saved, (uint64_t) INT64_MAX))) <
                    0)
                return NULL;
        if (k->have_general_profit &&
            json_object_set_new(o, "generalProfitBytes", json_integer((json_int_t) k->general_profit)) < 0)
                return NULL;
        return TAKE_PTR(o);
}
