/* The Prometheus endpoint. libmicrohttpd runs in external-polling epoll mode:
 * the daemon's loop watches MHD's epoll fd and our listening socket with
 * uv_poll_t and MHD's timeout with a uv_timer_t, so requests are parsed and
 * answered on the loop thread, between client requests, without locks. We
 * accept connections ourselves and hand them over with MHD_add_connection(),
 * which enforces the connection limits by closing what does not fit. */
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ipc.h"
#include "http_guard.h"
#include "log.h"

#ifndef GPUMEMD_VERSION
#define GPUMEMD_VERSION "unknown"
#endif

#define METRICS_PORT_BASE 9470
#define HTTP_CONNECTION_LIMIT GM_HTTP_CONNECTIONS /* and per peer: http_guard.h */
#define HTTP_IDLE_TIMEOUT_S 10u
#define HTTP_MEMORY_LIMIT (16u * 1024u) /* per connection: request line and headers */
#define ACCEPTS_PER_WAKEUP 16

/* Refusal counters are kept per tenant name; past this many names they are
 * counted under tenant="other" (which always has room). REFUSAL_SLOTS is a
 * power of two, at least twice the entries. */
#define REFUSAL_TENANTS_MAX 1024
#define REFUSAL_SLOTS 2048

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Upper bounds of the latency histogram: 5 us to 2.5 s (+Inf implied). */
static const struct {
        uint64_t ns;
        const char *le; /* the label pair, as rendered */
} buckets[] = {
        {5000, ",le=\"5e-06\""},    {10000, ",le=\"1e-05\""},   {25000, ",le=\"2.5e-05\""},
        {50000, ",le=\"5e-05\""},   {100000, ",le=\"0.0001\""}, {250000, ",le=\"0.00025\""},
        {500000, ",le=\"0.0005\""}, {1000000, ",le=\"0.001\""}, {2500000, ",le=\"0.0025\""},
        {5000000, ",le=\"0.005\""}, {10000000, ",le=\"0.01\""}, {25000000, ",le=\"0.025\""},
        {50000000, ",le=\"0.05\""}, {100000000, ",le=\"0.1\""}, {250000000, ",le=\"0.25\""},
        {500000000, ",le=\"0.5\""}, {1000000000, ",le=\"1\""},  {2500000000, ",le=\"2.5\""},
};
#define N_BUCKETS (sizeof(buckets) / sizeof(buckets[0]))

static const char *const reason_names[_GM_OOM_REASON_MAX] = {
        [GM_OOM_QUOTA] = "quota",     [GM_OOM_FRAGMENTATION] = "fragmentation", [GM_OOM_DEVICE_FULL] = "device",
        [GM_OOM_RECLAIM] = "reclaim", [GM_OOM_EXTERNAL] = "external",
};

const char *gm_metrics_reason_name(gm_oom_reason_t reason) {
        return (unsigned) reason < _GM_OOM_REASON_MAX ? reason_names[reason] : "unknown";
}

static const char *const outcome_names[_GM_RECLAIM_OUTCOME_MAX] = {
        [GM_RECLAIM_REQUESTED] = "requested",
        [GM_RECLAIM_ACKNOWLEDGED] = "acknowledged",
        [GM_RECLAIM_TIMED_OUT] = "timed_out",
};

typedef struct refusal_entry {
        char tenant[64];
        uint64_t count[_GM_OOM_REASON_MAX];
} refusal_entry_t;

typedef struct histogram {
        uint64_t bucket[N_BUCKETS + 1]; /* per bucket, not cumulative; the last is +Inf */
        uint64_t count;
        uint64_t sum_ns;
} histogram_t;

enum { HANDLE_LISTENER = 1, HANDLE_EVENTS = 2, HANDLE_TIMER = 4 };

struct gm_metrics {
        gm_metrics_source_t src;
        struct MHD_Daemon *mhd;
        int listen_fd;
        uv_poll_t listener; /* our listening socket */
        uv_poll_t events;   /* MHD's epoll fd */
        uv_timer_t timer;   /* MHD's next timeout */
        unsigned handles;   /* HANDLE_* bits: initialised, not yet closing */
        unsigned closing;   /* close callbacks still to come; m is freed after the last */
        char unix_path[sizeof(((struct sockaddr_un *) 0)->sun_path)]; /* removed at stop; "" for TCP */
        double start_time;                                            /* process start, seconds since the epoch */
        gm_http_guard_t guard;                                        /* connections per peer */

        histogram_t requests[GM_METRICS_MAX_OPS];
        histogram_t reclaim_wait; /* parked allocations, from park to answer */
        uint64_t reclaims[_GM_RECLAIM_OUTCOME_MAX];
        uint64_t notify_queued, notify_dropped, notify_stuck_ms; /* the service manager's backlog */
        refusal_entry_t *refusals;                               /* REFUSAL_TENANTS_MAX entries, n_refusals used */
        uint32_t n_refusals;
        uint16_t refusal_slots[REFUSAL_SLOTS]; /* index + 1 into refusals; 0 = empty */
};

/* ---- counters ---- */

static void histogram_observe(histogram_t *h, uint64_t ns) {
        size_t i = 0;
        while (i < N_BUCKETS && ns > buckets[i].ns)
                i++;
        h->bucket[i]++;
        h->count++;
        h->sum_ns += ns;
}

void gm_metrics_observe_request(gm_metrics_t *m, unsigned op, uint64_t ns) {
        if (m && op < m->src.n_ops)
                histogram_observe(&m->requests[op], ns);
}

void gm_metrics_observe_reclaim_wait(gm_metrics_t *m, uint64_t ns) {
        if (m)
                histogram_observe(&m->reclaim_wait, ns);
}

void gm_metrics_set_notify_backlog(gm_metrics_t *m, uint64_t queued, uint64_t dropped, uint64_t stuck_ms) {
        if (!m)
                return;
        m->notify_queued = queued;
        m->notify_dropped = dropped;
        m->notify_stuck_ms = stuck_ms;
}

void gm_metrics_count_reclaim(gm_metrics_t *m, gm_reclaim_outcome_t outcome) {
        if (m && outcome >= 0 && outcome < _GM_RECLAIM_OUTCOME_MAX)
                m->reclaims[outcome]++;
}

