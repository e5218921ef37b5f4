/* Floor 4 of the broker: reclaim across sessions and the requests parked
 * while memory is on its way (reclaim.c). Calls only the floors below; the
 * facade (broker.c) and re-attach (reattach.c) sit on it. */
#pragma once

#include "holder.h"

/* reclaim.c: reclaim across sessions and parked requests, both heap modes. */
/* One try of `rq`: REPLY or REFUSE; where s's own cache could not give the
 * memory at once (its releases are sent now), other sessions are asked for
 * theirs, and PARK when memory is on its way, s's own included (may_park,
 * room left), else REFUSE with the diagnosis. */
void gm_reclaim_try(gm_session_t *s, const gm_request_t *rq, bool may_park, gm_outcome_t *out);
/* Queues a request behind the session's parked ones (out: PARK, or REFUSE on -ENOMEM). */
void gm_reclaim_park(gm_session_t *s, uint64_t request_id, const gm_request_t *rq, gm_outcome_t *out);
/* Retries parked requests of every session in FIFO order, as far as they go
 * (only those past park_timeout_ms when `timed_out_only`). */
void gm_reclaim_retry_parked(gm_broker_t *b, bool timed_out_only);
/* Periodic: Reclaims past release_timeout_ms, unresponsive sessions, parked
 * requests that timed out (all of them after memory came back). */
void gm_reclaim_tick(gm_broker_t *b, uint64_t now_ms);
