/* The administrative requests (table handlers): statistics and their reset,
 * memory history, allocator settings, quotas and the clients list. */
#pragma once

#include <stddef.h>

#include "request.h"

int gm_req_admin_stats(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_admin_reset_stats(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_admin_history(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_admin_alloc_conf(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_admin_quota(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_req_admin_clients(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
const char *gm_req_admin_for_stats(const gm_request_conn_t *c, const Gpumem__Envelope *env);
const char *gm_req_admin_for_reset_stats(const gm_request_conn_t *c, const Gpumem__Envelope *env);
const char *gm_req_admin_for_history(const gm_request_conn_t *c, const Gpumem__Envelope *env);
const char *gm_req_admin_for_alloc_conf(const gm_request_conn_t *c, const Gpumem__Envelope *env);
const char *gm_req_admin_for_quota(const gm_request_conn_t *c, const Gpumem__Envelope *env);
int gm_req_admin_check_stats(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
int gm_req_admin_check_history(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
int gm_req_admin_check_quota(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
