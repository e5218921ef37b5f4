/* The ledger over time: a fixed ring of samples of one session's memory
 * figures, and a fixed ring of the device's last out-of-memory refusals.
 * Pure data (no clock of its own, no allocation): the daemon records into
 * them, `gpumemctl diagnose` and `top` read them back through the Samples
 * request. Memory is bounded: GM_SAMPLES_CAP samples per session (about
 * 29 KiB) and GM_REFUSALS_CAP refusals per device.
 *
 * A sample covers a span of time [t_ms, until_ms] in which its figures held:
 * the recorder takes one new sample at most every GM_SAMPLE_PERIOD_MS, and
 * only when a figure changed; in between, ticks extend the last sample (its
 * allocated_min/max keep the extremes seen). An idle session therefore keeps
 * a long history in few samples, a busy one the last GM_SAMPLES_CAP seconds. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GM_SAMPLES_CAP 240u
#define GM_SAMPLE_PERIOD_MS 1000u
#define GM_REFUSALS_CAP 128u

/* One session's figures over a span; bytes are bytes, counters cumulative.
 * reserved = allocated + pending + inactive (inactive is derived). */
typedef struct gm_sample {
        uint64_t t_ms;          /* the span's start (the daemon's monotonic clock) */
        uint64_t until_ms;      /* the last tick that saw these figures */
        uint64_t allocated;     /* A: live blocks, at the span's last tick */
        uint64_t allocated_min; /* A's extremes over the span's ticks */
        uint64_t allocated_max;
        uint64_t pending;        /* P: freed blocks waiting for their streams (active - allocated) */
        uint64_t reserved;       /* R: segments held */
        uint64_t inactive_split; /* free bytes inside split segments (pinned by live neighbours) */
        uint64_t largest_free;   /* the largest free cached block */
        uint64_t segments;
        uint64_t retries;     /* num_alloc_retries */
        uint64_t allocations; /* blocks handed out (allocation.all.allocated): the heap's activity */
        uint64_t request_max; /* largest request the daemon saw in the span (0: none) */
        uint64_t refusals;    /* out-of-memory refusals of the session */
        uint64_t releasing;   /* asked back by reclaim and not yet given back (still charged) */
} gm_sample_t;

/* Values of one sample on the wire (SessionSamples.samples), in this order:
 * the fields of gm_sample_t as declared. */
#define GM_SAMPLE_FIELDS 15u

typedef struct gm_sample_ring {
        gm_sample_t ring[GM_SAMPLES_CAP];
        uint32_t head; /* the oldest sample's slot */
        uint32_t n;
} gm_sample_ring_t;

/* Records the figures `now` saw (only the figures of f are read: its times,
 * allocated_min/max are set here; request_max is merged as a maximum). */
void gm_sample_ring_record(gm_sample_ring_t *r, uint64_t now_ms, const gm_sample_t *f);
/* Sample i, 0 the oldest; NULL past the end. */
const gm_sample_t *gm_sample_ring_at(const gm_sample_ring_t *r, size_t i);
/* The newest sample, or NULL. */
const gm_sample_t *gm_sample_ring_last(const gm_sample_ring_t *r);

/* inactive = reserved - allocated - pending (0 when the figures disagree). */
uint64_t gm_sample_inactive(const gm_sample_t *s);
/* Whole idle segments' bytes: inactive minus inactive split (what a trim
 * gives back). */
uint64_t gm_sample_idle_whole(const gm_sample_t *s);

/* Writes GM_SAMPLE_FIELDS values. */
void gm_sample_pack(const gm_sample_t *s, uint64_t out[GM_SAMPLE_FIELDS]);
/* Reads `stride` values (fields beyond GM_SAMPLE_FIELDS are ignored, missing
 * ones are 0). */
void gm_sample_unpack(const uint64_t *in, size_t stride, gm_sample_t *ret);

/* ---- refusals ---- */

/* The classes of gm_oom_reason_t (allocator/oom.h), by the same numbers. */
typedef struct gm_refusal {
        uint64_t t_ms; /* the daemon's monotonic clock */
        uint64_t session_id;
        uint32_t pid;
        uint32_t reason;
        uint64_t size; /* bytes asked for */
        char tenant[64];
} gm_refusal_t;

typedef struct gm_refusal_ring {
        gm_refusal_t ring[GM_REFUSALS_CAP];
        uint32_t head;
        uint32_t n;
        uint64_t total; /* refusals ever recorded */
} gm_refusal_ring_t;

/* Appends, dropping the oldest when full. */
void gm_refusal_ring_add(gm_refusal_ring_t *r, const gm_refusal_t *ev);
/* Refusal i, 0 the oldest; NULL past the end. */
const gm_refusal_t *gm_refusal_ring_at(const gm_refusal_ring_t *r, size_t i);
