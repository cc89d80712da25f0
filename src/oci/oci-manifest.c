/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oci-manifest.h"
#include "oci-ref.h"

#define MEDIA_TYPE_PART_MAX 127

static bool restricted_name_is_valid(const char *s, size_t n) {
        /* RFC 6838 4.2: restricted-name-first is alphanumeric, then alphanumerics and !#$&-^_.+ */
        if (n == 0 || n > MEDIA_TYPE_PART_MAX)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');

                if (!alnum && (i == 0 || !strchr("!#$&-^_.+", c)))
                        return false;
        }
        return true;
}

bool oci_media_type_is_valid(const char *s) {
        const char *slash;

        if (!s || !(slash = strchr(s, '/')))
                return false;
        return restricted_name_is_valid(s, (size_t) (slash - s)) &&
                restricted_name_is_valid(slash + 1, strlen(slash + 1));
}

bool oci_title_is_safe(const char *s) {
        size_t n = s ? strlen(s) : 0;

        if (n == 0 || n > OCI_TITLE_MAX || s[0] == '/')
                return false;
        for (const char *p = s;;) {
                const char *slash = strchr(p, '/');
                size_t len = slash ? (size_t) (slash - p) : strlen(p);

                if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && strneq(p, "..", 2)))
                        return false;
                for (size_t i = 0; i < len; i++)
                        if ((unsigned char) p[i] < 0x20 || p[i] == 0x7f || p[i] == '\\')
                                return false;
                if (!slash)
                        return true;
                p = slash + 1;
        }
}

void oci_descriptor_done(OciDescriptor *d) {
        if (!d)
                return;
        d->media_type = mfree(d->media_type);
        d->digest = mfree(d->digest);
        d->artifact_type = mfree(d->artifact_type);
        d->platform_os = mfree(d->platform_os);
        d->platform_arch = mfree(d->platform_arch);
        json_decref(d->annotations);
        d->annotations = NULL;
}

const char *oci_descriptor_annotation(const OciDescriptor *d, const char *key) {
        return d && d->annotations ? json_string_value(json_object_get(d->annotations, key)) : NULL;
}

static int dup_string(json_t *v, char **ret) {
        char *s = strdup(json_string_value(v));
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}

static int parse_annotations(json_t *v, const char *what, json_t **ret, ApiError *reterr) {
        const char *key;
        json_t *value;

        if (!v) {
                *ret = NULL;
                return 0;
        }
        if (!json_is_object(v))
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "%s: annotations are not an object", what);
        if (json_object_size(v) > OCI_ANNOTATIONS_MAX)
                return api_error_set(
                        reterr,
                        -E2BIG,
                        API_ERROR_INTERNAL,
                        "%s: %zu annotations, at most %u are accepted",
                        what,
                        json_object_size(v),
                        OCI_ANNOTATIONS_MAX);
        json_object_foreach(v, key, value) if (!json_is_string(value)) return api_error_set(
                reterr, -EBADMSG, API_ERROR_INTERNAL, "%s: annotation '%s' is not a string", what, key);
        *ret = json_incref(v);
        return 0;
}

