/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <jansson.h>
#include <stdint.h>

#include "api-error.h"

#define AGENT_TPM_DEFAULT "/dev/tpmrm0"
#define AGENT_FIRMWARE_LOG "/sys/kernel/security/tpm0/binary_bios_measurements"
#define AGENT_USERSPACE_LOG "/run/log/systemd/tpm2-measure.log"
/* Real logs are tens of KiB; the initrd has little memory to spare for a pathological one. */
#define AGENT_EVENT_LOG_MAX (4U * 1024U * 1024U)

typedef enum AgentStage {
        AGENT_STAGE_INITRD,
        AGENT_STAGE_READY,
        _AGENT_STAGE_MAX,
        _AGENT_STAGE_INVALID = -EINVAL,
} AgentStage;

const char *agent_stage_to_string(AgentStage s) _const_;
AgentStage agent_stage_from_string(const char *s) _pure_;

/* The PCRs a stage quotes, bit i for PCR i: 0-7, 11 and 12 (initrd), plus 13 (ready). */
uint32_t agent_stage_pcrs(AgentStage s) _const_;

typedef struct AgentQuoteOptions {
        const char *tpm;           /* --tpm: a device or socket path, or a TCTI configuration */
        const char *firmware_log;  /* NULL: AGENT_FIRMWARE_LOG */
        const char *userspace_log; /* NULL: AGENT_USERSPACE_LOG */
} AgentQuoteOptions;

/* Builds the QuoteRequest of a stage over nonce (hex, as served by /attest/nonce): ensures the
 * persistent AK, reads the EK public area and the stage's sha256 PCRs, quotes them with the nonce as
 * qualifying data and attaches the event logs (for a simulator only those named in o). Returns a new JSON
 * object with the fields in the order of docs/agent.md. */
int agent_quote_build(
        const AgentQuoteOptions *o, AgentStage stage, const char *nonce, json_t **ret, ApiError *reterr);