static uint32_t name_hash(const char *s) {
        uint32_t h = 2166136261u; /* FNV-1a */
        for (; *s; s++)
                h = (h ^ (uint8_t) *s) * 16777619u;
        return h;
}

/* Returns the entry of `tenant`, or NULL when it has none (no refusal yet). */
static const refusal_entry_t *refusal_find(const gm_metrics_t *m, const char *tenant) {
        for (uint32_t i = name_hash(tenant);; i++) {
                uint16_t slot = m->refusal_slots[i & (REFUSAL_SLOTS - 1)];
                if (slot == 0)
                        return NULL;
                if (strcmp(m->refusals[slot - 1].tenant, tenant) == 0)
                        return &m->refusals[slot - 1];
        }
}

/* The entry of `tenant`, created on first use; when the table is full, the
 * entry of "other". */
static refusal_entry_t *refusal_get(gm_metrics_t *m, const char *tenant) {
        bool is_other = strcmp(tenant, "other") == 0;
        for (uint32_t i = name_hash(tenant);; i++) {
                uint16_t *slot = &m->refusal_slots[i & (REFUSAL_SLOTS - 1)];
                if (*slot && strcmp(m->refusals[*slot - 1].tenant, tenant) == 0)
                        return &m->refusals[*slot - 1];
                if (*slot)
                        continue;
                /* The last entry is kept for "other". */
                if (m->n_refusals + !is_other >= REFUSAL_TENANTS_MAX)
                        return refusal_get(m, "other");
                refusal_entry_t *e = &m->refusals[m->n_refusals++];
                snprintf(e->tenant, sizeof(e->tenant), "%s", tenant);
                *slot = (uint16_t) m->n_refusals;
                return e;
        }
}

void gm_metrics_count_refusal(gm_metrics_t *m, const char *tenant, gm_oom_reason_t reason) {
        if (m && reason >= 0 && reason < _GM_OOM_REASON_MAX)
                refusal_get(m, tenant ? tenant : "other")->count[reason]++;
}

/* ---- the exposition text ---- */

/* A growing text buffer; after a failed allocation every append is a no-op. */
typedef struct out {
        char *p;
        size_t len, cap;
        bool failed;
} out_t;

static bool out_reserve(out_t *o, size_t n) {
        if (o->failed)
                return false;
        if (o->cap - o->len > n)
                return true;
        size_t cap = o->cap * 2 > o->len + n + 1 ? o->cap * 2 : o->len + n + 1;
        char *p = realloc(o->p, cap);
        if (!p) {
                o->failed = true;
                return false;
        }
        o->p = p;
        o->cap = cap;
        return true;
}

static void out_mem(out_t *o, const char *s, size_t n) {
        if (out_reserve(o, n)) {
                memcpy(o->p + o->len, s, n);
                o->len += n;
        }
}

static void out_str(out_t *o, const char *s) {
        out_mem(o, s, strlen(s));
}

static void out_u64(out_t *o, uint64_t v) {
        char buf[24];
        size_t i = sizeof(buf);
        do
                buf[--i] = (char) ('0' + v % 10);
        while (v /= 10);
        out_mem(o, buf + i, sizeof(buf) - i);
}

static void out_i64(out_t *o, int64_t v) {
        if (v < 0) {
                out_str(o, "-");
                out_u64(o, (uint64_t) 0 - (uint64_t) v);
        } else {
                out_u64(o, (uint64_t) v);
        }
}

static void out_printf(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(out_t *o, const char *fmt, ...) {
        char buf[256];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t) n >= sizeof(buf))
                o->failed = true; /* only short lines are formatted this way */
        else
                out_mem(o, buf, (size_t) n);
}

static void family(out_t *o, const char *name, const char *type, const char *help) {
        out_str(o, "# HELP ");
        out_str(o, name);
        out_str(o, " ");
        out_str(o, help);
        out_str(o, "\n# TYPE ");
        out_str(o, name);
        out_str(o, " ");
        out_str(o, type);
        out_str(o, "\n");
}

/* One sample: name, then `labels` (an opening '{' and label pairs, no closing
 * brace), then `more` (further pairs, each starting with ','), then the value. */
static void sample(out_t *o, const char *name, const char *labels, const char *more, int64_t value) {
        out_str(o, name);
        out_str(o, labels);
        out_str(o, more);
        out_str(o, "} ");
        out_i64(o, value);
        out_str(o, "\n");
}

/* Appends a label value with \, " and newline escaped as the text format requires. */
static void escape_label(const char *in, char *out, size_t len) {
        size_t j = 0;
        for (; *in && j + 2 < len; in++) {
                if (*in == '\\' || *in == '"' || *in == '\n') {
                        out[j++] = '\\';
                        out[j++] = *in == '\n' ? 'n' : *in;
                } else {
                        out[j++] = *in;
                }
        }
        out[j] = '\0';
}

/* The label set every gpumem_ series starts with: {device="N" and, when
 * known, ,UUID="<escaped: at most 2 * 55 characters>" (no closing brace). */
#define DEVICE_LABELS_MAX 160
/* ... followed by ,tenant="<escaped name: at most 2 * 63 characters>". */
#define TENANT_LABELS_MAX (DEVICE_LABELS_MAX + 160)

/* One tenant's row of a scrape: the broker's view and its label set. */
typedef struct tenant_row {
        const gm_tenant_t *tenant;
        char labels[TENANT_LABELS_MAX];
        uint64_t releasing_bytes;
        uint64_t largest_free;
        gm_metrics_tenant_extra_t extra; /* the tenant's stats (the broker's plus its local sessions') */
} tenant_row_t;

typedef enum { V_CURRENT, V_PEAK, V_ALLOCATED, V_FREED, V_PENDING_FREE } value_kind_t;

