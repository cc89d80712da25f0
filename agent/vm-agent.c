/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* vm-agent: the guest half of vm-manager's attestation protocol. It fetches a nonce from the IMDS,
 * quotes the boot stage's PCRs with a persistent attestation key and posts the quote, after proving with
 * a credential activation that the key lives in the TPM of the host-certified endorsement key; see
 * docs/agent.md. It is the one project binary in the guest and runs from the initrd, so it needs
 * nothing but libc, tss2, libcurl and jansson. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include <curl/curl.h>

#include "agent-activate.h"
#include "agent-imds.h"
#include "agent-quote.h"
#include "agent-tpm.h"
#include "agent-util.h"
#include "cleanup.h"
#include "hex-util.h"
#include "json-util.h"
#include "parse-util.h"
#include "version.h"

#define EXIT_REJECTED 2
#define TIMEOUT_DEFAULT (90 * USEC_PER_SEC)

static AgentStage arg_stage = _AGENT_STAGE_INVALID;
static const char *arg_imds_url = AGENT_IMDS_URL_DEFAULT;
static const char *arg_tpm = AGENT_TPM_DEFAULT;
static usec_t arg_timeout = TIMEOUT_DEFAULT;
static bool arg_print = false;
static const char *arg_nonce = NULL;
static TPMI_ALG_HASH arg_bank = TPM2_ALG_SHA256;

static void main_help(void) {
        printf("Usage: vm-agent [-v] COMMAND [FLAGS]\n\n"
               "The guest agent of vm-manager: proves the boot state to the IMDS with a TPM quote.\n\n"
               "Commands:\n"
               "  attest   quote the boot stage's PCRs and post the quote to the IMDS\n"
               "  pcrs     print PCR 0-23 of one bank\n"
               "  version  print the release version, commit and build time\n\n"
               "Flags:\n"
               "  -v, --verbose  debug logging on stderr\n"
               "  -h, --help     this help, or a command's: vm-agent attest --help\n");
}

static void attest_help(void) {
        printf("Usage: vm-agent attest --stage=initrd|ready [FLAGS]\n\n"
               "Fetches a nonce from the IMDS, quotes PCRs 0-7, 11 and 12 (stage initrd) or 0-7, 11, 12\n"
               "and 13 (stage ready) of the sha256 bank with the persistent attestation key and posts the quote.\n"
               "At stage initrd, and when the IMDS answers that the key is not activated, the credential\n"
               "activation comes first: it proves to the IMDS that the key lives in the TPM of the endorsement\n"
               "key the host certified.\n"
               "Exit status: 0 verified, 2 rejected by the verifier, 1 any other error.\n\n"
               "Flags:\n"
               "      --stage=STAGE     boot stage being quoted: initrd or ready (required)\n"
               "      --imds-url=URL    IMDS base URL (default %s)\n"
               "      --tpm=TPM         TPM device or swtpm socket path, or a TCTI configuration such as\n"
               "                        swtpm:path=/run/swtpm.sock (default %s)\n"
               "      --timeout=DUR     bound on the whole run, including the wait for the IMDS (default 90s)\n"
               "      --print           write the request as JSON to stdout instead of posting it\n"
               "      --nonce=HEX       use this nonce instead of fetching one\n"
               "  -v, --verbose         debug logging on stderr\n",
               AGENT_IMDS_URL_DEFAULT,
               AGENT_TPM_DEFAULT);
}

static void pcrs_help(void) {
        printf("Usage: vm-agent pcrs [--bank=sha256] [--tpm=TPM]\n\n"
               "Prints PCR 0-23 of one bank, one \"%%2d: <hex>\" line each.\n\n"
               "Flags:\n"
               "      --bank=BANK  sha1, sha256, sha384 or sha512 (default sha256)\n"
               "      --tpm=TPM    TPM device or swtpm socket path, or a TCTI configuration (default %s)\n"
               "  -v, --verbose    debug logging on stderr\n",
               AGENT_TPM_DEFAULT);
}

static void version_help(void) {
        printf("Usage: vm-agent version\n\nPrints the release version, the commit and the build time.\n");
}

static const char *empty_to_null(const char *s) {
        return s && s[0] ? s : NULL;
}

static void set_verbose(void) {
        agent_log_set_max_level(LOG_DEBUG);
}

