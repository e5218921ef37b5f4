/* A central heap's requests (table handlers), and the answer to an
 * allocation the broker decided (at once, or after it waited for memory). */
#pragma once

#include <stddef.h>

#include "request.h"

/* Answers an allocation's or a grant's outcome (reply with its new pieces
 * or its piece, or refusal): the broker's ops->alloc_done. */
void gm_req_central_answer_alloc(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out);
int gm_req_central_alloc(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_central_free(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_central_free_completed(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_central_release_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* A tenant named, or an admin's connection without memory: other sessions' caches. */
const char *gm_req_central_admin_for_trim(const gm_request_conn_t *c, const Gpumem__Envelope *env);
int gm_req_central_trim(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
