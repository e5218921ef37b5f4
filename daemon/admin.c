/* Administrative and observability requests: statistics at every scope,
 * their resets, memory history, snapshots and run-time allocator settings.
 * A tenant sees its own figures only; device-wide views and settings need
 * admin rights (kernel-verified at connect). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "log.h"
#include "snapshot.h"

static int refuse_not_admin(gm_session_t *s, uint64_t request_id, const char *what) {
        gm_session_send_error(s, request_id, EPERM, "gpumemd: %s needs admin rights (uid 0 or the admin group)", what);
        return 0;
}

/* gm_stats_foreach() names live only during the callback: they are copied. */
#define STAT_NAME_MAX 64

typedef struct stats_collect {
        char (*name_buf)[STAT_NAME_MAX];
        Gpumem__StatEntry *entries;
        Gpumem__StatEntry **ptrs;
        size_t n, cap;
        char **names; /* filter */
        size_t n_names;
} stats_collect_t;

static void collect_stat(const char *name, int64_t value, void *userdata) {
        stats_collect_t *c = userdata;
        if (c->n_names) {
                bool wanted = false;
                for (size_t i = 0; i < c->n_names && !wanted; i++)
                        wanted = strcmp(c->names[i], name) == 0;
                if (!wanted)
                        return;
        }
        if (c->n == c->cap)
                return;
        gpumem__stat_entry__init(&c->entries[c->n]);
        snprintf(c->name_buf[c->n], STAT_NAME_MAX, "%s", name);
        c->entries[c->n].name = c->name_buf[c->n];
        c->entries[c->n].value = value;
        c->ptrs[c->n] = &c->entries[c->n];
        c->n++;
}

static void stats_add(gm_stats_t *sum, const gm_stats_t *add);

int gm_admin_stats(gm_session_t *s, uint64_t request_id, const Gpumem__Stats *req) {
        gm_daemon_t *d = s->daemon;
        gm_stats_t scratch;
        const gm_stats_t *st = NULL;
        uint64_t sessions = 0;
        gm_local_refresh(d);
        switch (req->scope) {
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_SESSION:
                if (gm_session_stats(s)) {
                        st = gm_session_stats(s);
                } else {
                        gm_stats_init(&scratch);
                        scratch.max_split_size = d->device_stats.max_split_size;
                        st = &scratch;
                }
                sessions = 1;
                break;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE:
                if (!s->admin)
                        return gm_session_send_error(s, request_id, EPERM,
                                                     "gpumemd: device-wide statistics need admin rights; "
                                                     "ask for your tenant ('%s')", s->tenant->name),
                               0;
                st = &d->device_stats;
                sessions = d->n_sessions;
                break;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT: {
                const char *name = req->tenant && req->tenant[0] ? req->tenant : s->tenant->name;
                if (!s->admin && strcmp(name, s->tenant->name) != 0)
                        return gm_session_send_error(s, request_id, EPERM,
                                                     "gpumemd: statistics of tenant '%s' need admin rights", name),
                               0;
                gm_tenant_t *t = gm_tenant_find(d, name);
                if (!t)
                        return gm_session_send_error(s, request_id, ENOENT, "gpumemd: no tenant '%s'", name), 0;
                st = &t->stats;
                sessions = t->sessions;
                break;
        }
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_PID:
                gm_stats_init(&scratch);
                scratch.max_split_size = d->device_stats.max_split_size;
                for (gm_session_t *o = d->sessions; o; o = o->next) {
                        if ((uint32_t) o->cred.pid != req->pid || !gm_session_stats(o))
                                continue;
                        if (!s->admin && o->tenant != s->tenant)
                                return gm_session_send_error(s, request_id, EPERM,
                                                             "gpumemd: pid %u belongs to another tenant", req->pid),
                                       0;
                        stats_add(&scratch, gm_session_stats(o));
                        sessions++;
                }
                st = &scratch;
                break;
        default:
                return gm_session_send_error(s, request_id, EINVAL, "gpumemd: unknown statistics scope"), 0;
        }
        enum { MAX_STATS = 160 };
        static char names[MAX_STATS][STAT_NAME_MAX];
        Gpumem__StatEntry entries[MAX_STATS];
        Gpumem__StatEntry *ptrs[MAX_STATS];
        stats_collect_t c = {
                .name_buf = names, .entries = entries, .ptrs = ptrs, .cap = MAX_STATS, .names = req->names, .n_names = req->n_names};
        gm_stats_foreach(st, collect_stat, &c);
        Gpumem__StatsReply reply = GPUMEM__STATS_REPLY__INIT;
        reply.n_stats = c.n;
        reply.stats = ptrs;
        reply.device = d->backend->device;
        reply.capacity = d->backend->capacity;
        reply.sessions = sessions;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_STATS_REPLY;
        env.stats_reply = &reply;
        gm_session_reply(s, request_id, &env, NULL, 0);
        return 0;
}

