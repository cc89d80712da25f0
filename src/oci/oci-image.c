/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "attest-policy.h"
#include "fs-util.h"
#include "image-catalog.h"
#include "json-util.h"
#include "oci-digest.h"
#include "oci-image-internal.h"
#include "oci-image.h"
#include "oci-manifest.h"
#include "oci-tar.h"
#include "oci-util.h"
#include "string-table.h"

#define TREE_BYTES_MAX_DEFAULT ((uint64_t) 64 << 30)
#define SMALL_FILE_MAX ((size_t) 1 << 20)
#define RECORD_MAX ((size_t) 64 << 10)
#define STAGE_PREFIX ".pull-"
#define RECORD_SUFFIX ".oci.json"
#define SYSUPDATE "sysupdate"
#define POLICY_FILE "policy.json"
#define BUILD_MANIFEST_FILE "manifest.json"
#define NAME_MAX_LEN 255U

static const char *const oci_policy_mode_table[_OCI_POLICY_MODE_MAX] = {
        [OCI_POLICY_KEEP] = "keep",
        [OCI_POLICY_REPLACE] = "replace",
};

DEFINE_STRING_TABLE_LOOKUP(oci_policy_mode, OciPolicyMode);

void oci_push_result_done(OciPushResult *r) {
        if (!r)
                return;
        r->image = mfree(r->image);
        r->digest = mfree(r->digest);
}

void oci_pull_result_done(OciPullResult *r) {
        if (!r)
                return;
        r->image = mfree(r->image);
        r->digest = mfree(r->digest);
        r->policy_file = mfree(r->policy_file);
}

/* A file or directory name we are willing to create: 1-255 of [A-Za-z0-9._+~-], not starting with
 * '.' (the catalog's and our own hidden names) or '-'. */
static bool name_is_plain(const char *s, size_t n) {
        if (n == 0 || n > NAME_MAX_LEN || s[0] == '.' || s[0] == '-')
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                      (s[i] >= '0' && s[i] <= '9') || strchr("._+~-", s[i])))
                        return false;
        return true;
}

/* "<id>_<version>": both parts non-empty (split at the last '_'), the whole a plain name. */
static bool image_ref_is_valid(const char *s) {
        const char *us = strrchr(s, '_');
        return us && us != s && us[1] && name_is_plain(s, strlen(s));
}

/* Whether a policy's image_id and image_version allow the image (absent, null or "" allow any). */
static bool policy_key_allows(json_t *p, const char *key, const char *value) {
        json_t *v = json_object_get(p, key);
        return !v || json_is_null(v) ||
                (json_is_string(v) && (json_string_length(v) == 0 || streq(json_string_value(v), value)));
}

static bool policy_is_for(json_t *p, const char *ref) {
        _cleanup_free_ char *id = strdup(ref);
        char *us = id ? strrchr(id, '_') : NULL;

        if (!us)
                return false;
        *us = 0;
        return policy_key_allows(p, "image_id", id) && policy_key_allows(p, "image_version", us + 1);
}

/* The build's manifest.json names its image in "image". */
static bool build_manifest_is_for(json_t *m, const char *ref) {
        json_t *v = json_object_get(m, "image");
        return !v || (json_is_string(v) && streq(json_string_value(v), ref));
}

/* A small JSON object at dirfd/name: -ENOENT when absent, -EBADMSG when it is no JSON object. */
static int read_json_at(int dirfd, const char *name, json_t **ret) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t got = 0;
        json_t *v;

        fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EBADMSG;
        if ((uint64_t) st.st_size > SMALL_FILE_MAX)
                return -EFBIG;
        buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        while (got < (size_t) st.st_size) {
                ssize_t n = read(fd, buf + got, (size_t) st.st_size - got);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        break;
                got += (size_t) n;
        }
        v = json_loadb(buf, got, 0, NULL);
        if (!json_is_object(v)) {
                json_decref(v);
                return -EBADMSG;
        }
        *ret = v;
        return 0;
}

static bool has_suffix(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);
        return n >= k && streq(s + n - k, suffix);
}

static int name_cmp(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

static bool exists_at(int dirfd, const char *name) {
        struct stat st;
        return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) >= 0;
}

/* ---- push ---- */

typedef struct PushLayer {
        char *title;
        const char *media_type;
        int fd;
        uint64_t size;
        bool tree;
        char digest[OCI_DIGEST_SHA256_LEN + 1];
        char tar_digest[OCI_DIGEST_SHA256_LEN + 1];
} PushLayer;

static void push_layer_done(PushLayer *l) {
        l->title = mfree(l->title);
        l->fd = safe_close(l->fd);
}

static int push_add_file(
        PushLayer *l, int dirfd, const char *name, const char *title, const char *media_type, ApiError *reterr) {
        struct stat st;
        int r;

        *l = (PushLayer){ .fd = -EBADF, .media_type = media_type };
        l->title = strdup(title);
        if (!l->title)
                return -ENOMEM;
        l->fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
        if (l->fd < 0 || fstat(l->fd, &st) < 0)
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot open %s: %m", name);
        if (!S_ISREG(st.st_mode))
                return api_error_set(reterr, -EBADFD, API_ERROR_INTERNAL, "%s is not a regular file", name);
        r = oci_digest_fd(l->fd, l->digest, &l->size);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot read %s: %m", name);
        return 0;
}

typedef struct PackSink {
        int fd;
        uint64_t size;
        OciDigester digest;
} PackSink;

static int pack_sink(const void *p, size_t n, void *userdata) {
        PackSink *s = userdata;
        int r;

        r = oci_digester_update(&s->digest, p, n);
        if (r < 0)
                return r;
        r = loop_write(s->fd, p, n);
        if (r < 0)
                return r;
        s->size += n;
        return 0;
}

/* A temporary file nobody else can see, in $TMPDIR or /var/tmp (a packed tree can be large). */
static int open_scratch(void) {
        const char *dir = getenv("TMPDIR");
        _cleanup_free_ char *tmpl = NULL;
        int fd;

        if (!dir || !dir[0])
                dir = "/var/tmp";
        fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0)
                return fd;
        if (asprintf(&tmpl, "%s/vm-manager-push-XXXXXX", dir) < 0)
                return -ENOMEM;
        fd = mkostemp(tmpl, O_CLOEXEC);
        if (fd < 0)
                return -errno;
        (void) unlink(tmpl);
        return fd;
}

