/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The switch with real guests on its ports: tests/net/fake-guest processes, each on one end of a
 * socketpair whose other end is a port, and the switch's own libslirp gateway, all on one sd-event
 * loop. The checks are what guests notice: their lease over DHCP, the metadata service answering
 * each of them as itself (the gateway has to reach every guest, well beyond slirp's own 16-entry
 * ARP cache), their neighbours, and frames that claim another identity going nowhere. */
#include "test-util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "hex-util.h"
#include "net-switch.h"
#include "socket-util.h"
#include "time-util.h"

#define GUESTS_MAX 128

typedef struct Guest {
        pid_t pid;
        int out; /* its stdout */
        char *output;
        int status;
        bool done;
        char ip[INET_ADDRSTRLEN];
        char imds_path[108];
        NetPort *port;
} Guest;

typedef struct Fixture {
        sd_event *event;
        NetSwitch *sw;
        char dir[64];
        Guest guests[GUESTS_MAX];
        size_t n_guests;
} Fixture;

/* The test's metadata server: one listener per guest, answering "HTTP/1.0 200" with the guest's
 * address, so that a guest that gets another guest's answer is caught. */
typedef struct ImdsConn {
        Guest *guest;
        sd_event_source *source;
        char buf[1024];
        size_t len;
} ImdsConn;

static int on_imds_data(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        ImdsConn *c = userdata;
        ssize_t k = read(fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len);

        if (k < 0 && errno == EAGAIN)
                return 0;
        if (k > 0) {
                c->len += (size_t) k;
                c->buf[c->len] = 0;
                if (!strstr(c->buf, "\r\n\r\n"))
                        return 0;
                char reply[256];
                int n = snprintf(
                        reply,
                        sizeof(reply),
                        "HTTP/1.0 200 OK\r\nContent-Length: %zu\r\n\r\n%s",
                        strlen(c->guest->ip),
                        c->guest->ip);
                (void) loop_write(fd, reply, (size_t) n);
        }
        sd_event_source_disable_unref(c->source); /* closes fd */
        free(c);
        return 0;
}

static int on_imds_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        ImdsConn *c;

        if (cfd < 0)
                return 0;
        c = calloc(1, sizeof(ImdsConn));
        assert_non_null(c);
        c->guest = userdata;
        assert_ok(sd_event_add_io(sd_event_source_get_event(s), &c->source, cfd, EPOLLIN, on_imds_data, c));
        assert_ok(sd_event_source_set_io_fd_own(c->source, true));
        return 0;
}

static void imds_listen(Fixture *f, Guest *g) {
        int fd = unix_stream_listen(g->imds_path, 16);
        sd_event_source *src = NULL;

        assert_ok(fd);
        assert_ok(sd_event_add_io(f->event, &src, fd, EPOLLIN, on_imds_accept, g));
        assert_ok(sd_event_source_set_io_fd_own(src, true));
        assert_ok(sd_event_source_set_floating(src, true));
        sd_event_source_unref(src);
}

static const char *fake_guest(void) {
        const char *p = getenv("FAKE_GUEST");
        return p && access(p, X_OK) == 0 ? p : NULL;
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));

        assert_non_null(f);
        strcpy(f->dir, "/tmp/test-net-switch-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        assert_ok(sd_event_new(&f->event));
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        for (size_t i = 0; i < f->n_guests; i++) {
                Guest *g = &f->guests[i];
                if (!g->done && g->pid > 0) {
                        (void) kill(g->pid, SIGKILL);
                        (void) waitpid(g->pid, NULL, 0);
                }
                safe_close(g->out);
                free(g->output);
        }
        net_switch_free(f->sw);
        sd_event_unref(f->event);
        (void) rm_rf(f->dir);
        free(f);
        return 0;
}

static void switch_new(Fixture *f, const char *search_domain) {
        NetSwitchConfig c = {
                .gateway = { inet_addr("10.77.0.1") },
                .host_alias = { inet_addr("10.77.0.254") },
                .network = { inet_addr("10.77.0.0") },
                .netmask = { inet_addr("255.255.255.0") },
                .imds_enabled = true,
                .search_domain = search_domain,
                .gateway_mac = { 0x02, 0xaa, 10, 77, 0, 1 },
        };
        assert_ok(net_switch_new(f->event, &c, &f->sw));
}

