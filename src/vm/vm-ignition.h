/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* User-data in Ignition spec 2.x, as Cluster API's kubeadm bootstrap provider writes it (through
 * Flatcar's Container Linux Config transpiler: spec 2.3.0), turned into spec 3.3.0, the newest
 * stable spec the guest's Ignition reads (3.x only). Pure: a string in, a string out.
 *
 * What translates: ignition.config.append/replace (as merge/replace), timeouts, security, proxy;
 * storage.files, directories and links on the root filesystem (2.x replaces an existing file unless
 * told otherwise, so each gets overwrite, and a file without contents an empty data: URL, as 3.x
 * needs for that); systemd.units with their drop-ins; networkd.units (as files under
 * /etc/systemd/network, which 3.x has no section for); passwd.users (2.x's deprecated "create"
 * object lifted into the user) and groups. What does not: filesystems other than "root", and the
 * disks, raid and filesystems sections (a VM's disk layout is the image's), and any key 2.x does not
 * define. Those are errors that name the key. */

#include <stddef.h>

#define VM_IGNITION_TARGET_VERSION "3.3.0"

/* Returns 1 and a new string in *ret when data is an Ignition 2.x config (ignition.version 2.0.0 to
 * 2.4.0), translated; 0 (and *ret untouched) when it is not one (another version, not JSON, not an
 * object): the guest's Ignition judges those. Returns -EINVAL with a new message in *reterr_message
 * for a 2.x config that cannot be translated, -ENOMEM on OOM. */
int vm_ignition_translate(const char *data, size_t size, char **ret, char **reterr_message);
