/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <tss2/tss2_mu.h>
#include <tss2/tss2_rc.h>
#include <tss2/tss2_tctildr.h>

#include "agent-tpm.h"
#include "agent-util.h"

struct AgentTpm {
        char *tcti_conf;
        bool simulator;
        TSS2_TCTI_CONTEXT *tcti;
        ESYS_CONTEXT *esys;
};

/* The AK: ECC P-256, ECDSA with SHA-256, nameAlg SHA-256, a restricted signing key fixed to this TPM,
 * usable with an empty password and exempt from dictionary-attack lockout. A restricted signing key
 * needs TPM2_ALG_NULL as its symmetric algorithm. */
#define AK_ATTRIBUTES                                                                       \
        (TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_SENSITIVEDATAORIGIN | \
         TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_NODA | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_SIGN_ENCRYPT)

static const TPM2B_PUBLIC ak_template = {
        .publicArea = {
                .type = TPM2_ALG_ECC,
                .nameAlg = TPM2_ALG_SHA256,
                .objectAttributes = AK_ATTRIBUTES,
                .parameters.eccDetail = {
                        .symmetric = { .algorithm = TPM2_ALG_NULL },
                        .scheme = {
                                .scheme = TPM2_ALG_ECDSA,
                                .details.ecdsa = { .hashAlg = TPM2_ALG_SHA256 },
                        },
                        .curveID = TPM2_ECC_NIST_P256,
                        .kdf = { .scheme = TPM2_ALG_NULL },
                },
        },
};

/* The SRK the AK is created under: the TCG "H-2" ECC P-256 storage key of the owner hierarchy, the
 * one systemd and go-tpm derive as well. It is a primary, so it is recomputed, not stored. */
static const TPM2B_PUBLIC srk_template = {
        .publicArea = {
                .type = TPM2_ALG_ECC,
                .nameAlg = TPM2_ALG_SHA256,
                .objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT |
                                    TPMA_OBJECT_SENSITIVEDATAORIGIN | TPMA_OBJECT_USERWITHAUTH |
                                    TPMA_OBJECT_NODA | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT,
                .parameters.eccDetail = {
                        .symmetric = {
                                .algorithm = TPM2_ALG_AES,
                                .keyBits.aes = 128,
                                .mode.aes = TPM2_ALG_CFB,
                        },
                        .scheme = { .scheme = TPM2_ALG_NULL },
                        .curveID = TPM2_ECC_NIST_P256,
                        .kdf = { .scheme = TPM2_ALG_NULL },
                },
                .unique.ecc = { .x = { .size = 32 }, .y = { .size = 32 } },
        },
};

/* The TCG EK Credential Profile's default RSA-2048 EK template (template L-1): its authPolicy is
 * PolicySecret(TPM_RH_ENDORSEMENT) and its unique field 256 zero bytes, as tpm2_createek uses. */
static const TPM2B_PUBLIC ek_template = {
        .publicArea = {
                .type = TPM2_ALG_RSA,
                .nameAlg = TPM2_ALG_SHA256,
                .objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT |
                                    TPMA_OBJECT_SENSITIVEDATAORIGIN | TPMA_OBJECT_ADMINWITHPOLICY |
                                    TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT,
                .authPolicy = {
                        .size = 32,
                        .buffer = {
                                0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xb3, 0xf8, 0x1a, 0x90, 0xcc,
                                0x8d, 0x46, 0xa5, 0xd7, 0x24, 0xfd, 0x52, 0xd7, 0x6e, 0x06, 0x52,
                                0x0b, 0x64, 0xf2, 0xa1, 0xda, 0x1b, 0x33, 0x14, 0x69, 0xaa,
                        },
                },
                .parameters.rsaDetail = {
                        .symmetric = {
                                .algorithm = TPM2_ALG_AES,
                                .keyBits.aes = 128,
                                .mode.aes = TPM2_ALG_CFB,
                        },
                        .scheme = { .scheme = TPM2_ALG_NULL },
                        .keyBits = 2048,
                        .exponent = 0,
                },
                .unique.rsa = { .size = 256 },
        },
};

