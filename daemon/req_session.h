/* A session's own start (table handlers): Hello, and re-attach after a
 * restart until its last Reattach. */
#pragma once

#include <stddef.h>

#include "request.h"

int gm_req_session_hello(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Reattach only after a resuming Hello, and no more than the session may report. */
int gm_req_session_check_reattach(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
int gm_req_session_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
