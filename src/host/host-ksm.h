/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Kernel samepage merging as /sys/kernel/mm/ksm says: whether it runs and what it has merged. KSM
 * merges private anonymous pages that a process marked MADV_MERGEABLE (QEMU does for guest RAM, with
 * -machine mem-merge=on, its default); the pages of a shared mapping, such as the memfd guest RAM of
 * vhost-user VMs, are never merged. */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct HostKsm {
        bool available;         /* the kernel has KSM (the directory exists) */
        uint64_t run;           /* 0 stopped, 1 running, 2 stopped after unmerging everything */
        uint64_t pages_shared;  /* the merged pages kept */
        uint64_t pages_sharing; /* the sites that share them: the pages saved */
        uint64_t pages_unshared, pages_volatile, full_scans;
        bool have_general_profit; /* Linux 6.6 on */
        int64_t general_profit;   /* bytes saved less KSM's own metadata */
} HostKsm;

/* Reads dir (/sys/kernel/mm/ksm, or a test's copy). A missing dir is 0 with available false; a file
 * that is missing or does not hold a number is -EBADMSG (general_profit may be missing). */
int host_ksm_read(const char *dir, HostKsm *ret);

/* The bytes KSM saves: pages_sharing pages of page_size. */
uint64_t host_ksm_saved_bytes(const HostKsm *k, uint64_t page_size);

/* get_host's "ksm": {"available", "running", "run", "pagesShared", "pagesSharing", "savedBytes",
 * "generalProfitBytes", "note"}, the note saying what is off or absent. A new reference, NULL on OOM. */
json_t *host_ksm_to_json(const HostKsm *k, uint64_t page_size);
