/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "attest-request.h"
#include "cleanup.h"

void attest_quote_request_done(AttestQuoteRequest *r) {
        if (!r)
                return;
        free(r->stage);
        free(r->nonce);
        free(r->ak_pub);
        free(r->ek_pub);
        free(r->quote);
        free(r->signature);
        for (size_t i = 0; i < ATTEST_PCR_SLOTS; i++)
                free(r->pcrs_sha256[i]);
        free(r->event_log);
        free(r->userspace_log);
        *r = (AttestQuoteRequest){};
}

static int malformed_type(ApiError *reterr, const char *field, const json_t *v, const char *type) {
        return attest_error_set(
                reterr,
                -EBADMSG,
                "malformed quote: json: cannot unmarshal %s into Go struct field QuoteRequest.%s of type %s",
                attest_json_go_type(v),
                field,
                type);
}

/* A text field; NUL characters are refused, as nothing valid carries one. */
static int take_text(json_t *v, const char *field, const char *type, size_t max, char **dest, ApiError *reterr) {
        size_t n;
        char *s;

        if (json_is_null(v))
                return 0;
        if (!json_is_string(v))
                return malformed_type(reterr, field, v, type);
        n = json_string_length(v);
        if (memchr(json_string_value(v), 0, n))
                return attest_error_set(
                        reterr, -EBADMSG, "malformed quote: %s contains a NUL character", field);
        if (n > max)
                return attest_error_set(
                        reterr, -EFBIG, "malformed quote: %s is over %zu characters", field, max);
        s = strdup(json_string_value(v));
        if (!s)
                return -ENOMEM;
        free(*dest);
        *dest = s;
        return 0;
}

static int take_bytes(
        json_t *v, const char *field, size_t max, uint8_t **dest, size_t *dest_size, ApiError *reterr) {
        _cleanup_free_ char *goerr = NULL;
        uint8_t *b = NULL;
        size_t n = 0;
        int r;

        if (json_is_null(v)) {
                *dest = mfree(*dest);
                *dest_size = 0;
                return 0;
        }
        if (!json_is_string(v))
                return malformed_type(reterr, field, v, "[]uint8");
        r = attest_base64_decode(json_string_value(v), json_string_length(v), max, &b, &n, &goerr);
        if (r == -EFBIG)
                return attest_error_set(reterr, r, "malformed quote: %s is over %zu bytes", field, max);
        if (r == -EINVAL)
                return attest_error_set(
                        reterr, -EBADMSG, "malformed quote: %s", goerr ?: "illegal base64 data");
        if (r < 0)
                return r;
        free(*dest);
        *dest = b;
        *dest_size = n;
        return 0;
}

/* "0"…"31" exactly as fmt.Sprint writes an index; anything else is a key no lookup finds. */
static int pcr_index(const char *key) {
        if (key[0] < '0' || key[0] > '9' || (key[0] == '0' && key[1]))
                return -1;
        if (!key[1])
                return key[0] - '0';
        if (key[1] < '0' || key[1] > '9' || key[2])
                return -1;
        int i = (key[0] - '0') * 10 + key[1] - '0';
        return i < (int) ATTEST_PCR_SLOTS ? i : -1;
}

static int take_pcrs(json_t *v, AttestQuoteRequest *req, ApiError *reterr) {
        const char *bank, *key;
        json_t *m, *e;

        if (json_is_null(v)) {
                /* Go: a null map is a nil map */
                for (size_t i = 0; i < ATTEST_PCR_SLOTS; i++)
                        req->pcrs_sha256[i] = mfree(req->pcrs_sha256[i]);
                req->n_pcr_banks = 0;
                return 0;
        }
        if (!json_is_object(v))
                return malformed_type(reterr, "pcrs", v, "map[string]map[string]string");
        if (json_object_size(v) > ATTEST_PCR_BANKS_MAX)
                return attest_error_set(
                        reterr, -EFBIG, "malformed quote: pcrs has over %u banks", ATTEST_PCR_BANKS_MAX);

        /* a second "pcrs" key merges into the first, as Go's decoder reuses the map */
        json_object_foreach(v, bank, m) {
                bool sha256 = streq(bank, "sha256");

                if (!json_is_null(m) && !json_is_object(m))
                        return malformed_type(reterr, "pcrs", m, "map[string]string");
                if (json_object_size(m) > ATTEST_PCRS_PER_BANK_MAX)
                        return attest_error_set(
                                reterr,
                                -EFBIG,
                                "malformed quote: a pcrs bank has over %u values",
                                ATTEST_PCRS_PER_BANK_MAX);
                json_object_foreach(m, key, e) {
                        _cleanup_free_ char *s = NULL;
                        int i;

                        if (json_is_null(e))
                                e = NULL;
                        else if (!json_is_string(e))
                                return malformed_type(reterr, "pcrs", e, "string");
                        if (e && memchr(json_string_value(e), 0, json_string_length(e)))
                                return attest_error_set(
                                        reterr,
                                        -EBADMSG,
                                        "malformed quote: pcrs value contains a NUL character");
                        if (e && json_string_length(e) > ATTEST_PCR_VALUE_MAX)
                                return attest_error_set(
                                        reterr,
                                        -EFBIG,
                                        "malformed quote: pcrs value is over %zu characters",
                                        ATTEST_PCR_VALUE_MAX);
                        i = pcr_index(key);
                        if (!sha256 || i < 0)
                                continue;
                        s = strdup(e ? json_string_value(e) : "");
                        if (!s)
                                return -ENOMEM;
                        free(req->pcrs_sha256[i]);
                        req->pcrs_sha256[i] = TAKE_PTR(s);
                }
        }
        /* banks are counted as Go's len(map) counts them, so merged keys count once */
        req->n_pcr_banks = MAX(req->n_pcr_banks, (unsigned) json_object_size(v));
        return 0;
}