static void mac_of(unsigned i, uint8_t mac[6]) {
        uint8_t m[6] = { 0x02, 0xaa, 10, 77, 0, (uint8_t) i };
        memcpy(mac, m, 6);
}

/* A port for guest i at 10.77.0.<i>, and a fake-guest process on it running the actions. claim_mac
 * is the MAC the guest says it has (0: its own). */
static Guest *guest_start(Fixture *f, unsigned i, unsigned claim_mac, char **actions) {
        Guest *g = &f->guests[f->n_guests++];
        uint8_t mac[6];
        char macs[ETHER_ADDR_STRLEN], fdarg[16];
        int sp[2], out[2];

        mac_of(i, mac);
        snprintf(g->ip, sizeof(g->ip), "10.77.0.%u", i);
        snprintf(g->imds_path, sizeof(g->imds_path), "%s/imds-%u.sock", f->dir, i);
        assert_ok(net_switch_add_port(f->sw, g->ip, mac, (struct in_addr){ inet_addr(g->ip) }, &g->port));
        imds_listen(f, g);
        assert_ok(net_port_set_imds(g->port, g->imds_path));

        assert_ok(RET_NERRNO(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp)));
        assert_ok(RET_NERRNO(pipe2(out, O_CLOEXEC)));
        mac_of(claim_mac ?: i, mac);
        ether_addr_format(mac, macs);
        g->pid = fork();
        assert_true(g->pid >= 0);
        if (g->pid == 0) {
                char *argv[32] = { (char *) fake_guest(), (char *) "--mac", macs, (char *) "--fd", fdarg };
                size_t n = 5;
                int fd = dup(sp[1]); /* without O_CLOEXEC */
                snprintf(fdarg, sizeof(fdarg), "%d", fd);
                (void) dup2(out[1], STDOUT_FILENO);
                for (char **a = actions; *a && n < ELEMENTSOF(argv) - 1; a++)
                        argv[n++] = *a;
                argv[n] = NULL;
                execv(argv[0], argv);
                _exit(127);
        }
        close(sp[1]);
        close(out[1]);
        g->out = out[0];
        assert_ok(net_port_attach_fd(g->port, sp[0], NET_PORT_STREAM));
        return g;
}

/* Runs the loop until every guest has exited (or 90 s), then reads what each printed. */
static void run_guests(Fixture *f) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + 240 * USEC_PER_SEC;
        size_t left = f->n_guests;

        while (left > 0 && now_usec(CLOCK_MONOTONIC) < deadline) {
                assert_true(sd_event_run(f->event, 20 * USEC_PER_MSEC) >= 0);
                for (size_t i = 0; i < f->n_guests; i++) {
                        Guest *g = &f->guests[i];
                        if (g->done)
                                continue;
                        if (waitpid(g->pid, &g->status, WNOHANG) == g->pid) {
                                g->done = true;
                                left--;
                        }
                }
        }
        for (size_t i = 0; i < f->n_guests; i++) {
                Guest *g = &f->guests[i];
                size_t size = 0;
                FILE *m = open_memstream(&g->output, &size);
                char buf[4096];
                ssize_t k;

                assert_non_null(m);
                if (!g->done)
                        fputs("(still running)\n", m);
                (void) fcntl(g->out, F_SETFL, O_NONBLOCK);
                while ((k = read(g->out, buf, sizeof(buf))) > 0)
                        fwrite(buf, 1, (size_t) k, m);
                fclose(m);
        }
}

static void assert_line(Guest *g, const char *prefix) {
        for (const char *l = g->output; l && *l;) {
                if (strneq(l, prefix, strlen(prefix)))
                        return;
                l = strchr(l, '\n');
                l = l ? l + 1 : NULL;
        }
        fail_msg("guest %s: no line starting with \"%s\" in:\n%s", g->ip, prefix, g->output ?: "");
}

