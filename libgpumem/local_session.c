/* A local session: its heap (local_heap.c) runs in this process. This file
 * is the heap's provider (grants, give-backs, page moves, the statistics
 * page and its swap after a re-attach), the service thread's chores for it
 * (Reclaim, new settings, completed frees) and its part of the daemon's
 * snapshots: the daemon asks (SnapshotQuery) for the heap's segments,
 * blocks and trace, answered in allocator/snapshot.h's answer format in
 * SnapshotAnswer packets; HistoryPush turns the heap's own trace ring on and
 * off as the daemon's memory history goes. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capture.h"
#include "debug.h"
#include "frees.h"
#include "ipc.h"
#include "local_heap.h"
#include "local_session.h"
#include "mapping.h"
#include "msg.h"
#include "snapshot.h"

/* ---- the local heap's side of the wire ---- */

static void local_give_back(void *ctx, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t n_pieces,
                            bool whole_segment);

/* Whether the piece at `offset` of a segment failed to unmap and is still
 * mapped here (so still granted: the heap may take it back as it is). */
static bool kept_piece(const gpumem_client *c, const segment_t *seg, uint64_t size, uint64_t offset) {
        for (size_t i = 0; c->kept_bytes && seg && seg->piece_size == size && i < seg->n_pieces; i++)
                if (seg->pieces[i] == offset)
                        return true;
        return false;
}

/* Whether a grant reply brings exactly the n pieces asked for at `offset`
 * on, and they are mapped here. */
static bool granted_as_asked(const gpumem_client *c, const Gpumem__GrantReply *gr, const gm_local_heap_grant_t *g,
                             uint64_t offset, uint64_t n) {
        const segment_t *seg = gm_u64map_get(&c->segments, g->segment_id);
        if (!gr->mapping || gr->n_more_mappings != n - 1 || !seg || seg->va_size != g->segment_va_size)
                return false;
        for (uint64_t k = 0; k < n; k++) {
                const Gpumem__Mapping *m = k ? gr->more_mappings[k - 1] : gr->mapping;
                if (m->segment_id != g->segment_id || m->offset != offset + k * g->size || m->length != g->size)
                        return false;
        }
        return true;
}

/* A grant's pieces came but could not be mapped here: the granting thread
 * gives them back (grant_run). Under heap_lock, held by that thread. */
static void grant_unmapped(gpumem_client *c, const Gpumem__Envelope *reply) {
        if (reply->body_case == GPUMEM__ENVELOPE__BODY_GRANT_REPLY)
                c->grant_unmapped = true;
}

static const gm_conn_request_ops_t grant_ops = {.unmapped = grant_unmapped};

/* One Grant for n pieces from `offset` (n <= max_grant_pieces: their fds
 * come in one packet); the reply's mappings are made by whichever thread reads it,
 * before this returns. All or nothing: pieces that cannot all be mapped go
 * back (with whole_segment when `whole_at_first`: the segment had no piece
 * before). Caller holds heap_lock. */
static int grant_run(gpumem_client *c, const gm_local_heap_grant_t *g, uint64_t offset, uint64_t n, bool whole_at_first,
                     int64_t wait_ms) {
        Gpumem__Grant grant = GPUMEM__GRANT__INIT;
        grant.segment_id = g->segment_id;
        grant.segment_va_size = g->segment_va_size;
        grant.offset = offset;
        grant.size = g->size;
        grant.n_pieces = (uint32_t) n;
        grant.block_size = g->block_size;
        grant.largest_free = g->largest_free;
        grant.will_retry = g->will_retry;
        grant.wait_for_memory = wait_ms >= 0;
        grant.wait_ms = wait_ms > 0 ? (uint32_t) wait_ms : 0;
        if (g->tag) { /* the daemon books the pieces under the pool's name, by this session's id of it */
                grant.tag = (char *) gm_pool_name(&c->pools, g->tag);
                grant.tag_id = g->tag;
        }
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_GRANT;
        env.grant = &grant;
        Gpumem__Envelope *reply = NULL;
        int r = gm_conn_call_expect(c, &env, &grant_ops, GPUMEM__ENVELOPE__BODY_GRANT_REPLY, &reply);
        if (r < 0 && c->grant_unmapped) {
                /* Granted but not mappable here: the daemon takes them back. */
                c->grant_unmapped = false;
                local_give_back(c, g->segment_id, offset, g->size, n, whole_at_first);
        }
        if (r < 0)
                return r;
        bool mapped = granted_as_asked(c, reply->grant_reply, g, offset, n);
        gm_msg_free(reply);
        if (!mapped) {
                local_give_back(c, g->segment_id, offset, g->size, n, whole_at_first);
                return gm_conn_set_error(c, -EPROTO, "gpumem: the daemon granted another piece than asked for");
        }
        return 0;
}

