/* PyTorch-compatible allocator statistics (torch.cuda.memory_stats()).
 *
 * A gm_stats_t holds every key of memory_stats(); one allocator event updates
 * several of them (the session's, its tenant's and the device's) at once, so
 * peaks stay exact at every level. Pure C, no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum gm_stat_type {
        GM_STAT_ALL = 0,        /* "all" */
        GM_STAT_SMALL_POOL = 1, /* "small_pool" */
        GM_STAT_LARGE_POOL = 2, /* "large_pool" */
        _GM_STAT_TYPE_MAX,
} gm_stat_type_t;

typedef struct gm_stat {
        int64_t current;
        int64_t peak;      /* max of current since the last peak reset */
        int64_t allocated; /* sum of increases since the last accumulated reset */
        int64_t freed;     /* sum of decreases since the last accumulated reset */
} gm_stat_t;

typedef struct gm_stats {
        gm_stat_t allocation[_GM_STAT_TYPE_MAX];
        gm_stat_t segment[_GM_STAT_TYPE_MAX];
        gm_stat_t active[_GM_STAT_TYPE_MAX];
        gm_stat_t inactive_split[_GM_STAT_TYPE_MAX];
        gm_stat_t allocated_bytes[_GM_STAT_TYPE_MAX];
        gm_stat_t reserved_bytes[_GM_STAT_TYPE_MAX];
        gm_stat_t active_bytes[_GM_STAT_TYPE_MAX];
        gm_stat_t inactive_split_bytes[_GM_STAT_TYPE_MAX];
        gm_stat_t requested_bytes[_GM_STAT_TYPE_MAX];
        gm_stat_t oversize_allocations;
        gm_stat_t oversize_segments;
        int64_t num_alloc_retries;
        int64_t num_ooms;
        int64_t num_sync_all_streams;
        int64_t num_device_alloc;
        int64_t num_device_free;
        /* gpumemd's own: allocations that waited for memory reclaimed from
         * other sessions' caches (and were then served or refused). Not in
         * num_ooms, which counts only refusals the caller saw, as PyTorch does. */
        int64_t num_reclaim_waits;
        int64_t max_split_size; /* config value in bytes, -1 when unlimited */
} gm_stats_t;

/* Zeroes every stat; max_split_size = -1. */
void gm_stats_init(gm_stats_t *s);

/* Applies `delta` to `stat` (current, peak, allocated or freed). Inline: the
 * allocator's hot paths make several of these per operation. */
static inline void gm_stat_update(gm_stat_t *stat, int64_t delta) {
        stat->current += delta;
        if (delta > 0) {
                stat->allocated += delta;
                if (stat->current > stat->peak)
                        stat->peak = stat->current;
        } else
                stat->freed -= delta;
}

/* reset_peak_memory_stats(): peak = current for every stat. */
void gm_stats_reset_peak(gm_stats_t *s);
/* reset_accumulated_memory_stats(): allocated = freed = 0, num_* counters = 0. */
void gm_stats_reset_accumulated(gm_stats_t *s);
/* The same as a view: subtracts base's accumulated figures (allocated, freed,
 * num_* counters) from s, where base is a copy of the statistics taken at
 * the reset. The statistics themselves keep counting and never go back. */
void gm_stats_subtract_accumulated(gm_stats_t *s, const gm_stats_t *base);

/* Visits every flattened memory_stats() key ("allocated_bytes.all.current", ...,
 * "num_ooms", "max_split_size") in sorted key order, as memory_stats() does. */
typedef void (*gm_stats_visit_fn)(const char *name, int64_t value, void *userdata);
void gm_stats_foreach(const gm_stats_t *s, gm_stats_visit_fn fn, void *userdata);

/* Looks up / stores one flattened key; -ENOENT for an unknown name. */
int gm_stats_get(const gm_stats_t *s, const char *name, int64_t *ret_value);
int gm_stats_set(gm_stats_t *s, const char *name, int64_t value);

/* Formats torch.cuda.memory_summary(device, abbreviated) exactly (75-character
 * rows framed by '|', trailing newline) into buf. Returns the length written
 * (excluding NUL) or -ENOSPC when buf is too small. */
int gm_stats_summary(const gm_stats_t *s, int device, bool abbreviated, char *buf, size_t buf_len);
