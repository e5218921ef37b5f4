/* A local session's state in the daemon, shared by grant.c (the wire:
 * grants, returns, reclaim) and localstats.c (the statistics page). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon.h"
#include "statpage.h"
#include "u64map.h"

typedef struct local_segment {
        uint64_t va_size;
        uint64_t piece_size; /* every piece of a segment has one size */
        gm_u64map_t pieces;  /* offset + 1 -> gm_piece_t */
} local_segment_t;

typedef struct parked_grant {
        uint64_t request_id;
        Gpumem__Grant grant; /* scalars only */
        uint64_t parked_at_ms;
        struct parked_grant *next;
} parked_grant_t;

struct gm_local_session {
        gm_u64map_t segments;     /* segment id -> local_segment_t */
        uint64_t n_pieces;
        uint64_t granted;         /* bytes of every piece held */
        gm_stats_t exact;         /* the daemon's own figures: reserved and segment (all), device allocs/frees */
        uint64_t segments_ever;
        gm_statpage_t *page;
        gm_stats_t figures;       /* the session's statistics: the page's last valid read + exact */
        gm_stats_t applied;       /* the page's part folded into the tenant's and device's statistics */
        bool page_invalid;        /* the last read failed the bounds */
        uint64_t invalid_reads;
        parked_grant_t *parked;
        uint32_t n_parked;
        uint64_t reclaim_id;      /* outstanding Reclaim (0: none) */
        uint64_t reclaim_bytes;   /* its expected bytes, counted in releasing_bytes */
        uint64_t reclaim_sent_ms;
        uint64_t next_reclaim_id;
};

/* Adds want - applied to `sink`: currents move by the difference (peaks
 * follow), accumulated figures and counters only ever grow. */
void gm_local_fold(gm_stats_t *sink, const gm_stats_t *want, const gm_stats_t *applied);
/* Reads one session's page (see gm_local_refresh). */
void gm_local_refresh_session(gm_session_t *s);
/* `stats` with every current set to zero (what a session leaves behind). */
void gm_local_zero_currents(gm_stats_t *stats);