/* Asks the daemon for pieces, all or nothing: a run of pages in one Grant
 * per max_grant_pieces pieces (a piece kept mapped after a failed unmap is
 * taken back as it is). On failure what was granted goes back, with the
 * segment's range too when it had no piece before and `may_forget`. wait_ms
 * < 0: the heap's grant; else a wake's, that waits for memory (0: the
 * daemon's park_timeout_ms). Caller holds heap_lock. */
static int grant_pieces(gpumem_client *c, const gm_local_heap_grant_t *g, bool may_forget, int64_t wait_ms) {
        const segment_t *seg = gm_u64map_get(&c->segments, g->segment_id);
        bool new_segment = may_forget && (!seg || seg->n_pieces == 0);
        uint64_t done = 0;
        int r = 0;
        while (r == 0 && done < g->n_pieces) {
                uint64_t offset = g->offset + done * g->size, n = 0;
                seg = gm_u64map_get(&c->segments, g->segment_id);
                if (kept_piece(c, seg, g->size, offset)) {
                        gm_assert(c->kept_bytes >= g->size); /* it counts every kept piece */
                        c->kept_bytes -= g->size;
                        done++;
                        continue;
                }
                while (done + n < g->n_pieces && n < c->max_grant_pieces &&
                       (n == 0 || !kept_piece(c, seg, g->size, offset + n * g->size)))
                        n++;
                r = grant_run(c, g, offset, n, new_segment && done == 0, wait_ms);
                done += r == 0 ? n : 0;
        }
        if (r < 0)
                local_give_back(c, g->segment_id, g->offset, g->size, done, new_segment);
        return r;
}

static int local_grant(void *ctx, const gm_local_heap_grant_t *g) {
        return grant_pieces(ctx, g, true, -1);
}

int gm_local_session_regrant(gpumem_client *c, const gm_local_heap_grant_t *g, uint32_t wait_ms) {
        return grant_pieces(c, g, false, wait_ms);
}

/* Ranges one ReturnPieces names here (the daemon takes up to 512); on the
 * stack of the application's thread. */
#define RETURNS_PER_MESSAGE 64

/* Where the daemon asks for it, announces a give-back before anything is
 * unmapped (the daemon notes the process's device memory then) and waits for
 * its answer; whether one is open now. */
static bool open_return_intent(gpumem_client *c) {
        if (!c->return_intents)
                return false;
        Gpumem__ReturnIntent intent = GPUMEM__RETURN_INTENT__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RETURN_INTENT;
        env.return_intent = &intent;
        Gpumem__Envelope *reply = NULL;
        if (gm_conn_call_expect(c, &env, NULL, GPUMEM__ENVELOPE__BODY_OK, &reply) < 0)
                return false; /* returned all the same, checked against an older reference */
        gm_msg_free(reply);
        return true;
}

/* Unmaps pieces [offset, offset + n_pieces * size) of a segment and tells
 * the daemon they are free, one ReturnPieces per RETURNS_PER_MESSAGE (the
 * last piece carries whole_segment; the last message closes the intent,
 * naming no range when nothing could be unmapped). Caller holds heap_lock,
 * which keeps one give-back at a time. */