/* Sums statistics of several sessions (currents, accumulations and counters
 * add up; a sum of peaks is an upper bound of the joint peak). */
static void stats_add_one(gm_stat_t *a, const gm_stat_t *b) {
        a->current += b->current;
        a->peak += b->peak;
        a->allocated += b->allocated;
        a->freed += b->freed;
}

static void stats_add(gm_stats_t *sum, const gm_stats_t *add) {
        for (int t = 0; t < _GM_STAT_TYPE_MAX; t++) {
                stats_add_one(&sum->allocation[t], &add->allocation[t]);
                stats_add_one(&sum->segment[t], &add->segment[t]);
                stats_add_one(&sum->active[t], &add->active[t]);
                stats_add_one(&sum->inactive_split[t], &add->inactive_split[t]);
                stats_add_one(&sum->allocated_bytes[t], &add->allocated_bytes[t]);
                stats_add_one(&sum->reserved_bytes[t], &add->reserved_bytes[t]);
                stats_add_one(&sum->active_bytes[t], &add->active_bytes[t]);
                stats_add_one(&sum->inactive_split_bytes[t], &add->inactive_split_bytes[t]);
                stats_add_one(&sum->requested_bytes[t], &add->requested_bytes[t]);
        }
        stats_add_one(&sum->oversize_allocations, &add->oversize_allocations);
        stats_add_one(&sum->oversize_segments, &add->oversize_segments);
        sum->num_alloc_retries += add->num_alloc_retries;
        sum->num_ooms += add->num_ooms;
        sum->num_sync_all_streams += add->num_sync_all_streams;
        sum->num_device_alloc += add->num_device_alloc;
        sum->num_device_free += add->num_device_free;
}

int gm_admin_reset_stats(gm_session_t *s, uint64_t request_id, const Gpumem__ResetStats *req) {
        gm_daemon_t *d = s->daemon;
        gm_stats_t *st = NULL;
        switch (req->scope) {
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_SESSION:
                if (s->heap)
                        st = gm_heap_stats_mut(s->heap);
                break;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE:
                if (!s->admin)
                        return refuse_not_admin(s, request_id, "resetting device statistics");
                st = &d->device_stats;
                break;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT: {
                if (!s->admin)
                        return refuse_not_admin(s, request_id, "resetting tenant statistics");
                gm_tenant_t *t = gm_tenant_find(d, req->tenant ? req->tenant : "");
                if (!t)
                        return gm_session_send_error(s, request_id, ENOENT, "gpumemd: no tenant '%s'", req->tenant), 0;
                st = &t->stats;
                break;
        }
        default:
                return gm_session_send_error(s, request_id, EINVAL, "gpumemd: cannot reset statistics of that scope"),
                       0;
        }
        if (st && req->peak)
                gm_stats_reset_peak(st);
        if (st && req->accumulated)
                gm_stats_reset_accumulated(st);
        return gm_session_reply_ok(s, request_id);
}

/* ---- memory history ---- */

#define HISTORY_DEFAULT_ENTRIES 100000
#define HISTORY_FRAME_BYTES (64u << 20) /* interned frame text, all entries together */