/* 100 guests at once: each gets its own lease and its own metadata answer through the gateway. */
static void test_hundred_guests(void **state) {
        Fixture *f = *state;
        char *actions[] = { (char *) "--timeout-ms",
                            (char *) "60000",
                            (char *) "dhcp",
                            (char *) "http",
                            (char *) "169.254.169.254:80",
                            (char *) "/id",
                            NULL };

        if (!fake_guest())
                skip();
        switch_new(f, "lab.example");
        for (unsigned i = 2; i < 102; i++)
                guest_start(f, i, 0, actions);
        run_guests(f);
        for (size_t i = 0; i < f->n_guests; i++) {
                Guest *g = &f->guests[i];
                char want[128];

                snprintf(
                        want,
                        sizeof(want),
                        "ok dhcp ip=%s router=10.77.0.1 dns=10.77.0.1 mask=255.255.255.0",
                        g->ip);
                assert_line(g, want);
                snprintf(want, sizeof(want), "ok http 169.254.169.254:80 /id status=200 body=%s", g->ip);
                assert_line(g, want);
        }
        NetStats st;
        net_switch_get_stats(f->sw, &st);
        assert_true(st.rx_frames >= 100 * 6);
        assert_true(st.tx_bytes > 0 && st.rx_bytes > 0);
}

/* Neighbours reach each other; a guest claiming another's MAC gets nothing, not even DHCP. */
static void test_neighbours_and_spoofing(void **state) {
        Fixture *f = *state;
        char *server[] = { (char *) "--timeout-ms",
                           (char *) "6000",
                           (char *) "--ip",
                           (char *) "10.77.0.2",
                           (char *) "serve",
                           (char *) "8080",
                           NULL };
        char *client[] = { (char *) "--timeout-ms", (char *) "3000",           (char *) "dhcp",
                           (char *) "tcp",          (char *) "10.77.0.2:8080", NULL };
        char *spoofer[] = { (char *) "--timeout-ms", (char *) "2000", (char *) "dhcp-none", NULL };

        if (!fake_guest())
                skip();
        switch_new(f, NULL);
        Guest *s = guest_start(f, 2, 0, server);
        Guest *c = guest_start(f, 3, 0, client);
        /* port 4, but its NIC says it is guest 2 */
        Guest *x = guest_start(f, 4, 2, spoofer);
        run_guests(f);
        assert_line(s, "ok serve 8080 connections=1");
        assert_line(c, "ok dhcp ip=10.77.0.3");
        assert_line(c, "ok tcp 10.77.0.2:8080");
        assert_line(x, "ok dhcp-none");

        NetStats st;
        net_port_get_stats(x->port, &st);
        assert_true(st.dropped > 0);
}

static void test_ports(void **state) {
        Fixture *f = *state;
        uint8_t mac[6];
        NetPort *p;

        switch_new(f, NULL);
        mac_of(2, mac);
        assert_ok(net_switch_add_port(f->sw, "a", mac, (struct in_addr){ inet_addr("10.77.0.2") }, &p));
        assert_errno(
                net_switch_add_port(f->sw, "a", mac, (struct in_addr){ inet_addr("10.77.0.3") }, NULL),
                -EEXIST);
        mac_of(3, mac);
        assert_errno(
                net_switch_add_port(f->sw, "b", mac, (struct in_addr){ inet_addr("10.77.0.2") }, NULL),
                -EEXIST);
        assert_errno(
                net_switch_add_port(f->sw, "b", mac, (struct in_addr){ inet_addr("10.78.0.3") }, NULL),
                -EINVAL);
        assert_errno(
                net_switch_add_port(f->sw, "b", mac, (struct in_addr){ inet_addr("10.77.0.1") }, NULL),
                -EINVAL);
        assert_errno(
                net_switch_add_port(f->sw, "b", mac, (struct in_addr){ inet_addr("10.77.0.255") }, NULL),
                -EINVAL);
        assert_ptr_equal(net_switch_find_port(f->sw, "a"), p);
        assert_false(net_port_is_connected(p));
        net_port_remove(p);
        assert_null(net_switch_find_port(f->sw, "a"));
}

/* A client of a loopback forward: a connection to 127.0.0.1:port (the kernel completes it against
 * slirp's listener), made non-blocking for the loop. */
