/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "attest-ca.h"
#include "attest-expect.h"
#include "attest-nonce.h"
#include "file-writer.h"
#include "fs-util.h"
#include "image-catalog.h"
#include "json-util.h"
#include "log.h"
#include "manager-firmware.h"
#include "manager.h"
#include "metrics-guest.h"
#include "net-switch.h"
#include "network.h"
#include "parse-util.h"
#include "storage.h"
#include "string-table.h"
#include "task.h"
#include "vm-process.h"
#include "vm-spec.h"
#include "vm-unit.h"
#include "vm.h"
#include "worker.h"

struct Manager {
        sd_event *event;
        char *state_dir, *image_dir;
        char *version, *commit, *built;
        char *ovmf_code, *ovmf_vars;
        ManagerSettings settings;

        NetworkRegistry *networks;
        ImageCatalog *images;
        HostProbe *host;
        Storage *storage;         /* where VM disks come from */
        VmUnitManager *units;     /* the systemd launcher's connection; NULL: plain children */
        AttestNonceStore *nonces; /* the nonces handed to guests */
        AttestCa *ca;             /* signs new vTPMs' EK certificates; NULL: none could be made */
        AttestExpectedPcr pcr7;   /* the PCR 7 events of ovmf_vars, when has_pcr7 */
        bool has_pcr7;
        bool pcr7_run_differs;  /* a firmware run's PCR 7 was not the prediction's: said once */
        FirmwareRuns *firmware; /* the firmware's PCR 0-6 events per VM shape */
        VmNotify *notify;       /* the READY=1 listener on the kernel's vhost-vsock */
        VmReports *reports;     /* guest reports parsed and stored off the loop */
        Worker *exec_worker;    /* exec_vm's results parsed off the loop; made on first use */
        VmSpawner *spawner;     /* the thread that clones plain children, their parent until we end */
        FileWriter *writer;     /* records and VM files, written and fsynced off the loop, in order */
        TaskRegistry *tasks;    /* the durable tasks, judged against the VMs when read */
        bool writer_on;         /* false during start-up: files are written at once */
        ManagerMetrics *metrics;
        const LoopStats *loop_stats; /* the daemon's (borrowed) */

        /* VMs, oldest first */
        Vm **vms;
        size_t n_vms;
        /* who hears of every VM's changes (manager_watch_vms()) */
        struct ManagerVmWatcher {
                ManagerVmWatchFunc fn;
                void *userdata;
        } vm_watchers[MANAGER_VM_WATCHERS_MAX];
        size_t n_vm_watchers;
        ManagerQuarantine *quarantine;
        size_t n_quarantine;
        /* the data plane: one switch per network record, in no particular order */
        struct ManagerSwitch {
                char *name;
                NetSwitch *sw;
        } * switches;
        size_t n_switches;

        ManagerImdsAccept imds_accept;
        void *imds_userdata;

        bool detach_vms_on_exit;
        bool shutting_down;
        bool detaching; /* shutting down with VMs left running */
        uint64_t generation;
};

static const char *const vm_launcher_table[_VM_LAUNCHER_MAX] = {
        [VM_LAUNCHER_AUTO] = "auto",
        [VM_LAUNCHER_SYSTEMD] = "systemd",
        [VM_LAUNCHER_PROCESS] = "process",
};

DEFINE_STRING_TABLE_LOOKUP(vm_launcher, VmLauncherKind);

static const char *const attest_mode_table[_ATTEST_MODE_MAX] = {
        [ATTEST_MODE_VERIFY] = "verify",
        [ATTEST_MODE_NOOP] = "noop",
};

DEFINE_STRING_TABLE_LOOKUP(attest_mode, AttestMode);

static void on_images_changed(ImageCatalog *c, void *userdata) {
        manager_touch(userdata);
}

static int strdup_to(char **dst, const char *src) {
        *dst = strdup(src ?: "");
        return *dst ? 0 : -ENOMEM;
}

/* The vsock port guests send READY=1 to: the flag's, else the one recorded in the state dir, else a
 * new one, recorded so that VMs keep theirs across restarts. */