/* Families labelled {tenant, pool}: a gm_stat_t array of gm_stats_t and which of its values. */
static const struct pool_family {
        const char *name, *type, *help;
        size_t stat; /* offsetof the gm_stat_t[_GM_STAT_TYPE_MAX] array */
        value_kind_t kind;
} pool_families[] = {
        {"gpumem_reserved_bytes", "gauge", "Bytes of segments held by the tenant's sessions, cached ones included.",
         offsetof(gm_stats_t, reserved_bytes), V_CURRENT},
        {"gpumem_allocated_bytes", "gauge", "Bytes of blocks in use by clients (frees awaiting streams excluded).",
         offsetof(gm_stats_t, allocated_bytes), V_CURRENT},
        {"gpumem_active_bytes", "gauge", "Bytes of live blocks: allocated plus pending free.",
         offsetof(gm_stats_t, active_bytes), V_CURRENT},
        {"gpumem_requested_bytes", "gauge", "Bytes clients asked for in live blocks, before rounding.",
         offsetof(gm_stats_t, requested_bytes), V_CURRENT},
        {"gpumem_inactive_split_bytes", "gauge",
         "Free bytes inside split segments, which cannot be released (fragmentation).",
         offsetof(gm_stats_t, inactive_split_bytes), V_CURRENT},
        {"gpumem_pending_free_bytes", "gauge",
         "Bytes of freed blocks still waiting for their streams (active - allocated).", 0, V_PENDING_FREE},
        {"gpumem_reserved_peak_bytes", "gauge", "Peak of gpumem_reserved_bytes since the last peak reset.",
         offsetof(gm_stats_t, reserved_bytes), V_PEAK},
        {"gpumem_allocated_peak_bytes", "gauge", "Peak of gpumem_allocated_bytes since the last peak reset.",
         offsetof(gm_stats_t, allocated_bytes), V_PEAK},
        {"gpumem_active_peak_bytes", "gauge", "Peak of gpumem_active_bytes since the last peak reset.",
         offsetof(gm_stats_t, active_bytes), V_PEAK},
        {"gpumem_requested_peak_bytes", "gauge", "Peak of gpumem_requested_bytes since the last peak reset.",
         offsetof(gm_stats_t, requested_bytes), V_PEAK},
        {"gpumem_inactive_split_peak_bytes", "gauge", "Peak of gpumem_inactive_split_bytes since the last peak reset.",
         offsetof(gm_stats_t, inactive_split_bytes), V_PEAK},
        {"gpumem_segments", "gauge", "Segments held by the tenant's sessions.", offsetof(gm_stats_t, segment),
         V_CURRENT},
        {"gpumem_blocks", "gauge", "Live blocks (allocated or pending free).", offsetof(gm_stats_t, active), V_CURRENT},
        {"gpumem_allocations_total", "counter", "Blocks handed out.", offsetof(gm_stats_t, allocation), V_ALLOCATED},
        {"gpumem_frees_total", "counter", "Blocks given back.", offsetof(gm_stats_t, allocation), V_FREED},
};

static int64_t stat_value(const gm_stats_t *st, const struct pool_family *f, gm_stat_type_t pool) {
        if (f->kind == V_PENDING_FREE)
                return st->active_bytes[pool].current - st->allocated_bytes[pool].current;
        const gm_stat_t *s = (const gm_stat_t *) ((const char *) st + f->stat) + pool;
        switch (f->kind) {
        case V_PEAK:
                return s->peak;
        case V_ALLOCATED:
                return s->allocated;
        case V_FREED:
                return s->freed;
        default:
                return s->current;
        }
}

