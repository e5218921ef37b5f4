/* The central heap: a session whose allocator runs in the daemon. Every
 * allocation is an Alloc round trip (with the page-reuse fences it reports
 * and the frees made since the last message), a free is carried by the next
 * Alloc or is a Free of its own (or a FreeCompleted once its streams are
 * done, frees.c). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "central.h"
#include "frees.h"
#include "hotmsg.h"
#include "mapping.h"
#include "msg.h"

/* Points wire[0..n) and ptrs[0..n) at frames[0..n) for an Alloc request, n
 * being at most GPUMEM_MAX_FRAMES; returns n. NULL strings become "". */
static size_t wire_frames_of(const gpumem_frame *frames, size_t n_frames, Gpumem__Frame *wire, Gpumem__Frame **ptrs) {
        size_t n = n_frames < GPUMEM_MAX_FRAMES ? n_frames : GPUMEM_MAX_FRAMES;
        for (size_t i = 0; i < n; i++) {
                gpumem__frame__init(&wire[i]);
                wire[i].filename = (char *) (frames[i].filename ? frames[i].filename : "");
                wire[i].line = frames[i].line;
                wire[i].name = (char *) (frames[i].name ? frames[i].name : "");
                ptrs[i] = &wire[i];
        }
        return n;
}

/* ---- carried frees ---- */

/* A free is carried only while the service thread is sure to wake within
 * the connection's caller grace (conn.h) and send what is carried then: no
 * call is in flight (one parked in the daemon could leave the thread asleep
 * on the socket) and the last ended less than this long ago (the coarse
 * clock may lag the thread's wake by up to a tick, 4 ms). Otherwise it is
 * sent at once, so no free waits longer than one grace period. */
#define CARRY_WINDOW_MS (GM_CONN_CALLER_GRACE_MS / 2)

static bool carry_window_open(const gpumem_client *c) {
        if (atomic_load_explicit(&c->callers, memory_order_relaxed) > 0)
                return false;
        return gm_conn_idle_ms(c) < CARRY_WINDOW_MS;
}

void gm_central_send_carried(gpumem_client *c) {
        if (!c->n_carried_frees)
                return;
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = c->carried_frees[0];
        f.n_more_block_ids = c->n_carried_frees - 1;
        f.more_block_ids = c->carried_frees + 1;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = ++c->next_request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        env.free = &f;
        gm_conn_send(c, &env); /* lost with the connection: the re-attach ledger has them */
        c->n_carried_frees = 0;
        atomic_store_explicit(&c->frees_carried, false, memory_order_relaxed);
}

void gm_central_before_send(gpumem_client *c, const Gpumem__Envelope *env) {
        if (env->body_case != GPUMEM__ENVELOPE__BODY_ALLOC)
                gm_central_send_carried(c);
}

/* Moves the carried frees into the Alloc being sent (ids: room for
 * GM_CARRIED_FREES_MAX). Caller holds lock. */
static void carry_into(gpumem_client *c, Gpumem__Alloc *alloc, uint64_t *ids) {
        memcpy(ids, c->carried_frees, c->n_carried_frees * sizeof(*ids));
        alloc->freed_block_ids = ids;
        alloc->n_freed_block_ids = c->n_carried_frees;
        c->n_carried_frees = 0;
        atomic_store_explicit(&c->frees_carried, false, memory_order_relaxed);
}

/* Sends an Alloc with the frees carried since the last message and the
 * fences complete since the last report (a central session on a device
 * backend). Reports are built and sent under lock, so the daemon gets
 * each stream's numbers in rising order; a resent Alloc (after a
 * re-attach) reports what is complete for the new daemon. After
 * frees (client_fences), an event recorded under lock on each stream freed
 * on follows every free sent before the Alloc (they are sent under lock
 * too): those complete at once are named (frees_fenced for the Alloc's own
 * stream, other_frees_fenced) and their pages may move in this allocation. */
