/* A central heap's requests: Alloc (with the frees it carries, and the
 * reply with its new pieces), Free, FreeCompleted, ReleaseAck and Trim. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "local.h"
#include "msg.h"
#include "req_central.h"

/* Client-supplied frames kept with an allocation's trace event, at most. */
#define MAX_FRAMES 64
/* Streams one allocation may report fences of (a session tracks as many). */
#define MAX_FENCES_DONE GM_SESSION_FENCE_STREAMS

/* ---- allocations ---- */

/* Sends the new pieces' mappings (MapSegments packets while more than one
 * packet's worth of fds remains, the rest with the AllocReply) and the
 * pending page moves (with the AllocReply, applied first). -ENOMEM when
 * the reply cannot be built (nothing sent), or the send's error (the
 * connection is closed). */
static int send_alloc_reply(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out) {
        const gm_alloc_result_t *res = &out->alloc;
        uint32_t max_fds = c->rq->config->max_fds;
        size_t n = 0;
        for (const gm_piece_t *p = out->new_pieces; p; p = p->queue)
                n++;
        size_t n_moves = out->n_moves;
        /* Page reuse's new fence marks (at most one per stream the session tracks). */
        Gpumem__StreamFence marks[GM_SESSION_FENCE_STREAMS], *mark_ptrs[GM_SESSION_FENCE_STREAMS];
        size_t n_marks = 0;
        for (size_t k = 0; k < out->n_marks; k++) {
                gpumem__stream_fence__init(&marks[n_marks]);
                marks[n_marks].stream = out->marks[k].stream;
                marks[n_marks].fence = out->marks[k].fence;
                mark_ptrs[n_marks] = &marks[n_marks];
                n_marks++;
        }
        /* A cached block brings no piece and no move: no allocation for the common reply. */
        Gpumem__Mapping *map_ptrs_none[1];
        int fds_none[1];
        Gpumem__PageMove *move_ptrs_none[1];
        Gpumem__Mapping *maps = NULL, **map_ptrs = map_ptrs_none;
        int *fds = fds_none;
        Gpumem__PageMove *moves = NULL, **move_ptrs = move_ptrs_none;
        if (n > 0) {
                maps = calloc(n, sizeof(*maps));
                map_ptrs = calloc(n, sizeof(*map_ptrs));
                fds = calloc(n, sizeof(int));
        }
        if (n_moves > 0) {
                moves = calloc(n_moves, sizeof(*moves));
                move_ptrs = calloc(n_moves, sizeof(*move_ptrs));
        }
        int r = 0;
        if ((n > 0 && (!maps || !map_ptrs || !fds)) || (n_moves > 0 && (!moves || !move_ptrs))) {
                r = -ENOMEM;
                goto out;
        }
        for (size_t k = 0; k < n_moves; k++) {
                const gm_page_move_t *m = &out->moves[k];
                gpumem__page_move__init(&moves[k]);
                moves[k].from_segment_id = m->from_segment_id;
                moves[k].from_offset = m->from_offset;
                moves[k].to_segment_id = m->piece->segment_id;
                moves[k].to_segment_va_size = m->piece->segment_va_size;
                moves[k].to_offset = m->piece->offset;
                moves[k].length = m->piece->phys.size;
                moves[k].from_whole_segment = m->from_whole_segment;
                move_ptrs[k] = &moves[k];
        }
        size_t i = 0; /* creation order: the client maps them so */
        for (const gm_piece_t *p = out->new_pieces; p; p = p->queue, i++) {
                gm_request_piece_mapping(&maps[i], p);
                map_ptrs[i] = &maps[i];
                fds[i] = p->phys.fd;
        }
        size_t sent = 0;
        while (n - sent > max_fds) {
                Gpumem__MapSegments ms = GPUMEM__MAP_SEGMENTS__INIT;
                ms.n_mappings = max_fds;
                ms.mappings = map_ptrs + sent;
                Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
                env.body_case = GPUMEM__ENVELOPE__BODY_MAP_SEGMENTS;
                env.map_segments = &ms;
                r = gm_request_send(c, request_id, &env, fds + sent, max_fds);
                if (r < 0)
                        goto out;
                sent += max_fds;
        }
        Gpumem__AllocReply reply = GPUMEM__ALLOC_REPLY__INIT;
        reply.block_id = res->block_id;
        reply.segment_id = res->segment_id;
        reply.offset = res->offset;
        reply.block_size = res->size;
        reply.n_new_mappings = n - sent;
        reply.new_mappings = map_ptrs + sent;
        reply.n_page_moves = n_moves;
        reply.page_moves = move_ptrs;
        reply.n_fence_marks = n_marks;
        reply.fence_marks = mark_ptrs;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_REPLY;
        env.alloc_reply = &reply;
        r = gm_request_send(c, request_id, &env, fds + sent, n - sent);
out:
        if (r == 0)
                gm_broker_commit(c->session, out);
        if (n > 0) {
                free(maps);
                free(map_ptrs);
                free(fds);
        }
        if (n_moves > 0) {
                free(moves);
                free(move_ptrs);
        }
        return r;
}