static int notify_port_init(Manager *m, uint32_t wanted) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        char buf[16];
        uint16_t rnd;
        uint32_t port;
        int r;

        if (asprintf(&path, "%s/notify-port", m->state_dir) < 0)
                return -ENOMEM;
        if (wanted == 0 && read_full_file(path, 64, &text, NULL) >= 0) {
                text[strcspn(text, "\n")] = 0;
                if (safe_atou32(text, &port) >= 0 && port > 0) {
                        m->settings.notify_port = port;
                        return 0;
                }
                log_warning("Ignoring malformed %s.", path);
        }
        if (wanted == 0) {
                if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
                        return -EIO;
                wanted = 49152U + rnd % 16384U;
        }
        m->settings.notify_port = wanted;
        snprintf(buf, sizeof(buf), "%u\n", wanted);
        r = write_file_atomic(path, buf, strlen(buf), 0600);
        return r;
}

/* An image whose golden values were recorded with another firmware build than this host's cannot
 * pass verification here: say so once, at start. */
static void manager_check_golden_firmware(Manager *m) {
        const char *host = host_probe_firmware_sha256(m->host);
        for (size_t i = 0; i < image_catalog_size(m->images); i++) {
                const Image *img = image_catalog_at(m->images, i);
                json_t *fw = json_object_get(img->policy, "golden_firmware");
                if (m->settings.attestation == ATTEST_MODE_VERIFY && !m->settings.learn_golden &&
                    json_object_size(json_object_get(json_object_get(img->policy, "golden"), "sha256")) == 0)
                        log_notice(
                                "Image %s has no golden PCR values yet: create_vm with require_attestation (the "
                                "default) is refused until they are recorded (make golden, or see "
                                "`vm-manager image golden --help`).",
                                img->ref);
                if (!host)
                        continue;
                const char *sha = json_string_value(json_object_get(fw, "sha256"));
                if (sha && strcasecmp(sha, host) != 0)
                        log_warning(
                                "Image %s: its golden PCRs were recorded with firmware %s %s (sha256 %.16s), this host "
                                "boots sha256 %.16s; its VMs will fail attestation until the values are recorded again.",
                                img->ref,
                                json_string_value(json_object_get(fw, "package")) ?: "?",
                                json_string_value(json_object_get(fw, "version")) ?: "?",
                                sha,
                                host);
        }
}

/* The host's facts, and what they decide: the accelerator, the READY=1 transport, the firmware, and
 * the timeouts' defaults. host_probe_new() waits for its tools (children with a 5 s limit each) and
 * hashes the firmware: it runs here, once, before the loop's first iteration (the daemon is not
 * serving yet); what get_host re-reads per request (device nodes, /proc, /sys, $PATH) never waits. */
static int manager_probe_host(Manager *m, const ManagerConfig *cfg, ApiError *reterr) {
        const char *reason = NULL, *fw;
        HostNotify n;
        bool tcg;
        int r;

        r = host_probe_new(
                &m->host,
                &(HostProbeConfig){
                        .ovmf_code = cfg->ovmf_code,
                        .accel = cfg->accel,
                        .notify = cfg->vsock,
                });
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "probing the host: %s", strerror(-r));
        /* Under TCG the guest image installs in 4-6 minutes and boots in 2-3: the defaults of the
         * timeouts (made for KVM) grow with it; given values are kept. */
        tcg = host_probe_accel(m->host, NULL) == HOST_ACCEL_TCG;
        m->settings.install_timeout = cfg->install_timeout ?: (tcg ? 15 : 5) * USEC_PER_MINUTE;
        m->settings.boot_timeout = cfg->boot_timeout ?: (tcg ? 10 : 4) * USEC_PER_MINUTE;
        if (cfg->accel == HOST_ACCEL_AUTO && host_probe_accel(m->host, &reason) == HOST_ACCEL_TCG)
                log_warning("VMs run under TCG, much slower than KVM: %s", reason ?: "");
        else {
                (void) host_probe_accel(m->host, &reason);
                log_info(
                        "Accelerator: %s (%s).",
                        host_accel_to_string(host_probe_accel(m->host, NULL)),
                        reason ?: "");
        }
        n = host_probe_notify(m->host, &reason);
        if (n == HOST_NOTIFY_NONE)
                log_warning("VMs cannot report READY=1: %s", reason ?: "");
        else
                log_info("READY=1 transport: %s (%s)", host_notify_transport_name(n), reason ?: "");
        fw = host_probe_firmware_summary(m->host);
        if (fw)
                log_info("Firmware VMs boot with: %s.", fw);
        else
                log_warning(
                        "No OVMF firmware at '%s': VMs cannot boot until one is installed.",
                        cfg->ovmf_code ?: "");
        return 0;
}

