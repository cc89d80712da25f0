/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include <openssl/evp.h>

#include "attest-policy.h"
#include "cleanup.h"

/* Decoding follows Go's json.Unmarshal into the original's Policy struct, so that a policy.json is
 * accepted or refused alike: keys match fields case-insensitively, unknown keys are ignored, null
 * leaves a field unset, two keys naming the same map merge, and a value of the wrong type is an
 * error naming the field. Validation then runs in the reference's order. */

static int type_error(ApiError *reterr, const char *field, const json_t *v, const char *type) {
        return attest_error_set(
                reterr,
                -EBADMSG,
                "policy: json: cannot unmarshal %s into Go struct field Policy.%s of type %s",
                attest_json_go_type(v),
                field,
                type);
}

/* A string field: NULL for JSON null (Go leaves the field alone), else a copy. */
static int take_string(json_t *v, const char *field, char **dest, ApiError *reterr) {
        char *s;

        if (json_is_null(v))
                return 0;
        if (!json_is_string(v))
                return type_error(reterr, field, v, "string");
        s = strndup(json_string_value(v), json_string_length(v));
        if (!s)
                return -ENOMEM;
        free(*dest);
        *dest = s;
        return 0;
}

/* Merges a JSON object of strings into *dest (created on demand); null resets the map, as Go does.
 * A null element is the empty string. */
static int merge_string_map(json_t *v, const char *field, json_t **dest, ApiError *reterr) {
        const char *key;
        json_t *e;

        if (json_is_null(v)) {
                json_decref(*dest);
                *dest = NULL;
                return 0;
        }
        if (!json_is_object(v))
                return type_error(reterr, field, v, "map[string]string");
        if (!*dest) {
                *dest = json_object();
                if (!*dest)
                        return -ENOMEM;
        }
        json_object_foreach(v, key, e) {
                if (json_is_null(e))
                        e = json_string("");
                else if (!json_is_string(e))
                        return type_error(reterr, field, e, "string");
                else
                        json_incref(e);
                if (json_object_set_new(*dest, key, e) < 0)
                        return -ENOMEM;
        }
        return 0;
}

/* strconv.ParseInt(s, 10, 64) as Go's map[int] keys are parsed: an optional sign, decimal digits. */
static bool parse_go_int(const char *s, long long *ret) {
        bool neg = false;
        long long v = 0;

        if (*s == '+' || *s == '-')
                neg = *s++ == '-';
        if (!*s)
                return false;
        for (; *s; s++) {
                if (*s < '0' || *s > '9')
                        return false;
                if (v > (LLONG_MAX - (*s - '0')) / 10)
                        return false;
                v = v * 10 + (*s - '0');
        }
        *ret = neg ? -v : v;
        return true;
}

typedef struct Golden {
        char *bank;
        json_t *values; /* index string → digest, NULL for a null bank */
} Golden;

typedef struct PolicyJson {
        char *image_id, *image_version;
        json_t *pcr11, *pcr13;
        json_t *golden; /* bank → object or null, merged */
        bool firmware;
        char *fw_sha256, *fw_package, *fw_version;
        char *pcr12;
        json_t *pcr4;
} PolicyJson;

static void policy_json_done(PolicyJson *j) {
        free(j->image_id);
        free(j->image_version);
        json_decref(j->pcr11);
        json_decref(j->pcr13);
        json_decref(j->golden);
        free(j->fw_sha256);
        free(j->fw_package);
        free(j->fw_version);
        free(j->pcr12);
        json_decref(j->pcr4);
}

