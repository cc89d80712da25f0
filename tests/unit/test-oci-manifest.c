/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>

#include "test-util.h"

#include "cleanup.h"
#include "oci-manifest.h"

#define D1 "sha256:1111111111111111111111111111111111111111111111111111111111111111"
#define D2 "sha256:2222222222222222222222222222222222222222222222222222222222222222"
#define D3 "sha256:3333333333333333333333333333333333333333333333333333333333333333"

/* A manifest as oras 1.3 writes it for a file and a directory. */
static const char oras_manifest[] =
        "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
        "\"artifactType\":\"application/vnd.test\","
        "\"config\":{\"mediaType\":\"application/vnd.oci.empty.v1+json\",\"digest\":"
        "\"" OCI_EMPTY_DIGEST
        "\","
        "\"size\":2,\"data\":\"e30=\"},"
        "\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"" D1
        "\",\"size\":4,"
        "\"annotations\":{\"org.opencontainers.image.title\":\"img_1.0.efi\"}},"
        "{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"" D2
        "\",\"size\":242,"
        "\"annotations\":{\"io.deis.oras.content.digest\":\"" D3
        "\",\"io.deis.oras.content.unpack\":\"true\","
        "\"org.opencontainers.image.title\":\"sysupdate/base\"}}],"
        "\"annotations\":{\"org.opencontainers.image.created\":\"2026-12-01T21:33:49Z\"}}";

static void test_parse_oras(void **state) {
        _cleanup_(oci_manifest_freep) OciManifest *m = NULL;
        OciDocumentKind k;

        assert_ok(oci_document_kind(oras_manifest, strlen(oras_manifest), NULL, &k, NULL));
        assert_int_equal(k, OCI_DOCUMENT_MANIFEST);
        assert_ok(oci_manifest_parse(oras_manifest, strlen(oras_manifest), &m, NULL));
        assert_string_equal(m->media_type, OCI_MEDIA_TYPE_MANIFEST);
        assert_string_equal(m->artifact_type, "application/vnd.test");
        assert_string_equal(m->config.digest, OCI_EMPTY_DIGEST);
        assert_int_equal(m->config.size, 2);
        assert_int_equal(m->n_layers, 2);
        assert_string_equal(oci_descriptor_annotation(&m->layers[0], OCI_ANNOTATION_TITLE), "img_1.0.efi");
        assert_null(oci_descriptor_annotation(&m->layers[0], OCI_ANNOTATION_UNPACK));
        assert_string_equal(oci_descriptor_annotation(&m->layers[1], OCI_ANNOTATION_UNPACK), "true");
        assert_string_equal(oci_descriptor_annotation(&m->layers[1], OCI_ANNOTATION_TAR_DIGEST), D3);
        assert_int_equal(m->layers[1].size, 242);
}

static char *manifest_with(const char *config, const char *layers, const char *extra) {
        char *s;

        assert_true(
                asprintf(
                        &s,
                        "{\"schemaVersion\":2%s,\"config\":%s,\"layers\":%s}",
                        extra ?: "",
                        config ?:
                                "{\"mediaType\":\"application/vnd.oci.empty.v1+json\",\"digest\":\"" OCI_EMPTY_DIGEST
                                "\",\"size\":2}",
                        layers ?: "[]") >= 0);
        return s;
}

static void refuse(const char *config, const char *layers, const char *extra, int want, const char *words) {
        _cleanup_free_ char *s = manifest_with(config, layers, extra);
        _cleanup_(oci_manifest_freep) OciManifest *m = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;

        assert_errno(oci_manifest_parse(s, strlen(s), &m, &e), want);
        assert_null(m);
        assert_non_null(e.message);
        if (!strstr(e.message, words))
                fail_msg("message '%s' lacks '%s'", e.message, words);
}

#define LAYER(mt, dg, size) "{\"mediaType\":\"" mt "\",\"digest\":\"" dg "\",\"size\":" size "}"

