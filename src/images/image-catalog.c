/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "image-catalog.h"
#include "log.h"
#include "time-util.h"

#define UKI_SUFFIX ".efi"
#define DISK_SUFFIX ".raw"
#define POLICY_SUFFIX ".policy.json"
#define LAYOUT_SUFFIX ".layout.json"
#define POLICY_FILE "policy.json"
#define MANIFEST_FILE "manifest.json"
#define SYSUPDATE_DIR "sysupdate"
#define KUBERNETES_DIR SYSUPDATE_DIR "/kubernetes"
#define KUBERNETES_SUMS KUBERNETES_DIR "/SHA256SUMS"
#define KUBERNETES_PREFIX "kubernetes_"

#define WATCH_MASK (IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_CLOSE_WRITE | IN_ATTRIB)
#define WATCH_SELF_MASK (IN_DELETE_SELF | IN_MOVE_SELF)

/* A rescan runs this long after the last change in a burst, and at the latest this long after its
 * first change, so a steady trickle of events cannot postpone it forever. */
#define RESCAN_SETTLE_USEC (200 * USEC_PER_MSEC)
#define RESCAN_MAX_DELAY_USEC (2 * USEC_PER_SEC)

/* What one scan of the directory found. */
typedef struct ScanResult {
        Image **images; /* each a reference of the catalog's */
        size_t n_images;
        char **kubernetes_versions;  /* NULL when none: the versions a VM may ask for */
        json_t *kubernetes_unusable; /* [{version, reason}] of SHA256SUMS that cannot run a node, or NULL */
        bool has_sysupdate;
} ScanResult;

struct ImageCatalog {
        char *dir;
        char *sysupdate_dir;
        ScanResult current;

        sd_event *event;
        sd_event_source *inotify_source;
        sd_event_source *rescan_source;
        int inotify_fd;
        int wd_dir;        /* the image directory's own watch, -1 while it is missing */
        int wd_sysupdate;  /* -1 when not watched */
        int wd_kubernetes; /* -1 when not watched */
        bool rescan_pending;
        usec_t pending_since;

        ImageCatalogChangeFunc change_cb;
        void *change_userdata;
};

static void image_done(Image *i) {
        if (!i)
                return;
        free(i->id);
        free(i->version);
        free(i->ref);
        free(i->uki);
        free(i->disk);
        free(i->layout);
        json_decref(i->policy);
        *i = (Image){};
}

Image *image_ref(Image *i) {
        if (i) {
                assert(i->n_ref > 0);
                i->n_ref++;
        }
        return i;
}

Image *image_unref(Image *i) {
        if (!i)
                return NULL;
        assert(i->n_ref > 0);
        if (--i->n_ref > 0)
                return NULL;
        image_done(i);
        free(i);
        return NULL;
}

static void scan_result_done(ScanResult *s) {
        for (size_t i = 0; i < s->n_images; i++)
                image_unref(s->images[i]);
        free(s->images);
        strv_free(s->kubernetes_versions);
        json_decref(s->kubernetes_unusable);
        *s = (ScanResult){};
}

static bool endswith(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);

        return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. Names end up in JSON, which
 * jansson refuses to build from anything else. */
static bool utf8_is_valid(const char *s, size_t n) {
        const unsigned char *p = (const unsigned char *) s, *e = p + n;

        while (p < e) {
                unsigned char c = *p;

                if (c == 0)
                        return false;
                if (c < 0x80) {
                        p++;
                        continue;
                }

                /* The lead byte gives the length of the sequence and the top bits of the code point. */
                static const uint32_t min[] = { [2] = 0x80, [3] = 0x800, [4] = 0x10000 };
                size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
                if (len == 0)
                        return false;
                uint32_t cp = c & (0x7fU >> len);

                if ((size_t) (e - p) < len)
                        return false;
                for (size_t k = 1; k < len; k++) {
                        if ((p[k] & 0xc0) != 0x80)
                                return false;
                        cp = (cp << 6) | (p[k] & 0x3f);
                }
                if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                        return false;
                p += len;
        }
        return true;
}

/* Makes p absolute against the working directory and lexically clean, as Go's filepath.Clean does:
 * no empty, "." or ".." components and no trailing slash. Symlinks are left as they are. */
