/* Shared objects on the wire (table handlers): create, publish, open, close
 * and unpublish named read-only memory, and list it (docs/shared.md). */
#pragma once

#include "request.h"

int gm_req_shared_create(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_shared_publish(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_shared_open(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_shared_close(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_shared_unpublish(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* The objects the caller may see (gpumemctl shared): name, state, mappers;
 * with a name, the sessions that map each. */
int gm_req_shared_list(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Field limits (the table's check): names, readers, meta. */
int gm_req_shared_check(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