static int tpm_error(ApiError *reterr, TSS2_RC rc, const char *format, ...) _printf_(3, 4);
static int tpm_error(ApiError *reterr, TSS2_RC rc, const char *format, ...) {
        _cleanup_free_ char *what = NULL;
        va_list ap;
        int k;

        va_start(ap, format);
        k = vasprintf(&what, format, ap);
        va_end(ap);
        if (k < 0)
                what = NULL;
        return api_error_set(reterr, -EIO, API_ERROR_INTERNAL, "%s: %s", what ?: "tpm", Tss2_RC_Decode(rc));
}

/* A TPM response code with the layer (TPM, resource manager) masked off and, for format-one codes,
 * the parameter/handle/session number too: what is left is comparable with TPM2_RC_*. */
static TSS2_RC tpm_rc_base(TSS2_RC rc) {
        rc &= ~TSS2_RC_LAYER_MASK;
        if (rc & TPM2_RC_FMT1)
                return rc & (TPM2_RC_FMT1 | 0x3f);
        return rc;
}

static bool tcti_is_simulator(const char *conf) {
        size_t n = strcspn(conf, ":");

        /* "swtpm", "mssim", or the library names "libtss2-tcti-swtpm.so.0" etc. */
        return (n == 5 && (strneq(conf, "swtpm", 5) || strneq(conf, "mssim", 5))) ||
                strneq(conf, "libtss2-tcti-swtpm", 18) || strneq(conf, "libtss2-tcti-mssim", 18);
}

int agent_tpm_open(const char *spec, AgentTpm **ret, ApiError *reterr) {
        _cleanup_(agent_tpm_freep) AgentTpm *t = NULL;
        struct stat st;
        TSS2_RC rc;

        assert_return(spec, -EINVAL);
        assert_return(ret, -EINVAL);

        t = calloc(1, sizeof(*t));
        if (!t)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        if (strchr(spec, ':')) {
                t->tcti_conf = strdup(spec);
                t->simulator = tcti_is_simulator(spec);
        } else {
                if (stat(spec, &st) < 0)
                        return api_error_set(reterr, -errno, API_ERROR_INTERNAL, "open tpm '%s': %m", spec);
                if (S_ISSOCK(st.st_mode)) {
                        asprintf_or_null(&t->tcti_conf, "swtpm:path=%s", spec);
                        t->simulator = true;
                } else
                        asprintf_or_null(&t->tcti_conf, "device:%s", spec);
        }
        if (!t->tcti_conf)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");

        /* The TSS libraries log their own errors to stderr, and an error message of ours already says
         * what failed. Keep theirs for -v, and let TSS2_LOG from the environment win. */
        (void) setenv("TSS2_LOG", agent_log_get_max_level() >= LOG_DEBUG ? "all+warning" : "all+none", 0);

        agent_debug("opening the tpm through tcti '%s'", t->tcti_conf);
        rc = Tss2_TctiLdr_Initialize(t->tcti_conf, &t->tcti);
        if (rc != TSS2_RC_SUCCESS)
                return tpm_error(reterr, rc, "open tpm '%s'", spec);

        rc = Esys_Initialize(&t->esys, t->tcti, /* abiVersion= */ NULL);
        if (rc != TSS2_RC_SUCCESS)
                return tpm_error(reterr, rc, "open tpm '%s'", spec);

        *ret = TAKE_PTR(t);
        return 0;
}

AgentTpm *agent_tpm_free(AgentTpm *t) {
        if (!t)
                return NULL;
        if (t->esys)
                Esys_Finalize(&t->esys);
        if (t->tcti)
                Tss2_TctiLdr_Finalize(&t->tcti);
        free(t->tcti_conf);
        return mfree(t);
}

bool agent_tpm_is_simulator(const AgentTpm *t) {
        return t && t->simulator;
}