static int path_make_absolute_clean(const char *p, char **ret) {
        _cleanup_free_ char *cwd = NULL, *joined = NULL, *out = NULL;
        size_t len = 0;

        assert(p);
        assert(ret);

        if (p[0] != '/') {
                cwd = getcwd(NULL, 0);
                if (!cwd)
                        return -errno;
                if (asprintf(&joined, "%s/%s", cwd, p) < 0)
                        return -ENOMEM;
                p = joined;
        }

        /* Every component written is preceded by one slash that was in the input, so the output is never
         * longer than the input, plus the lone "/" of the root. */
        out = malloc(strlen(p) + 2);
        if (!out)
                return -ENOMEM;

        for (const char *s = p;;) {
                s += strspn(s, "/");
                size_t k = strcspn(s, "/");
                if (k == 0)
                        break;
                if (k == 2 && strneq(s, "..", 2)) {
                        while (len > 0 && out[len - 1] != '/')
                                len--;
                        if (len > 0)
                                len--;
                } else if (!(k == 1 && s[0] == '.')) {
                        out[len++] = '/';
                        memcpy(out + len, s, k);
                        len += k;
                }
                s += k;
        }
        if (len == 0)
                out[len++] = '/';
        out[len] = 0;

        *ret = TAKE_PTR(out);
        return 0;
}

static char *path_join(const char *dir, const char *name) {
        char *p;

        if (asprintf(&p, "%s%s%s", dir, endswith(dir, "/") ? "" : "/", name) < 0)
                return NULL;
        return p;
}

/* Compares the decimal digit strings a and b (either may be empty, meaning 0) by value, whatever their
 * length. */
static int digits_compare(const char *a, size_t an, const char *b, size_t bn) {
        while (an > 0 && *a == '0')
                a++, an--;
        while (bn > 0 && *b == '0')
                b++, bn--;
        if (an != bn)
                return an < bn ? -1 : 1;
        int r = memcmp(a, b, an);
        return (r > 0) - (r < 0);
}

static int bytes_compare(const char *a, size_t an, const char *b, size_t bn) {
        int r = memcmp(a, b, MIN(an, bn));

        if (r != 0)
                return (r > 0) - (r < 0);
        return (an > bn) - (an < bn);
}

static size_t digits_span(const char *s, size_t n) {
        size_t i = 0;

        while (i < n && s[i] >= '0' && s[i] <= '9')
                i++;
        return i;
}

static int component_compare(const char *x, size_t xn, const char *y, size_t yn) {
        size_t xd = digits_span(x, xn), yd = digits_span(y, yn);
        bool xnum = xn > 0 && xd == xn, ynum = yn > 0 && yd == yn;
        int r;

        if (xn == yn && memcmp(x, y, xn) == 0)
                return 0;
        if (xnum && ynum)
                return digits_compare(x, xn, y, yn);
        if (xnum || ynum) {
                /* A pre-release suffix ("0-rc1") sorts below the plain number; a missing component ("")
                 * below anything numeric. */
                r = digits_compare(x, xd, y, yd);
                if (r != 0)
                        return r;
                size_t xs = xn - xd, ys = yn - yd;
                return (xs < ys) - (xs > ys);
        }
        return bytes_compare(x, xn, y, yn);
}

int image_version_compare(const char *a, const char *b) {
        assert(a);
        assert(b);

        for (;;) {
                size_t an = strcspn(a, "."), bn = strcspn(b, ".");
                int r = component_compare(a, an, b, bn);

                if (r != 0)
                        return r;
                a += an;
                b += bn;
                if (*a == 0 && *b == 0)
                        return 0;
                /* A version that ran out of components goes on comparing as "". */
                if (*a == '.')
                        a++;
                if (*b == '.')
                        b++;
        }
}

static int image_compare(const void *x, const void *y) {
        const Image *a = *(Image *const *) x, *b = *(Image *const *) y;
        int r;

        r = strcmp(a->id, b->id);
        if (r != 0)
                return r;
        r = image_version_compare(b->version, a->version);
        if (r != 0)
                return r;
        /* "1.0" and "1.0.0" are equal versions; keep their order stable anyway. */
        return strcmp(a->version, b->version);
}

static int kubernetes_version_compare(const void *x, const void *y) {
        const char *a = *(char *const *) x, *b = *(char *const *) y;
        int r = image_version_compare(b, a);

        return r != 0 ? r : strcmp(a, b);
}

/* Reads a regular file below dirfd, for files the catalog parses: FIFOs and devices are refused before
 * they could block. */
