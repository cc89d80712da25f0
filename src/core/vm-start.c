/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The start chain of a run: swtpm and vhost-device-vsock side by side, probed every 5 ms until both
 * answer (VM_SUB_START_HELPERS), then QEMU and its monitor (VM_SUB_START_QMP). Each step reports to
 * vm_set_state(): VM_EVENT_HELPERS_UP, VM_EVENT_QMP_UP, or VM_EVENT_START_FAILED with what went wrong.
 * Nothing waits: under the systemd launcher a process is spawned when its unit's start job is queued,
 * and a unit that does not start is reported like an exit (vm_launched_error()); the swtpm probe is a
 * non-blocking connection whose answer an io source reads.
 *
 * Steps that may take long (an install on the host, a disk copied) belong before the chain, off the
 * loop in a helper process whose end starts it, as the probe does here for swtpm. The firmware's
 * variables are copied by the Manager's file writer while swtpm starts; the probe holds QEMU back
 * until the copy is done. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "attest-ca.h"
#include "attest-predict.h"
#include "file-writer.h"
#include "fs-util.h"
#include "host-probe.h"
#include "image-catalog.h"
#include "log.h"
#include "network.h"
#include "socket-util.h"
#include "vm-cmdline.h"
#include "vm-internal.h"

#define VM_SWTPM_START_TIMEOUT (5 * USEC_PER_SEC)
#define VM_PROBE_INTERVAL (5 * USEC_PER_MSEC)
#define VM_SWTPM_PROBE_WAIT (200 * USEC_PER_MSEC) /* for one probe's answer */
/* swtpm_setup takes 0.6-0.8 s on an idle host (it starts a swtpm of its own); a loaded one gets more */
#define VM_TPM_SETUP_TIMEOUT (30 * USEC_PER_SEC)

static void start_failed(Vm *v, int r, VmMessage m, const VmMessageArgs *a);
static bool vars_ready(Vm *v);

static int on_swtpm_answer(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Vm *v = userdata;
        uint8_t answer[8];
        ssize_t n;

        n = read(fd, answer, sizeof(answer));
        if (n < 0 && errno == EAGAIN)
                return 0;
        if (n == sizeof(answer))
                v->swtpm_up = true; /* the next probe tick goes on */
        v->swtpm_probe = sd_event_source_disable_unref(v->swtpm_probe);
        return 0;
}

/* swtpm's control channel answers CMD_GET_CAPABILITY (00 00 00 01) with 8 bytes once it is up. A
 * probe connects without blocking and writes the command; on_swtpm_answer() reads the answer. One
 * that got none within VM_SWTPM_PROBE_WAIT is dropped, and the next tick makes another. */
static void swtpm_probe(Vm *v, usec_t usec) {
        static const uint8_t cmd[4] = { 0, 0, 0, 1 };
        _cleanup_free_ char *ctrl = NULL;
        _cleanup_close_ int fd = -EBADF;

        if (v->swtpm_up)
                return;
        if (v->swtpm_probe) {
                if (usec < v->swtpm_probe_started + VM_SWTPM_PROBE_WAIT)
                        return;
                v->swtpm_probe = sd_event_source_disable_unref(v->swtpm_probe);
        }
        ctrl = vm_path(v, "tpm/swtpm.sock");
        if (!ctrl)
                return;
        /* a unix socket connects at once, or not (not listening yet, backlog full) */
        fd = unix_stream_connect(ctrl, /* nonblock= */ true);
        if (fd < 0 || write(fd, cmd, sizeof(cmd)) != sizeof(cmd))
                return;
        if (sd_event_add_io(manager_event(v->manager), &v->swtpm_probe, fd, EPOLLIN, on_swtpm_answer, v) < 0)
                return;
        if (sd_event_source_set_io_fd_own(v->swtpm_probe, true) < 0) {
                v->swtpm_probe = sd_event_source_disable_unref(v->swtpm_probe);
                return;
        }
        TAKE_FD(fd);
        v->swtpm_probe_started = usec;
}

void vm_probe_stop(Vm *v) {
        v->probe_timer = sd_event_source_disable_unref(v->probe_timer);
        v->swtpm_probe = sd_event_source_disable_unref(v->swtpm_probe);
}

void vm_on_process_started(VmLaunched *l, void *userdata) {
        Vm *v = userdata;

        if (l == v->qemu)
                v->qemu_pid = vm_launched_pid(l);
        else if (l == v->swtpm)
                v->swtpm_pid = vm_launched_pid(l);
        (void) vm_save(v); /* the pid, for the record */
}

/* role names the unit (vm_process_unit()) under the systemd launcher. */
static int vm_spawn(Vm *v, char **argv, const char *log_name, const char *role, VmLaunched **ret) {
        _cleanup_free_ char *log = vm_path(v, log_name), *unit = vm_process_unit(v, role);
        bool qemu = streq(role, "qemu");

        int r;

        if (!log || !unit)
                return -ENOMEM;
        r = vm_launched_spawn(
                ret,
                manager_spawner(v->manager),
                manager_units(v->manager),
                unit,
                &(VmProcessOptions){
                        .argv = argv,
                        .log_file = log,
                        .working_dir = v->dir,
                        .block_io_uring = qemu,
                },
                qemu ? vm_on_qemu_exit : vm_on_helper_exit,
                v);
        if (r < 0)
                return r;
        vm_launched_set_started(*ret, vm_on_process_started);
        return 0;
}