static void test_refused(void **state) {
        /* a config larger than we would ever fetch: 1 GiB */
        refuse("{\"mediaType\":\"application/vnd.oci.empty.v1+json\",\"digest\":\"" OCI_EMPTY_DIGEST
               "\",\"size\":1073741824}",
               NULL,
               NULL,
               -EFBIG,
               "config is 1073741824 bytes");
        refuse(NULL, "[" LAYER("a/b", D1, "-1") "]", NULL, -EBADMSG, "layer 1: size");
        refuse(NULL, "[" LAYER("a/b", D1, "1.5") "]", NULL, -EBADMSG, "layer 1: size");
        refuse(NULL, "[" LAYER("a/b", D1, "9007199254740992") "]", NULL, -EBADMSG, "size");
        refuse(NULL, "[" LAYER("a/b", "sha256:abc", "1") "]", NULL, -EBADMSG, "not sha256:");
        refuse(NULL, "[" LAYER("a/b", "sha512:abc", "1") "]", NULL, -EOPNOTSUPP, "not sha256:");
        refuse(NULL, "[" LAYER("not a type", D1, "1") "]", NULL, -EBADMSG, "mediaType");
        refuse(NULL,
               "[{\"mediaType\":\"a/b\",\"digest\":\"" D1 "\",\"size\":1,\"urls\":[\"http://x\"]}]",
               NULL,
               -EOPNOTSUPP,
               "foreign layer");
        refuse(NULL,
               "[{\"mediaType\":\"a/b\",\"digest\":\"" D1 "\",\"size\":1,\"annotations\":{\"x\":1}}]",
               NULL,
               -EBADMSG,
               "annotation 'x' is not a string");
        refuse(NULL, "{}", NULL, -EBADMSG, "no layers array");
        refuse(NULL,
               NULL,
               ",\"mediaType\":\"" OCI_MEDIA_TYPE_INDEX "\"",
               -EMEDIUMTYPE,
               "not that of an image manifest");
        refuse(NULL, NULL, ",\"artifactType\":\"x\"", -EBADMSG, "artifactType");

        /* duplicate keys make a document mean two things */
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        OciManifest *m = NULL;
        const char *dup = "{\"schemaVersion\":2,\"schemaVersion\":2,\"config\":{},\"layers\":[]}";
        assert_errno(oci_manifest_parse(dup, strlen(dup), &m, &e), -EBADMSG);
        const char *sv = "{\"schemaVersion\":1,\"config\":{},\"layers\":[]}";
        assert_errno(oci_manifest_parse(sv, strlen(sv), &m, NULL), -EBADMSG);
        assert_errno(oci_manifest_parse("[]", 2, &m, NULL), -EBADMSG);
        assert_errno(oci_manifest_parse("{", 1, &m, NULL), -EBADMSG);
}

/* A manifest of n layers, all of the same small blob. */
static char *many_layers(size_t n) {
        size_t len = 0, cap = 256 + n * 128;
        char *layers = malloc(cap), *s;

        assert_non_null(layers);
        layers[len++] = '[';
        for (size_t i = 0; i < n; i++)
                len += (size_t) snprintf(layers + len, cap - len, "%s" LAYER("a/b", D1, "1"), i ? "," : "");
        layers[len++] = ']';
        layers[len] = 0;
        s = manifest_with(NULL, layers, NULL);
        free(layers);
        return s;
}

static void test_layer_limits(void **state) {
        _cleanup_free_ char *ok = many_layers(OCI_LAYERS_MAX), *over = many_layers(OCI_LAYERS_MAX + 1),
                            *huge = many_layers(100000);
        _cleanup_(oci_manifest_freep) OciManifest *m = NULL;
        _cleanup_(api_error_done) ApiError e1 = API_ERROR_NULL, e2 = API_ERROR_NULL;
        OciManifest *none = NULL;

        assert_ok(oci_manifest_parse(ok, strlen(ok), &m, NULL));
        assert_int_equal(m->n_layers, OCI_LAYERS_MAX);
        assert_errno(oci_manifest_parse(over, strlen(over), &none, &e1), -E2BIG);
        assert_non_null(strstr(e1.message, "129 layers"));
        /* 100,000 layers do not even fit the 4 MiB a manifest may have */
        assert_true(strlen(huge) > OCI_MANIFEST_SIZE_MAX);
        assert_errno(oci_manifest_parse(huge, strlen(huge), &none, &e2), -EFBIG);
        assert_null(none);
}