static int read_small_file(
        int dirfd, const char *dir, const char *name, size_t max, char **ret, size_t *ret_size) {
        _cleanup_free_ char *path = NULL;
        struct stat st;

        if (fstatat(dirfd, name, &st, 0) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return S_ISDIR(st.st_mode) ? -EISDIR : -EBADFD;

        path = path_join(dir, name);
        if (!path)
                return -ENOMEM;
        return read_full_file(path, max, ret, ret_size);
}

/* A policy file: a JSON object, or NULL (absent, unreadable or not an object, all the same to the
 * catalog: no policy). */
static json_t *load_policy(int dirfd, const char *dir, const char *name) {
        _cleanup_free_ char *data = NULL;
        json_error_t error;
        size_t size;
        json_t *v;
        int r;

        r = read_small_file(dirfd, dir, name, IMAGE_POLICY_SIZE_MAX, &data, &size);
        if (r < 0) {
                if (r != -ENOENT)
                        log_debug_errno(r, "Cannot read policy '%s/%s', ignoring: %m", dir, name);
                return NULL;
        }

        v = json_loadb(data, size, 0, &error);
        if (!v) {
                log_debug(
                        "Policy '%s/%s' is not valid JSON (line %d: %s), ignoring.",
                        dir,
                        name,
                        error.line,
                        error.text);
                return NULL;
        }
        if (!json_is_object(v)) {
                log_debug("Policy '%s/%s' is not a JSON object, ignoring.", dir, name);
                json_decref(v);
                return NULL;
        }
        return v;
}

/* Whether a policy.json key (image_id, image_version) allows value: absent, null or "" allow any. */
static bool policy_key_matches(json_t *policy, const char *key, const char *value) {
        json_t *v = json_object_get(policy, key);

        if (!v || json_is_null(v))
                return true;
        if (!json_is_string(v))
                return false;
        return json_string_length(v) == 0 || streq(json_string_value(v), value);
}

static bool strv_contains(char **l, size_t n, const char *s) {
        for (size_t i = 0; i < n; i++)
                if (streq(l[i], s))
                        return true;
        return false;
}

static bool is_blank(char c) {
        return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Parses SHA256SUMS: every line with at least two whitespace-separated fields whose last field, with
 * one leading '*' (binary mode) removed, is kubernetes_<v>.raw. Returns the distinct versions, newest
 * first, NULL when there are none. */
static int parse_kubernetes_sums(const char *data, size_t size, char ***ret) {
        _cleanup_strv_free_ char **l = NULL;
        size_t n = 0, alloc = 0;

        for (const char *line = data, *end = data + size; line < end;) {
                const char *eol = memchr(line, '\n', (size_t) (end - line)) ?: end;
                const char *last = NULL;
                size_t fields = 0, last_len = 0;

                for (const char *p = line; p < eol;) {
                        while (p < eol && is_blank(*p))
                                p++;
                        if (p >= eol)
                                break;
                        const char *f = p;
                        while (p < eol && !is_blank(*p))
                                p++;
                        fields++;
                        last = f;
                        last_len = (size_t) (p - f);
                }
                line = eol < end ? eol + 1 : end;

                if (fields < 2)
                        continue;
                if (last_len > 0 && *last == '*') {
                        last++;
                        last_len--;
                }

                size_t pl = strlen(KUBERNETES_PREFIX), sl = strlen(DISK_SUFFIX);
                if (last_len <= pl + sl || !strneq(last, KUBERNETES_PREFIX, pl) ||
                    memcmp(last + last_len - sl, DISK_SUFFIX, sl) != 0)
                        continue;

                const char *v = last + pl;
                size_t vn = last_len - pl - sl;
                if (!utf8_is_valid(v, vn)) {
                        log_debug("Kubernetes version in SHA256SUMS is not valid UTF-8, ignoring.");
                        continue;
                }

                _cleanup_free_ char *s = strndup(v, vn);
                if (!s)
                        return -ENOMEM;
                if (strv_contains(l, n, s))
                        continue;
                if (n + 2 > alloc) {
                        size_t a = MAX(alloc * 2, (size_t) 8);
                        char **nl = reallocarray(l, a, sizeof(char *));
                        if (!nl)
                                return -ENOMEM;
                        l = nl;
                        alloc = a;
                }
                l[n++] = TAKE_PTR(s);
                l[n] = NULL;
        }

        if (n == 0) {
                *ret = NULL;
                return 0;
        }
        qsort(l, n, sizeof(char *), kubernetes_version_compare);
        *ret = TAKE_PTR(l);
        return (int) n;
}

/* Whether dirfd/name is a directory itself, not a symlink to one: the sysupdate tree is served to
 * guests, so it must not lead out of the image directory. */
static bool is_real_dir_at(int dirfd, const char *name) {
        struct stat st;

        return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) >= 0 && S_ISDIR(st.st_mode);
}

static int load_kubernetes_versions(int dirfd, const char *dir, char ***ret) {
        _cleanup_free_ char *data = NULL;
        size_t size;
        int r;

        *ret = NULL;
        if (!is_real_dir_at(dirfd, SYSUPDATE_DIR) || !is_real_dir_at(dirfd, KUBERNETES_DIR))
                return 0;

        r = read_small_file(dirfd, dir, KUBERNETES_SUMS, IMAGE_SUMS_SIZE_MAX, &data, &size);
        if (r == -ENOENT)
                return 0;
        if (r < 0) {
                log_debug_errno(r, "Cannot read '%s/" KUBERNETES_SUMS "', ignoring: %m", dir);
                return 0;
        }
        return parse_kubernetes_sums(data, size, ret);
}

/* The build's manifest.json says what its Kubernetes extension carries ("kubernetes": {"version",
 * "node", "note"}; scripts/build.sh of images/): a version it marks as no node ("node": false, or,
 * from builds before that field, "kubelet" or "kubeadm" false) is set apart with the reason. A version
 * the manifest does not describe (no manifest, another version: the Go prototype's images) stays
 * offered. */
static int split_node_versions(int dirfd, const char *dir, ScanResult *s) {
        _cleanup_free_ char *data = NULL;
        json_auto_t *manifest = NULL;
        _cleanup_strv_free_ char **keep = NULL;
        json_t *k, *node;
        const char *version, *note;
        size_t size, total, n = 0;
        int r;

        if (!s->kubernetes_versions)
                return 0;
        r = read_small_file(dirfd, dir, MANIFEST_FILE, IMAGE_POLICY_SIZE_MAX, &data, &size);
        if (r < 0) {
                if (r != -ENOENT)
                        log_debug_errno(r, "Cannot read '%s/" MANIFEST_FILE "', ignoring: %m", dir);
                return 0;
        }
        manifest = json_loadb(data, size, 0, NULL);
        k = json_object_get(manifest, "kubernetes");
        version = json_string_value(json_object_get(k, "version"));
        if (!version)
                return 0;
        node = json_object_get(k, "node");
        if (node ? json_is_true(node) :
                   !json_is_false(json_object_get(k, "kubelet")) &&
                            !json_is_false(json_object_get(k, "kubeadm")))
                return 0;
        note = json_string_value(json_object_get(k, "note"));

        total = strv_length(s->kubernetes_versions);
        keep = calloc(total + 1, sizeof(char *));
        if (!keep)
                return -ENOMEM;
        for (char **v = s->kubernetes_versions; *v; v++) {
                json_t *entry;

                if (!streq(*v, version)) {
                        keep[n++] = TAKE_PTR(*v);
                        continue;
                }
                if (!s->kubernetes_unusable && !(s->kubernetes_unusable = json_array()))
                        return -ENOMEM;
                /* the reason, then the build's own note, if it gave one */
                entry = json_pack(
                        "{s:s, s:s++}",
                        "version",
                        *v,
                        "reason",
                        "its system extension cannot run a Kubernetes node (no kubelet, kubeadm, crictl or "
                        "container runtime in it)",
                        note ? "; " : "",
                        note ?: "");
                if (!entry || (note && json_object_set_new(entry, "note", json_string(note)) < 0) ||
                    json_array_append_new(s->kubernetes_unusable, entry) < 0)
                        return -ENOMEM;
        }
        /* the versions kept were taken out, leaving holes where strv_free() would stop */
        for (size_t i = 0; i < total; i++)
                free(s->kubernetes_versions[i]);
        free(s->kubernetes_versions);
        s->kubernetes_versions = n > 0 ? TAKE_PTR(keep) : NULL;
        return 0;
}

/* A catalog's reference to what scan_one() found; takes its contents. */
static Image *new_image(Image *found) {
        Image *i = malloc(sizeof(Image));

        if (!i)
                return NULL;
        *i = *found;
        *found = (Image){};
        i->n_ref = 1;
        return i;
}

/* Fills img for the UKI called name (which ends in UKI_SUFFIX). Returns 0 and leaves img empty when the
 * entry is not an image, -ENOMEM on OOM. */
static int scan_one(int dirfd, const char *dir, const char *name, json_t *shared_policy, Image *img) {
        _cleanup_free_ char *stem = NULL, *disk_name = NULL, *policy_name = NULL, *layout_name = NULL;
        _cleanup_(image_done) Image i = {};
        struct stat st;
        char *us;

        stem = strndup(name, strlen(name) - strlen(UKI_SUFFIX));
        if (!stem)
                return -ENOMEM;

        us = strrchr(stem, '_');
        if (!us || us == stem || us[1] == 0) {
                log_debug("Image '%s/%s' is not named <id>_<version>" UKI_SUFFIX ", skipped.", dir, name);
                return 0;
        }
        if (!utf8_is_valid(stem, strlen(stem))) {
                log_debug("Image name in '%s' is not valid UTF-8, skipped.", dir);
                return 0;
        }
        if (fstatat(dirfd, name, &st, 0) < 0 || S_ISDIR(st.st_mode)) {
                log_debug("Image '%s/%s' is not a file, skipped.", dir, name);
                return 0;
        }

        if (asprintf(&disk_name, "%s" DISK_SUFFIX, stem) < 0)
                return -ENOMEM;
        if (fstatat(dirfd, disk_name, &st, 0) < 0 || S_ISDIR(st.st_mode)) {
                log_debug("Image '%s/%s' has no disk next to its UKI, skipped.", dir, name);
                return 0;
        }

        i.ref = strdup(stem);
        i.id = strndup(stem, (size_t) (us - stem));
        i.version = strdup(us + 1);
        i.uki = path_join(dir, name);
        i.disk = path_join(dir, disk_name);
        if (!i.ref || !i.id || !i.version || !i.uki || !i.disk)
                return -ENOMEM;

        /* the disk's layout for a host install: without it the image is boot-only */
        if (asprintf(&layout_name, "%s" LAYOUT_SUFFIX, stem) < 0)
                return -ENOMEM;
        if (fstatat(dirfd, layout_name, &st, 0) >= 0 && S_ISREG(st.st_mode)) {
                i.layout = path_join(dir, layout_name);
                if (!i.layout)
                        return -ENOMEM;
        }

        if (asprintf(&policy_name, "%s" POLICY_SUFFIX, stem) < 0)
                return -ENOMEM;
        i.policy = load_policy(dirfd, dir, policy_name);
        if (!i.policy && shared_policy && policy_key_matches(shared_policy, "image_id", i.id) &&
            policy_key_matches(shared_policy, "image_version", i.version))
                i.policy = json_incref(shared_policy);

        *img = i;
        i = (Image){};
        return 1;
}

static int catalog_scan(const char *dir, ScanResult *ret) {
        _cleanup_(scan_result_done) ScanResult s = {};
        _cleanup_(closedirp) DIR *d = NULL;
        _cleanup_close_ int fd = -EBADF, dfd = -EBADF;
        json_auto_t *shared_policy = NULL;
        size_t alloc = 0;
        int r;

        assert(dir);
        assert(ret);

        fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;

        s.has_sysupdate = is_real_dir_at(fd, SYSUPDATE_DIR);
        r = load_kubernetes_versions(fd, dir, &s.kubernetes_versions);
        if (r < 0)
                return r;
        r = split_node_versions(fd, dir, &s);
        if (r < 0)
                return r;
        shared_policy = load_policy(fd, dir, POLICY_FILE);

        /* readdir() gets a descriptor of its own for the same directory; fd stays for the *at() calls. */
        dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        d = fdopendir(dfd);
        if (!d)
                return -errno;
        TAKE_FD(dfd);

        for (;;) {
                struct dirent *de;

                errno = 0;
                de = readdir(d);
                if (!de) {
                        if (errno != 0)
                                return -errno;
                        break;
                }
                if (de->d_type == DT_DIR || !endswith(de->d_name, UKI_SUFFIX))
                        continue;

                if (s.n_images >= IMAGE_CATALOG_MAX) {
                        log_debug("More than %u images in '%s', ignoring the rest.", IMAGE_CATALOG_MAX, dir);
                        break;
                }
                if (s.n_images >= alloc) {
                        size_t a = alloc == 0 ? 16 : MIN(alloc * 2, (size_t) IMAGE_CATALOG_MAX);
                        Image **n = reallocarray(s.images, a, sizeof(Image *));
                        if (!n)
                                return -ENOMEM;
                        s.images = n;
                        alloc = a;
                }

                _cleanup_(image_done) Image one = {};
                r = scan_one(fd, dir, de->d_name, shared_policy, &one);
                if (r < 0)
                        return r;
                if (r > 0) {
                        Image *i = new_image(&one);
                        if (!i)
                                return -ENOMEM;
                        s.images[s.n_images++] = i;
                }
        }

        if (s.n_images > 0)
                qsort(s.images, s.n_images, sizeof(Image *), image_compare);

        *ret = s;
        s = (ScanResult){};
        return (int) ret->n_images;
}

static bool policy_equal(json_t *a, json_t *b) {
        if (!a || !b)
                return a == b;
        return json_equal(a, b);
}

static bool strv_equal(char **a, char **b) {
        if (!a || !b)
                return a == b;
        for (; *a && *b; a++, b++)
                if (!streq(*a, *b))
                        return false;
        return !*a && !*b;
}

/* Whether two scans would render the same JSON. */
static bool scan_result_equal(const ScanResult *a, const ScanResult *b) {
        if (a->n_images != b->n_images || a->has_sysupdate != b->has_sysupdate ||
            !strv_equal(a->kubernetes_versions, b->kubernetes_versions) ||
            !(a->kubernetes_unusable ?
                      b->kubernetes_unusable && json_equal(a->kubernetes_unusable, b->kubernetes_unusable) :
                      !b->kubernetes_unusable))
                return false;

        for (size_t k = 0; k < a->n_images; k++) {
                const Image *x = a->images[k], *y = b->images[k];

                if (!streq(x->id, y->id) || !streq(x->version, y->version) || !streq(x->uki, y->uki) ||
                    !streq(x->disk, y->disk) || !!x->layout != !!y->layout ||
                    (x->layout && !streq(x->layout, y->layout)) || !policy_equal(x->policy, y->policy))
                        return false;
        }
        return true;
}

int image_catalog_rescan(ImageCatalog *c) {
        ScanResult s = {};
        bool changed;
        int r;

        assert_return(c, -EINVAL);

        r = catalog_scan(c->dir, &s);
        if (r < 0)
                return r;

        changed = !scan_result_equal(&c->current, &s);
        scan_result_done(&c->current);
        c->current = s;

        log_debug(
                "Rescanned image catalog '%s': %zu found%s.",
                c->dir,
                c->current.n_images,
                changed ? ", changed" : "");
        if (changed && c->change_cb)
                c->change_cb(c, c->change_userdata);

        return (int) c->current.n_images;
}

/* Watches dir/name when it is a real directory, and forgets an older watch on that name, which belongs
 * to a directory that was removed or moved away. */
static void catalog_watch_subdir(ImageCatalog *c, int *wd, const char *name) {
        _cleanup_free_ char *p = NULL;
        int k = -1;

        p = path_join(c->dir, name);
        if (!p)
                return; /* keep what we have; the next event retries */

        k = inotify_add_watch(c->inotify_fd, p, WATCH_MASK | IN_ONLYDIR | IN_DONT_FOLLOW);
        if (k < 0 && errno != ENOENT && errno != ENOTDIR)
                log_debug_errno(errno, "Cannot watch '%s', ignoring: %m", p);

        if (*wd >= 0 && *wd != k)
                (void) inotify_rm_watch(c->inotify_fd, *wd);
        *wd = k < 0 ? -1 : k;
}

static void catalog_schedule_rescan(ImageCatalog *c);

/* Watches the image directory itself. A directory replaced as a whole (a build publishing a new copy
 * with rm + mv) is a new inode under the same path: the old watch died with the old directory, so the
 * path is watched again at every rescan (for the same directory the kernel hands back the same watch).
 * Returns false while the directory is missing. */
static bool catalog_watch_dir(ImageCatalog *c) {
        int k;

        k = inotify_add_watch(c->inotify_fd, c->dir, WATCH_MASK | WATCH_SELF_MASK | IN_ONLYDIR);
        if (k < 0 && errno != ENOENT && errno != ENOTDIR)
                log_debug_errno(errno, "Cannot watch '%s', ignoring: %m", c->dir);
        if (c->wd_dir >= 0 && c->wd_dir != k)
                (void) inotify_rm_watch(c->inotify_fd, c->wd_dir);
        c->wd_dir = k < 0 ? -1 : k;
        return k >= 0;
}

static void catalog_update_watches(ImageCatalog *c) {
        _cleanup_close_ int fd = -EBADF;
        bool sysupdate;

        /* sysupdate/kubernetes is only followed below a sysupdate that is a directory itself. */
        fd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        sysupdate = fd >= 0 && is_real_dir_at(fd, SYSUPDATE_DIR);

        catalog_watch_subdir(c, &c->wd_sysupdate, SYSUPDATE_DIR);
        if (sysupdate)
                catalog_watch_subdir(c, &c->wd_kubernetes, KUBERNETES_DIR);
        else if (c->wd_kubernetes >= 0) {
                (void) inotify_rm_watch(c->inotify_fd, c->wd_kubernetes);
                c->wd_kubernetes = -1;
        }
}

static int on_rescan_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        ImageCatalog *c = userdata;
        int r;

        assert(c);

        c->rescan_pending = false;

        /* The directory and its subdirectories may have come, gone or been replaced. Watches first, so
         * that nothing after the scan is missed. While the directory is missing (between the rm and the
         * mv of a replacement) nothing will tell us of its return: look again shortly. */
        if (!catalog_watch_dir(c))
                catalog_schedule_rescan(c);
        catalog_update_watches(c);

        r = image_catalog_rescan(c);
        if (r < 0)
                log_debug_errno(r, "Cannot rescan image directory '%s', keeping the previous list: %m", c->dir);
        return 0;
}