int gm_admin_history(gm_session_t *s, uint64_t request_id, const Gpumem__HistoryControl *req) {
        gm_daemon_t *d = s->daemon;
        if (!s->admin)
                return refuse_not_admin(s, request_id, "controlling memory history");
        if (req->max_entries > 100000000)
                return gm_session_send_error(s, request_id, EINVAL, "gpumemd: at most 100000000 history entries"), 0;
        if (req->max_entries)
                d->history_max_entries = req->max_entries;
        if (!d->history_max_entries)
                d->history_max_entries = HISTORY_DEFAULT_ENTRIES;
        int r = 0;
        if (!req->enabled) {
                d->history = gm_history_free(d->history); /* as PyTorch: disabling clears it */
        } else if (!d->history) {
                r = gm_history_new(d->history_max_entries, HISTORY_FRAME_BYTES, &d->history);
        } else {
                r = gm_history_set_max(d->history, d->history_max_entries);
        }
        if (r < 0)
                return gm_session_send_error(s, request_id, r, "gpumemd: cannot set up memory history: %s",
                                             strerror(-r)),
                       0;
        log_info("memory history %s (max %zu entries) by pid %d", d->history ? "on" : "off", d->history_max_entries,
                 (int) s->cred.pid);
        Gpumem__HistoryReply reply = GPUMEM__HISTORY_REPLY__INIT;
        reply.enabled = d->history != NULL;
        reply.max_entries = d->history_max_entries;
        reply.entries = d->history ? gm_history_len(d->history) : 0;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_HISTORY_REPLY;
        env.history_reply = &reply;
        gm_session_reply(s, request_id, &env, NULL, 0);
        return 0;
}

/* ---- snapshots ---- */