static void local_give_back(void *ctx, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t n_pieces,
                            bool whole_segment) {
        gpumem_client *c = ctx;
        Gpumem__Range ranges[RETURNS_PER_MESSAGE], *ptrs[RETURNS_PER_MESSAGE];
        Gpumem__ReturnPieces ret = GPUMEM__RETURN_PIECES__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RETURN_PIECES;
        env.return_pieces = &ret;
        ret.ranges = ptrs;
        /* A kernel queued before a free may still use the pieces: wait for
         * the whole device first, unless no free came since the last wait
         * (PyTorch synchronizes before it releases cached blocks too; the
         * block's own stream is not enough, a record_stream'ed one or a
         * non-blocking stream may write it). */
        if (n_pieces > 0 && c->local_frees != c->local_frees_synced) {
                gm_mapping_sync_device(c);
                c->local_frees_synced = c->local_frees;
        }
        bool intent = n_pieces > 0 && open_return_intent(c);
        pthread_mutex_lock(&c->lock);
        for (uint64_t k = 0; k < n_pieces; k++) {
                Gpumem__Range *range = &ranges[ret.n_ranges];
                gpumem__range__init(range);
                range->segment_id = segment_id;
                range->offset = offset + k * size;
                range->length = size;
                range->whole_segment = whole_segment && k + 1 == n_pieces;
                /* Never acknowledged unmapped when it is not: the daemon would
                 * hand the memory to the driver (and another process) under a
                 * mapping. A segment unknown here never mapped. */
                if (!gm_u64map_get(&c->segments, segment_id) || gm_mapping_unmap(c, range))
                        ptrs[ret.n_ranges++] = range;
                else
                        c->kept_bytes += size;
                ret.closes_intent = intent && k + 1 == n_pieces;
                if (ret.n_ranges == RETURNS_PER_MESSAGE || ((ret.n_ranges || intent) && k + 1 == n_pieces)) {
                        gm_conn_post_locked(c, &env);
                        ret.n_ranges = 0;
                }
        }
        pthread_mutex_unlock(&c->lock);
}

void gm_local_session_give_back(gpumem_client *c, uint64_t segment_id, uint64_t offset, uint64_t size,
                                uint64_t n_pieces) {
        local_give_back(c, segment_id, offset, size, n_pieces, false);
}

/* Whether the application's `stream` is being captured into a CUDA graph;
 * one that is not is forgotten by the process's record of captures
 * (capture.h), the block of one that is goes into it once allocated. */
static int local_capturing(void *ctx, uint64_t stream) {
        gpumem_client *c = ctx;
        int r = c->mapper->ops->capturing(c->mapper, stream);
        if (r == 0)
                gm_capture_forget_stream(stream);
        return r;
}

/* A local heap's miss starts a release unless a capture is in progress in
 * the process (its record asks the noted streams again: one whose capture
 * ended no longer holds a miss); a declared capture waits until it ends. */
static bool local_release_begin(void *ctx) {
        gpumem_client *c = ctx;
        return gm_capture_release_begin(gm_mapping_capture_query(c), c);
}

static void local_release_end(void *ctx) {
        (void) ctx;
        gm_capture_release_end();
}

/* Pieces one MovePieces names at most (the daemon's limit). */
#define MAX_MOVES_PER_MESSAGE 512

/* Page reuse in a local heap: moves a run of pieces here, in order, and
 * tells the daemon, one message per MAX_MOVES_PER_MESSAGE moved (its ledger
 * follows; no reply). Caller holds heap_lock. */
static int64_t local_move(void *ctx, const gm_local_heap_move_t *m) {
        gpumem_client *c = ctx;
        uint64_t batch = m->n_pages < MAX_MOVES_PER_MESSAGE ? m->n_pages : MAX_MOVES_PER_MESSAGE, done = 0;
        Gpumem__PageMove *moves = calloc(batch ? batch : 1, sizeof(*moves));
        Gpumem__PageMove **ptrs = calloc(batch ? batch : 1, sizeof(*ptrs));
        int r = moves && ptrs ? 0 : -ENOMEM;
        pthread_mutex_lock(&c->lock);
        while (r == 0 && done < m->n_pages) {
                size_t n = 0;
                for (; r == 0 && n < batch && done < m->n_pages; n += r == 0) {
                        Gpumem__PageMove *move = &moves[n];
                        gpumem__page_move__init(move);
                        move->from_segment_id = m->from_segment;
                        move->from_offset = m->from_offset + done * m->page_size;
                        move->to_segment_id = m->to_segment;
                        move->to_segment_va_size = m->to_segment_va_size;
                        move->to_offset = m->to_offset + done * m->page_size;
                        move->length = m->page_size;
                        move->from_whole_segment = m->from_segment_empty && done + 1 == m->n_pages;
                        ptrs[n] = move;
                        if ((r = gm_mapping_move(c, move)) == 0)
                                done++;
                }
                if (n == 0)
                        break;
                Gpumem__MovePieces mp = GPUMEM__MOVE_PIECES__INIT;
                mp.n_moves = n;
                mp.moves = ptrs;
                Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
                env.body_case = GPUMEM__ENVELOPE__BODY_MOVE_PIECES;
                env.move_pieces = &mp;
                gm_conn_post_locked(c, &env); /* lost with the connection: the re-attach reports where it is */
        }
        pthread_mutex_unlock(&c->lock);
        free(moves);
        free(ptrs);
        return done ? (int64_t) done : r;
}