static void catalog_schedule_rescan(ImageCatalog *c) {
        usec_t t, latest, when;
        int r;

        r = sd_event_now(c->event, CLOCK_MONOTONIC, &t);
        if (r < 0)
                t = now_usec(CLOCK_MONOTONIC);

        if (!c->rescan_pending)
                c->pending_since = t;
        latest = MAX(c->pending_since + RESCAN_MAX_DELAY_USEC, t);
        when = MIN(t + RESCAN_SETTLE_USEC, latest);

        if (!c->rescan_source) {
                r = sd_event_add_time(
                        c->event, &c->rescan_source, CLOCK_MONOTONIC, when, /* accuracy= */ 1, on_rescan_timer, c);
                if (r < 0) {
                        log_debug_errno(r, "Cannot schedule a rescan of '%s', ignoring: %m", c->dir);
                        return;
                }
                (void) sd_event_source_set_description(c->rescan_source, "image-catalog-rescan");
        } else {
                r = sd_event_source_set_time(c->rescan_source, when);
                if (r >= 0)
                        r = sd_event_source_set_enabled(c->rescan_source, SD_EVENT_ONESHOT);
                if (r < 0) {
                        log_debug_errno(r, "Cannot schedule a rescan of '%s', ignoring: %m", c->dir);
                        return;
                }
        }
        c->rescan_pending = true;
}