/* what names the descriptor in messages ("layer 3", "config", "manifests[2]"). */
static int parse_descriptor(json_t *v, const char *what, OciDescriptor *ret, ApiError *reterr) {
        _cleanup_(oci_descriptor_done) OciDescriptor d = {};
        json_t *mt, *digest, *size, *at, *platform;
        int r;

        if (!json_is_object(v))
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "%s is not an object", what);

        mt = json_object_get(v, "mediaType");
        if (!json_is_string(mt) || !oci_media_type_is_valid(json_string_value(mt)))
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "%s has no valid mediaType", what);
        digest = json_object_get(v, "digest");
        if (!json_is_string(digest))
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "%s has no digest", what);
        if (!oci_digest_is_valid(json_string_value(digest)))
                return api_error_set(
                        reterr,
                        startswith(json_string_value(digest), OCI_DIGEST_SHA256_PREFIX) ? -EBADMSG :
                                                                                          -EOPNOTSUPP,
                        API_ERROR_INTERNAL,
                        "%s: digest '%.80s' is not sha256: and 64 lower-case hex digits",
                        what,
                        json_string_value(digest));
        size = json_object_get(v, "size");
        if (!json_is_integer(size) || json_integer_value(size) < 0 ||
            (uint64_t) json_integer_value(size) > OCI_BLOB_SIZE_MAX)
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "%s: size is not an integer from 0 to 2^53-1", what);
        if (json_object_get(v, "urls"))
                return api_error_set(
                        reterr,
                        -EOPNOTSUPP,
                        API_ERROR_INTERNAL,
                        "%s names urls to fetch it from (a foreign layer): not supported",
                        what);
        at = json_object_get(v, "artifactType");
        if (at && (!json_is_string(at) || !oci_media_type_is_valid(json_string_value(at))))
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "%s: artifactType is not a media type", what);

        if ((r = dup_string(mt, &d.media_type)) < 0 || (r = dup_string(digest, &d.digest)) < 0 ||
            (at && (r = dup_string(at, &d.artifact_type)) < 0))
                return r;
        d.size = (uint64_t) json_integer_value(size);
        r = parse_annotations(json_object_get(v, "annotations"), what, &d.annotations, reterr);
        if (r < 0)
                return r;

        platform = json_object_get(v, "platform");
        if (platform) {
                json_t *os = json_object_get(platform, "os"),
                       *arch = json_object_get(platform, "architecture");
                if (!json_is_object(platform) || !json_is_string(os) || !json_is_string(arch))
                        return api_error_set(
                                reterr,
                                -EBADMSG,
                                API_ERROR_INTERNAL,
                                "%s: platform is not an object with os and architecture",
                                what);
                if ((r = dup_string(os, &d.platform_os)) < 0 || (r = dup_string(arch, &d.platform_arch)) < 0)
                        return r;
        }
        *ret = d;
        d = (OciDescriptor){};
        return 0;
}

static int load_object(const void *data, size_t size, const char *what, json_t **ret, ApiError *reterr) {
        json_error_t err;
        json_t *v;

        if (size > OCI_MANIFEST_SIZE_MAX)
                return api_error_set(
                        reterr,
                        -EFBIG,
                        API_ERROR_INTERNAL,
                        "the %s is %zu bytes, more than the %zu accepted",
                        what,
                        size,
                        OCI_MANIFEST_SIZE_MAX);
        v = json_loadb(data, size, JSON_REJECT_DUPLICATES, &err);
        if (!v)
                return api_error_set(
                        reterr,
                        -EBADMSG,
                        API_ERROR_INTERNAL,
                        "the %s is not JSON: %s (line %d, column %d)",
                        what,
                        err.text,
                        err.line,
                        err.column);
        if (!json_is_object(v)) {
                json_decref(v);
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "the %s is not a JSON object", what);
        }
        *ret = v;
        return 0;
}

static const char *content_type_base(const char *s, char *buf, size_t size) {
        size_t n;

        if (!s)
                return NULL;
        n = strcspn(s, "; \t");
        if (n >= size)
                return NULL;
        memcpy(buf, s, n);
        buf[n] = 0;
        return buf;
}

static OciDocumentKind kind_of_media_type(const char *s) {
        if (!s)
                return _OCI_DOCUMENT_KIND_INVALID;
        if (streq(s, OCI_MEDIA_TYPE_MANIFEST) || streq(s, OCI_MEDIA_TYPE_DOCKER_MANIFEST))
                return OCI_DOCUMENT_MANIFEST;
        if (streq(s, OCI_MEDIA_TYPE_INDEX) || streq(s, OCI_MEDIA_TYPE_DOCKER_LIST))
                return OCI_DOCUMENT_INDEX;
        return _OCI_DOCUMENT_KIND_INVALID;
}

