/* gpumemd's caching allocator: PyTorch's native CUDA caching-allocator policy,
 * run centrally for many sessions.
 *
 * A gm_heap_t is one session's allocator: its small and large pools, its
 * segments and its blocks. Blocks are carved only from the heap's own segments;
 * physical memory comes and goes only through the gm_provider_t callbacks. All
 * metadata lives on the host: nothing is ever written into managed memory.
 * Pure C: no syscalls, no CUDA, no libuv. Not thread-safe (the daemon is one
 * loop). Errors are negative errno. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc_conf.h"
#include "stats.h"

typedef struct gm_heap gm_heap_t;

/* Physical memory for a heap. Every callback gets `userdata`. */
typedef struct gm_provider {
        /* Creates `size` bytes of physical memory at [offset, offset+size) of
         * segment `segment_id`, whose virtual range is `segment_va_size` bytes
         * (a whole ordinary segment: offset 0, size == segment_va_size; an
         * expandable segment: one page, where create_run is NULL). On success stores an opaque
         * handle in *ret_handle. -ENOMEM (device full) and -EDQUOT (tenant
         * quota) enter the retry ladder; any other error fails the request at
         * once. */
        int (*create)(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset, uint64_t size,
                      uint64_t *ret_handle);
        /* Optional: creates a run of n_pages (>= 1) consecutive pages of
         * expandable segment `segment_id` at once: page k is page_size bytes
         * at offset + k * page_size, each its own piece, exactly as n_pages
         * create() calls would make them (each later given back by its own
         * release() or moved by remap()). All or nothing: on success stores
         * page k's handle in handles[k] and returns 0; on failure nothing
         * of the run stays created, the contents of handles[] are
         * meaningless, and the error is create()'s (-ENOMEM and -EDQUOT
         * enter the retry ladder, the limits seeing the run as a whole). The
         * heap calls it once per run of new pages a mapping needs; NULL =
         * one create() per page. */
        int (*create_run)(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset,
                          uint64_t page_size, uint64_t n_pages, uint64_t *handles);
        /* Gives back what one create() made; `whole_segment` is true when this
         * is the segment's last piece (its virtual range goes too). The heap has
         * already forgotten it; the provider owns the rest of the release (e.g.
         * asking the client to unmap first). Cannot fail. */
        void (*release)(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle,
                        bool whole_segment);
        /* Optional: gives back a run of n_pages (>= 1) consecutive pages of
         * an expandable segment at once, page k (handle handles[k]) at
         * offset + k * page_size, exactly as n_pages release() calls in
         * that order would, the last carrying `whole_segment` (the others
         * false). Cannot fail. NULL = one release() per page. */
        void (*release_run)(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t page_size, uint64_t n_pages,
                            const uint64_t *handles, bool whole_segment);
        /* Optional: one trace event (see gm_trace_action_t); NULL = no tracing. */
        void (*trace)(void *userdata, int action, uint64_t addr, uint64_t size, uint64_t stream);
        /* Optional, for page reuse (alloc_conf gpumemd_page_reuse:True, see
         * gm_heap_page_reuse()); NULL = the mode stays inactive with this
         * provider. Moves a run of n_pages consecutive pages of an
         * expandable segment: page k (handle handles[k], made by create();
         * `page_size` = the heap's small page: 2 MiB, or the backend's
         * granularity where larger) is mapped at from_offset + k * page_size
         * of segment from_segment and must end up mapped at to_offset + k *
         * page_size of segment to_segment instead, and no longer at the old
         * place, which becomes unmapped virtual space of from_segment.
         * Offsets are multiples of page_size; the target range holds no
         * piece; the segments may be the same (the ranges then do not
         * overlap), or of another stream or pool of the same heap (never of
         * another heap). to_segment's virtual range is to_segment_va_size
         * bytes and it may have no piece yet (as with a segment's first
         * create()). from_segment_empty is true when the run is the last of
         * from_segment's pieces: once all of them moved, its virtual range
         * goes too (as with release()'s whole_segment). Handles keep their
         * values; later release() and remap() calls name them at their new
         * place. The heap calls this only
         * from gm_heap_alloc(), only for a page that lies wholly inside a free
         * block whose device work is complete (see stream_fence), and it emits
         * the segment_unmap / segment_map trace events itself. Moves are
         * final even when the allocation then fails (its pages may then be
         * released right away, at their new place). Whoever maps the memory
         * must apply the moves of a gm_heap_alloc() call before the block it
         * returns is used (central sessions: listed in the allocation reply,
         * unmap these ranges, map these handles there; local heaps: through
         * their mapper at once). Returns the number of pages moved, the
         * first ones of the run (n_pages when all did), or a negative errno
         * with nothing moved: pages not moved are still at their old place
         * and the heap creates new memory for the rest of the request. */
        int64_t (*remap)(void *userdata, const uint64_t *handles, uint64_t n_pages, uint64_t from_segment,
                         uint64_t from_offset, uint64_t to_segment, uint64_t to_segment_va_size, uint64_t to_offset,
                         uint64_t page_size, bool from_segment_empty);
        /* Optional, for page reuse: device-work fences, never waiting
         * (cuEventRecord + cuEventQuery, not a synchronize). Marks fence
         * number `fence` on `stream` after all work queued there so far (the
         * numbers a heap passes for a stream never decrease; a number already
         * marked needs no new mark), then stores in *ret_done the highest
         * fence number on that stream whose work is known complete (0 if
         * none) and returns 0; a negative errno counts as nothing complete.
         * The heap passes its count of frees so far and moves a page freed on
         * `stream` only once a fence at or after that free is complete, so
         * pages move even on a stream that is never idle, one allocation
         * after the device has passed the fence. It asks at most once per
         * allocation and stream; a provider may keep a few marks per stream
         * outstanding and skip new marks beyond that. NULL = frees are
         * synchronous (no queued device work, e.g. the host backend): every
         * free page may move. */
        int (*stream_fence)(void *userdata, uint64_t stream, uint64_t fence, uint64_t *ret_done);
        /* Optional: asked once per allocation that misses the cache, before
         * any step that releases or moves memory (garbage collection, page
         * reuse, the retry ladder's releases). False keeps every cached byte
         * where it is: the request gets only new memory (create) or is
         * refused, e.g. while `stream` is captured into a CUDA graph, where
         * the release's synchronize and unmap would invalidate the capture.
         * NULL = always true. */
        bool (*may_release)(void *userdata, uint64_t stream);
        /* Optional: called once the miss that may_release answered true is
         * through every step that releases or moves memory, before the
         * allocation returns (served or refused), so a provider may hold
         * something for exactly that span. NULL = nothing to end. */
        void (*release_done)(void *userdata);
        void *userdata;
} gm_provider_t;

