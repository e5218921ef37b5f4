/* The state of one client, shared by libgpumem's floors (bottom to top: the
 * connection conn.c, the segment table mapping.c, the session session.c,
 * the heaps frees.c, central.c, local_heap.c and local_session.c, the public
 * API gpumem.c). A floor calls only the floors below it; it touches a field
 * of a floor above only where the field's users are named: the segment
 * table forgets last_segment with its segment, a re-attach reports the
 * blocks and pending frees and starts the fences over. Not installed. */
#pragma once

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "fence.h"
#include "gpumem/gpumem.h"
#include "mapper.h"
#include "msg.h"
#include "pool.h"
#include "statpage.h"
#include "u64map.h"

struct gm_local_heap;
struct gm_conn_handlers;

/* The local heap's lock: a futex word, 0 free, 1 held, 2 held with a
 * thread (the service thread, or another caller) asleep on it. A thread
 * that finds it free takes it with one compare-and-swap and lets it go with
 * one exchange, inline: no call, no system call, the price PyTorch's
 * allocator pays for its one mutex per call, or less. A contended taker
 * sleeps in the kernel (FUTEX_WAIT) until the holder lets it go; not
 * recursive; process-private (a fork()ed child starts it over). */
typedef struct gm_heap_lock {
        _Atomic uint32_t state;
} gm_heap_lock_t;

static inline void gm_heap_lock_init(gm_heap_lock_t *lock) {
        atomic_store_explicit(&lock->state, 0, memory_order_relaxed);
}

/* Takes the lock if it is free; whether it did. */
static inline bool gm_heap_lock_try(gm_heap_lock_t *lock) {
        uint32_t expected = 0;
        return atomic_compare_exchange_strong_explicit(&lock->state, &expected, 1, memory_order_acquire,
                                                       memory_order_relaxed);
}

/* The contended path: marks the lock as waited for and sleeps until it is
 * let go, then takes it (still marked: another may sleep too). */