int gm_local_session_open(gpumem_client *c, const Gpumem__HelloReply *hr, int page_fd) {
        int r = gm_statpage_map(page_fd, true, &c->stats_page);
        if (r < 0)
                return gm_conn_set_error(c, -EPROTO, "gpumem: the daemon's statistics page is unusable: %s",
                                         strerror(-r));
        madvise(c->stats_page, GM_STATPAGE_SIZE, MADV_DONTFORK); /* a forked child never writes the parent's */
        bool events = c->mapper->ops->caps->device_streams;
        gm_local_heap_ops_t ops = {
                .grant = local_grant,
                .give_back = local_give_back,
                .move = c->mapper->ops->move ? local_move : NULL,
                .event_record = events ? gm_mapping_event_record : NULL,
                .event_query = events ? gm_mapping_event_query : NULL,
                .event_destroy = events ? gm_mapping_event_destroy : NULL,
                .capturing = c->mapper->ops->capturing ? local_capturing : NULL,
                .release_begin = local_release_begin,
                .release_end = local_release_end,
                .ctx = c,
        };
        char err[256] = "";
        r = gm_local_heap_new(hr->alloc_conf, hr->capacity, hr->granularity, c->stats_page, &ops, &c->heap, err,
                              sizeof(err));
        if (r < 0)
                return gm_conn_set_error(c, r, "gpumem: cannot start the local heap: %s", err[0] ? err : strerror(-r));
        c->local = true;
        if (hr->history_max_entries) /* the daemon's memory history is on: record from the first allocation */
                gm_local_heap_history(c->heap, true, hr->history_max_entries, (uint32_t) getpid());
        return 0;
}

/* The new daemon's page takes the old one's place at the same address (the
 * heap keeps its statistics there), with its figures. Caller holds
 * heap_lock. Consumes page_fd. */
static void local_page_swap(gpumem_client *c, int page_fd) {
        gm_heap_stats_area_t figures; /* 17 KiB of stack: the heap's and its pools' figures */
        size_t len = c->stats_page->payload_size < sizeof(figures) ? c->stats_page->payload_size : sizeof(figures);
        memcpy(&figures, gm_statpage_payload(c->stats_page), len);
        void *p = mmap(c->stats_page, GM_STATPAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, page_fd, 0);
        if (p != MAP_FAILED) {
                madvise(p, GM_STATPAGE_SIZE, MADV_DONTFORK);
                gm_statpage_write_begin(c->stats_page);
                memcpy(gm_statpage_payload(c->stats_page), &figures, len);
                gm_statpage_write_end(c->stats_page);
        }
        close(page_fd);
}

int gm_local_session_page_replace(gpumem_client *c, int page_fd) {
        struct stat st;
        int seals = fcntl(page_fd, F_GET_SEALS);
        bool usable = c->stats_page && fstat(page_fd, &st) == 0 && st.st_size == GM_STATPAGE_SIZE && seals >= 0 &&
                      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW);
        if (!usable) {
                close(page_fd);
                return 0;
        }
        if (c->page_fd_pending >= 0)
                close(c->page_fd_pending);
        c->page_fd_pending = -1;
        if (gm_heap_lock_try(&c->heap_lock)) {
                local_page_swap(c, page_fd);
                gm_heap_lock_drop(&c->heap_lock);
        } else {
                c->page_fd_pending = page_fd;
        }
        return 0;
}