/* Trace actions, in PyTorch's names (gm_trace_action_name()). */
typedef enum gm_trace_action {
        GM_TRACE_ALLOC,
        GM_TRACE_FREE_REQUESTED,
        GM_TRACE_FREE_COMPLETED,
        GM_TRACE_SEGMENT_ALLOC,
        GM_TRACE_SEGMENT_FREE,
        GM_TRACE_SEGMENT_MAP,
        GM_TRACE_SEGMENT_UNMAP,
        GM_TRACE_SNAPSHOT,
        GM_TRACE_OOM,
        _GM_TRACE_ACTION_MAX,
} gm_trace_action_t;
const char *gm_trace_action_name(int action);

typedef struct gm_heap_params {
        uint64_t capacity;          /* device capacity: expandable VA size and memory fraction base */
        uint64_t *va_cursor;        /* shared by all heaps of a device: next synthetic address
                                  * (segments get unique, never reused addresses) */
        gm_stats_t *extra_sinks[3]; /* NULL-terminated: stats also updated (tenant, device) */
        uint64_t granularity;       /* the backend's: segment and page sizes are multiples of it (0: 2 MiB) */
        /* The caller may retry a refused allocation (waiting for memory
         * reclaimed elsewhere): a refusal is then not counted in num_ooms nor
         * traced until the caller gives it to its client (gm_heap_count_oom()). */
        bool defer_oom;
        gm_stats_t *stats; /* where the heap keeps its own statistics (NULL: inside the heap), e.g. a
                                     * page another process reads; initialised by gm_heap_new, must outlive
                                     * the heap or gm_heap_move_stats() */
        /* Where the heap keeps its per-tag statistics from its first tagged
         * allocation on (GM_HEAP_MAX_TAGS of them; NULL: memory of its own), e.g.
         * the rest of that page; zeroed or not, they are initialised then. */
        gm_stats_t *tag_stats;
} gm_heap_params_t;

