/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The guest half of credential activation (agent_tpm_activate_credential()) against a swtpm, with
 * the credentials the daemon's half (attest_make_credential()) makes from what the agent reports:
 * its AK's public area and its EK's. The secret comes back; a credential for another AK, for
 * another TPM's EK or altered on the way is refused; no transient object or session is left in the
 * TPM (a swtpm has no resource manager, so a leak there would pile up across boots' attestations).
 * Skips without swtpm. */
#include <tss2/tss2_mu.h>
#include <tss2/tss2_tctildr.h>

#include "test-swtpm.h"
#include "test-util.h"

#include "agent-tpm.h"
#include "attest-credential.h"

static const uint8_t secret[32] = "credential for the vm's own ak!";

typedef struct Fixture {
        TestSwtpm swtpm;
        AgentTpm *tpm;
        ESYS_TR ak;
        TPM2B_PUBLIC ak_public;
        TPMT_PUBLIC ek; /* as the daemon parsed it from the agent's ek_pub */
        TPM2B_NAME ak_name;
} Fixture;

static int setup(void **state) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        Fixture *f = calloc(1, sizeof(Fixture));
        uint8_t buf[sizeof(TPM2B_PUBLIC)];
        TPM2B_PUBLIC ek_public;
        size_t off = 0;

        assert_non_null(f);
        assert_true(test_swtpm_start(&f->swtpm));
        *state = f;

        assert_ok(agent_tpm_open(f->swtpm.tcti, &f->tpm, &err));
        assert_ok(agent_tpm_ensure_ak(f->tpm, &f->ak, &f->ak_public, &err));
        assert_ok(agent_tpm_ek_public(f->tpm, &ek_public, &err));

        /* What the daemon does with the quote request's ek_pub and ak_pub. */
        assert_int_equal(Tss2_MU_TPM2B_PUBLIC_Marshal(&ek_public, buf, sizeof(buf), &off), TSS2_RC_SUCCESS);
        assert_ok(attest_ek_public_parse(buf, off, &f->ek, &err));
        assert_ok(attest_tpm_name(&f->ak_public.publicArea, &f->ak_name));
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        if (f) {
                agent_tpm_free(f->tpm);
                test_swtpm_stop(&f->swtpm);
                free(f);
        }
        return 0;
}

/* The first handles of the ranges counted. tss2's TPM2_*_FIRST macros shift a signed int into its
 * sign bit, which the undefined-behaviour sanitizer rejects. */
#define TRANSIENT_FIRST UINT32_C(0x80000000)
#define LOADED_SESSION_FIRST UINT32_C(0x02000000)
#define PERSISTENT_FIRST UINT32_C(0x81000000)

static int activate(Fixture *f, const AttestCredential *c, TPM2B_DIGEST *ret, char **reterr_message) {
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;
        int r;

        r = agent_tpm_activate_credential(
                f->tpm, f->ak, c->blob, c->blob_size, c->secret, c->secret_size, ret, &err);
        if (r < 0) {
                assert_non_null(err.message);
                if (reterr_message)
                        *reterr_message = TAKE_PTR(err.message);
        }
        return r;
}

static void assert_activates(Fixture *f) {
        TPM2B_DIGEST out = {};
        AttestCredential c;

        assert_ok(attest_make_credential(&f->ek, &f->ak_name, secret, sizeof(secret), &c, NULL));
        assert_ok(activate(f, &c, &out, NULL));
        assert_int_equal(out.size, sizeof(secret));
        assert_memory_equal(out.buffer, secret, sizeof(secret));
}

/* Counts the handles of one range (transient objects, loaded sessions) through a TPM connection of
 * the test's own, after the agent's is closed: swtpm serves one client at a time. */
static uint32_t count_handles(Fixture *f, TPM2_HANDLE first) {
        _cleanup_free_ TPMS_CAPABILITY_DATA *data = NULL;
        TSS2_TCTI_CONTEXT *tcti = NULL;
        ESYS_CONTEXT *esys = NULL;
        uint32_t n;

        f->tpm = agent_tpm_free(f->tpm);
        assert_int_equal(Tss2_TctiLdr_Initialize(f->swtpm.tcti, &tcti), TSS2_RC_SUCCESS);
        assert_int_equal(Esys_Initialize(&esys, tcti, NULL), TSS2_RC_SUCCESS);
        assert_int_equal(
                Esys_GetCapability(
                        esys, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, TPM2_CAP_HANDLES, first, 64, NULL, &data),
                TSS2_RC_SUCCESS);
        n = data->data.handles.count;
        Esys_Finalize(&esys);
        Tss2_TctiLdr_Finalize(&tcti);
        return n;
}