void vm_on_helper_exit(VmLaunched *p, int code, int status, void *userdata) {
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        int error = vm_launched_error(p);
        _cleanup_free_ char *st = error < 0 ? strdup(strerror(-error)) :
                                              vm_exit_status_to_string(code, status);
        bool swtpm = p == v->swtpm;
        const char *what = swtpm ? "swtpm" : "vhost-device-vsock";

        if (p != v->swtpm && p != v->vsockd)
                return;
        if (error < 0 && v->sub != VM_SUB_START_HELPERS && vm_launched_unit(p))
                /* a unit an earlier daemon left is tolerated when gone (a helper beside the host
                 * install that did not start is started again by the chain after it) */
                log_struct(
                        LOG_WARNING,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s: its %s unit is gone (%s).",
                        v->rec.id,
                        what,
                        st ?: "?");
        else
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "%s of %s %s: %s",
                        what,
                        v->rec.id,
                        error < 0 ? "did not start" : "exited",
                        st ?: "?");
        if (swtpm) {
                v->swtpm = vm_launched_free(v->swtpm);
                v->swtpm_pid = 0;
        } else
                v->vsockd = vm_launched_free(v->vsockd);

        /* the start chain waits for it: it ends here rather than at the probe's timeout */
        if (error < 0 && v->sub == VM_SUB_START_HELPERS)
                start_failed(
                        v,
                        error,
                        swtpm ? VM_MESSAGE_SWTPM_SPAWN : VM_MESSAGE_VSOCKD_SPAWN,
                        &(VmMessageArgs){ .errno_text = st });
}

void vm_qemu_launch_failed(Vm *v, VmLaunched *p, int error) {
        _cleanup_free_ char *tail = NULL;

        if (p != v->qemu)
                return;
        if (v->qemu_prestarted && v->sub != VM_SUB_START_QMP) {
                vm_prestart_drop_qemu(v, strerror(-error));
                return;
        }
        if (v->sub == VM_SUB_START_QMP) {
                /* a QEMU that dies at once fails the start job: its log says why */
                tail = vm_file_tail(v, "qemu.log", 2048);
                start_failed(
                        v,
                        error,
                        VM_MESSAGE_QEMU_SPAWN,
                        &(VmMessageArgs){ .errno_text = strerror(-error), .detail = tail });
                return;
        }
        /* the unit an earlier daemon left cannot be attached to (gone: "No such process") */
        (void) vm_set_state(v, VM_EVENT_REATTACH_FAILED, &(VmEventArgs){ .detail = strerror(-error) }, NULL);
}

void vm_qmp_on_event(QmpClient *c, const char *event, json_t *data, void *userdata) {
        Vm *v = userdata;

        if (event)
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", v->rec.id }, { "QMP_EVENT", event }),
                        "QMP event %s",
                        event);
}

void vm_qmp_on_disconnect(QmpClient *c, void *userdata) {
        /* QEMU's exit is what counts; the pidfd reports it. */
}

/* The start chain ends with text (a message of vm-state.c rendered with its details). */
static void start_failed(Vm *v, int r, VmMessage m, const VmMessageArgs *a) {
        _cleanup_free_ char *text = vm_message(v, m, a);

        (void) vm_set_state(
                v, VM_EVENT_START_FAILED, &(VmEventArgs){ .error = r, .detail = text ?: "start failed" }, NULL);
}

static void on_cont_reply(QmpClient *c, int error, json_t *result, const char *error_desc, void *userdata) {
        /* a connection we dropped (the VM may be going away with it): nothing to settle */
        if (c != ((Vm *) userdata)->qmp)
                return;
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);

        if (v->sub != VM_SUB_START_QMP)
                return;
        v->qemu_prestarted = v->qemu_paused = false;
        if (error < 0) {
                _cleanup_free_ char *what = NULL;
                if (asprintf(&what, "cont: %s", error_desc ?: strerror(-error)) < 0)
                        what = NULL;
                start_failed(v, error, VM_MESSAGE_QEMU_SPAWN, &(VmMessageArgs){ .errno_text = what ?: "cont" });
                return;
        }
        (void) vm_set_state(v, VM_EVENT_QMP_UP, NULL, NULL);
}

/* A prestarted QEMU's vCPUs start: its disk is written now. */
static int send_cont(Vm *v) {
        return qmp_client_execute(v->qmp, "cont", NULL, 0, on_cont_reply, v);
}

/* How long a QEMU whose monitor hung up has to exit before the start fails. */
#define VM_QMP_HANGUP_GRACE (5 * USEC_PER_SEC)