/* Creates an empty heap. The provider and params are copied; sinks must outlive the heap. */
int gm_heap_new(const gm_alloc_config_t *config, const gm_provider_t *provider, const gm_heap_params_t *params,
                gm_heap_t **ret_heap);
/* Releases every segment through the provider (live blocks included) and frees
 * the heap. Accepts NULL; returns NULL. */
gm_heap_t *gm_heap_destroy(gm_heap_t *h);

/* The heap's last refused allocation reached the client (defer_oom): counts
 * it in num_ooms and traces it, as a refusal without defer_oom is at once.
 * Nothing when the last gm_heap_alloc() was not refused for lack of memory. */
void gm_heap_count_oom(gm_heap_t *h);
/* An allocation waits for memory reclaimed from other sessions: counts it in
 * num_reclaim_waits (the heap's and its sinks'). */
void gm_heap_count_reclaim_wait(gm_heap_t *h);

/* Replaces the policy knobs (run-time alloc_conf change). Existing blocks stay. */
void gm_heap_set_config(gm_heap_t *h, const gm_alloc_config_t *config);
/* A quota on reserved bytes: `measured` gives the reserved total compared
 * against it (e.g. the tenant's stats; NULL = the heap's own). A segment that
 * would exceed it is refused with -EDQUOT (through the retry ladder) without
 * asking the provider, and it is the allowed maximum of garbage collection.
 * 0 = no limit. */
void gm_heap_set_limit(gm_heap_t *h, uint64_t allowed_max, const gm_stats_t *measured);

typedef struct gm_alloc_result {
        uint64_t block_id;   /* never reused within the heap */
        uint64_t segment_id; /* never reused within the heap */
        uint64_t offset;     /* of the block inside its segment */
        uint64_t size;       /* rounded block size */
        uint64_t addr;       /* synthetic address (segment address + offset) */
} gm_alloc_result_t;

/* malloc: the full PyTorch sequence (cache lookup, gc, retry ladder). Returns
 * -EINVAL for size 0 or >= 2^60, -ENOMEM / -EDQUOT when memory cannot be had. */
int gm_heap_alloc(gm_heap_t *h, uint64_t size, uint64_t stream, gm_alloc_result_t *ret_result);

/* Tagged pools: tag 0 is the default pool, 1 .. GM_HEAP_MAX_TAGS-1 are the
 * caller's (it maps names to these ids). A segment carries one tag and a
 * block is carved, split, merged and reused only within its segment's tag;
 * page reuse moves pages only between segments of one tag. */
#define GM_HEAP_MAX_TAGS 17
/* A heap's statistics followed by its per-tag ones, as a local session's
 * statistics page lays them out (gm_heap_params_t's stats and tag_stats). */
typedef struct gm_heap_stats_area {
        gm_stats_t all;
        gm_stats_t tags[GM_HEAP_MAX_TAGS];
} gm_heap_stats_area_t;

/* gm_heap_alloc() in tag `tag`'s pools; -EINVAL for a tag >= GM_HEAP_MAX_TAGS. */
int gm_heap_alloc_tagged(gm_heap_t *h, uint64_t size, uint64_t stream, unsigned tag, gm_alloc_result_t *ret_result);
/* Tag `tag`'s share of the heap's statistics: the gm_stat_t figures (current,
 * peak, allocated, freed) of blocks and segments of that tag; the num_*
 * counters are the heap's only and read 0. Over all tags the currents add up
 * to the heap's. -EINVAL for a tag >= GM_HEAP_MAX_TAGS. */
