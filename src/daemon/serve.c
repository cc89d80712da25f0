/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <unistd.h>

#include "api-rest.h"
#include "auth.h"
#include "cleanup.h"
#include "flags.h"
#include "fs-util.h"
#include "host-probe.h"
#include "http-server.h"
#include "imds.h"
#include "log.h"
#include "loop-watchdog.h"
#include "manager.h"
#include "mcp-server.h"
#include "metrics-text.h"
#include "network.h"
#include "parse-util.h"
#include "serve.h"
#include "trace.h"
#include "version.h"
#include "vm-cmdline.h"

/* Debug builds (meson buildtype debug: the check build) carry test hooks and have the loop watchdog on. */
#ifndef VMM_TEST_HOOKS
#        define VMM_TEST_HOOKS 0
#endif

#define SHUTDOWN_GRACE (15 * USEC_PER_SEC)
#define TRACE_FLUSH_TIMEOUT (2 * USEC_PER_SEC)
#define LOCK_FILE "vm-manager.lock"

static char *arg_listen = NULL;
static char *arg_mcp_path = NULL;
static usec_t arg_mcp_keepalive = MCP_KEEPALIVE_DEFAULT;
static char *arg_state_dir = NULL;
static char *arg_image_dir = NULL;
static int arg_log_level = LOG_INFO;
static char *arg_network_subnet = NULL;
static char *arg_default_network = NULL;
static char *arg_ovmf_code = NULL;
static char *arg_ovmf_vars = NULL;
static HostAccel arg_accel = HOST_ACCEL_AUTO;
static HostNotify arg_vsock = HOST_NOTIFY_AUTO;
static usec_t arg_install_timeout = 0; /* 0: the manager's default for the accelerator */
static usec_t arg_boot_timeout = 0;
static usec_t arg_stop_timeout = 30 * USEC_PER_SEC;
static usec_t arg_qmp_timeout = 30 * USEC_PER_SEC;
static uint32_t arg_tcg_tb_size_mib = 256; /* docs/operations.md has the measurement behind it */
static usec_t arg_guest_report_interval = 5 * USEC_PER_MINUTE; /* docs/operations.md: an idle VM */
static uint32_t arg_notify_port = 0;
static VmLauncherKind arg_launcher = VM_LAUNCHER_AUTO;
static VmInstallMode arg_install_mode = VM_INSTALL_HOST;
static bool arg_detach_vms_on_exit = true;
static AttestMode arg_attestation = ATTEST_MODE_VERIFY;
static bool arg_attestation_learn_golden = false;
static bool arg_firmware_run = true;
static bool arg_metrics_enabled = true;
static uint32_t arg_metrics_guest_series_limit = GUEST_SERIES_LIMIT_DEFAULT;
static uint32_t arg_http_max_connections = 1024;
static uint32_t arg_http_max_connections_per_peer = 256;
static usec_t arg_http_request_timeout = 30 * USEC_PER_SEC;
static bool arg_enable_oauth = false;
static char *arg_oauth_base_url = NULL;
static AuthProvider arg_oauth_provider = AUTH_PROVIDER_DEX;
static char **arg_oauth_trusted_audiences = NULL;
static bool arg_sso_allow_private_ips = false;
static bool arg_allow_public_client_registration = false;
static char *arg_dex_issuer_url = NULL;
static char *arg_dex_client_id = NULL;
static char *arg_dex_client_secret = NULL;
static char *arg_dex_ca_file = NULL;
static bool arg_allow_private_oauth_urls = false;
static char *arg_google_client_id = NULL;
static char *arg_google_client_secret = NULL;

static int parse_oauth_provider(const Flag *f, const char *value, const char **ret_reason) {
        AuthProvider p = auth_provider_from_string(value);

        if (p < 0) {
                *ret_reason = "want dex or google";
                return -EINVAL;
        }
        *(AuthProvider *) f->dest = p;
        return 0;
}

/* A comma-separated list; blanks around the items and empty items are dropped. */
static int parse_audiences(const Flag *f, const char *value, const char **ret_reason) {
        _cleanup_strv_free_ char **l = calloc(strlen(value) / 2 + 2, sizeof(char *));
        char ***dest = f->dest;
        size_t n = 0;

        if (!l)
                return -ENOMEM;
        for (const char *p = value; *p;) {
                size_t len = strcspn(p, ",");
                const char *b = p, *e = p + len;

                while (b < e && (*b == ' ' || *b == '\t'))
                        b++;
                while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
                        e--;
                if (e > b && !(l[n++] = strndup(b, (size_t) (e - b))))
                        return -ENOMEM;
                p += len + (p[len] == ',');
        }
        strv_free(*dest);
        *dest = n > 0 ? TAKE_PTR(l) : NULL;
        return 0;
}

static int parse_install_mode(const Flag *f, const char *value, const char **ret_reason) {
        VmInstallMode m = vm_install_mode_from_string(value);

        if (m < 0) {
                *ret_reason = "want host or boot";
                return -EINVAL;
        }
        *(VmInstallMode *) f->dest = m;
        return 0;
}

static int parse_launcher(const Flag *f, const char *value, const char **ret_reason) {
        VmLauncherKind k = vm_launcher_from_string(value);

        if (k < 0) {
                *ret_reason = "want auto, systemd or process";
                return -EINVAL;
        }
        *(VmLauncherKind *) f->dest = k;
        return 0;
}

/* The firmware pairs looked for, in order, when --ovmf-code/--ovmf-vars are not given. */
static const char *const ovmf_pairs[][2] = {
        { "/usr/share/edk2/x64/OVMF_CODE.4m.fd", "/usr/share/edk2/x64/OVMF_VARS.4m.fd" },
        { "/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd" },
        { "/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd" },
        { "/usr/share/edk2/ovmf/OVMF_CODE.fd", "/usr/share/edk2/ovmf/OVMF_VARS.fd" },
};

static int parse_network_subnet(const Flag *f, const char *value, const char **ret_reason) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        static char reason[256];
        struct in_addr prefix;
        unsigned len;

        if (network_parse_cidr(value, &prefix, &len, &e) < 0) {
                snprintf(reason, sizeof(reason), "%s", e.message ?: "not an IPv4 CIDR");
                *ret_reason = reason;
                return -EINVAL;
        }
        return flag_parse_string(f, value, ret_reason);
}