static void qmp_start_failed(Vm *v, int error, const char *what) {
        _cleanup_free_ char *qmp = vm_path(v, "qmp.sock"), *tail = vm_file_tail(v, "qemu.log", 8192),
                            *text = NULL;

        if (asprintf(
                    &text,
                    "qemu's QMP at %s %s: %s",
                    qmp ?: "qmp.sock",
                    what,
                    tail && *tail ? tail : "qemu wrote nothing to its log") < 0)
                text = NULL;
        start_failed(v, error, VM_MESSAGE_DETAIL, &(VmMessageArgs){ .detail = text ?: what });
}

static int on_qmp_grace(sd_event_source *s, usec_t usec, void *userdata) {
        Vm *v = userdata;

        v->qmp_grace = sd_event_source_disable_unref(v->qmp_grace);
        if (v->sub == VM_SUB_START_QMP)
                qmp_start_failed(
                        v,
                        -ECONNRESET,
                        "closed the connection before answering (Connection reset by peer), and qemu did not "
                        "exit within 5s");
        return 0;
}

/* The start's monitor never answered. Only silence is a timeout. A monitor that hangs up belongs to
 * a QEMU that is exiting, most likely: its exit (the pidfd, then qemu_exited()) says how, with its
 * status, and the start waits a moment for it. */
static void on_qmp_failed(Vm *v, int error) {
        _cleanup_free_ char *qmp = NULL, *tail = NULL, *what = NULL;
        int r;

        if (error == -ECONNRESET) {
                log_struct(
                        LOG_DEBUG,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s: its QMP hung up before answering; waiting for QEMU's exit.",
                        v->rec.id);
                vm_qmp_drop(v);
                r = sd_event_add_time_relative(
                        manager_event(v->manager),
                        &v->qmp_grace,
                        CLOCK_MONOTONIC,
                        VM_QMP_HANGUP_GRACE,
                        USEC_PER_MSEC,
                        on_qmp_grace,
                        v);
                if (r >= 0) {
                        (void) sd_event_source_set_description(v->qmp_grace, "vm-qmp-grace");
                        return;
                }
                error = r;
        }
        if (error == -ETIMEDOUT) {
                qmp = vm_path(v, "qmp.sock");
                tail = vm_file_tail(v, "qemu.log", 8192);
                start_failed(
                        v,
                        error,
                        VM_MESSAGE_QMP_TIMEOUT,
                        &(VmMessageArgs){ .what = qmp, .errno_text = strerror(-error), .detail = tail });
                return;
        }
        if (asprintf(&what, "failed before answering: %s", strerror(-error)) < 0)
                what = NULL;
        qmp_start_failed(v, error, what ?: "failed before answering");
}

static void on_qmp_ready(QmpClient *c, int error, void *userdata) {
        if (c != ((Vm *) userdata)->qmp)
                return; /* a connection we dropped: whoever dropped it settles the state */
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        int r;

        if (v->qemu_prestarted && v->sub != VM_SUB_START_QMP) {
                /* beside the host install (create_vm's waiters hear of it), or after it before the
                 * chain reached QEMU (vm_start_qemu sends cont then): the guest waits for cont */
                if (error < 0) {
                        vm_prestart_drop_qemu(v, strerror(-error));
                        return;
                }
                v->qemu_paused = true;
                vm_balloon_start(v);
                if (v->sub == VM_SUB_HOST_INSTALL)
                        (void) vm_set_state(v, VM_EVENT_QMP_UP, NULL, NULL);
                return;
        }
        if (v->sub != VM_SUB_START_QMP)
                return;
        if (error < 0) {
                on_qmp_failed(v, error);
                return;
        }
        vm_balloon_start(v);
        if (v->qemu_prestarted) {
                /* the install finished before the monitor answered: the guest goes now */
                v->qemu_paused = true;
                r = send_cont(v);
                if (r < 0)
                        start_failed(
                                v, r, VM_MESSAGE_QEMU_SPAWN, &(VmMessageArgs){ .errno_text = strerror(-r) });
                return;
        }
        (void) vm_set_state(v, VM_EVENT_QMP_UP, NULL, NULL);
}

/* The paused QEMU goes, and the helpers it was wired to: swtpm (--terminate) ends with the QEMU it
 * served, so neither is reused. */
static void prestart_forget(Vm *v, const char *why) {
        log_struct(
                LOG_WARNING,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "VM %s: the QEMU started beside the host install is gone (%s); another starts after it.",
                v->rec.id,
                why ?: "?");
        vm_qmp_drop(v);
        v->qemu = vm_launched_free(v->qemu);
        v->swtpm = vm_launched_free(v->swtpm);
        v->vsockd = vm_launched_free(v->vsockd);
        v->qemu_pid = v->swtpm_pid = 0;
        v->qemu_prestarted = v->qemu_paused = false;
        v->helpers_prestarted = v->swtpm_up = false;
        vm_probe_stop(v);
}

void vm_prestart_drop_qemu(Vm *v, const char *why) {
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        int r;

        if (!v->qemu_prestarted)
                return;
        prestart_forget(v, why);
        if (v->sub != VM_SUB_START_HELPERS)
                return; /* the chain after the install starts them */
        /* the chain after the install runs already: it starts them afresh */
        r = vm_start_helpers(v, &e);
        if (r < 0)
                (void) vm_set_state(
                        v,
                        VM_EVENT_START_FAILED,
                        &(VmEventArgs){ .error = r,
                                        .detail = e.message ?: "failed to start the helpers again" },
                        NULL);
}

