/* The request table and the handlers of a session's own requests: hello,
 * allocations, frees, releases, trim and re-attach. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "diag.h"
#include "ipc.h"
#include "local.h"
#include "log.h"
#include "msg.h"
#include "requests.h"
#include "snapjob.h"

/* ---- field limits (checked before a handler runs, or applied by it) ---- */

/* Client-supplied frames kept with an allocation's trace event, at most. */
#define MAX_FRAMES 64
/* Streams one allocation may report fences of (a session tracks as many). */
#define MAX_FENCES_DONE GM_SESSION_FENCE_STREAMS
/* Mapped pieces one re-attached segment may report. */
#define MAX_REATTACH_PIECES (1u << 16)

/* Every error message the daemon writes starts so; the broker's are whole already. */
#define MESSAGE_PREFIX "gpumemd: "

int gm_request_send(gm_request_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds, size_t n_fds) {
        if (c->closed)
                return -ECONNRESET;
        return c->rq->send(c->rq->userdata, c, request_id, env, fds, n_fds);
}

void gm_request_error_envelope(Gpumem__Envelope *env, Gpumem__Error *error, int err, const char *text) {
        gpumem__error__init(error);
        error->code = err < 0 ? -err : err;
        error->message = (char *) text;
        gpumem__envelope__init(env);
        env->body_case = GPUMEM__ENVELOPE__BODY_ERROR;
        env->error = error;
}

void gm_request_format_message(char *message, size_t len, const char *fmt, va_list ap) {
        size_t prefix = strlen(MESSAGE_PREFIX);
        memcpy(message, MESSAGE_PREFIX, prefix + 1);
        vsnprintf(message + prefix, len - prefix, fmt, ap);
}

static int send_error_text(gm_request_conn_t *c, uint64_t request_id, int err, const char *text) {
        Gpumem__Error error;
        Gpumem__Envelope env;
        gm_request_error_envelope(&env, &error, err, text);
        return gm_request_send(c, request_id, &env, NULL, 0);
}

int gm_request_error(gm_request_conn_t *c, uint64_t request_id, int err, const char *fmt, ...) {
        char message[2048];
        va_list ap;
        va_start(ap, fmt);
        gm_request_format_message(message, sizeof(message), fmt, ap);
        va_end(ap);
        return send_error_text(c, request_id, err, message);
}

void gm_request_piece_mapping(Gpumem__Mapping *m, const gm_piece_t *p) {
        gpumem__mapping__init(m);
        m->segment_id = p->segment_id;
        m->segment_va_size = p->segment_va_size;
        m->offset = p->offset;
        m->length = p->phys.size;
}

int gm_request_refusal(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out) {
        gm_diag_note_refusal(c, out);
        return send_error_text(c, request_id, out->error, out->message);
}

int gm_reply_ok(gm_request_conn_t *c, uint64_t request_id) {
        Gpumem__Ok ok = GPUMEM__OK__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_OK;
        env.ok = &ok;
        gm_request_send(c, request_id, &env, NULL, 0);
        return 0;
}

/* ---- hello ---- */

