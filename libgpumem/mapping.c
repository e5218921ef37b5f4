/* The segment table of a session: each segment's address range reserved once,
 * its pieces mapped, moved and unmapped through the mapper (mapper.h) as the
 * daemon's replies and release requests say. Its push handlers go in the
 * connection's table (conn.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_loader.h"
#include "ipc.h"
#include "mapping.h"
#include "msg.h"

static void segment_free(segment_t *seg) {
        if (seg) {
                free(seg->pieces);
                free(seg);
        }
}

/* ---- segments ---- */

/* The segment a piece of [offset, +length) of segment `id` (va_size bytes)
 * goes into, made and reserved on first sight, with room for one more piece.
 * Caller holds lock. */
static int segment_for_piece(gpumem_client *c, uint64_t id, uint64_t va_size, uint64_t offset, uint64_t length,
                             segment_t **ret_seg) {
        segment_t *seg = gm_u64map_get(&c->segments, id);
        int r;
        if (offset + length < offset || offset + length > va_size)
                return -EPROTO;
        if (!seg) {
                seg = calloc(1, sizeof(*seg));
                if (!seg)
                        return -ENOMEM;
                seg->id = id;
                seg->va_size = va_size;
                /* Known even when nothing maps: its release is then answered as done. */
                if ((r = gm_u64map_put(&c->segments, seg->id, seg)) < 0) {
                        segment_free(seg);
                        return r;
                }
        }
        if (!seg->base && (r = c->mapper->ops->reserve(c->mapper, seg->va_size, &seg->base)) < 0) {
                seg->base = 0;
                return r;
        }
        if (seg->n_pieces == seg->cap_pieces) {
                size_t cap = seg->cap_pieces ? 2 * seg->cap_pieces : 4;
                uint64_t *pieces = realloc(seg->pieces, cap * sizeof(*pieces));
                if (!pieces)
                        return -ENOMEM;
                seg->pieces = pieces;
                seg->cap_pieces = cap;
        }
        *ret_seg = seg;
        return 0;
}

/* Maps one piece the daemon sent; consumes fd. Caller holds lock. */
static int map_piece(gpumem_client *c, const Gpumem__Mapping *m, int fd) {
        segment_t *seg;
        int r = segment_for_piece(c, m->segment_id, m->segment_va_size, m->offset, m->length, &seg);
        if (r < 0) {
                close(fd);
                return r;
        }
        r = c->mapper->ops->map(c->mapper, seg->base, m->offset, m->length, fd);
        if (r < 0)
                return r;
        seg->mapped_bytes += m->length;
        seg->piece_size = m->length;
        seg->pieces[seg->n_pieces++] = m->offset;
        return 0;
}

static void segment_maybe_forget(gpumem_client *c, segment_t *seg);

int gm_mapping_move(gpumem_client *c, const Gpumem__PageMove *mv) {
        segment_t *from = gm_u64map_get(&c->segments, mv->from_segment_id), *to;
        size_t k = 0;
        while (from && k < from->n_pieces && from->pieces[k] != mv->from_offset)
                k++;
        if (!from || k == from->n_pieces || from->piece_size != mv->length || !c->mapper->ops->move ||
            mv->to_segment_id == 0)
                return -EPROTO;
        to = gm_u64map_get(&c->segments, mv->to_segment_id);
        for (size_t i = 0; to && i < to->n_pieces; i++)
                if (to->pieces[i] == mv->to_offset || to->piece_size != mv->length)
                        return -EPROTO;
        if (to && to->va_size != mv->to_segment_va_size)
                return -EPROTO;
        int r = segment_for_piece(c, mv->to_segment_id, mv->to_segment_va_size, mv->to_offset, mv->length, &to);
        if (r == 0)
                r = c->mapper->ops->move(c->mapper, from->base + mv->from_offset, to->base + mv->to_offset, mv->length);
        if (r < 0)
                return r;
        from->pieces[k] = from->pieces[--from->n_pieces];
        from->mapped_bytes -= mv->length < from->mapped_bytes ? mv->length : from->mapped_bytes;
        to->pieces[to->n_pieces++] = mv->to_offset;
        to->mapped_bytes += mv->length;
        to->piece_size = mv->length;
        from->released |= mv->from_whole_segment;
        segment_maybe_forget(c, from);
        return 0;
}