static void render_tenants(out_t *o, const gm_broker_t *b, const char *dev, const gm_metrics_t *m,
                           const tenant_row_t *rows, size_t n) {
        static const struct {
                gm_stat_type_t type;
                const char *label;
        } pools[] = {{GM_STAT_SMALL_POOL, ",pool=\"small\""}, {GM_STAT_LARGE_POOL, ",pool=\"large\""}};

        for (size_t f = 0; f < sizeof(pool_families) / sizeof(pool_families[0]); f++) {
                const struct pool_family *pf = &pool_families[f];
                family(o, pf->name, pf->type, pf->help);
                for (size_t i = 0; i < n; i++)
                        for (size_t p = 0; p < 2; p++)
                                sample(o, pf->name, rows[i].labels, pools[p].label,
                                       stat_value(&rows[i].extra.stats, pf, pools[p].type));
        }

        family(o, "gpumem_alloc_retries_total", "counter",
               "Allocations that succeeded only after freeing the session's cache.");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_alloc_retries_total", rows[i].labels, "", rows[i].extra.stats.num_alloc_retries);
        family(o, "gpumem_quota_bytes", "gauge", "The tenant's quota on charged bytes; absent when unlimited.");
        for (size_t i = 0; i < n; i++)
                if (rows[i].tenant->quota)
                        sample(o, "gpumem_quota_bytes", rows[i].labels, "", (int64_t) rows[i].tenant->quota);
        family(o, "gpumem_charged_bytes", "gauge",
               "Physical bytes charged to the tenant (its segments, releases not yet acknowledged included).");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_charged_bytes", rows[i].labels, "", (int64_t) rows[i].tenant->charged_bytes);
        family(o, "gpumem_releasing_bytes", "gauge",
               "Bytes asked back from the tenant's clients, not yet acknowledged.");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_releasing_bytes", rows[i].labels, "", (int64_t) rows[i].releasing_bytes);
        family(o, "gpumem_release_unverified_bytes", "gauge",
               "Of the charged bytes: memory the tenant's clients released that could not be checked as unmapped, "
               "charged until their sessions end.");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_release_unverified_bytes", rows[i].labels, "",
                       (int64_t) rows[i].tenant->release_unverified_bytes);
        family(o, "gpumem_tenant_release_check", "gauge",
               "How the tenant's give-backs are checked (mode: verify or trust); the value is always 1.");
        for (size_t i = 0; i < n; i++) {
                char mode[32];
                snprintf(mode, sizeof(mode), ",mode=\"%s\"",
                         gm_release_check_name(gm_tenant_release_check(b, rows[i].tenant)));
                sample(o, "gpumem_tenant_release_check", rows[i].labels, mode, 1);
        }
        family(o, "gpumem_audited_bytes", "gauge",
               "Beyond the charged bytes: memory the tenant's clients gave back and map again (the audit of their "
               "processes' driver figures), counted against its quota and the device.");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_audited_bytes", rows[i].labels, "", (int64_t) rows[i].tenant->audited_bytes);
        family(o, "gpumem_claimed_bytes", "gauge",
               "Beyond the charged bytes: the tenant's sessions' unconsumed claims (gpumem_claim), set aside for "
               "them and counted against its quota and the device for every other session.");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_claimed_bytes", rows[i].labels, "", (int64_t) rows[i].tenant->claimed_bytes);
        family(o, "gpumem_audit_catches_total", "counter",
               "Audits that found a session of the tenant mapping memory it had given back (charged as audited).");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_audit_catches_total", rows[i].labels, "", (int64_t) rows[i].tenant->audit_catches);
        family(o, "gpumem_sessions", "gauge", "Connected client sessions.");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_sessions", rows[i].labels, "", rows[i].tenant->sessions);
        family(o, "gpumem_largest_free_block_bytes", "gauge", "Largest free cached block over the tenant's sessions.");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_largest_free_block_bytes", rows[i].labels, "", (int64_t) rows[i].largest_free);
        family(o, "gpumem_local_sessions", "gauge", "Sessions whose heap runs in the client (local mode).");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_local_sessions", rows[i].labels, "", (int64_t) rows[i].extra.local_sessions);
        family(o, "gpumem_stats_page_invalid_sessions", "gauge",
               "Local sessions whose statistics page fails the daemon's bounds (their block figures count as zero).");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_stats_page_invalid_sessions", rows[i].labels, "",
                       (int64_t) rows[i].extra.invalid_pages);
        family(o, "gpumem_unresponsive_sessions", "gauge",
               "Sessions that answered no release request for unresponsive_timeout_ms: not waited for, their memory "
               "still charged.");
        for (size_t i = 0; i < n; i++)
                sample(o, "gpumem_unresponsive_sessions", rows[i].labels, "", (int64_t) rows[i].extra.unresponsive);

        if (!m)
                return;
        /* Every tenant gets all reasons (0 until refused); refusals of names
         * without a tenant row ("other") come from the table alone. */
        family(o, "gpumem_oom_refusals_total", "counter", "Allocations refused for lack of memory, by reason.");
        static const uint64_t zero[_GM_OOM_REASON_MAX];
        char labels[TENANT_LABELS_MAX], more[32];
        for (size_t i = 0; i < n; i++) {
                if (refusal_find(m, rows[i].tenant->name))
                        continue;
                for (int r = 0; r < _GM_OOM_REASON_MAX; r++) {
                        snprintf(more, sizeof(more), ",reason=\"%s\"", reason_names[r]);
                        sample(o, "gpumem_oom_refusals_total", rows[i].labels, more, (int64_t) zero[r]);
                }
        }
        for (uint32_t e = 0; e < m->n_refusals; e++) {
                const refusal_entry_t *re = &m->refusals[e];
                char label[144];
                escape_label(re->tenant, label, sizeof(label));
                snprintf(labels, sizeof(labels), "%s,tenant=\"%s\"", dev, label);
                for (int r = 0; r < _GM_OOM_REASON_MAX; r++) {
                        snprintf(more, sizeof(more), ",reason=\"%s\"", reason_names[r]);
                        sample(o, "gpumem_oom_refusals_total", labels, more, (int64_t) re->count[r]);
                }
        }
}

/* The shared registry: how many objects (staging ones included), and per
 * staged-and-published object (published or withdrawn: the name and version
 * identify it) its bytes and mappers. Cardinality: at most
 * max_shared_objects series per family (256 by default, 65536 at most). */
static void render_shared(out_t *o, const gm_broker_t *b, const char *dev, bool tenants) {
        uint64_t n = 0;
        for (const gm_shared_t *s = gm_shared_next(b, NULL); s; s = gm_shared_next(b, s))
                n++;
        family(o, "gpumem_shared_objects", "gauge",
               "Shared objects the daemon holds: staging, published and withdrawn (still mapped).");
        sample(o, "gpumem_shared_objects", dev, "", (int64_t) n);
        if (!tenants)
                return;
        /* {device, name, version, tenant}: the name escaped (at most 2 * 127 characters). */
        char labels[DEVICE_LABELS_MAX + 480], name[2 * GM_SHARED_NAME_MAX + 2], tenant[144];
        for (int pass = 0; pass < 2; pass++) {
                const char *metric = pass ? "gpumem_shared_mappers" : "gpumem_shared_bytes";
                family(o, metric, "gauge",
                       pass ? "Sessions' opens of a shared object (its mappers)."
                            : "Bytes of a shared object, charged once to its publisher's tenant.");
                for (const gm_shared_t *s = gm_shared_next(b, NULL); s; s = gm_shared_next(b, s)) {
                        gm_shared_view_t v;
                        gm_shared_view(s, &v);
                        if (v.state == GM_SHARED_STAGING) /* no version yet: counted above only */
                                continue;
                        escape_label(v.name, name, sizeof(name));
                        escape_label(v.tenant, tenant, sizeof(tenant));
                        snprintf(labels, sizeof(labels), "%s,name=\"%s\",version=\"%llu\",tenant=\"%s\"", dev, name,
                                 (unsigned long long) v.version, tenant);
                        sample(o, metric, labels, "", pass ? (int64_t) v.mappers : (int64_t) v.size);
                }
        }
}

/* One histogram's series: cumulative buckets, sum in seconds, count. */
static void render_histogram(out_t *o, const char *name, const char *labels, const histogram_t *h) {
        char series[96], sum[32];
        uint64_t cumulative = 0;
        snprintf(series, sizeof(series), "%s_bucket", name);
        for (size_t b = 0; b < N_BUCKETS; b++) {
                cumulative += h->bucket[b];
                sample(o, series, labels, buckets[b].le, (int64_t) cumulative);
        }
        sample(o, series, labels, ",le=\"+Inf\"", (int64_t) h->count);
        snprintf(sum, sizeof(sum), "} %.9f\n", (double) h->sum_ns / 1e9);
        out_str(o, name);
        out_str(o, "_sum");
        out_str(o, labels);
        out_str(o, sum);
        snprintf(series, sizeof(series), "%s_count", name);
        sample(o, series, labels, "", (int64_t) h->count);
}

