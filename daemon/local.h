/* Local sessions' life on the wire (local.c): a connection whose heap runs
 * in its client is set up at Hello, answered its grants, sent Reclaims and
 * settings, re-attached after a restart and ended. Its figures are
 * localstats.h's; its own requests are req_local.h's. */
#pragma once

#include <stdint.h>

#include "localstats.h"
#include "request.h"

/* At Hello, after the session started: picks the heap mode; for a local
 * session creates its statistics page (*ret_page_fd: send it with the reply,
 * then close it) and fills the reply's local fields. A refusal is sent and
 * returned as a negative errno. */
int gm_local_hello(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Hello *hello, Gpumem__HelloReply *reply,
                   int *ret_page_fd);
/* Answers a grant's outcome (the piece's fd, or the refusal). */
void gm_local_answer_grant(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out);
/* The broker's ops->send_reclaim (userdata unused: the session's connection). */
int gm_local_send_reclaim(void *userdata, gm_session_t *s, uint64_t reclaim_id, uint64_t bytes);
/* The broker's ops->alloc_conf_changed: an AllocConfUpdate to the client. */
void gm_local_push_alloc_conf(void *userdata, gm_session_t *s, const gm_alloc_config_t *config);
/* Memory history changed: tells every local session to record its own trace
 * or stop (a new one learns it from its HelloReply). */
void gm_local_push_history(const gm_requests_t *rq);
/* Re-attach of a local session: its pieces only (no blocks). */
int gm_local_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Reattach *req);
/* The connection ends: its figures leave the totals, its page goes. */
void gm_local_end(gm_request_conn_t *c);