/* Reports a getopt failure; opterr is off so that every message has our "Error: " form. */
static int flag_error(const char *cmd, int c, char **argv) {
        const char *arg = argv[optind - 1];

        if (c == ':')
                fprintf(stderr, "Error: %s: flag '%s' needs a value\n", cmd, arg);
        else if (optopt != 0 && !startswith(arg, "--"))
                fprintf(stderr, "Error: %s: unknown flag '-%c'\n", cmd, optopt);
        else
                fprintf(stderr, "Error: %s: unknown flag '%s'\n", cmd, arg);
        return EXIT_FAILURE;
}

static int no_arguments(const char *cmd, int argc, char **argv) {
        if (optind < argc) {
                fprintf(stderr, "Error: %s: unexpected argument '%s'\n", cmd, argv[optind]);
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}

static int print_error(const ApiError *e, int r) {
        fprintf(stderr, "Error: %s\n", e->message ?: strerror(ABS(r)));
        return EXIT_FAILURE;
}

static int attest_parse(int argc, char **argv) {
        enum {
                ARG_STAGE = 0x100,
                ARG_IMDS_URL,
                ARG_TPM,
                ARG_TIMEOUT,
                ARG_PRINT,
                ARG_NONCE,
        };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "verbose", no_argument, NULL, 'v' },
                { "stage", required_argument, NULL, ARG_STAGE },
                { "imds-url", required_argument, NULL, ARG_IMDS_URL },
                { "tpm", required_argument, NULL, ARG_TPM },
                { "timeout", required_argument, NULL, ARG_TIMEOUT },
                { "print", no_argument, NULL, ARG_PRINT },
                { "nonce", required_argument, NULL, ARG_NONCE },
                {},
        };
        int c, r;

        while ((c = getopt_long(argc, argv, ":hv", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        attest_help();
                        return 0;
                case 'v':
                        set_verbose();
                        break;
                case ARG_STAGE:
                        arg_stage = agent_stage_from_string(optarg);
                        if (arg_stage < 0) {
                                fprintf(stderr, "Error: attest: stage must be \"initrd\" or \"ready\"\n");
                                return -EINVAL;
                        }
                        break;
                case ARG_IMDS_URL:
                        arg_imds_url = optarg;
                        break;
                case ARG_TPM:
                        /* Empty means the default, as for the other flags. */
                        arg_tpm = optarg[0] ? optarg : AGENT_TPM_DEFAULT;
                        break;
                case ARG_TIMEOUT:
                        r = parse_duration(optarg, &arg_timeout);
                        if (r < 0) {
                                fprintf(stderr,
                                        "Error: attest: invalid value '%s' for --timeout: a duration such as 90s or 2m is needed\n",
                                        optarg);
                                return -EINVAL;
                        }
                        if (arg_timeout == 0)
                                arg_timeout = TIMEOUT_DEFAULT;
                        break;
                case ARG_PRINT:
                        arg_print = true;
                        break;
                case ARG_NONCE:
                        arg_nonce = optarg[0] ? optarg : NULL;
                        break;
                default:
                        (void) flag_error("attest", c, argv);
                        return -EINVAL;
                }

        if (no_arguments("attest", argc, argv) != EXIT_SUCCESS)
                return -EINVAL;
        if (arg_stage < 0) {
                fprintf(stderr, "Error: attest: --stage is required: initrd or ready\n");
                return -EINVAL;
        }
        return 1;
}

/* The verdict's beginning when no key is activated yet: the guest activates and quotes again. The
 * daemon's ATTEST_AK_NOT_ACTIVATED (src/attest/attest-verify.h) starts it; the agent links nothing of
 * the daemon, so the text is repeated here, and test-attest-activate holds the two together. */
#define AK_NOT_ACTIVATED_YET "attestation key not activated for this vm's vTPM: no credential activation yet"

/* The stage's quote over a fresh nonce (or --nonce), as JSON. */
static int build_quote(const AgentQuoteOptions *o, const AgentImds *imds, json_t **ret, ApiError *reterr) {
        _cleanup_free_ char *nonce = NULL;
        int r;

        if (arg_nonce) {
                nonce = strdup(arg_nonce);
                if (!nonce)
                        return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        } else {
                r = agent_imds_fetch_nonce(imds, &nonce, reterr);
                if (r < 0)
                        return r;
        }
        agent_debug("building the %s quote", agent_stage_to_string(arg_stage));
        r = agent_quote_build(o, arg_stage, nonce, ret, reterr);
        if (r < 0)
                (void) api_error_prefix(reterr, "build quote");
        return r;
}

static int print_quote(const AgentQuoteOptions *o, const AgentImds *imds) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *text = NULL;
        json_auto_t *req = NULL;
        int r;

        r = build_quote(o, imds, &req, &e);
        if (r < 0)
                return print_error(&e, r);
        text = json_dumps_pretty(req, /* ret_size= */ NULL);
        if (!text)
                return print_error(&e, -ENOMEM);
        if (fputs(text, stdout) < 0 || fflush(stdout) != 0) {
                fprintf(stderr, "Error: write the request: %m\n");
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}

static int quote_once(const AgentQuoteOptions *o, const AgentImds *imds, AgentVerdict *ret, ApiError *reterr) {
        _cleanup_free_ char *body = NULL;
        json_auto_t *req = NULL;
        int r;

        r = build_quote(o, imds, &req, reterr);
        if (r < 0)
                return r;
        body = json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!body)
                return api_error_set(reterr, -ENOMEM, API_ERROR_INTERNAL, "out of memory");
        return agent_imds_post_quote(imds, body, ret, reterr);
}