/* Maps every mapping of a packet (fds in order); fds without a mapping are
 * closed. Each is a new piece: the daemon took it from the claim first. */
static int map_pieces(gpumem_client *c, Gpumem__Mapping **maps, size_t n_maps, int *fds, size_t n_fds) {
        int err = n_maps == n_fds ? 0 : -EPROTO;
        size_t i = 0;
        for (size_t k = 0; k < n_maps; k++)
                c->claim_bytes -= maps[k]->length < c->claim_bytes ? maps[k]->length : c->claim_bytes;
        for (; i < n_maps && i < n_fds; i++) {
                int r = map_piece(c, maps[i], fds[i]);
                if (r < 0 && err == 0)
                        err = r;
        }
        gm_close_fds(fds + i, n_fds - i);
        return err;
}

/* Forgets a segment the daemon took back once nothing of it is mapped. */
static void segment_maybe_forget(gpumem_client *c, segment_t *seg) {
        if (!seg->released || seg->n_pieces > 0)
                return;
        if (seg->base && c->mapper->ops->unreserve(c->mapper, seg->base, seg->va_size) < 0)
                return; /* the range stays reserved (and known) until the session ends */
        gm_u64map_remove(&c->segments, seg->id);
        if (c->last_segment == seg)
                c->last_segment = NULL;
        segment_free(seg);
}

bool gm_mapping_unmap(gpumem_client *c, const Gpumem__Range *range) {
        segment_t *seg = gm_u64map_get(&c->segments, range->segment_id);
        if (!seg || range->offset + range->length < range->offset || range->offset + range->length > seg->va_size)
                return false;
        for (size_t i = 0; i < seg->n_pieces; i++) {
                if (seg->pieces[i] != range->offset)
                        continue;
                if (c->mapper->ops->unmap(c->mapper, seg->base, range->offset, seg->piece_size) < 0)
                        return false;
                seg->mapped_bytes -= seg->piece_size < seg->mapped_bytes ? seg->piece_size : seg->mapped_bytes;
                seg->pieces[i] = seg->pieces[--seg->n_pieces];
                break;
        }
        /* A piece that never mapped (its map failed) holds nothing. */
        seg->released |= range->whole_segment;
        segment_maybe_forget(c, seg);
        return true;
}

/* Waits, with no lock held, for the work on the streams of the segments a
 * release request names: their memory may still be in use by queued work. */
static void release_streams_sync(gpumem_client *c, const Gpumem__ReleaseRequest *req) {
        if (!c->mapper->ops->caps->device_streams)
                return;
        uint64_t streams[16];
        size_t n = 0;
        bool all =
                false; /* more distinct streams than kept: the whole device (the default stream would not order non-blocking ones) */
        pthread_mutex_lock(&c->lock);
        for (size_t i = 0; i < req->n_ranges && !all; i++) {
                const segment_t *seg = gm_u64map_get(&c->segments, req->ranges[i]->segment_id);
                uint64_t stream = seg && seg->has_stream ? seg->stream : 0;
                size_t k = 0;
                while (k < n && streams[k] != stream)
                        k++;
                if (k == n && n == sizeof(streams) / sizeof(streams[0]))
                        all = true;
                else if (k == n)
                        streams[n++] = stream;
        }
        pthread_mutex_unlock(&c->lock);
        if (all) {
                n = 1;
                streams[0] = GM_MAPPER_SYNC_DEVICE;
        }
        for (size_t k = 0; k < n; k++)
                c->mapper->ops->sync(c->mapper, streams[k]);
}

void gm_mapping_release_streams(gpumem_client *c, const Gpumem__Envelope *env) {
        /* Its synchronize would invalidate a capture in progress in the
         * process: then the request is held (gm_mapping_on_release()). */
        c->release_now = gm_capture_release_begin(gm_mapping_capture_query(c), c);
        if (c->release_now)
                release_streams_sync(c, env->release_request);
}

