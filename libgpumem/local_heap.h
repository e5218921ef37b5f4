/* A local heap: the session's caching allocator (allocator/, PyTorch's
 * policy, knobs and statistics) running inside libgpumem. Cached allocations
 * and frees never leave the process; physical memory is asked of the daemon
 * (a whole segment, or a run of pages of an expandable segment) and given back to
 * it through the ops the session supplies. The heap's statistics live in the
 * session's statistics page, every change under its sequence lock, so the
 * daemon reads block figures without a message.
 *
 * Not thread-safe: the caller serialises every call (the session's heap lock).
 * The ops are called from inside these calls, with that lock held. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator.h"
#include "debug.h"
#include "fence.h"
#include "history.h"
#include "statpage.h"

typedef struct gm_local_heap gm_local_heap_t;

/* Physical memory the heap needs: n_pieces (>= 1) pieces of `size` bytes
 * at offset + k * size of one segment (a whole segment, or a run of pages
 * of an expandable one). block_size and largest_free only inform the
 * daemon's out-of-memory diagnosis; will_retry says that a refusal would
 * not end the allocation (the heap's ladder goes on). */
typedef struct gm_local_heap_grant {
        uint64_t segment_id;
        uint64_t segment_va_size;
        uint64_t offset;
        uint64_t size;
        uint64_t n_pieces;
        uint64_t block_size;
        uint64_t largest_free;
        bool will_retry;
        unsigned tag; /* the tagged pool (heap tag id) the allocation asking for it is in */
} gm_local_heap_grant_t;

/* Page reuse: a run of n_pages granted pieces of page_size bytes moves
 * inside this process's mappings (the heap's remap(), allocator.h): piece k
 * leaves from_offset + k * page_size of segment from_segment and is mapped
 * at to_offset + k * page_size of to_segment, whose range is
 * to_segment_va_size bytes (reserved on first sight). When
 * from_segment_empty the run is from_segment's last pieces (once all moved,
 * its range goes). */
typedef struct gm_local_heap_move {
        uint64_t from_segment, from_offset;
        uint64_t to_segment, to_segment_va_size, to_offset;
        uint64_t n_pages, page_size;
        bool from_segment_empty;
} gm_local_heap_move_t;

typedef struct gm_local_heap_ops {
        /* Gets the pieces from the daemon and maps them, all or nothing: 0,
         * or -ENOMEM / -EDQUOT (refused; enters the heap's retry ladder), or
         * another -errno, with none of them kept. */
        int (*grant)(void *ctx, const gm_local_heap_grant_t *grant);
        /* Unmaps n_pieces pieces of `size` bytes at offset + k * size of one
         * segment and gives them back to the daemon (the last carries
         * whole_segment). Cannot fail. */
        void (*give_back)(void *ctx, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t n_pieces,
                          bool whole_segment);
        /* Page reuse (optional; NULL leaves the mode inactive): moves the
         * run's pieces here, in order, and tells the daemon. Returns how many
         * moved (the first ones), or a negative errno with none moved (the
         * heap maps new memory for the rest). */
        int64_t (*move)(void *ctx, const gm_local_heap_move_t *move);
        /* Device-work events for page reuse's stream fences (all NULL where
         * frees are synchronous: every free page may move). event_record
         * marks the work queued so far on `stream`; event_query returns 1
         * once it is done, 0 while pending (never waiting), or a negative
         * errno. */
        int (*event_record)(void *ctx, uint64_t stream, uint64_t *ret_event);
        int (*event_query)(void *ctx, uint64_t event);
        void (*event_destroy)(void *ctx, uint64_t event);
        /* Whether `stream` is being captured into a CUDA graph: 1, 0, or a
         * negative errno (taken as 0). Asked only when an allocation misses
         * the cache; while it is 1 the allocation gets new memory (a grant)
         * or is refused, never releasing or moving cached memory (whose
         * synchronize and unmap would invalidate the capture). NULL: never. */
        int (*capturing)(void *ctx, uint64_t stream);
        /* Starts a release for a miss whose stream is not captured, when no
         * CUDA graph capture is in progress elsewhere in the process (the
         * process's record, capture.h: gm_capture_release_begin()): true,
         * and a declared capture then waits until release_end, which the
         * heap calls once that miss's releases are over, before the
         * allocation returns (served or refused); false while a capture is
         * in progress: the allocation releases and moves nothing either
         * (the synchronize would invalidate that capture too). Called with
         * the heap's lock held. Both NULL: never. */
        bool (*release_begin)(void *ctx);
        void (*release_end)(void *ctx);
        void *ctx;
} gm_local_heap_ops_t;