/* The service thread's part of gm_local_session_page_replace(), holding neither lock;
 * a busy heap is tried again at the next poll. Returns true while a page
 * waits. */
static bool local_page_replace_pending(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        bool waiting = c->page_fd_pending >= 0;
        if (waiting && gm_heap_lock_try(&c->heap_lock)) {
                /* heap_lock goes before lock, so only a trylock may come after it */
                local_page_swap(c, c->page_fd_pending);
                c->page_fd_pending = -1;
                waiting = false;
                gm_heap_lock_drop(&c->heap_lock);
        }
        pthread_mutex_unlock(&c->lock);
        return waiting;
}

/* Local mode: frees whose stream work is done return their blocks to the
 * heap. Service thread only, holding neither lock; a busy heap is tried
 * again at the next poll. Returns true while some wait. */
static bool finish_completed_frees(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        pending_free_t *done = c->completed_frees;
        c->completed_frees = NULL;
        pthread_mutex_unlock(&c->lock);
        if (!done)
                return false;
        if (!gm_heap_lock_try(&c->heap_lock)) {
                pthread_mutex_lock(&c->lock);
                pending_free_t **tail = &done;
                while (*tail)
                        tail = &(*tail)->next;
                *tail = c->completed_frees;
                c->completed_frees = done;
                pthread_mutex_unlock(&c->lock);
                return true;
        }
        while (done) {
                pending_free_t *p = done;
                done = p->next;
                gm_local_heap_free_completed(c->heap, p->block_id);
                gm_frees_destroy(c, p, true);
        }
        gm_heap_lock_drop(&c->heap_lock);
        return false;
}

uint64_t gm_local_session_release_cached(gpumem_client *c) {
        /* A sleeping pool's memory is back already: the heap holds it, and gives nothing of it twice. */
        uint64_t kept = c->kept_bytes;
        uint64_t released = gm_local_heap_release_cached(c->heap);
        gm_assert(c->kept_bytes >= kept); /* a give-back only adds to it */
        uint64_t newly_kept = c->kept_bytes - kept;
        return released > newly_kept ? released - newly_kept : 0;
}

/* Serves the daemon's Reclaim: the heap gives its idle cached memory back
 * (ReturnPieces), then the acknowledgement follows. While a capture is in
 * progress in the process (capture.h) it waits, and is served once the
 * capture ends: its synchronize would invalidate the capture. Service thread
 * only, holding neither lock; a busy heap or a capture is tried again at the
 * next poll. Returns true while a reclaim waits. */
static bool serve_reclaim(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        uint64_t id = c->reclaim_id;
        pthread_mutex_unlock(&c->lock);
        if (!id)
                return false;
        if (!gm_heap_lock_try(&c->heap_lock))
                return true;
        /* The device's queued work is waited for without the heap's lock,
         * so the application's frees go on meanwhile; the give-back waits
         * again only for frees that came since. */
        uint64_t frees = c->local_frees;
        gm_heap_lock_drop(&c->heap_lock);
        if (!gm_capture_release_begin(gm_mapping_capture_query(c), c))
                return true;
        gm_mapping_sync_device(c);
        if (!gm_heap_lock_try(&c->heap_lock)) {
                gm_capture_release_end();
                return true;
        }
        if (c->local_frees_synced < frees)
                c->local_frees_synced = frees;
        uint64_t released = gm_local_session_release_cached(c);
        gm_heap_lock_drop(&c->heap_lock);
        gm_capture_release_end();
        Gpumem__ReclaimAck ack = GPUMEM__RECLAIM_ACK__INIT;
        ack.reclaim_id = id;
        ack.released_bytes = released;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RECLAIM_ACK;
        env.reclaim_ack = &ack;
        pthread_mutex_lock(&c->lock);
        if (c->reclaim_id == id)
                c->reclaim_id = 0;
        env.request_id = ++c->next_request_id;
        pthread_mutex_unlock(&c->lock);
        gm_conn_send(c, &env);
        return false;
}

/* Gives the daemon's new allocator settings to the heap. Service thread
 * only, holding neither lock; a busy heap is tried again at the next poll.
 * Returns true while they wait. */