const char *agent_tpm_tcti(const AgentTpm *t) {
        return t ? t->tcti_conf : NULL;
}

static const struct {
        const char *name;
        TPMI_ALG_HASH alg;
} banks[] = {
        { "sha1", TPM2_ALG_SHA1 },
        { "sha256", TPM2_ALG_SHA256 },
        { "sha384", TPM2_ALG_SHA384 },
        { "sha512", TPM2_ALG_SHA512 },
};

TPMI_ALG_HASH agent_bank_from_string(const char *s) {
        for (size_t i = 0; s && i < ELEMENTSOF(banks); i++)
                if (streq(s, banks[i].name))
                        return banks[i].alg;
        return 0;
}

const char *agent_bank_to_string(TPMI_ALG_HASH alg) {
        for (size_t i = 0; i < ELEMENTSOF(banks); i++)
                if (banks[i].alg == alg)
                        return banks[i].name;
        return NULL;
}

static TPML_PCR_SELECTION pcr_selection(TPMI_ALG_HASH bank, uint32_t mask) {
        return (TPML_PCR_SELECTION){
                .count = 1,
                .pcrSelections[0] = {
                        .hash = bank,
                        .sizeofSelect = 3,
                        .pcrSelect = { mask & 0xff, (mask >> 8) & 0xff, (mask >> 16) & 0xff },
                },
        };
}