static int parse_network_name(const Flag *f, const char *value, const char **ret_reason) {
        if (network_validate_name(value, NULL) < 0) {
                *ret_reason = "want a network name: lowercase letters, digits and dashes, 1-63 characters";
                return -EINVAL;
        }
        return flag_parse_string(f, value, ret_reason);
}

/* flag_parse_uint32() within min..max; reason says why another value is refused. */
static int parse_uint32_within(
        const Flag *f, const char *value, const char **ret_reason, uint32_t min, uint32_t max, const char *reason) {
        int r = flag_parse_uint32(f, value, ret_reason);

        if (r >= 0 && (*(uint32_t *) f->dest < min || *(uint32_t *) f->dest > max)) {
                *ret_reason = reason;
                return -EINVAL;
        }
        return r;
}

static int parse_series_limit(const Flag *f, const char *value, const char **ret_reason) {
        return parse_uint32_within(f, value, ret_reason, 1, UINT32_MAX, "must be at least 1");
}

static int parse_keepalive(const Flag *f, const char *value, const char **ret_reason) {
        usec_t u = 0;
        Flag g = *f;
        int r;

        g.dest = &u;
        r = flag_parse_duration(&g, value, ret_reason);
        if (r < 0)
                return r;
        if (u < USEC_PER_SEC || u > USEC_PER_HOUR) {
                *ret_reason = "want a duration from 1s to 1h";
                return -ERANGE;
        }
        *(usec_t *) f->dest = u;
        return 0;
}

static int parse_max_connections(const Flag *f, const char *value, const char **ret_reason) {
        return parse_uint32_within(f, value, ret_reason, 1, 65536, "want 1 to 65536");
}

/* A duration from min to max (whole seconds when whole); reason says so when it is not one. */
static int parse_duration_within(
        const Flag *f,
        const char *value,
        const char **ret_reason,
        usec_t min,
        usec_t max,
        bool whole,
        const char *reason) {
        int r = flag_parse_duration(f, value, ret_reason);
        usec_t u = *(usec_t *) f->dest;

        if (r >= 0 && ((whole && u % USEC_PER_SEC != 0) || u < min || u > max)) {
                *ret_reason = reason;
                return -EINVAL;
        }
        return r;
}

static int parse_request_timeout(const Flag *f, const char *value, const char **ret_reason) {
        return parse_duration_within(
                f, value, ret_reason, USEC_PER_SEC, USEC_INFINITY, false, "must be at least 1s");
}

static int parse_report_interval(const Flag *f, const char *value, const char **ret_reason) {
        return parse_duration_within(
                f,
                value,
                ret_reason,
                0,
                24 * USEC_PER_HOUR,
                true,
                "want whole seconds, at most 1d (0: once after boot)");
}

static int parse_tb_size(const Flag *f, const char *value, const char **ret_reason) {
        return parse_uint32_within(
                f, value, ret_reason, 0, VM_TB_SIZE_MIB_MAX, "want 0 (QEMU's default) to 4096");
}

static int parse_accel(const Flag *f, const char *value, const char **ret_reason) {
        HostAccel a = host_accel_from_string(value);

        if (a < 0) {
                *ret_reason = "want auto, kvm or tcg";
                return -EINVAL;
        }
        *(HostAccel *) f->dest = a;
        return 0;
}

static int parse_attestation(const Flag *f, const char *value, const char **ret_reason) {
        AttestMode a = !value || !value[0] ? ATTEST_MODE_VERIFY : attest_mode_from_string(value);

        if (a < 0) {
                *ret_reason = "want verify or noop";
                return -EINVAL;
        }
        *(AttestMode *) f->dest = a;
        return 0;
}

static int parse_vsock(const Flag *f, const char *value, const char **ret_reason) {
        HostNotify n = host_notify_from_string(value);

        if (n < 0) {
                *ret_reason = "want auto, vhost, vhost-user or none";
                return -EINVAL;
        }
        *(HostNotify *) f->dest = n;
        return 0;
}

