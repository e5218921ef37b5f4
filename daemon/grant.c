/* Local sessions on the wire: Hello's heap mode, Grant, ReturnPieces,
 * Reclaim and its ack, re-attach (localstats.c reads the statistics pages).
 * Decoding and encoding only: what a local session holds, its grants that
 * wait for memory and the Reclaims it is asked are the broker's (broker.h,
 * "local sessions"), the same parking and reclaim as central sessions'. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "local.h"
#include "log.h"
#include "metrics.h"
#include "size.h"

/* Ranges one ReturnPieces may name (each is a walk over the session's pieces). */
#define MAX_RETURN_RANGES 512u

/* ---- hello ---- */

int gm_local_hello(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Hello *hello, Gpumem__HelloReply *reply,
                   int *ret_page_fd) {
        const gm_requests_t *d = c->rq;
        bool wants_local = hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL ||
                           hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED;
        const gm_config_tenant_t *ct = gm_config_tenant_find(d->config->file, c->tenant_name);
        *ret_page_fd = -1;
        reply->heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL;
        if (!wants_local || hello->admin)
                return 0;
        if (ct && ct->heap_central) {
                if (hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED)
                        return 0;
                gm_request_error(c, request_id, EPERM,
                                 "tenant '%s' must use a central heap (the configuration's 'heap = central'); "
                                 "connect without GPUMEM_HEAP=local",
                                 c->tenant_name);
                return -EPERM;
        }
        gm_local_t *l = calloc(1, sizeof(*l));
        int fd = -1;
        int r = l ? gm_session_set_local(c->session) : -ENOMEM;
        if (r == 0)
                r = gm_statpage_create(sizeof(gm_stats_t), &fd);
        if (r == 0)
                r = gm_statpage_map(fd, false, &l->page);
        if (r < 0) {
                if (fd >= 0)
                        close(fd);
                free(l);
                gm_request_error(c, request_id, r, "cannot create the statistics page: %s", strerror(-r));
                return r;
        }
        gm_stats_init(&l->exact);
        gm_stats_init(&l->figures);
        gm_stats_init(&l->applied);
        l->exact.max_split_size = l->figures.max_split_size = d->broker->device_stats.max_split_size;
        c->local = l;
        reply->heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL;
        reply->alloc_conf = d->broker->alloc_config.raw;
        reply->stats_page_size = GM_STATPAGE_SIZE;
        reply->grant_runs = true;
        reply->return_intents = gm_session_returns_need_intent(c->session);
        *ret_page_fd = fd;
        return 0;
}

/* ---- grants ---- */

static int refuse_central(gm_request_conn_t *c, uint64_t request_id, const char *what) {
        return gm_request_error(c, request_id, EPROTO, "%s needs a local session", what), 0;
}

void gm_local_answer_grant(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out) {
        if (c->closed)
                return;
        if (out->kind == GM_OUTCOME_REFUSE) {
                gm_request_refusal(c, request_id, out);
                return;
        }
        gm_local_exact_sync(c);
        Gpumem__Mapping maps[GM_MAX_GRANT_PIECES], *more[GM_MAX_GRANT_PIECES];
        int fds[GM_MAX_GRANT_PIECES];
        for (size_t k = 0; k < out->n_pieces; k++) {
                gm_request_piece_mapping(&maps[k], out->pieces[k]);
                more[k] = &maps[k];
                fds[k] = out->pieces[k]->phys.fd;
        }
        Gpumem__GrantReply gr = GPUMEM__GRANT_REPLY__INIT;
        gr.mapping = &maps[0];
        gr.n_more_mappings = out->n_pieces - 1;
        gr.more_mappings = more + 1;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_GRANT_REPLY;
        env.grant_reply = &gr;
        gm_request_send(c, request_id, &env, fds, out->n_pieces); /* a failure closes the connection */
}