static int decode_golden(json_t *v, PolicyJson *j, ApiError *reterr) {
        const char *bank, *key;
        json_t *m, *e;

        if (json_is_null(v)) {
                json_decref(j->golden);
                j->golden = NULL;
                return 0;
        }
        if (!json_is_object(v))
                return type_error(reterr, "golden", v, "map[string]map[int]string");
        if (!j->golden) {
                j->golden = json_object();
                if (!j->golden)
                        return -ENOMEM;
        }
        json_object_foreach(v, bank, m) {
                json_t *dest;

                if (json_is_null(m)) {
                        if (json_object_set_new(j->golden, bank, json_null()) < 0)
                                return -ENOMEM;
                        continue;
                }
                if (!json_is_object(m))
                        return type_error(reterr, "golden", m, "map[int]string");
                dest = json_object_get(j->golden, bank);
                if (!json_is_object(dest)) {
                        dest = json_object();
                        if (!dest || json_object_set_new(j->golden, bank, dest) < 0)
                                return -ENOMEM;
                }
                json_object_foreach(m, key, e) {
                        long long idx;
                        char canon[24];

                        if (!parse_go_int(key, &idx))
                                return attest_error_set(
                                        reterr,
                                        -EBADMSG,
                                        "policy: json: cannot unmarshal number %s into Go value of type int",
                                        key);
                        if (json_is_null(e))
                                e = json_string("");
                        else if (!json_is_string(e))
                                return type_error(reterr, "golden", e, "string");
                        else
                                json_incref(e);
                        (void) snprintf(canon, sizeof(canon), "%lld", idx);
                        if (json_object_set_new(dest, canon, e) < 0)
                                return -ENOMEM;
                }
        }
        return 0;
}

static int decode_firmware(json_t *v, PolicyJson *j, ApiError *reterr) {
        const char *key;
        json_t *e;
        int r;

        if (json_is_null(v))
                return 0;
        if (!json_is_object(v))
                return type_error(reterr, "golden_firmware", v, "attest.GoldenFirmware");
        j->firmware = true;
        json_object_foreach(v, key, e) {
                if (strcasecmp(key, "sha256") == 0)
                        r = take_string(e, "golden_firmware.sha256", &j->fw_sha256, reterr);
                else if (strcasecmp(key, "package") == 0)
                        r = take_string(e, "golden_firmware.package", &j->fw_package, reterr);
                else if (strcasecmp(key, "version") == 0)
                        r = take_string(e, "golden_firmware.version", &j->fw_version, reterr);
                else
                        r = 0;
                if (r < 0)
                        return r;
        }
        return 0;
}

static int decode(json_t *v, PolicyJson *j, ApiError *reterr) {
        const char *key;
        json_t *e;
        int r;

        if (json_is_null(v))
                return 0;
        if (!json_is_object(v))
                return attest_error_set(
                        reterr,
                        -EBADMSG,
                        "policy: json: cannot unmarshal %s into Go value of type attest.Policy",
                        attest_json_go_type(v));

        json_object_foreach(v, key, e) {
                if (strcasecmp(key, "image_id") == 0)
                        r = take_string(e, "image_id", &j->image_id, reterr);
                else if (strcasecmp(key, "image_version") == 0)
                        r = take_string(e, "image_version", &j->image_version, reterr);
                else if (strcasecmp(key, "pcr11") == 0)
                        r = merge_string_map(e, "pcr11", &j->pcr11, reterr);
                else if (strcasecmp(key, "pcr13") == 0)
                        r = merge_string_map(e, "pcr13", &j->pcr13, reterr);
                else if (strcasecmp(key, "golden") == 0)
                        r = decode_golden(e, j, reterr);
                else if (strcasecmp(key, "golden_firmware") == 0)
                        r = decode_firmware(e, j, reterr);
                else if (strcasecmp(key, "pcr12") == 0)
                        r = take_string(e, "pcr12", &j->pcr12, reterr);
                else if (strcasecmp(key, "pcr4") == 0) {
                        /* validated as a whole below; null leaves it unset */
                        json_decref(j->pcr4);
                        j->pcr4 = json_is_null(e) ? NULL : json_incref(e);
                        r = 0;
                } else
                        r = 0;
                if (r < 0)
                        return r;
        }
        return 0;
}

/* checkDigest: 32 bytes of hex, kept lowercased. The error text follows "<what>: ". */
static int check_digest(const char *s, char out[static ATTEST_SHA256_HEX + 1], char **ret_error) {
        _cleanup_free_ uint8_t *b = NULL;
        _cleanup_free_ char *goerr = NULL;
        size_t n = 0;
        int r;

        r = attest_hex_decode(s, strlen(s), &b, &n, &goerr);
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                asprintf_or_null(ret_error, "not hex: %s", goerr ?: "invalid hex");
                return -EINVAL;
        }
        if (n != ATTEST_SHA256_SIZE) {
                asprintf_or_null(ret_error, "%zu bytes, want %u", n, ATTEST_SHA256_SIZE);
                return -EINVAL;
        }
        hex_format(b, n, out);
        return 0;
}