static int push_add_tree(PushLayer *l, int dirfd, const char *title, int level, ApiError *reterr) {
        PackSink s = {};
        int r;

        *l = (PushLayer){ .fd = -EBADF, .media_type = OCI_MEDIA_TYPE_LAYER_TAR_GZIP, .tree = true };
        l->title = strdup(title);
        if (!l->title)
                return -ENOMEM;
        l->fd = open_scratch();
        if (l->fd < 0)
                return api_error_set(
                        reterr,
                        l->fd,
                        API_ERROR_INTERNAL,
                        "cannot create a temporary file to pack %s in: %m",
                        title);
        s.fd = l->fd;
        r = oci_digester_init(&s.digest);
        if (r < 0)
                return r;
        r = oci_tar_gz_pack(dirfd, title, level, pack_sink, &s, l->tar_digest, reterr);
        if (r >= 0)
                r = oci_digester_final(&s.digest, l->digest);
        oci_digester_done(&s.digest);
        if (r < 0) {
                if (!api_error_is_set(reterr))
                        (void) api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot pack %s: %m", title);
                return r;
        }
        l->size = s.size;
        return 0;
}

/* The policy of image ref in dirfd: <ref>.policy.json, else a policy.json for it. *ret_name is NULL
 * when there is none. Same for the build manifest. */
static int find_companion(
        int dirfd,
        const char *ref,
        const char *suffix,
        const char *shared,
        bool (*is_for)(json_t *, const char *),
        char **ret_name) {
        _cleanup_free_ char *own = NULL;
        json_auto_t *v = NULL;

        if (asprintf(&own, "%s.%s", ref, suffix) < 0)
                return -ENOMEM;
        if (exists_at(dirfd, own)) {
                *ret_name = TAKE_PTR(own);
                return 0;
        }
        *ret_name = NULL;
        if (read_json_at(dirfd, shared, &v) >= 0 && is_for(v, ref)) {
                *ret_name = strdup(shared);
                return *ret_name ? 0 : -ENOMEM;
        }
        return 0;
}

