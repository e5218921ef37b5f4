/* The request table: per request kind its handler (in a req_*.c), whether
 * (and for what) it needs admin rights, its metric name and its field
 * limits. Dispatch checks the order rules and permissions once, applies the
 * limits before a handler runs and times every request. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "request.h"

/* One request. Returns 0, or a negative errno when the connection must be
 * closed (protocol abuse). */
int gm_requests_dispatch(gm_request_conn_t *c, Gpumem__Envelope *env, int *fds, size_t n_fds);
/* The table's metric names, by request index (for the metrics endpoint). */
size_t gm_requests_op_names(const char *const **ret_names);
/* The index of a body's kind, or -1 when it is not a request. */
int gm_requests_index(Gpumem__Envelope__BodyCase body);

/* ---- the table's rows ---- */

/* Returns 0 (answered, or nothing to answer), or a negative errno when the
 * connection must be closed. */
typedef int (*gm_request_handler_t)(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);

typedef struct gm_request_kind {
        Gpumem__Envelope__BodyCase body;
        const char *op; /* metric label of gpumem_request_duration_seconds */
        gm_request_handler_t handle;
        /* What in this request needs admin rights ("setting quotas"), or NULL
         * when this one does not. NULL function: never. */
        const char *(*admin_for)(const gm_request_conn_t *c, const Gpumem__Envelope *env);
        /* Field limits: 0, or a negative errno with the reason in `why`. */
        int (*check)(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
        bool close_on_refusal; /* a refused check ends the connection */
} gm_request_kind_t;