static bool all_space(const char *s, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (!strchr(" \t\r\n", s[i]))
                        return false;
        return true;
}

int attest_quote_request_decode(const void *body, size_t size, AttestQuoteRequest *ret, ApiError *reterr) {
        _cleanup_(attest_quote_request_done) AttestQuoteRequest req = {};
        json_auto_t *v = NULL;
        json_error_t err;
        const char *key;
        json_t *e;
        int r;

        assert_return(body || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        if (all_space(body, size))
                return attest_error_set(reterr, -EBADMSG, "malformed quote: EOF");
        /* Go's Decoder reads one value and leaves the rest of the body alone */
        v = json_loadb(body, size, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &err);
        if (!v) {
                if (json_error_code(&err) == json_error_premature_end_of_input)
                        return attest_error_set(reterr, -EBADMSG, "malformed quote: unexpected EOF");
                return attest_error_set(
                        reterr,
                        -EBADMSG,
                        "malformed quote: %s at line %d, column %d",
                        err.text,
                        err.line,
                        err.column);
        }

        if (!json_is_null(v) && !json_is_object(v))
                return attest_error_set(
                        reterr,
                        -EBADMSG,
                        "malformed quote: json: cannot unmarshal %s into Go value of type imds.QuoteRequest",
                        attest_json_go_type(v));

        json_object_foreach(v, key, e) {
                if (strcasecmp(key, "stage") == 0)
                        r = take_text(e, "stage", "imds.Stage", 64, &req.stage, reterr);
                else if (strcasecmp(key, "nonce") == 0)
                        r = take_text(e, "nonce", "string", ATTEST_NONCE_MAX, &req.nonce, reterr);
                else if (strcasecmp(key, "ak_pub") == 0)
                        r = take_bytes(e, "ak_pub", ATTEST_PUBLIC_MAX, &req.ak_pub, &req.ak_pub_size, reterr);
                else if (strcasecmp(key, "ek_pub") == 0)
                        r = take_bytes(e, "ek_pub", ATTEST_PUBLIC_MAX, &req.ek_pub, &req.ek_pub_size, reterr);
                else if (strcasecmp(key, "quote") == 0)
                        r = take_bytes(e, "quote", ATTEST_QUOTE_MAX, &req.quote, &req.quote_size, reterr);
                else if (strcasecmp(key, "signature") == 0)
                        r = take_bytes(
                                e, "signature", ATTEST_SIGNATURE_MAX, &req.signature, &req.signature_size, reterr);
                else if (strcasecmp(key, "pcrs") == 0)
                        r = take_pcrs(e, &req, reterr);
                else if (strcasecmp(key, "event_log") == 0)
                        r = take_bytes(
                                e, "event_log", ATTEST_LOG_MAX, &req.event_log, &req.event_log_size, reterr);
                else if (strcasecmp(key, "userspace_log") == 0)
                        r = take_bytes(
                                e,
                                "userspace_log",
                                ATTEST_LOG_MAX,
                                &req.userspace_log,
                                &req.userspace_log_size,
                                reterr);
                else
                        r = 0;
                if (r < 0)
                        return r;
        }

        if (!req.stage || (!streq(req.stage, "initrd") && !streq(req.stage, "ready")))
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "stage must be \"initrd\" or \"ready\"");
        if (!req.nonce || !req.nonce[0])
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "nonce is required");
        if (req.ak_pub_size == 0 || req.quote_size == 0 || req.signature_size == 0)
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "ak_pub, quote and signature are required");
        if (req.n_pcr_banks == 0)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "pcrs is required");

        *ret = req;
        req = (AttestQuoteRequest){};
        return 0;
}