int oci_image_push(
        OciClient *c,
        const char *image_dir,
        const char *image,
        const OciRef *ref,
        int gzip_level,
        OciPushResult *ret,
        ApiError *reterr) {
        _cleanup_(image_catalog_freep) ImageCatalog *catalog = NULL;
        _cleanup_free_ char *manifest = NULL, *uki = NULL, *disk = NULL, *policy = NULL, *build = NULL,
                            *pushed = NULL;
        _cleanup_(closedirp) DIR *sysdir = NULL;
        _cleanup_close_ int dirfd = -EBADF;
        json_auto_t *annotations = NULL;
        PushLayer layers[OCI_LAYERS_MAX] = {};
        OciDescriptor descs[OCI_LAYERS_MAX] = {};
        char digest[OCI_DIGEST_SHA256_LEN + 1];
        const Image *img;
        size_t n = 0, manifest_size = 0;
        uint64_t total = 0;
        int r;

        assert_return(c && image_dir && image && ref && ret, -EINVAL);

        for (size_t i = 0; i < ELEMENTSOF(layers); i++)
                layers[i].fd = -EBADF;

        r = image_catalog_new(&catalog, /* event= */ NULL, image_dir, reterr);
        if (r < 0)
                return r;
        img = image_catalog_resolve(catalog, image);
        if (!img)
                return api_error_set(
                        reterr,
                        -ENOENT,
                        API_ERROR_NOT_FOUND,
                        "no image '%s' in %s (want <id>_<version> or an id; an image is a .efi with its "
                        ".raw)",
                        image,
                        image_dir);
        dirfd = open(image_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0)
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot open %s: %m", image_dir);

        if (asprintf(&uki, "%s.efi", img->ref) < 0 || asprintf(&disk, "%s.raw", img->ref) < 0) {
                r = -ENOMEM;
                goto finish;
        }
        r = push_add_file(&layers[n++], dirfd, uki, uki, OCI_IMAGE_MEDIA_TYPE_UKI, reterr);
        if (r >= 0)
                r = push_add_file(&layers[n++], dirfd, disk, disk, OCI_IMAGE_MEDIA_TYPE_DISK, reterr);
        if (r >= 0)
                r = find_companion(dirfd, img->ref, POLICY_FILE, POLICY_FILE, policy_is_for, &policy);
        if (r >= 0 && policy)
                r = push_add_file(
                        &layers[n++], dirfd, policy, POLICY_FILE, OCI_IMAGE_MEDIA_TYPE_POLICY, reterr);
        if (r >= 0 && img->layout) {
                /* the disk's layout for the host install, when the image has one */
                _cleanup_free_ char *layout = NULL;
                if (asprintf(&layout, "%s.layout.json", img->ref) < 0)
                        r = -ENOMEM;
                else
                        r = push_add_file(
                                &layers[n++], dirfd, layout, layout, OCI_IMAGE_MEDIA_TYPE_LAYOUT, reterr);
        }
        if (r >= 0)
                r = find_companion(
                        dirfd, img->ref, BUILD_MANIFEST_FILE, BUILD_MANIFEST_FILE, build_manifest_is_for, &build);
        if (r >= 0 && build)
                r = push_add_file(
                        &layers[n++], dirfd, build, BUILD_MANIFEST_FILE, OCI_IMAGE_MEDIA_TYPE_MANIFEST, reterr);
        if (r < 0)
                goto finish;

        /* every tree of sysupdate/, in name order */
        {
                _cleanup_strv_free_ char **names = NULL;
                size_t k = 0;
                int sfd = openat(dirfd, SYSUPDATE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                struct dirent *de;

                if (sfd >= 0) {
                        sysdir = fdopendir(sfd);
                        if (!sysdir) {
                                safe_close(sfd);
                                r = -errno;
                                goto finish;
                        }
                        names = calloc(OCI_LAYERS_MAX + 1, sizeof(char *));
                        if (!names) {
                                r = -ENOMEM;
                                goto finish;
                        }
                        while ((de = readdir(sysdir))) {
                                struct stat st;
                                if (de->d_name[0] == '.' ||
                                    fstatat(sfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
                                    !S_ISDIR(st.st_mode))
                                        continue;
                                if (!name_is_plain(de->d_name, strlen(de->d_name)) ||
                                    k + n >= OCI_LAYERS_MAX - 1) {
                                        r = api_error_set(
                                                reterr,
                                                -EINVAL,
                                                API_ERROR_INVALID_REQUEST,
                                                "%s/%s: not a name an artifact can carry",
                                                SYSUPDATE,
                                                de->d_name);
                                        goto finish;
                                }
                                names[k] = strdup(de->d_name);
                                if (!names[k++]) {
                                        r = -ENOMEM;
                                        goto finish;
                                }
                        }
                        qsort(names, k, sizeof(char *), name_cmp);
                }
                for (size_t i = 0; i < k; i++) {
                        _cleanup_free_ char *title = NULL;
                        if (asprintf(&title, SYSUPDATE "/%s", names[i]) < 0) {
                                r = -ENOMEM;
                                goto finish;
                        }
                        r = push_add_tree(&layers[n++], dirfd, title, gzip_level, reterr);
                        if (r < 0)
                                goto finish;
                }
        }

        for (size_t i = 0; i < n; i++) {
                json_t *a = layers[i].tree ? json_pack(
                                                     "{s:s, s:s, s:s}",
                                                     OCI_ANNOTATION_TAR_DIGEST,
                                                     layers[i].tar_digest,
                                                     OCI_ANNOTATION_UNPACK,
                                                     "true",
                                                     OCI_ANNOTATION_TITLE,
                                                     layers[i].title) :
                                             json_pack("{s:s}", OCI_ANNOTATION_TITLE, layers[i].title);
                if (!a) {
                        r = -ENOMEM;
                        goto finish;
                }
                descs[i] = (OciDescriptor){
                        .media_type = (char *) layers[i].media_type,
                        .digest = layers[i].digest,
                        .size = layers[i].size,
                        .annotations = a,
                };
                total += layers[i].size;
        }
        annotations = json_pack(
                "{s:s, s:s}",
                "org.opencontainers.image.title",
                img->ref,
                "org.opencontainers.image.version",
                img->version);
        if (!annotations) {
                r = -ENOMEM;
                goto finish;
        }
        r = oci_manifest_format(OCI_IMAGE_ARTIFACT_TYPE, descs, n, annotations, &manifest, &manifest_size);
        if (r < 0)
                goto finish;
        r = oci_digest_buffer(manifest, manifest_size, digest);
        if (r < 0)
                goto finish;
        if (ref->digest && !streq(ref->digest, digest)) {
                r = api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INVALID_REQUEST,
                        "the reference names %s, but the manifest of %s is %s: push to a tag instead",
                        ref->digest,
                        img->ref,
                        digest);
                goto finish;
        }

        r = oci_client_blob_push_data(
                c, OCI_EMPTY_DATA, strlen(OCI_EMPTY_DATA), OCI_EMPTY_DIGEST, "config", reterr);
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = oci_client_blob_push_fd(
                        c, layers[i].fd, layers[i].size, layers[i].digest, layers[i].title, reterr);
        if (r < 0)
                goto finish;
        r = oci_client_manifest_put(
                c, ref->digest ?: ref->tag, OCI_MEDIA_TYPE_MANIFEST, manifest, manifest_size, &pushed, reterr);
        if (r < 0)
                goto finish;

        *ret = (OciPushResult){ .n_layers = n, .size = total };
        ret->image = strdup(img->ref);
        ret->digest = TAKE_PTR(pushed);
        if (!ret->image) {
                oci_push_result_done(ret);
                r = -ENOMEM;
                goto finish;
        }
        r = 0;
finish:
        for (size_t i = 0; i < n; i++) {
                push_layer_done(&layers[i]);
                json_decref(descs[i].annotations);
        }
        return r;
}

/* ---- pull ---- */

typedef enum LayerKind {
        LAYER_UKI,
        LAYER_DISK,
        LAYER_POLICY,
        LAYER_MANIFEST,
        LAYER_LAYOUT,
        LAYER_TREE,
} LayerKind;

typedef struct PullLayer {
        const OciDescriptor *d;
        const char *title;
        const char *tar_digest; /* trees: oras's digest of the uncompressed tar, or NULL */
        LayerKind kind;
        char *dest; /* where it goes: a name in the directory, or sysupdate/<component> */
} PullLayer;

typedef struct Plan {
        char *image; /* <id>_<version> */
        PullLayer layers[OCI_LAYERS_MAX];
        size_t n;
        uint64_t size;
} Plan;

static void plan_done(Plan *p) {
        p->image = mfree(p->image);
        for (size_t i = 0; i < p->n; i++)
                p->layers[i].dest = mfree(p->layers[i].dest);
        p->n = 0;
}

static int refuse(ApiError *reterr, const OciDescriptor *d, size_t i, const char *title, const char *why) {
        return api_error_set(
                reterr,
                -EINVAL,
                API_ERROR_INTERNAL,
                "layer %zu (%s%s%s) %s; nothing was written",
                i + 1,
                d->digest,
                title ? ", " : "",
                title ? title : "",
                why);
}

/* Checks that the manifest is an image of the layout above and says where each layer goes. Nothing
 * is fetched or written before this has passed. */
static int plan_layers(const OciManifest *m, Plan *p, ApiError *reterr) {
        const char *uki = NULL;
        size_t ln;

        for (size_t i = 0; i < m->n_layers; i++) {
                const char *t = oci_descriptor_annotation(&m->layers[i], OCI_ANNOTATION_TITLE);
                if (t && has_suffix(t, ".efi") && !strchr(t, '/')) {
                        if (uki)
                                return refuse(
                                        reterr,
                                        &m->layers[i],
                                        i,
                                        t,
                                        "is a second UKI: an artifact holds one image");
                        uki = t;
                }
        }
        if (!uki || !image_ref_is_valid(uki) || (ln = strlen(uki) - 4) == 0)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the artifact has no layer titled <id>_<version>.efi: it is not a VM image; nothing "
                        "was written");
        p->image = strndup(uki, ln);
        if (!p->image)
                return -ENOMEM;
        if (!image_ref_is_valid(p->image))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INTERNAL, "'%s' is not an image name <id>_<version>", uki);

        for (size_t i = 0; i < m->n_layers; i++) {
                const OciDescriptor *d = &m->layers[i];
                const char *t = oci_descriptor_annotation(d, OCI_ANNOTATION_TITLE),
                           *unpack = oci_descriptor_annotation(d, OCI_ANNOTATION_UNPACK), *rest;
                PullLayer *l = &p->layers[p->n];
                bool tree = unpack && streq(unpack, "true");

                if (!t)
                        return refuse(reterr, d, i, NULL, "has no title (org.opencontainers.image.title)");
                if (!oci_title_is_safe(t))
                        return refuse(reterr, d, i, NULL, "has a title that is not a safe relative path");
                for (size_t k = 0; k < p->n; k++)
                        if (streq(p->layers[k].title, t))
                                return refuse(reterr, d, i, t, "has the title of an earlier layer");

                *l = (PullLayer){ .d = d, .title = t };
                if (tree) {
                        rest = startswith(t, SYSUPDATE "/");
                        if (!rest || !name_is_plain(rest, strlen(rest)))
                                return refuse(
                                        reterr,
                                        d,
                                        i,
                                        t,
                                        "is a directory, and only sysupdate/<component> may be one");
                        if (!streq(d->media_type, OCI_MEDIA_TYPE_LAYER_TAR_GZIP) &&
                            !streq(d->media_type, "application/vnd.docker.image.rootfs.diff.tar.gzip"))
                                return refuse(reterr, d, i, t, "is to be unpacked, but is not tar+gzip");
                        l->tar_digest = oci_descriptor_annotation(d, OCI_ANNOTATION_TAR_DIGEST);
                        if (l->tar_digest && !oci_digest_is_valid(l->tar_digest))
                                return refuse(
                                        reterr,
                                        d,
                                        i,
                                        t,
                                        "has an io.deis.oras.content.digest that is not a sha256 digest");
                        l->kind = LAYER_TREE;
                } else {
                        rest = startswith(t, p->image);
                        if (rest && streq(rest, ".efi"))
                                l->kind = LAYER_UKI;
                        else if (rest && streq(rest, ".raw"))
                                l->kind = LAYER_DISK;
                        else if (streq(t, POLICY_FILE) || (rest && streq(rest, ".policy.json")))
                                l->kind = LAYER_POLICY;
                        else if (streq(t, BUILD_MANIFEST_FILE) || (rest && streq(rest, ".manifest.json")))
                                l->kind = LAYER_MANIFEST;
                        else if (rest && streq(rest, ".layout.json"))
                                l->kind = LAYER_LAYOUT;
                        else
                                return refuse(
                                        reterr,
                                        d,
                                        i,
                                        t,
                                        "is not a file of an image (<id>_<version>.efi, .raw, .layout.json, "
                                        "policy.json, manifest.json)");
                        if (IN_SET(l->kind, LAYER_POLICY, LAYER_MANIFEST, LAYER_LAYOUT) &&
                            d->size > SMALL_FILE_MAX)
                                return refuse(reterr, d, i, t, "is larger than 1 MiB");
                }
                for (size_t k = 0; k < p->n; k++)
                        if (l->kind != LAYER_TREE && p->layers[k].kind == l->kind)
                                return refuse(reterr, d, i, t, "is the second of its kind");
                p->size += d->size;
                p->n++;
        }
        for (size_t k = 0; k < p->n; k++)
                if (p->layers[k].kind == LAYER_DISK)
                        return 0;
        return api_error_set(
                reterr,
                -EINVAL,
                API_ERROR_INTERNAL,
                "the artifact has %s.efi but no %s.raw: it is not a VM image; nothing was written",
                p->image,
                p->image);
}

