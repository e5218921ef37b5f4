/* Central sessions: the heap runs here, over pieces made through the
 * allocator's provider; allocations, frees, page moves and stream fences. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "holder.h"
#include "size.h"
#include "text.h"

/* ---- the allocator's provider ---- */

static int provider_create(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset,
                           uint64_t size, uint64_t *ret_handle) {
        gm_session_t *s = userdata;
        gm_piece_spec_t spec = {.segment_id = segment_id,
                                .segment_va_size = segment_va_size,
                                .offset = offset,
                                .size = size,
                                .tag = s->cur_tag};
        gm_piece_t *p;
        int r = gm_piece_create(s, &spec, &p);
        if (r < 0)
                return r;
        p->in_heap = true;
        *ret_handle = (uint64_t) (uintptr_t) p;
        return 0;
}

/* A run of pages: the backend has no batch, so one piece each, made and
 * charged as one (gm_piece_create_run: all or nothing). */
static int provider_create_run(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset,
                               uint64_t page_size, uint64_t n_pages, uint64_t *handles) {
        gm_session_t *s = userdata;
        gm_piece_spec_t first = {.segment_id = segment_id,
                                 .segment_va_size = segment_va_size,
                                 .offset = offset,
                                 .size = page_size,
                                 .tag = s->cur_tag};
        gm_piece_t **pieces = n_pages <= SIZE_MAX / sizeof(*pieces) ? malloc(n_pages * sizeof(*pieces)) : NULL;
        int r = pieces ? gm_piece_create_run(s, &first, n_pages, pieces) : -ENOMEM;
        for (uint64_t k = 0; r == 0 && k < n_pages; k++) {
                pieces[k]->in_heap = true;
                handles[k] = (uint64_t) (uintptr_t) pieces[k];
        }
        free(pieces);
        return r;
}

static gm_page_move_t *pending_move(gm_session_t *s, const gm_piece_t *p) {
        for (size_t i = 0; i < s->n_moves; i++)
                if (s->moves[i].piece == p)
                        return &s->moves[i];
        return NULL;
}

static void provider_release(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle,
                             bool whole_segment) {
        gm_session_t *s = userdata;
        gm_piece_t *p = (gm_piece_t *) (uintptr_t) handle;
        gm_page_move_t *m = pending_move(s, p);
        if (m) {
                /* Its client never heard of the move: released where it maps it. */
                whole_segment = m->from_whole_segment;
                gm_piece_move(s->broker, p, m->from_segment_id, m->from_va_size, m->from_offset);
                memmove(m, m + 1, (size_t) (s->moves + s->n_moves - (m + 1)) * sizeof(*m));
                s->n_moves--;
        }
        gm_piece_release(s, p, whole_segment);
}

/* Page reuse: one piece moves in the daemon's books at once; its client
 * hears of it with the next allocation reply (a piece it was never sent is
 * sent at its new place). A place where a piece queued for release is
 * still mapped by the client cannot take it yet. */
static int move_one(gm_session_t *s, gm_piece_t *p, uint64_t from_segment, uint64_t from_offset, uint64_t to_segment,
                    uint64_t to_segment_va_size, uint64_t to_offset, uint64_t size, bool from_segment_empty) {
        if (p->segment_id != from_segment || p->offset != from_offset || p->phys.size != size)
                return -EINVAL;
        for (const gm_piece_t *q = s->rel_head; q; q = q->queue)
                if (q->segment_id == to_segment && q->offset == to_offset)
                        return -EBUSY;
        if (p->sent && !pending_move(s, p)) {
                if (s->n_moves == s->cap_moves) {
                        size_t cap = s->cap_moves ? 2 * s->cap_moves : 16;
                        gm_page_move_t *moves = realloc(s->moves, cap * sizeof(*moves));
                        if (!moves)
                                return -ENOMEM;
                        s->moves = moves;
                        s->cap_moves = cap;
                }
                s->moves[s->n_moves++] = (gm_page_move_t){
                        .piece = p,
                        .from_segment_id = from_segment,
                        .from_va_size = p->segment_va_size,
                        .from_offset = from_offset,
                        .from_whole_segment = from_segment_empty,
                };
        }
        gm_piece_move(s->broker, p, to_segment, to_segment_va_size, to_offset);
        return 0;
}

