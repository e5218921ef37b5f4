/* libgpumem: a session with gpumemd.
 *
 * Heap modes: in a local session (local_heap.c) the session's allocator runs
 * here and only Grant/ReturnPieces/ReclaimAck go to the daemon; in a central
 * one every allocation is an Alloc round trip.
 *
 * Threads: application threads send requests (each sendmsg is one atomic
 * packet) and wait for the reply with their request id. Whoever holds
 * read_lock reads the socket and dispatches every packet in order (mapping
 * the segments replies bring, answering release requests): a calling thread
 * reads until its own reply is in, then hands over to the next waiting
 * caller; the service thread reads only when no call was in flight for
 * CALLER_GRACE_MS (so it is not woken by every reply), and serves the
 * daemon's Reclaim, deferred frees and re-attach. `lock` guards every field
 * below it. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client-internal.h"
#include "cuda_loader.h"
#include "fence.h"
#include "gpumem/gpumem.h"
#include "ipc.h"
#include "local_heap.h"
#include "mapper.h"
#include "msg.h"
#include "peer_check.h"
#include "statpage.h"
#include "u64map.h"

typedef struct waiter {
        uint64_t request_id;
        bool done;
        int error;               /* set instead of reply when mapping it failed or the daemon went away */
        Gpumem__Envelope *reply; /* owned by the waiter once done */
        bool resend;             /* the daemon restarted before answering: send the request again */
        char detail[256];        /* the driver's text when mapping failed (service thread) */
        int fd;                  /* the first fd a non-mapping reply brought (a snapshot), or -1 */
        pthread_cond_t cond;
        struct waiter *next;
} waiter_t;

typedef struct segment {
        uint64_t id;
        uint64_t base;
        uint64_t va_size;
        uint64_t mapped_bytes;
        uint64_t stream; /* of the allocation that brought it (for re-attach) */
        bool has_stream;
        uint64_t piece_size; /* every piece of a segment has one size (the page, or the whole) */
        uint64_t *pieces;    /* offsets of the mapped pieces */
        size_t n_pieces, cap_pieces;
        bool released; /* the daemon asked for the whole segment: it goes once no piece is mapped */
} segment_t;

static void segment_free(segment_t *seg) {
        if (seg) {
                free(seg->pieces);
                free(seg);
        }
}

typedef struct block {
        uint64_t id;
        uint64_t size;
        uint64_t requested; /* what the application asked for */
        uint64_t offset;    /* in its segment */
        uint64_t segment_id;
        uint64_t stream;       /* the allocation stream */
        uint64_t *stream_uses; /* other streams given to gpumem_record_stream */
        size_t n_stream_uses;
        struct block *next_spare; /* in the spare list (local mode) */
} block_t;

/* A free waiting for stream work: the daemon keeps the block active until
 * every event has completed and FreeCompleted names it. */
typedef struct pending_free {
        block_t block; /* as it was allocated (stream_uses not kept) */
        uint64_t block_id;
        uint64_t *events;
        size_t n_events;
        struct pending_free *next;
} pending_free_t;

/* Most distinct streams one block may be recorded on. */
#define MAX_STREAM_USES 64

struct gpumem_client {
        int fd;
        pid_t pid;                /* the process that owns this session */
        unsigned fork_generation; /* fork_generation when pid was last confirmed */
        char socket_path[108];
        uint32_t max_packet;
        uint32_t max_fds;
        uint32_t max_grant_pieces; /* pieces one Grant may ask for: max_fds, or 1 from a daemon without runs */
        uint64_t capacity;         /* of the device, from the daemon */
        int device;                /* the daemon's device index */
        uint64_t session_id;
        char tenant[64];
        char backend[16];
        gm_mapper_t *mapper;
        pthread_t service;
        bool service_started;
        int wake_fd; /* eventfd: tells the service thread a pending free was added */

        pthread_rwlock_t fd_lock;  /* senders hold it shared; the service thread swaps fd under it exclusively */
        pthread_mutex_t read_lock; /* held by the one thread reading the socket (service or a caller):
                                    * packets are read and dispatched in order */
        uint8_t *rx_buf;           /* the reader's buffer (under read_lock) */
        size_t rx_cap;
        char token[64]; /* session token: re-attaches after a daemon restart */
        uint32_t reconnect_timeout_ms;

        pthread_mutex_t lock; /* taken before fd_lock when both are held */
        bool dead;            /* the connection is gone; every request fails with -ECONNRESET */
        bool closing;         /* gpumem_disconnect() is under way: no reconnecting */
        bool reconnecting;    /* the daemon went away; the service thread is re-attaching */
        uint64_t next_request_id;
        waiter_t *waiters;
        gm_u64map_t segments;  /* segment id -> segment_t */
        gm_u64map_t blocks;    /* pointer -> block_t */
        char async_error[512]; /* last refusal of a request nobody waited for (a free) */
        pending_free_t *pending_frees;
        pending_free_t *completed_frees; /* local mode: stream work done, the heap not yet told */
        uint64_t reader_generation;      /* bumped whenever a reader lets read_lock go */
        bool reader_lost;                /* a caller's read failed: the service thread reads until it knows why */
        _Atomic int callers;             /* call()s in flight */
        _Atomic uint64_t last_call_ms;   /* CLOCK_MONOTONIC_COARSE when the last one ended */
        uint64_t reclaim_id;             /* a Reclaim the service thread has yet to serve (0: none) */
        uint64_t reclaim_bytes;
        gm_local_asks_t asks;    /* snapshot queries and history pushes to serve (local_snapshot.c) */
        char *alloc_conf_update; /* new settings the service thread has yet to give the heap (NULL: none) */
        /* A central session on a device backend: the page-reuse fences its
         * daemon asked for (AllocReply.fence_marks), reported with the next
         * Allocs once complete (under lock). fences_pending: whether marks
         * are outstanding, read without lock (written under it). */
        gm_fences_t fences;
        _Atomic bool fences_pending;
        /* Its heap moves pages behind stream fences (HelloReply.client_fences,
         * or the daemon asked for a mark): before an Alloc that follows frees
         * the client checks on its own whether their streams are past them
         * (Alloc.frees_fenced). fences_freed: whether streams freed on wait
         * for that check (read without lock, written under it). */
        _Atomic bool client_fences;
        _Atomic bool fences_freed;

        /* Local heap mode (local_heap.c): the session's allocator runs here.
         * heap_lock serialises it and, in this mode, the blocks table; it is
         * taken before lock. In this mode `segments` changes only on behalf of
         * a heap_lock holder (a grant's reply is mapped while it waits, a give
         * back unmaps under it) or at close, so heap_lock holders read it
         * without lock. */
        gpumem_heap_mode heap_choice; /* what the application asked for */
        bool local;
        bool grant_unmapped; /* the last grant's piece could not be mapped (under heap_lock) */
        bool return_intents; /* local: the daemon checks returns by the process's figure: ReturnIntent first */
        pthread_mutex_t heap_lock;
        gm_local_t *heap;
        gm_statpage_t *stats_page;
        int page_fd_pending;        /* a new daemon's page the heap did not take yet, or -1 (under lock) */
        segment_t *last_segment;    /* of the last local allocation (under heap_lock) */
        struct block *spare_blocks; /* freed block records, kept for reuse until the session ends
                                     * (as many as were ever live; under heap_lock) */
        /* Bytes of pieces the heap gave back whose unmap the driver refused:
         * they stay mapped here and granted (charged) by the daemon until the
         * session ends, or until the heap asks for the same piece again
         * (under heap_lock). */
        uint64_t kept_bytes;
};

/* The lock of the blocks table: the heap's in local mode. */
static pthread_mutex_t *blocks_lock(gpumem_client *c) {
        return c->local ? &c->heap_lock : &c->lock;
}

static void block_free(block_t *b) {
        if (b) {
                free(b->stream_uses);
                free(b);
        }
}

static void pending_free_destroy(gpumem_client *c, pending_free_t *p, bool owner) {
        for (size_t i = 0; i < p->n_events && owner; i++)
                c->mapper->ops->event_destroy(c->mapper, p->events[i]);
        free(p->events);
        free(p);
}

/* The calling thread's last failure, tagged with the client it concerns. */
static __thread const gpumem_client *tls_error_client;
static __thread char tls_error[2048];