static int spawn_qemu(Vm *v, bool paused) {
        _cleanup_free_ char *vars = vm_path(v, "ovmf_vars.fd"), *net = vm_path(v, "net.sock"),
                            *vhost = vm_path(v, "vhost-vsock.sock"), *tpm = vm_path(v, "tpm/swtpm.sock"),
                            *qmp = vm_path(v, "qmp.sock"), *keys = NULL, *notify = NULL;
        _cleanup_strv_free_ char **argv = NULL;
        const Image *img = vm_image(v);
        const Network *net_rec = network_registry_get(manager_networks(v->manager), v->rec.spec.network);
        /* a QEMU started beside the host install is the first boot's, paused */
        VmPhase phase = paused ? VM_PHASE_BOOT : v->rec.phase;
        VmCredential creds[6];
        char report[24];
        const char *extra;
        size_t n = 0;
        int r;

        if (!vars || !net || !vhost || !tpm || !qmp)
                return -ENOMEM;
        if (phase == VM_PHASE_INSTALL && !img)
                return -ENOENT;

        /* the per-VM key first, then the caller's, one per line */
        {
                size_t len = strlen(v->rec.ssh_public_key) + 2, at = 0;
                for (char **k = v->rec.spec.ssh_authorized_keys; k && *k; k++)
                        len += strlen(*k) + 1;
                keys = malloc(len);
                if (!keys)
                        return -ENOMEM;
                at = stpcpy(stpcpy(keys, v->rec.ssh_public_key), "\n") - keys;
                for (char **k = v->rec.spec.ssh_authorized_keys; k && *k; k++)
                        at = stpcpy(stpcpy(keys + at, *k), "\n") - keys;
        }
        if (asprintf(&notify, "vsock-stream:2:%u", manager_settings(v->manager)->notify_port) < 0)
                return -ENOMEM;

        creds[n++] = (VmCredential){ "firstboot.hostname", v->rec.spec.hostname };
        creds[n++] = (VmCredential){ "ssh.authorized_keys.root", keys };
        creds[n++] = (VmCredential){ "system.machine_id", v->rec.machine_id };
        if (phase == VM_PHASE_INSTALL)
                creds[n++] = (VmCredential){ "vm.install-target", "/dev/disk/by-id/virtio-target" };
        /* READY=1 matters from the installed boot on; the installer powers off when done, and with
         * vhost-user nothing listens during it, so a notify socket there only makes the guest's
         * PID 1 wait out vsock connect timeouts (about 30 s per installer boot) */
        if (phase == VM_PHASE_BOOT)
                creds[n++] = (VmCredential){ "vmm.notify_socket", notify };
        /* the period of the guest's report uploads, in seconds (the image's generator sets its timer) */
        if (phase == VM_PHASE_BOOT) {
                (void) snprintf(
                        report,
                        sizeof(report),
                        "%" PRIu64,
                        (uint64_t) (manager_settings(v->manager)->guest_report_interval / USEC_PER_SEC));
                creds[n++] = (VmCredential){ "vm.report-interval", report };
        }

        /* PCR 12 is predicted from what this run is handed (vm-attest.c), whichever daemon judges
         * its quotes: kept in the record before QEMU starts. */
        extra = phase == VM_PHASE_BOOT && !v->rec.booted ? "ignition.firstboot" : NULL;
        {
                AttestVmCredential measured[ELEMENTSOF(creds)];
                char *copy = strdup(extra ?: ""), *word = NULL;

                if (!copy)
                        return -ENOMEM;
                free(v->rec.att.cmdline_extra);
                v->rec.att.cmdline_extra = copy;

                for (size_t i = 0; i < n; i++)
                        measured[i] = (AttestVmCredential){ creds[i].name, creds[i].value };
                r = attest_credentials_word(measured, n, &word);
                if (r < 0)
                        return r;
                free(v->rec.att.credentials_word);
                v->rec.att.credentials_word = word;
        }

        r = vm_cmdline_build(
                &(VmCmdlineSpec){
                        .qemu = "qemu-system-x86_64",
                        .id = v->rec.id,
                        .dir = v->dir,
                        .phase = phase,
                        .accel = host_probe_accel(manager_host(v->manager), NULL) == HOST_ACCEL_KVM ?
                                VM_ACCEL_KVM :
                                VM_ACCEL_TCG,
                        .vsock = v->rec.vsock,
                        .cpus = v->rec.spec.cpus,
                        .memory_mib = v->rec.spec.memory_mib,
                        .ovmf_code = manager_settings(v->manager)->ovmf_code,
                        .ovmf_vars = vars,
                        .uki = img ? img->uki : NULL,
                        .image_raw = img ? img->disk : NULL,
                        .volume = v->rec.volume,
                        .net_socket = net,
                        .mtu = net_rec ? net_rec->mtu : 0,
                        .mac = v->rec.mac,
                        .cid = v->rec.cid,
                        .vsock_socket = vhost,
                        .tpm_socket = tpm,
                        .credentials = creds,
                        .n_credentials = n,
                        .kernel_cmdline_extra = extra,
                        .paused = paused,
                        .tb_size_mib = manager_settings(v->manager)->tcg_tb_size_mib,
                },
                &argv);
        if (r < 0)
                return r;
        (void) unlink(qmp);
        r = vm_spawn(v, argv, "qemu.log", "qemu", &v->qemu);
        if (r < 0)
                return r;
        v->qemu_pid = vm_launched_pid(v->qemu);
        r = qmp_client_connect_retry(
                &v->qmp,
                manager_event(v->manager),
                qmp,
                vm_qmp_on_event,
                vm_qmp_on_disconnect,
                v,
                manager_settings(v->manager)->qmp_timeout,
                on_qmp_ready);
        if (r < 0) {
                (void) vm_launched_kill(v->qemu, SIGKILL, true);
                return r;
        }
        return 0;
}

