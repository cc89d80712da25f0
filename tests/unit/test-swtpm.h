/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A swtpm on a unix socket in a fresh directory, for the tests that need a real TPM (credential
 * activation): started as docs/agent.md describes for development hosts ("swtpm socket --tpm2",
 * startup-clear), and tpm2-tools run against it. Tests skip when swtpm (or tpm2-tools) is not
 * installed: test_swtpm_start() then returns false. */

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "fs-util.h"
#include "test-util.h"

extern char **environ;

typedef struct TestSwtpm {
        char *dir;  /* the state, the socket and the logs */
        char *sock; /* the TPM's command socket; its control socket is sock + ".ctrl" */
        char *tcti; /* "swtpm:path=<sock>" */
        pid_t pid;
} TestSwtpm;

/* Whether an executable is on $PATH. */
static inline bool test_have(const char *name) {
        _cleanup_free_ char *cmd = NULL;

        if (asprintf(&cmd, "command -v '%s' >/dev/null 2>&1", name) < 0)
                return false;
        return system(cmd) == 0;
}

static inline bool test_swtpm_connects(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd, r;

        if (strlen(path) >= sizeof(sa.sun_path))
                return false;
        strcpy(sa.sun_path, path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return false;
        r = connect(fd, (struct sockaddr *) &sa, sizeof(sa));
        close(fd);
        return r == 0;
}

static inline void test_swtpm_stop(TestSwtpm *t) {
        if (t->pid > 0) {
                (void) kill(t->pid, SIGTERM);
                (void) waitpid(t->pid, NULL, 0);
                t->pid = 0;
        }
        if (t->dir) {
                _cleanup_free_ char *cmd = NULL;

                if (asprintf(&cmd, "rm -rf '%s'", t->dir) > 0)
                        (void) system(cmd);
        }
        t->dir = mfree(t->dir);
        t->sock = mfree(t->sock);
        t->tcti = mfree(t->tcti);
}

/* Starts a swtpm; false (and nothing started) when swtpm is missing. Its output goes to
 * <dir>/swtpm.log. */
static inline bool test_swtpm_start(TestSwtpm *t) {
        _cleanup_free_ char *state = NULL, *server = NULL, *ctrl = NULL, *log = NULL;
        char tmpl[] = "/tmp/test-swtpm-XXXXXX";
        posix_spawn_file_actions_t fa;
        struct timespec pause = { .tv_nsec = 20 * 1000 * 1000 };

        *t = (TestSwtpm){};
        if (!test_have("swtpm"))
                return false;

        assert_non_null(mkdtemp(tmpl));
        t->dir = strdup(tmpl);
        assert_non_null(t->dir);
        assert_true(asprintf(&t->sock, "%s/s", t->dir) > 0);
        assert_true(asprintf(&t->tcti, "swtpm:path=%s", t->sock) > 0);
        assert_true(asprintf(&state, "dir=%s", t->dir) > 0);
        assert_true(asprintf(&server, "type=unixio,path=%s", t->sock) > 0);
        assert_true(asprintf(&ctrl, "type=unixio,path=%s.ctrl", t->sock) > 0);
        assert_true(asprintf(&log, "%s/swtpm.log", t->dir) > 0);

        char *argv[] = {
                (char *) "swtpm",
                (char *) "socket",
                (char *) "--tpm2",
                (char *) "--tpmstate",
                state,
                (char *) "--server",
                server,
                (char *) "--ctrl",
                ctrl,
                (char *) "--flags",
                (char *) "not-need-init,startup-clear",
                NULL,
        };
        assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
        assert_int_equal(
                posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log, O_WRONLY | O_CREAT | O_TRUNC, 0644),
                0);
        assert_int_equal(posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO), 0);
        assert_int_equal(posix_spawnp(&t->pid, "swtpm", &fa, /* attrp= */ NULL, argv, environ), 0);
        posix_spawn_file_actions_destroy(&fa);

        /* Ten seconds for the socket to answer. */
        for (unsigned i = 0; !test_swtpm_connects(t->sock); i++) {
                if (i >= 500 || waitpid(t->pid, NULL, WNOHANG) != 0)
                        fail_msg("swtpm did not start, see %s", log);
                (void) nanosleep(&pause, NULL);
        }
        return true;
}

/* A path in the swtpm's directory, as a new string. */
static inline char *test_swtpm_path(const TestSwtpm *t, const char *name) {
        char *p = NULL;

        assert_true(asprintf(&p, "%s/%s", t->dir, name) > 0);
        return p;
}

/* Runs a shell command in the swtpm's directory with TPM2TOOLS_TCTI pointing at it, its output
 * appended to tools.log there. Returns the exit status (or -1). */
static inline int test_swtpm_sh(const TestSwtpm *t, const char *format, ...) {
        _cleanup_free_ char *cmd = NULL, *full = NULL;
        va_list ap;
        int k, status;

        va_start(ap, format);
        k = vasprintf(&cmd, format, ap);
        va_end(ap);
        assert_true(k > 0);
        assert_true(
                asprintf(&full, "cd '%s' && TPM2TOOLS_TCTI='%s' sh -c '%s' >>tools.log 2>&1", t->dir, t->tcti, cmd) >
                0);
        status = system(full);
        return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A whole file of the swtpm's directory. */
static inline uint8_t *test_swtpm_read(const TestSwtpm *t, const char *name, size_t *ret_size) {
        _cleanup_free_ char *p = test_swtpm_path(t, name);
        char *data = NULL;
        size_t size = 0;

        assert_int_equal(read_full_file(p, 1 << 20, &data, &size), 0);
        *ret_size = size;
        return (uint8_t *) data;
}

static inline void test_swtpm_write(const TestSwtpm *t, const char *name, const void *data, size_t size) {
        _cleanup_free_ char *p = test_swtpm_path(t, name);
        _cleanup_fclose_ FILE *f = fopen(p, "we");

        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, size, f), size);
        assert_int_equal(fflush(f), 0);
}