static int set_error(const gpumem_client *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int set_error(const gpumem_client *c, int err, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
        va_end(ap);
        tls_error_client = c;
        return err;
}

const char *gpumem_last_error(gpumem_client *c) {
        return tls_error_client == c ? tls_error : ""; /* NULL: the thread's last failed connect */
}

const char *gpumem_strerror(int err) {
        switch (err) {
        case 0:
                return "success";
        case -ENOMEM:
                return "out of device memory";
        case -EDQUOT:
                return "tenant quota exceeded";
        case -EPERM:
                return "operation not permitted";
        case -EINVAL:
                return "invalid argument";
        case -ECONNRESET:
                return "the gpumemd daemon is gone";
        case -ENOENT:
                return "not found (no gpumemd socket, statistic or object of that name)";
        case -ENOBUFS:
                return "session limit reached";
        case -EPROTONOSUPPORT:
                return "gpumemd speaks another protocol version";
        default:
                return err < 0 ? strerror(-err) : "unknown error";
        }
}

/* Sends on the current connection (which the service thread may replace). */
static int send_env(gpumem_client *c, const Gpumem__Envelope *env) {
        pthread_rwlock_rdlock(&c->fd_lock);
        int r = gm_msg_send(c->fd, env, NULL, 0, c->max_packet);
        pthread_rwlock_unlock(&c->fd_lock);
        return r;
}

/* The free of a block of `stream`, `size` bytes, went out (a Free or
 * FreeCompleted): the next Alloc checks that stream (client_fences). A
 * block smaller than a page holds no whole page: its free is not checked
 * (the cost of a cached small pair stays nil; a page it completes by
 * merging waits for a mark the daemon asks for). Caller holds lock. */
static void fences_freed(gpumem_client *c, uint64_t stream, uint64_t size) {
        if (size < c->mapper->granularity || !atomic_load_explicit(&c->client_fences, memory_order_relaxed))
                return;
        gm_fences_freed(&c->fences, stream);
        atomic_store_explicit(&c->fences_freed, c->fences.n_freed > 0, memory_order_relaxed);
}

/* A send failing this way means the daemon went away: the service thread
 * decides whether the session re-attaches (and requests are sent again) or
 * is lost. */
static bool connection_lost(int r) {
        return r == -EPIPE || r == -ECONNRESET || r == -ENOTCONN;
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

/* Page reuse: moves one mapped piece to another place of this session's
 * segments, as the heap (the daemon's, or the local one) decided. -EPROTO
 * for a move that does not fit what is mapped here; else 0 or the mapper's
 * error, nothing changed. Caller holds lock. */
static int move_piece(gpumem_client *c, const Gpumem__PageMove *mv) {
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

/* Maps every mapping of a packet (fds in order); fds without a mapping are closed. */
static int map_pieces(gpumem_client *c, Gpumem__Mapping **maps, size_t n_maps, int *fds, size_t n_fds) {
        int err = n_maps == n_fds ? 0 : -EPROTO;
        size_t i = 0;
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

/* Unmaps one range the daemon asks back. Returns false when it cannot be
 * called released: the driver refused the unmap (the piece stays mapped and
 * known), or the range names a segment this client does not know, whose
 * memory it cannot account for. Caller holds lock. */
static bool unmap_range(gpumem_client *c, const Gpumem__Range *range) {
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
static void sync_release_streams(gpumem_client *c, const Gpumem__ReleaseRequest *req) {
        if (!c->mapper->ops->sync)
                return;
        uint64_t streams[16];
        size_t n = 0;
        bool all = false; /* more distinct streams than kept: the device's default stream, which orders them */
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
                streams[0] = 0;
        }
        for (size_t k = 0; k < n; k++)
                c->mapper->ops->sync(c->mapper, streams[k]);
}

/* ---- the service thread ---- */

static void wake_service(gpumem_client *c) {
        uint64_t one = 1;
        if (write(c->wake_fd, &one, sizeof(one)) < 0) {
                /* The counter is full: the service thread is awake anyway. */
        }
}

static waiter_t *waiter_find(gpumem_client *c, uint64_t request_id) {
        for (waiter_t *w = c->waiters; w; w = w->next)
                if (w->request_id == request_id)
                        return w;
        return NULL;
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
        send_env(c, &env);
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
                int r = move_piece(c, moves[i]);
                if (r < 0 && w && !w->error) {
                        w->error = r;
                        snprintf(w->detail, sizeof(w->detail), "%s", gm_cuda_last_error());
                }
        }
}

/* Handles one packet from the daemon. Caller holds lock. */
static void dispatch(gpumem_client *c, Gpumem__Envelope *env, int *fds, size_t n_fds) {
        waiter_t *w = env->request_id ? waiter_find(c, env->request_id) : NULL;
        switch (env->body_case) {
        case GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST: {
                gm_close_fds(fds, n_fds);
                Gpumem__ReleaseRequest *req = env->release_request;
                size_t n_kept = 0; /* the ranges still mapped go first in req->ranges */
                for (size_t i = 0; i < req->n_ranges; i++)
                        if (!unmap_range(c, req->ranges[i])) {
                                Gpumem__Range *kept = req->ranges[i];
                                req->ranges[i] = req->ranges[n_kept];
                                req->ranges[n_kept++] = kept;
                        }
                send_release_ack(c, req->release_id, req->ranges, n_kept);
                gm_msg_free(env);
                return;
        }
        case GPUMEM__ENVELOPE__BODY_MAP_SEGMENTS:
                map_for_waiter(c, w, env->map_segments->mappings, env->map_segments->n_mappings, fds, n_fds);
                gm_msg_free(env);
                return;
        case GPUMEM__ENVELOPE__BODY_ALLOC_REPLY:
                move_for_waiter(c, w, env->alloc_reply->page_moves, env->alloc_reply->n_page_moves);
                map_for_waiter(c, w, env->alloc_reply->new_mappings, env->alloc_reply->n_new_mappings, fds, n_fds);
                break;
        case GPUMEM__ENVELOPE__BODY_GRANT_REPLY: {
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
                break;
        }
        case GPUMEM__ENVELOPE__BODY_SNAPSHOT_QUERY:
        case GPUMEM__ENVELOPE__BODY_HISTORY_PUSH:
                gm_close_fds(fds, n_fds);
                if (c->local && gm_local_asks_note(&c->asks, env))
                        wake_service(c);
                gm_msg_free(env);
                return;
        case GPUMEM__ENVELOPE__BODY_ALLOC_CONF_UPDATE: {
                /* Given to the heap by the service thread once it holds it. */
                gm_close_fds(fds, n_fds);
                char *conf = c->local ? strdup(env->alloc_conf_update->alloc_conf) : NULL;
                if (conf) {
                        free(c->alloc_conf_update);
                        c->alloc_conf_update = conf;
                        wake_service(c);
                }
                gm_msg_free(env);
                return;
        }
        case GPUMEM__ENVELOPE__BODY_RECLAIM:
                /* Served by the service thread once it holds the heap. */
                gm_close_fds(fds, n_fds);
                if (c->local && env->reclaim->reclaim_id) {
                        c->reclaim_id = env->reclaim->reclaim_id;
                        c->reclaim_bytes = env->reclaim->bytes;
                        wake_service(c);
                }
                gm_msg_free(env);
                return;
        default:
                if (w && w->fd < 0 && n_fds > 0) {
                        w->fd = fds[0];
                        fds++;
                        n_fds--;
                }
                gm_close_fds(fds, n_fds);
                break;
        }
        if (!w) {
                if (env->body_case == GPUMEM__ENVELOPE__BODY_ERROR)
                        snprintf(c->async_error, sizeof(c->async_error), "%s", env->error->message);
                gm_msg_free(env);
                return;
        }
        w->reply = env;
        w->done = true;
        pthread_cond_signal(&w->cond);
}

/* Sends FreeCompleted (local mode: completes the free in the heap) for
 * every pending free whose stream work is done. Caller holds lock. Returns
 * true while some remain pending. */
static bool complete_pending_frees(gpumem_client *c) {
        for (pending_free_t **pp = &c->pending_frees; *pp;) {
                pending_free_t *p = *pp;
                bool done = true;
                for (size_t i = 0; i < p->n_events && done; i++)
                        done = c->mapper->ops->event_query(c->mapper, p->events[i]) != 0; /* errors end the wait */
                if (!done) {
                        pp = &p->next;
                        continue;
                }
                *pp = p->next;
                if (c->local) {
                        /* The heap is taken before lock: the service thread finishes it. */
                        p->next = c->completed_frees;
                        c->completed_frees = p;
                        continue;
                } else {
                        Gpumem__FreeCompleted fc = GPUMEM__FREE_COMPLETED__INIT;
                        fc.block_id = p->block_id;
                        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
                        env.request_id = ++c->next_request_id;
                        env.body_case = GPUMEM__ENVELOPE__BODY_FREE_COMPLETED;
                        env.free_completed = &fc;
                        send_env(c, &env);
                        fences_freed(c, p->block.stream, p->block.size);
                }
                pending_free_destroy(c, p, true);
        }
        return c->pending_frees != NULL || c->completed_frees != NULL;
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
        if (pthread_mutex_trylock(&c->heap_lock) != 0) {
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
                gm_local_free_completed(c->heap, p->block_id);
                pending_free_destroy(c, p, true);
        }
        pthread_mutex_unlock(&c->heap_lock);
        return false;
}

/* empty_cache(): what the heap gave back and the daemon got (pieces whose
 * unmap failed stay here: not released). Caller holds heap_lock. */
static uint64_t local_release_cached(gpumem_client *c) {
        uint64_t kept = c->kept_bytes;
        uint64_t released = gm_local_release_cached(c->heap);
        uint64_t newly_kept = c->kept_bytes - kept;
        return released > newly_kept ? released - newly_kept : 0;
}

/* Serves the daemon's Reclaim: the heap gives its idle cached memory back
 * (ReturnPieces), then the acknowledgement follows. Service thread only,
 * holding neither lock; a busy heap is tried again at the next poll.
 * Returns true while a reclaim waits. */
static bool serve_reclaim(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        uint64_t id = c->reclaim_id;
        pthread_mutex_unlock(&c->lock);
        if (!id)
                return false;
        if (pthread_mutex_trylock(&c->heap_lock) != 0)
                return true;
        uint64_t released = local_release_cached(c);
        pthread_mutex_unlock(&c->heap_lock);
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
        send_env(c, &env);
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
        if (pthread_mutex_trylock(&c->heap_lock) != 0) {
                pthread_mutex_lock(&c->lock);
                if (!c->alloc_conf_update) /* a newer one wins */
                        c->alloc_conf_update = conf;
                else
                        free(conf);
                pthread_mutex_unlock(&c->lock);
                return true;
        }
        char err[256];
        int r = gm_local_set_config(c->heap, conf, err, sizeof(err));
        pthread_mutex_unlock(&c->heap_lock);
        free(conf);
        if (r < 0) {
                pthread_mutex_lock(&c->lock);
                snprintf(c->async_error, sizeof(c->async_error), "gpumem: the daemon's new alloc_conf was refused: %s",
                         err);
                pthread_mutex_unlock(&c->lock);
        }
        return false;
}

/* Pending stream events are polled after EVENT_POLL_MIN_MS, backing off to
 * EVENT_POLL_MAX_MS while they stay pending; a new stream-ordered free starts
 * from the minimum again. */
#define EVENT_POLL_MIN_MS 1
#define EVENT_POLL_MAX_MS 64

static bool reconnect(gpumem_client *c);
static bool local_page_replace_pending(gpumem_client *c);

/* Makes the receive buffer fit the daemon's packets. Caller holds read_lock. */
static int rx_buf_fit(gpumem_client *c) {
        size_t cap = GM_IPC_MAX_PACKET_DEFAULT > c->max_packet ? GM_IPC_MAX_PACKET_DEFAULT : c->max_packet;
        if (cap <= c->rx_cap)
                return 0;
        uint8_t *buf = realloc(c->rx_buf, cap);
        if (!buf)
                return -ENOMEM;
        c->rx_buf = buf;
        c->rx_cap = cap;
        return 0;
}

/* Reads one packet and dispatches it. Caller holds read_lock. Returns 0, or
 * the negative errno of a connection that ended or spoke nonsense (the
 * service thread deals with that). With `mine`, *ret_mine_done tells
 * whether that waiter has its reply now. */
static int read_packet(gpumem_client *c, bool *ret_pending, const waiter_t *mine, bool *ret_mine_done) {
        int fds[GM_IPC_MAX_FDS_LIMIT];
        size_t len = 0, n_fds = 0;
        pthread_rwlock_rdlock(&c->fd_lock);
        int r = gm_ipc_recv(c->fd, c->rx_buf, c->rx_cap, fds, c->max_fds, &len, &n_fds);
        pthread_rwlock_unlock(&c->fd_lock);
        if (r < 0)
                return r;
        Gpumem__Envelope *env = NULL;
        if (gm_msg_unpack(c->rx_buf, len, &env) < 0) {
                gm_close_fds(fds, n_fds);
                return -EPROTO;
        }
        if (env->body_case == GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST)
                sync_release_streams(c, env->release_request);
        pthread_mutex_lock(&c->lock);
        dispatch(c, env, fds, n_fds);
        bool pending = complete_pending_frees(c);
        if (mine)
                *ret_mine_done = mine->done;
        pthread_mutex_unlock(&c->lock);
        if (ret_pending)
                *ret_pending = pending;
        return 0;
}

/* How long calling threads have the socket to themselves: while calls are
 * in flight (and for CALLER_GRACE_MS after the last) they read their own
 * replies and whatever comes before them; the service thread, off the
 * socket, is not woken by every reply. 0: the socket is the service
 * thread's (no recent calls, or a caller's read failed). */
#define CALLER_GRACE_MS 10

static void reader_done(gpumem_client *c);

static int socket_left_to_callers(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        bool lost = c->reader_lost || c->dead;
        pthread_mutex_unlock(&c->lock);
        if (lost)
                return 0;
        if (atomic_load_explicit(&c->callers, memory_order_relaxed) > 0)
                return CALLER_GRACE_MS;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        uint64_t now = (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
        uint64_t last = atomic_load_explicit(&c->last_call_ms, memory_order_relaxed);
        return last && now - last < CALLER_GRACE_MS ? (int) (CALLER_GRACE_MS - (now - last)) : 0;
}

static void *service_main(void *arg) {
        gpumem_client *c = arg;
        bool pending = false;
        int poll_ms = EVENT_POLL_MIN_MS;
        for (;;) {
                bool reclaiming = c->local && (serve_reclaim(c) | serve_alloc_conf(c) | finish_completed_frees(c) |
                                               local_page_replace_pending(c) | gm_local_asks_serve(c));
                int timeout = pending || reclaiming ? poll_ms : -1;
                int off_ms = socket_left_to_callers(c);
                if (off_ms > 0 && (timeout < 0 || off_ms < timeout))
                        timeout = off_ms;
                struct pollfd pfd[2] = {{.fd = off_ms > 0 ? -1 : c->fd, .events = POLLIN},
                                        {.fd = c->wake_fd, .events = POLLIN}};
                int n = poll(pfd, 2, timeout);
                if (n < 0 && errno != EINTR)
                        break;
                if (n == 0 && poll_ms < EVENT_POLL_MAX_MS)
                        poll_ms *= 2;
                if (pfd[1].revents & POLLIN) {
                        poll_ms = EVENT_POLL_MIN_MS;
                        uint64_t v;
                        if (read(c->wake_fd, &v, sizeof(v)) < 0) {
                        }
                }
                if (!(pfd[0].revents & (POLLIN | POLLHUP | POLLERR))) {
                        pthread_mutex_lock(&c->lock);
                        pending = complete_pending_frees(c);
                        pthread_mutex_unlock(&c->lock);
                        continue;
                }
                /* A calling thread may be reading its own reply; once it is done,
                 * see whether anything is left. */
                pthread_mutex_lock(&c->read_lock);
                struct pollfd again = {.fd = c->fd, .events = POLLIN};
                int r = poll(&again, 1, 0) > 0 ? read_packet(c, &pending, NULL, NULL) : 0;
                pthread_mutex_unlock(&c->read_lock);
                reader_done(c);
                if (r == 0 || r == -EINTR || r == -EAGAIN)
                        continue;
                if (r == -ECONNRESET && reconnect(c)) {
                        /* The daemon restarted and the session is back; its limits may differ. */
                        pthread_mutex_lock(&c->read_lock);
                        r = rx_buf_fit(c);
                        pthread_mutex_unlock(&c->read_lock);
                        pthread_mutex_lock(&c->lock);
                        c->reader_lost = false;
                        pthread_mutex_unlock(&c->lock);
                        reader_done(c);
                        if (r == 0)
                                continue;
                }
                pthread_mutex_lock(&c->lock);
                /* The daemon is gone (or spoke nonsense): fail every waiter. */
                c->dead = true;
                for (waiter_t *w = c->waiters; w; w = w->next) {
                        w->error = -ECONNRESET;
                        w->done = true;
                        pthread_cond_signal(&w->cond);
                }
                pthread_mutex_unlock(&c->lock);
                break;
        }
        return NULL;
}

/* ---- requests ---- */

/* Fire-and-forget request (free): the daemon answers only when it refuses.
 * Caller holds lock. */
static int post_locked(gpumem_client *c, Gpumem__Envelope *env) {
        if (c->dead)
                return set_error(c, -ECONNRESET, "gpumem: the connection to gpumemd is closed");
        env->request_id = ++c->next_request_id;
        int r = send_env(c, env);
        /* A free lost with the connection is carried by the re-attach ledger. */
        if (r < 0 && connection_lost(r) && c->token[0] && c->reconnect_timeout_ms)
                return 0;
        return r < 0 ? set_error(c, connection_lost(r) ? -ECONNRESET : r, "gpumem: cannot send to gpumemd") : 0;
}

/* The thread that read the socket (holding read_lock) let it go: every
 * waiter still without its reply tries to read next. Caller holds lock. */
static void reader_done_locked(gpumem_client *c) {
        c->reader_generation++;
        for (waiter_t *w = c->waiters; w; w = w->next)
                if (!w->done)
                        pthread_cond_signal(&w->cond);
}

static void reader_done(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        reader_done_locked(c);
        pthread_mutex_unlock(&c->lock);
}

/* Holding read_lock (released here): reads until w's reply is in,
 * dispatching whatever comes first: no thread wake-up between the reply and
 * its caller. A failed read is the service thread's to judge. Returns true
 * when w has its reply; the caller then owes reader_done_locked() (done in
 * the critical section it takes next anyway). */
static bool read_own_reply(gpumem_client *c, waiter_t *w) {
        pthread_mutex_lock(&c->lock);
        bool done = w->done;
        pthread_mutex_unlock(&c->lock);
        int r = 0;
        while (!done && (r = read_packet(c, NULL, w, &done)) == 0) {
        }
        pthread_mutex_unlock(&c->read_lock);
        if (done)
                return true;
        if (r < 0) {
                pthread_mutex_lock(&c->lock);
                c->reader_lost = true;
                pthread_mutex_unlock(&c->lock);
                wake_service(c);
        }
        reader_done(c);
        return false;
}

/* Calls in flight, and when the last one ended: while callers read their own
 * replies the service thread keeps off the socket. */
static void calls_begin(gpumem_client *c) {
        atomic_fetch_add_explicit(&c->callers, 1, memory_order_relaxed);
}

static void calls_end(gpumem_client *c) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        atomic_store_explicit(&c->last_call_ms, (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u,
                              memory_order_relaxed);
        atomic_fetch_sub_explicit(&c->callers, 1, memory_order_relaxed);
}

/* Sends an Alloc with the fences complete since the last report (a central
 * session on a device backend). Reports are built and sent under lock, so
 * the daemon gets each stream's numbers in rising order; a resent Alloc
 * (after a re-attach) reports what is complete for the new daemon. After
 * frees (client_fences), an event recorded under lock on each stream freed
 * on follows every free sent before the Alloc (they are sent under lock
 * too): those complete at once are named (frees_fenced for the Alloc's own
 * stream, other_frees_fenced) and their pages may move in this allocation. */
static int send_alloc(gpumem_client *c, Gpumem__Envelope *env) {
        /* No mark outstanding: every complete one was reported when it was
         * popped, and an Alloc without a report needs no order. */
        if (!atomic_load_explicit(&c->fences_pending, memory_order_relaxed) &&
            !atomic_load_explicit(&c->fences_freed, memory_order_relaxed))
                return send_env(c, env);
        gm_fence_done_t done[GM_FENCE_STREAMS];
        Gpumem__StreamFence msgs[GM_FENCE_STREAMS], *ptrs[GM_FENCE_STREAMS];
        pthread_mutex_lock(&c->lock);
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
        int r = send_env(c, env);
        env->alloc->fences_done = NULL;
        env->alloc->n_fences_done = 0;
        env->alloc->frees_fenced = false;
        env->alloc->other_frees_fenced = NULL;
        env->alloc->n_other_frees_fenced = 0;
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* Sends `env` and waits for its reply. On success *ret_reply is the reply
 * (an Error body is turned into its negative code and message) and, when
 * ret_fd is not NULL, *ret_fd the first fd it carried or -1 (the caller's to
 * close); fds nobody asked for are closed. */
static int call_fd_inner(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply, int *ret_fd);

static int call_fd(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply, int *ret_fd) {
        calls_begin(c);
        int r = call_fd_inner(c, env, ret_reply, ret_fd);
        calls_end(c);
        return r;
}

static int call_fd_inner(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply, int *ret_fd) {
        waiter_t w = {.cond = PTHREAD_COND_INITIALIZER, .fd = -1};
        pthread_mutex_lock(&c->lock);
        if (c->dead) {
                pthread_mutex_unlock(&c->lock);
                return set_error(c, -ECONNRESET, "gpumem: the connection to gpumemd is closed");
        }
        w.request_id = ++c->next_request_id;
        w.next = c->waiters;
        c->waiters = &w;
        pthread_mutex_unlock(&c->lock);

        int r;
        for (;;) {
                env->request_id = w.request_id;
                r = env->body_case == GPUMEM__ENVELOPE__BODY_ALLOC ? send_alloc(c, env) : send_env(c, env);
                if (r < 0 && connection_lost(r))
                        r = 0; /* the service thread tells us: resend or lost */
                bool read_it = false;
                while (r == 0) {
                        pthread_mutex_lock(&c->lock);
                        uint64_t generation = c->reader_generation;
                        bool wait_only = w.done || c->reader_lost;
                        pthread_mutex_unlock(&c->lock);
                        if (wait_only)
                                break;
                        if (pthread_mutex_trylock(&c->read_lock) == 0) {
                                if ((read_it = read_own_reply(c, &w)))
                                        break;
                                continue;
                        }
                        /* Another thread reads: it hands over when it is done. */
                        pthread_mutex_lock(&c->lock);
                        if (!w.done && c->reader_generation == generation)
                                pthread_cond_wait(&w.cond, &c->lock);
                        pthread_mutex_unlock(&c->lock);
                }
                pthread_mutex_lock(&c->lock);
                if (read_it)
                        reader_done_locked(c);
                /* A call the service thread makes (a Reclaim's give-back)
                 * cannot wait for itself to reconnect. */
                if (r == 0 && !w.done && c->reader_lost && pthread_equal(pthread_self(), c->service))
                        r = -ECONNRESET;
                while (r == 0 && !w.done)
                        pthread_cond_wait(&w.cond, &c->lock);
                if (r < 0 || !w.resend)
                        break;
                w.resend = false;
                w.done = false;
                pthread_mutex_unlock(&c->lock);
        }
        for (waiter_t **wp = &c->waiters; *wp; wp = &(*wp)->next)
                if (*wp == &w) {
                        *wp = w.next;
                        break;
                }
        pthread_mutex_unlock(&c->lock);
        pthread_cond_destroy(&w.cond);
        if (w.fd >= 0 &&
            (!ret_fd || r < 0 || w.error < 0 || !w.reply || w.reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR)) {
                close(w.fd);
                w.fd = -1;
        }

        if (r < 0)
                return set_error(c, r == -EPIPE ? -ECONNRESET : r, "gpumem: cannot send to gpumemd: %s", strerror(-r));
        Gpumem__Envelope *reply = w.reply;
        if (reply && reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                int err = -(int) reply->error->code;
                set_error(c, err ? err : -EPROTO, "%s", reply->error->message ? reply->error->message : "");
                gm_msg_free(reply);
                return err ? err : -EPROTO;
        }
        if (w.error < 0 && reply && reply->body_case == GPUMEM__ENVELOPE__BODY_GRANT_REPLY)
                c->grant_unmapped = true; /* under heap_lock: the granting thread gives it back */
        if (w.error < 0 && reply && reply->body_case == GPUMEM__ENVELOPE__BODY_ALLOC_REPLY) {
                /* The block's memory could not be mapped here: give the block
                 * back and ask for the session's idle segments, the unmapped
                 * one among them, so no later block lands in it. */
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
                if (post_locked(c, &fenv) == 0)
                        post_locked(c, &tenv);
                pthread_mutex_unlock(&c->lock);
        }
        if (w.error < 0) {
                gm_msg_free(reply);
                return w.error == -ECONNRESET
                               ? set_error(c, -ECONNRESET, "gpumem: gpumemd closed the connection")
                               : set_error(c, w.error, "gpumem: mapping memory from gpumemd failed: %s%s%s",
                                           strerror(-w.error), w.detail[0] ? ": " : "", w.detail);
        }
        *ret_reply = reply;
        if (ret_fd)
                *ret_fd = w.fd;
        return 0;
}

static int call(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply) {
        return call_fd(c, env, ret_reply, NULL);
}

/* call() whose reply must have body `want`. */
static int call_expect(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want,
                       Gpumem__Envelope **ret_reply) {
        Gpumem__Envelope *reply = NULL;
        int r = call(c, env, &reply);
        if (r < 0)
                return r;
        if (reply->body_case != want) {
                gm_msg_free(reply);
                return set_error(c, -EPROTO, "gpumem: unexpected reply from gpumemd");
        }
        *ret_reply = reply;
        return 0;
}

static int post(gpumem_client *c, Gpumem__Envelope *env) {
        pthread_mutex_lock(&c->lock);
        int r = post_locked(c, env);
        pthread_mutex_unlock(&c->lock);
        return r;
}

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
static bool granted_as_asked(const gpumem_client *c, const Gpumem__GrantReply *gr, const gm_local_grant_t *g,
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

/* One Grant for n pieces from `offset` (n <= max_grant_pieces: their fds
 * come in one packet); the reply's mappings are made by whichever thread reads it,
 * before this returns. All or nothing: pieces that cannot all be mapped go
 * back (with whole_segment when `whole_at_first`: the segment had no piece
 * before). Caller holds heap_lock. */
static int grant_run(gpumem_client *c, const gm_local_grant_t *g, uint64_t offset, uint64_t n, bool whole_at_first) {
        Gpumem__Grant grant = GPUMEM__GRANT__INIT;
        grant.segment_id = g->segment_id;
        grant.segment_va_size = g->segment_va_size;
        grant.offset = offset;
        grant.size = g->size;
        grant.n_pieces = (uint32_t) n;
        grant.block_size = g->block_size;
        grant.largest_free = g->largest_free;
        grant.will_retry = g->will_retry;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_GRANT;
        env.grant = &grant;
        Gpumem__Envelope *reply = NULL;
        int r = call_expect(c, &env, GPUMEM__ENVELOPE__BODY_GRANT_REPLY, &reply);
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
                return set_error(c, -EPROTO, "gpumem: the daemon granted another piece than asked for");
        }
        return 0;
}

/* Asks the daemon for the heap's pieces, all or nothing: a run of pages in
 * one Grant per max_grant_pieces pieces (a piece kept mapped after a failed unmap is
 * taken back as it is). On failure what was granted goes back. Caller holds
 * heap_lock. */
static int local_grant(void *ctx, const gm_local_grant_t *g) {
        gpumem_client *c = ctx;
        const segment_t *seg = gm_u64map_get(&c->segments, g->segment_id);
        bool new_segment = !seg || seg->n_pieces == 0;
        uint64_t done = 0;
        int r = 0;
        while (r == 0 && done < g->n_pieces) {
                uint64_t offset = g->offset + done * g->size, n = 0;
                seg = gm_u64map_get(&c->segments, g->segment_id);
                if (kept_piece(c, seg, g->size, offset)) {
                        c->kept_bytes -= g->size;
                        done++;
                        continue;
                }
                while (done + n < g->n_pieces && n < c->max_grant_pieces &&
                       (n == 0 || !kept_piece(c, seg, g->size, offset + n * g->size)))
                        n++;
                r = grant_run(c, g, offset, n, new_segment && done == 0);
                done += r == 0 ? n : 0;
        }
        if (r < 0)
                local_give_back(c, g->segment_id, g->offset, g->size, done, new_segment);
        return r;
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
        if (call_expect(c, &env, GPUMEM__ENVELOPE__BODY_OK, &reply) < 0)
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
                if (!gm_u64map_get(&c->segments, segment_id) || unmap_range(c, range))
                        ptrs[ret.n_ranges++] = range;
                else
                        c->kept_bytes += size;
                ret.closes_intent = intent && k + 1 == n_pieces;
                if (ret.n_ranges == RETURNS_PER_MESSAGE || ((ret.n_ranges || intent) && k + 1 == n_pieces)) {
                        post_locked(c, &env);
                        ret.n_ranges = 0;
                }
        }
        pthread_mutex_unlock(&c->lock);
}

/* Pieces one MovePieces names at most (the daemon's limit). */
#define MAX_MOVES_PER_MESSAGE 512

/* Page reuse in a local heap: moves a run of pieces here, in order, and
 * tells the daemon, one message per MAX_MOVES_PER_MESSAGE moved (its ledger
 * follows; no reply). Caller holds heap_lock. */
static int64_t local_move(void *ctx, const gm_local_move_t *m) {
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
                        if ((r = move_piece(c, move)) == 0)
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
                post_locked(c, &env); /* lost with the connection: the re-attach reports where it is */
        }
        pthread_mutex_unlock(&c->lock);
        free(moves);
        free(ptrs);
        return done ? (int64_t) done : r;
}

static int mapper_event_record(void *ctx, uint64_t stream, uint64_t *ret_event) {
        gpumem_client *c = ctx;
        return c->mapper->ops->event_record(c->mapper, stream, ret_event);
}

static int mapper_event_query(void *ctx, uint64_t event) {
        gpumem_client *c = ctx;
        return c->mapper->ops->event_query(c->mapper, event);
}

static void mapper_event_destroy(void *ctx, uint64_t event) {
        gpumem_client *c = ctx;
        c->mapper->ops->event_destroy(c->mapper, event);
}

/* Maps the statistics page (fd stays the caller's) and starts the heap with
 * the daemon's allocator settings. */
static int local_heap_open(gpumem_client *c, const Gpumem__HelloReply *hr, int page_fd) {
        int r = gm_statpage_map(page_fd, true, &c->stats_page);
        if (r < 0)
                return set_error(c, -EPROTO, "gpumem: the daemon's statistics page is unusable: %s", strerror(-r));
        madvise(c->stats_page, GM_STATPAGE_SIZE, MADV_DONTFORK); /* a forked child never writes the parent's */
        bool events = c->mapper->ops->event_record != NULL;
        gm_local_ops_t ops = {
                .grant = local_grant,
                .give_back = local_give_back,
                .move = c->mapper->ops->move ? local_move : NULL,
                .event_record = events ? mapper_event_record : NULL,
                .event_query = events ? mapper_event_query : NULL,
                .event_destroy = events ? mapper_event_destroy : NULL,
                .ctx = c,
        };
        char err[256] = "";
        r = gm_local_new(hr->alloc_conf, hr->capacity, hr->granularity, c->stats_page, &ops, &c->heap, err,
                         sizeof(err));
        if (r < 0)
                return set_error(c, r, "gpumem: cannot start the local heap: %s", err[0] ? err : strerror(-r));
        c->local = true;
        if (hr->history_max_entries) /* the daemon's memory history is on: record from the first allocation */
                gm_local_history(c->heap, true, hr->history_max_entries, (uint32_t) getpid());
        return 0;
}

/* The new daemon's page takes the old one's place at the same address (the
 * heap keeps its statistics there), with its figures. Caller holds
 * heap_lock. Consumes page_fd. */
static void local_page_swap(gpumem_client *c, int page_fd) {
        gm_stats_t figures;
        memcpy(&figures, gm_statpage_payload(c->stats_page), sizeof(figures));
        void *p = mmap(c->stats_page, GM_STATPAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, page_fd, 0);
        if (p != MAP_FAILED) {
                madvise(p, GM_STATPAGE_SIZE, MADV_DONTFORK);
                gm_statpage_write_begin(c->stats_page);
                memcpy(gm_statpage_payload(c->stats_page), &figures, sizeof(figures));
                gm_statpage_write_end(c->stats_page);
        }
        close(page_fd);
}

/* After a re-attach: swaps in the new daemon's statistics page, now if the
 * heap is free, else the service thread does it once it is (the new daemon
 * reads zeros until then). Consumes page_fd. Caller holds lock. */
static int local_page_replace(gpumem_client *c, int page_fd) {
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
        if (pthread_mutex_trylock(&c->heap_lock) == 0) {
                local_page_swap(c, page_fd);
                pthread_mutex_unlock(&c->heap_lock);
        } else {
                c->page_fd_pending = page_fd;
        }
        return 0;
}

/* The service thread's part of local_page_replace(), holding neither lock;
 * a busy heap is tried again at the next poll. Returns true while a page
 * waits. */
static bool local_page_replace_pending(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        bool waiting = c->page_fd_pending >= 0;
        if (waiting && pthread_mutex_trylock(&c->heap_lock) == 0) {
                /* heap_lock goes before lock, so only a trylock may come after it */
                local_page_swap(c, c->page_fd_pending);
                c->page_fd_pending = -1;
                waiting = false;
                pthread_mutex_unlock(&c->heap_lock);
        }
        pthread_mutex_unlock(&c->lock);
        return waiting;
}

/* ---- session lifetime ---- */

/* Receives one envelope on a blocking socket (the service thread is not
 * reading it yet). The packet's first fd goes to *ret_fd (-1 if none) when
 * ret_fd is not NULL; every other fd is closed. */
static int recv_env(gpumem_client *c, int fd, Gpumem__Envelope **ret_env, int *ret_fd) {
        size_t cap = c->max_packet ? c->max_packet : GM_IPC_MAX_PACKET_DEFAULT;
        uint8_t *buf = malloc(cap);
        int fds[GM_IPC_MAX_FDS_LIMIT];
        size_t len = 0, n_fds = 0, kept = 0;
        int r = buf ? gm_ipc_recv(fd, buf, cap, fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds) : -ENOMEM;
        if (r == 0) {
                kept = ret_fd && n_fds > 0 ? 1 : 0;
                gm_close_fds(fds + kept, n_fds - kept);
                r = gm_msg_unpack(buf, len, ret_env);
                if (r < 0 && kept)
                        close(fds[0]);
                else if (ret_fd)
                        *ret_fd = kept ? fds[0] : -1;
        }
        free(buf);
        return r;
}

/* The Hello heap mode for the application's choice (and $GPUMEM_HEAP). */
static int hello_heap_mode(const gpumem_client *c, Gpumem__HeapMode *ret_mode) {
        gpumem_heap_mode choice = c->heap_choice;
        const char *env = getenv("GPUMEM_HEAP");
        if (choice == GPUMEM_HEAP_DEFAULT && env && *env) {
                if (strcmp(env, "local") == 0)
                        choice = GPUMEM_HEAP_LOCAL;
                else if (strcmp(env, "central") == 0)
                        choice = GPUMEM_HEAP_CENTRAL;
                else
                        return set_error(c, -EINVAL, "gpumem: GPUMEM_HEAP='%s': expected 'local' or 'central'", env);
        }
        *ret_mode = choice == GPUMEM_HEAP_LOCAL     ? GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL
                    : choice == GPUMEM_HEAP_CENTRAL ? GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL
                                                    : GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED;
        return 0;
}

/* Hello (fresh, or resuming the session `resume_token` names) on `fd`;
 * takes the daemon's limits and the session token from the reply. A local
 * session's statistics page comes back in *ret_page_fd (-1 otherwise). */
static int hello_exchange(gpumem_client *c, int fd, const char *resume_token, Gpumem__Envelope **ret_reply,
                          int *ret_page_fd) {
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        int r = hello_heap_mode(c, &hello.heap_mode);
        if (r < 0)
                return r;
        char name[64];
        snprintf(name, sizeof(name), "libgpumem pid %d", (int) getpid());
        hello.client_name = name;
        hello.resume_token = (char *) (resume_token ? resume_token : "");
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = ++c->next_request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        r = gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT);
        Gpumem__Envelope *reply = NULL;
        int page_fd = -1;
        if (r == 0 || r == -EPIPE) /* a daemon that refused us at once left its reason to read */
                r = recv_env(c, fd, &reply, &page_fd);
        if (r < 0)
                return set_error(c, connection_lost(r) ? -ECONNRESET : r, "gpumem: no hello from gpumemd at '%s': %s",
                                 c->socket_path, strerror(-r));
        bool local = reply->body_case == GPUMEM__ENVELOPE__BODY_HELLO_REPLY &&
                     reply->hello_reply->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL;
        if (page_fd >= 0 && !local) {
                close(page_fd);
                page_fd = -1;
        }
        if (reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                r = -(int) reply->error->code;
                set_error(c, r ? r : -EPROTO, "%s", reply->error->message);
                gm_msg_free(reply);
                return r ? r : -EPROTO;
        }
        if (reply->body_case != GPUMEM__ENVELOPE__BODY_HELLO_REPLY || (local && page_fd < 0)) {
                if (page_fd >= 0)
                        close(page_fd);
                gm_msg_free(reply);
                return set_error(c, -EPROTO, "gpumem: unexpected hello reply");
        }
        const Gpumem__HelloReply *hr = reply->hello_reply;
        c->max_packet = hr->max_packet ? hr->max_packet : GM_IPC_MAX_PACKET_DEFAULT;
        c->max_fds = hr->max_fds && hr->max_fds <= GM_IPC_MAX_FDS_LIMIT ? hr->max_fds : GM_IPC_MAX_FDS_LIMIT;
        c->max_grant_pieces = hr->grant_runs ? c->max_fds : 1;
        c->return_intents = hr->return_intents;
        snprintf(c->token, sizeof(c->token), "%s", hr->session_token ? hr->session_token : "");
        snprintf(c->tenant, sizeof(c->tenant), "%s", hr->tenant ? hr->tenant : "");
        c->device = hr->device;
        c->session_id = hr->session_id;
        *ret_reply = reply;
        *ret_page_fd = page_fd;
        return 0;
}

static int session_open(gpumem_client *c) {
        char why[512];
        int r = gm_peer_connect(c->socket_path, &c->fd, why, sizeof(why));
        if (r < 0)
                return set_error(c, r, "gpumem: %s", why);
        Gpumem__Envelope *reply = NULL;
        int page_fd = -1;
        r = hello_exchange(c, c->fd, NULL, &reply, &page_fd);
        if (r < 0)
                return r;
        const Gpumem__HelloReply *hr = reply->hello_reply;
        snprintf(c->backend, sizeof(c->backend), "%s", hr->backend);
        c->capacity = hr->capacity;
        r = gm_mapper_open(hr->backend,
                           &(gm_mapper_params_t){.device = hr->device,
                                                 .device_uuid = hr->device_uuid,
                                                 .granularity = hr->granularity},
                           &c->mapper);
        if (r == 0 && hr->caps && hr->caps->device_streams != c->mapper->ops->caps->device_streams)
                r = -EPROTO; /* the daemon's kind of that name is not this library's */
        if (r < 0) {
                gm_msg_free(reply);
                if (page_fd >= 0)
                        close(page_fd);
                return set_error(c, r, "gpumem: cannot map %s memory in this process: %s%s%s%s", c->backend,
                                 strerror(-r), gm_cuda_last_error()[0] ? " (" : "", gm_cuda_last_error(),
                                 gm_cuda_last_error()[0] ? ")" : "");
        }
        if (c->mapper->ops->event_record) {
                gm_fences_init(&c->fences, &(gm_fence_ops_t){.record = mapper_event_record,
                                                             .query = mapper_event_query,
                                                             .destroy = mapper_event_destroy,
                                                             .ctx = c});
                atomic_store_explicit(&c->client_fences, hr->client_fences, memory_order_relaxed);
        }
        if (page_fd >= 0) {
                r = local_heap_open(c, hr, page_fd);
                close(page_fd);
        }
        gm_msg_free(reply);
        if (r < 0)
                return r;
        c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->wake_fd < 0)
                return set_error(c, -errno, "gpumem: eventfd: %s", strerror(errno));
        if (rx_buf_fit(c) < 0)
                return set_error(c, -ENOMEM, "gpumem: out of memory");
        r = -pthread_create(&c->service, NULL, service_main, c);
        if (r < 0)
                return set_error(c, r, "gpumem: cannot start the service thread");
        c->service_started = true;
        return 0;
}

/* ---- re-attach after a daemon restart ---- */

/* Budget of one Reattach packet, well inside max_packet. */
static size_t reattach_budget(const gpumem_client *c) {
        return c->max_packet / 2;
}

typedef struct reattach_builder {
        Gpumem__ReattachSegment *segs;
        Gpumem__ReattachSegment **seg_ptrs;
        Gpumem__Range *ranges;
        Gpumem__Range **range_ptrs;
        Gpumem__ReattachBlock *blocks;
        Gpumem__ReattachBlock **block_ptrs;
        size_t n_segs, n_ranges, n_blocks, bytes;
} reattach_builder_t;

static int reattach_flush(gpumem_client *c, int fd, reattach_builder_t *rb, bool last) {
        Gpumem__Reattach ra = GPUMEM__REATTACH__INIT;
        ra.n_segments = rb->n_segs;
        ra.segments = rb->seg_ptrs;
        ra.n_blocks = rb->n_blocks;
        ra.blocks = rb->block_ptrs;
        ra.last = last;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = ++c->next_request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_REATTACH;
        env.reattach = &ra;
        int r = gm_msg_send(fd, &env, NULL, 0, c->max_packet);
        rb->n_segs = rb->n_ranges = rb->n_blocks = rb->bytes = 0;
        return r;
}

static int reattach_block(gpumem_client *c, int fd, reattach_builder_t *rb, const block_t *b, bool pending) {
        if (rb->bytes + 64 > reattach_budget(c)) {
                int r = reattach_flush(c, fd, rb, false);
                if (r < 0)
                        return r;
        }
        Gpumem__ReattachBlock *rbk = &rb->blocks[rb->n_blocks];
        gpumem__reattach_block__init(rbk);
        rbk->block_id = b->id;
        rbk->segment_id = b->segment_id;
        rbk->offset = b->offset;
        rbk->size = b->size;
        rbk->requested_size = b->requested;
        rbk->pending_free = pending;
        rb->block_ptrs[rb->n_blocks++] = rbk;
        rb->bytes += 64;
        return 0;
}

/* Tells the daemon on `fd` everything this client holds: segments with their
 * mapped pieces, live blocks, frees waiting for streams. Caller holds lock. */
static int reattach_send(gpumem_client *c, int fd) {
        size_t max_items = reattach_budget(c) / 16 + 1;
        reattach_builder_t rb = {
                .segs = calloc(max_items, sizeof(*rb.segs)),
                .seg_ptrs = calloc(max_items, sizeof(*rb.seg_ptrs)),
                .ranges = calloc(max_items, sizeof(*rb.ranges)),
                .range_ptrs = calloc(max_items, sizeof(*rb.range_ptrs)),
                .blocks = calloc(max_items, sizeof(*rb.blocks)),
                .block_ptrs = calloc(max_items, sizeof(*rb.block_ptrs)),
        };
        int r = rb.segs && rb.seg_ptrs && rb.ranges && rb.range_ptrs && rb.blocks && rb.block_ptrs ? 0 : -ENOMEM;
        for (size_t i = 0; i < c->segments.cap && r == 0; i++) {
                const segment_t *seg = c->segments.values[i];
                if (!seg || seg->n_pieces == 0)
                        continue;
                size_t need = 48 + 24 * seg->n_pieces;
                if (need > reattach_budget(c)) {
                        r = -E2BIG; /* more mapped pieces than one packet describes */
                        break;
                }
                if (rb.bytes + need > reattach_budget(c) && (r = reattach_flush(c, fd, &rb, false)) < 0)
                        break;
                Gpumem__ReattachSegment *rs = &rb.segs[rb.n_segs];
                gpumem__reattach_segment__init(rs);
                rs->segment_id = seg->id;
                rs->va_size = seg->va_size;
                rs->stream = seg->stream;
                rs->n_mapped = seg->n_pieces;
                rs->mapped = rb.range_ptrs + rb.n_ranges;
                for (size_t k = 0; k < seg->n_pieces; k++) {
                        Gpumem__Range *range = &rb.ranges[rb.n_ranges];
                        gpumem__range__init(range);
                        range->segment_id = seg->id;
                        range->offset = seg->pieces[k];
                        range->length = seg->piece_size;
                        rb.range_ptrs[rb.n_ranges++] = range;
                }
                rb.seg_ptrs[rb.n_segs++] = rs;
                rb.bytes += need;
        }
        /* A local heap keeps its blocks to itself: segments and pieces only. */
        for (size_t i = 0; i < c->blocks.cap && r == 0 && !c->local; i++)
                if (c->blocks.values[i])
                        r = reattach_block(c, fd, &rb, c->blocks.values[i], false);
        for (pending_free_t *p = c->pending_frees; p && r == 0 && !c->local; p = p->next)
                r = reattach_block(c, fd, &rb, &p->block, true);
        if (r == 0)
                r = reattach_flush(c, fd, &rb, true);
        free(rb.segs);
        free(rb.seg_ptrs);
        free(rb.ranges);
        free(rb.range_ptrs);
        free(rb.blocks);
        free(rb.block_ptrs);
        return r;
}

/* One attempt: connect, resume the session, report the ledger, and on Ok
 * make the new connection current. Returns 0, -EAGAIN to try again later,
 * or another negative errno when the session cannot come back. */
static int reattach_once(gpumem_client *c) {
        int fd;
        char why[512];
        int r = gm_peer_connect(c->socket_path, &fd, why, sizeof(why));
        if (r < 0)
                return -EAGAIN;
        Gpumem__Envelope *reply = NULL;
        pthread_mutex_lock(&c->lock); /* no free may slip between the report and the switch */
        int page_fd = -1;
        r = hello_exchange(c, fd, c->token, &reply, &page_fd);
        if (r == 0 && page_fd >= 0)
                r = local_page_replace(c, page_fd);
        if (r == 0) {
                gm_msg_free(reply);
                reply = NULL;
                r = reattach_send(c, fd);
        }
        if (r == 0)
                r = recv_env(c, fd, &reply, NULL);
        if (r == 0 && reply->body_case != GPUMEM__ENVELOPE__BODY_OK)
                r = reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR && reply->error->code ? -(int) reply->error->code
                                                                                           : -EPROTO;
        gm_msg_free(reply);
        if (r < 0) {
                pthread_mutex_unlock(&c->lock);
                close(fd);
                return connection_lost(r) ? -EAGAIN : r;
        }
        pthread_rwlock_wrlock(&c->fd_lock);
        int old = c->fd;
        c->fd = fd;
        pthread_rwlock_unlock(&c->fd_lock);
        close(old);
        c->reconnecting = false;
        gm_fences_clear(&c->fences, true); /* the new daemon's fence numbers start over */
        atomic_store_explicit(&c->fences_pending, false, memory_order_relaxed);
        atomic_store_explicit(&c->fences_freed, false, memory_order_relaxed);
        for (waiter_t *w = c->waiters; w; w = w->next)
                if (!w->done) { /* sent to the old daemon, never answered */
                        w->resend = true;
                        w->done = true;
                        pthread_cond_signal(&w->cond);
                }
        pthread_mutex_unlock(&c->lock);
        return 0;
}

/* The daemon went away: reconnect with backoff and re-attach the session, for
 * at most reconnect_timeout_ms. Returns true when the session is back. */
static bool reconnect(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        bool give_up = c->closing || !c->token[0] || c->reconnect_timeout_ms == 0;
        c->reconnecting = !give_up;
        pthread_mutex_unlock(&c->lock);
        if (give_up)
                return false;
        struct timespec start;
        clock_gettime(CLOCK_MONOTONIC, &start);
        int backoff_ms = 10;
        for (;;) {
                struct pollfd pfd = {.fd = c->wake_fd, .events = POLLIN};
                poll(&pfd, 1, backoff_ms); /* gpumem_disconnect() wakes it */
                pthread_mutex_lock(&c->lock);
                bool closing = c->closing;
                pthread_mutex_unlock(&c->lock);
                if (closing)
                        break;
                int r = reattach_once(c);
                if (r == 0)
                        return true;
                struct timespec now;
                clock_gettime(CLOCK_MONOTONIC, &now);
                uint64_t elapsed = (uint64_t) (now.tv_sec - start.tv_sec) * 1000u +
                                   (uint64_t) ((now.tv_nsec - start.tv_nsec) / 1000000);
                if (r != -EAGAIN || elapsed >= c->reconnect_timeout_ms)
                        break;
                backoff_ms = backoff_ms < 500 ? backoff_ms * 2 : 1000;
        }
        pthread_mutex_lock(&c->lock);
        c->reconnecting = false;
        pthread_mutex_unlock(&c->lock);
        return false;
}

/* Stops the service thread and drops every mapping and table entry. `owner`
 * is false in a fork()ed child: the socket is shared with the parent (so no
 * shutdown(), which would end the parent's session too), the service thread
 * did not survive the fork, and the parent's mappings were not inherited. */
static void close_and_forget(int *fd) {
        if (*fd >= 0)
                close(*fd);
        *fd = -1;
}

static void session_close(gpumem_client *c, bool owner) {
        pthread_mutex_lock(&c->lock);
        c->closing = true;
        pthread_mutex_unlock(&c->lock);
        if (c->wake_fd >= 0 && owner) {
                uint64_t one = 1;
                if (write(c->wake_fd, &one, sizeof(one)) < 0) {
                        /* full counter: the thread is awake anyway */
                }
        }
        if (c->fd >= 0 && owner)
                shutdown(c->fd, SHUT_RDWR); /* wakes the service thread's recv */
        if (c->service_started && owner)
                pthread_join(c->service, NULL);
        c->service_started = false;
        close_and_forget(&c->fd);
        close_and_forget(&c->wake_fd);
        while (c->pending_frees) {
                pending_free_t *p = c->pending_frees;
                c->pending_frees = p->next;
                pending_free_destroy(c, p, owner);
        }
        while (c->completed_frees) {
                pending_free_t *p = c->completed_frees;
                c->completed_frees = p->next;
                pending_free_destroy(c, p, owner);
        }
        gm_fences_clear(&c->fences, owner);
        atomic_store_explicit(&c->fences_pending, false, memory_order_relaxed);
        atomic_store_explicit(&c->fences_freed, false, memory_order_relaxed);
        atomic_store_explicit(&c->client_fences, false, memory_order_relaxed);
        /* The daemon releases the session's pieces; the heap only forgets them. */
        c->heap = gm_local_destroy(c->heap);
        c->last_segment = NULL;
        free(c->alloc_conf_update);
        c->alloc_conf_update = NULL;
        close_and_forget(&c->page_fd_pending);
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
        c->asks = (gm_local_asks_t){0};
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
        for (size_t i = 0; i < c->blocks.cap; i++)
                block_free(c->blocks.values[i]);
        gm_u64map_done(&c->blocks);
        if (c->mapper)
                c->mapper->ops->destroy(c->mapper);
        c->mapper = NULL;
}

/* Bumped in every fork()ed child: a session whose generation differs may
 * belong to the parent, without a getpid() on every call. */
static _Atomic unsigned fork_generation;
static pthread_once_t fork_hook_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
        atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed);
}