static int on_inotify(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        /* The kernel hands out whole events, each at most sizeof(struct inotify_event) + NAME_MAX + 1. */
        _Alignas(struct inotify_event) char buf[4096];
        ImageCatalog *c = userdata;
        bool any = false;

        assert(c);

        /* Which file changed does not matter: any change (or a queue overflow) means "scan again". */
        for (;;) {
                ssize_t n = read(fd, buf, sizeof(buf));
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                break;
                        return log_debug_errno(errno, "Cannot read inotify events for '%s': %m", c->dir);
                }
                if (n == 0)
                        break;
                any = true;
        }

        if (any)
                catalog_schedule_rescan(c);
        return 0;
}

static int dir_error(ApiError *reterr, int r, const char *dir) {
        switch (r) {
        case -ENOENT:
                return api_error_set(
                        reterr, r, API_ERROR_NOT_FOUND, "image directory \"%s\" does not exist", dir);
        case -ENOTDIR:
                return api_error_set(
                        reterr, r, API_ERROR_INVALID_REQUEST, "image directory \"%s\" is not a directory", dir);
        default:
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "cannot read image directory \"%s\": %s",
                        dir,
                        strerror(-r));
        }
}

static int catalog_watch(ImageCatalog *c, sd_event *event, ApiError *reterr) {
        int r;

        c->event = sd_event_ref(event);

        c->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (c->inotify_fd < 0)
                return api_error_set(
                        reterr,
                        -errno,
                        API_ERROR_INTERNAL,
                        "cannot watch image directory \"%s\": %s",
                        c->dir,
                        strerror(errno));

        c->wd_dir = inotify_add_watch(c->inotify_fd, c->dir, WATCH_MASK | WATCH_SELF_MASK | IN_ONLYDIR);
        if (c->wd_dir < 0) {
                r = -errno;
                if (r == -ENOENT || r == -ENOTDIR || r == -EACCES)
                        return dir_error(reterr, r, c->dir);
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "cannot watch image directory \"%s\": %s",
                        c->dir,
                        strerror(-r));
        }
        catalog_update_watches(c);

        r = sd_event_add_io(event, &c->inotify_source, c->inotify_fd, EPOLLIN, on_inotify, c);
        if (r < 0)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "cannot watch image directory \"%s\": %s",
                        c->dir,
                        strerror(-r));
        (void) sd_event_source_set_description(c->inotify_source, "image-catalog-inotify");
        return 0;
}