/* The launcher: VMs as transient units where a service manager is reachable. */
static int manager_launcher_new(Manager *m, const ManagerConfig *cfg, ApiError *reterr) {
        const char *why = NULL;
        int r;

        m->detach_vms_on_exit = cfg->detach_vms_on_exit;
        if (cfg->launcher == VM_LAUNCHER_PROCESS)
                return 0;
        r = vm_unit_manager_new(&m->units, m->event, VM_UNIT_SCOPE_AUTO, &why);
        if (r < 0 && cfg->launcher == VM_LAUNCHER_SYSTEMD)
                return api_error_set(
                        reterr,
                        r,
                        API_ERROR_UNSUPPORTED,
                        "systemd launcher unavailable: %s",
                        why ?: strerror(-r));
        if (r < 0)
                log_notice("VMs run as plain child processes and end with vm-manager: %s", why ?: strerror(-r));
        else
                log_info(
                        "VMs run as transient systemd units in vm-manager.slice%s.",
                        cfg->detach_vms_on_exit ? " and keep running when vm-manager stops" : "");
        return 0;
}

/* The host CA of vTPM EK certificates, made on the first start. Without it VMs still run: their
 * vTPMs are manufactured by swtpm itself, uncertified ("ekCertificate": "absent"). */
static void manager_open_ca(Manager *m) {
        _cleanup_free_ char *dir = NULL, *setup = path_find_executable("swtpm_setup");
        char host[256] = "";
        int r;

        if (!setup) {
                log_warning(
                        "No swtpm_setup on PATH (package swtpm-tools): new VMs get vTPMs without an EK "
                        "certificate.");
                return;
        }
        if (asprintf(&dir, "%s/attest-ca", m->state_dir) < 0)
                return;
        if (gethostname(host, sizeof(host)) < 0 || !*host)
                strcpy(host, "localhost");
        r = attest_ca_open(dir, host, &m->ca);
        if (r < 0)
                log_warning_errno(
                        r, "Cannot open the host CA of vTPM EK certificates in %s, new VMs get none: %m", dir);
}

/* A variable store template is a few hundred KiB (OVMF_VARS_4M.fd: 528 KiB). */
#define OVMF_VARS_MAX ((size_t) 16 << 20)

/* Every VM's variable store starts as a copy of the template, so the template decides what OVMF
 * measures into PCR 7 (the guest can enroll keys later, which PCR 7 then shows): derived once here,
 * so that PCR 7 needs no golden value. A template with Secure Boot keys is not predicted: its PCR 7
 * also depends on which db entry verified each image, and the golden value stays the check. */
static void manager_derive_pcr7(Manager *m) {
        _cleanup_free_ char *data = NULL, *why = NULL;
        char hex[2 * 32 + 1];
        size_t size = 0;
        int r;

        if (!m->ovmf_vars)
                return;
        r = read_full_file(m->ovmf_vars, OVMF_VARS_MAX, &data, &size);
        if (r < 0) {
                log_warning_errno(
                        r,
                        "Cannot read the OVMF variable store template '%s', PCR 7 is compared with golden "
                        "values: %m",
                        m->ovmf_vars);
                return;
        }
        r = attest_varstore_pcr7((const uint8_t *) data, size, &m->pcr7, &why);
        if (r == -ENOMEM) {
                log_oom();
                return;
        }
        if (r < 0)
                log_warning(
                        "OVMF variable store template '%s' not understood (%s), PCR 7 is compared with "
                        "golden values.",
                        m->ovmf_vars,
                        why ?: "?");
        else if (r == ATTEST_VARSTORE_SECURE_BOOT)
                log_notice(
                        "OVMF variable store template '%s' enrolls Secure Boot keys (%s): PCR 7 is not "
                        "derived and is compared with golden values.",
                        m->ovmf_vars,
                        why ?: "?");
        else {
                m->has_pcr7 = true;
                log_info(
                        "PCR 7 expected from the OVMF variable store template '%s' (Secure Boot off, no "
                        "keys): %s.",
                        m->ovmf_vars,
                        hex_format(m->pcr7.value, sizeof(m->pcr7.value), hex));
        }
}