static int start_vsockd(Vm *v) {
        _cleanup_free_ char *vhost = vm_path(v, "vhost-vsock.sock"), *uds = vm_path(v, "vsock");
        _cleanup_strv_free_ char **argv = NULL;
        int r;

        if (!vhost || !uds)
                return -ENOMEM;
        (void) unlink(vhost);
        v->vsockd = vm_launched_free(v->vsockd); /* a leftover of the previous run */
        r = vm_vhost_user_vsock_cmdline_build("vhost-device-vsock", v->rec.cid, vhost, uds, &argv);
        if (r < 0)
                return r;
        r = vm_spawn(v, argv, "vsock.log", "vsock", &v->vsockd);
        if (r < 0)
                return r;
        return 0;
}

int vm_start_qemu(Vm *v, ApiError *reterr) {
        _cleanup_free_ char *text = NULL;
        int r;

        /* vhost-user: vhost-device-vsock hands the guest's READY=1 to our socket in the VM directory */
        if (v->rec.phase == VM_PHASE_BOOT && v->rec.vsock == VM_VSOCK_VHOST_USER) {
                r = vm_notify_listen(v);
                if (r < 0) {
                        text = vm_message(v, VM_MESSAGE_NOTIFY_LISTEN, NULL);
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, "%s", text ?: "notify");
                }
        }
        if (v->qemu_prestarted && v->qemu) {
                /* started beside the host install: its vCPUs go once its monitor answers */
                r = v->qemu_paused ? send_cont(v) : 0;
                if (r < 0) {
                        text = vm_message(
                                v, VM_MESSAGE_QEMU_SPAWN, &(VmMessageArgs){ .errno_text = strerror(-r) });
                        return api_error_set(reterr, r, API_ERROR_INTERNAL, "%s", text ?: "cont failed");
                }
                return 0;
        }
        v->qemu_prestarted = v->qemu_paused = false;
        r = spawn_qemu(v, /* paused= */ false);
        if (r < 0) {
                /* under systemd a QEMU that dies at once fails the start job: its log says why */
                _cleanup_free_ char *tail = vm_file_tail(v, "qemu.log", 2048);

                text = vm_message(
                        v,
                        VM_MESSAGE_QEMU_SPAWN,
                        &(VmMessageArgs){ .errno_text = strerror(-r), .detail = tail });
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "%s", text ?: "failed to start qemu");
        }
        return 0;
}

/* Beside the host install: once swtpm and vhost-device-vsock answer, QEMU with its vCPUs stopped.
 * Nothing here fails the VM: what does not come up is started again by the chain after the install. */
static void prestart_probe(Vm *v, usec_t usec, bool vsock_up) {
        int r;

        if (v->swtpm_up && vsock_up && vars_ready(v)) {
                vm_probe_stop(v);
                r = spawn_qemu(v, /* paused= */ true);
                if (r < 0) {
                        vm_qmp_drop(v);
                        v->qemu = vm_launched_free(v->qemu);
                        v->qemu_pid = 0;
                        log_struct(
                                LOG_WARNING,
                                LOG_FIELDS({ "VM_ID", v->rec.id }),
                                "VM %s: cannot start QEMU beside the host install (%s); it starts after it.",
                                v->rec.id,
                                strerror(-r));
                        return;
                }
                v->qemu_prestarted = true;
                /* the record names its unit at once (a restart stops a creating VM's units by name anyway) */
                (void) vm_save(v);
                return;
        }
        if (v->tpm_setup)
                v->probe_deadline = usec + VM_SWTPM_START_TIMEOUT; /* swtpm comes after it */
        if (usec >= v->probe_deadline || (!v->swtpm && !v->tpm_setup) ||
            (v->rec.vsock == VM_VSOCK_VHOST_USER && !v->vsockd)) {
                /* the chain after the install probes (and respawns) them again, and fails if it must */
                vm_probe_stop(v);
                return;
        }
        (void) sd_event_source_set_time(v->probe_timer, usec + VM_PROBE_INTERVAL);
        (void) sd_event_source_set_enabled(v->probe_timer, SD_EVENT_ONESHOT);
}

