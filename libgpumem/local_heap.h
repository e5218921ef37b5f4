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

/* An allocation; `frames` (may be NULL) go into its trace entry while history is on. */
/* New allocator settings (the daemon changed its alloc_conf at run time), as
 * gm_heap_set_config(); -EINVAL (reason in err) leaves the old ones. Caller
 * holds the heap's lock. */
int gm_local_heap_set_config(gm_local_heap_t *l, const char *alloc_conf, char *err, size_t err_len);
int gm_local_heap_alloc(gm_local_heap_t *l, uint64_t size, uint64_t stream, const gm_frame_t *frames, size_t n_frames,
                        gm_alloc_result_t *ret_result);
int gm_local_heap_free(gm_local_heap_t *l, uint64_t block_id, bool deferred);
int gm_local_heap_free_completed(gm_local_heap_t *l, uint64_t block_id);
/* empty_cache(): gives every idle cached segment (and free page) back. */
uint64_t gm_local_heap_release_cached(gm_local_heap_t *l);
int gm_local_heap_stat(const gm_local_heap_t *l, const char *name, int64_t *ret_value);
const gm_stats_t *gm_local_heap_stats(const gm_local_heap_t *l);
void gm_local_heap_reset_stats(gm_local_heap_t *l, bool peak, bool accumulated);
/* Whether the last failed gm_local_heap_alloc() was refused by the daemon (its
 * message is then the caller's thread error) rather than by the heap itself. */
bool gm_local_heap_refused_by_daemon(const gm_local_heap_t *l);
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