void manager_firmware_pcr7(Manager *m, const AttestExpectedPcr *run) {
        char hex[2 * 32 + 1];
        size_t i = 0;
        int r;

        assert(m && run);

        if (!m->has_pcr7)
                return;
        r = attest_varstore_pcr7_adopt(&m->pcr7, run, &i);
        if (r == -EBADMSG) {
                if (!m->pcr7_run_differs)
                        log_warning(
                                "A firmware run's PCR 7 differs from the prediction of the variable store "
                                "template '%s' in event %zu, not in the SecureBoot event only: the prediction "
                                "stays, and VMs' quotes may be rejected on PCR 7.",
                                m->ovmf_vars,
                                i);
                m->pcr7_run_differs = true;
        } else if (r < 0)
                log_warning_errno(r, "Cannot take the firmware run's form of PCR 7, ignoring: %m");
        else if (r > 0)
                log_notice(
                        "This host's OVMF measures SecureBoot off in its own form (seen in a firmware run): "
                        "PCR 7 is now expected to be %s.",
                        hex_format(m->pcr7.value, sizeof(m->pcr7.value), hex));
}

const AttestExpectedPcr *manager_expected_pcr7(Manager *m) {
        return m && m->has_pcr7 ? &m->pcr7 : NULL;
}

FirmwareRuns *manager_firmware_runs(Manager *m) {
        return m->firmware;
}

/* The firmware's own measurements for VMs of create_vm's default shape are learned now, while
 * nothing else runs, so that the first attested VM finds them known; other shapes get theirs when
 * a VM asks (vm_attest_check_image()). */
static int manager_firmware_init(Manager *m, const ManagerConfig *cfg) {
        const char *why;
        bool pending;
        int r;

        r = firmware_runs_new(m, cfg->firmware_run, &m->firmware);
        if (r < 0)
                return r;
        if (m->settings.attestation != ATTEST_MODE_VERIFY)
                return 0;
        if (!firmware_runs_lookup(
                    m->firmware, VM_MEMORY_MIB_DEFAULT, VM_CPUS_DEFAULT, cfg->firmware_run, &why, &pending))
                log_info("PCRs 0, 2, 3, 6 of %u MiB, %u-CPU VMs: %s.", VM_MEMORY_MIB_DEFAULT, VM_CPUS_DEFAULT, why);
        return 0;
}