static int handle_hello(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Hello *hello = env->hello;
        gm_session_t *s = c->session;
        if (c->hello_done) {
                gm_request_error(c, request_id, EPROTO, "hello sent twice");
                return -EPROTO;
        }
        if (hello->protocol_version != GM_PROTOCOL_VERSION) {
                gm_request_error(c, request_id, EPROTONOSUPPORT, "protocol version %u not supported (daemon speaks %u)",
                                 hello->protocol_version, GM_PROTOCOL_VERSION);
                return -EPROTONOSUPPORT;
        }
        gm_session_describe(s, hello->client_name, hello->admin);
        int r = gm_session_start(s, c->tenant_name, hello->resume_token);
        if (r < 0) {
                gm_request_error(c, request_id, r, "cannot %s session: %s",
                                 hello->resume_token && hello->resume_token[0] ? "re-attach" : "start",
                                 r == -EBUSY    ? "it is attached to another connection"
                                 : r == -EPERM  ? "it belongs to another user"
                                 : r == -EINVAL ? "invalid token"
                                 : r == -ENOENT ? "the ledger knows no such session"
                                                : strerror(-r));
                return r;
        }
        Gpumem__HelloReply reply = GPUMEM__HELLO_REPLY__INIT;
        int page_fd = -1;
        r = gm_local_hello(c, request_id, hello, &reply, &page_fd);
        if (r < 0)
                return r;
        c->hello_done = true;

        reply.protocol_version = GM_PROTOCOL_VERSION;
        reply.session_id = s->id;
        reply.backend = (char *) c->rq->broker->backend->ops->name;
        const gm_kind_caps_t *kc = c->rq->broker->backend->ops->caps;
        Gpumem__KindCaps caps = GPUMEM__KIND_CAPS__INIT;
        caps.device_streams = kc->device_streams;
        caps.cpu_accessible = kc->cpu_accessible;
        reply.caps = &caps;
        reply.device = c->rq->broker->backend->device;
        reply.capacity = c->rq->broker->backend->capacity;
        reply.max_packet = c->rq->config->max_packet;
        reply.max_fds = c->rq->config->max_fds;
        reply.tenant = s->tenant->name;
        reply.granularity = c->rq->broker->backend->granularity;
        reply.session_token = s->token;
        reply.device_uuid = c->rq->broker->backend->device_uuid;
        reply.admin = s->admin;
        reply.client_fences = gm_session_client_fences(s);
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_HELLO_REPLY;
        out.hello_reply = &reply;
        log_info("session %llu: pid %d uid %u tenant '%s' client '%s'%s", (unsigned long long) s->id, (int) s->pid,
                 (unsigned) s->uid, s->tenant->name, s->name, c->local ? ", local heap" : "");
        if (c->local && c->rq->broker->history) /* its heap records its own trace */
                reply.history_max_entries = c->rq->broker->history_max_entries;
        gm_request_send(c, request_id, &out, page_fd >= 0 ? &page_fd : NULL, page_fd >= 0 ? 1 : 0);
        if (page_fd >= 0)
                close(page_fd);
        return 0;
}

/* ---- allocations ---- */

/* Sends the new pieces' mappings (MapSegments packets while more than one
 * packet's worth of fds remains, the rest with the AllocReply) and the
 * pending page moves (with the AllocReply, applied first). -ENOMEM when
 * the reply cannot be built (nothing sent), or the send's error (the
 * connection is closed). */