static int send_alloc(gpumem_client *c, Gpumem__Envelope *env) {
        /* No mark outstanding: every complete one was reported when it was
         * popped, and an Alloc without a report needs no order. No free
         * carried: a free on another thread not seen yet is carried later. */
        bool fences = atomic_load_explicit(&c->fences_pending, memory_order_relaxed) ||
                      atomic_load_explicit(&c->fences_freed, memory_order_relaxed);
        if (!fences && !atomic_load_explicit(&c->frees_carried, memory_order_relaxed))
                return gm_conn_send(c, env);
        uint64_t carried[GM_CARRIED_FREES_MAX];
        pthread_mutex_lock(&c->lock);
        carry_into(c, env->alloc, carried);
        if (!fences) {
                int r = gm_conn_send(c, env);
                env->alloc->freed_block_ids = NULL;
                env->alloc->n_freed_block_ids = 0;
                pthread_mutex_unlock(&c->lock);
                return r;
        }
        gm_fence_done_t done[GM_FENCE_STREAMS];
        Gpumem__StreamFence msgs[GM_FENCE_STREAMS], *ptrs[GM_FENCE_STREAMS];
        size_t n = gm_fences_report(&c->fences, done);
        atomic_store_explicit(&c->fences_pending, c->fences.n_pending > 0, memory_order_relaxed);
        uint64_t fenced[GM_FENCE_STREAMS];
        size_t n_fenced = gm_fences_check_freed(&c->fences, fenced);
        /* The Alloc's own stream, the usual one, is a flag (no repeated field to pack and unpack). */
        for (size_t i = 0; i < n_fenced; i++)
                if (fenced[i] == env->alloc->stream) {
                        env->alloc->frees_fenced = true;
                        fenced[i] = fenced[--n_fenced];
                        break;
                }
        env->alloc->n_other_frees_fenced = n_fenced;
        env->alloc->other_frees_fenced = fenced;
        atomic_store_explicit(&c->fences_freed, c->fences.n_freed > 0, memory_order_relaxed);
        for (size_t i = 0; i < n; i++) {
                gpumem__stream_fence__init(&msgs[i]);
                msgs[i].stream = done[i].stream;
                msgs[i].fence = done[i].fence;
                ptrs[i] = &msgs[i];
        }
        env->alloc->fences_done = ptrs;
        env->alloc->n_fences_done = n;
        int r = gm_conn_send(c, env);
        env->alloc->fences_done = NULL;
        env->alloc->n_fences_done = 0;
        env->alloc->frees_fenced = false;
        env->alloc->other_frees_fenced = NULL;
        env->alloc->n_other_frees_fenced = 0;
        env->alloc->freed_block_ids = NULL;
        env->alloc->n_freed_block_ids = 0;
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* Records the fences an allocation reply asks for (page reuse, central
 * sessions on a device backend): an event on each stream now, after every
 * free this client sent before the Alloc (the daemon counted those), so it
 * covers all the work queued on the stream before them. On the allocating
 * thread, as a local heap marks: a special stream (0, per-thread) means
 * that thread's. A mark refused (the stream's FIFO full, too many streams,
 * the driver's error) is never reported complete: its pages wait for a
 * later mark. Caller holds lock. */
static void mark_fences(gpumem_client *c, Gpumem__StreamFence **marks, size_t n_marks) {
        if (!n_marks || !c->mapper->ops->caps->device_streams)
                return;
        for (size_t i = 0; i < n_marks; i++)
                (void) gm_fences_mark(&c->fences, marks[i]->stream, marks[i]->fence);
        atomic_store_explicit(&c->fences_pending, c->fences.n_pending > 0, memory_order_relaxed);
        atomic_store_explicit(&c->client_fences, true, memory_order_relaxed); /* its heap moves pages */
}

/* The block of an AllocReply whose memory could not be mapped here: give
 * the block back and ask for the session's idle segments, the unmapped one
 * among them, so no later block lands in it. */
static void alloc_unmapped(gpumem_client *c, const Gpumem__Envelope *reply) {
        if (reply->body_case != GPUMEM__ENVELOPE__BODY_ALLOC_REPLY)
                return;
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = reply->alloc_reply->block_id;
        Gpumem__Envelope fenv = GPUMEM__ENVELOPE__INIT;
        fenv.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        fenv.free = &f;
        Gpumem__Trim trim = GPUMEM__TRIM__INIT;
        Gpumem__Envelope tenv = GPUMEM__ENVELOPE__INIT;
        tenv.body_case = GPUMEM__ENVELOPE__BODY_TRIM;
        tenv.trim = &trim;
        pthread_mutex_lock(&c->lock);
        if (gm_conn_post_locked(c, &fenv) == 0)
                gm_conn_post_locked(c, &tenv);
        pthread_mutex_unlock(&c->lock);
}

static const gm_conn_request_ops_t alloc_ops = {.send = send_alloc, .unmapped = alloc_unmapped};

__attribute__((noinline)) int gm_central_alloc(gpumem_client *c, size_t size, uint64_t stream,
                                               const gpumem_frame *frames, size_t n_frames, void **ret_ptr) {
        int r;
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = size;
        alloc.stream = stream;
        alloc.tag = (char *) gm_pool_name(&c->pools, gm_pool_current(&c->pools)); /* the daemon's heap's pool */
        /* The daemon's heap must not release or move cached memory under a
         * capture (one driver query an Alloc, only where the mapper can). */
        alloc.capturing = gm_mapping_stream_captured(c, stream);
        Gpumem__Frame wire_frames[GPUMEM_MAX_FRAMES];
        Gpumem__Frame *frame_ptrs[GPUMEM_MAX_FRAMES];
        alloc.n_frames = wire_frames_of(frames, n_frames, wire_frames, frame_ptrs);
        alloc.frames = frame_ptrs;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        Gpumem__Envelope *reply = NULL;
        if ((r = gm_conn_call_expect(c, &env, &alloc_ops, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY, &reply)) < 0)
                return alloc.capturing && (r == -ENOMEM || r == -EDQUOT)
                               ? gm_frees_refused_in_capture(c, r, size, stream, gm_conn_error_is_for(c), false)
                               : r;
        const Gpumem__AllocReply *ar = reply->alloc_reply;
        block_t *b = malloc(sizeof(*b));
        pthread_mutex_lock(&c->lock);
        mark_fences(c, ar->fence_marks, ar->n_fence_marks);
        segment_t *seg = gm_u64map_get(&c->segments, ar->segment_id);
        uint64_t ptr = seg ? seg->base + ar->offset : 0;
        if (!b || !seg || ar->offset + ar->block_size > seg->va_size) {
                r = !b ? -ENOMEM : -EPROTO;
        } else {
                *b = (block_t){.id = ar->block_id,
                               .size = ar->block_size,
                               .requested = size,
                               .offset = ar->offset,
                               .segment_id = ar->segment_id,
                               .stream = stream};
                if (!seg->has_stream) {
                        seg->stream = stream;
                        seg->has_stream = true;
                }
                r = gm_u64map_put(&c->blocks, ptr, b);
        }
        pthread_mutex_unlock(&c->lock);
        if (r < 0) {
                /* Give the block back so the daemon's ledger stays exact. */
                Gpumem__Free f = GPUMEM__FREE__INIT;
                f.block_id = ar->block_id;
                Gpumem__Envelope fenv = GPUMEM__ENVELOPE__INIT;
                fenv.body_case = GPUMEM__ENVELOPE__BODY_FREE;
                fenv.free = &f;
                gm_conn_post(c, &fenv);
                free(b);
                gm_msg_free(reply);
                return gm_conn_set_error(c, r, "gpumem: allocation reply does not fit the mapped segment");
        }
        gm_msg_free(reply);
        *ret_ptr = (void *) (uintptr_t) ptr;
        return 0;
}

int gm_central_free(gpumem_client *c, block_t *b, pending_free_t *p) {
        int r;
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = b->id;
        f.deferred = p != NULL;
        uint64_t stream_of_block = b->stream, size_of_block = b->size;
        gm_client_block_free(b);
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        env.free = &f;
        if (!p) {
                pthread_mutex_lock(&c->lock);
                if (c->carries_frees && !c->dead && carry_window_open(c)) {
                        /* The next Alloc carries it (or the next message, or the service thread). */
                        c->carried_frees[c->n_carried_frees++] = f.block_id;
                        atomic_store_explicit(&c->frees_carried, true, memory_order_relaxed);
                        if (c->n_carried_frees == GM_CARRIED_FREES_MAX)
                                gm_central_send_carried(c);
                        r = 0;
                } else {
                        r = gm_conn_post_locked(c, &env);
                }
                gm_frees_sent(c, stream_of_block, size_of_block);
                pthread_mutex_unlock(&c->lock);
                return r;
        }
        /* Queue the completion before the free is sent, so the service thread
         * cannot send FreeCompleted ahead of Free: it takes the lock to send. */
        pthread_mutex_lock(&c->lock);
        r = gm_conn_post_locked(c, &env);
        if (r == 0) {
                p->next = c->pending_frees;
                c->pending_frees = p;
        }
        pthread_mutex_unlock(&c->lock);
        if (r < 0) {
                gm_frees_destroy(c, p, true);
                return r;
        }
        gm_conn_wake(c);
        return 0;
}

int gm_central_trim(gpumem_client *c, uint64_t *ret_released_bytes) {
        int r;
        Gpumem__Trim trim = GPUMEM__TRIM__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_TRIM;
        env.trim = &trim;
        Gpumem__Envelope *reply = NULL;
        if ((r = gm_conn_call_expect(c, &env, NULL, GPUMEM__ENVELOPE__BODY_TRIM_REPLY, &reply)) < 0)
                return r;
        if (ret_released_bytes)
                *ret_released_bytes = reply->trim_reply->released_bytes;
        gm_msg_free(reply);
        return 0;
}

int gm_central_stat(gpumem_client *c, const char *tag, const char *pytorch_stat_name, int64_t *ret_value) {
        int r;
        Gpumem__Stats stats = GPUMEM__STATS__INIT;
        stats.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_SESSION;
        stats.tagged = tag != NULL;
        stats.tag = (char *) (tag ? tag : "");
        char *names[1] = {(char *) pytorch_stat_name};
        stats.n_names = 1;
        stats.names = names;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_STATS;
        env.stats = &stats;
        Gpumem__Envelope *reply = NULL;
        if ((r = gm_conn_call_expect(c, &env, NULL, GPUMEM__ENVELOPE__BODY_STATS_REPLY, &reply)) < 0)
                return r;
        r = -ENOENT;
        for (size_t i = 0; i < reply->stats_reply->n_stats; i++)
                if (strcmp(reply->stats_reply->stats[i]->name, pytorch_stat_name) == 0) {
                        *ret_value = reply->stats_reply->stats[i]->value;
                        r = 0;
                }
        gm_msg_free(reply);
        return r < 0 ? gm_conn_set_error(c, r, "gpumem: no statistic named '%s'", pytorch_stat_name) : 0;
}

void gm_central_open(gpumem_client *c, const Gpumem__HelloReply *hr) {
        /* Opt-in: other connections (gpumemctl, /metrics, an admin's trim)
         * see a carried free up to one caller grace late. */
        const char *carry = getenv("GPUMEM_CARRY_FREES");
        c->carries_frees = hr->carried_frees && !c->local && carry && strcmp(carry, "1") == 0;
        /* On unless GPUMEM_FIXED_CODEC=0 (protobuf only: comparisons, debugging). */
        const char *fixed = getenv("GPUMEM_FIXED_CODEC");
        atomic_store_explicit(&c->fixed_codec,
                              hr->fixed_codec == GM_HOTMSG_VERSION && !c->local && !(fixed && strcmp(fixed, "0") == 0),
                              memory_order_relaxed);
        if (c->mapper->ops->caps->device_streams) {
                gm_fences_init(&c->fences, &(gm_fence_ops_t){.record = gm_mapping_event_record,
                                                             .query = gm_mapping_event_query,
                                                             .destroy = gm_mapping_event_destroy,
                                                             .ctx = c});
                atomic_store_explicit(&c->client_fences, hr->client_fences, memory_order_relaxed);
        }
}

void gm_central_forget(gpumem_client *c, bool owner) {
        pthread_mutex_lock(&c->lock);
        if (owner) /* the daemon's figures count them before the session ends */
                gm_central_send_carried(c);
        c->n_carried_frees = 0;
        atomic_store_explicit(&c->frees_carried, false, memory_order_relaxed);
        pthread_mutex_unlock(&c->lock);
        gm_fences_clear(&c->fences, owner);
        atomic_store_explicit(&c->fences_pending, false, memory_order_relaxed);
        atomic_store_explicit(&c->fences_freed, false, memory_order_relaxed);
        atomic_store_explicit(&c->client_fences, false, memory_order_relaxed);
}
