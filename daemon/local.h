/* Local sessions in the daemon: a connection whose heap runs in its client.
 * grant.c speaks the wire (Hello's heap mode, Grant, ReturnPieces, Reclaim,
 * re-attach); localstats.c reads the statistics pages and keeps the figures.
 * What the session holds, its waiting grants and its Reclaims are the
 * broker's (broker.h, "local sessions"); what is kept here is only the
 * session's page and its figures. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "metrics.h"
#include "requests.h"
#include "statpage.h"

struct gm_local {
        gm_statpage_t *page;
        gm_stats_t exact; /* the daemon's own figures: reserved and segments (all pools), device allocs/frees */
        gm_session_grants_t synced; /* the broker's grant figures last applied to exact and the totals */
        gm_stats_t figures;         /* the page's last valid read, the exact figures laid over */
        gm_stats_t applied;         /* the page's part in its tenant's and the device's local totals */
        bool page_invalid;          /* the last read failed the bounds */
        bool ladder_waited;         /* the heap's current out-of-memory ladder already waited for reclaim */
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
/* Applies what the broker granted or took back since the last sync (bytes,
 * segments, pieces) to the session's exact figures and its tenant's and the
 * device's local totals; call it after every broker call that grants or
 * releases a local session's pieces. */
void gm_local_exact_sync(gm_request_conn_t *c);
/* The session ends: its exact figures leave the totals. */
void gm_local_exact_gone(gm_request_conn_t *c);
/* The broker's ops->client_view (userdata unused: the session's connection). */
void gm_local_client_view(void *userdata, const gm_session_t *s, gm_client_view_t *ret);
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
/* Answers a grant's outcome (the piece's fd, or the refusal). */
void gm_local_answer_grant(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out);
/* The broker's ops->alloc_conf_changed: an AllocConfUpdate to the client. */
void gm_local_push_alloc_conf(void *userdata, gm_session_t *s, const gm_alloc_config_t *config);
/* The broker's ops->send_reclaim (userdata unused: the session's connection). */
int gm_local_send_reclaim(void *userdata, gm_session_t *s, uint64_t reclaim_id, uint64_t bytes);
int gm_handle_return_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_return_intent(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Page reuse in a local heap: pieces moved inside the client's mappings. */
int gm_handle_move_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_reclaim_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Re-attach of a local session: its pieces only (no blocks). */
int gm_local_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Reattach *req);
/* Periodic: page reads. */
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