int oci_document_kind(
        const void *data, size_t size, const char *content_type, OciDocumentKind *ret, ApiError *reterr) {
        json_auto_t *v = NULL;
        char buf[256];
        json_t *mt;
        OciDocumentKind k;
        int r;

        r = load_object(data, size, "manifest", &v, reterr);
        if (r < 0)
                return r;
        mt = json_object_get(v, "mediaType");
        if (mt) {
                k = kind_of_media_type(json_string_value(mt));
                if (k < 0)
                        return api_error_set(
                                reterr,
                                -EMEDIUMTYPE,
                                API_ERROR_INTERNAL,
                                "the manifest's mediaType '%.200s' is neither an image manifest nor an "
                                "index",
                                json_is_string(mt) ? json_string_value(mt) : "(not a string)");
        } else {
                k = kind_of_media_type(content_type_base(content_type, buf, sizeof(buf)));
                if (k < 0) {
                        bool layers = json_object_get(v, "layers"),
                             manifests = json_object_get(v, "manifests");
                        if (layers == manifests)
                                return api_error_set(
                                        reterr,
                                        -EMEDIUMTYPE,
                                        API_ERROR_INTERNAL,
                                        "the document is neither an image manifest nor an index");
                        k = layers ? OCI_DOCUMENT_MANIFEST : OCI_DOCUMENT_INDEX;
                }
        }
        *ret = k;
        return 0;
}

static int check_schema(
        json_t *v, OciDocumentKind want, const char *what, char **ret_media_type, ApiError *reterr) {
        json_t *sv = json_object_get(v, "schemaVersion"), *mt = json_object_get(v, "mediaType");
        const char *media_type;

        if (!json_is_integer(sv) || json_integer_value(sv) != 2)
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "the %s's schemaVersion is not 2", what);
        if (mt && (!json_is_string(mt) || kind_of_media_type(json_string_value(mt)) != want))
                return api_error_set(
                        reterr,
                        -EMEDIUMTYPE,
                        API_ERROR_INTERNAL,
                        "the %s's mediaType '%.200s' is not that of an %s",
                        what,
                        json_is_string(mt) ? json_string_value(mt) : "(not a string)",
                        want == OCI_DOCUMENT_MANIFEST ? "image manifest" : "index");
        media_type = mt                       ? json_string_value(mt) :
                want == OCI_DOCUMENT_MANIFEST ? OCI_MEDIA_TYPE_MANIFEST :
                                                OCI_MEDIA_TYPE_INDEX;
        *ret_media_type = strdup(media_type);
        return *ret_media_type ? 0 : -ENOMEM;
}

OciManifest *oci_manifest_free(OciManifest *m) {
        if (!m)
                return NULL;
        free(m->media_type);
        free(m->artifact_type);
        oci_descriptor_done(&m->config);
        for (size_t i = 0; i < m->n_layers; i++)
                oci_descriptor_done(&m->layers[i]);
        free(m->layers);
        json_decref(m->annotations);
        return mfree(m);
}

int oci_manifest_parse(const void *data, size_t size, OciManifest **ret, ApiError *reterr) {
        _cleanup_(oci_manifest_freep) OciManifest *m = NULL;
        json_auto_t *v = NULL;
        json_t *layers, *at;
        int r;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        r = load_object(data, size, "manifest", &v, reterr);
        if (r < 0)
                return r;
        m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        r = check_schema(v, OCI_DOCUMENT_MANIFEST, "manifest", &m->media_type, reterr);
        if (r < 0)
                return r;

        at = json_object_get(v, "artifactType");
        if (at) {
                if (!json_is_string(at) || !oci_media_type_is_valid(json_string_value(at)))
                        return api_error_set(
                                reterr,
                                -EBADMSG,
                                API_ERROR_INTERNAL,
                                "the manifest's artifactType is not a media type");
                r = dup_string(at, &m->artifact_type);
                if (r < 0)
                        return r;
        }

        r = parse_descriptor(json_object_get(v, "config"), "the manifest's config", &m->config, reterr);
        if (r < 0)
                return r;
        if (m->config.size > OCI_CONFIG_SIZE_MAX)
                return api_error_set(
                        reterr,
                        -EFBIG,
                        API_ERROR_INTERNAL,
                        "the manifest's config is %" PRIu64 " bytes, more than the %" PRIu64 " accepted",
                        m->config.size,
                        OCI_CONFIG_SIZE_MAX);

        layers = json_object_get(v, "layers");
        if (!json_is_array(layers))
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "the manifest has no layers array");
        if (json_array_size(layers) > OCI_LAYERS_MAX)
                return api_error_set(
                        reterr,
                        -E2BIG,
                        API_ERROR_INTERNAL,
                        "the manifest has %zu layers, at most %u are accepted",
                        json_array_size(layers),
                        OCI_LAYERS_MAX);
        m->layers = calloc(MAX(json_array_size(layers), (size_t) 1), sizeof(OciDescriptor));
        if (!m->layers)
                return -ENOMEM;
        for (size_t i = 0; i < json_array_size(layers); i++) {
                char what[64];

                snprintf(what, sizeof(what), "layer %zu", i + 1);
                r = parse_descriptor(json_array_get(layers, i), what, &m->layers[i], reterr);
                if (r < 0)
                        return r;
                m->n_layers++;
        }
        r = parse_annotations(json_object_get(v, "annotations"), "the manifest", &m->annotations, reterr);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(m);
        return 0;
}

