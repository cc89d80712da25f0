/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * net-harness: one NetSwitch (with its libslirp gateway) on an sd-event loop, and one port on a tap
 * device it creates. Whoever holds the other side of the tap plays the guest with a real kernel
 * stack: a network namespace with its DHCP client, curl or iperf3. tests/net/test-net-wire.sh and
 * bench/net.sh drive it; the tap is created in the current namespace and they move it themselves
 * (ip link set NAME netns NS), which keeps the device and our fd on it.
 *
 * With --imds, a small metadata server listens on a unix socket registered as the port's IMDS: any
 * GET gets "200 OK" and the body "harness", then the connection is closed.
 *
 * Prints "ready" on stdout once everything is up, runs until SIGTERM or SIGINT, then prints the
 * port's counters as key=value pairs.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <systemd/sd-event.h>

#include "cleanup.h"
#include "fs-util.h"
#include "log.h"
#include "macro.h"
#include "net-switch.h"
#include "parse-util.h"
#include "socket-util.h"

#define IMDS_BODY "harness"
#define IMDS_REQUEST_MAX 4096U
#define IMDS_CONNECTIONS_MAX 64U

static const char *arg_tap = NULL;
static uint8_t arg_mac[NET_ETH_ALEN];
static bool arg_mac_set = false;
static struct in_addr arg_ip = {};
static struct in_addr arg_network = {}, arg_netmask = {};
static bool arg_cidr_set = false;
static uint32_t arg_mtu = 0;
static const char *arg_search_domain = NULL;
static bool arg_imds = false;
static bool arg_host_alias = false;

typedef struct ImdsConnection ImdsConnection;

typedef struct Harness {
        sd_event *event;
        NetSwitch *sw;
        NetPort *port;
        char *dir; /* holds the IMDS socket */
        ImdsConnection *imds_connections;
        unsigned n_imds_connections;
        uint64_t imds_requests;
} Harness;

struct ImdsConnection {
        Harness *harness;
        ImdsConnection *prev, *next;
        sd_event_source *source; /* owns the fd */
        size_t len;
        char buf[IMDS_REQUEST_MAX];
};

static ImdsConnection *imds_connection_free(ImdsConnection *c) {
        if (!c)
                return NULL;
        sd_event_source_disable_unref(c->source);
        if (c->prev)
                c->prev->next = c->next;
        else
                c->harness->imds_connections = c->next;
        if (c->next)
                c->next->prev = c->prev;
        c->harness->n_imds_connections--;
        free(c);
        return NULL;
}

static int imds_reply(int fd, const char *status, const char *body) {
        char reply[256];
        int n = snprintf(
                reply,
                sizeof(reply),
                "HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                status,
                strlen(body),
                body);

        assert(n > 0 && (size_t) n < sizeof(reply));
        /* a reply this small fits in an empty socket buffer: one send, no queue */
        return RET_NERRNO(send(fd, reply, (size_t) n, MSG_NOSIGNAL | MSG_DONTWAIT));
}

static int on_imds_data(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        ImdsConnection *c = userdata;
        ssize_t k;

        k = recv(fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
                return 0;
        if (k > 0) {
                c->len += (size_t) k;
                c->buf[c->len] = 0;
                if (!strstr(c->buf, "\r\n\r\n") && c->len < sizeof(c->buf) - 1)
                        return 0;
                if (startswith(c->buf, "GET ")) {
                        c->harness->imds_requests++;
                        (void) imds_reply(fd, "200 OK", IMDS_BODY);
                } else
                        (void) imds_reply(fd, "405 Method Not Allowed", "");
        }
        imds_connection_free(c);
        return 0;
}

static int on_imds_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Harness *h = userdata;
        _cleanup_close_ int cfd = -EBADF;
        ImdsConnection *c;
        int r;

        cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0)
                return 0;
        if (h->n_imds_connections >= IMDS_CONNECTIONS_MAX)
                return 0; /* closed at once: the guest sees a reset, as from a busy server */

        c = calloc(1, sizeof(ImdsConnection));
        if (!c)
                return 0;
        c->harness = h;
        r = sd_event_add_io(h->event, &c->source, cfd, EPOLLIN, on_imds_data, c);
        if (r < 0) {
                free(c);
                return 0;
        }
        (void) sd_event_source_set_io_fd_own(c->source, true);
        TAKE_FD(cfd);
        c->next = h->imds_connections;
        if (c->next)
                c->next->prev = c;
        h->imds_connections = c;
        h->n_imds_connections++;
        return 0;
}

