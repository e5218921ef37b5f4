/* The request table: one row per request kind (its handler in a req_*.c),
 * the order rules, admin rights and field limits checked before a handler
 * runs, and the timing of every request. */
#include <errno.h>
#include <stdio.h>

#include "clock.h"
#include "diag.h"
#include "ipc.h"
#include "req_admin.h"
#include "req_central.h"
#include "req_claim.h"
#include "req_local.h"
#include "req_samples.h"
#include "req_session.h"
#include "req_shared.h"
#include "req_snapshot.h"
#include "requests.h"

/* ---- the table ---- */

#define BODY(x) .body = GPUMEM__ENVELOPE__BODY_##x

static const gm_request_kind_t kinds[] = {
        {BODY(HELLO), .op = "hello", .handle = gm_req_session_hello},
        {BODY(ALLOC), .op = "alloc", .handle = gm_req_central_alloc},
        {BODY(FREE), .op = "free", .handle = gm_req_central_free},
        {BODY(FREE_COMPLETED), .op = "free_completed", .handle = gm_req_central_free_completed},
        {BODY(TRIM), .op = "trim", .handle = gm_req_central_trim, .admin_for = gm_req_central_admin_for_trim},
        {BODY(STATS), .op = "stats", .handle = gm_req_admin_stats, .admin_for = gm_req_admin_for_stats,
         .check = gm_req_admin_check_stats},
        {BODY(RELEASE_ACK), .op = "release_ack", .handle = gm_req_central_release_ack},
        {BODY(RESET_STATS), .op = "reset_stats", .handle = gm_req_admin_reset_stats,
         .admin_for = gm_req_admin_for_reset_stats},
        {BODY(HISTORY_CONTROL), .op = "history", .handle = gm_req_admin_history, .admin_for = gm_req_admin_for_history,
         .check = gm_req_admin_check_history},
        {BODY(SNAPSHOT), .op = "snapshot", .handle = gm_req_snapshot_handle},
        {BODY(ALLOC_CONF), .op = "alloc_conf", .handle = gm_req_admin_alloc_conf,
         .admin_for = gm_req_admin_for_alloc_conf},
        {BODY(QUOTA), .op = "quota", .handle = gm_req_admin_quota, .admin_for = gm_req_admin_for_quota,
         .check = gm_req_admin_check_quota},
        {BODY(CLIENTS), .op = "clients", .handle = gm_req_admin_clients},
        {BODY(REATTACH), .op = "reattach", .handle = gm_req_session_reattach, .check = gm_req_session_check_reattach,
         .close_on_refusal = true},
        {BODY(GRANT), .op = "grant", .handle = gm_req_local_grant},
        {BODY(RETURN_PIECES), .op = "return_pieces", .handle = gm_req_local_return_pieces},
        {BODY(RETURN_INTENT), .op = "return_intent", .handle = gm_req_local_return_intent},
        {BODY(MOVE_PIECES), .op = "move_pieces", .handle = gm_req_local_move_pieces},
        {BODY(RECLAIM_ACK), .op = "reclaim_ack", .handle = gm_req_local_reclaim_ack},
        {BODY(SLEEP_STATE), .op = "sleep_state", .handle = gm_req_local_sleep_state},
        {BODY(SNAPSHOT_ANSWER), .op = "snapshot_answer", .handle = gm_req_snapshot_answer},
        {BODY(SAMPLES), .op = "samples", .handle = gm_req_samples_handle, .admin_for = gm_req_samples_admin_for},
        {BODY(CLAIM), .op = "claim", .handle = gm_req_claim_handle, .check = gm_req_claim_check},
        {BODY(SHARED_CREATE), .op = "shared_create", .handle = gm_req_shared_create, .check = gm_req_shared_check},
        {BODY(SHARED_PUBLISH), .op = "shared_publish", .handle = gm_req_shared_publish, .check = gm_req_shared_check},
        {BODY(SHARED_OPEN), .op = "shared_open", .handle = gm_req_shared_open, .check = gm_req_shared_check},
        {BODY(SHARED_CLOSE), .op = "shared_close", .handle = gm_req_shared_close},
        {BODY(SHARED_UNPUBLISH), .op = "shared_unpublish", .handle = gm_req_shared_unpublish,
         .check = gm_req_shared_check},
        {BODY(SHARED_LIST), .op = "shared_list", .handle = gm_req_shared_list, .check = gm_req_shared_check},
};
#define N_KINDS (sizeof(kinds) / sizeof(kinds[0]))

size_t gm_requests_op_names(const char *const **ret_names) {
        static const char *names[N_KINDS];
        for (size_t i = 0; i < N_KINDS; i++)
                names[i] = kinds[i].op;
        *ret_names = names;
        return N_KINDS;
}

int gm_requests_index(Gpumem__Envelope__BodyCase body) {
        for (size_t i = 0; i < N_KINDS; i++)
                if (kinds[i].body == body)
                        return (int) i;
        return -1;
}

/* The order rules: Hello first, then (when resuming) Reattach until the last. */
static int check_order(gm_request_conn_t *c, const Gpumem__Envelope *env) {
        if (!c->hello_done && env->body_case != GPUMEM__ENVELOPE__BODY_HELLO) {
                gm_request_error(c, env->request_id, EPROTO, "the first request must be Hello");
                return -EPROTO;
        }
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        if (sv.reattaching && env->body_case != GPUMEM__ENVELOPE__BODY_REATTACH) {
                gm_request_error(c, env->request_id, EPROTO, "finish re-attaching first");
                return -EPROTO;
        }
        return 0;
}

static int dispatch(gm_request_conn_t *c, const gm_request_kind_t *k, const Gpumem__Envelope *env) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        uint64_t rid = env->request_id;
        const char *what = k->admin_for ? k->admin_for(c, env) : NULL;
        if (what && !sv.admin)
                return gm_request_error(c, rid, EPERM, "%s needs admin rights (uid 0 or the admin group)", what), 0;
        if (k->check) {
                char why[256] = "";
                int r = k->check(c, env, why, sizeof(why));
                if (r < 0) {
                        gm_request_error(c, rid, r, "%s", why);
                        return k->close_on_refusal ? r : 0;
                }
        }
        return k->handle(c, rid, env);
}

int gm_requests_dispatch(gm_request_conn_t *c, Gpumem__Envelope *env, int *fds, size_t n_fds) {
        const gm_requests_t *rq = c->rq;
        uint64_t rid = env->request_id;
        if (n_fds > 0) {
                /* Clients never send fds in protocol 1. */
                gm_close_fds(fds, n_fds);
                gm_request_error(c, rid, EBADMSG, "unexpected file descriptors in a request");
                return -EBADMSG;
        }
        int i = gm_requests_index(env->body_case);
        if (i < 0) {
                gm_request_error(c, rid, EPROTO, "message type %d is not a request", (int) env->body_case);
                return -EPROTO;
        }
        int r = check_order(c, env);
        if (r < 0)
                return r;
        gm_session_touch(c->session, gm_now_ms());
        gm_diag_note_request(c, env);
        uint64_t t0 = gm_now_ns();
        r = dispatch(c, &kinds[i], env);
        if (rq->observe)
                rq->observe(rq->userdata, (unsigned) i, gm_now_ns() - t0);
        return r;
}