static const Flag serve_flags[] = {
        {
                .name = "listen",
                .env = "VM_MANAGER_LISTEN",
                .default_value = SERVE_LISTEN_DEFAULT,
                .metavar = "ADDR",
                .help = "address to serve REST, MCP, health and metrics on (host:port, [ipv6]:port or :port)",
                .parse = flag_parse_listen,
                .dest = &arg_listen,
        },
        {
                .name = "mcp-path",
                .env = "VM_MANAGER_MCP_PATH",
                .default_value = "/mcp",
                .metavar = "PATH",
                .help = "URL path of the MCP endpoint",
                .parse = flag_parse_url_path,
                .dest = &arg_mcp_path,
        },
        {
                .name = "mcp-keepalive",
                .env = "VM_MANAGER_MCP_KEEPALIVE",
                .default_value = "15s",
                .metavar = "DURATION",
                .help = "longest silence on an MCP event stream: a keep-alive comment is sent after it (1s to 1h)",
                .parse = parse_keepalive,
                .dest = &arg_mcp_keepalive,
        },
        {
                .name = "http-max-connections",
                .env = "VM_MANAGER_HTTP_MAX_CONNECTIONS",
                .default_value = "1024",
                .metavar = "N",
                .help = "connections the listener holds; past it, the client holding the most gives up its idlest one",
                .parse = parse_max_connections,
                .dest = &arg_http_max_connections,
        },
        {
                .name = "http-max-connections-per-peer",
                .env = "VM_MANAGER_HTTP_MAX_CONNECTIONS_PER_PEER",
                .default_value = "256",
                .metavar = "N",
                .help = "connections one client address (IPv6: one /64) holds; a newcomer past it closes that client's "
                        "idlest connection, or gets 503 when all are busy",
                .parse = parse_max_connections,
                .dest = &arg_http_max_connections_per_peer,
        },
        {
                .name = "http-request-timeout",
                .env = "VM_MANAGER_HTTP_REQUEST_TIMEOUT",
                .default_value = "30s",
                .metavar = "DURATION",
                .help = "time a connection gets to send a whole request (from its opening or its previous response) "
                        "and to take a response; idle keep-alive connections close after it too",
                .parse = parse_request_timeout,
                .dest = &arg_http_request_timeout,
        },
        {
                .name = "state-dir",
                .env = "VM_MANAGER_STATE_DIR",
                .default_help =
                        "$XDG_STATE_HOME/vm-manager, else ~/.local/state/vm-manager, else /var/lib/vm-manager",
                .metavar = "DIR",
                .help = "VM records, consoles, vTPM state and sockets; keep the path short (unix socket paths)",
                .parse = flag_parse_directory,
                .dest = &arg_state_dir,
        },
        {
                .name = "image-dir",
                .env = "VM_MANAGER_IMAGE_DIR",
                .default_help = "<state-dir>/images",
                .metavar = "DIR",
                .help = "the image directory: UKIs, disk images, policy.json and the sysupdate trees",
                .parse = flag_parse_directory,
                .dest = &arg_image_dir,
        },
        {
                .name = "network-subnet",
                .env = "VM_MANAGER_NETWORK_SUBNET",
                .default_value = "192.168.127.0/24",
                .metavar = "CIDR",
                .help = "CIDR of the default network, created at start-up when missing (an existing one keeps its CIDR)",
                .parse = parse_network_subnet,
                .dest = &arg_network_subnet,
        },
        {
                .name = "default-network",
                .env = "VM_MANAGER_DEFAULT_NETWORK",
                .default_value = "default",
                .metavar = "NAME",
                .help = "name of the network created at start-up",
                .parse = parse_network_name,
                .dest = &arg_default_network,
        },
        {
                .name = "ovmf-code",
                .env = "VM_MANAGER_OVMF_CODE",
                .default_help = "the first pair found of /usr/share/edk2/x64/OVMF_CODE.4m.fd, /usr/share/OVMF/OVMF_CODE_4M.fd, "
                                "/usr/share/OVMF/OVMF_CODE.fd, /usr/share/edk2/ovmf/OVMF_CODE.fd",
                .metavar = "PATH",
                .help = "firmware code image VMs boot with; get_host reports its build",
                .parse = flag_parse_directory,
                .dest = &arg_ovmf_code,
        },
        {
                .name = "ovmf-vars",
                .env = "VM_MANAGER_OVMF_VARS",
                .default_help = "the variable store next to the code image found",
                .metavar = "PATH",
                .help = "firmware variable store template, copied for each VM",
                .parse = flag_parse_directory,
                .dest = &arg_ovmf_vars,
        },
        {
                .name = "accel",
                .env = "VM_MANAGER_ACCEL",
                .default_value = "auto",
                .metavar = "MODE",
                .help = "auto, kvm or tcg; auto uses KVM only where it can run a standard guest, else TCG (get_host says why)",
                .parse = parse_accel,
                .dest = &arg_accel,
        },
        {
                .name = "tcg-tb-size-mib",
                .env = "VM_MANAGER_TCG_TB_SIZE_MIB",
                .default_value = "256",
                .metavar = "MIB",
                .help = "under TCG, the size of each VM's translation cache (anonymous host memory QEMU fills as the "
                        "guest runs code); 0 keeps QEMU's default of 1024",
                .parse = parse_tb_size,
                .dest = &arg_tcg_tb_size_mib,
        },
        {
                .name = "guest-report-interval",
                .env = "VM_MANAGER_GUEST_REPORT_INTERVAL",
                .default_value = "5m",
                .metavar = "DURATION",
                .help = "how often each VM's guest uploads its metrics report (whole seconds, at most 1d; 0: once "
                        "after boot only); handed to the guest as the credential vm.report-interval",
                .parse = parse_report_interval,
                .dest = &arg_guest_report_interval,
        },
        {
                .name = "vsock",
                .env = "VM_MANAGER_VSOCK",
                .default_value = "auto",
                .metavar = "MODE",
                .help = "how guests report READY=1: auto, vhost (/dev/vhost-vsock), vhost-user (vhost-device-vsock) or none",
                .parse = parse_vsock,
                .dest = &arg_vsock,
        },
        {
                .name = "install-timeout",
                .env = "VM_MANAGER_INSTALL_TIMEOUT",
                .default_help = "5m, 15m under TCG",
                .metavar = "DURATION",
                .help = "ceiling of the install (the installer boot, or the host install's helper); a VM past it is failed",
                .parse = flag_parse_duration,
                .dest = &arg_install_timeout,
        },
        {
                .name = "boot-timeout",
                .env = "VM_MANAGER_BOOT_TIMEOUT",
                .default_help = "4m, 10m under TCG",
                .metavar = "DURATION",
                .help = "how long an installed boot may take to send READY=1 before the VM is marked running",
                .parse = flag_parse_duration,
                .dest = &arg_boot_timeout,
        },
        {
                .name = "qmp-timeout",
                .env = "VM_MANAGER_QMP_TIMEOUT",
                .default_value = "30s",
                .metavar = "DURATION",
                .help = "how long a QEMU just started (or found running at start-up) may take to answer on its monitor",
                .parse = flag_parse_duration,
                .dest = &arg_qmp_timeout,
        },
        {
                .name = "stop-timeout",
                .env = "VM_MANAGER_STOP_TIMEOUT",
                .default_value = "30s",
                .metavar = "DURATION",
                .help = "graceful power-down budget before SIGTERM (then SIGKILL 5s later), also at shutdown",
                .parse = flag_parse_duration,
                .dest = &arg_stop_timeout,
        },
        {
                .name = "notify-port",
                .env = "VM_MANAGER_NOTIFY_PORT",
                .default_value = "0",
                .metavar = "PORT",
                .help = "vsock port guests send READY=1 to; 0 reuses the one recorded in the state dir, or picks one",
                .parse = flag_parse_uint32,
                .dest = &arg_notify_port,
        },
        {
                .name = "launcher",
                .env = "VM_MANAGER_LAUNCHER",
                .default_value = "auto",
                .metavar = "KIND",
                .help = "systemd (VMs as transient units in vm-manager.slice, which survive a restart), process (plain "
                        "children, which end with vm-manager), or auto (systemd where a service manager is reachable)",
                .parse = parse_launcher,
                .dest = &arg_launcher,
        },
        {
                .name = "install-mode",
                .env = "VM_MANAGER_INSTALL_MODE",
                .default_value = "host",
                .metavar = "MODE",
                .help = "how create_vm writes a VM's disk: host (the daemon lays it out from the image's layout file, "
                        "then the first boot is the installed one; images without the file fall back to boot) or boot "
                        "(an installer boot of the image); create_vm's install_mode overrides it",
                .parse = parse_install_mode,
                .dest = &arg_install_mode,
        },
        {
                .name = "attestation",
                .env = "VM_MANAGER_ATTESTATION",
                .default_value = "verify",
                .metavar = "MODE",
                .help = "verify: quotes are checked against the image's policy.json; noop: any quote echoing a fresh nonce passes (development only)",
                .parse = parse_attestation,
                .dest = &arg_attestation,
        },
        {
                .name = "attestation-learn-golden",
                .env = "VM_MANAGER_ATTESTATION_LEARN_GOLDEN",
                .default_value = "false",
                .help = "accept and record golden PCRs the image's policy lacks; never for production",
                .parse = flag_parse_bool,
                .dest = &arg_attestation_learn_golden,
                .is_bool = true,
        },
        {
                .name = "firmware-run",
                .env = "VM_MANAGER_FIRMWARE_RUN",
                .default_value = "true",
                .help = "learn what this host's OVMF measures into PCRs 0-6 with a short firmware-only QEMU run per VM memory size and CPU count (cached in the state directory), so that those PCRs need no golden value",
                .parse = flag_parse_bool,
                .dest = &arg_firmware_run,
                .is_bool = true,
        },
        {
                .name = "detach-vms-on-exit",
                .env = "VM_MANAGER_DETACH_VMS_ON_EXIT",
                .default_value = "true",
                .help = "with the systemd launcher, leave VMs running when vm-manager stops and attach to them at the next start",
                .parse = flag_parse_bool,
                .dest = &arg_detach_vms_on_exit,
                .is_bool = true,
        },
        {
                .name = "metrics-enabled",
                .env = "VM_MANAGER_METRICS_ENABLED",
                .default_value = "true",
                .help = "serve the Prometheus exposition at GET /metrics (never behind authentication)",
                .parse = flag_parse_bool,
                .dest = &arg_metrics_enabled,
                .is_bool = true,
        },
        {
                .name = "metrics-guest-series-limit",
                .env = "VM_MANAGER_METRICS_GUEST_SERIES_LIMIT",
                .default_value = "1000",
                .metavar = "N",
                .help = "series kept per VM from its guest's systemd-report upload; the rest are counted as dropped",
                .parse = parse_series_limit,
                .dest = &arg_metrics_guest_series_limit,
        },
        {
                .name = "enable-oauth",
                .env = "VM_MANAGER_OAUTH_ENABLED",
                .default_value = "false",
                .help = "require an OAuth bearer token on REST and MCP (see Identity in the README); /healthz, /readyz, /metrics and the OAuth endpoints stay open",
                .parse = flag_parse_bool,
                .dest = &arg_enable_oauth,
                .is_bool = true,
        },
        {
                .name = "oauth-base-url",
                .env = "VM_MANAGER_OAUTH_BASE_URL",
                .metavar = "URL",
                .help = "public origin of this server (https, or http on localhost, 127.0.0.1 or ::1): the issuer of its tokens; their audience is this URL with --mcp-path",
                .parse = flag_parse_string,
                .dest = &arg_oauth_base_url,
        },
        {
                .name = "oauth-provider",
                .env = "VM_MANAGER_OAUTH_PROVIDER",
                .default_value = "dex",
                .metavar = "NAME",
                .help = "the identity provider logins are delegated to: dex or google",
                .parse = parse_oauth_provider,
                .dest = &arg_oauth_provider,
        },
        {
                .name = "oauth-trusted-audiences",
                .env = "OAUTH_TRUSTED_AUDIENCES",
                .metavar = "LIST",
                .help = "comma-separated audiences besides this server's for which the provider's own tokens are accepted (muster's forwarded id_token, the portal's)",
                .parse = parse_audiences,
                .dest = &arg_oauth_trusted_audiences,
        },
        {
                .name = "sso-allow-private-ips",
                .env = "SSO_ALLOW_PRIVATE_IPS",
                .default_value = "false",
                .help = "let the provider's discovery and JWKS be fetched from private or loopback addresses",
                .parse = flag_parse_bool,
                .dest = &arg_sso_allow_private_ips,
                .is_bool = true,
        },
        {
                .name = "allow-public-client-registration",
                .env = "VM_MANAGER_OAUTH_ALLOW_PUBLIC_REGISTRATION",
                .default_value = "false",
                .help = "open RFC 7591 dynamic client registration to anyone (labs, MCP clients that register themselves)",
                .parse = flag_parse_bool,
                .dest = &arg_allow_public_client_registration,
                .is_bool = true,
        },
        {
                .name = "dex-issuer-url",
                .env = "DEX_ISSUER_URL",
                .metavar = "URL",
                .help = "issuer URL of Dex (its OpenID discovery is fetched from there)",
                .parse = flag_parse_string,
                .dest = &arg_dex_issuer_url,
        },
        {
                .name = "dex-client-id",
                .env = "DEX_CLIENT_ID",
                .metavar = "ID",
                .help = "client ID of vm-manager at Dex",
                .parse = flag_parse_string,
                .dest = &arg_dex_client_id,
        },
        {
                .name = "dex-client-secret",
                .env = "DEX_CLIENT_SECRET",
                .metavar = "SECRET",
                .help = "client secret of vm-manager at Dex (prefer the environment to the command line)",
                .parse = flag_parse_string,
                .dest = &arg_dex_client_secret,
        },
        {
                .name = "dex-ca-file",
                .env = "DEX_CA_FILE",
                .metavar = "PATH",
                .help = "PEM bundle trusted for Dex in addition to the system's roots",
                .parse = flag_parse_directory,
                .dest = &arg_dex_ca_file,
        },
        {
                .name = "allow-private-oauth-urls",
                .env = "VM_MANAGER_OAUTH_ALLOW_PRIVATE_URLS",
                .default_value = "false",
                .help = "let Dex be on a private or loopback address (discovery, JWKS and the code exchange)",
                .parse = flag_parse_bool,
                .dest = &arg_allow_private_oauth_urls,
                .is_bool = true,
        },
        {
                .name = "google-client-id",
                .env = "GOOGLE_CLIENT_ID",
                .metavar = "ID",
                .help = "OAuth client ID of vm-manager at Google",
                .parse = flag_parse_string,
                .dest = &arg_google_client_id,
        },
        {
                .name = "google-client-secret",
                .env = "GOOGLE_CLIENT_SECRET",
                .metavar = "SECRET",
                .help = "OAuth client secret of vm-manager at Google (prefer the environment to the command line)",
                .parse = flag_parse_string,
                .dest = &arg_google_client_secret,
        },
        {
                .name = "log-level",
                .env = "VM_MANAGER_LOG_LEVEL",
                .default_value = "info",
                .metavar = "LEVEL",
                .help = "debug, info, notice, warning or error; debug logs every request with its duration",
                .parse = flag_parse_log_level,
                .dest = &arg_log_level,
        },
};

