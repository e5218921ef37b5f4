/* Diagnosis in the daemon (diag.h): samples on the tick and the refusal
 * record. Only sessions that hold memory get a ring (one malloc'd block per
 * session in its gm_session_owned() slot, freed with it by the broker). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "diag.h"
#include "localstats.h"
#include "log.h"

static uint64_t min_u64(uint64_t a, uint64_t b) {
        return a < b ? a : b;
}

/* The session's diagnosis state, created on first use (NULL: out of memory). */
static gm_diag_session_t *diag_of(gm_session_t *s) {
        void **slot = gm_session_owned(s);
        if (!*slot)
                *slot = calloc(1, sizeof(gm_diag_session_t));
        return *slot;
}

void gm_diag_note_request(gm_request_conn_t *c, const Gpumem__Envelope *env) {
        uint64_t size = 0, largest_free = 0;
        if (env->body_case == GPUMEM__ENVELOPE__BODY_ALLOC) {
                size = env->alloc->size;
        } else if (env->body_case == GPUMEM__ENVELOPE__BODY_GRANT) {
                size = env->grant->block_size;
                largest_free = env->grant->largest_free;
        } else {
                return;
        }
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        gm_diag_session_t *d = sv.ended ? NULL : diag_of(c->session);
        if (!d)
                return;
        uint64_t cap = c->rq->broker->backend->capacity;
        size = min_u64(size, cap);
        if (size > d->request_max)
                d->request_max = size;
        if (env->body_case == GPUMEM__ENVELOPE__BODY_GRANT)
                d->client_largest_free = min_u64(largest_free, cap);
}

void gm_diag_note_refusal(gm_request_conn_t *c, const gm_outcome_t *out) {
        gm_session_t *s = c->session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        if (!out->oom || !sv.tenant)
                return;
        uint64_t now = gm_now_ms();
        gm_refusal_t ev = {
                .t_ms = now,
                .session_id = sv.id,
                .pid = (uint32_t) sv.pid,
                .reason = (uint32_t) out->oom_reason,
                .size = min_u64(out->oom_size, c->rq->broker->backend->capacity),
        };
        snprintf(ev.tenant, sizeof(ev.tenant), "%s", sv.tenant->name);
        gm_refusal_ring_add(&c->rq->broker->refusals, &ev);
        gm_diag_session_t *d = diag_of(s);
        if (d) {
                d->refusals++;
                d->last_refusal_ms = now;
        }
}

/* The session's figures now, as one sample. */
static void sample_session(const gm_session_view_t *s, const gm_stats_t *st, const gm_diag_session_t *d,
                           gm_sample_t *ret) {
        uint64_t allocated = gm_diag_positive(st->allocated_bytes[GM_STAT_ALL].current);
        uint64_t active = gm_diag_positive(st->active_bytes[GM_STAT_ALL].current);
        uint64_t reserved = gm_diag_positive(st->reserved_bytes[GM_STAT_ALL].current);
        uint64_t inactive = reserved > active ? reserved - active : 0;
        *ret = (gm_sample_t){
                .allocated = allocated,
                .pending = active > allocated ? active - allocated : 0,
                .reserved = reserved,
                .inactive_split = min_u64(gm_diag_positive(st->inactive_split_bytes[GM_STAT_ALL].current), inactive),
                /* A local heap's is its client's word at its last grant, at most what it caches. */
                .largest_free = s->heap ? gm_heap_largest_free(s->heap) : min_u64(d->client_largest_free, inactive),
                .segments = gm_diag_positive(st->segment[GM_STAT_ALL].current),
                .retries = gm_diag_positive(st->num_alloc_retries),
                .allocations = gm_diag_positive(st->allocation[GM_STAT_ALL].allocated),
                .request_max = d->request_max,
                .refusals = d->refusals,
                .releasing = s->releasing_bytes + s->reclaim_bytes,
        };
}

void gm_diag_tick(const gm_requests_t *rq, uint64_t now_ms) {
        for (gm_session_t *s = rq->broker->sessions; s; s = gm_session_next(s)) {
                gm_session_view_t sv;
                gm_session_view(s, &sv);
                if (sv.ended || !sv.tenant || sv.admin_conn)
                        continue;
                const gm_stats_t *st = gm_localstats_session(s);
                if (!st || (!*gm_session_owned(s) && st->reserved_bytes[GM_STAT_ALL].current <= 0))
                        continue; /* no ring until it holds memory or asks for some */
                gm_diag_session_t *d = diag_of(s);
                if (!d)
                        continue;
                gm_sample_t f;
                sample_session(&sv, st, d, &f);
                gm_sample_ring_record(&d->ring, now_ms, &f);
                d->request_max = 0;
        }
}
