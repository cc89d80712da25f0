/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "fuzz.h"
#include "oci-manifest.h"

/* A registry's answer to GET /v2/<name>/manifests/<ref>: what kind of document it is (with a
 * Content-Type taken from the first line when it has one), then the manifest or index parser, the
 * index's selection, and the titles' safety check a pull applies; a parsed manifest is written back
 * and must parse again. */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(oci_manifest_freep) OciManifest *m = NULL;
        _cleanup_(oci_index_freep) OciIndex *idx = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *ct = NULL;
        const uint8_t *body = data;
        const OciDescriptor *pick;
        OciDocumentKind kind;
        size_t n = size;

        /* "Content-Type: x\n" in front of the body, optionally */
        if (size > 14 && memcmp(data, "Content-Type: ", 14) == 0) {
                const uint8_t *nl = memchr(data, '\n', size);
                if (nl) {
                        ct = strndup((const char *) data + 14, (size_t) (nl - data - 14));
                        body = nl + 1;
                        n = size - (size_t) (body - data);
                }
        }

        if (oci_document_kind(body, n, ct, &kind, &e) < 0)
                return 0;
        if (kind == OCI_DOCUMENT_INDEX) {
                if (oci_index_parse(body, n, &idx, NULL) >= 0)
                        (void) oci_index_select(idx, "application/vnd.giantswarm.vm-image.v1", &pick, NULL);
                return 0;
        }
        if (oci_manifest_parse(body, n, &m, NULL) < 0)
                return 0;
        if (m->n_layers > OCI_LAYERS_MAX || m->config.size > OCI_CONFIG_SIZE_MAX)
                abort();
        for (size_t i = 0; i < m->n_layers; i++)
                (void) oci_title_is_safe(oci_descriptor_annotation(&m->layers[i], OCI_ANNOTATION_TITLE));

        /* what we write, we read back the same */
        {
                _cleanup_(oci_manifest_freep) OciManifest *again = NULL;
                _cleanup_free_ char *s = NULL;
                size_t len = 0;

                if (oci_manifest_format(
                            m->artifact_type ?: "application/x.fuzz",
                            m->layers,
                            m->n_layers,
                            m->annotations,
                            &s,
                            &len) < 0)
                        return 0;
                if (oci_manifest_parse(s, len, &again, NULL) < 0 || again->n_layers != m->n_layers)
                        abort();
                for (size_t i = 0; i < m->n_layers; i++)
                        if (!streq(again->layers[i].digest, m->layers[i].digest) ||
                            again->layers[i].size != m->layers[i].size)
                                abort();
        }
        return 0;
}
