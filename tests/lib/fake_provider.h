/* A deterministic gm_provider_t for allocator tests: a capacity, injected
 * failures, and a ledger that catches protocol mistakes (unknown or double
 * released handles, a wrong whole_segment or from_segment_empty flag, a page
 * moved from where it is not or onto another live page, a fence number that
 * goes backwards). Streams 0..7 can be marked busy (their fences stay pending
 * until fake_progress()) for page reuse; streams beyond are always idle. No
 * real memory is touched. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "allocator.h"

#define FAKE_STREAMS 8

typedef struct fake_piece {
        uint64_t segment_id, offset, size;
        bool live;
} fake_piece_t;

typedef struct fake_provider {
        uint64_t capacity;  /* create beyond this many live bytes fails with -ENOMEM */
        unsigned fail_next; /* the next fail_next create / create_run calls fail with fail_error */
        int fail_error;     /* default -ENOMEM */
        uint64_t live_handles, live_bytes;
        uint64_t creates, releases, whole_releases; /* pieces created, pieces released */
        uint64_t release_runs;                      /* release_run calls (each gives back a run of pages) */
        uint64_t create_runs;                       /* create_run calls (each creates a run of pages) */
        uint64_t run_pages_max;                     /* the longest run asked for */
        uint64_t errors;                            /* protocol violations seen */
        fake_piece_t *pieces;                       /* by handle - 1 */
        uint64_t n_pieces, cap_pieces;
        uint64_t *seg_live; /* live pieces by segment id */
        uint64_t cap_segs;
        bool no_overlap_check;    /* skip remap's O(pieces) destination check (timed replays) */
        uint64_t remaps;          /* pages remap moved */
        uint64_t remap_calls;     /* remap calls (each moves a run of pages) */
        unsigned remap_fail_next; /* the next remap_fail_next pages fail to move (-EIO for a run's first) */
        uint64_t remap_fail_at;   /* the page that would be the remap_fail_at-th moved fails (0: none) */
        bool busy[FAKE_STREAMS];  /* fences marked on these streams stay pending until
                                  * fake_progress() (others complete at once) */
        uint64_t fence_marked[FAKE_STREAMS], fence_done[FAKE_STREAMS];
        uint64_t stream_queries; /* stream_fence calls */
        uint64_t traces[_GM_TRACE_ACTION_MAX];
        int last_action;
        uint64_t last_addr, last_size, last_stream;
} fake_provider_t;

void fake_init(fake_provider_t *f, uint64_t capacity);
void fake_done(fake_provider_t *f);
/* The callback table; userdata is f. It has create_run, release_run, remap and
 * stream_fence. */
gm_provider_t fake_provider(fake_provider_t *f);
/* The device passes every fence marked on `stream` so far (the stream may
 * stay busy with newer work). */
void fake_progress(fake_provider_t *f, uint64_t stream);