int manager_new(Manager **ret, sd_event *event, const ManagerConfig *cfg, ApiError *reterr) {
        _cleanup_(manager_freep) Manager *m = NULL;
        int r;

        assert_return(ret && event && cfg && cfg->state_dir && cfg->image_dir, -EINVAL);

        m = calloc(1, sizeof(Manager));
        if (!m)
                return -ENOMEM;
        m->settings.attestation = cfg->attestation;
        m->settings.learn_golden = cfg->attestation_learn_golden;
        r = attest_nonce_store_new(&m->nonces);
        if (r < 0)
                return r;
        r = manager_metrics_new(&m->metrics);
        if (r < 0)
                return r;
        r = vm_reports_new(&m->reports);
        if (r < 0)
                return r;
        m->event = sd_event_ref(event);
        r = file_writer_new(event, "vmm-records", &m->writer);
        if (r < 0)
                return r;
        if (strdup_to(&m->state_dir, cfg->state_dir) < 0 || strdup_to(&m->image_dir, cfg->image_dir) < 0 ||
            strdup_to(&m->version, cfg->version) < 0 || strdup_to(&m->commit, cfg->commit) < 0 ||
            strdup_to(&m->built, cfg->built) < 0 || strdup_to(&m->ovmf_code, cfg->ovmf_code) < 0 ||
            strdup_to(&m->ovmf_vars, cfg->ovmf_vars) < 0)
                return -ENOMEM;
        m->settings.ovmf_code = m->ovmf_code;
        m->settings.ovmf_vars = m->ovmf_vars;
        m->settings.stop_timeout = cfg->stop_timeout ?: 30 * USEC_PER_SEC;
        m->settings.qmp_timeout = cfg->qmp_timeout ?: 30 * USEC_PER_SEC;
        m->settings.tcg_tb_size_mib = cfg->tcg_tb_size_mib;
        m->settings.guest_report_interval = cfg->guest_report_interval;
        m->settings.guest_series_limit = cfg->guest_series_limit ?: GUEST_SERIES_LIMIT_DEFAULT;
        m->settings.install_mode = cfg->install_mode;
        m->settings.self_exe_fd = cfg->self_exe_fd > STDERR_FILENO ? cfg->self_exe_fd : -EBADF;

        /* Start-up order: host facts, networks with their leases, the image catalog, then the
         * default network. */
        r = manager_probe_host(m, cfg, reterr);
        if (r < 0)
                return r;

        manager_open_ca(m);
        manager_derive_pcr7(m);

        r = network_registry_load(&m->networks, m->state_dir, reterr);
        if (r < 0)
                return r;
        /* before the VMs: those still running get their ports back */
        r = manager_switches_start(m, reterr);
        if (r < 0)
                return r;

        r = image_catalog_new(&m->images, event, m->image_dir, reterr);
        if (r < 0)
                return r;
        image_catalog_set_change_callback(m->images, on_images_changed, m);
        if (image_catalog_size(m->images) == 0)
                log_warning("No images in '%s': create_vm needs one (see images/).", m->image_dir);

        r = manager_launcher_new(m, cfg, reterr);
        if (r < 0)
                return r;
        /* after the host probe, which forks */
        r = vm_spawner_new(event, &m->spawner);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "starting the process spawner: %s", strerror(-r));
        m->detach_vms_on_exit = cfg->detach_vms_on_exit;
        m->loop_stats = cfg->loop_stats;
        r = manager_firmware_init(m, cfg);
        if (r < 0)
                return r;

        r = storage_new(&m->storage, m->state_dir, /* provider_socket= */ NULL);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "setting up VM disks: %s", strerror(-r));
        log_info("VM disks: %s.", storage_description(m->storage));

        r = notify_port_init(m, cfg->notify_port);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "recording the notify port: %s", strerror(-r));
        r = vm_notify_new(&m->notify, m);
        if (r < 0)
                return r;

        r = vm_load_all(m, reterr);
        if (r < 0)
                return r;
        r = task_registry_new(m, &m->tasks);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "loading the tasks: %s", strerror(-r));
        /* From here on a failed start-up must not take the VMs just attached to down with it. */
        manager_hold_vms(m, true);

        r = network_ensure_default(m->networks, cfg->default_network, cfg->network_subnet, reterr);
        if (r < 0)
                return r;
        r = manager_switches_start(m, reterr);
        if (r < 0)
                return r;

        if (m->settings.attestation == ATTEST_MODE_NOOP)
                log_warning(
                        "Attestation is noop: any quote that echoes a fresh nonce passes. Development only.");
        if (m->settings.learn_golden)
                log_warning(
                        "Attestation learns golden PCRs it has no value for (--attestation-learn-golden): "
                        "never for production.");
        manager_check_golden_firmware(m);

        manager_hold_vms(m, false);
        /* Start-up wrote what it had to at once (the loop serves nothing yet, and the daemon reports
         * ready with it on disk); from here on, off the loop. */
        network_registry_set_writer(m->networks, m->writer);
        m->writer_on = true;
        *ret = TAKE_PTR(m);
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;
        /* first: the disks still being acquired end (-ECANCELED), their creates and starts answered
         * while everything they touch exists; and the jobs still running finish while their VMs do */
        m->storage = storage_free(m->storage);
        m->reports = vm_reports_free(m->reports);
        /* exec results not parsed yet are answered "shutting down" */
        m->exec_worker = worker_free(m->exec_worker);
        while (m->n_vms > 0)
                manager_remove_vm(m, m->vms[m->n_vms - 1]);
        free(m->vms);
        /* after the VMs: the operations they answered ended the tasks they ran */
        m->tasks = task_registry_free(m->tasks);
        /* a firmware run under way is killed; before the spawner, its parent */
        m->firmware = firmware_runs_free(m->firmware);
        /* after the VMs, whose processes it made: its thread's end is their parent's death */
        m->spawner = vm_spawner_free(m->spawner);
        for (size_t i = 0; i < m->n_quarantine; i++) {
                free(m->quarantine[i].id);
                free(m->quarantine[i].path);
                free(m->quarantine[i].reason);
        }
        free(m->quarantine);
        while (m->n_switches > 0)
                manager_switch_stop(m, m->switches[0].name);
        free(m->switches);
        vm_notify_free(m->notify);
        attest_nonce_store_free(m->nonces);
        vm_unit_manager_free(m->units);
        manager_metrics_free(m->metrics);
        free(m->ovmf_code);
        free(m->ovmf_vars);
        image_catalog_free(m->images);
        network_registry_free(m->networks);
        host_probe_free(m->host);
        attest_ca_free(m->ca);
        attest_expected_pcr_done(&m->pcr7);
        /* last: what the rest queued while going is written now (this blocks), and the answers
         * waiting for it are sent */
        file_writer_free(m->writer);
        sd_event_unref(m->event);
        free(m->state_dir);
        free(m->image_dir);
        free(m->version);
        free(m->commit);
        free(m->built);
        free(m);
        return NULL;
}

