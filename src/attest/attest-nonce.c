/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <sys/random.h>

#include "attest-nonce.h"
#include "attest-util.h"

typedef struct NonceEntry {
        char nonce[ATTEST_NONCE_HEX + 1];
        usec_t issued;
} NonceEntry;

/* One VM's outstanding nonces, oldest first. */
typedef struct NonceVm {
        char *vm_id;
        size_t n;
        NonceEntry entries[ATTEST_NONCES_PER_VM];
} NonceVm;

struct AttestNonceStore {
        NonceVm **vms;
        size_t n_vms, n_allocated;
};

int attest_nonce_store_new(AttestNonceStore **ret) {
        AttestNonceStore *s;

        assert_return(ret, -EINVAL);

        s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}

static NonceVm *nonce_vm_free(NonceVm *v) {
        if (!v)
                return NULL;
        free(v->vm_id);
        return mfree(v);
}

AttestNonceStore *attest_nonce_store_free(AttestNonceStore *s) {
        if (!s)
                return NULL;
        for (size_t i = 0; i < s->n_vms; i++)
                nonce_vm_free(s->vms[i]);
        free(s->vms);
        return mfree(s);
}

static bool expired(usec_t issued, usec_t now) {
        /* a clock that went backwards makes a nonce younger, never older */
        return now > issued && now - issued > ATTEST_NONCE_TTL;
}

static void sweep(AttestNonceStore *s, usec_t now) {
        size_t k = 0;

        for (size_t i = 0; i < s->n_vms; i++) {
                NonceVm *v = s->vms[i];
                size_t m = 0;

                for (size_t j = 0; j < v->n; j++)
                        if (!expired(v->entries[j].issued, now))
                                v->entries[m++] = v->entries[j];
                v->n = m;
                if (m == 0)
                        nonce_vm_free(v);
                else
                        s->vms[k++] = v;
        }
        s->n_vms = k;
}

static NonceVm *find_vm(const AttestNonceStore *s, const char *vm_id) {
        for (size_t i = 0; i < s->n_vms; i++)
                if (streq(s->vms[i]->vm_id, vm_id))
                        return s->vms[i];
        return NULL;
}

static int add(AttestNonceStore *s, const char *vm_id, const char *nonce, usec_t now) {
        NonceVm *v;

        sweep(s, now);

        v = find_vm(s, vm_id);
        if (!v) {
                if (s->n_vms == s->n_allocated) {
                        size_t n = MAX(s->n_allocated * 2, (size_t) 8);
                        NonceVm **t = reallocarray(s->vms, n, sizeof(NonceVm *));
                        if (!t)
                                return -ENOMEM;
                        s->vms = t;
                        s->n_allocated = n;
                }
                v = calloc(1, sizeof(*v));
                if (!v)
                        return -ENOMEM;
                v->vm_id = strdup(vm_id);
                if (!v->vm_id) {
                        free(v);
                        return -ENOMEM;
                }
                s->vms[s->n_vms++] = v;
        }

        if (v->n == ATTEST_NONCES_PER_VM) {
                memmove(v->entries, v->entries + 1, (v->n - 1) * sizeof(NonceEntry));
                v->n--;
        }
        memcpy(v->entries[v->n].nonce, nonce, ATTEST_NONCE_HEX + 1);
        v->entries[v->n].issued = now;
        v->n++;
        return 0;
}

int attest_nonce_issue(AttestNonceStore *s, const char *vm_id, usec_t now, char ret[static ATTEST_NONCE_HEX + 1]) {
        uint8_t raw[ATTEST_NONCE_BYTES];
        char nonce[ATTEST_NONCE_HEX + 1];
        size_t got = 0;
        int r;

        assert_return(s, -EINVAL);
        assert_return(vm_id, -EINVAL);

        while (got < sizeof(raw)) {
                ssize_t k = getrandom(raw + got, sizeof(raw) - got, 0);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                got += (size_t) k;
        }
        hex_format(raw, sizeof(raw), nonce);

        r = add(s, vm_id, nonce, now);
        if (r < 0)
                return r;
        memcpy(ret, nonce, sizeof(nonce));
        return 0;
}

int attest_nonce_add(AttestNonceStore *s, const char *vm_id, const char *nonce, usec_t now) {
        assert_return(s, -EINVAL);
        assert_return(vm_id, -EINVAL);
        assert_return(nonce, -EINVAL);

        if (strlen(nonce) != ATTEST_NONCE_HEX || strspn(nonce, "0123456789abcdef") != ATTEST_NONCE_HEX)
                return -EINVAL;
        return add(s, vm_id, nonce, now);
}

bool attest_nonce_consume(AttestNonceStore *s, const char *vm_id, const char *nonce, usec_t now) {
        bool found = false, valid = false;
        size_t len;
        NonceVm *v;

        if (!s || !vm_id || !nonce)
                return false;

        len = strlen(nonce);
        v = find_vm(s, vm_id);
        for (size_t j = 0; v && j < v->n; j++)
                if (attest_memeq(v->entries[j].nonce, ATTEST_NONCE_HEX, nonce, len)) {
                        found = true;
                        valid = !expired(v->entries[j].issued, now);
                        memmove(v->entries + j, v->entries + j + 1, (v->n - j - 1) * sizeof(NonceEntry));
                        v->n--;
                        break;
                }
        sweep(s, now);
        return found && valid;
}

void attest_nonce_forget(AttestNonceStore *s, const char *vm_id) {
        if (!s || !vm_id)
                return;
        for (size_t i = 0; i < s->n_vms; i++)
                if (streq(s->vms[i]->vm_id, vm_id)) {
                        nonce_vm_free(s->vms[i]);
                        memmove(s->vms + i, s->vms + i + 1, (s->n_vms - i - 1) * sizeof(NonceVm *));
                        s->n_vms--;
                        return;
                }
}

size_t attest_nonce_count(const AttestNonceStore *s, const char *vm_id) {
        NonceVm *v;

        if (!s || !vm_id)
                return 0;
        v = find_vm(s, vm_id);
        return v ? v->n : 0;
}

size_t attest_nonce_vm_count(const AttestNonceStore *s) {
        return s ? s->n_vms : 0;
}