int agent_tpm_read_pcrs(AgentTpm *t, TPMI_ALG_HASH bank, uint32_t mask, AgentPcrs *ret, ApiError *reterr) {
        AgentPcrs pcrs = { .bank = bank, .mask = mask };
        uint32_t remaining = mask;

        assert_return(t, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(mask != 0 && mask >> AGENT_PCR_COUNT == 0, -EINVAL);

        while (remaining != 0) {
                _cleanup_esys_free_ TPML_PCR_SELECTION *out = NULL;
                _cleanup_esys_free_ TPML_DIGEST *values = NULL;
                TPML_PCR_SELECTION in = pcr_selection(bank, remaining);
                uint32_t got = 0;
                unsigned n = 0, k = 0;
                TSS2_RC rc;

                rc = Esys_PCR_Read(
                        t->esys,
                        ESYS_TR_NONE,
                        ESYS_TR_NONE,
                        ESYS_TR_NONE,
                        &in,
                        /* pcrUpdateCounter= */ NULL,
                        &out,
                        &values);
                if (rc != TSS2_RC_SUCCESS)
                        return tpm_error(reterr, rc, "read pcrs");

                for (uint32_t i = 0; i < out->count; i++) {
                        const TPMS_PCR_SELECTION *s = &out->pcrSelections[i];

                        if (s->hash != bank)
                                continue;
                        for (unsigned b = 0; b < MIN((unsigned) s->sizeofSelect, 3U) * 8; b++)
                                if (s->pcrSelect[b / 8] & (1U << (b % 8)))
                                        got |= UINT32_C(1) << b;
                }
                for (uint32_t m = got; m != 0; m &= m - 1)
                        n++;
                if (got == 0)
                        return api_error_set(
                                reterr,
                                -EOPNOTSUPP,
                                API_ERROR_INTERNAL,
                                "read pcrs: the tpm returned no %s values: is the bank allocated?",
                                agent_bank_to_string(bank) ?: "?");
                if ((got & ~remaining) != 0 || n != values->count)
                        return api_error_set(
                                reterr,
                                -EBADMSG,
                                API_ERROR_INTERNAL,
                                "read pcrs: the tpm answered %u digests for selection 0x%06x of 0x%06x",
                                (unsigned) values->count,
                                (unsigned) got,
                                (unsigned) remaining);

                /* Digests come in ascending PCR order. */
                for (unsigned i = 0; i < AGENT_PCR_COUNT; i++)
                        if (got & (UINT32_C(1) << i))
                                pcrs.values[i] = values->digests[k++];
                agent_debug("read %u %s pcrs in one round", n, agent_bank_to_string(bank) ?: "?");
                remaining &= ~got;
        }

        *ret = pcrs;
        return 0;
}

/* Whether a persistent handle holds an object. Asked with TPM2_GetCapability rather than by reading
 * the handle, so that the common "not there yet" case produces no TSS error log. */
static int persistent_present(AgentTpm *t, TPM2_HANDLE handle, ApiError *reterr) {
        _cleanup_esys_free_ TPMS_CAPABILITY_DATA *data = NULL;
        TSS2_RC rc;

        rc = Esys_GetCapability(
                t->esys,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                TPM2_CAP_HANDLES,
                handle,
                1,
                /* moreData= */ NULL,
                &data);
        if (rc != TSS2_RC_SUCCESS)
                return tpm_error(reterr, rc, "list persistent handles");
        return data->data.handles.count > 0 && data->data.handles.handle[0] == handle;
}

static void flush(AgentTpm *t, ESYS_TR *handle) {
        TSS2_RC rc;

        if (*handle == ESYS_TR_NONE)
                return;
        rc = Esys_FlushContext(t->esys, *handle);
        if (rc != TSS2_RC_SUCCESS)
                agent_debug("flush transient object: %s, ignoring", Tss2_RC_Decode(rc));
        *handle = ESYS_TR_NONE;
}

static void tr_close(AgentTpm *t, ESYS_TR *handle) {
        if (*handle == ESYS_TR_NONE)
                return;
        (void) Esys_TR_Close(t->esys, handle);
        *handle = ESYS_TR_NONE;
}

static int create_ak(AgentTpm *t, ApiError *reterr) {
        _cleanup_esys_free_ TPM2B_PRIVATE *private = NULL;
        _cleanup_esys_free_ TPM2B_PUBLIC *public = NULL;
        const TPM2B_SENSITIVE_CREATE sensitive = {};
        const TPM2B_DATA outside = {};
        const TPML_PCR_SELECTION creation_pcrs = {};
        ESYS_TR srk = ESYS_TR_NONE, ak = ESYS_TR_NONE, persistent = ESYS_TR_NONE;
        TSS2_RC rc;
        int r;

        agent_debug("creating the attestation key under a transient srk");
        rc = Esys_CreatePrimary(
                t->esys,
                ESYS_TR_RH_OWNER,
                ESYS_TR_PASSWORD,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                &sensitive,
                &srk_template,
                &outside,
                &creation_pcrs,
                &srk,
                /* outPublic= */ NULL,
                /* creationData= */ NULL,
                /* creationHash= */ NULL,
                /* creationTicket= */ NULL);
        if (rc != TSS2_RC_SUCCESS)
                return tpm_error(reterr, rc, "create srk");

        rc = Esys_Create(
                t->esys,
                srk,
                ESYS_TR_PASSWORD,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                &sensitive,
                &ak_template,
                &outside,
                &creation_pcrs,
                &private,
                &public,
                /* creationData= */ NULL,
                /* creationHash= */ NULL,
                /* creationTicket= */ NULL);
        if (rc != TSS2_RC_SUCCESS) {
                r = tpm_error(reterr, rc, "create ak");
                goto finish;
        }

        rc = Esys_Load(t->esys, srk, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, private, public, &ak);
        if (rc != TSS2_RC_SUCCESS) {
                r = tpm_error(reterr, rc, "load ak");
                goto finish;
        }

        rc = Esys_EvictControl(
                t->esys,
                ESYS_TR_RH_OWNER,
                ak,
                ESYS_TR_PASSWORD,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                AGENT_AK_HANDLE,
                &persistent);
        if (rc != TSS2_RC_SUCCESS && tpm_rc_base(rc) == TPM2_RC_NV_DEFINED)
                /* Another agent won the race; the caller checks what it persisted. */
                agent_debug("0x%08x was taken meanwhile", (unsigned) AGENT_AK_HANDLE);
        else if (rc != TSS2_RC_SUCCESS) {
                r = tpm_error(reterr, rc, "persist ak at 0x%08x", (unsigned) AGENT_AK_HANDLE);
                goto finish;
        } else
                agent_info("created the attestation key at 0x%08x", (unsigned) AGENT_AK_HANDLE);
        r = 0;

finish:
        tr_close(t, &persistent);
        flush(t, &ak);
        flush(t, &srk);
        return r;
}

/* The immutable parts of the AK template: type, name algorithm, attributes, curve, scheme, hash. The
 * unique field is the key itself. */
static int ak_check_template(const TPMT_PUBLIC *p, char **ret_why) {
        const TPMT_PUBLIC *want = &ak_template.publicArea;
        char *why = NULL;

        if (p->type != want->type)
                asprintf_or_null(&why, "type 0x%04x, want 0x%04x", p->type, want->type);
        else if (p->nameAlg != want->nameAlg)
                asprintf_or_null(&why, "name algorithm 0x%04x, want 0x%04x", p->nameAlg, want->nameAlg);
        else if (p->objectAttributes != want->objectAttributes)
                asprintf_or_null(
                        &why,
                        "attributes 0x%08x, want 0x%08x",
                        (unsigned) p->objectAttributes,
                        (unsigned) want->objectAttributes);
        else if (p->parameters.eccDetail.curveID != want->parameters.eccDetail.curveID)
                asprintf_or_null(
                        &why,
                        "curve 0x%04x, want 0x%04x",
                        p->parameters.eccDetail.curveID,
                        want->parameters.eccDetail.curveID);
        else if (p->parameters.eccDetail.scheme.scheme != want->parameters.eccDetail.scheme.scheme)
                asprintf_or_null(
                        &why,
                        "scheme 0x%04x, want 0x%04x",
                        p->parameters.eccDetail.scheme.scheme,
                        want->parameters.eccDetail.scheme.scheme);
        else if (
                p->parameters.eccDetail.scheme.details.ecdsa.hashAlg !=
                want->parameters.eccDetail.scheme.details.ecdsa.hashAlg)
                asprintf_or_null(
                        &why,
                        "scheme hash 0x%04x, want 0x%04x",
                        p->parameters.eccDetail.scheme.details.ecdsa.hashAlg,
                        want->parameters.eccDetail.scheme.details.ecdsa.hashAlg);
        else
                return 0;

        *ret_why = why;
        return -EPERM;
}

static int read_persistent(
        AgentTpm *t, TPM2_HANDLE handle, ESYS_TR *ret_tr, TPM2B_PUBLIC *ret_public, ApiError *reterr) {
        _cleanup_esys_free_ TPM2B_PUBLIC *public = NULL;
        ESYS_TR tr = ESYS_TR_NONE;
        TSS2_RC rc;

        rc = Esys_TR_FromTPMPublic(t->esys, handle, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, &tr);
        if (rc != TSS2_RC_SUCCESS)
                return tpm_error(reterr, rc, "read public 0x%08x", (unsigned) handle);

        rc = Esys_ReadPublic(
                t->esys,
                tr,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                &public,
                /* name= */ NULL,
                /* qualifiedName= */ NULL);
        if (rc != TSS2_RC_SUCCESS) {
                tr_close(t, &tr);
                return tpm_error(reterr, rc, "read public 0x%08x", (unsigned) handle);
        }

        if (ret_tr)
                *ret_tr = tr;
        else
                tr_close(t, &tr);
        *ret_public = *public;
        return 0;
}

int agent_tpm_ensure_ak(AgentTpm *t, ESYS_TR *ret_ak, TPM2B_PUBLIC *ret_public, ApiError *reterr) {
        _cleanup_free_ char *why = NULL;
        TPM2B_PUBLIC public;
        ESYS_TR ak = ESYS_TR_NONE;
        int r;

        assert_return(t, -EINVAL);
        assert_return(ret_ak, -EINVAL);
        assert_return(ret_public, -EINVAL);

        r = persistent_present(t, AGENT_AK_HANDLE, reterr);
        if (r < 0)
                return r;
        if (r == 0) {
                r = create_ak(t, reterr);
                if (r < 0)
                        return r;
        } else
                agent_debug("reusing the attestation key at 0x%08x", (unsigned) AGENT_AK_HANDLE);

        r = read_persistent(t, AGENT_AK_HANDLE, &ak, &public, reterr);
        if (r < 0)
                return r;

        r = ak_check_template(&public.publicArea, &why);
        if (r < 0) {
                tr_close(t, &ak);
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_INTERNAL,
                        "persistent object is not the vm-manager attestation key at 0x%08x: %s",
                        (unsigned) AGENT_AK_HANDLE,
                        why ?: "template mismatch");
        }

        *ret_ak = ak;
        *ret_public = public;
        return 0;
}

