/* The Samples request: the sampled figures and refusals diag.c keeps, read
 * back (table handler). */
#pragma once

#include "request.h"

int gm_req_samples_handle(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
const char *gm_req_samples_admin_for(const gm_request_conn_t *c, const Gpumem__Envelope *env);