static void free_args(void) {
        arg_listen = mfree(arg_listen);
        arg_mcp_path = mfree(arg_mcp_path);
        arg_state_dir = mfree(arg_state_dir);
        arg_image_dir = mfree(arg_image_dir);
        arg_network_subnet = mfree(arg_network_subnet);
        arg_default_network = mfree(arg_default_network);
        arg_ovmf_code = mfree(arg_ovmf_code);
        arg_ovmf_vars = mfree(arg_ovmf_vars);
        arg_oauth_base_url = mfree(arg_oauth_base_url);
        arg_oauth_trusted_audiences = strv_free(arg_oauth_trusted_audiences);
        arg_dex_issuer_url = mfree(arg_dex_issuer_url);
        arg_dex_client_id = mfree(arg_dex_client_id);
        arg_dex_client_secret = mfree(arg_dex_client_secret);
        arg_dex_ca_file = mfree(arg_dex_ca_file);
        arg_google_client_id = mfree(arg_google_client_id);
        arg_google_client_secret = mfree(arg_google_client_secret);
}

static AuthConfig oauth_config(void) {
        return (AuthConfig){
                .base_url = arg_oauth_base_url,
                .mcp_path = arg_mcp_path,
                .provider = arg_oauth_provider,
                .dex_issuer_url = arg_dex_issuer_url,
                .dex_client_id = arg_dex_client_id,
                .dex_client_secret = arg_dex_client_secret,
                .dex_ca_file = arg_dex_ca_file,
                .google_client_id = arg_google_client_id,
                .google_client_secret = arg_google_client_secret,
                .trusted_audiences = arg_oauth_trusted_audiences,
                .allow_private_oauth_urls = arg_allow_private_oauth_urls,
                .sso_allow_private_ips = arg_sso_allow_private_ips,
                .allow_public_client_registration = arg_allow_public_client_registration,
                .state_dir = arg_state_dir,
        };
}

