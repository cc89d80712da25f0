/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "cleanup.h"
#include "operation.h"

/* The instance metadata service (reference/network-imds-attest.md §2): HTTP below /giantswarm/v1,
 * served on connections the gateway hands to each VM's own unix listener (<vm>/imds.sock). The
 * listener a connection came in on is the caller's identity; nothing in the request is believed. */

typedef struct ImdsServer ImdsServer;

/* Registers itself with the manager (manager_set_imds()) and serves from then on. */
int imds_server_new(Manager *m, ImdsServer **ret);
ImdsServer *imds_server_free(ImdsServer *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(ImdsServer *, imds_server_free);

/* Answers every request as the IMDS would for its caller, the VM named by the connection's tag
 * (NULL or unknown: 403). For tests, which hand in connections with http_server_add_connection(). */
void imds_handle(HttpRequest *req, void *userdata);

#define IMDS_FORBIDDEN "forbidden: client address is not a managed VM"
#define IMDS_USER_DATA_GATED "user-data is released after the initrd-stage attestation verifies"
#define IMDS_RETRY_AFTER "2"
#define IMDS_REPORT_MAX ((size_t) 8 << 20)
#define IMDS_REPORT_BUSY "the previous report is still being stored; retry later"
#define IMDS_REPORTS_BUSY "too many reports are being stored; retry later"
#define IMDS_REPORT_RETRY_AFTER "1"
/* A quote's answer may be held while the firmware run of its VM's shape goes on (vm_attest_quote_wait()),
 * one per VM: a newer quote of the same VM answers the older one with this (its agent gave up on it). */
#define IMDS_QUOTE_SUPERSEDED "superseded by a newer quote of this vm"
#define IMDS_QUOTE_BUSY "the quote cannot be held for the firmware run; retry later"

/* Connections: at most IMDS_VM_CONNECTIONS_MAX per VM (a new one beyond closes that VM's idlest) and
 * IMDS_CONNECTIONS_MAX in all; a connection idle for IMDS_IDLE_TIMEOUT is closed, and one that takes
 * longer than IMDS_REQUEST_TIMEOUT to deliver a request. A sysupdate file is sent as long as the guest
 * reads it, however long that takes. */
#define IMDS_VM_CONNECTIONS_MAX 16U
#define IMDS_CONNECTIONS_MAX 4096U
#define IMDS_IDLE_TIMEOUT (15 * USEC_PER_SEC)
#define IMDS_REQUEST_TIMEOUT (30 * USEC_PER_SEC)