/* A heap with the daemon's allocator settings `alloc_conf` (PyTorch syntax)
 * for a device of `capacity` bytes whose backend maps in multiples of
 * `granularity` (0: 2 MiB), keeping its statistics in `page` (may be NULL),
 * which must stay mapped at its address while the heap lives (it may be
 * replaced there: see gm_local_session_page_replace()). -EINVAL with a reason in err for settings
 * this library cannot parse. */
int gm_local_heap_new(const char *alloc_conf, uint64_t capacity, uint64_t granularity, gm_statpage_t *page,
                      const gm_local_heap_ops_t *ops, gm_local_heap_t **ret_local, char *err, size_t err_len);
/* Forgets every block and piece without calling the ops (the session is
 * ending: its mappings and the daemon's ledger go with it). Accepts NULL. */
gm_local_heap_t *gm_local_heap_destroy(gm_local_heap_t *l);

/* New allocator settings (the daemon changed its alloc_conf at run time), as
 * gm_heap_set_config(); -EINVAL (reason in err) leaves the old ones. Caller
 * holds the heap's lock. */
int gm_local_heap_set_config(gm_local_heap_t *l, const char *alloc_conf, char *err, size_t err_len);
/* gm_local_heap_alloc(), gm_local_heap_free() and
 * gm_local_heap_free_completed() (gm_heap_alloc(), gm_heap_free(),
 * gm_heap_free_completed() under the page's sequence lock) are inline, at
 * the end of this header. */
/* empty_cache(): gives every idle cached segment (and free page) back. */
uint64_t gm_local_heap_release_cached(gm_local_heap_t *l);
/* Holds the tagged pools of `mask` (gm_heap_hold_tags(): a sleeping pool
 * allocates nothing and releases nothing); 0 holds none. */
void gm_local_heap_hold_tags(gm_local_heap_t *l, uint32_t mask);
int gm_local_heap_stat(const gm_local_heap_t *l, const char *name, int64_t *ret_value);
/* The same of one tagged pool (heap tag id `tag`; -EINVAL past GM_HEAP_MAX_TAGS). */
int gm_local_heap_tag_stat(const gm_local_heap_t *l, unsigned tag, const char *name, int64_t *ret_value);
const gm_stats_t *gm_local_heap_stats(const gm_local_heap_t *l);
void gm_local_heap_reset_stats(gm_local_heap_t *l, bool peak, bool accumulated);
/* Whether the last failed gm_local_heap_alloc() was refused by the daemon (its
 * message is then the caller's thread error) rather than by the heap itself. */
bool gm_local_heap_refused_by_daemon(const gm_local_heap_t *l);
/* Whether the last gm_local_heap_alloc() missed the cache while its stream
 * was captured (so nothing was released for it: a refusal then says so). */
bool gm_local_heap_missed_in_capture(const gm_local_heap_t *l);
/* Whether the last gm_local_heap_alloc() missed the cache while another
 * capture of the process was in progress, its own stream not captured (so
 * nothing was released for it either). */
bool gm_local_heap_held_for_capture(const gm_local_heap_t *l);
/* The read-only walk of the heap (snapshots). */
const gm_heap_t *gm_local_heap_core(const gm_local_heap_t *l);

/* Bytes of interned frame data a local trace ring keeps, at most. */
#define GM_LOCAL_HISTORY_FRAME_BYTES (64u << 20)

/* Memory history of this heap (the session's part of the device's trace,
 * entries naming `pid`): on with at most max_entries entries, or off (the
 * ring is cleared). -ENOMEM. */
int gm_local_heap_history(gm_local_heap_t *l, bool enabled, uint64_t max_entries, uint32_t pid);

/* The heap's trace ring while memory history is on, else NULL. */
const gm_history_t *gm_local_heap_history_ring(const gm_local_heap_t *l);

/* Who a snapshot names as the heap's owner. */
typedef struct gm_local_heap_owner {
        int device;
        uint32_t pid;
        const char *tenant;
        uint64_t session_id;
} gm_local_heap_owner_t;

/* The heap's memory snapshot (PyTorch's schema: its segments and blocks, its
 * trace ring), as JSON or a pickle; *ret_buf is freed with free(). */