OciIndex *oci_index_free(OciIndex *i) {
        if (!i)
                return NULL;
        free(i->media_type);
        for (size_t k = 0; k < i->n_manifests; k++)
                oci_descriptor_done(&i->manifests[k]);
        free(i->manifests);
        return mfree(i);
}

int oci_index_parse(const void *data, size_t size, OciIndex **ret, ApiError *reterr) {
        _cleanup_(oci_index_freep) OciIndex *idx = NULL;
        json_auto_t *v = NULL;
        json_t *manifests;
        int r;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        r = load_object(data, size, "index", &v, reterr);
        if (r < 0)
                return r;
        idx = calloc(1, sizeof(*idx));
        if (!idx)
                return -ENOMEM;
        r = check_schema(v, OCI_DOCUMENT_INDEX, "index", &idx->media_type, reterr);
        if (r < 0)
                return r;
        manifests = json_object_get(v, "manifests");
        if (!json_is_array(manifests))
                return api_error_set(reterr, -EBADMSG, API_ERROR_INTERNAL, "the index has no manifests array");
        if (json_array_size(manifests) > OCI_INDEX_MANIFESTS_MAX)
                return api_error_set(
                        reterr,
                        -E2BIG,
                        API_ERROR_INTERNAL,
                        "the index has %zu manifests, at most %u are accepted",
                        json_array_size(manifests),
                        OCI_INDEX_MANIFESTS_MAX);
        idx->manifests = calloc(MAX(json_array_size(manifests), (size_t) 1), sizeof(OciDescriptor));
        if (!idx->manifests)
                return -ENOMEM;
        for (size_t i = 0; i < json_array_size(manifests); i++) {
                char what[64];

                snprintf(what, sizeof(what), "index entry %zu", i + 1);
                r = parse_descriptor(json_array_get(manifests, i), what, &idx->manifests[i], reterr);
                if (r < 0)
                        return r;
                idx->n_manifests++;
        }
        *ret = TAKE_PTR(idx);
        return 0;
}

/* "os/arch" of an index entry, "no platform" when it names none; NULL on OOM. The fields come from
 * the registry: cut, so that a message stays one short line. */
static char *platform_string(const OciDescriptor *d) {
        char *s = NULL;

        if (!d->platform_os && !d->platform_arch)
                return strdup("no platform");
        asprintf_or_null(&s, "%.32s/%.32s", d->platform_os ?: "?", d->platform_arch ?: "?");
        return s;
}

static bool platform_is_ours(const OciDescriptor *d) {
        return d->platform_os && d->platform_arch && streq(d->platform_os, "linux") &&
                streq(d->platform_arch, "amd64");
}

