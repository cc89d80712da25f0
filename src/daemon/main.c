/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdio.h>
#include <stdlib.h>

#include "cleanup.h"
#include "cli.h"
#include "host-install.h"
#include "image-golden.h"
#include "image-oci.h"
#include "imds-keys.h"
#include "macro.h"
#include "manager-firmware.h"
#include "serve.h"
#include "version.h"
#include "vm-exec-helper.h"
#include "vm-guard.h"

static void main_help(void) {
        printf("Usage: vm-manager COMMAND [FLAGS]\n\n"
               "Turns a KVM host into a small cloud region: VMs with an instance metadata service,\n"
               "a vTPM with measured boot and attestation, served over REST and MCP.\n\n"
               "Commands:\n"
               "  serve      run the daemon in the foreground\n"
               "  version    print the release version, commit and build time\n"
               "  imds-hwdb  print the guest image's systemd-imdsd hwdb record\n"
               "  image golden IMAGE (--from-vm ID | --clear)\n"
               "             record (or clear) an image's golden PCRs from a verified VM\n"
               "  image push [FLAGS] IMAGE REF\n"
               "             publish an image of --image-dir as an OCI artifact\n"
               "  image pull [FLAGS] REF\n"
               "             install an image from an OCI artifact into --image-dir\n"
               "  help       show this help, or a command's: vm-manager help serve\n\n");
        cli_help(stdout);
        printf("\nEvery command takes --help.\n");
}

static void version_help(void) {
        printf("Usage: vm-manager version\n\nPrints the release version, the commit and the build time.\n");
}

static int version_main(int argc, char **argv) {
        for (int i = 0; i < argc; i++) {
                if (streq(argv[i], "--help") || streq(argv[i], "-h")) {
                        version_help();
                        return EXIT_SUCCESS;
                }
                fprintf(stderr,
                        "Error: version: unexpected %s '%s'\n",
                        argv[i][0] == '-' ? "flag" : "argument",
                        argv[i]);
                return EXIT_FAILURE;
        }
        printf("vm-manager version %s\n  commit: %s\n  built:  %s\n", vmm_version, vmm_commit, vmm_build_time);
        return EXIT_SUCCESS;
}

static void imds_hwdb_help(void) {
        printf("Usage: vm-manager imds-hwdb\n\n"
               "Prints the hwdb record that tells a guest's systemd-imdsd where vm-manager's metadata\n"
               "service is and which keys it serves, generated from the daemon's own key table.\n");
}

static int imds_hwdb_main(int argc, char **argv) {
        _cleanup_free_ char *record = NULL;

        if (argc > 0) {
                if (streq(argv[0], "--help") || streq(argv[0], "-h")) {
                        imds_hwdb_help();
                        return EXIT_SUCCESS;
                }
                fprintf(stderr, "Error: imds-hwdb: unexpected argument '%s'\n", argv[0]);
                return EXIT_FAILURE;
        }
        record = imds_hwdb_record();
        if (!record) {
                fprintf(stderr, "Error: imds-hwdb: out of memory\n");
                return EXIT_FAILURE;
        }
        fputs(record, stdout);
        return EXIT_SUCCESS;
}

/* vm-manager image push|pull; everything else goes to image golden's own handling. */
static int image_dispatch(int argc, char **argv) {
        if (argc == 0 || streq(argv[0], "--help") || streq(argv[0], "-h")) {
                image_help();
                return argc == 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        }
        if (streq(argv[0], "push"))
                return image_push_main(argc - 1, argv + 1);
        if (streq(argv[0], "pull"))
                return image_pull_main(argc - 1, argv + 1);
        return image_main(argc, argv);
}

static int help_main(int argc, char **argv) {
        if (argc == 0 || streq(argv[0], "--help") || streq(argv[0], "-h")) {
                main_help();
                return EXIT_SUCCESS;
        }
        if (argc == 2 && streq(argv[0], "image")) {
                if (streq(argv[1], "golden"))
                        image_golden_help();
                else if (streq(argv[1], "push"))
                        image_push_help();
                else if (streq(argv[1], "pull"))
                        image_pull_help();
                else {
                        fprintf(stderr, "Error: help: unknown command 'image %s'\n", argv[1]);
                        return EXIT_FAILURE;
                }
                return EXIT_SUCCESS;
        }
        if (argc > 1) {
                fprintf(stderr, "Error: help: takes at most one command\n");
                return EXIT_FAILURE;
        }
        if (streq(argv[0], "serve"))
                serve_help();
        else if (streq(argv[0], "version"))
                version_help();
        else if (streq(argv[0], "imds-hwdb"))
                imds_hwdb_help();
        else if (streq(argv[0], "image"))
                image_help();
        else if (streq(argv[0], "help"))
                main_help();
        else {
                fprintf(stderr, "Error: help: unknown command '%s'\n", argv[0]);
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}

int main(int argc, char **argv) {
        static const struct {
                const char *name;
                int (*run)(int argc, char **argv);
        } commands[] = {
                { "serve", serve_main },
                { "version", version_main },
                { "imds-hwdb", imds_hwdb_main },
                { "image", image_dispatch },
                { "help", help_main },
                /* hidden: the daemon's helper processes, for a host install (host-install.h), for
                 * exec_vm's ssh session (vm-exec-helper.h), around swtpm_setup (vm-guard.h) and the firmware
                 * run (manager-firmware.h) */
                { "host-install", host_install_main },
                { "exec-ssh", vm_exec_helper_main },
                { "guard", vm_guard_main },
                { "firmware-run", firmware_run_main },
        };
        const char *cmd;

        /* tss2 would print a warning for every malformed structure a guest sends us */
        (void) setenv("TSS2_LOG", "all+none", /* overwrite= */ 0);

        if (argc < 2) {
                main_help();
                return EXIT_FAILURE;
        }
        cmd = argv[1];
        if (streq(cmd, "--help") || streq(cmd, "-h")) {
                main_help();
                return EXIT_SUCCESS;
        }
        if (streq(cmd, "--version"))
                return version_main(0, NULL);

        /* The client commands; "image" is also push, pull and golden, which run here. */
        if (cli_handles(argc - 1, argv + 1))
                return cli_main(argc - 1, argv + 1, SERVE_LISTEN_DEFAULT);

        for (size_t i = 0; i < ELEMENTSOF(commands); i++)
                if (streq(cmd, commands[i].name))
                        return commands[i].run(argc - 2, argv + 2);

        fprintf(stderr,
                "Error: unknown %s '%s'\nRun 'vm-manager help' for the list of commands.\n",
                cmd[0] == '-' ? "flag" : "command",
                cmd);
        return EXIT_FAILURE;
}