/* A transient EK from the TCG RSA-2048 template, which the caller flushes. The endorsement seed
 * makes it the same key each time, the one the EK certificate describes. */
static int create_ek(AgentTpm *t, ESYS_TR *ret, TPM2B_PUBLIC **ret_public, ApiError *reterr) {
        const TPM2B_SENSITIVE_CREATE sensitive = {};
        const TPM2B_DATA outside = {};
        const TPML_PCR_SELECTION creation_pcrs = {};
        TSS2_RC rc;

        agent_debug("deriving the endorsement key from the tcg rsa-2048 template");
        rc = Esys_CreatePrimary(
                t->esys,
                ESYS_TR_RH_ENDORSEMENT,
                ESYS_TR_PASSWORD,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                &sensitive,
                &ek_template,
                &outside,
                &creation_pcrs,
                ret,
                ret_public,
                /* creationData= */ NULL,
                /* creationHash= */ NULL,
                /* creationTicket= */ NULL);
        if (rc != TSS2_RC_SUCCESS)
                return tpm_error(reterr, rc, "create ek");
        return 0;
}

int agent_tpm_ek_public(AgentTpm *t, TPM2B_PUBLIC *ret, ApiError *reterr) {
        _cleanup_esys_free_ TPM2B_PUBLIC *public = NULL;
        ESYS_TR ek = ESYS_TR_NONE;
        int r;

        assert_return(t, -EINVAL);
        assert_return(ret, -EINVAL);

        r = persistent_present(t, AGENT_EK_HANDLE, reterr);
        if (r < 0)
                return r;
        if (r > 0) {
                agent_debug("reading the endorsement key at 0x%08x", (unsigned) AGENT_EK_HANDLE);
                return read_persistent(t, AGENT_EK_HANDLE, /* ret_tr= */ NULL, ret, reterr);
        }

        r = create_ek(t, &ek, &public, reterr);
        if (r < 0)
                return r;
        flush(t, &ek);

        *ret = *public;
        return 0;
}

