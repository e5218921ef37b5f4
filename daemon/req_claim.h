/* Claims (table handlers): a session sets device memory aside for itself
 * (gm_broker_claim()). */
#pragma once

#include <stddef.h>

#include "request.h"

/* At most the daemon's capacity. */
int gm_req_claim_check(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
int gm_req_claim_handle(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