const ManagerSettings *manager_settings(Manager *m) {
        return &m->settings;
}

sd_event *manager_event(Manager *m) {
        return m->event;
}

AttestCa *manager_attest_ca(Manager *m) {
        return m->ca;
}

const char *manager_state_dir(Manager *m) {
        return m->state_dir;
}

const char *manager_image_dir(Manager *m) {
        return m->image_dir;
}

NetworkRegistry *manager_networks(Manager *m) {
        return m->networks;
}

ImageCatalog *manager_images(Manager *m) {
        return m->images;
}

HostProbe *manager_host(Manager *m) {
        return m->host;
}

Storage *manager_storage(Manager *m) {
        return m->storage;
}

AttestNonceStore *manager_nonces(Manager *m) {
        return m->nonces;
}

VmUnitManager *manager_units(Manager *m) {
        return m->units;
}

VmNotify *manager_notify(Manager *m) {
        return m->notify;
}

VmReports *manager_reports(Manager *m) {
        return m->reports;
}

VmSpawner *manager_spawner(Manager *m) {
        return m->spawner;
}

int manager_exec_worker(Manager *m, Worker **ret) {
        int r;

        if (!m->exec_worker) {
                r = worker_new(
                        m->event,
                        &(WorkerOptions){
                                .name = "vmm-exec",
                                .threads = 1,
                                .max_jobs = WORKER_JOBS_MAX,
                                .nice = 10,
                        },
                        &m->exec_worker);
                if (r < 0)
                        return r;
        }
        *ret = m->exec_worker;
        return 0;
}

FileWriter *manager_writer(Manager *m) {
        return m->writer;
}

TaskRegistry *manager_tasks(Manager *m) {
        return m->tasks;
}

static void on_file_written(int r, const char *path, void *userdata) {
        if (r < 0)
                log_error_errno(r, "Failed to write or remove '%s': %m", path);
}

int manager_write_file(Manager *m, const char *path, const void *data, size_t size, mode_t mode) {
        if (!m->writer_on)
                return write_file_atomic(path, data, size, mode);
        return file_writer_write(m->writer, path, data, size, mode, on_file_written, /* userdata= */ NULL);
}

int manager_write_json(Manager *m, const char *path, json_t *v, size_t max, mode_t mode) {
        json_auto_t *value = v;
        _cleanup_free_ char *text = NULL;
        size_t size;

        if (m->writer_on)
                return file_writer_write_json(
                        m->writer, path, TAKE_PTR(value), max, mode, on_file_written, /* userdata= */ NULL);
        text = json_dumps_pretty(value, &size);
        if (!text)
                return -ENOMEM;
        if (size > max)
                return -EFBIG;
        return write_file_atomic(path, text, size, mode);
}

int manager_remove_tree(Manager *m, const char *path) {
        if (!m->writer_on)
                return rm_rf(path);
        return file_writer_remove(m->writer, path, on_file_written, /* userdata= */ NULL);
}

int manager_unlink_file(Manager *m, const char *path) {
        if (!m->writer_on)
                return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
        return file_writer_unlink(m->writer, path, on_file_written, /* userdata= */ NULL);
}

int manager_sync(Manager *m, FileWriterDoneFunc done, void *userdata) {
        return file_writer_sync(m->writer, done, userdata);
}

ManagerMetrics *manager_metrics(Manager *m) {
        return m->metrics;
}

const LoopStats *manager_loop_stats(Manager *m) {
        return m->loop_stats;
}

const char *manager_version(Manager *m) {
        return m->version;
}

const char *manager_commit(Manager *m) {
        return m->commit;
}

const char *manager_built(Manager *m) {
        return m->built;
}

void manager_touch(Manager *m) {
        m->generation++;
}

uint64_t manager_generation(Manager *m) {
        return m->generation;
}

/* ---- VMs ---- */

size_t manager_n_vms(Manager *m) {
        return m->n_vms;
}

Vm *manager_vm_at(Manager *m, size_t i) {
        return i < m->n_vms ? m->vms[i] : NULL;
}

