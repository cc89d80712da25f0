/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "cleanup.h"
#include "time-util.h"

/* The freshness half of the attestation handshake (reference/network-imds-attest.md §3): the IMDS
 * issues a nonce per GET /attest/nonce and a quote must carry it back as its qualifying data. The
 * store keeps the outstanding nonces per VM, so one nonce proves that it was issued to this VM, is
 * younger than the TTL and was not used before.
 *
 * Time is passed in by the caller (any clock, used consistently; the daemon uses CLOCK_MONOTONIC):
 * a nonce issued at t is valid while now - t <= ATTEST_NONCE_TTL. Expired nonces and VMs left
 * without any are swept on every issue and consume. Not thread-safe; the daemon has one loop. */

#define ATTEST_NONCE_TTL (5 * USEC_PER_MINUTE)
#define ATTEST_NONCES_PER_VM 8U
#define ATTEST_NONCE_BYTES 32U
#define ATTEST_NONCE_HEX (2U * ATTEST_NONCE_BYTES)

typedef struct AttestNonceStore AttestNonceStore;

int attest_nonce_store_new(AttestNonceStore **ret);
AttestNonceStore *attest_nonce_store_free(AttestNonceStore *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(AttestNonceStore *, attest_nonce_store_free);

/* A fresh nonce for vm_id: 32 random bytes as 64 lowercase hex characters. When the VM already has
 * ATTEST_NONCES_PER_VM outstanding, the oldest is dropped first. */
int attest_nonce_issue(AttestNonceStore *s, const char *vm_id, usec_t now, char ret[static ATTEST_NONCE_HEX + 1]);

/* Registers a nonce the caller chose, as if issued at now (same limits as issue). For fixtures
 * whose quotes carry a fixed nonce, and for benchmarks. -EINVAL unless 64 lowercase hex. */
int attest_nonce_add(AttestNonceStore *s, const char *vm_id, const char *nonce, usec_t now);

/* Whether nonce was issued to vm_id within the TTL. The nonce is forgotten either way: each is
 * accepted at most once, and a nonce of another VM is never accepted (nor forgotten). */
bool attest_nonce_consume(AttestNonceStore *s, const char *vm_id, const char *nonce, usec_t now);

/* Drops every nonce of a VM (on delete). */
void attest_nonce_forget(AttestNonceStore *s, const char *vm_id);

/* Outstanding nonces of a VM, expired ones not yet swept included; and VMs that have any. */
size_t attest_nonce_count(const AttestNonceStore *s, const char *vm_id);
size_t attest_nonce_vm_count(const AttestNonceStore *s);