static void install_fork_hook(void) {
        pthread_atfork(NULL, NULL, on_fork_child);
}

/* A fork()ed child must not speak on its parent's session: its first call
 * starts a session of its own. The parent's mappings were not inherited
 * (MADV_DONTFORK; CUDA mappings never are), so nothing is unmapped. */
static int own_session_after_fork(gpumem_client *c, unsigned generation) {
        c->fork_generation = generation;
        if (c->pid == getpid())
                return 0;
        pthread_mutex_init(&c->lock, NULL);
        pthread_mutex_init(&c->read_lock, NULL);
        pthread_mutex_init(&c->heap_lock, NULL);
        pthread_rwlock_init(&c->fd_lock, NULL);
        session_close(c, false);
        c->waiters = NULL;
        c->dead = false;
        c->closing = false;
        c->reconnecting = false;
        c->token[0] = '\0';
        c->pid = getpid();
        int r = session_open(c);
        if (r < 0) {
                c->dead = true;
                return r;
        }
        return 0;
}

static inline int ensure_own_session(gpumem_client *c) {
        unsigned generation = atomic_load_explicit(&fork_generation, memory_order_relaxed);
        if (__builtin_expect(generation == c->fork_generation, 1))
                return 0;
        return own_session_after_fork(c, generation);
}

