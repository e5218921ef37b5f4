/* The Prometheus endpoint: GET /metrics in the text format 0.0.4, served by
 * libmicrohttpd from the daemon's libuv loop (no thread of its own), plus the
 * counters and latency histograms the request handlers feed.
 *
 * Every function accepts m == NULL (metrics disabled) and then does nothing,
 * so call sites need no checks. Loop thread only, like the rest of the daemon. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "broker.h"
#include "oom.h"

typedef struct gm_metrics gm_metrics_t;

typedef struct gm_metrics_tenant_extra {
        gm_stats_t stats;        /* added to the tenant's statistics */
        uint64_t local_sessions; /* sessions whose heap runs in the client */
        uint64_t invalid_pages;  /* of those, whose statistics page fails the daemon's bounds */
        uint64_t unresponsive;   /* sessions (either mode) marked unresponsive */
} gm_metrics_tenant_extra_t;

/* What snapshots cost (kept by req_snapshot.c). */
typedef struct gm_snapshot_counters {
        uint64_t sent;       /* snapshots answered */
        uint64_t bytes;      /* their size, all together */
        uint64_t refused;    /* over a limit, or too many under way */
        uint64_t answered;   /* local sessions that answered in time */
        uint64_t unanswered; /* ... that did not (shown with their segments only) */
        uint64_t invalid;    /* ... whose answer failed the checks (likewise) */
} gm_snapshot_counters_t;

/* What the endpoint reads and where it runs. */
typedef struct gm_metrics_source {
        uv_loop_t *loop;
        const gm_broker_t *broker;
        const char *const *op_names; /* request kinds by index: the op label; outlive the endpoint */
        size_t n_ops;
        bool hide_tenants; /* leave per-tenant series (and so tenant names) out of scrapes */
        /* The GPU's UUID ("GPU-...") when the backend knows none (host): the
         * UUID label of every gpumem_ series, so they join with
         * dcgm-exporter's; the backend's wins; NULL or "" and none there
         * leaves it out. Outlives the endpoint. */
        const char *device_uuid;
        /* Optional: figures of a tenant that live outside the broker (its
         * local sessions'), added to the broker's; called after `refresh`. */
        void (*refresh)(void *userdata);
        void (*tenant_extra)(void *userdata, const gm_tenant_t *t, gm_metrics_tenant_extra_t *ret);
        void *userdata;
        const gm_snapshot_counters_t *snapshots; /* optional; outlives the endpoint */
} gm_metrics_source_t;

/* Request kinds an endpoint can time, at most. */
#define GM_METRICS_MAX_OPS 32

/* Starts serving on `listen`: "HOST:PORT" (IPv4 dotted quad, or "[IPv6]:PORT"),
 * "unix:PATH" (a stale socket file is replaced and removed again at stop), NULL
 * for the default "127.0.0.1:<9470 + device>", or "none" / "" to disable: then
 * *ret = NULL and 0 is returned. Port 0 picks a free port (logged). On failure
 * returns a negative errno with the reason in reterr; *ret is untouched. */
int gm_metrics_start(const gm_metrics_source_t *src, const char *listen, gm_metrics_t **ret, char *reterr,
                     size_t reterr_len);
/* The same on an already listening stream socket (socket activation); it is
 * owned by the endpoint from then on, also on failure. */
int gm_metrics_start_fd(const gm_metrics_source_t *src, int fd, gm_metrics_t **ret, char *reterr, size_t reterr_len);
/* Closes every HTTP connection and the listening socket at once; the memory goes
 * when the loop runs the handles' close callbacks. Returns NULL. */
gm_metrics_t *gm_metrics_stop(gm_metrics_t *m);

/* Records that serving one request of kind `op` (an index of the source's
 * op_names; others are ignored) took `ns` nanoseconds. */
void gm_metrics_observe_request(gm_metrics_t *m, unsigned op, uint64_t ns);
/* Counts one refused allocation of `tenant`. */
void gm_metrics_count_refusal(gm_metrics_t *m, const char *tenant, gm_oom_reason_t reason);
/* A refusal class's label value ("quota", "fragmentation", ...). */
const char *gm_metrics_reason_name(gm_oom_reason_t reason);
/* Counts one reclaim event. */
void gm_metrics_count_reclaim(gm_metrics_t *m, gm_reclaim_outcome_t outcome);
/* Records that a parked allocation waited `ns` nanoseconds for reclaimed
 * memory before it was served or refused. */
void gm_metrics_observe_reclaim_wait(gm_metrics_t *m, uint64_t ns);

/* Builds the whole exposition text from b's current state and m's counters
 * (m == NULL: the state only, no counters, histograms or UUID). Tenants are
 * shown once they have had a session, hold memory or have a quota from the
 * configuration, and from then on (a quota set for a mistyped name shows
 * nothing); counters come from statistics that never go back. *ret_buf is
 * malloc'd, NUL-terminated, *ret_len excludes the NUL. -ENOMEM on failure. */
int gm_metrics_render(const gm_broker_t *b, const gm_metrics_t *m, char **ret_buf, size_t *ret_len);