static void render_counters(out_t *o, const char *dev, const gm_metrics_t *m) {
        char more[48];
        family(o, "gpumem_reclaim_requests_total", "counter",
               "Requests to clients to give back cached memory, by outcome.");
        for (int i = 0; i < _GM_RECLAIM_OUTCOME_MAX; i++) {
                snprintf(more, sizeof(more), ",outcome=\"%s\"", outcome_names[i]);
                sample(o, "gpumem_reclaim_requests_total", dev, more, (int64_t) m->reclaims[i]);
        }
        family(o, "gpumem_request_duration_seconds", "histogram",
               "Time the daemon spent serving a request, by operation.");
        for (size_t op = 0; op < m->src.n_ops; op++) {
                char labels[DEVICE_LABELS_MAX + 64];
                snprintf(labels, sizeof(labels), "%s,op=\"%s\"", dev, m->src.op_names[op]);
                render_histogram(o, "gpumem_request_duration_seconds", labels, &m->requests[op]);
        }
        family(o, "gpumem_reclaim_wait_seconds", "histogram",
               "Time parked allocations waited for reclaimed memory before they were served or refused.");
        render_histogram(o, "gpumem_reclaim_wait_seconds", dev, &m->reclaim_wait);
        family(o, "gpumem_notify_queued", "gauge",
               "Notifications (fd store, status) the service manager has not read yet, queued by the daemon.");
        sample(o, "gpumem_notify_queued", dev, "", (int64_t) m->notify_queued);
        family(o, "gpumem_notify_dropped_total", "counter",
               "Notifications dropped: the queue for a service manager that does not read was full.");
        sample(o, "gpumem_notify_dropped_total", dev, "", (int64_t) m->notify_dropped);
        family(o, "gpumem_notify_stuck_seconds", "gauge",
               "How long the oldest queued notification has waited for the service manager (0: none waits).");
        sample(o, "gpumem_notify_stuck_seconds", dev, "", (int64_t) (m->notify_stuck_ms / 1000u));
        const gm_snapshot_counters_t *sc = m->src.snapshots;
        if (!sc)
                return;
        family(o, "gpumem_snapshots_total", "counter", "Memory snapshots sent to clients.");
        sample(o, "gpumem_snapshots_total", dev, "", (int64_t) sc->sent);
        family(o, "gpumem_snapshot_bytes_total", "counter", "Bytes of the memory snapshots sent.");
        sample(o, "gpumem_snapshot_bytes_total", dev, "", (int64_t) sc->bytes);
        family(o, "gpumem_snapshots_refused_total", "counter",
               "Snapshots refused: over a non-admin's size limits, or too many under way.");
        sample(o, "gpumem_snapshots_refused_total", dev, "", (int64_t) sc->refused);
        family(o, "gpumem_snapshot_local_sessions_total", "counter",
               "Local sessions asked for their blocks by a snapshot, by outcome (unanswered and invalid "
               "ones appear with their segments only).");
        const struct {
                const char *outcome;
                uint64_t n;
        } outcomes[] = {{"answered", sc->answered}, {"unanswered", sc->unanswered}, {"invalid", sc->invalid}};
        for (size_t i = 0; i < sizeof(outcomes) / sizeof(outcomes[0]); i++) {
                snprintf(more, sizeof(more), ",outcome=\"%s\"", outcomes[i].outcome);
                sample(o, "gpumem_snapshot_local_sessions_total", dev, more, (int64_t) outcomes[i].n);
        }
}

/* The fields of /proc/self/stat the process_* metrics use. */
typedef struct self_stat {
        unsigned long long utime, stime; /* clock ticks */
        unsigned long long start_ticks;  /* since boot */
        unsigned long long vsize;        /* bytes */
        long long rss;                   /* pages */
} self_stat_t;

/* Reads /proc/self/stat: after "pid (comm)" come field 3 (state) onwards;
 * utime is 14, stime 15, starttime 22, vsize 23, rss 24. 0 or -EIO. */
static int read_self_stat(self_stat_t *ret) {
        char buf[1024];
        int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -EIO;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        buf[n > 0 ? n : 0] = '\0';
        const char *p = strrchr(buf, ')');
        self_stat_t st;
        if (!p || sscanf(p + 2,
                         "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu %llu %lld",
                         &st.utime, &st.stime, &st.start_ticks, &st.vsize, &st.rss) != 5)
                return -EIO;
        *ret = st;
        return 0;
}

/* Seconds since the epoch at which this process started, from /proc. */
static double process_start_time(void) {
        double btime = 0;
        char line[256];
        FILE *f = fopen("/proc/stat", "re");
        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "btime %lf", &btime) == 1)
                        break;
        fclose(f);
        self_stat_t st;
        if (read_self_stat(&st) < 0)
                return 0;
        return btime + (double) st.start_ticks / (double) sysconf(_SC_CLK_TCK);
}

/* Open fds of this process, -1 if unknown. Every segment piece is an fd, so
 * there may be tens of thousands, and listing /proc/self/fd costs about 1 us
 * each. Linux >= 6.2 reports the count as the directory's st_size; older
 * kernels get one poll() over the fd table (a closed slot is POLLNVAL), about
 * 20 ns a slot. */
static long count_open_fds(void) {
        struct stat st;
        if (stat("/proc/self/fd", &st) == 0 && st.st_size > 0)
                return (long) st.st_size;
        char line[128];
        long table = 0;
        FILE *f = fopen("/proc/self/status", "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "FDSize: %ld", &table) == 1)
                        break;
        fclose(f);
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && (rlim_t) table > rl.rlim_cur)
                table = (long) rl.rlim_cur; /* poll() takes no more */
        struct pollfd *p = table > 0 ? malloc((size_t) table * sizeof(*p)) : NULL;
        if (!p)
                return -1;
        for (long i = 0; i < table; i++)
                p[i] = (struct pollfd){.fd = (int) i};
        long n = -1;
        if (poll(p, (nfds_t) table, 0) >= 0) {
                n = 0;
                for (long i = 0; i < table; i++)
                        n += !(p[i].revents & POLLNVAL);
        }
        free(p);
        return n;
}