int gpumem_connect(const char *socket_path, gpumem_client **ret) {
        return gpumem_connect_heap(socket_path, GPUMEM_HEAP_DEFAULT, ret);
}

gpumem_heap_mode gpumem_heap(gpumem_client *c) {
        return c && c->local ? GPUMEM_HEAP_LOCAL : GPUMEM_HEAP_CENTRAL;
}

int gpumem_connect_heap(const char *socket_path, gpumem_heap_mode mode, gpumem_client **ret) {
        if (!ret || (mode != GPUMEM_HEAP_DEFAULT && mode != GPUMEM_HEAP_LOCAL && mode != GPUMEM_HEAP_CENTRAL))
                return -EINVAL;
        gpumem_client *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->fd = -1;
        c->wake_fd = -1;
        c->page_fd_pending = -1;
        c->pid = getpid();
        pthread_once(&fork_hook_once, install_fork_hook);
        c->fork_generation = atomic_load_explicit(&fork_generation, memory_order_relaxed);
        c->heap_choice = mode;
        pthread_mutex_init(&c->lock, NULL);
        pthread_mutex_init(&c->heap_lock, NULL);
        pthread_mutex_init(&c->read_lock, NULL);
        pthread_rwlock_init(&c->fd_lock, NULL);
        const char *timeout = getenv("GPUMEM_RECONNECT_TIMEOUT_MS");
        c->reconnect_timeout_ms = timeout && *timeout ? (uint32_t) strtoul(timeout, NULL, 10) : 60000;
        int r = 0;
        if (socket_path) {
                if (strlen(socket_path) >= sizeof(c->socket_path))
                        r = -ENAMETOOLONG;
                else
                        snprintf(c->socket_path, sizeof(c->socket_path), "%s", socket_path);
        } else {
                r = gm_peer_default_socket(0, true, c->socket_path, sizeof(c->socket_path));
        }
        if (r == 0)
                r = session_open(c);
        if (r < 0) {
                /* Keep the message readable on this thread after c is gone. */
                session_close(c, true);
                pthread_mutex_destroy(&c->lock);
                pthread_mutex_destroy(&c->heap_lock);
                pthread_mutex_destroy(&c->read_lock);
                pthread_rwlock_destroy(&c->fd_lock);
                free(c->rx_buf);
                free(c);
                tls_error_client = NULL;
                return r;
        }
        *ret = c;
        return 0;
}