static int imds_listen(Harness *h, char **ret_path) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *path = NULL;
        sd_event_source *source = NULL;
        int r;

        if (asprintf(&path, "%s/imds.sock", h->dir) < 0)
                return -ENOMEM;
        fd = unix_stream_listen(path, 128);
        if (fd < 0)
                return fd;

        r = sd_event_add_io(h->event, &source, fd, EPOLLIN, on_imds_accept, h);
        if (r < 0)
                return r;
        (void) sd_event_source_set_io_fd_own(source, true);
        TAKE_FD(fd);
        /* the loop owns it from here, and frees it with itself */
        (void) sd_event_source_set_floating(source, true);
        sd_event_source_unref(source);

        *ret_path = TAKE_PTR(path);
        return 0;
}

/* A tap device named name, in the current network namespace, one frame per read and write. */
static int tap_open(const char *name, int *ret_fd) {
        struct ifreq ifr = { .ifr_flags = IFF_TAP | IFF_NO_PI };
        _cleanup_close_ int fd = -EBADF;

        if (strlen(name) >= sizeof(ifr.ifr_name))
                return -EINVAL;
        strcpy(ifr.ifr_name, name);

        fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        if (ioctl(fd, TUNSETIFF, &ifr) < 0)
                return -errno;

        *ret_fd = TAKE_FD(fd);
        return 0;
}

static void harness_done(Harness *h) {
        /* the switch first: its slirp may still hold connections to the IMDS socket */
        h->sw = net_switch_free(h->sw);
        while (h->imds_connections)
                imds_connection_free(h->imds_connections);
        h->event = sd_event_unref(h->event);
        if (h->dir) {
                (void) rm_rf(h->dir);
                h->dir = mfree(h->dir);
        }
}