/* Puts `len` bytes into a sealed, read-only memfd the client can read. */
static int bytes_to_memfd(const char *buf, size_t len, int *ret_fd) {
        int fd = memfd_create("gpumem-snapshot", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        size_t done = 0;
        while (done < len) {
                ssize_t n = write(fd, buf + done, len - done);
                if (n < 0) {
                        int r = -errno;
                        close(fd);
                        return r;
                }
                done += (size_t) n;
        }
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0 ||
            lseek(fd, 0, SEEK_SET) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

int gm_admin_snapshot(gm_session_t *s, uint64_t request_id, const Gpumem__Snapshot *req) {
        gm_daemon_t *d = s->daemon;
        gm_snapshot_heap_t *heaps = calloc(d->n_sessions + 1, sizeof(*heaps));
        if (!heaps)
                return gm_session_send_error(s, request_id, ENOMEM, "out of memory"), 0;
        size_t n = 0;
        bool everything = true;
        for (gm_session_t *o = d->sessions; o; o = o->next) {
                if (o->closing || !o->heap)
                        continue;
                if ((!s->admin && o->tenant != s->tenant) || (req->pid && (uint32_t) o->cred.pid != req->pid)) {
                        everything = false;
                        continue;
                }
                heaps[n++] = (gm_snapshot_heap_t){
                        .heap = o->heap, .pid = (uint32_t) o->cred.pid, .tenant = o->tenant->name, .session_id = o->id};
        }
        gm_snapshot_source_t src = {
                .device = d->backend->device,
                .heaps = heaps,
                .n_heaps = n,
                .history = d->history,
                .only_heap_pids = !everything,
                .config = &d->alloc_config,
        };
        gm_snapshot_format_t fmt = req->format == GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_JSON ? GM_SNAPSHOT_JSON
                                                                                               : GM_SNAPSHOT_PICKLE;
        char *buf = NULL;
        size_t len = 0;
        int fd = -1;
        int r = gm_snapshot_write(&src, fmt, &buf, &len);
        free(heaps);
        if (r == 0)
                r = bytes_to_memfd(buf, len, &fd);
        free(buf);
        if (r < 0)
                return gm_session_send_error(s, request_id, r, "gpumemd: snapshot failed: %s", strerror(-r)), 0;
        Gpumem__SnapshotReply reply = GPUMEM__SNAPSHOT_REPLY__INIT;
        reply.format = req->format;
        reply.size = len;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_SNAPSHOT_REPLY;
        env.snapshot_reply = &reply;
        gm_session_reply(s, request_id, &env, &fd, 1);
        close(fd);
        return 0;
}

/* ---- allocator settings at run time ---- */

int gm_admin_alloc_conf(gm_session_t *s, uint64_t request_id, const Gpumem__AllocConf *req) {
        gm_daemon_t *d = s->daemon;
        if (req->set) {
                if (!s->admin)
                        return refuse_not_admin(s, request_id, "changing allocator settings");
                gm_alloc_config_t cfg;
                char err[256] = "";
                int r = gm_alloc_config_parse(req->conf, &cfg, err, sizeof(err));
                if (r < 0)
                        return gm_session_send_error(s, request_id, EINVAL, "gpumemd: invalid alloc_conf '%s': %s",
                                                     req->conf ? req->conf : "", err),
                               0;
                d->alloc_config = cfg;
                int64_t mss = cfg.max_split_size == UINT64_MAX ? -1 : (int64_t) cfg.max_split_size;
                d->device_stats.max_split_size = mss;
                for (gm_tenant_t *t = d->tenants; t; t = t->next)
                        t->stats.max_split_size = mss;
                for (gm_session_t *o = d->sessions; o; o = o->next)
                        if (o->heap)
                                gm_heap_set_config(o->heap, &cfg);
                log_notice("allocator settings changed by pid %d: '%s'", (int) s->cred.pid, cfg.raw);
        }
        Gpumem__AllocConfReply reply = GPUMEM__ALLOC_CONF_REPLY__INIT;
        reply.conf = d->alloc_config.raw;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_CONF_REPLY;
        env.alloc_conf_reply = &reply;
        gm_session_reply(s, request_id, &env, NULL, 0);
        return 0;
}

/* ---- quotas and clients ---- */

static void tenant_info(const gm_tenant_t *t, Gpumem__TenantInfo *info) {
        gpumem__tenant_info__init(info);
        info->tenant = (char *) t->name;
        info->quota = t->quota;
        info->quota_source = (char *) gm_quota_source_name(t);
        info->charged = t->charged_bytes;
        info->allocated = (uint64_t) t->stats.allocated_bytes[GM_STAT_ALL].current;
        int64_t cached = t->stats.reserved_bytes[GM_STAT_ALL].current - t->stats.active_bytes[GM_STAT_ALL].current;
        info->cached = cached > 0 ? (uint64_t) cached : 0;
        info->sessions = t->sessions;
}

/* Most tenants the daemon creates on request (quota set for tenants with no
 * session yet); tenants from sessions and the config are not limited here. */
#define MAX_TENANTS 4096

int gm_admin_quota(gm_session_t *s, uint64_t request_id, const Gpumem__Quota *req) {
        gm_daemon_t *d = s->daemon;
        const char *name = req->tenant && req->tenant[0] ? req->tenant : s->tenant->name;
        if (req->op == GPUMEM__QUOTA_OP__QUOTA_OP_SET) {
                if (!s->admin)
                        return refuse_not_admin(s, request_id, "setting quotas");
                if (!gm_tenant_name_valid(name)) /* what the config accepts, nothing else */
                        return gm_session_send_error(s, request_id, EINVAL, "gpumemd: invalid tenant name"), 0;
                size_t n_tenants = 0;
                for (gm_tenant_t *t = d->tenants; t; t = t->next)
                        n_tenants++;
                gm_tenant_t *t = gm_tenant_find(d, name);
                if (!t && n_tenants >= MAX_TENANTS)
                        return gm_session_send_error(s, request_id, ENOSPC, "gpumemd: too many tenants"), 0;
                if (!t && !(t = gm_tenant_get(d, name)))
                        return gm_session_send_error(s, request_id, ENOMEM, "out of memory"), 0;
                gm_quota_source_t source = req->runtime ? GM_QUOTA_RUNTIME : GM_QUOTA_PERSISTENT;
                bool had = t->quota_set[source];
                uint64_t old = t->quota_by_source[source];
                gm_tenant_set_quota(t, source, req->bytes != 0, req->bytes);
                if (req->runtime)
                        gm_ledger_runtime_quota(d, t->name, req->bytes);
                if (!req->runtime) {
                        int r = gm_quotas_save(d);
                        if (r < 0) {
                                gm_tenant_set_quota(t, source, had, old);
                                return gm_session_send_error(s, request_id, r,
                                                             "gpumemd: cannot save the quota in '%s': %s",
                                                             d->opts.state_dir ? d->opts.state_dir : "(no state "
                                                                                                     "directory)",
                                                             strerror(-r)),
                                       0;
                        }
                }
                log_notice("quota of tenant '%s' set to %llu bytes (%s) by pid %d", t->name,
                           (unsigned long long) req->bytes, req->runtime ? "runtime" : "persistent",
                           (int) s->cred.pid);
        }
        gm_local_refresh(d);
        size_t n = 0;
        for (gm_tenant_t *t = d->tenants; t; t = t->next)
                n++;
        Gpumem__TenantInfo *infos = calloc(n ? n : 1, sizeof(*infos));
        Gpumem__TenantInfo **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
        if (!infos || !ptrs) {
                free(infos);
                free(ptrs);
                return gm_session_send_error(s, request_id, ENOMEM, "out of memory"), 0;
        }
        size_t k = 0;
        bool list = req->op == GPUMEM__QUOTA_OP__QUOTA_OP_LIST;
        for (gm_tenant_t *t = d->tenants; t; t = t->next) {
                if (!list && strcmp(t->name, name) != 0)
                        continue;
                if (!s->admin && t != s->tenant)
                        continue; /* a tenant sees its own figures only */
                tenant_info(t, &infos[k]);
                ptrs[k] = &infos[k];
                k++;
        }
        if (!list && k == 0) {
                free(infos);
                free(ptrs);
                return gm_session_send_error(s, request_id, s->admin ? ENOENT : EPERM,
                                             s->admin ? "gpumemd: no tenant '%s'"
                                                      : "gpumemd: tenant '%s' is not yours to see",
                                             name),
                       0;
        }
        Gpumem__QuotaReply reply = GPUMEM__QUOTA_REPLY__INIT;
        reply.n_tenants = k;
        reply.tenants = ptrs;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_QUOTA_REPLY;
        env.quota_reply = &reply;
        gm_session_reply(s, request_id, &env, NULL, 0);
        free(infos);
        free(ptrs);
        return 0;
}

int gm_admin_clients(gm_session_t *s, uint64_t request_id, const Gpumem__Clients *req) {
        gm_daemon_t *d = s->daemon;
        Gpumem__ClientInfo *infos = calloc(d->n_sessions + 1, sizeof(*infos));
        Gpumem__ClientInfo **ptrs = calloc(d->n_sessions + 1, sizeof(*ptrs));
        if (!infos || !ptrs) {
                free(infos);
                free(ptrs);
                return gm_session_send_error(s, request_id, ENOMEM, "out of memory"), 0;
        }
        size_t k = 0;
        gm_local_refresh(d);
        for (gm_session_t *o = d->sessions; o && k <= d->n_sessions; o = o->next) {
                if (o->closing || !o->hello_done || (!s->admin && o->tenant != s->tenant))
                        continue;
                Gpumem__ClientInfo *ci = &infos[k];
                gpumem__client_info__init(ci);
                ci->session_id = o->id;
                ci->pid = (uint32_t) o->cred.pid;
                ci->uid = (uint32_t) o->cred.uid;
                ci->tenant = o->tenant->name;
                ci->unit = o->unit;
                ci->name = o->name;
                ci->admin = o->admin_conn;
                ci->releasing = o->releasing_bytes;
                ci->heap_mode = o->local ? "local" : "central";
                ci->requests = o->requests;
                ci->stats_page_invalid = gm_local_page_invalid(o);
                const gm_stats_t *st = gm_session_stats(o);
                if (st) {
                        ci->reserved = (uint64_t) st->reserved_bytes[GM_STAT_ALL].current;
                        ci->allocated = (uint64_t) st->allocated_bytes[GM_STAT_ALL].current;
                        ci->cached = (uint64_t) (st->reserved_bytes[GM_STAT_ALL].current -
                                                 st->active_bytes[GM_STAT_ALL].current);
                        ci->segments = (uint64_t) st->segment[GM_STAT_ALL].current;
                }
                ptrs[k] = ci;
                k++;
        }
        Gpumem__ClientsReply reply = GPUMEM__CLIENTS_REPLY__INIT;
        reply.n_clients = k;
        reply.clients = ptrs;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_CLIENTS_REPLY;
        env.clients_reply = &reply;
        gm_session_reply(s, request_id, &env, NULL, 0);
        free(infos);
        free(ptrs);
        return 0;
}