/* swtpm and vhost-device-vsock start side by side; QEMU follows once both answer. */
static int on_probe(sd_event_source *s, usec_t usec, void *userdata) {
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        _cleanup_free_ char *vhost = vm_path(v, "vhost-vsock.sock");
        _cleanup_(api_error_done) ApiError e = API_ERROR_NULL;
        bool vsock_up;
        int r;

        if (!IN_SET(v->sub, VM_SUB_START_HELPERS, VM_SUB_HOST_INSTALL) || !vhost)
                return 0;

        swtpm_probe(v, usec);
        if (v->sub == VM_SUB_HOST_INSTALL) {
                prestart_probe(v, usec, v->rec.vsock != VM_VSOCK_VHOST_USER || access(vhost, F_OK) >= 0);
                return 0;
        }
        if (v->tpm_setup) {
                /* manufacturing: swtpm is not there yet, and its deadline starts after */
                if (usec >= v->tpm_setup_started + VM_TPM_SETUP_TIMEOUT)
                        /* the guard's SIGTERM: it kills swtpm_setup and the swtpm below it */
                        (void) vm_launched_kill(v->tpm_setup, SIGTERM, /* whole_unit= */ false);
                v->probe_deadline = usec + VM_SWTPM_START_TIMEOUT;
        } else if (!v->swtpm_up && (!v->swtpm || usec >= v->probe_deadline)) {
                _cleanup_free_ char *tail = vm_file_tail(v, "tpm/swtpm.log", 2048);
                start_failed(v, -ETIMEDOUT, VM_MESSAGE_VTPM_TIMEOUT, &(VmMessageArgs){ .detail = tail });
                return 0;
        }
        vsock_up = v->rec.vsock != VM_VSOCK_VHOST_USER || access(vhost, F_OK) >= 0;
        if (!vsock_up && (!v->vsockd || usec >= v->probe_deadline)) {
                _cleanup_free_ char *tail = vm_file_tail(v, "vsock.log", 2048);
                start_failed(v, -ETIMEDOUT, VM_MESSAGE_VSOCKD_TIMEOUT, &(VmMessageArgs){ .detail = tail });
                return 0;
        }

        if (v->vars_error < 0) {
                start_failed(
                        v,
                        v->vars_error,
                        VM_MESSAGE_PREPARE,
                        &(VmMessageArgs){ .what = v->dir, .errno_text = strerror(-v->vars_error) });
                return 0;
        }
        if (v->swtpm_up && vsock_up && vars_ready(v)) {
                v->swtpm_probe = sd_event_source_disable_unref(v->swtpm_probe);
                r = vm_set_state(v, VM_EVENT_HELPERS_UP, NULL, &e);
                if (r < 0)
                        (void) vm_set_state(
                                v,
                                VM_EVENT_START_FAILED,
                                &(VmEventArgs){ .error = r, .detail = e.message ?: "failed to start qemu" },
                                NULL);
                return 0; /* QMP takes over */
        }

        (void) sd_event_source_set_time(s, usec + VM_PROBE_INTERVAL);
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

/* The firmware's variables, copied into the VM's directory on its first start: off the loop, after
 * the VM's files queued before (manager_write_file()), as a new file that a crash never leaves half
 * written. The probe holds QEMU back until the copy is done (vars_ready()). */
typedef struct VmVarsCopy {
        Vm *vm; /* NULL once the VM is gone */
} VmVarsCopy;

#define VM_VARS_SIZE_MAX (64U * 1024U * 1024U)

static void on_vars_copied(int r, const char *path, void *userdata) {
        VmVarsCopy *c = userdata;

        if (c->vm) {
                c->vm->vars_copy = NULL;
                c->vm->vars_error = r;
        }
        free(c);
}

void vm_vars_copy_forget(Vm *v) {
        if (v->vars_copy)
                v->vars_copy->vm = NULL;
        v->vars_copy = NULL;
}

static int vars_copy_start(Vm *v, const char *vars) {
        VmVarsCopy *c;
        int r;

        if (v->vars_copy)
                return 0; /* one is under way */
        v->vars_error = 0;
        if (access(vars, F_OK) >= 0)
                return 0; /* copied on an earlier start (whole: see write_file_atomic_new()) */
        c = malloc(sizeof(VmVarsCopy));
        if (!c)
                return -ENOMEM;
        *c = (VmVarsCopy){ .vm = v };
        r = file_writer_copy_new(
                manager_writer(v->manager),
                manager_settings(v->manager)->ovmf_vars,
                vars,
                VM_VARS_SIZE_MAX,
                0600,
                on_vars_copied,
                c);
        if (r < 0) {
                free(c);
                return r;
        }
        v->vars_copy = c;
        return 0;
}

/* QEMU may start: the variables are in place. */
static bool vars_ready(Vm *v) {
        return !v->vars_copy && v->vars_error >= 0;
}

/* Fails with the text of the step that failed (VM_MESSAGE_PREPARE and the like), having ended what it
 * started. */
static int helpers_failed(Vm *v, int r, VmMessage m, ApiError *reterr) {
        _cleanup_free_ char *text = vm_message(
                v, m, &(VmMessageArgs){ .what = v->dir, .errno_text = strerror(-r) });

        vm_kill(v);
        return api_error_set(reterr, r, API_ERROR_INTERNAL, "%s", text ?: "start failed");
}

static int spawn_swtpm(Vm *v) {
        _cleanup_free_ char *tpm = vm_path(v, "tpm"), *ctrl = vm_path(v, "tpm/swtpm.sock"),
                            *tlog = vm_path(v, "tpm/swtpm.log");
        _cleanup_strv_free_ char **argv = NULL;
        int r;

        if (!tpm || !ctrl || !tlog)
                return -ENOMEM;
        r = vm_swtpm_cmdline_build("swtpm", tpm, ctrl, tlog, &argv);
        if (r >= 0)
                r = vm_spawn(v, argv, "tpm/swtpm.out", "swtpm", &v->swtpm);
        if (r < 0)
                return r;
        v->swtpm_pid = vm_launched_pid(v->swtpm);
        return 0;
}

/* The EK certificate swtpm_setup wrote beside the state, judged against the host's CA (it may have
 * been replaced since the VM's creation: then the verdict says foreign). */
static void record_ek_certificate(Vm *v) {
        _cleanup_free_ char *path = vm_path(v, "tpm/ek-rsa2048.crt"), *der = NULL;
        AttestCa *ca = manager_attest_ca(v->manager);
        size_t size = 0;

        free(v->rec.att.ek_why);
        v->rec.att.ek_why = NULL;
        if (!ca || !path || read_full_file(path, 16384, &der, &size) < 0) {
                v->rec.att.ek = ATTEST_EK_ABSENT;
                return;
        }
        v->rec.att.ek = attest_ca_check_ek(ca, der, size, NULL, 0, &v->rec.att.ek_why);
}

static void on_tpm_setup_exit(VmLaunched *l, int code, int status, void *userdata) {
        _cleanup_(vm_unrefp) Vm *v = vm_ref(userdata);
        _cleanup_free_ char *st = NULL, *tail = NULL;
        int error, r;

        if (l != v->tpm_setup)
                return;
        error = vm_launched_error(l);
        v->tpm_setup = vm_launched_free(v->tpm_setup);
        if (error >= 0 && code == CLD_EXITED && status == 0) {
                v->rec.att.ek_pending = false;
                record_ek_certificate(v);
                (void) vm_save(v);
                log_struct(
                        LOG_INFO,
                        LOG_FIELDS({ "VM_ID", v->rec.id }),
                        "VM %s: vTPM manufactured in %.2fs, EK certificate %s.",
                        v->rec.id,
                        (double) (now_usec(CLOCK_MONOTONIC) - v->tpm_setup_started) / USEC_PER_SEC,
                        attest_ek_verdict_to_string(v->rec.att.ek));
                if (!IN_SET(v->sub, VM_SUB_START_HELPERS, VM_SUB_HOST_INSTALL))
                        return; /* stopped meanwhile: the next start spawns swtpm */
                r = spawn_swtpm(v);
                if (r < 0 && v->sub == VM_SUB_START_HELPERS)
                        start_failed(
                                v, r, VM_MESSAGE_SWTPM_SPAWN, &(VmMessageArgs){ .errno_text = strerror(-r) });
                /* swtpm gets its own 5 s to answer, counted from now */
                v->probe_deadline = now_usec(CLOCK_MONOTONIC) + VM_SWTPM_START_TIMEOUT;
                return;
        }
        st = error < 0 ? strdup(strerror(-error)) : vm_exit_status_to_string(code, status);
        tail = vm_file_tail(v, "tpm/swtpm_setup.log", 1024);
        log_struct(
                LOG_WARNING,
                LOG_FIELDS({ "VM_ID", v->rec.id }),
                "VM %s: swtpm_setup failed (%s): %s",
                v->rec.id,
                st ?: "?",
                tail ?: "");
        /* beside a host install the chain after it runs the setup again, and fails there */
        if (v->sub == VM_SUB_START_HELPERS)
                start_failed(
                        v,
                        error < 0 ? error : -EIO,
                        VM_MESSAGE_TPM_SETUP,
                        &(VmMessageArgs){ .exit_status = st, .detail = tail });
}

/* "vm-manager guard" followed by a copy of program's argv. */
static char **argv_guarded(char **program) {
        size_t n = 0;
        char **argv;

        while (program[n])
                n++;
        argv = calloc(n + 3, sizeof(char *));
        if (!argv)
                return NULL;
        for (size_t i = 0; i < n + 2; i++) {
                argv[i] = strdup(i == 0 ? "vm-manager" : i == 1 ? "guard" : program[i - 2]);
                if (!argv[i])
                        return strv_free(argv); /* the NULL ends what it frees: all there is */
        }
        return argv;
}

/* swtpm_setup as a plain child (it ends with the daemon; the record keeps ek_pending, and the next
 * start runs it again over the half-made state no guest has seen), its end an event. It runs under
 * our own executable as its guard (`vm-manager guard`, vm-guard.h): swtpm_setup starts a swtpm of its
 * own, which no parent-death signal of ours reaches, and which would outlive a daemon killed with
 * SIGKILL. The guard is ended with SIGTERM, so that it can end that swtpm too. */
static int tpm_setup_start(Vm *v, const char *tpm) {
        _cleanup_free_ char *log = vm_path(v, "tpm/swtpm_setup.log");
        _cleanup_strv_free_ char **program = NULL, **argv = NULL;
        AttestCa *ca = manager_attest_ca(v->manager);
        int self_exe = manager_settings(v->manager)->self_exe_fd;
        int r;

        if (v->tpm_setup)
                return 0; /* under way since the host install began */
        if (!log)
                return -ENOMEM;
        if (!ca)
                return -ENOKEY;
        if (self_exe < 0)
                return -EBADF;
        r = vm_swtpm_setup_cmdline_build("swtpm_setup", tpm, attest_ca_setup_config(ca), &program);
        if (r < 0)
                return r;
        argv = argv_guarded(program);
        if (!argv)
                return -ENOMEM;
        (void) unlink(log);
        v->tpm_setup_started = now_usec(CLOCK_MONOTONIC);
        return vm_launched_spawn(
                &v->tpm_setup,
                manager_spawner(v->manager),
                /* units= */ NULL,
                NULL,
                &(VmProcessOptions){
                        .argv = argv,
                        .exec_fd = self_exe,
                        .log_file = log,
                        .working_dir = v->dir,
                        .kill_signal = SIGTERM,
                },
                on_tpm_setup_exit,
                v);
}

/* swtpm and vhost-device-vsock spawned, not yet probed. */
static int spawn_helpers(Vm *v, ApiError *reterr) {
        _cleanup_free_ char *tpm = vm_path(v, "tpm"), *ctrl = vm_path(v, "tpm/swtpm.sock"),
                            *tlog = vm_path(v, "tpm/swtpm.log"), *tprev = vm_path(v, "tpm/swtpm.prev.log"),
                            *vars = vm_path(v, "ovmf_vars.fd"), *console = vm_path(v, "console.log");
        int r;

        if (!tpm || !ctrl || !tlog || !tprev || !vars || !console)
                return -ENOMEM;

        r = mkdir_p(tpm, 0700);
        if (r >= 0)
                r = vars_copy_start(v, vars);
        if (r < 0)
                return helpers_failed(v, r, VM_MESSAGE_PREPARE, reterr);
        (void) unlink(ctrl);
        (void) rename(tlog, tprev);

        v->swtpm = vm_launched_free(v->swtpm); /* a leftover of the previous run */
        v->swtpm_up = false;
        if (v->rec.att.ek_pending) {
                /* a new VM: swtpm starts once its vTPM is manufactured (on_tpm_setup_exit()) */
                r = tpm_setup_start(v, tpm);
                if (r < 0)
                        return helpers_failed(v, r, VM_MESSAGE_SWTPM_SPAWN, reterr);
        } else {
                r = spawn_swtpm(v);
                if (r < 0)
                        return helpers_failed(v, r, VM_MESSAGE_SWTPM_SPAWN, reterr);
        }
        v->rec.vsock = vm_notify_pick(v);
        v->vsockd = vm_launched_free(v->vsockd); /* a leftover of the previous run */
        r = v->rec.vsock == VM_VSOCK_VHOST_USER ? start_vsockd(v) : 0;
        if (r < 0)
                return helpers_failed(v, r, VM_MESSAGE_VSOCKD_SPAWN, reterr);
        return 0;
}

static int arm_probe(Vm *v) {
        int r;

        v->probe_deadline = now_usec(CLOCK_MONOTONIC) + VM_SWTPM_START_TIMEOUT;
        vm_probe_stop(v);
        r = sd_event_add_time_relative(
                manager_event(v->manager), &v->probe_timer, CLOCK_MONOTONIC, VM_PROBE_INTERVAL, 1, on_probe, v);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(v->probe_timer, "vm-probe");
        return 0;
}

int vm_prestart(Vm *v, ApiError *reterr) {
        int r = spawn_helpers(v, reterr);

        if (r < 0)
                return r;
        v->helpers_prestarted = true;
        v->qemu_prestarted = v->qemu_paused = false;
        r = arm_probe(v);
        if (r < 0)
                log_warning_errno(r, "VM %s: cannot probe the helpers beside the host install: %m", v->rec.id);
        return 0;
}

int vm_start_helpers(Vm *v, ApiError *reterr) {
        int r;

        /* spawned while the host install ran (and both still there): only the probing is left */
        if (!v->helpers_prestarted || (!v->swtpm && !v->tpm_setup) ||
            (v->rec.vsock == VM_VSOCK_VHOST_USER && !v->vsockd)) {
                /* a paused QEMU is wired to the helpers that ended: it goes with them */
                if (v->qemu_prestarted)
                        prestart_forget(v, "a helper beside it ended");
                r = spawn_helpers(v, reterr);
                if (r < 0)
                        return r;
        }
        v->helpers_prestarted = false;
        r = arm_probe(v);
        if (r < 0)
                return helpers_failed(v, r, VM_MESSAGE_PROBE_TIMER, reterr);
        return 0;
}