static void test_activate(void **state) {
        Fixture *f = *state;

        assert_activates(f);
        /* Again: the first activation left the TPM as it found it. */
        assert_activates(f);

        assert_int_equal(count_handles(f, TRANSIENT_FIRST), 0);
        assert_int_equal(count_handles(f, LOADED_SESSION_FIRST), 0);
}

static void test_refused(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *m1 = NULL, *m2 = NULL, *m3 = NULL, *m4 = NULL;
        _cleanup_free_ uint8_t *other = NULL;
        TPM2B_NAME name = f->ak_name;
        TPMT_PUBLIC other_ek;
        TPM2B_DIGEST out = { .size = 7 };
        AttestCredential c;
        size_t other_size = 0;
        int r2;
        const char *dir = getenv("VM_MANAGER_TEST_DATA");
        _cleanup_free_ char *path = NULL;

        /* For another AK. */
        name.name[5] ^= 0x80;
        assert_ok(attest_make_credential(&f->ek, &name, secret, sizeof(secret), &c, NULL));
        assert_errno(activate(f, &c, &out, &m1), -EPERM);
        assert_true(strneq(m1, "activate credential: refused by the tpm", 39));

        /* Wrapped for another TPM's EK (tests/data's, from another swtpm). */
        assert_non_null(dir);
        assert_true(asprintf(&path, "%s/attest/credential/ek.pub", dir) > 0);
        assert_ok(read_full_file(path, 4096, (char **) &other, &other_size));
        assert_ok(attest_ek_public_parse(other, other_size, &other_ek, NULL));
        assert_ok(attest_make_credential(&other_ek, &f->ak_name, secret, sizeof(secret), &c, NULL));
        /* A real TPM answers TPM_RC_VALUE when the seed does not decrypt; swtpm 0.7.1 (libtpms 0.9)
         * answers TPM_RC_FAILURE, yet goes on working, as tpm2_activatecredential shows too. */
        r2 = activate(f, &c, &out, &m2);
        assert_true(r2 == -EPERM || r2 == -EIO);
        assert_true(strneq(m2, "activate credential: ", 21));

        /* Altered on the way. */
        assert_ok(attest_make_credential(&f->ek, &f->ak_name, secret, sizeof(secret), &c, NULL));
        c.blob[c.blob_size - 1] ^= 1;
        assert_errno(activate(f, &c, &out, &m3), -EPERM);

        /* Not the structures at all. */
        c.blob_size--;
        assert_errno(activate(f, &c, &out, &m4), -EBADMSG);
        assert_string_equal(m4, "credential blob is not a TPM2B_ID_OBJECT");
        assert_int_equal(out.size, 7);

        /* None of it broke the next, honest, activation. */
        assert_activates(f);
        assert_int_equal(count_handles(f, TRANSIENT_FIRST), 0);
        assert_int_equal(count_handles(f, LOADED_SESSION_FIRST), 0);
}

/* With the EK persisted at 0x81010001 (as swtpm_setup leaves it), that one is used and stays. */
static void test_persistent_ek(void **state) {
        Fixture *f = *state;
        _cleanup_(api_error_done) ApiError err = API_ERROR_NULL;

        if (!test_have("tpm2_createek"))
                skip();
        f->tpm = agent_tpm_free(f->tpm);
        assert_int_equal(
                test_swtpm_sh(&f->swtpm, "tpm2_createek -c 0x81010001 -G rsa -u ek.pub && tpm2_flushcontext -t"),
                0);
        assert_ok(agent_tpm_open(f->swtpm.tcti, &f->tpm, &err));
        assert_ok(agent_tpm_ensure_ak(f->tpm, &f->ak, &f->ak_public, &err));

        assert_activates(f);
        assert_activates(f);
        assert_int_equal(count_handles(f, TRANSIENT_FIRST), 0);
        assert_int_equal(count_handles(f, PERSISTENT_FIRST), 2); /* the AK and the EK */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_activate, setup, teardown),
                cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
                cmocka_unit_test_setup_teardown(test_persistent_ek, setup, teardown),
        };

        if (!test_have("swtpm")) {
                printf("1..0 # SKIP swtpm missing (package swtpm)\n");
                return 0;
        }
        return cmocka_run_group_tests(tests, NULL, NULL);
}