int image_catalog_new(ImageCatalog **ret, sd_event *event, const char *image_dir, ApiError *reterr) {
        _cleanup_(image_catalog_freep) ImageCatalog *c = NULL;
        int r;

        assert_return(ret, -EINVAL);

        if (!image_dir || !*image_dir)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "image directory is not set");

        c = calloc(1, sizeof(ImageCatalog));
        if (!c)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        c->inotify_fd = -EBADF;
        c->wd_dir = c->wd_sysupdate = c->wd_kubernetes = -1;

        r = path_make_absolute_clean(image_dir, &c->dir);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "image directory \"%s\": %s", image_dir, strerror(-r));
        /* Its paths are rendered as JSON strings, which must be UTF-8. */
        if (!utf8_is_valid(c->dir, strlen(c->dir)))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "image directory is not valid UTF-8");
        c->sysupdate_dir = path_join(c->dir, SYSUPDATE_DIR);
        if (!c->sysupdate_dir)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        /* Watch first, then scan: a change in between is seen by the watch. */
        if (event) {
                r = catalog_watch(c, event, reterr);
                if (r < 0)
                        return r;
        }

        r = catalog_scan(c->dir, &c->current);
        if (r < 0)
                return dir_error(reterr, r, c->dir);
        if (r == 0)
                log_debug("No images in '%s'.", c->dir);

        *ret = TAKE_PTR(c);
        return 0;
}

