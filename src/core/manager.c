/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include <sys/random.h>

#include "fs-util.h"
#include "log.h"
#include "manager.h"
#include "parse-util.h"
#include "string-table.h"

static const char *const vm_launcher_table[_VM_LAUNCHER_MAX] = {
        [VM_LAUNCHER_AUTO] = "auto",
        [VM_LAUNCHER_SYSTEMD] = "systemd",
        [VM_LAUNCHER_PROCESS] = "process",
};

DEFINE_STRING_TABLE_LOOKUP(vm_launcher, VmLauncherKind);

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
                        m->notify_port = port;
                        return 0;
                }
                log_warning("Ignoring malformed %s.", path);
        }
        if (wanted == 0) {
                if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
                        return -EIO;
                wanted = 49152U + rnd % 16384U;
        }
        m->notify_port = wanted;
        snprintf(buf, sizeof(buf), "%u\n", wanted);
        r = write_file_atomic(path, buf, strlen(buf), 0600);
        return r;
}

static int manager_switches_start(Manager *m, ApiError *reterr);

/* An image whose golden values were recorded with another firmware build than this host's cannot
 * pass verification here: say so once, at start. */
static void manager_check_golden_firmware(Manager *m) {
        const char *host = host_probe_firmware_sha256(m->host);
        for (size_t i = 0; i < image_catalog_size(m->images); i++) {
                const Image *img = image_catalog_at(m->images, i);
                json_t *fw = json_object_get(img->policy, "golden_firmware");
                if (m->attestation == ATTEST_MODE_VERIFY && !m->learn_golden &&
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

/* The buckets of the reference: an install under KVM takes tens of seconds, under TCG minutes. */
static const double install_buckets[] = { 10, 20, 30, 45, 60, 90, 120, 180, 300 };
static const double ready_buckets[] = { 1, 2, 5, 10, 15, 20, 30, 60, 120 };

int manager_new(Manager **ret, sd_event *event, const ManagerConfig *cfg, ApiError *reterr) {
        _cleanup_(manager_freep) Manager *m = NULL;
        const char *reason = NULL, *fw;
        int r;

        assert_return(ret && event && cfg && cfg->state_dir && cfg->image_dir, -EINVAL);

        m = calloc(1, sizeof(Manager));
        if (!m)
                return -ENOMEM;
        m->vsock_fd = -EBADF;
        m->attestation = cfg->attestation;
        m->learn_golden = cfg->attestation_learn_golden;
        r = attest_nonce_store_new(&m->nonces);
        if (r < 0)
                return r;
        m->event = sd_event_ref(event);
        if (strdup_to(&m->state_dir, cfg->state_dir) < 0 || strdup_to(&m->image_dir, cfg->image_dir) < 0 ||
            strdup_to(&m->version, cfg->version) < 0 || strdup_to(&m->commit, cfg->commit) < 0 ||
            strdup_to(&m->built, cfg->built) < 0 || strdup_to(&m->ovmf_code, cfg->ovmf_code) < 0 ||
            strdup_to(&m->ovmf_vars, cfg->ovmf_vars) < 0)
                return -ENOMEM;
        m->stop_timeout = cfg->stop_timeout ?: 30 * USEC_PER_SEC;
        m->qmp_timeout = cfg->qmp_timeout ?: 30 * USEC_PER_SEC;
        m->guest_series_limit = cfg->guest_series_limit ?: GUEST_SERIES_LIMIT_DEFAULT;
        metrics_histogram_init(&m->install_seconds, install_buckets, ELEMENTSOF(install_buckets));
        metrics_histogram_init(&m->boot_to_ready_seconds, ready_buckets, ELEMENTSOF(ready_buckets));

        /* Start-up order: host facts, networks with their leases, the image catalog, then the
         * default network. */
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
        bool tcg = host_probe_accel(m->host, NULL) == HOST_ACCEL_TCG;
        m->install_timeout = cfg->install_timeout ?: (tcg ? 15 : 5) * USEC_PER_MINUTE;
        m->boot_timeout = cfg->boot_timeout ?: (tcg ? 10 : 4) * USEC_PER_MINUTE;
        if (cfg->accel == HOST_ACCEL_AUTO && host_probe_accel(m->host, &reason) == HOST_ACCEL_TCG)
                log_warning("VMs run under TCG, much slower than KVM: %s", reason ?: "");
        else {
                (void) host_probe_accel(m->host, &reason);
                log_info(
                        "Accelerator: %s (%s).",
                        host_accel_to_string(host_probe_accel(m->host, NULL)),
                        reason ?: "");
        }
        {
                HostNotify n = host_probe_notify(m->host, &reason);
                if (n == HOST_NOTIFY_NONE)
                        log_warning("VMs cannot report READY=1: %s", reason ?: "");
                else
                        log_info("READY=1 transport: %s (%s)", host_notify_transport_name(n), reason ?: "");
        }
        fw = host_probe_firmware_summary(m->host);
        if (fw)
                log_info("Firmware VMs boot with: %s.", fw);
        else
                log_warning(
                        "No OVMF firmware at '%s': VMs cannot boot until one is installed.",
                        cfg->ovmf_code ?: "");

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

        /* The launcher: VMs as transient units where a service manager is reachable. */
        if (cfg->launcher != VM_LAUNCHER_PROCESS) {
                const char *why = NULL;

                r = vm_unit_manager_new(&m->units, event, VM_UNIT_SCOPE_AUTO, &why);
                if (r < 0 && cfg->launcher == VM_LAUNCHER_SYSTEMD)
                        return api_error_set(
                                reterr,
                                r,
                                API_ERROR_UNSUPPORTED,
                                "systemd launcher unavailable: %s",
                                why ?: strerror(-r));
                if (r < 0)
                        log_notice(
                                "VMs run as plain child processes and end with vm-manager: %s",
                                why ?: strerror(-r));
                else
                        log_info(
                                "VMs run as transient systemd units in vm-manager.slice%s.",
                                cfg->detach_vms_on_exit ? " and keep running when vm-manager stops" : "");
        }
        m->detach_vms_on_exit = cfg->detach_vms_on_exit;

        r = storage_new(&m->storage, m->state_dir, /* provider_socket= */ NULL);
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "setting up VM disks: %s", strerror(-r));
        log_info("VM disks: %s.", storage_description(m->storage));

        r = notify_port_init(m, cfg->notify_port);
        if (r < 0)
                return api_error_set(
                        reterr, r, API_ERROR_INTERNAL, "recording the notify port: %s", strerror(-r));

        r = vm_load_all(m, reterr);
        if (r < 0)
                return r;
        /* From here on a failed start-up must not take the VMs just attached to down with it. */
        m->detaching = m->units && m->detach_vms_on_exit;

        r = network_ensure_default(m->networks, cfg->default_network, cfg->network_subnet, reterr);
        if (r < 0)
                return r;
        r = manager_switches_start(m, reterr);
        if (r < 0)
                return r;

        if (m->attestation == ATTEST_MODE_NOOP)
                log_warning(
                        "Attestation is noop: any quote that echoes a fresh nonce passes. Development only.");
        if (m->learn_golden)
                log_warning(
                        "Attestation learns golden PCRs it has no value for (--attestation-learn-golden): "
                        "never for production.");
        manager_check_golden_firmware(m);

        m->detaching = false;
        *ret = TAKE_PTR(m);
        return 0;
}

static const char *const attest_mode_table[_ATTEST_MODE_MAX] = {
        [ATTEST_MODE_VERIFY] = "verify",
        [ATTEST_MODE_NOOP] = "noop",
};

DEFINE_STRING_TABLE_LOOKUP(attest_mode, AttestMode);

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

static int manager_switches_start(Manager *m, ApiError *reterr) {
        for (size_t i = 0; i < network_registry_size(m->networks); i++) {
                Network *n = network_registry_at(m->networks, i);
                int r = manager_switch_start(m, n);
                if (r < 0)
                        return api_error_set(
                                reterr, r, API_ERROR_INTERNAL, "starting network %s: %s", n->name, strerror(-r));
        }
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;
        /* first: the jobs still running finish while their VMs exist */
        m->report_worker = worker_free(m->report_worker);
        while (m->n_vms > 0)
                manager_remove_vm(m, m->vms[m->n_vms - 1]);
        free(m->vms);
        for (size_t i = 0; i < m->n_quarantine; i++) {
                free(m->quarantine[i].id);
                free(m->quarantine[i].path);
                free(m->quarantine[i].reason);
        }
        free(m->quarantine);
        while (m->n_switches > 0)
                manager_switch_stop(m, m->switches[0].name);
        free(m->switches);
        sd_event_source_disable_unref(m->vsock_source);
        safe_close(m->vsock_fd);
        attest_nonce_store_free(m->nonces);
        vm_unit_manager_free(m->units);
        storage_free(m->storage);
        free(m->ovmf_code);
        free(m->ovmf_vars);
        image_catalog_free(m->images);
        network_registry_free(m->networks);
        host_probe_free(m->host);
        sd_event_unref(m->event);
        free(m->state_dir);
        free(m->image_dir);
        free(m->version);
        free(m->commit);
        free(m->built);
        free(m);
        return NULL;
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

const struct ManagerQuarantine *manager_find_quarantined(Manager *m, const char *id) {
        for (size_t i = 0; id && i < m->n_quarantine; i++)
                if (streq(m->quarantine[i].id, id))
                        return &m->quarantine[i];
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
        return 0;
}

void manager_remove_vm(Manager *m, Vm *v) {
        for (size_t i = 0; i < m->n_vms; i++)
                if (m->vms[i] == v) {
                        memmove(m->vms + i, m->vms + i + 1, (m->n_vms - i - 1) * sizeof(Vm *));
                        m->n_vms--;
                        vm_unref(v);
                        return;
                }
}