/* One way of booting of "pcr4": {"events": [{"type", "sha256", "what"}, …], "value"}, the value
 * being what the events replay to (a policy that contradicts itself is refused). */
static int validate_pcr4_boot(const char *name, json_t *v, AttestExpectedPcr *x, ApiError *reterr) {
        _cleanup_free_ char *q = attest_go_quote(name, strlen(name)), *err = NULL;
        char value[ATTEST_SHA256_HEX + 1], got[ATTEST_SHA256_HEX + 1];
        json_t *events = json_object_get(v, "events"), *e;
        size_t i;
        int r;

        if (!q)
                return -ENOMEM;
        if (!json_is_object(v) || !json_is_array(events) || json_array_size(events) == 0 ||
            json_array_size(events) > ATTEST_EXPECTED_EVENTS_MAX ||
            !json_is_string(json_object_get(v, "value")))
                return attest_error_set(
                        reterr,
                        -EINVAL,
                        "policy: pcr4[%s] is not {\"events\": [1 to %u events], \"value\": \"<hex>\"}",
                        q,
                        ATTEST_EXPECTED_EVENTS_MAX);
        x->name = strdup(name);
        if (!x->name)
                return -ENOMEM;
        json_array_foreach(events, i, e) {
                const char *type = json_string_value(json_object_get(e, "type")),
                           *sha = json_string_value(json_object_get(e, "sha256")),
                           *what = json_string_value(json_object_get(e, "what"));
                char hex[ATTEST_SHA256_HEX + 1];
                uint8_t digest[ATTEST_SHA256_SIZE];
                uint32_t t = attest_event_type_from_string(type);

                if (t == 0)
                        return attest_error_set(
                                reterr,
                                -EINVAL,
                                "policy: pcr4[%s].events[%zu]: type %s is not one of EV_EFI_ACTION, EV_SEPARATOR, "
                                "EV_EFI_BOOT_SERVICES_APPLICATION",
                                q,
                                i,
                                type ?: "(none)");
                r = check_digest(sha ?: "", hex, &err);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return attest_error_set(
                                reterr, r, "policy: pcr4[%s].events[%zu].sha256: %s", q, i, err);
                (void) hex_decode(
                        hex, ATTEST_SHA256_HEX, /* lower_only= */ false, digest, /* reterr_offset= */ NULL);
                r = attest_expected_pcr_add(x, t, digest, what);
                if (r < 0)
                        return r;
        }
        r = check_digest(json_string_value(json_object_get(v, "value")), value, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return attest_error_set(reterr, r, "policy: pcr4[%s].value: %s", q, err);
        r = attest_expected_pcr_seal(x);
        if (r < 0)
                return r;
        if (!streq(hex_format(x->value, ATTEST_SHA256_SIZE, got), value))
                return attest_error_set(
                        reterr,
                        -EINVAL,
                        "policy: pcr4[%s].value is %s, but its events replay to %s",
                        q,
                        value,
                        got);
        return 0;
}

static int validate(const PolicyJson *j, AttestPolicy *p, ApiError *reterr) {
        static const char *const phases[] = { ATTEST_PHASE_INITRD, ATTEST_PHASE_READY };
        const char *key;
        json_t *e;
        int r;

        for (size_t i = 0; i < ELEMENTSOF(phases); i++) {
                _cleanup_free_ char *err = NULL;
                json_t *s = j->pcr11 ? json_object_get(j->pcr11, phases[i]) : NULL;

                if (!s)
                        return attest_error_set(reterr, -EINVAL, "policy: pcr11 lacks phase \"%s\"", phases[i]);
                r = check_digest(json_string_value(s), i == 0 ? p->pcr11_initrd : p->pcr11_ready, &err);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return attest_error_set(reterr, r, "policy: pcr11[\"%s\"]: %s", phases[i], err);
        }

        if (j->pcr13) {
                p->pcr13 = calloc(MAX(json_object_size(j->pcr13), (size_t) 1), sizeof(AttestPcr13Entry));
                if (!p->pcr13)
                        return -ENOMEM;
                json_object_foreach(j->pcr13, key, e) {
                        _cleanup_free_ char *err = NULL, *q = NULL;
                        AttestPcr13Entry *x = p->pcr13 + p->n_pcr13;

                        if (!*key)
                                return attest_error_set(
                                        reterr,
                                        -EINVAL,
                                        "policy: pcr13 has an entry without a kubernetes version");
                        r = check_digest(json_string_value(e), x->value, &err);
                        if (r == -ENOMEM)
                                return r;
                        if (r < 0) {
                                q = attest_go_quote(key, strlen(key));
                                return attest_error_set(reterr, r, "policy: pcr13[%s]: %s", q ?: "\"?\"", err);
                        }
                        x->kubernetes_version = strdup(key);
                        if (!x->kubernetes_version)
                                return -ENOMEM;
                        p->n_pcr13++;
                }
        }

        if (j->firmware) {
                _cleanup_free_ char *err = NULL;

                r = check_digest(j->fw_sha256 ?: "", p->golden_firmware_sha256, &err);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return attest_error_set(reterr, r, "policy: golden_firmware.sha256: %s", err);
                p->has_golden_firmware = true;
                if (j->fw_package) {
                        p->golden_firmware_package = strdup(j->fw_package);
                        if (!p->golden_firmware_package)
                                return -ENOMEM;
                }
                if (j->fw_version) {
                        p->golden_firmware_version = strdup(j->fw_version);
                        if (!p->golden_firmware_version)
                                return -ENOMEM;
                }
        }

        if (j->golden) {
                const char *bank;
                json_t *values;

                json_object_foreach(j->golden, bank, values) {
                        if (!streq(bank, "sha256")) {
                                _cleanup_free_ char *q = attest_go_quote(bank, strlen(bank));
                                return attest_error_set(
                                        reterr,
                                        -EINVAL,
                                        "policy: golden bank %s is not supported, only sha256",
                                        q ?: "\"?\"");
                        }
                        json_object_foreach(values, key, e) {
                                _cleanup_free_ char *err = NULL;
                                long long idx;

                                if (!parse_go_int(key, &idx)) /* canonical since decode_golden() */
                                        return -EINVAL;
                                if (idx < 0 || idx >= (long long) ATTEST_PCR_POLICY_MAX)
                                        return attest_error_set(
                                                reterr,
                                                -EINVAL,
                                                "policy: golden.sha256: pcr index %lld out of range",
                                                idx);
                                r = check_digest(json_string_value(e), p->golden[idx], &err);
                                if (r == -ENOMEM)
                                        return r;
                                if (r < 0)
                                        return attest_error_set(
                                                reterr, r, "policy: golden.sha256[%lld]: %s", idx, err);
                        }
                }
        }

        if (j->pcr12) {
                /* Only the known words: a later kind of PCR 12 expectation must not be read as one
                 * of these by a verifier that does not know it. */
                if (streq(j->pcr12, ATTEST_POLICY_PCR12_CREDENTIALS))
                        p->pcr12_credentials = true;
                else if (!streq(j->pcr12, ATTEST_POLICY_PCR12_PREDICTED)) {
                        _cleanup_free_ char *q = attest_go_quote(j->pcr12, strlen(j->pcr12));
                        return attest_error_set(
                                reterr,
                                -EINVAL,
                                "policy: pcr12 %s is not supported, only \"" ATTEST_POLICY_PCR12_PREDICTED
                                "\" or \"" ATTEST_POLICY_PCR12_CREDENTIALS "\"",
                                q ?: "\"?\"");
                }
                p->pcr12_predicted = true;
        }

        if (j->pcr4) {
                if (!json_is_object(j->pcr4) || json_object_size(j->pcr4) == 0 ||
                    json_object_size(j->pcr4) > ATTEST_EXPECTED_BOOTS_MAX)
                        return attest_error_set(
                                reterr,
                                -EINVAL,
                                "policy: pcr4 is not an object of 1 to %u ways of booting",
                                ATTEST_EXPECTED_BOOTS_MAX);
                json_object_foreach(j->pcr4, key, e) {
                        r = validate_pcr4_boot(key, e, p->pcr4 + p->n_pcr4, reterr);
                        p->n_pcr4++; /* freed with the policy, even half filled */
                        if (r < 0)
                                return r;
                }
        }

        if (j->image_id) {
                p->image_id = strdup(j->image_id);
                if (!p->image_id)
                        return -ENOMEM;
        }
        if (j->image_version) {
                p->image_version = strdup(j->image_version);
                if (!p->image_version)
                        return -ENOMEM;
        }
        return 0;
}

int attest_policy_from_json(json_t *v, AttestPolicy **ret, ApiError *reterr) {
        _cleanup_(attest_policy_freep) AttestPolicy *p = NULL;
        PolicyJson j = {};
        int r;

        assert_return(v, -EINVAL);
        assert_return(ret, -EINVAL);

        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;

        r = decode(v, &j, reterr);
        if (r >= 0)
                r = validate(&j, p, reterr);
        policy_json_done(&j);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(p);
        return 0;
}

int attest_policy_parse(const void *data, size_t size, AttestPolicy **ret, ApiError *reterr) {
        json_auto_t *v = NULL;
        json_error_t err;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        v = json_loadb(data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (!v)
                return attest_error_set(
                        reterr, -EBADMSG, "policy: %s at line %d, column %d", err.text, err.line, err.column);
        return attest_policy_from_json(v, ret, reterr);
}

AttestPolicy *attest_policy_free(AttestPolicy *p) {
        if (!p)
                return NULL;
        free(p->image_id);
        free(p->image_version);
        for (size_t i = 0; i < p->n_pcr13; i++)
                free(p->pcr13[i].kubernetes_version);
        free(p->pcr13);
        free(p->golden_firmware_package);
        free(p->golden_firmware_version);
        for (size_t i = 0; i < p->n_pcr4; i++)
                attest_expected_pcr_done(p->pcr4 + i);
        return mfree(p);
}

const char *attest_policy_pcr11(const AttestPolicy *p, const char *phase) {
        if (!p || !phase)
                return NULL;
        if (streq(phase, ATTEST_PHASE_INITRD))
                return p->pcr11_initrd;
        if (streq(phase, ATTEST_PHASE_READY))
                return p->pcr11_ready;
        return NULL;
}

const char *attest_policy_expected(
        const AttestPolicy *p, unsigned index, const char *kubernetes_version, const char **ret_kubernetes) {
        if (ret_kubernetes)
                *ret_kubernetes = NULL;
        if (!p)
                return NULL;
        if (index == 13 && kubernetes_version && *kubernetes_version)
                for (size_t i = 0; i < p->n_pcr13; i++)
                        if (streq(p->pcr13[i].kubernetes_version, kubernetes_version)) {
                                if (ret_kubernetes)
                                        *ret_kubernetes = p->pcr13[i].kubernetes_version;
                                return p->pcr13[i].value;
                        }
        if (index >= ATTEST_PCR_POLICY_MAX || !p->golden[index][0])
                return NULL;
        return p->golden[index];
}

char *attest_sysext_measurement(const char *sha256_hex, const char *file) {
        char *s = NULL;

        if (!sha256_hex || !file)
                return NULL;
        if (asprintf(&s, "%s  %s", sha256_hex, file) < 0)
                return NULL;
        for (char *c = s; *c && c < s + strlen(sha256_hex); c++)
                if (*c >= 'A' && *c <= 'Z')
                        *c = (char) (*c - 'A' + 'a');
        return s;
}

static void extend(uint8_t pcr[static ATTEST_SHA256_SIZE], const char *word) {
        uint8_t buf[2 * ATTEST_SHA256_SIZE];

        memcpy(buf, pcr, ATTEST_SHA256_SIZE);
        (void) EVP_Digest(word, strlen(word), buf + ATTEST_SHA256_SIZE, NULL, EVP_sha256(), NULL);
        (void) EVP_Digest(buf, sizeof(buf), pcr, NULL, EVP_sha256(), NULL);
}

void attest_sysext_pcr(const char *measurement, char ret[static ATTEST_SHA256_HEX + 1]) {
        uint8_t pcr[ATTEST_SHA256_SIZE] = {};

        extend(pcr, ATTEST_OS_SEPARATOR);
        if (measurement)
                extend(pcr, measurement);
        hex_format(pcr, sizeof(pcr), ret);
}