/* The conventional process_* metrics of the daemon itself, from /proc/self. */
static void render_process(out_t *o, const gm_metrics_t *m) {
        self_stat_t st = {0};
        read_self_stat(&st); /* zeros when /proc is not there */
        long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
        family(o, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
        out_printf(o, "process_cpu_seconds_total %.2f\n", (double) (st.utime + st.stime) / (double) tck);
        family(o, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        out_printf(o, "process_resident_memory_bytes %lld\n", st.rss * page);
        family(o, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
        out_printf(o, "process_virtual_memory_bytes %llu\n", st.vsize);
        family(o, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.");
        out_printf(o, "process_start_time_seconds %.2f\n", m ? m->start_time : process_start_time());

        long fds = count_open_fds();
        if (fds >= 0) {
                family(o, "process_open_fds", "gauge", "Number of open file descriptors.");
                out_printf(o, "process_open_fds %ld\n", fds);
        }
        struct rlimit rl = {0};
        getrlimit(RLIMIT_NOFILE, &rl);
        family(o, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        out_printf(o, "process_max_fds %llu\n", (unsigned long long) rl.rlim_cur);
}

/* Whether a tenant has series: once it has had a session that did anything
 * (its statistics never go back), while it has one or holds memory (audited
 * memory too), when the configuration gives it a quota or a release check,
 * or once refused. A quota set at run time
 * for a name nobody uses creates no series. */
static bool tenant_shown(const gm_tenant_t *t, const gm_metrics_t *m) {
        const gm_stats_t *st = &t->stats;
        return t->sessions || t->charged_bytes || t->quota_set[GM_QUOTA_CONFIG] || t->release_check_set ||
               t->audited_bytes || st->segment[GM_STAT_ALL].allocated || st->allocation[GM_STAT_ALL].allocated ||
               st->num_ooms || (m && refusal_find(m, t->name));
}

int gm_metrics_render(const gm_broker_t *b, const gm_metrics_t *m, char **ret_buf, size_t *ret_len) {
        out_t o = {.cap = 64 * 1024};
        o.p = malloc(o.cap);
        gm_tenant_view_t *views = NULL;
        size_t n = 0;
        if (m && m->src.refresh)
                m->src.refresh(m->src.userdata);
        int r = gm_broker_tenant_views(b, &views, &n);
        tenant_row_t *rows = r == 0 ? calloc(n ? n : 1, sizeof(*rows)) : NULL;
        if (!o.p || !rows) {
                free(o.p);
                free(views);
                return -ENOMEM;
        }
        const gm_backend_t *backend_ = b->backend;
        /* The driver's UUID of the device (cuda), else the configured one. */
        const char *device_uuid = backend_->device_uuid[0] ? backend_->device_uuid : m ? m->src.device_uuid : NULL;
        char dev[DEVICE_LABELS_MAX], uuid[112] = "";
        if (device_uuid)
                escape_label(device_uuid, uuid, sizeof(uuid));
        snprintf(dev, sizeof(dev), "{device=\"%d\"%s%s%s", backend_->device, uuid[0] ? ",UUID=\"" : "", uuid,
                 uuid[0] ? "\"" : "");
        size_t shown = 0;
        for (size_t i = 0; i < n; i++) {
                if (!tenant_shown(views[i].tenant, m))
                        continue;
                char label[144];
                escape_label(views[i].tenant->name, label, sizeof(label));
                rows[shown] = (tenant_row_t){
                        .tenant = views[i].tenant,
                        .releasing_bytes = views[i].releasing_bytes,
                        .largest_free = views[i].largest_free,
                };
                if (m && m->src.tenant_extra)
                        m->src.tenant_extra(m->src.userdata, views[i].tenant, &rows[shown].extra);
                else
                        rows[shown].extra.stats = views[i].tenant->stats;
                snprintf(rows[shown].labels, sizeof(rows[shown].labels), "%s,tenant=\"%s\"", dev, label);
                shown++;
        }
        n = shown;
        free(views);

        char backend[64], more[128];
        escape_label(backend_->ops->name, backend, sizeof(backend));
        family(&o, "gpumem_build_info", "gauge", "Build of the running gpumemd; the value is always 1.");
        snprintf(more, sizeof(more), ",version=\"%s\",backend=\"%s\"", GPUMEMD_VERSION, backend);
        sample(&o, "gpumem_build_info", dev, more, 1);
        family(&o, "gpumem_device_capacity_bytes", "gauge", "Bytes the broker may hand out on the device.");
        sample(&o, "gpumem_device_capacity_bytes", dev, "", (int64_t) backend_->capacity);
        uint64_t dev_free, dev_total;
        if (backend_->ops->mem_info((gm_backend_t *) backend_, &dev_free, &dev_total) == 0) {
                family(&o, "gpumem_device_total_bytes", "gauge", "Device memory as reported by the driver.");
                sample(&o, "gpumem_device_total_bytes", dev, "", (int64_t) dev_total);
                family(&o, "gpumem_device_free_bytes", "gauge", "Free device memory as reported by the driver.");
                sample(&o, "gpumem_device_free_bytes", dev, "", (int64_t) dev_free);
        }
        family(&o, "gpumem_device_in_use_bytes", "gauge", "Bytes the broker holds on the device for all sessions.");
        sample(&o, "gpumem_device_in_use_bytes", dev, "", (int64_t) gm_piece_reserved(b));
        family(&o, "gpumem_audit_checks_total", "counter",
               "Per-process driver figures read by the audit of believed give-backs (one NVML query each).");
        sample(&o, "gpumem_audit_checks_total", dev, "", (int64_t) b->audit_checks);
        family(&o, "gpumem_audited_processes", "gauge",
               "Processes still audited after their session ended while their driver figure showed gpumemd's memory "
               "(at most max_audited_processes).");
        sample(&o, "gpumem_audited_processes", dev, "", (int64_t) b->n_audited_processes);
        if (b->store_max) {
                family(&o, "gpumem_fdstore_fds", "gauge",
                       "Memory handles kept in systemd's fd store for a restart; absent outside systemd.");
                sample(&o, "gpumem_fdstore_fds", dev, "", b->n_stored);
                family(&o, "gpumem_fdstore_max_fds", "gauge",
                       "Handles the fd store may hold; pieces beyond it do not survive a restart here.");
                sample(&o, "gpumem_fdstore_max_fds", dev, "", b->store_max);
        }

        if (!m || !m->src.hide_tenants)
                render_tenants(&o, b, dev, m, rows, n);
        render_shared(&o, b, dev, !m || !m->src.hide_tenants);
        if (m)
                render_counters(&o, dev, m);
        render_process(&o, m);
        free(rows);
        if (o.failed) {
                free(o.p);
                return -ENOMEM;
        }
        o.p[o.len] = '\0'; /* out_reserve always leaves room for it */
        *ret_buf = o.p;
        *ret_len = o.len;
        return 0;
}

/* ---- HTTP ---- */

static enum MHD_Result reply_static(struct MHD_Connection *c, unsigned status, const char *body, bool allow) {
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *) body, MHD_RESPMEM_PERSISTENT);
        if (!r)
                return MHD_NO;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
        if (allow)
                MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
        enum MHD_Result ret = MHD_queue_response(c, status, r);
        MHD_destroy_response(r);
        return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
        gm_metrics_t *m = cls;
        if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
                return reply_static(c, MHD_HTTP_METHOD_NOT_ALLOWED, "Method not allowed: use GET.\n", true);
        if (strcmp(url, "/metrics") != 0)
                return reply_static(c, MHD_HTTP_NOT_FOUND, "Not found: the metrics are at /metrics.\n", false);
        char *text;
        size_t len;
        if (gm_metrics_render(m->src.broker, m, &text, &len) < 0)
                return reply_static(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "Out of memory.\n", false);
        struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, text, free);
        if (!r) {
                free(text);
                return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return ret;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
        char line[512];
        vsnprintf(line, sizeof(line), fmt, ap);
        line[strcspn(line, "\n")] = '\0';
        log_debug("metrics: %s", line);
}

static void mhd_service(gm_metrics_t *m);

static void on_timer(uv_timer_t *t) {
        mhd_service(t->data);
}

/* Lets MHD do whatever is due, then arms the timer for its next deadline. */
static void mhd_service(gm_metrics_t *m) {
        MHD_run(m->mhd);
        MHD_UNSIGNED_LONG_LONG timeout;
        if (MHD_get_timeout(m->mhd, &timeout) == MHD_YES)
                uv_timer_start(&m->timer, on_timer, timeout, 0);
        else
                uv_timer_stop(&m->timer);
}

static void on_events(uv_poll_t *p, int status, int events) {
        mhd_service(p->data);
}

static void on_listener(uv_poll_t *p, int status, int events) {
        gm_metrics_t *m = p->data;
        for (int i = 0; i < ACCEPTS_PER_WAKEUP; i++) {
                struct sockaddr_storage addr;
                socklen_t addrlen = sizeof(addr);
                int fd = accept4(m->listen_fd, (struct sockaddr *) &addr, &addrlen, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) {
                        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                                log_debug("metrics: accept failed: %s", strerror(errno));
                        break;
                }
                if (!gm_http_guard_admit(&m->guard, fd, (struct sockaddr *) &addr, addrlen)) {
                        close(fd); /* this peer holds its share: others' scrapes still find room */
                        continue;
                }
                /* Closes fd itself when a limit refuses it. */
                if (MHD_add_connection(m->mhd, fd, (struct sockaddr *) &addr, addrlen) != MHD_YES)
                        gm_http_guard_release(&m->guard, fd);
        }
        mhd_service(m);
}

/* A connection MHD closed (timeout, end, error) gives its peer's slot back. */
static void on_connection_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                                 enum MHD_ConnectionNotificationCode code) {
        gm_metrics_t *m = cls;
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (code == MHD_CONNECTION_NOTIFY_CLOSED && info)
                gm_http_guard_release(&m->guard, info->connect_fd);
}

static void metrics_free(gm_metrics_t *m) {
        free(m->refusals);
        free(m);
}

static void on_handle_closed(uv_handle_t *h) {
        gm_metrics_t *m = h->data;
        if (--m->closing == 0)
                metrics_free(m);
}

gm_metrics_t *gm_metrics_stop(gm_metrics_t *m) {
        if (!m)
                return NULL;
        /* Stop watching the fds before they are closed. */
        uv_handle_t *handles[] = {(uv_handle_t *) &m->listener, (uv_handle_t *) &m->events, (uv_handle_t *) &m->timer};
        for (unsigned i = 0; i < 3; i++)
                if (m->handles & (1u << i)) {
                        m->closing++;
                        uv_close(handles[i], on_handle_closed);
                }
        m->handles = 0;
        if (m->mhd)
                MHD_stop_daemon(m->mhd); /* closes every connection and the epoll fd */
        m->mhd = NULL;
        if (m->listen_fd >= 0)
                close(m->listen_fd);
        m->listen_fd = -1;
        if (m->unix_path[0])
                unlink(m->unix_path);
        m->unix_path[0] = '\0';
        if (m->closing == 0)
                metrics_free(m);
        return NULL;
}

static void describe_socket(int fd, char *buf, size_t len) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        char host[INET6_ADDRSTRLEN] = "?";
        snprintf(buf, len, "fd %d", fd);
        if (getsockname(fd, (struct sockaddr *) &ss, &sl) < 0)
                return;
        if (ss.ss_family == AF_INET) {
                const struct sockaddr_in *a = (const struct sockaddr_in *) &ss;
                inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
                snprintf(buf, len, "http://%s:%u/metrics", host, ntohs(a->sin_port));
        } else if (ss.ss_family == AF_INET6) {
                const struct sockaddr_in6 *a = (const struct sockaddr_in6 *) &ss;
                inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
                snprintf(buf, len, "http://[%s]:%u/metrics", host, ntohs(a->sin6_port));
        } else if (ss.ss_family == AF_UNIX) {
                snprintf(buf, len, "unix:%s", ((const struct sockaddr_un *) &ss)->sun_path);
        }
}

int gm_metrics_start_fd(const gm_metrics_source_t *src, int fd, gm_metrics_t **ret, char *reterr, size_t reterr_len) {
        gm_metrics_t *m = calloc(1, sizeof(*m));
        if (m)
                m->refusals = calloc(REFUSAL_TENANTS_MAX, sizeof(*m->refusals));
        if (!m || !m->refusals) {
                free(m);
                close(fd);
                snprintf(reterr, reterr_len, "out of memory");
                return -ENOMEM;
        }
        m->src = *src;
        if (m->src.n_ops > GM_METRICS_MAX_OPS)
                m->src.n_ops = GM_METRICS_MAX_OPS;
        m->listen_fd = fd;
        m->start_time = process_start_time();
        gm_http_guard_init(&m->guard);

        /* A socket from systemd is neither non-blocking nor close-on-exec. */
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
                int r = -errno;
                snprintf(reterr, reterr_len, "cannot configure the listening socket: %s", strerror(-r));
                gm_metrics_stop(m);
                return r;
        }
        m->mhd = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                                  on_request, m, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                                  MHD_OPTION_CONNECTION_LIMIT, HTTP_CONNECTION_LIMIT, MHD_OPTION_NOTIFY_CONNECTION,
                                  on_connection_notify, m, MHD_OPTION_CONNECTION_TIMEOUT, HTTP_IDLE_TIMEOUT_S,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) HTTP_MEMORY_LIMIT, MHD_OPTION_END);
        if (!m->mhd) {
                snprintf(reterr, reterr_len, "libmicrohttpd failed to start");
                gm_metrics_stop(m);
                return -EIO;
        }
        uv_timer_init(src->loop, &m->timer);
        m->timer.data = m;
        m->handles |= HANDLE_TIMER;
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_EPOLL_FD);
        int r = info ? uv_poll_init(src->loop, &m->events, info->epoll_fd) : UV_EINVAL;
        if (r == 0) {
                m->events.data = m;
                m->handles |= HANDLE_EVENTS;
                r = uv_poll_init(src->loop, &m->listener, fd);
        }
        if (r < 0) {
                snprintf(reterr, reterr_len, "cannot watch the HTTP sockets: %s", uv_strerror(r));
                gm_metrics_stop(m);
                return -EIO;
        }
        m->listener.data = m;
        m->handles |= HANDLE_LISTENER;
        uv_poll_start(&m->events, UV_READABLE, on_events);
        uv_poll_start(&m->listener, UV_READABLE, on_listener);

        char where[160];
        describe_socket(fd, where, sizeof(where));
        log_info("metrics: serving %s", where);
        *ret = m;
        return 0;
}