static int64_t provider_remap(void *userdata, const uint64_t *handles, uint64_t n_pages, uint64_t from_segment,
                              uint64_t from_offset, uint64_t to_segment, uint64_t to_segment_va_size,
                              uint64_t to_offset, uint64_t page_size, bool from_segment_empty) {
        uint64_t k = 0;
        int r = 0;
        for (; k < n_pages && r == 0; k++)
                r = move_one(userdata, (gm_piece_t *) (uintptr_t) handles[k], from_segment, from_offset + k * page_size,
                             to_segment, to_segment_va_size, to_offset + k * page_size, page_size,
                             from_segment_empty && k + 1 == n_pages);
        if (r < 0)
                k--;
        return k ? (int64_t) k : r;
}

/* Whether a client's frees are done when it sends them: memory of a kind
 * with no device streams has no work queued on it (no stream fences needed). */
static bool frees_synchronous(const gm_broker_t *b) {
        return !b->backend->ops->caps->device_streams;
}

/* The fence entry of `stream`, made on first use; NULL when the table is
 * full or out of memory. */
static gm_session_fence_t *session_fence(gm_session_t *s, uint64_t stream, bool make) {
        for (size_t i = 0; i < s->n_fences; i++)
                if (s->fences[i].stream == stream)
                        return &s->fences[i];
        if (!make || s->n_fences == GM_SESSION_FENCE_STREAMS)
                return NULL;
        if (!s->fences && !(s->fences = calloc(GM_SESSION_FENCE_STREAMS, sizeof(*s->fences))))
                return NULL;
        s->fences[s->n_fences] = (gm_session_fence_t){.stream = stream};
        return &s->fences[s->n_fences++];
}

/* Page reuse's stream fences for a central session: the client's device
 * work is not visible here, so a new fence number goes to the client with
 * the next allocation reply (it records an event on the stream) and what is
 * complete is what the client last reported; a page freed after that waits
 * (the heap maps new memory instead). Frees on the host backend are
 * synchronous (every free page may move, no callback). */
static int provider_stream_fence(void *userdata, uint64_t stream, uint64_t fence, uint64_t *ret_done) {
        gm_session_fence_t *f = session_fence(userdata, stream, true);
        if (!f)
                return -ENOSPC;
        if (fence > f->asked)
                f->asked = fence;
        *ret_done = f->done;
        return 0;
}

int gm_session_central_fence_done(gm_session_t *s, uint64_t stream, uint64_t fence) {
        if (s->ended)
                return 0; /* nothing moves any more */
        gm_session_fence_t *f = session_fence(s, stream, false);
        if (!f || fence > f->sent)
                return -EPROTO;
        if (fence > f->done) /* a lower one is stale: a later event on the stream was found complete */
                f->done = fence;
        return 0;
}

bool gm_session_central_client_fences(const gm_session_t *s) {
        const gm_alloc_config_t *conf = &s->broker->alloc_config;
        return !s->local && conf->page_reuse && conf->expandable_segments && !frees_synchronous(s->broker);
}

void gm_session_central_frees_fenced(gm_session_t *s, uint64_t stream) {
        if (s->ended || !s->heap)
                return; /* nothing was ever freed (a host heap never asks: entries made here stay unused) */
        gm_session_fence_t *f = session_fence(s, stream, true);
        uint64_t fence = gm_heap_free_count(s->heap);
        if (!f || fence <= f->done)
                return; /* a full table only loses the claim: those pages wait for an asked fence */
        f->done = fence;
        if (f->sent < fence)
                f->sent = fence;
        if (f->asked < fence)
                f->asked = fence;
}