static int default_ovmf(void) {
        const char *code = ovmf_pairs[0][0], *vars = ovmf_pairs[0][1];

        if (arg_ovmf_code && arg_ovmf_vars)
                return 0;
        for (size_t i = 0; i < ELEMENTSOF(ovmf_pairs); i++)
                if (access(ovmf_pairs[i][0], R_OK) >= 0 && access(ovmf_pairs[i][1], R_OK) >= 0) {
                        code = ovmf_pairs[i][0];
                        vars = ovmf_pairs[i][1];
                        break;
                }
        if (!arg_ovmf_code && !(arg_ovmf_code = strdup(code)))
                return -ENOMEM;
        if (!arg_ovmf_vars && !(arg_ovmf_vars = strdup(vars)))
                return -ENOMEM;
        return 0;
}

typedef enum DaemonPhase {
        DAEMON_STARTING,
        DAEMON_RUNNING,
        DAEMON_STOPPING,
} DaemonPhase;

typedef struct Daemon {
        sd_event *event;
        Manager *manager;
        ApiRest *rest;
        McpServer *mcp;
        ImdsServer *imds;
        HttpServer *http;
        Auth *auth; /* --enable-oauth */
        Tracer *tracer;
        sd_event_source *sigterm, *sigint, *drain_timer, *ready_defer;
        sd_event_source *test_sleep; /* $VM_MANAGER_TEST_LOOP_SLEEP_MS (debug builds) */
        usec_t test_sleep_usec;
        LoopWatchdog *watchdog;
        DaemonPhase phase;
        usec_t stop_deadline;
        usec_t requests_deadline;
        bool vms_stopped;
        int lock_fd;
} Daemon;

static void daemon_done(Daemon *d) {
        d->http = http_server_free(d->http);
        d->auth = auth_free(d->auth);
        d->mcp = mcp_server_free(d->mcp);
        d->rest = api_rest_free(d->rest);
        d->imds = imds_server_free(d->imds);
        d->manager = manager_free(d->manager);
        /* last of the span producers gone: send what they left */
        d->tracer = tracer_free(d->tracer, TRACE_FLUSH_TIMEOUT);
        d->sigterm = sd_event_source_disable_unref(d->sigterm);
        d->sigint = sd_event_source_disable_unref(d->sigint);
        d->drain_timer = sd_event_source_disable_unref(d->drain_timer);
        d->ready_defer = sd_event_source_disable_unref(d->ready_defer);
        d->test_sleep = sd_event_source_disable_unref(d->test_sleep);
        d->watchdog = loop_watchdog_free(d->watchdog);
        d->event = sd_event_unref(d->event);
        d->lock_fd = safe_close(d->lock_fd);
}

/* The state-dir default chain: $XDG_STATE_HOME, then ~/.local/state, then /var/lib. */
int default_state_dir(char **ret) {
        const char *e;
        char *p;

        e = secure_getenv("XDG_STATE_HOME");
        if (e && e[0] == '/') {
                if (asprintf(&p, "%s/vm-manager", e) < 0)
                        return -ENOMEM;
        } else if ((e = secure_getenv("HOME")) && e[0] == '/' && !streq(e, "/")) {
                if (asprintf(&p, "%s/.local/state/vm-manager", e) < 0)
                        return -ENOMEM;
        } else {
                p = strdup("/var/lib/vm-manager");
                if (!p)
                        return -ENOMEM;
        }
        *ret = p;
        return 0;
}