static int send_alloc_reply(gm_request_conn_t *c, uint64_t request_id, const gm_alloc_result_t *res) {
        gm_session_t *s = c->session;
        uint32_t max_fds = c->rq->config->max_fds;
        size_t n = 0;
        for (const gm_piece_t *p = gm_session_new_pieces(s); p; p = p->queue)
                n++;
        size_t n_moves = s->n_moves;
        /* Page reuse's new fence marks (at most one per stream the session tracks). */
        Gpumem__StreamFence marks[GM_SESSION_FENCE_STREAMS], *mark_ptrs[GM_SESSION_FENCE_STREAMS];
        size_t n_marks = 0;
        for (size_t k = 0; k < s->n_fences; k++)
                if (s->fences[k].asked > s->fences[k].sent) {
                        gpumem__stream_fence__init(&marks[n_marks]);
                        marks[n_marks].stream = s->fences[k].stream;
                        marks[n_marks].fence = s->fences[k].asked;
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
                const gm_page_move_t *m = &s->moves[k];
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
        for (const gm_piece_t *p = gm_session_new_pieces(s); p; p = p->queue, i++) {
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
                gm_session_pieces_sent(s);
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

void gm_requests_answer_alloc(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out) {
        if (c->closed)
                return;
        if (c->local)
                return gm_local_answer_grant(c, request_id, out);
        if (out->kind == GM_OUTCOME_REFUSE) {
                gm_session_count_refusal(c->session);
                gm_request_refusal(c, request_id, out);
                return;
        }
        int r = send_alloc_reply(c, request_id, &out->alloc);
        if (r == -ENOMEM && !c->closed) {
                /* Nothing was sent: the block goes back, the client hears why. */
                gm_session_alloc_undo(c->session, out->alloc.block_id);
                gm_request_error(c, request_id, ENOMEM, "out of memory building the allocation's reply");
        }
}

static int handle_alloc(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Alloc *alloc = env->alloc;
        if (c->local)
                return gm_request_error(c, request_id, EPROTO, "a local session allocates in its own heap"), 0;
        /* Untrusted: a claim that cannot be true ends the session (a false
         * one within bounds only moves the liar's own pages early). */
        int r = alloc->n_fences_done > MAX_FENCES_DONE || alloc->n_other_frees_fenced > MAX_FENCES_DONE ? -EPROTO : 0;
        for (size_t i = 0; i < alloc->n_fences_done && r == 0; i++)
                r = gm_session_fence_done(c->session, alloc->fences_done[i]->stream, alloc->fences_done[i]->fence);
        if (r < 0) {
                gm_request_error(c, request_id, EPROTO,
                                 "allocation refused: its report of complete stream fences is too long or "
                                 "names a fence this session was never asked to mark");
                return r;
        }
        if (alloc->frees_fenced)
                gm_session_frees_fenced(c->session, alloc->stream);
        for (size_t i = 0; i < alloc->n_other_frees_fenced; i++)
                gm_session_frees_fenced(c->session, alloc->other_frees_fenced[i]);
        gm_frame_t frames[MAX_FRAMES];
        size_t n_frames = alloc->n_frames < MAX_FRAMES ? alloc->n_frames : MAX_FRAMES;
        for (size_t i = 0; i < n_frames; i++)
                frames[i] = (gm_frame_t){
                        .filename = alloc->frames[i]->filename,
                        .line = alloc->frames[i]->line,
                        .name = alloc->frames[i]->name,
                };
        gm_outcome_t out;
        gm_session_alloc(c->session, request_id, alloc->size, alloc->stream, frames, n_frames, &out);
        if (out.kind != GM_OUTCOME_PARK)
                gm_requests_answer_alloc(c, request_id, &out);
        return 0;
}

static int handle_free(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Free *f = env->free;
        if (gm_session_free_block(c->session, f->block_id, f->deferred) < 0)
                gm_request_error(c, request_id, EINVAL,
                                 "free of block %" PRIu64
                                 " refused: not a live block of this session (unknown id or double free)",
                                 f->block_id);
        return 0;
}

static int handle_free_completed(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        uint64_t block_id = env->free_completed->block_id;
        if (gm_session_free_completed(c->session, block_id) < 0)
                gm_request_error(c, request_id, EINVAL, "block %" PRIu64 " has no free pending completion", block_id);
        return 0;
}

static int handle_release_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__ReleaseAck *ack = env->release_ack;
        uint64_t release_id = ack->release_id;
        gm_release_range_t *kept = NULL;
        if (ack->n_not_released > 0 && !(kept = calloc(ack->n_not_released, sizeof(*kept))))
                return -ENOMEM;
        for (size_t i = 0; i < ack->n_not_released; i++)
                kept[i] = (gm_release_range_t){.segment_id = ack->not_released[i]->segment_id,
                                               .offset = ack->not_released[i]->offset};
        int r = gm_session_release_ack(c->session, release_id, kept, ack->n_not_released);
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
        return (trim->tenant && trim->tenant[0]) || (!c->session->heap && c->session->admin);
}

static const char *admin_for_trim(const gm_request_conn_t *c, const Gpumem__Envelope *env) {
        return trims_others(c, env->trim) ? "trimming other sessions" : NULL;
}

static int handle_trim(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Trim *trim = env->trim;
        gm_broker_t *b = c->rq->broker;
        uint64_t released = 0;
        if (!trims_others(c, trim)) {
                released = gm_session_trim(c->session);
        } else {
                const char *tenant =
                        trim->tenant && trim->tenant[0] && strcmp(trim->tenant, "*") != 0 ? trim->tenant : NULL;
                const gm_tenant_t *t = tenant ? gm_tenant_find(b, tenant) : NULL;
                if (tenant && !t)
                        return gm_request_error(c, request_id, ENOENT, "no tenant '%s'", tenant), 0;
                released = gm_broker_trim(b, tenant); /* local sessions give theirs back with their acks */
        }
        Gpumem__TrimReply reply = GPUMEM__TRIM_REPLY__INIT;
        reply.released_bytes = released;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_TRIM_REPLY;
        out.trim_reply = &reply;
        gm_request_send(c, request_id, &out, NULL, 0);
        return 0;
}

/* ---- re-attach ---- */

static int check_reattach(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len) {
        const Gpumem__Reattach *req = env->reattach;
        if (!c->session->reattaching)
                return snprintf(why, why_len, "Reattach without a resuming Hello"), -EPROTO;
        int r = gm_session_reattach_count(c->session, req->n_segments + req->n_blocks);
        if (r < 0)
                return snprintf(why, why_len, "re-attach reports too much"), r;
        for (size_t i = 0; i < req->n_segments; i++)
                if (req->segments[i]->n_mapped == 0 || req->segments[i]->n_mapped > MAX_REATTACH_PIECES)
                        return snprintf(why, why_len, "re-attach refused: %s", strerror(EINVAL)), -EINVAL;
        return 0;
}

static int reattach_segment(gm_session_t *s, const Gpumem__ReattachSegment *seg, const char **ret_why) {
        gm_reattach_range_t *ranges = calloc(seg->n_mapped, sizeof(*ranges));
        if (!ranges)
                return -ENOMEM;
        for (size_t i = 0; i < seg->n_mapped; i++)
                ranges[i] = (gm_reattach_range_t){.offset = seg->mapped[i]->offset, .length = seg->mapped[i]->length};
        int r = gm_session_reattach_segment(s, seg->segment_id, seg->va_size, seg->stream, ranges, seg->n_mapped,
                                            ret_why);
        free(ranges);
        return r;
}

static int handle_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Reattach *req = env->reattach;
        gm_session_t *s = c->session;
        if (c->local)
                return gm_local_reattach(c, request_id, req);
        int r = 0;
        for (size_t i = 0; i < req->n_segments && r == 0; i++) {
                const char *why = NULL;
                r = reattach_segment(s, req->segments[i], &why);
                if (r < 0 && why) {
                        gm_request_error(c, request_id, -r, "re-attach refused: segment %" PRIu64 ": %s",
                                         req->segments[i]->segment_id, why);
                        return r;
                }
                if (r == -ENOENT) {
                        gm_request_error(c, request_id, ENOENT,
                                         "re-attach refused: the ledger has no record of segment %" PRIu64
                                         " (offset and size as reported) for this session",
                                         req->segments[i]->segment_id);
                        return r;
                }
        }
        for (size_t i = 0; i < req->n_blocks && r == 0; i++) {
                const Gpumem__ReattachBlock *b = req->blocks[i];
                r = gm_session_reattach_block(s, b->block_id, b->segment_id, b->offset, b->size, b->requested_size,
                                              b->pending_free);
        }
        if (r == 0 && req->last)
                r = gm_session_reattach_finish(s);
        if (r < 0) {
                /* A report that contradicts itself ends the session; its memory
                 * is released (the client starts over). */
                gm_request_error(c, request_id, r, "re-attach refused: %s", strerror(-r));
                return r;
        }
        return req->last ? gm_reply_ok(c, request_id) : 0;
}

/* ---- the table ---- */

#define BODY(x) .body = GPUMEM__ENVELOPE__BODY_##x

static const gm_request_kind_t kinds[] = {
        {BODY(HELLO), .op = "hello", .handle = handle_hello},
        {BODY(ALLOC), .op = "alloc", .handle = handle_alloc},
        {BODY(FREE), .op = "free", .handle = handle_free},
        {BODY(FREE_COMPLETED), .op = "free_completed", .handle = handle_free_completed},
        {BODY(TRIM), .op = "trim", .handle = handle_trim, .admin_for = admin_for_trim},
        {BODY(STATS), .op = "stats", .handle = gm_handle_stats, .admin_for = gm_admin_for_stats,
         .check = gm_check_stats},
        {BODY(RELEASE_ACK), .op = "release_ack", .handle = handle_release_ack},
        {BODY(RESET_STATS), .op = "reset_stats", .handle = gm_handle_reset_stats,
         .admin_for = gm_admin_for_reset_stats},
        {BODY(HISTORY_CONTROL), .op = "history", .handle = gm_handle_history, .admin_for = gm_admin_for_history,
         .check = gm_check_history},
        {BODY(SNAPSHOT), .op = "snapshot", .handle = gm_handle_snapshot},
        {BODY(ALLOC_CONF), .op = "alloc_conf", .handle = gm_handle_alloc_conf, .admin_for = gm_admin_for_alloc_conf},
        {BODY(QUOTA), .op = "quota", .handle = gm_handle_quota, .admin_for = gm_admin_for_quota,
         .check = gm_check_quota},
        {BODY(CLIENTS), .op = "clients", .handle = gm_handle_clients},
        {BODY(REATTACH), .op = "reattach", .handle = handle_reattach, .check = check_reattach,
         .close_on_refusal = true},
        {BODY(GRANT), .op = "grant", .handle = gm_handle_grant},
        {BODY(RETURN_PIECES), .op = "return_pieces", .handle = gm_handle_return_pieces},
        {BODY(RETURN_INTENT), .op = "return_intent", .handle = gm_handle_return_intent},
        {BODY(MOVE_PIECES), .op = "move_pieces", .handle = gm_handle_move_pieces},
        {BODY(RECLAIM_ACK), .op = "reclaim_ack", .handle = gm_handle_reclaim_ack},
        {BODY(SNAPSHOT_ANSWER), .op = "snapshot_answer", .handle = gm_handle_snapshot_answer},
        {BODY(SAMPLES), .op = "samples", .handle = gm_handle_samples, .admin_for = gm_admin_for_samples},
};
#define N_KINDS (sizeof(kinds) / sizeof(kinds[0]))

size_t gm_request_op_names(const char *const **ret_names) {
        static const char *names[N_KINDS];
        for (size_t i = 0; i < N_KINDS; i++)
                names[i] = kinds[i].op;
        *ret_names = names;
        return N_KINDS;
}

int gm_request_index(Gpumem__Envelope__BodyCase body) {
        for (size_t i = 0; i < N_KINDS; i++)
                if (kinds[i].body == body)
                        return (int) i;
        return -1;
}

/* The order rules: Hello first, then (when resuming) Reattach until the last. */
static int check_order(gm_request_conn_t *c, const Gpumem__Envelope *env) {
        if (!c->hello_done && env->body_case != GPUMEM__ENVELOPE__BODY_HELLO) {
                gm_request_error(c, env->request_id, EPROTO, "the first request must be Hello");
                return -EPROTO;
        }
        if (c->session->reattaching && env->body_case != GPUMEM__ENVELOPE__BODY_REATTACH) {
                gm_request_error(c, env->request_id, EPROTO, "finish re-attaching first");
                return -EPROTO;
        }
        return 0;
}

static int dispatch(gm_request_conn_t *c, const gm_request_kind_t *k, const Gpumem__Envelope *env) {
        uint64_t rid = env->request_id;
        const char *what = k->admin_for ? k->admin_for(c, env) : NULL;
        if (what && !c->session->admin)
                return gm_request_error(c, rid, EPERM, "%s needs admin rights (uid 0 or the admin group)", what), 0;
        if (k->check) {
                char why[256] = "";
                int r = k->check(c, env, why, sizeof(why));
                if (r < 0) {
                        gm_request_error(c, rid, r, "%s", why);
                        return k->close_on_refusal ? r : 0;
                }
        }
        return k->handle(c, rid, env);
}

int gm_requests_dispatch(gm_request_conn_t *c, Gpumem__Envelope *env, int *fds, size_t n_fds) {
        const gm_requests_t *rq = c->rq;
        uint64_t rid = env->request_id;
        if (n_fds > 0) {
                /* Clients never send fds in protocol 1. */
                gm_close_fds(fds, n_fds);
                gm_request_error(c, rid, EBADMSG, "unexpected file descriptors in a request");
                return -EBADMSG;
        }
        int i = gm_request_index(env->body_case);
        if (i < 0) {
                gm_request_error(c, rid, EPROTO, "message type %d is not a request", (int) env->body_case);
                return -EPROTO;
        }
        int r = check_order(c, env);
        if (r < 0)
                return r;
        gm_session_touch(c->session, gm_now_ms());
        gm_diag_note_request(c, env);
        uint64_t t0 = gm_now_ns();
        r = dispatch(c, &kinds[i], env);
        if (rq->observe)
                rq->observe(rq->userdata, (unsigned) i, gm_now_ns() - t0);
        return r;
}