/* The heap's may_release(): nothing is released or moved for a miss on a
 * stream the client said it captures (Alloc.capturing): the release would
 * reach the client as a ReleaseRequest, whose synchronize and unmap
 * invalidate the capture, and a move would remap memory under it. */
static bool provider_may_release(void *userdata, uint64_t stream) {
        const gm_session_t *s = userdata;
        (void) stream; /* the flag is for the allocation's own stream */
        return !s->cur_capturing;
}

/* Records allocator events in the session's own history while it is on,
 * else in the device's while that is on: each event in one ring only. */
static void provider_trace(void *userdata, int action, uint64_t addr, uint64_t size, uint64_t stream) {
        gm_session_t *s = userdata;
        gm_broker_t *b = s->broker;
        gm_history_t *h = s->history ? s->history : b->history;
        if (!h)
                return;
        gm_history_entry_t e = {
                .action = action,
                .addr = addr,
                .size = size,
                .stream = stream,
                .time_us = gm_realtime_us(),
                .pid = (uint32_t) s->pid,
                .session_id = s->id,
        };
        if (action == GM_TRACE_OOM) {
                uint64_t free_bytes = 0, total = 0;
                if (b->backend->ops->mem_info(b->backend, &free_bytes, &total) == 0)
                        e.addr = free_bytes; /* PyTorch's device_free */
        }
        bool with_frames = action == GM_TRACE_ALLOC || action == GM_TRACE_OOM;
        /* A failed record only loses this entry; allocation goes on. */
        gm_history_record(h, &e, with_frames ? s->cur_frames : NULL, with_frames ? s->n_cur_frames : 0);
}

int gm_session_central_heap(gm_session_t *s, gm_heap_t **ret_heap) {
        if (s->heap) {
                *ret_heap = s->heap;
                return 0;
        }
        gm_broker_t *b = s->broker;
        if (!s->tenant || s->ended)
                return -ESHUTDOWN;
        if (s->local)
                return -EPROTO; /* its heap runs in its client */
        bool synchronous = frees_synchronous(b);
        gm_provider_t provider = {
                .create = provider_create,
                .create_run = provider_create_run,
                .release = provider_release,
                .trace = provider_trace,
                .remap = provider_remap,
                .stream_fence = synchronous ? NULL : provider_stream_fence,
                .may_release = synchronous ? NULL : provider_may_release, /* no device streams: no captures */
                .userdata = s,
        };
        gm_heap_params_t params = {
                .capacity = b->backend->capacity,
                .va_cursor = &b->va_cursor,
                .granularity = b->backend->granularity,
                .extra_sinks = {&s->tenant->stats, &b->device_stats, NULL},
                .defer_oom = true, /* a refusal may still be parked: counted when answered */
        };
        int r = gm_heap_new(&b->alloc_config, &provider, &params, &s->heap);
        if (r < 0)
                return r;
        *ret_heap = s->heap;
        return 0;
}

uint64_t gm_session_central_trim(gm_session_t *s) {
        if (!s->heap || s->ended)
                return 0;
        uint64_t released = gm_heap_release_cached(s->heap);
        gm_session_flush_releases(s);
        return released;
}

/* ---- allocations ---- */

/* The rest of an allocation's reply: what the session has to tell its client. */
static void reply_of(const gm_session_t *s, gm_outcome_t *out) {
        out->new_pieces = s->new_head;
        out->moves = s->moves;
        out->n_moves = s->n_moves;
        out->n_marks = 0;
        for (size_t k = 0; k < s->n_fences; k++)
                if (s->fences[k].asked > s->fences[k].sent)
                        out->marks[out->n_marks++] =
                                (gm_fence_mark_t){.stream = s->fences[k].stream, .fence = s->fences[k].asked};
}