ImageCatalog *image_catalog_free(ImageCatalog *c) {
        if (!c)
                return NULL;

        c->inotify_source = sd_event_source_disable_unref(c->inotify_source);
        c->rescan_source = sd_event_source_disable_unref(c->rescan_source);
        c->inotify_fd = safe_close(c->inotify_fd);
        c->event = sd_event_unref(c->event);

        scan_result_done(&c->current);
        free(c->sysupdate_dir);
        free(c->dir);
        return mfree(c);
}

void image_catalog_set_change_callback(ImageCatalog *c, ImageCatalogChangeFunc cb, void *userdata) {
        assert(c);

        c->change_cb = cb;
        c->change_userdata = userdata;
}

size_t image_catalog_size(ImageCatalog *c) {
        assert_return(c, 0);
        return c->current.n_images;
}

const Image *image_catalog_at(ImageCatalog *c, size_t i) {
        assert_return(c, NULL);

        if (i >= c->current.n_images)
                return NULL;
        return c->current.images[i];
}

const Image *image_catalog_resolve(ImageCatalog *c, const char *ref) {
        const Image *best = NULL;

        assert_return(c, NULL);

        if (!ref || !*ref) {
                for (size_t k = 0; k < c->current.n_images; k++) {
                        const Image *i = c->current.images[k];

                        if (!best || image_version_compare(i->version, best->version) > 0)
                                best = i;
                }
                return best;
        }

        for (size_t k = 0; k < c->current.n_images; k++) {
                const Image *i = c->current.images[k];

                if (streq(i->ref, ref) || streq(i->id, ref))
                        return i;
        }
        return NULL;
}