/* Parses "HOST:PORT" or "[HOST]:PORT" (numeric host; empty = every IPv4 address). */
static int parse_inet(const char *listen, struct sockaddr_storage *ss, socklen_t *sl) {
        char host[INET6_ADDRSTRLEN + 2];
        const char *colon = strrchr(listen, ':');
        if (!colon || (size_t) (colon - listen) >= sizeof(host))
                return -EINVAL;
        memcpy(host, listen, (size_t) (colon - listen));
        host[colon - listen] = '\0';
        char *end;
        errno = 0;
        unsigned long port = strtoul(colon + 1, &end, 10);
        if (!colon[1] || *end || errno || port > 65535)
                return -EINVAL;
        memset(ss, 0, sizeof(*ss));
        size_t hl = strlen(host);
        if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
                struct sockaddr_in6 *a = (struct sockaddr_in6 *) ss;
                host[hl - 1] = '\0';
                if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
                        return -EINVAL;
                a->sin6_family = AF_INET6;
                a->sin6_port = htons((uint16_t) port);
                *sl = sizeof(*a);
                return 0;
        }
        struct sockaddr_in *a = (struct sockaddr_in *) ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t) port);
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        if (host[0] && inet_pton(AF_INET, host, &a->sin_addr) != 1)
                return -EINVAL;
        *sl = sizeof(*a);
        return 0;
}

