/* Diagnosis in the daemon: each session's ring of samples (common/samples.h),
 * taken on the loop's tick from the figures the daemon already keeps (a
 * central session's heap, a local session's statistics page), the device's
 * ring of refusals, and the Samples request that reads them back. */
#pragma once

#include <stdint.h>

#include "requests.h"

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

int gm_handle_samples(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
const char *gm_admin_for_samples(const gm_request_conn_t *c, const Gpumem__Envelope *env);
