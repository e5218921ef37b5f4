/* Local sessions' life on the wire: Hello's heap mode, the answer to a
 * grant, the pushes a local session is sent (Reclaim, AllocConfUpdate,
 * HistoryPush), re-attach and the end (localstats.c reads the statistics
 * pages). Decoding and encoding only: what a local session holds, its
 * grants that wait for memory and the Reclaims it is asked are the
 * broker's (broker.h, "local sessions"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "local.h"

/* The page holds the heap's statistics and its tagged pools' (docs/tags.md). */
_Static_assert(sizeof(gm_heap_stats_area_t) <= GM_STATPAGE_PAYLOAD_MAX, "statistics page too small");

/* ---- hello ---- */

int gm_local_hello(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Hello *hello, Gpumem__HelloReply *reply,
                   int *ret_page_fd) {
        const gm_requests_t *d = c->rq;
        bool wants_local = hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL ||
                           hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED;
        const gm_config_tenant_t *ct = gm_config_tenant_find(d->config->file, c->tenant_name);
        *ret_page_fd = -1;
        reply->heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL;
        if (!wants_local || hello->admin)
                return 0;
        if (ct && ct->heap_central) {
                if (hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED)
                        return 0;
                gm_request_error(c, request_id, EPERM,
                                 "tenant '%s' must use a central heap (the configuration's 'heap = central'); "
                                 "connect without GPUMEM_HEAP=local",
                                 c->tenant_name);
                return -EPERM;
        }
        gm_localstats_t *l = calloc(1, sizeof(*l));
        int fd = -1;
        int r = l ? gm_session_local_enable(c->session) : -ENOMEM;
        if (r == 0)
                r = gm_statpage_create(sizeof(gm_heap_stats_area_t), &fd);
        if (r == 0)
                r = gm_statpage_map(fd, false, &l->page);
        if (r < 0) {
                if (fd >= 0)
                        close(fd);
                free(l);
                gm_request_error(c, request_id, r, "cannot create the statistics page: %s", strerror(-r));
                return r;
        }
        gm_stats_init(&l->exact);
        gm_stats_init(&l->figures);
        gm_stats_init(&l->applied);
        l->exact.max_split_size = l->figures.max_split_size = d->broker->device_stats.max_split_size;
        c->local = l;
        reply->heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL;
        reply->alloc_conf = d->broker->alloc_config.raw;
        reply->stats_page_size = GM_STATPAGE_SIZE;
        reply->grant_runs = true;
        reply->return_intents = gm_process_check_needs_intent(c->session);
        *ret_page_fd = fd;
        return 0;
}

/* ---- grants ---- */

void gm_local_answer_grant(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out) {
        if (c->closed)
                return;
        if (out->kind == GM_OUTCOME_REFUSE) {
                gm_request_refusal(c, request_id, out);
                return;
        }
        gm_localstats_exact_sync(c);
        Gpumem__Mapping maps[GM_MAX_GRANT_PIECES], *more[GM_MAX_GRANT_PIECES];
        int fds[GM_MAX_GRANT_PIECES];
        for (size_t k = 0; k < out->n_pieces; k++) {
                gm_request_piece_mapping(&maps[k], out->pieces[k]);
                more[k] = &maps[k];
                fds[k] = out->pieces[k]->phys.fd;
        }
        Gpumem__GrantReply gr = GPUMEM__GRANT_REPLY__INIT;
        gr.mapping = &maps[0];
        gr.n_more_mappings = out->n_pieces - 1;
        gr.more_mappings = more + 1;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_GRANT_REPLY;
        env.grant_reply = &gr;
        gm_request_send(c, request_id, &env, fds, out->n_pieces); /* a failure closes the connection */
}

/* ---- pushes ---- */

int gm_local_send_reclaim(void *userdata, gm_session_t *s, uint64_t reclaim_id, uint64_t bytes) {
        gm_request_conn_t *c = gm_session_userdata(s);
        if (!c || !c->local || c->closed)
                return -ENOTCONN;
        Gpumem__Reclaim rq = GPUMEM__RECLAIM__INIT;
        rq.reclaim_id = reclaim_id;
        rq.bytes = bytes;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RECLAIM;
        env.reclaim = &rq;
        return gm_request_send(c, 0, &env, NULL, 0);
}

void gm_local_push_alloc_conf(void *userdata, gm_session_t *s, const gm_alloc_config_t *config) {
        gm_request_conn_t *c = gm_session_userdata(s);
        if (!c || !c->local || c->closed)
                return;
        Gpumem__AllocConfUpdate up = GPUMEM__ALLOC_CONF_UPDATE__INIT;
        up.alloc_conf = (char *) config->raw;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_CONF_UPDATE;
        env.alloc_conf_update = &up;
        gm_request_send(c, 0, &env, NULL, 0); /* a failure closes the connection */
}

void gm_local_push_history(const gm_requests_t *rq) {
        gm_broker_t *b = rq->broker;
        Gpumem__HistoryControl h = GPUMEM__HISTORY_CONTROL__INIT;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_HISTORY_PUSH;
        out.history_push = &h;
        for (gm_session_t *o = b->sessions; o; o = gm_session_next(o)) {
                gm_request_conn_t *oc = gm_session_userdata(o);
                gm_session_view_t ov;
                gm_session_view(o, &ov);
                /* One recording its own history goes on with it, whatever the device's. */
                h.enabled = b->history != NULL || ov.history != NULL;
                h.max_entries = b->history ? b->history_max_entries : ov.history_max_entries;
                if (oc && oc->local && !oc->closed && !ov.ended)
                        gm_request_send(oc, 0, &out, NULL, 0);
        }
}

/* ---- re-attach ---- */

int gm_local_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Reattach *req) {
        gm_session_t *s = c->session;
        int r = req->n_blocks ? -EINVAL : 0; /* a local heap keeps its blocks */
        for (size_t i = 0; i < req->n_segments && r == 0; i++) {
                const Gpumem__ReattachSegment *seg = req->segments[i];
                for (size_t k = 0; k < seg->n_mapped && r == 0; k++) {
                        gm_piece_spec_t spec = {.segment_id = seg->segment_id,
                                                .segment_va_size = seg->va_size,
                                                .offset = seg->mapped[k]->offset,
                                                .size = seg->mapped[k]->length};
                        gm_piece_t *p;
                        r = gm_reattach_grant(s, &spec, &p);
                }
        }
        gm_localstats_exact_sync(c);
        uint64_t claimed = 0;
        gm_reattach_state_t st = {.sleeping_bytes = req->sleeping_bytes, .claim_bytes = req->claim_bytes};
        if (r == 0 && req->last)
                r = gm_reattach_finish(s, &st, &claimed); /* the sleep record and the claim come back */
        if (r < 0) {
                gm_request_error(c, request_id, r, "re-attach refused: %s", strerror(-r));
                return r;
        }
        return req->last ? gm_request_reattached(c, request_id, req->claim_bytes != 0, claimed) : 0;
}

/* ---- the end of a session ---- */

void gm_local_end(gm_request_conn_t *c) {
        gm_localstats_t *l = c->local;
        if (!l)
                return;
        gm_localstats_gone(c); /* its figures leave the local totals (the broker releases its pieces) */
        gm_statpage_unmap(l->page);
        free(l);
        c->local = NULL;
}
