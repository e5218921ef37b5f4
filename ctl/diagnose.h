/* The rules of `gpumemctl diagnose` (docs/diagnosis.md), over one session's
 * samples in a window: leak suspected, fragmentation, waiting on streams,
 * idle cache, and the out-of-memory refusals by class, each with its figures
 * and the next step. Pure: no I/O, no clock; the thresholds are below. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "samples.h"

/* Below this, no figure is worth a finding. */
#define GM_DIAG_MIN_BYTES (1ull << 20)
/* Leak: the late half's floor of allocated above the early half's by at least
 * GM_DIAG_MIN_BYTES and GM_DIAG_LEAK_GROWTH_PCT percent of it. */
#define GM_DIAG_LEAK_GROWTH_PCT 10u
/* Fragmentation bands of 1 - allocated/reserved (PyTorch's rule of thumb). */
#define GM_DIAG_FRAG_MILD 0.2
#define GM_DIAG_FRAG_SEVERE 0.5
/* PyTorch's advice: expandable segments above this reserved/allocated or
 * this many retries. */
#define GM_DIAG_EXPANDABLE_RATIO 1.3
#define GM_DIAG_EXPANDABLE_RETRIES 100u
/* Waiting on streams: pending frees at least this fraction of reserved. */
#define GM_DIAG_PENDING_FRACTION 0.2
/* Idle cache: no allocation or free for this long (or half the window, if shorter). */
#define GM_DIAG_IDLE_MS 30000u

typedef enum gm_diag_kind {
        GM_DIAG_LEAK,
        GM_DIAG_FRAGMENTATION,
        GM_DIAG_STREAMS,
        GM_DIAG_IDLE_CACHE,
        GM_DIAG_REFUSALS,
        _GM_DIAG_KIND_MAX,
} gm_diag_kind_t;

/* The refusal classes, by gm_oom_reason_t's numbers. */
#define GM_DIAG_REFUSAL_CLASSES 5

typedef struct gm_diag_input {
        const gm_sample_t *samples; /* the session's samples in the window, oldest first */
        size_t n_samples;
        uint64_t now_ms; /* the daemon's clock */
        uint64_t window_ms;
        uint64_t refusals[GM_DIAG_REFUSAL_CLASSES]; /* the session's refusals in the window, by class */
        uint64_t refused_bytes_max;                 /* the largest of them */
        uint64_t others_refused;                    /* refusals of other sessions in the window */
} gm_diag_input_t;

typedef struct gm_diag_figures {
        uint64_t allocated, pending, inactive, reserved; /* the last sample: R = A + P + I */
        uint64_t inactive_split, idle_whole;             /* I = pinned free blocks + whole idle segments */
        uint64_t largest_free, request_max, releasing, segments;
        double frag_ratio;     /* 1 - A/R (0 when nothing is reserved) */
        const char *frag_band; /* "normal", "slight", "mild", "severe" */
        uint64_t floor_early;  /* the lowest allocated in the window's first half */
        uint64_t floor_late;   /* ... and in its second half (0 when it has no samples) */
        uint64_t retries;      /* in the window */
        uint64_t idle_ms;      /* since its last allocation or free (at least) */
        uint64_t covered_ms;   /* the time the samples cover */
        uint64_t refusals[GM_DIAG_REFUSAL_CLASSES];
        uint64_t others_refused;
} gm_diag_figures_t;

typedef struct gm_diag_finding {
        gm_diag_kind_t kind;
        char summary[384]; /* what it is, with figures */
        char next[768];    /* the next step(s) */
} gm_diag_finding_t;

typedef struct gm_diagnosis {
        gm_diag_figures_t fig;
        gm_diag_finding_t findings[_GM_DIAG_KIND_MAX]; /* in the order of gm_diag_kind_t */
        size_t n_findings;
} gm_diagnosis_t;

/* Applies every rule; 0, or -EINVAL without samples. */
int gm_diagnose(const gm_diag_input_t *in, gm_diagnosis_t *ret);
/* "leak", "fragmentation", "streams", "idle_cache", "refusals". */
const char *gm_diag_kind_name(gm_diag_kind_t kind);
/* For people: "leak suspected", "fragmentation", ... */
const char *gm_diag_kind_title(gm_diag_kind_t kind);
/* "quota", "fragmentation", "device", "reclaim", "external" (gm_oom_reason_t order). */
const char *gm_diag_refusal_class(unsigned reason);
/* The class of a name above, or -1. */
int gm_diag_refusal_class_of(const char *name);
/* The verdict in one word: the first finding's name, or "healthy". */
const char *gm_diag_verdict(const gm_diagnosis_t *d);