static int harness_run(void) {
        _cleanup_(harness_done) Harness h = {};
        _cleanup_close_ int tap = -EBADF;
        _cleanup_free_ char *imds_path = NULL;
        uint32_t gateway = ntohl(arg_network.s_addr) + 1;
        uint32_t broadcast = ntohl(arg_network.s_addr | ~arg_netmask.s_addr);
        NetSwitchConfig config = {
                .network = arg_network,
                .netmask = arg_netmask,
                .gateway = { htonl(gateway) },
                .host_alias = { htonl(broadcast - 1) },
                .host_alias_enabled = arg_host_alias,
                .imds_enabled = arg_imds,
                .mtu = arg_mtu,
                .search_domain = arg_search_domain,
                /* locally administered, unicast, and the gateway's address in the last four bytes */
                .gateway_mac = { 0x02, 0x4e },
        };
        sigset_t mask;
        NetStats st;
        int r;

        for (size_t i = 0; i < 4; i++)
                config.gateway_mac[2 + i] = (uint8_t) (gateway >> (24 - 8 * i));

        /* sd-event's signal sources need the signals blocked */
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return log_error_errno(errno, "Cannot block SIGTERM and SIGINT: %m");

        r = sd_event_new(&h.event);
        if (r < 0)
                return log_error_errno(r, "Cannot create the event loop: %m");
        r = sd_event_add_signal(h.event, /* ret= */ NULL, SIGTERM, /* callback= */ NULL, /* userdata= */ NULL);
        if (r >= 0)
                r = sd_event_add_signal(
                        h.event, /* ret= */ NULL, SIGINT, /* callback= */ NULL, /* userdata= */ NULL);
        if (r < 0)
                return log_error_errno(r, "Cannot watch SIGTERM and SIGINT: %m");

        r = net_switch_new(h.event, &config, &h.sw);
        if (r < 0)
                return log_error_errno(r, "Cannot create the switch: %m");
        r = net_switch_add_port(h.sw, "harness", arg_mac, arg_ip, &h.port);
        if (r < 0)
                return log_error_errno(r, "Cannot add the port for %s: %m", inet_ntoa(arg_ip));

        if (arg_imds) {
                h.dir = strdup("/tmp/net-harness-XXXXXX");
                if (!h.dir)
                        return log_oom();
                if (!mkdtemp(h.dir)) {
                        r = -errno;
                        h.dir = mfree(h.dir);
                        return log_error_errno(r, "Cannot create a directory for the IMDS socket: %m");
                }
                r = imds_listen(&h, &imds_path);
                if (r < 0)
                        return log_error_errno(r, "Cannot listen for the IMDS: %m");
                r = net_port_set_imds(h.port, imds_path);
                if (r < 0)
                        return log_error_errno(r, "Cannot register the IMDS socket: %m");
        }

        r = tap_open(arg_tap, &tap);
        if (r < 0)
                return log_error_errno(r, "Cannot create the tap device '%s': %m", arg_tap);
        r = net_port_attach_fd(h.port, TAKE_FD(tap), NET_PORT_RAW);
        if (r < 0)
                return log_error_errno(r, "Cannot attach the tap device to the port: %m");

        printf("ready\n");
        fflush(stdout);

        r = sd_event_loop(h.event);
        if (r < 0)
                return log_error_errno(r, "Event loop failed: %m");

        net_port_get_stats(h.port, &st);
        printf("rx_frames=%" PRIu64 " rx_bytes=%" PRIu64 " tx_frames=%" PRIu64 " tx_bytes=%" PRIu64
               " dropped=%" PRIu64 " imds_requests=%" PRIu64 "\n",
               st.rx_frames,
               st.rx_bytes,
               st.tx_frames,
               st.tx_bytes,
               st.dropped,
               h.imds_requests);
        fflush(stdout);
        return 0;
}

static int parse_mac(const char *s, uint8_t ret[NET_ETH_ALEN]) {
        uint8_t mac[NET_ETH_ALEN];
        unsigned v[NET_ETH_ALEN];
        int n = 0;

        if (strlen(s) != 17 ||
            sscanf(s, "%2x:%2x:%2x:%2x:%2x:%2x%n", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &n) != 6 ||
            n != 17)
                return -EINVAL;
        for (size_t i = 0; i < NET_ETH_ALEN; i++)
                mac[i] = (uint8_t) v[i];
        if (mac[0] & 1) /* a group address is no NIC's */
                return -EINVAL;
        memcpy(ret, mac, NET_ETH_ALEN);
        return 0;
}

static int parse_cidr(const char *s, struct in_addr *ret_network, struct in_addr *ret_netmask) {
        _cleanup_free_ char *addr = NULL;
        const char *slash = strchr(s, '/');
        struct in_addr a;
        uint32_t prefix, mask;

        if (!slash)
                return -EINVAL;
        addr = strndup(s, (size_t) (slash - s));
        if (!addr)
                return -ENOMEM;
        if (inet_pton(AF_INET, addr, &a) != 1 || safe_atou32(slash + 1, &prefix) < 0 || prefix < 8 ||
            prefix > 30)
                return -EINVAL;
        mask = UINT32_MAX << (32 - prefix);
        if (ntohl(a.s_addr) & ~mask) /* host bits set: not a network address */
                return -EINVAL;
        *ret_network = a;
        *ret_netmask = (struct in_addr){ htonl(mask) };
        return 0;
}