void gpumem_disconnect(gpumem_client *c) {
        if (!c)
                return;
        session_close(c, c->pid == getpid());
        pthread_mutex_destroy(&c->lock);
        pthread_mutex_destroy(&c->heap_lock);
        pthread_mutex_destroy(&c->read_lock);
        pthread_rwlock_destroy(&c->fd_lock);
        free(c->rx_buf);
        free(c);
}

/* ---- allocation ---- */

/* A local session's allocation: no message unless the heap needs memory. */
static int local_alloc(gpumem_client *c, size_t size, uint64_t stream, const gm_frame_t *trace_frames, size_t n_trace,
                       void **ret_ptr) {
        gm_alloc_result_t res;
        pthread_mutex_lock(&c->heap_lock);
        block_t *b = c->spare_blocks;
        if (b)
                c->spare_blocks = b->next_spare;
        else
                b = malloc(sizeof(*b));
        if (!b) {
                pthread_mutex_unlock(&c->heap_lock);
                return set_error(c, -ENOMEM, "gpumem: out of host memory");
        }
        int r = gm_local_alloc(c->heap, size, stream, trace_frames, n_trace, &res);
        if (r < 0) {
                bool told = gm_local_refused_by_daemon(c->heap);
                pthread_mutex_unlock(&c->heap_lock);
                free(b);
                if (told || (r != -ENOMEM && r != -EDQUOT && tls_error_client == c))
                        return r; /* the daemon's diagnosis (or the grant's failure) is the thread's error */
                return set_error(c, r, "gpumem: out of memory allocating %zu bytes: %s", size,
                                 size > c->capacity ? "more than the device's capacity"
                                 : r == -EDQUOT     ? "over the tenant's quota"
                                                    : "over this process's memory fraction "
                                                      "(per_process_memory_fraction)");
        }
        segment_t *seg = c->last_segment;
        if (!seg || seg->id != res.segment_id)
                c->last_segment = seg = gm_u64map_get(&c->segments, res.segment_id);
        uint64_t ptr = seg ? seg->base + res.offset : 0;
        *b = (block_t){.id = res.block_id,
                       .size = res.size,
                       .requested = size,
                       .offset = res.offset,
                       .segment_id = res.segment_id,
                       .stream = stream};
        if (seg && !seg->has_stream) {
                seg->stream = stream;
                seg->has_stream = true;
        }
        r = seg ? gm_u64map_put(&c->blocks, ptr, b) : -EPROTO;
        if (r < 0) {
                gm_local_free(c->heap, res.block_id, false);
                pthread_mutex_unlock(&c->heap_lock);
                free(b);
                return set_error(c, r, "gpumem: cannot track the block: %s", strerror(-r));
        }
        pthread_mutex_unlock(&c->heap_lock);
        *ret_ptr = (void *) (uintptr_t) ptr;
        return 0;
}