/* Sinks of the layers being fetched. */
typedef struct FileSink {
        int fd;
        uint64_t offset;
} FileSink;

static int file_sink(const void *p, size_t n, void *userdata, ApiError *reterr) {
        FileSink *s = userdata;
        int r = oci_sparse_write(s->fd, p, n, &s->offset);

        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot write: %m");
        return 0;
}

/* A tree layer downloads into an unnamed file while its tar is gunzipped for the tar digest; only
 * once the blob's digest held is it unpacked (by libarchive, from that file). */
typedef struct TreeSink {
        FileSink file;
        OciGunzip *gz;
        OciDigester tar_digest;
} TreeSink;

static void tree_sink_done(TreeSink *s) {
        s->file.fd = safe_close(s->file.fd);
        s->gz = oci_gunzip_free(s->gz);
        oci_digester_done(&s->tar_digest);
}

static int tar_sink(const void *p, size_t n, void *userdata, ApiError *reterr) {
        TreeSink *s = userdata;
        return oci_digester_update(&s->tar_digest, p, n);
}

static int gz_sink(const void *p, size_t n, void *userdata, ApiError *reterr) {
        TreeSink *s = userdata;
        int r = file_sink(p, n, &s->file, reterr);
        return r < 0 ? r : oci_gunzip_feed(s->gz, p, n, reterr);
}

static int fetch_layer(OciClient *c, int stagefd, PullLayer *l, uint64_t *tree_budget, ApiError *reterr) {
        int r;

        if (l->kind != LAYER_TREE) {
                _cleanup_close_ int fd = -EBADF;
                FileSink s;

                fd = openat(stagefd, l->title, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
                if (fd < 0)
                        return api_error_set(
                                reterr, -errno, API_ERROR_INTERNAL, "cannot create %s: %m", l->title);
                s = (FileSink){ .fd = fd };
                r = oci_client_blob_fetch(c, l->d, l->title, file_sink, &s, reterr);
                if (r < 0)
                        return r;
                if (ftruncate(fd, (off_t) l->d->size) < 0 || fchmod(fd, 0644) < 0)
                        return api_error_set(
                                reterr, -errno, API_ERROR_INTERNAL, "cannot write %s: %m", l->title);
                return 0;
        }

        _cleanup_(tree_sink_done) TreeSink s = { .file.fd = -EBADF };
        char got[OCI_DIGEST_SHA256_LEN + 1];
        OciTarExtract x;

        s.file.fd = openat(stagefd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (s.file.fd < 0)
                return api_error_set(
                        reterr, -errno, API_ERROR_INTERNAL, "cannot create a file for %s: %m", l->title);
        if ((r = oci_digester_init(&s.tar_digest)) < 0 || (r = oci_gunzip_new(&s.gz, tar_sink, &s)) < 0)
                return r;
        r = oci_client_blob_fetch(c, l->d, l->title, gz_sink, &s, reterr);
        if (r >= 0)
                r = oci_gunzip_finish(s.gz, reterr);
        if (r >= 0)
                r = oci_digester_final(&s.tar_digest, got);
        if (r >= 0 && l->tar_digest && !streq(got, l->tar_digest))
                r = api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "the unpacked tar hashes to %s, not to the %s its io.deis.oras.content.digest says",
                        got,
                        l->tar_digest);
        /* the file was written sparse: its trailing zeros, if any, are made by the truncate */
        if (r >= 0 && (ftruncate(s.file.fd, (off_t) s.file.offset) < 0 || lseek(s.file.fd, 0, SEEK_SET) < 0))
                r = api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot read back %s: %m", l->title);
        oci_tar_extract_init(&x, stagefd, l->title, *tree_budget);
        if (r >= 0)
                r = oci_tar_extract(&x, s.file.fd, /* gzip= */ true, oci_gunzip_total_out(s.gz), reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "layer %s (%s)", l->title, l->d->digest);
                return r;
        }
        *tree_budget -= x.bytes;
        return 0;
}

