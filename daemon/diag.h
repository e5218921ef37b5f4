/* Diagnosis in the daemon: each session's ring of samples (common/samples.h),
 * taken on the loop's tick from the figures the daemon already keeps (a
 * central session's heap, a local session's statistics page) and the
 * device's ring of refusals (req_samples.c reads them back). */
#pragma once

#include <stdint.h>

#include "request.h"
#include "samples.h"

/* Per session: the ring, and what the request layer saw since the last tick. */
typedef struct gm_diag_session {
        gm_sample_ring_t ring;
        uint64_t request_max;         /* largest request since the last sample */
        uint64_t refusals;            /* out-of-memory refusals sent to it */
        uint64_t last_refusal_ms;     /* 0: none */
        uint64_t client_largest_free; /* local sessions: the largest free block its last Grant claimed */
} gm_diag_session_t;

/* v, or 0 when it is negative (a figure shown as a count). */
static inline uint64_t gm_diag_positive(int64_t v) {
        return v > 0 ? (uint64_t) v : 0;
}

/* Samples every session that holds memory (on the loop's tick; at most one
 * new sample per session per GM_SAMPLE_PERIOD_MS, and only on change). */
void gm_diag_tick(const gm_requests_t *rq, uint64_t now_ms);
/* What a request tells of the sizes a session asks for (an Alloc's size, a
 * Grant's block and the client's largest free block; untrusted, used only
 * to diagnose). */
void gm_diag_note_request(gm_request_conn_t *c, const Gpumem__Envelope *env);
/* An out-of-memory refusal sent to the session (out->oom: one its
 * application sees, not a local heap's first try before emptying its own
 * cache; others are not recorded). */
void gm_diag_note_refusal(gm_request_conn_t *c, const gm_outcome_t *out);