int gpumem_alloc(gpumem_client *c, size_t size, uint64_t stream, void **ret_ptr) {
        return gpumem_alloc_frames(c, size, stream, NULL, 0, ret_ptr);
}

/* local_alloc() with the caller's frames for its trace entry. */
static __attribute__((noinline)) int local_alloc_frames(gpumem_client *c, size_t size, uint64_t stream,
                                                        const gpumem_frame *frames, size_t n_frames, void **ret_ptr) {
        gm_frame_t trace_frames[GPUMEM_MAX_FRAMES];
        size_t n_trace = n_frames < GPUMEM_MAX_FRAMES ? n_frames : GPUMEM_MAX_FRAMES;
        for (size_t i = 0; i < n_trace; i++)
                trace_frames[i] =
                        (gm_frame_t){.filename = frames[i].filename, .line = frames[i].line, .name = frames[i].name};
        return local_alloc(c, size, stream, trace_frames, n_trace, ret_ptr);
}

static int central_alloc(gpumem_client *c, size_t size, uint64_t stream, const gpumem_frame *frames, size_t n_frames,
                         void **ret_ptr);

int gpumem_alloc_frames(gpumem_client *c, size_t size, uint64_t stream, const gpumem_frame *frames, size_t n_frames,
                        void **ret_ptr) {
        if (!c || !ret_ptr || (n_frames && !frames))
                return -EINVAL;
        if (size == 0)
                return set_error(c, -EINVAL, "gpumem: allocation of size 0");
        int r = ensure_own_session(c);
        if (r < 0)
                return r;
        if (!c->local)
                return central_alloc(c, size, stream, frames, n_frames, ret_ptr);
        if (n_frames)
                return local_alloc_frames(c, size, stream, frames, n_frames, ret_ptr);
        return local_alloc(c, size, stream, NULL, 0, ret_ptr);
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
        if (!n_marks || !c->mapper->ops->event_record)
                return;
        for (size_t i = 0; i < n_marks; i++)
                (void) gm_fences_mark(&c->fences, marks[i]->stream, marks[i]->fence);
        atomic_store_explicit(&c->fences_pending, c->fences.n_pending > 0, memory_order_relaxed);
        atomic_store_explicit(&c->client_fences, true, memory_order_relaxed); /* its heap moves pages */
}

