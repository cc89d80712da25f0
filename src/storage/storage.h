/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "api-error.h"
#include "cleanup.h"
#include "time-util.h"

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

/* At most this many storage_acquire_async() calls are in flight per Storage; beyond, -EAGAIN. */
#define STORAGE_CALLS_MAX 64U

/* Picks the provider. Candidates, as root the system socket then the user one, otherwise the user
 * socket then the system one (user: $XDG_RUNTIME_DIR, default /run/user/<uid>); the first whose socket
 * exists and answers org.varlink.service.GetInfo within 3 s listing io.systemd.StorageProvider in
 * "interfaces" wins. Without one, the file provider in <state_dir>/volumes (created 0750). A non-NULL
 * provider_socket replaces the candidates (tests): when it does not answer, the file provider is used;
 * its volume directory is then unknown until storage_set_volume_dir(). The choice is logged at debug
 * level. Blocking (each GetInfo runs on a private loop of its own): meant for start-up, before the
 * daemon's loop serves. */
int storage_new(Storage **ret, const char *state_dir, const char *provider_socket);
/* Ends the calls still in flight first (their callbacks get -ECANCELED, the Storage still usable from
 * them), then frees. */
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
/* The time limit of the provider's Acquire (STORAGE_ACQUIRE_TIMEOUT_USEC unless set; tests shorten it). */
void storage_set_acquire_timeout(Storage *s, usec_t timeout);

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

typedef struct StorageCall StorageCall;

/* The outcome of storage_acquire_async(), called exactly once for every call it started, from the
 * loop (never from within storage_acquire_async() itself): r >= 0 with the volume, which the callback
 * may take over (moving *volume out and leaving VOLUME_NULL; what it leaves is released after it
 * returns); or r < 0 with e, whose contents it may take the same way. -ECANCELED when
 * storage_call_cancel() or storage_free() ended the call. The call is freed once the callback returns:
 * a caller that keeps the StorageCall pointer forgets it there. */
typedef void (*StorageAcquireFunc)(StorageCall *c, int r, Volume *volume, ApiError *e, void *userdata);

/* Acquires the volume read-write, asynchronously on event; size (bytes) is used only when the volume is
 * created.
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
 * answering in 30 s -ETIMEDOUT timeout, protocol violations -EBADMSG/-EMSGSIZE/-EPROTO internal.
 *
 * The provider's call runs on the loop: a non-blocking connection, an io source, the time limit a timer.
 * The file provider's open (a local file system, no other process) runs from a defer source, so that
 * both report the same way. Returns 0 with *ret_call (optional; valid until the callback returns), and
 * every outcome, a provider that cannot be reached included, goes to the callback; or, with the callback
 * never to be called, a bad name -EINVAL, more than STORAGE_CALLS_MAX calls in flight -EAGAIN, -ENOMEM. */
int storage_acquire_async(
        Storage *s,
        sd_event *event,
        const char *name,
        uint64_t size,
        VolumeCreate mode,
        StorageAcquireFunc callback,
        void *userdata,
        StorageCall **ret_call,
        ApiError *reterr);

/* Ends a call in flight: its callback runs now, with -ECANCELED, and the call is freed. Returns NULL;
 * NULL is accepted. */
StorageCall *storage_call_cancel(StorageCall *c);

/* The same, waiting for the outcome on a private loop of its own: the provider may take 30 s. Meant
 * for start-up (reattaching the VMs an earlier daemon left running) and tests, never for code that runs
 * on the daemon's loop. ret is set only on success and must then be released with volume_done(). */
int storage_acquire(Storage *s, const char *name, uint64_t size, VolumeCreate mode, Volume *ret, ApiError *reterr);

/* Deletes the volume; an open lease stays usable. A missing volume is not an error (returns 0; 1 when
 * something was removed). This talks to no other process (an unlink() in a directory of ours or of the
 * provider's), so it runs on the loop as it is.
 *
 * Files: unlinks <dir>/<name>.volume.
 *
 * Provider: the interface has no Delete method (systemd 261's IDL: Acquire, ListVolumes, ListTemplates),
 * so, as the original does for the fs provider, <volumeDir>/<name>.volume is unlinked directly. A
 * directory there is a directory volume, which vm-manager does not manage (-EOPNOTSUPP unsupported);
 * without a known volume directory the volume cannot be found (-EOPNOTSUPP unsupported). */
int storage_delete(Storage *s, const char *name, ApiError *reterr);
/* What storage_delete() checks, without the unlink: *ret_path is the file to unlink (owned by the
 * caller), or NULL when the provider's volume is already gone. The daemon unlinks it on its file
 * writer's thread: freeing a written disk's blocks takes the file system hundreds of milliseconds. */
int storage_delete_path(Storage *s, const char *name, char **ret_path, ApiError *reterr);

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