int gm_local_heap_snapshot(const gm_local_heap_t *l, const gm_local_heap_owner_t *owner, bool json, char **ret_buf,
                           size_t *ret_len);

/* ---- the hot path, inline in its caller (the session's heap lock held) ----
 * The heap's state is here so that a cached allocation or free costs the
 * caller one call, gm_heap_alloc() or gm_heap_free(), and the page's
 * sequence lock two inline stores; local_heap.c holds everything else. */

struct gm_local_heap {
        gm_heap_t *heap;
        const gm_stats_t *stats; /* the heap's (they stay where they are while it lives) */
        gm_statpage_t *page;
        gm_local_heap_ops_t ops;
        uint64_t va_cursor;     /* the heap's synthetic addresses */
        uint64_t cur_size;      /* the request being served (for the diagnosis) */
        unsigned cur_tag;       /* its tagged pool (the grants it asks for carry it) */
        int64_t retries_before; /* the heap's num_alloc_retries when it began: its last try counts one more */
        bool refused_by_daemon;
        bool missed_in_capture;       /* the request missed the cache while its stream was captured */
        bool held_for_capture;        /* it missed while another capture of the process was in progress */
        bool releasing;               /* its miss's release is under way (ops.release_begin said go) */
        bool destroying;              /* pieces are forgotten, not given back */
        gm_alloc_config_t config;     /* the settings it runs with (a snapshot's allocator_settings) */
        gm_history_t *history;        /* this process's trace ring while memory history is on */
        const gm_frame_t *cur_frames; /* frames of the allocation being served */
        size_t n_cur_frames;
        uint32_t pid;         /* the process the trace entries name */
        uint64_t last_handle; /* pieces get distinct handles (page reuse moves them) */
        gm_fences_t fences;   /* page reuse's stream fences */
};

/* The heap keeps its statistics in the page's payload itself (the
 * heap's own gm_stats_t lives there), so a change writes only the figures
 * it changes. Every change is bracketed by the page's sequence lock: the
 * page reads as busy from before the change until after it. Around a grant
 * or a give-back it is published as it stands. */
static inline void gm_local_heap_begin(gm_local_heap_t *l) {
        if (l->page)
                gm_statpage_write_begin(l->page);
}

static inline void gm_local_heap_end(gm_local_heap_t *l) {
        if (l->page)
                gm_statpage_write_end(l->page);
}

/* The debug tier (GPUMEMD_DEBUG builds): the heap's integrity after every
 * operation, the grants, give-backs and moves inside it included; a
 * violation aborts. Nothing in other builds. */
static inline void gm_local_heap_check(const gm_local_heap_t *l) {
        if (GM_DEBUG) {
                gm_assert(gm_heap_check(l->heap) == 0);
                gm_assert(!l->releasing); /* a miss's release ends before its allocation returns */
        }
}

/* An allocation in tagged pool `tag` (0: the default); `frames` (may be
 * NULL) go into its trace entry while history is on. */
static inline int gm_local_heap_alloc(gm_local_heap_t *l, uint64_t size, uint64_t stream, unsigned tag,
                                      const gm_frame_t *frames, size_t n_frames, gm_alloc_result_t *ret_result) {
        l->cur_size = size;
        l->cur_tag = tag;
        l->retries_before = l->stats->num_alloc_retries;
        l->refused_by_daemon = false;
        l->missed_in_capture = false;
        l->held_for_capture = false;
        l->cur_frames = frames;
        l->n_cur_frames = n_frames;
        gm_local_heap_begin(l);
        int r = gm_heap_alloc_tagged(l->heap, size, stream, tag, ret_result);
        gm_local_heap_end(l);
        gm_assert(r < 0 || ret_result->size >= size);
        gm_local_heap_check(l);
        l->cur_frames = NULL;
        l->n_cur_frames = 0;
        return r;
}

static inline int gm_local_heap_free(gm_local_heap_t *l, uint64_t block_id, bool deferred) {
        gm_local_heap_begin(l);
        int r = gm_heap_free(l->heap, block_id, deferred);
        gm_local_heap_end(l);
        gm_local_heap_check(l);
        return r;
}

static inline int gm_local_heap_free_completed(gm_local_heap_t *l, uint64_t block_id) {
        gm_local_heap_begin(l);
        int r = gm_heap_free_completed(l->heap, block_id);
        gm_local_heap_end(l);
        gm_local_heap_check(l);
        return r;
}