static const char index_doc[] =
        "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":["
        "{\"mediaType\":\"" OCI_MEDIA_TYPE_INDEX "\",\"digest\":\"" D1
        "\",\"size\":10},"
        "{\"mediaType\":\"" OCI_MEDIA_TYPE_MANIFEST "\",\"digest\":\"" D2
        "\",\"size\":10,"
        "\"platform\":{\"os\":\"linux\",\"architecture\":\"arm64\"}},"
        "{\"mediaType\":\"" OCI_MEDIA_TYPE_MANIFEST "\",\"digest\":\"" D3
        "\",\"size\":10,"
        "\"platform\":{\"os\":\"linux\",\"architecture\":\"amd64\"}}]}";

static void test_index(void **state) {
        _cleanup_(oci_index_freep) OciIndex *i = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        const OciDescriptor *d = NULL;
        OciDocumentKind k;

        assert_ok(oci_document_kind(index_doc, strlen(index_doc), NULL, &k, NULL));
        assert_int_equal(k, OCI_DOCUMENT_INDEX);
        assert_ok(oci_index_parse(index_doc, strlen(index_doc), &i, NULL));
        assert_int_equal(i->n_manifests, 3);
        /* no artifactType match: the linux/amd64 one; the nested index is never picked */
        assert_ok(oci_index_select(i, "application/x", &d, NULL));
        assert_string_equal(d->digest, D3);

        /* an entry of our artifactType wins over the platform */
        free(i->manifests[1].artifact_type);
        i->manifests[1].artifact_type = strdup("application/x");
        assert_ok(oci_index_select(i, "application/x", &d, NULL));
        assert_string_equal(d->digest, D2);

        /* nothing fits: two candidates, neither ours nor amd64 */
        free(i->manifests[2].platform_arch);
        i->manifests[2].platform_arch = strdup("s390x");
        free(i->manifests[1].artifact_type);
        i->manifests[1].artifact_type = NULL;
        assert_errno(oci_index_select(i, "application/x", &d, &e), -ENOENT);
        assert_non_null(strstr(e.message, "linux/arm64, linux/s390x"));
}

/* An index with one image manifest: followed when it names no platform or linux/amd64, refused
 * (naming what it is for) when it is for another platform, as an index of two foreign ones is. */
static void test_index_single(void **state) {
        static const struct {
                const char *platform; /* the entry's "platform" member, or NULL for none */
                int want;
                const char *message; /* a part of the message when refused */
        } cases[] = {
                { NULL, 0, NULL },
                { "{\"os\":\"linux\",\"architecture\":\"amd64\"}", 0, NULL },
                { "{\"os\":\"linux\",\"architecture\":\"arm64\"}", -ENOENT, "linux/arm64" },
                { "{\"os\":\"windows\",\"architecture\":\"amd64\"}", -ENOENT, "windows/amd64" },
                { "{\"os\":\"linux\",\"architecture\":\"arm64\",\"variant\":\"v8\"}", -ENOENT, "linux/arm64" },
        };

        for (size_t k = 0; k < ELEMENTSOF(cases); k++) {
                _cleanup_(oci_index_freep) OciIndex *i = NULL;
                _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
                _cleanup_free_ char *doc = NULL;
                const OciDescriptor *d = NULL;

                assert_true(
                        asprintf(
                                &doc,
                                "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"" OCI_MEDIA_TYPE_MANIFEST
                                "\",\"digest\":\"" D2 "\",\"size\":10%s%s}]}",
                                cases[k].platform ? ",\"platform\":" : "",
                                cases[k].platform ?: "") > 0);
                assert_ok(oci_index_parse(doc, strlen(doc), &i, NULL));
                assert_errno(oci_index_select(i, "application/x", &d, &e), cases[k].want);
                if (cases[k].want == 0) {
                        assert_non_null(d);
                        assert_string_equal(d->digest, D2);
                        continue;
                }
                assert_null(d);
                assert_int_equal(e.code, API_ERROR_NOT_FOUND);
                assert_non_null(strstr(e.message, cases[k].message));
                assert_non_null(strstr(e.message, "linux/amd64"));
        }
}

static void test_kind(void **state) {
        const char *bare_manifest = "{\"schemaVersion\":2,\"layers\":[]}", *bare_index = "{\"manifests\":[]}",
                   *neither = "{\"schemaVersion\":2}", *other = "{\"mediaType\":\"text/plain\"}";
        OciDocumentKind k;

        assert_ok(oci_document_kind(bare_manifest, strlen(bare_manifest), NULL, &k, NULL));
        assert_int_equal(k, OCI_DOCUMENT_MANIFEST);
        assert_ok(oci_document_kind(bare_index, strlen(bare_index), NULL, &k, NULL));
        assert_int_equal(k, OCI_DOCUMENT_INDEX);
        /* the Content-Type decides when the document does not say */
        assert_ok(oci_document_kind(
                neither, strlen(neither), OCI_MEDIA_TYPE_DOCKER_LIST "; charset=utf-8", &k, NULL));
        assert_int_equal(k, OCI_DOCUMENT_INDEX);
        assert_errno(oci_document_kind(neither, strlen(neither), NULL, &k, NULL), -EMEDIUMTYPE);
        assert_errno(oci_document_kind(other, strlen(other), OCI_MEDIA_TYPE_MANIFEST, &k, NULL), -EMEDIUMTYPE);
        assert_errno(oci_document_kind("x", 1, NULL, &k, NULL), -EBADMSG);
}

static void test_format_round_trip(void **state) {
        json_auto_t *a1 = json_pack("{s:s}", OCI_ANNOTATION_TITLE, "x_1.efi"),
                    *a2 = json_pack(
                            "{s:s, s:s, s:s}",
                            OCI_ANNOTATION_TAR_DIGEST,
                            D3,
                            OCI_ANNOTATION_UNPACK,
                            "true",
                            OCI_ANNOTATION_TITLE,
                            "sysupdate/base"),
                    *top = json_pack("{s:s}", "org.opencontainers.image.version", "1");
        OciDescriptor layers[2] = {
                { .media_type = (char *) "application/x.uki",
                  .digest = (char *) D1,
                  .size = 77,
                  .annotations = a1 },
                { .media_type = (char *) OCI_MEDIA_TYPE_LAYER_TAR_GZIP,
                  .digest = (char *) D2,
                  .size = 5,
                  .annotations = a2 },
        };
        _cleanup_free_ char *s1 = NULL, *s2 = NULL;
        _cleanup_(oci_manifest_freep) OciManifest *m = NULL;
        size_t n1 = 0, n2 = 0;

        assert_ok(oci_manifest_format("application/x.art", layers, 2, top, &s1, &n1));
        assert_ok(oci_manifest_format("application/x.art", layers, 2, top, &s2, &n2));
        assert_int_equal(n1, strlen(s1));
        assert_string_equal(s1, s2); /* the same input gives the same bytes, so the same digest */
        assert_non_null(strstr(
                s1,
                "\"config\":{\"mediaType\":\"application/vnd.oci.empty.v1+json\",\"digest\":\"" OCI_EMPTY_DIGEST
                "\",\"size\":2,\"data\":\"e30=\"}"));

        assert_ok(oci_manifest_parse(s1, n1, &m, NULL));
        assert_string_equal(m->artifact_type, "application/x.art");
        assert_int_equal(m->n_layers, 2);
        assert_string_equal(m->layers[0].digest, D1);
        assert_int_equal(m->layers[0].size, 77);
        assert_string_equal(oci_descriptor_annotation(&m->layers[1], OCI_ANNOTATION_TITLE), "sysupdate/base");
        assert_string_equal(
                json_string_value(json_object_get(m->annotations, "org.opencontainers.image.version")), "1");
}

static void test_titles(void **state) {
        assert_true(oci_title_is_safe("x_1.efi"));
        assert_true(oci_title_is_safe("sysupdate/base"));
        assert_true(oci_title_is_safe("a/b/c..d"));
        assert_false(oci_title_is_safe(""));
        assert_false(oci_title_is_safe("/etc/passwd"));
        assert_false(oci_title_is_safe("../x"));
        assert_false(oci_title_is_safe("a/../../x"));
        assert_false(oci_title_is_safe("a/./b"));
        assert_false(oci_title_is_safe("a//b"));
        assert_false(oci_title_is_safe("a/"));
        assert_false(oci_title_is_safe(".."));
        assert_false(oci_title_is_safe("a\\b"));
        assert_false(oci_title_is_safe("a\nb"));
        assert_false(oci_title_is_safe(NULL));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse_oras),        cmocka_unit_test(test_refused),
                cmocka_unit_test(test_layer_limits),      cmocka_unit_test(test_index),
                cmocka_unit_test(test_index_single),      cmocka_unit_test(test_kind),
                cmocka_unit_test(test_format_round_trip), cmocka_unit_test(test_titles),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
