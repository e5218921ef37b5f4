/* Local sessions in the daemon: a connection whose heap runs in its client.
 * grant.c speaks the wire (Hello's heap mode, Grant, ReturnPieces, Reclaim,
 * re-attach); localstats.c reads the statistics pages and keeps the figures.
 * Pieces are the broker's (created, charged, stored and released through its
 * piece API, never held by a daemon-side heap); what is kept here is only the
 * session's page, its figures and its pending requests. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon.h"
#include "metrics.h"
#include "requests.h"
#include "statpage.h"

typedef struct gm_parked_grant gm_parked_grant_t;

/* Pieces one local session may hold (each is an fd here; grants walk them). */
#define GM_LOCAL_MAX_PIECES 65536u

struct gm_local {
        gm_statpage_t *page;
        gm_stats_t exact;       /* the daemon's own figures: reserved and segments (all pools), device allocs/frees */
        uint64_t granted;       /* bytes of its LIVE pieces */
        uint64_t n_pieces;      /* its LIVE pieces (at most GM_LOCAL_MAX_PIECES) */
        uint64_t segments;      /* segments with a LIVE piece */
        uint64_t segments_ever;
        gm_stats_t figures;     /* the page's last valid read, the exact figures laid over */
        gm_stats_t applied;     /* the page's part in its tenant's and the device's local totals */
        bool page_invalid;      /* the last read failed the bounds */
        gm_parked_grant_t *parked;
        uint32_t n_parked;
        uint64_t reclaim_id;    /* outstanding Reclaim (0: none) */
        uint64_t reclaim_bytes; /* what it should bring back */
        uint64_t reclaim_sent_ms;
        uint64_t next_reclaim_id;
        uint64_t dry_until_ms;  /* its last reclaim brought nothing back: not asked again before */
};

/* The local sessions' part of a tenant's statistics (the broker's tenant
 * figures hold the central heaps' part). */
struct gm_local_tenant {
        char name[64];
        gm_stats_t stats;
        struct gm_local_tenant *next;
};

/* localstats.c */
/* Adds want - applied to `sink`: currents move by the difference (peaks
 * follow), accumulated figures and counters only ever grow. */
void gm_local_fold(gm_stats_t *sink, const gm_stats_t *want, const gm_stats_t *applied);
/* Reads one connection's page into its figures and folds the change. */
void gm_local_refresh_conn(gm_conn_t *c);
/* Sets every current of `stats` to zero. */
void gm_local_zero_currents(gm_stats_t *stats);
/* Applies a change of the exact figures (bytes and segments granted or
 * returned) to the session, its tenant's and the device's local totals. */
void gm_local_exact_update(gm_conn_t *c, int64_t bytes, int64_t segments);
/* The metrics endpoint's source callbacks (userdata: the daemon). */
void gm_local_metrics_refresh(void *userdata);
void gm_local_metrics_tenant(void *userdata, const gm_tenant_t *t, gm_metrics_tenant_extra_t *ret);