/* Picks where a companion file (policy or build manifest) goes: "<image>.<suffix>" when the directory
 * has one, else the shared name when it is free or belongs to this image, else "<image>.<suffix>",
 * so that another image's file is never replaced. */
static int companion_dest(
        int dirfd, const char *image, const char *shared, bool (*is_for)(json_t *, const char *), char **ret) {
        _cleanup_free_ char *own = NULL;
        json_auto_t *v = NULL;

        if (asprintf(&own, "%s.%s", image, shared) < 0)
                return -ENOMEM;
        if (!exists_at(dirfd, own) &&
            (!exists_at(dirfd, shared) || (read_json_at(dirfd, shared, &v) >= 0 && is_for(v, image)))) {
                *ret = strdup(shared);
                return *ret ? 0 : -ENOMEM;
        }
        *ret = TAKE_PTR(own);
        return 0;
}

static bool has_golden(json_t *p) {
        json_t *g = json_object_get(p, "golden");
        return json_is_object(g) && json_object_size(g) > 0;
}

/* Checks the fetched policy, and under --policy keep carries the golden values of the local one into
 * it when it has none. */
static int prepare_policy(
        int dirfd,
        int stagefd,
        PullLayer *l,
        const char *image,
        OciPolicyMode mode,
        bool *ret_kept,
        ApiError *reterr) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(attest_policy_freep) AttestPolicy *ap = NULL;
        json_auto_t *pol = NULL, *local = NULL;
        int r;

        *ret_kept = false;
        r = read_json_at(stagefd, l->title, &pol);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "the artifact's %s is not a JSON object", l->title);
        if (!policy_is_for(pol, image))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the artifact's %s names another image (image_id/image_version) than %s",
                        l->title,
                        image);
        if (attest_policy_from_json(pol, &ap, &e) < 0)
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "the artifact's %s is not a valid policy: %s",
                        l->title,
                        e.message ?: "?");
        ap = attest_policy_free(ap);

        r = companion_dest(dirfd, image, POLICY_FILE, policy_is_for, &l->dest);
        if (r < 0)
                return r;
        if (mode == OCI_POLICY_KEEP && !has_golden(pol) && read_json_at(dirfd, l->dest, &local) >= 0 &&
            policy_is_for(local, image) && has_golden(local)) {
                _cleanup_free_ char *text = NULL, *path = NULL;
                json_t *fw = json_object_get(local, "golden_firmware");

                if (json_object_set(pol, "golden", json_object_get(local, "golden")) < 0 ||
                    (fw && json_object_set(pol, "golden_firmware", fw) < 0))
                        return -ENOMEM;
                if (attest_policy_from_json(pol, &ap, &e) < 0)
                        return api_error_set(
                                reterr,
                                -EINVAL,
                                API_ERROR_INTERNAL,
                                "the local golden values do not fit the artifact's policy (%s); pull with "
                                "--policy replace",
                                e.message ?: "?");
                text = json_dumps(pol, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                if (!text || asprintf(&path, "%s\n", text) < 0)
                        return -ENOMEM;
                (void) unlinkat(stagefd, l->title, 0);
                {
                        _cleanup_close_ int fd = openat(
                                stagefd, l->title, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
                        if (fd < 0 || (r = loop_write(fd, path, strlen(path))) < 0)
                                return api_error_set(
                                        reterr,
                                        fd < 0 ? -errno : r,
                                        API_ERROR_INTERNAL,
                                        "cannot write the policy: %m");
                }
                *ret_kept = true;
        }
        return 0;
}

/* ---- the install ---- */

typedef enum UndoKind {
        UNDO_RENAME,   /* rename to back to from */
        UNDO_EXCHANGE, /* exchange from and to again */
        UNDO_RMDIR,    /* remove the directory to */
} UndoKind;

typedef struct Undo {
        UndoKind kind;
        int fromfd, tofd;
        char *from, *to;
} Undo;

typedef struct Journal {
        Undo steps[OCI_LAYERS_MAX * 2 + 4];
        size_t n;
} Journal;

static int journal_add(Journal *j, UndoKind kind, int fromfd, const char *from, int tofd, const char *to) {
        Undo *u;

        assert(j->n < ELEMENTSOF(j->steps));
        u = &j->steps[j->n];
        *u = (Undo){ .kind = kind, .fromfd = fromfd, .tofd = tofd };
        u->from = from ? strdup(from) : NULL;
        u->to = strdup(to);
        if ((from && !u->from) || !u->to) {
                free(u->from);
                free(u->to);
                return -ENOMEM;
        }
        j->n++;
        return 0;
}

static void journal_done(Journal *j) {
        for (size_t i = 0; i < j->n; i++) {
                free(j->steps[i].from);
                free(j->steps[i].to);
        }
        j->n = 0;
}

/* Undoes every step, last first. Returns the first error (the directory may then be mixed). */
static int journal_rollback(Journal *j) {
        int ret = 0;

        while (j->n > 0) {
                Undo *u = &j->steps[--j->n];
                int r = 0;

                switch (u->kind) {
                case UNDO_RENAME:
                        r = RET_NERRNO(renameat(u->tofd, u->to, u->fromfd, u->from));
                        break;
                case UNDO_EXCHANGE:
                        r = RET_NERRNO(renameat2(u->fromfd, u->from, u->tofd, u->to, RENAME_EXCHANGE));
                        break;
                case UNDO_RMDIR:
                        r = RET_NERRNO(unlinkat(u->tofd, u->to, AT_REMOVEDIR));
                        break;
                }
                if (r < 0 && ret == 0)
                        ret = r;
                free(u->from);
                free(u->to);
        }
        return ret;
}

/* Moves stagefd/name to dirfd/dest: an atomic exchange when dest exists (the old one lands in the
 * stage), a rename otherwise. Where the file system has no exchange, the old one is moved aside
 * first. */
static int install_one(Journal *j, int stagefd, const char *name, int dirfd, const char *dest, const char *aside) {
        int r;

        if (exists_at(dirfd, dest)) {
                if (renameat2(stagefd, name, dirfd, dest, RENAME_EXCHANGE) >= 0)
                        return journal_add(j, UNDO_EXCHANGE, stagefd, name, dirfd, dest);
                if (errno != EINVAL && errno != ENOSYS)
                        return -errno;
                if (renameat(dirfd, dest, stagefd, aside) < 0)
                        return -errno;
                r = journal_add(j, UNDO_RENAME, dirfd, dest, stagefd, aside);
                if (r < 0)
                        return r;
        }
        if (renameat(stagefd, name, dirfd, dest) < 0)
                return -errno;
        return journal_add(j, UNDO_RENAME, stagefd, name, dirfd, dest);
}

int oci_image_install(
        int dirfd, int stagefd, const char *image, const OciStaged *items, size_t n, ApiError *reterr) {
        _cleanup_(journal_done) Journal j = {};
        _cleanup_close_ int sysfd = -EBADF, stagesysfd = -EBADF;
        _cleanup_free_ char *uki = NULL, *hidden = NULL;
        const char *failed = NULL;
        bool leaving = false; /* failed names what was to leave the directory */
        int r = 0;

        assert_return(image && (items || n == 0), -EINVAL);

        if (asprintf(&uki, "%s.efi", image) < 0 || asprintf(&hidden, ".old.%s.efi", image) < 0)
                return -ENOMEM;

        /* 1: the image leaves the catalog's view, if it is there */
        if (exists_at(dirfd, uki)) {
                if (renameat(dirfd, uki, stagefd, hidden) < 0) {
                        failed = uki;
                        r = -errno;
                        goto fail;
                }
                r = journal_add(&j, UNDO_RENAME, dirfd, uki, stagefd, hidden);
                if (r < 0)
                        goto fail;
        }

        /* 2: the trees */
        for (size_t i = 0; i < n; i++) {
                _cleanup_free_ char *aside = NULL;
                const char *component;

                if (items[i].kind != OCI_STAGED_TREE)
                        continue;
                component = startswith(items[i].name, SYSUPDATE "/");
                if (!component)
                        return -EINVAL;
                if (sysfd < 0) {
                        if (mkdirat(dirfd, SYSUPDATE, 0755) >= 0) {
                                r = journal_add(&j, UNDO_RMDIR, -EBADF, NULL, dirfd, SYSUPDATE);
                                if (r < 0)
                                        goto fail;
                        } else if (errno != EEXIST) {
                                failed = SYSUPDATE;
                                r = -errno;
                                goto fail;
                        }
                        sysfd = openat(dirfd, SYSUPDATE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        stagesysfd = openat(
                                stagefd, SYSUPDATE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sysfd < 0 || stagesysfd < 0) {
                                failed = SYSUPDATE;
                                r = -errno;
                                goto fail;
                        }
                }
                if (asprintf(&aside, ".old.%s", component) < 0) {
                        r = -ENOMEM;
                        goto fail;
                }
                r = install_one(&j, stagesysfd, component, sysfd, component, aside);
                if (r < 0) {
                        failed = items[i].name;
                        goto fail;
                }
        }

        /* 3: the disk, the policy, the layout, the build manifest */
        for (size_t i = 0; i < n; i++) {
                _cleanup_free_ char *aside = NULL;

                if (items[i].kind != OCI_STAGED_FILE)
                        continue;
                if (asprintf(&aside, ".old.%s", items[i].dest) < 0) {
                        r = -ENOMEM;
                        goto fail;
                }
                r = install_one(&j, stagefd, items[i].name, dirfd, items[i].dest, aside);
                if (r < 0) {
                        failed = items[i].dest;
                        goto fail;
                }
        }

        /* 3b: what the old image had and the new one has not (a layout file) goes into the stage, so
         * that it cannot be taken for the new image's, and comes back if a later step fails */
        for (size_t i = 0; i < n; i++) {
                _cleanup_free_ char *aside = NULL;
                struct stat st;

                if (items[i].kind != OCI_STAGED_GONE)
                        continue;
                if (fstatat(dirfd, items[i].dest, &st, AT_SYMLINK_NOFOLLOW) < 0 || S_ISDIR(st.st_mode))
                        continue;
                if (asprintf(&aside, ".gone.%s", items[i].dest) < 0) {
                        r = -ENOMEM;
                        goto fail;
                }
                if (renameat(dirfd, items[i].dest, stagefd, aside) < 0) {
                        failed = items[i].dest;
                        leaving = true;
                        r = -errno;
                        goto fail;
                }
                r = journal_add(&j, UNDO_RENAME, dirfd, items[i].dest, stagefd, aside);
                if (r < 0)
                        goto fail;
        }

        /* 4: the UKI, and with it the image, appears */
        if (renameat(stagefd, uki, dirfd, uki) < 0) {
                failed = uki;
                r = -errno;
                goto fail;
        }
        if (fsync(dirfd) < 0 || (sysfd >= 0 && fsync(sysfd) < 0))
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot sync the image directory: %m");
        return 0;

fail : {
        int k = journal_rollback(&j);
        if (k < 0)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "cannot move %s %s (%s), and putting back what was there failed too (%s): "
                        "check the directory",
                        failed ?: "a file",
                        leaving ? "out of the way" : "into place",
                        strerror(-r),
                        strerror(-k));
        return api_error_set(
                reterr,
                r,
                API_ERROR_INTERNAL,
                "cannot move %s %s (%s); the directory is as it was",
                failed ?: "a file",
                leaving ? "out of the way" : "into place",
                strerror(-r));
}
}

/* ---- records ---- */

static int record_write(
        const char *image_dir, const OciRef *ref, const char *digest, const char *manifest_digest, const Plan *p) {
        _cleanup_free_ char *name = NULL, *text = NULL, *refs = oci_ref_to_string(ref);
        _cleanup_free_ char *path = NULL;
        json_auto_t *files = json_object(), *rec = NULL;

        if (!refs || !files || asprintf(&name, ".%s" RECORD_SUFFIX, p->image) < 0)
                return -ENOMEM;
        for (size_t i = 0; i < p->n; i++)
                if ((p->layers[i].kind == LAYER_UKI || p->layers[i].kind == LAYER_DISK) &&
                    json_object_set_new(
                            files,
                            p->layers[i].dest ?: p->layers[i].title,
                            json_integer((json_int_t) p->layers[i].d->size)) < 0)
                        return -ENOMEM;
        rec = json_pack(
                "{s:s, s:s, s:s, s:s, s:O}",
                "reference",
                refs,
                "digest",
                digest,
                "manifest",
                manifest_digest,
                "image",
                p->image,
                "files",
                files);
        if (!rec)
                return -ENOMEM;
        text = json_dumps(rec, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (!text)
                return -ENOMEM;
        if (asprintf(&path, "%s/%s", image_dir, name) < 0)
                return -ENOMEM;
        return write_file_atomic(path, text, strlen(text), 0644);
}

/* Whether a record shows digest installed: its files are there, with their sizes. Returns 1 with
 * the image's name. */
static int record_find(int dirfd, const char *digest, char **ret_image) {
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;

        d = oci_opendir_fd(dirfd);
        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                json_auto_t *rec = NULL;
                const char *name, *image;
                json_t *size, *files;
                bool ok = true;

                if (de->d_name[0] != '.' || !has_suffix(de->d_name, RECORD_SUFFIX))
                        continue;
                if (read_json_at(dirfd, de->d_name, &rec) < 0)
                        continue;
                image = json_string_value(json_object_get(rec, "image"));
                files = json_object_get(rec, "files");
                if (!image || !json_is_object(files) || json_object_size(files) < 2 ||
                    !json_is_string(json_object_get(rec, "digest")) ||
                    !streq(json_string_value(json_object_get(rec, "digest")), digest))
                        continue;
                json_object_foreach(files, name, size) {
                        struct stat st;
                        if (!json_is_integer(size) || fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
                            !S_ISREG(st.st_mode) || st.st_size != json_integer_value(size))
                                ok = false;
                }
                if (!ok)
                        continue;
                *ret_image = strdup(image);
                return *ret_image ? 1 : -ENOMEM;
        }
        return 0;
}

/* Removes what a pull killed on its way left behind (the directory's lock is ours). */
static void remove_stale_stages(int dirfd, const char *image_dir) {
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;

        d = oci_opendir_fd(dirfd);
        if (!d)
                return;
        while ((de = readdir(d)))
                if (startswith(de->d_name, STAGE_PREFIX)) {
                        _cleanup_free_ char *path = NULL;
                        if (asprintf(&path, "%s/%s", image_dir, de->d_name) >= 0)
                                (void) rm_rf(path);
                }
}

/* Makes image_dir if need be, opens it and takes its lock: one pull at a time per directory. */
static int pull_lock_dir(const char *image_dir, bool *ret_created, int *ret_dirfd, ApiError *reterr) {
        _cleanup_close_ int dirfd = -EBADF;
        bool created = false;
        int r;

        if (access(image_dir, F_OK) < 0) {
                r = mkdir_p(image_dir, 0755);
                if (r < 0)
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, "cannot create %s: %m", image_dir);
                created = true;
        }
        dirfd = open(image_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0)
                return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot open %s: %m", image_dir);
        if (flock(dirfd, LOCK_EX | LOCK_NB) < 0)
                return api_error_set(
                        reterr,
                        errno == EWOULDBLOCK ? -EBUSY : -errno,
                        API_ERROR_CONFLICT,
                        "another pull into %s is running",
                        image_dir);
        remove_stale_stages(dirfd, image_dir);
        *ret_created = created;
        *ret_dirfd = TAKE_FD(dirfd);
        return 0;
}