static int make_private_dir(const char *path) {
        struct stat st;
        int r;

        r = mkdir_p(path, 0750);
        if (r < 0)
                return log_error_errno(r, "Failed to create directory '%s': %m", path);
        if (stat(path, &st) < 0)
                return log_error_errno(errno, "Failed to stat '%s': %m", path);
        if (st.st_uid == geteuid() && (st.st_mode & 0007) && chmod(path, st.st_mode & 0770) < 0)
                log_warning_errno(errno, "Failed to restrict the mode of '%s', ignoring: %m", path);
        return 0;
}

/* Takes the state directory's lock: one daemon per directory. Names the holder when refused. */
static int lock_state_dir(const char *dir, int *ret_fd) {
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int fd = -EBADF;
        char pid[32];

        if (asprintf(&path, "%s/" LOCK_FILE, dir) < 0)
                return log_oom();
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640);
        if (fd < 0)
                return log_error_errno(errno, "Failed to open lock file '%s': %m", path);

        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                char holder[32] = "";
                ssize_t n;

                if (errno != EWOULDBLOCK)
                        return log_error_errno(errno, "Failed to lock '%s': %m", path);
                n = pread(fd, holder, sizeof(holder) - 1, 0);
                if (n > 0)
                        holder[strcspn(holder, "\n")] = 0;
                else
                        holder[0] = 0;
                return log_error_errno(
                        EBUSY,
                        "State directory '%s' is in use by another vm-manager (pid %s); stop it or pass another --state-dir.",
                        dir,
                        *holder ? holder : "unknown");
        }

        snprintf(pid, sizeof(pid), "%d\n", (int) getpid());
        if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, strlen(pid), 0) < 0)
                log_warning_errno(errno, "Failed to record our pid in '%s', ignoring: %m", path);
        *ret_fd = TAKE_FD(fd);
        return 0;
}

static void serve_metrics(Daemon *d, HttpRequest *req) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *text = NULL;
        size_t size = 0;
        int r;

        if (!d->manager) {
                (void) http_request_reply_text(req, 503, "starting\n");
                return;
        }
        /* VM names and addresses: not for a page that rebound its name to our loopback address */
        if (http_request_check_site(req, &e) < 0) {
                (void) http_request_reply_error_status(req, 403, &e);
                return;
        }
        r = manager_metrics_text(d->manager, &text, &size);
        if (r < 0) {
                (void) api_error_set(&e, r, API_ERROR_INTERNAL, "metrics: %s", strerror(-r));
                (void) http_request_reply_error(req, &e);
                return;
        }
        (void) http_request_reply(req, 200, METRICS_CONTENT_TYPE, text, size);
}

/* MCP and REST, for a request the guard let through (its caller attached) or any without OAuth. */
static void dispatch_api(HttpRequest *req, void *userdata) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        Daemon *d = userdata;

        if (d->mcp && mcp_server_handle(d->mcp, req))
                return;
        if (d->rest && api_rest_handle(d->rest, req))
                return;

        (void) api_error_set(
                &e,
                -ENOENT,
                API_ERROR_NOT_FOUND,
                "no route %s %s",
                http_request_method(req),
                http_request_path(req));
        (void) http_request_reply_error(req, &e);
}

static void handle_request(HttpRequest *req, void *userdata) {
        Daemon *d = userdata;
        const char *method = http_request_method(req), *path = http_request_path(req);
        bool get = streq(method, "GET") || streq(method, "HEAD");

        if (get && streq(path, "/healthz")) {
                (void) http_request_reply_text(req, 200, "ok\n");
                return;
        }
        if (get && streq(path, "/readyz")) {
                if (d->phase == DAEMON_RUNNING)
                        (void) http_request_reply_text(req, 200, "ok\n");
                else
                        (void) http_request_reply_text(
                                req, 503, d->phase == DAEMON_STARTING ? "starting\n" : "stopping\n");
                return;
        }

        if (get && streq(path, "/metrics") && arg_metrics_enabled) {
                serve_metrics(d, req);
                return;
        }

        /* --enable-oauth: the OAuth routes, and no further without a valid token */
        if (d->auth && auth_handle(d->auth, req, dispatch_api, d))
                return;
        dispatch_api(req, d);
}

static bool address_is_loopback(const char *address) {
        return strneq(address, "127.", 4) || strneq(address, "[::1]:", 6);
}

static int on_drain(sd_event_source *s, usec_t usec, void *userdata) {
        Daemon *d = userdata;
        unsigned active = http_server_active_requests(d->http);

        /* Requests get SHUTDOWN_GRACE whatever their clients do; VMs get their stop timeout. */
        if ((active == 0 || usec >= d->requests_deadline) && (d->vms_stopped || usec >= d->stop_deadline)) {
                if (active > 0)
                        log_warning("Shutdown grace period over, dropping %u request(s) still open.", active);
                return sd_event_exit(sd_event_source_get_event(s), 0);
        }
        (void) sd_event_source_set_time(s, usec + 20 * USEC_PER_MSEC);
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

static void on_vms_stopped(void *userdata) {
        Daemon *d = userdata;

        d->vms_stopped = true;
}

static int on_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Daemon *d = userdata;
        usec_t now = now_usec(CLOCK_MONOTONIC);
        int r;

        if (d->phase == DAEMON_STOPPING) {
                log_notice("Received %s again, exiting now.", strsignal((int) si->ssi_signo));
                /* what still waits for a VM hears it now, while its request can still be answered */
                if (d->manager)
                        manager_abandon(d->manager);
                return sd_event_exit(sd_event_source_get_event(s), 0);
        }

        log_info("Received %s, shutting down.", strsignal((int) si->ssi_signo));
        d->phase = DAEMON_STOPPING;
        (void) sd_notify(false, "STOPPING=1\nSTATUS=Shutting down");
        http_server_quiesce(d->http);
        /* VMs in units stay (--detach-vms-on-exit) for the next daemon; plain children are powered
         * down before we go (on_vms_stopped) */
        if (!d->manager || manager_shutdown(d->manager, on_vms_stopped, d) == 0)
                d->vms_stopped = true;

        d->stop_deadline = now + MAX(SHUTDOWN_GRACE, arg_stop_timeout + 10 * USEC_PER_SEC);
        d->requests_deadline = now + SHUTDOWN_GRACE;
        r = sd_event_add_time(
                sd_event_source_get_event(s), &d->drain_timer, CLOCK_MONOTONIC, now, USEC_PER_MSEC, on_drain, d);
        if (r < 0)
                return sd_event_exit(sd_event_source_get_event(s), 0);
        return 0;
}