int oci_index_select(const OciIndex *idx, const char *artifact_type, const OciDescriptor **ret, ApiError *reterr) {
        const OciDescriptor *by_type = NULL, *by_platform = NULL, *only = NULL, *found;
        _cleanup_free_ char *platforms = NULL;
        size_t n = 0;

        assert_return(idx, -EINVAL);
        assert_return(ret, -EINVAL);

        for (size_t i = 0; i < idx->n_manifests; i++) {
                const OciDescriptor *d = &idx->manifests[i];

                if (kind_of_media_type(d->media_type) != OCI_DOCUMENT_MANIFEST)
                        continue;
                n++;
                only = d;
                if (!by_type && artifact_type && d->artifact_type && streq(d->artifact_type, artifact_type))
                        by_type = d;
                if (!by_platform && platform_is_ours(d))
                        by_platform = d;
        }
        /* the only manifest is followed when it does not say what it is for: one that says it is for
         * another platform is refused as two would be */
        found = by_type ?: by_platform ?: n == 1 && !only->platform_os && !only->platform_arch ? only : NULL;
        if (found) {
                *ret = found;
                return 0;
        }

        /* the platforms there are, for the message: the first few */
        for (size_t i = 0, shown = 0; i < idx->n_manifests && shown < 4; i++) {
                const OciDescriptor *d = &idx->manifests[i];
                _cleanup_free_ char *p = NULL;
                char *joined = NULL;

                if (kind_of_media_type(d->media_type) != OCI_DOCUMENT_MANIFEST)
                        continue;
                p = platform_string(d);
                if (!p)
                        return -ENOMEM;
                asprintf_or_null(&joined, "%s%s%s", platforms ?: "", platforms ? ", " : "", p);
                if (!joined)
                        return -ENOMEM;
                free(platforms);
                platforms = joined;
                shown++;
        }
        if (n == 0)
                return api_error_set(reterr, -ENOENT, API_ERROR_NOT_FOUND, "the index lists no image manifest");
        if (n == 1)
                return api_error_set(
                        reterr,
                        -ENOENT,
                        API_ERROR_NOT_FOUND,
                        "the index's only image manifest is for %s, not linux/amd64, and is not of artifactType %s",
                        platforms,
                        artifact_type ?: "(any)");
        return api_error_set(
                reterr,
                -ENOENT,
                API_ERROR_NOT_FOUND,
                "the index lists %zu image manifests (%s%s), none of artifactType %s or for linux/amd64",
                n,
                platforms ?: "",
                n > 4 ? ", ..." : "",
                artifact_type ?: "(any)");
}

static json_t *descriptor_to_json(const OciDescriptor *d) {
        json_t *o = json_pack(
                "{s:s, s:s, s:I}", "mediaType", d->media_type, "digest", d->digest, "size", (json_int_t) d->size);

        if (o && d->annotations && json_object_size(d->annotations) > 0 &&
            json_object_set(o, "annotations", d->annotations) < 0)
                o = (json_decref(o), NULL);
        return o;
}

int oci_manifest_format(
        const char *artifact_type,
        const OciDescriptor *layers,
        size_t n_layers,
        json_t *annotations,
        char **ret,
        size_t *ret_size) {
        json_auto_t *m = NULL, *arr = NULL;
        char *s;

        assert_return(artifact_type, -EINVAL);
        assert_return(layers || n_layers == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        arr = json_array();
        if (!arr)
                return -ENOMEM;
        for (size_t i = 0; i < n_layers; i++)
                if (json_array_append_new(arr, descriptor_to_json(&layers[i])) < 0)
                        return -ENOMEM;
        m = json_pack(
                "{s:i, s:s, s:s, s:{s:s, s:s, s:i, s:s}, s:O}",
                "schemaVersion",
                2,
                "mediaType",
                OCI_MEDIA_TYPE_MANIFEST,
                "artifactType",
                artifact_type,
                "config",
                "mediaType",
                OCI_MEDIA_TYPE_EMPTY,
                "digest",
                OCI_EMPTY_DIGEST,
                "size",
                2,
                "data",
                "e30=",
                "layers",
                arr);
        if (!m)
                return -ENOMEM;
        if (annotations && json_object_size(annotations) > 0 &&
            json_object_set(m, "annotations", annotations) < 0)
                return -ENOMEM;
        s = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!s)
                return -ENOMEM;
        if (ret_size)
                *ret_size = strlen(s);
        *ret = s;
        return 0;
}