static bool serve_alloc_conf(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        char *conf = c->alloc_conf_update;
        c->alloc_conf_update = NULL;
        pthread_mutex_unlock(&c->lock);
        if (!conf)
                return false;
        if (!gm_heap_lock_try(&c->heap_lock)) {
                pthread_mutex_lock(&c->lock);
                if (!c->alloc_conf_update) /* a newer one wins */
                        c->alloc_conf_update = conf;
                else
                        free(conf);
                pthread_mutex_unlock(&c->lock);
                return true;
        }
        char err[256];
        int r = gm_local_heap_set_config(c->heap, conf, err, sizeof(err));
        gm_heap_lock_drop(&c->heap_lock);
        free(conf);
        if (r < 0) {
                pthread_mutex_lock(&c->lock);
                snprintf(c->async_error, sizeof(c->async_error), "gpumem: the daemon's new alloc_conf was refused: %s",
                         err);
                pthread_mutex_unlock(&c->lock);
        }
        return false;
}

/* ---- allocation ---- */

int gm_local_session_alloc(gpumem_client *c, size_t size, uint64_t stream, const gm_frame_t *trace_frames,
                           size_t n_trace, void **ret_ptr) {
        gm_alloc_result_t res;
        gm_heap_lock_take(&c->heap_lock);
        block_t *b = c->spare_blocks;
        if (b)
                c->spare_blocks = b->next_spare;
        else
                b = malloc(sizeof(*b));
        if (!b) {
                gm_heap_lock_drop(&c->heap_lock);
                return gm_conn_set_error(c, -ENOMEM, "gpumem: out of host memory");
        }
        unsigned tag = gm_pool_current(&c->pools);
        int r = gm_local_heap_alloc(c->heap, size, stream, tag, trace_frames, n_trace, &res);
        if (__builtin_expect(r == -EAGAIN, 0)) { /* its pool sleeps (the heap holds it) */
                gm_heap_lock_drop(&c->heap_lock);
                free(b);
                const char *name = gm_pool_name(&c->pools, tag);
                return gm_conn_set_error(c, -EAGAIN, "gpumem: %s%s%s is asleep: gpumem_wake() first",
                                         name[0] ? "pool '" : "the default pool", name, name[0] ? "'" : "");
        }
        if (r < 0) {
                bool told = gm_local_heap_refused_by_daemon(c->heap);
                bool in_capture = gm_local_heap_missed_in_capture(c->heap);
                bool held = gm_local_heap_held_for_capture(c->heap);
                gm_heap_lock_drop(&c->heap_lock);
                free(b);
                if ((in_capture || held) && (r == -ENOMEM || r == -EDQUOT))
                        return gm_frees_refused_in_capture(c, r, size, stream, told, held);
                if (told || (r != -ENOMEM && r != -EDQUOT && gm_conn_error_is_for(c)))
                        return r; /* the daemon's diagnosis (or the grant's failure) is the thread's error */
                return gm_conn_set_error(c, r, "gpumem: out of memory allocating %zu bytes: %s", size,
                                         size > c->capacity ? "more than the device's capacity"
                                         : r == -EDQUOT     ? "over the tenant's quota"
                                                            : "over this process's memory fraction "
                                                              "(per_process_memory_fraction)");
        }
        segment_t *seg = c->last_segment;
        if (!seg || seg->id != res.segment_id)
                c->last_segment = seg = gm_u64map_get(&c->segments, res.segment_id);
        gm_assert(!seg || res.offset + res.size <= seg->va_size); /* the heap carves inside its segment */
        uint64_t ptr = seg ? seg->base + res.offset : 0;
        *b = (block_t){.id = res.block_id,
                       .size = res.size,
                       .requested = size,
                       .offset = res.offset,
                       .segment_id = res.segment_id,
                       .stream = stream};
        /* A miss while its stream is captured: the capture counts as in
         * progress (for Reclaims and trims) while the block lives. */
        if (__builtin_expect(gm_local_heap_missed_in_capture(c->heap), 0))
                b->captured = gm_capture_note_block(stream);
        if (seg && !seg->has_stream) {
                seg->stream = stream;
                seg->has_stream = true;
        }
        r = seg ? gm_u64map_put(&c->blocks, ptr, b) : -EPROTO;
        if (r < 0) {
                gm_local_heap_free(c->heap, res.block_id, false);
                gm_heap_lock_drop(&c->heap_lock);
                free(b);
                return gm_conn_set_error(c, r, "gpumem: cannot track the block: %s", strerror(-r));
        }
        gm_heap_lock_drop(&c->heap_lock);
        *ret_ptr = (void *) (uintptr_t) ptr;
        return 0;
}