/* An index fetched in *data: replaced by the manifest it points at for our artifact type, whose
 * digest goes to *ret_digest. */
static int pull_follow_index(OciClient *c, char **data, size_t *size, char **ret_digest, ApiError *reterr) {
        _cleanup_(oci_index_freep) OciIndex *idx = NULL;
        _cleanup_free_ char *d2 = NULL, *ct2 = NULL, *digest = NULL;
        const OciDescriptor *pick;
        OciDocumentKind kind;
        size_t s2 = 0;
        int r;

        r = oci_index_parse(*data, *size, &idx, reterr);
        if (r < 0)
                return r;
        r = oci_index_select(idx, OCI_IMAGE_ARTIFACT_TYPE, &pick, reterr);
        if (r < 0)
                return r;
        r = oci_client_manifest_get(c, pick->digest, &d2, &s2, &ct2, &digest, reterr);
        if (r < 0)
                return r;
        r = oci_document_kind(d2, s2, ct2, &kind, reterr);
        if (r < 0)
                return r;
        if (kind != OCI_DOCUMENT_MANIFEST)
                return api_error_set(
                        reterr,
                        -EMEDIUMTYPE,
                        API_ERROR_INTERNAL,
                        "the index points at another index: not followed");
        free(*data);
        *data = TAKE_PTR(d2);
        *size = s2;
        *ret_digest = TAKE_PTR(digest);
        return 0;
}