int gm_heap_tag_stats(const gm_heap_t *h, unsigned tag, gm_stats_t *ret_stats);
/* The tag of segment `segment_id`; -ENOENT when the heap has no such segment. */
int gm_heap_segment_tag(const gm_heap_t *h, uint64_t segment_id, unsigned *ret_tag);
/* Every tag's bit (bit t: tag t). */
#define GM_HEAP_ALL_TAGS ((1u << GM_HEAP_MAX_TAGS) - 1u)
/* Holds the tags of `mask` (bit t: tag t; bits past GM_HEAP_ALL_TAGS are
 * dropped), replacing the held set; 0 holds none. A held tag's segments may
 * have no memory behind them (a sleeping pool): gm_heap_alloc_tagged() in it
 * fails with -EAGAIN, and no release (gm_heap_release_cached(), garbage
 * collection, the retry ladder) touches its cached blocks; frees go on. */
void gm_heap_hold_tags(gm_heap_t *h, uint32_t mask);
uint32_t gm_heap_held_tags(const gm_heap_t *h);

/* free(): with deferred=false the block returns to the pool at once
 * (free_requested + free_completed); with deferred=true it stays active
 * (active_pending_free) until gm_heap_free_completed(). -ENOENT for an id that
 * is not an allocated block of this heap (unknown, already freed, pending). */
int gm_heap_free(gm_heap_t *h, uint64_t block_id, bool deferred);
/* The stream work that held a deferred free is done. -ENOENT if `block_id` is
 * not pending. */
int gm_heap_free_completed(gm_heap_t *h, uint64_t block_id);

/* empty_cache(): releases every idle unsplit segment (and unmaps free pages of
 * expandable segments); returns the bytes released. */
uint64_t gm_heap_release_cached(gm_heap_t *h);

/* The block size (round_size) and new-segment size (get_allocation_size) a
 * request of `size` bytes gets under the heap's settings. */
void gm_heap_sizes_for(const gm_heap_t *h, uint64_t size, uint64_t *ret_block_size, uint64_t *ret_segment_size);

/* Page reuse (gpumemd extension, alloc_conf gpumemd_page_reuse:True with
 * expandable_segments:True): when a request fits no free block and the heap
 * would map new pages, it first moves whole pages that lie inside free blocks
 * of any of its segments (any stream and pool, device work complete) to
 * where the request needs them (provider remap()); only the shortfall is
 * created. The pages' old range becomes unmapped free space. Pages are the
 * small page (2 MiB, the CUDA granularity; the backend's granularity where
 * larger) in both pools, instead of PyTorch's 20 MiB large-pool pages. Limits (memory fraction, quota) are
 * checked against the bytes actually created. Counters are not in
 * memory_stats() (PyTorch's key set stays exact); they are here. */

typedef struct gm_page_reuse_info {
        bool configured;             /* alloc_conf asks for it */
        bool active;                 /* configured, expandable segments on, provider has remap() */
        const char *inactive_reason; /* NULL when active */
        uint64_t pages_moved;        /* pages remap() moved */
        uint64_t ranges_moved;       /* contiguous source ranges unmapped for moves */
        uint64_t allocs_with_moves;  /* allocations that moved at least one page */
        uint64_t stream_queries;     /* stream_fence() calls */
        uint64_t refused_busy;       /* free blocks passed over: no complete fence after their free */
        uint64_t remap_failures;     /* remap() calls that moved fewer pages than asked (the rest stayed,
                                      * new memory was made) */
} gm_page_reuse_info_t;
void gm_heap_page_reuse(const gm_heap_t *h, gm_page_reuse_info_t *ret_info);

/* Number of live blocks (allocated or pending free). */
uint64_t gm_heap_live_blocks(const gm_heap_t *h);
/* Frees so far: the fence number stream_fence() would be passed now (a
 * fence at it covers every free made so far). */
uint64_t gm_heap_free_count(const gm_heap_t *h);
/* Largest free block, in bytes, over both pools (0 if none). */
uint64_t gm_heap_largest_free(const gm_heap_t *h);
/* This heap's own statistics. */
const gm_stats_t *gm_heap_stats(const gm_heap_t *h);
gm_stats_t *gm_heap_stats_mut(gm_heap_t *h);
/* The heap keeps its statistics at `home` (NULL: inside the heap) from now
 * on. With `copy` the current figures go there first; without, `home` keeps
 * what it holds (the old place may be gone: a mapping a fork()ed child did
 * not inherit). With home NULL the per-tag statistics leave the params'
 * tag_stats as well: copied with `copy`, else they stop for good. */
