/* A deterministic gm_provider_t for allocator tests: a capacity, injected
 * failures, and a ledger that catches protocol mistakes (unknown or double
 * released handles, a wrong whole_segment flag). No real memory is touched. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "allocator.h"

typedef struct fake_piece {
        uint64_t segment_id, offset, size;
        bool live;
} fake_piece_t;

typedef struct fake_provider {
        uint64_t capacity;     /* create beyond this many live bytes fails with -ENOMEM */
        unsigned fail_next;    /* the next fail_next creates fail with fail_error */
        int fail_error;        /* default -ENOMEM */
        uint64_t live_handles, live_bytes;
        uint64_t creates, releases, whole_releases; /* successful create / release calls */
        uint64_t errors;       /* protocol violations seen */
        fake_piece_t *pieces;  /* by handle - 1 */
        uint64_t n_pieces, cap_pieces;
        uint64_t *seg_live;    /* live pieces by segment id */
        uint64_t cap_segs;
        uint64_t traces[_GM_TRACE_ACTION_MAX];
        int last_action;
        uint64_t last_addr, last_size, last_stream;
} fake_provider_t;

void fake_init(fake_provider_t *f, uint64_t capacity);
void fake_done(fake_provider_t *f);
/* The callback table; userdata is f. */
gm_provider_t fake_provider(fake_provider_t *f);