/* What the reference names now, in *top (the digest of the index or manifest it points at). Returns
 * 1 with *ret_found when a record shows it installed, so that nothing more is fetched; 0 with the
 * image's manifest otherwise. */
static int pull_resolve(
        OciClient *c,
        const OciRef *ref,
        int dirfd,
        char **top,
        char **ret_found,
        OciManifest **ret_manifest,
        char **ret_manifest_digest,
        ApiError *reterr) {

        _cleanup_free_ char *data = NULL, *ctype = NULL, *mdigest = NULL;
        OciDocumentKind kind;
        size_t size = 0;
        int r;

        if (ref->digest) {
                *top = strdup(ref->digest);
                if (!*top)
                        return -ENOMEM;
        } else if (oci_client_manifest_head(c, ref->tag, top, /* reterr= */ NULL) < 0)
                /* a HEAD has no body to explain a failure: the GET below says what is wrong */
                *top = NULL;
        if (*top && (r = record_find(dirfd, *top, ret_found)) > 0)
                return 1;

        r = oci_client_manifest_get(c, *top ?: ref->tag, &data, &size, &ctype, &mdigest, reterr);
        if (r < 0)
                return r;
        if (!*top) {
                *top = TAKE_PTR(mdigest);
                if ((r = record_find(dirfd, *top, ret_found)) > 0)
                        return 1;
        }
        mdigest = mfree(mdigest);
        r = oci_document_kind(data, size, ctype, &kind, reterr);
        if (r < 0)
                return r;
        if (kind == OCI_DOCUMENT_INDEX)
                r = pull_follow_index(c, &data, &size, &mdigest, reterr);
        else
                r = (mdigest = strdup(*top)) ? 0 : -ENOMEM;
        if (r < 0)
                return r;
        r = oci_manifest_parse(data, size, ret_manifest, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "manifest %s", mdigest);
                return r;
        }
        *ret_manifest_digest = TAKE_PTR(mdigest);
        return 0;
}