void gm_req_central_answer_alloc(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out) {
        if (c->closed)
                return;
        if (c->local)
                return gm_local_answer_grant(c, request_id, out);
        if (out->kind == GM_OUTCOME_REFUSE) {
                gm_session_central_count_refusal(c->session);
                gm_request_refusal(c, request_id, out);
                return;
        }
        int r = send_alloc_reply(c, request_id, out);
        if (r == -ENOMEM && !c->closed) {
                /* Nothing was sent: the block goes back, the client hears why. */
                gm_broker_undo(c->session, out);
                gm_request_error(c, request_id, ENOMEM, "out of memory building the allocation's reply");
        }
}

/* Frees one block as a Free asks; one that is not a live block of the
 * session is answered with the refusal: -EINVAL. */
static int free_block(gm_request_conn_t *c, uint64_t request_id, uint64_t block_id, bool deferred) {
        if (gm_session_central_free_block(c->session, block_id, deferred) == 0)
                return 0;
        gm_request_error(c, request_id, EINVAL,
                         "free of block %" PRIu64
                         " refused: not a live block of this session (unknown id or double free)",
                         block_id);
        return -EINVAL;
}

/* Frees ids[0..n) in order (not deferred), up to the first refused one. */
static int free_blocks(gm_request_conn_t *c, uint64_t request_id, const uint64_t *ids, size_t n) {
        int r = 0;
        for (size_t i = 0; i < n && r == 0; i++)
                r = free_block(c, request_id, ids[i], false);
        return r;
}

int gm_req_central_alloc(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Alloc *alloc = env->alloc;
        if (c->local)
                return gm_request_error(c, request_id, EPROTO, "a local session allocates in its own heap"), 0;
        /* Untrusted: a claim that cannot be true ends the session (a false
         * one within bounds only moves the liar's own pages early). */
        int r = alloc->n_fences_done > MAX_FENCES_DONE || alloc->n_other_frees_fenced > MAX_FENCES_DONE ||
                                alloc->n_freed_block_ids > GM_CARRIED_FREES_MAX
                        ? -EPROTO
                        : 0;
        for (size_t i = 0; i < alloc->n_fences_done && r == 0; i++)
                r = gm_session_central_fence_done(c->session, alloc->fences_done[i]->stream,
                                                  alloc->fences_done[i]->fence);
        if (r < 0) {
                gm_request_error(c, request_id, EPROTO,
                                 "allocation refused: its report of complete stream fences or its carried "
                                 "frees are too long, or it names a fence this session was never asked to mark");
                return r;
        }
        /* The carried frees come first: their blocks are this allocation's to reuse. */
        if (free_blocks(c, request_id, alloc->freed_block_ids, alloc->n_freed_block_ids) < 0)
                return 0;
        if (alloc->frees_fenced)
                gm_session_central_frees_fenced(c->session, alloc->stream);
        for (size_t i = 0; i < alloc->n_other_frees_fenced; i++)
                gm_session_central_frees_fenced(c->session, alloc->other_frees_fenced[i]);
        gm_frame_t frames[MAX_FRAMES];
        size_t n_frames = alloc->n_frames < MAX_FRAMES ? alloc->n_frames : MAX_FRAMES;
        for (size_t i = 0; i < n_frames; i++)
                frames[i] = (gm_frame_t){
                        .filename = alloc->frames[i]->filename,
                        .line = alloc->frames[i]->line,
                        .name = alloc->frames[i]->name,
                };
        gm_outcome_t out;
        gm_broker_alloc_tagged(c->session, request_id, alloc->size, alloc->stream, alloc->tag, alloc->capturing, frames,
                               n_frames, &out);
        if (out.kind != GM_OUTCOME_PARK)
                gm_req_central_answer_alloc(c, request_id, &out);
        return 0;
}