static int on_started(sd_event_source *s, void *userdata) {
        Daemon *d = userdata;

        /* Everything the daemon needs was set up before the loop ran its first iteration. */
        d->phase = DAEMON_RUNNING;
        log_struct(
                LOG_INFO,
                LOG_FIELDS({ "LISTEN", http_server_address(d->http) }, { "STATE_DIR", arg_state_dir }),
                "vm-manager %s serving on http://%s",
                vmm_version,
                http_server_address(d->http));
        (void) sd_notifyf(false, "READY=1\nSTATUS=Serving on %s", http_server_address(d->http));
        return 0;
}

/* The test hook that proves the loop watchdog: one iteration that sleeps on the loop. The sleep goes
 * on after a signal (the watchdog's stack sample interrupts it). */
static int on_test_loop_sleep(sd_event_source *s, uint64_t usec, void *userdata) {
        Daemon *d = userdata;
        struct timespec ts = {
                .tv_sec = (time_t) (d->test_sleep_usec / USEC_PER_SEC),
                .tv_nsec = (long) ((d->test_sleep_usec % USEC_PER_SEC) * NSEC_PER_USEC),
        };

        log_warning(
                "Sleeping %" PRIu64 " ms on the event loop (test hook).", d->test_sleep_usec / USEC_PER_MSEC);
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        return 0;
}

/* The loop watchdog: on in debug builds, or with $VM_MANAGER_LOOP_WATCHDOG=1 or a report file
 * ($VM_MANAGER_LOOP_WATCHDOG_REPORT, which the integration tests set); and, in debug builds only,
 * $VM_MANAGER_TEST_LOOP_SLEEP_MS, an iteration that sleeps that long soon after start-up. */
static int setup_loop_watchdog(Daemon *d) {
        const char *e = secure_getenv("VM_MANAGER_LOOP_WATCHDOG"),
                   *report = secure_getenv("VM_MANAGER_LOOP_WATCHDOG_REPORT");
        bool enabled = VMM_TEST_HOOKS;
        uint32_t ms;
        int r;

        if (e && *e) {
                r = parse_boolean(e);
                if (r < 0)
                        log_warning("Ignoring $VM_MANAGER_LOOP_WATCHDOG='%s': not a boolean.", e);
                else
                        enabled = r;
        }
        if (report && !*report)
                report = NULL;
        r = loop_watchdog_new(
                &d->watchdog, d->event, &(LoopWatchdogOptions){ .enabled = enabled, .report_path = report });
        if (r < 0)
                return log_error_errno(r, "Failed to set up the event loop: %m");
        if (loop_watchdog_enabled(d->watchdog))
                log_info(
                        "Loop watchdog on: event loop iterations over %" PRIu64 " ms are logged%s%s.",
                        LOOP_WATCHDOG_THRESHOLD / USEC_PER_MSEC,
                        report ? " and reported to " : "",
                        report ?: "");

        e = secure_getenv("VM_MANAGER_TEST_LOOP_SLEEP_MS");
        if (!e || !*e)
                return 0;
        if (!VMM_TEST_HOOKS) {
                log_warning("Ignoring $VM_MANAGER_TEST_LOOP_SLEEP_MS: test hooks are in debug builds only.");
                return 0;
        }
        if (safe_atou32(e, &ms) < 0 || ms == 0 || ms > 10000) {
                log_warning("Ignoring $VM_MANAGER_TEST_LOOP_SLEEP_MS='%s': not 1 to 10000.", e);
                return 0;
        }
        d->test_sleep_usec = (usec_t) ms * USEC_PER_MSEC;
        r = sd_event_add_time_relative(
                d->event,
                &d->test_sleep,
                CLOCK_MONOTONIC,
                200 * USEC_PER_MSEC,
                USEC_PER_MSEC,
                on_test_loop_sleep,
                d);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the loop sleep test hook: %m");
        (void) sd_event_source_set_description(d->test_sleep, "test-loop-sleep");
        return 0;
}

static int listen_fd_from_systemd(void) {
        int n = sd_listen_fds(true);

        if (n <= 0)
                return -EBADF;
        if (n > 1)
                log_warning("Received %d sockets from systemd, using the first.", n);
        return SD_LISTEN_FDS_START;
}