/* A staging directory beside the target, on its file system, once there is room for the plan. */
static int pull_make_stage(
        int dirfd, const char *image_dir, const Plan *plan, char **ret_stage, int *ret_stagefd, ApiError *reterr) {

        _cleanup_free_ char *stage = NULL;
        _cleanup_close_ int stagefd = -EBADF;
        struct statvfs sv;
        int r;

        if (fstatvfs(dirfd, &sv) >= 0 && (uint64_t) sv.f_bavail * sv.f_frsize < plan->size)
                return api_error_set(
                        reterr,
                        -ENOSPC,
                        API_ERROR_INTERNAL,
                        "the image needs at least %" PRIu64 " bytes in %s, and only %" PRIu64 " are free",
                        plan->size,
                        image_dir,
                        (uint64_t) sv.f_bavail * sv.f_frsize);

        if (asprintf(&stage, "%s/" STAGE_PREFIX "XXXXXX", image_dir) < 0) {
                stage = NULL;
                return -ENOMEM;
        }
        if (!mkdtemp(stage))
                return api_error_set(
                        reterr,
                        -errno,
                        API_ERROR_INTERNAL,
                        "cannot create a staging directory in %s: %m",
                        image_dir);
        stagefd = open(stage, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (stagefd < 0) {
                r = -errno;
                (void) rm_rf(stage);
                return r;
        }
        *ret_stage = TAKE_PTR(stage);
        *ret_stagefd = TAKE_FD(stagefd);
        return 0;
}

/* Where each fetched layer goes in image_dir; the policy's name goes to *ret_policy_dest. */
static int pull_destinations(
        int dirfd,
        int stagefd,
        Plan *plan,
        const OciPullOptions *o,
        bool *ret_kept,
        char **ret_policy_dest,
        ApiError *reterr) {

        int r = 0;

        for (size_t i = 0; i < plan->n; i++) {
                PullLayer *l = &plan->layers[i];

                if (l->kind == LAYER_POLICY) {
                        r = prepare_policy(dirfd, stagefd, l, plan->image, o->policy, ret_kept, reterr);
                        if (r < 0)
                                return r;
                        free(*ret_policy_dest);
                        *ret_policy_dest = strdup(l->dest);
                        if (!*ret_policy_dest)
                                return -ENOMEM;
                } else if (l->kind == LAYER_MANIFEST)
                        r = companion_dest(
                                dirfd, plan->image, BUILD_MANIFEST_FILE, build_manifest_is_for, &l->dest);
                else if (l->kind != LAYER_TREE)
                        r = (l->dest = strdup(l->title)) ? 0 : -ENOMEM;
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Moves the staged layers into place; the UKI is installed by oci_image_install() itself. */
static int pull_install(int dirfd, int stagefd, const Plan *plan, ApiError *reterr) {
        _cleanup_free_ char *layout = NULL;
        OciStaged items[OCI_LAYERS_MAX + 1];
        bool has_layout = false;
        size_t k = 0;

        for (size_t i = 0; i < plan->n; i++) {
                if (plan->layers[i].kind == LAYER_LAYOUT)
                        has_layout = true;
                if (plan->layers[i].kind != LAYER_UKI)
                        items[k++] = (OciStaged){
                                .kind = plan->layers[i].kind == LAYER_TREE ? OCI_STAGED_TREE : OCI_STAGED_FILE,
                                .name = plan->layers[i].title,
                                .dest = plan->layers[i].dest,
                        };
        }
        /* a layout of an earlier build would lay the new disk out by the old one's partitions */
        if (!has_layout) {
                if (asprintf(&layout, "%s.layout.json", plan->image) < 0) {
                        layout = NULL;
                        return -ENOMEM;
                }
                items[k++] = (OciStaged){ .kind = OCI_STAGED_GONE, .dest = layout };
        }
        return oci_image_install(dirfd, stagefd, plan->image, items, k, reterr);
}

int oci_image_pull(
        OciClient *c,
        const OciRef *ref,
        const char *image_dir,
        const OciPullOptions *o,
        OciPullResult *ret,
        ApiError *reterr) {
        _cleanup_free_ char *top = NULL, *mdigest = NULL, *stage = NULL, *found = NULL, *policy_dest = NULL;
        _cleanup_(oci_manifest_freep) OciManifest *m = NULL;
        _cleanup_(plan_done) Plan plan = {};
        _cleanup_close_ int dirfd = -EBADF, stagefd = -EBADF;
        uint64_t budget;
        bool created = false, kept = false;
        int r;

        assert_return(c && ref && image_dir && o && ret, -EINVAL);

        budget = o->tree_bytes_max ?: TREE_BYTES_MAX_DEFAULT;
        r = pull_lock_dir(image_dir, &created, &dirfd, reterr);
        if (r < 0)
                return r;

        r = pull_resolve(c, ref, dirfd, &top, &found, &m, &mdigest, reterr);
        if (r < 0)
                goto fail;
        if (r > 0) {
                *ret = (OciPullResult){ .up_to_date = true };
                ret->image = TAKE_PTR(found);
                ret->digest = TAKE_PTR(top);
                return 0;
        }
        r = plan_layers(m, &plan, reterr);
        if (r < 0)
                goto fail;

        r = pull_make_stage(dirfd, image_dir, &plan, &stage, &stagefd, reterr);
        if (r < 0)
                goto fail;
        for (size_t i = 0; i < plan.n; i++) {
                r = fetch_layer(c, stagefd, &plan.layers[i], &budget, reterr);
                if (r < 0)
                        goto fail;
        }
        r = pull_destinations(dirfd, stagefd, &plan, o, &kept, &policy_dest, reterr);
        if (r < 0)
                goto fail;
        if (syncfs(stagefd) < 0) {
                r = api_error_set(reterr, -errno, API_ERROR_INTERNAL, "cannot sync %s: %m", image_dir);
                goto fail;
        }
        r = pull_install(dirfd, stagefd, &plan, reterr);
        if (r < 0)
                goto fail;
        /* a failed record loses only the next pull's shortcut: the image is in */
        (void) record_write(image_dir, ref, top, mdigest, &plan);
        (void) rm_rf(stage);

        *ret = (OciPullResult){ .kept_golden = kept, .n_layers = plan.n, .size = plan.size };
        ret->image = TAKE_PTR(plan.image);
        ret->digest = TAKE_PTR(top);
        ret->policy_file = TAKE_PTR(policy_dest);
        return 0;

fail:
        if (stage)
                (void) rm_rf(stage);
        if (created)
                (void) rmdir(image_dir);
        return r;
}