json_t *attest_quote_result_to_json(const char *stage, bool verified, const char *message) {
        json_auto_t *o = NULL;

        o = json_pack(
                "{s:s,s:b,s:b}",
                "stage",
                stage ?: "",
                "verified",
                verified,
                "user_data_released",
                verified && stage && streq(stage, "initrd"));
        if (!o)
                return NULL;
        if (message && *message && json_object_set_new(o, "message", json_string(message)) < 0)
                return NULL;
        return TAKE_PTR(o);
}

void attest_challenge_request_done(AttestChallengeRequest *r) {
        if (!r)
                return;
        free(r->ak_pub);
        free(r->ek_pub);
        *r = (AttestChallengeRequest){};
}

/* The body as one JSON object and nothing else; what names the request in messages. */
static int load_object(const void *body, size_t size, const char *what, json_t **ret, ApiError *reterr) {
        json_error_t err;
        json_t *v;

        assert_return(body || size == 0, -EINVAL);
        v = json_loadb(body, size, JSON_REJECT_DUPLICATES, &err);
        if (!v)
                return attest_error_set(
                        reterr,
                        -EBADMSG,
                        "malformed %s: %s at line %d, column %d",
                        what,
                        err.text,
                        err.line,
                        err.column);
        if (!json_is_object(v)) {
                json_decref(v);
                return attest_error_set(reterr, -EBADMSG, "malformed %s: the body is not a JSON object", what);
        }
        *ret = v;
        return 0;
}

/* A base64 field of at most max bytes. */
static int take_strict_bytes(
        json_t *v,
        const char *what,
        const char *field,
        size_t max,
        uint8_t **ret,
        size_t *ret_size,
        ApiError *reterr) {
        _cleanup_free_ char *goerr = NULL;
        int r;

        if (!json_is_string(v))
                return attest_error_set(
                        reterr, -EBADMSG, "malformed %s: %s must be a base64 string", what, field);
        r = attest_base64_decode(json_string_value(v), json_string_length(v), max, ret, ret_size, &goerr);
        if (r == -EFBIG)
                return attest_error_set(reterr, r, "malformed %s: %s is over %zu bytes", what, field, max);
        if (r == -EINVAL)
                return attest_error_set(
                        reterr, -EBADMSG, "malformed %s: %s: %s", what, field, goerr ?: "illegal base64 data");
        return r;
}

int attest_challenge_request_decode(const void *body, size_t size, AttestChallengeRequest *ret, ApiError *reterr) {
        _cleanup_(attest_challenge_request_done) AttestChallengeRequest req = {};
        json_auto_t *o = NULL;
        const char *key;
        json_t *e;
        int r;

        assert_return(ret, -EINVAL);
        r = load_object(body, size, "challenge", &o, reterr);
        if (r < 0)
                return r;
        json_object_foreach(o, key, e) {
                if (streq(key, "ak_pub"))
                        r = take_strict_bytes(
                                e, "challenge", key, ATTEST_PUBLIC_MAX, &req.ak_pub, &req.ak_pub_size, reterr);
                else if (streq(key, "ek_pub"))
                        r = take_strict_bytes(
                                e, "challenge", key, ATTEST_PUBLIC_MAX, &req.ek_pub, &req.ek_pub_size, reterr);
                else
                        r = attest_error_set(
                                reterr, -EBADMSG, "malformed challenge: unknown field \"%.64s\"", key);
                if (r < 0)
                        return r;
        }
        if (req.ak_pub_size == 0 || req.ek_pub_size == 0)
                return api_error_set(
                        reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "ak_pub and ek_pub are required");
        *ret = req;
        req = (AttestChallengeRequest){};
        return 0;
}

int attest_activate_request_decode(const void *body, size_t size, AttestActivateRequest *ret, ApiError *reterr) {
        _cleanup_free_ uint8_t *secret = NULL;
        json_auto_t *o = NULL;
        size_t n = 0;
        int r;

        assert_return(ret, -EINVAL);
        r = load_object(body, size, "activation", &o, reterr);
        if (r < 0)
                return r;
        /* One key only: anything else in the object is refused by name. */
        for (void *it = json_object_iter(o); it; it = json_object_iter_next(o, it)) {
                const char *key = json_object_iter_key(it);
                json_t *e = json_object_iter_value(it);

                if (!streq(key, "secret"))
                        return attest_error_set(
                                reterr, -EBADMSG, "malformed activation: unknown field \"%.64s\"", key);
                r = take_strict_bytes(e, "activation", key, ATTEST_ACTIVATE_SECRET_MAX, &secret, &n, reterr);
                if (r < 0)
                        return r;
        }
        if (n == 0)
                return api_error_set(reterr, -EINVAL, API_ERROR_INVALID_REQUEST, "secret is required");
        memcpy(ret->secret, secret, n);
        ret->secret_size = n;
        return 0;
}