int gm_handle_grant(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        if (!c->local)
                return refuse_central(c, request_id, "Grant");
        const Gpumem__Grant *g = env->grant;
        /* Its reply carries every piece's fd in one packet. */
        uint32_t max_pieces =
                c->rq->config->max_fds < GM_MAX_GRANT_PIECES ? c->rq->config->max_fds : GM_MAX_GRANT_PIECES;
        if (g->n_pieces > max_pieces) {
                gm_request_error(c, request_id, E2BIG, "at most %u pieces in one Grant (max_fds)", max_pieces);
                return 0;
        }
        gm_grant_t grant = {
                .piece = {.segment_id = g->segment_id,
                          .segment_va_size = g->segment_va_size,
                          .offset = g->offset,
                          .size = g->size},
                .n_pieces = g->n_pieces,
                .block_size = g->block_size,
                .largest_free = g->largest_free,
                .will_retry = g->will_retry,
        };
        gm_local_refresh_conn(c); /* its figures, for a refusal's diagnosis */
        gm_outcome_t out;
        /* num_reclaim_waits counts application allocations: a heap's first try
         * (will_retry) starts a ladder, and its retry that waits again is the
         * same allocation. The heap lock keeps one ladder at a time. */
        if (g->will_retry)
                c->local->ladder_waited = false;
        gm_session_grant(c->session, request_id, &grant, &out);
        if (out.kind == GM_OUTCOME_PARK) {
                if (!c->local->ladder_waited)
                        gm_local_count_reclaim_wait(c);
                c->local->ladder_waited = g->will_retry;
        } else {
                gm_local_answer_grant(c, request_id, &out);
        }
        return 0;
}

int gm_handle_return_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        if (!c->local)
                return refuse_central(c, request_id, "ReturnPieces");
        const Gpumem__ReturnPieces *ret = env->return_pieces;
        if (ret->n_ranges > MAX_RETURN_RANGES) {
                gm_request_error(c, request_id, E2BIG, "at most %u pieces in one ReturnPieces", MAX_RETURN_RANGES);
                return -E2BIG;
        }
        gm_release_range_t ranges[MAX_RETURN_RANGES];
        for (size_t i = 0; i < ret->n_ranges; i++)
                ranges[i] = (gm_release_range_t){.segment_id = ret->ranges[i]->segment_id,
                                                 .offset = ret->ranges[i]->offset,
                                                 .length = ret->ranges[i]->length};
        size_t first_bad = 0;
        /* The memory is back before parked requests are retried: the figures first. */
        size_t bad = gm_session_return_pieces(c->session, ranges, ret->n_ranges, &first_bad);
        if (ret->closes_intent)
                gm_session_close_return_intent(c->session);
        if (c->local)
                gm_local_exact_sync(c);
        if (c->session->lied) {
                gm_request_error(c, request_id, EBUSY,
                                 "pieces returned, but the memory is still mapped: it stays charged, and this "
                                 "session ends");
                return -EBUSY; /* as a lying ReleaseAck: closed, its memory charged while mapped */
        }
        if (bad)
                gm_request_error(c, request_id, EINVAL,
                                 "no piece of %" PRIu64 " bytes at %" PRIu64 " of segment %" PRIu64
                                 " was granted (%zu such ranges)",
                                 ranges[first_bad].length, ranges[first_bad].offset, ranges[first_bad].segment_id, bad);
        return 0;
}

int gm_handle_return_intent(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        (void) env;
        if (!c->local)
                return refuse_central(c, request_id, "ReturnIntent");
        int r = gm_session_open_return_intent(c->session);
        if (r == -EBUSY)
                return gm_request_error(c, request_id, EBUSY,
                                        "a ReturnIntent is open: its last ReturnPieces (closes_intent) ends it"),
                       0;
        if (r < 0)
                return gm_request_error(c, request_id, -r, "ReturnIntent refused: %s", strerror(-r)), 0;
        return gm_reply_ok(c, request_id);
}

