/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* get_vm_metrics: the host's view of a VM (its state, QEMU's process as /proc says, its disk, its
 * network) and a summary of its guest's last report. */
#include <stdio.h>
#include <stdlib.h>

#include "json-util.h"
#include "manager.h"
#include "metrics-guest.h"
#include "net-switch.h"
#include "network.h"
#include "process-util.h"
#include "vm-record.h"
#include "vm.h"

#define GUEST_NOTE_NONE "no systemd-report upload from the guest yet; host metrics only"
#define GUEST_NOTE_NOT_REPORT \
        "the guest's last upload is not a systemd-report and was not exported; see raw_report_url"
#define GUEST_NOTE_LOADING \
        "the guest's stored report is being mapped again after a restart; its series follow"

static double secs(usec_t a, usec_t b) {
        return (double) (b - a) / USEC_PER_SEC;
}

static int set_float(json_t *o, const char *key, double v) {
        return json_object_set_new(o, key, json_real(v));
}

static json_t *network_json(Manager *m, const char *name) {
        Network *n = network_registry_get(manager_networks(m), name);
        NetSwitch *sw = manager_switch_get(m, name);
        NetStats st = {};

        if (sw)
                net_switch_get_stats(sw, &st);
        return json_pack(
                "{s:s,s:I,s:I,s:I}",
                "name",
                name ?: "",
                "bytes_sent",
                (json_int_t) st.tx_bytes,
                "bytes_received",
                (json_int_t) st.rx_bytes,
                "leases",
                (json_int_t) (n ? n->n_leases : 0));
}

int vm_metrics_json(Vm *v, json_t **ret, ApiError *reterr) {
        json_auto_t *o = json_object(), *host = json_object(), *guest = NULL;
        usec_t created, installed, booted, ready, now = now_usec(CLOCK_REALTIME);
        pid_t pid = vm_qemu_pid(v);
        const VmGuest *g = vm_guest(v);
        ProcStats ps;
        char url[256];

        if (!o || !host)
                return -ENOMEM;
        vm_times(v, &created, &installed, &booted, &ready);
        if (json_object_set_new(host, "state", json_string(vm_state_to_string(vm_state(v)))) < 0 ||
            json_object_set_new(host, "attestation", json_string(vm_attestation_word(v))) < 0)
                return -ENOMEM;
        if (pid > 0) {
                if (json_object_set_new(host, "pid", json_integer(pid)) < 0)
                        return -ENOMEM;
                if (proc_stats(pid, &ps) >= 0 &&
                    (set_float(host, "cpu_seconds", ps.cpu_seconds) < 0 ||
                     json_object_set_new(host, "memory_rss_bytes", json_integer((json_int_t) ps.rss_bytes)) <
                             0))
                        return -ENOMEM;
        }
        if (json_object_set_new(host, "disk_bytes", json_integer((json_int_t) vm_disk_bytes(v))) < 0)
                return -ENOMEM;
        if (installed > 0 && created > 0 && installed >= created &&
            set_float(host, "install_seconds", secs(created, installed)) < 0)
                return -ENOMEM;
        if (ready > 0 && booted > 0 && ready >= booted &&
            set_float(host, "boot_to_ready_seconds", secs(booted, ready)) < 0)
                return -ENOMEM;
        if (json_object_set_new(host, "network", network_json(vm_manager(v), vm_network(v))) < 0)
                return -ENOMEM;

        if (g->has_upload && g->last_is_report && g->report) {
                GuestReport *rep = g->report;

                guest = json_object();
                if (!guest || vm_json_set_time(guest, "received_at", g->received_at) < 0 ||
                    (rep->generated_at > 0 && vm_json_set_time(guest, "generated_at", rep->generated_at) < 0) ||
                    set_float(guest, "report_age_seconds", now > g->received_at ? secs(g->received_at, now) : 0) <
                            0 ||
                    json_object_set_new(guest, "families", json_integer((json_int_t) rep->n_families)) < 0 ||
                    json_object_set_new(guest, "series", json_integer((json_int_t) rep->n_entries)) < 0 ||
                    json_object_set_new(guest, "series_exported", json_integer((json_int_t) rep->n_series)) <
                            0 ||
                    json_object_set_new(
                            guest,
                            "series_dropped",
                            json_integer((
                                    json_int_t) (rep->dropped[GUEST_DROP_LIMIT] + rep->dropped[GUEST_DROP_UNSUPPORTED] + rep->dropped[GUEST_DROP_DUPLICATE]))) <
                            0 ||
                    json_object_set(guest, "sample", rep->sample ?: json_null()) < 0)
                        return -ENOMEM;
        }

        if (json_object_set_new(o, "id", json_string(vm_id(v))) < 0 ||
            json_object_set(o, "host", host) < 0 || json_object_set(o, "guest", guest ?: json_null()) < 0)
                return -ENOMEM;
        if (g->has_upload || g->loading) {
                snprintf(url, sizeof(url), "/api/v1/vms/%s/report", vm_id(v));
                if (json_object_set_new(o, "raw_report_url", json_string(url)) < 0)
                        return -ENOMEM;
        }
        if (!g->has_upload || !guest) {
                const char *note = g->has_upload ? GUEST_NOTE_NOT_REPORT :
                        g->loading               ? GUEST_NOTE_LOADING :
                                                   GUEST_NOTE_NONE;
                if (json_object_set_new(o, "note", json_string(note)) < 0)
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(o);
        return 0;
}