const char *manager_vm_name(const char *vm_id, void *userdata) {
        Vm *v = manager_find_vm(userdata, vm_id);

        return v ? vm_name(v) : NULL;
}

Vm *manager_find_vm(Manager *m, const char *id) {
        for (size_t i = 0; id && i < m->n_vms; i++)
                if (streq(vm_id(m->vms[i]), id))
                        return m->vms[i];
        return NULL;
}

Vm *manager_find_vm_by_name(Manager *m, const char *name) {
        for (size_t i = 0; name && i < m->n_vms; i++)
                if (streq(vm_name(m->vms[i]), name))
                        return m->vms[i];
        return NULL;
}

int manager_add_vm(Manager *m, Vm *v) {
        Vm **a;

        if (m->n_vms >= MANAGER_VMS_MAX)
                return -E2BIG;
        a = realloc(m->vms, (m->n_vms + 1) * sizeof(Vm *));
        if (!a)
                return -ENOMEM;
        m->vms = a;
        m->vms[m->n_vms++] = vm_ref(v);
        manager_vm_event(m, v, MANAGER_VM_ADDED);
        return 0;
}

void manager_remove_vm(Manager *m, Vm *v) {
        for (size_t i = 0; i < m->n_vms; i++)
                if (m->vms[i] == v) {
                        memmove(m->vms + i, m->vms + i + 1, (m->n_vms - i - 1) * sizeof(Vm *));
                        m->n_vms--;
                        /* while v is still whole: the manager's was perhaps the last reference */
                        manager_vm_event(m, v, MANAGER_VM_REMOVED);
                        vm_unref(v);
                        return;
                }
}

int manager_watch_vms(Manager *m, ManagerVmWatchFunc fn, void *userdata) {
        assert_return(m && fn, -EINVAL);
        if (m->n_vm_watchers >= MANAGER_VM_WATCHERS_MAX)
                return -E2BIG;
        m->vm_watchers[m->n_vm_watchers++] = (struct ManagerVmWatcher){ .fn = fn, .userdata = userdata };
        return 0;
}

void manager_unwatch_vms(Manager *m, void *userdata) {
        for (size_t i = 0; m && i < m->n_vm_watchers;)
                if (m->vm_watchers[i].userdata == userdata) {
                        memmove(m->vm_watchers + i,
                                m->vm_watchers + i + 1,
                                (m->n_vm_watchers - i - 1) * sizeof(m->vm_watchers[0]));
                        m->n_vm_watchers--;
                } else
                        i++;
}

void manager_vm_event(Manager *m, Vm *v, ManagerVmEvent event) {
        /* a VM of a unit test may have no manager */
        for (size_t i = 0; m && i < m->n_vm_watchers; i++)
                m->vm_watchers[i].fn(v, event, m->vm_watchers[i].userdata);
}

void manager_sort_vms(Manager *m, int (*cmp)(const void *a, const void *b)) {
        /* m->vms is NULL while there is no VM (every VM deleted): qsort() takes no NULL */
        if (m->n_vms > 1)
                qsort(m->vms, m->n_vms, sizeof(Vm *), cmp);
}

/* ---- quarantine ---- */

int manager_quarantine_add(Manager *m, const char *id, const char *path, const char *reason) {
        ManagerQuarantine *q;

        q = reallocarray(m->quarantine, m->n_quarantine + 1, sizeof(*q));
        if (!q)
                return -ENOMEM;
        m->quarantine = q;
        q = &m->quarantine[m->n_quarantine];
        *q = (ManagerQuarantine){ .id = strdup(id), .path = strdup(path), .reason = strdup(reason) };
        if (!q->id || !q->path || !q->reason) {
                free(q->id);
                free(q->path);
                free(q->reason);
                return -ENOMEM;
        }
        m->n_quarantine++;
        return 0;
}

const ManagerQuarantine *manager_find_quarantined(Manager *m, const char *id) {
        for (size_t i = 0; id && i < m->n_quarantine; i++)
                if (streq(m->quarantine[i].id, id))
                        return &m->quarantine[i];
        return NULL;
}

void manager_quarantine_remove(Manager *m, const char *id) {
        const ManagerQuarantine *q = manager_find_quarantined(m, id);
        size_t i;

        if (!q)
                return;
        i = (size_t) (q - m->quarantine);
        free(m->quarantine[i].id);
        free(m->quarantine[i].path);
        free(m->quarantine[i].reason);
        memmove(m->quarantine + i, m->quarantine + i + 1, (m->n_quarantine - i - 1) * sizeof(*m->quarantine));
        m->n_quarantine--;
}