void gm_heap_move_stats(gm_heap_t *h, gm_stats_t *home, bool copy);

/* Rebuilding a heap after a daemon restart from what its client reports: its
 * segments (with the provider handles of their pieces: one piece for an
 * ordinary segment, one per mapped page of an expandable one), then its live
 * blocks, then finish. Nothing is created through the provider; addresses are
 * new synthetic ones; the gaps become free blocks; ids keep their values and
 * new ones continue above them. -EINVAL for claims that contradict each
 * other (overlaps, bad sizes), -EEXIST for a repeated segment id; finish
 * returns -EBADMSG if the result fails gm_heap_check(). */
typedef struct gm_restore_piece {
        uint64_t offset;
        uint64_t size;
        uint64_t handle;
} gm_restore_piece_t;

int gm_heap_restore_segment(gm_heap_t *h, uint64_t segment_id, uint64_t va_size, uint64_t stream,
                            const gm_restore_piece_t *pieces, size_t n_pieces);
/* The same with the pool named (small_pool) instead of inferred from the
 * sizes, which page-reuse heaps need: their large-pool expandable segments
 * have 2 MiB pages like small-pool ones (gm_heap_restore_segment() takes
 * those for small-pool segments). */
int gm_heap_restore_segment_in_pool(gm_heap_t *h, uint64_t segment_id, uint64_t va_size, uint64_t stream,
                                    bool small_pool, const gm_restore_piece_t *pieces, size_t n_pieces);
/* The same in tagged pool `tag` (its statistics start as at a tagged
 * allocation); pool: 1 small, 0 large, -1 as the sizes say. -EINVAL for a
 * tag >= GM_HEAP_MAX_TAGS. */
int gm_heap_restore_segment_tagged(gm_heap_t *h, uint64_t segment_id, uint64_t va_size, uint64_t stream, int pool,
                                   unsigned tag, const gm_restore_piece_t *pieces, size_t n_pieces);
/* The pool of segment `segment_id`, for whoever keeps a record to restore
 * from (an ordinary segment is known once its create() returned, an
 * expandable one before its first page is created). -ENOENT when the heap
 * has no such segment. */
int gm_heap_segment_pool(const gm_heap_t *h, uint64_t segment_id, bool *ret_small_pool);
int gm_heap_restore_block(gm_heap_t *h, uint64_t block_id, uint64_t segment_id, uint64_t offset, uint64_t size,
                          uint64_t requested_size, bool pending);
int gm_heap_restore_finish(gm_heap_t *h);

/* Integrity checker: walks every structure and returns the number of violated
 * invariants (0 = consistent). Never modifies the heap. */
int gm_heap_check(const gm_heap_t *h);

/* Read-only walk for snapshots, in address order: one segment_fn per
 * segment (per contiguous mapped range for expandable segments), then block_fn
 * for each of its blocks, in address order. */
typedef enum gm_block_state {
        GM_BLOCK_INACTIVE,
        GM_BLOCK_ACTIVE_ALLOCATED,
        GM_BLOCK_ACTIVE_PENDING_FREE,
} gm_block_state_t;

typedef struct gm_segment_info {
        uint64_t id;
        uint64_t addr;
        uint64_t offset; /* of this range in its segment (0 unless expandable) */
        uint64_t size;
        uint64_t stream;
        bool small_pool;
        bool expandable;
        unsigned tag; /* gm_heap_alloc_tagged()'s; 0 = default pool */
        uint64_t allocated_size, active_size, requested_size;
} gm_segment_info_t;

typedef struct gm_block_info {
        uint64_t id; /* 0 for free blocks */
        uint64_t addr;
        uint64_t size;
        uint64_t requested_size;
        gm_block_state_t state;
} gm_block_info_t;

typedef struct gm_heap_visitor {
        void (*segment_fn)(const gm_segment_info_t *seg, void *userdata);
        void (*block_fn)(const gm_segment_info_t *seg, const gm_block_info_t *block, void *userdata);
        void *userdata;
} gm_heap_visitor_t;
void gm_heap_walk(const gm_heap_t *h, const gm_heap_visitor_t *visitor);