static int run(int self_exe_fd) {
        _cleanup_(daemon_done) Daemon d = { .lock_fd = -EBADF };
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        _cleanup_free_ char *message = NULL;
        sigset_t mask;
        int r;

        r = sd_event_default(&d.event);
        if (r < 0)
                return log_error_errno(r, "Failed to allocate the event loop: %m");
        r = setup_loop_watchdog(&d);
        if (r < 0)
                return r;

        /* OTEL_*: a configuration that cannot work stops us before anything is touched */
        r = tracer_new_from_env(&d.tracer, d.event, vmm_version, &message);
        if (r < 0)
                return log_error_errno(r, "%s", message ?: "Failed to set up tracing: %m");
        if (message)
                log_warning("%s", message);
        if (d.tracer)
                log_info("Exporting traces to %s.", tracer_endpoint(d.tracer));

        r = make_private_dir(arg_state_dir);
        if (r < 0)
                return r;
        r = lock_state_dir(arg_state_dir, &d.lock_fd);
        if (r < 0)
                return r;
        r = make_private_dir(arg_image_dir);
        if (r < 0)
                return r;

        (void) sd_event_set_watchdog(d.event, true);

        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGCHLD);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return log_error_errno(errno, "Failed to block signals: %m");
        r = sd_event_add_signal(d.event, &d.sigterm, SIGTERM, on_signal, &d);
        if (r >= 0)
                r = sd_event_add_signal(d.event, &d.sigint, SIGINT, on_signal, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to watch signals: %m");
        (void) signal(SIGPIPE, SIG_IGN);

        /* Each connection is a descriptor: the soft limit (1024 under systemd) would stop accepting
         * long before --http-max-connections. We use no select(), so take the hard limit. */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) >= 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                        log_debug_errno(errno, "Failed to raise the descriptor limit, ignoring: %m");
        }

        r = http_server_new(
                &d.http,
                d.event,
                &(HttpServerOptions){
                        .listen = arg_listen,
                        .listen_fd = listen_fd_from_systemd(),
                        .max_body = HTTP_MAX_BODY_DEFAULT,
                        .max_connections = arg_http_max_connections,
                        .max_connections_per_peer = arg_http_max_connections_per_peer,
                        .request_timeout = arg_http_request_timeout,
                        .handler = handle_request,
                        .userdata = &d,
                },
                &e);
        if (r < 0)
                return log_error_errno(r, "%s", e.message ?: "Failed to start the HTTP server: %m");

        if (arg_enable_oauth) {
                AuthConfig c = oauth_config();

                r = auth_new(&d.auth, d.event, &c, &e);
                if (r < 0)
                        return log_error_errno(r, "%s", e.message ?: "Failed to set up OAuth: %m");
                log_info(
                        "OAuth on: tokens for %s from '%s' (%s)%s.",
                        auth_resource(d.auth),
                        arg_oauth_provider == AUTH_PROVIDER_GOOGLE ? AUTH_GOOGLE_ISSUER : arg_dex_issuer_url,
                        auth_provider_to_string(arg_oauth_provider),
                        arg_allow_public_client_registration ? ", dynamic client registration open" : "");
        } else if (!address_is_loopback(http_server_address(d.http)))
                log_warning(
                        "Serving on %s without --enable-oauth: anyone who reaches it controls the VMs.",
                        http_server_address(d.http));

        r = manager_new(
                &d.manager,
                d.event,
                &(ManagerConfig){
                        .state_dir = arg_state_dir,
                        .image_dir = arg_image_dir,
                        .default_network = arg_default_network,
                        .network_subnet = arg_network_subnet,
                        .ovmf_code = arg_ovmf_code,
                        .ovmf_vars = arg_ovmf_vars,
                        .accel = arg_accel,
                        .vsock = arg_vsock,
                        .install_timeout = arg_install_timeout,
                        .boot_timeout = arg_boot_timeout,
                        .stop_timeout = arg_stop_timeout,
                        .qmp_timeout = arg_qmp_timeout,
                        .tcg_tb_size_mib = arg_tcg_tb_size_mib,
                        .guest_report_interval = arg_guest_report_interval,
                        .notify_port = arg_notify_port,
                        .launcher = arg_launcher,
                        .install_mode = arg_install_mode,
                        .detach_vms_on_exit = arg_detach_vms_on_exit,
                        .guest_series_limit = arg_metrics_guest_series_limit,
                        .self_exe_fd = self_exe_fd,
                        .loop_stats = loop_watchdog_stats(d.watchdog),
                        .attestation = arg_attestation,
                        .attestation_learn_golden = arg_attestation_learn_golden,
                        .firmware_run = arg_firmware_run,
                        .version = vmm_version,
                        .commit = vmm_commit,
                        .built = vmm_build_time,
                },
                &e);
        if (r < 0)
                return log_error_errno(r, "%s", e.message ?: "Failed to load the state: %m");

        /* a failed start-up from here on leaves the VMs of units running */
        manager_hold_vms(d.manager, true);
        r = imds_server_new(d.manager, &d.imds);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the metadata service: %m");
        r = api_rest_new(&d.rest, d.manager, d.tracer);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the REST API: %m");

        r = mcp_server_new(
                &d.mcp,
                d.manager,
                &(McpServerOptions){
                        .path = arg_mcp_path,
                        .loopback_only = address_is_loopback(http_server_address(d.http)),
                        .tracer = d.tracer,
                        .keepalive = arg_mcp_keepalive,
                });
        if (r < 0)
                return log_error_errno(r, "Failed to set up MCP: %m");

        manager_hold_vms(d.manager, false);

        r = sd_event_add_defer(d.event, &d.ready_defer, on_started, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to schedule start-up: %m");

        r = loop_watchdog_run(d.watchdog);
        if (r < 0)
                return log_error_errno(r, "Event loop failed: %m");
        log_info("vm-manager stopped.");
        return 0;
}

void serve_help(void) {
        printf("Usage: vm-manager serve [FLAGS]\n\n"
               "Runs the vm-manager daemon in the foreground: REST under /api/v1, MCP at --mcp-path,\n"
               "/healthz and /readyz, until SIGTERM or SIGINT. Every flag has an environment fallback;\n"
               "flags win over the environment.\n\nFlags:\n");
        flags_print_help(stdout, serve_flags, ELEMENTSOF(serve_flags));
        printf("  --help, -h\n        show this help\n");
}

int serve_main(int argc, char **argv) {
        /* First of all, our own executable: the helpers we run (host installs, exec_vm's ssh
         * sessions) are this file, whatever a rebuild or an upgrade puts at its path meanwhile. */
        _cleanup_close_ int self_exe = open("/proc/self/exe", O_PATH | O_CLOEXEC);
        bool help;
        int r;

        if (self_exe < 0) {
                log_error_errno(errno, "Failed to open our own executable (/proc/self/exe): %m");
                return EXIT_FAILURE;
        }

        r = flags_parse(serve_flags, ELEMENTSOF(serve_flags), argc, argv, "serve", &help, /* ret_args= */ NULL);
        if (r < 0) {
                free_args();
                return EXIT_FAILURE;
        }
        if (help) {
                serve_help();
                free_args();
                return EXIT_SUCCESS;
        }
        log_set_max_level(arg_log_level);

        if (!arg_state_dir && default_state_dir(&arg_state_dir) < 0) {
                log_oom();
                free_args();
                return EXIT_FAILURE;
        }
        if (default_ovmf() < 0) {
                log_oom();
                free_args();
                return EXIT_FAILURE;
        }
        if (!arg_image_dir && asprintf(&arg_image_dir, "%s/images", arg_state_dir) < 0) {
                arg_image_dir = NULL;
                log_oom();
                free_args();
                return EXIT_FAILURE;
        }
        if (arg_enable_oauth) {
                _cleanup_free_ char *message = NULL;
                AuthConfig c = oauth_config();

                if (auth_config_check(&c, &message) < 0) {
                        log_error("%s", message ?: "oauth: bad configuration");
                        free_args();
                        return EXIT_FAILURE;
                }
        }

        r = run(self_exe);
        free_args();
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
