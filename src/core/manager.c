/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "manager.h"

static void on_images_changed(ImageCatalog *c, void *userdata) {
        manager_touch(userdata);
}

static int strdup_to(char **dst, const char *src) {
        *dst = strdup(src ?: "");
        return *dst ? 0 : -ENOMEM;
}

int manager_new(Manager **ret, sd_event *event, const ManagerConfig *cfg, ApiError *reterr) {
        _cleanup_(manager_freep) Manager *m = NULL;
        const char *reason = NULL, *fw;
        int r;

        assert_return(ret && event && cfg && cfg->state_dir && cfg->image_dir, -EINVAL);

        m = calloc(1, sizeof(Manager));
        if (!m)
                return -ENOMEM;
        m->event = sd_event_ref(event);
        if (strdup_to(&m->state_dir, cfg->state_dir) < 0 || strdup_to(&m->image_dir, cfg->image_dir) < 0 ||
            strdup_to(&m->version, cfg->version) < 0 || strdup_to(&m->commit, cfg->commit) < 0 ||
            strdup_to(&m->built, cfg->built) < 0)
                return -ENOMEM;

        /* Start-up order: host facts, networks with their leases, the image catalog, then the
         * default network. */
        r = host_probe_new(
                &m->host,
                &(HostProbeConfig){
                        .ovmf_code = cfg->ovmf_code,
                        .accel = cfg->accel,
                });
        if (r < 0)
                return api_error_set(reterr, r, API_ERROR_INTERNAL, "probing the host: %s", strerror(-r));
        (void) host_probe_accel(m->host, &reason);
        log_info("Accelerator: %s (%s).", host_accel_to_string(host_probe_accel(m->host, NULL)), reason ?: "");
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

        r = image_catalog_new(&m->images, event, m->image_dir, reterr);
        if (r < 0)
                return r;
        image_catalog_set_change_callback(m->images, on_images_changed, m);
        if (image_catalog_size(m->images) == 0)
                log_warning("No images in '%s': create_vm needs one (see images/).", m->image_dir);

        r = network_ensure_default(m->networks, cfg->default_network, cfg->network_subnet, reterr);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(m);
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;
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
        /* VM records arrive with the runtime; until then no lease has a VM behind it. */
        return NULL;
}