int gm_metrics_start(const gm_metrics_source_t *src, const char *listen_addr, gm_metrics_t **ret, char *reterr,
                     size_t reterr_len) {
        char def[32];
        if (!listen_addr) {
                snprintf(def, sizeof(def), "127.0.0.1:%d", METRICS_PORT_BASE + src->broker->backend->device);
                listen_addr = def;
        }
        if (!listen_addr[0] || strcmp(listen_addr, "none") == 0) {
                *ret = NULL;
                return 0;
        }
        struct sockaddr_storage ss;
        socklen_t sl;
        bool is_unix = strncmp(listen_addr, "unix:", 5) == 0;
        if (is_unix) {
                struct sockaddr_un *a = (struct sockaddr_un *) &ss;
                memset(a, 0, sizeof(*a));
                a->sun_family = AF_UNIX;
                if (!listen_addr[5] || strlen(listen_addr + 5) >= sizeof(a->sun_path)) {
                        snprintf(reterr, reterr_len, "invalid unix socket path in '%s'", listen_addr);
                        return -EINVAL;
                }
                strcpy(a->sun_path, listen_addr + 5);
                sl = sizeof(*a);
        } else if (parse_inet(listen_addr, &ss, &sl) < 0) {
                snprintf(reterr, reterr_len, "invalid address '%s': expected IPV4:PORT, [IPV6]:PORT or unix:PATH",
                         listen_addr);
                return -EINVAL;
        }
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
                int r = -errno;
                snprintf(reterr, reterr_len, "cannot create a socket: %s", strerror(-r));
                return r;
        }
        int r = 0;
        if (is_unix) {
                r = gm_ipc_bind_unix(fd, (const struct sockaddr_un *) &ss, SOCK_STREAM);
        } else {
                int one = 1;
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                if (bind(fd, (const struct sockaddr *) &ss, sl) < 0)
                        r = -errno;
        }
        if (r == 0 && listen(fd, 64) < 0)
                r = -errno;
        if (r < 0) {
                snprintf(reterr, reterr_len, "cannot listen on '%s': %s", listen_addr, strerror(-r));
                close(fd);
                return r;
        }
        gm_metrics_t *m;
        r = gm_metrics_start_fd(src, fd, &m, reterr, reterr_len);
        if (r < 0) {
                if (is_unix)
                        unlink(((const struct sockaddr_un *) &ss)->sun_path);
                return r;
        }
        if (is_unix)
                snprintf(m->unix_path, sizeof(m->unix_path), "%s", ((const struct sockaddr_un *) &ss)->sun_path);
        *ret = m;
        return 0;
}
