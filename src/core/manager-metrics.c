/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* GET /metrics: the exposition of the host families (the VMs and networks as the records say, QEMU's
 * processes as /proc says), the guest families (the VMs' last systemd-reports), and the daemon's own
 * process. Everything is computed at scrape time; only the two duration histograms are kept. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "host-probe.h"
#include "log.h"
#include "manager.h"
#include "metrics-guest.h"
#include "metrics-text.h"
#include "net-switch.h"
#include "network.h"
#include "process-util.h"
#include "vm.h"

struct ManagerMetrics {
        MetricsHistogram install_seconds, boot_to_ready_seconds;
        size_t size_hint; /* bytes of the last exposition */
};

/* The buckets of the reference: an install under KVM takes tens of seconds, under TCG minutes. */
static const double install_buckets[] = { 10, 20, 30, 45, 60, 90, 120, 180, 300 };
static const double ready_buckets[] = { 1, 2, 5, 10, 15, 20, 30, 60, 120 };

int manager_metrics_new(ManagerMetrics **ret) {
        ManagerMetrics *mm = calloc(1, sizeof(ManagerMetrics));

        if (!mm)
                return -ENOMEM;
        metrics_histogram_init(&mm->install_seconds, install_buckets, ELEMENTSOF(install_buckets));
        metrics_histogram_init(&mm->boot_to_ready_seconds, ready_buckets, ELEMENTSOF(ready_buckets));
        *ret = mm;
        return 0;
}

ManagerMetrics *manager_metrics_free(ManagerMetrics *mm) {
        free(mm);
        return NULL;
}

void manager_observe_install(Manager *m, usec_t duration) {
        metrics_histogram_observe(&manager_metrics(m)->install_seconds, (double) duration / USEC_PER_SEC);
}

void manager_observe_boot_to_ready(Manager *m, usec_t duration) {
        metrics_histogram_observe(&manager_metrics(m)->boot_to_ready_seconds, (double) duration / USEC_PER_SEC);
}

static double secs(usec_t a, usec_t b) {
        return (double) (b - a) / USEC_PER_SEC;
}

/* ---- the exposition ---------------------------------------------------------------------------- */

#define VM_LABELS(v) "vm", vm_id(v), "name", vm_name(v)

static void write_vm_gauge(
        MetricsBuf *f, Manager *m, const char *name, const char *help, double (*get)(Vm *v, bool *ok)) {
        metrics_write_family(f, name, "gauge", help);
        for (size_t i = 0; i < manager_n_vms(m); i++) {
                bool ok = true;
                double x = get(manager_vm_at(m, i), &ok);
                if (ok)
                        metrics_write_samplel(f, name, x, VM_LABELS(manager_vm_at(m, i)), NULL);
        }
}

static double get_created(Vm *v, bool *ok) {
        usec_t c;
        vm_times(v, &c, NULL, NULL, NULL);
        *ok = c > 0;
        return (double) c / USEC_PER_SEC;
}

static double get_install(Vm *v, bool *ok) {
        usec_t c, i;
        vm_times(v, &c, &i, NULL, NULL);
        *ok = c > 0 && i >= c;
        return *ok ? secs(c, i) : 0;
}

static double get_ready(Vm *v, bool *ok) {
        usec_t b, r;
        vm_times(v, NULL, NULL, &b, &r);
        *ok = b > 0 && r >= b;
        return *ok ? secs(b, r) : 0;
}

static double get_disk(Vm *v, bool *ok) {
        return (double) vm_disk_bytes(v);
}

/* The PSS of each process of each VM's run (QEMU, swtpm, vhost-device-vsock): what the host spends on
 * it, shared pages split among their users, as a worker thread last read them (vm_process_memory()). */
static void write_vm_memory(MetricsBuf *f, Manager *m) {
        metrics_write_family(
                f,
                "vm_manager_vm_process_memory_pss_bytes",
                "gauge",
                "Proportional set size of each process of the VM's run (qemu, swtpm, vsock), from smaps_rollup.");
        for (size_t i = 0; i < manager_n_vms(m); i++) {
                Vm *v = manager_vm_at(m, i);

                for (VmRole r = 0; r < _VM_ROLE_MAX; r++) {
                        ProcMemory pm;
                        pid_t pid;

                        if (vm_process_memory(v, r, &pid, &pm) >= 0)
                                metrics_write_samplel(
                                        f,
                                        "vm_manager_vm_process_memory_pss_bytes",
                                        (double) pm.pss,
                                        VM_LABELS(v),
                                        "process",
                                        vm_role_to_string(r),
                                        NULL);
                }
        }
}

/* The balloon's guest statistics, as QEMU last had them: levels of memory as gauges, the guest's swap
 * traffic and page faults since its boot as counters (vm_manager_vm_balloon_<name>[_total]). */
static void write_vm_balloon(MetricsBuf *f, Manager *m) {
        const VmBalloonStats **st = calloc(manager_n_vms(m) ?: 1, sizeof(VmBalloonStats *));

        if (!st)
                return;
        for (size_t i = 0; i < manager_n_vms(m); i++)
                if (!vm_balloon_stats(manager_vm_at(m, i), &st[i]))
                        st[i] = NULL;
        for (VmBalloonStat k = 0; k < _VM_BALLOON_STAT_MAX; k++) {
                const VmBalloonStatInfo *info = vm_balloon_stat_info(k);
                char name[128], help[192];

                snprintf(
                        name,
                        sizeof(name),
                        "vm_manager_vm_balloon_%s%s",
                        info->name,
                        info->cumulative ? "_total" : "");
                snprintf(
                        help,
                        sizeof(help),
                        "The guest's %s (QEMU's %s)%s, from the balloon's statistics.",
                        info->name,
                        info->qemu,
                        info->cumulative ? " since it booted" : "");
                metrics_write_family(f, name, info->cumulative ? "counter" : "gauge", help);
                for (size_t i = 0; i < manager_n_vms(m); i++)
                        if (st[i] && st[i]->have[k])
                                metrics_write_samplel(
                                        f, name, (double) st[i]->value[k], VM_LABELS(manager_vm_at(m, i)), NULL);
        }
        free(st);
}

/* A family of one unlabelled gauge. */
static void write_gauge(MetricsBuf *f, const char *name, const char *help, double value) {
        metrics_write_family(f, name, "gauge", help);
        metrics_write_sample(f, name, NULL, NULL, 0, value);
}

/* KSM as the host's sysfs says now; nothing where the kernel has none. */
static void write_host_ksm(MetricsBuf *f, Manager *m) {
        long page = sysconf(_SC_PAGESIZE);
        HostKsm k;

        if (host_probe_ksm(manager_host(m), &k) < 0 || !k.available)
                return;
        write_gauge(
                f,
                "vm_manager_host_ksm_running",
                "Whether kernel samepage merging runs (1) or not (0).",
                k.run == 1);
        write_gauge(
                f,
                "vm_manager_host_ksm_pages_shared",
                "Merged pages KSM keeps (pages_shared).",
                (double) k.pages_shared);
        write_gauge(
                f,
                "vm_manager_host_ksm_pages_sharing",
                "Sites sharing the merged pages, the pages KSM saves (pages_sharing).",
                (double) k.pages_sharing);
        write_gauge(
                f,
                "vm_manager_host_ksm_saved_bytes",
                "Memory KSM saves: pages_sharing times the page size.",
                (double) host_ksm_saved_bytes(&k, page > 0 ? (uint64_t) page : 4096));
}

static void write_host_families(MetricsBuf *f, Manager *m) {
        static const char *const att_words[] = { "disabled", "pending", "released", "failed" };
        unsigned counts[_VM_STATE_MAX] = {};
        ProcStats *ps = calloc(manager_n_vms(m) ?: 1, sizeof(ProcStats));
        bool *has_ps = calloc(manager_n_vms(m) ?: 1, sizeof(bool));

        metrics_write_family(
                f,
                "vm_manager_vm_state",
                "gauge",
                "Current lifecycle state of each VM (1 for the current state).");
        for (size_t i = 0; i < manager_n_vms(m); i++) {
                Vm *v = manager_vm_at(m, i);
                VmState cur = vm_state(v);

                if (cur >= 0 && cur < _VM_STATE_MAX)
                        counts[cur]++;
                for (VmState s = 0; s < _VM_STATE_MAX; s++)
                        metrics_write_samplel(
                                f,
                                "vm_manager_vm_state",
                                s == cur ? 1 : 0,
                                VM_LABELS(v),
                                "state",
                                vm_state_to_string(s),
                                NULL);
        }

        metrics_write_family(
                f,
                "vm_manager_vm_attestation",
                "gauge",
                "Attestation of each VM's current boot: disabled, pending, released or failed (1 for the current one).");
        for (size_t i = 0; i < manager_n_vms(m); i++) {
                const char *w = vm_attestation_word(manager_vm_at(m, i));
                for (size_t k = 0; k < ELEMENTSOF(att_words); k++)
                        metrics_write_samplel(
                                f,
                                "vm_manager_vm_attestation",
                                streq(w, att_words[k]) ? 1 : 0,
                                VM_LABELS(manager_vm_at(m, i)),
                                "state",
                                att_words[k],
                                NULL);
        }

        metrics_write_family(f, "vm_manager_vm_info", "gauge", "Static facts of each VM as labels (always 1).");
        for (size_t i = 0; i < manager_n_vms(m); i++) {
                Vm *v = manager_vm_at(m, i);
                metrics_write_samplel(
                        f,
                        "vm_manager_vm_info",
                        1,
                        VM_LABELS(v),
                        "network",
                        vm_network(v) ?: "",
                        "ip",
                        vm_ip(v) ?: "",
                        "image",
                        vm_spec(v)->image ?: "",
                        NULL);
        }

        write_vm_gauge(
                f,
                m,
                "vm_manager_vm_created_timestamp_seconds",
                "When the VM was created (Unix seconds).",
                get_created);
        write_vm_gauge(
                f,
                m,
                "vm_manager_vm_install_seconds",
                "How long the VM's install took (created to installed).",
                get_install);
        write_vm_gauge(
                f,
                m,
                "vm_manager_vm_boot_to_ready_seconds",
                "Seconds from the start of the current installed boot to READY=1.",
                get_ready);

        for (size_t i = 0; ps && has_ps && i < manager_n_vms(m); i++)
                has_ps[i] = proc_stats(vm_qemu_pid(manager_vm_at(m, i)), &ps[i]) >= 0;
        metrics_write_family(
                f,
                "vm_manager_vm_cpu_seconds_total",
                "counter",
                "CPU time (user and system) of the VM's QEMU process.");
        for (size_t i = 0; ps && has_ps && i < manager_n_vms(m); i++)
                if (has_ps[i])
                        metrics_write_samplel(
                                f,
                                "vm_manager_vm_cpu_seconds_total",
                                ps[i].cpu_seconds,
                                VM_LABELS(manager_vm_at(m, i)),
                                NULL);
        metrics_write_family(
                f, "vm_manager_vm_memory_rss_bytes", "gauge", "Resident memory of the VM's QEMU process.");
        for (size_t i = 0; ps && has_ps && i < manager_n_vms(m); i++)
                if (has_ps[i])
                        metrics_write_samplel(
                                f,
                                "vm_manager_vm_memory_rss_bytes",
                                (double) ps[i].rss_bytes,
                                VM_LABELS(manager_vm_at(m, i)),
                                NULL);
        free(ps);
        free(has_ps);

        write_vm_memory(f, m);
        write_vm_balloon(f, m);

        write_vm_gauge(f, m, "vm_manager_vm_disk_bytes", "Size of the VM's disk volume.", get_disk);

        write_host_ksm(f, m);

        metrics_write_family(f, "vm_manager_vms", "gauge", "Number of VMs per lifecycle state.");
        for (VmState s = 0; s < _VM_STATE_MAX; s++)
                metrics_write_samplel(f, "vm_manager_vms", counts[s], "state", vm_state_to_string(s), NULL);

        metrics_write_family(
                f,
                "vm_manager_network_bytes_total",
                "counter",
                "Bytes over each network's switch: sent to VMs and received from them (with 4-byte frame prefixes).");
        for (size_t i = 0; i < network_registry_size(manager_networks(m)); i++) {
                Network *n = network_registry_at(manager_networks(m), i);
                NetSwitch *sw = manager_switch_get(m, n->name);
                NetStats st = {};

                if (sw)
                        net_switch_get_stats(sw, &st);
                metrics_write_samplel(
                        f,
                        "vm_manager_network_bytes_total",
                        (double) st.tx_bytes,
                        "network",
                        n->name,
                        "direction",
                        "sent",
                        NULL);
                metrics_write_samplel(
                        f,
                        "vm_manager_network_bytes_total",
                        (double) st.rx_bytes,
                        "network",
                        n->name,
                        "direction",
                        "received",
                        NULL);
        }
        metrics_write_family(f, "vm_manager_network_leases", "gauge", "Address leases held on each network.");
        for (size_t i = 0; i < network_registry_size(manager_networks(m)); i++) {
                Network *n = network_registry_at(manager_networks(m), i);
                metrics_write_samplel(
                        f, "vm_manager_network_leases", (double) n->n_leases, "network", n->name, NULL);
        }

        metrics_write_histogram(
                f,
                "vm_manager_vm_install_duration_seconds",
                "Durations of successful installs (created to installed), since vm-manager started.",
                &manager_metrics(m)->install_seconds);
        metrics_write_histogram(
                f,
                "vm_manager_vm_boot_to_ready_duration_seconds",
                "Durations from an installed boot's start to READY=1, since vm-manager started.",
                &manager_metrics(m)->boot_to_ready_seconds);
}

static void write_build_and_process(MetricsBuf *f, Manager *m) {
        ProcStats ps;
        struct rlimit rl;
        FILE *up;
        double boot_time = 0;
        unsigned fds = 0;
        DIR *d;

        metrics_write_family(f, "vm_manager_build_info", "gauge", "The vm-manager build (always 1).");
        metrics_write_samplel(
                f,
                "vm_manager_build_info",
                1,
                "version",
                manager_version(m) ?: "",
                "commit",
                manager_commit(m) ?: "",
                "built",
                manager_built(m) ?: "",
                NULL);

        if (proc_stats(getpid(), &ps) < 0)
                return;
        up = fopen("/proc/stat", "re");
        if (up) {
                char line[256];
                while (fgets(line, sizeof(line), up))
                        if (sscanf(line, "btime %lf", &boot_time) == 1)
                                break;
                fclose(up);
        }
        d = opendir("/proc/self/fd");
        if (d) {
                for (struct dirent *de; (de = readdir(d));)
                        if (de->d_name[0] != '.')
                                fds++;
                closedir(d);
        }
        metrics_write_family(
                f, "process_cpu_seconds_total", "counter", "CPU time (user and system) of vm-manager.");
        metrics_write_sample(f, "process_cpu_seconds_total", NULL, NULL, 0, ps.cpu_seconds);
        metrics_write_family(f, "process_resident_memory_bytes", "gauge", "Resident memory of vm-manager.");
        metrics_write_sample(f, "process_resident_memory_bytes", NULL, NULL, 0, (double) ps.rss_bytes);
        metrics_write_family(f, "process_virtual_memory_bytes", "gauge", "Virtual memory of vm-manager.");
        metrics_write_sample(f, "process_virtual_memory_bytes", NULL, NULL, 0, (double) ps.vsize_bytes);
        metrics_write_family(f, "process_open_fds", "gauge", "Open file descriptors of vm-manager.");
        metrics_write_sample(
                f, "process_open_fds", NULL, NULL, 0, fds > 0 ? fds - 1 : 0); /* not the one reading */
        if (getrlimit(RLIMIT_NOFILE, &rl) >= 0) {
                metrics_write_family(f, "process_max_fds", "gauge", "File descriptor limit of vm-manager.");
                metrics_write_sample(f, "process_max_fds", NULL, NULL, 0, (double) rl.rlim_cur);
        }
        if (boot_time > 0) {
                metrics_write_family(
                        f, "process_start_time_seconds", "gauge", "When vm-manager started (Unix seconds).");
                metrics_write_sample(
                        f, "process_start_time_seconds", NULL, NULL, 0, boot_time + ps.start_seconds);
        }
}

/* The event loop's iterations (src/basic/loop-watchdog.h): the time each took, the wait for events
 * left out, and the longest since start. */
static void write_loop(MetricsBuf *f, Manager *m) {
        const LoopStats *s = manager_loop_stats(m);
        double bounds[LOOP_STATS_N_BOUNDS];
        MetricsHistogram h;

        if (!s)
                return;
        for (size_t i = 0; i < LOOP_STATS_N_BOUNDS; i++)
                bounds[i] = (double) loop_stats_bounds[i] / USEC_PER_SEC;
        metrics_histogram_init(&h, bounds, LOOP_STATS_N_BOUNDS);
        memcpy(h.buckets, s->buckets, sizeof(s->buckets));
        h.count = s->iterations;
        h.sum = (double) s->sum / USEC_PER_SEC;
        metrics_write_histogram(
                f,
                "vm_manager_loop_iteration_seconds",
                "Time the event loop spent on one iteration (prepare and dispatch; the wait for events left out).",
                &h);
        metrics_write_family(
                f,
                "vm_manager_loop_iteration_seconds_max",
                "gauge",
                "The longest event loop iteration since vm-manager started.");
        metrics_write_sample(
                f, "vm_manager_loop_iteration_seconds_max", NULL, NULL, 0, (double) s->worst / USEC_PER_SEC);
}

/* ---- guest families: merged across VMs by metric name, with the union of their label names ----- */

typedef struct GuestFamily {
        const char *name, *family, *type;
        char **labels; /* the union, in order of first appearance */
        size_t n_labels;
        /* the series of this family: (vm, series) */
        struct {
                Vm *vm;
                const GuestSeries *s;
        } * members;
        size_t n_members;
} GuestFamily;

static const char *kind_type(GuestSeriesKind k) {
        return k == GUEST_SERIES_COUNTER ? "counter" : "gauge";
}

/* Finds or adds the family of name; a sorted array with binary search keeps 50 VMs × 1000 series
 * cheap. *fams is kept sorted by inserting in place. */
static GuestFamily *family_get(GuestFamily **fams, size_t *n, size_t *cap, const GuestSeries *s) {
        size_t lo = 0, hi = *n;

        while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                int c = strcmp((*fams)[mid].name, s->name);
                if (c == 0)
                        return &(*fams)[mid];
                if (c < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (*n == *cap) {
                size_t nc = *cap ? *cap * 2 : 64;
                GuestFamily *nf = reallocarray(*fams, nc, sizeof(GuestFamily));
                if (!nf)
                        return NULL;
                *fams = nf;
                *cap = nc;
        }
        memmove(*fams + lo + 1, *fams + lo, (*n - lo) * sizeof(GuestFamily));
        (*fams)[lo] = (GuestFamily){ .name = s->name, .family = s->family, .type = kind_type(s->kind) };
        (*n)++;
        return &(*fams)[lo];
}

static int family_add(GuestFamily *fam, Vm *v, const GuestSeries *s) {
        void *nm;

        for (size_t i = 0; i < s->n_labels; i++) {
                bool found = false;
                for (size_t k = 0; k < fam->n_labels && !found; k++)
                        found = streq(fam->labels[k], s->label_names[i]);
                if (!found) {
                        char **nl = reallocarray(fam->labels, fam->n_labels + 1, sizeof(char *));
                        if (!nl)
                                return -ENOMEM;
                        fam->labels = nl;
                        fam->labels[fam->n_labels++] = s->label_names[i];
                }
        }
        if ((fam->n_members & (fam->n_members - 1)) == 0) { /* grow at powers of two */
                nm = reallocarray(
                        fam->members, fam->n_members ? fam->n_members * 2 : 1, sizeof(fam->members[0]));
                if (!nm)
                        return -ENOMEM;
                fam->members = nm;
        }
        fam->members[fam->n_members].vm = v;
        fam->members[fam->n_members++].s = s;
        return 0;
}

static bool is_bookkeeping(const char *name) {
        return streq(name, "vm_guest_report_age_seconds") || streq(name, "vm_guest_report_series") ||
                streq(name, "vm_guest_reports_total") || streq(name, "vm_guest_report_series_dropped_total");
}

static int write_guest_families(MetricsBuf *f, Manager *m) {
        static const char *const reasons[] = {
                [GUEST_DROP_LIMIT] = "limit", [GUEST_DROP_UNSUPPORTED] = "unsupported", [GUEST_DROP_DUPLICATE] = "duplicate"
        };
        GuestFamily *fams = NULL;
        size_t n = 0, cap = 0;
        usec_t now = now_usec(CLOCK_REALTIME);
        int r = 0;

        for (size_t i = 0; i < manager_n_vms(m) && r >= 0; i++) {
                GuestReport *rep = vm_guest(manager_vm_at(m, i))->report;
                for (size_t k = 0; rep && k < rep->n_series && r >= 0; k++) {
                        GuestFamily *fam;

                        /* the bookkeeping families below are ours */
                        if (is_bookkeeping(rep->series[k].name))
                                continue;
                        fam = family_get(&fams, &n, &cap, &rep->series[k]);
                        r = fam ? family_add(fam, manager_vm_at(m, i), &rep->series[k]) : -ENOMEM;
                }
        }
        for (size_t i = 0; i < n && r >= 0; i++) {
                GuestFamily *fam = &fams[i];
                size_t nl = fam->n_labels + 1;
                const char **names = calloc(nl, sizeof(char *)), **values = calloc(nl, sizeof(char *));
                _cleanup_free_ char *help = NULL;

                if (!names || !values || asprintf(&help, "Guest systemd-report family %s.", fam->family) < 0) {
                        free(names);
                        free(values);
                        r = -ENOMEM;
                        break;
                }
                names[0] = "vm";
                for (size_t k = 0; k < fam->n_labels; k++)
                        names[k + 1] = fam->labels[k];
                /* a name used as counter by one guest and gauge by another keeps the first type */
                metrics_write_family(f, fam->name, fam->type, help);
                for (size_t j = 0; j < fam->n_members; j++) {
                        const GuestSeries *s = fam->members[j].s;
                        values[0] = vm_id(fam->members[j].vm);
                        for (size_t k = 0; k < fam->n_labels; k++) {
                                values[k + 1] = "";
                                for (size_t q = 0; q < s->n_labels; q++)
                                        if (streq(s->label_names[q], fam->labels[k])) {
                                                values[k + 1] = s->label_values[q];
                                                break;
                                        }
                        }
                        metrics_write_sample(f, fam->name, names, values, nl, s->value);
                }
                free(names);
                free(values);
        }
        for (size_t i = 0; i < n; i++) {
                free(fams[i].labels);
                free(fams[i].members);
        }
        free(fams);
        if (r < 0)
                return r;

        metrics_write_family(
                f, "vm_guest_report_age_seconds", "gauge", "Seconds since the guest's last report upload.");
        for (size_t i = 0; i < manager_n_vms(m); i++) {
                const VmGuest *g = vm_guest(manager_vm_at(m, i));
                if (g->has_upload)
                        metrics_write_samplel(
                                f,
                                "vm_guest_report_age_seconds",
                                now > g->received_at ? secs(g->received_at, now) : 0,
                                "vm",
                                vm_id(manager_vm_at(m, i)),
                                NULL);
        }
        metrics_write_family(
                f, "vm_guest_report_series", "gauge", "Series exported from the guest's last report.");
        for (size_t i = 0; i < manager_n_vms(m); i++) {
                const VmGuest *g = vm_guest(manager_vm_at(m, i));
                if (g->report)
                        metrics_write_samplel(
                                f,
                                "vm_guest_report_series",
                                (double) g->report->n_series,
                                "vm",
                                vm_id(manager_vm_at(m, i)),
                                NULL);
        }
        metrics_write_family(f, "vm_guest_reports_total", "counter", "Report uploads received from the guest.");
        for (size_t i = 0; i < manager_n_vms(m); i++)
                metrics_write_samplel(
                        f,
                        "vm_guest_reports_total",
                        (double) vm_guest(manager_vm_at(m, i))->uploads,
                        "vm",
                        vm_id(manager_vm_at(m, i)),
                        NULL);
        metrics_write_family(
                f,
                "vm_guest_report_series_dropped_total",
                "counter",
                "Report entries not exported, by reason: limit, unsupported, duplicate.");
        for (size_t i = 0; i < manager_n_vms(m); i++)
                for (size_t k = 0; k < _GUEST_DROP_MAX; k++)
                        metrics_write_samplel(
                                f,
                                "vm_guest_report_series_dropped_total",
                                (double) vm_guest(manager_vm_at(m, i))->dropped[k],
                                "vm",
                                vm_id(manager_vm_at(m, i)),
                                "reason",
                                reasons[k],
                                NULL);
        return 0;
}

int manager_metrics_text(Manager *m, char **ret, size_t *ret_size) {
        _cleanup_(metrics_buf_done) MetricsBuf b = {};
        ManagerMetrics *mm = manager_metrics(m);
        int r;

        /* the last scrape's size, so that a big exposition is not built by doubling */
        metrics_buf_reserve(&b, mm->size_hint + mm->size_hint / 8);
        write_build_and_process(&b, m);
        write_loop(&b, m);
        write_host_families(&b, m);
        r = write_guest_families(&b, m);
        if (r >= 0 && b.oom)
                r = -ENOMEM;
        if (r < 0)
                return r;
        mm->size_hint = b.size;
        *ret_size = b.size;
        *ret = TAKE_PTR(b.data);
        return 0;
}