int gm_req_central_free(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Free *f = env->free;
        if (f->n_more_block_ids > 0 && (f->deferred || f->n_more_block_ids >= GM_CARRIED_FREES_MAX)) {
                gm_request_error(c, request_id, EPROTO, "free refused: too many blocks, or several deferred");
                return -EPROTO;
        }
        if (free_block(c, request_id, f->block_id, f->deferred) == 0)
                free_blocks(c, request_id, f->more_block_ids, f->n_more_block_ids);
        return 0;
}

int gm_req_central_free_completed(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        uint64_t block_id = env->free_completed->block_id;
        if (gm_session_central_free_completed(c->session, block_id) < 0)
                gm_request_error(c, request_id, EINVAL, "block %" PRIu64 " has no free pending completion", block_id);
        return 0;
}

int gm_req_central_release_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__ReleaseAck *ack = env->release_ack;
        uint64_t release_id = ack->release_id;
        gm_release_range_t *kept = NULL;
        if (ack->n_not_released > 0 && !(kept = calloc(ack->n_not_released, sizeof(*kept))))
                return -ENOMEM;
        for (size_t i = 0; i < ack->n_not_released; i++)
                kept[i] = (gm_release_range_t){.segment_id = ack->not_released[i]->segment_id,
                                               .offset = ack->not_released[i]->offset};
        int r = gm_broker_release_ack(c->session, release_id, kept, ack->n_not_released);
        free(kept);
        if (r == -EBUSY) {
                gm_request_error(c, request_id, EBUSY,
                                 "release %" PRIu64 " acknowledged, but the memory is still mapped: it stays "
                                 "charged, and this session ends",
                                 release_id);
                return -EBUSY; /* a lying acknowledger is closed; its memory stays charged while mapped */
        }
        if (r < 0)
                gm_request_error(c, request_id, EINVAL, "no release %" PRIu64 " is pending", release_id);
        return 0;
}

/* ---- trim ---- */

/* A tenant named, or an admin's connection without memory: other sessions. */
static bool trims_others(const gm_request_conn_t *c, const Gpumem__Trim *trim) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        return (trim->tenant && trim->tenant[0]) || (!sv.heap && sv.admin);
}

const char *gm_req_central_admin_for_trim(const gm_request_conn_t *c, const Gpumem__Envelope *env) {
        return trims_others(c, env->trim) ? "trimming other sessions" : NULL;
}

int gm_req_central_trim(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Trim *trim = env->trim;
        gm_broker_t *b = c->rq->broker;
        uint64_t released = 0;
        if (!trims_others(c, trim)) {
                released = gm_session_central_trim(c->session);
        } else {
                const char *tenant =
                        trim->tenant && trim->tenant[0] && strcmp(trim->tenant, "*") != 0 ? trim->tenant : NULL;
                const gm_tenant_t *t = tenant ? gm_tenant_find(b, tenant) : NULL;
                if (tenant && !t)
                        return gm_request_error(c, request_id, ENOENT, "no tenant '%s'", tenant), 0;
                released = gm_reclaim_trim(b, tenant); /* local sessions give theirs back with their acks */
        }
        Gpumem__TrimReply reply = GPUMEM__TRIM_REPLY__INIT;
        reply.released_bytes = released;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_TRIM_REPLY;
        out.trim_reply = &reply;
        gm_request_send(c, request_id, &out, NULL, 0);
        return 0;
}