static __attribute__((unused, noinline, cold)) void gm_heap_lock_wait(gm_heap_lock_t *lock) {
        while (atomic_exchange_explicit(&lock->state, 2, memory_order_acquire) != 0)
                syscall(SYS_futex, &lock->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

static inline void gm_heap_lock_take(gm_heap_lock_t *lock) {
        if (__builtin_expect(!gm_heap_lock_try(lock), 0))
                gm_heap_lock_wait(lock);
}

/* Lets the lock go, waking one sleeper if one may be asleep. */
static inline void gm_heap_lock_drop(gm_heap_lock_t *lock) {
        if (__builtin_expect(atomic_exchange_explicit(&lock->state, 0, memory_order_release) == 2, 0))
                syscall(SYS_futex, &lock->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
struct gm_session_hooks;

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
        bool captured;            /* noted in the capture record (capture.h): allocated during a capture of `stream` */
} block_t;

/* A free waiting for stream work: the daemon keeps the block active until
 * every event has completed and FreeCompleted names it. */
typedef struct pending_free {
        block_t block; /* as it was allocated (stream_uses not kept) */
        uint64_t block_id;
        uint64_t *events;  /* one per stream; 0 while that stream is captured (recorded once it ends) */
        uint64_t *streams; /* the streams the events mark */
        size_t n_events;
        struct pending_free *next;
} pending_free_t;

/* Most distinct streams one block may be recorded on. */
#define MAX_STREAM_USES 64
/* The daemon's snapshot queries and history pushes a local session is yet to
 * serve (local_session.c): noted under lock, served by the service thread
 * once it holds the heap. */
typedef struct gm_local_session_asks {
        uint64_t query_id; /* a SnapshotQuery yet to answer (0: none) */
        uint64_t query_max_bytes;
        bool history_due; /* a history push yet to apply */
        bool history_enabled;
        uint64_t history_max_entries;
} gm_local_session_asks_t;

/* A published shared object a handle of this process holds (shared.c): a
 * re-attach after a daemon restart reports it (session.c), so that the new
 * daemon counts this session as its mapper again. Listed under lock. */
typedef struct gm_shared_held {
        uint64_t object_id; /* the daemon's id when it was opened */
        uint64_t version;
        uint64_t size;
        char name[128];
        struct gm_shared_held *next;
} gm_shared_held_t;

struct gpumem_client {
        /* What the floors above the connection and the session do with the
         * daemon's pushes and the session's turns (conn.h, session.h): set
         * once by gpumem_connect_heap(), before the first session opens. */
        const struct gm_conn_handlers *handlers;
        const struct gm_session_hooks *session_hooks;
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
        gm_u64map_t segments; /* segment id -> segment_t */
        /* The daemon's ReleaseRequests that came while a CUDA graph capture
         * was in progress (capture.h), each release id once: answered by the
         * service thread once none is (mapping.h). Under lock. */
        Gpumem__Envelope **held_releases;
        size_t n_held_releases, cap_held_releases;
        bool release_now;      /* the packet being dispatched is a ReleaseRequest served at once (read_lock's holder) */
        gm_u64map_t blocks;    /* pointer -> block_t */
        char async_error[512]; /* last refusal of a request nobody waited for (a free) */
        pending_free_t *pending_frees;
        gm_shared_held_t *shared_held;   /* the shared objects its handles hold open (under lock) */
        pending_free_t *completed_frees; /* local mode: stream work done, the heap not yet told */
        uint64_t reader_generation;      /* bumped whenever a reader lets read_lock go */
        bool reader_lost;                /* a caller's read failed: the service thread reads until it knows why */
        _Atomic int callers;             /* gm_conn_call_fd()s in flight */
        _Atomic uint64_t last_call_ms;   /* CLOCK_MONOTONIC_COARSE when the last one ended */
        uint64_t reclaim_id;             /* a Reclaim the service thread has yet to serve (0: none) */
        uint64_t reclaim_bytes;
        gm_local_session_asks_t asks; /* snapshot queries and history pushes to serve (local_session.c) */
        char *alloc_conf_update;      /* new settings the service thread has yet to give the heap (NULL: none) */
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
        /* A central session whose daemon takes carried frees
         * (HelloReply.carried_frees): plain frees not yet sent, under lock,
         * carried by the next Alloc or sent before any other message
         * (central.c). frees_carried: whether any wait, read without lock. */
        bool carries_frees;
        /* A central session whose daemon reads the fixed-layout codec
         * (HelloReply.fixed_codec, hotmsg.h): the hot messages go in it.
         * Set when the session opens, cleared when it re-attaches to a
         * daemon without it (before the new socket replaces the old). */
        _Atomic bool fixed_codec;
        size_t n_carried_frees;
        uint64_t carried_frees[GM_CARRIED_FREES_MAX];
        _Atomic bool frees_carried;

        /* Local heap mode (local_heap.c): the session's allocator runs here.
         * heap_lock serialises it and, in this mode, the blocks table; it is
         * taken before lock. In this mode `segments` changes only on behalf of
         * a heap_lock holder (a grant's reply is mapped while it waits, a give
         * back unmaps under it) or at close, so heap_lock holders read it
         * without lock. */
        gm_pool_names_t pools;        /* tagged pools' names (pool.h) */
        gpumem_heap_mode heap_choice; /* what the application asked for */
        bool local;
        bool grant_unmapped; /* the last grant's piece could not be mapped (under heap_lock) */
        bool return_intents; /* local: the daemon checks returns by the process's figure: ReturnIntent first */
        gm_heap_lock_t heap_lock;
        struct gm_local_heap *heap;
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
        uint64_t local_frees, local_frees_synced; /* heap_lock: frees so far, and before the last device sync */
        /* Asleep (sleep.c, gpumem_sleep()): the pieces it gave back and the
         * data it keeps; NULL while awake (under heap_lock). The heap holds
         * the sleeping pools meanwhile (no allocation, no release of their
         * cached memory); the other pools go on. */
        struct gm_sleep *sleep;
        /* What a re-attach tells a new daemon of the sleep (Reattach.sleep,
         * under lock): the bytes a wake needs once the sleeping pieces went
         * back, 0 while awake (sleep.c writes it, session.c reads it). */
        uint64_t reattach_sleeping_bytes;
        /* The session's unconsumed claim as this client knows it (under
         * lock): every ClaimReply sets it, every new piece mapped here
         * consumes it (mapping.c, in the order the daemon sent them), and a
         * re-attach asks the new daemon for it again (Reattach.claim). */
        uint64_t claim_bytes;
};

/* Takes the lock of the blocks table: the heap's in local mode, else lock. */
static inline void gm_client_blocks_take(gpumem_client *c) {
        if (c->local)
                gm_heap_lock_take(&c->heap_lock);
        else
                pthread_mutex_lock(&c->lock);
}

static inline void gm_client_blocks_drop(gpumem_client *c) {
        if (c->local)
                gm_heap_lock_drop(&c->heap_lock);
        else
                pthread_mutex_unlock(&c->lock);
}

/* Frees a block record; accepts NULL. */
static inline void gm_client_block_free(block_t *b) {
        if (b) {
                free(b->stream_uses);
                free(b);
        }
}
