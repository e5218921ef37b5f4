/* Local sessions in the daemon: a connection whose heap runs in its client.
 * grant.c speaks the wire (Hello's heap mode, Grant, ReturnPieces, Reclaim,
 * re-attach); localstats.c reads the statistics pages and keeps the figures.
 * Pieces are the broker's (created, charged, stored and released through its
 * piece API, never held by a daemon-side heap); what is kept here is only the
 * session's page, its figures and its pending requests. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "metrics.h"
#include "requests.h"
#include "statpage.h"

typedef struct gm_parked_grant gm_parked_grant_t;

/* Pieces one local session may hold (each is an fd here; grants walk them). */
#define GM_LOCAL_MAX_PIECES 65536u

struct gm_local {
        gm_statpage_t *page;
        gm_stats_t exact;  /* the daemon's own figures: reserved and segments (all pools), device allocs/frees */
        uint64_t granted;  /* bytes of its LIVE pieces */
        uint64_t n_pieces; /* its LIVE pieces (at most GM_LOCAL_MAX_PIECES) */
        uint64_t segments; /* segments with a LIVE piece */
        uint64_t segments_ever;
        gm_stats_t figures; /* the page's last valid read, the exact figures laid over */
        gm_stats_t applied; /* the page's part in its tenant's and the device's local totals */
        bool page_invalid;  /* the last read failed the bounds */
        gm_parked_grant_t *parked;
        uint32_t n_parked;
        uint64_t reclaim_id;    /* outstanding Reclaim (0: none) */
        uint64_t reclaim_bytes; /* what it should bring back */
        uint64_t reclaim_sent_ms;
        uint64_t next_reclaim_id;
        uint64_t dry_until_ms; /* its last reclaim brought nothing back: not asked again before */
};

/* The local sessions' part of a tenant's statistics (the broker's tenant
 * figures hold the central heaps' part). */
struct gm_local_tenant {
        char name[64];
        gm_stats_t stats;
        struct gm_local_tenant *next;
};

/* The local sessions' part of every tenant's and the device's statistics. */
struct gm_local_totals {
        gm_local_tenant_t *tenants;
        gm_stats_t device;
};

/* localstats.c */
/* The tenant's local totals, created on first use (NULL: out of memory). */
gm_local_tenant_t *gm_local_tenant(const gm_requests_t *d, const char *name);
/* Adds want - applied to `sink`: currents move by the difference (peaks
 * follow), accumulated figures and counters only ever grow. */
void gm_local_fold(gm_stats_t *sink, const gm_stats_t *want, const gm_stats_t *applied);
/* Reads one connection's page into its figures and folds the change. */
void gm_local_refresh_conn(gm_request_conn_t *c);
/* Sets every current of `stats` to zero. */
void gm_local_zero_currents(gm_stats_t *stats);
/* Applies a change of the exact figures (bytes and segments granted or
 * returned) to the session, its tenant's and the device's local totals. */
void gm_local_exact_update(gm_request_conn_t *c, int64_t bytes, int64_t segments);
/* A grant of the session waits for reclaimed memory: num_reclaim_waits of the
 * session, its tenant and the device (the daemon's figure, not the page's). */
void gm_local_count_reclaim_wait(gm_request_conn_t *c);
/* The metrics endpoint's source callbacks (userdata: the daemon). */
void gm_local_metrics_refresh(void *userdata);
void gm_local_metrics_tenant(void *userdata, const gm_tenant_t *t, gm_metrics_tenant_extra_t *ret);

/* grant.c */
/* At Hello, after the session started: picks the heap mode; for a local
 * session creates its statistics page (*ret_page_fd: send it with the reply,
 * then close it) and fills the reply's local fields. A refusal is sent and
 * returned as a negative errno. */
int gm_local_hello(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Hello *hello, Gpumem__HelloReply *reply,
                   int *ret_page_fd);
int gm_handle_grant(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_return_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Page reuse in a local heap: pieces moved inside the client's mappings. */
int gm_handle_move_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_reclaim_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Re-attach of a local session: its pieces only (no blocks). */
int gm_local_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Reattach *req);
/* Asks local sessions (of `tenant` only, when not NULL) other than `except`
 * for their cached memory; returns the bytes expected back. */
uint64_t gm_local_reclaim(const gm_requests_t *d, const gm_request_conn_t *except, const gm_tenant_t *tenant);
/* A central allocation the broker refused for lack of memory: when local
 * sessions hold cached memory they are asked for it and the request waits
 * (true: parked, answered later); false: answer `out` now. */
bool gm_local_park_alloc(gm_request_conn_t *c, uint64_t request_id, uint64_t size, uint64_t stream,
                         const gm_outcome_t *out);
/* Retries grants (and central allocations) waiting for reclaimed memory. */
void gm_local_retry_parked(const gm_requests_t *d);
/* Periodic: reclaim timeouts, page reads, parked grants. */
void gm_local_tick(const gm_requests_t *d);
/* The connection ends: its figures leave the totals, its page goes. */
void gm_local_end(gm_request_conn_t *c);

/* localstats.c (also) */
void gm_local_free_all(const gm_requests_t *d);
/* Reads every local session's page (before figures are shown). */
void gm_local_refresh(const gm_requests_t *d);
/* A session's statistics: a central heap's, a local session's figures, or
 * NULL (a central session without a heap). */
const gm_stats_t *gm_conn_stats(const gm_session_t *s);
bool gm_conn_page_invalid(const gm_session_t *s);
/* Sum of statistics (peaks summed: an upper bound). */
void gm_local_stats_add(gm_stats_t *sum, const gm_stats_t *add);
/* A tenant's figures: the broker's (central heaps) plus its local sessions'. */
void gm_local_tenant_stats(const gm_requests_t *d, const gm_tenant_t *t, gm_stats_t *ret);
void gm_local_device_stats(const gm_requests_t *d, gm_stats_t *ret);