int gm_handle_move_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        if (!c->local)
                return refuse_central(c, request_id, "MovePieces");
        const Gpumem__MovePieces *mp = env->move_pieces;
        if (mp->n_moves > MAX_RETURN_RANGES) { /* each is a walk over the session's pieces */
                gm_request_error(c, request_id, E2BIG, "at most %u pieces in one MovePieces", MAX_RETURN_RANGES);
                return -E2BIG;
        }
        for (size_t i = 0; i < mp->n_moves; i++) {
                const Gpumem__PageMove *m = mp->moves[i];
                gm_piece_spec_t to = {.segment_id = m->to_segment_id,
                                      .segment_va_size = m->to_segment_va_size,
                                      .offset = m->to_offset,
                                      .size = m->length};
                const char *why = NULL;
                if (gm_session_move_granted(c->session, m->from_segment_id, m->from_offset, &to, &why) < 0)
                        gm_request_error(c, request_id, EINVAL,
                                         "move of %" PRIu64 " at %" PRIu64 " of segment %" PRIu64 " refused: %s",
                                         m->length, m->from_offset, m->from_segment_id, why);
        }
        gm_local_exact_sync(c);
        return 0;
}

/* ---- reclaim ---- */

int gm_local_send_reclaim(void *userdata, gm_session_t *s, uint64_t reclaim_id, uint64_t bytes) {
        gm_request_conn_t *c = s->userdata;
        if (!c || !c->local || c->closed)
                return -ENOTCONN;
        Gpumem__Reclaim rq = GPUMEM__RECLAIM__INIT;
        rq.reclaim_id = reclaim_id;
        rq.bytes = bytes;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RECLAIM;
        env.reclaim = &rq;
        return gm_request_send(c, 0, &env, NULL, 0);
}

void gm_local_push_alloc_conf(void *userdata, gm_session_t *s, const gm_alloc_config_t *config) {
        gm_request_conn_t *c = s->userdata;
        if (!c || !c->local || c->closed)
                return;
        Gpumem__AllocConfUpdate up = GPUMEM__ALLOC_CONF_UPDATE__INIT;
        up.alloc_conf = (char *) config->raw;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_CONF_UPDATE;
        env.alloc_conf_update = &up;
        gm_request_send(c, 0, &env, NULL, 0); /* a failure closes the connection */
}

int gm_handle_reclaim_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__ReclaimAck *ack = env->reclaim_ack;
        if (c->local)
                gm_local_refresh_conn(c); /* what it keeps now, before waiting requests are retried */
        if (!c->local || gm_session_reclaim_ack(c->session, ack->reclaim_id, ack->released_bytes) < 0)
                return gm_request_error(c, request_id, EINVAL, "no reclaim %" PRIu64 " is pending", ack->reclaim_id), 0;
        return 0;
}

/* ---- re-attach ---- */

int gm_local_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Reattach *req) {
        gm_session_t *s = c->session;
        int r = req->n_blocks ? -EINVAL : 0; /* a local heap keeps its blocks */
        for (size_t i = 0; i < req->n_segments && r == 0; i++) {
                const Gpumem__ReattachSegment *seg = req->segments[i];
                for (size_t k = 0; k < seg->n_mapped && r == 0; k++) {
                        gm_piece_spec_t spec = {.segment_id = seg->segment_id,
                                                .segment_va_size = seg->va_size,
                                                .offset = seg->mapped[k]->offset,
                                                .size = seg->mapped[k]->length};
                        gm_piece_t *p;
                        r = gm_session_reattach_grant(s, &spec, &p);
                }
        }
        gm_local_exact_sync(c);
        if (r == 0 && req->last)
                r = gm_session_reattach_finish(s);
        if (r < 0) {
                gm_request_error(c, request_id, r, "re-attach refused: %s", strerror(-r));
                return r;
        }
        return req->last ? gm_reply_ok(c, request_id) : 0;
}

/* ---- the end of a session ---- */

void gm_local_end(gm_request_conn_t *c) {
        gm_local_t *l = c->local;
        if (!l)
                return;
        const gm_requests_t *d = c->rq;
        /* Its figures leave the local totals (the broker releases its pieces). */
        gm_stats_t gone = l->applied;
        gm_local_zero_currents(&gone);
        gm_local_tenant_t *lt = c->session->tenant ? gm_local_tenant(d, c->session->tenant->name) : NULL;
        if (lt)
                gm_local_fold(&lt->stats, &gone, &l->applied);
        gm_local_fold(&d->local->device, &gone, &l->applied);
        if (c->session->tenant)
                gm_local_exact_gone(c);
        gm_statpage_unmap(l->page);
        free(l);
        c->local = NULL;
}