/* The credential activation: 0 to go on quoting (activated, or the daemon has nothing to activate
 * against and the verdict will say what holds), otherwise the exit status. */
static int activate(const AgentImds *imds) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        r = agent_activate(imds, arg_tpm, &e);
        if (r > 0)
                return 0;
        if (r == 0) {
                agent_info("no credential activation: %s", e.message ?: "?");
                return 0;
        }
        if (r == -EPERM) {
                fprintf(stderr, "Attestation rejected: %s\n", e.message ?: "credential activation refused");
                return EXIT_REJECTED;
        }
        return print_error(&e, r);
}

static int attest_main(int argc, char **argv) {
        _cleanup_free_ char *base = NULL, *user_agent = NULL;
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(agent_verdict_done) AgentVerdict verdict = {};
        AgentQuoteOptions quote_options;
        AgentImds imds;
        int r;

        r = attest_parse(argc, argv);
        if (r <= 0)
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;

        r = agent_imds_normalize_url(arg_imds_url, &base, &e);
        if (r < 0)
                return print_error(&e, r);
        if (asprintf(&user_agent, "vm-agent/%s", vmm_version) < 0)
                return print_error(&e, -ENOMEM);
        imds = (AgentImds){
                .base = base,
                .user_agent = user_agent,
                .deadline = now_usec(CLOCK_MONOTONIC) + arg_timeout,
        };

        quote_options = (AgentQuoteOptions){
                .tpm = arg_tpm,
                /* Where the logs are read from can be moved, for tests and debugging. */
                .firmware_log = empty_to_null(secure_getenv("VM_AGENT_EVENT_LOG")),
                .userspace_log = empty_to_null(secure_getenv("VM_AGENT_USERSPACE_LOG")),
        };
        if (arg_print)
                return print_quote(&quote_options, &imds);

        /* The first quote of a boot is preceded by the credential activation; a later stage's is
         * only when the daemon answers that the key is not activated (the vTPM was certified after
         * the initrd quoted, say). */
        for (bool activated = false;;) {
                if (!activated && (arg_stage == AGENT_STAGE_INITRD || verdict.message)) {
                        r = activate(&imds);
                        if (r != 0)
                                return r;
                        activated = true;
                }
                agent_verdict_done(&verdict);
                r = quote_once(&quote_options, &imds, &verdict, &e);
                if (r < 0)
                        return print_error(&e, r);
                if (verdict.verified || activated || !verdict.message ||
                    !startswith(verdict.message, AK_NOT_ACTIVATED_YET))
                        break;
        }

        if (!verdict.verified) {
                fprintf(stderr,
                        "Attestation rejected: %s\n",
                        verdict.message && verdict.message[0] ? verdict.message :
                                                                "quote rejected by the verifier");
                return EXIT_REJECTED;
        }

        agent_info(
                "attestation verified (stage %s, user data %s)%s%s",
                verdict.stage ?: agent_stage_to_string(arg_stage),
                verdict.user_data_released ? "released" : "not released",
                verdict.message ? ": " : "",
                verdict.message ?: "");
        return EXIT_SUCCESS;
}

