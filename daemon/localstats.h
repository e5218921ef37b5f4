/* Local sessions' figures: a connection whose heap runs in its client writes
 * its statistics to a page; here it is read (bounded), laid over the
 * daemon's exact figures and folded into its tenant's and the device's local
 * totals. What the session holds, its waiting grants and its Reclaims are the
 * broker's (broker.h, "local sessions"); what is kept here is only the
 * session's page and its figures (local.h: the session's life on the wire). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "metrics.h"
#include "request.h"
#include "statpage.h"

struct gm_localstats {
        gm_statpage_t *page;
        gm_stats_t exact; /* the daemon's own figures: reserved and segments (all pools), device allocs/frees */
        gm_session_grants_t synced;      /* the broker's grant figures last applied to exact and the totals */
        gm_stats_t figures;              /* the page's last valid read, the exact figures laid over */
        gm_stats_t applied;              /* the page's part in its tenant's and the device's local totals */
        bool page_invalid;               /* the last read failed the bounds */
        bool read_once;                  /* read_seq and read_grants hold the last completed read's */
        uint64_t read_seq;               /* the page's sequence number at that read */
        gm_session_grants_t read_grants; /* the session's grants then (the bounds it was checked against) */
        bool ladder_waited;              /* the heap's current out-of-memory ladder already waited for reclaim */
};

/* The local sessions' part of a tenant's statistics (the broker's tenant
 * figures hold the central heaps' part). */
struct gm_localstats_tenant {
        char name[64];
        gm_stats_t stats;
        struct gm_localstats_tenant *next;
};

/* The local sessions' part of every tenant's and the device's statistics. */
struct gm_localstats_totals {
        gm_localstats_tenant_t *tenants;
        gm_stats_t device;
};

/* The tenant's local totals, created on first use (NULL: out of memory). */
gm_localstats_tenant_t *gm_localstats_tenant(const gm_requests_t *d, const char *name);
/* Adds want - applied to `sink`: currents move by the difference (peaks
 * follow), accumulated figures and counters only ever grow, and each stat's
 * allocated - freed moves with its current, so a sink that had allocated =
 * freed + current keeps it (a current that drops uncounted counts as freed). */
void gm_localstats_fold(gm_stats_t *sink, const gm_stats_t *want, const gm_stats_t *applied);
/* Reads one connection's page into its figures and folds the change. */
void gm_localstats_refresh_conn(gm_request_conn_t *c);
/* Applies what the broker granted or took back since the last sync (bytes,
 * segments, pieces) to the session's exact figures and its tenant's and the
 * device's local totals; call it after every broker call that grants or
 * releases a local session's pieces. */
void gm_localstats_exact_sync(gm_request_conn_t *c);
/* The session ends: its page is read a last time, then its figures and its
 * exact ones leave its tenant's and the device's local totals, what it still
 * held counted as freed (the totals keep allocated = freed + current). */
void gm_localstats_gone(gm_request_conn_t *c);
/* The broker's ops->client_view (userdata unused: the session's connection). */
void gm_localstats_client_view(void *userdata, const gm_session_t *s, gm_client_view_t *ret);
/* A grant of the session waits for reclaimed memory: num_reclaim_waits of the
 * session, its tenant and the device (the daemon's figure, not the page's). */
void gm_localstats_count_reclaim_wait(gm_request_conn_t *c);
/* The metrics endpoint's source callbacks (userdata: the daemon). */
void gm_localstats_metrics_refresh(void *userdata);
void gm_localstats_metrics_tenant(void *userdata, const gm_tenant_t *t, gm_metrics_tenant_extra_t *ret);
/* Periodic: page reads. */
void gm_localstats_tick(const gm_requests_t *d);

void gm_localstats_free_all(const gm_requests_t *d);
/* Reads every local session's page (before figures are shown). */
void gm_localstats_refresh(const gm_requests_t *d);
/* A session's statistics: a central heap's, a local session's figures, or
 * NULL (a central session without a heap). */
const gm_stats_t *gm_localstats_session(const gm_session_t *s);
bool gm_localstats_page_invalid(const gm_session_t *s);
/* Session s's statistics of its tagged pool `tag` ("" the default) in *ret:
 * a central heap's, or a local session's page's (read now, bounded as its
 * figures are: a copy that fails counts as zeros); the num_* counters are 0.
 * False (and zeros) when the session never named the pool or has no heap. */
bool gm_localstats_session_tag(const gm_session_t *s, const char *tag, gm_stats_t *ret);
/* Sum of statistics (peaks summed: an upper bound). */
void gm_localstats_add(gm_stats_t *sum, const gm_stats_t *add);
/* A tenant's figures: the broker's (central heaps) plus its local sessions'. */
void gm_localstats_tenant_stats(const gm_requests_t *d, const gm_tenant_t *t, gm_stats_t *ret);
void gm_localstats_device_stats(const gm_requests_t *d, gm_stats_t *ret);
