/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api-error.h"
#include "cleanup.h"

/* Where VM volumes live (reference/runtime.md §7): systemd's storage provider when one answers on its
 * varlink socket, otherwise plain files in <state>/volumes. A volume is one file (or block device) whose
 * open fd is the VM's lease on it. */

typedef enum StorageKind {
        STORAGE_FILES,
        STORAGE_PROVIDER,
        _STORAGE_KIND_MAX,
        _STORAGE_KIND_INVALID = -EINVAL,
} StorageKind;

const char *storage_kind_to_string(StorageKind k) _const_;
StorageKind storage_kind_from_string(const char *s) _pure_;

typedef struct Storage Storage;

/* The sockets and volume directories of the systemd fs provider. */
#define STORAGE_PROVIDER_SYSTEM_SOCKET "/run/systemd/io.systemd.StorageProvider/fs"
#define STORAGE_PROVIDER_SYSTEM_VOLUMES "/var/lib/storage"
#define STORAGE_PROVIDER_USER_SOCKET "systemd/io.systemd.StorageProvider/fs" /* below $XDG_RUNTIME_DIR */
#define STORAGE_PROVIDER_USER_VOLUMES "storage"                              /* below $XDG_STATE_HOME */
#define STORAGE_PROVIDER_INTERFACE "io.systemd.StorageProvider"

/* Time limits of the varlink calls, in microseconds, over connect, request and reply. */
#define STORAGE_GETINFO_TIMEOUT_USEC (3ULL * 1000000ULL)
#define STORAGE_ACQUIRE_TIMEOUT_USEC (30ULL * 1000000ULL)

/* Picks the provider. Candidates, as root the system socket then the user one, otherwise the user
 * socket then the system one (user: $XDG_RUNTIME_DIR, default /run/user/<uid>); the first whose socket
 * exists and answers org.varlink.service.GetInfo within 3 s listing io.systemd.StorageProvider in
 * "interfaces" wins. Without one, the file provider in <state_dir>/volumes (created 0750). A non-NULL
 * provider_socket replaces the candidates (tests): when it does not answer, the file provider is used;
 * its volume directory is then unknown until storage_set_volume_dir(). The choice is logged at debug
 * level. Blocking: meant for start-up. */
int storage_new(Storage **ret, const char *state_dir, const char *provider_socket);
Storage *storage_free(Storage *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Storage *, storage_free);

StorageKind storage_kind(Storage *s);
/* "files in <dir>" or "systemd storage provider at <socket>"; borrowed. */
const char *storage_description(Storage *s);
/* The directory the volumes are in: <state>/volumes for files, the fs provider's directory (system:
 * /var/lib/storage, user: $XDG_STATE_HOME/storage, default ~/.local/state/storage), or NULL when not
 * known; borrowed. */
const char *storage_volume_dir(Storage *s);
/* Sets the provider's volume directory (a provider socket given explicitly has none); used to name
 * volumes and by storage_delete(). -EINVAL for the file provider. */
int storage_set_volume_dir(Storage *s, const char *dir);

typedef struct Volume {
        char *name;
        char *path; /* absolute; NULL when the volume has no name in the file system (an O_TMPFILE
                     * volume of the provider): then only fd reaches it */
        uint64_t size;
        bool block; /* a block device, not a regular file */
        bool read_only;
        int fd; /* the lease: O_CLOEXEC, held as long as the VM uses the volume */
} Volume;

#define VOLUME_NULL ((Volume){ .fd = -EBADF })

/* Closes fd, frees strings; leaves v as VOLUME_NULL. */
void volume_done(Volume *v);

typedef enum VolumeCreate {
        VOLUME_OPEN, /* the volume must exist */
        VOLUME_NEW,  /* the volume must not exist; it is created */
        VOLUME_ANY,  /* opened if it exists, created otherwise */
        _VOLUME_CREATE_MAX,
        _VOLUME_CREATE_INVALID = -EINVAL,
} VolumeCreate;

/* "open", "new", "any": the createMode of the varlink call. */
const char *volume_create_to_string(VolumeCreate m) _const_;
VolumeCreate volume_create_from_string(const char *s) _pure_;

/* A single path component, not "." or "..", no '/' (nor NUL), name + ".volume" at most 255 bytes. */
bool volume_name_is_valid(const char *name);

/* Acquires the volume read-write; size (bytes) is used only when the volume is created.
 *
 * Files: <dir>/<name>.volume, created O_CREAT|O_EXCL 0600 and ftruncate()d to size (sparse), or opened
 * keeping its size. Creating needs size > 0.
 *
 * Provider: io.systemd.StorageProvider.Acquire with name, createMode, readOnly=false and, only when
 * creating, requestAs="reg" and createSizeBytes (omitted when 0). The fd comes with the reply
 * (SCM_RIGHTS); "dir" volumes are refused as unsupported. The path is <volumeDir>/<name>.volume when
 * that is the same inode as the fd, else the fd's /proc/self/fd link target, unless that ends in
 * " (deleted)" (path NULL).
 *
 * Errors: exists -EEXIST conflict, missing -ENOENT not_found, bad name or size -EINVAL invalid_request,
 * read-only -EROFS conflict, wrong type -EMEDIUMTYPE conflict, unsupported -EOPNOTSUPP, provider not
 * answering in 30 s -ETIMEDOUT timeout, protocol violations -EBADMSG/-EMSGSIZE/-EPROTO internal. ret is
 * set only on success and must then be released with volume_done(). */
int storage_acquire(Storage *s, const char *name, uint64_t size, VolumeCreate mode, Volume *ret, ApiError *reterr);

/* Deletes the volume; an open lease stays usable. A missing volume is not an error (returns 0; 1 when
 * something was removed).
 *
 * Files: unlinks <dir>/<name>.volume.
 *
 * Provider: the interface has no Delete method (systemd 261's IDL: Acquire, ListVolumes, ListTemplates),
 * so, as the original does for the fs provider, <volumeDir>/<name>.volume is unlinked directly. A
 * directory there is a directory volume, which vm-manager does not manage (-EOPNOTSUPP unsupported);
 * without a known volume directory the volume cannot be found (-EOPNOTSUPP unsupported). */
int storage_delete(Storage *s, const char *name, ApiError *reterr);

/* The varlink wire format, exposed for the fuzzer and the tests. */

/* The largest message accepted, without its terminating NUL. */
#define VARLINK_MESSAGE_MAX ((size_t) 16U * 1024U * 1024U)

/* Parses one reply message (the bytes before its NUL; untrusted): a JSON object with an optional
 * "parameters" object, an optional boolean "continues" and an optional non-empty string "error"; other
 * keys are ignored, as the varlink spec asks. An error reply cannot continue. ret_parameters gets a new
 * reference (an empty object when the reply had none), ret_error a copy of the error name or NULL. The
 * outputs are set only on success. -EMSGSIZE beyond VARLINK_MESSAGE_MAX, -EBADMSG when malformed,
 * -ENOMEM. */
int varlink_parse_reply(
        const char *buf, size_t len, json_t **ret_parameters, char **ret_error, bool *ret_continues);