static int pcrs_main(int argc, char **argv) {
        enum {
                ARG_BANK = 0x100,
                ARG_TPM,
        };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "verbose", no_argument, NULL, 'v' },
                { "bank", required_argument, NULL, ARG_BANK },
                { "tpm", required_argument, NULL, ARG_TPM },
                {},
        };
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_(agent_tpm_freep) AgentTpm *tpm = NULL;
        AgentPcrs pcrs;
        int c, r;

        while ((c = getopt_long(argc, argv, ":hv", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        pcrs_help();
                        return EXIT_SUCCESS;
                case 'v':
                        set_verbose();
                        break;
                case ARG_BANK:
                        arg_bank = agent_bank_from_string(optarg);
                        if (arg_bank == 0) {
                                fprintf(stderr, "Error: pcrs: unknown pcr bank \"%s\"\n", optarg);
                                return EXIT_FAILURE;
                        }
                        break;
                case ARG_TPM:
                        arg_tpm = optarg[0] ? optarg : AGENT_TPM_DEFAULT;
                        break;
                default:
                        return flag_error("pcrs", c, argv);
                }
        if (no_arguments("pcrs", argc, argv) != EXIT_SUCCESS)
                return EXIT_FAILURE;

        r = agent_tpm_open(arg_tpm, &tpm, &e);
        if (r < 0)
                return print_error(&e, r);
        r = agent_tpm_read_pcrs(tpm, arg_bank, (UINT32_C(1) << AGENT_PCR_COUNT) - 1, &pcrs, &e);
        if (r < 0)
                return print_error(&e, r);

        for (unsigned i = 0; i < AGENT_PCR_COUNT; i++) {
                _cleanup_free_ char *hex = hex_encode(pcrs.values[i].buffer, pcrs.values[i].size);

                if (!hex)
                        return print_error(&e, -ENOMEM);
                printf("%2u: %s\n", i, hex);
        }
        if (fflush(stdout) != 0) {
                fprintf(stderr, "Error: write the pcrs: %m\n");
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}

static int version_main(int argc, char **argv) {
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "verbose", no_argument, NULL, 'v' },
                {},
        };
        int c;

        while ((c = getopt_long(argc, argv, ":hv", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        version_help();
                        return EXIT_SUCCESS;
                case 'v':
                        break;
                default:
                        return flag_error("version", c, argv);
                }
        if (no_arguments("version", argc, argv) != EXIT_SUCCESS)
                return EXIT_FAILURE;

        printf("vm-agent version %s\n  commit: %s\n  built:  %s\n", vmm_version, vmm_commit, vmm_build_time);
        return EXIT_SUCCESS;
}

int main(int argc, char **argv) {
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "verbose", no_argument, NULL, 'v' },
                { "version", no_argument, NULL, 'V' },
                {},
        };
        const char *cmd;
        int c, r;

        opterr = 0;
        /* '+': stop at the command; its flags are its own. */
        while ((c = getopt_long(argc, argv, "+:hv", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        main_help();
                        return EXIT_SUCCESS;
                case 'v':
                        set_verbose();
                        break;
                case 'V':
                        printf("vm-agent version %s\n", vmm_version);
                        return EXIT_SUCCESS;
                default:
                        return flag_error("vm-agent", c, argv);
                }

        if (optind >= argc) {
                main_help();
                return EXIT_FAILURE;
        }
        cmd = argv[optind];
        argc -= optind;
        argv += optind;
        optind = 0; /* a full re-initialisation of getopt for the command's flags */

        if (streq(cmd, "attest")) {
                if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
                        fprintf(stderr, "Error: initialise libcurl\n");
                        return EXIT_FAILURE;
                }
                r = attest_main(argc, argv);
                curl_global_cleanup();
                return r;
        }
        if (streq(cmd, "pcrs"))
                return pcrs_main(argc, argv);
        if (streq(cmd, "version"))
                return version_main(argc, argv);
        if (streq(cmd, "help")) {
                main_help();
                return EXIT_SUCCESS;
        }
        fprintf(stderr, "Error: unknown command '%s'; see vm-agent --help\n", cmd);
        return EXIT_FAILURE;
}