/* A central session's allocation: one Alloc round trip. */
static __attribute__((noinline)) int central_alloc(gpumem_client *c, size_t size, uint64_t stream,
                                                   const gpumem_frame *frames, size_t n_frames, void **ret_ptr) {
        int r;
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = size;
        alloc.stream = stream;
        Gpumem__Frame wire_frames[GPUMEM_MAX_FRAMES];
        Gpumem__Frame *frame_ptrs[GPUMEM_MAX_FRAMES];
        alloc.n_frames = gm_client_wire_frames(frames, n_frames, wire_frames, frame_ptrs);
        alloc.frames = frame_ptrs;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        Gpumem__Envelope *reply = NULL;
        if ((r = call_expect(c, &env, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY, &reply)) < 0)
                return r;
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
                post(c, &fenv);
                free(b);
                gm_msg_free(reply);
                return set_error(c, r, "gpumem: allocation reply does not fit the mapped segment");
        }
        gm_msg_free(reply);
        *ret_ptr = (void *) (uintptr_t) ptr;
        return 0;
}

/* Records one event on each stream in streams[0..n) (deduplicated by the
 * caller). On failure nothing stays recorded. */
static int record_events(gpumem_client *c, const uint64_t *streams, size_t n, uint64_t **ret_events) {
        uint64_t *events = calloc(n, sizeof(*events));
        if (!events)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                int r = c->mapper->ops->event_record(c->mapper, streams[i], &events[i]);
                if (r < 0) {
                        while (i-- > 0)
                                c->mapper->ops->event_destroy(c->mapper, events[i]);
                        free(events);
                        return r;
                }
        }
        *ret_events = events;
        return 0;
}

static int local_free(gpumem_client *c, block_t *b, pending_free_t *p);
static int free_block_on_streams(gpumem_client *c, void *ptr, block_t *b, bool on_stream, uint64_t stream);

/* Frees the block at ptr once the work on `stream` (if it is not the
 * allocation stream, whose order already protects reuse) and on every
 * recorded stream is done. */
static int free_block(gpumem_client *c, void *ptr, bool on_stream, uint64_t stream) {
        if (!c)
                return -EINVAL;
        int r = ensure_own_session(c);
        if (r < 0)
                return r;
        pthread_mutex_lock(blocks_lock(c));
        block_t *b = ptr ? gm_u64map_remove(&c->blocks, (uint64_t) (uintptr_t) ptr) : NULL;
        if (b && c->local && !b->n_stream_uses && (!on_stream || stream == b->stream))
                return local_free(c, b, NULL); /* no stream work to wait for */
        if (!b || !c->local)
                pthread_mutex_unlock(blocks_lock(c));
        if (!b)
                return set_error(c, -EINVAL,
                                 "gpumem: free of %p: not a live allocation of this client "
                                 "(unknown pointer or double free)",
                                 ptr);
        return free_block_on_streams(c, ptr, b, on_stream, stream);
}

/* free_block() past the table: b is out of it (in local mode heap_lock is
 * still held). */