static void help(void) {
        printf("net-harness --tap NAME --mac MAC --ip ADDR --cidr NET/PREFIX [OPTIONS]\n\n"
               "One switch with its slirp gateway, and one port on a new tap device.\n\n"
               "  --tap NAME            the tap device to create (in this network namespace)\n"
               "  --mac MAC             the guest's MAC address\n"
               "  --ip ADDR             the guest's lease\n"
               "  --cidr NET/PREFIX     the network; the gateway is .1, the host alias broadcast - 1\n"
               "  --mtu N               the network's MTU (DHCP option 26, slirp's MTU); default 1500\n"
               "  --search-domain NAME  DHCP option 119\n"
               "  --imds                answer GETs to 169.254.169.254:80 with '" IMDS_BODY
               "'\n"
               "  --host-alias          the host alias reaches the host's loopback\n"
               "  --debug               log at debug level\n"
               "  -h --help             show this help\n");
}

int main(int argc, char *argv[]) {
        enum {
                ARG_TAP = 0x100,
                ARG_MAC,
                ARG_IP,
                ARG_CIDR,
                ARG_MTU,
                ARG_SEARCH_DOMAIN,
                ARG_IMDS,
                ARG_HOST_ALIAS,
                ARG_DEBUG,
        };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "tap", required_argument, NULL, ARG_TAP },
                { "mac", required_argument, NULL, ARG_MAC },
                { "ip", required_argument, NULL, ARG_IP },
                { "cidr", required_argument, NULL, ARG_CIDR },
                { "mtu", required_argument, NULL, ARG_MTU },
                { "search-domain", required_argument, NULL, ARG_SEARCH_DOMAIN },
                { "imds", no_argument, NULL, ARG_IMDS },
                { "host-alias", no_argument, NULL, ARG_HOST_ALIAS },
                { "debug", no_argument, NULL, ARG_DEBUG },
                {},
        };
        bool have_ip = false;
        int c, r;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                const char *name = NULL;

                r = 0;
                switch (c) {
                case 'h':
                        help();
                        return EXIT_SUCCESS;
                case ARG_TAP:
                        arg_tap = optarg;
                        break;
                case ARG_MAC:
                        name = "--mac";
                        r = parse_mac(optarg, arg_mac);
                        arg_mac_set = r >= 0;
                        break;
                case ARG_IP:
                        name = "--ip";
                        r = inet_pton(AF_INET, optarg, &arg_ip) == 1 ? 0 : -EINVAL;
                        have_ip = r >= 0;
                        break;
                case ARG_CIDR:
                        name = "--cidr";
                        r = parse_cidr(optarg, &arg_network, &arg_netmask);
                        arg_cidr_set = r >= 0;
                        break;
                case ARG_MTU:
                        name = "--mtu";
                        r = safe_atou32(optarg, &arg_mtu);
                        if (r >= 0 && (arg_mtu < NET_MTU_MIN || arg_mtu > NET_MTU_MAX))
                                r = -ERANGE;
                        break;
                case ARG_SEARCH_DOMAIN:
                        arg_search_domain = optarg;
                        break;
                case ARG_IMDS:
                        arg_imds = true;
                        break;
                case ARG_HOST_ALIAS:
                        arg_host_alias = true;
                        break;
                case ARG_DEBUG:
                        log_set_max_level(LOG_DEBUG);
                        break;
                default:
                        return EXIT_FAILURE;
                }
                if (r < 0) {
                        fprintf(stderr, "net-harness: invalid value for %s: '%s'\n", name, optarg);
                        return EXIT_FAILURE;
                }
        }
        if (optind < argc || !arg_tap || !arg_mac_set || !have_ip || !arg_cidr_set) {
                fprintf(stderr,
                        "net-harness: need --tap, --mac, --ip and --cidr, and nothing else; see --help\n");
                return EXIT_FAILURE;
        }

        (void) signal(SIGPIPE, SIG_IGN);
        return harness_run() < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