json_t *manager_quarantine_to_json(Manager *m) {
        json_auto_t *a = json_array();

        if (!a)
                return NULL;
        for (size_t i = 0; i < m->n_quarantine; i++)
                if (json_array_append_new(
                            a,
                            json_pack(
                                    "{s:s,s:s,s:s}",
                                    "id",
                                    m->quarantine[i].id,
                                    "path",
                                    m->quarantine[i].path,
                                    "reason",
                                    m->quarantine[i].reason)) < 0)
                        return NULL;
        return TAKE_PTR(a);
}

/* ---- switches ---- */

NetSwitch *manager_switch_get(Manager *m, const char *name) {
        for (size_t i = 0; name && i < m->n_switches; i++)
                if (streq(m->switches[i].name, name))
                        return m->switches[i].sw;
        return NULL;
}

int manager_switch_start(Manager *m, const Network *n) {
        _cleanup_(net_switch_freep) NetSwitch *sw = NULL;
        _cleanup_free_ char *name = NULL;
        struct ManagerSwitch *a;
        NetSwitchConfig c = {
                .network = n->prefix,
                .netmask = { htonl(n->prefixlen == 0 ? 0 : UINT32_MAX << (32 - n->prefixlen)) },
                .gateway = network_gateway(n),
                .host_alias = network_host_alias(n),
                .host_alias_enabled = n->enable_host_alias,
                .imds_enabled = n->enable_imds,
                .search_domain = n->dns_search_domain,
                .mtu = n->mtu,
        };
        int r;

        if (manager_switch_get(m, n->name))
                return 0;
        network_mac_for(n->name, c.gateway, c.gateway_mac);
        r = net_switch_new(m->event, &c, &sw);
        if (r < 0)
                return r;
        name = strdup(n->name);
        if (!name)
                return -ENOMEM;
        a = reallocarray(m->switches, m->n_switches + 1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        m->switches = a;
        m->switches[m->n_switches++] = (struct ManagerSwitch){ TAKE_PTR(name), TAKE_PTR(sw) };
        log_debug("Network %s: switch and gateway up.", n->name);
        return 0;
}

void manager_switch_stop(Manager *m, const char *name) {
        for (size_t i = 0; i < m->n_switches; i++)
                if (streq(m->switches[i].name, name)) {
                        net_switch_free(m->switches[i].sw);
                        free(m->switches[i].name);
                        m->switches[i] = m->switches[--m->n_switches];
                        return;
                }
}

int manager_switches_start(Manager *m, ApiError *reterr) {
        for (size_t i = 0; i < network_registry_size(m->networks); i++) {
                Network *n = network_registry_at(m->networks, i);
                int r = manager_switch_start(m, n);
                if (r < 0)
                        return api_error_set(
                                reterr, r, API_ERROR_INTERNAL, "starting network %s: %s", n->name, strerror(-r));
        }
        return 0;
}

/* ---- the metadata service ---- */

void manager_set_imds(Manager *m, ManagerImdsAccept accept, void *userdata) {
        m->imds_accept = accept;
        m->imds_userdata = userdata;
}

void manager_unset_imds(Manager *m, void *userdata) {
        if (m->imds_userdata == userdata)
                manager_set_imds(m, NULL, NULL);
}

bool manager_imds_accept(Manager *m, Vm *v, int fd) {
        if (!m->imds_accept)
                return false;
        m->imds_accept(m->imds_userdata, v, fd);
        return true;
}

/* ---- shutdown ---- */

bool manager_shutting_down(Manager *m) {
        return m->shutting_down;
}

bool manager_detaching(Manager *m) {
        return m->detaching;
}

void manager_hold_vms(Manager *m, bool hold) {
        m->detaching = hold && m->units && m->detach_vms_on_exit;
}

void manager_abandon(Manager *m) {
        vm_abandon_all(m);
}

int manager_shutdown(Manager *m, void (*done)(void *userdata), void *userdata) {
        m->shutting_down = true;
        /* VMs in units stay (--detach-vms-on-exit) for the next daemon; plain children are powered
         * down before we go */
        if (m->units && m->detach_vms_on_exit) {
                m->detaching = true;
                vm_detach_all(m);
                return 0;
        }
        vm_stop_all(m, done, userdata);
        return 1;
}