static __attribute__((noinline)) int free_block_on_streams(gpumem_client *c, void *ptr, block_t *b, bool on_stream,
                                                           uint64_t stream) {
        int r;
        uint64_t streams[MAX_STREAM_USES + 1];
        size_t n = 0;
        for (size_t i = 0; i < b->n_stream_uses; i++)
                streams[n++] = b->stream_uses[i];
        if (on_stream && stream != b->stream) {
                bool seen = false;
                for (size_t i = 0; i < n && !seen; i++)
                        seen = streams[i] == stream;
                if (!seen)
                        streams[n++] = stream;
        }
        pending_free_t *p = NULL;
        if (n > 0 && c->mapper->ops->event_record) {
                p = calloc(1, sizeof(*p));
                r = p ? record_events(c, streams, n, &p->events) : -ENOMEM;
                if (r < 0) {
                        free(p);
                        if (!c->local)
                                pthread_mutex_lock(&c->lock);
                        gm_u64map_put(&c->blocks, (uint64_t) (uintptr_t) ptr, b); /* still live */
                        pthread_mutex_unlock(blocks_lock(c));
                        return set_error(c, r, "gpumem: free of %p: cannot record stream events: %s", ptr,
                                         strerror(-r));
                }
                p->block_id = b->id;
                p->block = *b;
                p->block.stream_uses = NULL;
                p->block.n_stream_uses = 0;
                p->n_events = n;
        }
        if (c->local)
                return local_free(c, b, p);
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = b->id;
        f.deferred = p != NULL;
        uint64_t stream_of_block = b->stream, size_of_block = b->size;
        block_free(b);
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        env.free = &f;
        if (!p) {
                pthread_mutex_lock(&c->lock);
                r = post_locked(c, &env);
                fences_freed(c, stream_of_block, size_of_block);
                pthread_mutex_unlock(&c->lock);
                return r;
        }
        /* Queue the completion before the free is sent, so the service thread
         * cannot send FreeCompleted ahead of Free: it takes the lock to send. */
        pthread_mutex_lock(&c->lock);
        r = post_locked(c, &env);
        if (r == 0) {
                p->next = c->pending_frees;
                c->pending_frees = p;
        }
        pthread_mutex_unlock(&c->lock);
        if (r < 0) {
                pending_free_destroy(c, p, true);
                return r;
        }
        uint64_t one = 1;
        if (write(c->wake_fd, &one, sizeof(one)) < 0) {
                /* The counter is full: the service thread is awake anyway. */
        }
        return 0;
}

/* A local session's free, the block already out of the table: at once, or
 * once `p`'s stream events completed (the service thread finishes it).
 * Called with heap_lock held; releases it. */
static int local_free(gpumem_client *c, block_t *b, pending_free_t *p) {
        int r = gm_local_free(c->heap, b->id, p != NULL);
        if (b->stream_uses)
                free(b->stream_uses);
        b->next_spare = c->spare_blocks;
        c->spare_blocks = b;
        pthread_mutex_unlock(&c->heap_lock);
        if (r < 0) {
                if (p)
                        pending_free_destroy(c, p, true);
                return set_error(c, -EINVAL, "gpumem: the local heap refused the free: %s", strerror(-r));
        }
        if (p) {
                pthread_mutex_lock(&c->lock);
                p->next = c->pending_frees;
                c->pending_frees = p;
                pthread_mutex_unlock(&c->lock);
                wake_service(c);
        }
        return 0;
}

int gpumem_free(gpumem_client *c, void *ptr) {
        return free_block(c, ptr, false, 0);
}

int gpumem_free_async(gpumem_client *c, void *ptr, uint64_t stream) {
        return free_block(c, ptr, true, stream);
}

int gpumem_record_stream(gpumem_client *c, void *ptr, uint64_t stream) {
        if (!c)
                return -EINVAL;
        int r = ensure_own_session(c);
        if (r < 0)
                return r;
        pthread_mutex_lock(blocks_lock(c));
        block_t *b = ptr ? gm_u64map_get(&c->blocks, (uint64_t) (uintptr_t) ptr) : NULL;
        r = b ? 0 : -EINVAL;
        bool known = !b || stream == b->stream;
        for (size_t i = 0; b && i < b->n_stream_uses && !known; i++)
                known = b->stream_uses[i] == stream;
        if (!known) {
                uint64_t *uses = b->n_stream_uses < MAX_STREAM_USES
                                         ? realloc(b->stream_uses, (b->n_stream_uses + 1) * sizeof(*uses))
                                         : NULL;
                if (uses) {
                        b->stream_uses = uses;
                        uses[b->n_stream_uses++] = stream;
                } else {
                        r = -ENOSPC;
                }
        }
        pthread_mutex_unlock(blocks_lock(c));
        if (r == -EINVAL)
                return set_error(c, r, "gpumem: record_stream on %p: not a live allocation", ptr);
        if (r == -ENOSPC)
                return set_error(c, r, "gpumem: record_stream on %p: more than %d streams", ptr, MAX_STREAM_USES);
        return 0;
}

int gpumem_trim(gpumem_client *c, uint64_t *ret_released_bytes) {
        if (!c)
                return -EINVAL;
        int r = ensure_own_session(c);
        if (r < 0)
                return r;
        if (c->local) {
                pthread_mutex_lock(&c->heap_lock);
                uint64_t released = local_release_cached(c);
                pthread_mutex_unlock(&c->heap_lock);
                if (ret_released_bytes)
                        *ret_released_bytes = released;
                return 0;
        }
        Gpumem__Trim trim = GPUMEM__TRIM__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_TRIM;
        env.trim = &trim;
        Gpumem__Envelope *reply = NULL;
        if ((r = call_expect(c, &env, GPUMEM__ENVELOPE__BODY_TRIM_REPLY, &reply)) < 0)
                return r;
        if (ret_released_bytes)
                *ret_released_bytes = reply->trim_reply->released_bytes;
        gm_msg_free(reply);
        return 0;
}

int gm_client_local_stats(gpumem_client *c, gm_stats_t *ret_stats, int *ret_device, uint64_t *ret_capacity) {
        int r = ensure_own_session(c);
        if (r < 0)
                return r;
        if (!c->local)
                return -EOPNOTSUPP;
        pthread_mutex_lock(&c->heap_lock);
        *ret_stats = *gm_local_stats(c->heap);
        pthread_mutex_unlock(&c->heap_lock);
        *ret_device = c->device;
        *ret_capacity = c->capacity;
        return 0;
}

int gm_client_local_snapshot(gpumem_client *c, bool json, char **ret_buf, size_t *ret_len) {
        int r = ensure_own_session(c);
        if (r < 0)
                return r;
        if (!c->local)
                return -EOPNOTSUPP;
        gm_local_owner_t owner = {
                .device = c->device, .pid = (uint32_t) getpid(), .tenant = c->tenant, .session_id = c->session_id};
        pthread_mutex_lock(&c->heap_lock);
        r = gm_local_snapshot(c->heap, &owner, json, ret_buf, ret_len);
        pthread_mutex_unlock(&c->heap_lock);
        return r < 0 ? set_error(c, r, "gpumem: cannot write the local heap's snapshot: %s", strerror(-r)) : 0;
}

gm_local_asks_t *gm_client_asks_lock(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        return &c->asks;
}

void gm_client_asks_unlock(gpumem_client *c) {
        pthread_mutex_unlock(&c->lock);
}

gm_local_t *gm_client_heap_trylock(gpumem_client *c) {
        if (!c->local || pthread_mutex_trylock(&c->heap_lock) != 0)
                return NULL;
        return c->heap;
}

void gm_client_heap_unlock(gpumem_client *c) {
        pthread_mutex_unlock(&c->heap_lock);
}

int gm_client_post(gpumem_client *c, Gpumem__Envelope *env) {
        pthread_mutex_lock(&c->lock);
        env->request_id = ++c->next_request_id;
        pthread_mutex_unlock(&c->lock);
        return send_env(c, env);
}

uint32_t gm_client_max_packet(const gpumem_client *c) {
        return c->max_packet;
}

int gm_client_local_history(gpumem_client *c, bool enabled, uint64_t max_entries) {
        if (ensure_own_session(c) < 0 || !c->local)
                return 0;
        pthread_mutex_lock(&c->heap_lock);
        int r = gm_local_history(c->heap, enabled, max_entries, (uint32_t) getpid());
        pthread_mutex_unlock(&c->heap_lock);
        return r < 0 ? set_error(c, r, "gpumem: cannot set up the local heap's memory history: %s", strerror(-r)) : 0;
}

void gm_client_reset_local_stats(gpumem_client *c, bool peak, bool accumulated) {
        if (ensure_own_session(c) < 0 || !c->local)
                return;
        pthread_mutex_lock(&c->heap_lock);
        gm_local_reset_stats(c->heap, peak, accumulated);
        pthread_mutex_unlock(&c->heap_lock);
}

int gpumem_stat(gpumem_client *c, const char *pytorch_stat_name, int64_t *ret_value) {
        if (!c || !pytorch_stat_name || !ret_value)
                return -EINVAL;
        int r = ensure_own_session(c);
        if (r < 0)
                return r;
        if (c->local) {
                int64_t v = 0;
                pthread_mutex_lock(&c->heap_lock);
                r = gm_local_stat(c->heap, pytorch_stat_name, &v);
                pthread_mutex_unlock(&c->heap_lock);
                if (r < 0)
                        return set_error(c, -ENOENT, "gpumem: no statistic named '%s'", pytorch_stat_name);
                *ret_value = v;
                return 0;
        }
        Gpumem__Stats stats = GPUMEM__STATS__INIT;
        stats.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_SESSION;
        char *names[1] = {(char *) pytorch_stat_name};
        stats.n_names = 1;
        stats.names = names;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_STATS;
        env.stats = &stats;
        Gpumem__Envelope *reply = NULL;
        if ((r = call_expect(c, &env, GPUMEM__ENVELOPE__BODY_STATS_REPLY, &reply)) < 0)
                return r;
        r = -ENOENT;
        for (size_t i = 0; i < reply->stats_reply->n_stats; i++)
                if (strcmp(reply->stats_reply->stats[i]->name, pytorch_stat_name) == 0) {
                        *ret_value = reply->stats_reply->stats[i]->value;
                        r = 0;
                }
        gm_msg_free(reply);
        return r < 0 ? set_error(c, r, "gpumem: no statistic named '%s'", pytorch_stat_name) : 0;
}

/* ---- for the library's other files (client-internal.h) ---- */

int gm_client_set_error(const gpumem_client *c, int err, const char *fmt, ...) {
        char msg[sizeof(tls_error)];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        return set_error(c, err, "%s", msg);
}

int gm_client_call(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want,
                   Gpumem__Envelope **ret_reply, int *ret_fd) {
        int r = ensure_own_session(c);
        if (r < 0)
                return r;
        Gpumem__Envelope *reply = NULL;
        int fd = -1;
        if ((r = call_fd(c, env, &reply, ret_fd ? &fd : NULL)) < 0)
                return r;
        if (reply->body_case != want) {
                if (fd >= 0)
                        close(fd);
                gm_msg_free(reply);
                return set_error(c, -EPROTO, "gpumem: unexpected reply from gpumemd");
        }
        if (ret_fd)
                *ret_fd = fd;
        *ret_reply = reply;
        return 0;
}

const char *gm_client_socket_path(const gpumem_client *c) {
        return c->socket_path;
}
