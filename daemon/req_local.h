/* A local session's own requests (table handlers); a central session is
 * refused each. */
#pragma once

#include "request.h"

int gm_req_local_grant(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_local_return_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_local_return_intent(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Page reuse in a local heap: pieces moved inside the client's mappings. */
int gm_req_local_move_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_local_reclaim_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Sleep and wake: the session's heap sleeps or is awake again (docs/sleep.md). */
int gm_req_local_sleep_state(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