__attribute__((noinline)) int gm_local_session_alloc_frames(gpumem_client *c, size_t size, uint64_t stream,
                                                            const gpumem_frame *frames, size_t n_frames,
                                                            void **ret_ptr) {
        gm_frame_t trace_frames[GPUMEM_MAX_FRAMES];
        size_t n_trace = n_frames < GPUMEM_MAX_FRAMES ? n_frames : GPUMEM_MAX_FRAMES;
        for (size_t i = 0; i < n_trace; i++)
                trace_frames[i] =
                        (gm_frame_t){.filename = frames[i].filename, .line = frames[i].line, .name = frames[i].name};
        return gm_local_session_alloc(c, size, stream, trace_frames, n_trace, ret_ptr);
}

int gm_local_session_free(gpumem_client *c, block_t *b, pending_free_t *p) {
        c->local_frees++; /* its block may still be in use by queued work */
        if (__builtin_expect(b->captured, 0))
                gm_capture_unnote_block(b->stream);
        int r = gm_local_heap_free(c->heap, b->id, p != NULL);
        if (b->stream_uses)
                free(b->stream_uses);
        b->next_spare = c->spare_blocks;
        c->spare_blocks = b;
        gm_heap_lock_drop(&c->heap_lock);
        if (r < 0) {
                if (p)
                        gm_frees_destroy(c, p, true);
                return gm_conn_set_error(c, -EINVAL, "gpumem: the local heap refused the free: %s", strerror(-r));
        }
        if (p) {
                pthread_mutex_lock(&c->lock);
                p->next = c->pending_frees;
                c->pending_frees = p;
                pthread_mutex_unlock(&c->lock);
                gm_conn_wake(c);
        }
        return 0;
}

/* Room an answer packet keeps for the envelope around its bytes. */
#define ANSWER_PACKET_OVERHEAD 256

/* Notes a SnapshotQuery or HistoryPush push; true when it is one (the
 * service thread is then to be woken). Caller holds lock. */
static bool asks_note(gm_local_session_asks_t *asks, const Gpumem__Envelope *env) {
        switch (env->body_case) {
        case GPUMEM__ENVELOPE__BODY_SNAPSHOT_QUERY:
                asks->query_id = env->snapshot_query->query_id; /* a newer query replaces an older one */
                asks->query_max_bytes = env->snapshot_query->max_bytes;
                return true;
        case GPUMEM__ENVELOPE__BODY_HISTORY_PUSH:
                asks->history_due = true;
                asks->history_enabled = env->history_push->enabled;
                asks->history_max_entries = env->history_push->max_entries;
                return true;
        default:
                return false;
        }
}

/* Sends the answer in packets that fit; a refusal when buf is NULL. */
static void send_answer(gpumem_client *c, uint64_t query_id, const char *buf, size_t len) {
        size_t chunk = c->max_packet > 2 * ANSWER_PACKET_OVERHEAD ? c->max_packet - ANSWER_PACKET_OVERHEAD
                                                                  : ANSWER_PACKET_OVERHEAD;
        size_t at = 0;
        do {
                size_t n = len - at < chunk ? len - at : chunk;
                Gpumem__SnapshotAnswer ans = GPUMEM__SNAPSHOT_ANSWER__INIT;
                ans.query_id = query_id;
                ans.total_size = len;
                ans.refused = buf == NULL;
                ans.data.data = (uint8_t *) (buf ? buf + at : NULL);
                ans.data.len = n;
                ans.last = at + n == len;
                Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
                env.body_case = GPUMEM__ENVELOPE__BODY_SNAPSHOT_ANSWER;
                env.snapshot_answer = &ans;
                if (gm_conn_answer(c, &env) < 0)
                        return; /* the daemon is gone: nobody waits for it */
                at += n;
        } while (at < len);
}