int agent_tpm_open_keys(
        const char *spec,
        AgentTpm **ret_tpm,
        ESYS_TR *ret_ak,
        TPM2B_PUBLIC *ret_ak_public,
        TPM2B_PUBLIC *ret_ek_public,
        ApiError *reterr) {
        _cleanup_(agent_tpm_freep) AgentTpm *tpm = NULL;
        int r;

        assert_return(spec, -EINVAL);
        assert_return(ret_tpm, -EINVAL);
        assert_return(ret_ak, -EINVAL);
        assert_return(ret_ak_public, -EINVAL);
        assert_return(ret_ek_public, -EINVAL);

        r = agent_tpm_open(spec, &tpm, reterr);
        if (r < 0)
                return r;
        r = agent_tpm_ensure_ak(tpm, ret_ak, ret_ak_public, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "attestation key");
                return r;
        }
        r = agent_tpm_ek_public(tpm, ret_ek_public, reterr);
        if (r < 0) {
                (void) api_error_prefix(reterr, "endorsement key");
                return r;
        }
        *ret_tpm = TAKE_PTR(tpm);
        return 0;
}

/* The EK to activate a credential with: the persistent one when there is one (its handle is only
 * closed afterwards), else a transient one (flushed afterwards). */
static int load_ek(AgentTpm *t, ESYS_TR *ret, bool *ret_transient, ApiError *reterr) {
        TPM2B_PUBLIC public;
        int r;

        r = persistent_present(t, AGENT_EK_HANDLE, reterr);
        if (r < 0)
                return r;
        if (r > 0) {
                agent_debug("using the endorsement key at 0x%08x", (unsigned) AGENT_EK_HANDLE);
                *ret_transient = false;
                return read_persistent(t, AGENT_EK_HANDLE, ret, &public, reterr);
        }
        *ret_transient = true;
        return create_ek(t, ret, /* ret_public= */ NULL, reterr);
}

