/* Page reuse's stream fences on the client side (docs/page-reuse.md): per
 * stream a short FIFO of (fence number, event) marks, recorded after the
 * work queued so far and polled from its head, never waiting. A local heap
 * marks and polls from its provider's stream_fence(); a central session
 * marks what the daemon's AllocReply asks and reports the completed numbers
 * with its next Alloc, and before an Alloc that follows frees checks on its
 * own whether their streams are past them (gm_fences_check_freed()). Not thread-safe: the caller serialises every call. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GM_FENCE_STREAMS 64 /* streams tracked (as many as a heap tracks); marks on more are refused */
#define GM_FENCE_MARKS 4    /* marks outstanding per stream; newer ones are refused until the head completes */

/* Device-work events (the mapper's): record marks the work queued so far on
 * `stream`; query returns 1 once it is done, 0 while pending (never waiting)
 * or a negative errno. */
typedef struct gm_fence_ops {
        int (*record)(void *ctx, uint64_t stream, uint64_t *ret_event);
        int (*query)(void *ctx, uint64_t event);
        void (*destroy)(void *ctx, uint64_t event);
        void *ctx;
} gm_fence_ops_t;

typedef struct gm_fence_stream {
        uint64_t stream;
        uint64_t marked;   /* highest fence number marked */
        uint64_t done;     /* highest fence number known complete */
        uint64_t reported; /* the done last handed out by gm_fences_report() */
        bool freed;        /* frees on it since the last gm_fences_check_freed() */
        uint64_t fence[GM_FENCE_MARKS], event[GM_FENCE_MARKS];
        unsigned head, n;
} gm_fence_stream_t;

typedef struct gm_fences {
        gm_fence_ops_t ops;
        gm_fence_stream_t *streams; /* GM_FENCE_STREAMS, made on first use */
        size_t n_streams;
        size_t n_pending; /* marks outstanding over every stream */
        size_t n_freed;   /* streams with `freed` set */
} gm_fences_t;

void gm_fences_init(gm_fences_t *f, const gm_fence_ops_t *ops);
/* Destroys the outstanding events (unless they belong to another process: a
 * fork()ed child's copy) and forgets every stream; f can be used again. */
void gm_fences_clear(gm_fences_t *f, bool destroy_events);

/* Marks fence number `fence` on `stream` with an event. 0 when marked or
 * when a number at or above it is marked already; -ENOSPC when refused
 * (GM_FENCE_MARKS outstanding, or GM_FENCE_STREAMS streams known), -ENOMEM,
 * or the driver's error. A refused mark is never reported complete, so
 * refusing is safe: only the pages freed after the last kept mark wait for
 * a later one. */
int gm_fences_mark(gm_fences_t *f, uint64_t stream, uint64_t fence);
/* A local heap's stream_fence(): gm_fences_mark() (a refusal only skips
 * the mark), then pops the stream's completed marks; *ret_done is the
 * highest fence number on it known complete (0 if none). -ENOMEM when the
 * stream cannot be tracked. */
int gm_fences_fence(gm_fences_t *f, uint64_t stream, uint64_t fence, uint64_t *ret_done);

/* What a central session reports: the highest complete fence of a stream. */
typedef struct gm_fence_done {
        uint64_t stream, fence;
} gm_fence_done_t;
/* Polls every stream with marks outstanding (nothing when none are) and
 * writes to out (room for GM_FENCE_STREAMS) each stream whose highest
 * complete fence rose since the last report; returns how many. */
size_t gm_fences_report(gm_fences_t *f, gm_fence_done_t *out);

/* A central session sent the free of a block of `stream` (a plain free, or
 * the completion of a deferred one). A stream that cannot be tracked is
 * never checked: its pages wait for a fence the daemon asks for. */
void gm_fences_freed(gm_fences_t *f, uint64_t stream);
/* Its own check before an Alloc, once per stream freed on since the last
 * one: records an event there and queries it at once, never waiting; the
 * streams found past their frees go to out (room for GM_FENCE_STREAMS). A
 * stream with marks outstanding is not recorded on (a later event cannot be
 * complete before them). Every stream is clean afterwards, whatever the
 * answer: frees whose check was pending wait for a mark the daemon asks for,
 * so the cost stays one check per stream and Alloc after frees. No event is
 * kept. Returns how many. */
size_t gm_fences_check_freed(gm_fences_t *f, uint64_t *out);