/* Serves what asks_note() noted; service thread only, holding neither lock.
 * Returns true while something waits (the heap was busy). */
static bool asks_serve(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        gm_local_session_asks_t due = c->asks;
        pthread_mutex_unlock(&c->lock);
        if (!due.query_id && !due.history_due)
                return false;
        if (!c->local || !gm_heap_lock_try(&c->heap_lock))
                return true;
        gm_local_heap_t *heap = c->heap;
        if (due.history_due)
                gm_local_heap_history(heap, due.history_enabled, due.history_max_entries, (uint32_t) getpid());
        char *buf = NULL;
        size_t len = 0;
        int r = due.query_id ? gm_snapshot_answer_encode(gm_local_heap_core(heap), gm_local_heap_history_ring(heap),
                                                         due.query_max_bytes, &buf, &len)
                             : 0;
        gm_heap_lock_drop(&c->heap_lock);
        pthread_mutex_lock(&c->lock);
        gm_local_session_asks_t *asks = &c->asks;
        if (asks->query_id == due.query_id)
                asks->query_id = 0;
        if (due.history_due && asks->history_enabled == due.history_enabled &&
            asks->history_max_entries == due.history_max_entries)
                asks->history_due = false;
        pthread_mutex_unlock(&c->lock);
        if (due.query_id)
                send_answer(c, due.query_id, r == 0 ? buf : NULL, r == 0 ? len : 0);
        free(buf);
        return false;
}

/* Streams noted as captured are asked again at every poll while they are
 * noted, so that each is forgotten soon after its capture ends (the
 * application may destroy it then). Returns true while some are noted. */
static bool watch_captures(gpumem_client *c) {
        if (!gm_capture_any() || !gm_capture_noted()) /* the lock only while a capture is open */
                return false;
        gm_capture_in_progress(gm_mapping_capture_query(c), c);
        return gm_capture_noted();
}

bool gm_local_session_serve(gpumem_client *c) {
        return c->local && (serve_reclaim(c) | serve_alloc_conf(c) | finish_completed_frees(c) |
                            local_page_replace_pending(c) | asks_serve(c) | watch_captures(c));
}

bool gm_local_session_on_ask(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds) {
        (void) w;
        gm_close_fds(fds, n_fds);
        if (c->local && asks_note(&c->asks, env))
                gm_conn_wake(c);
        gm_msg_free(env);
        return true;
}

bool gm_local_session_on_alloc_conf(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds) {
        (void) w;
        /* Given to the heap by the service thread once it holds it. */
        gm_close_fds(fds, n_fds);
        char *conf = c->local ? strdup(env->alloc_conf_update->alloc_conf) : NULL;
        if (conf) {
                free(c->alloc_conf_update);
                c->alloc_conf_update = conf;
                gm_conn_wake(c);
        }
        gm_msg_free(env);
        return true;
}

bool gm_local_session_on_reclaim(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds) {
        (void) w;
        /* Served by the service thread once it holds the heap. */
        gm_close_fds(fds, n_fds);
        if (c->local && env->reclaim->reclaim_id) {
                c->reclaim_id = env->reclaim->reclaim_id;
                c->reclaim_bytes = env->reclaim->bytes;
                gm_conn_wake(c);
        }
        gm_msg_free(env);
        return true;
}

void gm_local_session_forget(gpumem_client *c, bool owner) {
        /* The daemon releases the session's pieces; the heap only forgets them. */
        c->heap = gm_local_heap_destroy(c->heap);
        c->last_segment = NULL;
        free(c->alloc_conf_update);
        c->alloc_conf_update = NULL;
        if (c->page_fd_pending >= 0)
                close(c->page_fd_pending);
        c->page_fd_pending = -1;
        while (c->spare_blocks) {
                block_t *b = c->spare_blocks;
                c->spare_blocks = b->next_spare;
                free(b);
        }
        if (owner)
                gm_statpage_unmap(c->stats_page);
        c->stats_page = NULL;
        c->local = false;
        c->reclaim_id = 0;
        c->asks = (gm_local_session_asks_t){0};
}
