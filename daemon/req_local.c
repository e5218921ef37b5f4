/* A local session's own requests: Grant, ReturnPieces, ReturnIntent,
 * MovePieces, SleepState and ReclaimAck (table handlers). Decoding only: the session's
 * pieces and its parked grants are the broker's (broker.h, "local
 * sessions"); a central session is refused. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "local.h"
#include "req_local.h"
#include "text.h"

/* Ranges one ReturnPieces may name (each is a walk over the session's pieces). */
#define MAX_RETURN_RANGES 512u

/* ---- grants ---- */

static int refuse_central(gm_request_conn_t *c, uint64_t request_id, const char *what) {
        return gm_request_error(c, request_id, EPROTO, "%s needs a local session", what), 0;
}

int gm_req_local_grant(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
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
                .wait_for_memory = g->wait_for_memory,
                .wait_ms = g->wait_ms,
                .tag = g->tag,
                .tag_id = g->tag_id,
        };
        if (g->wait_ms > GM_MAX_GRANT_WAIT_MS) {
                gm_request_error(c, request_id, EINVAL, "a Grant waits at most %u ms (wait_ms)", GM_MAX_GRANT_WAIT_MS);
                return 0;
        }
        gm_localstats_refresh_conn(c); /* its figures, for a refusal's diagnosis */
        gm_outcome_t out;
        /* num_reclaim_waits counts application allocations: a heap's first try
         * (will_retry) starts a ladder, and its retry that waits again is the
         * same allocation. The heap lock keeps one ladder at a time. */
        if (g->will_retry)
                c->local->ladder_waited = false;
        gm_broker_grant(c->session, request_id, &grant, &out);
        if (out.kind == GM_OUTCOME_PARK) {
                if (!c->local->ladder_waited)
                        gm_localstats_count_reclaim_wait(c);
                c->local->ladder_waited = g->will_retry;
        } else {
                gm_local_answer_grant(c, request_id, &out);
        }
        return 0;
}

int gm_req_local_return_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
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
        size_t bad = gm_broker_return_pieces(c->session, ranges, ret->n_ranges, &first_bad);
        if (ret->closes_intent)
                gm_session_local_close_return_intent(c->session);
        if (c->local)
                gm_localstats_exact_sync(c);
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        if (sv.lied) {
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

int gm_req_local_return_intent(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        (void) env;
        if (!c->local)
                return refuse_central(c, request_id, "ReturnIntent");
        int r = gm_session_local_open_return_intent(c->session);
        if (r == -EBUSY)
                return gm_request_error(c, request_id, EBUSY,
                                        "a ReturnIntent is open: its last ReturnPieces (closes_intent) ends it"),
                       0;
        if (r < 0)
                return gm_request_error(c, request_id, -r, "ReturnIntent refused: %s", strerror(-r)), 0;
        return gm_request_ok(c, request_id);
}

int gm_req_local_move_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
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
                if (gm_session_local_move_granted(c->session, m->from_segment_id, m->from_offset, &to, &why) < 0)
                        gm_request_error(c, request_id, EINVAL,
                                         "move of %" PRIu64 " at %" PRIu64 " of segment %" PRIu64 " refused: %s",
                                         m->length, m->from_offset, m->from_segment_id, why);
        }
        gm_localstats_exact_sync(c);
        return 0;
}

/* ---- sleep and wake ---- */

/* Pools one SleepState may name. */
#define MAX_SLEEP_TAGS 16u

int gm_req_local_sleep_state(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        if (!c->local)
                return refuse_central(c, request_id, "SleepState");
        const Gpumem__SleepState *ss = env->sleep_state;
        if (ss->n_tags > MAX_SLEEP_TAGS)
                return gm_request_error(c, request_id, E2BIG, "at most %u pools in one SleepState", MAX_SLEEP_TAGS), 0;
        for (size_t i = 0; i < ss->n_tags; i++)
                if (!gm_text_tag_valid(ss->tags[i], true))
                        return gm_request_error(c, request_id, EINVAL,
                                                "SleepState: pool %zu is not a tag ([A-Za-z0-9_.-]{0,31})", i),
                               0;
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        int r = gm_session_local_sleep_state(c->session, ss->asleep, ss->sleeping_bytes);
        if (r == -EINVAL)
                return gm_request_error(c, request_id, EINVAL,
                                        "SleepState: %" PRIu64 " sleeping bytes, more than the %" PRId64
                                        " this session holds",
                                        ss->sleeping_bytes, sv.grants.bytes.current),
                       0;
        if (r == -EBUSY)
                return gm_request_error(c, request_id, EBUSY, "SleepState: the session is asleep already"), 0;
        if (r < 0)
                return gm_request_error(c, request_id, -r, "SleepState refused: %s", strerror(-r)), 0;
        return gm_request_ok(c, request_id);
}

/* ---- reclaim ---- */

int gm_req_local_reclaim_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__ReclaimAck *ack = env->reclaim_ack;
        if (c->local)
                gm_localstats_refresh_conn(c); /* what it keeps now, before waiting requests are retried */
        if (!c->local || gm_reclaim_ack(c->session, ack->reclaim_id, ack->released_bytes) < 0)
                return gm_request_error(c, request_id, EINVAL, "no reclaim %" PRIu64 " is pending", ack->reclaim_id), 0;
        return 0;
}
