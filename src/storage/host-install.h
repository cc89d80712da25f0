/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The host install: a VM's disk laid out from its image's layout file (disk-layout.h) and the image's
 * own partitions, without an installer boot. Runs in a helper process (`vm-manager host-install`,
 * which the daemon starts and watches): it blocks for seconds on disk I/O and runs mke2fs.
 *
 * The order makes it atomic for whoever reads the disk: the target's first and last MiB are zeroed
 * first (no stale table), the partitions are written and flushed, then the backup table and last
 * the primary one, each flushed. Whatever fails on the way, the head and tail are zeroed again, so a
 * failed install leaves no partition table describing half-written partitions. */

#include <stdint.h>

/* One file put into the file system the layout formats (var) while it is made, so that the guest
 * finds it there on its first boot: source, a file on the host; path, its place in that file system,
 * relative ("lib/extensions/kubernetes_1.36.4.raw"). Directories are made 0755, the file 0444. */
typedef struct HostInstallSeed {
        const char *source;
        const char *path;
} HostInstallSeed;

typedef struct HostInstallStats {
        uint64_t copied, cloned, zeroed; /* bytes written by copy_file_range/read-write, reflinked, zeroed */
} HostInstallStats;

/* image: the .raw; layout: the layout file; target: the disk (a file or a block device) of
 * at least disk_size bytes (0: any), laid out over its whole size; seed: NULL, or a file for the
 * formatted file system (staged in a directory of the working directory, removed again).
 * Errors are reported on stderr, the last line the reason. */
int host_install_run(
        const char *image,
        const char *layout,
        const char *target,
        uint64_t disk_size,
        const HostInstallSeed *seed,
        HostInstallStats *ret);

/* `vm-manager host-install IMAGE LAYOUT TARGET [SIZE [VAR_FILE VAR_PATH]]`: exit status 0 when the
 * disk is laid out. */
int host_install_main(int argc, char **argv);