char **image_catalog_kubernetes_versions(ImageCatalog *c) {
        assert_return(c, NULL);
        return c->current.kubernetes_versions;
}

const char *image_catalog_kubernetes_unusable(ImageCatalog *c, const char *version) {
        json_t *e;
        size_t i;

        assert_return(c, NULL);
        assert_return(version, NULL);
        json_array_foreach(
                c->current.kubernetes_unusable,
                i,
                e) if (streq(json_string_value(json_object_get(e, "version")),
                             version)) return json_string_value(json_object_get(e, "reason"));
        return NULL;
}

const char *image_catalog_dir(ImageCatalog *c) {
        assert_return(c, NULL);
        return c->dir;
}

json_t *image_to_json(ImageCatalog *c, const Image *i) {
        json_auto_t *o = NULL;

        assert_return(c, NULL);
        assert_return(i, NULL);

        o = json_object();
        if (!o)
                return NULL;

        if (json_object_set_new(o, "id", json_string(i->id)) < 0 ||
            json_object_set_new(o, "version", json_string(i->version)) < 0 ||
            json_object_set_new(o, "uki", json_string(i->uki)) < 0 ||
            json_object_set_new(o, "disk", json_string(i->disk)) < 0)
                return NULL;
        if (i->layout && json_object_set_new(o, "layout", json_string(i->layout)) < 0)
                return NULL;

        if (c->current.has_sysupdate &&
            json_object_set_new(o, "sysupdateDir", json_string(c->sysupdate_dir)) < 0)
                return NULL;

        if (c->current.kubernetes_versions) {
                json_t *a = json_array();

                if (json_object_set_new(o, "kubernetesVersions", a) < 0)
                        return NULL;
                for (char **v = c->current.kubernetes_versions; *v; v++)
                        if (json_array_append_new(a, json_string(*v)) < 0)
                                return NULL;
        }

        if (c->current.kubernetes_unusable &&
            json_object_set_new(o, "kubernetesUnusable", json_deep_copy(c->current.kubernetes_unusable)) < 0)
                return NULL;

        /* A copy: the catalog's own object is shared between images and must not change under it. */
        if (i->policy && json_object_set_new(o, "policy", json_deep_copy(i->policy)) < 0)
                return NULL;

        return TAKE_PTR(o);
}

json_t *image_catalog_to_json(ImageCatalog *c) {
        json_auto_t *a = NULL;

        assert_return(c, NULL);

        a = json_array();
        if (!a)
                return NULL;
        for (size_t k = 0; k < c->current.n_images; k++)
                if (json_array_append_new(a, image_to_json(c, c->current.images[k])) < 0)
                        return NULL;
        return TAKE_PTR(a);
}

int image_catalog_get_json(ImageCatalog *c, const char *ref, json_t **ret, ApiError *reterr) {
        const Image *i;
        json_t *v;

        assert_return(c, -EINVAL);
        assert_return(ret, -EINVAL);

        i = image_catalog_resolve(c, ref);
        if (!i) {
                if (!ref || !*ref)
                        return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "no images in %s", c->dir);
                return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "image \"%s\"", ref);
        }

        v = image_to_json(c, i);
        if (!v)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        *ret = v;
        return 0;
}

Image *image_catalog_acquire(ImageCatalog *c, const char *ref) {
        /* the catalog's images are its own references, only handed out const */
        return image_ref((Image *) image_catalog_resolve(c, ref));
}