static int forward_connect(uint16_t port) {
        struct sockaddr_in sa = { .sin_family = AF_INET,
                                  .sin_port = htons(port),
                                  .sin_addr = { htonl(INADDR_LOOPBACK) } };
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        assert_true(fd >= 0);
        assert_ok(RET_NERRNO(connect(fd, (struct sockaddr *) &sa, sizeof(sa))));
        assert_ok(RET_NERRNO(fcntl(fd, F_SETFL, O_NONBLOCK)));
        return fd;
}

/* Runs the loop and reads fd until its end (EOF or a reset) or the timeout; returns whether it ended,
 * with what was read in buf. */
static bool forward_read_all(Fixture *f, int fd, char *buf, size_t size, usec_t timeout) {
        usec_t deadline = now_usec(CLOCK_MONOTONIC) + timeout;
        size_t n = 0;

        buf[0] = 0;
        while (now_usec(CLOCK_MONOTONIC) < deadline) {
                ssize_t k;

                assert_true(sd_event_run(f->event, 20 * USEC_PER_MSEC) >= 0);
                k = recv(fd, buf + n, size - 1 - n, 0);
                if (k > 0) {
                        n += (size_t) k;
                        buf[n] = 0;
                } else if (k == 0 || errno != EAGAIN)
                        return true;
        }
        return false;
}

/* forward_port's listener: at a free port or a given one; with no link behind the port a connection
 * ends at once (the gateway's SYN is reset) instead of hanging until slirp gives up after 75 s; with
 * a guest behind it, the connection reaches the guest's port. */
static void test_loopback_forward(void **state) {
        Fixture *f = *state;
        char *server[] = { (char *) "--timeout-ms",
                           (char *) "5000",
                           (char *) "--ip",
                           (char *) "10.77.0.3",
                           (char *) "serve",
                           (char *) "8080",
                           NULL };
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr = { htonl(INADDR_LOOPBACK) } };
        socklen_t salen = sizeof(sa);
        _cleanup_close_ int taken = -EBADF;
        uint16_t host_port, again;
        char buf[256];
        uint8_t mac[6];
        NetPort *p;
        int fd;

        switch_new(f, NULL);
        mac_of(2, mac);
        assert_ok(net_switch_add_port(f->sw, "a", mac, (struct in_addr){ inet_addr("10.77.0.2") }, &p));
        assert_ok(net_port_add_loopback_forward(p, 22, /* host_port= */ 0, &host_port));
        assert_true(host_port > 0);
        fd = forward_connect(host_port);
        assert_true(forward_read_all(f, fd, buf, sizeof(buf), 10 * USEC_PER_SEC));
        assert_string_equal(buf, "");
        safe_close(fd);

        /* the same host port again once the port (and its listener) is gone */
        net_port_remove(p);
        assert_ok(net_switch_add_port(f->sw, "a", mac, (struct in_addr){ inet_addr("10.77.0.2") }, &p));
        assert_ok(net_port_add_loopback_forward(p, 22, host_port, &again));
        assert_int_equal(again, host_port);
        /* a port another process listens on */
        taken = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(taken >= 0);
        assert_ok(RET_NERRNO(bind(taken, (struct sockaddr *) &sa, sizeof(sa))));
        assert_ok(RET_NERRNO(listen(taken, 1)));
        assert_ok(RET_NERRNO(getsockname(taken, (struct sockaddr *) &sa, &salen)));
        assert_errno(net_port_add_loopback_forward(p, 80, ntohs(sa.sin_port), &again), -EADDRINUSE);

        if (!fake_guest())
                return;
        Guest *g = guest_start(f, 3, 0, server);
        assert_ok(net_port_add_loopback_forward(g->port, 8080, /* host_port= */ 0, &host_port));
        fd = forward_connect(host_port);
        assert_true(forward_read_all(f, fd, buf, sizeof(buf), 10 * USEC_PER_SEC));
        assert_string_equal(buf, "hello from 10.77.0.3\n");
        safe_close(fd);
        run_guests(f);
        assert_line(g, "ok serve 8080 connections=1");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_ports, setup, teardown),
                cmocka_unit_test_setup_teardown(test_loopback_forward, setup, teardown),
                cmocka_unit_test_setup_teardown(test_neighbours_and_spoofing, setup, teardown),
                cmocka_unit_test_setup_teardown(test_hundred_guests, setup, teardown),
        };

        signal(SIGPIPE, SIG_IGN);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