/* A policy session satisfied by PolicySecret(TPM_RH_ENDORSEMENT) with the endorsement hierarchy's
 * (empty) password: the authPolicy of the TCG EK templates, and the only way to use the EK. */
static int ek_policy_session(AgentTpm *t, ESYS_TR *ret, ApiError *reterr) {
        const TPMT_SYM_DEF symmetric = { .algorithm = TPM2_ALG_NULL };
        ESYS_TR session = ESYS_TR_NONE;
        TSS2_RC rc;

        rc = Esys_StartAuthSession(
                t->esys,
                /* tpmKey= */ ESYS_TR_NONE,
                /* bind= */ ESYS_TR_NONE,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                /* nonceCaller= */ NULL,
                TPM2_SE_POLICY,
                &symmetric,
                TPM2_ALG_SHA256,
                &session);
        if (rc != TSS2_RC_SUCCESS)
                return tpm_error(reterr, rc, "start ek policy session");

        rc = Esys_PolicySecret(
                t->esys,
                ESYS_TR_RH_ENDORSEMENT,
                session,
                ESYS_TR_PASSWORD,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                /* nonceTPM= */ NULL,
                /* cpHashA= */ NULL,
                /* policyRef= */ NULL,
                /* expiration= */ 0,
                /* timeout= */ NULL,
                /* policyTicket= */ NULL);
        if (rc != TSS2_RC_SUCCESS) {
                flush(t, &session);
                return tpm_error(reterr, rc, "policy secret for the endorsement hierarchy");
        }

        *ret = session;
        return 0;
}

static int unmarshal_credential(
        const uint8_t *blob,
        size_t blob_size,
        const uint8_t *secret,
        size_t secret_size,
        TPM2B_ID_OBJECT *ret_blob,
        TPM2B_ENCRYPTED_SECRET *ret_secret,
        ApiError *reterr) {
        size_t off = 0;

        /* tss2 refuses to unmarshal into a TPM2B whose size is not zero. */
        memset(ret_blob, 0, sizeof(*ret_blob));
        memset(ret_secret, 0, sizeof(*ret_secret));
        if (Tss2_MU_TPM2B_ID_OBJECT_Unmarshal(blob, blob_size, &off, ret_blob) != TSS2_RC_SUCCESS ||
            off != blob_size)
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "credential blob is not a TPM2B_ID_OBJECT");
        off = 0;
        if (Tss2_MU_TPM2B_ENCRYPTED_SECRET_Unmarshal(secret, secret_size, &off, ret_secret) != TSS2_RC_SUCCESS ||
            off != secret_size)
                return api_error_set(
                        reterr, -EBADMSG, API_ERROR_INTERNAL, "encrypted secret is not a TPM2B_ENCRYPTED_SECRET");
        return 0;
}