/* Acknowledges a release; `kept` are the ranges that stay mapped. */
static void send_release_ack(gpumem_client *c, uint64_t release_id, Gpumem__Range **kept, size_t n_kept) {
        Gpumem__ReleaseAck ack = GPUMEM__RELEASE_ACK__INIT;
        ack.release_id = release_id;
        ack.not_released = kept;
        ack.n_not_released = n_kept;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 0;
        env.body_case = GPUMEM__ENVELOPE__BODY_RELEASE_ACK;
        env.release_ack = &ack;
        gm_conn_send(c, &env);
}

/* Maps what a reply brings; the first failure (with the driver's text, which
 * only this thread can read) goes to the waiting request. */
static void map_for_waiter(gpumem_client *c, waiter_t *w, Gpumem__Mapping **maps, size_t n_maps, int *fds,
                           size_t n_fds) {
        int r = map_pieces(c, maps, n_maps, fds, n_fds);
        if (r < 0 && w && !w->error) {
                w->error = r;
                snprintf(w->detail, sizeof(w->detail), "%s", gm_cuda_last_error());
        }
}

/* Applies the page moves of an allocation reply, in order, before its new
 * mappings (a move's place may be where a new piece goes next); the first
 * failure goes to the waiting request. */
static void move_for_waiter(gpumem_client *c, waiter_t *w, Gpumem__PageMove **moves, size_t n_moves) {
        for (size_t i = 0; i < n_moves; i++) {
                int r = gm_mapping_move(c, moves[i]);
                if (r < 0 && w && !w->error) {
                        w->error = r;
                        snprintf(w->detail, sizeof(w->detail), "%s", gm_cuda_last_error());
                }
        }
}

int gm_mapping_event_record(void *ctx, uint64_t stream, uint64_t *ret_event) {
        gpumem_client *c = ctx;
        if (gm_mapping_stream_captured(c, stream))
                return -EBUSY;
        return c->mapper->ops->event_record(c->mapper, stream, ret_event);
}

int gm_mapping_event_query(void *ctx, uint64_t event) {
        gpumem_client *c = ctx;
        return c->mapper->ops->event_query(c->mapper, event);
}

void gm_mapping_event_destroy(void *ctx, uint64_t event) {
        gpumem_client *c = ctx;
        c->mapper->ops->event_destroy(c->mapper, event);
}

/* Unmaps what a release request names and acknowledges it, its streams
 * waited for; consumes env. Caller holds lock. */
static void release_now(gpumem_client *c, Gpumem__Envelope *env) {
        Gpumem__ReleaseRequest *req = env->release_request;
        size_t n_kept = 0; /* the ranges still mapped go first in req->ranges */
        for (size_t i = 0; i < req->n_ranges; i++)
                if (!gm_mapping_unmap(c, req->ranges[i])) {
                        Gpumem__Range *kept = req->ranges[i];
                        req->ranges[i] = req->ranges[n_kept];
                        req->ranges[n_kept++] = kept;
                }
        send_release_ack(c, req->release_id, req->ranges, n_kept);
        gm_msg_free(env);
}

/* Holds a release request until no capture is in progress; one the daemon
 * asks again (same release id) is held once. Whether it is held (false: out
 * of host memory, env freed: the daemon asks again after its
 * release_timeout_ms). Caller holds lock; consumes env. */
static bool release_hold(gpumem_client *c, Gpumem__Envelope *env) {
        for (size_t i = 0; i < c->n_held_releases; i++)
                if (c->held_releases[i]->release_request->release_id == env->release_request->release_id) {
                        gm_msg_free(env);
                        return true;
                }
        if (c->n_held_releases == c->cap_held_releases) {
                size_t cap = c->cap_held_releases ? 2 * c->cap_held_releases : 4;
                Gpumem__Envelope **held = realloc(c->held_releases, cap * sizeof(*held));
                if (!held) {
                        gm_msg_free(env);
                        return false;
                }
                c->held_releases = held;
                c->cap_held_releases = cap;
        }
        c->held_releases[c->n_held_releases++] = env;
        return true;
}

bool gm_mapping_on_release(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds) {
        (void) w;
        gm_close_fds(fds, n_fds);
        if (!c->release_now) {
                release_hold(c, env);
                gm_conn_wake(c); /* its service thread serves it once the capture ends */
                return true;
        }
        c->release_now = false;
        release_now(c, env);
        gm_capture_release_end();
        return true;
}