int gm_session_central_try_alloc(gm_session_t *s, uint64_t size, uint64_t stream, unsigned tag, bool capturing,
                                 gm_outcome_t *out) {
        gm_broker_t *b = s->broker;
        gm_heap_t *heap;
        int r = gm_session_central_heap(s, &heap);
        if (r == -EPROTO)
                return gm_outcome_refuse(out, r, "gpumemd: a local session allocates in its own heap");
        if (r < 0)
                return gm_outcome_refuse(out, r, "gpumemd: cannot create the session's allocator: %s", strerror(-r));
        if (gm_heap_live_blocks(heap) >= b->limits.max_blocks_per_session)
                return gm_outcome_refuse(out, -ENOBUFS, "gpumemd: session limit of %" PRIu64 " live blocks reached",
                                         b->limits.max_blocks_per_session);
        if (size == 0)
                return gm_outcome_refuse(out, -EINVAL, "gpumemd: allocation of size 0");
        if (size > b->backend->capacity) {
                char a[32], c[32];
                return gm_outcome_refuse(
                        out, -ENOMEM, "gpumemd: tried to allocate %s, more than the device's capacity of %s",
                        gm_format_size(size, a, sizeof(a)), gm_format_size(b->backend->capacity, c, sizeof(c)));
        }
        /* The tenant's quota is also the heap's limit: its garbage collection
         * aims below it (PyTorch's garbage_collection_threshold). */
        gm_heap_set_limit(heap, s->tenant->quota, &s->tenant->stats);
        s->cur_tag = (uint8_t) tag;   /* the provider books new pieces under it */
        s->cur_capturing = capturing; /* provider_may_release() answers from it */
        r = gm_heap_alloc_tagged(heap, size, stream, tag, &out->alloc);
        s->cur_tag = 0;
        s->cur_capturing = false;
        if (r == 0) {
                out->kind = GM_OUTCOME_REPLY;
                reply_of(s, out);
                return 0;
        }
        if (r != -ENOMEM && r != -EDQUOT) {
                const char *detail = gm_backend_last_error(b->backend);
                gm_host_log(b, LOG_WARNING, "session %" PRIu64 ": allocation of %" PRIu64 " bytes failed: %s%s%s",
                            s->id, size, strerror(-r), detail[0] ? ": " : "", detail);
                return gm_outcome_refuse(out, r, "gpumemd: allocation failed: %s%s%s", strerror(-r),
                                         detail[0] ? ": " : "", detail);
        }
        return r; /* the heap queued its own cache's release: reclaim sends it and decides */
}

void gm_session_central_count_reclaim_wait(gm_session_t *s) {
        if (s->heap)
                gm_heap_count_reclaim_wait(s->heap);
}

void gm_session_central_count_refusal(gm_session_t *s) {
        if (s->heap)
                gm_heap_count_oom(s->heap);
}

const gm_piece_t *gm_session_central_new_pieces(const gm_session_t *s) {
        return s->new_head;
}

void gm_session_central_pieces_sent(gm_session_t *s) {
        s->n_moves = 0;
        for (size_t i = 0; i < s->n_fences; i++)
                s->fences[i].sent = s->fences[i].asked;
        uint64_t now_ms = s->new_head ? gm_now_ms() : 0;
        while (s->new_head) {
                gm_piece_t *p = s->new_head;
                s->new_head = p->queue;
                p->queue = NULL;
                p->sent = true;
                p->handed_ms = now_ms;
        }
        s->new_tail = NULL;
}

void gm_session_central_alloc_undo(gm_session_t *s, uint64_t block_id) {
        if (s->heap)
                gm_heap_free(s->heap, block_id, false);
}

int gm_session_central_free_block(gm_session_t *s, uint64_t block_id, bool deferred) {
        return s->heap ? gm_heap_free(s->heap, block_id, deferred) : -ENOENT;
}

int gm_session_central_free_completed(gm_session_t *s, uint64_t block_id) {
        return s->heap ? gm_heap_free_completed(s->heap, block_id) : -ENOENT;
}