int agent_tpm_activate_credential(
        AgentTpm *t,
        ESYS_TR ak,
        const uint8_t *blob,
        size_t blob_size,
        const uint8_t *secret,
        size_t secret_size,
        TPM2B_DIGEST *ret,
        ApiError *reterr) {
        _cleanup_esys_free_ TPM2B_DIGEST *credential = NULL;
        TPM2B_ID_OBJECT id;
        TPM2B_ENCRYPTED_SECRET encrypted;
        ESYS_TR ek = ESYS_TR_NONE, session = ESYS_TR_NONE;
        bool transient = false;
        TSS2_RC rc;
        int r;

        assert_return(t, -EINVAL);
        assert_return(blob || blob_size == 0, -EINVAL);
        assert_return(secret || secret_size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        r = unmarshal_credential(blob, blob_size, secret, secret_size, &id, &encrypted, reterr);
        if (r < 0)
                return r;

        r = load_ek(t, &ek, &transient, reterr);
        if (r < 0)
                return r;
        r = ek_policy_session(t, &session, reterr);
        if (r < 0)
                goto finish;

        /* The AK is authorised with its (empty) password, the EK with the policy session. */
        rc = Esys_ActivateCredential(
                t->esys, ak, ek, ESYS_TR_PASSWORD, session, ESYS_TR_NONE, &id, &encrypted, &credential);
        if (rc != TSS2_RC_SUCCESS) {
                TSS2_RC base = tpm_rc_base(rc);

                /* The integrity HMAC covers the AK's name and the seed: a credential for another key,
                 * another TPM or one altered on the way fails here, not for a fault of this TPM. */
                if (IN_SET(base, TPM2_RC_INTEGRITY, TPM2_RC_VALUE, TPM2_RC_SIZE, TPM2_RC_ECC_POINT))
                        r = api_error_set(
                                reterr,
                                -EPERM,
                                API_ERROR_INTERNAL,
                                "activate credential: refused by the tpm, not made for this attestation key and endorsement key: %s",
                                Tss2_RC_Decode(rc));
                else
                        r = tpm_error(reterr, rc, "activate credential");
                goto finish;
        }

        *ret = *credential;
        r = 0;

finish:
        flush(t, &session);
        if (transient)
                flush(t, &ek);
        else
                tr_close(t, &ek);
        return r;
}

int agent_tpm_quote(
        AgentTpm *t,
        ESYS_TR ak,
        TPMI_ALG_HASH bank,
        uint32_t mask,
        const uint8_t *qualifying,
        size_t qualifying_size,
        TPM2B_ATTEST **ret_attest,
        TPMT_SIGNATURE **ret_signature,
        ApiError *reterr) {
        _cleanup_esys_free_ TPM2B_ATTEST *attest = NULL;
        _cleanup_esys_free_ TPMT_SIGNATURE *signature = NULL;
        const TPMT_SIG_SCHEME scheme = { .scheme = TPM2_ALG_NULL };
        TPML_PCR_SELECTION selection = pcr_selection(bank, mask);
        TPM2B_DATA data = {};
        TSS2_RC rc;

        assert_return(t, -EINVAL);
        assert_return(qualifying || qualifying_size == 0, -EINVAL);
        assert_return(ret_attest, -EINVAL);
        assert_return(ret_signature, -EINVAL);

        if (qualifying_size > sizeof(data.buffer))
                return api_error_set(
                        reterr,
                        -EINVAL,
                        API_ERROR_INTERNAL,
                        "nonce is %zu bytes, a tpm takes at most %zu",
                        qualifying_size,
                        sizeof(data.buffer));
        data.size = (UINT16) qualifying_size;
        if (qualifying_size > 0)
                memcpy(data.buffer, qualifying, qualifying_size);

        rc = Esys_Quote(
                t->esys,
                ak,
                ESYS_TR_PASSWORD,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                &data,
                &scheme,
                &selection,
                &attest,
                &signature);
        if (rc != TSS2_RC_SUCCESS)
                return tpm_error(reterr, rc, "quote");

        *ret_attest = TAKE_PTR(attest);
        *ret_signature = TAKE_PTR(signature);
        return 0;
}