void gm_mapping_drop_held_releases(gpumem_client *c) {
        for (size_t i = 0; i < c->n_held_releases; i++)
                gm_msg_free(c->held_releases[i]);
        free(c->held_releases);
        c->held_releases = NULL;
        c->n_held_releases = c->cap_held_releases = 0;
}

bool gm_mapping_serve_held_releases(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        bool held = c->n_held_releases > 0;
        pthread_mutex_unlock(&c->lock);
        if (!held)
                return false;
        if (!gm_capture_release_begin(gm_mapping_capture_query(c), c))
                return true;
        pthread_mutex_lock(&c->lock);
        Gpumem__Envelope **envs = c->held_releases;
        size_t n = c->n_held_releases;
        c->held_releases = NULL;
        c->n_held_releases = c->cap_held_releases = 0;
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; i < n; i++)
                release_streams_sync(c, envs[i]->release_request);
        pthread_mutex_lock(&c->lock);
        for (size_t i = 0; i < n; i++)
                release_now(c, envs[i]);
        pthread_mutex_unlock(&c->lock);
        gm_capture_release_end();
        free(envs);
        return false;
}

bool gm_mapping_on_map_segments(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds) {
        map_for_waiter(c, w, env->map_segments->mappings, env->map_segments->n_mappings, fds, n_fds);
        gm_msg_free(env);
        return true;
}

bool gm_mapping_on_alloc_reply(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds) {
        move_for_waiter(c, w, env->alloc_reply->page_moves, env->alloc_reply->n_page_moves);
        map_for_waiter(c, w, env->alloc_reply->new_mappings, env->alloc_reply->n_new_mappings, fds, n_fds);
        return false;
}

bool gm_mapping_on_claim_reply(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds) {
        (void) w;
        gm_close_fds(fds, n_fds);                   /* a ClaimReply carries none */
        c->claim_bytes = env->claim_reply->claimed; /* in order with the mappings that consume it */
        return false;
}

bool gm_mapping_on_grant_reply(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds) {
        /* A run's pieces in order; more than one packet's fds can hold maps none (-EPROTO). */
        const Gpumem__GrantReply *gr = env->grant_reply;
        Gpumem__Mapping *maps[GM_IPC_MAX_FDS_LIMIT];
        size_t n = 0;
        if (gr->mapping && gr->n_more_mappings < GM_IPC_MAX_FDS_LIMIT) {
                maps[n++] = gr->mapping;
                for (size_t i = 0; i < gr->n_more_mappings; i++)
                        maps[n++] = gr->more_mappings[i];
        }
        map_for_waiter(c, w, maps, n, fds, n_fds);
        return false;
}

void gm_mapping_sync_device(gpumem_client *c) {
        if (c->mapper && c->mapper->ops->caps->device_streams && c->mapper->ops->sync)
                c->mapper->ops->sync(c->mapper, GM_MAPPER_SYNC_DEVICE);
}

/* Whether `stream` is being captured, asked through the client's mapper. */
static int mapper_capturing(void *ctx, uint64_t stream) {
        gpumem_client *c = ctx;
        return c->mapper->ops->capturing(c->mapper, stream);
}

gm_capture_query_fn gm_mapping_capture_query(const gpumem_client *c) {
        return c->mapper && c->mapper->ops->capturing ? mapper_capturing : NULL;
}

void gm_mapping_forget(gpumem_client *c, bool owner) {
        /* Work queued on the memory may still run: unmapping under it faults. */
        if (owner && c->segments.len)
                gm_mapping_sync_device(c);
        for (size_t i = 0; i < c->segments.cap; i++) {
                segment_t *seg = c->segments.values[i];
                if (!seg)
                        continue;
                if (owner) {
                        /* The driver unmaps exactly what one cuMemMap mapped. */
                        for (size_t k = 0; k < seg->n_pieces; k++)
                                c->mapper->ops->unmap(c->mapper, seg->base, seg->pieces[k], seg->piece_size);
                        if (seg->base)
                                c->mapper->ops->unreserve(c->mapper, seg->base, seg->va_size);
                }
                segment_free(seg);
        }
        gm_u64map_done(&c->segments);
        gm_mapping_drop_held_releases(c); /* the session's releases end with it */
}
