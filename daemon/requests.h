/* The request table: per request kind its handler, whether (and for what) it
 * needs admin rights, its metric name and its field limits. Dispatch checks
 * permissions once, applies the limits before a handler runs and times every
 * request. Handlers decode, call the broker, and reply or refuse. */
#pragma once

#include "daemon.h"

/* Returns 0 (answered, or nothing to answer), or a negative errno when the
 * connection must be closed (protocol abuse). */
typedef int (*gm_request_handler_t)(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);

typedef struct gm_request_kind {
        Gpumem__Envelope__BodyCase body;
        const char *op; /* metric label of gpumem_request_duration_seconds */
        gm_request_handler_t handle;
        /* What in this request needs admin rights ("setting quotas"), or NULL
         * when this one does not. NULL function: never. */
        const char *(*admin_for)(const gm_conn_t *c, const Gpumem__Envelope *env);
        /* Field limits: 0, or a negative errno with the reason in `why`. */
        int (*check)(const gm_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
        bool close_on_refusal; /* a refused check ends the connection */
} gm_request_kind_t;

/* The table's metric names, by request index (for the metrics endpoint). */
size_t gm_request_op_names(const char *const **ret_names);
/* The index of a body's kind, or -1 when it is not a request. */
int gm_request_index(Gpumem__Envelope__BodyCase body);

/* admin.c: the handlers of statistics, snapshots, history, settings, quotas and clients. */
int gm_handle_stats(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_reset_stats(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_history(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_snapshot(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_alloc_conf(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_quota(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_clients(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
const char *gm_admin_for_stats(const gm_conn_t *c, const Gpumem__Envelope *env);
const char *gm_admin_for_reset_stats(const gm_conn_t *c, const Gpumem__Envelope *env);
const char *gm_admin_for_history(const gm_conn_t *c, const Gpumem__Envelope *env);
const char *gm_admin_for_alloc_conf(const gm_conn_t *c, const Gpumem__Envelope *env);
const char *gm_admin_for_quota(const gm_conn_t *c, const Gpumem__Envelope *env);
int gm_check_history(const gm_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);
int gm_check_quota(const gm_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len);

/* Replies Ok; 0 (a failed send closes the connection). */
int gm_reply_ok(gm_conn_t *c, uint64_t request_id);
